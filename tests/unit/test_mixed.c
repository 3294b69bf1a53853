/* Mixed precision: under autocast every op is its f32 self on the 16-bit values (outputs and
 * input gradients rounded once); fp16's loss scaler follows the exact trajectory of scripted
 * overflows on every rank alike, and skips real ones; f32 master weights keep the updates a
 * 16-bit weight would lose; weights in f32, bf16 and f16 files load into any precision. */
#include <pthread.h>
#include <unistd.h>

#include "tdm_test.h"
#include "token_batch.h"

static const tdm_dtype DTS[2] = {TDM_BF16, TDM_F16};

static float round_to(float v, tdm_dtype dt) {
  if (dt == TDM_F32) return v;
  return dt == TDM_BF16 ? tdm_bf16_to_f32(tdm_f32_to_bf16(v)) : tdm_f16_to_f32(tdm_f32_to_f16(v));
}

/* ---- every op: its f32 self on the 16-bit values ------------------------------------------------ */
typedef tdm_tensor *(*op_fn)(tdm_tape *tp, tdm_tensor **in);
static tdm_tensor *o_linear(tdm_tape *tp, tdm_tensor **in) { return tdm_linear(tp, in[0], in[1], in[2]); }
static tdm_tensor *o_add(tdm_tape *tp, tdm_tensor **in) { return tdm_add(tp, in[0], in[1]); }
static tdm_tensor *o_add_bcast(tdm_tape *tp, tdm_tensor **in) { return tdm_add(tp, in[0], in[1]); }
static tdm_tensor *o_gelu(tdm_tape *tp, tdm_tensor **in) { return tdm_gelu(tp, in[0]); }
static tdm_tensor *o_relu(tdm_tape *tp, tdm_tensor **in) { return tdm_relu(tp, in[0]); }
static tdm_tensor *o_dropout(tdm_tape *tp, tdm_tensor **in) {
  tdm_tape_set_training(tp, 1);
  tdm_tape_set_dropout_key(tp, 9, 0);
  return tdm_dropout(tp, in[0], 0.3f);
}
static tdm_tensor *o_layernorm(tdm_tape *tp, tdm_tensor **in) { return tdm_layernorm(tp, in[0], in[1], in[2], 1e-5f); }
static tdm_tensor *o_rmsnorm(tdm_tape *tp, tdm_tensor **in) { return tdm_rmsnorm(tp, in[0], in[1], 1e-5f); }
static tdm_tensor *o_rope(tdm_tape *tp, tdm_tensor **in) {
  tdm_rope_config rc = {10000.0f, 0, 0, 0, 0};
  return tdm_rope(tp, in[0], 2, &rc, 3);
}
static tdm_tensor *o_swiglu(tdm_tape *tp, tdm_tensor **in) { return tdm_swiglu(tp, in[0], in[1]); }
static tdm_tensor *o_embedding(tdm_tape *tp, tdm_tensor **in) { return tdm_embedding(tp, in[0], in[1]); }
static tdm_tensor *o_ce(tdm_tape *tp, tdm_tensor **in) { return tdm_cross_entropy(tp, in[0], in[1], -100); }
static tdm_tensor *o_attention(tdm_tape *tp, tdm_tensor **in) { return tdm_attention(tp, in[0], 2); }
static tdm_tensor *o_gqa(tdm_tape *tp, tdm_tensor **in) { return tdm_attention_gqa(tp, in[0], in[1], in[2], 4, 2); }

enum { ACT, PARAM, INDEX }; /* an activation (16-bit under autocast), an f32 parameter, token ids */
static const struct {
  const char *name;
  op_fn fn;
  int n;
  int kind[3];
  int ndim[3];
  int64_t shape[3][3];
  int exact_bwd; /* attention's backward reads the probabilities as stored (rounded): close, not equal */
} cases[] = {
    {"linear", o_linear, 3, {ACT, PARAM, PARAM}, {3, 2, 1}, {{2, 3, 6}, {5, 6}, {5}}, 1},
    {"add", o_add, 2, {ACT, ACT}, {2, 2}, {{4, 6}, {4, 6}}, 1},
    {"add (broadcast)", o_add_bcast, 2, {ACT, PARAM}, {3, 2}, {{2, 3, 4}, {3, 4}}, 1},
    {"gelu", o_gelu, 1, {ACT}, {2}, {{4, 6}}, 1},
    {"relu", o_relu, 1, {ACT}, {2}, {{4, 6}}, 1},
    {"dropout", o_dropout, 1, {ACT}, {2}, {{4, 6}}, 1},
    {"layernorm", o_layernorm, 3, {ACT, PARAM, PARAM}, {2, 1, 1}, {{3, 8}, {8}, {8}}, 1},
    {"rmsnorm", o_rmsnorm, 2, {ACT, PARAM}, {2, 1}, {{3, 8}, {8}}, 1},
    {"rope", o_rope, 1, {ACT}, {3}, {{2, 3, 8}}, 1},
    {"swiglu", o_swiglu, 2, {ACT, ACT}, {2, 2}, {{3, 5}, {3, 5}}, 1},
    /* backward converts TDM_LP_PIECE (65,536) elements at a time: a piece and a part of one */
    {"swiglu, pieces", o_swiglu, 2, {ACT, ACT}, {2, 2}, {{300, 229}, {300, 229}}, 1},
    {"embedding", o_embedding, 2, {PARAM, INDEX}, {2, 2}, {{7, 4}, {2, 3}}, 1},
    {"cross_entropy", o_ce, 2, {ACT, INDEX}, {2, 1}, {{6, 7}, {6}}, 1},
    {"attention", o_attention, 1, {ACT}, {3}, {{2, 5, 12}}, 0},
    {"attention_gqa", o_gqa, 3, {ACT, ACT, ACT}, {3, 3, 3}, {{2, 5, 16}, {2, 5, 8}, {2, 5, 8}}, 0},
};

/* The inputs, f32 holding values that 16 bits represent exactly, and the 16-bit copies of the
 * activations. */
static void make_inputs(int c, tdm_dtype dt, tdm_rng *r, tdm_tensor **f32s, tdm_tensor **mixed) {
  for (int k = 0; k < cases[c].n; k++) {
    int kind = cases[c].kind[k];
    CHECK_OK(tdm_tensor_create(&f32s[k], kind == INDEX ? TDM_I64 : TDM_F32, cases[c].ndim[k], cases[c].shape[k]));
    int64_t n = tdm_tensor_numel(f32s[k]);
    if (kind == INDEX) {
      int64_t *d = tdm_tensor_data(f32s[k]), range = cases[c].shape[0][cases[c].ndim[0] - 1];
      if (!strcmp(cases[c].name, "embedding")) range = cases[c].shape[0][0];
      for (int64_t i = 0; i < n; i++) d[i] = (int64_t)(tdm_rng_next(r) % (uint64_t)range);
      mixed[k] = f32s[k];
      continue;
    }
    float *d = tdm_tensor_data(f32s[k]);
    for (int64_t i = 0; i < n; i++) d[i] = round_to(tdm_rng_normal(r) + (kind == PARAM && cases[c].ndim[k] == 1 ? 1.0f : 0.0f), dt);
    tdm_tensor_set_requires_grad(f32s[k], 1);
    if (kind == PARAM) {
      mixed[k] = f32s[k]; /* parameters stay f32 */
      continue;
    }
    CHECK_OK(tdm_tensor_create(&mixed[k], dt, cases[c].ndim[k], cases[c].shape[k]));
    CHECK_OK(tdm_tensor_copy(mixed[k], f32s[k]));
    tdm_tensor_set_requires_grad(mixed[k], 1);
  }
}

/* a equals round(b) element by element (exact), or within 2% of the largest magnitude (close) */
static int agrees(const tdm_tensor *a, const tdm_tensor *b, tdm_dtype dt, int exact, double *worst) {
  int64_t n = tdm_tensor_numel(a);
  double mx = 0;
  for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(tdm_tensor_get(b, i)));
  *worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = tdm_tensor_get(a, i), want = exact ? round_to((float)tdm_tensor_get(b, i), dt) : tdm_tensor_get(b, i);
    double d = fabs(x - want);
    if (!(d <= *worst)) *worst = d;
  }
  return exact ? *worst == 0 : *worst <= 0.02 * mx + 1e-6;
}

static void test_ops_are_f32_on_16_bit_values(void) {
  tdm_rng r;
  tdm_rng_seed(&r, 31);
  for (int d = 0; d < 2; d++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      tdm_dtype dt = DTS[d];
      tdm_tensor *f[3] = {0}, *m[3] = {0};
      make_inputs((int)c, dt, &r, f, m);
      tdm_tape *tp, *tr;
      CHECK_OK(tdm_tape_create(&tp, 0));
      CHECK_OK(tdm_tape_create(&tr, 0));
      CHECK_OK(tdm_tape_set_autocast(tp, dt));
      tdm_tensor *y = cases[c].fn(tp, m), *yr = cases[c].fn(tr, f);
      CHECK_MSG(y && yr, "%s %s: %s %s", cases[c].name, tdm_dtype_name(dt), tdm_tape_error(tp), tdm_tape_error(tr));
      if (!y || !yr) continue;
      int loss = !strcmp(cases[c].name, "cross_entropy");
      CHECK_MSG(tdm_tensor_dtype(y) == (loss ? TDM_F32 : dt), "%s: output %s", cases[c].name, tdm_dtype_name(tdm_tensor_dtype(y)));
      double wf, wb = 0;
      CHECK_MSG(agrees(y, yr, loss ? TDM_F32 : dt, 1, &wf), "%s %s forward: off by %g", cases[c].name, tdm_dtype_name(dt), wf);
      tdm_tensor *g; /* the upstream gradient: values 16 bits hold */
      CHECK_OK(tdm_tensor_create(&g, TDM_F32, tdm_tensor_ndim(y), tdm_tensor_shape(y)));
      for (int64_t i = 0; i < tdm_tensor_numel(g); i++) ((float *)tdm_tensor_data(g))[i] = round_to(tdm_rng_normal(&r), dt);
      CHECK_OK(tdm_backward_with(tp, y, g));
      CHECK_OK(tdm_backward_with(tr, yr, g));
      for (int k = 0; k < cases[c].n; k++) {
        if (cases[c].kind[k] == INDEX) continue;
        tdm_tensor *gm = tdm_tensor_grad(m[k]), *gr = tdm_tensor_grad(f[k]);
        if (!gm || !gr) {
          CHECK_MSG(0, "%s input %d has no gradient", cases[c].name, k);
          continue;
        }
        int param = cases[c].kind[k] == PARAM;
        CHECK(tdm_tensor_dtype(gm) == (param ? TDM_F32 : dt)); /* activations' gradients in 16 bits */
        double w;
        int ok = param ? agrees(gm, gr, TDM_F32, 0, &w) && (cases[c].exact_bwd ? w == 0 : 1) : agrees(gm, gr, dt, cases[c].exact_bwd, &w);
        CHECK_MSG(ok, "%s %s gradient %d: off by %g", cases[c].name, tdm_dtype_name(dt), k, w);
        if (w > wb) wb = w;
      }
      printf("  %-16s %s: forward exact, backward %s (worst %.3g)\n", cases[c].name, tdm_dtype_name(dt),
             cases[c].exact_bwd ? "exact" : "within 2% (the probabilities as stored)", wb);
      tdm_tensor_destroy(g);
      for (int k = 0; k < cases[c].n; k++) {
        if (m[k] != f[k]) tdm_tensor_destroy(m[k]);
        tdm_tensor_destroy(f[k]);
      }
      tdm_tape_destroy(tp);
      tdm_tape_destroy(tr);
    }
  /* an op without 16-bit support says so */
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  CHECK_OK(tdm_tape_set_autocast(tp, TDM_BF16));
  int64_t s4[4] = {1, 1, 4, 4};
  CHECK(tdm_maxpool2d(tp, tdm_zeros(tp, TDM_BF16, 4, s4), 2, 2, 0) == NULL && strstr(tdm_tape_error(tp), "maxpool2d") &&
        strstr(tdm_tape_error(tp), "bf16"));
  CHECK(tdm_tape_set_autocast(tp, TDM_F64) == TDM_ERR_INVALID_ARG);
  tdm_tape_destroy(tp);
}

/* ---- engines on threads ------------------------------------------------------------------------ */
typedef struct {
  tdm_model_config mc;
  tdm_optim_config oc;
  tdm_engine_config ec;
  int P, steps;
  const int *overflow_at; /* steps at which rank 1 alone reports an overflow, -1 ended */
} job;

typedef struct {
  const job *j;
  int r;
  void *group;
  double scale[128]; /* per step (jobs run at most 128 steps) */
  int skipped[128];
  int64_t optim_steps;
  float *params;
  int64_t n;
  tdm_status st;
  char err[512];
} rank_arg;

typedef struct {
  const job *j;
  int r;
} hook_ctx;

static int overflow_hook(void *vctx, int64_t step) {
  hook_ctx *h = vctx;
  if (h->r != 1 || !h->j->overflow_at) return 0;
  for (const int *s = h->j->overflow_at; *s >= 0; s++)
    if (*s == step) return 1;
  return 0;
}

typedef struct {
  const job *j;
  int r;
  int64_t step;
} batch_ctx;

static tdm_status next_batch(void *vctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  batch_ctx *c = vctx;
  const job *j = c->j;
  int64_t B = 4, first = (micro * j->P + c->r) * B;
  *base = first;
  if (j->mc.kind == TDM_MODEL_GPT || j->mc.kind == TDM_MODEL_LLAMA)
    return tdm_test_token_batch(tp, c->step, first, B, 8, j->mc.vocab_size, x, y);
  int64_t F = j->mc.in_features, xs[2] = {B, F}, ys[1] = {B};
  *x = tdm_new(tp, TDM_F32, 2, xs), *y = tdm_new(tp, TDM_I32, 1, ys);
  if (!*x || !*y) return tdm_tape_status(tp);
  for (int64_t i = 0; i < B * F; i++)
    ((float *)tdm_tensor_data(*x))[i] = (float)(tdm_hash64((uint64_t)c->step, (uint64_t)(first * F + i)) % 2000) / 1000.0f - 1.0f;
  for (int64_t i = 0; i < B; i++)
    ((int32_t *)tdm_tensor_data(*y))[i] = (int32_t)(tdm_hash64((uint64_t)c->step + 99, (uint64_t)(first + i)) % (uint64_t)j->mc.n_classes);
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
  hook_ctx hc = {j, a->r};
  tdm_engine_config ec = j->ec;
  ec.overflow_hook = overflow_hook, ec.overflow_ctx = &hc;
  if (st == TDM_OK) st = tdm_grid_create(&grid, comm, 0, 1, 1);
  if (st == TDM_OK) st = tdm_engine_create(&e, &j->mc, 7, &j->oc, grid, &ec);
  for (int t = 0; st == TDM_OK && t < j->steps && t < 128; t++) {
    batch_ctx bc = {j, a->r, t};
    tdm_step_stats ss;
    st = tdm_engine_step(e, next_batch, &bc, (uint64_t)t, j->oc.lr, &ss);
    a->scale[t] = ss.loss_scale, a->skipped[t] = ss.skipped;
  }
  if (st == TDM_OK) {
    a->optim_steps = tdm_optim_steps(tdm_engine_optim(e));
    a->n = tdm_params_numel(tdm_model_params(tdm_engine_model(e)));
    a->params = malloc(sizeof(float) * (size_t)a->n);
    st = tdm_engine_read_params(e, 0, a->n, a->params);
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

static void run_job(const job *j, rank_arg *args) {
  void *group = NULL;
  if (j->P > 1) CHECK_OK(tdm_comm_thread_group_create(&group, j->P));
  pthread_t th[4];
  for (int r = 0; r < j->P; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].j = j, args[r].r = r, args[r].group = group;
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < j->P; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < j->P; r++) CHECK_MSG(args[r].st == TDM_OK, "rank %d: %s", r, args[r].err);
  if (group) tdm_comm_thread_group_destroy(group);
}

static void free_args(rank_arg *args, int P) {
  for (int r = 0; r < P; r++) free(args[r].params);
}

static job mlp_job(void) {
  job j;
  memset(&j, 0, sizeof j);
  j.mc = tdm_model_config_mlp();
  j.mc.in_features = 24, j.mc.n_hidden = 1, j.mc.hidden[0] = 32, j.mc.n_classes = 5, j.mc.dropout = 0.0f;
  j.oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  j.oc.lr = 1e-3f;
  j.ec = tdm_engine_config_default();
  j.P = 1, j.steps = 10;
  return j;
}

/* Rank 1 alone reports overflows at scripted steps: every rank skips exactly those steps, and the
 * scale follows the closed form (halved after an overflow, doubled after `window` clean steps in
 * a row), over data parallelism and ZeRO stage 2 (where each rank sees only its own shard). */
static void test_scripted_overflows(void) {
  static const int at[] = {1, 2, 6, 11, 12, 13, -1};
  for (int stage = 0; stage <= 2; stage += 2) {
    job j = mlp_job();
    j.P = 2, j.steps = 16, j.overflow_at = at;
    j.ec.kind = stage ? TDM_ENGINE_ZERO : TDM_ENGINE_DP, j.ec.zero.stage = stage ? stage : 1;
    j.ec.precision = TDM_F16, j.ec.loss_scale.init = 1024.0f, j.ec.loss_scale.window = 3;
    rank_arg args[2];
    run_job(&j, args);
    double s = 1024, want[16];
    int skip[16], good = 0, applied = 0;
    for (int t = 0; t < 16; t++) { /* the closed form */
      int o = 0;
      for (const int *p = at; *p >= 0; p++) o |= *p == t;
      want[t] = s, skip[t] = o;
      if (o) s /= 2, good = 0;
      else if (++good == 3) s *= 2, good = 0;
      applied += !o;
    }
    printf("  stage %d, scale by step:", stage);
    for (int t = 0; t < 16; t++) printf(" %g%s", args[0].scale[t], args[0].skipped[t] ? "*" : "");
    printf("  (* skipped)\n");
    for (int r = 0; r < 2; r++)
      for (int t = 0; t < 16; t++)
        CHECK_MSG(args[r].scale[t] == want[t] && args[r].skipped[t] == skip[t], "stage %d rank %d step %d: scale %g skipped %d, expected %g %d",
                  stage, r, t, args[r].scale[t], args[r].skipped[t], want[t], skip[t]);
    CHECK(args[0].optim_steps == applied && args[1].optim_steps == applied);
    CHECK(args[0].params && args[1].params && !memcmp(args[0].params, args[1].params, sizeof(float) * (size_t)args[0].n));
    free_args(args, 2);
  }
}

/* Real overflows: a scale of 2^40 makes the scaled gradients overflow f16; the steps are skipped
 * and the scale halved until they fit, then training goes on with finite weights. */
static void test_real_overflows(void) {
  job j = mlp_job();
  j.steps = 30;
  j.ec.precision = TDM_F16, j.ec.loss_scale.init = 0x1p40f;
  rank_arg a[1];
  run_job(&j, a);
  int first_clean = -1;
  for (int t = 0; t < j.steps; t++)
    if (!a[0].skipped[t]) {
      first_clean = t;
      break;
    }
  printf("  scale 2^40: %d steps skipped, first clean step at scale 2^%.0f\n", first_clean, log2(a[0].scale[first_clean > 0 ? first_clean : 0]));
  CHECK(first_clean >= 1 && first_clean < j.steps);
  for (int t = 0; t < j.steps; t++) {
    CHECK(a[0].skipped[t] == (t < first_clean)); /* a prefix, then no more at this scale */
    if (t > 0 && t <= first_clean) CHECK(a[0].scale[t] == a[0].scale[t - 1] / 2);
  }
  CHECK(a[0].optim_steps == j.steps - first_clean);
  for (int64_t i = 0; a[0].params && i < a[0].n; i++)
    if (!isfinite(a[0].params[i])) {
      CHECK_MSG(0, "parameter %lld is %g", (long long)i, a[0].params[i]);
      break;
    }
  free_args(a, 1);
}

/* Master weights: updates far below a 16-bit weight's resolution accumulate in the f32 masters and
 * track the fp32 run, where a weight stored in 16 bits would not move at all (stuck weights). */
static void test_tiny_updates_kept(void) {
  for (int d = 0; d < 2; d++) {
    tdm_dtype dt = DTS[d];
    job j = mlp_job();
    j.steps = 100;
    j.oc = tdm_optim_config_default(TDM_OPT_ADAM); /* steps of about lr whatever the gradient's size */
    j.oc.lr = dt == TDM_BF16 ? 1e-4f : 1e-5f; /* about a fifth of a 16-bit step at |w| near 0.1 */
    if (dt == TDM_F16) j.ec.loss_scale.init = 1024.0f;
    rank_arg ref[1], mix[1], init[1];
    job j0 = j;
    j0.steps = 0;
    run_job(&j0, init);
    run_job(&j, ref);
    j.ec.precision = dt;
    run_job(&j, mix);
    int64_t considered = 0, kept = 0, stuck = 0;
    double num = 0, den = 0;
    for (int64_t i = 0; init[0].params && ref[0].params && mix[0].params && i < init[0].n; i++) {
      float w0 = init[0].params[i], dref = ref[0].params[i] - w0, dmix = mix[0].params[i] - w0;
      int ex;
      frexpf(w0, &ex);
      float ulp = ldexpf(1.0f, ex - 1 - (dt == TDM_BF16 ? 7 : 10)); /* a 16-bit step at w0 */
      if (!(fabsf(w0) > 1e-3f) || !(j.oc.lr < 0.25f * ulp) || !(fabsf(dref) > 2 * ulp)) continue;
      considered++; /* every single update is below a quarter of a 16-bit step, their sum is above two */
      float w16 = round_to(w0, dt); /* a weight kept in 16 bits: each update rounds back to it */
      stuck += round_to(w16 + j.oc.lr, dt) == w16 && round_to(w16 - j.oc.lr, dt) == w16;
      kept += dmix * dref > 0 && fabsf(dmix) > ulp;
      num += (double)(dmix - dref) * (dmix - dref), den += (double)dref * dref;
    }
    printf("  %s: %lld weights whose every update is under a quarter of a 16-bit step but whose sum is over two: a 16-bit weight stays put for %lld, the master moved %lld (update error vs fp32 %.3f)\n",
           tdm_dtype_name(dt), (long long)considered, (long long)stuck, (long long)kept, den > 0 ? sqrt(num / den) : -1.0);
    CHECK(considered >= 50); /* of 997 weights: 121 (bf16), 83 (f16) */
    CHECK(stuck == considered);
    CHECK(kept >= 0.95 * (double)considered);
    CHECK(den > 0 && sqrt(num / den) < 0.2);
    free_args(ref, 1), free_args(mix, 1), free_args(init, 1);
  }
}

/* Weights files in f32, bf16 and f16 load into engines of every precision: the masters take the
 * file's values exactly (a 16-bit file's, widened). */
static void test_weights_of_any_dtype_load(void) {
  job j = mlp_job();
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &j.mc, 3));
  tdm_params *p = tdm_model_params(m);
  char path[3][64];
  tdm_dtype fdt[3] = {TDM_F32, TDM_BF16, TDM_F16};
  for (int f = 0; f < 3; f++) {
    snprintf(path[f], sizeof path[f], "/tmp/tdm_mixed_%d_%s.safetensors", (int)getpid(), tdm_dtype_name(fdt[f]));
    int n = tdm_params_count(p);
    tdm_st_tensor ts[16];
    void *bufs[16];
    for (int i = 0; i < n; i++) {
      tdm_tensor *t = tdm_params_get(p, i);
      int64_t ne = tdm_tensor_numel(t);
      bufs[i] = malloc((size_t)ne * tdm_dtype_size(fdt[f]));
      CHECK_OK(tdm_convert(bufs[i], fdt[f], tdm_tensor_data(t), TDM_F32, ne));
      ts[i] = (tdm_st_tensor){tdm_tensor_name(t), fdt[f], tdm_tensor_ndim(t), {0}, bufs[i], ne * (int64_t)tdm_dtype_size(fdt[f])};
      memcpy(ts[i].shape, tdm_tensor_shape(t), sizeof(int64_t) * (size_t)tdm_tensor_ndim(t));
    }
    CHECK_OK(tdm_safetensors_save(path[f], n, ts, 0, NULL));
    for (int i = 0; i < n; i++) free(bufs[i]);
  }
  for (int prec = 0; prec < 3; prec++)
    for (int f = 0; f < 3; f++) {
      tdm_grid *g;
      tdm_engine *e;
      CHECK_OK(tdm_grid_create(&g, NULL, 0, 1, 1));
      tdm_engine_config ec = tdm_engine_config_default();
      ec.precision = fdt[prec];
      CHECK_OK(tdm_engine_create(&e, &j.mc, 99, &j.oc, g, &ec));
      CHECK_OK(tdm_engine_load_weights(e, path[f]));
      const float *got = tdm_params_data(tdm_model_params(tdm_engine_model(e))), *src = tdm_params_data(p);
      int64_t bad = 0;
      for (int64_t i = 0; i < tdm_params_numel(p); i++)
        bad += got[i] != (fdt[f] == TDM_F32 ? src[i] : round_to(src[i], fdt[f]));
      CHECK_MSG(bad == 0, "a %s file into a %s engine: %lld values differ", tdm_dtype_name(fdt[f]), tdm_dtype_name(fdt[prec]), (long long)bad);
      tdm_engine_destroy(e);
      tdm_grid_destroy(g);
    }
  for (int f = 0; f < 3; f++) remove(path[f]);
  tdm_model_destroy(m);
  /* what cannot work is refused */
  tdm_grid *g;
  tdm_engine *e = NULL;
  CHECK_OK(tdm_grid_create(&g, NULL, 0, 1, 1));
  tdm_engine_config ec = tdm_engine_config_default();
  ec.precision = TDM_F64;
  CHECK(tdm_engine_create(&e, &j.mc, 1, &j.oc, g, &ec) == TDM_ERR_INVALID_ARG && !e);
  CHECK_ERR_HAS("precision f64; expected f32, bf16 or f16");
  ec.precision = TDM_F16, ec.loss_scale.init = -1;
  CHECK(tdm_engine_create(&e, &j.mc, 1, &j.oc, g, &ec) == TDM_ERR_INVALID_ARG && !e);
  CHECK_ERR_HAS("loss scale -1");
  tdm_grid_destroy(g);
}

TDM_TEST_MAIN(T(test_ops_are_f32_on_16_bit_values), T(test_scripted_overflows), T(test_real_overflows), T(test_tiny_updates_kept),
              T(test_weights_of_any_dtype_load))
