/* Collectives on the thread transport against closed forms: element j of rank r holds a value
 * made from j and r, so every expected result is a formula, not a second implementation.
 * World sizes 1, 2, 3, 4, 5, 7, 8; every collective x algorithm x dtype x op; counts 0, 1, odd,
 * large. Then barrier semantics, send/recv, non-blocking calls, split, mismatches of every field
 * of every collective, TANDEM_ALGO, 64-bit offsets, reduce-scatter + all-gather == all-reduce bit
 * for bit, abandoned non-blocking handles, and the environment's error messages. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "comm/comm_impl.h" /* tdm__parse_net_emulate, tdm__blocks */
#include "multirank/mismatch.h"
#include "tdm_test.h"

static const tdm_dtype DTYPES[] = {TDM_F32, TDM_F64, TDM_BF16, TDM_F16, TDM_I32, TDM_I64, TDM_U8};
#define N_DT 7

/* Inputs, exact in every dtype for P <= 8. */
static double input(tdm_redop op, int r, size_t j) {
  switch (op) {
  case TDM_PROD: return 1 + (double)((j + (size_t)r) % 2);  /* products of 1s and 2s: at most 2^4 */
  case TDM_MIN:
  case TDM_MAX: return (double)((j * 3 + (size_t)r * 5) % 11);
  default: return (double)(j % 7) + r + 1;                  /* sums at most 84 */
  }
}

static double expect(tdm_redop op, int P, size_t j, tdm_dtype dt) {
  double acc = op == TDM_PROD ? 1 : (op == TDM_MIN ? 1e9 : (op == TDM_MAX ? -1e9 : 0));
  for (int r = 0; r < P; r++) {
    double v = input(op, r, j);
    if (op == TDM_PROD) acc *= v;
    else if (op == TDM_MIN) acc = v < acc ? v : acc;
    else if (op == TDM_MAX) acc = v > acc ? v : acc;
    else acc += v;
  }
  if (op == TDM_AVG) {
    if (dt == TDM_I32 || dt == TDM_I64 || dt == TDM_U8) return (double)((int64_t)acc / P);
    double q = acc / P; /* the division happens in the dtype's precision */
    float f = (float)q;
    if (dt == TDM_BF16) return tdm_bf16_to_f32(tdm_f32_to_bf16(f));
    if (dt == TDM_F16) return tdm_f16_to_f32(tdm_f32_to_f16(f));
    if (dt == TDM_F32) return f;
    return q;
  }
  return acc;
}

static void *alloc_fill(tdm_dtype dt, size_t n, tdm_redop op, int r) {
  size_t es = tdm_dtype_size(dt);
  double *d = malloc(sizeof(double) * (n ? n : 1));
  void *b = malloc(es * (n ? n : 1) + 16);
  for (size_t j = 0; j < n; j++) d[j] = input(op, r, j);
  tdm_convert(b, dt, d, TDM_F64, (int64_t)n);
  free(d);
  return b;
}

static double get(const void *b, tdm_dtype dt, size_t j) {
  double v;
  tdm_convert(&v, TDM_F64, (const char *)b + j * tdm_dtype_size(dt), dt, 1);
  return v;
}

typedef struct {
  int P, r;
  tdm_comm_t c;
} ctx_t;

/* Counts wrong elements; reports the first. */
static int64_t wrong_vs(const char *what, const void *b, tdm_dtype dt, size_t n, double (*f)(size_t, void *), void *fc) {
  int64_t bad = 0;
  for (size_t j = 0; j < n; j++) {
    double want = f(j, fc), got = get(b, dt, j);
    if (got != want) {
      if (!bad) fprintf(stderr, "  %s: element %zu is %g, expected %g\n", what, j, got, want);
      bad++;
    }
  }
  return bad;
}

typedef struct {
  tdm_redop op;
  int P;
  tdm_dtype dt;
  size_t offset; /* element offset (reduce-scatter block) */
} red_ctx;
static double red_expect(size_t j, void *v) {
  red_ctx *k = v;
  return expect(k->op, k->P, j + k->offset, k->dt);
}

static const size_t COUNTS[] = {0, 1, 7, 1003};

static void run_allreduce(ctx_t *x) {
  tdm_algo algos[] = {TDM_ALGO_RING, TDM_ALGO_RD, TDM_ALGO_RHD, TDM_ALGO_TREE, TDM_ALGO_AUTO};
  for (int a = 0; a < 5; a++)
    for (int d = 0; d < N_DT; d++)
      for (int op = 0; op < TDM_REDOP_COUNT; op++)
        for (int ci = 0; ci < 4; ci++) {
          size_t n = COUNTS[ci];
          tdm_dtype dt = DTYPES[d];
          void *in = alloc_fill(dt, n, (tdm_redop)op, x->r), *out = malloc(tdm_dtype_size(dt) * (n ? n : 1));
          int inplace = (ci + a) % 2;
          tdm_status st = tdm_comm_allreduce(x->c, in, inplace ? in : out, n, dt, (tdm_redop)op, algos[a]);
          CHECK_MSG(st == TDM_OK, "P=%d all-reduce %s %s %s n=%zu: %s", x->P, tdm_algo_name(algos[a]),
                    tdm_dtype_name(dt), tdm_redop_name((tdm_redop)op), n, tdm_last_error());
          red_ctx k = {(tdm_redop)op, x->P, dt, 0};
          char what[96];
          snprintf(what, sizeof what, "P=%d r=%d all-reduce %s %s %s n=%zu", x->P, x->r, tdm_algo_name(algos[a]),
                   tdm_dtype_name(dt), tdm_redop_name((tdm_redop)op), n);
          CHECK(wrong_vs(what, inplace ? in : out, dt, n, red_expect, &k) == 0);
          free(in);
          free(out);
        }
  /* large ones, bigger than the 4 MiB chunk, through every algorithm (the sanitizer pass of make test,
     TANDEM_TEST_LIGHT: at 3 and 8 ranks only, the odd and the power of two; make test-san-full: all) */
  if (tdm_test_light() && x->P != 3 && x->P != 8) return;
  size_t n = (5u << 20) / 4 + 3;
  float *v = malloc(n * 4);
  for (int a = 0; a < 4; a++) {
    for (size_t j = 0; j < n; j++) v[j] = (float)(j % 7) + (float)x->r + 1;
    CHECK_MSG(tdm_comm_allreduce(x->c, v, v, n, TDM_F32, TDM_SUM, algos[a]) == TDM_OK, "large %s: %s",
              tdm_algo_name(algos[a]), tdm_last_error());
    int64_t bad = 0;
    for (size_t j = 0; j < n; j++) bad += v[j] != (float)(x->P * ((j % 7) + 1) + x->P * (x->P - 1) / 2);
    CHECK(bad == 0);
  }
  free(v);
}

typedef struct {
  int root;
} bc_ctx;
static double bc_expect(size_t j, void *v) { return (double)((j * 7 + (size_t)((bc_ctx *)v)->root) % 200); }

static void run_broadcast_reduce(ctx_t *x) {
  size_t counts[] = {0, 1, 1003, 300001};
  tdm_algo algos[] = {TDM_ALGO_TREE, TDM_ALGO_CHAIN, TDM_ALGO_AUTO};
  for (int a = 0; a < 3; a++)
    for (int root = 0; root < x->P; root += (x->P > 2 ? x->P - 1 : 1))
      for (int ci = 0; ci < 4; ci++)
        for (int d = 0; d < N_DT; d += 3) { /* f32, f16, u8 */
          tdm_dtype dt = DTYPES[d];
          size_t n = counts[ci], es = tdm_dtype_size(dt);
          char *b = calloc(n + 1, es);
          bc_ctx k = {root};
          if (x->r == root) {
            double *src = malloc(sizeof(double) * (n + 1));
            for (size_t j = 0; j < n; j++) src[j] = bc_expect(j, &k);
            tdm_convert(b, dt, src, TDM_F64, (int64_t)n);
            free(src);
          }
          CHECK_OK(tdm_comm_broadcast(x->c, b, n, dt, root, algos[a]));
          CHECK(wrong_vs("broadcast", b, dt, n, bc_expect, &k) == 0);
          free(b);
        }
  for (int root = 0; root < x->P; root += (x->P > 1 ? x->P / 2 + 1 : 1))
    for (int op = 0; op < TDM_REDOP_COUNT; op++)
      for (int d = 0; d < N_DT; d++)
        for (int ci = 0; ci < 4; ci++) {
          tdm_dtype dt = DTYPES[d];
          size_t n = COUNTS[ci];
          void *in = alloc_fill(dt, n, (tdm_redop)op, x->r), *out = calloc(n + 1, tdm_dtype_size(dt));
          CHECK_OK(tdm_comm_reduce(x->c, in, out, n, dt, (tdm_redop)op, root, TDM_ALGO_AUTO));
          red_ctx k = {(tdm_redop)op, x->P, dt, 0};
          if (x->r == root) CHECK(wrong_vs("reduce", out, dt, n, red_expect, &k) == 0);
          free(in);
          free(out);
        }
}

static void run_scatter_gather(ctx_t *x) {
  int P = x->P, r = x->r;
  int pow2 = (P & (P - 1)) == 0;
  size_t blocks[] = {0, 1, 5, 1000};
  tdm_algo rs_algos[] = {TDM_ALGO_RING, TDM_ALGO_RHD, TDM_ALGO_AUTO};
  for (int a = 0; a < 3; a++)
    for (int op = 0; op < TDM_REDOP_COUNT; op++)
      for (int d = 0; d < N_DT; d++)
        for (int bi = 0; bi < 4; bi++) {
          tdm_dtype dt = DTYPES[d];
          size_t n = blocks[bi];
          void *in = alloc_fill(dt, n * (size_t)P, (tdm_redop)op, r), *out = calloc(n + 1, tdm_dtype_size(dt));
          tdm_status st = tdm_comm_reduce_scatter(x->c, in, out, n, dt, (tdm_redop)op, rs_algos[a]);
          if (rs_algos[a] == TDM_ALGO_RHD && !pow2 && P > 1) {
            CHECK(st == TDM_ERR_NOT_SUPPORTED); /* refused on every rank, before any message */
          } else {
            CHECK_MSG(st == TDM_OK, "reduce-scatter: %s", tdm_last_error());
            red_ctx k = {(tdm_redop)op, P, dt, (size_t)r * n};
            CHECK(wrong_vs("reduce-scatter", out, dt, n, red_expect, &k) == 0);
          }
          free(in);
          free(out);
        }
  tdm_algo ag_algos[] = {TDM_ALGO_RING, TDM_ALGO_RD, TDM_ALGO_AUTO};
  for (int a = 0; a < 3; a++)
    for (int bi = 0; bi < 4; bi++)
      for (int inplace = 0; inplace < 2; inplace++) {
        size_t n = blocks[bi];
        int32_t *out = calloc(n * (size_t)P + 1, 4), *in = malloc(4 * (n + 1));
        for (size_t j = 0; j < n; j++) in[j] = (int32_t)(r * 100000 + (int)j);
        if (inplace) memcpy(out + (size_t)r * n, in, 4 * n);
        tdm_status st = tdm_comm_allgather(x->c, inplace ? out + (size_t)r * n : in, out, n, TDM_I32, ag_algos[a]);
        if (ag_algos[a] == TDM_ALGO_RD && !pow2 && P > 1) {
          CHECK(st == TDM_ERR_NOT_SUPPORTED);
        } else {
          CHECK_MSG(st == TDM_OK, "all-gather: %s", tdm_last_error());
          int64_t bad = 0;
          for (int i = 0; i < P; i++)
            for (size_t j = 0; j < n; j++) bad += out[(size_t)i * n + j] != i * 100000 + (int)j;
          CHECK(bad == 0);
        }
        free(in);
        free(out);
      }
  for (int root = 0; root < P; root += (P > 2 ? P - 1 : 1))
    for (int bi = 0; bi < 4; bi++) {
      size_t n = blocks[bi];
      int64_t *all = calloc(n * (size_t)P + 1, 8), *mine = calloc(n + 1, 8);
      for (size_t j = 0; j < n; j++) mine[j] = r * 1000 + (int64_t)j;
      CHECK_OK(tdm_comm_gather(x->c, mine, all, n, TDM_I64, root));
      if (r == root)
        for (int i = 0; i < P; i++)
          for (size_t j = 0; j < n; j++) CHECK(all[(size_t)i * n + j] == i * 1000 + (int64_t)j);
      if (r == root)
        for (size_t k = 0; k < n * (size_t)P; k++) all[k] = -(int64_t)k;
      memset(mine, 0, 8 * (n + 1));
      CHECK_OK(tdm_comm_scatter(x->c, all, mine, n, TDM_I64, root));
      for (size_t j = 0; j < n; j++) CHECK(mine[j] == -(int64_t)((size_t)r * n + j));
      free(all);
      free(mine);
    }
  for (int bi = 0; bi < 3; bi++) {
    size_t n = blocks[bi];
    uint8_t *in = malloc(n * (size_t)P + 1), *out = calloc(n * (size_t)P + 1, 1);
    for (int to = 0; to < P; to++)
      for (size_t j = 0; j < n; j++) in[(size_t)to * n + j] = (uint8_t)(r * 16 + to + (int)j);
    CHECK_OK(tdm_comm_alltoall(x->c, in, out, n, TDM_U8));
    for (int from = 0; from < P; from++)
      for (size_t j = 0; j < n; j++) CHECK(out[(size_t)from * n + j] == (uint8_t)(from * 16 + r + (int)j));
    free(in);
    free(out);
  }
}

static atomic_int arrived;

static void run_barrier_p2p_nonblocking(ctx_t *x) {
  int P = x->P, r = x->r;
  for (int round = 1; round <= 5; round++) {
    atomic_fetch_add(&arrived, 1);
    CHECK_OK(tdm_comm_barrier(x->c));
    CHECK(atomic_load(&arrived) >= round * P); /* nobody leaves before everybody came */
    CHECK_OK(tdm_comm_barrier(x->c));           /* and nobody starts the next round early */
  }
  if (P > 1) { /* a ring of messages with tags */
    int32_t out[3] = {r, r * 2, r * 3}, in[3] = {0};
    int next = (r + 1) % P, prev = (r + P - 1) % P;
    if (r % 2 == 0) {
      CHECK_OK(tdm_comm_send(x->c, next, 7, out, sizeof out));
      CHECK_OK(tdm_comm_recv(x->c, prev, 7, in, sizeof in));
    } else {
      CHECK_OK(tdm_comm_recv(x->c, prev, 7, in, sizeof in));
      CHECK_OK(tdm_comm_send(x->c, next, 7, out, sizeof out));
    }
    CHECK(in[0] == prev && in[2] == prev * 3);
  }
  enum { K = 4, N = 2001 };
  float *bufs[K];
  tdm_work_t w[K];
  for (int k = 0; k < K; k++) {
    bufs[k] = malloc(N * sizeof(float));
    for (int j = 0; j < N; j++) bufs[k][j] = (float)(k + r);
    CHECK_OK(tdm_comm_iallreduce(x->c, bufs[k], bufs[k], N, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, &w[k]));
  }
  for (int k = K - 1; k >= 0; k--) CHECK_OK(tdm_work_wait(w[k]));
  for (int k = 0; k < K; k++) {
    CHECK(bufs[k][N - 1] == (float)(k * P + P * (P - 1) / 2));
    free(bufs[k]);
  }
  /* every other collective has a non-blocking form too */
  {
    int64_t rs_in[16], rs_out[2] = {0}, ag_out[16] = {0}, a2a_in[8], a2a_out[8] = {0}, g_out[8] = {0}, red = 0, one = 1;
    for (int i = 0; i < 2 * P; i++) rs_in[i] = r + i;
    for (int i = 0; i < P; i++) a2a_in[i] = r * 10 + i;
    tdm_work_t ws[7];
    CHECK_OK(tdm_comm_ireduce_scatter(x->c, rs_in, rs_out, 2, TDM_I64, TDM_SUM, TDM_ALGO_RING, &ws[0]));
    CHECK_OK(tdm_comm_iallgather(x->c, &one, ag_out, 1, TDM_I64, TDM_ALGO_RING, &ws[1]));
    CHECK_OK(tdm_comm_ialltoall(x->c, a2a_in, a2a_out, 1, TDM_I64, &ws[2]));
    CHECK_OK(tdm_comm_igather(x->c, &one, g_out, 1, TDM_I64, 0, &ws[3]));
    CHECK_OK(tdm_comm_ireduce(x->c, &one, &red, 1, TDM_I64, TDM_SUM, 0, TDM_ALGO_AUTO, &ws[4]));
    CHECK_OK(tdm_comm_ibarrier(x->c, &ws[5]));
    int64_t sc = -1, sc_in[8];
    for (int i = 0; i < P; i++) sc_in[i] = 100 + i;
    CHECK_OK(tdm_comm_iscatter(x->c, sc_in, &sc, 1, TDM_I64, P - 1, &ws[6]));
    for (int k = 0; k < 7; k++) CHECK_OK(tdm_work_wait(ws[k]));
    CHECK(rs_out[0] == (int64_t)P * (P - 1) / 2 + P * (2 * r) && rs_out[1] == rs_out[0] + P);
    CHECK(ag_out[P - 1] == 1 && a2a_out[P - 1] == (P - 1) * 10 + r && sc == 100 + r);
    if (r == 0) CHECK(red == P && g_out[P - 1] == 1);
  }
  /* a blocking call after non-blocking ones keeps its place in line */
  int64_t v = r;
  CHECK_OK(tdm_comm_allreduce(x->c, &v, &v, 1, TDM_I64, TDM_MAX, TDM_ALGO_AUTO));
  CHECK(v == P - 1);
  /* split into even and odd ranks, ordered by descending key */
  tdm_comm_t sub;
  CHECK_OK(tdm_comm_split(x->c, r % 2, -r, &sub));
  if (sub) {
    int n_color = (P + (r % 2 ? 0 : 1)) / 2;
    CHECK(tdm_comm_size(sub) == n_color);
    int32_t s = r;
    CHECK_OK(tdm_comm_allreduce(sub, &s, &s, 1, TDM_I32, TDM_SUM, TDM_ALGO_AUTO));
    int want = 0;
    for (int i = r % 2; i < P; i += 2) want += i;
    CHECK(s == want);
    int32_t top = r; /* rank 0 of the child has the largest old rank (key = -rank) */
    CHECK_OK(tdm_comm_broadcast(sub, &top, 1, TDM_I32, 0, TDM_ALGO_AUTO));
    int biggest = r % 2;
    for (int i = r % 2; i < P; i += 2) biggest = i;
    CHECK(top == biggest);
    tdm_comm_destroy(sub);
  }
  CHECK_OK(tdm_comm_barrier(x->c));
  /* bad arguments fail here, without a message and without failing the communicator */
  CHECK(tdm_comm_broadcast(x->c, &v, 1, TDM_I64, P, TDM_ALGO_AUTO) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_comm_allreduce(x->c, &v, &v, 1, TDM_I64, (tdm_redop)9, TDM_ALGO_AUTO) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_comm_allreduce(x->c, &v, &v, 1, TDM_I64, TDM_SUM, TDM_ALGO_CHAIN) == TDM_ERR_NOT_SUPPORTED);
  CHECK(tdm_comm_status(x->c) == TDM_OK);
}

typedef void (*body_fn)(ctx_t *);
typedef struct {
  ctx_t x;
  void *group;
  body_fn body;
  double timeout;
} thread_arg;

static void *thread_main(void *v) {
  thread_arg *a = v;
  tdm_comm_config cfg = {0};
  cfg.rank = a->x.r;
  cfg.size = a->x.P;
  cfg.transport = TDM_TRANSPORT_THREAD;
  cfg.thread_group = a->group;
  cfg.timeout_s = a->timeout;
  CHECK_OK(tdm_comm_create(&a->x.c, &cfg));
  if (a->x.c) {
    a->body(&a->x);
    tdm_comm_destroy(a->x.c);
  }
  return NULL;
}

static void run_world(int P, body_fn body, double timeout) {
  void *g;
  CHECK_OK(tdm_comm_thread_group_create(&g, P));
  pthread_t th[16];
  thread_arg args[16];
  atomic_store(&arrived, 0);
  for (int r = 0; r < P; r++) {
    args[r] = (thread_arg){{P, r, NULL}, g, body, timeout};
    pthread_create(&th[r], NULL, thread_main, &args[r]);
  }
  for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(g);
}

static const int WORLDS[] = {1, 2, 3, 4, 5, 7, 8};

static void test_allreduce_matrix(void) {
  for (int i = 0; i < 7; i++) run_world(WORLDS[i], run_allreduce, 60);
}
static void test_broadcast_reduce_matrix(void) {
  for (int i = 0; i < 7; i++) run_world(WORLDS[i], run_broadcast_reduce, 60);
}
static void test_scatter_gather_matrix(void) {
  for (int i = 0; i < 7; i++) run_world(WORLDS[i], run_scatter_gather, 60);
}
static void test_barrier_p2p_nonblocking_split(void) {
  for (int i = 0; i < 7; i++) run_world(WORLDS[i], run_barrier_p2p_nonblocking, 60);
}

static void mismatch_body(ctx_t *x) {
  float v[1000] = {0};
  tdm_status st;
  if (x->r == 0) st = tdm_comm_allreduce(x->c, v, v, 1000, TDM_F32, TDM_SUM, TDM_ALGO_RING);
  else st = tdm_comm_broadcast(x->c, v, 1000, TDM_F32, 0, TDM_ALGO_TREE);
  CHECK(st == TDM_ERR_MISMATCH || st == TDM_ERR_REMOTE);
  /* both ranks learn both calls */
  CHECK_MSG(strstr(tdm_last_error(), "all-reduce #1") && strstr(tdm_last_error(), "broadcast #1"), "rank %d: %s", x->r,
            tdm_last_error());
  /* and the communicator stays failed */
  CHECK(tdm_comm_barrier(x->c) == st);
}

static void count_mismatch_body(ctx_t *x) {
  float v[1000] = {0};
  tdm_status st = tdm_comm_allreduce(x->c, v, v, x->r ? 999 : 1000, TDM_F32, TDM_SUM, TDM_ALGO_RING);
  CHECK(st == TDM_ERR_MISMATCH || st == TDM_ERR_REMOTE);
  CHECK_MSG(strstr(tdm_last_error(), "1000 x f32") && strstr(tdm_last_error(), "999 x f32"), "%s", tdm_last_error());
}

static atomic_int timed_out;
static void timeout_body(ctx_t *x) {
  if (x->r != 0) { /* rank 1 never joins the call: it stays, silent, until rank 0 has timed out (had it
                    * destroyed its communicator, rank 0 would hear that at once instead) */
    for (int i = 0; i < 1000 && !atomic_load(&timed_out); i++) usleep(10000);
    return;
  }
  double t0 = tdm_time_now();
  float v = 1;
  CHECK(tdm_comm_allreduce(x->c, &v, &v, 1, TDM_F32, TDM_SUM, TDM_ALGO_AUTO) == TDM_ERR_TIMEOUT);
  CHECK_ERR_HAS("waiting for rank 1");
  CHECK(tdm_time_now() - t0 < 5);
  atomic_store(&timed_out, 1);
}

static void test_mismatch_and_timeout(void) {
  run_world(2, mismatch_body, 10);
  run_world(2, count_mismatch_body, 10);
  atomic_store(&timed_out, 0);
  run_world(2, timeout_body, 0.3);
}

/* ---- every collective x every field of its identity ------------------------------------------ */
static mm_coll g_coll;
static mm_field g_field;

static void mm_body(ctx_t *x) {
  char *s = calloc(1, MM_BUF_BYTES(x->P)), *r = calloc(1, MM_BUF_BYTES(x->P));
  int odd = x->r == x->P - 1;
  tdm_status st = mm_call(x->c, g_coll, g_field, odd, s, r);
  CHECK_MSG(mm_named(st, tdm_last_error(), g_coll, g_field, x->P, 1), "P=%d rank %d, %s with another %s: %s: %s", x->P,
            x->r, mm_coll_names[g_coll], mm_field_names[g_field], tdm_status_str(st), tdm_last_error());
  free(s);
  free(r);
}

static void test_mismatch_matrix(void) {
  int cases = 0;
  for (int P = 2; P <= 3; P++)
    for (int k = 0; k < MM_COLL_COUNT; k++)
      for (int f = 0; f < MM_FIELD_COUNT; f++)
        if (mm_applies((mm_coll)k, (mm_field)f)) {
          g_coll = (mm_coll)k;
          g_field = (mm_field)f;
          run_world(P, mm_body, 10);
          cases++;
        }
  printf("  %d cases, each failed on every rank naming both calls\n", cases);
}

/* A sub-communicator speaks through its parent's transport; its calls are checked all the same. */
static void sub_mismatch_body(ctx_t *x) {
  tdm_comm_t sub;
  CHECK_OK(tdm_comm_split(x->c, x->r / 2, x->r, &sub));
  CHECK_OK(tdm_comm_barrier(x->c)); /* everyone has its sub-communicator before one fails */
  if (!sub) return;
  char s[MM_BUF_BYTES(2)], r[MM_BUF_BYTES(2)];
  memset(s, 0, sizeof s);
  if (x->r >= 2) { /* the second pair disagrees on the count */
    tdm_status st = mm_call(sub, MM_ALLREDUCE, MM_F_COUNT, x->r == 3, s, r);
    CHECK_MSG(mm_named(st, tdm_last_error(), MM_ALLREDUCE, MM_F_COUNT, 2, 1), "rank %d: %s: %s", x->r,
              tdm_status_str(st), tdm_last_error());
  }
  tdm_comm_destroy(sub);
}

static void test_sub_communicator_mismatch(void) { run_world(4, sub_mismatch_body, 10); }

/* ---- TANDEM_ALGO ---------------------------------------------------------------------------
 * What a rank picks from the variable shows against a peer that names the algorithm in its
 * call: the same algorithm works, another one is a size mismatch. */
static tdm_algo g_peer_algo[TDM_COLL_KIND_COUNT];

static void algo_env_body(ctx_t *x) {
  int64_t v[40];
  for (int i = 0; i < 40; i++) v[i] = x->r + i;
  int64_t out[40 * 8];
  tdm_algo a = x->r == 0 ? TDM_ALGO_AUTO : g_peer_algo[TDM_COLL_ALLREDUCE];
  CHECK_MSG(tdm_comm_allreduce(x->c, v, out, 40, TDM_I64, TDM_SUM, a) == TDM_OK, "allreduce: %s", tdm_last_error());
  CHECK(out[39] == 39 * x->P + x->P * (x->P - 1) / 2);
  a = x->r == 0 ? TDM_ALGO_AUTO : g_peer_algo[TDM_COLL_BROADCAST];
  CHECK_MSG(tdm_comm_broadcast(x->c, v, 40, TDM_I64, 0, a) == TDM_OK, "broadcast: %s", tdm_last_error());
  CHECK(v[39] == 39);
  a = x->r == 0 ? TDM_ALGO_AUTO : g_peer_algo[TDM_COLL_REDUCE_SCATTER];
  CHECK_MSG(tdm_comm_reduce_scatter(x->c, out, v, 10, TDM_I64, TDM_SUM, a) == TDM_OK, "reduce-scatter: %s", tdm_last_error());
}

static tdm_status create_one(const char *algo_env, tdm_comm_t *c, void *g, int P) {
  setenv("TANDEM_ALGO", algo_env, 1);
  tdm_comm_config cfg = {0};
  cfg.size = P;
  cfg.transport = TDM_TRANSPORT_THREAD;
  cfg.thread_group = g;
  tdm_status st = tdm_comm_create(c, &cfg);
  unsetenv("TANDEM_ALGO");
  return st;
}

static void test_algo_env(void) {
  /* per collective: all-reduce and reduce-scatter by rhd, broadcast by chain */
  setenv("TANDEM_ALGO", "allreduce=rhd,broadcast=chain,reduce_scatter=ring", 1);
  g_peer_algo[TDM_COLL_ALLREDUCE] = TDM_ALGO_RHD;
  g_peer_algo[TDM_COLL_BROADCAST] = TDM_ALGO_CHAIN;
  g_peer_algo[TDM_COLL_REDUCE_SCATTER] = TDM_ALGO_RING;
  run_world(4, algo_env_body, 10);
  /* a plain name applies where it can: ring runs all-reduce and reduce-scatter, broadcast stays
   * on auto (tree) instead of failing */
  setenv("TANDEM_ALGO", "ring", 1);
  g_peer_algo[TDM_COLL_ALLREDUCE] = TDM_ALGO_RING;
  g_peer_algo[TDM_COLL_BROADCAST] = TDM_ALGO_TREE;
  run_world(2, algo_env_body, 10);
  /* rhd cannot reduce-scatter over 3 ranks: there the plain name leaves it on auto (ring) */
  setenv("TANDEM_ALGO", "rhd", 1);
  g_peer_algo[TDM_COLL_ALLREDUCE] = TDM_ALGO_RHD;
  g_peer_algo[TDM_COLL_REDUCE_SCATTER] = TDM_ALGO_RING;
  run_world(3, algo_env_body, 10);
  unsetenv("TANDEM_ALGO");
  /* bad values fail at creation, naming the value and what is valid */
  void *g;
  tdm_comm_t c = NULL;
  CHECK_OK(tdm_comm_thread_group_create(&g, 1));
  CHECK(create_one("fastest", &c, g, 1) == TDM_ERR_INVALID_ARG && !c);
  CHECK_ERR_HAS("TANDEM_ALGO 'fastest': unknown algorithm 'fastest'; expected one of auto ring rd rhd tree chain direct shm");
  CHECK(create_one("allreduce=rhd,broadcst=chain", &c, g, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("unknown collective 'broadcst'; expected allreduce, broadcast, reduce, reducescatter, allgather");
  CHECK(create_one("broadcast=ring", &c, g, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("ring cannot run broadcast on this 1-rank thread communicator; expected tree, chain, auto");
  CHECK(create_one("allreduce=shm", &c, g, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("shm cannot run allreduce");
  CHECK(create_one("shm", &c, g, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("algorithm 'shm' can run no collective on this 1-rank thread communicator (shm needs the shm transport)");
  CHECK(create_one("ring,rd", &c, g, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("two plain algorithms");
  CHECK(create_one("allreduce=rd,allreduce=ring", &c, g, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("allreduce is named twice");
  CHECK_OK(create_one("tree,allgather=auto,gather=direct", &c, g, 1));
  tdm_comm_destroy(c);
  tdm_comm_thread_group_destroy(g);
}

/* ---- 64-bit sizes --------------------------------------------------------------------------- */
static void test_block_offsets_beyond_2_31(void) {
  /* the one partition every block algorithm (ring, rhd, rd, shm) computes its offsets with */
  const size_t counts[] = {((size_t)1 << 31) + 5, ((size_t)5 << 31) + 3, ((size_t)1 << 40) - 1, 1003};
  const int worlds[] = {2, 3, 4, 7};
  for (int i = 0; i < 4; i++)
    for (int w = 0; w < 4; w++) {
      size_t count = counts[i], cnt[8], off[8];
      int P = worlds[w];
      tdm__blocks(count, P, cnt, off);
      size_t at = 0;
      for (int r = 0; r < P; r++) {
        size_t want_len = count / (size_t)P + ((size_t)r < count % (size_t)P), o, l;
        CHECK_MSG(off[r] == at && cnt[r] == want_len, "count %zu P=%d block %d: offset %zu length %zu, expected %zu %zu",
                  count, P, r, off[r], cnt[r], at, want_len);
        tdm_comm_block(count, P, r, &o, &l);
        CHECK(o == off[r] && l == cnt[r]);
        at += want_len;
      }
      CHECK(at == count);
    }
}

/* ---- reduce-scatter + all-gather == all-reduce, bit for bit ---------------------------------- */
static const size_t RSAG_COUNTS[] = {0, 1, 2, 7, 1003, 700001}; /* 700001 floats: blocks over the 1 MiB chunk */
static tdm_algo g_rs_algo;

static void rsag_body(ctx_t *x) {
  for (int ci = 0; ci < 6; ci++)
    for (int op = TDM_SUM; op <= TDM_AVG; op++) {
      size_t n = RSAG_COUNTS[ci], lo, len;
      float *in = malloc(4 * (n + 1)), *ar = malloc(4 * (n + 1)), *ag = malloc(4 * (n + 1));
      uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)(x->r + 1);
      for (size_t j = 0; j < n; j++) in[j] = (float)((double)(tdm_hash64(h, j) >> 11) / 9007199254740992.0 - 0.5) * 3.0f;
      tdm_comm_block(n, x->P, x->r, &lo, &len);
      CHECK_OK(tdm_comm_allreduce(x->c, in, ar, n, TDM_F32, (tdm_redop)op, g_rs_algo));
      CHECK_OK(tdm_comm_reduce_scatter_blocks(x->c, in, ag + lo, n, TDM_F32, (tdm_redop)op, g_rs_algo));
      /* in place; the halving-doubling all-reduce gathers by recursive doubling */
      CHECK_OK(tdm_comm_allgather_blocks(x->c, ag + lo, ag, n, TDM_F32, g_rs_algo == TDM_ALGO_RHD ? TDM_ALGO_RD : g_rs_algo));
      CHECK_MSG(n == 0 || !memcmp(ar, ag, 4 * n), "P=%d %s %s n=%zu: reduce-scatter + all-gather differs from all-reduce",
                x->P, tdm_algo_name(g_rs_algo), tdm_redop_name((tdm_redop)op), n);
      free(in);
      free(ar);
      free(ag);
    }
}

static void test_reduce_scatter_allgather_equal_allreduce(void) {
  for (int P = 2; P <= 4; P++) {
    g_rs_algo = TDM_ALGO_RING;
    run_world(P, rsag_body, 60);
    if (P != 3) { /* halving-doubling reduce-scatter: powers of two */
      g_rs_algo = TDM_ALGO_RHD;
      run_world(P, rsag_body, 60);
    }
  }
}

/* ---- rank order: the same bits whatever the partition ----------------------------------------
 * The direct all-reduce, and the direct reduce-scatter over an uneven partition (some parts empty)
 * followed by an all-gather of it, give every element as ((x0 + x1) + x2) + ... in rank order,
 * computed here by hand: the sums the parallelism engines rely on. Ranks that split a buffer
 * differently fail with a mismatch naming the partitions. */
static float rank_input(int r, size_t j) {
  return (float)((double)(tdm_hash64(0x51ull * (uint64_t)(r + 1), j) >> 11) / 9007199254740992.0 - 0.5) * 3.0f;
}

static void rank_order_body(ctx_t *x) {
  static const size_t counts[] = {0, 1, 5, 1003, 300001};
  for (int ci = 0; ci < 5; ci++)
    for (int op = TDM_SUM; op <= TDM_AVG; op++) {
      size_t n = counts[ci];
      float *in = malloc(4 * (n + 1)), *ar = malloc(4 * (n + 1)), *rs = malloc(4 * (n + 1)), *want = malloc(4 * (n + 1));
      for (size_t j = 0; j < n; j++) {
        in[j] = rank_input(x->r, j);
        volatile float term = rank_input(0, j); /* stored: no multiply-add contracted into the sum */
        float acc = term;
        for (int q = 1; q < x->P; q++) term = rank_input(q, j), acc += term;
        want[j] = op == TDM_AVG ? acc / (float)x->P : acc;
      }
      size_t parts[8], at = 0;
      for (int q = 0; q < x->P; q++) { /* uneven: rank 1 gets nothing, the last what is left */
        parts[q] = q == 1 || q == x->P - 1 ? 0 : (n / 3 < n - at ? n / 3 : n - at);
        at += parts[q];
      }
      parts[x->P - 1] += n - at;
      size_t off = 0;
      for (int q = 0; q < x->r; q++) off += parts[q];
      CHECK_OK(tdm_comm_allreduce(x->c, in, ar, n, TDM_F32, (tdm_redop)op, TDM_ALGO_DIRECT));
      CHECK_OK(tdm_comm_reduce_scatter_v(x->c, in, rs + off, n, parts, TDM_F32, (tdm_redop)op, TDM_ALGO_DIRECT));
      CHECK_OK(tdm_comm_allgather_v(x->c, rs + off, rs, n, parts, TDM_F32, TDM_ALGO_DIRECT));
      CHECK_MSG(n == 0 || !memcmp(ar, want, 4 * n), "P=%d %s n=%zu: the direct all-reduce is not the rank-order sum", x->P,
                tdm_redop_name((tdm_redop)op), n);
      CHECK_MSG(n == 0 || !memcmp(rs, want, 4 * n), "P=%d %s n=%zu: reduce-scatter_v + all-gather_v is not the rank-order sum",
                x->P, tdm_redop_name((tdm_redop)op), n);
      CHECK_OK(tdm_comm_reduce_scatter_v(x->c, in, rs + off, n, parts, TDM_F32, (tdm_redop)op, TDM_ALGO_RING)); /* any partition */
      free(in), free(ar), free(rs), free(want);
    }
  /* a partition that differs between ranks (after a barrier: the rank that finds the mismatch
   * fails the communicator, which must not catch a slower rank still in the ring above) */
  CHECK_OK(tdm_comm_barrier(x->c));
  float v[10] = {0}, o[10];
  size_t mine[8] = {0};
  mine[0] = x->r == 0 ? 10 : 6, mine[1] = 10 - mine[0];
  tdm_status st = tdm_comm_reduce_scatter_v(x->c, v, o, 10, mine, TDM_F32, TDM_SUM, TDM_ALGO_DIRECT);
  CHECK(st == TDM_ERR_MISMATCH || st == TDM_ERR_REMOTE);
  CHECK_MSG(strstr(tdm_last_error(), "parts"), "rank %d: %s", x->r, tdm_last_error());
}

static void parts_args_body(ctx_t *x) {
  float v[4] = {0};
  size_t bad[8] = {3, 3};
  CHECK(tdm_comm_allgather_v(x->c, v, v, 4, bad, TDM_F32, TDM_ALGO_DIRECT) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("more than the 4 elements");
  CHECK(tdm_comm_reduce_scatter_v(x->c, v, v, 4, bad, TDM_F32, TDM_SUM, TDM_ALGO_RHD) == TDM_ERR_INVALID_ARG);
}

static void test_rank_order_any_partition(void) {
  for (int P = 2; P <= 4; P++) run_world(P, rank_order_body, 60);
  run_world(2, parts_args_body, 10);
}

/* ---- shared buffers over the thread transport ----------------------------------------------------
 * The operations against the rank-order sum (the same bits as the direct collectives), with even
 * and uneven pieces; a buffer is refused on a sub-communicator (a clear error, the same on every
 * rank); a span that differs between ranks is named on every rank. */
static void shared_body(ctx_t *x) {
  enum { N = 40007 };
  tdm_shared_t s = NULL;
  CHECK_OK(tdm_shared_create(x->c, N, &s));
  if (!s) return;
  CHECK(tdm_shared_floats(s) == N);
  float *mine = tdm_shared_mine(s), *want = malloc(4 * N), *ar = malloc(4 * N);
  for (int op = 0; op < 2; op++) {
    for (size_t j = 0; j < N; j++) {
      volatile float term = rank_input(0, j); /* stored: no multiply-add contracted into the sum */
      float acc = term;
      for (int q = 1; q < x->P; q++) term = rank_input(q, j), acc += term;
      want[j] = op ? acc / (float)x->P : acc;
      mine[j] = rank_input(x->r, j);
    }
    CHECK_OK(tdm_shared_allreduce(s, 0, N, op));
    CHECK_MSG(!memcmp(mine, want, 4 * N), "P=%d: the shared all-reduce (%s) is not the rank-order sum", x->P,
              op ? "average" : "sum");
    memcpy(ar, mine, 4 * N);
    CHECK_OK(tdm_comm_barrier(x->c)); /* everyone has its copy before the areas are rewritten */
    for (size_t j = 0; j < N; j++) mine[j] = rank_input(x->r, j);
    int64_t cut[9];
    cut[0] = 5; /* uneven: piece 1 empty, the last what is left */
    for (int q = 0; q < x->P; q++) cut[q + 1] = q == x->P - 1 ? N - 3 : cut[q] + (q == 1 ? 0 : 7001);
    CHECK_OK(tdm_comm_barrier(x->c));
    CHECK_OK(tdm_shared_reduce_scatter(s, 5, N - 3, cut, op));
    CHECK_MSG(!memcmp(mine + cut[x->r], want + cut[x->r], 4 * (size_t)(cut[x->r + 1] - cut[x->r])),
              "P=%d rank %d: my piece of the shared reduce-scatter is not the rank-order sum", x->P, x->r);
    CHECK_OK(tdm_shared_allgather(s, 5, N - 3, cut));
    CHECK_MSG(!memcmp(mine + 5, ar + 5, 4 * (N - 8)), "P=%d: shared reduce-scatter + all-gather differs from the all-reduce", x->P);
    CHECK_MSG(mine[0] == rank_input(x->r, 0) && mine[N - 1] == rank_input(x->r, N - 1),
              "P=%d: the operations wrote outside [5, N-3)", x->P);
    CHECK_OK(tdm_comm_barrier(x->c));
  }
  int64_t bad[9] = {0, 10};
  for (int q = 2; q <= x->P; q++) bad[q] = 5;
  CHECK(tdm_shared_reduce_scatter(s, 0, 5, bad, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS(x->P > 1 ? "piece 1 ends at 5 before it starts at 10" : "the pieces run from 0 to 10; expected them to cover [0, 5)");
  CHECK(tdm_shared_allreduce(s, 0, N + 1, 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("do not lie within");
  if (x->P > 1) {
    tdm_comm_t sub = NULL;
    CHECK_OK(tdm_comm_split(x->c, 0, x->r, &sub));
    tdm_shared_t t = NULL;
    CHECK(tdm_shared_create(sub, 8, &t) == TDM_ERR_NOT_SUPPORTED && !t);
    CHECK_ERR_HAS("sub-communicator");
    tdm_comm_destroy(sub);
    tdm_status st = tdm_shared_allreduce(s, 0, x->r == x->P - 1 ? 99 : 100, 1);
    CHECK(st == TDM_ERR_MISMATCH || st == TDM_ERR_REMOTE);
    CHECK_MSG(strstr(tdm_last_error(), "elements [0, 100)") && strstr(tdm_last_error(), "elements [0, 99)"), "rank %d: %s", x->r,
              tdm_last_error());
  }
  tdm_shared_destroy(s);
  free(want), free(ar);
}

static void test_shared_buffers_threads(void) {
  for (int P = 1; P <= 4; P++) run_world(P, shared_body, 30);
}

/* ---- non-blocking handles abandoned on an error path ------------------------------------------
 * Rank 1 aborts while rank 0 has an all-reduce queued that it never waits for, as a training loop
 * that fails mid-step does; destroying the communicator frees it (the sanitizer build's leak check
 * fails this test otherwise). */
static void abandoned_body(ctx_t *x) {
  float v[64] = {0};
  if (x->r == 1) {
    tdm_comm_abort(x->c);
    return;
  }
  tdm_work_t w, w2;
  CHECK_OK(tdm_comm_iallreduce(x->c, v, v, 64, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, &w));
  CHECK_OK(tdm_comm_iallreduce(x->c, v, v, 64, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, &w2));
  CHECK(tdm_work_wait(w2) != TDM_OK); /* w is never waited for */
}

static void test_abandoned_handles_freed(void) { run_world(2, abandoned_body, 5); }

/* A failure relayed over threads names where it began (tdm_last_error_origin), as over tcp and shm:
 * rank 2 aborts with a reason of its own; the others' next all-reduce fails naming rank 2. */
static void origin_body(ctx_t *x) {
  float v[8] = {0};
  if (x->r == 2) {
    tdm_comm_abort_why(x->c, TDM_ERR_IO, "rank 2's disk is full");
    CHECK(tdm_last_error_origin() == -1); /* its own */
    return;
  }
  CHECK(tdm_comm_allreduce(x->c, v, v, 8, TDM_F32, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK);
  CHECK_MSG(tdm_last_error_origin() == 2 && strstr(tdm_last_error(), "disk is full"), "rank %d: origin %d: %s", x->r,
            tdm_last_error_origin(), tdm_last_error());
}

static void test_relayed_origin_threads(void) { run_world(3, origin_body, 10); }

/* A non-blocking call given a NULL buffer is refused at the call, not when its handle is waited
 * for, and leaves the communicator as it was. */
static void nb_null_body(ctx_t *x) {
  float v[4] = {1, 2, 3, 4};
  tdm_work_t w = NULL;
  CHECK(tdm_comm_iallreduce(x->c, NULL, v, 4, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, &w) == TDM_ERR_INVALID_ARG && !w);
  CHECK_ERR_HAS("non-blocking call: sendbuf is NULL with a non-zero count");
  CHECK(tdm_comm_ibroadcast(x->c, NULL, 4, TDM_F32, 0, TDM_ALGO_AUTO, &w) == TDM_ERR_INVALID_ARG && !w);
  CHECK_ERR_HAS("the receive buffer is NULL");
  CHECK(tdm_comm_iallreduce(x->c, v, v, 4, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("the handle's address is NULL");
  CHECK_OK(tdm_comm_iallreduce(x->c, v, v, 4, TDM_F32, TDM_SUM, TDM_ALGO_AUTO, &w));
  CHECK_OK(tdm_work_wait(w));
  CHECK(v[0] == 2 && v[3] == 8);
}

static void test_nonblocking_null_refused(void) { run_world(2, nb_null_body, 10); }

/* ---- the environment's errors say what is wrong -------------------------------------------------- */
static void test_env_errors(void) {
  static const char *vars[] = {"RANK", "WORLD_SIZE", "MASTER_PORT", "TANDEM_TIMEOUT", "LOCAL_WORLD_SIZE", NULL};
  struct {
    const char *var, *value, *message;
  } cases[] = {
      {"RANK", "-1", "RANK is '-1'; expected this process's rank, an integer 0..1 (WORLD_SIZE is 2)"},
      {"RANK", "2", "RANK is '2'; expected this process's rank, an integer 0..1 (WORLD_SIZE is 2)"},
      {"RANK", "one", "RANK is 'one'; expected"},
      {"WORLD_SIZE", "0", "WORLD_SIZE is '0'; expected the number of ranks, an integer 1..1048576"},
      {"WORLD_SIZE", "2x", "WORLD_SIZE is '2x'"},
      {"MASTER_PORT", "70000", "MASTER_PORT is '70000'; expected a port number, 1..65535"},
      {"TANDEM_TIMEOUT", "10abc", "TANDEM_TIMEOUT is '10abc'; expected a positive number of seconds"},
      {"TANDEM_TIMEOUT", "-5", "TANDEM_TIMEOUT is '-5'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv(cases[i].var, cases[i].value, 1);
    tdm_comm_config cfg;
    CHECK(tdm_comm_config_from_env(&cfg) == TDM_ERR_INVALID_ARG);
    CHECK_ERR_HAS(cases[i].message);
    for (const char **v = vars; *v; v++) unsetenv(*v);
  }
  setenv("RANK", "1", 1); /* a rank but no world size */
  tdm_comm_config cfg;
  CHECK(tdm_comm_config_from_env(&cfg) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("RANK is '1' but WORLD_SIZE (or an MPI/Slurm equivalent) is not set");
  unsetenv("RANK");
  setenv("WORLD_SIZE", "2", 1); /* a world size but no rank: every process would be rank 0 and wait */
  CHECK(tdm_comm_config_from_env(&cfg) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("WORLD_SIZE is 2 but RANK (or an MPI/Slurm equivalent) is not set");
  setenv("WORLD_SIZE", "1", 1); /* one rank needs none */
  CHECK_OK(tdm_comm_config_from_env(&cfg));
  unsetenv("WORLD_SIZE");
  /* tdm_comm_create reads TANDEM_TIMEOUT (when the config has none) and LOCAL_WORLD_SIZE with
   * the same strict parsers */
  void *g;
  tdm_comm_t c = NULL;
  CHECK_OK(tdm_comm_thread_group_create(&g, 1));
  cfg = (tdm_comm_config){.size = 1, .transport = TDM_TRANSPORT_THREAD, .thread_group = g};
  setenv("TANDEM_TIMEOUT", "3s", 1);
  CHECK(tdm_comm_create(&c, &cfg) == TDM_ERR_INVALID_ARG && !c);
  CHECK_ERR_HAS("TANDEM_TIMEOUT is '3s'");
  unsetenv("TANDEM_TIMEOUT");
  setenv("LOCAL_WORLD_SIZE", "two", 1);
  CHECK(tdm_comm_create(&c, &cfg) == TDM_ERR_INVALID_ARG && !c);
  CHECK_ERR_HAS("LOCAL_WORLD_SIZE is 'two'; expected the number of ranks on this node");
  unsetenv("LOCAL_WORLD_SIZE");
  setenv("TANDEM_TIMEOUT", "2.5", 1);
  CHECK_OK(tdm_comm_create(&c, &cfg));
  unsetenv("TANDEM_TIMEOUT");
  tdm_comm_destroy(c);
  tdm_comm_thread_group_destroy(g);
  /* data parallelism's switches are 0 or 1 */
  tdm_params *p;
  int64_t shape[1] = {4};
  CHECK_OK(tdm_params_create(&p));
  tdm_tensor *w;
  CHECK_OK(tdm_params_declare(p, "w", 1, shape, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &w));
  CHECK_OK(tdm_params_finalize(p, 1));
  CHECK_OK(tdm_comm_thread_group_create(&g, 1));
  cfg.thread_group = g;
  CHECK_OK(tdm_comm_create(&c, &cfg));
  tdm_dp *dp = NULL;
  setenv("TANDEM_DP_ZERO_COPY", "no", 1);
  CHECK(tdm_dp_create(&dp, c, p, NULL) == TDM_ERR_INVALID_ARG && !dp);
  CHECK_ERR_HAS("TANDEM_DP_ZERO_COPY is 'no'; expected 0 or 1");
  unsetenv("TANDEM_DP_ZERO_COPY");
  setenv("TANDEM_DP_INLINE", "yes", 1);
  CHECK(tdm_dp_create(&dp, c, p, NULL) == TDM_ERR_INVALID_ARG && !dp);
  CHECK_ERR_HAS("TANDEM_DP_INLINE is 'yes'; expected 0 or 1");
  unsetenv("TANDEM_DP_INLINE");
  tdm_comm_destroy(c);
  tdm_comm_thread_group_destroy(g);
  tdm_params_destroy(p);
}

static double emu_elapsed[2];
static void emulated_body(ctx_t *x) {
  double t0 = tdm_time_now();
  for (int i = 0; i < 10; i++) CHECK_OK(tdm_comm_barrier(x->c));
  double t1 = tdm_time_now();
  static char big[100000];
  if (x->r == 0) CHECK_OK(tdm_comm_send(x->c, 1, 0, big, sizeof big));
  else CHECK_OK(tdm_comm_recv(x->c, 0, 0, big, sizeof big));
  if (x->r == 0) { /* the sender's clock: it must have waited out the emulated link */
    emu_elapsed[0] = t1 - t0;
    emu_elapsed[1] = tdm_time_now() - t1;
  }
  int64_t v = x->r + 1;
  CHECK_OK(tdm_comm_allreduce(x->c, &v, &v, 1, TDM_I64, TDM_SUM, TDM_ALGO_AUTO));
  CHECK(v == 3);
}

/* A send the emulated link would take longer than the timeout for fails at once, naming the link
 * (it slept out the whole time before, past any timeout); the receiver hears why. */
static double slow_link_elapsed;
static void slow_link_body(ctx_t *x) {
  static char big[100000];
  double t0 = tdm_time_now();
  tdm_status st = x->r == 0 ? tdm_comm_send(x->c, 1, 0, big, sizeof big) : tdm_comm_recv(x->c, 0, 0, big, sizeof big);
  CHECK(st != TDM_OK);
  if (x->r == 0) {
    slow_link_elapsed = tdm_time_now() - t0;
    CHECK(st == TDM_ERR_TIMEOUT);
    CHECK_ERR_HAS("sending 100000 bytes over the emulated link (TANDEM_NET_EMULATE");
  }
}

static void test_network_emulation(void) {
  setenv("TANDEM_NET_EMULATE", "5ms,8mbps", 1); /* 1 MB/s */
  run_world(2, emulated_body, 30);
  unsetenv("TANDEM_NET_EMULATE");
  printf("  10 barriers: %.1f ms (>= 50), 100 kB: %.1f ms (>= 105)\n", emu_elapsed[0] * 1e3, emu_elapsed[1] * 1e3);
  CHECK(emu_elapsed[0] >= 0.050);
  CHECK(emu_elapsed[1] >= 0.105);
  double lat, bw;
  CHECK_OK(tdm__parse_net_emulate("100us,1gbps", &lat, &bw));
  CHECK_NEAR(lat, 1e-4, 1e-12);
  CHECK_NEAR(bw, 1.25e8, 1);
  CHECK_OK(tdm__parse_net_emulate("2.5GB/s", &lat, &bw));
  CHECK(lat == 0 && bw == 2.5e9);
  CHECK(tdm__parse_net_emulate("fast", &lat, &bw) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("TANDEM_NET_EMULATE='fast'");
  /* no real network: an overflow, infinity, no bandwidth, a latency past 10 s (it meant a hang, or
   * silently no emulation at all) */
  const char *bad[][2] = {{"1e30us", "expected at most 10 s"},      {"infus", "expected latency and/or bandwidth"},
                          {"nanms", "expected latency and/or bandwidth"}, {"100us,0gbps", "expected at least 1kbps"},
                          {"1e-9kbps", "expected at least 1kbps"},  {"20s", "a latency of 20 s; expected at most 10 s"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_MSG(tdm__parse_net_emulate(bad[i][0], &lat, &bw) == TDM_ERR_INVALID_ARG, "'%s' was accepted", bad[i][0]);
    CHECK_ERR_HAS(bad[i][1]);
  }
  setenv("TANDEM_NET_EMULATE", "10kbps", 1); /* 100 kB: 80 s */
  run_world(2, slow_link_body, 2);            /* a timeout of 2 s */
  unsetenv("TANDEM_NET_EMULATE");
  CHECK_MSG(slow_link_elapsed < 1.5, "the sender failed after %.2f s", slow_link_elapsed);
}

static void test_reduce_local_and_names(void) {
  uint16_t a[2] = {tdm_f32_to_bf16(1.5f), tdm_f32_to_bf16(-2.0f)}, b[2] = {tdm_f32_to_bf16(2.0f), tdm_f32_to_bf16(3.0f)};
  CHECK_OK(tdm_reduce_local(a, b, 2, TDM_BF16, TDM_PROD));
  CHECK(tdm_bf16_to_f32(a[0]) == 3.0f && tdm_bf16_to_f32(a[1]) == -6.0f);
  tdm_algo al;
  CHECK_OK(tdm_algo_parse("rhd", &al));
  CHECK(al == TDM_ALGO_RHD);
  CHECK(tdm_algo_parse("fastest", &al) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("ring rd rhd");
}

TDM_TEST_MAIN(T(test_reduce_local_and_names), T(test_allreduce_matrix), T(test_broadcast_reduce_matrix),
              T(test_scatter_gather_matrix), T(test_barrier_p2p_nonblocking_split), T(test_mismatch_and_timeout),
              T(test_mismatch_matrix), T(test_sub_communicator_mismatch), T(test_algo_env),
              T(test_block_offsets_beyond_2_31), T(test_reduce_scatter_allgather_equal_allreduce), T(test_rank_order_any_partition), T(test_shared_buffers_threads),
              T(test_abandoned_handles_freed), T(test_relayed_origin_threads), T(test_nonblocking_null_refused), T(test_env_errors), T(test_network_emulation))
