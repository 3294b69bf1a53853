#define _GNU_SOURCE /* accept4 */
#include "comm/net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"

static int ms_left(double deadline) {
  double left = deadline - tdm_time_now();
  if (left <= 0) return 0;
  return left > 1.0 ? 1000 : (int)(left * 1000) + 1;
}

void tdm__net_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void tdm__net_tune(int fd) {
  int one = 1, buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buf) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  if (buf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static tdm_status resolve(const char *addr, int port, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (!addr) {
    sa->sin_addr.s_addr = htonl(INADDR_ANY);
    return TDM_OK;
  }
  if (inet_pton(AF_INET, addr, &sa->sin_addr) == 1) return TDM_OK;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(addr, NULL, &hints, &res);
  if (rc != 0 || !res)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cannot resolve host '%s': %s", addr, gai_strerror(rc));
  sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return TDM_OK;
}

tdm_status tdm__net_listen(const char *addr, int port, int *fd_out, int *port_out) {
  struct sockaddr_in sa;
  TDM__TRY(resolve(addr, port, &sa));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return tdm__set_error(TDM_ERR_SYSTEM, "socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, SOMAXCONN) != 0) {
    tdm_status st = tdm__set_error(TDM_ERR_SYSTEM, "cannot listen on %s:%d: %s", addr ? addr : "*", port, strerror(errno));
    close(fd);
    return st;
  }
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *port_out = ntohs(sa.sin_port);
  *fd_out = fd;
  return TDM_OK;
}

/* One attempt: a connected non-blocking socket, or -1 with *err set (-2: no socket at all). */
static int connect_once(const struct sockaddr_in *sa, double deadline, int *err) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *err = errno;
    return -2;
  }
  if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0) return fd;
  *err = errno;
  while (*err == EINPROGRESS) { /* bounded: an unanswered SYN would block for minutes */
    struct pollfd pf = {fd, POLLOUT, 0};
    int r = poll(&pf, 1, ms_left(deadline));
    if (r > 0) {
      socklen_t l = sizeof *err;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, err, &l) != 0) *err = errno;
      if (*err == 0) return fd;
    } else if (r < 0 && errno != EINTR) {
      *err = errno;
    } else if (tdm_time_now() >= deadline) {
      *err = ETIMEDOUT;
    }
  }
  close(fd);
  return -1;
}

tdm_status tdm__net_connect(const char *addr, int port, double deadline, int *fd_out) {
  struct sockaddr_in sa;
  TDM__TRY(resolve(addr, port, &sa));
  double t0 = tdm_time_now();
  int err = 0;
  do {
    int fd = connect_once(&sa, deadline, &err);
    if (fd >= 0) {
      *fd_out = fd;
      return TDM_OK;
    }
    if (fd == -2) return tdm__set_error(TDM_ERR_SYSTEM, "socket: %s", strerror(err));
    usleep(20000); /* not listening yet: try again */
  } while (tdm_time_now() < deadline);
  return tdm__set_error(TDM_ERR_TIMEOUT, "no connection to %s:%d within %.0f s (last attempt: %s)", addr ? addr : "*",
                        port, deadline - t0, strerror(err));
}

tdm_status tdm__net_send_all(int fd, const void *buf, size_t n, double deadline, const char *what) {
  const char *p = buf;
  size_t want = n;
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return tdm__set_error(TDM_ERR_REMOTE, "%s: connection lost after %zu of %zu bytes were sent: %s", what, want - n,
                            want, strerror(errno));
    struct pollfd pf = {fd, POLLOUT, 0};
    if (poll(&pf, 1, ms_left(deadline)) == 0 && tdm_time_now() >= deadline)
      return tdm__set_error(TDM_ERR_TIMEOUT, "%s: timed out sending (%zu of %zu bytes went)", what, want - n, want);
  }
  return TDM_OK;
}

/* recv_all that also says whether the peer closed or reset the connection (*closed, may be NULL). */
static tdm_status recv_all(int fd, void *buf, size_t n, double deadline, const char *what, int *closed) {
  char *p = buf;
  size_t want = n;
  if (closed) *closed = 0;
  while (n) {
    ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) {
      if (closed) *closed = 1;
      return tdm__set_error(TDM_ERR_REMOTE, "%s: the peer closed the connection after %zu of %zu bytes", what,
                            want - n, want);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (closed) *closed = errno == ECONNRESET;
      return tdm__set_error(TDM_ERR_REMOTE, "%s: connection lost after %zu of %zu bytes: %s", what, want - n, want,
                            strerror(errno));
    }
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, ms_left(deadline)) == 0 && tdm_time_now() >= deadline)
      return tdm__set_error(TDM_ERR_TIMEOUT, "%s: timed out receiving (%zu of %zu bytes came)", what, want - n, want);
  }
  return TDM_OK;
}

tdm_status tdm__net_recv_all(int fd, void *buf, size_t n, double deadline, const char *what) {
  return recv_all(fd, buf, n, deadline, what, NULL);
}

tdm_status tdm__net_pick_addr(const char *ifname, const char *master, char *addr, size_t n, char *chosen_if, size_t m) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return tdm__set_error(TDM_ERR_SYSTEM, "getifaddrs: %s", strerror(errno));
  int want_loopback = !master || !strncmp(master, "127.", 4) || !strcmp(master, "localhost");
  tdm_status st = TDM_ERR_INVALID_ARG;
  for (int pass = 0; pass < 2 && st != TDM_OK; pass++)
    for (struct ifaddrs *i = ifs; i && st != TDM_OK; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      int lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
      if (ifname) {
        if (strcmp(i->ifa_name, ifname)) continue;
      } else if (pass == 0 && lo != want_loopback) {
        continue; /* the second pass takes anything that is up */
      }
      inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr, (socklen_t)n);
      snprintf(chosen_if, m, "%s", i->ifa_name);
      st = TDM_OK;
    }
  freeifaddrs(ifs);
  if (st != TDM_OK) {
    if (ifname)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_SOCKET_IFNAME=%s: no such interface with an IPv4 address that is up",
                            ifname);
    snprintf(addr, n, "127.0.0.1");
    snprintf(chosen_if, m, "lo");
  }
  return TDM_OK;
}

/* ---- handshake ---------------------------------------------------------------------------- */
#define STR_(x) #x
#define STR(x) STR_(x)
typedef struct {
  uint32_t magic, version, token_len;
  int32_t rank;
} hello;
_Static_assert(sizeof(hello) == TDM_NET_HELLO_BYTES, "the hello is 16 bytes");

static size_t token_len(const char *token) { return token ? strlen(token) : 0; }

/* Why a hello is refused, or NULL; the token bytes are checked separately. */
static const char *hello_problem(const hello *h, uint32_t magic, size_t tl) {
  if (h->magic != magic) return "not a tandem connection (wrong magic)";
  if (h->version != TDM_NET_VERSION) return "another protocol version";
  if (h->token_len != tl) return "wrong job token";
  return NULL;
}

/* Compares every byte: no early exit that leaks how much matched. */
static int token_differs(const void *got, const char *token, size_t n) {
  unsigned diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (unsigned)(((const unsigned char *)got)[i] ^ (unsigned char)token[i]);
  return diff != 0;
}

tdm_status tdm__net_send_hello(int fd, uint32_t magic, const char *token, int32_t rank, double deadline) {
  size_t tl = token_len(token);
  if (tl > TDM_NET_MAX_TOKEN) return tdm__set_error(TDM_ERR_INVALID_ARG, "job token longer than %d bytes", TDM_NET_MAX_TOKEN);
  hello h = {magic, TDM_NET_VERSION, (uint32_t)tl, rank};
  TDM__TRY(tdm__net_send_all(fd, &h, sizeof h, deadline, "handshake"));
  return tl ? tdm__net_send_all(fd, token, tl, deadline, "handshake") : TDM_OK;
}

tdm_status tdm__net_recv_hello(int fd, uint32_t got_magic, uint32_t magic, const char *token, int32_t *rank,
                               double deadline) {
  hello h = {got_magic, 0, 0, 0};
  TDM__TRY(tdm__net_recv_all(fd, (char *)&h + 4, sizeof h - 4, deadline, "handshake"));
  size_t tl = token_len(token);
  const char *why = hello_problem(&h, magic, tl);
  if (why && h.magic != magic) return tdm__set_error(TDM_ERR_MISMATCH, "%s: magic 0x%08x", why, h.magic);
  if (why && h.version != TDM_NET_VERSION)
    return tdm__set_error(TDM_ERR_MISMATCH, "protocol version %u; this build speaks %u", h.version, TDM_NET_VERSION);
  if (why) return tdm__set_error(TDM_ERR_MISMATCH, "%s", why);
  char buf[TDM_NET_MAX_TOKEN];
  if (tl) TDM__TRY(tdm__net_recv_all(fd, buf, tl, deadline, "handshake"));
  if (token_differs(buf, token, tl)) return tdm__set_error(TDM_ERR_MISMATCH, "wrong job token");
  *rank = h.rank;
  return TDM_OK;
}

tdm_status tdm__net_dial(const char *addr, int port, uint32_t magic, const char *token, int32_t rank, double deadline,
                         int *fd_out, uint32_t *first) {
  int busy = 0;
  uint32_t held = 0;
  for (;;) {
    int fd = -1, closed = 0;
    uint32_t w = 0;
    tdm_status st = tdm__net_connect(addr, port, deadline, &fd);
    int connected = st == TDM_OK;
    if (st == TDM_OK) st = tdm__net_send_hello(fd, magic, token, rank, deadline);
    if (st == TDM_OK) {
      st = recv_all(fd, &w, 4, deadline, "handshake", &closed);
    } else if (connected && st == TDM_ERR_REMOTE) { /* dropped before our hello went out: busy? */
      tdm_status sent = st;
      char why[256];
      snprintf(why, sizeof why, "%s", tdm_last_error());
      if (recv_all(fd, &w, 4, tdm_time_now() + 0.1, "handshake", &closed) == TDM_OK && w == TDM_NET_BUSY_MAGIC) st = TDM_OK;
      else st = tdm__set_error(sent, "%s", why);
    }
    if (st == TDM_OK && w != TDM_NET_BUSY_MAGIC) {
      *fd_out = fd;
      *first = w;
      return TDM_OK;
    }
    if (st == TDM_OK) { /* dropped before our hello was read: try again while there is time */
      busy++;
      if (tdm__net_recv_all(fd, &held, 4, deadline, "handshake") != TDM_OK) held = 0;
    }
    if (fd >= 0) close(fd);
    if (st == TDM_OK && tdm_time_now() + 0.05 < deadline) {
      usleep(50000);
      continue;
    }
    if (busy) /* whatever the last attempt met at the deadline, being dropped is what happened */
      return tdm__set_error(TDM_ERR_REMOTE,
                            "it dropped our connection before the handshake completed (%d time%s): it is overloaded "
                            "by %u unauthenticated connections (strangers, not ranks of this job)",
                            busy, busy == 1 ? "" : "s", held);
    if (!connected) return st;
    if (st == TDM_ERR_TIMEOUT)
      return tdm__set_error(st, "it accepted our connection but did not answer our handshake in time");
    if (closed)
      return tdm__set_error(st, "it closed the connection without accepting our handshake: its job token "
                                "(TANDEM_JOB_TOKEN) or its protocol version differs from ours");
    return tdm__set_error(st, "handshake: %s", tdm_last_error());
  }
}

/* ---- the accepting side ---------------------------------------------------------------------- */
#define GATE_REASONS 8
#define GATE_ACCEPT_BATCH 32 /* per serve, so that the pending are read between batches */

typedef struct {
  int fd;
  double since; /* accepted at */
  size_t len;   /* hello bytes read so far */
  unsigned char buf[TDM_NET_HELLO_BYTES + TDM_NET_MAX_TOKEN];
  char peer[64];
} pending;

struct tdm__net_gate {
  int lfd;
  uint32_t magic;
  const char *token;
  char who[64];
  tdm__net_admit_fn admit;
  void *ctx;
  pending p[TDM_NET_MAX_PENDING];
  int n, n_polled, max_pending;
  double round_start; /* of the current serve: connections accepted since have not been read yet */
  double accept_paused_until; /* out of file descriptors: do not spin on the listener */
  /* refusals since the last report */
  char reason[GATE_REASONS][96];
  uint64_t count[GATE_REASONS];
  int n_reasons;
  uint64_t total;
  double window_start, last_report;
  char last_peer[64], last_reason[96];
};

/* How many descriptors this process has open (Linux: /proc/self/fd, less the one reading it), or -1. */
static int open_descriptors(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1;
}

size_t tdm__net_gate_bytes(void) { return sizeof(tdm__net_gate); }

tdm_status tdm__net_gate_create(tdm__net_gate **out, int lfd, uint32_t magic, const char *token, const char *who,
                                tdm__net_admit_fn admit, void *ctx) {
  tdm__net_gate *g = tdm__calloc(1, sizeof *g);
  if (!g) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", who);
  g->lfd = lfd;
  g->magic = magic;
  g->token = token;
  snprintf(g->who, sizeof g->who, "%s", who);
  g->admit = admit;
  g->ctx = ctx;
  g->last_report = -1e300; /* the first refusal is reported at once */
  /* strangers may hold an eighth of our descriptors at most: the rest stay for ranks, files and
     a second listener in the same process (rank 0 has the store's and the mesh's) */
  struct rlimit rl;
  int have_rl = getrlimit(RLIMIT_NOFILE, &rl) == 0;
  rlim_t eighth = have_rl ? rl.rlim_cur / 8 : TDM_NET_MAX_PENDING;
  g->max_pending = eighth < 4 ? 4 : eighth < TDM_NET_MAX_PENDING ? (int)eighth : TDM_NET_MAX_PENDING;
  /* and a quarter at most of the descriptors still free: a process that already holds most of
     its limit keeps the rest for its ranks and its other threads (rank 0 dials its own store and
     builds its mesh while strangers flood the store) */
  int open_now = open_descriptors();
  if (have_rl && open_now > 0 && rl.rlim_cur != RLIM_INFINITY && (rlim_t)open_now < rl.rlim_cur) {
    int quarter = (int)((rl.rlim_cur - (rlim_t)open_now) / 4);
    if (quarter < 1) quarter = 1;
    if (quarter < g->max_pending) {
      g->max_pending = quarter;
      tdm_log(TDM_LOG_WARN, "%s: only %d of %llu file descriptors are free (ulimit -n): at most %d connections may wait "
              "for a handshake", who, (int)(rl.rlim_cur - (rlim_t)open_now), (unsigned long long)rl.rlim_cur, quarter);
    }
  }
  tdm__net_nonblock(lfd);
  *out = g;
  return TDM_OK;
}

static void report(tdm__net_gate *g, int force) {
  double now = tdm_time_now();
  if (!g->total || (!force && now - g->last_report < TDM_NET_REPORT_S)) return;
  if (g->total == 1) {
    tdm_log(TDM_LOG_WARN, "%s: dropped the connection from %s: %s", g->who, g->last_peer, g->last_reason);
  } else {
    char parts[GATE_REASONS * 112] = "";
    size_t k = 0;
    for (int i = 0; i < g->n_reasons && k < sizeof parts; i++)
      k += (size_t)snprintf(parts + k, sizeof parts - k, "%s%llu %s", i ? ", " : "", (unsigned long long)g->count[i],
                            g->reason[i]);
    tdm_log(TDM_LOG_WARN, "%s: dropped %llu connections in %.1f s: %s (the last from %s)", g->who,
            (unsigned long long)g->total, now - g->window_start, parts, g->last_peer);
  }
  g->total = 0;
  g->n_reasons = 0;
  g->last_report = now;
}

static void count(tdm__net_gate *g, const char *peer, const char *why) {
  int i = 0;
  while (i < g->n_reasons && strcmp(g->reason[i], why)) i++;
  if (i == g->n_reasons) {
    if (i == GATE_REASONS) why = "other reasons", i--; /* the last slot collects the rest */
    else g->n_reasons++, g->count[i] = 0;
    snprintf(g->reason[i], sizeof g->reason[i], "%s", why);
  }
  g->count[i]++;
  if (!g->total++) g->window_start = tdm_time_now();
  snprintf(g->last_peer, sizeof g->last_peer, "%s", peer);
  snprintf(g->last_reason, sizeof g->last_reason, "%s", why);
}

/* Closes pending connection i (busy: first telling it why, so a real rank that was merely slow
 * can say so and try again) and counts the reason. */
static void refuse(tdm__net_gate *g, int i, const char *why, int busy) {
  pending *c = &g->p[i];
  if (busy) {
    uint32_t note[2] = {TDM_NET_BUSY_MAGIC, (uint32_t)g->n};
    if (send(c->fd, note, sizeof note, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */
    }
  }
  close(c->fd);
  count(g, c->peer, why);
  g->p[i] = g->p[--g->n];
}

int tdm__net_hello_parse(const unsigned char *buf, size_t len, uint32_t magic, const char *token, size_t *need,
                         int32_t *rank, const char **why) {
  hello h;
  if (len < TDM_NET_HELLO_BYTES) {
    *need = TDM_NET_HELLO_BYTES - len;
    return 0;
  }
  memcpy(&h, buf, sizeof h);
  /* magic and version at once; a wrong token only once all of it came, so a refusal is a clean close */
  *why = h.token_len > TDM_NET_MAX_TOKEN ? "a job token longer than " STR(TDM_NET_MAX_TOKEN) " bytes"
                                         : hello_problem(&h, magic, h.token_len);
  if (*why) return -1;
  if (len < TDM_NET_HELLO_BYTES + h.token_len) {
    *need = TDM_NET_HELLO_BYTES + h.token_len - len;
    return 0;
  }
  size_t tl = token_len(token);
  if (hello_problem(&h, magic, tl) || token_differs(buf + TDM_NET_HELLO_BYTES, token, tl)) {
    *why = "wrong job token";
    return -1;
  }
  *rank = h.rank;
  return 1;
}

static void read_hello(tdm__net_gate *g, int i) {
  pending *c = &g->p[i];
  int32_t rank = -1;
  size_t need = 0;
  const char *why = NULL;
  int r;
  /* the whole hello, token included whatever its length, so a refusal is a clean close */
  while ((r = tdm__net_hello_parse(c->buf, c->len, g->magic, g->token, &need, &rank, &why)) == 0) {
    ssize_t k = recv(c->fd, c->buf + c->len, need, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k <= 0) {
      refuse(g, i, k == 0 ? "closed before completing its handshake" : "connection lost before its handshake", 0);
      return;
    }
    c->len += (size_t)k;
  }
  if (r < 0) {
    refuse(g, i, why, 0);
    return;
  }
  why = g->admit(g->ctx, c->fd, rank, c->peer);
  if (why) {
    refuse(g, i, why, 0);
    return;
  }
  g->p[i] = g->p[--g->n]; /* the fd is the caller's now */
}

/* The oldest pending connection if it was there before this round (so it was read, and its hello
 * is not complete), else -1: only those may be pushed out, as a rank's hello may wait in the others. */
static int oldest_read(const tdm__net_gate *g) {
  int old = -1;
  for (int i = 0; i < g->n; i++)
    if (g->p[i].since < g->round_start && (old < 0 || g->p[i].since < g->p[old].since)) old = i;
  return old;
}

static void accept_some(tdm__net_gate *g) {
  for (int k = 0; k < GATE_ACCEPT_BATCH; k++) {
    if (g->n >= g->max_pending) { /* make room: the oldest stranger goes */
      int old = oldest_read(g);
      if (old < 0) return; /* all came in this round: read them first, accept the rest next round */
      refuse(g, old, "pushed out by newer connections (too many without a handshake)", 1);
    }
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int fd = accept4(g->lfd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      /* hold one fewer from now on: the descriptor we could not get stays for the ranks and
         for rank 0's other listener, which strangers here must not starve */
      if (g->n > 1) g->max_pending = g->n - 1;
      int old = oldest_read(g);
      if (old >= 0) {
        refuse(g, old, "pushed out for want of file descriptors", 1);
        continue;
      }
      g->accept_paused_until = tdm_time_now() + 0.1; /* rather than spin on the listener */
      count(g, "?", "not accepted: out of file descriptors");
      return;
    }
    if (fd < 0) return; /* nothing waiting (EAGAIN), or it went away before we took it */
    pending *c = &g->p[g->n++];
    c->fd = fd;
    c->since = tdm_time_now();
    c->len = 0;
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(sa.sin_port));
  }
}

int tdm__net_gate_fill(tdm__net_gate *g, struct pollfd *pf) {
  int paused = tdm_time_now() < g->accept_paused_until;
  pf[0] = (struct pollfd){paused ? -1 : g->lfd, POLLIN, 0};
  for (int i = 0; i < g->n; i++) pf[1 + i] = (struct pollfd){g->p[i].fd, POLLIN, 0};
  g->n_polled = g->n;
  return 1 + g->n;
}

int tdm__net_gate_wait_ms(const tdm__net_gate *g, int max_ms) {
  double now = tdm_time_now(), next = g->total ? g->last_report + TDM_NET_REPORT_S : 1e300;
  for (int i = 0; i < g->n; i++)
    if (g->p[i].since + TDM_NET_HELLO_S < next) next = g->p[i].since + TDM_NET_HELLO_S;
  if (g->accept_paused_until > now && g->accept_paused_until < next) next = g->accept_paused_until;
  double left_ms = (next - now) * 1000;
  if (left_ms <= 0) return 0;
  return left_ms >= max_ms ? max_ms : (int)left_ms + 1;
}

void tdm__net_gate_serve(tdm__net_gate *g, const struct pollfd *pf) {
  g->round_start = tdm_time_now();
  /* downwards: refuse() moves the last entry, already served, into the freed place */
  for (int i = g->n_polled - 1; i >= 0; i--)
    if (pf[1 + i].revents) read_hello(g, i);
  g->n_polled = 0;
  double now = tdm_time_now();
  for (int i = g->n - 1; i >= 0; i--)
    if (now - g->p[i].since > TDM_NET_HELLO_S)
      refuse(g, i, "no handshake within " STR(TDM_NET_HELLO_S) " s", 1);
  if (pf[0].fd >= 0 && (pf[0].revents & POLLIN)) accept_some(g);
  report(g, 0);
}

void tdm__net_gate_destroy(tdm__net_gate *g) {
  if (!g) return;
  while (g->n) refuse(g, g->n - 1, "still without a handshake when the listener closed", 0);
  report(g, 1);
  tdm__free(g);
}
