/* Device collectives (tandem/comm_device.h) on a real GPU. Exit 77 (skipped, saying why) without one.
 *
 *   test_nccl            1 rank: NCCL's collectives against closed forms, NCCL equals staging bit for
 *                        bit, bad input named, the watchdog aborting a collective that never completes
 *   test_nccl --ranks    one rank of `tandem run -n P` (tests/cuda/test_nccl_ranks.sh), all on one GPU:
 *                        AUTO picks staging; every staged collective equals the CPU collective bit for
 *                        bit; a mismatched count and a rank that never arrives are named
 *   test_nccl --probe    exit 0 when a GPU is usable, 77 (and why) when not */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/nccl_impl.h"
#include "tdm_test.h"

#define CUDA_OK(x)                                                                                      \
  do {                                                                                                  \
    cudaError_t e_ = (x);                                                                               \
    if (e_ != cudaSuccess) {                                                                            \
      fprintf(stderr, "  FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));        \
      exit(1);                                                                                          \
    }                                                                                                   \
  } while (0)

/* Rank r's value i: not representable sums, so the order of summation shows in the bits. */
static float value(int r, size_t i) { return sinf(0.37f * (float)i + (float)r) * (1.0f + 0.1f * (float)r) + 1e-3f * (float)r; }

/* n values of rank r in dtype dt (host memory, malloc'd). */
static void *host_data(int r, size_t n, tdm_dtype dt) {
  float *f = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) f[i] = value(r, i);
  if (dt == TDM_F32) return f;
  void *b = malloc(n * 2);
  tdm_convert(b, TDM_BF16, f, TDM_F32, (int64_t)n);
  free(f);
  return b;
}

static void *to_device(const void *h, size_t bytes) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
  if (h && bytes) CUDA_OK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
  return p;
}

static void *from_device(const void *p, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  if (bytes) CUDA_OK(cudaMemcpy(h, p, bytes, cudaMemcpyDeviceToHost));
  return h;
}

static tdm_comm_t one_rank(void) {
  tdm_comm_config cfg = {.rank = 0, .size = 1, .transport = TDM_TRANSPORT_TCP, .timeout_s = 30};
  tdm_comm_t c = NULL;
  CHECK_OK(tdm_comm_create(&c, &cfg));
  return c;
}

static tdm_dcomm_t dcomm(tdm_comm_t host, tdm_dcomm_mode mode, double timeout) {
  tdm_dcomm_config cfg = tdm_dcomm_config_default();
  cfg.mode = mode, cfg.timeout_s = timeout;
  tdm_dcomm_t d = NULL;
  CHECK_OK(tdm_dcomm_create(host, &cfg, &d));
  if (d) CHECK(tdm_dcomm_mode_of(d) == mode);
  return d;
}

static const tdm_dtype dtypes[2] = {TDM_F32, TDM_BF16};

/* ---- 1 rank ------------------------------------------------------------------------------------ */
/* On 1 rank every collective is the identity (avg divides by 1): out-of-place and in place, for
 * every kind, through NCCL. 100,003 elements, not a multiple of NCCL's blocks: with NCCL 2.28.3 a
 * one-rank f32 average left its last elements unwritten (NVIDIA/nccl#1950, fixed in 2.29.7), which
 * this case caught; tandem now runs a one-rank average as the sum. */
static void test_nccl_one_rank(void) {
  tdm_comm_t host = one_rank();
  tdm_dcomm_t d = dcomm(host, TDM_DCOMM_NCCL, 30);
  if (!d) return;
  CHECK(tdm_dcomm_size(d) == 1 && tdm_dcomm_rank(d) == 0);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  for (int k = 0; k < 2; k++) {
    tdm_dtype dt = dtypes[k];
    size_t n = 100003, bytes = n * tdm_dtype_size(dt);
    void *h = host_data(0, n, dt), *src = to_device(h, bytes), *dst = to_device(NULL, bytes);
    for (int kind = 0; kind < 5; kind++) {
      CUDA_OK(cudaMemset(dst, 0, bytes));
      tdm_status st = kind == 0   ? tdm_dcomm_allreduce(d, src, dst, n, dt, TDM_SUM, s)
                      : kind == 1 ? tdm_dcomm_allreduce(d, src, dst, n, dt, TDM_AVG, s)
                      : kind == 2 ? tdm_dcomm_reduce_scatter(d, src, dst, n, dt, TDM_SUM, s)
                      : kind == 3 ? tdm_dcomm_allgather(d, src, dst, n, dt, s)
                                  : (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), tdm_dcomm_broadcast(d, dst, n, dt, 0, s));
      CHECK_OK(st);
      CHECK_OK(tdm_dcomm_synchronize(d, s));
      void *got = from_device(dst, bytes);
      CHECK_MSG(memcmp(got, h, bytes) == 0, "%s, kind %d: 1-rank result differs from the input", tdm_dtype_name(dt), kind);
      free(got);
    }
    CHECK_OK(tdm_dcomm_allreduce(d, src, src, n, dt, TDM_SUM, s)); /* in place */
    CHECK_OK(tdm_dcomm_synchronize(d, s));
    void *got = from_device(src, bytes);
    CHECK(memcmp(got, h, bytes) == 0);
    free(got), free(h);
    cudaFree(src), cudaFree(dst);
  }
  cudaStreamDestroy(s);
  tdm_dcomm_destroy(d);
  tdm_comm_destroy(host);
}

/* The same data through NCCL and through staging give the same bits (1 rank). */
static void test_nccl_equals_stage(void) {
  tdm_comm_t host = one_rank();
  tdm_dcomm_t a = dcomm(host, TDM_DCOMM_NCCL, 30), b = dcomm(host, TDM_DCOMM_STAGE, 30);
  if (!a || !b) goto out;
  for (int k = 0; k < 2; k++) {
    tdm_dtype dt = dtypes[k];
    size_t n = (3u << 20) + 5, bytes = n * tdm_dtype_size(dt); /* beyond the first staging buffer */
    void *h = host_data(0, n, dt), *src = to_device(h, bytes), *x = to_device(NULL, bytes), *y = to_device(NULL, bytes);
    for (int op = TDM_SUM; op <= TDM_AVG; op++) {
      CUDA_OK(cudaMemset(x, 0, bytes)); /* so an element left unwritten shows */
      CUDA_OK(cudaMemset(y, 0, bytes));
      CHECK_OK(tdm_dcomm_allreduce(a, src, x, n, dt, (tdm_redop)op, NULL));
      CHECK_OK(tdm_dcomm_allreduce(b, src, y, n, dt, (tdm_redop)op, NULL));
      CHECK_OK(tdm_dcomm_synchronize(a, NULL));
      CHECK_OK(tdm_dcomm_synchronize(b, NULL));
      void *gx = from_device(x, bytes), *gy = from_device(y, bytes);
      CHECK_MSG(memcmp(gx, gy, bytes) == 0 && memcmp(gx, h, bytes) == 0, "%s %s: NCCL and staging differ",
                tdm_dtype_name(dt), tdm_redop_name((tdm_redop)op));
      free(gx), free(gy);
    }
    free(h);
    cudaFree(src), cudaFree(x), cudaFree(y);
  }
out:
  tdm_dcomm_destroy(a);
  tdm_dcomm_destroy(b);
  tdm_comm_destroy(host);
}

static void test_bad_input(void) {
  tdm_comm_t host = one_rank();
  tdm_dcomm_t d = dcomm(host, TDM_DCOMM_NCCL, 30);
  if (!d) return;
  void *p = to_device(NULL, 64);
  CHECK(tdm_dcomm_allreduce(d, p, p, 4, TDM_F64, TDM_SUM, NULL) == TDM_ERR_NOT_SUPPORTED);
  CHECK_ERR_HAS("dtype f64; expected f32 or bf16");
  CHECK(tdm_dcomm_allreduce(d, NULL, p, 4, TDM_F32, TDM_SUM, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("a buffer is NULL");
  CHECK(tdm_dcomm_broadcast(d, p, 4, TDM_F32, 1, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("root 1 is not a rank");
  CHECK(tdm_dcomm_allreduce(d, p, p, 4, TDM_F32, (tdm_redop)9, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("op 9 is unknown");
  CHECK(tdm_dcomm_status(d) == TDM_OK); /* bad arguments do not fail the communicator */
  CHECK_OK(tdm_dcomm_allreduce(d, p, p, 4, TDM_F32, TDM_SUM, NULL));
  CHECK_OK(tdm_dcomm_synchronize(d, NULL));
  tdm_dcomm_destroy(d);
  cudaFree(p);

  tdm_dcomm_config cfg = tdm_dcomm_config_default();
  cfg.device = 99;
  CHECK(tdm_dcomm_create(host, &cfg, &d) == TDM_ERR_INVALID_ARG && d == NULL);
  CHECK_ERR_HAS("device 99 does not exist");
  cfg = tdm_dcomm_config_default();
  setenv("TANDEM_DEVICE_COLL", "gloo", 1);
  CHECK(tdm_dcomm_create(host, &cfg, &d) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("TANDEM_DEVICE_COLL='gloo': expected auto, nccl or stage");
  unsetenv("TANDEM_DEVICE_COLL");
  setenv("TANDEM_DEVICE_TIMEOUT", "soon", 1);
  CHECK(tdm_dcomm_create(host, &cfg, &d) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("TANDEM_DEVICE_TIMEOUT='soon'");
  setenv("TANDEM_DEVICE_TIMEOUT", "7.5", 1);
  CHECK_OK(tdm_dcomm_create(host, &cfg, &d));
  CHECK(d && tdm_dcomm_timeout(d) == 7.5);
  CHECK(d && tdm_dcomm_mode_of(d) == TDM_DCOMM_NCCL); /* AUTO on one rank: nobody shares its GPU */
  unsetenv("TANDEM_DEVICE_TIMEOUT");
  tdm_dcomm_destroy(d);
  setenv("TANDEM_DEVICE_COLL", "stage", 1);
  CHECK_OK(tdm_dcomm_create(host, &cfg, &d));
  CHECK(d && tdm_dcomm_mode_of(d) == TDM_DCOMM_STAGE);
  unsetenv("TANDEM_DEVICE_COLL");
  tdm_dcomm_destroy(d);
  tdm_comm_destroy(host);
}

/* The watchdog: a collective whose completion never comes (a host function holds its stream, as a
 * peer that never joins would hold NCCL's kernel) is aborted at the timeout, in about a second, and
 * named; every later call fails alike; destroy does not hang. NCCL's own kernels cannot be made to
 * hang with one rank, so the stall is injected after the collective (test hook). */
static void test_watchdog(void) {
  tdm_comm_t host = one_rank();
  tdm_dcomm_t d = dcomm(host, TDM_DCOMM_NCCL, 1.0);
  if (!d) return;
  size_t n = 1 << 16;
  void *p = to_device(NULL, n * 4);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  CHECK_OK(tdm_dcomm_allreduce(d, p, p, n, TDM_F32, TDM_SUM, s)); /* a healthy one first */
  CHECK_OK(tdm_dcomm_synchronize(d, s));
  tdm__dcomm_inject_stall(d);
  double t0 = tdm_time_now();
  CHECK_OK(tdm_dcomm_allreduce(d, p, p, n, TDM_F32, TDM_SUM, s)); /* enqueued: the failure comes later */
  tdm_status st = tdm_dcomm_synchronize(d, s);
  double took = tdm_time_now() - t0;
  CHECK_MSG(st == TDM_ERR_TIMEOUT, "synchronize returned %s: %s", tdm_status_str(st), tdm_last_error());
  CHECK_ERR_HAS("device all-reduce #2 (65536 x f32, sum) did not complete within 1 s");
  CHECK_ERR_HAS("the NCCL communicator was aborted");
  CHECK_ERR_HAS("the stall is on this rank");
  CHECK_MSG(took >= 0.9 && took < 3.0, "the watchdog took %.2f s for a 1 s timeout", took);
  printf("     watchdog: aborted after %.2f s (timeout 1 s): %s\n", took, tdm_last_error());
  CHECK(tdm_dcomm_allreduce(d, p, p, n, TDM_F32, TDM_SUM, s) == TDM_ERR_TIMEOUT);
  CHECK_ERR_HAS("did not complete within 1 s");
  CHECK(tdm_dcomm_status(d) == TDM_ERR_TIMEOUT);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess); /* the stream drained: buffers are free again */
  t0 = tdm_time_now();
  tdm_dcomm_destroy(d);
  CHECK_MSG(tdm_time_now() - t0 < 2.0, "destroy took %.2f s", tdm_time_now() - t0);
  cudaStreamDestroy(s);
  cudaFree(p);
  /* a fresh communicator on the same GPU works */
  d = dcomm(host, TDM_DCOMM_NCCL, 30);
  float one = 1.5f, *q = to_device(&one, 4);
  CHECK_OK(tdm_dcomm_allreduce(d, q, q, 1, TDM_F32, TDM_SUM, NULL));
  CHECK_OK(tdm_dcomm_synchronize(d, NULL));
  float *g = from_device(q, 4);
  CHECK(*g == 1.5f);
  free(g), cudaFree(q);
  tdm_dcomm_destroy(d);
  tdm_comm_destroy(host);
}

/* ---- several ranks on one GPU (under tandem run) ------------------------------------------------ */
static int ranks_main(void) {
  tdm_comm_t host = NULL;
  if (tdm_comm_create_from_env(&host) != TDM_OK) {
    fprintf(stderr, "test_nccl --ranks: %s\n", tdm_last_error());
    return 1;
  }
  int r = tdm_comm_rank(host), P = tdm_comm_size(host);
  tdm_dcomm_t d = NULL;
  tdm_dcomm_config cfg = tdm_dcomm_config_default();
  cfg.timeout_s = 2.0;
  /* NCCL asked for where ranks share a GPU: refused on every rank, naming them */
  cfg.mode = TDM_DCOMM_NCCL;
  tdm_status st = tdm_dcomm_create(host, &cfg, &d);
  CHECK_MSG(st == TDM_ERR_NOT_SUPPORTED && d == NULL, "rank %d: NCCL on a shared GPU gave %s", r, tdm_status_str(st));
  CHECK_ERR_HAS("ranks 0 and 1 share GPU");
  CHECK_ERR_HAS("TANDEM_DEVICE_COLL=stage");
  if (r == 0) printf("     nccl on a shared GPU: %s\n", tdm_last_error());
  cfg.mode = TDM_DCOMM_AUTO;
  CHECK_OK(tdm_dcomm_create(host, &cfg, &d));
  if (!d) return 1;
  CHECK_MSG(tdm_dcomm_mode_of(d) == TDM_DCOMM_STAGE, "%d ranks on one GPU chose %s", P,
            tdm_dcomm_mode_name(tdm_dcomm_mode_of(d)));
  tdm_algo ro = tdm_comm_rank_order_algo(host);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  for (int k = 0; k < 2; k++) {
    tdm_dtype dt = dtypes[k];
    size_t es = tdm_dtype_size(dt), n = 300007, bytes = n * es;
    void *h = host_data(r, n, dt), *dv = to_device(h, bytes), *out = to_device(NULL, bytes * (size_t)P);
    for (int op = TDM_SUM; op <= TDM_AVG; op++) {
      /* all-reduce: the CPU all-reduce of the same data, bit for bit */
      void *cpu = malloc(bytes);
      CHECK_OK(tdm_comm_allreduce(host, h, cpu, n, dt, (tdm_redop)op, ro));
      CHECK_OK(tdm_dcomm_allreduce(d, dv, out, n, dt, (tdm_redop)op, s));
      CHECK_OK(tdm_dcomm_synchronize(d, s));
      void *got = from_device(out, bytes);
      CHECK_MSG(memcmp(got, cpu, bytes) == 0, "rank %d: staged %s all-reduce (%s) differs from the CPU's", r,
                tdm_dtype_name(dt), tdm_redop_name((tdm_redop)op));
      if (dt == TDM_F32) { /* and the closed form: every element summed in rank order 0..P-1 */
        size_t bad = 0;
        float *x[P];
        for (int q = 0; q < P; q++) x[q] = host_data(q, n, TDM_F32); /* every rank's data, as made there */
        for (size_t i = 0; i < n; i++) {
          float acc = x[0][i];
          for (int q = 1; q < P; q++) acc += x[q][i];
          if (op == TDM_AVG) acc /= (float)P;
          if (memcmp(&acc, (float *)got + i, 4)) bad++;
        }
        CHECK_MSG(bad == 0, "rank %d: %zu of %zu elements differ from the rank-order %s", r, bad, n,
                  tdm_redop_name((tdm_redop)op));
        for (int q = 0; q < P; q++) free(x[q]);
      }
      free(got), free(cpu);
    }
    /* reduce-scatter of P blocks of m, all-gather of m, broadcast from the last rank */
    size_t m = n / (size_t)P;
    void *cpu = malloc(bytes * (size_t)P);
    CHECK_OK(tdm_comm_reduce_scatter(host, h, cpu, m, dt, TDM_SUM, ro));
    CHECK_OK(tdm_dcomm_reduce_scatter(d, dv, out, m, dt, TDM_SUM, s));
    CHECK_OK(tdm_dcomm_synchronize(d, s));
    void *got = from_device(out, m * es);
    CHECK_MSG(memcmp(got, cpu, m * es) == 0, "rank %d: staged %s reduce-scatter differs", r, tdm_dtype_name(dt));
    free(got);
    CHECK_OK(tdm_comm_allgather(host, h, cpu, m, dt, TDM_ALGO_AUTO));
    CHECK_OK(tdm_dcomm_allgather(d, dv, out, m, dt, s));
    CHECK_OK(tdm_dcomm_synchronize(d, s));
    got = from_device(out, m * es * (size_t)P);
    CHECK_MSG(memcmp(got, cpu, m * es * (size_t)P) == 0, "rank %d: staged %s all-gather differs", r, tdm_dtype_name(dt));
    free(got);
    void *root_data = host_data(P - 1, n, dt);
    CHECK_OK(tdm_dcomm_broadcast(d, dv, n, dt, P - 1, s));
    CHECK_OK(tdm_dcomm_synchronize(d, s));
    got = from_device(dv, bytes);
    CHECK_MSG(memcmp(got, root_data, bytes) == 0, "rank %d: staged %s broadcast differs from rank %d's data", r,
              tdm_dtype_name(dt), P - 1);
    free(got), free(root_data), free(cpu), free(h);
    cudaFree(dv), cudaFree(out);
  }
  /* a rank with another count: every rank fails naming both calls, before any data moves */
  void *p = to_device(NULL, 4096);
  st = tdm_dcomm_allreduce(d, p, p, r == 1 ? 101 : 100, TDM_F32, TDM_SUM, s);
  CHECK_MSG(st == TDM_ERR_MISMATCH, "rank %d: a mismatched count gave %s: %s", r, tdm_status_str(st), tdm_last_error());
  CHECK_ERR_HAS("device collective mismatch");
  CHECK_ERR_HAS(r == 1 ? "(101 x f32, sum)" : "(100 x f32, sum)");
  CHECK_ERR_HAS(r == 1 ? "(100 x f32, sum)" : "(101 x f32, sum)");
  if (r == 0) printf("     mismatch: %s\n", tdm_last_error());
  tdm_dcomm_destroy(d);
  /* the last rank never arrives: the others name it at the timeout (2 s). The host transport is
   * aborted on the way (a tagged receive that times out fails the job), so this case is last. */
  CHECK_OK(tdm_dcomm_create(host, &cfg, &d));
  if (d && r != P - 1) {
    double t0 = tdm_time_now();
    st = tdm_dcomm_allreduce(d, p, p, 100, TDM_F32, TDM_SUM, s);
    double took = tdm_time_now() - t0;
    /* the first rank to time out names it; the others may hear of that abort first (REMOTE) and
     * name it as the rank they were still waiting for */
    char timed_out[64], waiting[64];
    snprintf(timed_out, sizeof timed_out, "rank %d did not arrive within 2 s", P - 1);
    snprintf(waiting, sizeof waiting, "(still waiting for rank %d)", P - 1);
    CHECK_MSG((st == TDM_ERR_TIMEOUT && strstr(tdm_last_error(), timed_out)) ||
                  (st == TDM_ERR_REMOTE && strstr(tdm_last_error(), waiting)),
              "rank %d: the missing rank gave %s: %s", r, tdm_status_str(st), tdm_last_error());
    CHECK_MSG(took < 6.0, "rank %d: naming the missing rank took %.2f s", r, took);
    if (r == 0) printf("     missing rank: after %.2f s: %s\n", took, tdm_last_error());
  } else if (d) {
    sleep(4); /* longer than the others' timeout, then leave without calling */
  }
  tdm_dcomm_destroy(d);
  cudaFree(p);
  cudaStreamDestroy(s);
  tdm_comm_destroy(host);
  printf("rank %d of %d: %s\n", r, P, tdm_test_failures_ ? "FAILED" : "passed");
  return tdm_test_failures_ ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *why = "";
  if (!tdm_dcomm_device_available(&why)) {
    printf("test_nccl: skipped: no usable GPU here (%s); run it on a machine with one (docs/testing.md)\n", why);
    return 77;
  }
  if (argc > 1 && !strcmp(argv[1], "--probe")) return 0;
  if (argc > 1 && !strcmp(argv[1], "--ranks")) return ranks_main();
  static const tdm_test_case cases[] = {
      {"nccl_one_rank", test_nccl_one_rank},
      {"nccl_equals_stage", test_nccl_equals_stage},
      {"bad_input", test_bad_input},
      {"watchdog", test_watchdog},
  };
  return tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
}
