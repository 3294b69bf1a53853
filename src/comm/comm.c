/* The communicator: creation (transports from a table), destruction, failure, the identity of
 * calls and their header checks, and waiting. Point to point: p2p.c; collectives: collective.c
 * (algorithms in algos.c); non-blocking calls: progress.c; split.c; configuration: config.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>

#include "comm/comm_impl.h"

/* ---- failure ------------------------------------------------------------------------------ */
tdm_status tdm__comm_fail(struct tdm_comm *c, tdm_status st, const char *fmt, ...) {
  if (!atomic_exchange(&c->fail_claimed, 1)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    c->fail_status = st;
    /* a failure relayed from a peer (this thread's error) stays relayed when the text wraps it */
    tdm__set_error(st, "%s", c->error);
    c->fail_origin = tdm_last_error_origin();
    atomic_store_explicit(&c->failed, 1, memory_order_release); /* readers of the flag see them whole */
  } else {
    while (!atomic_load_explicit(&c->failed, memory_order_acquire)) sched_yield(); /* another thread is writing them */
  }
  return tdm__comm_error(c);
}

tdm_status tdm__comm_error(struct tdm_comm *c) {
  return tdm__error_from(c->fail_origin, tdm__set_error(c->fail_status, "%s", c->error));
}

tdm_status tdm_comm_status(tdm_comm_t c) {
  TDM__NONNULL(c, TDM_ERR_INVALID_ARG, "tdm_comm_status: the communicator is NULL");
  return atomic_load(&c->failed) ? c->fail_status : TDM_OK;
}
const char *tdm_comm_last_error(tdm_comm_t c) { return c ? c->error : "tdm_comm_last_error: the communicator is NULL"; }
int tdm_comm_rank(tdm_comm_t c) {
  TDM__NONNULL(c, -1, "tdm_comm_rank: the communicator is NULL");
  return c->rank;
}
int tdm_comm_size(tdm_comm_t c) {
  TDM__NONNULL(c, 0, "tdm_comm_size: the communicator is NULL");
  return c->size;
}
tdm_transport_kind tdm_comm_transport(tdm_comm_t c) {
  TDM__NONNULL(c, TDM_TRANSPORT_COUNT, "tdm_comm_transport: the communicator is NULL");
  return c->kind;
}
uint64_t tdm_comm_bytes_sent(tdm_comm_t c) { return c ? atomic_load_explicit(&c->bytes_sent, memory_order_relaxed) : 0; }
void tdm_comm_set_timeout(tdm_comm_t c, double s) {
  TDM__NONNULL(c, , "tdm_comm_set_timeout: the communicator is NULL");
  if (s > 0) c->timeout_s = s;
}

const char *tdm__call_str(const tdm__call *k, char *buf, size_t n) {
  if (k->kind == TDM_COLL_P2P) snprintf(buf, n, "send/recv (tag %llu, %llu bytes)", (unsigned long long)k->seq, (unsigned long long)k->count);
  else if (k->kind == TDM_COLL_TAGGED)
    snprintf(buf, n, "tagged message (tag %llu, %llu bytes)", (unsigned long long)k->seq, (unsigned long long)k->count);
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


/* ---- create / destroy ---------------------------------------------------------------------- */
static tdm_status comm_create(tdm_comm_t *out, const tdm_comm_config *cfg, struct tdm_comm *via);

/* The transports, by kind: adding one is its file in transport/ and a row here. */
static tdm__transport_create_fn *const transports[TDM_TRANSPORT_COUNT] = {
    [TDM_TRANSPORT_THREAD] = tdm__thread_transport_create,
    [TDM_TRANSPORT_SHM] = tdm__shm_transport_create,
    [TDM_TRANSPORT_TCP] = tdm__tcp_transport_create,
    [TDM_TRANSPORT_MPI] = tdm__mpi_transport_create,
};

/* Everything a communicator allocates, its transport's buffers and the store included, counts as
 * communication memory (tandem/core.h). */
tdm_status tdm_comm_create(tdm_comm_t *out, const tdm_comm_config *cfg) {
  tdm_mem_category was = tdm__mem_scope(TDM_MEM_COMM);
  tdm_status st = comm_create(out, cfg, NULL);
  tdm__mem_scope(was);
  return st;
}

/* A node's group of a job that spans nodes: via's ranks over shared memory, the segment's name
 * broadcast over via; no emulated network (the links inside a node are not the slow ones); via's
 * TANDEM_ALGO choices (where they apply). */
tdm_status tdm__comm_create_node(struct tdm_comm *via, tdm_comm_t *out) {
  tdm_comm_config cfg = {.rank = via->rank, .size = via->size, .transport = TDM_TRANSPORT_SHM, .timeout_s = via->timeout_s};
  tdm_mem_category was = tdm__mem_scope(TDM_MEM_COMM);
  tdm_status st = comm_create(out, &cfg, via);
  tdm__mem_scope(was);
  return st;
}

/* A tcp rank holds a socket per peer, rank 0 the store's too, besides its files: a soft limit below
 * that is raised to the hard one (out of descriptors rank 0 dropped its peers' connections, and they
 * timed out blaming a handshake). Below the hard limit too: an error naming both. */
static tdm_status enough_descriptors(int rank, int size) {
  struct rlimit rl;
  rlim_t need = (rlim_t)size * (rank == 0 ? 3 : 1) + 32;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return TDM_OK;
  rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need * 4 ? need * 4 : rl.rlim_max;
  if (want >= need) {
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0) return TDM_OK;
  }
  return tdm__set_error(TDM_ERR_SYSTEM, "tcp: rank %d of %d needs about %llu file descriptors (a socket per peer%s); ulimit -n is %llu "
                        "and the hard limit %llu: raise it (ulimit -n %llu), or use the shm transport on one node", rank, size,
                        (unsigned long long)need, rank == 0 ? ", and the store's" : "", (unsigned long long)rl.rlim_cur,
                        (unsigned long long)rl.rlim_max, (unsigned long long)need);
}

static tdm_status comm_create(tdm_comm_t *out, const tdm_comm_config *cfg, struct tdm_comm *via) {
  if (!out || !cfg) return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: NULL argument");
  *out = NULL;
  if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: rank %d of world size %d; expected 0 <= rank < size",
                          cfg->rank, cfg->size);
  struct tdm_comm *c = tdm__calloc(1, sizeof *c);
  if (!c) return tdm__set_error(TDM_ERR_NO_MEMORY, "comm_create: out of memory");
  c->fail_origin = -1;
  c->rank = cfg->rank;
  c->size = cfg->size;
  c->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 300.0;
  tdm_status est = cfg->timeout_s > 0 ? TDM_OK : tdm__env_timeout(&c->timeout_s);
  if (est == TDM_OK) est = tdm__env_local_size(&c->local_size);
  if (via) c->local_size = cfg->size;
  c->comm_id = via ? (via->comm_id ^ 0x5a5a0000u) | 1u : 1;
  c->owns_transport = 1;
  c->rdzv = via;
  const char *emu = via ? NULL : getenv("TANDEM_NET_EMULATE");
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
  tdm_status st = k == TDM_TRANSPORT_TCP ? enough_descriptors(cfg->rank, cfg->size) : TDM_OK;
  if (st == TDM_OK)
    st = (unsigned)k < TDM_TRANSPORT_COUNT && transports[k]
                      ? transports[k](&c->tr, c, cfg)
                      : tdm__set_error(TDM_ERR_NOT_SUPPORTED, "comm_create: transport %d is unknown; use thread, shm, tcp or mpi", (int)k);
  c->rdzv = NULL;
  if (st == TDM_OK && via) { /* its parent's choices, where they apply */
    memcpy(c->algo_for, via->algo_for, sizeof c->algo_for);
    c->algo_plain = via->algo_plain;
  } else if (st == TDM_OK) {
    for (int i = 0; i < TDM_COLL_KIND_COUNT; i++) c->algo_for[i] = TDM_ALGO_AUTO; /* until TANDEM_ALGO is read */
    /* before TANDEM_ALGO: it may name hier, which applies only once the nodes are known */
    if ((k == TDM_TRANSPORT_TCP || k == TDM_TRANSPORT_MPI) && cfg->size > 1 && (st = tdm__hier_setup(c)) != TDM_OK) {
      tdm__hier_destroy(c->hier);
      tdm__free(c->node_of);
      c->tr->ops->destroy(c->tr);
    } else if ((st = tdm__parse_algo_env(c, getenv("TANDEM_ALGO"))) != TDM_OK) {
      tdm__hier_destroy(c->hier);
      tdm__free(c->node_of);
      c->tr->ops->destroy(c->tr); /* every rank parses the same value: all fail alike */
      tdm__set_error(st, "environment: %s", tdm_last_error());
    }
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

void tdm_comm_abort_why(tdm_comm_t c, tdm_status st, const char *why) {
  if (!c) return;
  /* only a status of the enum, and an error: 77 would reach callers as no tdm_status at all */
  int known = 0;
  switch (st) {
#define TDM__KNOWN(name, value, text) case name:
    TDM_STATUS_LIST(TDM__KNOWN)
#undef TDM__KNOWN
    known = st != TDM_OK;
    break;
  default: break;
  }
  tdm__comm_fail(c, known ? st : TDM_ERR_REMOTE, "%s", why ? why : "aborted");
  c->tr->active = c; /* a child's abort closes its parent's links too: they are one transport */
  c->tr->ops->abort(c->tr, c->error);
}

void tdm_comm_destroy(tdm_comm_t c) {
  if (!c) return;
  tdm__progress_stop(c); /* and frees the handles abandoned on some error path */
  tdm__hier_destroy(c->hier); /* its communicators first: one speaks through c's transport */
  tdm__free(c->node_of);
  if (c->tr && c->owns_transport) {
    tdm__stash_free(c->tr);
    c->tr->ops->destroy(c->tr);
  }
  else if (c->tr && c->tr->active == c) c->tr->active = NULL; /* a sub-communicator goes */
  pthread_mutex_destroy(&c->q_mu);
  pthread_cond_destroy(&c->q_cv);
  tdm__free(c->map_owned);
  tdm__free(c->scratch);
  tdm__free(c->emu_link_free);
  tdm__free(c);
}
