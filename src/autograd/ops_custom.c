/* Custom differentiable ops (tandem/autograd.h): a user's forward and backward callbacks behind
 * one tape node. The context lives in the arena, as every node's state does. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"

struct tdm_custom_ctx {
  tdm_tape *tp;
  const tdm_custom_op *op;
  void *user;
  tdm_tensor **saved;
  int n_saved, cap_saved;
  void *state;
};

static const char *op_name(const tdm_custom_op *op) { return op && op->name ? op->name : "custom"; }

tdm_status tdm_custom_save(tdm_custom_ctx *c, tdm_tensor *t) {
  if (!c || !t) return tdm__set_error(TDM_ERR_INVALID_ARG, "custom_save: NULL argument");
  if (c->n_saved == c->cap_saved) { /* arena arrays: the old one is left behind until the reset */
    int nc = c->cap_saved ? 2 * c->cap_saved : 4;
    tdm_tensor **a = tdm_arena_alloc(c->tp->arena, sizeof(tdm_tensor *) * (size_t)nc);
    if (!a) return tdm__set_error(TDM_ERR_NO_MEMORY, "op '%s': out of memory saving a tensor", op_name(c->op));
    if (c->n_saved) memcpy(a, c->saved, sizeof(tdm_tensor *) * (size_t)c->n_saved);
    c->saved = a;
    c->cap_saved = nc;
  }
  c->saved[c->n_saved++] = t;
  return TDM_OK;
}

int tdm_custom_num_saved(const tdm_custom_ctx *c) { return c ? c->n_saved : 0; }
tdm_tensor *tdm_custom_saved(const tdm_custom_ctx *c, int i) {
  return c && i >= 0 && i < c->n_saved ? c->saved[i] : NULL;
}
void *tdm_custom_alloc(tdm_custom_ctx *c, size_t bytes) { return c ? tdm_arena_alloc(c->tp->arena, bytes) : NULL; }
tdm_tape *tdm_custom_tape(const tdm_custom_ctx *c) { return c ? c->tp : NULL; }
void tdm_custom_set_state(tdm_custom_ctx *c, void *state) {
  if (c) c->state = state;
}
void *tdm_custom_state(const tdm_custom_ctx *c) { return c ? c->state : NULL; }

tdm_status tdm_custom_fail(tdm_custom_ctx *c, tdm_status st, const char *fmt, ...) {
  (void)c;
  if (!fmt) return tdm__set_error(st == TDM_OK ? TDM_ERR_INTERNAL : st, "tdm_custom_fail: fmt is NULL");
  char msg[480];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tdm__set_error(st == TDM_OK ? TDM_ERR_INTERNAL : st, "%s", msg);
}

/* A new header over x's data: what an identity forward returns, so that the node's output is not
 * one of its inputs. */
static void custom_bw(tdm_tape *tp, tdm_node *nd) {
  tdm_custom_ctx *c = nd->saved[0];
  int n = nd->n_in;
  tdm_tensor **gin = tdm__scratch(tp, sizeof(tdm_tensor *) * (size_t)(n ? n : 1));
  unsigned char *add = tdm__scratch(tp, (size_t)(n ? n : 1));
  if (!gin || !add) return;
  for (int i = 0; i < n; i++) {
    tdm_tensor *in = nd->in[i];
    gin[i] = NULL;
    add[i] = 0;
    if (!tdm__requires_grad(in)) continue;
    if (c->op->accumulate) { /* the input's own gradient, summed into */
      if (!tdm__grad(tp, in)) return;
      gin[i] = in->grad;
      continue;
    }
    int fresh;
    float *g = tdm__grad_for_write(tp, in, &fresh);
    if (!g) return;
    if (fresh) { /* the input's first gradient: the callback writes it in place */
      tdm_k_zero(g, in->numel);
      gin[i] = in->grad;
    } else { /* summed into what other consumers gave */
      if (!(gin[i] = tdm__out(tp, TDM_F32, in->ndim, in->shape))) return;
      tdm_k_zero(gin[i]->data, gin[i]->numel);
      add[i] = 1;
    }
  }
  int was = tp->grad_enabled;
  tp->grad_enabled = 0;
  tdm_status st = c->op->backward(c, nd->out->grad, n, gin, c->user);
  tp->grad_enabled = was;
  if (tp->status != TDM_OK) return;
  if (st != TDM_OK) {
    tdm__fail(tp, st, "op '%s' backward: %s", op_name(c->op), tdm_last_error());
    return;
  }
  for (int i = 0; i < n; i++) {
    if (!add[i]) continue;
    float *g = tdm__grad(tp, nd->in[i]);
    const float *d = gin[i]->data;
    if (!g) return;
    for (int64_t k = 0; k < gin[i]->numel; k++) g[k] += d[k];
  }
}

tdm_tensor *tdm_custom(tdm_tape *tp, const tdm_custom_op *op, void *user, int n, tdm_tensor *const *inputs) {
  TDM__NONNULL(tp, NULL, "tdm_custom: the tape is NULL");
  if (tp->status != TDM_OK) return NULL;
  const char *name = op_name(op);
  if (!op || !op->forward || n < 0 || (n > 0 && !inputs))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "op '%s': %s", name,
                     !op || !op->forward ? "no forward callback" : "n < 0, or inputs is NULL");
  if (!tdm__inputs_ok(tp, name, n, inputs)) return NULL;
  tdm_tensor **ins = tdm__scratch(tp, sizeof(tdm_tensor *) * (size_t)(n ? n : 1));
  tdm_custom_ctx *c = tdm__scratch(tp, sizeof *c);
  if (!ins || !c) return NULL;
  int any = 0;
  for (int i = 0; i < n; i++) {
    if (!(ins[i] = tdm__contig(tp, inputs[i]))) return NULL; /* a recorded copy when a view */
    any |= tdm__requires_grad(ins[i]);
  }
  int record = tp->grad_enabled && any;
  if (record && !op->backward)
    return tdm__fail(tp, TDM_ERR_INVALID_USAGE, "op '%s' has no backward, but an input requires a gradient", name);
  *c = (tdm_custom_ctx){tp, op, user, NULL, 0, 0, NULL};
  tdm_tensor *out = NULL;
  int was = tp->grad_enabled;
  tp->grad_enabled = 0; /* what forward does inside is not recorded: this node stands for it */
  tdm_status st = op->forward(c, tp, n, ins, user, &out);
  tp->grad_enabled = was;
  if (tp->status != TDM_OK) return NULL; /* an op inside failed: its error is the tape's */
  if (st != TDM_OK) return tdm__fail(tp, st, "op '%s': %s", name, tdm_last_error());
  if (!out) return tdm__fail(tp, TDM_ERR_INVALID_USAGE, "op '%s': forward returned TDM_OK but no output", name);
  int reuse = out->node || (out->flags & (TDM_TF_REQUIRES_GRAD | TDM_TF_PARAM | TDM_TF_HEAP));
  for (int i = 0; i < n; i++) reuse |= out == ins[i] || out == inputs[i];
  if (reuse && !(out = tdm__alias_header(tp, out))) return NULL;
  if (!record) return out;
  if (out->dtype != TDM_F32)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "op '%s': output %s has dtype %s; a differentiable output must be f32", name,
                     tdm__shp(out), tdm_dtype_name(out->dtype));
  tdm_node *nd = tdm__record(tp, name, custom_bw, out, n, ins);
  if (!nd) return NULL;
  nd->saved[0] = c;
  return out;
}
