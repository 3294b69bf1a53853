/* The simulator's model description, shared by model.c (which builds it) and step.c (which runs it). */
#ifndef TANDEM_SIM_IMPL_H
#define TANDEM_SIM_IMPL_H

#include "parallel/layout.h"
#include "parallel/pipeline_impl.h"
#include "tandem/sim.h"

struct tdm_sim_model {
  tdm_engine_kind engine;
  int stage;                 /* ZeRO stage (engine zero) */
  int tp, pp;                /* tensor-parallel ranks, pipeline stages (1: none) */
  int64_t accum;             /* micro-batches per optimizer step */
  int no_overlap, prefetch;  /* dp: buckets after backward; zero 3: gather the next unit ahead */
  double wire;               /* bytes per gradient element on the wire (4, 2 when compressed to bf16/fp16) */
  int64_t n_params;
  int n_t;                   /* parameter tensors */
  int64_t *numel;            /* [n_t] */
  double *fwd;               /* [n_t] forward FLOPs of a micro-batch charged to tensor i */
  double head;               /* a tied head's FLOPs (backward runs it first, the parameter is final last) */
  double fwd_total;          /* forward FLOPs of a micro-batch */
  tdm__layout L;             /* dp / zero 1-2 buckets, or zero 3 units, cut for one rank */
  int has_layout;
  /* tensor parallelism: all-reduces of act_bytes per micro-batch, forward and backward */
  double act_bytes;          /* B x T x C x 4: a block's activations (and a pipeline's message) */
  int tp_allreduces;         /* per micro-batch, forward and backward together */
  /* pipeline: the generator's schedule and each chunk's forward FLOPs and parameters */
  tdm__pp_layout PL;
  int has_pl;
  double *chunk_fwd;         /* [C] */
  int64_t *chunk_params;     /* [C] */
  double *times;             /* [2 * groups]: the last step's bucket starts and ends */
  int n_times;
};

/* The link's fit from a calibration's measurements over `ranks` ranks (ranks_per_node of them on
 * one machine; 0: all): out->cpu_cores and out->pingpong must be set (the check and wake use
 * them); sets link's alpha, beta, cpu_alpha, cpu_beta, fan_alpha, fan_beta, big_bytes, big_factor
 * (from pt->cache), wake, stagger (from the ring exchange's wall time), ring_alpha, ring_beta and
 * the check. Separate for the tests. */
/* One step of an algorithm (cost.c): each rank sends `fan` messages of n bytes at once, in `chunks`
 * pieces, `cross` of a node's ranks sharing its link, `cpu_msgs` messages' worth of CPU work, `red`
 * bytes reduced, `active` ranks of the node working at once. The calibration's check uses it. */
double tdm__sim_step(const tdm_sim_cluster *k, const tdm_sim_link *l, double n, double chunks, int fan, double cross, double cpu_msgs,
                     double red, int active);

/* The share (0..1) of a message of `piece` bytes whose copies run beyond the L2 (cost.c): 0 up to
 * big_bytes / 2, 1 from big_bytes, linear between; 0 when big_bytes is 0. */
double tdm__sim_big_share(const tdm_sim_link *l, double piece);

tdm_status tdm__sim_fit_link(const tdm_sim_calib_points *pt, int ranks, int ranks_per_node, tdm_sim_calibration *out);

#endif
