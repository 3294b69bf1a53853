/* The collectives: argument checks, the call's identity (sequence number and header), the choice
 * of algorithm (the caller's, TANDEM_ALGO's, else the AUTO rule of each collective) and dispatch
 * through the algorithm table (algos.c); gather, scatter and all-to-all, which have one (direct)
 * algorithm, are here. */
#include <string.h>

#include "comm/comm_impl.h"
#include "tandem/trace.h"

/* ---- argument checks and dispatch ---------------------------------------------------------- */
static tdm_status begin(struct tdm_comm *c, tdm__coll_kind kind, size_t count, tdm_dtype dt, tdm_redop op, int root) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: communicator is NULL", tdm__coll_name(kind));
  if (atomic_load(&c->failed)) return tdm__comm_error(c);
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
  c->tr_t0 = tdm_trace_begin();
  c->tr_algo = TDM_ALGO_AUTO;
  c->tr->active = c; /* sub-communicators too: their calls are checked like any other */
  return TDM_OK;
}

/* Publishes the call and how it runs, once the algorithm is chosen (before, a peer could see
 * this call with the wrong algorithm). */
static void announce(struct tdm_comm *c, tdm_algo algo) {
  c->tr_algo = algo;
  if (c->tr->ops->announce) c->tr->ops->announce(c->tr, &c->cur, algo == TDM_ALGO_SHM);
}

/* The collective that just ended as a span on the calling thread's row: what matches it across
 * ranks is (comm, seq). */
static tdm_status traced(struct tdm_comm *c, tdm_status st) {
  if (c && c->tr_t0 > 0) {
    if (tdm_trace_on()) {
      tdm_trace_args a = TDM_TRACE_ARGS_INIT;
      a.bytes = (int64_t)(c->cur.count * tdm_dtype_size((tdm_dtype)c->cur.dtype));
      a.seq = (int64_t)c->cur.seq, a.ranks = c->size, a.comm = c->comm_id;
      a.algo = tdm_algo_name((tdm_algo)c->tr_algo);
      tdm_trace_span("comm", tdm__coll_name((int)c->cur.kind), c->tr_t0, tdm_trace_now(), &a);
    }
    c->tr_t0 = 0;
  }
  return st;
}

static tdm_status null_buf(struct tdm_comm *c, const char *what) {
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s is NULL with a non-zero count", tdm__coll_name((int)c->cur.kind), what);
}

/* sendbuf and recvbuf of nbytes each: the same (in place) or apart; a partial overlap would have
 * the algorithms read what they already wrote */
static tdm_status overlap(struct tdm_comm *c, const void *sendbuf, const void *recvbuf, size_t nbytes) {
  const char *s = sendbuf, *r = recvbuf;
  if (!nbytes || s == r || s + nbytes <= r || r + nbytes <= s) return TDM_OK;
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: sendbuf and recvbuf overlap by part (%td bytes apart, %zu each); expected the same "
                        "buffer (in place) or two apart", tdm__coll_name((int)c->cur.kind), r - s, nbytes);
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


static tdm_status allreduce_(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op, tdm_algo algo) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_ALLREDUCE, count, dt, op, 0));
  if (count && (!sendbuf || !recvbuf)) return null_buf(c, "a buffer");
  size_t nbytes = count * tdm_dtype_size(dt);
  TDM__TRY(overlap(c, sendbuf, recvbuf, nbytes));
  algo = tdm__algo_pick(c, TDM_COLL_ALLREDUCE, algo);
  if (algo == TDM_ALGO_AUTO) {
    if (tdm__shm_usable(c)) algo = TDM_ALGO_SHM; /* reduce straight from shared memory */
    else if (tdm__hier_usable(c)) algo = TDM_ALGO_HIER; /* ranks on several nodes: shm inside each */
    else /* latency-bound: fewest steps; bandwidth-bound: ring */
      algo = nbytes <= 4096 ? TDM_ALGO_RD : (nbytes <= (256u << 10) ? TDM_ALGO_RHD : TDM_ALGO_RING);
  }
  if (!tdm__algo_applies(c, TDM_COLL_ALLREDUCE, algo)) return not_applicable(c, algo);
  announce(c, algo);
  tdm_status st = tdm__algos[algo].allreduce(c, sendbuf, recvbuf, count, dt, op);
  if (st == TDM_OK && op == TDM_AVG) tdm__scale_avg(recvbuf, count, dt, c->size);
  return st;
}
tdm_status tdm_comm_allreduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt, tdm_redop op,
                              tdm_algo algo) {
  return traced(c, allreduce_(c, sendbuf, recvbuf, count, dt, op, algo));
}

static tdm_status broadcast_(tdm_comm_t c, void *buf, size_t count, tdm_dtype dt, int root, tdm_algo algo) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_BROADCAST, count, dt, TDM_SUM, root));
  if (count && !buf) return null_buf(c, "buf");
  size_t nbytes = count * tdm_dtype_size(dt);
  algo = tdm__algo_pick(c, TDM_COLL_BROADCAST, algo);
  if (algo == TDM_ALGO_AUTO) algo = (nbytes >= (4u << 20) && c->size > 2) ? TDM_ALGO_CHAIN : TDM_ALGO_TREE;
  if (!tdm__algo_applies(c, TDM_COLL_BROADCAST, algo)) return not_applicable(c, algo);
  announce(c, algo);
  if (c->size == 1) return TDM_OK;
  TDM__TRY(agree(c));
  return tdm__algos[algo].broadcast(c, buf, nbytes, root);
}
tdm_status tdm_comm_broadcast(tdm_comm_t c, void *buf, size_t count, tdm_dtype dt, int root, tdm_algo algo) {
  return traced(c, broadcast_(c, buf, count, dt, root, algo));
}

static tdm_status reduce_(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt, tdm_redop op,
                           int root, tdm_algo algo) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_REDUCE, count, dt, op, root));
  if (count && (!sendbuf || (c->rank == root && !recvbuf))) return null_buf(c, "a buffer");
  if (c->rank == root) TDM__TRY(overlap(c, sendbuf, recvbuf, count * tdm_dtype_size(dt)));
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
  if (algo == TDM_ALGO_AUTO) algo = TDM_ALGO_TREE; /* the one reduce */
  tdm_status st = tdm__algos[algo].reduce(c, work, count, dt, op, root);
  if (c->rank != root) tdm__free(work);
  if (st == TDM_OK && op == TDM_AVG && c->rank == root) tdm__scale_avg(recvbuf, count, dt, c->size);
  return st;
}
tdm_status tdm_comm_reduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt, tdm_redop op,
                           int root, tdm_algo algo) {
  return traced(c, reduce_(c, sendbuf, recvbuf, count, dt, op, root, algo));
}

/* ---- blocks: reduce-scatter and all-gather -------------------------------------------------- */
void tdm__blocks(size_t count, int p, size_t *cnt, size_t *off) {
  for (int i = 0; i < p; i++) tdm_comm_block(count, p, i, &off[i], &cnt[i]);
}

void tdm_comm_block(size_t count, int size, int r, size_t *offset, size_t *len) {
  if (!offset || !len) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_comm_block: %s is NULL", !offset ? "offset" : "len");
    return;
  }
  if (size < 1 || r < 0 || r >= size) { /* no such block: an empty one, never a division by zero */
    *offset = *len = 0;
    return;
  }
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
static tdm_status reduce_scatter_(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                 tdm_dtype dt, tdm_redop op, tdm_algo algo) {
  TDM__TRY(tdm__wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "reduce-scatter: communicator is NULL");
  size_t cnt[c->size], off[c->size];
  TDM__TRY(parts_of(c, "reduce-scatter", count, parts, cnt, off));
  TDM__TRY(begin(c, TDM_COLL_REDUCE_SCATTER, count, dt, op, 0));
  if (parts) c->cur.root = parts_hash(parts, c->size);
  size_t es = tdm_dtype_size(dt), len = cnt[c->rank];
  if (count && (!sendbuf || (len && !recvbuf))) return null_buf(c, "a buffer");
  algo = tdm__algo_pick(c, TDM_COLL_REDUCE_SCATTER, algo);
  if (algo == TDM_ALGO_AUTO)
    algo = tdm__shm_usable(c) ? TDM_ALGO_SHM
                              : (!parts && tdm__pow2(c->size) && count * es <= (1u << 20) ? TDM_ALGO_RHD : TDM_ALGO_RING);
  if (!tdm__algo_applies(c, TDM_COLL_REDUCE_SCATTER, algo) ||
      (parts && (tdm__algos[algo].blocks_only & TDM__COLL_BIT(TDM_COLL_REDUCE_SCATTER))))
    return not_applicable(c, algo);
  announce(c, algo);
  tdm_status st = tdm__algos[algo].reduce_scatter(c, sendbuf, recvbuf, count, cnt, off, dt, op);
  if (st == TDM_OK && op == TDM_AVG) tdm__scale_avg(recvbuf, len, dt, c->size);
  return st;
}
static tdm_status reduce_scatter(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                 tdm_dtype dt, tdm_redop op, tdm_algo algo) {
  return traced(c, reduce_scatter_(c, sendbuf, recvbuf, count, parts, dt, op, algo));
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

static tdm_status allgather_(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                            tdm_dtype dt, tdm_algo algo) {
  TDM__TRY(tdm__wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "all-gather: communicator is NULL");
  size_t cnt[c->size], off[c->size];
  TDM__TRY(parts_of(c, "all-gather", count, parts, cnt, off));
  TDM__TRY(begin(c, TDM_COLL_ALLGATHER, count, dt, TDM_SUM, 0));
  if (parts) c->cur.root = parts_hash(parts, c->size);
  size_t es = tdm_dtype_size(dt), len = cnt[c->rank];
  if (count && (!recvbuf || (len && !sendbuf))) return null_buf(c, "a buffer");
  algo = tdm__algo_pick(c, TDM_COLL_ALLGATHER, algo);
  if (algo == TDM_ALGO_AUTO)
    algo = tdm__shm_usable(c) ? TDM_ALGO_SHM
                              : (!parts && tdm__pow2(c->size) && count * es <= (1u << 20) ? TDM_ALGO_RD : TDM_ALGO_RING);
  if (!tdm__algo_applies(c, TDM_COLL_ALLGATHER, algo) ||
      (parts && (tdm__algos[algo].blocks_only & TDM__COLL_BIT(TDM_COLL_ALLGATHER))))
    return not_applicable(c, algo);
  announce(c, algo);
  return tdm__algos[algo].allgather(c, sendbuf, recvbuf, count, cnt, off, dt);
}
static tdm_status allgather(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                            tdm_dtype dt, tdm_algo algo) {
  return traced(c, allgather_(c, sendbuf, recvbuf, count, parts, dt, algo));
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

tdm_algo tdm_comm_rank_order_algo(tdm_comm_t c) {
  TDM__NONNULL(c, TDM_ALGO_DIRECT, "tdm_comm_rank_order_algo: the communicator is NULL");
  return tdm__shm_usable(c) ? TDM_ALGO_SHM : TDM_ALGO_DIRECT;
}

static tdm_status gather_(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt, int root) {
  TDM__TRY(tdm__wait_queue_idle(c));
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
tdm_status tdm_comm_gather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt, int root) {
  return traced(c, gather_(c, sendbuf, recvbuf, sendcount, dt, root));
}

static tdm_status scatter_(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt, int root) {
  TDM__TRY(tdm__wait_queue_idle(c));
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
tdm_status tdm_comm_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt, int root) {
  return traced(c, scatter_(c, sendbuf, recvbuf, recvcount, dt, root));
}

static tdm_status alltoall_(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt) {
  TDM__TRY(tdm__wait_queue_idle(c));
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
tdm_status tdm_comm_alltoall(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt) {
  return traced(c, alltoall_(c, sendbuf, recvbuf, count, dt));
}

static tdm_status barrier_(tdm_comm_t c) {
  TDM__TRY(tdm__wait_queue_idle(c));
  TDM__TRY(begin(c, TDM_COLL_BARRIER, 0, TDM_U8, TDM_SUM, 0));
  announce(c, TDM_ALGO_AUTO);
  return agree(c);
}
tdm_status tdm_comm_barrier(tdm_comm_t c) {
  return traced(c, barrier_(c));
}

