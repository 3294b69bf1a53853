/* The parameter server's worker side, an engine (one row of src/parallel/engine.c): every rank of
 * the data axis holds the whole model and computes its gradient as data parallelism does; its
 * update pushes the gradient's shards to the servers and pulls the parameters' shards back (the
 * optimizer runs on the servers: ps_server.c). Workers are world ranks 0..W-1, servers W..W+S-1. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "parallel/engine_impl.h"
#include "parallel/ps_msg.h"
#include "tandem/checkpoint.h"

static const char *mode_names[] = {"sync", "async", "ssp"};
_Static_assert(sizeof mode_names / sizeof mode_names[0] == TDM_PS_MODE_COUNT, "one name per mode");
const char *tdm_ps_mode_name(tdm_ps_mode m) { return (unsigned)m < TDM_PS_MODE_COUNT ? mode_names[m] : "?"; }

void tdm_ps_shard(int64_t n, int S, int s, int64_t *lo, int64_t *hi) {
  if (!lo || !hi) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ps_shard: %s is NULL", !lo ? "lo" : "hi");
    return;
  }
  size_t off, len;
  tdm_comm_block((size_t)n, S, s, &off, &len);
  *lo = (int64_t)off;
  *hi = (int64_t)(off + len);
}

typedef struct {
  tdm_comm_t world;
  int S, W, done_sent;
  int64_t *lo, *hi, *version; /* per server: its range and the version of what we pulled */
  int64_t clock;              /* steps pushed */
  int64_t lost;               /* workers lost, as server 0's last answer said */
  int64_t *stale;             /* per server: the staleness of this step's push, as its answer said */
  uint64_t pushed, pulled;    /* this step's bytes, headers included */
  char *buf;                  /* header + the largest shard */
  size_t cap;                 /* its bytes */
  int *left;                  /* per server: the ranks not yet heard from in this round */
} ps_worker;

static tdm_status ps_create(tdm_engine *e, const tdm_model_config *mc, uint64_t seed) {
  const tdm_engine_ps_config *pc = &e->cfg.ps;
  tdm_comm_t world = pc->world;
  if (!world || pc->servers < 1 || pc->servers >= tdm_comm_size(world) || (unsigned)pc->mode >= TDM_PS_MODE_COUNT ||
      pc->staleness < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "engine_create: parameter server with %d servers of %d ranks, mode %d, staleness %d; expected "
                          "1..ranks-1 servers, sync/async/ssp, staleness >= 0 (and the world communicator)",
                          pc->servers, world ? tdm_comm_size(world) : 0, (int)pc->mode, pc->staleness);
  if (tdm_comm_size(world) - pc->servers != e->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "engine_create: %d workers on the data axis, but the world of %d has %d servers",
                          e->size, tdm_comm_size(world), pc->servers);
  if (e->cfg.clip > 0)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "engine_create: clipping (%g) with a parameter server: the servers see "
                          "only their shards, so no rank knows the global norm; give --clip 0 (the gpt and llama clip to 1 by default)", (double)e->cfg.clip);
  TDM__TRY(tdm_model_create(&e->model, mc, seed));
  e->params = tdm_model_params(e->model);
  e->spans = tdm__malloc(sizeof *e->spans);
  ps_worker *w = tdm__calloc(1, sizeof *w);
  e->impl = w;
  if (!e->spans || !w) return tdm__set_error(TDM_ERR_NO_MEMORY, "ps engine: out of memory");
  int64_t n = tdm_params_numel(e->params);
  e->spans[0] = (tdm_optim_span){0, n};
  e->n_spans = 0; /* updates nothing itself: a checkpoint reads the whole parameters, no optimizer state, here */
  /* the optimizer lives on the servers: the workers' holds no state (empty span list) */
  TDM__TRY(tdm_optim_create_spans(&e->opt, &e->ocfg, e->params, 0, NULL));
  w->world = world;
  w->S = pc->servers;
  w->W = e->size;
  w->lo = tdm__calloc((size_t)w->S * 4, sizeof(int64_t));
  w->left = tdm__calloc((size_t)w->S, sizeof(int));
  if (!w->lo || !w->left) return tdm__set_error(TDM_ERR_NO_MEMORY, "ps engine: out of memory");
  w->hi = w->lo + w->S, w->version = w->hi + w->S, w->stale = w->version + w->S;
  int64_t most = 0;
  for (int s = 0; s < w->S; s++) {
    tdm_ps_shard(n, w->S, s, &w->lo[s], &w->hi[s]);
    if (w->hi[s] - w->lo[s] > most) most = w->hi[s] - w->lo[s];
  }
  w->cap = sizeof(tdm__ps_msg) + sizeof(float) * (size_t)most;
  w->buf = tdm__malloc_cat(w->cap, TDM_MEM_COMM);
  if (!w->buf) return tdm__set_error(TDM_ERR_NO_MEMORY, "ps engine: out of memory");
  char k[32] = "";
  if (pc->mode == TDM_PS_SSP) snprintf(k, sizeof k, ", staleness %d", pc->staleness);
  snprintf(e->desc, sizeof e->desc, "parameter server (%s%s), %d worker%s, %d server%s", tdm_ps_mode_name(pc->mode), k,
           w->W, w->W == 1 ? "" : "s", w->S, w->S == 1 ? "" : "s");
  return TDM_OK;
}

/* Tells every server this worker is finished (they stop when all have). Not after a failure: the
 * servers learn of that from the connection. */
static void ps_destroy(tdm_engine *e) {
  ps_worker *w = e->impl;
  if (!w) return;
  if (w->world && w->buf && tdm_comm_status(w->world) == TDM_OK)
    for (int s = 0; s < w->S; s++) {
      tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_DONE, w->clock, 0, w->lo[s], w->lo[s], 0, 0, tdm__ps_sum(NULL, 0)};
      if (tdm_comm_tsend(w->world, w->W + s, TDM_PS_TAG_TO_SERVER, &m, sizeof m) != TDM_OK) break;
    }
  tdm__free(w->buf);
  tdm__free(w->lo);
  tdm__free(w->left);
  tdm__free(w);
}

static void ps_zero_grad(tdm_engine *e) { tdm_params_zero_grad(e->params); }
static void ps_begin_backward(tdm_engine *e, int last) {
  (void)e;
  (void)last;
}
static tdm_status ps_end_backward(tdm_engine *e, int last, double *wait_s) {
  (void)e;
  (void)last;
  (void)wait_s;
  return TDM_OK;
}

/* The worker's own gradient: the servers hold the combined one only in shards. */
static tdm_status ps_grad_sumsq(tdm_engine *e, double *sumsq) {
  return tdm__engine_sumsq_full(e, tdm_params_grad(e->params), sumsq);
}

static tdm_status server_error(tdm_status st, ps_worker *w, int s, const char *what) {
  return tdm__set_error(st, "parameter server %d (rank %d) %s: %s", s, w->W + s, what, tdm_last_error());
}

static tdm_status pull_all(tdm_engine *e);

/* Push every shard of the gradient, then pull every shard of the parameters. */
static tdm_status ps_update(tdm_engine *e, float lr, float coef) {
  (void)coef; /* clipping is refused at creation: always 1 */
  ps_worker *w = e->impl;
  const tdm_engine_ps_config *pc = &e->cfg.ps;
  if (pc->delay_worker == tdm_comm_rank(w->world) && pc->delay_s > 0) { /* a slow worker, for the staleness tests */
    struct timespec ts = {(time_t)pc->delay_s, (long)((pc->delay_s - (double)(time_t)pc->delay_s) * 1e9)};
    nanosleep(&ts, NULL);
  }
  const float *g = tdm_params_grad(e->params);
  w->pushed = w->pulled = 0;
  for (int s = 0; s < w->S; s++) {
    int64_t n = w->hi[s] - w->lo[s];
    tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_PUSH, w->clock, w->version[s], w->lo[s], w->hi[s], lr, 0, tdm__ps_sum(g + w->lo[s], n)};
    memcpy(w->buf, &m, sizeof m);
    memcpy(w->buf + sizeof m, g + w->lo[s], sizeof(float) * (size_t)n);
    tdm_status st = tdm_comm_tsend(w->world, w->W + s, TDM_PS_TAG_TO_SERVER, w->buf, sizeof m + sizeof(float) * (size_t)n);
    if (st != TDM_OK) return server_error(st, w, s, "did not take a push");
    w->pushed += sizeof m + sizeof(float) * (size_t)n;
  }
  w->clock++;
  return pull_all(e);
}

/* Receives every server's shard into the parameters (after a push, or a pull), from whichever
 * server answers first. A fixed order could deadlock: a server's answer bigger than the
 * transport's buffer blocks it until this worker reads, and if this worker were waiting for
 * another server, itself blocked answering a worker that is still pushing to the first, no one
 * would move (seen under load with two servers and ssp). Reading any server's answer, and pushing
 * to the servers in one order on every worker, leaves no cycle of waits. */
static tdm_status pull_all(tdm_engine *e) {
  ps_worker *w = e->impl;
  float *p = tdm_params_data(e->params);
  int *left = w->left, n_left = w->S;
  for (int s = 0; s < w->S; s++) left[s] = w->W + s;
  while (n_left > 0) {
    size_t got = 0;
    int from = -1, gone = -1;
    tdm_status st = tdm_comm_trecv_among_lossy(w->world, left, n_left, TDM_PS_TAG_TO_WORKER, w->buf, w->cap, &from, &got,
                                               &gone);
    if (st != TDM_OK && gone >= w->W) { /* a dead server: the job stops, and every peer learns why */
      char why[1024];
      snprintf(why, sizeof why, "parameter server %d (rank %d) sent no parameters: %s", gone - w->W, gone, tdm_last_error());
      tdm_comm_abort_why(w->world, st, why);
      return tdm__set_error(st, "%s", why);
    }
    if (st != TDM_OK) return tdm__set_error(st, "the parameter servers (ranks %d..%d) sent no parameters: %s", w->W,
                                            w->W + w->S - 1, tdm_last_error());
    int s = from - w->W;
    int64_t n = w->hi[s] - w->lo[s];
    tdm__ps_msg m;
    memset(&m, 0, sizeof m);
    if (got >= sizeof m) memcpy(&m, w->buf, sizeof m);
    const float *v = (const float *)(w->buf + sizeof m);
    if (got != sizeof m + sizeof(float) * (size_t)n || m.magic != TDM_PS_MAGIC || m.kind != TDM_PS_PARAMS ||
        m.lo != w->lo[s] || m.hi != w->hi[s] || m.sum != tdm__ps_sum(v, n))
      return tdm__set_error(TDM_ERR_REMOTE,
                            "parameter server %d (rank %d) sent a malformed reply (%zu bytes, keys [%lld, %lld), kind %u); "
                            "expected keys [%lld, %lld) with a matching checksum: not applied",
                            s, w->W + s, got, (long long)m.lo, (long long)m.hi, m.kind, (long long)w->lo[s],
                            (long long)w->hi[s]);
    memcpy(p + w->lo[s], v, sizeof(float) * (size_t)n);
    w->version[s] = m.version;
    w->stale[s] = (int64_t)m.lr;
    w->pulled += got;
    if (s == 0) w->lost = m.lost;
    for (int i = 0; i < n_left; i++) /* one answer per server: it is not heard from again this round */
      if (left[i] == from) {
        left[i] = left[--n_left];
        break;
      }
  }
  return TDM_OK;
}

/* The servers' parameters as they stand once every worker's last push is applied (async and ssp
 * workers end at different moments, so the last pull of one is not the final state): the workers
 * meet at the servers (each answers once every live worker has asked, so every last push is in;
 * a lost worker is not waited for). Collective over the live workers. */
static tdm_status final_pull(tdm_engine *e) {
  ps_worker *w = e->impl;
  for (int s = 0; s < w->S; s++) {
    tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_PULL, w->clock, 0, w->lo[s], w->hi[s], 0, 0, tdm__ps_sum(NULL, 0)};
    tdm_status st = tdm_comm_tsend(w->world, w->W + s, TDM_PS_TAG_TO_SERVER, &m, sizeof m);
    if (st != TDM_OK) return server_error(st, w, s, "did not take a pull");
  }
  return pull_all(e);
}

tdm_status tdm_ps_workers_meet(tdm_engine *e, int *n_lost, int *ranks, int cap) {
  if (!e || !n_lost || (cap > 0 && !ranks) || strcmp(e->ops->name, "ps"))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "ps_workers_meet: %s", e ? "not a parameter server's engine" : "NULL engine");
  ps_worker *w = e->impl;
  *n_lost = 0;
  TDM__TRY(final_pull(e));
  if (w->lost == 0) return TDM_OK;
  /* the list, as long as server 0's answer to the meeting said: the same for every survivor */
  int64_t n = w->lost;
  tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_LOST, n, 0, 0, 0, 0, 0, tdm__ps_sum(NULL, 0)};
  tdm_status st = tdm_comm_tsend(w->world, w->W, TDM_PS_TAG_TO_SERVER, &m, sizeof m);
  if (st != TDM_OK) return server_error(st, w, 0, "did not take a question");
  size_t cap_b = sizeof m + sizeof(int32_t) * (size_t)w->W, got = 0;
  char *b = tdm__malloc(cap_b);
  if (!b) return tdm__set_error(TDM_ERR_NO_MEMORY, "ps_workers_meet: out of memory");
  st = tdm_comm_trecv(w->world, w->W, TDM_PS_TAG_TO_WORKER, b, cap_b, NULL, &got);
  if (st != TDM_OK) {
    tdm__free(b);
    return server_error(st, w, 0, "sent no list of lost workers");
  }
  memcpy(&m, b, sizeof m);
  const int32_t *r = (const int32_t *)(b + sizeof m);
  if (got < sizeof m || m.magic != TDM_PS_MAGIC || m.kind != TDM_PS_LOST || m.hi != n ||
      got != sizeof m + sizeof(int32_t) * (size_t)n || m.sum != tdm__ps_sum((const float *)r, n)) {
    tdm__free(b);
    return tdm__set_error(TDM_ERR_REMOTE, "parameter server 0 (rank %d) sent a malformed list of lost workers (%zu bytes, %lld "
                          "entries where %lld were expected)", w->W, got, (long long)m.hi, (long long)n);
  }
  for (int64_t i = 0; i < n; i++) {
    if (r[i] < 0 || r[i] >= w->W) {
      tdm__free(b);
      return tdm__set_error(TDM_ERR_REMOTE, "parameter server 0 (rank %d) named worker %d as lost; there are %d", w->W,
                            (int)r[i], w->W);
    }
    if (i < cap) ranks[i] = r[i];
  }
  *n_lost = (int)n;
  tdm__free(b);
  return TDM_OK;
}

int tdm_ps_worker_step_stats(const tdm_engine *e, int64_t *staleness, int cap, uint64_t *pushed, uint64_t *pulled) {
  if (!e || strcmp(e->ops->name, "ps")) return -1;
  if (!staleness && cap > 0) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ps_worker_step_stats: staleness is NULL for %d servers", cap);
    return -1;
  }
  const ps_worker *w = e->impl;
  for (int s = 0; s < w->S && s < cap; s++) staleness[s] = w->stale[s];
  if (pushed) *pushed = w->pushed;
  if (pulled) *pulled = w->pulled;
  return w->S;
}

static tdm_status not_ps(const tdm_engine *e, const char *what) {
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s", what, e ? "not a parameter server's engine" : "NULL engine");
}

tdm_status tdm_ps_workers_checkpoint(tdm_engine *e, const char *dir, const tdm_ckpt_info *info, int keep) {
  if (!e || !dir || !info || strcmp(e->ops->name, "ps")) return not_ps(e, "ps_workers_checkpoint");
  ps_worker *w = e->impl;
  if (w->lost)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "checkpoint at step %lld: %lld worker%s lost; a checkpoint is written by every "
                          "rank of the job, so none is written after a loss (the last one before it stands)",
                          (long long)info->step, (long long)w->lost, w->lost == 1 ? " was" : "s were");
  for (int s = 0; s < w->S; s++) { /* the servers answer once every worker asked: every push before is in */
    tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_CKPT, info->step, 0, w->lo[s], w->hi[s], 0, 0, tdm__ps_sum(NULL, 0)};
    tdm_status st = tdm_comm_tsend(w->world, w->W + s, TDM_PS_TAG_TO_SERVER, &m, sizeof m);
    if (st != TDM_OK) return server_error(st, w, s, "did not take a checkpoint request");
  }
  TDM__TRY(pull_all(e));
  tdm_ckpt_info ci = *info;
  ci.world_size = 0; /* the job's: workers and servers each write a file (the workers' empty) */
  if (!ci.layout) ci.layout = e->desc;
  if (!ci.optimizer) ci.optimizer = tdm_optim_kind_name(tdm_optim_get_config(e->opt)->kind);
  tdm_ckpt_writer *cw = NULL;
  tdm_status cs = tdm_ckpt_writer_create(&cw, dir, &ci, w->version[0], w->world); /* version: the servers' optimizer steps */
  if (!cw) return cs;
  return tdm_ckpt_writer_commit(cw, keep);
}

tdm_status tdm_ps_workers_resumed(tdm_engine *e, const char *manifest, uint32_t crc, int64_t step) {
  if (!e || !manifest || strcmp(e->ops->name, "ps")) return not_ps(e, "ps_workers_resumed");
  ps_worker *w = e->impl;
  size_t len = strlen(manifest) + 1, words = (len + 3) / 4;
  if (words * 4 > TDM_PS_PATH_MAX)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "resume: the checkpoint's path (%zu bytes) is longer than %d", len, TDM_PS_PATH_MAX - 1);
  char *b = tdm__calloc(1, sizeof(tdm__ps_msg) + words * 4);
  if (!b) return tdm__set_error(TDM_ERR_NO_MEMORY, "resume: out of memory");
  memcpy(b + sizeof(tdm__ps_msg), manifest, len);
  tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_RESUME, step, 0, 0, (int64_t)words, 0, crc,
                   tdm__ps_sum((const float *)(b + sizeof(tdm__ps_msg)), (int64_t)words)};
  memcpy(b, &m, sizeof m);
  tdm_status st = TDM_OK;
  for (int s = 0; s < w->S && st == TDM_OK; s++)
    if ((st = tdm_comm_tsend(w->world, w->W + s, TDM_PS_TAG_TO_SERVER, b, sizeof m + words * 4)) != TDM_OK)
      st = server_error(st, w, s, "did not take the checkpoint to resume from");
  tdm__free(b);
  TDM__TRY(st);
  /* each server answers with its shard as it read it: the same values this worker read */
  int64_t n = tdm_params_numel(e->params);
  float *mine = tdm__malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!mine) return tdm__set_error(TDM_ERR_NO_MEMORY, "resume: out of memory");
  memcpy(mine, tdm_params_data(e->params), sizeof(float) * (size_t)n);
  st = pull_all(e);
  for (int s = 0; st == TDM_OK && s < w->S; s++)
    if (memcmp(mine + w->lo[s], tdm_params_data(e->params) + w->lo[s], sizeof(float) * (size_t)(w->hi[s] - w->lo[s])))
      st = tdm__set_error(TDM_ERR_MISMATCH, "resume: parameter server %d (rank %d) read other parameters from %s than worker "
                          "%d did", s, w->W + s, manifest, tdm_comm_rank(w->world));
  tdm__free(mine);
  return st;
}

tdm_status tdm_ps_workers_regrid(tdm_engine *e, tdm_grid *g) {
  if (!e || !g || strcmp(e->ops->name, "ps"))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "ps_workers_regrid: %s", e && g ? "not a parameter server's engine" : "NULL argument");
  e->grid = g;
  e->comm = tdm_grid_comm(g, TDM_AXIS_DATA);
  e->rank = e->comm ? tdm_comm_rank(e->comm) : 0;
  e->size = e->comm ? tdm_comm_size(e->comm) : 1;
  return TDM_OK;
}

static tdm_status ps_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst) {
  TDM__TRY(final_pull(e));
  if (hi > lo) memcpy(dst, tdm_params_data(e->params) + lo, sizeof(float) * (size_t)(hi - lo));
  return TDM_OK;
}

static tdm_status ps_stream_params(tdm_engine *e, tdm_status (*write)(void *, const float *, int64_t), void *ctx) {
  TDM__TRY(final_pull(e));
  return e->rank == 0 ? write(ctx, tdm_params_data(e->params), tdm_params_numel(e->params)) : TDM_OK;
}

static tdm_status ps_load_weights(tdm_engine *e, const char *path) {
  (void)e;
  return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "parameter server: initial weights from %s: the servers start from the "
                        "seed's values; not supported yet", path);
}

const tdm__engine_ops tdm__engine_ps_ops = {.name = "ps",
                                            .create = ps_create,
                                            .destroy = ps_destroy,
                                            .zero_grad = ps_zero_grad,
                                            .begin_backward = ps_begin_backward,
                                            .end_backward = ps_end_backward,
                                            .grad_sumsq = ps_grad_sumsq,
                                            .update = ps_update,
                                            .read_params = ps_read_params,
                                            .stream_params = ps_stream_params,
                                            .load_weights = ps_load_weights,
                                            /* a worker's forward and backward are the engine's tape's, as data
                                             * parallelism's: bf16 activations (f32 gradients, the servers' f32
                                             * masters) and recomputation work as they do there; fp16 is refused:
                                             * an overflowing push would reach the servers, whose updates do not
                                             * wait for the other workers to agree on skipping it */
                                            .mixed = 1,
                                            .recompute = 1,
                                            .cannot_skip = 1};
