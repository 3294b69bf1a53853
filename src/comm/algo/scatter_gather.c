/* Reduce-scatter and all-gather: by ring (any world size, any partition), by recursive halving /
 * doubling (powers of two, the blocks of tdm__blocks) and directly (any partition; every element
 * summed in rank order, as the shared-memory algorithms do). The ring, halving-doubling and direct
 * all-reduces are built from these (algo/allreduce.c). */
#include <string.h>

#include "comm/comm_impl.h"

tdm_status tdm__reduce_scatter_ring(struct tdm_comm *c, void *buf, const size_t *cnt, const size_t *off, tdm_dtype dt,
                                    tdm_redop op) {
  int P = c->size, r = c->rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  if (P == 1) return TDM_OK;
  size_t es = tdm_dtype_size(dt);
  char *b = buf;
  /* at step s rank r sends block r-s-1 and reduces block r-s-2: after P-1 steps it owns block r,
   * summed in ring order from rank r+1 to rank r */
  for (int s = 0; s < P - 1; s++) {
    int si = (r - s - 1 + 2 * P) % P, ri = (r - s - 2 + 2 * P) % P;
    TDM__TRY(tdm__sendrecv_reduce(c, next, b + off[si] * es, cnt[si], prev, b + off[ri] * es, cnt[ri], dt, op));
  }
  return TDM_OK;
}

tdm_status tdm__allgather_ring(struct tdm_comm *c, void *buf, const size_t *cnt, const size_t *off, tdm_dtype dt) {
  int P = c->size, r = c->rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  size_t es = tdm_dtype_size(dt);
  char *b = buf;
  for (int s = 0; s < P - 1; s++) {
    int si = (r - s + P) % P, ri = (r - s - 1 + P) % P;
    TDM__TRY(tdm__sendrecv(c, next, b + off[si] * es, cnt[si] * es, prev, b + off[ri] * es, cnt[ri] * es));
  }
  return TDM_OK;
}

/* The elements of blocks [lo, hi): from off[lo], up to the end of block hi-1. */
static size_t span(const size_t *cnt, const size_t *off, int lo, int hi) { return off[hi - 1] + cnt[hi - 1] - off[lo]; }

tdm_status tdm__rhd_halving(struct tdm_comm *c, int me, int p2, const int *old, char *buf, const size_t *cnt,
                            const size_t *off, tdm_dtype dt, tdm_redop op) {
  size_t es = tdm_dtype_size(dt);
  int lo = 0, hi = p2; /* I keep the half my bit selects and send the other: it ends at block me */
  for (int mask = p2 / 2; mask >= 1; mask /= 2) {
    int partner = old[me ^ mask], mid = lo + (hi - lo) / 2;
    int klo = (me & mask) ? mid : lo, khi = (me & mask) ? hi : mid;
    int slo = (me & mask) ? lo : mid, shi = (me & mask) ? mid : hi;
    TDM__TRY(tdm__sendrecv_reduce(c, partner, buf + off[slo] * es, span(cnt, off, slo, shi), partner, buf + off[klo] * es,
                                  span(cnt, off, klo, khi), dt, op));
    lo = klo;
    hi = khi;
  }
  return TDM_OK;
}

tdm_status tdm__rd_doubling(struct tdm_comm *c, int me, int p2, const int *old, char *buf, const size_t *cnt,
                            const size_t *off, size_t es) {
  for (int mask = 1; mask < p2; mask <<= 1) { /* the range I own doubles each step */
    int partner = old[me ^ mask], mine = me & ~(mask - 1), theirs = (me ^ mask) & ~(mask - 1);
    TDM__TRY(tdm__sendrecv(c, partner, buf + off[mine] * es, span(cnt, off, mine, mine + mask) * es, partner,
                           buf + off[theirs] * es, span(cnt, off, theirs, theirs + mask) * es));
  }
  return TDM_OK;
}

tdm_status tdm__reduce_scatter_rhd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  int P = c->size;
  if (!tdm__pow2(P))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, /* refused before any message: the communicator is fine */
                          "reduce-scatter by recursive halving needs a power-of-two world size, not %d (use ring)", P);
  int old[P];
  size_t cnt[P], off[P];
  for (int i = 0; i < P; i++) old[i] = i;
  tdm__blocks(count, P, cnt, off);
  return tdm__rhd_halving(c, c->rank, P, old, buf, cnt, off, dt, op);
}

tdm_status tdm__allgather_rd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt) {
  int P = c->size;
  if (!tdm__pow2(P))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "all-gather by recursive doubling needs a power-of-two world size, not %d (use ring)", P);
  int old[P];
  size_t cnt[P], off[P];
  for (int i = 0; i < P; i++) old[i] = i;
  tdm__blocks(count, P, cnt, off);
  return tdm__rd_doubling(c, c->rank, P, old, buf, cnt, off, tdm_dtype_size(dt));
}

/* Directly: every rank sends each other rank its part, then sums the P contributions to its own
 * part in rank order 0..P-1 (its own in its place), a chunk at a time so the scratch stays at P
 * chunks: the same bits as the shm algorithms and the shared buffers, whatever the partition and
 * the transport. recvbuf may be sendbuf + off[rank] (the rank's own chunk is set aside first). */
#define DIRECT_CHUNK_BYTES ((size_t)1 << 20)
tdm_status tdm__reduce_scatter_direct(struct tdm_comm *c, const void *sendbuf, void *recvbuf, const size_t *cnt,
                                      const size_t *off, tdm_dtype dt, tdm_redop op) {
  int P = c->size, r = c->rank;
  size_t es = tdm_dtype_size(dt), chunk = DIRECT_CHUNK_BYTES / es, rounds = 0, most = 1;
  for (int q = 0; q < P; q++) most = cnt[q] > most ? cnt[q] : most;
  if (chunk > most) chunk = most; /* scratch for P chunks: no more than the largest part needs */
  const char *in = sendbuf;
  char *out = recvbuf;
  if (P == 1) {
    if (cnt[0] && out != in + off[0] * es) memmove(out, in + off[0] * es, cnt[0] * es);
    return TDM_OK;
  }
  for (int q = 0; q < P; q++) rounds = (cnt[q] + chunk - 1) / chunk > rounds ? (cnt[q] + chunk - 1) / chunk : rounds;
  if (!rounds) rounds = 1; /* round 0 always meets every peer, empty parts too: every rank checks every call */
  char *tmp = tdm__comm_scratch(c, (size_t)P * chunk * es + 64); /* slot q: rank q's chunk; slot r: mine */
  if (!tmp) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "out of memory for collective scratch");
  tdm__xfer x[2 * P];
  for (size_t j = 0; j < rounds; j++) {
    size_t at = j * chunk, mine = at < cnt[r] ? (cnt[r] - at < chunk ? cnt[r] - at : chunk) : 0;
    int n = 0;
    for (int k = 1; k < P; k++) {
      int to = (r + k) % P, from = (r - k + P) % P;
      if (j == 0 || at < cnt[to]) /* to's chunk j of my data */
        x[n++] = (tdm__xfer){.peer = to, .is_send = 1, .buf = at < cnt[to] ? (void *)(in + (off[to] + at) * es) : NULL,
                             .nbytes = (at < cnt[to] ? (cnt[to] - at < chunk ? cnt[to] - at : chunk) : 0) * es};
      if (j == 0 || mine)
        x[n++] = (tdm__xfer){.peer = from, .is_send = 0, .buf = tmp + (size_t)from * chunk * es, .nbytes = mine * es};
    }
    if (mine) memcpy(tmp + (size_t)r * chunk * es, in + (off[r] + at) * es, mine * es);
    if (n) TDM__TRY(tdm__exchange(c, x, n));
    if (!mine) continue;
    char *dst = out + at * es;
    memcpy(dst, tmp, mine * es);
    for (int q = 1; q < P; q++) tdm_reduce_local(dst, tmp + (size_t)q * chunk * es, mine, dt, op);
  }
  return TDM_OK;
}

/* Every rank's part straight to every other rank. recvbuf + off[rank] may be sendbuf. */
tdm_status tdm__allgather_direct(struct tdm_comm *c, const void *sendbuf, void *recvbuf, const size_t *cnt,
                                 const size_t *off, tdm_dtype dt) {
  int P = c->size, r = c->rank;
  size_t es = tdm_dtype_size(dt);
  char *out = recvbuf;
  if (cnt[r] && out + off[r] * es != sendbuf) memcpy(out + off[r] * es, sendbuf, cnt[r] * es);
  tdm__xfer x[2 * P];
  int n = 0;
  for (int k = 1; k < P; k++) { /* empty parts too: every rank checks every peer's call */
    int to = (r + k) % P, from = (r - k + P) % P;
    x[n++] = (tdm__xfer){.peer = to, .is_send = 1, .buf = cnt[r] ? out + off[r] * es : NULL, .nbytes = cnt[r] * es};
    x[n++] = (tdm__xfer){.peer = from, .is_send = 0, .buf = cnt[from] ? out + off[from] * es : NULL, .nbytes = cnt[from] * es};
  }
  return n ? tdm__exchange(c, x, n) : TDM_OK;
}
