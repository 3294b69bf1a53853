/* A synthetic classification set: sample i is a pure function of (seed, first_index + i) — Gaussian features
 * from a counter hash — and its label is the argmax of a fixed random linear "teacher", so the
 * task is learnable, any size is free, and every rank generates the same sample for an index. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "train/data/dataset_impl.h"

#define TDM_SYNTH_MAX_CLASSES 1024

typedef struct {
  uint64_t seed, first; /* sample i is drawn from index first + i */
  float *teacher;       /* (features, classes) */
} synth;

/* Values ctr*2 and ctr*2+1 of a key's standard normal sequence: Box-Muller, both outputs of one
 * pair of uniforms, in float (the features are floats): generating a test set of 10,000 is the
 * cost of a short run's evaluation, so no log or cosine is wasted. */
static void gauss_pair(uint64_t key, uint64_t ctr, float *g0, float *g1) {
  uint64_t a = tdm_hash64(key, 2 * ctr), b = tdm_hash64(key, 2 * ctr + 1);
  float u1 = ((float)(a >> 40) + 1.0f) * (1.0f / 16777216.0f), u2 = (float)(b >> 40) * (1.0f / 16777216.0f);
  float r = sqrtf(-2.0f * logf(u1)), t = 6.2831853f * u2;
  *g0 = r * cosf(t);
  *g1 = r * sinf(t);
}

/* n values of the key's sequence into out */
static void gauss_fill(uint64_t key, float *out, int64_t n) {
  for (int64_t f = 0; f + 1 < n; f += 2) gauss_pair(key, (uint64_t)f / 2, out + f, out + f + 1);
  if (n % 2) {
    float spare;
    gauss_pair(key, (uint64_t)(n - 1) / 2, out + n - 1, &spare);
  }
}

static tdm_status synth_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y) {
  const synth *s = ds->impl;
  int64_t F = ds->sample_numel, C = ds->num_classes;
  for (int64_t i = 0; i < n; i++) {
    float *xi = x + i * F;
    uint64_t key = tdm_hash64(s->seed, s->first + (uint64_t)idx[i]);
    gauss_fill(key, xi, F);
    float v[TDM_SYNTH_MAX_CLASSES];
    for (int64_t k = 0; k < C; k++) v[k] = 0.0f; /* the classes in use, not the whole array, each sample */
    for (int64_t f = 0; f < F; f++) /* the classes' sums side by side: no chain of dependent adds */
      for (int64_t k = 0; k < C; k++) v[k] += s->teacher[f * C + k] * xi[f];
    int32_t best = 0;
    for (int64_t k = 1; k < C; k++)
      if (v[k] > v[best]) best = (int32_t)k;
    y[i] = best;
  }
  return TDM_OK;
}

static void synth_destroy(tdm_dataset *ds) {
  synth *s = ds->impl;
  tdm__free(s->teacher);
  tdm__free(s);
  tdm__free(ds);
}

static const tdm_dataset_vtable synth_vt = {"synthetic", synth_batch, synth_destroy};

tdm_status tdm_dataset_open_synthetic(tdm_dataset **out, int64_t n, int ndim, const int64_t *shape, int classes,
                                      uint64_t seed, uint64_t first_index) {
  if (!out || !shape)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_dataset_open_synthetic: %s is NULL", !out ? "out" : "the shape");
  if (n < 1 || ndim < 1 || ndim > 4 || classes < 2 || classes > TDM_SYNTH_MAX_CLASSES)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "synthetic data: %lld samples, %d axes, %d classes; expected >= 1, 1..4, 2..1024",
                          (long long)n, ndim, classes);
  int64_t F = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "synthetic data: axis %d is %lld", d, (long long)shape[d]);
    if (__builtin_mul_overflow(F, shape[d], &F) || F > ((int64_t)1 << 40) / (int64_t)sizeof(float) / classes)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "synthetic data: a sample of %lld+ features and %d classes: a teacher above 1 TiB",
                            (long long)F, classes);
  }
  tdm_dataset *ds = tdm__calloc(1, sizeof *ds);
  synth *s = tdm__calloc(1, sizeof *s);
  float *t = tdm__malloc(sizeof(float) * (size_t)(F * classes));
  if (!ds || !s || !t) {
    tdm__free(ds);
    tdm__free(s);
    tdm__free(t);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "synthetic data: out of memory");
  }
  s->seed = seed;
  s->first = first_index;
  gauss_fill(seed ^ 0x7eac4e5ull, t, F * classes);
  s->teacher = t;
  ds->vt = &synth_vt;
  ds->impl = s;
  ds->len = n;
  ds->num_classes = classes;
  ds->sample_ndim = ndim;
  memcpy(ds->sample_shape, shape, sizeof(int64_t) * (size_t)ndim);
  ds->sample_numel = F;
  *out = ds;
  return TDM_OK;
}
