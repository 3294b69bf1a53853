/* The output head of a language model (tdm_lm_head): a product with a large table (the vocabulary
 * by the width), TDM_HEAD_ROWS rows at a time.
 *
 * Why blocks: under ZeRO stage 3 a rank gathers the parameters it reads just before it reads them.
 * GPT-2's table is 38.6 M floats (147 MiB), a third of the model, and read whole it is also gathered
 * whole; its gradient, tied to the embedding's, would be held from the head's backward to the
 * embedding's, the whole of backward. Read a block of rows at a time (the fetch hook's range), a
 * rank holds one block; and when the table is tied, the head's part of its gradient is computed
 * by the embedding's backward, block by block just before the embedding's rows (one process adds
 * the head's part first too: the same bits), so each block's gradient is final, reduced and given
 * back at once.
 *
 * The blocks are the model's, not the engine's: every layout computes x's gradient as the same
 * sum of per-block products, so ZeRO stage 3 keeps stage 0's bits. (A product split along its
 * inner dimension sums differently from one call; splitting only the output's rows would need the
 * whole table for x's gradient.) A table of at most TDM_HEAD_ROWS rows is one block. */
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

static void round_to(float *dst, const float *src, int64_t n, tdm_dtype ac) {
  if (ac == TDM_BF16) tdm_k_round_bf16(dst, src, n);
  else tdm_k_round_f16(dst, src, n);
}

/* The gradient of block [r0, r1) of the logits (N rows of V) as f32: in place for f32 (row stride
 * V), else converted into buf (row stride r1 - r0). */
static const float *dout_block(const tdm_tensor *g, int64_t N, int64_t V, int64_t r0, int64_t r1, float *buf, int64_t *ld) {
  if (g->dtype == TDM_F32) {
    *ld = V;
    return (const float *)g->data + r0;
  }
  int64_t R = r1 - r0;
  for (int64_t n = 0; n < N; n++) tdm__f32_part(g->data, g->dtype, n * V + r0, R, buf + n * R);
  *ld = R;
  return buf;
}

/* dw[r0, r1) += dlogits[:, r0:r1]^T x (x rounded as the forward's product read it), block by block. */
void tdm__head_dw_rows(tdm_tape *tp, tdm_node *head, float *dw, int64_t r0, int64_t r1) {
  tdm_tensor *x = head->in[0], *w = head->in[1];
  int64_t C = w->shape[1], V = w->shape[0], N = x->numel / C;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32_round(tp, x, (tdm_dtype)head->i[0]);
  int64_t most = r1 - r0 < TDM_HEAD_ROWS ? r1 - r0 : TDM_HEAD_ROWS;
  float *buf = xf && head->out->grad->dtype != TDM_F32 ? tdm__scratch(tp, sizeof(float) * (size_t)(N * most)) : NULL;
  for (int64_t b0 = r0; xf && b0 < r1 && (buf || head->out->grad->dtype == TDM_F32); b0 += TDM_HEAD_ROWS) {
    int64_t b1 = b0 + TDM_HEAD_ROWS < r1 ? b0 + TDM_HEAD_ROWS : r1, ld;
    const float *d = dout_block(head->out->grad, N, V, b0, b1, buf, &ld);
    tdm_k_gemm(1, 0, b1 - b0, C, N, 1.0f, d, ld, xf, C, 1.0f, dw + b0 * C, C);
  }
  tdm__arena_rewind(tp->arena, pos);
}

/* The rows of the table a forward panel rounds at once, and the floats a backward panel holds, for
 * blocks of at most R0 rows. */
static int64_t fwd_rows(int64_t C, int64_t R0) {
  int64_t rows = TDM_LP_PANEL / C > 0 ? TDM_LP_PANEL / C : 1;
  return rows < R0 ? rows : R0;
}
static int64_t bwd_floats(int64_t C, int64_t R0) { return TDM_LP_PANEL < C * R0 ? TDM_LP_PANEL : C * R0; }

/* y[:, r0:r1] (row stride V) = x w[r0:r1]^T, w rounded to ac (f32: none) in panels of rows
 * through wp (fwd_rows rows). */
static void fwd_block(float *y, const float *x, const float *w, int64_t N, int64_t C, int64_t V, int64_t r0, int64_t r1,
                      tdm_dtype ac, float *wp, int64_t rows) {
  if (ac == TDM_F32) {
    tdm_k_gemm(0, 1, N, r1 - r0, C, 1.0f, x, C, w + r0 * C, C, 0.0f, y + r0, V);
    return;
  }
  for (int64_t o0 = r0; o0 < r1; o0 += rows) {
    int64_t r = r1 - o0 < rows ? r1 - o0 : rows;
    round_to(wp, w + o0 * C, r * C, ac);
    tdm_k_gemm(0, 1, N, r, C, 1.0f, x, C, wp, C, 0.0f, y + o0, V);
  }
}

/* dx (N, C) (+)= d (N, R; row stride ld) w[r0:r1], w rounded to ac in panels of input columns
 * through wp (bwd_floats). */
static void dx_block(float *dx, const float *d, int64_t ld, const float *w, int64_t N, int64_t C, int64_t r0, int64_t r1,
                     tdm_dtype ac, float beta, float *wp) {
  int64_t R = r1 - r0;
  if (ac == TDM_F32) {
    tdm_k_gemm(0, 0, N, C, R, 1.0f, d, ld, w + r0 * C, C, beta, dx, C);
    return;
  }
  int64_t cols = TDM_LP_PANEL / R > 0 ? TDM_LP_PANEL / R : 1;
  if (cols > C) cols = C;
  for (int64_t i0 = 0; i0 < C; i0 += cols) {
    int64_t c = C - i0 < cols ? C - i0 : cols;
    for (int64_t o = 0; o < R; o++) memcpy(wp + o * c, w + (r0 + o) * C + i0, sizeof(float) * (size_t)c);
    round_to(wp, wp, R * c, ac);
    tdm_k_gemm(0, 0, N, c, R, 1.0f, d, ld, wp, c, beta, dx + i0, C);
  }
}

/* i[0]: the autocast dtype; i[1]: 1 + the tape index of the tied embedding's node (0: untied);
 * i[2]: this node's index. The blocks in descending order when the table is the head's own and
 * trained (each block's weight gradient is final at once, and ZeRO prefetches that way in
 * backward), else ascending (tied: the embedding adds the table's gradient; a pipeline's last
 * stage reads a tied table through a detached view, which must sum x's gradient as one process
 * does). The order depends on the model alone, never on the pass (zero-bubble's split backward
 * runs the same blocks in the same order in both of its passes). */
static void lm_head_bw(tdm_tape *tp, tdm_node *n) {
  tdm_tensor *x = n->in[0], *w = n->in[1];
  int64_t C = w->shape[1], V = w->shape[0], N = x->numel / C;
  tdm_dtype ac = (tdm_dtype)n->i[0];
  int fresh;
  void *dx = tdm__grad_for_write(tp, x, &fresh);
  float *dw = tdm__grad(tp, w);
  if (n->i[1] && dw) { /* tied: the embedding's backward adds it (tdm__head_dw_rows) */
    tp->nodes[n->i[1] - 1]->saved[1] = n;
    dw = NULL;
  }
  if (!dx && !dw) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  float *dxf = dx ? tdm__grad_f32(tp, x, dx, fresh) : NULL;
  const float *xf = dw ? tdm__f32_round(tp, x, ac) : NULL;
  int int16 = n->out->grad->dtype != TDM_F32;
  int64_t R0 = V < TDM_HEAD_ROWS ? V : TDM_HEAD_ROWS;
  float *buf = int16 ? tdm__scratch(tp, sizeof(float) * (size_t)(N * R0)) : NULL;
  float *wp = dxf && ac != TDM_F32 ? tdm__scratch(tp, sizeof(float) * (size_t)bwd_floats(C, R0)) : NULL;
  int ok = (!dx || dxf) && (!dw || xf) && (!int16 || buf) && (!dxf || ac == TDM_F32 || wp), last = tdm__first_reader(tp, w, (int)n->i[2]);
  int64_t nb = (V + TDM_HEAD_ROWS - 1) / TDM_HEAD_ROWS;
  int desc = !n->i[1] && tdm__requires_grad(w);
  for (int64_t k = 0; ok && k < nb; k++) {
    int64_t b = desc ? nb - 1 - k : k, r0 = b * TDM_HEAD_ROWS, r1 = r0 + TDM_HEAD_ROWS < V ? r0 + TDM_HEAD_ROWS : V, ld;
    if (tdm__fetch_rows(tp, "lm_head", w, r0, r1, dw != NULL) != TDM_OK) break;
    const float *d = dout_block(n->out->grad, N, V, r0, r1, buf, &ld);
    if (dxf) dx_block(dxf, d, ld, w->data, N, C, r0, r1, ac, k == 0 && fresh ? 0.0f : 1.0f, wp);
    if (dw) {
      tdm_k_gemm(1, 0, r1 - r0, C, N, 1.0f, d, ld, xf, C, 1.0f, dw + r0 * C, C);
      if (last) tdm__grad_rows_final(tp, w, r0, r1);
    }
  }
  if (ok && dxf && tp->status == TDM_OK) tdm__grad_commit(x, dx, dxf);
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_lm_head(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w) {
  tdm_tensor *in[1] = {x};
  if (!tdm__inputs_ok(tp, "lm_head", 1, in)) return NULL; /* the table is fetched a block at a time */
  if (!w) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "lm_head: the weight is NULL");
  if (!tdm__check_act(tp, "lm_head", "input", x) || !tdm__check_f32(tp, "lm_head", "weight", w)) return NULL;
  if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1] || !tdm_tensor_is_contiguous(w))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "lm_head: input %s and weight %s; expected input (..., %lld) for a contiguous "
                     "weight (vocab, width)", tdm__shp(x), tdm__shp(w), (long long)(w->ndim == 2 ? w->shape[1] : -1));
  x = tdm__contig(tp, x);
  if (!x) return NULL;
  int64_t shape[TDM_MAX_DIMS], C = w->shape[1], V = w->shape[0], N = x->numel / (C ? C : 1);
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = V;
  tdm_dtype ac = tdm__act_dtype(tp);
  tdm_tensor *y = tdm__out(tp, ac, x->ndim, shape);
  if (!y) return NULL;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  const float *xf = tdm__f32_round(tp, x, ac);
  float *yf = xf ? tdm__f32_out(tp, y) : NULL;
  int64_t rows = fwd_rows(C, V < TDM_HEAD_ROWS ? V : TDM_HEAD_ROWS);
  float *wp = yf && ac != TDM_F32 ? tdm__scratch(tp, sizeof(float) * (size_t)(rows * C)) : NULL;
  if (ac != TDM_F32 && !wp) yf = NULL;
  for (int64_t r0 = 0; yf && r0 < V; r0 += TDM_HEAD_ROWS) {
    int64_t r1 = r0 + TDM_HEAD_ROWS < V ? r0 + TDM_HEAD_ROWS : V;
    if (tdm__fetch_rows(tp, "lm_head", w, r0, r1, tp->in_backward) != TDM_OK) yf = NULL;
    else fwd_block(yf, xf, w->data, N, C, V, r0, r1, ac, wp, rows);
  }
  if (yf) tdm__store_f32(y, yf);
  tdm__arena_rewind(tp->arena, pos);
  if (!yf) return NULL;
  int tied = 0; /* the embedding that reads this table, earlier on the tape */
  for (int k = tp->n_nodes - 1; k >= 0 && !tied && tdm__requires_grad(w); k--)
    if (!strcmp(tp->nodes[k]->op, "embedding") && tp->nodes[k]->in[0] == w) tied = k + 1;
  tdm_tensor *ins[2] = {x, w};
  int64_t index = tp->n_nodes;
  tdm_node *n = tdm__record(tp, "lm_head", lm_head_bw, y, 2, ins);
  if (n) n->i[0] = ac, n->i[1] = tied, n->i[2] = index, n->self_fetch = 1;
  return y;
}
