/* Element-wise activations, split over the intra-op pool when large. */
#include <math.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

#define MIN_CHUNK 32768

typedef struct {
  float *out;
  const float *a, *b;
  float s;
} ew_ctx;

/* Defines a range worker NAME_range(ctx, begin, end) running BODY for each i, and the kernel. */
#define EW_KERNEL(name, params, setup, body)                                 \
  static void name##_range(void *vc, int64_t i0, int64_t i1) {               \
    ew_ctx *c = vc;                                                          \
    float *restrict out = c->out;                                            \
    const float *restrict a = c->a;                                          \
    const float *restrict b = c->b;                                          \
    const float s = c->s;                                                    \
    (void)a;                                                                 \
    (void)b;                                                                 \
    (void)s;                                                                 \
    for (int64_t i = i0; i < i1; i++) { body; }                              \
  }                                                                          \
  void name params {                                                         \
    ew_ctx c = {0};                                                          \
    setup;                                                                   \
    tdm_parallel_for(n, MIN_CHUNK, name##_range, &c);                       \
  }

static void zero_range(void *ctx, int64_t b, int64_t e) { memset((float *)ctx + b, 0, sizeof(float) * (size_t)(e - b)); }

void tdm_k_zero(float *x, int64_t n) { tdm_parallel_for(n, 1 << 17, zero_range, x); }

/* Element-wise arithmetic of same-shaped tensors (the residual stream's adds and their grads) */
EW_KERNEL(tdm_k_add, (float *out, const float *x, const float *y, int64_t n), (c.out = out, c.a = x, c.b = y),
          out[i] = a[i] + b[i])
EW_KERNEL(tdm_k_scale, (float *out, float alpha, const float *x, int64_t n), (c.out = out, c.a = x, c.s = alpha),
          out[i] = s * a[i])
EW_KERNEL(tdm_k_axpy, (float *out, float alpha, const float *x, int64_t n), (c.out = out, c.a = x, c.s = alpha),
          out[i] += s * a[i])

/* Backward kernels accumulate into out (= dx): a = dout, b = the saved forward value. */
EW_KERNEL(tdm_k_relu_fwd, (float *out, const float *x, int64_t n), (c.out = out, c.a = x, c.b = 0),
          out[i] = a[i] > 0.0f ? a[i] : 0.0f)
EW_KERNEL(tdm_k_relu_bwd, (float *dx, const float *dout, const float *x, int64_t n),
          (c.out = dx, c.a = dout, c.b = x), out[i] += b[i] > 0.0f ? a[i] : 0.0f)
EW_KERNEL(tdm_k_relu_bwd_set, (float *dx, const float *dout, const float *x, int64_t n),
          (c.out = dx, c.a = dout, c.b = x), out[i] = b[i] > 0.0f ? a[i] : 0.0f)

/* relu(x + y), and its backward to both addends from the output's sign: the residual block's
 * end in one pass each way (the expressions of tdm_k_add, tdm_k_relu_fwd and tdm_k_relu_bwd_set,
 * so the values are the two ops' bit for bit). */
EW_KERNEL(tdm_k_add_relu, (float *out, const float *x, const float *y, int64_t n), (c.out = out, c.a = x, c.b = y), {
  float v = a[i] + b[i];
  out[i] = v > 0.0f ? v : 0.0f;
})

typedef struct {
  float *ga, *gb;
  const float *dy, *y;
  int set_a, set_b;
} mask2_ctx;

static void relu_bwd2_range(void *vc, int64_t i0, int64_t i1) {
  mask2_ctx *c = vc;
  float *restrict ga = c->ga, *restrict gb = c->gb;
  const float *restrict dy = c->dy, *restrict y = c->y;
  for (int64_t i = i0; i < i1; i++) { /* the flags are the same for every i: the compiler splits the loop */
    float g = y[i] > 0.0f ? dy[i] : 0.0f;
    if (ga) ga[i] = c->set_a ? g : ga[i] + g;
    if (gb) gb[i] = c->set_b ? g : gb[i] + g;
  }
}

void tdm_k_relu_bwd2(float *ga, int set_a, float *gb, int set_b, const float *dout, const float *y, int64_t n) {
  mask2_ctx c = {ga, gb, dout, y, set_a, set_b};
  tdm_parallel_for(n, MIN_CHUNK, relu_bwd2_range, &c);
}

/* GELU with the tanh approximation, as 0.5 (1 + tanh(u)) = sigmoid(2u): one exp and one division */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
EW_KERNEL(tdm_k_gelu_fwd, (float *out, const float *x, int64_t n), (c.out = out, c.a = x, c.b = 0), {
  float v = a[i];
  out[i] = v * tdm__sigmoid(2.0f * GELU_K * (v + 0.044715f * v * v * v));
})
static inline float gelu_grad(float v) { /* d gelu(v) / dv */
  float sg = tdm__sigmoid(2.0f * GELU_K * (v + 0.044715f * v * v * v));
  float du = GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
  return sg + 2.0f * v * sg * (1.0f - sg) * du;
}
EW_KERNEL(tdm_k_gelu_bwd, (float *dx, const float *dout, const float *x, int64_t n),
          (c.out = dx, c.a = dout, c.b = x), out[i] += a[i] * gelu_grad(b[i]))
EW_KERNEL(tdm_k_gelu_bwd_set, (float *dx, const float *dout, const float *x, int64_t n),
          (c.out = dx, c.a = dout, c.b = x), out[i] = a[i] * gelu_grad(b[i]))
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
