/* The Llama family's ops: RMSNorm, rotary position embeddings, the SwiGLU gate and grouped-query
 * attention. Each checks its inputs, runs its f32 kernel (src/tensor/kernels_llama.c,
 * kernels_attention.c) and records a node whose backward runs the backward kernel. Activations may
 * be f32, bf16 or f16 (mixed precision: see tdm_tape_set_autocast); the f32 copies a 16-bit op
 * needs are scratch, given back before the op returns. */
#include <math.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

/* ---- RMSNorm -------------------------------------------------------------------------------- */
/* saved[0]: rstd (N) */
static void rmsnorm_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0], *w = n->in[1];
  int64_t C = w->shape[0], N = x->numel / C;
  void *gx = tdm__grad(tp, x);
  float *gw = tdm__grad(tp, w);
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *gxf = tdm__grad_f32(tp, x, gx, 0);
  const float *xf = tdm__f32(tp, x), *dy = tdm__f32(tp, n->out->grad);
  if (xf && dy && (gxf || !gx)) {
    tdm_k_rmsnorm_bwd(gxf, gw, dy, xf, w->data, n->saved[0], N, C);
    tdm__grad_commit(x, gx, gxf);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_rmsnorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, float eps) {
  tdm_tensor *in[2] = {x, w};
  if (!tdm__inputs_ok(tp, "rmsnorm", 2, in) || !tdm__check_act(tp, "rmsnorm", "input", x) ||
      !tdm__check_f32(tp, "rmsnorm", "weight", w))
    return NULL;
  int64_t C = x->ndim ? x->shape[x->ndim - 1] : 0;
  if (x->ndim < 1 || C == 0 || w->ndim != 1 || w->shape[0] != C)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "rmsnorm: input %s, weight %s; expected (..., C) and (C) with C > 0",
                     tdm__shp(x), tdm__shp(w));
  if (!(eps >= 0)) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "rmsnorm: eps %g; expected >= 0", (double)eps);
  x = tdm__contig(tp, x);
  int64_t N = x ? x->numel / C : 0;
  tdm_tensor *y = x ? tdm__out(tp, tdm__act_dtype(tp), x->ndim, x->shape) : NULL;
  float *rstd = y ? tdm__scratch(tp, sizeof(float) * (size_t)(N ? N : 1)) : NULL;
  if (!rstd) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32(tp, x);
  float *yf = xf ? tdm__f32_out(tp, y) : NULL;
  if (yf) {
    tdm_k_rmsnorm_fwd(yf, rstd, xf, w->data, N, C, eps);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_tensor *ins[2] = {x, w};
  tdm_node *n = tdm__record(tp, "rmsnorm", rmsnorm_bw, y, 2, ins);
  if (n) n->saved[0] = rstd;
  return y;
}

/* ---- rotary position embeddings ------------------------------------------------------------- */
/* i: [0] B, [1] T, [2] H, [3] hs; saved[0]: cos (T, hs/2), saved[1]: sin */
static void rope_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0];
  int fresh;
  void *gx = tdm__grad_for_write(tp, x, &fresh);
  if (!gx) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *gxf = tdm__grad_f32(tp, x, gx, fresh);
  const float *dy = tdm__f32(tp, n->out->grad);
  if (gxf && dy) {
    tdm_k_rope_bwd(gxf, dy, n->saved[0], n->saved[1], n->i[0], n->i[1], n->i[2], n->i[3], !fresh);
    tdm__grad_commit(x, gx, gxf);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_rope(tdm_tape *tp, tdm_tensor *x, int n_head, const tdm_rope_config *rc, int64_t pos0) {
  if (!tdm__inputs_ok(tp, "rope", 1, &x) || !tdm__check_act(tp, "rope", "input", x)) return NULL;
  if (!rc || !(rc->theta > 1.0f) || (rc->factor != 0 && !(rc->factor >= 1.0f && rc->high_freq_factor > rc->low_freq_factor &&
                                                         rc->low_freq_factor > 0 && rc->original_max_pos > 0)))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "rope: theta %g, scaling factor %g (low %g, high %g, original context %lld); expected theta > 1 and no scaling (factor 0) or factor >= 1, 0 < low < high, context > 0",
                     rc ? (double)rc->theta : 0.0, rc ? (double)rc->factor : 0.0, rc ? (double)rc->low_freq_factor : 0.0,
                     rc ? (double)rc->high_freq_factor : 0.0, rc ? (long long)rc->original_max_pos : 0LL);
  if (x->ndim != 3 || n_head <= 0 || x->shape[2] % n_head)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "rope: input %s with %d heads; expected (B, T, heads x head size)", tdm__shp(x),
                     n_head);
  int64_t B = x->shape[0], T = x->shape[1], hs = x->shape[2] / n_head;
  if (hs % 2)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "rope: head size %lld (width %lld / %d heads) is odd; rotary embeddings pair the two halves of a head",
                     (long long)hs, (long long)x->shape[2], n_head);
  if (pos0 < 0 || pos0 > ((int64_t)1 << 40) - T) /* (pos0 + t must not wrap; a float position loses its integers long before) */
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "rope: first position %lld for %lld positions; expected 0 .. 2^40 - T", (long long)pos0, (long long)T);
  x = tdm__contig(tp, x);
  tdm_tensor *y = x ? tdm__out(tp, tdm__act_dtype(tp), 3, x->shape) : NULL;
  int64_t half = hs / 2;
  float *cs = y ? tdm__scratch(tp, sizeof(float) * (size_t)(2 * T * half + 1)) : NULL;
  if (!cs) return NULL;
  tdm_k_rope_table(cs, cs + T * half, pos0, T, hs, rc);
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32(tp, x);
  float *yf = xf ? tdm__f32_out(tp, y) : NULL;
  if (yf) {
    tdm_k_rope_fwd(yf, xf, cs, cs + T * half, B, T, n_head, hs);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_node *n = tdm__record(tp, "rope", rope_bw, y, 1, &x);
  if (n) {
    int64_t v[4] = {B, T, n_head, hs};
    memcpy(n->i, v, sizeof v);
    n->saved[0] = cs;
    n->saved[1] = cs + T * half;
  }
  return y;
}

/* ---- SwiGLU ----------------------------------------------------------------------------------- */
static void swiglu_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *g = n->in[0], *u = n->in[1];
  int fg, fu;
  void *gg = tdm__grad_for_write(tp, g, &fg), *gu = tdm__grad_for_write(tp, u, &fu);
  if (!gg && !gu) return;
  /* element-wise: under autocast a piece at a time (TDM_LP_PIECE elements in five f32 buffers),
   * so the scratch is 1.25 MiB whatever the width (the whole tensors' f32 copies were the peak of
   * a Llama step's memory); the same arithmetic element by element, so the same bits */
  const tdm_tensor *dyt = n->out->grad;
  tdm_dtype dg = gg ? g->grad->dtype : TDM_F32, du = gu ? u->grad->dtype : TDM_F32;
  int all32 = g->dtype == TDM_F32 && u->dtype == TDM_F32 && dyt->dtype == TDM_F32 && dg == TDM_F32 && du == TDM_F32;
  int64_t total = g->numel, piece = all32 || total < TDM_LP_PIECE ? total : TDM_LP_PIECE;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *buf = all32 ? NULL : tdm__scratch(tp, sizeof(float) * (size_t)(5 * (piece ? piece : 1)));
  if (!all32 && !buf) return; /* the tape's error is set */
  for (int64_t i0 = 0; i0 < total; i0 += piece) {
    int64_t m = total - i0 < piece ? total - i0 : piece;
    float *b = buf;
    const float *gf = tdm__f32_part(g->data, g->dtype, i0, m, b), *uf = tdm__f32_part(u->data, u->dtype, i0, m, b ? b + piece : b);
    const float *dy = tdm__f32_part(dyt->data, dyt->dtype, i0, m, b ? b + 2 * piece : b);
    float *ggf = tdm__grad_f32_part(gg, dg, i0, m, fg, b ? b + 3 * piece : b);
    float *guf = tdm__grad_f32_part(gu, du, i0, m, fu, b ? b + 4 * piece : b);
    tdm_k_swiglu_bwd(ggf, guf, dy, gf, uf, m, !fg, !fu);
    tdm__grad_commit_part(gg, dg, i0, m, ggf);
    tdm__grad_commit_part(gu, du, i0, m, guf);
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_swiglu(tdm_tape *tp, tdm_tensor *gate, tdm_tensor *up) {
  tdm_tensor *in[2] = {gate, up};
  if (!tdm__inputs_ok(tp, "swiglu", 2, in) || !tdm__check_act(tp, "swiglu", "gate", gate) ||
      !tdm__check_act(tp, "swiglu", "up", up))
    return NULL;
  if (!tdm__shape_equal(gate, up))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "swiglu: gate %s and up %s; expected one shape", tdm__shp(gate), tdm__shp(up));
  gate = tdm__contig(tp, gate);
  up = tdm__contig(tp, up);
  tdm_tensor *y = gate && up ? tdm__out(tp, tdm__act_dtype(tp), gate->ndim, gate->shape) : NULL;
  if (!y) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *gf = tdm__f32(tp, gate), *uf = tdm__f32(tp, up);
  float *yf = gf && uf ? tdm__f32_out(tp, y) : NULL;
  if (yf) {
    tdm_k_swiglu_fwd(yf, gf, uf, y->numel);
    tdm__store_f32(y, yf);
  }
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  tdm_tensor *ins[2] = {gate, up};
  tdm__record(tp, "swiglu", swiglu_bw, y, 2, ins);
  return y;
}

/* ---- grouped-query attention ---------------------------------------------------------------- */
/* i: [0] B, [1] T, [2] NH, [3] NKV, [4] hs, [5] the activation dtype; saved[0]: the probabilities
 * (B, NH, T, T) in it, or NULL under selective recomputation. Batches go through the kernels a
 * chunk at a time (tdm__attn_batches), so scratch holds one chunk's probabilities. */
static void gqa_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
  int64_t B = n->i[0], T = n->i[1], NH = n->i[2], NKV = n->i[3], hs = n->i[4], HTT = NH * T * T;
  int64_t bc = tdm__attn_batches(B, NKV), QW = NH * hs, KW = NKV * hs;
  tdm_dtype dt = (tdm_dtype)n->i[5];
  int fq, fk, fv;
  void *gq = tdm__grad_for_write(tp, q, &fq), *gk = tdm__grad_for_write(tp, k, &fk), *gv = tdm__grad_for_write(tp, v, &fv);
  if (!gq && !gk && !gv) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  /* the kernel writes every element of dq, dk and dv once (beta 0) or adds (beta 1): one mode for
   * all three, so a gradient that is not fresh makes all three accumulate from zeros or values */
  int acc = !(fq && fk && fv);
  float *gqf = gq ? tdm__grad_f32(tp, q, gq, fq && !acc) : tdm__scratch(tp, sizeof(float) * (size_t)q->numel);
  float *gkf = gk ? tdm__grad_f32(tp, k, gk, fk && !acc) : tdm__scratch(tp, sizeof(float) * (size_t)k->numel);
  float *gvf = gv ? tdm__grad_f32(tp, v, gv, fv && !acc) : tdm__scratch(tp, sizeof(float) * (size_t)v->numel);
  if (acc && gqf && gkf && gvf) { /* a fresh one among them holds garbage: zero it, then everything accumulates */
    if (!gq || fq) memset(gqf, 0, sizeof(float) * (size_t)q->numel);
    if (!gk || fk) memset(gkf, 0, sizeof(float) * (size_t)k->numel);
    if (!gv || fv) memset(gvf, 0, sizeof(float) * (size_t)v->numel);
  }
  const float *qf = tdm__f32(tp, q), *kf = tdm__f32(tp, k), *vf = tdm__f32(tp, v), *dy = tdm__f32(tp, n->out->grad);
  float *scratch = tdm__scratch(tp, sizeof(float) * (size_t)(bc * HTT > 0 ? bc * HTT : 1));
  float *buf = n->saved[0] && dt == TDM_F32 ? NULL : tdm__scratch(tp, sizeof(float) * (size_t)(bc * HTT > 0 ? bc * HTT : 1));
  int ok = gqf && gkf && gvf && qf && kf && vf && dy && scratch && (buf || (n->saved[0] && dt == TDM_F32));
  for (int64_t b0 = 0; ok && b0 < B; b0 += bc) {
    int64_t nb = B - b0 < bc ? B - b0 : bc, oq = b0 * T * QW, ok_ = b0 * T * KW;
    const float *att = tdm__probs_chunk(buf, n->saved[0], dt, b0 * HTT, nb * HTT, qf + oq, kf + ok_, nb, T, NH, NKV, hs, QW, KW);
    tdm_k_attention_gqa_bwd(gqf + oq, gkf + ok_, gvf + ok_, scratch, dy + oq, att, qf + oq, kf + ok_, vf + ok_, nb, T, NH, NKV,
                            hs, acc);
  }
  if (ok) {
    tdm__grad_commit(q, gq, gqf);
    tdm__grad_commit(k, gk, gkf);
    tdm__grad_commit(v, gv, gvf);
  } else if (tp->status == TDM_OK) {
    tdm__fail(tp, TDM_ERR_INTERNAL, "attention_gqa: backward lost its inputs");
  }
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_attention_gqa(tdm_tape *tp, tdm_tensor *q, tdm_tensor *k, tdm_tensor *v, int n_head, int n_kv_head) {
  tdm_tensor *in[3] = {q, k, v};
  if (!tdm__inputs_ok(tp, "attention_gqa", 3, in)) return NULL;
  for (int i = 0; i < 3; i++)
    if (!tdm__check_act(tp, "attention_gqa", i == 0 ? "q" : i == 1 ? "k" : "v", in[i])) return NULL;
  if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "attention_gqa: %d key/value heads do not divide %d query heads", n_kv_head,
                     n_head);
  if (q->ndim != 3 || k->ndim != 3 || !tdm__shape_equal(k, v) || q->shape[2] % n_head || k->shape[0] != q->shape[0] ||
      k->shape[1] != q->shape[1] || k->shape[2] * n_head != q->shape[2] * n_kv_head)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "attention_gqa: q %s, k %s, v %s with %d and %d heads; expected (B, T, %d x hs), and (B, T, %d x hs) twice",
                     tdm__shp(q), tdm__shp(k), tdm__shp(v), n_head, n_kv_head, n_head, n_kv_head);
  int64_t B = q->shape[0], T = q->shape[1], hs = q->shape[2] / n_head, HTT = n_head * T * T, PT = B * HTT;
  int64_t bc = tdm__attn_batches(B, n_kv_head), QW = n_head * hs, KW = n_kv_head * hs;
  q = tdm__contig(tp, q);
  k = tdm__contig(tp, k);
  v = tdm__contig(tp, v);
  tdm_dtype dt = tdm__act_dtype(tp);
  tdm_tensor *y = q && k && v ? tdm__out(tp, dt, 3, q->shape) : NULL;
  tdm_tensor *qkv[3] = {q, k, v};
  int keep = !tdm__selective(tp, 3, qkv); /* selective recomputation rebuilds them in backward */
  void *att = y && keep ? tdm__scratch(tp, tdm_dtype_size(dt) * (size_t)(PT ? PT : 1)) : NULL;
  if (!y || (keep && !att)) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *qf = tdm__f32(tp, q), *kf = tdm__f32(tp, k), *vf = tdm__f32(tp, v);
  float *yf = qf && kf && vf ? tdm__f32_out(tp, y) : NULL;
  float *buf = yf && (dt != TDM_F32 || !keep) ? tdm__scratch(tp, sizeof(float) * (size_t)(bc * HTT > 0 ? bc * HTT : 1)) : NULL;
  int ok = yf && (buf || (dt == TDM_F32 && keep));
  for (int64_t b0 = 0; ok && b0 < B; b0 += bc) {
    int64_t nb = B - b0 < bc ? B - b0 : bc, oq = b0 * T * QW, ok_ = b0 * T * KW;
    float *attc = buf ? buf : (float *)att + b0 * HTT;
    tdm_k_attention_gqa_fwd(yf + oq, attc, qf + oq, kf + ok_, vf + ok_, nb, T, n_head, n_kv_head, hs);
    if (keep) tdm__store_probs(att, dt, b0 * HTT, attc, nb * HTT);
  }
  if (ok) tdm__store_f32(y, yf);
  tdm__arena_rewind(tp->arena, pos);
  if (!ok) return NULL;
  tdm_tensor *ins[3] = {q, k, v};
  tdm_node *n = tdm__record(tp, "attention_gqa", gqa_bw, y, 3, ins);
  if (n) {
    int64_t iv[6] = {B, T, n_head, n_kv_head, hs, dt};
    memcpy(n->i, iv, sizeof iv);
    n->saved[0] = att;
  }
  return y;
}

int tdm__selective(const tdm_tape *tp, int n, tdm_tensor *const *ins) {
  if (tp->recompute != TDM_RECOMPUTE_SELECTIVE || !tp->grad_enabled) return 0;
  for (int i = 0; i < n; i++)
    if (tdm__requires_grad(ins[i])) return 1;
  return 0;
}

int64_t tdm__attn_batches(int64_t B, int64_t groups) {
  int64_t bc = (8 + groups - 1) / groups; /* at least 8 tasks per kernel call, for the pool */
  return bc < B ? bc : (B > 0 ? B : 1);
}

void tdm__store_probs(void *att, tdm_dtype dt, int64_t off, const float *src, int64_t n) {
  if (dt == TDM_BF16) tdm_k_f32_to_bf16((uint16_t *)att + off, src, n);
  else if (dt == TDM_F16) tdm_k_f32_to_f16((uint16_t *)att + off, src, n);
  /* f32: the kernel wrote them in place */
}

const float *tdm__probs_chunk(float *buf, const void *saved, tdm_dtype dt, int64_t off, int64_t n, const float *q, const float *k,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t ldq, int64_t ldkv) {
  if (saved && dt == TDM_F32) return (const float *)saved + off;
  if (saved && dt == TDM_BF16) tdm_k_bf16_to_f32(buf, (const uint16_t *)saved + off, n);
  else if (saved) tdm_k_f16_to_f32(buf, (const uint16_t *)saved + off, n);
  else {
    tdm_k_attention_probs(buf, q, k, B, T, NH, NKV, hs, ldq, ldkv); /* the forward's own code: the same bits */
    if (dt == TDM_BF16) tdm_k_round_bf16(buf, buf, n); /* as stored in 16 bits and read back */
    else if (dt == TDM_F16) tdm_k_round_f16(buf, buf, n);
  }
  return buf;
}
