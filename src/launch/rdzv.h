/* The elastic rendezvous of `tandem run --nnodes MIN:MAX` (tools/run_elastic.c): the launchers of
 * a job, one per node, agree in rounds on who takes part, and on each node's rank in the round.
 *
 * One launcher hosts it: the first that can listen on --rdzv-endpoint runs the server below on a
 * thread; every launcher, the host's too, is a client over TCP. A client's connection is its
 * membership: a launcher killed with SIGKILL closes it at once (its kernel does), and one whose
 * machine is gone stops pinging and is dropped after ping_timeout_s. When the host itself is lost,
 * the survivors lose the server with it; one that can listen on the endpoint (it runs on the same
 * host) takes over, the others reconnect, and rounds go on from the numbers the clients carry.
 *
 * The protocol, after the hello of net.h (TDM_RDZV_MAGIC, the job token = --rdzv-id): text lines.
 *   client: JOIN <id> <min> <max> <local ranks> <round seen> <restarts seen> <addr> <port>
 *           PING | DONE <round> | FAIL <round> <what>
 *   server: ROUND <round> <nodes> <node rank> <world> <master addr> <master port> <restarts>
 *           STOP <round> <why> | WAIT <why> | FINISH | ABORT <why> | REFUSE <why> | PING
 * A round closes when MAX nodes have joined, or MIN and then no other for last_call_s (a server's
 * first round; after a restart every survivor is connected already: half a second); below MIN for
 * timeout_s the job fails naming the nodes missing. While a round runs, a member lost, a member's
 * workers failing or a node joining below MAX stops it (a restart, bounded by max_restarts); all
 * members done finishes the job. Node ranks: the previous round's members first, in their order. */
#ifndef TANDEM_LAUNCH_RDZV_H
#define TANDEM_LAUNCH_RDZV_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

#define TDM_RDZV_MAGIC 0x5a445254u /* "TRDZ" */
#define TDM_RDZV_LINE 1024         /* the longest line either side sends */

typedef struct {
  int min_nodes, max_nodes, local_ranks;
  int64_t max_restarts;
  double timeout_s;      /* below MIN this long: the job fails */
  double last_call_s;    /* a fresh server's first round: after MIN joined, wait this long for more */
  double ping_timeout_s; /* a client silent this long is lost */
  const char *token;     /* --rdzv-id */
} tdm__rdzv_config;

typedef struct tdm__rdzv_server tdm__rdzv_server;

/* Listens on host:port and serves on a thread (which owns the server until stop). When it cannot
 * listen, returns the error with *bind_errno set: EADDRINUSE (another launcher hosts it) or
 * EADDRNOTAVAIL (the endpoint is another host's) mean the caller is a client; others are errors. */
tdm_status tdm__rdzv_serve(tdm__rdzv_server **out, const char *host, int port, const tdm__rdzv_config *cfg,
                           int *bind_errno);
/* Stops the thread after the clients that were told FINISH or ABORT closed (at most 3 s), closes
 * everything and frees. NULL is fine. */
void tdm__rdzv_server_stop(tdm__rdzv_server *s);

/* The client side. A connection to the rendezvous with a line reader. */
typedef struct {
  int fd;
  char buf[4 * TDM_RDZV_LINE];
  size_t len;
} tdm__rdzv_conn;

/* Connects and says hello, retrying until deadline while nothing listens. Errors name the
 * endpoint and what happened: not answering (since: when the caller began to wait, for the
 * message), refusing our token. */
tdm_status tdm__rdzv_connect(tdm__rdzv_conn *c, const char *host, int port, const char *token, double since,
                             double deadline);
/* Sends one line (the newline is added). */
tdm_status tdm__rdzv_send(tdm__rdzv_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads what has come without waiting: 1 with the next whole line in line (no newline), 0 when
 * none is complete yet, -1 when the connection is closed or broken. */
int tdm__rdzv_recv_line(tdm__rdzv_conn *c, char *line, size_t n);
void tdm__rdzv_close(tdm__rdzv_conn *c);

#endif
