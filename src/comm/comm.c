/* The communicator: creation, validation, sequence numbers and header checks, failure handling,
 * waiting, the public collective calls and the non-blocking ones (configuration: config.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include "comm/comm_impl.h"

/* ---- failure ------------------------------------------------------------------------------ */
tdm_status tdm__comm_fail(struct tdm_comm *c, tdm_status st, const char *fmt, ...) {
  if (!atomic_exchange(&c->failed, 1)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    c->fail_status = st;
  }
  return tdm__set_error(c->fail_status, "%s", c->error);
}

tdm_status tdm_comm_status(tdm_comm_t c) { return atomic_load(&c->failed) ? c->fail_status : TDM_OK; }
const char *tdm_comm_last_error(tdm_comm_t c) { return c->error; }
int tdm_comm_rank(tdm_comm_t c) { return c->rank; }
int tdm_comm_size(tdm_comm_t c) { return c->size; }
tdm_transport_kind tdm_comm_transport(tdm_comm_t c) { return c->kind; }
uint64_t tdm_comm_bytes_sent(tdm_comm_t c) { return c ? atomic_load_explicit(&c->bytes_sent, memory_order_relaxed) : 0; }
void tdm_comm_set_timeout(tdm_comm_t c, double s) {
  if (s > 0) c->timeout_s = s;
}

const char *tdm__call_str(const tdm__call *k, char *buf, size_t n) {
  if (k->kind == TDM_COLL_P2P) snprintf(buf, n, "send/recv (tag %llu, %llu bytes)", (unsigned long long)k->seq, (unsigned long long)k->count);
  else if (k->kind == TDM_COLL_BARRIER) snprintf(buf, n, "barrier #%llu", (unsigned long long)k->seq);
  else if (k->kind == TDM_COLL_BROADCAST || k->kind == TDM_COLL_GATHER || k->kind == TDM_COLL_SCATTER)
    snprintf(buf, n, "%s #%llu (%llu x %s, root %d)", tdm__coll_name((int)k->kind), (unsigned long long)k->seq,
             (unsigned long long)k->count, tdm_dtype_name((tdm_dtype)k->dtype), k->root);
  else if (k->kind == TDM_COLL_REDUCE)
    snprintf(buf, n, "reduce #%llu (%llu x %s, %s, root %d)", (unsigned long long)k->seq, (unsigned long long)k->count,
             tdm_dtype_name((tdm_dtype)k->dtype), tdm_redop_name((tdm_redop)k->op), k->root);
  else {
    int red = k->kind == TDM_COLL_ALLREDUCE || k->kind == TDM_COLL_REDUCE_SCATTER;
    int vec = k->kind == TDM_COLL_REDUCE_SCATTER || k->kind == TDM_COLL_ALLGATHER;
    char parts[32] = ""; /* the v forms: their partition's hash (parts_hash) */
    if (vec && k->root) snprintf(parts, sizeof parts, ", parts %08x", (unsigned)k->root);
    snprintf(buf, n, "%s #%llu (%llu x %s%s%s%s%s)", tdm__coll_name((int)k->kind), (unsigned long long)k->seq,
             (unsigned long long)k->count, tdm_dtype_name((tdm_dtype)k->dtype), vec ? " in all" : "", red ? ", " : "",
             red ? tdm_redop_name((tdm_redop)k->op) : "", parts);
  }
  return buf;
}

static tdm__call call_of(const tdm__hdr *h) {
  tdm__call k = {h->kind, h->dtype, h->op, h->root, h->count, h->seq};
  return k;
}

int tdm__comm_rank_of(const struct tdm_comm *c, int q) {
  if (!c->map) return q;
  for (int i = 0; i < c->size; i++)
    if (c->map[i] == q) return i;
  return -1;
}

tdm_status tdm__check_call(struct tdm_comm *c, int peer, const tdm__call *w, uint32_t want_comm, const tdm__call *g,
                           uint32_t got_comm) {
  char a[160], b[160];
  int pr = tdm__comm_rank_of(c, peer);
  if (got_comm != want_comm)
    return tdm__comm_fail(c, TDM_ERR_MISMATCH,
                          "rank %d is in %s on another communicator (id %u) while rank %d is in %s on this one (id %u)",
                          pr, tdm__call_str(g, a, sizeof a), got_comm, c->rank, tdm__call_str(w, b, sizeof b), want_comm);
  if (g->kind != w->kind || g->seq != w->seq || g->dtype != w->dtype || g->op != w->op || g->root != w->root ||
      g->count != w->count)
    return tdm__comm_fail(c, TDM_ERR_MISMATCH, "collective mismatch: rank %d called %s but rank %d called %s", c->rank,
                          tdm__call_str(w, b, sizeof b), pr, tdm__call_str(g, a, sizeof a));
  return TDM_OK;
}

tdm_status tdm__check_header(struct tdm_comm *c, int peer, const tdm__hdr *want, const tdm__hdr *got) {
  char b[160];
  if (got->magic != TDM_MSG_MAGIC)
    return tdm__comm_fail(c, TDM_ERR_REMOTE, "rank %d sent a corrupt message (bad magic 0x%08x) during %s",
                          tdm__comm_rank_of(c, peer), got->magic, tdm__call_str(&c->cur, b, sizeof b));
  tdm__call w = call_of(want), g = call_of(got);
  TDM__TRY(tdm__check_call(c, peer, &w, want->comm_id, &g, got->comm_id));
  if (got->nbytes != want->nbytes)
    return tdm__comm_fail(c, TDM_ERR_MISMATCH,
                          "rank %d sent %llu bytes where rank %d expected %llu in %s (do all ranks pass the same algorithm?)",
                          tdm__comm_rank_of(c, peer), (unsigned long long)got->nbytes, c->rank,
                          (unsigned long long)want->nbytes, tdm__call_str(&w, b, sizeof b));
  return TDM_OK;
}

/* ---- waiting ------------------------------------------------------------------------------- */
int tdm__backoff(tdm__backoff_t *b) {
  enum { SPINS = 4000, YIELDS = 100 };
  if (++b->spins < SPINS) { /* the peer is probably about to arrive: stay on the core */
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    return 0;
  }
  if (b->spins < SPINS + YIELDS) {
    sched_yield();
    return (b->spins & 63) == 0;
  }
  static _Thread_local int slack_set;
  if (!slack_set) { /* the default 50 us timer slack would stretch every short nap to ~70 us */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    slack_set = 1;
  }
  double now = tdm_time_now();
  if (b->since == 0) b->since = now;
  /* a nap of 1/16 of the time waited so far: a late peer is noticed at most ~6% late, and a
   * stopped one costs a wake-up per millisecond instead of 50,000 a second */
  double nap = (now - b->since) / 16;
  nap = nap < 20e-6 ? 20e-6 : (nap > 1e-3 ? 1e-3 : nap);
  struct timespec ts = {0, (long)(nap * 1e9)};
  nanosleep(&ts, NULL);
  if (now < b->next_check) return 0;
  b->next_check = now + 0.005;
  return 1;
}

/* ---- point to point for algorithms -------------------------------------------------------- */
void *tdm__comm_scratch(struct tdm_comm *c, size_t n) {
  if (n <= c->scratch_bytes) return c->scratch;
  tdm__free(c->scratch); /* first: the old contents are not kept, and both at once would double the peak */
  c->scratch = tdm__aligned_alloc_cat(n, TDM_MEM_COMM);
  c->scratch_bytes = c->scratch ? n : 0;
  return c->scratch;
}

/* Emulated network: each send first waits for its link (serialised per peer at the emulated
 * bandwidth), then for the latency. The wait happens before the real transfer, so the receiver
 * sees the data no earlier than a real link of that speed would deliver it. */
static void emulate(struct tdm_comm *c, const tdm__xfer *x, int n) {
  double now = tdm_time_now(), until = now;
  for (int i = 0; i < n; i++) {
    if (!x[i].is_send) continue;
    double *free_at = &c->emu_link_free[x[i].peer];
    double start = *free_at > now ? *free_at : now;
    double wire = c->emu_bytes_per_s > 0 ? (double)(x[i].nbytes + sizeof(tdm__hdr)) / c->emu_bytes_per_s : 0;
    *free_at = start + wire;
    if (start + wire + c->emu_latency_s > until) until = start + wire + c->emu_latency_s;
  }
  double left = until - now;
  if (left > 0) {
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

/* Runs transfers whose headers are set: emulation, rank mapping, the transport, and on failure
 * the abort that tells every peer why. */
static tdm_status run_xfers(struct tdm_comm *c, tdm__xfer *x, int n) {
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  c->tr->active = c;
  if (c->emu_link_free) emulate(c, x, n);
  uint64_t sent = 0;
  for (int i = 0; i < n; i++) {
    x[i].done = 0;
    x[i].complete = 0;
    if (c->map) x[i].peer = c->map[x[i].peer];
    if (x[i].is_send) sent += x[i].nbytes; /* payload only: headers are not counted */
  }
  tdm__count_sent(c, sent);
  tdm_status st = c->tr->ops->run(c->tr, x, n, tdm_time_now() + c->timeout_s);
  if (st != TDM_OK) {
    /* c->error names the cause; tell the peers and close, so none of them waits for us */
    if (!atomic_load(&c->failed)) tdm__comm_fail(c, st, "%s", tdm_last_error());
    c->tr->ops->abort(c->tr, c->error);
    return tdm__set_error(c->fail_status, "%s", c->error);
  }
  return TDM_OK;
}

tdm_status tdm__exchange(struct tdm_comm *c, tdm__xfer *x, int n) {
  for (int i = 0; i < n; i++) {
    tdm__hdr h = {TDM_MSG_MAGIC, c->cur.kind, c->cur.seq, c->cur.dtype, c->cur.op, c->cur.root, c->comm_id,
                  c->cur.count, x[i].nbytes};
    x[i].hdr = h;
  }
  return run_xfers(c, x, n);
}

tdm_status tdm__send(struct tdm_comm *c, int peer, const void *buf, size_t nbytes) {
  tdm__xfer x = {.peer = peer, .is_send = 1, .buf = (void *)buf, .nbytes = nbytes};
  return tdm__exchange(c, &x, 1);
}

tdm_status tdm__recv(struct tdm_comm *c, int peer, void *buf, size_t nbytes) {
  tdm__xfer x = {.peer = peer, .is_send = 0, .buf = buf, .nbytes = nbytes};
  return tdm__exchange(c, &x, 1);
}

tdm_status tdm__sendrecv(struct tdm_comm *c, int to, const void *sbuf, size_t sn, int from, void *rbuf, size_t rn) {
  tdm__xfer x[2] = {{.peer = to, .is_send = 1, .buf = (void *)sbuf, .nbytes = sn},
                    {.peer = from, .is_send = 0, .buf = rbuf, .nbytes = rn}};
  return tdm__exchange(c, x, 2);
}

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
  int done;
};

/* ---- create / destroy ---------------------------------------------------------------------- */
static void *progress_main(void *arg);

static tdm_status comm_create(tdm_comm_t *out, const tdm_comm_config *cfg);

/* Everything a communicator allocates, its transport's buffers and the store included, counts as
 * communication memory (tandem/core.h). */
tdm_status tdm_comm_create(tdm_comm_t *out, const tdm_comm_config *cfg) {
  tdm_mem_category was = tdm__mem_scope(TDM_MEM_COMM);
  tdm_status st = comm_create(out, cfg);
  tdm__mem_scope(was);
  return st;
}

static tdm_status comm_create(tdm_comm_t *out, const tdm_comm_config *cfg) {
  if (!out || !cfg) return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: NULL argument");
  *out = NULL;
  if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: rank %d of world size %d; expected 0 <= rank < size",
                          cfg->rank, cfg->size);
  struct tdm_comm *c = tdm__calloc(1, sizeof *c);
  if (!c) return tdm__set_error(TDM_ERR_NO_MEMORY, "comm_create: out of memory");
  c->rank = cfg->rank;
  c->size = cfg->size;
  c->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 300.0;
  tdm_status est = cfg->timeout_s > 0 ? TDM_OK : tdm__env_timeout(&c->timeout_s);
  if (est == TDM_OK) est = tdm__env_local_size(&c->local_size);
  c->comm_id = 1;
  c->owns_transport = 1;
  const char *emu = getenv("TANDEM_NET_EMULATE");
  if (est == TDM_OK && emu && *emu) {
    est = tdm__parse_net_emulate(emu, &c->emu_latency_s, &c->emu_bytes_per_s);
    if (est == TDM_OK) {
      c->emu_link_free = tdm__calloc((size_t)cfg->size, sizeof(double));
      tdm_log(TDM_LOG_INFO, "network emulation: %.0f us latency, %.3g MB/s per link", c->emu_latency_s * 1e6,
              c->emu_bytes_per_s / 1e6);
    }
  }
  if (est != TDM_OK) {
    tdm__free(c);
    return est;
  }
  pthread_mutex_init(&c->q_mu, NULL);
  pthread_cond_init(&c->q_cv, NULL);
  tdm_transport_kind k = cfg->transport;
  if (k == TDM_TRANSPORT_AUTO) /* threads if given a group; shm when every rank is on this node; else tcp */
    k = cfg->thread_group ? TDM_TRANSPORT_THREAD
                          : (cfg->size > 1 && c->local_size == cfg->size ? TDM_TRANSPORT_SHM : TDM_TRANSPORT_TCP);
  c->kind = k;
  tdm_status st;
  switch (k) {
  case TDM_TRANSPORT_THREAD:
    st = cfg->thread_group ? tdm__thread_transport_create(&c->tr, c, cfg->thread_group)
                           : tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: the thread transport needs cfg.thread_group");
    break;
  case TDM_TRANSPORT_TCP:
    st = tdm__tcp_transport_create(&c->tr, c, cfg);
    break;
  case TDM_TRANSPORT_SHM:
    st = tdm__shm_transport_create(&c->tr, c, cfg);
    break;
  case TDM_TRANSPORT_MPI:
    st = tdm__mpi_transport_create(&c->tr, c);
    break;
  default:
    st = tdm__set_error(TDM_ERR_NOT_SUPPORTED, "comm_create: the %s transport is not built yet; use thread, shm or tcp",
                        tdm_transport_name(k));
  }
  if (st == TDM_OK && (st = tdm__parse_algo_env(c, getenv("TANDEM_ALGO"))) != TDM_OK) {
    c->tr->ops->destroy(c->tr); /* every rank parses the same value: all fail alike */
    tdm__set_error(st, "environment: %s", tdm_last_error());
  }
  if (st != TDM_OK) {
    pthread_mutex_destroy(&c->q_mu);
    pthread_cond_destroy(&c->q_cv);
    tdm__free(c->emu_link_free);
    tdm__free(c);
    return st;
  }
  *out = c;
  return TDM_OK;
}

tdm_status tdm_comm_create_from_env(tdm_comm_t *out) {
  tdm_comm_config cfg;
  TDM__TRY(tdm_comm_config_from_env(&cfg));
  return tdm_comm_create(out, &cfg);
}

void tdm_comm_abort(tdm_comm_t c) {
  if (!c) return;
  tdm__comm_fail(c, TDM_ERR_REMOTE, "rank %d: the communicator was aborted", c->rank);
  if (c->tr && c->owns_transport) {
    c->tr->active = c;
    c->tr->ops->abort(c->tr, c->error);
  }
}

void tdm_comm_destroy(tdm_comm_t c) {
  if (!c) return;
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
  if (c->tr && c->owns_transport) c->tr->ops->destroy(c->tr);
  else if (c->tr && c->tr->active == c) c->tr->active = NULL; /* a sub-communicator goes */
  pthread_mutex_destroy(&c->q_mu);
  pthread_cond_destroy(&c->q_cv);
  tdm__free(c->map_owned);
  tdm__free(c->scratch);
  tdm__free(c->emu_link_free);
  tdm__free(c);
}

/* ---- argument checks and dispatch ---------------------------------------------------------- */
static tdm_status begin(struct tdm_comm *c, tdm__coll_kind kind, size_t count, tdm_dtype dt, tdm_redop op, int root) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: communicator is NULL", tdm__coll_name(kind));
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  if ((unsigned)dt >= TDM_DTYPE_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: dtype %d is unknown", tdm__coll_name(kind), (int)dt);
  if ((unsigned)op >= TDM_REDOP_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: reduction op %d is unknown", tdm__coll_name(kind), (int)op);
  if (root < 0 || root >= c->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: root %d is not a rank of this communicator (size %d)",
                          tdm__coll_name(kind), root, c->size);
  if (count > ((size_t)1 << 40))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: count %zu is implausibly large", tdm__coll_name(kind), count);
  c->cur = (tdm__call){kind, (uint32_t)dt, (uint32_t)op, root, count, ++c->seq};
  c->tr->active = c; /* sub-communicators too: their calls are checked like any other */
  return TDM_OK;
}

/* Publishes the call and how it runs, once the algorithm is chosen (before, a peer could see
 * this call with the wrong algorithm). */
static void announce(struct tdm_comm *c, tdm_algo algo) {
  if (c->tr->ops->announce) c->tr->ops->announce(c->tr, &c->cur, algo == TDM_ALGO_SHM);
}

static tdm_status null_buf(struct tdm_comm *c, const char *what) {
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s is NULL with a non-zero count", tdm__coll_name((int)c->cur.kind), what);
}

static tdm_status not_applicable(struct tdm_comm *c, tdm_algo a) {
  char list[160];
  return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "%s: algorithm '%s' does not apply on this %d-rank %s communicator; use %s",
                        tdm__coll_name((int)c->cur.kind), tdm_algo_name(a), c->size, tdm_transport_name(c->kind),
                        tdm__algos_for(c, (int)c->cur.kind, list, sizeof list));
}

/* Every rank learns that every other is in the same call before any data moves: a
 * dissemination exchange of headers alone, checked on arrival (after round k a rank has heard,
 * through its peers' checks, from 2^k ranks, and a rank that finds a mismatch stops forwarding,
 * so nobody completes it). The barrier is exactly this. Rooted collectives run it first because
 * there some ranks only send and would otherwise never see a peer's call. */
static tdm_status agree(struct tdm_comm *c) {
  for (int k = 1; k < c->size; k <<= 1)
    TDM__TRY(tdm__sendrecv(c, (c->rank + k) % c->size, NULL, 0, (c->rank - k + c->size) % c->size, NULL, 0));
  return TDM_OK;
}

static tdm_status wait_queue_idle(struct tdm_comm *c);

tdm_status tdm_comm_allreduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op, tdm_algo algo) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_ALLREDUCE, count, dt, op, 0));
  if (count && (!sendbuf || !recvbuf)) return null_buf(c, "a buffer");
  size_t nbytes = count * tdm_dtype_size(dt);
  algo = tdm__algo_pick(c, TDM_COLL_ALLREDUCE, algo);
  if (algo == TDM_ALGO_AUTO) {
    if (tdm__shm_usable(c)) algo = TDM_ALGO_SHM; /* reduce straight from shared memory */
    else /* latency-bound: fewest steps; bandwidth-bound: ring */
      algo = nbytes <= 4096 ? TDM_ALGO_RD : (nbytes <= (256u << 10) ? TDM_ALGO_RHD : TDM_ALGO_RING);
  }
  if (!tdm__algo_applies(c, TDM_COLL_ALLREDUCE, algo)) return not_applicable(c, algo);
  announce(c, algo);
  tdm_status st;
  if (algo == TDM_ALGO_SHM) { /* reads sendbuf and writes recvbuf itself: no extra copy */
    st = tdm__allreduce_shm(c, sendbuf, recvbuf, count, dt, op);
    if (st == TDM_OK && op == TDM_AVG) tdm__scale_avg(recvbuf, count, dt, c->size);
    return st;
  }
  if (sendbuf != recvbuf && count) memcpy(recvbuf, sendbuf, nbytes);
  switch (algo) {
  case TDM_ALGO_RING: st = tdm__allreduce_ring(c, recvbuf, count, dt, op); break;
  case TDM_ALGO_DIRECT: st = tdm__allreduce_direct(c, recvbuf, count, dt, op); break;
  case TDM_ALGO_RD: st = tdm__allreduce_rd(c, recvbuf, count, dt, op); break;
  case TDM_ALGO_RHD: st = tdm__allreduce_rhd(c, recvbuf, count, dt, op); break;
  default: st = tdm__allreduce_tree(c, recvbuf, count, dt, op); break;
  }
  if (st == TDM_OK && op == TDM_AVG) tdm__scale_avg(recvbuf, count, dt, c->size);
  return st;
}

tdm_status tdm_comm_broadcast(tdm_comm_t c, void *buf, size_t count, tdm_dtype dt, int root, tdm_algo algo) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_BROADCAST, count, dt, TDM_SUM, root));
  if (count && !buf) return null_buf(c, "buf");
  size_t nbytes = count * tdm_dtype_size(dt);
  algo = tdm__algo_pick(c, TDM_COLL_BROADCAST, algo);
  if (algo == TDM_ALGO_AUTO) algo = (nbytes >= (4u << 20) && c->size > 2) ? TDM_ALGO_CHAIN : TDM_ALGO_TREE;
  if (!tdm__algo_applies(c, TDM_COLL_BROADCAST, algo)) return not_applicable(c, algo);
  announce(c, algo);
  if (c->size == 1) return TDM_OK;
  TDM__TRY(agree(c));
  if (algo == TDM_ALGO_TREE) return tdm__bcast_binomial(c, buf, nbytes, root);
  return tdm__bcast_chain(c, buf, nbytes, root);
}

tdm_status tdm_comm_reduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt, tdm_redop op,
                           int root, tdm_algo algo) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_REDUCE, count, dt, op, root));
  if (count && (!sendbuf || (c->rank == root && !recvbuf))) return null_buf(c, "a buffer");
  algo = tdm__algo_pick(c, TDM_COLL_REDUCE, algo);
  if (!tdm__algo_applies(c, TDM_COLL_REDUCE, algo)) return not_applicable(c, algo);
  announce(c, algo);
  if (c->size > 1) TDM__TRY(agree(c));
  size_t nbytes = count * tdm_dtype_size(dt);
  /* the root works in recvbuf; the others in a private copy of their input */
  void *work = recvbuf;
  if (c->rank != root) {
    work = tdm__aligned_alloc_cat(nbytes + 64, TDM_MEM_COMM); /* the scratch serves the algorithm itself */
    if (!work) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "reduce: out of memory");
  }
  if (count && work != sendbuf) memcpy(work, sendbuf, nbytes);
  tdm_status st = tdm__reduce_binomial(c, work, count, dt, op, root);
  if (c->rank != root) tdm__free(work);
  if (st == TDM_OK && op == TDM_AVG && c->rank == root) tdm__scale_avg(recvbuf, count, dt, c->size);
  return st;
}

/* ---- blocks: reduce-scatter and all-gather -------------------------------------------------- */
void tdm__blocks(size_t count, int p, size_t *cnt, size_t *off) {
  for (int i = 0; i < p; i++) tdm_comm_block(count, p, i, &off[i], &cnt[i]);
}

void tdm_comm_block(size_t count, int size, int r, size_t *offset, size_t *len) {
  size_t base = count / (size_t)size, extra = count % (size_t)size, ur = (size_t)r;
  *offset = ur * base + (ur < extra ? ur : extra);
  *len = base + (ur < extra);
}

/* The partition of a call: the caller's parts (v forms), or tdm__blocks. Checks that the parts
 * add up to count. */
static tdm_status parts_of(struct tdm_comm *c, const char *what, size_t count, const size_t *parts, size_t *cnt,
                           size_t *off) {
  if (!parts) {
    tdm__blocks(count, c->size, cnt, off);
    return TDM_OK;
  }
  size_t at = 0;
  for (int q = 0; q < c->size; q++) {
    if (parts[q] > count - at)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the parts of ranks 0..%d hold more than the %zu elements given", what,
                            q, count);
    cnt[q] = parts[q], off[q] = at, at += parts[q];
  }
  if (at != count)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the parts hold %zu elements; the buffer %zu", what, at, count);
  return TDM_OK;
}

/* The v forms carry a hash of their partition in the call's root field (unused by these
 * collectives), so ranks that split one buffer differently fail with a mismatch instead of
 * exchanging the wrong parts. */
static int32_t parts_hash(const size_t *parts, int P) {
  uint64_t h = 0x9a27;
  for (int q = 0; q < P; q++) h = tdm_hash64(h, parts[q]);
  return (int32_t)(h & 0x3fffffff) + 1; /* positive, never 0 (the plain forms') */
}

/* The reduce-scatter of count elements split by tdm__blocks, or by parts; the identity's count
 * is the whole buffer, so the plain form (equal blocks) and the blocks form of one buffer are the
 * same call. */
static tdm_status reduce_scatter(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                 tdm_dtype dt, tdm_redop op, tdm_algo algo) {
  TDM__TRY(wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "reduce-scatter: communicator is NULL");
  size_t cnt[c->size], off[c->size];
  TDM__TRY(parts_of(c, "reduce-scatter", count, parts, cnt, off));
  TDM__TRY(begin(c, TDM_COLL_REDUCE_SCATTER, count, dt, op, 0));
  if (parts) c->cur.root = parts_hash(parts, c->size);
  size_t es = tdm_dtype_size(dt), lo = off[c->rank], len = cnt[c->rank];
  if (count && (!sendbuf || (len && !recvbuf))) return null_buf(c, "a buffer");
  algo = tdm__algo_pick(c, TDM_COLL_REDUCE_SCATTER, algo);
  if (algo == TDM_ALGO_AUTO)
    algo = tdm__shm_usable(c) ? TDM_ALGO_SHM
                              : (!parts && tdm__pow2(c->size) && count * es <= (1u << 20) ? TDM_ALGO_RHD : TDM_ALGO_RING);
  if (!tdm__algo_applies(c, TDM_COLL_REDUCE_SCATTER, algo) || (parts && algo == TDM_ALGO_RHD)) return not_applicable(c, algo);
  announce(c, algo);
  tdm_status st;
  if (algo == TDM_ALGO_SHM) {
    st = tdm__reduce_scatter_shm(c, sendbuf, recvbuf, count, cnt, off, dt, op);
  } else if (algo == TDM_ALGO_DIRECT) {
    st = tdm__reduce_scatter_direct(c, sendbuf, recvbuf, cnt, off, dt, op);
  } else {
    char *work = tdm__aligned_alloc_cat(count * es + 64, TDM_MEM_COMM); /* the algorithm uses the scratch itself */
    if (!work) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "reduce-scatter: out of memory");
    if (count) memcpy(work, sendbuf, count * es);
    st = algo == TDM_ALGO_RING ? tdm__reduce_scatter_ring(c, work, cnt, off, dt, op)
                               : tdm__reduce_scatter_rhd(c, work, count, dt, op);
    if (st == TDM_OK && len) memcpy(recvbuf, work + lo * es, len * es);
    tdm__free(work);
  }
  if (st == TDM_OK && op == TDM_AVG) tdm__scale_avg(recvbuf, len, dt, c->size);
  return st;
}

tdm_status tdm_comm_reduce_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt,
                                   tdm_redop op, tdm_algo algo) {
  if (c && recvcount > ((size_t)1 << 40) / (size_t)c->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "reduce-scatter: count %zu is implausibly large", recvcount);
  return reduce_scatter(c, sendbuf, recvbuf, c ? recvcount * (size_t)c->size : 0, NULL, dt, op, algo);
}

tdm_status tdm_comm_reduce_scatter_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                          tdm_redop op, tdm_algo algo) {
  return reduce_scatter(c, sendbuf, recvbuf, count, NULL, dt, op, algo);
}

tdm_status tdm_comm_reduce_scatter_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                     tdm_dtype dt, tdm_redop op, tdm_algo algo) {
  if (!parts) return tdm__set_error(TDM_ERR_INVALID_ARG, "reduce-scatter: parts is NULL");
  return reduce_scatter(c, sendbuf, recvbuf, count, parts, dt, op, algo);
}

static tdm_status allgather(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                            tdm_dtype dt, tdm_algo algo) {
  TDM__TRY(wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "all-gather: communicator is NULL");
  size_t cnt[c->size], off[c->size];
  TDM__TRY(parts_of(c, "all-gather", count, parts, cnt, off));
  TDM__TRY(begin(c, TDM_COLL_ALLGATHER, count, dt, TDM_SUM, 0));
  if (parts) c->cur.root = parts_hash(parts, c->size);
  size_t es = tdm_dtype_size(dt), lo = off[c->rank], len = cnt[c->rank];
  if (count && (!recvbuf || (len && !sendbuf))) return null_buf(c, "a buffer");
  algo = tdm__algo_pick(c, TDM_COLL_ALLGATHER, algo);
  if (algo == TDM_ALGO_AUTO)
    algo = tdm__shm_usable(c) ? TDM_ALGO_SHM
                              : (!parts && tdm__pow2(c->size) && count * es <= (1u << 20) ? TDM_ALGO_RD : TDM_ALGO_RING);
  if (!tdm__algo_applies(c, TDM_COLL_ALLGATHER, algo) || (parts && algo == TDM_ALGO_RD)) return not_applicable(c, algo);
  announce(c, algo);
  if (algo == TDM_ALGO_SHM) return tdm__allgather_shm(c, sendbuf, recvbuf, count, cnt, off, dt);
  if (algo == TDM_ALGO_DIRECT) return tdm__allgather_direct(c, sendbuf, recvbuf, cnt, off, dt);
  char *mine = (char *)recvbuf + lo * es;
  if (len && mine != sendbuf) memcpy(mine, sendbuf, len * es);
  if (algo == TDM_ALGO_RD) return tdm__allgather_rd(c, recvbuf, count, dt);
  return tdm__allgather_ring(c, recvbuf, cnt, off, dt);
}

tdm_status tdm_comm_allgather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt,
                              tdm_algo algo) {
  if (c && sendcount > ((size_t)1 << 40) / (size_t)c->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "all-gather: count %zu is implausibly large", sendcount);
  return allgather(c, sendbuf, recvbuf, c ? sendcount * (size_t)c->size : 0, NULL, dt, algo);
}

tdm_status tdm_comm_allgather_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                     tdm_algo algo) {
  return allgather(c, sendbuf, recvbuf, count, NULL, dt, algo);
}

tdm_status tdm_comm_allgather_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                tdm_dtype dt, tdm_algo algo) {
  if (!parts) return tdm__set_error(TDM_ERR_INVALID_ARG, "all-gather: parts is NULL");
  return allgather(c, sendbuf, recvbuf, count, parts, dt, algo);
}

tdm_algo tdm_comm_rank_order_algo(tdm_comm_t c) { return tdm__shm_usable(c) ? TDM_ALGO_SHM : TDM_ALGO_DIRECT; }

tdm_status tdm_comm_gather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt, int root) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_GATHER, sendcount, dt, TDM_SUM, root));
  if (sendcount && (!sendbuf || (c->rank == root && !recvbuf))) return null_buf(c, "a buffer");
  announce(c, TDM_ALGO_DIRECT);
  if (c->size > 1) TDM__TRY(agree(c));
  size_t block = sendcount * tdm_dtype_size(dt);
  if (c->rank != root) return tdm__send(c, root, sendbuf, block);
  char *out = recvbuf;
  if (block && out + (size_t)root * block != sendbuf) memcpy(out + (size_t)root * block, sendbuf, block);
  tdm__xfer x[c->size];
  int n = 0;
  for (int i = 0; i < c->size; i++)
    if (i != root) x[n++] = (tdm__xfer){.peer = i, .is_send = 0, .buf = out + (size_t)i * block, .nbytes = block};
  return n ? tdm__exchange(c, x, n) : TDM_OK;
}

tdm_status tdm_comm_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt, int root) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_SCATTER, recvcount, dt, TDM_SUM, root));
  if (recvcount && (!recvbuf || (c->rank == root && !sendbuf))) return null_buf(c, "a buffer");
  announce(c, TDM_ALGO_DIRECT);
  if (c->size > 1) TDM__TRY(agree(c));
  size_t block = recvcount * tdm_dtype_size(dt);
  if (c->rank != root) return tdm__recv(c, root, recvbuf, block);
  const char *in = sendbuf;
  if (block && in + (size_t)root * block != recvbuf) memcpy(recvbuf, in + (size_t)root * block, block);
  tdm__xfer x[c->size];
  int n = 0;
  for (int i = 0; i < c->size; i++)
    if (i != root) x[n++] = (tdm__xfer){.peer = i, .is_send = 1, .buf = (void *)(in + (size_t)i * block), .nbytes = block};
  return n ? tdm__exchange(c, x, n) : TDM_OK;
}

tdm_status tdm_comm_alltoall(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_ALLTOALL, count, dt, TDM_SUM, 0));
  if (count && (!sendbuf || !recvbuf)) return null_buf(c, "a buffer");
  if (count && sendbuf == recvbuf)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "all-to-all: sendbuf and recvbuf must differ");
  announce(c, TDM_ALGO_DIRECT);
  size_t block = count * tdm_dtype_size(dt);
  const char *in = sendbuf;
  char *out = recvbuf;
  if (block) memcpy(out + (size_t)c->rank * block, in + (size_t)c->rank * block, block);
  /* every pair at once: the transport progresses all 2(P-1) transfers together */
  tdm__xfer x[2 * c->size];
  int n = 0;
  for (int k = 1; k < c->size; k++) {
    int to = (c->rank + k) % c->size, from = (c->rank - k + c->size) % c->size;
    x[n++] = (tdm__xfer){.peer = to, .is_send = 1, .buf = (void *)(in + (size_t)to * block), .nbytes = block};
    x[n++] = (tdm__xfer){.peer = from, .is_send = 0, .buf = out + (size_t)from * block, .nbytes = block};
  }
  return n ? tdm__exchange(c, x, n) : TDM_OK;
}

tdm_status tdm_comm_barrier(tdm_comm_t c) {
  TDM__TRY(wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_BARRIER, 0, TDM_U8, TDM_SUM, 0));
  announce(c, TDM_ALGO_AUTO);
  return agree(c);
}

/* ---- point to point -------------------------------------------------------------------------- */
static tdm_status p2p(struct tdm_comm *c, int peer, int tag, void *buf, size_t nbytes, int is_send) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "send/recv: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: peer %d is not another rank of this communicator (size %d, rank %d)",
                          is_send ? "send" : "recv", peer, c->size, c->rank);
  if (tag < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: tag %d < 0", is_send ? "send" : "recv", tag);
  if (nbytes && !buf) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: buffer is NULL", is_send ? "send" : "recv");
  c->cur = (tdm__call){TDM_COLL_P2P, 0, 0, 0, nbytes, (uint64_t)tag};
  tdm__xfer x = {.peer = peer, .is_send = is_send, .buf = buf, .nbytes = nbytes};
  return tdm__exchange(c, &x, 1);
}

tdm_status tdm_comm_send(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes) {
  TDM__TRY(wait_queue_idle(c));
  return p2p(c, peer, tag, (void *)buf, nbytes, 1);
}
tdm_status tdm_comm_recv(tdm_comm_t c, int peer, int tag, void *buf, size_t nbytes) {
  TDM__TRY(wait_queue_idle(c));
  return p2p(c, peer, tag, buf, nbytes, 0);
}

tdm_status tdm_comm_sendrecv(tdm_comm_t c, int to, const void *sendbuf, size_t sendbytes, int from, void *recvbuf,
                             size_t recvbytes, int tag) {
  TDM__TRY(wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  if (to < 0 || to >= c->size || to == c->rank || from < 0 || from >= c->size || from == c->rank || tag < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: to %d, from %d, tag %d; expected other ranks of %d and tag >= 0", to,
                          from, tag, c->size);
  if ((sendbytes && !sendbuf) || (recvbytes && !recvbuf)) return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: NULL buffer");
  /* each direction carries its sender's size: the send's header is what the peer expects */
  tdm__xfer x[2] = {{.peer = to, .is_send = 1, .buf = (void *)sendbuf, .nbytes = sendbytes},
                    {.peer = from, .is_send = 0, .buf = recvbuf, .nbytes = recvbytes}};
  for (int i = 0; i < 2; i++) {
    tdm__hdr h = {TDM_MSG_MAGIC, TDM_COLL_P2P, (uint64_t)tag, 0, 0, 0, c->comm_id, x[i].nbytes, x[i].nbytes};
    x[i].hdr = h;
  }
  c->cur = (tdm__call){TDM_COLL_P2P, 0, 0, 0, sendbytes, (uint64_t)tag};
  return run_xfers(c, x, 2);
}

/* ---- split ---------------------------------------------------------------------------------- */
tdm_status tdm_comm_split(tdm_comm_t c, int color, int key, tdm_comm_t *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "split: out is NULL");
  *out = NULL;
  int32_t mine[2] = {color, key}, *all = tdm__malloc(sizeof(int32_t) * 2 * (size_t)c->size);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "split: out of memory");
  tdm_status st = tdm_comm_allgather(c, mine, all, 2, TDM_I32, TDM_ALGO_RING);
  if (st != TDM_OK || color < 0) {
    tdm__free(all);
    return st;
  }
  int n = 0, me = 0, *members = tdm__malloc(sizeof(int) * (size_t)c->size);
  if (!members) {
    tdm__free(all);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "split: out of memory");
  }
  for (int i = 0; i < c->size; i++)
    if (all[2 * i] == color) members[n++] = i;
  for (int i = 1; i < n; i++) /* order by (key, old rank): insertion sort, groups are small */
    for (int j = i; j > 0 && (all[2 * members[j - 1] + 1] > all[2 * members[j] + 1]); j--) {
      int t = members[j];
      members[j] = members[j - 1];
      members[j - 1] = t;
    }
  for (int i = 0; i < n; i++)
    if (members[i] == c->rank) me = i;
  tdm__free(all);
  struct tdm_comm *s = tdm__calloc(1, sizeof *s);
  if (!s) {
    tdm__free(members);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "split: out of memory");
  }
  /* the child speaks through the parent's transport, with its own id in every header */
  for (int i = 0; i < n; i++) members[i] = c->map ? c->map[members[i]] : members[i];
  s->rank = me;
  s->size = n;
  s->kind = c->kind;
  s->tr = c->tr;
  s->owns_transport = 0;
  s->map = s->map_owned = members;
  s->comm_id = (uint32_t)tdm_hash64(c->comm_id * 1000003ull + c->seq, (uint64_t)(uint32_t)color) | 2u;
  s->timeout_s = c->timeout_s;
  s->local_size = c->local_size;
  memcpy(s->algo_for, c->algo_for, sizeof s->algo_for);
  s->algo_plain = c->algo_plain;
  if (c->emu_link_free) { /* the child's links are its parent's, emulated alike */
    s->emu_latency_s = c->emu_latency_s;
    s->emu_bytes_per_s = c->emu_bytes_per_s;
    s->emu_link_free = tdm__calloc((size_t)n, sizeof(double));
  }
  pthread_mutex_init(&s->q_mu, NULL);
  pthread_cond_init(&s->q_cv, NULL);
  *out = s;
  return TDM_OK;
}

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
  case W_SEND: return p2p(c, w->peer_or_root, w->tag, (void *)w->sbuf, w->count, 1);
  case W_RECV: return p2p(c, w->peer_or_root, w->tag, w->rbuf, w->count, 0);
  }
  return TDM_ERR_INTERNAL;
}

static _Thread_local int on_progress_thread;

static void *progress_main(void *arg) {
  struct tdm_comm *c = arg;
  on_progress_thread = 1;
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
    pthread_mutex_lock(&c->q_mu);
    w->st = st;
    if (st != TDM_OK) snprintf(w->error, sizeof w->error, "%s", tdm_last_error());
    w->done = 1;
    c->q_busy = 0;
    pthread_cond_broadcast(&c->q_cv);
  }
  pthread_mutex_unlock(&c->q_mu);
  return NULL;
}

/* Blocking calls keep their place in line behind queued non-blocking ones. */
static tdm_status wait_queue_idle(struct tdm_comm *c) {
  if (!c || !c->q_started || on_progress_thread) return TDM_OK;
  pthread_mutex_lock(&c->q_mu);
  while (c->q_head || c->q_busy) pthread_cond_wait(&c->q_cv, &c->q_mu);
  pthread_mutex_unlock(&c->q_mu);
  return TDM_OK;
}

static tdm_status enqueue(struct tdm_comm *c, struct tdm_work *tmpl, tdm_work_t *out) {
  if (!c || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "non-blocking call: NULL argument");
  struct tdm_work *w = tdm__malloc_cat(sizeof *w, TDM_MEM_COMM);
  if (!w) return tdm__set_error(TDM_ERR_NO_MEMORY, "non-blocking call: out of memory");
  *w = *tmpl;
  w->c = c;
  w->next = NULL;
  w->done = 0;
  pthread_mutex_lock(&c->q_mu);
  if (!c->q_started) {
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
  pthread_mutex_lock(&w->c->q_mu);
  int d = w->done;
  pthread_mutex_unlock(&w->c->q_mu);
  return d;
}

tdm_status tdm_work_wait(tdm_work_t w) {
  struct tdm_comm *c = w->c;
  pthread_mutex_lock(&c->q_mu);
  while (!w->done) pthread_cond_wait(&c->q_cv, &c->q_mu); /* the call itself is bounded by the timeout */
  for (struct tdm_work **p = &c->handles; *p; p = &(*p)->all_next)
    if (*p == w) {
      *p = w->all_next;
      break;
    }
  pthread_mutex_unlock(&c->q_mu);
  tdm_status st = w->st;
  if (st != TDM_OK) tdm__set_error(st, "%s", w->error);
  tdm__free(w);
  return st;
}
