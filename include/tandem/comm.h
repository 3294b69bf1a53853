/* tandem — communicators and collectives.
 *
 * A communicator is a group of ranks that exchange typed buffers. Collectives are built from
 * point-to-point messages by algorithms (src/comm/algo) that know nothing of transports; a
 * transport (thread, shm, tcp) moves bytes between two ranks and knows nothing of algorithms.
 *
 *   tdm_comm_t c;
 *   if (tdm_comm_create_from_env(&c) != TDM_OK) { fprintf(stderr, "%s\n", tdm_last_error()); ... }
 *   tdm_comm_allreduce(c, buf, buf, n, TDM_F32, TDM_SUM, TDM_ALGO_AUTO);   // in place
 *   tdm_comm_destroy(c);
 *
 * Never hang: every blocking call gives up after the communicator's timeout (default 300 s,
 * TANDEM_TIMEOUT=seconds, or the config). A peer that dies or closes its connection makes every
 * pending and later call fail within seconds with TDM_ERR_REMOTE naming that rank and the call.
 * Every collective carries (sequence number, kind, dtype, op, count, root, communicator) in its
 * messages, or publishes it in shared memory, and every rank checks its peers' before it uses
 * their data: a mismatch is TDM_ERR_MISMATCH on every rank of the call, naming both calls (rooted
 * collectives, where a rank may only send, first exchange identities around the group). After any such error the communicator is failed: every later call returns the
 * same error until it is destroyed. tdm_comm_last_error gives the detail.
 *
 * Thread safety: a communicator is used by one thread at a time (the data-parallel engine runs
 * collectives from its own communication thread). Buffers: send and receive buffers may be the
 * same (in place) where stated; otherwise they must not overlap.
 */
#ifndef TANDEM_COMM_H
#define TANDEM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"
#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_comm *tdm_comm_t;

typedef enum { TDM_SUM = 0, TDM_AVG, TDM_PROD, TDM_MIN, TDM_MAX, TDM_REDOP_COUNT } tdm_redop;
const char *tdm_redop_name(tdm_redop op);

typedef enum {
  TDM_TRANSPORT_AUTO = 0, /* thread for in-process groups, tcp across processes */
  TDM_TRANSPORT_THREAD,
  TDM_TRANSPORT_SHM,
  TDM_TRANSPORT_TCP,
  TDM_TRANSPORT_MPI,
  TDM_TRANSPORT_COUNT
} tdm_transport_kind;
const char *tdm_transport_name(tdm_transport_kind k);

/* Algorithms. AUTO picks by size and world size (docs/algorithms.md). TANDEM_ALGO overrides AUTO
 * per collective: "allreduce=rhd,broadcast=chain" names one per collective (allreduce, broadcast,
 * reduce, reducescatter, allgather, gather, scatter, alltoall), and a plain name ("ring") applies
 * to every collective it can run on this communicator and leaves the others on AUTO. It is read
 * at tdm_comm_create: an unknown algorithm or collective, an algorithm that cannot run a
 * collective named for it, or a plain name that fits none, is TDM_ERR_INVALID_ARG there. An
 * algorithm passed to a call wins over both; one that does not apply is TDM_ERR_NOT_SUPPORTED. */
typedef enum {
  TDM_ALGO_AUTO = 0,
  TDM_ALGO_RING,     /* all-reduce, reduce-scatter, all-gather */
  TDM_ALGO_RD,       /* recursive doubling: all-reduce, all-gather */
  TDM_ALGO_RHD,      /* recursive halving-doubling (Rabenseifner): all-reduce, reduce-scatter */
  TDM_ALGO_TREE,     /* binary tree reduce + broadcast: all-reduce; binomial tree: broadcast, reduce */
  TDM_ALGO_CHAIN,    /* pipelined chain: broadcast */
  TDM_ALGO_DIRECT,   /* linear: gather, scatter, all-to-all pairwise; all-reduce, reduce-scatter and
                        all-gather straight between every pair, reducing in rank order */
  TDM_ALGO_SHM,      /* single-node shared memory, reduce from peers' buffers (shm transport):
                        all-reduce, reduce-scatter, all-gather */
  TDM_ALGO_HIER,     /* hierarchical all-reduce for ranks on several nodes (a whole tcp / mpi
                        communicator): reduce-scatter in each node over shared memory, all-reduce
                        between nodes, all-gather in the node; AUTO's choice there (see below) */
  TDM_ALGO_COUNT
} tdm_algo;
const char *tdm_algo_name(tdm_algo a);
/* Parses a name ("ring", "rhd", ...); TDM_ERR_INVALID_ARG listing the names if unknown. */
tdm_status tdm_algo_parse(const char *name, tdm_algo *out);

typedef struct tdm_comm_config {
  int rank, size;
  tdm_transport_kind transport;
  double timeout_s;        /* every blocking wait; 0: TANDEM_TIMEOUT or 300 */
  /* tcp / shm rendezvous: rank 0 hosts a key-value store at master_addr:master_port */
  const char *master_addr; /* default 127.0.0.1 */
  int master_port;         /* default 29500 */
  const char *job_token;   /* every connection must present it; default TANDEM_JOB_TOKEN or "" */
  const char *store_dir;   /* instead of the TCP store: a directory shared by all ranks */
  const char *ifname;      /* tcp: interface to bind (TANDEM_SOCKET_IFNAME); NULL: automatic */
  void *thread_group;      /* thread transport: from tdm_comm_thread_group_create */
  /* What every rank must see alike (under srun: job, step, tasks, node list; tandem/cluster.h);
   * the store compares each rank's with rank 0's at rendezvous. NULL: nothing to check. */
  const char *job_ident;
} tdm_comm_config;

/* Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun), OMPI_COMM_WORLD_RANK/SIZE (Open MPI),
 * PMI_RANK/PMI_SIZE, a task of srun (tandem/cluster.h: rank 0's address from the node list, the
 * port from the job id, the MPI transport under mpirun across nodes with no MASTER_ADDR), plus TANDEM_TRANSPORT, TANDEM_TIMEOUT,
 * TANDEM_JOB_TOKEN, TANDEM_STORE_DIR, TANDEM_SOCKET_IFNAME. Without any of them: rank 0 of 1.
 * A malformed value is TDM_ERR_INVALID_ARG naming the variable, its value and what is valid.
 * tdm_comm_create reads TANDEM_TIMEOUT (when cfg.timeout_s is 0), LOCAL_WORLD_SIZE (or
 * OMPI_COMM_WORLD_LOCAL_SIZE), TANDEM_ALGO and TANDEM_NET_EMULATE itself, as strictly, and over
 * tcp / mpi, when the ranks may be on several nodes (LOCAL_WORLD_SIZE is not the world size, or
 * TANDEM_NODE_ID is set: on every rank or none), learns each rank's node (TANDEM_NODE_ID, else the
 * host name) with one all-gather; ranks on several nodes get TDM_ALGO_HIER's plan, and
 * TANDEM_NET_EMULATE then slows only the links between nodes. */
tdm_status tdm_comm_config_from_env(tdm_comm_config *cfg);
/* Over tcp a rank needs a descriptor per peer (rank 0 the store's too): a soft RLIMIT_NOFILE below
 * that is raised toward the hard limit; a hard limit below it is TDM_ERR_SYSTEM naming both. */
tdm_status tdm_comm_create(tdm_comm_t *out, const tdm_comm_config *cfg);
tdm_status tdm_comm_create_from_env(tdm_comm_t *out);
/* Closes connections and frees everything. Safe on a failed communicator. */
void tdm_comm_destroy(tdm_comm_t c);

/* Removes the names of the shared-memory segments this process created whose set-up has not ended
 * (rank 0 unlinks each once every rank has mapped it). Async-signal-safe: for a handler of a
 * signal that ends the process (SIGTERM, SIGINT) in the middle of a set-up, which would leave the
 * segment in /dev/shm; tandem's command installs one. */
void tdm_shm_remove_pending(void);
/* Marks the communicator failed and wakes every blocked call on it (from any thread); peers see
 * the connection close. The handle must still be destroyed. */
void tdm_comm_abort(tdm_comm_t c);
/* As tdm_comm_abort, with the reason the peers are told (their failing call names it) and the
 * status they fail with (MISMATCH and TIMEOUT as given, anything else REMOTE). Not thread-safe
 * against calls on c. */
void tdm_comm_abort_why(tdm_comm_t c, tdm_status st, const char *why);

int tdm_comm_rank(tdm_comm_t c);
int tdm_comm_size(tdm_comm_t c);
tdm_transport_kind tdm_comm_transport(tdm_comm_t c);
/* TDM_OK, or the error that failed the communicator. */
tdm_status tdm_comm_status(tdm_comm_t c);
const char *tdm_comm_last_error(tdm_comm_t c);
/* Given a NULL communicator these set tdm_last_error() and return: rank -1, size 0, transport
 * TDM_TRANSPORT_COUNT, status TDM_ERR_INVALID_ARG, last_error a message saying so. */
void tdm_comm_set_timeout(tdm_comm_t c, double seconds);
/* Bytes this rank has sent on c since it was created (0 for NULL), to measure a step's
 * communication volume: the payloads of c's messages (headers not counted), and for the shm
 * collectives and shared regions, which move no messages, the bytes of this rank's data that
 * peers read from shared memory or that it writes into theirs: what a message algorithm would
 * send. On 2 ranks an all-reduce of n bytes counts n, a reduce-scatter or all-gather n/2, as a
 * ring. A sub-communicator counts its own calls, not its parent's. Any thread may read it. */
uint64_t tdm_comm_bytes_sent(tdm_comm_t c);
/* This rank's clock (tdm_time_now) against rank 0's, by `rounds` ping-pongs with rank 0 (the one
 * with the shortest round trip counts): rank 0's clock reads now + *offset, within
 * +- *uncertainty (half that round trip), in seconds. Rank 0 gets 0 and 0. Collective over c;
 * the traces use it (tandem/trace.h). */
tdm_status tdm_comm_clock_offset(tdm_comm_t c, int rounds, double *offset, double *uncertainty);

/* The thread transport: n ranks as threads of this process share a group. Create it once,
 * then each thread creates its communicator with cfg.thread_group = group. */
tdm_status tdm_comm_thread_group_create(void **group, int size);
void tdm_comm_thread_group_destroy(void *group);

/* Sub-communicators (MPI_Comm_split): ranks with the same color form a group, ordered by key
 * then old rank. Collective over c. color < 0: this rank joins none (*out = NULL). */
tdm_status tdm_comm_split(tdm_comm_t c, int color, int key, tdm_comm_t *out);
/* A sub-communicator of ranks[0..n) of c (increasing; the child's rank order), made without any
 * message: every member calls it with the same list, knowing it from elsewhere (the survivors of a
 * parameter server's lost workers, told by the servers). A non-member gets *out = NULL. Lives
 * inside c's transport as a split's child does: destroy it before c. */
tdm_status tdm_comm_subset(tdm_comm_t c, const int *ranks, int n, tdm_comm_t *out);

/* ---- point to point ------------------------------------------------------------------------
 * Messages between two ranks arrive in the order sent; a receive names its tag and size, and a
 * message with another tag or size is TDM_ERR_MISMATCH. */
tdm_status tdm_comm_send(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes);
tdm_status tdm_comm_recv(tdm_comm_t c, int peer, int tag, void *buf, size_t nbytes);
/* Sends to `to` and receives from `from` at the same time (as MPI_Sendrecv): the way to swap
 * data with peers; a send followed by a receive on both sides may wait on each other. */
tdm_status tdm_comm_sendrecv(tdm_comm_t c, int to, const void *sendbuf, size_t sendbytes, int from, void *recvbuf,
                             size_t recvbytes, int tag);

/* Several sends and receives run together, none waiting for another (as MPI_Startall and
 * Waitall, or a NCCL group): neighbours that exchange in both directions at once cannot wait on
 * each other. Returns when all are done. Messages with one peer in one direction go in array order;
 * each carries its tag and size, which the receiver checks (TDM_ERR_MISMATCH naming both). */
typedef struct tdm_p2p_op {
  int peer;
  int is_send;
  int tag;
  void *buf; /* a send only reads it */
  size_t nbytes;
} tdm_p2p_op;
tdm_status tdm_comm_p2p_batch(tdm_comm_t c, const tdm_p2p_op *ops, int n);
/* ---- tagged messages (servers) ---------------------------------------------------------------
 * Matched by (source, tag) as MPI does: a tagged receive takes the first tagged message with its
 * tag from source, or from whichever rank has one first (TDM_ANY_SOURCE; *from gets the sender;
 * ranks are served in turn, so a busy one cannot starve the others). Tagged messages it meets
 * with other tags wait, in order, for the receive that names them. They never mix with other
 * traffic on the communicator: a collective or plain receive that meets one keeps it for later;
 * a tagged receive that meets a collective's message fails with TDM_ERR_MISMATCH naming both.
 * capacity bounds the message: a larger one is TDM_ERR_MISMATCH naming both sizes (*nbytes
 * gets the size received). Headers are checked as every message's; every wait has the timeout
 * (TDM_ERR_TIMEOUT); a peer that dies fails the receive naming it (with any source: one that
 * dies while nothing has arrived), and as every error, fails the communicator. Transports
 * thread, shm and tcp (mpi: TDM_ERR_NOT_SUPPORTED). */
#define TDM_ANY_SOURCE (-1)
tdm_status tdm_comm_tsend(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes);
tdm_status tdm_comm_trecv(tdm_comm_t c, int source, int tag, void *buf, size_t capacity, int *from, size_t *nbytes);
/* From whichever of ranks[0..n) sends first (a server that no longer waits for the clients that
 * finished, whose connections may close). */
tdm_status tdm_comm_trecv_among(tdm_comm_t c, const int *ranks, int n, int tag, void *buf, size_t capacity, int *from,
                                size_t *nbytes);
/* As tdm_comm_trecv_among, but a candidate that is lost (its connection closed or reset, its
 * process gone, or it aborted) fails only this receive: *lost gets its rank (else -1), the status
 * (TDM_ERR_REMOTE mostly) and tdm_last_error() say why, and the communicator stays usable with the
 * other ranks; the caller must not exchange with the lost rank again (its stream stopped at an
 * unknown point). Any other failure (a corrupt header, a timeout with none sending) fails the
 * communicator as usual. How a parameter server goes on without a dead worker. */
tdm_status tdm_comm_trecv_among_lossy(tdm_comm_t c, const int *ranks, int n, int tag, void *buf, size_t capacity, int *from,
                                      size_t *nbytes, int *lost);

/* ---- collectives (blocking) ------------------------------------------------------------------
 * count is in elements. sendbuf == recvbuf works in place for allreduce, reduce, broadcast. */
tdm_status tdm_comm_allreduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_redop op, tdm_algo algo);
tdm_status tdm_comm_broadcast(tdm_comm_t c, void *buf, size_t count, tdm_dtype dt, int root, tdm_algo algo);
/* recvbuf matters on root only. */
tdm_status tdm_comm_reduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                           tdm_redop op, int root, tdm_algo algo);
/* sendbuf holds size x recvcount elements; rank r receives the reduction of block r. */
tdm_status tdm_comm_reduce_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt,
                                   tdm_redop op, tdm_algo algo);
/* recvbuf holds size x sendcount elements: block r from rank r. In place when sendbuf ==
 * recvbuf + rank * sendcount. */
tdm_status tdm_comm_allgather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt,
                              tdm_algo algo);

/* Blocks of any count. The partition every block algorithm uses: count elements over size ranks,
 * block r holds count/size elements plus one if r < count % size, blocks in rank order, so
 *   *offset = r * (count/size) + min(r, count % size),  *len = count/size + (r < count % size).
 * Sizes are 64-bit: counts up to 2^40 elements. A size below 1 or r outside 0..size-1: an empty
 * block at 0. */
void tdm_comm_block(size_t count, int size, int r, size_t *offset, size_t *len);
/* Reduce-scatter of a buffer of count elements (any count): recvbuf gets the reduction of block
 * r (tdm_comm_block) on rank r. With the algorithm the matching all-reduce uses (ring; rhd on a
 * power-of-two world; shm, the default on the shm transport) block r is bit for bit what
 * tdm_comm_allreduce leaves there: ring reduce-scatter then ring all-gather is the ring
 * all-reduce, and every shm reduction sums in rank order. Not in place. */
tdm_status tdm_comm_reduce_scatter_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                          tdm_redop op, tdm_algo algo);
/* All-gather into a buffer of count elements: sendbuf holds block r (tdm_comm_block) of rank r.
 * In place when sendbuf == recvbuf + offset of block r. */
tdm_status tdm_comm_allgather_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                     tdm_algo algo);
/* Any partition: rank q's part is parts[q] elements (parts has size entries adding up to count,
 * the same on every rank: ranks that split differently fail with TDM_ERR_MISMATCH), laid out in
 * rank order. Algorithms: ring, direct, shm (AUTO: shm where usable, else ring).
 * Rank order: with TDM_ALGO_DIRECT (any transport) and TDM_ALGO_SHM every element is reduced in
 * rank order 0..size-1, so the result does not depend on the partition, on the transport or on
 * whether it is an all-reduce (DIRECT, SHM) or a reduce-scatter: the one summation order the
 * parallelism engines use, which makes every layout give the same bits. */
tdm_status tdm_comm_reduce_scatter_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                     tdm_dtype dt, tdm_redop op, tdm_algo algo);
tdm_status tdm_comm_allgather_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                tdm_dtype dt, tdm_algo algo);
/* The rank-order algorithm for c: TDM_ALGO_SHM on the shm transport over a whole communicator,
 * else TDM_ALGO_DIRECT (also for a NULL c). */
tdm_algo tdm_comm_rank_order_algo(tdm_comm_t c);
tdm_status tdm_comm_gather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt, int root);
tdm_status tdm_comm_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt, int root);
/* Block j of sendbuf (count elements) goes to rank j; block i of recvbuf comes from rank i. */
tdm_status tdm_comm_alltoall(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt);
tdm_status tdm_comm_barrier(tdm_comm_t c);

/* ---- non-blocking ------------------------------------------------------------------------------
 * The call is queued to the communicator's progress thread and runs in order with the other
 * queued calls; buffers must stay valid until wait. tdm_work_test returns 1 when done (-1 for a NULL handle). A handle
 * that is never waited for (an error path that gives up) is freed by tdm_comm_destroy, after
 * which it must not be used.
 * A blocking call waits until the queue is empty, so calls keep the order they were made in.
 * Consequence: an isend whose message is larger than the transport buffers (or any message under
 * MPI) completes only once the peer receives it, so "isend to B, then blocking recv from B" on
 * both A and B waits until the timeout. Use tdm_comm_sendrecv for such swaps. */
typedef struct tdm_work *tdm_work_t;
tdm_status tdm_comm_iallreduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                               tdm_redop op, tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_ibroadcast(tdm_comm_t c, void *buf, size_t count, tdm_dtype dt, int root, tdm_algo algo,
                               tdm_work_t *work);
tdm_status tdm_comm_ireduce(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt, tdm_redop op,
                            int root, tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_ireduce_scatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt,
                                    tdm_redop op, tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_iallgather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt,
                               tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_ireduce_scatter_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                           tdm_redop op, tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_iallgather_blocks(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                                      tdm_algo algo, tdm_work_t *work);
/* parts must stay valid until the wait, as the buffers. */
tdm_status tdm_comm_ireduce_scatter_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                      tdm_dtype dt, tdm_redop op, tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_iallgather_v(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, const size_t *parts,
                                 tdm_dtype dt, tdm_algo algo, tdm_work_t *work);
tdm_status tdm_comm_igather(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt, int root,
                            tdm_work_t *work);
tdm_status tdm_comm_iscatter(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt, int root,
                             tdm_work_t *work);
tdm_status tdm_comm_ialltoall(tdm_comm_t c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                              tdm_work_t *work);
tdm_status tdm_comm_ibarrier(tdm_comm_t c, tdm_work_t *work);
tdm_status tdm_comm_isend(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes, tdm_work_t *work);
tdm_status tdm_comm_irecv(tdm_comm_t c, int peer, int tag, void *buf, size_t nbytes, tdm_work_t *work);
int tdm_work_test(tdm_work_t w);
/* Waits (within the communicator's timeout), returns the call's status, frees the handle. */
tdm_status tdm_work_wait(tdm_work_t w);

/* Reduces n elements: dst[i] = dst[i] op src[i] (avg accumulates as sum). Thread-safe. */
tdm_status tdm_reduce_local(void *dst, const void *src, size_t n, tdm_dtype dt, tdm_redop op);


/* ---- shared buffers ---------------------------------------------------------------------------
 * One f32 area per rank in memory that every rank of the communicator maps (the shm transport's
 * ranks on one node, the thread transport's in one process), for collectives on data that lives
 * there, with no copy in or out: data parallelism keeps its gradients in one and averages each
 * bucket in place, ZeRO stage 1 reduce-scatters them in place.
 *   tdm_shared_t s;
 *   tdm_shared_create(comm, n, &s);            // collective; fails alike on every rank
 *   float *g = tdm_shared_mine(s);             // this rank's n floats
 *   ... write g ...
 *   tdm_shared_allreduce(s, 0, n, 1);          // every area holds the average, summed in rank order
 *   tdm_shared_destroy(s);
 * Create needs a communicator over all of its transport's ranks (not a sub-communicator of one)
 * and no emulated network (TANDEM_NET_EMULATE, whose links the data would bypass); elsewhere
 * TDM_ERR_NOT_SUPPORTED, the same on every rank, and the caller falls back to a collective.
 * The operations are collective, in the same order on all ranks, and may run on another thread
 * than the communicator's other calls (they use none of its call state; not two at once on one
 * buffer). Each publishes its identity (operation, round, span, pieces, average) and checks every
 * peer's before it reads a peer's area: a rank in another operation or span fails with
 * TDM_ERR_MISMATCH naming both; every wait has the communicator's timeout and notices a dead peer;
 * a failure fails the communicator and wakes every peer. Elements [lo, hi) of the areas are cut
 * into one piece per rank: cut[q] .. cut[q+1] (cut: size+1 ascending offsets from lo to hi), or
 * with cut NULL the blocks of tdm_comm_block(hi - lo, size, q) from lo. Rank q owns piece q.
 *   allreduce:      each rank sums its piece across all areas in rank order 0..P-1 (average: then
 *                   divides by P) and writes the result into every area;
 *   reduce_scatter: the same sum, written only into its own area (other areas keep their data);
 *   allgather:      copies every rank's piece from its owner's area into its own.
 * So reduce_scatter then allgather leaves every area bit for bit as allreduce does, and as the
 * rank-order collectives (tdm_comm_rank_order_algo) would. Each returns when no peer reads this
 * rank's area any more: it may be written at once. */
typedef struct tdm_shared *tdm_shared_t;
tdm_status tdm_shared_create(tdm_comm_t c, size_t floats_per_rank, tdm_shared_t *out);
void tdm_shared_destroy(tdm_shared_t s); /* this rank's view; not collective; NULL is fine */
float *tdm_shared_mine(tdm_shared_t s);
size_t tdm_shared_floats(tdm_shared_t s);
tdm_status tdm_shared_allreduce(tdm_shared_t s, size_t lo, size_t hi, int average);
tdm_status tdm_shared_reduce_scatter(tdm_shared_t s, size_t lo, size_t hi, const int64_t *cut, int average);
tdm_status tdm_shared_allgather(tdm_shared_t s, size_t lo, size_t hi, const int64_t *cut);

#ifdef __cplusplus
}
#endif
#endif
