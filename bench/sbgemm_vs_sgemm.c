/* A bf16 product on this CPU: OpenBLAS's cblas_sbgemm (bf16 inputs, f32 accumulation) against
 * what tandem's ops do under --precision bf16 (the activation widened to f32, the f32 weight
 * rounded to bf16 precision, cblas_sgemm), at GPT mini's and llama-mini's linear shapes with
 * B x T = 2048 tokens, one thread, alternately, medians of 9. Each side includes its conversions.
 * cblas_sbgemm is looked up at run time: OpenBLAS builds without BUILD_BFLOAT16 (Debian 12's
 * 0.3.21) do not have it, and then only the f32 path is timed.
 * usage: build/bench/sbgemm_vs_sgemm   -> a table; ratio > 1: sbgemm slower */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

void openblas_set_num_threads(int num_threads);

static int cmp(const void *a, const void *b) { return *(const double *)a < *(const double *)b ? -1 : *(const double *)a > *(const double *)b; }

typedef void (*sbgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                          const uint16_t *, blasint, const uint16_t *, blasint, float, float *, blasint);

int main(void) {
  openblas_set_num_threads(1);
  sbgemm_fn sbgemm = (sbgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sbgemm");
  if (!sbgemm) printf("# this OpenBLAS has no cblas_sbgemm (built without BUILD_BFLOAT16): the f32 path alone\n");
  /* tokens x in -> out: qkv, attention proj, MLP up, MLP down (GPT mini); SwiGLU gate/up, down (llama-mini) */
  int shapes[][3] = {{2048, 256, 768}, {2048, 256, 256}, {2048, 256, 1024}, {2048, 1024, 256}, {2048, 256, 688}, {2048, 688, 256}};
  printf("%-20s %12s %12s %8s\n", "M x K -> N", "f32 path ms", "sbgemm ms", "ratio");
  for (int s = 0; s < 6; s++) {
    int M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
    float *x = malloc(sizeof(float) * (size_t)M * K), *w = malloc(sizeof(float) * (size_t)N * K), *c = malloc(sizeof(float) * (size_t)M * N);
    float *xf = malloc(sizeof(float) * (size_t)M * K), *wr = malloc(sizeof(float) * (size_t)N * K);
    uint16_t *xb = malloc(2 * (size_t)M * K), *wb = malloc(2 * (size_t)N * K);
    for (int64_t i = 0; i < (int64_t)M * K; i++) x[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    for (int64_t i = 0; i < (int64_t)N * K; i++) w[i] = (float)((i * 104729) % 2001 - 1000) * 1e-4f;
    tdm_k_f32_to_bf16(xb, x, (int64_t)M * K); /* the stored activation */
    double a[9], b[9];
    for (int r = 0; r < 9; r++) {
      double t0 = tdm_time_now();
      tdm_k_bf16_to_f32(xf, xb, (int64_t)M * K);
      tdm_k_round_bf16(wr, w, (int64_t)N * K);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, xf, K, wr, K, 0.0f, c, N);
      double t1 = tdm_time_now();
      if (sbgemm) {
        tdm_k_f32_to_bf16(wb, w, (int64_t)N * K);
        sbgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, xb, K, wb, K, 0.0f, c, N);
      }
      double t2 = tdm_time_now();
      a[r] = (t1 - t0) * 1e3, b[r] = (t2 - t1) * 1e3;
    }
    qsort(a, 9, sizeof a[0], cmp);
    qsort(b, 9, sizeof b[0], cmp);
    char name[32];
    snprintf(name, sizeof name, "%d x %d -> %d", M, K, N);
    if (sbgemm) printf("%-20s %12.2f %12.2f %7.2fx\n", name, a[4], b[4], b[4] / a[4]);
    else printf("%-20s %12.2f %12s %8s  (%.1f GFLOP/s)\n", name, a[4], "-", "-", 2.0 * M * N * K / a[4] * 1e-6);
    free(x), free(w), free(c), free(xf), free(wr), free(xb), free(wb);
  }
  return 0;
}
