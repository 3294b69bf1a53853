/* The mismatch matrix shared by the thread-transport unit test (tests/unit/test_comm.c) and the
 * multi-process tests (shm, tcp, mpi): every collective, called by one rank ("odd") with one field
 * of its identity changed. The call must fail on every rank with TDM_ERR_MISMATCH naming both
 * calls; it must never succeed. */
#ifndef TDM_TEST_MISMATCH_H
#define TDM_TEST_MISMATCH_H

#include <string.h>

#include "comm/comm_impl.h" /* tdm__call, tdm__call_str: the names the errors must contain */

typedef enum {
  MM_ALLREDUCE,
  MM_BROADCAST,
  MM_REDUCE,
  MM_REDUCE_SCATTER,
  MM_ALLGATHER,
  MM_GATHER,
  MM_SCATTER,
  MM_ALLTOALL,
  MM_BARRIER,
  MM_COLL_COUNT
} mm_coll;
typedef enum { MM_F_COUNT, MM_F_DTYPE, MM_F_OP, MM_F_ROOT, MM_F_KIND, MM_FIELD_COUNT } mm_field;
static const char *const mm_coll_names[] = {"allreduce", "broadcast", "reduce", "reducescatter", "allgather",
                                            "gather", "scatter", "alltoall", "barrier"};
static const char *const mm_field_names[] = {"count", "dtype", "op", "root", "collective"};

#define MM_N 12 /* elements per rank (per block) */
#define MM_BUF_BYTES(P) ((size_t)MM_N * (size_t)(P) * 8 + 64)

static int mm_applies(mm_coll k, mm_field f) {
  switch (f) {
  case MM_F_COUNT:
  case MM_F_DTYPE: return k != MM_BARRIER;
  case MM_F_OP: return k == MM_ALLREDUCE || k == MM_REDUCE || k == MM_REDUCE_SCATTER;
  case MM_F_ROOT: return k == MM_BROADCAST || k == MM_REDUCE || k == MM_GATHER || k == MM_SCATTER;
  default: return k == MM_BARRIER; /* a barrier on one rank, an all-reduce on the other */
  }
}

/* The identity of the call (odd: the changed one) as the library names it. */
static tdm__call mm_ident(mm_coll k, mm_field f, int odd, int P, uint64_t seq) {
  static const tdm__coll_kind kinds[] = {TDM_COLL_ALLREDUCE, TDM_COLL_BROADCAST, TDM_COLL_REDUCE, TDM_COLL_REDUCE_SCATTER,
                                         TDM_COLL_ALLGATHER, TDM_COLL_GATHER,    TDM_COLL_SCATTER, TDM_COLL_ALLTOALL,
                                         TDM_COLL_BARRIER};
  size_t n = odd && f == MM_F_COUNT ? MM_N - 1 : MM_N;
  tdm__call c = {kinds[k], odd && f == MM_F_DTYPE ? TDM_I32 : TDM_F32, TDM_SUM, 0, n, seq};
  if (k == MM_REDUCE_SCATTER || k == MM_ALLGATHER) c.count = n * (size_t)P; /* the whole buffer */
  if (odd && f == MM_F_OP) c.op = TDM_MAX;
  if (odd && f == MM_F_ROOT) c.root = 1;
  if (k == MM_BARRIER) {
    c = (tdm__call){TDM_COLL_BARRIER, TDM_U8, TDM_SUM, 0, 0, seq};
    if (odd) c = (tdm__call){TDM_COLL_ALLREDUCE, TDM_F32, TDM_SUM, 0, MM_N, seq};
  }
  return c;
}

/* Makes the call with buffers of MM_BUF_BYTES(P). */
static tdm_status mm_call(tdm_comm_t c, mm_coll k, mm_field f, int odd, void *s, void *r) {
  tdm__call id = mm_ident(k, f, odd, tdm_comm_size(c), 0);
  tdm_dtype dt = (tdm_dtype)id.dtype;
  tdm_redop op = (tdm_redop)id.op;
  size_t n = k == MM_REDUCE_SCATTER || k == MM_ALLGATHER ? id.count / (size_t)tdm_comm_size(c) : id.count;
  switch (k) {
  case MM_ALLREDUCE: return tdm_comm_allreduce(c, s, r, n, dt, op, TDM_ALGO_AUTO);
  case MM_BROADCAST: return tdm_comm_broadcast(c, r, n, dt, id.root, TDM_ALGO_AUTO);
  case MM_REDUCE: return tdm_comm_reduce(c, s, r, n, dt, op, id.root, TDM_ALGO_AUTO);
  case MM_REDUCE_SCATTER: return tdm_comm_reduce_scatter(c, s, r, n, dt, op, TDM_ALGO_AUTO);
  case MM_ALLGATHER: return tdm_comm_allgather(c, s, r, n, dt, TDM_ALGO_AUTO);
  case MM_GATHER: return tdm_comm_gather(c, s, r, n, dt, id.root);
  case MM_SCATTER: return tdm_comm_scatter(c, s, r, n, dt, id.root);
  case MM_ALLTOALL: return tdm_comm_alltoall(c, s, r, n, dt);
  default: return odd ? tdm_comm_allreduce(c, s, r, MM_N, TDM_F32, TDM_SUM, TDM_ALGO_AUTO) : tdm_comm_barrier(c);
  }
}

/* Whether the call failed with TDM_ERR_MISMATCH and err names both calls (call seq of c). */
static int mm_named(tdm_status st, const char *err, mm_coll k, mm_field f, int P, uint64_t seq) {
  char a[160], b[160];
  tdm__call w = mm_ident(k, f, 0, P, seq), g = mm_ident(k, f, 1, P, seq);
  return st == TDM_ERR_MISMATCH && strstr(err, tdm__call_str(&w, a, sizeof a)) && strstr(err, tdm__call_str(&g, b, sizeof b));
}

#endif
