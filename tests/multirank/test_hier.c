/* The hierarchical all-reduce (src/comm/algo/hier.c) with real processes: 4 ranks over TCP whose
 * "nodes" TANDEM_NODE_ID names (2 of 2, interleaved 2 of 2, uneven 3 + 1, one node), each child
 * forked with its own value. Every rank builds every rank's input itself (a generator keyed by
 * rank), so it knows the exact bits each summation order gives: the hierarchical result must be
 * the node-by-node sum bit for bit, the flat direct result the rank-order sum; the two are
 * compared (equal on integer-valued data, within rounding otherwise). Also: AUTO picks it only
 * where ranks span nodes, every dtype and op, counts 0, 1, odd and past the shm slots, and the
 * refusals (a bad TANDEM_NODE_ID; TANDEM_ALGO=allreduce=hier on one node). */
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "multirank/procs.h"
#include "tdm_test.h"

#define P 4
#define TOKEN "tdm-hier-token-8c1d"

typedef int (*rank_fn)(tdm_comm_t c, int rank, const int *node);

/* node[r]: the node of rank r (its TANDEM_NODE_ID); algo_env: TANDEM_ALGO for the children. */
static void run(const int *node, const char *algo_env, rank_fn fn, int *codes) {
  int port = procs_free_port();
  pid_t pids[P];
  for (int r = 0; r < P; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char id[16];
      snprintf(id, sizeof id, "n%d", node[r]);
      setenv("TANDEM_NODE_ID", id, 1);
      if (algo_env) setenv("TANDEM_ALGO", algo_env, 1);
      unsetenv("LOCAL_WORLD_SIZE");
      unsetenv("TANDEM_NET_EMULATE");
      tdm_comm_config cfg = {.rank = r, .size = P, .transport = TDM_TRANSPORT_TCP, .master_addr = "127.0.0.1",
                             .master_port = port, .job_token = TOKEN, .timeout_s = 30};
      tdm_comm_t c;
      if (tdm_comm_create(&c, &cfg) != TDM_OK) {
        fprintf(stderr, "  rank %d: create: %s\n", r, tdm_last_error());
        _exit(90);
      }
      int rc = fn(c, r, node);
      tdm_comm_destroy(c);
      _exit(rc);
    }
  }
  procs_wait_all(P, pids, codes, 90);
}

/* Rank q's element j: a float with a full mantissa (sums round), or an integer-valued one. Not
 * inlined: a sum of its products would be contracted into fused multiply-adds (-march=native). */
__attribute__((noinline)) static float input(int q, size_t j, int integers) {
  uint64_t h = tdm_hash64(0x51ed + (uint64_t)q, j);
  if (integers) return (float)(h % 1000) - 500.0f;
  return ((float)(h >> 40) / (float)(1 << 24) - 0.5f) * (float)(1 + (h & 7));
}

/* The sum node by node (ranks of a node in rank order, nodes in order of their first rank), and
 * the flat rank-order sum. */
static float hier_sum(const int *node, size_t j, int integers) {
  float total = 0;
  int seen[8] = {0}, first_node = 1;
  for (int r = 0; r < P; r++) {
    if (seen[node[r]]) continue;
    seen[node[r]] = 1;
    float s = 0;
    int first = 1;
    for (int q = r; q < P; q++)
      if (node[q] == node[r]) s = first ? input(q, j, integers) : s + input(q, j, integers), first = 0;
    total = first_node ? s : total + s;
    first_node = 0;
  }
  return total;
}
static float flat_sum(size_t j, int integers) {
  float s = input(0, j, integers);
  for (int q = 1; q < P; q++) s += input(q, j, integers);
  return s;
}

static int sums(tdm_comm_t c, int rank, const int *node) {
  size_t counts[] = {0, 1, 3, 1001, (1u << 18) + 7}; /* none, fewer than the lanes, odd, past a 1 MiB shm slot */
  size_t most = counts[4];
  float *x = malloc(most * sizeof(float)), *y = malloc(most * sizeof(float));
  uint64_t b0 = tdm_comm_bytes_sent(c);
  for (int integers = 0; integers < 2; integers++)
    for (int ci = 0; ci < 5; ci++) {
      size_t n = counts[ci];
      for (size_t j = 0; j < n; j++) x[j] = input(rank, j, integers);
      FAILIF(tdm_comm_allreduce(c, x, y, n, TDM_F32, TDM_SUM, TDM_ALGO_HIER) != TDM_OK, "hier n=%zu", n);
      for (size_t j = 0; j < n; j++) {
        float want = hier_sum(node, j, integers);
        FAILIF(memcmp(&y[j], &want, 4), "hier n=%zu element %zu: %.9g, the node-by-node sum is %.9g", n, j, y[j], want);
      }
      /* AUTO: the same algorithm (ranks span nodes), in place */
      for (size_t j = 0; j < n; j++) x[j] = input(rank, j, integers);
      FAILIF(tdm_comm_allreduce(c, x, x, n, TDM_F32, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK, "auto n=%zu", n);
      FAILIF(n && memcmp(x, y, n * 4), "auto n=%zu differs from hier", n);
      /* the flat rank-order algorithm: its own order; equal on integers, within rounding otherwise */
      for (size_t j = 0; j < n; j++) x[j] = input(rank, j, integers);
      FAILIF(tdm_comm_allreduce(c, x, x, n, TDM_F32, TDM_SUM, TDM_ALGO_DIRECT) != TDM_OK, "direct n=%zu", n);
      for (size_t j = 0; j < n; j++) {
        float want = flat_sum(j, integers);
        FAILIF(memcmp(&x[j], &want, 4), "direct n=%zu element %zu", n, j);
        if (integers) FAILIF(x[j] != y[j], "integers: hier %g, flat %g at %zu", y[j], x[j], j);
        else FAILIF(fabsf(x[j] - y[j]) > 1e-6f * 16, "hier %.9g vs flat %.9g at %zu", y[j], x[j], j);
      }
    }
  FAILIF(tdm_comm_bytes_sent(c) == b0, "the hierarchical all-reduce's bytes are not counted on the communicator");
  /* other dtypes and ops: closed forms */
  int32_t m[5] = {rank, -rank, rank * 3, 7, rank % 2};
  FAILIF(tdm_comm_allreduce(c, m, m, 5, TDM_I32, TDM_MAX, TDM_ALGO_HIER) != TDM_OK, "max");
  FAILIF(m[0] != P - 1 || m[1] != 0 || m[2] != 3 * (P - 1) || m[3] != 7 || m[4] != 1, "max values");
  int32_t mn[3] = {rank, -rank, 5};
  FAILIF(tdm_comm_allreduce(c, mn, mn, 3, TDM_I32, TDM_MIN, TDM_ALGO_HIER) != TDM_OK, "min");
  FAILIF(mn[0] != 0 || mn[1] != -(P - 1) || mn[2] != 5, "min values");
  double d[7], pr[2] = {rank + 1.0, 2.0};
  for (int j = 0; j < 7; j++) d[j] = j + 10.0 * rank;
  FAILIF(tdm_comm_allreduce(c, d, d, 7, TDM_F64, TDM_AVG, TDM_ALGO_HIER) != TDM_OK, "avg");
  for (int j = 0; j < 7; j++) FAILIF(d[j] != j + 10.0 * (P - 1) / 2.0, "avg element %d: %g", j, d[j]);
  FAILIF(tdm_comm_allreduce(c, pr, pr, 2, TDM_F64, TDM_PROD, TDM_ALGO_HIER) != TDM_OK, "prod");
  FAILIF(pr[0] != 24 || pr[1] != 16, "prod values %g %g", pr[0], pr[1]);
  /* the other collectives run as before beside it */
  int32_t g[P], mine = 100 + rank;
  FAILIF(tdm_comm_allgather(c, &mine, g, 1, TDM_I32, TDM_ALGO_AUTO) != TDM_OK, "all-gather");
  for (int q = 0; q < P; q++) FAILIF(g[q] != 100 + q, "all-gather block %d", q);
  free(x);
  free(y);
  return 0;
}

/* Until the communicator fails; 42 when it names the cause (a rank that died or closed). */
static int loop_until_error(tdm_comm_t c, int rank, const int *node) {
  (void)node;
  float v[4096];
  for (;;) {
    for (int j = 0; j < 4096; j++) v[j] = (float)rank;
    tdm_status st = tdm_comm_allreduce(c, v, v, 4096, TDM_F32, TDM_SUM, TDM_ALGO_AUTO);
    if (st != TDM_OK) {
      fprintf(stderr, "  rank %d: %s: %s\n", rank, tdm_status_str(st), tdm_last_error());
      return (st == TDM_ERR_REMOTE || st == TDM_ERR_TIMEOUT) && strstr(tdm_last_error(), "hierarchical all-reduce") ? 42 : 1;
    }
    if (v[0] != 6.0f) return 2;
  }
}

static void check_codes(const char *what, const int *codes) {
  for (int r = 0; r < P; r++) CHECK_MSG(codes[r] == 0, "%s: rank %d exit %d", what, r, codes[r]);
}

static void test_two_nodes_of_two(void) {
  int node[P] = {0, 0, 1, 1}, codes[P];
  run(node, NULL, sums, codes);
  check_codes("2 nodes of 2", codes);
}

static void test_interleaved_nodes(void) { /* ranks 0, 2 on one node, 1, 3 on the other */
  int node[P] = {0, 1, 0, 1}, codes[P];
  run(node, NULL, sums, codes);
  check_codes("interleaved nodes", codes);
}

static void test_uneven_nodes(void) { /* 3 + 1: one lane; and 1 + 3 */
  int a[P] = {0, 0, 0, 1}, b[P] = {0, 1, 1, 1}, codes[P];
  run(a, NULL, sums, codes);
  check_codes("3 ranks on node A, 1 on B", codes);
  run(b, NULL, sums, codes);
  check_codes("1 rank on node A, 3 on B", codes);
}

/* A rank killed in the middle: every survivor, on its node and on the other, fails within
 * seconds naming the hierarchical all-reduce, none waits for the 30 s timeout. */
static void test_killed_rank(void) {
  int node[P] = {0, 0, 1, 1}, codes[P];
  int port = procs_free_port();
  pid_t pids[P];
  for (int r = 0; r < P; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char id[16];
      snprintf(id, sizeof id, "n%d", node[r]);
      setenv("TANDEM_NODE_ID", id, 1);
      unsetenv("LOCAL_WORLD_SIZE");
      tdm_comm_config cfg = {.rank = r, .size = P, .transport = TDM_TRANSPORT_TCP, .master_addr = "127.0.0.1",
                             .master_port = port, .job_token = TOKEN, .timeout_s = 30};
      tdm_comm_t c;
      if (tdm_comm_create(&c, &cfg) != TDM_OK) _exit(90);
      int rc = loop_until_error(c, r, node);
      tdm_comm_destroy(c);
      _exit(rc);
    }
  }
  usleep(1500000); /* set up and looping */
  kill(pids[3], SIGKILL);
  double t0 = tdm_time_now();
  procs_wait_all(P, pids, codes, 25);
  double t = tdm_time_now() - t0;
  printf("  survivors stopped %.2f s after the kill\n", t);
  CHECK(codes[3] == 128 + SIGKILL);
  for (int r = 0; r < 3; r++) CHECK_MSG(codes[r] == 42, "rank %d exit %d", r, codes[r]);
  CHECK(t < 15);
}

static int one_node(tdm_comm_t c, int rank, const int *node) {
  (void)node;
  float v[3] = {1, 2, 3};
  tdm_status st = tdm_comm_allreduce(c, v, v, 3, TDM_F32, TDM_SUM, TDM_ALGO_HIER);
  FAILIF(st != TDM_ERR_NOT_SUPPORTED || !strstr(tdm_last_error(), "algorithm 'hier' does not apply on this 4-rank tcp"),
         "hier on one node: %s", tdm_status_str(st));
  FAILIF(tdm_comm_allreduce(c, v, v, 3, TDM_F32, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK || v[0] != 4 || v[2] != 12, "auto on one node");
  return 0;
}

static void test_one_node_is_flat(void) {
  int node[P] = {7, 7, 7, 7}, codes[P];
  run(node, NULL, one_node, codes);
  check_codes("one node", codes);
}

static int nothing(tdm_comm_t c, int rank, const int *node) {
  (void)c, (void)rank, (void)node;
  return 0;
}

static void test_refusals(void) {
  int node[P] = {0, 0, 0, 0}, codes[P];
  run(node, "allreduce=hier", nothing, codes); /* one node: hier cannot run */
  for (int r = 0; r < P; r++) CHECK_MSG(codes[r] == 90, "TANDEM_ALGO=allreduce=hier on one node: rank %d exit %d", r, codes[r]);
  int split[P] = {0, 0, 1, 1};
  run(split, "allreduce=hier", nothing, codes); /* two nodes: taken */
  check_codes("TANDEM_ALGO=allreduce=hier on 2 nodes", codes);
  /* in-process: the messages (the value, what is expected) */
  setenv("TANDEM_NODE_ID", "", 1);
  tdm_comm_config cfg = {.rank = 0, .size = 2, .transport = TDM_TRANSPORT_TCP, .master_addr = "127.0.0.1",
                         .master_port = procs_free_port(), .timeout_s = 5};
  pid_t peer = fork();
  if (peer == 0) {
    cfg.rank = 1;
    tdm_comm_t c;
    _exit(tdm_comm_create(&c, &cfg) == TDM_ERR_INVALID_ARG ? 0 : 1);
  }
  tdm_comm_t c = NULL;
  CHECK(tdm_comm_create(&c, &cfg) == TDM_ERR_INVALID_ARG && !c);
  CHECK_ERR_HAS("TANDEM_NODE_ID is ''; expected a name of 1..120 characters that the ranks of one node share");
  int status = 0;
  waitpid(peer, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  setenv("TANDEM_NODE_ID", "a", 1);
  setenv("TANDEM_ALGO", "allreduce=hier", 1);
  cfg.size = 1, cfg.rank = 0;
  CHECK(tdm_comm_create(&c, &cfg) == TDM_ERR_INVALID_ARG && !c);
  CHECK_ERR_HAS("hier cannot run allreduce on this 1-rank tcp communicator (hier needs a tcp or mpi job whose ranks are on several nodes");
  unsetenv("TANDEM_ALGO");
  unsetenv("TANDEM_NODE_ID");
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  static const tdm_test_case cases[] = {T(test_two_nodes_of_two), T(test_interleaved_nodes), T(test_uneven_nodes), T(test_killed_rank),
                                        T(test_one_node_is_flat), T(test_refusals)};
  return tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
}
