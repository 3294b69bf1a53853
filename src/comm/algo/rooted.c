/* Rooted collectives: broadcast (binomial tree, pipelined chain) and reduce (binomial tree).
 * Ranks are renumbered relative to the root, vr = (rank - root) mod P. */
#include <string.h>

#include "comm/comm_impl.h"

#define CHAIN_CHUNK ((size_t)512 << 10)

tdm_status tdm__bcast_binomial(struct tdm_comm *c, void *buf, size_t nbytes, int root) {
  int P = c->size, vr = (c->rank - root + P) % P, mask = 1;
  while (mask < P) { /* receive from the parent: the rank that differs in my lowest set bit */
    if (vr & mask) {
      TDM__TRY(tdm__recv(c, (vr - mask + root) % P, buf, nbytes));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) /* then send to the children below that bit */
    if (vr + mask < P) TDM__TRY(tdm__send(c, (vr + mask + root) % P, buf, nbytes));
  return TDM_OK;
}

tdm_status tdm__bcast_chain(struct tdm_comm *c, void *buf, size_t nbytes, int root) {
  int P = c->size, vr = (c->rank - root + P) % P;
  int next = vr + 1 < P ? (c->rank + 1) % P : -1, prev = vr > 0 ? (c->rank - 1 + P) % P : -1;
  char *b = buf;
  size_t n_chunks = (nbytes + CHAIN_CHUNK - 1) / CHAIN_CHUNK;
  if (n_chunks == 0) n_chunks = 1; /* a zero-byte broadcast still passes down the chain */
  /* step k: forward chunk k-1 downstream while chunk k arrives from upstream */
  for (size_t k = 0; k <= n_chunks; k++) {
    tdm__xfer x[2];
    int n = 0;
    memset(x, 0, sizeof x);
    size_t send_k = vr == 0 ? k : k - 1; /* the root has every chunk from the start */
    if (next >= 0 && (vr == 0 ? k < n_chunks : k >= 1)) {
      size_t at = send_k * CHAIN_CHUNK, len = nbytes - at < CHAIN_CHUNK ? nbytes - at : CHAIN_CHUNK;
      x[n++] = (tdm__xfer){.peer = next, .is_send = 1, .buf = b + at, .nbytes = len};
    }
    if (prev >= 0 && k < n_chunks) {
      size_t at = k * CHAIN_CHUNK, len = nbytes - at < CHAIN_CHUNK ? nbytes - at : CHAIN_CHUNK;
      x[n++] = (tdm__xfer){.peer = prev, .is_send = 0, .buf = b + at, .nbytes = len};
    }
    if (n) TDM__TRY(tdm__exchange(c, x, n));
  }
  return TDM_OK;
}

tdm_status tdm__reduce_binomial(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op, int root) {
  int P = c->size, vr = (c->rank - root + P) % P;
  size_t nbytes = count * tdm_dtype_size(dt);
  for (int mask = 1; mask < P; mask <<= 1) {
    if (vr & mask) return tdm__send(c, (vr - mask + root) % P, buf, nbytes);
    if (vr + mask < P) {
      void *tmp = tdm__comm_scratch(c, nbytes + 64);
      if (!tmp) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "out of memory for collective scratch");
      TDM__TRY(tdm__recv(c, (vr + mask + root) % P, tmp, nbytes));
      tdm_reduce_local(buf, tmp, count, dt, op);
    }
  }
  return TDM_OK;
}
