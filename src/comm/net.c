#define _GNU_SOURCE /* accept4 */
#include "comm/net.h"

#include <arpa/inet.h>
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
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
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

tdm_status tdm__net_connect(const char *addr, int port, double deadline, int *fd_out) {
  struct sockaddr_in sa;
  TDM__TRY(resolve(addr, port, &sa));
  int last = 0;
  do {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return tdm__set_error(TDM_ERR_SYSTEM, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      *fd_out = fd;
      return TDM_OK;
    }
    last = errno;
    close(fd);
    usleep(20000); /* not listening yet: try again */
  } while (tdm_time_now() < deadline);
  return tdm__set_error(TDM_ERR_TIMEOUT, "cannot connect to %s:%d: %s (is the master reachable and started?)", addr,
                        port, strerror(last));
}

tdm_status tdm__net_send_all(int fd, const void *buf, size_t n, double deadline, const char *what) {
  const char *p = buf;
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return tdm__set_error(TDM_ERR_REMOTE, "%s: connection lost: %s", what, strerror(errno));
    struct pollfd pf = {fd, POLLOUT, 0};
    if (poll(&pf, 1, ms_left(deadline)) == 0 && tdm_time_now() >= deadline)
      return tdm__set_error(TDM_ERR_TIMEOUT, "%s: timed out sending", what);
  }
  return TDM_OK;
}

tdm_status tdm__net_recv_all(int fd, void *buf, size_t n, double deadline, const char *what) {
  char *p = buf;
  while (n) {
    ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) return tdm__set_error(TDM_ERR_REMOTE, "%s: the peer closed the connection", what);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return tdm__set_error(TDM_ERR_REMOTE, "%s: connection lost: %s", what, strerror(errno));
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, ms_left(deadline)) == 0 && tdm_time_now() >= deadline)
      return tdm__set_error(TDM_ERR_TIMEOUT, "%s: timed out receiving", what);
  }
  return TDM_OK;
}

int tdm__net_accept(int lfd, double deadline, char *peer, size_t peer_n) {
  while (tdm_time_now() < deadline) {
    struct pollfd pf = {lfd, POLLIN, 0};
    if (poll(&pf, 1, ms_left(deadline)) <= 0) continue;
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int fd = accept4(lfd, (struct sockaddr *)&sa, &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (peer) {
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
      snprintf(peer, peer_n, "%s:%d", ip, ntohs(sa.sin_port));
    }
    return fd;
  }
  return -1;
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

typedef struct {
  uint32_t magic, version, token_len;
  int32_t rank;
} hello;

tdm_status tdm__net_send_hello(int fd, uint32_t magic, const char *token, int32_t rank, double deadline) {
  size_t tl = token ? strlen(token) : 0;
  if (tl > 1024) return tdm__set_error(TDM_ERR_INVALID_ARG, "job token longer than 1024 bytes");
  hello h = {magic, TDM_NET_VERSION, (uint32_t)tl, rank};
  TDM__TRY(tdm__net_send_all(fd, &h, sizeof h, deadline, "handshake"));
  return tl ? tdm__net_send_all(fd, token, tl, deadline, "handshake") : TDM_OK;
}

tdm_status tdm__net_recv_hello(int fd, uint32_t magic, const char *token, int32_t *rank, double deadline) {
  hello h;
  TDM__TRY(tdm__net_recv_all(fd, &h, sizeof h, deadline, "handshake"));
  if (h.magic != magic) return tdm__set_error(TDM_ERR_MISMATCH, "not a tandem peer (magic 0x%08x)", h.magic);
  if (h.version != TDM_NET_VERSION)
    return tdm__set_error(TDM_ERR_MISMATCH, "protocol version %u; this build speaks %u", h.version, TDM_NET_VERSION);
  size_t tl = token ? strlen(token) : 0;
  if (h.token_len != tl) return tdm__set_error(TDM_ERR_MISMATCH, "wrong job token");
  char buf[1024];
  if (tl) {
    TDM__TRY(tdm__net_recv_all(fd, buf, tl, deadline, "handshake"));
    unsigned diff = 0; /* compare every byte: no early exit that leaks how much matched */
    for (size_t i = 0; i < tl; i++) diff |= (unsigned)(buf[i] ^ token[i]);
    if (diff) return tdm__set_error(TDM_ERR_MISMATCH, "wrong job token");
  }
  *rank = h.rank;
  return TDM_OK;
}
