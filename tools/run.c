/* tandem run: starts N ranks of a program on this node with the torchrun environment, prefixes
 * their output with the rank, forwards SIGINT/SIGTERM/SIGHUP, and when a rank fails stops the
 * others and says which rank failed first, how, and what it printed last. Ranks die with it:
 * each gets a parent-death signal, and every tandem process below it watches it (watch.h). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "comm/net.h"
#include "run.h"
#include "run_status.h"
#include "tandem/core.h"
#include "watch.h"

static volatile sig_atomic_t got_signal;
static void on_signal(int s) { got_signal = s; }

/* Whether a process is stopped by a signal (state T in /proc/PID/stat). Not t, a tracing stop: a
 * debugger's, or LeakSanitizer's, which stops a sanitized rank's threads to scan them as it exits. */
static int run_is_stopped(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
  return p && p[1] == ' ' && p[2] == 'T';
}

/* The store's listening socket, opened here and inherited by rank 0 (TANDEM_STORE_FD): no other
 * job can take the port between choosing it and using it. It listens on the master address
 * only (loopback stays loopback). port 0: any free one. Returns the fd (close-on-exec). */
int run_store_socket(const char *master, int64_t nnodes, int64_t *port) {
  int fd = -1, got = 0;
  if (tdm__net_listen(master, (int)*port, &fd, &got) != TDM_OK) {
    fprintf(stderr, "tandem run: cannot listen for the rendezvous store: %s (is --master-addr an address of this "
                    "node, and --master-port free?)\n", tdm_last_error());
    return -1;
  }
  *port = got;
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;
  char ip[INET_ADDRSTRLEN] = "";
  if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0) inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  if (nnodes > 1 && !strncmp(ip, "127.", 4) && strncmp(master, "127.", 4) && strcmp(master, "localhost"))
    fprintf(stderr, "tandem run: warning: --master-addr %s is %s on this node, a loopback address: ranks on other nodes "
                    "cannot reach the store; give an address of a network interface\n", master, ip);
  return fd;
}

static void make_token(char *out, size_t n) {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
    uint64_t x = tdm_hash64((uint64_t)getpid(), (uint64_t)time(NULL));
    memcpy(b, &x, 8);
    memcpy(b + 8, &x, 8);
  }
  if (fd >= 0) close(fd);
  for (int i = 0; i < 16 && 2 * i + 2 < (int)n; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Writes a line to the rank's log; the first failure is reported at once and ends the run
 * with a non-zero status, but the rank goes on (its output still reaches our stdout). */
static void log_line(rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(rank_t *r, const char *fmt, ...) {
  if (!r->log || r->log_failed) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(r->log, fmt, ap);
  va_end(ap);
  if (fflush(r->log) != 0 || ferror(r->log)) {
    r->log_failed = errno ? errno : EIO;
    fprintf(stderr, "tandem run: cannot write %s: %s; its log is incomplete\n", r->log_path, strerror(r->log_failed));
  }
}

static void emit_line(rank_t *r, int idx, const char *line, size_t n) {
  printf("[rank %d] %.*s\n", idx, (int)n, line);
  log_line(r, "%.*s\n", (int)n, line);
  int keep = n < sizeof r->tail[0] - 1 ? (int)n : (int)sizeof r->tail[0] - 1;
  memcpy(r->tail[r->ntail % TAIL_LINES], line, (size_t)keep);
  r->tail[r->ntail % TAIL_LINES][keep] = 0;
  r->ntail++;
}

/* Reads what the rank wrote; at EOF (or a read error) closes its pipe, so poll does not spin on
 * a rank that closed its output but runs on. final: also flush a last line without newline. */
void run_drain(rank_t *r, int idx, int final) {
  while (r->fd >= 0) {
    ssize_t k = read(r->fd, r->partial + r->plen, sizeof r->partial - r->plen);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) break;
    if (k <= 0) {
      if (k < 0) fprintf(stderr, "tandem run: reading the output of rank %d: %s\n", idx, strerror(errno));
      close(r->fd);
      r->fd = -1;
      break;
    }
    r->plen += (size_t)k;
    char *s = r->partial, *nl;
    while ((nl = memchr(s, '\n', r->plen - (size_t)(s - r->partial)))) {
      emit_line(r, idx, s, (size_t)(nl - s));
      s = nl + 1;
    }
    r->plen -= (size_t)(s - r->partial);
    memmove(r->partial, s, r->plen);
    if (r->plen == sizeof r->partial) { /* a very long line: print it as it is */
      emit_line(r, idx, r->partial, r->plen);
      r->plen = 0;
    }
  }
  if ((final || r->fd < 0) && r->plen) {
    emit_line(r, idx, r->partial, r->plen);
    r->plen = 0;
  }
  fflush(stdout);
}

const char *run_self_exe(void) {
  static char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "tandem";
  buf[n] = 0;
  return buf;
}

/* Checks --log-dir and opens every rank's log before any rank starts. Returns 0 or 2. */
static int open_logs(const char *dir, rank_t *ranks, int n, int64_t first_rank) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "tandem run: cannot create --log-dir %s: %s\n", dir, strerror(errno));
    return 2;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "tandem run: --log-dir %s is not a directory\n", dir);
    return 2;
  }
  for (int i = 0; i < n; i++) {
    rank_t *r = &ranks[i];
    snprintf(r->log_path, sizeof r->log_path, "%s/rank-%lld.log", dir, (long long)(first_rank + i));
    r->log = fopen(r->log_path, "we"); /* close-on-exec: no rank inherits another's log */
    if (!r->log) {
      fprintf(stderr, "tandem run: cannot open the log %s for writing (--log-dir): %s\n", r->log_path, strerror(errno));
      for (int j = 0; j < i; j++) fclose(ranks[j].log), ranks[j].log = NULL;
      return 2;
    }
  }
  return 0;
}

int run_fail_weight(const rank_t *r) {
  if (r->sig) return 3;
  if (!r->code) return 0;
  return r->code == TANDEM_EXIT_RELAYED ? 1 : 2;
}

void run_signal_ranks(rank_t *ranks, int n, int sig, int group) {
  for (int i = 0; i < n; i++) {
    if (ranks[i].done || ranks[i].pid <= 0) continue;
    if (group) kill(-ranks[i].pid, sig);
    kill(ranks[i].pid, sig);
  }
}

/* A shm segment (/tandem-<creator pid>-...) is unlinked once every rank mapped it; a rank killed
 * before that leaves it behind. Once the creator is reaped no new rank can join it, so it goes. */
void run_remove_segments_of(pid_t pid) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  char prefix[64], shared[64]; /* the transport's segment, and a shared buffer's (src/comm/transport/shm.c) */
  int n = snprintf(prefix, sizeof prefix, "tandem-%d-", (int)pid), m = snprintf(shared, sizeof shared, "tandem-r-%d-", (int)pid);
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, (size_t)n) == 0 || strncmp(e->d_name, shared, (size_t)m) == 0) {
      char path[512];
      snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
      unlink(path);
    }
  closedir(d);
}

/* The child's side of fork: environment, output, then exec. Never returns. */
_Noreturn void run_start_rank(char **prog, int out_fd, int store_fd, pid_t launcher, const char *const *env) {
  setpgid(0, 0);
  /* die with the launcher; if it died before this line, we are already orphaned */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) raise(SIGKILL);
  dup2(out_fd, 1);
  dup2(out_fd, 2);
  for (int i = 0; env[i]; i += 2) setenv(env[i], env[i + 1], 1);
  if (store_fd >= 0) fcntl(store_fd, F_SETFD, 0); /* rank 0 serves the store on the socket we opened */
  else unsetenv("TANDEM_STORE_FD");
  execvp(prog[0], prog);
  fprintf(stderr, "tandem run: cannot start %s: %s\n", prog[0], strerror(errno));
  _exit(127);
}

int tool_run(int argc, char **argv) {
  int dash = -1;
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--")) {
      dash = i;
      break;
    }
  int64_t n = 0, port = 0, nnodes = 1, node_rank = 0, max_restarts = 0, nproc_per_node = 0;
  const char *log_dir = NULL, *master = NULL, *nnodes_s = NULL, *endpoint = NULL, *rdzv_id = NULL, *elastic_batch = NULL;
  double rdzv_timeout = 0, last_call = 0, status_every = 0;
  int keep_going = 0;
  cli_opt opts[] = {
      {"nproc", CLI_INT, &n, "1", "ranks to start on this node (also -n)", NULL, 1, MAX_RANKS, 0},
      {"nnodes", CLI_STRING, &nnodes_s, "1", "nodes in the job: N (one launcher per node, each with --node-rank, the same --master-addr, --master-port and TANDEM_JOB_TOKEN), or MIN:MAX for an elastic job (with --rdzv-endpoint)", NULL, 0, 0, 0},
      {"nproc-per-node", CLI_INT, &nproc_per_node, "0", "elastic: ranks on each node (the same on every node; --nproc too)", NULL, 0, MAX_RANKS, 0},
      {"rdzv-endpoint", CLI_STRING, &endpoint, NULL, "elastic: HOST:PORT where the launchers meet (the first launcher that can listen there hosts it)", NULL, 0, 0, 0},
      {"rdzv-id", CLI_STRING, &rdzv_id, "tandem", "elastic: the job's token; launchers with another are refused", NULL, 0, 0, 0},
      {"rdzv-timeout", CLI_FLOAT, &rdzv_timeout, "60", "elastic: seconds to reach the rendezvous, and to wait for MIN nodes before the job fails", NULL, 0.1, 86400, 0},
      {"rdzv-last-call", CLI_FLOAT, &last_call, "2", "elastic: once MIN nodes joined the first round, seconds to wait for more (up to MAX)", NULL, 0, 3600, 0},
      {"elastic-batch", CLI_CHOICE, &elastic_batch, "keep", "elastic: when the world size changes, keep the global batch by adjusting --accum, or keep the per-rank batch and scale --lr with the global batch", "keep|scale-lr", 0, 0, 0},
      {"node-rank", CLI_INT, &node_rank, "0", "this node's index", NULL, 0, 4095, 0},
      {"master-addr", CLI_STRING, &master, "127.0.0.1", "address of the node that hosts rank 0 (the store listens there only)", NULL, 0, 0, 0},
      {"master-port", CLI_INT, &port, "0", "rendezvous port (0: a free port; set it for several nodes)", NULL, 0, 65535, 0},
      {"log-dir", CLI_STRING, &log_dir, NULL, "also write each rank's output to DIR/rank-N.log", NULL, 0, 0, 0},
      {"status-every", CLI_FLOAT, &status_every, "0", "every SEC seconds, print one line per rank (step, loss, throughput, step time and its parts, communication share) and the slowest rank (0: off)", NULL, 0, 86400, 0},
      {"keep-going", CLI_FLAG, &keep_going, NULL, "a rank that fails does not stop the others (a parameter server's async or ssp workers go on without a lost one); the exit status is still the first failure's", NULL, 0, 0, 0},
      {"max-restarts", CLI_INT, &max_restarts, "0", "restart the whole group this many times after a failure (the program resumes from its checkpoint); elastic: restarts for any reason (a node lost or joining, ranks failing), default 3", NULL, 0, 1000, 0},
  };
  int nopt = (int)(sizeof opts / sizeof opts[0]);
  int n_ours = dash >= 0 ? dash : argc;
  char **ours = malloc(sizeof(char *) * (size_t)(n_ours + 1));
  if (!ours) {
    fprintf(stderr, "tandem run: out of memory\n");
    return 1;
  }
  for (int i = 0; i < n_ours; i++) ours[i] = strcmp(argv[i], "-n") ? argv[i] : "--nproc"; /* -n N is --nproc N */
  int r = cli_parse("run", "-n N [options] -- PROGRAM [ARGS...]\n       tandem run --nnodes MIN:MAX --nproc-per-node K --rdzv-endpoint HOST:PORT [options] -- PROGRAM [ARGS...]  (elastic; one launcher per node)", opts, nopt, n_ours, ours);
  free(ours);
  if (r == 1) return 0;
  if (r) return 2;
  if (dash < 0 || dash + 1 >= argc) {
    fprintf(stderr, "tandem run: no program given; usage: tandem run -n N [options] -- PROGRAM [ARGS...]\n");
    return 2;
  }
  int elastic = strchr(nnodes_s, ':') || endpoint;
  if (elastic) {
    run_elastic_opts eo = {0};
    for (int i = 0; i < nopt; i++) {
      const char *nm = opts[i].name;
      if (opts[i].seen && !strcmp(nm, "status-every")) {
        fprintf(stderr, "tandem run: --status-every is not built for an elastic job yet (--nnodes MIN:MAX, --rdzv-endpoint)\n");
        return 2;
      }
      if (opts[i].seen && (!strcmp(nm, "node-rank") || !strcmp(nm, "master-addr") || !strcmp(nm, "master-port") || !strcmp(nm, "log-dir"))) {
        fprintf(stderr, "tandem run: --%s does not apply to an elastic job (--nnodes MIN:MAX, --rdzv-endpoint): the "
                        "rendezvous assigns node ranks and the master\n", nm);
        return 2;
      }
    }
    if (nproc_per_node && cli_seen(opts, nopt, "nproc") && nproc_per_node != n) {
      fprintf(stderr, "tandem run: --nproc-per-node %lld and --nproc %lld disagree\n", (long long)nproc_per_node, (long long)n);
      return 2;
    }
    eo.local = (int)(nproc_per_node ? nproc_per_node : n);
    if (run_parse_nnodes(nnodes_s, &eo.min_nodes, &eo.max_nodes)) return 2;
    if (!endpoint) {
      fprintf(stderr, "tandem run: --nnodes %s is an elastic job: give --rdzv-endpoint HOST:PORT (the same on every node)\n", nnodes_s);
      return 2;
    }
    if (run_parse_endpoint(endpoint, eo.host, sizeof eo.host, &eo.port)) return 2;
    eo.token = rdzv_id;
    eo.timeout_s = rdzv_timeout;
    eo.last_call_s = last_call;
    eo.max_restarts = cli_seen(opts, nopt, "max-restarts") ? max_restarts : 3; /* every restart counts: lost, joined, failed */
    eo.scale_lr = !strcmp(elastic_batch, "scale-lr");
    eo.prog = argv + dash + 1;
    return run_elastic(&eo);
  }
  if (cli_seen(opts, nopt, "elastic-batch") || cli_seen(opts, nopt, "rdzv-id") || cli_seen(opts, nopt, "rdzv-timeout") ||
      cli_seen(opts, nopt, "rdzv-last-call") || nproc_per_node) {
    fprintf(stderr, "tandem run: --nproc-per-node, --rdzv-id, --rdzv-timeout, --rdzv-last-call and --elastic-batch apply to an "
                    "elastic job (--nnodes MIN:MAX --rdzv-endpoint HOST:PORT)\n");
    return 2;
  }
  if (cli_parse_int(nnodes_s, 1, 4096, &nnodes)) {
    fprintf(stderr, "tandem run: --nnodes '%s': expected a number of nodes in 1..4096, or MIN:MAX\n", nnodes_s);
    return 2;
  }
  if (node_rank >= nnodes) {
    fprintf(stderr, "tandem run: --node-rank %lld is not below --nnodes %lld\n", (long long)node_rank, (long long)nnodes);
    return 2;
  }
  if (nnodes > 1 && port == 0) {
    fprintf(stderr, "tandem run: with --nnodes > 1, give every node the same --master-port\n");
    return 2;
  }
  if (nnodes > 1 && !(getenv("TANDEM_JOB_TOKEN") && *getenv("TANDEM_JOB_TOKEN"))) {
    /* each launcher would make its own, and the nodes' ranks would refuse each other's handshakes */
    fprintf(stderr, "tandem run: with --nnodes > 1, set the same TANDEM_JOB_TOKEN on every node (a secret the job's "
                    "ranks prove to each other, e.g. export TANDEM_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' '))\n");
    return 2;
  }
  static rank_t ranks[MAX_RANKS];
  int N = (int)n;
  static run_status rstat;
  if (run_status_open(&rstat, status_every)) return 2;
  memset(ranks, 0, sizeof ranks);
  if (log_dir && open_logs(log_dir, ranks, N, node_rank * n)) return 2;
  int store_fd = -1;
  if (node_rank == 0 && (store_fd = run_store_socket(master, nnodes, &port)) < 0) return 1; /* this node hosts the store */
  char **prog = argv + dash + 1;
  if (!strcmp(prog[0], "tandem")) prog[0] = (char *)run_self_exe(); /* the same binary, wherever it lives */
  char token[40];
  const char *env_token = getenv("TANDEM_JOB_TOKEN");
  if (env_token && *env_token) snprintf(token, sizeof token, "%.39s", env_token); /* several nodes share one */
  else make_token(token, sizeof token);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long threads = cores / n > 0 ? cores / n : 1;
  /* what every rank's tandem processes watch, wherever they run below us (watch.h) */
  pid_t self = getpid();
  char v_pid[32], v_start[32], v_nthreads[32], v_world[32], v_local_world[32], v_group[32], v_port[32], v_store[32];
  snprintf(v_pid, sizeof v_pid, "%d", (int)self);
  snprintf(v_start, sizeof v_start, "%llu", watch_start_time(self));
  setenv("TANDEM_LAUNCHER_PID", v_pid, 1);
  setenv("TANDEM_LAUNCHER_START", v_start, 1);
  snprintf(v_nthreads, sizeof v_nthreads, "%ld", threads);
  setenv("TANDEM_NUM_THREADS", v_nthreads, 0); /* cores divided among local ranks, unless set */
  setenv("OMP_NUM_THREADS", v_nthreads, 0);
  setenv("OPENBLAS_NUM_THREADS", "1", 0); /* tandem's own pool splits GEMMs (src/core/threads.c) */
  snprintf(v_world, sizeof v_world, "%lld", (long long)(nnodes * n));
  snprintf(v_local_world, sizeof v_local_world, "%d", N);
  snprintf(v_group, sizeof v_group, "%lld", (long long)node_rank);
  snprintf(v_port, sizeof v_port, "%lld", (long long)port);
  snprintf(v_store, sizeof v_store, "%d", store_fd);

  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL); /* a closed terminal stops the job as SIGTERM does, not only us */
  signal(SIGPIPE, SIG_IGN);
  int first_fail = -1, start_fail = -1;
  for (int64_t attempt = 0;; attempt++) {
    for (int i = 0; i < N; i++) { /* fresh state; the logs stay open */
      FILE *log = ranks[i].log;
      int failed = ranks[i].log_failed;
      char path[sizeof ranks[i].log_path];
      memcpy(path, ranks[i].log_path, sizeof path);
      memset(&ranks[i], 0, sizeof ranks[i]);
      ranks[i].fd = -1;
      ranks[i].log = log;
      ranks[i].log_failed = failed;
      memcpy(ranks[i].log_path, path, sizeof path);
      if (attempt) log_line(&ranks[i], "---- tandem run: restart %lld of %lld ----\n", (long long)attempt, (long long)max_restarts);
    }
    int started = 0;
    for (int i = 0; i < N && !got_signal; i++) {
      int p[2];
      if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "tandem run: cannot start rank %lld: pipe: %s\n", (long long)(node_rank * n + i), strerror(errno));
        start_fail = i;
        break;
      }
      char v_rank[32], v_local[32], v_attempt[32];
      snprintf(v_rank, sizeof v_rank, "%lld", (long long)(node_rank * n + i));
      snprintf(v_local, sizeof v_local, "%d", i);
      snprintf(v_attempt, sizeof v_attempt, "%lld", (long long)attempt);
      const char *env[] = {"RANK", v_rank, "WORLD_SIZE", v_world, "LOCAL_RANK", v_local, "LOCAL_WORLD_SIZE",
                           v_local_world, "GROUP_RANK", v_group, "MASTER_ADDR", master, "MASTER_PORT", v_port,
                           "TANDEM_JOB_TOKEN", token, "TANDEM_RESTART_COUNT", v_attempt,
                           i == 0 && store_fd >= 0 ? "TANDEM_STORE_FD" : NULL, v_store, NULL};
      pid_t pid = fork();
      if (pid == 0) run_start_rank(prog, p[1], i == 0 ? store_fd : -1, self, env);
      close(p[1]);
      if (pid < 0) {
        fprintf(stderr, "tandem run: cannot start rank %lld: fork: %s\n", (long long)(node_rank * n + i), strerror(errno));
        close(p[0]);
        start_fail = i;
        break;
      }
      setpgid(pid, pid); /* also here: no window in which a group kill misses it */
      ranks[i].pid = pid;
      ranks[i].fd = p[0];
      fcntl(p[0], F_SETFL, O_NONBLOCK);
      started++;
    }
    first_fail = -1;
    double relay_until = 0; /* a relayed first failure waits till then for the rank it came from */
    int alive = started, stopping = 0;
    double stop_at = 0;
    if (started < N) { /* could not start them all: stop those that run */
      run_signal_ranks(ranks, started, SIGTERM, 0);
      stopping = 1;
      stop_at = tdm_time_now() + 5;
    }
    while (alive > 0) {
      struct pollfd pf[MAX_RANKS];
      for (int i = 0; i < started; i++) pf[i] = (struct pollfd){ranks[i].fd, POLLIN, 0};
      poll(pf, (nfds_t)started, 100);
      for (int i = 0; i < started; i++)
        if (!ranks[i].done) run_drain(&ranks[i], (int)(node_rank * n + i), 0);
      int status;
      pid_t pid;
      int was_failed = first_fail;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (int i = 0; i < started; i++)
          if (ranks[i].pid == pid) {
            run_drain(&ranks[i], (int)(node_rank * n + i), 1);
            run_remove_segments_of(pid);
            if (ranks[i].fd >= 0) close(ranks[i].fd), ranks[i].fd = -1; /* a child of the rank may hold it open */
            ranks[i].done = 1;
            ranks[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            ranks[i].sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
            alive--;
            /* among the failures seen in one pass (a killed rank and the peers that noticed it end
             * within the same 100 ms), one killed by a signal is the cause, not those it failed; one
             * that failed of its own accord is, not those that relayed its failure (they may end
             * first: the agreements tell every rank at once), for which a relayed first failure
             * waits a grace */
            int w = run_fail_weight(&ranks[i]);
            if (!w || stopping) continue;
            if (first_fail < 0) {
              first_fail = i;
              if (w == 1) relay_until = tdm_time_now() + RUN_RELAY_GRACE_S;
            } else if (w > run_fail_weight(&ranks[first_fail]) &&
                       (was_failed < 0 || (run_fail_weight(&ranks[first_fail]) == 1 && tdm_time_now() < relay_until)))
              first_fail = i;
          }
      if (!stopping && alive > 0 && alive < started) {
        /* a stopped rank (SIGSTOP, state T) never ends: when every rank left is stopped and the rest
         * have exited (failed, or with --keep-going, or all done) nothing will wake it */
        /* stopped for a second in a row: a stop the next moment continues is not one */
        int stopped = 0;
        double now = tdm_time_now();
        for (int i = 0; i < started; i++) {
          int st = !ranks[i].done && run_is_stopped(ranks[i].pid);
          if (!st) ranks[i].stopped_since = 0;
          else if (!ranks[i].stopped_since) ranks[i].stopped_since = now;
          stopped += st && now - ranks[i].stopped_since >= 1.0;
        }
        if (stopped == alive) {
          for (int i = 0; i < started; i++)
            if (!ranks[i].done) {
              fprintf(stderr, "tandem run: rank %lld (pid %d) is stopped (SIGSTOP?) and every other rank has exited: killing it\n",
                      (long long)(node_rank * n + i), (int)ranks[i].pid);
              if (first_fail < 0) first_fail = i; /* it never finished: the job did not succeed */
            }
          run_signal_ranks(ranks, started, SIGKILL, 1);
          stopping = 1;
          stop_at = tdm_time_now() + 5;
        }
      }
      if (got_signal && !stopping) { /* forward, then give them a moment */
        run_signal_ranks(ranks, started, got_signal, 0);
        stopping = 1;
        stop_at = tdm_time_now() + 5;
      }
      if (first_fail >= 0 && !stopping && !keep_going &&
          !(run_fail_weight(&ranks[first_fail]) == 1 && tdm_time_now() < relay_until)) {
        /* a rank stopped by a signal when another fails is what the others were waiting for (their
         * timeouts name it): it is the cause, not the first of them to time out; and it would sit out
         * the SIGTERM's grace, so it is killed now */
        for (int i = 0; i < started; i++)
          if (!ranks[i].done && run_is_stopped(ranks[i].pid)) {
            fprintf(stderr, "tandem run: rank %lld (pid %d) is stopped (SIGSTOP?) while rank %lld failed, which was waiting for it: "
                    "killing it\n", (long long)(node_rank * n + i), (int)ranks[i].pid, (long long)(node_rank * n + first_fail));
            ranks[i].stopped = 1;
            first_fail = i;
            kill(-ranks[i].pid, SIGKILL);
            kill(ranks[i].pid, SIGKILL);
            break;
          }
        run_signal_ranks(ranks, started, SIGTERM, 0);
        stopping = 1;
        stop_at = tdm_time_now() + 5;
      }
      if (stopping && tdm_time_now() > stop_at) run_signal_ranks(ranks, started, SIGKILL, 1);
      if (alive > 0) run_status_tick(&rstat, node_rank * n, started, 0);
    }
    if (start_fail >= 0 || first_fail < 0 || got_signal || attempt >= max_restarts) break;
    rank_t *f = &ranks[first_fail];
    fprintf(stderr, "\ntandem run: rank %lld failed (%s %d); restarting all %d ranks (restart %lld of %lld)\n\n",
            (long long)(node_rank * n + first_fail), f->sig ? "signal" : "exit code", f->sig ? f->sig : f->code, N,
            (long long)attempt + 1, (long long)max_restarts);
  }
  if (store_fd >= 0) close(store_fd);
  run_status_close(&rstat);
  int log_failed = 0;
  for (int i = 0; i < N; i++)
    if (ranks[i].log) {
      if (fclose(ranks[i].log) != 0 && !ranks[i].log_failed) {
        ranks[i].log_failed = errno;
        fprintf(stderr, "tandem run: cannot write %s: %s; its log is incomplete\n", ranks[i].log_path, strerror(errno));
      }
      log_failed |= ranks[i].log_failed != 0;
    }
  if (start_fail >= 0) {
    fprintf(stderr, "tandem run: rank %lld could not be started; the %d rank%s started before it were stopped\n",
            (long long)(node_rank * n + start_fail), start_fail, start_fail == 1 ? "" : "s");
    return 1;
  }
  if (got_signal && first_fail < 0) {
    fprintf(stderr, "tandem run: stopped by signal %d (%s); the ranks were stopped\n", (int)got_signal,
            strsignal(got_signal));
    return 128 + got_signal;
  }
  if (first_fail < 0) {
    if (log_failed) fprintf(stderr, "tandem run: the ranks succeeded, but not every log under --log-dir was written\n");
    return log_failed ? 1 : 0;
  }
  rank_t *f = &ranks[first_fail];
  fprintf(stderr, "\ntandem run: rank %lld failed first: ", (long long)(node_rank * n + first_fail));
  if (f->stopped) fprintf(stderr, "stopped by a signal (SIGSTOP?) while the others waited for it, then killed\n");
  else if (f->sig) fprintf(stderr, "killed by signal %d (%s)\n", f->sig, strsignal(f->sig));
  else if (f->code == TANDEM_EXIT_RELAYED)
    fprintf(stderr, "exit code %d (it passed on another rank's failure; no rank failed of its own within %.0f s)\n", f->code,
            RUN_RELAY_GRACE_S);
  else fprintf(stderr, "exit code %d\n", f->code);
  int from = f->ntail > TAIL_LINES ? f->ntail - TAIL_LINES : 0;
  if (f->ntail) fprintf(stderr, "its last %d line%s:\n", f->ntail - from, f->ntail - from == 1 ? "" : "s");
  for (int j = from; j < f->ntail; j++) fprintf(stderr, "  | %s\n", f->tail[j % TAIL_LINES]);
  fprintf(stderr, keep_going ? "the other ranks went on (--keep-going).\n" : "the other ranks were stopped.\n");
  if (max_restarts > 0) /* why it stops here: not one more try */
    fprintf(stderr, "tandem run: all %lld restart%s (--max-restarts) used; giving up\n", (long long)max_restarts,
            max_restarts == 1 ? "" : "s");
  if (f->stopped) return 128 + SIGSTOP;
  return f->sig ? 128 + f->sig : (f->code ? f->code : 1);
}
