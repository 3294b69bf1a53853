/* tandem — data parallelism (DDP).
 *
 * Every rank holds the whole model; gradients are averaged across ranks after backward. At
 * creation the ranks prove they built the same model (names and shapes) and rank 0's parameters
 * are broadcast. Gradients are grouped into buckets — contiguous spans of the one gradient
 * buffer, in reverse parameter order, the first one small (1 MiB) so communication starts early,
 * the rest up to 25 MiB. The autograd hook of each parameter marks it ready; when a bucket's last
 * parameter is ready its all-reduce starts on the communicator's progress thread while backward
 * goes on. Buckets start in index order on every rank, so the collectives line up.
 *
 * Zero-copy on one node: over the shm transport with f32 gradients, the engine moves the
 * gradient buffer into a shared-memory region that every rank maps (tdm_params_set_grad_buffer;
 * tdm_params_grad returns the new address from then on, and the old one again after
 * tdm_dp_destroy). A bucket is then averaged in place: each rank sums its share of it across
 * all ranks' buffers, in rank order, and writes the result into all of them, bit-identical to the
 * copying all-reduce and with about a third of its memory traffic (counting loads and stores). When no core is spare (ranks
 * x threads >= cores), the buckets are averaged in tdm_dp_finish on the calling thread instead of
 * the communication thread, which could only take turns with backward (TANDEM_DP_INLINE=1 or 0
 * forces one way). TANDEM_DP_ZERO_COPY=0 turns the region off (the same on every rank).
 *
 *   tdm_dp *dp;
 *   tdm_dp_create(&dp, comm, params, NULL);          // defaults
 *   ... forward, tdm_backward (hooks launch buckets) ...
 *   tdm_dp_finish(dp, &wait_ms);                      // before the optimizer step
 *
 * With gradient accumulation call tdm_dp_set_sync(dp, 0) for the first K-1 micro-batches: hooks
 * then only note readiness, and nothing is sent until the K-th. Not thread-safe: one training
 * thread per engine (the communication happens on the communicator's own thread). A NULL dp is
 * TDM_ERR_INVALID_ARG; its getters then return 0 and set tdm_last_error().
 */
#ifndef TANDEM_DP_H
#define TANDEM_DP_H

#include <stddef.h>

#include "tandem/comm.h"
#include "tandem/compress.h"
#include "tandem/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_dp_config {
  size_t bucket_bytes;       /* 0: 25 MiB */
  size_t first_bucket_bytes; /* 0: 1 MiB */
  tdm_dtype wire_dtype;      /* TDM_F32, or TDM_BF16 / TDM_F16 to compress gradients on the wire */
  int no_overlap;            /* 1: start all buckets after backward (to measure what overlap hides) */
  const char *compress;      /* NULL or "none", or a compressor with error feedback: "topk:RATIO",
                                "powersgd:RANK" (tandem/compress.h); needs wire_dtype f32 */
  int64_t compress_start;    /* optimizer steps sent uncompressed first */
  uint64_t compress_seed;    /* PowerSGD's first Q: the same on every rank */
} tdm_dp_config;

typedef struct tdm_dp tdm_dp;
/* Collective over comm. Checks that every rank has the same parameter names and shapes
 * (TDM_ERR_MISMATCH naming the first rank and parameter that differ), then broadcasts rank 0's
 * parameter values. params must outlive the engine; hooks are installed on every parameter, and
 * on one node the gradient buffer may move (see above): fetch tdm_params_grad after this call. */
tdm_status tdm_dp_create(tdm_dp **out, tdm_comm_t comm, tdm_params *params, const tdm_dp_config *cfg);
/* Waits for anything in flight and moves the gradients back into params' own buffer. */
void tdm_dp_destroy(tdm_dp *dp);
/* sync = 0: this backward only accumulates (no communication); 1 (default): average. */
void tdm_dp_set_sync(tdm_dp *dp, int sync);
/* Starts what backward did not (parameters it never reached), waits for every bucket, and
 * leaves the averaged gradients in the gradient buffer. *wait_ms (optional) gets the time spent
 * waiting here: communication that backward did not hide. */
tdm_status tdm_dp_finish(tdm_dp *dp, double *wait_ms);
int tdm_dp_num_buckets(const tdm_dp *dp);
/* The optimizer step about to be reduced (0-based): a compressor starts at compress_start. */
void tdm_dp_set_step(tdm_dp *dp, int64_t step);
/* The last compressed step's per-bucket stats (tandem/compress.h); returns their count (0 when
 * no compressor ran yet). */
int tdm_dp_compress_stats(const tdm_dp *dp, const tdm_compress_stats **out);
/* Bytes this rank sent on the communicator from the step's last backward to the end of
 * tdm_dp_finish: the gradient exchange (plus whatever else used the communicator meanwhile). */
uint64_t tdm_dp_step_bytes(const tdm_dp *dp);
/* For checkpoints: bucket k's span [lo, hi) of the gradient buffer, its residual (this rank's,
 * hi - lo floats) and its shared state (PowerSGD's Q: the same on every rank; NULL and 0 for
 * none), all writable. Returns the bucket count, 0 without a compressor. k = -1: the residuals
 * were written in place (a checkpoint loaded), the telescoping check starts over from them. */
int tdm_dp_compress_state(tdm_dp *dp, int k, int64_t *lo, int64_t *hi, float **residual, float **shared, int64_t *n_shared);

#ifdef __cplusplus
}
#endif
#endif
