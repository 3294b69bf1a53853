/* Activation recomputation: block and selective recomputation give the gradients of a run that
 * keeps everything, bit for bit (dropout on, so its masks must be drawn again identically), for
 * the GPT and the Llama, in f32 and with 16-bit activations; they hold less; the checkpoint op's
 * contract. */
#include "tdm_test.h"

typedef struct {
  float loss;
  float *grads;
  int64_t n;
  size_t peak; /* the tape's peak bytes */
} run_out;

/* One training micro-batch (forward, loss, backward) under a recompute mode. */
static run_out run(tdm_model *m, tdm_recompute mode, tdm_dtype autocast, int64_t B, int64_t T) {
  run_out r = {0};
  const tdm_model_config *mc = tdm_model_get_config(m);
  tdm_params *p = tdm_model_params(m);
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  CHECK_OK(tdm_tape_set_recompute(tp, mode));
  CHECK_OK(tdm_tape_set_autocast(tp, autocast));
  tdm_tape_set_training(tp, 1);
  for (int rep = 0; rep < 2; rep++) { /* the second step runs in the warmed arena */
    tdm_tape_reset(tp);
    tdm_tape_set_dropout_key(tp, 77, 5);
    int64_t shape[2] = {B, T};
    tdm_tensor *x = tdm_new(tp, TDM_I32, 2, shape), *y = tdm_new(tp, TDM_I32, 2, shape);
    for (int64_t i = 0; x && y && i < B * T; i++) {
      ((int32_t *)tdm_tensor_data(x))[i] = (int32_t)(tdm_hash64(3, (uint64_t)i) % (uint64_t)mc->vocab_size);
      ((int32_t *)tdm_tensor_data(y))[i] = (int32_t)(tdm_hash64(4, (uint64_t)i) % (uint64_t)mc->vocab_size);
    }
    tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(m, tp, x), y, -100);
    CHECK_MSG(loss != NULL, "%s", tdm_tape_error(tp));
    if (!loss) break;
    tdm_params_zero_grad(p);
    CHECK_OK(tdm_backward(tp, loss));
    r.loss = *(float *)tdm_tensor_data(loss);
  }
  r.n = tdm_params_numel(p);
  r.grads = malloc(sizeof(float) * (size_t)r.n);
  memcpy(r.grads, tdm_params_grad(p), sizeof(float) * (size_t)r.n);
  r.peak = tdm_arena_peak(tdm_tape_arena(tp));
  tdm_tape_destroy(tp);
  return r;
}

static void same_bits(tdm_model_config mc, const char *what, tdm_dtype autocast, int64_t B, int64_t T) {
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 11));
  if (!m) return;
  run_out base = run(m, TDM_RECOMPUTE_NONE, autocast, B, T);
  for (int mode = TDM_RECOMPUTE_BLOCK; mode < TDM_RECOMPUTE_COUNT; mode++) {
    run_out r = run(m, (tdm_recompute)mode, autocast, B, T);
    int64_t differ = 0;
    for (int64_t i = 0; i < r.n; i++) differ += memcmp(&r.grads[i], &base.grads[i], 4) != 0;
    printf("  %s %s, recompute %-9s: loss %.7f (keeping all: %.7f), %lld of %lld gradients differ, tape peak %.1f KiB (%.0f%% of keeping all)\n",
           what, tdm_dtype_name(autocast), tdm_recompute_name((tdm_recompute)mode), r.loss, base.loss, (long long)differ,
           (long long)r.n, (double)r.peak / 1024, 100.0 * (double)r.peak / (double)base.peak);
    CHECK(memcmp(&r.loss, &base.loss, 4) == 0);
    CHECK_MSG(differ == 0, "%s recompute %s: %lld gradients differ", what, tdm_recompute_name((tdm_recompute)mode), (long long)differ);
    CHECK_MSG(r.peak < base.peak, "%s recompute %s holds %zu bytes, keeping all %zu", what,
              tdm_recompute_name((tdm_recompute)mode), r.peak, base.peak);
    free(r.grads);
  }
  free(base.grads);
  tdm_model_destroy(m);
}

static void test_gpt_bit_identical(void) {
  tdm_model_config mc = tdm_model_config_gpt_mini();
  mc.n_layer = 3, mc.n_head = 4, mc.n_embd = 32, mc.block_size = 16, mc.dropout = 0.2f;
  same_bits(mc, "gpt", TDM_F32, 4, 16);
  same_bits(mc, "gpt", TDM_BF16, 4, 16); /* 16-bit activations: the rebuilt probabilities rounded alike */
}

static void test_llama_bit_identical(void) {
  tdm_model_config mc;
  CHECK_OK(tdm_model_config_llama("llama-mini", &mc));
  mc.n_layer = 3, mc.n_head = 4, mc.n_kv_head = 2, mc.n_embd = 32, mc.ffn_hidden = 48, mc.block_size = 16, mc.dropout = 0.2f;
  same_bits(mc, "llama", TDM_F32, 4, 16);
  same_bits(mc, "llama", TDM_F16, 4, 16);
  mc.tie_embeddings = 1;
  same_bits(mc, "llama tied", TDM_F32, 4, 16);
}

/* The checkpoint op: a function that changes the shape is refused; with gradients off it is the
 * function itself; nothing needing a gradient: also. */
static tdm_tensor *grow(tdm_tape *tp, tdm_tensor *x, const void *ctx) {
  (void)ctx;
  tdm_tensor *xs[2] = {x, x};
  return tdm_concat(tp, 2, xs, 0);
}
static tdm_tensor *twice(tdm_tape *tp, tdm_tensor *x, const void *ctx) { return tdm_mul(tp, x, (tdm_tensor *)ctx); }

static void test_checkpoint_contract(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t s[2] = {3, 4};
  tdm_tensor *w, *x;
  CHECK_OK(tdm_tensor_create(&w, TDM_F32, 2, s));
  CHECK_OK(tdm_tensor_create(&x, TDM_F32, 2, s));
  tdm_tensor_fill(w, 2.0);
  tdm_tensor_fill(x, 3.0);
  tdm_tensor_set_requires_grad(w, 1);
  CHECK(tdm_checkpoint(tp, grow, NULL, x, 1, &w) == NULL);
  CHECK(strstr(tdm_tape_error(tp), "it must keep the input's shape and dtype") != NULL);
  tdm_tape_reset(tp);
  tdm_tensor *y = tdm_checkpoint(tp, twice, w, x, 1, &w); /* y = x * w, recomputed in backward */
  CHECK(y && tdm_tensor_get(y, 5) == 6.0);
  CHECK(y && tdm_tape_num_nodes(tp) == 1);
  tdm_tensor *l = tdm_sum(tp, y, 0, NULL, 0);
  CHECK_OK(tdm_backward(tp, l));
  CHECK(tdm_tensor_grad(w) && tdm_tensor_get(tdm_tensor_grad(w), 7) == 3.0); /* d sum(x w) / dw = x */
  CHECK(tdm_tape_num_nodes(tp) == 2); /* the recomputed nodes were given back */
  tdm_tape_reset(tp);
  tdm_tape_set_grad_enabled(tp, 0);
  y = tdm_checkpoint(tp, twice, w, x, 1, &w);
  CHECK(y && tdm_tape_num_nodes(tp) == 0);
  tdm_tape_destroy(tp);
  tdm_tensor_destroy(w);
  tdm_tensor_destroy(x);
}

TDM_TEST_MAIN(T(test_gpt_bit_identical), T(test_llama_bit_identical), T(test_checkpoint_contract))
