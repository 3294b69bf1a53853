// Matrix products through cuBLAS, row-major: C = op(A) op(B) is C^T = op(B)^T op(A)^T in cuBLAS's
// column-major terms, so the operands swap and nothing is transposed in memory.
#include <cublas_v2.h>

#include "cu_common.cuh"

static cublasHandle_t handle;
static int tf32;

extern "C" int tdm_cu_blas_init(void) {
  if (handle) return 0;
  cublasStatus_t s = cublasCreate(&handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    handle = NULL;
    return (int)s;
  }
  return 0;
}

extern "C" void tdm_cu_blas_shutdown(void) {
  if (handle) cublasDestroy(handle);
  handle = NULL;
}

extern "C" void tdm_cu_gemm_set_tf32(int on) { tf32 = on; }

static cublasComputeType_t compute(int dtype) {
  return dtype == TDM_CU_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

extern "C" int tdm_cu_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                           const void *B, int64_t ldb, float beta, void *C, int64_t ldc, int dtype, int c_bf16) {
  cudaDataType_t ab = dtype == TDM_CU_BF16 ? CUDA_R_16BF : CUDA_R_32F, c = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t s = cublasGemmEx(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                                  (int)K, &alpha, B, ab, (int)ldb, A, ab, (int)lda, &beta, C, c, (int)ldc, compute(dtype),
                                  CUBLAS_GEMM_DEFAULT);
  return (int)s;
}

extern "C" int tdm_cu_gemm_batched(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                                   int64_t lda, int64_t sA, const void *B, int64_t ldb, int64_t sB, float beta, void *C,
                                   int64_t ldc, int64_t sC, int64_t batch, int dtype, int c_bf16) {
  cudaDataType_t ab = dtype == TDM_CU_BF16 ? CUDA_R_16BF : CUDA_R_32F, c = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t s = cublasGemmStridedBatchedEx(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                (int)N, (int)M, (int)K, &alpha, B, ab, (int)ldb, sB, A, ab, (int)lda, sA,
                                                &beta, C, c, (int)ldc, sC, (int)batch, compute(dtype), CUBLAS_GEMM_DEFAULT);
  return (int)s;
}
