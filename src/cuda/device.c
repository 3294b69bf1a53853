/* The CUDA backend's host side: the device, its memory and copies (include/tandem/cuda.h). */
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#include <stdio.h>

#include "core/internal.h"
#include "cuda/cuda_kernels.h"
#include "tandem/cuda.h"

static int ready;

int tdm_cuda_built(void) { return 1; }

tdm_status tdm_cuda_init(void) {
  if (ready) return TDM_OK;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "cuda: no CUDA device found (cudaGetDeviceCount: %s, %d devices)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "no error", n);
  e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaFree(NULL); /* creates the context now, so its failure is named here */
  if (e != cudaSuccess) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: device 0 unusable: %s", cudaGetErrorString(e));
  int s = tdm_cu_blas_init();
  if (s) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: %s", tdm_cu_blas_load_error());
  ready = 1;
  return TDM_OK;
}

tdm_status tdm_cuda_device_info(char *buf, size_t buf_len, size_t *free_bytes, size_t *total_bytes) {
  TDM__TRY(tdm_cuda_init());
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, 0);
  if (e != cudaSuccess) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: cudaGetDeviceProperties: %s", cudaGetErrorString(e));
  if (buf && buf_len) snprintf(buf, buf_len, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return TDM_OK;
}

tdm_status tdm_cuda_malloc(void **out, size_t bytes, const char *what) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda_malloc: NULL out");
  *out = NULL;
  TDM__TRY(tdm_cuda_init());
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky-free error so later calls do not report it */
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    *out = NULL;
    return tdm__set_error(e == cudaErrorMemoryAllocation ? TDM_ERR_NO_MEMORY : TDM_ERR_SYSTEM,
                          "cuda: cudaMalloc of %.3f GiB for %s failed (%s); the device has %.3f GiB free of %.3f GiB",
                          (double)bytes / 1073741824.0, what ? what : "a buffer", cudaGetErrorString(e),
                          (double)f / 1073741824.0, (double)t / 1073741824.0);
  }
  return TDM_OK;
}

void tdm_cuda_free(void *p) {
  if (p) cudaFree(p);
}

static tdm_status copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k, const char *what) {
  if (!bytes) return TDM_OK;
  if (!dst || !src) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda: %s of %zu bytes with a NULL pointer", what, bytes);
  cudaError_t e = cudaMemcpy(dst, src, bytes, k);
  if (e != cudaSuccess) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: %s of %zu bytes: %s", what, bytes, cudaGetErrorString(e));
  return TDM_OK;
}
tdm_status tdm_cuda_to_device(void *dst, const void *src, size_t bytes) {
  return copy(dst, src, bytes, cudaMemcpyHostToDevice, "copy to the device");
}
tdm_status tdm_cuda_to_host(void *dst, const void *src, size_t bytes) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToHost, "copy to the host");
}

tdm_status tdm_cuda_copy(void *dst, const void *src, size_t bytes) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "device-to-device copy");
}

tdm_status tdm_cuda_memset0(void *p, size_t bytes) {
  cudaError_t e = cudaMemsetAsync(p, 0, bytes, 0);
  if (e != cudaSuccess) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: memset of %zu bytes: %s", bytes, cudaGetErrorString(e));
  return TDM_OK;
}

tdm_status tdm_cuda_sync(const char *where) {
  const char *msg;
  int le = tdm_cu_check(&msg);
  if (le) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: %s: kernel launch failed: %s", where, msg);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return tdm__set_error(TDM_ERR_SYSTEM, "cuda: %s: %s", where, cudaGetErrorString(e));
  return TDM_OK;
}

void tdm_cuda_set_tf32(int on) { tdm_cu_gemm_set_tf32(on); }
#else
typedef int tdm__cuda_device_unused; /* ISO C wants a translation unit to declare something */
#endif
