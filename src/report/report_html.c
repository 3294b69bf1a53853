/* The run report as one HTML page; see run.h. Everything is computed here from the parsed run;
 * the plots come from svg.c. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "report/run.h"
#include "report/svg.h"
#include "report/trace.h"
#include "core/internal.h"

void tdm__html_begin(FILE *f, const char *title) {
  fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
  tdm__html_text(f, title);
  fprintf(f, "</title>\n<style>\n"
             "body{font-family:sans-serif;margin:24px;max-width:1340px;color:#222}\n"
             "h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}\n"
             "figure.plot{display:inline-block;margin:6px}\n"
             "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
             "th{background:#f3f3f3}td.k,th.k{text-align:left}\n"
             ".notes{background:#fff6e0;border:1px solid #e0c070;padding:6px 12px}\n"
             ".muted{color:#777}\n"
             "</style></head><body>\n<h1>");
  tdm__html_text(f, title);
  fprintf(f, "</h1>\n");
}

void tdm__html_end(FILE *f) { fprintf(f, "<p class=\"muted\">Written by tandem; the plots are inline SVG.</p>\n</body></html>\n"); }

static const char *hstr(const tdm__run *r, const char *obj, const char *key, const char *def) {
  const tdm_json *v = tdm__run_header_get(r, obj, key);
  return v && v->type == TDM_JSON_STR ? v->str : def;
}

static double hnum(const tdm__run *r, const char *obj, const char *key) {
  const tdm_json *v = tdm__run_header_get(r, obj, key);
  return v && v->type == TDM_JSON_NUM ? v->num : NAN;
}

/* The steps' values of one field, and their step numbers or times. */
static double *field(const tdm__run *r, size_t off) {
  double *v = malloc(sizeof(double) * (size_t)(r->n_steps > 0 ? r->n_steps : 1));
  for (int i = 0; v && i < r->n_steps; i++) v[i] = *(const double *)((const char *)&r->steps[i] + off);
  return v;
}

static double *steps_x(const tdm__run *r) {
  double *v = malloc(sizeof(double) * (size_t)(r->n_steps > 0 ? r->n_steps : 1));
  for (int i = 0; v && i < r->n_steps; i++) v[i] = (double)r->steps[i].step + 1; /* steps done */
  return v;
}

static void row(FILE *f, const char *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void row(FILE *f, const char *k, const char *fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  fprintf(f, "<tr><th class=\"k\">");
  tdm__html_text(f, k);
  fprintf(f, "</th><td class=\"k\">");
  tdm__html_text(f, b);
  fprintf(f, "</td></tr>\n");
}

static void json_table(FILE *f, const tdm_json *o) {
  if (!o || o->type != TDM_JSON_OBJ) {
    fprintf(f, "<p class=\"muted\">not recorded (metrics written before tandem recorded a run header)</p>\n");
    return;
  }
  fprintf(f, "<table>\n");
  for (int i = 0; i < o->n; i++) {
    const tdm_json *v = &o->items[i];
    if (v->type == TDM_JSON_STR) row(f, o->keys[i], "%s", v->str);
    else if (v->type == TDM_JSON_NUM) row(f, o->keys[i], "%.10g", v->num);
    else if (v->type == TDM_JSON_BOOL) row(f, o->keys[i], "%s", v->num != 0 ? "true" : "false");
  }
  fprintf(f, "</table>\n");
}

static void curves(FILE *f, const tdm__run *r) {
  double *x = steps_x(r), *t = field(r, offsetof(tdm__step_rec, time_s)), *loss = field(r, offsetof(tdm__step_rec, loss));
  double *acc = field(r, offsetof(tdm__step_rec, train_accuracy));
  int ne = r->n_evals > 0 ? r->n_evals : 1;
  double *ex = malloc(sizeof(double) * (size_t)ne), *et = malloc(sizeof(double) * (size_t)ne);
  double *el = malloc(sizeof(double) * (size_t)ne), *ea = malloc(sizeof(double) * (size_t)ne);
  if (!x || !t || !loss || !acc || !ex || !et || !el || !ea) goto done;
  int val = 0;
  for (int i = 0; i < r->n_evals; i++) {
    ex[i] = (double)r->evals[i].step, et[i] = r->evals[i].time_s, el[i] = r->evals[i].loss, ea[i] = r->evals[i].accuracy;
    val |= r->evals[i].validation;
  }
  const char *ename = val ? "validation" : "test";
  char eln[64], ean[64];
  snprintf(eln, sizeof eln, "%s loss", ename);
  snprintf(ean, sizeof ean, "%s accuracy", ename);
  fprintf(f, "<h2 id=\"curves\">Loss and accuracy</h2>\n");
  tdm__series s[2] = {{"training loss (mean over ranks)", x, loss, r->n_steps}, {eln, ex, el, r->n_evals}};
  tdm__svg_lines(f, "Loss against steps", "step", "loss", s, r->n_evals ? 2 : 1, 0);
  tdm__series st[2] = {{"training loss", t, loss, r->n_steps}, {eln, et, el, r->n_evals}};
  tdm__svg_lines(f, "Loss against training time", "training time (s)", "loss", st, r->n_evals ? 2 : 1, 0);
  tdm__series sa[2] = {{"training accuracy", x, acc, r->n_steps}, {ean, ex, ea, r->n_evals}};
  tdm__svg_lines(f, "Accuracy against steps", "step", "accuracy", sa, r->n_evals ? 2 : 1, 0);
  double *lr = field(r, offsetof(tdm__step_rec, lr)), *gn = field(r, offsetof(tdm__step_rec, grad_norm));
  if (lr && gn) {
    tdm__series sl = {"learning rate", x, lr, r->n_steps};
    tdm__svg_lines(f, "Learning rate", "step", "learning rate", &sl, 1, 0);
    tdm__series sg = {"gradient norm (before clipping)", x, gn, r->n_steps};
    tdm__svg_lines(f, "Gradient norm", "step", "global gradient norm", &sg, 1, 1);
  }
  free(lr), free(gn);
done:
  free(x), free(t), free(loss), free(acc), free(ex), free(et), free(el), free(ea);
}

static void throughput(FILE *f, const tdm__run *r) {
  double *x = steps_x(r), *sps = field(r, offsetof(tdm__step_rec, samples_per_sec));
  double *tps = field(r, offsetof(tdm__step_rec, tokens_per_sec)), *ms = field(r, offsetof(tdm__step_rec, step_ms));
  if (!x || !sps || !tps || !ms) goto done;
  fprintf(f, "<h2 id=\"throughput\">Throughput</h2>\n");
  tdm__series s = {"samples/s (all ranks)", x, sps, r->n_steps};
  tdm__svg_lines(f, "Throughput", "step", "samples per second", &s, 1, 0);
  if (isfinite(tdm__run_mean(r, offsetof(tdm__step_rec, tokens_per_sec)))) {
    tdm__series st = {"tokens/s (all ranks)", x, tps, r->n_steps};
    tdm__svg_lines(f, "Token throughput", "step", "tokens per second", &st, 1, 0);
  }
  /* rank 0's step time and the slowest rank's, per step */
  double *slow = malloc(sizeof(double) * (size_t)(r->n_steps > 0 ? r->n_steps : 1));
  int any = 0;
  for (int i = 0; slow && i < r->n_steps; i++) {
    const tdm__step_rec *s2 = &r->steps[i];
    slow[i] = s2->n_ranks > 0 ? s2->rank_ms[s2->slowest * TDM__RT_COUNT + TDM__RT_STEP] : NAN;
    any |= s2->n_ranks > 0;
  }
  tdm__series ss[2] = {{"rank 0", x, ms, r->n_steps}, {"slowest rank", x, slow, r->n_steps}};
  if (slow) tdm__svg_lines(f, "Step time", "step", "step time (ms)", ss, any ? 2 : 1, 0);
  free(slow);
done:
  free(x), free(sps), free(tps), free(ms);
}

/* Per rank, the mean over the steps after the first of each part of a step (ms). */
static int rank_means(const tdm__run *r, double (*m)[TDM__RT_COUNT], int max, int *slowest_count) {
  int W = 0;
  for (int i = 0; i < r->n_steps; i++) W = r->steps[i].n_ranks > W ? r->steps[i].n_ranks : W;
  if (W > max) W = max;
  if (W == 0) return 0; /* no record has per-rank times (their slowest rank is -1) */
  int cnt[64] = {0};
  for (int k = 0; k < W; k++)
    for (int q = 0; q < TDM__RT_COUNT; q++) m[k][q] = 0;
  for (int i = r->n_steps > 1 ? 1 : 0; i < r->n_steps; i++) {
    const tdm__step_rec *s = &r->steps[i];
    if (s->n_ranks != W) continue; /* another world size (a resumed run): left out */
    for (int k = 0; k < W; k++) {
      for (int q = 0; q < TDM__RT_COUNT; q++) m[k][q] += s->rank_ms[k * TDM__RT_COUNT + q];
      cnt[k]++;
    }
    if (s->slowest >= 0 && s->slowest < W) slowest_count[s->slowest]++;
  }
  for (int k = 0; k < W; k++)
    for (int q = 0; q < TDM__RT_COUNT; q++) m[k][q] = cnt[k] ? m[k][q] / cnt[k] : NAN;
  return W;
}

static void step_parts(FILE *f, const tdm__run *r) {
  fprintf(f, "<h2 id=\"parts\">Where a step's time goes, per rank</h2>\n");
  double m[64][TDM__RT_COUNT];
  int slowest[64] = {0};
  int W = rank_means(r, m, 64, slowest);
  char names[64][24];
  const char *cats[64];
  double fw[64], bw[64], wt[64], op[64], ot[64];
  if (W == 0) { /* one process, or metrics without per-rank times: rank 0's own fields */
    W = 1;
    m[0][TDM__RT_STEP] = tdm__run_mean(r, offsetof(tdm__step_rec, step_ms));
    m[0][TDM__RT_FWD] = tdm__run_mean(r, offsetof(tdm__step_rec, fwd_ms));
    m[0][TDM__RT_BWD] = tdm__run_mean(r, offsetof(tdm__step_rec, bwd_ms));
    m[0][TDM__RT_WAIT] = tdm__run_mean(r, offsetof(tdm__step_rec, wait_ms));
    m[0][TDM__RT_OPT] = tdm__run_mean(r, offsetof(tdm__step_rec, opt_ms));
  }
  for (int k = 0; k < W; k++) {
    snprintf(names[k], sizeof names[k], "rank %d", k);
    cats[k] = names[k];
    fw[k] = m[k][TDM__RT_FWD], bw[k] = m[k][TDM__RT_BWD], wt[k] = m[k][TDM__RT_WAIT], op[k] = m[k][TDM__RT_OPT];
    ot[k] = m[k][TDM__RT_STEP] - fw[k] - bw[k] - wt[k] - op[k];
    if (ot[k] < 0) ot[k] = 0;
  }
  tdm__series s[5] = {{"forward", NULL, fw, W}, {"backward", NULL, bw, W}, {"communication wait", NULL, wt, W},
                      {"optimizer", NULL, op, W}, {"other (data, bookkeeping)", NULL, ot, W}};
  tdm__svg_bars(f, "Step time per rank (mean over steps after the first; from the metrics)", "rank", "milliseconds per step",
                cats, W, s, 5, 1);
  if (r->trace && r->trace->n_procs > 0) {
    const tdm__trace *t = r->trace;
    int n = t->n_procs < 64 ? t->n_procs : 64;
    char tn[64][64];
    const char *tc[64];
    double a[TDM__TK_COUNT + 1][64];
    for (int k = 0; k < n; k++) {
      const tdm__trace_proc *p = &t->procs[k];
      if (p->name[0]) snprintf(tn[k], sizeof tn[k], "%s", p->name);
      else snprintf(tn[k], sizeof tn[k], "pid %lld", (long long)p->pid);
      tc[k] = tn[k];
      a[0][k] = p->us[TDM__TK_FWD] / 1e3, a[1][k] = p->us[TDM__TK_BWD] / 1e3;
      a[2][k] = (p->us[TDM__TK_COMM] - p->comm_hidden_us) / 1e3, a[3][k] = p->comm_hidden_us / 1e3;
      a[4][k] = p->us[TDM__TK_OPT] / 1e3, a[5][k] = p->us[TDM__TK_OTHER] / 1e3;
    }
    tdm__series ts[6] = {{"forward", NULL, a[0], n}, {"backward", NULL, a[1], n}, {"communication not hidden", NULL, a[2], n},
                         {"communication hidden by backward", NULL, a[3], n}, {"optimizer", NULL, a[4], n}, {"other spans", NULL, a[5], n}};
    tdm__svg_bars(f, "Time per rank over the whole trace (spans of one kind merged)", "process", "milliseconds", tc, n, ts, 6, 1);
  }
  fprintf(f, "<table><tr><th>rank</th><th>step (ms)</th><th>forward</th><th>backward</th><th>comm wait</th><th>optimizer</th>"
             "<th>comm share</th><th>slowest in</th></tr>\n");
  int counted = 0;
  for (int k = 0; k < W; k++) counted += slowest[k];
  for (int k = 0; k < W; k++)
    fprintf(f, "<tr><td>%d</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.1f%%</td><td>%d of %d steps</td></tr>\n",
            k, m[k][TDM__RT_STEP], fw[k], bw[k], wt[k], op[k], 100 * wt[k] / m[k][TDM__RT_STEP], slowest[k], counted);
  fprintf(f, "</table>\n");
}

static void stragglers(FILE *f, const tdm__run *r) {
  int any = 0;
  for (int i = 0; i < r->n_steps; i++) any |= r->steps[i].n_ranks > 1;
  fprintf(f, "<h2 id=\"stragglers\">Slowest rank per step</h2>\n");
  if (!any) {
    fprintf(f, "<p class=\"muted\">One rank, or no per-rank times in the metrics (they are gathered for worlds of up to 64 ranks).</p>\n");
    return;
  }
  double *x = steps_x(r), *who = malloc(sizeof(double) * (size_t)r->n_steps), *lag = malloc(sizeof(double) * (size_t)r->n_steps);
  for (int i = 0; x && who && lag && i < r->n_steps; i++) {
    const tdm__step_rec *s = &r->steps[i];
    who[i] = s->n_ranks > 1 ? s->slowest : NAN;
    double sum = 0;
    for (int k = 0; k < s->n_ranks; k++) sum += s->rank_ms[k * TDM__RT_COUNT + TDM__RT_STEP];
    lag[i] = s->n_ranks > 1 ? s->rank_ms[s->slowest * TDM__RT_COUNT + TDM__RT_STEP] - sum / s->n_ranks : NAN;
  }
  if (x && who && lag) {
    tdm__series s = {"slowest rank", x, who, r->n_steps};
    tdm__svg_lines(f, "Which rank was slowest", "step", "rank", &s, 1, 0);
    tdm__series l = {"slowest rank's step time - mean over ranks", x, lag, r->n_steps};
    tdm__svg_lines(f, "How much slower the slowest rank was", "step", "milliseconds", &l, 1, 0);
  }
  free(x), free(who), free(lag);
}

static void communication(FILE *f, const tdm__run *r) {
  fprintf(f, "<h2 id=\"comm\">Communication</h2>\n");
  double *x = steps_x(r), *share = malloc(sizeof(double) * (size_t)(r->n_steps > 0 ? r->n_steps : 1));
  double wait = 0, step = 0;
  for (int i = 0; x && share && i < r->n_steps; i++) {
    const tdm__step_rec *s = &r->steps[i];
    share[i] = s->step_ms > 0 ? 100 * s->wait_ms / s->step_ms : NAN;
    if (i > 0 || r->n_steps == 1) wait += isfinite(s->wait_ms) ? s->wait_ms : 0, step += isfinite(s->step_ms) ? s->step_ms : 0;
  }
  fprintf(f, "<p>Rank 0 waited for communication %.1f%% of its step time (steps after the first). ", step > 0 ? 100 * wait / step : 0.0);
  if (r->trace && r->trace->n_procs > 0) {
    double c = 0, h = 0;
    for (int k = 0; k < r->trace->n_procs; k++) c += r->trace->procs[k].us[TDM__TK_COMM], h += r->trace->procs[k].comm_hidden_us;
    fprintf(f, "From the trace: of %.1f ms of communication on all ranks, %.1f ms (%.1f%%) ran while backward did (hidden).</p>\n",
            c / 1e3, h / 1e3, c > 0 ? 100 * h / c : 0.0);
  } else {
    fprintf(f, "The communication that backward hid is not measured from the metrics alone (they hold the time each rank "
               "waited, the part not hidden): run with <code>--trace DIR</code> inside the run directory to see it.</p>\n");
  }
  if (x && share) {
    tdm__series s = {"communication wait / step time (rank 0)", x, share, r->n_steps};
    tdm__svg_lines(f, "Communication share of the step", "step", "percent", &s, 1, 0);
  }
  double *cr = field(r, offsetof(tdm__step_rec, compress_ratio));
  if (cr && isfinite(tdm__run_mean(r, offsetof(tdm__step_rec, compress_ratio)))) {
    tdm__series s = {"compression ratio (mean over buckets)", x, cr, r->n_steps};
    tdm__svg_lines(f, "Gradient compression", "step", "ratio", &s, 1, 0);
  }
  free(cr), free(x), free(share);
  if (r->n_ps > 0) {
    fprintf(f, "<h3>Parameter servers</h3><table><tr><th>server</th><th>updates</th><th>pushes</th><th>max staleness</th>"
               "<th>max clock gap</th><th>bytes in</th><th>bytes out</th></tr>\n");
    for (int i = 0; i < r->n_ps; i++) {
      const tdm_json *p = r->ps[i];
      const char *k[] = {"ps_server", "updates", "pushes", "max_staleness", "max_clock_gap", "bytes_in", "bytes_out"};
      fprintf(f, "<tr>");
      for (int j = 0; j < 7; j++) {
        const tdm_json *v = tdm__json_get(p, k[j]);
        fprintf(f, "<td>%.0f</td>", v && v->type == TDM_JSON_NUM ? v->num : NAN);
      }
      fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n");
    const tdm_json *h = tdm__json_get(r->ps[0], "staleness_hist");
    if (h && h->type == TDM_JSON_ARR && h->n > 0 && h->n <= 64) {
      char nm[64][12];
      const char *cats[64];
      double y[64];
      for (int i = 0; i < h->n; i++) {
        snprintf(nm[i], sizeof nm[i], "%d", i);
        cats[i] = nm[i];
        y[i] = 0;
        for (int s = 0; s < r->n_ps; s++) {
          const tdm_json *hs = tdm__json_get(r->ps[s], "staleness_hist");
          if (hs && hs->type == TDM_JSON_ARR && i < hs->n && hs->items[i].type == TDM_JSON_NUM) y[i] += hs->items[i].num;
        }
      }
      tdm__series s = {"updates (all servers)", NULL, y, h->n};
      tdm__svg_bars(f, "Staleness of the applied gradients", "staleness (server versions behind)", "updates", cats, h->n, &s, 1, 0);
    }
  }
}

static void memory(FILE *f, const tdm__run *r) {
  fprintf(f, "<h2 id=\"memory\">Memory per rank against the plan</h2>\n");
  const tdm_json *plan = r->header_json ? tdm__json_get(r->header_json, "plan") : NULL;
  int have_plan = plan && plan->type == TDM_JSON_OBJ, have_peak = r->mem_peak[TDM_MEM_COUNT] >= 0;
  if (!have_plan && !have_peak) {
    fprintf(f, "<p class=\"muted\">Neither the plan nor the measured peaks are in the metrics.</p>\n");
    return;
  }
  const char *cats[TDM_MEM_COUNT + 1];
  double pl[TDM_MEM_COUNT + 1], me[TDM_MEM_COUNT + 1];
  for (int k = 0; k <= TDM_MEM_COUNT; k++) {
    cats[k] = k < TDM_MEM_COUNT ? tdm_mem_category_name((tdm_mem_category)k) : "total";
    const tdm_json *v = have_plan ? tdm__json_get(plan, cats[k]) : NULL;
    pl[k] = v && v->type == TDM_JSON_NUM ? v->num / 1048576.0 : NAN;
    me[k] = r->mem_peak[k] >= 0 ? (double)r->mem_peak[k] / 1048576.0 : NAN;
  }
  tdm__series s[2] = {{"plan", NULL, pl, TDM_MEM_COUNT}, {"measured peak (rank 0)", NULL, me, TDM_MEM_COUNT}};
  tdm__svg_bars(f, "Memory per category", "category", "MiB", cats, TDM_MEM_COUNT, s, 2, 0);
  fprintf(f, "<table><tr><th class=\"k\">category</th><th>plan (MiB)</th><th>measured peak (MiB)</th><th>measured / plan</th></tr>\n");
  for (int k = 0; k <= TDM_MEM_COUNT; k++)
    fprintf(f, "<tr><td class=\"k\">%s</td><td>%.2f</td><td>%.2f</td><td>%.3f</td></tr>\n", cats[k], pl[k], me[k],
            pl[k] > 0 ? me[k] / pl[k] : NAN);
  fprintf(f, "</table>\n");
}

static void summary(FILE *f, const tdm__run *r) {
  fprintf(f, "<h2 id=\"summary\">Summary</h2>\n<table>\n");
  const tdm__step_rec *a = &r->steps[0], *z = &r->steps[r->n_steps - 1];
  row(f, "metrics", "%s", r->metrics);
  if (r->n_headers)
    row(f, "run", "%s, started %s, configuration %s%s", r->headers[0].run_id, r->headers[0].started, r->headers[0].config_hash,
        r->n_headers > 1 ? " (with its resumes and restarts)" : "");
  row(f, "steps recorded", "%d (steps %lld to %lld)", r->n_steps, (long long)a->step + 1, (long long)z->step + 1);
  row(f, "world size", "%d rank%s, global batch %lld", z->world, z->world == 1 ? "" : "s", (long long)z->global_batch);
  row(f, "last training loss", "%.4f", z->loss);
  for (int i = r->n_evals - 1; i >= 0; i--) {
    row(f, r->evals[i].validation ? "last validation loss" : "test loss (end)", "%.4f, accuracy %.4f (after step %lld)",
        r->evals[i].loss, r->evals[i].accuracy, (long long)r->evals[i].step);
    break;
  }
  row(f, "throughput", "%.1f samples/s (mean over the steps after the first)", tdm__run_mean(r, offsetof(tdm__step_rec, samples_per_sec)));
  double tps = tdm__run_mean(r, offsetof(tdm__step_rec, tokens_per_sec));
  if (isfinite(tps)) row(f, "token throughput", "%.1f tokens/s", tps);
  row(f, "step time", "%.2f ms (rank 0, mean over the steps after the first)", tdm__run_mean(r, offsetof(tdm__step_rec, step_ms)));
  row(f, "training time", "%.2f s (steps only, no evaluation)", z->time_s);
  fprintf(f, "</table>\n");
}

tdm_status tdm__report_html(FILE *f, const tdm__run *r) {
  if (!r || r->n_steps == 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "report: no steps to report");
  char title[256];
  snprintf(title, sizeof title, "tandem report: %s on %s, %d rank%s", hstr(r, "config", "model", "?"), hstr(r, "config", "data", "?"),
           r->steps[r->n_steps - 1].world, r->steps[r->n_steps - 1].world == 1 ? "" : "s");
  tdm__html_begin(f, title);
  if (r->n_notes || r->skipped) {
    fprintf(f, "<div class=\"notes\"><h2 id=\"input\">About the input</h2><ul>\n");
    if (r->skipped) fprintf(f, "<li>%d line%s skipped: not whole JSON records (a run killed while writing?)</li>\n", r->skipped, r->skipped == 1 ? "" : "s");
    for (int i = 0; i < r->n_notes; i++) {
      fprintf(f, "<li>");
      tdm__html_text(f, r->notes[i]);
      fprintf(f, "</li>\n");
    }
    fprintf(f, "</ul></div>\n");
  }
  summary(f, r);
  curves(f, r);
  throughput(f, r);
  step_parts(f, r);
  stragglers(f, r);
  communication(f, r);
  memory(f, r);
  fprintf(f, "<h2 id=\"config\">Configuration</h2>\n");
  json_table(f, r->header_json ? tdm__json_get(r->header_json, "config") : NULL);
  if (r->header_json) {
    fprintf(f, "<h3>What a resumed run must share (the checkpoint's identity)</h3>\n");
    json_table(f, tdm__json_get(r->header_json, "identity"));
  }
  fprintf(f, "<h2 id=\"env\">Environment</h2>\n");
  json_table(f, r->header_json ? tdm__json_get(r->header_json, "env") : NULL);
  (void)hnum;
  tdm__html_end(f);
  return ferror(f) ? tdm__set_error(TDM_ERR_IO, "report: writing the page failed") : TDM_OK;
}
