/* The timeline recorder (tandem/trace.h): nothing recorded or allocated when off; spans, async
 * pairs, thread rows and arguments as written; the ring's bound (spans dropped and counted, or
 * flushed in time); bad directories refused; ranks as threads (each its own recorder): every
 * collective has a span with the same sequence number on every rank, the clock offsets of ranks
 * on one clock are zero within their stated uncertainty; the merge moves each rank's times by
 * its offsets (closed form), and refuses incomplete sets. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "core/file.h"
#include "core/internal.h"
#include "core/trace_read.h"
#include "tandem/tandem.h"
#include "tdm_test.h"

static char dir[256];

static tdm_json *load(const char *path) {
  unsigned char *text = NULL;
  int64_t n = 0;
  tdm_json *j = NULL;
  if (tdm__file_read(path, 1 << 30, "trace", &text, &n) != TDM_OK) return NULL;
  if (tdm__json_parse((const char *)text, (size_t)n, &j) != TDM_OK) j = NULL;
  tdm__free(text);
  return j;
}

static const char *str_of(const tdm_json *o, const char *k) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_STR ? v->str : "";
}
static double num_of(const tdm_json *o, const char *k) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_NUM ? v->num : NAN;
}
static int count_ph(const tdm_json *evs, const char *ph) {
  int n = 0;
  for (int i = 0; i < evs->n; i++) n += !strcmp(str_of(&evs->items[i], "ph"), ph);
  return n;
}

static void test_off_records_nothing(void) {
  CHECK(!tdm_trace_on());
  CHECK(tdm_trace_current() == NULL);
  CHECK(tdm_trace_begin() == 0);
  uint64_t a0 = tdm_alloc_count();
  tdm_trace_args a = TDM_TRACE_ARGS_INIT;
  for (int i = 0; i < 1000; i++) tdm_trace_span("compute", "forward", 1, 2, &a), tdm_trace_async("comm", "x", 1, 2, NULL);
  CHECK(tdm_alloc_count() == a0);
}

static void *comm_thread(void *arg) {
  tdm_trace_attach(arg);
  tdm_trace_name_thread("communication");
  for (int i = 0; i < 5; i++) {
    double t0 = tdm_trace_now();
    tdm_trace_args a = TDM_TRACE_ARGS_INIT;
    a.seq = i + 1, a.bytes = 4096, a.algo = "ring";
    tdm_trace_span("comm", "all-reduce", t0, tdm_trace_now(), &a);
  }
  return NULL;
}

static void test_spans_threads_args(void) {
  tdm_trace *t;
  /* the run id comes from the launcher's token, hashed (the token admits peers to the store) */
  setenv("TANDEM_JOB_TOKEN", "secret-token-1234", 1);
  setenv("TANDEM_RESTART_COUNT", "2", 1);
  CHECK_OK(tdm_trace_open(&t, dir, 1, 2));
  unsetenv("TANDEM_JOB_TOKEN");
  unsetenv("TANDEM_RESTART_COUNT");
  CHECK(tdm_trace_on() && tdm_trace_current() == t);
  tdm_trace_name_thread("training");
  double t0 = tdm_trace_begin();
  CHECK(t0 > 0);
  tdm_trace_args a = TDM_TRACE_ARGS_INIT;
  a.step = 7;
  tdm_trace_span("compute", "forward", t0, t0 + 1e-3, &a);
  tdm_trace_span("step", "step", t0, t0 + 2e-3, &a);
  tdm_trace_async("comm.async", "all-reduce", t0, t0 + 5e-3, NULL);
  pthread_t th;
  pthread_create(&th, NULL, comm_thread, t);
  pthread_join(th, NULL);
  CHECK_OK(tdm_trace_set_clock(t, 0, t0, 1e-6, 2e-6));
  CHECK_OK(tdm_trace_close(t));
  CHECK(!tdm_trace_on());
  char path[300];
  snprintf(path, sizeof path, "%s/trace.rank1.json", dir);
  tdm_json *j = load(path);
  CHECK_MSG(j != NULL, "%s is not valid JSON", path);
  if (!j) return;
  const tdm_json *evs = tdm__json_get(j, "traceEvents"), *other = tdm__json_get(j, "otherData");
  CHECK(evs && other);
  if (!evs || !other) return tdm__json_free(j);
  CHECK(count_ph(evs, "X") == 7 && count_ph(evs, "b") == 1 && count_ph(evs, "e") == 1);
  int names = 0, fwd = 0, ar = 0;
  for (int i = 0; i < evs->n; i++) {
    const tdm_json *e = &evs->items[i], *args = tdm__json_get(e, "args");
    CHECK(num_of(e, "pid") == 1);
    if (!strcmp(str_of(e, "name"), "thread_name"))
      names += !strcmp(str_of(args, "name"), "training") || !strcmp(str_of(args, "name"), "communication");
    if (!strcmp(str_of(e, "name"), "forward")) {
      fwd++;
      CHECK_NEAR(num_of(e, "ts"), t0 * 1e6, 1e-3);
      CHECK_NEAR(num_of(e, "dur"), 1e3, 1e-3);
      CHECK(num_of(args, "step") == 7 && !tdm__json_get(args, "bytes"));
    }
    if (!strcmp(str_of(e, "ph"), "X") && !strcmp(str_of(e, "name"), "all-reduce")) {
      ar++;
      CHECK(num_of(args, "bytes") == 4096 && num_of(args, "seq") == ar && !strcmp(str_of(args, "algo"), "ring"));
    }
  }
  CHECK(names == 2 && fwd == 1 && ar == 5);
  CHECK(num_of(other, "rank") == 1 && num_of(other, "world") == 2 && num_of(other, "dropped") == 0);
  const char *run = str_of(other, "run");
  CHECK_MSG(!strncmp(run, "job-", 4) && strlen(run) == 4 + 16 + 2 && !strcmp(run + strlen(run) - 2, ".2") && !strstr(run, "secret"),
            "otherData.run '%s'", run);
  CHECK_NEAR(num_of(tdm__json_get(other, "clock_start"), "offset_us"), 1, 1e-9);
  CHECK_NEAR(num_of(tdm__json_get(other, "clock_start"), "uncertainty_us"), 2, 1e-9);
  tdm__json_free(j);
}

/* The ring holds 8192 spans between flushes: more are dropped and counted, unless flushed. */
static void test_ring_bound(void) {
  for (int flush = 0; flush < 2; flush++) {
    tdm_trace *t;
    CHECK_OK(tdm_trace_open(&t, dir, 0, 1));
    int n = 0;
    for (int k = 0; k < 4; k++) {
      for (int i = 0; i < 2600; i++, n++) tdm_trace_span("compute", "op", 1e-3 * n, 1e-3 * n + 1e-4, NULL);
      if (flush) CHECK_OK(tdm_trace_flush_if_needed(t));
    }
    CHECK_OK(tdm_trace_close(t));
    char path[300];
    snprintf(path, sizeof path, "%s/trace.rank0.json", dir);
    tdm_json *j = load(path);
    CHECK(j != NULL);
    if (!j) return;
    int x = count_ph(tdm__json_get(j, "traceEvents"), "X");
    double dropped = num_of(tdm__json_get(j, "otherData"), "dropped");
    CHECK_MSG(flush ? (x == n && dropped == 0) : (x == 8192 && dropped == n - 8192), "flush %d: %d spans written, %g dropped of %d",
              flush, x, dropped, n);
    tdm__json_free(j);
  }
}

static void test_bad_dir(void) {
  char file[300], deep[300];
  snprintf(file, sizeof file, "%s/a-file", dir);
  FILE *f = fopen(file, "w");
  fclose(f);
  tdm_trace *t = (tdm_trace *)1;
  CHECK(tdm_trace_open(&t, file, 0, 1) == TDM_ERR_IO && t == NULL);
  CHECK_ERR_HAS("a-file: exists and is not a directory");
  snprintf(deep, sizeof deep, "%s/no/such/parent", dir);
  CHECK(tdm_trace_open(&t, deep, 0, 1) == TDM_ERR_IO);
  CHECK_ERR_HAS("no/such/parent: cannot create the directory");
  CHECK(tdm_trace_open(&t, "", 0, 1) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_trace_open(&t, dir, 2, 2) == TDM_ERR_INVALID_ARG);
  CHECK(!tdm_trace_on());
  remove(file);
}

/* ---- ranks as threads, each with its own recorder -------------------------------------------- */
enum { P = 3 };
typedef struct {
  int r;
  void *group;
  char sub[300];
} rank_arg;

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  tdm_comm_config cc = {0};
  cc.rank = a->r, cc.size = P, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
  tdm_trace *t = NULL;
  CHECK_OK(tdm_trace_open(&t, a->sub, a->r, P));
  tdm_trace_name_thread("training");
  tdm_comm_t c = NULL;
  CHECK_OK(tdm_comm_create(&c, &cc));
  if (!c) return NULL;
  double off, unc;
  CHECK_OK(tdm_comm_clock_offset(c, 8, &off, &unc));
  CHECK_OK(tdm_trace_set_clock(t, 0, tdm_time_now(), off, unc));
  /* one clock: the true offset is 0, so the estimate must be within its uncertainty of it */
  CHECK_MSG(fabs(off) <= unc, "rank %d: offset %.3g s, uncertainty %.3g s", a->r, off, unc);
  CHECK(a->r != 0 || (off == 0 && unc == 0));
  float buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = (float)i;
  CHECK_OK(tdm_comm_allreduce(c, buf, buf, 1000, TDM_F32, TDM_SUM, TDM_ALGO_RING));
  tdm_work_t w[3];
  for (int k = 0; k < 3; k++) CHECK_OK(tdm_comm_iallreduce(c, buf, buf, 100 + (size_t)k, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, &w[k]));
  for (int k = 0; k < 3; k++) CHECK_OK(tdm_work_wait(w[k]));
  CHECK_OK(tdm_comm_broadcast(c, buf, 10, TDM_F32, 1, TDM_ALGO_AUTO));
  CHECK_OK(tdm_comm_barrier(c));
  CHECK_OK(tdm_comm_clock_offset(c, 8, &off, &unc));
  CHECK_OK(tdm_trace_set_clock(t, 1, tdm_time_now(), off, unc));
  tdm_comm_destroy(c);
  CHECK_OK(tdm_trace_close(t));
  return NULL;
}

static void test_ranks_as_threads(void) {
  char sub[300];
  snprintf(sub, sizeof sub, "%s/ranks", dir);
  void *group;
  CHECK_OK(tdm_comm_thread_group_create(&group, P));
  pthread_t th[P];
  rank_arg args[P];
  for (int r = 0; r < P; r++) {
    args[r] = (rank_arg){.r = r, .group = group};
    snprintf(args[r].sub, sizeof args[r].sub, "%s", sub);
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(group);
  /* every rank: the same collectives, (name, seq, bytes, algo) for each, on its own rows */
  char sig[P][2048];
  for (int r = 0; r < P; r++) {
    char path[400];
    snprintf(path, sizeof path, "%s/trace.rank%d.json", sub, r);
    tdm_json *j = load(path);
    CHECK_MSG(j != NULL, "%s", path);
    sig[r][0] = 0;
    if (!j) continue;
    const tdm_json *evs = tdm__json_get(j, "traceEvents");
    int n = 0, comm_row = 0;
    for (int i = 0; i < evs->n; i++) {
      const tdm_json *e = &evs->items[i], *args = tdm__json_get(e, "args");
      CHECK(num_of(e, "pid") == r);
      if (!strcmp(str_of(e, "name"), "thread_name") && !strcmp(str_of(args, "name"), "communication")) comm_row = 1;
      if (strcmp(str_of(e, "cat"), "comm") || strcmp(str_of(e, "ph"), "X")) continue;
      char one[128];
      snprintf(one, sizeof one, "%s/%g/%g/%s;", str_of(e, "name"), num_of(args, "seq"), num_of(args, "bytes"), str_of(args, "algo"));
      strncat(sig[r], one, sizeof sig[r] - strlen(sig[r]) - 1);
      n++;
    }
    /* the allreduce, three queued, the broadcast, the barrier (the clock's messages are no collectives) */
    CHECK_MSG(n == 6, "rank %d: %d collective spans: %s", r, n, sig[r]);
    CHECK_MSG(comm_row, "rank %d has no communication row", r);
    tdm__json_free(j);
  }
  for (int r = 1; r < P; r++) CHECK_MSG(!strcmp(sig[r], sig[0]), "rank %d: %s\nrank 0: %s", r, sig[r], sig[0]);
  char out[400];
  snprintf(out, sizeof out, "%s/merged.json", dir);
  int ranks = 0;
  CHECK_OK(tdm_trace_merge(sub, out, &ranks, NULL));
  CHECK(ranks == P);
  tdm_json *m = load(out);
  CHECK(m != NULL);
  if (!m) return;
  int rows[P] = {0};
  const tdm_json *evs = tdm__json_get(m, "traceEvents");
  for (int i = 0; i < evs->n; i++) {
    const tdm_json *e = &evs->items[i];
    int pid = (int)num_of(e, "pid");
    if (!strcmp(str_of(e, "name"), "process_name") && pid >= 0 && pid < P) rows[pid]++;
    if (tdm__json_get(e, "ts")) CHECK(num_of(e, "ts") >= 0);
  }
  for (int r = 0; r < P; r++) CHECK_MSG(rows[r] == 1, "rank %d: %d process rows", r, rows[r]);
  const tdm_json *clk = tdm__json_get(tdm__json_get(m, "otherData"), "tandem_clock");
  CHECK(clk && clk->type == TDM_JSON_ARR && clk->n == P);
  tdm__json_free(m);
}

/* ---- merge: offsets applied, interpolated between start and end --------------------------------- */
static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

/* path written with text; the merge of sub refused with want, its message holding msg. */
static void merge_refuses(const char *sub, const char *out, const char *path, const char *text, tdm_status want, const char *msg) {
  write_file(path, text);
  CHECK(tdm_trace_merge(sub, out, NULL, NULL) == want);
  CHECK_MSG(strstr(tdm_last_error(), msg) != NULL, "error '%s' lacks '%s'", tdm_last_error(), msg);
}

static void test_merge_offsets(void) {
  char sub[300], p0[400], p1[400], out[400];
  snprintf(sub, sizeof sub, "%s/merge", dir);
  mkdir(sub, 0777);
  snprintf(p0, sizeof p0, "%s/trace.rank0.json", sub);
  snprintf(p1, sizeof p1, "%s/trace.rank1.json", sub);
  snprintf(out, sizeof out, "%s/out.json", dir);
  write_file(p0, "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1400,\"dur\":5,\"name\":\"a\"}],"
                 "\"otherData\":{\"format\":\"tandem-trace\",\"rank\":0,\"world\":2}}");
  /* rank 0's clock is 500 us ahead at local 1000 us, 700 ahead at 3000: 600 at 2000 */
  write_file(p1, "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":1000,\"dur\":5,\"name\":\"b\"},"
                 "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":2000,\"dur\":5,\"name\":\"c\"},"
                 "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":4000,\"dur\":5,\"name\":\"d\"}],"
                 "\"otherData\":{\"format\":\"tandem-trace\",\"rank\":1,\"world\":2,"
                 "\"clock_start\":{\"at_us\":1000,\"offset_us\":500,\"uncertainty_us\":3},"
                 "\"clock_end\":{\"at_us\":3000,\"offset_us\":700,\"uncertainty_us\":4}}}");
  CHECK_OK(tdm_trace_merge(sub, out, NULL, NULL));
  tdm_json *m = load(out);
  CHECK(m != NULL);
  if (!m) return;
  const tdm_json *evs = tdm__json_get(m, "traceEvents");
  /* the earliest, rank 0's a at 1400, is 0: b 1500, c 2600, d 4700 (held at the end's offset) */
  const char *names[4] = {"a", "b", "c", "d"};
  double want[4] = {0, 100, 1200, 3300};
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < evs->n; i++)
      if (!strcmp(str_of(&evs->items[i], "name"), names[k])) CHECK_NEAR(num_of(&evs->items[i], "ts"), want[k], 1e-6);
  CHECK(evs->n == 4);
  const tdm_json *other = tdm__json_get(m, "otherData");
  CHECK_NEAR(num_of(other, "t0_us"), 1400, 1e-9);
  const tdm_json *clk = tdm__json_get(other, "tandem_clock");
  CHECK(clk && clk->n == 2 && num_of(tdm__json_get(&clk->items[1], "end"), "uncertainty_us") == 4);
  tdm__json_free(m);

  /* refused, named: one rank in two files, a rank out of range or missing */
  char p01[400];
  snprintf(p01, sizeof p01, "%s/trace.rank01.json", sub);
  merge_refuses(sub, out, p01, "{\"traceEvents\":[],\"otherData\":{\"format\":\"tandem-trace\",\"rank\":1,\"world\":2}}",
                TDM_ERR_INVALID_ARG, "holds rank 1 twice");
  merge_refuses(sub, out, p01, "{\"traceEvents\":[],\"otherData\":{\"format\":\"tandem-trace\",\"rank\":4294967297,\"world\":2}}",
                TDM_ERR_FORMAT, "otherData.rank is 4.29497e+09; expected a whole number from 0");
  merge_refuses(sub, out, p01, "{\"traceEvents\":[],\"otherData\":{\"format\":\"tandem-trace\",\"world\":2}}", TDM_ERR_FORMAT,
                "lacks otherData.rank");
  remove(p01);
  /* files of two runs with the same world size: refused, naming both; a file with no run id (a
   * rank started by hand, an earlier version) merges with one that has */
  write_file(p0, "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1400,\"dur\":5,\"name\":\"a\"}],"
                 "\"otherData\":{\"format\":\"tandem-trace\",\"rank\":0,\"world\":2,\"run\":\"job-a.0\"}}");
  CHECK_OK(tdm_trace_merge(sub, out, NULL, NULL));
  merge_refuses(sub, out, p1, "{\"traceEvents\":[],\"otherData\":{\"format\":\"tandem-trace\",\"rank\":1,\"world\":2,\"run\":\"job-b.0\"}}",
                TDM_ERR_MISMATCH, "mixes runs: trace.rank0.json was written by run job-a.0, trace.rank1.json by run job-b.0");
  /* an event's time far outside a clock's would become time 0 for all: refused, naming it */
  merge_refuses(sub, out, p1, "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":-1e300,\"dur\":5,\"name\":\"b\"}],"
                "\"otherData\":{\"format\":\"tandem-trace\",\"rank\":1,\"world\":2}}",
                TDM_ERR_FORMAT, "trace.rank1.json: event 0's ts is -1e+300; expected microseconds from 0 to 1e15");
  merge_refuses(sub, out, p1, "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":10,\"dur\":\"5\",\"name\":\"b\"}],"
                "\"otherData\":{\"format\":\"tandem-trace\",\"rank\":1,\"world\":2}}",
                TDM_ERR_FORMAT, "event 0's dur is not a number");
  write_file(p1, "{\"traceEvents\":[],\"otherData\":{\"format\":\"tandem-trace\",\"rank\":1,\"world\":2}}");
  /* refused: a rank missing, a truncated file, no traces at all */
  remove(p0);
  CHECK(tdm_trace_merge(sub, out, NULL, NULL) != TDM_OK);
  CHECK_ERR_HAS("lacks the trace of rank 0");
  merge_refuses(sub, out, p0, "{\"traceEvents\":[{\"ph\":\"X\",\"pid\":0,", TDM_ERR_FORMAT, /* unclosed, from no recorder of ours */
                "trace.rank0.json was not closed by its run, and lacks the tandem_trace event");
  merge_refuses(sub, out, p0, "not JSON at all", TDM_ERR_FORMAT, "trace.rank0.json is not a trace");
  remove(p0);
  remove(p1);
  CHECK(tdm_trace_merge(sub, out, NULL, NULL) != TDM_OK);
  CHECK_ERR_HAS("holds no trace.rank<R>.json files");
  rmdir(sub);
  remove(out);
}

/* ---- a trace its run never closed ------------------------------------------------------------
 * A killed rank leaves its file as last flushed: the header, the spans flushed so far, the clock
 * offsets measured; or cut inside an event, where stdio flushed a full buffer part-way. The merge
 * takes every whole event, moves it by the offsets the file holds, and lists the rank as
 * unclosed with where its last event ends; tandem report's reader takes the same events. */
static char *slurp(const char *path, int64_t *n) {
  unsigned char *t = NULL;
  return tdm__file_read(path, 1 << 30, "trace", &t, n) == TDM_OK ? (char *)t : NULL;
}

static void test_unclosed(void) {
  char sub[300], out[400], p1[400];
  snprintf(sub, sizeof sub, "%s/unclosed", dir);
  snprintf(out, sizeof out, "%s/unclosed.json", dir);
  snprintf(p1, sizeof p1, "%s/trace.rank1.json", sub);
  /* rank 0 closes its trace; rank 1 records two spans, its start offset (rank 0's clock 250 us
   * ahead), flushes, then a third span that is never flushed, and is killed */
  tdm_trace *t0 = NULL, *t1 = NULL;
  CHECK_OK(tdm_trace_open(&t0, sub, 0, 2));
  tdm_trace_span("compute", "forward", 0.010, 0.011, NULL);
  CHECK_OK(tdm_trace_close(t0));
  CHECK_OK(tdm_trace_open(&t1, sub, 1, 2));
  CHECK_OK(tdm_trace_set_clock(t1, 0, 0.009, 250e-6, 2e-6));
  tdm_trace_span("compute", "forward", 0.010, 0.012, NULL);
  tdm_trace_span("compute", "backward", 0.012, 0.015, NULL);
  CHECK_OK(tdm_trace_flush(t1));
  int64_t n = 0;
  char *flushed = slurp(p1, &n);
  CHECK(flushed != NULL);
  tdm_trace_span("compute", "optimizer", 0.015, 0.016, NULL);
  CHECK_OK(tdm_trace_close(t1));
  tdm_trace_attach(NULL);
  if (!flushed) return;
  /* as flushed (ends after an event), and cut 9 bytes into... the last event (a part-way flush) */
  for (int cut = 0; cut < 2; cut++) {
    FILE *f = fopen(p1, "w");
    fwrite(flushed, 1, (size_t)(n - (cut ? 9 : 0)), f);
    fclose(f);
    int ranks = 0, unclosed = 0;
    CHECK_OK(tdm_trace_merge(sub, out, &ranks, &unclosed));
    CHECK(ranks == 2 && unclosed == 1);
    tdm_json *m = load(out);
    CHECK(m != NULL);
    if (!m) break;
    const tdm_json *evs = tdm__json_get(m, "traceEvents");
    double fwd1 = NAN, bwd1 = NAN, fwd0 = NAN;
    int opt = 0, row1 = 0;
    for (int i = 0; i < evs->n; i++) {
      const tdm_json *e = &evs->items[i];
      if (num_of(e, "pid") == 1 && !strcmp(str_of(e, "name"), "forward")) fwd1 = num_of(e, "ts");
      if (num_of(e, "pid") == 1 && !strcmp(str_of(e, "name"), "backward")) bwd1 = num_of(e, "ts");
      if (num_of(e, "pid") == 0 && !strcmp(str_of(e, "name"), "forward")) fwd0 = num_of(e, "ts");
      opt += !strcmp(str_of(e, "name"), "optimizer");
      row1 += num_of(e, "pid") == 1 && !strcmp(str_of(e, "name"), "thread_name"); /* written at its first flush */
    }
    /* rank 0's forward at 10,000 us is time 0; rank 1's, at local 10,000 us, is 250 us later on
     * rank 0's clock; the unflushed optimizer is lost, and the cut one loses backward too */
    CHECK_NEAR(fwd0, 0, 1e-6);
    CHECK_NEAR(fwd1, 250, 1e-6);
    CHECK(opt == 0 && row1 == 1);
    if (cut) CHECK_MSG(isnan(bwd1), "the cut event was read: %g", bwd1);
    else CHECK_NEAR(bwd1, 2250, 1e-6);
    const tdm_json *uc = tdm__json_get(tdm__json_get(m, "otherData"), "unclosed");
    CHECK(uc && uc->type == TDM_JSON_ARR && uc->n == 1);
    if (uc && uc->n == 1) {
      CHECK(num_of(&uc->items[0], "rank") == 1);
      CHECK_NEAR(num_of(&uc->items[0], "last_us"), cut ? 2250 : 5250, 1e-6);
    }
    tdm_json *doc = NULL;
    int open_one = 0;
    CHECK_OK(tdm__trace_read(p1, 1 << 30, &doc, &open_one));
    /* the process's 3 metadata events and the clock, the thread's row (2), the spans */
    CHECK(open_one == 1 && doc && tdm__json_get(doc, "traceEvents")->n == (cut ? 7 : 8));
    tdm__json_free(doc);
    tdm__json_free(m);
  }
  tdm__free(flushed);
  /* killed before any span was flushed: listed, with no last event (null, not 0) */
  FILE *f = fopen(p1, "w");
  fputs("{\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"tandem_trace\",\"args\":{\"rank\":1,\"world\":2}}", f);
  fclose(f);
  int unclosed = 0;
  CHECK_OK(tdm_trace_merge(sub, out, NULL, &unclosed));
  tdm_json *m = load(out);
  const tdm_json *uc = m ? tdm__json_get(tdm__json_get(m, "otherData"), "unclosed") : NULL;
  CHECK(unclosed == 1 && uc && uc->type == TDM_JSON_ARR && uc->n == 1);
  if (uc && uc->n == 1) CHECK(tdm__json_get(&uc->items[0], "last_us") && tdm__json_get(&uc->items[0], "last_us")->type == TDM_JSON_NULL);
  tdm__json_free(m);
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", sub, out);
  CHECK(system(cmd) == 0);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/tandem-trace-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  tdm_test_case cases[] = {
      {"off_records_nothing", test_off_records_nothing},
      {"spans_threads_args", test_spans_threads_args},
      {"ring_bound", test_ring_bound},
      {"bad_dir", test_bad_dir},
      {"ranks_as_threads", test_ranks_as_threads},
      {"merge_offsets", test_merge_offsets},
      {"unclosed", test_unclosed},
  };
  int rc = tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}
