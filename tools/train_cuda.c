/* tandem train --device cuda: GPT on one GPU (include/tandem/cuda.h) over the text data of
 * tandem train's GPT: the first 90% trains (random windows, seeded), the last 10% validates.
 * The options are tandem train's; what the CUDA backend does not have yet is refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_tools.h"
#include "tandem/cuda.h"

static void draw(tdm_rng *r, int64_t *idx, int64_t B, int64_t n) {
  for (int64_t i = 0; i < B; i++) idx[i] = (int64_t)(tdm_rng_next(r) % (uint64_t)n);
}

int cuda_precision(const char *cmd, tdm_dtype precision, int tf32) {
  if (precision == TDM_F16) {
    fprintf(stderr, "tandem %s --device cuda: --precision fp16 is not on the CUDA backend (fp32, --tf32 or --precision bf16)\n", cmd);
    return -1;
  }
  if (precision == TDM_BF16 && tf32) {
    fprintf(stderr, "tandem %s --device cuda: --tf32 is for fp32 products; --precision bf16 already multiplies in bf16\n", cmd);
    return -1;
  }
  return precision == TDM_BF16 ? TDM_CUDA_BF16 : tf32 ? TDM_CUDA_TF32 : TDM_CUDA_FP32;
}

/* The GPT config a --device cuda run uses (dropout refused as train refuses it); 0, or the exit code. */
static int cuda_model(const char *cmd, const tdm_train_config *c, tdm_model_config *mc) {
  int64_t given[5] = {c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size};
  if (tdm_model_config_gpt(c->gpt_config, given, mc) != TDM_OK) {
    fprintf(stderr, "tandem %s --device cuda: %s\n", cmd, tdm_last_error());
    return 2;
  }
  mc->dropout = 0;
  return 0;
}

int plan_cuda(const tdm_train_config *c, int tf32, int json) {
  if (strcmp(c->model, "gpt")) {
    fprintf(stderr, "tandem plan --device cuda: --model %s; the CUDA backend trains --model gpt\n", c->model);
    return 2;
  }
  if (c->dropout != 0) {
    fprintf(stderr, "tandem plan --device cuda: dropout %g (gpt's default is 0.1); the CUDA backend has no dropout yet: give --dropout 0\n",
            c->dropout);
    return 2;
  }
  int prec = cuda_precision("plan", c->engine.precision, tf32);
  if (prec < 0) return 2;
  tdm_model_config mc;
  int rc = cuda_model("plan", c, &mc);
  if (rc) return rc;
  int64_t T = c->seq_len > 0 ? c->seq_len : mc.block_size, B = c->batch_size;
  tdm_cuda_gpt_plan p;
  if (tdm_cuda_gpt_plan_bytes(&mc, B, T, prec, &p) != TDM_OK) {
    fprintf(stderr, "tandem plan --device cuda: %s\n", tdm_last_error());
    return 1;
  }
  static const char *names[3] = {"fp32", "tf32", "bf16"};
  const double G = 1073741824.0;
  if (json) {
    printf("{\"device\":\"cuda\",\"precision\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"parameters\":%zu,\"gradients\":%zu,"
           "\"optimizer\":%zu,\"weights_bf16\":%zu,\"activations\":%zu,\"total\":%zu}\n",
           names[prec], (long long)B, (long long)T, p.params, p.grads, p.adam, p.weights_bf16, p.activations, p.total);
  } else {
    printf("plan for tandem train --device cuda: GPT (%lld layers, %lld heads, width %lld, vocab %lld), B=%lld T=%lld, %s\n",
           (long long)mc.n_layer, (long long)mc.n_head, (long long)mc.n_embd, (long long)mc.vocab_size, (long long)B, (long long)T,
           names[prec]);
    printf("  parameters    %9.3f GiB\n  gradients     %9.3f GiB\n  AdamW moments %9.3f GiB\n", p.params / G, p.grads / G, p.adam / G);
    if (p.weights_bf16) printf("  bf16 weights  %9.3f GiB\n", p.weights_bf16 / G);
    printf("  activations   %9.3f GiB  (one arena, cut once)\n  total         %9.3f GiB  allocated at start; a step allocates nothing\n",
           p.activations / G, p.total / G);
  }
  if (c->memory_limit > 0 && (double)p.total > (double)c->memory_limit) {
    fprintf(stderr, "tandem plan --device cuda: the plan needs %.3f GiB, %.3f GiB over --memory-limit %.3f GiB\n", p.total / G,
            (p.total - (double)c->memory_limit) / G, (double)c->memory_limit / G);
    return 1;
  }
  return 0;
}

int train_cuda(const tdm_train_config *c, int tf32) {
  const tdm_engine_config *e = &c->engine;
  const char *ws = getenv("WORLD_SIZE");
  const char *bad = strcmp(c->model, "gpt") ? "a model other than gpt"
                    : ws && atoi(ws) > 1 ? "several ranks (tandem run)"
                    : e->kind != TDM_ENGINE_DP ? "--zero, --tp, --pp or --ps-servers"
                    : e->accum > 1 ? "--accum"
                    : e->recompute != TDM_RECOMPUTE_NONE ? "--recompute" : c->checkpoint_dir ? "--checkpoint-dir"
                    : strcmp(c->optimizer, "adamw") && strcmp(c->optimizer, "adam") ? "--optimizer sgd"
                    : c->lr_schedule && !strcmp(c->lr_schedule, "step") ? "--lr-schedule step" : NULL;
  if (bad) {
    fprintf(stderr, "tandem train --device cuda: %s is not on the CUDA backend yet (it trains --model gpt on one GPU, "
                    "fp32, --tf32 or --precision bf16, AdamW, one process)\n", bad);
    return 2;
  }
  int prec = cuda_precision("train", e->precision, tf32);
  if (prec < 0) return 2;
  if (c->dropout != 0) {
    fprintf(stderr, "tandem train --device cuda: dropout %g (gpt's default is 0.1); the CUDA backend has no dropout yet: give --dropout 0\n",
            c->dropout);
    return 2;
  }
  tdm_model_config mc;
  int mrc = cuda_model("train", c, &mc);
  if (mrc) return mrc;
  int64_t T = c->seq_len > 0 ? c->seq_len : mc.block_size, B = c->batch_size;
  tdm_model *m = NULL;
  tdm_cuda_gpt *g = NULL;
  tdm_dataset *train = NULL, *val = NULL;
  int64_t *idx = malloc((size_t)B * sizeof(int64_t));
  int32_t *x = malloc((size_t)(B * T) * 4), *y = malloc((size_t)(B * T) * 4);
  int rc = 1;
  const char *path = c->data_path ? c->data_path : "data/tinyshakespeare.txt";
  tdm_status st = idx && x && y ? TDM_OK : TDM_ERR_NO_MEMORY;
  if (st == TDM_OK) st = tdm_cuda_init();
  if (st == TDM_OK) st = tdm_dataset_open_text_part(&train, path, T, 0.0, 0.9);
  if (st == TDM_OK) st = tdm_dataset_open_text_part(&val, path, T, 0.9, 1.0);
  if (st == TDM_OK && mc.vocab_size < 256) {
    fprintf(stderr, "tandem train --device cuda: vocabulary %lld is smaller than the 256 byte tokens of the text\n", (long long)mc.vocab_size);
    rc = 2;
    goto out;
  }
  if (st == TDM_OK) st = tdm_model_create(&m, &mc, c->seed);
  if (st == TDM_OK && c->init_weights) st = tdm_params_load(tdm_model_params(m), c->init_weights, 0);
  if (st == TDM_OK) st = tdm_cuda_gpt_create(&g, &mc, tdm_model_params(m), B, T, prec);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem train --device cuda: %s: %s\n", tdm_status_str(st), tdm_last_error());
    goto out;
  }
  int64_t n_train = tdm_dataset_len(train), n_val = tdm_dataset_len(val);
  int64_t steps = c->steps > 0 ? c->steps : c->epochs * (n_train / B > 0 ? n_train / B : 1);
  tdm_optim_config oc = tdm_optim_config_default(strcmp(c->optimizer, "adamw") ? TDM_OPT_ADAM : TDM_OPT_ADAMW);
  oc.lr = (float)c->lr;
  if (c->weight_decay >= 0) oc.weight_decay = (float)c->weight_decay;
  oc.decay_matrices_only = c->decay_matrices_only;
  tdm_lr_schedule sched = {c->lr_schedule && !strcmp(c->lr_schedule, "cosine") ? TDM_LR_COSINE : TDM_LR_CONSTANT,
                           (float)c->lr, c->warmup_steps, steps, (float)c->lr / 10, 0, 0};
  tdm_rng rng;
  tdm_rng_seed(&rng, c->seed ^ 0x5eedull);
  char dev[256] = "";
  tdm_cuda_device_info(dev, sizeof dev, NULL, NULL);
  tdm_cuda_gpt_plan plan = tdm_cuda_gpt_get_plan(g);
  fprintf(stderr, "tandem train --device cuda: GPT %lld layers, width %lld on %s; B=%lld T=%lld, %lld steps; %.2f GiB on the device\n",
          (long long)mc.n_layer, (long long)mc.n_embd, dev, (long long)B, (long long)T, (long long)steps,
          (double)plan.total / 1073741824.0);
  double t0 = tdm_time_now();
  float loss = 0, norm = 0;
  for (int64_t s = 0; s < steps; s++) {
    draw(&rng, idx, B, n_train);
    st = tdm_dataset_tokens(train, idx, B, x, y);
    if (st == TDM_OK) st = tdm_cuda_gpt_forward(g, x, y, &loss);
    if (st == TDM_OK) st = tdm_cuda_gpt_zero_grad(g);
    if (st == TDM_OK) st = tdm_cuda_gpt_backward(g);
    if (st == TDM_OK) st = tdm_cuda_gpt_update(g, &oc, tdm_lr_at(&sched, s), (float)e->clip, &norm);
    if (st == TDM_OK && !isfinite(loss) && !c->allow_nonfinite) {
      fprintf(stderr, "tandem train --device cuda: step %lld: the loss is %g (--allow-nonfinite goes on)\n", (long long)s + 1, (double)loss);
      goto out;
    }
    if (st != TDM_OK) {
      fprintf(stderr, "tandem train --device cuda: step %lld: %s\n", (long long)s + 1, tdm_last_error());
      goto out;
    }
    if ((s + 1) % 10 == 0 || s == 0 || s + 1 == steps) /* progress on stderr, as tandem train prints it */
      fprintf(stderr, "step %lld/%lld  loss %.4f  grad norm %.3f  lr %.3g\n", (long long)s + 1, (long long)steps, loss, norm,
              (double)tdm_lr_at(&sched, s));
  }
  double secs = tdm_time_now() - t0;
  /* validation: the first val_batches x B windows of the held-out text, in order */
  double vsum = 0;
  int64_t vb = 0;
  for (int64_t k = 0; k < c->val_batches && (k + 1) * B <= n_val; k++, vb++) {
    for (int64_t i = 0; i < B; i++) idx[i] = k * B + i;
    st = tdm_dataset_tokens(val, idx, B, x, y);
    if (st == TDM_OK) st = tdm_cuda_gpt_forward(g, x, y, &loss);
    if (st != TDM_OK) {
      fprintf(stderr, "tandem train --device cuda: validation: %s\n", tdm_last_error());
      goto out;
    }
    vsum += loss;
  }
  if (c->save_weights) {
    st = tdm_cuda_gpt_download(g, tdm_model_params(m), 0);
    if (st == TDM_OK) st = tdm_params_save(tdm_model_params(m), c->save_weights, 0, NULL);
    if (st != TDM_OK) {
      fprintf(stderr, "tandem train --device cuda: saving weights: %s\n", tdm_last_error());
      goto out;
    }
  }
  printf("val loss: %.4f nats per byte  throughput: %.0f tokens/s  (%lld steps of %lld tokens, %.1f s training on %s)\n",
         vb ? vsum / (double)vb : NAN, (double)(steps * B * T) / secs, (long long)steps, (long long)(B * T), secs, dev);
  if (c->save_weights) printf("weights written to %s\n", c->save_weights);
  rc = 0;
out:
  tdm_cuda_gpt_destroy(g);
  tdm_model_destroy(m);
  tdm_dataset_destroy(train), tdm_dataset_destroy(val);
  free(idx), free(x), free(y);
  return rc;
}
