/* The tensor-parallel engine (Megatron-LM style) over the grid's tensor axis, with data
 * parallelism over its data axis.
 *
 * The engine's model is the whole GPT's or Llama's parameter store in address space only (names,
 * shapes, offsets, the gradient-norm segments: reserved, never touched), so everything said in the
 * whole model's terms stays so: tdm_engine_read_params, load and save, the index of a non-finite value,
 * the norm. Each rank computes with its slices (tp_model.c): its own parameter store, optimizer and
 * gradients; data parallelism averages those over the data axis (tdm_dp). A rank's state for
 * checkpoints is its slices and their optimizer state: the engine is "sharded".
 *
 * The gradient norm is the whole model's, by its segments: each rank adds the squares of the
 * pieces of its slices that fall into each segment (a replicated parameter counted by tensor rank
 * 0 only), the segment sums are all-reduced over the tensor axis in rank order and combined in
 * segment order, so every rank gets the same bits.
 *
 * ZeRO stage 1 on the data axis (cfg.tp.zero_stage): the gradients are still averaged whole (the
 * same all-reduce, so the norm and every update keep the bits of stage 0); data rank d keeps the
 * optimizer state of, and updates, its part [zcut[d], zcut[d + 1]) of the slices' store, cut on
 * rows of the slices so that each part is a list of boxes in a checkpoint (zero1_boxes.c); then
 * the parts are all-gathered over the data axis.
 *
 * Drift: replicated parameters are computed alike on every rank and must stay bitwise identical;
 * every cfg.tp.check_every steps each one's hash is all-gathered over the world and a difference
 * fails the step, naming the parameter, the ranks and the largest difference. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/engine_impl.h"
#include "parallel/tp_model.h"
#include "tandem/dp.h"

#define STAGE_FLOATS (TDM__TP_STAGE_BYTES / 8) /* what assembling a parameter holds at once (two of them) */

typedef struct {
  tdm__tp_model *g;
  tdm_params *local;
  tdm_comm_t tcomm, world;
  int T, t, W, R;
  tdm_dp *dp;
  tdm__tp_piece *pieces;
  double *piece_sums;
  int64_t n_pieces;
  int64_t steps;
  int *rep, n_rep;     /* replicated parameters */
  uint64_t *hashes;    /* [W * n_rep] */
  float *stage;        /* 2 x STAGE_FLOATS (T > 1): made with the engine, so that saving adds nothing */
  tdm_engine_piece *boxes; /* the slices as boxes of the whole model's parameters (checkpoints) */
  int n_boxes;
  int check_due;       /* the drift check runs before this step's first forward */
  int zero1;           /* ZeRO stage 1 over the data axis (e->comm, e->size ranks) */
  int64_t *zcut;       /* zero1: data rank d updates [zcut[d], zcut[d + 1]) of the slices' store */
  double fwd_comm_mark, bwd_comm_mark;
} tp_state;

static tp_state *S(const tdm_engine *e) { return e->impl; }

/* ---- the whole model's parameters refuse to be run ------------------------------------------------ */
static tdm_status refuse(void *ctx, tdm_tensor *p, int64_t lo, int64_t hi, int backward) {
  (void)ctx, (void)lo, (void)hi, (void)backward;
  return tdm__set_error(TDM_ERR_INVALID_USAGE,
                        "parameter '%s' is split over the tensor axis (tensor parallelism): run the model through the "
                        "engine (tdm_engine_step, tdm_engine_eval), not tdm_model_forward",
                        tdm_tensor_name(p));
}

/* ---- the norm's pieces ---------------------------------------------------------------------------- */
static tdm_status make_pieces(tdm_engine *e, tp_state *z) {
  TDM__TRY(tdm__tp_norm_pieces(e->params, z->T, z->t, NULL, &z->n_pieces));
  z->pieces = tdm__malloc(sizeof(tdm__tp_piece) * (size_t)(z->n_pieces ? z->n_pieces : 1));
  z->piece_sums = tdm__malloc(sizeof(double) * (size_t)(z->n_pieces ? z->n_pieces : 1));
  if (!z->pieces || !z->piece_sums) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  return tdm__tp_norm_pieces(e->params, z->T, z->t, z->pieces, &z->n_pieces);
}

typedef struct {
  const tp_state *z;
  const float *g;
} sumsq_ctx;

static void sumsq_range(void *vc, int64_t a, int64_t b) {
  const sumsq_ctx *c = vc;
  for (int64_t k = a; k < b; k++) {
    const tdm__tp_piece *p = &c->z->pieces[k];
    const float *g = c->g + p->local;
    double s = 0;
    for (int64_t j = 0; j < p->len; j++) s += (double)g[j] * g[j];
    c->z->piece_sums[k] = s;
  }
}

static tdm_status tp_grad_sumsq(tdm_engine *e, double *sumsq) {
  tp_state *z = S(e);
  sumsq_ctx c = {z, tdm_params_grad(z->local)};
  tdm_parallel_for(z->n_pieces, 64, sumsq_range, &c);
  memset(e->seg_sums, 0, sizeof(double) * (size_t)e->n_seg);
  for (int64_t k = 0; k < z->n_pieces; k++) e->seg_sums[z->pieces[k].seg] += z->piece_sums[k]; /* piece order: fixed */
  if (z->tcomm)
    TDM__TRY(tdm_comm_allreduce(z->tcomm, e->seg_sums, e->seg_sums, (size_t)e->n_seg, TDM_F64, TDM_SUM,
                                tdm_comm_rank_order_algo(z->tcomm)));
  *sumsq = tdm_grad_sumsq_combine(e->seg_sums, e->n_seg);
  return TDM_OK;
}

/* ---- drift of the replicated parameters ---------------------------------------------------------- */
static uint64_t hash_floats(const float *x, int64_t n) {
  uint64_t h = 0x7470647269667400ull;
  const uint32_t *u = (const uint32_t *)(const void *)x;
  for (int64_t i = 0; i < n; i++) h = tdm_hash64(h, u[i]);
  return h;
}

static tdm_status check_replicas(tdm_engine *e) {
  tp_state *z = S(e);
  if (!z->world || !z->n_rep) return TDM_OK;
  uint64_t *mine = z->hashes + (size_t)z->R * (size_t)z->n_rep;
  for (int k = 0; k < z->n_rep; k++) {
    tdm_tensor *t = tdm_params_get(z->local, z->rep[k]);
    mine[k] = hash_floats(tdm_tensor_data(t), tdm_tensor_numel(t));
  }
  TDM__TRY(tdm_comm_allgather(z->world, mine, z->hashes, (size_t)z->n_rep, TDM_I64, TDM_ALGO_AUTO));
  for (int k = 0; k < z->n_rep; k++)
    for (int r = 1; r < z->W; r++) {
      if (z->hashes[(size_t)r * z->n_rep + k] == z->hashes[k]) continue;
      /* every rank sees the same hashes: the same error everywhere, with no further collective */
      tdm_tensor *t = tdm_params_get(z->local, z->rep[k]);
      int others = 0;
      for (int q = r; q < z->W; q++) others += z->hashes[(size_t)q * z->n_rep + k] != z->hashes[k];
      return tdm__set_error(TDM_ERR_MISMATCH,
                            "tensor parallelism: the replicated parameter '%s' has drifted: rank %d's copy differs from "
                            "rank 0's (%d rank%s differ) after %lld steps; it must be bitwise identical on every rank "
                            "(a nondeterministic kernel, or a rank given other weights)",
                            tdm_tensor_name(t), r, others, others == 1 ? "" : "s", (long long)z->steps);
    }
  return TDM_OK;
}

/* ---- assembling a whole parameter from the tensor ranks' slices ---------------------------------- */
static int64_t len_of(const tdm__tp_slice *s, int T, int q) {
  return s->sharded ? (s->m * (q + 1) / T - s->m * q / T) * s->unit : s->len;
}

/* Rank t's runs [r0, r1) of parameter i from every tensor rank, interleaved into out as the whole
 * parameter lays them out (each rank's part of a run, in rank order). To every tensor rank. */
static tdm_status gather_runs(tdm_engine *e, int i, int64_t r0, int64_t r1, float *tmp, float *out) {
  tp_state *z = S(e);
  const tdm__tp_slice *s = tdm__tp_model_slice(z->g, i);
  const float *mine = tdm_tensor_data(tdm_params_get(z->local, i));
  size_t parts[64];
  int64_t at[65];
  at[0] = 0;
  for (int q = 0; q < z->T; q++) {
    parts[q] = (size_t)((r1 - r0) * len_of(s, z->T, q));
    at[q + 1] = at[q] + (int64_t)parts[q];
  }
  TDM__TRY(tdm_comm_allgather_v(z->tcomm, mine + r0 * s->len, tmp, (size_t)at[z->T], parts, TDM_F32, TDM_ALGO_AUTO));
  int64_t o = 0;
  for (int64_t r = r0; r < r1; r++)
    for (int q = 0; q < z->T; q++) {
      int64_t l = len_of(s, z->T, q);
      memcpy(out + o, tmp + at[q] + (r - r0) * l, sizeof(float) * (size_t)l);
      o += l;
    }
  return TDM_OK;
}

/* Calls emit(ctx, data, n) with parameter i in whole order, a chunk at a time, on every tensor rank. */
static tdm_status each_chunk(tdm_engine *e, int i, tdm_status (*emit)(void *, const float *, int64_t), void *ctx) {
  tp_state *z = S(e);
  const tdm__tp_slice *s = tdm__tp_model_slice(z->g, i);
  tdm_tensor *mine = tdm_params_get(z->local, i);
  if (!s->sharded || !z->tcomm) return emit(ctx, tdm_tensor_data(mine), tdm_tensor_numel(mine));
  if (s->stride <= STAGE_FLOATS) { /* whole runs, as many as fit */
    int64_t per = STAGE_FLOATS / s->stride;
    for (int64_t r0 = 0; r0 < s->count; r0 += per) {
      int64_t r1 = r0 + per < s->count ? r0 + per : s->count;
      TDM__TRY(gather_runs(e, i, r0, r1, z->stage, z->stage + STAGE_FLOATS));
      TDM__TRY(emit(ctx, z->stage + STAGE_FLOATS, (r1 - r0) * s->stride));
    }
    return TDM_OK;
  }
  /* runs longer than the stage: each rank's part of a run in turn, in pieces, broadcast by its holder */
  for (int64_t r = 0; r < s->count; r++)
    for (int q = 0; q < z->T; q++) {
      int64_t l = len_of(s, z->T, q);
      for (int64_t x = 0; x < l; x += STAGE_FLOATS) {
        int64_t n = l - x < STAGE_FLOATS ? l - x : STAGE_FLOATS;
        if (q == z->t) memcpy(z->stage, (float *)tdm_tensor_data(mine) + r * s->len + x, sizeof(float) * (size_t)n);
        TDM__TRY(tdm_comm_broadcast(z->tcomm, z->stage, (size_t)n, TDM_F32, q, TDM_ALGO_AUTO));
        TDM__TRY(emit(ctx, z->stage, n));
      }
    }
  return TDM_OK;
}

/* ---- the slices as boxes of the whole parameters (checkpoints of logical tensors) ------------------ */
static int held_all(void *ctx, int i, int64_t *state_at) { /* every parameter: its slices' state lies as they do */
  *state_at = tdm_params_offset(ctx, i);
  return 1;
}

/* The boxes, and the optimizer's span: the whole store, or with ZeRO stage 1 this data rank's part
 * of it (cut on the boxes' rows) and the boxes' parts in it, each written by the rank that holds
 * its state (replicated parameters: by one tensor rank, as without ZeRO). */
static tdm_status make_boxes(tdm_engine *e, tp_state *z) {
  int D = z->zero1 ? 1 : e->size, d = z->zero1 ? 0 : e->rank; /* zero1: write is decided by the parts */
  z->n_boxes = tdm__tp_model_boxes(z->g, e->params, D, d, held_all, z->local, NULL);
  if (!(z->boxes = tdm__malloc(sizeof *z->boxes * (size_t)(z->n_boxes ? z->n_boxes : 1))))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  tdm__tp_model_boxes(z->g, e->params, D, d, held_all, z->local, z->boxes);
  int64_t n = tdm_params_numel(z->local);
  e->spans[0] = (tdm_optim_span){0, n}, e->n_spans = 1;
  if (!z->zero1) return TDM_OK;
  if (!(z->zcut = tdm__malloc(sizeof(int64_t) * (size_t)(e->size + 1))))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  for (int r = 0; r <= e->size; r++) z->zcut[r] = tdm__boxes_align(e->params, z->boxes, z->n_boxes, n * r / e->size);
  int64_t lo = z->zcut[e->rank], hi = z->zcut[e->rank + 1];
  z->n_boxes = tdm__boxes_window(e->params, z->boxes, z->n_boxes, lo, hi);
  e->spans[0] = (tdm_optim_span){lo, hi}, e->n_spans = hi > lo;
  return TDM_OK;
}

/* ZeRO stage 1: every data rank's updated part, to every rank of the data axis (in place). */
static tdm_status gather_parts(tdm_engine *e, tp_state *z) {
  if (!z->zero1) return TDM_OK;
  size_t parts[e->size];
  for (int r = 0; r < e->size; r++) parts[r] = (size_t)(z->zcut[r + 1] - z->zcut[r]);
  float *w = tdm_params_data(z->local);
  return tdm_comm_allgather_v(e->comm, w + z->zcut[e->rank], w, (size_t)z->zcut[e->size], parts, TDM_F32,
                              tdm_comm_rank_order_algo(e->comm));
}

static int tp_pieces(const tdm_engine *e, const tdm_engine_piece **pieces) {
  if (pieces) *pieces = S(e)->boxes;
  return S(e)->n_boxes;
}

/* ---- the engine ----------------------------------------------------------------------------------- */
static const tdm__engine_ops tp_zero1_ops;

static tdm_status tp_create(tdm_engine *e, const tdm_model_config *mc, uint64_t seed) {
  tp_state *z = tdm__calloc(1, sizeof *z);
  if (!z) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  e->impl = z;
  z->T = tdm_grid_size(e->grid, TDM_AXIS_TENSOR);
  z->t = tdm_grid_index(e->grid, TDM_AXIS_TENSOR);
  z->tcomm = tdm_grid_comm(e->grid, TDM_AXIS_TENSOR);
  z->world = tdm_grid_world(e->grid);
  z->W = z->world ? tdm_comm_size(z->world) : 1;
  z->R = z->world ? tdm_comm_rank(z->world) : 0;
  if (z->T > 64) return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: %d ranks; at most 64", z->T);
  if (e->cfg.tp.check_every < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: check_every %lld; expected >= 0 (0: never)",
                          (long long)e->cfg.tp.check_every);
  if (e->cfg.tp.zero_stage < 0 || e->cfg.tp.zero_stage > 1)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "tensor parallelism: ZeRO stage %d on the data axis; expected 0 or 1 (stages 2 and 3 "
                          "shard gradients and parameters, which the slices keep whole)", e->cfg.tp.zero_stage);
  z->zero1 = e->cfg.tp.zero_stage == 1 && e->comm && e->size > 1;
  TDM__TRY(tdm__tp_check(mc, z->T));
  if (mc->kind != TDM_MODEL_GPT && mc->kind != TDM_MODEL_LLAMA)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism splits the gpt and llama models; the %s model is neither",
                          tdm_model_kind_name(mc->kind));
  /* the whole model in address space only: its names, shapes, offsets and initial values */
  TDM__TRY(tdm_model_create_with(&e->model, mc, seed, TDM_RESERVE_DATA | TDM_RESERVE_GRAD));
  e->params = tdm_model_params(e->model);
  for (int i = 0; i < tdm_params_count(e->params); i++) tdm_tensor_set_fetch_hook(tdm_params_get(e->params, i), refuse, NULL);
  TDM__TRY(tdm__tp_model_create(&z->g, e->params, mc, z->tcomm, z->T, z->t));
  z->local = tdm__tp_model_params(z->g);
  if (!(e->spans = tdm__malloc(sizeof *e->spans))) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  TDM__TRY(make_boxes(e, z)); /* and the optimizer's span, in this rank's own store */
  TDM__TRY(tdm_optim_create_spans(&e->opt, &e->ocfg, z->local, e->n_spans, e->spans));
  if (z->zero1) e->ops = &tp_zero1_ops;
  if (e->comm && e->size > 1) { /* data parallelism over the data axis: the same slices on each of its ranks */
    const tdm_engine_dp_config *c = &e->cfg.dp;
    /* when both axes are split from the world they share its transport, which serves one
     * communicator at a time: the buckets are averaged after backward, not beside its all-reduces */
    int shared = z->tcomm && z->tcomm != z->world && e->comm != z->world;
    tdm_dp_config dc = {.bucket_bytes = c->bucket_bytes, .first_bucket_bytes = c->first_bucket_bytes,
                        .wire_dtype = c->wire_dtype ? c->wire_dtype : TDM_F32, .no_overlap = c->no_overlap || shared};
    TDM__TRY(tdm_dp_create(&z->dp, e->comm, z->local, &dc));
  }
  int n = tdm_params_count(z->local);
  z->rep = tdm__malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!z->rep) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  for (int i = 0; i < n; i++)
    if (!tdm__tp_model_slice(z->g, i)->sharded) z->rep[z->n_rep++] = i;
  if (!(z->hashes = tdm__malloc(sizeof(uint64_t) * (size_t)z->W * (size_t)(z->n_rep ? z->n_rep : 1))))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  TDM__TRY(make_pieces(e, z));
  if (z->tcomm && !(z->stage = tdm__malloc_cat(sizeof(float) * 2 * STAGE_FLOATS, TDM_MEM_WORKSPACE)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  TDM__TRY(check_replicas(e)); /* every rank made its replicas alike (the same seed, the same code) */
  char dp[48] = "";
  if (e->size > 1) snprintf(dp, sizeof dp, " x data parallel %d%s", e->size, z->zero1 ? " (ZeRO stage 1)" : "");
  snprintf(e->desc, sizeof e->desc, "tensor parallel %d%s", z->T, dp);
  return TDM_OK;
}

static void tp_destroy(tdm_engine *e) {
  tp_state *z = S(e);
  if (!z) return;
  tdm_dp_destroy(z->dp);
  tdm_optim_destroy(e->opt); /* it points at the slices' store: goes before it */
  e->opt = NULL;
  tdm__tp_model_destroy(z->g);
  tdm__free(z->pieces);
  tdm__free(z->piece_sums);
  tdm__free(z->rep);
  tdm__free(z->hashes);
  tdm__free(z->stage);
  tdm__free(z->boxes);
  tdm__free(z->zcut);
  tdm__free(z);
}

/* Zeroing starts a step: the drift check is due on the values it starts from (those the last
 * update, or a load, left), so a perturbed replica is named before it spreads to the others. */
static void tp_zero_grad(tdm_engine *e) {
  tp_state *z = S(e);
  tdm_params_zero_grad(z->local);
  z->check_due = e->cfg.tp.check_every > 0 && z->steps % e->cfg.tp.check_every == 0;
}

static void tp_begin_backward(tdm_engine *e, int last) {
  tp_state *z = S(e);
  if (z->dp) tdm_dp_set_sync(z->dp, last);
  z->bwd_comm_mark = tdm__tp_model_comm(z->g)->seconds;
}

static tdm_status tp_end_backward(tdm_engine *e, int last, double *wait_s) {
  tp_state *z = S(e);
  *wait_s += tdm__tp_model_comm(z->g)->seconds - z->bwd_comm_mark; /* backward's all-reduces (f) */
  if (!z->dp) return TDM_OK;
  double ms = 0;
  tdm_status st = tdm_dp_finish(z->dp, &ms);
  if (last) *wait_s += ms * 1e-3;
  return st;
}

static tdm_tensor *tp_loss(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, tdm_step_stats *st) {
  tp_state *z = S(e);
  tdm__tp_comm *c = tdm__tp_model_comm(z->g);
  if (z->check_due) {
    z->check_due = 0;
    tdm_status cs = check_replicas(e);
    if (cs != TDM_OK) return tdm_tape_fail(e->tape, cs, "%s", tdm_last_error());
  }
  double t0 = c->seconds;
  tdm_tensor *loss = tdm__tp_model_loss(z->g, e->tape, x, y, &st->correct, &st->rows);
  st->t_comm_wait += c->seconds - t0;
  return loss;
}

static tdm_status tp_update(tdm_engine *e, float lr, float coef) {
  tp_state *z = S(e);
  for (int s = 0; s < e->n_spans; s++)
    tdm_grad_scale(tdm_params_grad(z->local) + e->spans[s].lo, e->spans[s].hi - e->spans[s].lo, coef);
  TDM__TRY(tdm_optim_step(e->opt, lr));
  z->steps++;
  return gather_parts(e, z);
}

typedef struct {
  float *dst;
  int64_t at, lo, hi; /* the parameter's next element (whole index); the window wanted */
} window;

static tdm_status to_window(void *ctx, const float *data, int64_t n) {
  window *w = ctx;
  int64_t b = w->at > w->lo ? w->at : w->lo, x = w->at + n < w->hi ? w->at + n : w->hi;
  if (b < x) memcpy(w->dst + (b - w->lo), data + (b - w->at), sizeof(float) * (size_t)(x - b));
  w->at += n;
  return TDM_OK;
}

static tdm_status tp_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst) {
  window w = {dst, 0, lo, hi};
  for (int i = 0; i < tdm_params_count(e->params); i++) {
    int64_t off = tdm_params_offset(e->params, i), n = tdm_tensor_numel(tdm_params_get(e->params, i));
    if (off + n <= lo || off >= hi) continue; /* the same on every rank: the gathers line up */
    w.at = off;
    TDM__TRY(each_chunk(e, i, to_window, &w));
  }
  return TDM_OK;
}

typedef struct {
  tdm_status (*write)(void *, const float *, int64_t);
  void *ctx;
  int writer;
} sink;

static tdm_status to_sink(void *ctx, const float *data, int64_t n) {
  sink *s = ctx;
  return s->writer ? s->write(s->ctx, data, n) : TDM_OK;
}

/* The writer is world rank 0; its tensor group assembles each parameter (the other data-parallel
 * groups hold the same values and stay out). */
static tdm_status tp_stream_params(tdm_engine *e, tdm_status (*write)(void *, const float *, int64_t), void *ctx) {
  tp_state *z = S(e);
  if (e->rank != 0) return TDM_OK;
  sink s = {write, ctx, z->R == 0};
  for (int i = 0; i < tdm_params_count(e->params); i++) TDM__TRY(each_chunk(e, i, to_sink, &s));
  return TDM_OK;
}

/* Every rank reads its slices of every parameter from the file (the whole model's). */
static tdm_status tp_load_weights(tdm_engine *e, const char *path) {
  tp_state *z = S(e);
  int64_t n = 0;
  for (int i = 0; i < tdm_params_count(z->local); i++) n += tdm__tp_model_slice(z->g, i)->count;
  int64_t *lo = tdm__malloc(sizeof(int64_t) * 2 * (size_t)n);
  float **dst = tdm__malloc(sizeof(float *) * (size_t)n);
  tdm_status st = lo && dst ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  for (int i = 0, k = 0; st == TDM_OK && i < tdm_params_count(z->local); i++) {
    const tdm__tp_slice *s = tdm__tp_model_slice(z->g, i);
    int64_t off = tdm_params_offset(e->params, i);
    float *mine = tdm_tensor_data(tdm_params_get(z->local, i));
    for (int64_t r = 0; r < s->count; r++, k++) {
      lo[k] = off + s->first + r * s->stride;
      lo[n + k] = lo[k] + s->len;
      dst[k] = mine + r * s->len;
    }
  }
  if (st == TDM_OK && n > (int64_t)1 << 30) st = tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: %lld slices", (long long)n);
  if (st == TDM_OK) st = tdm_params_load_spans(e->params, path, 0, (int)n, lo, lo + n, dst);
  tdm__free(lo);
  tdm__free(dst);
  return st;
}

/* The store from the optimizer's span (zero1: this data rank's part). */
static float *tp_param_shard(tdm_engine *e) { return tdm_params_data(S(e)->local) + (e->n_spans ? e->spans[0].lo : 0); }

/* A load wrote this data rank's part (zero1): the others' from them. */
static tdm_status tp_shard_changed(tdm_engine *e) { return gather_parts(e, S(e)); }

/* The first non-finite value of any rank's slices, as an index into the whole model. */
static tdm_status tp_first_nonfinite(tdm_engine *e, int64_t *index) {
  tp_state *z = S(e);
  int64_t key = INT64_MAX;
  for (int i = 0; i < tdm_params_count(z->local) && key == INT64_MAX; i++) {
    const tdm__tp_slice *s = tdm__tp_model_slice(z->g, i);
    const float *v = tdm_tensor_data(tdm_params_get(z->local, i));
    for (int64_t k = 0; k < s->count * s->len; k++)
      if (!isfinite(v[k])) {
        key = tdm_params_offset(e->params, i) + s->first + (k / s->len) * s->stride + k % s->len;
        break;
      }
  }
  if (z->world) TDM__TRY(tdm_comm_allreduce(z->world, &key, &key, 1, TDM_I64, TDM_MIN, TDM_ALGO_AUTO));
  *index = key == INT64_MAX ? -1 : key;
  return TDM_OK;
}

/* The layout against the model, before anything is built. */
static tdm_status tp_check(const tdm_model_config *mc, const tdm_engine_config *ec, const int *sizes) {
  (void)ec;
  return tdm__tp_check(mc, sizes[TDM_AXIS_TENSOR]);
}

/* Mixed precision: the tape autocasts, the custom ops (tp_ops.c) widen 16-bit inputs and sum f32;
 * an fp16 overflow skips the step on every rank (the norm is global). Recomputation: the split
 * blocks run under tdm_checkpoint (tp_model.c), the attention op rebuilds its probabilities under
 * selective. ZeRO stage 1 splits the data axis's state too. */
#define TP_OPS(SPLIT) \
  { \
    .name = "tp", \
    .create = tp_create, \
    .destroy = tp_destroy, \
    .zero_grad = tp_zero_grad, \
    .begin_backward = tp_begin_backward, \
    .end_backward = tp_end_backward, \
    .grad_sumsq = tp_grad_sumsq, \
    .update = tp_update, \
    .read_params = tp_read_params, \
    .stream_params = tp_stream_params, \
    .load_weights = tp_load_weights, \
    .param_shard = tp_param_shard, \
    .shard_changed = tp_shard_changed, \
    .axes = 1u << TDM_AXIS_TENSOR, \
    .check = tp_check, \
    .split = 1u << TDM_AXIS_TENSOR | (SPLIT), \
    .loss = tp_loss, \
    .first_nonfinite = tp_first_nonfinite, \
    .pieces = tp_pieces, \
    .mixed = 1, \
    .recompute = 1, \
  }

const tdm__engine_ops tdm__engine_tp_ops = TP_OPS(0);
static const tdm__engine_ops tp_zero1_ops = TP_OPS(1u << TDM_AXIS_DATA);
