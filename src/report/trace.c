/* Chrome trace files summed per rank for the report; see trace.h. Spans of one kind that nest or
 * overlap (a backward span and its per-layer spans, buckets in flight together) count once: each
 * kind's time is the length of the union of its spans, and the hidden communication is the length
 * of the communication union inside the backward union. */
#include "report/trace.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/json.h"
#include "core/trace_read.h"

static int has(const char *s, const char *w) { return s && strstr(s, w) != NULL; }

int tdm__trace_kind(const char *name, const char *cat) {
  char b[256];
  snprintf(b, sizeof b, "%s|%s", name ? name : "", cat ? cat : "");
  for (char *p = b; *p; p++) *p = (char)tolower((unsigned char)*p);
  if (!strncmp(b, "step|", 5) || !strncmp(b, "step ", 5) || !strncmp(b, "train_step|", 11)) return -1; /* a container */
  if (has(b, "optim") || has(b, "update") || has(b, "adam") || has(b, "sgd")) return TDM__TK_OPT;
  if (has(b, "comm") || has(b, "reduce") || has(b, "bucket") || has(b, "gather") || has(b, "scatter") || has(b, "broadcast") ||
      has(b, "send") || has(b, "recv") || has(b, "collective") || has(b, "all-to-all") || has(b, "alltoall"))
    return TDM__TK_COMM;
  if (has(b, "backward") || has(b, "bwd")) return TDM__TK_BWD;
  if (has(b, "forward") || has(b, "fwd")) return TDM__TK_FWD;
  return TDM__TK_OTHER;
}

typedef struct {
  int64_t pid;
  int kind;
  double t0, t1;
} span;

static int span_order(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
  if (x->kind != y->kind) return x->kind - y->kind;
  return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

/* Merges sorted spans [a, b) in place into disjoint intervals; returns their count. */
static int merge(span *s, int n) {
  int w = 0;
  for (int i = 0; i < n; i++) {
    if (w > 0 && s[i].t0 <= s[w - 1].t1) {
      if (s[i].t1 > s[w - 1].t1) s[w - 1].t1 = s[i].t1;
    } else {
      s[w++] = s[i];
    }
  }
  return w;
}

static double length(const span *s, int n) {
  double t = 0;
  for (int i = 0; i < n; i++) t += s[i].t1 - s[i].t0;
  return t;
}

static double overlap(const span *a, int na, const span *b, int nb) {
  double t = 0;
  for (int i = 0, j = 0; i < na && j < nb;) {
    double lo = fmax(a[i].t0, b[j].t0), hi = fmin(a[i].t1, b[j].t1);
    if (hi > lo) t += hi - lo;
    if (a[i].t1 < b[j].t1) i++;
    else j++;
  }
  return t;
}

static double num(const tdm_json *o, const char *k, double def) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_NUM ? v->num : def;
}

static int64_t pid_of(const tdm_json *e) { /* out of range: 0 (a cast would be undefined) */
  double v = num(e, "pid", 0);
  return v >= -9.2e18 && v <= 9.2e18 ? (int64_t)v : 0;
}

static const char *str(const tdm_json *o, const char *k) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_STR ? v->str : NULL;
}

tdm_status tdm__trace_add_file(tdm__trace *t, const char *path) {
  tdm_json *doc = NULL;
  int unclosed = 0;
  tdm_status st = tdm__trace_read(path, (int64_t)2 << 30, &doc, &unclosed);
  /* not JSON, or past the size a report reads: the reader's message says which */
  if (st == TDM_ERR_FORMAT) return tdm__set_error(TDM_ERR_FORMAT, "%s: not read as a trace (%s)", path, tdm_last_error());
  TDM__TRY(st);
  t->unclosed += unclosed;
  if (unclosed && t->n_notes < 3) { /* a run that stopped: its events up to the last flush still count */
    snprintf(t->notes[t->n_notes++], sizeof t->notes[0], "%s was not closed (its run stopped, or its end is damaged): read up to its last whole event", path);
    t->unclosed_noted++;
  }
  const tdm_json *ev = doc->type == TDM_JSON_ARR ? doc : tdm__json_get(doc, "traceEvents");
  if (!ev || ev->type != TDM_JSON_ARR) {
    tdm__json_free(doc);
    return tdm__set_error(TDM_ERR_FORMAT, "%s: not read as a trace: no traceEvents array", path);
  }
  span *s = malloc(sizeof *s * (size_t)(ev->n > 0 ? ev->n : 1));
  if (!s) {
    tdm__json_free(doc);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
  }
  int n = 0;
  struct {
    int64_t pid;
    char name[64];
  } names[64];
  int n_names = 0;
  for (int i = 0; i < ev->n; i++) {
    const tdm_json *e = &ev->items[i];
    const char *ph = e->type == TDM_JSON_OBJ ? str(e, "ph") : NULL;
    if (ph && !strcmp(ph, "M") && str(e, "name") && !strcmp(str(e, "name"), "process_name") && n_names < 64) {
      const tdm_json *args = tdm__json_get(e, "args");
      const char *nm = args ? str(args, "name") : NULL;
      if (nm) names[n_names].pid = pid_of(e), snprintf(names[n_names++].name, 64, "%s", nm);
      continue;
    }
    double ts = num(e, "ts", NAN), dur = num(e, "dur", NAN);
    if (!ph || strcmp(ph, "X") || !isfinite(ts) || !(dur >= 0) || !isfinite(ts + dur)) {
      t->ignored++;
      continue;
    }
    int k = tdm__trace_kind(str(e, "name"), str(e, "cat"));
    if (k < 0) continue;
    s[n++] = (span){pid_of(e), k, ts, ts + dur};
  }
  tdm__json_free(doc);
  if (n > 1) qsort(s, (size_t)n, sizeof *s, span_order);
  for (int i = 0; i < n;) { /* one process at a time */
    int j = i;
    while (j < n && s[j].pid == s[i].pid) j++;
    int at = -1;
    for (int p = 0; p < t->n_procs; p++)
      if (t->procs[p].pid == s[i].pid) at = p;
    if (at < 0) {
      tdm__trace_proc *np = realloc(t->procs, sizeof *np * (size_t)(t->n_procs + 1));
      if (!np) {
        free(s);
        return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
      }
      t->procs = np;
      at = t->n_procs++;
      memset(&t->procs[at], 0, sizeof t->procs[at]);
      t->procs[at].pid = s[i].pid;
      t->procs[at].file = t->files;
      for (int q = 0; q < n_names; q++)
        if (names[q].pid == s[i].pid) memcpy(t->procs[at].name, names[q].name, sizeof names[q].name);
    }
    if (t->procs[at].file != t->files) { /* read already */
      if (t->n_notes < 4)
        snprintf(t->notes[t->n_notes++], sizeof t->notes[0], "%s: process %lld was read from an earlier trace file (a merged "
                 "trace beside the per-rank ones?): its events here are not counted again", path, (long long)s[i].pid);
      i = j;
      continue;
    }
    tdm__trace_proc *pr = &t->procs[at];
    span *kind_at[TDM__TK_COUNT] = {0};
    int kind_n[TDM__TK_COUNT] = {0};
    for (int a = i; a < j;) {
      int b = a;
      while (b < j && s[b].kind == s[a].kind) b++;
      int m = merge(s + a, b - a);
      kind_at[s[a].kind] = s + a, kind_n[s[a].kind] = m;
      pr->us[s[a].kind] += length(s + a, m);
      pr->events += b - a;
      t->events += b - a;
      a = b;
    }
    pr->comm_hidden_us += overlap(kind_at[TDM__TK_COMM], kind_n[TDM__TK_COMM], kind_at[TDM__TK_BWD], kind_n[TDM__TK_BWD]);
    i = j;
  }
  free(s);
  t->files++;
  for (int a = 1; a < t->n_procs; a++) /* by pid: rank order */
    for (int b = a; b > 0 && t->procs[b - 1].pid > t->procs[b].pid; b--) {
      tdm__trace_proc x = t->procs[b];
      t->procs[b] = t->procs[b - 1], t->procs[b - 1] = x;
    }
  return TDM_OK;
}

void tdm__trace_free(tdm__trace *t) {
  if (!t) return;
  free(t->procs);
  t->procs = NULL, t->n_procs = 0;
}
