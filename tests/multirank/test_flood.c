/* The rendezvous store and the TCP start-up mesh under strangers, with real processes: a job
 * completes while ~1,100 idle connections are held open to the store, and while ~30 are held to
 * every mesh port; refusals are reported in counted lines, not one line each; the store and the
 * mesh listen on loopback only when the master is loopback; and a rank says what really
 * happened when it is dropped as busy, refused, left unanswered, or never gets a connection. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>

#include "comm/comm_impl.h"
#include "comm/net.h"
#include "procs.h"
#include "tdm_test.h"

#define TOKEN "tdm-flood-token-81c2"

static tdm_comm_config config(int rank, int size, int port, double timeout) {
  tdm_comm_config cfg = {0};
  cfg.rank = rank;
  cfg.size = size;
  cfg.transport = TDM_TRANSPORT_TCP;
  cfg.master_addr = "127.0.0.1";
  cfg.master_port = port;
  cfg.job_token = TOKEN;
  cfg.timeout_s = timeout;
  return cfg;
}

/* How a rank runs: its descriptor limit (0: ours), how many of them it holds busy from the start,
 * and how long it lingers (with its store open) after its all-reduces. */
typedef struct {
  int nofile, hog;
  double linger_s;
} rank_opts;

/* Forks a rank that makes a few checked all-reduces; its stderr goes to log (NULL: ours). It
 * closes the descriptors it inherits: the test's idle connections are not its own. */
static pid_t start_rank_opts(int rank, int size, int port, const char *log, rank_opts o) {
  pid_t pid = fork();
  if (pid) return pid;
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  for (int fd = 3; fd < (int)rl.rlim_cur; fd++) close(fd);
  if (o.nofile > 0) {
    rl.rlim_cur = (rlim_t)o.nofile;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  for (int i = 0; i < o.hog; i++)
    if (dup(0) < 0) break;
  if (log) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
  }
  tdm_comm_config cfg = config(rank, size, port, 20);
  tdm_comm_t c;
  if (tdm_comm_create(&c, &cfg) != TDM_OK) {
    fprintf(stderr, "  rank %d: create: %s\n", rank, tdm_last_error());
    _exit(90);
  }
  int rc = 0;
  for (int i = 0; i < 5 && !rc; i++) {
    int64_t v = rank + i;
    if (tdm_comm_allreduce(c, &v, &v, 1, TDM_I64, TDM_SUM, TDM_ALGO_AUTO) != TDM_OK) {
      fprintf(stderr, "  rank %d: all-reduce: %s\n", rank, tdm_last_error());
      rc = 1;
    } else if (v != (int64_t)size * (size - 1) / 2 + (int64_t)size * i) {
      rc = 2;
    }
  }
  if (o.linger_s > 0) usleep((useconds_t)(o.linger_s * 1e6));
  tdm_comm_destroy(c);
  _exit(rc);
}
static pid_t start_rank(int rank, int size, int port, const char *log) {
  return start_rank_opts(rank, size, port, log, (rank_opts){0, 0, 0});
}

/* CPU clock ticks a process has used (user + system). */
static long cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  long ut = 0, st = 0;
  if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st);
  return ut + st;
}

/* ---- idle connections, reopened whenever the listener drops them ------------------------------ */
typedef struct {
  int port, n;
  int fd[2048];
  char up[2048]; /* the connection is established (the listener's kernel answered) */
  long reopened;
} holder;

static int open_idle(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Waits up to ms for connections to come up or be dropped by the listeners; reopens the
 * dropped. Returns how many are up. */
static int hold_on(holder *hs, int nh, int ms) {
  struct pollfd pf[4096];
  int np = 0, up = 0;
  for (int k = 0; k < nh; k++)
    for (int i = 0; i < hs[k].n && np < 4096; i++)
      pf[np++] = (struct pollfd){hs[k].fd[i], (short)(hs[k].up[i] ? POLLIN : POLLIN | POLLOUT), 0};
  poll(pf, (nfds_t)np, ms);
  np = 0;
  for (int k = 0; k < nh; k++)
    for (int i = 0; i < hs[k].n && np < 4096; i++, np++) {
      short ev = pf[np].revents;
      if (hs[k].fd[i] < 0 || (ev & (POLLIN | POLLHUP | POLLERR))) { /* dropped (a busy note, EOF, a reset): come back */
        if (hs[k].fd[i] >= 0) close(hs[k].fd[i]);
        hs[k].fd[i] = open_idle(hs[k].port);
        hs[k].up[i] = 0;
        hs[k].reopened++;
      } else if (ev & POLLOUT) {
        hs[k].up[i] = 1;
      }
      up += hs[k].up[i];
    }
  return up;
}

/* Opens n idle connections to port, in batches that the listener's backlog can take, each once
 * the last is up, so that they reach the listening process rather than die in its kernel queue. */
static void hold(holder *h, int port, int n) {
  h->port = port;
  h->n = 0;
  h->reopened = 0;
  while (h->n < n) {
    int b = n - h->n < 64 ? n - h->n : 64, up = 0;
    for (int i = 0; i < b; i++, h->n++) h->fd[h->n] = open_idle(port), h->up[h->n] = 0;
    for (double until = tdm_time_now() + 2; up < b && tdm_time_now() < until;) {
      hold_on(h, 1, 5);
      up = 0;
      for (int i = h->n - b; i < h->n; i++) up += h->up[i];
    }
  }
}

static void release(holder *h) {
  for (int i = 0; i < h->n; i++)
    if (h->fd[i] >= 0) close(h->fd[i]);
  h->n = 0;
}

/* Raises the soft descriptor limit towards want; returns what it is now. */
static int fd_limit(int want) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < (rlim_t)want) {
    rl.rlim_cur = rl.rlim_max < (rlim_t)want ? rl.rlim_max : (rlim_t)want;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur > 100000 ? 100000 : (int)rl.rlim_cur;
}

/* Runs the holders until every rank has exited or timeout s passed. */
static double hold_until_done(holder *hs, int nh, int n, const pid_t *pids, int *codes, double timeout) {
  double t0 = tdm_time_now();
  while (procs_reap(n, pids, codes) > 0 && tdm_time_now() - t0 < timeout) {
    hold_on(hs, nh, 20);
    usleep(2000); /* pressure, not a busy loop: other tests share the cores */
  }
  procs_kill_left(n, pids, codes, "did not finish while strangers knocked");
  return tdm_time_now() - t0;
}

/* The local address (8 hex digits, as /proc/net/tcp writes it) of the socket listening on port,
 * or "" if none; *count gets how many listen there. */
static void listen_addr(int port, char out[9], int *count) {
  FILE *f = fopen("/proc/net/tcp", "r");
  char line[512], addr[9];
  unsigned p, st;
  *out = 0;
  *count = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, " %*d: %8[0-9A-F]:%x %*x:%*x %x", addr, &p, &st) == 3 && p == (unsigned)port && st == 0x0A) {
      memcpy(out, addr, 9);
      ++*count;
    }
  if (f) fclose(f);
}

/* Warning lines in a log that contain what, and the connections they count in all. */
static int warning_lines(const char *log, const char *what, long *dropped) {
  FILE *f = fopen(log, "r");
  char line[4096];
  int n = 0;
  *dropped = 0;
  while (f && fgets(line, sizeof line, f)) {
    const char *w = strstr(line, what);
    if (!w || strstr(w, "file descriptors are free")) continue; /* the one notice of a tight limit drops nothing */
    n++;
    long k = 0;
    if (strstr(w, "dropped the connection from")) *dropped += 1;
    else if (sscanf(w + strlen(what), " dropped %ld connections", &k) == 1) *dropped += k;
  }
  if (f) fclose(f);
  return n;
}

static void show(const char *log) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "sed 's/^/    | /' %s | tail -20 >&2", log);
  if (system(cmd) != 0) fprintf(stderr, "    (no log)\n");
}

static void wait_listening(int port) {
  double until = tdm_time_now() + 10;
  char a[9];
  int n = 0;
  while (!n && tdm_time_now() < until) {
    listen_addr(port, a, &n);
    if (!n) usleep(10000);
  }
}

/* want idle connections to the store of a 2-rank job whose rank 0 runs as o says. */
static void store_flood(int want, rank_opts o) {
  int lim = fd_limit(want + 200), n = lim - 200 < want ? lim - 200 : want;
  if (n < want) printf("  the descriptor limit (%d) allows %d idle connections, not %d\n", lim, n, want);
  CHECK_MSG(n > 1024 || o.nofile, "only %d idle connections: not above the old limit of 1024 clients", n);
  int port = procs_free_port();
  char log[] = "/tmp/tdm-flood-store-XXXXXX";
  close(mkstemp(log));
  pid_t pids[2];
  int codes[2] = {-1, -1};
  double t0 = tdm_time_now();
  pids[0] = start_rank_opts(0, 2, port, log, o);
  wait_listening(port);
  char addr[9];
  int nl;
  listen_addr(port, addr, &nl);
  CHECK_MSG(nl == 1 && !strcmp(addr, "0100007F"), "the store listens on %d socket(s), address %s, not 127.0.0.1 alone", nl,
            addr);
  holder *h = calloc(1, sizeof *h);
  hold(h, port, n); /* the store sees them first */
  hold_on(h, 1, 300);
  pids[1] = start_rank(1, 2, port, NULL);
  long idle_ticks = -1;
  if (o.linger_s > 0) { /* once rank 1 is done the strangers go; rank 0's store, idle, must sleep */
    while (procs_reap(2, pids, codes) > 0 && codes[1] < 0 && tdm_time_now() - t0 < 40) hold_on(h, 1, 20);
    release(h);
    usleep(300000);
    long before = cpu_ticks(pids[0]);
    usleep(1000000);
    idle_ticks = cpu_ticks(pids[0]) - before;
  }
  double t = hold_until_done(h, 1, 2, pids, codes, 40);
  release(h);
  long dropped = 0;
  int lines = warning_lines(log, "store:", &dropped);
  if (o.nofile) printf("  rank 0 may open %d descriptors and holds %d of them\n", o.nofile, o.hog);
  printf("  2 ranks done in %.2f s with %d idle connections held to the store (%ld reopened after it dropped them); "
         "%d warning line(s) in %.1f s counting %ld dropped connections\n", t, n, h->reopened, lines, tdm_time_now() - t0,
         dropped);
  CHECK_MSG(codes[0] == 0 && codes[1] == 0, "exit codes %d %d", codes[0], codes[1]);
  CHECK_MSG(lines >= 1 && lines <= 2 + (int)((tdm_time_now() - t0) / TDM_NET_REPORT_S), "%d warning lines", lines);
  CHECK_MSG(dropped >= n - TDM_NET_MAX_PENDING, "the warnings count %ld dropped connections of %d", dropped, n);
  if (o.nofile) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "grep -q 'out of file descriptors\\|for want of file descriptors\\|file descriptors are free' %s", log);
    CHECK_MSG(system(cmd) == 0, "the store never ran out of descriptors: the case proves nothing");
  }
  if (idle_ticks >= 0) {
    printf("  rank 0 used %ld clock ticks of CPU in 1 s once the strangers were gone\n", idle_ticks);
    CHECK(idle_ticks < 10);
  }
  if (codes[0] || codes[1] || lines > 2 + (int)((tdm_time_now() - t0) / TDM_NET_REPORT_S)) show(log);
  free(h);
  unlink(log);
}

static void test_store_flood(void) { store_flood(1100, (rank_opts){0, 0, 0}); }

/* Rank 0 short of descriptors: accept fails (EMFILE); the oldest stranger makes room or the
 * listener rests, the ranks still get in, and once the strangers are gone the store sleeps. */
static void test_store_flood_out_of_descriptors(void) { store_flood(300, (rank_opts){48, 36, 1.8}); }

static int mesh_port(tdm__store *st, int r, double timeout) {
  char key[32];
  snprintf(key, sizeof key, "tcp/%d", r);
  void *v;
  size_t n;
  if (tdm__store_get(st, key, &v, &n, timeout) != TDM_OK) return -1;
  char buf[96];
  snprintf(buf, sizeof buf, "%.*s", (int)n, (char *)v);
  tdm__free(v);
  char *colon = strrchr(buf, ':');
  return colon ? atoi(colon + 1) : -1;
}

static void test_mesh_flood(void) {
  fd_limit(512);
  int port = procs_free_port();
  char log[] = "/tmp/tdm-flood-mesh-XXXXXX";
  close(mkstemp(log));
  pid_t pids[3];
  int codes[3] = {-1, -1, -1};
  pids[0] = start_rank(0, 3, port, log);
  pids[1] = start_rank(1, 3, port, NULL);
  /* we hold the token too: read where ranks 0 and 1 listen, and knock there idly before rank 2 comes */
  tdm_comm_config cfg = config(7, 3, port, 10);
  tdm__store *st = NULL;
  CHECK_OK(tdm__store_open(&st, &cfg, 10));
  holder *h = calloc(3, sizeof *h);
  int nh = 0;
  for (int r = 0; st && r < 2; r++) {
    int p = mesh_port(st, r, 10);
    CHECK_MSG(p > 0, "rank %d's mesh port: %s", r, tdm_last_error());
    if (p <= 0) continue;
    char addr[9];
    int nl;
    listen_addr(p, addr, &nl);
    CHECK_MSG(nl == 1 && !strcmp(addr, "0100007F"), "rank %d's mesh listens on %d socket(s), address %s, not 127.0.0.1", r,
              nl, addr);
    hold(&h[nh++], p, 30);
  }
  hold_on(h, nh, 300);
  pids[2] = start_rank(2, 3, port, NULL);
  int p2 = st ? mesh_port(st, 2, 10) : -1; /* it closes its port at once: nobody is above it */
  if (p2 > 0) hold(&h[nh++], p2, 30);
  double t = hold_until_done(h, nh, 3, pids, codes, 40);
  tdm__store_close(st);
  long reopened = 0, dropped = 0;
  for (int k = 0; k < nh; k++) reopened += h[k].reopened, release(&h[k]);
  int lines = warning_lines(log, "tcp: rank 0:", &dropped);
  printf("  3 ranks done in %.2f s with 30 idle connections held to each of %d mesh ports (%ld reopened); "
         "rank 0: %d warning line(s) counting %ld dropped connections\n", t, nh, reopened, lines, dropped);
  CHECK_MSG(codes[0] == 0 && codes[1] == 0 && codes[2] == 0, "exit codes %d %d %d", codes[0], codes[1], codes[2]);
  CHECK_MSG(lines >= 1 && lines <= 2 + (int)(t / TDM_NET_REPORT_S), "%d warning lines in %.1f s", lines, t);
  CHECK(dropped >= 30);
  if (codes[0] || codes[1] || codes[2]) show(log);
  free(h);
  unlink(log);
}

/* ---- what a rank is told ---------------------------------------------------------------------- */
typedef enum { FAKE_BUSY, FAKE_REFUSE, FAKE_SILENT } fake_kind;

/* A fake store on a fresh port that answers every hello the given way; returns its pid. */
static pid_t fake_store(fake_kind kind, int *port) {
  int lfd = -1, got = 0;
  if (tdm__net_listen("127.0.0.1", 0, &lfd, &got) != TDM_OK) return -1;
  *port = got;
  pid_t pid = fork();
  if (pid) {
    close(lfd);
    return pid;
  }
  int nh = 0;
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) continue;
    unsigned char hello[TDM_NET_HELLO_BYTES + 64];
    if (kind != FAKE_SILENT && recv(fd, hello, sizeof hello, 0) <= 0) {
      close(fd);
      continue;
    }
    if (kind == FAKE_BUSY) {
      uint32_t note[2] = {TDM_NET_BUSY_MAGIC, 77};
      if (send(fd, note, sizeof note, MSG_NOSIGNAL) < 0) { /* it went */
      }
    }
    if (kind == FAKE_SILENT && nh++ < 64) continue; /* keep it open, say nothing */
    close(fd);
  }
}

static void expect_create_fails(fake_kind kind, tdm_status want, const char *text1, const char *text2) {
  int port = 0;
  pid_t fake = fake_store(kind, &port);
  CHECK(fake > 0);
  tdm_comm_config cfg = config(1, 2, port, 1.5);
  tdm_comm_t c;
  double t0 = tdm_time_now();
  tdm_status st = tdm_comm_create(&c, &cfg);
  double t = tdm_time_now() - t0;
  printf("  %s after %.2f s: %s\n", tdm_status_str(st), t, tdm_last_error());
  CHECK_MSG(st == want, "status %s, expected %s", tdm_status_str(st), tdm_status_str(want));
  CHECK_ERR_HAS(text1);
  CHECK_ERR_HAS(text2);
  CHECK(t < 5);
  if (st == TDM_OK) tdm_comm_destroy(c);
  kill(fake, SIGKILL);
  waitpid(fake, NULL, 0);
}

static void test_rank_says_why_the_store_dropped_it(void) {
  expect_create_fails(FAKE_BUSY, TDM_ERR_REMOTE, "dropped our connection before the handshake completed",
                      "overloaded by 77 unauthenticated connections");
  expect_create_fails(FAKE_REFUSE, TDM_ERR_REMOTE, "closed the connection without accepting our handshake",
                      "TANDEM_JOB_TOKEN");
  expect_create_fails(FAKE_SILENT, TDM_ERR_TIMEOUT, "cannot reach the store at 127.0.0.1",
                      "did not answer our handshake in time");
}

/* A listener whose backlog is full drops new SYNs: connect() alone would wait for minutes. */
static void test_unanswered_connect_ends_at_the_deadline(void) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 0) == 0);
  getsockname(lfd, (struct sockaddr *)&sa, &len);
  int port = ntohs(sa.sin_port), fill[8], nf = 0;
  for (; nf < 8; nf++) { /* fill the backlog until a connection is no longer answered */
    fill[nf] = open_idle(port);
    struct pollfd pf = {fill[nf], POLLOUT, 0};
    if (poll(&pf, 1, 200) == 0) break;
  }
  pid_t pid = fork();
  if (pid == 0) {
    tdm_comm_config cfg = config(1, 2, port, 2);
    tdm_comm_t c;
    tdm_status st = tdm_comm_create(&c, &cfg);
    fprintf(stderr, "  %s: %s\n", tdm_status_str(st), tdm_last_error());
    _exit(st == TDM_ERR_TIMEOUT && strstr(tdm_last_error(), "no connection to 127.0.0.1") ? 42 : 1);
  }
  int code;
  double t = procs_wait_all(1, &pid, &code, 15);
  printf("  the rank gave up after %.2f s (timeout 2 s)\n", t);
  CHECK_MSG(code == 42, "exit code %d", code);
  CHECK(t < 6);
  for (int i = 0; i <= nf && i < 8; i++) close(fill[i]);
  close(lfd);
}

/* ---- the store's requests ---------------------------------------------------------------------- */
/* A store served by this process (rank 0 of a job of 2) on a fresh port. */
static tdm__store *own_store(int *port) {
  *port = procs_free_port();
  tdm_comm_config cfg = config(0, 2, *port, 5);
  tdm__store *st = NULL;
  CHECK_OK(tdm__store_open(&st, &cfg, 5));
  return st;
}

/* A client that gave the token and speaks the request format itself. */
static int raw_client(int port) {
  int fd = -1;
  uint32_t ok = 0;
  CHECK_OK(tdm__net_connect("127.0.0.1", port, tdm_time_now() + 5, &fd));
  CHECK_OK(tdm__net_send_hello(fd, TDM_STORE_MAGIC, TOKEN, 1, tdm_time_now() + 5));
  CHECK_OK(tdm__net_recv_all(fd, &ok, 4, tdm_time_now() + 5, "store hello"));
  CHECK(ok == 1);
  return fd;
}

/* Sends one request; returns how many bytes came back before the server closed the connection
 * (-1 - bytes: it had not closed it within 2 s). */
static long request_reply(int fd, uint8_t cmd, const char *key, uint32_t kl, uint64_t vl) {
  unsigned char msg[TDM_STORE_REQ_HEAD + 64] = {cmd};
  memcpy(msg + 1, &kl, 4);
  memcpy(msg + 5, &vl, 8);
  memcpy(msg + TDM_STORE_REQ_HEAD, key, kl);
  memset(msg + TDM_STORE_REQ_HEAD + kl, 'x', vl);
  CHECK_OK(tdm__net_send_all(fd, msg, TDM_STORE_REQ_HEAD + kl + vl, tdm_time_now() + 5, "request"));
  long got = 0;
  for (double end = tdm_time_now() + 2; tdm_time_now() < end;) {
    struct pollfd pf = {fd, POLLIN, 0};
    char b[64];
    if (poll(&pf, 1, 100) <= 0) continue;
    ssize_t k = recv(fd, b, sizeof b, 0);
    if (k <= 0) return got;
    got += k;
  }
  return -1 - got;
}

/* Requests the client never sends are refused, the sender dropped, nothing stored: a key with a
 * NUL was kept under the part before it, an add of another size added 0, a get's value was
 * ignored. The fuzz target `store` found the first (fuzz/corpus/store/crash-key-nul). */
static void test_store_refuses_malformed_requests(void) {
  int port;
  tdm__store *st = own_store(&port);
  if (!st) return;
  CHECK_OK(tdm__store_set(st, "k", "v", 1));
  int fd = raw_client(port);
  CHECK_MSG(request_reply(fd, 'S', "raw", 3, 2) == -2, "a well-formed set is answered (1 byte), the client kept");
  close(fd);
  static const struct {
    const char *what;
    uint8_t cmd;
    const char *key;
    uint32_t kl;
    uint64_t vl;
  } bad[] = {{"a NUL in the key", 'S', "a\0b", 3, 4}, {"an add of 4 bytes", 'A', "n", 1, 4},
             {"a get with a value", 'G', "k", 1, 2},  {"an unknown command", 'X', "k", 1, 0},
             {"an empty key", 'G', "", 0, 0}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fd = raw_client(port);
    long r = request_reply(fd, bad[i].cmd, bad[i].key, bad[i].kl, bad[i].vl);
    CHECK_MSG(r == 0, "%s: %s", bad[i].what,
              r < 0 ? "the server kept the client" : "the server answered before it closed the connection");
    close(fd);
  }
  void *v = NULL;
  size_t n = 0;
  CHECK(tdm__store_get(st, "a", &v, &n, 0.3) == TDM_ERR_TIMEOUT); /* nothing was stored under "a" */
  CHECK(tdm__store_get(st, "n", &v, &n, 0.3) == TDM_ERR_TIMEOUT);
  CHECK_OK(tdm__store_get(st, "k", &v, &n, 5)); /* and the store serves on */
  CHECK(n == 1 && !memcmp(v, "v", 1));
  tdm__free(v);
  tdm__store_close(st);
}

/* A value of exactly TDM_STORE_MAX_VAL bytes is stored (the server's buffer stopped doubling at
 * 64 MiB and dropped it as too large); a longer value or a key out of 1..TDM_STORE_MAX_KEY bytes
 * is refused at the caller, naming it, not sent for the server to drop the connection. */
static void test_store_value_and_key_limits(void) {
  int port;
  tdm__store *st = own_store(&port);
  if (!st) return;
  size_t big = (size_t)TDM_STORE_MAX_VAL;
  unsigned char *val = malloc(big + 1);
  for (size_t i = 0; i <= big; i++) val[i] = (unsigned char)(i * 2654435761u >> 24);
  CHECK_OK(tdm__store_set(st, "big", val, big));
  void *v = NULL;
  size_t n = 0;
  CHECK_OK(tdm__store_get(st, "big", &v, &n, 10));
  CHECK(n == big && v && !memcmp(v, val, big));
  tdm__free(v);
  CHECK(tdm__store_set(st, "bigger", val, big + 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("store: the value of key 'bigger' is 67108865 bytes; at most 67108864");
  free(val);
  char key[TDM_STORE_MAX_KEY + 2];
  memset(key, 'k', sizeof key - 1);
  key[TDM_STORE_MAX_KEY + 1] = 0;
  CHECK(tdm__store_set(st, key, "v", 1) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("is 4097 bytes; keys are 1..4096 bytes");
  CHECK(tdm__store_get(st, "", &v, &n, 1) == TDM_ERR_INVALID_ARG);
  key[TDM_STORE_MAX_KEY] = 0; /* the longest key */
  CHECK_OK(tdm__store_set(st, key, "v", 1));
  CHECK_OK(tdm__store_get(st, key, &v, &n, 5)); /* the connection is still there */
  CHECK(n == 1);
  tdm__free(v);
  tdm__store_close(st);
}

TDM_TEST_MAIN(T(test_store_flood), T(test_store_flood_out_of_descriptors), T(test_mesh_flood), T(test_rank_says_why_the_store_dropped_it),
              T(test_unanswered_connect_ends_at_the_deadline), T(test_store_refuses_malformed_requests),
              T(test_store_value_and_key_limits))
