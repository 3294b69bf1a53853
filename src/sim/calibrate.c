/* Calibration: a communicator's links from timed exchanges (the wire from a pair's wall time less
 * its CPU time, the CPU work of a message from every rank's CPU time, the cores the ranks get
 * from a busy loop on all of them at once), gamma from the reduction kernel the algorithms use,
 * and the all-reduce measurements the validation compares the costs with. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "sim/sim_impl.h"

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every timed exchange runs at most this many times (the calibration asks for 7-40). */
#define MAX_ITERS 64

/* One exchange of n bytes, iters times, as every step of the algorithms runs: ring (all ranks at
 * once) each rank sends to the next while it receives from the one before, so ranks that share
 * cores and links (and wait on each other) are measured as they will run; pair: ranks 0 and 1
 * exchange with each other while the rest wait. wall: the median time of rank 0's exchange, cpu: the
 * median CPU time of this rank's thread per exchange (its share of sending and receiving one
 * message). Medians, as the validation's tandem bench measures: a burst of other work on a shared
 * machine moves a mean of a few exchanges by 2-4x. Ranks outside the pair return 0s. */
static tdm_status exchange(tdm_comm_t c, char *s, char *r, size_t n, int iters, int pair, double *wall, double *cpu) {
  int me = tdm_comm_rank(c), P = tdm_comm_size(c);
  *wall = *cpu = 0;
  if (pair && me > 1) return TDM_OK;
  int to = pair ? 1 - me : (me + 1) % P, from = pair ? 1 - me : (me + P - 1) % P;
  double w[MAX_ITERS], u[MAX_ITERS];
  for (int i = -2; i < iters; i++) {
    double t0 = tdm_time_now(), c0 = cpu_now();
    TDM__TRY(tdm_comm_sendrecv(c, to, s, n, from, r, n, 5));
    if (i >= 0) w[i] = tdm_time_now() - t0, u[i] = cpu_now() - c0;
  }
  *wall = tdm_median(w, iters), *cpu = tdm_median(u, iters);
  return TDM_OK;
}

/* The fan exchange: every rank sends n bytes to every other rank while receiving n from each, as
 * direct's exchanges do (its all-gather is one such exchange); wall: the median over exchanges of
 * the slowest rank's time, as tandem bench times a collective (ranks crowding the cores finish a
 * fan exchange milliseconds apart: at 8 ranks on 2 cores, 1 MiB to each of 7 peers, rank 0's
 * median 19.6 ms, the slowest's 20-25), cpu as exchange(). */
static tdm_status fan_exchange(tdm_comm_t c, const char *s, char *all, size_t n, int iters, double *wall, double *cpu) {
  double w[MAX_ITERS], u[MAX_ITERS];
  for (int i = -2; i < iters; i++) {
    double t0 = tdm_time_now(), c0 = cpu_now();
    TDM__TRY(tdm_comm_allgather(c, s, all, n, TDM_U8, TDM_ALGO_DIRECT));
    if (i >= 0) w[i] = tdm_time_now() - t0, u[i] = cpu_now() - c0;
  }
  TDM__TRY(tdm_comm_allreduce(c, w, w, (size_t)iters, TDM_F64, TDM_MAX, TDM_ALGO_AUTO));
  *wall = tdm_median(w, iters), *cpu = tdm_median(u, iters);
  return TDM_OK;
}

/* The cores the ranks get between them when all are busy at once: every rank reduces a small
 * buffer for 100 ms of wall time, and its CPU time over the middle 60 ms is the share of a core it
 * got. The margins keep every window inside the time all ranks are busy: released from one
 * barrier, ranks crowding the cores start milliseconds apart, and a rank's whole run measured
 * alone counts the cores it had to itself while the others had not started or had finished
 * (8 ranks on 2 cores summed to 2.4). */
static double busy_share(float *a, float *b, size_t n) {
  double t0 = tdm_time_now(), c0 = 0, w0 = 0, c1 = 0, w1 = 0, t;
  do {
    tdm_reduce_local(a, b, n, TDM_F32, TDM_SUM);
    t = tdm_time_now() - t0;
    if (!w0 && t >= 0.02) w0 = t, c0 = cpu_now();
    if (!w1 && t >= 0.08) w1 = t, c1 = cpu_now();
  } while (t < 0.1);
  return w1 > w0 ? (c1 - c0) / (w1 - w0) : 0;
}

/* Ping-pong: rank 0 sends 8 bytes, rank 1 answers; rank 0's median of half the round trip after
 * 50 round trips. The one-way time is bimodal on this VM (over 100us,1gbps: 205-215 us or
 * 280-340), and what decides the mode is what the cores did just before (the host's halt polling
 * follows the recent wake-ups): bursts run right after the calibration's exchanges met the fast
 * mode, bursts after start-up or after its busy loop and reduction timing the slow one (5 of 5
 * calibrations at 2 ranks: 295-342, 210-265, 210-234, 297-342 us). Training and the validation's
 * runs meet both, from one second to the next (the tree's 1 KiB all-reduce at 3 ranks met the fast
 * mode, its 4 KiB the slow one, a few hundred ms apart), so the calibration spreads its bursts over
 * its run and takes their mean: a point that meets either mode is off by half the gap, not all of
 * it. Ranks other than 0 and 1 return at once (*one_way 0). */
#define PP_BURSTS 4
_Static_assert(PP_BURSTS == sizeof(((tdm_sim_calibration *)0)->pingpong_bursts) / sizeof(double), "the bursts' slots");
static tdm_status pingpong(tdm_comm_t c, const char *s, char *r, double *one_way) {
  int me = tdm_comm_rank(c);
  double pp[21];
  *one_way = 0;
  if (me > 1) return TDM_OK;
  for (int i = -50; i < 21; i++) {
    double t0 = tdm_time_now();
    if (me == 0) {
      TDM__TRY(tdm_comm_send(c, 1, 7, s, 8));
      TDM__TRY(tdm_comm_recv(c, 1, 7, r, 8));
    } else {
      TDM__TRY(tdm_comm_recv(c, 0, 7, r, 8));
      TDM__TRY(tdm_comm_send(c, 0, 7, s, 8));
    }
    if (i >= 0) pp[i] = (tdm_time_now() - t0) / 2;
  }
  *one_way = tdm_median(pp, 21);
  return TDM_OK;
}

/* A collective handed to the communication thread and waited for, as the engines send their
 * buckets (tdm_comm_iallreduce, tdm_work_wait), against the blocking call of the same size: the
 * waiting thread's wake-up when the work is done, and the hand-over (bench/async_wait: 0.1-0.3 ms
 * on the development VM over an emulated link). Alternating runs at 256 KiB and 1 MiB (or
 * max_bytes), the two sizes' differences of medians averaged, never below 0; buf: max_bytes of zeros. */
enum { HANDOFF_ITERS = 15 };
static tdm_status handoff(tdm_comm_t c, float *buf, size_t max_bytes, double *out) {
  const size_t sizes[2] = {(size_t)256 << 10, (size_t)1 << 20};
  double diff = 0;
  for (int k = 0; k < 2; k++) {
    size_t n = (sizes[k] < max_bytes ? sizes[k] : max_bytes) / 4;
    double b[HANDOFF_ITERS], a[HANDOFF_ITERS];
    for (int i = -2; i < HANDOFF_ITERS; i++) {
      double t0 = tdm_time_now();
      TDM__TRY(tdm_comm_allreduce(c, buf, buf, n, TDM_F32, TDM_AVG, TDM_ALGO_AUTO));
      double t1 = tdm_time_now();
      tdm_work_t w;
      TDM__TRY(tdm_comm_iallreduce(c, buf, buf, n, TDM_F32, TDM_AVG, TDM_ALGO_AUTO, &w));
      TDM__TRY(tdm_work_wait(w));
      if (i >= 0) b[i] = t1 - t0, a[i] = tdm_time_now() - t1;
    }
    diff += (tdm_median(a, HANDOFF_ITERS) - tdm_median(b, HANDOFF_ITERS)) / 2;
  }
  *out = diff > 0 ? diff : 0;
  return TDM_OK;
}

/* Weighted least squares of y = a + n b with weights 1/y^2 (the relative error), a and b >= 0. */
static void fit(const double *n, const double *y, int m, double *a, double *b) {
  double sw = 0, swn = 0, swnn = 0, swt = 0, swnt = 0;
  for (int i = 0; i < m; i++) {
    if (!(y[i] > 0)) continue;
    double w = 1 / (y[i] * y[i]);
    sw += w, swn += w * n[i], swnn += w * n[i] * n[i], swt += w * y[i], swnt += w * n[i] * y[i];
  }
  double det = sw * swnn - swn * swn;
  *a = det != 0 ? (swt * swnn - swn * swnt) / det : 0;
  *b = det != 0 ? (sw * swnt - swn * swt) / det : 0;
  if (*a < 0) *a = 0;
  if (*b < 0) *b = 0;
}

tdm_status tdm__sim_fit_link(const tdm_sim_calib_points *pt, int ranks, int ranks_per_node, tdm_sim_calibration *out) {
  if (!pt || !out || pt->m < 2 || pt->m > TDM_SIM_CALIB_POINTS || ranks < 2)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "calibrate: %d sizes measured over %d ranks; expected 2..%d sizes and 2 or more ranks",
                          pt ? pt->m : 0, ranks, TDM_SIM_CALIB_POINTS);
  double wire[TDM_SIM_CALIB_POINTS], n2[2 * TDM_SIM_CALIB_POINTS], c2[2 * TDM_SIM_CALIB_POINTS];
  for (int i = 0; i < pt->m; i++) {
    wire[i] = pt->pair_wall[i] - pt->pair_cpu[i]; /* what the pair waited for: the wire */
    n2[2 * i] = n2[2 * i + 1] = pt->n[i], c2[2 * i] = pt->pair_cpu[i], c2[2 * i + 1] = pt->ring_cpu[i];
  }
  tdm_sim_link *l = &out->link;
  fit(pt->n, wire, pt->m, &l->alpha, &l->beta);
  /* the CPU work from the sizes whose copies fit the L2 (up to half of it, at least 2 sizes), the
   * rest as a factor on its per-byte part: the copies of larger messages run from the slower
   * caches (tdm__sim_big_share says how much of a message does) */
  tdm_sim_link probe;
  memset(&probe, 0, sizeof probe);
  probe.big_bytes = pt->cache;
  int fanout = ranks > 2 ? ranks - 1 : 1, small = 0;
  while (small < pt->m && tdm__sim_big_share(&probe, pt->n[small]) == 0) small++;
  if (small < 2) small = pt->m;
  fit(n2, c2, 2 * small, &l->cpu_alpha, &l->cpu_beta);
  double f[TDM_SIM_CALIB_POINTS];
  l->fan_alpha = l->fan_beta = 0;
  /* ranks crowding the cores: the fan exchange's wall time beyond its wire is their work over
   * the cores, and where that is more than the threads' clocks counted, it is taken: the kernel
   * work of many streams at once (loopback's receive processing in softirq context) is charged
   * to no rank's thread (8 ranks on 2 cores, 8 MiB to each of 7 peers: 3.3 ms a message counted,
   * 4.4 ms in the wall time; at 8 bytes the two agree within 10%). The wire: one message's, as on
   * TANDEM_NET_EMULATE's pairwise links and loopback (where it is small beside the work) */
  int active = ranks_per_node > 0 && ranks_per_node < ranks ? ranks_per_node : ranks;
  double crowd = out->cpu_cores > 0 && active > out->cpu_cores ? out->cpu_cores / active : 0;
  if (ranks > 2) { /* per message: the exchange moves ranks - 1 each way */
    for (int i = 0; i < pt->m; i++) {
      double counted = pt->fan_cpu[i] / fanout, walled = crowd * (pt->fan_wall[i] - (l->alpha + pt->n[i] * l->beta)) / fanout;
      f[i] = walled > counted ? walled : counted;
    }
    fit(pt->n, f, small, &l->fan_alpha, &l->fan_beta);
  }
  /* the factors: each exchange's excess over its line, against the line's per-byte part of the
   * share beyond the L2 (sizes at least half beyond it: nearer the edge the share is a guess);
   * the pair's and ring's together, the fan's apart (its p - 1 streams at once: at 8 ranks on 2
   * cores 2.4x where the one-peer exchanges' was 2.1x) */
  l->big_bytes = small < pt->m ? pt->cache : 0, l->big_factor = 1, l->fan_big_factor = 0;
  double ratio[2] = {0, 0};
  int k[2] = {0, 0};
  for (int i = small; i < pt->m; i++) {
    double share = tdm__sim_big_share(&probe, pt->n[i]), got[3] = {pt->pair_cpu[i], pt->ring_cpu[i], ranks > 2 ? f[i] : 0};
    if (share < 0.5) continue;
    for (int j = 0; j < 3; j++) {
      double a = j < 2 ? l->cpu_alpha : l->fan_alpha, b = j < 2 ? l->cpu_beta : l->fan_beta;
      if (got[j] > 0 && b > 0) ratio[j == 2] += 1 + (got[j] - a - pt->n[i] * b) / (share * pt->n[i] * b), k[j == 2]++;
    }
  }
  if (k[0] && ratio[0] / k[0] > 1) l->big_factor = ratio[0] / k[0];
  if (k[1]) l->fan_big_factor = ratio[1] / k[1] > 1 ? ratio[1] / k[1] : 1;
  fit(pt->n, pt->ring_wall, pt->m, &out->ring_alpha, &out->ring_beta);
  /* a lone message's receiver sleeps in poll until it arrives: the ping-pong pays its wake-up, an
   * exchange does not. On a core of its own the fastest burst's (the steady state of a collective
   * repeated), on cores shared the mean's (either mode) */
  double lone = l->alpha + 8 * l->beta + 0.5 * (l->cpu_alpha + 8 * l->cpu_beta), fast = out->pingpong;
  for (int b = 0; b < out->n_bursts && b < PP_BURSTS; b++)
    if (out->pingpong_bursts[b] > 0 && out->pingpong_bursts[b] < fast) fast = out->pingpong_bursts[b];
  l->wake = fast > lone ? fast - lone : 0;
  l->wake_shared = out->pingpong > lone ? out->pingpong - lone : 0;
  /* stagger: how much of the crowded cores' excess hides under the other ranks' wire, from the
   * ring exchange's wall time (every rank at once), between the step in lockstep (t1) and fully
   * staggered (t0): least squares in relative terms, as the other fits. At 8 ranks on 2 cores
   * 0.3-0.8 (the ranks drift apart), 2 ranks on 2 cores none to fit (no excess) */
  tdm_sim_cluster k1;
  memset(&k1, 0, sizeof k1);
  k1.cpu_cores = out->cpu_cores;
  double num = 0, den = 0;
  for (int i = 0; i < pt->m; i++) {
    if (!(pt->ring_wall[i] > 0)) continue;
    tdm_sim_link lk = *l;
    lk.stagger = 0;
    double t1 = tdm__sim_step(&k1, &lk, pt->n[i], 1, 1, 1, 1, 0, active);
    lk.stagger = 1;
    double t0 = tdm__sim_step(&k1, &lk, pt->n[i], 1, 1, 1, 1, 0, active), w = 1 / (pt->ring_wall[i] * pt->ring_wall[i]);
    num += w * (t1 - pt->ring_wall[i]) * (t1 - t0), den += w * (t1 - t0) * (t1 - t0);
  }
  l->stagger = den > 0 ? num / den : 0;
  l->stagger = l->stagger < 0 ? 0 : l->stagger > 1 ? 1 : l->stagger;
  /* the model against the ring exchange, whose wall time no fit above used but stagger's one number */
  double sum = 0, most = 0;
  for (int i = 0; i < pt->m; i++) {
    double t = tdm__sim_step(&k1, l, pt->n[i], 1, 1, 1, 1, 0, active); /* one exchange, every rank at once */
    double e = pt->ring_wall[i] > 0 ? fabs(t - pt->ring_wall[i]) / pt->ring_wall[i] : 0;
    sum += e, most = e > most ? e : most;
  }
  out->check_mean = sum / pt->m, out->check_max = most;
  return TDM_OK;
}

tdm_status tdm_sim_calibrate_link(tdm_comm_t c, size_t max_bytes, int ranks_per_node, tdm_sim_calibration *out) {
  if (!c || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "calibrate: NULL argument");
  int P = tdm_comm_size(c);
  if (P < 2) return tdm__set_error(TDM_ERR_INVALID_ARG, "calibrate: %d rank; expected 2 or more", P);
  if (max_bytes < 4096) max_bytes = 4096;
  /* the fan exchange receives P blocks: up to 64 MiB of them (larger sizes are not measured, their
   * fan points stay 0 and no fit uses them) */
  size_t fan_max = P > 2 ? ((size_t)64 << 20) / (size_t)P : 0;
  if (fan_max > max_bytes) fan_max = max_bytes;
  char *s = tdm__malloc(max_bytes), *r = tdm__malloc(max_bytes), *all = fan_max ? tdm__malloc(fan_max * (size_t)P) : NULL;
  if (!s || !r || (fan_max && !all)) {
    tdm__free(s), tdm__free(r), tdm__free(all);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "calibrate: out of memory");
  }
  memset(s, 1, max_bytes);
  int me = tdm_comm_rank(c), local = ranks_per_node > 0 && ranks_per_node < P ? ranks_per_node : P;
  tdm_sim_calib_points pt;
  memset(&pt, 0, sizeof pt);
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  pt.cache = l2 > 0 ? (double)l2 : 0;
  tdm_status st = tdm_comm_barrier(c);
  /* 8 B, 32 B, ... x4 up to max_bytes, and the L2's own size: the first a message's copies no
   * longer fit (and the algorithms' 1 MiB chunks on this machine), where the cost per byte steps */
  size_t sizes[TDM_SIM_CALIB_POINTS];
  int ns = 0;
  for (size_t n = 8; n <= max_bytes && ns < TDM_SIM_CALIB_POINTS; n *= 4) sizes[ns++] = n;
  if (l2 > 8 && (size_t)l2 <= max_bytes && ns < TDM_SIM_CALIB_POINTS) { /* in its place, unless the series has it */
    int at = ns;
    while (at > 0 && sizes[at - 1] > (size_t)l2) at--;
    if (sizes[at - 1] != (size_t)l2) {
      memmove(sizes + at + 1, sizes + at, sizeof *sizes * (size_t)(ns - at));
      sizes[at] = (size_t)l2, ns++;
    }
  }
  double pp[PP_BURSTS] = {0};
  int npp = 0;
  for (int si = 0; st == TDM_OK && si < ns; si++) {
    size_t n = sizes[si];
    /* the first PP_BURSTS - 1 bursts at even steps through the sizes, the last after them */
    if (npp < PP_BURSTS - 1 && si * (PP_BURSTS - 1) >= npp * ns) {
      st = pingpong(c, s, r, &pp[npp++]);
      if (st == TDM_OK) st = tdm_comm_barrier(c);
      if (st != TDM_OK) break;
    }
    int iters = n <= 65536 ? 40 : n <= 1048576 ? 15 : 7, i = pt.m;
    double v[6] = {0, 0, 0, 0, 0, 0};
    st = exchange(c, s, r, n, iters, 1, &v[0], &v[1]);
    if (st == TDM_OK) st = tdm_comm_barrier(c);
    if (st == TDM_OK) st = exchange(c, s, r, n, iters, 0, &v[2], &v[3]);
    if (st == TDM_OK && n <= fan_max) st = tdm_comm_barrier(c);
    if (st == TDM_OK && n <= fan_max) st = fan_exchange(c, s, all, n, iters, &v[4], &v[5]);
    /* rank 0's wall times; the CPU times averaged over the ranks that took part */
    double sums[3] = {v[1], v[3], v[5]};
    if (st == TDM_OK) st = tdm_comm_allreduce(c, sums, sums, 3, TDM_F64, TDM_SUM, TDM_ALGO_AUTO);
    pt.n[i] = (double)n, pt.pair_wall[i] = v[0], pt.pair_cpu[i] = sums[0] / 2, pt.ring_wall[i] = v[2], pt.ring_cpu[i] = sums[1] / P;
    pt.fan_wall[i] = v[4], pt.fan_cpu[i] = sums[2] / P;
    pt.m++;
  }
  double hand = 0;
  if (st == TDM_OK) st = tdm_comm_barrier(c);
  if (st == TDM_OK) memset(r, 0, max_bytes), st = handoff(c, (float *)r, max_bytes, &hand);
  /* the cores: every rank busy at once; a rank that got less than 90% of a core was short of them */
  double share[2] = {0, 0};
  if (st == TDM_OK) st = tdm_comm_barrier(c);
  if (st == TDM_OK) share[0] = busy_share((float *)r, (float *)s, 1024), share[1] = -share[0];
  if (st == TDM_OK) st = tdm_comm_allreduce(c, share, share, 1, TDM_F64, TDM_SUM, TDM_ALGO_AUTO);
  if (st == TDM_OK) st = tdm_comm_allreduce(c, share + 1, share + 1, 1, TDM_F64, TDM_MAX, TDM_ALGO_AUTO);
  long hw = sysconf(_SC_NPROCESSORS_ONLN);
  double got = share[0] * local / P, least = -share[1];
  /* ranks that were not short of cores have the node's; none have more than it (what the clocks
   * count beyond it is the windows' skew) */
  double node = hw > 0 ? (double)hw : got;
  out->cpu_cores = least >= 0.9 || got > node ? node : got;
  double res[4] = {0, 0, 0, 0};
  if (st == TDM_OK && me == 0) { /* gamma: the reduction of 4 MiB of f32 into 4 MiB, as the algorithms reduce a received block */
    size_t nf = (max_bytes < (4u << 20) ? max_bytes : (4u << 20)) / 4;
    double g[9];
    for (int i = -1; i < 9; i++) {
      double t0 = tdm_time_now();
      tdm_reduce_local(r, s, nf, TDM_F32, TDM_SUM);
      if (i >= 0) g[i] = (tdm_time_now() - t0) / (double)(nf * 4);
    }
    res[0] = tdm_median(g, 9);
  }
  /* the last of the ping-pong's bursts (the others ran between the sizes) */
  if (st == TDM_OK) st = pingpong(c, s, r, &pp[npp++]);
  if (st == TDM_OK && me == 0) {
    for (int b = 0; b < npp; b++) res[1] += pp[b] / npp;
  }
  /* rank 0's measurements for everyone */
  tdm__free(all);
  const size_t nres = 2 + 7 * TDM_SIM_CALIB_POINTS + 1 + PP_BURSTS + 1 + 1;
  double *res0 = tdm__malloc(sizeof(double) * nres);
  if (st == TDM_OK && !res0) st = tdm__set_error(TDM_ERR_NO_MEMORY, "calibrate: out of memory");
  if (st == TDM_OK) {
    res0[0] = res[0], res0[1] = res[1];
    memcpy(res0 + 2, &pt.n, sizeof(double) * 7 * TDM_SIM_CALIB_POINTS);
    res0[2 + 7 * TDM_SIM_CALIB_POINTS] = pt.cache;
    memcpy(res0 + 3 + 7 * TDM_SIM_CALIB_POINTS, pp, sizeof pp), res0[nres - 2] = npp, res0[nres - 1] = hand;
    st = tdm_comm_broadcast(c, res0, nres, TDM_F64, 0, TDM_ALGO_AUTO);
    memcpy(&pt.n, res0 + 2, sizeof(double) * 7 * TDM_SIM_CALIB_POINTS);
    pt.cache = res0[2 + 7 * TDM_SIM_CALIB_POINTS];
    memcpy(pp, res0 + 3 + 7 * TDM_SIM_CALIB_POINTS, sizeof pp), npp = (int)res0[nres - 2], hand = res0[nres - 1];
  }
  tdm__free(s), tdm__free(r);
  if (st != TDM_OK) {
    tdm__free(res0);
    return st;
  }
  double cores = out->cpu_cores;
  memset(out, 0, sizeof *out);
  out->cpu_cores = cores, out->pingpong = res0[1], out->points = pt;
  memcpy(out->pingpong_bursts, pp, sizeof pp), out->n_bursts = npp;
  tdm__free(res0);
  TDM__TRY(tdm__sim_fit_link(&pt, P, local, out));
  out->link.gamma = res[0] > 0 ? res[0] : 0; /* after the fit, which sets the rest */
  out->link.handoff = hand;
  return TDM_OK;
}
