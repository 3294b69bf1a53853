/* Every op, one MLP AdamW training run and one GPT block, against PyTorch-made fixtures
 * (tests/golden/make_fixtures.py). Prints the largest difference per case. */
#include "tdm_test.h"

#define FIX "tests/golden/fixtures/"
#define ATOL 1e-5
#define RTOL 1e-4

static tdm_safetensors *fx;

static tdm_tensor *heap_from(const tdm_st_tensor *s, int grad) {
  tdm_tensor *t;
  if (tdm_tensor_create(&t, s->dtype == TDM_I64 ? TDM_I64 : TDM_F32, s->ndim, s->shape) != TDM_OK) return NULL;
  memcpy(tdm_tensor_data(t), s->data, (size_t)s->nbytes);
  if (grad && s->dtype == TDM_F32) tdm_tensor_set_requires_grad(t, 1);
  return t;
}

static const tdm_st_tensor *get(const char *c, const char *what) {
  char name[128];
  snprintf(name, sizeof name, "%s.%s", c, what);
  return tdm_safetensors_find(fx, name);
}

static int compare(const char *label, const tdm_tensor *t, const tdm_st_tensor *ref) {
  if (!t || !ref) {
    fprintf(stderr, "  %s: missing %s\n", label, t ? "fixture" : "result");
    return 0;
  }
  int64_t n = tdm_tensor_numel(t);
  if (n * 4 != ref->nbytes) {
    fprintf(stderr, "  %s: %lld elements, fixture has %lld\n", label, (long long)n, (long long)(ref->nbytes / 4));
    return 0;
  }
  double mabs;
  double r = tdm_test_rel_err(tdm_tensor_data(t), ref->data, n, ATOL, RTOL, &mabs);
  printf("    %-28s max |diff| %.3g\n", label, mabs);
  if (!(r <= 1.0)) fprintf(stderr, "  %s: off by %.3g x tolerance\n", label, r);
  return r <= 1.0;
}

typedef tdm_tensor *(*op_fn)(tdm_tape *tp, tdm_tensor **in);

static tdm_tensor *f_matmul(tdm_tape *tp, tdm_tensor **in) { return tdm_matmul(tp, in[0], in[1], 0, 0); }
static tdm_tensor *f_matmul_tn(tdm_tape *tp, tdm_tensor **in) { return tdm_matmul(tp, in[0], in[1], 1, 0); }
static tdm_tensor *f_matmul_nt(tdm_tape *tp, tdm_tensor **in) { return tdm_matmul(tp, in[0], in[1], 0, 1); }
static tdm_tensor *f_matmul_tt(tdm_tape *tp, tdm_tensor **in) { return tdm_matmul(tp, in[0], in[1], 1, 1); }
static tdm_tensor *f_linear(tdm_tape *tp, tdm_tensor **in) { return tdm_linear(tp, in[0], in[1], in[2]); }
static tdm_tensor *f_add(tdm_tape *tp, tdm_tensor **in) { return tdm_add(tp, in[0], in[1]); }
static tdm_tensor *f_sub(tdm_tape *tp, tdm_tensor **in) { return tdm_sub(tp, in[0], in[1]); }
static tdm_tensor *f_mul(tdm_tape *tp, tdm_tensor **in) { return tdm_mul(tp, in[0], in[1]); }
static tdm_tensor *f_div(tdm_tape *tp, tdm_tensor **in) { return tdm_div(tp, in[0], in[1]); }
static tdm_tensor *f_scale(tdm_tape *tp, tdm_tensor **in) { return tdm_scale(tp, in[0], 0.37f); }
static tdm_tensor *f_sum_axes(tdm_tape *tp, tdm_tensor **in) {
  int ax[2] = {0, 2};
  return tdm_sum(tp, in[0], 2, ax, 0);
}
static tdm_tensor *f_mean_keep(tdm_tape *tp, tdm_tensor **in) {
  int ax[1] = {1};
  return tdm_mean(tp, in[0], 1, ax, 1);
}
static tdm_tensor *f_sum_all(tdm_tape *tp, tdm_tensor **in) { return tdm_sum(tp, in[0], 0, NULL, 0); }
static tdm_tensor *f_relu(tdm_tape *tp, tdm_tensor **in) { return tdm_relu(tp, in[0]); }
static tdm_tensor *f_gelu(tdm_tape *tp, tdm_tensor **in) { return tdm_gelu(tp, in[0]); }
static tdm_tensor *f_tanh(tdm_tape *tp, tdm_tensor **in) { return tdm_tanh(tp, in[0]); }
static tdm_tensor *f_sigmoid(tdm_tape *tp, tdm_tensor **in) { return tdm_sigmoid(tp, in[0]); }
static tdm_tensor *f_softmax(tdm_tape *tp, tdm_tensor **in) { return tdm_softmax(tp, in[0], 1); }
static tdm_tensor *f_log_softmax(tdm_tape *tp, tdm_tensor **in) { return tdm_log_softmax(tp, in[0], -1); }
static tdm_tensor *f_ce(tdm_tape *tp, tdm_tensor **in) { return tdm_cross_entropy(tp, in[0], in[1], -100); }
static tdm_tensor *f_mse(tdm_tape *tp, tdm_tensor **in) { return tdm_mse(tp, in[0], in[1]); }
static tdm_tensor *f_layernorm(tdm_tape *tp, tdm_tensor **in) { return tdm_layernorm(tp, in[0], in[1], in[2], 1e-5f); }
static tdm_tensor *f_embedding(tdm_tape *tp, tdm_tensor **in) { return tdm_embedding(tp, in[1], in[0]); }
static tdm_tensor *f_attention(tdm_tape *tp, tdm_tensor **in) { return tdm_attention(tp, in[0], 2); }
static tdm_tensor *f_conv(tdm_tape *tp, tdm_tensor **in) { return tdm_conv2d(tp, in[0], in[1], in[2], 2, 1); }
static tdm_tensor *f_conv_k5(tdm_tape *tp, tdm_tensor **in) { return tdm_conv2d(tp, in[0], in[1], in[2], 1, 2); }
static tdm_tensor *f_maxpool(tdm_tape *tp, tdm_tensor **in) { return tdm_maxpool2d(tp, in[0], 2, 2, 0); }
static tdm_tensor *f_avgpool(tdm_tape *tp, tdm_tensor **in) { return tdm_avgpool2d(tp, in[0], 3, 2, 1); }
static tdm_tensor *f_concat(tdm_tape *tp, tdm_tensor **in) { return tdm_concat(tp, 2, in, 1); }
static tdm_tensor *f_transpose(tdm_tape *tp, tdm_tensor **in) {
  return tdm_scale(tp, tdm_contiguous(tp, tdm_transpose(tp, in[0], 0, 2)), 1.0f);
}
static tdm_tensor *f_slice(tdm_tape *tp, tdm_tensor **in) { return tdm_scale(tp, tdm_slice(tp, in[0], 1, 1, 2), 1.0f); }
static tdm_tensor *f_reshape(tdm_tape *tp, tdm_tensor **in) {
  int64_t s[2] = {6, 4};
  return tdm_scale(tp, tdm_reshape(tp, in[0], 2, s), 1.0f);
}

static tdm_tensor *f_rmsnorm(tdm_tape *tp, tdm_tensor **in) { return tdm_rmsnorm(tp, in[0], in[1], 1e-5f); }
static tdm_tensor *f_rope(tdm_tape *tp, tdm_tensor **in) {
  tdm_rope_config rc = {10000.0f, 0, 0, 0, 0};
  return tdm_rope(tp, in[0], 2, &rc, 0);
}
static tdm_tensor *f_rope_llama3(tdm_tape *tp, tdm_tensor **in) {
  tdm_rope_config rc = {500000.0f, 32.0f, 1.0f, 4.0f, 8192};
  return tdm_rope(tp, in[0], 2, &rc, 1000);
}
static tdm_tensor *f_swiglu(tdm_tape *tp, tdm_tensor **in) { return tdm_swiglu(tp, in[0], in[1]); }
static tdm_tensor *f_gqa(tdm_tape *tp, tdm_tensor **in) { return tdm_attention_gqa(tp, in[0], in[1], in[2], 4, 2); }

static const struct {
  const char *name;
  op_fn fn;
} op_cases[] = {
    {"matmul", f_matmul},       {"matmul_tn", f_matmul_tn},     {"matmul_nt", f_matmul_nt},
    {"matmul_tt", f_matmul_tt}, {"bmm", f_matmul},              {"bmm_shared", f_matmul},
    {"linear", f_linear},       {"add_bcast", f_add},           {"sub_bcast", f_sub},
    {"mul_bcast", f_mul},       {"div", f_div},                 {"scale", f_scale},
    {"sum_axes", f_sum_axes},   {"mean_keep", f_mean_keep},     {"sum_all", f_sum_all},
    {"relu", f_relu},           {"gelu", f_gelu},               {"tanh", f_tanh},
    {"sigmoid", f_sigmoid},     {"softmax", f_softmax},         {"log_softmax", f_log_softmax},
    {"cross_entropy", f_ce},    {"cross_entropy_big", f_ce},    {"mse", f_mse},
    {"layernorm", f_layernorm}, {"embedding", f_embedding},     {"attention", f_attention},
    {"conv2d", f_conv},         {"conv2d_k5", f_conv_k5},       {"maxpool2d", f_maxpool},
    {"avgpool2d", f_avgpool},   {"concat", f_concat},           {"transpose", f_transpose},
    {"slice", f_slice},         {"reshape", f_reshape},         {"rmsnorm", f_rmsnorm},
    {"rope", f_rope},           {"rope_llama3", f_rope_llama3}, {"swiglu", f_swiglu},
    {"attention_gqa", f_gqa},
};

static void test_ops(void) {
  CHECK_OK(tdm_safetensors_load(&fx, FIX "ops.safetensors"));
  if (!fx) return;
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  for (size_t c = 0; c < sizeof op_cases / sizeof op_cases[0]; c++) {
    const char *name = op_cases[c].name;
    printf("  %s\n", name);
    tdm_tensor *in[4] = {0};
    int n = 0;
    for (; n < 4 && get(name, (char[]){'i', 'n', (char)('0' + n), 0}); n++)
      in[n] = heap_from(get(name, (char[]){'i', 'n', (char)('0' + n), 0}), 1);
    tdm_tape_reset(tp);
    tdm_tensor *y = op_cases[c].fn(tp, in);
    CHECK_MSG(y != NULL, "%s: %s", name, tdm_tape_error(tp));
    if (y) {
      CHECK_MSG(compare("out", y, get(name, "out")), "%s forward", name);
      tdm_tensor *g = heap_from(get(name, "gout"), 0);
      CHECK_OK(tdm_backward_with(tp, y, g));
      tdm_tensor_destroy(g);
      for (int k = 0; k < n; k++) {
        char w[8] = {'g', 'r', 'a', 'd', (char)('0' + k), 0};
        if (!tdm_tensor_requires_grad(in[k])) continue;
        CHECK_MSG(compare(w, tdm_tensor_grad(in[k]), get(name, w)), "%s %s", name, w);
      }
    }
    for (int k = 0; k < n; k++) {
      tdm_tensor_destroy(in[k]);
    }
  }
  tdm_tape_destroy(tp);
  tdm_safetensors_destroy(fx);
  fx = NULL;
}

static void copy_params(tdm_params *p, const tdm_safetensors *f, const char *prefix) {
  for (int i = 0; i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, tdm_tensor_name(t));
    const tdm_st_tensor *s = tdm_safetensors_find(f, name);
    CHECK_MSG(s && s->nbytes == tdm_tensor_numel(t) * 4, "fixture lacks %s", name);
    if (s) memcpy(tdm_tensor_data(t), s->data, (size_t)s->nbytes);
  }
}

static void compare_params(tdm_params *p, const tdm_safetensors *f, const char *prefix, int grads) {
  for (int i = 0; i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, tdm_tensor_name(t));
    CHECK_MSG(compare(name, grads ? tdm_tensor_grad(t) : t, tdm_safetensors_find(f, name)), "%s", name);
  }
}

static void test_mlp_adamw(void) {
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, FIX "mlp_adamw.safetensors"));
  if (!f) return;
  tdm_model_config mc = tdm_model_config_mlp();
  mc.in_features = 32;
  mc.hidden[0] = 24;
  mc.hidden[1] = 16;
  mc.dropout = 0.0f;
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  tdm_params *p = tdm_model_params(m);
  copy_params(p, f, "init.");
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  oc.lr = 1e-2f;
  oc.weight_decay = 0.05f;
  tdm_optim *opt;
  CHECK_OK(tdm_optim_create(&opt, &oc, p));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  const tdm_st_tensor *xs = tdm_safetensors_find(f, "x"), *ys = tdm_safetensors_find(f, "y"),
                      *ls = tdm_safetensors_find(f, "losses");
  for (int step = 0; step < 3; step++) {
    tdm_tape_reset(tp);
    tdm_tensor *x = tdm_from_data(tp, TDM_F32, 2, xs->shape, xs->data);
    tdm_tensor *y = tdm_from_data(tp, TDM_I64, 1, ys->shape, ys->data);
    tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(m, tp, x), y, -100);
    CHECK(loss != NULL);
    if (!loss) break;
    float l = *(float *)tdm_tensor_data(loss), ref = ((const float *)ls->data)[step];
    printf("    step %d loss %.7f (PyTorch %.7f)\n", step, l, ref);
    CHECK_NEAR(l, ref, 1e-5 + 1e-5 * fabs(ref));
    tdm_params_zero_grad(p);
    CHECK_OK(tdm_backward(tp, loss));
    if (step == 0) compare_params(p, f, "grad.", 1);
    CHECK_OK(tdm_optim_step(opt, oc.lr));
  }
  compare_params(p, f, "final.", 0);
  tdm_tape_destroy(tp);
  tdm_optim_destroy(opt);
  tdm_model_destroy(m);
  tdm_safetensors_destroy(f);
}

static void test_gpt_block(void) {
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, FIX "gpt_block.safetensors"));
  if (!f) return;
  tdm_params *p;
  CHECK_OK(tdm_params_create(&p));
  tdm_block_mod blk;
  CHECK_OK(tdm_block_mod_init(&blk, p, "transformer.h.0", 32, 4, 1, 0.0f));
  CHECK_OK(tdm_params_finalize(p, 1));
  copy_params(p, f, "");
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_tensor *x = heap_from(tdm_safetensors_find(f, "x"), 1), *g = heap_from(tdm_safetensors_find(f, "gout"), 0);
  tdm_tensor *y = tdm_block_mod_forward(tp, &blk, x);
  CHECK_MSG(y != NULL, "%s", tdm_tape_error(tp));
  if (y) {
    CHECK(compare("out", y, tdm_safetensors_find(f, "out")));
    CHECK_OK(tdm_backward_with(tp, y, g));
    CHECK(compare("grad.x", tdm_tensor_grad(x), tdm_safetensors_find(f, "grad.x")));
    compare_params(p, f, "grad.", 1);
  }
  tdm_tensor_destroy(x);
  tdm_tensor_destroy(g);
  tdm_tape_destroy(tp);
  tdm_params_destroy(p);
  tdm_safetensors_destroy(f);
}

static void test_gpt_tiny(void) {
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, FIX "gpt_tiny.safetensors"));
  if (!f) return;
  tdm_model_config mc = tdm_model_config_gpt_mini();
  mc.n_layer = 2;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.block_size = 8;
  mc.vocab_size = 32;
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  tdm_params *p = tdm_model_params(m);
  copy_params(p, f, "");
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  const tdm_st_tensor *is = tdm_safetensors_find(f, "idx"), *ts = tdm_safetensors_find(f, "targets");
  tdm_tensor *logits = tdm_model_forward(m, tp, tdm_from_data(tp, TDM_I64, 2, is->shape, is->data));
  tdm_tensor *loss = tdm_cross_entropy(tp, logits, tdm_from_data(tp, TDM_I64, 2, ts->shape, ts->data), -100);
  CHECK_MSG(loss != NULL, "%s", tdm_tape_error(tp));
  if (loss) {
    CHECK(compare("logits", logits, tdm_safetensors_find(f, "logits")));
    CHECK(compare("loss", loss, tdm_safetensors_find(f, "loss")));
    CHECK_OK(tdm_backward(tp, loss));
    compare_params(p, f, "grad.", 1);
  }
  /* three AdamW steps from the same start, decay on matrices only, betas (0.9, 0.95) */
  copy_params(p, f, "");
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  oc.lr = 3e-3f;
  oc.beta2 = 0.95f;
  oc.weight_decay = 0.1f;
  oc.decay_matrices_only = 1;
  tdm_optim *opt;
  CHECK_OK(tdm_optim_create(&opt, &oc, p));
  const tdm_st_tensor *ls = tdm_safetensors_find(f, "adamw.losses");
  for (int step = 0; ls && step < 3; step++) {
    tdm_tape_reset(tp);
    tdm_tensor *l2 = tdm_cross_entropy(tp, tdm_model_forward(m, tp, tdm_from_data(tp, TDM_I64, 2, is->shape, is->data)),
                                       tdm_from_data(tp, TDM_I64, 2, ts->shape, ts->data), -100);
    CHECK(l2 != NULL);
    if (!l2) break;
    float got = *(float *)tdm_tensor_data(l2), ref = ((const float *)ls->data)[step];
    printf("    AdamW step %d loss %.7f (PyTorch %.7f)\n", step, got, ref);
    CHECK_NEAR(got, ref, 1e-5 + 1e-5 * fabs(ref));
    tdm_params_zero_grad(p);
    CHECK_OK(tdm_backward(tp, l2));
    CHECK_OK(tdm_optim_step(opt, oc.lr));
  }
  /* The key slice of c_attn.bias has an exactly zero gradient in exact arithmetic (adding the
   * same q.b_k to a whole row of scores changes no softmax), so both frameworks hand Adam
   * rounding noise (~1e-9, against ~1e-2 for the query and value slices), and Adam's first steps
   * move by about lr x sign(noise): those 2 x 16 elements are zeroed on both sides first. */
  int64_t C = 16;
  for (int l = 0; l < 2; l++) {
    char name[96];
    snprintf(name, sizeof name, "transformer.h.%d.attn.c_attn.bias", l);
    float *mine = tdm_tensor_data(tdm_params_find(p, name));
    for (int64_t i = C; i < 2 * C; i++) mine[i] = 0;
  }
  for (int i = 0; i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[160];
    snprintf(name, sizeof name, "adamw.final.%s", tdm_tensor_name(t));
    const tdm_st_tensor *ref = tdm_safetensors_find(f, name);
    if (!ref) {
      CHECK_MSG(0, "fixture lacks %s", name);
      continue;
    }
    float buf[4096];
    const tdm_st_tensor *use = ref;
    tdm_st_tensor masked;
    if (strstr(name, "attn.c_attn.bias") && ref->nbytes <= (int64_t)sizeof buf) {
      memcpy(buf, ref->data, (size_t)ref->nbytes);
      for (int64_t k = C; k < 2 * C; k++) buf[k] = 0;
      masked = *ref;
      masked.data = buf;
      use = &masked;
    }
    CHECK_MSG(compare(name, t, use), "%s", name);
  }
  tdm_optim_destroy(opt);
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
  tdm_safetensors_destroy(f);
}

/* A Llama in Hugging Face's names against the PyTorch reference: logits, loss, every gradient and
 * (untied) three AdamW steps; the tied one also exercises Llama 3's rope scaling and one
 * key/value head shared by four. */
static void llama_case(const tdm_safetensors *f, const char *prefix, tdm_model_config mc, int adamw) {
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  if (!m) return;
  tdm_params *p = tdm_model_params(m);
  CHECK(tdm_params_find(p, "model.layers.1.self_attn.k_proj.weight") != NULL);
  CHECK((tdm_params_find(p, "lm_head.weight") != NULL) == !mc.tie_embeddings);
  copy_params(p, f, prefix);
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  char nm[64];
  snprintf(nm, sizeof nm, "%sidx", prefix);
  const tdm_st_tensor *is = tdm_safetensors_find(f, nm);
  snprintf(nm, sizeof nm, "%stargets", prefix);
  const tdm_st_tensor *ts = tdm_safetensors_find(f, nm);
  tdm_tensor *logits = tdm_model_forward(m, tp, tdm_from_data(tp, TDM_I64, 2, is->shape, is->data));
  tdm_tensor *loss = tdm_cross_entropy(tp, logits, tdm_from_data(tp, TDM_I64, 2, ts->shape, ts->data), -100);
  CHECK_MSG(loss != NULL, "%s", tdm_tape_error(tp));
  if (loss) {
    snprintf(nm, sizeof nm, "%slogits", prefix);
    CHECK(compare("logits", logits, tdm_safetensors_find(f, nm)));
    snprintf(nm, sizeof nm, "%sloss", prefix);
    CHECK(compare("loss", loss, tdm_safetensors_find(f, nm)));
    CHECK_OK(tdm_backward(tp, loss));
    snprintf(nm, sizeof nm, "%sgrad.", prefix);
    compare_params(p, f, nm, 1);
  }
  if (adamw) {
    copy_params(p, f, prefix);
    tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
    oc.lr = 3e-3f, oc.beta2 = 0.95f, oc.weight_decay = 0.1f, oc.decay_matrices_only = 1;
    tdm_optim *opt;
    CHECK_OK(tdm_optim_create(&opt, &oc, p));
    snprintf(nm, sizeof nm, "%sadamw.losses", prefix);
    const tdm_st_tensor *ls = tdm_safetensors_find(f, nm);
    for (int step = 0; ls && step < 3; step++) {
      tdm_tape_reset(tp);
      tdm_tensor *l2 = tdm_cross_entropy(tp, tdm_model_forward(m, tp, tdm_from_data(tp, TDM_I64, 2, is->shape, is->data)),
                                         tdm_from_data(tp, TDM_I64, 2, ts->shape, ts->data), -100);
      CHECK(l2 != NULL);
      if (!l2) break;
      float got = *(float *)tdm_tensor_data(l2), ref = ((const float *)ls->data)[step];
      printf("    AdamW step %d loss %.7f (PyTorch %.7f)\n", step, got, ref);
      CHECK_NEAR(got, ref, 1e-5 + 1e-5 * fabs(ref));
      tdm_params_zero_grad(p);
      CHECK_OK(tdm_backward(tp, l2));
      CHECK_OK(tdm_optim_step(opt, oc.lr));
    }
    snprintf(nm, sizeof nm, "%sadamw.final.", prefix);
    compare_params(p, f, nm, 0);
    tdm_optim_destroy(opt);
  }
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
}

static void test_llama_tiny(void) {
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, FIX "llama_tiny.safetensors"));
  if (!f) return;
  tdm_model_config mc;
  CHECK_OK(tdm_model_config_llama("llama-mini", &mc));
  mc.n_layer = 2, mc.n_head = 4, mc.n_kv_head = 2, mc.n_embd = 32, mc.ffn_hidden = 48, mc.block_size = 8, mc.vocab_size = 40;
  printf("  untied, 2 key/value heads\n");
  llama_case(f, "", mc, 1);
  mc.n_kv_head = 1, mc.ffn_hidden = 40, mc.tie_embeddings = 1;
  mc.rope = (tdm_rope_config){500000.0f, 32.0f, 1.0f, 4.0f, 8192};
  printf("  tied, 1 key/value head, Llama 3 rope scaling\n");
  llama_case(f, "tied.", mc, 0);
  tdm_safetensors_destroy(f);
}

TDM_TEST_MAIN(T(test_ops), T(test_mlp_adamw), T(test_gpt_block), T(test_gpt_tiny), T(test_llama_tiny))
