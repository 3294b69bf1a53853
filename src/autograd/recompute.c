/* Activation recomputation. tdm_checkpoint runs a function (a transformer block) with gradients
 * off, keeping only its input and output, and records one node over the input and the parameters
 * the function reads. Its backward runs the function again with gradients on, so that the nodes
 * it records go on the tape after the others, backpropagates through them, and gives all of it
 * back (an arena rewind). The dropout call counter is rewound for the second run, so every mask
 * is the one the first run drew: the gradients are bit for bit those of a run that kept
 * everything. */
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

static const char *recompute_names[] = {"none", "block", "selective"};
_Static_assert(sizeof recompute_names / sizeof recompute_names[0] == TDM_RECOMPUTE_COUNT, "one name per mode");

const char *tdm_recompute_name(tdm_recompute r) { return (unsigned)r < TDM_RECOMPUTE_COUNT ? recompute_names[r] : "?"; }

tdm_status tdm_tape_set_recompute(tdm_tape *tp, tdm_recompute r) {
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "tape_set_recompute: the tape is NULL");
  if ((unsigned)r >= TDM_RECOMPUTE_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tape_set_recompute: mode %d; expected none, block or selective", (int)r);
  tp->recompute = (int)r;
  return TDM_OK;
}

tdm_recompute tdm_tape_recompute(const tdm_tape *tp) {
  TDM__NONNULL(tp, TDM_RECOMPUTE_NONE, "tdm_tape_recompute: the tape is NULL");
  return (tdm_recompute)tp->recompute;
}

typedef struct {
  tdm_checkpoint_fn fn;
  const void *ctx;
} call;

/* Adds the gradient that reached the recomputed input (g, x's dtype) into x's (gx). */
static void add_into(tdm_tape *tp, tdm_tensor *x, void *gx, int fresh, const tdm_tensor *g) {
  size_t bytes = (size_t)x->numel * tdm_dtype_size(x->grad->dtype);
  if (fresh) {
    if (g) memcpy(gx, g->data, bytes);
    else memset(gx, 0, bytes);
    return;
  }
  if (!g) return;
  float *acc = tdm__grad_f32(tp, x, gx, 0);
  const float *add = tdm__f32(tp, g);
  if (!acc || !add) return;
  tdm_k_axpy(acc, 1.0f, add, x->numel);
  tdm__grad_commit(x, gx, acc);
}

/* i[0]: the dropout call counter where the first run started; saved[0]: the call */
static void checkpoint_bw(tdm_tape *tp, tdm_node *n) {
  /* A split backward (tdm_backward_inputs, then _params): the block's recomputed nodes are given
   * back at the end of this call, so the first pass computes all of the block's gradients, its
   * parameters' too, and the second has nothing left to do here. */
  if (tp->grad_phase == 2) return;
  int phase = tp->grad_phase;
  tdm_tensor *x = n->in[0], *y = n->out;
  const call *c = n->saved[0];
  int fresh = 0;
  void *gx = tdm__grad_for_write(tp, x, &fresh); /* x's gradient persists: taken before the mark */
  if (tp->status != TDM_OK) return;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  int n0 = tp->n_nodes, l0 = tp->n_leaves, ge = tp->grad_enabled;
  uint64_t calls = tp->dropout_calls;
  tdm_tensor *xs = tdm_detach(tp, x); /* a leaf on the same data: where the block's input gradient lands */
  if (xs) tdm_tensor_set_requires_grad(xs, tdm__requires_grad(x));
  tp->dropout_calls = (uint64_t)n->i[0];
  tp->grad_enabled = 1;
  tdm_tensor *y2 = xs ? c->fn(tp, xs, c->ctx) : NULL;
  tp->grad_enabled = ge;
  if (y2 && (!tdm__shape_equal(y2, y) || y2->dtype != y->dtype))
    tdm__fail(tp, TDM_ERR_INTERNAL, "checkpoint: the recomputed output is %s %s, the first run's %s %s", tdm__shp(y2),
              tdm_dtype_name(y2->dtype), tdm__shp(y), tdm_dtype_name(y->dtype));
  if (y2 && tp->status == TDM_OK && y2->node) {
    y2->grad = y->grad; /* the gradient that reached the first run's output */
    tp->grad_phase = 0;
    tdm__backward_nodes(tp, n0, tp->n_nodes);
    tp->grad_phase = phase;
  }
  if (gx && tp->status == TDM_OK) add_into(tp, x, gx, fresh, xs->grad);
  tp->n_nodes = n0;
  tp->n_leaves = l0;
  tp->dropout_calls = calls;
  tdm__arena_rewind(tp->arena, pos);
}

tdm_tensor *tdm_checkpoint(tdm_tape *tp, tdm_checkpoint_fn fn, const void *ctx, tdm_tensor *x, int n_params,
                           tdm_tensor *const *params) {
  if (!tdm__inputs_ok(tp, "checkpoint", 1, &x)) return NULL;
  if (!fn || n_params < 0 || (n_params && !params))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "checkpoint: no function, or %d parameters without their list", n_params);
  int any = tdm__requires_grad(x);
  for (int i = 0; i < n_params; i++) {
    if (!params[i]) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "checkpoint: parameter %d is NULL", i);
    any |= tdm__requires_grad(params[i]);
  }
  if (!tp->grad_enabled || !any) return fn(tp, x, ctx); /* nothing to differentiate: just run it */
  uint64_t calls0 = tp->dropout_calls;
  tdm_tensor *y = tdm__out(tp, x->dtype, x->ndim, x->shape);
  call *c = y ? tdm__scratch(tp, sizeof *c) : NULL;
  if (!c) return NULL;
  c->fn = fn, c->ctx = ctx;
  tdm__arena_pos pos = tdm__arena_mark(tp->arena);
  tp->grad_enabled = 0;
  tdm_tensor *y1 = fn(tp, x, ctx);
  tp->grad_enabled = 1;
  if (y1 && (!tdm__shape_equal(y1, x) || y1->dtype != x->dtype || !tdm_tensor_is_contiguous(y1)))
    tdm__fail(tp, TDM_ERR_INVALID_ARG, "checkpoint: the function made %s %s from %s %s; it must keep the input's shape and dtype",
              tdm__shp(y1), tdm_dtype_name(y1->dtype), tdm__shp(x), tdm_dtype_name(x->dtype));
  if (y1 && tp->status == TDM_OK) memcpy(y->data, y1->data, (size_t)y->numel * tdm_dtype_size(y->dtype));
  tdm__arena_rewind(tp->arena, pos);
  if (tp->status != TDM_OK) return NULL;
  tdm_tensor **ins = tdm__scratch(tp, sizeof(tdm_tensor *) * (size_t)(1 + n_params));
  if (!ins) return NULL;
  ins[0] = x;
  for (int i = 0; i < n_params; i++) ins[1 + i] = params[i];
  tdm_node *nd = tdm__record(tp, "checkpoint", checkpoint_bw, y, 1 + n_params, ins);
  if (nd) {
    nd->i[0] = (int64_t)calls0;
    nd->saved[0] = c;
  }
  return y;
}
