// LayerNorm over the last axis: one warp per row in forward and for dx; dw and db summed per
// column over chunks of rows, the chunks' partial sums added with atomics.
#include <cuda_bf16.h>

#include "cu_common.cuh"

__device__ __forceinline__ void ln_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void ln_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename OutT>
__global__ void layernorm_fwd_k(OutT *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                int64_t N, int64_t C, float eps) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + row * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += xr[c];
  float m = tdm_warp_sum(s) / (float)C;
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    float d = xr[c] - m;
    v += d * d;
  }
  float rs = rsqrtf(tdm_warp_sum(v) / (float)C + eps);
  OutT *o = out + row * C;
  for (int64_t c = lane; c < C; c += 32) ln_store(o + c, (xr[c] - m) * rs * w[c] + b[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout w
__global__ void layernorm_dx_k(float *dx, const float *dout, const float *x, const float *w, const float *mean,
                               const float *rstd, int64_t N, int64_t C) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + row * C, *dr = dout + row * C;
  float m = mean[row], rs = rstd[row], sg = 0.0f, sgx = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    float g = dr[c] * w[c], xh = (xr[c] - m) * rs;
    sg += g;
    sgx += g * xh;
  }
  sg = tdm_warp_sum(sg) / (float)C;
  sgx = tdm_warp_sum(sgx) / (float)C;
  float *o = dx + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    float g = dr[c] * w[c], xh = (xr[c] - m) * rs;
    o[c] += rs * (g - sg - xh * sgx);
  }
}

enum { ROWS_PER_CHUNK = 256 };
// grid (ceil(C/32), chunks), block (32, 8): column c of a chunk of rows; 8 row lanes, then shared sums
__global__ void layernorm_dwdb_k(float *dw, float *db, const float *dout, const float *x, const float *mean,
                                 const float *rstd, int64_t N, int64_t C) {
  __shared__ float sw[8][33], sb[8][33];
  int64_t c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * (int64_t)ROWS_PER_CHUNK;
  int64_t r1 = r0 + ROWS_PER_CHUNK < N ? r0 + ROWS_PER_CHUNK : N;
  float aw = 0.0f, ab = 0.0f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      float d = dout[r * C + c];
      aw += d * (x[r * C + c] - mean[r]) * rstd[r];
      ab += d;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < 8; k++) aw += sw[k][threadIdx.x], ab += sb[k][threadIdx.x];
    if (dw) atomicAdd(&dw[c], aw);
    if (db) atomicAdd(&db[c], ab);
  }
}

extern "C" void tdm_cu_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                     int64_t N, int64_t C, float eps) {
  layernorm_fwd_k<<<(unsigned)((N + 7) / 8), 256>>>(out, mean, rstd, x, w, b, N, C, eps);
}
extern "C" void tdm_cu_layernorm_fwd_bf16(uint16_t *out, float *mean, float *rstd, const float *x, const float *w,
                                          const float *b, int64_t N, int64_t C, float eps) {
  layernorm_fwd_k<<<(unsigned)((N + 7) / 8), 256>>>((__nv_bfloat16 *)out, mean, rstd, x, w, b, N, C, eps);
}

extern "C" void tdm_cu_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                                     const float *mean, const float *rstd, int64_t N, int64_t C) {
  if (dx) layernorm_dx_k<<<(unsigned)((N + 7) / 8), 256>>>(dx, dout, x, w, mean, rstd, N, C);
  if (dw || db) {
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)((N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK));
    layernorm_dwdb_k<<<grid, dim3(32, 8)>>>(dw, db, dout, x, mean, rstd, N, C);
  }
}
