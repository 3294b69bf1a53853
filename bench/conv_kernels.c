/* GFLOP/s of conv2d's kernels at resnet20's and the small CNN's shapes (batch 128, on
 * TANDEM_NUM_THREADS threads, else every core): the forward, the input gradient and the weight
 * gradient of the direct kernels (the CPU's set, or TANDEM_CONV=avx2|avx512; kernels_conv_direct.c),
 * with Winograd F(4x4, 3x3) (TANDEM_WINOGRAD=2x2: F(2x2, 3x3)) and F(2x2, 5x5) where it fits ("+wino": the direct convolution's flop over its
 * time, so the three rows compare as speeds), without it, and
 * of the batched im2col + GEMM path
 * they replace, each the best of 5 runs, with the share of the FMA peak it reaches (pass the
 * peak in GFLOP/s per core, as bench/sgemm_peak measures it).
 *
 *   build/bench/conv_kernels [FMA_GFLOPS]  -> one line per shape and path */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

static double best_of(int reps, void (*fn)(void *), void *ctx) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = tdm_time_now();
    fn(ctx);
    double t = tdm_time_now() - t0;
    if (t < best) best = t;
  }
  return best;
}

typedef struct {
  tdm_conv_shape s;
  float *x, *w, *y, *dy, *dx, *dw, *ws;
  int direct, part; /* part 0: forward, 1: input gradient, 2: weight gradient */
} job;

static void run(void *v) {
  job *j = v;
  if (j->direct) {
    if (j->part == 0) tdm_k_conv2d_fwd_direct(j->y, j->x, j->w, NULL, j->ws, &j->s);
    else if (j->part == 1) tdm_k_conv2d_bwd_direct(j->dx, 1, NULL, NULL, j->dy, j->x, j->w, j->ws, &j->s);
    else tdm_k_conv2d_bwd_direct(NULL, 0, j->dw, NULL, j->dy, j->x, j->w, j->ws, &j->s);
  } else {
    if (j->part == 0) tdm_k_conv2d_fwd_batched(j->y, j->x, j->w, NULL, j->ws, &j->s);
    else if (j->part == 1) tdm_k_conv2d_bwd_batched(j->dx, 1, NULL, NULL, j->dy, j->x, j->w, j->ws, &j->s);
    else tdm_k_conv2d_bwd_batched(NULL, 0, j->dw, NULL, j->dy, j->x, j->w, j->ws, &j->s);
  }
}

int main(int argc, char **argv) {
  double peak = argc > 1 ? atof(argv[1]) : 0;
  if (tdm_set_num_threads(0) != TDM_OK) return 1;
  int wino_before = tdm_k_conv2d_winograd_enable(1);
  const int64_t shapes[][5] = {{16, 28, 16, 3, 1}, {32, 14, 32, 3, 1}, {64, 7, 64, 3, 1}, {16, 28, 32, 3, 2}, {32, 14, 64, 3, 2},
                               {1, 28, 16, 3, 1},  {1, 28, 16, 5, 1},  {16, 14, 32, 5, 1}}; /* Ci, H = W, Co, K, stride */
  printf("%-26s %-11s %10s %10s %10s   (GFLOP/s; %% of %.0f GFLOP/s x %d threads)\n", "shape (N Ci HxW Co KxK)", "path",
         "forward", "dx", "dw", peak, tdm_get_num_threads());
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    int64_t K = shapes[k][3], S = shapes[k][4], O = (shapes[k][1] + 2 * (K / 2) - K) / S + 1;
    tdm_conv_shape s = {128, shapes[k][0], shapes[k][1], shapes[k][1], shapes[k][2], K, K, S, K / 2, O, O};
    int64_t nx = s.N * s.Ci * s.H * s.W, ny = s.N * s.Co * s.OH * s.OW, nw = s.Co * s.Ci * K * K;
    double flop = 2.0 * (double)ny * (double)(s.Ci * K * K);
    for (int path = 0; path < 3; path++) { /* Winograd (where it fits), direct, im2col + GEMM */
      int direct = path < 2;
      tdm_k_conv2d_direct_enable(1);
      tdm_k_conv2d_winograd_enable(path == 0);
      if (direct && !tdm_k_conv2d_direct_fits(&s)) continue;
      if (path == 0 && !tdm_k_conv2d_winograd_on(&s)) continue;
      job j = {s, calloc(nx, 4), calloc(nw, 4), calloc(ny, 4), calloc(ny, 4), calloc(nx, 4), calloc(nw, 4), NULL, direct, 0};
      tdm_k_conv2d_direct_enable(direct);
      j.ws = calloc((size_t)tdm_k_conv2d_ws_floats(&s) + 64, 4); /* the path just chosen's workspace */
      for (int64_t i = 0; i < nx; i++) j.x[i] = (float)(i % 13) * 0.01f;
      for (int64_t i = 0; i < ny; i++) j.dy[i] = (float)(i % 7) * 0.01f;
      for (int64_t i = 0; i < nw; i++) j.w[i] = (float)(i % 5) * 0.01f;
      double gf[3];
      for (int p = 0; p < 3; p++) {
        j.part = p;
        gf[p] = flop / best_of(5, run, &j) / 1e9;
      }
      char name[64];
      snprintf(name, sizeof name, "%d %lld %lldx%lld %lld %lldx%lld%s", 128, (long long)s.Ci, (long long)s.H, (long long)s.W,
               (long long)s.Co, (long long)K, (long long)K, S == 2 ? " /2" : "");
      char pname[32];
      snprintf(pname, sizeof pname, "%s%s", direct ? tdm_k_conv2d_direct_isa() : "im2col", path == 0 ? "+wino" : "");
      printf("%-26s %-11s", name, pname);
      for (int p = 0; p < 3; p++) {
        if (peak > 0) printf(" %5.0f (%2.0f%%)", gf[p], 100 * gf[p] / (peak * tdm_get_num_threads()));
        else printf(" %10.1f", gf[p]);
      }
      printf("\n");
      free(j.x), free(j.w), free(j.y), free(j.dy), free(j.dx), free(j.dw), free(j.ws);
    }
  }
  tdm_k_conv2d_winograd_enable(wino_before);
  return 0;
}
