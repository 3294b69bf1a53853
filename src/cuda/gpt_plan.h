/* The CUDA GPT's memory plan (src/cuda/gpt_plan.c), private to the library: the activation arena's
 * layout and the checks of a configuration, pure arithmetic, so that it is built without the CUDA
 * backend too (tandem plan --device cuda plans a GPU run on any machine; tdm_cuda_gpt_plan_bytes
 * is the public face). src/cuda/gpt_cuda.c cuts its one arena by it. */
#ifndef TANDEM_CUDA_GPT_PLAN_H
#define TANDEM_CUDA_GPT_PLAN_H

#include <stdint.h>

#include "tandem/cuda.h"

/* A layer's saved activations (offsets into the arena, in floats). Under bf16, ln1, atty, ln2 and
 * fchg hold bf16 and att holds the flash kernel's row statistics (B NH T) instead of the
 * probabilities (B NH T T). */
typedef struct {
  int64_t ln1, ln1_mean, ln1_rstd, qkvr, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fchg, res3;
} tdm__cuda_layer_acts;

/* The arena's layout: every offset in floats, each aligned to 64 floats (256 bytes). */
typedef struct {
  int64_t enc, lnf, lnf_mean, lnf_rstd, logits, losses, loss, qkv, proj, y, dres, dbuf4, dln, datt, dqkvr, dy, dqkv, sumsq,
      idx, tgt, dybf, total; /* bf16: datt is attention's row dot products (B NH T); y, dqkvr, dy unused */
  int64_t n_layer;
} tdm__cuda_arena_plan;

/* The layout of the arena for B x T tokens in this precision (la: n_layer entries, or NULL). */
void tdm__cuda_gpt_plan_arena(const tdm_model_config *mc, int64_t B, int64_t T, int prec, tdm__cuda_arena_plan *ap,
                              tdm__cuda_layer_acts *la);
/* What the CUDA GPT refuses (another model, dropout, a bad shape or precision, a head size the flash
 * kernel lacks under bf16), by name. */
tdm_status tdm__cuda_gpt_check(const tdm_model_config *mc, int64_t B, int64_t T, int prec);
/* A GPT's parameter count, as tdm_params lays it out. */
int64_t tdm__cuda_gpt_numel(const tdm_model_config *mc);

#endif
