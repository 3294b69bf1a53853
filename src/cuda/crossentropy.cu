// Fused softmax cross-entropy: one block per row reads the logits three times (max, sum of
// exponentials, then the gradient), never storing the probabilities.
#include <math.h>

#include <cuda_bf16.h>

#include "cu_common.cuh"

__device__ __forceinline__ void ce_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void ce_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename GradT>
__global__ void cross_entropy_k(float *loss, GradT *dlogits, const float *logits, const int32_t *targets, int64_t V,
                                float dscale) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x;
  const float *x = logits + row * V;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = tdm_block_max(mx, sh);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - mx);
  s = tdm_block_sum(s, sh);
  float lse = mx + logf(s);
  int32_t t = targets[row];
  int ok = t >= 0 && t < V;
  if (threadIdx.x == 0) loss[row] = ok ? lse - x[t] : NAN;
  if (!dlogits) return;
  __syncthreads(); // x[t] read above before the row is overwritten in place
  GradT *d = dlogits + row * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) ce_store(d + j, (expf(x[j] - lse) - (j == t ? 1.0f : 0.0f)) * dscale);
}

__global__ void sum_k(float *out, const float *x, int64_t n) {
  __shared__ float sh[32];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = tdm_block_sum(s, sh);
  if (threadIdx.x == 0) out[0] = s;
}

extern "C" void tdm_cu_cross_entropy(float *loss, float *dlogits, const float *logits, const int32_t *targets, int64_t N,
                                     int64_t V, float dscale) {
  cross_entropy_k<<<(unsigned)N, 512>>>(loss, dlogits, logits, targets, V, dscale);
}
extern "C" void tdm_cu_cross_entropy_bf16grad(float *loss, uint16_t *dlogits, const float *logits, const int32_t *targets,
                                              int64_t N, int64_t V, float dscale) {
  cross_entropy_k<<<(unsigned)N, 512>>>(loss, (__nv_bfloat16 *)dlogits, logits, targets, V, dscale);
}
extern "C" void tdm_cu_sum(float *out, const float *x, int64_t n) { sum_k<<<1, 1024>>>(out, x, n); }
