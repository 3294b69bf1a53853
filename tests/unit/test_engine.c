/* Parallelism engines in one process over the thread transport: every layout equals one process.
 * A "job" trains a small model for a few steps on P ranks (threads) with one engine and returns
 * the final parameters; the same global batch goes through every layout. */
#include <pthread.h>

#include "tdm_test.h"
#include "token_batch.h"

typedef struct {
  tdm_model_config mc;
  tdm_optim_config oc;
  tdm_engine_config ec;
  int P, steps;
  int64_t B; /* samples per rank and micro-batch */
  int64_t T; /* gpt: tokens per sample */
} job;

typedef struct {
  const job *j;
  int r;
  void *group;
  float *out;      /* rank 0: the final parameters */
  int64_t numel;
  double loss;     /* rank 0's last step loss, for the record */
  tdm_mem_stats mem;
  tdm_status st;
  char err[512];
} rank_arg;

typedef struct {
  const job *j;
  int r;
  int64_t step;
} batch_ctx;

/* Deterministic data: sample s of step t is a function of (t, s) alone, so every layout sees the
 * same global batch. MLP: features in [-1, 1) and a class; GPT: tokens. */
static tdm_status next_batch(void *vctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  batch_ctx *c = vctx;
  const job *j = c->j;
  int64_t first = (micro * j->P + c->r) * j->B; /* as the sampler slices a global batch */
  *base = first;
  if (j->mc.kind == TDM_MODEL_GPT || j->mc.kind == TDM_MODEL_LLAMA)
    return tdm_test_token_batch(tp, c->step, first, j->B, j->T, j->mc.vocab_size, x, y);
  int cnn = j->mc.kind == TDM_MODEL_CNN;
  int64_t F = cnn ? j->mc.in_channels * j->mc.height * j->mc.width : j->mc.in_features, xs[4] = {j->B, F}, ys[1] = {j->B};
  if (cnn) xs[1] = j->mc.in_channels, xs[2] = j->mc.height, xs[3] = j->mc.width;
  *x = tdm_new(tp, TDM_F32, cnn ? 4 : 2, xs);
  *y = tdm_new(tp, TDM_I32, 1, ys);
  if (!*x || !*y) return tdm_tape_status(tp);
  float *xd = tdm_tensor_data(*x);
  int32_t *yd = tdm_tensor_data(*y);
  for (int64_t i = 0; i < j->B; i++) {
    for (int64_t f = 0; f < F; f++)
      xd[i * F + f] = (float)(tdm_hash64((uint64_t)c->step * 7919 + (uint64_t)(first + i), (uint64_t)f) % 2000) / 1000.0f - 1.0f;
    yd[i] = (int32_t)(tdm_hash64((uint64_t)c->step, (uint64_t)(first + i)) % (uint64_t)j->mc.n_classes);
  }
  return TDM_OK;
}

static void *rank_main(void *va) {
  rank_arg *a = va;
  const job *j = a->j;
  tdm_comm_t comm = NULL;
  tdm_grid *grid = NULL;
  tdm_engine *e = NULL;
  tdm_status st = TDM_OK;
  if (j->P > 1) {
    tdm_comm_config cc = {0};
    cc.rank = a->r, cc.size = j->P, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
    st = tdm_comm_create(&comm, &cc);
  }
  if (st == TDM_OK) st = tdm_grid_create(&grid, comm, 0, 1, 1);
  if (st == TDM_OK) st = tdm_engine_create(&e, &j->mc, 42, &j->oc, grid, &j->ec);
  /* the peaks of the steps alone: every rank's engine made before one resets them (the counts are
   * the process's, and a rank still making its engine would add its transients) */
  if (st == TDM_OK && comm) st = tdm_comm_barrier(comm);
  if (st == TDM_OK && a->r == 0) tdm_mem_peak_reset();
  if (st == TDM_OK && comm) st = tdm_comm_barrier(comm);
  for (int t = 0; st == TDM_OK && t < j->steps; t++) {
    batch_ctx bc = {j, a->r, t};
    tdm_step_stats ss;
    st = tdm_engine_step(e, next_batch, &bc, tdm_hash64(42, (uint64_t)t), j->oc.lr, &ss);
    a->loss = ss.loss;
  }
  if (st == TDM_OK && comm) st = tdm_comm_barrier(comm); /* and before any rank takes its engine apart */
  if (st == TDM_OK) tdm_mem_stats_get(&a->mem);
  if (st == TDM_OK && comm) st = tdm_comm_barrier(comm);
  if (st == TDM_OK) {
    a->numel = tdm_params_numel(tdm_model_params(tdm_engine_model(e)));
    float *buf = malloc(sizeof(float) * (size_t)a->numel);
    st = tdm_engine_read_params(e, 0, a->numel, buf);
    if (a->r == 0) a->out = buf;
    else free(buf);
  }
  a->st = st;
  if (st != TDM_OK) {
    snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
    if (comm) tdm_comm_abort(comm);
  }
  tdm_engine_destroy(e);
  tdm_grid_destroy(grid);
  tdm_comm_destroy(comm);
  return NULL;
}

/* Runs the job; returns rank 0's final parameters (malloc'd) or NULL, and *n their count. */
static float *run_job(const job *j, int64_t *n, tdm_mem_stats *mem) {
  void *group = NULL;
  if (j->P > 1) CHECK_OK(tdm_comm_thread_group_create(&group, j->P));
  pthread_t th[8];
  rank_arg args[8];
  for (int r = 0; r < j->P; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].j = j, args[r].r = r, args[r].group = group;
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < j->P; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < j->P; r++)
    CHECK_MSG(args[r].st == TDM_OK, "%s stage %d, %d ranks: rank %d: %s", tdm_engine_kind_name(j->ec.kind), j->ec.zero.stage,
              j->P, r, args[r].err);
  if (group) tdm_comm_thread_group_destroy(group);
  *n = args[0].numel;
  if (mem) *mem = args[0].mem;
  return args[0].st == TDM_OK ? args[0].out : (free(args[0].out), NULL);
}

static unsigned char *skip; /* elements left out of the comparison with one process */
static double max_rel_diff(const float *a, const float *b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    if (skip && skip[i]) continue;
    double d = fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-3);
    if (!(d <= worst)) worst = d; /* NaN fails */
  }
  return worst;
}

static job mlp_job(int P, int64_t accum, int64_t B) {
  job j;
  memset(&j, 0, sizeof j);
  j.mc = tdm_model_config_mlp();
  j.mc.in_features = 40, j.mc.n_hidden = 2, j.mc.hidden[0] = 64, j.mc.hidden[1] = 48, j.mc.n_classes = 5;
  j.mc.dropout = 0.2f;
  j.oc = tdm_optim_config_default(TDM_OPT_SGD);
  j.oc.lr = 0.05f, j.oc.momentum = 0.9f, j.oc.weight_decay = 0.01f;
  j.ec = tdm_engine_config_default();
  j.ec.accum = accum;
  j.ec.clip = 0.5f; /* small enough that clipping happens */
  j.ec.zero.bucket_bytes = 4096; /* several buckets */
  j.P = P, j.steps = 4, j.B = B;
  return j;
}

/* Adam: the 1e-4 relative, element by element. */
static job mlp_adam_job(int P, int64_t accum, int64_t B) {
  job j = mlp_job(P, accum, B);
  j.oc = tdm_optim_config_default(TDM_OPT_ADAM);
  j.oc.lr = 1e-3f;
  return j;
}
/* The small CNN (two convolutions with pooling, dropout, a linear head) on 8x8 images. */
static job cnn_job(int P, int64_t accum, int64_t B) {
  job j = mlp_job(P, accum, B);
  j.mc = tdm_model_config_cnn();
  j.mc.height = 8, j.mc.width = 8, j.mc.c1 = 4, j.mc.c2 = 6, j.mc.n_classes = 5, j.mc.dropout = 0.2f;
  j.ec.zero.bucket_bytes = 1024; /* several buckets */
  return j;
}

static job gpt_job(int P, int64_t accum, int64_t B) {
  job j;
  memset(&j, 0, sizeof j);
  j.mc = tdm_model_config_gpt_mini();
  j.mc.n_layer = 2, j.mc.n_head = 2, j.mc.n_embd = 16, j.mc.block_size = 8, j.mc.vocab_size = 37, j.mc.dropout = 0.1f;
  j.oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  j.oc.lr = 1e-2f, j.oc.weight_decay = 0.1f, j.oc.decay_matrices_only = 1;
  j.ec = tdm_engine_config_default();
  j.ec.accum = accum;
  j.ec.clip = 1.0f;
  j.ec.zero.bucket_bytes = 2048;
  j.P = P, j.steps = 3, j.B = B, j.T = 8;
  return j;
}

/* Llama through the same engines: grouped-query attention, rotary embeddings, SwiGLU, RMSNorm, an
 * untied head; dropout on, so its masks must follow the samples across layouts too. */
static job llama_job(int P, int64_t accum, int64_t B) {
  job j = gpt_job(P, accum, B);
  CHECK_OK(tdm_model_config_llama("llama-mini", &j.mc));
  j.mc.n_layer = 2, j.mc.n_head = 4, j.mc.n_kv_head = 2, j.mc.n_embd = 16, j.mc.ffn_hidden = 24, j.mc.block_size = 8;
  j.mc.vocab_size = 37, j.mc.dropout = 0.1f;
  return j;
}

static const char *job_name(job (*make)(int, int64_t, int64_t)) {
  return make == mlp_job ? "mlp" : make == mlp_adam_job ? "mlp (adam)" : make == cnn_job ? "cnn" : make == gpt_job ? "gpt" : "llama";
}

/* ||a - b|| / ||b|| over the elements not skipped. */
static double norm_rel_diff(const float *a, const float *b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) {
    if (skip && skip[i]) continue;
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    r += (double)b[i] * b[i];
  }
  return sqrt(d / (r > 0 ? r : 1));
}

static void set_stage(job *j, int stage) {
  j->ec.kind = stage ? TDM_ENGINE_ZERO : TDM_ENGINE_DP;
  j->ec.zero.stage = stage ? stage : 1;
}

/* ZeRO stages 1, 2, 3 give data parallelism's bits (stage 0); and each layout equals one process with
 * the P-times batch within the tolerance of a different summation order: element by element, or
 * (normwise) as ||w - w1|| / ||w1||, for Adam, whose normalisation turns the rounding noise of
 * gradients near zero into updates near lr. */
static void check_layouts(job (*make)(int, int64_t, int64_t), int64_t B, double tol, int normwise) {
  for (int64_t accum = 1; accum <= 2; accum++) {
    for (int P = 1; P <= 4; P++) {
      job one = make(1, accum, B * P);
      int64_t n1, n;
      float *ref = run_job(&one, &n1, NULL), *stage0 = NULL;
      for (int stage = 0; stage <= 3; stage++) {
        job j = make(P, accum, B);
        set_stage(&j, stage);
        float *w = run_job(&j, &n, NULL);
        if (!w || !ref) {
          free(w);
          continue;
        }
        double d = normwise ? norm_rel_diff(w, ref, n) : max_rel_diff(w, ref, n);
        CHECK_MSG(d <= tol, "%s accum %lld, %d ranks, stage %d vs 1 process: %.3g relative%s", job_name(make),
                  (long long)accum, P, stage, d, normwise ? " (norm of the difference)" : "");
        if (stage == 0) stage0 = w;
        else {
          if (stage0)
            CHECK_MSG(!memcmp(w, stage0, sizeof(float) * (size_t)n), "%s accum %lld, %d ranks: stage %d differs from stage 0 (%.3g)",
                      job_name(make), (long long)accum, P, stage, max_rel_diff(w, stage0, n));
          free(w);
        }
      }
      free(stage0);
      free(ref);
    }
  }
}

static void test_mlp_every_layout(void) { check_layouts(mlp_job, 6, 1e-5, 0); }
static void test_cnn_every_layout(void) { check_layouts(cnn_job, 3, 1e-5, 0); }

static void test_mlp_adam_every_layout(void) { check_layouts(mlp_adam_job, 6, 1e-4, 0); }

/* With AdamW the GPT's key bias (the middle third of c_attn.bias) is left out of the comparison
 * with one process: its gradient is exactly zero in exact arithmetic (softmax ignores a shift of
 * every key by the same vector), so what is there is rounding noise, which Adam's normalisation
 * turns into updates of about lr (the golden test leaves it out for the same reason). Between
 * layouts of one world size nothing is left out: they must agree bit for bit. */
static void test_gpt_every_layout(void) {
  job j = gpt_job(1, 1, 1);
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &j.mc, 1));
  tdm_params *p = tdm_model_params(m);
  skip = calloc((size_t)tdm_params_numel(p), 1);
  for (int64_t l = 0; l < j.mc.n_layer; l++) {
    char name[64];
    snprintf(name, sizeof name, "transformer.h.%lld.attn.c_attn.bias", (long long)l);
    float *b = tdm_tensor_data(tdm_params_find(p, name));
    memset(skip + (b - tdm_params_data(p)) + j.mc.n_embd, 1, (size_t)j.mc.n_embd);
  }
  tdm_model_destroy(m);
  check_layouts(gpt_job, 2, 1e-4, 1);
  free(skip);
  skip = NULL;
}

/* Llama as GPT: every ZeRO stage gives data parallelism's bits, and each layout equals one process. */
static void test_llama_every_layout(void) { check_layouts(llama_job, 2, 1e-4, 1); }

/* Activation recomputation through the engines: block and selective recomputation leave every bit
 * of the weights after a few steps unchanged, with data parallelism and at ZeRO stage 3 (whose
 * units are gathered again for the recomputed blocks), for the GPT and the Llama. */
static void test_recompute_keeps_the_bits(void) {
  job (*makes[2])(int, int64_t, int64_t) = {gpt_job, llama_job};
  for (int k = 0; k < 2; k++)
    for (int stage = 0; stage <= 3; stage += 3) {
      int64_t n;
      job j = makes[k](2, 2, 2);
      set_stage(&j, stage);
      float *ref = run_job(&j, &n, NULL);
      for (int mode = TDM_RECOMPUTE_BLOCK; ref && mode < TDM_RECOMPUTE_COUNT; mode++) {
        j.ec.recompute = (tdm_recompute)mode;
        float *w = run_job(&j, &n, NULL);
        CHECK_MSG(w && !memcmp(w, ref, sizeof(float) * (size_t)n), "%s stage %d, recompute %s: weights differ (%.3g)",
                  job_name(makes[k]), stage, tdm_recompute_name((tdm_recompute)mode), w ? max_rel_diff(w, ref, n) : -1.0);
        free(w);
      }
      free(ref);
    }
}

/* Stage 3 on 4 ranks never holds the whole model: the parameter bytes of its 4 ranks together
 * peak at half of what stage 0's hold (a quarter each plus the few units gathered at a time), and
 * the accounting returns to zero afterwards. */
static void test_stage3_memory(void) {
  int64_t peak[2], n;
  for (int k = 0; k < 2; k++) {
    job j = gpt_job(4, 1, 2);
    j.mc.n_layer = 12, j.mc.n_embd = 32, j.mc.vocab_size = 64;
    set_stage(&j, k ? 3 : 0);
    tdm_mem_stats m;
    free(run_job(&j, &n, &m));
    peak[k] = m.peak[TDM_MEM_PARAMS];
    tdm_mem_stats_get(&m);
    CHECK_MSG(m.current[TDM_MEM_PARAMS] == 0 && m.current[TDM_MEM_GRADS] == 0, "stage %d leaves %lld + %lld bytes counted",
              k ? 3 : 0, (long long)m.current[TDM_MEM_PARAMS], (long long)m.current[TDM_MEM_GRADS]);
  }
  CHECK_MSG(peak[0] >= 4 * 4 * n && peak[1] < 0.55 * (double)peak[0], "parameter bytes at peak: stage 0 %lld, stage 3 %lld",
            (long long)peak[0], (long long)peak[1]);
}

/* A language model's large tables (a vocabulary of 40,000: ten blocks of TDM_HEAD_ROWS rows; the
 * GPT's tied, the Llama's embedding and untied head) are read and differentiated a block of rows
 * at a time, each block a bucket or unit of its own: on 4 ranks every ZeRO stage gives stage 0's
 * bits (with accumulation: stage 3); stage 3's ranks together hold at their peak under 0.7 of
 * stage 0's parameter bytes and stages 2 and 3 under 0.6 of its gradient bytes (a whole table
 * gathered, or its gradient held whole, held more than stage 0: each rank a whole table besides
 * its shard). */
static void test_large_tables(void) {
  job (*makes[2])(int, int64_t, int64_t) = {gpt_job, llama_job};
  for (int k = 0; k < 2; k++)
    for (int64_t accum = 1; accum <= 2; accum++) {
      int64_t peak[4][2], n;
      float *w[4];
      for (int s = 0; s < 4; s++) {
        w[s] = NULL, peak[s][0] = peak[s][1] = 1;
        if (accum > 1 && (s == 1 || s == 2)) continue; /* accumulation: stage 3 against stage 0 */
        job j = makes[k](4, accum, 1);
        j.mc.vocab_size = 40000, j.mc.n_layer = 1, j.steps = 2, j.mc.n_embd = 8;
        set_stage(&j, s);
        tdm_mem_stats m;
        w[s] = run_job(&j, &n, &m);
        peak[s][0] = m.peak[TDM_MEM_PARAMS], peak[s][1] = m.peak[TDM_MEM_GRADS];
        if (s)
          CHECK_MSG(w[0] && w[s] && !memcmp(w[0], w[s], sizeof(float) * (size_t)n), "%s accum %lld: stage %d differs from stage 0 (%.3g)",
                    job_name(makes[k]), (long long)accum, s, w[0] && w[s] ? max_rel_diff(w[s], w[0], n) : -1.0);
      }
      double rp = (double)peak[3][0] / (double)peak[0][0], rg = (double)peak[3][1] / (double)peak[0][1];
      double rg2 = (double)peak[2][1] / (double)peak[0][1];
      if (accum > 1)
        printf("  %s, accumulation %lld: stage 3 = stage 0 bit for bit; at the peak it holds %.2fx stage 0's parameter bytes and %.2fx "
               "its gradient bytes (whole between micro-batches)\n", job_name(makes[k]), (long long)accum, rp, rg);
      else
        printf("  %s: stages 1-3 = stage 0 bit for bit; at the peak stage 3 holds %.2fx its parameter bytes and %.2fx its gradient "
               "bytes, stage 2 %.2fx its gradient bytes\n", job_name(makes[k]), rp, rg, rg2);
      if (accum == 1) /* with accumulation the gradients stay whole between micro-batches, as FSDP's no_sync */
        CHECK_MSG(rp < 0.7 && rg < 0.6 && rg2 < 0.6, "%s: stage 3 holds %.2fx stage 0's parameter bytes and %.2fx its gradient "
                  "bytes at the peak, stage 2 %.2fx its gradient bytes", job_name(makes[k]), rp, rg, rg2);
      for (int s = 0; s < 4; s++) free(w[s]);
    }
}

/* Stage 2 of a model whose whole gradient is no larger than stage 2 holds at its peak (the shard
 * and the buckets in flight; here one 25 MiB bucket holds the MLP's 2 MB) reduces in place in a
 * shared buffer as stage 1 does: stage 0's bits, stage 1's gradient bytes at the peak; with the
 * shared buffer turned off (TANDEM_DP_ZERO_COPY=0) the private path holds more (the shard besides
 * the bucket) and keeps the bits. */
static void test_stage2_in_place(void) {
  int64_t n, peak[4];
  float *w[4];
  for (int s = 0; s < 4; s++) {
    job j = mlp_job(2, 1, 6);
    j.ec.zero.bucket_bytes = 0; /* 25 MiB */
    set_stage(&j, s == 3 ? 2 : s);
    if (s == 3) setenv("TANDEM_DP_ZERO_COPY", "0", 1);
    tdm_mem_stats m;
    w[s] = run_job(&j, &n, &m);
    peak[s] = m.peak[TDM_MEM_GRADS];
    unsetenv("TANDEM_DP_ZERO_COPY");
  }
  for (int s = 1; s < 4; s++)
    CHECK_MSG(w[0] && w[s] && !memcmp(w[0], w[s], sizeof(float) * (size_t)n), "%s: not stage 0's bits",
              s == 3 ? "stage 2, private" : s == 2 ? "stage 2, in place" : "stage 1");
  printf("  gradient bytes at the peak (2 ranks): stage 1 %lld, stage 2 in place %lld, stage 2 private %lld\n", (long long)peak[1],
         (long long)peak[2], (long long)peak[3]);
  CHECK_MSG(peak[2] == peak[1] && peak[3] > peak[1], "gradient bytes at the peak: stage 1 %lld, stage 2 in place %lld, private %lld",
            (long long)peak[1], (long long)peak[2], (long long)peak[3]);
  for (int s = 0; s < 4; s++) free(w[s]);
}

/* The process grid on 8 ranks as data 2 x tensor 2 x pipeline 2: coordinates from the rank
 * (tensor fastest, then pipeline, then data), and each axis's communicator holds exactly the ranks that differ only in that
 * coordinate, ordered by it (an all-gather of world ranks over each axis shows who is there). */
static void *grid_rank(void *va) {
  rank_arg *a = va;
  tdm_comm_config cc = {0};
  cc.rank = a->r, cc.size = 8, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 30;
  tdm_comm_t w = NULL;
  tdm_grid *g = NULL;
  CHECK_OK(tdm_comm_create(&w, &cc));
  CHECK_OK(tdm_grid_create(&g, w, 0, 2, 2));
  int t = a->r % 2, p = (a->r / 2) % 2, d = a->r / 4; /* tensor, then pipeline, then data */
  CHECK(g && tdm_grid_size(g, TDM_AXIS_DATA) == 2 && tdm_grid_index(g, TDM_AXIS_TENSOR) == t &&
        tdm_grid_index(g, TDM_AXIS_DATA) == d && tdm_grid_index(g, TDM_AXIS_PIPELINE) == p);
  for (int ax = 0; g && ax < TDM_AXIS_COUNT; ax++) {
    tdm_comm_t c = tdm_grid_comm(g, (tdm_grid_axis)ax);
    int32_t me = a->r, who[2] = {-1, -1};
    CHECK(c && tdm_comm_size(c) == 2 && tdm_comm_rank(c) == tdm_grid_index(g, (tdm_grid_axis)ax));
    if (c) CHECK_OK(tdm_comm_allgather(c, &me, who, 1, TDM_I32, TDM_ALGO_AUTO));
    int stride = ax == TDM_AXIS_TENSOR ? 1 : ax == TDM_AXIS_PIPELINE ? 2 : 4, base = a->r - tdm_grid_index(g, (tdm_grid_axis)ax) * stride;
    CHECK_MSG(who[0] == base && who[1] == base + stride, "rank %d, %s axis: members %d %d", a->r,
              tdm_grid_axis_name((tdm_grid_axis)ax), who[0], who[1]);
  }
  tdm_grid_destroy(g);
  tdm_grid *bad = NULL;
  CHECK(tdm_grid_create(&bad, w, 3, 2, 1) == TDM_ERR_INVALID_ARG && !bad);
  CHECK_ERR_HAS("data 3 x tensor 2 x pipeline 1 does not make the world size 8");
  tdm_comm_destroy(w);
  return NULL;
}

static void test_process_grid(void) {
  void *group;
  CHECK_OK(tdm_comm_thread_group_create(&group, 8));
  pthread_t th[8];
  rank_arg args[8];
  for (int r = 0; r < 8; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].r = r, args[r].group = group;
    pthread_create(&th[r], NULL, grid_rank, &args[r]);
  }
  for (int r = 0; r < 8; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(group);
  tdm_grid *one = NULL; /* one process: every axis of size 1, no communicator */
  CHECK_OK(tdm_grid_create(&one, NULL, 0, 1, 1));
  CHECK(one && tdm_grid_size(one, TDM_AXIS_DATA) == 1 && !tdm_grid_comm(one, TDM_AXIS_DATA));
  tdm_grid_destroy(one);
}

/* What each engine does not implement is refused before anything is built, naming the engine and
 * the setting (never run in f32 or without recomputing behind the caller's back): recomputation
 * in the tensor-parallel engine, fp16 (skipped steps) beside a parameter server. What they do
 * implement (mixed precision in the pipeline and tensor-parallel engines too) passes the same
 * check; data parallelism and ZeRO accept everything. */
static void test_model_side_refusals(void) {
  tdm_model_config mc = tdm_model_config_gpt_mini();
  struct {
    tdm_engine_kind kind;
    const char *name;
    int tensor, pipeline;
    const char *refused[3]; /* bf16, f16, recompute block: NULL accepted, else a part of the error */
  } eng[] = {{TDM_ENGINE_PIPELINE, "pipeline", 1, 2, {NULL, NULL, NULL}},
             {TDM_ENGINE_TP, "tp", 2, 1, {NULL, NULL, NULL}},
             {TDM_ENGINE_PS, "ps", 1, 1, {NULL, "fp16 skips the steps whose gradients overflow", NULL}}};
  for (int k = 0; k < 3; k++)
    for (int what = 0; what < 3; what++) {
      tdm_engine_config ec = tdm_engine_config_default();
      ec.kind = eng[k].kind;
      if (what == 0) ec.precision = TDM_BF16;
      if (what == 1) ec.precision = TDM_F16;
      if (what == 2) ec.recompute = TDM_RECOMPUTE_BLOCK;
      ec.accum = 4;
      tdm_status st = tdm_engine_check(&mc, &ec, 2, 0, eng[k].tensor, eng[k].pipeline);
      if (!eng[k].refused[what]) {
        CHECK_MSG(st == TDM_OK, "%s engine, case %d: %s", eng[k].name, what, tdm_last_error());
        continue;
      }
      CHECK_MSG(st == TDM_ERR_NOT_SUPPORTED, "%s engine, case %d: status %d", eng[k].name, what, (int)st);
      const char *err = tdm_last_error();
      CHECK_MSG(strstr(err, eng[k].name) && strstr(err, eng[k].refused[what]), "%s engine, case %d: %s", eng[k].name, what, err);
      ec.precision = TDM_F32, ec.recompute = TDM_RECOMPUTE_NONE; /* the same layout in f32 passes */
      st = tdm_engine_check(&mc, &ec, 2, 0, eng[k].tensor, eng[k].pipeline);
      CHECK_MSG(st == TDM_OK, "%s engine in f32: %s", eng[k].name, tdm_last_error());
    }
  for (int kind = TDM_ENGINE_DP; kind <= TDM_ENGINE_ZERO; kind++) {
    tdm_engine_config ec = tdm_engine_config_default();
    ec.kind = (tdm_engine_kind)kind, ec.precision = TDM_F16, ec.recompute = TDM_RECOMPUTE_SELECTIVE;
    CHECK_MSG(tdm_engine_check(&mc, &ec, 2, 0, 1, 1) == TDM_OK, "engine %d: %s", kind, tdm_last_error());
  }
}

TDM_TEST_MAIN(T(test_mlp_every_layout), T(test_cnn_every_layout), T(test_mlp_adam_every_layout), T(test_gpt_every_layout), T(test_llama_every_layout), T(test_recompute_keeps_the_bits), T(test_stage3_memory), T(test_large_tables), T(test_stage2_in_place), T(test_process_grid),
              T(test_model_side_refusals))
