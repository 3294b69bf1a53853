/* GPT's blocks split over the tensor axis (see tp_model.h): c_attn column-parallel (this rank's
 * heads, the same rows of q, k and v), attention over those heads, c_proj row-parallel, then g and
 * the replicated bias; c_fc column-parallel, GELU, the MLP's c_proj row-parallel. */
#include "parallel/tp_model_impl.h"

enum { LN1_W, LN1_B, ATTN_W, ATTN_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, N_LEAF };
enum { WTE, WPE, LNF_W, LNF_B };

static const char *const leaf[N_LEAF] = {"ln_1.weight",     "ln_1.bias",     "attn.c_attn.weight", "attn.c_attn.bias",
                                         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",   "ln_2.bias",
                                         "mlp.c_fc.weight", "mlp.c_fc.bias",  "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* The token embedding's rows summed over the ranks, plus the position embedding, dropout. */
static tdm_tensor *embed(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *ids) {
  tdm_tensor *h = tdm__tp_lookup(g, tp, g->top[WTE], ids);
  return tdm_dropout(tp, tdm_add(tp, h, tdm_slice(tp, g->top[WPE], 0, 0, tdm_tensor_dim(ids, 1))), g->cfg.dropout);
}

static tdm_tensor *block(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *h, int64_t l) {
  tdm_tensor **b = tdm__tp_block(g, l);
  int heads = (int)(g->cfg.n_head / g->T);
  tdm_tensor *a = tdm__tp_copy(tp, &g->comm, tdm_layernorm(tp, h, b[LN1_W], b[LN1_B], 1e-5f));
  a = tdm_attention(tp, tdm_linear(tp, a, b[ATTN_W], b[ATTN_B]), heads);
  h = tdm__tp_join(g, tp, h, tdm_linear(tp, a, b[PROJ_W], NULL), b[PROJ_B]);
  tdm_tensor *m = tdm__tp_copy(tp, &g->comm, tdm_layernorm(tp, h, b[LN2_W], b[LN2_B], 1e-5f));
  m = tdm_gelu(tp, tdm_linear(tp, m, b[FC_W], b[FC_B]));
  return tdm__tp_join(g, tp, h, tdm_linear(tp, m, b[MPROJ_W], NULL), b[MPROJ_B]);
}

static tdm_tensor *final_norm(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *h) {
  return tdm_layernorm(tp, h, g->top[LNF_W], g->top[LNF_B], 1e-5f);
}

const tdm__tp_kind tdm__tp_gpt_kind = {
    .kind = TDM_MODEL_GPT,
    .top = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"},
    .n_top = 4,
    .n_required = 4,
    .head = WTE, /* tied */
    .block = "transformer.h.%lld.",
    .leaf = leaf,
    .n_leaf = N_LEAF,
    .embed = embed,
    .block_fn = block,
    .final_norm = final_norm,
};
