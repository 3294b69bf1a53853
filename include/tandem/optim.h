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
void tdm_optim_destroy(tdm_optim *o);
/* One update with this learning rate (schedules pass theirs; cfg.lr is the default). */
tdm_status tdm_optim_step(tdm_optim *o, float lr);
int64_t tdm_optim_steps(const tdm_optim *o);
/* The state buffer (for checkpoints): n_state_floats = 0 (plain SGD), numel (momentum) or
 * 2 x numel (Adam: m then v). set_steps restores the step count used for bias correction. */
float *tdm_optim_state(const tdm_optim *o, int64_t *n_floats);
void tdm_optim_set_steps(tdm_optim *o, int64_t steps);

/* Scales all gradients so that their global L2 norm is at most max_norm (as PyTorch's
 * clip_grad_norm_); *norm_out receives the norm before clipping. max_norm <= 0 only measures. */
tdm_status tdm_clip_grad_norm(tdm_params *p, float max_norm, float *norm_out);

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
