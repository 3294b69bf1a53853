/* SGD, Adam and AdamW over the contiguous parameter buffer, following torch.optim's update
 * rules step for step, in one parallel pass whose ranges walk the parameter spans (weight decay
 * can differ per span). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/optim.h"

static const char *kind_names[] = {"sgd", "adam", "adamw"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == TDM_OPT_KIND_COUNT, "one name per optimizer");

const char *tdm_optim_kind_name(tdm_optim_kind k) { return (unsigned)k < TDM_OPT_KIND_COUNT ? kind_names[k] : "?"; }

struct tdm_optim {
  tdm_optim_config cfg;
  tdm_params *p;
  float *state;
  int64_t n_state;
  int64_t steps;
  /* runs of consecutive parameters with the same weight decay: [lo[s], lo[s + 1]) */
  int n_spans;
  int64_t *span_lo;
  unsigned char *span_decay;
};

tdm_optim_config tdm_optim_config_default(tdm_optim_kind kind) {
  tdm_optim_config c = {0};
  c.kind = kind;
  c.lr = kind == TDM_OPT_SGD ? 0.01f : 1e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.eps = 1e-8f;
  c.weight_decay = kind == TDM_OPT_ADAMW ? 0.01f : 0.0f;
  return c;
}

tdm_status tdm_optim_create(tdm_optim **out, const tdm_optim_config *cfg, tdm_params *params) {
  if (!out || !cfg || !params) return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: NULL argument");
  if ((unsigned)cfg->kind >= TDM_OPT_KIND_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: unknown optimizer %d", (int)cfg->kind);
  if (!(cfg->lr >= 0.0f) || !(cfg->weight_decay >= 0.0f) || !(cfg->momentum >= 0.0f) || !(cfg->beta1 >= 0.0f) ||
      !(cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f) || !(cfg->beta2 < 1.0f) || !(cfg->eps >= 0.0f))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "optim_create: lr %g, weight_decay %g, momentum %g, betas (%g, %g), eps %g; expected lr, "
                          "decay, momentum, eps >= 0 and betas in [0, 1)",
                          (double)cfg->lr, (double)cfg->weight_decay, (double)cfg->momentum, (double)cfg->beta1,
                          (double)cfg->beta2, (double)cfg->eps);
  if (cfg->nesterov && (cfg->momentum <= 0.0f || cfg->dampening != 0.0f))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: nesterov needs momentum > 0 and dampening 0 (got %g, %g)",
                          (double)cfg->momentum, (double)cfg->dampening);
  tdm_optim *o = tdm__calloc(1, sizeof *o);
  if (!o) return tdm__set_error(TDM_ERR_NO_MEMORY, "optim_create: out of memory");
  o->cfg = *cfg;
  o->p = params;
  int64_t n = tdm_params_numel(params);
  o->n_state = cfg->kind == TDM_OPT_SGD ? (cfg->momentum > 0.0f ? n : 0) : 2 * n;
  if (o->n_state) {
    o->state = tdm__aligned_alloc(sizeof(float) * (size_t)o->n_state);
    if (!o->state) {
      tdm__free(o);
      return tdm__set_error(TDM_ERR_NO_MEMORY, "optim_create: cannot allocate %lld state floats", (long long)o->n_state);
    }
    memset(o->state, 0, sizeof(float) * (size_t)o->n_state);
  }
  int np = tdm_params_count(params);
  o->span_lo = tdm__calloc((size_t)np + 1, sizeof *o->span_lo);
  o->span_decay = tdm__calloc((size_t)np + 1, 1);
  if (!o->span_lo || !o->span_decay) {
    tdm_optim_destroy(o);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "optim_create: out of memory");
  }
  for (int i = 0; i < np; i++) {
    int decay = !cfg->decay_matrices_only || tdm_params_decay(params, i);
    if (o->n_spans == 0 || o->span_decay[o->n_spans - 1] != decay) {
      o->span_lo[o->n_spans] = tdm_params_offset(params, i);
      o->span_decay[o->n_spans++] = (unsigned char)decay;
    }
  }
  o->span_lo[o->n_spans] = n;
  *out = o;
  return TDM_OK;
}

void tdm_optim_destroy(tdm_optim *o) {
  if (!o) return;
  tdm__free(o->span_lo);
  tdm__free(o->span_decay);
  tdm__free(o->state);
  tdm__free(o);
}

int64_t tdm_optim_steps(const tdm_optim *o) { return o->steps; }
float *tdm_optim_state(const tdm_optim *o, int64_t *n) {
  if (n) *n = o->n_state;
  return o->state;
}
void tdm_optim_set_steps(tdm_optim *o, int64_t steps) { o->steps = steps; }

typedef struct {
  const tdm_optim *o;
  float *w, *g, *s1, *s2;
  float lr, wd, bc1, bc2_sqrt;
  int first;
} span_ctx;

static void adam_range(void *vc, int64_t i0, int64_t i1) {
  span_ctx *c = vc;
  const tdm_optim_config *k = &c->o->cfg;
  float *restrict w = c->w, *restrict g = c->g, *restrict m = c->s1, *restrict v = c->s2;
  float b1 = k->beta1, b2 = k->beta2, eps = k->eps, step = c->lr / c->bc1, inv_bc2s = 1.0f / c->bc2_sqrt;
  float l2 = k->kind == TDM_OPT_ADAM ? c->wd : 0.0f;
  float shrink = k->kind == TDM_OPT_ADAMW ? 1.0f - c->lr * c->wd : 1.0f;
  for (int64_t i = i0; i < i1; i++) {
    float gi = g[i] + l2 * w[i];
    float mi = m[i] = b1 * m[i] + (1.0f - b1) * gi;
    float vi = v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    /* torch divides by bias_correction2's root; a multiply by its inverse is one division less
     * per parameter (AdamW is compute-bound on one core) and differs by at most an ulp */
    w[i] = w[i] * shrink - step * mi / (sqrtf(vi) * inv_bc2s + eps);
  }
}

static void sgd_range(void *vc, int64_t i0, int64_t i1) {
  span_ctx *c = vc;
  const tdm_optim_config *k = &c->o->cfg;
  float *restrict w = c->w, *restrict g = c->g, *restrict buf = c->s1;
  float mom = k->momentum, damp = 1.0f - k->dampening, wd = c->wd, lr = c->lr;
  for (int64_t i = i0; i < i1; i++) {
    float d = g[i] + wd * w[i];
    if (buf) {
      buf[i] = c->first ? d : mom * buf[i] + damp * d; /* torch starts the buffer at the gradient */
      d = k->nesterov ? d + mom * buf[i] : buf[i];
    }
    w[i] -= lr * d;
  }
}

static void step_range(void *vc, int64_t i0, int64_t i1) {
  span_ctx c = *(const span_ctx *)vc;
  const tdm_optim *o = c.o;
  for (int s = 0; s < o->n_spans; s++) {
    int64_t b = o->span_lo[s] > i0 ? o->span_lo[s] : i0, e = o->span_lo[s + 1] < i1 ? o->span_lo[s + 1] : i1;
    if (b >= e) continue;
    c.wd = o->span_decay[s] ? o->cfg.weight_decay : 0.0f;
    if (o->cfg.kind == TDM_OPT_SGD) sgd_range(&c, b, e);
    else adam_range(&c, b, e);
  }
}

tdm_status tdm_optim_step(tdm_optim *o, float lr) {
  if (!(lr >= 0.0f)) return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_step: learning rate %g; expected >= 0", (double)lr);
  o->steps++;
  tdm_params *p = o->p;
  int64_t N = tdm_params_numel(p);
  float *w = tdm_params_data(p), *g = tdm_params_grad(p);
  span_ctx c = {o, 0, 0, 0, 0, lr, 0, 1, 1, o->steps == 1};
  if (o->cfg.kind != TDM_OPT_SGD) {
    c.bc1 = 1.0f - powf(o->cfg.beta1, (float)o->steps);
    c.bc2_sqrt = sqrtf(1.0f - powf(o->cfg.beta2, (float)o->steps));
  }
  /* One pass over the whole buffer on the pool; each range walks the decay spans it covers. */
  c.w = w, c.g = g;
  c.s1 = o->state;
  c.s2 = o->state && o->cfg.kind != TDM_OPT_SGD ? o->state + N : NULL;
  tdm_parallel_for(N, 65536, step_range, &c);
  return TDM_OK;
}

typedef struct {
  const float *g;
  int64_t n, chunk;
  double *part;
} sumsq_ctx;

/* Sum of squares of fixed-size chunks, each in eight double lanes: the chunking depends only on
 * n, so the norm is the same for every thread count. */
static void sumsq_range(void *vc, int64_t c0, int64_t c1) {
  sumsq_ctx *c = vc;
  for (int64_t ch = c0; ch < c1; ch++) {
    int64_t b = ch * c->chunk, e = b + c->chunk < c->n ? b + c->chunk : c->n;
    double acc[8] = {0};
    int64_t i = b;
    for (; i + 8 <= e; i += 8)
      for (int k = 0; k < 8; k++) acc[k] += (double)c->g[i + k] * c->g[i + k];
    for (; i < e; i++) acc[0] += (double)c->g[i] * c->g[i];
    c->part[ch] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

typedef struct {
  float *g, coef;
} scale_ctx;

static void scale_range(void *vc, int64_t b, int64_t e) {
  scale_ctx *c = vc;
  for (int64_t i = b; i < e; i++) c->g[i] *= c->coef;
}

tdm_status tdm_clip_grad_norm(tdm_params *p, float max_norm, float *norm_out) {
  enum { MAX_CHUNKS = 1024 };
  double part[MAX_CHUNKS];
  int64_t n = tdm_params_numel(p);
  int64_t chunk = n / MAX_CHUNKS + 1 > 16384 ? n / MAX_CHUNKS + 1 : 16384;
  sumsq_ctx sc = {tdm_params_grad(p), n, chunk, part};
  int64_t n_chunks = (n + chunk - 1) / chunk;
  tdm_parallel_for(n_chunks, 1, sumsq_range, &sc);
  double s = 0.0;
  for (int64_t ch = 0; ch < n_chunks; ch++) s += part[ch];
  float norm = (float)sqrt(s);
  if (norm_out) *norm_out = norm;
  if (!isfinite(norm))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "clip_grad_norm: the gradient norm is %g (a NaN or Inf gradient)",
                          (double)norm);
  if (max_norm > 0.0f) {
    float coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) {
      scale_ctx c = {tdm_params_grad(p), coef};
      tdm_parallel_for(n, 65536, scale_range, &c);
    }
  }
  return TDM_OK;
}
