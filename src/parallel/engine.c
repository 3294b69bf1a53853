/* The engine seam: the table of strategies, the process grid, and the training step every
 * engine runs (zero_grad, forward, backward, update), with the parts all engines share. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/params_impl.h"
#include "parallel/engine_impl.h"
#include "tandem/trace.h"
#include "tensor/tensor_impl.h"

/* ---- the table: one row per strategy --------------------------------------------------------- */
static const tdm__engine_ops *const engines[] = {&tdm__engine_dp_ops, &tdm__engine_zero_ops, &tdm__engine_pipeline_ops,
                                                 &tdm__engine_tp_ops, &tdm__engine_ps_ops};
_Static_assert(sizeof engines / sizeof engines[0] == TDM_ENGINE_KIND_COUNT, "one row per engine");

const char *tdm_engine_kind_name(tdm_engine_kind k) {
  return (unsigned)k < TDM_ENGINE_KIND_COUNT ? engines[k]->name : "?";
}

tdm_engine_config tdm_engine_config_default(void) {
  tdm_engine_config c;
  memset(&c, 0, sizeof c);
  c.kind = TDM_ENGINE_DP;
  c.accum = 1;
  c.dp.wire_dtype = TDM_F32;
  c.zero.stage = 1;
  c.zero.unit_modules = 1;
  c.zero.prefetch = 1;
  c.precision = TDM_F32;
  c.tp.check_every = 100;
  c.pp.schedule = TDM_PP_1F1B;
  return c;
}

/* ---- the process grid ------------------------------------------------------------------------- */
static const char *axis_names[] = {"data", "tensor", "pipeline"};
_Static_assert(sizeof axis_names / sizeof axis_names[0] == TDM_AXIS_COUNT, "one name per axis");
const char *tdm_grid_axis_name(tdm_grid_axis a) { return (unsigned)a < TDM_AXIS_COUNT ? axis_names[a] : "?"; }

struct tdm_grid {
  tdm_comm_t world;
  tdm_comm_t axis[TDM_AXIS_COUNT];
  int owned[TDM_AXIS_COUNT];
  int size[TDM_AXIS_COUNT], index[TDM_AXIS_COUNT];
};

tdm_status tdm_grid_create(tdm_grid **out, tdm_comm_t world, int data, int tensor, int pipeline) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "grid_create: out is NULL");
  *out = NULL;
  int W = world ? tdm_comm_size(world) : 1, R = world ? tdm_comm_rank(world) : 0;
  if (tensor < 1 || pipeline < 1 || data < 0 || (int64_t)tensor * pipeline > W ||
      (data == 0 && W % (tensor * pipeline) != 0) || (data > 0 && (int64_t)data * tensor * pipeline != W))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "process grid: data %d x tensor %d x pipeline %d does not make the world size %d; expected "
                          "sizes >= 1 whose product is %d (data 0: what is left)",
                          data, tensor, pipeline, W, W);
  if (data == 0) data = W / (tensor * pipeline);
  tdm_grid *g = tdm__calloc(1, sizeof *g);
  if (!g) return tdm__set_error(TDM_ERR_NO_MEMORY, "grid_create: out of memory");
  g->world = world;
  g->size[TDM_AXIS_DATA] = data, g->size[TDM_AXIS_TENSOR] = tensor, g->size[TDM_AXIS_PIPELINE] = pipeline;
  /* rank = (d * pipeline + p) * tensor + t: tensor peers are neighbours, then a pipeline's stages
   * (they talk every micro-batch), then the data replicas (once a step) */
  g->index[TDM_AXIS_TENSOR] = R % tensor;
  g->index[TDM_AXIS_PIPELINE] = (R / tensor) % pipeline;
  g->index[TDM_AXIS_DATA] = R / (tensor * pipeline);
  for (int a = 0; a < TDM_AXIS_COUNT; a++) {
    if (g->size[a] == 1 || !world) continue;
    if (g->size[a] == W) { /* the whole world: no split (keeps whole-communicator fast paths) */
      g->axis[a] = world;
      continue;
    }
    /* the ranks that differ only in coordinate a share a colour: the other two coordinates */
    int color = 0;
    for (int b = 0, mul = 1; b < TDM_AXIS_COUNT; b++)
      if (b != a) color += g->index[b] * mul, mul *= g->size[b];
    tdm_status st = tdm_comm_split(world, color, g->index[a], &g->axis[a]);
    if (st != TDM_OK) {
      tdm_grid_destroy(g);
      return st;
    }
    g->owned[a] = 1;
  }
  *out = g;
  return TDM_OK;
}

void tdm_grid_destroy(tdm_grid *g) {
  if (!g) return;
  for (int a = 0; a < TDM_AXIS_COUNT; a++)
    if (g->owned[a]) tdm_comm_destroy(g->axis[a]);
  tdm__free(g);
}

tdm_comm_t tdm_grid_world(const tdm_grid *g) {
  TDM__NONNULL(g, NULL, "tdm_grid_world: the grid g is NULL");
  return g->world;
}
tdm_comm_t tdm_grid_comm(const tdm_grid *g, tdm_grid_axis a) {
  TDM__NONNULL(g, NULL, "tdm_grid_comm: the grid g is NULL");
  return (unsigned)a < TDM_AXIS_COUNT ? g->axis[a] : NULL;
}
int tdm_grid_size(const tdm_grid *g, tdm_grid_axis a) {
  TDM__NONNULL(g, 0, "tdm_grid_size: the grid g is NULL");
  return (unsigned)a < TDM_AXIS_COUNT ? g->size[a] : 0;
}
int tdm_grid_index(const tdm_grid *g, tdm_grid_axis a) {
  TDM__NONNULL(g, -1, "tdm_grid_index: the grid g is NULL");
  return (unsigned)a < TDM_AXIS_COUNT ? g->index[a] : 0;
}

/* Precision and recomputation against what the engine honours (ops->mixed, ->recompute): an engine
 * that does not is refused, naming the setting, rather than run in f32 or without recomputing. */
static tdm_status check_model_side(const tdm_engine_config *cfg, const char *where) {
  const tdm__engine_ops *ops = engines[cfg->kind];
  if (cfg->precision != TDM_F32 && cfg->precision != TDM_BF16 && cfg->precision != TDM_F16)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: precision %s; expected f32, bf16 or f16", where, tdm_dtype_name(cfg->precision));
  if (cfg->precision != TDM_F32 && !ops->mixed)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "%s: the %s engine does not implement mixed precision (precision %s); use f32 with it, or the dp "
                          "or zero engine",
                          where, ops->name, tdm_dtype_name(cfg->precision));
  if (cfg->precision == TDM_F16 && ops->cannot_skip)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "%s: fp16 skips the steps whose gradients overflow, and the %s engine cannot skip a step; use bf16 (no loss scaling)",
                          where, ops->name);
  if (cfg->precision == TDM_F16 && (!(cfg->loss_scale.init >= 0) || !isfinite(cfg->loss_scale.init) || cfg->loss_scale.window < 0))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: loss scale %g, window %lld; expected a finite scale >= 0 (0: 65536) and a window >= 0 (0: 2000)",
                          where, (double)cfg->loss_scale.init, (long long)cfg->loss_scale.window);
  if (cfg->recompute != TDM_RECOMPUTE_NONE && !ops->recompute)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "%s: the %s engine does not implement activation recomputation (recompute %s); use none with it, "
                          "or the dp or zero engine",
                          where, ops->name, tdm_recompute_name(cfg->recompute));
  return TDM_OK;
}

tdm_status tdm_engine_check(const tdm_model_config *mc, const tdm_engine_config *cfg, int world, int data, int tensor,
                            int pipeline) {
  if (!mc || !cfg) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_check: NULL argument");
  if ((unsigned)cfg->kind >= TDM_ENGINE_KIND_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_check: engine %d; expected 0..%d", (int)cfg->kind, TDM_ENGINE_KIND_COUNT - 1);
  if (tensor < 1 || pipeline < 1 || data < 0 || world < 1 || (int64_t)tensor * pipeline > world ||
      (data == 0 && world % (tensor * pipeline) != 0) || (data > 0 && (int64_t)data * tensor * pipeline != world))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "process grid: data %d x tensor %d x pipeline %d does not make the world size %d; expected sizes >= 1 "
                          "whose product is %d (data 0: what is left)",
                          data, tensor, pipeline, world, world);
  TDM__TRY(check_model_side(cfg, "engine_check"));
  int sizes[TDM_AXIS_COUNT] = {data ? data : world / (tensor * pipeline), tensor, pipeline};
  for (int a = TDM_AXIS_TENSOR; a < TDM_AXIS_COUNT; a++)
    if (sizes[a] != 1 && !(engines[cfg->kind]->axes & (1u << a)))
      return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "the %s engine does not run on a %s axis (tensor %d, pipeline %d)",
                            engines[cfg->kind]->name, tdm_grid_axis_name((tdm_grid_axis)a), tensor, pipeline);
  return engines[cfg->kind]->check ? engines[cfg->kind]->check(mc, cfg, sizes) : TDM_OK;
}

/* ---- create / destroy ------------------------------------------------------------------------- */
/* ---- every rank the same engine ------------------------------------------------------------------- */
static uint64_t mix(uint64_t h, uint64_t v) { return tdm_hash64(h ^ v, 0x656e67696e65ull); }
static uint64_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static uint64_t sbits(const char *s) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (; s && *s; s++) h = mix(h, (unsigned char)*s);
  return h;
}

/* One all-gather of a hash per setting over the world: a rank whose engine or optimizer differs
 * from rank 0's fails every rank naming it (another clip, optimizer, beta, accumulation or
 * precision on one rank trained silently different replicas, or a mean that is neither's global
 * batch; another seed at ZeRO stage 3 a model of two initialisations). */
static tdm_status same_engine_everywhere(tdm_grid *grid, uint64_t seed, const tdm_optim_config *oc, const tdm_engine_config *c) {
  tdm_comm_t w = tdm_grid_world(grid);
  if (!w || tdm_comm_size(w) == 1) return TDM_OK;
  const tdm_engine_dp_config *d = &c->dp;
  const tdm_engine_zero_config *z = &c->zero;
  const tdm_engine_pipeline_config *pp = &c->pp;
  uint64_t split = sbits("split");
  for (int i = 0; i < pp->n_split && i < TDM_PP_MAX_SPLIT; i++) split = mix(split, (uint64_t)pp->split[i]);
  struct { const char *what; uint64_t h; } f[] = {
      {"engine kind", (uint64_t)c->kind},
      {"accumulation", (uint64_t)(c->accum > 1 ? c->accum : 1)},
      {"clip", fbits(c->clip)},
      {"allow_nonfinite", (uint64_t)c->allow_nonfinite},
      {"recompute", (uint64_t)c->recompute},
      {"precision", (uint64_t)c->precision},
      {"loss scale", mix(fbits(c->loss_scale.init), (uint64_t)c->loss_scale.window)},
      {"label smoothing", fbits(c->label_smoothing)},
      {"buckets", mix(d->bucket_bytes, d->first_bucket_bytes)},
      {"wire dtype", (uint64_t)d->wire_dtype},
      {"no_overlap", (uint64_t)d->no_overlap},
      {"compressor", mix(sbits(d->compress && strcmp(d->compress, "none") ? d->compress : ""), (uint64_t)d->compress_start)},
      {"ZeRO", c->kind == TDM_ENGINE_ZERO ? mix(mix((uint64_t)z->stage, z->bucket_bytes), mix((uint64_t)z->unit_modules, (uint64_t)z->prefetch)) : 0},
      {"pipeline", c->kind == TDM_ENGINE_PIPELINE ? mix(mix((uint64_t)pp->schedule, (uint64_t)pp->virtual_stages), mix(split, mix((uint64_t)pp->seq_len,
                                                                                                                     (uint64_t)pp->zero_stage))) : 0},
      {"optimizer", (uint64_t)oc->kind},
      {"weight decay", mix(fbits(oc->weight_decay), (uint64_t)oc->decay_matrices_only)},
      {"momentum", mix(mix(fbits(oc->momentum), fbits(oc->dampening)), (uint64_t)oc->nesterov)},
      {"betas and eps", mix(mix(fbits(oc->beta1), fbits(oc->beta2)), fbits(oc->eps))},
      {"seed (ZeRO stage 3 initialises each rank's shard)", c->kind == TDM_ENGINE_ZERO && z->stage == 3 ? seed : 0},
  };
  enum { K = sizeof f / sizeof f[0] };
  int W = tdm_comm_size(w);
  int64_t mine[K], *all = tdm__malloc(sizeof(int64_t) * K * (size_t)W);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "engine_create: out of memory");
  for (int k = 0; k < K; k++) mine[k] = (int64_t)f[k].h;
  tdm_status st = tdm_comm_allgather(w, mine, all, K, TDM_I64, TDM_ALGO_AUTO);
  for (int r = 1; st == TDM_OK && r < W; r++)
    for (int k = 0; k < K; k++)
      if (all[(size_t)r * K + k] != all[k]) {
        st = tdm__set_error(TDM_ERR_MISMATCH, "engine_create: rank %d's %s differs from rank 0's; every rank must build the same engine "
                            "and optimizer", r, f[k].what);
        break;
      }
  tdm__free(all);
  return st;
}

tdm_status tdm_engine_create(tdm_engine **out, const tdm_model_config *mc, uint64_t seed, const tdm_optim_config *oc,
                             tdm_grid *grid, const tdm_engine_config *cfg) {
  if (!out || !mc || !oc || !grid || !cfg) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: NULL argument");
  *out = NULL;
  if ((unsigned)cfg->kind >= TDM_ENGINE_KIND_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: engine %d; expected 0..%d", (int)cfg->kind,
                          TDM_ENGINE_KIND_COUNT - 1);
  if (cfg->accum < 0 || cfg->accum > (1 << 20) || !(cfg->clip >= 0))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: accumulation %lld, clip %g; expected 1..2^20 and >= 0",
                          (long long)cfg->accum, (double)cfg->clip);
  /* values that were silently taken as their default (or, for a smoothing of 5, as a loss nobody meant) */
  const tdm_dtype wd = cfg->dp.wire_dtype;
  const char *bad = !(cfg->label_smoothing >= 0 && cfg->label_smoothing < 1) ? "label smoothing (expected 0 <= eps < 1)"
                    : wd != TDM_F32 && wd != TDM_BF16 && wd != TDM_F16 ? "wire dtype (expected f32, bf16 or f16)"
                    : cfg->zero.unit_modules < 0 || cfg->zero.prefetch < 0 ? "ZeRO unit or prefetch (expected >= 0)"
                    : cfg->pp.n_split < 0 || cfg->pp.n_split > TDM_PP_MAX_SPLIT ? "pipeline split count (expected 0..TDM_PP_MAX_SPLIT)"
                    : cfg->pp.seq_len < 0 || cfg->pp.seq_len > ((int64_t)1 << 30) ? "pipeline seq_len (expected 0..2^30)"
                    : cfg->pp.virtual_stages < 0 ? "virtual stages (expected >= 0)" : NULL;
  if (bad)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: the %s: label smoothing %g, wire dtype %d, unit %d, prefetch %d, "
                          "split count %d, seq_len %lld, virtual stages %d", bad, (double)cfg->label_smoothing, (int)wd,
                          cfg->zero.unit_modules, cfg->zero.prefetch, cfg->pp.n_split, (long long)cfg->pp.seq_len, cfg->pp.virtual_stages);
  for (int a = TDM_AXIS_TENSOR; a < TDM_AXIS_COUNT; a++) /* each engine spreads over the axes it knows */
    if (tdm_grid_size(grid, (tdm_grid_axis)a) != 1 && !(engines[cfg->kind]->axes & (1u << a)))
      return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "engine_create: the %s engine does not run on a %s axis (tensor %d, pipeline %d)",
                            engines[cfg->kind]->name, tdm_grid_axis_name((tdm_grid_axis)a), tdm_grid_size(grid, TDM_AXIS_TENSOR),
                            tdm_grid_size(grid, TDM_AXIS_PIPELINE));
  TDM__TRY(tdm_compress_check(cfg->dp.compress)); /* before anything collective */
  if (cfg->kind != TDM_ENGINE_DP && cfg->dp.compress && strcmp(cfg->dp.compress, "none"))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: compress %s with the %s engine; expected the data-parallel "
                          "engine (dp): only it reduces gradients through a compressor", cfg->dp.compress, engines[cfg->kind]->name);
  if (cfg->dp.compress_start < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: compress start %lld; expected >= 0", (long long)cfg->dp.compress_start);
  TDM__TRY(check_model_side(cfg, "engine_create"));
  if (cfg->precision == TDM_F16 && tdm_compress_is_hook(cfg->dp.compress)) /* a skipped step would feed inf into the residuals */
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "engine_create: compress %s with precision f16: error feedback would keep an overflowing step's "
                          "gradients, which fp16 skips; use bf16 (no skipped steps) or --compress none|bf16|fp16",
                          cfg->dp.compress);
  tdm_engine *e = tdm__calloc(1, sizeof *e);
  if (!e) return tdm__set_error(TDM_ERR_NO_MEMORY, "engine_create: out of memory");
  e->ls_scale = cfg->precision != TDM_F16 ? 1.0 : cfg->loss_scale.init > 0 ? cfg->loss_scale.init : 65536.0;
  e->ops = engines[cfg->kind];
  e->cfg = *cfg;
  if (e->cfg.accum < 1) e->cfg.accum = 1;
  e->ocfg = *oc;
  e->grid = grid;
  e->comm = tdm_grid_comm(grid, TDM_AXIS_DATA);
  e->size = tdm_grid_size(grid, TDM_AXIS_DATA);
  e->rank = tdm_grid_index(grid, TDM_AXIS_DATA);
  tdm_status st = tdm_tape_create(&e->tape, 1u << 20);
  if (st == TDM_OK) st = tdm_tape_set_recompute(e->tape, cfg->recompute);
  if (st == TDM_OK) st = tdm_tape_set_autocast(e->tape, cfg->precision);
  if (st == TDM_OK) st = e->ops->create(e, mc, seed);
  if (st == TDM_OK && !e->seg_sums) {
    const int64_t *cut;
    st = tdm_params_segments(e->params, &cut, &e->n_seg);
    if (st == TDM_OK && !(e->seg_sums = tdm__malloc(sizeof(double) * (size_t)(e->n_seg + 1))))
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "engine_create: out of memory");
  }
  /* after create's own checks, which fail every rank alike without a word between them (a rank that
     failed first and went away would break a collective a slower one was still in) */
  if (st == TDM_OK) st = same_engine_everywhere(grid, seed, oc, cfg);
  if (st != TDM_OK) {
    tdm_status keep = tdm__set_error(st, "%s", tdm_last_error());
    tdm_engine_destroy(e);
    return keep;
  }
  *out = e;
  return TDM_OK;
}

void tdm_engine_destroy(tdm_engine *e) {
  if (!e) return;
  if (e->ops && e->ops->destroy) e->ops->destroy(e);
  tdm_optim_destroy(e->opt);
  tdm_model_destroy(e->model);
  tdm_tape_destroy(e->tape);
  tdm__free(e->spans);
  tdm__free(e->seg_sums);
  tdm__free(e);
}

#define NONNULL_E(ret, fn) TDM__NONNULL(e, ret, fn ": the engine e is NULL")
tdm_model *tdm_engine_model(const tdm_engine *e) {
  NONNULL_E(NULL, "tdm_engine_model");
  return e->model;
}
tdm_tape *tdm_engine_tape(const tdm_engine *e) {
  NONNULL_E(NULL, "tdm_engine_tape");
  return e->tape;
}
tdm_optim *tdm_engine_optim(const tdm_engine *e) {
  NONNULL_E(NULL, "tdm_engine_optim");
  return e->opt;
}
const tdm_grid *tdm_engine_grid(const tdm_engine *e) {
  NONNULL_E(NULL, "tdm_engine_grid");
  return e->grid;
}
const char *tdm_engine_describe(const tdm_engine *e) {
  NONNULL_E(NULL, "tdm_engine_describe");
  return e->desc;
}
int tdm_engine_replicas(const tdm_engine *e, int *index) {
  NONNULL_E(0, "tdm_engine_replicas");
  static const tdm_grid_axis order[TDM_AXIS_COUNT] = {TDM_AXIS_DATA, TDM_AXIS_PIPELINE, TDM_AXIS_TENSOR}; /* as ranks are numbered */
  int n = 1, at = 0;
  for (int k = 0; k < TDM_AXIS_COUNT; k++)
    if (!(e->ops->split & (1u << order[k]))) {
      at = at * tdm_grid_size(e->grid, order[k]) + tdm_grid_index(e->grid, order[k]);
      n *= tdm_grid_size(e->grid, order[k]);
    }
  if (index) *index = at;
  return n;
}
int tdm_engine_shard(const tdm_engine *e, const tdm_optim_span **spans) {
  if (spans) *spans = NULL;
  NONNULL_E(0, "tdm_engine_shard");
  if (spans) *spans = e->spans;
  return e->n_spans;
}

int tdm_engine_pieces(const tdm_engine *e, const tdm_engine_piece **pieces) {
  if (pieces) *pieces = NULL;
  return e && e->ops->pieces ? e->ops->pieces(e, pieces) : 0;
}

/* ---- the step: zero_grad, forward, backward, update ------------------------------------------ */

/* forward: the model, then the mean cross-entropy (label-smoothed when asked), and the accuracy
 * (or the engine's own). */
static tdm_tensor *forward(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, tdm_step_stats *st) {
  if (e->ops->loss) return e->ops->loss(e, x, y, st);
  tdm_tensor *logits = tdm_model_forward(e->model, e->tape, x);
  /* label smoothing's op reads f32: 16-bit logits widened (exact), as the plain loss reads them */
  if (logits && e->cfg.label_smoothing > 0 && logits->dtype != TDM_F32) logits = tdm_cast(e->tape, logits, TDM_F32);
  tdm_tensor *loss = e->cfg.label_smoothing > 0 ? tdm_cross_entropy_smooth(e->tape, logits, y, -100, e->cfg.label_smoothing)
                                                : tdm_cross_entropy(e->tape, logits, y, -100);
  if (loss) tdm__engine_count_correct(logits, y, &st->correct, &st->rows);
  return loss;
}

double tdm__engine_seed_scale(const tdm_engine *e) {
  return e->cfg.precision == TDM_F16 ? e->ls_scale / (double)(e->size > 0 ? e->size : 1) : 1.0;
}

/* backward, seeded with 1/accum so that the step's gradient is the mean over its micro-batches,
 * times the loss scale over the data ranks (fp16: small gradients stay above f16's smallest
 * values, and a rank's are one process's: tdm__engine_seed_scale). */
static tdm_status backward(tdm_engine *e, tdm_tensor *loss) {
  double seed = tdm__engine_seed_scale(e);
  if (e->cfg.accum == 1 && seed == 1.0) return tdm_backward(e->tape, loss);
  int64_t one[1] = {1};
  tdm_tensor *g = tdm_new(e->tape, TDM_F32, 0, one);
  if (!g) return tdm__set_error(tdm_tape_status(e->tape), "%s", tdm_tape_error(e->tape));
  *(float *)tdm_tensor_data(g) = (float)(seed / (double)e->cfg.accum);
  return tdm_backward_with(e->tape, loss, g);
}

/* fp16: whether any rank's gradients overflowed (the flag all-reduced: every rank skips alike). */
static tdm_status overflowed(tdm_engine *e, double sumsq, int *any) {
  int32_t flag = !isfinite(sumsq) || (e->cfg.overflow_hook && e->cfg.overflow_hook(e->cfg.overflow_ctx, e->steps));
  if (e->comm) TDM__TRY(tdm_comm_allreduce(e->comm, &flag, &flag, 1, TDM_I32, TDM_MAX, TDM_ALGO_AUTO));
  *any = flag != 0;
  return TDM_OK;
}

/* The scaler after a step: halved on an overflow, doubled after window clean steps in a row. A
 * scale below f16's smallest subnormal means every step overflows whatever the scale: the model
 * has diverged. */
static tdm_status scaler_update(tdm_engine *e, int overflow) {
  int64_t window = e->cfg.loss_scale.window > 0 ? e->cfg.loss_scale.window : 2000;
  if (overflow) {
    e->ls_scale *= 0.5, e->ls_good = 0;
    if (e->ls_scale < 0x1p-24)
      return tdm__set_error(TDM_ERR_INVALID_ARG,
                            "fp16: the gradients overflowed at every loss scale down to %g (step %lld): the model diverged",
                            e->ls_scale * 2, (long long)e->steps);
  } else if (++e->ls_good == window) {
    e->ls_scale *= 2.0, e->ls_good = 0;
  }
  return TDM_OK;
}

/* update: the global norm, the non-finite check (fp16: an overflow skips the step), clipping of the
 * unscaled gradients and the optimizer. */
static tdm_status update(tdm_engine *e, float lr, tdm_step_stats *st) {
  double sumsq;
  TDM__TRY(e->ops->grad_sumsq(e, &sumsq));
  return tdm__engine_update(e, sumsq, lr, st);
}

tdm_status tdm__engine_update(tdm_engine *e, double sumsq, float lr, tdm_step_stats *st) {
  double scale = tdm__engine_seed_scale(e); /* what the averaged gradients carry */
  st->loss_scale = e->ls_scale;
  if (e->cfg.precision == TDM_F16) {
    int any;
    TDM__TRY(overflowed(e, sumsq, &any));
    if (any) { /* nothing is applied; the next zero_grad clears the gradients */
      st->skipped = 1;
      st->grad_norm = NAN;
      return scaler_update(e, 1);
    }
  }
  float norm = (float)(sqrt(sumsq) / scale);
  st->grad_norm = norm;
  if (!isfinite(norm) && !e->cfg.allow_nonfinite)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "the gradient norm is %g (a NaN or Inf gradient)", (double)norm);
  float coef = isfinite(norm) ? tdm_clip_coef(norm, e->cfg.clip) : 1.0f;
  TDM__TRY(e->ops->update(e, lr, (float)(coef / scale)));
  return e->cfg.precision == TDM_F16 ? scaler_update(e, 0) : TDM_OK;
}

void tdm_engine_loss_scale(const tdm_engine *e, double *scale, int64_t *good_steps) {
  NONNULL_E(, "tdm_engine_loss_scale");
  if (scale) *scale = e->ls_scale;
  if (good_steps) *good_steps = e->ls_good;
}

tdm_status tdm_engine_set_loss_scale(tdm_engine *e, double scale, int64_t good_steps) {
  if (!e) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_set_loss_scale: NULL engine");
  if (!(scale > 0) || !isfinite(scale) || good_steps < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_set_loss_scale: scale %g, clean steps %lld; expected > 0 and >= 0", scale,
                          (long long)good_steps);
  if (e->cfg.precision != TDM_F16) return TDM_OK; /* nothing scales outside fp16 */
  e->ls_scale = scale, e->ls_good = good_steps;
  return TDM_OK;
}

void tdm__engine_count_correct(tdm_tensor *logits, tdm_tensor *y, double *correct, double *rows_out) {
  const int32_t *yy = tdm_tensor_data(y);
  int64_t C = tdm_tensor_dim(logits, -1), rows = tdm_tensor_numel(logits) / C;
  for (int64_t i = 0; i < rows; i++) *correct += tdm_tensor_row_argmax(logits, i) == yy[i]; /* f32 or 16-bit logits */
  *rows_out += (double)rows;
}

tdm_status tdm_engine_step(tdm_engine *e, tdm_batch_fn next, void *ctx, uint64_t dropout_seed, float lr,
                           tdm_step_stats *st) {
  if (!e || !next || !st) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_step: NULL argument");
  memset(st, 0, sizeof *st);
  if (!(lr >= 0 && isfinite(lr))) /* before anything is touched: inf made every parameter NaN and returned OK */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_step: lr %g; expected a finite value >= 0", (double)lr);
  if (e->ops->step) { /* an engine with its own step (the pipeline's schedule): counted here alike */
    tdm_status ss = e->ops->step(e, next, ctx, dropout_seed, lr, st);
    e->steps++;
    return ss;
  }
  tdm_tape *tp = e->tape;
  double loss_sum = 0;
  e->ops->zero_grad(e);
  for (int64_t m = 0; m < e->cfg.accum; m++) {
    int last = m == e->cfg.accum - 1;
    double t0 = tdm_time_now();
    tdm_tape_reset(tp);
    tdm_tape_set_training(tp, 1);
    tdm_tensor *x = NULL, *y = NULL;
    int64_t base = 0;
    TDM__TRY(next(ctx, tp, m, &x, &y, &base));
    if (!x || !y) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_step: the batch source gave no tensors");
    tdm_tape_set_dropout_key(tp, dropout_seed, base);
    double comm0 = st->t_comm_wait, tf = tdm_trace_begin();
    tdm_trace_args ma = TDM_TRACE_ARGS_INIT;
    ma.index = m; /* the micro-batch */
    if (tf > 0) tdm_trace_span("data", "data", t0, tf, &ma);
    tdm_tensor *loss = forward(e, x, y, st);
    if (!loss) return tdm__set_error(tdm_tape_status(tp), "forward: %s", tdm_tape_error(tp));
    if (tf > 0) tdm_trace_span("compute", "forward", tf, tdm_trace_now(), &ma);
    loss_sum += *(const float *)tdm_tensor_data(loss); /* a non-finite loss is the caller's to judge: it is this rank's */
    double fwd_comm = st->t_comm_wait - comm0; /* collectives inside forward (tensor parallelism) */
    st->samples += tdm_tensor_dim(x, 0);
    double t1 = tdm_time_now();
    e->ops->begin_backward(e, last);
    TDM__TRY(backward(e, loss));
    if (tf > 0) tdm_trace_span("compute", "backward", t1, tdm_trace_now(), &ma);
    double wait = 0;
    TDM__TRY(e->ops->end_backward(e, last, &wait));
    double t2 = tdm_time_now();
    st->t_forward += t1 - t0 - fwd_comm;
    st->t_backward += t2 - t1 - wait;
    st->t_comm_wait += wait;
  }
  st->loss = loss_sum / (double)e->cfg.accum;
  double t3 = tdm_time_now();
  tdm_status us = update(e, lr, st);
  e->steps++;
  TDM__TRY(us);
  st->t_update = tdm_time_now() - t3;
  if (tdm_trace_on()) tdm_trace_span("optimizer", "optimizer", t3, t3 + st->t_update, NULL);
  return TDM_OK;
}

tdm_status tdm_engine_eval(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, double *loss, double *correct, double *rows) {
  if (!e || !x || !y || !loss || !correct || !rows) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_eval: NULL argument");
  *loss = 0, *correct = 0, *rows = 0;
  if (e->ops->eval) return e->ops->eval(e, x, y, loss, correct, rows);
  tdm_tape *tp = e->tape;
  int grad = tdm_tape_grad_enabled(tp);
  tdm_tape_set_grad_enabled(tp, 0);
  tdm_tape_set_training(tp, 0);
  tdm_step_stats st;
  memset(&st, 0, sizeof st);
  tdm_tensor *l = forward(e, x, y, &st);
  tdm_tape_set_grad_enabled(tp, grad);
  if (!l) return tdm__set_error(tdm_tape_status(tp), "evaluation: %s", tdm_tape_error(tp));
  *loss = *(const float *)tdm_tensor_data(l);
  *correct = st.correct, *rows = st.rows;
  return TDM_OK;
}

/* ---- weights and parameters ------------------------------------------------------------------- */
tdm_status tdm_engine_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst) {
  if (!e || lo < 0 || hi < lo || hi > tdm_params_numel(e->params) || (hi > lo && !dst))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_read_params: [%lld, %lld) of %lld", (long long)lo, (long long)hi,
                          e ? (long long)tdm_params_numel(e->params) : 0LL);
  return e->ops->read_params(e, lo, hi, dst);
}

/* Every rank learns rank 0's status (and, when it failed, its error): a file written by rank 0
 * alone must not leave the other ranks believing it worked. */
static int world_rank(const tdm_engine *e) { return tdm_grid_world(e->grid) ? tdm_comm_rank(tdm_grid_world(e->grid)) : 0; }

static tdm_status agree(tdm_engine *e, tdm_status st) {
  tdm_comm_t w = tdm_grid_world(e->grid);
  if (!w) return st;
  char msg[512] = "";
  if (world_rank(e) == 0 && st != TDM_OK) snprintf(msg, sizeof msg, "%s", tdm_last_error());
  int32_t code = (int32_t)st;
  TDM__TRY(tdm_comm_broadcast(w, &code, 1, TDM_I32, 0, TDM_ALGO_AUTO));
  TDM__TRY(tdm_comm_broadcast(w, msg, sizeof msg, TDM_U8, 0, TDM_ALGO_AUTO));
  if (code == TDM_OK) return TDM_OK;
  return world_rank(e) == 0 ? st : tdm__set_error((tdm_status)code, "rank 0: %s", msg);
}

static tdm_status write_chunk(void *ctx, const float *data, int64_t n) {
  return tdm_safetensors_writer_write(ctx, data, sizeof(float) * (size_t)n);
}

tdm_status tdm_engine_save_weights(tdm_engine *e, const char *path, int n_meta, const char *const *meta_kv) {
  if (!e || !path) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_save_weights: NULL argument");
  tdm_st_writer *w = NULL;
  tdm_status st = TDM_OK;
  if (world_rank(e) == 0) { /* the header from the shapes alone: the data follow in parameter order */
    tdm_st_tensor *ts;
    st = tdm_params_st_tensors(e->params, &ts);
    if (st == TDM_OK) {
      st = tdm_safetensors_writer_open(&w, path, tdm_params_count(e->params), ts, n_meta, meta_kv);
      tdm__free(ts);
    }
  }
  TDM__TRY(agree(e, st)); /* every rank takes part in the stream, or none */
  st = e->ops->stream_params(e, write_chunk, w);
  if (world_rank(e) == 0) {
    if (st == TDM_OK) st = tdm_safetensors_writer_commit(w);
    else tdm_safetensors_writer_abort(w);
  }
  return agree(e, st);
}

tdm_status tdm_engine_load_weights(tdm_engine *e, const char *path) {
  if (!e || !path) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_load_weights: NULL argument");
  return e->ops->load_weights(e, path);
}

int tdm_engine_compress_stats(const tdm_engine *e, const tdm_compress_stats **out, uint64_t *grad_bytes) {
  if (grad_bytes) *grad_bytes = 0;
  return e && e->ops->compress_stats ? e->ops->compress_stats(e, out, grad_bytes) : 0;
}

int tdm_engine_compress_state(tdm_engine *e, int k, int64_t *lo, int64_t *hi, float **residual, float **shared,
                              int64_t *n_shared) {
  return e && e->ops->compress_state ? e->ops->compress_state(e, k, lo, hi, residual, shared, n_shared) : 0;
}

/* ---- state for checkpoints ---------------------------------------------------------------------- */
int tdm_engine_is_sharded(const tdm_engine *e) {
  NONNULL_E(0, "tdm_engine_is_sharded");
  return e->ops->param_shard != NULL;
}
int tdm_engine_params_whole(const tdm_engine *e) {
  NONNULL_E(0, "tdm_engine_params_whole");
  return !e->ops->param_shard || e->ops->param_shard((tdm_engine *)e) == NULL;
}

static int64_t owned_of(const tdm_engine *e) {
  int64_t n = 0;
  for (int i = 0; i < e->n_spans; i++) n += e->spans[i].hi - e->spans[i].lo;
  return n;
}

tdm_status tdm_engine_shard_state(tdm_engine *e, tdm_st_tensor *out, int *n) {
  if (!e || !out || !n) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_shard_state: NULL argument");
  if (!tdm_engine_is_sharded(e)) return tdm__set_error(TDM_ERR_INVALID_USAGE, "engine: %s keeps no shard", e->ops->name);
  int64_t ns = 0;
  float *state = tdm_optim_state(e->opt, &ns);
  int k = 0;
  out[k++] = (tdm_st_tensor){"optim.state", TDM_F32, 1, {ns}, state, ns * 4};
  out[k++] = (tdm_st_tensor){"shard.spans", TDM_I64, 2, {e->n_spans, 2}, e->spans, (int64_t)e->n_spans * 16};
  float *w = e->ops->param_shard(e);
  if (w) out[k++] = (tdm_st_tensor){"model.shard", TDM_F32, 1, {owned_of(e)}, w, owned_of(e) * 4};
  *n = k;
  return TDM_OK;
}

tdm_status tdm_engine_load_shard_state(tdm_engine *e, const tdm_st_tensor *(*find)(void *ctx, const char *name), void *ctx,
                                       int64_t optim_steps) {
  tdm_st_tensor want[3];
  int n;
  if (!find) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_engine_load_shard_state: the find callback is NULL");
  TDM__TRY(tdm_engine_shard_state(e, want, &n));
  const tdm_st_tensor *spans = find(ctx, "shard.spans");
  if (!spans || spans->dtype != TDM_I64 || spans->nbytes != want[1].nbytes || memcmp(spans->data, want[1].data, (size_t)want[1].nbytes)) {
    const int64_t *s = spans && spans->dtype == TDM_I64 && spans->nbytes >= 16 ? spans->data : NULL;
    return tdm__set_error(TDM_ERR_MISMATCH,
                          "the shard covers %lld span%s from [%lld, %lld); this rank of %s holds %d from [%lld, %lld): "
                          "it was written by another layout",
                          spans ? (long long)(spans->nbytes / 16) : 0LL, spans && spans->nbytes == 16 ? "" : "s",
                          s ? (long long)s[0] : -1LL, s ? (long long)s[1] : -1LL, e->desc, e->n_spans,
                          e->n_spans ? (long long)e->spans[0].lo : -1LL, e->n_spans ? (long long)e->spans[0].hi : -1LL);
  }
  for (int i = 0; i < n; i++) { /* everything checked before anything changes */
    const tdm_st_tensor *t = find(ctx, want[i].name);
    if (!t || t->dtype != want[i].dtype || t->nbytes != want[i].nbytes)
      return tdm__set_error(TDM_ERR_MISMATCH, "the shard's '%s' is %s%lld bytes; this rank needs %lld", want[i].name,
                            t ? "" : "missing, not ", t ? (long long)t->nbytes : 0LL, (long long)want[i].nbytes);
  }
  for (int i = 0; i < n; i++)
    if (i != 1 && want[i].nbytes) memcpy((void *)want[i].data, find(ctx, want[i].name)->data, (size_t)want[i].nbytes); /* live buffers */
  tdm_optim_set_steps(e->opt, optim_steps);
  return e->ops->shard_changed(e);
}

tdm_status tdm_engine_shard_loaded(tdm_engine *e, int64_t optim_steps) {
  if (!e || optim_steps < 0) /* Adam's bias correction counts them */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_shard_loaded: %s, %lld optimizer steps; expected an engine and >= 0",
                          e ? "an engine" : "NULL", (long long)optim_steps);
  tdm_optim_set_steps(e->opt, optim_steps);
  return e->ops->shard_changed ? e->ops->shard_changed(e) : TDM_OK;
}

tdm_status tdm_engine_first_nonfinite(tdm_engine *e, int64_t *index) {
  if (!e || !index) return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_first_nonfinite: NULL argument");
  if (e->ops->first_nonfinite) return e->ops->first_nonfinite(e, index);
  int64_t first = -1;
  float *w = tdm_engine_is_sharded(e) ? e->ops->param_shard(e) : NULL;
  if (w) { /* stage 3: each rank looks at its pieces; the smallest index wins */
    for (int s = 0, at = 0; s < e->n_spans && first < 0; at += (int)(e->spans[s].hi - e->spans[s].lo), s++)
      for (int64_t i = 0; i < e->spans[s].hi - e->spans[s].lo; i++)
        if (!isfinite(w[at + i])) {
          first = e->spans[s].lo + i;
          break;
        }
    int64_t key = first < 0 ? INT64_MAX : first;
    tdm_comm_t w = tdm_grid_world(e->grid); /* every rank's pieces: the data axis, or the whole grid */
    if (w) TDM__TRY(tdm_comm_allreduce(w, &key, &key, 1, TDM_I64, TDM_MIN, TDM_ALGO_AUTO));
    first = key == INT64_MAX ? -1 : key;
  } else { /* whole and the same on every rank */
    const float *p = tdm_params_data(e->params);
    int64_t n = tdm_params_numel(e->params);
    for (int64_t i = 0; i < n; i++)
      if (!isfinite(p[i])) {
        first = i;
        break;
      }
  }
  *index = first;
  return TDM_OK;
}

/* ---- shared by the engines ---------------------------------------------------------------------- */
tdm_status tdm__engine_sumsq_full(tdm_engine *e, const float *grad, double *sumsq) {
  TDM__TRY(tdm_grad_sumsq_segments(e->params, 0, tdm_params_numel(e->params), grad, e->seg_sums));
  *sumsq = tdm_grad_sumsq_combine(e->seg_sums, e->n_seg);
  return TDM_OK;
}

tdm_status tdm__engine_sumsq_sharded(tdm_engine *e, int n_spans, const tdm_optim_span *spans, float *const *grads,
                                     double *sumsq) {
  memset(e->seg_sums, 0, sizeof(double) * (size_t)e->n_seg);
  for (int i = 0; i < n_spans; i++)
    if (spans[i].hi > spans[i].lo) TDM__TRY(tdm_grad_sumsq_segments(e->params, spans[i].lo, spans[i].hi, grads[i], e->seg_sums));
  /* each segment has one non-zero term: the sum is exact whatever order the all-reduce adds in */
  if (e->comm)
    TDM__TRY(tdm_comm_allreduce(e->comm, e->seg_sums, e->seg_sums, (size_t)e->n_seg, TDM_F64, TDM_SUM, TDM_ALGO_AUTO));
  *sumsq = tdm_grad_sumsq_combine(e->seg_sums, e->n_seg);
  return TDM_OK;
}
