/* tandem — parameters, modules and models.
 *
 * Parameters live in ONE contiguous f32 buffer with a tensor view per parameter, and their
 * gradients in a second buffer laid out the same way (as llm.c), so data parallelism, ZeRO
 * shards and checkpoints are spans of these buffers. Building is two-phase: modules declare
 * their parameters, then tdm_params_finalize allocates both buffers and initialises every
 * parameter from its own random stream (hash(seed, index)), so a model is bit-identical for a
 * seed whatever else is declared after it.
 *
 *   tdm_model_config cfg = tdm_model_config_mlp();        // 784-512-256-10, dropout 0.3
 *   tdm_model *m;
 *   if (tdm_model_create(&m, &cfg, 42) != TDM_OK) ...;
 *   tdm_tensor *logits = tdm_model_forward(m, tp, x);      // x (B, 784) -> (B, 10)
 *   tdm_model_destroy(m);
 *
 * Names follow PyTorch's module naming so safetensors files move between tandem and PyTorch
 * unchanged (docs/models.md lists them). Thread safety: a model is used by one thread at a time.
 *
 * A NULL handle (parameters, module, model, cache) is TDM_ERR_INVALID_ARG naming it; getters then
 * return 0 (counts, sizes, flags), -1 (tdm_params_offset, tdm_sample_token) or NULL, and set
 * tdm_last_error(). A module's forward given a NULL module fails on the tape as an op does.
 */
#ifndef TANDEM_NN_H
#define TANDEM_NN_H

#include <stdint.h>

#include "tandem/autograd.h"
#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameters ------------------------------------------------------------------------------ */
typedef enum { TDM_INIT_ZEROS, TDM_INIT_ONES, TDM_INIT_UNIFORM, TDM_INIT_NORMAL } tdm_init_kind;
typedef struct tdm_init {
  tdm_init_kind kind;
  float a, b; /* uniform: [a, b); normal: mean a, std b */
} tdm_init;

typedef struct tdm_params tdm_params;
tdm_status tdm_params_create(tdm_params **out);
void tdm_params_destroy(tdm_params *p);
/* Declares a parameter; *out is valid at once, its data after finalize. decay marks it for
 * weight decay when the optimizer decays matrices only. name is copied. */
tdm_status tdm_params_declare(tdm_params *p, const char *name, int ndim, const int64_t *shape, tdm_init init,
                              int decay, tdm_tensor **out);
tdm_status tdm_params_finalize(tdm_params *p, uint64_t seed);
/* Finalizes without memory for the buffers chosen: TDM_RESERVE_GRAD makes the gradient buffer
 * address space reserved for the whole model that holds pages only where written (ZeRO stages 2
 * and 3 reduce a bucket's gradients into their shard, then give the pages back with
 * tdm_params_release); TDM_RESERVE_DATA does the same to the parameters, which are then not
 * initialised (stage 3: a rank fills its shard with tdm_params_init_range and gathers a unit into
 * the buffer before use). Pointers to parameters stay valid throughout. */
enum { TDM_RESERVE_DATA = 1, TDM_RESERVE_GRAD = 2 };
tdm_status tdm_params_finalize_reserved(tdm_params *p, uint64_t seed, int which);
int tdm_params_is_reserved(const tdm_params *p); /* the TDM_RESERVE_* bits */
/* Writes into dst the hi - lo initial values tdm_params_finalize gives elements [lo, hi) (each
 * parameter's values come from its own stream, so any range can be made alone). */
tdm_status tdm_params_init_range(const tdm_params *p, int64_t lo, int64_t hi, float *dst);
/* The initial values of count runs of parameter i: run k is its elements [first + k * stride,
 * first + k * stride + len), written one after another into dst (count x len floats). The
 * parameter's stream is drawn once, so a tensor-parallel rank makes its slice of a parameter
 * (rows or columns of it) with the values the whole model has, at the cost of the whole one. */
tdm_status tdm_params_init_strided(const tdm_params *p, int i, int64_t first, int64_t len, int64_t stride, int64_t count,
                                   float *dst);
/* Reserved storage only: gives back the pages that lie wholly inside elements [lo, hi) of the
 * data (which = 0) or gradient (which = 1) buffer and zeroes the rest of the range; the range
 * reads as zeros afterwards. Not while another thread writes inside [lo, hi). */
tdm_status tdm_params_release(tdm_params *p, int which, int64_t lo, int64_t hi);
int tdm_params_count(const tdm_params *p);
tdm_tensor *tdm_params_get(const tdm_params *p, int i);
tdm_tensor *tdm_params_find(const tdm_params *p, const char *name);
int64_t tdm_params_offset(const tdm_params *p, int i); /* element offset in the buffers */
int tdm_params_decay(const tdm_params *p, int i);
int64_t tdm_params_numel(const tdm_params *p);
float *tdm_params_data(const tdm_params *p); /* numel floats */
float *tdm_params_grad(const tdm_params *p); /* numel floats */
/* Moves the gradients (values included) into buf, numel floats that the caller owns and keeps
 * alive until the next call (data parallelism puts them in shared memory); buf NULL moves them
 * back into a buffer of p's own. Not while a backward pass runs. */
tdm_status tdm_params_set_grad_buffer(tdm_params *p, float *buf);
void tdm_params_zero_grad(tdm_params *p);
/* Writes every parameter (f32) and the given metadata (key/value string pairs) as safetensors,
 * through a temporary file renamed into place, so path never holds a partial file. */
tdm_status tdm_params_save(const tdm_params *p, const char *path, int n_meta, const char *const *meta_kv);
/* Loads a safetensors file into the parameters. Every parameter must be present with its exact
 * shape (f32, bf16 or f16 are converted); extra tensors are an error unless allow_extra. */
tdm_status tdm_params_load(tdm_params *p, const char *path, int allow_extra);
/* The same checks, then only the spans [los[k], his[k]) of the parameter buffer, each written to
 * dsts[k] (his[k] - los[k] floats): a ZeRO stage 3 rank loads its shard. */
tdm_status tdm_params_load_spans(const tdm_params *p, const char *path, int allow_extra, int n_spans, const int64_t *los,
                                 const int64_t *his, float *const *dsts);

/* ---- modules: plain structs holding parameter views -------------------------------------- */
typedef struct tdm_linear_mod {
  tdm_tensor *weight, *bias; /* (out, in), (out) or NULL */
} tdm_linear_mod;
/* PyTorch's default init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias. */
tdm_status tdm_linear_mod_init(tdm_linear_mod *m, tdm_params *p, const char *prefix, int64_t in, int64_t out,
                               int bias);
tdm_tensor *tdm_linear_mod_forward(tdm_tape *tp, const tdm_linear_mod *m, tdm_tensor *x);

typedef struct tdm_conv2d_mod {
  tdm_tensor *weight, *bias; /* (Co, Ci, K, K), (Co) */
  int stride, pad;
} tdm_conv2d_mod;
tdm_status tdm_conv2d_mod_init(tdm_conv2d_mod *m, tdm_params *p, const char *prefix, int64_t ci, int64_t co, int k,
                               int stride, int pad);
tdm_tensor *tdm_conv2d_mod_forward(tdm_tape *tp, const tdm_conv2d_mod *m, tdm_tensor *x);

typedef struct tdm_embedding_mod {
  tdm_tensor *weight; /* (V, C) */
} tdm_embedding_mod;
tdm_status tdm_embedding_mod_init(tdm_embedding_mod *m, tdm_params *p, const char *prefix, int64_t v, int64_t c,
                                  float std);

typedef struct tdm_layernorm_mod {
  tdm_tensor *weight, *bias;
  float eps;
} tdm_layernorm_mod;
tdm_status tdm_layernorm_mod_init(tdm_layernorm_mod *m, tdm_params *p, const char *prefix, int64_t c);
tdm_tensor *tdm_layernorm_mod_forward(tdm_tape *tp, const tdm_layernorm_mod *m, tdm_tensor *x);

/* Pre-LN transformer block as GPT-2: x + attn(ln_1(x)), then x + mlp(ln_2(x)). */
typedef struct tdm_block_mod {
  tdm_layernorm_mod ln_1, ln_2;
  tdm_linear_mod c_attn, attn_proj, c_fc, mlp_proj;
  int n_head;
  float dropout;
} tdm_block_mod;
tdm_status tdm_block_mod_init(tdm_block_mod *m, tdm_params *p, const char *prefix, int64_t c, int n_head,
                              int n_layer, float dropout);
tdm_tensor *tdm_block_mod_forward(tdm_tape *tp, const tdm_block_mod *m, tdm_tensor *x); /* (B, T, C) */

/* Llama's decoder layer, Hugging Face's LlamaDecoderLayer: x + o(attn(rope(q(n1(x))), rope(k(..)),
 * v(..))), then x + down(silu(gate(n2(x))) * up(n2(x))); RMSNorms, no biases. Names under prefix:
 * input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj. */
typedef struct tdm_llama_block_mod {
  tdm_tensor *attn_norm, *q, *k, *v, *o, *mlp_norm, *gate, *up, *down;
  int n_head, n_kv_head;
  float eps, dropout;
  tdm_rope_config rope;
} tdm_llama_block_mod;
struct tdm_model_config;
tdm_status tdm_llama_block_mod_init(tdm_llama_block_mod *m, tdm_params *p, const char *prefix,
                                    const struct tdm_model_config *c);
tdm_tensor *tdm_llama_block_mod_forward(tdm_tape *tp, const tdm_llama_block_mod *m, tdm_tensor *x); /* (B, T, C) */

/* ---- models -------------------------------------------------------------------------------- */
typedef enum { TDM_MODEL_MLP, TDM_MODEL_CNN, TDM_MODEL_GPT, TDM_MODEL_LLAMA, TDM_MODEL_RESNET, TDM_MODEL_KIND_COUNT } tdm_model_kind;

typedef struct tdm_model_config {
  tdm_model_kind kind;
  float dropout;
  /* MLP: in_features -> hidden[0] -> ... -> n_classes with ReLU and dropout between */
  int64_t in_features, n_classes;
  int n_hidden;
  int64_t hidden[8];
  /* CNN: (in_channels, height, width) images, conv(c1, 5x5) pool conv(c2, 5x5) pool linear */
  int64_t in_channels, height, width, c1, c2;
  /* GPT and Llama */
  int64_t n_layer, n_head, n_embd, block_size, vocab_size;
  /* Llama: key/value heads (grouped-query attention; dividing n_head), the SwiGLU hidden width,
   * rotary embeddings, RMSNorm's eps, and whether the output head is the token embedding (tied) */
  int64_t n_kv_head, ffn_hidden;
  tdm_rope_config rope;
  float norm_eps;
  int tie_embeddings;
  /* ResNet (src/nn/resnet.c), on (in_channels, height, width) images: a 3x3 stem conv of
   * base_width channels, BN, ReLU; n_stages stages of stage_blocks[s] basic blocks of base_width
   * << s channels (stride 2 entering every stage but the first, with a 1x1 conv + BN projection
   * where the shape changes); global average pooling; a linear layer to n_classes. */
  int n_stages;
  int64_t stage_blocks[4], base_width;
} tdm_model_config;

tdm_model_config tdm_model_config_mlp(void); /* 784-512-256-10, dropout 0.3 */
tdm_model_config tdm_model_config_cnn(void); /* 1x28x28, 16 and 32 channels, 10 classes */
tdm_model_config tdm_model_config_gpt_mini(void); /* 4 layers, 4 heads, 256 wide, block 128, vocab 256 */
tdm_model_config tdm_model_config_gpt2_124m(void); /* GPT-2 small: 12 layers, 12 heads, 768 wide, block 1024, vocab 50257 */
/* A GPT config by name ("mini" or "gpt2-124M"; NULL: mini) with the fields given > 0 overriding
 * it (the order: layers, heads, width, block, vocab). TDM_ERR_INVALID_ARG for another name. */
tdm_status tdm_model_config_gpt(const char *name, const int64_t override[5], tdm_model_config *out);
/* A Llama config by name: "llama-mini" (4 layers, 4 heads, 2 key/value heads, 256 wide, SwiGLU
 * 688, block 128, vocab 256, theta 10000, untied head: GPT mini's size) or "llama3.2-1B" (Meta's
 * Llama 3.2 1B: 16 layers, 32 heads, 8 key/value heads, 2048 wide, SwiGLU 8192, context 131072,
 * vocab 128256, theta 500000 with Llama 3's frequency scaling (32, 1, 4, 8192), tied head:
 * 1.24 B parameters); NULL: llama-mini. TDM_ERR_INVALID_ARG for another name. */
tdm_status tdm_model_config_llama(const char *name, tdm_model_config *out);
const char *tdm_model_kind_name(tdm_model_kind k);
/* ResNet by name: "resnet20" (CIFAR-style: 3 stages of 3 blocks, width 16, 0.27 M parameters)
 * or "resnet18" (4 stages of 2 blocks, width 64, with a 3x3 stride-1 stem and no max-pool, as
 * adapted to small images); width > 0 overrides the base width. For 1x28x28 images and 10
 * classes (the trainer sets them from the data). TDM_ERR_INVALID_ARG for another name. */
tdm_status tdm_model_config_resnet(const char *name, int64_t width, tdm_model_config *out);

typedef struct tdm_model tdm_model;
tdm_status tdm_model_create(tdm_model **out, const tdm_model_config *cfg, uint64_t seed);
/* As tdm_model_create; reserved (TDM_RESERVE_* bits, 0: none) finalizes the parameters with
 * tdm_params_finalize_reserved (ZeRO stages 2 and 3). */
tdm_status tdm_model_create_with(tdm_model **out, const tdm_model_config *cfg, uint64_t seed, int reserved);
void tdm_model_destroy(tdm_model *m);
tdm_params *tdm_model_params(const tdm_model *m);
const tdm_model_config *tdm_model_get_config(const tdm_model *m);
/* MLP: x (B, in_features) f32; CNN: x (B, C, H, W) f32; GPT and Llama: token ids (B, T) i32/i64,
 * T <= block_size. Returns logits (B, classes) or (B, T, vocab); NULL with the tape's error set. */
tdm_tensor *tdm_model_forward(tdm_model *m, tdm_tape *tp, tdm_tensor *x);
/* Batch norm synchronised over comm's ranks (nn.SyncBatchNorm; comm NULL or of one rank: per-rank
 * statistics). The model keeps comm, which must outlive its use; every rank's forward and
 * backward then take part in collectives on it, in the same order. */
void tdm_model_set_bn_sync(tdm_model *m, struct tdm_comm *comm);

/* A GPT's blocks [first, last) alone, as a pipeline stage runs them: with embed, x is the token
 * ids (B, T) and the embeddings come first, else x is the activations (B, T, C) f32; with head,
 * the final norm and the logits (B, T, vocab) come last, from head_weight when given (a stage that
 * does not own the tied embedding passes its own view of it) or from wte; head_input gets the
 * final norm's output. Dropout masks are those of tdm_model_forward: keyed by the block, not by
 * the cut. Returns the activations or the logits; NULL with the tape's error set. */
typedef struct tdm_gpt_range {
  int64_t first, last;
  int embed, head;
  tdm_tensor *head_weight;
  tdm_tensor *head_input; /* out */
} tdm_gpt_range;
tdm_tensor *tdm_gpt_forward_range(tdm_model *m, tdm_tape *tp, tdm_tensor *x, tdm_gpt_range *r);
/* A Llama's decoder layers [first, last) alone, with the same range and conventions: with embed
 * the token embedding (and its dropout) first; with head the final RMSNorm and the logits come
 * last, from head_weight when given, else from lm_head (the embedding's weight when tied);
 * head_input gets the norm's output. Dropout masks are keyed by the layer as GPT's are (the
 * embedding's call 0, layer l's 1 + 2l and 2 + 2l), and --recompute block reruns each layer in
 * backward alike. tdm_model_forward is this range over every layer. */
tdm_tensor *tdm_llama_forward_range(tdm_model *m, tdm_tape *tp, tdm_tensor *x, tdm_gpt_range *r);
/* The range of whichever transformer m is (gpt or llama; others: NULL with the tape's error set).
 * What a pipeline stage runs. */
tdm_tensor *tdm_model_forward_range(tdm_model *m, tdm_tape *tp, tdm_tensor *x, tdm_gpt_range *r);

/* The MLP's forward and backward written against the kernels directly, with no tape (the
 * "low-level engine"). x (B, in) f32, y (B) i32. Gradients are ACCUMULATED into the model's
 * gradient buffer; scratch comes from arena. Dropout, when training, matches tdm_dropout under
 * tdm_tape_set_dropout_key(dropout_seed, sample_base). Returns the mean cross-entropy in *loss. */
tdm_status tdm_mlp_lowlevel_step(tdm_model *m, tdm_arena *arena, const float *x, const int32_t *y, int64_t B,
                                 int training, uint64_t dropout_seed, int64_t sample_base, float *loss);

/* ---- generation (GPT, Llama) -----------------------------------------------------------------
 * A key/value cache for incremental decoding: tdm_kv_cache_step feeds one token at the next
 * position and returns the logits (vocab) for the token after it; the keys and values of every
 * earlier position are reused, so each step costs O(context), not O(context^2). The cache holds
 * 2 x layers x positions x width floats (Llama: the width of its key/value heads only). One
 * thread per cache. */
typedef struct tdm_kv_cache tdm_kv_cache;
tdm_status tdm_kv_cache_create(tdm_kv_cache **out, tdm_model *m); /* positions: the block size */
/* A cache of at most max_len positions (<= 0 or beyond the block size: the block size), so a long
 * context model (Llama 3.2: 131072) decodes a short text without holding its whole context. */
tdm_status tdm_kv_cache_create_len(tdm_kv_cache **out, tdm_model *m, int64_t max_len);
int64_t tdm_kv_cache_capacity(const tdm_kv_cache *c);
void tdm_kv_cache_destroy(tdm_kv_cache *c);
void tdm_kv_cache_reset(tdm_kv_cache *c);
int64_t tdm_kv_cache_len(const tdm_kv_cache *c);
/* logits stay valid until the next step. Fails when the context is full or the token is out of
 * the vocabulary. */
tdm_status tdm_kv_cache_step(tdm_kv_cache *c, int32_t token, const float **logits);
/* Greedy when top_k == 1 or temperature <= 0; else softmax(logits / temperature) over the top_k
 * largest (all when top_k <= 0), drawn with rng (which greedy may leave NULL). */
int32_t tdm_sample_token(const float *logits, int64_t V, float temperature, int top_k, tdm_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
