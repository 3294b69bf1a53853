/* The direct and Winograd convolution kernels' 16-wide logic on any machine: the same kernel
 * body (src/tensor/conv_direct_impl.h, conv_winograd_impl.h) compiled with vectors emulated as
 * arrays of 16 floats, against the per-image im2col reference. A machine without AVX-512 (this
 * project's own, at times) cannot run the AVX-512 build; its tiles, tails, masks and the
 * Winograd path's row overruns are the same code as here, only the dozen intrinsics under each
 * vector operation differ (those are checked on the machines that have them, by test_resnet). */
#define CONV_DIRECT_VL 16
#define CONV_DIRECT_EMULATE
#define CONV_DIRECT_TABLE emulated16
#define WINO_BAND 96 /* Winograd's bands of tile rows at these small sizes (1024 tiles in the library) */
#include "tensor/conv_direct_impl.h"

#include "tdm_test.h"

/* Sizes around the vector (16 floats: 2 or 4 x 16 input columns per split, 16 tiles per group) and
 * the shapes ResNet and the small CNN use, Winograd's blocks of several images and its bands of
 * tile rows, its narrow rows (a vector of 4 or 2 tile rows: 14x14 and 5x14 in 4x4 tiles, 16x16 and
 * 2x16 in 2x2 ones; the last two of each, several images' planes at once); forward, dx written and added, dw and db; the direct path, and Winograd for each
 * stride-1 shape: F(2x2, 3x3) and F(4x4, 3x3), F(2x2, 5x5). */
static void test_emulated_matches_reference(void) {
  const int64_t cases[][8] = {/* N, Ci, H, W, Co, K, stride, pad */
                              {3, 5, 7, 7, 9, 3, 1, 1},   {2, 3, 33, 31, 4, 3, 1, 1}, {2, 2, 1, 1, 3, 3, 1, 1},
                              {3, 4, 2, 3, 5, 3, 1, 1},   {5, 17, 9, 16, 8, 3, 1, 1}, {2, 8, 28, 28, 17, 3, 1, 1},
                              {9, 16, 7, 7, 16, 3, 1, 1}, {2, 3, 14, 13, 7, 5, 1, 2}, {3, 6, 9, 8, 10, 3, 2, 1},
                              {2, 4, 32, 33, 3, 3, 1, 1}, {1, 2, 17, 17, 2, 3, 1, 1}, {4, 7, 15, 15, 6, 3, 2, 1},
                              {2, 40, 20, 19, 30, 3, 1, 1}, {3, 16, 14, 14, 32, 5, 1, 2}, {2, 9, 11, 17, 5, 5, 1, 2},
                              {2, 4, 33, 31, 3, 5, 1, 2},   {1, 2, 1, 1, 3, 5, 1, 2},   {5, 8, 2, 3, 9, 5, 1, 2},
                              {1, 3, 40, 70, 4, 3, 1, 1},   {4, 6, 14, 14, 5, 3, 1, 1}, {2, 5, 6, 5, 3, 3, 1, 1},
                              {2, 9, 16, 16, 10, 3, 1, 1},  {5, 6, 5, 14, 7, 3, 1, 1},  {3, 8, 2, 16, 9, 3, 1, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tdm_test_conv_ref r;
    tdm_test_conv_ref_init(&r, cases[c], 11 + c);
    tdm_conv_shape s = r.s;
    int64_t nx = r.nx, nw = r.nw, ny = r.ny;
    const float *x = r.x, *w = r.w, *b = r.b, *dy = r.dy, *y0 = r.y, *dx0 = r.dx, *dw0 = r.dw, *db0 = r.db;
    float *y1 = malloc(sizeof(float) * ny), *dx1 = malloc(sizeof(float) * nx), *dw1 = calloc(nw, 4), *db1 = calloc(s.Co, 4);
    int64_t nws = emulated16.ws_floats(&s), nwino = wino_ws_any(&s); /* (the kernels at any channel count) */
    if (nwino > nws) nws = nwino;
    float *ws = malloc(sizeof(float) * nws);
    double tol = r.tol;
    int geo = s.stride == 1 && ((s.KH == 3 && s.pad == 1) || (s.KH == 5 && s.pad == 2)); /* (wino_fits also asks for 8 channels each way) */
    int paths = 1 + geo + (geo && s.KH == 3); /* direct; Winograd tile 2; tile 4 */
    static const char *names[] = {"direct", "winograd 2x2", "winograd 4x4"};
    for (int wino = 0; wino < paths; wino++) {
      const char *path = names[wino];
      int tile = wino == 2 ? 4 : 2;
      for (int64_t i = 0; i < nws; i++) ws[i] = NAN; /* no kernel may read scratch it did not write */
      for (int64_t i = 0; i < ny; i++) y1[i] = NAN;
      if (wino) emulated16.wino_fwd(y1, x, w, b, ws, &s, tile);
      else emulated16.fwd(y1, x, w, b, ws, &s);
      CHECK_MSG(tdm_test_max_abs_diff(y0, y1, ny) < tol, "case %zu (%s): out differs by %g", c, path, tdm_test_max_abs_diff(y0, y1, ny));
      for (int64_t i = 0; i < nx; i++) dx1[i] = NAN; /* written over, not added to */
      if (wino) emulated16.wino_dx(dx1, 1, dy, w, ws, &s, tile);
      else emulated16.bwd(dx1, 1, NULL, NULL, dy, x, w, ws, &s);
      CHECK_MSG(tdm_test_max_abs_diff(dx0, dx1, nx) < tol, "case %zu (%s): dx differs by %g", c, path, tdm_test_max_abs_diff(dx0, dx1, nx));
      if (wino) emulated16.wino_dx(dx1, 0, dy, w, ws, &s, tile);
      else emulated16.bwd(dx1, 0, NULL, NULL, dy, x, w, ws, &s);
      for (int64_t i = 0; i < nx; i++) dx1[i] -= dx0[i]; /* added: twice the gradient */
      CHECK_MSG(tdm_test_max_abs_diff(dx0, dx1, nx) < 2 * tol, "case %zu (%s): dx added differs by %g", c, path, tdm_test_max_abs_diff(dx0, dx1, nx));
    }
    for (int wino = 0; wino < paths; wino++) {
      int tile = wino == 2 ? 4 : 2;
      for (int64_t i = 0; i < nws; i++) ws[i] = NAN;
      for (int64_t i = 0; i < nw; i++) dw1[i] = 1.0f; /* added to */
      memset(db1, 0, sizeof(float) * s.Co);
      if (wino) CHECK_MSG(emulated16.wino_dw(dw1, dy, x, ws, &s, tile), "case %zu: the Winograd weight gradient declined", c);
      else emulated16.bwd(NULL, 0, dw1, db1, dy, x, w, ws, &s);
      for (int64_t i = 0; i < nw; i++) dw1[i] -= 1.0f;
      CHECK_MSG(tdm_test_max_abs_diff(dw0, dw1, nw) < tol, "case %zu (%s): dw differs by %g", c, names[wino],
                tdm_test_max_abs_diff(dw0, dw1, nw));
      if (!wino) CHECK_MSG(tdm_test_max_abs_diff(db0, db1, s.Co) < tol, "case %zu: db differs by %g", c, tdm_test_max_abs_diff(db0, db1, s.Co));
    }
    free(y1), free(dx1), free(dw1), free(db1), free(ws);
    tdm_test_conv_ref_free(&r);
  }
}

int main(void) {
  tdm_test_case cases[] = {
      {"emulated_matches_reference", test_emulated_matches_reference},
  };
  return tdm_test_main(cases, sizeof cases / sizeof cases[0]);
}
