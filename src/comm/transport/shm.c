/* The shared-memory transport for ranks on one node, the all-reduce built on it, and shared
 * regions for data parallelism's zero-copy gradient averaging (at the end).
 *
 * One segment per communicator, created by rank 0 under a fresh name that it publishes through
 * the store, and unlinked as soon as everyone has mapped it (so a crash leaves nothing in
 * /dev/shm). It holds:
 *   - a control block per rank: its pid and three progress counters, each on its own cache line;
 *   - a ring buffer per ordered pair (single producer, single consumer) for point-to-point
 *     messages, which every generic algorithm uses;
 *   - two sets of data slots, one slot per rank, for the all-reduce.
 * Waiting spins briefly, then yields, and every few milliseconds checks the deadline, the
 * segment's abort flag, and whether the awaited peer's process still exists. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

#define SHM_MAGIC 0x4d485354u /* "TSHM" */
#define LINE 64
#define SLOT_BYTES ((size_t)1 << 20)

typedef struct {
  _Atomic uint64_t v;
  char pad[LINE - 8];
} counter;

typedef struct {
  _Atomic int32_t pid;
  char pad0[LINE - 4];
  counter ready, done, fin; /* all-reduce round progress */
  /* the collective this rank is in, so waiting peers can detect a mismatch without messages */
  _Atomic uint64_t call_seq;
  uint32_t call_kind, call_dtype, call_op;
  int32_t call_root;
  uint64_t call_count;
  char pad1[LINE - 32];
} rank_ctl;

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
  _Atomic int32_t aborted;
  char reason[512];
  int32_t abort_status;
  char pad2[LINE];
} seg_hdr;

typedef struct {
  tdm__transport base;
  unsigned char *base_ptr;
  size_t total;
  seg_hdr *hdr;
  rank_ctl *ctl;   /* [size] */
  ring_ctl *rctl;  /* [size * size], from * size + to */
  unsigned char *rings, *slots;
  size_t ring_bytes, slot_bytes;
  uint64_t round;  /* all-reduce rounds done by this rank */
  tdm__store *store;
} shm_tr;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static unsigned char *ring_data(shm_tr *t, int from, int to) {
  return t->rings + ((size_t)from * (size_t)t->base.size + (size_t)to) * t->ring_bytes;
}
static unsigned char *slot(shm_tr *t, int parity, int rank) {
  return t->slots + ((size_t)parity * (size_t)t->base.size + (size_t)rank) * t->slot_bytes;
}

/* ---- waiting ----------------------------------------------------------------------------- */
typedef struct {
  unsigned spins;
  double next_check;
} waiter;

/* Called when a wait makes no progress: backs off, and every ~5 ms checks the deadline, the
 * abort flag and the peer's life. Returns TDM_OK to keep waiting. what names the wait in errors;
 * NULL: the current collective call, which is then also checked against the peers' calls. */
static tdm_status idle_for(shm_tr *t, waiter *w, int peer, double deadline, const char *what) {
  /* spin while the peer is probably about to arrive (the latency case), then yield, then sleep
   * in short naps: on a machine with as many ranks as cores a spinning waiter steals the core
   * that another thread (backward, on a data-parallel rank) needs */
  if (++w->spins < 4000) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    return TDM_OK;
  }
  if (w->spins < 4100) sched_yield();
  else {
    static _Thread_local int slack_set;
    if (!slack_set) { /* the default 50 us timer slack would stretch every nap to ~70 us */
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      slack_set = 1;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  if (w->spins < 4100 && (w->spins & 63) != 0) return TDM_OK;
  double now = tdm_time_now();
  if (now < w->next_check) return TDM_OK;
  w->next_check = now + 0.005;
  struct tdm_comm *c = t->base.comm;
  char b[160];
  if (atomic_load_explicit(&t->hdr->aborted, memory_order_acquire)) {
    tdm_status st = t->hdr->abort_status ? (tdm_status)t->hdr->abort_status : TDM_ERR_REMOTE;
    return tdm__set_error(st, "%s", t->hdr->reason);
  }
  /* a peer in another collective with the same sequence number: fail now, naming both */
  for (int q = 0; !what && q < t->base.size && c->cur.kind != TDM_COLL_P2P && !c->map; q++) {
    rank_ctl *pc = &t->ctl[q];
    uint64_t s1 = atomic_load_explicit(&pc->call_seq, memory_order_acquire);
    if (q == c->rank || s1 != c->cur.seq) continue;
    tdm__hdr got = {TDM_MSG_MAGIC, pc->call_kind, s1, pc->call_dtype, pc->call_op, pc->call_root, c->comm_id, pc->call_count, 0};
    if (atomic_load_explicit(&pc->call_seq, memory_order_acquire) != s1) continue; /* it moved on meanwhile */
    tdm__hdr want = {TDM_MSG_MAGIC, c->cur.kind, c->cur.seq, c->cur.dtype, c->cur.op, c->cur.root, c->comm_id, c->cur.count, 0};
    tdm_status st = tdm__check_header(c, q, &want, &got);
    if (st != TDM_OK) return st;
  }
  if (!what) what = tdm__call_str(&c->cur, b, sizeof b);
  if (peer >= 0) {
    int32_t pid = atomic_load(&t->ctl[peer].pid);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
      return tdm__set_error(TDM_ERR_REMOTE, "rank %d (pid %d) died during %s (rank %d)", peer, pid, what, c->rank);
  }
  if (now > deadline)
    return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s waiting for rank %d", c->rank, what,
                          c->timeout_s, peer);
  return TDM_OK;
}

static tdm_status idle(shm_tr *t, waiter *w, int peer, double deadline) { return idle_for(t, w, peer, deadline, NULL); }

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
  size_t space = t->ring_bytes - (size_t)(head - tail), k = n < space ? n : space;
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
  size_t avail = (size_t)(head - tail), k = n < avail ? n : avail;
  if (!k) return 0;
  unsigned char *d = ring_data(t, from, t->base.rank);
  size_t at = (size_t)(tail % t->ring_bytes), first = t->ring_bytes - at < k ? t->ring_bytes - at : k;
  shm_copy(dst, d + at, first);
  shm_copy((char *)dst + first, d, k - first);
  atomic_store_explicit(&r->tail, tail + k, memory_order_release);
  return k;
}

/* Moves what it can of transfer x; 1 if it moved bytes, 0 if not, -1 on a header error. */
static int step(shm_tr *t, tdm__xfer *x, tdm_status *st) {
  size_t H = sizeof(tdm__hdr), moved = 0;
  if (x->is_send) {
    if (x->done < H) moved += ring_put(t, x->peer, (char *)&x->hdr + x->done, H - x->done), x->done += moved;
    if (x->done >= H) {
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
          *st = tdm__set_error(TDM_ERR_REMOTE, "rank %d failed: %s", x->peer, reason);
          return -1;
        }
        if ((*st = tdm__check_header(t->base.comm, x->peer, &x->hdr, &x->got)) != TDM_OK) return -1;
      }
    }
    if (x->done >= H) {
      size_t k = ring_get(t, x->peer, (char *)x->buf + (x->done - H), x->nbytes - (x->done - H));
      x->done += k;
      moved += k;
    }
  }
  if (x->done == H + x->nbytes) x->complete = 1;
  return moved > 0 || x->complete;
}

static tdm_status run(tdm__transport *tr, tdm__xfer *x, int n, double deadline) {
  shm_tr *t = (shm_tr *)tr;
  waiter w = {0, 0};
  for (;;) {
    int pending = 0, moved = 0, blocker = -1;
    for (int i = 0; i < n; i++) {
      if (x[i].complete) continue;
      pending++;
      if (!tdm__xfer_turn(x, i)) continue;
      tdm_status st = TDM_OK;
      int r = step(t, &x[i], &st);
      if (r < 0) return st;
      if (r > 0) moved = 1;
      if (!x[i].complete) blocker = x[i].peer;
    }
    if (!pending) return TDM_OK;
    if (moved) {
      w.spins = 0;
      continue;
    }
    tdm_status st = idle(t, &w, blocker, deadline);
    if (st != TDM_OK) return st;
  }
}

static void shm_abort(tdm__transport *tr, const char *reason) {
  shm_tr *t = (shm_tr *)tr;
  if (!atomic_exchange(&t->hdr->aborted, 1)) {
    snprintf(t->hdr->reason, sizeof t->hdr->reason, "rank %d failed: %s", tr->rank, reason);
    t->hdr->abort_status = tr->comm->fail_status ? (int32_t)tr->comm->fail_status : TDM_ERR_REMOTE;
  }
}

static void shm_destroy(tdm__transport *tr) {
  shm_tr *t = (shm_tr *)tr;
  if (t->base_ptr) munmap(t->base_ptr, t->total);
  tdm__store_close(t->store);
  tdm__free(t);
}

static void shm_announce(tdm__transport *tr, const tdm__call *call) {
  shm_tr *t = (shm_tr *)tr;
  rank_ctl *me = &t->ctl[tr->rank];
  me->call_kind = call->kind;
  me->call_dtype = call->dtype;
  me->call_op = call->op;
  me->call_root = call->root;
  me->call_count = call->count;
  atomic_store_explicit(&me->call_seq, call->seq, memory_order_release);
}

static const tdm__transport_ops shm_ops = {"shm", run, shm_abort, shm_destroy, shm_announce};

/* ---- the shared-memory all-reduce ---------------------------------------------------------- */
static tdm_status wait_counter(shm_tr *t, counter *ctr, uint64_t want, int peer, double deadline) {
  waiter w = {0, 0};
  while (atomic_load_explicit(&ctr->v, memory_order_acquire) < want) TDM__TRY(idle(t, &w, peer, deadline));
  return TDM_OK;
}

/* Rounds of at most slot_bytes per rank. In round k (double-buffered by parity):
 *   1. wait until every rank finished round k-2, which used the same slots;
 *   2. copy my input chunk into my slot, publish ready = k;
 *   3. small chunks: every rank sums all slots itself in rank order; large chunks: I sum share
 *      r of every slot (in rank order) into my slot's share r, publish done = k, then copy every
 *      rank's reduced share into my output;
 *   4. publish fin = k.
 * Every element is summed in rank order 0..P-1 whoever sums it, so all ranks agree bit for bit. */
tdm_status tdm__allreduce_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op) {
  if (c->map || !c->tr || c->tr->ops != &shm_ops)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "all-reduce: algorithm 'shm' needs the shm transport on a whole communicator");
  shm_tr *t = (shm_tr *)c->tr;
  int P = c->size, me = c->rank;
  size_t es = tdm_dtype_size(dt), per_round = t->slot_bytes / es;
  double deadline = tdm_time_now() + c->timeout_s;
  const char *in = sendbuf;
  char *out = recvbuf;
  size_t done_elems = 0;
  do {
    size_t n = count - done_elems < per_round ? count - done_elems : per_round;
    uint64_t k = ++t->round;
    int par = (int)(k & 1);
    for (int q = 0; q < P && k > 2; q++) TDM__TRY(wait_counter(t, &t->ctl[q].fin, k - 2, q, deadline));
    unsigned char *mine = slot(t, par, me);
    shm_copy(mine, in + done_elems * es, n * es);
    atomic_store_explicit(&t->ctl[me].ready.v, k, memory_order_release);
    for (int q = 0; q < P; q++) TDM__TRY(wait_counter(t, &t->ctl[q].ready, k, q, deadline));
    char *dst = out + done_elems * es;
    if (n * es <= 32768 || n < (size_t)P * 16) {
      shm_copy(dst, slot(t, par, 0), n * es); /* the same order on every rank: 0, 1, ..., P-1 */
      for (int q = 1; q < P; q++) tdm_reduce_local(dst, slot(t, par, q), n, dt, op);
    } else {
      size_t base = n / (size_t)P, extra = n % (size_t)P;
      size_t lo = (size_t)me * base + ((size_t)me < extra ? (size_t)me : extra), len = base + ((size_t)me < extra);
      /* my share: accumulate in my output, then publish it in my slot's share */
      shm_copy(dst + lo * es, slot(t, par, 0) + lo * es, len * es);
      for (int q = 1; q < P; q++) tdm_reduce_local(dst + lo * es, slot(t, par, q) + lo * es, len, dt, op);
      for (int q = 0; q < P; q++) /* nobody may still be reading my share of my own slot */
        if (q != me) TDM__TRY(wait_counter(t, &t->ctl[q].ready, k, q, deadline));
      shm_copy(mine + lo * es, dst + lo * es, len * es);
      atomic_store_explicit(&t->ctl[me].done.v, k, memory_order_release);
      for (int q = 0; q < P; q++) {
        if (q == me) continue;
        size_t qlo = (size_t)q * base + ((size_t)q < extra ? (size_t)q : extra), qlen = base + ((size_t)q < extra);
        TDM__TRY(wait_counter(t, &t->ctl[q].done, k, q, deadline));
        shm_copy(dst + qlo * es, slot(t, par, q) + qlo * es, qlen * es);
      }
    }
    atomic_store_explicit(&t->ctl[me].fin.v, k, memory_order_release);
    done_elems += n;
  } while (done_elems < count);
  return TDM_OK;
}

/* ---- set-up -------------------------------------------------------------------------------- */
tdm_status tdm__shm_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  int P = c->size, me = c->rank;
  const char *lws = getenv("LOCAL_WORLD_SIZE");
  if (lws && atoi(lws) != P)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "the shm transport needs all %d ranks on one node, but LOCAL_WORLD_SIZE is %s; use tcp", P, lws);
  shm_tr *t = tdm__calloc(1, sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "shm: out of memory");
  t->base.ops = &shm_ops;
  t->base.comm = c;
  t->base.rank = me;
  t->base.size = P;
  t->ring_bytes = align_up((size_t)(2 << 20) / (size_t)P, 4096);
  if (t->ring_bytes < (64 << 10)) t->ring_bytes = 64 << 10;
  t->slot_bytes = SLOT_BYTES;
  size_t off_ctl = align_up(sizeof(seg_hdr), 4096);
  size_t off_rctl = align_up(off_ctl + sizeof(rank_ctl) * (size_t)P, 4096);
  size_t off_rings = align_up(off_rctl + sizeof(ring_ctl) * (size_t)P * (size_t)P, 4096);
  size_t off_slots = off_rings + t->ring_bytes * (size_t)P * (size_t)P;
  t->total = off_slots + 2 * t->slot_bytes * (size_t)P;
  double deadline = tdm_time_now() + c->timeout_s;
  char name[128];
  tdm_status st = tdm__store_open(&t->store, cfg, c->timeout_s);
  int fd = -1;
  if (st == TDM_OK && me == 0) {
    snprintf(name, sizeof name, "/tandem-%d-%llx", (int)getpid(), (unsigned long long)tdm_hash64((uint64_t)getpid(), (uint64_t)(tdm_time_now() * 1e9)));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int fa = 0;
    if (fd < 0 || ftruncate(fd, (off_t)t->total) != 0)
      st = tdm__set_error(TDM_ERR_SYSTEM, "shm: cannot create %s (%zu bytes): %s", name, t->total, strerror(errno));
    else if ((fa = posix_fallocate(fd, 0, (off_t)t->total)) != 0) /* fail now, not SIGBUS on first touch */
      st = tdm__set_error(TDM_ERR_SYSTEM,
                          "shm: cannot reserve %zu bytes in /dev/shm: %s (a container's /dev/shm may be too small: "
                          "docker run --shm-size; or use TANDEM_TRANSPORT=tcp)", t->total, strerror(fa));
    if (st == TDM_OK) st = tdm__store_set(t->store, "shm/name", name, strlen(name));
    else { /* tell the others why, so every rank reports the cause rather than a closed store */
      char why[600];
      snprintf(why, sizeof why, "!%s", tdm_last_error());
      tdm__store_set(t->store, "shm/name", why, strlen(why));
      tdm__set_error(st, "%s", why + 1);
    }
  } else if (st == TDM_OK) {
    void *v;
    size_t n;
    st = tdm__store_get(t->store, "shm/name", &v, &n, c->timeout_s);
    if (st == TDM_OK && n > 0 && ((char *)v)[0] == '!') {
      st = tdm__set_error(TDM_ERR_REMOTE, "rank 0 could not set up shared memory: %.*s", (int)n - 1, (char *)v + 1);
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
    t->rings = t->base_ptr + off_rings;
    t->slots = t->base_ptr + off_slots;
    if (me == 0) { /* a new file is zero-filled: counters and rings start empty */
      t->hdr->size = P;
      t->hdr->ring_bytes = t->ring_bytes;
      t->hdr->slot_bytes = t->slot_bytes;
      t->hdr->total = t->total;
      t->hdr->version = 1;
      atomic_thread_fence(memory_order_release);
      t->hdr->magic = SHM_MAGIC;
    } else {
      waiter w = {0, 0};
      while (((volatile seg_hdr *)t->hdr)->magic != SHM_MAGIC && st == TDM_OK) st = idle(t, &w, 0, deadline);
      if (st == TDM_OK && (t->hdr->size != P || t->hdr->total != t->total))
        st = tdm__set_error(TDM_ERR_MISMATCH, "shm: segment %s is for %d ranks / %llu bytes; this rank expects %d / %zu",
                            name, t->hdr->size, (unsigned long long)t->hdr->total, P, t->total);
    }
  }
  if (st == TDM_OK) {
    atomic_store(&t->ctl[me].pid, (int32_t)getpid());
    atomic_fetch_add(&t->hdr->attached, 1);
    if (me == 0) { /* once everyone has it mapped, the name can go: nothing is left behind */
      waiter w = {0, 0};
      while (atomic_load(&t->hdr->attached) < P && st == TDM_OK) st = idle(t, &w, -1, deadline);
      shm_unlink(name);
    }
  }
  if (st != TDM_OK) {
    tdm_status e = tdm__set_error(st, "%s", tdm_last_error());
    if (me == 0 && fd >= 0) shm_unlink(name);
    shm_destroy(&t->base);
    return e;
  }
  tdm_log(TDM_LOG_INFO, "shm: rank %d mapped %zu bytes (%s)", me, t->total, name);
  *out = &t->base;
  return TDM_OK;
}

/* ---- shared regions: zero-copy all-reduce of data that lives in shared memory ---------------
 * A region is one extra segment holding P equal areas, one per rank, plus two progress counters
 * per rank. Data parallelism keeps each rank's gradients in its area, so averaging a bucket needs
 * no copy in or out: each rank sums its share of the bucket across all areas (in rank order, as
 * every other all-reduce here) and writes the result into all of them. Per rank that reads and
 * writes the bucket once, where the slot all-reduce above copies it in, reduces and copies it out
 * (about 8 bytes of loads and stores per byte against 3, by count). */
struct tdm__shm_region {
  shm_tr *t;
  unsigned char *base;
  size_t total, area_bytes;
  counter *ready, *done; /* [P] each */
  uint64_t round;
};

static float *area(tdm__shm_region *r, int q) {
  return (float *)(r->base + 2 * sizeof(counter) * (size_t)r->t->base.size + (size_t)q * r->area_bytes);
}

/* Waits until every rank's counter reaches want, with idle()'s back-off and checks. */
static tdm_status region_wait(tdm__shm_region *r, counter *ctr, uint64_t want, double deadline) {
  for (int q = 0; q < r->t->base.size; q++) {
    waiter w = {0, 0};
    while (atomic_load_explicit(&ctr[q].v, memory_order_acquire) < want)
      TDM__TRY(idle_for(r->t, &w, q, deadline, "a gradient all-reduce"));
  }
  return TDM_OK;
}

tdm_status tdm__shm_region_create(struct tdm_comm *c, size_t floats_per_rank, tdm__shm_region **out) {
  *out = NULL;
  if (c->map || !c->tr || c->tr->ops != &shm_ops)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "shared region: needs the shm transport on a whole communicator");
  shm_tr *t = (shm_tr *)c->tr;
  int P = c->size, me = c->rank;
  tdm__shm_region *r = tdm__calloc(1, sizeof *r);
  if (!r) return tdm__set_error(TDM_ERR_NO_MEMORY, "shared region: out of memory");
  r->t = t;
  r->area_bytes = align_up(floats_per_rank * sizeof(float), 4096);
  r->total = 2 * sizeof(counter) * (size_t)P + (size_t)P * r->area_bytes;
  char name[128] = {0};
  int fd = -1, ok = 1;
  if (me == 0) {
    snprintf(name, sizeof name, "/tandem-r-%d-%llx", (int)getpid(),
             (unsigned long long)tdm_hash64((uint64_t)getpid(), (uint64_t)(tdm_time_now() * 1e9)));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    /* reserve the pages now: a tmpfs too small for them (a container's 64 MB /dev/shm) then fails
     * here, and every rank falls back to the copying all-reduce, instead of SIGBUS on first touch */
    if (fd < 0 || ftruncate(fd, (off_t)r->total) != 0 || posix_fallocate(fd, 0, (off_t)r->total) != 0) ok = 0;
  }
  /* every rank learns the name, maps it, and all agree before anyone relies on it */
  tdm_status st = tdm_comm_broadcast(c, name, sizeof name, TDM_U8, 0, TDM_ALGO_AUTO);
  if (st == TDM_OK && me != 0 && name[0]) fd = shm_open(name, O_RDWR, 0600);
  if (st == TDM_OK && fd >= 0) {
    r->base = mmap(NULL, r->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r->base == MAP_FAILED) r->base = NULL;
  }
  if (fd >= 0) close(fd);
  int32_t mapped = st == TDM_OK && ok && r->base != NULL, all = 0;
  if (st == TDM_OK) st = tdm_comm_allreduce(c, &mapped, &all, 1, TDM_I32, TDM_MIN, TDM_ALGO_AUTO);
  if (me == 0 && name[0]) shm_unlink(name); /* mapped by all (or given up): nothing left behind */
  if (st == TDM_OK && !all)
    st = tdm__set_error(TDM_ERR_SYSTEM, "shared region: some rank could not reserve %zu bytes in /dev/shm (too small?)",
                        r->total);
  if (st != TDM_OK) {
    tdm__shm_region_destroy(r);
    return st;
  }
  r->ready = (counter *)r->base;
  r->done = r->ready + P;
  *out = r;
  return TDM_OK;
}

void tdm__shm_region_destroy(tdm__shm_region *r) {
  if (!r) return;
  if (r->base) munmap(r->base, r->total);
  tdm__free(r);
}

float *tdm__shm_region_mine(tdm__shm_region *r) { return area(r, r->t->base.rank); }

tdm_status tdm__shm_region_allreduce(tdm__shm_region *r, size_t lo, size_t hi, int average) {
  shm_tr *t = r->t;
  int P = t->base.size, me = t->base.rank;
  double deadline = tdm_time_now() + t->base.comm->timeout_s;
  uint64_t k = ++r->round;
  atomic_store_explicit(&r->ready[me].v, k, memory_order_release);
  TDM__TRY(region_wait(r, r->ready, k, deadline));
  /* my share of [lo, hi), in blocks that stay in L1 */
  size_t n = hi - lo, base = n / (size_t)P, extra = n % (size_t)P;
  size_t s0 = lo + (size_t)me * base + ((size_t)me < extra ? (size_t)me : extra), len = base + ((size_t)me < extra);
  float ranks = (float)P;
  enum { BLK = 2048 };
  float acc[BLK];
  for (size_t b = s0; b < s0 + len; b += BLK) {
    size_t m = s0 + len - b < BLK ? s0 + len - b : BLK;
    const float *a0 = area(r, 0) + b;
    for (size_t i = 0; i < m; i++) acc[i] = a0[i];
    for (int q = 1; q < P; q++) {
      const float *aq = area(r, q) + b;
      for (size_t i = 0; i < m; i++) acc[i] += aq[i];
    }
    if (average)
      for (size_t i = 0; i < m; i++) acc[i] /= ranks; /* as tdm__scale_avg: sum, then divide */
    for (int q = 0; q < P; q++) memcpy(area(r, q) + b, acc, m * sizeof(float));
  }
  atomic_store_explicit(&r->done[me].v, k, memory_order_release);
  return region_wait(r, r->done, k, deadline);
}
