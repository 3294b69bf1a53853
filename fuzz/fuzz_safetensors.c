/* safetensors files from memory (tdm_safetensors_parse, the reader behind tdm_safetensors_load).
 * After a success every tensor must have exactly dtype x shape bytes (all readable), aligned to
 * its element size, no two non-empty tensors may overlap, and every name must be found; after a failure the status
 * is a format error (or out of memory) whose detail names the file. */
#include "fuzz.h"

#include "tandem/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tdm_safetensors *f = NULL;
  tdm_status st = tdm_safetensors_parse(&f, data, size, "fuzz.safetensors");
  if (st != TDM_OK) {
    FUZZ_CHECK(f == NULL);
    FUZZ_CHECK(st == TDM_ERR_FORMAT || st == TDM_ERR_NO_MEMORY);
    FUZZ_CHECK(!strncmp(tdm_last_error(), "fuzz.safetensors", 16));
    return 0;
  }
  int n = tdm_safetensors_count(f);
  for (int i = 0; i < n; i++) {
    const tdm_st_tensor *t = tdm_safetensors_at(f, i);
    FUZZ_CHECK(t && tdm_safetensors_find(f, t->name) == t);
    FUZZ_CHECK(t->ndim >= 0 && t->ndim <= TDM_MAX_DIMS);
    int64_t bytes = (int64_t)tdm_dtype_size(t->dtype);
    int zero = 0;
    for (int d = 0; d < t->ndim; d++) {
      FUZZ_CHECK(t->shape[d] >= 0);
      zero |= t->shape[d] == 0;
    }
    for (int d = 0; d < t->ndim && !zero; d++) FUZZ_CHECK(!__builtin_mul_overflow(bytes, t->shape[d], &bytes));
    FUZZ_CHECK(t->nbytes == (zero ? 0 : bytes) && t->nbytes <= (int64_t)size);
    FUZZ_CHECK(!t->nbytes || (uintptr_t)t->data % tdm_dtype_size(t->dtype) == 0);
    const uint8_t *p = t->data;
    unsigned sum = 0;
    for (int64_t k = 0; k < t->nbytes; k++) sum += p[k]; /* ASan sees any byte outside the copy */
    (void)sum;
    for (int j = 0; j < i && t->nbytes; j++) { /* quadratic, but fuzz inputs hold few tensors */
      const tdm_st_tensor *u = tdm_safetensors_at(f, j);
      const uint8_t *q = u->data;
      FUZZ_CHECK(!u->nbytes || p + t->nbytes <= q || q + u->nbytes <= p);
    }
  }
  tdm_safetensors_meta(f, "format");
  tdm_safetensors_destroy(f);
  return 0;
}
