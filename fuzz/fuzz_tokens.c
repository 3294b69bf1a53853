/* llm.c uint16 token files (1024-byte header) through tdm_dataset_open_tokens_u16. After a success
 * every window must come back with tokens below the vocabulary and targets shifted by one. */
#include "fuzz.h"

#include "tandem/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int64_t T = 1 + (int64_t)(size % 5);
  int vocab = size % 2 ? 50257 : 300;
  tdm_dataset *ds = NULL;
  tdm_status st = tdm_dataset_open_tokens_u16(&ds, fuzz_memfile(data, size), T, vocab);
  if (st != TDM_OK) {
    FUZZ_CHECK(st == TDM_ERR_FORMAT || st == TDM_ERR_INVALID_ARG || st == TDM_ERR_NO_MEMORY);
    return 0;
  }
  FUZZ_CHECK(tdm_dataset_is_tokens(ds) && tdm_dataset_num_classes(ds) == vocab);
  int32_t x[5], y[5];
  for (int64_t w = 0; w < tdm_dataset_len(ds); w++) {
    FUZZ_CHECK(tdm_dataset_tokens(ds, &w, 1, x, y) == TDM_OK);
    for (int64_t i = 0; i < T; i++) FUZZ_CHECK(x[i] >= 0 && x[i] < vocab && y[i] >= 0 && y[i] < vocab);
    for (int64_t i = 0; i + 1 < T; i++) FUZZ_CHECK(y[i] == x[i + 1]);
  }
  int64_t past = tdm_dataset_len(ds);
  FUZZ_CHECK(tdm_dataset_tokens(ds, &past, 1, x, y) == TDM_ERR_INVALID_ARG);
  tdm_dataset_destroy(ds);
  return 0;
}
