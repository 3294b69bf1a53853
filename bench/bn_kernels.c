/* The batch-norm kernels at resnet20's shapes (batch 128; 16 channels at 28x28, 32 at 14x14, 64
 * at 7x7), on TANDEM_NUM_THREADS threads, else every core: milliseconds (best of 20 runs) and the
 * GB/s of the tensors each reads and writes. The statistics' sums and the backward's sums (with a
 * fused ReLU's mask) run in a fixed order of float lanes flushed into doubles (kernels_bn.c); the
 * forward (with ReLU) and the input gradient are one pass each.
 *
 *   build/bench/bn_kernels  -> one line per shape */
#include <stdio.h>
#include <stdlib.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

int main(void) {
  if (tdm_set_num_threads(0) != TDM_OK) return 1;
  const int64_t shapes[][2] = {{16, 784}, {32, 196}, {64, 49}};
  printf("%-18s %16s %16s %16s %16s   (ms, GB/s; %d threads)\n", "shape (N C HW)", "sums", "bwd sums", "forward+relu",
         "bwd dx", tdm_get_num_threads());
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    int64_t N = 128, C = shapes[k][0], HW = shapes[k][1], n = N * C * HW;
    float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * C), *b = malloc(sizeof(float) * C);
    float *mean = malloc(sizeof(float) * C), *rstd = malloc(sizeof(float) * C);
    double *s0 = malloc(sizeof(double) * C), *s1 = malloc(sizeof(double) * C);
    if (!x || !dy || !y || !w || !b || !mean || !rstd || !s0 || !s1) {
      fprintf(stderr, "bn_kernels: out of memory for %lld floats a tensor\n", (long long)n);
      return 1;
    }
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 13) * 0.1f - 0.5f, dy[i] = (float)(i % 7) * 0.1f - 0.3f;
    for (int64_t c = 0; c < C; c++) w[c] = 1.0f, b[c] = 0.1f, mean[c] = 0.1f, rstd[c] = 1.3f;
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < 20; r++) {
      double t[5];
      t[0] = tdm_time_now();
      tdm_k_bn_sums(x, N, C, HW, s0, s1);
      t[1] = tdm_time_now();
      tdm_k_bn_bwd_sums(dy, x, w, b, mean, rstd, 1, N, C, HW, s0, s1);
      t[2] = tdm_time_now();
      tdm_k_bn_fwd(y, x, w, b, mean, rstd, N, C, HW, 1);
      t[3] = tdm_time_now();
      tdm_k_bn_bwd_dx_set(y, dy, x, w, b, mean, rstd, 1, s0, s1, (double)(N * HW), N, C, HW);
      t[4] = tdm_time_now();
      for (int p = 0; p < 4; p++)
        if (t[p + 1] - t[p] < best[p]) best[p] = t[p + 1] - t[p];
    }
    const int tensors[4] = {1, 2, 2, 3}; /* read and written by each (the ReLU's mask is formed from x) */
    char name[48];
    snprintf(name, sizeof name, "%lld %lld %lld", (long long)N, (long long)C, (long long)HW);
    printf("%-18s", name);
    for (int p = 0; p < 4; p++) printf(" %7.3f %6.1f GB/s", best[p] * 1e3, tensors[p] * 4.0 * (double)n / best[p] / 1e9);
    printf("\n");
    free(x), free(dy), free(y), free(w), free(b), free(mean), free(rstd), free(s0), free(s1);
  }
  return 0;
}
