// The gradients' sum of squares in double: a fixed grid of blocks writes partial sums, one block
// adds them in index order, so the result does not depend on scheduling.
#include "cu_common.cuh"

__global__ void sumsq_part_k(double *partial, const float *g, int64_t n) {
  __shared__ double sh[256];
  double s = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s += (double)g[i] * (double)g[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

__global__ void sumsq_final_k(double *out, const double *partial, int n) {
  __shared__ double sh[TDM_CU_SUMSQ_BLOCKS];
  sh[threadIdx.x] = threadIdx.x < n ? partial[threadIdx.x] : 0.0;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = sh[0];
}

extern "C" void tdm_cu_sumsq(double *out, double *partial, const float *g, int64_t n) {
  sumsq_part_k<<<TDM_CU_SUMSQ_BLOCKS, 256>>>(partial, g, n);
  sumsq_final_k<<<1, TDM_CU_SUMSQ_BLOCKS>>>(out, partial, TDM_CU_SUMSQ_BLOCKS);
}
