/* Llama's decoder layers split over the tensor axis (see tp_model.h). Attention: q_proj column-
 * parallel by query heads, k_proj and v_proj by key/value heads (T divides both, so a rank keeps
 * whole groups: its H/T query heads share its KV/T key/value heads exactly as they do in the whole
 * model), rotary embeddings per local head (a head's rotation depends only on its own dimensions),
 * grouped-query attention over the local heads, o_proj row-parallel, then g. MLP (SwiGLU): gate_proj
 * and up_proj column-parallel by the same units, down_proj row-parallel. The RMSNorms' weights are
 * replicated; no biases. The output head is this rank's rows of lm_head, or of the embedding when
 * tied. */
#include "parallel/tp_model_impl.h"

enum { ATTN_NORM, Q, K, V, O, MLP_NORM, GATE, UP, DOWN, N_LEAF };
enum { EMBED, NORM, LM_HEAD };

static const char *const leaf[N_LEAF] = {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                         "mlp.gate_proj.weight",   "mlp.up_proj.weight",      "mlp.down_proj.weight"};

static tdm_tensor *embed(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *ids) {
  return tdm_dropout(tp, tdm__tp_lookup(g, tp, g->top[EMBED], ids), g->cfg.dropout);
}

static tdm_tensor *block(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *x, int64_t l) {
  const tdm_model_config *c = &g->cfg;
  tdm_tensor **b = tdm__tp_block(g, l);
  int heads = (int)(c->n_head / g->T), kv_heads = (int)(c->n_kv_head / g->T);
  tdm_tensor *h = tdm__tp_copy(tp, &g->comm, tdm_rmsnorm(tp, x, b[ATTN_NORM], c->norm_eps));
  tdm_tensor *q = tdm_rope(tp, tdm_linear(tp, h, b[Q], NULL), heads, &c->rope, 0);
  tdm_tensor *k = tdm_rope(tp, tdm_linear(tp, h, b[K], NULL), kv_heads, &c->rope, 0);
  tdm_tensor *a = tdm_attention_gqa(tp, q, k, tdm_linear(tp, h, b[V], NULL), heads, kv_heads);
  x = tdm__tp_join(g, tp, x, tdm_linear(tp, a, b[O], NULL), NULL);
  h = tdm__tp_copy(tp, &g->comm, tdm_rmsnorm(tp, x, b[MLP_NORM], c->norm_eps));
  h = tdm_swiglu(tp, tdm_linear(tp, h, b[GATE], NULL), tdm_linear(tp, h, b[UP], NULL));
  return tdm__tp_join(g, tp, x, tdm_linear(tp, h, b[DOWN], NULL), NULL);
}

static tdm_tensor *final_norm(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *h) {
  return tdm_rmsnorm(tp, h, g->top[NORM], g->cfg.norm_eps);
}

const tdm__tp_kind tdm__tp_llama_kind = {
    .kind = TDM_MODEL_LLAMA,
    .top = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"},
    .n_top = 3,
    .n_required = 2, /* lm_head only when untied */
    .head = LM_HEAD,
    .block = "model.layers.%lld.",
    .leaf = leaf,
    .n_leaf = N_LEAF,
    .embed = embed,
    .block_fn = block,
    .final_norm = final_norm,
};
