/* Models and modules: the low-level MLP equals the autograd MLP, names and shapes follow PyTorch
 * and nanoGPT, initialisation statistics, dropout keyed by sample position, model input checks. */
#include "tdm_test.h"
#include "tandem/kernels.h"

static void test_lowlevel_mlp_equals_autograd(void) {
  tdm_model_config mc = tdm_model_config_mlp(); /* 784-512-256-10 with dropout 0.3 */
  tdm_model *a, *b;
  CHECK_OK(tdm_model_create(&a, &mc, 11));
  CHECK_OK(tdm_model_create(&b, &mc, 11));
  enum { B = 16 };
  static float x[B * 784];
  int32_t y[B];
  tdm_rng r;
  tdm_rng_seed(&r, 5);
  for (int i = 0; i < B * 784; i++) x[i] = tdm_rng_uniform(&r);
  for (int i = 0; i < B; i++) y[i] = (int32_t)(tdm_rng_next(&r) % 10);
  /* autograd path */
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_tape_set_training(tp, 1);
  tdm_tape_set_dropout_key(tp, 77, 1000);
  int64_t xs[2] = {B, 784}, ys[1] = {B};
  tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(a, tp, tdm_from_data(tp, TDM_F32, 2, xs, x)),
                                       tdm_from_data(tp, TDM_I32, 1, ys, y), -100);
  CHECK_OK(tdm_backward(tp, loss));
  /* low-level path */
  tdm_arena *ar;
  CHECK_OK(tdm_arena_create(&ar, 1 << 20));
  float l2;
  CHECK_OK(tdm_mlp_lowlevel_step(b, ar, x, y, B, 1, 77, 1000, &l2));
  float l1 = *(float *)tdm_tensor_data(loss);
  printf("  loss: autograd %.9g, low-level %.9g\n", l1, l2);
  CHECK(l1 == l2);
  tdm_params *pa = tdm_model_params(a), *pb = tdm_model_params(b);
  double mabs;
  double err = tdm_test_rel_err(tdm_params_grad(pb), tdm_params_grad(pa), tdm_params_numel(pa), 1e-7, 1e-6, &mabs);
  printf("  gradients: max |diff| %.3g over %lld parameters\n", mabs, (long long)tdm_params_numel(pa));
  CHECK(err <= 1.0);
  int zero = 1;
  for (int64_t i = 0; i < tdm_params_numel(pa); i++) zero &= tdm_params_grad(pa)[i] == 0.0f;
  CHECK(!zero);
  tdm_arena_destroy(ar);
  tdm_tape_destroy(tp);
  tdm_model_destroy(a);
  tdm_model_destroy(b);
}

static void test_names_and_shapes(void) {
  tdm_model_config mc = tdm_model_config_mlp();
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  tdm_params *p = tdm_model_params(m);
  const char *names[] = {"layers.0.weight", "layers.0.bias", "layers.3.weight", "layers.3.bias", "layers.6.weight",
                         "layers.6.bias"};
  CHECK(tdm_params_count(p) == 6);
  for (int i = 0; i < 6; i++) CHECK(!strcmp(tdm_tensor_name(tdm_params_get(p, i)), names[i]));
  CHECK(tdm_tensor_dim(tdm_params_find(p, "layers.0.weight"), 0) == 512); /* (out, in) as nn.Linear */
  CHECK(tdm_params_numel(p) == 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  /* one buffer: each parameter's data is its offset into it */
  CHECK((float *)tdm_tensor_data(tdm_params_get(p, 2)) == tdm_params_data(p) + tdm_params_offset(p, 2));
  tdm_model_destroy(m);

  mc = tdm_model_config_gpt_mini();
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  p = tdm_model_params(m);
  int64_t C = 256, L = 4, V = 256, BS = 128;
  int64_t expect = V * C + BS * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C;
  CHECK(tdm_params_numel(p) == expect);
  CHECK(tdm_params_find(p, "transformer.wte.weight") && tdm_params_find(p, "transformer.wpe.weight"));
  CHECK(tdm_params_find(p, "transformer.h.3.attn.c_attn.weight") &&
        tdm_tensor_dim(tdm_params_find(p, "transformer.h.3.attn.c_attn.weight"), 0) == 3 * C);
  CHECK(tdm_params_find(p, "transformer.h.0.mlp.c_proj.weight") &&
        tdm_tensor_dim(tdm_params_find(p, "transformer.h.0.mlp.c_proj.weight"), 1) == 4 * C);
  CHECK(tdm_params_find(p, "transformer.ln_f.bias") && !tdm_params_find(p, "lm_head.weight")); /* tied */
  tdm_model_destroy(m);
}

static double stddev(const float *d, int64_t n, double *mean) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) {
    s += d[i];
    s2 += (double)d[i] * d[i];
  }
  *mean = s / (double)n;
  return sqrt(s2 / (double)n - *mean * *mean);
}

static void test_initialisation(void) {
  tdm_model_config mc = tdm_model_config_mlp();
  tdm_model *a, *b, *c;
  CHECK_OK(tdm_model_create(&a, &mc, 42));
  CHECK_OK(tdm_model_create(&b, &mc, 42));
  CHECK_OK(tdm_model_create(&c, &mc, 43));
  tdm_params *p = tdm_model_params(a);
  size_t bytes = sizeof(float) * (size_t)tdm_params_numel(p);
  CHECK(!memcmp(tdm_params_data(p), tdm_params_data(tdm_model_params(b)), bytes));
  CHECK(memcmp(tdm_params_data(p), tdm_params_data(tdm_model_params(c)), bytes) != 0);
  tdm_tensor *w = tdm_params_find(p, "layers.0.weight");
  double mean, sd = stddev(tdm_tensor_data(w), tdm_tensor_numel(w), &mean);
  double bound = 1 / sqrt(784.0); /* U(-b, b) has sd b / sqrt(3) */
  CHECK_NEAR(sd, bound / sqrt(3.0), 0.01 * bound);
  CHECK_NEAR(mean, 0.0, 0.01 * bound);
  const float *wd = tdm_tensor_data(w);
  for (int64_t i = 0; i < tdm_tensor_numel(w); i++) CHECK(fabs(wd[i]) <= bound);
  tdm_model_destroy(a);
  tdm_model_destroy(b);
  tdm_model_destroy(c);
  mc = tdm_model_config_gpt_mini();
  CHECK_OK(tdm_model_create(&a, &mc, 1));
  p = tdm_model_params(a);
  w = tdm_params_find(p, "transformer.h.0.attn.c_attn.weight");
  CHECK_NEAR(stddev(tdm_tensor_data(w), tdm_tensor_numel(w), &mean), 0.02, 0.0005);
  w = tdm_params_find(p, "transformer.h.0.mlp.c_proj.weight");
  CHECK_NEAR(stddev(tdm_tensor_data(w), tdm_tensor_numel(w), &mean), 0.02 / sqrt(8.0), 0.0005);
  CHECK(tdm_tensor_get(tdm_params_find(p, "transformer.ln_f.weight"), 7) == 1.0);
  CHECK(tdm_tensor_get(tdm_params_find(p, "transformer.h.1.attn.c_attn.bias"), 7) == 0.0);
  tdm_model_destroy(a);
}

static void test_dropout_is_keyed_by_sample(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_tape_set_training(tp, 1);
  int64_t s[2] = {400, 250};
  tdm_tensor *x = tdm_zeros(tp, TDM_F32, 2, s);
  tdm_tensor_fill(x, 1.0);
  tdm_tape_set_dropout_key(tp, 9, 0);
  tdm_tensor *y = tdm_dropout(tp, x, 0.3f);
  const float *yd = tdm_tensor_data(y);
  int64_t dropped = 0;
  for (int64_t i = 0; i < 100000; i++) {
    dropped += yd[i] == 0.0f;
    CHECK(yd[i] == 0.0f || fabsf(yd[i] - 1.0f / 0.7f) < 1e-6f);
  }
  CHECK_NEAR(dropped / 1e5, 0.3, 0.006); /* 4 standard errors */
  /* rows 100..399 run as their own batch with sample_base 100 get the very same mask (a fresh
   * tape, so the dropout call counter starts at the same place) */
  int64_t s2[2] = {300, 250};
  tdm_tape *tp2;
  CHECK_OK(tdm_tape_create(&tp2, 0));
  tdm_tape_set_training(tp2, 1);
  tdm_tape_set_dropout_key(tp2, 9, 100);
  tdm_tensor *x3 = tdm_zeros(tp2, TDM_F32, 2, s2);
  tdm_tensor_fill(x3, 1.0);
  tdm_tensor *y3 = tdm_dropout(tp2, x3, 0.3f);
  CHECK(!memcmp(tdm_tensor_data(y3), yd + 100 * 250, sizeof(float) * 300 * 250));
  /* evaluation mode passes x through */
  tdm_tape_set_training(tp2, 0);
  CHECK(tdm_dropout(tp2, x3, 0.3f) == x3);
  tdm_tape_destroy(tp);
  tdm_tape_destroy(tp2);
}

static void test_model_forward_shapes_and_errors(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_model_config mc = tdm_model_config_gpt_mini();
  mc.n_layer = 2;
  mc.block_size = 16;
  tdm_model *g;
  CHECK_OK(tdm_model_create(&g, &mc, 1));
  int64_t is[2] = {2, 16};
  int32_t tok[32];
  for (int i = 0; i < 32; i++) tok[i] = (i * 37) % 256;
  tdm_tensor *idx = tdm_from_data(tp, TDM_I32, 2, is, tok);
  tdm_tensor *logits = tdm_model_forward(g, tp, idx);
  CHECK(logits && tdm_tensor_ndim(logits) == 3 && tdm_tensor_dim(logits, 2) == 256);
  /* near-uniform predictions at initialisation: loss on unrelated targets close to ln(256)
   * (the input tokens themselves score higher through the tied embedding) */
  int32_t tgt[32];
  for (int i = 0; i < 32; i++) tgt[i] = (tok[i] + 101) % 256;
  tdm_tensor *loss = tdm_cross_entropy(tp, logits, tdm_from_data(tp, TDM_I32, 2, is, tgt), -100);
  if (loss) printf("  gpt loss at init %.4f, ln(256) = %.4f\n", *(float *)tdm_tensor_data(loss), log(256.0));
  /* logits of std ~0.02 sqrt(C) add about sigma^2 / 2 and some tied-embedding structure */
  CHECK(loss && *(float *)tdm_tensor_data(loss) > log(256.0) - 0.05 && *(float *)tdm_tensor_data(loss) < log(256.0) + 0.5);
  CHECK_OK(tdm_backward(tp, loss));
  /* the tied embedding receives gradient from both its uses */
  tdm_tensor *wte = tdm_params_find(tdm_model_params(g), "transformer.wte.weight");
  const float *gw = tdm_tensor_data(tdm_tensor_grad(wte));
  CHECK(gw[255 * 256] != 0.0f); /* token 255 never appears in the input: gradient only through lm_head */
  tdm_tape_reset(tp);
  int64_t big[2] = {1, 17};
  CHECK(tdm_model_forward(g, tp, tdm_zeros(tp, TDM_I32, 2, big)) == NULL);
  CHECK(strstr(tdm_tape_error(tp), "block_size") && strstr(tdm_tape_error(tp), "(1, 17)"));
  tdm_model_destroy(g);
  mc.n_head = 3; /* 3 does not divide 256 */
  CHECK(tdm_model_create(&g, &mc, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("3 heads do not divide the width 256");

  tdm_model_config cc = tdm_model_config_cnn();
  tdm_model *c;
  CHECK_OK(tdm_model_create(&c, &cc, 1));
  tdm_tape_reset(tp);
  int64_t xs[4] = {3, 1, 28, 28};
  tdm_tensor *out = tdm_model_forward(c, tp, tdm_zeros(tp, TDM_F32, 4, xs));
  CHECK(out && tdm_tensor_dim(out, 0) == 3 && tdm_tensor_dim(out, 1) == 10);
  tdm_tape_reset(tp);
  int64_t wrong[2] = {3, 784};
  CHECK(tdm_model_forward(c, tp, tdm_zeros(tp, TDM_F32, 2, wrong)) == NULL);
  CHECK(strstr(tdm_tape_error(tp), "cnn"));
  tdm_model_destroy(c);
  tdm_tape_destroy(tp);
}

static void test_kv_cache_equals_full_forward(void) {
  tdm_model_config mc = tdm_model_config_gpt_mini();
  mc.n_layer = 2, mc.n_head = 4, mc.n_embd = 32, mc.block_size = 16;
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 5));
  int32_t toks[12];
  for (int i = 0; i < 12; i++) toks[i] = (int32_t)((i * 71 + 13) % 256);
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_tape_set_grad_enabled(tp, 0);
  int64_t shape[2] = {1, 12};
  tdm_tensor *full = tdm_model_forward(m, tp, tdm_from_data(tp, TDM_I32, 2, shape, toks));
  CHECK(full != NULL);
  tdm_kv_cache *kv;
  CHECK_OK(tdm_kv_cache_create(&kv, m));
  double worst = 0;
  for (int t = 0; full && t < 12; t++) {
    const float *lg;
    CHECK_OK(tdm_kv_cache_step(kv, toks[t], &lg));
    const float *ref = (const float *)tdm_tensor_data(full) + (size_t)t * 256;
    for (int v = 0; v < 256; v++) worst = fmax(worst, fabs((double)lg[v] - ref[v]));
    CHECK(tdm_sample_token(lg, 256, 1.0f, 1, NULL) == tdm_sample_token(ref, 256, 1.0f, 1, NULL)); /* greedy agrees */
  }
  printf("  kv cache vs full forward: max |logit diff| %.3g over 12 positions\n", worst);
  CHECK(worst < 1e-4);
  CHECK(tdm_kv_cache_len(kv) == 12);
  const float *lg;
  for (int t = 12; t < 16; t++) CHECK_OK(tdm_kv_cache_step(kv, 1, &lg));
  CHECK(tdm_kv_cache_step(kv, 1, &lg) == TDM_ERR_INVALID_ARG); /* the block is full */
  CHECK_ERR_HAS("context is full");
  tdm_kv_cache_reset(kv);
  CHECK(tdm_kv_cache_step(kv, 300, &lg) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("token 300");
  /* sampling: top_k 1 is greedy; a low temperature with top-k 2 never leaves the top two */
  float l[5] = {0.1f, 3.0f, 2.9f, -1.0f, 0.0f};
  tdm_rng r;
  tdm_rng_seed(&r, 1);
  CHECK(tdm_sample_token(l, 5, 0.8f, 1, &r) == 1);
  for (int i = 0; i < 200; i++) {
    int32_t k = tdm_sample_token(l, 5, 1.0f, 2, &r);
    CHECK(k == 1 || k == 2);
  }
  tdm_kv_cache_destroy(kv);
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
}

/* Llama: the cache holds the rotated keys of the key/value heads only (GQA) and a capacity below
 * the block; its logits equal the full forward's at every position, tied and untied, with and
 * without Llama 3's rope scaling (at positions past the short wavelengths). */
static void test_llama_kv_cache_equals_full_forward(void) {
  for (int variant = 0; variant < 2; variant++) {
    tdm_model_config mc;
    CHECK_OK(tdm_model_config_llama("llama-mini", &mc));
    mc.n_layer = 2, mc.n_head = 4, mc.n_kv_head = variant ? 1 : 2, mc.n_embd = 32, mc.ffn_hidden = 40, mc.block_size = 64;
    if (variant) mc.tie_embeddings = 1, mc.rope = (tdm_rope_config){500000.0f, 32.0f, 1.0f, 4.0f, 16};
    tdm_model *m;
    CHECK_OK(tdm_model_create(&m, &mc, 5));
    if (!m) return;
    enum { N = 40 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 71 + 13) % 256);
    tdm_tape *tp;
    CHECK_OK(tdm_tape_create(&tp, 0));
    tdm_tape_set_grad_enabled(tp, 0);
    int64_t shape[2] = {1, N};
    tdm_tensor *full = tdm_model_forward(m, tp, tdm_from_data(tp, TDM_I32, 2, shape, toks));
    CHECK_MSG(full != NULL, "%s", tdm_tape_error(tp));
    tdm_kv_cache *kv;
    CHECK_OK(tdm_kv_cache_create_len(&kv, m, N));
    CHECK(tdm_kv_cache_capacity(kv) == N);
    double worst = 0;
    for (int t = 0; full && t < N; t++) {
      const float *lg;
      CHECK_OK(tdm_kv_cache_step(kv, toks[t], &lg));
      const float *ref = (const float *)tdm_tensor_data(full) + (size_t)t * 256;
      for (int v = 0; v < 256; v++) worst = fmax(worst, fabs((double)lg[v] - ref[v]));
    }
    printf("  llama (%s) kv cache vs full forward: max |logit diff| %.3g over %d positions\n",
           variant ? "tied, 1 key/value head, scaled rope" : "2 key/value heads", worst, N);
    CHECK(worst < 1e-4);
    const float *lg;
    CHECK(tdm_kv_cache_step(kv, 1, &lg) == TDM_ERR_INVALID_ARG); /* the capacity is reached */
    CHECK_ERR_HAS("context is full");
    tdm_kv_cache_destroy(kv);
    tdm_tape_destroy(tp);
    tdm_model_destroy(m);
  }
}

/* Hugging Face's names and shapes; Llama 3.2 1B has 1.24 B parameters with its tied head (built in
 * reserved address space: nothing is touched); configurations that cannot work are refused. */
static void test_llama_config(void) {
  tdm_model_config mc;
  CHECK_OK(tdm_model_config_llama("llama-mini", &mc));
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  tdm_params *p = tdm_model_params(m);
  int64_t C = 256, F = 688, KV = 128, L = 4, V = 256;
  CHECK(tdm_params_numel(p) == 2 * V * C + L * (2 * C + 2 * C * C + 2 * KV * C + 3 * C * F) + C);
  const char *names[] = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                         "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                         "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                         "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
                         "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"};
  for (int i = 0; i < 10; i++) CHECK_MSG(!strcmp(tdm_tensor_name(tdm_params_get(p, i)), names[i]), "%d: %s", i, tdm_tensor_name(tdm_params_get(p, i)));
  CHECK(tdm_tensor_dim(tdm_params_find(p, "model.layers.3.self_attn.k_proj.weight"), 0) == KV);
  CHECK(tdm_tensor_dim(tdm_params_find(p, "model.layers.3.mlp.down_proj.weight"), 1) == F);
  CHECK(tdm_params_find(p, "model.norm.weight") && tdm_params_find(p, "lm_head.weight"));
  double mean;
  tdm_tensor *w = tdm_params_find(p, "model.layers.1.mlp.up_proj.weight");
  CHECK_NEAR(stddev(tdm_tensor_data(w), tdm_tensor_numel(w), &mean), 0.02, 0.0005);
  CHECK(tdm_tensor_get(tdm_params_find(p, "model.layers.2.input_layernorm.weight"), 5) == 1.0);
  tdm_model_destroy(m);

  CHECK_OK(tdm_model_config_llama("llama3.2-1B", &mc));
  CHECK_OK(tdm_model_create_with(&m, &mc, 1, TDM_RESERVE_DATA | TDM_RESERVE_GRAD));
  if (m) {
    printf("  llama3.2-1B: %lld parameters\n", (long long)tdm_params_numel(tdm_model_params(m)));
    CHECK(tdm_params_numel(tdm_model_params(m)) == 1235814400LL); /* Meta's figure, tied */
    CHECK(!tdm_params_find(tdm_model_params(m), "lm_head.weight"));
    tdm_model_destroy(m);
  }
  CHECK(tdm_model_config_llama("llama-7B", &mc) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("llama-7B");
  struct {
    int64_t heads, kv, width;
    const char *err;
  } bad[] = {{4, 3, 256, "3 key/value heads do not divide the 4 query heads"},
             {3, 1, 256, "3 heads do not divide the width 256"},
             {4, 2, 4 * 33, "head size 33"},
             {4, 0, 256, "expected all > 0"}};
  for (int i = 0; i < 4; i++) {
    CHECK_OK(tdm_model_config_llama("llama-mini", &mc));
    mc.n_head = bad[i].heads, mc.n_kv_head = bad[i].kv, mc.n_embd = bad[i].width;
    CHECK(tdm_model_create(&m, &mc, 1) == TDM_ERR_INVALID_ARG);
    CHECK_ERR_HAS(bad[i].err);
  }
  CHECK_OK(tdm_model_config_llama("llama-mini", &mc));
  mc.rope.theta = 0.5f;
  CHECK(tdm_model_create(&m, &mc, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rope theta 0.5");
}

/* Pooling kernels against the definition written out (every tap tested against the image's
 * bounds, the first maximum in (ky, kx) order, NaN propagating; the average over K x K with the
 * padding counted), on inputs full of ties, with NaNs, for the 2x2 stride-2 loop (rows of 21
 * outputs: its vectors and their tail) and the general one (odd sizes, padding); and the same bits
 * on 1 and on 3 threads. */
static void test_pooling_kernels(void) {
  const int64_t shapes[][7] = {{3, 5, 8, 8, 2, 2, 0}, {2, 3, 9, 7, 2, 2, 0}, {2, 4, 7, 9, 3, 2, 1},
                               {1, 3, 6, 5, 3, 1, 1}, {2, 2, 5, 5, 1, 1, 0}, {2, 3, 6, 42, 2, 2, 0}};
  for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
    int64_t N = shapes[c][0], C = shapes[c][1], H = shapes[c][2], W = shapes[c][3], K = shapes[c][4], S = shapes[c][5], P = shapes[c][6];
    int64_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, nx = N * C * H * W, ny = N * C * OH * OW;
    float *x = malloc(sizeof(float) * nx), *y[2], *ya = malloc(sizeof(float) * ny), *dy = malloc(sizeof(float) * ny);
    float *dx[2], *dxa[2];
    int32_t *am[2];
    tdm_rng r;
    tdm_rng_seed(&r, 7 + c);
    for (int64_t i = 0; i < nx; i++) x[i] = (float)(int)(tdm_rng_uniform(&r) * 4) - 2; /* 4 values: many ties */
    for (int64_t i = 0; i < ny; i++) dy[i] = tdm_rng_normal(&r);
    for (int64_t i = 0; i < nx; i++) /* NaNs at every place of a window, some windows with several (the last one wins) */
      if (tdm_rng_uniform(&r) < 0.05) x[i] = NAN;
    x[nx / 2] = NAN;
    for (int t = 0; t < 2; t++) {
      CHECK_OK(tdm_set_num_threads(t ? 3 : 1));
      /* 16 guard entries past the outputs: no store may reach them */
      y[t] = malloc(sizeof(float) * (ny + 16)), am[t] = malloc(sizeof(int32_t) * (ny + 16)), dx[t] = calloc(nx, 4), dxa[t] = calloc(nx, 4);
      for (int64_t i = ny; i < ny + 16; i++) y[t][i] = 7.0f, am[t][i] = 7;
      tdm_k_maxpool2d_fwd(y[t], am[t], x, N, C, H, W, K, S, P, OH, OW);
      tdm_k_maxpool2d_bwd(dx[t], dy, am[t], N, C, H, W, OH, OW);
      tdm_k_avgpool2d_fwd(ya, x, N, C, H, W, K, S, P, OH, OW);
      tdm_k_avgpool2d_bwd(dxa[t], dy, N, C, H, W, K, S, P, OH, OW);
    }
    CHECK_OK(tdm_set_num_threads(1));
    int bad = 0, nan_seen = 0;
    for (int64_t nc = 0; nc < N * C; nc++)
      for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++) {
          float best = 0, sum = 0;
          int32_t at = -1;
          for (int64_t ky = 0; ky < K; ky++)
            for (int64_t kx = 0; kx < K; kx++) {
              int64_t iy = oy * S - P + ky, ix = ox * S - P + kx;
              if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
              float v = x[nc * H * W + iy * W + ix];
              sum += v;
              if (at < 0 || v > best || isnan(v)) best = v, at = (int32_t)(iy * W + ix);
            }
          int64_t o = (nc * OH + oy) * OW + ox;
          nan_seen |= isnan(best);
          if (am[0][o] != at || !(y[0][o] == best || (isnan(best) && isnan(y[0][o])))) bad++;
          float avg = sum * (1.0f / (float)(K * K));
          if (!(ya[o] == avg || (isnan(avg) && isnan(ya[o])))) bad++;
        }
    CHECK_MSG(bad == 0, "pooling case %zu: %d outputs differ from the definition", c, bad);
    for (int t = 0; t < 2; t++)
      for (int64_t i = ny; i < ny + 16; i++) CHECK_MSG(y[t][i] == 7.0f && am[t][i] == 7, "pooling case %zu: a store past the outputs", c);
    CHECK_MSG(nan_seen, "pooling case %zu: the NaN reached no output", c);
    CHECK_MSG(!memcmp(y[0], y[1], sizeof(float) * ny) && !memcmp(am[0], am[1], sizeof(int32_t) * ny) &&
                  !memcmp(dx[0], dx[1], sizeof(float) * nx) && !memcmp(dxa[0], dxa[1], sizeof(float) * nx),
              "pooling case %zu: 1 and 3 threads differ", c);
    for (int t = 0; t < 2; t++) free(y[t]), free(am[t]), free(dx[t]), free(dxa[t]);
    free(x), free(ya), free(dy);
  }
}

TDM_TEST_MAIN(T(test_pooling_kernels), T(test_llama_kv_cache_equals_full_forward), T(test_llama_config), T(test_kv_cache_equals_full_forward), T(test_lowlevel_mlp_equals_autograd), T(test_names_and_shapes), T(test_initialisation),
              T(test_dropout_is_keyed_by_sample), T(test_model_forward_shapes_and_errors))
