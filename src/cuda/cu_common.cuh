// Shared by the .cu files: launch sizes and warp/block reductions.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

static inline unsigned tdm_cu_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 1048576 ? 1048576 : b); // grid-stride loops cover the rest
}

__device__ __forceinline__ float tdm_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float tdm_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float tdm_block_sum(float v, float *shared32) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = tdm_warp_sum(v);
  __syncthreads(); // shared32 may still be read by a previous call
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < nw ? shared32[lane] : 0.0f;
  return tdm_warp_sum(v);
}
__device__ __forceinline__ float tdm_block_max(float v, float *shared32) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = tdm_warp_max(v);
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  v = lane < nw ? shared32[lane] : -INFINITY;
  return tdm_warp_max(v);
}
