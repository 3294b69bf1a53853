/* What an engine implements, and the state every engine shares (src/parallel/engine.c runs the
 * step; each strategy fills one tdm__engine_ops in its own file and one row of the table). */
#ifndef TANDEM_ENGINE_IMPL_H
#define TANDEM_ENGINE_IMPL_H

#include "core/internal.h"
#include "tandem/autograd.h"
#include "tandem/engine.h"

struct tdm_engine {
  const struct tdm__engine_ops *ops;
  tdm_engine_config cfg;
  tdm_optim_config ocfg;
  tdm_grid *grid;
  tdm_comm_t comm;  /* the data axis; NULL for one rank */
  int rank, size;   /* on the data axis */
  tdm_model *model;
  tdm_params *params;
  tdm_optim *opt;
  tdm_tape *tape;
  int n_spans;      /* what this rank's optimizer updates */
  tdm_optim_span *spans;
  double *seg_sums; /* one per gradient-norm segment (tdm_params_segments) */
  int64_t n_seg;
  void *impl;       /* the strategy's own state */
  char desc[160];
  int64_t steps;    /* optimizer steps run (skipped ones included) */
  double ls_scale;  /* fp16: the loss scale of the next step */
  int64_t ls_good;  /* fp16: clean steps in a row since the scale last changed */
};

/* fp16: what a rank's backward is seeded with beyond 1/accum, and what its averaged gradients
 * carry: the loss scale over the data ranks. Each rank's loss is the mean over its own batch, D
 * times one process's share per sample, so seeded with the scale alone its f16 gradients were D
 * times one process's and overflowed at another step; seeded with scale / D they are one
 * process's, and the average carries scale / D. 1 without fp16. */
double tdm__engine_seed_scale(const tdm_engine *e);

/* Rows are written with designated initializers: an optional operation an engine lacks is left
 * out (NULL), so adding one touches only the engines that have it. */
typedef struct tdm__engine_ops {
  const char *name;
  /* Builds e->model, e->params, e->opt (and e->spans) and the strategy's state. */
  tdm_status (*create)(tdm_engine *e, const tdm_model_config *mc, uint64_t seed);
  void (*destroy)(tdm_engine *e);
  /* Gradients to zero before the first micro-batch. */
  void (*zero_grad)(tdm_engine *e);
  /* Before micro-batch backward; last: the step's last micro-batch (the one that reduces). */
  void (*begin_backward)(tdm_engine *e, int last);
  /* After it; for the last, returns once every gradient this rank needs is reduced and adds the
   * time spent waiting to *wait_s. */
  tdm_status (*end_backward)(tdm_engine *e, int last, double *wait_s);
  /* The sum of squares of the reduced gradient, the same bits on every rank (see optim.h). */
  tdm_status (*grad_sumsq)(tdm_engine *e, double *sumsq);
  /* Scales the reduced gradients by coef (clipping), steps the optimizer, and leaves the
   * parameters ready for the next forward. */
  tdm_status (*update)(tdm_engine *e, float lr, float coef);
  /* Elements [lo, hi) of the current parameters into dst, on every rank (collective). */
  tdm_status (*read_params)(tdm_engine *e, int64_t lo, int64_t hi, float *dst);
  /* Streams the parameters to rank 0 in order: write(ctx, data, n) on rank 0 (collective). */
  tdm_status (*stream_params)(tdm_engine *e, tdm_status (*write)(void *ctx, const float *data, int64_t n), void *ctx);
  /* Every parameter from a safetensors file (each rank reads what it holds). */
  tdm_status (*load_weights)(tdm_engine *e, const char *path);
  /* Sharded engines: the parameters of this rank's shard (stage 3), or NULL when they are whole. */
  float *(*param_shard)(tdm_engine *e);
  /* Sharded engines: after the shard's values changed (a checkpoint loaded): drop anything derived. */
  tdm_status (*shard_changed)(tdm_engine *e);
  /* The grid axes besides data the engine spreads over (1 << TDM_AXIS_*; 0: data only). */
  unsigned axes;
  /* Optional: the whole step, for engines whose step is a schedule (NULL: engine.c's step with
   * the hooks above). */
  tdm_status (*step)(tdm_engine *e, tdm_batch_fn next, void *ctx, uint64_t dropout_seed, float lr, tdm_step_stats *st);
  /* Optional: tdm_engine_eval (NULL: the model's forward and the cross-entropy on this rank). */
  tdm_status (*eval)(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, double *loss, double *correct, double *rows);
  /* Optional: tdm_engine_check (the layout against the model, before anything is built). */
  tdm_status (*check)(const tdm_model_config *mc, const tdm_engine_config *ec, const int *sizes);
  /* The grid axes the state is split over (1 << TDM_AXIS_*): ranks that differ only in the other
   * axes hold the same state (tdm_engine_replicas; checkpoints write each piece once). */
  unsigned split;
  /* Optional: forward and loss of its own (NULL: tdm_model_forward, then cross-entropy). Adds the
   * correct predictions and rows to st, and the time its collectives took to st->t_comm_wait. */
  tdm_tensor *(*loss)(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, tdm_step_stats *st);
  /* Optional: the first non-finite parameter value's index in the whole model, the same on every
   * rank (NULL: the shard or the whole buffer, agreed over the data axis). Collective. */
  tdm_status (*first_nonfinite)(tdm_engine *e, int64_t *index);
  /* Optional: this rank's state as boxes of the whole model's parameters (tdm_engine_pieces). */
  int (*pieces)(const tdm_engine *e, const tdm_engine_piece **pieces);
  /* What the engine honours of the engine config's model-side settings (0, the default: refused by
   * tdm_engine_check and tdm_engine_create, naming the engine and the setting, never run wrongly):
   * mixed: precision bf16 / f16 (the engine's tape autocasts, the step unscales and skips);
   * recompute: activation recomputation (the models' forward on the engine's tape). */
  int mixed;
  int recompute;
  /* 1: a step cannot be skipped once backward has run (an update applied elsewhere as gradients
   * arrive): fp16's loss scaling, which skips overflowing steps, is refused. 0 (default): a skipped
   * step simply does not call update, and the next zero_grad starts afresh. */
  int cannot_skip;
  /* Optional: the last step's compression stats and gradient bytes (tdm_engine_compress_stats). */
  int (*compress_stats)(const tdm_engine *e, const tdm_compress_stats **out, uint64_t *grad_bytes);
  /* Optional: the compressor's state for checkpoints (tdm_engine_compress_state). */
  int (*compress_state)(tdm_engine *e, int k, int64_t *lo, int64_t *hi, float **residual, float **shared, int64_t *n_shared);
} tdm__engine_ops;

extern const tdm__engine_ops tdm__engine_dp_ops;
extern const tdm__engine_ops tdm__engine_zero_ops;
extern const tdm__engine_ops tdm__engine_pipeline_ops;
extern const tdm__engine_ops tdm__engine_tp_ops;

/* Shared by the engines: the global norm from the sum of squares, the non-finite check, clipping
 * and ops->update (stats->grad_norm set). */
tdm_status tdm__engine_update(tdm_engine *e, double sumsq, float lr, tdm_step_stats *stats);
/* Counts the rows of logits (..., C) whose argmax is y's entry into stats->correct and ->rows. */
void tdm__engine_count_correct(tdm_tensor *logits, tdm_tensor *y, double *correct, double *rows);
extern const tdm__engine_ops tdm__engine_ps_ops;

/* Shared by the engines: builds e->seg_sums, and the sum of squares of the segments of a whole
 * gradient buffer that every rank holds (no communication). */
tdm_status tdm__engine_sumsq_full(tdm_engine *e, const float *grad, double *sumsq);
/* The sum of squares when each rank holds some whole segments: sums of the spans' segments,
 * zeros elsewhere, summed over the data axis (one term per segment: exact), then combined in
 * segment order. grads[i] holds span i. */
tdm_status tdm__engine_sumsq_sharded(tdm_engine *e, int n_spans, const tdm_optim_span *spans, float *const *grads,
                                     double *sumsq);

/* ZeRO stage 1 beside tensor parallelism (zero1_boxes.c). Boxes b[0..n) are contiguous in state
 * order from b->state_at (whole: the whole model's store, for the parameters' ranks). align: the
 * row boundary of a box nearest to state position pos (pos itself outside every box). window:
 * keeps, in place, the parts of the boxes inside [lo, hi) (ends aligned), state_at rebased to lo;
 * returns how many are left. */
int64_t tdm__boxes_align(const tdm_params *whole, const tdm_engine_piece *b, int n, int64_t pos);
int tdm__boxes_window(const tdm_params *whole, tdm_engine_piece *b, int n, int64_t lo, int64_t hi);

#endif
