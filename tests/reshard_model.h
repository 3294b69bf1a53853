/* The models, data and training loop that the resharding tests share (tests/unit/test_reshard.c
 * in one process, tests/multirank/reshard_job.c in real ones): a small MLP (Adam) and GPT (AdamW),
 * a global batch of G samples that depends on the step alone, cut into equal slices per rank. */
#ifndef TDM_TEST_RESHARD_MODEL_H
#define TDM_TEST_RESHARD_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/tandem.h"

enum { G = 12, SAVED = 3, MORE = 2 }; /* samples per step; steps before the checkpoint; after */

typedef struct {
  tdm_model_config mc;
  tdm_optim_config oc;
  int gpt;
  int64_t T;
} model_kind;

static model_kind mlp_kind(void) {
  model_kind k = {tdm_model_config_mlp(), tdm_optim_config_default(TDM_OPT_ADAM), 0, 0};
  k.mc.in_features = 40, k.mc.n_hidden = 2, k.mc.hidden[0] = 64, k.mc.hidden[1] = 48, k.mc.n_classes = 5, k.mc.dropout = 0.2f;
  k.oc.lr = 1e-2f, k.oc.weight_decay = 0.01f;
  return k;
}

static model_kind gpt_kind(void) {
  model_kind k = {tdm_model_config_gpt_mini(), tdm_optim_config_default(TDM_OPT_ADAMW), 1, 8};
  k.mc.n_layer = 2, k.mc.n_head = 2, k.mc.n_embd = 16, k.mc.block_size = 8, k.mc.vocab_size = 37, k.mc.dropout = 0.1f;
  k.oc.lr = 1e-2f, k.oc.weight_decay = 0.1f, k.oc.decay_matrices_only = 1;
  return k;
}

typedef struct {
  const model_kind *k;
  int r, P;
  int64_t step;
} batch_ctx;

/* Sample s of step t is a function of (t, s); rank r of P takes samples [r G/P, (r + 1) G/P). */
static tdm_status next_batch(void *vctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  (void)micro;
  batch_ctx *c = vctx;
  int64_t B = G / c->P, first = c->r * B;
  *base = first;
  if (c->k->gpt) {
    int64_t T = c->k->T, xs[2] = {B, T};
    *x = tdm_new(tp, TDM_I32, 2, xs);
    *y = tdm_new(tp, TDM_I32, 2, xs);
    if (!*x || !*y) return tdm_tape_status(tp);
    int32_t *xd = tdm_tensor_data(*x), *yd = tdm_tensor_data(*y);
    for (int64_t i = 0; i < B * T; i++) {
      uint64_t h = tdm_hash64((uint64_t)c->step, (uint64_t)(first * T + i));
      xd[i] = (int32_t)(h % (uint64_t)c->k->mc.vocab_size);
      yd[i] = (int32_t)((h >> 20) % (uint64_t)c->k->mc.vocab_size);
    }
    return TDM_OK;
  }
  int64_t F = c->k->mc.in_features, xs[2] = {B, F}, ys[1] = {B};
  *x = tdm_new(tp, TDM_F32, 2, xs);
  *y = tdm_new(tp, TDM_I32, 1, ys);
  if (!*x || !*y) return tdm_tape_status(tp);
  float *xd = tdm_tensor_data(*x);
  int32_t *yd = tdm_tensor_data(*y);
  for (int64_t i = 0; i < B; i++) {
    for (int64_t f = 0; f < F; f++)
      xd[i * F + f] = (float)(tdm_hash64((uint64_t)c->step * 7919 + (uint64_t)(first + i), (uint64_t)f) % 2000) / 1000.0f - 1.0f;
    yd[i] = (int32_t)(tdm_hash64((uint64_t)c->step, (uint64_t)(first + i)) % (uint64_t)c->k->mc.n_classes);
  }
  return TDM_OK;
}

static tdm_status train(tdm_engine *e, const model_kind *k, int r, int P, int64_t from, int64_t to) {
  for (int64_t t = from; t < to; t++) {
    batch_ctx bc = {k, r, P, t};
    tdm_step_stats ss;
    TDM__TRY(tdm_engine_step(e, next_batch, &bc, tdm_hash64(42, (uint64_t)t), k->oc.lr, &ss));
  }
  return TDM_OK;
}

/* An engine of stage 0 (data parallelism) or ZeRO 1-3 over comm's ranks. */
static tdm_status make_engine(const model_kind *k, int stage, tdm_comm_t comm, tdm_grid **g, tdm_engine **e) {
  tdm_engine_config ec = tdm_engine_config_default();
  ec.kind = stage ? TDM_ENGINE_ZERO : TDM_ENGINE_DP;
  ec.zero.stage = stage ? stage : 1;
  ec.zero.bucket_bytes = 2048; /* several buckets: spans that cut parameters */
  ec.clip = 1.0f;
  TDM__TRY(tdm_grid_create(g, comm, 0, 1, 1));
  return tdm_engine_create(e, &k->mc, 7, &k->oc, *g, &ec);
}

/* The parameters and Adam's moments of a consolidated file (tandem checkpoint consolidate
 * --optimizer), put in place by hand into a stage-0 engine: the same state, without resharding. */
static tdm_status inject(tdm_engine *e, const char *file) {
  TDM__TRY(tdm_engine_load_weights(e, file));
  tdm_safetensors *f;
  TDM__TRY(tdm_safetensors_load(&f, file));
  tdm_params *p = tdm_model_params(tdm_engine_model(e));
  tdm_optim *o = tdm_engine_optim(e);
  int64_t n = tdm_params_numel(p), ns;
  float *state = tdm_optim_state(o, &ns);
  tdm_status st = ns == 2 * n ? TDM_OK : tdm__set_error(TDM_ERR_INTERNAL, "inject: %lld state floats", (long long)ns);
  for (int i = 0; st == TDM_OK && i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    const char *kinds[2] = {"exp_avg", "exp_avg_sq"};
    for (int s = 0; st == TDM_OK && s < 2; s++) {
      char name[300];
      snprintf(name, sizeof name, "optim.%s.%s", kinds[s], tdm_tensor_name(t));
      const tdm_st_tensor *x = tdm_safetensors_find(f, name);
      if (!x || x->nbytes != tdm_tensor_numel(t) * 4) st = tdm__set_error(TDM_ERR_INTERNAL, "inject: no %s", name);
      else memcpy(state + s * n + tdm_params_offset(p, i), x->data, (size_t)x->nbytes);
    }
  }
  const char *steps = tdm_safetensors_meta(f, "tandem.optim_steps");
  if (st == TDM_OK) tdm_optim_set_steps(o, steps ? atoll(steps) : -1);
  tdm_safetensors_destroy(f);
  return st;
}

#endif
