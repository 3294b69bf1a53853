/* The elastic rendezvous server and its client's connection (rdzv.h). The server is one poll loop
 * over non-blocking sockets on a thread of the hosting launcher; strangers pass the gate of net.h
 * first (token, deadline), so none of them can hold up the job's launchers. */
#define _GNU_SOURCE
#include "launch/rdzv.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/net.h"
#include "core/internal.h"

#define PING_EVERY_S 1.0
#define SETTLE_S 0.5

typedef struct {
  int fd;
  char peer[64];
  char buf[2 * TDM_RDZV_LINE];
  size_t len;
  int joined, done, closing, dead;
  int member;    /* node rank + 1 in the running round; 0: not a member */
  int prev_rank; /* node rank in the round before; a large number when none */
  int64_t seq;   /* join order */
  char id[256], addr[64];
  int port;
  double heard, pinged;
} node;

struct tdm__rdzv_server {
  tdm__rdzv_config cfg;
  char token[TDM_NET_MAX_TOKEN + 1];
  int lfd, wake[2];
  pthread_t th;
  tdm__net_gate *gate;
  node *nodes;
  int n, cap;
  enum { FORMING, RUNNING, OVER } state;
  int64_t round, restarts, seq, seen_round;
  int history;        /* this server has closed a round */
  int stopping;       /* the host asked the thread to end */
  double t_open, t_min, stop_by;
  char prev[2048];    /* the last round's members, for naming the missing */
};

static void say(tdm__rdzv_server *s, node *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(tdm__rdzv_server *s, node *c, const char *fmt, ...) {
  (void)s;
  if (c->dead || c->closing) return;
  char line[TDM_RDZV_LINE];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  if (k > (int)sizeof line - 2) k = (int)sizeof line - 2;
  line[k++] = '\n';
  if (tdm__net_send_all(c->fd, line, (size_t)k, tdm_time_now() + 1, "rendezvous") != TDM_OK) c->dead = 1;
}

/* Tells every node the job's end and waits for them to close. */
static void over(tdm__rdzv_server *s, const char *what) {
  for (int i = 0; i < s->n; i++) {
    say(s, &s->nodes[i], "%s", what);
    s->nodes[i].closing = 1;
    shutdown(s->nodes[i].fd, SHUT_WR);
  }
  s->state = OVER;
}

static void restart(tdm__rdzv_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void restart(tdm__rdzv_server *s, const char *fmt, ...) {
  char why[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (++s->restarts > s->cfg.max_restarts) {
    char msg[900];
    snprintf(msg, sizeof msg, "ABORT %s; --max-restarts %lld reached", why, (long long)s->cfg.max_restarts);
    over(s, msg);
    return;
  }
  for (int i = 0; i < s->n; i++) {
    node *c = &s->nodes[i];
    c->prev_rank = c->member ? c->member - 1 : 1 << 30;
    if (c->member) say(s, c, "STOP %lld %s", (long long)s->round, why);
    c->member = c->done = 0;
  }
  s->state = FORMING;
  s->t_open = tdm_time_now();
  s->t_min = 0;
}

static int by_rank_then_seq(const void *a, const void *b) {
  const node *x = *(node *const *)a, *y = *(node *const *)b;
  if (x->prev_rank != y->prev_rank) return x->prev_rank < y->prev_rank ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void forming(tdm__rdzv_server *s) {
  double now = tdm_time_now();
  node *j[4096];
  int k = 0;
  for (int i = 0; i < s->n && k < 4096; i++)
    if (s->nodes[i].joined && !s->nodes[i].dead && !s->nodes[i].closing) j[k++] = &s->nodes[i];
  if (k < s->cfg.min_nodes) {
    s->t_min = 0;
    if (now - s->t_open < s->cfg.timeout_s) return;
    char have[1200] = "", missing[1200] = "", msg[2600];
    for (int i = 0; i < k; i++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", j[i]->id);
    if (s->prev[0]) { /* the last round's members that did not come back */
      char copy[sizeof s->prev], *save = NULL;
      snprintf(copy, sizeof copy, "%s", s->prev);
      for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        int back = 0;
        for (int i = 0; i < k; i++) back |= !strcmp(j[i]->id, t);
        if (!back) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "", t);
      }
    }
    if (!missing[0]) snprintf(missing, sizeof missing, "%d more node%s that never joined", s->cfg.min_nodes - k,
                              s->cfg.min_nodes - k == 1 ? "" : "s");
    snprintf(msg, sizeof msg, "ABORT the job needs at least %d node%s (--nnodes %d:%d); after %.0f s (--rdzv-timeout) "
             "%d %s here (%s); missing: %s", s->cfg.min_nodes, s->cfg.min_nodes == 1 ? "" : "s", s->cfg.min_nodes,
             s->cfg.max_nodes, s->cfg.timeout_s, k, k == 1 ? "is" : "are", k ? have : "none", missing);
    over(s, msg);
    return;
  }
  if (!s->t_min) s->t_min = now;
  if (k < s->cfg.max_nodes && !s->history && now - s->t_min < s->cfg.last_call_s) return;
  /* after a restart the survivors are here already; a moment lets what happened at once arrive too
     (a node's launcher closing, and another's ranks failing because of it: one restart, not two) */
  if (k < s->cfg.max_nodes && s->history && now - s->t_open < SETTLE_S) return;
  if (!s->history && s->seen_round > 0 && ++s->restarts > s->cfg.max_restarts) { /* took over from a lost host */
    char msg[300];
    snprintf(msg, sizeof msg, "ABORT the rendezvous host was lost; --max-restarts %lld reached", (long long)s->cfg.max_restarts);
    over(s, msg);
    return;
  }
  qsort(j, (size_t)k, sizeof j[0], by_rank_then_seq);
  int n = k < s->cfg.max_nodes ? k : s->cfg.max_nodes;
  s->round = (s->round > s->seen_round ? s->round : s->seen_round) + 1;
  s->prev[0] = 0;
  for (int i = 0; i < n; i++) {
    j[i]->member = i + 1;
    j[i]->done = 0;
    snprintf(s->prev + strlen(s->prev), sizeof s->prev - strlen(s->prev), "%s%s", i ? " " : "", j[i]->id);
  }
  for (int i = 0; i < n; i++)
    say(s, j[i], "ROUND %lld %d %d %d %s %d %lld", (long long)s->round, n, i, n * s->cfg.local_ranks, j[0]->addr,
        j[0]->port, (long long)s->restarts);
  for (int i = n; i < k; i++)
    say(s, j[i], "WAIT the job runs on --nnodes MAX = %d nodes; this one stands by until one is lost", s->cfg.max_nodes);
  s->state = RUNNING;
  s->history = 1;
}

static int members(const tdm__rdzv_server *s, int *done) {
  int m = 0, d = 0;
  for (int i = 0; i < s->n; i++)
    if (s->nodes[i].member && !s->nodes[i].dead) m++, d += s->nodes[i].done;
  if (done) *done = d;
  return m;
}

static void maybe_finished(tdm__rdzv_server *s) {
  int d, m = members(s, &d);
  if (s->state == RUNNING && m > 0 && d == m) over(s, "FINISH");
}

/* A node is gone: its connection closed, broke or went silent. */
static void lost(tdm__rdzv_server *s, node *c, const char *why) {
  int was = c->member && !c->done && s->state == RUNNING;
  c->dead = 1;
  if (!was) return;
  int d;
  members(s, &d);
  if (d > 0) { /* some finished: the training is over; this one's workers were at the end too */
    maybe_finished(s);
    return;
  }
  restart(s, "node %s was lost (%s)", c->id, why);
}

static void handle(tdm__rdzv_server *s, node *c, char *line) {
  c->heard = tdm_time_now();
  if (!strcmp(line, "PING")) return;
  if (!strncmp(line, "JOIN ", 5)) {
    int mn, mx, lr, port;
    long long rs, rr;
    char id[256], addr[64];
    if (c->joined || sscanf(line, "JOIN %255s %d %d %d %lld %lld %63s %d", id, &mn, &mx, &lr, &rs, &rr, addr, &port) != 8) {
      say(s, c, "REFUSE malformed or repeated JOIN");
      c->closing = 1;
      return;
    }
    if (mn != s->cfg.min_nodes || mx != s->cfg.max_nodes || lr != s->cfg.local_ranks) {
      say(s, c, "REFUSE its --nnodes %d:%d --nproc-per-node %d differ from the job's --nnodes %d:%d --nproc-per-node %d "
          "(the launcher that hosts the rendezvous)", mn, mx, lr, s->cfg.min_nodes, s->cfg.max_nodes, s->cfg.local_ranks);
      c->closing = 1;
      return;
    }
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    c->port = port;
    c->joined = 1;
    c->seq = s->seq++;
    if (rs > s->seen_round) s->seen_round = rs;
    if (rr > s->restarts) s->restarts = rr;
    if (s->state == OVER) {
      say(s, c, "ABORT the job is over");
      c->closing = 1;
    } else if (s->state == RUNNING) {
      if (members(s, NULL) < s->cfg.max_nodes) restart(s, "node %s joined", c->id);
      else say(s, c, "WAIT the job runs on --nnodes MAX = %d nodes; this one stands by until one is lost", s->cfg.max_nodes);
    }
    return;
  }
  long long r;
  int off = 0;
  if (sscanf(line, "DONE %lld", &r) == 1) {
    if (c->member && r == s->round && s->state == RUNNING) {
      c->done = 1;
      maybe_finished(s);
    }
    return;
  }
  if (sscanf(line, "FAIL %lld %n", &r, &off) == 1) {
    if (c->member && r == s->round && s->state == RUNNING) restart(s, "node %s: %s", c->id, line + off);
    return;
  }
  tdm_log(TDM_LOG_WARN, "rendezvous: %s sent an unknown line '%.60s'", c->peer, line);
}

static const char *admit(void *ctx, int fd, int32_t rank, const char *peer) {
  (void)rank;
  tdm__rdzv_server *s = ctx;
  if (s->n == s->cap) {
    int nc = s->cap ? 2 * s->cap : 16;
    if (nc > 4096) return "too many launchers (4096)";
    node *nn = tdm__malloc(sizeof(node) * (size_t)nc);
    if (!nn) return "out of memory for another launcher";
    if (s->nodes) memcpy(nn, s->nodes, sizeof(node) * (size_t)s->n);
    tdm__free(s->nodes);
    s->nodes = nn;
    s->cap = nc;
  }
  uint32_t ok = 1;
  if (tdm__net_send_all(fd, &ok, 4, tdm_time_now() + TDM_NET_HELLO_S, "rendezvous") != TDM_OK)
    return "the answer to its handshake could not be sent";
  node *c = &s->nodes[s->n++];
  memset(c, 0, sizeof *c);
  c->fd = fd;
  c->prev_rank = 1 << 30;
  c->heard = c->pinged = tdm_time_now();
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  return NULL;
}

static void *server_main(void *arg) {
  tdm__rdzv_server *s = arg;
  struct pollfd pf[1 + 4096 + 1 + TDM_NET_MAX_PENDING];
  for (;;) {
    int n = 0, nc = s->n;
    pf[n++] = (struct pollfd){s->wake[0], POLLIN, 0};
    for (int i = 0; i < nc; i++) pf[n++] = (struct pollfd){s->nodes[i].fd, POLLIN, 0};
    n += tdm__net_gate_fill(s->gate, pf + n);
    if (poll(pf, (nfds_t)n, tdm__net_gate_wait_ms(s->gate, 100)) < 0 && errno != EINTR) break;
    if (pf[0].revents) {
      char b[16];
      if (read(s->wake[0], b, sizeof b) <= 0) {
      }
      if (!s->stopping) s->stop_by = tdm_time_now() + 3;
      s->stopping = 1;
    }
    double now = tdm_time_now();
    for (int i = 0; i < nc; i++) {
      node *c = &s->nodes[i];
      if (c->dead || !(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t k = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (k <= 0) {
        lost(s, c, k == 0 ? "its launcher closed the connection: killed, or stopped" : strerror(errno));
        continue;
      }
      c->len += (size_t)k;
      c->buf[c->len] = 0;
      char *p = c->buf, *nl;
      while (!c->dead && (nl = strchr(p, '\n'))) {
        *nl = 0;
        handle(s, c, p);
        p = nl + 1;
      }
      c->len -= (size_t)(p - c->buf);
      memmove(c->buf, p, c->len);
      if (c->len >= sizeof c->buf - 1) lost(s, c, "a line longer than the protocol allows");
    }
    tdm__net_gate_serve(s->gate, pf + 1 + nc);
    for (int i = 0; i < s->n; i++) {
      node *c = &s->nodes[i];
      if (c->dead || c->closing) continue;
      if (now - c->heard > s->cfg.ping_timeout_s) {
        char why[96];
        snprintf(why, sizeof why, "silent for %.0f s", now - c->heard);
        lost(s, c, why);
      } else if (now - c->pinged >= PING_EVERY_S) {
        say(s, c, "PING");
        c->pinged = now;
      }
    }
    if (s->state == FORMING && !s->stopping) forming(s);
    int open = 0; /* drop the dead; count those we wait for */
    for (int i = 0; i < s->n;) {
      if (s->nodes[i].dead) {
        close(s->nodes[i].fd);
        s->nodes[i] = s->nodes[--s->n];
        continue;
      }
      open += s->nodes[i].closing;
      i++;
    }
    if (s->stopping && (open == 0 || now > s->stop_by)) break;
  }
  return NULL;
}

tdm_status tdm__rdzv_serve(tdm__rdzv_server **out, const char *host, int port, const tdm__rdzv_config *cfg,
                           int *bind_errno) {
  *bind_errno = 0;
  int fd = -1, got = 0;
  errno = 0;
  tdm_status st = tdm__net_listen(host, port, &fd, &got);
  if (st != TDM_OK) { /* errno from bind; the message says it too, should a call after bind have changed errno */
    *bind_errno = errno;
    if (strstr(tdm_last_error(), strerror(EADDRINUSE))) *bind_errno = EADDRINUSE;
    if (strstr(tdm_last_error(), strerror(EADDRNOTAVAIL))) *bind_errno = EADDRNOTAVAIL;
    return st;
  }
  tdm__rdzv_server *s = tdm__calloc(1, sizeof *s);
  if (!s) {
    close(fd);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "rendezvous: out of memory");
  }
  s->cfg = *cfg;
  snprintf(s->token, sizeof s->token, "%s", cfg->token ? cfg->token : "");
  s->cfg.token = s->token;
  s->lfd = fd;
  s->state = FORMING;
  s->t_open = tdm_time_now();
  st = tdm__net_gate_create(&s->gate, fd, TDM_RDZV_MAGIC, s->token, "rendezvous", admit, s);
  if (st == TDM_OK && pipe2(s->wake, O_CLOEXEC) != 0)
    st = tdm__set_error(TDM_ERR_SYSTEM, "rendezvous: pipe: %s", strerror(errno));
  else if (st == TDM_OK && (errno = pthread_create(&s->th, NULL, server_main, s)) != 0) {
    st = tdm__set_error(TDM_ERR_SYSTEM, "rendezvous: cannot start its thread: %s", strerror(errno));
    close(s->wake[0]);
    close(s->wake[1]);
  }
  if (st != TDM_OK) {
    tdm__net_gate_destroy(s->gate);
    close(fd);
    tdm__free(s);
    return st;
  }
  *out = s;
  return TDM_OK;
}

void tdm__rdzv_server_stop(tdm__rdzv_server *s) {
  if (!s) return;
  if (write(s->wake[1], "x", 1) < 0) { /* the thread also wakes every 100 ms */
  }
  pthread_join(s->th, NULL);
  tdm__net_gate_destroy(s->gate);
  for (int i = 0; i < s->n; i++) close(s->nodes[i].fd);
  tdm__free(s->nodes);
  close(s->lfd);
  close(s->wake[0]);
  close(s->wake[1]);
  tdm__free(s);
}

/* ---- client ---------------------------------------------------------------------------------- */
tdm_status tdm__rdzv_connect(tdm__rdzv_conn *c, const char *host, int port, const char *token, double since,
                             double deadline) {
  c->fd = -1;
  c->len = 0;
  uint32_t first = 0;
  double t0 = since;
  tdm_status st = tdm__net_dial(host, port, TDM_RDZV_MAGIC, token, 0, deadline, &c->fd, &first);
  if (st == TDM_ERR_TIMEOUT && strstr(tdm_last_error(), "did not answer our handshake"))
    return tdm__set_error(st, "the rendezvous endpoint %s:%d (--rdzv-endpoint) accepted the connection but did not answer "
                          "within %.0f s (--rdzv-timeout): it is not a tandem rendezvous, or it hangs", host, port,
                          deadline - t0);
  if (st == TDM_ERR_TIMEOUT) {
    const char *last = strstr(tdm_last_error(), "(last attempt: ");
    char why[200];
    snprintf(why, sizeof why, "%s", last ? last + 1 : tdm_last_error());
    if (last && strlen(why) && why[strlen(why) - 1] == ')') why[strlen(why) - 1] = 0;
    return tdm__set_error(st, "the rendezvous endpoint %s:%d (--rdzv-endpoint) did not answer within %.0f s "
                          "(--rdzv-timeout; %s)", host, port, deadline - t0, why);
  }
  if (st != TDM_OK && strstr(tdm_last_error(), "without accepting our handshake"))
    return tdm__set_error(TDM_ERR_MISMATCH, "the rendezvous at %s:%d refused our job token '%s' (--rdzv-id): the "
                          "launcher hosting it runs another job (another --rdzv-id), or it is not a tandem rendezvous",
                          host, port, token);
  if (st != TDM_OK)
    return tdm__set_error(st, "the rendezvous endpoint %s:%d (--rdzv-endpoint): %s", host, port, tdm_last_error());
  if (first != 1) {
    close(c->fd);
    c->fd = -1;
    return tdm__set_error(TDM_ERR_MISMATCH, "the rendezvous endpoint %s:%d answered 0x%08x, not a tandem rendezvous",
                          host, port, first);
  }
  return TDM_OK;
}

tdm_status tdm__rdzv_send(tdm__rdzv_conn *c, const char *fmt, ...) {
  char line[TDM_RDZV_LINE];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (k < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "rendezvous: cannot format a line");
  if (k > (int)sizeof line - 2) k = (int)sizeof line - 2;
  line[k++] = '\n';
  return tdm__net_send_all(c->fd, line, (size_t)k, tdm_time_now() + 5, "rendezvous");
}

int tdm__rdzv_recv_line(tdm__rdzv_conn *c, char *line, size_t n) {
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl) {
      size_t k = (size_t)(nl - c->buf);
      snprintf(line, n, "%.*s", (int)k, c->buf);
      memmove(c->buf, nl + 1, c->len - k - 1);
      c->len -= k + 1;
      return 1;
    }
    if (c->fd < 0 || c->len == sizeof c->buf) return -1;
    ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (r <= 0) return -1;
    c->len += (size_t)r;
  }
}

void tdm__rdzv_close(tdm__rdzv_conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->len = 0;
}
