/* Point-to-point: the transfers every algorithm is made of (headers from the call in progress,
 * network emulation, rank mapping, the transport, and the abort that tells every peer why a call
 * failed), the communicator's scratch, and the public send / recv / sendrecv. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

void *tdm__comm_scratch(struct tdm_comm *c, size_t n) {
  if (n <= c->scratch_bytes) return c->scratch;
  tdm__free(c->scratch); /* first: the old contents are not kept, and both at once would double the peak */
  c->scratch = tdm__aligned_alloc_cat(n, TDM_MEM_COMM);
  c->scratch_bytes = c->scratch ? n : 0;
  return c->scratch;
}

/* Emulated network: each send first waits for its link (serialised per peer at the emulated
 * bandwidth), then for the latency. The wait happens before the real transfer, so the receiver
 * sees the data no earlier than a real link of that speed would deliver it. */
static void emulate(struct tdm_comm *c, const tdm__xfer *x, int n) {
  double now = tdm_time_now(), until = now;
  for (int i = 0; i < n; i++) {
    if (!x[i].is_send) continue;
    double *free_at = &c->emu_link_free[x[i].peer];
    double start = *free_at > now ? *free_at : now;
    double wire = c->emu_bytes_per_s > 0 ? (double)(x[i].nbytes + sizeof(tdm__hdr)) / c->emu_bytes_per_s : 0;
    *free_at = start + wire;
    if (start + wire + c->emu_latency_s > until) until = start + wire + c->emu_latency_s;
  }
  double left = until - now;
  if (left > 0) {
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
  }
}

/* Runs transfers whose headers are set: emulation, rank mapping, the transport, and on failure
 * the abort that tells every peer why. */
static tdm_status run_xfers(struct tdm_comm *c, tdm__xfer *x, int n) {
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  c->tr->active = c;
  if (c->emu_link_free) emulate(c, x, n);
  uint64_t sent = 0;
  for (int i = 0; i < n; i++) {
    x[i].done = 0;
    x[i].complete = 0;
    if (c->map) x[i].peer = c->map[x[i].peer];
    if (x[i].is_send) sent += x[i].nbytes; /* payload only: headers are not counted */
  }
  tdm__count_sent(c, sent);
  tdm_status st = c->tr->ops->run(c->tr, x, n, tdm_time_now() + c->timeout_s);
  if (st != TDM_OK) {
    /* c->error names the cause; tell the peers and close, so none of them waits for us */
    if (!atomic_load(&c->failed)) tdm__comm_fail(c, st, "%s", tdm_last_error());
    c->tr->ops->abort(c->tr, c->error);
    return tdm__set_error(c->fail_status, "%s", c->error);
  }
  return TDM_OK;
}

tdm_status tdm__exchange(struct tdm_comm *c, tdm__xfer *x, int n) {
  for (int i = 0; i < n; i++) {
    tdm__hdr h = {TDM_MSG_MAGIC, c->cur.kind, c->cur.seq, c->cur.dtype, c->cur.op, c->cur.root, c->comm_id,
                  c->cur.count, x[i].nbytes};
    x[i].hdr = h;
  }
  return run_xfers(c, x, n);
}

tdm_status tdm__send(struct tdm_comm *c, int peer, const void *buf, size_t nbytes) {
  tdm__xfer x = {.peer = peer, .is_send = 1, .buf = (void *)buf, .nbytes = nbytes};
  return tdm__exchange(c, &x, 1);
}

tdm_status tdm__recv(struct tdm_comm *c, int peer, void *buf, size_t nbytes) {
  tdm__xfer x = {.peer = peer, .is_send = 0, .buf = buf, .nbytes = nbytes};
  return tdm__exchange(c, &x, 1);
}

tdm_status tdm__sendrecv(struct tdm_comm *c, int to, const void *sbuf, size_t sn, int from, void *rbuf, size_t rn) {
  tdm__xfer x[2] = {{.peer = to, .is_send = 1, .buf = (void *)sbuf, .nbytes = sn},
                    {.peer = from, .is_send = 0, .buf = rbuf, .nbytes = rn}};
  return tdm__exchange(c, x, 2);
}


/* ---- point to point -------------------------------------------------------------------------- */
tdm_status tdm__p2p(struct tdm_comm *c, int peer, int tag, void *buf, size_t nbytes, int is_send) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "send/recv: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: peer %d is not another rank of this communicator (size %d, rank %d)",
                          is_send ? "send" : "recv", peer, c->size, c->rank);
  if (tag < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: tag %d < 0", is_send ? "send" : "recv", tag);
  if (nbytes && !buf) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: buffer is NULL", is_send ? "send" : "recv");
  c->cur = (tdm__call){TDM_COLL_P2P, 0, 0, 0, nbytes, (uint64_t)tag};
  tdm__xfer x = {.peer = peer, .is_send = is_send, .buf = buf, .nbytes = nbytes};
  return tdm__exchange(c, &x, 1);
}

tdm_status tdm_comm_send(tdm_comm_t c, int peer, int tag, const void *buf, size_t nbytes) {
  TDM__TRY(tdm__wait_queue_idle(c));
  return tdm__p2p(c, peer, tag, (void *)buf, nbytes, 1);
}
tdm_status tdm_comm_recv(tdm_comm_t c, int peer, int tag, void *buf, size_t nbytes) {
  TDM__TRY(tdm__wait_queue_idle(c));
  return tdm__p2p(c, peer, tag, buf, nbytes, 0);
}

tdm_status tdm_comm_sendrecv(tdm_comm_t c, int to, const void *sendbuf, size_t sendbytes, int from, void *recvbuf,
                             size_t recvbytes, int tag) {
  TDM__TRY(tdm__wait_queue_idle(c));
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: communicator is NULL");
  if (atomic_load(&c->failed)) return tdm__set_error(c->fail_status, "%s", c->error);
  if (to < 0 || to >= c->size || to == c->rank || from < 0 || from >= c->size || from == c->rank || tag < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: to %d, from %d, tag %d; expected other ranks of %d and tag >= 0", to,
                          from, tag, c->size);
  if ((sendbytes && !sendbuf) || (recvbytes && !recvbuf)) return tdm__set_error(TDM_ERR_INVALID_ARG, "sendrecv: NULL buffer");
  /* each direction carries its sender's size: the send's header is what the peer expects */
  tdm__xfer x[2] = {{.peer = to, .is_send = 1, .buf = (void *)sendbuf, .nbytes = sendbytes},
                    {.peer = from, .is_send = 0, .buf = recvbuf, .nbytes = recvbytes}};
  for (int i = 0; i < 2; i++) {
    tdm__hdr h = {TDM_MSG_MAGIC, TDM_COLL_P2P, (uint64_t)tag, 0, 0, 0, c->comm_id, x[i].nbytes, x[i].nbytes};
    x[i].hdr = h;
  }
  c->cur = (tdm__call){TDM_COLL_P2P, 0, 0, 0, sendbytes, (uint64_t)tag};
  return run_xfers(c, x, 2);
}

