/* tandem — raw f32 kernels: the "low-level engine".
 *
 * Every kernel works on contiguous row-major float arrays the caller owns; none allocates, none
 * checks shapes or pointers (the autograd ops in autograd.h do that and then call these): every
 * pointer argument must be valid, by contract, but for the NULLs listed here. A forward kernel
 * writes its output; a backward kernel ACCUMULATES (+=) into the gradients it is given, so
 * gradients flowing from several uses add up.
 * NULL is accepted only as: a bias b of linear_fwd and conv2d_fwd* (none; bn_fwd needs b); a gradient
 * "not needed" of linear_bwd (dx, dw, db), layernorm_bwd (dx, dw, db), rmsnorm_bwd (dx, dw),
 * swiglu_bwd (dgate, dup), relu_bwd2 (ga, gb) and conv2d_bwd / _bwd_batched / _bwd_direct (dx,
 * dw, db); the bn kernels' relu_y (no fused ReLU); and a NULL tdm_conv_shape in the workspace
 * sizers (conv2d_chunk, conv2d_ws_floats, conv2d_direct_fits, conv2d_direct_ws_floats: 0).
 * Every other gradient output is required: dx of the one-gradient backward kernels (relu, gelu,
 * tanh, sigmoid, softmax, log_softmax, dropout, rope, the pools, bn_bwd_dx, and their _set forms),
 * dqkv of attention_bwd, dq, dk and dv of attention_gqa_bwd, dlogits of cross_entropy_bwd and
 * dtable of embedding_bwd.
 * They run on the intra-op pool (core.h) where the work is large enough, and through OpenBLAS
 * for matrix products. Thread-safe for distinct outputs.
 *
 * Hand-written training loop (see src/nn/mlp_lowlevel.c):
 *   tdm_k_linear_fwd(h, x, w1, b1, B, 784, 512);   // h = x w1^T + b1
 *   tdm_k_relu_fwd(h, h, B * 512);
 *   ...
 *   tdm_k_linear_bwd(dx, dw1, db1, dh, x, w1, B, 784, 512);
 */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C (M, N) = alpha * op(A) op(B) + beta * C, row-major, op = transpose when ta / tb. */
void tdm_k_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* out (N, O) = x (N, I) @ w^T (w is (O, I), as nn.Linear) + b (O, or NULL). */
void tdm_k_linear_fwd(float *out, const float *x, const float *w, const float *b, int64_t N, int64_t In, int64_t O);
/* dx (N, I) += dout w; dw (O, I) += dout^T x; db (O) += column sums of dout. */
void tdm_k_linear_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int64_t N,
                      int64_t In, int64_t O);

/* Element-wise activations; out may equal x. Backward takes the forward input x. */
void tdm_k_zero(float *x, int64_t n);                                    /* x = 0 */
void tdm_k_add(float *out, const float *x, const float *y, int64_t n);   /* out = x + y */
void tdm_k_axpy(float *out, float alpha, const float *x, int64_t n);     /* out += alpha x */
void tdm_k_scale(float *out, float alpha, const float *x, int64_t n);    /* out = alpha x */
void tdm_k_relu_fwd(float *out, const float *x, int64_t n);
void tdm_k_relu_bwd(float *dx, const float *dout, const float *x, int64_t n);
void tdm_k_relu_bwd_set(float *dx, const float *dout, const float *x, int64_t n); /* dx = ..., not += */
/* out = relu(x + y); its backward from the output y: ga and gb (either may be NULL) get dout
 * where y > 0, written when set_*, else added to. */
void tdm_k_add_relu(float *out, const float *x, const float *y, int64_t n);
void tdm_k_relu_bwd2(float *ga, int set_a, float *gb, int set_b, const float *dout, const float *y, int64_t n);
void tdm_k_gelu_fwd(float *out, const float *x, int64_t n); /* tanh approximation, as GPT-2 */
void tdm_k_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n);
void tdm_k_gelu_bwd_set(float *dx, const float *dout, const float *x, int64_t n); /* dx = ..., not += */
void tdm_k_tanh_fwd(float *out, const float *x, int64_t n);
void tdm_k_tanh_bwd(float *dx, const float *dout, const float *y, int64_t n);    /* y = forward output */
void tdm_k_sigmoid_fwd(float *out, const float *x, int64_t n);
void tdm_k_sigmoid_bwd(float *dx, const float *dout, const float *y, int64_t n); /* y = forward output */

/* Softmax / log-softmax along the middle axis of an (outer, n, inner) layout. */
void tdm_k_softmax_fwd(float *y, const float *x, int64_t outer, int64_t n, int64_t inner);
void tdm_k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner);
void tdm_k_log_softmax_fwd(float *y, const float *x, int64_t outer, int64_t n, int64_t inner);
void tdm_k_log_softmax_bwd(float *dx, const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner);

/* Mean cross-entropy of logits (N, C) against integer targets (N), skipping targets equal to
 * ignore_index. Writes each row's log-sum-exp to lse (N) for the backward pass and the number
 * of counted rows to *count. Returns the mean loss (0 when no row counts). A target outside
 * [0, C) that is not ignore_index makes it return NAN and set *bad_row. */
float tdm_k_cross_entropy_fwd(const float *logits, const void *targets, int targets_i64, int64_t N, int64_t C,
                              int64_t ignore_index, float *lse, int64_t *count, int64_t *bad_row);
/* dlogits += scale * (softmax(logits) - onehot(target)) per counted row; scale = dloss / count. */
void tdm_k_cross_entropy_bwd(float *dlogits, const float *logits, const void *targets, int targets_i64, int64_t N,
                             int64_t C, int64_t ignore_index, const float *lse, float scale);

/* LayerNorm over the last axis of x (N, C), with weight and bias (C). Saves mean and rstd (N). */
void tdm_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                         int64_t N, int64_t C, float eps);
void tdm_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                         const float *mean, const float *rstd, int64_t N, int64_t C);

/* out (N, C) = table[idx[i]] with idx i32 or i64 (N); backward scatter-adds into dtable. */
void tdm_k_embedding_fwd(float *out, const float *table, const void *idx, int idx_i64, int64_t N, int64_t C);
void tdm_k_embedding_bwd(float *dtable, const float *dout, const void *idx, int idx_i64, int64_t N, int64_t C);

/* Inverted dropout whose mask depends only on (seed, base + i): element i is kept when a
 * counter hash of (seed, base + i) maps to a uniform >= p, then scaled by 1 / (1 - p). */
void tdm_k_dropout_fwd(float *out, const float *x, int64_t n, float p, uint64_t seed, uint64_t base);
void tdm_k_dropout_bwd(float *dx, const float *dout, int64_t n, float p, uint64_t seed, uint64_t base);

/* Causal multi-head self-attention on packed qkv (B, T, 3C) -> out (B, T, C), NH heads.
 * att (B, NH, T, T) receives the attention probabilities (zeros above the diagonal).
 * Backward needs scratch of B * NH * T * T floats and accumulates into dqkv (B, T, 3C), or
 * overwrites it when accumulate is 0. */
void tdm_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t NH);
void tdm_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *att, const float *qkv, int64_t B,
                         int64_t T, int64_t C, int64_t NH, int accumulate);

/* Grouped-query attention (Llama): q (B, T, NH*hs), k and v (B, T, NKV*hs), NKV dividing NH; query
 * head h attends with key/value head h / (NH / NKV). out (B, T, NH*hs); att (B, NH, T, T) as above.
 * Backward: scratch of B*NH*T*T floats; dq, dk, dv as accumulate says. */
void tdm_k_attention_gqa_fwd(float *out, float *att, const float *q, const float *k, const float *v, int64_t B,
                             int64_t T, int64_t NH, int64_t NKV, int64_t hs);
void tdm_k_attention_gqa_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *att,
                             const float *q, const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                             int64_t NKV, int64_t hs, int accumulate);
/* Only the probabilities att (B, NH, T, T), bit for bit what the forward kernels store (selective
 * recomputation rebuilds them in backward); ldq and ldkv are the row strides of q and k. */
void tdm_k_attention_probs(float *att, const float *q, const float *k, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t hs, int64_t ldq, int64_t ldkv);

/* RMSNorm over the last axis of x (N, C) with weight (C), as Llama: x / sqrt(mean(x^2) + eps) * w.
 * Saves rstd (N). Backward: dx and dw (either may be NULL) accumulate. */
void tdm_k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t C, float eps);
void tdm_k_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                       int64_t N, int64_t C);

/* Rotary position embeddings in Hugging Face's layout (rotate_half: each head's first and second
 * halves pair up, so Hugging Face's q/k weights load unpermuted). The table holds cos and sin of
 * position x frequency, (T, hs/2) each, for positions pos0 .. pos0 + T - 1. */
typedef struct tdm_k_rope_params {
  float theta;              /* base of the frequencies (Llama 3: 500000) */
  float factor;             /* Llama 3's scaling of long wavelengths: 0 = none, else the factor (32) */
  float low_freq_factor, high_freq_factor; /* (1, 4) */
  int64_t original_max_pos; /* the context the model was first trained for (8192) */
} tdm_k_rope_params;
void tdm_k_rope_table(float *cos_t, float *sin_t, int64_t pos0, int64_t T, int64_t hs, const tdm_k_rope_params *p);
/* x (B, T, H*hs) -> out (B, T, H*hs), not in place. Backward rotates back; accumulate: dx += ... */
void tdm_k_rope_fwd(float *out, const float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t H,
                    int64_t hs);
void tdm_k_rope_bwd(float *dx, const float *dout, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                    int64_t H, int64_t hs, int accumulate);

/* SwiGLU's gate: out = silu(gate) * up, element-wise over n. Backward writes (acc 0) or adds
 * (acc 1) dgate and dup (either may be NULL). */
void tdm_k_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n);
void tdm_k_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n,
                      int acc_gate, int acc_up);

/* f32 <-> bf16 / f16 (16-bit values as uint16_t), round to nearest even; round_*: f32 values
 * rounded to the 16-bit type's precision, kept as f32 (in place allowed). */
void tdm_k_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
void tdm_k_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);
void tdm_k_f32_to_f16(uint16_t *dst, const float *src, int64_t n);
void tdm_k_f16_to_f32(float *dst, const uint16_t *src, int64_t n);
void tdm_k_round_bf16(float *dst, const float *src, int64_t n);
void tdm_k_round_f16(float *dst, const float *src, int64_t n);

/* conv2d on x (N, Ci, H, W) with w (Co, Ci, KH, KW), b (Co) -> out (N, Co, OH, OW), where
 * OH = (H + 2 pad - KH) / stride + 1. col is scratch of Ci*KH*KW * OH*OW floats. */
typedef struct tdm_conv_shape {
  int64_t N, Ci, H, W, Co, KH, KW, stride, pad, OH, OW;
} tdm_conv_shape;
void tdm_k_conv2d_fwd(float *out, const float *x, const float *w, const float *b, float *col, const tdm_conv_shape *s);
void tdm_k_conv2d_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, float *col,
                      const tdm_conv_shape *s);

/* The same convolution on the whole batch: chunks of tdm_k_conv2d_chunk(s) images, each one
 * im2col and one GEMM over all of its images' pixels (no per-image product). ws is scratch of
 * tdm_k_conv2d_ws_floats(s) floats. Backward accumulates into dx, dw, db (NULL: not needed), or
 * with dx_set writes dx (its contents ignored: an activation's first gradient needs no zeroing). */
int64_t tdm_k_conv2d_chunk(const tdm_conv_shape *s);
int64_t tdm_k_conv2d_ws_floats(const tdm_conv_shape *s);
void tdm_k_conv2d_fwd_batched(float *out, const float *x, const float *w, const float *b, float *ws,
                              const tdm_conv_shape *s);
void tdm_k_conv2d_bwd_batched(float *dx, int dx_set, float *dw, float *db, const float *dout, const float *x,
                              const float *w, float *ws, const tdm_conv_shape *s);
/* The batched kernels above run these where they fit: stride 1 with 3x3 pad 1 or 5x5 pad 2, or
 * stride 2 with 3x3 pad 1, where the CPU has AVX-512 or AVX2 with FMA and TANDEM_CONV=im2col
 * did not turn them off (kernels_conv_direct.c: no column matrix; ws of
 * tdm_k_conv2d_direct_ws_floats(s) floats, 0 where it does not fit; a strided dx as four
 * stride-1 convolutions, one per phase of the input). */
int tdm_k_conv2d_direct_fits(const tdm_conv_shape *s);
/* Turns the direct kernels on or off for the whole process (benchmarks compare the paths);
 * overrides TANDEM_CONV. Call it between steps. */
void tdm_k_conv2d_direct_enable(int on);
/* The kernels the direct path runs, chosen at the first call from the CPU (AVX-512, else AVX2
 * with FMA) or TANDEM_CONV=avx2|avx512: "avx512", "avx2", or NULL where every convolution runs
 * im2col + GEMM (this CPU or a non-x86 build has neither, or the path is off: TANDEM_CONV=im2col,
 * tdm_k_conv2d_direct_enable(0)). A static string. */
const char *tdm_k_conv2d_direct_isa(void);
/* Runs the "avx512" or "avx2" kernels from now on (NULL: the CPU's best): 1, or 0 where this CPU
 * or build lacks them (nothing changes). Call it between steps (a step running on another thread
 * may see either set; the workspace size covers both). For tests and benchmarks. */
int tdm_k_conv2d_direct_select(const char *isa);
int64_t tdm_k_conv2d_direct_ws_floats(const tdm_conv_shape *s);
/* Of the direct path's shapes, 3x3 stride 1 pad 1 and 5x5 stride 1 pad 2 with 8 channels or more
 * each way run their forward, input gradient and weight gradient as Winograd F(4x4, 3x3) and
 * F(2x2, 5x5) (4x and 2.78x fewer multiplies where the image is a whole number of tiles;
 * results within the reference tests' tolerance of the direct kernel's; the forward's and input
 * gradient's bits independent of threads and batch split, the weight gradient's of threads). On unless
 * TANDEM_WINOGRAD=off or tdm_k_conv2d_winograd_enable(0), which returns the setting before
 * (call it between steps). winograd_on: 1 where shape s runs it now (s NULL: where it would fit,
 * the direct path being on). winograd_tile(2) runs the 3x3 ones as F(2x2, 3x3) instead (2.25x
 * fewer multiplies, a fifth of the rounding error; TANDEM_WINOGRAD=2x2), winograd_tile(4) as
 * F(4x4, 3x3) again: it returns the tile before (any other value changes nothing, so 0 asks for
 * it). Between steps, too. */
int tdm_k_conv2d_winograd_enable(int on);
int tdm_k_conv2d_winograd_tile(int tile);
int tdm_k_conv2d_winograd_on(const tdm_conv_shape *s);
void tdm_k_conv2d_fwd_direct(float *out, const float *x, const float *w, const float *b, float *ws,
                             const tdm_conv_shape *s);
void tdm_k_conv2d_bwd_direct(float *dx, int dx_set, float *dw, float *db, const float *dout, const float *x,
                             const float *w, float *ws, const tdm_conv_shape *s);

/* Batch normalization over x (N, C, HW), per channel. sums: sum[c] and sumsq[c] of x (double,
 * written). fwd: y = (x - mean) * rstd * w + b, then max(y, 0) when relu. bwd_sums: sdy[c] = sum
 * dy, sdyx[c] = sum dy * xhat (written). bwd_dx: dx += w rstd (dy - (sdy + xhat sdyx) / M), with M
 * the values per channel the statistics came from (M = 0: fixed statistics, dx += w rstd dy).
 * relu (the forward fused a ReLU; w and b are read for it): dy counts only where the forward's
 * output was > 0, as ReLU's backward would have passed it, bit for bit; the mask is formed again
 * from x, w, b, mean and rstd, which must be the forward's. */
void tdm_k_bn_sums(const float *x, int64_t N, int64_t C, int64_t HW, double *sum, double *sumsq);
void tdm_k_bn_fwd(float *y, const float *x, const float *w, const float *b, const float *mean, const float *rstd,
                  int64_t N, int64_t C, int64_t HW, int relu);
void tdm_k_bn_bwd_sums(const float *dy, const float *x, const float *w, const float *b, const float *mean,
                       const float *rstd, int relu, int64_t N, int64_t C, int64_t HW, double *sdy, double *sdyx);
void tdm_k_bn_bwd_dx(float *dx, const float *dy, const float *x, const float *w, const float *b, const float *mean,
                     const float *rstd, int relu, const double *sdy, const double *sdyx, double M, int64_t N, int64_t C,
                     int64_t HW);
/* The same, writing dx (its contents are ignored) instead of adding to it. */
void tdm_k_bn_bwd_dx_set(float *dx, const float *dy, const float *x, const float *w, const float *b, const float *mean,
                         const float *rstd, int relu, const double *sdy, const double *sdyx, double M, int64_t N,
                         int64_t C, int64_t HW);

/* relu(bn(x) + r), r (N, C, HW) a residual: y bit for bit tdm_k_add_relu of tdm_k_bn_fwd's
 * output (relu 0) and r, without that output written. (Backward: tdm_k_relu_bwd2 on y, then
 * bwd_sums and bwd_dx, relu 0, on the masked dy.) */
void tdm_k_bn_fwd_add_relu(float *y, const float *x, const float *r, const float *w, const float *b, const float *mean,
                           const float *rstd, int64_t N, int64_t C, int64_t HW);

/* Pooling over (N, C, H, W) with a K x K window; pad counts as -inf for max and as zeros for avg
 * (count_include_pad, as PyTorch's default). argmax (N, C, OH, OW) records the max's index. */
void tdm_k_maxpool2d_fwd(float *out, int32_t *argmax, const float *x, int64_t N, int64_t C, int64_t H, int64_t W,
                         int64_t K, int64_t stride, int64_t pad, int64_t OH, int64_t OW);
void tdm_k_maxpool2d_bwd(float *dx, const float *dout, const int32_t *argmax, int64_t N, int64_t C, int64_t H,
                         int64_t W, int64_t OH, int64_t OW);
void tdm_k_avgpool2d_fwd(float *out, const float *x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t stride, int64_t pad, int64_t OH, int64_t OW);
void tdm_k_avgpool2d_bwd(float *dx, const float *dout, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t stride, int64_t pad, int64_t OH, int64_t OW);

#ifdef __cplusplus
}
#endif
#endif
