/* The span recorder (tandem/trace.h): a ring per thread, written as Chrome trace event JSON. */
#include "tandem/trace.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/internal.h"

int tdm__trace_flag;

enum { RING = 8192, SLOTS = 64 };

typedef struct {
  double t0, t1;
  const char *cat, *name;
  tdm_trace_args a;
  uint64_t async_id; /* 0: an "X" span on the thread's row */
} ev;

typedef struct tbuf {
  struct tbuf *next;
  int tid;
  const char *name;
  uint64_t head, tail; /* head: written by the thread; tail: by the flush (atomics) */
  uint64_t dropped;
  int rowed; /* its thread row (name, order) is in the file: written before its first events */
  ev ring[RING];
} tbuf;

struct tdm_trace {
  int slot, rank, world;
  uint64_t gen;
  pthread_mutex_t mu; /* the thread list, the file, the clock */
  tbuf *threads;
  int next_tid;
  FILE *f;
  char path[4200];
  int n_written, bad;
  uint64_t next_async;
  double clock[2][3]; /* at, offset, uncertainty (seconds) */
  int have_clock[2];
  char run[64]; /* which run wrote it ("" when unknown): merge refuses files of two runs */
};

/* The run this process belongs to, the same on all its ranks, from what the launcher set: tandem
 * run's job token (hashed: the token admits peers to the store) and attempt, else Slurm's job and
 * step, else Open MPI's PMIx namespace. "" when started by hand. */
static void run_id(char *out, size_t n) {
  const char *tok = getenv("TANDEM_JOB_TOKEN"), *att = getenv("TANDEM_RESTART_COUNT");
  const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID"), *ns = getenv("PMIX_NAMESPACE");
  out[0] = 0;
  if (tok && *tok) {
    snprintf(out, n, "job-%016llx.%.12s", (unsigned long long)tdm_hash64(tdm__hash_str(tok), 0), att && *att ? att : "0");
  } else if (job && *job)
    snprintf(out, n, "slurm-%.20s.%.12s", job, step && *step ? step : "0");
  else if (ns && *ns)
    snprintf(out, n, "pmix-%.40s", ns);
  for (char *c = out; *c; c++) /* written into JSON as is */
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 32) *c = '_';
}

/* Live recorders by slot; a thread keeps (slot, gen), so a closed recorder is seen as gone. */
static struct {
  tdm_trace *t;
  uint64_t gen;
} slots[SLOTS];
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t gen_counter;
static int default_slot = -1;
static uint64_t default_gen;

static _Thread_local struct {
  int slot; /* attached recorder: slot + 1 (0: the default) */
  uint64_t gen;
  tbuf *buf;
  uint64_t buf_gen; /* the recorder buf belongs to */
  const char *name;
} tl;

double tdm_trace_now(void) { return tdm_time_now(); }

static tdm_trace *live(int slot, uint64_t gen) {
  if (slot < 0 || slot >= SLOTS) return NULL;
  tdm_trace *t = __atomic_load_n(&slots[slot].t, __ATOMIC_ACQUIRE);
  return t && __atomic_load_n(&slots[slot].gen, __ATOMIC_ACQUIRE) == gen ? t : NULL;
}

static tdm_trace *mine(void) {
  if (tl.slot > 0) return live(tl.slot - 1, tl.gen);
  return live(__atomic_load_n(&default_slot, __ATOMIC_ACQUIRE), __atomic_load_n(&default_gen, __ATOMIC_ACQUIRE));
}

tdm_trace *tdm_trace_current(void) { return tdm_trace_on() ? mine() : NULL; }

void tdm_trace_attach(tdm_trace *t) {
  tl.slot = t ? t->slot + 1 : 0;
  tl.gen = t ? t->gen : 0;
  tl.buf = NULL;
}

void tdm_trace_name_thread(const char *name) { tl.name = name; }

/* The calling thread's ring in its recorder, made on its first span. */
static tbuf *ring_of(tdm_trace **tout) {
  tdm_trace *t = mine();
  if (!t) return NULL;
  *tout = t;
  if (tl.buf && tl.buf_gen == t->gen) return tl.buf;
  tbuf *b = tdm__malloc_cat(sizeof *b, TDM_MEM_WORKSPACE); /* not the category of whatever the thread does */
  if (!b) return NULL;
  memset(b, 0, sizeof *b);
  pthread_mutex_lock(&t->mu);
  b->tid = ++t->next_tid;
  b->name = tl.name;
  b->next = t->threads;
  t->threads = b;
  pthread_mutex_unlock(&t->mu);
  tl.buf = b, tl.buf_gen = t->gen;
  return b;
}

static void record(const char *cat, const char *name, double t0, double t1, const tdm_trace_args *a, int async) {
  if (!tdm_trace_on()) return;
  tdm_trace *t = NULL;
  tbuf *b = ring_of(&t);
  if (!b) return;
  uint64_t h = b->head, tail = __atomic_load_n(&b->tail, __ATOMIC_ACQUIRE);
  if (h - tail >= RING) {
    b->dropped++;
    return;
  }
  ev *e = &b->ring[h % RING];
  static const tdm_trace_args none = TDM_TRACE_ARGS_INIT;
  *e = (ev){t0, t1, cat, name, a ? *a : none, async ? __atomic_add_fetch(&t->next_async, 1, __ATOMIC_RELAXED) : 0};
  __atomic_store_n(&b->head, h + 1, __ATOMIC_RELEASE);
}

void tdm_trace_span(const char *cat, const char *name, double t0, double t1, const tdm_trace_args *a) {
  record(cat, name, t0, t1, a, 0);
}
void tdm_trace_async(const char *cat, const char *name, double t0, double t1, const tdm_trace_args *a) {
  record(cat, name, t0, t1, a, 1);
}

/* ---- writing ---------------------------------------------------------------------------------- */
static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

static void put_args(FILE *f, const tdm_trace_args *a) {
  const int64_t v[7] = {a->bytes, a->seq, a->step, a->index, a->ranks, a->comm, a->chunk};
  static const char *const k[7] = {"bytes", "seq", "step", "index", "ranks", "comm", "chunk"};
  fputs(",\"args\":{", f);
  int n = 0;
  for (int i = 0; i < 7; i++)
    if (v[i] != TDM_TRACE_NONE) fprintf(f, "%s\"%s\":%lld", n++ ? "," : "", k[i], (long long)v[i]);
  if (a->algo) {
    fprintf(f, "%s\"algo\":", n++ ? "," : "");
    put_str(f, a->algo);
  }
  fputc('}', f);
}

static void sep(tdm_trace *t) { fputs(t->n_written++ ? ",\n" : "\n", t->f); }

static void put_event(tdm_trace *t, int tid, const ev *e) {
  FILE *f = t->f;
  sep(t);
  if (!e->async_id) {
    fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":", t->rank, tid, e->t0 * 1e6,
            (e->t1 > e->t0 ? e->t1 - e->t0 : 0) * 1e6); /* an end given before its start: a point, not a file merge refuses */
  } else {
    fprintf(f, "{\"ph\":\"b\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"id\":\"0x%llx\",\"cat\":", t->rank, tid, e->t0 * 1e6,
            (unsigned long long)e->async_id);
  }
  put_str(f, e->cat);
  fputs(",\"name\":", f);
  put_str(f, e->name);
  put_args(f, &e->a);
  fputc('}', f);
  if (e->async_id) {
    sep(t);
    fprintf(f, "{\"ph\":\"e\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"id\":\"0x%llx\",\"cat\":", t->rank, tid, e->t1 * 1e6,
            (unsigned long long)e->async_id);
    put_str(f, e->cat);
    fputs(",\"name\":", f);
    put_str(f, e->name);
    fputc('}', f);
  }
}

/* The thread's row: its name (its role, or "thread N") and its place, before its first events, so
 * that a file its run never closes still names its rows. Under t->mu. */
static void put_row(tdm_trace *t, tbuf *b) {
  char nm[64];
  if (!b->name) snprintf(nm, sizeof nm, "thread %d", b->tid);
  sep(t);
  fprintf(t->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", t->rank, b->tid);
  put_str(t->f, b->name ? b->name : nm);
  fputs("}}", t->f);
  sep(t);
  fprintf(t->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}", t->rank, b->tid,
          b->tid);
  b->rowed = 1;
}

/* Under t->mu. */
static tdm_status flush_locked(tdm_trace *t) {
  if (!t->f) return TDM_OK;
  for (tbuf *b = t->threads; b; b = b->next) {
    uint64_t h = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE), k = b->tail;
    if (k < h && !b->rowed) put_row(t, b);
    for (; k < h; k++) put_event(t, b->tid, &b->ring[k % RING]);
    __atomic_store_n(&b->tail, k, __ATOMIC_RELEASE);
  }
  if (fflush(t->f) != 0 || ferror(t->f)) t->bad = 1;
  return t->bad ? tdm__set_error(TDM_ERR_IO, "trace: writing %s failed: %s", t->path, strerror(errno)) : TDM_OK;
}

tdm_status tdm_trace_flush(tdm_trace *t) {
  if (!t) return TDM_OK;
  pthread_mutex_lock(&t->mu);
  tdm_status st = flush_locked(t);
  pthread_mutex_unlock(&t->mu);
  return st;
}

tdm_status tdm_trace_flush_if_needed(tdm_trace *t) {
  if (!t) return TDM_OK;
  int full = 0;
  pthread_mutex_lock(&t->mu);
  for (tbuf *b = t->threads; b && !full; b = b->next)
    full = __atomic_load_n(&b->head, __ATOMIC_ACQUIRE) - b->tail >= RING / 2;
  tdm_status st = full ? flush_locked(t) : TDM_OK;
  pthread_mutex_unlock(&t->mu);
  return st;
}

tdm_status tdm_trace_set_clock(tdm_trace *t, int which, double at_s, double offset_s, double uncertainty_s) {
  if (!t || which < 0 || which > 1)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "trace: set_clock: which is %d; expected 0 (start) or 1 (end)", which);
  if (!isfinite(at_s) || !isfinite(offset_s) || !isfinite(uncertainty_s)) /* "nan" is no JSON: the merge could not read it */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "trace: set_clock: at %g s, offset %g s, uncertainty %g s; expected finite values",
                          at_s, offset_s, uncertainty_s);
  pthread_mutex_lock(&t->mu);
  t->clock[which][0] = at_s, t->clock[which][1] = offset_s, t->clock[which][2] = uncertainty_s;
  t->have_clock[which] = 1;
  tdm_status st = TDM_OK;
  if (t->f) { /* also in the file at once: a run that never closes it keeps its offsets */
    sep(t);
    fprintf(t->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"tandem_clock\",\"args\":{\"which\":\"%s\",\"at_us\":%.3f,"
            "\"offset_us\":%.3f,\"uncertainty_us\":%.3f}}", t->rank, which ? "end" : "start", at_s * 1e6, offset_s * 1e6,
            uncertainty_s * 1e6);
    st = flush_locked(t);
  }
  pthread_mutex_unlock(&t->mu);
  return st;
}

tdm_status tdm_trace_open(tdm_trace **out, const char *dir, int rank, int world) {
  if (!out || !dir || !*dir) return tdm__set_error(TDM_ERR_INVALID_ARG, "trace: no directory given");
  *out = NULL;
  if (rank < 0 || world < 1 || rank >= world)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "trace: rank %d of %d ranks; expected 0 <= rank < world", rank, world);
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
      return tdm__set_error(TDM_ERR_IO, "--trace %s: cannot create the directory: %s", dir, strerror(errno));
  } else if (!S_ISDIR(sb.st_mode)) {
    return tdm__set_error(TDM_ERR_IO, "--trace %s: exists and is not a directory; give a directory for the per-rank traces", dir);
  }
  tdm_trace *t = tdm__calloc(1, sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "trace: out of memory");
  snprintf(t->path, sizeof t->path, "%s/trace.rank%d.json", dir, rank);
  t->f = fopen(t->path, "w");
  if (!t->f) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "--trace %s: cannot write %s: %s", dir, t->path, strerror(errno));
    tdm__free(t);
    return st;
  }
  t->rank = rank, t->world = world;
  pthread_mutex_init(&t->mu, NULL);
  /* the process row and who wrote the file first, so that a file its run never closes still says
   * whose it is (tandem trace merge and tandem report read such files up to their last event) */
  fputs("{\"traceEvents\":[", t->f);
  sep(t);
  fprintf(t->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}}", rank, rank);
  sep(t);
  fprintf(t->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}", rank, rank);
  sep(t);
  run_id(t->run, sizeof t->run);
  fprintf(t->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"tandem_trace\",\"args\":{\"rank\":%d,\"world\":%d,\"run\":\"%s\"}}", rank,
          rank, world, t->run);
  if (fflush(t->f) != 0) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "--trace %s: cannot write %s: %s", dir, t->path, strerror(errno));
    fclose(t->f);
    pthread_mutex_destroy(&t->mu);
    tdm__free(t);
    return st;
  }
  pthread_mutex_lock(&slots_mu);
  int s = 0;
  while (s < SLOTS && slots[s].t) s++;
  if (s == SLOTS) {
    pthread_mutex_unlock(&slots_mu);
    fclose(t->f);
    remove(t->path);
    pthread_mutex_destroy(&t->mu);
    tdm__free(t);
    return tdm__set_error(TDM_ERR_INVALID_USAGE, "trace: %d recorders are open already in this process", SLOTS);
  }
  t->slot = s;
  t->gen = ++gen_counter;
  __atomic_store_n(&slots[s].gen, t->gen, __ATOMIC_RELEASE);
  __atomic_store_n(&slots[s].t, t, __ATOMIC_RELEASE);
  __atomic_store_n(&default_gen, t->gen, __ATOMIC_RELEASE);
  __atomic_store_n(&default_slot, s, __ATOMIC_RELEASE);
  __atomic_add_fetch(&tdm__trace_flag, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&slots_mu);
  tdm_trace_attach(t);
  *out = t;
  return TDM_OK;
}

tdm_status tdm_trace_close(tdm_trace *t) {
  if (!t) return TDM_OK;
  pthread_mutex_lock(&slots_mu);
  __atomic_store_n(&slots[t->slot].t, NULL, __ATOMIC_RELEASE);
  __atomic_store_n(&slots[t->slot].gen, 0, __ATOMIC_RELEASE);
  __atomic_sub_fetch(&tdm__trace_flag, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&slots_mu);
  pthread_mutex_lock(&t->mu);
  tdm_status st = flush_locked(t);
  FILE *f = t->f;
  uint64_t dropped = 0;
  for (tbuf *b = t->threads; b; b = b->next) dropped += b->dropped;
  /* the rows of threads that recorded nothing yet (the process's were written at the start) */
  for (tbuf *b = t->threads; b; b = b->next)
    if (!b->rowed) put_row(t, b);
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"format\":\"tandem-trace\",\"version\":1,\"rank\":%d,\"world\":%d,"
             "\"clock_unit\":\"us\",\"dropped\":%llu,\"run\":\"%s\"",
          t->rank, t->world, (unsigned long long)dropped, t->run);
  static const char *const which[2] = {"clock_start", "clock_end"};
  for (int k = 0; k < 2; k++)
    if (t->have_clock[k])
      fprintf(f, ",\"%s\":{\"at_us\":%.3f,\"offset_us\":%.3f,\"uncertainty_us\":%.3f}", which[k], t->clock[k][0] * 1e6,
              t->clock[k][1] * 1e6, t->clock[k][2] * 1e6);
  fputs("}}\n", f);
  if (ferror(f)) t->bad = 1;
  if (fclose(f) != 0) t->bad = 1;
  t->f = NULL;
  if (st == TDM_OK && t->bad) st = tdm__set_error(TDM_ERR_IO, "trace: writing %s failed", t->path);
  pthread_mutex_unlock(&t->mu);
  for (tbuf *b = t->threads, *n; b; b = n) {
    n = b->next;
    tdm__free(b);
  }
  pthread_mutex_destroy(&t->mu);
  if (tl.slot == t->slot + 1 && tl.gen == t->gen) tl.slot = 0, tl.buf = NULL;
  tdm__free(t);
  return st;
}
