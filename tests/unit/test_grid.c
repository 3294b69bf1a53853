/* The 3-D grid in one process over the thread transport: the pipeline engine with a tensor axis
 * (each stage's blocks split over T ranks) and a data axis. For T = 2 with P = 2 stages, D = 1 and
 * 2 replicas, and several schedules, with dropout and clipping on and a vocabulary T does not
 * divide, the weights after a few steps, the loss, the gradient norm and an evaluation equal the
 * tensor-parallel engine's at the same T and D bit for bit (the same sums in the same order), and
 * one process's (data parallelism on D ranks) within 1e-5 of each tensor's largest value; a Llama's
 * too (grouped-query attention, tied and untied heads). A grid
 * the model cannot take is refused by tdm_engine_check before anything is built, naming the values. */
#include <math.h>
#include <pthread.h>

#include "tdm_test.h"
#include "token_batch.h"

typedef struct {
  tdm_model_config mc;
  tdm_optim_config oc;
  tdm_engine_config ec;
  int D, T, P, steps;
  int64_t B, S;
  int perturb_rank; /* >= 0: this rank's copy of the final layer norm's weight is nudged after creation */
} job;

typedef struct {
  const job *j;
  int r;
  void *group;
  float *out;
  int64_t numel;
  double loss[4], norm[4], eval_loss, eval_correct;
  int64_t opt_owned; /* elements whose optimizer state this rank keeps */
  int stage;
  tdm_status st;
  char err[512];
} rank_arg;

typedef struct {
  const job *j;
  int d;
  int64_t step;
} batch_ctx;

/* Sample s of step t is a function of (t, s): a data replica d takes micro-batch slices micro * D + d. */
static tdm_status next_batch(void *vctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  batch_ctx *c = vctx;
  const job *j = c->j;
  int64_t first = (micro * j->D + c->d) * j->B;
  *base = first;
  return tdm_test_token_batch(tp, c->step, first, j->B, j->S, j->mc.vocab_size, x, y);
}

static int world_of(const job *j) { return j->D * j->T * j->P; }

static void *rank_main(void *va) {
  rank_arg *a = va;
  const job *j = a->j;
  int W = world_of(j);
  tdm_comm_t comm = NULL;
  tdm_grid *grid = NULL;
  tdm_engine *e = NULL;
  tdm_status st = TDM_OK;
  if (W > 1) {
    tdm_comm_config cc = {0};
    cc.rank = a->r, cc.size = W, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
    st = tdm_comm_create(&comm, &cc);
  }
  if (st == TDM_OK) st = tdm_grid_create(&grid, comm, j->D, j->T, j->P);
  if (st == TDM_OK) st = tdm_engine_create(&e, &j->mc, 42, &j->oc, grid, &j->ec);
  if (st == TDM_OK) a->opt_owned = tdm_optim_owned(tdm_engine_optim(e)), a->stage = tdm_grid_index(grid, TDM_AXIS_PIPELINE);
  if (st == TDM_OK && a->r == j->perturb_rank) { /* through the engine's boxes: where its values live */
    const tdm_engine_piece *pc;
    int n = tdm_engine_pieces(e, &pc);
    for (int k = 0; k < n; k++)
      if (!strcmp(tdm_tensor_name(tdm_params_get(tdm_model_params(tdm_engine_model(e)), pc[k].param)), "transformer.ln_f.weight"))
        pc[k].data[0] += 1e-3f;
  }
  for (int t = 0; st == TDM_OK && t < j->steps; t++) {
    batch_ctx bc = {j, tdm_grid_index(grid, TDM_AXIS_DATA), t};
    tdm_step_stats ss;
    st = tdm_engine_step(e, next_batch, &bc, tdm_hash64(42, (uint64_t)t), j->oc.lr, &ss);
    a->loss[t] = ss.loss, a->norm[t] = ss.grad_norm;
  }
  if (st == TDM_OK) {
    tdm_tape *tp = tdm_engine_tape(e);
    tdm_tape_reset(tp);
    batch_ctx bc = {j, 0, 1000};
    tdm_tensor *x, *y;
    int64_t base;
    double rows;
    st = next_batch(&bc, tp, 0, &x, &y, &base);
    if (st == TDM_OK) st = tdm_engine_eval(e, x, y, &a->eval_loss, &a->eval_correct, &rows);
  }
  if (st == TDM_OK) { /* every rank reads the whole model (collective) */
    a->numel = tdm_params_numel(tdm_model_params(tdm_engine_model(e)));
    a->out = malloc(sizeof(float) * (size_t)a->numel);
    st = tdm_engine_read_params(e, 0, a->numel, a->out);
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

static rank_arg args[8];

/* Runs the job on D x T x P threads; returns rank 0's parameters (malloc'd) or NULL; every rank's
 * copy must be the same. */
static float *run_job_(const job *j, int64_t *n, int expect_ok) {
  int W = world_of(j);
  void *group = NULL;
  if (W > 1) CHECK_OK(tdm_comm_thread_group_create(&group, W));
  pthread_t th[8];
  for (int r = 0; r < W; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].j = j, args[r].r = r, args[r].group = group;
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  int ok = 1;
  for (int r = 0; r < W; r++) {
    if (expect_ok)
      CHECK_MSG(args[r].st == TDM_OK, "%s D %d T %d P %d: rank %d: %s", tdm_engine_kind_name(j->ec.kind), j->D, j->T, j->P, r, args[r].err);
    ok &= args[r].st == TDM_OK;
  }
  for (int r = 1; ok && r < W; r++)
    CHECK_MSG(!memcmp(args[r].out, args[0].out, sizeof(float) * (size_t)args[0].numel), "rank %d read other parameters than rank 0", r);
  for (int r = 1; r < W; r++) free(args[r].out);
  if (group) tdm_comm_thread_group_destroy(group);
  *n = args[0].numel;
  return ok ? args[0].out : (free(args[0].out), NULL);
}
static float *run_job(const job *j, int64_t *n) { return run_job_(j, n, 1); }

static job grid_job(int D, int T, int P, int M, tdm_pp_schedule_kind sched, int V) {
  job j;
  memset(&j, 0, sizeof j);
  j.mc = tdm_model_config_gpt_mini();
  j.mc.n_layer = 4, j.mc.n_head = 2, j.mc.n_embd = 16, j.mc.block_size = 8, j.mc.vocab_size = 29, j.mc.dropout = 0.1f;
  /* SGD with momentum: Adam's division by the root of the second moment would blow the rounding
   * of a near-zero gradient up to a whole step, and "within 1e-5" could not be asked of it */
  j.oc = tdm_optim_config_default(TDM_OPT_SGD);
  j.oc.lr = 0.1f, j.oc.momentum = 0.9f, j.oc.weight_decay = 0.01f;
  j.ec = tdm_engine_config_default();
  j.ec.kind = TDM_ENGINE_PIPELINE;
  j.ec.accum = M;
  j.ec.clip = 0.5f; /* small enough to clip: the norm must be the same everywhere */
  j.ec.pp.schedule = sched;
  j.ec.pp.virtual_stages = V;
  j.D = D, j.T = T, j.P = P, j.steps = 3, j.B = 2, j.S = 8, j.perturb_rank = -1;
  return j;
}

/* The largest difference between a and b relative to each parameter's largest value. */
static double rel_diff(const tdm_model_config *mc, const float *a, const float *b) {
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, mc, 1));
  tdm_params *p = tdm_model_params(m);
  double worst = 0;
  for (int i = 0; i < tdm_params_count(p); i++) {
    int64_t off = tdm_params_offset(p, i), n = tdm_tensor_numel(tdm_params_get(p, i));
    double big = 0, d = 0;
    for (int64_t k = off; k < off + n; k++) {
      big = fmax(big, fabs(b[k]));
      d = fmax(d, fabs((double)a[k] - b[k]));
    }
    worst = fmax(worst, d / (big > 0 ? big : 1));
  }
  tdm_model_destroy(m);
  return worst;
}

static void check_grid(job j, const char *what) {
  int64_t n = 0, nt = 0, nd = 0;
  float *w = run_job(&j, &n);
  double loss[4], norm[4], ev = args[0].eval_loss;
  for (int t = 0; t < j.steps; t++) loss[t] = args[0].loss[t], norm[t] = args[0].norm[t];
  int W = world_of(&j);
  for (int r = 1; w && r < W; r++) /* every rank reports the replica's numbers */
    for (int t = 0; t < j.steps; t++)
      CHECK_MSG(args[r].norm[t] == norm[t] && args[r].eval_loss == ev && (j.D > 1 || args[r].loss[t] == loss[t]),
                "%s rank %d step %d: loss %.9g norm %.9g; rank 0 %.9g %.9g", what, r, t, args[r].loss[t], args[r].norm[t], loss[t],
                norm[t]);
  job tj = j; /* the tensor-parallel engine at the same T and D */
  tj.ec.kind = TDM_ENGINE_TP, tj.P = 1;
  float *tw = run_job(&tj, &nt);
  if (w && tw && n == nt) {
    int64_t diff = -1;
    for (int64_t i = 0; i < n && diff < 0; i++)
      if (memcmp(&w[i], &tw[i], 4)) diff = i;
    CHECK_MSG(diff < 0, "%s: parameter element %lld is %.9g; the tensor-parallel engine has %.9g", what, (long long)diff,
              diff >= 0 ? w[diff] : 0.0, diff >= 0 ? tw[diff] : 0.0);
    for (int t = 0; t < j.steps; t++)
      CHECK_MSG(args[0].norm[t] == norm[t] && (j.D > 1 || args[0].loss[t] == loss[t]),
                "%s step %d: loss %.9g norm %.9g; tensor parallelism %.9g %.9g", what, t, loss[t], norm[t], args[0].loss[t],
                args[0].norm[t]);
    CHECK_MSG(args[0].eval_loss == ev, "%s: evaluation %.9g; tensor parallelism %.9g", what, ev, args[0].eval_loss);
  } else {
    CHECK_MSG(0, "%s: no result (%lld vs %lld parameters)", what, (long long)n, (long long)nt);
  }
  job dj = j; /* data parallelism on D ranks: one process when D = 1 */
  dj.ec.kind = TDM_ENGINE_DP, dj.T = 1, dj.P = 1;
  float *dw = run_job(&dj, &nd);
  if (w && dw && n == nd) {
    double rd = rel_diff(&j.mc, w, dw);
    CHECK_MSG(rd <= 1e-5, "%s: the weights differ from data parallelism's by %.3g of a tensor's largest value", what, rd);
    for (int t = 0; t < j.steps; t++)
      CHECK_MSG(fabs(args[0].norm[t] - norm[t]) <= 1e-5 * norm[t], "%s step %d: norm %.9g; data parallelism %.9g", what, t, norm[t],
                args[0].norm[t]);
  } else {
    CHECK_MSG(0, "%s: no data-parallel result", what);
  }
  free(w), free(tw), free(dw);
}

static void test_tp2_pp2(void) {
  check_grid(grid_job(1, 2, 2, 2, TDM_PP_1F1B, 1), "tp2 x pp2 1f1b M 2");
  check_grid(grid_job(1, 2, 2, 3, TDM_PP_ZB1P, 1), "tp2 x pp2 zb1p M 3");
  check_grid(grid_job(1, 2, 2, 2, TDM_PP_INTERLEAVED, 2), "tp2 x pp2 interleaved M 2");
}

static void test_tp2_pp2_dp2(void) { check_grid(grid_job(2, 2, 2, 3, TDM_PP_GPIPE, 1), "dp2 x tp2 x pp2 gpipe M 3"); }

/* A Llama on the grid: 4 heads over 2 key/value heads (one group per tensor rank), a SwiGLU width
 * of 22, its head untied (lm_head on the last stage) or tied (the embedding's gradient sent back
 * to the first stage, per tensor rank). */
static job llama_grid_job(int D, int T, int P, int M, tdm_pp_schedule_kind sched, int V, int tied) {
  job j = grid_job(D, T, P, M, sched, V);
  CHECK_OK(tdm_model_config_llama("llama-mini", &j.mc));
  j.mc.n_layer = 4, j.mc.n_head = 4, j.mc.n_kv_head = 2, j.mc.n_embd = 16, j.mc.ffn_hidden = 22, j.mc.block_size = 8;
  j.mc.vocab_size = 29, j.mc.dropout = 0.1f, j.mc.tie_embeddings = tied;
  return j;
}

static void test_llama(void) {
  check_grid(llama_grid_job(1, 2, 2, 2, TDM_PP_1F1B, 1, 0), "llama tp2 x pp2 1f1b M 2 untied");
  check_grid(llama_grid_job(1, 2, 2, 3, TDM_PP_ZB1P, 1, 1), "llama tp2 x pp2 zb1p M 3 tied");
  check_grid(llama_grid_job(2, 2, 2, 2, TDM_PP_INTERLEAVED, 2, 1), "llama dp2 x tp2 x pp2 interleaved M 2 tied");
}

/* A replicated parameter that differs between the tensor ranks of a stage (rank 3: stage 1, tensor
 * rank 1) is named by the drift check before step 1 on that stage, and every rank stops. */
static void test_drift(void) {
  job j = grid_job(1, 2, 2, 2, TDM_PP_1F1B, 1);
  j.perturb_rank = 3;
  int64_t n;
  double t0 = tdm_time_now();
  free(run_job_(&j, &n, 0));
  CHECK(tdm_time_now() - t0 < 30);
  for (int r = 0; r < 4; r++) CHECK_MSG(args[r].st != TDM_OK, "rank %d went on", r);
  for (int r = 2; r < 4; r++)
    CHECK_MSG(strstr(args[r].err, "replicated parameter 'transformer.ln_f.weight' has drifted: tensor rank 1's copy differs") != NULL,
              "rank %d: %s", r, args[r].err);
  j.ec.tp.check_every = 0; /* the check off: the run goes on */
  free(run_job_(&j, &n, 1));
}

/* A grid the model cannot take: refused before anything is built, naming the values. */
static void test_bad_grids(void) {
  job j = grid_job(1, 2, 2, 2, TDM_PP_1F1B, 1);
  CHECK_OK(tdm_engine_check(&j.mc, &j.ec, 8, 2, 2, 2));
  CHECK(tdm_engine_check(&j.mc, &j.ec, 6, 0, 4, 2) == TDM_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tdm_last_error(), "tensor 4 x pipeline 2 does not make the world size 6") != NULL, "%s", tdm_last_error());
  CHECK(tdm_engine_check(&j.mc, &j.ec, 8, 1, 4, 2) == TDM_ERR_INVALID_ARG); /* 4 tensor ranks, 2 heads */
  CHECK_MSG(strstr(tdm_last_error(), "--tp 4 is larger than the 2 attention heads") != NULL, "%s", tdm_last_error());
  j.mc.n_head = 6, j.mc.n_embd = 24;
  CHECK(tdm_engine_check(&j.mc, &j.ec, 8, 1, 4, 2) == TDM_ERR_INVALID_ARG);
  CHECK_MSG(strstr(tdm_last_error(), "6 attention heads do not divide over --tp 4 ranks") != NULL, "%s", tdm_last_error());
  j = grid_job(1, 2, 2, 8, TDM_PP_1F1B, 1);
  CHECK(tdm_engine_check(&j.mc, &j.ec, 16, 1, 2, 8) == TDM_ERR_INVALID_ARG); /* 8 stages, 4 blocks */
  CHECK_MSG(strstr(tdm_last_error(), "8 stages x 1 virtual stages = 8 chunks for a model of 4 blocks") != NULL, "%s", tdm_last_error());
}

/* ZeRO stage 1 on the data axis of the pipeline (D = 2, P = 2, also interleaved; Adam, whose moments are the state
 * that shrinks): the weights, losses and norms after a few steps equal --zero 0's bit for bit,
 * every data rank keeps the state of half its stage's elements (the two halves add up to it). In
 * the 3-D grid (T = 2, 1f1b and interleaved) the same, the halves cut on rows of the slices (within
 * 64 elements of half); stage 2 is refused by name. */
static void test_zero1(void) {
  for (int sched = 0; sched < 5; sched++) { /* interleaved: two spans a rank, cut across; 3, 4: the grid */
    job j = sched == 2 ? grid_job(2, 1, 2, 2, TDM_PP_INTERLEAVED, 2) : sched == 3 ? grid_job(2, 2, 2, 2, TDM_PP_1F1B, 1)
          : sched == 4 ? grid_job(2, 2, 2, 2, TDM_PP_INTERLEAVED, 2) : grid_job(2, 1, 2, sched ? 3 : 2, sched ? TDM_PP_ZB1P : TDM_PP_1F1B, 1);
    int W = j.D * j.T * j.P;
    j.oc = tdm_optim_config_default(TDM_OPT_ADAMW);
    j.oc.lr = 0.01f;
    int64_t n0 = 0, n1 = 0, owned0[8], owned1[8];
    double norm0[4], loss0[4];
    float *w0 = run_job(&j, &n0);
    for (int r = 0; r < W; r++) owned0[r] = args[r].opt_owned;
    for (int t = 0; t < j.steps; t++) norm0[t] = args[0].norm[t], loss0[t] = args[0].loss[t];
    j.ec.pp.zero_stage = 1;
    float *w1 = run_job(&j, &n1);
    for (int r = 0; r < W; r++) owned1[r] = args[r].opt_owned;
    CHECK_MSG(w0 && w1 && n0 == n1, "no result");
    int64_t diff = -1;
    for (int64_t i = 0; w0 && w1 && i < n0 && diff < 0; i++)
      if (memcmp(&w0[i], &w1[i], 4)) diff = i;
    CHECK_MSG(diff < 0, "schedule %d: element %lld is %.9g with --zero 1, %.9g with --zero 0", sched, (long long)diff,
              diff >= 0 ? w1[diff] : 0.0, diff >= 0 ? w0[diff] : 0.0);
    for (int t = 0; t < j.steps; t++)
      CHECK_MSG(args[0].norm[t] == norm0[t] && args[0].loss[t] == loss0[t], "step %d: norm %.9g loss %.9g; --zero 0 %.9g %.9g", t,
                args[0].norm[t], args[0].loss[t], norm0[t], loss0[t]);
    if (j.T > 1) { /* the data ranks' parts add up to one copy, each within a row of half */
      int64_t all0 = 0, all1 = 0;
      for (int r = 0; r < W; r++) {
        all0 += owned0[r], all1 += owned1[r];
        CHECK_MSG(owned1[r] > 0 && owned1[r] <= owned0[r] / 2 + 64, "grid, schedule %d, rank %d: optimizer elements %lld with --zero 1, "
                  "%lld with --zero 0", sched, r, (long long)owned1[r], (long long)owned0[r]);
      }
      CHECK_MSG(2 * all1 == all0, "grid, schedule %d: optimizer elements %lld in all with --zero 1, %lld with --zero 0", sched,
                (long long)all1, (long long)all0);
      free(w0), free(w1);
      continue;
    }
    for (int s = 0; s < 2; s++) { /* stage s's two data ranks */
      int r0 = -1, r1 = -1;
      for (int r = 0; r < 4; r++)
        if (args[r].stage == s) *(r0 < 0 ? &r0 : &r1) = r;
      CHECK(r0 >= 0 && r1 >= 0);
      if (r0 < 0 || r1 < 0) continue;
      int64_t a = owned1[r0], b = owned1[r1], whole = owned0[r0];
      CHECK_MSG(owned0[r1] == whole && a + b == whole && (a == whole / 2 || b == whole / 2) && a > 0 && b > 0,
                "stage %d: optimizer elements %lld + %lld with --zero 1, %lld with --zero 0", s, (long long)a, (long long)b,
                (long long)whole);
    }
    free(w0), free(w1);
  }
  job j = grid_job(2, 2, 1, 2, TDM_PP_1F1B, 1);
  j.P = 2;
  int64_t n;
  for (int stage = 2; stage <= 3; stage++) { /* every rank stops; the message is the checking rank's */
    j.ec.pp.zero_stage = stage;
    free(run_job_(&j, &n, 0));
    char want[64];
    snprintf(want, sizeof want, "ZeRO stage %d on the data axis; expected 0 or 1", stage);
    int named = 0;
    for (int r = 0; r < 8; r++) {
      CHECK_MSG(args[r].st != TDM_OK, "stage %d: rank %d went on", stage, r);
      named |= strstr(args[r].err, want) != NULL;
    }
    CHECK_MSG(named, "stage %d: no rank said '%s' (rank 0: %s)", stage, want, args[0].err);
  }
}

TDM_TEST_MAIN(T(test_tp2_pp2), T(test_tp2_pp2_dp2), T(test_llama), T(test_drift), T(test_bad_grids), T(test_zero1))
