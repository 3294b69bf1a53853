/* Point-to-point: the transfers every algorithm is made of (headers from the call in progress,
 * network emulation, rank mapping, the transport, and the abort that tells every peer why a call
 * failed), the communicator's scratch, and the public send / recv / sendrecv. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

void *tdm__comm_scratch(struct tdm_comm *c, size_t n) {
  if (n <= c->scratch_bytes) return c->scratch;
  tdm__free(c->scratch); /* first: the old contents are not kept, and both at once would double the peak */
  c->scratch = tdm__aligned_alloc_cat(n, TDM_MEM_COMM);
  c->scratch_bytes = c->scratch ? n : 0;
  return c->scratch;
}

/* Emulated network (between nodes when ranks span several, else between all ranks): each send
 * first waits for its link (serialised per peer at the emulated bandwidth), then for the latency. The wait happens before the real transfer, so the receiver
 * sees the data no earlier than a real link of that speed would deliver it. */
static tdm_status emulate(struct tdm_comm *c, const tdm__xfer *x, int n) {
  double now = tdm_time_now(), until = now;
  size_t longest = 0;
  for (int i = 0; i < n; i++) {
    if (!x[i].is_send) continue;
    if (c->node_of && c->node_of[x[i].peer] == c->node_of[c->rank]) continue; /* ranks span nodes: only links between them */
    double *free_at = &c->emu_link_free[x[i].peer];
    double start = *free_at > now ? *free_at : now;
    double wire = c->emu_bytes_per_s > 0 ? (double)(x[i].nbytes + sizeof(tdm__hdr)) / c->emu_bytes_per_s : 0;
    *free_at = start + wire;
    if (start + wire + c->emu_latency_s > until) until = start + wire + c->emu_latency_s, longest = x[i].nbytes;
  }
  double left = until - now;
  if (left > c->timeout_s) /* a sleep past the timeout would be a hang the timeout cannot end */
    return tdm__set_error(TDM_ERR_TIMEOUT,
                          "rank %d: sending %zu bytes over the emulated link (TANDEM_NET_EMULATE: %g s latency, %g bytes/s) "
                          "would take %.3g s, beyond the timeout of %g s (TANDEM_TIMEOUT)",
                          c->rank, longest, c->emu_latency_s, c->emu_bytes_per_s, left, c->timeout_s);
  if (left > 0) {
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
  }
  return TDM_OK;
}

/* Runs transfers whose headers are set: emulation, rank mapping, the transport, and on failure
 * the abort that tells every peer why. keep_peer: a failure the transport blames on the peer (its
 * connection closed or reset, its process gone, its abort) leaves the communicator as it is: the
 * caller drops that peer (tdm_comm_trecv_among_lossy). */
static tdm_status run_xfers_keep(struct tdm_comm *c, tdm__xfer *x, int n, int keep_peer);
static tdm_status run_xfers(struct tdm_comm *c, tdm__xfer *x, int n) { return run_xfers_keep(c, x, n, 0); }
static tdm_status run_xfers_keep(struct tdm_comm *c, tdm__xfer *x, int n, int keep_peer) {
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
  c->tr->active = c;
  tdm_status st = c->emu_link_free ? emulate(c, x, n) : TDM_OK;
  if (st != TDM_OK) { /* as a failed transfer: the peers hear why */
    tdm__comm_fail(c, st, "%s", tdm_last_error());
    c->tr->ops->abort(c->tr, c->error);
    return tdm__comm_error(c);
  }
  uint64_t sent = 0;
  for (int i = 0; i < n; i++) {
    x[i].done = 0;
    x[i].complete = 0;
    if (c->map) x[i].peer = c->map[x[i].peer];
    if (x[i].is_send) sent += x[i].nbytes; /* payload only: headers are not counted */
  }
  tdm__count_sent(c, sent);
  st = c->tr->ops->run(c->tr, x, n, tdm_time_now() + c->timeout_s);
  if (st != TDM_OK) {
    /* a header check that failed has failed the communicator already; what is left is the peer's */
    if (keep_peer && !atomic_load(&c->failed) && st != TDM_ERR_NO_MEMORY && st != TDM_ERR_SYSTEM) return st;
    /* c->error names the cause; tell the peers and close, so none of them waits for us */
    if (!atomic_load(&c->failed)) tdm__comm_fail(c, st, "%s", tdm_last_error());
    c->tr->ops->abort(c->tr, c->error);
    return tdm__comm_error(c);
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


/* ---- point to point -------------------------------------------------------------------------- */
tdm_status tdm__p2p(struct tdm_comm *c, int peer, int tag, void *buf, size_t nbytes, int is_send) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "send/recv: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
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
  TDM__TRY(tdm__wait_queue_idle(c));
  return tdm__p2p(c, peer, tag, (void *)buf, nbytes, 1);
}
tdm_status tdm_comm_recv(tdm_comm_t c, int peer, int tag, void *buf, size_t nbytes) {
  TDM__TRY(tdm__wait_queue_idle(c));
  return tdm__p2p(c, peer, tag, buf, nbytes, 0);
}

tdm_status tdm_comm_sendrecv(tdm_comm_t c, int to, const void *sendbuf, size_t sendbytes, int from, void *recvbuf,
                             size_t recvbytes, int tag) {
  TDM__TRY(tdm__wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
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


tdm_status tdm_comm_p2p_batch(tdm_comm_t c, const tdm_p2p_op *ops, int n) {
  TDM__TRY(tdm__wait_queue_idle(c));
  if (!c || n < 0 || (n && !ops)) return tdm__set_error(TDM_ERR_INVALID_ARG, "p2p batch: NULL communicator or %d operations", n);
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
  if (n == 0) return TDM_OK;
  tdm__xfer small[8], *x = n <= 8 ? small : tdm__calloc((size_t)n, sizeof *x);
  if (!x) return tdm__set_error(TDM_ERR_NO_MEMORY, "p2p batch: out of memory");
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    const tdm_p2p_op *o = &ops[i];
    if (o->peer < 0 || o->peer >= c->size || o->peer == c->rank || o->tag < 0 || (o->nbytes && !o->buf)) {
      if (x != small) tdm__free(x);
      return tdm__set_error(TDM_ERR_INVALID_ARG, "p2p batch: operation %d (%s peer %d, tag %d, %zu bytes%s); expected another "
                            "rank of %d and tag >= 0", i, o->is_send ? "send to" : "recv from", o->peer, o->tag, o->nbytes,
                            o->nbytes && !o->buf ? ", NULL buffer" : "", c->size);
    }
    /* each message carries its own tag and size: the receiver checks both */
    x[i] = (tdm__xfer){.peer = o->peer, .is_send = o->is_send != 0, .buf = o->buf, .nbytes = o->nbytes};
    x[i].hdr = (tdm__hdr){TDM_MSG_MAGIC, TDM_COLL_P2P, (uint64_t)o->tag, 0, 0, 0, c->comm_id, o->nbytes, o->nbytes};
    total += o->nbytes;
  }
  c->cur = (tdm__call){TDM_COLL_P2P, 0, 0, 0, total, (uint64_t)ops[0].tag};
  tdm_status st = run_xfers(c, x, n);
  if (x != small) tdm__free(x);
  return st;
}

/* ---- tagged messages ------------------------------------------------------------------------
 * A tagged message carries kind TDM_COLL_TAGGED, its tag and its communicator's id. Receives
 * match by (communicator, source, tag); whatever tagged message a receive meets that is not its
 * own goes to the transport's stash, in arrival order, for the receive that names it. So tagged
 * traffic never disturbs a collective (which reads past it) and never takes a collective's
 * message (a tagged receive that meets one fails with a mismatch naming both). */
static int tagged_match(const struct tdm_comm *c, const tdm__hdr *want, int src_tr, const tdm__hdr *h, int peer_tr) {
  return h->kind == TDM_COLL_TAGGED && h->comm_id == want->comm_id && h->seq == want->seq &&
         (src_tr < 0 || src_tr == peer_tr) && tdm__comm_rank_of(c, peer_tr) >= 0;
}

static tdm_status too_big(struct tdm_comm *c, int peer_tr, const tdm__hdr *got, size_t room) {
  return tdm__comm_fail(c, TDM_ERR_MISMATCH,
                        "rank %d sent a %llu-byte tagged message (tag %llu) where rank %d had room for %zu bytes",
                        tdm__comm_rank_of(c, peer_tr), (unsigned long long)got->nbytes, (unsigned long long)got->seq,
                        c->rank, room);
}

tdm_status tdm__xfer_header(struct tdm_comm *c, tdm__xfer *x) {
  const tdm__hdr *g = &x->got;
  if (g->magic != TDM_MSG_MAGIC || g->kind >= TDM_COLL_KIND_COUNT) return tdm__check_header(c, x->peer, &x->hdr, g);
  int want_tagged = x->hdr.kind == TDM_COLL_TAGGED;
  if (want_tagged && g->kind == TDM_COLL_TAGGED && g->comm_id == x->hdr.comm_id && g->seq == x->hdr.seq) {
    if (g->nbytes > x->nbytes) return too_big(c, x->peer, g, x->nbytes);
    x->nbytes = (size_t)g->nbytes; /* the message's size, at most the room */
    x->matched = 1;
    return TDM_OK;
  }
  if (g->kind == TDM_COLL_TAGGED) { /* someone else's: read it into the stash */
    if (g->nbytes > ((uint64_t)1 << 40))
      return tdm__comm_fail(c, TDM_ERR_REMOTE, "rank %d sent a corrupt tagged message (%llu bytes)",
                            tdm__comm_rank_of(c, x->peer), (unsigned long long)g->nbytes);
    tdm__stashed *m = tdm__malloc_cat(sizeof *m + g->nbytes, TDM_MEM_COMM);
    if (!m) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "out of memory for a %llu-byte tagged message read ahead",
                                  (unsigned long long)g->nbytes);
    m->next = NULL;
    m->peer = x->peer;
    m->hdr = *g;
    x->user_buf = x->buf;
    x->user_nbytes = x->nbytes;
    x->buf = m->data;
    x->nbytes = (size_t)g->nbytes;
    x->stashing = 1;
    return TDM_OK;
  }
  if (want_tagged) {
    char a[160], b[160];
    tdm__call gc = {g->kind, g->dtype, g->op, g->root, g->count, g->seq};
    return tdm__comm_fail(c, TDM_ERR_MISMATCH, "rank %d sent %s where rank %d waits for a %s",
                          tdm__comm_rank_of(c, x->peer), tdm__call_str(&gc, a, sizeof a), c->rank,
                          tdm__call_str(&c->cur, b, sizeof b));
  }
  return tdm__check_header(c, x->peer, &x->hdr, g);
}

int tdm__xfer_done(tdm__transport *t, tdm__xfer *x) {
  if (x->is_send || !x->stashing) return 1;
  tdm__stashed *m = (tdm__stashed *)((char *)x->buf - offsetof(tdm__stashed, data));
  if (t->stash_tail) t->stash_tail->next = m;
  else t->stash = m;
  t->stash_tail = m;
  x->buf = x->user_buf;
  x->nbytes = x->user_nbytes;
  x->stashing = 0;
  x->done = 0;
  return x->probe; /* a probe ends here, unmatched; any other receive reads on */
}

void tdm__stash_free(tdm__transport *t) {
  for (tdm__stashed *m = t->stash, *n; m; m = n) {
    n = m->next;
    tdm__free(m);
  }
  t->stash = t->stash_tail = NULL;
}

/* Takes the first stashed message that matches, if any: copies it out and frees it. */
static int unstash(struct tdm_comm *c, const tdm__hdr *want, int src_tr, void *buf, size_t room, int *from, size_t *got,
                   tdm_status *st) {
  tdm__transport *t = c->tr;
  for (tdm__stashed **p = &t->stash, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
    tdm__stashed *m = *p;
    if (!tagged_match(c, want, src_tr, &m->hdr, m->peer)) continue;
    if (m->hdr.nbytes > room) {
      *st = too_big(c, m->peer, &m->hdr, room);
      return 1;
    }
    *p = m->next;
    if (t->stash_tail == m) t->stash_tail = prev;
    if (m->hdr.nbytes) memcpy(buf, m->data, (size_t)m->hdr.nbytes);
    *from = tdm__comm_rank_of(c, m->peer);
    *got = (size_t)m->hdr.nbytes;
    tdm__free(m);
    *st = TDM_OK;
    return 1;
  }
  return 0;
}

static tdm_status tagged_args(struct tdm_comm *c, const char *what, int peer, int any_ok, int tag, const void *buf,
                              size_t n) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: communicator is NULL", what);
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
  if (!c->tr->ops->pending)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "%s: the %s transport has no tagged messages", what,
                          tdm_transport_name(c->kind));
  if (!(any_ok && peer == TDM_ANY_SOURCE) && (peer < 0 || peer >= c->size || peer == c->rank))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: peer %d is not another rank of this communicator (size %d, rank %d)%s",
                          what, peer, c->size, c->rank, any_ok ? " nor TDM_ANY_SOURCE" : "");
  if (tag < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: tag %d < 0", what, tag);
  if (n && !buf) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: buffer is NULL with %zu bytes", what, n);
  return TDM_OK;
}

tdm_status tdm_comm_tsend(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(tagged_args(c, "tagged send", peer, 0, tag, buf, nbytes));
  c->cur = (tdm__call){TDM_COLL_TAGGED, 0, 0, 0, nbytes, (uint64_t)tag};
  tdm__xfer x = {.peer = peer, .is_send = 1, .buf = (void *)buf, .nbytes = nbytes};
  x.hdr = (tdm__hdr){TDM_MSG_MAGIC, TDM_COLL_TAGGED, (uint64_t)tag, 0, 0, 0, c->comm_id, nbytes, nbytes};
  return run_xfers(c, &x, 1);
}

/* source: a rank, or TDM_ANY_SOURCE with the candidates in among (NULL: every other rank). */
static tdm_status trecv(struct tdm_comm *c, int source, const int *among, int n_among, int tag, void *buf, size_t capacity,
                        int *from, size_t *nbytes, int *lost) {
  int who = -1;
  size_t got = 0;
  tdm_status st = TDM_OK;
  c->cur = (tdm__call){TDM_COLL_TAGGED, 0, 0, source, capacity, (uint64_t)tag};
  tdm__hdr want = {TDM_MSG_MAGIC, TDM_COLL_TAGGED, (uint64_t)tag, 0, 0, 0, c->comm_id, capacity, capacity};
  int src_tr = source == TDM_ANY_SOURCE ? -1 : (c->map ? c->map[source] : source);
  if (among) { /* the first stashed message from one of them */
    for (int i = 0; i < n_among; i++)
      if (unstash(c, &want, c->map ? c->map[among[i]] : among[i], buf, capacity, &who, &got, &st)) goto out;
  } else if (unstash(c, &want, src_tr, buf, capacity, &who, &got, &st)) {
    goto out;
  }
  if (source != TDM_ANY_SOURCE) { /* from one rank: the transport waits (and notices its death) */
    tdm__xfer x = {.peer = source, .is_send = 0, .buf = buf, .nbytes = capacity, .hdr = want};
    st = run_xfers(c, &x, 1);
    who = source, got = x.nbytes;
    goto out;
  }
  /* any source: look at every peer in turn (starting after the last one served, so a busy rank
   * cannot starve the others) and read one message from the first that has sent something */
  double deadline = tdm_time_now() + c->timeout_s;
  tdm__backoff_t b = {0};
  for (int slow = 0;;) {
    int n = among ? n_among : c->size;
    for (int k = 1; k <= n; k++) {
      int q = among ? among[(c->last_any + k) % n] : (c->last_any + k) % n;
      if (q == c->rank || !c->tr->ops->pending(c->tr, c->map ? c->map[q] : q, slow)) continue;
      tdm__xfer x = {.peer = q, .is_send = 0, .buf = buf, .nbytes = capacity, .hdr = want, .probe = 1};
      if ((st = run_xfers_keep(c, &x, 1, lost != NULL)) != TDM_OK) {
        if (lost && !atomic_load(&c->failed)) *lost = q; /* its stream is in an unknown state: never read again */
        goto out;
      }
      if (x.matched) {
        c->last_any = among ? (c->last_any + k) % n : q;
        who = q, got = x.nbytes;
        goto out;
      }
      b = (tdm__backoff_t){0}; /* it went to the stash: look again */
    }
    slow = tdm__backoff(&b);
    if (slow && tdm_time_now() > deadline) {
      char w[160];
      st = tdm__comm_fail(c, TDM_ERR_TIMEOUT, "rank %d: %s from any rank timed out after %.0f s; no rank sent one",
                          c->rank, tdm__call_str(&c->cur, w, sizeof w), c->timeout_s);
      c->tr->active = c;
      c->tr->ops->abort(c->tr, c->error);
      goto out;
    }
  }
out:
  if (from) *from = st == TDM_OK ? who : -1;
  if (nbytes) *nbytes = st == TDM_OK ? got : 0;
  return st;
}

tdm_status tdm_comm_trecv(tdm_comm_t c, int source, int tag, void *buf, size_t capacity, int *from, size_t *nbytes) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(tagged_args(c, "tagged receive", source, 1, tag, buf, capacity));
  return trecv(c, source, NULL, 0, tag, buf, capacity, from, nbytes, NULL);
}

/* Both any-source receives among a set of ranks; lost (may be NULL) asks for a dead peer to be
 * reported rather than failed. */
static tdm_status trecv_among(tdm_comm_t c, const int *ranks, int n, int tag, void *buf, size_t capacity, int *from,
                              size_t *nbytes, int *lost) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(tagged_args(c, "tagged receive", TDM_ANY_SOURCE, 1, tag, buf, capacity));
  if (!ranks || n < 1 || n > c->size) return tdm__set_error(TDM_ERR_INVALID_ARG, "tagged receive: %d ranks to hear from; expected 1..%d", n, c->size);
  for (int i = 0; i < n; i++)
    if (ranks[i] < 0 || ranks[i] >= c->size || ranks[i] == c->rank)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "tagged receive: rank %d (entry %d) is not another rank of this communicator (size %d, rank %d)",
                            ranks[i], i, c->size, c->rank);
  if (c->last_any >= n) c->last_any = 0;
  return trecv(c, TDM_ANY_SOURCE, ranks, n, tag, buf, capacity, from, nbytes, lost);
}

tdm_status tdm_comm_trecv_among(tdm_comm_t c, const int *ranks, int n, int tag, void *buf, size_t capacity, int *from,
                                size_t *nbytes) {
  return trecv_among(c, ranks, n, tag, buf, capacity, from, nbytes, NULL);
}

tdm_status tdm_comm_trecv_among_lossy(tdm_comm_t c, const int *ranks, int n, int tag, void *buf, size_t capacity, int *from,
                                      size_t *nbytes, int *lost) {
  if (!lost) return tdm__set_error(TDM_ERR_INVALID_ARG, "tagged receive: lost is NULL");
  *lost = -1;
  return trecv_among(c, ranks, n, tag, buf, capacity, from, nbytes, lost);
}
