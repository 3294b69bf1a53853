/* Text as byte tokens through tdm_dataset_open_text_part, with a window and a part of the file
 * that depend on the input's length. After a success the windows must be the file's bytes. */
#include "fuzz.h"

#include "tandem/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const double parts[3][2] = {{0, 1}, {0, 0.9}, {0.9, 1}};
  int64_t T = 1 + (int64_t)(size % 7);
  const double *part = parts[size % 3];
  tdm_dataset *ds = NULL;
  tdm_status st = tdm_dataset_open_text_part(&ds, fuzz_memfile(data, size), T, part[0], part[1]);
  if (st != TDM_OK) {
    FUZZ_CHECK(st == TDM_ERR_INVALID_ARG || st == TDM_ERR_NO_MEMORY);
    return 0;
  }
  int64_t lo = (int64_t)(part[0] * (double)size);
  int32_t x[7], y[7];
  for (int64_t w = 0; w < tdm_dataset_len(ds); w++) {
    FUZZ_CHECK(tdm_dataset_tokens(ds, &w, 1, x, y) == TDM_OK);
    for (int64_t i = 0; i < T; i++) {
      FUZZ_CHECK(x[i] == data[lo + w * T + i] && y[i] == data[lo + w * T + i + 1]);
    }
  }
  tdm_dataset_destroy(ds);
  return 0;
}
