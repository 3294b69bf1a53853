/* Shared buffers: collectives on data that lives in memory every rank maps (tandem/comm.h).
 *
 * A buffer is one mapping from the transport (its shared_map op: a segment in /dev/shm for the
 * shm transport, plain memory for the thread transport) laid out as
 *   ready[P], done[P]   progress counters, a cache line each
 *   id[P]               the operation each rank is in (a cache line each)
 *   area[P]             one f32 area per rank, page-aligned
 * Data parallelism keeps each rank's gradients in its area, so averaging a bucket needs no copy
 * in or out: each rank sums its share of the span across all areas (in rank order, as every other
 * reduction of tandem's) and writes the result where the operation says. Per rank that reads and
 * writes the span once, where a message or slot collective copies it in, reduces and copies it
 * out (about 8 bytes of loads and stores per byte against 3, by count).
 *
 * An operation: publish what I do (ready = round), wait for every rank's ready, compare every
 * rank's identity with mine before touching a peer's area, do my share, publish done = round,
 * and wait until every rank is done (nobody reads my area any more: the caller may write it).
 * Operations keep their own rounds and use none of the communicator's call state, so they may
 * run on another thread beside the communicator's other collectives. Waits go through the
 * transport's shared_wait (its deadline, abort and dead-peer checks). */
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

#define LINE 64

typedef struct {
  _Atomic uint64_t v;
  char pad[LINE - 8];
} counter;

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER };
static const char *const op_names[] = {"shared-buffer all-reduce", "shared-buffer reduce-scatter",
                                       "shared-buffer all-gather"};

typedef struct {
  uint64_t round, lo, hi, cuts; /* cuts: a hash of the pieces (0: the even blocks) */
  uint32_t op, average;
  char pad[LINE - 40];
} op_id;
_Static_assert(sizeof(op_id) == LINE, "one identity per cache line");

typedef struct tdm_shared tdm_shared;
struct tdm_shared {
  struct tdm_comm *c;
  unsigned char *base;
  size_t total, area_bytes, floats;
  counter *ready, *done; /* [P] each */
  op_id *id;             /* [P] */
  uint64_t round;
};

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t header_bytes(int P) { return align_up((2 * sizeof(counter) + sizeof(op_id)) * (size_t)P, 4096); }

static float *area(const tdm_shared *s, int q) {
  return (float *)(s->base + header_bytes(s->c->size) + (size_t)q * s->area_bytes);
}

int tdm__shared_usable(const struct tdm_comm *c) {
  /* a communicator over all of its transport's ranks, and no emulated network (which the
   * buffers would bypass: their data moves through no link) */
  return c && c->tr && c->tr->ops->shared_map && !c->map && !c->emu_link_free;
}

tdm_status tdm_shared_create(tdm_comm_t c, size_t floats_per_rank, tdm_shared_t *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "shared_create: out is NULL");
  *out = NULL;
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "shared_create: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
  if (!tdm__shared_usable(c))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "shared buffer: the %s transport's ranks share no memory%s",
                          tdm_transport_name(c->kind),
                          c->tr && c->tr->ops->shared_map ? (c->map ? " on a sub-communicator (it needs all of the transport's ranks)"
                                                                    : " the network emulation could see (TANDEM_NET_EMULATE)")
                                                          : " (shared buffers need the shm or thread transport)");
  if (floats_per_rank > ((size_t)1 << 40) / sizeof(float)) /* its bytes times the ranks would wrap */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "shared_create: %zu floats per rank; expected at most 2^38 (1 TiB)", floats_per_rank);
  tdm_shared *s = tdm__calloc(1, sizeof *s);
  if (!s) return tdm__set_error(TDM_ERR_NO_MEMORY, "shared buffer: out of memory");
  int P = c->size;
  s->c = c;
  s->floats = floats_per_rank;
  s->area_bytes = align_up(floats_per_rank * sizeof(float), 4096);
  s->total = header_bytes(P) + (size_t)P * s->area_bytes;
  void *base = NULL;
  c->tr->active = c;
  tdm_status st = c->tr->ops->shared_map(c->tr, c, s->total, &base);
  if (st != TDM_OK) {
    tdm__free(s);
    return st;
  }
  s->base = base;
  s->ready = (counter *)s->base;
  s->done = s->ready + P;
  s->id = (op_id *)(s->done + P);
  *out = s;
  return TDM_OK;
}

void tdm_shared_destroy(tdm_shared_t s) {
  if (!s) return;
  if (s->base) s->c->tr->ops->shared_unmap(s->c->tr, s->base, s->total);
  tdm__free(s);
}

float *tdm_shared_mine(tdm_shared_t s) { return s ? area(s, s->c->rank) : NULL; }
size_t tdm_shared_floats(tdm_shared_t s) { return s ? s->floats : 0; }

/* An operation failed with st (detail in tdm_last_error): fail the communicator, wake every peer. */
static tdm_status fail(tdm_shared *s, tdm_status st) {
  struct tdm_comm *c = s->c;
  if (!atomic_load(&c->failed)) tdm__comm_fail(c, st, "%s", tdm_last_error());
  c->tr->ops->abort(c->tr, c->error);
  return tdm__comm_error(c);
}

static const char *id_str(const op_id *id, char *buf, size_t n) {
  snprintf(buf, n, "%s round %llu (elements [%llu, %llu)%s%s)", op_names[id->op], (unsigned long long)id->round,
           (unsigned long long)id->lo, (unsigned long long)id->hi, id->cuts ? ", uneven pieces" : "",
           id->op == OP_ALLGATHER ? "" : (id->average ? ", average" : ", sum"));
  return buf;
}

/* Waits until every rank's counter reaches want. */
static tdm_status wait_all(tdm_shared *s, counter *ctr, uint64_t want, double deadline, const char *what) {
  struct tdm_comm *c = s->c;
  for (int q = 0; q < c->size; q++) {
    tdm__waiter w = {0};
    while (atomic_load_explicit(&ctr[q].v, memory_order_acquire) < want)
      TDM__TRY(c->tr->ops->shared_wait(c->tr, &w, c, q, deadline, what));
  }
  return TDM_OK;
}

/* Piece q of [lo, hi): cut[q] .. cut[q + 1] when the caller cuts, else the even blocks. */
static void piece(const tdm_shared *s, size_t lo, size_t hi, const int64_t *cut, int q, size_t *at, size_t *len) {
  if (cut) {
    *at = (size_t)cut[q], *len = (size_t)(cut[q + 1] - cut[q]);
    return;
  }
  size_t off;
  tdm_comm_block(hi - lo, s->c->size, q, &off, len);
  *at = lo + off;
}

static uint64_t cuts_hash(const int64_t *cut, int P) {
  if (!cut) return 0;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int q = 0; q <= P; q++) h = tdm_hash64(h, (uint64_t)cut[q]);
  return h | 1;
}

static tdm_status check_args(const tdm_shared *s, int op, size_t lo, size_t hi, const int64_t *cut) {
  if (lo > hi || hi > s->floats)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: elements [%zu, %zu) do not lie within the %zu of an area", op_names[op],
                          lo, hi, s->floats);
  if (!cut) return TDM_OK;
  int P = s->c->size;
  if (cut[0] != (int64_t)lo || cut[P] != (int64_t)hi)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the pieces run from %lld to %lld; expected them to cover [%zu, %zu)",
                          op_names[op], (long long)cut[0], (long long)cut[P], lo, hi);
  for (int q = 0; q < P; q++)
    if (cut[q + 1] < cut[q])
      return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: piece %d ends at %lld before it starts at %lld", op_names[op], q,
                            (long long)cut[q + 1], (long long)cut[q]);
  return TDM_OK;
}

static tdm_status run_op(tdm_shared *s, int op, size_t lo, size_t hi, const int64_t *cut, int average) {
  if (!s) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the buffer is NULL", op_names[op]);
  struct tdm_comm *c = s->c;
  int P = c->size, me = c->rank;
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
  TDM__TRY(check_args(s, op, lo, hi, cut));
  double deadline = tdm_time_now() + c->timeout_s;
  op_id *my = &s->id[me];
  *my = (op_id){.round = ++s->round, .lo = lo, .hi = hi, .cuts = cuts_hash(cut, P), .op = (uint32_t)op,
                .average = average != 0};
  char what[200], theirs[200];
  id_str(my, what, sizeof what);
  uint64_t k = my->round;
  atomic_store_explicit(&s->ready[me].v, k, memory_order_release);
  tdm_status st = wait_all(s, s->ready, k, deadline, what);
  for (int q = 0; q < P && st == TDM_OK; q++) { /* nobody rewrites its identity before my done = k */
    const op_id *id = &s->id[q];
    if (q != me && (id->round != k || id->op != my->op || id->lo != lo || id->hi != hi || id->cuts != my->cuts ||
                    id->average != my->average))
      st = tdm__comm_fail(c, TDM_ERR_MISMATCH, "shared-buffer mismatch: rank %d called %s but rank %d called %s", me, what,
                          q, id_str(id, theirs, sizeof theirs));
  }
  if (st != TDM_OK) return fail(s, st);
  size_t s0, len;
  piece(s, lo, hi, cut, me, &s0, &len);
  /* as tdm_comm_bytes_sent counts: the peers' pieces of my area (reductions), my sums written
   * into every peer's area (all-reduce), my piece copied by every peer (all-gather) */
  size_t peers_read = op == OP_ALLGATHER ? 0 : hi - lo - len, mine_out = op == OP_REDUCE_SCATTER ? 0 : (size_t)(P - 1) * len;
  tdm__count_sent(c, (peers_read + mine_out) * sizeof(float));
  if (op == OP_ALLGATHER) {
    for (int q = 0; q < P; q++) {
      size_t qat, qlen;
      piece(s, lo, hi, cut, q, &qat, &qlen);
      if (q != me && qlen) memcpy(area(s, me) + qat, area(s, q) + qat, qlen * sizeof(float));
    }
  } else { /* my piece, in blocks that stay in L1 */
    float ranks = (float)P;
    enum { BLK = 2048 };
    float acc[BLK];
    for (size_t b = s0; b < s0 + len; b += BLK) {
      size_t m = s0 + len - b < BLK ? s0 + len - b : BLK;
      const float *a0 = area(s, 0) + b;
      for (size_t i = 0; i < m; i++) acc[i] = a0[i];
      for (int q = 1; q < P; q++) {
        const float *aq = area(s, q) + b;
        for (size_t i = 0; i < m; i++) acc[i] += aq[i];
      }
      if (average)
        for (size_t i = 0; i < m; i++) acc[i] /= ranks; /* as tdm__scale_avg: sum, then divide */
      if (op == OP_ALLREDUCE)
        for (int q = 0; q < P; q++) memcpy(area(s, q) + b, acc, m * sizeof(float));
      else
        memcpy(area(s, me) + b, acc, m * sizeof(float));
    }
  }
  atomic_store_explicit(&s->done[me].v, k, memory_order_release);
  st = wait_all(s, s->done, k, deadline, what);
  return st == TDM_OK ? TDM_OK : fail(s, st);
}

tdm_status tdm_shared_allreduce(tdm_shared_t s, size_t lo, size_t hi, int average) {
  return run_op(s, OP_ALLREDUCE, lo, hi, NULL, average);
}
tdm_status tdm_shared_reduce_scatter(tdm_shared_t s, size_t lo, size_t hi, const int64_t *cut, int average) {
  return run_op(s, OP_REDUCE_SCATTER, lo, hi, cut, average);
}
tdm_status tdm_shared_allgather(tdm_shared_t s, size_t lo, size_t hi, const int64_t *cut) {
  return run_op(s, OP_ALLGATHER, lo, hi, cut, 0);
}
