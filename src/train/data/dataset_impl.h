/* The data-set interface every reader implements. */
#ifndef TANDEM_DATASET_IMPL_H
#define TANDEM_DATASET_IMPL_H

#include "tandem/data.h"

typedef struct tdm_dataset_vtable {
  const char *name;
  tdm_status (*batch)(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y);
  void (*destroy)(tdm_dataset *ds);
} tdm_dataset_vtable;

struct tdm_dataset {
  const tdm_dataset_vtable *vt;
  int64_t len;
  int num_classes;
  int sample_ndim;
  int64_t sample_shape[4];
  int64_t sample_numel;
  /* token data sets only: windows and their next-token targets */
  tdm_status (*tokens)(const tdm_dataset *ds, const int64_t *idx, int64_t n, int32_t *x, int32_t *y);
  void *impl;
};

#endif
