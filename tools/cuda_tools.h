/* The tandem command's CUDA paths (tools/bench_gpt_cuda.c, tools/train_cuda.c). */
#ifndef TANDEM_TOOLS_CUDA_H
#define TANDEM_TOOLS_CUDA_H
#include "tandem/tandem.h"

/* tandem bench gpt --device cuda: returns the exit code (0, 1 failure, 2 usage). */
int bench_gpt_cuda(const tdm_model_config *mc, int64_t B, int64_t T, int64_t steps, int64_t warmup, uint64_t seed, int tf32,
                   double peak_tflops, int json);
/* tandem train --device cuda with the parsed options: returns the exit code. */
int train_cuda(const tdm_train_config *c, int tf32);
#endif
