/* Central finite differences against backward. The projection onto a random R turns any output
 * into a scalar whose gradient exercises every output element with a different weight. */
#include <math.h>
#include <string.h>

#include "autograd/tape_impl.h"

static tdm_status eval(tdm_gradcheck_fn fn, void *ctx, tdm_tape *tp, tdm_tensor *const *in, const float *R,
                       double *out) {
  tdm_tape_reset(tp);
  tdm_tensor *y = fn(tp, in, ctx);
  if (!y) return tdm__set_error(tp->status ? tp->status : TDM_ERR_INVALID_ARG, "gradcheck: %s", tp->error);
  const float *d = y->data; /* ops return contiguous outputs */
  double s = 0;
  for (int64_t i = 0; i < y->numel; i++) s += (double)d[i] * R[i];
  *out = s;
  return TDM_OK;
}

tdm_status tdm_gradcheck(tdm_gradcheck_fn fn, void *ctx, int n, tdm_tensor *const *inputs,
                         const tdm_gradcheck_opts *opts, double *max_err) {
  if (!fn || n < 1 || !inputs || !opts) return tdm__set_error(TDM_ERR_INVALID_ARG, "gradcheck: bad arguments");
  tdm_tape *tp;
  TDM__TRY(tdm_tape_create(&tp, 0));
  tdm_status st = TDM_OK;
  float *R = NULL;
  double worst = 0;
  tdm_tensor *y = fn(tp, inputs, ctx);
  if (!y) {
    st = tdm__set_error(tp->status ? tp->status : TDM_ERR_INVALID_ARG, "gradcheck: forward failed: %s", tp->error);
    goto done;
  }
  if (!tdm_tensor_is_contiguous(y)) y = tdm_contiguous(tp, y);
  R = tdm__malloc(sizeof(float) * (size_t)(y->numel ? y->numel : 1));
  if (!R) {
    st = tdm__set_error(TDM_ERR_NO_MEMORY, "gradcheck: out of memory");
    goto done;
  }
  tdm_rng r;
  tdm_rng_seed(&r, 99);
  for (int64_t i = 0; i < y->numel; i++) R[i] = tdm_rng_uniform(&r) * 2.0f - 1.0f;
  for (int k = 0; k < n; k++)
    if (tdm__requires_grad(inputs[k])) tdm_tensor_zero_grad(inputs[k]);
  {
    tdm_tensor *g = tdm__out(tp, TDM_F32, y->ndim, y->shape);
    if (!g) {
      st = tp->status;
      goto done;
    }
    memcpy(g->data, R, sizeof(float) * (size_t)y->numel);
    if ((st = tdm_backward_with(tp, y, g)) != TDM_OK) goto done;
  }
  tdm_tape_set_grad_enabled(tp, 0);
  for (int k = 0; k < n && st == TDM_OK; k++) {
    tdm_tensor *x = inputs[k];
    if (!tdm__requires_grad(x)) continue;
    if (x->dtype != TDM_F32 || !tdm_tensor_is_contiguous(x) || !x->grad) {
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "gradcheck: input %d must be a contiguous f32 leaf", k);
      break;
    }
    float *xd = x->data;
    const float *ga = x->grad->data;
    for (int64_t i = 0; i < x->numel; i++) {
      float saved = xd[i];
      double fp = 0, fm = 0;
      xd[i] = saved + (float)opts->eps;
      if ((st = eval(fn, ctx, tp, inputs, R, &fp)) != TDM_OK) break;
      xd[i] = saved - (float)opts->eps;
      if ((st = eval(fn, ctx, tp, inputs, R, &fm)) != TDM_OK) break;
      xd[i] = saved;
      double num = (fp - fm) / (2.0 * opts->eps), ana = ga[i];
      double ratio = fabs(num - ana) / (opts->atol + opts->rtol * fabs(num));
      if (!(ratio <= worst)) worst = ratio;
      if (!(ratio <= 1.0)) {
        st = tdm__set_error(TDM_ERR_MISMATCH, "gradcheck: input %d element %lld: backward gives %.6g, finite differences %.6g",
                            k, (long long)i, ana, num);
        break;
      }
    }
  }
done:
  if (max_err) *max_err = worst;
  tdm__free(R);
  tdm_tape_destroy(tp);
  return st;
}
