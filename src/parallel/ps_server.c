/* The parameter server's server side: one rank holds keys [lo, hi) of the parameters and their
 * optimizer state, takes the workers' pushes from whichever is ready first, and answers with the
 * shard's parameters as the mode says (tandem/engine.h):
 *   sync   every worker's push of the round is kept; then they are summed in worker-rank order,
 *          divided by the number of workers and applied as one step, and every worker gets the
 *          result (the data-parallel engine's sum, so the same bits);
 *   async  a push is one step, applied on arrival and answered at once;
 *   ssp    as async, but the answer to a worker more than K pushes ahead of the slowest waits
 *          until the slowest catches up (workers that finished no longer count).
 * Every push is checked before it is used: its size, its key range (this server's), its checksum.
 * A worker whose connection closes (its process died) is lost: in sync mode that stops the server
 * (a round needs every worker), in async and ssp it is named and dropped: from the slowest clock
 * and from the final meeting (a PULL is answered once every live worker has sent one). */
#include <stdio.h>
#include <string.h>

#include "parallel/engine_impl.h"
#include "parallel/ps_ckpt.h"
#include "parallel/ps_log.h"
#include "parallel/ps_msg.h"

typedef struct {
  const tdm_engine_ps_config *pc;
  tdm_comm_t world;
  int W, s, me;
  int64_t lo, hi, n, version;
  tdm_params *params;
  tdm_optim *opt;
  char *buf;                  /* a message: header + the shard */
  float *slots;               /* sync: each worker's gradient of the round */
  int *in_round, *done, *held, *lost, *pulling; /* per worker */
  int *lost_order;            /* the lost workers, in the order found */
  int *active, n_active;      /* the workers not done: whose connections must stay up */
  int64_t *clock;
  int64_t *ckpt_at;           /* per worker: the step of the checkpoint it waits for, or -1 */
  int64_t *last_stale;        /* per worker: the staleness of its last push (told in the answer) */
  int64_t resumed_step;       /* the checkpoint loaded (-1: none) */
  uint32_t resumed_crc;
  tdm__ps_log *log;           /* NULL: no update log */
  float round_lr;
  int n_round, n_done;
  tdm_ps_server_stats *st;
} server;

static tdm_status fail(server *v, tdm_status st, const char *fmt, const char *detail, int worker) {
  char what[256];
  snprintf(what, sizeof what, fmt, worker);
  return tdm__set_error(st, "parameter server %d (rank %d, keys [%lld, %lld)): %s%s%s", v->s, v->me, (long long)v->lo,
                        (long long)v->hi, what, detail ? ": " : "", detail ? detail : "");
}

/* Sends the shard's parameters to worker w. */
static tdm_status reply(server *v, int w, uint64_t sum) {
  float *p = tdm_params_data(v->params) + v->lo;
  tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_PARAMS, v->clock[w], v->version, v->lo, v->hi, (float)v->last_stale[w],
                   (uint32_t)v->st->n_lost, sum};
  memcpy(v->buf, &m, sizeof m);
  memcpy(v->buf + sizeof m, p, sizeof(float) * (size_t)v->n);
  size_t bytes = sizeof m + sizeof(float) * (size_t)v->n;
  tdm_status st = tdm_comm_tsend(v->world, w, TDM_PS_TAG_TO_WORKER, v->buf, bytes);
  if (st != TDM_OK) return fail(v, st, "could not answer worker %d", tdm_last_error(), w);
  v->st->bytes_out += bytes;
  return TDM_OK;
}

static uint64_t shard_sum(server *v) { return tdm__ps_sum(tdm_params_data(v->params) + v->lo, v->n); }

/* The slowest clock of the workers still training; -1 when none is. (A lost worker is done; one
 * that sent its final pull trains no more: counted, a faster ssp worker waited for it forever.) */
static int64_t slowest(server *v) {
  int64_t m = -1;
  for (int w = 0; w < v->W; w++)
    if (!v->done[w] && !v->pulling[w] && (m < 0 || v->clock[w] < m)) m = v->clock[w];
  return m;
}

/* The final meeting: once every live worker not done has asked for the shard, everyone who asked
 * gets it (so each worker's last push is in). */
static tdm_status meet(server *v) {
  int asked = 0;
  for (int w = 0; w < v->W; w++) {
    if (!v->done[w] && !v->pulling[w]) return TDM_OK;
    asked += v->pulling[w];
  }
  if (!asked) return TDM_OK;
  uint64_t sum = shard_sum(v);
  for (int w = 0; w < v->W; w++)
    if (v->pulling[w]) {
      v->pulling[w] = 0;
      TDM__TRY(reply(v, w, sum));
    }
  return TDM_OK;
}

/* A checkpoint: once every live worker has asked for the same step, each gets the shard (its
 * version: the optimizer's steps, which the manifest records), then all write it together. */
static tdm_status checkpoint(server *v) {
  int64_t step = -1;
  for (int w = 0; w < v->W; w++) {
    if (v->done[w]) continue;
    if (v->ckpt_at[w] < 0) return TDM_OK;
    if (step >= 0 && v->ckpt_at[w] != step)
      return fail(v, TDM_ERR_MISMATCH, "worker %d asked for a checkpoint of another step than the others", NULL, w);
    step = v->ckpt_at[w];
  }
  if (step < 0) return TDM_OK;
  if (!v->pc->ckpt_dir)
    return fail(v, TDM_ERR_INVALID_ARG, "the workers asked for a checkpoint, but this server has no --checkpoint-dir", NULL, 0);
  uint64_t sum = shard_sum(v);
  for (int w = 0; w < v->W; w++)
    if (v->ckpt_at[w] >= 0) {
      v->ckpt_at[w] = -1;
      TDM__TRY(reply(v, w, sum));
    }
  tdm_status st = tdm__ps_ckpt_save(v->pc->ckpt_dir, v->world, v->params, v->opt, v->lo, v->hi, step, 2);
  if (st != TDM_OK) return fail(v, st, "could not write its part of the checkpoint", tdm_last_error(), 0);
  return TDM_OK;
}

/* The checkpoint a worker resumed from: loaded by the first worker's word, checked against the
 * others'; every worker gets the shard (to compare with what it read). */
static tdm_status resume(server *v, int w, const tdm__ps_msg *m, const char *payload, size_t bytes) {
  if (m->hi < 1 || bytes != sizeof(int32_t) * (size_t)m->hi || m->sum != tdm__ps_sum((const float *)payload, m->hi) ||
      memchr(payload, 0, bytes) == NULL)
    return fail(v, TDM_ERR_REMOTE, "worker %d sent a malformed resume message (not applied)", NULL, w);
  if (v->resumed_step < 0) {
    if (v->version > 0)
      return fail(v, TDM_ERR_MISMATCH, "worker %d asked to resume after updates were applied", NULL, w);
    int64_t steps = 0;
    tdm_status st = tdm__ps_ckpt_load(payload, m->lost, v->params, v->opt, v->lo, v->hi, &steps);
    if (st != TDM_OK) return fail(v, st, "could not resume (worker %d's checkpoint)", tdm_last_error(), w);
    v->version = steps;
    v->resumed_step = m->clock, v->resumed_crc = m->lost;
  } else if (v->resumed_step != m->clock || v->resumed_crc != m->lost) {
    char d[200];
    snprintf(d, sizeof d, "step %lld (checksum %08x), where another resumed from step %lld (%08x)", (long long)m->clock,
             m->lost, (long long)v->resumed_step, v->resumed_crc);
    return fail(v, TDM_ERR_MISMATCH, "worker %d resumed from another checkpoint", d, w);
  }
  for (int q = 0; q < v->W; q++) v->clock[q] = m->clock; /* the steps done: the ssp bound counts on */
  return reply(v, w, shard_sum(v));
}

/* Server 0's list of the lost workers, the first n (the count its meeting's answer gave). */
static tdm_status send_lost(server *v, int w, int64_t n) {
  if (n < 0 || n > v->st->n_lost) n = v->st->n_lost;
  int32_t *r = (int32_t *)(v->buf + sizeof(tdm__ps_msg));
  for (int64_t i = 0; i < n; i++) r[i] = v->lost_order[i];
  tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_LOST, 0, v->version, 0, n, 0, (uint32_t)v->st->n_lost, tdm__ps_sum((const float *)r, n)};
  memcpy(v->buf, &m, sizeof m);
  size_t bytes = sizeof m + sizeof(int32_t) * (size_t)n;
  tdm_status st = tdm_comm_tsend(v->world, w, TDM_PS_TAG_TO_WORKER, v->buf, bytes);
  if (st != TDM_OK) return fail(v, st, "could not answer worker %d", tdm_last_error(), w);
  v->st->bytes_out += bytes;
  return TDM_OK;
}

/* Answers every held worker that is within the bound now (async: bound infinite). */
static tdm_status release(server *v) {
  int64_t low = slowest(v);
  uint64_t sum = 0;
  int summed = 0;
  for (int w = 0; w < v->W; w++) {
    if (!v->held[w]) continue;
    int64_t gap = low < 0 ? 0 : v->clock[w] - low;
    if (v->pc->mode == TDM_PS_SSP && gap > v->pc->staleness) continue;
    if (!summed) sum = shard_sum(v), summed = 1;
    if (gap > v->st->max_clock_gap) v->st->max_clock_gap = gap;
    v->held[w] = 0;
    TDM__TRY(reply(v, w, sum));
  }
  return TDM_OK;
}

/* One optimizer step on the gradient in place (logged first: the log holds what was applied). */
static tdm_status step_opt(server *v, float lr, int worker, int64_t clock, int64_t version) {
  if (v->log) TDM__TRY(tdm__ps_log_append(v->log, worker, clock, version, lr, tdm_params_grad(v->params) + v->lo));
  tdm_status st = tdm_optim_step(v->opt, lr);
  if (st != TDM_OK) return fail(v, st, "the optimizer step failed", tdm_last_error(), 0);
  v->version++;
  v->st->updates++;
  return TDM_OK;
}

/* sync: the round is complete: sum in worker-rank order, average, step, answer everyone. */
static tdm_status finish_round(server *v) {
  float *g = tdm_params_grad(v->params) + v->lo;
  size_t n = (size_t)v->n;
  memcpy(g, v->slots, sizeof(float) * n);
  for (int w = 1; w < v->W; w++) tdm_reduce_local(g, v->slots + (size_t)w * n, n, TDM_F32, TDM_SUM);
  if (v->W > 1)
    for (size_t i = 0; i < n; i++) g[i] /= (float)v->W; /* as the data-parallel average: sum, then divide */
  TDM__TRY(step_opt(v, v->round_lr, v->W, v->clock[0], v->version));
  for (int w = 0; w < v->W; w++) v->clock[w]++, v->in_round[w] = 0;
  v->n_round = 0;
  uint64_t sum = shard_sum(v);
  for (int w = 0; w < v->W; w++) TDM__TRY(reply(v, w, sum));
  return TDM_OK;
}

static tdm_status on_push(server *v, int w, const tdm__ps_msg *m, const float *grad) {
  int64_t stale = v->version - m->version;
  if (stale < 0) stale = 0;
  v->st->staleness_hist[stale < 16 ? stale : 16]++;
  if (stale > v->st->max_staleness) v->st->max_staleness = stale;
  v->last_stale[w] = stale;
  v->st->pushes++;
  if (v->pc->mode == TDM_PS_SYNC) {
    if (v->in_round[w]) return fail(v, TDM_ERR_MISMATCH, "worker %d pushed twice in one synchronous round", NULL, w);
    if (v->n_round == 0) v->round_lr = m->lr;
    else if (memcmp(&v->round_lr, &m->lr, sizeof(float)))
      return fail(v, TDM_ERR_MISMATCH, "worker %d pushed with another learning rate than the others of its round", NULL, w);
    memcpy(v->slots + (size_t)w * (size_t)v->n, grad, sizeof(float) * (size_t)v->n);
    v->in_round[w] = 1;
    if (++v->n_round == v->W) return finish_round(v);
    return TDM_OK;
  }
  memcpy(tdm_params_grad(v->params) + v->lo, grad, sizeof(float) * (size_t)v->n);
  TDM__TRY(step_opt(v, m->lr, w, v->clock[w], m->version));
  v->clock[w]++;
  v->held[w] = 1;
  return release(v);
}

/* Worker w is lost (its connection closed, its process gone): sync mode cannot go on; async and
 * ssp name it and go on with the others. */
static tdm_status on_lost(server *v, int w, tdm_status why) {
  char cause[400];
  snprintf(cause, sizeof cause, "%s", tdm_last_error());
  if (v->pc->mode == TDM_PS_SYNC) {
    char d[560];
    snprintf(d, sizeof d, "%s; a synchronous round needs every worker's gradient, so the servers stop (--ps-mode async or "
             "ssp go on without a lost worker)", cause);
    return fail(v, why, "worker %d was lost", d, w);
  }
  if (v->st->n_lost < (int)(sizeof v->st->lost / sizeof v->st->lost[0])) v->st->lost[v->st->n_lost] = w;
  v->lost_order[v->st->n_lost++] = w;
  v->lost[w] = v->done[w] = 1;
  v->held[w] = v->pulling[w] = 0;
  v->n_done++;
  if (v->pc->notes) {
    fprintf(v->pc->notes, "parameter server %d (rank %d, keys [%lld, %lld)): worker %d lost (%s); going on with %d worker%s "
            "(%s)\n", v->s, v->me, (long long)v->lo, (long long)v->hi, w, cause, v->W - v->st->n_lost,
            v->W - v->st->n_lost == 1 ? "" : "s", tdm_ps_mode_name(v->pc->mode));
    fflush(v->pc->notes);
  }
  TDM__TRY(meet(v));
  TDM__TRY(checkpoint(v));
  return release(v);
}

/* Receives and checks one message; acts on it. */
static tdm_status serve_one(server *v) {
  size_t cap = sizeof(tdm__ps_msg) + sizeof(float) * (size_t)v->n, got = 0;
  size_t room = cap > sizeof(tdm__ps_msg) + TDM_PS_PATH_MAX ? cap : sizeof(tdm__ps_msg) + TDM_PS_PATH_MAX;
  int from = -1;
  v->n_active = 0;
  for (int w = 0; w < v->W; w++)
    if (!v->done[w]) v->active[v->n_active++] = w;
  int gone = -1;
  tdm_status st =
      tdm_comm_trecv_among_lossy(v->world, v->active, v->n_active, TDM_PS_TAG_TO_SERVER, v->buf, room, &from, &got, &gone);
  if (st != TDM_OK && gone >= 0 && gone < v->W) return on_lost(v, gone, st);
  if (st != TDM_OK) return fail(v, st, "stopped waiting for the workers (ranks 0..%d)", tdm_last_error(), v->W - 1);
  v->st->bytes_in += got;
  if (from < 0 || from >= v->W) return fail(v, TDM_ERR_MISMATCH, "rank %d, which is not a worker, sent it a message", NULL, from);
  tdm__ps_msg m = {0};
  if (got >= sizeof m) memcpy(&m, v->buf, sizeof m);
  const float *pay = (const float *)(v->buf + sizeof m);
  if (got < sizeof m || m.magic != TDM_PS_MAGIC ||
      (m.kind != TDM_PS_PUSH && m.kind != TDM_PS_DONE && m.kind != TDM_PS_PULL && m.kind != TDM_PS_LOST &&
       m.kind != TDM_PS_CKPT && m.kind != TDM_PS_RESUME))
    return fail(v, TDM_ERR_REMOTE, "worker %d sent a malformed message (not a push): not applied", NULL, from);
  if (v->done[from]) return fail(v, TDM_ERR_MISMATCH, "worker %d sent a message after it said it was done", NULL, from);
  if (m.kind == TDM_PS_PULL) { /* the shard as it stands once every live worker asks (the final weights) */
    v->pulling[from] = 1;
    TDM__TRY(meet(v));
    return v->pc->mode == TDM_PS_SYNC ? TDM_OK : release(v); /* it no longer holds the slowest clock back */
  }
  if (m.kind == TDM_PS_LOST) return send_lost(v, from, m.clock);
  if (m.kind == TDM_PS_CKPT) {
    if (m.clock < 0) return fail(v, TDM_ERR_REMOTE, "worker %d asked for a checkpoint of a negative step", NULL, from);
    v->ckpt_at[from] = m.clock;
    return checkpoint(v);
  }
  if (m.kind == TDM_PS_RESUME) return resume(v, from, &m, v->buf + sizeof m, got - sizeof m);
  if (m.kind == TDM_PS_DONE) {
    if (v->pc->mode == TDM_PS_SYNC && v->n_round > 0)
      return fail(v, TDM_ERR_MISMATCH, "worker %d finished while others were in a synchronous round (the workers ran "
                  "different numbers of steps)", NULL, from);
    v->done[from] = 1;
    v->n_done++;
    TDM__TRY(meet(v));
    TDM__TRY(checkpoint(v));
    return v->pc->mode == TDM_PS_SYNC ? TDM_OK : release(v);
  }
  if (m.lo != v->lo || m.hi != v->hi) {
    char d[160];
    snprintf(d, sizeof d, "keys [%lld, %lld) are not this server's", (long long)m.lo, (long long)m.hi);
    return fail(v, TDM_ERR_INVALID_ARG, "worker %d pushed a gradient for another key range", d, from);
  }
  if (got != cap) {
    char d[96];
    snprintf(d, sizeof d, "%zu bytes where the shard needs %zu", got, cap);
    return fail(v, TDM_ERR_REMOTE, "worker %d sent a truncated push (not applied)", d, from);
  }
  if (m.sum != tdm__ps_sum(pay, v->n))
    return fail(v, TDM_ERR_REMOTE, "worker %d sent a push whose checksum does not match its data (corrupt; not applied)",
                NULL, from);
  if (!(m.lr >= 0)) return fail(v, TDM_ERR_INVALID_ARG, "worker %d pushed with a learning rate that is not >= 0", NULL, from);
  return on_push(v, from, &m, pay);
}

tdm_status tdm_ps_serve(const tdm_model_config *mc, uint64_t seed, const tdm_optim_config *oc,
                        const tdm_engine_ps_config *pc, tdm_ps_server_stats *stats) {
  if (!mc || !oc || !pc || !stats || !pc->world) return tdm__set_error(TDM_ERR_INVALID_ARG, "ps_serve: NULL argument");
  int P = tdm_comm_size(pc->world), R = tdm_comm_rank(pc->world), S = pc->servers;
  if (S < 1 || S >= P || R < P - S || (unsigned)pc->mode >= TDM_PS_MODE_COUNT || pc->staleness < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "ps_serve: rank %d of %d with %d servers (the last ones), mode %d, "
                          "staleness %d; expected a server's rank, 1..ranks-1 servers, staleness >= 0",
                          R, P, S, (int)pc->mode, pc->staleness);
  memset(stats, 0, sizeof *stats);
  server v = {0};
  v.pc = pc, v.world = pc->world, v.W = P - S, v.s = R - (P - S), v.me = R, v.st = stats;
  double t0 = tdm_time_now();
  tdm_model *model = NULL;
  tdm_status st = tdm_model_create(&model, mc, seed); /* the workers' initial values */
  if (st == TDM_OK) {
    v.params = tdm_model_params(model);
    tdm_ps_shard(tdm_params_numel(v.params), S, v.s, &v.lo, &v.hi);
    v.n = v.hi - v.lo;
    tdm_optim_span span = {v.lo, v.hi};
    st = tdm_optim_create_spans(&v.opt, oc, v.params, 1, &span);
  }
  stats->server = v.s, stats->rank = R, stats->lo = v.lo, stats->hi = v.hi;
  if (st == TDM_OK) {
    /* room for a shard, or for the list of lost workers */
    size_t room = sizeof(float) * (size_t)v.n > sizeof(int32_t) * (size_t)v.W ? sizeof(float) * (size_t)v.n
                                                                                : sizeof(int32_t) * (size_t)v.W;
    if (room < TDM_PS_PATH_MAX) room = TDM_PS_PATH_MAX;
    v.buf = tdm__malloc_cat(sizeof(tdm__ps_msg) + room, TDM_MEM_COMM);
    v.slots = pc->mode == TDM_PS_SYNC ? tdm__malloc_cat(sizeof(float) * (size_t)v.n * (size_t)v.W + 4, TDM_MEM_GRADS) : NULL;
    v.in_round = tdm__calloc((size_t)v.W * 7, sizeof(int));
    v.clock = tdm__calloc((size_t)v.W * 3, sizeof(int64_t));
    v.resumed_step = -1;
    if (v.clock) {
      v.ckpt_at = v.clock + v.W, v.last_stale = v.ckpt_at + v.W;
      for (int w = 0; w < v.W; w++) v.ckpt_at[w] = -1;
    }
    if (!v.buf || (pc->mode == TDM_PS_SYNC && !v.slots) || !v.in_round || !v.clock)
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "parameter server %d: out of memory for a shard of %lld floats", v.s,
                          (long long)v.n);
    else
      v.done = v.in_round + v.W, v.held = v.done + v.W, v.active = v.held + v.W, v.lost = v.active + v.W,
      v.pulling = v.lost + v.W, v.lost_order = v.pulling + v.W;
  }
  if (st == TDM_OK && pc->log_dir)
    st = tdm__ps_log_open(&v.log, pc->log_dir, v.s, S, (int)pc->mode, v.W, v.lo, v.hi, tdm_params_numel(v.params));
  while (st == TDM_OK && v.n_done < v.W) st = serve_one(&v);
  /* the workers waiting on this server learn why it stops (not only that its connection closed) */
  if (st != TDM_OK && tdm_comm_status(v.world) == TDM_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tdm_last_error());
    tdm_comm_abort_why(v.world, st, why);
    tdm__set_error(st, "%s", why);
  }
  stats->seconds = tdm_time_now() - t0;
  tdm_status lst = tdm__ps_log_close(v.log, NULL);
  if (st == TDM_OK) st = lst;
  tdm__free(v.buf);
  tdm__free(v.slots);
  tdm__free(v.in_round);
  tdm__free(v.clock);
  tdm_optim_destroy(v.opt);
  tdm_model_destroy(model);
  return st;
}

void tdm_ps_stats_json(const tdm_ps_server_stats *st, char *buf, size_t n) {
  if (!buf || !n) return;
  buf[0] = 0;
  TDM__NONNULL(st, , "tdm_ps_stats_json: the stats st are NULL");
  size_t k = (size_t)snprintf(buf, n,
                              "{\"ps_server\":%d,\"rank\":%d,\"keys\":[%lld,%lld],\"bytes\":%lld,\"pushes\":%lld,"
                              "\"updates\":%lld,\"bytes_in\":%llu,\"bytes_out\":%llu,\"max_staleness\":%lld,"
                              "\"max_clock_gap\":%lld,\"seconds\":%.3f,\"staleness_hist\":[",
                              st->server, st->rank, (long long)st->lo, (long long)st->hi,
                              (long long)(st->hi - st->lo) * 4, (long long)st->pushes, (long long)st->updates,
                              (unsigned long long)st->bytes_in, (unsigned long long)st->bytes_out,
                              (long long)st->max_staleness, (long long)st->max_clock_gap, st->seconds);
  for (int i = 0; i < 17 && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)st->staleness_hist[i]);
  if (k < n) k += (size_t)snprintf(buf + k, n - k, "],\"lost_workers\":[");
  int named = st->n_lost < 16 ? st->n_lost : 16;
  for (int i = 0; i < named && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? "," : "", st->lost[i]);
  if (k < n) snprintf(buf + k, n - k, "]}");
}
