/* tandem — the memory planner: what a training run will hold, per rank and per category, before
 * it starts.
 *
 * The plan is worked out from the model's shapes and the strategy, with the same code that cuts
 * the parameters into buckets and shards at run time (src/parallel/layout.c), and the same rules
 * of allocation as the tape's ops; a test runs the real thing and checks every category against
 * the memory the library counted (tandem/core.h, tdm_mem_stats). Closed forms for fp32 with Adam,
 * Ψ parameters, N ranks: 16Ψ per rank at stage 0, 8Ψ + 8Ψ/N at stage 1, 4Ψ + 12Ψ/N at stage 2,
 * 16Ψ/N at stage 3, plus activations and buffers.
 *
 *   tdm_plan_config pc = tdm_plan_config_default();  pc.model = ...; pc.world = 4; ...
 *   tdm_plan p;  tdm_plan_compute(&pc, &p);  tdm_plan_print(stdout, &p, limit);
 */
#ifndef TANDEM_PLAN_H
#define TANDEM_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/comm.h"
#include "tandem/core.h"
#include "tandem/engine.h"
#include "tandem/nn.h"
#include "tandem/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_plan_config {
  tdm_model_config model;
  tdm_optim_config optim;
  tdm_engine_config engine;
  int world;                    /* ranks on the data axis */
  int64_t batch;                /* samples per rank and micro-batch */
  int64_t seq_len;              /* gpt: tokens per sample (0: the block size) */
  int64_t eval_batch;           /* samples per evaluation batch (0: no evaluation) */
  int64_t data_bytes;           /* the data sets as held in memory (tdm_dataset_bytes) */
  int prefetch;                 /* batches are assembled ahead on a thread (two batch buffers) */
  tdm_transport_kind transport; /* for the communication buffers */
  int tensor;                   /* tensor-parallel ranks beside each data rank (0 or 1: none) */
  int pipeline;                 /* pipeline stages (engine TDM_ENGINE_PIPELINE; 0 or 1: none) */
} tdm_plan_config;
tdm_plan_config tdm_plan_config_default(void);

/* A pipeline stage's part of the plan. */
#define TDM_PLAN_MAX_STAGES 64
typedef struct tdm_plan_stage {
  int64_t bytes[TDM_MEM_COUNT];
  int64_t total;
  int peak;                     /* chunk micro-batches its schedule holds at most */
  int first_block, last_block;  /* its first chunk's blocks */
} tdm_plan_stage;

typedef struct tdm_plan {
  int64_t bytes[TDM_MEM_COUNT]; /* per rank, at the peak of a step or an evaluation */
  int64_t total;
  int64_t n_params;             /* Ψ */
  int64_t owned;                /* the most elements any rank's optimizer updates */
  int n_groups;                 /* gradient buckets, or stage 3's gather units */
  int64_t max_group;            /* elements of the largest */
  int64_t act_train, act_eval;  /* tape bytes of a training micro-batch, of an evaluation batch */
  /* 1: the model's activations are not estimated (resnet: its walk is not written yet): act_*
   * and bytes[TDM_MEM_ACTIVATIONS] are 0, total leaves them out, and the print says so */
  int act_unknown;
  double comm_per_step;         /* bytes each rank sends per optimizer step */
  int stage;                    /* 0: data parallel; 1-3: ZeRO */
  int world;                    /* ranks on the data axis */
  int tensor;                   /* tensor-parallel ranks (1: none); owned is then the slices' elements */
  /* a pipeline (pipeline > 1): the schedule's bubble from its simulation, each stage's memory; the
   * per-rank bytes above are the stage that needs most */
  int pipeline, virtual_stages, microbatches, n_stages;
  double bubble, bubble_ratio;
  char schedule[16];
  tdm_plan_stage stages[TDM_PLAN_MAX_STAGES];
} tdm_plan;

tdm_status tdm_plan_compute(const tdm_plan_config *c, tdm_plan *out);
/* A GPT's compute per token (forward multiply-adds x 2; backward is about twice that) in its
 * parts: the embeddings, one transformer block (T tokens of context for attention), and the final
 * norm, head and loss. The pipeline cuts blocks into stages by these costs. */
void tdm_plan_gpt_costs(const tdm_model_config *m, int64_t T, double *embed, double *block, double *head);
/* The same parts of a Llama: the token embedding, one decoder layer (its seven matrices, attention
 * over T tokens with its key/value heads shared, RoPE, the RMSNorms and SwiGLU) and the final
 * RMSNorm, head and loss. */
void tdm_plan_llama_costs(const tdm_model_config *m, int64_t T, double *embed, double *block, double *head);
/* Whichever of the two m is (GPT's for another kind): what the pipeline's cut balances. */
void tdm_plan_layer_costs(const tdm_model_config *m, int64_t T, double *embed, double *block, double *head);
/* A table: per category, bytes and what they are. limit > 0 adds whether the total fits.
 * These void functions given a NULL pointer do nothing but set tdm_last_error(). */
void tdm_plan_print(FILE *f, const tdm_plan *p, int64_t limit);
/* TDM_ERR_INVALID_ARG when the total exceeds limit (> 0), saying by how much, naming the largest
 * category and what would shrink it; TDM_OK otherwise. */
tdm_status tdm_plan_check(const tdm_plan *p, int64_t limit);

#ifdef __cplusplus
}
#endif
#endif
