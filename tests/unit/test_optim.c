/* Optimizers against hand-computed updates, schedules, clipping. */
#include "tdm_test.h"

/* One parameter vector w (3) with a fixed gradient, stepped by hand and by the optimizer. */
static tdm_params *make_params(const float *w0, const float *g) {
  tdm_params *p;
  tdm_tensor *t, *u;
  int64_t s2[1] = {2}, s1[1] = {1};
  tdm_params_create(&p);
  tdm_params_declare(p, "w", 1, s2, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 1, &t);
  tdm_params_declare(p, "b", 1, s1, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &u);
  tdm_params_finalize(p, 0);
  memcpy(tdm_params_data(p), w0, 3 * sizeof(float));
  memcpy(tdm_params_grad(p), g, 3 * sizeof(float));
  return p;
}

static void test_sgd_momentum_nesterov(void) {
  const float w0[3] = {1, -2, 0.5f}, g[3] = {0.1f, 0.2f, -0.3f};
  for (int nesterov = 0; nesterov <= 1; nesterov++) {
    tdm_params *p = make_params(w0, g);
    tdm_optim_config c = tdm_optim_config_default(TDM_OPT_SGD);
    c.lr = 0.1f;
    c.momentum = 0.9f;
    c.weight_decay = 0.01f;
    c.nesterov = nesterov;
    tdm_optim *o;
    CHECK_OK(tdm_optim_create(&o, &c, p));
    double w[3], buf[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) w[i] = w0[i];
    for (int step = 0; step < 3; step++) {
      CHECK_OK(tdm_optim_step(o, c.lr));
      for (int i = 0; i < 3; i++) {
        double d = g[i] + 0.01 * w[i];
        buf[i] = step == 0 ? d : 0.9 * buf[i] + d;
        w[i] -= 0.1 * (nesterov ? d + 0.9 * buf[i] : buf[i]);
        CHECK_NEAR(tdm_params_data(p)[i], w[i], 1e-6);
      }
    }
    tdm_optim_destroy(o);
    tdm_params_destroy(p);
  }
}

static void test_adam_and_adamw(void) {
  const float w0[3] = {1, -2, 0.5f}, g[3] = {0.1f, 0.25f, -0.3f}; /* no exact L2 cancellation */
  for (int kind = TDM_OPT_ADAM; kind <= TDM_OPT_ADAMW; kind++) {
    tdm_params *p = make_params(w0, g);
    tdm_optim_config c = tdm_optim_config_default((tdm_optim_kind)kind);
    c.lr = 0.01f;
    c.weight_decay = 0.1f;
    c.decay_matrices_only = 1; /* "b" is declared without decay */
    tdm_optim *o;
    CHECK_OK(tdm_optim_create(&o, &c, p));
    double w[3], m[3] = {0}, v[3] = {0};
    for (int i = 0; i < 3; i++) w[i] = w0[i];
    for (int t = 1; t <= 4; t++) {
      CHECK_OK(tdm_optim_step(o, c.lr));
      for (int i = 0; i < 3; i++) {
        double wd = i < 2 ? 0.1 : 0.0, gi = g[i];
        if (kind == TDM_OPT_ADAM) gi += wd * w[i];
        else w[i] *= 1 - 0.01 * wd;
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.999 * v[i] + 0.001 * gi * gi;
        double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
        w[i] -= 0.01 * mh / (sqrt(vh) + 1e-8);
        CHECK_NEAR(tdm_params_data(p)[i], w[i], 2e-6);
      }
    }
    int64_t ns;
    CHECK(tdm_optim_state(o, &ns) != NULL && ns == 6 && tdm_optim_steps(o) == 4);
    tdm_optim_destroy(o);
    tdm_params_destroy(p);
  }
}

static void test_bad_config(void) {
  const float w0[3] = {0}, g[3] = {0};
  tdm_params *p = make_params(w0, g);
  tdm_optim_config c = tdm_optim_config_default(TDM_OPT_ADAM);
  c.beta1 = 1.0f;
  tdm_optim *o = NULL;
  CHECK(tdm_optim_create(&o, &c, p) == TDM_ERR_INVALID_ARG && o == NULL);
  CHECK_ERR_HAS("betas (1");
  c = tdm_optim_config_default(TDM_OPT_SGD);
  c.nesterov = 1;
  CHECK(tdm_optim_create(&o, &c, p) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("nesterov");
  tdm_params_destroy(p);
}

static void test_clip_grad_norm(void) {
  const float w0[3] = {0}, g[3] = {3, 0, 4};
  tdm_params *p = make_params(w0, g);
  float norm;
  CHECK_OK(tdm_clip_grad_norm(p, 10.0f, &norm));
  CHECK_NEAR(norm, 5.0, 1e-6);
  CHECK(tdm_params_grad(p)[0] == 3.0f); /* under the limit: untouched */
  CHECK_OK(tdm_clip_grad_norm(p, 1.0f, &norm));
  CHECK_NEAR(tdm_params_grad(p)[0], 0.6, 1e-6);
  CHECK_NEAR(tdm_params_grad(p)[2], 0.8, 1e-6);
  tdm_params_grad(p)[1] = NAN;
  CHECK(tdm_clip_grad_norm(p, 1.0f, &norm) == TDM_ERR_INVALID_ARG);
  tdm_params_destroy(p);
}

/* A model-sized buffer with several parameters of mixed decay, random values and gradients. */
static tdm_params *make_big(int64_t *numel) {
  tdm_params *p;
  tdm_tensor *t;
  static const int64_t sizes[5] = {1000, 37, 5000, 1, 2300};
  tdm_params_create(&p);
  for (int i = 0; i < 5; i++) {
    char name[16];
    snprintf(name, sizeof name, "p%d", i);
    tdm_params_declare(p, name, 1, &sizes[i], (tdm_init){TDM_INIT_NORMAL, 0, 1}, i % 2 == 0, &t);
  }
  tdm_params_finalize(p, 7);
  *numel = tdm_params_numel(p);
  tdm_rng r;
  tdm_rng_seed(&r, 99);
  for (int64_t i = 0; i < *numel; i++) tdm_params_grad(p)[i] = tdm_rng_normal(&r) * 0.1f;
  return p;
}

/* An optimizer over spans, with the spans' values and gradients held elsewhere (as a ZeRO shard
 * is), updates exactly what the whole-buffer optimizer updates there: bit for bit. */
static void test_optimizer_spans(void) {
  for (int kind = 0; kind < TDM_OPT_KIND_COUNT; kind++) {
    int64_t n;
    tdm_params *full = make_big(&n), *part = make_big(&n);
    tdm_optim_config c = tdm_optim_config_default((tdm_optim_kind)kind);
    c.weight_decay = 0.05f, c.decay_matrices_only = 1, c.momentum = kind == TDM_OPT_SGD ? 0.9f : 0.0f;
    /* spans that cut parameters in the middle and across decay changes */
    tdm_optim_span sp[3] = {{10, 1020}, {1030, 1040}, {6000, n}};
    float *w[3], *g[3];
    tdm_optim *of, *op;
    CHECK_OK(tdm_optim_create(&of, &c, full));
    CHECK_OK(tdm_optim_create_spans(&op, &c, part, 3, sp));
    int64_t owned = 0;
    for (int i = 0; i < 3; i++) {
      int64_t len = sp[i].hi - sp[i].lo;
      owned += len;
      w[i] = malloc(sizeof(float) * (size_t)len);
      g[i] = malloc(sizeof(float) * (size_t)len);
      memcpy(w[i], tdm_params_data(part) + sp[i].lo, sizeof(float) * (size_t)len);
      memcpy(g[i], tdm_params_grad(part) + sp[i].lo, sizeof(float) * (size_t)len);
      CHECK_OK(tdm_optim_set_span_buffers(op, i, w[i], g[i]));
    }
    CHECK(tdm_optim_owned(op) == owned);
    int64_t ns;
    tdm_optim_state(op, &ns);
    CHECK(ns == (kind == TDM_OPT_SGD ? owned : 2 * owned));
    for (int s = 0; s < 3; s++) {
      CHECK_OK(tdm_optim_step(of, 0.01f));
      CHECK_OK(tdm_optim_step(op, 0.01f));
    }
    int same = 1;
    for (int i = 0; i < 3; i++)
      same &= !memcmp(w[i], tdm_params_data(full) + sp[i].lo, sizeof(float) * (size_t)(sp[i].hi - sp[i].lo));
    CHECK_MSG(same, "%s over spans differs from the whole-buffer update", tdm_optim_kind_name((tdm_optim_kind)kind));
    /* the parameters' own buffer is not touched: the spans' values live elsewhere */
    tdm_params *fresh = make_big(&n);
    CHECK(!memcmp(tdm_params_data(part), tdm_params_data(fresh), sizeof(float) * (size_t)n));
    tdm_params_destroy(fresh);
    for (int i = 0; i < 3; i++) free(w[i]), free(g[i]);
    tdm_optim_destroy(of);
    tdm_optim_destroy(op);
    tdm_params_destroy(full);
    tdm_params_destroy(part);
  }
  int64_t n;
  tdm_params *p = make_big(&n);
  tdm_optim *o = NULL;
  tdm_optim_config c = tdm_optim_config_default(TDM_OPT_ADAM);
  tdm_optim_span bad[2] = {{100, 200}, {150, 300}};
  CHECK(tdm_optim_create_spans(&o, &c, p, 2, bad) == TDM_ERR_INVALID_ARG && o == NULL);
  CHECK_ERR_HAS("span 1 is [150, 300)");
  tdm_params_destroy(p);
}

/* The norm from a shard's segment sums, combined across "ranks" by adding zeros, is the norm of
 * the whole buffer bit for bit, for any split on segment boundaries. */
static void test_norm_same_for_every_layout(void) {
  int64_t n, nseg;
  tdm_params *p = make_big(&n);
  const int64_t *cut;
  CHECK_OK(tdm_params_segments(p, &cut, &nseg));
  CHECK(cut[0] == 0 && cut[nseg] == n && nseg > 5);
  float whole;
  CHECK_OK(tdm_clip_grad_norm(p, 0, &whole));
  double ref = 0;
  for (int64_t i = 0; i < n; i++) ref += (double)tdm_params_grad(p)[i] * tdm_params_grad(p)[i];
  CHECK_NEAR(whole, sqrt(ref), 1e-5 * sqrt(ref));
  double *sums = calloc((size_t)nseg, sizeof(double)), *part = calloc((size_t)nseg, sizeof(double));
  for (int ranks = 2; ranks <= 5; ranks++) {
    memset(sums, 0, sizeof(double) * (size_t)nseg);
    for (int r = 0; r < ranks; r++) { /* rank r holds segments [nseg r / ranks, nseg (r+1) / ranks) */
      int64_t s0 = nseg * r / ranks, s1 = nseg * (r + 1) / ranks;
      memset(part, 0, sizeof(double) * (size_t)nseg);
      float *copy = malloc(sizeof(float) * (size_t)(cut[s1] - cut[s0] + 1));
      memcpy(copy, tdm_params_grad(p) + cut[s0], sizeof(float) * (size_t)(cut[s1] - cut[s0]));
      CHECK_OK(tdm_grad_sumsq_segments(p, cut[s0], cut[s1], copy, part));
      for (int64_t s = 0; s < nseg; s++) sums[s] += part[s]; /* one non-zero term per segment: exact */
      free(copy);
    }
    float norm = (float)sqrt(tdm_grad_sumsq_combine(sums, nseg));
    CHECK_MSG(norm == whole, "%d ranks: %.9g vs %.9g", ranks, (double)norm, (double)whole);
  }
  CHECK(tdm_grad_sumsq_segments(p, 1, cut[1], tdm_params_grad(p), sums) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("segment boundaries");
  CHECK(tdm_clip_coef(5.0f, 10.0f) == 1.0f && tdm_clip_coef(5.0f, 0.0f) == 1.0f);
  CHECK_NEAR(tdm_clip_coef(5.0f, 1.0f), 0.2, 1e-6);
  free(sums);
  free(part);
  tdm_params_destroy(p);
}

static void test_schedules(void) {
  tdm_lr_schedule s = {TDM_LR_COSINE, 1.0f, 10, 110, 0.1f, 0, 0};
  CHECK_NEAR(tdm_lr_at(&s, 0), 0.1, 1e-7);  /* warm-up: (step + 1) / warmup */
  CHECK_NEAR(tdm_lr_at(&s, 9), 1.0, 1e-7);
  CHECK_NEAR(tdm_lr_at(&s, 10), 1.0, 1e-6);  /* cosine starts at the base */
  CHECK_NEAR(tdm_lr_at(&s, 60), 0.55, 1e-6); /* halfway: (base + min) / 2 */
  CHECK_NEAR(tdm_lr_at(&s, 110), 0.1, 1e-7);
  tdm_lr_schedule st = {TDM_LR_STEP, 0.5f, 0, 0, 0, 30, 0.1f};
  CHECK_NEAR(tdm_lr_at(&st, 29), 0.5, 1e-7);
  CHECK_NEAR(tdm_lr_at(&st, 30), 0.05, 1e-7);
  CHECK_NEAR(tdm_lr_at(&st, 95), 0.0005, 1e-9);
  tdm_lr_schedule k = {TDM_LR_CONSTANT, 0.3f, 0, 0, 0, 0, 0};
  CHECK(tdm_lr_at(&k, 1000) == 0.3f);
}

TDM_TEST_MAIN(T(test_sgd_momentum_nesterov), T(test_adam_and_adamw), T(test_bad_config), T(test_clip_grad_norm),
              T(test_optimizer_spans), T(test_norm_same_for_every_layout), T(test_schedules))
