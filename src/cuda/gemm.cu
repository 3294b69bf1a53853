// Matrix products through cuBLAS, row-major: C = op(A) op(B) is C^T = op(B)^T op(A)^T in cuBLAS's
// column-major terms, so the operands swap and nothing is transposed in memory.
// cuBLAS is loaded with dlopen at the first use, not linked: loading libcublas and libcublasLt
// (0.6 GB) costs every process about 1.5 s at start, which every tandem command (and each of the
// hundreds a test suite starts) would pay whether it touches a GPU or not.
#include <cublas_v2.h>
#include <dlfcn.h>
#include <stdio.h>

#include "cu_common.cuh"

#define STR_(x) #x
#define STR(x) STR_(x)

static cublasHandle_t handle;
static int tf32;
static void *lib;
static char load_error[512];
static cublasStatus_t (*p_create)(cublasHandle_t *);
static cublasStatus_t (*p_destroy)(cublasHandle_t);
static cublasStatus_t (*p_gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                                const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                                cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static cublasStatus_t (*p_gemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                                        const void *, cudaDataType, int, long long, const void *, cudaDataType, int,
                                        long long, const void *, void *, cudaDataType, int, long long, int,
                                        cublasComputeType_t, cublasGemmAlgo_t);

static int load(void) {
  if (lib) return 0;
  const char *names[] = {
#ifdef TDM_CUBLAS_PATH
      TDM_CUBLAS_PATH, // the toolkit's, found by CMake
#endif
      "libcublas.so." STR(CUBLAS_VER_MAJOR), "libcublas.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_error, sizeof load_error, "cannot load libcublas.so.%d: %s", CUBLAS_VER_MAJOR, dlerror());
    return -1;
  }
  *(void **)&p_create = dlsym(lib, "cublasCreate_v2");
  *(void **)&p_destroy = dlsym(lib, "cublasDestroy_v2");
  *(void **)&p_gemm = dlsym(lib, "cublasGemmEx");
  *(void **)&p_gemm_batched = dlsym(lib, "cublasGemmStridedBatchedEx");
  if (!p_create || !p_destroy || !p_gemm || !p_gemm_batched) {
    snprintf(load_error, sizeof load_error, "libcublas lacks cublasCreate_v2, cublasGemmEx or cublasGemmStridedBatchedEx");
    dlclose(lib);
    lib = NULL;
    return -1;
  }
  return 0;
}

extern "C" const char *tdm_cu_blas_load_error(void) { return load_error; }

extern "C" int tdm_cu_blas_init(void) {
  if (handle) return 0;
  if (load()) return -1;
  cublasStatus_t s = p_create(&handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    handle = NULL;
    snprintf(load_error, sizeof load_error, "cublasCreate failed (status %d)", (int)s);
    return (int)s;
  }
  return 0;
}

extern "C" void tdm_cu_blas_shutdown(void) {
  if (handle) p_destroy(handle);
  handle = NULL;
}

extern "C" void tdm_cu_gemm_set_tf32(int on) { tf32 = on; }

static cublasComputeType_t compute(int dtype) {
  return dtype == TDM_CU_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

extern "C" int tdm_cu_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int64_t lda,
                           const void *B, int64_t ldb, float beta, void *C, int64_t ldc, int dtype, int c_bf16) {
  cudaDataType_t ab = dtype == TDM_CU_BF16 ? CUDA_R_16BF : CUDA_R_32F, c = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  if (!handle) return (int)CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t s = p_gemm(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M,
                                  (int)K, &alpha, B, ab, (int)ldb, A, ab, (int)lda, &beta, C, c, (int)ldc, compute(dtype),
                                  CUBLAS_GEMM_DEFAULT);
  return (int)s;
}

extern "C" int tdm_cu_gemm_batched(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                                   int64_t lda, int64_t sA, const void *B, int64_t ldb, int64_t sB, float beta, void *C,
                                   int64_t ldc, int64_t sC, int64_t batch, int dtype, int c_bf16) {
  cudaDataType_t ab = dtype == TDM_CU_BF16 ? CUDA_R_16BF : CUDA_R_32F, c = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  if (!handle) return (int)CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t s = p_gemm_batched(handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                (int)N, (int)M, (int)K, &alpha, B, ab, (int)ldb, sB, A, ab, (int)lda, sA,
                                                &beta, C, c, (int)ldc, sC, (int)batch, compute(dtype), CUBLAS_GEMM_DEFAULT);
  return (int)s;
}
