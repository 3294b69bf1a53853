/* tandem — collectives on GPU buffers (NCCL, or host staging where ranks share a GPU).
 *
 * A device communicator is made from a tandem communicator (every rank calls, as for any
 * collective). It runs all-reduce, reduce-scatter, all-gather and broadcast on CUDA device memory,
 * enqueued on a CUDA stream, in f32 or bf16:
 *
 *   tdm_dcomm_t d;
 *   if (tdm_dcomm_create(host, NULL, &d) != TDM_OK) { fprintf(stderr, "%s\n", tdm_last_error()); ... }
 *   tdm_dcomm_allreduce(d, grad, grad, n, TDM_F32, TDM_AVG, stream);  // device pointers, in place
 *   tdm_dcomm_synchronize(d, stream);                                 // waits, within the timeout
 *   tdm_dcomm_destroy(d);
 *
 * Two ways to move the data, chosen at creation (tdm_dcomm_mode):
 *   NCCL   one GPU per rank (several GPUs, several nodes): NCCL's collectives, straight between GPUs.
 *          Rank 0 makes the NCCL unique id and broadcasts it over the host communicator.
 *   STAGE  several ranks on one GPU (NCCL refuses that): device -> pinned host memory -> the host
 *          communicator's rank-order collective (tdm_comm_rank_order_algo: shm on one node) ->
 *          device. Its results are bit for bit those of the CPU collective on the same data.
 * AUTO (the default) picks STAGE when two ranks of the group use the same GPU of the same host,
 * else NCCL. TANDEM_DEVICE_COLL=auto|nccl|stage overrides AUTO (a malformed value is
 * TDM_ERR_INVALID_ARG naming it); NCCL forced on a shared GPU is TDM_ERR_NOT_SUPPORTED naming the
 * ranks and the GPU.
 *
 * Checks and timeouts are tandem's, not NCCL's. Before any data moves, every rank sends the call's
 * identity (collective, sequence number, dtype, op, count, root) to every other over the host
 * communicator and checks what it receives: a rank that calls another collective or count fails
 * every rank of the call with TDM_ERR_MISMATCH naming both calls, before NCCL is called; ranks
 * that do not arrive within the timeout are named (TDM_ERR_TIMEOUT), and a dead one is named
 * (TDM_ERR_REMOTE). In NCCL mode a watchdog thread polls NCCL's asynchronous error and the age of
 * every collective in flight (a CUDA event recorded after it); one older than the timeout, or an
 * NCCL error, aborts the NCCL communicator (ncclCommAbort, which ends its kernels) and fails d; the
 * next call or synchronize on this rank then asks every rank over the host communicator which are
 * still there and names those that do not answer. The timeout: cfg->timeout_s, else
 * TANDEM_DEVICE_TIMEOUT (seconds), else the host communicator's. After any error d is failed:
 * every later call returns the same error until it is destroyed.
 *
 * Errors before anything is enqueued: a tandem built without NCCL (cmake/nccl.cmake found no CUDA
 * toolkit or NCCL) is TDM_ERR_NOT_SUPPORTED saying so; no CUDA device, or a device number out of
 * range, TDM_ERR_NOT_SUPPORTED / TDM_ERR_INVALID_ARG naming it. Creation fails alike on every rank
 * (each rank's outcome is exchanged), naming the rank that could not start and why.
 *
 * Ownership and threads: d borrows host (which must outlive d) and makes its own sub-communicator
 * of it for the checks. Calls on d are calls on host: one thread at a time, and not at the same
 * time as host's own calls (the engine's communication thread runs both). Buffers are device
 * pointers; they must stay valid until the stream has run the collective (tdm_dcomm_synchronize
 * or the caller's own stream wait). stream is a cudaStream_t (NULL: the legacy default stream).
 */
#ifndef TANDEM_COMM_DEVICE_H
#define TANDEM_COMM_DEVICE_H

#include <stddef.h>

#include "tandem/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_dcomm *tdm_dcomm_t;

typedef enum { TDM_DCOMM_AUTO = 0, TDM_DCOMM_NCCL, TDM_DCOMM_STAGE, TDM_DCOMM_MODE_COUNT } tdm_dcomm_mode;
const char *tdm_dcomm_mode_name(tdm_dcomm_mode m);

typedef struct tdm_dcomm_config {
  int device;          /* CUDA device number; -1: LOCAL_RANK modulo the device count, else the current one */
  tdm_dcomm_mode mode; /* AUTO: TANDEM_DEVICE_COLL, else by whether ranks share a GPU */
  double timeout_s;    /* every wait; 0: TANDEM_DEVICE_TIMEOUT, else the host communicator's */
} tdm_dcomm_config;
/* {device = -1, AUTO, 0}: what a NULL config means. */
tdm_dcomm_config tdm_dcomm_config_default(void);

/* 1 when this tandem was built with NCCL (cmake/nccl.cmake), else 0. */
int tdm_dcomm_built(void);
/* 1 when a CUDA device is usable here (and tandem was built with NCCL); *why (may be NULL) says
 * why not otherwise (static text). */
int tdm_dcomm_device_available(const char **why);

/* Collective over host: every rank calls it. */
tdm_status tdm_dcomm_create(tdm_comm_t host, const tdm_dcomm_config *cfg, tdm_dcomm_t *out);
/* Waits (within the timeout) for d's collectives in flight, then frees everything; safe on a failed
 * d (its NCCL communicator is aborted, not finalized). */
void tdm_dcomm_destroy(tdm_dcomm_t d);

int tdm_dcomm_rank(tdm_dcomm_t d);
int tdm_dcomm_size(tdm_dcomm_t d);
int tdm_dcomm_device(tdm_dcomm_t d);
tdm_dcomm_mode tdm_dcomm_mode_of(tdm_dcomm_t d);
double tdm_dcomm_timeout(tdm_dcomm_t d);
/* TDM_OK, or the error that failed d; the text of it. */
tdm_status tdm_dcomm_status(tdm_dcomm_t d);
const char *tdm_dcomm_last_error(tdm_dcomm_t d);

/* count is in elements; dtypes TDM_F32 and TDM_BF16; ops sum, avg, prod, min, max.
 * all-reduce: in place when sendbuf == recvbuf. reduce-scatter: sendbuf holds size x recvcount
 * elements, rank r receives block r. all-gather: recvbuf holds size x sendcount, block r from rank
 * r. broadcast: count elements of buf from root, in place. */
tdm_status tdm_dcomm_allreduce(tdm_dcomm_t d, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                               tdm_redop op, void *stream);
tdm_status tdm_dcomm_reduce_scatter(tdm_dcomm_t d, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt,
                                    tdm_redop op, void *stream);
tdm_status tdm_dcomm_allgather(tdm_dcomm_t d, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt,
                               void *stream);
tdm_status tdm_dcomm_broadcast(tdm_dcomm_t d, void *buf, size_t count, tdm_dtype dt, int root, void *stream);
/* Waits until stream has run everything enqueued on it; returns d's error if a collective failed
 * meanwhile (the watchdog fails a stuck one at the timeout). Gives up itself after 2 x timeout + 1 s
 * (the stream's other work counts too), aborting NCCL. */
tdm_status tdm_dcomm_synchronize(tdm_dcomm_t d, void *stream);

#ifdef __cplusplus
}
#endif
#endif
