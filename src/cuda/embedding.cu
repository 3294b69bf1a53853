// Embedding lookups: a table row per token id; GPT's token + position embedding in one pass.
#include "cu_common.cuh"

__global__ void embedding_fwd_k(float *out, const float *table, const int32_t *idx, int64_t n, int64_t C) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / C, c = i % C;
    out[i] = table[(int64_t)idx[r] * C + c];
  }
}
// Scatter-add: rows of the same token meet in the table, hence atomics (order not fixed: the
// sum of a token's rows may differ from the CPU's in the last bits).
__global__ void embedding_bwd_k(float *dtable, const float *dout, const int32_t *idx, int64_t n, int64_t C) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / C, c = i % C;
    atomicAdd(&dtable[(int64_t)idx[r] * C + c], dout[i]);
  }
}
__global__ void gpt_embed_fwd_k(float *out, const float *wte, const float *wpe, const int32_t *idx, int64_t n, int64_t T,
                                int64_t C) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / C, c = i % C, t = r % T;
    out[i] = wte[(int64_t)idx[r] * C + c] + wpe[t * C + c];
  }
}
// dwpe[t, c] += sum over the batch of dout[b, t, c]: one thread per (t, c), b in order.
__global__ void pos_bwd_k(float *dwpe, const float *dout, int64_t B, int64_t T, int64_t C) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * C; i += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; b++) s += dout[b * T * C + i];
    dwpe[i] += s;
  }
}

extern "C" void tdm_cu_embedding_fwd(float *out, const float *table, const int32_t *idx, int64_t N, int64_t C) {
  embedding_fwd_k<<<tdm_cu_blocks(N * C, 256), 256>>>(out, table, idx, N * C, C);
}
extern "C" void tdm_cu_embedding_bwd(float *dtable, const float *dout, const int32_t *idx, int64_t N, int64_t C) {
  embedding_bwd_k<<<tdm_cu_blocks(N * C, 256), 256>>>(dtable, dout, idx, N * C, C);
}
extern "C" void tdm_cu_gpt_embed_fwd(float *out, const float *wte, const float *wpe, const int32_t *idx, int64_t B,
                                     int64_t T, int64_t C) {
  gpt_embed_fwd_k<<<tdm_cu_blocks(B * T * C, 256), 256>>>(out, wte, wpe, idx, B * T * C, T, C);
}
extern "C" void tdm_cu_gpt_embed_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *idx, int64_t B,
                                     int64_t T, int64_t C) {
  embedding_bwd_k<<<tdm_cu_blocks(B * T * C, 256), 256>>>(dwte, dout, idx, B * T * C, C);
  pos_bwd_k<<<tdm_cu_blocks(T * C, 256), 256>>>(dwpe, dout, B, T, C);
}
