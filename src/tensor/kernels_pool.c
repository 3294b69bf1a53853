/* Max and average pooling over (N, C, H, W), one plane per task of the intra-op pool. Each
 * output is computed as the one-plane loops always did (the same window order, the same
 * comparisons and sums): the bits do not depend on the thread count, and are those of the
 * serial kernels this replaced. The window is clipped to the image once per output instead of
 * testing every tap, and 2x2 windows with stride 2 (the small CNN's) run 8 outputs a vector (AVX2). */
#include <math.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

/* One output row of a 2x2, stride-2 max-pool: r0 and the next row (W floats on), i0 r0's index
 * in the plane; TAKE's rule in the order r0[i], r0[i + 1], r1[i], r1[i + 1]. With AVX2, 8
 * outputs a vector (the CNN's rows of 14 and 7 left GCC's vectorised loop mostly to its scalar
 * tail, whose data-dependent branches cost 9% of the CNN's step), the row's end masked. */
#if defined(__AVX2__)
/* The even and the odd lanes of a[0..8) b[0..8), in order (the 64-bit permute undoes the
 * shuffle's interleaving of the two halves) */
static inline __m256 evens(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}
static inline __m256 odds(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
#endif

static void max2_row(float *o, int32_t *m, const float *r0, int64_t W, int32_t i0, int64_t OW) {
  const float *r1 = r0 + W;
  int32_t i1 = i0 + (int32_t)W;
  int64_t ox = 0;
#if defined(__AVX2__)
  const __m256i lane = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  for (; ox < OW; ox += 8) {
    int64_t n = OW - ox < 8 ? OW - ox : 8, x = 2 * ox;
    __m256 a0, b0, a1, b1;
    if (n == 8) a0 = _mm256_loadu_ps(r0 + x), b0 = _mm256_loadu_ps(r0 + x + 8), a1 = _mm256_loadu_ps(r1 + x), b1 = _mm256_loadu_ps(r1 + x + 8);
    else { /* 2n floats of each row: lanes past them read nothing */
      __m256i ma = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(2 * n < 8 ? 2 * n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      __m256i mb = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(2 * n - 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      a0 = _mm256_maskload_ps(r0 + x, ma), b0 = _mm256_maskload_ps(r0 + x + 8, mb);
      a1 = _mm256_maskload_ps(r1 + x, ma), b1 = _mm256_maskload_ps(r1 + x + 8, mb);
    }
    __m256 e0 = evens(a0, b0), o0 = odds(a0, b0), e1 = evens(a1, b1), o1 = odds(a1, b1);
    __m256i ia = _mm256_add_epi32(_mm256_set1_epi32(i0 + (int32_t)x), lane);
    __m256i ib = _mm256_add_epi32(_mm256_set1_epi32(i1 + (int32_t)x), lane), one = _mm256_set1_epi32(1);
    __m256 best = e0, at = _mm256_castsi256_ps(ia), t;
#define TAKE8(v, idx)                                                                   \
  t = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)); \
  best = _mm256_blendv_ps(best, v, t), at = _mm256_blendv_ps(at, _mm256_castsi256_ps(idx), t)
    TAKE8(o0, _mm256_add_epi32(ia, one));
    TAKE8(e1, ib);
    TAKE8(o1, _mm256_add_epi32(ib, one));
#undef TAKE8
    if (n == 8) _mm256_storeu_ps(o + ox, best), _mm256_storeu_si256((__m256i *)(m + ox), _mm256_castps_si256(at));
    else {
      float bb[8], ab[8];
      _mm256_storeu_ps(bb, best), _mm256_storeu_ps(ab, at);
      memcpy(o + ox, bb, sizeof(float) * (size_t)n), memcpy(m + ox, ab, sizeof(int32_t) * (size_t)n);
    }
  }
#endif
  for (; ox < OW; ox++) {
    int64_t i = 2 * ox;
    float best = r0[i];
    int32_t at = i0 + (int32_t)i;
    TAKE(r0[i + 1], i0 + i + 1);
    TAKE(r1[i], i1 + i);
    TAKE(r1[i + 1], i1 + i + 1);
    o[ox] = best;
    m[ox] = at;
  }
}

static void max_fwd_range(void *vc, int64_t a, int64_t b) {
  const pool_ctx *c = vc;
  int64_t H = c->H, W = c->W, OH = c->OH, OW = c->OW;
  for (int64_t nc = a; nc < b; nc++) {
    const float *img = c->x + nc * H * W;
    float *out = c->out + nc * OH * OW;
    int32_t *am = c->argmax + nc * OH * OW;
    if (c->K == 2 && c->stride == 2 && c->pad == 0) {
      for (int64_t oy = 0; oy < OH; oy++)
        max2_row(out + oy * OW, am + oy * OW, img + 2 * oy * W, W, (int32_t)(2 * oy * W), OW);
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
