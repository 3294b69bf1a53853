/* Deterministic token batches for the engine tests (test_engine, test_pp_engine, test_grid,
 * test_mixed): token i of sample s at step t is a hash of (t, s x T + i), so every parallel
 * layout that hands a rank the samples first..first+B-1 sees the same global batch. */
#ifndef TDM_TEST_TOKEN_BATCH_H
#define TDM_TEST_TOKEN_BATCH_H

#include "tandem/tandem.h"

/* x and y: new B x T i32 tensors on tp (inputs and targets, each in [0, vocab)). */
static inline tdm_status tdm_test_token_batch(tdm_tape *tp, int64_t step, int64_t first, int64_t B, int64_t T,
                                              int64_t vocab, tdm_tensor **x, tdm_tensor **y) {
  int64_t s[2] = {B, T};
  *x = tdm_new(tp, TDM_I32, 2, s);
  *y = tdm_new(tp, TDM_I32, 2, s);
  if (!*x || !*y) return tdm_tape_status(tp);
  int32_t *xd = tdm_tensor_data(*x), *yd = tdm_tensor_data(*y);
  for (int64_t i = 0; i < B * T; i++) {
    uint64_t h = tdm_hash64((uint64_t)step, (uint64_t)(first * T + i));
    xd[i] = (int32_t)(h % (uint64_t)vocab);
    yd[i] = (int32_t)((h >> 20) % (uint64_t)vocab);
  }
  return TDM_OK;
}

#endif
