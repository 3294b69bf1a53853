/* Causal multi-head self-attention as GEMMs per (batch, head), reading q, k and v in place (from
 * GPT's packed (B, T, 3C) projection, whose row stride is 3C, or from Llama's separate q, k and v
 * with fewer key/value heads), so nothing is re-laid out.
 * The (batch, head) pairs run side by side on the intra-op pool, each with single-threaded GEMMs
 * and a vectorised row softmax; scores above the diagonal are never exponentiated and each row
 * subtracts its own maximum.
 *
 * The products skip the masked upper triangle in blocks of ROWS: query rows [r0, r1) only meet
 * keys [0, r1), and in backward key rows [c0, c1) only meet queries [c0, T). At T = 128 that is
 * 3/4 of the full products' work, and about 20% less time (measured per product); every element
 * of an output still comes from one product, whose sum merely leaves out exact zeros. */
#include <math.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

enum { ROWS = 64 };
static int64_t block_end(int64_t b0, int64_t T) { return b0 + ROWS < T ? b0 + ROWS : T; }

/* q, k, v (and their gradients) are read in place: head h of batch b starts at b * T * ld + h * hs,
 * with row strides ldq (q, dq), ldkv (k, v, dk, dv), ldo (out, dout). Query head h reads key and
 * value head h / (NH / NKV) (grouped-query attention; NKV = NH is plain multi-head). */
typedef struct {
  float *out, *att, *dq, *dk, *dv, *scratch;
  const float *q, *k, *v, *dout;
  int64_t T, NH, NKV, hs, ldq, ldkv, ldo;
  float beta; /* backward: 0 overwrites dq, dk, dv, 1 accumulates */
} attn_ctx;

/* The probabilities of head (b, h): P = softmax(scale q k^T), causal, into P (T, T). */
static void head_probs(const attn_ctx *c, int64_t b, int64_t h, float *P) {
  int64_t T = c->T, hs = c->hs, g = h / (c->NH / c->NKV);
  float scale = 1.0f / sqrtf((float)hs);
  const float *q = c->q + b * T * c->ldq + h * hs, *k = c->k + b * T * c->ldkv + g * hs;
  for (int64_t r0 = 0; r0 < T; r0 += ROWS) {
    int64_t r1 = block_end(r0, T);
    tdm_k_gemm(0, 1, r1 - r0, r1, hs, scale, q + r0 * c->ldq, c->ldq, k, c->ldkv, 0.0f, P + r0 * T, T);
  }
  for (int64_t i = 0; i < T; i++) { /* row i attends to 0..i */
    float *restrict row = P + i * T;
    float mx = tdm__max8(row, i + 1);
    for (int64_t j = 0; j <= i; j++) row[j] = tdm__exp_neg(row[j] - mx);
    float inv = 1.0f / tdm__sum8(row, i + 1);
    for (int64_t j = 0; j <= i; j++) row[j] *= inv;
    memset(row + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
  }
}

static void fwd_heads(void *vc, int64_t bh0, int64_t bh1) {
  attn_ctx *c = vc;
  int64_t T = c->T, NH = c->NH, hs = c->hs;
  for (int64_t bh = bh0; bh < bh1; bh++) {
    int64_t b = bh / NH, h = bh % NH, g = h / (NH / c->NKV);
    float *P = c->att + bh * T * T;
    head_probs(c, b, h, P);
    const float *v = c->v + b * T * c->ldkv + g * hs;
    float *o = c->out + b * T * c->ldo + h * hs;
    for (int64_t r0 = 0; r0 < T; r0 += ROWS) {
      int64_t r1 = block_end(r0, T);
      tdm_k_gemm(0, 0, r1 - r0, hs, r1, 1.0f, P + r0 * T, T, v, c->ldkv, 0.0f, o + r0 * c->ldo, c->ldo);
    }
  }
}

static void probs_heads(void *vc, int64_t bh0, int64_t bh1) {
  attn_ctx *c = vc;
  for (int64_t bh = bh0; bh < bh1; bh++) head_probs(c, bh / c->NH, bh % c->NH, c->att + bh * c->T * c->T);
}

/* One (batch, key/value head) pair: its query heads one after another, so that their gradients
 * reach the shared dk and dv in order (the first writes when beta is 0, the others add). */
static void bwd_groups(void *vc, int64_t bg0, int64_t bg1) {
  attn_ctx *c = vc;
  int64_t T = c->T, NH = c->NH, NKV = c->NKV, G = NH / NKV, hs = c->hs, ldq = c->ldq, ldkv = c->ldkv, ldo = c->ldo;
  float scale = 1.0f / sqrtf((float)hs);
  for (int64_t bg = bg0; bg < bg1; bg++) {
    int64_t b = bg / NKV, g = bg % NKV;
    const float *k = c->k + b * T * ldkv + g * hs, *v = c->v + b * T * ldkv + g * hs;
    float *dk = c->dk + b * T * ldkv + g * hs, *dv = c->dv + b * T * ldkv + g * hs;
    for (int64_t j = 0; j < G; j++) {
      int64_t h = g * G + j, bh = b * NH + h;
      float beta_kv = j == 0 ? c->beta : 1.0f;
      const float *q = c->q + b * T * ldq + h * hs, *P = c->att + bh * T * T, *dO = c->dout + b * T * ldo + h * hs;
      float *dq = c->dq + b * T * ldq + h * hs, *dP = c->scratch + bh * T * T;
      for (int64_t r0 = 0; r0 < T; r0 += ROWS) { /* dP = dO V^T, lower blocks */
        int64_t r1 = block_end(r0, T);
        tdm_k_gemm(0, 1, r1 - r0, r1, hs, 1.0f, dO + r0 * ldo, ldo, v, ldkv, 0.0f, dP + r0 * T, T);
      }
      for (int64_t c0 = 0; c0 < T; c0 += ROWS) { /* dV += P^T dO: keys [c0, c1) from queries [c0, T) */
        int64_t c1 = block_end(c0, T);
        tdm_k_gemm(1, 0, c1 - c0, hs, T - c0, 1.0f, P + c0 * T + c0, T, dO + c0 * ldo, ldo, beta_kv, dv + c0 * ldkv, ldkv);
      }
      for (int64_t i = 0; i < T; i++) { /* dS = P * (dP - rowdot(P, dP)) */
        const float *p = P + i * T;
        float *restrict d = dP + i * T;
        float dot = tdm__dot8(p, d, i + 1);
        for (int64_t jj = 0; jj <= i; jj++) d[jj] = p[jj] * (d[jj] - dot);
        memset(d + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
      }
      for (int64_t r0 = 0; r0 < T; r0 += ROWS) { /* dQ += dS K */
        int64_t r1 = block_end(r0, T);
        tdm_k_gemm(0, 0, r1 - r0, hs, r1, scale, dP + r0 * T, T, k, ldkv, c->beta, dq + r0 * ldq, ldq);
      }
      for (int64_t c0 = 0; c0 < T; c0 += ROWS) { /* dK += dS^T Q */
        int64_t c1 = block_end(c0, T);
        tdm_k_gemm(1, 0, c1 - c0, hs, T - c0, scale, dP + c0 * T + c0, T, q + c0 * ldq, ldq, beta_kv, dk + c0 * ldkv, ldkv);
      }
    }
  }
}

void tdm_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
  attn_ctx c = {out, att, NULL, NULL, NULL, NULL, qkv, qkv + C, qkv + 2 * C, NULL, T, NH, NH, C / NH, 3 * C, 3 * C, C, 0.0f};
  tdm_parallel_for(B * NH, 1, fwd_heads, &c);
}

void tdm_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *att, const float *qkv, int64_t B,
                         int64_t T, int64_t C, int64_t NH, int accumulate) {
  /* every element of dqkv belongs to exactly one GEMM, so beta 0 overwrites it all */
  attn_ctx c = {NULL, (float *)att, dqkv, dqkv + C, dqkv + 2 * C, scratch, qkv, qkv + C, qkv + 2 * C, dout,
                T, NH, NH, C / NH, 3 * C, 3 * C, C, accumulate ? 1.0f : 0.0f};
  tdm_parallel_for(B * NH, 1, bwd_groups, &c);
}

void tdm_k_attention_gqa_fwd(float *out, float *att, const float *q, const float *k, const float *v, int64_t B,
                             int64_t T, int64_t NH, int64_t NKV, int64_t hs) {
  attn_ctx c = {out, att, NULL, NULL, NULL, NULL, q, k, v, NULL, T, NH, NKV, hs, NH * hs, NKV * hs, NH * hs, 0.0f};
  tdm_parallel_for(B * NH, 1, fwd_heads, &c);
}

void tdm_k_attention_probs(float *att, const float *q, const float *k, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t hs, int64_t ldq, int64_t ldkv) {
  attn_ctx c = {NULL, att, NULL, NULL, NULL, NULL, q, k, NULL, NULL, T, NH, NKV, hs, ldq, ldkv, 0, 0.0f};
  tdm_parallel_for(B * NH, 1, probs_heads, &c);
}

void tdm_k_attention_gqa_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *att,
                             const float *q, const float *k, const float *v, int64_t B, int64_t T, int64_t NH,
                             int64_t NKV, int64_t hs, int accumulate) {
  attn_ctx c = {NULL, (float *)att, dq, dk, dv, scratch, q, k, v, dout, T, NH, NKV, hs, NH * hs, NKV * hs, NH * hs,
                accumulate ? 1.0f : 0.0f};
  tdm_parallel_for(B * NKV, 1, bwd_groups, &c);
}
