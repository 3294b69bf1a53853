/* The tandem command's CUDA paths (tools/bench_gpt_cuda.c, tools/train_cuda.c). */
#ifndef TANDEM_TOOLS_CUDA_H
#define TANDEM_TOOLS_CUDA_H
#include "tandem/tandem.h"

/* tandem bench gpt --device cuda: returns the exit code (0, 1 failure, 2 usage). */
/* precision: TDM_CUDA_FP32, _TF32 or _BF16 (tandem/cuda.h) */
int bench_gpt_cuda(const tdm_model_config *mc, int64_t B, int64_t T, int64_t steps, int64_t warmup, uint64_t seed,
                   int precision, double peak_tflops, int json, int profile);
/* tandem train --device cuda with the parsed options (tf32: --tf32 given): returns the exit code. */
int train_cuda(const tdm_train_config *c, int tf32);
/* --device cuda's arithmetic from --precision (TDM_F32 / TDM_BF16 / TDM_F16) and --tf32; -1 after
 * printing why to stderr (fp16, or --tf32 with bf16) */
int cuda_precision(const char *cmd, tdm_dtype precision, int tf32);
/* tandem plan --device cuda: what tandem train --device cuda would allocate on the device (no GPU
 * needed: the plan is arithmetic), as text or JSON; the exit code. */
int plan_cuda(const tdm_train_config *c, int tf32, int json);
#endif
