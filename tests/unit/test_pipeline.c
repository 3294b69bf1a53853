/* Pipeline schedules as data: the bubble of every generated schedule against its closed form, the
 * activations each rank holds, the order backwards run in, broken schedules the verifier must
 * refuse (naming rank, action and micro-batch), the trace, and the cut of a model into chunks. */
#include <unistd.h>

#include "tdm_test.h"

#include "core/json.h"
#include "parallel/pipeline_impl.h"

static tdm_pp_schedule *make(tdm_pp_schedule_kind k, int P, int V, int M) {
  tdm_pp_schedule *s = NULL;
  tdm_status st = tdm_pp_schedule_create(&s, k, P, V, M);
  CHECK_MSG(st == TDM_OK, "%s P %d V %d M %d: %s", tdm_pp_schedule_name(k), P, V, M, tdm_last_error());
  return s;
}

/* GPipe and 1F1B: bubble (P-1)/(M+P-1) with forward 1, backward 2; GPipe holds M micro-batches,
 * 1F1B at most P - r on rank r. */
static void test_gpipe_1f1b_closed_forms(void) {
  for (int P = 1; P <= 6; P++)
    for (int M = 1; M <= 12; M++) {
      tdm_pp_schedule *g = make(TDM_PP_GPIPE, P, 1, M), *o = make(TDM_PP_1F1B, P, 1, M);
      if (!g || !o) continue;
      double want = (double)(P - 1) / (M + P - 1);
      CHECK_NEAR(g->bubble, want, 1e-12);
      CHECK_NEAR(o->bubble, want, 1e-12);
      CHECK_NEAR(o->bubble_ratio, (double)(P - 1) / M, 1e-12);
      CHECK_NEAR(g->makespan, 3.0 * (M + P - 1), 1e-12);
      for (int r = 0; r < P; r++) {
        CHECK(g->peak[r] == M);
        CHECK_MSG(o->peak[r] == (P - r < M ? P - r : M), "1f1b P %d M %d rank %d holds %d", P, M, r, o->peak[r]);
      }
      tdm_pp_schedule_destroy(g);
      tdm_pp_schedule_destroy(o);
    }
}

/* Interleaved: idle / busy = (P-1)/(V M) (Megatron's bubble), M a multiple of P. */
static void test_interleaved_closed_form(void) {
  for (int P = 2; P <= 5; P++)
    for (int V = 2; V <= 3; V++)
      for (int M = P; M <= 3 * P; M += P) {
        tdm_pp_schedule *s = make(TDM_PP_INTERLEAVED, P, V, M);
        if (!s) continue;
        CHECK_MSG(fabs(s->bubble_ratio - (double)(P - 1) / (V * M)) < 1e-12, "P %d V %d M %d: idle/busy %.6f, expected %.6f", P,
                  V, M, s->bubble_ratio, (double)(P - 1) / (V * M));
        tdm_pp_schedule_destroy(s);
      }
}

/* ZB-H1: a third of 1F1B's idle time once M >= P ((P-1)/(3M) of the busy time), and no rank holds
 * more than P micro-batches (1F1B's first rank). */
static void test_zb1p_third_of_1f1b(void) {
  for (int P = 2; P <= 6; P++)
    for (int M = P; M <= 3 * P + 1; M++) {
      tdm_pp_schedule *z = make(TDM_PP_ZB1P, P, 1, M), *o = make(TDM_PP_1F1B, P, 1, M);
      if (!z || !o) continue;
      CHECK_MSG(fabs(z->bubble_ratio - o->bubble_ratio / 3) < 1e-12, "P %d M %d: zb1p idle/busy %.6f, 1f1b %.6f", P, M,
                z->bubble_ratio, o->bubble_ratio);
      CHECK_NEAR(z->bubble, (double)(P - 1) / (3 * M + P - 1), 1e-12);
      for (int r = 0; r < P; r++) CHECK(z->peak[r] <= P);
      tdm_pp_schedule_destroy(z);
      tdm_pp_schedule_destroy(o);
    }
}

/* Every schedule runs a chunk's backwards (weight passes for zero-bubble) in micro-batch order, so
 * the gradients add up in the order one process accumulating the micro-batches uses. */
static void test_backward_order(void) {
  int Ps[] = {2, 3, 4};
  for (int k = 0; k < TDM_PP_SCHEDULE_COUNT; k++)
    for (int pi = 0; pi < 3; pi++) {
      int P = Ps[pi], V = k == TDM_PP_INTERLEAVED ? 2 : 1, Ms[] = {1, P, 2 * P + 1, 2 * P};
      for (int mi = 0; mi < 4; mi++) {
        int M = Ms[mi];
        if (k == TDM_PP_INTERLEAVED && M % P) continue;
        tdm_pp_schedule *s = make((tdm_pp_schedule_kind)k, P, V, M);
        if (!s) continue;
        for (int r = 0; r < P; r++) {
          int last[16];
          for (int c = 0; c < 16; c++) last[c] = -1;
          for (int i = 0; i < s->n[r]; i++) {
            const tdm_pp_action *a = &s->a[r][i];
            if (a->op != TDM_PP_BACKWARD && a->op != TDM_PP_BACKWARD_WEIGHT) continue;
            CHECK_MSG(a->mb == last[a->chunk] + 1, "%s P %d M %d rank %d: chunk %d's weight gradients of micro-batch %d after %d",
                      tdm_pp_schedule_name(s->kind), P, M, r, a->chunk, a->mb, last[a->chunk]);
            last[a->chunk] = a->mb;
          }
        }
        tdm_pp_schedule_destroy(s);
      }
    }
}

/* Removes action i of rank r. */
static void drop(tdm_pp_schedule *s, int r, int i) {
  memmove(&s->a[r][i], &s->a[r][i + 1], sizeof(tdm_pp_action) * (size_t)(s->n[r] - i - 1));
  s->n[r]--;
}
static int find(const tdm_pp_schedule *s, int r, tdm_pp_op op, int mb) {
  for (int i = 0; i < s->n[r]; i++)
    if (s->a[r][i].op == op && s->a[r][i].mb == mb) return i;
  return -1;
}

static void test_broken_schedules(void) {
  /* a missing send: rank 0 never sends micro-batch 2's activation */
  tdm_pp_schedule *s = make(TDM_PP_1F1B, 3, 1, 4);
  drop(s, 0, find(s, 0, TDM_PP_SEND_ACT, 2));
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 0 never runs 'send activation' for chunk 0, micro-batch 2");
  tdm_pp_schedule_destroy(s);

  /* the same, sent to nobody: rank 1 never receives it (and so never runs that forward) */
  s = make(TDM_PP_1F1B, 3, 1, 4);
  drop(s, 1, find(s, 1, TDM_PP_RECV_ACT, 2));
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 1, action");
  CHECK_ERR_HAS("(forward, chunk 1, micro-batch 2): runs before its input is received");
  tdm_pp_schedule_destroy(s);

  /* a swap that makes a cycle: rank 0 waits for micro-batch 0's gradient before sending its
   * activation; rank 1 waits for that activation */
  s = make(TDM_PP_1F1B, 2, 1, 2);
  int i = find(s, 0, TDM_PP_RECV_GRAD, 0);
  tdm_pp_action g = s->a[0][i];
  drop(s, 0, i);
  memmove(&s->a[0][1], &s->a[0][0], sizeof(tdm_pp_action) * (size_t)s->n[0]);
  s->a[0][0] = g;
  s->n[0]++;
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("deadlocks: rank 0 waits at action 0 (recv gradient, chunk 0, micro-batch 0) for rank 1, which waits at "
                "action 0 (recv activation, chunk 1, micro-batch 0) for rank 0");
  tdm_pp_schedule_destroy(s);

  /* sends in another order than the receiver's: rank 0 sends micro-batch 1 before 0 */
  s = make(TDM_PP_GPIPE, 2, 1, 2);
  int f1 = find(s, 0, TDM_PP_FORWARD, 1), s0 = find(s, 0, TDM_PP_SEND_ACT, 0);
  tdm_pp_action t = s->a[0][s0]; /* F0 S0 F1 S1 -> F0 F1 S1 S0 */
  s->a[0][s0] = s->a[0][f1], s->a[0][f1] = s->a[0][f1 + 1], s->a[0][f1 + 1] = t;
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 1, action 0 (recv activation, chunk 1, micro-batch 0): the next message from rank 0 is the activation "
                "for chunk 1, micro-batch 1 (its action 2, send activation, chunk 0, micro-batch 1)");
  tdm_pp_schedule_destroy(s);

  /* an action on a chunk another rank holds, and one after the optimizer */
  tdm_pp_schedule *h;
  CHECK_OK(tdm_pp_schedule_alloc(&h, TDM_PP_GPIPE, 2, 1, 1));
  CHECK_OK(tdm_pp_schedule_push(h, 0, TDM_PP_FORWARD, 1, 0));
  CHECK(tdm_pp_schedule_verify(h, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 0, action 0 (forward, chunk 1, micro-batch 0): chunk 1 lives on rank 1");
  tdm_pp_schedule_destroy(h);
  s = make(TDM_PP_GPIPE, 2, 1, 1);
  CHECK_OK(tdm_pp_schedule_push(s, 1, TDM_PP_FORWARD, 1, 0));
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("comes after the optimizer step");
  tdm_pp_schedule_destroy(s);

}

/* Fewer micro-batches than a schedule needs: refused by the generator, and where a list made for
 * more is run with fewer, by the verifier; Megatron's interleaved order with a partial group
 * deadlocks, and the verifier says where. */
static void test_too_few_microbatches(void) {
  tdm_pp_schedule *s = NULL;
  CHECK(tdm_pp_schedule_create(&s, TDM_PP_INTERLEAVED, 4, 2, 2) == TDM_ERR_INVALID_ARG && !s);
  CHECK_ERR_HAS("2 micro-batches for 4 pipeline ranks");
  CHECK(tdm_pp_schedule_create(&s, TDM_PP_INTERLEAVED, 4, 2, 6) == TDM_ERR_INVALID_ARG && !s);
  CHECK_ERR_HAS("--microbatches 4 or 8");
  /* the unguarded order for P 4, V 3, M 5 */
  CHECK_OK(tdm_pp_schedule_alloc(&s, TDM_PP_INTERLEAVED, 4, 3, 5));
  CHECK_OK(tdm__pp_schedule_generate(s));
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("deadlocks: rank 0 waits at action 34 (recv activation, chunk 4, micro-batch 4) for rank 3, which waits at "
                "action 41 (recv gradient, chunk 7, micro-batch 0) for rank 0");
  tdm_pp_schedule_destroy(s);
  /* a 1F1B list for 4 micro-batches, verified as a step of 3 */
  s = make(TDM_PP_1F1B, 2, 1, 4);
  s->M = 3;
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("micro-batch 3 does not exist: the step has 3 (0..2)");
  tdm_pp_schedule_destroy(s);
  /* and one for 3, run as a step of 4 */
  s = make(TDM_PP_1F1B, 2, 1, 3);
  s->M = 4;
  CHECK(tdm_pp_schedule_verify(s, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 0 never runs 'forward' for chunk 0, micro-batch 3");
  tdm_pp_schedule_destroy(s);
}

/* The trace: valid JSON, one box per compute action of every rank. */
static void test_trace(void) {
  tdm_pp_schedule *s = make(TDM_PP_ZB1P, 3, 1, 4);
  char path[] = "/tmp/tdm_pp_traceXXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(tdm_pp_schedule_write_trace(s, path, 0));
  FILE *f = fopen(path, "rb");
  char *text = calloc(1, 1 << 20);
  size_t n = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
  if (f) fclose(f);
  tdm_json *j = NULL;
  CHECK_OK(tdm__json_parse(text, n, &j));
  const tdm_json *ev = j ? tdm__json_get(j, "traceEvents") : NULL;
  int boxes = 0, want = 0;
  for (int k = 0; ev && k < ev->n; k++) {
    const tdm_json *ph = tdm__json_get(&ev->items[k], "ph");
    boxes += ph && !strcmp(ph->str, "X");
  }
  for (int r = 0; r < s->P; r++)
    for (int i = 0; i < s->n[r]; i++) want += s->a[r][i].op <= TDM_PP_BACKWARD_WEIGHT;
  CHECK(boxes == want && want == 3 * 4 * 3);
  tdm__json_free(j);
  free(text);
  unlink(path);
  char pic[4096];
  tdm_pp_schedule_draw(s, pic, sizeof pic);
  CHECK(strstr(pic, "rank 0 |F0F1F2") == pic);
  tdm_pp_schedule_destroy(s);
}

static void test_partition(void) {
  int fb[9];
  /* by hand */
  int split[3] = {1, 2, 3};
  CHECK_OK(tdm_pp_partition(6, 3, split, 3, 0, 1, 0, fb));
  CHECK(fb[0] == 0 && fb[1] == 1 && fb[2] == 3 && fb[3] == 6);
  int bad[3] = {1, 2, 2};
  CHECK(tdm_pp_partition(6, 3, bad, 3, 0, 1, 0, fb) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("--pp-split adds up to 5 blocks; the model has 6");
  CHECK(tdm_pp_partition(6, 3, bad, 2, 0, 1, 0, fb) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("--pp-split gives 2 counts; expected 3");
  int zero[2] = {0, 6};
  CHECK(tdm_pp_partition(6, 2, zero, 2, 0, 1, 0, fb) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("chunk 0 gets 0 blocks");
  /* more chunks than blocks */
  CHECK(tdm_pp_partition(4, 5, NULL, 0, 0, 1, 0, fb) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("5 chunks (pipeline ranks x virtual stages) for 4 transformer blocks");
  /* balanced: even without extras; a heavy head leaves the last chunk fewer blocks */
  CHECK_OK(tdm_pp_partition(8, 4, NULL, 0, 0, 1, 0, fb));
  for (int c = 0; c < 4; c++) CHECK(fb[c + 1] - fb[c] == 2);
  CHECK_OK(tdm_pp_partition(8, 3, NULL, 0, 0.25, 1, 2, fb)); /* costs 3.25 | 3 | 1 + 2 = 3: max 3.25 */
  CHECK(fb[1] == 3 && fb[2] == 6 && fb[3] == 8);
  CHECK_OK(tdm_pp_partition(12, 4, NULL, 0, 0, 1, 3, fb)); /* 4 | 4 | 3 | 1 + 3: max 4 */
  CHECK(fb[3] == 11 && fb[4] == 12 && fb[1] - fb[0] <= 4 && fb[2] - fb[1] <= 4 && fb[3] - fb[2] <= 4);
}

/* ---- a GPT cut into stages ----------------------------------------------------------------------
 * The stages' forward, chained through copies (as messages carry them), gives the whole model's
 * logits bit for bit with dropout on; their backward, chained the other way with the tied head's
 * gradient added on the first stage just before its own backward (from the last stage's logits
 * gradient and head input), gives every gradient bit for bit, over two accumulated micro-batches;
 * so does the split backward (inputs first, parameters later) of zero-bubble schedules. */
static tdm_tensor *leaf_copy(tdm_tape *tp, const tdm_tensor *src) {
  tdm_tensor *t = tdm_from_data(tp, TDM_F32, tdm_tensor_ndim(src), tdm_tensor_shape(src), tdm_tensor_data(src));
  if (t) tdm_tensor_set_requires_grad(t, 1);
  return t;
}

static void gpt_chain(int split_backward) {
  tdm_model_config mc = tdm_model_config_gpt_mini();
  mc.n_layer = 4, mc.n_head = 2, mc.n_embd = 32, mc.block_size = 16, mc.vocab_size = 40, mc.dropout = 0.2f;
  tdm_model *whole, *staged;
  CHECK_OK(tdm_model_create(&whole, &mc, 7));
  CHECK_OK(tdm_model_create(&staged, &mc, 7));
  tdm_params *pw = tdm_model_params(whole), *ps = tdm_model_params(staged);
  enum { B = 3, T = 8, MB = 2 };
  int32_t xs[MB][B * T], ys[MB][B * T];
  for (int m = 0; m < MB; m++)
    for (int i = 0; i < B * T; i++) xs[m][i] = (int32_t)(tdm_hash64(m, i) % 40), ys[m][i] = (int32_t)(tdm_hash64(m + 9, i) % 40);
  int64_t shp[2] = {B, T}, one[1] = {1};
  int cut[4] = {0, 1, 3, 4};
  tdm_tape *tw, *tp[MB][3];
  CHECK_OK(tdm_tape_create(&tw, 0));
  for (int m = 0; m < MB; m++)
    for (int k = 0; k < 3; k++) CHECK_OK(tdm_tape_create(&tp[m][k], 0));
  tdm_tensor *logits_s[MB], *out[MB][3], *in[MB][3], *loss_s[MB], *y_s[MB];
  tdm_gpt_range rng[MB][3];
  /* the whole model, micro-batch after micro-batch, each backward seeded with 1/MB */
  float loss_w[MB], loss_v[MB];
  for (int m = 0; m < MB; m++) {
    tdm_tape_reset(tw);
    tdm_tape_set_training(tw, 1);
    tdm_tape_set_dropout_key(tw, 99, 100 + m * B);
    tdm_tensor *x = tdm_from_data(tw, TDM_I32, 2, shp, xs[m]), *y = tdm_from_data(tw, TDM_I32, 2, shp, ys[m]);
    tdm_tensor *loss = tdm_cross_entropy(tw, tdm_model_forward(whole, tw, x), y, -100);
    CHECK(loss != NULL);
    if (!loss) return;
    loss_w[m] = *(float *)tdm_tensor_data(loss);
    tdm_tensor *g = tdm_new(tw, TDM_F32, 0, one);
    *(float *)tdm_tensor_data(g) = 1.0f / MB;
    CHECK_OK(tdm_backward_with(tw, loss, g));
  }
  /* redo the whole model's forward to keep its logits for the comparison (no backward) */
  float *lw[MB];
  for (int m = 0; m < MB; m++) {
    tdm_tape *t2;
    CHECK_OK(tdm_tape_create(&t2, 0));
    tdm_tape_set_training(t2, 1);
    tdm_tape_set_grad_enabled(t2, 0);
    tdm_tape_set_dropout_key(t2, 99, 100 + m * B);
    tdm_tensor *l = tdm_model_forward(whole, t2, tdm_from_data(t2, TDM_I32, 2, shp, xs[m]));
    lw[m] = malloc(sizeof(float) * B * T * 40);
    if (l) memcpy(lw[m], tdm_tensor_data(l), sizeof(float) * B * T * 40);
    tdm_tape_destroy(t2);
  }
  /* the stages: forwards of both micro-batches, then backwards in micro-batch order (GPipe) */
  for (int m = 0; m < MB; m++)
    for (int k = 0; k < 3; k++) {
      tdm_tape *t = tp[m][k];
      tdm_tape_set_training(t, 1);
      tdm_tape_set_dropout_key(t, 99, 100 + m * B);
      rng[m][k] = (tdm_gpt_range){cut[k], cut[k + 1], k == 0, k == 2, NULL, NULL};
      if (k == 2) rng[m][k].head_weight = tdm_detach(t, tdm_params_find(ps, "transformer.wte.weight"));
      in[m][k] = k == 0 ? tdm_from_data(t, TDM_I32, 2, shp, xs[m]) : leaf_copy(t, out[m][k - 1]);
      out[m][k] = tdm_gpt_forward_range(staged, t, in[m][k], &rng[m][k]);
      CHECK_MSG(out[m][k] != NULL, "%s", tdm_tape_error(t));
      if (!out[m][k]) return;
    }
  for (int m = 0; m < MB; m++) {
    logits_s[m] = out[m][2];
    CHECK(memcmp(tdm_tensor_data(logits_s[m]), lw[m], sizeof(float) * B * T * 40) == 0);
    y_s[m] = tdm_from_data(tp[m][2], TDM_I32, 2, shp, ys[m]);
    loss_s[m] = tdm_cross_entropy(tp[m][2], logits_s[m], y_s[m], -100);
    loss_v[m] = *(float *)tdm_tensor_data(loss_s[m]);
    CHECK(loss_v[m] == loss_w[m]);
  }
  tdm_tensor *wte = tdm_params_find(ps, "transformer.wte.weight");
  float *wte_grad = (float *)tdm_tensor_data(wte) - tdm_params_data(ps) + tdm_params_grad(ps);
  for (int m = 0; m < MB; m++) {
    tdm_tensor *g = tdm_new(tp[m][2], TDM_F32, 0, one);
    *(float *)tdm_tensor_data(g) = 1.0f / MB;
    tdm_tensor *up = NULL;
    for (int k = 2; k >= 0; k--) {
      tdm_tape *t = tp[m][k];
      tdm_tensor *o = k == 2 ? loss_s[m] : out[m][k], *go = k == 2 ? g : up;
      if (k == 0) /* the tied head's part of wte's gradient, before the embedding's */
        tdm_k_linear_bwd(NULL, wte_grad, NULL, tdm_tensor_data(tdm_tensor_grad(logits_s[m])),
                         tdm_tensor_data(rng[m][2].head_input), tdm_tensor_data(wte), B * T, 32, 40);
      if (split_backward) {
        CHECK_OK(tdm_backward_inputs(t, o, go));
        CHECK_OK(tdm_backward_params(t));
      } else {
        CHECK_OK(tdm_backward_with(t, o, go));
      }
      if (k > 0) up = tdm_tensor_grad(in[m][k]);
    }
  }
  int64_t n = tdm_params_numel(pw);
  CHECK(memcmp(tdm_params_grad(pw), tdm_params_grad(ps), sizeof(float) * (size_t)n) == 0);
  int64_t first_diff = -1;
  for (int64_t i = 0; i < n && first_diff < 0; i++)
    if (tdm_params_grad(pw)[i] != tdm_params_grad(ps)[i]) first_diff = i;
  CHECK_MSG(first_diff < 0, "gradient element %lld differs: %.9g vs %.9g", (long long)first_diff,
            first_diff >= 0 ? tdm_params_grad(pw)[first_diff] : 0.0, first_diff >= 0 ? tdm_params_grad(ps)[first_diff] : 0.0);
  double gn = 0;
  for (int64_t i = 0; i < n; i++) gn += (double)tdm_params_grad(ps)[i] * tdm_params_grad(ps)[i];
  CHECK(gn > 0);
  for (int m = 0; m < MB; m++) {
    free(lw[m]);
    for (int k = 0; k < 3; k++) tdm_tape_destroy(tp[m][k]);
  }
  tdm_tape_destroy(tw);
  tdm_model_destroy(whole);
  tdm_model_destroy(staged);
}

static void test_gpt_stages_chain(void) { gpt_chain(0); }
static void test_gpt_stages_split_backward(void) { gpt_chain(1); }

TDM_TEST_MAIN(T(test_gpipe_1f1b_closed_forms), T(test_interleaved_closed_form), T(test_zb1p_third_of_1f1b),
              T(test_backward_order), T(test_broken_schedules), T(test_too_few_microbatches), T(test_trace),
              T(test_partition), T(test_gpt_stages_chain),
              T(test_gpt_stages_split_backward))
