/* Single-threaded OpenBLAS sgemm throughput at the MLP's GEMM shapes and at 1024^3, so the
 * MLP benchmark can state the fraction of the GEMM peak that training reaches; the clock the
 * core really runs at, from a chain of dependent integer adds (one a cycle), since the MHz a VM
 * reports in /proc/cpuinfo is its base clock, not the boost the core runs at; and the core's FMA
 * peak, measured with independent 256- and 512-bit FMAs, since whether a core runs AVX-512 at
 * full width (two 512-bit FMAs a cycle) or split in halves (Zen 4) is not in any flag.
 * usage: sgemm_peak   -> prints {"sgemm_gflops": best of the shapes, "clock_ghz": measured,
 *                                "fma_gflops": the best FMA rate, "blas_core": OpenBLAS's kernels} */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "tandem/core.h"

void openblas_set_num_threads(int num_threads);

/* Cycles per second: 64 dependent adds a pass (x86-64: each waits for the last, one cycle apiece). */
static double clock_ghz(void) {
#if !defined(__x86_64__)
  return 0; /* not measured elsewhere: the caller falls back to /proc/cpuinfo */
#endif
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    unsigned long x = 0;
    const long passes = 2000000;
    double t0 = tdm_time_now();
    for (long i = 0; i < passes; i++) {
#if defined(__x86_64__)
      __asm__ volatile(".rept 64\n\tadd $1, %0\n\t.endr" : "+r"(x));
#endif
    }
    double ghz = 64.0 * passes / (tdm_time_now() - t0) / 1e9;
    if (ghz > best) best = ghz;
  }
  return best;
}

int main(void) {
  openblas_set_num_threads(1);
  int shapes[][3] = {{256, 512, 784}, {512, 784, 256}, {1024, 1024, 1024}};
  double best = 0;
  for (int s = 0; s < 3; s++) {
    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *a = calloc((size_t)M * K, 4), *b = calloc((size_t)K * N, 4), *c = calloc((size_t)M * N, 4);
    for (int i = 0; i < M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < K * N; i++) b[i] = (float)(i % 5) * 0.1f;
    double t_best = 1e9;
    for (int rep = 0; rep < 7; rep++) {
      double t0 = tdm_time_now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
      double t = tdm_time_now() - t0;
      if (t < t_best) t_best = t;
    }
    double gf = 2.0 * M * N * K / t_best / 1e9;
    if (gf > best) best = gf;
    free(a);
    free(b);
    free(c);
  }
  printf("{\"sgemm_gflops\": %.1f, \"clock_ghz\": %.2f, \"fma_gflops\": %.1f, \"blas_core\": \"%s\"}\n", best,
         clock_ghz(), tdm_fma_peak_gflops(), tdm_blas_core());
  return 0;
}
