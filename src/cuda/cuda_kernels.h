/* tandem's CUDA kernels: the launchers of src/cuda/ (.cu files) (private to the library and its tests).
 *
 * Every pointer is device memory (cudaMalloc), contiguous row-major, as the CPU kernels of
 * tandem/kernels.h take it; every launcher queues its work on the legacy default stream (stream 0:
 * one stream, so kernels run in call order) and returns at once, without checking shapes. Launch
 * errors surface through tdm_cu_check() (cudaGetLastError), which the host code calls after each
 * phase. Backward kernels follow the CPU convention where the comment says "+=": they accumulate.
 * Not thread-safe: one host thread drives the device at a time (cuBLAS's handle is global). */
#ifndef TANDEM_CUDA_KERNELS_H
#define TANDEM_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The last launch error: 0 or a cudaError_t, its text in *msg (static storage). */
int tdm_cu_check(const char **msg);

/* ---- gemm.cu: cuBLAS ---------------------------------------------------------------------------
 * Row-major C (M, N) = alpha op(A) op(B) + beta C, op = transpose where ta / tb. dtype of A and B:
 * TDM_CU_F32 (fp32, or TF32 tensor cores after tdm_cu_gemm_set_tf32(1)) or TDM_CU_BF16 (bf16
 * inputs, fp32 accumulation); C is f32, or bf16 when c_bf16. Returns 0 or a cublasStatus_t. */
enum { TDM_CU_F32 = 0, TDM_CU_BF16 = 1 };
int tdm_cu_blas_init(void); /* loads cuBLAS (dlopen) and creates the handle (once); 0 or not (tdm_cu_blas_load_error says why) */
const char *tdm_cu_blas_load_error(void);
void tdm_cu_blas_shutdown(void);
void tdm_cu_gemm_set_tf32(int on);
int tdm_cu_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda, const void *B,
                int64_t ldb, float beta, void *C, int64_t ldc, int dtype, int c_bf16);
/* batch products: matrix i of A at A + i * sA elements, likewise B and C */
int tdm_cu_gemm_batched(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                        int64_t sA, const void *B, int64_t ldb, int64_t sB, float beta, void *C, int64_t ldc, int64_t sC,
                        int64_t batch, int dtype, int c_bf16);

/* ---- bias.cu ------------------------------------------------------------------------------------- */
void tdm_cu_bias_fwd(float *out, const float *b, int64_t N, int64_t O);  /* out (N, O) += b (O) per row */
void tdm_cu_bias_bwd(float *db, const float *dout, int64_t N, int64_t O); /* db (O) += column sums of dout (atomics per chunk of rows) */

/* ---- residual.cu ------------------------------------------------------------------------------- */
void tdm_cu_add(float *out, const float *x, const float *y, int64_t n); /* out = x + y */
/* out (N, C) = res + y + b (b per column, may be NULL): a projection's bias and the residual add in one pass */
void tdm_cu_residual_bias_add(float *out, const float *res, const float *y, const float *b, int64_t N, int64_t C);
void tdm_cu_scale(float *x, float alpha, int64_t n); /* x *= alpha */

/* ---- embedding.cu ------------------------------------------------------------------------------- */
/* out (N, C) = table[idx[i]] (idx i32); backward: dtable[idx[i]] += dout[i] (atomics) */
void tdm_cu_embedding_fwd(float *out, const float *table, const int32_t *idx, int64_t N, int64_t C);
void tdm_cu_embedding_bwd(float *dtable, const float *dout, const int32_t *idx, int64_t N, int64_t C);
/* GPT's input: out (B, T, C) = wte[idx] + wpe[t]; backward += into dwte (atomics) and dwpe (a sum
 * over the batch per position, no atomics) */
void tdm_cu_gpt_embed_fwd(float *out, const float *wte, const float *wpe, const int32_t *idx, int64_t B, int64_t T,
                          int64_t C);
void tdm_cu_gpt_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *idx, int64_t B, int64_t T,
                          int64_t C);

/* ---- layernorm.cu ------------------------------------------------------------------------------ */
void tdm_cu_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                          int64_t N, int64_t C, float eps);
/* the same with the output rounded to bf16 (mixed precision: it feeds a bf16 product) */
void tdm_cu_layernorm_fwd_bf16(uint16_t *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                               int64_t N, int64_t C, float eps);
/* dx (N, C) +=, dw and db (C) += (as tdm_k_layernorm_bwd) */
void tdm_cu_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                          const float *mean, const float *rstd, int64_t N, int64_t C);

/* ---- gelu.cu (tanh approximation, as GPT-2) ----------------------------------------------------- */
void tdm_cu_gelu_fwd(float *out, const float *x, int64_t n);
void tdm_cu_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n); /* dx = ... (set; may be dout) */
/* x (N, O) += b per row, then out = gelu(x): a linear layer's bias and the activation in one pass */
void tdm_cu_bias_gelu_fwd(float *out, float *x, const float *b, int64_t N, int64_t O);
void tdm_cu_bias_gelu_fwd_bf16(uint16_t *out, float *x, const float *b, int64_t N, int64_t O); /* out in bf16 */

/* ---- attention.cu: causal multi-head self-attention on packed qkv (B, T, 3C), NH heads ----------
 * Forward: qkvr (3 B T C) receives q, k, v as (B, NH, T, hs) each (plus bias (3C), when not NULL:
 * c_attn's bias, fused here), att (B, NH, T, T) the
 * probabilities (zeros above the diagonal, as tdm_k_attention_fwd), y (B, NH, T, hs) scratch, out
 * (B, T, C). Backward writes dqkv (set), using scratch datt (B NH T T) and dqkvr (3 B T C) and dy
 * (B T C), reading qkvr and att from forward. Products through cuBLAS (dtype as tdm_cu_gemm's). */
void tdm_cu_attention_fwd(float *out, float *qkvr, float *att, float *y, const float *qkv, const float *bias, int64_t B,
                          int64_t T, int64_t C, int64_t NH);
void tdm_cu_attention_bwd(float *dqkv, float *dqkvr, float *datt, float *dy, const float *dout, const float *qkvr,
                          const float *att, int64_t B, int64_t T, int64_t C, int64_t NH);
/* q, k, v of packed qkv (B, T, 3C) (+ bias (3C), or NULL) -> qkvr: 3 tensors (B, NH, T, hs) */
void tdm_cu_attention_split(float *qkvr, const float *qkv, const float *bias, int64_t B, int64_t T, int64_t C, int64_t NH);
/* ---- flash_attention.cu: the same attention fused (no T x T matrix in memory) ------------------
 * Products on the tensor cores with bf16 inputs (q, k, v, dO, P, dS rounded to bf16), fp32
 * accumulation and softmax statistics. For head sizes 16, 32, 64, 128 and B NH <= 65535
 * (tdm_cu_flash_supported). Forward: out (B, T, C), f32 or bf16 (out_bf16), from qkvr (as
 * tdm_cu_attention_split leaves it); lse (B NH T) the rows' log2-sum-exp2 for backward. Backward:
 * dqkv (B, T, 3C) set (its q part summed with atomics: reproducible to rounding, not bit for bit),
 * Drow (B NH T) scratch, dout (B, T, C) f32, out and lse from forward. */
int tdm_cu_flash_supported(int64_t hs, int64_t BH);
void tdm_cu_flash_attention_fwd(void *out, int out_bf16, float *lse, const float *qkvr, int64_t B, int64_t T, int64_t C,
                                int64_t NH);
void tdm_cu_flash_attention_bwd(float *dqkv, float *Drow, const float *dout, const void *out, int out_bf16,
                                const float *qkvr, const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH);
/* the softmax alone: att (rows of T, row r of a (T, T) block masked after column r % T), in place,
 * of scale * x; and its backward in place on datt: datt = scale * att * (datt - sum(att datt)) */
void tdm_cu_causal_softmax_fwd(float *att, int64_t BH, int64_t T, float scale);
void tdm_cu_causal_softmax_bwd(float *datt, const float *att, int64_t BH, int64_t T, float scale);

/* ---- crossentropy.cu: fused softmax cross-entropy over logits (N, V), targets i32 --------------
 * loss[i] = logsumexp(row i) - row i[target i]; when dlogits is not NULL also
 * dlogits = (softmax(row) - onehot(target)) * dscale (set; dlogits may equal logits: in place).
 * Targets outside [0, V) give loss NAN (the host checks targets before). */
void tdm_cu_cross_entropy(float *loss, float *dlogits, const float *logits, const int32_t *targets, int64_t N,
                          int64_t V, float dscale);
/* the same with dlogits (not NULL, not in place) written as bf16: the input of bf16 products */
void tdm_cu_cross_entropy_bf16grad(float *loss, uint16_t *dlogits, const float *logits, const int32_t *targets, int64_t N,
                                   int64_t V, float dscale);
/* out[0] = sum of x (n), one block, in a fixed order (deterministic) */
void tdm_cu_sum(float *out, const float *x, int64_t n);

/* ---- adamw.cu: one fused pass, PyTorch's AdamW (decoupled decay) ------------------------------
 * g is read as g * gscale (the clipping coefficient); bc1 = 1 - beta1^t, bc2_sqrt = sqrt(1 - beta2^t);
 * wd 0: plain Adam without decay. Same arithmetic as the CPU optimizer. */
void tdm_cu_adamw(float *w, float *m, float *v, const float *g, int64_t n, float lr, float beta1, float beta2,
                  float eps, float wd, float bc1, float bc2_sqrt, float gscale);

/* ---- gradnorm.cu: sum of squares in double, deterministic (fixed grid, then one block) --------- */
/* partial: scratch of TDM_CU_SUMSQ_BLOCKS doubles; out[0] = sum of g[i]^2 */
enum { TDM_CU_SUMSQ_BLOCKS = 512 };
void tdm_cu_sumsq(double *out, double *partial, const float *g, int64_t n);

/* ---- convert.cu ------------------------------------------------------------------------------- */
void tdm_cu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n); /* round to nearest even */
void tdm_cu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
