// A linear layer's bias: added per row in forward, column sums of the upstream gradient in backward.
#include "cu_common.cuh"

__global__ void bias_fwd_k(float *out, const float *b, int64_t n, int64_t O) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] += b[i % O];
}

extern "C" void tdm_cu_bias_fwd(float *out, const float *b, int64_t N, int64_t O) {
  bias_fwd_k<<<tdm_cu_blocks(N * O, 256), 256>>>(out, b, N * O, O);
}

// Block (32 columns x 32 row groups): each thread sums a strided set of rows of its column, then
// the 32 partial sums of a column are added in shared memory (fixed order: deterministic).
__global__ void bias_bwd_k(float *db, const float *dout, int64_t N, int64_t O) {
  __shared__ float part[32][33];
  int64_t col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < O)
    for (int64_t r = threadIdx.y; r < N; r += 32) s += dout[r * O + col];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < O) {
    float t = 0.0f;
    for (int k = 0; k < 32; k++) t += part[k][threadIdx.x];
    db[col] += t;
  }
}

extern "C" void tdm_cu_bias_bwd(float *db, const float *dout, int64_t N, int64_t O) {
  bias_bwd_k<<<(unsigned)((O + 31) / 32), dim3(32, 32)>>>(db, dout, N, O);
}
