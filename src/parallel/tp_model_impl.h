/* What the split transformer's files share (tp_model.c: the slices, the store, the range's frame;
 * tp_gpt.c and tp_llama.c: each model's embedding, block and final norm): the split model itself,
 * a model's description, and the steps every model's forward takes alike. Private to
 * src/parallel/tp_*.c. */
#ifndef TANDEM_PARALLEL_TP_MODEL_IMPL_H
#define TANDEM_PARALLEL_TP_MODEL_IMPL_H

#include "parallel/tp_model.h"

#define TDM__TP_TOP_MAX 4

/* A model as the split range runs it: its parameters by name, bound once, and its three parts.
 * The range (tp_model.c) checks the input, runs embed (dropout call 0), block_fn for each block l
 * (calls 1 + 2l and 2 + 2l), then final_norm and the head on this rank's vocabulary rows with the
 * vocabulary-parallel cross-entropy. */
typedef struct {
  tdm_model_kind kind;
  const char *top[TDM__TP_TOP_MAX]; /* whole-model parameters (top[0]: the token embedding) */
  int n_top, n_required;            /* the first n_required must exist, the others may not */
  int head;                         /* top[head]: the output head (required unless the model's
                                       tie_embeddings: then absent, and the embedding serves) */
  const char *block;                /* a block's prefix, %lld its index: "transformer.h.%lld." */
  const char *const *leaf;          /* a block's parameters after the prefix, n_leaf of them */
  int n_leaf;
  /* token ids (B, T) -> the embedding (B, T, width), replicated (the dropout site is set) */
  tdm_tensor *(*embed)(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *ids);
  /* block l of the hidden state (B, T, width) */
  tdm_tensor *(*block_fn)(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *h, int64_t l);
  tdm_tensor *(*final_norm)(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *h);
} tdm__tp_kind;

extern const tdm__tp_kind tdm__tp_gpt_kind, tdm__tp_llama_kind;

struct tdm__tp_model {
  tdm_model_config cfg;
  const tdm__tp_kind *kind;
  int T, t;
  tdm_params *local;
  tdm__tp_slice *slice;
  int n;
  int64_t vlo;                       /* this rank's first vocabulary row */
  tdm_tensor *top[TDM__TP_TOP_MAX];  /* kind->top's in this store (NULL: absent) */
  tdm_tensor **blocks;               /* block l's leaf k at [l * kind->n_leaf + k] */
  tdm__tp_comm comm;
  struct tdm__tp_ckpt *ckpt;         /* block l's context for tdm_checkpoint (block recomputation) */
};
/* What a recomputed block's tdm_checkpoint holds: backward calls block_fn(g, .., l) again. */
typedef struct tdm__tp_ckpt {
  tdm__tp_model *g;
  int64_t l;
} tdm__tp_ckpt;

/* Block l's parameters, in kind->leaf's order. */
static inline tdm_tensor **tdm__tp_block(const tdm__tp_model *g, int64_t l) { return g->blocks + l * g->kind->n_leaf; }
/* This rank's rows of the table looked up, summed over the tensor axis (g): (B, T, width), the
 * same on every rank. Sets the embedding's dropout site. */
tdm_tensor *tdm__tp_lookup(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *table, tdm_tensor *ids);
/* x + dropout(g(partial) + bias): a row-parallel projection's output joining the residual (bias
 * NULL: none). */
tdm_tensor *tdm__tp_join(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *x, tdm_tensor *partial, tdm_tensor *bias);

#endif
