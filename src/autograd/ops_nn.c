/* Neural-network ops: activations, softmax family, losses, layernorm, embedding, dropout,
 * attention, convolution and pooling. Each checks its input, calls its kernel, and records a
 * node whose backward calls the matching backward kernel. */
#include <math.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

typedef void (*unary_fwd)(float *, const float *, int64_t);
typedef void (*unary_bwd)(float *, const float *, const float *, int64_t);

static const struct {
  const char *name;
  unary_fwd fwd;
  unary_bwd bwd;
  unary_bwd bwd_set; /* writes dx instead of adding to it (NULL: zero, then bwd) */
  int bwd_uses_output; /* tanh and sigmoid differentiate from y, relu and gelu from x */
} unary_ops[] = {
    {"relu", tdm_k_relu_fwd, tdm_k_relu_bwd, tdm_k_relu_bwd_set, 0},
    {"gelu", tdm_k_gelu_fwd, tdm_k_gelu_bwd, tdm_k_gelu_bwd_set, 0}, /* the MLP's wide activation */
    {"tanh", tdm_k_tanh_fwd, tdm_k_tanh_bwd, NULL, 1},
    {"sigmoid", tdm_k_sigmoid_fwd, tdm_k_sigmoid_bwd, NULL, 1},
};

static void unary_bw(tdm_tape *tp, tdm_node *n) {
  int k = (int)n->i[0], fresh = 0;
  tdm_tensor *x = n->in[0];
  void *graw = unary_ops[k].bwd_set ? tdm__grad_for_write(tp, x, &fresh) : tdm__grad(tp, x);
  if (!graw) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* 16-bit tensors go through f32 scratch */
  float *gx = tdm__grad_f32(tp, x, graw, fresh);
  const float *dy = tdm__f32(tp, n->out->grad), *v = tdm__f32(tp, unary_ops[k].bwd_uses_output ? n->out : x);
  if (gx && dy && v) {
    (fresh ? unary_ops[k].bwd_set : unary_ops[k].bwd)(gx, dy, v, n->out->numel);
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

static tdm_tensor *unary(tdm_tape *tp, int k, tdm_tensor *x) {
  const char *name = unary_ops[k].name;
  if (!tdm__inputs_ok(tp, name, 1, &x) || !tdm__check_act(tp, name, "input", x)) return NULL;
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, tdm__act_dtype(tp), x->ndim, x->shape) : NULL;
  if (!y) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32(tp, x);
  float *yf = xf ? tdm__f32_out(tp, y) : NULL;
  if (yf) {
    unary_ops[k].fwd(yf, xf, x->numel);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_node *n = tdm__record(tp, name, unary_bw, y, 1, &x);
  if (n) n->i[0] = k;
  return y;
}

tdm_tensor *tdm_relu(tdm_tape *tp, tdm_tensor *x) { return unary(tp, 0, x); }
tdm_tensor *tdm_gelu(tdm_tape *tp, tdm_tensor *x) { return unary(tp, 1, x); }
tdm_tensor *tdm_tanh(tdm_tape *tp, tdm_tensor *x) { return unary(tp, 2, x); }
tdm_tensor *tdm_sigmoid(tdm_tape *tp, tdm_tensor *x) { return unary(tp, 3, x); }

/* ---- softmax / log-softmax -------------------------------------------------------------- */
static void axis_split(const tdm_tensor *x, int a, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int d = 0; d < a; d++) *outer *= x->shape[d];
  for (int d = a + 1; d < x->ndim; d++) *inner *= x->shape[d];
  *n = x->shape[a];
}

static void softmax_bw(tdm_tape *tp, tdm_node *n) {
  float *gx = tdm__grad(tp, n->in[0]);
  if (!gx) return;
  if (n->i[3]) tdm_k_log_softmax_bwd(gx, n->out->grad->data, n->out->data, n->i[0], n->i[1], n->i[2]);
  else tdm_k_softmax_bwd(gx, n->out->grad->data, n->out->data, n->i[0], n->i[1], n->i[2]);
}

static tdm_tensor *softmax_any(tdm_tape *tp, tdm_tensor *x, int axis, int log) {
  const char *name = log ? "log_softmax" : "softmax";
  if (!tdm__inputs_ok(tp, name, 1, &x) || !tdm__check_f32(tp, name, "input", x)) return NULL;
  int a = tdm__axis(tp, name, x, axis);
  if (a < 0) return NULL;
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, TDM_F32, x->ndim, x->shape) : NULL;
  if (!y) return NULL;
  int64_t outer, nn, inner;
  axis_split(x, a, &outer, &nn, &inner);
  if (log) tdm_k_log_softmax_fwd(y->data, x->data, outer, nn, inner);
  else tdm_k_softmax_fwd(y->data, x->data, outer, nn, inner);
  tdm_node *n = tdm__record(tp, name, softmax_bw, y, 1, &x);
  if (n) {
    n->i[0] = outer;
    n->i[1] = nn;
    n->i[2] = inner;
    n->i[3] = log;
  }
  return y;
}

tdm_tensor *tdm_softmax(tdm_tape *tp, tdm_tensor *x, int axis) { return softmax_any(tp, x, axis, 0); }
tdm_tensor *tdm_log_softmax(tdm_tape *tp, tdm_tensor *x, int axis) { return softmax_any(tp, x, axis, 1); }

/* ---- cross-entropy ------------------------------------------------------------------------ */
/* i: [0] N, [1] C, [2] ignore, [3] count; saved[0]: lse */
static void ce_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0];
  void *graw = tdm__grad(tp, x);
  if (!graw || n->i[3] == 0) return;
  float scale = ((float *)n->out->grad->data)[0] / (float)n->i[3];
  tdm_tensor *t = n->in[1];
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* 16-bit logits and their gradient in f32 scratch */
  float *gx = tdm__grad_f32(tp, x, graw, 0);
  const float *lg = tdm__f32(tp, x);
  if (gx && lg) {
    tdm_k_cross_entropy_bwd(gx, lg, t->data, t->dtype == TDM_I64, n->i[0], n->i[1], n->i[2], n->saved[0], scale);
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_cross_entropy(tdm_tape *tp, tdm_tensor *logits, tdm_tensor *targets, int64_t ignore_index) {
  tdm_tensor *in[2] = {logits, targets};
  if (!tdm__inputs_ok(tp, "cross_entropy", 2, in)) return NULL;
  if (!tdm__check_act(tp, "cross_entropy", "logits", logits)) return NULL;
  if (targets->dtype != TDM_I32 && targets->dtype != TDM_I64)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: targets have dtype %s; expected i32 or i64",
                     tdm_dtype_name(targets->dtype));
  if (logits->ndim < 1)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: logits are 0-d; expected (..., classes)");
  int64_t C = logits->shape[logits->ndim - 1], N = C ? logits->numel / C : 0;
  if (C < 1) /* no class a target could name: not a loss of 0 */
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: logits %s have no class; expected (..., classes >= 1)", tdm__shp(logits));
  int ok = targets->ndim == logits->ndim - 1;
  for (int d = 0; ok && d < targets->ndim; d++) ok = targets->shape[d] == logits->shape[d];
  if (!ok)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: logits %s and targets %s; expected targets of shape logits[:-1]",
                     tdm__shp(logits), tdm__shp(targets));
  logits = tdm__contig(tp, logits);
  targets = tdm__contig(tp, targets);
  float *lse = logits && targets ? tdm__scratch(tp, sizeof(float) * (size_t)(N ? N : 1)) : NULL;
  tdm_tensor *y = lse ? tdm__out(tp, TDM_F32, 0, NULL) : NULL;
  if (!y) return NULL;
  int64_t count, bad;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* the loss reduces in f32, whatever the logits' dtype */
  const float *lg = tdm__f32(tp, logits);
  float loss = lg ? tdm_k_cross_entropy_fwd(lg, targets->data, targets->dtype == TDM_I64, N, C, ignore_index, lse, &count, &bad) : 0;
  tdm__arena_rewind(tp->arena, pos);
  if (!lg) return NULL;
  if (bad >= 0)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "cross_entropy: target %lld at row %lld is outside [0, %lld) and is not the ignore index %lld",
                     (long long)tdm_tensor_get(targets, bad), (long long)bad, (long long)C, (long long)ignore_index);
  ((float *)y->data)[0] = loss;
  tdm_tensor *ins[2] = {logits, targets};
  tdm_node *n = tdm__record(tp, "cross_entropy", ce_bw, y, 2, ins);
  if (n) {
    n->i[0] = N;
    n->i[1] = C;
    n->i[2] = ignore_index;
    n->i[3] = count;
    n->saved[0] = lse;
  }
  return y;
}

/* ---- mse ------------------------------------------------------------------------------------ */
static void mse_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *A = n->in[0], *B = n->in[1];
  float *ga = tdm__grad(tp, A), *gb = tdm__grad(tp, B);
  const float *a = A->data, *b = B->data;
  float f = 2.0f * ((float *)n->out->grad->data)[0] / (float)(A->numel ? A->numel : 1);
  for (int64_t i = 0; i < A->numel; i++) {
    float d = f * (a[i] - b[i]);
    if (ga) ga[i] += d;
    if (gb) gb[i] -= d;
  }
}

tdm_tensor *tdm_mse(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b) {
  tdm_tensor *in[2] = {a, b};
  if (!tdm__inputs_ok(tp, "mse", 2, in)) return NULL;
  if (!tdm__check_f32(tp, "mse", "a", a) || !tdm__check_f32(tp, "mse", "b", b)) return NULL;
  if (!tdm__shape_equal(a, b))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "mse: shapes %s and %s differ; expected equal", tdm__shp(a), tdm__shp(b));
  a = tdm__contig(tp, a);
  b = tdm__contig(tp, b);
  tdm_tensor *y = a && b ? tdm__out(tp, TDM_F32, 0, NULL) : NULL;
  if (!y) return NULL;
  double s = 0;
  const float *pa = a->data, *pb = b->data;
  for (int64_t i = 0; i < a->numel; i++) s += (double)(pa[i] - pb[i]) * (pa[i] - pb[i]);
  ((float *)y->data)[0] = a->numel ? (float)(s / (double)a->numel) : 0.0f;
  tdm_tensor *ins[2] = {a, b};
  tdm__record(tp, "mse", mse_bw, y, 2, ins);
  return y;
}

/* ---- layernorm ------------------------------------------------------------------------------ */
static void layernorm_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  int64_t C = x->shape[x->ndim - 1];
  void *graw = tdm__grad(tp, x);
  float *gw = tdm__grad(tp, w), *gb = tdm__grad(tp, b);
  tdm__arena_pos pos = tdm__arena_mark(tp->arena); /* 16-bit tensors go through f32 scratch */
  float *gx = tdm__grad_f32(tp, x, graw, 0);
  const float *dy = tdm__f32(tp, n->out->grad), *xf = tdm__f32(tp, x);
  if (dy && xf && (gx || !graw)) {
    tdm_k_layernorm_bwd(gx, gw, gb, dy, xf, w->data, n->saved[0], n->saved[1], x->numel / C, C);
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_layernorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, float eps) {
  tdm_tensor *in[3] = {x, w, b};
  if (!tdm__inputs_ok(tp, "layernorm", 3, in)) return NULL;
  if (!tdm__check_act(tp, "layernorm", "input", x)) return NULL;
  for (int k = 1; k < 3; k++)
    if (!tdm__check_f32(tp, "layernorm", k == 1 ? "weight" : "bias", in[k])) return NULL;
  int64_t C = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (x->ndim < 1 || C == 0 || w->ndim != 1 || b->ndim != 1 || w->shape[0] != C || b->shape[0] != C)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "layernorm: input %s, weight %s, bias %s; expected (..., C), (C), (C) with C > 0",
                     tdm__shp(x), tdm__shp(w), tdm__shp(b));
  x = tdm__contig(tp, x);
  int64_t N = x ? x->numel / C : 0;
  tdm_tensor *y = x ? tdm__out(tp, tdm__act_dtype(tp), x->ndim, x->shape) : NULL;
  float *stats = y ? tdm__scratch(tp, sizeof(float) * 2 * (size_t)(N ? N : 1)) : NULL;
  if (!stats) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32(tp, x);
  float *yf = xf ? tdm__f32_out(tp, y) : NULL;
  if (yf) {
    tdm_k_layernorm_fwd(yf, stats, stats + N, xf, w->data, b->data, N, C, eps);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_tensor *ins[3] = {x, w, b};
  tdm_node *n = tdm__record(tp, "layernorm", layernorm_bw, y, 3, ins);
  if (n) {
    n->saved[0] = stats;
    n->saved[1] = stats + N;
  }
  return y;
}

/* ---- embedding ----------------------------------------------------------------------------- */
/* The table is read and its gradient written TDM_HEAD_ROWS rows at a time (ops_head.c says why):
 * forward copies each block's tokens' rows; backward goes down the blocks, adding first a tied
 * output head's part of the block (saved[1]: the lm_head node, set by its backward), then the
 * block's tokens' rows in token order, the order one process adds them in. A block's gradient is
 * then final when nothing before this node read the table. i[0]: this node's index. */
static void embedding_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *table = n->in[0], *idx = n->in[1];
  tdm_node *head = n->saved[1];
  n->saved[1] = NULL;
  float *g = tdm__grad(tp, table);
  if (!g) return;
  int64_t V = table->shape[0], C = table->shape[1], N = idx->numel;
  int i64 = idx->dtype == TDM_I64, last = tdm__first_reader(tp, table, (int)n->i[0]);
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *dy = tdm__f32(tp, n->out->grad);
  for (int64_t b = (V + TDM_HEAD_ROWS - 1) / TDM_HEAD_ROWS - 1; dy && b >= 0; b--) {
    int64_t r0 = b * TDM_HEAD_ROWS, r1 = r0 + TDM_HEAD_ROWS < V ? r0 + TDM_HEAD_ROWS : V;
    if (tdm__fetch_rows(tp, "embedding", table, r0, r1, 1) != TDM_OK) break;
    if (head) tdm__head_dw_rows(tp, head, g, r0, r1);
    for (int64_t i = 0; i < N; i++) {
      int64_t v = i64 ? ((const int64_t *)idx->data)[i] : ((const int32_t *)idx->data)[i];
      if (v < r0 || v >= r1) continue;
      float *d = g + v * C;
      const float *s = dy + i * C;
      for (int64_t j = 0; j < C; j++) d[j] += s[j];
    }
    if (last) tdm__grad_rows_final(tp, table, r0, r1);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_embedding(tdm_tape *tp, tdm_tensor *table, tdm_tensor *idx) {
  tdm_tensor *in[1] = {idx};
  if (!tdm__inputs_ok(tp, "embedding", 1, in)) return NULL; /* the table is fetched a block at a time */
  if (!table) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "embedding: the table is NULL");
  if (!tdm__check_f32(tp, "embedding", "table", table)) return NULL;
  if (table->ndim != 2)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "embedding: table is %s; expected (vocab, dim)", tdm__shp(table));
  if (!tdm_tensor_is_contiguous(table) && !(table = tdm__contig(tp, table))) return NULL; /* a copy, read whole */
  if (idx->dtype != TDM_I32 && idx->dtype != TDM_I64)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "embedding: indices have dtype %s; expected i32 or i64",
                     tdm_dtype_name(idx->dtype));
  if (idx->ndim + 1 > TDM_MAX_DIMS)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "embedding: indices %s have too many axes", tdm__shp(idx));
  idx = tdm__contig(tp, idx);
  if (!idx) return NULL;
  int64_t V = table->shape[0], C = table->shape[1];
  int i64 = idx->dtype == TDM_I64;
  for (int64_t i = 0; i < idx->numel; i++) {
    int64_t v = i64 ? ((int64_t *)idx->data)[i] : ((int32_t *)idx->data)[i];
    if (v < 0 || v >= V)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "embedding: index %lld at position %lld is outside [0, %lld)",
                       (long long)v, (long long)i, (long long)V);
  }
  int64_t shape[TDM_MAX_DIMS];
  memcpy(shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
  shape[idx->ndim] = C;
  tdm_tensor *y = tdm__out(tp, tdm__act_dtype(tp), idx->ndim + 1, shape);
  if (!y) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *yf = tdm__f32_out(tp, y);
  for (int64_t r0 = 0; yf && r0 < V; r0 += TDM_HEAD_ROWS) {
    int64_t r1 = r0 + TDM_HEAD_ROWS < V ? r0 + TDM_HEAD_ROWS : V;
    if (tdm__fetch_rows(tp, "embedding", table, r0, r1, tp->in_backward) != TDM_OK) {
      yf = NULL;
      break;
    }
    for (int64_t i = 0; i < idx->numel; i++) {
      int64_t v = i64 ? ((const int64_t *)idx->data)[i] : ((const int32_t *)idx->data)[i];
      if (v >= r0 && v < r1) memcpy(yf + i * C, (const float *)table->data + v * C, sizeof(float) * (size_t)C);
    }
  }
  if (yf) tdm__store_f32(y, yf);
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_tensor *ins[2] = {table, idx};
  int64_t index = tp->n_nodes;
  tdm_node *n = tdm__record(tp, "embedding", embedding_bw, y, 2, ins);
  if (n) n->i[0] = index, n->self_fetch = 1;
  return y;
}

/* ---- dropout -------------------------------------------------------------------------------- */
/* i: [0] seed, [1] base; f[0]: p */
static void dropout_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0];
  void *graw = tdm__grad(tp, x);
  if (!graw) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *gx = tdm__grad_f32(tp, x, graw, 0);
  const float *dy = tdm__f32(tp, n->out->grad);
  if (gx && dy) {
    tdm_k_dropout_bwd(gx, dy, n->out->numel, n->f[0], (uint64_t)n->i[0], (uint64_t)n->i[1]);
    tdm__grad_commit(x, graw, gx);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_dropout(tdm_tape *tp, tdm_tensor *x, float p) {
  if (!tdm__inputs_ok(tp, "dropout", 1, &x) || !tdm__check_act(tp, "dropout", "input", x)) return NULL;
  if (!(p >= 0.0f && p < 1.0f))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "dropout: probability %g; expected 0 <= p < 1", (double)p);
  if (!tp->training || p == 0.0f) return x;
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, tdm__act_dtype(tp), x->ndim, x->shape) : NULL;
  if (!y) return NULL;
  int64_t per_sample = x->ndim && x->shape[0] ? x->numel / x->shape[0] : x->numel;
  uint64_t seed = tdm_hash64(tp->dropout_seed, tp->dropout_calls++);
  uint64_t base = (uint64_t)(tp->sample_base * per_sample);
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32(tp, x);
  float *yf = xf ? tdm__f32_out(tp, y) : NULL;
  if (yf) {
    tdm_k_dropout_fwd(yf, xf, x->numel, p, seed, base);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_node *n = tdm__record(tp, "dropout", dropout_bw, y, 1, &x);
  if (n) {
    n->i[0] = (int64_t)seed;
    n->i[1] = (int64_t)base;
    n->f[0] = p;
  }
  return y;
}

/* ---- attention ------------------------------------------------------------------------------ */
/* i: [0] B, [1] T, [2] C, [3] NH, [4] dtype of the saved probabilities; saved[0]: att, or NULL
 * under selective recomputation (rebuilt here from q and k, rounded as the stored ones would be).
 * Batches go through the kernels a chunk at a time (tdm__attn_batches), so the backward's scratch
 * and f32 copies of the probabilities hold one chunk's, and are given back when it returns. */
static void attention_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *qkv = n->in[0];
  int fresh;
  void *g = tdm__grad_for_write(tp, qkv, &fresh);
  if (!g) return;
  int64_t B = n->i[0], T = n->i[1], C = n->i[2], NH = n->i[3], bc = tdm__attn_batches(B, NH), HTT = NH * T * T;
  tdm_dtype dt = (tdm_dtype)n->i[4];
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *gf = tdm__grad_f32(tp, qkv, g, fresh);
  const float *x = tdm__f32(tp, qkv), *dy = tdm__f32(tp, n->out->grad);
  float *scratch = tdm__scratch(tp, sizeof(float) * (size_t)(bc * HTT > 0 ? bc * HTT : 1));
  float *buf = n->saved[0] && dt == TDM_F32 ? NULL : tdm__scratch(tp, sizeof(float) * (size_t)(bc * HTT > 0 ? bc * HTT : 1));
  int ok = gf && x && dy && scratch && (buf || (n->saved[0] && dt == TDM_F32));
  for (int64_t b0 = 0; ok && b0 < B; b0 += bc) {
    int64_t nb = B - b0 < bc ? B - b0 : bc;
    const float *xb = x + b0 * T * 3 * C;
    const float *att = tdm__probs_chunk(buf, n->saved[0], dt, b0 * HTT, nb * HTT, xb, xb + C, nb, T, NH, NH, C / NH, 3 * C, 3 * C);
    tdm_k_attention_bwd(gf + b0 * T * 3 * C, scratch, dy + b0 * T * C, att, xb, nb, T, C, NH, !fresh);
  }
  if (ok) tdm__grad_commit(qkv, g, gf);
  else if (fresh && qkv->grad->dtype == TDM_F32) tdm_k_zero(g, qkv->numel); /* the tape has failed; leave no garbage behind */
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_attention(tdm_tape *tp, tdm_tensor *qkv, int n_head) {
  if (!tdm__inputs_ok(tp, "attention", 1, &qkv) || !tdm__check_act(tp, "attention", "qkv", qkv)) return NULL;
  if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "attention: qkv is %s; expected (B, T, 3C)", tdm__shp(qkv));
  int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
  if (n_head <= 0 || C % n_head != 0)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "attention: %d heads do not divide the width %lld of qkv %s", n_head,
                     (long long)C, tdm__shp(qkv));
  qkv = tdm__contig(tp, qkv);
  int64_t shape[3] = {B, T, C}, HTT = n_head * T * T, PT = B * HTT, bc = tdm__attn_batches(B, n_head);
  tdm_dtype dt = tdm__act_dtype(tp);
  tdm_tensor *y = qkv ? tdm__out(tp, dt, 3, shape) : NULL;
  int keep = !tdm__selective(tp, 1, &qkv); /* selective recomputation rebuilds them in backward */
  void *att = y && keep ? tdm__scratch(tp, tdm_dtype_size(dt) * (size_t)(PT ? PT : 1)) : NULL;
  if (!y || (keep && !att)) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *x = tdm__f32(tp, qkv);
  float *yf = x ? tdm__f32_out(tp, y) : NULL;
  float *buf = yf && (dt != TDM_F32 || !keep) ? tdm__scratch(tp, sizeof(float) * (size_t)(bc * HTT > 0 ? bc * HTT : 1)) : NULL;
  int ok = yf && (buf || (dt == TDM_F32 && keep));
  for (int64_t b0 = 0; ok && b0 < B; b0 += bc) {
    int64_t nb = B - b0 < bc ? B - b0 : bc;
    float *attc = buf ? buf : (float *)att + b0 * HTT;
    tdm_k_attention_fwd(yf + b0 * T * C, attc, x + b0 * T * 3 * C, nb, T, C, n_head);
    if (keep) tdm__store_probs(att, dt, b0 * HTT, attc, nb * HTT);
  }
  if (ok) tdm__store_f32(y, yf);
  tdm__arena_rewind(tp->arena, pos);
  if (!ok) return NULL;
  tdm_node *n = tdm__record(tp, "attention", attention_bw, y, 1, &qkv);
  if (n) {
    int64_t v[5] = {B, T, C, n_head, dt};
    memcpy(n->i, v, sizeof v);
    n->saved[0] = att;
  }
  return y;
}

/* ---- pooling (conv2d: ops_conv.c) ---------------------------------------------------------- */
/* i: [0..3] N C H W, [4] K, [5] stride, [6] pad, [7] max?; saved[0]: argmax */
static void pool_bw(tdm_tape *tp, tdm_node *n) {
  float *gx = tdm__grad(tp, n->in[0]);
  if (!gx) return;
  const int64_t *a = n->i;
  int64_t OH = n->out->shape[2], OW = n->out->shape[3];
  if (a[7]) tdm_k_maxpool2d_bwd(gx, n->out->grad->data, n->saved[0], a[0], a[1], a[2], a[3], OH, OW);
  else tdm_k_avgpool2d_bwd(gx, n->out->grad->data, a[0], a[1], a[2], a[3], a[4], a[5], a[6], OH, OW);
}

static tdm_tensor *pool(tdm_tape *tp, tdm_tensor *x, int k, int stride, int pad, int is_max) {
  const char *name = is_max ? "maxpool2d" : "avgpool2d";
  if (!tdm__inputs_ok(tp, name, 1, &x) || !tdm__check_f32(tp, name, "input", x)) return NULL;
  if (x->ndim != 4) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: input %s; expected (N, C, H, W)", name, tdm__shp(x));
  if (k < 1 || stride < 1 || pad < 0 || 2 * pad > k)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: kernel %d, stride %d, padding %d; expected k, stride >= 1 and 0 <= padding <= k/2",
                     name, k, stride, pad);
  int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  if (H + 2 * pad < k || W + 2 * pad < k)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: window %d is larger than the padded input %s", name, k, tdm__shp(x));
  int64_t OH = (H + 2 * pad - k) / stride + 1, OW = (W + 2 * pad - k) / stride + 1;
  x = tdm__contig(tp, x);
  int64_t shape[4] = {N, C, OH, OW};
  tdm_tensor *y = x ? tdm__out(tp, TDM_F32, 4, shape) : NULL;
  if (!y) return NULL;
  int32_t *argmax = NULL;
  if (is_max) {
    if (!(argmax = tdm__scratch(tp, sizeof(int32_t) * (size_t)(y->numel ? y->numel : 1)))) return NULL;
    tdm_k_maxpool2d_fwd(y->data, argmax, x->data, N, C, H, W, k, stride, pad, OH, OW);
  } else {
    tdm_k_avgpool2d_fwd(y->data, x->data, N, C, H, W, k, stride, pad, OH, OW);
  }
  tdm_node *n = tdm__record(tp, name, pool_bw, y, 1, &x);
  if (n) {
    int64_t v[8] = {N, C, H, W, k, stride, pad, is_max};
    memcpy(n->i, v, sizeof v);
    n->saved[0] = argmax;
  }
  return y;
}

tdm_tensor *tdm_maxpool2d(tdm_tape *tp, tdm_tensor *x, int k, int stride, int pad) { return pool(tp, x, k, stride, pad, 1); }
tdm_tensor *tdm_avgpool2d(tdm_tape *tp, tdm_tensor *x, int k, int stride, int pad) { return pool(tp, x, k, stride, pad, 0); }
