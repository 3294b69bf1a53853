/* tandem — the CUDA backend: device memory, and GPT training on one GPU.
 *
 * Optional at build time (CMake's TANDEM_CUDA, cmake/cuda.cmake). Without it every function here
 * exists and fails with TDM_ERR_NOT_SUPPORTED "built without CUDA"; tdm_cuda_built() says which.
 * With it, tdm_cuda_init() fails with TDM_ERR_NOT_SUPPORTED naming cudaGetDeviceCount's answer
 * when the machine has no usable GPU.
 *
 * Memory: plain cudaMalloc (never managed memory). Out of device memory is TDM_ERR_NO_MEMORY with
 * what was asked, what the device has free, and (for the GPT) the whole plan.
 *
 * GPT training (src/cuda/gpt_cuda.c) keeps, on the device, the parameters, the gradients and the
 * AdamW moments each in ONE buffer laid out as tdm_params' host buffer (same offsets, same names),
 * and every activation in one arena allocated at create: no allocation in the steady state.
 *   tdm_cuda_gpt *g;
 *   tdm_cuda_gpt_create(&g, &model_cfg, tdm_model_params(m), B, T, TDM_CUDA_BF16);  // copies the weights up
 *   for (...) {
 *     tdm_cuda_gpt_forward(g, x, y, &loss);   // host tokens (B, T) i32; loss = mean cross-entropy
 *     tdm_cuda_gpt_zero_grad(g);
 *     tdm_cuda_gpt_backward(g);
 *     tdm_cuda_gpt_update(g, &optim_cfg, lr, clip, &norm);
 *   }
 *   tdm_cuda_gpt_download(g, tdm_model_params(m), 0);                   // weights back to the host
 * This first version runs the GPT's forward and backward as explicit calls on device pointers (as
 * llm.c does), not through the autograd tape: docs/design.md says what remains for the
 * per-device kernel table.
 *
 * Ownership: the caller owns what it creates and frees it with the matching call; host pointers
 * are only read during the call. Thread safety: none — one host thread drives the backend (one
 * device, one stream, one cuBLAS handle).
 */
#ifndef TANDEM_CUDA_H
#define TANDEM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the library was built with the CUDA backend, else 0. */
int tdm_cuda_built(void);
/* Selects device 0 and creates the cuBLAS handle (once; later calls return at once). */
tdm_status tdm_cuda_init(void);
/* The device's name (into buf) and its memory in bytes; after tdm_cuda_init. */
tdm_status tdm_cuda_device_info(char *buf, size_t buf_len, size_t *free_bytes, size_t *total_bytes);

/* Device buffers. what names the buffer in the out-of-memory message. */
tdm_status tdm_cuda_malloc(void **out, size_t bytes, const char *what);
void tdm_cuda_free(void *p); /* NULL: nothing */
tdm_status tdm_cuda_to_device(void *dst, const void *src, size_t bytes);
tdm_status tdm_cuda_to_host(void *dst, const void *src, size_t bytes);
tdm_status tdm_cuda_copy(void *dst, const void *src, size_t bytes); /* device to device */
tdm_status tdm_cuda_memset0(void *p, size_t bytes);
/* Waits for all queued work; a kernel's failure comes back here, named with where. */
tdm_status tdm_cuda_sync(const char *where);
/* TF32 tensor cores for the fp32 products (default off: fp32 as the CPU computes it). */
void tdm_cuda_set_tf32(int on);

/* ---- GPT training on one GPU ------------------------------------------------------------------- */
/* The arithmetic of a GPU run: fp32 as the CPU; TF32 tensor-core products (fp32 storage); bf16
 * mixed precision (bf16 products with fp32 accumulation, the products' inputs stored in bf16, the
 * fused flash attention kernel, fp32 master weights, gradients and AdamW state). */
enum { TDM_CUDA_FP32 = 0, TDM_CUDA_TF32 = 1, TDM_CUDA_BF16 = 2 };
typedef struct tdm_cuda_gpt_plan {
  size_t params, grads, adam, weights_bf16, activations, total; /* bytes (weights_bf16: 0 unless bf16) */
} tdm_cuda_gpt_plan;
/* What tdm_cuda_gpt_create will allocate for this model, batch and precision (exact). */
tdm_status tdm_cuda_gpt_plan_bytes(const tdm_model_config *mc, int64_t B, int64_t T, int precision, tdm_cuda_gpt_plan *out);

typedef struct tdm_cuda_gpt tdm_cuda_gpt;
/* mc: a GPT config without dropout; params: its host parameters (tdm_model_params), copied up.
 * B x T tokens per step, T <= block_size; precision: TDM_CUDA_FP32, _TF32 or _BF16 (bf16 needs a
 * head size of 16, 32, 64 or 128: TDM_ERR_NOT_SUPPORTED otherwise). */
tdm_status tdm_cuda_gpt_create(tdm_cuda_gpt **out, const tdm_model_config *mc, const tdm_params *params, int64_t B,
                               int64_t T, int precision);
void tdm_cuda_gpt_destroy(tdm_cuda_gpt *g);
/* idx, targets: host (B, T) token ids, checked against the vocabulary. With targets: *loss = the
 * mean cross-entropy, and the loss's gradient with respect to the logits is kept for backward
 * (fused with the loss, as llm.c). targets NULL: logits only (tdm_cuda_gpt_logits), loss not set. */
tdm_status tdm_cuda_gpt_forward(tdm_cuda_gpt *g, const int32_t *idx, const int32_t *targets, float *loss);
tdm_status tdm_cuda_gpt_logits(const tdm_cuda_gpt *g, float *host); /* (B, T, V), after forward without targets */
tdm_status tdm_cuda_gpt_zero_grad(tdm_cuda_gpt *g);
/* Accumulates (+=) the gradients of the last forward's loss; needs a forward with targets. */
tdm_status tdm_cuda_gpt_backward(tdm_cuda_gpt *g);
/* Clips the gradients' global norm to clip (0: no clipping; PyTorch's coefficient) and applies
 * AdamW (or Adam: oc->kind) with this learning rate; *norm_out (may be NULL) gets the norm before
 * clipping. TDM_ERR_INVALID_ARG for a non-finite norm (nothing updated). */
tdm_status tdm_cuda_gpt_update(tdm_cuda_gpt *g, const tdm_optim_config *oc, float lr, float clip, float *norm_out);
/* Copies the device's parameters (and, if grads, the gradients) into params (the same layout). */
tdm_status tdm_cuda_gpt_download(const tdm_cuda_gpt *g, tdm_params *params, int grads);
/* The plan it allocated. */
tdm_cuda_gpt_plan tdm_cuda_gpt_get_plan(const tdm_cuda_gpt *g);
/* Where the device time goes: with profiling on, a CUDA event is recorded before each group of
 * kernels (products, attention, layernorm, ...) and the time up to the next event is added to the
 * group's category. Costs an event per group (about 400 a step) and a wait at each phase's end:
 * measure speed with it off. Off again frees the events and the sums. */
tdm_status tdm_cuda_gpt_set_profile(tdm_cuda_gpt *g, int on);
/* The categories' names (static strings) and milliseconds summed since profiling was turned on,
 * at most cap of them; returns how many (0 when off). names or ms may be NULL. */
int tdm_cuda_gpt_profile(const tdm_cuda_gpt *g, const char **names, double *ms, int cap);

#ifdef __cplusplus
}
#endif
#endif
