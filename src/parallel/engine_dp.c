/* The data-parallel engine (stage 0): every rank holds the whole model, its gradients and the
 * optimizer state; tdm_dp averages gradient buckets while backward runs (include/tandem/dp.h). */
#include <stdio.h>
#include <string.h>

#include "parallel/engine_impl.h"
#include "tandem/dp.h"

static tdm_status dp_create(tdm_engine *e, const tdm_model_config *mc, uint64_t seed) {
  TDM__TRY(tdm_model_create(&e->model, mc, seed));
  e->params = tdm_model_params(e->model);
  TDM__TRY(tdm_optim_create(&e->opt, &e->ocfg, e->params));
  e->spans = tdm__malloc(sizeof *e->spans);
  if (!e->spans) return tdm__set_error(TDM_ERR_NO_MEMORY, "dp engine: out of memory");
  e->spans[0] = (tdm_optim_span){0, tdm_params_numel(e->params)};
  e->n_spans = 1;
  tdm_dp *dp = NULL;
  if (e->comm && e->size > 1) {
    const tdm_engine_dp_config *c = &e->cfg.dp;
    tdm_dp_config dc = {c->bucket_bytes, c->first_bucket_bytes, c->wire_dtype ? c->wire_dtype : TDM_F32, c->no_overlap,
                        c->compress, c->compress_start, seed ^ 0x70777273ull};
    TDM__TRY(tdm_dp_create(&dp, e->comm, e->params, &dc));
  }
  e->impl = dp;
  snprintf(e->desc, sizeof e->desc, "data parallel, %d rank%s%s%s%s", e->size, e->size == 1 ? "" : "s",
           dp ? "" : " (no communication)", dp && tdm_compress_is_hook(e->cfg.dp.compress) ? ", compress " : "",
           dp && tdm_compress_is_hook(e->cfg.dp.compress) ? e->cfg.dp.compress : "");
  return TDM_OK;
}

static void dp_destroy(tdm_engine *e) { tdm_dp_destroy(e->impl); }

static void dp_zero_grad(tdm_engine *e) { tdm_params_zero_grad(e->params); }

static void dp_begin_backward(tdm_engine *e, int last) {
  if (e->impl) tdm_dp_set_sync(e->impl, last);
  if (e->impl) tdm_dp_set_step(e->impl, tdm_optim_steps(e->opt));
}

static tdm_status dp_end_backward(tdm_engine *e, int last, double *wait_s) {
  if (!e->impl) return TDM_OK;
  double ms = 0;
  tdm_status st = tdm_dp_finish(e->impl, &ms); /* only re-arms the hooks when !last */
  if (last) *wait_s += ms * 1e-3;
  return st;
}

static tdm_status dp_grad_sumsq(tdm_engine *e, double *sumsq) {
  return tdm__engine_sumsq_full(e, tdm_params_grad(e->params), sumsq);
}

static tdm_status dp_update(tdm_engine *e, float lr, float coef) {
  tdm_grad_scale(tdm_params_grad(e->params), tdm_params_numel(e->params), coef);
  return tdm_optim_step(e->opt, lr);
}

static tdm_status dp_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst) {
  if (hi > lo) memcpy(dst, tdm_params_data(e->params) + lo, sizeof(float) * (size_t)(hi - lo));
  return TDM_OK;
}

static tdm_status dp_stream_params(tdm_engine *e, tdm_status (*write)(void *, const float *, int64_t), void *ctx) {
  return e->rank == 0 ? write(ctx, tdm_params_data(e->params), tdm_params_numel(e->params)) : TDM_OK;
}

/* Every rank reads the file (it must see it); the ranks then hold the same values. */
static tdm_status dp_load_weights(tdm_engine *e, const char *path) { return tdm_params_load(e->params, path, 0); }

static int dp_compress_stats(const tdm_engine *e, const tdm_compress_stats **out, uint64_t *grad_bytes) {
  if (!e->impl) return 0;
  if (grad_bytes) *grad_bytes = tdm_dp_step_bytes(e->impl);
  return tdm_dp_compress_stats(e->impl, out);
}

static int dp_compress_state(tdm_engine *e, int k, int64_t *lo, int64_t *hi, float **residual, float **shared, int64_t *n_shared) {
  return e->impl ? tdm_dp_compress_state(e->impl, k, lo, hi, residual, shared, n_shared) : 0;
}

const tdm__engine_ops tdm__engine_dp_ops = {
    .name = "dp",
    .create = dp_create,
    .destroy = dp_destroy,
    .zero_grad = dp_zero_grad,
    .begin_backward = dp_begin_backward,
    .end_backward = dp_end_backward,
    .grad_sumsq = dp_grad_sumsq,
    .update = dp_update,
    .read_params = dp_read_params,
    .stream_params = dp_stream_params,
    .load_weights = dp_load_weights,
    .compress_stats = dp_compress_stats,
    .compress_state = dp_compress_state,
    .mixed = 1,
    .recompute = 1,
    .cannot_skip = 0, /* a skipped step calls no update */
};
