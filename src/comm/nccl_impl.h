/* Device communicator internals shared by nccl.c (creation, checks, NCCL, the watchdog) and
 * nccl_stage.c (host staging). Only compiled into a tandem built with NCCL (TANDEM_HAVE_NCCL). */
#ifndef TANDEM_NCCL_IMPL_H
#define TANDEM_NCCL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/comm_impl.h"
#include "tandem/comm_device.h"

enum { TDM__DCOLL_ALLREDUCE = 0, TDM__DCOLL_REDUCE_SCATTER, TDM__DCOLL_ALLGATHER, TDM__DCOLL_BROADCAST,
       TDM__DCOLL_PROBE /* after a watchdog abort: who is still there */ };

/* A call's identity, sent to every peer before data moves (nccl.c: arrive). */
typedef struct tdm__dcall {
  uint32_t magic, kind, dtype, op;
  int32_t root, pad;
  uint64_t seq, count;
} tdm__dcall;

#define TDM__DCOMM_INFLIGHT 64 /* collectives in flight before a call waits for the oldest */

struct tdm_dcomm {
  tdm_comm_t host; /* the caller's communicator (borrowed): staged data moves over it */
  tdm_comm_t ctl;  /* our split of host (owned): identity checks and probes, with our timeout */
  int rank, size, device;
  tdm_dcomm_mode mode;
  double timeout_s;
  uint64_t seq;
  _Atomic int failed;
  tdm_status fail_status;
  char error[1024];
  int probe_pending; /* the watchdog aborted: name the ranks that are gone at the next call */
  uint64_t probe_seq;
  pthread_mutex_t mu; /* the NCCL communicator and the in-flight ring: user thread vs watchdog */
  /* NCCL mode */
  ncclComm_t nccl;
  pthread_t wd;
  int wd_started;
  _Atomic int wd_stop;
  struct {
    cudaEvent_t ev;
    double t0;
    tdm__dcall call;
  } fl[TDM__DCOMM_INFLIGHT];
  int fl_head, fl_n;
  /* test hook (tdm__dcomm_inject_stall): the next NCCL collective's completion is held back by a
   * host function on its stream until the watchdog aborts (or 4 timeouts pass) */
  int inject_stall;
  _Atomic int stall_release;
  /* STAGE mode: pinned host buffer and the event of the last copy back to the device */
  void *stage;
  size_t stage_bytes;
  cudaEvent_t stage_ev, h2d_ev;
  int h2d_pending;
};

/* Fails d (first error wins), sets the thread's error and returns st. */
tdm_status tdm__dcomm_fail(struct tdm_dcomm *d, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "device all-reduce #3 (1024 x f32, sum)" */
const char *tdm__dcall_str(const tdm__dcall *c, char *buf, size_t n);
/* Waits for ev within d's timeout (polling, so it can notice d failing); TDM_ERR_TIMEOUT naming what. */
tdm_status tdm__dcomm_wait_event(struct tdm_dcomm *d, cudaEvent_t ev, const char *what);
/* A CUDA error as d's failure: "what: cudaErrorX (text)". */
tdm_status tdm__dcomm_cuda_fail(struct tdm_dcomm *d, cudaError_t e, const char *what);

/* nccl_stage.c: the staged collective of call (already checked), on stream. */
tdm_status tdm__dstage_run(struct tdm_dcomm *d, const tdm__dcall *call, const void *sendbuf, void *recvbuf, void *stream);
void tdm__dstage_free(struct tdm_dcomm *d);

/* Test hook: the next NCCL collective on d does not complete (see inject_stall). */
void tdm__dcomm_inject_stall(struct tdm_dcomm *d);

#endif
