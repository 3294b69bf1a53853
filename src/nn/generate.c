/* Text generation for the GPT and Llama models with a key/value cache: each new token runs through
 * the blocks as one position, attending to the cached keys and values of every earlier position,
 * so the cost per token grows linearly with the context, not with its square. Llama's cache holds
 * only its key/value heads (grouped-query attention: a group of query heads reads one), keys
 * already rotated to their positions. Written against the kernels (no tape): inference needs no
 * gradients. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "nn/model_impl.h"
#include "tandem/kernels.h"
#include "tensor/tensor_impl.h"

struct tdm_kv_cache {
  tdm_model *m;
  int64_t L, C, NH, block, pos;
  int64_t KV;            /* cached width per position: C (GPT), key/value heads x head size (Llama) */
  float *k, *v;          /* (L, block, KV) each */
  float *x, *h, *qkv, *att_out, *fc, *att, *logits, *stats;
  float *rope; /* Llama: cos and sin of this position (hs / 2 each) */
};

tdm_status tdm_kv_cache_create(tdm_kv_cache **out, tdm_model *m) { return tdm_kv_cache_create_len(out, m, 0); }

tdm_status tdm_kv_cache_create_len(tdm_kv_cache **out, tdm_model *m, int64_t max_len) {
  if (!out || !m || (m->cfg.kind != TDM_MODEL_GPT && m->cfg.kind != TDM_MODEL_LLAMA))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "kv_cache: needs a gpt or llama model");
  tdm_kv_cache *c = tdm__calloc(1, sizeof *c);
  if (!c) return tdm__set_error(TDM_ERR_NO_MEMORY, "kv_cache: out of memory");
  c->m = m;
  c->L = m->cfg.n_layer;
  c->C = m->cfg.n_embd;
  c->NH = m->cfg.n_head;
  int llama = m->cfg.kind == TDM_MODEL_LLAMA;
  c->KV = llama ? m->cfg.n_kv_head * (c->C / c->NH) : c->C;
  c->block = max_len > 0 && max_len < m->cfg.block_size ? max_len : m->cfg.block_size;
  int64_t kv64;
  if (__builtin_mul_overflow(c->L, c->block, &kv64) || __builtin_mul_overflow(kv64, c->KV, &kv64) ||
      kv64 > (int64_t)(SIZE_MAX / (2 * sizeof(float)))) {
    tdm__free(c);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "kv_cache: %lld layers x %lld positions x %lld wide overflow the memory",
                          (long long)c->L, (long long)c->block, (long long)c->C);
  }
  size_t kv = (size_t)kv64;
  c->k = tdm__malloc(sizeof(float) * kv);
  c->v = tdm__malloc(sizeof(float) * kv);
  c->x = tdm__malloc(sizeof(float) * (size_t)c->C);
  c->h = tdm__malloc(sizeof(float) * (size_t)c->C);
  c->qkv = tdm__malloc(sizeof(float) * (size_t)(3 * c->C));
  c->att_out = tdm__malloc(sizeof(float) * (size_t)c->C);
  c->fc = tdm__malloc(sizeof(float) * (size_t)(llama ? 2 * m->cfg.ffn_hidden : 8 * c->C)); /* gate and up; GPT's 4C */
  c->rope = tdm__malloc(sizeof(float) * (size_t)(c->C / c->NH + 1));
  c->att = tdm__malloc(sizeof(float) * (size_t)c->block);
  c->logits = tdm__malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
  c->stats = tdm__malloc(sizeof(float) * 2);
  if (!c->k || !c->v || !c->x || !c->h || !c->qkv || !c->att_out || !c->fc || !c->att || !c->logits || !c->stats || !c->rope) {
    tdm_kv_cache_destroy(c);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "kv_cache: cannot hold %zu floats of keys and values", 2 * kv);
  }
  *out = c;
  return TDM_OK;
}

void tdm_kv_cache_destroy(tdm_kv_cache *c) {
  if (!c) return;
  void *p[] = {c->k, c->v, c->x, c->h, c->qkv, c->att_out, c->fc, c->att, c->logits, c->stats, c->rope};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) tdm__free(p[i]);
  tdm__free(c);
}

void tdm_kv_cache_reset(tdm_kv_cache *c) {
  TDM__NONNULL(c, , "tdm_kv_cache_reset: the cache is NULL");
  c->pos = 0;
}
int64_t tdm_kv_cache_len(const tdm_kv_cache *c) {
  TDM__NONNULL(c, 0, "tdm_kv_cache_len: the cache is NULL");
  return c->pos;
}
int64_t tdm_kv_cache_capacity(const tdm_kv_cache *c) {
  TDM__NONNULL(c, 0, "tdm_kv_cache_capacity: the cache is NULL");
  return c->block;
}

static float *W(tdm_tensor *t) { return t ? (float *)t->data : NULL; }

/* One query row q (hs) of head hd against the cached keys and values of its key/value head at
 * positions 0..pos: a numerically stable softmax, the weighted sum into o (hs). */
static void attend(tdm_kv_cache *c, const float *q, const float *K, const float *Vv, int64_t g, int64_t pos, float *o) {
  int64_t hs = c->C / c->NH, KV = c->KV;
  float scale = 1.0f / sqrtf((float)hs), mx = -INFINITY, sum = 0;
  for (int64_t t = 0; t <= pos; t++) {
    const float *kt = K + t * KV + g * hs;
    float s = 0;
    for (int64_t d = 0; d < hs; d++) s += q[d] * kt[d];
    c->att[t] = s * scale;
    if (c->att[t] > mx) mx = c->att[t];
  }
  for (int64_t t = 0; t <= pos; t++) sum += (c->att[t] = expf(c->att[t] - mx));
  for (int64_t d = 0; d < hs; d++) o[d] = 0;
  for (int64_t t = 0; t <= pos; t++) {
    float p = c->att[t] / sum;
    const float *vt = Vv + t * KV + g * hs;
    for (int64_t d = 0; d < hs; d++) o[d] += p * vt[d];
  }
}

/* Llama: RMSNorm, q/k/v projections, rotary embeddings at this position, grouped-query
 * attention over the cache, o; RMSNorm, SwiGLU. */
static void llama_step(tdm_kv_cache *c, int32_t token) {
  tdm_model *m = c->m;
  const tdm_model_config *mc = &m->cfg;
  int64_t C = c->C, NH = c->NH, hs = C / NH, KV = c->KV, NKV = mc->n_kv_head, F = mc->ffn_hidden, pos = c->pos;
  float *q = c->qkv, *kk = c->qkv + C, *vv = kk + KV, *cs = c->rope, *sn = cs + hs / 2;
  memcpy(c->x, W(m->wte.weight) + (int64_t)token * C, sizeof(float) * (size_t)C);
  tdm_k_rope_table(cs, sn, pos, 1, hs, &mc->rope);
  for (int64_t l = 0; l < c->L; l++) {
    tdm_llama_block_mod *b = &m->lblocks[l];
    float *K = c->k + (l * c->block) * KV, *Vv = c->v + (l * c->block) * KV;
    tdm_k_rmsnorm_fwd(c->h, c->stats, c->x, W(b->attn_norm), 1, C, b->eps);
    tdm_k_linear_fwd(q, c->h, W(b->q), NULL, 1, C, C);
    tdm_k_linear_fwd(kk, c->h, W(b->k), NULL, 1, C, KV);
    tdm_k_linear_fwd(vv, c->h, W(b->v), NULL, 1, C, KV);
    tdm_k_rope_fwd(c->att_out, q, cs, sn, 1, 1, NH, hs); /* rotated q into att_out, then back */
    memcpy(q, c->att_out, sizeof(float) * (size_t)C);
    tdm_k_rope_fwd(K + pos * KV, kk, cs, sn, 1, 1, NKV, hs); /* the cache keeps keys rotated */
    memcpy(Vv + pos * KV, vv, sizeof(float) * (size_t)KV);
    for (int64_t hd = 0; hd < NH; hd++) attend(c, q + hd * hs, K, Vv, hd / (NH / NKV), pos, c->att_out + hd * hs);
    tdm_k_linear_fwd(c->h, c->att_out, W(b->o), NULL, 1, C, C);
    for (int64_t i = 0; i < C; i++) c->x[i] += c->h[i];
    tdm_k_rmsnorm_fwd(c->h, c->stats, c->x, W(b->mlp_norm), 1, C, b->eps);
    tdm_k_linear_fwd(c->fc, c->h, W(b->gate), NULL, 1, C, F);
    tdm_k_linear_fwd(c->fc + F, c->h, W(b->up), NULL, 1, C, F);
    tdm_k_swiglu_fwd(c->fc, c->fc, c->fc + F, F);
    tdm_k_linear_fwd(c->h, c->fc, W(b->down), NULL, 1, F, C);
    for (int64_t i = 0; i < C; i++) c->x[i] += c->h[i];
  }
  tdm_k_rmsnorm_fwd(c->h, c->stats, c->x, W(m->norm), 1, C, mc->norm_eps);
  tdm_k_linear_fwd(c->logits, c->h, W(m->lm_head), NULL, 1, C, mc->vocab_size);
}

tdm_status tdm_kv_cache_step(tdm_kv_cache *c, int32_t token, const float **logits) {
  if (!c || !logits) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_kv_cache_step: %s is NULL", !c ? "the cache" : "logits");
  tdm_model *m = c->m;
  int64_t C = c->C, NH = c->NH, hs = C / NH, pos = c->pos, V = m->cfg.vocab_size;
  if (pos >= c->block)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "generate: the context is full (%lld positions); it holds %lld tokens",
                          (long long)c->block, (long long)pos);
  if (token < 0 || token >= V)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "generate: token %d is outside the vocabulary [0, %lld)", token, (long long)V);
  if (m->cfg.kind == TDM_MODEL_LLAMA) {
    llama_step(c, token);
    c->pos++;
    *logits = c->logits;
    return TDM_OK;
  }
  const float *wte = W(m->wte.weight), *wpe = W(m->wpe.weight);
  for (int64_t i = 0; i < C; i++) c->x[i] = wte[(int64_t)token * C + i] + wpe[pos * C + i];
  for (int64_t l = 0; l < c->L; l++) {
    tdm_block_mod *b = &m->blocks[l];
    tdm_k_layernorm_fwd(c->h, c->stats, c->stats + 1, c->x, W(b->ln_1.weight), W(b->ln_1.bias), 1, C, b->ln_1.eps);
    tdm_k_linear_fwd(c->qkv, c->h, W(b->c_attn.weight), W(b->c_attn.bias), 1, C, 3 * C);
    float *K = c->k + (l * c->block) * C, *Vv = c->v + (l * c->block) * C;
    memcpy(K + pos * C, c->qkv + C, sizeof(float) * (size_t)C);
    memcpy(Vv + pos * C, c->qkv + 2 * C, sizeof(float) * (size_t)C);
    for (int64_t hd = 0; hd < NH; hd++) attend(c, c->qkv + hd * hs, K, Vv, hd, pos, c->att_out + hd * hs);
    tdm_k_linear_fwd(c->h, c->att_out, W(b->attn_proj.weight), W(b->attn_proj.bias), 1, C, C);
    for (int64_t i = 0; i < C; i++) c->x[i] += c->h[i];
    tdm_k_layernorm_fwd(c->h, c->stats, c->stats + 1, c->x, W(b->ln_2.weight), W(b->ln_2.bias), 1, C, b->ln_2.eps);
    tdm_k_linear_fwd(c->fc, c->h, W(b->c_fc.weight), W(b->c_fc.bias), 1, C, 4 * C);
    tdm_k_gelu_fwd(c->fc, c->fc, 4 * C);
    tdm_k_linear_fwd(c->h, c->fc, W(b->mlp_proj.weight), W(b->mlp_proj.bias), 1, 4 * C, C);
    for (int64_t i = 0; i < C; i++) c->x[i] += c->h[i];
  }
  tdm_k_layernorm_fwd(c->h, c->stats, c->stats + 1, c->x, W(m->ln_f.weight), W(m->ln_f.bias), 1, C, m->ln_f.eps);
  tdm_k_linear_fwd(c->logits, c->h, wte, NULL, 1, C, V); /* lm_head tied to wte */
  c->pos++;
  *logits = c->logits;
  return TDM_OK;
}

int32_t tdm_sample_token(const float *logits, int64_t V, float temperature, int top_k, tdm_rng *rng) {
  TDM__NONNULL(logits, -1, "tdm_sample_token: the logits are NULL");
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  if (top_k == 1 || temperature <= 0) return (int32_t)best; /* greedy */
  TDM__NONNULL(rng, -1, "tdm_sample_token: the generator rng is NULL (sampling needs it; greedy does not)");
  /* keep the top_k largest logits (all when top_k <= 0), softmax at the temperature, draw */
  float kth = -INFINITY;
  if (top_k > 0 && top_k < V) { /* the k-th largest value: k passes of a running threshold */
    float hi = INFINITY;
    for (int k = 0; k < top_k; k++) {
      float m = -INFINITY;
      for (int64_t i = 0; i < V; i++)
        if (logits[i] < hi && logits[i] > m) m = logits[i];
      hi = m;
    }
    kth = hi;
  }
  double sum = 0;
  for (int64_t i = 0; i < V; i++)
    if (logits[i] >= kth) sum += exp((double)(logits[i] - logits[best]) / temperature);
  double u = (double)tdm_rng_uniform(rng) * sum, acc = 0;
  for (int64_t i = 0; i < V; i++)
    if (logits[i] >= kth) {
      acc += exp((double)(logits[i] - logits[best]) / temperature);
      if (acc >= u) return (int32_t)i;
    }
  return (int32_t)best;
}
