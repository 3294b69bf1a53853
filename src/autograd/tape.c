/* The tape: node recording, gradient buffers, backward and the per-leaf hooks. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "tandem/kernels.h"
#include "tandem/trace.h"

static atomic_uint_fast64_t epoch_counter = 1; /* unique per reset across every tape */

tdm_status tdm_tape_create(tdm_tape **out, size_t arena_bytes) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tape_create: out is NULL");
  tdm_tape *tp = tdm__calloc(1, sizeof *tp);
  if (!tp) return tdm__set_error(TDM_ERR_NO_MEMORY, "tape_create: out of memory");
  tdm_status st = tdm__arena_create_cat(&tp->arena, arena_bytes ? arena_bytes : (1u << 20), TDM_MEM_ACTIVATIONS);
  if (st != TDM_OK) {
    tdm__free(tp);
    return st;
  }
  tp->grad_enabled = 1;
  tp->epoch = atomic_fetch_add(&epoch_counter, 1);
  *out = tp;
  return TDM_OK;
}

void tdm_tape_destroy(tdm_tape *tp) {
  if (!tp) return;
  tdm_arena_destroy(tp->arena);
  tdm__free(tp->ws);
  tdm__free(tp->nodes);
  tdm__free(tp->leaves);
  tdm__free(tp);
}

void tdm_tape_reset(tdm_tape *tp) {
  TDM__NONNULL(tp, , "tdm_tape_reset: the tape is NULL");
  /* Arena leaves keep no pointer to an old gradient. Heap leaves are not touched: the caller may
   * have destroyed them since the step, and their gradients live on the heap anyway. */
  for (int i = 0; i < tp->n_leaves; i++)
    if (tp->leaves[i].in_arena) tp->leaves[i].t->grad = NULL;
  tdm_arena_reset(tp->arena);
  tp->n_nodes = 0;
  tp->n_leaves = 0;
  tp->n_sec = 0;
  tp->status = TDM_OK;
  tp->error[0] = 0;
  tp->dropout_calls = 0;
  tp->epoch = atomic_fetch_add(&epoch_counter, 1);
}

tdm_status tdm_tape_status(const tdm_tape *tp) {
  TDM__NONNULL(tp, TDM_ERR_INVALID_ARG, "tdm_tape_status: the tape is NULL");
  return tp->status;
}
const char *tdm_tape_error(const tdm_tape *tp) { return tp ? tp->error : "tdm_tape_error: the tape is NULL"; }
void tdm_tape_set_grad_enabled(tdm_tape *tp, int enabled) {
  TDM__NONNULL(tp, , "tdm_tape_set_grad_enabled: the tape is NULL");
  tp->grad_enabled = enabled != 0;
}
int tdm_tape_grad_enabled(const tdm_tape *tp) {
  TDM__NONNULL(tp, 0, "tdm_tape_grad_enabled: the tape is NULL");
  return tp->grad_enabled;
}
void tdm_tape_set_training(tdm_tape *tp, int training) {
  TDM__NONNULL(tp, , "tdm_tape_set_training: the tape is NULL");
  tp->training = training != 0;
}
void tdm_tape_set_dropout_key(tdm_tape *tp, uint64_t seed, int64_t sample_base) {
  TDM__NONNULL(tp, , "tdm_tape_set_dropout_key: the tape is NULL");
  tp->dropout_seed = seed;
  tp->sample_base = sample_base;
}
tdm_arena *tdm_tape_arena(tdm_tape *tp) {
  TDM__NONNULL(tp, NULL, "tdm_tape_arena: the tape is NULL");
  return tp->arena;
}
int tdm_tape_num_nodes(const tdm_tape *tp) {
  TDM__NONNULL(tp, 0, "tdm_tape_num_nodes: the tape is NULL");
  return tp->n_nodes;
}

tdm_tensor *tdm__fail(tdm_tape *tp, tdm_status st, const char *fmt, ...) {
  if (!tp) { /* no tape to record on (a module given a NULL one): the thread's error only */
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tdm__set_error(st, "%s", msg);
    return NULL;
  }
  if (tp->status == TDM_OK) { /* keep the first error: later ones are its consequences */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tp->error, sizeof tp->error, fmt, ap);
    va_end(ap);
    tp->status = st;
    tdm__set_error(st, "%s", tp->error);
  }
  return NULL;
}

tdm_tensor *tdm_tape_fail(tdm_tape *tp, tdm_status st, const char *fmt, ...) {
  TDM__NONNULL(tp, NULL, "tdm_tape_fail: the tape is NULL");
  if (!fmt) return tdm__fail(tp, st == TDM_OK ? TDM_ERR_INTERNAL : st, "tdm_tape_fail: fmt is NULL");
  char msg[480];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tdm__fail(tp, st == TDM_OK ? TDM_ERR_INTERNAL : st, "%s", msg);
}

const char *tdm__shp(const tdm_tensor *t) {
  static _Thread_local char bufs[4][96];
  static _Thread_local int k;
  char *b = bufs[k++ & 3];
  return tdm_shape_str(t->ndim, t->shape, b, 96);
}

/* Runs the fetch hooks of the parameters among ins (ZeRO stage 3 gathers them here). */
static tdm_status fetch_inputs(tdm_tape *tp, const char *op, int n, tdm_tensor *const *ins, int backward) {
  for (int i = 0; i < n; i++) {
    tdm_tensor *p = tdm__fetchable(ins[i]);
    if (!p) continue;
    tdm_status st = p->fetch(p->fetch_ctx, p, 0, p->numel, backward);
    if (st != TDM_OK) {
      tdm__fail(tp, st, "%s: fetching parameter '%s': %s", op, p->name ? p->name : "?", tdm_last_error());
      return st;
    }
  }
  return TDM_OK;
}

int tdm__inputs_ok(tdm_tape *tp, const char *op, int n, tdm_tensor *const *ins) {
  if (!tp) { /* no tape to record on: the thread's error is the only place left */
    tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the tape is NULL", op);
    return 0;
  }
  if (tp->status != TDM_OK) return 0;
  for (int i = 0; i < n; i++)
    if (!ins[i]) {
      tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: input %d is NULL", op, i);
      return 0;
    }
  return fetch_inputs(tp, op, n, ins, tp->in_backward) == TDM_OK;
}

int tdm__check_f32(tdm_tape *tp, const char *op, const char *what, const tdm_tensor *t) {
  if (t->dtype == TDM_F32) return 1;
  tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: %s %s has dtype %s; expected f32 (use tdm_cast)", op, what, tdm__shp(t),
            tdm_dtype_name(t->dtype));
  return 0;
}

int tdm__axis(tdm_tape *tp, const char *op, const tdm_tensor *x, int axis) {
  int a = axis < 0 ? axis + x->ndim : axis;
  if (a < 0 || a >= x->ndim) {
    tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: axis %d is out of range for a %d-d tensor %s", op, axis, x->ndim,
              tdm__shp(x));
    return -1;
  }
  return a;
}

void *tdm__scratch(tdm_tape *tp, size_t bytes) {
  void *p = tdm_arena_alloc(tp->arena, bytes);
  if (!p) tdm__fail(tp, TDM_ERR_NO_MEMORY, "tape: out of memory allocating %zu bytes", bytes);
  return p;
}

void *tdm__workspace(tdm_tape *tp, size_t bytes) {
  if (bytes > tp->ws_cap) {
    tdm__free(tp->ws);
    tp->ws_cap = 0;
    tdm_mem_category scope = tdm__mem_scope(TDM_MEM_WORKSPACE);
    tp->ws = tdm__aligned_alloc(bytes);
    tdm__mem_scope(scope);
    if (!tp->ws) {
      tdm__fail(tp, TDM_ERR_NO_MEMORY, "tape: out of memory allocating a %zu-byte workspace", bytes);
      return NULL;
    }
    tp->ws_cap = bytes;
  }
  return tp->ws;
}

tdm_tensor *tdm__alias_header(tdm_tape *tp, tdm_tensor *x) {
  tdm_tensor *v = tdm__scratch(tp, sizeof *v);
  if (!v) return NULL;
  *v = *x;
  v->grad = NULL;
  v->node = NULL;
  v->flags = 0;
  v->hook = NULL;
  v->hook_ctx = NULL;
  v->fetch = NULL;
  v->fetch_ctx = NULL;
  v->alias = x->alias ? x->alias : ((x->flags & TDM_TF_PARAM) ? x : NULL);
  v->tape_epoch = 0;
  v->name = NULL;
  return v;
}

tdm_tensor *tdm__out(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > TDM_MAX_DIMS)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "tensor: %d dimensions; expected 0..%d", ndim, TDM_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return tdm__fail(tp, TDM_ERR_INVALID_ARG, "tensor: dimension %d is %lld; expected >= 0", i,
                       (long long)shape[i]);
  int64_t n;
  char b[160];
  if (tdm__shape_numel(ndim, shape, tdm_dtype_size(dt), &n))
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "tensor: shape %s holds more than 2^63 bytes", tdm_shape_str(ndim, shape, b, sizeof b));
  tdm_tensor *t = tdm__scratch(tp, sizeof *t);
  if (!t) return NULL;
  tdm__tensor_init(t, dt, ndim, shape);
  t->data = tdm__scratch(tp, (size_t)t->numel * tdm_dtype_size(dt));
  return t->data ? t : NULL;
}

tdm_tensor *tdm_new(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape) {
  TDM__NONNULL(tp, NULL, "tensor: the tape is NULL");
  if (tp->status != TDM_OK) return NULL;
  if ((unsigned)dt >= TDM_DTYPE_COUNT) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "tensor: dtype %d is unknown", dt);
  if (ndim > 0 && !shape) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "tensor: the shape is NULL for %d dimensions", ndim);
  return tdm__out(tp, dt, ndim, shape);
}

tdm_tensor *tdm_zeros(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape) {
  tdm_tensor *t = tdm_new(tp, dt, ndim, shape);
  if (t) memset(t->data, 0, (size_t)t->numel * tdm_dtype_size(dt));
  return t;
}

tdm_tensor *tdm_from_data(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape, const void *data) {
  tdm_tensor *t = tdm_new(tp, dt, ndim, shape);
  if (t && t->numel && !data) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "from_data: data is NULL for %lld elements", (long long)t->numel);
  if (t && t->numel) memcpy(t->data, data, (size_t)t->numel * tdm_dtype_size(dt));
  return t;
}

void tdm_tensor_set_requires_grad(tdm_tensor *t, int on) {
  TDM__NONNULL(t, , "tdm_tensor_set_requires_grad: the tensor is NULL");
  if (on) t->flags |= TDM_TF_REQUIRES_GRAD;
  else t->flags &= ~(uint32_t)TDM_TF_REQUIRES_GRAD;
}

int tdm_tensor_requires_grad(const tdm_tensor *t) { return tdm__requires_grad(t); }

void tdm_tensor_set_grad_hook(tdm_tensor *leaf, tdm_grad_hook_fn fn, void *ctx) {
  TDM__NONNULL(leaf, , "tdm_tensor_set_grad_hook: the leaf is NULL");
  leaf->hook = fn;
  leaf->hook_ctx = ctx;
}

void tdm_tensor_set_fetch_hook(tdm_tensor *param, tdm_fetch_hook_fn fn, void *ctx) {
  TDM__NONNULL(param, , "tdm_tensor_set_fetch_hook: the parameter is NULL");
  param->fetch = fn;
  param->fetch_ctx = ctx;
}

static int other_phase(const tdm_tape *tp, const tdm_tensor *t);

void tdm_tensor_set_grad_range_hook(tdm_tensor *leaf, tdm_grad_range_hook_fn fn, void *ctx) {
  TDM__NONNULL(leaf, , "tdm_tensor_set_grad_range_hook: the leaf is NULL");
  leaf->range_hook = fn;
  leaf->range_ctx = ctx;
}

tdm_status tdm__fetch_rows(tdm_tape *tp, const char *op, tdm_tensor *w, int64_t r0, int64_t r1, int backward) {
  tdm_tensor *p = tdm__fetchable(w);
  if (!p || r1 <= r0) return TDM_OK;
  int64_t row = w->ndim == 2 ? w->shape[1] : 1, at = ((const char *)w->data - (const char *)p->data) / (int64_t)sizeof(float);
  tdm_status st = p->fetch(p->fetch_ctx, p, at + r0 * row, at + r1 * row, backward);
  if (st != TDM_OK) tdm__fail(tp, st, "%s: fetching rows %lld..%lld of parameter '%s': %s", op, (long long)r0, (long long)r1,
                              p->name ? p->name : "?", tdm_last_error());
  return st;
}

int tdm__first_reader(const tdm_tape *tp, const tdm_tensor *w, int node) {
  return w->tape_epoch == tp->epoch && w->first_use >= node;
}

void tdm__grad_rows_final(tdm_tape *tp, tdm_tensor *w, int64_t r0, int64_t r1) {
  if (!w->range_hook || r1 <= r0 || other_phase(tp, w)) return;
  int64_t row = w->ndim == 2 ? w->shape[1] : 1;
  w->range_hook(w->range_ctx, w, r0 * row, r1 * row);
}

static tdm_dtype grad_dtype(const tdm_tensor *t);

/* Heap leaves get a heap gradient that outlives tape resets (16-bit for a 16-bit leaf). */
static tdm_status heap_grad(tdm_tensor *t) {
  tdm_tensor *g;
  TDM__TRY(tdm_tensor_create(&g, grad_dtype(t), t->ndim, t->shape));
  t->grad = g;
  return TDM_OK;
}

tdm_status tdm_tensor_zero_grad(tdm_tensor *t) {
  if (!t) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_tensor_zero_grad: the tensor is NULL");
  if (!t->grad) {
    if (!(t->flags & TDM_TF_HEAP))
      return tdm__set_error(TDM_ERR_INVALID_USAGE, "zero_grad: tensor %s has no gradient yet", tdm_tensor_name(t));
    return heap_grad(t); /* created zeroed */
  }
  memset(t->grad->data, 0, (size_t)t->grad->numel * tdm_dtype_size(t->grad->dtype));
  return TDM_OK;
}

/* Gradients have the tensor's dtype when it is 16-bit (mixed precision), else f32. */
static tdm_dtype grad_dtype(const tdm_tensor *t) {
  return t->dtype == TDM_BF16 || t->dtype == TDM_F16 ? t->dtype : TDM_F32;
}

/* A split backward computes in each pass only its side's gradients (parameters, or the rest). */
static int other_phase(const tdm_tape *tp, const tdm_tensor *t) {
  return tp->grad_phase && ((t->flags & TDM_TF_PARAM) != 0) != (tp->grad_phase == 2);
}

void *tdm__grad_for_write(tdm_tape *tp, tdm_tensor *t, int *fresh) {
  *fresh = 0;
  if (!tdm__requires_grad(t) || other_phase(tp, t)) return NULL;
  if (!t->grad && !((t->flags & TDM_TF_HEAP) && !t->node)) { /* a tape activation's first gradient */
    tdm_tensor *g = tdm__out(tp, grad_dtype(t), t->ndim, t->shape);
    if (!g) return NULL;
    t->grad = g;
    *fresh = 1;
    return g->data;
  }
  return tdm__grad(tp, t);
}

void *tdm__grad(tdm_tape *tp, tdm_tensor *t) {
  if (!tdm__requires_grad(t) || other_phase(tp, t)) return NULL;
  if (!t->grad) {
    if ((t->flags & TDM_TF_HEAP) && !t->node) {
      if (heap_grad(t) != TDM_OK) {
        tdm__fail(tp, TDM_ERR_NO_MEMORY, "backward: cannot allocate the gradient of %s", tdm__shp(t));
        return NULL;
      }
    } else {
      tdm_tensor *g = tdm__out(tp, grad_dtype(t), t->ndim, t->shape);
      if (!g) return NULL;
      if (g->dtype == TDM_F32) tdm_k_zero(g->data, g->numel);
      else memset(g->data, 0, (size_t)g->numel * 2);
      t->grad = g;
    }
  }
  return t->grad->data;
}

static int grow(void **arr, int *cap, size_t elem) {
  int nc = *cap ? *cap * 2 : 64;
  void *p = tdm__malloc((size_t)nc * elem);
  if (!p) return 0;
  if (*arr) memcpy(p, *arr, (size_t)*cap * elem);
  tdm__free(*arr);
  *arr = p;
  *cap = nc;
  return 1;
}

tdm_node *tdm__record(tdm_tape *tp, const char *op, tdm__backward_fn bw, tdm_tensor *out, int n,
                      tdm_tensor *const *ins) {
  if (!tp->grad_enabled || !out) return NULL;
  int any = 0;
  for (int i = 0; i < n; i++) any |= tdm__requires_grad(ins[i]);
  if (!any) return NULL;
  if (tp->n_nodes == tp->cap_nodes && !grow((void **)&tp->nodes, &tp->cap_nodes, sizeof(tdm_node *))) {
    tdm__fail(tp, TDM_ERR_NO_MEMORY, "%s: out of memory recording the tape", op);
    return NULL;
  }
  tdm_node *nd = tdm__scratch(tp, sizeof *nd);
  if (!nd) return NULL;
  memset(nd, 0, sizeof *nd);
  nd->op = op;
  nd->backward = bw;
  nd->out = out;
  nd->n_in = n;
  nd->in = nd->in_small;
  if (n > TDM_NODE_MAX_IN) {
    nd->in = tdm__scratch(tp, (size_t)n * sizeof(tdm_tensor *));
    if (!nd->in) return NULL;
  }
  int32_t index = tp->n_nodes;
  for (int i = 0; i < n; i++) {
    tdm_tensor *t = ins[i];
    nd->in[i] = t;
    if (tdm__requires_grad(t) && !t->node && t->tape_epoch != tp->epoch) { /* a leaf's first use */
      if (tp->n_leaves == tp->cap_leaves && !grow((void **)&tp->leaves, &tp->cap_leaves, sizeof(tdm__leaf_use))) {
        tdm__fail(tp, TDM_ERR_NO_MEMORY, "%s: out of memory recording the tape", op);
        return NULL;
      }
      t->tape_epoch = tp->epoch;
      t->first_use = index;
      tp->leaves[tp->n_leaves++] = (tdm__leaf_use){t, index, !(t->flags & (TDM_TF_PARAM | TDM_TF_HEAP))};
    }
  }
  tp->nodes[tp->n_nodes++] = nd;
  out->node = nd;
  out->flags |= TDM_TF_REQUIRES_GRAD;
  return nd;
}

/* A leaf's hook fires in the pass that makes its gradient. */
static void fire(tdm_tape *tp, tdm_tensor *t) {
  if (t->hook && !other_phase(tp, t)) t->hook(t->hook_ctx, t);
}

static int has_param_input(const tdm_node *nd) {
  for (int j = 0; j < nd->n_in; j++)
    if (nd->in[j] && (nd->in[j]->flags & TDM_TF_PARAM)) return 1;
  return 0;
}

tdm_status tdm__backward_nodes(tdm_tape *tp, int from, int to) {
  for (int i = to - 1; i >= from && tp->status == TDM_OK; i--) {
    tdm_node *nd = tp->nodes[i];
    if (nd->out->grad && (tp->grad_phase != 2 || has_param_input(nd)) &&
        (nd->self_fetch || fetch_inputs(tp, nd->op, nd->n_in, nd->in, 1) == TDM_OK))
      nd->backward(tp, nd);
  }
  return tp->status;
}

void tdm__tape_section(tdm_tape *tp, int index) {
  if (!tdm_trace_on() || tp->n_sec == TDM__TAPE_SECTIONS) return;
  if (tp->n_sec && tp->sec_node[tp->n_sec - 1] == tp->n_nodes) tp->n_sec--; /* an empty section: replaced */
  tp->sec_node[tp->n_sec] = tp->n_nodes, tp->sec_index[tp->n_sec++] = index;
}

/* Backward through the sections: a span per block from its last node to its first. */
static void section_span(tdm_tape *tp, int *s, int i, double *t_in) {
  while (*s >= 0 && i < tp->sec_node[*s]) {
    double now = tdm_trace_now();
    if (tp->sec_index[*s] >= 0 && *t_in > 0) {
      tdm_trace_args a = TDM_TRACE_ARGS_INIT;
      a.index = tp->sec_index[*s];
      tdm_trace_span("compute", "backward block", *t_in, now, &a);
    }
    *t_in = now;
    (*s)--;
  }
}

static tdm_status run_backward(tdm_tape *tp) {
  int k = tp->n_leaves - 1;
  tp->in_backward = 1;
  int sec = tdm_trace_on() ? tp->n_sec - 1 : -1;
  double t_sec = sec >= 0 ? tdm_trace_now() : 0;
  for (int i = tp->n_nodes - 1; i >= 0; i--) {
    if (sec >= 0) section_span(tp, &sec, i, &t_sec);
    tdm_node *nd = tp->nodes[i];
    if (nd->out->grad && (tp->grad_phase != 2 || has_param_input(nd)) &&
        (nd->self_fetch || fetch_inputs(tp, nd->op, nd->n_in, nd->in, 1) == TDM_OK))
      nd->backward(tp, nd);
    if (tp->status != TDM_OK) {
      tp->in_backward = 0;
      return tp->status;
    }
    for (; k >= 0 && tp->leaves[k].first_use >= i; k--) fire(tp, tp->leaves[k].t);
  }
  for (; k >= 0; k--) fire(tp, tp->leaves[k].t);
  if (sec >= 0) section_span(tp, &sec, -1, &t_sec);
  tp->in_backward = 0;
  return TDM_OK;
}

tdm_status tdm_backward_with(tdm_tape *tp, tdm_tensor *out, const tdm_tensor *gout) {
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "backward: the tape is NULL");
  if (tp->status != TDM_OK) return tdm__set_error(tp->status, "%s", tp->error);
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "backward: output is NULL");
  if (!tdm__requires_grad(out))
    return tdm__set_error(TDM_ERR_INVALID_USAGE,
                          "backward: the output %s does not require grad (no parameter reached it, or grad is off)",
                          tdm__shp(out));
  if (gout && (!tdm__shape_equal(out, gout) || gout->dtype != TDM_F32))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "backward: gradient %s %s does not match output %s f32",
                          tdm__shp(gout), tdm_dtype_name(gout->dtype), tdm__shp(out));
  void *g = tdm__grad(tp, out);
  if (!g) return tdm__set_error(tp->status, "%s", tp->error);
  if (gout) {
    tdm_tensor *gv = out->grad;
    tdm_status st = tdm_tensor_copy(gv, gout);
    if (st != TDM_OK) return st;
  } else {
    tdm_tensor_fill(out->grad, 1.0);
  }
  tdm_status st = run_backward(tp);
  if (st != TDM_OK) return tdm__set_error(st, "%s", tp->error);
  return TDM_OK;
}

tdm_status tdm_backward(tdm_tape *tp, tdm_tensor *loss) {
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "backward: the tape is NULL");
  if (loss && loss->numel != 1)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "backward: loss has shape %s; expected one element (or use backward_with)",
                          tdm__shp(loss));
  return tdm_backward_with(tp, loss, NULL);
}

tdm_status tdm_backward_inputs(tdm_tape *tp, tdm_tensor *out, const tdm_tensor *gout) {
  if (out && !gout && out->numel != 1)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "backward_inputs: output %s without a gradient; expected one element",
                          tdm__shp(out));
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "backward_inputs: the tape is NULL");
  tp->grad_phase = 1;
  tdm_status st = tdm_backward_with(tp, out, gout);
  tp->grad_phase = 0;
  return st;
}

tdm_status tdm_backward_params(tdm_tape *tp) {
  if (!tp) return tdm__set_error(TDM_ERR_INVALID_ARG, "backward_params: the tape is NULL");
  if (tp->status != TDM_OK) return tdm__set_error(tp->status, "%s", tp->error);
  tp->grad_phase = 2; /* the nodes that have a parameter among their inputs, from the gradients pass 1 left */
  tdm_status st = run_backward(tp);
  tp->grad_phase = 0;
  if (st != TDM_OK) return tdm__set_error(st, "%s", tp->error);
  return TDM_OK;
}
