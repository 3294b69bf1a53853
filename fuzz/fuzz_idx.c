/* IDX files (plain or gzip'd) through tdm_idx_read. After a success the dimensions must be 1..4
 * positive numbers whose product is the data length, and all of it readable. */
#include "fuzz.h"

#include "tandem/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tdm_idx x;
  tdm_status st = tdm_idx_read(fuzz_memfile(data, size), &x);
  if (st != TDM_OK) {
    FUZZ_CHECK(x.data == NULL && (st == TDM_ERR_FORMAT || st == TDM_ERR_NO_MEMORY));
    return 0;
  }
  FUZZ_CHECK(x.ndim >= 1 && x.ndim <= 4);
  int64_t n = 1;
  for (int d = 0; d < x.ndim; d++) {
    FUZZ_CHECK(x.dims[d] >= 1);
    n *= x.dims[d];
  }
  FUZZ_CHECK(n == x.n && x.data);
  unsigned sum = 0;
  for (int64_t i = 0; i < x.n; i++) sum += x.data[i];
  (void)sum;
  tdm_idx_free(&x);
  return 0;
}
