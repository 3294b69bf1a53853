/* Causal multi-head self-attention as GEMMs per (batch, head), reading q, k and v in place from
 * the packed (B, T, 3C) projection (their row stride is 3C), so nothing is re-laid out.
 * The GEMMs of all heads run first (OpenBLAS threads them), then the row-wise softmax of every
 * head runs on the intra-op pool, vectorised; scores above the diagonal are never exponentiated
 * and each row subtracts its own maximum. */
#include <math.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

typedef struct {
  float *P, *dP;
  int64_t T;
} rows_ctx;

/* Row r of the (B * NH * T, T) scores is query position i = r % T: softmax over columns 0..i */
static void softmax_rows(void *vc, int64_t r0, int64_t r1) {
  rows_ctx *c = vc;
  int64_t T = c->T;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = r % T + 1;
    float *restrict row = c->P + r * T;
    float mx = tdm__max8(row, n);
    for (int64_t j = 0; j < n; j++) row[j] = tdm__exp_neg(row[j] - mx);
    float inv = 1.0f / tdm__sum8(row, n);
    for (int64_t j = 0; j < n; j++) row[j] *= inv;
    memset(row + n, 0, sizeof(float) * (size_t)(T - n));
  }
}

/* dS = P * (dP - rowdot(P, dP)), in place in dP */
static void dsoftmax_rows(void *vc, int64_t r0, int64_t r1) {
  rows_ctx *c = vc;
  int64_t T = c->T;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = r % T + 1;
    const float *p = c->P + r * T;
    float *restrict d = c->dP + r * T;
    float dot = tdm__dot8(p, d, n);
    for (int64_t j = 0; j < n; j++) d[j] = p[j] * (d[j] - dot);
    memset(d + n, 0, sizeof(float) * (size_t)(T - n));
  }
}

void tdm_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t bh = 0; bh < B * NH; bh++) {
    const float *q = qkv + (bh / NH) * T * C3 + (bh % NH) * hs, *k = q + C;
    tdm_k_gemm(0, 1, T, T, hs, scale, q, C3, k, C3, 0.0f, att + bh * T * T, T);
  }
  rows_ctx rc = {att, NULL, T};
  tdm_parallel_for(B * NH * T, 1 + 8192 / T, softmax_rows, &rc);
  for (int64_t bh = 0; bh < B * NH; bh++) {
    int64_t b = bh / NH, h = bh % NH;
    const float *v = qkv + b * T * C3 + h * hs + 2 * C;
    tdm_k_gemm(0, 0, T, hs, T, 1.0f, att + bh * T * T, T, v, C3, 0.0f, out + b * T * C + h * hs, C);
  }
}

void tdm_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *att, const float *qkv, int64_t B,
                         int64_t T, int64_t C, int64_t NH, int accumulate) {
  int64_t hs = C / NH, C3 = 3 * C;
  float beta = accumulate ? 1.0f : 0.0f; /* every element of dqkv belongs to exactly one GEMM below */
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t bh = 0; bh < B * NH; bh++) {
    int64_t b = bh / NH, h = bh % NH;
    const float *v = qkv + b * T * C3 + h * hs + 2 * C, *dO = dout + b * T * C + h * hs;
    float *dv = dqkv + b * T * C3 + h * hs + 2 * C;
    tdm_k_gemm(0, 1, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, scratch + bh * T * T, T); /* dP = dO V^T */
    tdm_k_gemm(1, 0, T, hs, T, 1.0f, att + bh * T * T, T, dO, C, beta, dv, C3);     /* dV += P^T dO */
  }
  rows_ctx rc = {(float *)att, scratch, T};
  tdm_parallel_for(B * NH * T, 1 + 8192 / T, dsoftmax_rows, &rc);
  for (int64_t bh = 0; bh < B * NH; bh++) {
    int64_t b = bh / NH, h = bh % NH;
    const float *q = qkv + b * T * C3 + h * hs, *k = q + C, *dS = scratch + bh * T * T;
    float *dq = dqkv + b * T * C3 + h * hs, *dk = dq + C;
    tdm_k_gemm(0, 0, T, hs, T, scale, dS, T, k, C3, beta, dq, C3); /* dQ += dS K */
    tdm_k_gemm(1, 0, T, hs, T, scale, dS, T, q, C3, beta, dk, C3); /* dK += dS^T Q */
  }
}
