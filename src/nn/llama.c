/* The Llama architecture (Meta's Llama 2/3, as Hugging Face's LlamaForCausalLM): token embedding,
 * decoder layers of RMSNorm, grouped-query attention with rotary position embeddings and a SwiGLU
 * MLP, a final RMSNorm and an output head, untied or tied to the embedding. No biases. Parameter
 * names are Hugging Face's, so weights move to and from the PyTorch world unchanged. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "autograd/tape_impl.h"
#include "tandem/trace.h"
#include "nn/model_impl.h"

tdm_status tdm_model_config_llama(const char *name, tdm_model_config *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_model_config_llama: out is NULL");
  if (name && strcmp(name, "llama-mini") && strcmp(name, "llama3.2-1B"))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "llama: config '%s'; expected llama-mini or llama3.2-1B", name);
  tdm_model_config c = {0};
  c.kind = TDM_MODEL_LLAMA;
  c.norm_eps = 1e-5f;
  if (name && !strcmp(name, "llama3.2-1B")) { /* Meta's config.json for Llama-3.2-1B */
    c.n_layer = 16, c.n_head = 32, c.n_kv_head = 8, c.n_embd = 2048, c.ffn_hidden = 8192;
    c.block_size = 131072, c.vocab_size = 128256;
    c.rope = (tdm_rope_config){500000.0f, 32.0f, 1.0f, 4.0f, 8192};
    c.tie_embeddings = 1;
  } else { /* GPT mini's size: the same width, depth and context, about as many parameters */
    c.n_layer = 4, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 256, c.ffn_hidden = 688;
    c.block_size = 128, c.vocab_size = 256;
    c.rope = (tdm_rope_config){10000.0f, 0.0f, 0.0f, 0.0f, 0};
    c.tie_embeddings = 0;
  }
  *out = c;
  return TDM_OK;
}

tdm_status tdm__llama_check(const tdm_model_config *c) {
  if (c->n_layer <= 0 || c->n_head <= 0 || c->n_kv_head <= 0 || c->n_embd <= 0 || c->ffn_hidden <= 0 ||
      c->block_size <= 0 || c->vocab_size <= 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "llama: layers %lld, heads %lld, key/value heads %lld, width %lld, SwiGLU width %lld, block %lld, vocab %lld; expected all > 0",
                          (long long)c->n_layer, (long long)c->n_head, (long long)c->n_kv_head, (long long)c->n_embd,
                          (long long)c->ffn_hidden, (long long)c->block_size, (long long)c->vocab_size);
  if (c->n_embd % c->n_head)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "llama: %lld heads do not divide the width %lld", (long long)c->n_head,
                          (long long)c->n_embd);
  if (c->n_head % c->n_kv_head)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "llama: %lld key/value heads do not divide the %lld query heads (each group of query heads shares one key/value head)",
                          (long long)c->n_kv_head, (long long)c->n_head);
  if ((c->n_embd / c->n_head) % 2)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "llama: the head size %lld (width %lld / %lld heads) is odd; rotary embeddings rotate pairs, so it must be even",
                          (long long)(c->n_embd / c->n_head), (long long)c->n_embd, (long long)c->n_head);
  const tdm_rope_config *r = &c->rope;
  if (!(r->theta > 1.0f) || !isfinite(r->theta))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "llama: rope theta %g; expected a finite value > 1", (double)r->theta);
  if (r->factor != 0 && !(r->factor >= 1.0f && r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
                          r->original_max_pos > 0))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "llama: rope scaling factor %g, low %g, high %g, original context %lld; expected factor >= 1, 0 < low < high, context > 0 (or factor 0: none)",
                          (double)r->factor, (double)r->low_freq_factor, (double)r->high_freq_factor,
                          (long long)r->original_max_pos);
  if (!(c->norm_eps >= 0.0f) || !isfinite(c->norm_eps))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "llama: RMSNorm eps %g; expected a finite value >= 0", (double)c->norm_eps);
  return TDM_OK;
}

static tdm_status declare(tdm_params *p, const char *prefix, const char *leaf, int ndim, const int64_t *shape,
                          tdm_init init, int decay, tdm_tensor **out) {
  char name[256];
  if ((size_t)snprintf(name, sizeof name, "%s.%s", prefix, leaf) >= sizeof name)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "parameter name '%s.%s' is longer than 255 bytes", prefix, leaf);
  return tdm_params_declare(p, name, ndim, shape, init, decay, out);
}

/* Hugging Face's initialisation: N(0, 0.02) for every matrix, ones for the norms. Declared in the
 * order forward uses them (the order backward finishes their gradients, reversed). */
tdm_status tdm_llama_block_mod_init(tdm_llama_block_mod *m, tdm_params *p, const char *prefix,
                                    const tdm_model_config *c) {
  if (!m || !prefix || !c)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_llama_block_mod_init: %s is NULL",
                          !m ? "the module m" : !prefix ? "the prefix" : "the config c");
  int64_t C = c->n_embd, hs = C / c->n_head, KV = c->n_kv_head * hs, F = c->ffn_hidden;
  tdm_init w = {TDM_INIT_NORMAL, 0.0f, 0.02f}, one = {TDM_INIT_ONES, 0, 0};
  int64_t sc[1] = {C}, sq[2] = {C, C}, skv[2] = {KV, C}, so[2] = {C, C}, sf[2] = {F, C}, sd[2] = {C, F};
  TDM__TRY(declare(p, prefix, "input_layernorm.weight", 1, sc, one, 0, &m->attn_norm));
  TDM__TRY(declare(p, prefix, "self_attn.q_proj.weight", 2, sq, w, 1, &m->q));
  TDM__TRY(declare(p, prefix, "self_attn.k_proj.weight", 2, skv, w, 1, &m->k));
  TDM__TRY(declare(p, prefix, "self_attn.v_proj.weight", 2, skv, w, 1, &m->v));
  TDM__TRY(declare(p, prefix, "self_attn.o_proj.weight", 2, so, w, 1, &m->o));
  TDM__TRY(declare(p, prefix, "post_attention_layernorm.weight", 1, sc, one, 0, &m->mlp_norm));
  TDM__TRY(declare(p, prefix, "mlp.gate_proj.weight", 2, sf, w, 1, &m->gate));
  TDM__TRY(declare(p, prefix, "mlp.up_proj.weight", 2, sf, w, 1, &m->up));
  TDM__TRY(declare(p, prefix, "mlp.down_proj.weight", 2, sd, w, 1, &m->down));
  m->n_head = (int)c->n_head;
  m->n_kv_head = (int)c->n_kv_head;
  m->eps = c->norm_eps;
  m->dropout = c->dropout;
  m->rope = c->rope;
  return TDM_OK;
}

tdm_tensor *tdm_llama_block_mod_forward(tdm_tape *tp, const tdm_llama_block_mod *m, tdm_tensor *x) {
  if (!m) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "tdm_llama_block_mod_forward: the module m is NULL");
  tdm_tensor *h = tdm_rmsnorm(tp, x, m->attn_norm, m->eps);
  tdm_tensor *q = tdm_rope(tp, tdm_linear(tp, h, m->q, NULL), m->n_head, &m->rope, 0);
  tdm_tensor *k = tdm_rope(tp, tdm_linear(tp, h, m->k, NULL), m->n_kv_head, &m->rope, 0);
  tdm_tensor *a = tdm_attention_gqa(tp, q, k, tdm_linear(tp, h, m->v, NULL), m->n_head, m->n_kv_head);
  x = tdm_add(tp, x, tdm_dropout(tp, tdm_linear(tp, a, m->o, NULL), m->dropout));
  h = tdm_rmsnorm(tp, x, m->mlp_norm, m->eps);
  h = tdm_swiglu(tp, tdm_linear(tp, h, m->gate, NULL), tdm_linear(tp, h, m->up, NULL));
  return tdm_add(tp, x, tdm_dropout(tp, tdm_linear(tp, h, m->down, NULL), m->dropout));
}

tdm_status tdm__llama_build(tdm_model *m) {
  const tdm_model_config *c = &m->cfg;
  tdm_params *p = m->params;
  int64_t emb[2] = {c->vocab_size, c->n_embd}, nc[1] = {c->n_embd};
  TDM__TRY(tdm_params_declare(p, "model.embed_tokens.weight", 2, emb, (tdm_init){TDM_INIT_NORMAL, 0.0f, 0.02f}, 1,
                              &m->wte.weight));
  m->lblocks = tdm__calloc((size_t)c->n_layer, sizeof *m->lblocks);
  if (!m->lblocks) return tdm__set_error(TDM_ERR_NO_MEMORY, "llama: out of memory");
  char name[64];
  for (int64_t l = 0; l < c->n_layer; l++) {
    snprintf(name, sizeof name, "model.layers.%lld", (long long)l);
    TDM__TRY(tdm_llama_block_mod_init(&m->lblocks[l], p, name, c));
  }
  TDM__TRY(tdm_params_declare(p, "model.norm.weight", 1, nc, (tdm_init){TDM_INIT_ONES, 0, 0}, 0, &m->norm));
  if (c->tie_embeddings) {
    m->lm_head = m->wte.weight;
    return TDM_OK;
  }
  return tdm_params_declare(p, "lm_head.weight", 2, emb, (tdm_init){TDM_INIT_NORMAL, 0.0f, 0.02f}, 1, &m->lm_head);
}

/* A decoder layer as tdm_checkpoint runs it (activation recomputation: the tape says when). */
static tdm_tensor *block_fn(tdm_tape *tp, tdm_tensor *x, const void *ctx) { return tdm_llama_block_mod_forward(tp, ctx, x); }

static tdm_tensor *block(tdm_tape *tp, const tdm_llama_block_mod *b, tdm_tensor *x) {
  if (tdm_tape_recompute(tp) != TDM_RECOMPUTE_BLOCK) return tdm_llama_block_mod_forward(tp, b, x);
  tdm_tensor *ps[9] = {b->attn_norm, b->q, b->k, b->v, b->o, b->mlp_norm, b->gate, b->up, b->down};
  return tdm_checkpoint(tp, block_fn, b, x, 9, ps);
}

/* Dropout masks are keyed by the call's number in the step, as GPT's (models.c): the embedding's
 * is call 0, layer l's two are 1 + 2l and 2 + 2l, however the layers are spread over stages. */
tdm_tensor *tdm_llama_forward_range(tdm_model *m, tdm_tape *tp, tdm_tensor *x, tdm_gpt_range *r) {
  TDM__NONNULL(tp, NULL, "llama range: the tape is NULL");
  if (tdm_tape_status(tp) != TDM_OK) return NULL;
  if (!m || !x || !r) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "llama range: %s is NULL", !m ? "the model" : !x ? "the input" : "the range");
  const tdm_model_config *c = &m->cfg;
  if (c->kind != TDM_MODEL_LLAMA || r->first < 0 || r->last < r->first || r->last > c->n_layer)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "llama range: layers [%lld, %lld) of a %s model with %lld layers",
                     (long long)r->first, (long long)r->last, tdm_model_kind_name(c->kind), (long long)c->n_layer);
  tdm_tensor *h = x;
  char b[96];
  if (r->embed) {
    if (x->ndim != 2 || (x->dtype != TDM_I32 && x->dtype != TDM_I64) || x->shape[1] > c->block_size || x->shape[1] < 1)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "llama: input is %s %s; expected (batch, T) i32/i64 token ids with 1 <= T <= block_size",
                       tdm_shape_str(x->ndim, x->shape, b, sizeof b), tdm_dtype_name(x->dtype));
    tp->dropout_calls = 0;
    h = tdm_dropout(tp, tdm_embedding(tp, m->wte.weight, x), c->dropout);
  } else if (x->ndim != 3 || x->dtype != tdm__act_dtype(tp) || x->shape[2] != c->n_embd || x->shape[1] > c->block_size) {
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "llama range: input is %s %s; expected (batch, T, width %lld) %s activations",
                     tdm_shape_str(x->ndim, x->shape, b, sizeof b), tdm_dtype_name(x->dtype), (long long)c->n_embd,
                     tdm_dtype_name(tdm__act_dtype(tp)));
  }
  for (int64_t l = r->first; l < r->last; l++) {
    tp->dropout_calls = (uint64_t)(1 + 2 * l);
    double t0 = tdm_trace_begin();
    tdm__tape_section(tp, (int)l);
    h = block(tp, &m->lblocks[l], h);
    if (t0 > 0) tdm__trace_block(t0, l);
  }
  tdm__tape_section(tp, -1);
  if (!r->head) return h;
  h = tdm_rmsnorm(tp, h, m->norm, c->norm_eps);
  r->head_input = h;
  return tdm_lm_head(tp, h, r->head_weight ? r->head_weight : m->lm_head); /* wte's weight when tied */
}
