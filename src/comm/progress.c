/* Non-blocking calls: a progress thread per communicator runs queued work in the order it was
 * queued; blocking calls wait until the queue is idle, so calls keep the order they were made in. */
#include <stdio.h>

#include "comm/comm_impl.h"
#include "tandem/trace.h"

/* ---- non-blocking work ---------------------------------------------------------------------- */
typedef enum {
  W_ALLREDUCE,
  W_BROADCAST,
  W_REDUCE,
  W_REDUCE_SCATTER,
  W_ALLGATHER,
  W_REDUCE_SCATTER_BLOCKS,
  W_ALLGATHER_BLOCKS,
  W_REDUCE_SCATTER_V,
  W_ALLGATHER_V,
  W_GATHER,
  W_SCATTER,
  W_ALLTOALL,
  W_BARRIER,
  W_CALL,
  W_SEND,
  W_RECV
} work_kind;

struct tdm_work {
  struct tdm_work *next;     /* the queue */
  struct tdm_work *all_next; /* c->handles: until waited for */
  struct tdm_comm *c;
  work_kind kind;
  const void *sbuf;
  void *rbuf;
  size_t count;
  const size_t *parts; /* W_*_V */
  tdm_dtype dt;
  tdm_redop op;
  tdm_algo algo;
  int peer_or_root, tag;
  tdm_status (*fn)(void *ctx); /* W_CALL */
  void *ctx;
  tdm_status st;
  char error[512];
  int origin; /* tdm_last_error_origin of the failure, carried to the waiting thread */
  int done;
  double t_launch; /* tracing: when it was queued (0: not traced) */
};


static tdm_status run_work(struct tdm_work *w) {
  struct tdm_comm *c = w->c;
  switch (w->kind) {
  case W_ALLREDUCE: return tdm_comm_allreduce(c, w->sbuf, w->rbuf, w->count, w->dt, w->op, w->algo);
  case W_BROADCAST: return tdm_comm_broadcast(c, w->rbuf, w->count, w->dt, w->peer_or_root, w->algo);
  case W_REDUCE: return tdm_comm_reduce(c, w->sbuf, w->rbuf, w->count, w->dt, w->op, w->peer_or_root, w->algo);
  case W_REDUCE_SCATTER: return tdm_comm_reduce_scatter(c, w->sbuf, w->rbuf, w->count, w->dt, w->op, w->algo);
  case W_ALLGATHER: return tdm_comm_allgather(c, w->sbuf, w->rbuf, w->count, w->dt, w->algo);
  case W_REDUCE_SCATTER_BLOCKS: return tdm_comm_reduce_scatter_blocks(c, w->sbuf, w->rbuf, w->count, w->dt, w->op, w->algo);
  case W_ALLGATHER_BLOCKS: return tdm_comm_allgather_blocks(c, w->sbuf, w->rbuf, w->count, w->dt, w->algo);
  case W_REDUCE_SCATTER_V: return tdm_comm_reduce_scatter_v(c, w->sbuf, w->rbuf, w->count, w->parts, w->dt, w->op, w->algo);
  case W_ALLGATHER_V: return tdm_comm_allgather_v(c, w->sbuf, w->rbuf, w->count, w->parts, w->dt, w->algo);
  case W_GATHER: return tdm_comm_gather(c, w->sbuf, w->rbuf, w->count, w->dt, w->peer_or_root);
  case W_SCATTER: return tdm_comm_scatter(c, w->sbuf, w->rbuf, w->count, w->dt, w->peer_or_root);
  case W_ALLTOALL: return tdm_comm_alltoall(c, w->sbuf, w->rbuf, w->count, w->dt);
  case W_BARRIER: return tdm_comm_barrier(c);
  case W_CALL: return w->fn(w->ctx);
  case W_SEND: return tdm__p2p(c, w->peer_or_root, w->tag, (void *)w->sbuf, w->count, 1);
  case W_RECV: return tdm__p2p(c, w->peer_or_root, w->tag, w->rbuf, w->count, 0);
  }
  return TDM_ERR_INTERNAL;
}

static const char *const work_names[] = {"all-reduce", "broadcast", "reduce", "reduce-scatter", "all-gather",
                                         "reduce-scatter", "all-gather", "reduce-scatter", "all-gather", "gather",
                                         "scatter", "all-to-all", "barrier", "call", "send", "recv"};
_Static_assert(sizeof work_names / sizeof *work_names == W_RECV + 1, "a name per kind of work");

/* A queued call from its launch to its completion, on a track of its own (calls overlap the
 * computation that launched them, and each other's queueing). */
static void trace_work(struct tdm_comm *c, struct tdm_work *w) {
  tdm_trace_args a = TDM_TRACE_ARGS_INIT;
  a.comm = c->comm_id;
  if (w->kind < W_CALL) {
    a.seq = (int64_t)c->cur.seq, a.bytes = (int64_t)(w->count * tdm_dtype_size(w->dt));
    a.algo = tdm_algo_name((tdm_algo)c->tr_algo);
  }
  tdm_trace_async("comm.async", work_names[w->kind], w->t_launch, tdm_trace_now(), &a);
}

static _Thread_local int on_progress_thread;

static void *progress_main(void *arg) {
  struct tdm_comm *c = arg;
  on_progress_thread = 1;
  tdm_trace_attach(c->tr_rec); /* the recorder of the thread that started this one */
  tdm_trace_name_thread("communication");
  tdm__mem_scope(TDM_MEM_COMM); /* what the queued calls allocate */
  pthread_mutex_lock(&c->q_mu);
  for (;;) {
    while (!c->q_head && !c->q_stop) pthread_cond_wait(&c->q_cv, &c->q_mu);
    if (!c->q_head) break;
    struct tdm_work *w = c->q_head;
    c->q_head = w->next;
    if (!c->q_head) c->q_tail = NULL;
    c->q_busy = 1;
    pthread_mutex_unlock(&c->q_mu);
    tdm_status st = run_work(w);
    if (w->t_launch > 0 && tdm_trace_on()) trace_work(c, w);
    pthread_mutex_lock(&c->q_mu);
    w->st = st;
    if (st != TDM_OK) snprintf(w->error, sizeof w->error, "%s", tdm_last_error());
    w->origin = st != TDM_OK ? tdm_last_error_origin() : -1;
    w->done = 1;
    c->q_busy = 0;
    pthread_cond_broadcast(&c->q_cv);
  }
  pthread_mutex_unlock(&c->q_mu);
  return NULL;
}

/* Blocking calls keep their place in line behind queued non-blocking ones. */
tdm_status tdm__wait_queue_idle(struct tdm_comm *c) {
  if (!c || !c->q_started || on_progress_thread) return TDM_OK;
  pthread_mutex_lock(&c->q_mu);
  while (c->q_head || c->q_busy) pthread_cond_wait(&c->q_cv, &c->q_mu);
  pthread_mutex_unlock(&c->q_mu);
  return TDM_OK;
}

/* The buffers every rank must give whatever its part (the blocking call checks the rest): a NULL
 * one is refused here, at the call, not only when the handle is waited for. */
static const char *missing_buffer(const struct tdm_work *w) {
  if (w->kind == W_REDUCE_SCATTER_V || w->kind == W_ALLGATHER_V)
    if (!w->parts) return "parts";
  if (!w->count) return NULL;
  switch (w->kind) {
  case W_ALLREDUCE:
  case W_ALLTOALL: return !w->sbuf ? "sendbuf" : !w->rbuf ? "recvbuf" : NULL;
  case W_REDUCE:
  case W_REDUCE_SCATTER:
  case W_REDUCE_SCATTER_BLOCKS:
  case W_REDUCE_SCATTER_V:
  case W_GATHER:
  case W_SEND: return !w->sbuf ? "the send buffer" : NULL;
  case W_BROADCAST:
  case W_ALLGATHER:
  case W_ALLGATHER_BLOCKS:
  case W_ALLGATHER_V:
  case W_SCATTER:
  case W_RECV: return !w->rbuf ? "the receive buffer" : NULL;
  default: return NULL;
  }
}

static tdm_status enqueue(struct tdm_comm *c, struct tdm_work *tmpl, tdm_work_t *out) {
  if (!c || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "non-blocking call: %s is NULL", !c ? "the communicator" : "the handle's address");
  const char *miss = missing_buffer(tmpl);
  if (miss) return tdm__set_error(TDM_ERR_INVALID_ARG, "non-blocking call: %s is NULL with a non-zero count", miss);
  /* a handle waited for before is used again: the steady state allocates nothing */
  pthread_mutex_lock(&c->q_mu);
  struct tdm_work *w = c->q_free;
  if (w) c->q_free = w->next;
  pthread_mutex_unlock(&c->q_mu);
  if (!w && !(w = tdm__malloc_cat(sizeof *w, TDM_MEM_COMM)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "non-blocking call: out of memory");
  *w = *tmpl;
  w->c = c;
  w->next = NULL;
  w->done = 0;
  w->t_launch = tdm_trace_begin();
  pthread_mutex_lock(&c->q_mu);
  if (!c->q_started) {
    c->tr_rec = tdm_trace_current();
    if (pthread_create(&c->q_thread, NULL, progress_main, c) != 0) {
      pthread_mutex_unlock(&c->q_mu);
      tdm__free(w);
      return tdm__set_error(TDM_ERR_SYSTEM, "non-blocking call: cannot start the progress thread");
    }
    c->q_started = 1;
  }
  if (c->q_tail) c->q_tail->next = w;
  else c->q_head = w;
  c->q_tail = w;
  w->all_next = c->handles;
  c->handles = w;
  pthread_cond_broadcast(&c->q_cv);
  pthread_mutex_unlock(&c->q_mu);
  *out = w;
  return TDM_OK;
}

tdm_status tdm_comm_iallreduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                               tdm_redop op, tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_ALLREDUCE, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .dt = dt, .op = op, .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ibroadcast(tdm_comm_t c, void *buf, size_t count, tdm_dtype dt, int root, tdm_algo algo,
                               tdm_work_t *work) {
  struct tdm_work t = {.kind = W_BROADCAST, .rbuf = buf, .count = count, .dt = dt, .algo = algo, .peer_or_root = root};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ireduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt, tdm_redop op,
                            int root, tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_REDUCE, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .dt = dt, .op = op, .algo = algo,
                       .peer_or_root = root};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ireduce_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt,
                                    tdm_redop op, tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_REDUCE_SCATTER, .sbuf = sendbuf, .rbuf = recvbuf, .count = recvcount, .dt = dt, .op = op, .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_iallgather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt,
                               tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_ALLGATHER, .sbuf = sendbuf, .rbuf = recvbuf, .count = sendcount, .dt = dt, .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ireduce_scatter_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                           tdm_redop op, tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_REDUCE_SCATTER_BLOCKS, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .dt = dt, .op = op,
                       .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_iallgather_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                      tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_ALLGATHER_BLOCKS, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .dt = dt, .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ireduce_scatter_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                      tdm_dtype dt, tdm_redop op, tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_REDUCE_SCATTER_V, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .parts = parts, .dt = dt,
                       .op = op, .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_iallgather_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                 tdm_dtype dt, tdm_algo algo, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_ALLGATHER_V, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .parts = parts, .dt = dt,
                       .algo = algo};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_igather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt, int root,
                            tdm_work_t *work) {
  struct tdm_work t = {.kind = W_GATHER, .sbuf = sendbuf, .rbuf = recvbuf, .count = sendcount, .dt = dt, .peer_or_root = root};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_iscatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt, int root,
                             tdm_work_t *work) {
  struct tdm_work t = {.kind = W_SCATTER, .sbuf = sendbuf, .rbuf = recvbuf, .count = recvcount, .dt = dt, .peer_or_root = root};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ialltoall(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_work_t *work) {
  struct tdm_work t = {.kind = W_ALLTOALL, .sbuf = sendbuf, .rbuf = recvbuf, .count = count, .dt = dt};
  return enqueue(c, &t, work);
}
tdm_status tdm__comm_icall(struct tdm_comm *c, tdm_status (*fn)(void *ctx), void *ctx, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_CALL, .fn = fn, .ctx = ctx};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_ibarrier(tdm_comm_t c, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_BARRIER};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_isend(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_SEND, .sbuf = buf, .count = nbytes, .peer_or_root = peer, .tag = tag};
  return enqueue(c, &t, work);
}
tdm_status tdm_comm_irecv(tdm_comm_t c, int peer, int tag, void *buf, size_t nbytes, tdm_work_t *work) {
  struct tdm_work t = {.kind = W_RECV, .rbuf = buf, .count = nbytes, .peer_or_root = peer, .tag = tag};
  return enqueue(c, &t, work);
}

int tdm_work_test(tdm_work_t w) {
  TDM__NONNULL(w, -1, "tdm_work_test: the work handle is NULL");
  pthread_mutex_lock(&w->c->q_mu);
  int d = w->done;
  pthread_mutex_unlock(&w->c->q_mu);
  return d;
}

tdm_status tdm_work_wait(tdm_work_t w) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_work_wait: the work handle is NULL");
  struct tdm_comm *c = w->c;
  pthread_mutex_lock(&c->q_mu);
  while (!w->done) pthread_cond_wait(&c->q_cv, &c->q_mu); /* the call itself is bounded by the timeout */
  for (struct tdm_work **p = &c->handles; *p; p = &(*p)->all_next)
    if (*p == w) {
      *p = w->all_next;
      break;
    }
  tdm_status st = w->st;
  if (st != TDM_OK) tdm__error_from(w->origin, tdm__set_error(st, "%s", w->error));
  w->next = c->q_free; /* kept for the next call */
  c->q_free = w;
  pthread_mutex_unlock(&c->q_mu);
  return st;
}

void tdm__progress_stop(struct tdm_comm *c) {
  if (c->q_started) {
    pthread_mutex_lock(&c->q_mu);
    c->q_stop = 1;
    pthread_cond_broadcast(&c->q_cv);
    pthread_mutex_unlock(&c->q_mu);
    pthread_join(c->q_thread, NULL);
  }
  for (struct tdm_work *w = c->handles, *next; w; w = next) { /* abandoned on some error path */
    next = w->all_next;
    tdm__free(w);
  }
  c->handles = NULL;
  for (struct tdm_work *w = c->q_free, *next; w; w = next) {
    next = w->next;
    tdm__free(w);
  }
  c->q_free = NULL;
}
