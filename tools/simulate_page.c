/* tandem simulate --html / --svg: the study drawn with the report tool's plotter; see simulate_page.h. */
#include "simulate_page.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/internal.h"
#include "report/run.h"
#include "report/svg.h"

enum { PLOT_STEP, PLOT_EFFICIENCY, PLOT_EXPOSED, PLOT_COUNT };
static const char *const titles[PLOT_COUNT] = {"Predicted step time", "Predicted scaling efficiency (one rank's step over this step)",
                                               "Exposed communication (step - compute)"};
static const char *const ylabels[PLOT_COUNT] = {"milliseconds per step", "percent", "milliseconds per step"};

/* One plot of the study: a line per configuration against ranks (a log axis when the ranks span a
 * factor of 8 or more; the step time's too when it spans a factor of 20). */
static void plot(FILE *f, const sim_study *s, int which, int bare) {
  tdm__series ser[SIM_MAX_CURVES];
  static double y[SIM_MAX_CURVES][SIM_MAX_RANKS]; /* one thread draws at a time: the CLI */
  double rlo = 0, rhi = 0, ylo = 0, yhi = 0;
  int n = s->n < SIM_MAX_CURVES ? s->n : SIM_MAX_CURVES;
  for (int k = 0; k < n; k++) {
    const sim_curve *c = &s->curves[k];
    for (int i = 0; i < c->n; i++) {
      y[k][i] = which == PLOT_STEP ? c->step[i] * 1e3 : which == PLOT_EFFICIENCY ? c->efficiency[i] * 100 : c->exposed[i] * 1e3;
      rlo = rlo == 0 || c->ranks[i] < rlo ? c->ranks[i] : rlo, rhi = c->ranks[i] > rhi ? c->ranks[i] : rhi;
      ylo = ylo == 0 || y[k][i] < ylo ? y[k][i] : ylo, yhi = y[k][i] > yhi ? y[k][i] : yhi;
    }
    ser[k] = (tdm__series){*c->name ? c->name : "predicted", c->ranks, y[k], c->n};
  }
  int flags = (bare ? TDM__SVG_BARE : 0) | (rlo > 0 && rhi / rlo >= 8 ? TDM__SVG_LOGX : 0) |
              (which == PLOT_STEP && ylo > 0 && yhi / ylo >= 20 ? TDM__SVG_LOGY : 0);
  tdm__svg_lines_opt(f, titles[which], "ranks", ylabels[which], ser, n, flags);
}

static tdm_status render_page(FILE *f, const void *p) {
  const sim_study *s = p;
  tdm__html_begin(f, "tandem simulate: predicted scaling");
  fprintf(f, "<p>Command: <code>");
  tdm__html_text(f, s->command);
  fprintf(f, "</code>. Weak scaling: every rank keeps its batch; the efficiency is one rank's step over this step. "
             "Predicted by the simulator (docs/simulator.md), not measured.</p>\n");
  for (int p = 0; p < PLOT_COUNT; p++) plot(f, s, p, 0);
  for (int k = 0; k < s->n; k++) {
    const sim_curve *c = &s->curves[k];
    fprintf(f, "<h2>");
    tdm__html_text(f, *c->name ? c->name : "The prediction");
    fprintf(f, "</h2>\n<p class=\"muted\">");
    tdm__html_text(f, c->cluster);
    fprintf(f, "</p>\n<table><tr><th>ranks</th><th>step (ms)</th><th>compute (ms)</th><th>comm (ms)</th><th>exposed (ms)</th>"
               "<th>efficiency</th></tr>\n");
    for (int i = 0; i < c->n; i++)
      fprintf(f, "<tr><td>%.0f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.1f%%</td></tr>\n", c->ranks[i],
              c->step[i] * 1e3, c->compute[i] * 1e3, c->comm[i] * 1e3, c->exposed[i] * 1e3, c->efficiency[i] * 100);
    fprintf(f, "</table>\n");
  }
  tdm__html_end(f);
  return ferror(f) ? tdm__set_error(TDM_ERR_IO, "simulate: writing the page failed") : TDM_OK;
}

int simulate_write_html(const char *path, const sim_study *s) { return report_write_page(path, render_page, s, "simulate"); }

typedef struct {
  const sim_study *s;
  int which;
} one_plot;

static tdm_status render_svg(FILE *f, const void *p) {
  const one_plot *o = p;
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  plot(f, o->s, o->which, 1);
  return ferror(f) ? tdm__set_error(TDM_ERR_IO, "simulate: writing the plot failed") : TDM_OK;
}

int simulate_write_svg(const char *prefix, const sim_study *s) {
  static const char *const names[2] = {"step", "efficiency"};
  for (int i = 0; i < 2; i++) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s-%s.svg", prefix, names[i]) >= sizeof path) {
      fprintf(stderr, "tandem simulate: --svg '%s': the path is too long\n", prefix);
      return 1;
    }
    one_plot o = {s, i == 0 ? PLOT_STEP : PLOT_EFFICIENCY};
    if (report_write_page(path, render_svg, &o, "simulate")) return 1;
    printf("wrote %s\n", path);
  }
  return 0;
}
