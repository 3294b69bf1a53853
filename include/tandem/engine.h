/* tandem — parallelism engines: the one seam between the training loop and every strategy.
 *
 * The loop (src/train/trainer.c) knows epochs, evaluation, metrics, checkpoint cadence and stop
 * conditions; how a step is spread over processes is an engine's business. An engine owns the
 * model, the optimizer and the gradient exchange of one strategy, and runs a training step as
 * llm.c does, in four named calls: zero_grad, forward, backward, update (tdm_engine_step).
 *
 *   tdm_grid *g;    tdm_grid_create(&g, world, 0, 1, 1);          // data axis = every rank
 *   tdm_engine_config ec = tdm_engine_config_default();
 *   ec.kind = TDM_ENGINE_ZERO; ec.zero.stage = 3;
 *   tdm_engine *e;  tdm_engine_create(&e, &model_cfg, seed, &optim_cfg, g, &ec);
 *   for (...) tdm_engine_step(e, next_batch, ctx, dropout_seed, lr, &stats);
 *   tdm_engine_destroy(e); tdm_grid_destroy(g);
 *
 * Engines (one file each under src/parallel/, one row in the table of src/parallel/engine.c):
 *   dp    every rank holds everything; gradient buckets are averaged while backward runs
 *   zero  ZeRO stages 1-3: optimizer state, then gradients, then parameters sharded over the
 *         data axis; at stage 3 parameters are gathered unit by unit just before use
 *   tp    tensor parallelism (Megatron-style) for the GPT over the tensor axis: attention heads, the
 *         MLP's hidden units and the vocabulary split across its ranks, custom autograd ops
 *         all-reducing inside forward and backward; data parallelism over the data axis
 *   pipeline  GPT's blocks cut into stages over the pipeline axis; each step runs a verified
 *         schedule (tandem/pipeline.h) of forwards, backwards and exchanges between neighbours;
 *         gradients averaged over the data axis as data parallelism does; with a tensor axis (the
 *         3-D grid) each stage's blocks run tensor-parallel as the tp engine's do
 * Every engine gives the same result as every other at the same world size, bit for bit: the
 * gradients of all of them are reduced in the same order (rank order, whatever the transport),
 * and the gradient norm is formed from segment sums in a fixed order (tdm_grad_sumsq_segments).
 *
 * Thread safety: an engine is driven by one thread; it may run communication on the
 * communicator's own thread.
 *
 * A NULL engine or grid is TDM_ERR_INVALID_ARG naming it; getters then set tdm_last_error() and
 * return NULL, 0 (sizes, counts, flags) or -1 (tdm_grid_index).
 */
#ifndef TANDEM_ENGINE_H
#define TANDEM_ENGINE_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/comm.h"
#include "tandem/compress.h"
#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/pipeline.h"
#include "tandem/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the process grid ------------------------------------------------------------------------
 * world = data x tensor x pipeline ranks; rank = (data_index * pipeline + pipeline_index) * tensor +
 * tensor_index, so tensor-parallel peers are neighbours (on one node, as they talk most), then the
 * stages of one pipeline (activations every micro-batch), then the data replicas. Each
 * axis has its own communicator: the ranks that differ only in that coordinate. An axis that spans
 * the whole world is the world communicator itself. world NULL: one process, every axis of size 1. */
typedef enum { TDM_AXIS_DATA = 0, TDM_AXIS_TENSOR, TDM_AXIS_PIPELINE, TDM_AXIS_COUNT } tdm_grid_axis;
const char *tdm_grid_axis_name(tdm_grid_axis a);
typedef struct tdm_grid tdm_grid;
/* data 0: whatever is left of the world after tensor x pipeline. Collective over world (it splits).
 * TDM_ERR_INVALID_ARG when the sizes do not multiply to the world size, naming them. */
tdm_status tdm_grid_create(tdm_grid **out, tdm_comm_t world, int data, int tensor, int pipeline);
/* The grid does not own world; it owns the sub-communicators it split. */
void tdm_grid_destroy(tdm_grid *g);
tdm_comm_t tdm_grid_world(const tdm_grid *g);         /* NULL for one process */
tdm_comm_t tdm_grid_comm(const tdm_grid *g, tdm_grid_axis a); /* NULL when the axis has size 1 */
int tdm_grid_size(const tdm_grid *g, tdm_grid_axis a);
int tdm_grid_index(const tdm_grid *g, tdm_grid_axis a);

/* ---- engines ---------------------------------------------------------------------------------- */
typedef enum { TDM_ENGINE_DP = 0, TDM_ENGINE_ZERO, TDM_ENGINE_PIPELINE, TDM_ENGINE_TP, TDM_ENGINE_PS, TDM_ENGINE_KIND_COUNT } tdm_engine_kind;
const char *tdm_engine_kind_name(tdm_engine_kind k);

/* Data parallelism (stage 0). */
typedef struct tdm_engine_dp_config {
  size_t bucket_bytes;       /* 0: 25 MiB */
  size_t first_bucket_bytes; /* 0: 1 MiB */
  tdm_dtype wire_dtype;      /* TDM_F32, or TDM_BF16 / TDM_F16 to compress gradients on the wire */
  int no_overlap;            /* 1: average only after backward (to measure what overlap hides) */
  const char *compress;      /* NULL/"none", or "topk:RATIO" / "powersgd:RANK": error-feedback
                                compressors (tandem/compress.h); the string must outlive the engine */
  int64_t compress_start;    /* optimizer steps sent uncompressed before compression starts */
} tdm_engine_dp_config;

/* ZeRO stages 1-3. */
typedef struct tdm_engine_zero_config {
  int stage;             /* 1: optimizer state sharded; 2: and gradients; 3: and parameters */
  size_t bucket_bytes;   /* stages 1-2: gradient buckets (0: 25 MiB; the first at most 1 MiB) */
  int unit_modules;      /* stage 3: modules per gather unit (a module: a transformer block, a
                            layer; 0: 1) */
  int prefetch;          /* stage 3: gather the next unit while this one computes (default 1) */
} tdm_engine_zero_config;

/* fp16's dynamic loss scaling (as PyTorch's GradScaler): backward is seeded with the scale, the
 * gradients are unscaled before clipping and the update; a step whose gradients overflow (any
 * rank's: the flag is all-reduced over the data axis, so every rank skips the same steps) is
 * skipped and the scale halved; after `window` clean steps in a row it doubles. */
typedef struct tdm_loss_scale_config {
  float init;     /* the first scale (0: 65536) */
  int64_t window; /* clean steps before it doubles (0: 2000) */
} tdm_loss_scale_config;
/* Tensor parallelism over the grid's tensor axis (T ranks; the data axis, when larger than 1, runs
 * data parallelism with the dp settings). The model's parameters stay the whole model's (names,
 * shapes, offsets: tdm_engine_model, read_params, load and save are in its terms); each rank holds
 * slices of them (src/parallel/tp_model.h: a GPT's or a Llama's). Replicated parameters (layer
 * norms and RMSNorms, GPT's row-parallel projections' biases and position embedding) must stay
 * bitwise identical on every rank: every check_every steps a hash of each is compared across the
 * world, and a difference fails the step with TDM_ERR_MISMATCH naming the parameter and the ranks. */
typedef struct tdm_engine_tp_config {
  int64_t check_every; /* 0: never (default 100) */
  int zero_stage;      /* ZeRO on the data axis: 0 (default) or 1 (each data rank keeps and updates the
                          optimizer state of about 1/D of its slices, cut on rows; the same bits as 0) */
} tdm_engine_tp_config;

/* Pipeline parallelism (GPT): the micro-batches of a step are the engine's accumulation (accum). */
#define TDM_PP_MAX_SPLIT 256
typedef struct tdm_engine_pipeline_config {
  tdm_pp_schedule_kind schedule; /* default 1F1B */
  int virtual_stages;            /* chunks per rank (interleaved; 0: 2 for interleaved, else 1) */
  int n_split;                   /* > 0: blocks per chunk, by hand (split[0..n_split)); 0: balanced by
                                    the planner's cost per block */
  int split[TDM_PP_MAX_SPLIT];
  int64_t seq_len; /* tokens per sample the balanced cut is costed at (0: the model's block size;
                      attention's cost grows with it, the head's does not) */
  int zero_stage; /* ZeRO on the data axis: 0 (default) or 1 (each data rank keeps and updates 1/D of
                     its stage's optimizer state; the same bits as 0; beside tensor parallelism cut
                     on rows of its slices) */
} tdm_engine_pipeline_config;
/* The parameter server (src/parallel/ps*.c): the world's last `servers` ranks are servers, the
 * others workers (the grid's data axis is the workers' communicator). Parameters are sharded over
 * the servers by key range, balanced by bytes (tdm_ps_shard); every step a worker pushes its
 * gradient's shards and pulls the parameters' shards; the optimizer runs on the servers.
 *   sync:  a server waits for every worker's push, sums them in worker-rank order and divides by
 *          the number of workers (as data parallelism averages), steps once: bit for bit the
 *          data-parallel engine with the same workers;
 *   async: each push is one optimizer step, applied on arrival; the worker gets the parameters
 *          back at once;
 *   ssp:   as async, but a worker more than `staleness` steps ahead of the slowest waits for its
 *          parameters until the slowest catches up.
 * The gradient norm in the step's stats is the worker's own gradient's; clipping is refused. */
typedef enum { TDM_PS_SYNC = 0, TDM_PS_ASYNC, TDM_PS_SSP, TDM_PS_MODE_COUNT } tdm_ps_mode;
const char *tdm_ps_mode_name(tdm_ps_mode m);
typedef struct tdm_engine_ps_config {
  int servers;          /* S >= 1, fewer than the world's ranks */
  tdm_ps_mode mode;
  int staleness;        /* ssp: K >= 0 */
  tdm_comm_t world;     /* workers and servers (tagged messages); not owned */
  int delay_worker;     /* testing the bound: this worker sleeps delay_s per step (-1: none) */
  double delay_s;
  const char *log_dir;  /* servers: write the update log here (DIR/ps-server-K.log); NULL: none */
  FILE *notes;          /* servers: a line for each worker lost (NULL: none) */
  const char *ckpt_dir; /* servers: where the workers' checkpoints are written (NULL: none) */
} tdm_engine_ps_config;

typedef struct tdm_engine_config {
  tdm_engine_kind kind;
  int64_t accum;          /* micro-batches per optimizer step (0 or 1: none) */
  float clip;             /* clip the global gradient norm to this (0: only measure it) */
  int allow_nonfinite;    /* 0: a non-finite loss or gradient norm fails the step */
  tdm_recompute recompute; /* activation recomputation in the models' forward (tandem/autograd.h) */
  /* Mixed precision: TDM_F32 (default), or TDM_BF16 / TDM_F16: activations, their gradients and the
   * products' inputs in 16 bits (the tape's autocast), while the parameters (master weights),
   * their gradients and the optimizer state stay f32. */
  tdm_dtype precision;
  tdm_loss_scale_config loss_scale; /* TDM_F16 only */
  /* A fault-injection seam for tests (as the CLI's TANDEM_FAULT): called on every rank after each
   * step's backward with the engine's step count (0-based); non-zero makes this rank alone see an
   * overflow (fp16 only). NULL: none. */
  int (*overflow_hook)(void *ctx, int64_t step);
  void *overflow_ctx;
  float label_smoothing;  /* > 0: the classifiers' cross-entropy with label smoothing (training and evaluation) */
  tdm_engine_dp_config dp;
  tdm_engine_zero_config zero;
  tdm_engine_tp_config tp;
  tdm_engine_pipeline_config pp;
  tdm_engine_ps_config ps;
} tdm_engine_config;
tdm_engine_config tdm_engine_config_default(void);

/* A micro-batch: the engine asks for them one by one. Fill *x and *y as tensors of tp (the
 * model's input and the targets, as tdm_model_forward and tdm_cross_entropy take them) and
 * *sample_base with the global index of the first sample (dropout masks are keyed by it). */
typedef tdm_status (*tdm_batch_fn)(void *ctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y,
                                   int64_t *sample_base);

typedef struct tdm_step_stats {
  double loss;        /* this rank's mean loss over its micro-batches */
  double correct;     /* this rank's correct predictions (argmax of the logits = target) */
  double rows;        /* this rank's predictions (samples, or tokens for a language model) */
  int64_t samples;    /* this rank's samples */
  double grad_norm;   /* the global gradient norm before clipping (the same on every rank) */
  double t_forward, t_backward, t_comm_wait, t_update; /* seconds */
  double loss_scale;  /* fp16: the scale this step's backward ran with (1 otherwise) */
  int skipped;        /* fp16: the gradients overflowed, the update was skipped (on every rank) */
} tdm_step_stats;

/* Before any rank computes (no communication): data x tensor x pipeline against the world size
 * (data 0: what is left) and the engine's layout against the model (a pipeline: chunks and blocks,
 * the split, the micro-batches its schedule needs). TDM_ERR_INVALID_ARG naming the values.
 * Tensor x pipeline (both above 1: the 3-D grid) runs on the pipeline engine, checked against the
 * heads and the blocks both. A precision other than f32, or recomputation, on an engine that does
 * not implement it (pipeline, tp, ps: only dp and zero do) is TDM_ERR_NOT_SUPPORTED, naming the
 * engine and the setting. */
tdm_status tdm_engine_check(const tdm_model_config *model, const tdm_engine_config *cfg, int world, int data, int tensor,
                            int pipeline);

typedef struct tdm_engine tdm_engine;
/* Builds the model (at stage 3 each rank holds and initialises only its shard, with the values
 * the whole model would have), the optimizer for what this rank updates, and the strategy's
 * state. Collective over the grid's world: ranks check they built the same model. The engine
 * keeps grid, which must outlive it. */
tdm_status tdm_engine_create(tdm_engine **out, const tdm_model_config *model, uint64_t seed,
                             const tdm_optim_config *optim, tdm_grid *grid, const tdm_engine_config *cfg);
void tdm_engine_destroy(tdm_engine *e);

/* One optimizer step: zero_grad; for each micro-batch, forward (model, then cross-entropy) and
 * backward (seeded with 1/accum); gradients exchanged as the strategy does; the global norm;
 * clipping; update. dropout_seed keys this step's dropout masks. Collective over the world. */
tdm_status tdm_engine_step(tdm_engine *e, tdm_batch_fn next, void *ctx, uint64_t dropout_seed, float lr,
                           tdm_step_stats *stats);

/* fp16's loss scaler: the scale the next step uses and the clean steps in a row since it last
 * changed (for checkpoints; set restores them). */
void tdm_engine_loss_scale(const tdm_engine *e, double *scale, int64_t *good_steps);
tdm_status tdm_engine_set_loss_scale(tdm_engine *e, double scale, int64_t good_steps);

/* Evaluation of one batch (gradients and dropout off): the mean cross-entropy of the logits and
 * the rows whose argmax is the target. Every rank of a pipeline gives x and y and gets the numbers
 * (collective over the pipeline axis; over the tensor axis for tensor parallelism; ZeRO stage 3
 * gathers as forward does). */
tdm_status tdm_engine_eval(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, double *loss, double *correct, double *rows);

/* The whole model (tensor parallelism: its names, shapes and offsets, its values held in slices
 * across the tensor axis; running it directly fails, naming the parameter: use the engine). */
tdm_model *tdm_engine_model(const tdm_engine *e);
tdm_tape *tdm_engine_tape(const tdm_engine *e);   /* the engine's tape (evaluation may use it) */
tdm_optim *tdm_engine_optim(const tdm_engine *e);
const tdm_grid *tdm_engine_grid(const tdm_engine *e);
/* Where this rank's optimizer state lies in the parameter buffer: the spans it updates. */
int tdm_engine_shard(const tdm_engine *e, const tdm_optim_span **spans);
const char *tdm_engine_describe(const tdm_engine *e); /* "zero stage 3, 4 ranks, 7 units" */
/* How many ranks hold the same state as this one (its spans, the same values): the world for data
 * parallelism, 1 for ZeRO, the data axis for a pipeline or tensor parallelism; *index gets this
 * rank's place among them. */
int tdm_engine_replicas(const tdm_engine *e, int *index);

/* After the engine is created: every parameter takes the values of this safetensors file (each
 * rank reads only what it holds). */
tdm_status tdm_engine_load_weights(tdm_engine *e, const char *path);
/* Writes the model's parameters as one safetensors file from rank 0. At stage 3 the file is
 * written unit by unit, each gathered once: no rank ever holds the whole model. Collective. */
tdm_status tdm_engine_save_weights(tdm_engine *e, const char *path, int n_meta, const char *const *meta_kv);
/* Copies elements [lo, hi) of the current parameters into dst on every rank (gathering at stage
 * 3): for tests and tools. Collective. */
tdm_status tdm_engine_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst);
/* The index (in the parameter buffer) of the first parameter value that is not finite, or -1; the
 * same on every rank. Collective. */
tdm_status tdm_engine_first_nonfinite(tdm_engine *e, int64_t *index);

/* The last step's gradient exchange: *grad_bytes (optional) the bytes this rank sent for it
 * (data parallelism; 0 otherwise), *out the per-bucket stats of the last compressed step; returns
 * their count (0 without a compressor, or before it starts). */
int tdm_engine_compress_stats(const tdm_engine *e, const tdm_compress_stats **out, uint64_t *grad_bytes);
/* The compressor's state, for checkpoints (tdm_dp_compress_state): bucket k's span of the
 * gradient buffer, this rank's residual there and the state shared by all ranks (PowerSGD's Q).
 * Returns the bucket count; 0 without a compressor (or on one rank, where nothing is compressed).
 * k = -1 after writing residuals in place: the telescoping check starts over from them. */
int tdm_engine_compress_state(tdm_engine *e, int k, int64_t *lo, int64_t *hi, float **residual, float **shared,
                              int64_t *n_shared);

/* ---- state for checkpoints (what src/train/engine_ckpt.c writes) ------------------------------
 * Data parallelism's state is the parameters and the optimizer, the same on every rank. A sharded
 * engine's state is, besides, every rank's own shard: its optimizer state, the spans it covers and
 * (stage 3) its pieces of the parameters, which no rank holds whole. */
int tdm_engine_is_sharded(const tdm_engine *e);
/* Whether the parameters are whole on every rank (all but ZeRO stage 3). */
int tdm_engine_params_whole(const tdm_engine *e);
/* This rank's shard as named tensors pointing at live buffers (valid until the next step): "optim.state"
 * (f32: all first moments, then all second moments, over the spans), "shard.spans" (i64: lo, hi of
 * each span, tdm_engine_shard's) and at stage 3 "model.shard" (f32: the parameter pieces, span after
 * span). *n gets their count (at most 3). */
tdm_status tdm_engine_shard_state(tdm_engine *e, tdm_st_tensor *out, int *n);
/* Engines whose state is not ranges of the whole parameter buffer (tensor parallelism: each rank
 * holds slices) describe it as boxes of the whole model's parameters: for each, where its values
 * and its optimizer state lie on this rank, and whether this rank is the one that writes it to a
 * checkpoint (across the world, the boxes whose write is 1 tile every parameter exactly once).
 * Returns their count and sets *pieces (owned by the engine, valid while it lives); 0 for engines
 * whose state tdm_engine_shard and tdm_engine_shard_state describe. */
typedef struct tdm_engine_piece {
  int param;                      /* the parameter's index in tdm_engine_model's store */
  int64_t start[TDM_MAX_DIMS];    /* the box, in the whole parameter's shape */
  int64_t count[TDM_MAX_DIMS];
  float *data;                    /* its values on this rank, row-major over the box */
  int64_t state_at;               /* optimizer state s of its first element: tdm_optim_state + s x owned + state_at */
  int write;                      /* 1: this rank writes it (replicas and data-parallel copies: one of them) */
} tdm_engine_piece;
int tdm_engine_pieces(const tdm_engine *e, const tdm_engine_piece **pieces);
/* Loads a shard written by a rank of the same layout: the spans must match (TDM_ERR_MISMATCH naming
 * both otherwise); find(ctx, name) returns a tensor or NULL. Sets the optimizer's step count. */
tdm_status tdm_engine_load_shard_state(tdm_engine *e, const tdm_st_tensor *(*find)(void *ctx, const char *name), void *ctx,
                                       int64_t optim_steps);
/* After the buffers tdm_engine_shard_state points at (and, where whole, the parameters) were
 * written in place (a checkpoint read into them, tandem/checkpoint.h): sets the optimizer's step
 * count and drops what derives from the old values (stage 3: gathered units). Not collective. */
tdm_status tdm_engine_shard_loaded(tdm_engine *e, int64_t optim_steps);

/* ---- the parameter server's side --------------------------------------------------------------
 * Server s of S holds keys [lo, hi) of n parameters: S ranges of consecutive keys as equal in
 * bytes as whole keys allow (f32: s * (n/S) + min(s, n%S), as tdm_comm_block). */
void tdm_ps_shard(int64_t n, int S, int s, int64_t *lo, int64_t *hi);
/* What a server did, for its report. */
typedef struct tdm_ps_server_stats {
  int server, rank;
  int64_t lo, hi, pushes, updates;
  uint64_t bytes_in, bytes_out;
  int64_t staleness_hist[17]; /* pushes by staleness (updates of the shard between the worker's pull
                                 and its push's application); the last bin: 16 or more */
  int64_t max_staleness;
  int64_t max_clock_gap;      /* ssp / async: the most steps a worker was ahead of the slowest when
                                 it was given parameters (ssp: at most the staleness bound) */
  double seconds;
  int n_lost;                 /* workers lost (their connection closed, their process gone) */
  int lost[16];               /* the first 16 of them, in the order they were found */
} tdm_ps_server_stats;
/* Runs this rank as a server (world rank >= size - S) until every worker has finished: builds the
 * model with the workers' seed (so the shard starts with their values) and the optimizer over its
 * range, then answers pushes as the mode says. A malformed push or one for keys this server does
 * not own fails it with the worker named (the job stops). A lost worker (dead) is named: in sync
 * mode that fails the server (a round needs every worker); in async and ssp modes the server goes
 * on without it (it no longer counts for the staleness bound or the final barrier). */
tdm_status tdm_ps_serve(const tdm_model_config *model, uint64_t seed, const tdm_optim_config *optim,
                        const tdm_engine_ps_config *cfg, tdm_ps_server_stats *stats);
/* The stats as one JSON object (no newline). */
void tdm_ps_stats_json(const tdm_ps_server_stats *st, char *buf, size_t n);

/* ---- the parameter server's workers -------------------------------------------------------------
 * The workers meet at the servers (each server answers when every live worker has asked) and learn
 * from server 0 which workers were lost: ranks[0..*n_lost) of the workers' communicator (at most
 * cap named). Collective over the surviving workers; a ps engine only. */
tdm_status tdm_ps_workers_meet(tdm_engine *e, int *n_lost, int *ranks, int cap);
/* After a loss: the engine goes on with the survivors' grid g (made by tdm_comm_subset of the
 * workers' communicator; g must outlive the engine). A ps engine only: its state does not depend
 * on the layout. */
tdm_status tdm_ps_workers_regrid(tdm_engine *e, tdm_grid *g);
/* The last step's exchange as this worker saw it: staleness[s] (s < cap) of its push to server s
 * (the shard's updates between its pull and the push's application, as the server's answer said;
 * sync: 0), the bytes it pushed and pulled (headers included). Returns the number of servers, or
 * -1 for an engine that is not a parameter server's worker. */
int tdm_ps_worker_step_stats(const tdm_engine *e, int64_t *staleness, int cap, uint64_t *pushed, uint64_t *pulled);

/* Replays the update logs in dir (ps-server-0.log .. as many as server 0's names) on the model
 * built from seed, with the optimizer over each server's range: every update the servers applied,
 * in their order, with the gradient and learning rate the optimizer got, so the parameters come
 * out as the run left them, bit for bit (sync, async or ssp alike). until >= 0 stops each server
 * after that many updates. Writes the parameters to save_path (NULL: nowhere). A log of another
 * model, a truncated record or one that fails its checksum is named (TDM_ERR_MISMATCH /
 * TDM_ERR_FORMAT). */
typedef struct tdm_ps_replay_stats {
  int servers;
  int64_t updates[64]; /* per server, applied */
} tdm_ps_replay_stats;
tdm_status tdm_ps_replay(const char *dir, const tdm_model_config *model, uint64_t seed, const tdm_optim_config *optim,
                         int64_t until, const char *save_path, int n_meta, const char *const *meta_kv,
                         tdm_ps_replay_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
