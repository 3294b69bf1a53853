// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#include <cuda_bf16.h>

#include "cu_common.cuh"

__device__ __forceinline__ void gelu_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void gelu_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

#define K0 0.7978845608028654f // sqrt(2 / pi)
#define K1 0.044715f

__global__ void gelu_fwd_k(float *out, const float *x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i], u = K0 * (v + K1 * v * v * v);
    out[i] = 0.5f * v * (1.0f + tanhf(u));
  }
}
__global__ void gelu_bwd_k(float *dx, const float *dout, const float *x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i], u = K0 * (v + K1 * v * v * v), t = tanhf(u);
    float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * K0 * (1.0f + 3.0f * K1 * v * v);
    dx[i] = d * dout[i];
  }
}

template <typename OutT>
__global__ void bias_gelu_fwd_k(OutT *out, float *x, const float *b, int64_t n, int64_t O) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i] + b[i % O], u = K0 * (v + K1 * v * v * v);
    x[i] = v; // the biased input, which backward reads
    gelu_store(out + i, 0.5f * v * (1.0f + tanhf(u)));
  }
}

extern "C" void tdm_cu_bias_gelu_fwd(float *out, float *x, const float *b, int64_t N, int64_t O) {
  bias_gelu_fwd_k<<<tdm_cu_blocks(N * O, 256), 256>>>(out, x, b, N * O, O);
}
extern "C" void tdm_cu_bias_gelu_fwd_bf16(uint16_t *out, float *x, const float *b, int64_t N, int64_t O) {
  bias_gelu_fwd_k<<<tdm_cu_blocks(N * O, 256), 256>>>((__nv_bfloat16 *)out, x, b, N * O, O);
}
extern "C" void tdm_cu_gelu_fwd(float *out, const float *x, int64_t n) { gelu_fwd_k<<<tdm_cu_blocks(n, 256), 256>>>(out, x, n); }
extern "C" void tdm_cu_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n) {
  gelu_bwd_k<<<tdm_cu_blocks(n, 256), 256>>>(dx, dout, x, n);
}
