/* The Llama family's kernels: RMSNorm, rotary position embeddings (Hugging Face's rotate_half
 * layout, Llama 3's frequency scaling) and the SwiGLU gate. Rows run side by side on the pool;
 * the weight gradient of RMSNorm sums its rows in order per column block, so it does not depend
 * on the thread count. */
#include <math.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

/* ---- RMSNorm ------------------------------------------------------------------------------- */
typedef struct {
  float *out, *rstd, *dx, *dw;
  const float *x, *w, *dout;
  int64_t N, C;
  float eps;
} rms_ctx;

static void rms_fwd_range(void *vc, int64_t r0, int64_t r1) {
  rms_ctx *c = vc;
  int64_t C = c->C;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = c->x + r * C;
    float *restrict o = c->out + r * C;
    float s = 1.0f / sqrtf(tdm__dot8(x, x, C) / (float)C + c->eps);
    for (int64_t i = 0; i < C; i++) o[i] = (x[i] * s) * c->w[i]; /* as HF: weight * (x * rsqrt(var + eps)) */
    c->rstd[r] = s;
  }
}

void tdm_k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t N, int64_t C, float eps) {
  rms_ctx c = {out, rstd, NULL, NULL, x, w, NULL, N, C, eps};
  tdm_parallel_for(N, C > 0 ? 1 + 16384 / C : 1, rms_fwd_range, &c);
}

/* dx = s (w dout - xhat mean(w dout xhat)), xhat = x s */
static void rms_bwd_rows(void *vc, int64_t r0, int64_t r1) {
  rms_ctx *c = vc;
  int64_t C = c->C;
  const float *w = c->w;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = c->x + r * C, *d = c->dout + r * C;
    float *restrict dx = c->dx + r * C;
    float s = c->rstd[r], acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= C; i += 8)
      for (int k = 0; k < 8; k++) acc[k] += w[i + k] * d[i + k] * x[i + k];
    for (; i < C; i++) acc[i & 7] += w[i] * d[i] * x[i];
    float dot = (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) * s / (float)C;
    for (i = 0; i < C; i++) dx[i] += (w[i] * d[i] - x[i] * s * dot) * s;
  }
}

static void rms_bwd_cols(void *vc, int64_t c0, int64_t c1) {
  rms_ctx *c = vc;
  int64_t C = c->C;
  for (int64_t r = 0; r < c->N; r++) {
    const float *x = c->x + r * C, *d = c->dout + r * C;
    float s = c->rstd[r];
    for (int64_t i = c0; i < c1; i++) c->dw[i] += (x[i] * s) * d[i];
  }
}

void tdm_k_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                       int64_t N, int64_t C) {
  rms_ctx c = {NULL, (float *)rstd, dx, dw, x, w, dout, N, C, 0};
  if (dx) tdm_parallel_for(N, C > 0 ? 1 + 16384 / C : 1, rms_bwd_rows, &c);
  if (dw) tdm_parallel_for(C, 64, rms_bwd_cols, &c);
}

/* ---- rotary position embeddings ------------------------------------------------------------- */
void tdm_k_rope_table(float *cos_t, float *sin_t, int64_t pos0, int64_t T, int64_t hs, const tdm_k_rope_params *p) {
  int64_t half = hs / 2;
  for (int64_t i = 0; i < half; i++) {
    /* in float, as Hugging Face computes it: 1 / base^(2i / d) */
    float inv = 1.0f / powf(p->theta, (float)(2 * i) / (float)hs);
    if (p->factor > 0) { /* Llama 3: long wavelengths slowed by factor, a smooth blend between */
      float lo_wl = (float)p->original_max_pos / p->low_freq_factor, hi_wl = (float)p->original_max_pos / p->high_freq_factor;
      float wl = 2.0f * 3.14159265358979323846f / inv;
      float scaled = wl > lo_wl ? inv / p->factor : inv;
      if (!(wl < hi_wl) && !(wl > lo_wl)) {
        float smooth = ((float)p->original_max_pos / wl - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
        scaled = (1.0f - smooth) * scaled / p->factor + smooth * scaled;
      }
      inv = scaled;
    }
    for (int64_t t = 0; t < T; t++) {
      float f = (float)(pos0 + t) * inv;
      cos_t[t * half + i] = (float)cos((double)f);
      sin_t[t * half + i] = (float)sin((double)f);
    }
  }
}

typedef struct {
  float *out;
  const float *x, *cs, *sn;
  int64_t T, H, hs;
  float sign; /* +1 forward, -1 backward (the transpose of a rotation) */
  int accumulate;
} rope_ctx;

/* rows (b, t): each head's first half x1 and second half x2 become x1 cos - x2 sin and
 * x2 cos + x1 sin (Hugging Face's rotate_half convention) */
static void rope_range(void *vc, int64_t r0, int64_t r1) {
  rope_ctx *c = vc;
  int64_t H = c->H, hs = c->hs, half = hs / 2, W = H * hs;
  for (int64_t r = r0; r < r1; r++) {
    int64_t t = r % c->T;
    const float *cs = c->cs + t * half, *sn = c->sn + t * half;
    for (int64_t h = 0; h < H; h++) {
      const float *x1 = c->x + r * W + h * hs, *x2 = x1 + half;
      float *restrict o1 = c->out + r * W + h * hs, *restrict o2 = o1 + half;
      if (c->accumulate)
        for (int64_t i = 0; i < half; i++) {
          float s = c->sign * sn[i], a = x1[i], b = x2[i];
          o1[i] += a * cs[i] - b * s;
          o2[i] += b * cs[i] + a * s;
        }
      else
        for (int64_t i = 0; i < half; i++) {
          float s = c->sign * sn[i], a = x1[i], b = x2[i];
          o1[i] = a * cs[i] - b * s;
          o2[i] = b * cs[i] + a * s;
        }
    }
  }
}

void tdm_k_rope_fwd(float *out, const float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T, int64_t H,
                    int64_t hs) {
  rope_ctx c = {out, x, cos_t, sin_t, T, H, hs, 1.0f, 0};
  tdm_parallel_for(B * T, 1 + 32768 / (H * hs > 0 ? H * hs : 1), rope_range, &c);
}

void tdm_k_rope_bwd(float *dx, const float *dout, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
                    int64_t H, int64_t hs, int accumulate) {
  rope_ctx c = {dx, dout, cos_t, sin_t, T, H, hs, -1.0f, accumulate};
  tdm_parallel_for(B * T, 1 + 32768 / (H * hs > 0 ? H * hs : 1), rope_range, &c);
}

/* ---- SwiGLU: silu(gate) * up ------------------------------------------------------------------ */
typedef struct {
  float *out, *dg, *du;
  const float *g, *u, *dout;
  int acc_g, acc_u; /* backward: add into dgate / dup rather than write */
} swiglu_ctx;

static void swiglu_fwd_range(void *vc, int64_t i0, int64_t i1) {
  swiglu_ctx *c = vc;
  const float *restrict g = c->g, *restrict u = c->u;
  float *restrict o = c->out;
  for (int64_t i = i0; i < i1; i++) o[i] = g[i] * tdm__sigmoid(g[i]) * u[i];
}

void tdm_k_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n) {
  swiglu_ctx c = {out, NULL, NULL, gate, up, NULL, 0, 0};
  tdm_parallel_for(n, 32768, swiglu_fwd_range, &c);
}

/* d silu(g) / dg = sig(g) (1 + g (1 - sig(g))) */
static void swiglu_bwd_range(void *vc, int64_t i0, int64_t i1) {
  swiglu_ctx *c = vc;
  const float *restrict g = c->g, *restrict u = c->u, *restrict d = c->dout;
  float *restrict dg = c->dg, *restrict du = c->du;
  for (int64_t i = i0; i < i1; i++) {
    float sg = tdm__sigmoid(g[i]), a = d[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg)), b = d[i] * g[i] * sg;
    if (dg) dg[i] = c->acc_g ? dg[i] + a : a;
    if (du) du[i] = c->acc_u ? du[i] + b : b;
  }
}

void tdm_k_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n,
                      int acc_gate, int acc_up) {
  swiglu_ctx c = {NULL, dgate, dup, gate, up, dout, acc_gate, acc_up};
  tdm_parallel_for(n, 32768, swiglu_bwd_range, &c);
}
