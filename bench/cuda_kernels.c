/* The CUDA attention and AdamW kernels against their floors, on the GPU this runs on.
 *
 *   build/bench/cuda_kernels [B=16] [T=1024] [C=768] [NH=12]
 *
 * Attention (src/cuda/attention.cu: cuBLAS products + a masked softmax, the T x T probabilities
 * stored), forward and backward, fp32 and TF32 products: time, the causal FLOPs' rate (fwd 2 T^2 hs,
 * bwd 4 T^2 hs per head and sequence: the useful half of each product), the compute floor at the
 * H100 SXM's dense TF32 peak (494.7 TFLOP/s), the memory floor of a fused kernel that never stores
 * the probabilities (q, k, v in, out: 16 bytes per token and channel forward) and of this design
 * (the probabilities written by the product, read and written by the softmax, read by the next
 * product: 16 bytes per score forward, and about twice that backward). The fused flash kernel
 * (src/cuda/flash_attention.cu: bf16 tensor-core products, what --precision bf16 runs, bf16
 * output) against the dense bf16 peak (989.4 TFLOP/s) and the fused memory floor. AdamW: one fused pass over
 * 124M parameters against 28 bytes per parameter at the measured device copy bandwidth. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_kernels.h"
#include "tandem/cuda.h"
#include "tandem/tandem.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double med(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}
static void *dmalloc(size_t bytes) {
  void *p = NULL;
  if (tdm_cuda_malloc(&p, bytes, "the kernel bench") != TDM_OK) {
    fprintf(stderr, "%s\n", tdm_last_error());
    exit(1);
  }
  tdm_cuda_memset0(p, bytes);
  return p;
}

int main(int argc, char **argv) {
  int64_t B = argc > 1 ? atoll(argv[1]) : 16, T = argc > 2 ? atoll(argv[2]) : 1024, C = argc > 3 ? atoll(argv[3]) : 768,
          NH = argc > 4 ? atoll(argv[4]) : 12;
  if (tdm_cuda_init() != TDM_OK) {
    fprintf(stderr, "cuda_kernels: %s\n", tdm_last_error());
    return 1;
  }
  char dev[256];
  tdm_cuda_device_info(dev, sizeof dev, NULL, NULL);
  int64_t n = B * T * C, na = B * NH * T * T, hs = C / NH;
  /* copy bandwidth, bytes read + written */
  size_t cb = (size_t)1 << 30;
  void *ca = dmalloc(cb), *cbuf = dmalloc(cb);
  double t[9];
  for (int r = 0; r < 9; r++) {
    tdm_cuda_sync("bench");
    double t0 = tdm_time_now();
    tdm_cuda_copy(cbuf, ca, cb);
    tdm_cuda_sync("bench");
    t[r] = tdm_time_now() - t0;
  }
  double bw = 2.0 * (double)cb / med(t, 9);
  tdm_cuda_free(ca), tdm_cuda_free(cbuf);
  printf("# %s: device copy %.0f GB/s (read + write)\n", dev, bw * 1e-9);
  float *qkv = dmalloc((size_t)(3 * n) * 4), *out = dmalloc((size_t)n * 4), *qkvr = dmalloc((size_t)(3 * n) * 4),
        *att = dmalloc((size_t)na * 4), *y = dmalloc((size_t)n * 4), *dout = dmalloc((size_t)n * 4),
        *dqkv = dmalloc((size_t)(3 * n) * 4), *dqkvr = dmalloc((size_t)(3 * n) * 4), *datt = dmalloc((size_t)na * 4),
        *dy = dmalloc((size_t)n * 4);
  double fl_f = 2.0 * (double)(B * NH) * (double)(T * T) * (double)hs, fl_b = 2.0 * fl_f;
  double fused_f = 16.0 * (double)n, fused_b = 32.0 * (double)n; /* bytes: fwd q,k,v,out; bwd about twice */
  double ours_f = 16.0 * (double)na + fused_f, ours_b = 32.0 * (double)na + fused_b;
  for (int tf = 0; tf <= 1; tf++) {
    tdm_cuda_set_tf32(tf);
    double tfw[7], tbw[7];
    for (int r = 0; r < 9; r++) {
      tdm_cuda_sync("bench");
      double t0 = tdm_time_now();
      tdm_cu_attention_fwd(out, qkvr, att, y, qkv, NULL, B, T, C, NH);
      tdm_cuda_sync("attention forward");
      double t1 = tdm_time_now();
      tdm_cu_attention_bwd(dqkv, dqkvr, datt, dy, dout, qkvr, att, B, T, C, NH);
      tdm_cuda_sync("attention backward");
      double t2 = tdm_time_now();
      if (r >= 2) tfw[r - 2] = t1 - t0, tbw[r - 2] = t2 - t1;
    }
    double f = med(tfw, 7), b = med(tbw, 7);
    printf("attention B=%lld T=%lld C=%lld NH=%lld, %s products:\n", (long long)B, (long long)T, (long long)C, (long long)NH,
           tf ? "TF32" : "fp32");
    printf("  forward  %7.3f ms: %6.1f TFLOP/s causal; floors: compute (TF32 peak) %.3f ms, fused-kernel memory %.3f ms, "
           "this design's memory %.3f ms\n",
           f * 1e3, fl_f / f * 1e-12, fl_f / 494.7e12 * 1e3, fused_f / bw * 1e3, ours_f / bw * 1e3);
    printf("  backward %7.3f ms: %6.1f TFLOP/s causal; floors: compute (TF32 peak) %.3f ms, fused-kernel memory %.3f ms, "
           "this design's memory %.3f ms\n",
           b * 1e3, fl_b / b * 1e-12, fl_b / 494.7e12 * 1e3, fused_b / bw * 1e3, ours_b / bw * 1e3);
  }
  tdm_cuda_set_tf32(0);
  if (tdm_cu_flash_supported(hs, B * NH)) {
    float *lse = datt, *drow = datt + B * NH * T; /* datt is far larger than both */
    double tfw[7], tbw[7];
    for (int r = 0; r < 9; r++) {
      tdm_cuda_sync("bench");
      double t0 = tdm_time_now();
      tdm_cu_flash_attention_fwd(y, 1, lse, qkvr, B, T, C, NH);
      tdm_cuda_sync("flash forward");
      double t1 = tdm_time_now();
      tdm_cu_flash_attention_bwd(dqkv, drow, dout, y, 1, qkvr, lse, B, T, C, NH);
      tdm_cuda_sync("flash backward");
      double t2 = tdm_time_now();
      if (r >= 2) tfw[r - 2] = t1 - t0, tbw[r - 2] = t2 - t1;
    }
    double f = med(tfw, 7), b = med(tbw, 7);
    printf("flash attention B=%lld T=%lld C=%lld NH=%lld, bf16 tensor-core products (fused, no T x T in memory):\n",
           (long long)B, (long long)T, (long long)C, (long long)NH);
    printf("  forward  %7.3f ms: %6.1f TFLOP/s causal; floors: compute (bf16 peak 989.4) %.3f ms, fused memory %.3f ms\n",
           f * 1e3, fl_f / f * 1e-12, fl_f / 989.4e12 * 1e3, fused_f / bw * 1e3);
    printf("  backward %7.3f ms: %6.1f TFLOP/s causal (with the dQ atomics and D = rowsum(dO o O)); floors: compute %.3f ms, "
           "fused memory %.3f ms\n",
           b * 1e3, fl_b / b * 1e-12, fl_b / 989.4e12 * 1e3, fused_b / bw * 1e3);
  }
  float *bufs[] = {qkv, out, qkvr, att, y, dout, dqkv, dqkvr, datt, dy};
  for (int k = 0; k < 10; k++) tdm_cuda_free(bufs[k]);
  /* AdamW over GPT-2 small's parameter count */
  int64_t np = 124439808;
  float *w = dmalloc((size_t)np * 4), *g = dmalloc((size_t)np * 4), *m = dmalloc((size_t)np * 4), *v = dmalloc((size_t)np * 4);
  double ta[9];
  for (int r = 0; r < 9; r++) {
    tdm_cuda_sync("bench");
    double t0 = tdm_time_now();
    tdm_cu_adamw(w, m, v, g, np, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0.5f, 1.0f);
    tdm_cuda_sync("adamw");
    ta[r] = tdm_time_now() - t0;
  }
  double a = med(ta, 9);
  printf("AdamW, %lld parameters, one fused pass: %.3f ms, %.0f GB/s; floor (28 bytes per parameter at the copy "
         "bandwidth) %.3f ms: %.2fx\n",
         (long long)np, a * 1e3, 28.0 * (double)np / a * 1e-9, 28.0 * (double)np / bw * 1e3, a / (28.0 * (double)np / bw));
  tdm_cuda_free(w), tdm_cuda_free(g), tdm_cuda_free(m), tdm_cuda_free(v);
  return 0;
}
