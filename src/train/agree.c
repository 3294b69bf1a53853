/* Every rank trains with the same settings, or none starts; see agree.h. */
#include "train/agree.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/common.h"

enum { MAX_SETTINGS = 80, VALUE = 96 };

typedef struct {
  int n;
  const char *name[MAX_SETTINGS];
  char value[MAX_SETTINGS][VALUE];
} settings;

static void add(settings *s, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(settings *s, const char *name, const char *fmt, ...) {
  TDM_ASSERT(s->n < MAX_SETTINGS);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->value[s->n], VALUE, fmt, ap);
  va_end(ap);
  s->name[s->n++] = name;
}

static const char *str(const char *v) { return v ? v : "(none)"; }

/* What changes the numbers or the collectives every rank must call alike, as the options that
 * set it. Left out: what may differ from rank to rank without either (threads, prefetch, paths:
 * a node's data directory or rank 0's outputs), and what only rank 0 does. Doubles as %.17g: two
 * values print alike only when they are equal. */
static void collect(const tdm_train_config *c, settings *s) {
  const tdm_engine_config *e = &c->engine;
  add(s, "--model", "%s", str(c->model));
  add(s, "--config", "%s", str(c->gpt_config));
  add(s, "--layers / --heads / --width", "%lld / %lld / %lld", (long long)c->n_layer, (long long)c->n_head, (long long)c->n_embd);
  add(s, "--block / --vocab / --seq-len", "%lld / %lld / %lld", (long long)c->block_size, (long long)c->vocab_size,
      (long long)c->seq_len);
  add(s, "--kv-heads / --ffn-width", "%lld / %lld", (long long)c->n_kv_head, (long long)c->ffn_hidden);
  add(s, "--rope-theta / --rope-scaling / --tie-embeddings", "%.17g / %d / %d", c->rope_theta, c->rope_scaling,
      c->tie_embeddings);
  add(s, "--data", "%s", str(c->data));
  add(s, "--epochs", "%lld", (long long)c->epochs);
  add(s, "--steps", "%lld", (long long)c->steps);
  add(s, "--max-time", "%.17g", c->max_time);
  add(s, "--batch-size", "%lld", (long long)c->batch_size);
  add(s, "--accum / --microbatches", "%lld", (long long)e->accum);
  add(s, "--last-batch", "%s", str(c->last_batch));
  add(s, "--eval-batch-size", "%lld", (long long)c->eval_batch);
  add(s, "--val-every / --val-batches", "%lld / %lld", (long long)c->val_every, (long long)c->val_batches);
  add(s, "--seed", "%llu", (unsigned long long)c->seed);
  add(s, "--optimizer", "%s", str(c->optimizer));
  add(s, "--lr", "%.17g", c->lr);
  add(s, "--weight-decay", "%.17g (matrices only: %d)", c->weight_decay, c->decay_matrices_only);
  add(s, "--momentum / --nesterov", "%.17g / %d", c->momentum, c->nesterov);
  add(s, "--lr-schedule", "%s", str(c->lr_schedule));
  add(s, "--warmup", "%lld", (long long)c->warmup_steps);
  add(s, "--lr-step / --lr-gamma", "%lld / %.17g", (long long)c->lr_step_size, c->lr_gamma);
  add(s, "--clip", "%.9g", (double)e->clip);
  add(s, "--dropout", "%.17g", c->dropout);
  add(s, "--label-smoothing", "%.17g / %.9g", c->label_smoothing, (double)e->label_smoothing);
  add(s, "--crop-pad / --flip", "%d / %d", c->crop_pad, c->flip);
  add(s, "--sync-bn", "%d", c->sync_bn);
  add(s, "--precision", "%d", (int)e->precision);
  add(s, "--loss-scale-init / --loss-scale-window", "%.9g / %lld", (double)e->loss_scale.init, (long long)e->loss_scale.window);
  add(s, "--recompute", "%d", (int)e->recompute);
  add(s, "--allow-nonfinite", "%d / %d", c->allow_nonfinite, e->allow_nonfinite);
  add(s, "--dp / --tp / --pp", "%lld / %lld / %lld", (long long)c->dp, (long long)c->tp, (long long)c->pp);
  add(s, "the parallelism engine (--zero, --tp, --pp, --ps-servers)", "%d", (int)e->kind);
  add(s, "--bucket-mb", "%zu / %zu", e->dp.bucket_bytes, e->dp.first_bucket_bytes);
  add(s, "--no-overlap", "%d", e->dp.no_overlap);
  add(s, "the gradients' wire dtype", "%d", (int)e->dp.wire_dtype);
  add(s, "--compress / --compress-start", "%s / %lld", str(e->dp.compress), (long long)e->dp.compress_start);
  add(s, "--zero", "%d (buckets %zu)", e->zero.stage, e->zero.bucket_bytes);
  add(s, "--zero-unit / --zero-prefetch", "%d / %d", e->zero.unit_modules, e->zero.prefetch);
  add(s, "--tp-check-every", "%lld (ZeRO on the data axis: %d)", (long long)e->tp.check_every, e->tp.zero_stage);
  char split[3 * TDM_PP_MAX_SPLIT + 1] = "";
  for (int i = 0, o = 0; i < e->pp.n_split && i < TDM_PP_MAX_SPLIT && o < (int)sizeof split - 12; i++)
    o += snprintf(split + o, sizeof split - (size_t)o, "%s%d", i ? "," : "", e->pp.split[i]);
  add(s, "--schedule / --virtual-stages / --pp-split", "%d / %d / %s (ZeRO on the data axis: %d, seq %lld)",
      (int)e->pp.schedule, e->pp.virtual_stages, split, e->pp.zero_stage, (long long)e->pp.seq_len);
  add(s, "--ps-servers / --ps-mode / --staleness", "%d / %d / %d", e->ps.servers, (int)e->ps.mode, e->ps.staleness);
  add(s, "--checkpoint-dir (given or not) / --checkpoint-every", "%d / %lld", c->checkpoint_dir != NULL,
      (long long)c->checkpoint_every);
  add(s, "--resume / --resume-override", "%d / %s", c->resume, str(c->resume_override));
  add(s, "--init-weights (given or not)", "%d", c->init_weights != NULL);
  /* the environment's switches that change which collectives run (a bad value: the engine says) */
  int zero_copy = -1;
  if (tdm__env_switch("TANDEM_DP_ZERO_COPY", &zero_copy) != TDM_OK) tdm_clear_error();
  add(s, "TANDEM_DP_ZERO_COPY (environment)", "%d", zero_copy != 0);
}

tdm_status tdm__settings_agree(const tdm_train_config *c, tdm_comm_t comm) {
  int W = tdm_comm_size(comm), R = tdm_comm_rank(comm);
  settings *s = tdm__calloc(1, sizeof *s);
  uint64_t *all = s ? tdm__calloc((size_t)W * MAX_SETTINGS, sizeof *all) : NULL;
  if (!all) {
    tdm__free(s);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "train: out of memory comparing the ranks' settings");
  }
  collect(c, s);
  uint64_t mine[MAX_SETTINGS] = {0};
  for (int k = 0; k < s->n; k++) mine[k] = tdm__hash_str(s->value[k]);
  tdm_status st = tdm_comm_allgather(comm, mine, all, MAX_SETTINGS, TDM_I64, TDM_ALGO_AUTO);
  int bad_rank = -1, bad_k = -1; /* the first (rank, setting) unlike rank 0's: the same on every rank */
  for (int r = 1; st == TDM_OK && r < W && bad_rank < 0; r++)
    for (int k = 0; k < MAX_SETTINGS && bad_rank < 0; k++)
      if (all[(size_t)r * MAX_SETTINGS + k] != all[k]) bad_rank = r, bad_k = k;
  if (st == TDM_OK && bad_rank >= 0) { /* both values, for the message every rank gives */
    char v0[VALUE], vr[VALUE];
    memcpy(v0, s->value[bad_k], VALUE), memcpy(vr, s->value[bad_k], VALUE);
    st = tdm_comm_broadcast(comm, v0, VALUE, TDM_U8, 0, TDM_ALGO_AUTO);
    if (st == TDM_OK) st = tdm_comm_broadcast(comm, vr, VALUE, TDM_U8, bad_rank, TDM_ALGO_AUTO);
    if (st == TDM_OK) {
      v0[VALUE - 1] = vr[VALUE - 1] = 0;
      st = tdm__set_error(TDM_ERR_MISMATCH,
                          "the ranks were started with different training settings: %s is %s on rank %d but %s on rank "
                          "0%s (every rank must get the same options)",
                          bad_k < s->n ? s->name[bad_k] : "a setting", vr, bad_rank, v0, R == bad_rank ? " (this rank differs)" : "");
    }
  }
  tdm__free(all);
  tdm__free(s);
  return st;
}
