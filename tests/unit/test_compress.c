/* Gradient compressors (src/parallel/compress_*.c) against closed forms: the spec parser's errors;
 * PowerSGD reconstructs a matrix of rank <= r exactly and, iterated with its warm start, reaches
 * the best rank-r error (Eckart-Young: the singular values left out, for a matrix built from
 * known orthonormal bases); top-k on 2 ranks sends exactly 8k bytes (measured), gives the average
 * of each rank's k largest values (worked out here by sorting) with the rest carried to the next
 * step, the same bits on both ranks; the telescoping check stays within rounding. */
#include <pthread.h>

#include "parallel/compress.h"
#include "tandem/engine.h"
#include "tdm_test.h"

static void parse_errors(void) {
  const char *good[] = {NULL, "none", "bf16", "fp16", "topk:0.01", "topk:1", "topk:1e-3", "powersgd:4", "powersgd:1"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK_MSG(tdm_compress_check(good[i]) == TDM_OK, "%s: %s", good[i], tdm_last_error());
  CHECK(tdm_compress_is_hook("topk:0.5") && tdm_compress_is_hook("powersgd:2"));
  CHECK(!tdm_compress_is_hook("bf16") && !tdm_compress_is_hook(NULL) && !tdm_compress_is_hook("topk:0"));
  struct {
    const char *spec, *says;
  } bad[] = {{"topk:0", "the ratio 0 is out of range; expected topk:RATIO with 0 < RATIO <= 1"},
             {"topk:2", "the ratio 2 is out of range"},
             {"topk:1.5", "the ratio 1.5 is out of range"},
             {"topk:-0.1", "the ratio -0.1 is out of range"},
             {"topk:abc", "the ratio 'abc' is not a number"},
             {"topk:nan", "the ratio 'nan' is not a number"},
             {"topk:", "the ratio '' is not a number"},
             {"topk", "no argument; expected topk:RATIO"},
             {"powersgd:0", "the rank 0 is out of range; expected powersgd:RANK"},
             {"powersgd:abc", "the rank 'abc' is not a whole number"},
             {"powersgd:1.5", "the rank '1.5' is not a whole number"},
             {"powersgd:-2", "the rank -2 is out of range"},
             {"int8", "compress 'int8': unknown; expected one of none, bf16, fp16, topk:RATIO with 0 < RATIO <= 1, powersgd:RANK"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CHECK_MSG(tdm_compress_check(bad[i].spec) == TDM_ERR_INVALID_ARG, "%s accepted", bad[i].spec);
    CHECK_ERR_HAS(bad[i].says);
    CHECK_ERR_HAS(bad[i].spec);
  }
  tdm__compress *cz = NULL;
  CHECK(tdm__compress_create(&cz, "topk:0.1", -1, 0) == TDM_ERR_INVALID_ARG && !cz);
  CHECK_ERR_HAS("compress start -1");
}

/* An orthonormal basis in closed form: the DCT-II vectors, column j of U (n x n). */
static double dct(int64_t n, int64_t i, int64_t j) {
  return sqrt((j ? 2.0 : 1.0) / (double)n) * cos(M_PI * ((double)i + 0.5) * (double)j / (double)n);
}

static double frob_diff(const float *a, const float *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return sqrt(s);
}

/* M = Σ_k s_k u_k v_kᵀ with DCT bases: its singular values are s. */
static void make_matrix(float *M, int64_t rows, int64_t cols, const double *s, int ns) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      double v = 0;
      for (int k = 0; k < ns; k++) v += s[k] * dct(rows, i, k) * dct(cols, j, k);
      M[i * cols + j] = (float)v;
    }
}

static void powersgd_exact_low_rank(void) {
  enum { R = 40, C = 30, r = 4 };
  static float M[R * C], P[R * r], Q[C * r], out[R * C];
  double s[3] = {5, 2, 0.5}; /* rank 3 <= 4 */
  make_matrix(M, R, C, s, 3);
  tdm_rng rng;
  tdm_rng_seed(&rng, 7);
  for (int i = 0; i < C * r; i++) Q[i] = tdm_rng_normal(&rng);
  tdm__psgd_p(M, R, C, r, Q, P);
  tdm__psgd_orthonormalise(P, R, r);
  tdm__psgd_q(M, R, C, r, P, Q);
  tdm__psgd_approx(P, Q, R, C, r, out);
  double mx = 0;
  for (int i = 0; i < R * C; i++) mx = fmax(mx, fabs((double)out[i] - M[i]));
  CHECK_MSG(mx <= 1e-6, "one step of rank 4 on a rank-3 matrix: max error %.3g", mx);
  /* the same through the compressor on one rank: the output is M, the residual nothing */
  tdm__compress *cz;
  CHECK_OK(tdm__compress_create(&cz, "powersgd:4", 0, 11));
  tdm__cmat mats[2] = {{R * C, 1, 10}, {0, R, C}}; /* a matrix and a bias (unsorted on purpose) */
  CHECK_OK(tdm__compress_add_bucket(cz, R * C + 10, 2, mats));
  static float g[R * C + 10];
  memcpy(g, M, sizeof M);
  for (int i = 0; i < 10; i++) g[R * C + i] = (float)i - 4.5f;
  CHECK_OK(tdm__compress_bucket(cz, 0, NULL, g));
  mx = 0;
  for (int i = 0; i < R * C; i++) mx = fmax(mx, fabs((double)g[i] - M[i]));
  CHECK_MSG(mx <= 1e-6, "the compressor on one rank: max error %.3g", mx);
  for (int i = 0; i < 10; i++) CHECK(g[R * C + i] == (float)i - 4.5f); /* the bias travels whole */
  const tdm_compress_stats *st;
  CHECK(tdm__compress_stats(cz, &st) == 1);
  CHECK_MSG(st[0].rel_err <= 1e-6, "relative error %.3g", st[0].rel_err);
  CHECK(st[0].payload_bytes == 4 * (uint64_t)((R + C) * r + 10) && st[0].bytes_sent == 0);
  CHECK_NEAR(st[0].ratio, (double)(R * C + 10) / ((R + C) * r + 10), 1e-12);
  tdm__compress_destroy(cz);
}

static void powersgd_approaches_svd(void) {
  enum { R = 48, C = 36, r = 2, NS = 8 };
  static float M[R * C], P[R * r], Q[C * r], out[R * C];
  double s[NS] = {10, 8, 6, 4, 2, 1, 0.5, 0.25};
  make_matrix(M, R, C, s, NS);
  double best = 0; /* Eckart-Young: the singular values beyond r */
  for (int k = r; k < NS; k++) best += s[k] * s[k];
  best = sqrt(best);
  tdm_rng rng;
  tdm_rng_seed(&rng, 3);
  for (int i = 0; i < C * r; i++) Q[i] = tdm_rng_normal(&rng);
  double first = 0, prev = INFINITY, err = 0;
  int monotone = 1;
  for (int it = 1; it <= 60; it++) { /* power iteration, warm-started from the last Q */
    tdm__psgd_p(M, R, C, r, Q, P);
    tdm__psgd_orthonormalise(P, R, r);
    tdm__psgd_q(M, R, C, r, P, Q);
    tdm__psgd_approx(P, Q, R, C, r, out);
    err = frob_diff(out, M, R * C);
    if (it == 1) first = err;
    CHECK_MSG(err >= best * (1 - 1e-5), "iteration %d: error %.9g below the best rank-%d error %.9g", it, err, r, best);
    if (err > prev * (1 + 1e-6)) monotone = 0;
    prev = err;
  }
  CHECK_MSG(first > best * 1.01, "one iteration from a random Q should not be optimal already (%.6g vs %.6g)", first, best);
  CHECK(monotone);
  /* (s3/s2)^(2 x 60) = 0.75^120: the rest is float rounding */
  CHECK_MSG(err <= best * (1 + 1e-5), "after 60 iterations: error %.9g, best rank-%d %.9g", err, r, best);
}

/* ---- top-k on 2 ranks over the thread transport ------------------------------------------------ */
enum { TN = 1000, TK = 13 }; /* ratio 0.013 */
typedef struct {
  int r;
  void *group;
  float out[2][TN];
  tdm_compress_stats st[2];
  uint64_t bytes[2];
  tdm_status status;
  char err[256];
} topk_arg;

/* Distinct magnitudes, signs mixed: rank r's gradient at step t. */
static float tgrad(int r, int t, int i) {
  int64_t h = (int64_t)(((uint64_t)i * 7919 + (uint64_t)r * 104729 + (uint64_t)t * 31) % 1000003);
  return (float)((h % 2 ? -1 : 1) * (double)h / 1000003.0);
}

static void *topk_rank(void *va) {
  topk_arg *a = va;
  tdm_comm_t c = NULL;
  tdm_comm_config cc = {0};
  cc.rank = a->r, cc.size = 2, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 30;
  tdm__compress *cz = NULL;
  tdm_status st = tdm_comm_create(&c, &cc);
  if (st == TDM_OK) st = tdm__compress_create(&cz, "topk:0.013", 0, 1);
  tdm__cmat mats[2] = {{0, 20, 45}, {900, 1, 100}};
  if (st == TDM_OK) st = tdm__compress_add_bucket(cz, TN, 2, mats);
  for (int t = 0; t < 2 && st == TDM_OK; t++) {
    for (int i = 0; i < TN; i++) a->out[t][i] = tgrad(a->r, t, i);
    uint64_t b0 = tdm_comm_bytes_sent(c);
    st = tdm__compress_bucket(cz, 0, c, a->out[t]);
    a->bytes[t] = tdm_comm_bytes_sent(c) - b0;
    const tdm_compress_stats *s;
    if (st == TDM_OK && tdm__compress_stats(cz, &s) == 1) a->st[t] = s[0];
  }
  a->status = st;
  if (st != TDM_OK) snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
  tdm__compress_destroy(cz);
  tdm_comm_destroy(c);
  return NULL;
}

/* The test's own top-k: the k largest |x| (all distinct here), the rest left in x. */
static void topk_ref(float *x, float *sparse) {
  memset(sparse, 0, sizeof(float) * TN);
  for (int q = 0; q < TK; q++) {
    int best = -1;
    for (int i = 0; i < TN; i++)
      if (x[i] != 0 && (best < 0 || fabsf(x[i]) > fabsf(x[best]))) best = i;
    sparse[best] = x[best];
    x[best] = 0;
  }
}

static void topk_two_ranks(void) {
  void *group;
  CHECK_OK(tdm_comm_thread_group_create(&group, 2));
  static topk_arg a[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].r = r, a[r].group = group;
    pthread_create(&th[r], NULL, topk_rank, &a[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(group);
  for (int r = 0; r < 2; r++) CHECK_MSG(a[r].status == TDM_OK, "rank %d: %s", r, a[r].err);
  /* the reference: each rank's residual carried into its next step */
  static float acc[2][TN], sparse[2][TN], want[TN];
  memset(acc, 0, sizeof acc);
  for (int t = 0; t < 2; t++) {
    for (int r = 0; r < 2; r++) {
      for (int i = 0; i < TN; i++) acc[r][i] += tgrad(r, t, i);
      topk_ref(acc[r], sparse[r]);
    }
    for (int i = 0; i < TN; i++) want[i] = (sparse[0][i] + sparse[1][i]) / 2.0f;
    CHECK_MSG(memcmp(a[0].out[t], a[1].out[t], sizeof want) == 0, "step %d: the ranks disagree", t);
    CHECK_MSG(memcmp(a[0].out[t], want, sizeof want) == 0, "step %d: not the average of the ranks' top-%d", t, TK);
    int nz = 0;
    for (int i = 0; i < TN; i++) nz += want[i] != 0;
    CHECK(nz > TK && nz <= 2 * TK);
    for (int r = 0; r < 2; r++) {
      /* 8k bytes: k i32 indices and k f32 values; an all-gather on 2 ranks sends one part */
      CHECK_MSG(a[r].bytes[t] == 7 * TK && a[r].st[t].bytes_sent == 7 * TK && a[r].st[t].payload_bytes == 7 * TK,
                "rank %d step %d: %llu bytes sent; expected %d", r, t, (unsigned long long)a[r].bytes[t], 7 * TK);
      CHECK_NEAR(a[r].st[t].ratio, 4.0 * TN / (7 * TK), 1e-12);
      double e2 = 0, a2 = 0; /* what stayed behind, against the whole */
      for (int i = 0; i < TN; i++) e2 += (double)acc[r][i] * acc[r][i], a2 += ((double)acc[r][i] + sparse[r][i]) * ((double)acc[r][i] + sparse[r][i]);
      CHECK_NEAR(a[r].st[t].rel_err, sqrt(e2 / a2), 1e-6);
      CHECK_MSG(a[r].st[t].telescope_err < 1e-6, "telescoping error %.3g", a[r].st[t].telescope_err);
    }
  }
}

/* The check is no tautology: a residual changed behind the compressor's back (a value lost, as
 * a bug that forgot part of it would) fails the next step, naming the bucket. Then timing of one
 * reduce of a 500k-value bucket, for the record. */
static void telescope_catches(void) {
  const char *specs[] = {"topk:0.01", "powersgd:2"};
  for (int s = 0; s < 2; s++) {
    tdm__compress *cz;
    CHECK_OK(tdm__compress_create(&cz, specs[s], 0, 5));
    tdm__cmat mats[1] = {{0, 40, 25}};
    CHECK_OK(tdm__compress_add_bucket(cz, 1000, 1, mats));
    static float g[1000];
    for (int t = 0; t < 3; t++) {
      for (int i = 0; i < 1000; i++) g[i] = tgrad(0, t, i);
      CHECK_OK(tdm__compress_bucket(cz, 0, NULL, g));
    }
    float *r = tdm__compress_residual(cz, 0);
    int i = 0;
    for (int j = 0; j < 1000; j++) i = fabsf(r[j]) > fabsf(r[i]) ? j : i;
    CHECK(r[i] != 0);
    r[i] *= 0.5f; /* half of one value lost */
    for (int i2 = 0; i2 < 1000; i2++) g[i2] = tgrad(0, 3, i2);
    CHECK_MSG(tdm__compress_bucket(cz, 0, NULL, g) == TDM_ERR_INTERNAL, "%s: a lost residual went unnoticed", specs[s]);
    CHECK_ERR_HAS("bucket 0: error feedback does not telescope");
    tdm__compress_destroy(cz);
  }
  enum { N = 1 << 19 };
  for (int s = 0; s < 2; s++) {
    tdm__compress *cz;
    CHECK_OK(tdm__compress_create(&cz, specs[s], 0, 5));
    tdm__cmat mats[2] = {{0, 512, 1020}, {512 * 1020, 1, N - 512 * 1020}};
    CHECK_OK(tdm__compress_add_bucket(cz, N, 2, mats));
    float *g = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) g[i] = tgrad(0, 0, i);
    double t0 = tdm_time_now();
    CHECK_OK(tdm__compress_bucket(cz, 0, NULL, g));
    printf("  %s: one reduce of %d values on one rank: %.1f ms\n", specs[s], N, (tdm_time_now() - t0) * 1e3);
    free(g);
    tdm__compress_destroy(cz);
  }
}

/* Large buckets take the sampled bound (compress_topk.c): still exactly the k largest, for smooth
 * values, for values large only where the sample looks (fewer than k pass its bound: the whole
 * bucket is searched), and with ties at the threshold (taken in index order). One rank: the
 * output is the sparse part itself. */
static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}
static void topk_large(void) {
  enum { N = 100000, K = 1000 };
  float *g = malloc(sizeof(float) * N), *in = malloc(sizeof(float) * N), *m = malloc(sizeof(float) * N);
  for (int kind = 0; kind < 3; kind++) {
    for (int i = 0; i < N; i++) {
      if (kind == 0) in[i] = tgrad(1, 2, i);
      else if (kind == 1) in[i] = tgrad(0, 1, i); /* then large where the sample looks: fewer than k pass its bound */
      else in[i] = (float)((i * 37) % 50) - 25.0f; /* many ties at every magnitude */
    }
    if (kind == 1) /* the sample's positions (compress_topk.c: 4096 strided, jittered) */
      for (int j = 0; j < 4096; j++) in[j * (N / 4096) + (j * 7919) % (N / 4096)] = 1000.0f + (float)j;
    tdm__compress *cz;
    CHECK_OK(tdm__compress_create(&cz, "topk:0.01", 0, 1));
    tdm__cmat mats[1] = {{0, 1, N}};
    CHECK_OK(tdm__compress_add_bucket(cz, N, 1, mats));
    memcpy(g, in, sizeof(float) * N);
    CHECK_OK(tdm__compress_bucket(cz, 0, NULL, g));
    for (int i = 0; i < N; i++) m[i] = fabsf(in[i]);
    qsort(m, N, sizeof(float), cmp_desc);
    float thr = m[K - 1];
    int above = 0, taken = 0, ties = 0, ok = 1;
    for (int i = 0; i < N; i++) above += fabsf(in[i]) > thr;
    for (int i = 0; i < N; i++) { /* expected: all above, then ties in index order */
      int take = fabsf(in[i]) > thr || (fabsf(in[i]) == thr && ties < K - above);
      if (fabsf(in[i]) == thr && !(fabsf(in[i]) > thr) && take) ties++;
      taken += take;
      if (g[i] != (take ? in[i] : 0.0f)) ok = 0;
    }
    CHECK_MSG(ok && taken == K, "kind %d: not exactly the %d largest (%d taken)", kind, K, taken);
    const tdm_compress_stats *st;
    CHECK(tdm__compress_stats(cz, &st) == 1 && st[0].payload_bytes == 7 * K);
    tdm__compress_destroy(cz);
  }
  free(g), free(in), free(m);
}

/* k = ceil(RATIO x n), at least 1, each sent as a 4-byte value and a 3-byte offset in the
 * bucket: 7k bytes, so topk:0.01 sends at least 50x fewer bytes than f32 from 700 values up
 * (8 bytes a value, 1050 values sent 11: 47.7x); the values land at their offsets. */
static void topk_k_and_bytes(void) {
  struct { int64_t n; int k; } cases[] = {{1050, 11}, {1099, 11}, {1100, 11}, {100, 1}, {50, 1}, {1, 1}, {70000, 700}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int64_t n = cases[i].n;
    float *g = calloc((size_t)n, sizeof(float)), *in = calloc((size_t)n, sizeof(float));
    for (int64_t j = 0; j < n; j++) in[j] = g[j] = (float)(j % 13) - 6.5f + (float)j * 1e-6f; /* the last of each 13 largest */
    tdm__compress *cz;
    CHECK_OK(tdm__compress_create(&cz, "topk:0.01", 0, 1));
    tdm__cmat mats[1] = {{0, 1, n}};
    CHECK_OK(tdm__compress_add_bucket(cz, n, 1, mats));
    CHECK_OK(tdm__compress_bucket(cz, 0, NULL, g));
    int64_t nz = 0, bad = 0;
    for (int64_t j = 0; j < n; j++) {
      nz += g[j] != 0;
      bad += g[j] != 0 && g[j] != in[j]; /* what was sent arrives at its offset */
    }
    const tdm_compress_stats *st;
    CHECK(tdm__compress_stats(cz, &st) == 1);
    CHECK_MSG(nz == cases[i].k && !bad && st[0].payload_bytes == 7 * (uint64_t)cases[i].k,
              "n %lld: %lld values (%lld misplaced), %llu bytes; expected k = %d", (long long)n, (long long)nz, (long long)bad,
              (unsigned long long)st[0].payload_bytes, cases[i].k);
    if (n >= 700) CHECK(4.0 * (double)n / (double)st[0].payload_bytes >= 50.0);
    tdm__compress_destroy(cz);
    free(g), free(in);
  }
}

/* The compressors live in the data-parallel engine: any other engine given one is refused by
 * name before anything is built (one process, a 1 x 1 x 1 grid); dp takes it. */
static void engines_refuse(void) {
  tdm_grid *g = NULL;
  CHECK_OK(tdm_grid_create(&g, NULL, 0, 1, 1));
  tdm_model_config mc = tdm_model_config_gpt_mini();
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  for (int k = 0; g && k < TDM_ENGINE_KIND_COUNT; k++) {
    const char *name = tdm_engine_kind_name((tdm_engine_kind)k);
    tdm_engine_config ec = tdm_engine_config_default();
    ec.kind = (tdm_engine_kind)k, ec.dp.compress = "topk:0.1";
    tdm_engine *e = NULL;
    tdm_status st = tdm_engine_create(&e, &mc, 1, &oc, g, &ec);
    if (k == TDM_ENGINE_DP) {
      CHECK_MSG(st == TDM_OK && e, "dp with topk:0.1: %s", tdm_last_error());
    } else {
      CHECK_MSG(st == TDM_ERR_INVALID_ARG && !e, "the %s engine took a compressor", name);
      CHECK_ERR_HAS("compress topk:0.1 with the");
      CHECK_ERR_HAS(name);
      CHECK_ERR_HAS("expected the data-parallel engine (dp)");
    }
    tdm_engine_destroy(e);
  }
  tdm_grid_destroy(g);
}

/* fp16 skips a step whose gradients overflow; error feedback would keep them in its residuals, so
 * the data-parallel engine refuses fp16 with topk or powersgd, naming both, and takes bf16 with them
 * and fp16 with a wire dtype. */
static void fp16_refused(void) {
  tdm_grid *g = NULL;
  CHECK_OK(tdm_grid_create(&g, NULL, 0, 1, 1));
  tdm_model_config mc = tdm_model_config_gpt_mini();
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  const char *spec[4] = {"topk:0.1", "powersgd:2", "topk:0.1", "bf16"};
  tdm_dtype prec[4] = {TDM_F16, TDM_F16, TDM_BF16, TDM_F16};
  for (int k = 0; g && k < 4; k++) {
    tdm_engine_config ec = tdm_engine_config_default();
    ec.dp.compress = spec[k], ec.precision = prec[k];
    tdm_engine *e = NULL;
    tdm_status st = tdm_engine_create(&e, &mc, 1, &oc, g, &ec);
    if (k < 2) {
      CHECK_MSG(st == TDM_ERR_NOT_SUPPORTED && !e, "%s with f16 was taken", spec[k]);
      CHECK_ERR_HAS(spec[k]);
      CHECK_ERR_HAS("precision f16");
    } else {
      CHECK_MSG(st == TDM_OK && e, "%s with %s: %s", spec[k], tdm_dtype_name(prec[k]), tdm_last_error());
    }
    tdm_engine_destroy(e);
  }
  tdm_grid_destroy(g);
}

TDM_TEST_MAIN(T(topk_large), T(topk_k_and_bytes), T(telescope_catches), T(parse_errors), T(powersgd_exact_low_rank), T(powersgd_approaches_svd), T(topk_two_ranks), T(engines_refuse), T(fp16_refused))
