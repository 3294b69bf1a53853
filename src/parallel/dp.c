/* Data parallelism: model check, parameter broadcast, gradient buckets launched from hooks. */
#include "tandem/dp.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "parallel/common.h"
#include "parallel/compress.h"
#include "parallel/layout.h"
#include "core/internal.h"
#include "tensor/tensor_impl.h"
#include "tandem/trace.h"

typedef struct {
  int64_t lo, hi;    /* element span of the gradient buffer */
  int n_params, pending;
  tdm_work_t work;
  int launched;
  void *wire;        /* compressed copy when the wire dtype is not f32 */
  tdm_shared_t region;
  int k;         /* its index */
  int64_t seq;   /* tracing: the shared-buffer reduction's number (the same on every rank) */
} bucket;

struct tdm_dp {
  tdm_comm_t comm;
  tdm_params *params;
  tdm_dp_config cfg;
  bucket *b;
  int nb, next_launch; /* buckets start strictly in index order */
  int sync;
  tdm_status hook_status;
  /* ranks that share memory: the gradients live in a shared buffer and are averaged in place there */
  tdm_shared_t region;
  int spare_core; /* a core is left over after every local rank's compute threads */
  tdm__compress *cz; /* --compress topk / powersgd: buckets reduced after backward */
  int64_t step;
  uint64_t bytes0, step_bytes;
  int64_t region_seq; /* shared-buffer reductions so far: they are no collectives, so count them here */
};

/* A bucket averaged in the shared buffer (no collective, so no sequence number of the
 * communicator's): a span with the buffer's own count, on the thread that ran it. */
static tdm_status region_reduce(bucket *b, double t0) {
  tdm_status st = tdm_shared_allreduce(b->region, (size_t)b->lo, (size_t)b->hi, 1);
  if (t0 > 0) {
    tdm_trace_args a = TDM_TRACE_ARGS_INIT;
    a.bytes = (b->hi - b->lo) * (int64_t)sizeof(float), a.seq = b->seq, a.index = b->k, a.algo = "shared-buffer";
    tdm_trace_span("comm", "bucket all-reduce", t0, tdm_trace_now(), &a);
  }
  return st;
}

static int compressing(const tdm_dp *dp) { return dp->cz && tdm__compress_active(dp->cz, dp->step); }

static tdm_status region_bucket(void *ctx) { return region_reduce(ctx, tdm_trace_begin()); }

/* The gradients' all-reduce: rank order, the sums of every other layout (tandem/engine.h), except
 * where ranks span nodes: there the hierarchical all-reduce keeps most bytes inside the nodes,
 * summing node by node (a fixed order of its own, src/comm/algo/hier.c) unless TANDEM_ALGO names
 * another all-reduce (allreduce=direct: rank order again). */
static tdm_algo grad_algo(tdm_comm_t c) {
  tdm_algo a = tdm__algo_pick(c, TDM_COLL_ALLREDUCE, TDM_ALGO_AUTO);
  return tdm__hier_usable(c) && (a == TDM_ALGO_AUTO || a == TDM_ALGO_HIER) ? TDM_ALGO_HIER : tdm_comm_rank_order_algo(c);
}

static tdm_status launch(tdm_dp *dp, bucket *b) {
  float *g = tdm_params_grad(dp->params) + b->lo;
  size_t n = (size_t)(b->hi - b->lo);
  b->launched = 1;
  if (compressing(dp)) return TDM_OK; /* the compressor takes the whole bucket in tdm_dp_finish */
  if (dp->region) {
    b->seq = ++dp->region_seq;
    return tdm__comm_icall(dp->comm, region_bucket, b, &b->work);
  }
  if (dp->cfg.wire_dtype != TDM_F32) { /* compress, reduce in the wire dtype, expand in finish */
    tdm_convert(b->wire, dp->cfg.wire_dtype, g, TDM_F32, (int64_t)n);
    return tdm_comm_iallreduce(dp->comm, b->wire, b->wire, n, dp->cfg.wire_dtype, TDM_AVG, grad_algo(dp->comm), &b->work);
  }
  /* rank order: the sums ZeRO's reduce-scatters form too, whatever their pieces (tandem/engine.h) */
  return tdm_comm_iallreduce(dp->comm, g, g, n, TDM_F32, TDM_AVG, grad_algo(dp->comm), &b->work);
}

/* Buckets handed to the communication thread; tdm_dp_finish averages the rest on the calling
 * thread, in order. With a shared buffer the last bucket always stays here (backward has nothing
 * left to overlap it with, and two thread switches are saved), and when no core is spare (ranks x
 * threads >= cores) all of them do: the communication thread could only take turns with backward
 * on the same core, and in-place averaging is cheap enough that the switches cost more than
 * the overlap gains (the MLP on 2 ranks x 1 thread, 2 cores: about 3% faster). */
static int n_async(const tdm_dp *dp) { return dp->region ? (dp->spare_core ? dp->nb - 1 : 0) : dp->nb; }

static void launch_ready(tdm_dp *dp) {
  while (dp->next_launch < n_async(dp) && dp->b[dp->next_launch].pending == 0) {
    tdm_status st = launch(dp, &dp->b[dp->next_launch++]);
    if (st != TDM_OK && dp->hook_status == TDM_OK) dp->hook_status = st;
  }
}

static void on_grad_ready(void *ctx, tdm_tensor *p) {
  tdm_dp *dp = ctx;
  /* buckets are spans of the one buffer: the parameter's offset names its bucket */
  int64_t off = (float *)tdm_tensor_data(p) - tdm_params_data(dp->params);
  int k = 0;
  while (k < dp->nb && !(dp->b[k].lo <= off && off < dp->b[k].hi)) k++;
  if (k == dp->nb) return;
  bucket *b = &dp->b[k];
  if (b->pending > 0) b->pending--;
  if (dp->sync && !dp->cfg.no_overlap) launch_ready(dp);
}

tdm_status tdm_dp_create(tdm_dp **out, tdm_comm_t comm, tdm_params *params, const tdm_dp_config *cfg) {
  if (!out || !comm || !params) return tdm__set_error(TDM_ERR_INVALID_ARG, "dp_create: NULL argument");
  int zero_copy, inline_avg; /* parsed first: a bad value fails before any collective */
  TDM__TRY(tdm__env_switch("TANDEM_DP_ZERO_COPY", &zero_copy));
  TDM__TRY(tdm__inline_comm(tdm_comm_size(comm), &inline_avg));
  tdm_dp_config c = cfg ? *cfg : (tdm_dp_config){0, 0, TDM_F32, 0, NULL, 0, 0};
  if (!c.bucket_bytes) c.bucket_bytes = 25u << 20;
  if (!c.first_bucket_bytes) c.first_bucket_bytes = 1u << 20;
  if (c.first_bucket_bytes > c.bucket_bytes) c.first_bucket_bytes = c.bucket_bytes;
  if (c.wire_dtype != TDM_F32 && c.wire_dtype != TDM_BF16 && c.wire_dtype != TDM_F16)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "dp_create: wire dtype %s; expected f32, bf16 or f16",
                          tdm_dtype_name(c.wire_dtype));
  tdm__compress *cz = NULL;
  if (tdm_compress_is_hook(c.compress)) {
    if (c.wire_dtype != TDM_F32)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "dp_create: compress %s with gradients as %s on the wire; expected one of them",
                            c.compress, tdm_dtype_name(c.wire_dtype));
    TDM__TRY(tdm__compress_create(&cz, c.compress, c.compress_start, c.compress_seed));
  } else {
    TDM__TRY(tdm_compress_check(c.compress));
  }
  tdm_status ms = tdm__check_same_model(comm, params);
  if (ms != TDM_OK) {
    tdm__compress_destroy(cz);
    return ms;
  }
  ms = tdm_comm_broadcast(comm, tdm_params_data(params), (size_t)tdm_params_numel(params), TDM_F32, 0, TDM_ALGO_AUTO);
  if (ms != TDM_OK) {
    tdm__compress_destroy(cz);
    return ms;
  }
  tdm_dp *dp = tdm__calloc(1, sizeof *dp);
  int n = tdm_params_count(params);
  if (!dp || !(dp->b = tdm__calloc((size_t)(n ? n : 1), sizeof(bucket)))) {
    if (dp) {
      tdm__free(dp->b);
      tdm__free(dp);
    }
    tdm__compress_destroy(cz);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "dp_create: out of memory");
  }
  dp->cz = cz;
  dp->comm = comm;
  dp->params = params;
  dp->cfg = c;
  dp->sync = 1;
  /* reverse parameter order, the last layers' gradients are ready first: the buckets ZeRO uses */
  int64_t total = tdm_params_numel(params);
  tdm__layout L;
  tdm_status ls = tdm__layout_make(&L, params, 0, c.bucket_bytes, c.first_bucket_bytes, 0, 1, 0);
  if (ls != TDM_OK) {
    tdm_dp_destroy(dp);
    return ls;
  }
  for (int k = 0; k < L.ng; k++) {
    bucket *b = &dp->b[dp->nb++];
    b->k = k;
    b->lo = L.g[k].lo, b->hi = L.g[k].hi, b->n_params = L.g[k].n_params;
    if (cz) { /* the compressor sees each parameter of the bucket as a matrix (PowerSGD's unit) */
      tdm__cmat *mats = tdm__malloc(sizeof *mats * (size_t)(b->n_params ? b->n_params : 1));
      tdm_status cs = mats ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "dp_create: out of memory");
      for (int i = 0; cs == TDM_OK && i < b->n_params; i++) {
        tdm_tensor *t = tdm_params_get(params, L.g[k].first + i);
        int64_t numel = tdm_tensor_numel(t), rows = tdm_tensor_ndim(t) >= 2 ? tdm_tensor_dim(t, 0) : 1;
        mats[i] = (tdm__cmat){tdm_params_offset(params, L.g[k].first + i) - b->lo, rows, rows ? numel / rows : 0};
      }
      if (cs == TDM_OK) cs = tdm__compress_add_bucket(cz, b->hi - b->lo, b->n_params, mats);
      tdm__free(mats);
      if (cs != TDM_OK) {
        tdm__layout_free(&L);
        tdm_dp_destroy(dp);
        return cs;
      }
    }
    if (c.wire_dtype != TDM_F32 && !(b->wire = tdm__malloc_cat((size_t)(b->hi - b->lo) * 2 + 64, TDM_MEM_COMM))) {
      tdm__layout_free(&L);
      tdm_dp_destroy(dp);
      return tdm__set_error(TDM_ERR_NO_MEMORY, "dp_create: out of memory");
    }
  }
  tdm__layout_free(&L);
  for (int k = 0; k < dp->nb; k++) dp->b[k].pending = dp->b[k].n_params;
  /* Ranks that share memory (one node over shm, or threads), f32 on the wire: keep the gradients
   * in a shared buffer, so a bucket is averaged in place with no copy in or out
   * (TANDEM_DP_ZERO_COPY=0 turns it off, for comparison; it must be the same on all ranks). */
  if (c.wire_dtype == TDM_F32 && !cz && tdm__shared_usable(comm) && tdm_comm_size(comm) > 1 && zero_copy != 0) {
    tdm_status rs = tdm_shared_create(comm, (size_t)total, &dp->region);
    if (rs == TDM_OK) rs = tdm_params_set_grad_buffer(params, tdm_shared_mine(dp->region));
    if (rs != TDM_OK) { /* the same outcome on every rank: fall back to the all-reduce */
      tdm_log(TDM_LOG_WARN, "dp: gradients stay private (%s); averaging them by copying", tdm_last_error());
      tdm_shared_destroy(dp->region);
      dp->region = NULL;
    }
    for (int k = 0; k < dp->nb; k++) dp->b[k].region = dp->region;
    dp->spare_core = !inline_avg;
    /* the gradients now live in this rank's area of the buffer (mapped, not allocated) */
    if (dp->region) tdm__mem_account(TDM_MEM_GRADS, (int64_t)sizeof(float) * total);
    if (dp->region) tdm_log(TDM_LOG_INFO, "dp: gradients in a shared buffer, averaged in place (zero-copy)");
  }
  if (grad_algo(comm) == TDM_ALGO_HIER) tdm_log(TDM_LOG_INFO, "dp: gradients averaged by the hierarchical all-reduce (ranks on several nodes)");
  for (int i = 0; i < n; i++) tdm_tensor_set_grad_hook(tdm_params_get(params, i), on_grad_ready, dp);
  *out = dp;
  return TDM_OK;
}

void tdm_dp_destroy(tdm_dp *dp) {
  if (!dp) return;
  for (int i = 0; i < tdm_params_count(dp->params); i++) tdm_tensor_set_grad_hook(tdm_params_get(dp->params, i), NULL, NULL);
  for (int k = 0; k < dp->nb; k++) {
    if (dp->b[k].launched && dp->b[k].work) tdm_work_wait(dp->b[k].work);
    tdm__free(dp->b[k].wire);
  }
  if (dp->region) { /* the gradients move back into the parameters' own buffer */
    tdm_params_set_grad_buffer(dp->params, NULL);
    tdm__mem_account(TDM_MEM_GRADS, -(int64_t)sizeof(float) * tdm_params_numel(dp->params));
    tdm_shared_destroy(dp->region);
  }
  tdm__compress_destroy(dp->cz);
  tdm__free(dp->b);
  tdm__free(dp);
}

void tdm_dp_set_sync(tdm_dp *dp, int sync) {
  TDM__NONNULL(dp, , "tdm_dp_set_sync: the data-parallel handle dp is NULL");
  dp->sync = sync != 0;
  if (dp->sync) dp->bytes0 = tdm_comm_bytes_sent(dp->comm);
}
void tdm_dp_set_step(tdm_dp *dp, int64_t step) {
  TDM__NONNULL(dp, , "tdm_dp_set_step: the data-parallel handle dp is NULL");
  dp->step = step;
}
int tdm_dp_compress_stats(const tdm_dp *dp, const tdm_compress_stats **out) {
  TDM__NONNULL(dp, 0, "tdm_dp_compress_stats: the data-parallel handle dp is NULL");
  return tdm__compress_stats(dp->cz, out);
}
uint64_t tdm_dp_step_bytes(const tdm_dp *dp) {
  TDM__NONNULL(dp, 0, "tdm_dp_step_bytes: the data-parallel handle dp is NULL");
  return dp->step_bytes;
}
int tdm_dp_compress_state(tdm_dp *dp, int k, int64_t *lo, int64_t *hi, float **residual, float **shared, int64_t *n_shared) {
  TDM__NONNULL(dp, 0, "tdm_dp_compress_state: the data-parallel handle dp is NULL");
  if (dp->cz && k == -1) tdm__compress_rebase(dp->cz);
  if (!dp->cz || k < 0 || k >= dp->nb) return dp->cz ? dp->nb : 0;
  *lo = dp->b[k].lo, *hi = dp->b[k].hi;
  *residual = tdm__compress_residual(dp->cz, k);
  *shared = tdm__compress_shared(dp->cz, k, n_shared);
  return dp->nb;
}
int tdm_dp_num_buckets(const tdm_dp *dp) {
  TDM__NONNULL(dp, 0, "tdm_dp_num_buckets: the data-parallel handle dp is NULL");
  return dp->nb;
}

tdm_status tdm_dp_finish(tdm_dp *dp, double *wait_ms) {
  if (!dp) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_dp_finish: the data-parallel handle dp is NULL");
  double t0 = tdm_time_now();
  tdm_status st = dp->hook_status;
  if (!dp->sync) { /* accumulation step: nothing was sent; re-arm for the next backward */
    for (int k = 0; k < dp->nb; k++) dp->b[k].pending = dp->b[k].n_params;
    if (wait_ms) *wait_ms = 0;
    return TDM_OK;
  }
  /* buckets whose parameters backward never reached (or all of them after no_sync steps) */
  for (int k = 0; k < dp->nb; k++) dp->b[k].pending = 0;
  launch_ready(dp);
  for (int k = 0; k < dp->nb; k++) {
    bucket *b = &dp->b[k];
    if (b->launched && b->work) {
      tdm_status s = tdm_work_wait(b->work);
      if (st == TDM_OK) st = s;
      if (s == TDM_OK && dp->cfg.wire_dtype != TDM_F32)
        tdm_convert(tdm_params_grad(dp->params) + b->lo, TDM_F32, b->wire, dp->cfg.wire_dtype, b->hi - b->lo);
    }
    b->launched = 0;
    b->work = NULL;
    b->pending = b->n_params;
  }
  for (int k = 0; compressing(dp) && st == TDM_OK && k < dp->nb; k++) /* in bucket order on every rank */
    st = tdm__compress_bucket(dp->cz, k, dp->comm, tdm_params_grad(dp->params) + dp->b[k].lo);
  for (int k = n_async(dp); dp->region && st == TDM_OK && k < dp->nb; k++) { /* in order, after the others */
    bucket *b = &dp->b[k];
    b->seq = ++dp->region_seq;
    tdm_status s = region_reduce(b, tdm_trace_begin());
    if (st == TDM_OK) st = s;
  }
  dp->next_launch = 0;
  dp->hook_status = TDM_OK;
  dp->step_bytes = tdm_comm_bytes_sent(dp->comm) - dp->bytes0;
  double t1 = tdm_time_now();
  if (tdm_trace_on()) { /* what backward did not hide: the buckets still running, the ones run here */
    tdm_trace_args a = TDM_TRACE_ARGS_INIT;
    a.index = dp->nb, a.bytes = (int64_t)dp->step_bytes; /* buckets, bytes this rank sent */
    tdm_trace_span("idle", "wait for buckets", t0, t1, &a);
  }
  if (wait_ms) *wait_ms = (t1 - t0) * 1e3;
  return st;
}
