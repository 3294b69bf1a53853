/* tandem — the simulator: predicted step time and scaling of a training run on a described
 * cluster, from 1 to many thousands of ranks, before (or instead of) running it.
 *
 * Three parts, each checked against measurement (docs/simulator.md, docs/PERFORMANCE.md):
 *   costs     every collective algorithm of tandem's table (tdm_algo) costed with the
 *             alpha-beta-gamma model: a message of n bytes takes alpha + n beta on a link, a
 *             reduction n gamma; a step of an algorithm that crosses nodes uses the inter-node
 *             link. Ring all-reduce: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.
 *   a model   the parameters in backward order with their compute (FLOPs per sample from the
 *             model's shapes), and the gradient buckets tandem would make (src/parallel/layout.c,
 *             the same code the engines run).
 *   a step    simulated event by event: backward produces gradients layer by layer, a bucket
 *             launches when its last gradient is final, one communication channel per rank runs
 *             buckets in order (or the training thread runs them, when no core is spare, as
 *             tandem does), the optimizer starts after the last bucket; ZeRO's reduce-scatters
 *             and gathers, a pipeline schedule's action lists (the generator's, with per-chunk
 *             costs and messages), tensor parallelism's all-reduces per block.
 *
 *   tdm_sim_cluster k;  tdm_sim_cluster_default(&k);          // or tdm_sim_cluster_load
 *   tdm_sim_model *m;   tdm_sim_model_create(&m, &plan_config); // model, batch, strategy
 *   tdm_sim_result r;   tdm_sim_step(m, &k, 64, &r);           // 64 ranks in all
 *   printf("%.1f ms, efficiency %.2f\n", r.step * 1e3, r.efficiency);
 *   tdm_sim_model_destroy(m);
 *
 * Times are seconds, sizes bytes. Thread safety: a model is read-only after creation; calls on
 * distinct models, or the cost functions, may run on any threads.
 */
#ifndef TANDEM_SIM_H
#define TANDEM_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/comm.h"
#include "tandem/plan.h"
#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A link: per message alpha (s), per byte beta (s/B): the time on the wire, which takes no core;
 * the reduction's gamma (s/B) of the ranks at its ends. The CPU work of moving a message (LogGOP's
 * o and O): cpu_alpha (s) and cpu_beta (s/B) of one message, its sender's and its receiver's work
 * together, which runs on the node's cores (tdm_sim_cluster.cpu_cores) and is slowed when more
 * ranks work at once than there are cores. pairwise: 1 when every pair of ranks has a link of its
 * own (TANDEM_NET_EMULATE's network: a rank's messages to several peers travel at once), 0 when a
 * rank's, or a node's, concurrent messages share one link (a NIC). fan_alpha, fan_beta: the CPU
 * work of one of the messages a rank sends to several peers at once while receiving as many
 * (direct's exchanges), measured apart: such an exchange shares one call's fixed cost among its
 * messages and holds more bytes in flight than the caches do (0 and 0: cpu_alpha and cpu_beta).
 * wake (s): what a one-way message adds for its receiver, blocked waiting for it, to wake (the
 * ranks of an exchange are busy sending when theirs arrive), on a core of its own: a collective
 * repeated meets the fast one of a VM's two wake-up modes. wake_shared (s): the same when the
 * node's ranks share fewer cores, whose wake-ups meet either mode (0: wake). big_bytes, big_factor: a message (or
 * each piece it is sent in) of big_bytes or more costs big_factor times cpu_beta (or fan_beta) a
 * byte, one of half of it or less cpu_beta, in between in proportion: copies that outgrow the L2
 * run from the slower caches (0 and 0: every byte the same); fan_big_factor the same for fan_beta
 * (p - 1 streams at once outgrow them further; 0: big_factor). handoff (s): what a collective
 * handed to the communication thread and waited for costs beyond the blocking call (the waiting
 * thread's wake-up and the hand-over), paid by each bucket data parallelism and ZeRO send that way.
 * stagger (0..1): the share of what crowded cores add to a step (more ranks working than cores)
 * that hides under the other ranks' wire: 0, the ranks of a step wait on their links together and
 * then want the cores together (lockstep), 1, a rank works while the others wait; fitted from the
 * ring exchange's wall time. Messages to several peers at once (fan_alpha, fan_beta: fitted from
 * such an exchange's wall time as lockstep work) take 0.
 * Zero-initialised: the plain alpha-beta-gamma link. */
typedef struct tdm_sim_link {
  double alpha, beta, gamma;
  double cpu_alpha, cpu_beta;
  double fan_alpha, fan_beta;
  double wake, wake_shared;
  double big_bytes, big_factor, fan_big_factor;
  int pairwise;
  double handoff;
  double stagger;
} tdm_sim_link;

typedef struct tdm_sim_cluster {
  int ranks_per_node;   /* >= 1 */
  int cores_per_node;   /* 0: as many as needed (communication always beside compute) */
  int threads;          /* intra-op threads per rank (compute is slowed when ranks x threads > cores) */
  tdm_sim_link intra, inter;
  int shm;              /* 1: ranks of one node reduce through shared memory (tandem's shm algorithm) */
  double cpu_cores;     /* the cores a node's ranks get between them for communication's CPU work (measured:
                           fewer than cores_per_node when other work shares the machine); 0: unlimited */
  double flops;         /* forward and backward FLOP/s of one rank, measured with compute_ranks ranks computing on its node */
  int compute_ranks;    /* >= 1: the rate is scaled by how ranks x threads share cores_per_node here and then */
  double optim_rate;    /* parameter elements per second the optimizer updates */
  double overhead;      /* seconds per step besides (data, zero_grad, bookkeeping) */
  double compute_cv;    /* the spread of a rank's compute from step to step (a standard deviation over the median, measured);
                           a step that synchronises N ranks waits for the slowest: 1 + cv E[max of N] (0: none) */
  char compute_model[32]; /* what the compute rate was measured on ("" unknown) */
  int allreduce_algo;   /* the data axis's all-reduces: TDM_ALGO_AUTO (0: what tandem's engines run,
                           tdm_sim_engine_algo) or a row of the cost table (a what-if; not in the file) */
} tdm_sim_cluster;

/* A cluster of 8-rank nodes: 2 us / 100 GB/s inside a node, 10 us / 12.5 GB/s (100 Gb/s)
 * between nodes, 10 GB/s reductions, 1 TFLOP/s per rank. */
void tdm_sim_cluster_default(tdm_sim_cluster *k);
/* Reads a cluster file (JSON, docs/simulator.md): every field must be present and valid, else
 * TDM_ERR_INVALID_ARG / TDM_ERR_FORMAT naming the file and the field. */
tdm_status tdm_sim_cluster_load(const char *path, tdm_sim_cluster *k);
/* Writes one (atomically: a temporary file renamed). extra: a JSON object's members to add
 * (calibration's measurements), or NULL. */
tdm_status tdm_sim_cluster_save(const char *path, const tdm_sim_cluster *k, const char *extra);
/* TDM_ERR_INVALID_ARG naming the first field out of range (where: the file or "--option"). */
tdm_status tdm_sim_cluster_check(const tdm_sim_cluster *k, const char *where);

/* ---- collective costs -------------------------------------------------------------------------
 * The kinds costed: all-reduce, reduce-scatter, all-gather, broadcast (n: the whole buffer). The
 * table has one row per tdm_algo (ring, rd, rhd, tree, chain, direct, shm) and a hierarchical
 * row: reduce-scatter inside each node, the operation across nodes on 1/ranks_per_node of the
 * data, all-gather inside each node. */
typedef enum { TDM_SIM_ALLREDUCE = 0, TDM_SIM_REDUCE_SCATTER, TDM_SIM_ALLGATHER, TDM_SIM_BROADCAST, TDM_SIM_KIND_COUNT } tdm_sim_kind;
#define TDM_SIM_ALGO_HIER TDM_ALGO_HIER /* tandem's hierarchical all-reduce (src/comm/algo/hier.c) */
#define TDM_SIM_ALGO_COUNT TDM_ALGO_COUNT
const char *tdm_sim_algo_name(int algo); /* tdm_algo_name's, and "hier" */
int tdm_sim_algo_parse(const char *name); /* -1 when unknown */
/* Seconds for `kind` of n bytes over p ranks laid out ranks_per_node to a node. algo
 * TDM_ALGO_AUTO: the rule tandem applies (collective.c). A negative value when the algorithm
 * does not run that kind. */
double tdm_sim_coll_cost(const tdm_sim_cluster *k, int algo, tdm_sim_kind kind, double n, int p);
/* The same collective repeated back to back, as tandem bench (and nccl-tests) time it: each rank
 * starts the next as it ends the last, and a repeat's time is the slowest rank's own, once the
 * repeats settle (the median of the 2nd to 8th). It differs from tdm_sim_coll_cost where ranks end
 * at different times: the tree's all-reduce, whose leaves begin the next while the root still
 * sends the last down (at 8 ranks 6 edges' time a repeat where one alone takes 7). -1 as
 * tdm_sim_coll_cost. */
double tdm_sim_coll_cost_repeated(const tdm_sim_cluster *k, int algo, tdm_sim_kind kind, double n, int p);
/* The algorithm the AUTO rule picks (for printing). A NULL cluster: -1 here, in
 * tdm_sim_engine_algo and tdm_sim_p2p_cost, with tdm_last_error() set. */
int tdm_sim_auto_algo(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p);
/* The algorithm tandem's engines run. They ask for the rank-order algorithms, so that every rank
 * sums in the same order whatever the strategy (tdm_comm_rank_order_algo): shm on one node over
 * shared memory, else direct; data parallelism's gradients (grads 1) take the hierarchical
 * all-reduce on several nodes of several ranks (src/parallel/dp.c, grad_algo). */
int tdm_sim_engine_algo(const tdm_sim_cluster *k, tdm_sim_kind kind, int p, int grads);
/* A point-to-point message of n bytes between ranks a and b. */
double tdm_sim_p2p_cost(const tdm_sim_cluster *k, double n, int a, int b);

/* ---- a model and a step ----------------------------------------------------------------------- */
typedef struct tdm_sim_model tdm_sim_model;

/* From what `tandem plan` works out of the train options (tdm_train_plan_config): model, batch,
 * sequence length, engine (dp buckets and overlap, ZeRO stage, accumulation), tensor and pipeline
 * axes. TDM_ERR_NOT_SUPPORTED for a model whose compute per layer is not described (cnn, resnet)
 * and for engines the simulator does not model (parameter server), naming them. */
tdm_status tdm_sim_model_create(tdm_sim_model **out, const tdm_plan_config *pc);
void tdm_sim_model_destroy(tdm_sim_model *m);
int64_t tdm_sim_model_params(const tdm_sim_model *m);
double tdm_sim_model_flops(const tdm_sim_model *m); /* forward + backward FLOPs of one rank's micro-batch, one replica */

/* A hand-made model (tests): n layers in forward order, layer i with params[i] f32 elements and
 * fwd[i] forward FLOPs (backward: twice); buckets of bucket_bytes, the first first_bytes, over
 * whole layers in backward order as tandem's layout cuts them. */
tdm_status tdm_sim_model_custom(tdm_sim_model **out, int n, const int64_t *params, const double *fwd, size_t bucket_bytes,
                                size_t first_bytes, int overlap_off);

typedef struct tdm_sim_result {
  int ranks, dp, tp, pp;
  double step;          /* seconds per optimizer step */
  double compute;       /* forward + backward + optimizer + overhead on the critical rank, as if alone (the
                           slowest of the ranks, when compute_cv says steps vary) */
  double comm;          /* communication busy time per step (all of it) */
  double exposed;       /* step - compute: communication and waits not hidden */
  double efficiency;    /* compute / step: the step of one rank, per rank, over this step */
  double bytes;         /* bytes each rank sends per step */
  int buckets;          /* groups (buckets, units) */
  int algo;             /* the all-reduce's algorithm for the largest bucket */
} tdm_sim_result;

/* The expected largest of n independent standard normal samples (0 for n = 1; 1/sqrt(pi) for 2):
 * how many standard deviations the slowest of n ranks is behind their mean. */
double tdm_sim_expected_max(int n);

/* One optimizer step on `ranks` ranks in all (dp = ranks / (tp x pp)). */
tdm_status tdm_sim_step(const tdm_sim_model *m, const tdm_sim_cluster *k, int ranks, tdm_sim_result *out);

/* Event timeline of the last tdm_sim_step on this model (tests): the time each bucket's
 * communication starts and ends, in bucket order; n: how many. NULL if none. */
const double *tdm_sim_last_buckets(const tdm_sim_model *m, int *n);

/* ---- calibration --------------------------------------------------------------------------------
 * What a calibration of a communicator's links measured, size by size (8 B, 32 B, ... max_bytes,
 * and the L2's size):
 * the median wall time of an exchange (send n to one rank while receiving n from another) of ranks 0
 * and 1 alone (pair) and of every rank at once around the ring (ring), rank 0's, and the median CPU
 * time a rank's thread spent per exchange in each (averaged over the ranks that took part); with 3
 * or more ranks, the same of every rank sending n to every other rank while receiving n from each
 * (fan: the direct all-gather's one exchange, its wall time the slowest rank's; zeros with 2 ranks,
 * where it is the ring's). */
#define TDM_SIM_CALIB_POINTS 16
typedef struct tdm_sim_calib_points {
  int m;
  double n[TDM_SIM_CALIB_POINTS], pair_wall[TDM_SIM_CALIB_POINTS], pair_cpu[TDM_SIM_CALIB_POINTS],
      ring_wall[TDM_SIM_CALIB_POINTS], ring_cpu[TDM_SIM_CALIB_POINTS], fan_wall[TDM_SIM_CALIB_POINTS],
      fan_cpu[TDM_SIM_CALIB_POINTS];
  double cache; /* the L2's bytes where they were measured (0: not known: no big_bytes) */
} tdm_sim_calib_points;

typedef struct tdm_sim_calibration {
  tdm_sim_link link;    /* alpha, beta: the pair's wall time less its CPU time (the wire), by least squares on the
                           relative error; cpu_alpha, cpu_beta: from the CPU times of both exchanges; fan_alpha,
                           fan_beta: from the fan exchange's CPU time per peer (3 or more ranks), these four
                           from the sizes up to half the L2's; big_bytes: the L2's, big_factor: the pair's and
                           ring's sizes from it on against their line, fan_big_factor the fan's against its
                           own (1 when none is); wake: the fastest ping-pong burst's one-way time less
                           a one-way 8 B message's wire and work, wake_shared the same of their mean; stagger:
                           from the ring exchange's wall time, between lockstep and fully staggered; gamma:
                           tdm_reduce_local on 4 MiB of f32; pairwise: 0 (not measured: the caller knows the network) */
  double cpu_cores;     /* the cores the ranks of a node got between them, all busy at once (cores_per_node when
                           none was short of a core) */
  double pingpong;      /* the one-way time of 8 B, as a ping-pong measures it: the mean of its bursts' medians */
  double pingpong_bursts[4]; /* each burst's median one-way time, spread over the calibration's run (n_bursts of them) */
  int n_bursts;
  double ring_alpha, ring_beta;   /* the plain alpha-beta fit of the ring exchange's wall time (the model without CPU terms) */
  double check_mean, check_max;   /* the model's relative error on the ring exchange's wall time, which no fit used but stagger's */
  tdm_sim_calib_points points;
} tdm_sim_calibration;

/* Calibrates c's links: collective over c (every rank calls it; every rank gets rank 0's
 * measurements and the same fit). ranks_per_node: how many of c's ranks share one machine's cores
 * (0: all of them). */
tdm_status tdm_sim_calibrate_link(tdm_comm_t c, size_t max_bytes, int ranks_per_node, tdm_sim_calibration *out);
/* The compute rate from a measured run: trains `steps` steps of the run c describes on this
 * process alone (metrics to a temporary file), and from the medians of steps 3.. sets k->flops
 * (fwd_bwd_flops, the model's forward + backward FLOPs per step, over the forward and backward
 * time), k->optim_rate (n_params over the optimizer's time), k->overhead (the rest of the step)
 * and k->compute_cv (the forward and backward time's spread: half its 16th-84th percentile range
 * over its median, a normal distribution's standard deviation, robust to a few preempted steps).
 * detail gets a line of what was measured. */
struct tdm_train_config;
tdm_status tdm_sim_calibrate_compute(const struct tdm_train_config *c, int steps, double fwd_bwd_flops, int64_t n_params,
                                     tdm_sim_cluster *k, char *detail, size_t n);

#ifdef __cplusplus
}
#endif
#endif
