/* ResNet with basic blocks and batch normalization, in torchvision's parameter names
 * (conv1, bn1, layer1.0.conv1, layer1.0.downsample.0, ..., fc) and initialisation (convs:
 * kaiming_normal_, mode fan_out, ReLU gain; BN: weight 1, bias 0; fc: nn.Linear's default).
 *
 * The BN running statistics are parameters with no gradient (decay 0), so weights files,
 * checkpoints and resharding carry them as PyTorch's state_dict does (num_batches_tracked is not
 * kept: with momentum set it changes nothing); the optimizer leaves them alone (their gradient is
 * always zero and weight decay skips them). Forward in training mode updates them in place. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "core/internal.h"
#include "nn/model_impl.h"

typedef struct {
  tdm_tensor *weight, *bias, *running_mean, *running_var;
} bn_mod;

typedef struct {
  tdm_tensor *conv1, *conv2, *down; /* down: the 1x1 projection, or NULL for the identity */
  bn_mod bn1, bn2, down_bn;
  int stride;
} basic_block;

struct tdm__resnet {
  tdm_tensor *conv1;
  bn_mod bn1;
  basic_block *blocks;
  int n_blocks;
  tdm_linear_mod fc;
};

#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f

tdm_status tdm_model_config_resnet(const char *name, int64_t width, tdm_model_config *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "resnet: out is NULL");
  tdm_model_config c = {0};
  c.kind = TDM_MODEL_RESNET;
  c.in_channels = 1, c.height = 28, c.width = 28, c.n_classes = 10;
  if (!name || !strcmp(name, "resnet20")) {
    c.n_stages = 3;
    c.stage_blocks[0] = c.stage_blocks[1] = c.stage_blocks[2] = 3;
    c.base_width = 16;
  } else if (!strcmp(name, "resnet18")) {
    c.n_stages = 4;
    for (int s = 0; s < 4; s++) c.stage_blocks[s] = 2;
    c.base_width = 64;
  } else {
    return tdm__set_error(TDM_ERR_INVALID_ARG, "resnet: config '%s'; expected resnet20 or resnet18", name);
  }
  if (width < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "resnet: width %lld; expected > 0 (0: the config's)", (long long)width);
  if (width > 0) c.base_width = width;
  *out = c;
  return TDM_OK;
}

tdm_status tdm__resnet_check(const tdm_model_config *c) {
  if (c->in_channels <= 0 || c->height < 1 || c->width < 1 || c->n_classes <= 0 || c->base_width <= 0 ||
      c->n_stages < 1 || c->n_stages > 4)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "resnet: input %lldx%lldx%lld, classes %lld, width %lld, %d stages; expected positive sizes and 1..4 stages",
                          (long long)c->in_channels, (long long)c->height, (long long)c->width, (long long)c->n_classes,
                          (long long)c->base_width, c->n_stages);
  for (int s = 0; s < c->n_stages; s++)
    if (c->stage_blocks[s] < 1 || c->stage_blocks[s] > 1000)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "resnet: stage %d has %lld blocks; expected 1..1000", s + 1,
                            (long long)c->stage_blocks[s]);
  if ((c->base_width << (c->n_stages - 1)) > (1 << 20))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "resnet: width %lld makes %lld channels in the last stage; expected at most 2^20",
                          (long long)c->base_width, (long long)(c->base_width << (c->n_stages - 1)));
  return TDM_OK;
}

static tdm_status declare(tdm_params *p, const char *prefix, const char *leaf, int ndim, const int64_t *shape, tdm_init init,
                          int decay, tdm_tensor **out) {
  char name[256];
  snprintf(name, sizeof name, "%s%s", prefix, leaf);
  return tdm_params_declare(p, name, ndim, shape, init, decay, out);
}

/* kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (Co k k)) */
static tdm_status conv(tdm_params *p, const char *prefix, int64_t ci, int64_t co, int k, tdm_tensor **out) {
  int64_t s[4] = {co, ci, k, k};
  return declare(p, prefix, ".weight", 4, s, (tdm_init){TDM_INIT_NORMAL, 0.0f, sqrtf(2.0f / (float)(co * k * k))}, 1, out);
}

static tdm_status bn(tdm_params *p, const char *prefix, int64_t c, bn_mod *m) {
  int64_t s[1] = {c};
  tdm_init one = {TDM_INIT_ONES, 0, 0}, zero = {TDM_INIT_ZEROS, 0, 0};
  TDM__TRY(declare(p, prefix, ".weight", 1, s, one, 0, &m->weight));
  TDM__TRY(declare(p, prefix, ".bias", 1, s, zero, 0, &m->bias));
  TDM__TRY(declare(p, prefix, ".running_mean", 1, s, zero, 0, &m->running_mean));
  return declare(p, prefix, ".running_var", 1, s, one, 0, &m->running_var);
}

tdm_status tdm__resnet_build(tdm_model *m) {
  const tdm_model_config *c = &m->cfg;
  tdm_params *p = m->params;
  struct tdm__resnet *r = tdm__calloc(1, sizeof *r);
  if (!r) return tdm__set_error(TDM_ERR_NO_MEMORY, "resnet: out of memory");
  m->resnet = r;
  for (int s = 0; s < c->n_stages; s++) r->n_blocks += (int)c->stage_blocks[s];
  if (!(r->blocks = tdm__calloc((size_t)r->n_blocks, sizeof *r->blocks))) return tdm__set_error(TDM_ERR_NO_MEMORY, "resnet: out of memory");
  int64_t w = c->base_width, in = w;
  TDM__TRY(conv(p, "conv1", c->in_channels, w, 3, &r->conv1));
  TDM__TRY(bn(p, "bn1", w, &r->bn1));
  char pre[96];
  for (int s = 0, k = 0; s < c->n_stages; s++) {
    int64_t out = w << s;
    for (int b = 0; b < c->stage_blocks[s]; b++, k++) {
      basic_block *bb = &r->blocks[k];
      bb->stride = s > 0 && b == 0 ? 2 : 1;
      snprintf(pre, sizeof pre, "layer%d.%d.conv1", s + 1, b);
      TDM__TRY(conv(p, pre, in, out, 3, &bb->conv1));
      snprintf(pre, sizeof pre, "layer%d.%d.bn1", s + 1, b);
      TDM__TRY(bn(p, pre, out, &bb->bn1));
      snprintf(pre, sizeof pre, "layer%d.%d.conv2", s + 1, b);
      TDM__TRY(conv(p, pre, out, out, 3, &bb->conv2));
      snprintf(pre, sizeof pre, "layer%d.%d.bn2", s + 1, b);
      TDM__TRY(bn(p, pre, out, &bb->bn2));
      if (bb->stride != 1 || in != out) {
        snprintf(pre, sizeof pre, "layer%d.%d.downsample.0", s + 1, b);
        TDM__TRY(conv(p, pre, in, out, 1, &bb->down));
        snprintf(pre, sizeof pre, "layer%d.%d.downsample.1", s + 1, b);
        TDM__TRY(bn(p, pre, out, &bb->down_bn));
      }
      in = out;
    }
  }
  return tdm_linear_mod_init(&r->fc, p, "fc", in, c->n_classes, 1);
}

void tdm__resnet_free(tdm_model *m) {
  if (!m->resnet) return;
  tdm__free(m->resnet->blocks);
  tdm__free(m->resnet);
  m->resnet = NULL;
}

static tdm_tensor *bn_fwd(tdm_tape *tp, const tdm_model *m, const bn_mod *b, tdm_tensor *x) {
  return tdm_batchnorm(tp, x, b->weight, b->bias, b->running_mean, b->running_var, BN_MOMENTUM, BN_EPS, m->bn_sync);
}
/* relu(bn(x)) in one op (bit for bit the two) */
static tdm_tensor *bn_relu(tdm_tape *tp, const tdm_model *m, const bn_mod *b, tdm_tensor *x) {
  return tdm_batchnorm_relu(tp, x, b->weight, b->bias, b->running_mean, b->running_var, BN_MOMENTUM, BN_EPS, m->bn_sync);
}

/* relu(bn(x) + r) in one op (bit for bit the two) */
static tdm_tensor *bn_add_relu(tdm_tape *tp, const tdm_model *m, const bn_mod *b, tdm_tensor *x, tdm_tensor *r) {
  return tdm_batchnorm_add_relu(tp, x, b->weight, b->bias, b->running_mean, b->running_var, BN_MOMENTUM, BN_EPS,
                                m->bn_sync, r);
}

tdm_tensor *tdm__resnet_forward(tdm_model *m, tdm_tape *tp, tdm_tensor *x) {
  const tdm_model_config *c = &m->cfg;
  const struct tdm__resnet *r = m->resnet;
  if (x->ndim != 4 || x->shape[1] != c->in_channels || x->shape[2] != c->height || x->shape[3] != c->width ||
      x->dtype != TDM_F32) {
    char b[96];
    return tdm__fail(tp, TDM_ERR_INVALID_ARG, "resnet: input is %s %s; expected (batch, %lld, %lld, %lld) f32",
                     tdm_shape_str(x->ndim, x->shape, b, sizeof b), tdm_dtype_name(x->dtype), (long long)c->in_channels,
                     (long long)c->height, (long long)c->width);
  }
  tdm_tensor *h = bn_relu(tp, m, &r->bn1, tdm_conv2d(tp, x, r->conv1, NULL, 1, 1));
  for (int k = 0; k < r->n_blocks; k++) {
    const basic_block *bb = &r->blocks[k];
    tdm_tensor *o = bn_relu(tp, m, &bb->bn1, tdm_conv2d(tp, h, bb->conv1, NULL, bb->stride, 1));
    o = tdm_conv2d(tp, o, bb->conv2, NULL, 1, 1);
    tdm_tensor *sc = bb->down ? bn_fwd(tp, m, &bb->down_bn, tdm_conv2d(tp, h, bb->down, NULL, bb->stride, 0)) : h;
    h = bn_add_relu(tp, m, &bb->bn2, o, sc); /* relu(bn2(o) + sc) */
  }
  return tdm_linear_mod_forward(tp, &r->fc, tdm_global_avgpool2d(tp, h));
}
