/* The shared-memory transport for ranks on one node, the collectives built on it without
 * messages (all-reduce, reduce-scatter, all-gather through per-rank slots), and the memory of
 * shared buffers (src/comm/shared.c: data parallelism's zero-copy gradients), one more segment
 * each (at the end).
 *
 * One segment per communicator, created by rank 0 under a fresh name that it publishes through
 * the store, and unlinked as soon as everyone has mapped it (so a crash leaves nothing in
 * /dev/shm). It holds:
 *   - a control block per rank: its pid, two progress counters and the call it is in (for
 *     mismatches found while waiting), each on its own cache line;
 *   - a ring buffer per ordered pair (single producer, single consumer) for point-to-point
 *     messages, which every generic algorithm uses; each message carries the checked header;
 *   - two sets of data slots, one slot per rank, for the slot collectives, each with a ready word
 *     that carries the round and the identity of the call whose data it holds, checked before the
 *     data is read.
 * Waiting spins briefly, then sleeps in growing naps (tdm__backoff), and every few milliseconds
 * checks the deadline, the segment's abort flag, the peers' calls, and whether the awaited
 * peer's process still exists; a peer found gone is declared dead only if what we wait for is
 * still missing after that (a peer that did its part and exited is not dead). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm_impl.h"

#define SHM_MAGIC 0x4d485354u /* "TSHM" */
#define LINE 64
#define SLOT_BYTES ((size_t)1 << 20)

typedef struct {
  _Atomic uint64_t v;
  char pad[LINE - 8];
} counter;

/* A call as a rank publishes it: a sequence lock (ver odd while it is rewritten), so a peer never
 * compares half of one call with half of the next. */
typedef struct {
  _Atomic uint64_t ver;
  _Atomic uint64_t seq, count;
  _Atomic uint32_t kind, dtype, op, comm_id;
  _Atomic int32_t root;
  _Atomic uint32_t slots; /* 1: it runs a slot collective (no messages) */
  char pad[LINE - 48];
} announcement;

typedef struct {
  _Atomic int32_t pid;
  char pad0[LINE - 4];
  counter done, fin; /* slot collective round progress */
  announcement call;
} rank_ctl;

/* A slot is ready: the round its data belongs to, and the call and communicator of that round,
 * on one cache line, so a peer reads the identity with the same miss that brings the round.
 * One per slot (parity and rank): a slot's line is not rewritten before every rank's fin of the
 * round, so what a peer reads after seeing the round is that round's identity. */
typedef struct {
  _Atomic uint64_t round;
  uint32_t comm_id, pad;
  tdm__call call;
  char pad2[LINE - 16 - sizeof(tdm__call)];
} slot_ready;
_Static_assert(sizeof(slot_ready) == LINE, "one ready word per cache line");

typedef struct {
  _Atomic uint64_t head; /* bytes written, by the producer */
  char pad0[LINE - 8];
  _Atomic uint64_t tail; /* bytes consumed, by the consumer */
  char pad1[LINE - 8];
} ring_ctl;

typedef struct {
  uint32_t magic, version;
  int32_t size;
  uint32_t pad;
  uint64_t ring_bytes, slot_bytes, total;
  _Atomic int32_t attached;
  _Atomic int32_t aborted;      /* set (release) once the fields below are written */
  _Atomic int32_t abort_claimed; /* the first rank to abort writes them */
  char reason[512];
  int32_t abort_status;
  int32_t abort_rank; /* whose failure the reason gives (tdm_last_error_origin on the others) */
  char pad2[LINE];
} seg_hdr;

typedef struct {
  tdm__transport base;
  unsigned char *base_ptr;
  size_t total;
  seg_hdr *hdr;
  rank_ctl *ctl;   /* [size] */
  ring_ctl *rctl;  /* [size * size], from * size + to */
  slot_ready *rdy; /* [2 * size], parity * size + rank */
  unsigned char *rings, *slots;
  size_t ring_bytes, slot_bytes;
  uint64_t round;  /* slot rounds done by this rank */
  tdm__store *store;
} shm_tr;

static const tdm__transport_ops shm_ops;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static unsigned char *ring_data(shm_tr *t, int from, int to) {
  return t->rings + ((size_t)from * (size_t)t->base.size + (size_t)to) * t->ring_bytes;
}
static unsigned char *slot(shm_tr *t, int parity, int rank) {
  return t->slots + ((size_t)parity * (size_t)t->base.size + (size_t)rank) * t->slot_bytes;
}

int tdm__shm_usable(const struct tdm_comm *c) { return c->tr && c->tr->ops == &shm_ops && !c->map; }

/* ---- names not yet unlinked ----------------------------------------------------------------
 * Rank 0 creates a segment and unlinks its name once every rank has mapped it; a signal that ends
 * the process in between (SIGTERM from a launcher, or from the watchdog when the launcher died)
 * left it in /dev/shm. The names wait here for tdm_shm_remove_pending, which a signal handler may
 * call: slots claimed with an atomic flag, read without locks. */
enum { PENDING = 8 };
static char pending_name[PENDING][128];
static _Atomic int pending_used[PENDING]; /* 0 free, 1 being written, 2 holds a name */

static int pending_add(const char *name) {
  for (int i = 0; i < PENDING; i++) {
    int want = 0;
    if (atomic_compare_exchange_strong(&pending_used[i], &want, 1)) {
      snprintf(pending_name[i], sizeof pending_name[i], "%s", name);
      atomic_store(&pending_used[i], 2);
      return i;
    }
  }
  return -1; /* more segments in set-up at once than slots: that one is not covered */
}

static void pending_done(int slot) {
  if (slot >= 0) atomic_store(&pending_used[slot], 0);
}

void tdm_shm_remove_pending(void) {
  for (int i = 0; i < PENDING; i++) {
    int want = 2;
    if (atomic_compare_exchange_strong(&pending_used[i], &want, 1)) shm_unlink(pending_name[i]);
  }
}

/* ---- failing ----------------------------------------------------------------------------- */
/* Tells every rank why we stop: waits anywhere in the segment see the flag within milliseconds. */
static void abort_with(shm_tr *t, tdm_status st, const char *reason, int origin) {
  if (!atomic_exchange(&t->hdr->abort_claimed, 1)) { /* readers see the flag only after the fields */
    snprintf(t->hdr->reason, sizeof t->hdr->reason, "rank %d failed: %.480s", t->base.rank, reason);
    t->hdr->abort_status = st ? (int32_t)st : TDM_ERR_REMOTE;
    t->hdr->abort_rank = origin >= 0 ? origin : t->base.rank; /* where a relayed failure began */
    atomic_store_explicit(&t->hdr->aborted, 1, memory_order_release);
  }
}

static void shm_abort(tdm__transport *tr, const char *reason) {
  abort_with((shm_tr *)tr, tdm__active(tr)->fail_status, reason, tdm__active(tr)->fail_origin);
}

/* A slot or region collective failed with st (detail in tdm_last_error): fail c, tell the peers. */
static tdm_status fail(shm_tr *t, struct tdm_comm *c, tdm_status st) {
  if (!atomic_load(&c->failed)) tdm__comm_fail(c, st, "%s", tdm_last_error());
  abort_with(t, c->fail_status, c->error, c->fail_origin);
  return tdm__comm_error(c);
}

/* ---- the calls ranks are in ---------------------------------------------------------------- */
static void publish(shm_tr *t, const tdm__call *call, uint32_t comm_id, uint32_t slots) {
  announcement *a = &t->ctl[t->base.rank].call;
  uint64_t v = atomic_load_explicit(&a->ver, memory_order_relaxed);
  atomic_store_explicit(&a->ver, v + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&a->seq, call->seq, memory_order_relaxed);
  atomic_store_explicit(&a->count, call->count, memory_order_relaxed);
  atomic_store_explicit(&a->kind, call->kind, memory_order_relaxed);
  atomic_store_explicit(&a->dtype, call->dtype, memory_order_relaxed);
  atomic_store_explicit(&a->op, call->op, memory_order_relaxed);
  atomic_store_explicit(&a->root, call->root, memory_order_relaxed);
  atomic_store_explicit(&a->comm_id, comm_id, memory_order_relaxed);
  atomic_store_explicit(&a->slots, slots, memory_order_relaxed);
  atomic_store_explicit(&a->ver, v + 2, memory_order_release);
}

/* Rank q's published call; 0 if it was being rewritten (try again at the next check). */
static int read_call(shm_tr *t, int q, tdm__call *k, uint32_t *comm_id, uint32_t *slots) {
  announcement *a = &t->ctl[q].call;
  uint64_t v = atomic_load_explicit(&a->ver, memory_order_acquire);
  if (v & 1) return 0;
  k->seq = atomic_load_explicit(&a->seq, memory_order_relaxed);
  k->count = atomic_load_explicit(&a->count, memory_order_relaxed);
  k->kind = atomic_load_explicit(&a->kind, memory_order_relaxed);
  k->dtype = atomic_load_explicit(&a->dtype, memory_order_relaxed);
  k->op = atomic_load_explicit(&a->op, memory_order_relaxed);
  k->root = atomic_load_explicit(&a->root, memory_order_relaxed);
  *comm_id = atomic_load_explicit(&a->comm_id, memory_order_relaxed);
  *slots = atomic_load_explicit(&a->slots, memory_order_relaxed);
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&a->ver, memory_order_relaxed) == v;
}

static void shm_announce(tdm__transport *tr, const tdm__call *call, int slots) {
  publish((shm_tr *)tr, call, tdm__active(tr)->comm_id, (uint32_t)slots);
}

/* A peer in the same call of c (same communicator and sequence number) but another collective,
 * or in the same collective with another algorithm: fail now, naming both. */
static tdm_status check_peers(shm_tr *t, struct tdm_comm *c) {
  if (c->cur.kind == TDM_COLL_P2P) return TDM_OK;
  tdm__call mine;
  uint32_t my_comm, my_slots;
  if (!read_call(t, t->base.rank, &mine, &my_comm, &my_slots)) return TDM_OK;
  for (int q = 0; q < t->base.size; q++) {
    tdm__call k;
    uint32_t comm_id, slots;
    if (q == t->base.rank || !read_call(t, q, &k, &comm_id, &slots)) continue;
    if (comm_id != c->comm_id || k.seq != c->cur.seq) continue;
    TDM__TRY(tdm__check_call(c, q, &c->cur, c->comm_id, &k, comm_id));
    if (slots != my_slots) {
      char b[160];
      int a = slots ? tdm__comm_rank_of(c, q) : c->rank, m = slots ? c->rank : tdm__comm_rank_of(c, q);
      return tdm__comm_fail(c, TDM_ERR_MISMATCH,
                            "collective mismatch: rank %d runs %s with the shm algorithm but rank %d with one that "
                            "sends messages (do all ranks pass the same algorithm?)",
                            a, tdm__call_str(&c->cur, b, sizeof b), m);
    }
  }
  return TDM_OK;
}

/* ---- waiting ----------------------------------------------------------------------------- */
typedef tdm__waiter waiter;

/* Called when a wait of c's call makes no progress; returns TDM_OK to keep waiting. peer: the
 * transport rank awaited (-1: none in particular). what names the wait in errors; NULL: c's
 * call, whose peers' published calls are then checked too. A peer whose process is gone, or the
 * job's abort flag, is reported only on the next call, after the caller has looked again at what
 * it waits for: a peer that did its part and then exited or failed has not failed this wait. */
static tdm_status idle(shm_tr *t, waiter *w, struct tdm_comm *c, int peer, double deadline, const char *what) {
  char b[160];
  if (w->aborted) {
    /* both written by a peer: the status limited to what a peer may report (as tcp and mpi do),
     * the reason read no further than its buffer */
    tdm_status st = (tdm_status)t->hdr->abort_status;
    if (st != TDM_ERR_MISMATCH && st != TDM_ERR_TIMEOUT) st = TDM_ERR_REMOTE;
    int from = t->hdr->abort_rank; /* written by a peer: a rank of the segment, and not ours (our own abort read back) */
    return tdm__error_from(from >= 0 && from < t->base.size && from != t->base.rank ? from : -1,
                           tdm__set_error(st, "%.*s", (int)sizeof t->hdr->reason, t->hdr->reason));
  }
  if (w->dead && w->dead == peer + 1) /* gone, and it did not do its part before it went */
    return tdm__error_from(peer, tdm__set_error(TDM_ERR_REMOTE, "rank %d (pid %d) died during %s (rank %d)",
                                                tdm__comm_rank_of(c, peer), (int)atomic_load(&t->ctl[peer].pid),
                                                what ? what : tdm__call_str(&c->cur, b, sizeof b), c->rank));
  w->dead = 0;
  if (!tdm__backoff(&w->b)) return TDM_OK;
  if (atomic_load_explicit(&t->hdr->aborted, memory_order_acquire)) {
    w->aborted = 1;
    return TDM_OK;
  }
  if (!what) TDM__TRY(check_peers(t, c));
  if (peer >= 0) {
    int32_t pid = atomic_load(&t->ctl[peer].pid);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      w->dead = peer + 1;
      return TDM_OK;
    }
  }
  if (tdm_time_now() > deadline) {
    if (!what) what = tdm__call_str(&c->cur, b, sizeof b);
    if (peer >= 0)
      return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s waiting for rank %d", c->rank, what,
                            c->timeout_s, tdm__comm_rank_of(c, peer));
    return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s", c->rank, what, c->timeout_s);
  }
  return TDM_OK;
}

/* Waits until counter ctr of transport rank q reaches want. */
static tdm_status wait_counter(shm_tr *t, struct tdm_comm *c, counter *ctr, uint64_t want, int q, double deadline,
                               const char *what) {
  waiter w = {0};
  while (atomic_load_explicit(&ctr->v, memory_order_acquire) < want) TDM__TRY(idle(t, &w, c, q, deadline, what));
  return TDM_OK;
}

#if defined(__AVX2__)
#include <immintrin.h>
#endif
/* Copies with plain vector loads and stores. glibc's memcpy switches to `rep movsb` above about
 * 2 KiB, and on this AMD machine that made a 4 KiB shared-memory all-reduce 7x slower than a
 * 2 KiB one. */
static void shm_copy(void *dst, const void *src, size_t n) {
#if defined(__AVX2__)
  char *d = dst;
  const char *s = src;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 64)), f = _mm256_loadu_si256((const __m256i *)(s + i + 96));
    _mm256_storeu_si256((__m256i *)(d + i), a);
    _mm256_storeu_si256((__m256i *)(d + i + 32), b);
    _mm256_storeu_si256((__m256i *)(d + i + 64), e);
    _mm256_storeu_si256((__m256i *)(d + i + 96), f);
  }
  if (i < n) memcpy(d + i, s + i, n - i);
#else
  memcpy(dst, src, n);
#endif
}

/* ---- point to point through the rings ------------------------------------------------------ */
static size_t ring_put(shm_tr *t, int to, const void *src, size_t n) {
  ring_ctl *r = &t->rctl[(size_t)t->base.rank * (size_t)t->base.size + (size_t)to];
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
  /* the counters live in memory peers write: a pair that claims more than the ring holds moves
   * nothing (the wait then times out naming the peer) rather than past the ring */
  size_t used = (size_t)(head - tail), space = used > t->ring_bytes ? 0 : t->ring_bytes - used, k = n < space ? n : space;
  if (!k) return 0;
  unsigned char *d = ring_data(t, t->base.rank, to);
  size_t at = (size_t)(head % t->ring_bytes), first = t->ring_bytes - at < k ? t->ring_bytes - at : k;
  shm_copy(d + at, src, first);
  shm_copy(d, (const char *)src + first, k - first);
  atomic_store_explicit(&r->head, head + k, memory_order_release);
  return k;
}

static size_t ring_get(shm_tr *t, int from, void *dst, size_t n) {
  ring_ctl *r = &t->rctl[(size_t)from * (size_t)t->base.size + (size_t)t->base.rank];
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  size_t avail = (size_t)(head - tail), k = avail > t->ring_bytes ? 0 : n < avail ? n : avail;
  if (!k) return 0;
  unsigned char *d = ring_data(t, from, t->base.rank);
  size_t at = (size_t)(tail % t->ring_bytes), first = t->ring_bytes - at < k ? t->ring_bytes - at : k;
  shm_copy(dst, d + at, first);
  shm_copy((char *)dst + first, d, k - first);
  atomic_store_explicit(&r->tail, tail + k, memory_order_release);
  return k;
}

/* Moves what it can of transfer x; 1 if it moved bytes, 0 if not, -1 on a header error. */
static int step(shm_tr *t, struct tdm_comm *c, tdm__xfer *x, tdm_status *st) {
  size_t H = sizeof(tdm__hdr), moved = 0;
  if (x->is_send) {
    if (x->done < H) moved += ring_put(t, x->peer, (char *)&x->hdr + x->done, H - x->done), x->done += moved;
    if (x->done >= H && x->nbytes) { /* (no arithmetic on the NULL of an empty message: C calls it undefined) */
      size_t k = ring_put(t, x->peer, (char *)x->buf + (x->done - H), x->nbytes - (x->done - H));
      x->done += k;
      moved += k;
    }
  } else {
    if (x->done < H) {
      size_t k = ring_get(t, x->peer, (char *)&x->got + x->done, H - x->done);
      x->done += k;
      moved += k;
      if (x->done == H && k) {
        if (x->got.magic == TDM_MSG_MAGIC && x->got.kind == TDM_COLL_ABORT) {
          char reason[600] = {0};
          size_t want = x->got.nbytes < sizeof reason - 1 ? x->got.nbytes : sizeof reason - 1, have = 0;
          for (int tries = 0; have < want && tries < 100000; tries++) have += ring_get(t, x->peer, reason + have, want - have);
          *st = tdm__error_from(x->peer, tdm__set_error(TDM_ERR_REMOTE, "rank %d failed: %s", tdm__comm_rank_of(c, x->peer), reason));
          return -1;
        }
        if ((*st = tdm__xfer_header(c, x)) != TDM_OK) return -1;
      }
    }
    if (x->done >= H && x->nbytes) {
      size_t k = ring_get(t, x->peer, (char *)x->buf + (x->done - H), x->nbytes - (x->done - H));
      x->done += k;
      moved += k;
    }
  }
  if (x->done == H + x->nbytes) {
    if (tdm__xfer_done(&t->base, x)) x->complete = 1;
    else moved = 1; /* a tagged message went to the stash: read on */
  }
  return moved > 0 || x->complete;
}

static tdm_status run(tdm__transport *tr, tdm__xfer *x, int n, double deadline) {
  shm_tr *t = (shm_tr *)tr;
  struct tdm_comm *c = tdm__active(tr);
  waiter w = {0};
  for (;;) {
    int pending = 0, moved = 0, blocker = -1;
    for (int i = 0; i < n; i++) {
      if (x[i].complete) continue;
      pending++;
      if (!tdm__xfer_turn(x, i)) continue;
      tdm_status st = TDM_OK;
      int r = step(t, c, &x[i], &st);
      if (r < 0) return st;
      if (r > 0) moved = 1;
      if (!x[i].complete) blocker = x[i].peer;
    }
    if (!pending) return TDM_OK;
    if (moved) {
      w = (waiter){0};
      continue;
    }
    TDM__TRY(idle(t, &w, c, blocker, deadline, NULL));
  }
}

static void shm_destroy(tdm__transport *tr) {
  shm_tr *t = (shm_tr *)tr;
  if (t->base_ptr) {
    munmap(t->base_ptr, t->total);
    tdm__mem_account(TDM_MEM_COMM, -(int64_t)(t->total / (size_t)t->base.size));
  }
  tdm__store_close(t->store);
  tdm__free(t);
}

/* Bytes in peer's ring, the job aborted, or (slow checks) peer's process gone: a receive from it
 * will say which. */
static int shm_pending(tdm__transport *tr, int peer, int slow) {
  shm_tr *t = (shm_tr *)tr;
  ring_ctl *r = &t->rctl[(size_t)peer * (size_t)tr->size + (size_t)tr->rank];
  if (atomic_load_explicit(&r->head, memory_order_acquire) != atomic_load_explicit(&r->tail, memory_order_relaxed)) return 1;
  if (atomic_load_explicit(&t->hdr->aborted, memory_order_acquire)) return 1;
  int32_t pid = slow ? atomic_load(&t->ctl[peer].pid) : 0;
  return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

static tdm_status shm_shared_map(tdm__transport *tr, struct tdm_comm *c, size_t bytes, void **base);
static void shm_shared_unmap(tdm__transport *tr, void *base, size_t bytes);
static tdm_status shm_shared_wait(tdm__transport *tr, tdm__waiter *w, struct tdm_comm *c, int peer, double deadline,
                                  const char *what);
static const tdm__transport_ops shm_ops = {"shm",        run,          shm_abort,        shm_destroy,    shm_announce,
                                           shm_pending, shm_shared_map, shm_shared_unmap, shm_shared_wait};

/* ---- slot collectives ------------------------------------------------------------------------
 * Rounds of at most slot_bytes per rank, double-buffered by parity. In round k a rank
 *   1. waits until every rank finished round k-2, which used the same slots (round_start);
 *   2. copies its input chunk into its slot, publishes the slot's ready word (round k and the
 *      call), waits for every rank's, and compares every slot's call with its own before it reads
 *      any of them (round_ready);
 *   3. reduces or copies what it needs from the slots;
 *   4. publishes fin = k.
 * Every reduced element is summed in rank order 0..P-1, whoever sums it and in whichever round,
 * so all ranks, and the all-reduce and the reduce-scatter, agree bit for bit. */
static tdm_status round_start(shm_tr *t, struct tdm_comm *c, uint64_t k, double deadline) {
  for (int q = 0; q < t->base.size && k > 2; q++) TDM__TRY(wait_counter(t, c, &t->ctl[q].fin, k - 2, q, deadline, NULL));
  return TDM_OK;
}

static tdm_status round_ready(shm_tr *t, struct tdm_comm *c, uint64_t k, double deadline) {
  int par = (int)(k & 1), P = t->base.size, me = t->base.rank;
  slot_ready *mine = &t->rdy[par * P + me];
  mine->call = c->cur;
  mine->comm_id = c->comm_id;
  atomic_store_explicit(&mine->round, k, memory_order_release);
  for (int q = 0; q < P; q++) {
    slot_ready *r = &t->rdy[par * P + q];
    waiter w = {0};
    uint64_t got;
    while ((got = atomic_load_explicit(&r->round, memory_order_acquire)) < k) TDM__TRY(idle(t, &w, c, q, deadline, NULL));
    if (q == me) continue;
    TDM__TRY(tdm__check_call(c, q, &c->cur, c->comm_id, &r->call, r->comm_id));
    if (got != k) /* the same call in another round: the ranks' histories differ */
      return tdm__comm_fail(c, TDM_ERR_MISMATCH, "rank %d is in shared-memory round %llu of the call where rank %d is in round %llu",
                            q, (unsigned long long)got, me, (unsigned long long)k);
  }
  return TDM_OK;
}

/* Rounds: a small chunk is summed by every rank itself; a large one is split into P shares, rank
 * r sums share r of every slot into its own slot, and everyone copies every share out. */
tdm_status tdm__allreduce_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op) {
  size_t es = tdm_dtype_size(dt);
  if (c->size == 1) {
    if (sendbuf != recvbuf && count) memcpy(recvbuf, sendbuf, count * es);
    return TDM_OK;
  }
  shm_tr *t = (shm_tr *)c->tr;
  int P = c->size, me = c->rank;
  size_t per_round = t->slot_bytes / es;
  double deadline = tdm_time_now() + c->timeout_s;
  const char *in = sendbuf;
  char *out = recvbuf;
  size_t done_elems = 0;
  tdm_status st = TDM_OK;
  do { /* one round at least: a call of 0 elements is still checked against its peers */
    size_t n = count - done_elems < per_round ? count - done_elems : per_round;
    uint64_t k = ++t->round;
    int par = (int)(k & 1);
    if ((st = round_start(t, c, k, deadline)) != TDM_OK) break;
    unsigned char *mine = slot(t, par, me);
    shm_copy(mine, in + done_elems * es, n * es);
    if ((st = round_ready(t, c, k, deadline)) != TDM_OK) break;
    char *dst = out + done_elems * es;
    size_t my_lo, my_len; /* what peers take of mine: the whole slot, or their shares and then my sums */
    tdm_comm_block(n, P, me, &my_lo, &my_len);
    int small = n * es <= 32768 || n < (size_t)P * 16;
    tdm__count_sent(c, (small ? (size_t)(P - 1) * n : n - my_len + (size_t)(P - 1) * my_len) * es);
    if (small) {
      shm_copy(dst, slot(t, par, 0), n * es); /* the same order on every rank: 0, 1, ..., P-1 */
      for (int q = 1; q < P; q++) tdm_reduce_local(dst, slot(t, par, q), n, dt, op);
    } else {
      size_t lo, len;
      tdm_comm_block(n, P, me, &lo, &len);
      /* my share: accumulate in my output, then publish it in my slot's share (which only I read) */
      shm_copy(dst + lo * es, slot(t, par, 0) + lo * es, len * es);
      for (int q = 1; q < P; q++) tdm_reduce_local(dst + lo * es, slot(t, par, q) + lo * es, len, dt, op);
      shm_copy(mine + lo * es, dst + lo * es, len * es);
      atomic_store_explicit(&t->ctl[me].done.v, k, memory_order_release);
      for (int q = 0; q < P && st == TDM_OK; q++) {
        if (q == me) continue;
        size_t qlo, qlen;
        tdm_comm_block(n, P, q, &qlo, &qlen);
        if ((st = wait_counter(t, c, &t->ctl[q].done, k, q, deadline, NULL)) == TDM_OK)
          shm_copy(dst + qlo * es, slot(t, par, q) + qlo * es, qlen * es);
      }
      if (st != TDM_OK) break;
    }
    atomic_store_explicit(&t->ctl[me].fin.v, k, memory_order_release);
    done_elems += n;
  } while (done_elems < count);
  return st == TDM_OK ? TDM_OK : fail(t, c, st);
}

/* Every rank copies its whole input in, round by round, and sums only its block, in rank order,
 * as the all-reduce sums it. */
tdm_status tdm__reduce_scatter_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *cnt,
                                   const size_t *off, tdm_dtype dt, tdm_redop op) {
  size_t es = tdm_dtype_size(dt), lo = off[c->rank], len = cnt[c->rank];
  if (c->size == 1) {
    if (count) memcpy(recvbuf, sendbuf, count * es);
    return TDM_OK;
  }
  shm_tr *t = (shm_tr *)c->tr;
  int P = c->size, me = c->rank;
  size_t per_round = t->slot_bytes / es, at = 0;
  double deadline = tdm_time_now() + c->timeout_s;
  const char *in = sendbuf;
  char *out = recvbuf;
  tdm_status st = TDM_OK;
  tdm__count_sent(c, (count - len) * es); /* the peers' blocks of my input */
  do {
    size_t n = count - at < per_round ? count - at : per_round;
    uint64_t k = ++t->round;
    int par = (int)(k & 1);
    if ((st = round_start(t, c, k, deadline)) != TDM_OK) break;
    shm_copy(slot(t, par, me), in + at * es, n * es);
    if ((st = round_ready(t, c, k, deadline)) != TDM_OK) break;
    size_t a = lo > at ? lo : at, b = lo + len < at + n ? lo + len : at + n; /* my block in this round */
    if (a < b) {
      char *dst = out + (a - lo) * es;
      shm_copy(dst, slot(t, par, 0) + (a - at) * es, (b - a) * es);
      for (int q = 1; q < P; q++) tdm_reduce_local(dst, slot(t, par, q) + (a - at) * es, b - a, dt, op);
    }
    atomic_store_explicit(&t->ctl[me].fin.v, k, memory_order_release);
    at += n;
  } while (at < count);
  return st == TDM_OK ? TDM_OK : fail(t, c, st);
}

/* Round j carries the j-th slot-sized piece of every rank's block. */
tdm_status tdm__allgather_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *cnt,
                              const size_t *off, tdm_dtype dt) {
  int P = c->size, me = c->rank;
  size_t es = tdm_dtype_size(dt), lo = off[me], len = cnt[me];
  (void)count;
  char *out = recvbuf;
  const char *in = sendbuf;
  if (len && in != out + lo * es) memcpy(out + lo * es, in, len * es);
  if (P == 1) return TDM_OK;
  tdm__count_sent(c, (size_t)(P - 1) * len * es); /* my block, to every peer */
  shm_tr *t = (shm_tr *)c->tr;
  size_t per_round = t->slot_bytes / es, longest = 0, at = 0;
  for (int q = 0; q < P; q++) longest = cnt[q] > longest ? cnt[q] : longest;
  double deadline = tdm_time_now() + c->timeout_s;
  tdm_status st = TDM_OK;
  do {
    uint64_t k = ++t->round;
    int par = (int)(k & 1);
    if ((st = round_start(t, c, k, deadline)) != TDM_OK) break;
    if (at < len) shm_copy(slot(t, par, me), in + at * es, (len - at < per_round ? len - at : per_round) * es);
    if ((st = round_ready(t, c, k, deadline)) != TDM_OK) break;
    for (int q = 0; q < P; q++) {
      size_t qlo = off[q], qlen = cnt[q];
      if (q != me && at < qlen) shm_copy(out + (qlo + at) * es, slot(t, par, q), (qlen - at < per_round ? qlen - at : per_round) * es);
    }
    atomic_store_explicit(&t->ctl[me].fin.v, k, memory_order_release);
    at += per_round;
  } while (at < longest);
  return st == TDM_OK ? TDM_OK : fail(t, c, st);
}

/* ---- set-up -------------------------------------------------------------------------------- */
/* Where everything lies in a segment for P ranks. */
typedef struct {
  size_t ring_bytes, off_ctl, off_rctl, off_rdy, off_rings, off_slots, total;
} seg_layout;

static seg_layout segment_layout(int P) {
  seg_layout l;
  l.ring_bytes = align_up((size_t)(2 << 20) / (size_t)P, 4096);
  if (l.ring_bytes < (64 << 10)) l.ring_bytes = 64 << 10;
  l.off_ctl = align_up(sizeof(seg_hdr), 4096);
  l.off_rctl = align_up(l.off_ctl + sizeof(rank_ctl) * (size_t)P, 4096);
  l.off_rdy = align_up(l.off_rctl + sizeof(ring_ctl) * (size_t)P * (size_t)P, 4096);
  l.off_rings = align_up(l.off_rdy + sizeof(slot_ready) * 2 * (size_t)P, 4096);
  l.off_slots = l.off_rings + l.ring_bytes * (size_t)P * (size_t)P;
  l.total = l.off_slots + 2 * SLOT_BYTES * (size_t)P;
  return l;
}

size_t tdm__shm_segment_bytes(int P) { return P > 0 ? segment_layout(P).total : 0; }
tdm_status tdm__shm_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  int P = c->size, me = c->rank;
  if (c->local_size && c->local_size != P)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "the shm transport needs all %d ranks on one node, but LOCAL_WORLD_SIZE is %d; use tcp", P,
                          c->local_size);
  shm_tr *t = tdm__calloc(1, sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "shm: out of memory");
  t->base.ops = &shm_ops;
  t->base.comm = c;
  t->base.rank = me;
  t->base.size = P;
  seg_layout sl = segment_layout(P);
  t->ring_bytes = sl.ring_bytes;
  t->slot_bytes = SLOT_BYTES;
  size_t off_ctl = sl.off_ctl, off_rctl = sl.off_rctl, off_rdy = sl.off_rdy, off_rings = sl.off_rings,
         off_slots = sl.off_slots;
  t->total = sl.total;
  double deadline = tdm_time_now() + c->timeout_s;
  char name[128];
  /* the segment's name goes through the store, or (a node's group of a job that spans nodes,
   * algo/hier.c) through a broadcast over the group's communicator on the job's transport */
  tdm_status st = c->rdzv ? TDM_OK : tdm__store_open(&t->store, cfg, c->timeout_s);
  int fd = -1, pend = -1;
  char why[600];
  if (st == TDM_OK && me == 0) {
    snprintf(name, sizeof name, "/tandem-%d-%llx", (int)getpid(), (unsigned long long)tdm_hash64((uint64_t)getpid(), (uint64_t)(tdm_time_now() * 1e9)));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) pend = pending_add(name); /* ours (O_EXCL): a signal from here on removes it */
    int fa = 0;
    if (fd < 0 || ftruncate(fd, (off_t)t->total) != 0)
      st = tdm__set_error(TDM_ERR_SYSTEM, "shm: cannot create %s (%zu bytes): %s", name, t->total, strerror(errno));
    else if ((fa = posix_fallocate(fd, 0, (off_t)t->total)) != 0) /* fail now, not SIGBUS on first touch */
      st = tdm__set_error(TDM_ERR_SYSTEM,
                          "shm: cannot reserve %zu bytes in /dev/shm: %s (a container's /dev/shm may be too small: "
                          "docker run --shm-size; or use TANDEM_TRANSPORT=tcp)", t->total, strerror(fa));
    if (st == TDM_OK && c->rdzv) {
      snprintf(why, sizeof why, "%s", name);
      st = tdm_comm_broadcast(c->rdzv, why, sizeof why, TDM_U8, 0, TDM_ALGO_AUTO);
    } else if (st == TDM_OK) st = tdm__store_set(t->store, "shm/name", name, strlen(name));
    else { /* tell the others why, so every rank reports the cause rather than a closed store */
      snprintf(why, sizeof why, "!%s", tdm_last_error());
      if (c->rdzv) tdm_comm_broadcast(c->rdzv, why, sizeof why, TDM_U8, 0, TDM_ALGO_AUTO);
      else tdm__store_set(t->store, "shm/name", why, strlen(why));
      tdm__set_error(st, "%s", why + 1);
    }
  } else if (st == TDM_OK) {
    void *v;
    size_t n;
    if (c->rdzv) { /* the same shape as the store's answer */
      st = tdm_comm_broadcast(c->rdzv, why, sizeof why, TDM_U8, 0, TDM_ALGO_AUTO);
      why[sizeof why - 1] = 0;
      n = strlen(why);
      v = st == TDM_OK ? tdm__malloc(n + 1) : NULL;
      if (v) memcpy(v, why, n + 1);
      else if (st == TDM_OK) st = tdm__set_error(TDM_ERR_NO_MEMORY, "shm: out of memory");
    } else st = tdm__store_get(t->store, "shm/name", &v, &n, c->timeout_s);
    if (st == TDM_OK && n > 0 && ((char *)v)[0] == '!') {
      st = tdm__error_from(0, tdm__set_error(TDM_ERR_REMOTE, "rank 0 could not set up shared memory: %.*s", (int)n - 1, (char *)v + 1));
      tdm__free(v);
    } else if (st == TDM_OK) {
      snprintf(name, sizeof name, "%.*s", (int)n, (char *)v);
      tdm__free(v);
      fd = shm_open(name, O_RDWR, 0600);
      if (fd < 0) st = tdm__set_error(TDM_ERR_SYSTEM, "shm: cannot open %s: %s", name, strerror(errno));
    }
  }
  if (st == TDM_OK) {
    t->base_ptr = mmap(NULL, t->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (t->base_ptr != MAP_FAILED) /* shared by all ranks: each counts its share */
      tdm__mem_account(TDM_MEM_COMM, (int64_t)(t->total / (size_t)P));
    if (t->base_ptr == MAP_FAILED) {
      t->base_ptr = NULL;
      st = tdm__set_error(TDM_ERR_SYSTEM, "shm: cannot map %zu bytes: %s", t->total, strerror(errno));
    }
  }
  if (fd >= 0) close(fd);
  if (st == TDM_OK) {
    t->hdr = (seg_hdr *)t->base_ptr;
    t->ctl = (rank_ctl *)(t->base_ptr + off_ctl);
    t->rctl = (ring_ctl *)(t->base_ptr + off_rctl);
    t->rdy = (slot_ready *)(t->base_ptr + off_rdy);
    t->rings = t->base_ptr + off_rings;
    t->slots = t->base_ptr + off_slots;
    if (me == 0) { /* a new file is zero-filled: counters and rings start empty */
      t->hdr->size = P;
      t->hdr->ring_bytes = t->ring_bytes;
      t->hdr->slot_bytes = t->slot_bytes;
      t->hdr->total = t->total;
      t->hdr->version = 2; /* 2: identities with the slots' ready words */
      atomic_thread_fence(memory_order_release);
      t->hdr->magic = SHM_MAGIC;
    } else {
      waiter w = {0};
      while (((volatile seg_hdr *)t->hdr)->magic != SHM_MAGIC && st == TDM_OK)
        st = idle(t, &w, c, 0, deadline, "shared-memory set-up (waiting for rank 0 to prepare the segment)");
      if (st == TDM_OK && (t->hdr->size != P || t->hdr->total != t->total))
        st = tdm__set_error(TDM_ERR_MISMATCH, "shm: segment %s is for %d ranks / %llu bytes; this rank expects %d / %zu",
                            name, t->hdr->size, (unsigned long long)t->hdr->total, P, t->total);
    }
  }
  if (st == TDM_OK) {
    atomic_store(&t->ctl[me].pid, (int32_t)getpid());
    atomic_fetch_add(&t->hdr->attached, 1);
    if (me == 0) { /* once everyone has it mapped, the name can go: nothing is left behind */
      waiter w = {0};
      while (atomic_load(&t->hdr->attached) < P && st == TDM_OK)
        st = idle(t, &w, c, -1, deadline, "shared-memory set-up (waiting for every rank to map the segment)");
      if (st == TDM_ERR_TIMEOUT) { /* name those that never came: each rank writes its pid as it maps */
        char missing[160] = "", why[600];
        int nm = 0;
        for (int r = 0; r < P; r++)
          if (!atomic_load(&t->ctl[r].pid) && nm++ < 8) {
            size_t at = strlen(missing);
            snprintf(missing + at, sizeof missing - at, "%s%d", nm > 1 ? ", " : "", r);
          }
        snprintf(why, sizeof why, "%s", tdm_last_error());
        st = tdm__set_error(st, "%s: %d of %d ranks mapped it; missing: rank%s %s%s", why, (int)atomic_load(&t->hdr->attached), P,
                            nm == 1 ? "" : "s", missing, nm > 8 ? ", ..." : "");
      }
      shm_unlink(name);
      pending_done(pend);
    }
  }
  if (st != TDM_OK) {
    tdm_status e = tdm__set_error(st, "%s", tdm_last_error());
    if (me == 0 && fd >= 0) shm_unlink(name);
    pending_done(pend);
    shm_destroy(&t->base);
    return e;
  }
  tdm_log(TDM_LOG_INFO, "shm: rank %d mapped %zu bytes (%s)", me, t->total, name);
  *out = &t->base;
  return TDM_OK;
}

/* ---- shared buffers (src/comm/shared.c): one more segment that every rank maps --------------- */
static tdm_status shm_shared_map(tdm__transport *tr, struct tdm_comm *c, size_t bytes, void **base) {
  (void)tr;
  *base = NULL;
  int me = c->rank;
  char name[128] = {0};
  int fd = -1, ok = 1, pend = -1;
  void *m = NULL;
  if (me == 0) {
    snprintf(name, sizeof name, "/tandem-r-%d-%llx", (int)getpid(),
             (unsigned long long)tdm_hash64((uint64_t)getpid(), (uint64_t)(tdm_time_now() * 1e9)));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) pend = pending_add(name);
    /* reserve the pages now: a tmpfs too small for them (a container's 64 MB /dev/shm) then fails
     * here, and every rank falls back to a copying collective, instead of SIGBUS on first touch */
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0 || posix_fallocate(fd, 0, (off_t)bytes) != 0) ok = 0;
  }
  /* every rank learns the name, maps it, and all agree before anyone relies on it */
  tdm_status st = tdm_comm_broadcast(c, name, sizeof name, TDM_U8, 0, TDM_ALGO_AUTO);
  if (st == TDM_OK && me != 0 && name[0]) fd = shm_open(name, O_RDWR, 0600);
  if (st == TDM_OK && fd >= 0) {
    m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) m = NULL;
  }
  if (fd >= 0) close(fd);
  int32_t mapped = st == TDM_OK && ok && m != NULL, all = 0;
  if (st == TDM_OK) st = tdm_comm_allreduce(c, &mapped, &all, 1, TDM_I32, TDM_MIN, TDM_ALGO_AUTO);
  if (me == 0 && name[0]) shm_unlink(name); /* mapped by all (or given up): nothing left behind */
  pending_done(pend);
  if (st == TDM_OK && !all)
    st = tdm__set_error(TDM_ERR_SYSTEM, "shared buffer: some rank could not reserve %zu bytes in /dev/shm (too small?)", bytes);
  if (st != TDM_OK) {
    if (m) munmap(m, bytes);
    return st;
  }
  *base = m;
  return TDM_OK;
}

static void shm_shared_unmap(tdm__transport *tr, void *base, size_t bytes) {
  (void)tr;
  munmap(base, bytes);
}

static tdm_status shm_shared_wait(tdm__transport *tr, tdm__waiter *w, struct tdm_comm *c, int peer, double deadline,
                                  const char *what) {
  return idle((shm_tr *)tr, w, c, peer, deadline, what);
}
