/* CIFAR-style binary batches (the CIFAR-10 "binary version"): records of one label byte then the
 * image's bytes, channel by channel, row by row. Training: data_batch_1.bin, data_batch_2.bin, ...
 * (as many as exist from 1 on); test: test_batch.bin. Pixels become floats in [0, 1]. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/internal.h"
#include "train/data/dataset_impl.h"

#define MAX_FILES 64

typedef struct {
  unsigned char *bytes; /* every record of every file, end to end */
  int64_t record;       /* 1 + C*H*W */
} cifar_set;

static tdm_status cifar_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y) {
  const cifar_set *s = ds->impl;
  int64_t per = ds->sample_numel;
  for (int64_t i = 0; i < n; i++) {
    const unsigned char *r = s->bytes + idx[i] * s->record;
    y[i] = r[0];
    for (int64_t k = 0; k < per; k++) x[i * per + k] = (float)r[1 + k] * (1.0f / 255.0f);
  }
  return TDM_OK;
}

static void cifar_destroy(tdm_dataset *ds) {
  cifar_set *s = ds->impl;
  tdm__free(s->bytes);
  tdm__free(s);
  tdm__free(ds);
}

static const tdm_dataset_vtable cifar_vt = {"cifar-bin", cifar_batch, cifar_destroy};

tdm_status tdm_dataset_open_cifar(tdm_dataset **out, const char *dir, int train, int channels, int height, int width,
                                  int classes) {
  if (!out || !dir) return tdm__set_error(TDM_ERR_INVALID_ARG, "dataset_open_cifar: NULL argument");
  if (channels < 1 || height < 1 || width < 1 || classes < 2 || classes > 256 || (int64_t)channels * height * width > (1 << 24))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cifar: images %dx%dx%d, %d classes; expected positive sizes and 2..256 classes",
                          channels, height, width, classes);
  int64_t record = 1 + (int64_t)channels * height * width;
  char path[4096];
  unsigned char *all = NULL;
  int64_t total = 0;
  tdm_status st = TDM_OK;
  for (int f = 1; f <= (train ? MAX_FILES : 1) && st == TDM_OK; f++) {
    if (train) snprintf(path, sizeof path, "%s/data_batch_%d.bin", dir, f);
    else snprintf(path, sizeof path, "%s/test_batch.bin", dir);
    if (access(path, F_OK) != 0) {
      if (f == 1)
        st = tdm__set_error(TDM_ERR_IO, "cifar: no %s in %s (expected CIFAR-10's binary batches: data_batch_1.bin ... and test_batch.bin)",
                            train ? "data_batch_1.bin" : "test_batch.bin", dir);
      break;
    }
    unsigned char *b = NULL;
    int64_t len = 0;
    st = tdm__file_read(path, (int64_t)1 << 34, "a CIFAR batch", &b, &len);
    if (st == TDM_OK && (len == 0 || len % record != 0))
      st = tdm__set_error(TDM_ERR_FORMAT,
                          "%s: %lld bytes is not a whole number of records of %lld bytes (a label byte and a %dx%dx%d image); "
                          "the images have other dimensions, or the file is cut",
                          path, (long long)len, (long long)record, channels, height, width);
    for (int64_t r = 0; st == TDM_OK && r < len / record; r++)
      if (b[r * record] >= classes)
        st = tdm__set_error(TDM_ERR_FORMAT, "%s: record %lld has label %d; expected below %d (or the images have other dimensions)",
                            path, (long long)r, b[r * record], classes);
    if (st == TDM_OK) {
      unsigned char *grown = tdm__malloc((size_t)(total + len));
      if (!grown) st = tdm__set_error(TDM_ERR_NO_MEMORY, "cifar: out of memory for %s", path);
      else {
        if (total) memcpy(grown, all, (size_t)total);
        memcpy(grown + total, b, (size_t)len);
        tdm__free(all);
        all = grown;
        total += len;
      }
    }
    tdm__free(b);
  }
  cifar_set *s = st == TDM_OK ? tdm__calloc(1, sizeof *s) : NULL;
  tdm_dataset *ds = s ? tdm__calloc(1, sizeof *ds) : NULL;
  if (st == TDM_OK && !ds) st = tdm__set_error(TDM_ERR_NO_MEMORY, "cifar: out of memory");
  if (st != TDM_OK) {
    tdm__free(all);
    tdm__free(s);
    return st;
  }
  s->bytes = all;
  s->record = record;
  ds->vt = &cifar_vt;
  ds->impl = s;
  ds->len = total / record;
  ds->num_classes = classes;
  ds->sample_ndim = 3;
  ds->sample_shape[0] = channels, ds->sample_shape[1] = height, ds->sample_shape[2] = width;
  ds->sample_numel = record - 1;
  *out = ds;
  return TDM_OK;
}
