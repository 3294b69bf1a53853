/* The TCP transport: a full mesh of connections, one per pair of ranks, set up through the
 * store. Every connection opens with the job token; a connection without it is logged and
 * closed, and the job goes on. run() drives all transfers with non-blocking sockets and poll,
 * so a ring's send and receive progress together; a peer that dies shows up as EOF or a reset
 * on its connection and fails the call at once, naming the rank. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "comm/net.h"

#define MESH_MAGIC 0x54444d54u /* "TMDT" */

typedef struct {
  tdm__transport base;
  int *fd;        /* fd[peer], -1 for self or closed */
  int *send_mid;  /* a send to this peer stopped mid-message: no ABORT may follow on that stream */
  tdm__store *store;
  const char *token; /* while the mesh is made */
  char refusal[96];
  int closed;
  char closed_why[256]; /* the abort's reason (a sub-communicator's failure closes its parent's links too) */
} tcp_tr;

static tdm_status peer_gone(tcp_tr *t, int peer, const char *how) {
  struct tdm_comm *c = t->base.comm;
  char b[160];
  return tdm__error_from(peer, tdm__set_error(TDM_ERR_REMOTE, "rank %d %s during %s (rank %d)", peer, how,
                                              tdm__call_str(&c->cur, b, sizeof b), c->rank));
}

/* After an ABORT header: read the reason (short, bounded wait). */
static tdm_status remote_abort(tcp_tr *t, int peer, const tdm__hdr *h) {
  char reason[600] = {0};
  size_t n = h->nbytes < sizeof reason - 1 ? h->nbytes : sizeof reason - 1;
  tdm__net_recv_all(t->fd[peer], reason, n, tdm_time_now() + 1.0, "abort reason");
  tdm_status st = h->op ? (tdm_status)(-(int)h->op) : TDM_ERR_REMOTE;
  if (st != TDM_ERR_MISMATCH && st != TDM_ERR_TIMEOUT) st = TDM_ERR_REMOTE;
  int from = h->root > 0 && h->root <= t->base.size ? h->root - 1 : peer; /* a relayer says where it began */
  return tdm__error_from(from != t->base.rank ? from : -1, tdm__set_error(st, "rank %d failed: %s", peer, reason));
}

/* Receives what is there of n bytes into dst for transfer x and counts them in x->done: 1 if
 * bytes came, 0 if it would block, or sets *st (the peer closed or reset) and returns -1. */
static int recv_some(tcp_tr *t, tdm__xfer *x, void *dst, size_t n, tdm_status *st) {
  ssize_t k = recv(t->fd[x->peer], dst, n, MSG_DONTWAIT);
  if (k > 0) {
    x->done += (size_t)k;
    return 1;
  }
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  *st = peer_gone(t, x->peer, k == 0 ? "closed its connection" : "reset its connection");
  return -1;
}

/* One step of transfer x: returns 1 if it moved bytes or finished, 0 if it would block, or sets
 * *st and returns -1. */
static int step(tcp_tr *t, tdm__xfer *x, tdm_status *st) {
  int fd = t->fd[x->peer];
  size_t total = sizeof(tdm__hdr) + x->nbytes;
  if (x->is_send) {
    struct iovec iov[2];
    int n = 0;
    if (x->done < sizeof(tdm__hdr)) iov[n++] = (struct iovec){(char *)&x->hdr + x->done, sizeof(tdm__hdr) - x->done};
    size_t pd = x->done > sizeof(tdm__hdr) ? x->done - sizeof(tdm__hdr) : 0;
    if (x->nbytes > pd) iov[n++] = (struct iovec){(char *)x->buf + pd, x->nbytes - pd};
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)n;
    ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      *st = peer_gone(t, x->peer, errno == EPIPE || errno == ECONNRESET ? "closed its connection" : strerror(errno));
      return -1;
    }
    x->done += (size_t)k;
    t->send_mid[x->peer] = x->done < total;
    if (x->done == total) x->complete = 1;
    return 1;
  }
  if (x->done < sizeof(tdm__hdr)) {
    int r = recv_some(t, x, (char *)&x->got + x->done, sizeof(tdm__hdr) - x->done, st);
    if (r <= 0) return r;
    if (x->done < sizeof(tdm__hdr)) return 1;
    if (x->got.magic == TDM_MSG_MAGIC && x->got.kind == TDM_COLL_ABORT) {
      *st = remote_abort(t, x->peer, &x->got);
      return -1;
    }
    if ((*st = tdm__xfer_header(tdm__active(&t->base), x)) != TDM_OK) return -1;
    if (x->nbytes == 0) x->complete = tdm__xfer_done(&t->base, x);
    return 1;
  }
  size_t pd = x->done - sizeof(tdm__hdr);
  int r = recv_some(t, x, (char *)x->buf + pd, x->nbytes - pd, st);
  if (r <= 0) return r;
  if (x->done == total) x->complete = tdm__xfer_done(&t->base, x);
  return 1;
}

/* "rank 2 (to receive)", "ranks 1 (to send), 3 (to receive)" for the transfers in idx. */
static const char *waited_for(const tdm__xfer *x, const int *idx, int n) {
  static _Thread_local char out[200];
  size_t k = (size_t)snprintf(out, sizeof out, "rank%s ", n == 1 ? "" : "s");
  for (int i = 0; i < n && k < sizeof out; i++)
    k += (size_t)snprintf(out + k, sizeof out - k, "%s%d (to %s)", i ? ", " : "", x[idx[i]].peer,
                          x[idx[i]].is_send ? "send" : "receive");
  if (!n) snprintf(out, sizeof out, "nothing (no transfer could move)");
  return out;
}

static tdm_status run(tdm__transport *tr, tdm__xfer *x, int n, double deadline) {
  tcp_tr *t = (tcp_tr *)tr;
  struct tdm_comm *c = tr->comm;
  if (t->closed) return tdm__set_error(TDM_ERR_REMOTE, "rank %d: the connections are closed (%s)", c->rank, t->closed_why);
  struct pollfd pf[2 * n + 1];
  int idx[2 * n + 1];
  for (;;) {
    /* progress every transfer that is first in line for its (peer, direction) */
    int pending = 0, moved = 0, np = 0;
    for (int i = 0; i < n; i++) {
      if (x[i].complete) continue;
      pending++;
      if (!tdm__xfer_turn(x, i)) continue;
      tdm_status st = TDM_OK;
      int r;
      while ((r = step(t, &x[i], &st)) == 1 && !x[i].complete) moved = 1;
      if (r < 0) return st;
      if (x[i].complete) {
        moved = 1;
        continue;
      }
      pf[np] = (struct pollfd){t->fd[x[i].peer], x[i].is_send ? POLLOUT : POLLIN, 0};
      idx[np++] = i;
    }
    if (!pending) return TDM_OK;
    if (moved) continue;
    double left = deadline - tdm_time_now();
    if (left <= 0) {
      char b[160];
      return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s waiting for %s", c->rank,
                            tdm__call_str(&c->cur, b, sizeof b), c->timeout_s, waited_for(x, idx, np));
    }
    int ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
    if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR)
      return tdm__set_error(TDM_ERR_SYSTEM, "rank %d: poll: %s", c->rank, strerror(errno));
    for (int k = 0; k < np; k++) /* a hang-up on a send: the peer is gone */
      if ((pf[k].revents & (POLLERR | POLLHUP)) && x[idx[k]].is_send)
        return peer_gone(t, x[idx[k]].peer, "closed its connection");
  }
}

static void tcp_abort(tdm__transport *tr, const char *reason) {
  tcp_tr *t = (tcp_tr *)tr;
  if (t->closed) return;
  snprintf(t->closed_why, sizeof t->closed_why, "%s", reason);
  size_t rl = strlen(reason);
  /* root: 1 + the rank where a relayed failure began (0: ours) */
  struct tdm_comm *ac = tdm__active(tr); /* the communicator that failed (a child shares our links) */
  int from = ac->fail_origin;
  tdm__hdr h = {TDM_MSG_MAGIC, TDM_COLL_ABORT, 0, 0, (uint32_t)(-(int)ac->fail_status), from >= 0 ? from + 1 : 0,
                tr->comm->comm_id, 0, rl};
  /* telling is best effort: a send that fails must not replace the caller's error (nor its origin) */
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", tdm_last_error());
  int saved_origin = tdm_last_error_origin();
  for (int p = 0; p < tr->size; p++) {
    if (t->fd[p] < 0) continue;
    if (!t->send_mid[p]) { /* tell why, if the stream is at a message boundary */
      double dl = tdm_time_now() + 0.2;
      if (tdm__net_send_all(t->fd[p], &h, sizeof h, dl, "abort") == TDM_OK)
        tdm__net_send_all(t->fd[p], reason, rl, dl, "abort");
    }
    shutdown(t->fd[p], SHUT_WR); /* the peer reads our reason, then EOF; unread data stays with us */
  }
  t->closed = 1;
  tdm__error_from(saved_origin, tdm__set_error(TDM_OK, "%s", saved));
}

static void tcp_destroy(tdm__transport *tr) {
  tcp_tr *t = (tcp_tr *)tr;
  for (int p = 0; p < tr->size; p++)
    if (t->fd[p] >= 0) close(t->fd[p]);
  tdm__store_close(t->store);
  tdm__free(t->fd);
  tdm__free(t->send_mid);
  tdm__free(t);
}

/* The mesh gate admits a rank above ours that is not linked yet, and answers with our hello. */
static const char *mesh_admit(void *ctx, int fd, int32_t r, const char *peer) {
  (void)peer;
  tcp_tr *t = ctx;
  if (r <= t->base.rank || r >= t->base.size || t->fd[r] >= 0) {
    snprintf(t->refusal, sizeof t->refusal, "it has the job token but claims rank %d, which is not expected here", r);
    return t->refusal;
  }
  if (tdm__net_send_hello(fd, MESH_MAGIC, t->token, t->base.rank, tdm_time_now() + TDM_NET_HELLO_S) != TDM_OK)
    return "our answer to its handshake could not be sent";
  t->fd[r] = fd;
  return NULL;
}

/* Accepts every higher rank on lfd; strangers are read concurrently, each with a short deadline. */
static tdm_status accept_higher(tcp_tr *t, int lfd, const char *token, double deadline) {
  int me = t->base.rank, P = t->base.size;
  char who[48];
  snprintf(who, sizeof who, "tcp: rank %d", me);
  t->token = token;
  tdm__net_gate *g;
  TDM__TRY(tdm__net_gate_create(&g, lfd, MESH_MAGIC, token, who, mesh_admit, t));
  tdm_status st = TDM_OK;
  for (;;) {
    int missing = 0;
    for (int r = me + 1; r < P; r++) missing += t->fd[r] < 0;
    if (!missing) break;
    double left = deadline - tdm_time_now();
    if (left <= 0) {
      char list[256] = "";
      size_t k = 0;
      for (int r = me + 1, shown = 0; r < P && k < sizeof list; r++)
        if (t->fd[r] < 0 && shown++ < 16) k += (size_t)snprintf(list + k, sizeof list - k, "%s%d", k ? ", " : "", r);
      st = tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %d higher rank%s (%s%s) did not connect within %.0f s", me, missing,
                          missing == 1 ? "" : "s", list, missing > 16 ? ", ..." : "", t->base.comm->timeout_s);
      break;
    }
    struct pollfd pf[1 + TDM_NET_MAX_PENDING];
    int np = tdm__net_gate_fill(g, pf);
    int ms = tdm__net_gate_wait_ms(g, left > 1.0 ? 1000 : (int)(left * 1000) + 1);
    if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR) {
      st = tdm__set_error(TDM_ERR_SYSTEM, "rank %d: poll: %s", me, strerror(errno));
      break;
    }
    tdm__net_gate_serve(g, pf);
  }
  tdm__net_gate_destroy(g);
  return st;
}

/* Something (or EOF, or an error) is waiting on peer's connection. */
static int tcp_pending(tdm__transport *tr, int peer, int slow) {
  (void)slow;
  tcp_tr *t = (tcp_tr *)tr;
  if (t->closed || t->fd[peer] < 0) return 1;
  char b;
  ssize_t k = recv(t->fd[peer], &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return k >= 0 || !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

static const tdm__transport_ops tcp_ops = {"tcp", run, tcp_abort, tcp_destroy, NULL, tcp_pending, NULL, NULL, NULL};

tdm_status tdm__tcp_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  int P = c->size, me = c->rank;
  tcp_tr *t = tdm__calloc(1, sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "tcp: out of memory");
  t->base.ops = &tcp_ops;
  t->base.comm = c;
  t->base.rank = me;
  t->base.size = P;
  t->fd = tdm__malloc(sizeof(int) * (size_t)P);
  t->send_mid = tdm__calloc((size_t)P, sizeof(int));
  int lfd = -1;
  tdm_status st = t->fd && t->send_mid ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "tcp: out of memory");
  for (int p = 0; t->fd && p < P; p++) t->fd[p] = -1;
  double deadline = tdm_time_now() + c->timeout_s;
  if (st == TDM_OK && P > 1) st = tdm__store_open(&t->store, cfg, c->timeout_s);
  char addr[64], ifn[64], key[64], val[96];
  int port = 0;
  if (st == TDM_OK && P > 1) st = tdm__net_pick_addr(cfg->ifname, cfg->master_addr, addr, sizeof addr, ifn, sizeof ifn);
  if (st == TDM_OK && P > 1) st = tdm__net_listen(addr, 0, &lfd, &port);
  if (st == TDM_OK && P > 1) {
    tdm_log(TDM_LOG_INFO, "tcp: rank %d listens on %s (%s) port %d", me, addr, ifn, port);
    snprintf(key, sizeof key, "tcp/%d", me);
    snprintf(val, sizeof val, "%s:%d", addr, port);
    int taken = 0;
    st = tdm__store_set_once(t->store, key, val, strlen(val), &taken);
    if (st == TDM_OK && taken) { /* else the two would wait for each other's peers until the timeout */
      void *v = NULL;
      size_t n = 0;
      char first[96] = "?";
      if (tdm__store_get(t->store, key, &v, &n, 1) == TDM_OK) snprintf(first, sizeof first, "%.*s", (int)n, (char *)v);
      tdm__free(v);
      st = tdm__set_error(TDM_ERR_INVALID_USAGE,
                          "rank %d: another process has joined as rank %d already (it listens at %s): two processes given "
                          "RANK=%d, or a second job on the same MASTER_ADDR:MASTER_PORT (%s:%d)?",
                          me, me, first, me, cfg->master_addr ? cfg->master_addr : "127.0.0.1", cfg->master_port ? cfg->master_port : 29500);
    }
  }
  /* everyone's address first, so rank 0 can finish (and stop serving) once all are linked */
  char (*peers)[96] = tdm__calloc((size_t)P, 96);
  if (!peers && st == TDM_OK) st = tdm__set_error(TDM_ERR_NO_MEMORY, "tcp: out of memory");
  for (int p = 0; st == TDM_OK && p < me; p++) {
    void *v;
    size_t n;
    snprintf(key, sizeof key, "tcp/%d", p);
    st = tdm__store_get(t->store, key, &v, &n, deadline - tdm_time_now());
    if (st == TDM_OK) {
      snprintf(peers[p], 96, "%.*s", (int)n, (char *)v);
      tdm__free(v);
    }
  }
  /* connect to every lower rank; accept every higher one */
  for (int p = 0; st == TDM_OK && p < me; p++) {
    char *colon = strrchr(peers[p], ':');
    if (!colon) {
      st = tdm__set_error(TDM_ERR_REMOTE, "tcp: rank %d published a bad address '%s'", p, peers[p]);
      break;
    }
    *colon = 0;
    int fd = -1;
    uint32_t first = 0;
    int32_t their = -1;
    st = tdm__net_dial(peers[p], atoi(colon + 1), MESH_MAGIC, cfg->job_token, me, deadline, &fd, &first);
    if (st == TDM_OK) st = tdm__net_recv_hello(fd, first, MESH_MAGIC, cfg->job_token, &their, deadline);
    if (st == TDM_OK && their != p) st = tdm__set_error(TDM_ERR_MISMATCH, "expected rank %d, reached rank %d", p, their);
    if (st != TDM_OK) {
      if (fd >= 0) close(fd);
      st = tdm__set_error(st, "rank %d cannot link to rank %d at %s:%s: %s", me, p, peers[p], colon + 1, tdm_last_error());
      break;
    }
    t->fd[p] = fd;
  }
  if (st == TDM_OK && me < P - 1) st = accept_higher(t, lfd, cfg->job_token, deadline);
  tdm__free(peers);
  if (lfd >= 0) close(lfd); /* the mesh is complete: no one else may join */
  if (st != TDM_OK) {
    tdm_status e = tdm__set_error(st, "%s", tdm_last_error());
    tcp_destroy(&t->base);
    return e;
  }
  for (int p = 0; p < P; p++)
    if (t->fd[p] >= 0) {
      tdm__net_tune(t->fd[p]);
      tdm__net_nonblock(t->fd[p]);
    }
  *out = &t->base;
  return TDM_OK;
}
