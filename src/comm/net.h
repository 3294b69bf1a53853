/* Small socket helpers shared by the TCP store and the TCP transport. Every wait is bounded. */
#ifndef TANDEM_NET_H
#define TANDEM_NET_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

/* Listens on addr:port (port 0: any free one; addr NULL: all interfaces). *port_out gets it. */
tdm_status tdm__net_listen(const char *addr, int port, int *fd_out, int *port_out);
/* Connects, retrying while the peer is not listening yet, until deadline (tdm_time_now); a
 * connection attempt that the peer does not answer (a full backlog, a lost route) also ends at
 * the deadline. The socket is non-blocking. */
tdm_status tdm__net_connect(const char *addr, int port, double deadline, int *fd_out);
/* Moves exactly n bytes on a blocking or non-blocking socket, waiting at most until deadline.
 * A closed connection is TDM_ERR_REMOTE, a late one TDM_ERR_TIMEOUT (details say what/whom). */
tdm_status tdm__net_send_all(int fd, const void *buf, size_t n, double deadline, const char *what);
tdm_status tdm__net_recv_all(int fd, void *buf, size_t n, double deadline, const char *what);
void tdm__net_nonblock(int fd);
void tdm__net_tune(int fd); /* TCP_NODELAY and large buffers */
/* The IPv4 address to listen on: TANDEM_SOCKET_IFNAME's, or loopback when the master is on
 * this host's loopback, or the first interface that is up and not loopback. */
tdm_status tdm__net_pick_addr(const char *ifname, const char *master, char *addr, size_t n, char *chosen_if, size_t m);

/* Handshake both the store and the transport start with: magic, version, token length, rank
 * (16 bytes), then the job token. */
#define TDM_NET_VERSION 1
#define TDM_NET_HELLO_BYTES 16
#define TDM_NET_MAX_TOKEN 1024
/* What a listener sends instead of its answer when it drops a connection whose hello did not
 * complete in time (TDM_NET_HELLO_S) or that newer strangers pushed out (more than
 * TDM_NET_MAX_PENDING waiting): this word, then a u32, the unauthenticated connections it held. */
#define TDM_NET_BUSY_MAGIC 0x59534254u /* "TBSY" */
#define TDM_NET_HELLO_S 2.0
#define TDM_NET_MAX_PENDING 128
#define TDM_NET_REPORT_S 5.0 /* at most one warning line about strangers per listener per interval */

tdm_status tdm__net_send_hello(int fd, uint32_t magic, const char *token, int32_t rank, double deadline);
/* Reads the rest of a hello whose first word (got_magic) was read already; TDM_ERR_MISMATCH
 * (with detail) when the magic, version or token are wrong. */
tdm_status tdm__net_recv_hello(int fd, uint32_t got_magic, uint32_t magic, const char *token, int32_t *rank,
                               double deadline);
/* The accepting side's reading of a hello, of which len bytes (buf) have come, for a listener
 * with magic and token: 1 when it is complete and valid (*rank gets the rank it claims); 0 while
 * *need more bytes must come (never more than the hello has left); -1 when it is refused, *why
 * saying why in words that do not depend on the bytes (refusals are counted by reason). A wrong
 * magic, version or overlong token is refused as soon as the first 16 bytes are there; a wrong
 * token only once all of it has come, so the refusal is a clean close. */
int tdm__net_hello_parse(const unsigned char *buf, size_t len, uint32_t magic, const char *token, size_t *need,
                         int32_t *rank, const char **why);
/* Connects to addr:port and says hello; *first gets the first word of the answer (the store's
 * OK, a mesh peer's magic). Retries until deadline while the listener is not up yet or drops
 * us as busy. Errors say what happened without naming the address (callers do): a listener
 * that closed without answering refused our hello (token, version); one that kept dropping us
 * as busy is overloaded by strangers. */
tdm_status tdm__net_dial(const char *addr, int port, uint32_t magic, const char *token, int32_t rank, double deadline,
                         int *fd_out, uint32_t *first);

/* The accepting side of the handshake, for a listening socket that strangers can reach: every
 * connection must send a valid hello within TDM_NET_HELLO_S of being accepted; at most
 * TDM_NET_MAX_PENDING wait at once (a new one pushes out the oldest); all are read
 * concurrently, so idle or slow strangers delay no one. Refused connections are counted and
 * reported in at most one warning line per TDM_NET_REPORT_S. Single-threaded: one poll loop. */
typedef struct tdm__net_gate tdm__net_gate;
/* Called for each connection with a valid hello. Returns NULL when it took the (non-blocking)
 * fd, or why it refuses it (copied; the gate closes fd and counts the reason). */
typedef const char *(*tdm__net_admit_fn)(void *ctx, int fd, int32_t rank, const char *peer);
/* who names the listener in warnings ("store", "tcp: rank 3"). lfd stays the caller's. */
tdm_status tdm__net_gate_create(tdm__net_gate **out, int lfd, uint32_t magic, const char *token, const char *who,
                                tdm__net_admit_fn admit, void *ctx);
/* Fills pf with what to poll (the listener, then each pending connection); returns how many,
 * at most 1 + TDM_NET_MAX_PENDING. */
int tdm__net_gate_fill(tdm__net_gate *g, struct pollfd *pf);
/* How long a poll may wait, at most max_ms, so that deadlines and reports are on time. */
int tdm__net_gate_wait_ms(const tdm__net_gate *g, int max_ms);
/* After poll on what fill gave: reads hellos, admits or refuses, drops the late, accepts new
 * connections, and reports refusals when the interval has passed. */
void tdm__net_gate_serve(tdm__net_gate *g, const struct pollfd *pf);
/* Closes the pending connections (not the listener) and reports what was not yet reported. */
void tdm__net_gate_destroy(tdm__net_gate *g);
/* A gate's memory (fixed: its pending connections are preallocated), for the memory planner. */
size_t tdm__net_gate_bytes(void);

/* The rendezvous store's requests (store.c), after the hello: a command byte ('S' set, 'O' set
 * once, 'G' get, 'A' add), the key's length (u32), the value's length (u64), both in host order
 * (every rank runs this build), then the key (1..TDM_STORE_MAX_KEY bytes, no NUL) and the value
 * (a set's at most TDM_STORE_MAX_VAL bytes, a get's none, an add's 8: the signed delta). */
#define TDM_STORE_MAGIC 0x53444d54u /* "TMDS": the store's hello */
#define TDM_STORE_REQ_HEAD 13
#define TDM_STORE_MAX_KEY 4096
#define TDM_STORE_MAX_VAL ((uint64_t)64 << 20)
#define TDM_STORE_MAX_REQ (TDM_STORE_REQ_HEAD + TDM_STORE_MAX_KEY + TDM_STORE_MAX_VAL)
typedef struct {
  uint8_t cmd;
  uint32_t key_len;
  uint64_t val_len;
  const unsigned char *key, *val; /* into the bytes parsed; the key is not NUL-terminated */
  size_t bytes;                   /* the whole request's */
} tdm__store_req;
/* The request at the start of buf, of which len bytes have come: 1 with *req when all of it is
 * there, 0 while more must come, -1 with *why when it is malformed, as soon as the bytes show it
 * (the server drops the client: its stream cannot be trusted to be at a request's start again). */
int tdm__store_parse(const unsigned char *buf, size_t len, tdm__store_req *req, const char **why);

#endif
