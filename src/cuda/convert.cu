// f32 <-> bf16 for bf16 products (round to nearest even, as the CPU's tdm_k_f32_to_bf16).
#include <cuda_bf16.h>

#include "cu_common.cuh"

__global__ void to_bf16_k(__nv_bfloat16 *dst, const float *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}
__global__ void from_bf16_k(float *dst, const __nv_bfloat16 *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

extern "C" void tdm_cu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  to_bf16_k<<<tdm_cu_blocks(n, 256), 256>>>((__nv_bfloat16 *)dst, src, n);
}
extern "C" void tdm_cu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
  from_bf16_k<<<tdm_cu_blocks(n, 256), 256>>>(dst, (const __nv_bfloat16 *)src, n);
}
