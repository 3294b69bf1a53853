/* tandem — the distributed sampler and its prefetch thread.
 *
 * Every epoch is one permutation of the data set, a function of (seed, epoch). Optimizer step s
 * consumes a global batch of world x accum x batch samples; micro-batch m of rank r is the slice
 * [s*G + m*batch*world + r*batch, + batch) of that order, so N ranks see exactly what one process
 * with an N-times batch sees. The last, incomplete global batch of an epoch is:
 *   TDM_LAST_PARTIAL  kept smaller (one process only, as PyTorch's DataLoader),
 *   TDM_LAST_PAD      filled by wrapping around to the start of the order (as DistributedSampler),
 *   TDM_LAST_DROP     dropped.
 * With prefetch on, a thread assembles the next micro-batch while the current one computes.
 *
 * Positions are layout-independent: the stream is the concatenation of the epochs' orders, and a
 * position is (epoch, samples of its order consumed), whatever world size, batch or accumulation
 * consumed them. A run resumed with another global batch G' (another world size, say) is set to
 * the position its checkpoint recorded (tdm_sampler_set_position): its steps take the next G'
 * samples from there, [offset, offset + G'), [offset + G', ...), until the epoch ends, and later
 * epochs start at 0; no sample is skipped or repeated (but by the last batch's padding, as ever).
 *
 *   tdm_sampler *s;
 *   tdm_sampler_create(&s, ds, &cfg);
 *   for (...) { const float *x; const int32_t *y; int64_t n, first;
 *               tdm_sampler_next(s, &x, &y, &n, &first); ... }
 *
 * Not thread-safe: one consumer. A NULL sampler or output pointer is TDM_ERR_INVALID_ARG naming it;
 * getters then return 0 (steps per epoch) or -1 (epoch, epoch start) and set tdm_last_error().
 */
#ifndef TANDEM_SAMPLER_H
#define TANDEM_SAMPLER_H

#include <stdint.h>

#include "tandem/data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TDM_LAST_PARTIAL, TDM_LAST_PAD, TDM_LAST_DROP } tdm_last_batch;

typedef struct tdm_sampler_config {
  int64_t batch;     /* per rank and micro-batch */
  int64_t accum;     /* micro-batches per step (>= 1) */
  int world, rank;
  uint64_t seed;
  tdm_last_batch last;
  int prefetch;      /* 1: assemble the next micro-batch on a background thread */
} tdm_sampler_config;

typedef struct tdm_sampler tdm_sampler;
/* The data set must outlive the sampler. Fails (naming the sizes) if one global batch does not
 * fit the data set with TDM_LAST_PAD or TDM_LAST_DROP (TDM_LAST_PARTIAL's one batch is then the
 * whole set, as PyTorch's DataLoader gives it), or TDM_LAST_PARTIAL is asked for with several
 * ranks or accumulation. */
tdm_status tdm_sampler_create(tdm_sampler **out, const tdm_dataset *ds, const tdm_sampler_config *cfg);
/* Switches the last batch's rule between TDM_LAST_PARTIAL and TDM_LAST_PAD, which give the same
 * steps on one rank without accumulation (the only layout partial allows): what a run resumed
 * from a checkpoint that used the other rule does. TDM_ERR_INVALID_ARG for another rule or
 * layout. Before the first tdm_sampler_next or seek's batch is used; not with next running. */
tdm_status tdm_sampler_set_last(tdm_sampler *s, tdm_last_batch last);
void tdm_sampler_destroy(tdm_sampler *s);
int64_t tdm_sampler_steps_per_epoch(const tdm_sampler *s);
/* Positions the sampler at the start of global step `step` (0-based, counted over epochs; not
 * before the step given to tdm_sampler_set_position). */
tdm_status tdm_sampler_seek(tdm_sampler *s, int64_t step);
/* Sets the position: step `step` starts at sample `offset` (0..N) of epoch `epoch`'s order, and
 * seeks there. Without it, step 0 starts epoch 0. A resumed run passes its checkpoint's position. */
tdm_status tdm_sampler_set_position(tdm_sampler *s, int64_t step, int64_t epoch, int64_t offset);
/* Where step (not before the set position) starts: its epoch and the offset in the epoch's order;
 * the position after step s is where step s + 1 starts (an epoch's end reads as (epoch + 1, 0)). */
void tdm_sampler_locate(const tdm_sampler *s, int64_t step, int64_t *epoch, int64_t *offset);
/* The first step of epoch (the set position's step for its own epoch or any before). */
int64_t tdm_sampler_epoch_start(const tdm_sampler *s, int64_t epoch);
/* The next micro-batch of this rank: x (n x sample_numel) and y (n), valid until the next call
 * (token data sets: x holds int32 tokens, n x T, and y their targets, n x T);
 * *first is the position of its first sample in the epoch's order (dropout keys use it). */
tdm_status tdm_sampler_next(tdm_sampler *s, const float **x, const int32_t **y, int64_t *n, int64_t *first);
/* The epoch of the micro-batch tdm_sampler_next returns next. */
int64_t tdm_sampler_epoch(const tdm_sampler *s);

#ifdef __cplusplus
}
#endif
#endif
