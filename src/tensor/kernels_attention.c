/* Causal multi-head self-attention as GEMMs per (batch, head), reading q, k and v in place from
 * the packed (B, T, 3C) projection (their row stride is 3C), so nothing is re-laid out.
 * The (batch, head) pairs run side by side on the intra-op pool, each with single-threaded GEMMs
 * and a vectorised row softmax; scores above the diagonal are never exponentiated and each row
 * subtracts its own maximum. */
#include <math.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

typedef struct {
  float *out, *att, *dqkv, *scratch;
  const float *qkv, *dout;
  int64_t T, C, NH;
  float beta; /* backward: 0 overwrites dqkv, 1 accumulates */
} attn_ctx;

static void fwd_heads(void *vc, int64_t bh0, int64_t bh1) {
  attn_ctx *c = vc;
  int64_t T = c->T, C = c->C, NH = c->NH, hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t bh = bh0; bh < bh1; bh++) {
    int64_t b = bh / NH, h = bh % NH;
    const float *q = c->qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    float *P = c->att + bh * T * T;
    tdm_k_gemm(0, 1, T, T, hs, scale, q, C3, k, C3, 0.0f, P, T);
    for (int64_t i = 0; i < T; i++) { /* row i attends to 0..i */
      float *restrict row = P + i * T;
      float mx = tdm__max8(row, i + 1);
      for (int64_t j = 0; j <= i; j++) row[j] = tdm__exp_neg(row[j] - mx);
      float inv = 1.0f / tdm__sum8(row, i + 1);
      for (int64_t j = 0; j <= i; j++) row[j] *= inv;
      memset(row + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
    }
    tdm_k_gemm(0, 0, T, hs, T, 1.0f, P, T, v, C3, 0.0f, c->out + b * T * C + h * hs, C);
  }
}

static void bwd_heads(void *vc, int64_t bh0, int64_t bh1) {
  attn_ctx *c = vc;
  int64_t T = c->T, C = c->C, NH = c->NH, hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs), beta = c->beta;
  for (int64_t bh = bh0; bh < bh1; bh++) {
    int64_t b = bh / NH, h = bh % NH;
    const float *q = c->qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
    const float *P = c->att + bh * T * T, *dO = c->dout + b * T * C + h * hs;
    float *dq = c->dqkv + b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C, *dP = c->scratch + bh * T * T;
    tdm_k_gemm(0, 1, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, dP, T); /* dP = dO V^T */
    tdm_k_gemm(1, 0, T, hs, T, 1.0f, P, T, dO, C, beta, dv, C3); /* dV += P^T dO */
    for (int64_t i = 0; i < T; i++) {                             /* dS = P * (dP - rowdot(P, dP)) */
      const float *p = P + i * T;
      float *restrict d = dP + i * T;
      float dot = tdm__dot8(p, d, i + 1);
      for (int64_t j = 0; j <= i; j++) d[j] = p[j] * (d[j] - dot);
      memset(d + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
    }
    tdm_k_gemm(0, 0, T, hs, T, scale, dP, T, k, C3, beta, dq, C3); /* dQ += dS K */
    tdm_k_gemm(1, 0, T, hs, T, scale, dP, T, q, C3, beta, dk, C3); /* dK += dS^T Q */
  }
}

void tdm_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  attn_ctx c = {out, att, NULL, NULL, qkv, NULL, T, C, NH, 0.0f};
  tdm_parallel_for(B * NH, 1, fwd_heads, &c);
}

void tdm_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *att, const float *qkv, int64_t B,
                         int64_t T, int64_t C, int64_t NH, int accumulate) {
  /* every element of dqkv belongs to exactly one GEMM, so beta 0 overwrites it all */
  attn_ctx c = {NULL, (float *)att, dqkv, scratch, qkv, dout, T, C, NH, accumulate ? 1.0f : 0.0f};
  tdm_parallel_for(B * NH, 1, bwd_heads, &c);
}
