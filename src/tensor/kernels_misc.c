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

/* keep when the top 24 bits of the hash, as a fraction of 2^24, are >= p */
static inline int keep(uint64_t seed, uint64_t pos, uint32_t threshold) {
  return (uint32_t)(tdm_hash64(seed, pos) >> 40) >= threshold;
}

typedef struct {
  float *out;
  const float *in;
  float scale;
  uint64_t seed, base;
  uint32_t threshold;
  int accumulate;
} drop_ctx;

static void drop_range(void *vc, int64_t i0, int64_t i1) {
  drop_ctx *c = vc;
  for (int64_t i = i0; i < i1; i++) {
    float v = keep(c->seed, c->base + (uint64_t)i, c->threshold) ? c->in[i] * c->scale : 0.0f;
    if (c->accumulate) c->out[i] += v;
    else c->out[i] = v;
  }
}

static void dropout_run(float *out, const float *in, int64_t n, float p, uint64_t seed, uint64_t base, int acc) {
  drop_ctx c = {out, in, p < 1.0f ? 1.0f / (1.0f - p) : 0.0f, seed, base, (uint32_t)(p * 16777216.0f), acc};
  tdm_parallel_for(n, 32768, drop_range, &c);
}

void tdm_k_dropout_fwd(float *out, const float *x, int64_t n, float p, uint64_t seed, uint64_t base) {
  dropout_run(out, x, n, p, seed, base, 0);
}

void tdm_k_dropout_bwd(float *dx, const float *dout, int64_t n, float p, uint64_t seed, uint64_t base) {
  dropout_run(dx, dout, n, p, seed, base, 1);
}
