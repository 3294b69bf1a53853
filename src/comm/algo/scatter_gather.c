/* Reduce-scatter and all-gather: by ring (any world size, blocks of any size) and by recursive
 * halving / doubling (powers of two, equal blocks). buf always holds all P blocks. */
#include <string.h>

#include "comm/comm_impl.h"

tdm_status tdm__reduce_scatter_ring(struct tdm_comm *c, void *buf, const size_t *counts, tdm_dtype dt, tdm_redop op) {
  int P = c->size, r = c->rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  size_t es = tdm_dtype_size(dt), off[P], maxc = 0;
  for (int i = 0, at = 0; i < P; i++) {
    off[i] = (size_t)at;
    at += (int)counts[i];
    if (counts[i] > maxc) maxc = counts[i];
  }
  char *b = buf, *tmp = tdm__comm_scratch(c, maxc * es + 64);
  if (!tmp) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "out of memory for collective scratch");
  /* at step s rank r sends block r-s-1 and reduces block r-s-2: after P-1 steps it owns block r */
  for (int s = 0; s < P - 1; s++) {
    int si = (r - s - 1 + 2 * P) % P, ri = (r - s - 2 + 2 * P) % P;
    TDM__TRY(tdm__sendrecv(c, next, b + off[si] * es, counts[si] * es, prev, tmp, counts[ri] * es));
    tdm_reduce_local(b + off[ri] * es, tmp, counts[ri], dt, op);
  }
  return TDM_OK;
}

static int is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

tdm_status tdm__reduce_scatter_rhd(struct tdm_comm *c, void *buf, size_t block, tdm_dtype dt, tdm_redop op) {
  int P = c->size, r = c->rank;
  if (!is_pow2(P))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, /* refused before any message: the communicator is fine */
                          "reduce-scatter by recursive halving needs a power-of-two world size, not %d (use ring)", P);
  size_t es = tdm_dtype_size(dt);
  char *b = buf, *tmp = tdm__comm_scratch(c, block * es * (size_t)(P / 2) + 64);
  if (!tmp) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "out of memory for collective scratch");
  int lo = 0, half = P; /* I keep [lo, lo + half) blocks; it halves each step and ends at block r */
  for (int mask = P / 2; mask >= 1; mask /= 2) {
    half /= 2;
    int partner = r ^ mask, klo = (r & mask) ? lo + half : lo, slo = (r & mask) ? lo : lo + half;
    size_t n = block * (size_t)half;
    TDM__TRY(tdm__sendrecv(c, partner, b + (size_t)slo * block * es, n * es, partner, tmp, n * es));
    tdm_reduce_local(b + (size_t)klo * block * es, tmp, n, dt, op);
    lo = klo;
  }
  return TDM_OK;
}

tdm_status tdm__allgather_ring(struct tdm_comm *c, void *buf, const size_t *bytes) {
  int P = c->size, r = c->rank, next = (r + 1) % P, prev = (r + P - 1) % P;
  size_t off[P];
  for (int i = 0, at = 0; i < P; i++) {
    off[i] = (size_t)at;
    at += (int)bytes[i];
  }
  char *b = buf;
  for (int s = 0; s < P - 1; s++) {
    int si = (r - s + P) % P, ri = (r - s - 1 + P) % P;
    TDM__TRY(tdm__sendrecv(c, next, b + off[si], bytes[si], prev, b + off[ri], bytes[ri]));
  }
  return TDM_OK;
}

tdm_status tdm__allgather_rd(struct tdm_comm *c, void *buf, size_t block_bytes) {
  int P = c->size, r = c->rank;
  if (!is_pow2(P))
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "all-gather by recursive doubling needs a power-of-two world size, not %d (use ring)", P);
  char *b = buf;
  for (int mask = 1; mask < P; mask <<= 1) {
    int partner = r ^ mask, mine = r & ~(mask - 1), theirs = partner & ~(mask - 1);
    size_t n = block_bytes * (size_t)mask;
    TDM__TRY(tdm__sendrecv(c, partner, b + (size_t)mine * block_bytes, n, partner, b + (size_t)theirs * block_bytes, n));
  }
  return TDM_OK;
}
