/* Mixed precision on the tape: activations (and their gradients) stored in bf16 or f16, computed
 * in f32. The helpers convert between a tensor's storage and f32 scratch taken from the arena; an
 * op brackets them with tdm__arena_mark / tdm__arena_rewind, so the f32 copies live only while the
 * op runs and the tape keeps the 16-bit values alone. */
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

tdm_status tdm_tape_set_autocast(tdm_tape *tp, tdm_dtype dt) {
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "tape_set_autocast: the tape is NULL");
  if (dt != TDM_F32 && dt != TDM_BF16 && dt != TDM_F16)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tape_set_autocast: dtype %s; expected f32 (off), bf16 or f16",
                          tdm_dtype_name(dt));
  tp->autocast = dt;
  return TDM_OK;
}

tdm_dtype tdm_tape_autocast(const tdm_tape *tp) {
  TDM__NONNULL(tp, TDM_F32, "tdm_tape_autocast: the tape is NULL");
  return tp->autocast;
}

int tdm__check_act(tdm_tape *tp, const char *op, const char *what, const tdm_tensor *t) {
  if (t->dtype == TDM_F32 || t->dtype == TDM_BF16 || t->dtype == TDM_F16) return 1;
  tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: %s %s has dtype %s; expected f32, bf16 or f16", op, what, tdm__shp(t),
            tdm_dtype_name(t->dtype));
  return 0;
}

tdm_dtype tdm__act_dtype(const tdm_tape *tp) { return tp->autocast == TDM_BF16 || tp->autocast == TDM_F16 ? tp->autocast : TDM_F32; }

static void to_f32(float *dst, const void *src, tdm_dtype dt, int64_t n) {
  if (dt == TDM_BF16) tdm_k_bf16_to_f32(dst, src, n);
  else if (dt == TDM_F16) tdm_k_f16_to_f32(dst, src, n);
  else if (dst != src) memcpy(dst, src, sizeof(float) * (size_t)n);
}

static void from_f32(void *dst, tdm_dtype dt, const float *src, int64_t n) {
  if (dt == TDM_BF16) tdm_k_f32_to_bf16(dst, src, n);
  else if (dt == TDM_F16) tdm_k_f32_to_f16(dst, src, n);
  else if (dst != src) memcpy(dst, src, sizeof(float) * (size_t)n);
}

const float *tdm__f32(tdm_tape *tp, const tdm_tensor *t) {
  if (!t) return NULL;
  if (t->dtype == TDM_F32) return t->data;
  float *buf = tdm__scratch(tp, sizeof(float) * (size_t)(t->numel ? t->numel : 1));
  if (buf) to_f32(buf, t->data, t->dtype, t->numel);
  return buf;
}

float *tdm__f32_out(tdm_tape *tp, tdm_tensor *y) {
  if (y->dtype == TDM_F32) return y->data;
  return tdm__scratch(tp, sizeof(float) * (size_t)(y->numel ? y->numel : 1));
}

void tdm__store_f32(tdm_tensor *y, const float *buf) {
  if (buf) from_f32(y->data, y->dtype, buf, y->numel);
}

float *tdm__grad_f32(tdm_tape *tp, const tdm_tensor *t, void *grad, int fresh) {
  if (!grad) return NULL;
  if (t->grad->dtype == TDM_F32) return grad;
  float *buf = tdm__scratch(tp, sizeof(float) * (size_t)(t->numel ? t->numel : 1));
  if (buf && !fresh) to_f32(buf, grad, t->grad->dtype, t->numel);
  return buf;
}

void tdm__grad_commit(const tdm_tensor *t, void *grad, const float *buf) {
  if (grad && buf && t->grad->dtype != TDM_F32) from_f32(grad, t->grad->dtype, buf, t->numel);
}

const float *tdm__f32_part(const void *data, tdm_dtype dt, int64_t off, int64_t n, float *buf) {
  if (dt == TDM_F32) return (const float *)data + off;
  to_f32(buf, (const uint16_t *)data + off, dt, n);
  return buf;
}

float *tdm__grad_f32_part(void *grad, tdm_dtype dt, int64_t off, int64_t n, int fresh, float *buf) {
  if (!grad) return NULL;
  if (dt == TDM_F32) return (float *)grad + off;
  if (!fresh) to_f32(buf, (const uint16_t *)grad + off, dt, n);
  return buf;
}

void tdm__grad_commit_part(void *grad, tdm_dtype dt, int64_t off, int64_t n, const float *buf) {
  if (grad && dt != TDM_F32) from_f32((uint16_t *)grad + off, dt, buf, n);
}

const float *tdm__f32_round(tdm_tape *tp, const tdm_tensor *t, tdm_dtype dt) {
  if (!t) return NULL;
  if ((dt != TDM_BF16 && dt != TDM_F16) || t->dtype == dt) return tdm__f32(tp, t);
  float *buf = tdm__scratch(tp, sizeof(float) * (size_t)(t->numel ? t->numel : 1));
  if (!buf) return NULL;
  to_f32(buf, t->data, t->dtype, t->numel);
  if (dt == TDM_BF16) tdm_k_round_bf16(buf, buf, t->numel);
  else tdm_k_round_f16(buf, buf, t->numel);
  return buf;
}
