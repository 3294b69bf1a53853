/* The public API's refusals of bad arguments that an ASan/UBSan hunt found accepted: sizes that
 * wrapped into small allocations, unchecked rows and counts, buffers that overlap by part, values
 * written into files that could not be read back. Each case asserts the refusal (a status and a
 * message naming the value) and, where one was accepted before, that nothing was written. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tdm_test.h"

static void test_shapes_whose_size_overflows(void) {
  tdm_tensor *t = NULL;
  int64_t big[2] = {(int64_t)1 << 62, 1}, huge[2] = {INT64_MAX, 3}, empty[2] = {0, INT64_MAX};
  CHECK(tdm_tensor_create(&t, TDM_F32, 2, big) == TDM_ERR_INVALID_ARG); /* 2^62 x 4 bytes wrapped to 0 */
  CHECK_ERR_HAS("holds more than 2^63 bytes");
  CHECK(tdm_tensor_create(&t, TDM_F32, 2, huge) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_tensor_wrap(&t, TDM_F32, 2, big, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_tensor_create(&t, TDM_F32, 2, empty)); /* no element: no size to overflow */
  CHECK(tdm_tensor_numel(t) == 0);
  tdm_tensor_destroy(t);
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  CHECK(!tdm_zeros(tp, TDM_F32, 2, big) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_destroy(tp);
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  int64_t s4[1] = {4}, bad[3] = {(int64_t)1 << 40, (int64_t)1 << 40, -1};
  tdm_tensor *x = tdm_zeros(tp, TDM_F32, 1, s4);
  CHECK(!tdm_reshape(tp, x, 3, bad) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_destroy(tp);
  tdm_params *p;
  CHECK_OK(tdm_params_create(&p));
  CHECK(tdm_params_declare(p, "w", 2, big, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &t) == TDM_ERR_INVALID_ARG);
  tdm_params_destroy(p);
  tdm_dataset *ds = NULL;
  int64_t feat[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  CHECK(tdm_dataset_open_synthetic(&ds, 10, 2, feat, 3, 1, 0) == TDM_ERR_INVALID_ARG && !ds);
}

static void test_arena_and_shared_sizes(void) {
  tdm_arena *a;
  CHECK_OK(tdm_arena_create(&a, 0));
  CHECK(tdm_arena_alloc(a, SIZE_MAX) == NULL); /* rounded up it wrapped to a 64-byte block */
  CHECK(tdm_arena_alloc(a, 100) != NULL);
  tdm_arena_destroy(a);
  tdm_comm_config cfg = {0};
  cfg.size = 1;
  cfg.transport = TDM_TRANSPORT_SHM;
  tdm_comm_t c;
  CHECK_OK(tdm_comm_create(&c, &cfg));
  tdm_shared_t s = NULL;
  CHECK(tdm_shared_create(c, (size_t)1 << 62, &s) == TDM_ERR_INVALID_ARG && !s);
  CHECK_ERR_HAS("floats per rank");
  /* buffers that overlap by part: the algorithms would read what they wrote (in place is fine) */
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(tdm_comm_allreduce(c, v, v + 1, 4, TDM_F32, TDM_SUM, TDM_ALGO_AUTO) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("overlap by part");
  tdm_comm_destroy(c);
  CHECK_OK(tdm_comm_create(&c, &cfg));
  CHECK_OK(tdm_comm_allreduce(c, v, v, 4, TDM_F32, TDM_SUM, TDM_ALGO_AUTO));
  CHECK_OK(tdm_comm_allreduce(c, v, v + 4, 4, TDM_F32, TDM_SUM, TDM_ALGO_AUTO));
  CHECK(v[4] == 1 && v[7] == 4);
  /* an abort with a status outside the enum reaches callers as an error of the enum */
  tdm_comm_abort_why(c, (tdm_status)77, "test");
  CHECK(tdm_comm_status(c) == TDM_ERR_REMOTE);
  tdm_comm_destroy(c);
  size_t off = 7, len = 7;
  tdm_comm_block(10, 0, 0, &off, &len); /* a division by zero before */
  CHECK(off == 0 && len == 0);
  tdm_comm_block(10, 3, -1, &off, &len);
  CHECK(off == 0 && len == 0);
  tdm_comm_block(10, 3, 2, &off, &len);
  CHECK(off == 7 && len == 3);
}

static void test_checksum_and_latest(void) {
  uint32_t crc = 0;
  CHECK(tdm_ckpt_checksum(-1, NULL, 0, NULL, &crc) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_ckpt_checksum(0, NULL, -1, NULL, &crc) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_ckpt_checksum(1, NULL, 0, NULL, &crc) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_ckpt_checksum(0, NULL, 0, NULL, NULL) == TDM_ERR_INVALID_ARG);
  const char *kv[2] = {"k", NULL};
  CHECK(tdm_ckpt_checksum(1, kv, 0, NULL, &crc) == TDM_ERR_INVALID_ARG);
  float d[2] = {1, 2};
  tdm_st_tensor t = {"a", TDM_F32, 1, {2}, d, 8};
  CHECK_OK(tdm_ckpt_checksum(0, NULL, 1, &t, &crc));
  t.nbytes = -8;
  CHECK(tdm_ckpt_checksum(0, NULL, 1, &t, &crc) == TDM_ERR_INVALID_ARG);
  t.nbytes = 8, t.ndim = 99;
  CHECK(tdm_ckpt_checksum(0, NULL, 1, &t, &crc) == TDM_ERR_INVALID_ARG);
  char path[8];
  CHECK(tdm_ckpt_latest("/nonexistent-dir", NULL, 0, NULL, 0) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_ckpt_latest("/nonexistent-dir", path, sizeof path, NULL, 0) != TDM_OK);
}

static void test_rows_casts_and_data(void) {
  int64_t sh[2] = {2, 3};
  tdm_tensor *t;
  CHECK_OK(tdm_tensor_create(&t, TDM_F32, 2, sh));
  CHECK(tdm_tensor_row_argmax(t, 1) == 0);
  CHECK(tdm_tensor_row_argmax(t, 2) == -1 && tdm_tensor_row_argmax(t, -1) == -1); /* read past the buffer before */
  tdm_tensor_destroy(t);
  float x[4] = {0};
  CHECK(tdm_convert(NULL, TDM_BF16, x, TDM_F32, 4) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_convert(x, TDM_BF16, NULL, TDM_F32, 4) == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_convert(NULL, TDM_BF16, NULL, TDM_F32, 0));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  tdm_tensor *a = tdm_zeros(tp, TDM_F32, 2, sh);
  CHECK(!tdm_cast(tp, a, (tdm_dtype)42) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_reset(tp);
  CHECK(!tdm_from_data(tp, TDM_F32, 2, sh, NULL) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_destroy(tp);
}

static void test_reductions_and_empty_ops(void) {
  int64_t sh[2] = {2, 3}, nocls[2] = {2, 0}, tg[1] = {2}, w0[4] = {2, 1, 0, 0}, xs[4] = {1, 1, 6, 6};
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  tdm_tensor *x = tdm_zeros(tp, TDM_F32, 2, sh);
  CHECK(!tdm_sum(tp, x, -1, NULL, 0) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG); /* returned x unreduced */
  tdm_tape_reset(tp);
  x = tdm_zeros(tp, TDM_F32, 2, sh);
  int twice[2] = {0, 0};
  CHECK(!tdm_mean(tp, x, 2, twice, 0) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  CHECK(strstr(tdm_tape_error(tp), "axis 0 is given twice"));
  tdm_tape_reset(tp);
  tdm_tensor *l = tdm_zeros(tp, TDM_F32, 2, nocls), *y = tdm_zeros(tp, TDM_I64, 1, tg);
  CHECK(!tdm_cross_entropy(tp, l, y, -100) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG); /* a loss of 0 before */
  tdm_tape_reset(tp);
  CHECK(!tdm_conv2d(tp, tdm_zeros(tp, TDM_F32, 4, xs), tdm_zeros(tp, TDM_F32, 4, w0), NULL, 1, 0) &&
        tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_reset(tp);
  int64_t w3[4] = {2, 1, 3, 3};
  CHECK(!tdm_conv2d(tp, tdm_zeros(tp, TDM_F32, 4, xs), tdm_zeros(tp, TDM_F32, 4, w3), NULL, 1, INT32_MAX) &&
        tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_destroy(tp);
}

static void test_init_specs_and_forward(void) {
  tdm_params *p;
  CHECK_OK(tdm_params_create(&p));
  int64_t s[1] = {4};
  tdm_tensor *t;
  CHECK(tdm_params_declare(p, "a", 1, s, (tdm_init){(tdm_init_kind)77, 0, 0}, 0, &t) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_params_declare(p, "b", 1, s, (tdm_init){TDM_INIT_NORMAL, 0, NAN}, 0, &t) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_params_declare(p, "c", 1, s, (tdm_init){TDM_INIT_UNIFORM, 5, -5}, 0, &t) == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_params_declare(p, "d", 1, s, (tdm_init){TDM_INIT_UNIFORM, -5, 5}, 0, &t));
  tdm_params_destroy(p);
  tdm_model_config mc = tdm_model_config_mlp();
  tdm_model *m;
  CHECK_OK(tdm_model_create(&m, &mc, 1));
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  CHECK(!tdm_model_forward(m, tp, NULL) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG); /* NULL with no error before */
  CHECK(strstr(tdm_tape_error(tp), "the input is NULL"));
  tdm_tape_destroy(tp);
  tdm_model_destroy(m);
}

static void test_simulator_and_trace_values(void) {
  tdm_sim_model *m = NULL;
  int64_t params[3] = {100, 200, 300};
  double nan_fwd[3] = {1e6, NAN, 1e6}, neg[3] = {1e6, -1e9, 1e6};
  CHECK(tdm_sim_model_custom(&m, 3, params, nan_fwd, 1024, 512, 0) == TDM_ERR_INVALID_ARG && !m);
  CHECK(tdm_sim_model_custom(&m, 3, params, neg, 1024, 512, 0) == TDM_ERR_INVALID_ARG && !m);
  /* a model name with quotes and a newline is written escaped, and loads again */
  char dir[] = "/tmp/tdm-badargs-XXXXXX", path[64];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/c.json", dir);
  tdm_sim_cluster k, back;
  tdm_sim_cluster_default(&k);
  snprintf(k.compute_model, sizeof k.compute_model, "a\"b\\c\nd");
  CHECK_OK(tdm_sim_cluster_save(path, &k, NULL));
  CHECK_OK(tdm_sim_cluster_load(path, &back));
  CHECK(!strcmp(back.compute_model, k.compute_model));
  CHECK(tdm_sim_cluster_save(path, &k, "garbage{") == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_sim_cluster_load(path, &back)); /* the good file stays */
  unlink(path);
  tdm_trace *t;
  CHECK_OK(tdm_trace_open(&t, dir, 0, 1));
  CHECK(tdm_trace_set_clock(t, 0, NAN, NAN, -1) == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_trace_set_clock(t, 0, 1.0, 0.001, 0.0001));
  CHECK_OK(tdm_trace_close(t));
  snprintf(path, sizeof path, "%s/trace.rank0.json", dir);
  unlink(path);
  rmdir(dir);
}

static void test_sampler_rules(void) {
  tdm_dataset *ds;
  int64_t f[1] = {4};
  CHECK_OK(tdm_dataset_open_synthetic(&ds, 10, 1, f, 3, 1, 0));
  tdm_sampler *s = NULL;
  tdm_sampler_config sc = {4, 1, 1, 0, 1, (tdm_last_batch)9, 0};
  CHECK(tdm_sampler_create(&s, ds, &sc) == TDM_ERR_INVALID_ARG && !s); /* behaved as drop before */
  sc.last = TDM_LAST_PAD, sc.batch = (int64_t)1 << 62, sc.world = 4;
  CHECK(tdm_sampler_create(&s, ds, &sc) == TDM_ERR_INVALID_ARG && !s);
  sc.batch = 3, sc.world = 1;
  CHECK_OK(tdm_sampler_create(&s, ds, &sc));
  CHECK(tdm_sampler_seek(s, (int64_t)1 << 62) == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_sampler_seek(s, 5));
  tdm_sampler_destroy(s);
  tdm_dataset_destroy(ds);
}

static void test_counts_views_and_messages(void) {
  /* a checkpoint writer's later calls repeat its first failure's message (they left it empty) */
  char dir[] = "/tmp/tdm-badargs2-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  tdm_ckpt_info info = {0};
  info.step = 1, info.world_size = 1;
  tdm_ckpt_writer *w;
  CHECK_OK(tdm_ckpt_writer_create(&w, dir, &info, 0, NULL));
  int64_t s2[1] = {2};
  CHECK(tdm_ckpt_writer_tensor(w, "a", (tdm_dtype)99, 1, s2) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("dtype 99");
  tdm_clear_error();
  CHECK(tdm_ckpt_writer_tensor(w, "b", TDM_F32, 1, s2) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("an earlier call failed: checkpoint writer: tensor 'a' (dtype 99");
  tdm_ckpt_writer_destroy(w);
  rmdir(dir);
  /* negative counts are refused, not no-ops */
  tdm_dataset *ds;
  int64_t f[1] = {4}, idx[2] = {0, 1};
  float x[8];
  int32_t y[2];
  CHECK_OK(tdm_dataset_open_synthetic(&ds, 10, 1, f, 3, 1, 0));
  CHECK(tdm_dataset_batch(ds, idx, -2, x, y) == TDM_ERR_INVALID_ARG);
  CHECK_OK(tdm_dataset_batch(ds, idx, 2, x, y));
  tdm_dataset_destroy(ds);
  float img[4] = {0}, scratch[4];
  CHECK(tdm_augment_images(img, 1, 1, 2, 2, 1, 1, 1, 0, 0, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("both buffers (one is NULL)"); /* it blamed the padding alone */
  CHECK_OK(tdm_augment_images(img, 1, 1, 2, 2, 1, 1, 1, 0, 0, scratch));
  int dy, dx, fl;
  tdm_augment_draw(1, 0, 0, INT32_MAX, 1, &dy, &dx, &fl); /* 2 pad + 1 overflowed int */
  CHECK(dy >= -INT32_MAX && dx >= -INT32_MAX);
  CHECK(tdm_comm_thread_group_create(NULL, 2) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("out NULL");
  /* two communicators as one rank of a thread group: both waited out the timeout for the other rank */
  void *grp;
  CHECK_OK(tdm_comm_thread_group_create(&grp, 2));
  tdm_comm_config tc = {0};
  tc.rank = 0, tc.size = 2, tc.transport = TDM_TRANSPORT_THREAD, tc.thread_group = grp, tc.timeout_s = 5;
  tdm_comm_t c1 = NULL, c2 = NULL;
  CHECK_OK(tdm_comm_create(&c1, &tc));
  CHECK(tdm_comm_create(&c2, &tc) == TDM_ERR_INVALID_ARG && !c2);
  CHECK_ERR_HAS("rank 0 already joined this thread group");
  tdm_comm_destroy(c1);
  CHECK_OK(tdm_comm_create(&c2, &tc)); /* left, it may join again */
  tdm_comm_destroy(c2);
  tdm_comm_thread_group_destroy(grp);
  /* a slice whose end wraps, a rope position past any table */
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  int64_t sh[3] = {1, 4, 8};
  tdm_tensor *t = tdm_zeros(tp, TDM_F32, 3, sh);
  CHECK(!tdm_slice(tp, t, 1, INT64_MAX, 2) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_reset(tp);
  t = tdm_zeros(tp, TDM_F32, 3, sh);
  tdm_rope_config rc = {10000.0f, 0, 0, 0, 0};
  CHECK(!tdm_rope(tp, t, 2, &rc, INT64_MAX) && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG);
  tdm_tape_reset(tp);
  t = tdm_zeros(tp, TDM_F32, 3, sh);
  CHECK(tdm_rope(tp, t, 2, &rc, 100) != NULL);
  tdm_tape_destroy(tp);
  /* floats into integer tensors saturate (300 into u8 gave 44, 1e30 into i64 INT64_MIN) */
  int64_t one[1] = {1};
  tdm_tensor *u, *l;
  CHECK_OK(tdm_tensor_create(&u, TDM_U8, 1, one));
  CHECK_OK(tdm_tensor_create(&l, TDM_I64, 1, one));
  tdm_tensor_fill(u, 300);
  CHECK(tdm_tensor_get(u, 0) == 255);
  tdm_tensor_fill(u, -4);
  CHECK(tdm_tensor_get(u, 0) == 0);
  tdm_tensor_fill(l, 1e30);
  CHECK(*(int64_t *)tdm_tensor_data(l) == INT64_MAX);
  tdm_tensor_fill(l, NAN);
  CHECK(*(int64_t *)tdm_tensor_data(l) == 0);
  tdm_tensor_destroy(u);
  tdm_tensor_destroy(l);
}

/* Two ranks as threads of one group, each rank's argument beginning with this head: run_two starts
 * them and waits; join_two makes a rank's communicator. */
typedef struct {
  void *group;
  int rank;
} two_head;
static void run_two(void *(*rank_main)(void *), void *args, size_t size) {
  void *group;
  CHECK_OK(tdm_comm_thread_group_create(&group, 2));
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    two_head *h = (two_head *)((char *)args + (size_t)r * size);
    h->group = group, h->rank = r;
    pthread_create(&th[r], NULL, rank_main, h);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(group);
}
static tdm_status join_two(const two_head *h, tdm_comm_t *c) {
  tdm_comm_config cfg = {0};
  cfg.rank = h->rank, cfg.size = 2, cfg.transport = TDM_TRANSPORT_THREAD, cfg.thread_group = h->group, cfg.timeout_s = 20;
  return tdm_comm_create(c, &cfg);
}

/* Two ranks whose checkpoint directories differ: rank 0's manifest named a piece that is not
 * there and stayed, a corrupt newest entry; now it is removed again, and each rank's file too. */
typedef struct {
  two_head h;
  const char *dir;
  tdm_status st;
} ck_rank;
static void *ck_rank_main(void *arg) {
  ck_rank *a = arg;
  tdm_comm_t c;
  if ((a->st = join_two(&a->h, &c)) != TDM_OK) return NULL;
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  tdm_ckpt_info info = {0};
  info.step = 3;
  tdm_ckpt_writer *w;
  tdm_ckpt_writer_create(&w, a->dir, &info, 0, c);
  tdm_ckpt_writer_tensor(w, "x", TDM_F32, 1, shape);
  tdm_ckpt_writer_flat(w, "x", 2 * a->h.rank, 2 * a->h.rank + 2, x + 2 * a->h.rank);
  a->st = tdm_ckpt_writer_commit(w, 1);
  tdm_comm_destroy(c);
  return NULL;
}
static void test_failed_checkpoint_leaves_nothing(void) {
  char d0[] = "/tmp/tdm-ck0-XXXXXX", d1[] = "/tmp/tdm-ck1-XXXXXX", path[128];
  CHECK(mkdtemp(d0) && mkdtemp(d1));
  ck_rank a[2] = {{.dir = d0}, {.dir = d1}};
  run_two(ck_rank_main, a, sizeof a[0]);
  CHECK(a[0].st != TDM_OK && a[1].st != TDM_OK);
  struct stat sb;
  snprintf(path, sizeof path, "%s/ckpt-000000000003.safetensors", d0);
  CHECK_MSG(lstat(path, &sb) != 0, "%s stayed", path);
  for (int r = 0; r < 2; r++) {
    snprintf(path, sizeof path, "%s/ckpt-000000000003.shards", r ? d1 : d0);
    CHECK_MSG(lstat(path, &sb) != 0, "%s stayed", path);
  }
  CHECK(rmdir(d0) == 0 && rmdir(d1) == 0); /* (empty: nothing else was left) */
}

/* Two data-parallel ranks whose engines differ in one setting each time: before, every such pair
 * trained on (another clip, beta or optimizer: replicas apart; another accumulation: a mean of
 * neither global batch; another seed at ZeRO stage 3: a model of two initialisations). */
typedef struct {
  two_head h;
  int which;
  tdm_status st;
  char err[512];
} eng_rank;
static void *eng_rank_main(void *arg) {
  eng_rank *a = arg;
  tdm_comm_t c = NULL;
  tdm_grid *g = NULL;
  tdm_engine *e = NULL;
  tdm_model_config mc = tdm_model_config_mlp();
  mc.hidden[0] = 8, mc.hidden[1] = 8;
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAM);
  tdm_engine_config ec = tdm_engine_config_default();
  uint64_t seed = 1;
  if (a->which == 1) ec.kind = TDM_ENGINE_ZERO, ec.zero.stage = 3;
  if (a->h.rank == 1) {
    if (a->which == 0) ec.clip = 0.01f;
    if (a->which == 1) seed = 2;
    if (a->which == 2) oc.beta1 = 0.5f;
    if (a->which == 3) ec.accum = 2;
  }
  a->st = join_two(&a->h, &c);
  if (a->st == TDM_OK) a->st = tdm_grid_create(&g, c, 0, 1, 1);
  if (a->st == TDM_OK) a->st = tdm_engine_create(&e, &mc, seed, &oc, g, &ec);
  snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
  tdm_engine_destroy(e);
  tdm_grid_destroy(g);
  tdm_comm_destroy(c);
  return NULL;
}
static void test_ranks_with_other_engines(void) {
  const char *names[] = {"clip", "seed (ZeRO stage 3", "betas and eps", "accumulation"};
  for (int which = 0; which < 4; which++) {
    eng_rank a[2] = {{.which = which}, {.which = which}};
    run_two(eng_rank_main, a, sizeof a[0]);
    for (int r = 0; r < 2; r++)
      CHECK_MSG(a[r].st == TDM_ERR_MISMATCH && strstr(a[r].err, "rank 1's") && strstr(a[r].err, names[which]),
                "case %d, rank %d: %s: %s", which, r, tdm_status_str(a[r].st), a[r].err);
  }
}

static tdm_status never_batch(void *ctx, tdm_tape *tp, int64_t micro, tdm_tensor **x, tdm_tensor **y, int64_t *base) {
  (void)tp, (void)micro, (void)x, (void)y, (void)base;
  *(int *)ctx = 1;
  return tdm__set_error(TDM_ERR_INTERNAL, "the step asked for a batch");
}

static void test_engine_and_optimizer_values(void) {
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_SGD);
  tdm_optim *o = NULL;
  tdm_params *p;
  int64_t s[1] = {4};
  tdm_tensor *t;
  CHECK_OK(tdm_params_create(&p));
  CHECK_OK(tdm_params_declare(p, "w", 1, s, (tdm_init){TDM_INIT_ONES, 0, 0}, 0, &t));
  CHECK_OK(tdm_params_finalize(p, 1));
  oc.lr = INFINITY;
  CHECK(tdm_optim_create(&o, &oc, p) == TDM_ERR_INVALID_ARG && !o); /* every parameter NaN after one step before */
  oc.lr = 0.1f, oc.dampening = NAN;
  CHECK(tdm_optim_create(&o, &oc, p) == TDM_ERR_INVALID_ARG && !o);
  tdm_params_destroy(p);
  tdm_model_config mc = tdm_model_config_mlp();
  mc.hidden[0] = 8, mc.hidden[1] = 8;
  tdm_optim_config ao = tdm_optim_config_default(TDM_OPT_ADAM);
  tdm_engine_config ec = tdm_engine_config_default();
  tdm_grid *g;
  CHECK_OK(tdm_grid_create(&g, NULL, 0, 1, 1));
  tdm_engine *e = NULL;
  ec.label_smoothing = 5; /* silently a loss nobody meant */
  CHECK(tdm_engine_create(&e, &mc, 1, &ao, g, &ec) == TDM_ERR_INVALID_ARG && !e);
  ec.label_smoothing = 0, ec.dp.wire_dtype = TDM_I32;
  CHECK(tdm_engine_create(&e, &mc, 1, &ao, g, &ec) == TDM_ERR_INVALID_ARG && !e);
  ec.dp.wire_dtype = TDM_F32;
  CHECK_OK(tdm_engine_create(&e, &mc, 1, &ao, g, &ec));
  tdm_step_stats ss;
  int called = 0;
  CHECK(tdm_engine_step(e, never_batch, &called, 0, INFINITY, &ss) == TDM_ERR_INVALID_ARG && !called); /* refused before a batch */
  CHECK(tdm_engine_shard_loaded(e, -5) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_engine_first_nonfinite(e, NULL) == TDM_ERR_INVALID_ARG);
  tdm_engine_destroy(e);
  tdm_grid_destroy(g);
  tdm_train_config tc = tdm_train_config_default();
  tc.lr_schedule = "bogus"; /* meant constant */
  tdm_train_result res;
  CHECK(tdm_train_run(&tc, &res) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("lr schedule 'bogus' is unknown");
  tc.lr_schedule = NULL, tc.lr = INFINITY;
  CHECK(tdm_train_run(&tc, &res) == TDM_ERR_INVALID_ARG);
}

/* A thread-transport rank that destroys its communicator while its peer waits for it: the peer
 * hears it at once, naming that rank (it waited out its 20 s timeout), as a closed connection
 * over tcp is heard; what was sent before the destroy still arrives. */
typedef struct {
  two_head h;
  tdm_status st;
  double waited;
  float got;
  char why[400];
} gone_rank;
static void *gone_rank_main(void *arg) {
  gone_rank *a = arg;
  tdm_comm_t c;
  if ((a->st = join_two(&a->h, &c)) != TDM_OK) return NULL;
  a->st = tdm_comm_barrier(c);
  float v = 7;
  if (a->st == TDM_OK && a->h.rank == 1) {
    a->st = tdm_comm_send(c, 0, 3, &v, sizeof v); /* one message, then gone */
  } else if (a->st == TDM_OK) {
    double t0 = tdm_time_now();
    a->st = tdm_comm_recv(c, 1, 3, &a->got, sizeof a->got);
    if (a->st == TDM_OK) a->st = tdm_comm_recv(c, 1, 3, &v, sizeof v); /* never sent */
    a->waited = tdm_time_now() - t0;
    snprintf(a->why, sizeof a->why, "%s", a->st != TDM_OK ? tdm_last_error() : "");
  }
  tdm_comm_destroy(c);
  return NULL;
}
static void test_peer_that_left(void) {
  gone_rank r[2];
  memset(r, 0, sizeof r);
  run_two(gone_rank_main, r, sizeof r[0]);
  CHECK_OK(r[1].st);
  CHECK(r[0].got == 7);
  CHECK_MSG(r[0].st == TDM_ERR_REMOTE && strstr(r[0].why, "rank 1 destroyed its communicator"), "%s", r[0].why);
  CHECK_MSG(r[0].waited < 10, "rank 0 waited %.1f s for a rank that had left", r[0].waited);
}

/* A NULL handle or pointer, across the headers: a status or the documented sentinel, and an error
 * naming the argument (307 functions crashed on one; the header preambles give the sentinels). */
#define NULL_CASE(cond, text)                                 \
  do {                                                        \
    tdm__set_error(TDM_ERR_INTERNAL, "(stale)");              \
    CHECK(cond);                                              \
    CHECK_ERR_HAS(text);                                      \
  } while (0)

static void test_null_handles(void) {
  int64_t sh[2] = {2, 3};
  float buf[6] = {0};
  char s[64];
  /* core */
  NULL_CASE(isnan(tdm_rng_uniform(NULL)), "tdm_rng_uniform: the generator is NULL");
  NULL_CASE(tdm_arena_alloc(NULL, 8) == NULL, "tdm_arena_alloc: the arena is NULL");
  CHECK(tdm_arena_used(NULL) == 0 && tdm_arena_peak(NULL) == 0);
  NULL_CASE(isnan(tdm_median(NULL, 3)), "the timings v are NULL");
  tdm__set_error(TDM_ERR_INTERNAL, "(stale)");
  tdm_parallel_for(4, 1, NULL, NULL);
  CHECK_ERR_HAS("tdm_parallel_for: the function fn is NULL");
  /* tensor */
  NULL_CASE(tdm_tensor_ndim(NULL) == -1, "tdm_tensor_ndim: the tensor is NULL");
  NULL_CASE(tdm_tensor_numel(NULL) == 0, "tdm_tensor_numel: the tensor is NULL");
  NULL_CASE(tdm_tensor_data(NULL) == NULL, "tdm_tensor_data: the tensor is NULL");
  NULL_CASE(isnan(tdm_tensor_get(NULL, 0)), "tdm_tensor_get: the tensor is NULL");
  NULL_CASE(tdm_tensor_row_argmax(NULL, 0) == -1, "tdm_tensor_row_argmax: the tensor is NULL");
  NULL_CASE(tdm_shape_str(2, NULL, s, sizeof s) == NULL, "tdm_shape_str: the shape is NULL");
  tdm_tensor *t = NULL;
  NULL_CASE(tdm_tensor_wrap(&t, TDM_F32, 2, sh, NULL) == TDM_ERR_INVALID_ARG && !t, "data is NULL for a tensor of 6 elements");
  int64_t none[2] = {0, 3};
  CHECK_OK(tdm_tensor_wrap(&t, TDM_F32, 2, none, NULL)); /* no elements: nothing to point at */
  tdm_tensor_destroy(t);
  /* autograd: a NULL tape has nowhere to record the error but the thread's */
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  tdm_tensor *a = tdm_zeros(tp, TDM_F32, 2, sh), *parts[2];
  NULL_CASE(tdm_add(NULL, a, a) == NULL, "add: the tape is NULL");
  NULL_CASE(tdm_matmul(NULL, a, a, 0, 1) == NULL, "matmul: the tape is NULL");
  NULL_CASE(tdm_concat(NULL, 1, &a, 0) == NULL, "concat: the tape is NULL");
  NULL_CASE(tdm_split(NULL, a, 0, 2, (int64_t[]){1, 1}, parts) == TDM_ERR_INVALID_ARG, "split: the tape is NULL");
  NULL_CASE(tdm_zeros(NULL, TDM_F32, 2, sh) == NULL, "the tape is NULL");
  NULL_CASE(tdm_backward(NULL, a) == TDM_ERR_INVALID_ARG, "backward: the tape is NULL");
  NULL_CASE(tdm_tape_status(NULL) == TDM_ERR_INVALID_ARG, "tdm_tape_status: the tape is NULL");
  NULL_CASE(tdm_tape_num_nodes(NULL) == 0, "tdm_tape_num_nodes: the tape is NULL");
  NULL_CASE(tdm_custom(NULL, NULL, NULL, 0, NULL) == NULL, "tdm_custom: the tape is NULL");
  NULL_CASE(tdm_model_forward(NULL, NULL, a) == NULL, "model forward: the tape is NULL"); /* returned NULL silently */
  NULL_CASE(tdm_reshape(tp, a, 2, NULL) == NULL && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG, "reshape: the new shape is NULL");
  tdm_tape_reset(tp);
  NULL_CASE(tdm_linear_mod_forward(tp, NULL, a) == NULL && tdm_tape_status(tp) == TDM_ERR_INVALID_ARG,
            "tdm_linear_mod_forward: the module m is NULL");
  tdm_tape_destroy(tp);
  /* nn */
  tdm_params *p;
  CHECK_OK(tdm_params_create(&p));
  tdm_linear_mod lm;
  tdm_block_mod bm;
  NULL_CASE(tdm_params_count(NULL) == 0, "tdm_params_count: the parameters p are NULL");
  NULL_CASE(tdm_params_find(p, NULL) == NULL, "tdm_params_find: the name is NULL");
  NULL_CASE(tdm_linear_mod_init(NULL, p, "fc", 2, 2, 1) == TDM_ERR_INVALID_ARG, "tdm_linear_mod_init: the module m is NULL");
  NULL_CASE(tdm_block_mod_init(&bm, p, NULL, 8, 2, 1, 0) == TDM_ERR_INVALID_ARG, "tdm_block_mod_init: the prefix is NULL");
  CHECK(tdm_params_count(p) == 0); /* "(null).ln_1.weight" was declared before */
  CHECK_OK(tdm_linear_mod_init(&lm, p, "fc", 2, 2, 1));
  tdm_params_destroy(p);
  NULL_CASE(tdm_model_params(NULL) == NULL, "tdm_model_params: the model is NULL");
  NULL_CASE(tdm_kv_cache_len(NULL) == 0, "tdm_kv_cache_len: the cache is NULL");
  /* optim, safetensors, data, sampler */
  NULL_CASE(tdm_optim_steps(NULL) == -1, "tdm_optim_steps: the optimizer is NULL");
  NULL_CASE(tdm_optim_step(NULL, 0.1f) == TDM_ERR_INVALID_ARG, "tdm_optim_step: the optimizer is NULL");
  NULL_CASE(isnan(tdm_lr_at(NULL, 0)), "tdm_lr_at: the schedule is NULL");
  NULL_CASE(tdm_safetensors_count(NULL) == 0, "tdm_safetensors_count: the file f is NULL");
  NULL_CASE(tdm_safetensors_writer_commit(NULL) == TDM_ERR_INVALID_ARG, "the writer w is NULL");
  tdm_idx_free(NULL); /* a no-op, as every other free */
  tdm_idx idx;
  NULL_CASE(tdm_idx_read(NULL, &idx) == TDM_ERR_INVALID_ARG, "tdm_idx_read: the path is NULL");
  NULL_CASE(tdm_dataset_len(NULL) == 0, "tdm_dataset_len: the data set is NULL");
  NULL_CASE(tdm_sampler_epoch(NULL) == -1, "tdm_sampler_epoch: the sampler s is NULL");
  const float *bx;
  const int32_t *by;
  int64_t n, first;
  NULL_CASE(tdm_sampler_next(NULL, &bx, &by, &n, &first) == TDM_ERR_INVALID_ARG, "tdm_sampler_next: the sampler s is NULL");
  /* comm, dp, pipeline, engine */
  tdm_comm_t c2;
  NULL_CASE(tdm_comm_rank(NULL) == -1, "tdm_comm_rank: the communicator is NULL");
  NULL_CASE(tdm_comm_size(NULL) == 0, "tdm_comm_size: the communicator is NULL");
  NULL_CASE(tdm_comm_split(NULL, 0, 0, &c2) == TDM_ERR_INVALID_ARG && !c2, "tdm_comm_split: the communicator is NULL");
  NULL_CASE(tdm_work_test(NULL) == -1, "tdm_work_test: the work handle is NULL");
  NULL_CASE(tdm_reduce_local(NULL, buf, 4, TDM_F32, TDM_SUM) == TDM_ERR_INVALID_ARG, "tdm_reduce_local: dst is NULL");
  NULL_CASE(tdm_dp_num_buckets(NULL) == 0, "tdm_dp_num_buckets: the data-parallel handle dp is NULL");
  NULL_CASE(tdm_dp_finish(NULL, NULL) == TDM_ERR_INVALID_ARG, "tdm_dp_finish: the data-parallel handle dp is NULL");
  NULL_CASE(tdm_pp_chunk_rank(NULL, 0) == -1, "tdm_pp_chunk_rank: the schedule s is NULL");
  NULL_CASE(tdm_engine_model(NULL) == NULL, "tdm_engine_model: the engine e is NULL");
  NULL_CASE(tdm_grid_index(NULL, TDM_AXIS_DATA) == -1, "tdm_grid_index: the grid g is NULL");
  /* checkpoint, plan, sim, kernels */
  NULL_CASE(tdm_ckpt_tensor_count(NULL) == 0, "tdm_ckpt_tensor_count: the checkpoint c is NULL");
  NULL_CASE(tdm_ckpt_get_optim_steps(NULL) == -1, "tdm_ckpt_get_optim_steps: the checkpoint c is NULL");
  NULL_CASE(tdm_ckpt_latest(NULL, s, sizeof s, NULL, 0) == TDM_ERR_INVALID_ARG, "the directory name is NULL");
  double e1, b1, h1;
  tdm__set_error(TDM_ERR_INTERNAL, "(stale)");
  tdm_plan_gpt_costs(NULL, 0, &e1, &b1, &h1);
  CHECK_ERR_HAS("tdm_plan_gpt_costs: the model config m is NULL");
  NULL_CASE(tdm_sim_p2p_cost(NULL, 1, 0, 1) == -1, "tdm_sim_p2p_cost: the cluster k is NULL");
  CHECK(tdm_k_conv2d_ws_floats(NULL) == 0 && tdm_k_conv2d_chunk(NULL) == 0);
}

TDM_TEST_MAIN(T(test_shapes_whose_size_overflows), T(test_arena_and_shared_sizes), T(test_checksum_and_latest),
              T(test_rows_casts_and_data), T(test_reductions_and_empty_ops), T(test_init_specs_and_forward),
              T(test_simulator_and_trace_values), T(test_sampler_rules),
              T(test_counts_views_and_messages), T(test_failed_checkpoint_leaves_nothing),
              T(test_ranks_with_other_engines), T(test_engine_and_optimizer_values), T(test_peer_that_left),
              T(test_null_handles))
