/* The report's reader and plotter (src/report/): metrics streams with truncated lines, runs mixed
 * in a file or a directory, restarts and resumes, per-rank times, traces with nested and
 * overlapping spans, ticks and bar geometry. */
#define _GNU_SOURCE
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report/run.h"
#include "report/svg.h"
#include "report/trace.h"
#include "tdm_test.h"

static char tmp_root[256];

static const char *tmp_path(const char *name) {
  static char b[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(b[k], sizeof b[k], "%s/%s", tmp_root, name);
  return b[k];
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

#define HDR(id, hash, job, attempt, resumed, seed)                                                                             \
  "{\"tandem_run\":{\"run_id\":\"" id "\",\"config_hash\":\"" hash "\",\"job\":\"" job "\",\"attempt\":" #attempt            \
  ",\"resumed_from\":" #resumed ",\"start_step\":0,\"started\":\"2026-01-01T00:00:00Z\",\"config\":{\"model\":\"mlp\","       \
  "\"data\":\"synthetic\"},\"identity\":{\"tandem.model\":\"mlp\",\"tandem.seed\":\"" seed "\"},\"plan\":{\"parameters\":1048576,"  \
  "\"total\":2097152},\"env\":{\"host\":\"h\"}}}\n"
#define STEP(s, ms)                                                                                                            \
  "{\"step\":" #s ",\"epoch\":0,\"loss\":2.5,\"grad_norm\":1,\"samples_per_sec\":100,\"step_time_ms\":" #ms                 \
  ",\"time_forward_ms\":1,\"time_backward_ms\":2,\"time_comm_wait_ms\":3,\"time_optimizer_ms\":0.5,\"lr\":0.001,\"rank\":0,"  \
  "\"world_size\":2,\"global_batch\":64,\"train_accuracy\":0.5,\"rank_step_ms\":[" #ms ",9],\"rank_forward_ms\":[1,1],"      \
  "\"rank_backward_ms\":[2,2],\"rank_comm_wait_ms\":[3,4],\"rank_optimizer_ms\":[0.5,0.5],\"slowest_rank\":1}\n"

static tdm_status parse_text(const char *text, tdm__run **out) {
  *out = tdm__run_new();
  FILE *f = fmemopen((void *)text, strlen(text), "r");
  tdm_status st = tdm__run_parse(*out, f, "m.jsonl", NULL);
  fclose(f);
  return st;
}

static void test_truncated_line(void) {
  const char *text = HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10) "{\"step\":1,\"epoch\":0,\"loss\":2.4,\"samp\n" STEP(2, 20)
      "{\"epoch\":1,\"step\":3,\"test_loss\":1.5,\"test_accuracy\":0.6,\"world_size\":2}\n"
      "{\"step\":3,\"world_size\":2,\"memory_peak\":{\"parameters\":1048576,\"gradients\":5,\"total\":3145728}}\n"
      "{\"step\":4,\"loss\":";
  tdm__run *r;
  CHECK_OK(parse_text(text, &r));
  CHECK(r->n_steps == 2 && r->skipped == 2);
  CHECK(r->n_steps == 2 && r->steps[0].step == 0 && r->steps[1].step == 2);
  CHECK_NEAR(r->steps[1].time_s, 0.030, 1e-12); /* 10 ms + 20 ms */
  int saw3 = 0, saw7 = 0;
  for (int i = 0; i < r->n_notes; i++) saw3 |= strstr(r->notes[i], "m.jsonl:3: skipped") != NULL, saw7 |= strstr(r->notes[i], "m.jsonl:7") != NULL;
  CHECK_MSG(saw3 && saw7, "notes: %s / %s", r->n_notes ? r->notes[0] : "", r->n_notes > 1 ? r->notes[1] : "");
  CHECK(r->n_evals == 1 && r->evals[0].step == 3 && !r->evals[0].validation);
  CHECK_NEAR(r->evals[0].loss, 1.5, 0);
  CHECK_NEAR(r->evals[0].time_s, 0.030, 1e-12);
  CHECK(r->mem_peak[TDM_MEM_PARAMS] == 1048576 && r->mem_peak[TDM_MEM_GRADS] == 5 && r->mem_peak[TDM_MEM_COUNT] == 3145728);
  CHECK(r->mem_peak[TDM_MEM_OPTIM] == -1); /* not in the record */
  /* per-rank times and the slowest rank */
  CHECK(r->steps[0].n_ranks == 2 && r->steps[0].slowest == 1);
  CHECK_NEAR(r->steps[0].rank_ms[1 * TDM__RT_COUNT + TDM__RT_WAIT], 4, 0);
  CHECK_NEAR(r->steps[0].rank_ms[0 * TDM__RT_COUNT + TDM__RT_STEP], 10, 0);
  const tdm_json *m = tdm__run_header_get(r, "config", "model");
  CHECK(m && m->type == TDM_JSON_STR && !strcmp(m->str, "mlp"));
  /* the page says what was skipped */
  char *page = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&page, &len);
  CHECK_OK(tdm__report_html(f, r));
  fclose(f);
  CHECK(page && strstr(page, "2 lines skipped") && strstr(page, "m.jsonl:3: skipped"));
  CHECK(page && strstr(page, "<svg") && strstr(page, "class=\"axis-label x\"") && !strstr(page, "<script"));
  free(page);
  tdm__run_free(r);
}

/* One process: no per-rank arrays; the page shows rank 0 from its own fields (before the fix,
 * the slowest-rank count was indexed by -1: found by fuzz_metrics). */
static void test_one_rank(void) {
  tdm__run *r;
  CHECK_OK(parse_text(HDR("aaaa", "h1", "0000000000000000", 0, -1, "1")
                      "{\"step\":0,\"loss\":2,\"step_time_ms\":4,\"time_forward_ms\":1,\"time_backward_ms\":2,\"time_comm_wait_ms\":0,\"time_optimizer_ms\":0.5}\n"
                      "{\"step\":1,\"loss\":1,\"step_time_ms\":6,\"time_forward_ms\":1,\"time_backward_ms\":2,\"time_comm_wait_ms\":0,\"time_optimizer_ms\":0.5}\n",
                      &r));
  CHECK(r->n_steps == 2 && r->steps[1].n_ranks == 0 && r->steps[1].slowest == -1);
  char *page = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&page, &len);
  CHECK_OK(tdm__report_html(f, r));
  fclose(f);
  /* rank 0's mean over the steps after the first: step 6, forward 1, backward 2, other 2.5 */
  CHECK(page && strstr(page, "<tr><td>0</td><td>6.00</td><td>1.00</td><td>2.00</td><td>0.00</td><td>0.50</td>"));
  CHECK(page && strstr(page, "One rank, or no per-rank times"));
  free(page);
  tdm__run_free(r);
}

static void test_mixed_in_one_file(void) {
  tdm__run *r;
  /* another run appended to the same file: fresh start, another job, another seed */
  tdm_status st = parse_text(HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10) HDR("bbbb", "h2", "j2", 0, -1, "2") STEP(0, 11), &r);
  CHECK(st == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("run aaaa");
  CHECK_ERR_HAS("run bbbb");
  CHECK_ERR_HAS("m.jsonl:3");
  CHECK_ERR_HAS("tandem.seed 1 vs 2");
  tdm__run_free(r);
  /* the same configuration started again by hand (not a restart of the launcher's job) */
  st = parse_text(HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10) HDR("cccc", "h1", "j9", 0, -1, "1") STEP(0, 11), &r);
  CHECK(st == TDM_ERR_MISMATCH);
  tdm__run_free(r);
  /* records without a header, then a run that starts afresh */
  st = parse_text(STEP(0, 10) HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 11), &r);
  CHECK(st == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("(no header)");
  tdm__run_free(r);
}

static void test_restart_and_resume(void) {
  tdm__run *r;
  /* the launcher restarted the job (same job, attempt 1) without a checkpoint: steps 0-1 again */
  CHECK_OK(parse_text(HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10) STEP(1, 10) STEP(2, 10) HDR("bbbb", "h1", "j1", 1, -1, "1")
                          STEP(0, 20) STEP(1, 20),
                      &r));
  CHECK(r->n_steps == 3 && r->replaced == 2 && r->n_headers == 2);
  CHECK(r->n_steps == 3 && r->steps[0].step_ms == 20 && r->steps[2].step_ms == 10 && r->steps[0].attempt == 1);
  tdm__run_free(r);
  /* resumed from a checkpoint by a new launcher, even with another batch (--resume-override) */
  CHECK_OK(parse_text(HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10) STEP(1, 10) HDR("bbbb", "h7", "j2", 0, 2, "1") STEP(2, 10), &r));
  CHECK(r->n_steps == 3 && r->replaced == 0);
  int said = 0;
  for (int i = 0; i < r->n_notes; i++) said |= strstr(r->notes[i], "resumed from the checkpoint of step 2") != NULL;
  CHECK(said);
  tdm__run_free(r);
}

static void test_directories(void) {
  tdm__run *r = NULL;
  CHECK(tdm__run_load(tmp_path("missing"), NULL, &r) == TDM_ERR_IO);
  CHECK_ERR_HAS("missing");
  CHECK_ERR_HAS("expected a run directory");
  mkdir(tmp_path("empty"), 0755);
  CHECK(tdm__run_load(tmp_path("empty"), NULL, &r) == TDM_ERR_IO);
  CHECK_ERR_HAS("holds no metrics file");
  CHECK_ERR_HAS("the directory is empty");
  mkdir(tmp_path("trunc"), 0755);
  write_file(tmp_path("trunc/metrics.jsonl"), "{\"step\":0,\"loss\":2.3,\"samples_per_sec\":1");
  CHECK(tdm__run_load(tmp_path("trunc"), NULL, &r) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("no step records");
  CHECK_ERR_HAS("only lines that were not whole records");
  mkdir(tmp_path("two"), 0755);
  write_file(tmp_path("two/a.jsonl"), HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10));
  write_file(tmp_path("two/b.jsonl"), HDR("bbbb", "h1", "j2", 0, -1, "1") STEP(0, 10));
  CHECK(tdm__run_load(tmp_path("two"), NULL, &r) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("a.jsonl");
  CHECK_ERR_HAS("b.jsonl");
  CHECK_ERR_HAS("more than one run");
  /* one run with a trace beside it, in a directory below */
  mkdir(tmp_path("one"), 0755);
  mkdir(tmp_path("one/trace"), 0755);
  write_file(tmp_path("one/metrics.jsonl"), HDR("aaaa", "h1", "j1", 0, -1, "1") STEP(0, 10) STEP(1, 12));
  write_file(tmp_path("one/trace/rank0.json"),
             "{\"traceEvents\":[{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"rank 0\"}},"
             "{\"ph\":\"X\",\"name\":\"backward\",\"cat\":\"compute\",\"ts\":0,\"dur\":100,\"pid\":0,\"tid\":1},"
             "{\"ph\":\"X\",\"name\":\"layer 3\",\"cat\":\"backward\",\"ts\":10,\"dur\":20,\"pid\":0,\"tid\":1},"
             "{\"ph\":\"X\",\"name\":\"bucket 0\",\"cat\":\"comm\",\"ts\":50,\"dur\":100,\"pid\":0,\"tid\":2},"
             "{\"ph\":\"X\",\"name\":\"bucket 1\",\"cat\":\"comm\",\"ts\":140,\"dur\":20,\"pid\":0,\"tid\":2},"
             "{\"ph\":\"X\",\"name\":\"step\",\"ts\":0,\"dur\":500,\"pid\":0,\"tid\":1},"
             "{\"ph\":\"B\",\"name\":\"forward\",\"ts\":0,\"pid\":0,\"tid\":1}]}");
  write_file(tmp_path("one/trace/junk.json"), "not json");
  { /* a merged trace holding the same process: read once */
    FILE *in = fopen(tmp_path("one/trace/rank0.json"), "r"), *out = fopen(tmp_path("one/trace/trace.merged.json"), "w");
    int ch;
    while (in && out && (ch = fgetc(in)) != EOF) fputc(ch, out);
    if (in) fclose(in);
    if (out) fclose(out);
  }
  write_file(tmp_path("one/metrics.jsonl.ps0"), "{\"ps_server\":0,\"rank\":2,\"updates\":7,\"max_staleness\":2,\"staleness_hist\":[3,2,2]}\n");
  CHECK_OK(tdm__run_load(tmp_path("one"), NULL, &r));
  if (r) {
    CHECK(r->n_steps == 2 && r->trace && r->trace->n_procs == 1);
    CHECK(r->n_ps == 1); /* the server's report beside the metrics, not a second run */
    if (r->trace && r->trace->n_procs == 1) {
      const tdm__trace_proc *p = &r->trace->procs[0];
      CHECK_NEAR(p->us[TDM__TK_BWD], 100, 1e-9);      /* the layer span inside backward counts once */
      CHECK_NEAR(p->us[TDM__TK_COMM], 110, 1e-9);     /* [50, 160): the buckets' union */
      CHECK_NEAR(p->comm_hidden_us, 50, 1e-9);        /* [50, 100) under backward */
      CHECK_NEAR(p->us[TDM__TK_OTHER], 0, 0);         /* "step" is a container, "B" is not a complete event */
      CHECK(!strcmp(p->name, "rank 0"));
    }
    int told = 0, twice = 0;
    for (int i = 0; i < r->n_notes; i++)
      told |= strstr(r->notes[i], "junk.json") != NULL, twice |= strstr(r->notes[i], "trace.merged.json: process 0 was read") != NULL;
    CHECK(told && twice);
    char *page = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&page, &len);
    CHECK_OK(tdm__report_html(f, r));
    fclose(f);
    CHECK(page && strstr(page, "ran while backward did (hidden)") && strstr(page, "communication hidden by backward"));
    CHECK(page && strstr(page, "Parameter servers") && strstr(page, "Staleness of the applied gradients"));
    free(page);
  }
  tdm__run_free(r);
}

static void test_kinds(void) {
  CHECK(tdm__trace_kind("forward", "compute") == TDM__TK_FWD);
  CHECK(tdm__trace_kind("allreduce bucket 3", "comm") == TDM__TK_COMM);
  CHECK(tdm__trace_kind("backward", NULL) == TDM__TK_BWD);
  CHECK(tdm__trace_kind("optimizer", "compute") == TDM__TK_OPT);
  CHECK(tdm__trace_kind("data", "io") == TDM__TK_OTHER);
  CHECK(tdm__trace_kind("step", "train") == -1);
  /* the names tandem train --trace writes (name, category) */
  CHECK(tdm__trace_kind("forward", "compute") == TDM__TK_FWD && tdm__trace_kind("backward", "compute") == TDM__TK_BWD);
  CHECK(tdm__trace_kind("bucket all-reduce", "comm") == TDM__TK_COMM && tdm__trace_kind("optimizer", "optimizer") == TDM__TK_OPT);
  CHECK(tdm__trace_kind("step", "step") == -1 && tdm__trace_kind("validation", "evaluation") == TDM__TK_OTHER);
  CHECK(tdm__trace_kind("recv gradient", "pipeline") == TDM__TK_COMM && tdm__trace_kind("data", "data") == TDM__TK_OTHER);
}

/* The heights of the bars ("height=\"...\"" of class bar), in order. */
static int bar_heights(const char *svg, double *h, int max) {
  int n = 0;
  for (const char *p = svg; n < max && (p = strstr(p, "<rect class=\"bar\"")); p++) {
    const char *q = strstr(p, "height=\"");
    if (q) h[n++] = atof(q + 8);
  }
  return n;
}

static void test_svg(void) {
  double t[16];
  int n = tdm__nice_ticks(0, 1, 6, t);
  CHECK(n == 6 && t[0] == 0 && fabs(t[1] - 0.2) < 1e-12 && fabs(t[5] - 1) < 1e-12);
  n = tdm__nice_ticks(3, 97, 8, t);
  CHECK(n >= 2 && t[0] >= 3 && t[n - 1] <= 97 && fabs(t[1] - t[0] - 20) < 1e-9);
  char *s = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&s, &len);
  double x[4] = {0, 1, 2, 3}, y[4] = {1, NAN, 3, 4};
  tdm__series ser = {"a <b>", x, y, 4};
  tdm__svg_lines(f, "T", "step", "loss", &ser, 1, 0);
  fclose(f);
  CHECK(s && strstr(s, ">step</text>") && strstr(s, ">loss</text>") && strstr(s, "a &lt;b&gt;"));
  int polylines = 0;
  for (const char *p = s; p && (p = strstr(p, "<polyline")); p++) polylines++;
  CHECK(polylines == 1 && strstr(s, "<circle")); /* the NaN breaks the line: the lone point before it is a dot */
  free(s);
  /* stacked: 1 + 3 in the first category is as tall as 4 alone in the second */
  s = NULL;
  f = open_memstream(&s, &len);
  const char *cats[2] = {"r0", "r1"};
  double a[2] = {1, 0}, b[2] = {3, 4};
  tdm__series st[2] = {{"a", NULL, a, 2}, {"b", NULL, b, 2}};
  tdm__svg_bars(f, "B", "rank", "ms", cats, 2, st, 2, 1);
  fclose(f);
  double h[8];
  CHECK(bar_heights(s, h, 8) == 4);
  CHECK_NEAR(h[0] + h[2], h[3], 0.11);
  CHECK_NEAR(h[2], 3 * h[0], 0.11);
  free(s);
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; p && (p = strstr(p, what)); p++) n++;
  return n;
}

/* A log x axis (the simulator's ranks): ticks at the data's x values, equal steps for equal ratios,
 * a polyline and the points per series; bare: the <svg> alone, no <figure>. */
static void test_svg_logx(void) {
  char *s = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&s, &len);
  double x[4] = {1, 8, 64, 512}, a[4] = {10, 11, 14, 30}, b[4] = {10, 10.5, 12, 20};
  tdm__series ser[2] = {{"ring", x, a, 4}, {"hier", x, b, 4}};
  tdm__svg_lines_opt(f, "Predicted step time", "ranks", "milliseconds per step", ser, 2, TDM__SVG_LOGX | TDM__SVG_BARE);
  fclose(f);
  CHECK(s && !strncmp(s, "<svg xmlns=", 11) && !strstr(s, "<figure") && strstr(s, "</svg>\n"));
  CHECK(strstr(s, ">ranks</text>") && strstr(s, ">milliseconds per step</text>") && strstr(s, ">Predicted step time</text>"));
  CHECK_MSG(count(s, "<polyline") == 2 && count(s, "<circle") == 8, "%d polylines, %d points", count(s, "<polyline"), count(s, "<circle"));
  CHECK(strstr(s, "data-name=\"ring\"") && strstr(s, "data-name=\"hier\""));
  /* ticks 1, 8, 64, 512 at equal distances */
  double tx[4];
  int nt = 0;
  for (const char *p = strstr(s, "class=\"axis x\""); p && nt < 4 && (p = strstr(p, "<text class=\"tick\" x=\"")); p++) {
    tx[nt++] = atof(p + strlen("<text class=\"tick\" x=\""));
    const char *gt = strchr(p, '>');
    CHECK(gt && atof(gt + 1) == x[nt - 1]);
  }
  CHECK_MSG(nt == 4 && fabs((tx[1] - tx[0]) - (tx[2] - tx[1])) < 0.2 && fabs((tx[3] - tx[2]) - (tx[2] - tx[1])) < 0.2, "%d ticks", nt);
  free(s);
  /* more than 12 distinct x: the powers of 10 */
  s = NULL;
  f = open_memstream(&s, &len);
  double xs[20], ys[20];
  for (int i = 0; i < 20; i++) xs[i] = 1 + i * 60, ys[i] = i;
  tdm__series one = {"many", xs, ys, 20};
  tdm__svg_lines_opt(f, "T", "ranks", "y", &one, 1, TDM__SVG_LOGX);
  fclose(f);
  CHECK(s && strstr(s, "<figure") && strstr(s, ">1</text>") && strstr(s, ">10</text>") && strstr(s, ">100</text>") && strstr(s, ">1000</text>"));
  CHECK(!strstr(s, ">61</text>"));
  free(s);
  /* a log y axis over less than a few decades: ticks at 1, 2 and 5 x 10^k */
  s = NULL;
  f = open_memstream(&s, &len);
  double ly[4] = {76, 108, 451, 1557};
  tdm__series lg = {"ring", x, ly, 4};
  tdm__svg_lines_opt(f, "T", "ranks", "ms", &lg, 1, TDM__SVG_LOGX | TDM__SVG_LOGY);
  fclose(f);
  CHECK(s && strstr(s, ">100</text>") && strstr(s, ">200</text>") && strstr(s, ">500</text>") && strstr(s, ">1000</text>"));
  CHECK(!strstr(s, ">316</text>"));
  free(s);
}

int main(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/tandem-test-report-XXXXXX");
  if (!mkdtemp(tmp_root)) return 1;
  static const tdm_test_case cases[] = {
      {"truncated_line", test_truncated_line},
      {"one_rank", test_one_rank},
      {"mixed_in_one_file", test_mixed_in_one_file},
      {"restart_and_resume", test_restart_and_resume},
      {"directories", test_directories},
      {"trace_kinds", test_kinds},
      {"svg", test_svg},
      {"svg_logx", test_svg_logx},
  };
  int rc = tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
  return rc;
}
