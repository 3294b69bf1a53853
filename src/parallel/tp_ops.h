/* Tensor parallelism's differentiable ops (Megatron-LM's f and g, and the vocabulary-parallel
 * embedding and cross-entropy), built on the public custom-op API of tandem/autograd.h: the
 * collectives run inside forward and backward without touching the tape's internals.
 *
 * Every collective sums in rank order (tdm_comm_rank_order_algo), so each rank of the tensor
 * axis gets the same bits, and what is replicated stays bitwise identical. */
#ifndef TANDEM_PARALLEL_TP_OPS_H
#define TANDEM_PARALLEL_TP_OPS_H

#include "tandem/autograd.h"
#include "tandem/comm.h"

typedef struct tdm__tp_comm {
  tdm_comm_t comm; /* the tensor axis; NULL when it has one rank (the ops then do no communication) */
  double seconds;  /* time spent in collectives since the caller last cleared it */
  double bytes;    /* bytes all-reduced (each rank's buffer) */
  int64_t calls;
} tdm__tp_comm;

/* f: identity forward, all-reduce (sum) of the gradient backward. Before a column-parallel layer:
 * each rank's part of the gradient of the replicated input is summed. x (...) f32. */
tdm_tensor *tdm__tp_copy(tdm_tape *tp, tdm__tp_comm *c, tdm_tensor *x);
/* g: all-reduce (sum) forward, identity backward. After a row-parallel layer: the partial
 * products of the ranks are summed into the replicated output. x (...) f32. */
tdm_tensor *tdm__tp_reduce(tdm_tape *tp, tdm__tp_comm *c, tdm_tensor *x);
/* The rows [lo, lo + V_t) of an embedding that this rank holds: table (V_t, C), idx (...) with
 * values in [0, V) -> (..., C), the row for ids in range and zeros elsewhere (g then sums the
 * ranks' outputs into the whole lookup). No communication. */
tdm_tensor *tdm__tp_embedding(tdm_tape *tp, tdm_tensor *table, tdm_tensor *idx, int64_t lo);
/* Cross-entropy over a vocabulary split across the tensor axis, never gathering the logits:
 * logits (..., V_t) are this rank's columns [lo, lo + V_t) of (..., V); targets (...) i32/i64 in
 * [0, V) or ignore_index. The row maxima, sums of exponentials and target logits are combined
 * across ranks (an all-gather of each rank's row maxima, an all-reduce of the two sums), so every
 * rank returns the same mean loss over the rows that are not ignored, and backward needs no
 * communication. *correct and *rows (optional) get how many rows' argmax over the whole
 * vocabulary (the first maximum, as one process counts) equals the target, and the row count. */
tdm_tensor *tdm__tp_cross_entropy(tdm_tape *tp, tdm__tp_comm *c, tdm_tensor *logits, tdm_tensor *targets, int64_t lo,
                                  int64_t V, int64_t ignore_index, double *correct, double *rows);

#endif
