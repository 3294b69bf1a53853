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
  TDM_COLL_TAGGED, /* tdm_comm_tsend: matched by (source, tag); seq is the tag */
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
  /* tagged messages (p2p.c): a receive that meets a tagged message it does not want reads it into
   * the transport's stash instead (user_buf / user_nbytes keep its own buffer meanwhile); a probe
   * (any-source receive) ends after one message, matched or stashed */
  int stashing, probe, matched;
  void *user_buf;
  size_t user_nbytes;
} tdm__xfer;

/* A tagged message read ahead of the receive that will take it. */
typedef struct tdm__stashed {
  struct tdm__stashed *next;
  int peer; /* the transport's rank */
  tdm__hdr hdr;
  char data[];
} tdm__stashed;

typedef struct tdm__call {
  uint32_t kind, dtype, op;
  int32_t root;
  uint64_t count; /* reduce-scatter and all-gather: the whole buffer, all P blocks */
  uint64_t seq;
} tdm__call;

/* Whether x[i] may move now: transfers to one peer in one direction run in array order. */
static inline int tdm__xfer_turn(const tdm__xfer *x, int i) {
  for (int j = 0; j < i; j++)
    if (!x[j].complete && x[j].peer == x[i].peer && x[j].is_send == x[i].is_send) return 0;
  return 1;
}

typedef struct tdm__transport tdm__transport;
struct tdm__waiter;
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
  /* Optional: told at the start of every collective of t->active, once its algorithm is chosen
   * (slots: one that moves no messages), so transports whose algorithms exchange no headers can
   * detect mismatches while waiting. */
  void (*announce)(tdm__transport *t, const struct tdm__call *call, int slots);
  /* Optional (tagged receives from any source need it): whether peer has sent something not yet
   * received, without blocking; also 1 when peer is gone or the job aborted, so that a receive
   * from it reports why. slow: every few ms, the time for costlier checks (a process's life). */
  int (*pending)(tdm__transport *t, int peer, int slow);
  /* Optional (shared buffers, shared.c): memory every rank of the transport maps. shared_map is
   * collective over the transport's ranks through c (a communicator over all of them): *base gets
   * `bytes` of it, zero-filled, or every rank gets an error alike. shared_unmap gives back this
   * rank's view (the memory goes with the last). shared_wait is one pause of a wait on peer (a
   * transport rank; -1: none in particular): TDM_OK to look again, or why the wait must stop
   * (the job aborted, the peer's process is gone, the deadline passed), naming `what`. */
  tdm_status (*shared_map)(tdm__transport *t, struct tdm_comm *c, size_t bytes, void **base);
  void (*shared_unmap)(tdm__transport *t, void *base, size_t bytes);
  tdm_status (*shared_wait)(tdm__transport *t, struct tdm__waiter *w, struct tdm_comm *c, int peer, double deadline,
                            const char *what);
} tdm__transport_ops;

struct tdm__transport {
  const tdm__transport_ops *ops;
  struct tdm_comm *comm; /* the communicator that created it */
  /* the communicator whose call is in progress: comm, or a sub-communicator speaking through
   * comm's transport (set by comm.c before every call; cleared when that communicator goes) */
  struct tdm_comm *active;
  int rank, size;
  tdm__stashed *stash, *stash_tail; /* tagged messages read ahead, in arrival order (p2p.c) */
};
/* The communicator to name in errors and to fail: the one whose call is running. */
static inline struct tdm_comm *tdm__active(tdm__transport *t) { return t->active ? t->active : t->comm; }


struct tdm_comm {
  int rank, size;
  tdm_transport_kind kind;
  tdm__transport *tr;
  int owns_transport;
  const int *map; /* sub-communicators: my rank -> the transport's rank (NULL: identity) */
  int *map_owned;
  uint32_t comm_id;
  double timeout_s;
  int local_size; /* ranks on this node (LOCAL_WORLD_SIZE); 0: unknown */
  /* TANDEM_ALGO: an algorithm per collective kind (AUTO: the rule), and a plain name that applies
   * where it can (docs/algorithms.md); parsed once at creation, inherited by split */
  tdm_algo algo_for[TDM_COLL_KIND_COUNT];
  tdm_algo algo_plain;
  uint64_t seq;
  tdm__call cur; /* the collective in progress */
  double tr_t0;  /* tracing: when cur began (0: not traced) */
  int tr_algo;   /* tracing: the algorithm cur runs */
  void *tr_rec;  /* tracing: the recorder the progress thread records into */
  int last_any;  /* the rank a tagged receive from any source took a message from last */
  _Atomic int failed;       /* set (release) once fail_status, error and fail_origin are written */
  _Atomic int fail_claimed; /* the first failure writes them */
  /* tdm_comm_bytes_sent: message payloads, plus what the shm collectives hand to peers */
  _Atomic uint64_t bytes_sent;
  tdm_status fail_status;
  char error[512];
  int fail_origin; /* the rank whose failure error relays (tdm_last_error_origin), -1: this one's */
  double emu_latency_s, emu_bytes_per_s; /* TANDEM_NET_EMULATE; 0: off */
  double *emu_link_free;                  /* per peer: when the emulated link is free again */
  void *scratch; /* reused between calls: no allocation in steady state */
  size_t scratch_bytes;
  struct tdm__store *store;
  /* jobs that span nodes (algo/hier.c): the hierarchical all-reduce's plan, made at creation of
   * a whole tcp / mpi communicator whose ranks are on several nodes; node_of[r]: the node of
   * rank r (TANDEM_NET_EMULATE then slows only the links between nodes); NULL on one node */
  struct tdm__hier *hier;
  int *node_of;
  /* set while a node's shm communicator is created: its transport exchanges the segment's name
   * by a broadcast over this communicator instead of the store */
  struct tdm_comm *rdzv;
  /* non-blocking calls: a progress thread runs queued work in order */
  pthread_mutex_t q_mu;
  pthread_cond_t q_cv;
  struct tdm_work *q_head, *q_tail;
  struct tdm_work *handles; /* every handle not yet waited for: destroy frees the abandoned ones */
  struct tdm_work *q_free;  /* handles waited for, kept for the next calls (linked by next) */
  int q_busy, q_stop, q_started;
  pthread_t q_thread;
};

/* Adds n to c's tdm_comm_bytes_sent (any thread: the progress thread and shared buffers count too). */
static inline void tdm__count_sent(struct tdm_comm *c, uint64_t n) {
  atomic_fetch_add_explicit(&c->bytes_sent, n, memory_order_relaxed);
}

/* Fails the communicator (first error wins) and returns st. */
tdm_status tdm__comm_fail(struct tdm_comm *c, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The failed communicator's error as the calling thread's (status, text, origin); returns it. */
tdm_status tdm__comm_error(struct tdm_comm *c);
/* "all-reduce #12 (1000 x f32, sum)" for the call in progress. */
const char *tdm__call_str(const tdm__call *call, char *buf, size_t n);
/* Checks a received header against the expected one; formats the mismatch. peer is a rank of
 * c's transport; errors name it by its rank in c. */
tdm_status tdm__check_header(struct tdm_comm *c, int peer, const tdm__hdr *want, const tdm__hdr *got);
/* The same check for calls that peers publish without messages (shm): TDM_ERR_MISMATCH naming
 * both calls unless they are the same call of the same communicator. */
tdm_status tdm__check_call(struct tdm_comm *c, int peer, const tdm__call *want, uint32_t want_comm,
                           const tdm__call *got, uint32_t got_comm);
/* c's rank of the transport's rank q (sub-communicators map ranks); -1 if q is not in c. */
int tdm__comm_rank_of(const struct tdm_comm *c, int q);

/* What a transport calls when a receive's header has arrived (instead of tdm__check_header) and
 * when its last byte has: the first checks it (tagged receives match it; a tagged message that
 * another receive meets is redirected into a stash buffer), the second returns 1 when the
 * transfer is complete, 0 when the message went to the stash and the receive starts again (a
 * probe then completes with matched = 0). */
tdm_status tdm__xfer_header(struct tdm_comm *c, tdm__xfer *x);
int tdm__xfer_done(tdm__transport *t, tdm__xfer *x);
/* Frees the stash (the transport's destroy). */
void tdm__stash_free(tdm__transport *t);

/* Point-to-point for algorithms: headers are filled from c->cur. Peers are communicator ranks. */
tdm_status tdm__exchange(struct tdm_comm *c, tdm__xfer *x, int n);
tdm_status tdm__send(struct tdm_comm *c, int peer, const void *buf, size_t nbytes);
tdm_status tdm__recv(struct tdm_comm *c, int peer, void *buf, size_t nbytes);
tdm_status tdm__sendrecv(struct tdm_comm *c, int to, const void *sbuf, size_t sn, int from, void *rbuf, size_t rn);
/* The public send / recv as the progress thread runs them (p2p.c). */
tdm_status tdm__p2p(struct tdm_comm *c, int peer, int tag, void *buf, size_t nbytes, int is_send);
/* Non-blocking calls (progress.c): a blocking call first waits until c's queue is idle (so calls
 * keep their order); destroy stops the progress thread and frees the handles never waited for. */
tdm_status tdm__wait_queue_idle(struct tdm_comm *c);
void tdm__progress_stop(struct tdm_comm *c);
/* Scratch of at least n bytes owned by the communicator. */
void *tdm__comm_scratch(struct tdm_comm *c, size_t n);

/* Configuration (config.c). Parses "100us,1gbps" (latency and/or bandwidth; units ns us ms s,
 * and kbps mbps gbps for bits or KB/s MB/s GB/s for bytes). */
tdm_status tdm__parse_net_emulate(const char *spec, double *latency_s, double *bytes_per_s);
/* TANDEM_TIMEOUT into *out (unchanged when unset); LOCAL_WORLD_SIZE (or Open MPI's) into *out, 0
 * when unset. TDM_ERR_INVALID_ARG naming the value when malformed. */
tdm_status tdm__env_timeout(double *out);
tdm_status tdm__env_local_size(int *out);
/* TANDEM_ALGO's value into c->algo_for / c->algo_plain, checked against c (docs/algorithms.md). */
tdm_status tdm__parse_algo_env(struct tdm_comm *c, const char *spec);
/* Whether algorithm a can run collective kind k on c; what can ("ring, rd, ..., auto"); the
 * algorithm of a call that passed a (its own choice, else TANDEM_ALGO's, else AUTO). */
int tdm__algo_applies(const struct tdm_comm *c, int k, tdm_algo a);
const char *tdm__algos_for(const struct tdm_comm *c, int k, char *buf, size_t n);
tdm_algo tdm__algo_pick(const struct tdm_comm *c, int kind, tdm_algo a);
static inline int tdm__pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

/* avg's final division of n elements by d. */
void tdm__scale_avg(void *buf, size_t n, tdm_dtype dt, int d);

/* The block partition of the ring, halving-doubling and shm algorithms (tdm_comm_block): cnt[i]
 * and off[i] of p blocks of count elements. Sizes and offsets are 64-bit throughout src/comm. */
void tdm__blocks(size_t count, int p, size_t *cnt, size_t *off);

/* Waiting without burning a core: spins first (the latency case), then yields, then sleeps in
 * naps that grow with the time already waited (to at most 1 ms), so a rank waiting on a stopped
 * or slow peer costs almost no CPU while one that waits microseconds is not slowed. Call
 * tdm__backoff each time the awaited condition is still false; reset with (tdm__backoff_t){0}
 * when progress is made. Returns 1 when it is time (every ~5 ms) for the slow checks. */
typedef struct {
  unsigned spins;
  double since, next_check;
} tdm__backoff_t;
int tdm__backoff(tdm__backoff_t *b);

/* The state of one wait in a transport's waiting loop (shm's and the shared buffers'): the
 * back-off, and what the last slow check found, reported at the next one (after the caller has
 * looked again at what it waits for: a peer that did its part and then exited has not failed). */
typedef struct tdm__waiter {
  tdm__backoff_t b;
  int dead;    /* 1 + the peer whose process was gone at the last check */
  int aborted; /* a peer had failed the job at the last check */
} tdm__waiter;

/* Transports: one creator each, in the table of comm.c (indexed by tdm_transport_kind). */
typedef tdm_status tdm__transport_create_fn(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg);
tdm__transport_create_fn tdm__thread_transport_create; /* cfg->thread_group */
tdm__transport_create_fn tdm__tcp_transport_create;
tdm__transport_create_fn tdm__mpi_transport_create;
/* The MPI transport sends a payload in pieces of at most this many bytes (1 GiB: MPI counts are
 * int); tests make it small to exercise the pieces. */
extern size_t tdm__mpi_piece_bytes;
tdm__transport_create_fn tdm__shm_transport_create;
/* The shared-memory collectives (no messages): need the communicator's transport to be shm and
 * the communicator to span all its ranks (tdm__shm_usable). They read sendbuf and write recvbuf,
 * which may be equal; every element is reduced in rank order 0..P-1, so the reduce-scatter's
 * block r is bit for bit the all-reduce's block r. reduce_scatter: sendbuf holds count elements,
 * recvbuf block r of tdm__blocks(count, P). allgather: sendbuf holds block r, recvbuf count. */
int tdm__shm_usable(const struct tdm_comm *c);
/* The bytes of the shm transport's segment for P ranks (every rank maps it; each counts a P-th as
 * its communication memory). */
size_t tdm__shm_segment_bytes(int P);
tdm_status tdm__allreduce_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op);
tdm_status tdm__reduce_scatter_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *cnt,
                                   const size_t *off, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allgather_shm(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *cnt,
                              const size_t *off, tdm_dtype dt);

/* Whether c can have shared buffers (tdm_shared_create): all of a transport's ranks that map
 * shared memory, and no emulated network. */
int tdm__shared_usable(const struct tdm_comm *c);
/* Runs fn(ctx) on c's progress thread, in line with the non-blocking collectives. */
tdm_status tdm__comm_icall(struct tdm_comm *c, tdm_status (*fn)(void *ctx), void *ctx, tdm_work_t *work);

/* The key-value store used for rendezvous. */
typedef struct tdm__store tdm__store;
tdm_status tdm__store_open(tdm__store **out, const tdm_comm_config *cfg, double timeout_s);
tdm_status tdm__store_set(tdm__store *s, const char *key, const void *val, size_t n);
/* As set, but only if no one set the key before: *taken = 1 (and nothing changed) if someone had.
 * A file store (TANDEM_STORE_DIR) cannot tell an earlier job's file from a claim: it just sets. */
tdm_status tdm__store_set_once(tdm__store *s, const char *key, const void *val, size_t n, int *taken);
/* Waits until key exists; *val is malloc'd (tdm__free). */
tdm_status tdm__store_get(tdm__store *s, const char *key, void **val, size_t *n, double timeout_s);
tdm_status tdm__store_add(tdm__store *s, const char *key, int64_t delta, int64_t *result);
void tdm__store_close(tdm__store *s);

/* The algorithm table (algos.c): a row per tdm_algo, indexed by it, saying which collectives it
 * runs and where, and how. Adding an algorithm is its file in algo/ and one row. Every entry
 * point has the collective's whole signature, so the dispatcher (collective.c) has no switch:
 *   allreduce:      sendbuf -> recvbuf (may be equal), count elements;
 *   broadcast:      buf of nbytes from root;   reduce: in place on work (the root's recvbuf);
 *   reduce_scatter: sendbuf of count elements -> recvbuf, block r (cnt[r] at off[r]) on rank r;
 *   allgather:      sendbuf (block r) -> recvbuf of count elements. */
typedef struct tdm__algo_row {
  const char *name;
  unsigned runs;        /* bit (1u << tdm__coll_kind) per collective it can run */
  unsigned pow2_only;   /* of those, the ones it runs only on a power-of-two communicator */
  unsigned blocks_only; /* of those, the ones it runs only on equal blocks (not the v forms) */
  int needs_shm;        /* only where tdm__shm_usable */
  tdm_status (*allreduce)(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                          tdm_redop op);
  tdm_status (*broadcast)(struct tdm_comm *c, void *buf, size_t nbytes, int root);
  tdm_status (*reduce)(struct tdm_comm *c, void *work, size_t count, tdm_dtype dt, tdm_redop op, int root);
  tdm_status (*reduce_scatter)(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *cnt,
                               const size_t *off, tdm_dtype dt, tdm_redop op);
  tdm_status (*allgather)(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, const size_t *cnt,
                          const size_t *off, tdm_dtype dt);
  int needs_nodes; /* only where tdm__hier_usable (ranks on several nodes) */
} tdm__algo_row;
extern const tdm__algo_row tdm__algos[TDM_ALGO_COUNT];
#define TDM__COLL_BIT(k) (1u << (k))

/* The hierarchical all-reduce (algo/hier.c). tdm__hier_setup runs at the end of creating a whole
 * tcp / mpi communicator (collective over it): it learns every rank's node (TANDEM_NODE_ID, else
 * the host name) when ranks may be on several nodes, and if they are, makes the plan: a shared-
 * memory communicator of the node's ranks and a sub-communicator of the ranks with the same
 * index on every node. Returns an error only for a bad TANDEM_NODE_ID or a failed communicator;
 * a node whose shared memory cannot be set up leaves every rank on the flat algorithms (logged).
 * tdm__hier_destroy frees the plan (NULL: nothing). tdm__comm_create_node (comm.c) makes the
 * shm communicator of via's ranks, rendezvous over via, without TANDEM_NET_EMULATE. */
tdm_status tdm__hier_setup(struct tdm_comm *c);
void tdm__hier_destroy(struct tdm__hier *h);
int tdm__hier_usable(const struct tdm_comm *c);
tdm_status tdm__allreduce_hier(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                               tdm_redop op);
tdm_status tdm__comm_create_node(struct tdm_comm *via, tdm_comm_t *out);

/* Algorithms (src/comm/algo): all work on communicator ranks and c->cur. */
tdm_status tdm__allreduce_ring(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allreduce_rd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allreduce_rhd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allreduce_tree(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__bcast_binomial(struct tdm_comm *c, void *buf, size_t nbytes, int root);
tdm_status tdm__bcast_chain(struct tdm_comm *c, void *buf, size_t nbytes, int root);
tdm_status tdm__reduce_binomial(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op, int root);
/* Reduce-scatter and all-gather work in place on buf, which holds all count elements split by
 * tdm__blocks(count, P): reduce-scatter leaves the reduction of block r on rank r (the ring
 * all-reduce is ring reduce-scatter then ring all-gather, so their block r are the same bits; the
 * halving-doubling all-reduce likewise on powers of two); all-gather starts from block r on rank
 * r and leaves every block everywhere. rhd / rd: powers of two only (else TDM_ERR_NOT_SUPPORTED,
 * before any message). */
tdm_status tdm__reduce_scatter_ring(struct tdm_comm *c, void *buf, const size_t *cnt, const size_t *off, tdm_dtype dt,
                                    tdm_redop op);
tdm_status tdm__reduce_scatter_rhd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allgather_ring(struct tdm_comm *c, void *buf, const size_t *cnt, const size_t *off, tdm_dtype dt);
tdm_status tdm__allgather_rd(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt);
/* Rank order over any partition (cnt[q] elements at off[q] for rank q), on any transport: the
 * reduce-scatter reads every part of sendbuf and writes the reduction of part r to recvbuf (which
 * may be sendbuf + off[r]); the all-gather sends part r (sendbuf) to all and receives the others
 * into recvbuf. tdm__allreduce_direct is the two over tdm__blocks, in place. */
tdm_status tdm__reduce_scatter_direct(struct tdm_comm *c, const void *sendbuf, void *recvbuf, const size_t *cnt,
                                      const size_t *off, tdm_dtype dt, tdm_redop op);
tdm_status tdm__allgather_direct(struct tdm_comm *c, const void *sendbuf, void *recvbuf, const size_t *cnt,
                                 const size_t *off, tdm_dtype dt);
tdm_status tdm__allreduce_direct(struct tdm_comm *c, void *buf, size_t count, tdm_dtype dt, tdm_redop op);
/* Exchanges with peers while reducing what arrives into dst, in 1 MiB chunks so scratch stays
 * small (algo/allreduce.c). to / from = -1: no send / no receive. */
tdm_status tdm__sendrecv_reduce(struct tdm_comm *c, int to, const char *sbuf, size_t sn, int from, char *dst,
                                size_t rn, tdm_dtype dt, tdm_redop op);
/* The power-of-two core of rhd / rd over the ranks that take part (me of p2, peers named by
 * old[]); the block ranges are tdm__blocks(count, p2). */
tdm_status tdm__rhd_halving(struct tdm_comm *c, int me, int p2, const int *old, char *buf, const size_t *cnt,
                            const size_t *off, tdm_dtype dt, tdm_redop op);
tdm_status tdm__rd_doubling(struct tdm_comm *c, int me, int p2, const int *old, char *buf, const size_t *cnt,
                            const size_t *off, size_t es);

#endif
