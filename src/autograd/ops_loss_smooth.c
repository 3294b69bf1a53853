/* Cross-entropy with label smoothing (PyTorch's F.cross_entropy(label_smoothing=eps)): each counted
 * row's target distribution is (1 - eps) on the target plus eps / C on every class, so the loss is
 * (1 - eps) (-log p_t) + eps mean_c(-log p_c), averaged over the rows whose target is not ignored. */
#include <math.h>

#include "autograd/tape_impl.h"

/* i: [0] N, [1] C, [2] ignore, [3] count; f[0]: eps; saved[0]: lse (N) */
static void ls_bw(tdm_tape *tp, tdm_node *n) {
  float *gx = tdm__grad(tp, n->in[0]);
  if (!gx || n->i[3] == 0) return;
  int64_t N = n->i[0], C = n->i[1];
  float eps = n->f[0], scale = ((float *)n->out->grad->data)[0] / (float)n->i[3];
  const float *x = n->in[0]->data, *lse = n->saved[0];
  const tdm_tensor *t = n->in[1];
  for (int64_t i = 0; i < N; i++) {
    int64_t y = t->dtype == TDM_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
    if (y == n->i[2]) continue;
    for (int64_t c = 0; c < C; c++) {
      float q = eps / (float)C + (c == y ? 1.0f - eps : 0.0f);
      gx[i * C + c] += scale * (expf(x[i * C + c] - lse[i]) - q);
    }
  }
}

tdm_tensor *tdm_cross_entropy_smooth(tdm_tape *tp, tdm_tensor *logits, tdm_tensor *targets, int64_t ignore_index,
                                     float eps) {
  tdm_tensor *in[2] = {logits, targets};
  if (!tdm__inputs_ok(tp, "cross_entropy", 2, in) || !tdm__check_f32(tp, "cross_entropy", "logits", logits)) return NULL;
  if (!(eps >= 0.0f && eps <= 1.0f))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: label smoothing %g; expected 0 <= eps <= 1", (double)eps);
  if (targets->dtype != TDM_I32 && targets->dtype != TDM_I64)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: targets have dtype %s; expected i32 or i64", tdm_dtype_name(targets->dtype));
  if (logits->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logits->shape[0])
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: logits %s and targets %s; expected (N, C) and (N) with label smoothing",
                     tdm__shp(logits), tdm__shp(targets));
  logits = tdm__contig(tp, logits);
  targets = tdm__contig(tp, targets);
  int64_t N = logits ? logits->shape[0] : 0, C = logits ? logits->shape[1] : 0;
  float *lse = logits && targets ? tdm__scratch(tp, sizeof(float) * (size_t)(N ? N : 1)) : NULL;
  tdm_tensor *out = lse ? tdm__out(tp, TDM_F32, 0, NULL) : NULL;
  if (!out) return NULL;
  const float *x = logits->data;
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < N; i++) {
    int64_t y = targets->dtype == TDM_I64 ? ((const int64_t *)targets->data)[i] : ((const int32_t *)targets->data)[i];
    float m = -INFINITY;
    for (int64_t c = 0; c < C; c++) m = fmaxf(m, x[i * C + c]);
    double s = 0, sum_x = 0;
    for (int64_t c = 0; c < C; c++) s += exp((double)(x[i * C + c] - m)), sum_x += x[i * C + c];
    lse[i] = m + (float)log(s);
    if (y == ignore_index) continue;
    if (y < 0 || y >= C)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: target %lld at row %lld is outside [0, %lld) and is not the ignore index %lld",
                       (long long)y, (long long)i, (long long)C, (long long)ignore_index);
    total += (1.0 - eps) * ((double)lse[i] - x[i * C + y]) + eps * ((double)lse[i] - sum_x / (double)C);
    count++;
  }
  ((float *)out->data)[0] = count ? (float)(total / (double)count) : 0.0f;
  tdm_tensor *ins[2] = {logits, targets};
  tdm_node *n = tdm__record(tp, "cross_entropy", ls_bw, out, 2, ins);
  if (n) {
    n->i[0] = N, n->i[1] = C, n->i[2] = ignore_index, n->i[3] = count;
    n->f[0] = eps;
    n->saved[0] = lse;
  }
  return out;
}
