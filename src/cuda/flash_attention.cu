// Fused causal attention, flash-attention style (Dao et al., FlashAttention-2): the T x T scores
// never reach global memory. Products on the tensor cores (wmma, bf16 inputs, fp32 accumulation);
// softmax statistics in fp32.
//   forward:  per (b, h) and tile of 64 queries, keys in tiles of 64 up to the diagonal; the
//             running max and sum per row rescale the output (online softmax); writes the output
//             (merged (B, T, C) layout) and L = log2 of each row's sum of exponentials, in base 2.
//   backward: per (b, h) and tile of 64 keys, queries from the diagonal on: P recomputed from L,
//             dV += P^T dO, dP = dO V^T, dS = P (dP - D) (D = rowsum(dO o O)), dK += dS^T Q in
//             registers; dQ += dS K added to global memory with atomics (its order is not fixed).
// Each of the 4 warps of a block owns 16 rows of the tile; shared memory holds the tiles as bf16.
#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>

#include "cu_common.cuh"

using namespace nvcuda;

enum { FA_TILE = 64, FA_THREADS = 128 };
#define FA_LOG2E 1.4426950408889634f

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fa_acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa_b_col;

// Leading dimensions in shared memory: wmma wants multiples of 8 (bf16) or 4 (fp32) elements and
// 32-byte aligned tiles; the extra 8 or 4 elements move successive rows to other banks.
template <int HS> struct fa_dims {
  static constexpr int LDH = HS + 8;       // bf16 rows of Q, K, V, dO
  static constexpr int LDS = FA_TILE + 4;  // fp32 scores
  static constexpr int LDP = FA_TILE + 8;  // bf16 probabilities
  static constexpr int LDO = HS + 4;       // fp32 accumulators
  static constexpr size_t fwd_bytes = (size_t)3 * FA_TILE * LDH * 2 + (size_t)FA_TILE * LDS * 4 + (size_t)FA_TILE * LDP * 2 +
                                      (size_t)FA_TILE * LDO * 4;
  static constexpr size_t bwd_bytes = (size_t)4 * FA_TILE * LDH * 2 + (size_t)2 * FA_TILE * LDS * 4 +
                                      (size_t)2 * FA_TILE * LDP * 2 + (size_t)FA_TILE * LDO * 4 + (size_t)2 * FA_TILE * 4;
};

__device__ __forceinline__ float fa_load(const float *p) { return *p; }
__device__ __forceinline__ float fa_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void fa_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void fa_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

// rows [r0, r0 + 64) of a (T, HS) matrix whose row t starts at src + t * stride (fp32) -> bf16
// tile (64, LDH); rows past T are zeros (their products must not carry NaNs from stale memory).
template <int HS>
__device__ __forceinline__ void fa_load_tile(__nv_bfloat16 *dst, const float *src, int64_t stride, int r0, int T) {
  constexpr int LDH = fa_dims<HS>::LDH;
  for (int i = threadIdx.x * 4; i < FA_TILE * HS; i += FA_THREADS * 4) {
    int r = i / HS, c = i % HS;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r0 + r < T) v = *(const float4 *)(src + (int64_t)(r0 + r) * stride + c);
    __nv_bfloat16 *d = dst + r * LDH + c;
    d[0] = __float2bfloat16_rn(v.x), d[1] = __float2bfloat16_rn(v.y);
    d[2] = __float2bfloat16_rn(v.z), d[3] = __float2bfloat16_rn(v.w);
  }
}

// grid (query tiles, B * NH), 128 threads. q, k, v: (B, NH, T, HS) each; out (B, T, NH * HS).
template <int HS, typename OutT>
__global__ void __launch_bounds__(FA_THREADS) fa_fwd_k(OutT *out, float *lse, const float *q, const float *k, const float *v,
                                                       int T, int NH, float scale_log2) {
  typedef fa_dims<HS> D;
  extern __shared__ __align__(128) unsigned char fa_smem[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)fa_smem, *Ks = Qs + FA_TILE * D::LDH, *Vs = Ks + FA_TILE * D::LDH;
  float *Ss = (float *)(Vs + FA_TILE * D::LDH);
  __nv_bfloat16 *Ps = (__nv_bfloat16 *)(Ss + FA_TILE * D::LDS);
  float *Os = (float *)(Ps + FA_TILE * D::LDP);
  const int qt = gridDim.x - 1 - blockIdx.x; // the longest rows first
  const int bh = blockIdx.y, q0 = qt * FA_TILE, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t base = (int64_t)bh * T * HS;
  fa_load_tile<HS>(Qs, q + base, HS, q0, T);
  for (int i = threadIdx.x; i < FA_TILE * D::LDO; i += FA_THREADS) Os[i] = 0.0f;
  const int wr = 16 * warp; // this warp's rows of the tile
  // The online softmax: lanes 2r and 2r + 1 own row wr + r (half of its columns each); the row's
  // running max and sum stay in their registers. A lane visits its 32 columns in a rotated order
  // so that the warp's 32 reads hit 32 different banks.
  const int pr = lane >> 1, half = lane & 1, prow = wr + pr, pi = q0 + prow, rot = 2 * half + (pr >> 3);
  float m_run = -INFINITY, l_run = 0.0f;
  for (int kt = 0; kt <= qt; kt++) {
    __syncthreads(); // every warp is done with the last K and V tiles
    fa_load_tile<HS>(Ks, k + base, HS, kt * FA_TILE, T);
    fa_load_tile<HS>(Vs, v + base, HS, kt * FA_TILE, T);
    __syncthreads();
    // S (16 x 64) = Q_w K^T
    for (int n0 = 0; n0 < FA_TILE; n0 += 16) {
      fa_acc acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int d0 = 0; d0 < HS; d0 += 16) {
        fa_a_row a;
        fa_b_col b;
        wmma::load_matrix_sync(a, Qs + wr * D::LDH + d0, D::LDH);
        wmma::load_matrix_sync(b, Ks + n0 * D::LDH + d0, D::LDH);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Ss + wr * D::LDS + n0, acc, D::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    {
      const float *srow = Ss + prow * D::LDS + half * 32;
      __nv_bfloat16 *prw = Ps + prow * D::LDP + half * 32;
      const int jb = kt * FA_TILE + half * 32;
      float sv[32], mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 32; c++) {
        int cc = (c + rot) & 31;
        sv[c] = (pi < T && jb + cc <= pi) ? srow[cc] * scale_log2 : -INFINITY;
        mx = fmaxf(mx, sv[c]);
      }
      float m_new = fmaxf(m_run, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
      float alpha = 1.0f, sum = 0.0f;
      if (m_new != -INFINITY) { // a row with no key yet (or past T) stays empty
        alpha = exp2f(m_run - m_new);
#pragma unroll
        for (int c = 0; c < 32; c++) {
          __nv_bfloat16 p = __float2bfloat16_rn(exp2f(sv[c] - m_new));
          prw[(c + rot) & 31] = p;
          sum += __bfloat162float(p); // the sum of what is multiplied: the rounded probabilities
        }
      } else {
#pragma unroll
        for (int c = 0; c < 32; c++) prw[c] = __float2bfloat16_rn(0.0f);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      m_run = m_new, l_run = l_run * alpha + sum;
      float *orow = Os + prow * D::LDO + half * (HS / 2);
#pragma unroll
      for (int d = 0; d < HS / 2; d++) orow[d] *= alpha;
    }
    __syncwarp();
    // O_w += P_w V
    for (int n0 = 0; n0 < HS; n0 += 16) {
      fa_acc acc;
      wmma::load_matrix_sync(acc, Os + wr * D::LDO + n0, D::LDO, wmma::mem_row_major);
      for (int k0 = 0; k0 < FA_TILE; k0 += 16) {
        fa_a_row a;
        fa_b_row b;
        wmma::load_matrix_sync(a, Ps + wr * D::LDP + k0, D::LDP);
        wmma::load_matrix_sync(b, Vs + k0 * D::LDH + n0, D::LDH);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Os + wr * D::LDO + n0, acc, D::LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  const int b = bh / NH, h = bh % NH;
  if (pi < T) {
    float inv = 1.0f / l_run;
    OutT *o = out + ((int64_t)(b * T + pi) * NH + h) * HS + half * (HS / 2);
    const float *orow = Os + prow * D::LDO + half * (HS / 2);
#pragma unroll
    for (int d = 0; d < HS / 2; d++) fa_store(o + d, orow[d] * inv);
    if (!half) lse[(int64_t)bh * T + pi] = m_run + log2f(l_run);
  }
}

// Drow[bh T + t] = sum_d dout o out over head h of token t: one warp per (b, t, h).
template <typename OutT>
__global__ void fa_rowdot_k(float *Drow, const float *dout, const OutT *out, int64_t B, int T, int NH, int HS) {
  int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (w >= B * T * NH) return;
  int h = (int)(w % NH);
  int64_t bt = w / NH, b = bt / T, t = bt % T;
  const float *d = dout + w * HS;
  const OutT *o = out + w * HS;
  float s = 0.0f;
  for (int c = lane; c < HS; c += 32) s += d[c] * fa_load(o + c);
  s = tdm_warp_sum(s);
  if (lane == 0) Drow[(b * NH + h) * T + t] = s;
}

// grid (key tiles, B * NH), 128 threads. dqkv (B, T, 3, NH, HS): its q part must be zero before
// (dQ is added with atomics); its k and v parts are set. dout (B, T, NH * HS).
template <int HS>
__global__ void __launch_bounds__(FA_THREADS) fa_bwd_k(float *dqkv, const float *q, const float *k, const float *v,
                                                       const float *dout, const float *lse, const float *Drow, int T,
                                                       int NH, float scale_log2, float scale) {
  typedef fa_dims<HS> D;
  extern __shared__ __align__(128) unsigned char fa_smem[];
  __nv_bfloat16 *Ks = (__nv_bfloat16 *)fa_smem, *Vs = Ks + FA_TILE * D::LDH, *Qs = Vs + FA_TILE * D::LDH,
                *dOs = Qs + FA_TILE * D::LDH;
  float *St = (float *)(dOs + FA_TILE * D::LDH), *dPt = St + FA_TILE * D::LDS; // (key, query)
  __nv_bfloat16 *Pt = (__nv_bfloat16 *)(dPt + FA_TILE * D::LDS), *dSt = Pt + FA_TILE * D::LDP;
  float *Xs = (float *)(dSt + FA_TILE * D::LDP), *Lq = Xs + FA_TILE * D::LDO, *Dq = Lq + FA_TILE;
  const int kt = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = 16 * warp;
  const int b = bh / NH, h = bh % NH, C = NH * HS, nt = (T + FA_TILE - 1) / FA_TILE;
  const int64_t base = (int64_t)bh * T * HS;
  fa_load_tile<HS>(Ks, k + base, HS, kt * FA_TILE, T);
  fa_load_tile<HS>(Vs, v + base, HS, kt * FA_TILE, T);
  fa_acc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
  for (int qt = kt; qt < nt; qt++) {
    const int q0 = qt * FA_TILE;
    __syncthreads(); // the last query tile's Q, dO and dS are no longer read
    fa_load_tile<HS>(Qs, q + base, HS, q0, T);
    fa_load_tile<HS>(dOs, dout + (int64_t)b * T * C + (int64_t)h * HS, C, q0, T);
    for (int i = threadIdx.x; i < FA_TILE; i += FA_THREADS) {
      int t = q0 + i;
      Lq[i] = t < T ? lse[(int64_t)bh * T + t] : 0.0f;
      Dq[i] = t < T ? Drow[(int64_t)bh * T + t] : 0.0f;
    }
    __syncthreads();
    // S^T (16 keys x 64 queries) = K_w Q^T and dP^T = V_w dO^T
    for (int n0 = 0; n0 < FA_TILE; n0 += 16) {
      fa_acc s, dp;
      wmma::fill_fragment(s, 0.0f);
      wmma::fill_fragment(dp, 0.0f);
      for (int d0 = 0; d0 < HS; d0 += 16) {
        fa_a_row a;
        fa_b_col bq;
        wmma::load_matrix_sync(a, Ks + wr * D::LDH + d0, D::LDH);
        wmma::load_matrix_sync(bq, Qs + n0 * D::LDH + d0, D::LDH);
        wmma::mma_sync(s, a, bq, s);
        wmma::load_matrix_sync(a, Vs + wr * D::LDH + d0, D::LDH);
        wmma::load_matrix_sync(bq, dOs + n0 * D::LDH + d0, D::LDH);
        wmma::mma_sync(dp, a, bq, dp);
      }
      wmma::store_matrix_sync(St + wr * D::LDS + n0, s, D::LDS, wmma::mem_row_major);
      wmma::store_matrix_sync(dPt + wr * D::LDS + n0, dp, D::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int kr = wr + r, j = kt * FA_TILE + kr;
      for (int c = lane; c < FA_TILE; c += 32) {
        const int i = q0 + c;
        float p = (i < T && j <= i) ? exp2f(St[kr * D::LDS + c] * scale_log2 - Lq[c]) : 0.0f;
        Pt[kr * D::LDP + c] = __float2bfloat16_rn(p);
        dSt[kr * D::LDP + c] = __float2bfloat16_rn(p * (dPt[kr * D::LDS + c] - Dq[c]) * scale);
      }
    }
    __syncwarp();
    // dV_w += P^T_w dO; dK_w += dS^T_w Q (k runs over the tile's queries)
    for (int k0 = 0; k0 < FA_TILE; k0 += 16) {
      fa_a_row ap, ads;
      wmma::load_matrix_sync(ap, Pt + wr * D::LDP + k0, D::LDP);
      wmma::load_matrix_sync(ads, dSt + wr * D::LDP + k0, D::LDP);
#pragma unroll
      for (int n = 0; n < HS / 16; n++) {
        fa_b_row bb;
        wmma::load_matrix_sync(bb, dOs + k0 * D::LDH + 16 * n, D::LDH);
        wmma::mma_sync(dv[n], ap, bb, dv[n]);
        wmma::load_matrix_sync(bb, Qs + k0 * D::LDH + 16 * n, D::LDH);
        wmma::mma_sync(dk[n], ads, bb, dk[n]);
      }
    }
    __syncthreads(); // every warp's rows of dS^T are written
    // dQ rows wr.. of the tile (16 queries x HS) = dS (queries x the 64 keys) K
    for (int n0 = 0; n0 < HS; n0 += 16) {
      fa_acc acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int k0 = 0; k0 < FA_TILE; k0 += 16) {
        fa_a_col a; // element (query m, key kk) = dSt[kk][m]
        fa_b_row bk;
        wmma::load_matrix_sync(a, dSt + k0 * D::LDP + wr, D::LDP);
        wmma::load_matrix_sync(bk, Ks + k0 * D::LDH + n0, D::LDH);
        wmma::mma_sync(acc, a, bk, acc);
      }
      wmma::store_matrix_sync(Xs + wr * D::LDO + n0, acc, D::LDO, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int t = q0 + wr + r;
      if (t >= T) break;
      float *dq = dqkv + ((int64_t)(b * T + t) * 3) * C + (int64_t)h * HS;
      for (int d = lane; d < HS; d += 32) atomicAdd(dq + d, Xs[(wr + r) * D::LDO + d]);
    }
    __syncwarp(); // Xs rows read before the next tile's products overwrite them
  }
  // dK and dV of the warp's 16 keys, through shared memory to the merged layout
#pragma unroll
  for (int part = 1; part <= 2; part++) {
#pragma unroll
    for (int n = 0; n < HS / 16; n++)
      wmma::store_matrix_sync(Xs + wr * D::LDO + 16 * n, part == 1 ? dk[n] : dv[n], D::LDO, wmma::mem_row_major);
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int t = kt * FA_TILE + wr + r;
      if (t >= T) break;
      float *o = dqkv + ((int64_t)(b * T + t) * 3 + part) * C + (int64_t)h * HS;
      for (int d = lane; d < HS; d += 32) o[d] = Xs[(wr + r) * D::LDO + d];
    }
    __syncwarp();
  }
}

template <int HS, typename OutT> static void fa_fwd_launch(OutT *out, float *lse, const float *qkvr, int64_t B, int64_t T, int64_t NH) {
  static int ready = 0; // one attribute call per instantiation: shared memory beyond 48 KiB is opt-in
  size_t smem = fa_dims<HS>::fwd_bytes;
  if (!ready) cudaFuncSetAttribute(fa_fwd_k<HS, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), ready = 1;
  int64_t n = B * NH * T * HS;
  dim3 grid((unsigned)((T + FA_TILE - 1) / FA_TILE), (unsigned)(B * NH));
  fa_fwd_k<HS, OutT><<<grid, FA_THREADS, smem>>>(out, lse, qkvr, qkvr + n, qkvr + 2 * n, (int)T, (int)NH,
                                                 FA_LOG2E / sqrtf((float)HS));
}
template <int HS> static void fa_bwd_launch(float *dqkv, const float *dout, const float *qkvr, const float *lse, const float *Drow,
                                           int64_t B, int64_t T, int64_t NH) {
  static int ready = 0;
  size_t smem = fa_dims<HS>::bwd_bytes;
  if (!ready) cudaFuncSetAttribute(fa_bwd_k<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), ready = 1;
  int64_t n = B * NH * T * HS;
  dim3 grid((unsigned)((T + FA_TILE - 1) / FA_TILE), (unsigned)(B * NH));
  fa_bwd_k<HS><<<grid, FA_THREADS, smem>>>(dqkv, qkvr, qkvr + n, qkvr + 2 * n, dout, lse, Drow, (int)T, (int)NH,
                                           FA_LOG2E / sqrtf((float)HS), 1.0f / sqrtf((float)HS));
}


template <typename OutT> static void fa_fwd_any(OutT *out, float *lse, const float *qkvr, int64_t B, int64_t T, int64_t C, int64_t NH) {
  switch (C / NH) {
  case 16: fa_fwd_launch<16>(out, lse, qkvr, B, T, NH); break;
  case 32: fa_fwd_launch<32>(out, lse, qkvr, B, T, NH); break;
  case 64: fa_fwd_launch<64>(out, lse, qkvr, B, T, NH); break;
  case 128: fa_fwd_launch<128>(out, lse, qkvr, B, T, NH); break;
  default: break; // the caller asked tdm_cu_flash_supported first
  }
}

extern "C" void tdm_cu_flash_attention_fwd(void *out, int out_bf16, float *lse, const float *qkvr, int64_t B, int64_t T,
                                           int64_t C, int64_t NH) {
  if (out_bf16)
    fa_fwd_any((__nv_bfloat16 *)out, lse, qkvr, B, T, C, NH);
  else
    fa_fwd_any((float *)out, lse, qkvr, B, T, C, NH);
}

extern "C" void tdm_cu_flash_attention_bwd(float *dqkv, float *Drow, const float *dout, const void *out, int out_bf16,
                                           const float *qkvr, const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t HS = C / NH, rows = B * T * NH;
  cudaMemsetAsync(dqkv, 0, (size_t)(B * T * 3 * C) * sizeof(float), 0); // dQ is summed with atomics
  if (out_bf16)
    fa_rowdot_k<<<(unsigned)((rows + 7) / 8), 256>>>(Drow, dout, (const __nv_bfloat16 *)out, B, (int)T, (int)NH, (int)HS);
  else
    fa_rowdot_k<<<(unsigned)((rows + 7) / 8), 256>>>(Drow, dout, (const float *)out, B, (int)T, (int)NH, (int)HS);
  switch (HS) {
  case 16: fa_bwd_launch<16>(dqkv, dout, qkvr, lse, Drow, B, T, NH); break;
  case 32: fa_bwd_launch<32>(dqkv, dout, qkvr, lse, Drow, B, T, NH); break;
  case 64: fa_bwd_launch<64>(dqkv, dout, qkvr, lse, Drow, B, T, NH); break;
  case 128: fa_bwd_launch<128>(dqkv, dout, qkvr, lse, Drow, B, T, NH); break;
  default: break;
  }
}
