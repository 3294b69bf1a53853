/* Tagged messages and receives from any source (tdm_comm_tsend / tdm_comm_trecv) on the thread,
 * shm and tcp transports: matching by tag and source with messages of other tags kept for later,
 * collectives and sub-communicators on the same connections undisturbed, a collective met by a
 * tagged receive and a message larger than the buffer named as mismatches, a dead peer named and
 * a silent one timed out. Ranks are threads (thread) or forked processes (shm, tcp) that exit
 * with 0 or a code; the parent kills whoever is left at its deadline. Under mpirun,
 * `test_tagged mpi CASE DIR` runs a case on the MPI transport (tests/multirank/test_mpi.sh). */
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>

#include "comm/comm_impl.h" /* tdm__mpi_piece_bytes */
#include "multirank/procs.h"
#include "tdm_test.h"

/* Defined by LeakSanitizer in the sanitizer build, absent (NULL) otherwise: a forked rank checks
 * for leaks itself before _exit (failure paths included). */
extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));
#define LEAKED 97

typedef int (*rank_fn)(tdm_comm_t c, int rank, int P);
enum { K = 5, TAG_DATA = 7, TAG_LATE = 9, TAG_REPLY = 5 };

/* Message i of rank r: (i + 1) * 8 bytes of a pattern of (r, i). */
static void fill(unsigned char *m, int r, int i) {
  for (int j = 0; j < (i + 1) * 8; j++) m[j] = (unsigned char)(r * 31 + i * 7 + j);
}

/* Workers 1..P-1 send a TAG_LATE message, then K TAG_DATA messages (the last ones after an
 * all-reduce), to rank 0; rank 0 does the all-reduce first (reading past the tagged messages),
 * takes the TAG_DATA messages from any source (each source's in order), then the TAG_LATE ones by
 * source, and answers each worker with what it counted. A split communicator carries tagged
 * messages with the same tag meanwhile. */
static int basic(tdm_comm_t c, int rank, int P) {
  unsigned char m[K * 8 + 8], want[K * 8 + 8];
  int64_t v[8]; /* an all-reduce that sends messages on every transport (shm's own sends none) */
  for (int j = 0; j < 8; j++) v[j] = rank + 1 + j;
  tdm_comm_t sub = NULL;
  FAILIF(tdm_comm_split(c, rank % 2, rank, &sub) != TDM_OK, "split");
  if (rank > 0) {
    int64_t late = 1000 + rank;
    FAILIF(tdm_comm_tsend(c, 0, TAG_LATE, &late, sizeof late) != TDM_OK, "tsend late");
    for (int i = 0; i < K; i++) {
      if (i == 2) FAILIF(tdm_comm_allreduce(c, v, v, 8, TDM_I64, TDM_SUM, TDM_ALGO_RING) != TDM_OK, "allreduce");
      fill(m, rank, i);
      FAILIF(tdm_comm_tsend(c, 0, TAG_DATA, m, (size_t)(i + 1) * 8) != TDM_OK, "tsend %d", i);
    }
  } else {
    FAILIF(tdm_comm_allreduce(c, v, v, 8, TDM_I64, TDM_SUM, TDM_ALGO_RING) != TDM_OK, "allreduce");
  }
  for (int j = 0; j < 8; j++)
    FAILIF(v[j] != (int64_t)P * (P + 1) / 2 + (int64_t)P * j, "all-reduce gave %lld at %d", (long long)v[j], j);
  /* the sub-communicator: its rank 0 hears from its other ranks, by any source, on TAG_DATA */
  int sr = tdm_comm_rank(sub), sp = tdm_comm_size(sub);
  if (sr > 0) {
    int32_t x = 100 * sr + rank;
    FAILIF(tdm_comm_tsend(sub, 0, TAG_DATA, &x, sizeof x) != TDM_OK, "sub tsend");
  } else {
    for (int k = 1; k < sp; k++) {
      int32_t x = 0;
      int from = -1;
      size_t n = 0;
      FAILIF(tdm_comm_trecv(sub, TDM_ANY_SOURCE, TAG_DATA, &x, sizeof x, &from, &n) != TDM_OK, "sub trecv");
      FAILIF(n != 4 || from < 1 || from >= sp || x % 100 != (from * 2 + rank % 2) || x / 100 != from,
             "sub message %d from %d (%zu bytes)", (int)x, from, n);
    }
  }
  if (rank == 0) {
    int next[64] = {0};
    for (int k = 0; k < K * (P - 1); k++) {
      int from = -1;
      size_t n = 0;
      FAILIF(tdm_comm_trecv(c, TDM_ANY_SOURCE, TAG_DATA, m, sizeof m, &from, &n) != TDM_OK, "trecv any");
      FAILIF(from < 1 || from >= P, "from %d", from);
      int i = next[from]++;
      fill(want, from, i);
      FAILIF(n != (size_t)(i + 1) * 8 || memcmp(m, want, n), "message %d of rank %d: %zu bytes, wrong", i, from, n);
    }
    for (int r = P - 1; r >= 1; r--) { /* by source, in another order than they came */
      int64_t late = 0;
      int from = -1;
      size_t n = 0;
      FAILIF(tdm_comm_trecv(c, r, TAG_LATE, &late, sizeof late, &from, &n) != TDM_OK, "trecv late %d", r);
      FAILIF(late != 1000 + r || from != r || n != sizeof late, "late message of %d: %lld", r, (long long)late);
      int32_t count = next[r];
      FAILIF(tdm_comm_tsend(c, r, TAG_REPLY, &count, sizeof count) != TDM_OK, "reply");
    }
  } else {
    int32_t count = 0;
    FAILIF(tdm_comm_trecv(c, 0, TAG_REPLY, &count, sizeof count, NULL, NULL) != TDM_OK, "trecv reply");
    FAILIF(count != K, "rank 0 counted %d messages", (int)count);
  }
  FAILIF(tdm_comm_barrier(c) != TDM_OK, "barrier"); /* nothing left over confuses a collective */
  tdm_comm_destroy(sub);
  return 0;
}

/* Rank 1 runs an all-reduce where rank 0 waits for a tagged message: both fail, naming both. */
static int meets_collective(tdm_comm_t c, int rank, int P) {
  (void)P;
  float v[4] = {0};
  tdm_status st = rank == 0 ? tdm_comm_trecv(c, TDM_ANY_SOURCE, 3, v, sizeof v, NULL, NULL)
                            : tdm_comm_allreduce(c, v, v, 4, TDM_F32, TDM_SUM, TDM_ALGO_RING);
  if (rank == 0)
    FAILIF(st != TDM_ERR_MISMATCH || !strstr(tdm_last_error(), "all-reduce #1") ||
               !strstr(tdm_last_error(), "tagged message (tag 3"),
           "expected a mismatch naming both, got %s", tdm_status_str(st));
  else FAILIF(st == TDM_OK, "the all-reduce succeeded");
  return 0;
}

/* A 100-byte message into a 50-byte buffer. */
static int too_big(tdm_comm_t c, int rank, int P) {
  (void)P;
  char b[100] = {0};
  size_t n = 7;
  tdm_status st = rank == 1 ? tdm_comm_tsend(c, 0, 1, b, 100) : tdm_comm_trecv(c, 1, 1, b, 50, NULL, &n);
  if (rank == 0)
    FAILIF(st != TDM_ERR_MISMATCH || !strstr(tdm_last_error(), "100-byte") || !strstr(tdm_last_error(), "50 bytes") || n,
           "expected a size mismatch, got %s", tdm_status_str(st));
  return 0;
}

/* Rank 2 dies; rank 1 sends one message and waits. Rank 0 gets rank 1's message, then a receive
 * from any source fails within seconds naming rank 2. */
static int dead_peer(tdm_comm_t c, int rank, int P) {
  (void)P;
  int32_t x = 11;
  if (rank == 2) raise(SIGKILL);
  if (rank == 1) {
    FAILIF(tdm_comm_tsend(c, 0, 4, &x, sizeof x) != TDM_OK, "tsend");
    tdm_status st = tdm_comm_trecv(c, 0, 4, &x, sizeof x, NULL, NULL); /* fails when rank 0 gives up */
    FAILIF(st == TDM_OK, "rank 0 answered");
    return 42;
  }
  int from = -1;
  FAILIF(tdm_comm_trecv(c, 1, 4, &x, sizeof x, &from, NULL) != TDM_OK || from != 1, "first from %d", from);
  double t0 = tdm_time_now();
  tdm_status st = tdm_comm_trecv(c, TDM_ANY_SOURCE, 4, &x, sizeof x, &from, NULL);
  fprintf(stderr, "  rank 0 after %.2f s: %s: %s\n", tdm_time_now() - t0, tdm_status_str(st), tdm_last_error());
  FAILIF(st != TDM_ERR_REMOTE || !strstr(tdm_last_error(), "rank 2"), "expected rank 2 named");
  return 42;
}

/* Rank 2 sends one message and leaves (its connection closes); rank 1 sends one later. Rank 0
 * takes rank 2's from {1, 2}, then rank 1's from {1} alone: the closed connection of a rank no
 * longer listened to is no failure (a server whose finished clients go away). */
static int among(tdm_comm_t c, int rank, int P) {
  (void)P;
  int32_t x = 100 + rank;
  if (rank == 2) return tdm_comm_tsend(c, 0, 6, &x, sizeof x) == TDM_OK ? 0 : 1;
  if (rank == 1) {
    usleep(300000); /* rank 2 is gone by now */
    FAILIF(tdm_comm_tsend(c, 0, 6, &x, sizeof x) != TDM_OK, "tsend");
    FAILIF(tdm_comm_trecv(c, 0, 6, &x, sizeof x, NULL, NULL) != TDM_OK, "the answer");
    return 0;
  }
  int both[2] = {1, 2}, from = -1;
  FAILIF(tdm_comm_trecv_among(c, both, 2, 6, &x, sizeof x, &from, NULL) != TDM_OK || from != 2 || x != 102,
         "first: %d from %d", (int)x, from);
  FAILIF(tdm_comm_trecv_among(c, both, 1, 6, &x, sizeof x, &from, NULL) != TDM_OK || from != 1 || x != 101,
         "second: %d from %d", (int)x, from);
  FAILIF(tdm_comm_tsend(c, 1, 6, &x, sizeof x) != TDM_OK, "answer");
  int self[1] = {0};
  FAILIF(tdm_comm_trecv_among(c, self, 1, 6, &x, sizeof x, NULL, NULL) != TDM_ERR_INVALID_ARG, "itself accepted");
  return 0;
}

/* Rank 3 dies; ranks 1 and 2 each send one message. Rank 0's lossy receives from {1, 2, 3} give
 * both messages and rank 3 lost (in whatever order), the communicator still fine; then ranks 0-2
 * make a communicator of themselves without a message (tdm_comm_subset) and all-reduce on it. */
static int lossy(tdm_comm_t c, int rank, int P) {
  (void)P;
  int32_t x = 200 + rank;
  if (rank == 3) raise(SIGKILL);
  if (rank != 0) {
    FAILIF(tdm_comm_tsend(c, 0, 7, &x, sizeof x) != TDM_OK, "tsend");
    FAILIF(tdm_comm_trecv(c, 0, 7, &x, sizeof x, NULL, NULL) != TDM_OK, "the answer");
  } else {
    int live[3] = {1, 2, 3}, n = 3, got = 0, lost = -1, seen = 0;
    while (got < 2 || lost < 0) {
      int from = -1, gone = -1;
      tdm_status st = tdm_comm_trecv_among_lossy(c, live, n, 7, &x, sizeof x, &from, NULL, &gone);
      if (st == TDM_OK) {
        FAILIF(x != 200 + from, "%d from %d", (int)x, from);
        got++, seen |= 1 << from;
        continue;
      }
      FAILIF(gone != 3 || !strstr(tdm_last_error(), "rank 3") || tdm_comm_status(c) != TDM_OK, "%s: lost %d: %s",
             tdm_status_str(st), gone, tdm_last_error());
      fprintf(stderr, "  rank 0: rank 3 lost: %s\n", tdm_last_error());
      lost = gone, n = 2;
    }
    FAILIF(seen != 6, "messages from %x", seen);
    for (int q = 1; q <= 2; q++) FAILIF(tdm_comm_tsend(c, q, 7, &x, sizeof x) != TDM_OK, "answer %d", q);
  }
  int three[3] = {0, 1, 2};
  tdm_comm_t sub = NULL;
  FAILIF(tdm_comm_subset(c, three, 3, &sub) != TDM_OK || !sub || tdm_comm_size(sub) != 3 || tdm_comm_rank(sub) != rank,
         "subset: %s", tdm_last_error());
  int64_t v = rank + 1;
  tdm_status st = tdm_comm_allreduce(sub, &v, &v, 1, TDM_I64, TDM_SUM, TDM_ALGO_AUTO);
  tdm_comm_destroy(sub);
  FAILIF(st != TDM_OK || v != 6, "all-reduce on the survivors: %lld (%s)", (long long)v, tdm_last_error());
  return 0;
}

/* Nobody sends: a receive from any source times out, saying so. */
static int silent(tdm_comm_t c, int rank, int P) {
  (void)P;
  if (rank != 0) { /* alive and quiet while rank 0 waits */
    usleep(1000000); /* past rank 0's timeout of 0.5 s, with room for a loaded machine */
    return 0;
  }
  int32_t x;
  tdm_status st = tdm_comm_trecv(c, TDM_ANY_SOURCE, 2, &x, sizeof x, NULL, NULL);
  FAILIF(st != TDM_ERR_TIMEOUT || !strstr(tdm_last_error(), "any rank"), "expected a timeout, got %s", tdm_status_str(st));
  return 0;
}

/* Rank 1 sends tags 1 then 2 (3000 and 5000 bytes); rank 0 takes 2 first (1 waits in the
 * stash), then 1; then rank 0 sends tags 3 and 4, which rank 1 takes in their order; then rank 1's
 * tag 5 arrives at a receive from any source, which names rank 1. Pieces of 1000 bytes under MPI. */
static int orders(tdm_comm_t c, int rank, int P) {
  (void)P;
  unsigned char a[5000], want[5000];
  size_t n = 0;
  int from = -1;
  if (rank > 1) return 0;
  if (rank == 1) {
    for (int t = 1; t <= 2; t++) {
      memset(a, 10 * t, sizeof a);
      FAILIF(tdm_comm_tsend(c, 0, t, a, t == 1 ? 3000 : 5000) != TDM_OK, "tsend %d", t);
    }
    for (int t = 3; t <= 4; t++) {
      FAILIF(tdm_comm_trecv(c, 0, t, a, sizeof a, &from, &n) != TDM_OK || from != 0 || n != (size_t)(t * 1000),
             "trecv %d: %zu bytes from %d", t, n, from);
      memset(want, 10 * t, n);
      FAILIF(memcmp(a, want, n), "tag %d: wrong bytes", t);
    }
    int32_t x = 555;
    FAILIF(tdm_comm_tsend(c, 0, 5, &x, sizeof x) != TDM_OK, "tsend 5");
  } else {
    for (int t = 2; t >= 1; t--) {
      FAILIF(tdm_comm_trecv(c, 1, t, a, sizeof a, &from, &n) != TDM_OK || from != 1 || n != (t == 1 ? 3000u : 5000u),
             "trecv %d: %zu bytes from %d", t, n, from);
      memset(want, 10 * t, n);
      FAILIF(memcmp(a, want, n), "tag %d: wrong bytes", t);
    }
    for (int t = 3; t <= 4; t++) {
      memset(a, 10 * t, sizeof a);
      FAILIF(tdm_comm_tsend(c, 1, t, a, (size_t)t * 1000) != TDM_OK, "tsend %d", t);
    }
    int32_t x = 0;
    FAILIF(tdm_comm_trecv(c, TDM_ANY_SOURCE, 5, &x, sizeof x, &from, &n) != TDM_OK || from != 1 || x != 555 || n != 4,
           "any source: %d from %d", (int)x, from);
  }
  int64_t v = rank + 1; /* the collective traffic after it is undisturbed */
  FAILIF(tdm_comm_allreduce(c, &v, &v, 1, TDM_I64, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK || v != 3, "all-reduce %lld",
         (long long)v);
  return 0;
}

/* Rank 1 is alive and sends nothing: rank 0's receive from it times out, naming it. */
static int quiet_peer(tdm_comm_t c, int rank, int P) {
  (void)P;
  if (rank != 0) return 0;
  int32_t x;
  tdm_status st = tdm_comm_trecv(c, 1, 2, &x, sizeof x, NULL, NULL);
  FAILIF(st != TDM_ERR_TIMEOUT || !strstr(tdm_last_error(), "waiting for rank 1"), "expected a timeout naming rank 1, got %s",
         tdm_status_str(st));
  fprintf(stderr, "  rank 0: %s\n", tdm_last_error());
  return 0;
}

/* MPI: rank 1 runs an all-reduce where rank 0 waits for a tagged message from it. Tagged traffic
 * has its own MPI tag there, so the receive never meets the all-reduce's message: both time out,
 * each naming the other (whichever gives up first tells the other why). */
static int collective_met_mpi(tdm_comm_t c, int rank, int P) {
  (void)P;
  float v[4] = {0};
  tdm_status st = rank == 0 ? tdm_comm_trecv(c, 1, 3, v, sizeof v, NULL, NULL)
                            : tdm_comm_allreduce(c, v, v, 4, TDM_F32, TDM_SUM, TDM_ALGO_RING);
  if (rank == 0)
    FAILIF(st != TDM_ERR_TIMEOUT || !strstr(tdm_last_error(), "rank 1"), "expected a timeout naming rank 1, got %s",
           tdm_status_str(st));
  else FAILIF(st == TDM_OK || !strstr(tdm_last_error(), "rank 0"), "the all-reduce: %s", tdm_status_str(st));
  fprintf(stderr, "  rank %d: %s\n", rank, tdm_last_error());
  return 0;
}

/* ---- running ranks ------------------------------------------------------------------------------ */
typedef struct {
  void *group;
  int rank, P, code;
  rank_fn fn;
  double timeout;
} thread_arg;

static void *thread_main(void *v) {
  thread_arg *a = v;
  tdm_comm_config cfg = {0};
  cfg.rank = a->rank;
  cfg.size = a->P;
  cfg.transport = TDM_TRANSPORT_THREAD;
  cfg.thread_group = a->group;
  cfg.timeout_s = a->timeout;
  tdm_comm_t c;
  a->code = 90;
  if (tdm_comm_create(&c, &cfg) != TDM_OK) return NULL;
  a->code = a->fn(c, a->rank, a->P);
  tdm_comm_destroy(c);
  return NULL;
}

/* Runs fn on P ranks of transport tr; codes[r] gets each rank's exit code. */
static void run_job(tdm_transport_kind tr, int P, rank_fn fn, double timeout, int *codes) {
  if (tr == TDM_TRANSPORT_THREAD) {
    void *g;
    pthread_t th[8];
    thread_arg a[8];
    CHECK_OK(tdm_comm_thread_group_create(&g, P));
    for (int r = 0; r < P; r++) {
      a[r] = (thread_arg){g, r, P, -1, fn, timeout};
      pthread_create(&th[r], NULL, thread_main, &a[r]);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL), codes[r] = a[r].code;
    tdm_comm_thread_group_destroy(g);
    return;
  }
  pid_t pids[8];
  int port = procs_free_port();
  for (int r = 0; r < P; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      tdm_comm_config cfg = {0};
      cfg.rank = r;
      cfg.size = P;
      cfg.transport = tr;
      cfg.master_addr = "127.0.0.1";
      cfg.master_port = port;
      cfg.job_token = "tdm-tagged-test";
      cfg.timeout_s = timeout;
      tdm_comm_t c;
      if (tdm_comm_create(&c, &cfg) != TDM_OK) {
        fprintf(stderr, "rank %d: create: %s\n", r, tdm_last_error());
        _exit(90);
      }
      int rc = fn(c, r, P);
      tdm_comm_destroy(c);
      if (__lsan_do_recoverable_leak_check && __lsan_do_recoverable_leak_check()) rc = LEAKED;
      _exit(rc);
    }
  }
  procs_wait_all(P, pids, codes, 60);
}

static const tdm_transport_kind TRANSPORTS[] = {TDM_TRANSPORT_THREAD, TDM_TRANSPORT_SHM, TDM_TRANSPORT_TCP};

static void test_matching_any_source_collectives_split(void) {
  for (int t = 0; t < 3; t++)
    for (int P = 2; P <= 5; P += 3) {
      int codes[8];
      double t0 = tdm_time_now();
      run_job(TRANSPORTS[t], P, basic, 30, codes);
      printf("  %s, %d ranks: %.2f s\n", tdm_transport_name(TRANSPORTS[t]), P, tdm_time_now() - t0);
      for (int r = 0; r < P; r++) CHECK_MSG(codes[r] == 0, "%s P=%d rank %d exit %d", tdm_transport_name(TRANSPORTS[t]), P, r, codes[r]);
    }
}

static void test_mismatches_are_named(void) {
  for (int t = 0; t < 3; t++) {
    int codes[2];
    run_job(TRANSPORTS[t], 2, meets_collective, 10, codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0, "%s: collective met: exits %d %d", tdm_transport_name(TRANSPORTS[t]), codes[0], codes[1]);
    run_job(TRANSPORTS[t], 2, too_big, 10, codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0, "%s: too big: exits %d %d", tdm_transport_name(TRANSPORTS[t]), codes[0], codes[1]);
  }
}

static void test_dead_peer_named_closed_ignored_silence_timed_out(void) {
  for (int t = 1; t < 3; t++) { /* processes only: a thread cannot die alone */
    int codes[3];
    double t0 = tdm_time_now();
    run_job(TRANSPORTS[t], 3, dead_peer, 20, codes);
    double took = tdm_time_now() - t0;
    printf("  %s: dead peer named after %.2f s\n", tdm_transport_name(TRANSPORTS[t]), took);
    CHECK_MSG(codes[0] == 42 && codes[1] == 42 && codes[2] == 128 + SIGKILL, "%s: exits %d %d %d",
              tdm_transport_name(TRANSPORTS[t]), codes[0], codes[1], codes[2]);
    CHECK(took < 10);
  }
  for (int t = 1; t < 3; t++) { /* a lost peer, and the others going on without it */
    int codes[4];
    run_job(TRANSPORTS[t], 4, lossy, 20, codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0 && codes[2] == 0 && codes[3] == 128 + SIGKILL, "%s: lossy: exits %d %d %d %d",
              tdm_transport_name(TRANSPORTS[t]), codes[0], codes[1], codes[2], codes[3]);
  }
  for (int t = 0; t < 3; t++) {
    int codes[3];
    run_job(TRANSPORTS[t], 3, among, 10, codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0 && codes[2] == 0, "%s: among: exits %d %d %d", tdm_transport_name(TRANSPORTS[t]),
              codes[0], codes[1], codes[2]);
    run_job(TRANSPORTS[t], 2, silent, 0.5, codes);
    CHECK_MSG(codes[0] == 0, "%s: exit %d", tdm_transport_name(TRANSPORTS[t]), codes[0]);
  }
}

static void test_bad_arguments(void) {
  void *g;
  CHECK_OK(tdm_comm_thread_group_create(&g, 1));
  tdm_comm_config cfg = {0};
  cfg.size = 1;
  cfg.transport = TDM_TRANSPORT_THREAD;
  cfg.thread_group = g;
  tdm_comm_t c;
  CHECK_OK(tdm_comm_create(&c, &cfg));
  int x = 0;
  CHECK(tdm_comm_tsend(c, 0, 1, &x, 4) == TDM_ERR_INVALID_ARG); /* itself */
  CHECK_ERR_HAS("peer 0 is not another rank");
  CHECK(tdm_comm_trecv(c, 3, 1, &x, 4, NULL, NULL) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_comm_trecv(c, TDM_ANY_SOURCE, -2, &x, 4, NULL, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("tag -2");
  int lost = 5, one[1] = {0}, bad[2] = {0, 0};
  CHECK(tdm_comm_trecv_among_lossy(c, one, 1, 1, &x, 4, NULL, NULL, &lost) == TDM_ERR_INVALID_ARG && lost == -1);
  tdm_comm_t sub = NULL;
  CHECK(tdm_comm_subset(c, bad, 2, &sub) == TDM_ERR_INVALID_ARG && !sub);
  CHECK_ERR_HAS("2 ranks of a communicator of 1");
  CHECK_OK(tdm_comm_subset(c, one, 1, &sub));
  CHECK(sub && tdm_comm_size(sub) == 1);
  tdm_comm_destroy(sub);
  CHECK(tdm_comm_status(c) == TDM_OK); /* argument errors do not fail the communicator */
  tdm_comm_destroy(c);
  tdm_comm_thread_group_destroy(g);
}

/* ---- under mpirun: test_tagged mpi CASE DIR; prints "rank R: CASE: ok" ---- */
static int mpi_main(char **argv) {
  static const struct {
    const char *name;
    rank_fn fn;
    double timeout;
  } cases[] = {{"basic", basic, 20}, {"orders", orders, 20}, {"too-big", too_big, 5}, {"among", among, 10},
               {"silent", silent, 0.5}, {"quiet-peer", quiet_peer, 1},
               {"collective-met", collective_met_mpi, 1}};
  int k = 0, n = (int)(sizeof cases / sizeof cases[0]);
  while (k < n && strcmp(cases[k].name, argv[2])) k++;
  if (k == n) return 2;
  tdm_comm_config cfg;
  if (tdm_comm_config_from_env(&cfg) != TDM_OK) return 90;
  cfg.transport = TDM_TRANSPORT_MPI;
  cfg.timeout_s = cases[k].timeout;
  tdm__mpi_piece_bytes = 1000; /* messages in several pieces, read ahead into the stash too */
  tdm_comm_t c;
  if (tdm_comm_create(&c, &cfg) != TDM_OK) {
    fprintf(stderr, "create: %s\n", tdm_last_error());
    return 90;
  }
  int rank = tdm_comm_rank(c), P = tdm_comm_size(c);
  int rc = cases[k].fn(c, rank, P);
  printf("rank %d: %s: %s\n", rank, argv[2], rc ? "FAIL" : "ok");
  fflush(stdout);
  /* a failed MPI transport aborts the job when destroyed: first let every rank report */
  char path[512];
  snprintf(path, sizeof path, "%s/done.%d", argv[3], rank);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  for (double t0 = tdm_time_now(); tdm_time_now() - t0 < 10;) {
    int m = 0;
    for (int r = 0; r < P; r++) {
      struct stat sb;
      snprintf(path, sizeof path, "%s/done.%d", argv[3], r);
      m += stat(path, &sb) == 0;
    }
    if (m == P) break;
    usleep(10000);
  }
  tdm_comm_destroy(c);
  return rc;
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "mpi")) return mpi_main(argv);
  static const tdm_test_case cases[] = {T(test_matching_any_source_collectives_split), T(test_mismatches_are_named),
                                        T(test_dead_peer_named_closed_ignored_silence_timed_out), T(test_bad_arguments)};
  return tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
}
