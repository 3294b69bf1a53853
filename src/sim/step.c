/* One optimizer step, simulated event by event on the critical rank (every data-parallel rank does
 * the same work, so one stands for all; a pipeline's stages are each simulated).
 *
 * Compute runs at the cluster's rate, divided among the tensor-parallel ranks and slowed when a
 * node's ranks x threads exceed its cores. Communication runs on one channel per rank, a
 * collective at a time, in the order the engine issues them, with the algorithms the engines ask
 * for (tdm_sim_engine_algo). When a core is spare (tandem's rule, tdm_spare_core: cores > threads x
 * ranks on the node) the channel runs beside compute, as the engines' communication thread does;
 * otherwise each collective holds compute up when it is issued: the training thread runs it
 * (src/parallel/common.c, tdm__inline_comm), or a communication thread that gets a core only when
 * the scheduler takes one from compute (src/parallel/dp.c over TCP). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "sim/sim_impl.h"

typedef struct {
  const tdm_sim_model *m;
  tdm_sim_cluster kd, kt; /* the data axis's view (ranks per node among data ranks), the tensor axis's */
  int D;
  double rate, orate;     /* FLOP/s per rank, optimizer elements/s */
  int overlap;            /* the channel runs beside compute (the communication thread) */
  int grads;              /* data parallelism's gradients: the engine's all-reduce may be hierarchical */
  double t, chan;         /* the training thread's clock, the channel's */
  double comm, bytes;     /* channel busy time, bytes sent */
  int big_algo;
  double big_n;
} sim;

/* Issues a collective of n bytes at the training thread's present time; returns its end. */
static double issue(sim *s, tdm_sim_kind kind, double n, double ready) {
  if (s->D < 2 || n <= 0) return ready;
  int algo = kind == TDM_SIM_ALLREDUCE && s->kd.allreduce_algo != TDM_ALGO_AUTO ? s->kd.allreduce_algo
                                                                                 : tdm_sim_engine_algo(&s->kd, kind, s->D, s->grads);
  double c = tdm_sim_coll_cost(&s->kd, algo, kind, n, s->D);
  if (c < 0) algo = TDM_ALGO_RING, c = tdm_sim_coll_cost(&s->kd, TDM_ALGO_RING, kind, n, s->D); /* where it cannot run */
  /* handed to the communication thread and waited for (all but the shared region's inline
   * averaging, which the training thread does itself when no core is spare: dp.c) */
  if (s->overlap || !s->kd.shm) c += (s->D <= s->kd.ranks_per_node ? s->kd.intra : s->kd.inter).handoff;
  s->comm += c;
  s->bytes += (kind == TDM_SIM_ALLREDUCE ? 2.0 : 1.0) * (s->D - 1) / s->D * n;
  if (n > s->big_n) s->big_n = n, s->big_algo = algo;
  if (!s->overlap) { /* the training thread runs it */
    double start = s->t > s->chan ? s->t : s->chan;
    s->t = s->chan = start + c;
    return s->t;
  }
  double start = ready > s->chan ? ready : s->chan;
  s->chan = start + c;
  return s->chan;
}

/* Data parallelism and ZeRO 1-2: backward frees gradients tensor by tensor, buckets go in order. */
static void buckets_step(sim *s, tdm_sim_model *m) {
  const tdm__layout *L = &m->L;
  int ng = L->ng;
  double fb = m->fwd_total / s->rate;
  s->t = (double)(m->accum - 1) * 3 * fb + fb; /* the first micro-batches reduce nothing (no_sync) */
  s->chan = s->t;
  int pending[ng > 0 ? ng : 1];
  for (int g = 0; g < ng; g++) pending[g] = L->g[g].n_params;
  int next = 0;
  tdm_sim_kind kind = m->stage ? TDM_SIM_REDUCE_SCATTER : TDM_SIM_ALLREDUCE;
  double wire = m->stage ? 4 : m->wire;
  s->t += 2 * m->head / s->rate; /* a tied head's backward comes first */
  m->n_times = ng;
  for (int i = m->n_t - 1; i >= 0; i--) {
    s->t += 2 * m->fwd[i] / s->rate;
    for (int k = 0; ng && k < L->n_of[i]; k++) pending[L->group_of[i] + k]--; /* a table's blocks: each its own bucket */
    while (!m->no_overlap && next < ng && pending[next] == 0) {
      double n = (double)(L->g[next].hi - L->g[next].lo) * wire / m->tp, before = s->overlap ? (s->t > s->chan ? s->t : s->chan) : s->t;
      double end = issue(s, kind, n, s->t);
      m->times[2 * next] = before, m->times[2 * next + 1] = end;
      next++;
    }
  }
  for (; next < ng; next++) { /* --no-overlap: all after backward */
    double n = (double)(L->g[next].hi - L->g[next].lo) * wire / m->tp, before = s->t > s->chan ? s->t : s->chan;
    double end = issue(s, kind, n, s->t);
    m->times[2 * next] = before, m->times[2 * next + 1] = end;
  }
  if (s->chan > s->t) s->t = s->chan; /* the optimizer waits for the last bucket */
  double owned = m->stage ? (double)m->n_params / s->D : (double)m->n_params;
  s->t += owned / m->tp / s->orate;
  if (m->stage) { /* every bucket's parameters gathered after the update */
    s->chan = s->t;
    int keep = s->overlap;
    s->overlap = 0;
    for (int g = 0; g < ng; g++) issue(s, TDM_SIM_ALLGATHER, (double)(L->g[g].hi - L->g[g].lo) * 4, s->t);
    s->overlap = keep;
  }
}

/* ZeRO 3: units gathered before forward and backward touch them (the next one ahead on the
 * channel when prefetching), at most two resident; each unit's gradients reduce-scattered after
 * its backward. */
static void units_step(sim *s, tdm_sim_model *m) {
  const tdm__layout *L = &m->L;
  int ng = L->ng;
  double uf[ng > 0 ? ng : 1];
  for (int g = 0; g < ng; g++) uf[g] = 0;
  for (int i = 0; i < m->n_t; i++) { /* a table's forward over its blocks by their sizes */
    int k0 = L->group_of[i], k1 = k0 + L->n_of[i] - 1;
    double all = (double)(L->g[k0].hi - L->g[k1].lo);
    for (int k = k0; k <= k1; k++) uf[k] += k0 == k1 ? m->fwd[i] : m->fwd[i] * (double)(L->g[k].hi - L->g[k].lo) / all;
  }
  uf[0] += m->head; /* the tied head: with the embedding's unit (the last in group order, the first in forward) */
  s->t = s->chan = 0;
  int pf = m->prefetch && s->overlap;
  m->n_times = 0;
  for (int mb = 0; mb < m->accum; mb++) {
    int last = mb == m->accum - 1;
    int resident[2] = {-1, -1};
    double got[ng > 0 ? ng : 1]; /* when each unit's gather ends (-1: not issued) */
    for (int pass = 0; pass < 2; pass++) {
      for (int g = 0; g < ng; g++) got[g] = -1;
      if (pass == 1) /* what forward left resident needs no gather */
        for (int j = 0; j < 2; j++)
          if (resident[j] >= 0) got[resident[j]] = s->t;
      for (int j = 0; j < ng; j++) {
        int u = pass == 0 ? ng - 1 - j : j, nx = pass == 0 ? u - 1 : u + 1;
        if (got[u] < 0) got[u] = issue(s, TDM_SIM_ALLGATHER, (double)(L->g[u].hi - L->g[u].lo) * 4, s->t);
        if (got[u] > s->t) s->t = got[u];
        if (pf && nx >= 0 && nx < ng && got[nx] < 0) got[nx] = issue(s, TDM_SIM_ALLGATHER, (double)(L->g[nx].hi - L->g[nx].lo) * 4, s->t);
        s->t += (pass ? 2 : 1) * uf[u] / s->rate;
        resident[0] = resident[1], resident[1] = u;
        if (pass == 1 && last) issue(s, TDM_SIM_REDUCE_SCATTER, (double)(L->g[u].hi - L->g[u].lo) * 4, s->t);
      }
    }
  }
  if (s->chan > s->t) s->t = s->chan;
  s->t += (double)m->n_params / s->D / s->orate;
}

/* A pipeline: the generator's lists, run against each other with each chunk's compute and the
 * messages' costs; sends go on the rank's channel, a receive waits for its message. Then the data
 * axis all-reduces each stage's gradients and the optimizer runs. */
static tdm_status pipeline_step(sim *s, const tdm_sim_model *m, const tdm_sim_cluster *k, double *busiest) {
  const tdm_pp_schedule *S = m->PL.s;
  int P = S->P, C = m->PL.C, M = S->M, stride = s->D * m->tp;
  size_t nmsg = (size_t)2 * (size_t)C * (size_t)M;
  double *arrive = tdm__malloc(sizeof(double) * nmsg), *clock = tdm__calloc((size_t)P, sizeof(double)),
         *chan = tdm__calloc((size_t)P, sizeof(double)), *busy = tdm__calloc((size_t)P, sizeof(double));
  int *at = tdm__calloc((size_t)P, sizeof(int));
  if (!arrive || !clock || !chan || !busy || !at) {
    tdm__free(arrive), tdm__free(clock), tdm__free(chan), tdm__free(busy), tdm__free(at);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
  }
  for (size_t i = 0; i < nmsg; i++) arrive[i] = -1;
#define MSG(kind, c, mb) arrive[((size_t)(kind) * (size_t)C + (size_t)(c)) * (size_t)M + (size_t)(mb)]
  int left = 0;
  double sent = 0; /* all stages' messages */
  for (int r = 0; r < P; r++) left += S->n[r];
  while (left > 0) {
    int moved = 0;
    for (int r = 0; r < P; r++) {
      while (at[r] < S->n[r]) {
        const tdm_pp_action *a = &S->a[r][at[r]];
        double f = a->chunk >= 0 ? m->chunk_fwd[a->chunk] / s->rate : 0, msg = m->act_bytes;
        double *slot = NULL;
        switch (a->op) {
        case TDM_PP_FORWARD: clock[r] += f, busy[r] += f; break;
        case TDM_PP_BACKWARD: clock[r] += 2 * f, busy[r] += 2 * f; break;
        case TDM_PP_BACKWARD_INPUT:
        case TDM_PP_BACKWARD_WEIGHT: clock[r] += f, busy[r] += f; break;
        case TDM_PP_SEND_ACT:
        case TDM_PP_SEND_GRAD: {
          int to = tdm_pp_chunk_rank(S, a->op == TDM_PP_SEND_ACT ? a->chunk + 1 : a->chunk - 1);
          double start = clock[r] > chan[r] ? clock[r] : chan[r];
          chan[r] = start + tdm_sim_p2p_cost(k, msg, r * stride, to * stride);
          MSG(a->op == TDM_PP_SEND_GRAD, a->chunk, a->mb) = chan[r];
          sent += msg;
          break;
        }
        case TDM_PP_RECV_ACT: slot = &MSG(0, a->chunk - 1, a->mb); break;
        case TDM_PP_RECV_GRAD: slot = &MSG(1, a->chunk + 1, a->mb); break;
        default: break; /* the optimizer: after the data axis's reduction, below */
        }
        if (slot) {
          if (*slot < 0) break; /* not sent yet: another rank first */
          if (*slot > clock[r]) clock[r] = *slot;
        }
        at[r]++, left--, moved = 1;
      }
    }
    if (!moved) break;
  }
#undef MSG
  s->bytes += sent / P;
  double end = 0, most = 0;
  for (int r = 0; r < P; r++) {
    double e = clock[r] > chan[r] ? clock[r] : chan[r];
    end = e > end ? e : end;
    most = busy[r] > most ? busy[r] : most;
  }
  tdm_status st = left > 0 ? tdm__set_error(TDM_ERR_INTERNAL, "simulate: the pipeline schedule did not complete (%d actions left)", left)
                           : TDM_OK;
  /* each stage's gradients over the data axis, then its optimizer: the stage with most parameters */
  int64_t stage_params = 0;
  for (int r = 0; r < P; r++) {
    int64_t n = 0;
    for (int c = r; c < C; c += P) n += m->chunk_params[c];
    stage_params = n > stage_params ? n : stage_params;
  }
  s->t = s->chan = end;
  issue(s, TDM_SIM_ALLREDUCE, (double)stage_params * 4, s->t);
  if (s->chan > s->t) s->t = s->chan;
  s->t += (double)stage_params / s->orate;
  *busiest = most + (double)stage_params / s->orate;
  tdm__free(arrive), tdm__free(clock), tdm__free(chan), tdm__free(busy), tdm__free(at);
  return st;
}

/* The share of a core each rank's thread gets with `ranks` ranks (on average) computing on a node. */
static double share(const tdm_sim_cluster *k, double ranks) {
  double want = ranks * k->threads;
  return k->cores_per_node > 0 && want > k->cores_per_node ? k->cores_per_node / want : 1;
}

/* E[max of n standard normals] = integral of x n phi(x) Phi(x)^(n-1), by the midpoint rule on
 * [-10, 10] (the tails beyond hold nothing a double sees); remembered for the last n asked. */
double tdm_sim_expected_max(int n) {
  static _Thread_local int last_n = 0;
  static _Thread_local double last = 0;
  if (n <= 1) return 0;
  if (n == last_n) return last;
  const int steps = 20000;
  double h = 20.0 / steps, sum = 0;
  for (int i = 0; i < steps; i++) {
    double x = -10 + (i + 0.5) * h, Phi = 0.5 * erfc(-x / sqrt(2.0));
    sum += x * n * exp(-0.5 * x * x) / 2.5066282746310002 /* sqrt(2 pi) */ * pow(Phi, n - 1) * h;
  }
  last_n = n, last = sum;
  return sum;
}

/* One pass of the event simulation, compute slowed by `slow` (1: the measured rate); fills *out but
 * its efficiency. */
static tdm_status simulate(tdm_sim_model *m, const tdm_sim_cluster *k, int ranks, double slow, tdm_sim_result *out) {
  int grid = m->tp * m->pp;
  memset(out, 0, sizeof *out);
  sim s;
  memset(&s, 0, sizeof s);
  s.m = m;
  s.D = ranks / grid;
  s.kd = *k, s.kt = *k;
  s.kd.ranks_per_node = k->ranks_per_node / grid > 0 ? k->ranks_per_node / grid : 1; /* data peers: grid apart */
  int on_node = ranks < k->ranks_per_node ? ranks : k->ranks_per_node;
  s.rate = k->flops * slow * m->tp; /* each tensor-parallel rank does 1/tp of the model's FLOPs */
  s.orate = k->optim_rate * slow;
  s.overlap = k->cores_per_node == 0 || k->cores_per_node > k->threads * on_node; /* tdm_spare_core */
  double busiest = 0;
  if (m->pp > 1) {
    TDM__TRY(pipeline_step(&s, m, k, &busiest));
  } else if (m->stage == 3) {
    units_step(&s, m);
  } else {
    /* data parallelism hands every bucket to its communication thread, a core spare or not (but
     * over a shared region, where the training thread averages them itself when none is: dp.c,
     * n_async). With no core spare that thread runs only when the scheduler takes a core from a
     * training thread, each message waiting for it: as the inline rule has it, the buckets do not
     * overlap backward (dp.c: "the communication thread could only take turns with backward on
     * the same core"); the validation's 2 ranks on 2 cores measure it so. */
    s.grads = !m->stage;
    buckets_step(&s, m);
  }
  double tpc = 0;
  if (m->tp > 1) { /* each block's all-reduces of activations, on the critical path, every micro-batch */
    double c = tdm_sim_coll_cost(&s.kt, tdm_sim_engine_algo(&s.kt, TDM_SIM_ALLREDUCE, m->tp, 0), TDM_SIM_ALLREDUCE, m->act_bytes, m->tp);
    tpc = (double)m->accum * m->tp_allreduces * c;
    s.comm += tpc;
    s.bytes += (double)m->accum * m->tp_allreduces * 2.0 * (m->tp - 1) / m->tp * m->act_bytes;
  }
  double own = m->pp > 1 ? busiest : (double)m->accum * 3 * m->fwd_total / s.rate +
                                         (double)m->n_params / (m->stage ? s.D : 1) / m->tp / s.orate;
  out->ranks = ranks, out->dp = s.D, out->tp = m->tp, out->pp = m->pp;
  out->step = s.t + tpc + k->overhead;
  out->compute = own + k->overhead;
  out->comm = s.comm;
  out->exposed = out->step - out->compute;
  if (out->exposed < 0) out->exposed = 0;
  out->bytes = s.bytes;
  out->buckets = m->has_layout ? m->L.ng : m->has_pl ? m->PL.C : 0;
  out->algo = s.big_n > 0 ? s.big_algo : TDM_ALGO_AUTO;
  return TDM_OK;
}

tdm_status tdm_sim_step(const tdm_sim_model *cm, const tdm_sim_cluster *k, int ranks, tdm_sim_result *out) {
  if (!cm || !k || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: NULL argument");
  TDM__TRY(tdm_sim_cluster_check(k, "cluster"));
  tdm_sim_model *m = (tdm_sim_model *)cm; /* the bucket timeline is kept for the tests */
  int grid = m->tp * m->pp;
  if (ranks < 1 || ranks % grid)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: %d ranks; expected a positive multiple of --tp x --pp = %d", ranks, grid);
  int on_node = ranks < k->ranks_per_node ? ranks : k->ranks_per_node;
  /* every step synchronises the ranks: it waits for the slowest, cv standard deviations of it per
   * expected maximum of `ranks` behind the mean */
  double straggle = k->compute_cv > 0 ? 1 + k->compute_cv * tdm_sim_expected_max(ranks) : 1;
  /* The cores are shared by the ranks computing at once (the rate was measured with compute_ranks
   * computing all the time). Data-parallel and ZeRO ranks run in lockstep, every bucket waiting
   * for all of them: they compute at the same time, all of the node's ranks, however long they
   * wait on their links. A pipeline's stages do not: a rank waiting on its link leaves its core
   * to the others, so on average ranks x busy compute at once, busy the share of the step a rank
   * computes: found by iterating from busy = 1 (each pass's compute over its step; it only falls,
   * and settles). */
  double busy = 1, last_slow = -1;
  for (int it = 0; it < (m->pp > 1 ? 100 : 1); it++) {
    double slow = share(k, on_node * busy) / share(k, k->compute_ranks) / straggle;
    if (slow == last_slow) break; /* no core to share, or settled */
    TDM__TRY(simulate(m, k, ranks, slow, out));
    last_slow = slow;
    double now = out->step > 0 ? out->compute / straggle / out->step : 1;
    now = now > 1 ? 1 : now;
    if (fabs(now - busy) < 1e-12) break;
    busy = now;
  }
  /* weak scaling: one rank alone (the whole model, no slow-down) against this step, per rank */
  double s1 = share(k, 1) / share(k, k->compute_ranks);
  double one = (double)m->accum * 3 * m->fwd_total / (k->flops * s1) + (double)m->n_params / (k->optim_rate * s1) + k->overhead;
  out->efficiency = one / (grid * out->step);
  return TDM_OK;
}
