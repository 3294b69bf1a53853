/* Type-erased reductions: dst = dst op src. One loop per (dtype, op), generated; bf16 and f16
 * go through f32 in cache-sized pieces. avg accumulates as a sum (the caller divides once). */
#include <math.h>

#include "comm/comm_impl.h"

static const char *redop_names[] = {"sum", "avg", "prod", "min", "max"};
_Static_assert(sizeof redop_names / sizeof redop_names[0] == TDM_REDOP_COUNT, "one name per op");

const char *tdm_redop_name(tdm_redop op) { return (unsigned)op < TDM_REDOP_COUNT ? redop_names[op] : "?"; }

#define LOOP(T, EXPR)                                    \
  do {                                                   \
    T *restrict d = dst;                                 \
    const T *restrict s = src;                           \
    for (size_t i = 0; i < n; i++) d[i] = (EXPR);        \
  } while (0)

#define ALL_OPS(T)                                                         \
  switch (op) {                                                            \
  case TDM_SUM:                                                            \
  case TDM_AVG: LOOP(T, (T)(d[i] + s[i])); break;                          \
  case TDM_PROD: LOOP(T, (T)(d[i] * s[i])); break;                         \
  case TDM_MIN: LOOP(T, s[i] < d[i] ? s[i] : d[i]); break;                 \
  case TDM_MAX: LOOP(T, s[i] > d[i] ? s[i] : d[i]); break;                 \
  default: break;                                                          \
  }

static void reduce_f32(float *dst, const float *src, size_t n, tdm_redop op) {
  switch (op) { /* min/max propagate NaN, as the other paths do not need to */
  case TDM_SUM:
  case TDM_AVG: LOOP(float, d[i] + s[i]); break;
  case TDM_PROD: LOOP(float, d[i] * s[i]); break;
  case TDM_MIN: LOOP(float, fminf(d[i], s[i])); break;
  case TDM_MAX: LOOP(float, fmaxf(d[i], s[i])); break;
  default: break;
  }
}

tdm_status tdm_reduce_local(void *dst, const void *src, size_t n, tdm_dtype dt, tdm_redop op) {
  if (n && (!dst || !src)) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_reduce_local: %s is NULL", !dst ? "dst" : "src");
  if ((unsigned)op >= TDM_REDOP_COUNT) return tdm__set_error(TDM_ERR_INVALID_ARG, "reduce: unknown op %d", (int)op);
  switch (dt) {
  case TDM_F32: reduce_f32(dst, src, n, op); break;
  case TDM_F64: ALL_OPS(double); break;
  case TDM_I32: ALL_OPS(int32_t); break;
  case TDM_I64: ALL_OPS(int64_t); break;
  case TDM_U8: ALL_OPS(uint8_t); break;
  case TDM_BF16:
  case TDM_F16: {
    float a[1024], b[1024];
    uint16_t *d16 = dst;
    const uint16_t *s16 = src;
    for (size_t i = 0; i < n; i += 1024) {
      size_t k = n - i < 1024 ? n - i : 1024;
      tdm_convert(a, TDM_F32, d16 + i, dt, (int64_t)k);
      tdm_convert(b, TDM_F32, s16 + i, dt, (int64_t)k);
      reduce_f32(a, b, k, op);
      tdm_convert(d16 + i, dt, a, TDM_F32, (int64_t)k);
    }
    break;
  }
  default:
    return tdm__set_error(TDM_ERR_INVALID_ARG, "reduce: dtype %d is not reducible", (int)dt);
  }
  return TDM_OK;
}

/* Divides n elements by d (avg's last step). Integers divide, truncating toward zero. */
void tdm__scale_avg(void *buf, size_t n, tdm_dtype dt, int d) {
  switch (dt) {
  case TDM_F32: for (size_t i = 0; i < n; i++) ((float *)buf)[i] /= (float)d; break;
  case TDM_F64: for (size_t i = 0; i < n; i++) ((double *)buf)[i] /= (double)d; break;
  case TDM_I32: for (size_t i = 0; i < n; i++) ((int32_t *)buf)[i] /= d; break;
  case TDM_I64: for (size_t i = 0; i < n; i++) ((int64_t *)buf)[i] /= d; break;
  case TDM_U8: for (size_t i = 0; i < n; i++) ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / d); break;
  case TDM_BF16:
  case TDM_F16: {
    uint16_t *h = buf;
    for (size_t i = 0; i < n; i++) {
      float f = dt == TDM_BF16 ? tdm_bf16_to_f32(h[i]) : tdm_f16_to_f32(h[i]);
      f /= (float)d;
      h[i] = dt == TDM_BF16 ? tdm_f32_to_bf16(f) : tdm_f32_to_f16(f);
    }
    break;
  }
  default: break;
  }
}
