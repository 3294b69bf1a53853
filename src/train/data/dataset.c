/* The data-set interface, and the IDX image-classification reader behind it. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "train/data/dataset_impl.h"

void tdm_dataset_destroy(tdm_dataset *ds) {
  if (ds) ds->vt->destroy(ds);
}
int64_t tdm_dataset_len(const tdm_dataset *ds) {
  TDM__NONNULL(ds, 0, "tdm_dataset_len: the data set is NULL");
  return ds->len;
}
int tdm_dataset_num_classes(const tdm_dataset *ds) {
  TDM__NONNULL(ds, 0, "tdm_dataset_num_classes: the data set is NULL");
  return ds->num_classes;
}
int64_t tdm_dataset_sample_numel(const tdm_dataset *ds) {
  TDM__NONNULL(ds, 0, "tdm_dataset_sample_numel: the data set is NULL");
  return ds->sample_numel;
}
int tdm_dataset_sample_shape(const tdm_dataset *ds, int64_t *shape) {
  TDM__NONNULL(ds, 0, "tdm_dataset_sample_shape: the data set is NULL");
  TDM__NONNULL(shape, 0, "tdm_dataset_sample_shape: the shape is NULL");
  memcpy(shape, ds->sample_shape, sizeof(int64_t) * (size_t)ds->sample_ndim);
  return ds->sample_ndim;
}

tdm_status tdm_dataset_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y) {
  if (!ds || n < 0 || (n && (!idx || !x || !y)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "dataset batch: %lld samples, data set %p, indices %p, buffers %p and %p; expected a count "
                          ">= 0 and all of them", (long long)n, (const void *)ds, (const void *)idx, (void *)x, (void *)y);
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= ds->len)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: sample index %lld is outside [0, %lld)", ds->vt->name,
                            (long long)idx[i], (long long)ds->len);
  return ds->vt->batch(ds, idx, n, x, y);
}

/* ---- IDX images + labels --------------------------------------------------------------------- */
typedef struct {
  tdm_idx images, labels;
} idx_set;

static tdm_status idx_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y) {
  const idx_set *s = ds->impl;
  int64_t per = ds->sample_numel;
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *src = s->images.data + idx[i] * per;
    float *dst = x + i * per;
    for (int64_t k = 0; k < per; k++) dst[k] = (float)src[k] * (1.0f / 255.0f);
    y[i] = s->labels.data[idx[i]];
  }
  return TDM_OK;
}

static void idx_destroy(tdm_dataset *ds) {
  idx_set *s = ds->impl;
  tdm_idx_free(&s->images);
  tdm_idx_free(&s->labels);
  tdm__free(s);
  tdm__free(ds);
}

static const tdm_dataset_vtable idx_vt = {"idx", idx_batch, idx_destroy};

/* dir/name or dir/name.gz, whichever exists. */
static tdm_status find_file(const char *dir, const char *name, char *out, size_t n) {
  snprintf(out, n, "%s/%s", dir, name);
  if (access(out, R_OK) == 0) return TDM_OK;
  snprintf(out, n, "%s/%s.gz", dir, name);
  if (access(out, R_OK) == 0) return TDM_OK;
  return tdm__set_error(TDM_ERR_IO,
                        "no %s or %s.gz in %s: install Debian's dataset-fashion-mnist (apt-get install "
                        "dataset-fashion-mnist, which puts it in /usr/share/datasets/fashion-mnist) or pass --data-dir",
                        name, name, dir);
}

tdm_status tdm_dataset_open_idx(tdm_dataset **out, const char *dir, int train) {
  if (!out || !dir) return tdm__set_error(TDM_ERR_INVALID_ARG, "dataset_open_idx: NULL argument");
  char ip[4096], lp[4096];
  const char *pre = train ? "train" : "t10k";
  char in[64], ln[64];
  snprintf(in, sizeof in, "%s-images-idx3-ubyte", pre);
  snprintf(ln, sizeof ln, "%s-labels-idx1-ubyte", pre);
  TDM__TRY(find_file(dir, in, ip, sizeof ip));
  TDM__TRY(find_file(dir, ln, lp, sizeof lp));
  idx_set *s = tdm__calloc(1, sizeof *s);
  tdm_dataset *ds = tdm__calloc(1, sizeof *ds);
  if (!s || !ds) {
    tdm__free(s);
    tdm__free(ds);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "dataset_open_idx: out of memory");
  }
  tdm_status st = tdm_idx_read(ip, &s->images);
  if (st == TDM_OK) st = tdm_idx_read(lp, &s->labels);
  if (st == TDM_OK && s->images.ndim != 3)
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: %d dimensions; images need 3 (count, rows, cols)", ip, s->images.ndim);
  if (st == TDM_OK && s->labels.ndim != 1)
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: %d dimensions; labels need 1 (count)", lp, s->labels.ndim);
  if (st == TDM_OK && s->images.dims[0] != s->labels.dims[0])
    st = tdm__set_error(TDM_ERR_MISMATCH, "%s holds %lld images but %s holds %lld labels", ip,
                        (long long)s->images.dims[0], lp, (long long)s->labels.dims[0]);
  int max_label = -1;
  for (int64_t i = 0; st == TDM_OK && i < s->labels.n; i++)
    if (s->labels.data[i] > max_label) max_label = s->labels.data[i];
  if (st == TDM_OK && max_label > 99)
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: label %d; expected class labels below 100", lp, max_label);
  if (st != TDM_OK) {
    tdm_idx_free(&s->images);
    tdm_idx_free(&s->labels);
    tdm__free(s);
    tdm__free(ds);
    return st;
  }
  ds->vt = &idx_vt;
  ds->impl = s;
  ds->len = s->images.dims[0];
  ds->num_classes = max_label < 9 ? 10 : max_label + 1; /* MNIST-style sets have 10 classes */
  ds->sample_ndim = 3;
  ds->sample_shape[0] = 1;
  ds->sample_shape[1] = s->images.dims[1];
  ds->sample_shape[2] = s->images.dims[2];
  ds->sample_numel = s->images.dims[1] * s->images.dims[2];
  *out = ds;
  return TDM_OK;
}
