/* tandem trace merge: the ranks' trace files as one, each rank's clock moved onto rank 0's. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/internal.h"
#include "core/json.h"
#include "core/trace_read.h"
#include "tandem/trace.h"

typedef struct {
  int rank, world;
  tdm_json *doc;
  const tdm_json *events;
  double at[2], off[2], unc[2]; /* microseconds */
  int have[2];
  int unclosed; /* its run never closed the file: read up to its last whole event */
  char file[256]; /* its name in the directory */
  char run[64];   /* the run that wrote it ("": not recorded, by hand or an earlier version) */
} rank_trace;

static void run_of(const tdm_json *o, rank_trace *r) {
  const tdm_json *v = o ? tdm__json_get(o, "run") : NULL;
  if (v && v->type == TDM_JSON_STR) snprintf(r->run, sizeof r->run, "%s", v->str);
}

static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static void put_value(FILE *f, const tdm_json *v) {
  switch (v->type) {
  case TDM_JSON_NULL: fputs("null", f); break;
  case TDM_JSON_BOOL: fputs(v->num != 0 ? "true" : "false", f); break;
  case TDM_JSON_NUM:
    if (v->is_int) fprintf(f, "%lld", (long long)v->inum);
    else fprintf(f, "%.17g", v->num);
    break;
  case TDM_JSON_STR: put_str(f, v->str); break;
  case TDM_JSON_ARR:
    fputc('[', f);
    for (int i = 0; i < v->n; i++) {
      if (i) fputc(',', f);
      put_value(f, &v->items[i]);
    }
    fputc(']', f);
    break;
  case TDM_JSON_OBJ:
    fputc('{', f);
    for (int i = 0; i < v->n; i++) {
      if (i) fputc(',', f);
      put_str(f, v->keys[i]);
      fputc(':', f);
      put_value(f, &v->items[i]);
    }
    fputc('}', f);
    break;
  }
}

static double num_of(const tdm_json *o, const char *key, int *ok) {
  const tdm_json *v = o ? tdm__json_get(o, key) : NULL;
  if (!v || v->type != TDM_JSON_NUM) {
    *ok = 0;
    return 0;
  }
  return v->num;
}

/* Rank 0's clock at local time ts (us): the offsets measured at the start and the end, linear
 * between them (drift), held outside. */
static double offset_at(const rank_trace *r, double ts) {
  if (r->have[0] && r->have[1] && r->at[1] > r->at[0]) {
    double u = (ts - r->at[0]) / (r->at[1] - r->at[0]);
    u = u < 0 ? 0 : u > 1 ? 1 : u;
    return r->off[0] + u * (r->off[1] - r->off[0]);
  }
  return r->have[0] ? r->off[0] : r->have[1] ? r->off[1] : 0;
}

/* A rank or world size of the file: a whole number in range (a cast of any other would be undefined). */
static tdm_status whole(const tdm_json *o, const char *key, const char *path, const char *where, int lo, int *out) {
  const tdm_json *v = o ? tdm__json_get(o, key) : NULL;
  if (!v || v->type != TDM_JSON_NUM)
    return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s lacks %s.%s (a number)", path, where, key);
  if (!(v->num >= lo && v->num <= 1e9) || v->num != (double)(int)v->num)
    return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s: %s.%s is %g; expected a whole number from %d", path, where, key, v->num, lo);
  *out = (int)v->num;
  return TDM_OK;
}

/* A clock measurement {at_us, offset_us, uncertainty_us} into slot k. */
static tdm_status clock_of(const tdm_json *c, const char *path, const char *what, rank_trace *r, int k) {
  int ok = 1;
  r->at[k] = num_of(c, "at_us", &ok), r->off[k] = num_of(c, "offset_us", &ok), r->unc[k] = num_of(c, "uncertainty_us", &ok);
  if (!ok) return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s: %s lacks at_us, offset_us or uncertainty_us", path, what);
  r->have[k] = 1;
  return TDM_OK;
}

/* A closed trace says who wrote it and its clock in otherData; one its run never closed (read up
 * to its last whole event) in the metadata events the recorder writes as it goes: tandem_trace
 * (rank, world) at the start, tandem_clock with each offset measured. */
static tdm_status load(const char *path, int rank, rank_trace *r) {
  int unclosed = 0;
  tdm_status st = tdm__trace_read(path, (int64_t)1 << 34, &r->doc, &unclosed);
  if (st != TDM_OK)
    return st == TDM_ERR_FORMAT ? tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s is not a trace (%s)", path, tdm_last_error()) : st;
  r->unclosed = unclosed;
  r->events = tdm__json_get(r->doc, "traceEvents");
  if (!r->events || r->events->type != TDM_JSON_ARR)
    return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s is not a tandem trace (no traceEvents array)", path);
  const tdm_json *other = tdm__json_get(r->doc, "otherData"), *fmt = other ? tdm__json_get(other, "format") : NULL;
  if (!unclosed) {
    if (!fmt || fmt->type != TDM_JSON_STR || strcmp(fmt->str, "tandem-trace") != 0)
      return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s is not a tandem trace (otherData.format is not \"tandem-trace\")", path);
    TDM__TRY(whole(other, "rank", path, "otherData", 0, &r->rank));
    TDM__TRY(whole(other, "world", path, "otherData", 1, &r->world));
    run_of(other, r);
    static const char *const which[2] = {"clock_start", "clock_end"};
    for (int k = 0; k < 2; k++) {
      const tdm_json *c = tdm__json_get(other, which[k]);
      char what[40];
      snprintf(what, sizeof what, "otherData.%s", which[k]);
      if (c) TDM__TRY(clock_of(c, path, what, r, k));
    }
  } else {
    int found = 0;
    for (int i = 0; i < r->events->n; i++) {
      const tdm_json *e = &r->events->items[i], *nm = tdm__json_get(e, "name"), *args = tdm__json_get(e, "args");
      if (!nm || nm->type != TDM_JSON_STR || !args) continue;
      if (!strcmp(nm->str, "tandem_trace")) {
        TDM__TRY(whole(args, "rank", path, "the tandem_trace event's args", 0, &r->rank));
        TDM__TRY(whole(args, "world", path, "the tandem_trace event's args", 1, &r->world));
        run_of(args, r);
        found = 1;
      } else if (!strcmp(nm->str, "tandem_clock")) {
        const tdm_json *w = tdm__json_get(args, "which");
        int k = w && w->type == TDM_JSON_STR && !strcmp(w->str, "end");
        TDM__TRY(clock_of(args, path, "a tandem_clock event", r, k));
      }
    }
    if (!found)
      return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s was not closed by its run, and lacks the tandem_trace event that would say "
                            "whose it is (written by an earlier version?)", path);
  }
  if (r->rank != rank)
    return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s says it is rank %d; its name says rank %d", path, r->rank, rank);
  /* times are microseconds of a monotonic clock: one far outside would become every rank's time 0
   * (the earliest event) and push the rest out of sight */
  for (int i = 0; i < r->events->n; i++) {
    static const char *const keys[2] = {"ts", "dur"};
    for (int k = 0; k < 2; k++) {
      const tdm_json *v = tdm__json_get(&r->events->items[i], keys[k]);
      if (v && v->type != TDM_JSON_NUM)
        return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s: event %d's %s is not a number; expected microseconds", path, i, keys[k]);
      if (v && !(v->num >= 0 && v->num < 1e15))
        return tdm__set_error(TDM_ERR_FORMAT, "trace merge: %s: event %d's %s is %.6g; expected microseconds from 0 to 1e15", path, i,
                              keys[k], v->num);
    }
  }
  return TDM_OK;
}

static int by_rank(const void *a, const void *b) { return ((const rank_trace *)a)->rank - ((const rank_trace *)b)->rank; }

static tdm_status merge(const char *dir, const char *out, rank_trace *rs, int *nr, int cap) {
  DIR *d = opendir(dir);
  if (!d) return tdm__set_error(TDM_ERR_IO, "trace merge: cannot read the directory %s: %s", dir, strerror(errno));
  struct dirent *de;
  tdm_status st = TDM_OK;
  struct stat os;
  int out_exists = stat(out, &os) == 0;
  while (st == TDM_OK && (de = readdir(d))) {
    int rank, len = 0;
    char digits[16] = "";
    if (sscanf(de->d_name, "trace.rank%15[0-9].json%n", digits, &len) != 1 || len != (int)strlen(de->d_name)) continue;
    long r = strtol(digits, NULL, 10); /* (%d overflowed: rank99999999999 read as 1215752191) */
    if (strlen(digits) > 9 || r >= cap) {
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: %s/%s: rank %s is out of range (at most %d ranks)", dir, de->d_name,
                          digits, cap);
      break;
    }
    rank = (int)r;
    if (*nr == cap) {
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: %s holds more than %d rank traces", dir, cap);
      break;
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    struct stat is;
    if (out_exists && stat(path, &is) == 0 && is.st_dev == os.st_dev && is.st_ino == os.st_ino) {
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: the output %s is one of the inputs (%s); expected another file", out, path);
      break;
    }
    snprintf(rs[*nr].file, sizeof rs[*nr].file, "%s", de->d_name);
    st = load(path, rank, &rs[(*nr)++]);
  }
  closedir(d);
  TDM__TRY(st);
  if (*nr == 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: %s holds no trace.rank<R>.json files (written by --trace %s)", dir, dir);
  qsort(rs, (size_t)*nr, sizeof *rs, by_rank);
  for (int i = 1; i < *nr; i++) /* trace.rank1.json and trace.rank01.json */
    if (rs[i].rank == rs[i - 1].rank)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: %s holds rank %d twice: %s and %s", dir, rs[i].rank, rs[i - 1].file,
                            rs[i].file);
  int W = rs[0].world;
  for (int i = 0; i < *nr; i++) {
    if (rs[i].world != W)
      return tdm__set_error(TDM_ERR_MISMATCH, "trace merge: %s mixes runs: rank %d was one of %d ranks, rank %d one of %d", dir,
                            rs[0].rank, W, rs[i].rank, rs[i].world);
    if (rs[i].rank != i)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: %s lacks the trace of rank %d (of %d ranks)", dir, i, W);
  }
  if (*nr != W) return tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: %s holds %d of the %d ranks' traces", dir, *nr, W);
  /* the same world size is not the same run: a rank's file left from an earlier run in the same
   * directory (that rank failed to start this time) would merge silently */
  for (int i = 0, k = -1; i < *nr; i++) {
    if (!rs[i].run[0]) continue;
    if (k >= 0 && strcmp(rs[i].run, rs[k].run) != 0)
      return tdm__set_error(TDM_ERR_MISMATCH, "trace merge: %s mixes runs: %s was written by run %s, %s by run %s (a file left "
                            "from an earlier run? trace each run into a directory of its own)", dir, rs[k].file, rs[k].run,
                            rs[i].file, rs[i].run);
    if (k < 0) k = i;
  }
  /* the earliest event, on rank 0's clock, becomes time 0 */
  double base = 0;
  int any = 0;
  for (int i = 0; i < *nr; i++)
    for (int k = 0; k < rs[i].events->n; k++) {
      const tdm_json *ts = tdm__json_get(&rs[i].events->items[k], "ts");
      if (!ts || ts->type != TDM_JSON_NUM) continue;
      double t = ts->num + offset_at(&rs[i], ts->num);
      if (!any || t < base) base = t, any = 1;
    }
  /* made in memory, then written beside OUT and renamed over it: a failed merge leaves no half file */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return tdm__set_error(TDM_ERR_NO_MEMORY, "trace merge: out of memory");
  fputs("{\"traceEvents\":[", f);
  int first = 1;
  for (int i = 0; i < *nr; i++)
    for (int k = 0; k < rs[i].events->n; k++) {
      const tdm_json *e = &rs[i].events->items[k];
      if (e->type != TDM_JSON_OBJ) continue;
      fputs(first ? "\n{" : ",\n{", f);
      first = 0;
      for (int j = 0; j < e->n; j++) {
        if (j) fputc(',', f);
        put_str(f, e->keys[j]);
        fputc(':', f);
        if (!strcmp(e->keys[j], "ts") && e->items[j].type == TDM_JSON_NUM)
          fprintf(f, "%.3f", e->items[j].num + offset_at(&rs[i], e->items[j].num) - base);
        else put_value(f, &e->items[j]);
      }
      fputc('}', f);
    }
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"format\":\"tandem-trace-merged\",\"version\":1,\"world\":%d,"
             "\"t0_us\":%.3f,\"tandem_clock\":[",
          W, base);
  const char *run = "";
  for (int i = 0; i < *nr && !run[0]; i++) run = rs[i].run;
  for (int i = 0; i < *nr; i++) {
    fprintf(f, "%s{\"rank\":%d", i ? "," : "", i);
    static const char *const which[2] = {"start", "end"};
    for (int k = 0; k < 2; k++)
      if (rs[i].have[k])
        fprintf(f, ",\"%s\":{\"at_us\":%.3f,\"offset_us\":%.3f,\"uncertainty_us\":%.3f}", which[k], rs[i].at[k], rs[i].off[k],
                rs[i].unc[k]);
    fputc('}', f);
  }
  /* ranks whose runs never closed their files, and where (on the merged clock) each one's last
   * event ends: a rank that stopped long before the others is where to look */
  fputs("],\"unclosed\":[", f);
  for (int i = 0, k = 0; i < *nr; i++) {
    if (!rs[i].unclosed) continue;
    double last = 0;
    int timed = 0;
    for (int j = 0; j < rs[i].events->n; j++) {
      int ok = 1, has_dur = 1;
      double ts = num_of(&rs[i].events->items[j], "ts", &ok), dur = num_of(&rs[i].events->items[j], "dur", &has_dur);
      if (!ok) continue; /* metadata */
      double end = ts + offset_at(&rs[i], ts) - base + (has_dur ? dur : 0);
      if (!timed++ || end > last) last = end;
    }
    if (timed) fprintf(f, "%s{\"rank\":%d,\"last_us\":%.3f}", k++ ? "," : "", i, last);
    else fprintf(f, "%s{\"rank\":%d,\"last_us\":null}", k++ ? "," : "", i); /* it stopped before any event was flushed */
  }
  fputs("],\"run\":", f);
  put_str(f, run);
  fputs("}}\n", f);
  int bad = ferror(f) != 0;
  if (fclose(f) != 0) bad = 1;
  if (bad) {
    free(buf);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "trace merge: out of memory making %s", out);
  }
  tdm__wfile w;
  st = tdm__wfile_open(&w, out);
  if (st == TDM_OK) st = tdm__wfile_write(&w, buf, len) == TDM_OK ? tdm__wfile_commit(&w) : tdm__wfile_abort(&w);
  free(buf);
  if (st != TDM_OK) {
    char why[600];
    snprintf(why, sizeof why, "%s", tdm_last_error());
    return tdm__set_error(st, "trace merge: %s", why);
  }
  return TDM_OK;
}

tdm_status tdm_trace_merge(const char *dir, const char *out, int *ranks, int *unclosed) {
  if (!dir || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "trace merge: NULL argument");
  enum { CAP = 4096 };
  rank_trace *rs = tdm__calloc(CAP, sizeof *rs);
  if (!rs) return tdm__set_error(TDM_ERR_NO_MEMORY, "trace merge: out of memory");
  int nr = 0;
  tdm_status st = merge(dir, out, rs, &nr, CAP);
  int open_ones = 0;
  for (int i = 0; i < nr; i++) open_ones += rs[i].unclosed, tdm__json_free(rs[i].doc);
  tdm__free(rs);
  if (st == TDM_OK && ranks) *ranks = nr;
  if (st == TDM_OK && unclosed) *unclosed = open_ones;
  return st;
}
