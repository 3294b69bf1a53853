/* Reduce-scatter and all-gather: by ring (any world size) and by recursive halving / doubling
 * (powers of two), over the blocks of tdm__blocks, so any count works. buf always holds all P
 * blocks. The ring and halving-doubling all-reduces are built from these (algo/allreduce.c). */
#include <string.h>

#include "comm/comm_impl.h"

tdm_status tdm__reduce_scatter_ring(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op) {
  int P = c->size, r = c->rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  if (P == 1) return TDM_OK;
  size_t es = tdm_dtype_size(dt), cnt[P], off[P];
  tdm__blocks(count, P, cnt, off);
  char *b = buf;
  /* at step s rank r sends block r-s-1 and reduces block r-s-2: after P-1 steps it owns block r,
   * summed in ring order from rank r+1 to rank r */
  for (int s = 0; s < P - 1; s++) {
    int si = (r - s - 1 + 2 * P) % P, ri = (r - s - 2 + 2 * P) % P;
    TDM__TRY(tdm__sendrecv_reduce(c, next, b + off[si] * es, cnt[si], prev, b + off[ri] * es, cnt[ri], dt, op));
  }
  return TDM_OK;
}

tdm_status tdm__allgather_ring(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt) {
  int P = c->size, r = c->rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  size_t es = tdm_dtype_size(dt), cnt[P], off[P];
  tdm__blocks(count, P, cnt, off);
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
