/* Causal multi-head self-attention as GEMMs per (batch, head), reading q, k and v in place from
 * the packed (B, T, 3C) projection (their row stride is 3C), so nothing is re-laid out.
 * Scores above the diagonal are never exponentiated; each row subtracts its own maximum. */
#include <math.h>
#include <string.h>

#include "tandem/kernels.h"

void tdm_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float *q = qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
      float *P = att + (b * NH + h) * T * T;
      tdm_k_gemm(0, 1, T, T, hs, scale, q, C3, k, C3, 0.0f, P, T);
      for (int64_t i = 0; i < T; i++) {
        float *row = P + i * T, mx = -INFINITY, s = 0.0f;
        for (int64_t j = 0; j <= i; j++) mx = fmaxf(mx, row[j]);
        for (int64_t j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
        float inv = 1.0f / s;
        for (int64_t j = 0; j <= i; j++) row[j] *= inv;
        for (int64_t j = i + 1; j < T; j++) row[j] = 0.0f;
      }
      tdm_k_gemm(0, 0, T, hs, T, 1.0f, P, T, v, C3, 0.0f, out + b * T * C + h * hs, C);
    }
}

void tdm_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *att, const float *qkv, int64_t B,
                         int64_t T, int64_t C, int64_t NH) {
  int64_t hs = C / NH, C3 = 3 * C;
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float *q = qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
      const float *P = att + (b * NH + h) * T * T, *dO = dout + b * T * C + h * hs;
      float *dP = scratch + (b * NH + h) * T * T;
      tdm_k_gemm(0, 1, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, dP, T); /* dP = dO V^T */
      tdm_k_gemm(1, 0, T, hs, T, 1.0f, P, T, dO, C, 1.0f, dv, C3); /* dV += P^T dO */
      for (int64_t i = 0; i < T; i++) {                             /* dS = P * (dP - rowdot) */
        const float *p = P + i * T;
        float *d = dP + i * T, dot = 0.0f;
        for (int64_t j = 0; j <= i; j++) dot += p[j] * d[j];
        for (int64_t j = 0; j <= i; j++) d[j] = p[j] * (d[j] - dot);
        for (int64_t j = i + 1; j < T; j++) d[j] = 0.0f;
      }
      tdm_k_gemm(0, 0, T, hs, T, scale, dP, T, k, C3, 1.0f, dq, C3); /* dQ += dS K */
      tdm_k_gemm(1, 0, T, hs, T, scale, dP, T, q, C3, 1.0f, dk, C3); /* dK += dS^T Q */
    }
}
