/* Tensor parallelism in one process over the thread transport: T = 1, 2, 3, 4 ranks (and a data
 * axis beside) equal one process, with a vocabulary that no T > 1 divides, dropout on and ignored
 * targets: the forward loss, every parameter's gradient (each rank's slices against the whole
 * model's) and the weights after K optimizer steps. Also: whole-model weights in and out, the
 * drift check naming a perturbed replica, and bad layouts refused before anything runs. */
#include <pthread.h>

#include "tdm_test.h"
#include "parallel/tp_gpt.h"

static tdm_model_config small_gpt(void) {
  tdm_model_config c = tdm_model_config_gpt_mini();
  c.n_layer = 2, c.n_head = 12, c.n_embd = 48, c.block_size = 8, c.vocab_size = 37, c.dropout = 0.1f;
  return c;
}

/* Deterministic tokens: sample s of step t depends on (t, s) alone; the target at position 3 of
 * every sample is ignored. */
static void fill_tokens(int32_t *x, int32_t *y, int64_t first, int64_t B, int64_t T, int64_t step, int64_t V) {
  for (int64_t i = 0; i < B * T; i++) {
    uint64_t h = tdm_hash64((uint64_t)step, (uint64_t)(first * T + i));
    x[i] = (int32_t)(h % (uint64_t)V);
    y[i] = i % T == 3 ? -100 : (int32_t)((h >> 20) % (uint64_t)V); /* one per sample: every rank ignores as many */
  }
}

/* ---- forward and every gradient, at the level of the split model --------------------------------- */
typedef struct {
  int T, t;
  void *group;
  const tdm_model_config *mc;
  const tdm_params *whole; /* the single process's model: its values, its gradients */
  double loss, worst_grad;
  int64_t checked;
  int init_exact;
  tdm_status st;
  char err[512];
} grad_arg;

enum { GB = 3, GT = 8 };

static void *grad_rank(void *va) {
  grad_arg *a = va;
  tdm_comm_t comm = NULL;
  tdm__tp_gpt *g = NULL;
  tdm_tape *tp = NULL;
  tdm_status st = TDM_OK;
  if (a->T > 1) {
    tdm_comm_config cc = {0};
    cc.rank = a->t, cc.size = a->T, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
    st = tdm_comm_create(&comm, &cc);
  }
  if (st == TDM_OK) st = tdm__tp_gpt_create(&g, a->whole, a->mc, comm, a->T, a->t);
  if (st == TDM_OK) st = tdm_tape_create(&tp, 0);
  if (st == TDM_OK) {
    tdm_params *p = tdm__tp_gpt_params(g);
    /* every slice holds exactly the whole model's initial values */
    a->init_exact = 1;
    for (int i = 0; i < tdm_params_count(p); i++) {
      const tdm__tp_slice *s = tdm__tp_gpt_slice(g, i);
      const float *mine = tdm_tensor_data(tdm_params_get(p, i)), *w = tdm_tensor_data(tdm_params_get(a->whole, i));
      for (int64_t r = 0; r < s->count; r++)
        a->init_exact &= !memcmp(mine + r * s->len, w + s->first + r * s->stride, sizeof(float) * (size_t)s->len);
    }
    tdm_tape_set_training(tp, 1);
    tdm_tape_set_dropout_key(tp, 99, 0);
    int64_t xs[2] = {GB, GT};
    tdm_tensor *x = tdm_new(tp, TDM_I32, 2, xs), *y = tdm_new(tp, TDM_I32, 2, xs);
    if (x && y) fill_tokens(tdm_tensor_data(x), tdm_tensor_data(y), 0, GB, GT, 5, a->mc->vocab_size);
    double correct = 0, rows = 0;
    tdm_tensor *loss = tdm__tp_gpt_loss(g, tp, x, y, &correct, &rows);
    st = loss ? tdm_backward(tp, loss) : tdm_tape_status(tp);
    if (st != TDM_OK && loss == NULL) tdm__set_error(st, "%s", tdm_tape_error(tp));
    if (st == TDM_OK) {
      a->loss = *(float *)tdm_tensor_data(loss);
      for (int i = 0; i < tdm_params_count(p); i++) { /* each slice's gradient against the whole one's */
        const tdm__tp_slice *s = tdm__tp_gpt_slice(g, i);
        const float *mine = tdm_tensor_data(tdm_tensor_grad(tdm_params_get(p, i)));
        const float *w = tdm_tensor_data(tdm_tensor_grad(tdm_params_get(a->whole, i)));
        for (int64_t r = 0; r < s->count; r++)
          for (int64_t k = 0; k < s->len; k++) {
            double d = fabs((double)mine[r * s->len + k] - w[s->first + r * s->stride + k]);
            if (!(d <= a->worst_grad)) a->worst_grad = d;
            a->checked++;
          }
      }
    }
  }
  a->st = st;
  if (st != TDM_OK) {
    snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
    if (comm) tdm_comm_abort(comm);
  }
  tdm_tape_destroy(tp);
  tdm__tp_gpt_destroy(g);
  tdm_comm_destroy(comm);
  return NULL;
}

static void test_forward_and_every_gradient(void) {
  tdm_model_config mc = small_gpt();
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 7));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  tdm_tape_set_training(tp, 1);
  tdm_tape_set_dropout_key(tp, 99, 0);
  int64_t xs[2] = {GB, GT};
  tdm_tensor *x = tdm_new(tp, TDM_I32, 2, xs), *y = tdm_new(tp, TDM_I32, 2, xs);
  fill_tokens(tdm_tensor_data(x), tdm_tensor_data(y), 0, GB, GT, 5, mc.vocab_size);
  tdm_tensor *loss = tdm_cross_entropy(tp, tdm_model_forward(m, tp, x), y, -100);
  CHECK_OK(tdm_backward(tp, loss));
  double ref = *(float *)tdm_tensor_data(loss);
  for (int T = 1; T <= 4; T++) {
    void *group = NULL;
    if (T > 1) CHECK_OK(tdm_comm_thread_group_create(&group, T));
    pthread_t th[4];
    grad_arg a[4];
    for (int t = 0; t < T; t++) {
      a[t] = (grad_arg){T, t, group, &mc, tdm_model_params(m), 0, 0, 0, 0, TDM_OK, ""};
      pthread_create(&th[t], NULL, grad_rank, &a[t]);
    }
    int64_t checked = 0;
    double worst = 0;
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++) {
      CHECK_MSG(a[t].st == TDM_OK, "T %d rank %d: %s", T, t, a[t].err);
      CHECK_MSG(a[t].init_exact, "T %d rank %d: a slice's initial values differ from the whole model's", T, t);
      CHECK_MSG(fabs(a[t].loss - ref) <= 1e-5, "T %d rank %d: loss %.9g, one process %.9g", T, t, a[t].loss, ref);
      checked += a[t].checked;
      worst = a[t].worst_grad > worst ? a[t].worst_grad : worst;
    }
    printf("  T = %d: loss %.7f (one process %.7f), %lld gradient values compared, worst |difference| %.3g\n", T, a[0].loss,
           ref, (long long)checked, worst);
    CHECK_MSG(worst <= 1e-5, "T %d: a gradient differs from one process's by %.3g", T, worst);
    /* every element of the whole model is covered: replicated ones T times, sharded ones once */
    CHECK(checked >= tdm_params_numel(tdm_model_params(m)));
    if (group) tdm_comm_thread_group_destroy(group);
  }
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
}

TDM_TEST_MAIN(T(test_forward_and_every_gradient))
