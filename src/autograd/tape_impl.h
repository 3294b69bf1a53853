/* The tape's internals, shared by the op files. */
#ifndef TANDEM_TAPE_IMPL_H
#define TANDEM_TAPE_IMPL_H

#include "core/internal.h"
#include "tandem/autograd.h"
#include "tensor/tensor_impl.h"

typedef struct tdm_node tdm_node;
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
  int grad_phase; /* 0: every gradient; 1: all but the parameters'; 2: only the parameters' (tdm_backward_inputs / _params) */
  tdm_status status;
  char error[512];
  void *ws; /* tdm__workspace's buffer (kept across resets) */
  size_t ws_cap;
};

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
/* A buffer of at least bytes that stays the tape's across resets: valid until the next call (an
 * op's temporary, used and done within one forward or backward call). Grows only when a larger
 * one is asked for, so a steady-state step allocates nothing. */
void *tdm__workspace(tdm_tape *tp, size_t bytes);
/* If grad is on and an input requires grad: records a node producing out and returns it. */
tdm_node *tdm__record(tdm_tape *tp, const char *op, tdm__backward_fn bw, tdm_tensor *out, int n,
                      tdm_tensor *const *ins);
/* Gradient buffer of t (allocated zeroed on first use); NULL when t does not require grad. */
float *tdm__grad(tdm_tape *tp, tdm_tensor *t);
/* As tdm__grad, but when t is a tape activation without a gradient yet, the buffer is returned
 * uninitialised with *fresh = 1, and the caller must write every element (not accumulate): this
 * spares zeroing, then reading, every activation gradient that has a single producer. */
float *tdm__grad_for_write(tdm_tape *tp, tdm_tensor *t, int *fresh);
/* x itself if contiguous, else a recorded contiguous copy. */
tdm_tensor *tdm__contig(tdm_tape *tp, tdm_tensor *x);
/* Normalises a possibly negative axis; -1 if out of range (and records the error). */
int tdm__axis(tdm_tape *tp, const char *op, const tdm_tensor *x, int axis);
/* "(2, 3)" for t, in a rotating set of static-per-thread buffers (valid for a few calls). */
const char *tdm__shp(const tdm_tensor *t);

#endif
