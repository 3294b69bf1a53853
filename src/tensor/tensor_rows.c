/* Row-wise reads of a tensor in any float dtype (f32, bf16, f16): what counting correct
 * predictions needs from logits that mixed precision keeps in 16 bits. */
#include "core/internal.h"
#include "tensor/tensor_impl.h"

int64_t tdm_tensor_row_argmax(const tdm_tensor *t, int64_t row) {
  TDM__NONNULL(t, -1, "tdm_tensor_row_argmax: the tensor is NULL");
  int64_t C = t->ndim ? t->shape[t->ndim - 1] : 1, best = 0;
  if (C <= 0 || row < 0 || row >= t->numel / C) return -1; /* the header's -1: no such row */
  const void *base = (const char *)t->data + (size_t)(row * C) * tdm_dtype_size(t->dtype);
  switch (t->dtype) {
  case TDM_F32: {
    const float *x = base;
    for (int64_t c = 1; c < C; c++)
      if (x[c] > x[best]) best = c;
    return best;
  }
  case TDM_BF16:
  case TDM_F16: {
    const uint16_t *x = base;
    float (*f)(uint16_t) = t->dtype == TDM_BF16 ? tdm_bf16_to_f32 : tdm_f16_to_f32;
    float m = f(x[0]);
    for (int64_t c = 1; c < C; c++)
      if (f(x[c]) > m) m = f(x[c]), best = c;
    return best;
  }
  default:
    return -1;
  }
}
