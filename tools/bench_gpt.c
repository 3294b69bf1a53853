/* tandem bench gpt: the speed of one GPT training step (forward, backward, AdamW; fp32) on random
 * tokens, as bench/gpt_vs_pytorch.sh compares it with PyTorch. Prints the median time of each
 * phase, model FLOP/s as a share of the FMA peak, the optimizer against its memory-traffic floor,
 * allocations in the steady state and the peak resident memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "tandem/tandem.h"

typedef struct {
  int64_t n;
  float *p, *g, *m, *v;
} floor_ctx;

/* The optimizer's memory traffic with almost no arithmetic: read p, g, m, v; write p, m, v. */
static void floor_kernel(void *vctx, int64_t b, int64_t e) {
  floor_ctx *c = vctx;
  for (int64_t i = b; i < e; i++) {
    float g = c->g[i];
    c->m[i] += g;
    c->v[i] += g;
    c->p[i] -= g;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double floor_ms(int64_t n, int reps) {
  floor_ctx c = {n, NULL, NULL, NULL, NULL};
  float **arr[4] = {&c.p, &c.g, &c.m, &c.v};
  double t[16], out = NAN;
  for (int k = 0; k < 4; k++)
    if (!(*arr[k] = calloc((size_t)n, sizeof(float)))) goto done;
  if (reps > 16) reps = 16;
  for (int r = 0; r < reps; r++) {
    double t0 = tdm_time_now();
    tdm_parallel_for(n, 1 << 14, floor_kernel, &c);
    t[r] = (tdm_time_now() - t0) * 1e3;
  }
  out = median(t, reps);
done:
  for (int k = 0; k < 4; k++) free(*arr[k]);
  return out;
}

int tool_bench_gpt(int argc, char **argv) {
  const char *config = NULL;
  /* the ranges keep every size of the step (parameters, B x heads x T x T attention scores) inside
   * int64 bytes: what does not fit in memory fails to allocate, nothing overflows */
  int64_t layers = 0, heads = 0, width = 0, block = 0, vocab = 0, B = 4, T = 64, steps = 10, warmup = 3, threads = 1,
          seed = 1;
  double peak = 102.5;
  int json = 0;
  cli_opt opts[] = {
      {"config", CLI_CHOICE, &config, "mini", "architecture (mini: 4 layers, 4 heads, 256 wide, block 128, vocab 256)", "mini|gpt2-124M", 0, 0, 0},
      {"layers", CLI_INT, &layers, "0", "transformer blocks (0: from --config)", NULL, 0, 1000, 0},
      {"heads", CLI_INT, &heads, "0", "attention heads (0: from --config)", NULL, 0, 1000, 0},
      {"width", CLI_INT, &width, "0", "embedding width (0: from --config)", NULL, 0, 65536, 0},
      {"block", CLI_INT, &block, "0", "context length (0: from --config)", NULL, 0, 65536, 0},
      {"vocab", CLI_INT, &vocab, "0", "vocabulary size (0: from --config)", NULL, 0, 1e7, 0},
      {"batch-size", CLI_INT, &B, "4", "sequences per step", NULL, 1, 65536, 0},
      {"seq-len", CLI_INT, &T, "64", "tokens per sequence", NULL, 1, 65536, 0},
      {"steps", CLI_INT, &steps, "10", "timed steps", NULL, 1, 1e6, 0},
      {"warmup", CLI_INT, &warmup, "3", "untimed steps first", NULL, 1, 1e6, 0},
      {"threads", CLI_INT, &threads, "1", "intra-op threads (0: all cores)", NULL, 0, 1024, 0},
      {"peak-gflops", CLI_FLOAT, &peak, "102.5", "FMA peak of one core in GFLOP/s, for the share of peak", NULL, 1e-3, 1e9, 0},
      {"seed", CLI_INT, &seed, "1", "seed of the weights and the tokens", NULL, 0, 9e18, 0},
      {"json", CLI_FLAG, &json, NULL, "print one JSON object instead of the table", NULL, 0, 0, 0},
  };
  int n = (int)(sizeof opts / sizeof opts[0]);
  int pr = cli_parse("bench gpt", "[options]", opts, n, argc, argv);
  if (pr) return pr == 1 ? 0 : 2;
  tdm_model_config mc;
  int64_t given[5] = {layers, heads, width, block, vocab};
  if (tdm_model_config_gpt(config, given, &mc) != TDM_OK) { /* the option table admits only the two names */
    fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
    return 2;
  }
  if (T > mc.block_size) {
    fprintf(stderr, "tandem bench gpt: --seq-len %lld exceeds the block size %lld\n", (long long)T, (long long)mc.block_size);
    return 2;
  }
  if (tdm_set_num_threads((int)threads) != TDM_OK) {
    fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
    return 2;
  }
  tdm_model *model = NULL;
  tdm_optim *opt = NULL;
  tdm_tape *tp = NULL;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * T + 1));
  int64_t total = warmup + steps;
  double *t_fwd = calloc((size_t)total, sizeof(double)), *t_bwd = calloc((size_t)total, sizeof(double)),
         *t_opt = calloc((size_t)total, sizeof(double)), *t_all = calloc((size_t)total, sizeof(double));
  int rc = 1;
  if (!tok || !t_fwd || !t_bwd || !t_opt || !t_all) {
    fprintf(stderr, "tandem bench gpt: out of memory\n");
    goto out;
  }
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  oc.lr = 3e-4f, oc.beta2 = 0.95f, oc.weight_decay = 0.1f, oc.decay_matrices_only = 1;
  if (tdm_model_create(&model, &mc, (uint64_t)seed) != TDM_OK ||
      tdm_optim_create(&opt, &oc, tdm_model_params(model)) != TDM_OK || tdm_tape_create(&tp, 16u << 20) != TDM_OK) {
    fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
    goto out;
  }
  tdm_params *params = tdm_model_params(model);
  tdm_rng rng;
  tdm_rng_seed(&rng, (uint64_t)seed + 1);
  uint64_t allocs_before = 0;
  for (int64_t s = 0; s < total; s++) {
    for (int64_t i = 0; i <= B * T; i++) tok[i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)mc.vocab_size);
    if (s == warmup) allocs_before = tdm_alloc_count();
    double t0 = tdm_time_now();
    tdm_params_zero_grad(params);
    tdm_tape_reset(tp);
    tdm_tape_set_training(tp, 1);
    int64_t shape[2] = {B, T};
    tdm_tensor *x = tdm_from_data(tp, TDM_I32, 2, shape, tok), *y = tdm_from_data(tp, TDM_I32, 2, shape, tok + 1);
    tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(model, tp, x), y, -100);
    double t1 = tdm_time_now();
    if (!loss || tdm_backward(tp, loss) != TDM_OK) {
      fprintf(stderr, "tandem bench gpt: step %lld: %s\n", (long long)s, tdm_tape_error(tp));
      goto out;
    }
    double t2 = tdm_time_now();
    if (tdm_optim_step(opt, oc.lr) != TDM_OK) {
      fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
      goto out;
    }
    double t3 = tdm_time_now();
    t_fwd[s] = (t1 - t0) * 1e3, t_bwd[s] = (t2 - t1) * 1e3, t_opt[s] = (t3 - t2) * 1e3, t_all[s] = (t3 - t0) * 1e3;
  }
  uint64_t allocs = tdm_alloc_count() - allocs_before;
  int nt = tdm_get_num_threads();
  int64_t np = tdm_params_numel(params), C = mc.n_embd, L = mc.n_layer;
  /* nanoGPT's convention: 6 FLOPs per parameter and token (position embeddings excluded, the tied
   * lm_head counted once) plus 12 L C T per token for attention (full T x T, as if unmasked) */
  double flops = (6.0 * (double)(np - mc.block_size * C) + 12.0 * (double)(L * C * T)) * (double)(B * T);
  double ms = median(t_all + warmup, (int)steps), fwd = median(t_fwd + warmup, (int)steps),
         bwd = median(t_bwd + warmup, (int)steps), optm = median(t_opt + warmup, (int)steps);
  struct rusage ru; /* before the floor measurement, which allocates its own arrays */
  getrusage(RUSAGE_SELF, &ru);
  double rss_mib = (double)ru.ru_maxrss / 1024.0;
  double fl_ms = floor_ms(np, 7);
  double frac = flops / (ms * 1e-3) / (peak * 1e9 * nt);
  if (json) {
    printf("{\"config\":\"%s\",\"layers\":%lld,\"heads\":%lld,\"width\":%lld,\"vocab\":%lld,\"batch\":%lld,\"seq\":%lld,"
           "\"threads\":%d,\"params\":%lld,\"ms\":%.3f,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"opt_ms\":%.3f,\"gflop\":%.4f,"
           "\"peak_fraction\":%.4f,\"opt_floor_ms\":%.3f,\"allocs_per_step\":%.3f,\"peak_rss_mib\":%.1f}\n",
           config, (long long)L, (long long)mc.n_head, (long long)C, (long long)mc.vocab_size, (long long)B, (long long)T, nt,
           (long long)np, ms, fwd, bwd, optm, flops * 1e-9, frac, fl_ms, (double)allocs / (double)steps, rss_mib);
  } else {
    printf("# tandem GPT step: %lld layers, %lld heads, width %lld, vocab %lld (%lld parameters), B=%lld T=%lld, %d thread%s\n",
           (long long)L, (long long)mc.n_head, (long long)C, (long long)mc.vocab_size, (long long)np, (long long)B,
           (long long)T, nt, nt == 1 ? "" : "s");
    printf("step        %9.2f ms (median of %lld)\n", ms, (long long)steps);
    printf("  forward   %9.2f ms\n  backward  %9.2f ms\n  optimizer %9.2f ms (AdamW; memory-traffic floor %.2f ms, %.2fx)\n",
           fwd, bwd, optm, fl_ms, optm / fl_ms);
    printf("model FLOPs %9.2f GFLOP per step: %.1f GFLOP/s, %.1f%% of the FMA peak (%g GFLOP/s x %d)\n", flops * 1e-9,
           flops / (ms * 1e-3) * 1e-9, 100 * frac, peak, nt);
    printf("allocations %9.2f per steady-state step\npeak RSS    %9.1f MiB\n", (double)allocs / (double)steps, rss_mib);
  }
  rc = 0;
out:
  tdm_tape_destroy(tp);
  tdm_optim_destroy(opt);
  tdm_model_destroy(model);
  free(tok);
  free(t_fwd), free(t_bwd), free(t_opt), free(t_all);
  return rc;
}
