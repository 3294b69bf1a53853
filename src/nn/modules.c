/* Modules: declare their parameters with PyTorch's (or GPT-2's) initialisation, and run forward
 * through the autograd ops. */
#include <math.h>
#include <stdio.h>

#include "autograd/tape_impl.h"
#include "core/internal.h"
#include "tandem/nn.h"

/* The module inits' NULL check: m is written to, prefix names every parameter. */
#define NONNULL_MP(fn) \
  if (!m || !prefix) return tdm__set_error(TDM_ERR_INVALID_ARG, fn ": %s is NULL", !m ? "the module m" : "the prefix")
/* The forwards' check of m; tdm__fail with a NULL tape sets only the thread's error. */
#define NONNULL_M(fn) \
  if (!m) return tdm__fail(tp, TDM_ERR_INVALID_ARG, fn ": the module m is NULL")

static tdm_status declare(tdm_params *p, const char *prefix, const char *leaf, int ndim, const int64_t *shape,
                          tdm_init init, int decay, tdm_tensor **out) {
  char name[256];
  if ((size_t)snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", leaf) >= sizeof name)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "parameter name '%s.%s' is longer than 255 bytes", prefix, leaf);
  return tdm_params_declare(p, name, ndim, shape, init, decay, out);
}

tdm_status tdm__linear_mod_init_with(tdm_linear_mod *m, tdm_params *p, const char *prefix, int64_t in, int64_t out,
                                     int bias, tdm_init winit, tdm_init binit) {
  int64_t ws[2] = {out, in}, bs[1] = {out};
  TDM__TRY(declare(p, prefix, "weight", 2, ws, winit, 1, &m->weight));
  m->bias = NULL;
  if (bias) TDM__TRY(declare(p, prefix, "bias", 1, bs, binit, 0, &m->bias));
  return TDM_OK;
}

tdm_status tdm_linear_mod_init(tdm_linear_mod *m, tdm_params *p, const char *prefix, int64_t in, int64_t out,
                               int bias) {
  NONNULL_MP("tdm_linear_mod_init");
  /* kaiming_uniform(a = sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
  float bound = in > 0 ? 1.0f / sqrtf((float)in) : 0.0f;
  tdm_init u = {TDM_INIT_UNIFORM, -bound, bound};
  return tdm__linear_mod_init_with(m, p, prefix, in, out, bias, u, u);
}

tdm_tensor *tdm_linear_mod_forward(tdm_tape *tp, const tdm_linear_mod *m, tdm_tensor *x) {
  NONNULL_M("tdm_linear_mod_forward");
  return tdm_linear(tp, x, m->weight, m->bias);
}

tdm_status tdm_conv2d_mod_init(tdm_conv2d_mod *m, tdm_params *p, const char *prefix, int64_t ci, int64_t co, int k,
                               int stride, int pad) {
  NONNULL_MP("tdm_conv2d_mod_init");
  float bound = 1.0f / sqrtf((float)(ci * k * k));
  tdm_init u = {TDM_INIT_UNIFORM, -bound, bound};
  int64_t ws[4] = {co, ci, k, k}, bs[1] = {co};
  TDM__TRY(declare(p, prefix, "weight", 4, ws, u, 1, &m->weight));
  TDM__TRY(declare(p, prefix, "bias", 1, bs, u, 0, &m->bias));
  m->stride = stride;
  m->pad = pad;
  return TDM_OK;
}

tdm_tensor *tdm_conv2d_mod_forward(tdm_tape *tp, const tdm_conv2d_mod *m, tdm_tensor *x) {
  NONNULL_M("tdm_conv2d_mod_forward");
  return tdm_conv2d(tp, x, m->weight, m->bias, m->stride, m->pad);
}

tdm_status tdm_embedding_mod_init(tdm_embedding_mod *m, tdm_params *p, const char *prefix, int64_t v, int64_t c,
                                  float std) {
  NONNULL_MP("tdm_embedding_mod_init");
  int64_t s[2] = {v, c};
  return declare(p, prefix, "weight", 2, s, (tdm_init){TDM_INIT_NORMAL, 0.0f, std}, 1, &m->weight);
}

tdm_status tdm_layernorm_mod_init(tdm_layernorm_mod *m, tdm_params *p, const char *prefix, int64_t c) {
  NONNULL_MP("tdm_layernorm_mod_init");
  int64_t s[1] = {c};
  TDM__TRY(declare(p, prefix, "weight", 1, s, (tdm_init){TDM_INIT_ONES, 0, 0}, 0, &m->weight));
  TDM__TRY(declare(p, prefix, "bias", 1, s, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &m->bias));
  m->eps = 1e-5f;
  return TDM_OK;
}

tdm_tensor *tdm_layernorm_mod_forward(tdm_tape *tp, const tdm_layernorm_mod *m, tdm_tensor *x) {
  NONNULL_M("tdm_layernorm_mod_forward");
  return tdm_layernorm(tp, x, m->weight, m->bias, m->eps);
}

tdm_status tdm_block_mod_init(tdm_block_mod *m, tdm_params *p, const char *prefix, int64_t c, int n_head,
                              int n_layer, float dropout) {
  NONNULL_MP("tdm_block_mod_init");
  char name[200];
  tdm_init w = {TDM_INIT_NORMAL, 0.0f, 0.02f}, z = {TDM_INIT_ZEROS, 0, 0};
  /* GPT-2 scales the residual projections by 1/sqrt(2 n_layer) */
  tdm_init wp = {TDM_INIT_NORMAL, 0.0f, 0.02f / sqrtf(2.0f * (float)n_layer)};
#define SUB(s) (snprintf(name, sizeof name, "%s.%s", prefix, s), name)
  TDM__TRY(tdm_layernorm_mod_init(&m->ln_1, p, SUB("ln_1"), c));
  TDM__TRY(tdm__linear_mod_init_with(&m->c_attn, p, SUB("attn.c_attn"), c, 3 * c, 1, w, z));
  TDM__TRY(tdm__linear_mod_init_with(&m->attn_proj, p, SUB("attn.c_proj"), c, c, 1, wp, z));
  TDM__TRY(tdm_layernorm_mod_init(&m->ln_2, p, SUB("ln_2"), c));
  TDM__TRY(tdm__linear_mod_init_with(&m->c_fc, p, SUB("mlp.c_fc"), c, 4 * c, 1, w, z));
  TDM__TRY(tdm__linear_mod_init_with(&m->mlp_proj, p, SUB("mlp.c_proj"), 4 * c, c, 1, wp, z));
#undef SUB
  m->n_head = n_head;
  m->dropout = dropout;
  return TDM_OK;
}

tdm_tensor *tdm_block_mod_forward(tdm_tape *tp, const tdm_block_mod *m, tdm_tensor *x) {
  NONNULL_M("tdm_block_mod_forward");
  tdm_tensor *h = tdm_layernorm_mod_forward(tp, &m->ln_1, x);
  h = tdm_attention(tp, tdm_linear_mod_forward(tp, &m->c_attn, h), m->n_head);
  h = tdm_dropout(tp, tdm_linear_mod_forward(tp, &m->attn_proj, h), m->dropout);
  x = tdm_add(tp, x, h);
  h = tdm_gelu(tp, tdm_linear_mod_forward(tp, &m->c_fc, tdm_layernorm_mod_forward(tp, &m->ln_2, x)));
  h = tdm_dropout(tp, tdm_linear_mod_forward(tp, &m->mlp_proj, h), m->dropout);
  return tdm_add(tp, x, h);
}
