/* tandem — optimizers, learning-rate schedules and gradient clipping.
 *
 * An optimizer updates a tdm_params' data buffer from its gradient buffer in one pass over
 * contiguous memory, with PyTorch's exact update rules (torch.optim.SGD, Adam, AdamW).
 * Its state (momentum, first and second moments) is one buffer laid out like the parameters.
 *
 *   tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAM);   // lr 1e-3
 *   tdm_optim *opt;
 *   tdm_optim_create(&opt, &oc, tdm_model_params(model));
 *   ... backward ...
 *   tdm_clip_grad_norm(params, 1.0f, &norm);
 *   tdm_optim_step(opt, tdm_lr_at(&sched, step));
 *
 * Thread safety: one thread at a time per optimizer; the step itself runs on the intra-op pool.
 * A NULL optimizer, parameters or schedule is TDM_ERR_INVALID_ARG naming it; getters then return
 * -1 (tdm_optim_steps), 0 (tdm_optim_owned), NULL, or NAN (tdm_lr_at, tdm_grad_sumsq_combine).
 */
#ifndef TANDEM_OPTIM_H
#define TANDEM_OPTIM_H

#include <stdint.h>

#include "tandem/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TDM_OPT_SGD, TDM_OPT_ADAM, TDM_OPT_ADAMW, TDM_OPT_KIND_COUNT } tdm_optim_kind;

typedef struct tdm_optim_config {
  tdm_optim_kind kind;
  float lr;
  float weight_decay;     /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
  int decay_matrices_only; /* apply weight decay only to parameters declared with decay (matrices) */
  float momentum, dampening; /* SGD */
  int nesterov;              /* SGD */
  float beta1, beta2, eps;   /* Adam, AdamW */
} tdm_optim_config;

/* PyTorch's defaults: SGD lr 0.01; Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8;
 * AdamW the same with weight decay 0.01. */
tdm_optim_config tdm_optim_config_default(tdm_optim_kind kind);
const char *tdm_optim_kind_name(tdm_optim_kind kind);

typedef struct tdm_optim tdm_optim;
/* The optimizer keeps a pointer to params, which must outlive it. */
tdm_status tdm_optim_create(tdm_optim **out, const tdm_optim_config *cfg, tdm_params *params);
/* An optimizer that owns only some elements of the parameters: the given spans [lo, hi) of the
 * buffer (ascending, disjoint), as a rank under ZeRO owns its shard. Its state is sized for them,
 * laid out span after span (Adam: all first moments, then all second moments). Weight decay still
 * follows each element's parameter. */
typedef struct tdm_optim_span {
  int64_t lo, hi;
} tdm_optim_span;
tdm_status tdm_optim_create_spans(tdm_optim **out, const tdm_optim_config *cfg, tdm_params *params, int n_spans,
                                  const tdm_optim_span *spans);
/* Where span i's values and gradients live (hi - lo floats each; the caller keeps them alive):
 * by default, NULL, the parameters' own buffers at the span's offset. */
tdm_status tdm_optim_set_span_buffers(tdm_optim *o, int i, float *w, const float *g);
/* Elements this optimizer updates (the sum of its spans). */
int64_t tdm_optim_owned(const tdm_optim *o);
void tdm_optim_destroy(tdm_optim *o);
/* One update with this learning rate (schedules pass theirs; cfg.lr is the default). */
tdm_status tdm_optim_step(tdm_optim *o, float lr);
int64_t tdm_optim_steps(const tdm_optim *o);
/* The configuration it was created with (checkpoints name its kind and state). */
const tdm_optim_config *tdm_optim_get_config(const tdm_optim *o);
/* The state buffer (for checkpoints): n_state_floats = 0 (plain SGD), owned (momentum) or
 * 2 x owned (Adam: m then v). set_steps restores the step count used for bias correction. */
float *tdm_optim_state(const tdm_optim *o, int64_t *n_floats);
void tdm_optim_set_steps(tdm_optim *o, int64_t steps);

/* Scales all gradients so that their global L2 norm is at most max_norm (as PyTorch's
 * clip_grad_norm_); *norm_out receives the norm before clipping. max_norm <= 0 only measures.
 * TDM_ERR_INVALID_ARG when the norm is not finite (a NaN or Inf gradient). */
tdm_status tdm_clip_grad_norm(tdm_params *p, float max_norm, float *norm_out);

/* The norm's parts, for gradients spread over ranks. The buffer is cut into segments (at every
 * parameter start and every multiple of a length chosen from the parameter count alone); each
 * segment's sum of squares is formed in double in one fixed order and the sums are added in
 * segment order, so the norm has the same bits whatever the layout, as long as a shard is made of
 * whole segments. tdm_grad_sumsq_segments writes the sums of the segments of [lo, hi) (which must
 * start and end on segment boundaries, see tdm_params_segments) into sums[first segment ...], g
 * holding the gradients of [lo, hi). */
tdm_status tdm_params_segments(const tdm_params *p, const int64_t **cuts, int64_t *n_segments);
tdm_status tdm_grad_sumsq_segments(const tdm_params *p, int64_t lo, int64_t hi, const float *g, double *sums);
/* The sum of n segment sums, in index order. */
double tdm_grad_sumsq_combine(const double *sums, int64_t n);
/* PyTorch's clipping coefficient: max_norm / (norm + 1e-6) when below 1, else 1 (and 1 when
 * max_norm <= 0). */
float tdm_clip_coef(float norm, float max_norm);
/* g[i] *= coef for n elements, on the pool (nothing when coef is 1). */
void tdm_grad_scale(float *g, int64_t n, float coef);

typedef enum { TDM_LR_CONSTANT, TDM_LR_STEP, TDM_LR_COSINE, TDM_LR_KIND_COUNT } tdm_lr_kind;
typedef struct tdm_lr_schedule {
  tdm_lr_kind kind;
  float base_lr;
  int64_t warmup_steps; /* linear warm-up from base_lr / warmup_steps (all kinds) */
  int64_t total_steps;  /* cosine: decays to min_lr at total_steps */
  float min_lr;
  int64_t step_size;    /* step: multiply by gamma every step_size steps */
  float gamma;
} tdm_lr_schedule;
/* The learning rate for step (0-based). */
float tdm_lr_at(const tdm_lr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
