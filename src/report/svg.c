/* Inline SVG plots for the reports; see svg.h. */
#include "report/svg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { W = 640, H = 340, ML = 72, MR = 16, MT = 34, MB = 74 }; /* canvas and margins (px) */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NPAL ((int)(sizeof palette / sizeof *palette))

void tdm__html_text(FILE *f, const char *s) {
  for (; s && *s; s++) {
    if (*s == '&') fputs("&amp;", f);
    else if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

int tdm__nice_ticks(double lo, double hi, int max, double *t) {
  if (!isfinite(lo) || !isfinite(hi) || max < 2) return 0;
  if (hi <= lo) hi = lo + (lo != 0 ? fabs(lo) * 0.1 : 1);
  double raw = (hi - lo) / (max - 1), mag = pow(10, floor(log10(raw))), step = mag;
  static const double mult[] = {1, 2, 5, 10};
  for (int i = 0; i < 4; i++)
    if (mult[i] * mag >= raw) {
      step = mult[i] * mag;
      break;
    }
  int n = 0;
  for (double v = ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9 && n < max + 1; v += step) t[n++] = fabs(v) < step * 1e-9 ? 0 : v;
  return n;
}

static void fmt_num(char *b, size_t n, double v) {
  double a = fabs(v);
  if (v == 0) snprintf(b, n, "0");
  else if (a >= 1e6 || a < 1e-3) snprintf(b, n, "%.3g", v);
  else if (a >= 100 || v == floor(v)) snprintf(b, n, "%.0f", v);
  else snprintf(b, n, "%.3g", v);
}

typedef struct {
  double x0, x1, y0, y1;
  int logy;
  int int_x; /* every x is a whole number (ranks, steps): no ticks between them */
  int logx;  /* x0, x1 are log10 of the range; xt: the tick positions (data units) */
  const double *xt;
  int nxt;
} frame;

static double px(const frame *fr, double x) {
  if (fr->logx) x = log10(x);
  return ML + (x - fr->x0) / (fr->x1 - fr->x0) * (W - ML - MR);
}
static double py(const frame *fr, double y) {
  if (fr->logy) y = log10(y);
  return H - MB - (y - fr->y0) / (fr->y1 - fr->y0) * (H - MT - MB);
}

static void open_svg(FILE *f, const char *title, int bare) {
  fprintf(f, "%s<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
             "role=\"img\" font-family=\"sans-serif\" font-size=\"12\"><title>",
          bare ? "" : "<figure class=\"plot\">", W, H, W, H);
  tdm__html_text(f, title);
  fprintf(f, "</title><rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>"
             "<text class=\"plot-title\" x=\"%d\" y=\"20\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">",
          W, H, W / 2);
  tdm__html_text(f, title);
  fprintf(f, "</text>\n");
}

/* Axes with ticks and labels. xcats: category names under bars instead of numeric x ticks. */
static void axes(FILE *f, const frame *fr, const char *xlabel, const char *ylabel, const char *const *xcats, int ncat) {
  double t[16];
  char b[32];
  fprintf(f, "<g class=\"axis y\">");
  int n = tdm__nice_ticks(fr->y0, fr->y1, 6, t);
  if (fr->logy && n > 1 && t[1] - t[0] < 1) { /* less than a decade a tick: 1, 2, 5 x 10^k, not 10^0.5 */
    n = 0;
    for (double e = floor(fr->y0); e <= ceil(fr->y1) && n < 16; e++)
      for (int j = 0; j < 3 && n < 16; j++) {
        double v = e + log10((double)(j == 0 ? 1 : j == 1 ? 2 : 5));
        if (v >= fr->y0 && v <= fr->y1) t[n++] = v;
      }
  }
  for (int i = 0; i < n; i++) {
    if (t[i] < fr->y0 - 1e-12 * fabs(fr->y0) || t[i] > fr->y1 + 1e-12 * fabs(fr->y1)) continue;
    double yy = H - MB - (t[i] - fr->y0) / (fr->y1 - fr->y0) * (H - MT - MB);
    fmt_num(b, sizeof b, fr->logy ? pow(10, t[i]) : t[i]);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/><text class=\"tick\" x=\"%d\" y=\"%.1f\" "
               "text-anchor=\"end\">%s</text>",
            ML, W - MR, yy, yy, ML - 6, yy + 4, b);
  }
  fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#333\"/></g>\n", ML, ML, MT, H - MB);
  fprintf(f, "<g class=\"axis x\">");
  if (xcats) {
    double w = (double)(W - ML - MR) / ncat;
    int every = ncat > 24 ? (ncat + 23) / 24 : 1;
    for (int i = 0; i < ncat; i += every) {
      fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"%d\">", ML + w * (i + 0.5), H - MB + 16, ncat > 6 ? 10 : 12);
      tdm__html_text(f, xcats[i]);
      fprintf(f, "</text>");
    }
  } else if (fr->logx) { /* the given positions, in data units */
    for (int i = 0; i < fr->nxt; i++) {
      fmt_num(b, sizeof b, fr->xt[i]);
      double x = px(fr, fr->xt[i]);
      fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#333\"/><text class=\"tick\" x=\"%.1f\" y=\"%d\" "
                 "text-anchor=\"middle\">%s</text>",
              x, x, H - MB, H - MB + 5, x, H - MB + 18, b);
    }
  } else {
    n = tdm__nice_ticks(fr->x0, fr->x1, 8, t);
    for (int i = 0; i < n; i++) {
      if (t[i] < fr->x0 || t[i] > fr->x1 || (fr->int_x && t[i] != floor(t[i]))) continue;
      fmt_num(b, sizeof b, t[i]);
      fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#333\"/><text class=\"tick\" x=\"%.1f\" y=\"%d\" "
                 "text-anchor=\"middle\">%s</text>",
              px(fr, t[i]), px(fr, t[i]), H - MB, H - MB + 5, px(fr, t[i]), H - MB + 18, b);
    }
  }
  fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#333\"/></g>\n", ML, W - MR, H - MB, H - MB);
  fprintf(f, "<text class=\"axis-label x\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (ML + W - MR) / 2, H - MB + 36);
  tdm__html_text(f, xlabel);
  fprintf(f, "</text><text class=\"axis-label y\" transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\">",
          (MT + H - MB) / 2);
  tdm__html_text(f, ylabel);
  fprintf(f, "</text>\n");
}

static void legend(FILE *f, const tdm__series *s, int ns, int rect) {
  if (ns < 1) return;
  fprintf(f, "<g class=\"legend\">");
  double x = ML, y = H - 14;
  for (int i = 0; i < ns; i++) {
    double w = 26 + 7.0 * (double)strlen(s[i].name ? s[i].name : "");
    if (x + w > W - MR && x > ML) x = ML, y += 14; /* wraps below; rarely needed */
    if (rect) fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"10\" fill=\"%s\"/>", x, y - 9, palette[i % NPAL]);
    else fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>", x, x + 14, y - 4, y - 4, palette[i % NPAL]);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x + 18, y);
    tdm__html_text(f, s[i].name);
    fprintf(f, "</text>");
    x += w;
  }
  fprintf(f, "</g>\n");
}

static void no_data(FILE *f) {
  fprintf(f, "<text class=\"no-data\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#888\">no data</text>", W / 2, H / 2);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

void tdm__svg_lines(FILE *f, const char *title, const char *xlabel, const char *ylabel, const tdm__series *s, int ns, int logy) {
  tdm__svg_lines_opt(f, title, xlabel, ylabel, s, ns, logy ? TDM__SVG_LOGY : 0);
}

void tdm__svg_lines_opt(FILE *f, const char *title, const char *xlabel, const char *ylabel, const tdm__series *s, int ns, int flags) {
  int logx = (flags & TDM__SVG_LOGX) != 0, logy = (flags & TDM__SVG_LOGY) != 0, bare = (flags & TDM__SVG_BARE) != 0;
  frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY, logy, 1, logx, NULL, 0};
#define OK_AT(k, j) (isfinite(s[k].x[j]) && isfinite(s[k].y[j]) && (!logy || s[k].y[j] > 0) && (!logx || s[k].x[j] > 0))
  double xt[13];
  int nxt = 0;
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < s[k].n; i++) {
      if (!OK_AT(k, i)) continue;
      double x = s[k].x[i], y = s[k].y[i];
      if (logy) y = log10(y);
      if (logx) { /* the distinct x values, the first 13 */
        int seen = 0;
        for (int j = 0; j < nxt; j++) seen |= xt[j] == x;
        if (!seen && nxt < 13) xt[nxt++] = x;
        x = log10(x);
      }
      fr.int_x &= x == floor(x);
      fr.x0 = fmin(fr.x0, x), fr.x1 = fmax(fr.x1, x), fr.y0 = fmin(fr.y0, y), fr.y1 = fmax(fr.y1, y);
    }
  open_svg(f, title, bare);
  if (!(fr.x0 <= fr.x1)) {
    fr = (frame){0, 1, 0, 1, 0, 0, 0, NULL, 0};
    axes(f, &fr, xlabel, ylabel, NULL, 0);
    no_data(f);
    fprintf(f, "</svg>%s\n", bare ? "" : "</figure>");
    return;
  }
  if (logx) { /* ticks: the data's x values when few, else the powers of 10 in the range */
    if (nxt > 12) {
      nxt = 0;
      for (double e = ceil(fr.x0 - 1e-9); e <= fr.x1 + 1e-9 && nxt < 13; e++) xt[nxt++] = pow(10, e);
    }
    qsort(xt, (size_t)nxt, sizeof *xt, cmp_double);
    fr.xt = xt, fr.nxt = nxt;
  }
  if (fr.x1 == fr.x0) fr.x0 -= 0.5, fr.x1 += 0.5;
  if (logx) { /* a margin so that the first and last points are not on the frame */
    double m = (fr.x1 - fr.x0) * 0.03;
    fr.x0 -= m, fr.x1 += m;
  }
  double pad = (fr.y1 - fr.y0) * 0.05;
  if (pad == 0) pad = fr.y0 != 0 ? fabs(fr.y0) * 0.1 : 1;
  fr.y0 -= pad, fr.y1 += pad;
  if (!logy && fr.y0 < 0 && fr.y0 + pad >= 0) fr.y0 = 0; /* positive data: the axis starts at 0, not below */
  axes(f, &fr, xlabel, ylabel, NULL, 0);
  for (int k = 0; k < ns; k++) {
    fprintf(f, "<g class=\"series\" data-name=\"");
    tdm__html_text(f, s[k].name);
    fprintf(f, "\">");
    int pts = 0;
    for (int i = 0; i < s[k].n;) { /* runs of drawable points: a line each, a lone point as a dot */
      if (!OK_AT(k, i)) {
        i++;
        continue;
      }
      int j = i;
      while (j < s[k].n && OK_AT(k, j)) j++;
      if (j - i == 1) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", px(&fr, s[k].x[i]), py(&fr, s[k].y[i]), palette[k % NPAL]);
      } else {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", palette[k % NPAL]);
        for (int q = i; q < j; q++) fprintf(f, "%.1f,%.1f ", px(&fr, s[k].x[q]), py(&fr, s[k].y[q]));
        fprintf(f, "\"/>");
      }
      pts += j - i;
      i = j;
    }
    if (pts > 1 && (pts <= 3 || logx)) /* a line of a few points, or at chosen x values: show the points themselves too */
      for (int i = 0; i < s[k].n; i++)
        if (OK_AT(k, i))
          fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", px(&fr, s[k].x[i]), py(&fr, s[k].y[i]), palette[k % NPAL]);
    fprintf(f, "</g>\n");
  }
#undef OK_AT
  legend(f, s, ns, 0);
  fprintf(f, "</svg>%s\n", bare ? "" : "</figure>");
}

void tdm__svg_bars(FILE *f, const char *title, const char *xlabel, const char *ylabel, const char *const *cats, int ncat,
                   const tdm__series *s, int ns, int stacked) {
  double hi = 0, lo = 0;
  for (int c = 0; c < ncat; c++) {
    double pos = 0;
    for (int k = 0; k < ns; k++) {
      double v = c < s[k].n && isfinite(s[k].y[c]) ? s[k].y[c] : 0;
      if (stacked) pos += v > 0 ? v : 0;
      else hi = fmax(hi, v), lo = fmin(lo, v);
    }
    if (stacked) hi = fmax(hi, pos);
  }
  open_svg(f, title, 0);
  frame fr = {0, 1, lo, hi > lo ? hi * 1.05 : 1, 0, 0, 0, NULL, 0};
  axes(f, &fr, xlabel, ylabel, cats, ncat > 0 ? ncat : 1);
  if (ncat < 1 || ns < 1) no_data(f);
  double cw = (double)(W - ML - MR) / (ncat > 0 ? ncat : 1), bw = stacked ? cw * 0.6 : cw * 0.8 / (ns > 0 ? ns : 1);
  for (int k = 0; k < ns; k++) {
    fprintf(f, "<g class=\"series\" data-name=\"");
    tdm__html_text(f, s[k].name);
    fprintf(f, "\">");
    for (int c = 0; c < ncat; c++) {
      double v = c < s[k].n && isfinite(s[k].y[c]) ? s[k].y[c] : 0, base = 0;
      if (stacked)
        for (int j = 0; j < k; j++) base += c < s[j].n && isfinite(s[j].y[c]) && s[j].y[c] > 0 ? s[j].y[c] : 0;
      if (stacked && v < 0) v = 0;
      double x = stacked ? ML + cw * c + cw * 0.2 : ML + cw * c + cw * 0.1 + bw * k;
      double y1 = py(&fr, base + (v > 0 ? v : 0)), y0 = py(&fr, base + (v < 0 ? v : 0));
      char b[32];
      fmt_num(b, sizeof b, v);
      fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>", x, y1, bw,
              y0 - y1 > 0 ? y0 - y1 : 0, palette[k % NPAL]);
      tdm__html_text(f, s[k].name);
      fprintf(f, ", ");
      tdm__html_text(f, cats[c]);
      fprintf(f, ": %s</title></rect>", b);
    }
    fprintf(f, "</g>\n");
  }
  legend(f, s, ns, 1);
  fprintf(f, "</svg></figure>\n");
}
