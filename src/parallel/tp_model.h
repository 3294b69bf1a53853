/* A transformer split over the tensor axis (Megatron-LM, Shoeybi et al. 2019): GPT's blocks
 * (tp_gpt.c) or Llama's decoder layers (tp_llama.c). Each rank holds slices of the whole model's
 * parameters, under the same names, in the same order (tp_model.c: the slices, the store, the
 * norm's pieces, the checkpoint boxes, whatever the model).
 *
 *   GPT (tp_gpt.c)
 *   transformer.wte.weight        rows [lo_v, hi_v) of the vocabulary (any V >= T: blocks of V/T
 *                                 rows, the last ones one row longer when T does not divide V)
 *   attn.c_attn.weight / .bias    this rank's heads: the same rows of each of q, k and v
 *   attn.c_proj.weight            the columns of those heads (row-parallel: partial sums, then g)
 *   mlp.c_fc.weight / .bias       rows [4C t/T, 4C (t+1)/T)
 *   mlp.c_proj.weight             those columns
 *   everything else               whole on every rank (replicated): wpe, the layer norms, the
 *                                 biases of the two row-parallel projections
 *
 *   Llama (tp_llama.c)
 *   model.embed_tokens.weight,    rows [lo_v, hi_v) of the vocabulary, as GPT's wte (an untied head
 *   lm_head.weight                the same rows; a tied one is the embedding's)
 *   self_attn.q_proj.weight       the rows of this rank's query heads [H t/T, H (t+1)/T)
 *   self_attn.k_proj / v_proj     the rows of its key/value heads [KV t/T, KV (t+1)/T): the groups
 *                                 of its query heads (grouped-query attention: T divides both)
 *   self_attn.o_proj.weight       the columns of its query heads (row-parallel)
 *   mlp.gate_proj / up_proj       rows [F t/T, F (t+1)/T) of the SwiGLU width (any F >= T: SwiGLU
 *                                 is elementwise, so the blocks may differ by a row)
 *   mlp.down_proj.weight          those columns (row-parallel)
 *   the RMSNorms' weights         whole on every rank (replicated); no biases
 *
 * Every slice is count runs of len elements of the whole parameter, run k starting at first +
 * k * stride: whole-model weights load into it, a run saves them, and a rank initialises its
 * slices with the values the whole model has (tdm_params_init_strided).
 *
 * Forward per block: norm, f, the column-parallel projections, attention over this rank's heads
 * (Llama: rotary embeddings per local head, each a whole group of query heads with its key/value
 * head), the row-parallel projection, g, (GPT: bias,) dropout, residual; the MLP likewise; the
 * embedding looks up this rank's rows and g sums them; the head multiplies by this rank's rows
 * and the vocabulary-parallel cross-entropy combines the ranks' row statistics. One all-reduce
 * forward and one backward per sub-block. Dropout acts only on replicated tensors (the embedding
 * sum and the outputs of g), in the order one process runs it, so its masks are the whole
 * model's. */
#ifndef TANDEM_PARALLEL_TP_MODEL_H
#define TANDEM_PARALLEL_TP_MODEL_H

#include "parallel/tp_ops.h"
#include "tandem/engine.h"
#include "tandem/nn.h"

typedef struct {
  int sharded;       /* 0: replicated (one run: the whole parameter) */
  int dim;           /* the split dimension */
  int64_t first, len, stride, count;
  int64_t m, unit;   /* rows per chunk of the split dimension, elements per row of it (stride = m x unit);
                        rank q's run is (q + 1) m / T - q m / T rows */
} tdm__tp_slice;

typedef struct tdm__tp_model tdm__tp_model;

/* TDM_ERR_INVALID_ARG naming the values when the model cannot be split over T ranks: a model that
 * is not a GPT or a Llama, T larger than the head count, heads (a Llama's key/value heads too) not
 * divisible by T, a vocabulary (a Llama's SwiGLU width) smaller than T. */
tdm_status tdm__tp_check(const tdm_model_config *mc, int T);
/* The part of rank t of T: a parameter store laid out as `whole` (a GPT's or a Llama's
 * parameters, which may be reserved: only names, shapes, decay flags and initial values are read),
 * with each slice holding the whole model's initial values. comm: the tensor axis (NULL when
 * T = 1). */
tdm_status tdm__tp_model_create(tdm__tp_model **out, const tdm_params *whole, const tdm_model_config *mc, tdm_comm_t comm,
                                int T, int t);
void tdm__tp_model_destroy(tdm__tp_model *g);
tdm_params *tdm__tp_model_params(const tdm__tp_model *g);
/* Parameter i's slice (the same index in both stores). */
const tdm__tp_slice *tdm__tp_model_slice(const tdm__tp_model *g, int i);
tdm__tp_comm *tdm__tp_model_comm(tdm__tp_model *g);
/* Without building anything (the planner): parameter i's slice on rank t of T and its shape there
 * (shape: TDM_MAX_DIMS entries), and the elements rank t holds in all. */
void tdm__tp_slice_of(const tdm_params *whole, int i, int T, int t, tdm__tp_slice *s, int64_t *shape);
int64_t tdm__tp_local_numel(const tdm_params *whole, int T, int t);
/* The runs of rank t's slices cut where the whole model's gradient-norm segments start (see
 * tdm_params_segments), in parameter order, a replicated parameter's on rank 0 only: each piece
 * adds its sum of squares to one segment's. out NULL: only *n, the count. */
typedef struct {
  int64_t local, len, seg; /* offset in this rank's store, length, the segment */
} tdm__tp_piece;
tdm_status tdm__tp_norm_pieces(const tdm_params *whole, int T, int t, tdm__tp_piece *out, int64_t *n);
/* What the engine (src/parallel/tensor.c) holds beside the stores, for the planner: its buffer for
 * assembling parameters when T > 1 (bytes), and the split model's own arrays per parameter and
 * per layer (the slices, the block views) for the model mc. */
#define TDM__TP_STAGE_BYTES ((int64_t)sizeof(float) * 2 * (1 << 16))
int64_t tdm__tp_model_bookkeeping(const tdm_model_config *mc, int n_params);
/* Forward and the mean cross-entropy over the targets (ignore index -100), the same value on every
 * rank; adds the correct predictions and rows to *correct and *rows. x, y (B, T) i32/i64. NULL
 * with the tape's error set. */
tdm_tensor *tdm__tp_model_loss(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *x, tdm_tensor *y, double *correct, double *rows);
/* A range of the split model (what a pipeline chunk of tensor-parallel blocks runs: the 3-D grid,
 * src/parallel/pipeline.c): blocks (decoder layers) [first, last); with embed the input is token
 * ids (B, T) and the embeddings run first (GPT: token and position; Llama: token), else it is the
 * hidden state (B, T, width) the range before made (the same on every tensor rank); with head the
 * final norm, the head on this rank's vocabulary rows (GPT's tied to wte, a Llama's to its
 * embedding or its own lm_head) and the vocabulary-parallel cross-entropy over y follow, and the
 * loss is returned, else the hidden state. Dropout masks are numbered as the whole model numbers
 * them, so ranges chained give tdm__tp_model_loss's bits (tests/unit/test_tp.c).
 * head_weight (optional, in): the head's weight in place of this rank's rows of the tied embedding
 * (a pipeline's last stage passes a detached copy: the tied gradient is the first stage's to add);
 * logits and head_input (out, with head): this rank's logits (B, T, V_t) and the head's input
 * (B, T, width). */
typedef struct {
  int64_t first, last;
  int embed, head;
  tdm_tensor *head_weight;
  tdm_tensor *logits, *head_input;
} tdm__tp_range;
tdm_tensor *tdm__tp_model_range(tdm__tp_model *g, tdm_tape *tp, tdm_tensor *in, tdm__tp_range *r, tdm_tensor *y,
                                double *correct, double *rows);
/* This rank's slices as boxes of the whole model's parameters (checkpoints of logical tensors,
 * tdm_engine_pieces): for each parameter i that held(ctx, i, &state_at) says this rank holds
 * (state_at: the optimizer-state index of its first local element), one box per run of its slice,
 * or one for all of them when they make one box. Each parameter is written by one rank of the data
 * axis (i mod D = d), a replicated one by one rank of the tensor axis too (i mod T = t). out NULL:
 * only the count. Returns the count. */
int tdm__tp_model_boxes(const tdm__tp_model *g, const tdm_params *whole, int D, int d, int (*held)(void *ctx, int i, int64_t *state_at),
                        void *ctx, tdm_engine_piece *out);

#endif
