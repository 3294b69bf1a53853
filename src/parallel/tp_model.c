/* A transformer split over the tensor axis (see tp_model.h): what every model shares, the slices,
 * the store of them, the norm's pieces, the checkpoint boxes and the frame of a range; each model's
 * embedding, blocks and final norm are its own (tp_gpt.c, tp_llama.c). */
#include "parallel/tp_model_impl.h"

#include <stdio.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "core/internal.h"
#include "tandem/optim.h"

/* How each parameter is split: by the end of its name (GPT's and Llama's names, docs/models.md);
 * the dimension and how many equal chunks it holds (c_attn packs q, k and v, each split alike).
 * Everything else is replicated. */
static const struct {
  const char *suffix;
  int dim, chunks;
} plan[] = {
    /* GPT */
    {"transformer.wte.weight", 0, 1}, {".attn.c_attn.weight", 0, 3}, {".attn.c_attn.bias", 0, 3},
    {".attn.c_proj.weight", 1, 1},    {".mlp.c_fc.weight", 0, 1},    {".mlp.c_fc.bias", 0, 1},
    {".mlp.c_proj.weight", 1, 1},
    /* Llama: query heads, key/value heads (T divides both: whole groups), SwiGLU units */
    {"model.embed_tokens.weight", 0, 1}, {"lm_head.weight", 0, 1},          {".self_attn.q_proj.weight", 0, 1},
    {".self_attn.k_proj.weight", 0, 1},  {".self_attn.v_proj.weight", 0, 1}, {".self_attn.o_proj.weight", 1, 1},
    {".mlp.gate_proj.weight", 0, 1},     {".mlp.up_proj.weight", 0, 1},      {".mlp.down_proj.weight", 1, 1},
};

static const tdm__tp_kind *kind_of(const tdm_model_config *mc) {
  return mc->kind == TDM_MODEL_GPT ? &tdm__tp_gpt_kind : mc->kind == TDM_MODEL_LLAMA ? &tdm__tp_llama_kind : NULL;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* Rank t's part of m units: [t m / T, (t + 1) m / T). Whole heads when T divides them (checked);
 * vocabulary rows, GPT's 4C and Llama's SwiGLU units otherwise, the blocks differing by at most
 * one. */
static int64_t part_lo(int64_t m, int T, int t) { return m * t / T; }

tdm_status tdm__tp_check(const tdm_model_config *mc, int T) {
  if (T < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: %d ranks; expected >= 1", T);
  if (T == 1) return TDM_OK;
  if (!kind_of(mc))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism (--tp %d) splits the gpt and llama models; the %s model has no "
                          "heads to split: use --tp 1", T, tdm_model_kind_name(mc->kind));
  if (T > mc->n_head)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: --tp %d is larger than the %lld attention heads; "
                          "expected a divisor of %lld", T, (long long)mc->n_head, (long long)mc->n_head);
  if (mc->n_head % T)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: %lld attention heads do not divide over --tp %d ranks; "
                          "expected a divisor of %lld", (long long)mc->n_head, T, (long long)mc->n_head);
  if (mc->kind == TDM_MODEL_LLAMA && mc->n_kv_head % T)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: %lld key/value heads do not divide over --tp %d ranks (grouped-"
                          "query attention: each rank keeps whole groups, a key/value head with its %lld query heads); expected a "
                          "divisor of %lld", (long long)mc->n_kv_head, T, (long long)(mc->n_kv_head ? mc->n_head / mc->n_kv_head : 0),
                          (long long)mc->n_kv_head);
  if (mc->kind == TDM_MODEL_LLAMA && mc->ffn_hidden < T)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: a SwiGLU width of %lld cannot be split over --tp %d ranks; "
                          "expected at least %d", (long long)mc->ffn_hidden, T, T);
  if (mc->vocab_size < T)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: a vocabulary of %lld rows cannot be split over --tp %d ranks",
                          (long long)mc->vocab_size, T);
  return TDM_OK;
}

void tdm__tp_slice_of(const tdm_params *whole, int i, int T, int t, tdm__tp_slice *s, int64_t *shape) {
  const tdm_tensor *w = tdm_params_get(whole, i);
  const char *name = tdm_tensor_name(w);
  int nd = tdm_tensor_ndim(w);
  memcpy(shape, tdm_tensor_shape(w), sizeof(int64_t) * (size_t)nd);
  *s = (tdm__tp_slice){0, 0, 0, tdm_tensor_numel(w), tdm_tensor_numel(w), 1, 1, tdm_tensor_numel(w)};
  for (size_t k = 0; T > 1 && k < sizeof plan / sizeof plan[0]; k++) {
    if (!ends_with(name, plan[k].suffix)) continue;
    int d = plan[k].dim;
    int64_t m = shape[d] / plan[k].chunks, lo = part_lo(m, T, t), w_t = part_lo(m, T, t + 1) - lo, A = 1, Bi = 1;
    for (int q = 0; q < d; q++) A *= shape[q];
    for (int q = d + 1; q < nd; q++) Bi *= shape[q];
    *s = (tdm__tp_slice){1, d, lo * Bi, w_t * Bi, m * Bi, A * plan[k].chunks, m, Bi};
    shape[d] = plan[k].chunks * w_t;
    return;
  }
}

int64_t tdm__tp_local_numel(const tdm_params *whole, int T, int t) {
  int64_t n = 0, shape[TDM_MAX_DIMS];
  for (int i = 0; i < tdm_params_count(whole); i++) {
    tdm__tp_slice s;
    tdm__tp_slice_of(whole, i, T, t, &s, shape);
    n += s.len * s.count;
  }
  return n;
}

tdm_status tdm__tp_norm_pieces(const tdm_params *whole, int T, int t, tdm__tp_piece *out, int64_t *n) {
  const int64_t *cut;
  int64_t n_seg, k = 0, loff = 0, shape[TDM_MAX_DIMS];
  TDM__TRY(tdm_params_segments(whole, &cut, &n_seg));
  for (int i = 0; i < tdm_params_count(whole); i++) {
    tdm__tp_slice s;
    tdm__tp_slice_of(whole, i, T, t, &s, shape);
    int64_t woff = tdm_params_offset(whole, i), at0 = loff;
    loff += s.len * s.count;
    if (!s.sharded && t != 0) continue; /* a replicated parameter counts once */
    int64_t a = 0, b = n_seg; /* the segment holding the parameter's first element */
    while (b - a > 1) {
      int64_t m = (a + b) / 2;
      if (cut[m] <= woff) a = m;
      else b = m;
    }
    for (int64_t r = 0; r < s.count; r++) {
      int64_t lo = woff + s.first + r * s.stride, hi = lo + s.len, at = at0 + r * s.len;
      for (int64_t x = lo; x < hi;) {
        while (cut[a + 1] <= x) a++;
        int64_t end = cut[a + 1] < hi ? cut[a + 1] : hi;
        if (out) out[k] = (tdm__tp_piece){at + (x - lo), end - x, a};
        k++;
        x = end;
      }
    }
  }
  *n = k;
  return TDM_OK;
}

static tdm_status find(tdm__tp_model *g, tdm_tensor **out, const char *prefix, const char *leaf, int required) {
  char name[192];
  snprintf(name, sizeof name, "%s%s", prefix, leaf);
  if (!(*out = tdm_params_find(g->local, name)) && required)
    return tdm__set_error(TDM_ERR_INTERNAL, "tensor parallelism: the %s model has no parameter '%s'", tdm_model_kind_name(g->cfg.kind),
                          name);
  return TDM_OK;
}

/* The model's parameters by name, in this rank's store (an untied head's is required too). */
static tdm_status bind(tdm__tp_model *g) {
  const tdm__tp_kind *k = g->kind;
  for (int i = 0; i < k->n_top; i++)
    TDM__TRY(find(g, &g->top[i], "", k->top[i], i < k->n_required || (i == k->head && !g->cfg.tie_embeddings)));
  for (int64_t l = 0; l < g->cfg.n_layer; l++) {
    char prefix[96];
    snprintf(prefix, sizeof prefix, k->block, (long long)l);
    for (int j = 0; j < k->n_leaf; j++) TDM__TRY(find(g, &tdm__tp_block(g, l)[j], prefix, k->leaf[j], 1));
  }
  return TDM_OK;
}

tdm_status tdm__tp_model_create(tdm__tp_model **out, const tdm_params *whole, const tdm_model_config *mc, tdm_comm_t comm,
                                int T, int t) {
  *out = NULL;
  TDM__TRY(tdm__tp_check(mc, T));
  if (!kind_of(mc) || t < 0 || t >= T || (T > 1 && (!comm || tdm_comm_size(comm) != T)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: rank %d of %d on a tensor axis of %d (%s model)", t, T,
                          comm ? tdm_comm_size(comm) : 1, tdm_model_kind_name(mc->kind));
  tdm__tp_model *g = tdm__calloc(1, sizeof *g);
  if (!g) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  g->cfg = *mc;
  g->kind = kind_of(mc);
  g->T = T, g->t = t;
  g->vlo = part_lo(mc->vocab_size, T, t); /* the embedding's rows and an untied head's */
  g->comm.comm = T > 1 ? comm : NULL;
  g->n = tdm_params_count(whole);
  g->slice = tdm__calloc((size_t)(g->n ? g->n : 1), sizeof *g->slice);
  g->blocks = tdm__calloc((size_t)(mc->n_layer > 0 ? mc->n_layer * g->kind->n_leaf : 1), sizeof *g->blocks);
  g->ckpt = tdm__calloc((size_t)(mc->n_layer > 0 ? mc->n_layer : 1), sizeof *g->ckpt);
  for (int64_t l = 0; g->ckpt && l < mc->n_layer; l++) g->ckpt[l].g = g, g->ckpt[l].l = l;
  tdm_status st = g->slice && g->blocks && g->ckpt ? tdm_params_create(&g->local)
                                                   : tdm__set_error(TDM_ERR_NO_MEMORY, "tensor parallelism: out of memory");
  /* the whole model's parameters, in order, each as this rank's slice of it */
  for (int i = 0; st == TDM_OK && i < g->n; i++) {
    const tdm_tensor *w = tdm_params_get(whole, i);
    int64_t shape[TDM_MAX_DIMS];
    tdm__tp_slice_of(whole, i, T, t, &g->slice[i], shape);
    tdm_tensor *mine;
    st = tdm_params_declare(g->local, tdm_tensor_name(w), tdm_tensor_ndim(w), shape, (tdm_init){TDM_INIT_ZEROS, 0, 0},
                            tdm_params_decay(whole, i), &mine);
  }
  if (st == TDM_OK) st = tdm_params_finalize(g->local, 0);
  for (int i = 0; st == TDM_OK && i < g->n; i++) { /* the whole model's initial values, slice by slice */
    const tdm__tp_slice *s = &g->slice[i];
    st = tdm_params_init_strided(whole, i, s->first, s->len, s->stride, s->count,
                                 tdm_tensor_data(tdm_params_get(g->local, i)));
  }
  if (st == TDM_OK) st = bind(g);
  if (st != TDM_OK) {
    tdm__tp_model_destroy(g);
    return st;
  }
  *out = g;
  return TDM_OK;
}

void tdm__tp_model_destroy(tdm__tp_model *g) {
  if (!g) return;
  tdm_params_destroy(g->local);
  tdm__free(g->slice);
  tdm__free(g->blocks);
  tdm__free(g->ckpt);
  tdm__free(g);
}

tdm_params *tdm__tp_model_params(const tdm__tp_model *g) { return g->local; }
int64_t tdm__tp_model_bookkeeping(const tdm_model_config *mc, int n_params) {
  const tdm__tp_kind *k = kind_of(mc);
  return (int64_t)sizeof(tdm__tp_model) + (int64_t)sizeof(tdm__tp_slice) * (n_params ? n_params : 1) +
         (int64_t)sizeof(tdm_tensor *) * (k ? k->n_leaf : 0) * mc->n_layer;
}
const tdm__tp_slice *tdm__tp_model_slice(const tdm__tp_model *g, int i) { return i >= 0 && i < g->n ? &g->slice[i] : NULL; }
tdm__tp_comm *tdm__tp_model_comm(tdm__tp_model *g) { return &g->comm; }

/* Dropout masks are keyed by the call's number in the step, as the whole model numbers them
 * (src/nn/models.c, llama.c): the embeddings' is call 0, block l's two are 1 + 2l and 2 + 2l,
 * however the blocks are spread over ranges. */
static void dropout_site(tdm_tape *tp, int64_t call) { tp->dropout_calls = (uint64_t)call; }

tdm_tensor *tdm__tp_lookup(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *table, tdm_tensor *ids) {
  dropout_site(tp, 0);
  tdm_tensor *h = tdm__tp_reduce(tp, &g->comm, tdm__tp_embedding(tp, table, ids, g->vlo));
  /* under autocast in the activation dtype, as one process's embedding stores it (and as the
   * first block's input must be, recomputed or not) */
  return h && tdm__act_dtype(tp) != TDM_F32 ? tdm_cast(tp, h, tdm__act_dtype(tp)) : h;
}

tdm_tensor *tdm__tp_join(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *x, tdm_tensor *partial, tdm_tensor *bias) {
  tdm_tensor *h = tdm__tp_reduce(tp, &g->comm, partial);
  if (bias) h = tdm_add(tp, h, bias);
  return tdm_add(tp, x, tdm_dropout(tp, h, g->cfg.dropout));
}

/* Block recomputation (the tape says when): the split block runs under tdm_checkpoint, which keeps
 * its input alone and runs it again in backward, collectives included (every tensor rank
 * recomputes the same blocks in the same order); selective recomputation is the attention op's
 * own. */
static tdm_tensor *ckpt_block(tdm_tape *tp, tdm_tensor *x, const void *ctx) {
  const tdm__tp_ckpt *c = ctx;
  return c->g->kind->block_fn(c->g, tp, x, c->l);
}
static tdm_tensor *run_block(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *h, int64_t l) {
  if (tdm_tape_recompute(tp) != TDM_RECOMPUTE_BLOCK) return g->kind->block_fn(g, tp, h, l);
  return tdm_checkpoint(tp, ckpt_block, &g->ckpt[l], h, g->kind->n_leaf, tdm__tp_block(g, l));
}

tdm_tensor *tdm__tp_model_range(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *in, tdm__tp_range *r, tdm_tensor *y,
                                double *correct, double *rows) {
  if (!in || !r || tdm_tape_status(tp) != TDM_OK) return NULL;
  const tdm_model_config *c = &g->cfg;
  const char *name = tdm_model_kind_name(c->kind);
  if (r->first < 0 || r->last < r->first || r->last > c->n_layer || (r->head && !y))
    return tdm_tape_fail(tp, TDM_ERR_INVALID_ARG, "tensor parallelism: a range of blocks [%lld, %lld) of %lld%s",
                         (long long)r->first, (long long)r->last, (long long)c->n_layer, r->head && !y ? " with a head and no targets" : "");
  char b[96];
  int64_t T = tdm_tensor_ndim(in) >= 2 ? tdm_tensor_dim(in, 1) : 0;
  if (r->embed && (tdm_tensor_ndim(in) != 2 || (tdm_tensor_dtype(in) != TDM_I32 && tdm_tensor_dtype(in) != TDM_I64) || T < 1 ||
                   T > c->block_size))
    /* as tdm_model_forward words it: the same input is refused the same way */
    return tdm_tape_fail(tp, TDM_ERR_INVALID_ARG, "%s: input is %s %s; expected (batch, T) i32/i64 token ids with 1 <= T <= block_size",
                         name, tdm_shape_str(tdm_tensor_ndim(in), tdm_tensor_shape(in), b, sizeof b), tdm_dtype_name(tdm_tensor_dtype(in)));
  if (!r->embed && (tdm_tensor_ndim(in) != 3 || tdm_tensor_dtype(in) != tdm__act_dtype(tp) || tdm_tensor_dim(in, 2) != c->n_embd ||
                    T < 1 || T > c->block_size))
    return tdm_tape_fail(tp, TDM_ERR_INVALID_ARG, "%s range: input is %s %s; expected (batch, T, width) %s activations, width %lld, "
                         "1 <= T <= %lld", name, tdm_shape_str(tdm_tensor_ndim(in), tdm_tensor_shape(in), b, sizeof b),
                         tdm_dtype_name(tdm_tensor_dtype(in)), tdm_dtype_name(tdm__act_dtype(tp)), (long long)c->n_embd,
                         (long long)c->block_size);
  tdm_tensor *h = r->embed ? g->kind->embed(g, tp, in) : in;
  for (int64_t l = r->first; l < r->last; l++) {
    dropout_site(tp, 1 + 2 * l);
    h = run_block(g, tp, h, l);
  }
  if (!r->head) return h;
  h = tdm__tp_copy(tp, &g->comm, g->kind->final_norm(g, tp, h));
  tdm_tensor *head = r->head_weight       ? r->head_weight
                     : g->top[g->kind->head] ? g->top[g->kind->head]
                                             : g->top[0]; /* (V_t, width): this rank's rows; a tied head's are the embedding's */
  tdm_tensor *logits = tdm_linear(tp, h, head, NULL); /* (B, T, V_t) */
  r->logits = logits, r->head_input = h;
  return tdm__tp_cross_entropy(tp, &g->comm, logits, y, g->vlo, c->vocab_size, -100, correct, rows);
}

tdm_tensor *tdm__tp_model_loss(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *x, tdm_tensor *y, double *correct, double *rows) {
  tdm__tp_range whole = {0, g->cfg.n_layer, 1, 1, NULL, NULL, NULL};
  return tdm__tp_model_range(g, tp, x, &whole, y, correct, rows);
}

/* A slice is count runs: along its dimension, rows [lo, lo + rows) of each of `chunks` blocks of m
 * rows, for every index of the dimensions before it. One box when there is one block (a column
 * split: all of them at once), else one box per run. */
int tdm__tp_model_boxes(const tdm__tp_model *g, const tdm_params *whole, int D, int d, int (*held)(void *ctx, int i, int64_t *state_at),
                        void *ctx, tdm_engine_piece *out) {
  int n = 0;
  for (int i = 0; i < tdm_params_count(g->local); i++) {
    int64_t at;
    if (!held(ctx, i, &at)) continue;
    const tdm__tp_slice *s = &g->slice[i];
    const tdm_tensor *w = tdm_params_get(whole, i);
    int nd = tdm_tensor_ndim(w);
    const int64_t *shape = tdm_tensor_shape(w);
    int64_t A = 1;
    for (int q = 0; q < s->dim; q++) A *= shape[q];
    int64_t chunks = s->sharded ? s->count / A : 1, runs = !s->sharded || chunks == 1 ? 1 : s->count;
    int write = i % D == d && (s->sharded || i % g->T == g->t);
    float *data = tdm_tensor_data(tdm_params_get(g->local, i));
    for (int64_t r = 0; r < runs; r++, n++) {
      if (!out) continue;
      tdm_engine_piece *b = &out[n];
      memset(b, 0, sizeof *b);
      b->param = i, b->write = write, b->data = data + r * s->len, b->state_at = at + r * s->len;
      for (int q = 0; q < nd; q++) b->count[q] = shape[q];
      if (!s->sharded) continue;
      int64_t o = r / chunks, c = r % chunks, rows = s->len / s->unit, lo = s->first / s->unit;
      if (runs > 1) /* this run's index in the dimensions before the split one */
        for (int q = s->dim - 1; q >= 0; q--) b->start[q] = o % shape[q], b->count[q] = 1, o /= shape[q];
      b->start[s->dim] = c * s->m + lo, b->count[s->dim] = rows;
    }
  }
  return n;
}
