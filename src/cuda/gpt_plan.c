/* The CUDA GPT's memory plan (gpt_plan.h): pure arithmetic, built with or without the CUDA backend. */
#include "cuda/gpt_plan.h"

#include "core/internal.h"
#include "cuda/cuda_kernels.h"

/* The flash kernel's templates (flash_attention.cu): head sizes 16, 32, 64, 128; B NH is the second
 * axis of its grid. Here, not in the .cu file, so that a plan can ask without a device. */
int tdm_cu_flash_supported(int64_t hs, int64_t BH) {
  return (hs == 16 || hs == 32 || hs == 64 || hs == 128) && BH >= 1 && BH <= 65535;
}

static int64_t take(int64_t *at, int64_t n) {
  int64_t o = *at;
  *at += (n + 63) / 64 * 64;
  return o;
}

void tdm__cuda_gpt_plan_arena(const tdm_model_config *mc, int64_t B, int64_t T, int prec, tdm__cuda_arena_plan *ap,
                              tdm__cuda_layer_acts *la) {
  int64_t N = B * T, C = mc->n_embd, V = mc->vocab_size, NH = mc->n_head, at = 0;
  int bf = prec == TDM_CUDA_BF16;
#define H(n) (bf ? ((n) + 1) / 2 : (n)) /* a product's input: bf16 (two per float) under bf16 */
  int64_t att = bf ? B * NH * T : B * NH * T * T;
  ap->n_layer = mc->n_layer;
  ap->enc = take(&at, N * C);
  for (int64_t l = 0; l < mc->n_layer; l++) {
    tdm__cuda_layer_acts a;
    a.ln1 = take(&at, H(N * C)), a.ln1_mean = take(&at, N), a.ln1_rstd = take(&at, N);
    a.qkvr = take(&at, 3 * N * C), a.att = take(&at, att); /* q, k, v by head: what backward reads */
    a.atty = take(&at, H(N * C)), a.res2 = take(&at, N * C);
    a.ln2 = take(&at, H(N * C)), a.ln2_mean = take(&at, N), a.ln2_rstd = take(&at, N);
    a.fch = take(&at, 4 * N * C), a.fchg = take(&at, H(4 * N * C)), a.res3 = take(&at, N * C);
    if (la) la[l] = a;
  }
  ap->lnf = take(&at, H(N * C)), ap->lnf_mean = take(&at, N), ap->lnf_rstd = take(&at, N);
  ap->logits = take(&at, N * V), ap->losses = take(&at, N), ap->loss = take(&at, 1);
  ap->qkv = take(&at, 3 * N * C), ap->proj = take(&at, N * C), ap->y = take(&at, bf ? 0 : N * C); /* scratch of forward */
  ap->dres = take(&at, N * C), ap->dbuf4 = take(&at, 4 * N * C), ap->dln = take(&at, N * C);
  ap->datt = take(&at, att), ap->dqkvr = take(&at, bf ? 0 : 3 * N * C), ap->dy = take(&at, bf ? 0 : N * C);
  ap->dqkv = take(&at, 3 * N * C);
  /* bf16: the gradient a product's backward reads, rounded (the largest: the logits') */
  ap->dybf = take(&at, bf ? H(N * (V > 4 * C ? V : 4 * C)) : 0);
  ap->sumsq = take(&at, 2 * (TDM_CU_SUMSQ_BLOCKS + 1)); /* doubles */
  ap->idx = take(&at, N), ap->tgt = take(&at, N);         /* int32 */
  ap->total = at;
#undef H
}

tdm_status tdm__cuda_gpt_check(const tdm_model_config *mc, int64_t B, int64_t T, int prec) {
  if (prec != TDM_CUDA_FP32 && prec != TDM_CUDA_TF32 && prec != TDM_CUDA_BF16)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt: precision %d; expected TDM_CUDA_FP32 (0), TDM_CUDA_TF32 (1) "
                                               "or TDM_CUDA_BF16 (2)", prec);
  if (!mc || mc->kind != TDM_MODEL_GPT)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "cuda gpt: model %s; the CUDA backend trains GPT only",
                          mc ? tdm_model_kind_name(mc->kind) : "NULL");
  if (mc->dropout != 0.0f)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "cuda gpt: dropout %g; the CUDA backend has no dropout yet (use 0)",
                          (double)mc->dropout);
  if (mc->n_layer <= 0 || mc->n_head <= 0 || mc->n_embd <= 0 || mc->n_embd % mc->n_head || mc->vocab_size <= 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt: layers %lld, heads %lld, width %lld, vocab %lld",
                          (long long)mc->n_layer, (long long)mc->n_head, (long long)mc->n_embd, (long long)mc->vocab_size);
  if (B < 1 || T < 1 || T > mc->block_size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt: batch %lld x %lld tokens; expected B >= 1, 1 <= T <= block %lld",
                          (long long)B, (long long)T, (long long)mc->block_size);
  if (prec == TDM_CUDA_BF16 && !tdm_cu_flash_supported(mc->n_embd / mc->n_head, B * mc->n_head))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "cuda gpt: bf16 runs the fused attention kernel, which takes head sizes "
                                                 "16, 32, 64 or 128 and batch x heads <= 65535; this model has head size %lld "
                                                 "and %lld x %lld (use fp32 or --tf32)",
                          (long long)(mc->n_embd / mc->n_head), (long long)B, (long long)mc->n_head);
  return TDM_OK;
}

int64_t tdm__cuda_gpt_numel(const tdm_model_config *mc) {
  int64_t C = mc->n_embd, L = mc->n_layer;
  return mc->vocab_size * C + mc->block_size * C + L * (12 * C * C + 13 * C) + 2 * C;
}

tdm_status tdm_cuda_gpt_plan_bytes(const tdm_model_config *mc, int64_t B, int64_t T, int precision, tdm_cuda_gpt_plan *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt plan: NULL argument");
  TDM__TRY(tdm__cuda_gpt_check(mc, B, T, precision));
  tdm__cuda_arena_plan ap;
  tdm__cuda_gpt_plan_arena(mc, B, T, precision, &ap, NULL);
  int64_t np = tdm__cuda_gpt_numel(mc);
  out->params = out->grads = (size_t)np * 4;
  out->adam = (size_t)np * 8;
  out->weights_bf16 = precision == TDM_CUDA_BF16 ? (size_t)np * 2 : 0;
  out->activations = (size_t)ap.total * 4;
  out->total = out->params + out->grads + out->adam + out->weights_bf16 + out->activations;
  return TDM_OK;
}

