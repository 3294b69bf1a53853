/* Rendezvous key-value stores: set, get (waits until the key exists), add.
 *
 * TCP store: rank 0 runs a server thread on master_addr:master_port (that address only, so a
 * loopback master is not reachable from the network); every rank (rank 0 too) is a client. A
 * client must open with the job token within a short deadline; the gate (net.h) reads every
 * stranger's hello concurrently, bounds how many wait, and reports refusals in counted lines.
 * The server is one poll loop over non-blocking sockets with a parse buffer per client, so a
 * client that sends half a request, or nothing, delays nobody.
 * File store: one file per key in a shared directory, written under a temporary name and
 * renamed, read by polling. */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "comm/net.h"

typedef struct {
  char *key;
  void *val;
  uint64_t n;
} kv;

typedef struct { /* a client that gave the job token */
  int fd;
  char peer[64];
  unsigned char *buf;
  size_t len, cap;
  char *waiting; /* a GET for a key that does not exist yet */
} client;

typedef struct {
  int lfd, wake[2];
  pthread_t th;
  kv *kvs;
  int n_kv, cap_kv;
  client *cl;
  int n_cl, cap_cl;
  struct pollfd *pf;
  int cap_pf;
  tdm__net_gate *gate; /* strangers until their hello is read */
} server;

struct tdm__store {
  int fd;             /* client connection (TCP) */
  char *dir;          /* file store */
  server *srv;        /* rank 0's server */
  double timeout_s;
};

/* ---- server ------------------------------------------------------------------------------ */
static kv *find(server *s, const char *k) {
  for (int i = 0; i < s->n_kv; i++)
    if (!strcmp(s->kvs[i].key, k)) return &s->kvs[i];
  return NULL;
}

static void drop(server *s, int i, const char *why) {
  if (why) tdm_log(TDM_LOG_WARN, "store: dropped the connection from %s: %s", s->cl[i].peer, why);
  close(s->cl[i].fd);
  tdm__free(s->cl[i].buf);
  tdm__free(s->cl[i].waiting);
  s->cl[i] = s->cl[--s->n_cl];
}

static int reply_get(client *c, const kv *e) {
  uint64_t n = e->n;
  double dl = tdm_time_now() + 5;
  return tdm__net_send_all(c->fd, &n, 8, dl, "store") == TDM_OK && tdm__net_send_all(c->fd, e->val, n, dl, "store") == TDM_OK;
}

static int out_of_memory(server *s, int i, char *key) {
  tdm__free(key);
  drop(s, i, "out of memory");
  return 0;
}

int tdm__store_parse(const unsigned char *buf, size_t len, tdm__store_req *req, const char **why) {
  if (len < TDM_STORE_REQ_HEAD) return 0;
  uint8_t cmd = buf[0];
  uint32_t kl;
  uint64_t vl;
  memcpy(&kl, buf + 1, 4);
  memcpy(&vl, buf + 5, 8);
  /* exactly what request() sends: anything else is not one of our ranks speaking, or a bug */
  *why = cmd != 'S' && cmd != 'O' && cmd != 'G' && cmd != 'A' ? "malformed request (unknown command)"
         : kl == 0 || kl > TDM_STORE_MAX_KEY           ? "malformed request (key length out of 1..4096)"
         : vl > TDM_STORE_MAX_VAL                      ? "malformed request (value longer than 64 MiB)"
         : cmd == 'G' && vl != 0                       ? "malformed request (a get with a value)"
         : cmd == 'A' && vl != 8                       ? "malformed request (an add whose value is not 8 bytes)"
         : NULL;
  if (*why) return -1;
  if (len >= TDM_STORE_REQ_HEAD + kl && memchr(buf + TDM_STORE_REQ_HEAD, 0, kl)) { /* kept as a C string */
    *why = "malformed request (a NUL byte in the key)";
    return -1;
  }
  size_t bytes = TDM_STORE_REQ_HEAD + kl + vl; /* at most TDM_STORE_MAX_REQ: no overflow */
  if (len < bytes) return 0;
  *req = (tdm__store_req){cmd, kl, vl, buf + TDM_STORE_REQ_HEAD, buf + TDM_STORE_REQ_HEAD + kl, bytes};
  return 1;
}

/* Serves the requests client i has sent; returns 0 if it was dropped. */
static int serve(server *s, int i) {
  client *c = &s->cl[i];
  for (;;) {
    tdm__store_req rq;
    const char *why = NULL;
    int r = tdm__store_parse(c->buf, c->len, &rq, &why);
    if (r == 0) return 1;
    if (r < 0) {
      drop(s, i, why);
      return 0;
    }
    uint8_t cmd = rq.cmd;
    uint32_t kl = rq.key_len;
    uint64_t vl = rq.val_len;
    char *key = tdm__malloc(kl + 1);
    if (!key) return out_of_memory(s, i, NULL);
    memcpy(key, rq.key, kl);
    key[kl] = 0;
    const unsigned char *val = rq.val;
    kv *e = find(s, key);
    int ok = 1;
    if (cmd == 'O' && e) { /* set once: the key is someone else's already; the answer says so, nothing changes */
      uint8_t ack = 0;
      tdm__free(key);
      ok = tdm__net_send_all(c->fd, &ack, 1, tdm_time_now() + 5, "store") == TDM_OK;
      memmove(c->buf, c->buf + rq.bytes, c->len - rq.bytes);
      c->len -= rq.bytes;
      if (!ok) {
        drop(s, i, NULL);
        return 0;
      }
      continue;
    }
    if (cmd == 'O') cmd = 'S';
    if (cmd == 'S' || cmd == 'A') {
      if (!e) {
        if (s->n_kv == s->cap_kv) {
          int nc = s->cap_kv ? 2 * s->cap_kv : 64;
          kv *nk = tdm__malloc(sizeof(kv) * (size_t)nc);
          if (!nk) return out_of_memory(s, i, key);
          if (s->kvs) memcpy(nk, s->kvs, sizeof(kv) * (size_t)s->n_kv);
          tdm__free(s->kvs);
          s->kvs = nk;
          s->cap_kv = nc;
        }
        e = &s->kvs[s->n_kv++];
        e->key = key;
        e->val = NULL;
        e->n = 0;
        key = NULL;
      }
      if (cmd == 'S') {
        void *v = tdm__malloc(vl ? vl : 1);
        if (!v) return out_of_memory(s, i, key);
        memcpy(v, val, vl);
        tdm__free(e->val);
        e->val = v;
        e->n = vl;
        uint8_t ack = 1;
        ok = tdm__net_send_all(c->fd, &ack, 1, tdm_time_now() + 5, "store") == TDM_OK;
      } else {
        int64_t cur = 0, d = 0;
        if (e->n == 8) memcpy(&cur, e->val, 8);
        if (vl == 8) memcpy(&d, val, 8);
        cur += d;
        if (e->n != 8) {
          void *v = tdm__malloc(8);
          if (!v) return out_of_memory(s, i, key);
          tdm__free(e->val);
          e->val = v;
          e->n = 8;
        }
        memcpy(e->val, &cur, 8);
        ok = tdm__net_send_all(c->fd, &cur, 8, tdm_time_now() + 5, "store") == TDM_OK;
      }
      /* a new value may complete waiting GETs */
      for (int j = 0; j < s->n_cl; j++)
        if (s->cl[j].waiting && !strcmp(s->cl[j].waiting, e->key)) {
          reply_get(&s->cl[j], e);
          tdm__free(s->cl[j].waiting);
          s->cl[j].waiting = NULL;
        }
    } else if (e) {
      ok = reply_get(c, e);
    } else {
      tdm__free(c->waiting);
      c->waiting = key;
      key = NULL;
    }
    tdm__free(key);
    memmove(c->buf, c->buf + rq.bytes, c->len - rq.bytes);
    c->len -= rq.bytes;
    if (!ok) {
      drop(s, i, NULL);
      return 0;
    }
  }
}

/* The gate admits a client that gave the token: it gets its OK and a parse buffer. */
static const char *admit(void *ctx, int fd, int32_t rank, const char *peer) {
  (void)rank;
  server *s = ctx;
  if (s->n_cl == s->cap_cl) {
    int nc = s->cap_cl ? 2 * s->cap_cl : 16;
    client *ncl = tdm__malloc(sizeof(client) * (size_t)nc);
    if (!ncl) return "out of memory for another client";
    if (s->cl) memcpy(ncl, s->cl, sizeof(client) * (size_t)s->n_cl);
    tdm__free(s->cl);
    s->cl = ncl;
    s->cap_cl = nc;
  }
  uint32_t ok = 1;
  if (tdm__net_send_all(fd, &ok, 4, tdm_time_now() + TDM_NET_HELLO_S, "store") != TDM_OK)
    return "the answer to its handshake could not be sent";
  client *c = &s->cl[s->n_cl++];
  *c = (client){fd, "", NULL, 0, 0, NULL};
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  return NULL;
}

static void *server_main(void *arg) {
  tdm__mem_scope(TDM_MEM_COMM); /* the store's keys and clients are communication memory */
  server *s = arg;
  for (;;) {
    int want = 1 + s->n_cl + 1 + TDM_NET_MAX_PENDING;
    if (want > s->cap_pf) {
      struct pollfd *np = tdm__malloc(sizeof *np * (size_t)want * 2);
      if (np) {
        tdm__free(s->pf);
        s->pf = np;
        s->cap_pf = want * 2;
      } else if (1 + s->n_cl + 1 + TDM_NET_MAX_PENDING > s->cap_pf) {
        usleep(100000); /* out of memory: the clients we can poll wait until it passes */
        continue;
      }
    }
    struct pollfd *pf = s->pf;
    int n_cl = s->n_cl, n = 0;
    pf[n++] = (struct pollfd){s->wake[0], POLLIN, 0};
    for (int i = 0; i < n_cl; i++) pf[n++] = (struct pollfd){s->cl[i].fd, POLLIN, 0};
    n += tdm__net_gate_fill(s->gate, pf + n);
    if (poll(pf, (nfds_t)n, tdm__net_gate_wait_ms(s->gate, 1000)) < 0 && errno != EINTR) break;
    if (pf[0].revents) break;
    for (int i = n_cl - 1; i >= 0; i--) {
      if (!(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      client *c = &s->cl[i];
      /* requests are small: a buffer grows only for a large one, up to the largest request (a
         request that claims more is refused by its first 13 bytes, so a full buffer holds part
         of one that fits) */
      if (c->cap - c->len < 1024 && c->cap < TDM_STORE_MAX_REQ) {
        size_t nc = c->cap ? 2 * c->cap : 4096;
        if (nc > TDM_STORE_MAX_REQ) nc = TDM_STORE_MAX_REQ;
        unsigned char *nb = tdm__malloc(nc);
        if (!nb) continue;
        if (c->buf) memcpy(nb, c->buf, c->len);
        tdm__free(c->buf);
        c->buf = nb;
        c->cap = nc;
      }
      ssize_t k = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
      if (k <= 0) {
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        drop(s, i, NULL);
        continue;
      }
      c->len += (size_t)k;
      serve(s, i);
    }
    tdm__net_gate_serve(s->gate, pf + 1 + n_cl);
  }
  return NULL;
}

static void server_stop(server *s) {
  if (!s) return;
  if (write(s->wake[1], "x", 1) < 0) { /* the thread also polls with a timeout */
  }
  pthread_join(s->th, NULL);
  tdm__net_gate_destroy(s->gate);
  while (s->n_cl) drop(s, 0, NULL);
  tdm__free(s->cl);
  tdm__free(s->pf);
  for (int i = 0; i < s->n_kv; i++) {
    tdm__free(s->kvs[i].key);
    tdm__free(s->kvs[i].val);
  }
  tdm__free(s->kvs);
  close(s->lfd);
  close(s->wake[0]);
  close(s->wake[1]);
  tdm__free(s);
}

/* ---- client ---------------------------------------------------------------------------- */
/* What the server would refuse (and drop us for) is refused here, naming it. */
static tdm_status check_request(const char *key, uint64_t vl) {
  size_t kl = strlen(key);
  if (kl == 0 || kl > TDM_STORE_MAX_KEY)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "store: key '%.40s%s' is %zu bytes; keys are 1..%d bytes", key,
                          kl > 40 ? "..." : "", kl, TDM_STORE_MAX_KEY);
  if (vl > TDM_STORE_MAX_VAL)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "store: the value of key '%.40s' is %llu bytes; at most %llu", key,
                          (unsigned long long)vl, (unsigned long long)TDM_STORE_MAX_VAL);
  return TDM_OK;
}

static tdm_status request(tdm__store *st, uint8_t cmd, const char *key, const void *val, uint64_t vl, double deadline) {
  uint32_t kl = (uint32_t)strlen(key);
  unsigned char h[TDM_STORE_REQ_HEAD];
  h[0] = cmd;
  memcpy(h + 1, &kl, 4);
  memcpy(h + 5, &vl, 8);
  TDM__TRY(tdm__net_send_all(st->fd, h, TDM_STORE_REQ_HEAD, deadline, "store"));
  TDM__TRY(tdm__net_send_all(st->fd, key, kl, deadline, "store"));
  return vl ? tdm__net_send_all(st->fd, val, vl, deadline, "store") : TDM_OK;
}

static void key_path(const tdm__store *s, const char *key, char *out, size_t n) {
  char k[512];
  size_t j = 0;
  for (size_t i = 0; key[i] && j < sizeof k - 1; i++) k[j++] = (key[i] == '/' ? '_' : key[i]);
  k[j] = 0;
  snprintf(out, n, "%s/%s", s->dir, k);
}

/* Every rank's job identity against rank 0's (cfg.job_ident; under srun the job, step, tasks and
 * node list), so tasks that disagree stop here with both views named, not in a hang later. */
static tdm_status opened(tdm__store **out, tdm__store *s, const tdm_comm_config *cfg) {
  const char *me = cfg->job_ident;
  if (me && *me) {
    static const char key[] = "tandem/job_ident";
    void *got = NULL;
    size_t n = 0;
    tdm_status st = cfg->rank == 0 ? tdm__store_set(s, key, me, strlen(me)) : tdm__store_get(s, key, &got, &n, s->timeout_s);
    if (st == TDM_OK && cfg->rank != 0) {
      ((char *)got)[n] = 0;
      if (strcmp(got, me))
        st = tdm__set_error(TDM_ERR_MISMATCH, "rank %d sees %s, but rank 0 sees %s: the tasks of one job disagree (every task "
                            "must see the same job, step, task count and node list)", cfg->rank, me, (char *)got);
    }
    tdm__free(got);
    if (st != TDM_OK) {
      tdm__store_close(s);
      return st;
    }
  }
  *out = s;
  return TDM_OK;
}

tdm_status tdm__store_open(tdm__store **out, const tdm_comm_config *cfg, double timeout_s) {
  tdm__store *s = tdm__calloc(1, sizeof *s);
  if (!s) return tdm__set_error(TDM_ERR_NO_MEMORY, "store: out of memory");
  s->fd = -1;
  s->timeout_s = timeout_s;
  if (cfg->store_dir) {
    s->dir = tdm__malloc(strlen(cfg->store_dir) + 1);
    strcpy(s->dir, cfg->store_dir);
    mkdir(s->dir, 0700);
    return opened(out, s, cfg);
  }
  const char *addr = cfg->master_addr ? cfg->master_addr : "127.0.0.1";
  int port = cfg->master_port ? cfg->master_port : 29500;
  double deadline = tdm_time_now() + timeout_s;
  tdm_status st = TDM_OK;
  if (cfg->rank == 0) {
    server *srv = tdm__calloc(1, sizeof *srv);
    int got_port = -1;
    const char *inherited = getenv("TANDEM_STORE_FD"); /* tandem run opened it for us */
    if (srv && inherited) {
      srv->lfd = dup(atoi(inherited)); /* our own copy: a second communicator may want it too */
      struct sockaddr_in sa;
      socklen_t len = sizeof sa;
      if (srv->lfd >= 0 && getsockname(srv->lfd, (struct sockaddr *)&sa, &len) == 0) got_port = ntohs(sa.sin_port);
      if (got_port != port) { /* not the socket for this port: listen ourselves */
        if (srv->lfd >= 0) close(srv->lfd);
        inherited = NULL;
      }
    }
    /* the address we were given, not every interface: a loopback master stays on this host */
    st = !srv ? TDM_ERR_NO_MEMORY : inherited ? TDM_OK : tdm__net_listen(addr, port, &srv->lfd, &got_port);
    if (st != TDM_OK) {
      tdm__free(srv);
      tdm__free(s);
      return tdm__set_error(st, "rank 0 cannot host the store on %s:%d: %s (is another job using MASTER_PORT, and is "
                            "MASTER_ADDR an address of this host?)", addr, port, tdm_last_error());
    }
    if (tdm__net_gate_create(&srv->gate, srv->lfd, TDM_STORE_MAGIC, cfg->job_token, "store", admit, srv) != TDM_OK ||
        pipe2(srv->wake, O_CLOEXEC) != 0) {
      st = tdm__set_error(TDM_ERR_SYSTEM, "store: cannot set up the server: %s", strerror(errno));
    } else if ((errno = pthread_create(&srv->th, NULL, server_main, srv)) != 0) {
      st = tdm__set_error(TDM_ERR_SYSTEM, "store: cannot start the server thread: %s", strerror(errno));
      close(srv->wake[0]);
      close(srv->wake[1]);
    }
    if (st != TDM_OK) {
      tdm__net_gate_destroy(srv->gate);
      close(srv->lfd);
      tdm__free(srv);
      tdm__free(s);
      return st;
    }
    s->srv = srv;
  }
  uint32_t ok = 0;
  st = tdm__net_dial(addr, port, TDM_STORE_MAGIC, cfg->job_token, cfg->rank, deadline, &s->fd, &ok);
  if (st == TDM_OK && ok != 1)
    st = tdm__set_error(TDM_ERR_MISMATCH, "it answered our handshake with 0x%08x instead of OK (not a tandem store?)", ok);
  if (st != TDM_OK) {
    tdm_status e = tdm__set_error(st, "rank %d cannot reach the store at %s:%d (MASTER_ADDR:MASTER_PORT): %s", cfg->rank,
                                  addr, port, tdm_last_error());
    tdm__store_close(s);
    return e;
  }
  return opened(out, s, cfg);
}

tdm_status tdm__store_set(tdm__store *s, const char *key, const void *val, size_t n) {
  TDM__TRY(check_request(key, n));
  if (s->dir) {
    char p[4096], t[4200];
    key_path(s, key, p, sizeof p);
    snprintf(t, sizeof t, "%s.tmp.%d", p, (int)getpid());
    FILE *f = fopen(t, "wb");
    if (!f || fwrite(val, 1, n, f) != n || fclose(f) != 0 || rename(t, p) != 0)
      return tdm__set_error(TDM_ERR_IO, "file store: cannot write %s: %s", p, strerror(errno));
    return TDM_OK;
  }
  double dl = tdm_time_now() + s->timeout_s;
  TDM__TRY(request(s, 'S', key, val, n, dl));
  uint8_t ack;
  return tdm__net_recv_all(s->fd, &ack, 1, dl, "store set");
}

tdm_status tdm__store_set_once(tdm__store *s, const char *key, const void *val, size_t n, int *taken) {
  *taken = 0;
  if (s->dir) return tdm__store_set(s, key, val, n); /* a directory may hold an earlier job's files: no claim */
  TDM__TRY(check_request(key, n));
  double dl = tdm_time_now() + s->timeout_s;
  TDM__TRY(request(s, 'O', key, val, n, dl));
  uint8_t ack;
  TDM__TRY(tdm__net_recv_all(s->fd, &ack, 1, dl, "store set"));
  *taken = ack == 0;
  return TDM_OK;
}

tdm_status tdm__store_get(tdm__store *s, const char *key, void **val, size_t *n, double timeout_s) {
  TDM__TRY(check_request(key, 0));
  double dl = tdm_time_now() + timeout_s;
  if (s->dir) {
    char p[4096];
    key_path(s, key, p, sizeof p);
    for (;;) {
      FILE *f = fopen(p, "rb");
      if (f) {
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        *val = tdm__malloc((size_t)len + 1);
        *n = fread(*val, 1, (size_t)len, f);
        fclose(f);
        return TDM_OK;
      }
      if (tdm_time_now() > dl)
        return tdm__set_error(TDM_ERR_TIMEOUT, "file store: %s did not appear within %.0f s", p, timeout_s);
      usleep(5000);
    }
  }
  TDM__TRY(request(s, 'G', key, NULL, 0, dl));
  uint64_t len;
  tdm_status st = tdm__net_recv_all(s->fd, &len, 8, dl, "store get");
  if (st == TDM_ERR_TIMEOUT) return tdm__set_error(st, "store: key '%s' did not appear within %.0f s", key, timeout_s);
  TDM__TRY(st);
  if (len > TDM_STORE_MAX_VAL) return tdm__set_error(TDM_ERR_REMOTE, "store: implausible value length %llu", (unsigned long long)len);
  *val = tdm__malloc(len + 1);
  if (!*val) return tdm__set_error(TDM_ERR_NO_MEMORY, "store: cannot allocate %llu bytes for key '%s'", (unsigned long long)len, key);
  *n = len;
  return tdm__net_recv_all(s->fd, *val, len, dl, "store get");
}

tdm_status tdm__store_add(tdm__store *s, const char *key, int64_t delta, int64_t *result) {
  TDM__TRY(check_request(key, 8));
  if (s->dir) return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "file store: add is not supported");
  double dl = tdm_time_now() + s->timeout_s;
  TDM__TRY(request(s, 'A', key, &delta, 8, dl));
  return tdm__net_recv_all(s->fd, result, 8, dl, "store add");
}

void tdm__store_close(tdm__store *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  server_stop(s->srv);
  tdm__free(s->dir);
  tdm__free(s);
}
