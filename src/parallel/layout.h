/* How the sharding engines cut the parameter buffer: groups (gradient buckets, or stage 3's gather
 * units) and, within each group, one piece per rank. Shared by the ZeRO engine and the memory
 * planner, so that what is planned is what runs. */
#ifndef TANDEM_LAYOUT_H
#define TANDEM_LAYOUT_H

#include "tandem/nn.h"

typedef struct {
  int64_t lo, hi;      /* the group's span of the parameter buffer */
  int first, n_params; /* its parameters: first .. first + n_params - 1 */
  int64_t *cut;        /* [P + 1]: rank r's piece is [cut[r], cut[r + 1]) */
} tdm__group;

typedef struct {
  tdm__group *g; /* in reverse parameter order: the order backward makes gradients final */
  int ng, P;
  int *group_of; /* parameter index -> its first group */
  int *n_of;     /* parameter index -> its groups (group_of .. group_of + n_of - 1; more than one: rows) */
} tdm__layout;

/* by_module = 0: buckets of at most bucket_bytes (0: 25 MiB), the first at most first_bytes (0:
 * 1 MiB), as DDP's (so that communication starts early); 1: units of unit_modules modules (a module: the parameters whose names agree up to
 * their first all-digit component, such as "transformer.h.3", else up to their last one). With
 * table_blocks (ZeRO) a table of more than TDM_HEAD_ROWS rows (a language model's embedding or head, which
 * tdm_embedding and tdm_lm_head read, and finish the gradient of, a block of TDM_HEAD_ROWS rows at
 * a time) is a group of its own per block, its edges moved to the nearest segment boundary. Pieces are even shares moved to the
 * nearest gradient-norm segment boundary (tdm_params_segments), so a shard is made of whole
 * segments. */
tdm_status tdm__layout_make(tdm__layout *L, const tdm_params *p, int by_module, size_t bucket_bytes, size_t first_bytes,
                            int unit_modules, int P, int table_blocks);
void tdm__layout_free(tdm__layout *L);
/* Elements rank r owns (the sum of its pieces). */
int64_t tdm__layout_owned(const tdm__layout *L, int r);
/* Stage 2's gradients at their peak, besides the shard: the bucket being written and, when the
 * reductions run on the communication thread (!inline_comm), the one before it, reducing. */
int64_t tdm__layout_in_flight(const tdm__layout *L, int inline_comm);
/* Whether the whole gradient buffer is no larger than what stage 2 holds at its peak (the largest
 * rank's shard and the buckets in flight): then giving a bucket's pages back lowers nothing, and
 * stage 2 reduces in place in a shared buffer as stage 1 does (a model of a bucket or two). */
int tdm__layout_whole_in_flight(const tdm__layout *L, int inline_comm);

#endif
