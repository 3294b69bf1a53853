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
 *
 * A NULL tape: ops return NULL (status functions TDM_ERR_INVALID_ARG) with "op: the tape is NULL"
 * in tdm_last_error(), as there is no tape to record it on; tape getters return 0, TDM_F32 or
 * TDM_RECOMPUTE_NONE (tdm_tape_status TDM_ERR_INVALID_ARG, tdm_tape_error a message saying so).
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
struct tdm_comm; /* tandem/comm.h */

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
/* Records an error on the tape as a failing op does (the first error stays) and returns NULL: for
 * code that builds a model from ops and refuses an input itself. */
tdm_tensor *tdm_tape_fail(tdm_tape *tp, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
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
/* As tdm_backward, seeded with gout (same shape as out, f32): computes d(sum(out * gout)); gout
 * NULL seeds every element with 1, d(sum(out)), for an output of any shape. */
tdm_status tdm_backward_with(tdm_tape *tp, tdm_tensor *out, const tdm_tensor *gout);
/* Backward in two passes, as zero-bubble pipelines run it: tdm_backward_inputs computes every
 * gradient but the parameters' (gout NULL seeds a one-element output with 1), so the input's
 * gradient can go to the stage before at once; tdm_backward_params then adds the parameters'
 * gradients from what the first pass left on the tape (no reset between them). Together they add
 * what tdm_backward_with adds, with the same kernels, bit for bit. */
tdm_status tdm_backward_inputs(tdm_tape *tp, tdm_tensor *out, const tdm_tensor *gout);
tdm_status tdm_backward_params(tdm_tape *tp);
/* Calls fn(ctx, leaf) during backward at the moment no later node can add to leaf's gradient
 * (data parallelism starts a bucket's all-reduce from it). Leaves the step never used fire at
 * the end of backward. fn runs on the thread that called backward. NULL fn removes the hook. */
typedef void (*tdm_grad_hook_fn)(void *ctx, tdm_tensor *leaf);
void tdm_tensor_set_grad_hook(tdm_tensor *leaf, tdm_grad_hook_fn fn, void *ctx);
/* A fetch hook on a parameter runs before anything reads its values: at the start of every op
 * given the parameter or a view of it, and in backward before each node that has one of those
 * as an input runs. ZeRO stage 3 gathers the parameter's unit there (the parameter's memory is
 * given back between uses; its address never changes, so views stay valid). [lo, hi): the
 * elements read (the whole parameter, except for the ops that read a large table a block of rows
 * at a time: tdm_embedding and tdm_lm_head). backward = 1 when called from backward with the
 * parameter's gradient written from now on (tdm_lm_head's backward reads a tied table whose
 * gradient the embedding adds later: 0). A non-OK status fails the op (or backward) with the
 * error detail set. NULL fn removes the hook. */
typedef tdm_status (*tdm_fetch_hook_fn)(void *ctx, tdm_tensor *param, int64_t lo, int64_t hi, int backward);
void tdm_tensor_set_fetch_hook(tdm_tensor *param, tdm_fetch_hook_fn fn, void *ctx);
/* Called during backward when elements [lo, hi) of a leaf's gradient are final before the whole
 * of it is (then the grad hook fires as ever): tdm_embedding's and tdm_lm_head's backward, which
 * finish a table TDM_HEAD_ROWS rows at a time, when no earlier node reads the table. ZeRO stage 3
 * reduces those rows' gradient there and gives its memory back. NULL fn removes the hook. */
typedef void (*tdm_grad_range_hook_fn)(void *ctx, tdm_tensor *leaf, int64_t lo, int64_t hi);
void tdm_tensor_set_grad_range_hook(tdm_tensor *leaf, tdm_grad_range_hook_fn fn, void *ctx);

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
/* A language model's output head: logits (..., V) = x (..., C) w^T for a table w (V, C), computed
 * TDM_HEAD_ROWS rows of w at a time: in forward those rows' logits, in backward x's gradient as the
 * blocks' products summed in block order (one product per block, so the bits are the same whatever
 * else runs), so that ZeRO stage 3 gathers a block of a large table at a time, never all of it.
 * When w was given to tdm_embedding earlier on this tape (a tied embedding), the head's part of
 * w's gradient is added by that embedding's backward, block by block right before the
 * embedding's own rows (the order one process adds them in), so the table's gradient is final a
 * block at a time. Autocast as tdm_linear. */
#define TDM_HEAD_ROWS 4096
tdm_tensor *tdm_lm_head(tdm_tape *tp, tdm_tensor *x, tdm_tensor *w);

/* Element-wise with NumPy broadcasting. */
tdm_tensor *tdm_add(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_sub(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_mul(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
tdm_tensor *tdm_div(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
/* relu(a + b), bit for bit tdm_relu(tdm_add(a, b)) (which it is, for shapes that broadcast or
 * 16-bit activations); for equal f32 shapes one op, one pass each way, no sum kept. */
tdm_tensor *tdm_add_relu(tdm_tape *tp, tdm_tensor *a, tdm_tensor *b);
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
/* As tdm_cross_entropy with label smoothing eps in [0, 1] (PyTorch's label_smoothing): each row's
 * target is (1 - eps) one-hot + eps / C uniform. logits (N, C), targets (N). -> () */
tdm_tensor *tdm_cross_entropy_smooth(tdm_tape *tp, tdm_tensor *logits, tdm_tensor *targets, int64_t ignore_index,
                                     float eps);
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
/* Batch normalization per channel of x (N, C, ...), as nn.BatchNorm2d: weight and bias (C);
 * running_mean / running_var (C) f32 or both NULL (track_running_stats=False). When the tape is
 * training, the batch's statistics normalise (biased variance) and the running ones are updated
 * in place, r = (1 - momentum) r + momentum * batch (unbiased variance); fewer than 2 values per
 * channel is PyTorch's error. Otherwise the running statistics normalise (the batch's when NULL).
 * sync (a communicator, or NULL): in training, the statistics and in backward the gradient sums
 * are all-reduced over its ranks in rank order (nn.SyncBatchNorm), so N ranks of batch b
 * normalise as one process of batch N*b; the weight and bias gradients stay this rank's (data
 * parallelism averages them). Every rank must call it in the same order; evaluation never
 * communicates. PyTorch's defaults: momentum 0.1, eps 1e-5. */
tdm_tensor *tdm_batchnorm(tdm_tape *tp, tdm_tensor *x, tdm_tensor *weight, tdm_tensor *bias, tdm_tensor *running_mean,
                          tdm_tensor *running_var, float momentum, float eps, struct tdm_comm *sync);
/* relu(tdm_batchnorm(...)) as one op, equal to the two bit for bit (forward, every gradient, the
 * running statistics), with one pass fewer each way and no normalised tensor kept. */
tdm_tensor *tdm_batchnorm_relu(tdm_tape *tp, tdm_tensor *x, tdm_tensor *weight, tdm_tensor *bias,
                               tdm_tensor *running_mean, tdm_tensor *running_var, float momentum, float eps,
                               struct tdm_comm *sync);
/* relu(tdm_batchnorm(...) + r) as one op (a residual block's end), equal to tdm_add_relu of the
 * two bit for bit (forward, every gradient, the running statistics), with no normalised tensor
 * kept. r: x's shape and f32 (else, or r == x, it runs as the two ops). */
tdm_tensor *tdm_batchnorm_add_relu(tdm_tape *tp, tdm_tensor *x, tdm_tensor *weight, tdm_tensor *bias,
                                   tdm_tensor *running_mean, tdm_tensor *running_var, float momentum, float eps,
                                   struct tdm_comm *sync, tdm_tensor *r);
/* (N, C, H, W) -> (N, C): the mean over each channel's plane (nn.AdaptiveAvgPool2d(1) + flatten). */
tdm_tensor *tdm_global_avgpool2d(tdm_tape *tp, tdm_tensor *x);

/* Joins n tensors of equal shape but for axis. */
tdm_tensor *tdm_concat(tdm_tape *tp, int n, tdm_tensor *const *xs, int axis);
/* Splits x along axis into n views of the given sizes (which must add up to the axis). */
tdm_status tdm_split(tdm_tape *tp, tdm_tensor *x, int axis, int n, const int64_t *sizes, tdm_tensor **outs);

/* ---- custom differentiable ops --------------------------------------------------------------
 * An op defined outside the library by two callbacks, for what the built-in ops cannot say, such
 * as communication inside forward or backward (tensor parallelism all-reduces there):
 *
 *   static tdm_status sq_fwd(tdm_custom_ctx *c, tdm_tape *tp, int n, tdm_tensor *const *in, void *user,
 *                            tdm_tensor **out) {
 *     tdm_custom_save(c, in[0]);                  // x, kept for backward
 *     *out = tdm_mul(tp, in[0], in[0]);           // ops called here record nothing
 *     return TDM_OK;                              // (a failed op inside: the tape's error wins)
 *   }
 *   static tdm_status sq_bwd(tdm_custom_ctx *c, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
 *     const float *x = tdm_tensor_data(tdm_custom_saved(c, 0)), *g = tdm_tensor_data(gy);
 *     float *gx = gin[0] ? tdm_tensor_data(gin[0]) : NULL; // NULL: input 0 wants no gradient
 *     for (int64_t i = 0; gx && i < tdm_tensor_numel(gy); i++) gx[i] = 2 * x[i] * g[i];
 *     return TDM_OK;
 *   }
 *   static const tdm_custom_op square = {"square", sq_fwd, sq_bwd, 0};
 *   tdm_tensor *y = tdm_custom(tp, &square, NULL, 1, &x);
 *
 * forward runs at once, on the calling thread, with gradient recording off. Its inputs are
 * contiguous (a view is copied first). It computes the output with any ops on tp (or fills a
 * tensor made with tdm_new) and sets *out; an input itself is allowed (an identity forward: the
 * result is then a new tensor sharing its data). A non-OK return, or an op inside that failed,
 * fails the op with that status and detail: return the status of a library call that failed
 * (its message is kept), or tdm_custom_fail(ctx, status, "...") for a problem of your own.
 * When gradients are on and an input requires one, the op is recorded, and backward (run by
 * tdm_backward, on its thread, in reverse order of recording, only when the output got a
 * gradient) receives the output's gradient grad_out (f32, the output's shape) and grad_in[i]:
 * for each input that requires a gradient an f32 tensor of its shape holding zeros, into which
 * it writes (or adds) d loss / d input i; the tape adds that to the input's gradient (or, with
 * the op's accumulate set, the input's gradient itself, to add into). grad_in[i] is NULL for the
 * other inputs (indices, constants). A non-OK return fails backward, naming the op. Ops may be
 * called in backward (they record nothing); their tensors live until the reset. user is given to
 * both callbacks as passed to tdm_custom.
 *
 * Ownership: the context and what it holds belong to the tape and go at tdm_tape_reset. A saved
 * tensor is not copied: it must stay valid until backward has run (tensors of the tape do until
 * the reset; a heap tensor, a parameter, is the caller's). op and user are the caller's and must
 * stay valid until backward has run or the tape is reset (a user pointer to the caller's stack
 * is fine for forward alone: keep what backward needs in the context). What else backward needs
 * (sizes, scalars, index arrays) goes in tdm_custom_alloc memory, found again with
 * tdm_custom_state. Thread safety: as the tape's; the callbacks run on the calling thread. Ranks
 * running a collective op must record and run the same ops in the same order: backward runs
 * nodes in reverse order of recording on every rank alike. */
typedef struct tdm_custom_ctx tdm_custom_ctx;
typedef tdm_status (*tdm_custom_forward_fn)(tdm_custom_ctx *ctx, tdm_tape *tp, int n, tdm_tensor *const *inputs,
                                            void *user, tdm_tensor **out);
typedef tdm_status (*tdm_custom_backward_fn)(tdm_custom_ctx *ctx, const tdm_tensor *grad_out, int n,
                                             tdm_tensor *const *grad_in, void *user);
typedef struct tdm_custom_op {
  const char *name;                /* for errors and the tape's node */
  tdm_custom_forward_fn forward;
  tdm_custom_backward_fn backward; /* NULL: the op is not differentiable (an error if recorded) */
  /* 0: grad_in[i] holds zeros (see above). 1: grad_in[i] is input i's gradient itself, holding
   * what other consumers of the input have added so far (zeros at first), and backward must add
   * (+=) into it, never overwrite: no temporary, which matters when an input is a parameter
   * (its gradient always exists, so the zeros of mode 0 are a buffer of its size, then added). */
  int accumulate;
} tdm_custom_op;
/* Runs op on n inputs (n >= 0; inputs may be of any dtype). Returns the output, or NULL with the
 * tape's error set ("op 'name': ..."). */
tdm_tensor *tdm_custom(tdm_tape *tp, const tdm_custom_op *op, void *user, int n, tdm_tensor *const *inputs);
/* In forward: keeps t for backward (see ownership above); its index is the count of earlier
 * saves. TDM_ERR_NO_MEMORY when the tape's arena is full. */
tdm_status tdm_custom_save(tdm_custom_ctx *ctx, tdm_tensor *t);
int tdm_custom_num_saved(const tdm_custom_ctx *ctx);
tdm_tensor *tdm_custom_saved(const tdm_custom_ctx *ctx, int i); /* NULL when i is out of range */
/* bytes from the tape's arena, 64-byte aligned, valid until the tape is reset (NULL when full):
 * what forward keeps for backward besides tensors, and scratch in either. */
void *tdm_custom_alloc(tdm_custom_ctx *ctx, size_t bytes);
/* One pointer that forward leaves for backward (NULL until set): typically a struct made with
 * tdm_custom_alloc holding the sizes and scalars backward needs. */
void tdm_custom_set_state(tdm_custom_ctx *ctx, void *state);
void *tdm_custom_state(const tdm_custom_ctx *ctx);
tdm_tape *tdm_custom_tape(const tdm_custom_ctx *ctx);
/* Sets the calling thread's error detail (printf-style) and returns st, for forward or backward
 * to return: the op then fails with "op 'name': <detail>". */
tdm_status tdm_custom_fail(tdm_custom_ctx *ctx, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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
