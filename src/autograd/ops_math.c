/* matmul, linear, broadcasting arithmetic, scale and reductions. */
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

/* ---- matmul ------------------------------------------------------------------------------- */
/* i: [0] ta, [1] tb, [2] M, [3] N, [4] K, [5] batches, [6] b shared (2-d) */
static void matmul_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *A = n->in[0], *B = n->in[1];
  int ta = (int)n->i[0], tb = (int)n->i[1];
  int64_t M = n->i[2], N = n->i[3], K = n->i[4], batches = n->i[5], shared = n->i[6];
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  float *dA = tdm__grad(tp, A), *dB = tdm__grad(tp, B);
  const float *a = A->data, *b = B->data, *dC = n->out->grad->data;
  for (int64_t i = 0; i < batches; i++) {
    const float *ai = a + i * M * K, *bi = shared ? b : b + i * K * N, *dCi = dC + i * M * N;
    if (dA) {
      float *dAi = dA + i * M * K;
      if (!ta) tdm_k_gemm(0, !tb, M, K, N, 1.0f, dCi, N, bi, ldb, 1.0f, dAi, K);
      else tdm_k_gemm(tb, 1, K, M, N, 1.0f, bi, ldb, dCi, N, 1.0f, dAi, M);
    }
    if (dB) {
      float *dBi = shared ? dB : dB + i * K * N;
      if (!tb) tdm_k_gemm(!ta, 0, K, N, M, 1.0f, ai, lda, dCi, N, 1.0f, dBi, N);
      else tdm_k_gemm(1, ta, N, K, M, 1.0f, dCi, N, ai, lda, 1.0f, dBi, K);
    }
  }
}

tdm_tensor *tdm_matmul(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b, int ta, int tb) {
  tdm_tensor *in[2] = {a, b};
  if (!tdm__inputs_ok(tp, "matmul", 2, in)) return NULL;
  if (!tdm__check_f32(tp, "matmul", "a", a) || !tdm__check_f32(tp, "matmul", "b", b)) return NULL;
  if (a->ndim < 2 || b->ndim < 2)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "matmul: a is %s and b is %s; expected at least 2-d", tdm__shp(a),
                     tdm__shp(b));
  int64_t M = a->shape[a->ndim - (ta ? 1 : 2)], Ka = a->shape[a->ndim - (ta ? 2 : 1)];
  int64_t Kb = b->shape[b->ndim - (tb ? 1 : 2)], N = b->shape[b->ndim - (tb ? 2 : 1)];
  if (Ka != Kb)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "matmul: inner dimensions differ: a%s is %s, b%s is %s (%lld vs %lld)",
                     ta ? "^T" : "", tdm__shp(a), tb ? "^T" : "", tdm__shp(b), (long long)Ka, (long long)Kb);
  int shared = b->ndim == 2;
  if (!shared) {
    int ok = a->ndim == b->ndim;
    for (int d = 0; ok && d < a->ndim - 2; d++) ok = a->shape[d] == b->shape[d];
    if (!ok)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "matmul: batch axes differ: a is %s, b is %s", tdm__shp(a),
                       tdm__shp(b));
  }
  int64_t batches = 1, shape[TDM_MAX_DIMS];
  for (int d = 0; d < a->ndim - 2; d++) batches *= (shape[d] = a->shape[d]);
  shape[a->ndim - 2] = M;
  shape[a->ndim - 1] = N;
  a = tdm__contig(tp, a);
  b = tdm__contig(tp, b);
  tdm_tensor *y = a && b ? tdm__out(tp, TDM_F32, in[0]->ndim, shape) : NULL;
  if (!y) return NULL;
  int64_t lda = ta ? M : Ka, ldb = tb ? Ka : N;
  for (int64_t i = 0; i < batches; i++)
    tdm_k_gemm(ta, tb, M, N, Ka, 1.0f, (float *)a->data + i * M * Ka, lda,
               shared ? (float *)b->data : (float *)b->data + i * Ka * N, ldb, 0.0f, (float *)y->data + i * M * N, N);
  tdm_tensor *ins[2] = {a, b};
  tdm_node *n = tdm__record(tp, "matmul", matmul_bw, y, 2, ins);
  if (n) {
    int64_t v[7] = {ta, tb, M, N, Ka, batches, shared};
    memcpy(n->i, v, sizeof v);
  }
  return y;
}

/* ---- linear ------------------------------------------------------------------------------- */
/* Under autocast a product rounds its f32 weight to the 16-bit precision in scratch. A weight
 * larger than TDM_LP_PANEL floats (an embedding-sized output head) is rounded panel by panel, so
 * the scratch stays at TDM_LP_PANEL floats: output rows in forward, input columns in backward;
 * every element of the result is still one product's whole sum. */
static void round_to(float *dst, const float *src, int64_t n, tdm_dtype ac) {
  if (ac == TDM_BF16) tdm_k_round_bf16(dst, src, n);
  else tdm_k_round_f16(dst, src, n);
}

/* y (N, O) = x (N, In) w^T + b, w rounded to ac panel by panel (y, x f32). */
static int linear_fwd_panels(tdm_tape *tp, float *y, const float *x, const float *w, const float *b, int64_t N, int64_t In,
                             int64_t O, tdm_dtype ac) {
  int64_t rows = TDM_LP_PANEL / In > 0 ? TDM_LP_PANEL / In : 1;
  float *wp = tdm__scratch(tp, sizeof(float) * (size_t)(rows * In));
  if (!wp) return 0;
  if (b)
    for (int64_t n = 0; n < N; n++) memcpy(y + n * O, b, (size_t)O * sizeof(float));
  for (int64_t o0 = 0; o0 < O; o0 += rows) {
    int64_t r = O - o0 < rows ? O - o0 : rows;
    round_to(wp, w + o0 * In, r * In, ac);
    tdm_k_gemm(0, 1, N, r, In, 1.0f, x, In, wp, In, b ? 1.0f : 0.0f, y + o0, O);
  }
  return 1;
}

/* dx (N, In) (+)= dy (N, O) w, w rounded to ac in panels of input columns. */
static int linear_dx_panels(tdm_tape *tp, float *dx, const float *dy, const float *w, int64_t N, int64_t In, int64_t O,
                            tdm_dtype ac, float beta) {
  int64_t cols = TDM_LP_PANEL / O > 0 ? TDM_LP_PANEL / O : 1;
  float *wp = tdm__scratch(tp, sizeof(float) * (size_t)(cols * O));
  if (!wp) return 0;
  for (int64_t i0 = 0; i0 < In; i0 += cols) {
    int64_t c = In - i0 < cols ? In - i0 : cols;
    for (int64_t o = 0; o < O; o++) memcpy(wp + o * c, w + o * In + i0, sizeof(float) * (size_t)c);
    round_to(wp, wp, O * c, ac);
    tdm_k_gemm(0, 0, N, c, O, 1.0f, dy, O, wp, c, beta, dx + i0, In);
  }
  return 1;
}

/* i[0]: the autocast dtype of the forward: under bf16 / f16 the product's inputs (x and the f32
 * weight) are rounded to it, and its f32 result stored in it (convert-and-sgemm: this CPU has no
 * 16-bit arithmetic, see docs/PERFORMANCE.md). */
static void linear_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
  int64_t In = w->shape[1], O = w->shape[0], N = x->numel / In;
  tdm_dtype ac = (tdm_dtype)n->i[0];
  int fresh;
  void *dx = tdm__grad_for_write(tp, x, &fresh);
  float *dw = tdm__grad(tp, w), *db = b ? tdm__grad(tp, b) : NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *dout = tdm__f32(tp, n->out->grad);
  if (dx && dout) {
    int panels = ac != TDM_F32 && w->numel > TDM_LP_PANEL;
    const float *wf = panels ? w->data : tdm__f32_round(tp, w, ac);
    float *dxf = wf ? tdm__grad_f32(tp, x, dx, fresh) : NULL;
    if (dxf && panels) {
      if (linear_dx_panels(tp, dxf, dout, w->data, N, In, O, ac, fresh ? 0.0f : 1.0f)) tdm__grad_commit(x, dx, dxf);
    } else if (dxf) {
      tdm_k_gemm(0, 0, N, In, O, 1.0f, dout, O, wf, In, fresh ? 0.0f : 1.0f, dxf, In);
      tdm__grad_commit(x, dx, dxf);
    }
  }
  const float *xf = dout && (dw || db) ? tdm__f32_round(tp, x, ac) : NULL;
  if (xf) tdm_k_linear_bwd(NULL, dw, db, dout, xf, w->data, N, In, O);
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_linear(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b) {
  tdm_tensor *in[3] = {x, w, b};
  if (!tdm__inputs_ok(tp, "linear", 2, in)) return NULL;
  if (!tdm__check_act(tp, "linear", "input", x) || !tdm__check_f32(tp, "linear", "weight", w)) return NULL;
  if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "linear: input %s and weight %s; expected input (..., %lld) for a weight (out, in)",
                     tdm__shp(x), tdm__shp(w), (long long)(w->ndim == 2 ? w->shape[1] : -1));
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0] || b->dtype != TDM_F32))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "linear: bias is %s %s; expected (%lld) f32", tdm__shp(b),
                     tdm_dtype_name(b->dtype), (long long)w->shape[0]);
  x = tdm__contig(tp, x);
  w = tdm__contig(tp, w);
  if (!x || !w) return NULL;
  int64_t shape[TDM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = w->shape[0];
  tdm_dtype ac = tdm__act_dtype(tp);
  tdm_tensor *y = tdm__out(tp, ac, x->ndim, shape);
  if (!y) return NULL;
  int64_t In = w->shape[1], O = w->shape[0];
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  int panels = ac != TDM_F32 && w->numel > TDM_LP_PANEL;
  const float *xf = tdm__f32_round(tp, x, ac), *wf = xf ? (panels ? w->data : tdm__f32_round(tp, w, ac)) : NULL;
  float *yf = wf ? tdm__f32_out(tp, y) : NULL;
  if (yf && panels) {
    if (linear_fwd_panels(tp, yf, xf, w->data, b ? b->data : NULL, x->numel / (In ? In : 1), In, O, ac)) tdm__store_f32(y, yf);
    else yf = NULL;
  } else if (yf) {
    tdm_k_linear_fwd(yf, xf, wf, b ? b->data : NULL, x->numel / (In ? In : 1), In, O);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_tensor *ins[3] = {x, w, b};
  tdm_node *n = tdm__record(tp, "linear", linear_bw, y, b ? 3 : 2, ins);
  if (n) n->i[0] = ac;
  return y;
}

/* ---- broadcasting arithmetic ------------------------------------------------------------ */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV };
static const char *bin_names[] = {"add", "sub", "mul", "div"};

/* Strides of x seen from an output of ndim axes: 0 along broadcast axes. */
static void bcast_strides(const tdm_tensor *x, int ndim, const int64_t *oshape, int64_t *st) {
  int off = ndim - x->ndim;
  for (int d = 0; d < ndim; d++) {
    int xd = d - off;
    st[d] = (xd < 0 || x->shape[xd] == 1 || oshape[d] == 1) ? 0 : x->stride[xd];
  }
}

#define ND_LOOP(ndim, shape, n, BODY, ...)                                    \
  do {                                                                        \
    int64_t idx_[TDM_MAX_DIMS] = {0}, oa = 0, ob = 0;                         \
    for (int64_t i = 0; i < (n); i++) {                                       \
      BODY;                                                                   \
      (void)ob; /* the reductions walk one operand only */                    \
      for (int d = (ndim) - 1; d >= 0; d--) {                                 \
        idx_[d]++;                                                            \
        oa += sa[d];                                                          \
        ob += sb[d];                                                          \
        if (idx_[d] < (shape)[d]) break;                                      \
        oa -= sa[d] * (shape)[d];                                             \
        ob -= sb[d] * (shape)[d];                                             \
        idx_[d] = 0;                                                          \
      }                                                                       \
    }                                                                         \
  } while (0)

/* 16-bit operands and gradients go through f32 scratch (the values and the order of every sum are
 * those of the f32 path on the same values). */
static void binary_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *A = n->in[0], *B = n->in[1], *y = n->out;
  int op = (int)n->i[0];
  int64_t sa[TDM_MAX_DIMS], sb[TDM_MAX_DIMS];
  bcast_strides(A, y->ndim, y->shape, sa);
  bcast_strides(B, y->ndim, y->shape, sb);
  float *ga, *gb;
  if ((op == OP_ADD || op == OP_SUB) && tdm__shape_equal(A, B) && A != B) { /* residual adds */
    int fa, fb;
    void *ra = tdm__grad_for_write(tp, A, &fa), *rb = tdm__grad_for_write(tp, B, &fb);
    tdm__arena_pos pos = tdm__arena_mark(tp->arena);
    const float *g = tdm__f32(tp, y->grad);
    ga = tdm__grad_f32(tp, A, ra, fa), gb = tdm__grad_f32(tp, B, rb, fb);
    float sgn = op == OP_ADD ? 1.0f : -1.0f;
    if (g && ga) fa ? tdm_k_scale(ga, 1.0f, g, y->numel) : tdm_k_axpy(ga, 1.0f, g, y->numel);
    if (g && gb) fb ? tdm_k_scale(gb, sgn, g, y->numel) : tdm_k_axpy(gb, sgn, g, y->numel);
    if (g) {
      tdm__grad_commit(A, ra, ga);
      tdm__grad_commit(B, rb, gb);
    }
    tdm__arena_rewind(tp->arena, pos);
    return;
  }
  void *ra = tdm__grad(tp, A), *rb = tdm__grad(tp, B);
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *g = tdm__f32(tp, y->grad);
  const float *a = op >= OP_MUL ? tdm__f32(tp, A) : NULL, *b = op >= OP_MUL ? tdm__f32(tp, B) : NULL;
  ga = tdm__grad_f32(tp, A, ra, 0), gb = tdm__grad_f32(tp, B, rb, 0);
  if (!g || (op >= OP_MUL && (!a || !b)) || (ra && !ga) || (rb && !gb)) {
    tdm__arena_rewind(tp->arena, pos);
    return;
  }
  switch (op) {
  case OP_ADD:
  case OP_SUB: {
    float sgn = op == OP_ADD ? 1.0f : -1.0f;
    ND_LOOP(y->ndim, y->shape, y->numel, {
      if (ga) ga[oa] += g[i];
      if (gb) gb[ob] += sgn * g[i];
    });
    break;
  }
  case OP_MUL:
    ND_LOOP(y->ndim, y->shape, y->numel, {
      if (ga) ga[oa] += g[i] * b[ob];
      if (gb) gb[ob] += g[i] * a[oa];
    });
    break;
  case OP_DIV:
    ND_LOOP(y->ndim, y->shape, y->numel, {
      if (ga) ga[oa] += g[i] / b[ob];
      if (gb) gb[ob] -= g[i] * a[oa] / (b[ob] * b[ob]);
    });
    break;
  }
  tdm__grad_commit(A, ra, ga);
  tdm__grad_commit(B, rb, gb);
  tdm__arena_rewind(tp->arena, pos);
}

static tdm_tensor *binary(tdm_tape *tp, int op, tdm_tensor *a, tdm_tensor *b) {
  const char *name = bin_names[op];
  tdm_tensor *in[2] = {a, b};
  if (!tdm__inputs_ok(tp, name, 2, in)) return NULL;
  if (!tdm__check_act(tp, name, "a", a) || !tdm__check_act(tp, name, "b", b)) return NULL;
  int ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
  int64_t shape[TDM_MAX_DIMS];
  for (int d = 0; d < ndim; d++) {
    int da = d - (ndim - a->ndim), db = d - (ndim - b->ndim);
    int64_t x = da >= 0 ? a->shape[da] : 1, z = db >= 0 ? b->shape[db] : 1;
    if (x != z && x != 1 && z != 1)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: shapes %s and %s do not broadcast (axis %d: %lld vs %lld)", name,
                       tdm__shp(a), tdm__shp(b), d, (long long)x, (long long)z);
    shape[d] = x == 1 ? z : x;
  }
  a = tdm__contig(tp, a);
  b = tdm__contig(tp, b);
  tdm_tensor *y = a && b ? tdm__out(tp, tdm__act_dtype(tp), ndim, shape) : NULL;
  if (!y) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *pa = tdm__f32(tp, a), *pb = tdm__f32(tp, b);
  float *o = pa && pb ? tdm__f32_out(tp, y) : NULL;
  if (!o) {
    tdm__arena_rewind(tp->arena, pos);
    return NULL;
  }
  if (tdm__shape_equal(a, b)) { /* the common case, vectorisable */
    int64_t n = y->numel;
    switch (op) {
    case OP_ADD: tdm_k_add(o, pa, pb, n); break;
    case OP_SUB: for (int64_t i = 0; i < n; i++) o[i] = pa[i] - pb[i]; break;
    case OP_MUL: for (int64_t i = 0; i < n; i++) o[i] = pa[i] * pb[i]; break;
    case OP_DIV: for (int64_t i = 0; i < n; i++) o[i] = pa[i] / pb[i]; break;
    }
  } else {
    int64_t sa[TDM_MAX_DIMS], sb[TDM_MAX_DIMS];
    bcast_strides(a, ndim, shape, sa);
    bcast_strides(b, ndim, shape, sb);
    switch (op) {
    case OP_ADD: ND_LOOP(ndim, shape, y->numel, o[i] = pa[oa] + pb[ob]); break;
    case OP_SUB: ND_LOOP(ndim, shape, y->numel, o[i] = pa[oa] - pb[ob]); break;
    case OP_MUL: ND_LOOP(ndim, shape, y->numel, o[i] = pa[oa] * pb[ob]); break;
    case OP_DIV: ND_LOOP(ndim, shape, y->numel, o[i] = pa[oa] / pb[ob]); break;
    }
  }
  tdm__store_f32(y, o);
  tdm__arena_rewind(tp->arena, pos);
  tdm_tensor *ins[2] = {a, b};
  tdm_node *n = tdm__record(tp, name, binary_bw, y, 2, ins);
  if (n) n->i[0] = op;
  return y;
}

tdm_tensor *tdm_add(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b) { return binary(tp, OP_ADD, a, b); }
tdm_tensor *tdm_sub(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b) { return binary(tp, OP_SUB, a, b); }
tdm_tensor *tdm_mul(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b) { return binary(tp, OP_MUL, a, b); }
tdm_tensor *tdm_div(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b) { return binary(tp, OP_DIV, a, b); }

/* relu(a + b) for a residual block's end: the output's sign is the mask for both gradients, so
 * the sum is never kept and each way is one pass instead of two (forward) or three (backward). */
static void add_relu_bw(tdm_tape *tp, tdm_node *n) {
  int fa = 0, fb = 0;
  float *ga = tdm__grad_for_write(tp, n->in[0], &fa), *gb = tdm__grad_for_write(tp, n->in[1], &fb);
  tdm_k_relu_bwd2(ga, fa, gb, fb, n->out->grad->data, n->out->data, n->out->numel);
}

tdm_tensor *tdm_add_relu(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b) {
  tdm_tensor *in[2] = {a, b};
  if (!tdm__inputs_ok(tp, "add_relu", 2, in)) return NULL;
  if (a == b || a->dtype != TDM_F32 || b->dtype != TDM_F32 || tdm__act_dtype(tp) != TDM_F32 || !tdm__shape_equal(a, b))
    return tdm_relu(tp, tdm_add(tp, a, b)); /* broadcasting, 16-bit, or a + a: the two ops */
  a = tdm__contig(tp, a);
  b = a ? tdm__contig(tp, b) : NULL;
  tdm_tensor *y = a && b ? tdm__out(tp, TDM_F32, a->ndim, a->shape) : NULL;
  if (!y) return NULL;
  tdm_k_add_relu(y->data, a->data, b->data, y->numel);
  tdm_tensor *ins[2] = {a, b};
  tdm__record(tp, "add_relu", add_relu_bw, y, 2, ins);
  return y;
}

static void scale_bw(tdm_tape *tp, tdm_node *n) {
  float *gx = tdm__grad(tp, n->in[0]), s = n->f[0];
  const float *g = n->out->grad->data;
  if (gx)
    for (int64_t i = 0; i < n->out->numel; i++) gx[i] += s * g[i];
}

tdm_tensor *tdm_scale(tdm_tape *tp, tdm_tensor *x, float s) {
  if (!tdm__inputs_ok(tp, "scale", 1, &x) || !tdm__check_f32(tp, "scale", "input", x)) return NULL;
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, TDM_F32, x->ndim, x->shape) : NULL;
  if (!y) return NULL;
  const float *px = x->data;
  float *o = y->data;
  for (int64_t i = 0; i < x->numel; i++) o[i] = s * px[i];
  tdm_node *n = tdm__record(tp, "scale", scale_bw, y, 1, &x);
  if (n) n->f[0] = s;
  return y;
}

/* ---- sum / mean ----------------------------------------------------------------------------- */
/* i: [0] mask of reduced axes; f[0]: factor (1 or 1/count) */
static void reduce_strides(const tdm_tensor *x, int64_t mask, int64_t *st) {
  int64_t s = 1; /* strides of the keepdim output, 0 along reduced axes */
  for (int d = x->ndim - 1; d >= 0; d--) {
    if (mask & (1 << d)) st[d] = 0;
    else {
      st[d] = s;
      s *= x->shape[d];
    }
  }
}

static void reduce_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0];
  float *gx = tdm__grad(tp, x), f = n->f[0];
  if (!gx) return;
  int64_t sa[TDM_MAX_DIMS], sb[TDM_MAX_DIMS] = {0};
  reduce_strides(x, n->i[0], sa);
  const float *g = n->out->grad->data;
  ND_LOOP(x->ndim, x->shape, x->numel, gx[i] += f * g[oa]);
}

static tdm_tensor *reduce(tdm_tape *tp, const char *name, tdm_tensor *x, int naxes, const int *axes, int keepdim,
                          int mean) {
  if (!tdm__inputs_ok(tp, name, 1, &x) || !tdm__check_f32(tp, name, "input", x)) return NULL;
  int64_t mask = 0;
  if (naxes < 0 || naxes > x->ndim || (naxes && !axes))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: %d axes%s of a %d-dimensional input; expected 0 (all) to %d", name, naxes,
                     naxes && !axes ? " (NULL)" : "", x->ndim, x->ndim);
  if (naxes == 0) mask = (1 << x->ndim) - 1;
  for (int k = 0; k < naxes; k++) {
    int a = tdm__axis(tp, name, x, axes[k]);
    if (a < 0) return NULL;
    if (mask & (1 << a)) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: axis %d is given twice", name, axes[k]);
    mask |= 1 << a;
  }
  int64_t shape[TDM_MAX_DIMS], count = 1;
  int nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask & (1 << d)) {
      count *= x->shape[d];
      if (keepdim) shape[nd++] = 1;
    } else {
      shape[nd++] = x->shape[d];
    }
  }
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, TDM_F32, nd, shape) : NULL;
  if (!y) return NULL;
  float *o = y->data, f = mean ? (count ? 1.0f / (float)count : 0.0f) : 1.0f;
  memset(o, 0, sizeof(float) * (size_t)y->numel);
  int64_t sa[TDM_MAX_DIMS], sb[TDM_MAX_DIMS] = {0};
  reduce_strides(x, mask, sa);
  const float *px = x->data;
  ND_LOOP(x->ndim, x->shape, x->numel, o[oa] += px[i]);
  if (mean)
    for (int64_t i = 0; i < y->numel; i++) o[i] *= f;
  tdm_node *n = tdm__record(tp, name, reduce_bw, y, 1, &x);
  if (n) {
    n->i[0] = mask;
    n->f[0] = f;
  }
  return y;
}

tdm_tensor *tdm_sum(tdm_tape *tp, tdm_tensor *x, int naxes, const int *axes, int keepdim) {
  return reduce(tp, "sum", x, naxes, axes, keepdim, 0);
}
tdm_tensor *tdm_mean(tdm_tape *tp, tdm_tensor *x, int naxes, const int *axes, int keepdim) {
  return reduce(tp, "mean", x, naxes, axes, keepdim, 1);
}
