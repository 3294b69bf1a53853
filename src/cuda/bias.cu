// A linear layer's bias: added per row in forward, column sums of the upstream gradient in backward.
#include "cu_common.cuh"

__global__ void bias_fwd_k(float *out, const float *b, int64_t n, int64_t O) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] += b[i % O];
}

extern "C" void tdm_cu_bias_fwd(float *out, const float *b, int64_t N, int64_t O) {
  bias_fwd_k<<<tdm_cu_blocks(N * O, 256), 256>>>(out, b, N * O, O);
}

enum { ROWS_PER_CHUNK = 256 };
// grid (ceil(O/32), row chunks of 256), block (32 columns x 8 row lanes): each thread sums its
// column over a strided eighth of the chunk, the 8 lanes are added in shared memory, and the
// chunk's sum goes into db with an atomic (enough blocks to fill the GPU for any O).
__global__ void bias_bwd_k(float *db, const float *dout, int64_t N, int64_t O) {
  __shared__ float part[8][33];
  int64_t col = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * (int64_t)ROWS_PER_CHUNK;
  int64_t r1 = r0 + ROWS_PER_CHUNK < N ? r0 + ROWS_PER_CHUNK : N;
  float s = 0.0f;
  if (col < O)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += dout[r * O + col];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < O) {
    for (int k = 1; k < 8; k++) s += part[k][threadIdx.x];
    atomicAdd(&db[col], s);
  }
}

extern "C" void tdm_cu_bias_bwd(float *db, const float *dout, int64_t N, int64_t O) {
  dim3 grid((unsigned)((O + 31) / 32), (unsigned)((N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK));
  bias_bwd_k<<<grid, dim3(32, 8)>>>(db, dout, N, O);
}
