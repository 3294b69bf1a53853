/* Tensor parallelism's ops as custom autograd ops (see tp_ops.h). They compute and communicate in
 * f32; under mixed precision a 16-bit input is widened first (tdm_cast: exact, and its backward
 * rounds the f32 gradient into the input's), and the outputs stay f32, which the next ops read
 * as they read any activation: the collectives sum f32 partial results, not 16-bit ones. */
#include "parallel/tp_ops.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/kernels.h"
#include "tensor/fastmath.h"

static tdm_status allreduce(tdm__tp_comm *c, const void *src, void *dst, int64_t n, tdm_dtype dt, tdm_redop op) {
  if (!c->comm) {
    if (dst != src) memcpy(dst, src, (size_t)n * tdm_dtype_size(dt));
    return TDM_OK;
  }
  double t0 = tdm_time_now();
  tdm_status st = tdm_comm_allreduce(c->comm, src, dst, (size_t)n, dt, op, tdm_comm_rank_order_algo(c->comm));
  c->seconds += tdm_time_now() - t0;
  c->bytes += (double)n * (double)tdm_dtype_size(dt);
  c->calls++;
  return st;
}

static tdm_tensor *new_like(tdm_tape *tp, const tdm_tensor *x) {
  return tdm_new(tp, TDM_F32, tdm_tensor_ndim(x), tdm_tensor_shape(x));
}

/* ---- f: identity forward, all-reduce backward ------------------------------------------------- */
static tdm_status copy_fwd(tdm_custom_ctx *ctx, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)ctx, (void)tp, (void)n, (void)user;
  *out = in[0]; /* the tape gives the output a header of its own */
  return TDM_OK;
}

static tdm_status copy_bwd(tdm_custom_ctx *ctx, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)ctx, (void)n;
  if (!gin[0]) return TDM_OK; /* the same on every rank: the graphs are the same */
  return allreduce(user, tdm_tensor_data(gy), tdm_tensor_data(gin[0]), tdm_tensor_numel(gy), TDM_F32, TDM_SUM);
}

static const tdm_custom_op copy_op = {"tp_copy", copy_fwd, copy_bwd, 0};

static tdm_tensor *widened(tdm_tape *tp, tdm_tensor *x) {
  return x && tdm_tensor_dtype(x) != TDM_F32 ? tdm_cast(tp, x, TDM_F32) : x;
}

tdm_tensor *tdm__tp_copy(tdm_tape *tp, tdm__tp_comm *c, tdm_tensor *x) {
  if (!c->comm) return x; /* one rank: f is the identity both ways */
  x = widened(tp, x);
  return x ? tdm_custom(tp, &copy_op, c, 1, &x) : NULL;
}

/* ---- g: all-reduce forward, identity backward ------------------------------------------------- */
static tdm_status reduce_fwd(tdm_custom_ctx *ctx, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)ctx, (void)n;
  tdm_tensor *y = new_like(tp, in[0]);
  if (!y) return tdm_tape_status(tp);
  *out = y;
  return allreduce(user, tdm_tensor_data(in[0]), tdm_tensor_data(y), tdm_tensor_numel(y), TDM_F32, TDM_SUM);
}

static tdm_status reduce_bwd(tdm_custom_ctx *ctx, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)ctx, (void)n, (void)user;
  if (gin[0]) memcpy(tdm_tensor_data(gin[0]), tdm_tensor_data(gy), sizeof(float) * (size_t)tdm_tensor_numel(gy));
  return TDM_OK;
}

static const tdm_custom_op reduce_op = {"tp_reduce", reduce_fwd, reduce_bwd, 0};

tdm_tensor *tdm__tp_reduce(tdm_tape *tp, tdm__tp_comm *c, tdm_tensor *x) {
  if (!c->comm) return x;
  x = widened(tp, x);
  return x ? tdm_custom(tp, &reduce_op, c, 1, &x) : NULL;
}

/* ---- the embedding rows this rank holds ----------------------------------------------------------- */
static int64_t id_at(const tdm_tensor *idx, int64_t i) {
  return tdm_tensor_dtype(idx) == TDM_I64 ? ((const int64_t *)tdm_tensor_data(idx))[i]
                                         : ((const int32_t *)tdm_tensor_data(idx))[i];
}

static tdm_status emb_fwd(tdm_custom_ctx *ctx, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)n;
  tdm_tensor *table = in[0], *idx = in[1];
  int64_t lo = *(const int64_t *)user, V_t = tdm_tensor_dim(table, 0), C = tdm_tensor_dim(table, 1);
  if (tdm_tensor_ndim(table) != 2 || (tdm_tensor_dtype(idx) != TDM_I32 && tdm_tensor_dtype(idx) != TDM_I64) ||
      tdm_tensor_ndim(idx) + 1 > TDM_MAX_DIMS)
    return tdm_custom_fail(ctx, TDM_ERR_INVALID_ARG, "table (V_t, C) f32 and indices i32/i64 expected");
  int64_t shape[TDM_MAX_DIMS];
  memcpy(shape, tdm_tensor_shape(idx), sizeof(int64_t) * (size_t)tdm_tensor_ndim(idx));
  shape[tdm_tensor_ndim(idx)] = C;
  tdm_tensor *y = tdm_new(tp, TDM_F32, tdm_tensor_ndim(idx) + 1, shape);
  if (!y) return tdm_tape_status(tp);
  const float *w = tdm_tensor_data(table);
  float *yd = tdm_tensor_data(y);
  for (int64_t i = 0; i < tdm_tensor_numel(idx); i++) {
    int64_t v = id_at(idx, i) - lo;
    if (v >= 0 && v < V_t) memcpy(yd + i * C, w + v * C, sizeof(float) * (size_t)C);
    else memset(yd + i * C, 0, sizeof(float) * (size_t)C);
  }
  int64_t *keep = tdm_custom_alloc(ctx, sizeof *keep); /* user is the caller's stack: backward reads this */
  if (!keep) return tdm_custom_fail(ctx, TDM_ERR_NO_MEMORY, "out of memory");
  *keep = lo;
  tdm_custom_set_state(ctx, keep);
  TDM__TRY(tdm_custom_save(ctx, idx));
  *out = y;
  return TDM_OK;
}

static tdm_status emb_bwd(tdm_custom_ctx *ctx, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)n, (void)user;
  if (!gin[0]) return TDM_OK;
  const tdm_tensor *idx = tdm_custom_saved(ctx, 0);
  int64_t lo = *(const int64_t *)tdm_custom_state(ctx), V_t = tdm_tensor_dim(gin[0], 0), C = tdm_tensor_dim(gin[0], 1);
  float *g = tdm_tensor_data(gin[0]);
  const float *d = tdm_tensor_data(gy);
  for (int64_t i = 0; i < tdm_tensor_numel(idx); i++) { /* in order: the sums of one process's kernel */
    int64_t v = id_at(idx, i) - lo;
    if (v >= 0 && v < V_t)
      for (int64_t k = 0; k < C; k++) g[v * C + k] += d[i * C + k];
  }
  return TDM_OK;
}

static const tdm_custom_op emb_op = {"tp_embedding", emb_fwd, emb_bwd, 1}; /* adds rows into the table's gradient */

tdm_tensor *tdm__tp_embedding(tdm_tape *tp, tdm_tensor *table, tdm_tensor *idx, int64_t lo) {
  tdm_tensor *in[2] = {table, idx};
  return tdm_custom(tp, &emb_op, &lo, 2, in);
}

/* ---- cross-entropy over a split vocabulary -------------------------------------------------------- */
typedef struct {
  tdm__tp_comm *c;
  int64_t lo, V, ignore;
  double *correct, *rows;
  /* kept for backward */
  int64_t N, Vt, count;
  float *lse;
} ce_state;

typedef struct {
  const float *x;
  const void *tg;
  int i64;
  int64_t Vt, lo;
  double *mine;      /* [2N]: row max, global index of its first occurrence */
  const float *gmax; /* [N] */
  double *sums;      /* [2N]: sum of exp(x - max), the target's logit (0 when not here) */
  float *d;          /* backward: the gradient */
  const float *lse;
  float scale;
  int64_t ignore;
} ce_pass;

static int64_t target_of(const ce_pass *p, int64_t r) {
  return p->i64 ? ((const int64_t *)p->tg)[r] : ((const int32_t *)p->tg)[r];
}

static void local_max(void *vc, int64_t r0, int64_t r1) {
  ce_pass *p = vc;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = p->x + r * p->Vt;
    int64_t best = 0;
    for (int64_t j = 1; j < p->Vt; j++)
      if (x[j] > x[best]) best = j;
    p->mine[2 * r] = x[best];
    p->mine[2 * r + 1] = (double)(p->lo + best);
  }
}

static void local_sums(void *vc, int64_t r0, int64_t r1) {
  ce_pass *p = vc;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = p->x + r * p->Vt;
    float mx = p->gmax[r], acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= p->Vt; j += 8) /* eight lanes, as one process's kernel sums */
      for (int k = 0; k < 8; k++) acc[k] += tdm__exp_neg(x[j + k] - mx);
    for (; j < p->Vt; j++) acc[j & 7] += tdm__exp_neg(x[j] - mx);
    p->sums[2 * r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    int64_t t = target_of(p, r) - p->lo;
    p->sums[2 * r + 1] = t >= 0 && t < p->Vt ? x[t] : 0.0;
  }
}

static tdm_status ce_fwd(tdm_custom_ctx *ctx, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)n;
  ce_state *s = tdm_custom_alloc(ctx, sizeof *s); /* user is the caller's stack: backward reads this copy */
  if (!s) return tdm_custom_fail(ctx, TDM_ERR_NO_MEMORY, "out of memory");
  *s = *(const ce_state *)user;
  tdm_custom_set_state(ctx, s);
  tdm_tensor *logits = in[0], *targets = in[1];
  if (tdm_tensor_dtype(logits) != TDM_F32 || (tdm_tensor_dtype(targets) != TDM_I32 && tdm_tensor_dtype(targets) != TDM_I64))
    return tdm_custom_fail(ctx, TDM_ERR_INVALID_ARG, "logits f32 and targets i32/i64 expected, got %s and %s",
                           tdm_dtype_name(tdm_tensor_dtype(logits)), tdm_dtype_name(tdm_tensor_dtype(targets)));
  int nd = tdm_tensor_ndim(logits), ok = nd >= 1 && tdm_tensor_ndim(targets) == nd - 1;
  for (int d = 0; ok && d < nd - 1; d++) ok = tdm_tensor_dim(targets, d) == tdm_tensor_dim(logits, d);
  if (!ok) return tdm_custom_fail(ctx, TDM_ERR_INVALID_ARG, "logits and targets: expected targets of shape logits[:-1]");
  int64_t Vt = tdm_tensor_dim(logits, -1), N = Vt ? tdm_tensor_numel(logits) / Vt : 0;
  if (Vt < 1 || s->lo < 0 || s->lo + Vt > s->V)
    return tdm_custom_fail(ctx, TDM_ERR_INVALID_ARG, "this rank's %lld columns from %lld do not lie in the vocabulary of %lld",
                           (long long)Vt, (long long)s->lo, (long long)s->V);
  ce_pass p = {tdm_tensor_data(logits), tdm_tensor_data(targets), tdm_tensor_dtype(targets) == TDM_I64, Vt, s->lo,
               NULL, NULL, NULL, NULL, NULL, 0, s->ignore};
  /* the targets are the same on every rank: a bad one fails them all here, before any collective */
  int64_t count = 0;
  for (int64_t r = 0; r < N; r++) {
    int64_t t = target_of(&p, r);
    if (t == s->ignore) continue;
    if (t < 0 || t >= s->V)
      return tdm_custom_fail(ctx, TDM_ERR_INVALID_ARG, "target %lld at row %lld is outside [0, %lld) and is not the ignore index %lld",
                             (long long)t, (long long)r, (long long)s->V, (long long)s->ignore);
    count++;
  }
  int T = s->c->comm ? tdm_comm_size(s->c->comm) : 1;
  double *all = tdm_custom_alloc(ctx, sizeof(double) * (size_t)(2 * N * T + 2 * N + 1));
  float *gmax = tdm_custom_alloc(ctx, sizeof(float) * (size_t)(N + 1));
  float *lse = tdm_custom_alloc(ctx, sizeof(float) * (size_t)(N + 1));
  int64_t shape0[1] = {1};
  tdm_tensor *y = tdm_new(tp, TDM_F32, 0, shape0);
  if (!all || !gmax || !lse || !y) return tdm_tape_status(tp) != TDM_OK ? tdm_tape_status(tp) : TDM_ERR_NO_MEMORY;
  double *mine = all + 2 * N * T, *gathered = all;
  p.mine = mine;
  tdm_parallel_for(N, 1 + 65536 / Vt, local_max, &p);
  if (s->c->comm) { /* every rank's row maxima: the global maximum and where it first occurs */
    double t0 = tdm_time_now();
    tdm_status st = tdm_comm_allgather(s->c->comm, mine, gathered, (size_t)(2 * N), TDM_F64, TDM_ALGO_AUTO);
    s->c->seconds += tdm_time_now() - t0;
    s->c->bytes += 16.0 * (double)N * T;
    s->c->calls++;
    TDM__TRY(st);
  } else {
    memcpy(gathered, mine, sizeof(double) * (size_t)(2 * N));
  }
  double correct = 0;
  for (int64_t r = 0; r < N; r++) {
    int best = 0; /* blocks ascend with the rank: the first rank holding the maximum has its first index */
    for (int q = 1; q < T; q++)
      if (gathered[(int64_t)q * 2 * N + 2 * r] > gathered[(int64_t)best * 2 * N + 2 * r]) best = q;
    gmax[r] = (float)gathered[(int64_t)best * 2 * N + 2 * r];
    correct += (int64_t)gathered[(int64_t)best * 2 * N + 2 * r + 1] == target_of(&p, r);
  }
  double *sums = mine; /* reused: [2N] */
  p.gmax = gmax;
  p.sums = sums;
  tdm_parallel_for(N, 1 + 65536 / Vt, local_sums, &p);
  TDM__TRY(allreduce(s->c, sums, sums, 2 * N, TDM_F64, TDM_SUM));
  double loss = 0;
  for (int64_t r = 0; r < N; r++) {
    lse[r] = gmax[r] + logf((float)sums[2 * r]);
    if (target_of(&p, r) != s->ignore) loss += (double)(lse[r] - (float)sums[2 * r + 1]);
  }
  *(float *)tdm_tensor_data(y) = count ? (float)(loss / (double)count) : 0.0f;
  if (s->correct) *s->correct += correct;
  if (s->rows) *s->rows += (double)N;
  s->N = N, s->Vt = Vt, s->count = count, s->lse = lse;
  TDM__TRY(tdm_custom_save(ctx, logits));
  TDM__TRY(tdm_custom_save(ctx, targets));
  *out = y;
  return TDM_OK;
}

static void ce_grad(void *vc, int64_t r0, int64_t r1) {
  ce_pass *p = vc;
  for (int64_t r = r0; r < r1; r++) {
    int64_t t = target_of(p, r);
    if (t == p->ignore) continue;
    const float *x = p->x + r * p->Vt;
    float *d = p->d + r * p->Vt, l = p->lse[r];
    for (int64_t j = 0; j < p->Vt; j++) d[j] += p->scale * tdm__exp_neg(x[j] - l); /* x <= lse */
    t -= p->lo;
    if (t >= 0 && t < p->Vt) d[t] -= p->scale;
  }
}

static tdm_status ce_bwd(tdm_custom_ctx *ctx, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)n, (void)user;
  const ce_state *s = tdm_custom_state(ctx);
  if (!gin[0] || s->count == 0) return TDM_OK;
  tdm_tensor *logits = tdm_custom_saved(ctx, 0), *targets = tdm_custom_saved(ctx, 1);
  ce_pass p = {tdm_tensor_data(logits), tdm_tensor_data(targets), tdm_tensor_dtype(targets) == TDM_I64, s->Vt, s->lo,
               NULL, NULL, NULL, tdm_tensor_data(gin[0]), s->lse,
               *(const float *)tdm_tensor_data(gy) / (float)s->count, s->ignore};
  tdm_parallel_for(s->N, 1 + 65536 / s->Vt, ce_grad, &p);
  return TDM_OK;
}

static const tdm_custom_op ce_op = {"tp_cross_entropy", ce_fwd, ce_bwd, 1};

tdm_tensor *tdm__tp_cross_entropy(tdm_tape *tp, tdm__tp_comm *c, tdm_tensor *logits, tdm_tensor *targets, int64_t lo,
                                  int64_t V, int64_t ignore_index, double *correct, double *rows) {
  ce_state s = {c, lo, V, ignore_index, correct, rows, 0, 0, 0, NULL};
  logits = widened(tp, logits); /* 16-bit logits: the loss reads them as f32 (exact) */
  if (!logits) return NULL;
  tdm_tensor *in[2] = {logits, targets};
  return tdm_custom(tp, &ce_op, &s, 2, in);
}
