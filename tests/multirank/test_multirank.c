/* The TCP and shared-memory transports with real processes on one machine. Every child is forked, runs its rank, and
 * exits with 0 (pass) or a code; the parent waits with a deadline and kills stragglers, so a
 * hang fails the test instead of stalling it. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tdm_test.h"

#define TOKEN "tdm-test-token-5f3a"

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (struct sockaddr *)&sa, sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd);
  return ntohs(sa.sin_port);
}

typedef int (*rank_fn)(tdm_comm_t c, int rank, int size);

static tdm_transport_kind g_transport = TDM_TRANSPORT_TCP;

static tdm_comm_config config(int rank, int size, int port, const char *token, double timeout) {
  tdm_comm_config cfg = {0};
  cfg.rank = rank;
  cfg.size = size;
  cfg.transport = g_transport;
  cfg.master_addr = "127.0.0.1";
  cfg.master_port = port;
  cfg.job_token = token;
  cfg.timeout_s = timeout;
  return cfg;
}

/* Starts size ranks running fn; returns their pids. */
static void spawn(int size, int port, rank_fn fn, pid_t *pids) {
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      tdm_comm_config cfg = config(r, size, port, TOKEN, 20);
      tdm_comm_t c;
      if (tdm_comm_create(&c, &cfg) != TDM_OK) {
        fprintf(stderr, "rank %d: create: %s\n", r, tdm_last_error());
        _exit(90);
      }
      int rc = fn(c, r, size);
      tdm_comm_destroy(c);
      _exit(rc);
    }
  }
}

/* Waits for all; kills everyone left at the deadline. codes[r] = exit code, or 128 + signal. */
static double wait_all(int size, pid_t *pids, int *codes, double timeout) {
  double t0 = tdm_time_now();
  int left = size;
  for (int r = 0; r < size; r++) codes[r] = -1;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; r++)
        if (pids[r] == p) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          left--;
        }
      continue;
    }
    if (tdm_time_now() - t0 > timeout) {
      for (int r = 0; r < size; r++)
        if (codes[r] < 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          codes[r] = 999;
          fprintf(stderr, "  rank %d did not finish within %.0f s: killed\n", r, timeout);
        }
      break;
    }
    usleep(10000);
  }
  return tdm_time_now() - t0;
}

/* ---- collectives over TCP ------------------------------------------------------------------ */
#define FAILIF(cond, ...)                                \
  do {                                                   \
    if (cond) {                                          \
      fprintf(stderr, "  rank %d: ", rank);              \
      fprintf(stderr, __VA_ARGS__);                      \
      fprintf(stderr, " (%s)\n", tdm_last_error());      \
      return 1;                                          \
    }                                                    \
  } while (0)

static int collectives(tdm_comm_t c, int rank, int P) {
  size_t counts[] = {0, 1, 1003, (1u << 20) + 3};
  tdm_algo algos[] = {TDM_ALGO_RING, TDM_ALGO_RD, TDM_ALGO_RHD, TDM_ALGO_TREE, TDM_ALGO_AUTO};
  float *f = malloc(sizeof(float) * counts[3]);
  for (int a = 0; a < 5; a++)
    for (int ci = 0; ci < 4; ci++) {
      size_t n = counts[ci];
      for (size_t j = 0; j < n; j++) f[j] = (float)(j % 7) + (float)rank + 1;
      FAILIF(tdm_comm_allreduce(c, f, f, n, TDM_F32, TDM_SUM, algos[a]) != TDM_OK, "all-reduce %s", tdm_algo_name(algos[a]));
      for (size_t j = 0; j < n; j++)
        FAILIF(f[j] != (float)(P * ((j % 7) + 1) + P * (P - 1) / 2), "all-reduce %s n=%zu element %zu", tdm_algo_name(algos[a]), n, j);
      int32_t m[5] = {rank, -rank, rank * 3, 7, rank % 2};
      FAILIF(tdm_comm_allreduce(c, m, m, 5, TDM_I32, TDM_MAX, algos[a]) != TDM_OK, "max");
      FAILIF(m[0] != P - 1 || m[1] != 0 || m[2] != 3 * (P - 1) || m[3] != 7, "max values");
    }
  for (int root = 0; root < P; root++)
    for (int a = 0; a < 2; a++) {
      size_t n = counts[3];
      for (size_t j = 0; j < n; j++) f[j] = rank == root ? (float)(j % 1000) : -1.0f;
      FAILIF(tdm_comm_broadcast(c, f, n, TDM_F32, root, a ? TDM_ALGO_CHAIN : TDM_ALGO_TREE) != TDM_OK, "broadcast");
      for (size_t j = 0; j < n; j += 997) FAILIF(f[j] != (float)(j % 1000), "broadcast value");
    }
  int64_t in[6], out[6 * 3];
  for (int i = 0; i < 2 * P; i++) in[i] = rank * 10 + i;
  FAILIF(tdm_comm_reduce_scatter(c, in, out, 2, TDM_I64, TDM_SUM, TDM_ALGO_RING) != TDM_OK, "reduce-scatter");
  for (int j = 0; j < 2; j++) FAILIF(out[j] != 10 * P * (P - 1) / 2 + P * (2 * rank + j), "reduce-scatter value");
  FAILIF(tdm_comm_allgather(c, in, out, 2, TDM_I64, TDM_ALGO_RING) != TDM_OK, "all-gather");
  for (int r = 0; r < P; r++) FAILIF(out[2 * r + 1] != r * 10 + 1, "all-gather value");
  FAILIF(tdm_comm_alltoall(c, in, out, 2, TDM_I64) != TDM_OK, "all-to-all");
  for (int r = 0; r < P; r++) FAILIF(out[2 * r] != r * 10 + 2 * rank, "all-to-all value");
  FAILIF(tdm_comm_gather(c, in, out, 1, TDM_I64, P - 1) != TDM_OK, "gather");
  if (rank == P - 1)
    for (int r = 0; r < P; r++) FAILIF(out[r] != r * 10, "gather value");
  FAILIF(tdm_comm_barrier(c) != TDM_OK, "barrier");
  tdm_comm_t sub;
  FAILIF(tdm_comm_split(c, rank == 0, rank, &sub) != TDM_OK, "split");
  int32_t s = 1;
  FAILIF(tdm_comm_allreduce(sub, &s, &s, 1, TDM_I32, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK, "sub all-reduce");
  FAILIF(s != (rank == 0 ? 1 : P - 1), "sub all-reduce value");
  tdm_comm_destroy(sub);
  tdm_work_t w;
  for (size_t j = 0; j < 1000; j++) f[j] = 1.0f;
  FAILIF(tdm_comm_iallreduce(c, f, f, 1000, TDM_F32, TDM_AVG, TDM_ALGO_AUTO, &w) != TDM_OK, "iallreduce");
  FAILIF(tdm_work_wait(w) != TDM_OK || f[999] != 1.0f, "iallreduce result");
  free(f);
  return 0;
}

static void test_collectives_2_and_3_ranks(void) {
  for (int P = 2; P <= 3; P++) {
    printf("  %s:\n", tdm_transport_name(g_transport));
    pid_t pids[3];
    int codes[3];
    spawn(P, free_port(), collectives, pids);
    double t = wait_all(P, pids, codes, 120);
    printf("  %d ranks: %.2f s\n", P, t);
    for (int r = 0; r < P; r++) CHECK_MSG(codes[r] == 0, "P=%d rank %d exit %d", P, r, codes[r]);
  }
}

/* ---- faults ----------------------------------------------------------------------------------- */
static int loop_until_error(tdm_comm_t c, int rank, int P) {
  (void)P;
  float *v = calloc(1 << 18, sizeof(float));
  for (long i = 0; i < 100000000L; i++) {
    tdm_status st = tdm_comm_allreduce(c, v, v, 1 << 18, TDM_F32, TDM_SUM, TDM_ALGO_RING);
    if (st != TDM_OK) {
      fprintf(stderr, "  rank %d after %ld all-reduces: %s: %s\n", rank, i, tdm_status_str(st), tdm_last_error());
      int names = strstr(tdm_last_error(), "rank 1") != NULL && strstr(tdm_last_error(), "all-reduce") != NULL;
      free(v);
      return st == TDM_ERR_REMOTE && names ? 42 : 1;
    }
  }
  free(v);
  return 0;
}

static void test_killed_rank_is_named_within_10s(void) {
  pid_t pids[3];
  int codes[3];
  spawn(3, free_port(), loop_until_error, pids);
  usleep(700000); /* let them settle into the loop */
  kill(pids[1], SIGKILL);
  double t = wait_all(3, pids, codes, 10);
  printf("  %s: survivors stopped %.2f s after the kill\n", tdm_transport_name(g_transport), t);
  CHECK(codes[1] == 128 + SIGKILL);
  CHECK_MSG(codes[0] == 42 && codes[2] == 42, "rank 0 exit %d, rank 2 exit %d", codes[0], codes[2]);
  CHECK(t < 10);
}

static int mismatch(tdm_comm_t c, int rank, int P) {
  (void)P;
  float v[1000] = {0};
  tdm_status st = rank == 0 ? tdm_comm_allreduce(c, v, v, 1000, TDM_F32, TDM_SUM, TDM_ALGO_AUTO)
                            : tdm_comm_broadcast(c, v, 1000, TDM_F32, 0, TDM_ALGO_AUTO);
  fprintf(stderr, "  rank %d: %s: %s\n", rank, tdm_status_str(st), tdm_last_error());
  int both = strstr(tdm_last_error(), "all-reduce #1") && strstr(tdm_last_error(), "broadcast #1");
  return st == TDM_ERR_MISMATCH && both ? 42 : 1;
}

static void test_mismatch_named_on_both_ranks(void) {
  pid_t pids[2];
  int codes[2];
  spawn(2, free_port(), mismatch, pids);
  double t = wait_all(2, pids, codes, 15);
  CHECK_MSG(codes[0] == 42 && codes[1] == 42, "exit codes %d %d", codes[0], codes[1]);
  CHECK(t < 5);
}

static int steady(tdm_comm_t c, int rank, int P) {
  int64_t v; /* a fixed count: every rank must make the same calls */
  for (int i = 0; i < 1000; i++) {
    v = rank;
    FAILIF(tdm_comm_allreduce(c, &v, &v, 1, TDM_I64, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK, "all-reduce %d", i);
    FAILIF(v != (int64_t)P * (P - 1) / 2, "value");
    usleep(1000);
  }
  return 0;
}

static void test_stray_connection_is_refused(void) {
  int port = free_port();
  pid_t pids[2];
  int codes[2];
  spawn(2, port, steady, pids);
  usleep(500000);
  /* one stranger sends garbage, another a handshake with the wrong token, a third stays silent */
  for (int k = 0; k < 3; k++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    if (k == 0) CHECK(write(fd, "GET / HTTP/1.0\r\n\r\n", 18) == 18);
    if (k == 1) {
      uint32_t hello[4] = {0x53444d54u, 1, 5, 0};
      CHECK(write(fd, hello, sizeof hello) == sizeof hello && write(fd, "wrong", 5) == 5);
      char b[4];
      CHECK(read(fd, b, sizeof b) <= 0); /* closed without an answer */
    }
    if (k != 2) close(fd);
  }
  double t = wait_all(2, pids, codes, 20);
  CHECK_MSG(codes[0] == 0 && codes[1] == 0, "exit codes %d %d", codes[0], codes[1]);
  printf("  the job completed in %.2f s with three strangers knocking\n", t);
}

static void test_from_env_and_wrong_token(void) {
  int port = free_port();
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char rank[8], portstr[8];
      snprintf(rank, sizeof rank, "%d", r);
      snprintf(portstr, sizeof portstr, "%d", port);
      setenv("RANK", rank, 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", portstr, 1);
      setenv("TANDEM_JOB_TOKEN", TOKEN, 1);
      setenv("TANDEM_TIMEOUT", "10", 1);
      tdm_comm_t c;
      if (tdm_comm_create_from_env(&c) != TDM_OK) _exit(90);
      int rc = tdm_comm_size(c) == 2 && tdm_comm_rank(c) == r ? steady(c, r, 2) : 2;
      tdm_comm_destroy(c);
      _exit(rc);
    }
  }
  int codes[2];
  wait_all(2, pids, codes, 30);
  CHECK_MSG(codes[0] == 0 && codes[1] == 0, "from env: exit codes %d %d", codes[0], codes[1]);

  /* a rank with the wrong token is turned away with a message; the other gives up in time */
  port = free_port();
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      tdm_comm_config cfg = config(r, 2, port, r == 1 ? "not-the-token" : TOKEN, 2);
      tdm_comm_t c;
      tdm_status st = tdm_comm_create(&c, &cfg);
      fprintf(stderr, "  rank %d: %s: %s\n", r, tdm_status_str(st), tdm_last_error());
      if (st == TDM_OK) _exit(1);
      _exit(r == 1 ? (strstr(tdm_last_error(), "TANDEM_JOB_TOKEN") ? 42 : 2) : (st == TDM_ERR_TIMEOUT ? 42 : 3));
    }
  }
  double t = wait_all(2, pids, codes, 15);
  CHECK_MSG(codes[0] == 42 && codes[1] == 42, "wrong token: exit codes %d %d", codes[0], codes[1]);
  CHECK(t < 8);
}

static void test_shm_collectives(void) {
  g_transport = TDM_TRANSPORT_SHM;
  test_collectives_2_and_3_ranks();
  g_transport = TDM_TRANSPORT_TCP;
}
static void test_shm_killed_rank(void) {
  g_transport = TDM_TRANSPORT_SHM;
  test_killed_rank_is_named_within_10s();
  g_transport = TDM_TRANSPORT_TCP;
}
static void test_shm_mismatch(void) {
  g_transport = TDM_TRANSPORT_SHM;
  test_mismatch_named_on_both_ranks();
  g_transport = TDM_TRANSPORT_TCP;
}
static void test_shm_leaves_nothing_behind(void) {
  /* a segment's name (/tandem-<creator pid>-<random>) is unlinked once all ranks mapped it: any
   * left in /dev/shm must belong to a job still running (other tests may run in parallel) */
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int pid;
    if (sscanf(e->d_name, "tandem-%d-", &pid) == 1)
      CHECK_MSG(kill(pid, 0) == 0 || errno != ESRCH, "/dev/shm/%s outlived its creator", e->d_name);
  }
  closedir(d);
}

TDM_TEST_MAIN(T(test_collectives_2_and_3_ranks), T(test_killed_rank_is_named_within_10s),
              T(test_mismatch_named_on_both_ranks), T(test_stray_connection_is_refused),
              T(test_from_env_and_wrong_token), T(test_shm_collectives), T(test_shm_killed_rank), T(test_shm_mismatch),
              T(test_shm_leaves_nothing_behind))
