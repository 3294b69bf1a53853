/* The ZeRO engine: stages 1-3 of sharding over the data axis (Rajbhandari et al. 2020), as
 * DeepSpeed and PyTorch's FSDP do it, built on the same buckets and hooks as data parallelism.
 *
 * The parameter buffer is cut into groups: gradient buckets at stages 1-2 (spans of whole
 * parameters, in reverse order, as DDP's), gather units at stage 3 (one or more modules: a
 * transformer block, a layer). Each group is split into one piece per rank, on gradient-norm
 * segment boundaries; rank r owns piece r of every group, and its optimizer updates exactly
 * those pieces (tdm_optim_create_spans).
 *   stage 1  gradients complete on every rank during backward; when a bucket is ready it is
 *            reduce-scattered (each rank gets its piece, summed in rank order, averaged) into
 *            the piece's place in the gradient buffer; after the update every bucket's
 *            parameters are all-gathered.
 *   stage 2  the same, but the gradient buffer is reserved address space: a bucket's gradients
 *            are reduce-scattered into a compact shard and their pages given back.
 *   stage 3  parameters too: each rank keeps its pieces in a compact shard; a fetch hook on every
 *            parameter gathers its unit into the (reserved) parameter buffer just before an op
 *            reads it, in forward and again in backward, prefetching the next unit on the
 *            communication thread, and gives back least recently used units beyond two. A large
 *            table (a language model's embedding or head) is a unit per block of rows, which
 *            tdm_embedding and tdm_lm_head read (and finish the gradient of) one at a time: a
 *            rank never holds the whole table, nor its whole gradient.
 * Reductions sum in rank order, as data parallelism's, so every stage gives stage 0's bits.
 * With gradient accumulation the gradients of the first micro-batches stay whole (as FSDP's
 * no_sync) and only the last micro-batch's backward reduces: the bits stay the same. */
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "nn/params_impl.h"
#include "parallel/common.h"
#include "parallel/engine_impl.h"
#include "parallel/layout.h"
#include "tensor/tensor_impl.h"
#include "tandem/trace.h"

#define MAX_RESIDENT 2 /* stage 3: gathered units kept (the current one and the one before) */

typedef struct zero_state zero_state;

typedef struct {
  int64_t lo, hi;        /* the group's span (from the layout) */
  const int64_t *cut;    /* [P + 1]: piece r is [cut[r], cut[r + 1]) */
  int n_params;
  int pending;           /* gradients not yet final in this backward */
  float *shard_g;        /* stages 2-3: my piece of the reduced gradient */
  float *shard_w;        /* stage 3: my piece of the parameters */
  tdm_work_t reduce;     /* the reduce-scatter in flight */
  tdm_work_t gather;     /* stage 3: the gather in flight */
  int resident;          /* stage 3: gathered into the parameter buffer */
  int grads_counted;     /* its gradient span is counted as held */
  int64_t done;          /* rows of a table: elements of its gradient final so far in this backward */
  uint64_t last_use;
  zero_state *z;
} group;

struct zero_state {
  int stage;
  tdm__layout L;
  group *g;              /* [L.ng], state beside the layout's groups */
  int ng;
  const int *group_of;   /* parameter index -> its first group */
  const int *n_of;       /* and how many (a table: one per block of rows) */
  int next_launch;       /* groups reduce strictly in index order on every rank */
  int sync;              /* this backward reduces */
  int inline_comm;       /* no core spare: reduce and gather on the training thread, no prefetch */
  int in_place;          /* stage 2 run as stage 1: the whole gradient fits what stage 2 holds at its peak */
  tdm_status hook_status;
  uint64_t clock;
  int in_backward;
  float **span_g;        /* per optimizer span: where its gradients are (for the norm) */
  float *shard_w, *shard_g;
  tdm_shared_t shared;   /* stage 1: the gradients in a shared buffer, reduce-scattered in place */
  int clean;             /* stages 2-3: the gradient buffer is all zero (the last backward reduced, so gave back, every group) */
  tdm_engine *e;
};

/* ---- collectives over a group's pieces ----------------------------------------------------------
 * Reduced in rank order (tdm_comm_rank_order_algo), as data parallelism reduces: the same bits
 * whatever the buckets, units, pieces and transport. */
static size_t piece_counts(const zero_state *z, const group *g, size_t *counts) {
  for (int r = 0; r < z->e->size; r++) counts[r] = (size_t)(g->cut[r + 1] - g->cut[r]);
  return (size_t)(g->hi - g->lo);
}

/* Reduces span [lo, hi) of the gradient buffer over the data axis: my piece, summed in rank
 * order and averaged, into out. */
static tdm_status reduce_group(zero_state *z, group *g, float *out) {
  tdm_engine *e = z->e;
  const float *span = tdm_params_grad(e->params) + g->lo;
  if (z->shared) /* stage 1, ranks that share memory: in place, my piece where out is */
    return tdm_shared_reduce_scatter(z->shared, (size_t)g->lo, (size_t)g->hi, g->cut, 1);
  if (!e->comm) {
    memmove(out, span, sizeof(float) * (size_t)(g->hi - g->lo));
    return TDM_OK;
  }
  size_t counts[e->size], n = piece_counts(z, g, counts);
  return tdm_comm_reduce_scatter_v(e->comm, span, out, n, counts, TDM_F32, TDM_AVG, tdm_comm_rank_order_algo(e->comm));
}

/* Every rank's piece of the parameters, from mine (src), into the buffer's span. */
static tdm_status gather_group(zero_state *z, group *g, const float *src) {
  tdm_engine *e = z->e;
  float *span = tdm_params_data(e->params) + g->lo;
  if (!e->comm) {
    memmove(span, src, sizeof(float) * (size_t)(g->hi - g->lo));
    return TDM_OK;
  }
  size_t counts[e->size], n = piece_counts(z, g, counts);
  return tdm_comm_allgather_v(e->comm, src, span, n, counts, TDM_F32, tdm_comm_rank_order_algo(e->comm));
}

/* ---- memory accounting of the reserved buffers ------------------------------------------------ */
static void count_grads(group *g, int on) {
  if (g->grads_counted == on || !(g->z->stage >= 2)) return;
  g->grads_counted = on;
  tdm__mem_account(TDM_MEM_GRADS, (on ? 1 : -1) * (int64_t)sizeof(float) * (g->hi - g->lo));
}

static void release_grads(group *g) {
  tdm_params_release(g->z->e->params, 1, g->lo, g->hi);
  count_grads(g, 0);
}

/* ---- reduce-scatter as backward goes ------------------------------------------------------------ */
static float *my_grad_piece(zero_state *z, group *g) {
  int r = z->e->rank;
  return z->stage == 1 ? tdm_params_grad(z->e->params) + g->cut[r] : g->shard_g;
}

static tdm_status reduce_task(void *ctx) {
  group *g = ctx;
  zero_state *z = g->z;
  TDM__TRY(reduce_group(z, g, my_grad_piece(z, g)));
  if (z->stage >= 2) release_grads(g); /* final: nothing writes them any more */
  return TDM_OK;
}

static void launch_ready(zero_state *z) {
  while (z->next_launch < z->ng && z->g[z->next_launch].pending == 0) {
    group *g = &z->g[z->next_launch++];
    tdm_status st = z->e->comm && !z->inline_comm ? tdm__comm_icall(z->e->comm, reduce_task, g, &g->reduce) : reduce_task(g);
    if (st != TDM_OK && z->hook_status == TDM_OK) z->hook_status = st;
    /* stage 2: the next bucket's gradients are being written from now on (stage 3 counts a
     * unit's when backward fetches it) */
    if (z->stage == 2 && z->next_launch < z->ng) count_grads(&z->g[z->next_launch], 1);
  }
}

static void on_grad_ready(void *ctx, tdm_tensor *p) {
  zero_state *z = ctx;
  int i = tdm__params_index_of(z->e->params, p);
  if (i < 0) return;
  for (int k = z->group_of[i]; k < z->group_of[i] + z->n_of[i]; k++)
    if (z->g[k].pending > 0) z->g[k].pending--;
  if (z->sync) launch_ready(z);
}

/* A table's gradient, final a block at a time: each of its units when all of it is. */
static void on_grad_range(void *ctx, tdm_tensor *p, int64_t lo, int64_t hi) {
  zero_state *z = ctx;
  int i = tdm__params_index_of(z->e->params, p);
  if (i < 0) return;
  int64_t off = tdm_params_offset(z->e->params, i);
  for (int k = z->group_of[i]; k < z->group_of[i] + z->n_of[i]; k++) {
    group *g = &z->g[k];
    int64_t a = g->lo > off + lo ? g->lo : off + lo, b = g->hi < off + hi ? g->hi : off + hi;
    if (a < b && (g->done += b - a) == g->hi - g->lo) g->pending = 0;
  }
  if (z->sync) launch_ready(z);
}

/* ---- stage 3: gather units just before use --------------------------------------------------- */
static tdm_status gather_task(void *ctx) {
  group *g = ctx;
  return gather_group(g->z, g, g->shard_w);
}

static void release_unit(zero_state *z, group *g) {
  if (!g->resident) return;
  tdm_params_release(z->e->params, 0, g->lo, g->hi);
  tdm__mem_account(TDM_MEM_PARAMS, -(int64_t)sizeof(float) * (g->hi - g->lo));
  g->resident = 0;
}

static tdm_status start_gather(zero_state *z, group *g) {
  if (g->resident || g->gather) return TDM_OK;
  tdm__mem_account(TDM_MEM_PARAMS, (int64_t)sizeof(float) * (g->hi - g->lo));
  if (z->e->comm && !z->inline_comm) return tdm__comm_icall(z->e->comm, gather_task, g, &g->gather);
  g->resident = 1; /* done at once, on this thread */
  return gather_task(g);
}

static tdm_status finish_gather(group *g) {
  if (g->gather) {
    tdm_work_t w = g->gather;
    g->gather = NULL;
    TDM__TRY(tdm_work_wait(w));
  }
  g->resident = 1;
  return TDM_OK;
}

/* Gives back least recently used units until at most `keep` besides units [u0, u1] are gathered. */
static void evict(zero_state *z, int u0, int u1, int keep) {
  for (;;) {
    int n = 0, lru = -1;
    for (int k = 0; k < z->ng; k++)
      if ((k < u0 || k > u1) && z->g[k].resident) {
        n++;
        if (lru < 0 || z->g[k].last_use < z->g[lru].last_use) lru = k;
      }
    if (n <= keep) return;
    release_unit(z, &z->g[lru]);
  }
}

/* Elements [lo, hi) of parameter p are about to be read: its units that hold them, gathered. */
static tdm_status fetch(void *ctx, tdm_tensor *p, int64_t lo, int64_t hi, int backward) {
  zero_state *z = ctx;
  int i = tdm__params_index_of(z->e->params, p);
  if (i < 0) return tdm__set_error(TDM_ERR_INTERNAL, "zero: '%s' is not a parameter of this engine", tdm_tensor_name(p));
  int64_t off = tdm_params_offset(z->e->params, i);
  int u0 = -1, u1 = -1; /* the units that overlap: consecutive */
  for (int k = z->group_of[i]; k < z->group_of[i] + z->n_of[i]; k++)
    if (z->g[k].lo < off + hi && z->g[k].hi > off + lo) u1 = k, u0 = u0 < 0 ? k : u0;
  if (u0 < 0) return TDM_OK;
  int all = 1;
  for (int u = u0; u <= u1; u++) {
    z->g[u].last_use = ++z->clock;
    if (backward) count_grads(&z->g[u], 1); /* its gradients are written from now on */
    all &= z->g[u].resident;
  }
  if (all) return TDM_OK;
  evict(z, u0, u1, MAX_RESIDENT - 1); /* room first: at most MAX_RESIDENT gathered (plus one arriving) */
  double t0 = tdm_trace_begin();
  for (int u = u0; u <= u1; u++) {
    group *g = &z->g[u];
    if (g->resident) continue;
    if (!g->gather) TDM__TRY(start_gather(z, g)); /* not prefetched: gather now */
    TDM__TRY(finish_gather(g));
  }
  if (t0 > 0) { /* the units' parameters arriving (all of the gather, or what prefetch did not hide) */
    tdm_trace_args a = TDM_TRACE_ARGS_INIT;
    a.index = u0, a.bytes = (int64_t)sizeof(float) * (z->g[u1].hi - z->g[u0].lo);
    tdm_trace_span("idle", "wait for parameters", t0, tdm_trace_now(), &a);
  }
  /* the unit that comes next: groups are in reverse parameter order, so forward walks down the
   * indices and backward up (a table's blocks too: the ops go up its rows in forward and down
   * them in backward, where they write its gradient) */
  int next = backward ? u1 + 1 : u0 - 1;
  if (z->e->cfg.zero.prefetch && !z->inline_comm && next >= 0 && next < z->ng) TDM__TRY(start_gather(z, &z->g[next]));
  return TDM_OK;
}

/* Gives back every gathered unit (the parameters changed, or a pass is over). */
static tdm_status drop_units(zero_state *z) {
  tdm_status st = TDM_OK;
  for (int k = 0; k < z->ng; k++) {
    group *g = &z->g[k];
    if (g->gather) {
      tdm_status s = finish_gather(g);
      if (st == TDM_OK) st = s;
    }
    release_unit(z, g);
  }
  return st;
}

/* My pieces as optimizer spans, ascending, with the compact shards laid out in that order. */
static tdm_status make_shard(zero_state *z) {
  tdm_engine *e = z->e;
  int r = e->rank;
  e->spans = tdm__calloc((size_t)z->ng, sizeof *e->spans);
  z->span_g = tdm__calloc((size_t)z->ng, sizeof(float *));
  if (!e->spans || !z->span_g) return tdm__set_error(TDM_ERR_NO_MEMORY, "zero: out of memory");
  int64_t owned = tdm__layout_owned(&z->L, r);
  if (z->stage >= 2 && !(z->shard_g = tdm__aligned_alloc_cat(sizeof(float) * (size_t)(owned + 1), TDM_MEM_GRADS)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "zero: cannot allocate the gradient shard (%lld floats)", (long long)owned);
  if (z->stage == 3 && !(z->shard_w = tdm__aligned_alloc_cat(sizeof(float) * (size_t)(owned + 1), TDM_MEM_PARAMS)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "zero: cannot allocate the parameter shard (%lld floats)", (long long)owned);
  int64_t at = 0;
  for (int k = z->ng - 1; k >= 0; k--) {
    group *g = &z->g[k];
    int64_t lo = g->cut[r], hi = g->cut[r + 1];
    if (z->shard_g) g->shard_g = z->shard_g + at;
    if (z->shard_w) g->shard_w = z->shard_w + at;
    if (hi > lo) {
      z->span_g[e->n_spans] = z->stage == 1 ? tdm_params_grad(e->params) + lo : g->shard_g;
      e->spans[e->n_spans++] = (tdm_optim_span){lo, hi};
    }
    at += hi - lo;
  }
  TDM__TRY(tdm_optim_create_spans(&e->opt, &e->ocfg, e->params, e->n_spans, e->spans));
  for (int k = z->ng - 1, s = 0; k >= 0; k--) {
    group *g = &z->g[k];
    if (g->cut[r + 1] == g->cut[r]) continue;
    TDM__TRY(tdm_optim_set_span_buffers(e->opt, s++, g->shard_w, z->stage >= 2 ? g->shard_g : NULL));
  }
  return TDM_OK;
}

/* ---- the engine --------------------------------------------------------------------------------- */
static tdm_status zero_create(tdm_engine *e, const tdm_model_config *mc, uint64_t seed) {
  int stage = e->cfg.zero.stage;
  if (stage < 1 || stage > 3)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "zero: stage %d; expected 1, 2 or 3 (0 is the dp engine)", stage);
  zero_state *z = tdm__calloc(1, sizeof *z);
  if (!z) return tdm__set_error(TDM_ERR_NO_MEMORY, "zero: out of memory");
  e->impl = z;
  z->e = e;
  z->stage = stage;
  z->sync = 1;
  TDM__TRY(tdm__inline_comm(e->size, &z->inline_comm));
  int zero_copy;
  TDM__TRY(tdm__env_switch("TANDEM_DP_ZERO_COPY", &zero_copy));
  int shareable = e->comm && e->size > 1 && zero_copy != 0 && tdm__shared_usable(e->comm);
  if (stage == 2 && shareable) { /* a model of a bucket or two: stage 1's way (the layout from its shapes alone) */
    tdm_model *shape;
    TDM__TRY(tdm_model_create_with(&shape, mc, seed, TDM_RESERVE_DATA | TDM_RESERVE_GRAD));
    tdm_status ls = tdm__layout_make(&z->L, tdm_model_params(shape), 0, e->cfg.zero.bucket_bytes, 0, 1, e->size, 1);
    if (ls == TDM_OK && tdm__layout_whole_in_flight(&z->L, z->inline_comm)) z->stage = 1, z->in_place = 1;
    tdm__layout_free(&z->L);
    tdm_model_destroy(shape);
    TDM__TRY(ls);
  }
  int reserved = stage == 3 ? TDM_RESERVE_DATA | TDM_RESERVE_GRAD : z->stage == 2 ? TDM_RESERVE_GRAD : 0;
  TDM__TRY(tdm_model_create_with(&e->model, mc, seed, reserved));
  e->params = tdm_model_params(e->model);
  if (e->comm) TDM__TRY(tdm__check_same_model(e->comm, e->params));
  TDM__TRY(tdm__layout_make(&z->L, e->params, stage == 3, e->cfg.zero.bucket_bytes, 0, e->cfg.zero.unit_modules, e->size, 1));
  stage = z->stage;
  z->ng = z->L.ng;
  z->group_of = z->L.group_of;
  z->n_of = z->L.n_of;
  if (!(z->g = tdm__calloc((size_t)z->ng, sizeof(group)))) return tdm__set_error(TDM_ERR_NO_MEMORY, "zero: out of memory");
  for (int k = 0; k < z->ng; k++)
    z->g[k] = (group){.lo = z->L.g[k].lo, .hi = z->L.g[k].hi, .cut = z->L.g[k].cut, .n_params = z->L.g[k].n_params, .z = z};
  /* stage 1 on ranks that share memory (one node over shm, or threads): the gradients live in a
   * shared buffer, so a bucket's reduce-scatter reads the peers' areas with no copy in or out, as
   * data parallelism's average does (TANDEM_DP_ZERO_COPY=0 turns it off, as there). Stages 2-3
   * give gradient pages back after each bucket, which shared memory cannot do cheaply (no huge
   * pages, 4 KiB faults at 12-22 us on the development VM): they keep the copying reduce-scatter,
   * unless the whole gradient is no more than stage 2 holds at its peak anyway (in_place). */
  if (stage == 1 && shareable) {
    tdm_status ss = tdm_shared_create(e->comm, (size_t)tdm_params_numel(e->params), &z->shared);
    if (ss == TDM_OK) ss = tdm_params_set_grad_buffer(e->params, tdm_shared_mine(z->shared));
    if (ss != TDM_OK) { /* the same outcome on every rank: the copying reduce-scatter */
      tdm_log(TDM_LOG_WARN, "zero: gradients stay private (%s); reduce-scattering them by copying", tdm_last_error());
      tdm_shared_destroy(z->shared);
      z->shared = NULL;
    } else {
      tdm__mem_account(TDM_MEM_GRADS, (int64_t)sizeof(float) * tdm_params_numel(e->params)); /* mapped, not allocated */
    }
  }
  TDM__TRY(make_shard(z));
  int r = e->rank, n = tdm_params_count(e->params);
  if (stage == 3) { /* each rank makes only its pieces, with the values the whole model would have */
    for (int k = 0; k < z->ng; k++) {
      group *g = &z->g[k];
      TDM__TRY(tdm_params_init_range(e->params, g->cut[r], g->cut[r + 1], g->shard_w));
    }
    for (int i = 0; i < n; i++) tdm_tensor_set_fetch_hook(tdm_params_get(e->params, i), fetch, z);
  } else if (e->comm) { /* every rank starts from rank 0's parameters, as data parallelism */
    TDM__TRY(tdm_comm_broadcast(e->comm, tdm_params_data(e->params), (size_t)tdm_params_numel(e->params), TDM_F32, 0,
                                TDM_ALGO_AUTO));
  }
  for (int i = 0; i < n; i++) {
    tdm_tensor_set_grad_hook(tdm_params_get(e->params, i), on_grad_ready, z);
    tdm_tensor_set_grad_range_hook(tdm_params_get(e->params, i), on_grad_range, z);
  }
  for (int k = 0; k < z->ng; k++) z->g[k].pending = z->g[k].n_params;
  snprintf(e->desc, sizeof e->desc, "zero stage %d, %d rank%s, %d %s%s", e->cfg.zero.stage, e->size, e->size == 1 ? "" : "s", z->ng,
           stage == 3 ? (z->ng == 1 ? "unit" : "units") : (z->ng == 1 ? "bucket" : "buckets"),
           z->in_place && z->shared ? " (reduced in place: the gradients fit the buckets in flight)" : "");
  return TDM_OK;
}

static void zero_destroy(tdm_engine *e) {
  zero_state *z = e->impl;
  if (!z) return;
  for (int k = 0; k < z->ng; k++) {
    group *g = &z->g[k];
    if (g->reduce) tdm_work_wait(g->reduce);
    if (g->gather) tdm_work_wait(g->gather);
    if (g->resident) tdm__mem_account(TDM_MEM_PARAMS, -(int64_t)sizeof(float) * (g->hi - g->lo));
    count_grads(g, 0);
  }
  if (e->params) {
    for (int i = 0; i < tdm_params_count(e->params); i++) {
      tdm_tensor_set_grad_hook(tdm_params_get(e->params, i), NULL, NULL);
      tdm_tensor_set_grad_range_hook(tdm_params_get(e->params, i), NULL, NULL);
      tdm_tensor_set_fetch_hook(tdm_params_get(e->params, i), NULL, NULL);
    }
  }
  if (z->shared) { /* the gradients move back into the parameters' own buffer */
    tdm_params_set_grad_buffer(e->params, NULL);
    tdm__mem_account(TDM_MEM_GRADS, -(int64_t)sizeof(float) * tdm_params_numel(e->params));
    tdm_shared_destroy(z->shared);
  }
  tdm__free(z->g);
  tdm__layout_free(&z->L);
  tdm__free(z->span_g);
  tdm__free(z->shard_g);
  tdm__free(z->shard_w);
  tdm__free(z);
}

static void zero_zero_grad(tdm_engine *e) {
  zero_state *z = e->impl;
  if (z->stage == 1) {
    tdm_params_zero_grad(e->params);
    return;
  }
  /* reserved: every group's gradients are given back (zero) once reduced, so after a backward that
   * reduced them all there is nothing to clear (giving the pages back again costs a fault per
   * page at the next write); anything else (an interrupted step, the start) clears it all */
  if (!z->clean) tdm_params_zero_grad(e->params);
  for (int k = 0; k < z->ng; k++) count_grads(&z->g[k], 0);
}

static void zero_begin_backward(tdm_engine *e, int last) {
  zero_state *z = e->impl;
  z->sync = last;
  z->in_backward = 1;
  z->clean = 0; /* gradients are written from now on */
  /* gradients being written: the first group's when this backward reduces, else all of them
   * (they stay whole until the last micro-batch) */
  for (int k = 0; k < z->ng; k++)
    if (!last || (k == z->next_launch && z->stage == 2)) count_grads(&z->g[k], 1);
}

static tdm_status zero_end_backward(tdm_engine *e, int last, double *wait_s) {
  zero_state *z = e->impl;
  double t0 = tdm_time_now();
  z->in_backward = 0;
  tdm_status st = z->hook_status;
  if (last) { /* groups backward never reached; then wait for every reduce-scatter */
    for (int k = 0; k < z->ng; k++) z->g[k].pending = 0;
    launch_ready(z);
    for (int k = 0; k < z->ng; k++) {
      group *g = &z->g[k];
      if (g->reduce) {
        tdm_status s = tdm_work_wait(g->reduce);
        if (st == TDM_OK) st = s;
        g->reduce = NULL;
      }
    }
    z->next_launch = 0;
    double t1 = tdm_time_now();
    *wait_s += t1 - t0;
    if (tdm_trace_on()) {
      tdm_trace_args a = TDM_TRACE_ARGS_INIT;
      a.index = z->ng;
      tdm_trace_span("idle", "wait for gradient pieces", t0, t1, &a);
    }
  }
  for (int k = 0; k < z->ng; k++) z->g[k].pending = z->g[k].n_params, z->g[k].done = 0;
  z->hook_status = TDM_OK;
  if (last && st == TDM_OK) z->clean = 1; /* every group reduced, so given back (stages 2-3) */
  if (z->stage == 3 && st == TDM_OK) st = drop_units(z); /* forward starts from the shard again */
  return st;
}

static tdm_status zero_grad_sumsq(tdm_engine *e, double *sumsq) {
  zero_state *z = e->impl;
  return tdm__engine_sumsq_sharded(e, e->n_spans, e->spans, z->span_g, sumsq);
}

static tdm_status zero_update(tdm_engine *e, float lr, float coef) {
  zero_state *z = e->impl;
  for (int s = 0; s < e->n_spans; s++) tdm_grad_scale(z->span_g[s], e->spans[s].hi - e->spans[s].lo, coef);
  TDM__TRY(tdm_optim_step(e->opt, lr));
  if (z->stage == 3) return drop_units(z); /* gathered afresh before the next use */
  int r = e->rank;
  for (int k = 0; k < z->ng; k++) { /* every rank's updated pieces, into every rank's buffer */
    group *g = &z->g[k];
    TDM__TRY(gather_group(z, g, tdm_params_data(e->params) + g->cut[r]));
  }
  return TDM_OK;
}

static tdm_status zero_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst) {
  zero_state *z = e->impl;
  if (z->stage < 3) {
    if (hi > lo) memcpy(dst, tdm_params_data(e->params) + lo, sizeof(float) * (size_t)(hi - lo));
    return TDM_OK;
  }
  for (int k = z->ng - 1; k >= 0; k--) { /* gather the units that overlap, one at a time */
    group *g = &z->g[k];
    int64_t b = g->lo > lo ? g->lo : lo, x = g->hi < hi ? g->hi : hi;
    if (b >= x) continue;
    int was = g->resident;
    TDM__TRY(start_gather(z, g));
    TDM__TRY(finish_gather(g));
    memcpy(dst + (b - lo), tdm_params_data(e->params) + b, sizeof(float) * (size_t)(x - b));
    if (!was) release_unit(z, g);
  }
  return TDM_OK;
}

static tdm_status zero_stream_params(tdm_engine *e, tdm_status (*write)(void *, const float *, int64_t), void *ctx) {
  zero_state *z = e->impl;
  if (z->stage < 3) return e->rank == 0 ? write(ctx, tdm_params_data(e->params), tdm_params_numel(e->params)) : TDM_OK;
  for (int k = z->ng - 1; k >= 0; k--) { /* in parameter order, one unit at a time */
    group *g = &z->g[k];
    int was = g->resident;
    TDM__TRY(start_gather(z, g));
    TDM__TRY(finish_gather(g));
    tdm_status st = e->rank == 0 ? write(ctx, tdm_params_data(e->params) + g->lo, g->hi - g->lo) : TDM_OK;
    if (!was) release_unit(z, g);
    TDM__TRY(st);
  }
  return TDM_OK;
}

static tdm_status zero_load_weights(tdm_engine *e, const char *path) {
  zero_state *z = e->impl;
  if (z->stage < 3) return tdm_params_load(e->params, path, 0);
  int r = e->rank;
  int64_t *lo = tdm__malloc(sizeof(int64_t) * 2 * (size_t)z->ng);
  float **dst = tdm__malloc(sizeof(float *) * (size_t)z->ng);
  tdm_status st = lo && dst ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "zero: out of memory");
  for (int k = 0; st == TDM_OK && k < z->ng; k++) /* my pieces only, into the shard */
    lo[k] = z->g[k].cut[r], lo[z->ng + k] = z->g[k].cut[r + 1], dst[k] = z->g[k].shard_w;
  if (st == TDM_OK) st = tdm_params_load_spans(e->params, path, 0, z->ng, lo, lo + z->ng, dst);
  tdm__free(lo);
  tdm__free(dst);
  TDM__TRY(st);
  return drop_units(z);
}

static float *zero_param_shard(tdm_engine *e) { return ((zero_state *)e->impl)->shard_w; }

/* Gathered units hold the old values: gathered afresh at the next use. */
static tdm_status zero_shard_changed(tdm_engine *e) {
  zero_state *z = e->impl;
  return z->stage == 3 ? drop_units(z) : TDM_OK;
}

const tdm__engine_ops tdm__engine_zero_ops = {
    .name = "zero",
    .create = zero_create,
    .destroy = zero_destroy,
    .zero_grad = zero_zero_grad,
    .begin_backward = zero_begin_backward,
    .end_backward = zero_end_backward,
    .grad_sumsq = zero_grad_sumsq,
    .update = zero_update,
    .read_params = zero_read_params,
    .stream_params = zero_stream_params,
    .load_weights = zero_load_weights,
    .param_shard = zero_param_shard,
    .shard_changed = zero_shard_changed,
    .split = 1u << TDM_AXIS_DATA,
    .mixed = 1,
    .recompute = 1,
    .cannot_skip = 0, /* a skipped step calls no update */
};
