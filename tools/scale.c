/* tandem scale --ranks 1,2,4 [--strong] [--dir DIR] [-o FILE] -- tandem train ...: runs the same
 * training job under `tandem run -n R` for each R, each with its own metrics file
 * (DIR/ranks-R/metrics.jsonl) and output (DIR/ranks-R/output.log), then prints and writes (HTML,
 * the report's style) the table: ranks, global batch, throughput, speed-up, efficiency, step time,
 * communication share. Weak scaling by default (--batch-size per rank kept); --strong keeps the
 * global batch of the smallest world size (each rank's batch = global / R, which must divide).
 * TANDEM_NET_EMULATE and the other variables pass through to the ranks. Exit 0 when every run
 * succeeded, 1 when one failed (the table holds those that ran), 2 on usage errors. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core/internal.h"
#include "report/run.h"
#include "report/svg.h"
#include "run.h"
#include "tandem/tandem.h"


#define MAX_SIZES 32

typedef struct {
  int ranks;
  int64_t batch, global_batch;
  int ok, steps;
  double sps, step_ms, fwd, bwd, wait, opt, share;
} size_result;

typedef struct {
  size_result r[MAX_SIZES];
  int n, strong;
  const char *emulate, *command;
} study;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of the step records' samples/s after a warm-up (the first tenth, at least one step),
 * and the means of the step's parts over every rank that recorded them. */
static void summarise(const tdm__run *run, size_result *s) {
  int skip = run->n_steps / 10 > 1 ? run->n_steps / 10 : 1;
  if (skip >= run->n_steps) skip = run->n_steps - 1;
  int n = run->n_steps - skip;
  double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  double part[TDM__RT_COUNT] = {0};
  int cnt = 0, m = 0;
  for (int i = skip; v && i < run->n_steps; i++) {
    const tdm__step_rec *st = &run->steps[i];
    if (isfinite(st->samples_per_sec)) v[m++] = st->samples_per_sec;
    if (st->n_ranks > 0) {
      for (int k = 0; k < st->n_ranks; k++)
        for (int q = 0; q < TDM__RT_COUNT; q++) part[q] += st->rank_ms[k * TDM__RT_COUNT + q];
      cnt += st->n_ranks;
    } else {
      double p[TDM__RT_COUNT] = {st->step_ms, st->fwd_ms, st->bwd_ms, st->wait_ms, st->opt_ms};
      for (int q = 0; q < TDM__RT_COUNT; q++) part[q] += p[q];
      cnt++;
    }
  }
  if (m > 0) qsort(v, (size_t)m, sizeof *v, cmp_double);
  s->sps = m > 0 ? (m % 2 ? v[m / 2] : (v[m / 2 - 1] + v[m / 2]) / 2) : NAN;
  free(v);
  for (int q = 0; q < TDM__RT_COUNT; q++) part[q] = cnt ? part[q] / cnt : NAN;
  s->step_ms = part[TDM__RT_STEP], s->fwd = part[TDM__RT_FWD], s->bwd = part[TDM__RT_BWD], s->wait = part[TDM__RT_WAIT],
  s->opt = part[TDM__RT_OPT];
  s->share = s->step_ms > 0 ? s->wait / s->step_ms : NAN;
  s->steps = run->n_steps;
}

/* Runs `tandem run -n R -- prog...` with its output in log; waits at most timeout_s seconds. */
static int run_one(char **argv, const char *log, double timeout_s) {
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "tandem scale: cannot write %s: %s\n", log, strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "tandem scale: fork: %s\n", strerror(errno));
    close(fd);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], argv);
    fprintf(stderr, "tandem scale: cannot start %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fd);
  setpgid(pid, pid);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return -1;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > timeout_s) {
      fprintf(stderr, "tandem scale: the run did not finish within --timeout %g s; stopping it\n", timeout_s);
      kill(-pid, SIGTERM);
      sleep(5);
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int parse_ranks(const char *s, int *out, int *n) {
  *n = 0;
  for (const char *p = s; *p;) {
    char tok[32];
    size_t k = strcspn(p, ",");
    int64_t v;
    if (k == 0 || k >= sizeof tok) goto bad;
    memcpy(tok, p, k), tok[k] = 0;
    if (cli_parse_int(tok, 1, MAX_RANKS, &v) || *n >= MAX_SIZES) goto bad;
    for (int i = 0; i < *n; i++)
      if (out[i] >= v) goto bad;
    out[(*n)++] = (int)v;
    p += k + (p[k] == ',');
  }
  if (*n > 0) return 0;
bad:
  fprintf(stderr, "tandem scale: --ranks '%s': expected increasing world sizes in 1..%d separated by commas (at most %d), such as 1,2,4\n",
          s, MAX_RANKS, MAX_SIZES);
  return 2;
}

static tdm_status render_study(FILE *f, const void *p) {
  const study *s = p;
  char title[200];
  snprintf(title, sizeof title, "tandem scale: %s scaling%s%s", s->strong ? "strong" : "weak", s->emulate ? ", TANDEM_NET_EMULATE=" : "",
           s->emulate ? s->emulate : "");
  tdm__html_begin(f, title);
  fprintf(f, "<p>Command: <code>");
  tdm__html_text(f, s->command);
  fprintf(f, "</code>. %s</p>\n", s->strong ? "Strong scaling: the global batch is fixed, each rank takes its share."
                                            : "Weak scaling: the batch per rank is fixed, the global batch grows with the ranks.");
  fprintf(f, "<table><tr><th>ranks</th><th>global batch</th><th>samples/s</th><th>speed-up</th><th>efficiency</th><th>step (ms)</th>"
             "<th>forward</th><th>backward</th><th>comm wait</th><th>optimizer</th><th>comm share</th></tr>\n");
  const size_result *b = NULL;
  for (int i = 0; i < s->n && !b; i++) b = s->r[i].ok ? &s->r[i] : NULL;
  double x[MAX_SIZES], thr[MAX_SIZES], ideal[MAX_SIZES], eff[MAX_SIZES], share[MAX_SIZES];
  double parts[5][MAX_SIZES];
  char names[MAX_SIZES][16];
  const char *cats[MAX_SIZES];
  for (int i = 0; i < s->n; i++) {
    const size_result *r = &s->r[i];
    double sp = b && r->ok ? r->sps / b->sps : NAN, e = b ? sp / ((double)r->ranks / b->ranks) : NAN;
    x[i] = r->ranks, thr[i] = r->ok ? r->sps : NAN, ideal[i] = b ? b->sps * r->ranks / b->ranks : NAN, eff[i] = 100 * e;
    share[i] = r->ok ? 100 * r->share : NAN;
    parts[0][i] = r->fwd, parts[1][i] = r->bwd, parts[2][i] = r->wait, parts[3][i] = r->opt;
    parts[4][i] = r->step_ms - r->fwd - r->bwd - r->wait - r->opt;
    if (!(parts[4][i] > 0)) parts[4][i] = 0;
    snprintf(names[i], sizeof names[i], "%d", r->ranks);
    cats[i] = names[i];
    if (!r->ok) {
      fprintf(f, "<tr><td>%d</td><td>%lld</td><td colspan=\"9\" class=\"k\">failed: see ranks-%d/output.log</td></tr>\n", r->ranks,
              (long long)r->global_batch, r->ranks);
      continue;
    }
    fprintf(f, "<tr><td>%d</td><td>%lld</td><td>%.1f</td><td>%.2f</td><td>%.1f%%</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%.2f</td>"
               "<td>%.2f</td><td>%.1f%%</td></tr>\n",
            r->ranks, (long long)r->global_batch, r->sps, sp, 100 * e, r->step_ms, r->fwd, r->bwd, r->wait, r->opt, 100 * r->share);
  }
  fprintf(f, "</table>\n");
  tdm__series st[2] = {{"measured", x, thr, s->n}, {"linear from the smallest", x, ideal, s->n}};
  tdm__svg_lines(f, "Throughput against ranks", "ranks", "samples per second (all ranks)", st, 2, 0);
  tdm__series se = {"efficiency", x, eff, s->n};
  tdm__svg_lines(f, "Scaling efficiency", "ranks", "percent of linear", &se, 1, 0);
  tdm__series sh = {"communication wait / step time", x, share, s->n};
  tdm__svg_lines(f, "Communication share", "ranks", "percent", &sh, 1, 0);
  tdm__series sp[5] = {{"forward", NULL, parts[0], s->n}, {"backward", NULL, parts[1], s->n}, {"communication wait", NULL, parts[2], s->n},
                       {"optimizer", NULL, parts[3], s->n}, {"other", NULL, parts[4], s->n}};
  tdm__svg_bars(f, "Step time by world size (mean over ranks)", "ranks", "milliseconds per step", cats, s->n, sp, 5, 1);
  tdm__html_end(f);
  return ferror(f) ? tdm__set_error(TDM_ERR_IO, "scale: writing the page failed") : TDM_OK;
}

int tool_scale(int argc, char **argv) {
  int dash = -1;
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--")) {
      dash = i;
      break;
    }
  const char *ranks_s = NULL, *dir = NULL, *out = NULL;
  int strong = 0;
  double timeout_s = 0;
  cli_opt opts[] = {
      {"ranks", CLI_STRING, &ranks_s, "1,2,4", "world sizes to run, increasing, comma-separated", NULL, 0, 0, 0},
      {"strong", CLI_FLAG, &strong, NULL, "strong scaling: keep the global batch of the smallest world size (default: weak, the batch per rank kept)", NULL, 0, 0, 0},
      {"dir", CLI_STRING, &dir, "tandem-scale", "where each world size's metrics and output go (DIR/ranks-R/); must not hold an earlier study's", NULL, 0, 0, 0},
      {"o", CLI_STRING, &out, NULL, "the HTML report (default DIR/report.html)", NULL, 0, 0, 0},
      {"timeout", CLI_FLOAT, &timeout_s, "3600", "seconds each world size's run may take before it is stopped", NULL, 1, 1e6, 0},
  };
  int nopt = (int)(sizeof opts / sizeof opts[0]);
  static const char *use = "--ranks 1,2,4 [--strong] [--dir DIR] [-o FILE] -- tandem train [train options]";
  int pr = cli_parse("scale", use, opts, nopt, dash >= 0 ? dash : argc, argv);
  if (pr) return pr == 1 ? 0 : 2;
  if (dash < 0 || dash + 2 >= argc + 0 || dash + 1 >= argc) {
    fprintf(stderr, "tandem scale: no training command given; usage: tandem scale %s\n", use);
    return 2;
  }
  char **prog = argv + dash + 1;
  int nprog = argc - dash - 1;
  if (nprog < 2 || strcmp(prog[1], "train")) {
    fprintf(stderr, "tandem scale: the command after -- is '%s%s%s'; expected tandem train [options] (the study reads its metrics)\n",
            prog[0], nprog > 1 ? " " : "", nprog > 1 ? prog[1] : "");
    return 2;
  }
  int sizes[MAX_SIZES], n;
  if (parse_ranks(ranks_s, sizes, &n)) return 2;
  int64_t batch = 64; /* tandem train's default */
  int batch_at = -1;
  for (int i = 2; i < nprog; i++) {
    const char *a = prog[i];
    if (!strcmp(a, "--metrics") || !strncmp(a, "--metrics=", 10)) {
      fprintf(stderr, "tandem scale: the training command gives --metrics; leave it out: the study writes DIR/ranks-R/metrics.jsonl\n");
      return 2;
    }
    if (!strcmp(a, "--emulate-ranks") || !strncmp(a, "--emulate-ranks=", 16)) { /* its world is not the study's */
      fprintf(stderr, "tandem scale: the training command gives --emulate-ranks; leave it out: the study starts each world "
                      "size with tandem run -n R (set TANDEM_NET_EMULATE for a slower network)\n");
      return 2;
    }
    const char *v = !strcmp(a, "--batch-size") && i + 1 < nprog ? prog[i + 1] : !strncmp(a, "--batch-size=", 13) ? a + 13 : NULL;
    if (!v) continue;
    if (cli_parse_int(v, 1, (int64_t)1 << 40, &batch)) {
      fprintf(stderr, "tandem scale: --batch-size '%s': expected a positive number\n", v);
      return 2;
    }
    batch_at = i;
  }
  int64_t global = batch * sizes[0];
  if (strong)
    for (int i = 0; i < n; i++)
      if (global % sizes[i]) {
        fprintf(stderr, "tandem scale: --strong keeps the global batch %lld (--batch-size %lld x %d ranks), which %d ranks do not "
                        "divide; choose sizes or a batch that divide\n", (long long)global, (long long)batch, sizes[0], sizes[i]);
        return 2;
      }
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "tandem scale: cannot create --dir %s: %s\n", dir, strerror(errno));
    return 1;
  }
  for (int i = 0; i < n; i++) { /* never mix with an earlier study's metrics (they append) */
    char m[4200];
    struct stat sb;
    snprintf(m, sizeof m, "%s/ranks-%d/metrics.jsonl", dir, sizes[i]);
    if (stat(m, &sb) == 0) {
      fprintf(stderr, "tandem scale: %s exists (an earlier study?); give a new --dir or remove it\n", m);
      return 2;
    }
  }
  if (out && tdm_safetensors_check_writable(out) != TDM_OK) { /* before the runs, not after them */
    fprintf(stderr, "tandem scale: -o: %s\n", tdm_last_error());
    return 2;
  }
  char cmdline[2048] = "";
  for (int i = 0; i < nprog; i++) {
    size_t at = strlen(cmdline);
    snprintf(cmdline + at, sizeof cmdline - at, "%s%s", i ? " " : "", prog[i]);
  }
  static study s;
  memset(&s, 0, sizeof s);
  s.n = n, s.strong = strong, s.emulate = getenv("TANDEM_NET_EMULATE"), s.command = cmdline;
  if (s.emulate && !*s.emulate) s.emulate = NULL;
  const char *self = run_self_exe();
  int failed = 0;
  printf("tandem scale: %s scaling, ranks %s%s%s\n", strong ? "strong" : "weak", ranks_s, s.emulate ? ", TANDEM_NET_EMULATE=" : "",
         s.emulate ? s.emulate : "");
  for (int i = 0; i < n; i++) {
    int R = sizes[i];
    size_result *res = &s.r[i];
    res->ranks = R;
    res->batch = strong ? global / R : batch;
    res->global_batch = res->batch * R;
    char sub[4200], metrics[4300], log[4300], nr[16], bs[32];
    snprintf(sub, sizeof sub, "%s/ranks-%d", dir, R);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", sub);
    snprintf(log, sizeof log, "%s/output.log", sub);
    snprintf(nr, sizeof nr, "%d", R);
    snprintf(bs, sizeof bs, "%lld", (long long)res->batch);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST) {
      fprintf(stderr, "tandem scale: cannot create %s: %s\n", sub, strerror(errno));
      return 1;
    }
    char **av = calloc((size_t)nprog + 12, sizeof *av);
    if (!av) return 1;
    int k = 0;
    av[k++] = (char *)self, av[k++] = "run", av[k++] = "-n", av[k++] = nr, av[k++] = "--";
    for (int j = 0; j < nprog; j++) {
      if (batch_at >= 0 && (j == batch_at || (j == batch_at + 1 && !strcmp(prog[batch_at], "--batch-size")))) continue;
      av[k++] = prog[j];
    }
    av[k++] = "--batch-size", av[k++] = bs, av[k++] = "--metrics", av[k++] = metrics, av[k] = NULL;
    fprintf(stdout, "  %d rank%s, batch %s per rank: ", R, R == 1 ? "" : "s", bs);
    fflush(stdout);
    int rc = run_one(av, log, timeout_s);
    free(av);
    tdm__run *run = NULL;
    if (rc == 0 && tdm__run_load(sub, NULL, &run) == TDM_OK) {
      summarise(run, res);
      res->ok = 1;
      printf("%.1f samples/s (%d steps)\n", res->sps, res->steps);
    } else {
      printf("failed (%s%s); see %s\n", rc ? "exit code " : "", rc ? "" : tdm_last_error(), log);
      if (rc) fprintf(stderr, "tandem scale: %d ranks: exit code %d; see %s\n", R, rc, log);
      failed = 1;
    }
    tdm__run_free(run);
  }
  const size_result *b = NULL;
  for (int i = 0; i < n && !b; i++) b = s.r[i].ok ? &s.r[i] : NULL;
  printf("\n%6s %12s %12s %9s %11s %10s %11s %11s %12s %12s %13s\n", "ranks", "global_batch", "samples/s", "speed-up", "efficiency",
         "step_ms", "comm_share", "forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms");
  for (int i = 0; i < n; i++) {
    const size_result *r = &s.r[i];
    if (!r->ok) {
      printf("%6d %12lld %12s\n", r->ranks, (long long)r->global_batch, "failed");
      continue;
    }
    double sp = r->sps / b->sps, e = sp / ((double)r->ranks / b->ranks);
    printf("%6d %12lld %12.1f %9.2f %10.1f%% %10.2f %10.1f%% %11.2f %12.2f %12.2f %13.2f\n", r->ranks, (long long)r->global_batch,
           r->sps, sp, 100 * e, r->step_ms, 100 * r->share, r->fwd, r->bwd, r->wait, r->opt);
  }
  char def[4200];
  if (!out) snprintf(def, sizeof def, "%s/report.html", dir), out = def;
  if (report_write_page(out, render_study, &s, "scale")) return 1;
  printf("\nreport: %s\n", out);
  return failed ? 1 : 0;
}
