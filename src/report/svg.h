/* A small SVG plotter for the HTML reports (tandem report, tandem scale): line plots and bar
 * charts (grouped or stacked) with axes, "nice" ticks, axis labels, a title and a legend, written
 * as inline <svg> elements: the page needs no script and no network.
 *
 *   double x[3] = {0, 1, 2}, y[3] = {2.3, 1.9, 1.2};
 *   tdm__series s = {"train loss", x, y, 3};
 *   tdm__svg_lines(f, "loss", "step", "loss", &s, 1, 0);
 *
 * Every element carries a class (plot, axis, tick, axis-label, series, bar, legend) so tests and
 * style sheets can find them. Values that are not finite are skipped (a gap in a line). Not
 * thread-safe per FILE; no state of its own. */
#ifndef TANDEM_REPORT_SVG_H
#define TANDEM_REPORT_SVG_H

#include <stdio.h>

typedef struct {
  const char *name;
  const double *x, *y; /* n points (bars: y per category, x unused) */
  int n;
} tdm__series;

/* Line plot of ns series; logy: a log10 y axis (values <= 0 skipped). */
void tdm__svg_lines(FILE *f, const char *title, const char *xlabel, const char *ylabel, const tdm__series *s, int ns, int logy);

/* The same with options (TDM__SVG_* or-ed): LOGX a log10 x axis (values <= 0 skipped; ticks at the
 * data's x values when they are 12 or fewer, else at powers of 10), LOGY as logy above, BARE the
 * <svg> element alone, without the HTML <figure> around it (a standalone .svg file's content). */
enum { TDM__SVG_LOGX = 1, TDM__SVG_LOGY = 2, TDM__SVG_BARE = 4 };
void tdm__svg_lines_opt(FILE *f, const char *title, const char *xlabel, const char *ylabel, const tdm__series *s, int ns, int flags);

/* Bar chart: ncat categories along x, one bar per series in each (grouped) or the series piled
 * up (stacked). */
void tdm__svg_bars(FILE *f, const char *title, const char *xlabel, const char *ylabel, const char *const *cats, int ncat,
                   const tdm__series *s, int ns, int stacked);

/* Text escaped for HTML and SVG (&, <, >, "). */
void tdm__html_text(FILE *f, const char *s);

/* Nice tick positions covering [lo, hi]: at most max ticks, steps of 1, 2 or 5 x 10^k; returns
 * their count and writes them to t. */
int tdm__nice_ticks(double lo, double hi, int max, double *t);

#endif
