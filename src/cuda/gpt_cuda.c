/* GPT-2 training on one GPU (include/tandem/cuda.h): the forward and backward passes written out
 * on device pointers, llm.c-style, over the kernels of src/cuda/ (.cu files). Parameters, gradients and
 * the AdamW moments are each one device buffer in tdm_params' layout; every activation lives in
 * one arena cut at create (the plan), so a step allocates nothing.
 *
 * Precision: fp32 (as the CPU), TF32 products, or bf16 mixed precision: the activations that feed
 * a product (the layernorms' outputs, attention's output, GELU's output, the loss's gradient) are
 * stored in bf16, the products take bf16 inputs (a bf16 copy of the weights, refreshed after each
 * update) and accumulate and write fp32; attention is the fused flash kernel; the residual
 * stream, the pre-activations, the statistics, the gradients, the master weights and AdamW stay
 * fp32 (PyTorch's autocast makes the same choices, except that it keeps every activation bf16). */
#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "cuda/cuda_kernels.h"
#include "cuda/gpt_plan.h"
#include "tandem/cuda.h"
#include "tandem/tensor.h"

enum { LN_1W, LN_1B, ATTN_W, ATTN_B, PROJ_W, PROJ_B, LN_2W, LN_2B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, NBLOCK_PARAMS };
static const char *block_names[NBLOCK_PARAMS] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};

/* Where a step's device time goes (tdm_cuda_gpt_set_profile): a CUDA event before each group of
 * kernels, tagged with its category; at each phase's end the gaps between successive events are
 * added to the category of the event that opens them. Off: one NULL test per group. */
enum { PR_EMBED, PR_LN, PR_GEMM, PR_ATTN, PR_ELEM, PR_CAST, PR_LOSS, PR_OPT, PR_N, PR_MAX_EVENTS = 1024 };
static const char *pr_names[PR_N] = {"embedding",  "layernorm",   "products (cuBLAS)", "attention",
                                     "bias, GELU, residual, memset", "bf16 casts", "cross-entropy", "optimizer"};
typedef struct {
  int n;
  cudaEvent_t ev[PR_MAX_EVENTS];
  signed char cat[PR_MAX_EVENTS];
  double ms[PR_N];
} gpt_prof;

/* The arena's layout and the plan (src/cuda/gpt_plan.c: computed without a device, for tandem plan too). */
typedef tdm__cuda_layer_acts layer_acts;
typedef tdm__cuda_arena_plan arena_plan;

struct tdm_cuda_gpt {
  tdm_model_config mc;
  int64_t B, T, np;
  float *params, *grads, *adam, *arena; /* device */
  int64_t wte, wpe, lnf_w, lnf_b, *blk; /* parameter offsets; blk: n_layer x NBLOCK_PARAMS */
  int64_t n_runs, *run_lo, *run_hi;      /* spans of one weight-decay flag */
  unsigned char *run_decay;
  arena_plan ap;
  layer_acts *la;
  tdm_cuda_gpt_plan plan;
  int64_t steps;
  int have_grad; /* the last forward had targets: dlogits are in place (bf16: in dybf) */
  int prec;      /* TDM_CUDA_FP32, _TF32 or _BF16 */
  uint16_t *wbf; /* bf16: the weights rounded, what the products read */
  gpt_prof *prof; /* NULL unless profiling */
};

static void mark(tdm_cuda_gpt *g, int cat) {
  gpt_prof *p = g->prof;
  if (!p || p->n >= PR_MAX_EVENTS) return;
  cudaEventRecord(p->ev[p->n], 0);
  p->cat[p->n++] = (signed char)cat;
}
/* closes the phase: waits for its last event and adds the gaps up */
static void prof_flush(tdm_cuda_gpt *g) {
  gpt_prof *p = g->prof;
  if (!p) return;
  mark(g, PR_N);
  if (cudaEventSynchronize(p->ev[p->n - 1]) == cudaSuccess)
    for (int i = 0; i + 1 < p->n; i++) {
      float f = 0;
      if (cudaEventElapsedTime(&f, p->ev[i], p->ev[i + 1]) == cudaSuccess && p->cat[i] < PR_N) p->ms[p->cat[i]] += f;
    }
  p->n = 0;
}

tdm_status tdm_cuda_gpt_set_profile(tdm_cuda_gpt *g, int on) {
  if (!g) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt profile: NULL");
  if (!on && g->prof) {
    for (int i = 0; i < PR_MAX_EVENTS; i++) cudaEventDestroy(g->prof->ev[i]);
    tdm__free(g->prof), g->prof = NULL;
  }
  if (on && !g->prof) {
    gpt_prof *p = tdm__calloc(1, sizeof *p);
    if (!p) return tdm__set_error(TDM_ERR_NO_MEMORY, "cuda gpt profile: out of host memory");
    for (int i = 0; i < PR_MAX_EVENTS; i++)
      if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
        while (i--) cudaEventDestroy(p->ev[i]);
        tdm__free(p);
        return tdm__set_error(TDM_ERR_INTERNAL, "cuda gpt profile: cudaEventCreate failed");
      }
    g->prof = p;
  }
  return TDM_OK;
}

int tdm_cuda_gpt_profile(const tdm_cuda_gpt *g, const char **names, double *ms, int cap) {
  int n = 0;
  for (; g && g->prof && n < PR_N && n < cap; n++) {
    if (names) names[n] = pr_names[n];
    if (ms) ms[n] = g->prof->ms[n];
  }
  return n;
}

static tdm_status param_offset(const tdm_params *p, const char *name, int64_t numel, int64_t *off) {
  for (int i = 0; i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    if (!strcmp(tdm_tensor_name(t), name)) {
      if (tdm_tensor_numel(t) != numel)
        return tdm__set_error(TDM_ERR_MISMATCH, "cuda gpt: parameter %s has %lld elements; expected %lld", name,
                              (long long)tdm_tensor_numel(t), (long long)numel);
      *off = tdm_params_offset(p, i);
      return TDM_OK;
    }
  }
  return tdm__set_error(TDM_ERR_MISMATCH, "cuda gpt: the parameters lack %s", name);
}

static tdm_status alloc_all(tdm_cuda_gpt *g) {
  const char *what[5] = {"the parameters", "the gradients", "the AdamW moments", "the activation arena",
                         "the bf16 weights"};
  size_t bytes[5] = {g->plan.params, g->plan.grads, g->plan.adam, g->plan.activations, g->plan.weights_bf16};
  void **dst[5] = {(void **)&g->params, (void **)&g->grads, (void **)&g->adam, (void **)&g->arena, (void **)&g->wbf};
  for (int k = 0; k < 5; k++) {
    if (!bytes[k]) continue;
    tdm_status st = tdm_cuda_malloc(dst[k], bytes[k], what[k]);
    if (st != TDM_OK) {
      const tdm_model_config *mc = &g->mc;
      return tdm__set_error(st, "%s; the plan for GPT (%lld layers, width %lld, vocab %lld) at B=%lld T=%lld needs "
                                "%.3f GiB: parameters %.3f, gradients %.3f, AdamW %.3f, bf16 weights %.3f, activations %.3f "
                                "(a smaller --batch-size or --seq-len needs less)",
                            tdm_last_error(), (long long)mc->n_layer, (long long)mc->n_embd, (long long)mc->vocab_size,
                            (long long)g->B, (long long)g->T, (double)g->plan.total / 1073741824.0,
                            (double)g->plan.params / 1073741824.0, (double)g->plan.grads / 1073741824.0,
                            (double)g->plan.adam / 1073741824.0, (double)g->plan.weights_bf16 / 1073741824.0,
                            (double)g->plan.activations / 1073741824.0);
    }
  }
  return TDM_OK;
}

tdm_status tdm_cuda_gpt_create(tdm_cuda_gpt **out, const tdm_model_config *mc, const tdm_params *params, int64_t B,
                               int64_t T, int precision) {
  if (!out || !params) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt: NULL argument");
  *out = NULL;
  TDM__TRY(tdm__cuda_gpt_check(mc, B, T, precision));
  TDM__TRY(tdm_cuda_init());
  int64_t np = tdm_params_numel(params);
  if (np != tdm__cuda_gpt_numel(mc))
    return tdm__set_error(TDM_ERR_MISMATCH, "cuda gpt: %lld parameters given; the config has %lld", (long long)np,
                          (long long)tdm__cuda_gpt_numel(mc));
  tdm_cuda_gpt *g = tdm__calloc(1, sizeof *g);
  if (!g) return tdm__set_error(TDM_ERR_NO_MEMORY, "cuda gpt: out of host memory");
  g->mc = *mc, g->B = B, g->T = T, g->np = np, g->prec = precision;
  int64_t L = mc->n_layer, C = mc->n_embd, nparam = tdm_params_count(params);
  g->blk = tdm__calloc((size_t)(L * NBLOCK_PARAMS), sizeof *g->blk);
  g->la = tdm__calloc((size_t)L, sizeof *g->la);
  g->run_lo = tdm__calloc((size_t)nparam, sizeof *g->run_lo);
  g->run_hi = tdm__calloc((size_t)nparam, sizeof *g->run_hi);
  g->run_decay = tdm__calloc((size_t)nparam, 1);
  tdm_status st = g->blk && g->la && g->run_lo && g->run_hi && g->run_decay
                      ? TDM_OK
                      : tdm__set_error(TDM_ERR_NO_MEMORY, "cuda gpt: out of host memory");
  /* offsets by name: the layout is tdm_params', whatever order the model declared */
  if (st == TDM_OK) st = param_offset(params, "transformer.wte.weight", mc->vocab_size * C, &g->wte);
  if (st == TDM_OK) st = param_offset(params, "transformer.wpe.weight", mc->block_size * C, &g->wpe);
  if (st == TDM_OK) st = param_offset(params, "transformer.ln_f.weight", C, &g->lnf_w);
  if (st == TDM_OK) st = param_offset(params, "transformer.ln_f.bias", C, &g->lnf_b);
  int64_t sizes[NBLOCK_PARAMS] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  for (int64_t l = 0; st == TDM_OK && l < L; l++)
    for (int k = 0; st == TDM_OK && k < NBLOCK_PARAMS; k++) {
      char name[96];
      snprintf(name, sizeof name, "transformer.h.%lld.%s", (long long)l, block_names[k]);
      st = param_offset(params, name, sizes[k], &g->blk[l * NBLOCK_PARAMS + k]);
    }
  /* each parameter's decay flag, as the CPU optimizer reads it (decay_matrices_only picks) */
  for (int i = 0; st == TDM_OK && i < nparam; i++) {
    tdm_tensor *t = tdm_params_get(params, i);
    g->run_lo[i] = tdm_params_offset(params, i);
    g->run_hi[i] = g->run_lo[i] + tdm_tensor_numel(t);
    g->run_decay[i] = (unsigned char)tdm_params_decay(params, i);
  }
  g->n_runs = nparam;
  if (st == TDM_OK) {
    tdm__cuda_gpt_plan_arena(mc, B, T, precision, &g->ap, g->la);
    st = tdm_cuda_gpt_plan_bytes(mc, B, T, precision, &g->plan);
  }
  if (st == TDM_OK) st = alloc_all(g);
  if (st == TDM_OK) st = tdm_cuda_to_device(g->params, tdm_params_data(params), (size_t)np * 4);
  if (st == TDM_OK) st = tdm_cuda_memset0(g->grads, (size_t)np * 4);
  if (st == TDM_OK) st = tdm_cuda_memset0(g->adam, (size_t)np * 8);
  if (st == TDM_OK && g->wbf) tdm_cu_f32_to_bf16(g->wbf, g->params, np);
  if (st == TDM_OK) st = tdm_cuda_sync("cuda gpt create");
  if (st != TDM_OK) {
    tdm_cuda_gpt_destroy(g);
    return st;
  }
  *out = g;
  return TDM_OK;
}

void tdm_cuda_gpt_destroy(tdm_cuda_gpt *g) {
  if (!g) return;
  tdm_cuda_gpt_set_profile(g, 0);
  tdm_cuda_free(g->params), tdm_cuda_free(g->grads), tdm_cuda_free(g->adam), tdm_cuda_free(g->arena), tdm_cuda_free(g->wbf);
  tdm__free(g->blk), tdm__free(g->la), tdm__free(g->run_lo), tdm__free(g->run_hi), tdm__free(g->run_decay);
  tdm__free(g);
}

tdm_cuda_gpt_plan tdm_cuda_gpt_get_plan(const tdm_cuda_gpt *g) { return g->plan; }

#define A(off) (g->arena + (off))
#define P(l, k) (g->params + g->blk[(l) * NBLOCK_PARAMS + (k)])
#define G(l, k) (g->grads + g->blk[(l) * NBLOCK_PARAMS + (k)])
/* the weight a product reads: its bf16 copy under bf16 (same offset) */
#define W(off) (g->wbf ? (const void *)(g->wbf + (off)) : (const void *)(g->params + (off)))
#define WB(l, k) W(g->blk[(l) * NBLOCK_PARAMS + (k)])

/* y (N, O) f32 = x (N, I) w^T, no bias; x and w bf16 under bf16 */
static void mm_fwd(tdm_cuda_gpt *g, float *y, const void *x, const void *w, int64_t N, int64_t I, int64_t O) {
  mark(g, PR_GEMM);
  tdm_cu_gemm(0, 1, N, O, I, 1.0f, x, I, w, I, 0.0f, y, O, g->wbf ? TDM_CU_BF16 : TDM_CU_F32, 0);
}
/* dx (N, I) = dy w (set); dw (O, I) += dy^T x; db (O) += column sums of dy. Under bf16, dy (f32)
 * is rounded into the arena's dybf first (or, dy NULL, is already there: the logits' gradient),
 * and x, w are bf16. */
static void mm_bwd(tdm_cuda_gpt *g, float *dx, float *dw, float *db, const float *dy, const void *x, const void *w, int64_t N,
                   int64_t I, int64_t O) {
  const void *d = dy;
  int dt = TDM_CU_F32;
  if (g->wbf) {
    uint16_t *dybf = (uint16_t *)A(g->ap.dybf);
    mark(g, PR_CAST);
    if (dy) tdm_cu_f32_to_bf16(dybf, dy, N * O);
    d = dybf, dt = TDM_CU_BF16;
  }
  mark(g, PR_GEMM);
  tdm_cu_gemm(1, 0, O, I, N, 1.0f, d, O, x, I, 1.0f, dw, I, dt, 0);
  mark(g, PR_ELEM);
  if (db) tdm_cu_bias_bwd(db, dy, N, O);
  mark(g, PR_GEMM);
  tdm_cu_gemm(0, 0, N, I, O, 1.0f, d, O, w, I, 0.0f, dx, I, dt, 0);
}
/* out = layernorm(x): f32, or bf16 under bf16 */
static void ln_fwd(tdm_cuda_gpt *g, float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                   int64_t N, int64_t C) {
  mark(g, PR_LN);
  if (g->wbf)
    tdm_cu_layernorm_fwd_bf16((uint16_t *)out, mean, rstd, x, w, b, N, C, 1e-5f);
  else
    tdm_cu_layernorm_fwd(out, mean, rstd, x, w, b, N, C, 1e-5f);
}

static tdm_status check_tokens(const tdm_cuda_gpt *g, const int32_t *t, const char *what) {
  int64_t n = g->B * g->T;
  for (int64_t i = 0; i < n; i++)
    if (t[i] < 0 || t[i] >= g->mc.vocab_size)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt: %s[%lld] = %d; expected a token in [0, %lld)", what,
                            (long long)i, t[i], (long long)g->mc.vocab_size);
  return TDM_OK;
}

tdm_status tdm_cuda_gpt_forward(tdm_cuda_gpt *g, const int32_t *idx, const int32_t *targets, float *loss) {
  if (!g || !idx) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt forward: NULL argument");
  TDM__TRY(check_tokens(g, idx, "idx"));
  if (targets) TDM__TRY(check_tokens(g, targets, "targets"));
  tdm_cu_gemm_set_tf32(g->prec == TDM_CUDA_TF32);
  const tdm_model_config *mc = &g->mc;
  int64_t B = g->B, T = g->T, N = B * T, C = mc->n_embd, V = mc->vocab_size, NH = mc->n_head;
  const arena_plan *ap = &g->ap;
  int bf = g->wbf != NULL;
  int32_t *didx = (int32_t *)A(ap->idx), *dtgt = (int32_t *)A(ap->tgt);
  TDM__TRY(tdm_cuda_to_device(didx, idx, (size_t)N * 4));
  if (targets) TDM__TRY(tdm_cuda_to_device(dtgt, targets, (size_t)N * 4));
  mark(g, PR_EMBED);
  tdm_cu_gpt_embed_fwd(A(ap->enc), g->params + g->wte, g->params + g->wpe, didx, B, T, C);
  const float *res = A(ap->enc);
  for (int64_t l = 0; l < mc->n_layer; l++) {
    const layer_acts *a = &g->la[l];
    ln_fwd(g, A(a->ln1), A(a->ln1_mean), A(a->ln1_rstd), res, P(l, LN_1W), P(l, LN_1B), N, C);
    mm_fwd(g, A(ap->qkv), A(a->ln1), WB(l, ATTN_W), N, C, 3 * C);
    /* c_attn's bias is added as q, k, v are split by head (the unsplit qkv is not kept) */
    mark(g, PR_ATTN);
    if (bf) {
      tdm_cu_attention_split(A(a->qkvr), A(ap->qkv), P(l, ATTN_B), B, T, C, NH);
      tdm_cu_flash_attention_fwd(A(a->atty), 1, A(a->att), A(a->qkvr), B, T, C, NH);
    } else {
      tdm_cu_attention_fwd(A(a->atty), A(a->qkvr), A(a->att), A(ap->y), A(ap->qkv), P(l, ATTN_B), B, T, C, NH);
    }
    mm_fwd(g, A(ap->proj), A(a->atty), WB(l, PROJ_W), N, C, C);
    mark(g, PR_ELEM);
    tdm_cu_residual_bias_add(A(a->res2), res, A(ap->proj), P(l, PROJ_B), N, C);
    ln_fwd(g, A(a->ln2), A(a->ln2_mean), A(a->ln2_rstd), A(a->res2), P(l, LN_2W), P(l, LN_2B), N, C);
    mm_fwd(g, A(a->fch), A(a->ln2), WB(l, FC_W), N, C, 4 * C);
    mark(g, PR_ELEM);
    if (bf) /* fch += bias; fchg = gelu(fch) */
      tdm_cu_bias_gelu_fwd_bf16((uint16_t *)A(a->fchg), A(a->fch), P(l, FC_B), N, 4 * C);
    else
      tdm_cu_bias_gelu_fwd(A(a->fchg), A(a->fch), P(l, FC_B), N, 4 * C);
    mm_fwd(g, A(ap->proj), A(a->fchg), WB(l, FCPROJ_W), N, 4 * C, C);
    mark(g, PR_ELEM);
    tdm_cu_residual_bias_add(A(a->res3), A(a->res2), A(ap->proj), P(l, FCPROJ_B), N, C);
    res = A(a->res3);
  }
  ln_fwd(g, A(ap->lnf), A(ap->lnf_mean), A(ap->lnf_rstd), res, g->params + g->lnf_w, g->params + g->lnf_b, N, C);
  mm_fwd(g, A(ap->logits), A(ap->lnf), W(g->wte), N, C, V); /* lm_head tied to wte */
  g->have_grad = 0;
  if (!targets) prof_flush(g);
  if (targets) {
    /* the loss and its gradient (mean over the N tokens): in place of the logits, or under bf16
     * rounded into dybf, where the lm_head's backward reads it */
    mark(g, PR_LOSS);
    if (bf)
      tdm_cu_cross_entropy_bf16grad(A(ap->losses), (uint16_t *)A(ap->dybf), A(ap->logits), dtgt, N, V, 1.0f / (float)N);
    else
      tdm_cu_cross_entropy(A(ap->losses), A(ap->logits), A(ap->logits), dtgt, N, V, 1.0f / (float)N);
    tdm_cu_sum(A(ap->loss), A(ap->losses), N);
    prof_flush(g);
    float sum = 0;
    TDM__TRY(tdm_cuda_sync("cuda gpt forward"));
    TDM__TRY(tdm_cuda_to_host(&sum, A(ap->loss), sizeof sum));
    if (loss) *loss = sum / (float)N;
    g->have_grad = 1;
    return TDM_OK;
  }
  return tdm_cuda_sync("cuda gpt forward");
}

tdm_status tdm_cuda_gpt_logits(const tdm_cuda_gpt *g, float *host) {
  if (!g || !host) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt logits: NULL argument");
  if (g->have_grad)
    return tdm__set_error(TDM_ERR_INVALID_USAGE, "cuda gpt logits: the last forward had targets (its logits became "
                                                 "their gradient); run forward without targets");
  return tdm_cuda_to_host(host, g->arena + g->ap.logits, (size_t)(g->B * g->T * g->mc.vocab_size) * 4);
}

tdm_status tdm_cuda_gpt_zero_grad(tdm_cuda_gpt *g) {
  if (!g) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt zero_grad: NULL");
  return tdm_cuda_memset0(g->grads, (size_t)g->np * 4);
}

tdm_status tdm_cuda_gpt_backward(tdm_cuda_gpt *g) {
  if (!g) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt backward: NULL");
  if (!g->have_grad)
    return tdm__set_error(TDM_ERR_INVALID_USAGE, "cuda gpt backward: needs a forward with targets first");
  tdm_cu_gemm_set_tf32(g->prec == TDM_CUDA_TF32);
  const tdm_model_config *mc = &g->mc;
  int64_t B = g->B, T = g->T, N = B * T, C = mc->n_embd, V = mc->vocab_size, NH = mc->n_head, L = mc->n_layer;
  const arena_plan *ap = &g->ap;
  int bf = g->wbf != NULL;
  float *dres = A(ap->dres), *dln = A(ap->dln), *dbuf4 = A(ap->dbuf4);
  /* lm_head: dwte += dlogits^T lnf, dlnf = dlogits wte (bf16: dlogits already in dybf) */
  mm_bwd(g, dln, g->grads + g->wte, NULL, bf ? NULL : A(ap->logits), A(ap->lnf), W(g->wte), N, C, V);
  const float *res_last = L ? A(g->la[L - 1].res3) : A(ap->enc);
  mark(g, PR_ELEM);
  TDM__TRY(tdm_cuda_memset0(dres, (size_t)(N * C) * 4));
  mark(g, PR_LN);
  tdm_cu_layernorm_bwd(dres, g->grads + g->lnf_w, g->grads + g->lnf_b, dln, res_last, g->params + g->lnf_w,
                       A(ap->lnf_mean), A(ap->lnf_rstd), N, C);
  for (int64_t l = L - 1; l >= 0; l--) {
    const layer_acts *a = &g->la[l];
    const float *res_in = l ? A(g->la[l - 1].res3) : A(ap->enc);
    /* MLP: res3 = res2 + fchg Wp^T + bp; fchg = gelu(fch); fch = ln2 Wfc^T + bfc */
    mm_bwd(g, dbuf4, G(l, FCPROJ_W), G(l, FCPROJ_B), dres, A(a->fchg), WB(l, FCPROJ_W), N, 4 * C, C);
    mark(g, PR_ELEM);
    tdm_cu_gelu_bwd(dbuf4, dbuf4, A(a->fch), 4 * N * C);
    mm_bwd(g, dln, G(l, FC_W), G(l, FC_B), dbuf4, A(a->ln2), WB(l, FC_W), N, C, 4 * C);
    mark(g, PR_LN);
    tdm_cu_layernorm_bwd(dres, G(l, LN_2W), G(l, LN_2B), dln, A(a->res2), P(l, LN_2W), A(a->ln2_mean), A(a->ln2_rstd), N, C);
    /* attention: res2 = res_in + atty Wproj^T + bproj */
    mm_bwd(g, dln, G(l, PROJ_W), G(l, PROJ_B), dres, A(a->atty), WB(l, PROJ_W), N, C, C);
    mark(g, PR_ATTN);
    if (bf)
      tdm_cu_flash_attention_bwd(A(ap->dqkv), A(ap->datt), dln, A(a->atty), 1, A(a->qkvr), A(a->att), B, T, C, NH);
    else
      tdm_cu_attention_bwd(A(ap->dqkv), A(ap->dqkvr), A(ap->datt), A(ap->dy), dln, A(a->qkvr), A(a->att), B, T, C, NH);
    mm_bwd(g, dln, G(l, ATTN_W), G(l, ATTN_B), A(ap->dqkv), A(a->ln1), WB(l, ATTN_W), N, C, 3 * C);
    mark(g, PR_LN);
    tdm_cu_layernorm_bwd(dres, G(l, LN_1W), G(l, LN_1B), dln, res_in, P(l, LN_1W), A(a->ln1_mean), A(a->ln1_rstd), N, C);
  }
  mark(g, PR_EMBED);
  tdm_cu_gpt_embed_bwd(g->grads + g->wte, g->grads + g->wpe, dres, (const int32_t *)A(ap->idx), B, T, C);
  prof_flush(g);
  return tdm_cuda_sync("cuda gpt backward");
}

tdm_status tdm_cuda_gpt_update(tdm_cuda_gpt *g, const tdm_optim_config *oc, float lr, float clip, float *norm_out) {
  if (!g || !oc) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt update: NULL argument");
  if (oc->kind != TDM_OPT_ADAMW && !(oc->kind == TDM_OPT_ADAM && oc->weight_decay == 0.0f))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "cuda gpt update: optimizer %s%s; the CUDA backend has AdamW (and Adam "
                                                 "without weight decay)",
                          oc->kind == TDM_OPT_SGD ? "sgd" : "adam", oc->kind == TDM_OPT_ADAM ? " with weight decay" : "");
  if (!(lr >= 0.0f)) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt update: learning rate %g; expected >= 0", (double)lr);
  double *sums = (double *)(g->arena + g->ap.sumsq);
  mark(g, PR_OPT);
  tdm_cu_sumsq(sums + TDM_CU_SUMSQ_BLOCKS, sums, g->grads, g->np);
  double sq = 0;
  TDM__TRY(tdm_cuda_sync("cuda gpt gradient norm"));
  TDM__TRY(tdm_cuda_to_host(&sq, sums + TDM_CU_SUMSQ_BLOCKS, sizeof sq));
  float norm = (float)sqrt(sq);
  if (norm_out) *norm_out = norm;
  if (!isfinite(norm))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt update: the gradient norm is %g (a NaN or Inf gradient); "
                                               "nothing updated", (double)norm);
  float coef = clip > 0 ? tdm_clip_coef(norm, clip) : 1.0f;
  g->steps++;
  float bc1 = 1.0f - powf(oc->beta1, (float)g->steps), bc2s = sqrtf(1.0f - powf(oc->beta2, (float)g->steps));
  float *m = g->adam, *v = g->adam + g->np;
  mark(g, PR_OPT);
  /* one launch per run of equal decay (parameters are contiguous: merge neighbours) */
  for (int64_t r = 0; r < g->n_runs;) {
    int dec = !oc->decay_matrices_only || g->run_decay[r];
    int64_t lo = g->run_lo[r], hi = g->run_hi[r];
    r++;
    while (r < g->n_runs && g->run_lo[r] == hi && (!oc->decay_matrices_only || g->run_decay[r]) == dec) hi = g->run_hi[r++];
    tdm_cu_adamw(g->params + lo, m + lo, v + lo, g->grads + lo, hi - lo, lr, oc->beta1, oc->beta2, oc->eps,
                 dec ? oc->weight_decay : 0.0f, bc1, bc2s, coef);
  }
  mark(g, PR_CAST);
  if (g->wbf) tdm_cu_f32_to_bf16(g->wbf, g->params, g->np); /* what the next step's products read */
  prof_flush(g);
  return tdm_cuda_sync("cuda gpt update");
}

tdm_status tdm_cuda_gpt_download(const tdm_cuda_gpt *g, tdm_params *params, int grads) {
  if (!g || !params) return tdm__set_error(TDM_ERR_INVALID_ARG, "cuda gpt download: NULL argument");
  if (tdm_params_numel(params) != g->np)
    return tdm__set_error(TDM_ERR_MISMATCH, "cuda gpt download: %lld host parameters; the device holds %lld",
                          (long long)tdm_params_numel(params), (long long)g->np);
  TDM__TRY(tdm_cuda_to_host(tdm_params_data(params), g->params, (size_t)g->np * 4));
  if (grads) TDM__TRY(tdm_cuda_to_host(tdm_params_grad(params), g->grads, (size_t)g->np * 4));
  return TDM_OK;
}
#else
typedef int tdm__cuda_gpt_unused; /* ISO C wants a translation unit to declare something */
#endif
