/* Matrix products through OpenBLAS, and the fused linear layer built on them. */
#include <cblas.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

void tdm_k_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { /* BLAS would not touch C when K == 0 with some builds; define it */
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
              alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void tdm_k_linear_fwd(float *out, const float *x, const float *w, const float *b, int64_t N, int64_t In, int64_t O) {
  float beta = 0.0f;
  if (b) { /* seed every row with the bias and let the GEMM add onto it */
    for (int64_t n = 0; n < N; n++) memcpy(out + n * O, b, (size_t)O * sizeof(float));
    beta = 1.0f;
  }
  tdm_k_gemm(0, 1, N, O, In, 1.0f, x, In, w, In, beta, out, O);
}

typedef struct {
  float *db;
  const float *dout;
  int64_t N, O;
} colsum_ctx;

/* db += column sums of dout over a block of columns; rows in order, so thread-count independent */
static void colsum_range(void *vc, int64_t o0, int64_t o1) {
  colsum_ctx *c = vc;
  for (int64_t n = 0; n < c->N; n++) {
    const float *d = c->dout + n * c->O;
    for (int64_t o = o0; o < o1; o++) c->db[o] += d[o];
  }
}

void tdm_k_linear_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int64_t N,
                      int64_t In, int64_t O) {
  if (dx) tdm_k_gemm(0, 0, N, In, O, 1.0f, dout, O, w, In, 1.0f, dx, In);
  if (dw) tdm_k_gemm(1, 0, O, In, N, 1.0f, dout, O, x, In, 1.0f, dw, In);
  if (db) {
    colsum_ctx c = {db, dout, N, O};
    tdm_parallel_for(O, 64, colsum_range, &c);
  }
}
