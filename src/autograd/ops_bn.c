/* Batch normalization (nn.BatchNorm2d / nn.SyncBatchNorm) and global average pooling.
 *
 * Training: the statistics are the batch's, per channel, formed from double sums; with a
 * communicator the sums (and, in backward, the sums of dy and dy * xhat) are all-reduced in rank
 * order first, so N ranks normalise with the statistics of the N-times batch. Evaluation uses the
 * running statistics and never communicates (pytorch/pytorch#48988). */
#include <math.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/comm.h"
#include "tandem/kernels.h"

/* i: [0] N, [1] C, [2] HW, [3] batch statistics?, [4] what follows it in the op: 0 nothing, 1 a ReLU, 2 a residual
 * (in[3]) added and a ReLU; f: none; saved: [0] mean, [1] rstd, [2] comm; the values per channel M (global with a
 * communicator) in a double after mean/rstd */
static void bn_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  int64_t N = n->i[0], C = n->i[1], HW = n->i[2];
  const float *mean = n->saved[0], *rstd = n->saved[1];
  tdm_comm_t comm = n->saved[2];
  const float *dy = n->out->grad->data;
  int relu = n->i[4] == 1; /* a fused ReLU's mask on dy: formed again from x, w, b and the statistics */
  float *gw = tdm__grad(tp, w), *gb = tdm__grad(tp, b);
  int fresh = 0; /* x's first gradient: written, not zeroed and added to */
  float *gx = tdm__grad_for_write(tp, x, &fresh);
  if (n->i[4] == 2) { /* relu(bn(x) + r): dy masked by the output's sign, to r and to the normalisation
                       * in one pass (masking it again in each of bn's two passes read the output and
                       * dy twice: no faster at 28x28, 1.3x slower at 7x7) */
    int fresh_r = 0, need = gx || gw || gb;
    float *gr = tdm__grad_for_write(tp, n->in[3], &fresh_r), *g = NULL;
    if (need && gr && fresh_r) { /* r's first gradient is the masked dy itself: bn reads it there
                                  * before anything adds to it (no workspace written and read) */
      tdm_k_relu_bwd2(NULL, 0, gr, 1, dy, n->out->data, x->numel);
      dy = gr;
    } else {
      if (need && !(g = tdm__workspace(tp, sizeof(float) * (size_t)x->numel))) {
        if (gx && fresh) tdm_k_zero(gx, x->numel); /* the tape has failed (the workspace says why) */
        if (gr && fresh_r) tdm_k_zero(gr, x->numel);
        return;
      }
      tdm_k_relu_bwd2(g, 1, gr, fresh_r, dy, n->out->data, x->numel);
      if (!g) return; /* only r needs a gradient */
      dy = g;
    }
  }
  double *sums = tdm__scratch(tp, sizeof(double) * (size_t)(2 * C + 1));
  if (!sums) {
    if (gx && fresh) tdm_k_zero(gx, x->numel); /* the tape has failed; leave no garbage behind */
    return;
  }
  tdm_k_bn_bwd_sums(dy, x->data, w->data, b->data, mean, rstd, relu, N, C, HW, sums, sums + C);
  for (int64_t c = 0; c < C; c++) { /* the parameters' gradients: this rank's share, as SyncBatchNorm */
    if (gw) gw[c] += (float)sums[C + c];
    if (gb) gb[c] += (float)sums[c];
  }
  double M = 0;
  if (n->i[3]) {
    memcpy(&M, (const char *)n->saved[1] + sizeof(float) * (size_t)C, sizeof M);
    if (comm) { /* every rank reaches this node in the same order: the collective matches */
      tdm_status st = tdm_comm_allreduce(comm, sums, sums, (size_t)(2 * C), TDM_F64, TDM_SUM, tdm_comm_rank_order_algo(comm));
      if (st != TDM_OK) {
        tdm__fail(tp, st, "batchnorm backward: all-reducing the gradient sums of %lld channels: %s", (long long)C,
                  tdm_last_error());
        if (gx && fresh) tdm_k_zero(gx, x->numel); /* the tape has failed; leave no garbage behind */
        return;
      }
    }
  }
  if (gx)
    (fresh ? tdm_k_bn_bwd_dx_set : tdm_k_bn_bwd_dx)(gx, dy, x->data, w->data, b->data, mean, rstd, relu, sums, sums + C, M, N, C, HW);
}

/* relu: 0 none, 1 a ReLU after it, 2 the residual res added and a ReLU */
static tdm_tensor *batchnorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, tdm_tensor *running_mean,
                             tdm_tensor *running_var, float momentum, float eps, tdm_comm_t sync, int relu,
                             tdm_tensor *res) {
  tdm_tensor *in[3] = {x, w, b};
  if (!tdm__inputs_ok(tp, "batchnorm", 3, in)) return NULL;
  for (int k = 0; k < 3; k++)
    if (!tdm__check_f32(tp, "batchnorm", k == 0 ? "input" : k == 1 ? "weight" : "bias", in[k])) return NULL;
  if (x->ndim < 2 || x->ndim > 4)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "batchnorm: input %s; expected (N, C), (N, C, L) or (N, C, H, W)", tdm__shp(x));
  int64_t N = x->shape[0], C = x->shape[1], HW = 1;
  for (int d = 2; d < x->ndim; d++) HW *= x->shape[d];
  if (w->ndim != 1 || b->ndim != 1 || w->shape[0] != C || b->shape[0] != C)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "batchnorm: weight %s and bias %s for input %s; expected (%lld) each",
                     tdm__shp(w), tdm__shp(b), tdm__shp(x), (long long)C);
  if ((running_mean == NULL) != (running_var == NULL))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "batchnorm: a running mean without a running variance, or the reverse; expected both or neither");
  for (int k = 0; running_mean && k < 2; k++) {
    tdm_tensor *r = k ? running_var : running_mean;
    if (r->dtype != TDM_F32 || r->ndim != 1 || r->shape[0] != C || !tdm_tensor_is_contiguous(r))
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "batchnorm: running %s %s %s; expected (%lld) f32, contiguous",
                       k ? "variance" : "mean", tdm__shp(r), tdm_dtype_name(r->dtype), (long long)C);
  }
  if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "batchnorm: eps %g, momentum %g; expected eps > 0 and 0 <= momentum <= 1",
                     (double)eps, (double)momentum);
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, TDM_F32, x->ndim, x->shape) : NULL;
  /* mean (C) and rstd (C), then the values per channel M as a double */
  float *st = y ? tdm__scratch(tp, sizeof(float) * (size_t)(2 * C) + sizeof(double)) : NULL;
  double *sums = st ? tdm__scratch(tp, sizeof(double) * (size_t)(2 * C + 1)) : NULL;
  if (!sums) return NULL;
  float *mean = st, *rstd = st + C;
  int batch_stats = tp->training || !running_mean;
  double M = 0;
  if (batch_stats) {
    tdm_k_bn_sums(x->data, N, C, HW, sums, sums + C);
    sums[2 * C] = (double)(N * HW);
    if (sync && tp->training) {
      tdm_status s = tdm_comm_allreduce(sync, sums, sums, (size_t)(2 * C + 1), TDM_F64, TDM_SUM, tdm_comm_rank_order_algo(sync));
      if (s != TDM_OK)
        return tdm__fail(tp, s, "batchnorm: all-reducing the statistics of %lld channels over %d ranks: %s", (long long)C,
                         tdm_comm_size(sync), tdm_last_error());
    }
    M = sums[2 * C];
    if (tp->training && M <= 1) /* PyTorch's check, on the values every rank normalises together */
      return tdm__fail(tp, TDM_ERR_INVALID_ARG,
                       "batchnorm: expected more than 1 value per channel when training, got input size %s (%.0f value%s per "
                       "channel%s): use a batch of at least 2, or evaluation mode",
                       tdm__shp(x), M, M == 1 ? "" : "s", sync ? " over all ranks" : "");
    for (int64_t c = 0; c < C; c++) {
      double m = M > 0 ? sums[c] / M : 0.0, v = M > 0 ? sums[C + c] / M - m * m : 0.0;
      if (v < 0) v = 0;
      mean[c] = (float)m;
      rstd[c] = (float)(1.0 / sqrt(v + (double)eps));
      if (tp->training && running_mean) { /* PyTorch: the unbiased variance goes into the running one */
        float *rm = running_mean->data, *rv = running_var->data;
        rm[c] = (1.0f - momentum) * rm[c] + momentum * (float)m;
        rv[c] = (1.0f - momentum) * rv[c] + momentum * (float)(v * M / (M - 1));
      }
    }
  } else {
    const float *rm = running_mean->data, *rv = running_var->data;
    for (int64_t c = 0; c < C; c++) {
      mean[c] = rm[c];
      rstd[c] = (float)(1.0 / sqrt((double)rv[c] + (double)eps));
    }
  }
  memcpy(st + 2 * C, &M, sizeof M);
  if (relu == 2) tdm_k_bn_fwd_add_relu(y->data, x->data, res->data, w->data, b->data, mean, rstd, N, C, HW);
  else tdm_k_bn_fwd(y->data, x->data, w->data, b->data, mean, rstd, N, C, HW, relu);
  tdm_tensor *ins[4] = {x, w, b, res};
  tdm_node *n = tdm__record(tp, relu == 2 ? "batchnorm_add_relu" : relu ? "batchnorm_relu" : "batchnorm", bn_bw, y,
                            relu == 2 ? 4 : 3, ins);
  if (n) {
    n->i[0] = N, n->i[1] = C, n->i[2] = HW, n->i[3] = batch_stats, n->i[4] = relu;
    n->saved[0] = mean;
    n->saved[1] = rstd;
    n->saved[2] = batch_stats && tp->training ? sync : NULL;
  }
  return y;
}

tdm_tensor *tdm_batchnorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, tdm_tensor *running_mean,
                          tdm_tensor *running_var, float momentum, float eps, tdm_comm_t sync) {
  return batchnorm(tp, x, w, b, running_mean, running_var, momentum, eps, sync, 0, NULL);
}

/* The ReLU in the same passes: its output's sign is the mask backward needs, so neither the
 * normalised tensor nor ReLU's own passes over it (one each way) are needed. */
tdm_tensor *tdm_batchnorm_relu(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, tdm_tensor *running_mean,
                               tdm_tensor *running_var, float momentum, float eps, tdm_comm_t sync) {
  return batchnorm(tp, x, w, b, running_mean, running_var, momentum, eps, sync, 1, NULL);
}

/* A residual block's end, relu(bn(x) + r): after the statistics, one pass forward where the two
 * ops take two, and the normalised tensor is never written (nor its gradient kept: backward
 * masks dy by the output's sign into r's gradient, then runs bn's two passes on it; a workspace
 * holds it where r's gradient already had some). */
tdm_tensor *tdm_batchnorm_add_relu(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, tdm_tensor *running_mean,
                                   tdm_tensor *running_var, float momentum, float eps, tdm_comm_t sync, tdm_tensor *r) {
  tdm_tensor *in[2] = {x, r};
  if (!tdm__inputs_ok(tp, "batchnorm_add_relu", 2, in)) return NULL;
  if (r == x || x->dtype != TDM_F32 || r->dtype != TDM_F32 || tdm__act_dtype(tp) != TDM_F32 || !tdm__shape_equal(x, r))
    return tdm_add_relu(tp, batchnorm(tp, x, w, b, running_mean, running_var, momentum, eps, sync, 0, NULL), r);
  r = tdm__contig(tp, r);
  return r ? batchnorm(tp, x, w, b, running_mean, running_var, momentum, eps, sync, 2, r) : NULL;
}

tdm_tensor *tdm_global_avgpool2d(tdm_tape *tp, tdm_tensor *x) {
  if (!tdm__inputs_ok(tp, "global_avgpool2d", 1, &x)) return NULL;
  if (x->ndim != 4)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "global_avgpool2d: input %s; expected (N, C, H, W)", tdm__shp(x));
  int axes[2] = {2, 3};
  return tdm_mean(tp, x, 2, axes, 0);
}
