/* The algorithm table: one row per tdm_algo (the order of the enum), naming the collectives it
 * runs, where it can run them, and its entry points (adapters below give every algorithm of a
 * collective the same signature). AUTO's row runs every collective that has a choice; the rule
 * that picks for it is each collective's own (collective.c). */
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

#define BIT TDM__COLL_BIT
#define VECTOR (BIT(TDM_COLL_ALLREDUCE) | BIT(TDM_COLL_REDUCE_SCATTER) | BIT(TDM_COLL_ALLGATHER))

/* ---- adapters -------------------------------------------------------------------------------- */
/* All-reduce algorithms that work in place on recvbuf. */
#define IN_PLACE_ALLREDUCE(fn)                                                                                         \
  static tdm_status ar_##fn(struct tdm_comm *c, const void *s, void *r, size_t n, tdm_dtype dt, tdm_redop op) {       \
    if (s != r && n) memcpy(r, s, n * tdm_dtype_size(dt));                                                            \
    return tdm__allreduce_##fn(c, r, n, dt, op);                                                                      \
  }
IN_PLACE_ALLREDUCE(ring)
IN_PLACE_ALLREDUCE(rd)
IN_PLACE_ALLREDUCE(rhd)
IN_PLACE_ALLREDUCE(tree)
IN_PLACE_ALLREDUCE(direct)

/* Reduce-scatters that work in place on a whole copy of the buffer: a scratch of count elements,
 * from which block r is copied out. */
static tdm_status rs_in_copy(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                             tdm_dtype dt, tdm_redop op, int rhd) {
  size_t es = tdm_dtype_size(dt), lo = off[c->rank], len = cnt[c->rank];
  char *work = tdm__aligned_alloc_cat(count * es + 64, TDM_MEM_COMM); /* the algorithm uses the scratch itself */
  if (!work) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "reduce-scatter: out of memory");
  if (count) memcpy(work, s, count * es);
  tdm_status st = rhd ? tdm__reduce_scatter_rhd(c, work, count, dt, op) : tdm__reduce_scatter_ring(c, work, cnt, off, dt, op);
  if (st == TDM_OK && len) memcpy(r, work + lo * es, len * es);
  tdm__free(work);
  return st;
}
static tdm_status rs_ring(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                          tdm_dtype dt, tdm_redop op) {
  return rs_in_copy(c, s, r, count, cnt, off, dt, op, 0);
}
static tdm_status rs_rhd(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                         tdm_dtype dt, tdm_redop op) {
  return rs_in_copy(c, s, r, count, cnt, off, dt, op, 1);
}

/* All-gathers that work in place on recvbuf, starting from this rank's block. */
static void ag_place_mine(struct tdm_comm *c, const void *s, void *r, const size_t *cnt, const size_t *off, tdm_dtype dt) {
  size_t es = tdm_dtype_size(dt);
  char *mine = (char *)r + off[c->rank] * es;
  if (cnt[c->rank] && mine != s) memcpy(mine, s, cnt[c->rank] * es);
}
static tdm_status ag_ring(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                          tdm_dtype dt) {
  (void)count;
  ag_place_mine(c, s, r, cnt, off, dt);
  return tdm__allgather_ring(c, r, cnt, off, dt);
}
static tdm_status ag_rd(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                        tdm_dtype dt) {
  ag_place_mine(c, s, r, cnt, off, dt);
  return tdm__allgather_rd(c, r, count, dt);
}
static tdm_status ag_direct(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                            tdm_dtype dt) {
  (void)count;
  return tdm__allgather_direct(c, s, r, cnt, off, dt);
}
static tdm_status rs_direct(struct tdm_comm *c, const void *s, void *r, size_t count, const size_t *cnt, const size_t *off,
                            tdm_dtype dt, tdm_redop op) {
  (void)count;
  return tdm__reduce_scatter_direct(c, s, r, cnt, off, dt, op);
}

/* ---- the table ------------------------------------------------------------------------------ */
const tdm__algo_row tdm__algos[TDM_ALGO_COUNT] = {
    [TDM_ALGO_AUTO] = {.name = "auto",
                       .runs = VECTOR | BIT(TDM_COLL_BROADCAST) | BIT(TDM_COLL_REDUCE) | BIT(TDM_COLL_GATHER) |
                               BIT(TDM_COLL_SCATTER) | BIT(TDM_COLL_ALLTOALL)},
    [TDM_ALGO_RING] = {"ring", VECTOR, 0, 0, 0, ar_ring, NULL, NULL, rs_ring, ag_ring},
    [TDM_ALGO_RD] = {"rd", BIT(TDM_COLL_ALLREDUCE) | BIT(TDM_COLL_ALLGATHER), BIT(TDM_COLL_ALLGATHER),
                     BIT(TDM_COLL_ALLGATHER), 0, ar_rd, NULL, NULL, NULL, ag_rd},
    [TDM_ALGO_RHD] = {"rhd", BIT(TDM_COLL_ALLREDUCE) | BIT(TDM_COLL_REDUCE_SCATTER), BIT(TDM_COLL_REDUCE_SCATTER),
                      BIT(TDM_COLL_REDUCE_SCATTER), 0, ar_rhd, NULL, NULL, rs_rhd, NULL},
    [TDM_ALGO_TREE] = {"tree", BIT(TDM_COLL_ALLREDUCE) | BIT(TDM_COLL_BROADCAST) | BIT(TDM_COLL_REDUCE), 0, 0, 0, ar_tree,
                       tdm__bcast_binomial, tdm__reduce_binomial, NULL, NULL},
    [TDM_ALGO_CHAIN] = {"chain", BIT(TDM_COLL_BROADCAST), 0, 0, 0, NULL, tdm__bcast_chain, NULL, NULL, NULL},
    [TDM_ALGO_DIRECT] = {"direct", VECTOR | BIT(TDM_COLL_GATHER) | BIT(TDM_COLL_SCATTER) | BIT(TDM_COLL_ALLTOALL), 0, 0, 0,
                         ar_direct, NULL, NULL, rs_direct, ag_direct},
    [TDM_ALGO_SHM] = {"shm", VECTOR, 0, 0, 1, tdm__allreduce_shm, NULL, NULL, tdm__reduce_scatter_shm, tdm__allgather_shm},
    [TDM_ALGO_HIER] = {"hier", BIT(TDM_COLL_ALLREDUCE), 0, 0, 0, tdm__allreduce_hier, NULL, NULL, NULL, NULL, .needs_nodes = 1},
};

int tdm__algo_applies(const struct tdm_comm *c, int k, tdm_algo a) {
  if ((unsigned)a >= TDM_ALGO_COUNT || (unsigned)k >= 32) return 0;
  const tdm__algo_row *r = &tdm__algos[a];
  if (!(r->runs & BIT(k))) return 0;
  if ((r->pow2_only & BIT(k)) && !tdm__pow2(c->size)) return 0;
  if (r->needs_nodes && !tdm__hier_usable(c)) return 0;
  return !r->needs_shm || tdm__shm_usable(c);
}

/* "ring, rd, rhd, tree, shm or auto": what can run kind k on c. */
const char *tdm__algos_for(const struct tdm_comm *c, int k, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  for (int a = 1; a < TDM_ALGO_COUNT; a++)
    if (tdm__algo_applies(c, k, (tdm_algo)a)) at += (size_t)snprintf(buf + at, at < n ? n - at : 0, "%s, ", tdm__algos[a].name);
  if (at < n) snprintf(buf + at, n - at, "auto");
  return buf;
}
