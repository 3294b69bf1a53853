/* The model zoo: MLP, CNN, a GPT-2-style language model and Llama (src/nn/llama.c), behind one
 * interface. */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "nn/model_impl.h"
#include "autograd/tape_impl.h"
#include "tandem/comm.h"
#include "tandem/trace.h"

static const char *kind_names[] = {"mlp", "cnn", "gpt", "llama", "resnet"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == TDM_MODEL_KIND_COUNT, "one name per model kind");

const char *tdm_model_kind_name(tdm_model_kind k) {
  return (unsigned)k < TDM_MODEL_KIND_COUNT ? kind_names[k] : "?";
}

tdm_model_config tdm_model_config_mlp(void) {
  tdm_model_config c = {0};
  c.kind = TDM_MODEL_MLP;
  c.in_features = 784;
  c.n_classes = 10;
  c.n_hidden = 2;
  c.hidden[0] = 512;
  c.hidden[1] = 256;
  c.dropout = 0.3f;
  return c;
}

tdm_model_config tdm_model_config_cnn(void) {
  tdm_model_config c = {0};
  c.kind = TDM_MODEL_CNN;
  c.in_channels = 1;
  c.height = 28;
  c.width = 28;
  c.c1 = 16;
  c.c2 = 32;
  c.n_classes = 10;
  c.dropout = 0.3f;
  return c;
}

tdm_model_config tdm_model_config_gpt_mini(void) {
  tdm_model_config c = {0};
  c.kind = TDM_MODEL_GPT;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 256;
  c.block_size = 128;
  c.vocab_size = 256;
  c.dropout = 0.0f;
  return c;
}

tdm_model_config tdm_model_config_gpt2_124m(void) {
  tdm_model_config c = tdm_model_config_gpt_mini();
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.block_size = 1024;
  c.vocab_size = 50257;
  return c;
}

tdm_status tdm_model_config_gpt(const char *name, const int64_t override[5], tdm_model_config *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_model_config_gpt: out is NULL");
  if (name && strcmp(name, "mini") && strcmp(name, "gpt2-124M"))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "gpt: config '%s'; expected mini or gpt2-124M", name);
  tdm_model_config c = name && !strcmp(name, "gpt2-124M") ? tdm_model_config_gpt2_124m() : tdm_model_config_gpt_mini();
  int64_t *field[5] = {&c.n_layer, &c.n_head, &c.n_embd, &c.block_size, &c.vocab_size};
  for (int i = 0; override && i < 5; i++)
    if (override[i] > 0) *field[i] = override[i];
  *out = c;
  return TDM_OK;
}

static tdm_status check_config(const tdm_model_config *c) {
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "model: dropout %g; expected 0 <= p < 1", (double)c->dropout);
  switch (c->kind) {
  case TDM_MODEL_MLP:
    if (c->in_features <= 0 || c->n_classes <= 0 || c->n_hidden < 0 || c->n_hidden > TDM_MLP_MAX_LAYERS - 1)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "mlp: in_features %lld, classes %lld, %d hidden layers; expected > 0, > 0, 0..%d",
                            (long long)c->in_features, (long long)c->n_classes, c->n_hidden, TDM_MLP_MAX_LAYERS - 1);
    for (int i = 0; i < c->n_hidden; i++)
      if (c->hidden[i] <= 0)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "mlp: hidden layer %d has width %lld; expected > 0", i,
                              (long long)c->hidden[i]);
    return TDM_OK;
  case TDM_MODEL_CNN:
    if (c->in_channels <= 0 || c->height < 4 || c->width < 4 || c->c1 <= 0 || c->c2 <= 0 || c->n_classes <= 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "cnn: input %lldx%lldx%lld, channels %lld/%lld, classes %lld; expected positive sizes, images at least 4x4",
                            (long long)c->in_channels, (long long)c->height, (long long)c->width, (long long)c->c1,
                            (long long)c->c2, (long long)c->n_classes);
    return TDM_OK;
  case TDM_MODEL_GPT:
    if (c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->block_size <= 0 || c->vocab_size <= 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "gpt: layers %lld, heads %lld, width %lld, block %lld, vocab %lld; expected all > 0",
                            (long long)c->n_layer, (long long)c->n_head, (long long)c->n_embd, (long long)c->block_size,
                            (long long)c->vocab_size);
    if (c->n_embd % c->n_head)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "gpt: %lld heads do not divide the width %lld",
                            (long long)c->n_head, (long long)c->n_embd);
    return TDM_OK;
  case TDM_MODEL_LLAMA:
    return tdm__llama_check(c);
  case TDM_MODEL_RESNET:
    return tdm__resnet_check(c);
  default:
    return tdm__set_error(TDM_ERR_INVALID_ARG, "model: unknown kind %d", (int)c->kind);
  }
}

static tdm_status build(tdm_model *m) {
  const tdm_model_config *c = &m->cfg;
  tdm_params *p = m->params;
  char name[64];
  switch (c->kind) {
  case TDM_MODEL_MLP: {
    /* As nn.Sequential(Linear, ReLU, Dropout, ..., Linear): linears at indices 0, 3, 6, ... */
    int64_t in = c->in_features;
    for (int i = 0; i <= c->n_hidden; i++) {
      int64_t out = i < c->n_hidden ? c->hidden[i] : c->n_classes;
      snprintf(name, sizeof name, "layers.%d", 3 * i);
      TDM__TRY(tdm_linear_mod_init(&m->linear[i], p, name, in, out, 1));
      in = out;
    }
    m->n_linear = c->n_hidden + 1;
    return TDM_OK;
  }
  case TDM_MODEL_CNN: {
    /* As nn.Sequential(Conv, ReLU, MaxPool, Conv, ReLU, MaxPool, Flatten, Dropout, Linear) */
    TDM__TRY(tdm_conv2d_mod_init(&m->conv1, p, "layers.0", c->in_channels, c->c1, 5, 1, 2));
    TDM__TRY(tdm_conv2d_mod_init(&m->conv2, p, "layers.3", c->c1, c->c2, 5, 1, 2));
    int64_t flat = c->c2 * (c->height / 4) * (c->width / 4);
    return tdm_linear_mod_init(&m->fc, p, "layers.8", flat, c->n_classes, 1);
  }
  case TDM_MODEL_GPT: {
    TDM__TRY(tdm_embedding_mod_init(&m->wte, p, "transformer.wte", c->vocab_size, c->n_embd, 0.02f));
    TDM__TRY(tdm_embedding_mod_init(&m->wpe, p, "transformer.wpe", c->block_size, c->n_embd, 0.02f));
    m->blocks = tdm__calloc((size_t)c->n_layer, sizeof *m->blocks);
    if (!m->blocks) return tdm__set_error(TDM_ERR_NO_MEMORY, "gpt: out of memory");
    for (int64_t l = 0; l < c->n_layer; l++) {
      snprintf(name, sizeof name, "transformer.h.%lld", (long long)l);
      TDM__TRY(tdm_block_mod_init(&m->blocks[l], p, name, c->n_embd, (int)c->n_head, (int)c->n_layer, c->dropout));
    }
    return tdm_layernorm_mod_init(&m->ln_f, p, "transformer.ln_f", c->n_embd);
  }
  case TDM_MODEL_LLAMA:
    return tdm__llama_build(m);
  case TDM_MODEL_RESNET:
    return tdm__resnet_build(m);
  default:
    return tdm__set_error(TDM_ERR_INTERNAL, "model: unknown kind");
  }
}

tdm_status tdm_model_create(tdm_model **out, const tdm_model_config *cfg, uint64_t seed) {
  return tdm_model_create_with(out, cfg, seed, 0);
}

tdm_status tdm_model_create_with(tdm_model **out, const tdm_model_config *cfg, uint64_t seed, int reserved) {
  if (!out || !cfg) return tdm__set_error(TDM_ERR_INVALID_ARG, "model_create: NULL argument");
  TDM__TRY(check_config(cfg));
  tdm_model *m = tdm__calloc(1, sizeof *m);
  if (!m) return tdm__set_error(TDM_ERR_NO_MEMORY, "model_create: out of memory");
  m->cfg = *cfg;
  tdm_status st = tdm_params_create(&m->params);
  if (st == TDM_OK) st = build(m);
  if (st == TDM_OK) st = reserved ? tdm_params_finalize_reserved(m->params, seed, reserved) : tdm_params_finalize(m->params, seed);
  if (st != TDM_OK) {
    tdm_model_destroy(m);
    return st;
  }
  *out = m;
  return TDM_OK;
}

void tdm_model_destroy(tdm_model *m) {
  if (!m) return;
  tdm_params_destroy(m->params);
  tdm__free(m->blocks);
  tdm__free(m->lblocks);
  tdm__resnet_free(m);
  tdm__free(m);
}

tdm_params *tdm_model_params(const tdm_model *m) {
  TDM__NONNULL(m, NULL, "tdm_model_params: the model is NULL");
  return m->params;
}
const tdm_model_config *tdm_model_get_config(const tdm_model *m) {
  TDM__NONNULL(m, NULL, "tdm_model_get_config: the model is NULL");
  return &m->cfg;
}
void tdm_model_set_bn_sync(tdm_model *m, struct tdm_comm *comm) {
  TDM__NONNULL(m, , "tdm_model_set_bn_sync: the model is NULL");
  m->bn_sync = comm && tdm_comm_size(comm) > 1 ? comm : NULL;
}

/* A GPT block as tdm_checkpoint runs it (activation recomputation: the tape says when). */
static tdm_tensor *gpt_block_fn(tdm_tape *tp, tdm_tensor *x, const void *ctx) { return tdm_block_mod_forward(tp, ctx, x); }

static tdm_tensor *gpt_block(tdm_tape *tp, const tdm_block_mod *b, tdm_tensor *x) {
  if (tdm_tape_recompute(tp) != TDM_RECOMPUTE_BLOCK) return tdm_block_mod_forward(tp, b, x);
  tdm_tensor *ps[12] = {b->ln_1.weight,    b->ln_1.bias,    b->c_attn.weight, b->c_attn.bias,
                        b->attn_proj.weight, b->attn_proj.bias, b->ln_2.weight, b->ln_2.bias,
                        b->c_fc.weight,    b->c_fc.bias,    b->mlp_proj.weight, b->mlp_proj.bias};
  return tdm_checkpoint(tp, gpt_block_fn, b, x, 12, ps);
}

static tdm_tensor *input_error(tdm_tape *tp, const char *kind, const tdm_tensor *x, const char *expected) {
  char b[96];
  return tdm__fail(tp, TDM_ERR_INVALID_ARG, "%s: input is %s %s; expected %s", kind,
                   tdm_shape_str(x->ndim, x->shape, b, sizeof b), tdm_dtype_name(x->dtype), expected);
}

tdm_tensor *tdm_model_forward(tdm_model *m, tdm_tape *tp, tdm_tensor *x) {
  TDM__NONNULL(tp, NULL, "model forward: the tape is NULL");
  if (tdm_tape_status(tp) != TDM_OK) return NULL;
  if (!m || !x) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "model forward: %s is NULL", !m ? "the model" : "the input");
  const tdm_model_config *c = &m->cfg;
  switch (c->kind) {
  case TDM_MODEL_MLP: {
    if (x->ndim != 2 || x->shape[1] != c->in_features || x->dtype != TDM_F32)
      return input_error(tp, "mlp", x, "(batch, in_features) f32");
    for (int i = 0; i < m->n_linear; i++) {
      x = tdm_linear_mod_forward(tp, &m->linear[i], x);
      if (i + 1 < m->n_linear) x = tdm_dropout(tp, tdm_relu(tp, x), c->dropout);
    }
    return x;
  }
  case TDM_MODEL_CNN: {
    if (x->ndim != 4 || x->shape[1] != c->in_channels || x->shape[2] != c->height || x->shape[3] != c->width ||
        x->dtype != TDM_F32)
      return input_error(tp, "cnn", x, "(batch, channels, height, width) f32 of the configured size");
    /* conv -> pool -> ReLU: relu(maxpool(v)) is maxpool(relu(v)) value for value and gradient for
     * gradient (a window's max is positive exactly where its ReLU'd max is, at the same first
     * position; otherwise both pass nothing back), and the ReLU runs on a quarter of the values */
    x = tdm_relu(tp, tdm_maxpool2d(tp, tdm_conv2d_mod_forward(tp, &m->conv1, x), 2, 2, 0));
    x = tdm_relu(tp, tdm_maxpool2d(tp, tdm_conv2d_mod_forward(tp, &m->conv2, x), 2, 2, 0));
    int64_t shape[2] = {x ? x->shape[0] : 0, -1};
    x = tdm_dropout(tp, tdm_reshape(tp, x, 2, shape), c->dropout);
    return tdm_linear_mod_forward(tp, &m->fc, x);
  }
  case TDM_MODEL_GPT: {
    tdm_gpt_range all = {0, c->n_layer, 1, 1, NULL, NULL};
    return tdm_gpt_forward_range(m, tp, x, &all);
  }
  case TDM_MODEL_LLAMA: {
    tdm_gpt_range all = {0, c->n_layer, 1, 1, NULL, NULL};
    return tdm_llama_forward_range(m, tp, x, &all);
  }
  case TDM_MODEL_RESNET:
    return tdm__resnet_forward(m, tp, x);
  default:
    return NULL;
  }
}

/* Dropout masks are keyed by the call's number in the step (tandem/autograd.h): the embeddings'
 * is call 0, block l's two are 1 + 2l and 2 + 2l, however the blocks are spread over stages. */
/* --trace: a span per transformer block in forward (backward's are the tape's). */
void tdm__trace_block(double t0, int64_t l) {
  tdm_trace_args a = TDM_TRACE_ARGS_INIT;
  a.index = l;
  tdm_trace_span("compute", "forward block", t0, tdm_trace_now(), &a);
}

static void dropout_site(tdm_tape *tp, int64_t block) { tp->dropout_calls = (uint64_t)(1 + 2 * block); }

tdm_tensor *tdm_gpt_forward_range(tdm_model *m, tdm_tape *tp, tdm_tensor *x, tdm_gpt_range *r) {
  TDM__NONNULL(tp, NULL, "gpt range: the tape is NULL");
  if (tdm_tape_status(tp) != TDM_OK) return NULL;
  if (!m || !x || !r) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "gpt range: %s is NULL", !m ? "the model" : !x ? "the input" : "the range");
  const tdm_model_config *c = &m->cfg;
  if (c->kind != TDM_MODEL_GPT || r->first < 0 || r->last < r->first || r->last > c->n_layer)
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "gpt range: blocks [%lld, %lld) of a %s model with %lld blocks",
                     (long long)r->first, (long long)r->last, tdm_model_kind_name(c->kind), (long long)c->n_layer);
  tdm_tensor *h = x;
  if (r->embed) {
    if (x->ndim != 2 || (x->dtype != TDM_I32 && x->dtype != TDM_I64) || x->shape[1] > c->block_size || x->shape[1] < 1)
      return input_error(tp, "gpt", x, "(batch, T) i32/i64 token ids with 1 <= T <= block_size");
    tp->dropout_calls = 0;
    /* the token embedding first (C leaves the order of arguments open): the table's last reader
     * in backward, so the position embedding's gradient is final before the table's blocks are */
    tdm_tensor *tok = tdm_embedding(tp, m->wte.weight, x);
    h = tdm_add(tp, tok, tdm_slice(tp, m->wpe.weight, 0, 0, x->shape[1]));
    h = tdm_dropout(tp, h, c->dropout);
  } else if (x->ndim != 3 || x->dtype != tdm__act_dtype(tp) || x->shape[2] != c->n_embd || x->shape[1] > c->block_size) {
    /* a later chunk's input: what the blocks before it left, in the tape's activation dtype */
    return input_error(tp, "gpt range", x,
                       tdm__act_dtype(tp) == TDM_F32 ? "(batch, T, width) f32 activations" : "(batch, T, width) activations in the tape's autocast dtype");
  }
  for (int64_t l = r->first; l < r->last; l++) {
    dropout_site(tp, l);
    double t0 = tdm_trace_begin();
    tdm__tape_section(tp, (int)l);
    h = gpt_block(tp, &m->blocks[l], h);
    if (t0 > 0) tdm__trace_block(t0, l);
  }
  tdm__tape_section(tp, -1);
  if (!r->head) return h;
  h = tdm_layernorm_mod_forward(tp, &m->ln_f, h);
  r->head_input = h;
  return tdm_lm_head(tp, h, r->head_weight ? r->head_weight : m->wte.weight); /* tied to wte */
}

tdm_tensor *tdm_model_forward_range(tdm_model *m, tdm_tape *tp, tdm_tensor *x, tdm_gpt_range *r) {
  TDM__NONNULL(tp, NULL, "model range: the tape is NULL");
  if (tdm_tape_status(tp) != TDM_OK) return NULL;
  if (!m || !x || !r) return tdm__fail(tp, TDM_ERR_INVALID_ARG, "model range: %s is NULL", !m ? "the model" : !x ? "the input" : "the range");
  switch (m->cfg.kind) {
  case TDM_MODEL_GPT:
    return tdm_gpt_forward_range(m, tp, x, r);
  case TDM_MODEL_LLAMA:
    return tdm_llama_forward_range(m, tp, x, r);
  default:
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "model range: the %s model has no transformer blocks to run by range (gpt and llama do)",
                     tdm_model_kind_name(m->cfg.kind));
  }
}
