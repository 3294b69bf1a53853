/* Softmax, log-softmax, cross-entropy and layer normalisation. All subtract the row maximum
 * before exponentiating, so large logits never overflow. */
#include <math.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

/* ---- softmax over the middle axis of (outer, n, inner) ---------------------------------- */
void tdm_k_softmax_fwd(float *y, const float *x, int64_t outer, int64_t n, int64_t inner) {
  if (n <= 0) return; /* an empty axis has nothing to normalise */
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      const float *xr = x + o * n * inner + in;
      float *yr = y + o * n * inner + in;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, xr[j * inner]);
      float s = 0.0f;
      for (int64_t j = 0; j < n; j++) s += (yr[j * inner] = expf(xr[j * inner] - mx));
      float inv = 1.0f / s;
      for (int64_t j = 0; j < n; j++) yr[j * inner] *= inv;
    }
}

void tdm_k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      int64_t base = o * n * inner + in;
      float dot = 0.0f;
      for (int64_t j = 0; j < n; j++) dot += dy[base + j * inner] * y[base + j * inner];
      for (int64_t j = 0; j < n; j++) dx[base + j * inner] += y[base + j * inner] * (dy[base + j * inner] - dot);
    }
}

void tdm_k_log_softmax_fwd(float *y, const float *x, int64_t outer, int64_t n, int64_t inner) {
  if (n <= 0) return; /* an empty axis has nothing to normalise */
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      int64_t base = o * n * inner + in;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, x[base + j * inner]);
      float s = 0.0f;
      for (int64_t j = 0; j < n; j++) s += expf(x[base + j * inner] - mx);
      float lse = mx + logf(s);
      for (int64_t j = 0; j < n; j++) y[base + j * inner] = x[base + j * inner] - lse;
    }
}

void tdm_k_log_softmax_bwd(float *dx, const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner) {
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      int64_t base = o * n * inner + in;
      float s = 0.0f;
      for (int64_t j = 0; j < n; j++) s += dy[base + j * inner];
      for (int64_t j = 0; j < n; j++) dx[base + j * inner] += dy[base + j * inner] - expf(y[base + j * inner]) * s;
    }
}

/* ---- cross-entropy ------------------------------------------------------------------------ */
static inline int64_t target_at(const void *t, int i64, int64_t i) {
  return i64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

typedef struct {
  const float *logits;
  float *lse;
  int64_t C;
} lse_ctx;

static void lse_range(void *vc, int64_t r0, int64_t r1) {
  lse_ctx *c = vc;
  if (c->C <= 0) return; /* no classes: no rows either (N = 0) */
  for (int64_t r = r0; r < r1; r++) {
    const float *x = c->logits + r * c->C;
    float mx = tdm__max8(x, c->C), acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= c->C; j += 8)
      for (int k = 0; k < 8; k++) acc[k] += tdm__exp_neg(x[j + k] - mx);
    for (; j < c->C; j++) acc[j & 7] += tdm__exp_neg(x[j] - mx);
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    c->lse[r] = mx + logf(s);
  }
}

float tdm_k_cross_entropy_fwd(const float *logits, const void *targets, int targets_i64, int64_t N, int64_t C,
                              int64_t ignore_index, float *lse, int64_t *count, int64_t *bad_row) {
  lse_ctx c = {logits, lse, C};
  tdm_parallel_for(N, C > 0 ? 1 + 65536 / C : 1, lse_range, &c);
  double sum = 0.0;
  int64_t cnt = 0;
  *bad_row = -1;
  for (int64_t r = 0; r < N; r++) {
    int64_t t = target_at(targets, targets_i64, r);
    if (t == ignore_index) continue;
    if (t < 0 || t >= C) {
      *bad_row = r;
      *count = cnt;
      return NAN;
    }
    sum += (double)(lse[r] - logits[r * C + t]);
    cnt++;
  }
  *count = cnt;
  return cnt ? (float)(sum / (double)cnt) : 0.0f;
}

typedef struct {
  float *dlogits;
  const float *logits, *lse;
  const void *targets;
  int i64;
  int64_t C, ignore;
  float scale;
} ce_bwd_ctx;

static void ce_bwd_range(void *vc, int64_t r0, int64_t r1) {
  ce_bwd_ctx *c = vc;
  for (int64_t r = r0; r < r1; r++) {
    int64_t t = target_at(c->targets, c->i64, r);
    if (t == c->ignore) continue;
    const float *x = c->logits + r * c->C;
    float *d = c->dlogits + r * c->C;
    float l = c->lse[r];
    for (int64_t j = 0; j < c->C; j++) d[j] += c->scale * tdm__exp_neg(x[j] - l); /* x <= lse */
    d[t] -= c->scale;
  }
}

void tdm_k_cross_entropy_bwd(float *dlogits, const float *logits, const void *targets, int targets_i64, int64_t N,
                             int64_t C, int64_t ignore_index, const float *lse, float scale) {
  ce_bwd_ctx c = {dlogits, logits, lse, targets, targets_i64, C, ignore_index, scale};
  tdm_parallel_for(N, C > 0 ? 1 + 65536 / C : 1, ce_bwd_range, &c);
}

/* ---- layernorm ------------------------------------------------------------------------------ */
typedef struct {
  float *out, *mean, *rstd;
  const float *x, *w, *b;
  int64_t C;
  float eps;
} ln_ctx;

static void ln_fwd_range(void *vc, int64_t r0, int64_t r1) {
  ln_ctx *c = vc;
  int64_t C = c->C;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = c->x + r * C;
    float *restrict o = c->out + r * C;
    float m = tdm__sum8(x, C) / (float)C;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= C; i += 8)
      for (int k = 0; k < 8; k++) acc[k] += (x[i + k] - m) * (x[i + k] - m);
    for (; i < C; i++) acc[i & 7] += (x[i] - m) * (x[i] - m);
    float v = (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) / (float)C;
    float s = 1.0f / sqrtf(v + c->eps);
    for (int64_t i = 0; i < C; i++) o[i] = (x[i] - m) * s * c->w[i] + c->b[i];
    c->mean[r] = m;
    c->rstd[r] = s;
  }
}

void tdm_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                         int64_t N, int64_t C, float eps) {
  ln_ctx c = {out, mean, rstd, x, w, b, C, eps};
  tdm_parallel_for(N, C > 0 ? 1 + 16384 / C : 1, ln_fwd_range, &c);
}

typedef struct {
  float *dx, *dw, *db;
  const float *dout, *x, *w, *mean, *rstd;
  int64_t N, C;
} ln_bwd_ctx;

/* dx, row by row */
static void ln_bwd_rows(void *vc, int64_t r0, int64_t r1) {
  ln_bwd_ctx *c = vc;
  int64_t C = c->C;
  const float *w = c->w;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = c->x + r * C, *d = c->dout + r * C;
    float *restrict dx = c->dx + r * C;
    float m = c->mean[r], s = c->rstd[r];
    float a1[8] = {0}, a2[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= C; i += 8)
      for (int k = 0; k < 8; k++) {
        float dn = w[i + k] * d[i + k];
        a1[k] += dn;
        a2[k] += dn * (xr[i + k] - m) * s;
      }
    for (; i < C; i++) {
      float dn = w[i] * d[i];
      a1[i & 7] += dn;
      a2[i & 7] += dn * (xr[i] - m) * s;
    }
    float dmean = (((a1[0] + a1[4]) + (a1[1] + a1[5])) + ((a1[2] + a1[6]) + (a1[3] + a1[7]))) / (float)C;
    float dnm = (((a2[0] + a2[4]) + (a2[1] + a2[5])) + ((a2[2] + a2[6]) + (a2[3] + a2[7]))) / (float)C;
    for (i = 0; i < C; i++) dx[i] += (w[i] * d[i] - dmean - (xr[i] - m) * s * dnm) * s;
  }
}

/* dw and db, column block by column block: each column sums its rows in order, so the result
 * does not depend on the thread count */
static void ln_bwd_cols(void *vc, int64_t c0, int64_t c1) {
  ln_bwd_ctx *c = vc;
  int64_t C = c->C;
  for (int64_t r = 0; r < c->N; r++) {
    const float *xr = c->x + r * C, *d = c->dout + r * C;
    float m = c->mean[r], s = c->rstd[r];
    if (c->db)
      for (int64_t i = c0; i < c1; i++) c->db[i] += d[i];
    if (c->dw)
      for (int64_t i = c0; i < c1; i++) c->dw[i] += (xr[i] - m) * s * d[i];
  }
}

void tdm_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                         const float *mean, const float *rstd, int64_t N, int64_t C) {
  ln_bwd_ctx c = {dx, dw, db, dout, x, w, mean, rstd, N, C};
  if (dx) tdm_parallel_for(N, C > 0 ? 1 + 16384 / C : 1, ln_bwd_rows, &c);
  if (dw || db) tdm_parallel_for(C, 64, ln_bwd_cols, &c);
}
