/* The simulator (tandem/sim.h): every cost function against its closed form, the event simulation
 * of overlap against hand-computed timelines, the model's FLOPs against the planner's, and the
 * refusals of bad input. Measured-against-predicted is tests/multirank/test_sim_validate.sh. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tdm_test.h"

#include "sim/sim_impl.h"
#include "tandem/sim.h"

#define M_PI_VALUE 3.14159265358979323846

static tdm_sim_cluster flat(double a, double b, double g) {
  tdm_sim_cluster k;
  tdm_sim_cluster_default(&k);
  k.ranks_per_node = 1 << 20; /* one node: every link intra */
  k.intra = (tdm_sim_link){.alpha = a, .beta = b, .gamma = g};
  k.inter = (tdm_sim_link){.alpha = 10 * a, .beta = 10 * b, .gamma = g};
  return k;
}

static int lg(int p) {
  int l = 0;
  while ((1 << l) < p) l++;
  return l;
}

/* The textbook forms, for messages of at most 1 MiB (one chunk each). */
static void test_closed_forms(void) {
  double a = 3e-6, b = 2e-10, g = 5e-11;
  tdm_sim_cluster k = flat(a, b, g);
  for (int p = 2; p <= 16; p++)
    for (double n = 1024; n <= 1048576; n *= 8) {
      double ring = 2 * (p - 1) * a + 2.0 * (p - 1) / p * n * b + (p - 1.0) / p * n * g;
      CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, p), ring, 1e-15);
      CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_REDUCE_SCATTER, n, p),
                 (p - 1) * a + (p - 1.0) / p * n * (b + g), 1e-15);
      CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLGATHER, n, p), (p - 1) * a + (p - 1.0) / p * n * b, 1e-15);
      if ((p & (p - 1)) == 0) {
        int L = lg(p);
        CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLREDUCE, n, p), L * (a + n * b + n * g), 1e-15);
        CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RHD, TDM_SIM_ALLREDUCE, n, p),
                   2 * L * a + 2.0 * (p - 1) / p * n * b + (p - 1.0) / p * n * g, 1e-15);
        CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLGATHER, n, p), L * a + (p - 1.0) / p * n * b, 1e-15);
      } else { /* folded: the extra ranks hand over and get back the whole buffer */
        int L = lg(p) - 1;
        CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLREDUCE, n, p), 2 * (a + n * b) + n * g + L * (a + n * b + n * g),
                   1e-15);
        CHECK(tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLGATHER, n, p) < 0); /* rd gathers powers of two only */
      }
    }
  /* the binary tree: 2 ranks one edge up and down; 3 ranks: both children send at once (the
   * second's message travels while the root reduces the first's), the root reduces one then the
   * other, then sends twice */
  double n = 65536, e = a + n * b;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 2), (e + n * g) + e, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 3), e + 2 * n * g + 2 * e, 1e-15);
  /* 7 ranks: up, ranks 1 and 2 each get both leaves at e and reduce them (e + 2ng); their messages
   * reach the root at 2e + 2ng, reduced one after the other (2e + 4ng); down, rank 6 hears from 2
   * (the root's second child) second, and is 2's second child: 4e */
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 7), 6 * e + 4 * n * g, 1e-15);
  /* back to back, as tandem bench times them: the tree's leaves start the next all-reduce while
   * the root still sends the last one down. 8 ranks, no reduction cost: one alone takes 7 edges
   * (up 7-3-1-0; down the root's two sends, then rank 2's two), a repeat 6 (by hand: the ranks end
   * the first at 5, 6, 7, 6, 6, 6, 7, 6 edges, the second 6 edges after each); 4 ranks end
   * together, 4 edges either way; the ring, whose ranks end together, the same either way */
  tdm_sim_cluster k0 = flat(a, b, 0);
  CHECK_NEAR(tdm_sim_coll_cost(&k0, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 8), 7 * e, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost_repeated(&k0, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 8), 6 * e, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost_repeated(&k0, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 4), 4 * e, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost_repeated(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 2), (e + n * g) + e, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost_repeated(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 8), tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 8),
             1e-15);
  CHECK(tdm_sim_coll_cost_repeated(NULL, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 8) < 0);
  CHECK(tdm_sim_coll_cost_repeated(&k, TDM_ALGO_TREE, TDM_SIM_REDUCE_SCATTER, n, 4) < 0);
  /* above 1 MiB a message goes as 1 MiB chunks, each paying alpha */
  double big = 8.0 * 1048576;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, big, 2), 2 * 4 * a + big * b + 0.5 * big * g, 1e-15);
  /* one rank: nothing to do; a kind an algorithm does not run: negative */
  CHECK(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 1) == 0);
  CHECK(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_REDUCE_SCATTER, n, 4) < 0);
  CHECK(tdm_sim_coll_cost(&k, TDM_ALGO_CHAIN, TDM_SIM_ALLREDUCE, n, 4) < 0);
}

/* Nodes: a ring over two nodes pays the inter link on every step; recursive doubling only on the
 * steps that cross, with the node's ranks sharing its link; the hierarchical row composes. */
static void test_nodes(void) {
  double a = 1e-6, b = 1e-10, g = 0;
  tdm_sim_cluster k = flat(a, b, g);
  k.ranks_per_node = 4;
  k.inter = (tdm_sim_link){.alpha = 5e-6, .beta = 8e-10};
  double n = 65536;
  int p = 8;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, p), 2 * 7 * 5e-6 + 2.0 * 7 / 8 * n * 8e-10, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 4), 2 * 3 * a + 2.0 * 3 / 4 * n * b, 1e-15);
  /* rd over 8: distances 1 and 2 inside the node, 4 across with 4 ranks sharing the link */
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLREDUCE, n, p), 2 * (a + n * b) + (5e-6 + n * 8e-10 * 4), 1e-15);
  /* hierarchical, 16 ranks on 4 nodes: ring reduce-scatter in the node, ring all-reduce of n/4
   * across the 4 nodes (4 ranks sharing each node's link), ring all-gather in the node */
  double q = 4, m = n / q, inter = 2 * 3 * 5e-6 + 2.0 * 3 / 4 * m * 8e-10 * 4;
  double want = 2 * ((q - 1) * a + (q - 1) / q * n * b) + inter;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_SIM_ALGO_HIER, TDM_SIM_ALLREDUCE, n, 16), want, 1e-15);
  CHECK(strcmp(tdm_sim_algo_name(TDM_SIM_ALGO_HIER), "hier") == 0 && tdm_sim_algo_parse("rhd") == TDM_ALGO_RHD);
  /* AUTO follows tandem's rule: on one node rd to 4 KiB, rhd to 256 KiB, ring above, shm when
   * usable; a world on several nodes of several ranks gets the hierarchical plan, whatever the size */
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 4096, 4) == TDM_ALGO_RD);
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 8192, 4) == TDM_ALGO_RHD);
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 1 << 20, 4) == TDM_ALGO_RING);
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 4096, 8) == TDM_SIM_ALGO_HIER);
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 1 << 20, 8) == TDM_SIM_ALGO_HIER);
  k.shm = 1;
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 1 << 20, 4) == TDM_ALGO_SHM);
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 1 << 20, 8) == TDM_SIM_ALGO_HIER); /* two nodes */
  k.ranks_per_node = 1; /* one rank a node: no node to share, the flat rule */
  CHECK(tdm_sim_auto_algo(&k, TDM_SIM_ALLREDUCE, 1 << 20, 8) == TDM_ALGO_RING);
  /* the engines ask for the rank-order algorithms: shm on one node over shared memory, else direct;
   * data parallelism's gradients the hierarchical all-reduce across nodes of several ranks */
  k.ranks_per_node = 4, k.shm = 0;
  CHECK(tdm_sim_engine_algo(&k, TDM_SIM_ALLREDUCE, 4, 1) == TDM_ALGO_DIRECT);
  CHECK(tdm_sim_engine_algo(&k, TDM_SIM_ALLREDUCE, 8, 1) == TDM_SIM_ALGO_HIER);
  CHECK(tdm_sim_engine_algo(&k, TDM_SIM_ALLREDUCE, 8, 0) == TDM_ALGO_DIRECT);
  CHECK(tdm_sim_engine_algo(&k, TDM_SIM_REDUCE_SCATTER, 8, 1) == TDM_ALGO_DIRECT);
  k.shm = 1;
  CHECK(tdm_sim_engine_algo(&k, TDM_SIM_ALLGATHER, 4, 0) == TDM_ALGO_SHM);
  CHECK(tdm_sim_engine_algo(&k, TDM_SIM_ALLREDUCE, 8, 0) == TDM_ALGO_DIRECT);
}

/* The CPU terms: a step costs its wire time plus the rank's CPU work (cpu_alpha, cpu_beta per
 * message, gamma per byte reduced), or the node's active ranks' work over cpu_cores when that is
 * longer; pairwise links carry a rank's messages to several peers side by side. */
static void test_cpu_terms(void) {
  double a = 3e-6, b = 2e-10, g = 5e-11, ca = 4e-6, cb = 1e-10, n = 262144;
  tdm_sim_cluster k = flat(a, b, g);
  k.intra.cpu_alpha = ca, k.intra.cpu_beta = cb;
  /* unlimited cores: the CPU work adds to every step */
  for (int p = 2; p <= 8; p++) {
    double m = n / p, rs = a + m * b + ca + m * cb + m * g, ag = a + m * b + ca + m * cb;
    CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, p), (p - 1) * (rs + ag), 1e-15);
  }
  /* 8 ranks on 2 cores: 4 ranks to a core, so a ring step's CPU work takes 4x as long; with a
   * fast wire (beta 0, alpha 0) that is the whole step */
  k.cpu_cores = 2;
  k.intra.alpha = 0, k.intra.beta = 0;
  double m = n / 8, rs = ca + m * cb + m * g, ag = ca + m * cb;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 8), 7 * (4 * rs + 4 * ag), 1e-15);
  /* a slow wire: the ranks wait on it together, then crowd the cores together: the crowded work
   * follows the wire, it does not hide under it */
  k.intra.alpha = a, k.intra.beta = 100 * b;
  rs = a + m * 100 * b + 4 * (ca + m * cb + m * g), ag = a + m * 100 * b + 4 * (ca + m * cb);
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 8), 7 * (rs + ag), 1e-15);
  /* 2 cores for 2 ranks: no crowding at all */
  k.intra.alpha = 0, k.intra.beta = 0;
  m = n / 2;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 2), (ca + m * cb + m * g) + (ca + m * cb), 1e-15);
  /* the tree: a level's busy ranks only. 3 ranks on 1 core: the root's two children send at once,
   * 2 ranks busy (the root and one child: 2 x the edge's work on 1 core); up, the second child's
   * message travels while the root reduces the first's; down, two sends one after the other, each
   * half a message's work at each end (sender and receiver at once) */
  k.cpu_cores = 1;
  k.intra.alpha = a, k.intra.beta = b;
  double w = a + n * b, half = 0.5 * (ca + n * cb), up = half + n * g;
  double up_edge = 2 * up; /* what follows the wire: 2 busy ranks' work on 1 core */
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 3), w + 2 * up_edge + 2 * (w + 2 * half), 1e-15);
  /* a one-way message's receiver wakes: every edge's arrival is later by wake, the exchanges of
   * the ring are not (3 ranks: the fold's two messages, then one exchange). Its core is idle, and
   * pays the wake-up, in the share cores / ranks of the node: a third with 3 ranks on 1 core, a half
   * for a pipeline's send between 2 ranks on it */
  double wk = 7e-5, wi = wk / 3;
  k.intra.wake = wk;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 3), (w + wi) + 2 * up_edge + 2 * (w + wi + 2 * half), 1e-15);
  k.intra.wake = 0;
  double ring3 = tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 3), rd3 = tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLREDUCE, n, 3);
  k.intra.wake = wk;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLREDUCE, n, 3), ring3, 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RD, TDM_SIM_ALLREDUCE, n, 3), rd3 + 2 * wi, 1e-15);
  CHECK_NEAR(tdm_sim_p2p_cost(&k, n, 0, 1), wk / 2 + w + 2 * half, 1e-15);
  k.cpu_cores = 2; /* 2 ranks, 2 cores: every wake-up paid */
  double both = tdm_sim_p2p_cost(&k, n, 0, 1);
  k.intra.wake = 0;
  CHECK_NEAR(both, wk + tdm_sim_p2p_cost(&k, n, 0, 1), 1e-15);
  /* wake_shared, when given, is the wake-up of ranks sharing cores (the 3-rank tree on 1 core),
   * wake that of a rank with a core of its own (2 ranks on 2 cores) */
  double ws = 1.3e-4;
  k.intra.wake = wk, k.intra.wake_shared = ws;
  CHECK_NEAR(tdm_sim_p2p_cost(&k, n, 0, 1), both, 1e-15);
  k.cpu_cores = 1;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_TREE, TDM_SIM_ALLREDUCE, n, 3), (w + ws / 3) + 2 * up_edge + 2 * (w + ws / 3 + 2 * half), 1e-15);
  k.intra.wake = 0, k.intra.wake_shared = 0;
  /* direct over 4 ranks: 3 messages at once, each way; pairwise links side by side (one alpha,
   * n/p beta), a shared link one after the other; the CPU work of all 3 either way */
  k.cpu_cores = 0;
  m = n / 4;
  double cpu_rs = 3 * (ca + m * cb) + 3 * m * g, cpu_ag = 3 * (ca + m * cb);
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_DIRECT, TDM_SIM_ALLREDUCE, n, 4), 3 * (a + m * b) * 2 + cpu_rs + cpu_ag, 1e-15);
  k.intra.pairwise = 1;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_DIRECT, TDM_SIM_ALLREDUCE, n, 4), (a + m * b) * 2 + cpu_rs + cpu_ag, 1e-15);
  /* the fan terms, when given, are the CPU work of those messages (and of no exchange with one peer) */
  double fa = 1.5e-6, fb = 3e-10;
  k.intra.fan_alpha = fa, k.intra.fan_beta = fb;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_DIRECT, TDM_SIM_ALLREDUCE, n, 4),
             (a + m * b) * 2 + 3 * (fa + m * fb) + 3 * m * g + 3 * (fa + m * fb), 1e-15);
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLGATHER, n, 4), 3 * (a + m * b + ca + m * cb), 1e-15);
  k.intra.fan_alpha = k.intra.fan_beta = 0;
  /* recursive doubling across nodes on pairwise links: the far step's ranks do not share a link */
  tdm_sim_cluster kn = flat(1e-6, 1e-10, 0);
  kn.ranks_per_node = 4;
  kn.inter = (tdm_sim_link){.alpha = 5e-6, .beta = 8e-10, .pairwise = 1};
  double x = 65536;
  CHECK_NEAR(tdm_sim_coll_cost(&kn, TDM_ALGO_RD, TDM_SIM_ALLREDUCE, x, 8), 2 * (1e-6 + x * 1e-10) + (5e-6 + x * 8e-10), 1e-15);
}

/* The calibration's fit recovers a link from measurements made by that link: the pair's wall time
 * is its wire plus its CPU work, 8 ranks on 1 core around the ring take 8x their work after the
 * wire, the fan exchange's CPU time is 7 messages' of its own terms, and the check (the ring's wall
 * time, which no fit uses) is exact. */
static void test_calibration_fit(void) {
  double a = 2e-4, b = 8e-9, ca = 4e-5, cb = 2e-9, fa = 1e-5, fb = 3e-9, cores = 1;
  tdm_sim_calib_points pt;
  memset(&pt, 0, sizeof pt);
  for (double n = 8; n <= 4194304; n *= 4) {
    double cpu = ca + n * cb, t = a + n * b + cpu;
    int i = pt.m++;
    pt.n[i] = n, pt.pair_wall[i] = t, pt.pair_cpu[i] = cpu, pt.ring_cpu[i] = cpu;
    pt.ring_wall[i] = a + n * b + 8 * cpu / cores;
    pt.fan_cpu[i] = 7 * (fa + n * fb);
  }
  tdm_sim_calibration c;
  memset(&c, 0, sizeof c);
  c.cpu_cores = cores;
  double wake = 9e-5, lone = a + 8 * b + 0.5 * (ca + 8 * cb);
  c.pingpong = lone + wake; /* a lone message: its wire, half its work at each end, and the wake-up */
  CHECK_OK(tdm__sim_fit_link(&pt, 8, 0, &c));
  CHECK_NEAR(c.link.wake, wake, 1e-12);
  CHECK_NEAR(c.link.wake_shared, wake, 1e-12); /* no bursts: the one ping-pong for both */
  /* bursts in the VM's two modes: wake from the fastest, wake_shared from their mean (pingpong) */
  tdm_sim_calibration cb2 = c;
  const double bursts[4] = {lone + wake + 8e-5, lone + wake, lone + wake + 1e-6, lone + wake + 9e-5};
  memcpy(cb2.pingpong_bursts, bursts, sizeof bursts), cb2.n_bursts = 4;
  cb2.pingpong = (bursts[0] + bursts[1] + bursts[2] + bursts[3]) / 4;
  CHECK_OK(tdm__sim_fit_link(&pt, 8, 0, &cb2));
  CHECK_NEAR(cb2.link.wake, wake, 1e-12);
  CHECK_NEAR(cb2.link.wake_shared, wake + 4.275e-5, 1e-12);
  CHECK_MSG(fabs(c.link.alpha / a - 1) < 1e-6 && fabs(c.link.beta / b - 1) < 1e-6, "wire: alpha %g, beta %g", c.link.alpha, c.link.beta);
  CHECK_MSG(fabs(c.link.cpu_alpha / ca - 1) < 1e-6 && fabs(c.link.cpu_beta / cb - 1) < 1e-6, "cpu: %g, %g", c.link.cpu_alpha, c.link.cpu_beta);
  CHECK_MSG(fabs(c.link.fan_alpha / fa - 1) < 1e-6 && fabs(c.link.fan_beta / fb - 1) < 1e-6, "fan: %g, %g", c.link.fan_alpha, c.link.fan_beta);
  CHECK_MSG(c.check_max < 1e-6, "the check: %g", c.check_max);
  CHECK(c.ring_beta > 1.5 * b); /* the plain fit of the crowded ring: the core's bound taken for a slower link */
  /* the fitted link predicts the ring exchange the same way the cost table does */
  tdm_sim_cluster k = flat(0, 0, 0);
  k.intra = c.link, k.cpu_cores = cores;
  double n = 1048576, cpu = ca + n * cb;
  CHECK_NEAR(tdm_sim_coll_cost(&k, TDM_ALGO_RING, TDM_SIM_ALLGATHER, 8 * n, 8), 7 * (a + n * b + 8 * cpu), 1e-12);
  CHECK_MSG(c.link.stagger < 1e-9, "a ring in lockstep: stagger %g", c.link.stagger);
  /* ranks that drift apart: 40% of what the crowded core adds beyond a rank's own work hides under
   * the others' wire (all of it would give max(wire + work, crowded work)); fitted from the ring
   * exchange, exactly, and costed so: small messages (the excess below the wire) and large ones */
  {
    tdm_sim_calib_points st = pt;
    for (int i = 0; i < st.m; i++) {
      double w = a + st.n[i] * b, cw = ca + st.n[i] * cb, ex = 7 * cw, hid = ex > w ? ex - w : 0;
      st.ring_wall[i] = w + cw + ex - 0.4 * (ex - hid);
    }
    tdm_sim_calibration cs = c;
    CHECK_OK(tdm__sim_fit_link(&st, 8, 0, &cs));
    CHECK_MSG(fabs(cs.link.stagger - 0.4) < 1e-6 && cs.check_max < 1e-6, "stagger %g (0.4), the check %g", cs.link.stagger, cs.check_max);
    tdm_sim_cluster ks = k;
    ks.intra = cs.link;
    for (double x = 64; x <= 4194304; x *= 64) {
      double w = a + x * b, cw = ca + x * cb, ex = 7 * cw, hid = ex > w ? ex - w : 0;
      CHECK_NEAR(tdm_sim_coll_cost(&ks, TDM_ALGO_RING, TDM_SIM_ALLGATHER, 8 * x, 8), 7 * (w + cw + ex - 0.4 * (ex - hid)), 1e-12);
    }
    /* messages to several peers at once keep lockstep: their terms were fitted from such an
     * exchange's wall time as lockstep work */
    ks.intra.fan_alpha = fa, ks.intra.fan_beta = fb, ks.intra.pairwise = 1, ks.intra.gamma = 0;
    double fan = tdm_sim_coll_cost(&ks, TDM_ALGO_DIRECT, TDM_SIM_ALLGATHER, 8 * n, 8);
    CHECK_NEAR(fan, a + n * b + 8 * 7 * (fa + n * fb) / cores, 1e-12);
    ks.intra.stagger = 0;
    CHECK_NEAR(tdm_sim_coll_cost(&ks, TDM_ALGO_DIRECT, TDM_SIM_ALLGATHER, 8 * n, 8), fan, 1e-15);
  }
  CHECK(c.link.big_bytes == 0 && c.link.big_factor == 1); /* the cache not known: every byte the same */
  /* messages of the L2's size and more cost 1.6x a byte (all their bytes; from half the L2 to it,
   * in proportion): the lines from the sizes up to half the L2, the factor from those above, and
   * the cost table charges it per piece. The sizes 8 B..2 MiB by 4x and 768 KiB (half its bytes
   * beyond: not used for the factor, costed as the rule says) */
  tdm_sim_calib_points big = pt;
  big.cache = 1048576;
  for (int i = big.m; i > 9; i--) { /* 768 KiB between 512 KiB and 2 MiB, as the calibration puts the L2's size there */
    big.n[i] = big.n[i - 1], big.pair_cpu[i] = big.pair_cpu[i - 1], big.ring_cpu[i] = big.ring_cpu[i - 1];
    big.pair_wall[i] = big.pair_wall[i - 1], big.ring_wall[i] = big.ring_wall[i - 1], big.fan_cpu[i] = big.fan_cpu[i - 1];
  }
  big.m++;
  {
    double n = 786432, cpu = ca + n * cb;
    big.n[9] = n, big.pair_wall[9] = a + n * b + cpu, big.pair_cpu[9] = big.ring_cpu[9] = cpu;
    big.ring_wall[9] = a + n * b + 8 * cpu / cores, big.fan_cpu[9] = 7 * (fa + n * fb);
  }
  CHECK(big.n[8] == 524288 && big.n[10] == 2097152);
  for (int i = 0; i < big.m; i++) {
    double n = big.n[i], x = n >= big.cache ? n * 0.6 : n > big.cache / 2 ? (n - big.cache / 2) / (big.cache / 2) * n * 0.6 : 0;
    big.pair_cpu[i] += x * cb, big.ring_cpu[i] += x * cb, big.fan_cpu[i] += 7 * x * fb * 1.5; /* the fan's: 1.9x */
    big.pair_wall[i] += x * cb, big.ring_wall[i] += 8 * x * cb / cores; /* the walls: their work, as above */
  }
  CHECK_OK(tdm__sim_fit_link(&big, 8, 0, &c));
  CHECK_MSG(fabs(c.link.cpu_beta / cb - 1) < 1e-6 && fabs(c.link.fan_beta / fb - 1) < 1e-6, "beyond the L2: %g, %g", c.link.cpu_beta,
            c.link.fan_beta);
  CHECK_MSG(c.link.big_bytes == 1048576 && fabs(c.link.big_factor - 1.6) < 1e-6 && fabs(c.link.fan_big_factor - 1.9) < 1e-6,
            "big: %g x %g, the fan's %g", c.link.big_bytes, c.link.big_factor, c.link.fan_big_factor);
  CHECK_MSG(fabs(c.link.beta / b - 1) < 1e-6 && c.check_max < 1e-6, "beyond the L2: beta %g, the check %g", c.link.beta, c.check_max);
  tdm_sim_cluster kb = flat(a, b, 0);
  kb.intra = c.link, kb.intra.gamma = 0, kb.intra.pairwise = 1, kb.intra.wake = 0;
  double x4 = 4194304; /* direct's all-gather of 4 x 4 MiB: one exchange of 4 MiB blocks with 3 peers */
  CHECK_NEAR(tdm_sim_coll_cost(&kb, TDM_ALGO_DIRECT, TDM_SIM_ALLGATHER, 4 * x4, 4), a + x4 * b + 3 * (fa + x4 * fb * 1.9), 1e-12);
  double x1 = 524288; /* 4 x 512 KiB: 3 blocks of 512 KiB, 1.5 MiB together: a message's own size decides */
  CHECK_NEAR(tdm_sim_coll_cost(&kb, TDM_ALGO_DIRECT, TDM_SIM_ALLGATHER, 4 * x1, 4), a + x1 * b + 3 * (fa + x1 * fb), 1e-12);
  double x3 = 786432; /* 768 KiB: half the way from half the L2 to it, 1.45x a byte */
  CHECK_NEAR(tdm_sim_coll_cost(&kb, TDM_ALGO_DIRECT, TDM_SIM_ALLGATHER, 4 * x3, 4), a + x3 * b + 3 * (fa + x3 * fb * 1.45), 1e-12);
  /* 1.5 MiB goes as a chunk of 1 MiB (1.6x a byte) and one of 512 KiB (1x), as tdm__sendrecv_reduce
   * and direct's rounds send it, not as two of 768 KiB: the ring's reduce-scatter at 2 ranks, one
   * step of two chunks, and direct's, two rounds */
  double mib = 1048576, x15 = 1.5 * mib, two = 2 * a + x15 * b + 2 * ca + mib * cb * 1.6 + 0.5 * mib * cb;
  CHECK_NEAR(tdm_sim_coll_cost(&kb, TDM_ALGO_RING, TDM_SIM_REDUCE_SCATTER, 2 * x15, 2), two, 1e-12);
  CHECK_NEAR(tdm_sim_coll_cost(&kb, TDM_ALGO_DIRECT, TDM_SIM_REDUCE_SCATTER, 2 * x15, 2), two, 1e-12);
  /* one peer at a time: big_factor (the ring's all-gather of 4 x 4 MiB: 3 steps of 4 MiB, 4 pieces each) */
  CHECK_NEAR(tdm_sim_coll_cost(&kb, TDM_ALGO_RING, TDM_SIM_ALLGATHER, 4 * x4, 4),
             3 * (4 * a + x4 * b + 4 * ca + x4 * cb * 1.6), 1e-12);
  /* 8 ranks crowding 1 core: a fan exchange whose wall time shows a quarter more work than the
   * threads' clocks counted (the kernel's, charged to no thread) is fitted from its wall time;
   * one whose wall time shows less keeps what was counted */
  tdm_sim_calib_points hid = pt;
  for (int i = 0; i < hid.m; i++) hid.fan_wall[i] = a + hid.n[i] * b + 8 * 1.25 * hid.fan_cpu[i] / cores;
  c.cpu_cores = cores;
  CHECK_OK(tdm__sim_fit_link(&hid, 8, 0, &c));
  CHECK_MSG(fabs(c.link.fan_alpha / (1.25 * fa) - 1) < 1e-6 && fabs(c.link.fan_beta / (1.25 * fb) - 1) < 1e-6, "hidden work: %g, %g",
            c.link.fan_alpha, c.link.fan_beta);
  for (int i = 0; i < hid.m; i++) hid.fan_wall[i] = a + hid.n[i] * b + 8 * 0.8 * hid.fan_cpu[i] / cores;
  CHECK_OK(tdm__sim_fit_link(&hid, 8, 0, &c));
  CHECK_MSG(fabs(c.link.fan_alpha / fa - 1) < 1e-6 && fabs(c.link.fan_beta / fb - 1) < 1e-6, "counted: %g, %g", c.link.fan_alpha,
            c.link.fan_beta);
  /* with 2 ranks there is no fan exchange: no fan terms */
  CHECK_OK(tdm__sim_fit_link(&pt, 2, 0, &c));
  CHECK(c.link.fan_alpha == 0 && c.link.fan_beta == 0);
  pt.m = 1;
  CHECK(tdm__sim_fit_link(&pt, 8, 0, &c) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("1 sizes");
}

/* Three layers of 100,000 parameters, forward 1, 2, 3 MFLOP at 1 GFLOP/s (6 ms; backward 6, 4, 2 ms
 * from the last layer), a bucket per layer (400 KB: the ring, by tandem's rule), all-reduces of 2 ms
 * (2 ranks, alpha 1 ms, beta 0: direct's two steps, or shm's two barriers), the optimizer 1 ms per
 * 100,000 parameters. By hand:
 *   overlap     buckets [12,14] [16,18] [18,20], optimizer to 23 ms; compute 21, exposed 2
 *   no core     over a shared region (shm) the training thread reduces: [12,14], backward to 18,
 *               [18,20], to 22, [22,24]; 27
 *   --no-overlap backward to 18, buckets [18,20] [20,22] [22,24]; 27
 *   no core, tcp the communication thread takes the buckets, but runs only when the scheduler
 *               takes a core from backward: as the training thread would, 27 */
static void test_overlap_by_hand(void) {
  int64_t params[3] = {100000, 100000, 100000};
  double fwd[3] = {1e6, 2e6, 3e6};
  tdm_sim_cluster k = flat(1e-3, 0, 0);
  k.flops = 1e9, k.optim_rate = 1e8, k.overhead = 0, k.cores_per_node = 0;
  for (int mode = 0; mode < 4; mode++) {
    tdm_sim_model *m = NULL;
    CHECK_OK(tdm_sim_model_custom(&m, 3, params, fwd, 400000, 400000, mode == 2));
    if (!m) return;
    k.cores_per_node = mode == 1 || mode == 3 ? 2 : 0; /* 2 ranks x 1 thread on 2 cores: none spare */
    k.shm = mode == 1;
    tdm_sim_result r;
    CHECK_OK(tdm_sim_step(m, &k, 2, &r));
    int nb = 0;
    const double *t = tdm_sim_last_buckets(m, &nb);
    CHECK_MSG(nb == 3 && t, "%d buckets", nb);
    double want[4][7] = {{12, 14, 16, 18, 18, 20, 23}, {12, 14, 18, 20, 22, 24, 27}, {18, 20, 20, 22, 22, 24, 27}, {12, 14, 18, 20, 22, 24, 27}};
    for (int i = 0; t && i < 6; i++) CHECK_MSG(fabs(t[i] * 1e3 - want[mode][i]) < 1e-9, "mode %d: event %d at %.6f ms, expected %.0f", mode, i, t[i] * 1e3, want[mode][i]);
    CHECK_NEAR(r.step * 1e3, want[mode][6], 1e-9);
    CHECK_NEAR(r.compute * 1e3, 21, 1e-9);
    CHECK_NEAR(r.exposed * 1e3, want[mode][6] - 21, 1e-9);
    CHECK_NEAR(r.efficiency, 21 / want[mode][6], 1e-12);
    /* a bucket waited for on the communication thread pays the link's handoff, 0.5 ms: beside
     * compute [12,14.5] [16,18.5] [18.5,21], 24 ms; with no core over tcp [12,14.5], backward to
     * 18.5, [18.5,21], to 23, [23,25.5], 28.5 ms; the shared region's inline averaging pays none */
    if (mode != 2) {
      k.intra.handoff = k.inter.handoff = 0.5e-3;
      CHECK_OK(tdm_sim_step(m, &k, 2, &r));
      double wanth[4][7] = {{12, 14.5, 16, 18.5, 18.5, 21, 24}, {12, 14, 18, 20, 22, 24, 27}, {0}, {12, 14.5, 18.5, 21, 23, 25.5, 28.5}};
      t = tdm_sim_last_buckets(m, &nb);
      for (int i = 0; t && i < 6; i++)
        CHECK_MSG(fabs(t[i] * 1e3 - wanth[mode][i]) < 1e-9, "handoff, mode %d: event %d at %.6f ms, expected %g", mode, i, t[i] * 1e3, wanth[mode][i]);
      CHECK_NEAR(r.step * 1e3, wanth[mode][6], 1e-9);
      k.intra.handoff = k.inter.handoff = 0;
    }
    tdm_sim_model_destroy(m);
  }
}

/* Stragglers: the expected largest of n standard normals against its closed forms (n = 2, 3) and
 * a tabulated value (n = 4, 1.0293754); a step of 2 ranks whose compute spreads by cv waits for
 * the slower: the hand-made model's 21 ms of compute (no communication cost) times 1 + cv/sqrt(pi). */
static void test_stragglers(void) {
  CHECK(tdm_sim_expected_max(1) == 0);
  CHECK_NEAR(tdm_sim_expected_max(2), 1 / sqrt(M_PI_VALUE), 1e-9);
  CHECK_NEAR(tdm_sim_expected_max(3), 1.5 / sqrt(M_PI_VALUE), 1e-9);
  CHECK_NEAR(tdm_sim_expected_max(4), 1.0293754, 1e-6);
  CHECK(tdm_sim_expected_max(1024) > 3.1 && tdm_sim_expected_max(1024) < 3.3);
  int64_t params[3] = {100000, 100000, 100000};
  double fwd[3] = {1e6, 2e6, 3e6};
  tdm_sim_cluster k = flat(0, 0, 0);
  k.flops = 1e9, k.optim_rate = 1e8, k.overhead = 0, k.cores_per_node = 0, k.compute_cv = 0.25;
  tdm_sim_model *m = NULL;
  CHECK_OK(tdm_sim_model_custom(&m, 3, params, fwd, 400000, 400000, 0));
  if (!m) return;
  tdm_sim_result r;
  CHECK_OK(tdm_sim_step(m, &k, 2, &r));
  CHECK_NEAR(r.step * 1e3, 21 * (1 + 0.25 / sqrt(M_PI_VALUE)), 1e-9);
  CHECK_NEAR(r.efficiency, 1 / (1 + 0.25 / sqrt(M_PI_VALUE)), 1e-12); /* one rank alone does not wait */
  CHECK_OK(tdm_sim_step(m, &k, 1, &r));
  CHECK_NEAR(r.step * 1e3, 21, 1e-9);
  tdm_sim_model_destroy(m);
}

/* Ranks sharing cores: the hand-made model's 21 ms of compute was measured with 2 ranks computing
 * at once on 1 core (half a core each); no core is spare, so each bucket's 2 alpha hold backward
 * up. Data-parallel ranks run in lockstep (every bucket's all-reduce waits for all of them), so
 * they compute at the same time however long they wait on their links, each at half a core:
 * compute 21 ms whatever alpha. Alpha 10 ms: forward 6 ms, backward 6 + 4 + 2 ms with the buckets
 * [12,32] [36,56] [58,78] between, the optimizer 3 ms to 81 ms; alpha 1 ms: [12,14] [18,20] [22,24],
 * 27 ms. (Until 2026-11-28 a rank waiting on its link was taken to leave its core to the other:
 * 4-rank runs on 2 cores were predicted 21-48% fast, their compute at a whole core's speed.) */
static void test_cores_shared(void) {
  int64_t params[3] = {100000, 100000, 100000};
  double fwd[3] = {1e6, 2e6, 3e6};
  tdm_sim_model *m = NULL;
  CHECK_OK(tdm_sim_model_custom(&m, 3, params, fwd, 400000, 400000, 0));
  if (!m) return;
  tdm_sim_cluster k = flat(10e-3, 0, 0);
  k.flops = 1e9, k.optim_rate = 1e8, k.overhead = 0, k.cores_per_node = 1, k.compute_ranks = 2;
  tdm_sim_result r;
  CHECK_OK(tdm_sim_step(m, &k, 2, &r));
  CHECK_NEAR(r.compute * 1e3, 21, 1e-9);
  CHECK_NEAR(r.step * 1e3, 81, 1e-9);
  int nb = 0;
  const double *t = tdm_sim_last_buckets(m, &nb);
  CHECK(nb == 3 && t && fabs(t[0] * 1e3 - 12) < 1e-9 && fabs(t[2] * 1e3 - 36) < 1e-9 && fabs(t[5] * 1e3 - 78) < 1e-9);
  k.intra.alpha = 1e-3;
  CHECK_OK(tdm_sim_step(m, &k, 2, &r));
  CHECK_NEAR(r.compute * 1e3, 21, 1e-9);
  CHECK_NEAR(r.step * 1e3, 27, 1e-9);
  tdm_sim_model_destroy(m);
}

/* A model from the planner's description: the MLP's parameters; GPT mini's FLOPs per token against
 * tdm_plan_gpt_costs (the planner counts a vector 30 C per block, we 65 C: within 1%). */
static void test_models(void) {
  tdm_plan_config pc = tdm_plan_config_default();
  pc.model.in_features = 784, pc.model.n_classes = 10;
  tdm_sim_model *m = NULL;
  CHECK_OK(tdm_sim_model_create(&m, &pc));
  CHECK(tdm_sim_model_params(m) == 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  CHECK_NEAR(tdm_sim_model_flops(m), 3.0 * 64 * (2.0 * (784 * 512 + 512 * 256 + 2560) + 5.0 * (512 + 256 + 10)), 1e-3);
  tdm_sim_model_destroy(m);
  pc.model = tdm_model_config_gpt_mini();
  pc.batch = 2;
  CHECK_OK(tdm_sim_model_create(&m, &pc));
  double e, b, h, T = (double)pc.model.block_size;
  tdm_plan_gpt_costs(&pc.model, 0, &e, &b, &h);
  double want = 3 * 2 * T * (e + pc.model.n_layer * b + h);
  CHECK_MSG(fabs(tdm_sim_model_flops(m) / want - 1) < 0.01, "gpt mini: %.4g FLOPs, the planner's %.4g", tdm_sim_model_flops(m), want);
  tdm_sim_model_destroy(m);
  /* pipelines: GPipe and 1F1B take the same step, zero-bubble no longer */
  pc.engine.kind = TDM_ENGINE_PIPELINE, pc.pipeline = 2, pc.engine.accum = 4;
  tdm_sim_cluster k;
  tdm_sim_cluster_default(&k);
  double step[3];
  tdm_pp_schedule_kind kinds[3] = {TDM_PP_GPIPE, TDM_PP_1F1B, TDM_PP_ZB1P};
  for (int i = 0; i < 3; i++) {
    pc.engine.pp.schedule = kinds[i];
    tdm_sim_result r;
    CHECK_OK(tdm_sim_model_create(&m, &pc));
    CHECK_OK(tdm_sim_step(m, &k, 2, &r));
    step[i] = r.step;
    tdm_sim_model_destroy(m);
  }
  CHECK_NEAR(step[0], step[1], 1e-12);
  CHECK(step[2] <= step[1] + 1e-12);
}

static void test_bad_input(void) {
  tdm_plan_config pc = tdm_plan_config_default();
  pc.model = tdm_model_config_cnn();
  tdm_sim_model *m = NULL;
  CHECK(tdm_sim_model_create(&m, &pc) == TDM_ERR_NOT_SUPPORTED);
  CHECK_ERR_HAS("cnn");
  pc = tdm_plan_config_default();
  pc.model.in_features = 784, pc.model.n_classes = 10;
  pc.engine.kind = TDM_ENGINE_PS;
  CHECK(tdm_sim_model_create(&m, &pc) == TDM_ERR_NOT_SUPPORTED);
  CHECK_ERR_HAS("parameter server");
  pc.engine.kind = TDM_ENGINE_TP, pc.tensor = 2; /* the MLP has no heads to split */
  CHECK(tdm_sim_model_create(&m, &pc) == TDM_ERR_INVALID_ARG);
  pc = tdm_plan_config_default();
  pc.model.in_features = 784, pc.model.n_classes = 10;
  CHECK_OK(tdm_sim_model_create(&m, &pc));
  tdm_sim_cluster k;
  tdm_sim_cluster_default(&k);
  tdm_sim_result r;
  CHECK(tdm_sim_step(m, &k, 0, &r) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("0 ranks");
  k.inter.beta = -1;
  CHECK(tdm_sim_step(m, &k, 2, &r) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("inter.beta");
  tdm_sim_model_destroy(m);
  /* files: a round trip, then a missing field and a wrong one, named */
  char path[] = "/tmp/tandem-test-sim-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  tdm_sim_cluster_default(&k);
  k.intra.alpha = 1.25e-5, k.cores_per_node = 3;
  CHECK_OK(tdm_sim_cluster_save(path, &k, NULL));
  tdm_sim_cluster back;
  CHECK_OK(tdm_sim_cluster_load(path, &back));
  CHECK(back.cores_per_node == 3 && fabs(back.intra.alpha - 1.25e-5) < 1e-12 && back.ranks_per_node == 8);
  FILE *f = fopen(path, "w");
  fprintf(f, "{\"ranks_per_node\": 8, \"cores_per_node\": 0, \"threads\": 1, \"shm\": 0, \"intra\": {\"alpha\": 1e-6, \"beta\": 1e-10},"
             " \"inter\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0}, \"compute\": {\"flops\": 1e9, \"optimizer\": 1e9, \"overhead\": 0, \"ranks\": 1}}");
  fclose(f);
  CHECK(tdm_sim_cluster_load(path, &back) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("intra.gamma is missing");
  f = fopen(path, "w");
  fprintf(f, "{\"ranks_per_node\": 0, \"cores_per_node\": 0, \"threads\": 1, \"shm\": 0, \"intra\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0},"
             " \"inter\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0}, \"compute\": {\"flops\": 1e9, \"optimizer\": 1e9, \"overhead\": 0, \"ranks\": 1}}");
  fclose(f);
  CHECK(tdm_sim_cluster_load(path, &back) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("ranks_per_node is 0");
  /* the CPU terms: written and read back; a file without them (calibrated before) loads as the
   * plain alpha-beta-gamma link, its cores those of the node; a bad one is named */
  tdm_sim_cluster_default(&k);
  k.cores_per_node = 2, k.cpu_cores = 0.75, k.intra.cpu_alpha = 4e-5, k.inter.cpu_beta = 3e-10, k.inter.pairwise = 1;
  k.intra.wake = 1e-5, k.intra.wake_shared = 6e-5;
  CHECK_OK(tdm_sim_cluster_save(path, &k, NULL));
  CHECK_OK(tdm_sim_cluster_load(path, &back));
  CHECK(fabs(back.cpu_cores - 0.75) < 1e-9 && fabs(back.intra.cpu_alpha - 4e-5) < 1e-15 && fabs(back.inter.cpu_beta - 3e-10) < 1e-20);
  CHECK(fabs(back.intra.wake - 1e-5) < 1e-15 && fabs(back.intra.wake_shared - 6e-5) < 1e-15 && back.inter.wake_shared == 0);
  CHECK(back.inter.pairwise == 1 && back.intra.pairwise == 0);
  f = fopen(path, "w");
  fprintf(f, "{\"ranks_per_node\": 8, \"cores_per_node\": 2, \"threads\": 1, \"shm\": 0, \"intra\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0},"
             " \"inter\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0}, \"compute\": {\"flops\": 1e9, \"optimizer\": 1e9, \"overhead\": 0, \"ranks\": 1}}");
  fclose(f);
  CHECK_OK(tdm_sim_cluster_load(path, &back));
  CHECK(back.cpu_cores == 2 && back.intra.cpu_alpha == 0 && back.intra.cpu_beta == 0 && back.inter.pairwise == 0 && back.intra.wake_shared == 0);
  f = fopen(path, "w");
  fprintf(f, "{\"ranks_per_node\": 8, \"cores_per_node\": 2, \"threads\": 1, \"shm\": 0, \"intra\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0, \"pairwise\": 2},"
             " \"inter\": {\"alpha\": 1e-6, \"beta\": 1e-10, \"gamma\": 0}, \"compute\": {\"flops\": 1e9, \"optimizer\": 1e9, \"overhead\": 0, \"ranks\": 1}}");
  fclose(f);
  CHECK(tdm_sim_cluster_load(path, &back) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("intra.pairwise is 2");
  k.cpu_cores = -1;
  CHECK(tdm_sim_cluster_check(&k, "here") == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("here: cpu_cores is -1");
  k.cpu_cores = 0, k.inter.big_factor = 0.5; /* a byte beyond the L2 cheaper than one within: refused */
  CHECK(tdm_sim_cluster_check(&k, "here") == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("inter.big_factor is 0.5");
  k.inter.big_factor = 2, k.intra.fan_big_factor = 0.7; /* the fan's the same way (0: big_factor's) */
  CHECK(tdm_sim_cluster_check(&k, "here") == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("intra.fan_big_factor is 0.7");
  k.intra.fan_big_factor = 2.5, k.intra.big_bytes = 1048576, k.inter.handoff = -1e-4; /* a wait that saves time */
  CHECK(tdm_sim_cluster_check(&k, "here") == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("inter.handoff is -0.0001");
  k.inter.handoff = 1.5e-4, k.intra.stagger = 1.2; /* a share: more than all of the excess hidden */
  CHECK(tdm_sim_cluster_check(&k, "here") == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("intra.stagger is 1.2");
  k.intra.stagger = NAN;
  CHECK(tdm_sim_cluster_check(&k, "here") == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("intra.stagger is nan");
  k.intra.stagger = 0.45;
  CHECK_OK(tdm_sim_cluster_save(path, &k, NULL));
  CHECK_OK(tdm_sim_cluster_load(path, &back));
  CHECK(back.intra.fan_big_factor == 2.5 && back.inter.fan_big_factor == 0 && back.inter.big_factor == 2);
  CHECK(back.inter.handoff == 1.5e-4 && back.intra.handoff == 0);
  CHECK(back.intra.stagger == 0.45 && back.inter.stagger == 0);
  remove(path);
  CHECK(tdm_sim_cluster_load(path, &back) == TDM_ERR_IO);
}

TDM_TEST_MAIN(T(test_closed_forms), T(test_nodes), T(test_cpu_terms), T(test_calibration_fit), T(test_overlap_by_hand), T(test_stragglers), T(test_cores_shared),
              T(test_models),
              T(test_bad_input))
