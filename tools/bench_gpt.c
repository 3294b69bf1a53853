/* tandem bench gpt | llama: the speed of one GPT or Llama training step (forward, backward, AdamW;
 * fp32 unless --precision) on random tokens, as bench/gpt_vs_pytorch.sh compares it with PyTorch. The step is
 * tdm_engine_step, the one tandem train runs: on one process, or under tandem run on several with data
 * parallelism, ZeRO (--zero), tensor parallelism (--tp) or a pipeline (--pp, with the bubble each
 * stage measured against its schedule's). Prints the median time of each phase, model FLOP/s as a share of the FMA peak, the
 * optimizer against its memory-traffic floor, allocations in the steady state, the memory held
 * per category and the peak resident memory (the largest of any rank). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>

#include "cli.h"
#include "cuda_tools.h"
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

/* CPU seconds of the whole process (every thread), user and system. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static double floor_ms(int64_t n, int reps) {
  floor_ctx c = {n, NULL, NULL, NULL, NULL};
  float **arr[4] = {&c.p, &c.g, &c.m, &c.v};
  double t[16], out = NAN;
  /* four arrays of n floats beside the engine's state: calloc succeeds whatever the size (the
   * kernel overcommits) and touching them would bring the OOM killer (Llama 3.2 1B: 20 GB), so
   * measure only within the free memory */
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && 16.0 * (double)n > 0.8 * (double)pages * (double)page) return NAN;
  for (int k = 0; k < 4; k++)
    if (!(*arr[k] = calloc((size_t)n, sizeof(float)))) goto done;
  if (reps > 16) reps = 16;
  for (int r = 0; r < reps; r++) {
    double t0 = tdm_time_now();
    tdm_parallel_for(n, 1 << 14, floor_kernel, &c);
    t[r] = (tdm_time_now() - t0) * 1e3;
  }
  out = tdm_median(t, reps);
done:
  for (int k = 0; k < 4; k++) free(*arr[k]);
  return out;
}

/* Random tokens for the engine's micro-batches: inputs and next-token targets. */
typedef struct {
  int64_t B, T, V;
  tdm_rng rng;
} bench_tokens;

/* What this rank sent on the world and on each axis of the grid (each communicator counts its own). */
static uint64_t bytes_sent(const tdm_grid *g) {
  uint64_t n = tdm_comm_bytes_sent(tdm_grid_world(g));
  for (int a = 0; a < TDM_AXIS_COUNT; a++) {
    tdm_comm_t c = tdm_grid_comm(g, (tdm_grid_axis)a);
    if (c != tdm_grid_world(g)) n += tdm_comm_bytes_sent(c);
  }
  return n;
}

static tdm_status random_tokens(void *ctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  (void)micro;
  bench_tokens *b = ctx;
  int64_t shape[2] = {b->B, b->T};
  *x = tdm_new(tp, TDM_I32, 2, shape);
  *y = tdm_new(tp, TDM_I32, 2, shape);
  if (!*x || !*y) return tdm_tape_status(tp);
  int32_t *xs = tdm_tensor_data(*x), *ys = tdm_tensor_data(*y);
  for (int64_t i = 0; i < b->B * b->T; i++) {
    xs[i] = (int32_t)(tdm_rng_next(&b->rng) % (uint64_t)b->V);
    ys[i] = (int32_t)(tdm_rng_next(&b->rng) % (uint64_t)b->V);
  }
  *base = 0;
  return TDM_OK;
}

static int bench_lm(int argc, char **argv, int llama) {
  const char *config = NULL, *optimizer = NULL, *recompute = NULL, *precision = NULL;
  /* the ranges keep every size of the step (parameters, B x heads x T x T attention scores) inside
   * int64 bytes: what does not fit in memory fails to allocate, nothing overflows */
  int64_t layers = 0, heads = 0, width = 0, block = 0, vocab = 0, B = 4, T = 64, steps = 10, warmup = 3, threads = 1,
          seed = 1, kv_heads = 0, ffn = 0;
  int64_t zero = 0, zero_unit = 1, tp = 1, pp = 1, accum = 1;
  const char *schedule = NULL;
  double peak = 0, bucket_mb = 25;
  int json = 0, tf32 = 0, profile = 0;
  const char *device = NULL;
  double peak_tflops = 989.4;
  cli_opt gpt_config = {"config", CLI_CHOICE, &config, "mini", "architecture (mini: 4 layers, 4 heads, 256 wide, block 128, vocab 256)", "mini|gpt2-124M", 0, 0, 0};
  cli_opt llama_config = {"config", CLI_CHOICE, &config, "llama-mini", "architecture (llama-mini: GPT mini's size, 2 key/value heads; llama3.2-1B: Meta's, 1.24 B parameters)", "llama-mini|llama3.2-1B", 0, 0, 0};
  cli_opt opts[] = {
      gpt_config,
      {"layers", CLI_INT, &layers, "0", "transformer blocks (0: from --config)", NULL, 0, 1000, 0},
      {"heads", CLI_INT, &heads, "0", "attention heads (0: from --config)", NULL, 0, 1000, 0},
      {"kv-heads", CLI_INT, &kv_heads, "0", "llama: key/value heads (0: from --config)", NULL, 0, 1000, 0},
      {"ffn-width", CLI_INT, &ffn, "0", "llama: SwiGLU width (0: from --config)", NULL, 0, 1e6, 0},
      {"optimizer", CLI_CHOICE, &optimizer, "adamw", "the update (sgd: no state, for a model whose Adam moments do not fit)", "adamw|sgd", 0, 0, 0},
      {"recompute", CLI_CHOICE, &recompute, "none", "activation recomputation (block: each transformer block again in backward; selective: the attention probabilities)", "none|block|selective", 0, 0, 0},
      {"precision", CLI_CHOICE, &precision, "fp32", "activations and products in bf16 or fp16 (master weights f32; fp16 with loss scaling)", "fp32|bf16|fp16", 0, 0, 0},
      {"width", CLI_INT, &width, "0", "embedding width (0: from --config)", NULL, 0, 65536, 0},
      {"block", CLI_INT, &block, "0", "context length (0: from --config)", NULL, 0, 65536, 0},
      {"vocab", CLI_INT, &vocab, "0", "vocabulary size (0: from --config)", NULL, 0, 1e7, 0},
      {"batch-size", CLI_INT, &B, "4", "sequences per step", NULL, 1, 65536, 0},
      {"seq-len", CLI_INT, &T, "64", "tokens per sequence", NULL, 1, 65536, 0},
      {"steps", CLI_INT, &steps, "10", "timed steps", NULL, 1, 1e6, 0},
      {"warmup", CLI_INT, &warmup, "3", "untimed steps first", NULL, 1, 1e6, 0},
      {"threads", CLI_INT, &threads, "1", "intra-op threads (0: all cores)", NULL, 0, 1024, 0},
      {"peak-gflops", CLI_FLOAT, &peak, "0", "FMA peak of one core in GFLOP/s, for the share of peak (0: measured)", NULL, 0, 1e9, 0},
      {"seed", CLI_INT, &seed, "1", "seed of the weights and the tokens", NULL, 0, 9e18, 0},
      {"zero", CLI_INT, &zero, "0", "ZeRO stage across the ranks of tandem run (0: data parallel)", NULL, 0, 3, 0},
      {"zero-unit", CLI_INT, &zero_unit, "1", "--zero 3: transformer blocks per gathered unit", NULL, 1, 1e6, 0},
      {"tp", CLI_INT, &tp, "1", "tensor-parallel ranks (Megatron-style) among those of tandem run; the rest data parallel", NULL, 1, 1024, 0},
      {"bucket-mb", CLI_FLOAT, &bucket_mb, "25", "gradient bucket size in MiB", NULL, 0.001, 4096, 0},
      {"json", CLI_FLAG, &json, NULL, "print one JSON object instead of the table", NULL, 0, 0, 0},
      {"pp", CLI_INT, &pp, "1", "pipeline stages across the ranks of tandem run (the rest: data replicas)", NULL, 1, 4096, 0},
      {"schedule", CLI_CHOICE, &schedule, "1f1b", "--pp: the pipeline schedule", "gpipe|1f1b|interleaved|zb1p", 0, 0, 0},
      {"accum", CLI_INT, &accum, "1", "micro-batches per step (of --batch-size each; a pipeline's micro-batches)", NULL, 1, 1 << 20, 0},
      {"device", CLI_CHOICE, &device, "cpu", "where the step runs (cuda: one GPU, gpt only, fp32, --tf32 or --precision bf16, single process)", "cpu|cuda", 0, 0, 0},
      {"tf32", CLI_FLAG, &tf32, NULL, "--device cuda: TF32 tensor cores for the fp32 products", NULL, 0, 0, 0},
      {"profile", CLI_FLAG, &profile, NULL, "--device cuda: after the timed steps, 3 more with CUDA events between kernel groups: the device time by group", NULL, 0, 0, 0},
      {"peak-tflops", CLI_FLOAT, &peak_tflops, "989.4", "--device cuda: the peak for MFU (default H100 SXM dense bf16)", NULL, 1e-3, 1e6, 0},
  };
  int n = (int)(sizeof opts / sizeof opts[0]);
  if (llama) opts[0] = llama_config;
  int pr = cli_parse(llama ? "bench llama" : "bench gpt", "[options]", opts, n, argc, argv);
  if (pr) return pr == 1 ? 0 : 2;
  if (!llama && (kv_heads || ffn)) {
    fprintf(stderr, "tandem bench gpt: --kv-heads and --ffn-width apply to tandem bench llama\n");
    return 2;
  }
  tdm_model_config mc;
  int64_t given[5] = {layers, heads, width, block, vocab};
  if (llama) {
    if (tdm_model_config_llama(config, &mc) != TDM_OK) {
      fprintf(stderr, "tandem bench llama: %s\n", tdm_last_error());
      return 2;
    }
    int64_t g7[7] = {layers, heads, kv_heads, width, ffn, block, vocab};
    int64_t *field[7] = {&mc.n_layer, &mc.n_head, &mc.n_kv_head, &mc.n_embd, &mc.ffn_hidden, &mc.block_size, &mc.vocab_size};
    for (int i = 0; i < 7; i++)
      if (g7[i] > 0) *field[i] = g7[i];
  } else if (tdm_model_config_gpt(config, given, &mc) != TDM_OK) { /* the option table admits only the two names */
    fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
    return 2;
  }
  if (T > mc.block_size) {
    fprintf(stderr, "tandem bench gpt: --seq-len %lld exceeds the block size %lld\n", (long long)T, (long long)mc.block_size);
    return 2;
  }
  if (!strcmp(device, "cuda")) { /* one GPU: its own step (tools/bench_gpt_cuda.c) */
    const char *bad = llama ? "llama" : zero ? "--zero" : tp > 1 ? "--tp" : pp > 1 ? "--pp" : accum > 1 ? "--accum" : strcmp(recompute, "none") ? "--recompute" : strcmp(optimizer, "adamw") ? "--optimizer sgd" : getenv("WORLD_SIZE") && atoi(getenv("WORLD_SIZE")) > 1 ? "several ranks" : NULL;
    if (bad) {
      fprintf(stderr, "tandem bench %s --device cuda: %s is not on the CUDA backend yet (it runs one GPT on one GPU, fp32, --tf32 or --precision bf16, AdamW)\n",
              llama ? "llama" : "gpt", bad);
      return 2;
    }
    int prec = cuda_precision("bench gpt", !strcmp(precision, "bf16") ? TDM_BF16 : !strcmp(precision, "fp16") ? TDM_F16 : TDM_F32, tf32);
    if (prec < 0) return 2;
    return bench_gpt_cuda(&mc, B, T, steps, warmup, (uint64_t)seed, prec, peak_tflops, json, profile);
  }
  if (tf32 || profile) {
    fprintf(stderr, "tandem bench gpt: --%s applies to --device cuda\n", tf32 ? "tf32" : "profile");
    return 2;
  }
  if (tdm_set_num_threads((int)threads) != TDM_OK) {
    fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
    return 2;
  }
  tdm_comm_t comm = NULL;
  tdm_grid *grid = NULL;
  tdm_engine *eng = NULL;
  int64_t total = warmup + steps;
  double *t_fwd = calloc((size_t)total, sizeof(double)), *t_bwd = calloc((size_t)total, sizeof(double)),
         *t_opt = calloc((size_t)total, sizeof(double)), *t_all = calloc((size_t)total, sizeof(double)),
         *t_wait = calloc((size_t)total, sizeof(double));
  int rc = 1, R = 0, W = 1;
  if (!t_fwd || !t_bwd || !t_opt || !t_all || !t_wait) {
    fprintf(stderr, "tandem bench: out of memory\n");
    goto out;
  }
  tdm_comm_config cc;
  tdm_status st = tdm_comm_config_from_env(&cc);
  if (st == TDM_OK && cc.size > 1) st = tdm_comm_create(&comm, &cc);
  R = comm ? tdm_comm_rank(comm) : 0, W = comm ? tdm_comm_size(comm) : 1;
  tdm_optim_config oc = tdm_optim_config_default(strcmp(optimizer, "sgd") ? TDM_OPT_ADAMW : TDM_OPT_SGD);
  if (oc.kind == TDM_OPT_ADAMW) oc.lr = 3e-4f, oc.beta2 = 0.95f, oc.weight_decay = 0.1f, oc.decay_matrices_only = 1;
  tdm_engine_config ec = tdm_engine_config_default();
  ec.kind = pp > 1 ? TDM_ENGINE_PIPELINE : tp > 1 ? TDM_ENGINE_TP : zero ? TDM_ENGINE_ZERO : TDM_ENGINE_DP;
  if ((tp > 1 || pp > 1) && zero > 1) {
    fprintf(stderr, "tandem bench gpt: --%s with --zero %lld: the data axis beside it runs ZeRO stage 1 at most (use --zero 0 or 1)\n",
            tp > 1 && pp == 1 ? "tp" : "pp", (long long)zero);
    goto out;
  }
  ec.tp.zero_stage = tp > 1 && pp == 1 ? (int)zero : 0;
  ec.pp.zero_stage = pp > 1 ? (int)zero : 0;
  ec.accum = accum;
  ec.pp.seq_len = T; /* a pipeline's cut balanced for these sequences */
  if (pp > 1 && tdm_pp_schedule_parse(schedule, &ec.pp.schedule) != TDM_OK) st = TDM_ERR_INVALID_ARG;
  ec.zero.stage = zero ? (int)zero : 1;
  ec.zero.unit_modules = (int)zero_unit;
  ec.dp.bucket_bytes = ec.zero.bucket_bytes = (size_t)(bucket_mb * 1048576.0);
  ec.precision = !strcmp(precision, "bf16") ? TDM_BF16 : !strcmp(precision, "fp16") ? TDM_F16 : TDM_F32;
  ec.recompute = !strcmp(recompute, "block") ? TDM_RECOMPUTE_BLOCK : !strcmp(recompute, "selective") ? TDM_RECOMPUTE_SELECTIVE : TDM_RECOMPUTE_NONE;
  if (st == TDM_OK) st = tdm_engine_check(&mc, &ec, W, 0, (int)tp, (int)pp);
  if (st == TDM_OK) st = tdm_grid_create(&grid, comm, 0, (int)tp, (int)pp);
  if (st == TDM_OK) st = tdm_engine_create(&eng, &mc, (uint64_t)seed, &oc, grid, &ec);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem bench: %s\n", tdm_last_error());
    goto out;
  }
  tdm_params *params = tdm_model_params(tdm_engine_model(eng));
  bench_tokens bt = {B, T, mc.vocab_size, {{0}}};
  /* each data replica its own batch (tensor-parallel peers and a pipeline's stages draw the same) */
  tdm_rng_seed(&bt.rng, (uint64_t)seed + 1 + (uint64_t)tdm_grid_index(grid, TDM_AXIS_DATA));
  uint64_t allocs_before = 0, sent_before = 0;
  double cpu_before = 0;
  for (int64_t s = 0; s < total; s++) {
    if (s == warmup)
      allocs_before = tdm_alloc_count(), tdm_mem_peak_reset(), sent_before = bytes_sent(grid), cpu_before = cpu_s();
    double t0 = tdm_time_now();
    tdm_step_stats ss;
    if (tdm_engine_step(eng, random_tokens, &bt, (uint64_t)s, oc.lr, &ss) != TDM_OK) {
      fprintf(stderr, "tandem bench: step %lld: %s\n", (long long)s, tdm_last_error());
      goto out;
    }
    t_all[s] = (tdm_time_now() - t0) * 1e3;
    t_fwd[s] = ss.t_forward * 1e3, t_bwd[s] = ss.t_backward * 1e3, t_opt[s] = ss.t_update * 1e3, t_wait[s] = ss.t_comm_wait * 1e3;
  }
  uint64_t allocs = tdm_alloc_count() - allocs_before;
  /* rank 0's bytes per step, and as a multiple of Ψ(N-1)/N f32 elements (theory: 2 at stages 0-2, 3 at stage 3) */
  double sent = (double)(bytes_sent(grid) - sent_before) / (double)steps;
  /* rank 0's CPU time per step, all its threads: unlike the step time, not stretched while other jobs hold the cores */
  double cpu_ms = (cpu_s() - cpu_before) * 1e3 / (double)steps;
  int nt = tdm_get_num_threads();
  int64_t np = tdm_params_numel(params), C = mc.n_embd, L = mc.n_layer;
  /* nanoGPT's convention: 6 FLOPs per parameter and token (position embeddings excluded, the tied
   * lm_head counted once; a Llama's untied input embedding excluded: a lookup) plus 12 L C T per
   * token for attention (full T x T, as if unmasked) */
  int64_t lookup = llama ? (mc.tie_embeddings ? 0 : mc.vocab_size * C) : mc.block_size * C;
  double flops = (6.0 * (double)(np - lookup) + 12.0 * (double)(L * C * T)) * (double)(B * T * accum) / (double)pp; /* per rank */
  double ms = tdm_median(t_all + warmup, (size_t)steps), fwd = tdm_median(t_fwd + warmup, (size_t)steps),
         bwd = tdm_median(t_bwd + warmup, (size_t)steps), optm = tdm_median(t_opt + warmup, (size_t)steps),
         wait = tdm_median(t_wait + warmup, (size_t)steps);
  tdm_mem_stats mem;
  tdm_mem_stats_get(&mem);
  struct rusage ru; /* before the floor measurement, which allocates its own arrays */
  getrusage(RUSAGE_SELF, &ru);
  double rss_mib = (double)ru.ru_maxrss / 1024.0, held = (double)mem.peak_total;
  /* each rank's bubble: the share of its step (without the update) spent not computing; and its
   * activations at the peak: gathered for rank 0 to print, stage by stage */
  double *stage = calloc((size_t)(4 * W), sizeof(double));
  if (!stage) goto out;
  for (int64_t k = warmup; k < total; k++) t_all[k] -= t_opt[k];
  double step_wo = tdm_median(t_all + warmup, (size_t)steps), busy_ms = fwd + bwd;
  double mine[4] = {step_wo > 0 ? 1.0 - busy_ms / step_wo : 0, busy_ms, (double)mem.peak[TDM_MEM_ACTIVATIONS] / 1048576.0,
                    (double)mem.peak_total / 1048576.0};
  if (comm && tdm_comm_allgather(comm, mine, stage, 4, TDM_F64, TDM_ALGO_AUTO) != TDM_OK) {
    fprintf(stderr, "tandem bench gpt: %s\n", tdm_last_error());
    free(stage);
    goto out;
  }
  if (!comm) memcpy(stage, mine, sizeof mine);
  if (comm) { /* the largest of any rank; the step time is rank 0's */
    double mx[2] = {rss_mib, held};
    if (tdm_comm_allreduce(comm, mx, mx, 2, TDM_F64, TDM_MAX, TDM_ALGO_AUTO) != TDM_OK) {
      fprintf(stderr, "tandem bench: %s\n", tdm_last_error());
      goto out;
    }
    rss_mib = mx[0], held = mx[1];
  }
  if (R != 0) {
    rc = 0;
    free(stage);
    goto out;
  }
  double fl_ms = floor_ms(np, 7);
  /* data parallelism's theory (4 bytes x Psi(N-1)/N); tensor parallelism sends activations, not that */
  double sent_psi = W > 1 && tp == 1 ? sent / (4.0 * (double)np * (double)(W - 1) / (double)W) : 0;
  int peak_measured = peak <= 0;
  if (peak_measured) peak = tdm_fma_peak_gflops(); /* after the timed steps: it keeps a core busy 0.1 s */
  if (peak <= 0) peak = 102.5, peak_measured = 0; /* not measurable here: two 256-bit FMAs at 3.2 GHz */
  double frac = flops / (double)tp / (ms * 1e-3) / (peak * 1e9 * nt); /* tensor parallelism: a T-th each */
  if (json) {
    printf("{\"model\":\"%s\",\"config\":\"%s\",\"layers\":%lld,\"heads\":%lld,\"width\":%lld,\"vocab\":%lld,\"batch\":%lld,\"seq\":%lld,"
           "\"threads\":%d,\"params\":%lld,\"ms\":%.3f,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"opt_ms\":%.3f,\"gflop\":%.4f,"
           "\"peak_fraction\":%.4f,\"opt_floor_ms\":%.3f,\"allocs_per_step\":%.3f,\"peak_rss_mib\":%.1f,"
           "\"ranks\":%d,\"zero\":%lld,\"tp\":%lld,\"comm_wait_ms\":%.3f,\"cpu_ms\":%.3f,\"sent_bytes_per_step\":%.0f,"
           "\"sent_psi\":%.4f,\"held_mib\":%.2f,\"recompute\":\"%s\",\"precision\":\"%s\"",
           llama ? "llama" : "gpt", config, (long long)L, (long long)mc.n_head, (long long)C, (long long)mc.vocab_size, (long long)B,
           (long long)T, nt, (long long)np, ms, fwd, bwd, optm, flops * 1e-9, frac, fl_ms, (double)allocs / (double)steps, rss_mib, W,
           (long long)zero, (long long)tp, wait, cpu_ms, sent, sent_psi, held / 1048576.0, recompute, precision);
    for (int k = 0; k < TDM_MEM_COUNT; k++)
      printf(",\"%s_mib\":%.2f", tdm_mem_category_name((tdm_mem_category)k), (double)mem.peak[k] / 1048576.0);
    printf(",\"pp\":%lld,\"accum\":%lld,\"schedule\":\"%s\",\"ranks_detail\":[", (long long)pp, (long long)accum,
           pp > 1 ? schedule : "none");
    for (int r = 0; r < W; r++)
      printf("%s{\"bubble\":%.4f,\"busy_ms\":%.3f,\"activations_mib\":%.2f,\"held_mib\":%.2f}", r ? "," : "", stage[4 * r],
             stage[4 * r + 1], stage[4 * r + 2], stage[4 * r + 3]);
    printf("]}\n");
  } else {
    printf("# tandem %s step: %lld layers, %lld heads, width %lld, vocab %lld (%lld parameters), B=%lld T=%lld, %d thread%s; %s; recompute %s, precision %s\n",
           llama ? "Llama" : "GPT", (long long)L, (long long)mc.n_head, (long long)C, (long long)mc.vocab_size, (long long)np, (long long)B,
           (long long)T, nt, nt == 1 ? "" : "s", tdm_engine_describe(eng), recompute, precision);
    printf("step        %9.2f ms (median of %lld)\n", ms, (long long)steps);
    printf("  CPU time  %9.2f ms per step, every thread of rank 0 (mean)\n", cpu_ms);
    if (W > 1)
      printf("  comm wait %9.2f ms (%s)\n", wait,
             tp > 1 ? "the tensor-parallel all-reduces of forward and backward, then data parallelism's" : "what backward did not hide");
    if (W > 1 && tp == 1)
      printf("  sent      %9.2f MiB per step by rank 0: %.3f x 4 bytes x Ψ(N-1)/N\n", sent / 1048576.0, sent_psi);
    else if (W > 1)
      printf("  sent      %9.2f MiB per step by rank 0 (world and axes)\n", sent / 1048576.0);
    printf("  forward   %9.2f ms\n  backward  %9.2f ms\n  optimizer %9.2f ms (%s; memory-traffic floor %.2f ms, %.2fx%s)\n",
           fwd, bwd, optm, oc.kind == TDM_OPT_SGD ? "SGD" : "AdamW", fl_ms, optm / fl_ms,
           isnan(optm / fl_ms) ? ": no memory bandwidth measured to set the floor" : "");
    printf("model FLOPs %9.2f GFLOP per step: %.1f GFLOP/s, %.1f%% of the FMA peak (%.1f GFLOP/s%s x %d; OpenBLAS's %s kernels)\n",
           flops * 1e-9, flops / (ms * 1e-3) * 1e-9, 100 * frac, peak, peak_measured ? " measured" : "", nt, tdm_blas_core());
    printf("allocations %9.2f per steady-state step\npeak RSS    %9.1f MiB%s\n", (double)allocs / (double)steps, rss_mib,
           W > 1 ? " (the largest of any rank)" : "");
    printf("held        %9.1f MiB at the peak (rank 0:", held / 1048576.0);
    for (int k = 0; k < TDM_MEM_COUNT; k++)
      printf(" %s %.1f%s", tdm_mem_category_name((tdm_mem_category)k), (double)mem.peak[k] / 1048576.0, k + 1 < TDM_MEM_COUNT ? "," : ")\n");
    for (int r = 0; pp > 1 && r < W; r++)
      printf("rank %-3d    bubble %.3f of its step (update excluded), computing %.2f ms, activations %.2f MiB at the peak\n", r,
             stage[4 * r], stage[4 * r + 1], stage[4 * r + 2]);
  }
  free(stage);
  rc = 0;
out:
  tdm_engine_destroy(eng);
  tdm_grid_destroy(grid);
  tdm_comm_destroy(comm);
  free(t_fwd), free(t_bwd), free(t_opt), free(t_all), free(t_wait);
  return rc;
}

int tool_bench_gpt(int argc, char **argv) { return bench_lm(argc, argv, 0); }
int tool_bench_llama(int argc, char **argv) { return bench_lm(argc, argv, 1); }
