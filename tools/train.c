/* tandem train: options in, tdm_train_run, a summary out. */
#include <stdio.h>
#include <string.h>

#include <stdlib.h>
#include <unistd.h>

#include "cli.h"
#include "cuda_tools.h"
#include "run.h"
#include "tandem/tandem.h"

/* TANDEM_FAULT=RANK:STEP makes that rank die (exit 3) after that step, on the first attempt only
 * (TANDEM_RESTART_COUNT unset or 0): how the restart tests cause a failure; RANK:STEP:error makes
 * it fail there as a library error would instead (the step callback stops training, the rank
 * closes its links and exits 1), which its peers then relay. TANDEM_STEP_DELAY=S
 * sleeps S seconds after every step: how the elastic test kills and starts launchers mid-run. */
static int fault_hook(void *ctx, int64_t steps_done) {
  (void)ctx;
  const char *f = getenv("TANDEM_FAULT"), *rc = getenv("TANDEM_RESTART_COUNT"), *rank = getenv("RANK");
  int fr, fs;
  char how[8] = "";
  const char *delay = getenv("TANDEM_STEP_DELAY"); /* seconds after each step: tests pace a job to act mid-run */
  if (delay && atof(delay) > 0) usleep((useconds_t)(atof(delay) * 1e6));
  if (!f || sscanf(f, "%d:%d:%7s", &fr, &fs, how) < 2 || (rc && atoi(rc) > 0)) return 0;
  if ((rank ? atoi(rank) : 0) == fr && steps_done == fs) {
    if (!strcmp(how, "error")) return 1;
    fprintf(stderr, "tandem train: TANDEM_FAULT: rank %d stops after step %d\n", fr, fs);
    fflush(stderr);
    _exit(3);
  }
  return 0;
}

/* The options of tandem train, shared with tandem plan (which adds its own): parses argv into *c.
 * Returns 0, 1 (--help printed) or 2 (a usage error, printed). */
int train_options(const char *cmd, const char *usage, int argc, char **argv, tdm_train_config *c, int n_extra,
                  const cli_opt *extra) {
  *c = tdm_train_config_default();
  int64_t epochs, steps, batch, seed, threads, eval_batch, accum, ckpt_every, layers, heads, width, block, vocab, seq_len,
      warmup, val_every, val_batches, zero, zero_unit, memory_limit, kv_heads, ffn_width, compress_start, tp, tp_check, dp, pp,
      microbatches, vstages;
  double rope_theta;
  const char *rope_scaling, *tie;
  double clip, max_time, bucket_mb;
  int resume, no_overlap, allow_nonfinite, nesterov, sync_bn, flip;
  int64_t lr_step, crop_pad;
  double lr_gamma, label_smoothing;
  const char *prefetch, *compress, *zero_prefetch, *recompute, *precision, *schedule, *lr_schedule, *pp_split;
  const char *ps_mode, *ps_delay, *ps_log;
  int64_t ps_servers, staleness;
  double ls_init;
  int64_t ls_window;
  double lr, dropout, wd, momentum;
  cli_opt opts[128] = {
      {"model", CLI_CHOICE, &c->model, "mlp", "model to train", "mlp|cnn|gpt|llama|resnet", 0, 0, 0},
      {"data", CLI_CHOICE, &c->data, "fashion-mnist", "data set (synthetic: generated, Fashion-MNIST's shape; cifar-bin: CIFAR-10's binary batches in --data-dir; tinyshakespeare for gpt, the default there)", "fashion-mnist|mnist|synthetic|cifar-bin|tinyshakespeare", 0, 0, 0},
      {"data-path", CLI_STRING, &c->data_path, "data/tinyshakespeare.txt", "gpt: the text file (bytes are the tokens)", NULL, 0, 0, 0},
      {"config", CLI_CHOICE, &c->gpt_config, "mini", "gpt, llama: the architecture (mini: 4 layers, 4 heads, 256 wide, block 128, vocab 256; llama-mini the same size, 2 key/value heads; llama3.2-1B: Meta's 1.24 B; llama's default: llama-mini; resnet20 (the resnet default) or resnet18)", "mini|gpt2-124M|llama-mini|llama3.2-1B|resnet20|resnet18", 0, 0, 0},
      {"layers", CLI_INT, &layers, "0", "gpt, llama: transformer blocks (0: from --config)", NULL, 0, 1000, 0},
      {"heads", CLI_INT, &heads, "0", "gpt, llama: attention heads (0: from --config)", NULL, 0, 1000, 0},
      {"kv-heads", CLI_INT, &kv_heads, "0", "llama: key/value heads, dividing --heads (grouped-query attention; 0: from --config)", NULL, 0, 1000, 0},
      {"width", CLI_INT, &width, "0", "gpt, llama: embedding width; resnet: the first stage's channels (0: from --config)", NULL, 0, 1e6, 0},
      {"ffn-width", CLI_INT, &ffn_width, "0", "llama: SwiGLU hidden width (0: from --config)", NULL, 0, 1e7, 0},
      {"block", CLI_INT, &block, "0", "gpt, llama: context length (0: from --config)", NULL, 0, 1e7, 0},
      {"vocab", CLI_INT, &vocab, "0", "gpt, llama: vocabulary size (0: from --config)", NULL, 0, 1e7, 0},
      {"rope-theta", CLI_FLOAT, &rope_theta, "0", "llama: base of the rotary frequencies (0: from --config: 10000, llama3.2-1B 500000)", NULL, 0, 1e12, 0},
      {"rope-scaling", CLI_CHOICE, &rope_scaling, "auto", "llama: Llama 3's frequency scaling for long context (factor 32, 1, 4, context 8192; auto: from --config)", "auto|none|llama3", 0, 0, 0},
      {"tie-embeddings", CLI_CHOICE, &tie, "auto", "llama: the output head is the token embedding (auto: from --config, tied for llama3.2-1B)", "auto|on|off", 0, 0, 0},
      {"seq-len", CLI_INT, &seq_len, "0", "gpt, llama: training sequence length (0: the block size)", NULL, 0, 1e7, 0},
      {"data-dir", CLI_STRING, &c->data_dir, "/usr/share/datasets/fashion-mnist",
       "directory of the IDX files (gzip'd or not)", NULL, 0, 0, 0},
      {"epochs", CLI_INT, &epochs, "1", "passes over the training set", NULL, 1, 1e6, 0},
      {"steps", CLI_INT, &steps, "0", "train exactly this many steps instead (0: use --epochs)", NULL, 0, 1e12, 0},
      {"batch-size", CLI_INT, &batch, "64", "samples per step and rank", NULL, 1, 1e7, 0},
      {"accum", CLI_INT, &accum, "1", "micro-batches per optimizer step (gradient accumulation)", NULL, 1, 1 << 20, 0},
      {"zero", CLI_INT, &zero, "0", "ZeRO stage: 0 data parallel (every rank holds everything); 1 optimizer state, 2 and gradients, 3 and parameters sharded over the ranks", NULL, 0, 3, 0},
      {"zero-unit", CLI_INT, &zero_unit, "1", "--zero 3: modules (transformer blocks, layers) per gathered unit", NULL, 1, 1e6, 0},
      {"zero-prefetch", CLI_CHOICE, &zero_prefetch, "on", "--zero 3: gather the next unit while this one computes", "on|off", 0, 0, 0},
      {"tp", CLI_INT, &tp, "1", "gpt, llama: tensor-parallel ranks (Megatron-style: attention heads (a Llama's with their key/value heads), MLP units and the vocabulary split across them)", NULL, 1, 1024, 0},
      {"tp-check-every", CLI_INT, &tp_check, "100", "--tp: steps between checks that replicated parameters are bitwise identical on every rank (0: never)", NULL, 0, 1e12, 0},
      {"ps-servers", CLI_INT, &ps_servers, "0", "parameter server: the last S ranks serve the parameters (sharded by key range) and run the optimizer; the others train (0: no server)", NULL, 0, 1 << 20, 0},
      {"ps-mode", CLI_CHOICE, &ps_mode, "sync", "--ps-servers: sync (every worker's gradient, summed in rank order: as data parallelism), async (each push applied on arrival), ssp (async, a worker at most --staleness steps ahead of the slowest)", "sync|async|ssp", 0, 0, 0},
      {"staleness", CLI_INT, &staleness, "0", "--ps-mode ssp: how many steps a worker may run ahead of the slowest", NULL, 0, 1e9, 0},
      {"ps-log", CLI_STRING, &ps_log, NULL, "--ps-servers: each server writes every update it applies to DIR/ps-server-K.log (tandem ps-replay reproduces the run from them; a gradient per update: large)", NULL, 0, 0, 0},
      {"ps-delay", CLI_STRING, &ps_delay, NULL, "--ps-servers, for testing: WORKER:SECONDS makes that worker sleep so long every step", NULL, 0, 0, 0},
      {"memory-limit", CLI_SIZE, &memory_limit, "0", "refuse to start when the memory plan per rank exceeds this (like 8G; 0: no limit)", NULL, 0, 0, 0},
      {"compress", CLI_STRING, &compress, "none", "gradients on the wire between ranks: none|bf16|fp16 (the dtype), topk:RATIO (the largest RATIO of each bucket, 0 < RATIO <= 1) or powersgd:RANK (low-rank factors), both with error feedback", NULL, 0, 0, 0},
      {"compress-start", CLI_INT, &compress_start, "0", "with topk/powersgd: optimizer steps sent uncompressed first (warm-up)", NULL, 0, 1e12, 0},
      {"precision", CLI_CHOICE, &precision, "fp32", "mlp, gpt, llama: activations and products in bf16 or fp16 (fp16 with dynamic loss scaling), parameters and optimizer state f32 (master weights)", "fp32|bf16|fp16", 0, 0, 0},
      {"loss-scale-init", CLI_FLOAT, &ls_init, "65536", "--precision fp16: the first loss scale (halved on an overflow, the step skipped)", NULL, 1e-30, 1e30, 0},
      {"loss-scale-window", CLI_INT, &ls_window, "2000", "--precision fp16: clean steps in a row before the loss scale doubles", NULL, 1, 1e12, 0},
      {"recompute", CLI_CHOICE, &recompute, "none", "gpt, llama: activation recomputation (block: keep each transformer block's input, run the block again in backward; selective: recompute only the attention probabilities); gradients stay bit for bit", "none|block|selective", 0, 0, 0},
      {"lr", CLI_FLOAT, &lr, "0.001", "learning rate", NULL, 0, 1e3, 0},
      {"optimizer", CLI_CHOICE, &c->optimizer, "adam", "optimizer", "sgd|adam|adamw", 0, 0, 0},
      {"weight-decay", CLI_FLOAT, &wd, "-1", "weight decay (-1: the optimizer's default, 0.01 for adamw, else 0)",
       NULL, -1, 10, 0},
      {"momentum", CLI_FLOAT, &momentum, "0", "SGD momentum", NULL, 0, 1, 0},
      {"lr-schedule", CLI_CHOICE, &lr_schedule, "constant", "learning-rate schedule (gpt default: cosine to lr/10; resnet: cosine to 0; step: times --lr-gamma every --lr-step steps)", "constant|cosine|step", 0, 0, 0},
      {"lr-step", CLI_INT, &lr_step, "0", "--lr-schedule step: steps between decays (0: a third of the run)", NULL, 0, 1e12, 0},
      {"lr-gamma", CLI_FLOAT, &lr_gamma, "0.1", "--lr-schedule step: the factor at each decay", NULL, 1e-9, 1, 0},
      {"nesterov", CLI_FLAG, &nesterov, NULL, "SGD: Nesterov momentum (needs --momentum > 0)", NULL, 0, 0, 0},
      {"crop-pad", CLI_INT, &crop_pad, "0", "cnn, resnet: random crop of the image zero-padded by this many pixels (0: none), per (seed, epoch, sample)", NULL, 0, 64, 0},
      {"flip", CLI_FLAG, &flip, NULL, "cnn, resnet: random horizontal flip, per (seed, epoch, sample)", NULL, 0, 0, 0},
      {"label-smoothing", CLI_FLOAT, &label_smoothing, "0", "mlp, cnn, resnet: cross-entropy with label smoothing (PyTorch's label_smoothing)", NULL, 0, 0.999, 0},
      {"sync-bn", CLI_FLAG, &sync_bn, NULL, "resnet: batch-norm statistics over all data-parallel ranks (SyncBatchNorm); one rank: no effect", NULL, 0, 0, 0},
      {"schedule", CLI_CHOICE, &schedule, "1f1b", "--pp: the pipeline schedule (constant or cosine: as --lr-schedule, kept for old scripts)", "gpipe|1f1b|interleaved|zb1p|constant|cosine", 0, 0, 0},
      {"dp", CLI_INT, &dp, "0", "data-parallel replicas of the process grid (0: the ranks left after --tp x --pp); --dp x --tp x --pp = the ranks", NULL, 0, 1 << 20, 0},
      {"pp", CLI_INT, &pp, "1", "pipeline stages: the transformer's blocks cut over this many ranks (--model gpt or llama)", NULL, 1, 4096, 0},
      {"microbatches", CLI_INT, &microbatches, "0", "--pp: micro-batches per step (each --batch-size samples; 0: as --accum)", NULL, 0, 1 << 20, 0},
      {"virtual-stages", CLI_INT, &vstages, "0", "--schedule interleaved: chunks per pipeline rank (0: 2)", NULL, 0, 256, 0},
      {"pp-split", CLI_STRING, &pp_split, NULL, "--pp: transformer blocks per chunk, comma-separated (default: balanced by the planner's cost per block)", NULL, 0, 0, 0},
      {"warmup", CLI_INT, &warmup, "0", "linear warm-up steps (gpt default: a tenth of the steps, at most 100)", NULL, 0, 1e9, 0},
      {"clip", CLI_FLOAT, &clip, "0", "clip the global gradient norm to this (0: off; gpt default 1)", NULL, 0, 1e6, 0},
      {"max-time", CLI_FLOAT, &max_time, "0", "stop cleanly after this many seconds of training (0: no limit)", NULL, 0, 1e9, 0},
      {"val-every", CLI_INT, &val_every, "0", "gpt: validation loss every this many steps (0: at the end; gpt default 100)", NULL, 0, 1e9, 0},
      {"val-batches", CLI_INT, &val_batches, "20", "gpt, llama: validation batches per evaluation, each of the global batch (--batch-size x data ranks x accumulation: the same samples in every layout)", NULL, 1, 1e6, 0},
      {"dropout", CLI_FLOAT, &dropout, "0.3", "dropout probability between layers", NULL, 0, 0.999, 0},
      {"seed", CLI_INT, &seed, "42", "seed for initialisation, shuffling and dropout", NULL, 0, 9.2e18, 0},
      {"threads", CLI_INT, &threads, "0", "intra-op threads (0: all cores, or TANDEM_NUM_THREADS)", NULL, 0, 256, 0},
      {"eval-batch-size", CLI_INT, &eval_batch, "1000", "samples per evaluation batch", NULL, 1, 1e7, 0},
      {"init-weights", CLI_STRING, &c->init_weights, NULL, "start from these weights (.safetensors)", NULL, 0, 0, 0},
      {"save-weights", CLI_STRING, &c->save_weights, NULL, "write the final weights here (.safetensors)", NULL, 0, 0, 0},
      {"metrics", CLI_STRING, &c->metrics, NULL, "write JSON-lines metrics here", NULL, 0, 0, 0},
      {"checkpoint-dir", CLI_STRING, &c->checkpoint_dir, NULL, "write checkpoints here (model, optimizer, step; with --zero every rank its shard)", NULL, 0, 0, 0},
      {"checkpoint-every", CLI_INT, &ckpt_every, "0", "steps between checkpoints (0: only at the end)", NULL, 0, 1e12, 0},
      {"last-batch", CLI_CHOICE, &c->last_batch, "auto", "the incomplete last batch of an epoch (auto: partial for one process, pad for several)", "auto|partial|pad|drop", 0, 0, 0},
      {"prefetch", CLI_CHOICE, &prefetch, "auto", "assemble the next batch on a thread (auto: if a core is spare)", "auto|on|off", 0, 0, 0},
      {"bucket-mb", CLI_FLOAT, &bucket_mb, "25", "size of a gradient bucket in MiB (the first is at most 1 MiB), as DDP's bucket_cap_mb", NULL, 0.001, 4096, 0},
      {"no-overlap", CLI_FLAG, &no_overlap, NULL, "all-reduce gradients only after backward (to measure the overlap)", NULL, 0, 0, 0},
      {"resume", CLI_FLAG, &resume, NULL, "continue from the newest valid checkpoint in --checkpoint-dir, if any (all ranks must find the same one)", NULL, 0, 0, 0},
      {"resume-override", CLI_STRING, &c->resume_override, NULL, "with --resume: settings allowed to differ from the checkpoint's (comma-separated: seed, batch, data)", NULL, 0, 0, 0},
      {"allow-nonfinite", CLI_FLAG, &allow_nonfinite, NULL, "go on when the loss, gradient norm or a parameter is NaN or infinite (default: stop with an error)", NULL, 0, 0, 0},
  };
  int n = 0;
  while (opts[n].name) n++;
  if (n + n_extra >= (int)(sizeof opts / sizeof opts[0])) { /* a programming error: never drop an option silently */
    fprintf(stderr, "tandem %s: internal error: %d options and %d of the command's own exceed the table of %d in tools/train.c\n",
            cmd, n, n_extra, (int)(sizeof opts / sizeof opts[0]));
    return 2;
  }
  for (int i = 0; i < n_extra; i++) opts[n++] = extra[i];
  int r = cli_parse(cmd, usage, opts, n, argc, argv);
  if (r) return r;
  if (cli_seen(opts, n, "epochs") && cli_seen(opts, n, "steps") && steps > 0) {
    fprintf(stderr, "tandem %s: give --epochs or --steps, not both\n", cmd);
    return 2;
  }
  int llama = !strcmp(c->model, "llama"), gpt = !strcmp(c->model, "gpt") || llama;
#define SEEN(name) cli_seen(opts, n, name)
  if (!llama && (SEEN("kv-heads") || SEEN("ffn-width") || SEEN("rope-theta") || SEEN("rope-scaling") || SEEN("tie-embeddings"))) {
    fprintf(stderr, "tandem %s: --kv-heads, --ffn-width, --rope-theta, --rope-scaling and --tie-embeddings apply to --model llama only (given --model %s)\n",
            cmd, c->model);
    return 2;
  }
  /* options of another model or optimizer are refused, not ignored (a --momentum beside Adam, a
   * --layers beside the MLP changed nothing, silently) */
  int resnet = !strcmp(c->model, "resnet");
  static const char *const lm_only[] = {"layers", "heads", "block", "vocab", "seq-len", "val-every", "val-batches", "data-path", NULL};
  for (int k = 0; !gpt && lm_only[k]; k++)
    if (SEEN(lm_only[k])) {
      fprintf(stderr, "tandem %s: --%s applies to --model gpt or llama (given --model %s)\n", cmd, lm_only[k], c->model);
      return 2;
    }
  if (!gpt && !resnet && (SEEN("width") || SEEN("config"))) {
    fprintf(stderr, "tandem %s: --%s applies to --model gpt, llama or resnet (given --model %s)\n", cmd, SEEN("width") ? "width" : "config",
            c->model);
    return 2;
  }
  if ((!strcmp(c->data, "mnist") || !strcmp(c->data, "cifar-bin")) && !SEEN("data-dir")) { /* the default holds Fashion-MNIST */
    fprintf(stderr, "tandem %s: --data %s reads its files from --data-dir: give it (the default, %s, holds Fashion-MNIST)\n", cmd,
            c->data, c->data_dir);
    return 2;
  }
  if (SEEN("momentum") && strcmp(c->optimizer, "sgd")) {
    fprintf(stderr, "tandem %s: --momentum applies to --optimizer sgd (given --optimizer %s)\n", cmd, c->optimizer);
    return 2;
  }
  if (llama && !SEEN("config")) c->gpt_config = "llama-mini";
  if (gpt) { /* nanoGPT-like defaults for what the user left unset */
    if (!SEEN("data")) c->data = "tinyshakespeare";
    if (!SEEN("optimizer")) c->optimizer = "adamw";
    if (!SEEN("lr-schedule") && (!SEEN("schedule") || (strcmp(schedule, "constant") && strcmp(schedule, "cosine"))))
      lr_schedule = "cosine";
    if (!SEEN("clip")) clip = 1.0;
    if (!SEEN("weight-decay")) wd = 0.1;
    if (!SEEN("batch-size")) batch = 16;
    if (!SEEN("dropout")) dropout = 0.1;
    if (!SEEN("val-every")) val_every = 100;
    c->decay_matrices_only = 1;
  }
  if (!SEEN("warmup") && gpt) {
    int64_t planned = steps > 0 ? steps : 500;
    warmup = planned / 10 < 100 ? planned / 10 : 100;
  }
  if (zero < 3 && (SEEN("zero-unit") || SEEN("zero-prefetch"))) {
    fprintf(stderr, "tandem %s: --%s applies to --zero 3 only (given --zero %lld)\n", cmd,
            SEEN("zero-unit") ? "zero-unit" : "zero-prefetch", (long long)zero);
    return 2;
  }
  if (strcmp(precision, "fp16") && (SEEN("loss-scale-init") || SEEN("loss-scale-window"))) {
    fprintf(stderr, "tandem %s: --loss-scale-init and --loss-scale-window apply to --precision fp16 only (given --precision %s)\n", cmd, precision);
    return 2;
  }
  if (tdm_compress_check(compress) != TDM_OK) {
    fprintf(stderr, "tandem %s: --compress: %s\n", cmd, tdm_last_error());
    return 2;
  }
  if (SEEN("compress-start") && !tdm_compress_is_hook(compress)) {
    fprintf(stderr, "tandem %s: --compress-start applies to --compress topk:RATIO or powersgd:RANK (given --compress %s)\n", cmd, compress);
    return 2;
  }
  if ((tp > 1 || pp > 1) && tdm_compress_is_hook(compress)) { /* the compressors live in the data-parallel engine */
    fprintf(stderr, "tandem %s: --compress %s with --%s %lld: error-feedback compression runs with data parallelism only (--tp 1 "
            "--pp 1): the %s engine reduces gradients without a compressor\n",
            cmd, compress, tp > 1 ? "tp" : "pp", (long long)(tp > 1 ? tp : pp), tp > 1 ? "tensor-parallel" : "pipeline");
    return 2;
  }
  if (pp > 1 && strcmp(compress, "none")) { /* its data axis all-reduces f32: bf16 would be ignored, not honoured */
    fprintf(stderr, "tandem %s: --compress %s with --pp %lld: the pipeline reduces the data axis's gradients in f32 only; expected --compress none\n",
            cmd, compress, (long long)pp);
    return 2;
  }
  if (tp > 1 && zero > 1) {
    fprintf(stderr, "tandem %s: --tp %lld with --zero %lld: the data axis beside tensor parallelism runs ZeRO stage 1 at most (the "
            "slices keep their gradients and parameters whole; use --zero 0 or 1)\n", cmd, (long long)tp, (long long)zero);
    return 2;
  }
  if (tp <= 1 && SEEN("tp-check-every")) {
    fprintf(stderr, "tandem %s: --tp-check-every applies to --tp 2 and more\n", cmd);
    return 2;
  }
  if (!ps_servers && (SEEN("ps-mode") || SEEN("staleness") || SEEN("ps-delay") || (SEEN("ps-log") && strcmp(cmd, "ps-replay")))) {
    fprintf(stderr, "tandem %s: --%s applies with --ps-servers only\n", cmd,
            SEEN("ps-mode") ? "ps-mode" : SEEN("staleness") ? "staleness" : SEEN("ps-delay") ? "ps-delay" : "ps-log");
    return 2;
  }
  if (SEEN("staleness") && strcmp(ps_mode, "ssp")) {
    fprintf(stderr, "tandem %s: --staleness applies to --ps-mode ssp only (given --ps-mode %s)\n", cmd, ps_mode);
    return 2;
  }
  if (ps_servers && (zero || pp > 1 || tp > 1 || strcmp(compress, "none"))) {
    fprintf(stderr, "tandem %s: --ps-servers with --%s: the parameter server exchanges f32 gradients with its own servers\n",
            cmd, zero ? "zero" : pp > 1 ? "pp" : tp > 1 ? "tp" : "compress");
    return 2;
  }
  int delay_worker = -1;
  double delay_s = 0;
  if (ps_delay) {
    char *end = NULL;
    long w = strtol(ps_delay, &end, 10);
    if (end == ps_delay || *end != ':' || w < 0 || !((delay_s = strtod(end + 1, &end)) >= 0) || *end || delay_s > 60) {
      fprintf(stderr, "tandem %s: --ps-delay '%s'; expected WORKER:SECONDS, such as 1:0.05 (seconds 0..60)\n", cmd, ps_delay);
      return 2;
    }
    delay_worker = (int)w;
  }
  if (zero > 0 && strcmp(compress, "none")) {
    fprintf(stderr, "tandem %s: --compress %s applies to --zero 0 only: ZeRO reduces gradients in f32\n", cmd, compress);
    return 2;
  }
  /* --schedule names a pipeline schedule; constant and cosine are learning-rate schedules, as before */
  int lr_named = !strcmp(schedule, "constant") || !strcmp(schedule, "cosine");
  if (lr_named && SEEN("lr-schedule")) {
    fprintf(stderr, "tandem %s: --schedule %s is a learning-rate schedule and --lr-schedule gives one too; give one of them\n", cmd,
            schedule);
    return 2;
  }
  c->lr_schedule = lr_named && SEEN("schedule") ? schedule : lr_schedule;
  if (pp == 1 && (SEEN("microbatches") || SEEN("virtual-stages") || SEEN("pp-split") || (SEEN("schedule") && !lr_named))) {
    fprintf(stderr, "tandem %s: --schedule, --microbatches, --virtual-stages and --pp-split are for a pipeline (--pp 2 or more)\n", cmd);
    return 2;
  }
  if (pp > 1 && zero > 1) {
    fprintf(stderr, "tandem %s: --pp %lld with --zero %lld: the pipeline's data axis runs ZeRO stage 1 at most (its stages keep "
            "gradients and parameters whole; use --zero 0 or 1)\n", cmd, (long long)pp, (long long)zero);
    return 2;
  }
  if (SEEN("microbatches") && SEEN("accum") && microbatches != accum) {
    fprintf(stderr, "tandem %s: --microbatches %lld and --accum %lld: both are the micro-batches per step; give one\n", cmd,
            (long long)microbatches, (long long)accum);
    return 2;
  }
  if (microbatches > 0) accum = microbatches;
  if (pp > 1 && strcmp(c->model, "gpt") && strcmp(c->model, "llama")) {
    fprintf(stderr, "tandem %s: --pp %lld cuts a transformer's blocks: it needs --model gpt or llama (given --model %s)\n", cmd,
            (long long)pp, c->model);
    return 2;
  }
  tdm_engine_pipeline_config *pc = &c->engine.pp;
  if (pp > 1) {
    tdm_pp_schedule_kind sk = TDM_PP_1F1B;
    if (SEEN("schedule") && !lr_named && tdm_pp_schedule_parse(schedule, &sk) != TDM_OK) return 2;
    pc->schedule = sk;
    pc->zero_stage = (int)zero;
    if (vstages > 1 && sk != TDM_PP_INTERLEAVED) {
      fprintf(stderr, "tandem %s: --virtual-stages %lld needs --schedule interleaved (given %s)\n", cmd, (long long)vstages,
              tdm_pp_schedule_name(sk));
      return 2;
    }
    pc->virtual_stages = (int)vstages;
    size_t sl = pp_split ? strlen(pp_split) : 0;
    if (pp_split && (sl == 0 || pp_split[sl - 1] == ',')) {
      fprintf(stderr, "tandem %s: --pp-split '%s': expected comma-separated block counts like 2,3,3\n", cmd, pp_split);
      return 2;
    }
    for (const char *at = pp_split; at && *at;) { /* a,b,c: each a count >= 1 */
      char num[32];
      size_t len = strcspn(at, ",");
      int64_t v;
      if (len == 0 || len >= sizeof num || pc->n_split == TDM_PP_MAX_SPLIT) {
        fprintf(stderr, "tandem %s: --pp-split '%s': expected comma-separated block counts, at most %d\n", cmd, pp_split, TDM_PP_MAX_SPLIT);
        return 2;
      }
      memcpy(num, at, len);
      num[len] = 0;
      if (cli_parse_int(num, 1, 1 << 20, &v)) {
        fprintf(stderr, "tandem %s: --pp-split '%s': '%s' is not a block count >= 1\n", cmd, pp_split, num);
        return 2;
      }
      pc->split[pc->n_split++] = (int)v;
      at += len + (at[len] == ',');
    }
  }
#undef SEEN
  c->dp = dp, c->pp = pp;
  c->n_layer = layers, c->n_head = heads, c->n_embd = width, c->block_size = block, c->vocab_size = vocab, c->seq_len = seq_len;
  c->n_kv_head = kv_heads, c->ffn_hidden = ffn_width, c->rope_theta = rope_theta;
  c->rope_scaling = !strcmp(rope_scaling, "auto") ? -1 : !strcmp(rope_scaling, "llama3");
  c->tie_embeddings = !strcmp(tie, "auto") ? -1 : !strcmp(tie, "on");
  c->warmup_steps = warmup;
  c->crop_pad = (int)crop_pad, c->flip = flip, c->label_smoothing = label_smoothing;
  c->nesterov = nesterov, c->sync_bn = sync_bn, c->lr_step_size = lr_step, c->lr_gamma = lr_gamma;
  if (!strcmp(c->model, "resnet") && !cli_seen(opts, n, "config")) c->gpt_config = "resnet20";
  if (!strcmp(c->model, "resnet") != (!strcmp(c->gpt_config, "resnet20") || !strcmp(c->gpt_config, "resnet18")) &&
      cli_seen(opts, n, "config")) {
    fprintf(stderr, "tandem %s: --config %s does not fit --model %s\n", cmd, c->gpt_config, c->model);
    return 2;
  }
  if (nesterov && (strcmp(c->optimizer, "sgd") || !(momentum > 0))) {
    fprintf(stderr, "tandem %s: --nesterov needs --optimizer sgd and --momentum > 0 (given %s, momentum %g)\n", cmd, c->optimizer, momentum);
    return 2;
  }
  c->max_time = max_time;
  c->val_every = val_every;
  c->val_batches = val_batches;
  c->epochs = epochs;
  c->steps = steps;
  c->batch_size = batch;
  c->lr = lr;
  c->dropout = dropout;
  c->weight_decay = wd;
  c->momentum = momentum;
  c->seed = (uint64_t)seed;
  c->threads = (int)threads;
  c->eval_batch = eval_batch;
  c->checkpoint_every = ckpt_every;
  c->resume = resume;
  c->allow_nonfinite = allow_nonfinite;
  c->memory_limit = memory_limit;
  c->prefetch = !strcmp(prefetch, "on") ? 1 : !strcmp(prefetch, "off") ? 0 : -1;
  tdm_engine_config *e = &c->engine;
  e->kind = ps_servers ? TDM_ENGINE_PS : pp > 1 ? TDM_ENGINE_PIPELINE : tp > 1 ? TDM_ENGINE_TP : zero ? TDM_ENGINE_ZERO : TDM_ENGINE_DP;
  e->tp.check_every = tp_check;
  e->tp.zero_stage = tp > 1 && pp == 1 ? (int)zero : 0;
  c->tp = tp;
  e->ps.servers = (int)ps_servers;
  e->ps.mode = !strcmp(ps_mode, "async") ? TDM_PS_ASYNC : !strcmp(ps_mode, "ssp") ? TDM_PS_SSP : TDM_PS_SYNC;
  e->ps.staleness = (int)staleness;
  e->ps.delay_worker = delay_worker;
  e->ps.delay_s = delay_s;
  e->ps.log_dir = ps_log;
  e->accum = accum;
  e->clip = (float)clip;
  e->dp.bucket_bytes = e->zero.bucket_bytes = (size_t)(bucket_mb * 1048576.0);
  e->dp.no_overlap = no_overlap;
  e->dp.wire_dtype = !strcmp(compress, "bf16") ? TDM_BF16 : !strcmp(compress, "fp16") ? TDM_F16 : TDM_F32;
  e->dp.compress = tdm_compress_is_hook(compress) ? compress : NULL;
  e->dp.compress_start = compress_start;
  e->zero.stage = zero ? (int)zero : 1;
  e->zero.unit_modules = (int)zero_unit;
  e->zero.prefetch = !strcmp(zero_prefetch, "on");
  e->precision = !strcmp(precision, "bf16") ? TDM_BF16 : !strcmp(precision, "fp16") ? TDM_F16 : TDM_F32;
  e->loss_scale.init = (float)ls_init;
  e->loss_scale.window = ls_window;
  e->recompute = !strcmp(recompute, "block") ? TDM_RECOMPUTE_BLOCK : !strcmp(recompute, "selective") ? TDM_RECOMPUTE_SELECTIVE : TDM_RECOMPUTE_NONE;
  if (resume && !c->checkpoint_dir) {
    fprintf(stderr, "tandem %s: --resume needs --checkpoint-dir\n", cmd);
    return 2;
  }
  if (c->resume_override && !resume) {
    fprintf(stderr, "tandem %s: --resume-override needs --resume\n", cmd);
    return 2;
  }
  return 0;
}

int tool_train_as(const char *cmd, int argc, char **argv) {
  tdm_train_config c;
  const char *trace = NULL, *slow = NULL, *device = NULL;
  int64_t emulate = 0;
  int tf32 = 0;
  cli_opt extra[] = {
      {"trace", CLI_STRING, &trace, NULL, "write a timeline per rank in this directory (Chrome trace JSON; tandem trace merge DIR OUT lines the ranks up)", NULL, 0, 0, 0},
      {"emulate-ranks", CLI_INT, &emulate, "0", "run N data-parallel ranks as threads of this process (thread transport; TANDEM_NET_EMULATE for link costs)", NULL, 0, 1024, 0},
      {"emulate-slow", CLI_STRING, &slow, NULL, "with --emulate-ranks: RANK:FACTOR makes that rank a straggler whose steps take FACTOR times as long", NULL, 0, 0, 0},
      {"device", CLI_CHOICE, &device, "cpu", "where to train (cuda: --model gpt on one GPU, fp32, --tf32 or --precision bf16; see README)", "cpu|cuda", 0, 0, 0},
      {"tf32", CLI_FLAG, &tf32, NULL, "--device cuda: TF32 tensor cores for the fp32 products", NULL, 0, 0, 0},
  };
  int r = train_options(cmd, "[options]", argc, argv, &c, 5, extra);
  c.trace_dir = trace;
  if (r == 1) return 0;
  if (r) return 2;
  if (!strcmp(device, "cuda")) {
    if (trace || emulate > 0) {
      fprintf(stderr, "tandem %s: --device cuda does not take %s yet (it trains one process on one GPU)\n", cmd,
              trace ? "--trace" : "--emulate-ranks");
      return 2;
    }
    return train_cuda(&c, tf32);
  }
  if (tf32) {
    fprintf(stderr, "tandem %s: --tf32 applies to --device cuda\n", cmd);
    return 2;
  }
  if (run_elastic_batch(&c)) return 2; /* under tandem run --nnodes MIN:MAX: this round's batch */
  c.on_step = fault_hook;
  c.progress = stderr;
  tdm_train_result res;
  if (slow && emulate <= 0) {
    fprintf(stderr, "tandem %s: --emulate-slow needs --emulate-ranks N\n", cmd);
    return 2;
  }
  if (emulate > 0) {
    if (getenv("WORLD_SIZE") && atoi(getenv("WORLD_SIZE")) > 1) {
      fprintf(stderr, "tandem %s: --emulate-ranks makes its own ranks: run it as one process, not under a launcher (WORLD_SIZE=%s)\n", cmd,
              getenv("WORLD_SIZE"));
      return 2;
    }
    int er = emulate_ranks(&c, (int)emulate, slow, &res);
    if (er) return er;
  }
  tdm_status st = emulate > 0 ? TDM_OK : tdm_train_run(&c, &res);
  if (st != TDM_OK) {
    /* a failure passed on from another rank exits TANDEM_EXIT_RELAYED: tandem run then names the
     * rank where it began, whichever process the kernel reaps first */
    int from = tdm_last_error_origin();
    char who[48] = "";
    if (from >= 0) snprintf(who, sizeof who, " (relayed from rank %d)", from);
    else if (res.world_size > 1) snprintf(who, sizeof who, " (this rank)");
    fprintf(stderr, "tandem %s: %s%s: %s\n", cmd, tdm_status_str(st), who, tdm_last_error());
    return from >= 0 ? TANDEM_EXIT_RELAYED : 1;
  }
  if (res.rank != 0) return 0; /* rank 0 reports for everyone */
  char thr[64]; /* no step ran (resumed at the end): no throughput to give */
  int lm = !strcmp(c.model, "gpt") || !strcmp(c.model, "llama");
  if (res.train_seconds > 0) snprintf(thr, sizeof thr, "%.0f %s/s", lm ? res.tokens_per_sec : res.samples_per_sec, lm ? "tokens" : "samples");
  else snprintf(thr, sizeof thr, "none (no step ran)");
  if (lm)
    printf("val loss: %.4f nats per byte  next-byte accuracy: %.4f  throughput: %s  (%lld steps of %lld tokens, %.1f s training)\n",
           res.test_loss, res.test_accuracy, thr, (long long)res.steps, (long long)res.tokens_per_step, res.train_seconds);
  else
    printf("test accuracy: %.4f  test loss: %.4f  throughput: %s  (%lld steps, %.1f s training)\n", res.test_accuracy,
           res.test_loss, thr, (long long)res.steps, res.train_seconds);
  if (c.save_weights) printf("weights written to %s\n", c.save_weights);
  return 0;
}

int tool_train(int argc, char **argv) { return tool_train_as("train", argc, argv); }

int tool_ps_replay(int argc, char **argv) {
  tdm_train_config c;
  int64_t until = -1;
  cli_opt extra[] = {
      {"until", CLI_INT, &until, "-1", "stop each server after this many updates (-1: all)", NULL, -1, 1e15, 0},
  };
  int r = train_options("ps-replay", "--ps-log DIR --save-weights OUT [the run's tandem train options] [--until N]", argc,
                        argv, &c, 1, extra);
  if (r == 1) return 0;
  if (r) return 2;
  if (!c.engine.ps.log_dir || !c.save_weights) {
    fprintf(stderr, "tandem ps-replay: give --ps-log DIR (the run's) and --save-weights OUT\n");
    return 2;
  }
  c.ps_replay = c.engine.ps.log_dir;
  c.ps_replay_until = until;
  c.progress = stderr;
  tdm_train_result res;
  tdm_status st = tdm_train_run(&c, &res);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem ps-replay: %s: %s\n", tdm_status_str(st), tdm_last_error());
    return 1;
  }
  printf("%lld updates replayed; weights written to %s\n", (long long)res.steps, c.save_weights);
  return 0;
}

/* The pipeline's schedule as tandem train will run it: its timeline drawn (when it fits) and, with
 * --trace, written as a Chrome trace. */
static int plan_schedule(const tdm_train_config *c, const char *trace) {
  const tdm_engine_pipeline_config *pc = &c->engine.pp;
  int V = pc->virtual_stages > 0 ? pc->virtual_stages : pc->schedule == TDM_PP_INTERLEAVED ? 2 : 1;
  tdm_pp_schedule *s;
  if (tdm_pp_schedule_create(&s, pc->schedule, (int)c->pp, V, (int)(c->engine.accum > 1 ? c->engine.accum : 1)) != TDM_OK) {
    fprintf(stderr, "tandem plan: %s\n", tdm_last_error());
    return 1;
  }
  if (s->makespan * 2 + 12 <= 160) {
    char pic[16384];
    tdm_pp_schedule_draw(s, pic, sizeof pic);
    printf("timeline (F forward, B backward, b input pass, W weight pass; digit: micro-batch, one unit per 2 characters):\n%s", pic);
  }
  int rc = 0;
  if (trace && tdm_pp_schedule_write_trace(s, trace, 0) != TDM_OK) {
    fprintf(stderr, "tandem plan: %s\n", tdm_last_error());
    rc = 1;
  } else if (trace) {
    printf("trace of the schedule written to %s (open in Perfetto or chrome://tracing)\n", trace);
  }
  tdm_pp_schedule_destroy(s);
  return rc;
}

int tool_plan(int argc, char **argv) {
  tdm_train_config c;
  int64_t world = 0;
  int json = 0, tf32 = 0;
  const char *trace = NULL, *device = NULL;
  cli_opt extra[] = {
      {"world", CLI_INT, &world, "0", "ranks to plan for (tandem train under tandem run -n N; 0: --dp x --tp x --pp)", NULL, 0, 1 << 20, 0},
      {"device", CLI_CHOICE, &device, "cpu", "cuda: the device memory of tandem train --device cuda (computed here: no GPU needed)", "cpu|cuda", 0, 0, 0},
      {"tf32", CLI_FLAG, &tf32, NULL, "--device cuda: TF32 products (the same memory as fp32)", NULL, 0, 0, 0},
      {"json", CLI_FLAG, &json, NULL, "print the plan as one JSON object", NULL, 0, 0, 0},
      {"trace", CLI_STRING, &trace, NULL, "--pp: write the schedule's timeline per stage here (Chrome trace JSON)", NULL, 0, 0, 0},
  };
  int r = train_options("plan", "[tandem train's options] [--world N] [--trace FILE]", argc, argv, &c, 5, extra);
  if (r == 1) return 0;
  if (r) return 2;
  if (!strcmp(device, "cuda")) return plan_cuda(&c, tf32, json);
  if (tf32) {
    fprintf(stderr, "tandem plan: --tf32 applies to --device cuda\n");
    return 2;
  }
  if (world == 0) world = (c.dp > 0 ? c.dp : 1) * (c.tp > 1 ? c.tp : 1) * c.pp;
  if (trace && c.pp < 2) {
    fprintf(stderr, "tandem plan: --trace draws a pipeline's schedule: give --pp 2 or more\n");
    return 2;
  }
  tdm_plan p;
  tdm_status st = tdm_train_plan(&c, (int)world, &p);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem plan: %s: %s\n", tdm_status_str(st), tdm_last_error());
    return 1;
  }
  if (json) {
    printf("{\"world\":%d,\"tensor\":%d,\"stage\":%d,\"params\":%lld,\"owned\":%lld,\"groups\":%d,\"max_group\":%lld,"
           "\"comm_bytes_per_step\":%.0f", p.world, p.tensor, p.stage, (long long)p.n_params, (long long)p.owned, p.n_groups,
           (long long)p.max_group, p.comm_per_step);
    if (p.pipeline > 1) {
      printf(",\"pipeline\":%d,\"schedule\":\"%s\",\"microbatches\":%d,\"bubble\":%.6f,\"stages\":[", p.pipeline, p.schedule,
             p.microbatches, p.bubble);
      for (int k = 0; k < p.n_stages; k++)
        printf("%s{\"peak_microbatches\":%d,\"activations\":%lld,\"total\":%lld}", k ? "," : "", p.stages[k].peak,
               (long long)p.stages[k].bytes[TDM_MEM_ACTIVATIONS], (long long)p.stages[k].total);
      printf("]");
    }
    for (int k = 0; k < TDM_MEM_COUNT; k++) {
      if (k == TDM_MEM_ACTIVATIONS && p.act_unknown) /* not estimated (resnet): null, never a wrong number */
        printf(",\"%s\":null", tdm_mem_category_name((tdm_mem_category)k));
      else
        printf(",\"%s\":%lld", tdm_mem_category_name((tdm_mem_category)k), (long long)p.bytes[k]);
    }
    printf(",\"activations_estimated\":%s", p.act_unknown ? "false" : "true");
    printf(",\"total\":%lld,\"fits\":%s}\n", (long long)p.total,
           c.memory_limit > 0 && p.total > c.memory_limit ? "false" : c.memory_limit > 0 && p.act_unknown ? "null" : "true");
  } else {
    tdm_plan_print(stdout, &p, c.memory_limit);
    if (c.pp > 1 && plan_schedule(&c, trace)) return 1;
  }
  if (json && trace && plan_schedule(&c, trace)) return 1;
  st = tdm_plan_check(&p, c.memory_limit);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem plan: %s\n", tdm_last_error());
    return 1;
  }
  return 0;
}
