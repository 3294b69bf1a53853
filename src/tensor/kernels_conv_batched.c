/* conv2d on the whole batch: images are taken in chunks, each chunk one im2col into a (K, nb*P)
 * column matrix and one GEMM with N = nb*P columns (K = Ci*KH*KW, P = OH*OW), so the late layers
 * of a ResNet (P = 49) still give OpenBLAS wide products. The chunk size depends on the shape
 * alone, so the summation order (and the bits) do not depend on the thread count or the run. */
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

#define CHUNK_FLOATS ((int64_t)1 << 21) /* the column chunk: 8 MiB, about the last-level cache */

int64_t tdm_k_conv2d_chunk(const tdm_conv_shape *s) {
  if (!s) return 0; /* a sizer, not a kernel: the header's one NULL shape */
  int64_t per = s->Ci * s->KH * s->KW * s->OH * s->OW, nb = per > 0 ? CHUNK_FLOATS / per : s->N;
  if (nb < 1) nb = 1;
  return nb < s->N ? nb : (s->N > 0 ? s->N : 1);
}

static int64_t im2col_ws_floats(const tdm_conv_shape *s) {
  int64_t nb = tdm_k_conv2d_chunk(s), P = s->OH * s->OW;
  return nb * P * (s->Ci * s->KH * s->KW + s->Co);
}

int64_t tdm_k_conv2d_ws_floats(const tdm_conv_shape *s) {
  if (!s) return 0;
  if (!tdm_k_conv2d_direct_fits(s)) return im2col_ws_floats(s);
  return tdm_k_conv2d_direct_ws_floats(s);
}

typedef struct {
  const tdm_conv_shape *s;
  const float *x;   /* the chunk's first image */
  float *col;       /* (K, nb*P) */
  float *dx;        /* col2im target */
  int64_t nb;
  /* scatter / gather between (Co, nb*P) and (nb, Co, P) */
  float *out;
  const float *tmp_in;
  float *tmp_out;
  const float *bias;
  float *db;
} chunk_ctx;

/* The output columns ox in [lo, hi) whose input column ox * stride - pad + kx lies inside. */
static void ox_range(const tdm_conv_shape *s, int64_t kx, int64_t *lo, int64_t *hi) {
  int64_t a = s->pad - kx, b = s->W - 1 + s->pad - kx; /* ox * stride in [a, b] */
  int64_t l = a <= 0 ? 0 : (a + s->stride - 1) / s->stride, h = b < 0 ? 0 : b / s->stride + 1;
  if (h > s->OW) h = s->OW;
  if (l > h) l = h;
  *lo = l, *hi = h;
}

/* Rows [r0, r1) of the column matrix: row (c, ky, kx), column (j, oy, ox). The in-bounds range
 * of ox depends on kx alone, so each output row is zeros, a plain copy (stride 1) or a strided
 * gather, and zeros, in loops the compiler vectorises (memcpy's call cost more than the copy of a
 * 28-float row). */
static void im2col_rows(void *vc, int64_t r0, int64_t r1) {
  chunk_ctx *c = vc;
  const tdm_conv_shape *s = c->s;
  const int64_t P = s->OH * s->OW, HW = s->H * s->W, OW = s->OW, st = s->stride;
  for (int64_t r = r0; r < r1; r++) {
    int64_t ch = r / (s->KH * s->KW), ky = (r / s->KW) % s->KH, kx = r % s->KW, lo, hi;
    ox_range(s, kx, &lo, &hi);
    const int64_t off = lo * st - s->pad + kx; /* input column of ox = lo */
    for (int64_t j = 0; j < c->nb; j++) {
      const float *img = c->x + (j * s->Ci + ch) * HW;
      float *row = c->col + r * c->nb * P + j * P;
      for (int64_t oy = 0; oy < s->OH; oy++) {
        int64_t iy = oy * st - s->pad + ky;
        float *restrict o = row + oy * OW;
        if (iy < 0 || iy >= s->H) {
          for (int64_t ox = 0; ox < OW; ox++) o[ox] = 0.0f;
          continue;
        }
        const float *restrict src = img + iy * s->W + off;
        for (int64_t ox = 0; ox < lo; ox++) o[ox] = 0.0f;
        if (st == 1)
          for (int64_t k = 0; k < hi - lo; k++) o[lo + k] = src[k];
        else
          for (int64_t k = 0; k < hi - lo; k++) o[lo + k] = src[k * st];
        for (int64_t ox = hi; ox < OW; ox++) o[ox] = 0.0f;
      }
    }
  }
}

/* One output row's three taps of a 3x3 stride-2 pad-1 input gradient, added into input row d:
 * tap kx of output column m lands on column 2m - 1 + kx, so the even columns take g1 alone and
 * the odd column 2m + 1 takes g0[m + 1] then g2[m], each element's adds in col2im's order (kx
 * ascending), so the bits are its own. One pass over the row, both columns a step: the general
 * loop's three strided passes ran a scalar read-modify-write a value. */
static void col2im_s2k3_row(float *d, const float *g0, const float *g1, const float *g2, int64_t OW, int64_t W) {
  int64_t m = 0;
  for (; m + 1 < OW; m++) {
    d[2 * m] += g1[m];
    d[2 * m + 1] = (d[2 * m + 1] + g0[m + 1]) + g2[m];
  }
  d[2 * m] += g1[m]; /* m = OW - 1: no kx = 0 past it, kx = 2 only where the row has the column */
  if (2 * m + 1 < W) d[2 * m + 1] += g2[m];
}

/* Input channels [c0, c1): dx += the scatter of the column rows that read them. */
static void col2im_channels(void *vc, int64_t c0, int64_t c1) {
  chunk_ctx *c = vc;
  const tdm_conv_shape *s = c->s;
  int64_t P = s->OH * s->OW, HW = s->H * s->W;
  if (s->stride == 2 && s->KH == 3 && s->KW == 3 && s->pad == 1 && s->OW >= 1 && s->W >= 2 * s->OW - 1) {
    for (int64_t ch = c0; ch < c1; ch++)
      for (int64_t ky = 0; ky < 3; ky++) {
        const float *rows = c->col + (ch * 3 + ky) * 3 * c->nb * P; /* taps kx = 0, 1, 2, nb P apart */
        for (int64_t j = 0; j < c->nb; j++)
          for (int64_t oy = 0; oy < s->OH; oy++) {
            int64_t iy = 2 * oy - 1 + ky;
            if (iy < 0 || iy >= s->H) continue;
            const float *g = rows + j * P + oy * s->OW;
            col2im_s2k3_row(c->dx + (j * s->Ci + ch) * HW + iy * s->W, g, g + c->nb * P, g + 2 * c->nb * P, s->OW, s->W);
          }
      }
    return;
  }
  for (int64_t ch = c0; ch < c1; ch++)
    for (int64_t ky = 0; ky < s->KH; ky++)
      for (int64_t kx = 0; kx < s->KW; kx++) {
        int64_t r = (ch * s->KH + ky) * s->KW + kx;
        for (int64_t j = 0; j < c->nb; j++) {
          float *img = c->dx + (j * s->Ci + ch) * HW;
          const float *row = c->col + r * c->nb * P + j * P;
          for (int64_t oy = 0; oy < s->OH; oy++) {
            int64_t iy = oy * s->stride - s->pad + ky;
            if (iy < 0 || iy >= s->H) continue;
            const float *g = row + oy * s->OW;
            int64_t lo, hi;
            ox_range(s, kx, &lo, &hi);
            if (hi <= lo) continue;
            float *dst = img + iy * s->W + lo * s->stride - s->pad + kx; /* input column of ox = lo */
            if (s->stride == 1)
              for (int64_t ox = lo; ox < hi; ox++) dst[ox - lo] += g[ox];
            else
              for (int64_t ox = lo; ox < hi; ox++) dst[(ox - lo) * s->stride] += g[ox];
          }
        }
      }
}

/* out (nb, Co, P) = tmp (Co, nb*P) + bias, for output channels [c0, c1). */
static void scatter_out(void *vc, int64_t c0, int64_t c1) {
  chunk_ctx *c = vc;
  int64_t P = c->s->OH * c->s->OW, Co = c->s->Co;
  for (int64_t co = c0; co < c1; co++) {
    float bv = c->bias ? c->bias[co] : 0.0f;
    for (int64_t j = 0; j < c->nb; j++) {
      const float *src = c->tmp_in + co * c->nb * P + j * P;
      float *dst = c->out + (j * Co + co) * P;
      for (int64_t p = 0; p < P; p++) dst[p] = src[p] + bv;
    }
  }
}

/* tmp (Co, nb*P) = dout (nb, Co, P), and db += its row sums, for output channels [c0, c1). */
static void gather_dout(void *vc, int64_t c0, int64_t c1) {
  chunk_ctx *c = vc;
  int64_t P = c->s->OH * c->s->OW, Co = c->s->Co;
  for (int64_t co = c0; co < c1; co++) {
    float acc = 0.0f;
    for (int64_t j = 0; j < c->nb; j++) {
      const float *src = c->tmp_in + (j * Co + co) * P;
      float *dst = c->tmp_out + co * c->nb * P + j * P;
      memcpy(dst, src, sizeof(float) * (size_t)P);
      if (c->db)
        for (int64_t p = 0; p < P; p++) acc += src[p];
    }
    if (c->db) c->db[co] += acc;
  }
}

void tdm_k_conv2d_fwd_batched(float *out, const float *x, const float *w, const float *b, float *ws,
                              const tdm_conv_shape *s) {
  if (tdm_k_conv2d_direct_fits(s)) {
    tdm_k_conv2d_fwd_direct(out, x, w, b, ws, s);
    return;
  }
  int64_t K = s->Ci * s->KH * s->KW, P = s->OH * s->OW, NB = tdm_k_conv2d_chunk(s);
  float *col = ws, *tmp = ws + NB * P * K;
  for (int64_t n0 = 0; n0 < s->N; n0 += NB) {
    int64_t nb = s->N - n0 < NB ? s->N - n0 : NB;
    chunk_ctx c = {s, x + n0 * s->Ci * s->H * s->W, col, NULL, nb, out + n0 * s->Co * P, tmp, NULL, b, NULL};
    tdm_parallel_for(K, 1, im2col_rows, &c);
    tdm_k_gemm(0, 0, s->Co, nb * P, K, 1.0f, w, K, col, nb * P, 0.0f, tmp, nb * P);
    tdm_parallel_for(s->Co, 1, scatter_out, &c);
  }
}

void tdm_k_conv2d_bwd_batched(float *dx, int dx_set, float *dw, float *db, const float *dout, const float *x,
                              const float *w, float *ws, const tdm_conv_shape *s) {
  if (tdm_k_conv2d_direct_fits(s)) {
    tdm_k_conv2d_bwd_direct(dx, dx_set, dw, db, dout, x, w, ws, s);
    return;
  }
  if (dx && dx_set) tdm_k_zero(dx, s->N * s->Ci * s->H * s->W); /* col2im adds */
  int64_t K = s->Ci * s->KH * s->KW, P = s->OH * s->OW, NB = tdm_k_conv2d_chunk(s);
  float *col = ws, *tmp = ws + NB * P * K;
  for (int64_t n0 = 0; n0 < s->N; n0 += NB) {
    int64_t nb = s->N - n0 < NB ? s->N - n0 : NB;
    chunk_ctx c = {s, x + n0 * s->Ci * s->H * s->W, col, dx ? dx + n0 * s->Ci * s->H * s->W : NULL, nb, NULL,
                   dout + n0 * s->Co * P, tmp, NULL, db};
    tdm_parallel_for(s->Co, 1, gather_dout, &c);
    if (dw) {
      tdm_parallel_for(K, 1, im2col_rows, &c);
      tdm_k_gemm(0, 1, s->Co, K, nb * P, 1.0f, tmp, nb * P, col, nb * P, 1.0f, dw, K); /* dW += dout col^T */
    }
    if (dx) {
      tdm_k_gemm(1, 0, K, nb * P, s->Co, 1.0f, w, K, tmp, nb * P, 0.0f, col, nb * P); /* dcol = W^T dout */
      tdm_parallel_for(s->Ci, 1, col2im_channels, &c);
    }
  }
}
