/* Reading a run's metrics (and finding its traces); see run.h. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"
#include "report/run.h"
#include "report/trace.h"

tdm__run *tdm__run_new(void) {
  tdm__run *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  for (int k = 0; k <= TDM_MEM_COUNT; k++) r->mem_peak[k] = -1;
  return r;
}

void tdm__run_free(tdm__run *r) {
  if (!r) return;
  for (int i = 0; i < r->n_steps; i++) free(r->steps[i].rank_ms);
  free(r->steps);
  free(r->evals);
  free(r->headers);
  tdm__json_free(r->header_doc);
  for (int i = 0; i < r->n_ps; i++) tdm__json_free(r->ps[i]);
  free(r->ps);
  if (r->trace) tdm__trace_free(r->trace), free(r->trace);
  free(r);
}

static void note(tdm__run *r, FILE *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(tdm__run *r, FILE *err, const char *fmt, ...) {
  char b[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  if (err) fprintf(err, "tandem report: %s\n", b);
  if (r->n_notes < (int)(sizeof r->notes / sizeof r->notes[0])) snprintf(r->notes[r->n_notes++], sizeof r->notes[0], "%s", b);
}

/* A number of the file as an integer: def when absent, not finite or out of range (a cast would
 * be undefined behaviour; found by fuzz_metrics). */
static int64_t to_i64(double v, int64_t def) { return v >= -9.2e18 && v <= 9.2e18 ? (int64_t)v : def; }
static int to_int(double v, int def) { return v >= -2e9 && v <= 2e9 ? (int)v : def; }

static double num(const tdm_json *o, const char *k) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_NUM ? v->num : NAN;
}

static const char *str(const tdm_json *o, const char *k) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_STR ? v->str : NULL;
}

const tdm_json *tdm__run_header_get(const tdm__run *r, const char *object, const char *key) {
  if (!r->header_json) return NULL;
  const tdm_json *o = tdm__json_get(r->header_json, object);
  return o && o->type == TDM_JSON_OBJ ? tdm__json_get(o, key) : NULL;
}

static int grow(void **p, int n, int *cap, size_t size) {
  if (n < *cap) return 0;
  int c = *cap ? *cap * 2 : 64;
  void *q = realloc(*p, (size_t)c * size);
  if (!q) return -1;
  *p = q, *cap = c;
  return 0;
}

/* What two headers' identities differ in ("model mlp vs gpt; tandem.seed 1 vs 2"). */
static void identity_diff(const tdm_json *a, const tdm_json *b, char *out, size_t cap) {
  out[0] = 0;
  const tdm_json *ia = a ? tdm__json_get(a, "identity") : NULL, *ib = b ? tdm__json_get(b, "identity") : NULL;
  if (!ia || !ib || ia->type != TDM_JSON_OBJ || ib->type != TDM_JSON_OBJ) return;
  size_t at = 0;
  for (int i = 0; i < ia->n && at < cap; i++) {
    const char *va = ia->items[i].type == TDM_JSON_STR ? ia->items[i].str : "?";
    const tdm_json *jb = tdm__json_get(ib, ia->keys[i]);
    const char *vb = jb && jb->type == TDM_JSON_STR ? jb->str : "(none)";
    if (strcmp(va, vb)) at += (size_t)snprintf(out + at, cap - at, "%s%s %s vs %s", at ? "; " : "", ia->keys[i], va, vb);
  }
}

typedef struct {
  tdm_json **docs;
  int n, cap;
} docs;

static tdm_status mixed(const tdm__run_header *a, const tdm_json *ja, const tdm__run_header *b, const tdm_json *jb) {
  char diff[400];
  identity_diff(ja, jb, diff, sizeof diff);
  return tdm__set_error(TDM_ERR_MISMATCH,
                        "report: metrics of different runs are mixed: run %s (started %s, config %s, %s) and run %s (started %s, "
                        "config %s, %s), which neither resumes it from a checkpoint nor restarts the same job%s%s; give "
                        "one run's metrics (tandem train appends to an existing --metrics file: use a new file or "
                        "directory per run)",
                        a->run_id, a->started, a->config_hash, a->where, b->run_id, b->started, b->config_hash, b->where,
                        diff[0] ? ": " : "", diff);
}

static tdm_status add_header(tdm__run *r, const tdm_json *h, tdm_json *doc, docs *d, const char *name, int line,
                             int steps_before, FILE *err) {
  tdm__run_header x = {0};
  snprintf(x.run_id, sizeof x.run_id, "%s", str(h, "run_id") ? str(h, "run_id") : "?");
  snprintf(x.config_hash, sizeof x.config_hash, "%s", str(h, "config_hash") ? str(h, "config_hash") : "?");
  snprintf(x.job, sizeof x.job, "%s", str(h, "job") ? str(h, "job") : "0");
  snprintf(x.started, sizeof x.started, "%s", str(h, "started") ? str(h, "started") : "?");
  snprintf(x.where, sizeof x.where, "%s:%d", name, line);
  double a = num(h, "attempt"), rf = num(h, "resumed_from"), ss = num(h, "start_step");
  x.attempt = to_int(a, 0);
  x.resumed_from = to_i64(rf, -1);
  x.start_step = to_i64(ss, 0);
  if (r->n_headers == 0 && steps_before > 0) {
    tdm__run_header none = {0};
    snprintf(none.run_id, sizeof none.run_id, "(no header)");
    snprintf(none.started, sizeof none.started, "?");
    snprintf(none.config_hash, sizeof none.config_hash, "?");
    snprintf(none.where, sizeof none.where, "%s:1", name);
    if (x.resumed_from < 0) return mixed(&none, NULL, &x, h);
  }
  if (r->n_headers > 0) {
    const tdm__run_header *p = &r->headers[r->n_headers - 1];
    int restart = strcmp(x.job, "0000000000000000") && strcmp(x.job, "0") && !strcmp(x.job, p->job) && x.attempt > p->attempt &&
                  !strcmp(x.config_hash, p->config_hash);
    if (x.resumed_from < 0 && !restart) return mixed(p, d->n ? tdm__json_get(d->docs[d->n - 1], "tandem_run") : NULL, &x, h);
    if (x.resumed_from >= 0)
      note(r, err, "%s: run %s resumed from the checkpoint of step %lld", x.where, x.run_id, (long long)x.resumed_from);
    else
      note(r, err, "%s: run %s restarted the job (attempt %d) from step %lld without a checkpoint", x.where, x.run_id, x.attempt,
           (long long)x.start_step);
  }
  tdm__run_header *nh = realloc(r->headers, sizeof *nh * (size_t)(r->n_headers + 1));
  if (!nh) return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
  r->headers = nh;
  r->headers[r->n_headers++] = x;
  if (grow((void **)&d->docs, d->n, &d->cap, sizeof *d->docs)) return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
  d->docs[d->n++] = doc;
  return TDM_OK;
}

static tdm_status add_step(tdm__run *r, const tdm_json *o, int *cap) {
  if (grow((void **)&r->steps, r->n_steps, cap, sizeof *r->steps)) return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
  tdm__step_rec s;
  memset(&s, 0, sizeof s);
  s.step = to_i64(num(o, "step"), 0);
  double e = num(o, "epoch");
  s.epoch = to_i64(e, 0);
  s.loss = num(o, "loss"), s.grad_norm = num(o, "grad_norm"), s.samples_per_sec = num(o, "samples_per_sec");
  s.tokens_per_sec = num(o, "tokens_per_sec"), s.lr = num(o, "lr"), s.train_accuracy = num(o, "train_accuracy");
  s.step_ms = num(o, "step_time_ms"), s.fwd_ms = num(o, "time_forward_ms"), s.bwd_ms = num(o, "time_backward_ms");
  s.wait_ms = num(o, "time_comm_wait_ms"), s.opt_ms = num(o, "time_optimizer_ms");
  double w = num(o, "world_size"), gb = num(o, "global_batch"), bytes = num(o, "grad_bytes");
  s.world = to_int(w, 1);
  s.global_batch = to_i64(gb, 0);
  s.grad_bytes = to_i64(bytes, 0);
  s.compress_ratio = NAN;
  const tdm_json *cr = tdm__json_get(o, "compress_ratio");
  if (cr && cr->type == TDM_JSON_ARR && cr->n > 0) {
    double sum = 0;
    for (int i = 0; i < cr->n; i++) sum += cr->items[i].type == TDM_JSON_NUM ? cr->items[i].num : NAN;
    s.compress_ratio = sum / cr->n;
  }
  s.slowest = -1;
  static const char *const keys[TDM__RT_COUNT] = {"rank_step_ms", "rank_forward_ms", "rank_backward_ms", "rank_comm_wait_ms",
                                                  "rank_optimizer_ms"};
  const tdm_json *a0 = tdm__json_get(o, keys[0]);
  int n = a0 && a0->type == TDM_JSON_ARR ? a0->n : 0;
  for (int k = 1; k < TDM__RT_COUNT && n > 0; k++) {
    const tdm_json *a = tdm__json_get(o, keys[k]);
    if (!a || a->type != TDM_JSON_ARR || a->n != n) n = 0; /* inconsistent: ignore the per-rank part */
  }
  if (n > 0 && !(s.rank_ms = malloc(sizeof(double) * (size_t)n * TDM__RT_COUNT)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
  for (int k = 0; k < TDM__RT_COUNT && n > 0; k++) {
    const tdm_json *a = tdm__json_get(o, keys[k]);
    for (int i = 0; i < n; i++) s.rank_ms[i * TDM__RT_COUNT + k] = a->items[i].type == TDM_JSON_NUM ? a->items[i].num : NAN;
  }
  s.n_ranks = n;
  double sl = num(o, "slowest_rank");
  if (n > 0) s.slowest = isfinite(sl) && sl >= 0 && sl < n ? (int)sl : 0;
  s.attempt = r->n_headers > 0 ? r->n_headers - 1 : 0;
  r->steps[r->n_steps++] = s;
  return TDM_OK;
}

static tdm_status parse_stream(tdm__run *r, FILE *in, const char *name, FILE *err, docs *d) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int ln = 0, step_cap = r->n_steps, eval_cap = r->n_evals, steps_here = 0;
  tdm_status st = TDM_OK;
  while (st == TDM_OK && (len = getline(&line, &cap, in)) >= 0) {
    ln++;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
    size_t sp = strspn(line, " \t");
    if (line[sp] == 0) continue;
    tdm_json *j = NULL;
    if (tdm__json_parse(line, (size_t)len, &j) != TDM_OK || j->type != TDM_JSON_OBJ) {
      r->skipped++;
      note(r, err, "%s:%d: skipped: not a whole JSON record (%zd bytes%s: \"%.40s%s\")", name, ln, len,
           j ? ", not an object" : ", truncated or corrupt", line + sp, strlen(line + sp) > 40 ? "..." : "");
      tdm__json_free(j);
      continue;
    }
    const tdm_json *h = tdm__json_get(j, "tandem_run");
    if (h && h->type == TDM_JSON_OBJ) {
      st = add_header(r, h, j, d, name, ln, steps_here, err);
      if (st != TDM_OK) tdm__json_free(j);
      continue; /* the document now belongs to d */
    }
    if (tdm__json_get(j, "step_time_ms") && isfinite(num(j, "step"))) {
      st = add_step(r, j, &step_cap);
      steps_here++;
    } else if (isfinite(num(j, "val_loss")) || isfinite(num(j, "test_loss")) ||
               (tdm__json_get(j, "val_loss") || tdm__json_get(j, "test_loss"))) {
      if (grow((void **)&r->evals, r->n_evals, &eval_cap, sizeof *r->evals)) st = tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
      else {
        int val = tdm__json_get(j, "val_loss") != NULL;
        r->evals[r->n_evals++] = (tdm__eval_rec){to_i64(num(j, "step"), 0), val, num(j, val ? "val_loss" : "test_loss"),
                                                 num(j, val ? "val_accuracy" : "test_accuracy"), NAN};
      }
    } else if (tdm__json_get(j, "memory_peak")) {
      const tdm_json *m = tdm__json_get(j, "memory_peak");
      for (int k = 0; k < TDM_MEM_COUNT; k++) {
        double v = num(m, tdm_mem_category_name((tdm_mem_category)k));
        r->mem_peak[k] = to_i64(v, -1);
      }
      double t = num(m, "total");
      r->mem_peak[TDM_MEM_COUNT] = to_i64(t, -1);
    } else if (tdm__json_get(j, "ps_server")) {
      tdm_json **p = realloc(r->ps, sizeof *p * (size_t)(r->n_ps + 1));
      if (!p) st = tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
      else (r->ps = p)[r->n_ps++] = j, j = NULL;
    }
    tdm__json_free(j);
  }
  free(line);
  if (st == TDM_OK && ferror(in)) st = tdm__set_error(TDM_ERR_IO, "report: reading %s: %s", name, strerror(errno));
  return st;
}

static int by_step(const void *a, const void *b) {
  const tdm__step_rec *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return x->attempt < y->attempt ? -1 : x->attempt > y->attempt; /* a restart's record after the earlier one */
}

static int eval_order(const void *a, const void *b) {
  const tdm__eval_rec *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return x->validation - y->validation;
}

/* One record per step (the latest attempt's), the training time summed in step order. */
static void settle(tdm__run *r, FILE *err) {
  if (r->n_steps > 1) qsort(r->steps, (size_t)r->n_steps, sizeof *r->steps, by_step); /* stable enough: attempts break ties */
  int w = 0;
  for (int i = 0; i < r->n_steps; i++) {
    if (w > 0 && r->steps[w - 1].step == r->steps[i].step) {
      free(r->steps[w - 1].rank_ms);
      r->steps[w - 1] = r->steps[i];
      r->replaced++;
      continue;
    }
    r->steps[w++] = r->steps[i];
  }
  r->n_steps = w;
  if (r->replaced) note(r, err, "%d step record%s of an earlier attempt replaced by the restarted attempt's", r->replaced, r->replaced == 1 ? "" : "s");
  double t = 0;
  for (int i = 0; i < r->n_steps; i++) {
    t += isfinite(r->steps[i].step_ms) ? r->steps[i].step_ms / 1e3 : 0;
    r->steps[i].time_s = t;
  }
  if (r->n_evals > 1) qsort(r->evals, (size_t)r->n_evals, sizeof *r->evals, eval_order);
  int k = 0;
  for (int i = 0; i < r->n_evals; i++) {
    while (k < r->n_steps && r->steps[k].step < r->evals[i].step) k++; /* evaluated after step k - 1 */
    r->evals[i].time_s = k > 0 ? r->steps[k - 1].time_s : 0;
  }
}

static tdm_status finish_docs(tdm__run *r, docs *d, tdm_status st) {
  if (st == TDM_OK && d->n > 0) {
    r->header_doc = d->docs[0];
    r->header_json = (tdm_json *)tdm__json_get(d->docs[0], "tandem_run");
    d->docs[0] = NULL;
  }
  for (int i = 0; i < d->n; i++) tdm__json_free(d->docs[i]);
  free(d->docs);
  d->docs = NULL, d->n = d->cap = 0;
  return st;
}

tdm_status tdm__run_parse(tdm__run *r, FILE *in, const char *name, FILE *err) {
  docs d = {0};
  tdm_status st = parse_stream(r, in, name, err, &d);
  st = finish_docs(r, &d, st);
  if (st == TDM_OK) settle(r, err);
  return st;
}

double tdm__run_mean(const tdm__run *r, size_t off) {
  double sum = 0;
  int n = 0;
  for (int i = r->n_steps > 1 ? 1 : 0; i < r->n_steps; i++) {
    double v = *(const double *)((const char *)&r->steps[i] + off);
    if (isfinite(v)) sum += v, n++;
  }
  return n ? sum / n : NAN;
}

/* ---- a directory --------------------------------------------------------------------------- */
static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

static int is_ps_file(const char *name) { /* METRICS.psK: the parameter servers' reports */
  const char *base = strrchr(name, '/'), *p = strrchr(base ? base : name, '.');
  if (!p || strncmp(p, ".ps", 3) || !p[3]) return 0;
  for (p += 3; *p; p++)
    if (*p < '0' || *p > '9') return 0;
  return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct {
  char **v;
  int n, cap;
} names;

static tdm_status list_dir(const char *dir, names *out, int want_dirs) {
  DIR *d = opendir(dir);
  if (!d) return tdm__set_error(TDM_ERR_IO, "report: cannot read the directory %s: %s", dir, strerror(errno));
  struct dirent *e;
  tdm_status st = TDM_OK;
  while (st == TDM_OK && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    struct stat sb;
    if (stat(path, &sb) != 0) continue;
    if (want_dirs ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode)) continue;
    if (grow((void **)&out->v, out->n, &out->cap, sizeof *out->v) || !(out->v[out->n] = strdup(path)))
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
    else out->n++;
  }
  closedir(d);
  if (out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_str);
  return st;
}

static void free_names(names *n) {
  for (int i = 0; i < n->n; i++) free(n->v[i]);
  free(n->v);
}

static tdm_status read_traces(tdm__run *r, names *files, FILE *err) {
  for (int i = 0; i < files->n; i++) {
    if (!ends_with(files->v[i], ".json")) continue;
    if (!r->trace && !(r->trace = calloc(1, sizeof *r->trace))) return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
    if (tdm__trace_add_file(r->trace, files->v[i]) != TDM_OK) note(r, err, "%s", tdm_last_error());
  }
  for (int k = 0; r->trace && k < r->trace->n_notes; k++) note(r, err, "%s", r->trace->notes[k]);
  if (r->trace && r->trace->unclosed > r->trace->unclosed_noted) /* the notes hold a few: the rest counted */
    note(r, err, "%d more trace files were not closed (their run stopped): each read up to its last whole event",
         r->trace->unclosed - r->trace->unclosed_noted);
  if (r->trace && r->trace->n_procs == 0) tdm__trace_free(r->trace), free(r->trace), r->trace = NULL;
  return TDM_OK;
}

tdm_status tdm__run_load(const char *path, FILE *err, tdm__run **out) {
  *out = NULL;
  struct stat sb;
  if (!path || !*path) return tdm__set_error(TDM_ERR_INVALID_ARG, "report: no run directory given");
  if (stat(path, &sb) != 0)
    return tdm__set_error(TDM_ERR_IO, "report: %s: %s; expected a run directory (holding the metrics file of tandem train "
                          "--metrics DIR/metrics.jsonl) or a metrics file", path, strerror(errno));
  tdm__run *r = tdm__run_new();
  if (!r) return tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
  snprintf(r->path, sizeof r->path, "%s", path);
  names files = {0}, dirs = {0}, metrics = {0}, ps = {0};
  tdm_status st = TDM_OK;
  if (S_ISDIR(sb.st_mode)) {
    st = list_dir(path, &files, 0);
    if (st == TDM_OK) st = list_dir(path, &dirs, 1);
    for (int i = 0; st == TDM_OK && i < dirs.n; i++) st = list_dir(dirs.v[i], &files, 0); /* a trace directory inside */
  } else if (S_ISREG(sb.st_mode)) {
    if (grow((void **)&files.v, 0, &files.cap, sizeof *files.v) || !(files.v[0] = strdup(path)))
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
    else files.n = 1;
  } else {
    st = tdm__set_error(TDM_ERR_IO, "report: %s is neither a directory nor a regular file", path);
  }
  for (int i = 0; st == TDM_OK && i < files.n; i++) {
    const char *f = files.v[i];
    int top = !S_ISDIR(sb.st_mode) || !strchr(f + strlen(path) + 1, '/');
    names *to = is_ps_file(f) ? &ps : top && !ends_with(f, ".json") && (ends_with(f, ".jsonl") || !S_ISDIR(sb.st_mode) || strstr(f + strlen(path), "metrics")) ? &metrics : NULL;
    if (!to) continue;
    if (grow((void **)&to->v, to->n, &to->cap, sizeof *to->v) || !(to->v[to->n] = strdup(f)))
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
    else to->n++;
  }
  if (st == TDM_OK && metrics.n == 0)
    st = tdm__set_error(TDM_ERR_IO, "report: %s holds no metrics file (*.jsonl: what tandem train --metrics writes)%s", path,
                        files.n == 0 ? "; the directory is empty" : "");
  /* each metrics file is one run: two files with steps are two runs */
  int with_steps = 0;
  char first_run[400] = "";
  for (int i = 0; st == TDM_OK && i < metrics.n; i++) {
    FILE *in = fopen(metrics.v[i], "r");
    if (!in) {
      st = tdm__set_error(TDM_ERR_IO, "report: cannot read %s: %s", metrics.v[i], strerror(errno));
      break;
    }
    tdm__run *one = tdm__run_new();
    if (!one) st = tdm__set_error(TDM_ERR_NO_MEMORY, "report: out of memory");
    else st = tdm__run_parse(one, in, metrics.v[i], err);
    fclose(in);
    if (st == TDM_OK && one->n_steps > 0 && with_steps++ > 0)
      st = tdm__set_error(TDM_ERR_MISMATCH, "report: %s holds the metrics of more than one run: %s and %s (run %s, config %s); "
                          "give one run's metrics file or directory", path, first_run, metrics.v[i],
                          one->n_headers ? one->headers[0].run_id : "(no header)", one->n_headers ? one->headers[0].config_hash : "?");
    if (st == TDM_OK && one->n_steps > 0) {
      snprintf(first_run, sizeof first_run, "%s (run %s, config %s)", metrics.v[i], one->n_headers ? one->headers[0].run_id : "(no header)",
               one->n_headers ? one->headers[0].config_hash : "?");
      tdm__run *keep = one;
      one = r; /* take over the parsed contents, keep the notes and the path */
      memcpy(keep->path, r->path, sizeof keep->path);
      snprintf(keep->metrics, sizeof keep->metrics, "%s", metrics.v[i]);
      int nn = r->n_notes;
      for (int k = 0; k < nn && keep->n_notes < 16; k++) memcpy(keep->notes[keep->n_notes++], r->notes[k], sizeof r->notes[0]);
      keep->skipped += r->skipped;
      r = keep;
    } else if (st == TDM_OK) { /* no steps: its notes count (a file of one truncated line) */
      for (int k = 0; k < one->n_notes && r->n_notes < 16; k++) memcpy(r->notes[r->n_notes++], one->notes[k], sizeof r->notes[0]);
      r->skipped += one->skipped;
    }
    tdm__run_free(one);
  }
  if (st == TDM_OK && with_steps == 0)
    st = tdm__set_error(TDM_ERR_FORMAT, "report: %s: no step records in %d metrics file%s%s (a run that stopped before its first "
                        "step, or not tandem train's metrics)", path, metrics.n, metrics.n == 1 ? "" : "s",
                        r->skipped ? ", only lines that were not whole records" : "");
  for (int i = 0; st == TDM_OK && i < ps.n; i++) { /* the parameter servers' reports */
    FILE *in = fopen(ps.v[i], "r");
    if (!in) continue;
    docs dd = {0};
    st = parse_stream(r, in, ps.v[i], err, &dd);
    for (int k = 0; k < dd.n; k++) tdm__json_free(dd.docs[k]);
    free(dd.docs);
    fclose(in);
  }
  if (st == TDM_OK) st = read_traces(r, &files, err);
  free_names(&files), free_names(&dirs), free_names(&metrics), free_names(&ps);
  if (st != TDM_OK) {
    tdm__run_free(r);
    return st;
  }
  *out = r;
  return TDM_OK;
}
