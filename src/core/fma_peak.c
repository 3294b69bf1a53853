/* The FMA peak of one core, measured: independent 256- and 512-bit FMAs on registers, the best
 * rate of the two. Whether a core runs AVX-512 at full width (two 512-bit FMAs a cycle: 64 flop)
 * or split in halves (Zen 4: 32) is in no CPUID flag, and a VM reports its base clock, not the
 * one the core runs at; so benchmarks state shares of this rather than of a guess. */
#include "core/internal.h"
#include "tandem/core.h"

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

static double measure(void) {
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

double tdm_fma_peak_gflops(void) {
  static double peak = -1; /* measured once per process (about 0.1 s) */
  if (peak < 0) peak = measure();
  return peak;
}
