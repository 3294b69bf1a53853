/* The simulator's model: every parameter tensor with the compute charged to it, the buckets (or
 * ZeRO units) tandem's layout cuts, a pipeline's chunks and schedule. FLOPs of a micro-batch of B
 * samples (T tokens each for the language models, 1 for the MLP), forward; backward is twice:
 *   a matrix of k elements          2 k per token (a linear layer's multiply-adds)
 *   a vector (bias, norm) of k      5 k per token
 *   an embedding table              nothing (a lookup), but a tied output head: 2 V C per token
 *   attention, per block            4 T C per token (Q K^T and the weighted sum), charged to the
 *                                   block's query projection
 * which are tdm_plan_gpt_costs' terms (a pipeline's chunks are charged by tdm_plan_layer_costs, GPT's
 * or Llama's, as the partitioner cuts them). */
#include <string.h>

#include "core/internal.h"
#include "parallel/tp_model.h"
#include "sim/sim_impl.h"

static int ends_with(const char *s, const char *t) {
  size_t a = strlen(s), b = strlen(t);
  return a >= b && !strcmp(s + a - b, t);
}

void tdm_sim_model_destroy(tdm_sim_model *m) {
  if (!m) return;
  if (m->has_layout) tdm__layout_free(&m->L);
  if (m->has_pl) tdm__pp_layout_free(&m->PL);
  tdm__free(m->numel), tdm__free(m->fwd), tdm__free(m->chunk_fwd), tdm__free(m->chunk_params), tdm__free(m->times);
  tdm__free(m);
}

int64_t tdm_sim_model_params(const tdm_sim_model *m) { return m ? m->n_params : 0; }
double tdm_sim_model_flops(const tdm_sim_model *m) { return m ? 3 * m->fwd_total : 0; }

static tdm_status alloc_tensors(tdm_sim_model *m, int n) {
  m->n_t = n;
  m->numel = tdm__calloc((size_t)(n ? n : 1), sizeof(int64_t));
  m->fwd = tdm__calloc((size_t)(n ? n : 1), sizeof(double));
  m->times = tdm__calloc((size_t)(2 * n + 2), sizeof(double));
  if (!m->numel || !m->fwd || !m->times) return tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
  return TDM_OK;
}

/* Pipeline: the engine's cut and verified schedule, each chunk's FLOPs by the planner's costs. */
static tdm_status pipeline_of(tdm_sim_model *m, const tdm_plan_config *pc, const tdm_params *params, int64_t tokens) {
  tdm_engine_config ec = pc->engine;
  if (!ec.pp.seq_len) ec.pp.seq_len = pc->seq_len; /* the cut the engine makes for this length */
  TDM__TRY(tdm__pp_layout_make(&pc->model, &ec, pc->pipeline, &m->PL));
  m->has_pl = 1;
  int C = m->PL.C;
  m->chunk_fwd = tdm__calloc((size_t)C, sizeof(double));
  m->chunk_params = tdm__calloc((size_t)C, sizeof(int64_t));
  if (!m->chunk_fwd || !m->chunk_params) return tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
  double ce, cb, ch;
  int64_t T = pc->seq_len > 0 ? pc->seq_len : pc->model.block_size;
  tdm_plan_layer_costs(&pc->model, T, &ce, &cb, &ch);
  int64_t lo_prev = 0;
  for (int c = 0; c < C; c++) {
    int nb = m->PL.first_block[c + 1] - m->PL.first_block[c];
    m->chunk_fwd[c] = (double)tokens * (nb * cb + (c == 0 ? ce : 0) + (c == C - 1 ? ch : 0));
    int64_t hi = tdm_params_numel(params);
    if (c + 1 < C) {
      char name[64];
      if (pc->model.kind == TDM_MODEL_LLAMA) snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", m->PL.first_block[c + 1]);
      else snprintf(name, sizeof name, "transformer.h.%d.ln_1.weight", m->PL.first_block[c + 1]);
      const tdm_tensor *t = tdm_params_find(params, name);
      for (int i = 0; t && i < tdm_params_count(params); i++)
        if (tdm_params_get(params, i) == t) hi = tdm_params_offset(params, i);
    }
    m->chunk_params[c] = hi - lo_prev;
    lo_prev = hi;
  }
  return TDM_OK;
}

tdm_status tdm_sim_model_create(tdm_sim_model **out, const tdm_plan_config *pc) {
  if (!out || !pc) return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: NULL argument");
  *out = NULL;
  const tdm_model_config *mc = &pc->model;
  if (mc->kind != TDM_MODEL_MLP && mc->kind != TDM_MODEL_GPT && mc->kind != TDM_MODEL_LLAMA)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "simulate: the %s model: its compute per layer is not described yet (mlp, gpt and llama are)",
                          tdm_model_kind_name(mc->kind));
  if (pc->engine.kind == TDM_ENGINE_PS)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "simulate: the parameter server (--ps-servers) is not simulated; data "
                          "parallelism, --zero, --tp and --pp are");
  if (pc->engine.kind == TDM_ENGINE_DP && pc->engine.dp.compress)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "simulate: --compress %s is not simulated (none, bf16 and fp16 are)",
                          pc->engine.dp.compress);
  tdm_sim_model *m = tdm__calloc(1, sizeof *m);
  if (!m) return tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
  m->engine = pc->engine.kind;
  m->stage = m->engine == TDM_ENGINE_ZERO ? pc->engine.zero.stage : 0;
  m->tp = pc->tensor > 1 ? pc->tensor : 1;
  m->pp = pc->pipeline > 1 ? pc->pipeline : 1;
  m->accum = pc->engine.accum > 1 ? pc->engine.accum : 1;
  m->no_overlap = pc->engine.dp.no_overlap;
  m->prefetch = pc->engine.zero.prefetch;
  m->wire = pc->engine.dp.wire_dtype == TDM_BF16 || pc->engine.dp.wire_dtype == TDM_F16 ? 2 : 4;
  int lm = mc->kind != TDM_MODEL_MLP;
  int64_t T = lm ? (pc->seq_len > 0 ? pc->seq_len : mc->block_size) : 1, tokens = pc->batch * T;
  int tied = mc->kind == TDM_MODEL_GPT || (mc->kind == TDM_MODEL_LLAMA && mc->tie_embeddings);
  tdm_model *model = NULL;
  tdm_status st = tdm_model_create_with(&model, mc, 0, TDM_RESERVE_DATA | TDM_RESERVE_GRAD); /* address space only */
  tdm_params *params = model ? tdm_model_params(model) : NULL;
  if (st == TDM_OK) st = alloc_tensors(m, tdm_params_count(params));
  for (int i = 0; st == TDM_OK && i < m->n_t; i++) {
    const tdm_tensor *t = tdm_params_get(params, i);
    const char *name = tdm_tensor_name(t);
    int64_t k = tdm_tensor_numel(t);
    m->numel[i] = k;
    m->n_params += k;
    double f;
    if (ends_with(name, "wte.weight") || ends_with(name, "embed_tokens.weight") || ends_with(name, "wpe.weight")) f = 0;
    else if (tdm_tensor_ndim(t) >= 2) f = 2.0 * (double)k * (double)tokens;
    else f = 5.0 * (double)k * (double)tokens;
    if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "self_attn.q_proj.weight"))
      f += 4.0 * (double)T * (double)mc->n_embd * (double)tokens;
    m->fwd[i] = f;
    m->fwd_total += f;
  }
  if (st == TDM_OK && tied) {
    m->head = 2.0 * (double)mc->vocab_size * (double)mc->n_embd * (double)tokens;
    m->fwd_total += m->head;
  }
  m->act_bytes = lm ? 4.0 * (double)tokens * (double)mc->n_embd : 0;
  m->tp_allreduces = (int)(4 * mc->n_layer + 2); /* two per block each way, the embedding's and the head's */
  if (st == TDM_OK && m->tp > 1) st = tdm__tp_check(mc, m->tp);
  if (st == TDM_OK && m->pp == 1) { /* buckets (dp, zero 1-2) or units (zero 3), as the engines cut them */
    int units = m->stage == 3;
    size_t bb = m->engine == TDM_ENGINE_ZERO ? pc->engine.zero.bucket_bytes : pc->engine.dp.bucket_bytes;
    st = tdm__layout_make(&m->L, params, units, bb, m->engine == TDM_ENGINE_ZERO ? 0 : pc->engine.dp.first_bucket_bytes,
                          pc->engine.zero.unit_modules, 1, m->engine == TDM_ENGINE_ZERO);
    m->has_layout = st == TDM_OK;
    if (st == TDM_OK) {
      tdm__free(m->times);
      if (!(m->times = tdm__calloc((size_t)(4 * m->L.ng + 2), sizeof(double))))
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
    }
  }
  if (st == TDM_OK && m->pp > 1) st = pipeline_of(m, pc, params, tokens);
  tdm_model_destroy(model);
  if (st != TDM_OK) {
    tdm_sim_model_destroy(m);
    return st;
  }
  *out = m;
  return TDM_OK;
}

tdm_status tdm_sim_model_custom(tdm_sim_model **out, int n, const int64_t *params, const double *fwd, size_t bucket_bytes,
                                size_t first_bytes, int overlap_off) {
  if (!out || n < 1 || !params || !fwd) return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: custom model: NULL or %d layers", n);
  *out = NULL;
  for (int i = 0; i < n; i++)
    if (!(fwd[i] >= 0 && fwd[i] < 1e30) || params[i] < 1) /* a NaN or negative cost made a NaN or negative step */
      return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: custom model: layer %d has %lld parameters and %g forward FLOP; expected "
                            ">= 1 and a finite count >= 0", i, (long long)params[i], fwd[i]);
  if (bucket_bytes > ((size_t)1 << 50) || first_bytes > ((size_t)1 << 50))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: custom model: buckets of %zu bytes, the first %zu; expected at most 2^50 "
                          "(0: the default)", bucket_bytes, first_bytes);
  tdm_sim_model *m = tdm__calloc(1, sizeof *m);
  if (!m) return tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
  m->engine = TDM_ENGINE_DP, m->tp = m->pp = 1, m->accum = 1, m->no_overlap = overlap_off, m->wire = 4;
  tdm_params *p = NULL;
  tdm_status st = alloc_tensors(m, n);
  if (st == TDM_OK) st = tdm_params_create(&p);
  for (int i = 0; st == TDM_OK && i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%d.weight", i);
    int64_t shape[1] = {params[i]};
    tdm_tensor *t;
    st = tdm_params_declare(p, name, 1, shape, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &t);
    m->numel[i] = params[i], m->fwd[i] = fwd[i], m->n_params += params[i], m->fwd_total += fwd[i];
  }
  if (st == TDM_OK) st = tdm_params_finalize_reserved(p, 0, TDM_RESERVE_DATA | TDM_RESERVE_GRAD);
  if (st == TDM_OK) st = tdm__layout_make(&m->L, p, 0, bucket_bytes, first_bytes, 1, 1, 0);
  m->has_layout = st == TDM_OK;
  if (st == TDM_OK) {
    tdm__free(m->times);
    if (!(m->times = tdm__calloc((size_t)(4 * m->L.ng + 2), sizeof(double)))) st = tdm__set_error(TDM_ERR_NO_MEMORY, "simulate: out of memory");
  }
  tdm_params_destroy(p);
  if (st != TDM_OK) {
    tdm_sim_model_destroy(m);
    return st;
  }
  *out = m;
  return TDM_OK;
}

const double *tdm_sim_last_buckets(const tdm_sim_model *m, int *n) {
  if (n) *n = m ? m->n_times : 0;
  return m && m->n_times ? m->times : NULL;
}
