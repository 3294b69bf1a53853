/* Embedding lookup and position-keyed dropout. */
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

static inline int64_t index_at(const void *idx, int i64, int64_t i) {
  return i64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

void tdm_k_embedding_fwd(float *out, const float *table, const void *idx, int idx_i64, int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; i++)
    memcpy(out + i * C, table + index_at(idx, idx_i64, i) * C, (size_t)C * sizeof(float));
}

void tdm_k_embedding_bwd(float *dtable, const float *dout, const void *idx, int idx_i64, int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; i++) {
    float *d = dtable + index_at(idx, idx_i64, i) * C;
    const float *g = dout + i * C;
    for (int64_t j = 0; j < C; j++) d[j] += g[j];
  }
}

/* The mask bit of position pos: a 32-bit counter hash (two murmur3 finalizer rounds with the
 * seed mixed in) so the loop vectorises with AVX2's 32-bit multiplies; the 64-bit hash costs
 * 16% of an MLP training step. Kept when the top 24 bits, as a fraction of 2^24, are >= p. */
static inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

typedef struct {
  float *out;
  const float *in;
  float scale;
  uint32_t k0, k1, hi; /* seed halves; the high word of the positions, constant per run */
  uint64_t base;
  uint32_t threshold;
  int accumulate;
} drop_ctx;

static void drop_range(void *vc, int64_t i0, int64_t i1) {
  drop_ctx *c = vc;
  float *restrict out = c->out;
  const float *restrict in = c->in;
  uint32_t k0 = c->k0, k1 = c->k1 ^ (c->hi * 0x27d4eb2fu), lo = (uint32_t)c->base, thr = c->threshold;
  float scale = c->scale;
#define DROP_MASKED(i) (in[i] * ((fmix32(fmix32((lo + (uint32_t)(i)) ^ k0) + k1) >> 8) >= thr ? scale : 0.0f))
  if (c->accumulate) /* two loops, so neither re-reads c (out might alias it) and both vectorise */
    for (int64_t i = i0; i < i1; i++) out[i] += DROP_MASKED(i);
  else
    for (int64_t i = i0; i < i1; i++) out[i] = DROP_MASKED(i);
#undef DROP_MASKED
}

static void dropout_run(float *out, const float *in, int64_t n, float p, uint64_t seed, uint64_t base, int acc) {
  uint64_t key = tdm_hash64(seed, 0);
  /* A range of positions must not wrap the low word, or the high word would change inside it. */
  uint64_t start = base, end = base + (uint64_t)n;
  while (start < end) {
    uint64_t stop = ((start >> 32) + 1) << 32;
    if (stop > end) stop = end;
    drop_ctx c = {out + (start - base), in + (start - base), p < 1.0f ? 1.0f / (1.0f - p) : 0.0f,
                  (uint32_t)key, (uint32_t)(key >> 32), (uint32_t)(start >> 32), start,
                  (uint32_t)(p * 16777216.0f), acc};
    tdm_parallel_for((int64_t)(stop - start), 32768, drop_range, &c);
    start = stop;
  }
}

void tdm_k_dropout_fwd(float *out, const float *x, int64_t n, float p, uint64_t seed, uint64_t base) {
  dropout_run(out, x, n, p, seed, base, 0);
}

void tdm_k_dropout_bwd(float *dx, const float *dout, int64_t n, float p, uint64_t seed, uint64_t base) {
  dropout_run(dx, dout, n, p, seed, base, 1);
}
