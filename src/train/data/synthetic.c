/* A synthetic classification set: sample i is a pure function of (seed, first_index + i) — Gaussian features
 * from a counter hash — and its label is the argmax of a fixed random linear "teacher", so the
 * task is learnable, any size is free, and every rank generates the same sample for an index. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "train/data/dataset_impl.h"

typedef struct {
  uint64_t seed, first; /* sample i is drawn from index first + i */
  float *teacher;       /* (classes, features) */
} synth;

static float gauss(uint64_t key, uint64_t ctr) {
  uint64_t a = tdm_hash64(key, 2 * ctr), b = tdm_hash64(key, 2 * ctr + 1);
  double u1 = ((double)(a >> 11) + 1.0) / 9007199254740993.0, u2 = (double)(b >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static tdm_status synth_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y) {
  const synth *s = ds->impl;
  int64_t F = ds->sample_numel, C = ds->num_classes;
  for (int64_t i = 0; i < n; i++) {
    float *xi = x + i * F;
    uint64_t key = tdm_hash64(s->seed, s->first + (uint64_t)idx[i]);
    for (int64_t f = 0; f < F; f++) xi[f] = gauss(key, (uint64_t)f);
    int32_t best = 0;
    float best_v = -INFINITY;
    for (int64_t k = 0; k < C; k++) {
      float v = 0;
      for (int64_t f = 0; f < F; f++) v += s->teacher[k * F + f] * xi[f];
      if (v > best_v) best_v = v, best = (int32_t)k;
    }
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
  if (!out || n < 1 || ndim < 1 || ndim > 4 || classes < 2)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "synthetic data: %lld samples, %d axes, %d classes; expected >= 1, 1..4, >= 2",
                          (long long)n, ndim, classes);
  int64_t F = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "synthetic data: axis %d is %lld", d, (long long)shape[d]);
    F *= shape[d];
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
  for (int64_t k = 0; k < F * classes; k++) t[k] = gauss(seed ^ 0x7eac4e5ull, (uint64_t)k);
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
