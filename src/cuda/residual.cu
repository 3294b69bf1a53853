// Element-wise adds: the residual stream (with a projection's bias folded in) and scaling.
#include "cu_common.cuh"

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__global__ void add_k(float *out, const float *x, const float *y, int64_t n) {
  GRID_STRIDE(i, n) out[i] = x[i] + y[i];
}
__global__ void residual_bias_add_k(float *out, const float *res, const float *y, const float *b, int64_t n, int64_t C) {
  GRID_STRIDE(i, n) out[i] = res[i] + (y[i] + (b ? b[i % C] : 0.0f));
}
__global__ void scale_k(float *x, float a, int64_t n) {
  GRID_STRIDE(i, n) x[i] *= a;
}

extern "C" void tdm_cu_add(float *out, const float *x, const float *y, int64_t n) {
  add_k<<<tdm_cu_blocks(n, 256), 256>>>(out, x, y, n);
}
extern "C" void tdm_cu_residual_bias_add(float *out, const float *res, const float *y, const float *b, int64_t N, int64_t C) {
  residual_bias_add_k<<<tdm_cu_blocks(N * C, 256), 256>>>(out, res, y, b, N * C, C);
}
extern "C" void tdm_cu_scale(float *x, float alpha, int64_t n) { scale_k<<<tdm_cu_blocks(n, 256), 256>>>(x, alpha, n); }
