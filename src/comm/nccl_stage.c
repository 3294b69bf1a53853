/* Host staging for device collectives (tandem/comm_device.h, STAGE mode): several ranks on one GPU,
 * which NCCL refuses. The device buffer is copied into pinned host memory, the host communicator
 * runs the collective with its rank-order algorithm (shm on one node: every element summed in rank
 * order 0..P-1), and the result is copied back on the caller's stream. So the result is bit for bit
 * the CPU collective's on the same data, whatever the number of ranks. */
#ifdef TANDEM_HAVE_NCCL
#include <string.h>
#include <time.h>

#include "comm/nccl_impl.h"

void tdm__dstage_free(struct tdm_dcomm *d) {
  if (d->h2d_pending) { /* the last copy back reads the buffer: wait for it (bounded) */
    double until = tdm_time_now() + d->timeout_s;
    while (cudaEventQuery(d->h2d_ev) == cudaErrorNotReady && tdm_time_now() < until) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
  }
  if (d->stage) cudaFreeHost(d->stage);
  if (d->stage_ev) cudaEventDestroy(d->stage_ev);
  if (d->h2d_ev) cudaEventDestroy(d->h2d_ev);
  d->stage = NULL, d->stage_ev = d->h2d_ev = NULL;
}

/* Pinned memory of at least n bytes, grown by doubling (no allocation in the steady state). */
static tdm_status stage_buffer(struct tdm_dcomm *d, size_t n) {
  if (n <= d->stage_bytes) return TDM_OK;
  size_t want = d->stage_bytes ? d->stage_bytes : (1u << 20);
  while (want < n) want *= 2;
  if (d->stage) cudaFreeHost(d->stage);
  d->stage = NULL, d->stage_bytes = 0;
  cudaError_t e = cudaMallocHost(&d->stage, want);
  if (e != cudaSuccess) {
    d->stage = NULL;
    return tdm__dcomm_cuda_fail(d, e, "staging: cudaMallocHost");
  }
  d->stage_bytes = want;
  return TDM_OK;
}

tdm_status tdm__dstage_run(struct tdm_dcomm *d, const tdm__dcall *call, const void *sendbuf, void *recvbuf, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  tdm_dtype dt = (tdm_dtype)call->dtype;
  tdm_redop op = (tdm_redop)call->op;
  size_t es = tdm_dtype_size(dt), n = call->count, P = (size_t)d->size;
  size_t in = n, out = n; /* elements copied to the host and back */
  if (call->kind == TDM__DCOLL_REDUCE_SCATTER) in = n * P;
  if (call->kind == TDM__DCOLL_ALLGATHER) out = n * P;
  /* the host input, then (reduce-scatter and all-gather, which are not in place) the host output */
  int separate = call->kind == TDM__DCOLL_REDUCE_SCATTER || call->kind == TDM__DCOLL_ALLGATHER;
  size_t in_bytes = in * es, out_bytes = out * es, pad = (in_bytes + 255) & ~(size_t)255;
  /* the previous call's copy back may still read the buffer */
  if (d->h2d_pending) {
    TDM__TRY(tdm__dcomm_wait_event(d, d->h2d_ev, "staging: the previous copy back to the device"));
    d->h2d_pending = 0;
  }
  TDM__TRY(stage_buffer(d, separate ? pad + out_bytes : in_bytes));
  char *hin = d->stage, *hout = separate ? hin + pad : hin;
  int copy_in = call->kind != TDM__DCOLL_BROADCAST || call->root == d->rank;
  char w[160];
  tdm__dcall_str(call, w, sizeof w);
  cudaError_t e = cudaSuccess;
  if (copy_in) {
    if ((e = cudaMemcpyAsync(hin, sendbuf, in_bytes, cudaMemcpyDeviceToHost, s)) != cudaSuccess ||
        (e = cudaEventRecord(d->stage_ev, s)) != cudaSuccess)
      return tdm__dcomm_cuda_fail(d, e, "staging: copy to the host");
    TDM__TRY(tdm__dcomm_wait_event(d, d->stage_ev, "staging: the copy to the host"));
  }
  tdm_comm_t h = d->host;
  tdm_algo a = tdm_comm_rank_order_algo(h);
  tdm_status st;
  switch (call->kind) {
  case TDM__DCOLL_ALLREDUCE: st = tdm_comm_allreduce(h, hin, hin, n, dt, op, a); break;
  case TDM__DCOLL_REDUCE_SCATTER: st = tdm_comm_reduce_scatter(h, hin, hout, n, dt, op, a); break;
  case TDM__DCOLL_ALLGATHER: st = tdm_comm_allgather(h, hin, hout, n, dt, TDM_ALGO_AUTO); break;
  default: st = tdm_comm_broadcast(h, hin, n, dt, call->root, TDM_ALGO_AUTO); break;
  }
  if (st != TDM_OK) return tdm__dcomm_fail(d, st, "rank %d: %s (staged): %s", d->rank, w, tdm_last_error());
  if ((e = cudaMemcpyAsync(recvbuf, hout, out_bytes, cudaMemcpyHostToDevice, s)) != cudaSuccess ||
      (e = cudaEventRecord(d->h2d_ev, s)) != cudaSuccess)
    return tdm__dcomm_cuda_fail(d, e, "staging: copy back to the device");
  d->h2d_pending = 1;
  return TDM_OK;
}
#else
typedef int tdm__nccl_stage_not_built; /* a translation unit may not be empty */
#endif
