/* tandem — the training loop for classifiers (MLP, CNN on IDX image data sets).
 *
 * tdm_train_run does what `tandem train` does: open the data, build the model, train with the
 * chosen optimizer, evaluate on the test set after every epoch, write metrics and weights.
 *
 *   tdm_train_config c = tdm_train_config_default();
 *   c.epochs = 1;
 *   c.progress = stderr;
 *   tdm_train_result r;
 *   if (tdm_train_run(&c, &r) == TDM_OK) printf("%.4f\n", r.test_accuracy);
 *
 * Data parallel: when the environment names several ranks (RANK/WORLD_SIZE as set by tandem run,
 * or MPI's or Slurm's variables) every rank runs this same call; batch_size is per rank, each
 * optimizer step consumes world_size x accum x batch_size samples, sliced from one shuffled order
 * so that N ranks see exactly what one process with an N-times batch sees (with several ranks or
 * accumulation, the incomplete last global batch of an epoch is padded by wrapping around, as
 * PyTorch's DistributedSampler; see tandem/sampler.h). Gradients are averaged
 * with tdm_dp; the reported loss is the global mean; rank 0 prints, writes metrics and weights.
 *
 * Metrics (JSON lines, one object per line): per step {"step", "epoch", "loss", "grad_norm",
 * "samples_per_sec", "step_time_ms", "time_forward_ms", "time_backward_ms",
 * "time_comm_wait_ms", "time_optimizer_ms", "lr", "rank", "world_size", "train_accuracy",
 * gpt: "tokens_per_sec"}; per evaluation {"epoch", "step", "test_loss", "test_accuracy"} (gpt:
 * {"step", "val_loss", "val_accuracy"}). A value that is not finite is written as null.
 *
 * Divergence: the global gradient norm (after averaging, so the same on every rank) is computed
 * every step; a non-finite gradient norm, loss, test loss or parameter stops the run with
 * TDM_ERR_INVALID_ARG naming the step, on every rank at the same point, unless allow_nonfinite.
 *
 * Outputs are checked before the first step (rank 0 writes them): the directory of save_weights
 * must take a new file, metrics is opened, checkpoint_dir is created, locked (tandem/checkpoint.h)
 * and must take a new file; a failure to write any of them later is an error too. Without resume,
 * a checkpoint_dir that already holds checkpoints is refused. With resume, every rank opens its
 * newest valid checkpoint, and all must have found the same one (step and checksum) and have the
 * checkpoint's settings: model and architecture, optimizer, seed, global batch (ranks x batch x
 * accum), gpt sequence length, data set (name and training samples); resume_override names the
 * groups allowed to differ ("seed", "batch", "data"). The learning rate, its schedule and the
 * number of steps or epochs may change.
 * Not thread-safe (it sets the intra-op thread count).
 */
#ifndef TANDEM_TRAIN_H
#define TANDEM_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/engine.h"
#include "tandem/plan.h"
#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_train_config {
  const char *model;     /* "mlp" | "cnn" | "gpt" | "llama" */
  const char *data;      /* "fashion-mnist" | "mnist" | "synthetic" | "tinyshakespeare" (gpt) */
  const char *data_dir;
  const char *data_path; /* gpt: the text file (default data/tinyshakespeare.txt) */
  /* gpt, llama: the architecture (0: from gpt_config: "mini" or "gpt2-124M" for gpt; "llama-mini"
   * (also for "mini") or "llama3.2-1B" for llama) and the sequence length */
  const char *gpt_config;
  int64_t n_layer, n_head, n_embd, block_size, vocab_size, seq_len;
  /* llama: key/value heads and SwiGLU width (0: from the config), rope theta (0: the config's),
   * rope scaling (-1: the config's; 0: none; 1: Llama 3's, factor 32, 1, 4, context 8192) and a
   * head tied to the embedding (-1: the config's; 0: untied; 1: tied) */
  int64_t n_kv_head, ffn_hidden;
  double rope_theta;
  int rope_scaling, tie_embeddings;
  /* schedule and regularisation: warm-up steps, "constant" | "cosine" (to lr / 10 at the end),
   * clipping of the global gradient norm (0: off), weight decay on matrices only */
  int64_t warmup_steps;
  const char *lr_schedule;
  int decay_matrices_only;
  double max_time;       /* > 0: stop cleanly after this many seconds of training */
  int64_t val_every;     /* gpt: validation loss every this many steps (0: only at the end) */
  int64_t val_batches;   /* gpt: validation batches per evaluation */
  int64_t epochs;        /* used when steps == 0 */
  int64_t steps;         /* > 0: train exactly this many steps */
  int64_t batch_size;
  double lr;
  const char *optimizer; /* "sgd" | "adam" | "adamw" */
  double weight_decay;   /* < 0: the optimizer's default */
  double momentum;       /* SGD */
  double dropout;
  uint64_t seed;
  int threads;           /* 0: all cores */
  const char *init_weights, *save_weights, *metrics; /* NULL for none */
  int64_t eval_batch;
  /* How a step is spread over the ranks: the parallelism engine and its own settings
   * (tandem/engine.h): kind dp or zero (and zero.stage), accumulation (engine.accum micro-batches
   * per optimizer step), clipping of the global gradient norm (engine.clip, 0: off), gradient
   * buckets, overlap and wire dtype (engine.dp), sharding (engine.zero). */
  tdm_engine_config engine;
  /* resnet: gpt_config names it ("resnet20" or "resnet18"; "mini": resnet20) and n_embd > 0 its
   * base width; sync_bn: batch statistics over the data-parallel ranks (nn.SyncBatchNorm; one
   * rank: no-op); without it each rank normalises with its own batch's statistics, so N ranks
   * then differ from one process of the N-times batch (and so may their running statistics). */
  int sync_bn;
  int nesterov;           /* SGD: Nesterov momentum */
  int64_t lr_step_size;   /* lr_schedule "step": multiply by lr_gamma every this many steps (0: a third of the run) */
  double lr_gamma;        /* 0: 0.1 */
  double label_smoothing; /* classifiers: cross-entropy with label smoothing (0: none) */
  int crop_pad, flip;     /* images: random crop with this zero padding (0: none), random horizontal flip (tandem/data.h) */
  /* The process grid: data-parallel replicas (0: the world over tensor x pipeline), tensor-parallel
   * ranks splitting the model (gpt; engine.kind TDM_ENGINE_TP when > 1) and pipeline stages
   * (engine.kind TDM_ENGINE_PIPELINE when > 1); 0 or 1: no such axis. Their product is the world
   * size. A step consumes dp x accum x batch_size samples; batch_size is the micro-batch. */
  int64_t dp, tp, pp;
  /* Instead of training: replay the parameter server's update logs in this directory (written
   * with engine.ps.log_dir) on the model these options describe, stopping each server after
   * ps_replay_until updates (< 0: all), and write the parameters to save_weights. */
  const char *ps_replay;
  int64_t ps_replay_until;
  int64_t memory_limit;  /* bytes per rank; > 0: a plan above it is refused before step 1 */
  const char *last_batch; /* "auto" (partial for one process, pad otherwise), "partial", "pad", "drop" */
  int prefetch;          /* 1: a thread assembles the next batch while this one computes; 0: no;
                            -1 (default): only if a core is left over after the ranks' threads */
  const char *checkpoint_dir; /* NULL: no checkpoints */
  int64_t checkpoint_every;   /* steps between checkpoints (0: only at the end) */
  int resume;                 /* continue from the newest valid checkpoint in checkpoint_dir, if any */
  const char *resume_override; /* comma-separated groups that may differ from the checkpoint: seed,batch,data */
  int allow_nonfinite;        /* 1: go on through a non-finite loss, gradient norm or parameter */
  /* Called after every optimizer step with the number of steps done; a non-zero return stops
   * training with TDM_ERR_INVALID_USAGE (the CLI uses it to inject faults in tests). */
  int (*on_step)(void *ctx, int64_t steps_done);
  void *on_step_ctx;
  FILE *progress;        /* live progress and evaluation lines (rank 0 only); NULL for silence */
  /* A timeline per rank in this directory (trace.rank<R>.json, Chrome trace JSON; tandem/trace.h),
   * with the clock offsets against rank 0 measured at the start and the end; NULL: none. A
   * directory that cannot be written fails the run before anything else. */
  const char *trace_dir;
  /* The rank's communicator settings; NULL: from the environment (tdm_comm_config_from_env).
   * tandem train --emulate-ranks N gives each of N threads its rank over the thread transport. */
  const struct tdm_comm_config *comm;
} tdm_train_config;

typedef struct tdm_train_result {
  int64_t steps;
  double final_loss;      /* loss of the last step */
  double test_loss, test_accuracy; /* gpt: validation loss and next-token accuracy */
  double samples_per_sec; /* training samples of all ranks / training wall time (evaluation excluded) */
  int64_t samples_per_step; /* all ranks: world size x batch size x accumulation */
  int64_t tokens_per_step;  /* gpt: samples_per_step x sequence length; 0 for the classifiers */
  double tokens_per_sec;    /* gpt: training tokens of all ranks / training wall time; 0 otherwise */
  double train_seconds;
  int world_size, rank;     /* a parameter server's workers that lost some: among the survivors (0 reports) */
  int64_t resumed_from; /* the checkpoint's step, or -1 */
} tdm_train_result;

/* Defaults of `tandem train`: mlp on fashion-mnist, 1 epoch, batch 64, Adam lr 1e-3, dropout
 * 0.3, seed 42. */
tdm_train_config tdm_train_config_default(void);
tdm_status tdm_train_run(const tdm_train_config *cfg, tdm_train_result *res);
/* The memory plan (tandem/plan.h) of the run cfg describes on `world` ranks, as tdm_train_run
 * prints it before step 1: it opens the data sets (their size is part of the plan), builds nothing
 * else. What tandem plan prints. */
tdm_status tdm_train_plan(const tdm_train_config *cfg, int world, tdm_plan *out);
/* As tdm_train_plan, and the planner's input besides (model, batch, sequence length, engine,
 * grid): what tandem simulate describes a run from. */
tdm_status tdm_train_plan_config(const tdm_train_config *cfg, int world, tdm_plan *plan, tdm_plan_config *out);

#ifdef __cplusplus
}
#endif
#endif
