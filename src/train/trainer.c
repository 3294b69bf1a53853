/* The training loop: epochs, evaluation, metrics, checkpoint cadence and stop conditions. How a
 * step is spread over the ranks is the parallelism engine's business (tandem/engine.h): the loop
 * hands it micro-batches from the sampler and records what it reports. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/autograd.h"
#include "tandem/comm.h"
#include "tandem/engine.h"
#include "tandem/plan.h"
#include "tandem/checkpoint.h"
#include "tandem/sampler.h"
#include "tandem/data.h"
#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/tensor.h"
#include "tandem/train.h"
#include "train/ckpt_impl.h"
#include "train/observe.h"
#include "tandem/trace.h"
#include "train/agree.h"
#include "train/run_start.h"

tdm_train_config tdm_train_config_default(void) {
  tdm_train_config c = {0};
  c.model = "mlp";
  c.data = "fashion-mnist";
  c.data_dir = "/usr/share/datasets/fashion-mnist";
  c.epochs = 1;
  c.batch_size = 64;
  c.lr = 1e-3;
  c.optimizer = "adam";
  c.weight_decay = -1;
  c.dropout = 0.3;
  c.seed = 42;
  c.eval_batch = 1000;
  c.engine = tdm_engine_config_default();
  c.ps_replay_until = -1;
  c.last_batch = "auto";
  c.prefetch = -1;
  c.gpt_config = "mini";
  c.rope_scaling = -1;
  c.tie_embeddings = -1;
  c.lr_schedule = "constant";
  c.val_batches = 20;
  c.pp = 1;
  return c;
}

typedef struct {
  FILE *f;
  int tty;
  double last;
  double comm_s, step_s; /* this rank's communication wait and step time so far: the progress line's share */
} progress;

static void fmt_eta(char *b, size_t n, double s) {
  if (!(s >= 0) || s > 1e7) snprintf(b, n, "--");
  else if (s >= 3600) snprintf(b, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
  else snprintf(b, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* The language models: token windows in, next-token logits out. */
static int is_lm(tdm_model_kind k) { return k == TDM_MODEL_GPT || k == TDM_MODEL_LLAMA; }

/* Evaluates on the whole set with gradients and dropout off. */
/* The input tensor's shape for n samples: (n, features) for the MLP, (n, C, H, W) for the CNN. */
static int input_shape(const tdm_model_config *mc, int64_t n, int64_t per, int64_t *xs) {
  if (is_lm(mc->kind)) { /* token windows (n, T) */
    xs[0] = n, xs[1] = per;
    return 2;
  }
  if (mc->kind == TDM_MODEL_CNN || mc->kind == TDM_MODEL_RESNET) {
    xs[0] = n, xs[1] = mc->in_channels, xs[2] = mc->height, xs[3] = mc->width;
    return 4;
  }
  xs[0] = n, xs[1] = per;
  return 2;
}

/* Every rank runs the same number of forward passes (a sharded engine gathers parameters in each,
 * collectively): a rank whose shard of the set is smaller ends with a pass over one sample whose
 * result is not counted. */
static tdm_status evaluate(tdm_engine *e, const tdm_dataset *ds, int64_t eb, int64_t *idx_buf, int64_t max_samples,
                           double *loss_out, double *acc_out) {
  /* the data axis shares the set out; the stages of a pipeline all take part in each pass */
  tdm_comm_t comm = tdm_grid_comm(tdm_engine_grid(e), TDM_AXIS_DATA);
  tdm_tape *tp = tdm_engine_tape(e);
  int W = comm ? tdm_comm_size(comm) : 1, R = comm ? tdm_comm_rank(comm) : 0;
  int64_t total = tdm_dataset_len(ds), per = tdm_dataset_sample_numel(ds), correct = 0, rows_total = 0;
  if (max_samples > 0 && max_samples < total) total = max_samples;
  int tokens = tdm_dataset_is_tokens(ds);
  int64_t first = total * R / W, n = total * (R + 1) / W - first; /* this rank's shard */
  int64_t most = (total + W - 1) / W, passes = (most + eb - 1) / eb;
  double loss_sum = 0;
  const tdm_model_config *mc = tdm_model_get_config(tdm_engine_model(e));
  for (int64_t k = 0; k < passes; k++) {
    int64_t b = k * eb, B = n - b < eb ? n - b : eb, counted = B > 0;
    if (!counted) B = 1, b = 0; /* a pass to keep in step with the other ranks */
    tdm_tape_reset(tp);
    for (int64_t i = 0; i < B; i++) idx_buf[i] = (first + b + i) % tdm_dataset_len(ds);
    int64_t xs[4], ys[2] = {B, per};
    int nd = input_shape(mc, B, per, xs);
    tdm_tensor *x = tdm_new(tp, tokens ? TDM_I32 : TDM_F32, nd, xs), *y = tdm_new(tp, TDM_I32, tokens ? 2 : 1, ys);
    if (!x || !y) return tdm__set_error(tdm_tape_status(tp), "%s", tdm_tape_error(tp));
    if (tokens) TDM__TRY(tdm_dataset_tokens(ds, idx_buf, B, tdm_tensor_data(x), tdm_tensor_data(y)));
    else TDM__TRY(tdm_dataset_batch(ds, idx_buf, B, tdm_tensor_data(x), tdm_tensor_data(y)));
    double l, ok, rows;
    TDM__TRY(tdm_engine_eval(e, x, y, &l, &ok, &rows));
    if (!counted) continue;
    loss_sum += (double)(float)l * rows;
    rows_total += (int64_t)rows;
    correct += (int64_t)ok;
  }
  double sums[3] = {loss_sum, (double)correct, (double)rows_total};
  if (comm) TDM__TRY(tdm_comm_allreduce(comm, sums, sums, 3, TDM_F64, TDM_SUM, TDM_ALGO_AUTO));
  *loss_out = sums[2] > 0 ? sums[0] / sums[2] : 0;
  *acc_out = sums[2] > 0 ? sums[1] / sums[2] : 0;
  return TDM_OK;
}

static tdm_status parse_kinds(const tdm_train_config *c, tdm_model_kind *mk, tdm_optim_kind *ok) {
  if (!c->model || (strcmp(c->model, "mlp") && strcmp(c->model, "cnn") && strcmp(c->model, "gpt") && strcmp(c->model, "llama") &&
                    strcmp(c->model, "resnet")))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: model '%s'; expected mlp, cnn, gpt, llama or resnet", c->model ? c->model : "(null)");
  *mk = !strcmp(c->model, "mlp") ? TDM_MODEL_MLP : !strcmp(c->model, "cnn") ? TDM_MODEL_CNN
      : !strcmp(c->model, "gpt") ? TDM_MODEL_GPT : !strcmp(c->model, "resnet") ? TDM_MODEL_RESNET : TDM_MODEL_LLAMA;
  int text = c->data && !strcmp(c->data, "tinyshakespeare");
  if (is_lm(*mk) != text)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: model %s with data %s; the gpt model trains on tinyshakespeare (as does llama), the others on image data",
                          c->model, c->data ? c->data : "(null)");
  if (!c->optimizer) return tdm__set_error(TDM_ERR_INVALID_ARG, "train: no optimizer");
  if (!strcmp(c->optimizer, "sgd")) *ok = TDM_OPT_SGD;
  else if (!strcmp(c->optimizer, "adam")) *ok = TDM_OPT_ADAM;
  else if (!strcmp(c->optimizer, "adamw")) *ok = TDM_OPT_ADAMW;
  else return tdm__set_error(TDM_ERR_INVALID_ARG, "train: optimizer '%s'; expected sgd, adam or adamw", c->optimizer);
  if (!c->data || (strcmp(c->data, "fashion-mnist") && strcmp(c->data, "mnist") && strcmp(c->data, "synthetic") &&
                   strcmp(c->data, "tinyshakespeare") && strcmp(c->data, "cifar-bin")))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: data set '%s'; expected fashion-mnist, mnist, synthetic, cifar-bin or tinyshakespeare",
                          c->data ? c->data : "(null)");
  const tdm_engine_config *e = &c->engine;
  if (*mk == TDM_MODEL_RESNET && e->kind == TDM_ENGINE_ZERO && e->zero.stage == 3)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "train: resnet with --zero 3: batch norm writes its running statistics "
                                                 "into the parameters in forward, which stage 3 does not hold; use --zero 0, 1 or 2");
  if (e->kind == TDM_ENGINE_PS && e->ps.mode != TDM_PS_SYNC && c->max_time > 0 && c->checkpoint_dir)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "train: --max-time with --ps-mode %s and --checkpoint-dir: the workers stop "
                          "on their own clocks at different steps, and a checkpoint is of one step; give --steps, or "
                          "--ps-mode sync, or no --checkpoint-dir", e->ps.mode == TDM_PS_ASYNC ? "async" : "ssp");
  if (*mk == TDM_MODEL_RESNET && e->kind == TDM_ENGINE_PS)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "train: resnet with --ps-servers: batch norm writes its running statistics "
                                                 "into the parameters in forward, and each pull from the servers would overwrite "
                                                 "them; use data parallelism (--zero 0, 1 or 2)");
  if ((c->crop_pad > 0 || c->flip) && (*mk == TDM_MODEL_MLP || is_lm(*mk)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: %s with model %s: augmentation needs image inputs (cnn, resnet)",
                          c->crop_pad > 0 && c->flip ? "--crop-pad and --flip" : c->flip ? "--flip" : "--crop-pad", c->model);
  if (c->sync_bn && *mk != TDM_MODEL_RESNET)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --sync-bn with model %s, which has no batch norm; it applies to resnet", c->model);
  if ((unsigned)e->kind >= TDM_ENGINE_KIND_COUNT || (e->kind == TDM_ENGINE_ZERO && (e->zero.stage < 1 || e->zero.stage > 3)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: parallelism %s stage %d; expected dp, or zero with stage 1, 2 or 3",
                          tdm_engine_kind_name(e->kind), e->zero.stage);
  if (e->dp.wire_dtype != TDM_F32 && e->dp.wire_dtype != TDM_BF16 && e->dp.wire_dtype != TDM_F16)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: gradients on the wire as %s; expected f32, bf16 or f16",
                          tdm_dtype_name(e->dp.wire_dtype));
  TDM__TRY(tdm_compress_check(e->dp.compress));
  if (e->kind == TDM_ENGINE_ZERO && tdm_compress_is_hook(e->dp.compress))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --compress %s with --zero %d: ZeRO reduces gradients in f32 only; expected --zero 0",
                          e->dp.compress, e->zero.stage);
  if ((e->kind == TDM_ENGINE_PIPELINE || e->kind == TDM_ENGINE_TP) && tdm_compress_is_hook(e->dp.compress))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --compress %s with the %s engine (--%s %lld): error-feedback compression runs "
                          "with data parallelism only; expected --tp 1 --pp 1", e->dp.compress, tdm_engine_kind_name(e->kind),
                          e->kind == TDM_ENGINE_TP ? "tp" : "pp", (long long)(e->kind == TDM_ENGINE_TP ? c->tp : c->pp));
  if (e->kind == TDM_ENGINE_PIPELINE && e->dp.wire_dtype != TDM_F32) /* finish() all-reduces f32: it would be ignored */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --compress %s with --pp %lld: the pipeline reduces the data axis's gradients in f32 "
                          "only", tdm_dtype_name(e->dp.wire_dtype), (long long)c->pp);
  if (e->kind == TDM_ENGINE_ZERO && e->dp.wire_dtype != TDM_F32)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --compress %s with --zero %d: ZeRO reduces gradients in f32 only",
                          tdm_dtype_name(e->dp.wire_dtype), e->zero.stage);
  if (e->precision != TDM_F32 && (*mk == TDM_MODEL_CNN || *mk == TDM_MODEL_RESNET))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --precision %s with --model %s: its convolution%s are f32 only; mixed precision runs mlp, gpt and llama",
                          e->precision == TDM_BF16 ? "bf16" : "fp16", c->model, *mk == TDM_MODEL_CNN ? " and pooling" : ", batch norm and pooling");
  if ((unsigned)e->recompute >= TDM_RECOMPUTE_COUNT || (e->recompute != TDM_RECOMPUTE_NONE && !is_lm(*mk)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --recompute %s with --model %s; recomputation applies to the transformer blocks of gpt and llama",
                          tdm_recompute_name(e->recompute), c->model);
  if (e->accum < 0 || e->accum > 1 << 20 || !(e->clip >= 0))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: accumulation %lld, clip %g; expected 1..2^20 and >= 0",
                          (long long)e->accum, (double)e->clip);
  if (c->batch_size < 1 || c->eval_batch < 1 || (c->steps <= 0 && c->epochs < 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: batch size %lld, evaluation batch %lld, epochs %lld, steps %lld; expected batches "
                          ">= 1 and epochs or steps >= 1", (long long)c->batch_size, (long long)c->eval_batch, (long long)c->epochs,
                          (long long)c->steps);
  if (!(c->lr >= 0 && isfinite(c->lr)) || !(c->dropout >= 0 && c->dropout < 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: lr %g, dropout %g; expected a finite lr >= 0 and 0 <= dropout < 1", c->lr,
                          c->dropout);
  /* the library's own callers get what the command line's choices allow (an unknown name silently meant the default) */
  static const char *const schedules[] = {"constant", "cosine", "step", NULL}, *const rules[] = {"auto", "partial", "pad", "drop", NULL};
  const char *const *lists[2] = {schedules, rules}, *given[2] = {c->lr_schedule, c->last_batch}, *names[2] = {"lr schedule", "last batch"};
  for (int i = 0; i < 2; i++) {
    int known = !given[i];
    for (int k = 0; !known && lists[i][k]; k++) known = !strcmp(given[i], lists[i][k]);
    if (!known) return tdm__set_error(TDM_ERR_INVALID_ARG, "train: %s '%s' is unknown", names[i], given[i]);
  }
  if (c->warmup_steps < 0 || !(c->max_time >= 0) || c->crop_pad < 0 || !(c->label_smoothing >= 0 && c->label_smoothing < 1) ||
      (c->lr_schedule && !strcmp(c->lr_schedule, "step") && !(c->lr_gamma >= 0)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: warm-up %lld steps, max time %g s, crop padding %d, label smoothing %g, lr gamma %g; "
                          "expected them >= 0 (smoothing below 1)", (long long)c->warmup_steps, c->max_time, c->crop_pad,
                          c->label_smoothing, c->lr_gamma);
  return TDM_OK;
}

/* One step's numbers, kept until its all-reduced loss and accuracy arrive. */
enum { RANK_TIMES = 64 };
typedef struct {
  int pending;
  int64_t step, epoch;
  /* loss / world, correct, rows of this rank, "time is up": summed over ranks; then, up to
   * RANK_TIMES ranks, each rank's step, forward, backward, comm wait and optimizer times in its
   * own slots (zero elsewhere: the sum gathers them exactly) for the report's per-rank view */
  double stats[4 + 5 * RANK_TIMES];
  int n_stats;
  tdm_work_t work;
  double dt, t_fwd, t_bwd, t_wait, t_opt, samples, grad_norm;
  double loss_scale; /* fp16: the step's loss scale (0: not fp16) */
  int skipped;       /* fp16: the step overflowed and was skipped (on every rank) */
  int64_t total, G;
  int64_t samples_so_far;
  double train_time, lr;
  char grad[1536]; /* the gradient exchange: bytes sent, and per-bucket compression stats (JSON members) */
} step_record;

typedef struct {
  tdm_comm_t comm;     /* the ranks that train (with a parameter server: the workers) */
  tdm_comm_t ps_world; /* with a parameter server: workers and servers */
  tdm_comm_t ps_workers; /* the workers' communicator as made (comm is a subset of it once workers are lost) */
  int ps_lost;           /* workers lost so far */
  tdm_grid *grid;
  tdm_engine *engine;
  tdm_sampler *sampler;
  double last_loss;
  int stop;                 /* --max-time reached on some rank: every rank stops after this step */
  int64_t tokens_per_sample; /* gpt: T */
  tdm_dataset *train, *test;
  int64_t *idx;
  FILE *metrics;
  int64_t recorded; /* resumed: the last step the metrics file holds already (not written again); else -1 */
  tdm__start_out start; /* the checkpoint directory's lock */
  tdm_trace *trace;     /* --trace: this rank's timeline */
  step_record rec; /* the last step's, its all-reduce maybe in flight: kept here, where it outlives the
                    * communicator, so that a run ending on an error never leaves the comm thread writing to a dead frame */
} run_state;

static void run_free(run_state *s) {
  tdm_sampler_destroy(s->sampler);
  tdm_engine_destroy(s->engine);
  tdm_grid_destroy(s->grid);
  if (s->comm != s->ps_workers) tdm_comm_destroy(s->comm); /* the survivors' */
  tdm_comm_destroy(s->ps_workers);
  tdm_comm_destroy(s->ps_world); /* after the workers' communicators, which speak through it */
  tdm_dataset_destroy(s->train);
  tdm_dataset_destroy(s->test);
  tdm__free(s->idx);
  if (s->metrics) fclose(s->metrics);
  tdm__run_start_release(&s->start);
}

/* A quantity every rank sees alike (a global loss or norm, a parameter after the same update)
 * that is not finite stops the run at the same step everywhere, unless allowed. */
static tdm_status finite_or_stop(const tdm_train_config *c, double v, int64_t step, const char *what, const char *where) {
  if (isfinite(v) || c->allow_nonfinite) return TDM_OK;
  return tdm__set_error(TDM_ERR_INVALID_ARG, "step %lld: %s is %g%s: training diverged; lower --lr (now %g), or pass --allow-nonfinite to go on",
                        (long long)step, what, v, where, c->lr);
}

/* The engine stopped on a gradient norm that is not finite (it is the same on every rank: the
 * norm of the reduced gradient): say so as the other divergence checks do. */
static tdm_status grad_norm_error(const tdm_train_config *c, double norm, int64_t step, int R, int W) {
  char where[96] = "";
  if (W > 1) snprintf(where, sizeof where, " (averaged over %d ranks; the same on each, this is rank %d)", W, R);
  return finite_or_stop(c, norm, step, "the gradient norm", where);
}

/* Parameters before they are written: an overflowed update can hide from the loss (ReLU maps
 * NaN to 0), never from the files. Collective (a sharded engine looks at every rank's pieces). */
static tdm_status params_finite(tdm_engine *e, const tdm_train_config *c, int64_t steps_done) {
  if (c->allow_nonfinite) return TDM_OK;
  int64_t i;
  TDM__TRY(tdm_engine_first_nonfinite(e, &i));
  if (i < 0) return TDM_OK;
  const tdm_params *p = tdm_model_params(tdm_engine_model(e));
  int k = 0;
  while (k + 1 < tdm_params_count(p) && tdm_params_offset(p, k + 1) <= i) k++;
  char what[160];
  snprintf(what, sizeof what, "parameter '%s' (element %lld)", tdm_tensor_name(tdm_params_get(p, k)), (long long)(i - tdm_params_offset(p, k)));
  return finite_or_stop(c, NAN, steps_done - 1, what, " after the update");
}

/* JSON has no NaN or Infinity: a non-finite value is written as null. */
static const char *json_num(char *b, size_t n, const char *fmt, double v) {
  if (isfinite(v)) snprintf(b, n, fmt, v);
  else snprintf(b, n, "null");
  return b;
}

static tdm_status metrics_ok(run_state *s, const tdm_train_config *c) {
  if (s->metrics && (fflush(s->metrics) != 0 || ferror(s->metrics)))
    return tdm__set_error(TDM_ERR_IO, "train: writing metrics to %s failed: %s", c->metrics, strerror(errno));
  return TDM_OK;
}

/* The last step whose record the metrics file holds, -1 if none: a run resumed from a checkpoint
 * redoes the steps after it, and those an earlier attempt recorded already are not written again.
 * Every record is in the file before the checkpoint that follows it is written (the file is
 * flushed first), so a resumed run finds no gap either: each step once, whatever killed what. */
static int64_t last_recorded_step(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int64_t last = -1;
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    long long k;
    /* a whole record only: one cut off by a kill mid-write does not count (its step is written again) */
    if (len >= 2 && line[len - 1] == '\n' && line[len - 2] == '}' && strstr(line, "\"step_time_ms\"") &&
        sscanf(line, "{\"step\":%lld,", &k) == 1 && k > last)
      last = k;
  }
  free(line);
  fclose(f);
  return last;
}


/* ,"grad_bytes":N and, with a compressor, per bucket its ratio and relative error, and the worst
 * telescoping error (tandem/compress.h). */
static void grad_record(tdm_engine *e, char *out, size_t cap) {
  int64_t stale[64];
  uint64_t pushed = 0, pulled = 0;
  int S = tdm_ps_worker_step_stats(e, stale, 64, &pushed, &pulled);
  if (S > 0) { /* a parameter server's worker: its pushes' staleness per server, and its bytes */
    size_t at = (size_t)snprintf(out, cap, ",\"ps_bytes_pushed\":%llu,\"ps_bytes_pulled\":%llu,\"ps_staleness\":[",
                                 (unsigned long long)pushed, (unsigned long long)pulled);
    for (int s = 0; s < S && s < 64 && at < cap; s++) at += (size_t)snprintf(out + at, cap - at, "%s%lld", s ? "," : "", (long long)stale[s]);
    if (at < cap) snprintf(out + at, cap - at, "]");
    return;
  }
  const tdm_compress_stats *cs;
  uint64_t bytes = 0;
  int n = tdm_engine_compress_stats(e, &cs, &bytes);
  size_t at = (size_t)snprintf(out, cap, ",\"grad_bytes\":%llu", (unsigned long long)bytes);
  if (n <= 0 || at >= cap) return;
  double tel = 0;
  unsigned long long payload = 0;
  for (int k = 0; k < n; k++) tel = cs[k].telescope_err > tel ? cs[k].telescope_err : tel, payload += cs[k].payload_bytes;
  at += (size_t)snprintf(out + at, cap - at, ",\"compress_payload_bytes\":%llu,\"compress_telescope_err\":%.3g,\"compress_ratio\":[",
                         payload, tel);
  for (int k = 0; k < n && at < cap; k++) at += (size_t)snprintf(out + at, cap - at, "%s%.4g", k ? "," : "", cs[k].ratio);
  if (at < cap) at += (size_t)snprintf(out + at, cap - at, "],\"compress_rel_err\":[");
  for (int k = 0; k < n && at < cap; k++) at += (size_t)snprintf(out + at, cap - at, "%s%.4g", k ? "," : "", cs[k].rel_err);
  if (at < cap) at += (size_t)snprintf(out + at, cap - at, "]");
  if (at >= cap) snprintf(out, cap, ",\"grad_bytes\":%llu", (unsigned long long)bytes); /* too many buckets: bytes only */
}

/* ,"rank_step_ms":[...] ... and the slowest rank: each rank's times as the all-reduce gathered
 * them (a world of at most RANK_TIMES ranks; nothing otherwise). */
static void rank_times(const step_record *r, char *out, size_t cap) {
  int W = (r->n_stats - 4) / 5;
  if (W < 1) return;
  static const char *const names[5] = {"step", "forward", "backward", "comm_wait", "optimizer"};
  size_t at = 0;
  int slow = 0;
  for (int q = 0; q < 5 && at < cap; q++) {
    at += (size_t)snprintf(out + at, cap - at, ",\"rank_%s_ms\":[", names[q]);
    for (int k = 0; k < W && at < cap; k++) at += (size_t)snprintf(out + at, cap - at, "%s%.3f", k ? "," : "", r->stats[4 + 5 * k + q] * 1e3);
    if (at < cap) at += (size_t)snprintf(out + at, cap - at, "]");
  }
  for (int k = 1; k < W; k++) slow = r->stats[4 + 5 * k] > r->stats[4 + 5 * slow] ? k : slow;
  if (at < cap) snprintf(out + at, cap - at, ",\"slowest_rank\":%d", slow);
  if (at >= cap) out[0] = 0;
}

static tdm_status flush_record(run_state *s, step_record *r, progress *pr, const tdm_train_config *c) {
  if (!r->pending) return TDM_OK;
  r->pending = 0;
  if (r->work) {
    double t0 = tdm_time_now();
    TDM__TRY(tdm_work_wait(r->work));
    r->work = NULL;
    r->t_wait += tdm_time_now() - t0;
  }
  double loss = r->stats[0], acc = r->stats[2] > 0 ? r->stats[1] / r->stats[2] : 0;
  s->last_loss = loss;
  if (r->stats[3] > 0) s->stop = 1;
  char tok[128] = "", jl[400], jg[400];
  if (s->tokens_per_sample) snprintf(tok, sizeof tok, ",\"tokens_per_sec\":%.1f", r->samples * (double)s->tokens_per_sample / r->dt);
  if (r->loss_scale > 0) /* fp16: the scale's trajectory, and which steps were skipped */
    snprintf(tok + strlen(tok), sizeof tok - strlen(tok), ",\"loss_scale\":%.9g,\"skipped\":%d", r->loss_scale, r->skipped);
  int R = s->comm ? tdm_comm_rank(s->comm) : 0, W = s->comm ? tdm_comm_size(s->comm) : 1;
  char ranks[5 * RANK_TIMES * 16 + 200] = "";
  if (s->metrics) rank_times(r, ranks, sizeof ranks);
  if (s->metrics && r->step > s->recorded)
    fprintf(s->metrics,
            "{\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"grad_norm\":%s,\"samples_per_sec\":%.1f,\"step_time_ms\":%.4f,"
            "\"time_forward_ms\":%.4f,\"time_backward_ms\":%.4f,\"time_comm_wait_ms\":%.4f,\"time_optimizer_ms\":%.4f,"
            "\"lr\":%g,\"rank\":%d,\"world_size\":%d,\"global_batch\":%lld,\"train_accuracy\":%.4f%s%s%s}\n",
            (long long)r->step, (long long)r->epoch, json_num(jl, sizeof jl, "%.6f", loss),
            json_num(jg, sizeof jg, "%.6g", r->grad_norm), r->samples / r->dt, r->dt * 1e3, r->t_fwd * 1e3, r->t_bwd * 1e3,
            r->t_wait * 1e3, r->t_opt * 1e3, r->lr, R, W, (long long)r->G, acc, tok, r->grad, ranks);
  if (s->metrics && ferror(s->metrics)) TDM__TRY(metrics_ok(s, c));
  double now = tdm_time_now();
  int last = r->step + 1 == r->total;
  pr->comm_s += r->t_wait, pr->step_s += r->dt;
  double share = pr->step_s > 0 ? pr->comm_s / pr->step_s : 0;
  tdm__status_publish(&(tdm__status){R, W, r->step + 1, r->total, loss, (double)r->samples_so_far / r->train_time, r->dt * 1e3,
                                     r->t_fwd * 1e3, r->t_bwd * 1e3, r->t_wait * 1e3, r->t_opt * 1e3, share}, last);
  int due = pr->tty ? (now - pr->last > 0.2) : ((r->step + 1) % (r->total / 10 > 0 ? r->total / 10 : 1) == 0);
  if (pr->f && (due || last)) {
    char eta[32];
    double sps = (double)r->samples_so_far / r->train_time;
    fmt_eta(eta, sizeof eta, (double)(r->total - r->step - 1) * (double)r->G / sps);
    fprintf(pr->f, "%sepoch %lld step %lld/%lld  loss %.4f  acc %.3f  %.0f samples/s  comm %.0f%%  ETA %s%s", pr->tty ? "\r" : "",
            (long long)r->epoch + 1, (long long)r->step + 1, (long long)r->total, loss, acc, sps, 100 * share, eta,
            pr->tty ? "   " : "\n");
    fflush(pr->f);
    pr->last = now;
  }
  char where[64] = "";
  if (W > 1) snprintf(where, sizeof where, " (the mean over %d ranks)", W);
  if (r->skipped) return TDM_OK; /* fp16 skipped the step: nothing was applied, and the scale went down */
  return finite_or_stop(c, loss, r->step, "the loss", where);
}

/* --last-batch auto on resume: the checkpoint's rule, where this layout can follow it */
static int adopt_last(void *sampler, const char *v) {
  tdm_last_batch r = !strcmp(v, "partial") ? TDM_LAST_PARTIAL : !strcmp(v, "pad") ? TDM_LAST_PAD : TDM_LAST_DROP;
  return r != TDM_LAST_DROP && tdm_sampler_set_last(sampler, r) == TDM_OK;
}

/* What the training set holds: a checksum of 64 samples spread evenly over it, first and last among
 * them (a data file replaced by another of the same size resumed silently: only the count was
 * compared). 0 when a sample cannot be read (the run reads them again and says why). */
static uint32_t data_fingerprint(const tdm_dataset *ds) {
  int64_t N = tdm_dataset_len(ds), per = tdm_dataset_sample_numel(ds), k = N < 64 ? N : 64;
  int tokens = tdm_dataset_is_tokens(ds);
  size_t xb = (size_t)per * (tokens ? sizeof(int32_t) : sizeof(float)), yb = sizeof(int32_t) * (size_t)(tokens ? per : 1);
  void *x = tdm__malloc(xb);
  int32_t *y = tdm__malloc(yb);
  uint32_t crc = 0x7a6e6473u;
  for (int64_t i = 0; x && y && i < k; i++) {
    int64_t idx = k > 1 ? i * (N - 1) / (k - 1) : 0;
    tdm_status st = tokens ? tdm_dataset_tokens(ds, &idx, 1, x, y) : tdm_dataset_batch(ds, &idx, 1, x, y);
    if (st != TDM_OK) {
      crc = 0;
      break;
    }
    crc = tdm__crc32(tdm__crc32(crc, x, (int64_t)xb), y, (int64_t)yb);
  }
  if (!x || !y) crc = 0;
  tdm__free(x);
  tdm__free(y);
  return crc;
}

/* What a checkpoint of this run records and a resumed run must share (see tandem/train.h). The
 * model and its architecture come first: they are also the weights file's metadata (returns
 * their count); the seed, a key of the checkpoint's own, comes last. */
static int run_identity(tdm__run_identity *id, const tdm_train_config *c, const tdm_model_config *mc, int64_t G, int64_t T,
                        int64_t N, tdm_last_batch last, tdm_sampler *sampler, const tdm_dataset *train) {
  int gpt = mc->kind == TDM_MODEL_GPT;
  tdm__identity_add(id, "tandem.model", "model", NULL, "%s", c->model);
  if (mc->kind == TDM_MODEL_LLAMA) { /* Hugging Face's config.json names */
    const tdm_rope_config *r = &mc->rope;
    tdm__identity_add(id, "architectures", "architecture", NULL, "LlamaForCausalLM");
    tdm__identity_add(id, "num_hidden_layers", "layers", NULL, "%lld", (long long)mc->n_layer);
    tdm__identity_add(id, "num_attention_heads", "heads", NULL, "%lld", (long long)mc->n_head);
    tdm__identity_add(id, "num_key_value_heads", "key/value heads", NULL, "%lld", (long long)mc->n_kv_head);
    tdm__identity_add(id, "hidden_size", "width", NULL, "%lld", (long long)mc->n_embd);
    tdm__identity_add(id, "intermediate_size", "SwiGLU width", NULL, "%lld", (long long)mc->ffn_hidden);
    tdm__identity_add(id, "max_position_embeddings", "block size", NULL, "%lld", (long long)mc->block_size);
    tdm__identity_add(id, "vocab_size", "vocab_size", NULL, "%lld", (long long)mc->vocab_size);
    tdm__identity_add(id, "rope_theta", "rope theta", NULL, "%.9g", (double)r->theta);
    if (r->factor > 0)
      tdm__identity_add(id, "rope_scaling", "rope scaling", NULL, "llama3,%.9g,%.9g,%.9g,%lld", (double)r->factor,
                        (double)r->low_freq_factor, (double)r->high_freq_factor, (long long)r->original_max_pos);
    else
      tdm__identity_add(id, "rope_scaling", "rope scaling", NULL, "none");
    tdm__identity_add(id, "rms_norm_eps", "RMSNorm eps", NULL, "%.9g", (double)mc->norm_eps);
    tdm__identity_add(id, "tie_word_embeddings", "tied head", NULL, "%s", mc->tie_embeddings ? "true" : "false");
  }
  if (gpt) {
    tdm__identity_add(id, "n_layer", "n_layer", NULL, "%lld", (long long)mc->n_layer);
    tdm__identity_add(id, "n_head", "n_head", NULL, "%lld", (long long)mc->n_head);
    tdm__identity_add(id, "n_embd", "n_embd", NULL, "%lld", (long long)mc->n_embd);
    tdm__identity_add(id, "block_size", "block_size", NULL, "%lld", (long long)mc->block_size);
    tdm__identity_add(id, "vocab_size", "vocab_size", NULL, "%lld", (long long)mc->vocab_size);
  }
  if (mc->kind == TDM_MODEL_RESNET) {
    tdm__identity_add(id, "n_stages", "n_stages", NULL, "%d", mc->n_stages);
    tdm__identity_add(id, "stage_blocks", "stage_blocks", NULL, "%lld,%lld,%lld,%lld", (long long)mc->stage_blocks[0],
                      (long long)mc->stage_blocks[1], (long long)mc->stage_blocks[2], (long long)mc->stage_blocks[3]);
    tdm__identity_add(id, "base_width", "base_width", NULL, "%lld", (long long)mc->base_width);
  }
  int n_arch = id->n;
  tdm__identity_add(id, "tandem.optimizer", "optimizer", NULL, "%s", c->optimizer);
  tdm__identity_add(id, "tandem.global_batch", "global batch (ranks x batch size x accumulation)", "batch", "%lld", (long long)G);
  if (is_lm(mc->kind)) tdm__identity_add(id, "tandem.seq_len", "sequence length", "batch", "%lld", (long long)T);
  tdm__identity_add(id, "tandem.data", "data set", "data", "%s", c->data);
  tdm__identity_add(id, "tandem.train_samples", "training samples", "data", "%lld", (long long)N);
  tdm__identity_add(id, "tandem.data_sum", "training data (a checksum of 64 samples)", "data", "%08x", data_fingerprint(train));
  tdm__identity_newer(id);
  /* with a remainder the rule decides which samples the epoch's last step sees, and --last-batch
     auto resolves by the layout: a resume from one process onto several ranks would change it */
  static const char *const rules[] = {"partial", "pad", "drop"};
  if (N % G) {
    tdm__identity_add(id, "tandem.last_batch", "last batch (--last-batch; auto is partial on one process, pad on several ranks "
                      "or with accumulation)", "batch", "%s", rules[last]);
    tdm__identity_newer(id);
    if (sampler && (!c->last_batch || !strcmp(c->last_batch, "auto"))) tdm__identity_adopt(id, adopt_last, sampler);
  }
  tdm__identity_add(id, "tandem.seed", "seed", "seed", "%llu", (unsigned long long)c->seed);
  return n_arch;
}

/* An evaluation's record; a non-finite loss (the same on every rank: all-reduced) stops the run. */
static tdm_status eval_record(run_state *s, const tdm_train_config *c, int gpt, int64_t epoch, int64_t step, double loss,
                              double acc) {
  char jl[400];
  int W = s->comm ? tdm_comm_size(s->comm) : 1, again = step - 1 <= s->recorded; /* an earlier attempt recorded it */
  if (s->metrics && gpt && !again)
    fprintf(s->metrics, "{\"step\":%lld,\"val_loss\":%s,\"val_accuracy\":%.6f,\"world_size\":%d}\n", (long long)step,
            json_num(jl, sizeof jl, "%.6f", loss), acc, W);
  else if (s->metrics && !again)
    fprintf(s->metrics, "{\"epoch\":%lld,\"step\":%lld,\"test_loss\":%s,\"test_accuracy\":%.6f,\"world_size\":%d}\n",
            (long long)epoch, (long long)step, json_num(jl, sizeof jl, "%.6f", loss), acc, W);
  TDM__TRY(metrics_ok(s, c));
  return finite_or_stop(c, loss, step - 1, gpt ? "the validation loss after it" : "the test loss after it", "");
}

/* The engine asks for micro-batches: this rank's slices of the global batch (tandem/sampler.h). */
typedef struct {
  tdm_sampler *sampler;
  const tdm_model_config *mc;
  int64_t per; /* features, or tokens, per sample */
  int crop_pad, flip;
  uint64_t seed;
} batch_src;

static tdm_status next_batch(void *ctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  (void)micro;
  batch_src *b = ctx;
  const float *bx;
  const int32_t *by;
  int64_t n, epoch = tdm_sampler_epoch(b->sampler);
  TDM__TRY(tdm_sampler_next(b->sampler, &bx, &by, &n, base));
  int64_t xs[4], ys[2] = {n, b->per};
  int nd = input_shape(b->mc, n, b->per, xs), tokens = is_lm(b->mc->kind);
  *x = tdm_from_data(tp, tokens ? TDM_I32 : TDM_F32, nd, xs, bx);
  *y = tdm_from_data(tp, TDM_I32, tokens ? 2 : 1, ys, by);
  if (*x && (b->crop_pad > 0 || b->flip) && nd == 4) { /* keyed by the sample's position: N ranks == 1 process */
    tdm_tensor *scratch = tdm_new(tp, TDM_F32, 3, xs + 1);
    if (scratch)
      TDM__TRY(tdm_augment_images(tdm_tensor_data(*x), n, xs[1], xs[2], xs[3], b->crop_pad, b->flip, b->seed, epoch, *base,
                                  tdm_tensor_data(scratch)));
  }
  return *x && *y ? TDM_OK : tdm__set_error(tdm_tape_status(tp), "%s", tdm_tape_error(tp));
}

/* The memory measured so far, as a JSON object of peaks per category and in total. */
static void mem_json(char *b, size_t n) {
  tdm_mem_stats m;
  tdm_mem_stats_get(&m);
  size_t at = (size_t)snprintf(b, n, "{");
  for (int k = 0; k < TDM_MEM_COUNT && at < n; k++)
    at += (size_t)snprintf(b + at, n - at, "\"%s\":%lld,", tdm_mem_category_name((tdm_mem_category)k), (long long)m.peak[k]);
  if (at < n) snprintf(b + at, n - at, "\"total\":%lld}", (long long)m.peak_total);
}

/* What a run is, before anything large exists: the data sets opened, the model's and optimizer's
 * configurations, the sampler, and the memory plan. Shared by tdm_train_run and tdm_train_plan. */
typedef struct {
  tdm_model_kind mk;
  tdm_model_config mc;
  tdm_optim_config oc;
  tdm_engine_config ec;
  int64_t T, K, N, B, per, eb, G;
  int prefetch;
  tdm_last_batch last; /* the last batch's rule as resolved (auto: partial on one process, else pad) */
  tdm_plan plan;
  tdm_plan_config pcfg; /* what the plan was computed from (tandem simulate reads it) */
} prepared;

/* W ranks in all, D of them on the data axis and this one the R-th (the stages of a pipeline draw
 * the same batches); P pipeline stages. */
/* The grid's sizes from --dp, --tp and --pp against the world (dp 0: what is left), before any
 * connection; the tensor and pipeline axes with the engines that run on them. */
static tdm_status grid_of(const tdm_train_config *c, int W, int *D, int *TP, int *P) {
  if (c->tp < 0 || c->tp > 1024 || c->pp < 1 || c->dp < 0 || c->dp > W)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --dp %lld --tp %lld --pp %lld; expected dp 0..%d (0: what is left), tp "
                          "1..1024, pp >= 1", (long long)c->dp, (long long)c->tp, (long long)c->pp, W);
  *TP = c->tp > 1 ? (int)c->tp : 1, *P = (int)c->pp;
  if (*P > 1 && c->engine.kind != TDM_ENGINE_PIPELINE)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: %lld pipeline stages with the %s engine; expected 1, or the pipeline engine",
                          (long long)c->pp, tdm_engine_kind_name(c->engine.kind));
  if (*TP > 1 && c->engine.kind != TDM_ENGINE_TP && c->engine.kind != TDM_ENGINE_PIPELINE) /* the pipeline's: the 3-D grid */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: %d tensor-parallel ranks with the %s engine; expected 1, or the tp or pipeline engine",
                          *TP, tdm_engine_kind_name(c->engine.kind));
  int64_t rest = (int64_t)*TP * *P;
  if ((c->dp > 0 && c->dp * rest != W) || (c->dp == 0 && W % rest != 0)) {
    char tp[32] = "";
    if (*TP > 1) snprintf(tp, sizeof tp, " x --tp %d", *TP);
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "train: the process grid does not make the world: --dp %lld%s x --pp %d%s, but %d rank%s run%s "
                          "(give --dp x --tp x --pp = the ranks of tandem run -n)",
                          (long long)c->dp, tp, *P, c->dp == 0 ? " (dp: what is left)" : "", W, W == 1 ? "" : "s", W == 1 ? "s" : "");
  }
  *D = c->dp > 0 ? (int)c->dp : (int)(W / rest);
  return TDM_OK;
}

static tdm_status prepare(const tdm_train_config *c, int W, int D, int R, int P, tdm_transport_kind transport, run_state *s,
                          prepared *p) {
  tdm_optim_kind ok = TDM_OPT_ADAM;
  TDM__TRY(parse_kinds(c, &p->mk, &ok));
  tdm_model_kind mk = p->mk;
  tdm_model_config mc = mk == TDM_MODEL_MLP ? tdm_model_config_mlp() : mk == TDM_MODEL_CNN ? tdm_model_config_cnn() : tdm_model_config_gpt_mini();
  if (mk == TDM_MODEL_LLAMA) {
    const char *name = !c->gpt_config || !strcmp(c->gpt_config, "mini") ? "llama-mini" : c->gpt_config;
    if (tdm_model_config_llama(name, &mc) != TDM_OK)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --config '%s' with --model llama; expected llama-mini or llama3.2-1B", name);
    int64_t given[7] = {c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->ffn_hidden, c->block_size, c->vocab_size};
    int64_t *field[7] = {&mc.n_layer, &mc.n_head, &mc.n_kv_head, &mc.n_embd, &mc.ffn_hidden, &mc.block_size, &mc.vocab_size};
    for (int i = 0; i < 7; i++)
      if (given[i] > 0) *field[i] = given[i];
    if (c->rope_theta > 0) mc.rope.theta = (float)c->rope_theta;
    if (c->rope_scaling == 0) mc.rope.factor = 0;
    if (c->rope_scaling == 1) mc.rope.factor = 32.0f, mc.rope.low_freq_factor = 1.0f, mc.rope.high_freq_factor = 4.0f, mc.rope.original_max_pos = 8192;
    if (c->tie_embeddings >= 0) mc.tie_embeddings = c->tie_embeddings;
    mc.dropout = (float)c->dropout;
    if (mc.vocab_size < 256)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "train: vocabulary %lld is smaller than the 256 byte tokens of the text",
                            (long long)mc.vocab_size);
  }
  if (mk == TDM_MODEL_GPT) {
    int64_t given[5] = {c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size};
    if (tdm_model_config_gpt(c->gpt_config, given, &mc) != TDM_OK)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --config '%s' with --model gpt; expected mini or gpt2-124M", c->gpt_config);
    mc.dropout = (float)c->dropout;
    if (mc.vocab_size < 256)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "train: vocabulary %lld is smaller than the 256 byte tokens of the text",
                            (long long)mc.vocab_size);
  }
  if (mk == TDM_MODEL_RESNET) /* --config and --width name the architecture; the data set gives the rest */
    TDM__TRY(tdm_model_config_resnet(c->gpt_config && strcmp(c->gpt_config, "mini") ? c->gpt_config : "resnet20", c->n_embd, &mc));
  int64_t T = c->seq_len > 0 ? c->seq_len : mc.block_size;
  if (is_lm(mk) && (T < 1 || T > mc.block_size))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --seq-len %lld; expected 1..block size %lld", (long long)T,
                          (long long)mc.block_size);
  tdm_mem_category scope = tdm__mem_scope(TDM_MEM_DATA); /* the data sets and the sampler's batches */
  tdm_status st = TDM_OK;
  if (is_lm(mk)) { /* the first 90% of the text trains, the rest validates */
    const char *path = c->data_path ? c->data_path : "data/tinyshakespeare.txt";
    st = tdm_dataset_open_text_part(&s->train, path, T, 0.0, 0.9);
    if (st == TDM_OK) st = tdm_dataset_open_text_part(&s->test, path, T, 0.9, 1.0);
  } else if (!strcmp(c->data, "synthetic")) { /* Fashion-MNIST's shape and sizes, generated */
    int64_t shp[3] = {1, 28, 28};
    st = tdm_dataset_open_synthetic(&s->train, 60000, 3, shp, 10, 0x5eed, 0);
    if (st == TDM_OK) st = tdm_dataset_open_synthetic(&s->test, 10000, 3, shp, 10, 0x5eed, 1ull << 40);
  } else if (!strcmp(c->data, "cifar-bin")) { /* CIFAR-10's binary batches in --data-dir */
    st = tdm_dataset_open_cifar(&s->train, c->data_dir, 1, 3, 32, 32, 10);
    if (st == TDM_OK) st = tdm_dataset_open_cifar(&s->test, c->data_dir, 0, 3, 32, 32, 10);
  } else {
    st = tdm_dataset_open_idx(&s->train, c->data_dir, 1);
    if (st == TDM_OK) st = tdm_dataset_open_idx(&s->test, c->data_dir, 0);
  }
  tdm__mem_scope(scope);
  TDM__TRY(st);
  int64_t shape[4], tshape[4];
  int nd = tdm_dataset_sample_shape(s->train, shape), tnd = tdm_dataset_sample_shape(s->test, tshape);
  if (!is_lm(mk) && (nd != tnd || memcmp(shape, tshape, sizeof(int64_t) * (size_t)nd) != 0))
    return tdm__set_error(TDM_ERR_MISMATCH, "%s: training samples are %lldx%lld but test samples are %lldx%lld",
                          c->data_dir, (long long)shape[1], (long long)shape[2], (long long)tshape[1], (long long)tshape[2]);
  if (!is_lm(mk)) mc.dropout = (float)c->dropout;
  mc.n_classes = tdm_dataset_num_classes(s->train);
  int64_t test_classes = tdm_dataset_num_classes(s->test);
  if (!is_lm(mk) && test_classes > mc.n_classes) /* the evaluation would meet a target the model has no output for */
    return tdm__set_error(TDM_ERR_MISMATCH, "%s: the test labels go up to %lld but the training labels only to %lld (the model's classes); "
                          "expected test labels among the training set's classes",
                          c->data_dir, (long long)test_classes - 1, (long long)mc.n_classes - 1);
  if (!is_lm(mk) && test_classes < mc.n_classes && R == 0)
    tdm_log(TDM_LOG_WARN, "%s: the training labels go up to %lld, the test labels to %lld: the model gets %lld outputs (a "
            "training label out of place?)", c->data_dir, (long long)mc.n_classes - 1, (long long)test_classes - 1,
            (long long)mc.n_classes);
  if (mk == TDM_MODEL_MLP) {
    mc.in_features = tdm_dataset_sample_numel(s->train);
  } else if (mk == TDM_MODEL_CNN || mk == TDM_MODEL_RESNET) {
    mc.in_channels = shape[0];
    mc.height = shape[1];
    mc.width = shape[2];
  }
  tdm_optim_config oc = tdm_optim_config_default(ok);
  oc.lr = (float)c->lr;
  if (c->weight_decay >= 0) oc.weight_decay = (float)c->weight_decay;
  oc.momentum = (float)c->momentum;
  oc.decay_matrices_only = c->decay_matrices_only || mk == TDM_MODEL_RESNET; /* never BN, biases or running statistics */
  oc.nesterov = c->nesterov;
  tdm_engine_config ec = c->engine;
  ec.allow_nonfinite = c->allow_nonfinite;
  if (is_lm(mk)) ec.pp.seq_len = T; /* a pipeline's cut balanced for the sequences it will see */
  if (c->label_smoothing > 0 && (is_lm(mk) || !(c->label_smoothing < 1)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --label-smoothing %g with model %s; expected 0 <= eps < 1, for the image classifiers",
                          c->label_smoothing, c->model);
  ec.label_smoothing = (float)c->label_smoothing;
  int64_t K = ec.accum > 1 ? ec.accum : 1;
  int64_t N = tdm_dataset_len(s->train), B = c->batch_size;
  tdm_last_batch last = TDM_LAST_PARTIAL; /* one process: keep the smaller last batch, as DataLoader */
  if (c->last_batch && !strcmp(c->last_batch, "drop")) last = TDM_LAST_DROP;
  else if ((c->last_batch && !strcmp(c->last_batch, "pad")) || D > 1 || K > 1) last = TDM_LAST_PAD;
  if (c->last_batch && !strcmp(c->last_batch, "partial") && (D > 1 || K > 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --last-batch partial needs one data-parallel rank and no accumulation (%d ranks, accum %lld)",
                          D, (long long)K);
  int prefetch = c->prefetch;
  if (prefetch < 0) prefetch = tdm_spare_core(W); /* auto: only beside compute, never instead of it */
  tdm_sampler_config sc = {B, K, D, R, c->seed, last, prefetch};
  int64_t eb = c->eval_batch > B ? c->eval_batch : B;
  scope = tdm__mem_scope(TDM_MEM_DATA);
  st = tdm_sampler_create(&s->sampler, s->train, &sc);
  if (st == TDM_OK && !(s->idx = tdm__malloc(sizeof(int64_t) * (size_t)eb)))
    st = tdm__set_error(TDM_ERR_NO_MEMORY, "train: out of memory");
  tdm__mem_scope(scope);
  TDM__TRY(st);
  if (last == TDM_LAST_PAD && N < B * W * K && R == 0 && c->progress) /* legal, but rarely what was meant */
    fprintf(c->progress,
            "warning: %lld training samples do not fill one global batch of %lld (%d ranks x accum %lld x batch %lld): "
            "every step is an epoch and %lld samples are repeated within it (--last-batch drop refuses this)\n",
            (long long)N, (long long)(B * W * K), W, (long long)K, (long long)B, (long long)(B * W * K - N));
  memset(p, 0, sizeof *p);
  p->mk = mk, p->mc = mc, p->oc = oc, p->ec = ec, p->T = T, p->K = K, p->N = N, p->B = B, p->eb = eb, p->G = B * D * K, p->last = last;
  p->per = tdm_dataset_sample_numel(s->train), p->prefetch = prefetch;
  /* the plan, before anything large exists */
  tdm_plan_config pcfg = {mc, oc, ec, D, B, T, is_lm(mk) ? B : eb, 0, prefetch, transport, W / (D * P), P};
  tdm_mem_stats ms;
  tdm_mem_stats_get(&ms);
  pcfg.data_bytes = ms.current[TDM_MEM_DATA]; /* the data sets as opened, and their batches */
  p->pcfg = pcfg;
  return tdm_plan_compute(&pcfg, &p->plan);
}

static tdm_status train_plan(const tdm_train_config *c, int world, tdm_plan *out, tdm_plan_config *cfg_out);
tdm_status tdm_train_plan(const tdm_train_config *c, int world, tdm_plan *out) { return train_plan(c, world, out, NULL); }
tdm_status tdm_train_plan_config(const tdm_train_config *c, int world, tdm_plan *plan, tdm_plan_config *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "train_plan_config: NULL argument");
  return train_plan(c, world, plan, out);
}

static tdm_status train_plan(const tdm_train_config *c, int world, tdm_plan *out, tdm_plan_config *cfg_out) {
  if (!c || !out || world < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "train_plan: NULL argument or world %d", world);
  run_state s = {0};
  s.start.lock_fd = -1;
  prepared p;
  tdm_comm_config cc; /* the transport the ranks will use: TANDEM_TRANSPORT, else shm on one node */
  tdm_status st = tdm_comm_config_from_env(&cc);
  tdm_transport_kind tr = cc.transport == TDM_TRANSPORT_AUTO ? TDM_TRANSPORT_SHM : cc.transport;
  int D = 0, TP = 1, P = 1;
  if (st == TDM_OK) st = grid_of(c, world, &D, &TP, &P);
  if (st == TDM_OK) st = prepare(c, world, D, 0, P, world > 1 ? tr : TDM_TRANSPORT_AUTO, &s, &p);
  if (st == TDM_OK) st = tdm_engine_check(&p.mc, &p.ec, world, D, TP, P);
  if (st == TDM_OK) *out = p.plan;
  if (st == TDM_OK && cfg_out) *cfg_out = p.pcfg;
  run_free(&s);
  return st;
}

/* A parameter server (tandem/engine.h): the last S ranks serve, the others train on a
 * communicator of their own; *W becomes the number of workers. */
static tdm_status ps_roles(const tdm_train_config *c, run_state *s, int *W, int R) {
  int P = *W, S = c->engine.ps.servers;
  if (S < 1 || S >= P)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --ps-servers %d with %d rank%s; expected 1..%d, so that at least one "
                          "rank trains (tandem run -n N gives N-S workers and S servers)", S, P, P == 1 ? "" : "s", P - 1);
  if (c->init_weights)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "train: --init-weights with a parameter server is not built yet (the "
                          "servers start from the seed's values; a checkpoint of any layout resumes with --resume)");
  s->ps_world = s->comm;
  s->comm = NULL;
  int server = R >= P - S;
  tdm_comm_t sub = NULL;
  TDM__TRY(tdm_comm_split(s->ps_world, server, R, &sub));
  if (server || P - S == 1) tdm_comm_destroy(sub); /* one worker trains alone; servers need none */
  else s->comm = s->ps_workers = sub;
  *W = P - S;
  return TDM_OK;
}

/* A parameter server's async and ssp workers meet at the servers before a collective (an
 * evaluation, the saving): when some were lost on the way, the survivors go on with a
 * communicator and grid of their own (a lost worker answers no collective). The list comes from
 * server 0, the same for every survivor. */
static tdm_status ps_survivors(run_state *s, const tdm_train_config *c, progress *pr, tdm_train_result *res) {
  if (!s->ps_world || c->engine.ps.mode == TDM_PS_SYNC || !s->ps_workers) return TDM_OK;
  int W0 = tdm_comm_size(s->ps_workers), n_lost = 0;
  int *lost = tdm__malloc(sizeof(int) * 2 * (size_t)W0);
  if (!lost) return tdm__set_error(TDM_ERR_NO_MEMORY, "train: out of memory");
  int *keep = lost + W0;
  tdm_status st = tdm_ps_workers_meet(s->engine, &n_lost, lost, W0);
  if (st != TDM_OK || n_lost <= s->ps_lost) {
    tdm__free(lost);
    return st;
  }
  int n = 0;
  char names[256] = "";
  size_t k = 0;
  for (int r = 0; r < W0; r++) {
    int gone = 0;
    for (int i = 0; i < n_lost; i++) gone |= lost[i] == r;
    if (!gone) keep[n++] = r;
    else if (k < sizeof names) k += (size_t)snprintf(names + k, sizeof names - k, "%s%d", k ? ", " : "", r);
  }
  tdm_comm_t sub = NULL;
  tdm_grid *g = NULL;
  st = tdm_comm_subset(s->ps_workers, keep, n, &sub);
  if (st == TDM_OK && n == 1) tdm_comm_destroy(sub), sub = NULL; /* one survivor trains alone */
  if (st == TDM_OK) st = tdm_grid_create(&g, sub, n, 1, 1);
  if (st == TDM_OK) st = tdm_ps_workers_regrid(s->engine, g);
  if (st != TDM_OK) {
    tdm_grid_destroy(g);
    tdm_comm_destroy(sub);
    tdm__free(lost);
    return st;
  }
  tdm_grid_destroy(s->grid);
  if (s->comm != s->ps_workers) tdm_comm_destroy(s->comm);
  s->grid = g, s->comm = sub, s->ps_lost = n_lost;
  int me = sub ? tdm_comm_rank(sub) : 0;
  pr->f = me == 0 ? c->progress : NULL; /* the first survivor reports */
  res->rank = me, res->world_size = n;
  if (pr->f)
    fprintf(pr->f, "%standem train: worker%s %s lost (named by the servers); %d worker%s go%s on without %s\n",
            pr->tty ? "\n" : "", n_lost == 1 ? "" : "s", names, n, n == 1 ? "" : "s", n == 1 ? "es" : "", n_lost == 1 ? "it" : "them");
  tdm__free(lost);
  return TDM_OK;
}

/* A server rank: the model's configuration as the workers have it, then serve until they finish;
 * its report (a JSON line) goes to the progress stream and, with --metrics, to METRICS.psK. */
static tdm_status ps_server_rank(const tdm_train_config *c, tdm_train_result *res, run_state *s, int W, int R) {
  prepared pp;
  TDM__TRY(prepare(c, W, W, 0, 1, tdm_comm_transport(s->ps_world), s, &pp));
  tdm_engine_ps_config pc = c->engine.ps;
  pc.world = s->ps_world;
  pc.notes = c->progress;
  pc.ckpt_dir = c->checkpoint_dir;
  tdm_ps_server_stats st;
  tdm_status r = tdm_ps_serve(&pp.mc, c->seed, &pp.oc, &pc, &st);
  char js[640];
  tdm_ps_stats_json(&st, js, sizeof js);
  if (c->progress) fprintf(c->progress, "%s\n", js);
  if (c->metrics) {
    char path[4096];
    snprintf(path, sizeof path, "%s.ps%d", c->metrics, st.server);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%s\n", js) < 0 || fclose(f) != 0) {
      if (r == TDM_OK) r = tdm__set_error(TDM_ERR_IO, "train: writing the server's report to %s failed: %s", path, strerror(errno));
    }
  }
  res->world_size = W;
  res->rank = R;
  res->steps = st.updates;
  return r;
}

/* tandem ps-replay: the model and optimizer these options describe, the logs replayed on them. */
static tdm_status ps_replay_run(const tdm_train_config *c, tdm_train_result *res, run_state *s) {
  prepared pp;
  TDM__TRY(prepare(c, 1, 1, 0, 1, TDM_TRANSPORT_AUTO, s, &pp));
  tdm__run_identity id = {0};
  int n_arch_meta = run_identity(&id, c, &pp.mc, pp.G, pp.T, pp.N, pp.last, NULL, s->train);
  const char *meta[2 + 2 * TDM__IDENTITY_MAX] = {"format", "pt"};
  memcpy(meta + 2, id.kv, sizeof(char *) * 2 * (size_t)n_arch_meta);
  tdm_ps_replay_stats rs;
  TDM__TRY(tdm_ps_replay(c->ps_replay, &pp.mc, c->seed, &pp.oc, c->ps_replay_until, c->save_weights, 1 + n_arch_meta, meta,
                         &rs));
  for (int k = 0; k < rs.servers; k++) res->steps += rs.updates[k];
  if (c->progress)
    for (int k = 0; k < rs.servers; k++)
      fprintf(c->progress, "ps-replay: server %d: %lld updates replayed\n", k, (long long)rs.updates[k]);
  res->world_size = 1;
  return TDM_OK;
}

/* --trace: this rank's clock against rank 0's, at the start (which 0) or the end (1) of the run. */
static tdm_status trace_clock(run_state *s, int which) {
  if (!s->trace) return TDM_OK;
  double off = 0, unc = 0;
  if (s->comm) TDM__TRY(tdm_comm_clock_offset(s->comm, 32, &off, &unc));
  return tdm_trace_set_clock(s->trace, which, tdm_time_now(), off, unc);
}

static void trace_span(const char *cat, const char *name, double t0, int64_t step) {
  tdm_trace_args a = TDM_TRACE_ARGS_INIT;
  a.step = step;
  tdm_trace_span(cat, name, t0, tdm_trace_now(), &a);
}

/* An address-space limit (ulimit -v) below what the run maps is refused before the first product:
 * OpenBLAS retries a failed buffer allocation forever (a step under ulimit -v 300000 hung, and so
 * did exit, joining its threads). The plan, OpenBLAS's buffer per thread (128 MiB) and the program
 * with its libraries (256 MiB). */
static tdm_status address_space_fits(const tdm_plan *plan) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return TDM_OK;
  double mib = 1024.0 * 1024.0, need = (double)plan->total / mib + 128.0 * tdm_get_num_threads() + 256.0;
  if ((double)rl.rlim_cur / mib >= need) return TDM_OK;
  return tdm__set_error(TDM_ERR_NO_MEMORY, "train: the address-space limit (ulimit -v) is %.0f MiB; this run maps about %.0f MiB: the "
                        "plan's %.1f MiB, OpenBLAS's buffers (128 MiB for each of %d threads) and the program (256 MiB). Raise or "
                        "lift the limit (ulimit -v unlimited), or use fewer threads", (double)rl.rlim_cur / mib, need,
                        (double)plan->total / mib, tdm_get_num_threads());
}

static tdm_status run(const tdm_train_config *c, tdm_train_result *res, run_state *s) {
  TDM__TRY(tdm_set_num_threads(c->threads));
  if (c->ps_replay) return ps_replay_run(c, res, s);
  tdm_comm_config cc;
  if (c->comm) cc = *c->comm; /* a rank emulated as a thread */
  else TDM__TRY(tdm_comm_config_from_env(&cc));
  int W = cc.size, R = cc.rank;
  if (c->trace_dir) { /* a directory that cannot be written fails here, before anything runs */
    TDM__TRY(tdm_trace_open(&s->trace, c->trace_dir, R, W));
    tdm_trace_name_thread("training");
  }
  /* the grid before any connection: data x tensor x pipeline must make the world */
  int D = 0, TP = 1, P = 1;
  TDM__TRY(grid_of(c, W, &D, &TP, &P));
  if (W > 1) TDM__TRY(tdm_comm_create(&s->comm, &cc));
  if (s->comm) TDM__TRY(tdm__settings_agree(c, s->comm)); /* before any other collective: one that differs may never be called */
  TDM__TRY(trace_clock(s, 0));
  if (c->engine.kind == TDM_ENGINE_PS) { /* the last ranks serve; the workers, a world of their own, are the data axis */
    TDM__TRY(ps_roles(c, s, &W, R));
    if (R >= W) return ps_server_rank(c, res, s, W, R);
    D = W, TP = 1, P = 1;
  }
  /* data x tensor x pipeline: the world split as asked (--dp, --tp, --pp), before anything else is made */
  TDM__TRY(tdm_grid_create(&s->grid, s->comm, D, TP, P));
  int DR = tdm_grid_index(s->grid, TDM_AXIS_DATA);
  int split_axes = 0; /* axes with communicators of their own, beside the world */
  for (int a = 0; a < TDM_AXIS_COUNT; a++) split_axes |= tdm_grid_size(s->grid, (tdm_grid_axis)a) != 1 && tdm_grid_size(s->grid, (tdm_grid_axis)a) != W;
  res->world_size = W;
  res->rank = R;
  prepared pp;
  TDM__TRY(prepare(c, W, D, DR, P, s->comm ? tdm_comm_transport(s->comm) : TDM_TRANSPORT_AUTO, s, &pp));
  TDM__TRY(tdm_engine_check(&pp.mc, &pp.ec, W, D, TP, P)); /* the layout against the model, before anything is built */
  tdm_model_kind mk = pp.mk;
  tdm_model_config mc = pp.mc;
  int64_t T = pp.T, K = pp.K, N = pp.N, B = pp.B, per = pp.per, eb = pp.eb, G = pp.G;
  tdm_status st;
  FILE *pf = R == 0 ? c->progress : NULL;
  progress pr = {pf, pf ? isatty(fileno(pf)) : 0, 0, 0, 0};
  if (pr.f) tdm_plan_print(pr.f, &pp.plan, c->memory_limit); /* refused here if it does not fit */
  TDM__TRY(tdm_plan_check(&pp.plan, c->memory_limit));
  TDM__TRY(address_space_fits(&pp.plan));
  pp.ec.ps.world = s->ps_world;
  TDM__TRY(tdm_engine_create(&s->engine, &mc, c->seed, &pp.oc, s->grid, &pp.ec));
  tdm_params *params = tdm_model_params(tdm_engine_model(s->engine));
  if (c->sync_bn) tdm_model_set_bn_sync(tdm_engine_model(s->engine), tdm_grid_comm(s->grid, TDM_AXIS_DATA)); /* one rank: no-op */
  if (c->init_weights) {
    TDM__TRY(tdm_engine_load_weights(s->engine, c->init_weights));
    int64_t bad;
    TDM__TRY(tdm_engine_first_nonfinite(s->engine, &bad)); /* else the first step's NaN would be blamed on --lr */
    if (bad >= 0 && !c->allow_nonfinite) {
      const tdm_params *p = tdm_model_params(tdm_engine_model(s->engine));
      int k = 0;
      while (k + 1 < tdm_params_count(p) && tdm_params_offset(p, k + 1) <= bad) k++;
      return tdm__set_error(TDM_ERR_INVALID_ARG, "--init-weights %s: '%s' holds a non-finite value (element %lld); expected finite weights",
                            c->init_weights, tdm_tensor_name(tdm_params_get(p, k)), (long long)(bad - tdm_params_offset(p, k)));
    }
  }
  int64_t steps_per_epoch = tdm_sampler_steps_per_epoch(s->sampler);
  int64_t total = c->steps > 0 ? c->steps : c->epochs * steps_per_epoch;
  s->tokens_per_sample = is_lm(mk) ? T : 0;
  tdm_lr_schedule sched = {c->lr_schedule && !strcmp(c->lr_schedule, "cosine") ? TDM_LR_COSINE
                           : c->lr_schedule && !strcmp(c->lr_schedule, "step") ? TDM_LR_STEP : TDM_LR_CONSTANT,
                           (float)c->lr, c->warmup_steps, total, (float)c->lr / 10, c->lr_step_size, (float)c->lr_gamma};
  if (mk == TDM_MODEL_RESNET && sched.kind == TDM_LR_COSINE) sched.min_lr = 0; /* as CosineAnnealingLR's default */
  if (sched.kind == TDM_LR_STEP && sched.step_size <= 0) sched.step_size = total / 3 > 0 ? total / 3 : 1;
  if (sched.kind == TDM_LR_STEP && !(sched.gamma > 0)) sched.gamma = 0.1f;
  char accum[40] = ""; /* the micro-batches each rank adds up per step */
  if (K > 1) snprintf(accum, sizeof accum, " x %lld micro-batches", (long long)K);
  if (pr.f)
    fprintf(pr.f, "tandem train: %s on %s (%lld train / %lld test samples), %lld parameters, %s lr %g, batch %lld x %d data rank%s%s, %d thread%s per rank, %s%s%s\n",
            c->model, c->data, (long long)N, (long long)tdm_dataset_len(s->test), (long long)tdm_params_numel(params),
            c->optimizer, c->lr, (long long)B, D, D == 1 ? "" : "s", accum, tdm_get_num_threads(),
            tdm_get_num_threads() == 1 ? "" : "s", tdm_engine_describe(s->engine), s->comm ? ", transport " : "",
            s->comm ? tdm_transport_name(tdm_comm_transport(s->comm)) : "");
  tdm__run_identity id = {0};
  int n_arch_meta = run_identity(&id, c, &mc, G, T, N, pp.last, s->sampler, s->train);
  const char *weights_meta[2 + 2 * TDM__IDENTITY_MAX] = {"format", "pt"}; /* the architecture (what generate needs) */
  memcpy(weights_meta + 2, id.kv, sizeof(char *) * 2 * (size_t)n_arch_meta);
  tdm__start_in si = {c, s->comm, R, W, s->engine, &id, pr.f};
  TDM__TRY(tdm__run_start(&si, &s->start));
  s->metrics = s->start.metrics;
  s->start.metrics = NULL;
  s->recorded = s->metrics && s->start.resumed_from >= 0 ? last_recorded_step(c->metrics) : -1;
  if (s->recorded >= s->start.step && pr.f)
    fprintf(pr.f, "tandem train: %s holds steps up to %lld already: the steps redone from the checkpoint are not recorded again\n",
            c->metrics, (long long)s->recorded);
  if (s->start.resumed_from >= 0 && s->ps_world) /* the servers load their shards and moments from the same checkpoint */
    TDM__TRY(tdm_ps_workers_resumed(s->engine, s->start.ckpt_path, s->start.ckpt_crc, s->start.step));
  if (s->start.resumed_from >= 0) { /* the data stream goes on from the checkpoint's sample, whatever batch wrote it */
    int64_t at = s->start.data_offset < N ? s->start.data_offset : N; /* another data set (--resume-override data): its end */
    TDM__TRY(tdm_sampler_set_position(s->sampler, s->start.step, s->start.data_epoch, at));
    if (c->steps <= 0) total = sched.total_steps = tdm_sampler_epoch_start(s->sampler, c->epochs);
  }
  if (s->metrics) { /* who writes the records that follow (tandem report tells runs apart by it) */
    tdm__header_in hi = {c, &id, &pp.plan, W, D, TP, P, B, K, G, total, s->start.step, s->start.resumed_from,
                         tdm_params_numel(params), tdm_get_num_threads(), tdm_engine_describe(s->engine),
                         s->comm ? tdm_transport_name(tdm_comm_transport(s->comm)) : "none"};
    tdm__metrics_header(s->metrics, &hi);
    TDM__TRY(metrics_ok(s, c));
  }
  double train_time = 0;
  int64_t step = s->start.step, samples = 0;
  float loss_v = NAN;
  res->resumed_from = s->start.resumed_from;
  res->samples_per_step = G;
  res->tokens_per_step = G * s->tokens_per_sample;
  int evaluated = 0; /* a run resumed at its end still reports what its weights do */
  if (step >= total && pr.f)
    fprintf(pr.f, "tandem train: the checkpoint is at step %lld; nothing left to train: evaluating it\n", (long long)step);
  int64_t epoch, offset;
  tdm_sampler_locate(s->sampler, step, &epoch, &offset);
  step_record *rec = &s->rec;
  batch_src bs = {s->sampler, &mc, per, c->crop_pad, c->flip, c->seed};
  tdm_mem_peak_reset(); /* the peaks from here on are the training's */
  while (step < total) {
    TDM__TRY(tdm_sampler_seek(s->sampler, step));
    int64_t end = tdm_sampler_epoch_start(s->sampler, epoch + 1);
    for (; step < end && step < total; step++) {
      double t0 = tdm_time_now();
      float lr = tdm_lr_at(&sched, step);
      tdm_step_stats ss;
      st = tdm_engine_step(s->engine, next_batch, &bs, tdm_hash64(c->seed, (uint64_t)step), lr, &ss);
      if (st != TDM_OK && !isfinite(ss.grad_norm)) return grad_norm_error(c, ss.grad_norm, step, R, W);
      if (st != TDM_OK) return tdm__set_error(st, "step %lld: %s", (long long)step, tdm_last_error());
      double t3 = tdm_time_now();
      if (s->trace) {
        trace_span("step", "step", t0, step);
        TDM__TRY(tdm_trace_flush_if_needed(s->trace)); /* the rings stay bounded */
      }
      /* a parameter server's async and ssp workers never wait for each other: each reports its own */
      int own = s->ps_world && c->engine.ps.mode != TDM_PS_SYNC;
      if ((!s->comm || own) && !ss.skipped) TDM__TRY(finite_or_stop(c, ss.loss, step, "the loss", "")); /* several ranks: the mean, in flush_record */
      /* the global loss and accuracy travel without blocking: started now, collected (and the
       * step's record written) during the next step, so they add no synchronisation point */
      TDM__TRY(flush_record(s, rec, &pr, c));
      int time_up = c->max_time > 0 && train_time + (t3 - t0) >= c->max_time;
      *rec = (step_record){.pending = 1, .step = step, .epoch = epoch, .lr = lr, .stats = {own ? ss.loss : ss.loss / W, ss.correct, ss.rows, time_up},
                          .dt = t3 - t0, .t_fwd = ss.t_forward, .t_bwd = ss.t_backward, .t_wait = ss.t_comm_wait,
                          .t_opt = ss.t_update, .samples = (double)ss.samples * D, .total = total, .G = G, .grad_norm = ss.grad_norm,
                          .loss_scale = c->engine.precision == TDM_F16 ? ss.loss_scale : 0, .skipped = ss.skipped};
      grad_record(s->engine, rec->grad, sizeof rec->grad);
      rec->n_stats = 4;
      if (s->comm && !own && W <= RANK_TIMES) { /* this rank's times in its slots, gathered by the sum */
        double *t = rec->stats + 4 + 5 * R, mine[5] = {t3 - t0, ss.t_forward, ss.t_backward, ss.t_comm_wait, ss.t_update};
        memcpy(t, mine, sizeof mine);
        rec->n_stats = 4 + 5 * W;
      }
      if (s->comm && !own)
        TDM__TRY(tdm_comm_iallreduce(s->comm, rec->stats, rec->stats, rec->n_stats, TDM_F64, TDM_SUM, TDM_ALGO_AUTO, &rec->work));
      /* an axis split from the world speaks through the world's transport, which serves one
       * communicator at a time: the next step's collectives there must not meet this one */
      if (s->comm && !own && split_axes) {
        tdm_work_t w = rec->work;
        rec->work = NULL;
        TDM__TRY(tdm_work_wait(w));
      }
      if ((!s->comm || own) && time_up) s->stop = 1;
      if (s->stop) total = step + 1; /* a rank's time ran out (seen one step late, by all alike) */
      double dt = t3 - t0;
      train_time += dt;
      samples += (int64_t)rec->samples;
      rec->samples_so_far = samples;
      rec->train_time = train_time;
      if (c->checkpoint_dir && ((c->checkpoint_every > 0 && (step + 1) % c->checkpoint_every == 0) || step + 1 == total)) {
        TDM__TRY(flush_record(s, rec, &pr, c)); /* on every rank: this step's mean loss is checked before it is saved */
        TDM__TRY(params_finite(s->engine, c, step + 1));
        TDM__TRY(metrics_ok(s, c)); /* the records are in the file before the checkpoint that covers them */
        tdm_ckpt_info ci = {.step = step + 1, .world_size = W, .seed = c->seed, .n_meta = id.n - 1, .meta_kv = id.kv}; /* the seed is the checkpoint's own key */
        tdm_sampler_locate(s->sampler, step + 1, &ci.data_epoch, &ci.data_offset);
        if (!s->ps_world) /* the directory still the one locked at start (rank 0 holds the lock; every rank learns) */
          TDM__TRY(tdm__ckpt_agree(s->comm, tdm_ckpt_lock_check(c->checkpoint_dir, s->start.lock_fd), "checkpoint"));
        double tc = tdm_trace_begin();
        if (s->ps_world) TDM__TRY(tdm_ps_workers_checkpoint(s->engine, c->checkpoint_dir, &ci, 2)); /* with the servers */
        else TDM__TRY(tdm_ckpt_save_engine(c->checkpoint_dir, s->engine, &ci, 2));
        if (s->trace) {
          trace_span("checkpoint", "checkpoint", tc, step + 1);
          TDM__TRY(tdm_trace_flush(s->trace)); /* what led up to a checkpoint survives a crash after it */
        }
      }
      if (is_lm(mk) && c->val_every > 0 && (step + 1) % c->val_every == 0 && step + 1 < total) {
        double vl, va;
        TDM__TRY(flush_record(s, rec, &pr, c));
        TDM__TRY(ps_survivors(s, c, &pr, res));
        double te = tdm_trace_begin();
        TDM__TRY(evaluate(s->engine, s->test, B, s->idx, c->val_batches * G, &vl, &va));
        if (te > 0) trace_span("evaluation", "validation", te, step + 1);
        if (pr.f) fprintf(pr.f, "%sstep %lld: val loss %.4f\n", pr.tty ? "\n" : "", (long long)step + 1, vl);
        TDM__TRY(eval_record(s, c, 1, 0, step + 1, vl, va));
      }
      if (c->on_step && c->on_step(c->on_step_ctx, step + 1))
        return tdm__set_error(TDM_ERR_INVALID_USAGE, "training stopped by the step callback after step %lld", (long long)step + 1);
    }
    int epoch_done = step == end || step >= total;
    TDM__TRY(flush_record(s, rec, &pr, c));
    if (epoch_done) {
      double tl = 0, ta = 0;
      TDM__TRY(ps_survivors(s, c, &pr, res));
      TDM__TRY(params_finite(s->engine, c, step));
      double te = tdm_trace_begin();
      TDM__TRY(evaluate(s->engine, s->test, is_lm(mk) ? B : eb, s->idx, is_lm(mk) ? c->val_batches * G : 0,
                        &tl, &ta));
      if (te > 0) trace_span("evaluation", "evaluation", te, step);
      res->test_loss = tl;
      res->test_accuracy = ta;
      if (pr.f && is_lm(mk)) {
        fprintf(pr.f, "%sstep %lld: val loss %.4f (%.3f nats per byte), next-byte accuracy %.2f%%\n", pr.tty ? "\n" : "",
                (long long)step, tl, tl, 100 * ta);
      } else if (pr.f) {
        fprintf(pr.f, "%sepoch %lld: test loss %.4f, test accuracy %.2f%%\n", pr.tty ? "\n" : "", (long long)epoch + 1,
                tl, 100 * ta);
        fflush(pr.f);
      }
      TDM__TRY(eval_record(s, c, is_lm(mk), epoch + 1, step, tl, ta));
      evaluated = 1;
    }
    epoch++;
  }
  TDM__TRY(flush_record(s, rec, &pr, c));
  if (!evaluated) { /* no step ran: the checkpoint's weights, evaluated as the run's last epoch was */
    TDM__TRY(ps_survivors(s, c, &pr, res));
    TDM__TRY(evaluate(s->engine, s->test, is_lm(mk) ? B : eb, s->idx, is_lm(mk) ? c->val_batches * G : 0,
                      &res->test_loss, &res->test_accuracy));
    if (pr.f)
      fprintf(pr.f, "step %lld: %s loss %.4f, %s accuracy %.2f%%\n", (long long)step, is_lm(mk) ? "val" : "test",
              res->test_loss, is_lm(mk) ? "next-byte" : "test", 100 * res->test_accuracy);
  }
  TDM__TRY(params_finite(s->engine, c, step));
  if (c->save_weights) TDM__TRY(tdm_engine_save_weights(s->engine, c->save_weights, n_arch_meta + 1, weights_meta));
  if (s->metrics) { /* what the run held, measured: to set beside the plan printed at the start */
    char mem[600];
    mem_json(mem, sizeof mem);
    fprintf(s->metrics, "{\"step\":%lld,\"world_size\":%d,\"memory_peak\":%s}\n", (long long)step, W, mem);
  }
  TDM__TRY(metrics_ok(s, c));
  FILE *mf = s->metrics;
  s->metrics = NULL;
  if (mf && fclose(mf) != 0) return tdm__set_error(TDM_ERR_IO, "train: writing metrics to %s failed: %s", c->metrics, strerror(errno));
  if (c->engine.kind != TDM_ENGINE_PS) TDM__TRY(trace_clock(s, 1)); /* (the servers left the loop on their own) */
  loss_v = (float)s->last_loss;
  res->steps = step;
  res->final_loss = loss_v;
  res->train_seconds = train_time;
  res->samples_per_sec = train_time > 0 ? (double)samples / train_time : 0;
  res->tokens_per_sec = res->samples_per_sec * (double)s->tokens_per_sample;
  return TDM_OK;
}

tdm_status tdm_train_run(const tdm_train_config *c, tdm_train_result *res) {
  if (!c || !res) return tdm__set_error(TDM_ERR_INVALID_ARG, "train: NULL argument");
  memset(res, 0, sizeof *res);
  run_state s = {0};
  s.start.lock_fd = -1;
  tdm_status st = run(c, res, &s);
  tdm_trace *tr = s.trace; /* closed once no thread of the run records any more */
  run_free(&s);
  tdm_status ts = tdm_trace_close(tr);
  return st != TDM_OK ? st : ts;
}
