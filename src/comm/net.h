/* Small socket helpers shared by the TCP store and the TCP transport. Every wait is bounded. */
#ifndef TANDEM_NET_H
#define TANDEM_NET_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

/* Listens on addr:port (port 0: any free one; addr NULL: all interfaces). *port_out gets it. */
tdm_status tdm__net_listen(const char *addr, int port, int *fd_out, int *port_out);
/* Connects, retrying while the peer is not listening yet, until deadline (tdm_time_now). */
tdm_status tdm__net_connect(const char *addr, int port, double deadline, int *fd_out);
/* Moves exactly n bytes on a blocking or non-blocking socket, waiting at most until deadline.
 * A closed connection is TDM_ERR_REMOTE, a late one TDM_ERR_TIMEOUT (details say what/whom). */
tdm_status tdm__net_send_all(int fd, const void *buf, size_t n, double deadline, const char *what);
tdm_status tdm__net_recv_all(int fd, void *buf, size_t n, double deadline, const char *what);
/* Waits up to deadline for a connection; -1 on timeout. */
int tdm__net_accept(int lfd, double deadline, char *peer, size_t peer_n);
void tdm__net_nonblock(int fd);
void tdm__net_tune(int fd); /* TCP_NODELAY and large buffers */
/* The IPv4 address to listen on: TANDEM_SOCKET_IFNAME's, or loopback when the master is on
 * this host's loopback, or the first interface that is up and not loopback. */
tdm_status tdm__net_pick_addr(const char *ifname, const char *master, char *addr, size_t n, char *chosen_if, size_t m);

/* Handshake both the store and the transport start with: magic, version, the job token. */
#define TDM_NET_VERSION 1
tdm_status tdm__net_send_hello(int fd, uint32_t magic, const char *token, int32_t rank, double deadline);
/* Reads a hello; TDM_ERR_MISMATCH (with detail) when the magic, version or token are wrong. */
tdm_status tdm__net_recv_hello(int fd, uint32_t magic, const char *token, int32_t *rank, double deadline);

#endif
