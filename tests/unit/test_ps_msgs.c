/* The parameter server's checks on what a worker sends, with a real server (tdm_ps_serve) and a
 * hand-made worker on the thread transport: a well-formed push is applied and answered (the
 * shard's new values, checksum and staleness in the answer); a push for keys the server does not
 * own, one whose payload fails its checksum, a truncated one and one with a bad magic each stop
 * the server naming the worker and the fault, with nothing applied (the update log stays empty),
 * and the worker waiting for its answer learns the server's reason. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "parallel/ps_msg.h"
#include "tandem/tandem.h"
#include "tdm_test.h"

typedef enum { GOOD, OTHER_KEYS, CORRUPT, TRUNCATED, BAD_MAGIC } fault;

typedef struct {
  void *group;
  int rank;
  fault f;
  const char *log_dir;
  tdm_status st;
  char err[1024];
  float first_after; /* worker: parameter 0 after its push (GOOD) */
  int64_t stale;
  tdm_ps_server_stats stats;
} arg;

static tdm_model_config tiny(void) {
  tdm_model_config mc = tdm_model_config_mlp();
  mc.in_features = 6, mc.n_classes = 3, mc.n_hidden = 1, mc.hidden[0] = 4, mc.dropout = 0;
  return mc;
}

static void *rank_main(void *v) {
  arg *a = v;
  tdm_comm_config cfg = {0};
  cfg.rank = a->rank, cfg.size = 2, cfg.transport = TDM_TRANSPORT_THREAD, cfg.thread_group = a->group, cfg.timeout_s = 10;
  tdm_comm_t c;
  if ((a->st = tdm_comm_create(&c, &cfg)) != TDM_OK) return NULL;
  tdm_model_config mc = tiny();
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_SGD);
  oc.lr = 0.5f;
  tdm_engine_ps_config pc = {.servers = 1, .mode = TDM_PS_ASYNC, .world = c, .delay_worker = -1, .log_dir = a->log_dir};
  if (a->rank == 1) {
    a->st = tdm_ps_serve(&mc, 7, &oc, &pc, &a->stats);
    snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
    tdm_comm_destroy(c);
    return NULL;
  }
  /* the worker: the whole model is the server's one shard */
  int64_t n = 6 * 4 + 4 + 4 * 3 + 3;
  float buf[64 + 16] = {0}, *g = (float *)((char *)buf + sizeof(tdm__ps_msg));
  for (int64_t i = 0; i < n; i++) g[i] = 1.0f;
  tdm__ps_msg m = {TDM_PS_MAGIC, TDM_PS_PUSH, 0, 0, 0, n, 0.5f, 0, tdm__ps_sum(g, n)};
  size_t bytes = sizeof m + sizeof(float) * (size_t)n;
  if (a->f == OTHER_KEYS) m.lo = 1, m.hi = n + 1;
  if (a->f == CORRUPT) g[3] = 2.0f; /* after the checksum */
  if (a->f == TRUNCATED) bytes -= 4;
  if (a->f == BAD_MAGIC) m.magic = 0x12345678u;
  memcpy(buf, &m, sizeof m);
  a->st = tdm_comm_tsend(c, 1, TDM_PS_TAG_TO_SERVER, buf, bytes);
  size_t got = 0;
  if (a->st == TDM_OK) a->st = tdm_comm_trecv(c, 1, TDM_PS_TAG_TO_WORKER, buf, sizeof buf, NULL, &got);
  snprintf(a->err, sizeof a->err, "%s", tdm_last_error());
  if (a->st == TDM_OK) {
    memcpy(&m, buf, sizeof m);
    a->first_after = got == sizeof m + sizeof(float) * (size_t)n && m.kind == TDM_PS_PARAMS && m.sum == tdm__ps_sum(g, n) ? g[0] : NAN;
    a->stale = (int64_t)m.lr;
    tdm__ps_msg done = {TDM_PS_MAGIC, TDM_PS_DONE, 1, 0, 0, 0, 0, 0, tdm__ps_sum(NULL, 0)};
    a->st = tdm_comm_tsend(c, 1, TDM_PS_TAG_TO_SERVER, &done, sizeof done);
  }
  tdm_comm_destroy(c);
  return NULL;
}

static void run(fault f, const char *log_dir, arg *out) {
  void *g;
  CHECK_OK(tdm_comm_thread_group_create(&g, 2));
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    out[r] = (arg){.group = g, .rank = r, .f = f, .log_dir = log_dir, .st = TDM_ERR_INTERNAL};
    pthread_create(&th[r], NULL, rank_main, &out[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(g);
}

static long log_size(const char *dir) {
  char p[512];
  snprintf(p, sizeof p, "%s/ps-server-0.log", dir);
  FILE *f = fopen(p, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  return n;
}

static void test_good_push_applied(void) {
  arg a[2];
  char dir[] = "/tmp/tdm-psmsg-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  /* the value parameter 0 starts with, from the same seed */
  tdm_model_config mc = tiny();
  tdm_model *model;
  CHECK_OK(tdm_model_create(&model, &mc, 7));
  float p0 = tdm_params_data(tdm_model_params(model))[0];
  tdm_model_destroy(model);
  run(GOOD, dir, a);
  CHECK_MSG(a[0].st == TDM_OK && a[1].st == TDM_OK, "worker %s: %s; server %s: %s", tdm_status_str(a[0].st), a[0].err,
            tdm_status_str(a[1].st), a[1].err);
  CHECK_NEAR(a[0].first_after, p0 - 0.5f * 1.0f, 0); /* SGD: p - lr * g, exactly */
  CHECK(a[0].stale == 0 && a[1].stats.updates == 1 && a[1].stats.pushes == 1);
  long one = log_size(dir);
  CHECK(one > 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

static void test_bad_pushes_named_not_applied(void) {
  struct {
    fault f;
    tdm_status st;
    const char *says;
  } cases[] = {
      {OTHER_KEYS, TDM_ERR_INVALID_ARG, "worker 0 pushed a gradient for another key range: keys [1, 44) are not this server's"},
      {CORRUPT, TDM_ERR_REMOTE, "worker 0 sent a push whose checksum does not match its data (corrupt; not applied)"},
      {TRUNCATED, TDM_ERR_REMOTE, "worker 0 sent a truncated push (not applied): 224 bytes where the shard needs 228"},
      {BAD_MAGIC, TDM_ERR_REMOTE, "worker 0 sent a malformed message (not a push): not applied"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    arg a[2];
    char dir[] = "/tmp/tdm-psmsg-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    run(cases[k].f, dir, a);
    printf("  server: %s\n  worker: %.200s\n", a[1].err, a[0].err);
    CHECK_MSG(a[1].st == cases[k].st && strstr(a[1].err, cases[k].says) &&
                  strstr(a[1].err, "parameter server 0 (rank 1, keys [0, 43))"),
              "case %zu: server %s: %s", k, tdm_status_str(a[1].st), a[1].err);
    CHECK_MSG(a[0].st != TDM_OK && strstr(a[0].err, cases[k].says), "case %zu: the worker got %s: %s", k,
              tdm_status_str(a[0].st), a[0].err);
    CHECK(a[1].stats.updates == 0);
    long hdr_only = log_size(dir); /* the log's header, no record */
    arg b[2];
    char dir2[] = "/tmp/tdm-psmsg-XXXXXX";
    CHECK(mkdtemp(dir2) != NULL);
    run(GOOD, dir2, b);
    CHECK_MSG(hdr_only >= 0 && hdr_only < log_size(dir2), "case %zu: the log holds %ld bytes; one update makes %ld", k,
              hdr_only, log_size(dir2));
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, dir2);
    CHECK(system(cmd) == 0);
  }
}

int main(void) {
  static const tdm_test_case cases[] = {T(test_good_push_applied), T(test_bad_pushes_named_not_applied)};
  return tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
}
