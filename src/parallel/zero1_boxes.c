/* ZeRO stage 1 beside tensor parallelism: cutting a rank's checkpoint boxes into the data ranks'
 * parts of its optimizer state.
 *
 * A tensor-parallel rank's state is a list of boxes of the whole model's parameters, each one
 * contiguous in the optimizer's state order (tdm_engine_piece.state_at). ZeRO stage 1 gives data
 * rank d the state positions [cut[d], cut[d + 1]); for its part to stay a list of boxes, the cuts
 * fall on a box's row boundary (a multiple of the elements after its first dimension of more than
 * one), which is what tdm__boxes_align picks, and tdm__boxes_window then keeps the boxes' parts
 * inside a window, each again a box. Megatron's distributed optimizer cuts its buffer anywhere and
 * writes checkpoints through a gather to one rank; rows keep ours written by every rank, in place. */
#include <string.h>

#include "parallel/engine_impl.h"

/* The box's first dimension of more than one element (or its last), and the elements of one step
 * along it. */
static int row_dim(const tdm_params *whole, const tdm_engine_piece *b, int64_t *unit, int64_t *numel) {
  int nd = tdm_tensor_ndim(tdm_params_get(whole, b->param)), q = 0;
  while (q + 1 < nd && b->count[q] == 1) q++;
  *unit = 1;
  for (int k = q + 1; k < nd; k++) *unit *= b->count[k];
  *numel = nd ? *unit * b->count[q] : 1;
  return q;
}

int64_t tdm__boxes_align(const tdm_params *whole, const tdm_engine_piece *b, int n, int64_t pos) {
  for (int k = 0; k < n; k++) {
    int64_t unit, numel;
    row_dim(whole, &b[k], &unit, &numel);
    int64_t r = pos - b[k].state_at;
    if (r <= 0 || r >= numel) continue; /* not inside this box (its ends are boundaries already) */
    int64_t down = r - r % unit;
    return b[k].state_at + (r - down <= down + unit - r ? down : down + unit);
  }
  return pos;
}

int tdm__boxes_window(const tdm_params *whole, tdm_engine_piece *b, int n, int64_t lo, int64_t hi) {
  int m = 0;
  for (int k = 0; k < n; k++) { /* each box gives at most one part: b[m] is written after b[k >= m] is read */
    int64_t unit, numel;
    int q = row_dim(whole, &b[k], &unit, &numel);
    int64_t a = lo - b[k].state_at, z = hi - b[k].state_at; /* the window in the box's elements */
    if (a < 0) a = 0;
    if (z > numel) z = numel;
    if (a >= z) continue;
    tdm_engine_piece *p = &b[m++];
    *p = b[k];
    p->data += a;
    p->state_at += a - lo;
    if (numel > 1) p->start[q] += a / unit, p->count[q] = (z - a) / unit; /* a and z are rows apart (aligned) */
  }
  return m;
}
