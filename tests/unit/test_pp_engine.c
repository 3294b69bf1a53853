/* The pipeline engine in one process over the thread transport: for P = 2, 3, 4 stages, M = 1, P,
 * 2P+1 micro-batches and every schedule, with dropout and clipping on, the weights after a few
 * steps are those of one process accumulating the same M micro-batches in the same order, bit for
 * bit; with a data axis (D replicas) those of data parallelism on D ranks. The loss, the gradient
 * norm and an evaluation agree too, and a stage that fails is named by the others. The same for
 * a Llama (P = 2, 3, every schedule, its head tied to the embedding and not), whose bad layouts
 * are refused alike. Mixed precision (bf16, fp16 with its loss scale) gives one process's bits in
 * the same precision, every schedule, GPT and Llama. */
#include <pthread.h>

#include "tdm_test.h"
#include "token_batch.h"

typedef struct {
  tdm_model_config mc;
  tdm_optim_config oc;
  tdm_engine_config ec;
  int D, P, steps;
  int64_t B, T;
  int die_rank;  /* >= 0: this rank stops before its second step (a stage that dies) */
  int bad_rank;  /* > 0: this rank's second step gets a target outside the vocabulary (its loss fails) */
} job;

typedef struct {
  const job *j;
  int r;
  void *group;
  float *out;
  int64_t numel;
  double loss[8], norm[8], eval_loss, eval_correct;
  tdm_status st;
  char err[512];
} rank_arg;

typedef struct {
  const job *j;
  int d;  /* data index */
  int64_t step;
  int bad; /* a target outside the vocabulary */
} batch_ctx;

/* Sample s of step t is a function of (t, s): every layout sees the same global batch, a data
 * replica d taking the slices (micro * D + d) as the sampler does. */
static tdm_status next_batch(void *vctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  batch_ctx *c = vctx;
  const job *j = c->j;
  int64_t first = (micro * j->D + c->d) * j->B;
  *base = first;
  tdm_status st = tdm_test_token_batch(tp, c->step, first, j->B, j->T, j->mc.vocab_size, x, y);
  if (st == TDM_OK && c->bad) ((int32_t *)tdm_tensor_data(*y))[0] = (int32_t)j->mc.vocab_size + 5;
  return st;
}

static void *rank_main(void *va) {
  rank_arg *a = va;
  const job *j = a->j;
  int pipeline = j->ec.kind == TDM_ENGINE_PIPELINE ? j->P : 1, W = j->D * pipeline;
  tdm_comm_t comm = NULL;
  tdm_grid *grid = NULL;
  tdm_engine *e = NULL;
  tdm_status st = TDM_OK;
  if (W > 1) {
    tdm_comm_config cc = {0};
    cc.rank = a->r, cc.size = W, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
    st = tdm_comm_create(&comm, &cc);
  }
  if (st == TDM_OK) st = tdm_grid_create(&grid, comm, j->D, 1, pipeline);
  if (st == TDM_OK) st = tdm_engine_create(&e, &j->mc, 42, &j->oc, grid, &j->ec);
  for (int t = 0; st == TDM_OK && t < j->steps; t++) {
    if (t == 1 && a->r == j->die_rank) { /* dies: its communicator closes, as a process's would */
      tdm_comm_abort(comm);
      st = TDM_ERR_REMOTE;
      snprintf(a->err, sizeof a->err, "died on purpose");
      break;
    }
    batch_ctx bc = {j, grid ? tdm_grid_index(grid, TDM_AXIS_DATA) : 0, t, j->bad_rank > 0 && a->r == j->bad_rank && t == 1};
    tdm_step_stats ss;
    st = tdm_engine_step(e, next_batch, &bc, tdm_hash64(42, (uint64_t)t), j->oc.lr, &ss);
    a->loss[t] = ss.loss, a->norm[t] = ss.grad_norm;
  }
  if (st == TDM_OK) { /* an evaluation of one batch */
    tdm_tape *tp = tdm_engine_tape(e);
    tdm_tape_reset(tp);
    batch_ctx bc = {j, 0, 1000, 0};
    tdm_tensor *x, *y;
    int64_t base;
    double rows;
    st = next_batch(&bc, tp, 0, &x, &y, &base);
    if (st == TDM_OK) st = tdm_engine_eval(e, x, y, &a->eval_loss, &a->eval_correct, &rows);
  }
  if (st == TDM_OK) {
    a->numel = tdm_params_numel(tdm_model_params(tdm_engine_model(e)));
    float *buf = malloc(sizeof(float) * (size_t)a->numel);
    st = tdm_engine_read_params(e, 0, a->numel, buf);
    if (a->r == 0) a->out = buf;
    else free(buf);
  }
  a->st = st;
  if (st != TDM_OK) {
    if (!a->err[0]) snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
    if (comm) tdm_comm_abort(comm);
  }
  tdm_engine_destroy(e);
  tdm_grid_destroy(grid);
  tdm_comm_destroy(comm);
  return NULL;
}

static rank_arg args[16];

/* Runs the job on D x P threads; returns rank 0's final parameters (malloc'd) or NULL. */
static float *run_job(const job *j, int64_t *n, int expect_ok) {
  int W = j->D * (j->ec.kind == TDM_ENGINE_PIPELINE ? j->P : 1);
  void *group = NULL;
  if (W > 1) CHECK_OK(tdm_comm_thread_group_create(&group, W));
  pthread_t th[16];
  for (int r = 0; r < W; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].j = j, args[r].r = r, args[r].group = group;
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; expect_ok && r < W; r++)
    CHECK_MSG(args[r].st == TDM_OK, "%s, D %d, P %d, M %lld: rank %d: %s", tdm_engine_kind_name(j->ec.kind), j->D, j->P,
              (long long)j->ec.accum, r, args[r].err);
  if (group) tdm_comm_thread_group_destroy(group);
  *n = args[0].numel;
  return args[0].st == TDM_OK ? args[0].out : (free(args[0].out), NULL);
}

static job gpt_job(int D, int P, int M, tdm_pp_schedule_kind sched, int V) {
  job j;
  memset(&j, 0, sizeof j);
  j.mc = tdm_model_config_gpt_mini();
  j.mc.n_layer = 8, j.mc.n_head = 2, j.mc.n_embd = 16, j.mc.block_size = 8, j.mc.vocab_size = 29, j.mc.dropout = 0.1f;
  j.oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  j.oc.lr = 1e-2f, j.oc.weight_decay = 0.1f, j.oc.decay_matrices_only = 1;
  j.ec = tdm_engine_config_default();
  j.ec.kind = TDM_ENGINE_PIPELINE;
  j.ec.accum = M;
  j.ec.clip = 0.5f; /* small enough to clip: the norm must be the same everywhere */
  j.ec.pp.schedule = sched;
  j.ec.pp.virtual_stages = V;
  j.D = D, j.P = P, j.steps = 3, j.B = 2, j.T = 8, j.die_rank = -1;
  return j;
}

/* A small Llama (grouped-query attention: 2 heads share 1 key/value head), dropout on; tied: its
 * head is the embedding (as llama3.2-1B's; llama-mini's is not). */
static job llama_job(int D, int P, int M, tdm_pp_schedule_kind sched, int V, int tied) {
  job j = gpt_job(D, P, M, sched, V);
  if (tdm_model_config_llama("llama-mini", &j.mc) != TDM_OK) return j;
  j.mc.n_layer = 6, j.mc.n_head = 2, j.mc.n_kv_head = 1, j.mc.n_embd = 16, j.mc.ffn_hidden = 24, j.mc.block_size = 8;
  j.mc.vocab_size = 29, j.mc.dropout = 0.1f, j.mc.tie_embeddings = tied;
  return j;
}

/* The reference: data parallelism on D ranks (one process when D = 1), accumulating M. */
static float *reference(const job *pj, int64_t *n, double *loss, double *norm, double *eval_loss) {
  job r = *pj;
  r.ec.kind = TDM_ENGINE_DP;
  float *w = run_job(&r, n, 1);
  for (int t = 0; t < r.steps; t++) loss[t] = args[0].loss[t], norm[t] = args[0].norm[t];
  *eval_loss = args[0].eval_loss;
  return w;
}

static void check_equal(job j, const char *what) {
  int64_t n1 = 0, n = 0;
  double loss[8], norm[8], ev;
  float *ref = reference(&j, &n1, loss, norm, &ev);
  float *w = run_job(&j, &n, 1);
  if (ref && w && n == n1) {
    int64_t diff = -1;
    for (int64_t i = 0; i < n && diff < 0; i++)
      if (memcmp(&w[i], &ref[i], 4)) diff = i;
    CHECK_MSG(diff < 0, "%s %s D %d P %d M %lld: parameter element %lld is %.9g, one process has %.9g", what,
              tdm_pp_schedule_name(j.ec.pp.schedule), j.D, j.P, (long long)j.ec.accum, (long long)diff, diff >= 0 ? w[diff] : 0.0,
              diff >= 0 ? ref[diff] : 0.0);
    int W = j.D * j.P;
    for (int r = 0; r < W; r++) { /* every rank reports the replica's numbers */
      for (int t = 0; t < j.steps; t++)
        CHECK_MSG((args[r].norm[t] == norm[t] || (isnan(args[r].norm[t]) && isnan(norm[t]))) && (j.D > 1 || args[r].loss[t] == loss[t]),
                  "%s P %d M %lld rank %d step %d: loss %.9g norm %.9g; one process %.9g %.9g", what, j.P, (long long)j.ec.accum,
                  r, t, args[r].loss[t], args[r].norm[t], loss[t], norm[t]);
      CHECK(args[r].eval_loss == ev);
    }
  } else {
    CHECK_MSG(0, "%s: no result (%lld vs %lld parameters)", what, (long long)n, (long long)n1);
  }
  free(ref);
  free(w);
}

static void test_every_schedule(void) {
  tdm_pp_schedule_kind ks[] = {TDM_PP_GPIPE, TDM_PP_1F1B, TDM_PP_ZB1P};
  for (int P = 2; P <= 4; P++) {
    int Ms[3] = {1, P, 2 * P + 1};
    for (int k = 0; k < 3; k++)
      for (int mi = 0; mi < 3; mi++) check_equal(gpt_job(1, P, Ms[mi], ks[k], 1), "pipeline");
  }
}

/* Recomputation in the stages: each chunk's blocks recomputed in its backward give one process's
 * bits (which recompute too, and equal a run that keeps everything: test_engine), every schedule,
 * GPT and Llama. */
static void test_recompute(void) {
  tdm_pp_schedule_kind ks[] = {TDM_PP_GPIPE, TDM_PP_1F1B, TDM_PP_ZB1P, TDM_PP_INTERLEAVED};
  for (int k = 0; k < 4; k++)
    for (int mode = TDM_RECOMPUTE_BLOCK; mode < TDM_RECOMPUTE_COUNT; mode++) {
      int V = ks[k] == TDM_PP_INTERLEAVED ? 2 : 1;
      job g = gpt_job(1, 2, 4, ks[k], V), l = llama_job(1, 2, 4, ks[k], V, k % 2);
      g.ec.recompute = l.ec.recompute = (tdm_recompute)mode;
      check_equal(g, mode == TDM_RECOMPUTE_BLOCK ? "gpt, recompute block" : "gpt, recompute selective");
      check_equal(l, mode == TDM_RECOMPUTE_BLOCK ? "llama, recompute block" : "llama, recompute selective");
    }
}

static int overflow_at_1(void *ctx, int64_t step) {
  (void)ctx;
  return step == 1;
}

/* bf16 and fp16: activations cross stages in 16 bits, as one process holds them; fp16 seeds the
 * backward with the loss scale (65536 here: no step overflows at this size, so none is skipped). */
static void test_mixed_precision(void) {
  tdm_pp_schedule_kind ks[] = {TDM_PP_GPIPE, TDM_PP_1F1B, TDM_PP_ZB1P, TDM_PP_INTERLEAVED};
  tdm_dtype dts[2] = {TDM_BF16, TDM_F16};
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 4; k++) {
      int V = ks[k] == TDM_PP_INTERLEAVED ? 2 : 1;
      int il = ks[k] == TDM_PP_INTERLEAVED; /* interleaved: 2 stages, a multiple of them in flight */
      job g = gpt_job(1, il ? 2 : 2 + k % 2, il ? 4 : 5, ks[k], V), l = llama_job(1, 2, 4, ks[k], V, k % 2);
      g.ec.precision = l.ec.precision = dts[d];
      check_equal(g, d ? "gpt, fp16" : "gpt, bf16");
      check_equal(l, d ? "llama, fp16" : "llama, bf16");
    }
  /* fp16 with an overflow scripted at step 1: every stage skips it (its norm NaN) and halves the
   * scale, as one process does, and the weights stay one process's */
  job o = gpt_job(1, 3, 4, TDM_PP_ZB1P, 1);
  o.ec.precision = TDM_F16, o.ec.overflow_hook = overflow_at_1;
  check_equal(o, "gpt, fp16, step 1 overflowing");
  CHECK_MSG(isnan(args[0].norm[1]) && !isnan(args[0].norm[0]) && !isnan(args[0].norm[2]), "the overflowing step was not skipped");
  job g = gpt_job(2, 2, 2, TDM_PP_1F1B, 1); /* with a data axis: data parallelism's bf16 on 2 ranks */
  g.ec.precision = TDM_BF16;
  check_equal(g, "gpt, bf16, D 2");
}

/* A vocabulary of 9,000 (three blocks of the head's table, tdm_lm_head): chunk 0 adds the tied
 * head's weight gradient block by block from the last chunk's message, as one process's embedding
 * adds it, and the last chunk sums the head's input gradient over the blocks in one process's
 * order, tied (through a detached view) or untied (its own table), split backward or not: one
 * process's bits (GPT 1f1b and zb1p, a tied Llama 1f1b, an untied one zb1p). */
static void test_large_vocab(void) {
  job js[4] = {gpt_job(1, 2, 3, TDM_PP_1F1B, 1), gpt_job(1, 2, 3, TDM_PP_ZB1P, 1), llama_job(1, 2, 3, TDM_PP_1F1B, 1, 1),
               llama_job(1, 2, 3, TDM_PP_ZB1P, 1, 0)};
  const char *what[4] = {"gpt, vocabulary 9000", "gpt, vocabulary 9000", "llama (tied), vocabulary 9000",
                         "llama (untied), vocabulary 9000"};
  for (int k = 0; k < 4; k++) {
    js[k].mc.vocab_size = 9000, js[k].steps = 2, js[k].mc.n_layer = 2;
    check_equal(js[k], what[k]);
  }
}

static void test_interleaved(void) {
  for (int P = 2; P <= 4; P++)
    for (int M = P; M <= 2 * P; M += P) check_equal(gpt_job(1, P, M, TDM_PP_INTERLEAVED, 2), "interleaved");
}

/* A data axis: each of D replicas a pipeline; equal to data parallelism on D ranks. */
static void test_data_axis(void) {
  check_equal(gpt_job(2, 2, 3, TDM_PP_1F1B, 1), "2 x 2");
  check_equal(gpt_job(2, 3, 3, TDM_PP_ZB1P, 1), "2 x 3");
  check_equal(gpt_job(3, 2, 2, TDM_PP_INTERLEAVED, 2), "3 x 2");
}

/* Cut by hand: the same weights whatever the cut. */
static void test_split_by_hand(void) {
  job j = gpt_job(1, 3, 4, TDM_PP_1F1B, 1);
  j.ec.pp.n_split = 3, j.ec.pp.split[0] = 1, j.ec.pp.split[1] = 5, j.ec.pp.split[2] = 2;
  check_equal(j, "split 1,5,2");
}

/* A stage that dies before step 2: the others fail within the timeout, naming it. */
static void test_dead_stage(void) {
  job j = gpt_job(1, 3, 3, TDM_PP_1F1B, 1);
  j.die_rank = 1;
  int64_t n;
  double t0 = tdm_time_now();
  free(run_job(&j, &n, 0));
  CHECK(tdm_time_now() - t0 < 30);
  for (int r = 0; r < 3; r++) {
    CHECK(args[r].st != TDM_OK);
    if (r != 1) CHECK_MSG(strstr(args[r].err, "rank 1") != NULL, "rank %d's error does not name rank 1: %s", r, args[r].err);
  }
}

/* The last stage's loss fails (a target outside the vocabulary, which only it reads): the first
 * stage waiting for its gradients learns it at once, not after the timeout (60 s here). */
static void test_failed_loss_stops_the_others(void) {
  job j = gpt_job(1, 3, 3, TDM_PP_1F1B, 1);
  j.bad_rank = 2;
  int64_t n;
  double t0 = tdm_time_now();
  free(run_job(&j, &n, 0));
  CHECK_MSG(tdm_time_now() - t0 < 20, "took %.1f s", tdm_time_now() - t0);
  CHECK_MSG(args[2].st == TDM_ERR_INVALID_ARG, "%s", args[2].err);
  for (int r = 0; r < 2; r++)
    CHECK_MSG(args[r].st != TDM_OK && strstr(args[r].err, "pipeline stage 2 failed"), "rank %d: %s", r, args[r].err);
}

/* Bad input: more chunks than blocks, a split that does not add up, too few micro-batches. */
static void test_bad_layouts(void) {
  job j = gpt_job(1, 2, 2, TDM_PP_1F1B, 1);
  j.mc.n_layer = 1;
  int64_t n;
  free(run_job(&j, &n, 0));
  CHECK_MSG(strstr(args[0].err, "2 stages x 1 virtual stages = 2 chunks for a model of 1 blocks") != NULL, "%s", args[0].err);
  j = gpt_job(1, 2, 2, TDM_PP_1F1B, 1);
  j.ec.pp.n_split = 2, j.ec.pp.split[0] = 3, j.ec.pp.split[1] = 3;
  free(run_job(&j, &n, 0));
  CHECK_MSG(strstr(args[0].err, "--pp-split adds up to 6 blocks; the model has 8") != NULL, "%s", args[0].err);
  j = gpt_job(1, 4, 2, TDM_PP_INTERLEAVED, 2);
  free(run_job(&j, &n, 0));
  CHECK_MSG(strstr(args[0].err, "2 micro-batches for 4 pipeline ranks") != NULL, "%s", args[0].err);
}

/* Llama: P = 2, 3, every schedule, M = 1, P, 2P+1 (interleaved: P, 2P), its head untied and tied
 * (alternately, and both for the first M); a data axis; a cut by hand. */
static void test_llama(void) {
  tdm_pp_schedule_kind ks[] = {TDM_PP_GPIPE, TDM_PP_1F1B, TDM_PP_ZB1P};
  for (int P = 2; P <= 3; P++) {
    int Ms[3] = {1, P, 2 * P + 1};
    for (int k = 0; k < 3; k++)
      for (int mi = 0; mi < 3; mi++) {
        check_equal(llama_job(1, P, Ms[mi], ks[k], 1, (k + mi) % 2), "llama");
        if (mi == 0) check_equal(llama_job(1, P, Ms[mi], ks[k], 1, 1 - (k + mi) % 2), "llama");
      }
    check_equal(llama_job(1, P, P, TDM_PP_INTERLEAVED, 2, 0), "llama interleaved untied");
    check_equal(llama_job(1, P, 2 * P, TDM_PP_INTERLEAVED, 2, 1), "llama interleaved tied");
  }
  check_equal(llama_job(2, 2, 3, TDM_PP_1F1B, 1, 1), "llama 2 x 2 tied");
  job j = llama_job(1, 3, 4, TDM_PP_ZB1P, 1, 1);
  j.ec.pp.n_split = 3, j.ec.pp.split[0] = 1, j.ec.pp.split[1] = 4, j.ec.pp.split[2] = 1;
  check_equal(j, "llama split 1,4,1");
}

/* Llama's bad layouts: more stages than layers, a split that does not add up, key/value heads a
 * tensor axis beside cannot split. */
static void test_llama_bad_layouts(void) {
  job j = llama_job(1, 2, 2, TDM_PP_1F1B, 1, 0);
  j.mc.n_layer = 1;
  int64_t n;
  free(run_job(&j, &n, 0));
  CHECK_MSG(strstr(args[0].err, "2 stages x 1 virtual stages = 2 chunks for a model of 1 blocks") != NULL, "%s", args[0].err);
  j = llama_job(1, 2, 2, TDM_PP_1F1B, 1, 1);
  j.ec.pp.n_split = 2, j.ec.pp.split[0] = 2, j.ec.pp.split[1] = 3;
  free(run_job(&j, &n, 0));
  CHECK_MSG(strstr(args[0].err, "--pp-split adds up to 5 blocks; the model has 6") != NULL, "%s", args[0].err);
  j = llama_job(1, 2, 2, TDM_PP_1F1B, 1, 0); /* 1 key/value head: the 3-D grid cannot split it over 2 tensor ranks */
  CHECK(tdm_engine_check(&j.mc, &j.ec, 4, 1, 2, 2) == TDM_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tdm_last_error(), "1 key/value heads do not divide over --tp 2 ranks") != NULL, "%s", tdm_last_error());
  j.mc.n_kv_head = 2;
  CHECK_OK(tdm_engine_check(&j.mc, &j.ec, 4, 1, 2, 2));
  j.ec.recompute = TDM_RECOMPUTE_BLOCK; /* the tensor-parallel stages recompute their split blocks */
  CHECK_OK(tdm_engine_check(&j.mc, &j.ec, 4, 1, 2, 2));
  CHECK_OK(tdm_engine_check(&j.mc, &j.ec, 2, 1, 1, 2));
  j.ec.recompute = TDM_RECOMPUTE_NONE;
  j.mc = tdm_model_config_mlp();
  CHECK(tdm_engine_check(&j.mc, &j.ec, 2, 1, 1, 2) == TDM_ERR_NOT_SUPPORTED);
  CHECK_MSG(strstr(tdm_last_error(), "use --model gpt or llama") != NULL, "%s", tdm_last_error());
}

TDM_TEST_MAIN(T(test_every_schedule), T(test_recompute), T(test_mixed_precision), T(test_interleaved), T(test_data_axis), T(test_split_by_hand), T(test_dead_stage), T(test_failed_loss_stops_the_others),
              T(test_bad_layouts), T(test_llama), T(test_llama_bad_layouts), T(test_large_vocab))
