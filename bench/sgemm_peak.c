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

#if defined(__x86_64__) && defined(__GNUC__)
/* 12 independent FMAs on registers 0-11 (latency 4, two units: 8 in flight keep them busy). */
#define FMA12(r)                                                                                  \
  "vfmadd231ps %%" r "13, %%" r "14, %%" r "0\n\tvfmadd231ps %%" r "13, %%" r "14, %%" r "1\n\t"       \
  "vfmadd231ps %%" r "13, %%" r "14, %%" r "2\n\tvfmadd231ps %%" r "13, %%" r "14, %%" r "3\n\t"       \
  "vfmadd231ps %%" r "13, %%" r "14, %%" r "4\n\tvfmadd231ps %%" r "13, %%" r "14, %%" r "5\n\t"       \
  "vfmadd231ps %%" r "13, %%" r "14, %%" r "6\n\tvfmadd231ps %%" r "13, %%" r "14, %%" r "7\n\t"       \
  "vfmadd231ps %%" r "13, %%" r "14, %%" r "8\n\tvfmadd231ps %%" r "13, %%" r "14, %%" r "9\n\t"       \
  "vfmadd231ps %%" r "13, %%" r "14, %%" r "10\n\tvfmadd231ps %%" r "13, %%" r "14, %%" r "11\n\t"
/* GFLOP/s of `lanes`-float FMAs (8: AVX2 ymm, 16: AVX-512 zmm), best of 5 runs. */
#define FMA_LOOP(name, attr, r, lanes)                                                           \
  __attribute__((target(attr))) static double name(void) {                                      \
    double best = 0;                                                                             \
    for (int rep = 0; rep < 5; rep++) {                                                          \
      long n = 2000000;                                                                          \
      double t0 = tdm_time_now();                                                                \
      __asm__ volatile("vxorps %%" r "13, %%" r "13, %%" r "13\n\tvxorps %%" r "14, %%" r "14, %%" r "14\n" \
                       "1:\n\t" FMA12(r) FMA12(r) "dec %0\n\tjnz 1b"                             \
                       : "+r"(n)                                                                 \
                       :                                                                         \
                       : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",  \
                         "xmm9", "xmm10", "xmm11", "xmm13", "xmm14", "cc");                      \
      double gf = 2.0 * 24 * (lanes) * 2000000 / (tdm_time_now() - t0) / 1e9;                  \
      if (gf > best) best = gf;                                                                  \
    }                                                                                            \
    __asm__ volatile("vzeroupper");                                                              \
    return best;                                                                                 \
  }
FMA_LOOP(fma_avx2, "avx2,fma", "ymm", 8)
FMA_LOOP(fma_avx512, "avx512f", "zmm", 16)
#endif

static double fma_gflops(void) {
  double best = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = fma_avx2();
  if (__builtin_cpu_supports("avx512f")) {
    double z = fma_avx512();
    if (z > best) best = z;
  }
#endif
  return best; /* 0: not measured here */
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
         clock_ghz(), fma_gflops(), tdm_blas_core());
  return 0;
}
