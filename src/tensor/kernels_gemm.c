/* Matrix products through OpenBLAS, and the fused linear layer built on them. */
#include <cblas.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

typedef struct {
  int ta, tb;
  int64_t M, N, K, lda, ldb, ldc, split_m, block, len; /* len: M or N, whichever is split */
  float alpha, beta;
  const float *A, *B;
  float *C;
} gemm_ctx;

/* Blocks [b0, b1) of rows (split_m) or columns of C, each one single-threaded OpenBLAS call. */
static void gemm_blocks(void *vc, int64_t b0, int64_t b1) {
  gemm_ctx *g = vc;
  int64_t lo = b0 * g->block, hi = b1 * g->block < g->len ? b1 * g->block : g->len;
  if (hi <= lo) return;
  const float *A = g->A, *B = g->B;
  float *C = g->C;
  int64_t M = g->M, N = g->N;
  if (g->split_m) {
    A += g->ta ? lo : lo * g->lda;
    C += lo * g->ldc;
    M = hi - lo;
  } else {
    B += g->tb ? lo * g->ldb : lo;
    C += lo;
    N = hi - lo;
  }
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
              (int)g->K, g->alpha, A, (int)g->lda, B, (int)g->ldb, g->beta, C, (int)g->ldc);
}

void tdm_k_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { /* BLAS would not touch C when K == 0 with some builds; define it */
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  /* Large products are split over the intra-op pool along the longer side of C, in blocks that
   * are multiples of 16 rows or columns; every element of C is still one call's full sum over K
   * (never split K: that would change the summation). The blocks' sizes can steer OpenBLAS to
   * another kernel, so bits may differ between thread counts, never between runs. */
  int nt = tdm_get_num_threads();
  if (nt > 1 && (double)M * (double)N * (double)K >= (double)(1 << 20)) {
    int split_m = M >= N;
    int64_t len = split_m ? M : N, block = ((len + nt - 1) / nt + 15) / 16 * 16;
    if (len >= 128) {
      gemm_ctx g = {ta, tb, M, N, K, lda, ldb, ldc, split_m, block, len, alpha, beta, A, B, C};
      tdm_parallel_for((len + block - 1) / block, 1, gemm_blocks, &g);
      return;
    }
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
