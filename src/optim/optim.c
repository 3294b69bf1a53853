/* SGD, Adam and AdamW over the contiguous parameter buffer, following torch.optim's update
 * rules step for step, in one parallel pass whose ranges walk the parameter spans (weight decay
 * can differ per span). */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "nn/params_impl.h"
#include "tandem/optim.h"

static const char *kind_names[] = {"sgd", "adam", "adamw"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == TDM_OPT_KIND_COUNT, "one name per optimizer");

const char *tdm_optim_kind_name(tdm_optim_kind k) { return (unsigned)k < TDM_OPT_KIND_COUNT ? kind_names[k] : "?"; }

/* A run: consecutive elements of one owned span with one weight decay. Runs are laid end to end
 * in the optimizer's own index space [0, n_owned), which is also how its state is laid out. */
typedef struct {
  int64_t lo, hi;  /* global element offsets in the parameter buffer */
  int64_t at;      /* offset in the owned index space (and in each state buffer) */
  int span;        /* which owned span */
  unsigned char decay;
} run;

typedef struct {
  int64_t lo, hi;
  float *w;        /* NULL: the parameters' own buffer at lo */
  const float *g;  /* NULL: the parameters' gradient buffer at lo (looked up at each step: it can move) */
} span;

struct tdm_optim {
  tdm_optim_config cfg;
  tdm_params *p;
  float *state;
  int64_t n_state, n_owned;
  int64_t steps;
  int n_owned_spans, n_runs;
  span *spans;
  run *runs;
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
  if (!params) return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: NULL argument");
  tdm_optim_span all = {0, tdm_params_numel(params)};
  return tdm_optim_create_spans(out, cfg, params, 1, &all);
}

tdm_status tdm_optim_create_spans(tdm_optim **out, const tdm_optim_config *cfg, tdm_params *params, int n_spans,
                                  const tdm_optim_span *spans) {
  if (!out || !cfg || !params || (n_spans > 0 && !spans) || n_spans < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: NULL argument or %d spans", n_spans);
  *out = NULL;
  if ((unsigned)cfg->kind >= TDM_OPT_KIND_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: unknown optimizer %d", (int)cfg->kind);
  /* finite too: an lr of inf turned every parameter NaN in the first step, which succeeded */
  if (!(cfg->lr >= 0.0f && isfinite(cfg->lr)) || !(cfg->weight_decay >= 0.0f && isfinite(cfg->weight_decay)) ||
      !(cfg->momentum >= 0.0f && isfinite(cfg->momentum)) || !(cfg->dampening >= 0.0f && cfg->dampening <= 1.0f) ||
      !(cfg->beta1 >= 0.0f) || !(cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f) || !(cfg->beta2 < 1.0f) ||
      !(cfg->eps >= 0.0f && isfinite(cfg->eps)))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "optim_create: lr %g, weight_decay %g, momentum %g, dampening %g, betas (%g, %g), eps %g; expected lr, "
                          "decay, momentum, eps finite and >= 0, dampening in [0, 1] and betas in [0, 1)",
                          (double)cfg->lr, (double)cfg->weight_decay, (double)cfg->momentum, (double)cfg->dampening,
                          (double)cfg->beta1, (double)cfg->beta2, (double)cfg->eps);
  if (cfg->nesterov && (cfg->momentum <= 0.0f || cfg->dampening != 0.0f))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_create: nesterov needs momentum > 0 and dampening 0 (got %g, %g)",
                          (double)cfg->momentum, (double)cfg->dampening);
  int64_t numel = tdm_params_numel(params), owned = 0;
  for (int i = 0; i < n_spans; i++) {
    if (spans[i].lo < 0 || spans[i].hi < spans[i].lo || spans[i].hi > numel || (i > 0 && spans[i].lo < spans[i - 1].hi))
      return tdm__set_error(TDM_ERR_INVALID_ARG,
                            "optim_create: span %d is [%lld, %lld); expected ascending, disjoint spans within [0, %lld)", i,
                            (long long)spans[i].lo, (long long)spans[i].hi, (long long)numel);
    owned += spans[i].hi - spans[i].lo;
  }
  tdm_optim *o = tdm__calloc(1, sizeof *o);
  if (!o) return tdm__set_error(TDM_ERR_NO_MEMORY, "optim_create: out of memory");
  o->cfg = *cfg;
  o->p = params;
  o->n_owned = owned;
  o->n_owned_spans = n_spans;
  int np = tdm_params_count(params);
  o->spans = tdm__calloc((size_t)(n_spans ? n_spans : 1), sizeof *o->spans);
  o->runs = tdm__calloc((size_t)(n_spans + np + 1), sizeof *o->runs); /* each parameter start splits at most once */
  if (!o->spans || !o->runs) {
    tdm_optim_destroy(o);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "optim_create: out of memory");
  }
  int64_t at = 0;
  for (int i = 0, k = 0; i < n_spans; i++) {
    o->spans[i] = (span){spans[i].lo, spans[i].hi, NULL, NULL};
    /* cut the span where weight decay changes: at parameter starts */
    for (int64_t lo = spans[i].lo; lo < spans[i].hi;) {
      while (k + 1 < np && tdm_params_offset(params, k + 1) <= lo) k++;
      while (k > 0 && tdm_params_offset(params, k) > lo) k--;
      int64_t end = k + 1 < np ? tdm_params_offset(params, k + 1) : numel;
      if (end > spans[i].hi) end = spans[i].hi;
      unsigned char decay = (unsigned char)(!cfg->decay_matrices_only || tdm_params_decay(params, k));
      run *prev = o->n_runs ? &o->runs[o->n_runs - 1] : NULL;
      if (prev && prev->span == i && prev->decay == decay && prev->hi == lo) prev->hi = end;
      else o->runs[o->n_runs++] = (run){lo, end, at, i, decay};
      at += end - lo;
      lo = end;
    }
  }
  o->n_state = cfg->kind == TDM_OPT_SGD ? (cfg->momentum > 0.0f ? owned : 0) : 2 * owned;
  if (o->n_state) {
    o->state = tdm__aligned_alloc_cat(sizeof(float) * (size_t)o->n_state, TDM_MEM_OPTIM);
    if (!o->state) {
      tdm_optim_destroy(o);
      return tdm__set_error(TDM_ERR_NO_MEMORY, "optim_create: cannot allocate %lld state floats", (long long)o->n_state);
    }
    memset(o->state, 0, sizeof(float) * (size_t)o->n_state);
  }
  *out = o;
  return TDM_OK;
}

tdm_status tdm_optim_set_span_buffers(tdm_optim *o, int i, float *w, const float *g) {
  if (!o) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_optim_set_span_buffers: the optimizer is NULL");
  if (i < 0 || i >= o->n_owned_spans)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_set_span_buffers: span %d of %d", i, o ? o->n_owned_spans : 0);
  o->spans[i].w = w;
  o->spans[i].g = g;
  return TDM_OK;
}

int64_t tdm_optim_owned(const tdm_optim *o) {
  TDM__NONNULL(o, 0, "tdm_optim_owned: the optimizer is NULL");
  return o->n_owned;
}

void tdm_optim_destroy(tdm_optim *o) {
  if (!o) return;
  tdm__free(o->spans);
  tdm__free(o->runs);
  tdm__free(o->state);
  tdm__free(o);
}

int64_t tdm_optim_steps(const tdm_optim *o) {
  TDM__NONNULL(o, -1, "tdm_optim_steps: the optimizer is NULL");
  return o->steps;
}
const tdm_optim_config *tdm_optim_get_config(const tdm_optim *o) {
  TDM__NONNULL(o, NULL, "tdm_optim_get_config: the optimizer is NULL");
  return &o->cfg;
}
float *tdm_optim_state(const tdm_optim *o, int64_t *n) {
  if (n) *n = o ? o->n_state : 0;
  TDM__NONNULL(o, NULL, "tdm_optim_state: the optimizer is NULL");
  return o->state;
}
void tdm_optim_set_steps(tdm_optim *o, int64_t steps) {
  TDM__NONNULL(o, , "tdm_optim_set_steps: the optimizer is NULL");
  o->steps = steps;
}

typedef struct {
  const tdm_optim *o;
  float *w, *s1, *s2;
  const float *g;
  float lr, wd, bc1, bc2_sqrt;
  int first;
} span_ctx;

/* The kernels index w and g from the run's start and the state from the run's owned offset;
 * the pointers passed are already shifted so that one index i serves all four. */
static void adam_range(const span_ctx *c, int64_t i0, int64_t i1) {
  const tdm_optim_config *k = &c->o->cfg;
  float *restrict w = c->w, *restrict m = c->s1, *restrict v = c->s2;
  const float *restrict g = c->g;
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

static void sgd_range(const span_ctx *c, int64_t i0, int64_t i1) {
  const tdm_optim_config *k = &c->o->cfg;
  float *restrict w = c->w, *restrict buf = c->s1;
  const float *restrict g = c->g;
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

/* [i0, i1) of the owned index space: walks the runs it covers. */
static void step_range(void *vc, int64_t i0, int64_t i1) {
  const span_ctx *base = vc;
  const tdm_optim *o = base->o;
  float *pw = tdm_params_data(o->p), *pg = tdm_params_grad(o->p);
  for (int r = 0; r < o->n_runs; r++) {
    const run *u = &o->runs[r];
    int64_t n = u->hi - u->lo, b = i0 > u->at ? i0 - u->at : 0, e = i1 - u->at < n ? i1 - u->at : n;
    if (b >= e) continue;
    const span *sp = &o->spans[u->span];
    span_ctx c = *base;
    c.wd = u->decay ? o->cfg.weight_decay : 0.0f;
    c.w = (sp->w ? sp->w + (u->lo - sp->lo) : pw + u->lo);
    c.g = (sp->g ? sp->g + (u->lo - sp->lo) : pg + u->lo);
    c.s1 = o->state ? o->state + u->at : NULL;
    c.s2 = o->state && o->cfg.kind != TDM_OPT_SGD ? o->state + o->n_owned + u->at : NULL;
    if (o->cfg.kind == TDM_OPT_SGD) sgd_range(&c, b, e);
    else adam_range(&c, b, e);
  }
}

tdm_status tdm_optim_step(tdm_optim *o, float lr) {
  if (!o) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_optim_step: the optimizer is NULL");
  if (!(lr >= 0.0f)) return tdm__set_error(TDM_ERR_INVALID_ARG, "optim_step: learning rate %g; expected >= 0", (double)lr);
  o->steps++;
  span_ctx c = {o, NULL, NULL, NULL, NULL, lr, 0, 1, 1, o->steps == 1};
  if (o->cfg.kind != TDM_OPT_SGD) {
    c.bc1 = 1.0f - powf(o->cfg.beta1, (float)o->steps);
    c.bc2_sqrt = sqrtf(1.0f - powf(o->cfg.beta2, (float)o->steps));
  }
  /* one pass over the owned elements on the pool; each range walks the runs it covers */
  tdm_parallel_for(o->n_owned, 65536, step_range, &c);
  return TDM_OK;
}

/* ---- the gradient norm, the same bits for every layout ----------------------------------------
 * The buffer is cut into segments at every parameter start and every multiple of a length that
 * depends on the parameter count alone; a segment's sum of squares is formed in double, in eight
 * lanes, in one fixed order; the segments' sums are added in index order. Whether one process
 * holds all gradients or each rank a shard made of whole segments, every term is computed the
 * same way and added in the same order, so the norm and hence clipping agree bit for bit. */
typedef struct {
  const float *g; /* the gradients of [seg_lo[s0], ...) */
  const int64_t *seg_lo;
  int64_t s0;
  double *out;
} sumsq_ctx;

static void sumsq_range(void *vc, int64_t a, int64_t b) {
  sumsq_ctx *c = vc;
  for (int64_t s = c->s0 + a; s < c->s0 + b; s++) {
    int64_t lo = c->seg_lo[s] - c->seg_lo[c->s0], hi = c->seg_lo[s + 1] - c->seg_lo[c->s0];
    double acc[8] = {0};
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8)
      for (int k = 0; k < 8; k++) acc[k] += (double)c->g[i + k] * c->g[i + k];
    for (; i < hi; i++) acc[0] += (double)c->g[i] * c->g[i];
    c->out[s] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

tdm_status tdm_grad_sumsq_segments(const tdm_params *p, int64_t lo, int64_t hi, const float *g, double *sums) {
  if (!p || !g || !sums)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_grad_sumsq_segments: %s is NULL",
                          !p ? "the parameters p" : !g ? "g" : "sums");
  const int64_t *seg;
  int64_t n;
  TDM__TRY(tdm__params_segments(p, &seg, &n));
  int64_t s0 = tdm__params_segment_at(p, lo), s1 = tdm__params_segment_at(p, hi);
  if (s0 < 0 || s1 < 0 || s1 < s0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "grad_sumsq: [%lld, %lld) does not start and end on segment boundaries",
                          (long long)lo, (long long)hi);
  sumsq_ctx c = {g, seg, s0, sums};
  tdm_parallel_for(s1 - s0, 1, sumsq_range, &c);
  (void)n;
  return TDM_OK;
}

double tdm_grad_sumsq_combine(const double *sums, int64_t n) {
  if (n > 0) TDM__NONNULL(sums, NAN, "tdm_grad_sumsq_combine: sums is NULL");
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += sums[i];
  return s;
}

float tdm_clip_coef(float norm, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;
  float coef = max_norm / (norm + 1e-6f);
  return coef < 1.0f ? coef : 1.0f;
}

typedef struct {
  float *g, coef;
} scale_ctx;

static void scale_range(void *vc, int64_t b, int64_t e) {
  scale_ctx *c = vc;
  for (int64_t i = b; i < e; i++) c->g[i] *= c->coef;
}

void tdm_grad_scale(float *g, int64_t n, float coef) {
  if (coef == 1.0f || n <= 0) return;
  TDM__NONNULL(g, , "tdm_grad_scale: g is NULL");
  scale_ctx c = {g, coef};
  tdm_parallel_for(n, 65536, scale_range, &c);
}

tdm_status tdm_clip_grad_norm(tdm_params *p, float max_norm, float *norm_out) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_clip_grad_norm: the parameters p are NULL");
  const int64_t *seg;
  int64_t n;
  TDM__TRY(tdm__params_segments(p, &seg, &n));
  double *sums = tdm__params_segment_sums(p);
  TDM__TRY(tdm_grad_sumsq_segments(p, 0, tdm_params_numel(p), tdm_params_grad(p), sums));
  float norm = (float)sqrt(tdm_grad_sumsq_combine(sums, n));
  if (norm_out) *norm_out = norm;
  if (!isfinite(norm))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "clip_grad_norm: the gradient norm is %g (a NaN or Inf gradient)",
                          (double)norm);
  tdm_grad_scale(tdm_params_grad(p), tdm_params_numel(p), tdm_clip_coef(norm, max_norm));
  return TDM_OK;
}

tdm_status tdm_params_segments(const tdm_params *p, const int64_t **cuts, int64_t *n) {
  if (!p || !cuts || !n)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_segments: %s is NULL", !p ? "the parameters p" : !cuts ? "cuts" : "n");
  return tdm__params_segments(p, cuts, n);
}
