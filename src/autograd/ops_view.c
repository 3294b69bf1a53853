/* Views (reshape, permute, slice), copies (contiguous, cast) and concat / split. A view's
 * backward adds the output gradient into the matching positions of the input's gradient, which
 * is always contiguous in the input's logical layout. */
#include <string.h>

#include "autograd/tape_impl.h"

/* dst (laid out with dst_stride) += src (contiguous, shape). */
static void strided_acc(int ndim, const int64_t *shape, float *dst, const int64_t *dst_stride, const float *src,
                        int64_t n) {
  int64_t idx[TDM_MAX_DIMS] = {0}, off = 0;
  for (int64_t i = 0; i < n; i++) {
    dst[off] += src[i];
    for (int d = ndim - 1; d >= 0; d--) {
      idx[d]++;
      off += dst_stride[d];
      if (idx[d] < shape[d]) break;
      off -= dst_stride[d] * shape[d];
      idx[d] = 0;
    }
  }
}

static void contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = s;
    s *= shape[d];
  }
}

/* ---- contiguous -------------------------------------------------------------------------- */
static void flat_add_bw(tdm_tape *tp, tdm_node *n) { /* gin += gout, same number of elements */
  tdm_tensor *x = n->in[0];
  void *graw = tdm__grad(tp, x);
  if (!graw) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* 16-bit gradients (a cast) go through f32 */
  float *gx = tdm__grad_f32(tp, x, graw, 0);
  const float *g = tdm__f32(tp, n->out->grad);
  if (gx && g) {
    for (int64_t i = 0; i < n->out->numel; i++) gx[i] += g[i];
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_contiguous(tdm_tape *tp, tdm_tensor *x) {
  if (!tdm__inputs_ok(tp, "contiguous", 1, &x)) return NULL;
  tdm_tensor *y = tdm__out(tp, x->dtype, x->ndim, x->shape);
  if (!y) return NULL;
  tdm_tensor_copy(y, x);
  tdm__record(tp, "contiguous", flat_add_bw, y, 1, &x);
  return y;
}

tdm_tensor *tdm__contig(tdm_tape *tp, tdm_tensor *x) {
  if (!x || tdm_tensor_is_contiguous(x)) return x;
  return tdm_contiguous(tp, x);
}

tdm_tensor *tdm_cast(tdm_tape *tp, tdm_tensor *x, tdm_dtype dt) {
  if (!tdm__inputs_ok(tp, "cast", 1, &x)) return NULL;
  if ((unsigned)dt >= TDM_DTYPE_COUNT) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cast: dtype %d is unknown", (int)dt);
  int fl = dt == TDM_F32 || dt == TDM_BF16 || dt == TDM_F16 || dt == TDM_F64;
  int fx = x->dtype == TDM_F32 || x->dtype == TDM_BF16 || x->dtype == TDM_F16 || x->dtype == TDM_F64;
  if (tdm__requires_grad(x) && tp->grad_enabled && !(fl && fx))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cast: %s -> %s cannot carry a gradient; expected floating dtypes",
                     tdm_dtype_name(x->dtype), tdm_dtype_name(dt));
  tdm_tensor *y = tdm__out(tp, dt, x->ndim, x->shape);
  if (!y) return NULL;
  tdm_tensor_copy(y, x);
  tdm__record(tp, "cast", flat_add_bw, y, 1, &x); /* each side's gradient has its own dtype */
  return y;
}

tdm_tensor *tdm_detach(tdm_tape *tp, tdm_tensor *x) {
  if (!tdm__inputs_ok(tp, "detach", 1, &x)) return NULL;
  return tdm__alias_header(tp, x);
}

/* ---- reshape ------------------------------------------------------------------------------ */
tdm_tensor *tdm_reshape(tdm_tape *tp, tdm_tensor *x, int ndim, const int64_t *shape) {
  if (!tdm__inputs_ok(tp, "reshape", 1, &x)) return NULL;
  if (ndim > 0 && !shape) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "reshape: the new shape is NULL");
  if (ndim < 0 || ndim > TDM_MAX_DIMS)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "reshape: %d dimensions; expected 0..%d", ndim, TDM_MAX_DIMS);
  int64_t sh[TDM_MAX_DIMS], known = 1;
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    sh[i] = shape[i];
    if (sh[i] == -1) {
      if (infer >= 0) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "reshape: more than one -1 in the new shape");
      infer = i;
    } else if (sh[i] < 0) {
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "reshape: dimension %d is %lld", i, (long long)sh[i]);
    } else if (__builtin_mul_overflow(known, sh[i], &known)) {
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "reshape: the new shape's element count passes 2^63");
    }
  }
  if (infer >= 0) sh[infer] = known ? x->numel / known : 0;
  int64_t total = 1;
  for (int i = 0; i < ndim; i++) total *= sh[i];
  if (total != x->numel) {
    char b[96];
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "reshape: cannot view %s (%lld elements) as %s", tdm__shp(x),
                     (long long)x->numel, tdm_shape_str(ndim, sh, b, sizeof b));
  }
  tdm_tensor *c = tdm__contig(tp, x);
  if (!c) return NULL;
  tdm_tensor *y = tdm__alias_header(tp, c);
  if (!y) return NULL;
  y->ndim = ndim;
  memcpy(y->shape, sh, sizeof(int64_t) * (size_t)ndim);
  contig_strides(ndim, sh, y->stride);
  tdm__record(tp, "reshape", flat_add_bw, y, 1, &c);
  return y;
}

/* ---- permute ------------------------------------------------------------------------------ */
static void permute_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0];
  void *graw = tdm__grad(tp, x);
  if (!graw) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* 16-bit gradients go through f32 scratch */
  float *gx = tdm__grad_f32(tp, x, graw, 0);
  const float *g = tdm__f32(tp, n->out->grad);
  if (gx && g) {
    int64_t xs[TDM_MAX_DIMS], ds[TDM_MAX_DIMS];
    contig_strides(x->ndim, x->shape, xs);
    for (int d = 0; d < x->ndim; d++) ds[d] = xs[n->i[d]]; /* output axis d is input axis perm[d] */
    strided_acc(n->out->ndim, n->out->shape, gx, ds, g, n->out->numel);
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_permute(tdm_tape *tp, tdm_tensor *x, const int *perm) {
  if (!tdm__inputs_ok(tp, "permute", 1, &x)) return NULL;
  if (!perm) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "permute: perm is NULL");
  int seen[TDM_MAX_DIMS] = {0};
  for (int d = 0; d < x->ndim; d++) {
    if (perm[d] < 0 || perm[d] >= x->ndim || seen[perm[d]]++)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "permute: entry %d (%d) does not make a permutation of %d axes of %s",
                       d, perm[d], x->ndim, tdm__shp(x));
  }
  tdm_tensor *y = tdm__alias_header(tp, x);
  if (!y) return NULL;
  for (int d = 0; d < x->ndim; d++) {
    y->shape[d] = x->shape[perm[d]];
    y->stride[d] = x->stride[perm[d]];
  }
  tdm_node *n = tdm__record(tp, "permute", permute_bw, y, 1, &x);
  if (n)
    for (int d = 0; d < x->ndim; d++) n->i[d] = perm[d];
  return y;
}

tdm_tensor *tdm_transpose(tdm_tape *tp, tdm_tensor *x, int axis0, int axis1) {
  if (!tdm__inputs_ok(tp, "transpose", 1, &x)) return NULL;
  int a = tdm__axis(tp, "transpose", x, axis0), b = tdm__axis(tp, "transpose", x, axis1);
  if (a < 0 || b < 0) return NULL;
  int perm[TDM_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) perm[d] = d;
  perm[a] = b;
  perm[b] = a;
  return tdm_permute(tp, x, perm);
}

/* ---- slice -------------------------------------------------------------------------------- */
static void slice_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0];
  void *graw = tdm__grad(tp, x);
  if (!graw) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* 16-bit gradients go through f32 scratch */
  float *gx = tdm__grad_f32(tp, x, graw, 0);
  const float *g = tdm__f32(tp, n->out->grad);
  if (gx && g) {
    int64_t xs[TDM_MAX_DIMS];
    contig_strides(x->ndim, x->shape, xs);
    strided_acc(n->out->ndim, n->out->shape, gx + n->i[1] * xs[n->i[0]], xs, g, n->out->numel);
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_slice(tdm_tape *tp, tdm_tensor *x, int axis, int64_t start, int64_t len) {
  if (!tdm__inputs_ok(tp, "slice", 1, &x)) return NULL;
  int a = tdm__axis(tp, "slice", x, axis);
  if (a < 0) return NULL;
  if (start < 0 || len < 0 || start > x->shape[a] || len > x->shape[a] - start) /* (start + len could wrap) */
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "slice: start %lld, length %lld is outside axis %d of %s", (long long)start,
                     (long long)len, a, tdm__shp(x));
  tdm_tensor *y = tdm__alias_header(tp, x);
  if (!y) return NULL;
  y->shape[a] = len;
  y->numel = x->shape[a] ? x->numel / x->shape[a] * len : 0;
  y->data = (char *)x->data + start * x->stride[a] * (int64_t)tdm_dtype_size(x->dtype);
  tdm_node *n = tdm__record(tp, "slice", slice_bw, y, 1, &x);
  if (n) {
    n->i[0] = a;
    n->i[1] = start;
  }
  return y;
}

/* ---- concat / split ------------------------------------------------------------------------ */
static void concat_bw(tdm_tape *tp, tdm_node *n) {
  int64_t axis = n->i[0], outer = 1, inner = 1;
  tdm_tensor *y = n->out;
  for (int d = 0; d < axis; d++) outer *= y->shape[d];
  for (int d = (int)axis + 1; d < y->ndim; d++) inner *= y->shape[d];
  const float *g = y->grad->data;
  int64_t row = y->shape[axis] * inner, at = 0;
  for (int k = 0; k < n->n_in; k++) {
    tdm_tensor *x = n->in[k];
    int64_t chunk = x->shape[axis] * inner;
    float *gx = tdm__grad(tp, x);
    if (gx)
      for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < chunk; j++) gx[o * chunk + j] += g[o * row + at + j];
    at += chunk;
  }
}

tdm_tensor *tdm_concat(tdm_tape *tp, int n, tdm_tensor *const *xs, int axis) {
  TDM__NONNULL(tp, NULL, "concat: the tape is NULL");
  if (tp->status != TDM_OK) return NULL;
  if (n < 1 || !xs) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "concat: %d inputs; expected at least 1", n);
  if (!tdm__inputs_ok(tp, "concat", n, xs)) return NULL;
  int a = tdm__axis(tp, "concat", xs[0], axis);
  if (a < 0) return NULL;
  tdm_tensor **cs = tdm__scratch(tp, sizeof(tdm_tensor *) * (size_t)n);
  if (!cs) return NULL;
  int64_t shape[TDM_MAX_DIMS];
  memcpy(shape, xs[0]->shape, sizeof shape);
  shape[a] = 0;
  for (int k = 0; k < n; k++) {
    tdm_tensor *x = xs[k];
    if (!tdm__check_f32(tp, "concat", "input", x)) return NULL;
    int ok = x->ndim == xs[0]->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = d == a || x->shape[d] == xs[0]->shape[d];
    if (!ok)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "concat: input %d is %s but input 0 is %s; expected equal but for axis %d",
                       k, tdm__shp(x), tdm__shp(xs[0]), a);
    shape[a] += x->shape[a];
    if (!(cs[k] = tdm__contig(tp, x))) return NULL;
  }
  tdm_tensor *y = tdm__out(tp, TDM_F32, xs[0]->ndim, shape);
  if (!y) return NULL;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < a; d++) outer *= shape[d];
  for (int d = a + 1; d < y->ndim; d++) inner *= shape[d];
  int64_t row = shape[a] * inner, at = 0;
  float *out = y->data;
  for (int k = 0; k < n; k++) {
    int64_t chunk = cs[k]->shape[a] * inner;
    const float *src = cs[k]->data;
    for (int64_t o = 0; o < outer; o++) memcpy(out + o * row + at, src + o * chunk, sizeof(float) * (size_t)chunk);
    at += chunk;
  }
  tdm_node *nd = tdm__record(tp, "concat", concat_bw, y, n, cs);
  if (nd) nd->i[0] = a;
  return y;
}

tdm_status tdm_split(tdm_tape *tp, tdm_tensor *x, int axis, int n, const int64_t *sizes, tdm_tensor **outs) {
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "split: the tape is NULL");
  if (!tdm__inputs_ok(tp, "split", 1, &x)) return tp->status != TDM_OK ? tp->status : TDM_ERR_INVALID_ARG;
  int a = tdm__axis(tp, "split", x, axis);
  if (a < 0) return tp->status;
  if (!sizes || !outs) {
    tdm__fail(tp, TDM_ERR_INVALID_ARG, "split: %s is NULL", !sizes ? "sizes" : "outs");
    return tp->status;
  }
  int64_t total = 0;
  for (int k = 0; k < n; k++) total += sizes[k];
  if (n < 1 || total != x->shape[a]) {
    tdm__fail(tp, TDM_ERR_INVALID_ARG, "split: %d sizes adding up to %lld; axis %d of %s is %lld", n, (long long)total,
              a, tdm__shp(x), (long long)x->shape[a]);
    return tp->status;
  }
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    outs[k] = tdm_slice(tp, x, a, at, sizes[k]);
    at += sizes[k];
  }
  return tp->status;
}
