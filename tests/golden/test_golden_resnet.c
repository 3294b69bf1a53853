/* A small ResNet with batch norm against PyTorch (tests/golden/make_resnet_fixture.py): forward in
 * training mode, the loss and every gradient, the running statistics after one step, every
 * parameter and running statistic after 3 SGD steps (momentum, nesterov, weight decay on conv and
 * fc weights only), and evaluation mode with the running statistics. */
#include "tdm_test.h"

#define FIX "tests/golden/fixtures/resnet_small.safetensors"
#define ATOL 1e-5
#define RTOL 1e-4

static tdm_safetensors *fx;

static int compare(const char *label, const float *t, int64_t n, const char *ref_name) {
  const tdm_st_tensor *ref = tdm_safetensors_find(fx, ref_name);
  if (!t || !ref || ref->nbytes != n * 4) {
    fprintf(stderr, "  %s: missing or mis-sized (fixture %s)\n", label, ref_name);
    return 0;
  }
  double mabs, r = tdm_test_rel_err(t, ref->data, n, ATOL, RTOL, &mabs);
  if (!(r <= 1.0)) fprintf(stderr, "  %s: max |diff| %.3g, off by %.3g x tolerance\n", label, mabs, r);
  return r <= 1.0;
}

static tdm_model_config small(void) {
  tdm_model_config c;
  tdm_model_config_resnet("resnet20", 4, &c);
  c.height = c.width = 8, c.n_classes = 5, c.n_stages = 2, c.stage_blocks[0] = 2, c.stage_blocks[1] = 1;
  return c;
}

static tdm_tensor *batch(tdm_tape *tp, int i, tdm_tensor **y) {
  char xn[8], yn[8];
  snprintf(xn, sizeof xn, "x%d", i), snprintf(yn, sizeof yn, "y%d", i);
  const tdm_st_tensor *xs = tdm_safetensors_find(fx, xn), *ys = tdm_safetensors_find(fx, yn);
  if (!xs || !ys) return NULL;
  *y = tdm_from_data(tp, TDM_I32, 1, ys->shape, ys->data);
  return tdm_from_data(tp, TDM_F32, 4, xs->shape, xs->data);
}

static void test_resnet_golden(void) {
  CHECK_OK(tdm_safetensors_load(&fx, FIX));
  if (!fx) return;
  tdm_model_config c = small();
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &c, 1));
  if (!m) return;
  tdm_params *p = tdm_model_params(m);
  /* the initial values: init.<name> for every parameter, by name */
  int np = tdm_params_count(p);
  for (int i = 0; i < np; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[160];
    snprintf(name, sizeof name, "init.%s", tdm_tensor_name(t));
    const tdm_st_tensor *s = tdm_safetensors_find(fx, name);
    CHECK_MSG(s && s->nbytes == tdm_tensor_numel(t) * 4, "fixture lacks %s or its size differs", name);
    if (s && s->nbytes == tdm_tensor_numel(t) * 4) memcpy(tdm_tensor_data(t), s->data, (size_t)s->nbytes);
  }
  int fixture_params = 0;
  for (int i = 0; i < tdm_safetensors_count(fx); i++) fixture_params += !strncmp(tdm_safetensors_at(fx, i)->name, "init.", 5);
  CHECK_MSG(fixture_params == np, "the fixture has %d tensors, the model %d", fixture_params, np);
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_SGD);
  oc.lr = 0.1f, oc.momentum = 0.9f, oc.nesterov = 1, oc.weight_decay = 5e-4f, oc.decay_matrices_only = 1;
  tdm_optim *opt;
  CHECK_OK(tdm_optim_create(&opt, &oc, p));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  for (int step = 0; step < 3; step++) {
    tdm_tape_reset(tp);
    tdm_tape_set_training(tp, 1);
    tdm_tensor *y, *x = batch(tp, step, &y);
    tdm_tensor *logits = tdm_model_forward(m, tp, x);
    tdm_tensor *loss = tdm_cross_entropy(tp, logits, y, -100);
    tdm_params_zero_grad(p);
    CHECK_OK(tdm_backward(tp, loss));
    if (!loss) break;
    if (step == 0) {
      CHECK(compare("train logits", tdm_tensor_data(logits), tdm_tensor_numel(logits), "train.logits"));
      CHECK(compare("train loss", tdm_tensor_data(loss), 1, "train.loss"));
      for (int i = 0; i < np; i++) {
        tdm_tensor *t = tdm_params_get(p, i);
        char name[160];
        const char *n = tdm_tensor_name(t);
        int running = strstr(n, "running_") != NULL;
        snprintf(name, sizeof name, running ? "step1.%s" : "grad.%s", n);
        const float *v = running ? tdm_tensor_data(t) : tdm_params_grad(p) + tdm_params_offset(p, i);
        CHECK_MSG(compare(n, v, tdm_tensor_numel(t), name), "%s", name);
      }
    }
    CHECK_OK(tdm_optim_step(opt, 0.1f));
  }
  for (int i = 0; i < np; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[160];
    snprintf(name, sizeof name, "after.%s", tdm_tensor_name(t));
    CHECK_MSG(compare(name, tdm_tensor_data(t), tdm_tensor_numel(t), name), "%s", name);
  }
  tdm_tape_reset(tp);
  tdm_tape_set_training(tp, 0);
  tdm_tape_set_grad_enabled(tp, 0);
  tdm_tensor *y, *logits = tdm_model_forward(m, tp, batch(tp, 0, &y));
  CHECK(logits && compare("eval logits", tdm_tensor_data(logits), tdm_tensor_numel(logits), "eval.logits"));
  tdm_tape_destroy(tp);
  tdm_optim_destroy(opt);
  tdm_model_destroy(m);
  tdm_safetensors_destroy(fx);
}

int main(void) {
  tdm_test_case cases[] = {{"resnet_golden", test_resnet_golden}};
  return tdm_test_main(cases, 1);
}
