/* The simulator (tandem/sim.h): every cost function against its closed form, the event simulation
 * of overlap against hand-computed timelines, the model's FLOPs against the planner's, and the
 * refusals of bad input. Measured-against-predicted is tests/multirank/test_sim_validate.sh. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tdm_test.h"

#include "tandem/sim.h"

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
}

/* Three layers of 100,000 parameters, forward 1, 2, 3 MFLOP at 1 GFLOP/s (6 ms; backward 6, 4, 2 ms
 * from the last layer), a bucket per layer (400 KB: the ring, by tandem's rule), all-reduces of 2 ms
 * (2 ranks, alpha 1 ms, beta 0), the optimizer 1 ms per 100,000 parameters. By hand:
 *   overlap     buckets [12,14] [16,18] [18,20], optimizer to 23 ms; compute 21, exposed 2
 *   no core     the training thread reduces: [12,14], backward to 18, [18,20], to 22, [22,24]; 27
 *   --no-overlap backward to 18, buckets [18,20] [20,22] [22,24]; 27 */
static void test_overlap_by_hand(void) {
  int64_t params[3] = {100000, 100000, 100000};
  double fwd[3] = {1e6, 2e6, 3e6};
  tdm_sim_cluster k = flat(1e-3, 0, 0);
  k.flops = 1e9, k.optim_rate = 1e8, k.overhead = 0, k.cores_per_node = 0;
  for (int mode = 0; mode < 3; mode++) {
    tdm_sim_model *m = NULL;
    CHECK_OK(tdm_sim_model_custom(&m, 3, params, fwd, 400000, 400000, mode == 2));
    if (!m) return;
    k.cores_per_node = mode == 1 ? 2 : 0; /* 2 ranks x 1 thread on 2 cores: none spare */
    tdm_sim_result r;
    CHECK_OK(tdm_sim_step(m, &k, 2, &r));
    int nb = 0;
    const double *t = tdm_sim_last_buckets(m, &nb);
    CHECK_MSG(nb == 3 && t, "%d buckets", nb);
    double want[3][7] = {{12, 14, 16, 18, 18, 20, 23}, {12, 14, 18, 20, 22, 24, 27}, {18, 20, 20, 22, 22, 24, 27}};
    for (int i = 0; t && i < 6; i++) CHECK_MSG(fabs(t[i] * 1e3 - want[mode][i]) < 1e-9, "mode %d: event %d at %.6f ms, expected %.0f", mode, i, t[i] * 1e3, want[mode][i]);
    CHECK_NEAR(r.step * 1e3, want[mode][6], 1e-9);
    CHECK_NEAR(r.compute * 1e3, 21, 1e-9);
    CHECK_NEAR(r.exposed * 1e3, want[mode][6] - 21, 1e-9);
    CHECK_NEAR(r.efficiency, 21 / want[mode][6], 1e-12);
    tdm_sim_model_destroy(m);
  }
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
  remove(path);
  CHECK(tdm_sim_cluster_load(path, &back) == TDM_ERR_IO);
}

TDM_TEST_MAIN(T(test_closed_forms), T(test_nodes), T(test_overlap_by_hand), T(test_models), T(test_bad_input))
