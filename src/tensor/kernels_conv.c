/* conv2d by im2col + GEMM (one image at a time, so the column buffer stays small). Pooling:
 * kernels_pool.c. */
#include <math.h>
#include <string.h>

#include "tandem/kernels.h"

/* col (Ci*KH*KW, OH*OW) from one image x (Ci, H, W); out-of-image taps read as 0. */
static void im2col(float *col, const float *x, const tdm_conv_shape *s) {
  int64_t P = s->OH * s->OW;
  for (int64_t c = 0; c < s->Ci; c++)
    for (int64_t ky = 0; ky < s->KH; ky++)
      for (int64_t kx = 0; kx < s->KW; kx++) {
        float *row = col + ((c * s->KH + ky) * s->KW + kx) * P;
        for (int64_t oy = 0; oy < s->OH; oy++) {
          int64_t iy = oy * s->stride - s->pad + ky;
          for (int64_t ox = 0; ox < s->OW; ox++) {
            int64_t ix = ox * s->stride - s->pad + kx;
            row[oy * s->OW + ox] =
                (iy >= 0 && iy < s->H && ix >= 0 && ix < s->W) ? x[(c * s->H + iy) * s->W + ix] : 0.0f;
          }
        }
      }
}

/* dx (Ci, H, W) += the scatter of col back onto the image. */
static void col2im(float *dx, const float *col, const tdm_conv_shape *s) {
  int64_t P = s->OH * s->OW;
  for (int64_t c = 0; c < s->Ci; c++)
    for (int64_t ky = 0; ky < s->KH; ky++)
      for (int64_t kx = 0; kx < s->KW; kx++) {
        const float *row = col + ((c * s->KH + ky) * s->KW + kx) * P;
        for (int64_t oy = 0; oy < s->OH; oy++) {
          int64_t iy = oy * s->stride - s->pad + ky;
          if (iy < 0 || iy >= s->H) continue;
          for (int64_t ox = 0; ox < s->OW; ox++) {
            int64_t ix = ox * s->stride - s->pad + kx;
            if (ix >= 0 && ix < s->W) dx[(c * s->H + iy) * s->W + ix] += row[oy * s->OW + ox];
          }
        }
      }
}

void tdm_k_conv2d_fwd(float *out, const float *x, const float *w, const float *b, float *col, const tdm_conv_shape *s) {
  int64_t K = s->Ci * s->KH * s->KW, P = s->OH * s->OW;
  for (int64_t n = 0; n < s->N; n++) {
    float *o = out + n * s->Co * P;
    im2col(col, x + n * s->Ci * s->H * s->W, s);
    float beta = 0.0f;
    if (b) {
      for (int64_t co = 0; co < s->Co; co++)
        for (int64_t p = 0; p < P; p++) o[co * P + p] = b[co];
      beta = 1.0f;
    }
    tdm_k_gemm(0, 0, s->Co, P, K, 1.0f, w, K, col, P, beta, o, P);
  }
}

void tdm_k_conv2d_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, float *col,
                      const tdm_conv_shape *s) {
  int64_t K = s->Ci * s->KH * s->KW, P = s->OH * s->OW;
  for (int64_t n = 0; n < s->N; n++) {
    const float *d = dout + n * s->Co * P;
    if (db)
      for (int64_t co = 0; co < s->Co; co++)
        for (int64_t p = 0; p < P; p++) db[co] += d[co * P + p];
    if (dw) {
      im2col(col, x + n * s->Ci * s->H * s->W, s);
      tdm_k_gemm(0, 1, s->Co, K, P, 1.0f, d, P, col, P, 1.0f, dw, K); /* dW += dout col^T */
    }
    if (dx) {
      tdm_k_gemm(1, 0, K, P, s->Co, 1.0f, w, K, d, P, 0.0f, col, P); /* dcol = W^T dout */
      col2im(dx + n * s->Ci * s->H * s->W, col, s);
    }
  }
}
