/* Batched convolution, batch normalization (and its synchronised form over real ranks), global
 * average pooling and the ResNet model: against the per-image reference kernel, finite
 * differences, closed forms, and one process of the whole batch. */
#include <pthread.h>

#include "tdm_test.h"
#include "tandem/kernels.h"

/* The batched kernels equal the per-image im2col reference (the old kernel), forward and every
 * gradient, including shapes cut into several chunks and, where the CPU has AVX-512 or AVX2, the
 * direct kernels (3x3 and 5x5 "same" convolutions and 3x3 stride 2, odd and even sizes; channel
 * counts that fill no register tile; the small CNN's 5x5 at 14x14 and 3x3 at 7x7 without Winograd,
 * where the output's rows run in whole vectors instead of the padded grid, rows_pay) and Winograd
 * (3x3 and 5x5 at 8 channels or more each way, the CNN's 16 -> 32 at 14x14 among them). */
static int conv_direct_on; /* for_each_conv_path: the direct kernels run (2: with Winograd on) */
static void conv_batched_matches_reference(void) {
  const int64_t cases[][8] = {/* N, Ci, H, W, Co, K, stride, pad */
                              {5, 3, 7, 6, 4, 3, 1, 1}, {4, 2, 9, 8, 3, 3, 2, 1}, {3, 4, 6, 6, 5, 1, 2, 0},
                              {2, 1, 5, 5, 2, 5, 1, 2}, {20, 16, 28, 28, 4, 3, 1, 1}, {3, 2, 4, 4, 3, 3, 1, 0},
                              {3, 10, 7, 7, 9, 3, 1, 1}, {2, 6, 14, 13, 7, 5, 1, 2}, {1, 17, 1, 1, 3, 3, 1, 1},
                              {5, 16, 28, 28, 32, 3, 2, 1}, {3, 9, 7, 6, 10, 3, 2, 1}, {2, 3, 2, 1, 4, 3, 2, 1},
                              {2, 5, 6, 9, 3, 3, 2, 1},   {3, 4, 14, 14, 6, 5, 1, 2}, {3, 16, 14, 14, 32, 5, 1, 2},
                              {2, 9, 9, 11, 8, 5, 1, 2}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tdm_test_conv_ref r;
    tdm_test_conv_ref_init(&r, cases[c], 1 + c);
    tdm_conv_shape s = r.s;
    int64_t nx = r.nx, nw = r.nw, ny = r.ny;
    const float *x = r.x, *w = r.w, *b = r.b, *dy = r.dy, *y0 = r.y, *dw0 = r.dw, *db0 = r.db;
    float *dx0 = r.dx, *y1 = malloc(sizeof(float) * ny), *dx1 = calloc(nx, 4), *dw1 = calloc(nw, 4), *db1 = calloc(s.Co, 4);
    float *ws = malloc(sizeof(float) * tdm_k_conv2d_ws_floats(&s));
    double tol = r.tol;
    tdm_k_conv2d_fwd_batched(y1, x, w, b, ws, &s);
    for (int64_t i = 0; i < nx; i++) dx1[i] = 1e3f; /* written over, not added to */
    tdm_k_conv2d_bwd_batched(dx1, 1, dw1, db1, dy, x, w, ws, &s);
    CHECK_MSG(tdm_test_max_abs_diff(y0, y1, ny) < tol, "case %zu: out differs by %g", c, tdm_test_max_abs_diff(y0, y1, ny));
    CHECK_MSG(tdm_test_max_abs_diff(dx0, dx1, nx) < tol, "case %zu: dx differs by %g", c, tdm_test_max_abs_diff(dx0, dx1, nx));
    /* and added to: a second pass doubles dx */
    tdm_k_conv2d_bwd_batched(dx1, 0, NULL, NULL, dy, x, w, ws, &s);
    for (int64_t i = 0; i < nx; i++) dx0[i] *= 2;
    CHECK_MSG(tdm_test_max_abs_diff(dx0, dx1, nx) < 2 * tol, "case %zu: dx accumulated differs by %g", c, tdm_test_max_abs_diff(dx0, dx1, nx));
    CHECK_MSG(tdm_test_max_abs_diff(dw0, dw1, nw) < tol, "case %zu: dw differs by %g", c, tdm_test_max_abs_diff(dw0, dw1, nw));
    CHECK_MSG(tdm_test_max_abs_diff(db0, db1, s.Co) < tol, "case %zu: db differs by %g", c, tdm_test_max_abs_diff(db0, db1, s.Co));
    if (conv_direct_on) {
      int same = (s.stride == 1 && ((s.KH == 3 && s.pad == 1) || (s.KH == 5 && s.pad == 2))) ||
                 (s.stride == 2 && s.KH == 3 && s.pad == 1);
      CHECK_MSG(tdm_k_conv2d_direct_fits(&s) == same || getenv("TANDEM_CONV"), "case %zu: the direct kernel %s", c,
                same ? "should run" : "should not run");
      int wino = conv_direct_on == 2 && s.stride == 1 && ((s.KH == 3 && s.pad == 1) || (s.KH == 5 && s.pad == 2)) &&
                 s.Ci >= 8 && s.Co >= 8;
      CHECK_MSG(tdm_k_conv2d_winograd_on(&s) == wino || getenv("TANDEM_CONV"), "case %zu: Winograd %s", c,
                wino ? "should run" : "should not run");
    }
    if (c == 4) CHECK_MSG(tdm_k_conv2d_chunk(&s) < s.N, "case 4 should span several chunks (chunk %lld)", (long long)tdm_k_conv2d_chunk(&s));
    free(y1), free(dx1), free(dw1), free(db1), free(ws);
    tdm_test_conv_ref_free(&r);
  }
}

/* The direct kernels' bits do not depend on the thread count (docs/design.md): forward, input
 * and weight gradient of resnet20's shapes (stride 1 and 2) and 5x5 ones, on 1 and on 3 threads,
 * byte for byte; nor do the forward's and the input gradient's on how the batch is split. The
 * weight gradient's image halves are the point of the threads: 3 threads cut its units unevenly
 * across them; Winograd's blocks of images (2 at 14x14, 4 at 7x7) are the point of the split. */
static void conv_direct_threads_bitwise(void) {
  const int64_t cases[][8] = {{6, 16, 14, 14, 16, 3, 1, 1}, {5, 8, 9, 9, 16, 3, 2, 1}, {4, 3, 10, 11, 7, 5, 1, 2},
                              {9, 16, 7, 7, 16, 3, 1, 1},  {5, 4, 14, 14, 6, 5, 1, 2}, {5, 16, 14, 14, 32, 5, 1, 2}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tdm_conv_shape s = tdm_test_conv_shape(cases[c]);
    CHECK_MSG(tdm_k_conv2d_direct_fits(&s) || getenv("TANDEM_CONV"), "case %zu: the direct kernel should run", c);
    int64_t nx = s.N * s.Ci * s.H * s.W, nw = s.Co * s.Ci * s.KH * s.KW, ny = s.N * s.Co * s.OH * s.OW;
    float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw), *dy = malloc(sizeof(float) * ny);
    float *ws = malloc(sizeof(float) * tdm_k_conv2d_ws_floats(&s));
    float *y[2], *dx[2], *dw[2];
    tdm_test_fill_normal(x, nx, 41 + c, 1), tdm_test_fill_normal(w, nw, 42 + c, 0.3f), tdm_test_fill_normal(dy, ny, 43 + c, 1);
    for (int r = 0; r < 2; r++) {
      CHECK_OK(tdm_set_num_threads(r ? 3 : 1));
      y[r] = malloc(sizeof(float) * ny), dx[r] = calloc(nx, 4), dw[r] = calloc(nw, 4);
      tdm_k_conv2d_fwd_batched(y[r], x, w, NULL, ws, &s);
      tdm_k_conv2d_bwd_batched(dx[r], 1, dw[r], NULL, dy, x, w, ws, &s);
    }
    CHECK_OK(tdm_set_num_threads(1));
    CHECK_MSG(!memcmp(y[0], y[1], sizeof(float) * ny), "case %zu: the forward differs between 1 and 3 threads", c);
    { /* the batch in two (as two ranks hold it): the same forward and dx, byte for byte (Winograd
       * groups images into blocks: the split regroups them) */
      tdm_conv_shape a = s, b = s;
      a.N = s.N / 2 + 1, b.N = s.N - a.N;
      float *ys = malloc(sizeof(float) * ny), *dxs = calloc(nx, 4);
      int64_t ax = a.N * s.Ci * s.H * s.W, ay = a.N * s.Co * s.OH * s.OW;
      tdm_k_conv2d_fwd_batched(ys, x, w, NULL, ws, &a);
      tdm_k_conv2d_fwd_batched(ys + ay, x + ax, w, NULL, ws, &b);
      tdm_k_conv2d_bwd_batched(dxs, 1, NULL, NULL, dy, x, w, ws, &a);
      tdm_k_conv2d_bwd_batched(dxs + ax, 1, NULL, NULL, dy + ay, x + ax, w, ws, &b);
      CHECK_MSG(!memcmp(y[0], ys, sizeof(float) * ny), "case %zu: the forward differs when the batch is split", c);
      CHECK_MSG(!memcmp(dx[0], dxs, sizeof(float) * nx), "case %zu: dx differs when the batch is split", c);
      free(ys), free(dxs);
    }
    CHECK_MSG(!memcmp(dx[0], dx[1], sizeof(float) * nx), "case %zu: dx differs between 1 and 3 threads", c);
    CHECK_MSG(!memcmp(dw[0], dw[1], sizeof(float) * nw), "case %zu: dw differs between 1 and 3 threads", c);
    for (int r = 0; r < 2; r++) free(y[r]), free(dx[r]), free(dw[r]);
    free(x), free(w), free(dy), free(ws);
  }
}

/* Each check once per set of direct kernels this CPU has (AVX-512 machines run the AVX2 ones
 * too), and once on the im2col path alone; the set in use before (the CPU's best, or TANDEM_CONV's)
 * is selected again at the end. */
static void for_each_conv_path(void (*check)(void), int with_im2col) {
  const char *isas[] = {"avx512", "avx2"};
  const char *before = tdm_k_conv2d_direct_isa(); /* NULL: off (TANDEM_CONV=im2col) or none here */
  int ran = 0, was_on = before != NULL, wino_before = tdm_k_conv2d_winograd_enable(1);
  int tile_before = tdm_k_conv2d_winograd_tile(0);
  for (size_t i = 0; i < 2; i++) {
    if (!was_on || !tdm_k_conv2d_direct_select(isas[i])) continue;
    CHECK_MSG(!strcmp(tdm_k_conv2d_direct_isa(), isas[i]), "selected %s, running %s", isas[i], tdm_k_conv2d_direct_isa());
    for (int mode = 0; mode < 3; mode++) { /* 3x3 stride 1: Winograd F(4x4, 3x3), F(2x2, 3x3), then the direct kernel */
      int wino = mode < 2;
      tdm_k_conv2d_winograd_enable(wino);
      tdm_k_conv2d_winograd_tile(mode == 1 ? 2 : 4);
      printf("  (the %s kernels, Winograd %s)\n", isas[i], mode == 0 ? "4x4" : mode == 1 ? "2x2" : "off");
      conv_direct_on = 1 + wino;
      check();
    }
    ran++;
  }
  tdm_k_conv2d_winograd_enable(wino_before);
  tdm_k_conv2d_winograd_tile(tile_before);
  if (before) tdm_k_conv2d_direct_select(before);
  if (with_im2col) {
    tdm_k_conv2d_direct_enable(0);
    printf("  (im2col + GEMM)\n");
    conv_direct_on = 0;
    check();
    tdm_k_conv2d_direct_enable(was_on);
  }
  if (!ran) printf("  (no direct convolution kernels: this CPU has none, or TANDEM_CONV=im2col)\n");
}
/* Winograd's weight gradient keeps P x Co x Ci partial sums per scratch slot (P: 36 points in 4x4
 * tiles, 16 in 2x2); at several hundred channels (here 400: 41M floats in 2x2 tiles) it declines
 * and the direct kernel forms it: the same bytes as with Winograd off. At 16 channels it runs:
 * different bytes (the control). At 128 channels on 8x8 images (16 slots) 4x4 tiles' sums would be
 * 9.4M floats and 2x2 tiles' 4.2M: the 2x2 tiles run, their bytes (neither the direct kernel's). */
static void test_winograd_dw_declines_large(void) {
  if (!tdm_k_conv2d_winograd_on(NULL)) {
    printf("  (no Winograd here: no direct kernels, or TANDEM_CONV=im2col / TANDEM_WINOGRAD=off)\n");
    return;
  }
  const int64_t cases[][3] = {{64, 400, 4}, {8, 16, 8}, {192, 128, 8}}; /* N, C, H = W */
  int tile_before = tdm_k_conv2d_winograd_tile(4);
  for (int c = 0; c < 3; c++) {
    tdm_conv_shape s = {cases[c][0], cases[c][1], cases[c][2], cases[c][2], cases[c][1], 3, 3, 1, 1, cases[c][2], cases[c][2]};
    int64_t nx = s.N * s.Ci * s.H * s.W, nw = s.Co * s.Ci * 9;
    float *x = malloc(sizeof(float) * nx), *dy = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw);
    float *dw[2] = {calloc(nw, 4), calloc(nw, 4)}, *ws = malloc(sizeof(float) * tdm_k_conv2d_ws_floats(&s));
    tdm_test_fill_normal(x, nx, 71, 1), tdm_test_fill_normal(dy, nx, 72, 1), tdm_test_fill_normal(w, nw, 73, 0.1f);
    CHECK(tdm_k_conv2d_winograd_on(&s));
    for (int on = 0; on < 2; on++) {
      tdm_k_conv2d_winograd_enable(on);
      tdm_k_conv2d_bwd_batched(NULL, 0, dw[on], NULL, dy, x, w, ws, &s);
    }
    tdm_k_conv2d_winograd_enable(1);
    int same = !memcmp(dw[0], dw[1], sizeof(float) * nw);
    CHECK_MSG(same == (c == 0), "%lld channels: the weight gradient with Winograd on is %s the direct kernel's",
              (long long)s.Ci, same ? "byte for byte" : "not");
    if (c == 2) { /* 4x4 tiles declined: the 2x2 tiles' bytes */
      float *d2 = calloc(nw, 4);
      tdm_k_conv2d_winograd_tile(2);
      tdm_k_conv2d_bwd_batched(NULL, 0, d2, NULL, dy, x, w, ws, &s);
      tdm_k_conv2d_winograd_tile(4);
      CHECK_MSG(!memcmp(d2, dw[1], sizeof(float) * nw), "128 channels: 4x4 tiles' weight gradient should fall back to 2x2 tiles'");
      free(d2);
    }
    free(x), free(dy), free(w), free(dw[0]), free(dw[1]), free(ws);
  }
  tdm_k_conv2d_winograd_tile(tile_before);
}

static void test_conv_batched_matches_reference(void) { for_each_conv_path(conv_batched_matches_reference, 1); }
static void test_conv_direct_threads_bitwise(void) { for_each_conv_path(conv_direct_threads_bitwise, 0); }

/* ---- batch norm: finite differences ---------------------------------------------------------- */
static tdm_tensor *g_bn_train(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  tdm_tape_set_training(tp, 1);
  return tdm_batchnorm(tp, x[0], x[1], x[2], NULL, NULL, 0.1f, 1e-5f, NULL);
}
static tdm_tensor *g_bn_eval(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  tdm_tensor **rs = c;
  tdm_tape_set_training(tp, 0);
  return tdm_batchnorm(tp, x[0], x[1], x[2], rs[0], rs[1], 0.1f, 1e-5f, NULL);
}
static tdm_tensor *g_gap(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  return tdm_global_avgpool2d(tp, x[0]);
}
/* BN then a conv and a product with itself: the gradient reaches x through a non-linear loss */
static tdm_tensor *g_bn_chain(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  tdm_tape_set_training(tp, 1);
  tdm_tensor *h = tdm_batchnorm(tp, tdm_conv2d(tp, x[0], x[3], NULL, 1, 1), x[1], x[2], NULL, NULL, 0.1f, 1e-5f, NULL);
  return tdm_mul(tp, h, tdm_relu(tp, h));
}

static tdm_tensor *heap(int nd, const int64_t *shape, uint64_t seed, float scale, float shift, int grad) {
  tdm_tensor *t;
  if (tdm_tensor_create(&t, TDM_F32, nd, shape) != TDM_OK) return NULL;
  float *p = tdm_tensor_data(t);
  tdm_test_fill_normal(p, tdm_tensor_numel(t), seed, scale);
  for (int64_t i = 0; i < tdm_tensor_numel(t); i++) p[i] += shift;
  tdm_tensor_set_requires_grad(t, grad);
  return t;
}

/* A fused op's test: its output out[1] equals the two ops' out[0] byte for byte, and about half
 * of it is zero (so the ReLU's mask matters); label names the case. */
static void check_fused_outputs(const float *const out[2], int64_t n, const char *label) {
  int64_t zeros = 0;
  for (int64_t i = 0; out[0] && out[1] && i < n; i++) zeros += out[1][i] == 0.0f;
  CHECK_MSG(out[0] && out[1] && !memcmp(out[0], out[1], sizeof(float) * (size_t)n), "%s: outputs differ", label);
  CHECK_MSG(zeros > n / 5 && zeros < n * 4 / 5, "%s: %lld of %lld outputs zero; expected about half", label,
            (long long)zeros, (long long)n);
}

/* a and b both there, of the same bytes */
static int same_bytes(const tdm_tensor *a, const tdm_tensor *b) {
  return a && b && tdm_tensor_numel(a) == tdm_tensor_numel(b) &&
         !memcmp(tdm_tensor_data(a), tdm_tensor_data(b), sizeof(float) * (size_t)tdm_tensor_numel(a));
}

static void test_bn_gradcheck(void) {
  int64_t xs4[4] = {3, 2, 2, 3}, xs2[2] = {5, 3}, c2[1] = {2}, c3[1] = {3}, ws[4] = {2, 2, 3, 3};
  tdm_gradcheck_opts o = {1e-2, 2e-3, 2e-2};
  double err;
  for (int d = 0; d < 2; d++) { /* (N, C, H, W) and (N, C) */
    int64_t *c = d ? c3 : c2;
    tdm_tensor *in[3] = {d ? heap(2, xs2, 11, 1.5f, 0.5f, 1) : heap(4, xs4, 11, 1.5f, 0.5f, 1), heap(1, c, 12, 0.5f, 1.0f, 1),
                         heap(1, c, 13, 0.5f, 0, 1)};
    CHECK_OK(tdm_gradcheck(g_bn_train, NULL, 3, in, &o, &err));
    tdm_tensor *rs[2] = {heap(1, c, 14, 0.3f, 0, 0), heap(1, c, 15, 0.1f, 1.2f, 0)};
    CHECK_OK(tdm_gradcheck(g_bn_eval, rs, 3, in, &o, &err));
    for (int k = 0; k < 3; k++) tdm_tensor_destroy(in[k]);
    tdm_tensor_destroy(rs[0]), tdm_tensor_destroy(rs[1]);
  }
  tdm_tensor *in[4] = {heap(4, xs4, 21, 1, 0, 1), heap(1, c2, 22, 0.5f, 1, 1), heap(1, c2, 23, 0.5f, 0, 1), heap(4, ws, 24, 0.4f, 0, 1)};
  CHECK_OK(tdm_gradcheck(g_bn_chain, NULL, 4, in, &o, &err));
  CHECK_OK(tdm_gradcheck(g_gap, NULL, 1, in, &o, &err));
  for (int k = 0; k < 4; k++) tdm_tensor_destroy(in[k]);
}

/* Closed forms: the output of training mode has mean b and standard deviation w per channel;
 * the running statistics move by momentum towards the batch mean and the unbiased variance;
 * evaluation mode uses them. */
static void test_bn_statistics(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t xs[4] = {4, 3, 5, 2}, cs[1] = {3};
  tdm_tensor *x = heap(4, xs, 31, 2.0f, 3.0f, 0), *w = heap(1, cs, 32, 0.2f, 1.0f, 1), *b = heap(1, cs, 33, 1, 0, 1);
  tdm_tensor *rm = heap(1, cs, 34, 0, 0.5f, 0), *rv = heap(1, cs, 35, 0, 2.0f, 0);
  tdm_tape_set_training(tp, 1);
  tdm_tensor *y = tdm_batchnorm(tp, x, w, b, rm, rv, 0.25f, 1e-5f, NULL);
  CHECK(y != NULL);
  const float *px = tdm_tensor_data(x), *py = tdm_tensor_data(y), *pw = tdm_tensor_data(w), *pb = tdm_tensor_data(b);
  for (int c = 0; c < 3 && y; c++) {
    double s = 0, q = 0, ys = 0, yq = 0, M = 40;
    for (int n = 0; n < 4; n++)
      for (int i = 0; i < 10; i++) {
        double v = px[(n * 3 + c) * 10 + i], u = py[(n * 3 + c) * 10 + i];
        s += v, q += v * v, ys += u, yq += u * u;
      }
    double mean = s / M, var = q / M - mean * mean, ym = ys / M, yv = yq / M - ym * ym;
    CHECK_NEAR(ym, pb[c], 1e-5);
    CHECK_NEAR(sqrt(yv), fabs(pw[c]) * sqrt(var / (var + 1e-5)), 1e-5);
    CHECK_NEAR(((float *)tdm_tensor_data(rm))[c], 0.75 * 0.5 + 0.25 * mean, 1e-5);
    CHECK_NEAR(((float *)tdm_tensor_data(rv))[c], 0.75 * 2.0 + 0.25 * var * M / (M - 1), 1e-4);
  }
  tdm_tape_reset(tp);
  tdm_tape_set_training(tp, 0);
  float rm0 = ((float *)tdm_tensor_data(rm))[1], rv0 = ((float *)tdm_tensor_data(rv))[1];
  y = tdm_batchnorm(tp, x, w, b, rm, rv, 0.25f, 1e-5f, NULL);
  CHECK(y != NULL);
  if (y)
    CHECK_NEAR(((float *)tdm_tensor_data(y))[10 + 3], (px[10 + 3] - rm0) / sqrt(rv0 + 1e-5) * pw[1] + pb[1], 1e-5);
  CHECK(((float *)tdm_tensor_data(rm))[1] == rm0); /* evaluation leaves them alone */
  tdm_tensor_destroy(x), tdm_tensor_destroy(w), tdm_tensor_destroy(b), tdm_tensor_destroy(rm), tdm_tensor_destroy(rv);
  tdm_tape_destroy(tp);
}

/* The batch-norm kernels' per-channel sums (float lanes flushed into doubles) against sums in
 * double: plane sizes below, at and around the 32 lanes, with tails, and past a flush (1024
 * values); with and without a fused ReLU's mask; and the same bits on 1 and 3 threads. The
 * tolerance is float's rounding of partial sums of at most 1024 / 32 values, relative to the
 * sum of the terms' magnitudes. (The mask at the ReLU's threshold: bn_relu_mask_threshold.) */
static void test_bn_sums_kernels(void) {
  const int64_t hws[] = {1, 7, 31, 32, 33, 49, 196, 1030, 2500}, C = 3;
  for (size_t h = 0; h < sizeof hws / sizeof hws[0]; h++)
    for (int64_t N = 1; N <= 3; N += 2) {
      int64_t HW = hws[h], n = N * C * HW;
      float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n), *ry = malloc(sizeof(float) * n);
      float *dyp = malloc(sizeof(float) * n);
      float mean[3] = {0.3f, -0.2f, 0.1f}, rstd[3] = {1.5f, 0.7f, 1.1f}, w[3] = {0.9f, -1.3f, 0.7f}, b[3] = {0.2f, 0.1f, -0.3f};
      tdm_test_fill_normal(x, n, 90 + h, 1), tdm_test_fill_normal(dy, n, 91 + h, 1);
      for (int64_t i = 0; i < n; i++) x[i] += 2.0f; /* an offset: the squares' sum is not the variance's */
      tdm_k_bn_fwd(ry, x, w, b, mean, rstd, N, C, HW, 1); /* the forward's ReLU output: the mask */
      for (int64_t i = 0; i < n; i++) dyp[i] = ry[i] > 0 ? dy[i] : 0.0f;
      double got[2][6][3], ref[6][3], mag[6][3], masked[2][3];
      for (int t = 0; t < 2; t++) {
        CHECK_OK(tdm_set_num_threads(t ? 3 : 1));
        tdm_k_bn_sums(x, N, C, HW, got[t][0], got[t][1]);
        tdm_k_bn_bwd_sums(dy, x, w, b, mean, rstd, 1, N, C, HW, got[t][2], got[t][3]);
        tdm_k_bn_bwd_sums(dy, x, NULL, NULL, mean, rstd, 0, N, C, HW, got[t][4], got[t][5]);
      }
      CHECK_OK(tdm_set_num_threads(1));
      CHECK_MSG(!memcmp(got[0], got[1], sizeof got[0]), "HW %lld N %lld: the sums' bits depend on the thread count",
                (long long)HW, (long long)N);
      tdm_k_bn_bwd_sums(dyp, x, NULL, NULL, mean, rstd, 0, N, C, HW, masked[0], masked[1]);
      CHECK_MSG(!memcmp(masked[0], got[0][2], sizeof masked[0]) && !memcmp(masked[1], got[0][3], sizeof masked[1]),
                "HW %lld N %lld: the sums with the mask formed from x differ from those with the forward output's",
                (long long)HW, (long long)N);
      memset(ref, 0, sizeof ref), memset(mag, 0, sizeof mag);
      for (int64_t c = 0; c < C; c++)
        for (int64_t b = 0; b < N; b++)
          for (int64_t i = 0; i < HW; i++) {
            int64_t o = (b * C + c) * HW + i;
            double v = x[o], g = dyp[o], u = ((double)x[o] - mean[c]) * rstd[c];
            double terms[6] = {v, v * v, g, g * u, dy[o], dy[o] * u};
            for (int k = 0; k < 6; k++) ref[k][c] += terms[k], mag[k][c] += fabs(terms[k]);
          }
      for (int k = 0; k < 6; k++)
        for (int64_t c = 0; c < C; c++)
          CHECK_MSG(fabs(got[0][k][c] - ref[k][c]) <= 4e-6 * mag[k][c] + 1e-12,
                    "HW %lld N %lld: sum %d of channel %lld is %.9g, expected %.9g (terms' magnitudes %.3g)", (long long)HW,
                    (long long)N, k, (long long)c, got[0][k][c], ref[k][c], mag[k][c]);
      free(x), free(dy), free(ry), free(dyp);
    }
}

/* The backward forms a fused ReLU's mask again from x, w, b and the statistics: it must be the
 * forward output's, bit for bit, at the threshold too, where x sc + sh rounded as a multiply and
 * an add (not one FMA, as the forward may) comes out zero or of the other sign. Each of 64
 * channels' planes runs through 81 inputs, 40 ulps either side of its root (the kernel's own sh,
 * itself rounded, moves the root by a few): at about one input a root the two roundings part. The
 * backward's sums and its dx (fresh and added) against the same kernels given dy masked by the
 * forward's output. */
static void test_bn_relu_mask_threshold(void) {
  const int64_t N = 2, C = 64, HW = 81, n = N * C * HW; /* 81: a body of 64 lanes and a tail */
  float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  float *dyp = malloc(sizeof(float) * n), *dx[2] = {malloc(sizeof(float) * n), malloc(sizeof(float) * n)};
  float w[64], b[64], mean[64], rstd[64];
  double s[2][2][64];
  for (int64_t c = 0; c < C; c++) {
    mean[c] = 0.37f * (float)(c % 7) - 1.1f, rstd[c] = 0.5f + 0.031f * (float)c;
    w[c] = (c % 2 ? -1.0f : 1.0f) * (0.3f + 0.017f * (float)c), b[c] = 0.05f * (float)(c % 11) - 0.25f;
  }
  tdm_test_fill_normal(dy, n, 95, 1);
  for (int64_t i = 0; i < n; i++) {
    int64_t c = i / HW % C, k = i % HW - 40;
    float v = mean[c] - b[c] / (rstd[c] * w[c]);
    for (int64_t j = 0; j < llabs(k); j++) v = nextafterf(v, k > 0 ? INFINITY : -INFINITY);
    x[i] = v;
  }
  tdm_k_bn_fwd(y, x, w, b, mean, rstd, N, C, HW, 1);
  int64_t passed = 0;
  for (int64_t i = 0; i < n; i++) dyp[i] = y[i] > 0 ? dy[i] : 0.0f, passed += y[i] > 0;
  CHECK_MSG(passed > n / 4 && passed < n * 3 / 4, "%lld of %lld passed; expected about half", (long long)passed, (long long)n);
  tdm_k_bn_bwd_sums(dy, x, w, b, mean, rstd, 1, N, C, HW, s[0][0], s[0][1]);
  tdm_k_bn_bwd_sums(dyp, x, NULL, NULL, mean, rstd, 0, N, C, HW, s[1][0], s[1][1]);
  CHECK_MSG(!memcmp(s[0], s[1], sizeof s[0]), "the backward's sums with the mask formed from x differ from the forward's mask's");
  for (int add = 0; add < 2; add++) {
    for (int k = 0; k < 2; k++) {
      for (int64_t i = 0; i < n; i++) dx[k][i] = 0.25f * (float)(i % 5);
      (add ? tdm_k_bn_bwd_dx : tdm_k_bn_bwd_dx_set)(dx[k], k ? dyp : dy, x, w, b, mean, rstd, !k, s[0][0], s[0][1],
                                                  (double)(N * HW), N, C, HW);
    }
    int64_t first = -1;
    for (int64_t i = 0; i < n && first < 0; i++)
      if (memcmp(&dx[0][i], &dx[1][i], sizeof(float))) first = i;
    CHECK_MSG(first < 0, "dx (%s): value %lld (x %.9g, forward output %.9g) is %.9g with the mask formed from x, %.9g with "
              "the forward's", add ? "added" : "written", (long long)first, first < 0 ? 0.0 : (double)x[first],
              first < 0 ? 0.0 : (double)y[first], first < 0 ? 0.0 : (double)dx[0][first], first < 0 ? 0.0 : (double)dx[1][first]);
  }
  free(x), free(dy), free(y), free(dyp), free(dx[0]), free(dx[1]);
}

/* relu(bn(x)) fused equals the two ops bit for bit: the output, the running statistics, and the
 * gradients of x, weight and bias, when x's gradient is written fresh and when it is added to
 * (a second backward), in training and in evaluation. About half the outputs are zero (the
 * bias is centred on 0), so the mask matters. */
static void test_bn_relu_fused(void) {
  int64_t xs[4] = {3, 4, 5, 7}, cs[1] = {4};
  for (int train = 1; train >= 0; train--) {
    tdm_tensor *x[2], *w[2], *b[2], *rm[2], *rv[2], *gout = heap(4, xs, 59, 1, 0, 0);
    const float *out[2] = {NULL, NULL};
    tdm_tape *tp[2];
    for (int f = 0; f < 2; f++) { /* f = 0: tdm_relu(tdm_batchnorm(..)); 1: tdm_batchnorm_relu */
      x[f] = heap(4, xs, 51, 2.0f, 0.3f, 1), w[f] = heap(1, cs, 52, 0.5f, 1.0f, 1), b[f] = heap(1, cs, 53, 0.3f, 0, 1);
      rm[f] = heap(1, cs, 54, 0.2f, 0, 0), rv[f] = heap(1, cs, 55, 0.2f, 1.0f, 0);
      CHECK_OK(tdm_tape_create(&tp[f], 0));
      for (int pass = 0; pass < 2; pass++) { /* the second adds to x's gradient */
        tdm_tape_reset(tp[f]);
        tdm_tape_set_training(tp[f], train);
        tdm_tensor *y = f ? tdm_batchnorm_relu(tp[f], x[f], w[f], b[f], rm[f], rv[f], 0.1f, 1e-5f, NULL)
                          : tdm_relu(tp[f], tdm_batchnorm(tp[f], x[f], w[f], b[f], rm[f], rv[f], 0.1f, 1e-5f, NULL));
        CHECK(y != NULL);
        if (!y) break;
        CHECK_OK(tdm_backward_with(tp[f], y, gout));
        out[f] = tdm_tensor_data(y);
      }
    }
    char label[32];
    snprintf(label, sizeof label, "train %d", train);
    check_fused_outputs(out, tdm_tensor_numel(x[0]), label);
    tdm_tensor *pairs[][2] = {{tdm_tensor_grad(x[0]), tdm_tensor_grad(x[1])}, {tdm_tensor_grad(w[0]), tdm_tensor_grad(w[1])},
                              {tdm_tensor_grad(b[0]), tdm_tensor_grad(b[1])}, {rm[0], rm[1]}, {rv[0], rv[1]}};
    const char *what[] = {"x's gradient", "weight's gradient", "bias's gradient", "running mean", "running variance"};
    for (int k = 0; k < 5; k++)
      CHECK_MSG(same_bytes(pairs[k][0], pairs[k][1]), "%s: %s differs between the fused op and the two", label, what[k]);
    for (int f = 0; f < 2; f++) {
      tdm_tape_destroy(tp[f]);
      tdm_tensor_destroy(x[f]), tdm_tensor_destroy(w[f]), tdm_tensor_destroy(b[f]), tdm_tensor_destroy(rm[f]),
          tdm_tensor_destroy(rv[f]);
    }
    tdm_tensor_destroy(gout);
  }
}

/* relu(a + b) fused equals tdm_relu(tdm_add(a, b)) bit for bit: the output and both gradients,
 * a an activation (its gradient written fresh, then carried back through a scale) and b a leaf
 * (added to, over two backward passes); and where b broadcasts (the two ops run). */
static void test_add_relu_fused(void) {
  int64_t as[3] = {3, 4, 5}, bsame[3] = {3, 4, 5}, bcast[3] = {3, 1, 5};
  for (int k = 0; k < 2; k++) {
    int64_t *bs = k ? bcast : bsame;
    tdm_tensor *xa[2], *xb[2], *gout = heap(3, as, 69, 1, 0, 0);
    const float *out[2] = {NULL, NULL};
    tdm_tape *tp[2];
    for (int f = 0; f < 2; f++) {
      xa[f] = heap(3, as, 61, 1.0f, 0, 1), xb[f] = heap(3, bs, 62, 1.0f, 0, 1);
      CHECK_OK(tdm_tape_create(&tp[f], 0));
      for (int pass = 0; pass < 2; pass++) {
        tdm_tape_reset(tp[f]);
        tdm_tensor *a = tdm_scale(tp[f], xa[f], 1.5f);
        tdm_tensor *y = f ? tdm_add_relu(tp[f], a, xb[f]) : tdm_relu(tp[f], tdm_add(tp[f], a, xb[f]));
        CHECK(y != NULL);
        if (!y) break;
        CHECK_OK(tdm_backward_with(tp[f], y, gout));
        out[f] = tdm_tensor_data(y);
      }
    }
    char label[32];
    snprintf(label, sizeof label, "case %d", k);
    check_fused_outputs(out, tdm_tensor_numel(xa[0]), label);
    for (int t = 0; t < 2; t++) {
      tdm_tensor *g0 = tdm_tensor_grad(t ? xb[0] : xa[0]), *g1 = tdm_tensor_grad(t ? xb[1] : xa[1]);
      CHECK_MSG(same_bytes(g0, g1), "%s: %s's gradient differs between the fused op and the two", label, t ? "b" : "a");
    }
    for (int f = 0; f < 2; f++) tdm_tape_destroy(tp[f]), tdm_tensor_destroy(xa[f]), tdm_tensor_destroy(xb[f]);
    tdm_tensor_destroy(gout);
  }
}

/* relu(bn(x) + r) fused equals tdm_add_relu(tdm_batchnorm(x), r) bit for bit: the output, the
 * running statistics and the gradients of x, weight, bias and r, over two backward passes (the
 * second adds to every gradient), in training and in evaluation: r an activation (a scaled leaf),
 * r a leaf, x needing no gradient (only r's is formed), and r broadcasting (the two ops run);
 * planes of 35 values (32 lanes and a tail) and of 16 (a tail only). */
static void test_bn_add_relu_fused(void) {
  int64_t shapes[2][4] = {{3, 4, 5, 7}, {2, 4, 4, 4}}, cs[1] = {4};
  for (int sh = 0; sh < 2; sh++)
    for (int k = 0; k < 4; k++)
      for (int train = 1; train >= 0; train--) {
        int64_t *xs = shapes[sh], rb[4] = {xs[0], xs[1], 1, 1};
        tdm_tensor *x[2], *w[2], *b[2], *rm[2], *rv[2], *xr[2], *gout = heap(4, xs, 89, 1, 0, 0);
        const float *out[2] = {NULL, NULL};
        tdm_tape *tp[2];
        for (int f = 0; f < 2; f++) { /* f = 0: the two ops; 1: tdm_batchnorm_add_relu */
          x[f] = heap(4, xs, 81, 2.0f, 0.3f, k != 2), w[f] = heap(1, cs, 82, 0.5f, 1.0f, 1), b[f] = heap(1, cs, 83, 0.3f, 0, 1);
          rm[f] = heap(1, cs, 84, 0.2f, 0, 0), rv[f] = heap(1, cs, 85, 0.2f, 1.0f, 0);
          xr[f] = heap(4, k == 3 ? rb : xs, 86, 1.0f, 0, 1);
          CHECK_OK(tdm_tape_create(&tp[f], 0));
          for (int pass = 0; pass < 2; pass++) {
            tdm_tape_reset(tp[f]);
            tdm_tape_set_training(tp[f], train);
            tdm_tensor *r = k == 0 ? tdm_scale(tp[f], xr[f], 1.5f) : xr[f];
            tdm_tensor *y = f ? tdm_batchnorm_add_relu(tp[f], x[f], w[f], b[f], rm[f], rv[f], 0.1f, 1e-5f, NULL, r)
                              : tdm_add_relu(tp[f], tdm_batchnorm(tp[f], x[f], w[f], b[f], rm[f], rv[f], 0.1f, 1e-5f, NULL), r);
            CHECK(y != NULL);
            if (!y) break;
            CHECK_OK(tdm_backward_with(tp[f], y, gout));
            out[f] = tdm_tensor_data(y);
          }
        }
        char label[48];
        snprintf(label, sizeof label, "shape %d case %d train %d", sh, k, train);
        check_fused_outputs(out, tdm_tensor_numel(x[0]), label);
        tdm_tensor *pairs[][2] = {{tdm_tensor_grad(x[0]), tdm_tensor_grad(x[1])}, {tdm_tensor_grad(w[0]), tdm_tensor_grad(w[1])},
                                  {tdm_tensor_grad(b[0]), tdm_tensor_grad(b[1])}, {tdm_tensor_grad(xr[0]), tdm_tensor_grad(xr[1])},
                                  {rm[0], rm[1]}, {rv[0], rv[1]}};
        const char *what[] = {"x's gradient", "weight's gradient", "bias's gradient", "r's gradient", "running mean", "running variance"};
        for (int q = 0; q < 6; q++) {
          if (q == 0 && k == 2) { /* x needs none */
            CHECK_MSG(!pairs[q][0] && !pairs[q][1], "%s: x, needing no gradient, has one", label);
            continue;
          }
          CHECK_MSG(same_bytes(pairs[q][0], pairs[q][1]), "%s: %s differs between the fused op and the two", label, what[q]);
        }
        for (int f = 0; f < 2; f++) {
          tdm_tape_destroy(tp[f]);
          tdm_tensor_destroy(x[f]), tdm_tensor_destroy(w[f]), tdm_tensor_destroy(b[f]), tdm_tensor_destroy(rm[f]),
              tdm_tensor_destroy(rv[f]), tdm_tensor_destroy(xr[f]);
        }
        tdm_tensor_destroy(gout);
      }
}

/* The small CNN runs ReLU after its max-pool (src/nn/models.c): relu(maxpool(x)) must equal
 * maxpool(relu(x)) bit for bit, the output and x's gradient, with windows all negative, all zero,
 * mixed, and with ties (positive and zero) among their values. */
static void test_relu_pool_commute(void) {
  int64_t xs[4] = {2, 3, 6, 8};
  tdm_tensor *x[2], *gout;
  const float *out[2] = {NULL, NULL};
  tdm_tape *tp[2];
  int64_t gs[4] = {2, 3, 3, 4};
  gout = heap(4, gs, 71, 1.0f, 0, 0);
  for (int f = 0; f < 2; f++) {
    x[f] = heap(4, xs, 72, 1.0f, 0, 1);
    float *p = tdm_tensor_data(x[f]);
    for (int64_t i = 0; i < tdm_tensor_numel(x[f]); i++) {
      int64_t w = i / 16 % 4; /* runs of windows: as drawn, all negative, all zero, tied maxima */
      if (w == 1) p[i] = -fabsf(p[i]) - 0.5f;
      else if (w == 2) p[i] = i % 3 ? 0.0f : -p[i] * p[i];
      else if (w == 3) p[i] = i % 2 ? 0.75f : -0.25f;
    }
    CHECK_OK(tdm_tape_create(&tp[f], 0));
    tdm_tensor *y = f ? tdm_relu(tp[f], tdm_maxpool2d(tp[f], x[f], 2, 2, 0)) : tdm_maxpool2d(tp[f], tdm_relu(tp[f], x[f]), 2, 2, 0);
    CHECK(y != NULL);
    if (!y) continue;
    CHECK_OK(tdm_backward_with(tp[f], y, gout));
    out[f] = tdm_tensor_data(y);
  }
  int64_t n = 2 * 3 * 3 * 4, nx = tdm_tensor_numel(x[0]), passed = 0;
  for (int64_t i = 0; out[0] && i < n; i++) passed += out[0][i] > 0;
  CHECK_MSG(out[0] && out[1] && !memcmp(out[0], out[1], sizeof(float) * (size_t)n), "outputs differ");
  CHECK_MSG(passed > 0 && passed < n, "%lld of %lld windows positive; expected some of each", (long long)passed, (long long)n);
  tdm_tensor *g0 = tdm_tensor_grad(x[0]), *g1 = tdm_tensor_grad(x[1]);
  CHECK_MSG(g0 && g1 && !memcmp(tdm_tensor_data(g0), tdm_tensor_data(g1), sizeof(float) * (size_t)nx),
            "x's gradient differs between relu -> pool and pool -> relu");
  for (int f = 0; f < 2; f++) tdm_tape_destroy(tp[f]), tdm_tensor_destroy(x[f]);
  tdm_tensor_destroy(gout);
}

/* One value per channel in training is PyTorch's error; evaluation mode takes it; bad shapes. */
static void test_bn_bad_input(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t xs[4] = {1, 3, 1, 1}, cs[1] = {3}, c4[1] = {4};
  tdm_tensor *x = heap(4, xs, 41, 1, 0, 1), *w = heap(1, cs, 42, 1, 0, 1), *b = heap(1, cs, 43, 1, 0, 1);
  tdm_tensor *rm = heap(1, cs, 44, 0, 0, 0), *rv = heap(1, cs, 45, 0, 1, 0), *w4 = heap(1, c4, 46, 1, 0, 1);
  tdm_tape_set_training(tp, 1);
  CHECK(tdm_batchnorm(tp, x, w, b, rm, rv, 0.1f, 1e-5f, NULL) == NULL);
  CHECK_ERR_HAS("expected more than 1 value per channel when training, got input size (1, 3, 1, 1)");
  tdm_tape_reset(tp);
  tdm_tape_set_training(tp, 0);
  CHECK(tdm_batchnorm(tp, x, w, b, rm, rv, 0.1f, 1e-5f, NULL) != NULL);
  tdm_tape_reset(tp);
  CHECK(tdm_batchnorm(tp, x, w4, b, rm, rv, 0.1f, 1e-5f, NULL) == NULL);
  CHECK_ERR_HAS("weight (4) and bias (3) for input (1, 3, 1, 1); expected (3) each");
  tdm_tape_reset(tp);
  CHECK(tdm_batchnorm(tp, x, w, b, rm, NULL, 0.1f, 1e-5f, NULL) == NULL);
  CHECK_ERR_HAS("running mean without a running variance");
  tdm_tape_reset(tp);
  CHECK(tdm_batchnorm(tp, x, w, b, rm, rv, 0.1f, 0.0f, NULL) == NULL);
  CHECK_ERR_HAS("eps 0");
  tdm_tensor_destroy(x), tdm_tensor_destroy(w), tdm_tensor_destroy(b), tdm_tensor_destroy(rm), tdm_tensor_destroy(rv),
      tdm_tensor_destroy(w4);
  tdm_tape_destroy(tp);
}

/* ---- the model --------------------------------------------------------------------------------- */
static tdm_model_config tiny(const char *name, int64_t width) {
  tdm_model_config c;
  CHECK_OK(tdm_model_config_resnet(name, width, &c));
  c.height = c.width = 12;
  return c;
}

/* Parameter counts and names as torchvision's (closed form for the CIFAR-style resnet20 with 1x1
 * projection shortcuts), and bad configurations named. */
static void test_resnet_shapes(void) {
  tdm_model_config c;
  CHECK_OK(tdm_model_config_resnet("resnet20", 0, &c));
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &c, 1));
  if (m) {
    /* stem 9*16 + bn; per stage s (w = 16 << s): 3 blocks of 2 convs 9 w^2 (the first's input
     * w/2) + 2 bn; projections w/2 * w + bn in stages 2 and 3; fc 64*10 + 10; bn = 4 w */
    int64_t n = 9 * 16 + 4 * 16;
    for (int s = 0; s < 3; s++) {
      int64_t w = 16 << s, in = s ? w / 2 : w;
      n += 9 * in * w + 9 * w * w + 8 * w + 2 * (9 * w * w * 2 + 8 * w);
      if (s) n += in * w + 4 * w;
    }
    n += 64 * 10 + 10;
    CHECK_MSG(tdm_params_numel(tdm_model_params(m)) == n, "resnet20: %lld values; expected %lld",
              (long long)tdm_params_numel(tdm_model_params(m)), (long long)n);
    CHECK(tdm_params_find(tdm_model_params(m), "layer2.0.downsample.1.running_var") != NULL);
    CHECK(tdm_params_find(tdm_model_params(m), "layer3.2.bn2.weight") != NULL);
    CHECK(tdm_params_find(tdm_model_params(m), "layer1.0.downsample.0.weight") == NULL);
    tdm_model_destroy(m);
  }
  CHECK(tdm_model_config_resnet("resnet50", 0, &c) != TDM_OK);
  CHECK_ERR_HAS("config 'resnet50'; expected resnet20 or resnet18");
  c.n_stages = 5;
  CHECK(tdm_model_create(&m, &c, 1) != TDM_OK);
  CHECK_ERR_HAS("5 stages");
}

/* A steady-state training step (forward, backward, SGD) allocates nothing, with the batched
 * convolution's workspace and batch norm in it. */
static void test_resnet_steady_state(void) {
  tdm_model_config c = tiny("resnet18", 4);
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &c, 3));
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_SGD);
  oc.momentum = 0.9f, oc.nesterov = 1, oc.weight_decay = 5e-4f, oc.decay_matrices_only = 1;
  tdm_optim *opt;
  CHECK_OK(tdm_optim_create(&opt, &oc, tdm_model_params(m)));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  uint64_t before = 0;
  for (int step = 0; step < 6; step++) {
    if (step == 3) before = tdm__malloc_count();
    tdm_tape_reset(tp);
    tdm_tape_set_training(tp, 1);
    int64_t xs[4] = {4, 1, 12, 12}, ys[1] = {4};
    tdm_tensor *x = tdm_new(tp, TDM_F32, 4, xs), *y = tdm_zeros(tp, TDM_I32, 1, ys);
    if (x) tdm_test_fill_normal(tdm_tensor_data(x), tdm_tensor_numel(x), (uint64_t)step, 1);
    tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(m, tp, x), y, -100);
    tdm_params_zero_grad(tdm_model_params(m));
    CHECK_OK(tdm_backward(tp, loss));
    CHECK_OK(tdm_optim_step(opt, 0.05f));
  }
  CHECK_MSG(tdm__malloc_count() == before, "%llu allocations in 3 steady-state steps", (unsigned long long)(tdm__malloc_count() - before));
  /* running statistics: untouched by the optimizer (weight decay skips them), moved by forward */
  const float *rv = tdm_tensor_data(tdm_params_find(tdm_model_params(m), "bn1.running_var"));
  CHECK(rv[0] != 1.0f);
  tdm_tape_destroy(tp);
  tdm_optim_destroy(opt);
  tdm_model_destroy(m);
}

/* ---- synchronised batch norm over real ranks (the thread transport) ------------------------- */
#define SB 3  /* samples per rank */
#define SMAXR 4
typedef struct {
  int R, W;
  void *group;
  const float *x; /* the global batch */
  const int32_t *y;
  float *logits, *grads, *params; /* this rank's logits slice; its averaged gradients; its parameters after */
  int eval_calls_ok;
  int nosync; /* the control: per-rank statistics */
} sync_arg;

static tdm_model_config sync_cfg(void) { return tiny("resnet20", 3); }

static void *sync_rank(void *v) {
  sync_arg *a = v;
  tdm_comm_config cfg = {0};
  cfg.rank = a->R, cfg.size = a->W, cfg.transport = TDM_TRANSPORT_THREAD, cfg.thread_group = a->group, cfg.timeout_s = 60;
  tdm_comm_t comm = NULL;
  CHECK_OK(tdm_comm_create(&comm, &cfg));
  if (!comm) return NULL;
  tdm_model_config c = sync_cfg();
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &c, 9));
  if (!a->nosync) tdm_model_set_bn_sync(m, comm);
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_params *p = tdm_model_params(m);
  int64_t per = 144, P = tdm_params_numel(p);
  for (int step = 0; step < 2; step++) { /* two steps: the second starts from moved running statistics */
    tdm_tape_reset(tp);
    tdm_tape_set_training(tp, 1);
    int64_t xs[4] = {SB, 1, 12, 12}, ys[1] = {SB};
    tdm_tensor *x = tdm_from_data(tp, TDM_F32, 4, xs, a->x + (int64_t)a->R * SB * per);
    tdm_tensor *y = tdm_from_data(tp, TDM_I32, 1, ys, a->y + a->R * SB);
    tdm_tensor *logits = tdm_model_forward(m, tp, x);
    tdm_tensor *loss = tdm_cross_entropy(tp, logits, y, -100);
    tdm_params_zero_grad(p);
    CHECK_OK(tdm_backward(tp, loss));
    if (!logits) break;
    memcpy(a->logits, tdm_tensor_data(logits), sizeof(float) * SB * 10);
    /* data parallelism's average, in rank order */
    CHECK_OK(tdm_comm_allreduce(comm, tdm_params_grad(p), tdm_params_grad(p), (size_t)P, TDM_F32, TDM_AVG,
                                tdm_comm_rank_order_algo(comm)));
    memcpy(a->grads, tdm_params_grad(p), sizeof(float) * (size_t)P);
    float *w = tdm_params_data(p), *g = tdm_params_grad(p);
    for (int64_t i = 0; i < P; i++) w[i] -= 0.1f * g[i]; /* plain SGD: the running statistics have no gradient */
  }
  memcpy(a->params, tdm_params_data(p), sizeof(float) * (size_t)P);
  /* evaluation never communicates */
  uint64_t sent = tdm_comm_bytes_sent(comm);
  tdm_tape_reset(tp);
  tdm_tape_set_training(tp, 0);
  tdm_tape_set_grad_enabled(tp, 0);
  int64_t xs[4] = {2, 1, 12, 12};
  tdm_tensor *x = tdm_from_data(tp, TDM_F32, 4, xs, a->x);
  a->eval_calls_ok = tdm_model_forward(m, tp, x) != NULL && tdm_comm_bytes_sent(comm) == sent;
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
  tdm_comm_destroy(comm);
  return NULL;
}

/* N ranks of batch b with --sync-bn equal one process of batch N*b within 1e-5: logits, every
 * averaged gradient, and the parameters and running statistics after two steps, which are also
 * bit-identical on every rank; evaluation sends nothing. */
static void test_sync_bn_ranks(void) {
  tdm_model_config c = sync_cfg();
  tdm_model *m0;
  CHECK_OK(tdm_model_create(&m0, &c, 9));
  if (!m0) return;
  int64_t P = tdm_params_numel(tdm_model_params(m0));
  tdm_model_destroy(m0);
  for (int W = 1; W <= SMAXR + 1; W++) {
    int nosync = W == SMAXR + 1; /* last: 2 ranks without sync must differ (so the test can fail) */
    if (nosync) W = 2;
    int64_t per = 144;
    float *x = malloc(sizeof(float) * W * SB * per);
    int32_t y[SMAXR * SB];
    tdm_test_fill_normal(x, W * SB * per, 77, 1);
    for (int i = 0; i < W * SB; i++) y[i] = (i * 7) % 10;
    /* one process of the whole batch, as rank 0 of a world of one */
    float *ref_logits = malloc(sizeof(float) * W * SB * 10), *ref_grads = malloc(sizeof(float) * P), *ref_params = malloc(sizeof(float) * P);
    {
      tdm_model *m;
      CHECK_OK(tdm_model_create(&m, &c, 9));
      tdm_tape *tp;
      CHECK_OK(tdm_tape_create(&tp, 0));
      tdm_params *p = tdm_model_params(m);
      for (int step = 0; step < 2; step++) {
        tdm_tape_reset(tp);
        tdm_tape_set_training(tp, 1);
        int64_t xs[4] = {W * SB, 1, 12, 12}, ys[1] = {W * SB};
        tdm_tensor *logits = tdm_model_forward(m, tp, tdm_from_data(tp, TDM_F32, 4, xs, x));
        tdm_tensor *loss = tdm_cross_entropy(tp, logits, tdm_from_data(tp, TDM_I32, 1, ys, y), -100);
        tdm_params_zero_grad(p);
        CHECK_OK(tdm_backward(tp, loss));
        if (logits) memcpy(ref_logits, tdm_tensor_data(logits), sizeof(float) * W * SB * 10);
        memcpy(ref_grads, tdm_params_grad(p), sizeof(float) * (size_t)P);
        float *w = tdm_params_data(p), *g = tdm_params_grad(p);
        for (int64_t i = 0; i < P; i++) w[i] -= 0.1f * g[i];
      }
      memcpy(ref_params, tdm_params_data(p), sizeof(float) * (size_t)P);
      tdm_tape_destroy(tp);
      tdm_model_destroy(m);
    }
    void *g;
    CHECK_OK(tdm_comm_thread_group_create(&g, W));
    pthread_t th[SMAXR];
    sync_arg args[SMAXR];
    for (int r = 0; r < W; r++) {
      args[r] = (sync_arg){r, W, g, x, y, malloc(sizeof(float) * SB * 10), malloc(sizeof(float) * P), malloc(sizeof(float) * P), 0, nosync};
      pthread_create(&th[r], NULL, sync_rank, &args[r]);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    tdm_comm_thread_group_destroy(g);
    if (nosync) {
      double dl = tdm_test_max_abs_diff(args[0].logits, ref_logits, SB * 10);
      CHECK_MSG(dl > 1e-3, "2 ranks without sync differ from one process by only %g", dl);
      W = SMAXR + 1; /* back to the loop's end */
    }
    for (int r = 0; r < W && !nosync; r++) {
      double dl = tdm_test_max_abs_diff(args[r].logits, ref_logits + r * SB * 10, SB * 10), dg = tdm_test_max_abs_diff(args[r].grads, ref_grads, P),
             dp = tdm_test_max_abs_diff(args[r].params, ref_params, P);
      CHECK_MSG(dl <= 1e-5 && dg <= 1e-5 && dp <= 1e-5, "%d ranks, rank %d: logits differ by %g, gradients by %g, parameters by %g", W, r,
                dl, dg, dp);
      int64_t at = 0;
      while (at < P && args[r].params[at] == args[0].params[at]) at++;
      CHECK_MSG(at == P, "%d ranks: rank %d's parameters (running statistics included) differ from rank 0's at %lld: %.9g vs %.9g", W, r,
                (long long)at, at < P ? args[r].params[at] : 0, at < P ? args[0].params[at] : 0);
      CHECK_MSG(args[r].eval_calls_ok, "%d ranks, rank %d: evaluation failed or communicated", W, r);
    }
    for (int r = 0; r < (nosync ? 2 : W); r++) free(args[r].logits), free(args[r].grads), free(args[r].params);
    free(x), free(ref_logits), free(ref_grads), free(ref_params);
  }
}

/* ---- augmentation ------------------------------------------------------------------------------- */
/* Each image equals its draw applied by hand (pad with zeros, crop, flip); the draw depends on the
 * position alone (a batch at first == its images one by one); every shift and both flips occur. */
static void test_augment(void) {
  enum { C = 2, H = 5, W = 6, N = 4, PAD = 2 };
  float x[N * C * H * W], one[C * H * W], scratch[C * H * W];
  tdm_test_fill_normal(x, N * C * H * W, 91, 1);
  float orig[N * C * H * W];
  memcpy(orig, x, sizeof x);
  CHECK_OK(tdm_augment_images(x, N, C, H, W, PAD, 1, 7, 3, 10, scratch));
  for (int i = 0; i < N; i++) {
    int dy, dx, fl;
    tdm_augment_draw(7, 3, 10 + i, PAD, 1, &dy, &dx, &fl);
    float padded[C][H + 2 * PAD][W + 2 * PAD];
    memset(padded, 0, sizeof padded);
    for (int c = 0; c < C; c++)
      for (int yy = 0; yy < H; yy++)
        for (int xx = 0; xx < W; xx++) padded[c][yy + PAD][xx + PAD] = orig[((i * C + c) * H + yy) * W + xx];
    int bad = 0;
    for (int c = 0; c < C; c++)
      for (int yy = 0; yy < H; yy++)
        for (int xx = 0; xx < W; xx++) {
          float want = padded[c][yy + PAD + dy][(fl ? W - 1 - xx : xx) + PAD + dx];
          bad += x[((i * C + c) * H + yy) * W + xx] != want;
        }
    CHECK_MSG(!bad, "image %d (shift %d, %d, flip %d): %d values differ from the hand-made crop", i, dy, dx, fl, bad);
    memcpy(one, orig + i * C * H * W, sizeof one);
    CHECK_OK(tdm_augment_images(one, 1, C, H, W, PAD, 1, 7, 3, 10 + i, scratch));
    CHECK_MSG(!memcmp(one, x + i * C * H * W, sizeof one), "image %d alone differs from its place in the batch", i);
  }
  int seen_dy[2 * PAD + 1] = {0}, seen_dx[2 * PAD + 1] = {0}, flips = 0;
  for (int pos = 0; pos < 400; pos++) {
    int dy, dx, fl;
    tdm_augment_draw(7, 0, pos, PAD, 1, &dy, &dx, &fl);
    seen_dy[dy + PAD]++, seen_dx[dx + PAD]++, flips += fl;
  }
  for (int k = 0; k <= 2 * PAD; k++) CHECK_MSG(seen_dy[k] > 40 && seen_dx[k] > 40, "shift %d drawn %d / %d times in 400", k - PAD, seen_dy[k], seen_dx[k]);
  CHECK_MSG(flips > 150 && flips < 250, "%d flips in 400", flips);
  CHECK(tdm_augment_images(x, N, C, H, W, 7, 1, 7, 3, 10, scratch) != TDM_OK);
  CHECK_ERR_HAS("padding 7; expected padding 0..5");
}

/* ---- label smoothing ------------------------------------------------------------------------------ */
static tdm_tensor *g_ls(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  int32_t y[4] = {2, 0, -100, 4};
  int64_t ys[1] = {4};
  return tdm_cross_entropy_smooth(tp, x[0], tdm_from_data(tp, TDM_I32, 1, ys, y), -100, *(float *)c);
}

/* The loss against PyTorch's definition written out in double, eps 0 == tdm_cross_entropy, the
 * gradient against finite differences, a bad eps named. */
static void test_label_smoothing(void) {
  int64_t xs[2] = {4, 5};
  tdm_tensor *x = heap(2, xs, 51, 2, 0, 1);
  int32_t y[4] = {2, 0, -100, 4};
  float eps = 0.1f;
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t ys[1] = {4};
  tdm_tensor *l = tdm_cross_entropy_smooth(tp, x, tdm_from_data(tp, TDM_I32, 1, ys, y), -100, eps);
  const float *px = tdm_tensor_data(x);
  double want = 0;
  for (int i = 0; i < 4; i++) {
    if (y[i] == -100) continue;
    double m = -1e30, s = 0, sum_lp = 0;
    for (int c = 0; c < 5; c++) m = fmax(m, px[i * 5 + c]);
    for (int c = 0; c < 5; c++) s += exp(px[i * 5 + c] - m);
    double lse = m + log(s);
    for (int c = 0; c < 5; c++) sum_lp += px[i * 5 + c] - lse;
    want += -(1 - eps) * (px[i * 5 + y[i]] - lse) - eps * sum_lp / 5;
  }
  want /= 3;
  CHECK(l != NULL);
  if (l) CHECK_NEAR(*(float *)tdm_tensor_data(l), want, 1e-6);
  tdm_tensor *l0 = tdm_cross_entropy_smooth(tp, x, tdm_from_data(tp, TDM_I32, 1, ys, y), -100, 0.0f);
  tdm_tensor *lr = tdm_cross_entropy(tp, x, tdm_from_data(tp, TDM_I32, 1, ys, y), -100);
  if (l0 && lr) CHECK_NEAR(*(float *)tdm_tensor_data(l0), *(float *)tdm_tensor_data(lr), 1e-6);
  tdm_gradcheck_opts o = {1e-2, 1e-3, 1e-2};
  double err;
  CHECK_OK(tdm_gradcheck(g_ls, &eps, 1, &x, &o, &err));
  tdm_tape_reset(tp);
  CHECK(tdm_cross_entropy_smooth(tp, x, tdm_from_data(tp, TDM_I32, 1, ys, y), -100, 1.5f) == NULL);
  CHECK_ERR_HAS("label smoothing 1.5; expected 0 <= eps <= 1");
  tdm_tape_destroy(tp);
  tdm_tensor_destroy(x);
}

int main(void) {
  tdm_test_case cases[] = {
      {"conv_batched_matches_reference", test_conv_batched_matches_reference},
      {"conv_direct_threads_bitwise", test_conv_direct_threads_bitwise},
      {"winograd_dw_declines_large", test_winograd_dw_declines_large},
      {"bn_gradcheck", test_bn_gradcheck},
      {"bn_statistics", test_bn_statistics},
      {"bn_sums_kernels", test_bn_sums_kernels},
      {"bn_relu_mask_threshold", test_bn_relu_mask_threshold},
      {"relu_pool_commute", test_relu_pool_commute},
      {"bn_bad_input", test_bn_bad_input},
      {"bn_relu_fused", test_bn_relu_fused},
      {"add_relu_fused", test_add_relu_fused},
      {"bn_add_relu_fused", test_bn_add_relu_fused},
      {"resnet_shapes", test_resnet_shapes},
      {"resnet_steady_state", test_resnet_steady_state},
      {"sync_bn_ranks", test_sync_bn_ranks},
      {"augment", test_augment},
      {"label_smoothing", test_label_smoothing},
  };
  return tdm_test_main(cases, sizeof cases / sizeof cases[0]);
}
