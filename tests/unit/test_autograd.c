/* Autograd: finite-difference gradient checks for every op, hooks, no-grad, detach, sticky
 * errors that name the op and shapes, and the no-malloc steady state. */
#include "tdm_test.h"

#define TDM_TEST_TRY(x) do { tdm_status s_ = (x); if (s_ != TDM_OK) return s_; } while (0)

enum { NORMAL, POSITIVE, AWAY_FROM_ZERO, DISTINCT, INDEX };

typedef struct {
  int ndim;
  int64_t shape[4];
  int kind;
  int64_t index_max; /* INDEX: values in [0, index_max), with -100 for one entry if < 0 */
} spec;

static tdm_tensor *make(const spec *s, tdm_rng *r) {
  tdm_tensor *t;
  if (tdm_tensor_create(&t, s->kind == INDEX ? TDM_I64 : TDM_F32, s->ndim, s->shape) != TDM_OK) return NULL;
  int64_t n = tdm_tensor_numel(t);
  if (s->kind == INDEX) {
    int64_t *d = tdm_tensor_data(t);
    for (int64_t i = 0; i < n; i++) d[i] = (int64_t)(tdm_rng_next(r) % (uint64_t)llabs(s->index_max));
    if (s->index_max < 0 && n > 1) d[1] = -100; /* an ignored row */
    return t;
  }
  float *d = tdm_tensor_data(t);
  for (int64_t i = 0; i < n; i++) {
    float v = tdm_rng_normal(r);
    switch (s->kind) {
    case POSITIVE: v = 0.5f + fabsf(v); break;
    case AWAY_FROM_ZERO: v = (v >= 0 ? 0.2f : -0.2f) + v; break;
    case DISTINCT: v = (float)((i * 7919) % n) * 0.1f - 0.05f * (float)n; break; /* spaced > 2 eps apart */
    default: break;
    }
    d[i] = v;
  }
  tdm_tensor_set_requires_grad(t, 1);
  return t;
}

typedef tdm_tensor *(*fn_t)(tdm_tape *, tdm_tensor *const *, void *);

static tdm_tensor *g_matmul(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_matmul(tp, x[0], x[1], 0, 1); }
static tdm_tensor *g_matmul_t(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_matmul(tp, x[0], x[1], 1, 0); }
static tdm_tensor *g_bmm(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_matmul(tp, x[0], x[1], 0, 0); }
static tdm_tensor *g_linear(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_linear(tp, x[0], x[1], x[2]); }
static tdm_tensor *g_add(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_add(tp, x[0], x[1]); }
static tdm_tensor *g_sub(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_sub(tp, x[0], x[1]); }
static tdm_tensor *g_mul(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_mul(tp, x[0], x[1]); }
static tdm_tensor *g_div(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_div(tp, x[0], x[1]); }
static tdm_tensor *g_scale(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_scale(tp, x[0], -1.5f); }
static tdm_tensor *g_sum(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  int ax[1] = {1};
  return tdm_sum(tp, x[0], 1, ax, 0);
}
static tdm_tensor *g_mean(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  int ax[2] = {0, -1};
  return tdm_mean(tp, x[0], 2, ax, 1);
}
static tdm_tensor *g_relu(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_relu(tp, x[0]); }
static tdm_tensor *g_gelu(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_gelu(tp, x[0]); }
static tdm_tensor *g_tanh(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_tanh(tp, x[0]); }
static tdm_tensor *g_sigmoid(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_sigmoid(tp, x[0]); }
static tdm_tensor *g_softmax(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_softmax(tp, x[0], 1); }
static tdm_tensor *g_log_softmax(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_log_softmax(tp, x[0], -1); }
static tdm_tensor *g_ce(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_cross_entropy(tp, x[0], x[1], -100); }
static tdm_tensor *g_mse(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_mse(tp, x[0], x[1]); }
static tdm_tensor *g_layernorm(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_layernorm(tp, x[0], x[1], x[2], 1e-5f); }
static tdm_tensor *g_embedding(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_embedding(tp, x[0], x[1]); }
static tdm_tensor *g_dropout(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  tdm_tape_set_training(tp, 1);
  tdm_tape_set_dropout_key(tp, 5, 3);
  return tdm_dropout(tp, x[0], 0.4f);
}
static tdm_tensor *g_attention(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_attention(tp, x[0], 2); }
static tdm_tensor *g_conv(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_conv2d(tp, x[0], x[1], x[2], 2, 1); }
static tdm_tensor *g_maxpool(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_maxpool2d(tp, x[0], 3, 2, 1); }
static tdm_tensor *g_avgpool(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_avgpool2d(tp, x[0], 2, 2, 0); }
static tdm_tensor *g_concat(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_concat(tp, 2, x, 0); }
static tdm_tensor *g_split(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  tdm_tensor *parts[2];
  int64_t sizes[2] = {1, 3};
  if (tdm_split(tp, x[0], 1, 2, sizes, parts) != TDM_OK) return NULL;
  return tdm_mul(tp, tdm_sum(tp, parts[0], 0, NULL, 0), parts[1]); /* both parts reach the output */
}
static tdm_tensor *g_views(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c;
  int perm[3] = {2, 0, 1};
  int64_t shape[2] = {4, -1};
  tdm_tensor *v = tdm_permute(tp, x[0], perm);        /* (4, 2, 3), strided */
  v = tdm_slice(tp, v, 2, 1, 2);                      /* (4, 2, 2), strided */
  v = tdm_reshape(tp, v, 2, shape);                   /* copies, then (4, 4) */
  return tdm_mul(tp, v, tdm_transpose(tp, v, 0, 1));  /* a strided operand again */
}
static tdm_tensor *g_cast(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c; /* f32 -> f64 -> f32 keeps the values exact, so differences are clean */
  return tdm_scale(tp, tdm_cast(tp, tdm_cast(tp, x[0], TDM_F64), TDM_F32), 2.0f);
}

static tdm_tensor *g_rmsnorm(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_rmsnorm(tp, x[0], x[1], 1e-5f); }
static tdm_tensor *g_rope(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c; /* Llama 3's scaled frequencies at a far position: every branch of the scaling */
  tdm_rope_config rc = {500000.0f, 32.0f, 1.0f, 4.0f, 8192};
  return tdm_rope(tp, x[0], 2, &rc, 3000);
}
static tdm_tensor *g_swiglu(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_swiglu(tp, x[0], x[1]); }
static tdm_tensor *g_gqa(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_attention_gqa(tp, x[0], x[1], x[2], 4, 2); }
static tdm_tensor *g_lm_head(tdm_tape *tp, tdm_tensor *const *x, void *c) { (void)c; return tdm_lm_head(tp, x[0], x[1]); }
static tdm_tensor *g_tied(tdm_tape *tp, tdm_tensor *const *x, void *c) { /* the table's gradient from the head and the lookup */
  (void)c;
  return tdm_lm_head(tp, tdm_embedding(tp, x[0], x[1]), x[0]);
}

static const struct {
  const char *name;
  fn_t fn;
  int n;
  spec in[3];
  double atol, rtol;
} cases[] = {
    {"matmul_nt", g_matmul, 2, {{2, {3, 4}, NORMAL, 0}, {2, {5, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"matmul_tn", g_matmul_t, 2, {{2, {4, 3}, NORMAL, 0}, {2, {4, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"bmm", g_bmm, 2, {{3, {2, 3, 4}, NORMAL, 0}, {3, {2, 4, 2}, NORMAL, 0}}, 2e-3, 1e-2},
    {"linear", g_linear, 3, {{3, {2, 2, 5}, NORMAL, 0}, {2, {3, 5}, NORMAL, 0}, {1, {3}, NORMAL, 0}}, 2e-3, 1e-2},
    {"add", g_add, 2, {{3, {2, 3, 4}, NORMAL, 0}, {2, {3, 1}, NORMAL, 0}}, 2e-3, 1e-2},
    {"sub", g_sub, 2, {{2, {3, 1}, NORMAL, 0}, {3, {2, 1, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"mul", g_mul, 2, {{2, {3, 4}, NORMAL, 0}, {1, {4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"div", g_div, 2, {{2, {3, 4}, NORMAL, 0}, {2, {1, 4}, POSITIVE, 0}}, 2e-3, 1e-2},
    {"scale", g_scale, 1, {{2, {3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"sum", g_sum, 1, {{3, {2, 3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"mean", g_mean, 1, {{3, {2, 3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"relu", g_relu, 1, {{2, {4, 5}, AWAY_FROM_ZERO, 0}}, 2e-3, 1e-2},
    {"gelu", g_gelu, 1, {{2, {4, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"tanh", g_tanh, 1, {{2, {4, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"sigmoid", g_sigmoid, 1, {{2, {4, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"softmax", g_softmax, 1, {{3, {2, 4, 3}, NORMAL, 0}}, 2e-3, 1e-2},
    {"log_softmax", g_log_softmax, 1, {{2, {3, 6}, NORMAL, 0}}, 2e-3, 1e-2},
    {"cross_entropy", g_ce, 2, {{2, {5, 4}, NORMAL, 0}, {1, {5}, INDEX, -4}}, 2e-3, 1e-2},
    {"mse", g_mse, 2, {{2, {3, 4}, NORMAL, 0}, {2, {3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"layernorm", g_layernorm, 3, {{2, {3, 6}, NORMAL, 0}, {1, {6}, NORMAL, 0}, {1, {6}, NORMAL, 0}}, 5e-3, 2e-2},
    {"embedding", g_embedding, 2, {{2, {5, 3}, NORMAL, 0}, {2, {2, 3}, INDEX, 5}}, 2e-3, 1e-2},
    {"dropout", g_dropout, 1, {{2, {6, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"attention", g_attention, 1, {{3, {2, 4, 12}, NORMAL, 0}}, 2e-3, 1e-2},
    {"conv2d", g_conv, 3, {{4, {2, 2, 5, 4}, NORMAL, 0}, {4, {3, 2, 3, 3}, NORMAL, 0}, {1, {3}, NORMAL, 0}}, 5e-3, 1e-2},
    {"maxpool2d", g_maxpool, 1, {{4, {1, 2, 5, 5}, DISTINCT, 0}}, 2e-3, 1e-2},
    {"avgpool2d", g_avgpool, 1, {{4, {2, 1, 4, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"concat", g_concat, 2, {{2, {2, 3}, NORMAL, 0}, {2, {1, 3}, NORMAL, 0}}, 2e-3, 1e-2},
    {"split", g_split, 1, {{2, {3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"views", g_views, 1, {{3, {2, 3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"cast", g_cast, 1, {{2, {3, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"rmsnorm", g_rmsnorm, 2, {{2, {3, 6}, NORMAL, 0}, {1, {6}, NORMAL, 0}}, 5e-3, 2e-2},
    {"rope", g_rope, 1, {{3, {2, 3, 16}, NORMAL, 0}}, 2e-3, 1e-2},
    {"swiglu", g_swiglu, 2, {{2, {4, 5}, NORMAL, 0}, {2, {4, 5}, NORMAL, 0}}, 2e-3, 1e-2},
    {"lm_head", g_lm_head, 2, {{3, {2, 2, 4}, NORMAL, 0}, {2, {5, 4}, NORMAL, 0}}, 2e-3, 1e-2},
    {"lm_head_tied", g_tied, 2, {{2, {5, 4}, NORMAL, 0}, {2, {2, 3}, INDEX, 5}}, 2e-3, 1e-2},
    {"attention_gqa", g_gqa, 3, {{3, {2, 4, 16}, NORMAL, 0}, {3, {2, 4, 8}, NORMAL, 0}, {3, {2, 4, 8}, NORMAL, 0}}, 2e-3, 1e-2},
};

static void test_gradcheck_every_op(void) {
  tdm_rng r;
  tdm_rng_seed(&r, 2024);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tdm_tensor *in[3] = {0};
    for (int k = 0; k < cases[c].n; k++) in[k] = make(&cases[c].in[k], &r);
    tdm_gradcheck_opts o = {1e-2, cases[c].atol, cases[c].rtol};
    double err = -1;
    tdm_status st = tdm_gradcheck(cases[c].fn, NULL, cases[c].n, in, &o, &err);
    printf("  %-14s worst |diff| / tolerance %.3f\n", cases[c].name, err);
    CHECK_MSG(st == TDM_OK, "%s: %s", cases[c].name, tdm_last_error());
    for (int k = 0; k < cases[c].n; k++) tdm_tensor_destroy(in[k]);
  }
}

/* A wrong gradient must be caught: multiply the analytic one by 1.01 through a custom check. */
static tdm_tensor *g_wrong(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  (void)c; /* forward x^2 through mul, but backward sees x * x via detach on one side: half the gradient */
  return tdm_mul(tp, x[0], tdm_detach(tp, x[0]));
}

static void test_gradcheck_catches_errors(void) {
  spec s = {2, {2, 3}, POSITIVE, 0};
  tdm_rng r;
  tdm_rng_seed(&r, 1);
  tdm_tensor *x = make(&s, &r);
  tdm_gradcheck_opts o = {1e-2, 1e-3, 1e-2};
  double err;
  CHECK(tdm_gradcheck(g_wrong, NULL, 1, &x, &o, &err) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("finite differences");
  tdm_tensor_destroy(x);
}

typedef struct {
  int fired;
  int order[8];
  float grad_at_fire[8];
  tdm_tensor *params[8];
} hook_log;

static void on_ready(void *ctx, tdm_tensor *leaf) {
  hook_log *h = ctx;
  int k = 0;
  while (h->params[k] != leaf) k++;
  h->order[h->fired++] = k;
  h->grad_at_fire[k] = ((float *)tdm_tensor_data(tdm_tensor_grad(leaf)))[0];
}

static void test_hooks_fire_when_final(void) {
  /* y = w2 * relu(w1 * x) + w0 * x, w0 used first and also last, so w0 is final only at the end */
  tdm_model_config mc = tdm_model_config_mlp();
  mc.in_features = 4;
  mc.hidden[0] = 3;
  mc.hidden[1] = 3;
  mc.n_classes = 2;
  mc.dropout = 0;
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 3));
  tdm_params *p = tdm_model_params(m);
  hook_log h = {0};
  for (int i = 0; i < tdm_params_count(p); i++) {
    h.params[i] = tdm_params_get(p, i);
    tdm_tensor_set_grad_hook(h.params[i], on_ready, &h);
  }
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t xs[2] = {2, 4}, ys[1] = {2};
  float xd[8] = {1, 2, 3, 4, -1, 0.5f, 2, 1};
  int32_t yd[2] = {1, 0};
  tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(m, tp, tdm_from_data(tp, TDM_F32, 2, xs, xd)),
                                       tdm_from_data(tp, TDM_I32, 1, ys, yd), -100);
  CHECK_OK(tdm_backward(tp, loss));
  CHECK(h.fired == tdm_params_count(p));
  /* reverse layer order: the last linear's weight and bias are ready first */
  CHECK(h.order[0] == 4 || h.order[0] == 5);
  CHECK(h.order[h.fired - 1] == 0 || h.order[h.fired - 1] == 1);
  for (int i = 0; i < tdm_params_count(p); i++) /* the gradient seen by the hook is the final one */
    CHECK(h.grad_at_fire[i] == ((float *)tdm_tensor_data(tdm_tensor_grad(h.params[i])))[0]);
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
}

static void test_no_grad_and_detach(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t s[1] = {3};
  tdm_tensor *w;
  CHECK_OK(tdm_tensor_create(&w, TDM_F32, 1, s));
  tdm_tensor_fill(w, 2.0);
  tdm_tensor_set_requires_grad(w, 1);
  tdm_tape_set_grad_enabled(tp, 0);
  tdm_tensor *y = tdm_mul(tp, w, w);
  CHECK(y && !tdm_tensor_requires_grad(y));
  CHECK(tdm_tape_num_nodes(tp) == 0);
  CHECK(tdm_backward(tp, tdm_sum(tp, y, 0, NULL, 0)) == TDM_ERR_INVALID_USAGE);
  tdm_tape_set_grad_enabled(tp, 1);
  tdm_tape_reset(tp);
  y = tdm_sum(tp, tdm_mul(tp, w, tdm_detach(tp, w)), 0, NULL, 0); /* d/dw = detached w = 2 */
  CHECK_OK(tdm_backward(tp, y));
  CHECK(tdm_tensor_get(tdm_tensor_grad(w), 0) == 2.0);
  CHECK_OK(tdm_tensor_zero_grad(w));
  CHECK(tdm_tensor_get(tdm_tensor_grad(w), 2) == 0.0);
  /* tdm_backward_with without a seed: ones, d(sum(w * w)) = 2 w = 4 for a non-scalar output */
  tdm_tape_reset(tp);
  CHECK_OK(tdm_backward_with(tp, tdm_mul(tp, w, w), NULL));
  for (int i = 0; i < 3; i++) CHECK(tdm_tensor_get(tdm_tensor_grad(w), i) == 4.0);
  tdm_tensor_destroy(w);
  tdm_tape_destroy(tp);
}

static void test_errors_are_sticky_and_named(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t a[2] = {2, 3}, b[2] = {4, 5};
  tdm_tensor *x = tdm_zeros(tp, TDM_F32, 2, a), *y = tdm_zeros(tp, TDM_F32, 2, b);
  tdm_tensor *z = tdm_relu(tp, tdm_matmul(tp, x, y, 0, 0));
  CHECK(z == NULL);
  CHECK(tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  CHECK(strstr(tdm_tape_error(tp), "matmul") && strstr(tdm_tape_error(tp), "(2, 3)") &&
        strstr(tdm_tape_error(tp), "(4, 5)"));
  tdm_tape_reset(tp);
  CHECK(tdm_tape_status(tp) == TDM_OK);
  x = tdm_zeros(tp, TDM_F32, 2, a);
  CHECK(tdm_softmax(tp, x, 2) == NULL && strstr(tdm_tape_error(tp), "axis 2"));
  tdm_tape_reset(tp);
  tdm_tensor *bad = tdm_zeros(tp, TDM_BF16, 2, a);
  CHECK(tdm_softmax(tp, bad, 1) == NULL && strstr(tdm_tape_error(tp), "bf16")); /* an op without 16-bit support names it */
  tdm_tape_reset(tp);
  int64_t is[1] = {2};
  int32_t idx[2] = {0, 7};
  tdm_tensor *e = tdm_embedding(tp, tdm_zeros(tp, TDM_F32, 2, a), tdm_from_data(tp, TDM_I32, 1, is, idx));
  CHECK(e == NULL && strstr(tdm_tape_error(tp), "index 7"));
  tdm_tape_reset(tp);
  int32_t tg[2] = {1, 3};
  CHECK(tdm_cross_entropy(tp, tdm_zeros(tp, TDM_F32, 2, a), tdm_from_data(tp, TDM_I32, 1, is, tg), -100) == NULL);
  CHECK(strstr(tdm_tape_error(tp), "target 3"));
  tdm_tape_reset(tp);
  int64_t big[2] = {5, 4};
  CHECK(tdm_reshape(tp, tdm_zeros(tp, TDM_F32, 2, a), 2, big) == NULL && strstr(tdm_tape_error(tp), "reshape"));
  tdm_tape_destroy(tp);
}

/* ---- custom ops ----------------------------------------------------------------------------------
 * y[n, c] = x[n, c] * w[c] + (c == idx[n] ? x[n, c]^2 : 0): three inputs (one of them indices, no
 * gradient), saved tensors and arena bytes kept from forward; the gradient check then uses x again
 * after the op, so its gradient is summed from two consumers. */
static tdm_status mix_fwd(tdm_custom_ctx *c, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)n;
  int *calls = user;
  (*calls)++;
  tdm_tensor *x = in[0], *idx = in[1], *w = in[2];
  int64_t N = tdm_tensor_dim(x, 0), C = tdm_tensor_dim(x, 1);
  if (tdm_tensor_dim(w, 0) != C) return tdm_custom_fail(c, TDM_ERR_INVALID_ARG, "w has %lld entries; expected %lld",
                                                        (long long)tdm_tensor_dim(w, 0), (long long)C);
  int64_t *keep = tdm_custom_alloc(c, sizeof(int64_t));
  if (!keep) return TDM_ERR_NO_MEMORY;
  *keep = C;
  TDM_TEST_TRY(tdm_custom_save(c, x));
  TDM_TEST_TRY(tdm_custom_save(c, idx));
  TDM_TEST_TRY(tdm_custom_save(c, w));
  tdm_custom_set_state(c, keep);
  int64_t shape[2] = {N, C};
  tdm_tensor *y = tdm_new(tp, TDM_F32, 2, shape);
  if (!y) return tdm_tape_status(tp);
  const float *xd = tdm_tensor_data(x), *wd = tdm_tensor_data(w);
  const int64_t *id = tdm_tensor_data(idx);
  float *yd = tdm_tensor_data(y);
  for (int64_t i = 0; i < N; i++)
    for (int64_t k = 0; k < C; k++) yd[i * C + k] = xd[i * C + k] * wd[k] + (k == id[i] ? xd[i * C + k] * xd[i * C + k] : 0);
  *out = y;
  return TDM_OK;
}

static tdm_status mix_bwd(tdm_custom_ctx *c, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)user;
  if (n != 3 || tdm_custom_num_saved(c) != 3 || gin[1] != NULL || !tdm_custom_state(c)) return tdm_custom_fail(c, TDM_ERR_INTERNAL, "bad context");
  tdm_tensor *x = tdm_custom_saved(c, 0), *idx = tdm_custom_saved(c, 1), *w = tdm_custom_saved(c, 2);
  int64_t C = *(int64_t *)tdm_custom_state(c), N = tdm_tensor_numel(x) / C;
  const float *xd = tdm_tensor_data(x), *wd = tdm_tensor_data(w), *g = tdm_tensor_data(gy);
  const int64_t *id = tdm_tensor_data(idx);
  float *gx = gin[0] ? tdm_tensor_data(gin[0]) : NULL, *gw = gin[2] ? tdm_tensor_data(gin[2]) : NULL;
  for (int64_t i = 0; i < N; i++)
    for (int64_t k = 0; k < C; k++) {
      float gv = g[i * C + k];
      if (gx) gx[i * C + k] += gv * (wd[k] + (k == id[i] ? 2 * xd[i * C + k] : 0)); /* adds: right in both modes */
      if (gw) gw[k] += gv * xd[i * C + k];
    }
  return TDM_OK;
}

static const tdm_custom_op mix_ops[2] = {{"mix", mix_fwd, mix_bwd, 0}, {"mix_acc", mix_fwd, mix_bwd, 1}};
static int mix_mode;

/* x is also used before the op, so in accumulate mode its gradient already holds a contribution */
static tdm_tensor *g_custom(tdm_tape *tp, tdm_tensor *const *x, void *c) {
  tdm_tensor *in[3] = {tdm_scale(tp, x[0], 1.0f), x[1], x[2]};
  tdm_tensor *y = tdm_custom(tp, &mix_ops[mix_mode], c, 3, in);
  return tdm_add(tp, tdm_mul(tp, y, tdm_tanh(tp, x[0])), tdm_sum(tp, tdm_mul(tp, in[0], in[0]), 0, NULL, 0));
}

static void test_custom_op_gradcheck(void) {
  tdm_rng r;
  tdm_rng_seed(&r, 77);
  spec sx = {2, {4, 5}, NORMAL, 0}, si = {1, {4}, INDEX, 5}, sw = {1, {5}, NORMAL, 0};
  tdm_tensor *in[3] = {make(&sx, &r), make(&si, &r), make(&sw, &r)};
  for (mix_mode = 0; mix_mode < 2; mix_mode++) { /* zeros to write into; the input's gradient to add to */
    int calls = 0;
    tdm_gradcheck_opts o = {1e-2, 2e-3, 1e-2};
    double err = -1;
    CHECK_OK(tdm_gradcheck(g_custom, &calls, 3, in, &o, &err));
    printf("  custom op (%s) worst |diff| / tolerance %.3f over %d forward calls\n", mix_mode ? "accumulate" : "zeros", err, calls);
    CHECK(calls > 2 * (20 + 5)); /* a central difference per element of x and w, at least */
  }
  for (int k = 0; k < 3; k++) tdm_tensor_destroy(in[k]);
}

/* An identity forward whose backward doubles the gradient: the output is a new tensor over the
 * input's data, and the gradient is exactly twice the closed form. */
static tdm_status id_fwd(tdm_custom_ctx *c, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)c, (void)tp, (void)n, (void)user;
  *out = in[0];
  return TDM_OK;
}
static tdm_status twice_bwd(tdm_custom_ctx *c, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)c, (void)n, (void)user;
  const float *g = tdm_tensor_data(gy);
  float *gx = tdm_tensor_data(gin[0]);
  for (int64_t i = 0; i < tdm_tensor_numel(gy); i++) gx[i] = 2 * g[i];
  return TDM_OK;
}
static tdm_status fail_fwd(tdm_custom_ctx *c, tdm_tape *tp, int n, tdm_tensor *const *in, void *user, tdm_tensor **out) {
  (void)tp, (void)n, (void)in, (void)user, (void)out;
  return tdm_custom_fail(c, TDM_ERR_REMOTE, "rank 1 went away");
}
static tdm_status fail_bwd(tdm_custom_ctx *c, const tdm_tensor *gy, int n, tdm_tensor *const *gin, void *user) {
  (void)gy, (void)n, (void)gin, (void)user;
  return tdm_custom_fail(c, TDM_ERR_TIMEOUT, "no answer within 2 s");
}

static void test_custom_op_identity_and_errors(void) {
  static const tdm_custom_op twice = {"twice", id_fwd, twice_bwd, 0}, bad_fwd = {"bad_fwd", fail_fwd, twice_bwd, 0},
                             bad_bwd = {"bad_bwd", id_fwd, fail_bwd, 0}, no_bwd = {"no_bwd", id_fwd, NULL, 0};
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t s[1] = {3};
  tdm_tensor *w;
  CHECK_OK(tdm_tensor_create(&w, TDM_F32, 1, s));
  float *wd = tdm_tensor_data(w);
  wd[0] = 1, wd[1] = -2, wd[2] = 0.5f;
  tdm_tensor_set_requires_grad(w, 1);
  /* loss = sum(twice(w) * w): d/dw = 2 w (through twice) + w (direct) = 3 w... the custom branch
   * doubles its w, so 2 * w + w */
  tdm_tensor *y = tdm_custom(tp, &twice, NULL, 1, &w);
  CHECK(y && y != w && tdm_tensor_data(y) == tdm_tensor_data(w));
  CHECK_OK(tdm_backward(tp, tdm_sum(tp, tdm_mul(tp, y, w), 0, NULL, 0)));
  for (int i = 0; i < 3; i++) CHECK(tdm_tensor_get(tdm_tensor_grad(w), i) == 3.0 * wd[i]);
  /* no gradient wanted: nothing recorded, and an op without backward is fine */
  tdm_tape_reset(tp);
  tdm_tape_set_grad_enabled(tp, 0);
  CHECK(tdm_custom(tp, &no_bwd, NULL, 1, &w) != NULL && tdm_tape_num_nodes(tp) == 0);
  tdm_tape_set_grad_enabled(tp, 1);
  CHECK(tdm_custom(tp, &no_bwd, NULL, 1, &w) == NULL && strstr(tdm_tape_error(tp), "'no_bwd' has no backward"));
  /* errors name the op and keep the status */
  tdm_tape_reset(tp);
  CHECK(tdm_custom(tp, &bad_fwd, NULL, 1, &w) == NULL && tdm_tape_status(tp) == TDM_ERR_REMOTE);
  CHECK(strstr(tdm_tape_error(tp), "op 'bad_fwd': rank 1 went away"));
  tdm_tape_reset(tp);
  tdm_tensor *z = tdm_sum(tp, tdm_custom(tp, &bad_bwd, NULL, 1, &w), 0, NULL, 0);
  CHECK(z != NULL);
  CHECK(tdm_backward(tp, z) == TDM_ERR_TIMEOUT);
  CHECK_ERR_HAS("op 'bad_bwd' backward: no answer within 2 s");
  tdm_tensor_destroy(w);
  tdm_tape_destroy(tp);
}

/* Steps after the third must not touch the heap: the tape's arena has grown to the step's size
 * and the optimizer, clipping and the intra-op pool allocate nothing per step. */
static void steady_state(const tdm_model_config *mc, tdm_optim_kind ok, int64_t B, int64_t T) {
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, mc, 1));
  tdm_optim_config oc = tdm_optim_config_default(ok);
  oc.decay_matrices_only = 1;
  tdm_optim *opt;
  CHECK_OK(tdm_optim_create(&opt, &oc, tdm_model_params(m)));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16)); /* small on purpose: it must grow, then settle */
  int gpt = mc->kind == TDM_MODEL_GPT, cnn = mc->kind == TDM_MODEL_CNN;
  uint64_t before = 0;
  for (int step = 0; step < 6; step++) {
    if (step == 3) before = tdm__malloc_count();
    tdm_tape_reset(tp);
    tdm_tape_set_training(tp, 1);
    tdm_tape_set_dropout_key(tp, (uint64_t)step, 0);
    int64_t xs[2] = {B, gpt ? T : mc->in_features}, ys[2] = {B, T}, is[4] = {B, mc->in_channels, mc->height, mc->width};
    tdm_tensor *x = cnn ? tdm_zeros(tp, TDM_F32, 4, is) : tdm_zeros(tp, gpt ? TDM_I32 : TDM_F32, 2, xs);
    tdm_tensor *y = tdm_zeros(tp, TDM_I32, gpt ? 2 : 1, ys);
    tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(m, tp, x), y, -100);
    tdm_params_zero_grad(tdm_model_params(m));
    CHECK_OK(tdm_backward(tp, loss));
    CHECK_OK(tdm_clip_grad_norm(tdm_model_params(m), 1.0f, NULL));
    CHECK_OK(tdm_optim_step(opt, 1e-3f));
  }
  CHECK_MSG(tdm__malloc_count() == before, "%s: %llu allocations in 3 steady-state steps", tdm_model_kind_name(mc->kind),
            (unsigned long long)(tdm__malloc_count() - before));
  tdm_tape_destroy(tp);
  tdm_optim_destroy(opt);
  tdm_model_destroy(m);
}

static void test_steady_state_allocates_nothing(void) {
  tdm_model_config mlp = tdm_model_config_mlp(); /* the real MLP, dropout on */
  steady_state(&mlp, TDM_OPT_ADAM, 32, 1);
  tdm_model_config gpt = tdm_model_config_gpt_mini(); /* a small GPT, dropout on, AdamW and clipping */
  gpt.n_layer = 2, gpt.n_embd = 64, gpt.n_head = 2, gpt.block_size = 32, gpt.dropout = 0.1f;
  steady_state(&gpt, TDM_OPT_ADAMW, 4, 32);
  tdm_model_config cnn = tdm_model_config_cnn(); /* the real CNN: its second convolution Winograd 5x5 where the direct path runs */
  steady_state(&cnn, TDM_OPT_SGD, 16, 1);
}

/* tdm_lm_head against tdm_linear (one product) on a table of 2 x TDM_HEAD_ROWS + 7 rows (three
 * blocks): the logits, the input's and the table's gradients (through a cross-entropy), untied and
 * tied to an embedding of the same table, within 1e-5 of the largest (the blocks sum the input's
 * gradient in another order) in f32 and 2e-2 under bf16 autocast (16-bit logits and gradients
 * rounded apart); a table of one block gives tdm_linear's bits in f32. */
static double worst_rel(const float *a, const float *b, int64_t n) {
  double d = tdm_test_max_abs_diff(a, b, n), m = 0; /* (a NaN: infinity, where fmax dropped it) */
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)b[i]));
  return m > 0 ? d / m : d;
}
static void test_lm_head_blocks(void) {
  tdm_rng r;
  tdm_rng_seed(&r, 7);
  for (int bf = 0; bf < 2; bf++)
    for (int tied = 0; tied < 2; tied++)
      for (int big = 0; big < 2; big++) {
        int64_t V = big ? 2 * TDM_HEAD_ROWS + 7 : 37, C = 6, N = 5, ws[2] = {V, C}, xs[2] = {N, C}, is[1] = {N};
        tdm_tensor *w[2], *x[2], *idx, *y, *logits[2];
        CHECK_OK(tdm_tensor_create(&idx, TDM_I64, 1, is));
        CHECK_OK(tdm_tensor_create(&y, TDM_I64, 1, is));
        for (int64_t i = 0; i < N; i++) /* a row in each block */
          ((int64_t *)tdm_tensor_data(idx))[i] = (i * 4099 + 3) % V, ((int64_t *)tdm_tensor_data(y))[i] = (i * 3001 + 11) % V;
        for (int k = 0; k < 2; k++) {
          CHECK_OK(tdm_tensor_create(&w[k], TDM_F32, 2, ws));
          CHECK_OK(tdm_tensor_create(&x[k], TDM_F32, 2, xs));
          tdm_tensor_set_requires_grad(w[k], 1), tdm_tensor_set_requires_grad(x[k], 1);
        }
        for (int64_t i = 0; i < V * C; i++) ((float *)tdm_tensor_data(w[0]))[i] = ((float *)tdm_tensor_data(w[1]))[i] = tdm_rng_normal(&r);
        for (int64_t i = 0; i < N * C; i++) ((float *)tdm_tensor_data(x[0]))[i] = ((float *)tdm_tensor_data(x[1]))[i] = tdm_rng_normal(&r);
        tdm_tape *tp[2];
        for (int k = 0; k < 2; k++) {
          CHECK_OK(tdm_tape_create(&tp[k], 1 << 22));
          if (bf) CHECK_OK(tdm_tape_set_autocast(tp[k], TDM_BF16));
          tdm_tensor *h = tied ? tdm_embedding(tp[k], w[k], idx) : x[k];
          logits[k] = k ? tdm_linear(tp[k], h, w[k], NULL) : tdm_lm_head(tp[k], h, w[k]);
          CHECK_OK(tdm_backward(tp[k], tdm_cross_entropy(tp[k], logits[k], y, -100)));
        }
        float l[2][2 * TDM_HEAD_ROWS + 7];
        for (int k = 0; k < 2; k++) {
          tdm_tensor *lf = logits[k];
          for (int64_t v = 0; v < V; v++) /* row 0's logits, as f32 */
            l[k][v] = bf ? tdm_bf16_to_f32(((const uint16_t *)tdm_tensor_data(lf))[v]) : ((const float *)tdm_tensor_data(lf))[v];
        }
        double tol = bf ? 2e-2 : 1e-5;
        const float *gw0 = tdm_tensor_data(tdm_tensor_grad(w[0])), *gw1 = tdm_tensor_data(tdm_tensor_grad(w[1]));
        double el = worst_rel(l[0], l[1], V), ew = worst_rel(gw0, gw1, V * C);
        double ex = tied ? 0 : worst_rel(tdm_tensor_data(tdm_tensor_grad(x[0])), tdm_tensor_data(tdm_tensor_grad(x[1])), N * C);
        printf("  %s, %s, %lld rows: logits %.2g, table's gradient %.2g, input's %.2g (relative to the largest)\n", bf ? "bf16" : "f32",
               tied ? "tied" : "untied", (long long)V, el, ew, ex);
        CHECK_MSG(el <= tol && ew <= tol && ex <= tol, "%s %s V %lld: logits %.3g, table %.3g, input %.3g from tdm_linear's", bf ? "bf16" : "f32",
                  tied ? "tied" : "untied", (long long)V, el, ew, ex);
        if (!big && !bf)
          CHECK_MSG(el == 0 && ew == 0 && ex == 0, "one block: not tdm_linear's bits (%.3g %.3g %.3g)", el, ew, ex);
        for (int k = 0; k < 2; k++) tdm_tape_destroy(tp[k]), tdm_tensor_destroy(w[k]), tdm_tensor_destroy(x[k]);
        tdm_tensor_destroy(idx), tdm_tensor_destroy(y);
      }
}

TDM_TEST_MAIN(T(test_gradcheck_every_op), T(test_gradcheck_catches_errors), T(test_hooks_fire_when_final),
              T(test_no_grad_and_detach), T(test_errors_are_sticky_and_named), T(test_custom_op_gradcheck),
              T(test_custom_op_identity_and_errors), T(test_steady_state_allocates_nothing), T(test_lm_head_blocks))
