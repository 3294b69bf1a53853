/* The tape's internals, shared by the op files. */
#ifndef TANDEM_TAPE_IMPL_H
#define TANDEM_TAPE_IMPL_H

#include "core/internal.h"
#include "tandem/autograd.h"
#include "tensor/tensor_impl.h"

typedef struct tdm_node tdm_node;
#define TDM__TAPE_SECTIONS 260
typedef void (*tdm__backward_fn)(tdm_tape *tp, tdm_node *n);

#define TDM_NODE_MAX_IN 4

struct tdm_node {
  const char *op;
  tdm__backward_fn backward;
  tdm_tensor *out;
  int n_in;
  tdm_tensor **in;                  /* = in_small, or an arena array for concat */
  tdm_tensor *in_small[TDM_NODE_MAX_IN];
  int64_t i[8];                     /* integer arguments an op keeps for backward */
  int self_fetch;                   /* its backward fetches its parameters itself (a block of rows at a time) */
  float f[4];
  void *saved[3];                   /* arena buffers kept for backward */
};

typedef struct {
  tdm_tensor *t;
  int32_t first_use;
  int32_t in_arena; /* t lives in the tape's arena (so it is still valid at reset) */
} tdm__leaf_use;

struct tdm_tape {
  tdm_arena *arena;
  tdm_node **nodes;
  int n_nodes, cap_nodes;
  tdm__leaf_use *leaves; /* leaves needing grad, in order of first use */
  int n_leaves, cap_leaves;
  uint64_t epoch;
  int grad_enabled, training;
  uint64_t dropout_seed;
  int64_t sample_base;
  uint64_t dropout_calls;
  tdm_dtype autocast;   /* TDM_F32 (off), TDM_BF16 or TDM_F16: the dtype ops store activations in */
  int recompute;        /* tdm_recompute: what the models recompute in backward */
  int in_backward;      /* backward is running (recomputed forward ops fetch as backward does) */
  int grad_phase; /* 0: every gradient; 1: all but the parameters'; 2: only the parameters' (tdm_backward_inputs / _params) */
  tdm_status status;
  char error[512];
  void *ws; /* tdm__workspace's buffer (kept across resets) */
  size_t ws_cap;
  /* Tracing only: where the model's blocks start on the tape (first node, block index; -1: not a
   * block), so backward can time each block (tdm__tape_section). */
  int sec_node[TDM__TAPE_SECTIONS];
  int sec_index[TDM__TAPE_SECTIONS];
  int n_sec;
};

/* Marks the nodes recorded from now on as block `index` (-1: none) for the trace: a span per
 * block in forward is the model's; in backward, the tape's. Does nothing when tracing is off. */
void tdm__tape_section(tdm_tape *tp, int index);

/* Records the first error on the tape and returns NULL. */
tdm_tensor *tdm__fail(tdm_tape *tp, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* True when the tape has no error and none of the inputs is NULL (a NULL input means an
 * earlier op failed, or the caller passed NULL: both get an error naming op). */
int tdm__inputs_ok(tdm_tape *tp, const char *op, int n, tdm_tensor *const *ins);
/* Input must be f32. */
int tdm__check_f32(tdm_tape *tp, const char *op, const char *what, const tdm_tensor *t);
/* Arena tensor, contiguous, uninitialised (zeroed with tdm__out_zero). */
tdm_tensor *tdm__out(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape);
void *tdm__scratch(tdm_tape *tp, size_t bytes);
/* A new header over x's data on the tape's scratch: no gradient, node, hooks or name of its own;
   it remembers the parameter whose memory it shares, so ZeRO stage 3 fetches that parameter
   before the view is read. Used by views and by custom ops that return an input. */
tdm_tensor *tdm__alias_header(tdm_tape *tp, tdm_tensor *x);
/* A buffer of at least bytes that stays the tape's across resets: valid until the next call (an
 * op's temporary, used and done within one forward or backward call). Grows only when a larger
 * one is asked for, so a steady-state step allocates nothing. */
void *tdm__workspace(tdm_tape *tp, size_t bytes);
/* If grad is on and an input requires grad: records a node producing out and returns it. */
tdm_node *tdm__record(tdm_tape *tp, const char *op, tdm__backward_fn bw, tdm_tensor *out, int n,
                      tdm_tensor *const *ins);
/* Gradient buffer of t (allocated zeroed on first use); NULL when t does not require grad. Its
 * dtype is t's (16-bit activations have 16-bit gradients); parameters' are f32. */
void *tdm__grad(tdm_tape *tp, tdm_tensor *t);
/* As tdm__grad, but when t is a tape activation without a gradient yet, the buffer is returned
 * uninitialised with *fresh = 1, and the caller must write every element (not accumulate): this
 * spares zeroing, then reading, every activation gradient that has a single producer. */
void *tdm__grad_for_write(tdm_tape *tp, tdm_tensor *t, int *fresh);
/* Attention (src/autograd/ops_llama.c). Whether this op skips keeping its probabilities (selective
 * recomputation); how many batches go through the kernels at once (scratch holds that many
 * batches' probabilities; at least 8 tasks per call, whatever the thread count, so that the planner
 * knows it); the probabilities of a chunk stored in dt (f32: already in place); in backward, a
 * chunk of them as f32: the saved ones, converted into buf, or rebuilt from q and k (row strides
 * ldq, ldkv) into buf and rounded to dt as storing them would have. */
int tdm__selective(const tdm_tape *tp, int n, tdm_tensor *const *ins);
int64_t tdm__attn_batches(int64_t B, int64_t groups);
void tdm__store_probs(void *att, tdm_dtype dt, int64_t off, const float *src, int64_t n);
const float *tdm__probs_chunk(float *buf, const void *saved, tdm_dtype dt, int64_t off, int64_t n, const float *q, const float *k,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t ldq, int64_t ldkv);
/* Fetches rows [r0, r1) of w (a 2-D table, or a view of one) through its parameter's fetch hook;
 * a failure fails the tape, naming op. */
tdm_status tdm__fetch_rows(tdm_tape *tp, const char *op, tdm_tensor *w, int64_t r0, int64_t r1, int backward);
/* Whether no node before `node` read leaf w on this tape (the node is the last to add to its
 * gradient in backward). */
int tdm__first_reader(const tdm_tape *tp, const tdm_tensor *w, int node);
/* Rows [r0, r1) of leaf w's gradient are final: its range hook, in the pass that makes it. */
void tdm__grad_rows_final(tdm_tape *tp, tdm_tensor *w, int64_t r0, int64_t r1);
/* A tied output head's part of its table's gradient, rows [r0, r1) (ops_head.c), for the
 * embedding's backward. */
void tdm__head_dw_rows(tdm_tape *tp, tdm_node *head, float *dw, int64_t r0, int64_t r1);
/* Runs the backward of nodes [from, to) in reverse, fetching their parameters, without the leaf
 * hooks (a recomputed block's nodes, inside the node that recorded them). */
tdm_status tdm__backward_nodes(tdm_tape *tp, int from, int to);
/* x itself if contiguous, else a recorded contiguous copy. */
tdm_tensor *tdm__contig(tdm_tape *tp, tdm_tensor *x);
/* Normalises a possibly negative axis; -1 if out of range (and records the error). */
int tdm__axis(tdm_tape *tp, const char *op, const tdm_tensor *x, int axis);
/* ---- mixed precision (src/autograd/mixed.c) ----------------------------------------------------
 * Ops compute in f32 through their f32 kernels; activations and their gradients may be stored in
 * bf16 or f16. Conversions go to arena scratch taken between a mark and a rewind, so they are
 * transient: a backward function first takes its inputs' gradients (tdm__grad / _for_write, which
 * persist), then marks, converts, computes, commits and rewinds. */
/* A weight larger than this many floats is rounded for a 16-bit product panel by panel. */
#define TDM_LP_PANEL ((int64_t)1 << 20)
/* Input is an activation dtype (f32, bf16, f16). */
int tdm__check_act(tdm_tape *tp, const char *op, const char *what, const tdm_tensor *t);
/* The dtype an op stores its activations in: the autocast dtype, else f32. */
tdm_dtype tdm__act_dtype(const tdm_tape *tp);
/* t's values (contiguous) as f32: t->data when f32, else a converted copy in scratch; NULL after a
 * failure (the tape's error is set). */
const float *tdm__f32(tdm_tape *tp, const tdm_tensor *t);
/* t's values as f32 rounded to dt's precision (a product's input under autocast: parameters are
 * f32 and round to the activation dtype); dt f32, or t already of dt: as tdm__f32. */
const float *tdm__f32_round(tdm_tape *tp, const tdm_tensor *t, tdm_dtype dt);
/* Where an op writes y's values in f32: y->data when f32, else scratch for tdm__store_f32. */
float *tdm__f32_out(tdm_tape *tp, tdm_tensor *y);
/* Puts f32 values into y (a no-op when buf is y->data); for a 16-bit y, rounds to nearest even. */
void tdm__store_f32(tdm_tensor *y, const float *buf);
/* t's gradient as an f32 buffer: grad itself (from tdm__grad or _for_write) when t is f32; else
 * scratch holding its current values (or, fresh, garbage to be overwritten), which
 * tdm__grad_commit then stores into grad. */
float *tdm__grad_f32(tdm_tape *tp, const tdm_tensor *t, void *grad, int fresh);
void tdm__grad_commit(const tdm_tensor *t, void *grad, const float *buf);
/* The same for elements [off, off + n) of an activation (data of dtype dt) or of a gradient, into
 * caller-given buffers of n floats: element-wise ops convert a piece at a time, so their scratch
 * does not grow with the tensor (an f32 tensor is returned in place, buf unused). */
#define TDM_LP_PIECE ((int64_t)1 << 16)
const float *tdm__f32_part(const void *data, tdm_dtype dt, int64_t off, int64_t n, float *buf);
float *tdm__grad_f32_part(void *grad, tdm_dtype dt, int64_t off, int64_t n, int fresh, float *buf);
void tdm__grad_commit_part(void *grad, tdm_dtype dt, int64_t off, int64_t n, const float *buf);

/* "(2, 3)" for t, in a rotating set of static-per-thread buffers (valid for a few calls). */
const char *tdm__shp(const tdm_tensor *t);

#endif
