/* The direct convolution kernels as a table per instruction set (conv_direct_impl.h is their
 * body). kernels_conv_direct.c picks the table at run time from what the CPU has, so one binary
 * (a container image, a -march=x86-64 or sanitizer build) runs the AVX-512 kernels on AVX-512
 * machines and the AVX2 ones on AVX2 machines. Internal. */
#ifndef TDM_TENSOR_CONV_DIRECT_H
#define TDM_TENSOR_CONV_DIRECT_H

#include <stdint.h>

#include "tandem/kernels.h"

typedef struct {
  const char *isa; /* "avx2", "avx512" */
  int64_t (*ws_floats)(const tdm_conv_shape *s);
  void (*fwd)(float *out, const float *x, const float *w, const float *b, float *ws, const tdm_conv_shape *s);
  void (*bwd)(float *dx, int dx_set, float *dw, float *db, const float *dout, const float *x, const float *w,
              float *ws, const tdm_conv_shape *s);
  /* Winograd F(4x4, 3x3) or F(2x2, 3x3) (tile 4 or 2) and F(2x2, 5x5) (conv_winograd_impl.h) for the shapes
   * wino_fits: the forward, the input gradient and the weight gradient (dw +=; 0 where it declines, at
   * several hundred channels: bwd gives it then; bwd with dx and dw NULL gives the bias gradient).
   * ws_floats covers either tile. */
  int (*wino_fits)(const tdm_conv_shape *s);
  void (*wino_fwd)(float *out, const float *x, const float *w, const float *b, float *ws, const tdm_conv_shape *s,
                   int tile);
  void (*wino_dx)(float *dx, int dx_set, const float *dout, const float *w, float *ws, const tdm_conv_shape *s,
                  int tile);
  int (*wino_dw)(float *dw, const float *dout, const float *x, float *ws, const tdm_conv_shape *s,
                 int tile); /* 0: declined */
} tdm__conv_direct_impl;

/* Each returns its table, or NULL where its file was compiled without the instructions (a
 * compiler or processor family that lacks them). They do not ask the CPU: the caller does. */
const tdm__conv_direct_impl *tdm__conv_direct_avx2(void);
const tdm__conv_direct_impl *tdm__conv_direct_avx512(void);

#endif
