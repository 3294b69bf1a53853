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
              T(test_schedules))
