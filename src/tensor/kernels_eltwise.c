/* Element-wise activations, split over the intra-op pool when large. */
#include <math.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

#define MIN_CHUNK 32768

typedef struct {
  float *out;
  const float *a, *b;
} ew_ctx;

/* Defines a range worker NAME_range(ctx, begin, end) running BODY for each i, and the kernel. */
#define EW_KERNEL(name, params, setup, body)                                 \
  static void name##_range(void *vc, int64_t i0, int64_t i1) {               \
    ew_ctx *c = vc;                                                          \
    float *restrict out = c->out;                                            \
    const float *restrict a = c->a;                                          \
    const float *restrict b = c->b;                                          \
    (void)a;                                                                 \
    (void)b;                                                                 \
    for (int64_t i = i0; i < i1; i++) { body; }                              \
  }                                                                          \
  void name params {                                                         \
    ew_ctx c;                                                                \
    setup;                                                                   \
    tdm_parallel_for(n, MIN_CHUNK, name##_range, &c);                       \
  }

/* Backward kernels accumulate into out (= dx): a = dout, b = the saved forward value. */
EW_KERNEL(tdm_k_relu_fwd, (float *out, const float *x, int64_t n), (c.out = out, c.a = x, c.b = 0),
          out[i] = a[i] > 0.0f ? a[i] : 0.0f)
EW_KERNEL(tdm_k_relu_bwd, (float *dx, const float *dout, const float *x, int64_t n),
          (c.out = dx, c.a = dout, c.b = x), out[i] += b[i] > 0.0f ? a[i] : 0.0f)

/* tanh for GELU, written so the loop vectorises (libm's tanhf is a scalar call and made GELU a
 * third of a GPT training step): tanh(u) = (e - 1) / (e + 1) with e = exp(2u) from a range
 * reduction to [-ln2/2, ln2/2] and a degree-6 polynomial; |u| is clamped at 9, where tanh is 1
 * in f32. Absolute error about 1e-7. */
static inline float tanh_fast(float u) {
  float x = u > 9.0f ? 9.0f : (u < -9.0f ? -9.0f : u);
  float y = 2.0f * x;
  float n = __builtin_roundf(y * 1.44269504088896341f); /* y / ln 2 */
  float r = y - n * 0.693145751953125f - n * 1.428606765330187e-06f; /* ln 2 in two parts */
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * 0.0013888889f)))));
  union {
    float f;
    int32_t i;
  } scale = {.i = ((int32_t)n + 127) << 23};
  float e = p * scale.f;
  return (e - 1.0f) / (e + 1.0f);
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
EW_KERNEL(tdm_k_gelu_fwd, (float *out, const float *x, int64_t n), (c.out = out, c.a = x, c.b = 0), {
  float v = a[i];
  out[i] = 0.5f * v * (1.0f + tanh_fast(GELU_K * (v + 0.044715f * v * v * v)));
})
EW_KERNEL(tdm_k_gelu_bwd, (float *dx, const float *dout, const float *x, int64_t n),
          (c.out = dx, c.a = dout, c.b = x), {
            float v = b[i];
            float u = GELU_K * (v + 0.044715f * v * v * v);
            float t = tanh_fast(u);
            float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
            out[i] += a[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
          })
EW_KERNEL(tdm_k_tanh_fwd, (float *out, const float *x, int64_t n), (c.out = out, c.a = x, c.b = 0),
          out[i] = tanhf(a[i]))
EW_KERNEL(tdm_k_tanh_bwd, (float *dx, const float *dout, const float *y, int64_t n),
          (c.out = dx, c.a = dout, c.b = y), out[i] += a[i] * (1.0f - b[i] * b[i]))
EW_KERNEL(tdm_k_sigmoid_fwd, (float *out, const float *x, int64_t n), (c.out = out, c.a = x, c.b = 0), {
  float v = a[i]; /* the branch keeps expf from overflowing for large |v| */
  out[i] = v >= 0.0f ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
})
EW_KERNEL(tdm_k_sigmoid_bwd, (float *dx, const float *dout, const float *y, int64_t n),
          (c.out = dx, c.a = dout, c.b = y), out[i] += a[i] * b[i] * (1.0f - b[i]))
