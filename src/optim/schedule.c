#include <math.h>

#include "core/internal.h"
#include "tandem/optim.h"

float tdm_lr_at(const tdm_lr_schedule *s, int64_t step) {
  TDM__NONNULL(s, NAN, "tdm_lr_at: the schedule is NULL");
  if (step < s->warmup_steps) return s->base_lr * (float)(step + 1) / (float)s->warmup_steps;
  switch (s->kind) {
  case TDM_LR_STEP:
    if (s->step_size <= 0) return s->base_lr;
    return s->base_lr * powf(s->gamma, (float)((step - s->warmup_steps) / s->step_size));
  case TDM_LR_COSINE: {
    int64_t span = s->total_steps - s->warmup_steps;
    if (span <= 0 || step >= s->total_steps) return s->min_lr;
    float t = (float)(step - s->warmup_steps) / (float)span;
    return s->min_lr + 0.5f * (s->base_lr - s->min_lr) * (1.0f + cosf(3.14159265358979f * t));
  }
  default:
    return s->base_lr;
  }
}
