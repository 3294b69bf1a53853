/* Communicator internals shared by comm.c, the algorithms and the transports.
 *
 * Every message on the wire is a 48-byte header followed by its payload. The header carries the
 * collective's identity (sequence number, kind, dtype, op, root, count), so a receiver detects a
 * rank that is in another collective at the first message and fails with both calls named. */
#ifndef TANDEM_COMM_IMPL_H
#define TANDEM_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/internal.h"
#include "tandem/comm.h"

#define TDM_MSG_MAGIC 0x4d4d4454u /* "TDMM" */

typedef enum {
  TDM_COLL_P2P = 0,
  TDM_COLL_ALLREDUCE,
  TDM_COLL_BROADCAST,
  TDM_COLL_REDUCE,
  TDM_COLL_REDUCE_SCATTER,
  TDM_COLL_ALLGATHER,
  TDM_COLL_GATHER,
  TDM_COLL_SCATTER,
  TDM_COLL_ALLTOALL,
  TDM_COLL_BARRIER,
  TDM_COLL_SPLIT,
  TDM_COLL_ABORT, /* payload: the reason text */
  TDM_COLL_KIND_COUNT
} tdm__coll_kind;
const char *tdm__coll_name(int kind);

typedef struct tdm__hdr {
  uint32_t magic;
  uint32_t kind;   /* tdm__coll_kind */
  uint64_t seq;    /* collective sequence number; p2p: the tag */
  uint32_t dtype, op;
  int32_t root;
  uint32_t comm_id; /* sub-communicators share their parent's connections */
  uint64_t count;
  uint64_t nbytes; /* payload bytes that follow */
} tdm__hdr;
_Static_assert(sizeof(tdm__hdr) == 48, "the wire header is 48 bytes");

/* One transfer of a batch that a transport runs concurrently. */
typedef struct tdm__xfer {
  int peer;
  int is_send;
  void *buf;
  size_t nbytes;
  tdm__hdr hdr;       /* send: what goes out; recv: what is expected (nbytes included) */
  /* transport progress state */
  size_t done;        /* header + payload bytes moved */
  tdm__hdr got;       /* recv: the header as received */
  int complete;
} tdm__xfer;

typedef struct tdm__call {
  uint32_t kind, dtype, op;
  int32_t root;
  uint64_t count;
  uint64_t seq;
} tdm__call;

/* Whether x[i] may move now: transfers to one peer in one direction run in array order. */
static inline int tdm__xfer_turn(const tdm__xfer *x, int i) {
  for (int j = 0; j < i; j++)
    if (!x[j].complete && x[j].peer == x[i].peer && x[j].is_send == x[i].is_send) return 0;
  return 1;
}

typedef struct tdm__transport tdm__transport;
typedef struct tdm__transport_ops {
  const char *name;
  /* Runs every transfer to completion, making progress on all at once (a ring's send and
   * receive must not wait on each other). Transfers to the same peer in the same direction run
   * in array order. Fails at the deadline (absolute, tdm_time_now) with TDM_ERR_TIMEOUT, when a
   * peer goes away with TDM_ERR_REMOTE, or on a header check failure. */
  tdm_status (*run)(tdm__transport *t, tdm__xfer *x, int n, double deadline);
  /* Best effort: tell every peer why we stop (an ABORT message), then close everything. */
  void (*abort)(tdm__transport *t, const char *reason);
  void (*destroy)(tdm__transport *t);
  /* Optional: told at the start of every collective (transports whose algorithms exchange no
   * headers use it to detect mismatches). */
  void (*announce)(tdm__transport *t, const struct tdm__call *call);
} tdm__transport_ops;

struct tdm__transport {
  const tdm__transport_ops *ops;
  struct tdm_comm *comm; /* for error details */
  int rank, size;
};



struct tdm_comm {
  int rank, size;
  tdm_transport_kind kind;
  tdm__transport *tr;
  int owns_transport;
  const int *map; /* sub-communicators: my rank -> the transport's rank (NULL: identity) */
  int *map_owned;
  uint32_t comm_id;
  double timeout_s;
  uint64_t seq;
  tdm__call cur; /* the collective in progress */
  _Atomic int failed;
  tdm_status fail_status;
  char error[512];
  double emu_latency_s, emu_bytes_per_s; /* TANDEM_NET_EMULATE; 0: off */
  double *emu_link_free;                  /* per peer: when the emulated link is free again */
  void *scratch; /* reused between calls: no allocation in steady state */
  size_t scratch_bytes;
  struct tdm__store *store;
  /* non-blocking calls: a progress thread runs queued work in order */
  pthread_mutex_t q_mu;
  pthread_cond_t q_cv;
  struct tdm_work *q_head, *q_tail;
  int q_busy, q_stop, q_started;
  pthread_t q_thread;
};

/* Fails the communicator (first error wins) and returns st. */
tdm_status tdm__comm_fail(struct tdm_comm *c, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "all-reduce #12 (1000 x f32, sum)" for the call in progress. */
const char *tdm__call_str(const tdm__call *call, char *buf, size_t n);
/* Checks a received header against the expected one; formats the mismatch. */
tdm_status tdm__check_header(struct tdm_comm *c, int peer, const tdm__hdr *want, const tdm__hdr *got);

/* Point-to-point for algorithms: headers are filled from c->cur. Peers are communicator ranks. */
tdm_status tdm__exchange(struct tdm_comm *c, tdm__xfer *x, int n);
tdm_status tdm__send(struct tdm_comm *c, int peer, const void *buf, size_t nbytes);
tdm_status tdm__recv(struct tdm_comm *c, int peer, void *buf, size_t nbytes);
tdm_status tdm__sendrecv(struct tdm_comm *c, int to, const void *sbuf, size_t sn, int from, void *rbuf, size_t rn);
/* Scratch of at least n bytes owned by the communicator. */
void *tdm__comm_scratch(struct tdm_comm *c, size_t n);

/* Parses "100us,1gbps" (latency and/or bandwidth; units ns us ms s, and kbps mbps gbps for
 * bits or KB/s MB/s GB/s for bytes). */
tdm_status tdm__parse_net_emulate(const char *spec, double *latency_s, double *bytes_per_s);

/* avg's final division of n elements by d. */
void tdm__scale_avg(void *buf, size_t n, tdm_dtype dt, int d);

/* Transports. */
tdm_status tdm__thread_transport_create(tdm__transport **out, struct tdm_comm *c, void *group);
tdm_status tdm__tcp_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg);
tdm_status tdm__mpi_transport_create(tdm__transport **out, struct tdm_comm *c);
tdm_status tdm__shm_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg);
/* The shared-memory all-reduce: reads sendbuf, writes recvbuf (they may be equal). Needs the
 * communicator's transport to be shm and the communicator to span all its ranks. */
tdm_status tdm__allreduce_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op);

/* A shared region (transport/shm.c): one f32 area per rank in one segment that every rank maps,
 * for a zero-copy all-reduce of data that lives there (data-parallel gradients on one node).
 * Create is collective over c (shm transport, whole communicator) and fails the same way on all
 * ranks. region_allreduce sums elements [lo, hi) of every area in rank order (average: then
 * divides by P) and writes the result into every area; collective, in the same order on all ranks;
 * every wait has c's timeout and notices a dead peer. */
typedef struct tdm__shm_region tdm__shm_region;
tdm_status tdm__shm_region_create(struct tdm_comm *c, size_t floats_per_rank, tdm__shm_region **out);
void tdm__shm_region_destroy(tdm__shm_region *r);
float *tdm__shm_region_mine(tdm__shm_region *r);
tdm_status tdm__shm_region_allreduce(tdm__shm_region *r, size_t lo, size_t hi, int average);
/* Runs fn(ctx) on c's progress thread, in line with the non-blocking collectives. */
tdm_status tdm__comm_icall(struct tdm_comm *c, tdm_status (*fn)(void *ctx), void *ctx, tdm_work_t *work);

/* The key-value store used for rendezvous. */
typedef struct tdm__store tdm__store;
tdm_status tdm__store_open(tdm__store **out, const tdm_comm_config *cfg, double timeout_s);
tdm_status tdm__store_set(tdm__store *s, const char *key, const void *val, size_t n);
/* Waits until key exists; *val is malloc'd (tdm__free). */
tdm_status tdm__store_get(tdm__store *s, const char *key, void **val, size_t *n, double timeout_s);
tdm_status tdm__store_add(tdm__store *s, const char *key, int64_t delta, int64_t *result);
void tdm__store_close(tdm__store *s);

/* Algorithms (src/comm/algo): all work on communicator ranks and c->cur. */
tdm_status tdm__allreduce_ring(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allreduce_rd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allreduce_rhd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allreduce_tree(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__bcast_binomial(struct tdm_comm *c, void *buf, size_t nbytes, int root);
tdm_status tdm__bcast_chain(struct tdm_comm *c, void *buf, size_t nbytes, int root);
tdm_status tdm__reduce_binomial(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op, int root);
tdm_status tdm__reduce_scatter_ring(struct tdm_comm *c, void *buf, const size_t *counts, tdm_dtype dt, tdm_redop op);
tdm_status tdm__reduce_scatter_rhd(struct tdm_comm *c, void *buf, size_t block, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allgather_ring(struct tdm_comm *c, void *buf, const size_t *bytes);
tdm_status tdm__allgather_rd(struct tdm_comm *c, void *buf, size_t block_bytes);

#endif
