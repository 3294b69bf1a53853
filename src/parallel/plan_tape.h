/* The memory planner's activations: a training micro-batch (or an evaluation batch) of a model
 * walked op by op with the tape's rules of allocation (src/parallel/plan_tape.c). */
#ifndef TANDEM_PLAN_TAPE_H
#define TANDEM_PLAN_TAPE_H

#include "tandem/nn.h"

typedef struct {
  int64_t bytes; /* the tape's peak bytes in use */
  int64_t nodes; /* the most nodes recorded at once */
  int64_t leaves; /* leaves beyond the parameters (a recomputed block's input) */
} tdm__tape_plan;

/* TDM_ERR_NOT_SUPPORTED for a model whose walk is not written (resnet). */
/* B samples of T tokens (T: language models only); train: gradients recorded, dropout on, then
 * backward (seeded by a tensor of its own when accum > 1); recompute and precision (the autocast
 * dtype) as the tape would. */
tdm_status tdm__plan_tape(const tdm_model_config *m, int64_t B, int64_t T, int64_t accum, int train, tdm_recompute recompute,
                          tdm_dtype precision, tdm__tape_plan *out);

#endif
