/* All-reduce algorithms. Each works in place on buf and leaves every rank with bit-identical
 * results (IEEE addition and multiplication are commutative, and each partial sum is formed in
 * the same order on every rank that forms it). Steps and bytes: docs/algorithms.md. */
#include <string.h>

#include "comm/comm_impl.h"

#define CHUNK_BYTES ((size_t)1 << 20) /* bounds the scratch a step needs */

/* Sends sn elements to `to` while receiving rn elements from `from` and reducing them into
 * dst, in chunks so the scratch stays small. to / from = -1: no send / no receive. Zero-length
 * transfers still happen: every message a peer sends must be received in the same collective.
 * The chunks change when an element is reduced, never the order of its operands. */
tdm_status tdm__sendrecv_reduce(struct tdm_comm *c, int to, const char *sbuf, size_t sn, int from, char *dst,
                                size_t rn, tdm_dtype dt, tdm_redop op) {
  size_t es = tdm_dtype_size(dt), per = CHUNK_BYTES / es;
  char *tmp = tdm__comm_scratch(c, (rn < per ? rn : per) * es + 64);
  if (!tmp) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "out of memory for collective scratch");
  size_t si = 0, ri = 0;
  int first = 1;
  while (first || (to >= 0 && si < sn) || (from >= 0 && ri < rn)) {
    size_t sk = sn - si < per ? sn - si : per, rk = rn - ri < per ? rn - ri : per;
    tdm__xfer x[2];
    int k = 0;
    memset(x, 0, sizeof x);
    if (to >= 0 && (si < sn || first))
      x[k++] = (tdm__xfer){.peer = to, .is_send = 1, .buf = (void *)(sbuf + si * es), .nbytes = sk * es};
    if (from >= 0 && (ri < rn || first)) x[k++] = (tdm__xfer){.peer = from, .is_send = 0, .buf = tmp, .nbytes = rk * es};
    if (k) TDM__TRY(tdm__exchange(c, x, k));
    if (from >= 0 && rk) tdm_reduce_local(dst + ri * es, tmp, rk, dt, op);
    si += sk;
    ri += rk;
    first = 0;
  }
  return TDM_OK;
}

/* The sending half of sendrecv_reduce: the same chunks, so the receiver's sizes match. */
static tdm_status send_chunked(struct tdm_comm *c, int to, const char *buf, size_t n, tdm_dtype dt) {
  return tdm__sendrecv_reduce(c, to, buf, n, -1, NULL, 0, dt, TDM_SUM);
}

/* Reduce-scatter then all-gather around the ring, literally: block r of tdm__blocks(count, P)
 * is reduced onto rank r and passed on, so tdm_comm_reduce_scatter by ring gives rank r the very
 * bits this leaves in block r. */
tdm_status tdm__allreduce_ring(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  if (c->size == 1) return TDM_OK;
  size_t cnt[c->size], off[c->size];
  tdm__blocks(count, c->size, cnt, off);
  TDM__TRY(tdm__reduce_scatter_ring(c, buf, cnt, off, dt, op));
  return tdm__allgather_ring(c, buf, cnt, off, dt);
}

/* Direct reduce-scatter then direct all-gather over tdm__blocks: every element summed in rank
 * order, so the bits are the shm all-reduce's, and any partition's reduce-scatter's. */
tdm_status tdm__allreduce_direct(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  if (c->size == 1) return TDM_OK;
  size_t cnt[c->size], off[c->size], es = tdm_dtype_size(dt);
  tdm__blocks(count, c->size, cnt, off);
  char *mine = count ? (char *)buf + off[c->rank] * es : buf; /* an empty buffer may be NULL */
  TDM__TRY(tdm__reduce_scatter_direct(c, buf, mine, cnt, off, dt, op));
  return tdm__allgather_direct(c, mine, buf, cnt, off, dt);
}

/* Non-powers of two fold: the first 2*rem ranks pair up, the even one hands its data to the odd
 * one and sits out; the p2 = P - rem survivors run the power-of-two algorithm on "new" ranks. */
typedef struct {
  int p2, rem, newrank; /* newrank -1: sitting out */
} fold;

static fold make_fold(int P, int r) {
  fold f;
  f.p2 = 1;
  while (f.p2 * 2 <= P) f.p2 *= 2;
  f.rem = P - f.p2;
  if (r < 2 * f.rem) f.newrank = (r % 2) ? r / 2 : -1;
  else f.newrank = r - f.rem;
  return f;
}
static int old_rank(const fold *f, int nr) { return nr < f->rem ? 2 * nr + 1 : nr + f->rem; }

static tdm_status fold_in(struct tdm_comm *c, const fold *f, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  int r = c->rank;
  if (r >= 2 * f->rem) return TDM_OK;
  if (f->newrank < 0) return send_chunked(c, r + 1, buf, count, dt);
  return tdm__sendrecv_reduce(c, -1, NULL, 0, r - 1, buf, count, dt, op);
}

static tdm_status fold_out(struct tdm_comm *c, const fold *f, void *buf, size_t nbytes) {
  int r = c->rank;
  if (r >= 2 * f->rem) return TDM_OK;
  if (f->newrank < 0) return tdm__recv(c, r + 1, buf, nbytes);
  return tdm__send(c, r - 1, buf, nbytes);
}

tdm_status tdm__allreduce_rd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  if (c->size == 1) return TDM_OK;
  fold f = make_fold(c->size, c->rank);
  TDM__TRY(fold_in(c, &f, buf, count, dt, op));
  if (f.newrank >= 0)
    for (int mask = 1; mask < f.p2; mask <<= 1) {
      int partner = old_rank(&f, f.newrank ^ mask);
      TDM__TRY(tdm__sendrecv_reduce(c, partner, buf, count, partner, buf, count, dt, op));
    }
  return fold_out(c, &f, buf, count * tdm_dtype_size(dt));
}

/* Folded to a power of two, then reduce-scatter by recursive halving and all-gather by recursive
 * doubling (algo/scatter_gather.c), over blocks of tdm__blocks(count, p2). */
tdm_status tdm__allreduce_rhd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  if (c->size == 1) return TDM_OK;
  fold f = make_fold(c->size, c->rank);
  size_t es = tdm_dtype_size(dt);
  TDM__TRY(fold_in(c, &f, buf, count, dt, op));
  if (f.newrank >= 0) {
    int p2 = f.p2, old[p2];
    size_t cnt[p2], off[p2];
    for (int i = 0; i < p2; i++) old[i] = old_rank(&f, i);
    tdm__blocks(count, p2, cnt, off);
    TDM__TRY(tdm__rhd_halving(c, f.newrank, p2, old, buf, cnt, off, dt, op));
    TDM__TRY(tdm__rd_doubling(c, f.newrank, p2, old, buf, cnt, off, es));
  }
  return fold_out(c, &f, buf, count * es);
}

/* Binary tree rooted at rank 0: reduce up, then broadcast down the same tree. */
tdm_status tdm__allreduce_tree(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  int P = c->size, r = c->rank;
  if (P == 1) return TDM_OK;
  size_t nbytes = count * tdm_dtype_size(dt);
  for (int k = 1; k <= 2; k++) {
    int child = 2 * r + k;
    if (child < P) TDM__TRY(tdm__sendrecv_reduce(c, -1, NULL, 0, child, buf, count, dt, op));
  }
  if (r > 0) {
    TDM__TRY(send_chunked(c, (r - 1) / 2, buf, count, dt));
    TDM__TRY(tdm__recv(c, (r - 1) / 2, buf, nbytes));
  }
  for (int k = 1; k <= 2; k++) {
    int child = 2 * r + k;
    if (child < P) TDM__TRY(tdm__send(c, child, buf, nbytes));
  }
  return TDM_OK;
}
