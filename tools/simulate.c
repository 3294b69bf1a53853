/* tandem simulate: predicted step time and scaling of a training run (tandem/sim.h), a study of
 * several configurations (--vary) drawn as a page or plots (simulate_page.c), the collectives'
 * costs, and calibration of the cluster description from measurements. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>

#include "cli.h"
#include "simulate_page.h"
#include "tandem/tandem.h"

#define MAX_RANKS SIM_MAX_RANKS

/* "8,64,1024": positive integers, comma-separated. */
static int parse_ranks(const char *s, int *out, int *n) {
  *n = 0;
  size_t len = s ? strlen(s) : 0;
  if (!len || s[len - 1] == ',') goto bad;
  for (const char *at = s; *at;) {
    char num[32];
    size_t k = strcspn(at, ",");
    int64_t v;
    if (k == 0 || k >= sizeof num || *n == MAX_RANKS) goto bad;
    memcpy(num, at, k);
    num[k] = 0;
    if (cli_parse_int(num, 1, 1 << 24, &v)) {
      fprintf(stderr, "tandem simulate: --ranks '%s': '%s' is not a rank count (an integer 1..16777216)\n", s, num);
      return 2;
    }
    out[(*n)++] = (int)v;
    at += k + (at[k] == ',');
  }
  return 0;
bad:
  fprintf(stderr, "tandem simulate: --ranks '%s': expected positive rank counts, comma-separated, at most %d (like 8,64,1024)\n",
          s ? s : "", MAX_RANKS);
  return 2;
}

/* ---- calibration over threads of this process ---------------------------------------------------- */
typedef struct {
  void *group;
  int rank, size;
  size_t max_bytes;
  tdm_sim_calibration cal;
  tdm_status st;
  char err[512];
} thread_arg;

static void *calib_thread(void *p) {
  thread_arg *a = p;
  tdm_comm_config cc;
  memset(&cc, 0, sizeof cc);
  cc.rank = a->rank, cc.size = a->size, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 120;
  tdm_comm_t c = NULL;
  a->st = tdm_comm_create(&c, &cc);
  if (a->st == TDM_OK) a->st = tdm_sim_calibrate_link(c, a->max_bytes, 0, &a->cal);
  if (a->st != TDM_OK) snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
  tdm_comm_destroy(c);
  return NULL;
}

/* The model's step measured on this process alone: the compute rate, optimizer and overhead. */
static int measure_compute(const tdm_train_config *tc, int steps, tdm_sim_cluster *k, char *detail, size_t n) {
  tdm_plan plan;
  tdm_plan_config pc;
  tdm_sim_model *m = NULL;
  tdm_status st = tdm_train_plan_config(tc, 1, &plan, &pc);
  if (st == TDM_OK) st = tdm_sim_model_create(&m, &pc);
  double fl = m ? tdm_sim_model_flops(m) * (double)(pc.engine.accum > 1 ? pc.engine.accum : 1) : 0;
  int64_t np = m ? tdm_sim_model_params(m) : 0;
  tdm_sim_model_destroy(m);
  if (st == TDM_OK) st = tdm_sim_calibrate_compute(tc, steps, fl, np, k, detail, n);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem simulate --calibrate: %s\n", tdm_last_error());
    return 1;
  }
  return 0;
}

static int calibrate(const tdm_train_config *tc, const char *out_path, const char *base, int64_t max_bytes, int ppn, int steps,
                     int compute) {
  tdm_sim_cluster k;
  tdm_sim_cluster_default(&k);
  if (base && tdm_sim_cluster_load(base, &k) != TDM_OK) {
    fprintf(stderr, "tandem simulate --calibrate: %s\n", tdm_last_error());
    return 1;
  }
  tdm_comm_config env;
  if (tdm_comm_config_from_env(&env) != TDM_OK) {
    fprintf(stderr, "tandem simulate --calibrate: %s\n", tdm_last_error());
    return 1;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  k.cores_per_node = (int)(cores > 0 ? cores : 1);
  k.threads = tc->threads > 0 ? tc->threads : 1;
  if (ppn > 0) k.ranks_per_node = ppn;
  char detail[512] = "", transport[32] = "thread";
  int rank = 0;
  tdm_sim_calibration cal;
  if (env.size > 1) { /* under a launcher: the world's transport (and TANDEM_NET_EMULATE's links) */
    if (compute) { /* every rank measures the model's step alone, all at once: sharing the node as they will */
      char rank_s[32], world_s[32];
      snprintf(rank_s, sizeof rank_s, "%s", getenv("RANK") ? getenv("RANK") : "");
      snprintf(world_s, sizeof world_s, "%s", getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "");
      unsetenv("RANK"), unsetenv("WORLD_SIZE");
      int rc = measure_compute(tc, steps, &k, detail, sizeof detail);
      setenv("RANK", rank_s, 1), setenv("WORLD_SIZE", world_s, 1);
      if (rc) return rc;
      const char *lws = getenv("LOCAL_WORLD_SIZE");
      k.compute_ranks = lws && atoi(lws) > 0 ? atoi(lws) : env.size;
    }
    tdm_comm_t c;
    if (tdm_comm_create(&c, &env) != TDM_OK) {
      fprintf(stderr, "tandem simulate --calibrate: %s\n", tdm_last_error());
      return 1;
    }
    rank = tdm_comm_rank(c);
    snprintf(transport, sizeof transport, "%s", tdm_transport_name(tdm_comm_transport(c)));
    if (compute) { /* the spread of the steps: every rank's, averaged */
      double cv = k.compute_cv / env.size;
      if (tdm_comm_allreduce(c, &cv, &cv, 1, TDM_F64, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK) {
        fprintf(stderr, "tandem simulate --calibrate: rank %d: %s\n", rank, tdm_last_error());
        tdm_comm_destroy(c);
        return 1;
      }
      k.compute_cv = cv;
    }
    const char *lws = getenv("LOCAL_WORLD_SIZE");
    tdm_status st = tdm_sim_calibrate_link(c, (size_t)max_bytes, lws && atoi(lws) > 0 ? atoi(lws) : 0, &cal);
    tdm_comm_destroy(c);
    if (st != TDM_OK) {
      fprintf(stderr, "tandem simulate --calibrate: rank %d: %s\n", rank, tdm_last_error());
      return 1;
    }
    k.shm = !strcmp(transport, "shm");
    if (compute && rank == 0)
      printf("%s (on each of %d ranks at once; rank 0's; the spread over all: %.2f)\n", detail, k.compute_ranks, k.compute_cv);
  } else {
    if (compute) { /* the model's step, measured on this process */
      int rc = measure_compute(tc, steps, &k, detail, sizeof detail);
      if (rc) return rc;
      k.compute_ranks = 1;
      printf("%s\n", detail);
    }
    thread_arg a[2];
    pthread_t th[2];
    void *g = NULL;
    if (tdm_comm_thread_group_create(&g, 2) != TDM_OK) {
      fprintf(stderr, "tandem simulate --calibrate: %s\n", tdm_last_error());
      return 1;
    }
    for (int r = 0; r < 2; r++) {
      memset(&a[r], 0, sizeof a[r]);
      a[r].group = g, a[r].rank = r, a[r].size = 2, a[r].max_bytes = (size_t)max_bytes;
      pthread_create(&th[r], NULL, calib_thread, &a[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    tdm_comm_thread_group_destroy(g);
    for (int r = 0; r < 2; r++)
      if (a[r].st != TDM_OK) {
        fprintf(stderr, "tandem simulate --calibrate: thread rank %d: %s\n", r, a[r].err);
        return 1;
      }
    cal = a[0].cal;
    k.shm = 0;
  }
  if (rank != 0) return 0;
  const char *emu = getenv("TANDEM_NET_EMULATE");
  tdm_sim_link link = cal.link;
  /* TANDEM_NET_EMULATE gives every pair of ranks a link of its own (src/comm/p2p.c): not measured, known */
  link.pairwise = emu && *emu ? 1 : 0;
  k.intra = k.inter = link; /* one machine: every link is the one measured */
  k.cpu_cores = cal.cpu_cores;
  char bursts[128] = "";
  for (int b = 0, at = 0; b < cal.n_bursts && at < (int)sizeof bursts; b++)
    at += snprintf(bursts + at, sizeof bursts - (size_t)at, "%s%.0f", b ? ", " : "", cal.pingpong_bursts[b] * 1e6);
  printf("link: %s%s%s: alpha %.3g us, beta %.4g ns/B (%.3g GB/s), gamma %.4g ns/B, ping-pong %.3g us (bursts %s; a receiver's "
         "wake-up %.3g us, %.3g us on cores shared; a bucket waited for on the communication thread %.3g us more)\n",
         transport, emu && *emu ? " emulated " : "", emu && *emu ? emu : "", link.alpha * 1e6, link.beta * 1e9,
         link.beta > 0 ? 1e-9 / link.beta : 0, link.gamma * 1e9, cal.pingpong * 1e6, bursts, link.wake * 1e6,
         link.wake_shared * 1e6, link.handoff * 1e6);
  printf("cpu: %.3g us + %.4g ns/B a message, %.3g cores for the ranks; the ring exchange predicted within %.1f%% (mean), "
         "%.1f%% (max); alone the plain fit: alpha %.3g us, beta %.4g ns/B\n",
         link.cpu_alpha * 1e6, link.cpu_beta * 1e9, cal.cpu_cores, 100 * cal.check_mean, 100 * cal.check_max, cal.ring_alpha * 1e6,
         cal.ring_beta * 1e9);
  if (link.stagger > 0)
    printf("cpu: %.0f%% of what crowded cores add to a step hides under the other ranks' wire (stagger %.2f)\n", 100 * link.stagger,
           link.stagger);
  if (link.fan_alpha > 0 || link.fan_beta > 0)
    printf("cpu: %.3g us + %.4g ns/B a message when a rank sends to every other rank at once\n", link.fan_alpha * 1e6,
           link.fan_beta * 1e9);
  if (link.big_bytes > 0 && link.big_factor > 1)
    printf("cpu: a message of %.0f KiB (the L2) or more costs %.2fx a byte (from half of it on, in proportion)\n", link.big_bytes / 1024,
           link.big_factor);
  if (link.big_bytes > 0 && link.fan_big_factor >= 1)
    printf("cpu: a message of %.0f KiB or more costs %.2fx a byte when a rank sends to every other rank at once\n",
           link.big_bytes / 1024, link.fan_big_factor);
  char extra[4096];
  size_t at = (size_t)snprintf(extra, sizeof extra,
                               "\"measured\": {\"transport\": \"%s\", \"emulate\": \"%s\", \"pingpong\": %.6e, \"ring\": {\"alpha\": %.6e, "
                               "\"beta\": %.6e}, \"check\": {\"mean\": %.4f, \"max\": %.4f}, \"pingpong_bursts\": [",
                               transport, emu ? emu : "", cal.pingpong, cal.ring_alpha, cal.ring_beta, cal.check_mean, cal.check_max);
  for (int b = 0; b < cal.n_bursts && at < sizeof extra; b++)
    at += (size_t)snprintf(extra + at, sizeof extra - at, "%s%.4e", b ? ", " : "", cal.pingpong_bursts[b]);
  if (at < sizeof extra) at += (size_t)snprintf(extra + at, sizeof extra - at, "],\n    \"points\": [");
  const tdm_sim_calib_points *q = &cal.points; /* bytes, pair wall and CPU, ring wall and CPU, fan wall and CPU: seconds */
  for (int i = 0; i < q->m && at < sizeof extra; i++)
    at += (size_t)snprintf(extra + at, sizeof extra - at, "%s[%.0f, %.4e, %.4e, %.4e, %.4e, %.4e, %.4e]", i ? ", " : "", q->n[i],
                           q->pair_wall[i], q->pair_cpu[i], q->ring_wall[i], q->ring_cpu[i], q->fan_wall[i], q->fan_cpu[i]);
  if (at < sizeof extra) snprintf(extra + at, sizeof extra - at, "]}");
  if (out_path && tdm_sim_cluster_save(out_path, &k, extra) != TDM_OK) {
    fprintf(stderr, "tandem simulate --calibrate: %s\n", tdm_last_error());
    return 1;
  }
  if (out_path) printf("wrote %s\n", out_path);
  return 0;
}

/* ---- the collectives' costs, per algorithm -------------------------------------------------------- */
static void collectives(const tdm_sim_cluster *k, const int *ranks, int nr, int64_t lo, int64_t hi, int json, int b2b) {
  if (!json) printf("%8s %10s %6s %12s\n", "ranks", "bytes", "algo", b2b ? "back to back" : "all-reduce");
  for (int i = 0; i < nr; i++)
    for (int64_t n = lo; n <= hi; n *= 2)
      for (int a = 1; a < TDM_SIM_ALGO_COUNT; a++) {
        double t = (b2b ? tdm_sim_coll_cost_repeated : tdm_sim_coll_cost)(k, a, TDM_SIM_ALLREDUCE, (double)n, ranks[i]);
        if (t < 0) continue;
        if (json)
          printf("{\"ranks\":%d,\"bytes\":%lld,\"algo\":\"%s\",\"allreduce_s\":%.6e}\n", ranks[i], (long long)n, tdm_sim_algo_name(a), t);
        else
          printf("%8d %10lld %6s %10.3f ms\n", ranks[i], (long long)n, tdm_sim_algo_name(a), t * 1e3);
      }
}

typedef struct {
  tdm_train_config c;
  const char *ranks_s, *cluster, *out, *algo_s, *vary, *html, *svg;
  int64_t ppn, cores, calib_max, lo, hi, steps;
  double intra_lat, intra_bw, inter_lat, inter_bw, reduce_bw, flops, orate;
  int do_calib, json, coll, no_compute, b2b;
} sim_opts;

/* 0, 1 (--help printed) or 2 (a usage error, printed). */
static int parse_opts(int argc, char **argv, sim_opts *o) {
  memset(o, 0, sizeof *o);
  cli_opt extra[] = {
      {"ranks", CLI_STRING, &o->ranks_s, "1,2,4,8,64,1024", "world sizes to predict, comma-separated", NULL, 0, 0, 0},
      {"cluster", CLI_STRING, &o->cluster, NULL, "the cluster file (tandem simulate --calibrate -o writes one; docs/simulator.md)", NULL, 0, 0, 0},
      {"ranks-per-node", CLI_INT, &o->ppn, "0", "ranks on one node (0: the cluster file's, else 8)", NULL, 0, 1 << 20, 0},
      {"cores-per-node", CLI_INT, &o->cores, "-1", "cores on one node: communication overlaps only with a core spare, compute slows past them (-1: the file's, else unlimited)", NULL, -1, 1 << 20, 0},
      {"intra-lat", CLI_FLOAT, &o->intra_lat, "-1", "latency inside a node, microseconds (-1: the file's, else 2)", NULL, -1, 1e9, 0},
      {"intra-bw", CLI_FLOAT, &o->intra_bw, "-1", "bandwidth inside a node, GB/s (-1: the file's, else 100)", NULL, -1, 1e9, 0},
      {"inter-lat", CLI_FLOAT, &o->inter_lat, "-1", "latency between nodes, microseconds (-1: the file's, else 10)", NULL, -1, 1e9, 0},
      {"inter-bw", CLI_FLOAT, &o->inter_bw, "-1", "bandwidth between nodes, GB/s (-1: the file's, else 12.5)", NULL, -1, 1e9, 0},
      {"reduce-bw", CLI_FLOAT, &o->reduce_bw, "-1", "rate of the reductions, GB/s of data reduced (gamma; -1: the file's, else 10)", NULL, -1, 1e9, 0},
      {"flops", CLI_FLOAT, &o->flops, "-1", "compute rate of one rank, FLOP/s (-1: the file's, else 1e12)", NULL, -1, 1e20, 0},
      {"optimizer-rate", CLI_FLOAT, &o->orate, "-1", "parameters the optimizer updates per second (-1: the file's, else 1e9)", NULL, -1, 1e20, 0},
      {"allreduce", CLI_CHOICE, &o->algo_s, "auto", "the data axis's all-reduce algorithm (auto: what tandem's engines run, direct or shm on a node, hier across nodes; another: a what-if)", "auto|ring|rd|rhd|tree|direct|shm|hier", 0, 0, 0},
      {"json", CLI_FLAG, &o->json, NULL, "one JSON object per line", NULL, 0, 0, 0},
      {"vary", CLI_STRING, &o->vary, NULL, "a study: predict once per value of another option, OPTION=V1,V2,... (like allreduce=ring,hier or bucket-mb=1,25,100; at most 10)", NULL, 0, 0, 0},
      {"html", CLI_STRING, &o->html, NULL, "write the study as a self-contained HTML page here: step time, efficiency and exposed communication against ranks, a line per configuration", NULL, 0, 0, 0},
      {"svg", CLI_STRING, &o->svg, NULL, "write the study's step time and efficiency plots as PREFIX-step.svg and PREFIX-efficiency.svg", NULL, 0, 0, 0},
      {"collectives", CLI_FLAG, &o->coll, NULL, "print every all-reduce algorithm's cost from --min-bytes to --max-bytes instead", NULL, 0, 0, 0},
      {"min-bytes", CLI_SIZE, &o->lo, "1K", "--collectives: the smallest size", NULL, 0, 0, 0},
      {"max-bytes", CLI_SIZE, &o->hi, "64M", "--collectives: the largest size", NULL, 0, 0, 0},
      {"back-to-back", CLI_FLAG, &o->b2b, NULL,
       "--collectives: each all-reduce repeated back to back, as tandem bench times them (the tree's leaves start the next while its root sends the last down)",
       NULL, 0, 0, 0},
      {"calibrate", CLI_FLAG, &o->do_calib, NULL, "measure the compute rate from this run's steps and the links of this transport (under tandem run -n N: every rank's step at once, the world's links; alone: one process, threads)", NULL, 0, 0, 0},
      {"o", CLI_STRING, &o->out, NULL, "--calibrate: write the cluster file here", NULL, 0, 0, 0},
      {"calibrate-max", CLI_SIZE, &o->calib_max, "4M", "--calibrate: the largest message timed", NULL, 0, 0, 0},
      {"calibrate-steps", CLI_INT, &o->steps, "10", "--calibrate: training steps timed for the compute rate", NULL, 4, 10000, 0},
      {"no-compute", CLI_FLAG, &o->no_compute, NULL, "--calibrate: the links only (keep --cluster's compute)", NULL, 0, 0, 0},
  };
  int r = train_options("simulate",
                        "[tandem train's options] [--ranks 8,64,1024] [--cluster FILE | --ranks-per-node N --intra-lat US ...] "
                        "[--vary OPTION=V1,V2 --html FILE --svg PREFIX] [--calibrate -o FILE]",
                        argc, argv, &o->c, (int)(sizeof extra / sizeof extra[0]), extra);
  return r == 1 ? 1 : r ? 2 : 0;
}

/* The cluster the options describe: the file's, the options over it. 0 or 2 (printed). */
static int make_cluster(const sim_opts *o, tdm_sim_cluster *k) {
  tdm_sim_cluster_default(k);
  if (o->cluster && tdm_sim_cluster_load(o->cluster, k) != TDM_OK) {
    fprintf(stderr, "tandem simulate: --cluster: %s\n", tdm_last_error());
    return 2;
  }
  if (o->ppn > 0) k->ranks_per_node = (int)o->ppn;
  if (o->cores >= 0) k->cores_per_node = (int)o->cores;
  if (o->c.threads > 0) k->threads = o->c.threads;
  if (o->intra_lat >= 0) k->intra.alpha = o->intra_lat * 1e-6;
  if (o->inter_lat >= 0) k->inter.alpha = o->inter_lat * 1e-6;
  const double *bw[2] = {&o->intra_bw, &o->inter_bw};
  tdm_sim_link *lk[2] = {&k->intra, &k->inter};
  for (int i = 0; i < 2; i++)
    if (*bw[i] >= 0) {
      if (!(*bw[i] > 0)) {
        fprintf(stderr, "tandem simulate: --%s-bw 0: expected a bandwidth > 0 GB/s\n", i ? "inter" : "intra");
        return 2;
      }
      lk[i]->beta = 1e-9 / *bw[i];
    }
  if (o->reduce_bw == 0) {
    fprintf(stderr, "tandem simulate: --reduce-bw 0: expected a rate > 0 GB/s\n");
    return 2;
  }
  if (o->reduce_bw > 0) k->intra.gamma = k->inter.gamma = 1e-9 / o->reduce_bw;
  if (o->flops >= 0) k->flops = o->flops;
  k->allreduce_algo = tdm_sim_algo_parse(o->algo_s);
  if (o->orate >= 0) k->optim_rate = o->orate;
  if (tdm_sim_cluster_check(k, o->cluster ? o->cluster : "the options") != TDM_OK) {
    fprintf(stderr, "tandem simulate: %s\n", tdm_last_error());
    return 2;
  }
  return 0;
}

static void cluster_line(const tdm_sim_cluster *k, char *b, size_t n) {
  snprintf(b, n, "cluster: %d ranks/node, %d cores/node%s, intra %.3g us %.3g GB/s, inter %.3g us %.3g GB/s, %.3g FLOP/s per rank%s%s",
           k->ranks_per_node, k->cores_per_node, k->cores_per_node ? "" : " (unlimited)", k->intra.alpha * 1e6,
           k->intra.beta > 0 ? 1e-9 / k->intra.beta : 0, k->inter.alpha * 1e6, k->inter.beta > 0 ? 1e-9 / k->inter.beta : 0, k->flops,
           *k->compute_model ? " measured on " : "", k->compute_model);
}

/* The step at every world size of one configuration, printed and kept in cv. label: the
 * configuration's name in a study ("" alone). 0, or 1 (printed). */
static int predict(const sim_opts *o, const tdm_sim_cluster *k, const int *ranks, int nr, const char *label, sim_curve *cv) {
  memset(cv, 0, sizeof *cv);
  snprintf(cv->name, sizeof cv->name, "%s", label);
  cluster_line(k, cv->cluster, sizeof cv->cluster);
  if (!o->json) printf("%s%s%s\n", *label ? label : "", *label ? ": " : "", cv->cluster);
  int header = 0;
  for (int i = 0; i < nr; i++) {
    tdm_plan plan;
    tdm_plan_config pc;
    tdm_sim_model *m = NULL;
    tdm_sim_result res;
    tdm_status st = tdm_train_plan_config(&o->c, ranks[i], &plan, &pc);
    if (st == TDM_OK) st = tdm_sim_model_create(&m, &pc);
    if (st == TDM_OK) st = tdm_sim_step(m, k, ranks[i], &res);
    int64_t np = tdm_sim_model_params(m);
    tdm_sim_model_destroy(m);
    if (st != TDM_OK) {
      fprintf(stderr, "tandem simulate: %s%s%d ranks: %s\n", label, *label ? ": " : "", ranks[i], tdm_last_error());
      return 1;
    }
    cv->ranks[cv->n] = res.ranks, cv->step[cv->n] = res.step, cv->compute[cv->n] = res.compute, cv->comm[cv->n] = res.comm;
    cv->exposed[cv->n] = res.exposed, cv->efficiency[cv->n] = res.efficiency;
    cv->n++;
    if (o->json) {
      printf("{%s%s%s\"ranks\":%d,\"dp\":%d,\"tp\":%d,\"pp\":%d,\"params\":%lld,\"step_s\":%.6e,\"compute_s\":%.6e,\"comm_s\":%.6e,"
             "\"exposed_s\":%.6e,\"efficiency\":%.4f,\"bytes_per_rank\":%.0f,\"groups\":%d,\"algo\":\"%s\"}\n",
             *label ? "\"config\":\"" : "", label, *label ? "\"," : "", res.ranks, res.dp, res.tp, res.pp, (long long)np, res.step,
             res.compute, res.comm, res.exposed, res.efficiency, res.bytes, res.buckets, tdm_sim_algo_name(res.algo));
      continue;
    }
    if (!header++)
      printf("%-7s %-10s %12s %12s %12s %12s %10s %12s %7s\n", "ranks", "dp x tp x pp", "step", "compute", "comm", "exposed",
             "efficiency", "bytes/rank", "algo");
    char grid[32];
    snprintf(grid, sizeof grid, "%dx%dx%d", res.dp, res.tp, res.pp);
    printf("%-7d %-10s %9.3f ms %9.3f ms %9.3f ms %9.3f ms %9.1f%% %12.3g %7s\n", res.ranks, grid, res.step * 1e3, res.compute * 1e3,
           res.comm * 1e3, res.exposed * 1e3, res.efficiency * 100, res.bytes, tdm_sim_algo_name(res.algo));
  }
  return 0;
}

/* --vary OPTION=V1,V2,...: the option's name and its values (pointers into buf). 0 or 2 (printed). */
static int parse_vary(const char *s, char *buf, size_t n, const char **opt, const char **vals, int *nv) {
  *nv = 0;
  const char *eq = s ? strchr(s, '=') : NULL;
  if (!s || strlen(s) >= n || !eq || eq == s || !eq[1] || s[strlen(s) - 1] == ',') goto bad;
  memcpy(buf, s, strlen(s) + 1);
  char *v = buf + (eq - s);
  *v++ = 0;
  *opt = buf[0] == '-' ? buf + strspn(buf, "-") : buf;
  for (char *p = v; p;) {
    char *comma = strchr(p, ',');
    if (comma) *comma = 0;
    if (!*p || *nv == SIM_MAX_CURVES) goto bad;
    vals[(*nv)++] = p;
    p = comma ? comma + 1 : NULL;
  }
  if (**opt) return 0;
bad:
  fprintf(stderr, "tandem simulate: --vary '%s': expected OPTION=V1,V2,... (an option of tandem simulate or tandem train and up to %d "
                  "values, like allreduce=ring,hier or bucket-mb=1,25,100)\n", s ? s : "", SIM_MAX_CURVES);
  return 2;
}

int tool_simulate(int argc, char **argv) {
  sim_opts o;
  int r = parse_opts(argc, argv, &o);
  if (r == 1) return 0;
  if (r) return 2;
  int ranks[MAX_RANKS], nr = 0;
  if (parse_ranks(o.ranks_s, ranks, &nr)) return 2;
  if ((o.vary || o.html || o.svg) && (o.do_calib || o.coll)) {
    fprintf(stderr, "tandem simulate: --%s draws a study of step times: not with --%s\n", o.vary ? "vary" : o.html ? "html" : "svg",
            o.do_calib ? "calibrate" : "collectives");
    return 2;
  }
  if (o.b2b && !o.coll) {
    fprintf(stderr, "tandem simulate: --back-to-back times the collectives' table: give it with --collectives\n");
    return 2;
  }
  /* the files it will write, before the minutes of measuring or predicting: a path that cannot be
   * written fails now */
  char svg_path[4200];
  const char *outs[4] = {o.do_calib ? o.out : NULL, o.html, NULL, NULL};
  if (o.svg) {
    snprintf(svg_path, sizeof svg_path, "%s-step.svg", o.svg);
    outs[2] = svg_path;
  }
  for (int i = 0; i < 3; i++)
    if (outs[i] && tdm_safetensors_check_writable(outs[i]) != TDM_OK) { /* (any file: the check is the writer's) */
      fprintf(stderr, "tandem simulate: %s: %s\n", i == 0 ? "-o" : i == 1 ? "--html" : "--svg", tdm_last_error());
      return 2;
    }
  if (o.do_calib) return calibrate(&o.c, o.out, o.cluster, o.calib_max, (int)o.ppn, (int)o.steps, !o.no_compute);
  if (o.out) {
    fprintf(stderr, "tandem simulate: -o writes a calibrated cluster file: give it with --calibrate\n");
    return 2;
  }
  tdm_sim_cluster k;
  if (make_cluster(&o, &k)) return 2;
  if (o.coll) {
    if (o.lo < 1 || o.hi < o.lo) {
      fprintf(stderr, "tandem simulate: --min-bytes %lld --max-bytes %lld; expected 1 <= min <= max\n", (long long)o.lo, (long long)o.hi);
      return 2;
    }
    collectives(&k, ranks, nr, o.lo, o.hi, o.json, o.b2b);
    return 0;
  }
  static sim_curve curves[SIM_MAX_CURVES];
  int ncurves = 0;
  if (!o.vary) {
    if (predict(&o, &k, ranks, nr, "", &curves[0])) return 1;
    ncurves = 1;
  } else { /* each value: the same command with --OPTION=VALUE last (the last of an option counts) */
    char buf[1024], label[96];
    const char *opt = NULL, *vals[SIM_MAX_CURVES];
    if (parse_vary(o.vary, buf, sizeof buf, &opt, vals, &ncurves)) return 2;
    /* every value parsed and checked before the first is predicted: a bad last value fails at once */
    static sim_opts ov[SIM_MAX_CURVES];
    static tdm_sim_cluster kv[SIM_MAX_CURVES];
    static char arg[SIM_MAX_CURVES][1100];
    char **av = malloc(sizeof(char *) * (size_t)(argc + 1) * (size_t)ncurves);
    if (!av) return 1;
    for (int v = 0; v < ncurves; v++) {
      char **a = av + (size_t)v * (size_t)(argc + 1); /* the options keep pointers into their arguments */
      memcpy(a, argv, sizeof(char *) * (size_t)argc);
      snprintf(arg[v], sizeof arg[v], "--%s=%s", opt, vals[v]);
      a[argc] = arg[v];
      int rc = parse_opts(argc + 1, a, &ov[v]);
      if (rc == 0) rc = make_cluster(&ov[v], &kv[v]);
      if (rc) {
        fprintf(stderr, "tandem simulate: --vary %s: the value %s failed (above)\n", opt, vals[v]);
        free(av);
        return 2;
      }
    }
    for (int v = 0; v < ncurves; v++) {
      snprintf(label, sizeof label, "%s %s", opt, vals[v]);
      if (predict(&ov[v], &kv[v], ranks, nr, label, &curves[v])) {
        fprintf(stderr, "tandem simulate: --vary %s: the value %s failed (above)\n", opt, vals[v]);
        free(av);
        return 1;
      }
    }
    free(av);
  }
  if (!o.html && !o.svg) return 0;
  char command[2048] = "tandem simulate";
  size_t at = strlen(command);
  for (int i = 0; i < argc && at < sizeof command; i++) at += (size_t)snprintf(command + at, sizeof command - at, " %s", argv[i]);
  sim_study st = {command, curves, ncurves};
  if (o.html) {
    if (simulate_write_html(o.html, &st)) return 1;
    printf("wrote %s\n", o.html);
  }
  if (o.svg && simulate_write_svg(o.svg, &st)) return 1;
  return 0;
}
