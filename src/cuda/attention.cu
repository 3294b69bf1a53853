// Causal self-attention from cuBLAS batched products and a masked softmax kernel (the T x T
// probabilities are stored: O(B NH T^2) memory; a fused flash-style kernel is the next step).
//   forward:  q, k, v = split(qkv); att = softmax(mask(q k^T / sqrt(hs))); out = merge(att v)
//   backward: dv = att^T dy; datt = dy v^T; dpre = softmax'(datt) / sqrt(hs); dq = dpre k; dk = dpre^T q
#include <math.h>

#include "cu_common.cuh"

// (B, T, nparts, NH, hs) -> nparts tensors (B, NH, T, hs) one after another: qkv -> q, k, v;
// bias (nparts C, or NULL) added on the way (c_attn's bias: its output is never stored unbiased)
__global__ void split_heads_k(float *parts, const float *x, const float *bias, int64_t B, int64_t T, int64_t NH,
                              int64_t hs, int nparts) {
  int64_t C = NH * hs, n = B * T * nparts * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t d = i % hs, h = (i / hs) % NH, which = (i / C) % nparts, t = (i / (nparts * C)) % T, b = i / (nparts * C * T);
    parts[which * B * T * C + ((b * NH + h) * T + t) * hs + d] = bias ? x[i] + bias[i % (nparts * C)] : x[i];
  }
}
// the reverse: parts (3 of (B, NH, T, hs)) -> (B, T, 3, NH, hs); nparts 1 for a single tensor
__global__ void merge_heads_k(float *out, const float *parts, int64_t B, int64_t T, int64_t NH, int64_t hs, int nparts) {
  int64_t C = NH * hs, n = B * T * nparts * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t d = i % hs, h = (i / hs) % NH, which = (i / C) % nparts, t = (i / (nparts * C)) % T, b = i / (nparts * C * T);
    out[i] = parts[which * B * T * C + ((b * NH + h) * T + t) * hs + d];
  }
}

// One warp per row of T: row r of block bh keeps columns 0..t (t = r % T), zeros after.
__global__ void causal_softmax_fwd_k(float *att, int64_t rows, int64_t T, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t t = row % T;
  float *a = att + row * T;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= t; j += 32) mx = fmaxf(mx, a[j] * scale);
  mx = tdm_warp_max(mx);
  float s = 0.0f;
  for (int64_t j = lane; j <= t; j += 32) {
    float e = expf(a[j] * scale - mx);
    a[j] = e;
    s += e;
  }
  float inv = 1.0f / tdm_warp_sum(s);
  for (int64_t j = lane; j < T; j += 32) a[j] = j <= t ? a[j] * inv : 0.0f;
}

__global__ void causal_softmax_bwd_k(float *datt, const float *att, int64_t rows, int64_t T, float scale) {
  int64_t row = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  int64_t t = row % T;
  float *d = datt + row * T;
  const float *a = att + row * T;
  float s = 0.0f;
  for (int64_t j = lane; j <= t; j += 32) s += a[j] * d[j];
  s = tdm_warp_sum(s);
  for (int64_t j = lane; j < T; j += 32) d[j] = j <= t ? scale * a[j] * (d[j] - s) : 0.0f;
}

extern "C" void tdm_cu_attention_split(float *qkvr, const float *qkv, const float *bias, int64_t B, int64_t T, int64_t C,
                                       int64_t NH) {
  split_heads_k<<<tdm_cu_blocks(3 * B * T * C, 256), 256>>>(qkvr, qkv, bias, B, T, NH, C / NH, 3);
}

extern "C" void tdm_cu_causal_softmax_fwd(float *att, int64_t BH, int64_t T, float scale) {
  causal_softmax_fwd_k<<<(unsigned)((BH * T + 7) / 8), 256>>>(att, BH * T, T, scale);
}
extern "C" void tdm_cu_causal_softmax_bwd(float *datt, const float *att, int64_t BH, int64_t T, float scale) {
  causal_softmax_bwd_k<<<(unsigned)((BH * T + 7) / 8), 256>>>(datt, att, BH * T, T, scale);
}

extern "C" void tdm_cu_attention_fwd(float *out, float *qkvr, float *att, float *y, const float *qkv, const float *bias,
                                     int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t hs = C / NH, BH = B * NH, n = B * T * C;
  split_heads_k<<<tdm_cu_blocks(3 * n, 256), 256>>>(qkvr, qkv, bias, B, T, NH, hs, 3);
  const float *q = qkvr, *k = qkvr + n, *v = qkvr + 2 * n;
  // att = q k^T per (b, h): (T, hs) x (hs, T); the scale is applied inside the softmax
  tdm_cu_gemm_batched(0, 1, T, T, hs, 1.0f, q, hs, T * hs, k, hs, T * hs, 0.0f, att, T, T * T, BH, TDM_CU_F32, 0);
  tdm_cu_causal_softmax_fwd(att, BH, T, 1.0f / sqrtf((float)hs));
  tdm_cu_gemm_batched(0, 0, T, hs, T, 1.0f, att, T, T * T, v, hs, T * hs, 0.0f, y, hs, T * hs, BH, TDM_CU_F32, 0);
  merge_heads_k<<<tdm_cu_blocks(n, 256), 256>>>(out, y, B, T, NH, hs, 1);
}

extern "C" void tdm_cu_attention_bwd(float *dqkv, float *dqkvr, float *datt, float *dy, const float *dout, const float *qkvr,
                                     const float *att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t hs = C / NH, BH = B * NH, n = B * T * C;
  const float *q = qkvr, *k = qkvr + n, *v = qkvr + 2 * n;
  float *dq = dqkvr, *dk = dqkvr + n, *dv = dqkvr + 2 * n;
  split_heads_k<<<tdm_cu_blocks(n, 256), 256>>>(dy, dout, NULL, B, T, NH, hs, 1); // dout (B, T, NH, hs) -> (B, NH, T, hs)
  // datt = dy v^T: (T, hs) x (hs, T)
  tdm_cu_gemm_batched(0, 1, T, T, hs, 1.0f, dy, hs, T * hs, v, hs, T * hs, 0.0f, datt, T, T * T, BH, TDM_CU_F32, 0);
  // dv = att^T dy: (T, T)^T x (T, hs)
  tdm_cu_gemm_batched(1, 0, T, hs, T, 1.0f, att, T, T * T, dy, hs, T * hs, 0.0f, dv, hs, T * hs, BH, TDM_CU_F32, 0);
  tdm_cu_causal_softmax_bwd(datt, att, BH, T, 1.0f / sqrtf((float)hs));
  // dq = dpre k: (T, T) x (T, hs); dk = dpre^T q
  tdm_cu_gemm_batched(0, 0, T, hs, T, 1.0f, datt, T, T * T, k, hs, T * hs, 0.0f, dq, hs, T * hs, BH, TDM_CU_F32, 0);
  tdm_cu_gemm_batched(1, 0, T, hs, T, 1.0f, datt, T, T * T, q, hs, T * hs, 0.0f, dk, hs, T * hs, BH, TDM_CU_F32, 0);
  merge_heads_k<<<tdm_cu_blocks(3 * n, 256), 256>>>(dqkv, dqkvr, B, T, NH, hs, 3);
}
