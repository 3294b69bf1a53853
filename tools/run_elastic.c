/* tandem run --nnodes MIN:MAX --nproc-per-node K --rdzv-endpoint HOST:PORT: one launcher per
 * node. It meets the others at the rendezvous (src/launch/rdzv.h; it hosts it when it can listen
 * on the endpoint), starts its K ranks for each round with that round's world size and ranks,
 * and when the round stops (a node lost, a node joining, ranks failing) stops them and goes to
 * the next; the program resumes from its checkpoint. Every wait is bounded: the rendezvous by
 * --rdzv-timeout, a silent server by PING_TIMEOUT_S, stopping ranks by STOP_GRACE_S. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "launch/rdzv.h"
#include "run.h"
#include "tandem/core.h"
#include "watch.h"

#define PING_TIMEOUT_S 15.0
#define STOP_GRACE_S 5.0

static volatile sig_atomic_t got_signal;
static void on_signal(int s) { got_signal = s; }

int run_parse_nnodes(const char *s, int *min, int *max) {
  int64_t a, b;
  const char *colon = strchr(s, ':');
  char left[64];
  snprintf(left, sizeof left, "%.*s", colon ? (int)(colon - s) : (int)strlen(s), s);
  if (cli_parse_int(left, 1, 4096, &a) || cli_parse_int(colon ? colon + 1 : left, 1, 4096, &b)) {
    fprintf(stderr, "tandem run: --nnodes '%s': expected N or MIN:MAX, numbers of nodes in 1..4096\n", s);
    return 2;
  }
  if (a > b) {
    fprintf(stderr, "tandem run: --nnodes %s: MIN %lld is above MAX %lld; expected MIN <= MAX\n", s, (long long)a, (long long)b);
    return 2;
  }
  *min = (int)a;
  *max = (int)b;
  return 0;
}

int run_parse_endpoint(const char *s, char *host, size_t n, int *port) {
  const char *colon = strrchr(s, ':');
  int64_t p;
  if (!colon || colon == s || (size_t)(colon - s) >= n || cli_parse_int(colon + 1, 1, 65535, &p)) {
    fprintf(stderr, "tandem run: --rdzv-endpoint '%s': expected HOST:PORT with PORT in 1..65535\n", s);
    return 2;
  }
  snprintf(host, n, "%.*s", (int)(colon - s), s);
  *port = (int)p;
  return 0;
}

/* `tandem train ... --accum N`: the accumulation the user gave (1 when none), so that a keep that
 * cannot work at some world size fails now, not after a node is lost; 0 for another program. */
static int64_t train_accum(char **prog) {
  if (!prog[1] || strcmp(prog[1], "train")) return 0;
  const char *base = strrchr(prog[0], '/');
  base = base ? base + 1 : prog[0];
  if (strcmp(base, "tandem")) return 0;
  int64_t a = 1;
  for (int i = 2; prog[i]; i++) {
    const char *v = !strcmp(prog[i], "--accum") ? prog[i + 1] : !strncmp(prog[i], "--accum=", 8) ? prog[i] + 8 : NULL;
    if (v && cli_parse_int(v, 1, 1 << 20, &a)) return 0; /* tandem train names a bad value itself */
  }
  return a;
}

typedef struct {
  const run_elastic_opts *o;
  char id[300];
  tdm__rdzv_server *srv;
  tdm__rdzv_conn conn;
  int store_fd;
  int64_t store_port;
  char store_addr[64];
  int64_t round, restarts;  /* the last round we took part in, and the restarts then */
  int node_rank, world;
  rank_t ranks[MAX_RANKS];
  int started, alive, stopping, failed;
  double stop_at, heard, pinged;
  char pending[TDM_RDZV_LINE]; /* a ROUND that came while our ranks were still stopping */
  int done_sent, waiting_said;
  int relayed;          /* a rank that exited passing on another's failure, reported once the grace is over, or -1 */
  double relayed_until; /* till then a rank's own failure, here or on another node, is the one reported */
} agent;

/* Hosts the rendezvous if we can listen on the endpoint, then connects to it (ours or another
 * launcher's), until the deadline. Returns 0, or 1 with the error printed. */
static int connect_or_host(agent *a, double deadline) {
  const run_elastic_opts *o = a->o;
  tdm__rdzv_config rc = {o->min_nodes, o->max_nodes, o->local, o->max_restarts, o->timeout_s, o->last_call_s,
                         PING_TIMEOUT_S, o->token};
  double since = tdm_time_now();
  for (;;) {
    if (!a->srv) {
      int err = 0;
      if (tdm__rdzv_serve(&a->srv, o->host, o->port, &rc, &err) == TDM_OK) {
        fprintf(stderr, "tandem run: %s hosts the rendezvous at %s:%d\n", a->id, o->host, o->port);
      } else if (err != EADDRINUSE && err != EADDRNOTAVAIL) {
        fprintf(stderr, "tandem run: cannot host the rendezvous at %s:%d (--rdzv-endpoint): %s\n", o->host, o->port,
                tdm_last_error());
        return 1;
      }
    }
    double now = tdm_time_now(), until = a->srv || now + 1 > deadline ? deadline : now + 1;
    tdm_status st = tdm__rdzv_connect(&a->conn, o->host, o->port, o->token, since, until);
    if (st == TDM_OK) break;
    int retry = st == TDM_ERR_TIMEOUT && !a->srv && tdm_time_now() < deadline && !got_signal &&
                strstr(tdm_last_error(), "did not answer within"); /* nothing listens: a survivor may be taking over */
    if (!retry) {
      fprintf(stderr, "tandem run: %s\n", tdm_last_error());
      return 1;
    }
  }
  a->heard = a->pinged = tdm_time_now();
  if (a->store_fd < 0) { /* the address the others reach us by: the one we reach the rendezvous from */
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    if (getsockname(a->conn.fd, (struct sockaddr *)&sa, &len) != 0 ||
        !inet_ntop(AF_INET, &sa.sin_addr, a->store_addr, sizeof a->store_addr))
      snprintf(a->store_addr, sizeof a->store_addr, "127.0.0.1");
    a->store_port = 0;
    if ((a->store_fd = run_store_socket(a->store_addr, 1, &a->store_port)) < 0) return 1;
  }
  if (tdm__rdzv_send(&a->conn, "JOIN %s %d %d %d %lld %lld %s %lld", a->id, o->min_nodes, o->max_nodes, o->local,
                     (long long)a->round, (long long)a->restarts, a->store_addr, (long long)a->store_port) != TDM_OK) {
    fprintf(stderr, "tandem run: joining the rendezvous at %s:%d: %s\n", o->host, o->port, tdm_last_error());
    return 1;
  }
  return 0;
}

static void stop_ranks(agent *a, int sig) {
  if (a->alive <= 0 || a->stopping) return;
  run_signal_ranks(a->ranks, a->started, sig, 0);
  a->stopping = 1;
  a->stop_at = tdm_time_now() + STOP_GRACE_S;
}

/* ROUND <round> <nodes> <node rank> <world> <master addr> <master port> <restarts>: start ours. */
static int start_round(agent *a, const char *line) {
  const run_elastic_opts *o = a->o;
  long long r, rs;
  int nn, nr, world, mport;
  char maddr[64];
  if (sscanf(line, "ROUND %lld %d %d %d %63s %d %lld", &r, &nn, &nr, &world, maddr, &mport, &rs) != 7) {
    fprintf(stderr, "tandem run: the rendezvous sent a malformed round: '%.80s'\n", line);
    return 1;
  }
  a->round = r;
  a->restarts = rs;
  a->node_rank = nr;
  a->world = world;
  a->done_sent = a->failed = a->waiting_said = 0;
  a->relayed = -1;
  int first = nr * o->local;
  fprintf(stderr, "tandem run: round %lld: %d node%s, world size %d; this node is node %d (ranks %d..%d); "
                  "--elastic-batch %s at %d of %d ranks\n",
          r, nn, nn == 1 ? "" : "s", world, nr, first, first + o->local - 1, o->scale_lr ? "scale-lr" : "keep", world,
          o->max_nodes * o->local);
  if (rs) fprintf(stderr, "tandem run: this is restart %lld of at most %lld (--max-restarts)\n", rs, (long long)o->max_restarts);
  char v_world[16], v_local_world[16], v_group[16], v_port[16], v_store[16], v_attempt[24], v_full[16], token[1100];
  snprintf(v_world, sizeof v_world, "%d", world);
  snprintf(v_local_world, sizeof v_local_world, "%d", o->local);
  snprintf(v_group, sizeof v_group, "%d", nr);
  snprintf(v_port, sizeof v_port, "%d", mport);
  snprintf(v_store, sizeof v_store, "%d", a->store_fd);
  snprintf(v_attempt, sizeof v_attempt, "%lld", rs);
  snprintf(v_full, sizeof v_full, "%d", o->max_nodes * o->local);
  snprintf(token, sizeof token, "%.900s.r%lld", o->token, r); /* a stale rank of an earlier round is refused */
  memset(a->ranks, 0, sizeof a->ranks);
  a->started = a->alive = a->stopping = 0;
  for (int i = 0; i < o->local; i++) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      fprintf(stderr, "tandem run: cannot start rank %d: pipe: %s\n", first + i, strerror(errno));
      a->failed = 1;
      break;
    }
    char v_rank[16], v_local[16];
    snprintf(v_rank, sizeof v_rank, "%d", first + i);
    snprintf(v_local, sizeof v_local, "%d", i);
    int host = nr == 0 && i == 0;
    const char *env[] = {"RANK", v_rank, "WORLD_SIZE", v_world, "LOCAL_RANK", v_local, "LOCAL_WORLD_SIZE", v_local_world,
                         "GROUP_RANK", v_group, "MASTER_ADDR", maddr, "MASTER_PORT", v_port, "TANDEM_JOB_TOKEN", token,
                         "TANDEM_RESTART_COUNT", v_attempt, "TANDEM_ELASTIC_BATCH", o->scale_lr ? "scale-lr" : "keep",
                         "TANDEM_ELASTIC_FULL_WORLD", v_full, host ? "TANDEM_STORE_FD" : NULL, v_store, NULL};
    pid_t pid = fork();
    if (pid == 0) run_start_rank(o->prog, p[1], host ? a->store_fd : -1, getppid(), env);
    close(p[1]);
    if (pid < 0) {
      fprintf(stderr, "tandem run: cannot start rank %d: fork: %s\n", first + i, strerror(errno));
      close(p[0]);
      a->failed = 1;
      break;
    }
    setpgid(pid, pid);
    a->ranks[i].pid = pid;
    a->ranks[i].fd = p[0];
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    a->started++;
    a->alive++;
  }
  if (a->failed) stop_ranks(a, SIGTERM);
  return 0;
}

/* Rank i of this node failed: say so, stop the others, tell the rendezvous (it restarts the round). */
static void report_failure(agent *a, int i) {
  rank_t *r = &a->ranks[i];
  int first = a->node_rank * a->o->local;
  a->failed = 1;
  char what[200];
  snprintf(what, sizeof what, "rank %d %s %d%s", first + i, r->sig ? "was killed by signal" : "exited with code",
           r->sig ? r->sig : r->code, run_fail_weight(r) == 1 ? " (passing on another rank's failure)" : "");
  fprintf(stderr, "tandem run: %s; stopping this node's other ranks\n", what);
  int from = r->ntail > TAIL_LINES ? r->ntail - TAIL_LINES : 0;
  for (int j = from; j < r->ntail; j++) fprintf(stderr, "  | %s\n", r->tail[j % TAIL_LINES]);
  stop_ranks(a, SIGTERM);
  tdm__rdzv_send(&a->conn, "FAIL %lld %s", (long long)a->round, what);
}

/* Output, exits, and the stop's deadline of our ranks. */
static void tend_ranks(agent *a) {
  int first = a->node_rank * a->o->local;
  for (int i = 0; i < a->started; i++)
    if (!a->ranks[i].done) run_drain(&a->ranks[i], first + i, 0);
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
    for (int i = 0; i < a->started; i++) {
      rank_t *r = &a->ranks[i];
      if (r->pid != pid) continue;
      run_drain(r, first + i, 1);
      run_remove_segments_of(pid);
      if (r->fd >= 0) close(r->fd), r->fd = -1;
      r->done = 1;
      r->code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      r->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      a->alive--;
      int w = run_fail_weight(r);
      if (!w || a->stopping || a->failed) continue;
      /* a rank that relayed another's failure waits a grace for one that failed of its own */
      if (w == 1 && a->relayed < 0) a->relayed = i, a->relayed_until = tdm_time_now() + RUN_RELAY_GRACE_S;
      if (w > 1) report_failure(a, i);
    }
  if (a->relayed >= 0 && !a->failed && !a->stopping && (a->alive == 0 || tdm_time_now() > a->relayed_until))
    report_failure(a, a->relayed);
  if (a->stopping && a->alive > 0 && tdm_time_now() > a->stop_at) run_signal_ranks(a->ranks, a->started, SIGKILL, 1);
  if (a->started > 0 && a->alive == 0 && !a->stopping && !a->failed && !a->done_sent) {
    a->done_sent = 1;
    fprintf(stderr, "tandem run: this node's ranks finished; waiting for the others\n");
    tdm__rdzv_send(&a->conn, "DONE %lld", (long long)a->round);
  }
}

/* Waits (bounded by the grace) until our ranks are gone. */
static void reap_all(agent *a) {
  stop_ranks(a, SIGTERM);
  while (a->alive > 0) {
    usleep(20000);
    tend_ranks(a);
  }
}

static int finish(agent *a, int code) {
  reap_all(a);
  tdm__rdzv_close(&a->conn);
  tdm__rdzv_server_stop(a->srv); /* a host waits (3 s at most) for the others to hear the end */
  if (a->store_fd >= 0) close(a->store_fd);
  return code;
}

int run_elastic(const run_elastic_opts *o) {
  static agent ag;
  agent *a = &ag;
  memset(a, 0, sizeof *a);
  a->o = o;
  a->conn.fd = a->store_fd = -1;
  a->relayed = -1;
  a->node_rank = 0;
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  snprintf(a->id, sizeof a->id, "%.200s:%d", host, (int)getpid());
  int64_t accum = train_accum(o->prog);
  if (!strcmp(o->prog[0], "tandem")) o->prog[0] = (char *)run_self_exe();
  if (accum && !o->scale_lr) /* keep must work at every world size the job can have */
    for (int n = o->min_nodes; n <= o->max_nodes; n++)
      if ((accum * o->max_nodes) % n) {
        fprintf(stderr, "tandem run: --elastic-batch keep: the global batch of the full job (%d nodes, --accum %lld) "
                        "cannot be kept on %d node%s: accumulation %lld x %d / %d is not a whole number; choose an --accum "
                        "that every node count in %d..%d divides into, or --elastic-batch scale-lr\n",
                o->max_nodes, (long long)accum, n, n == 1 ? "" : "s", (long long)accum, o->max_nodes, n, o->min_nodes,
                o->max_nodes);
        return 2;
      }
  pid_t self = getpid();
  char v_pid[32], v_start[32], v_threads[32];
  snprintf(v_pid, sizeof v_pid, "%d", (int)self);
  snprintf(v_start, sizeof v_start, "%llu", watch_start_time(self));
  setenv("TANDEM_LAUNCHER_PID", v_pid, 1);
  setenv("TANDEM_LAUNCHER_START", v_start, 1);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(v_threads, sizeof v_threads, "%ld", cores / o->local > 0 ? cores / o->local : 1);
  setenv("TANDEM_NUM_THREADS", v_threads, 0);
  setenv("OMP_NUM_THREADS", v_threads, 0);
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (connect_or_host(a, tdm_time_now() + o->timeout_s)) return finish(a, 1);
  char line[TDM_RDZV_LINE];
  for (;;) {
    struct pollfd pf[1 + MAX_RANKS];
    int n = 0;
    pf[n++] = (struct pollfd){a->conn.fd, POLLIN, 0};
    for (int i = 0; i < a->started; i++) pf[n++] = (struct pollfd){a->ranks[i].fd, POLLIN, 0};
    poll(pf, (nfds_t)n, 100);
    tend_ranks(a);
    if (got_signal) {
      fprintf(stderr, "tandem run: stopped by signal %d (%s); this node's ranks were stopped and it left the job\n",
              (int)got_signal, strsignal(got_signal));
      return finish(a, 128 + got_signal);
    }
    int r, lost = 0;
    while ((r = tdm__rdzv_recv_line(&a->conn, line, sizeof line)) == 1) {
      a->heard = tdm_time_now();
      if (!strcmp(line, "PING")) continue;
      if (!strncmp(line, "ROUND ", 6)) {
        if (a->alive > 0) memcpy(a->pending, line, sizeof a->pending); /* after ours have stopped */
        else if (start_round(a, line)) return finish(a, 1);
      } else if (!strncmp(line, "STOP ", 5)) {
        const char *why = strchr(line + 5, ' ');
        fprintf(stderr, "tandem run: round %lld stops: %s; stopping this node's ranks for the next round\n",
                (long long)a->round, why ? why + 1 : "");
        a->pending[0] = 0;
        stop_ranks(a, SIGTERM);
      } else if (!strncmp(line, "WAIT ", 5)) {
        if (!a->waiting_said++) fprintf(stderr, "tandem run: %s: %s\n", a->id, line + 5);
      } else if (!strcmp(line, "FINISH")) {
        fprintf(stderr, "tandem run: the job finished (round %lld, world size %d)\n", (long long)a->round, a->world);
        return finish(a, 0);
      } else if (!strncmp(line, "ABORT ", 6) || !strncmp(line, "REFUSE ", 7)) {
        int refused = line[0] == 'R';
        fprintf(stderr, "tandem run: %s: %s\n", refused ? "the rendezvous refused this launcher" : "the job failed",
                line + (refused ? 7 : 6));
        return finish(a, refused ? 2 : 1);
      }
    }
    if (r < 0 || tdm_time_now() - a->heard > PING_TIMEOUT_S) lost = 1;
    else if (tdm_time_now() - a->pinged >= 1) {
      if (tdm__rdzv_send(&a->conn, "PING") != TDM_OK) lost = 1;
      a->pinged = tdm_time_now();
    }
    if (lost) { /* the host is gone: ours stop, then one of us takes over or we reconnect */
      if (a->done_sent && a->alive == 0) {
        fprintf(stderr, "tandem run: this node's ranks finished and the rendezvous closed; done\n");
        return finish(a, 0);
      }
      fprintf(stderr, "tandem run: lost the rendezvous at %s:%d (its host is gone); stopping this node's ranks and "
                      "joining again\n", o->host, o->port);
      reap_all(a);
      tdm__rdzv_close(&a->conn);
      tdm__rdzv_server_stop(a->srv);
      a->srv = NULL;
      a->pending[0] = 0;
      a->started = 0;
      if (connect_or_host(a, tdm_time_now() + o->timeout_s)) return finish(a, 1);
      continue;
    }
    if (a->pending[0] && a->alive == 0) {
      char l[TDM_RDZV_LINE];
      memcpy(l, a->pending, sizeof l);
      a->pending[0] = 0;
      if (start_round(a, l)) return finish(a, 1);
    }
  }
}
