/* conv2d: checks its input, runs the batched im2col + GEMM kernels (kernels_conv_batched.c) with
 * the tape's workspace for the column matrix, and records a node whose backward does the same. */
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

static void conv_bw(tdm_tape *tp, tdm_node *n) {
  tdm_conv_shape *s = n->saved[0];
  tdm_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
  int fresh = 0; /* x's first gradient: written, not zeroed and added to */
  float *gx = tdm__grad_for_write(tp, x, &fresh), *gw = tdm__grad(tp, w), *gb = b ? tdm__grad(tp, b) : NULL;
  if (!gx && !gw && !gb) return;
  float *ws = tdm__workspace(tp, sizeof(float) * (size_t)tdm_k_conv2d_ws_floats(s));
  if (ws) tdm_k_conv2d_bwd_batched(gx, fresh, gw, gb, n->out->grad->data, x->data, w->data, ws, s);
  else if (gx && fresh) tdm_k_zero(gx, x->numel); /* the tape has failed; leave no garbage behind */
}

tdm_tensor *tdm_conv2d(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, int stride, int pad) {
  tdm_tensor *in[2] = {x, w};
  if (!tdm__inputs_ok(tp, "conv2d", 2, in)) return NULL;
  if (b && !tdm__inputs_ok(tp, "conv2d", 1, &b)) return NULL;
  if (!tdm__check_f32(tp, "conv2d", "input", x) || !tdm__check_f32(tp, "conv2d", "weight", w)) return NULL;
  if (x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1])
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "conv2d: input %s and weight %s; expected (N, Ci, H, W) and (Co, Ci, KH, KW)",
                     tdm__shp(x), tdm__shp(w));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0] || b->dtype != TDM_F32))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "conv2d: bias %s; expected (%lld) f32", tdm__shp(b), (long long)w->shape[0]);
  if (stride < 1 || pad < 0 || pad > (1 << 20))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "conv2d: stride %d, padding %d; expected stride >= 1, padding 0..2^20", stride, pad);
  if (w->shape[2] < 1 || w->shape[3] < 1 || w->shape[1] < 1)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "conv2d: weight %s has an empty kernel; expected (Co, Ci >= 1, KH >= 1, KW >= 1)", tdm__shp(w));
  tdm_conv_shape s = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2], w->shape[3],
                      stride, pad, 0, 0};
  if (s.H + 2 * pad < s.KH || s.W + 2 * pad < s.KW)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "conv2d: kernel %lldx%lld is larger than the padded input %s",
                     (long long)s.KH, (long long)s.KW, tdm__shp(x));
  s.OH = (s.H + 2 * pad - s.KH) / stride + 1;
  s.OW = (s.W + 2 * pad - s.KW) / stride + 1;
  x = tdm__contig(tp, x);
  w = tdm__contig(tp, w);
  int64_t shape[4] = {s.N, s.Co, s.OH, s.OW};
  tdm_tensor *y = x && w ? tdm__out(tp, TDM_F32, 4, shape) : NULL;
  tdm_conv_shape *ps = y ? tdm__scratch(tp, sizeof s) : NULL;
  float *ws = ps ? tdm__workspace(tp, sizeof(float) * (size_t)tdm_k_conv2d_ws_floats(&s)) : NULL;
  if (!ws) return NULL;
  *ps = s;
  if (s.N > 0) tdm_k_conv2d_fwd_batched(y->data, x->data, w->data, b ? b->data : NULL, ws, ps);
  tdm_tensor *ins[3] = {x, w, b};
  tdm_node *n = tdm__record(tp, "conv2d", conv_bw, y, b ? 3 : 2, ins);
  if (n) n->saved[0] = ps;
  return y;
}
