/* Max and average pooling over (N, C, H, W), one plane per task of the intra-op pool. Each
 * output is computed as the one-plane loops always did (the same window order, the same
 * comparisons and sums): the bits do not depend on the thread count, and are those of the
 * serial kernels this replaced. The window is clipped to the image once per output instead of
 * testing every tap, and 2x2 windows with stride 2 (the small CNN's) have a branch-free loop. */
#include <math.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

typedef struct {
  float *out;
  int32_t *argmax;
  float *dx;
  const float *x, *dout;
  const int32_t *am;
  int64_t H, W, K, stride, pad, OH, OW;
} pool_ctx;

/* The taps [k0, k1) of a window starting at i0 that fall inside [0, n). */
static void clip(int64_t i0, int64_t K, int64_t n, int64_t *k0, int64_t *k1) {
  *k0 = i0 < 0 ? -i0 : 0;
  *k1 = i0 + K > n ? n - i0 : K;
}

/* Replaces the best so far when v is larger or NaN (NaN propagates, as in PyTorch); ties keep
 * the first in (ky, kx) order. */
#define TAKE(v, idx)                  \
  do {                                \
    float v_ = (v);                   \
    if (v_ > best || isnan(v_)) {     \
      best = v_;                      \
      at = (int32_t)(idx);            \
    }                                 \
  } while (0)

static void max_fwd_range(void *vc, int64_t a, int64_t b) {
  const pool_ctx *c = vc;
  int64_t H = c->H, W = c->W, OH = c->OH, OW = c->OW;
  for (int64_t nc = a; nc < b; nc++) {
    const float *img = c->x + nc * H * W;
    float *out = c->out + nc * OH * OW;
    int32_t *am = c->argmax + nc * OH * OW;
    if (c->K == 2 && c->stride == 2 && c->pad == 0) {
      for (int64_t oy = 0; oy < OH; oy++) {
        const float *r0 = img + 2 * oy * W, *r1 = r0 + W;
        float *o = out + oy * OW;
        int32_t *m = am + oy * OW, i0 = (int32_t)(2 * oy * W), i1 = i0 + (int32_t)W;
        for (int64_t ox = 0; ox < OW; ox++) { /* TAKE's rule as selects: GCC vectorises it */
          int64_t i = 2 * ox;
          float best = r0[i], v;
          int32_t at = i0 + (int32_t)i, t;
          v = r0[i + 1], t = (v > best) | (v != v), best = t ? v : best, at = t ? i0 + (int32_t)i + 1 : at;
          v = r1[i], t = (v > best) | (v != v), best = t ? v : best, at = t ? i1 + (int32_t)i : at;
          v = r1[i + 1], t = (v > best) | (v != v), best = t ? v : best, at = t ? i1 + (int32_t)i + 1 : at;
          o[ox] = best;
          m[ox] = at;
        }
      }
      continue;
    }
    for (int64_t oy = 0; oy < OH; oy++) {
      int64_t iy0 = oy * c->stride - c->pad, ky0, ky1;
      clip(iy0, c->K, H, &ky0, &ky1);
      for (int64_t ox = 0; ox < OW; ox++) {
        int64_t ix0 = ox * c->stride - c->pad, kx0, kx1;
        clip(ix0, c->K, W, &kx0, &kx1);
        float best = -INFINITY;
        int32_t at = -1;
        for (int64_t ky = ky0; ky < ky1; ky++)
          for (int64_t kx = kx0; kx < kx1; kx++) {
            int64_t idx = (iy0 + ky) * W + ix0 + kx;
            if (at < 0) best = img[idx], at = (int32_t)idx; /* the first tap */
            else TAKE(img[idx], idx);
          }
        out[oy * OW + ox] = best;
        am[oy * OW + ox] = at;
      }
    }
  }
}

static void max_bwd_range(void *vc, int64_t a, int64_t b) {
  const pool_ctx *c = vc;
  int64_t P = c->OH * c->OW;
  for (int64_t nc = a; nc < b; nc++) {
    float *dx = c->dx + nc * c->H * c->W;
    const float *d = c->dout + nc * P;
    const int32_t *am = c->am + nc * P;
    for (int64_t p = 0; p < P; p++)
      if (am[p] >= 0) dx[am[p]] += d[p];
  }
}

/* Average pooling: forward (c->out) or, with c->dx, backward; one window walk for both. */
static void avg_range(void *vc, int64_t a, int64_t b) {
  const pool_ctx *c = vc;
  float inv = 1.0f / (float)(c->K * c->K); /* padding counts in the divisor */
  for (int64_t nc = a; nc < b; nc++) {
    const float *img = c->dx ? NULL : c->x + nc * c->H * c->W;
    float *dx = c->dx ? c->dx + nc * c->H * c->W : NULL;
    for (int64_t oy = 0; oy < c->OH; oy++) {
      int64_t iy0 = oy * c->stride - c->pad, ky0, ky1;
      clip(iy0, c->K, c->H, &ky0, &ky1);
      for (int64_t ox = 0; ox < c->OW; ox++) {
        int64_t ix0 = ox * c->stride - c->pad, kx0, kx1, o = (nc * c->OH + oy) * c->OW + ox;
        clip(ix0, c->K, c->W, &kx0, &kx1);
        if (dx) {
          float g = c->dout[o] * inv;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++) dx[(iy0 + ky) * c->W + ix0 + kx] += g;
        } else {
          float s = 0.0f;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++) s += img[(iy0 + ky) * c->W + ix0 + kx];
          c->out[o] = s * inv;
        }
      }
    }
  }
}

/* Planes per task: about 4096 outputs, at least one plane. */
static int64_t grain(int64_t OH, int64_t OW) {
  int64_t p = OH * OW;
  return p >= 4096 ? 1 : 4096 / (p > 0 ? p : 1);
}

void tdm_k_maxpool2d_fwd(float *out, int32_t *argmax, const float *x, int64_t N, int64_t C, int64_t H, int64_t W,
                         int64_t K, int64_t stride, int64_t pad, int64_t OH, int64_t OW) {
  pool_ctx c = {.out = out, .argmax = argmax, .x = x, .H = H, .W = W, .K = K, .stride = stride, .pad = pad, .OH = OH, .OW = OW};
  tdm_parallel_for(N * C, grain(OH, OW), max_fwd_range, &c);
}

void tdm_k_maxpool2d_bwd(float *dx, const float *dout, const int32_t *argmax, int64_t N, int64_t C, int64_t H,
                         int64_t W, int64_t OH, int64_t OW) {
  pool_ctx c = {.dx = dx, .dout = dout, .am = argmax, .H = H, .W = W, .OH = OH, .OW = OW};
  tdm_parallel_for(N * C, grain(OH, OW), max_bwd_range, &c);
}

void tdm_k_avgpool2d_fwd(float *out, const float *x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t stride, int64_t pad, int64_t OH, int64_t OW) {
  pool_ctx c = {.out = out, .x = x, .H = H, .W = W, .K = K, .stride = stride, .pad = pad, .OH = OH, .OW = OW};
  tdm_parallel_for(N * C, grain(OH, OW), avg_range, &c);
}

void tdm_k_avgpool2d_bwd(float *dx, const float *dout, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                         int64_t stride, int64_t pad, int64_t OH, int64_t OW) {
  pool_ctx c = {.dx = dx, .dout = dout, .H = H, .W = W, .K = K, .stride = stride, .pad = pad, .OH = OH, .OW = OW};
  tdm_parallel_for(N * C, grain(OH, OW), avg_range, &c);
}
