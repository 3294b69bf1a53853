/* tandem — define-by-run autograd: the tape, the differentiable ops, backward and hooks.
 *
 * A tape is the per-step context: every op allocates its output from the tape's arena and, when
 * gradients are enabled and an input requires them, records a node. tdm_backward walks the nodes
 * in reverse and ACCUMULATES (+=) gradients. tdm_tape_reset frees every activation at once while
 * keeping the memory, so a steady-state training step calls no malloc.
 *
 * Errors are sticky, so model code reads like math: an op given bad input returns NULL and
 * records the first error on the tape; every later op given NULL returns NULL too. Check once:
 *
 *   tdm_tape_reset(tp);
 *   tdm_tensor *h = tdm_relu(tp, tdm_linear(tp, x, w1, b1));   // x (B, 784) -> h (B, 512)
 *   tdm_tensor *loss = tdm_cross_entropy(tp, tdm_linear(tp, h, w2, b2), y, -100);
 *   if (tdm_backward(tp, loss) != TDM_OK) fprintf(stderr, "%s\n", tdm_tape_error(tp));
 *
 * Ops compute in f32 (tdm_cast converts to and from bf16/f16); index inputs are i32 or i64.
 * Non-contiguous inputs (views) are copied to contiguous form by the op that needs it.
 * Thread safety: a tape and the tensors it made belong to one thread at a time.
 */
#ifndef TANDEM_AUTOGRAD_H
#define TANDEM_AUTOGRAD_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_tape tdm_tape;

/* ---- the tape ---------------------------------------------------------------------------- */
tdm_status tdm_tape_create(tdm_tape **out, size_t arena_bytes);
void tdm_tape_destroy(tdm_tape *tp);
/* Frees every tensor and node made since the last reset and clears the sticky error. */
void tdm_tape_reset(tdm_tape *tp);
/* The first error since the last reset (TDM_OK if none) and its detail. */
tdm_status tdm_tape_status(const tdm_tape *tp);
const char *tdm_tape_error(const tdm_tape *tp);
/* Gradient recording on (default) or off ("no-grad" mode for evaluation). */
void tdm_tape_set_grad_enabled(tdm_tape *tp, int enabled);
int tdm_tape_grad_enabled(const tdm_tape *tp);
/* Training mode turns dropout on (default off). */
void tdm_tape_set_training(tdm_tape *tp, int training);
/* Dropout masks are a function of (seed, the dropout call's order in the step, sample_base +
 * the sample's index along dim 0, the element's index inside the sample): set the seed per
 * step and sample_base to the global index of the batch's first sample, and N ranks drop
 * exactly what one process on the N-times batch would. */
void tdm_tape_set_dropout_key(tdm_tape *tp, uint64_t seed, int64_t sample_base);
/* Mixed precision, as torch.autocast: with dt = TDM_BF16 or TDM_F16 the ops store their outputs,
 * and the gradients of those, in dt while computing in f32 (norms, softmax and losses reduce in
 * f32); parameters stay f32 and matrix products round them to dt, so a product sees dt inputs and
 * accumulates in f32. TDM_F32 (the default) turns it off. Ops that do not support it refuse 16-bit
 * inputs naming themselves. */
tdm_status tdm_tape_set_autocast(tdm_tape *tp, tdm_dtype dt);
tdm_dtype tdm_tape_autocast(const tdm_tape *tp);
/* Activation recomputation, as the models apply it in training (tdm_model_forward): BLOCK keeps
 * only each transformer block's input and runs the block again in backward; SELECTIVE keeps all
 * but the attention probabilities (B x heads x T x T), which the attention backward rebuilds from
 * q and k (Korthikanti et al. 2022). Gradients are bit for bit those of NONE (the default). */
typedef enum { TDM_RECOMPUTE_NONE = 0, TDM_RECOMPUTE_BLOCK, TDM_RECOMPUTE_SELECTIVE, TDM_RECOMPUTE_COUNT } tdm_recompute;
const char *tdm_recompute_name(tdm_recompute r); /* "none", "block", "selective" */
tdm_status tdm_tape_set_recompute(tdm_tape *tp, tdm_recompute r);
tdm_recompute tdm_tape_recompute(const tdm_tape *tp);
tdm_arena *tdm_tape_arena(tdm_tape *tp);
int tdm_tape_num_nodes(const tdm_tape *tp);

/* ---- making tensors on the tape ---------------------------------------------------------- */
tdm_tensor *tdm_new(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape);        /* uninitialised */
tdm_tensor *tdm_zeros(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape);
tdm_tensor *tdm_from_data(tdm_tape *tp, tdm_dtype dt, int ndim, const int64_t *shape, const void *data); /* copies */
/* Marks a leaf as needing a gradient. For heap tensors the gradient lives on the heap (freed by
 * tdm_tensor_destroy); for tape tensors, in the arena. */
void tdm_tensor_set_requires_grad(tdm_tensor *t, int on);
int tdm_tensor_requires_grad(const tdm_tensor *t);
/* Sets the leaf's gradient to zero (allocating it if needed). */
tdm_status tdm_tensor_zero_grad(tdm_tensor *t);
/* A view of x's data that gradients do not flow through. */
tdm_tensor *tdm_detach(tdm_tape *tp, tdm_tensor *x);

/* ---- backward ------------------------------------------------------------------------------- */
/* loss must hold one element; its gradient is seeded with 1. */
tdm_status tdm_backward(tdm_tape *tp, tdm_tensor *loss);
/* As tdm_backward, seeded with gout (same shape as out, f32): computes d(sum(out * gout)). */
tdm_status tdm_backward_with(tdm_tape *tp, tdm_tensor *out, const tdm_tensor *gout);
/* Calls fn(ctx, leaf) during backward at the moment no later node can add to leaf's gradient
 * (data parallelism starts a bucket's all-reduce from it). Leaves the step never used fire at
 * the end of backward. fn runs on the thread that called backward. NULL fn removes the hook. */
typedef void (*tdm_grad_hook_fn)(void *ctx, tdm_tensor *leaf);
void tdm_tensor_set_grad_hook(tdm_tensor *leaf, tdm_grad_hook_fn fn, void *ctx);
/* A fetch hook on a parameter runs before anything reads its values: at the start of every op
 * given the parameter or a view of it, and in backward before each node that has one of those
 * as an input runs. ZeRO stage 3 gathers the parameter's unit there (the parameter's memory is
 * given back between uses; its address never changes, so views stay valid). backward = 1 when
 * called from backward. A non-OK status fails the op (or backward) with the error detail set.
 * NULL fn removes the hook. */
typedef tdm_status (*tdm_fetch_hook_fn)(void *ctx, tdm_tensor *param, int backward);
void tdm_tensor_set_fetch_hook(tdm_tensor *param, tdm_fetch_hook_fn fn, void *ctx);

/* ---- ops -----------------------------------------------------------------------------------
 * Shapes in comments; "..." is any number of leading axes. All return NULL on error. */

/* Views: share x's data. reshape accepts one -1; a non-contiguous x is copied first. */
tdm_tensor *tdm_reshape(tdm_tape *tp, tdm_tensor *x, int ndim, const int64_t *shape);
tdm_tensor *tdm_permute(tdm_tape *tp, tdm_tensor *x, const int *perm);
tdm_tensor *tdm_transpose(tdm_tape *tp, tdm_tensor *x, int axis0, int axis1);
tdm_tensor *tdm_slice(tdm_tape *tp, tdm_tensor *x, int axis, int64_t start, int64_t len);
tdm_tensor *tdm_contiguous(tdm_tape *tp, tdm_tensor *x);
/* f32 <-> bf16 / f16 (gradients stay f32). */
tdm_tensor *tdm_cast(tdm_tape *tp, tdm_tensor *x, tdm_dtype dt);

/* a (..., M, K) @ b (..., K, N) -> (..., M, N); ta / tb transpose the last two axes of a / b.
 * b may also be 2-d and shared by every batch. */
tdm_tensor *tdm_matmul(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b, int ta, int tb);
/* x (..., I), w (O, I), b (O) or NULL -> (..., O); as nn.Linear. */
tdm_tensor *tdm_linear(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b);

/* Element-wise with NumPy broadcasting. */
tdm_tensor *tdm_add(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_sub(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_mul(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_div(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_scale(tdm_tape *tp, tdm_tensor *x, float s);

/* Sum / mean over the given axes (all axes when naxes == 0); keepdim keeps them as size 1. */
tdm_tensor *tdm_sum(tdm_tape *tp, tdm_tensor *x, int naxes, const int *axes, int keepdim);
tdm_tensor *tdm_mean(tdm_tape *tp, tdm_tensor *x, int naxes, const int *axes, int keepdim);

tdm_tensor *tdm_relu(tdm_tape *tp, tdm_tensor *x);
tdm_tensor *tdm_gelu(tdm_tape *tp, tdm_tensor *x); /* tanh approximation */
tdm_tensor *tdm_tanh(tdm_tape *tp, tdm_tensor *x);
tdm_tensor *tdm_sigmoid(tdm_tape *tp, tdm_tensor *x);
tdm_tensor *tdm_softmax(tdm_tape *tp, tdm_tensor *x, int axis);
tdm_tensor *tdm_log_softmax(tdm_tape *tp, tdm_tensor *x, int axis);

/* Mean over rows of -log softmax(logits)[target]; logits (..., C), targets (...) i32/i64;
 * rows whose target is ignore_index do not count (PyTorch's default is -100). -> () */
tdm_tensor *tdm_cross_entropy(tdm_tape *tp, tdm_tensor *logits, tdm_tensor *targets, int64_t ignore_index);
/* mean((a - b)^2) over all elements; a and b of one shape. -> () */
tdm_tensor *tdm_mse(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);

/* x (..., C), weight (C), bias (C). */
tdm_tensor *tdm_layernorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *weight, tdm_tensor *bias, float eps);
/* table (V, C), idx (...) i32/i64 in [0, V) -> (..., C). */
tdm_tensor *tdm_embedding(tdm_tape *tp, tdm_tensor *table, tdm_tensor *idx);
/* Inverted dropout with probability p when the tape is training; x itself otherwise. Dim 0 of x
 * is the batch axis (see tdm_tape_set_dropout_key). */
tdm_tensor *tdm_dropout(tdm_tape *tp, tdm_tensor *x, float p);
/* Causal self-attention: qkv (B, T, 3C) packed [q | k | v], n_head dividing C -> (B, T, C). */
tdm_tensor *tdm_attention(tdm_tape *tp, tdm_tensor *qkv, int n_head);

/* The Llama family. RMSNorm: x (..., C), weight (C) -> x / sqrt(mean(x^2) + eps) * weight. */
tdm_tensor *tdm_rmsnorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *weight, float eps);
/* Rotary position embeddings in Hugging Face's layout (each head's two halves rotate together,
 * rotate_half), for positions pos0 .. pos0 + T - 1: x (B, T, n_head x hs), hs even -> the same. */
typedef tdm_k_rope_params tdm_rope_config;
tdm_tensor *tdm_rope(tdm_tape *tp, tdm_tensor *x, int n_head, const tdm_rope_config *rc, int64_t pos0);
/* silu(gate) * up, element-wise (SwiGLU's gate); gate and up of one shape. */
tdm_tensor *tdm_swiglu(tdm_tape *tp, tdm_tensor *gate, tdm_tensor *up);
/* Causal grouped-query attention: q (B, T, n_head x hs), k and v (B, T, n_kv_head x hs), n_kv_head
 * dividing n_head; query head h uses key/value head h / (n_head / n_kv_head) -> (B, T, n_head x hs). */
tdm_tensor *tdm_attention_gqa(tdm_tape *tp, tdm_tensor *q, tdm_tensor *k, tdm_tensor *v, int n_head, int n_kv_head);

/* x (N, Ci, H, W), w (Co, Ci, KH, KW), b (Co) or NULL -> (N, Co, OH, OW). */
tdm_tensor *tdm_conv2d(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w, tdm_tensor *b, int stride, int pad);
/* (N, C, H, W) -> (N, C, OH, OW) with a k x k window. */
tdm_tensor *tdm_maxpool2d(tdm_tape *tp, tdm_tensor *x, int k, int stride, int pad);
tdm_tensor *tdm_avgpool2d(tdm_tape *tp, tdm_tensor *x, int k, int stride, int pad);

/* Runs fn(tp, x, ctx) keeping only x and the result: backward runs fn again (drawing the same
 * dropout masks) and backpropagates through what it records there, then gives it all back. fn
 * must return a contiguous tensor of x's shape and dtype (a transformer block); params are the
 * parameters it reads (their gradient hooks fire, and ZeRO stage 3 gathers them, at this node).
 * With gradients off, or nothing to differentiate, it is fn itself. */
typedef tdm_tensor *(*tdm_checkpoint_fn)(tdm_tape *tp, tdm_tensor *x, const void *ctx);
tdm_tensor *tdm_checkpoint(tdm_tape *tp, tdm_checkpoint_fn fn, const void *ctx, tdm_tensor *x, int n_params,
                           tdm_tensor *const *params);

/* Joins n tensors of equal shape but for axis. */
tdm_tensor *tdm_concat(tdm_tape *tp, int n, tdm_tensor *const *xs, int axis);
/* Splits x along axis into n views of the given sizes (which must add up to the axis). */
tdm_status tdm_split(tdm_tape *tp, tdm_tensor *x, int axis, int n, const int64_t *sizes, tdm_tensor **outs);

/* ---- gradient checking --------------------------------------------------------------------
 * Compares backward's gradients with central finite differences. fn builds the output from the
 * inputs on the tape it is given (called many times; it must be deterministic). Every input
 * that requires grad is checked element by element: d sum(out * R) / dx for a fixed random R.
 * Passes when |analytic - numeric| <= atol + rtol * |numeric| everywhere; otherwise returns
 * TDM_ERR_MISMATCH naming the input, element and both values. *max_err gets the worst ratio of
 * difference to tolerance (<= 1 passes). */
typedef tdm_tensor *(*tdm_gradcheck_fn)(tdm_tape *tp, tdm_tensor *const *inputs, void *ctx);
typedef struct tdm_gradcheck_opts {
  double eps, atol, rtol;
} tdm_gradcheck_opts;
tdm_status tdm_gradcheck(tdm_gradcheck_fn fn, void *ctx, int n, tdm_tensor *const *inputs,
                         const tdm_gradcheck_opts *opts, double *max_err);

#ifdef __cplusplus
}
#endif
#endif
