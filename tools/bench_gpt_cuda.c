/* tandem bench gpt --device cuda: the speed of one GPT training step (forward, backward, AdamW with
 * clipping) on one GPU, on random tokens; medians, tokens/s, model FLOP utilisation against a peak
 * (default: H100 SXM's dense bf16, 989 TFLOP/s, the usual MFU yardstick), and the AdamW update
 * against its memory-traffic floor (28 bytes per parameter at the measured copy bandwidth). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_tools.h"
#include "tandem/cuda.h"

/* Device copy bandwidth (bytes read + written per second) over two 512 MiB buffers; 0 if no memory. */
static double copy_bandwidth(void) {
  size_t n = (size_t)512 << 20;
  void *a = NULL, *b = NULL;
  double bw = 0, t[7];
  if (tdm_cuda_malloc(&a, n, "the bandwidth probe") != TDM_OK || tdm_cuda_malloc(&b, n, "the bandwidth probe") != TDM_OK)
    goto out;
  tdm_cuda_memset0(a, n);
  tdm_cuda_copy(b, a, n);
  tdm_cuda_sync("bandwidth probe");
  for (int r = 0; r < 7; r++) {
    double t0 = tdm_time_now();
    tdm_cuda_copy(b, a, n);
    tdm_cuda_sync("bandwidth probe");
    t[r] = tdm_time_now() - t0;
  }
  bw = 2.0 * (double)n / tdm_median(t, 7);
out:
  tdm_cuda_free(a), tdm_cuda_free(b);
  return bw;
}

int bench_gpt_cuda(const tdm_model_config *mc, int64_t B, int64_t T, int64_t steps, int64_t warmup, uint64_t seed,
                   int precision, double peak_tflops, int json, int profile) {
  static const char *prec_name[3] = {"fp32", "tf32", "bf16"};
  tdm_model *m = NULL;
  tdm_cuda_gpt *g = NULL;
  int rc = 1;
  int64_t total = warmup + steps, N = B * T;
  double *t_all = calloc((size_t)total, sizeof(double)), *t_fwd = calloc((size_t)total, sizeof(double)),
         *t_bwd = calloc((size_t)total, sizeof(double)), *t_opt = calloc((size_t)total, sizeof(double));
  int32_t *x = malloc((size_t)N * 4), *y = malloc((size_t)N * 4);
  char dev[256] = "";
  size_t dfree = 0, dtotal = 0;
  tdm_status st = (t_all && t_fwd && t_bwd && t_opt && x && y) ? TDM_OK : TDM_ERR_NO_MEMORY;
  if (st == TDM_OK) st = tdm_cuda_init();
  if (st == TDM_OK) st = tdm_cuda_device_info(dev, sizeof dev, &dfree, &dtotal);
  if (st == TDM_OK) st = tdm_model_create(&m, mc, seed);
  if (st == TDM_OK) st = tdm_cuda_gpt_create(&g, mc, tdm_model_params(m), B, T, precision);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem bench gpt --device cuda: %s\n", tdm_last_error());
    goto out;
  }
  tdm_rng rng;
  tdm_rng_seed(&rng, seed + 1);
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  oc.lr = 3e-4f, oc.beta2 = 0.95f, oc.weight_decay = 0.1f, oc.decay_matrices_only = 1;
  float loss = 0, norm = 0;
  for (int64_t s = 0; s < total; s++) {
    for (int64_t i = 0; i < N; i++)
      x[i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)mc->vocab_size), y[i] = (int32_t)(tdm_rng_next(&rng) % (uint64_t)mc->vocab_size);
    double t0 = tdm_time_now();
    st = tdm_cuda_gpt_forward(g, x, y, &loss); /* ends in a sync (the loss comes back) */
    double t1 = tdm_time_now();
    if (st == TDM_OK) st = tdm_cuda_gpt_zero_grad(g);
    if (st == TDM_OK) st = tdm_cuda_gpt_backward(g); /* ends in a sync */
    double t2 = tdm_time_now();
    if (st == TDM_OK) st = tdm_cuda_gpt_update(g, &oc, oc.lr, 1.0f, &norm);
    double t3 = tdm_time_now();
    if (st != TDM_OK) {
      fprintf(stderr, "tandem bench gpt --device cuda: step %lld: %s\n", (long long)s, tdm_last_error());
      goto out;
    }
    t_all[s] = (t3 - t0) * 1e3, t_fwd[s] = (t1 - t0) * 1e3, t_bwd[s] = (t2 - t1) * 1e3, t_opt[s] = (t3 - t2) * 1e3;
  }
  int64_t np = tdm_params_numel(tdm_model_params(m)), C = mc->n_embd, L = mc->n_layer;
  /* nanoGPT's count: 6 FLOPs per parameter and token (position embeddings excluded) + 12 L C T for attention */
  double flops = (6.0 * (double)(np - mc->block_size * C) + 12.0 * (double)(L * C * T)) * (double)N;
  double ms = tdm_median(t_all + warmup, steps), fwd = tdm_median(t_fwd + warmup, steps), bwd = tdm_median(t_bwd + warmup, steps),
         opt = tdm_median(t_opt + warmup, steps);
  double tps = (double)N / (ms * 1e-3), mfu = flops / (ms * 1e-3) / (peak_tflops * 1e12);
  double bw = copy_bandwidth(), floor_ms = bw > 0 ? 28.0 * (double)np / bw * 1e3 : NAN;
  tdm_cuda_gpt_plan plan = tdm_cuda_gpt_get_plan(g);
  if (json) {
    printf("{\"device\":\"%s\",\"layers\":%lld,\"heads\":%lld,\"width\":%lld,\"vocab\":%lld,\"batch\":%lld,\"seq\":%lld,"
           "\"params\":%lld,\"precision\":\"%s\",\"ms\":%.3f,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"opt_ms\":%.3f,\"tokens_per_s\":%.1f,"
           "\"tflops\":%.2f,\"mfu\":%.4f,\"peak_tflops\":%.1f,\"copy_gbps\":%.1f,\"adamw_floor_ms\":%.3f,"
           "\"device_gib\":%.3f,\"loss\":%.4f}\n",
           dev, (long long)L, (long long)mc->n_head, (long long)C, (long long)mc->vocab_size, (long long)B, (long long)T,
           (long long)np, prec_name[precision], ms, fwd, bwd, opt, tps, flops / (ms * 1e-3) * 1e-12, mfu, peak_tflops, bw * 1e-9, floor_ms,
           (double)plan.total / 1073741824.0, loss);
  } else {
    printf("# tandem GPT step on %s: %lld layers, %lld heads, width %lld, vocab %lld (%lld parameters), B=%lld T=%lld, %s\n",
           dev, (long long)L, (long long)mc->n_head, (long long)C, (long long)mc->vocab_size, (long long)np, (long long)B,
           (long long)T, precision == TDM_CUDA_BF16 ? "bf16 mixed precision (flash attention)" : precision == TDM_CUDA_TF32 ? "fp32 with TF32 products" : "fp32");
    printf("step        %9.2f ms (median of %lld)  %.0f tokens/s\n", ms, (long long)steps, tps);
    printf("  forward   %9.2f ms (with the fused cross-entropy and its gradient)\n  backward  %9.2f ms\n", fwd, bwd);
    printf("  update    %9.2f ms (gradient norm, clipping, AdamW; memory-traffic floor %.2f ms at %.0f GB/s copy: %.2fx)\n",
           opt, floor_ms, bw * 1e-9, opt / floor_ms);
    printf("model FLOPs %9.1f GFLOP per step: %.1f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s\n", flops * 1e-9,
           flops / (ms * 1e-3) * 1e-12, 100 * mfu, peak_tflops);
    printf("device      %9.2f GiB allocated once: parameters %.2f, gradients %.2f, AdamW %.2f, bf16 weights %.2f, activations %.2f; last loss %.4f\n",
           (double)plan.total / 1073741824.0, (double)plan.params / 1073741824.0, (double)plan.grads / 1073741824.0,
           (double)plan.adam / 1073741824.0, (double)plan.weights_bf16 / 1073741824.0, (double)plan.activations / 1073741824.0, loss);
  }
  if (profile) { /* more steps with events between kernel groups: where the time goes, not how long a step takes */
    enum { PSTEPS = 3 };
    st = tdm_cuda_gpt_set_profile(g, 1);
    for (int64_t s = 0; st == TDM_OK && s < PSTEPS; s++) {
      st = tdm_cuda_gpt_forward(g, x, y, &loss);
      if (st == TDM_OK) st = tdm_cuda_gpt_zero_grad(g);
      if (st == TDM_OK) st = tdm_cuda_gpt_backward(g);
      if (st == TDM_OK) st = tdm_cuda_gpt_update(g, &oc, oc.lr, 1.0f, &norm);
    }
    if (st != TDM_OK) {
      fprintf(stderr, "tandem bench gpt --device cuda --profile: %s\n", tdm_last_error());
      goto out;
    }
    const char *names[16];
    double pms[16], total = 0;
    int n = tdm_cuda_gpt_profile(g, names, pms, 16);
    for (int i = 0; i < n; i++) total += pms[i];
    printf("%sdevice time by kernel group (%d profiled steps, events between groups):\n", json ? "# " : "", PSTEPS);
    for (int i = 0; i < n; i++)
      printf("%s  %-30s %8.2f ms a step  %5.1f%%\n", json ? "# " : "", names[i], pms[i] / PSTEPS, 100 * pms[i] / total);
    printf("%s  %-30s %8.2f ms\n", json ? "# " : "", "total", total / PSTEPS);
  }
  rc = 0;
out:
  tdm_cuda_gpt_destroy(g);
  tdm_model_destroy(m);
  free(t_all), free(t_fwd), free(t_bwd), free(t_opt), free(x), free(y);
  return rc;
}
