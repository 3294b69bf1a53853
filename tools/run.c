/* tandem run: starts N ranks of a program on this node with the torchrun environment, prefixes
 * their output with the rank, forwards SIGINT/SIGTERM, and when a rank fails stops the others
 * and says which rank failed first, how, and what it printed last. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "tandem/core.h"

#define MAX_RANKS 256
#define TAIL_LINES 8

typedef struct {
  pid_t pid;
  int fd;            /* read end of the rank's stdout+stderr */
  char partial[4096];
  size_t plen;
  char tail[TAIL_LINES][512];
  int ntail;
  int done, code, sig;
  double end_time;
  FILE *log;
} rank_t;

static volatile sig_atomic_t got_signal;
static void on_signal(int s) { got_signal = s; }

/* The store's listening socket, opened here and inherited by rank 0 (TANDEM_STORE_FD): no other
 * job can take the port between choosing it and using it. port 0: any free one. Returns the fd. */
static int store_socket(int64_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons((uint16_t)*port);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *port = ntohs(sa.sin_port);
  return fd;
}

static void make_token(char *out, size_t n) {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY);
  if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
    uint64_t x = tdm_hash64((uint64_t)getpid(), (uint64_t)time(NULL));
    memcpy(b, &x, 8);
    memcpy(b + 8, &x, 8);
  }
  if (fd >= 0) close(fd);
  for (int i = 0; i < 16 && 2 * i + 2 < (int)n; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void emit_line(rank_t *r, int idx, const char *line, size_t n) {
  printf("[rank %d] %.*s\n", idx, (int)n, line);
  if (r->log) fprintf(r->log, "%.*s\n", (int)n, line);
  int keep = n < sizeof r->tail[0] - 1 ? (int)n : (int)sizeof r->tail[0] - 1;
  memcpy(r->tail[r->ntail % TAIL_LINES], line, (size_t)keep);
  r->tail[r->ntail % TAIL_LINES][keep] = 0;
  r->ntail++;
}

static void drain(rank_t *r, int idx, int final) {
  for (;;) {
    ssize_t k = read(r->fd, r->partial + r->plen, sizeof r->partial - r->plen);
    if (k <= 0) break;
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
  if (final && r->plen) {
    emit_line(r, idx, r->partial, r->plen);
    r->plen = 0;
  }
  fflush(stdout);
}

static const char *self_exe(void) {
  static char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "tandem";
  buf[n] = 0;
  return buf;
}

int tool_run(int argc, char **argv) {
  int dash = -1;
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--")) {
      dash = i;
      break;
    }
  int64_t n = 0, port = 0, nnodes = 1, node_rank = 0, max_restarts = 0;
  const char *log_dir = NULL, *master = NULL;
  cli_opt opts[] = {
      {"nproc", CLI_INT, &n, "1", "ranks to start on this node (also -n)", NULL, 1, MAX_RANKS, 0},
      {"nnodes", CLI_INT, &nnodes, "1", "nodes in the job", NULL, 1, 4096, 0},
      {"node-rank", CLI_INT, &node_rank, "0", "this node's index", NULL, 0, 4095, 0},
      {"master-addr", CLI_STRING, &master, "127.0.0.1", "address of the node that hosts rank 0", NULL, 0, 0, 0},
      {"master-port", CLI_INT, &port, "0", "rendezvous port (0: a free port; set it for several nodes)", NULL, 0, 65535, 0},
      {"log-dir", CLI_STRING, &log_dir, NULL, "also write each rank's output to DIR/rank-N.log", NULL, 0, 0, 0},
      {"max-restarts", CLI_INT, &max_restarts, "0", "restart the whole group this many times after a failure (the program resumes from its checkpoint)", NULL, 0, 1000, 0},
  };
  int nopt = (int)(sizeof opts / sizeof opts[0]);
  int n_ours = dash >= 0 ? dash : argc;
  char *ours[64];
  int k = 0;
  for (int i = 0; i < n_ours && k < 62; i++) { /* accept -n N as --nproc N */
    if (!strcmp(argv[i], "-n")) ours[k++] = "--nproc";
    else ours[k++] = argv[i];
  }
  int r = cli_parse("run", "-n N [options] -- PROGRAM [ARGS...]", opts, nopt, k, ours);
  if (r == 1) return 0;
  if (r) return 2;
  if (dash < 0 || dash + 1 >= argc) {
    fprintf(stderr, "tandem run: no program given; usage: tandem run -n N [options] -- PROGRAM [ARGS...]\n");
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
  int store_fd = -1;
  if (node_rank == 0) { /* this node hosts rank 0 and so the store */
    store_fd = store_socket(&port);
    if (store_fd < 0) {
      fprintf(stderr, "tandem run: cannot listen on port %lld for the rendezvous store: %s\n", (long long)port, strerror(errno));
      return 1;
    }
  }
  char **prog = argv + dash + 1;
  if (!strcmp(prog[0], "tandem")) prog[0] = (char *)self_exe(); /* the same binary, wherever it lives */
  if (log_dir && mkdir(log_dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "tandem run: cannot create --log-dir %s: %s\n", log_dir, strerror(errno));
    return 2;
  }
  char token[40];
  const char *env_token = getenv("TANDEM_JOB_TOKEN");
  if (env_token && *env_token) snprintf(token, sizeof token, "%.39s", env_token); /* several nodes share one */
  else make_token(token, sizeof token);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long threads = cores / n > 0 ? cores / n : 1;

  static rank_t ranks[MAX_RANKS];
  int N = (int)n;
  struct sigaction sa = {0};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  int first_fail = -1;
  for (int64_t attempt = 0;; attempt++) {
  memset(ranks, 0, sizeof ranks);
  for (int i = 0; i < N; i++) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
      fprintf(stderr, "tandem run: pipe: %s\n", strerror(errno));
      return 1;
    }
    if (log_dir) {
      char path[4096];
      snprintf(path, sizeof path, "%s/rank-%lld.log", log_dir, (long long)(node_rank * n + i));
      ranks[i].log = fopen(path, "w");
    }
    pid_t pid = fork();
    if (pid == 0) {
      char v[64];
      setpgid(0, 0);
      dup2(p[1], 1);
      dup2(p[1], 2);
      snprintf(v, sizeof v, "%lld", (long long)(node_rank * n + i));
      setenv("RANK", v, 1);
      snprintf(v, sizeof v, "%lld", (long long)(nnodes * n));
      setenv("WORLD_SIZE", v, 1);
      snprintf(v, sizeof v, "%d", i);
      setenv("LOCAL_RANK", v, 1);
      snprintf(v, sizeof v, "%d", N);
      setenv("LOCAL_WORLD_SIZE", v, 1);
      snprintf(v, sizeof v, "%lld", (long long)node_rank);
      setenv("GROUP_RANK", v, 1);
      setenv("MASTER_ADDR", master, 1);
      snprintf(v, sizeof v, "%lld", (long long)port);
      setenv("MASTER_PORT", v, 1);
      setenv("TANDEM_JOB_TOKEN", token, 1);
      if (store_fd >= 0 && i == 0) { /* rank 0 serves the store on the socket we opened */
        snprintf(v, sizeof v, "%d", store_fd);
        setenv("TANDEM_STORE_FD", v, 1);
      } else if (store_fd >= 0) {
        close(store_fd);
        unsetenv("TANDEM_STORE_FD");
      }
      snprintf(v, sizeof v, "%lld", (long long)attempt);
      setenv("TANDEM_RESTART_COUNT", v, 1);
      snprintf(v, sizeof v, "%ld", threads);
      setenv("TANDEM_NUM_THREADS", v, 0); /* cores divided among local ranks, unless set */
      setenv("OMP_NUM_THREADS", v, 0);
      setenv("OPENBLAS_NUM_THREADS", "1", 0); /* tandem's own pool splits GEMMs (src/core/threads.c) */
      execvp(prog[0], prog);
      fprintf(stderr, "tandem run: cannot start %s: %s\n", prog[0], strerror(errno));
      _exit(127);
    }
    close(p[1]);
    ranks[i].pid = pid;
    ranks[i].fd = p[0];
    fcntl(p[0], F_SETFL, O_NONBLOCK);
  }
  first_fail = -1;
  int alive = N, stopping = 0;
  double stop_at = 0;
  while (alive > 0) {
    struct pollfd pf[MAX_RANKS];
    for (int i = 0; i < N; i++) pf[i] = (struct pollfd){ranks[i].done ? -1 : ranks[i].fd, POLLIN, 0};
    poll(pf, (nfds_t)N, 100);
    for (int i = 0; i < N; i++)
      if (!ranks[i].done) drain(&ranks[i], (int)(node_rank * n + i), 0);
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
      for (int i = 0; i < N; i++)
        if (ranks[i].pid == pid) {
          drain(&ranks[i], (int)(node_rank * n + i), 1);
          ranks[i].done = 1;
          ranks[i].end_time = tdm_time_now();
          ranks[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
          ranks[i].sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
          alive--;
          if ((ranks[i].code != 0 || ranks[i].sig) && first_fail < 0 && !stopping) first_fail = i;
        }
    if (got_signal && !stopping) { /* forward, then give them a moment */
      for (int i = 0; i < N; i++)
        if (!ranks[i].done) kill(ranks[i].pid, got_signal);
      stopping = 1;
      stop_at = tdm_time_now() + 5;
    }
    if (first_fail >= 0 && !stopping) {
      for (int i = 0; i < N; i++)
        if (!ranks[i].done) kill(ranks[i].pid, SIGTERM);
      stopping = 1;
      stop_at = tdm_time_now() + 5;
    }
    if (stopping && tdm_time_now() > stop_at)
      for (int i = 0; i < N; i++)
        if (!ranks[i].done) kill(-ranks[i].pid, SIGKILL), kill(ranks[i].pid, SIGKILL);
  }
  for (int i = 0; i < N; i++) {
    close(ranks[i].fd);
    if (ranks[i].log) fclose(ranks[i].log);
  }
  if (first_fail < 0 || got_signal || attempt >= max_restarts) break;
  rank_t *f = &ranks[first_fail];
  fprintf(stderr, "\ntandem run: rank %lld failed (%s %d); restarting all %d ranks (restart %lld of %lld)\n\n",
          (long long)(node_rank * n + first_fail), f->sig ? "signal" : "exit code", f->sig ? f->sig : f->code, N,
          (long long)attempt + 1, (long long)max_restarts);
  }
  if (store_fd >= 0) close(store_fd);
  if (got_signal && first_fail < 0) {
    fprintf(stderr, "tandem run: stopped by signal %d\n", (int)got_signal);
    return 128 + got_signal;
  }
  if (first_fail < 0) return 0;
  rank_t *f = &ranks[first_fail];
  fprintf(stderr, "\ntandem run: rank %lld failed first: ", (long long)(node_rank * n + first_fail));
  if (f->sig) fprintf(stderr, "killed by signal %d (%s)\n", f->sig, strsignal(f->sig));
  else fprintf(stderr, "exit code %d\n", f->code);
  int from = f->ntail > TAIL_LINES ? f->ntail - TAIL_LINES : 0;
  if (f->ntail) fprintf(stderr, "its last %d line%s:\n", f->ntail - from, f->ntail - from == 1 ? "" : "s");
  for (int j = from; j < f->ntail; j++) fprintf(stderr, "  | %s\n", f->tail[j % TAIL_LINES]);
  fprintf(stderr, "the other ranks were stopped.\n");
  return f->sig ? 128 + f->sig : (f->code ? f->code : 1);
}
