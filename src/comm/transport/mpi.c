/* The MPI transport: point-to-point over MPI, so tandem runs under mpirun or srun across nodes
 * with whatever fabric the MPI library drives. A transfer is MPI messages on one tag (the header,
 * then the payload in pieces of at most tdm__mpi_piece_bytes, since MPI counts are int; MPI keeps
 * their order, and transfers to one peer in one direction start one after the other so their
 * pieces never interleave); the header is checked before the payload is received. Every wait is
 * an MPI_Test loop bounded by the communicator's deadline; it spins and yields rather than
 * sleeps, because MPI moves data only while it is polled. Tagged messages (tdm_comm_tsend) travel
 * on their own MPI tag, so collective traffic never meets them and MPI keeps each sender's tagged
 * messages in order; a tagged receive that meets one it does not want reads it into the stash
 * (p2p.c), and any-source receives ask MPI_Iprobe which peer has one waiting. Built only when
 * CMake finds MPI (TANDEM_HAVE_MPI). */
#include "comm/comm_impl.h"

size_t tdm__mpi_piece_bytes = (size_t)1 << 30;

#ifdef TANDEM_HAVE_MPI
#include <mpi.h>
#include <stddef.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#define TAG_DATA 7
#define TAG_TAGGED 8 /* tdm_comm_tsend's messages; an abort goes on both tags */

typedef struct {
  tdm__transport base;
  int we_initialised;
  int closed;
} mpi_tr;

static tdm_status mpi_err(int rc, const char *what) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, s, &n);
  return tdm__set_error(TDM_ERR_REMOTE, "MPI: %s: %s", what, s);
}

/* Stops what is posted before the caller's buffers go away: receives are cancelled and completed
 * (a late message must not land in a stack that moved on); sends are left to MPI. */
static void drop(MPI_Request *req, const tdm__xfer *x, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 2; k++) {
      MPI_Request *r = &req[2 * i + k];
      if (*r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(r);
      if (x[i].is_send) MPI_Request_free(r);
      else MPI_Wait(r, MPI_STATUS_IGNORE);
    }
  for (int i = 0; i < n; i++) /* a message half read into the stash is in no list yet */
    if (x[i].stashing) tdm__free((char *)x[i].buf - offsetof(tdm__stashed, data));
}

static int mpi_tag(const tdm__xfer *x) { return x->hdr.kind == TDM_COLL_TAGGED ? TAG_TAGGED : TAG_DATA; }

/* Posts the next piece of x's payload into *r. */
static int post_piece(tdm__xfer *x, size_t *posted, MPI_Request *r) {
  size_t k = x->nbytes - *posted < tdm__mpi_piece_bytes ? x->nbytes - *posted : tdm__mpi_piece_bytes;
  char *at = (char *)x->buf + *posted;
  *posted += k;
  return x->is_send ? MPI_Isend(at, (int)k, MPI_BYTE, x->peer, mpi_tag(x), MPI_COMM_WORLD, r)
                    : MPI_Irecv(at, (int)k, MPI_BYTE, x->peer, mpi_tag(x), MPI_COMM_WORLD, r);
}

static tdm_status run_posted(tdm__transport *tr, tdm__xfer *x, int n, double deadline, MPI_Request *req) {
  struct tdm_comm *c = tdm__active(tr);
  size_t posted[n]; /* payload bytes posted */
  int started[n];
  for (int i = 0; i < n; i++) posted[i] = 0, started[i] = 0;
  int left = n;
  unsigned spins = 0;
  while (left > 0) {
    int progressed = 0;
    for (int i = 0; i < n; i++) {
      if (x[i].complete) continue;
      MPI_Request *hr = &req[2 * i], *pr = &req[2 * i + 1];
      if (!started[i]) {
        if (!tdm__xfer_turn(x, i)) continue;
        int tag = mpi_tag(&x[i]);
        int rc = x[i].is_send ? MPI_Isend(&x[i].hdr, (int)sizeof(tdm__hdr), MPI_BYTE, x[i].peer, tag, MPI_COMM_WORLD, hr)
                              : MPI_Irecv(&x[i].got, (int)sizeof(tdm__hdr), MPI_BYTE, x[i].peer, tag, MPI_COMM_WORLD, hr);
        if (rc == MPI_SUCCESS && x[i].is_send && x[i].nbytes) rc = post_piece(&x[i], &posted[i], pr);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "posting a transfer");
        started[i] = progressed = 1;
      }
      int d;
      if (*hr != MPI_REQUEST_NULL) {
        MPI_Test(hr, &d, MPI_STATUS_IGNORE);
        if (d && !x[i].is_send) { /* a header arrived: check it before any payload is received */
          progressed = 1;
          if (x[i].got.magic == TDM_MSG_MAGIC && x[i].got.kind == TDM_COLL_ABORT) {
            char reason[600] = {0};
            int len = x[i].got.nbytes < sizeof reason - 1 ? (int)x[i].got.nbytes : (int)sizeof reason - 1;
            MPI_Recv(reason, len, MPI_BYTE, x[i].peer, mpi_tag(&x[i]), MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            tdm_status st = x[i].got.op ? (tdm_status)(-(int)x[i].got.op) : TDM_ERR_REMOTE;
            if (st != TDM_ERR_MISMATCH && st != TDM_ERR_TIMEOUT) st = TDM_ERR_REMOTE;
            int32_t root = x[i].got.root; /* 1 + where a relayed failure began (0: the sender's own) */
            int from = root > 0 && root <= tr->size ? root - 1 : x[i].peer;
            return tdm__error_from(from != tr->rank ? from : -1,
                                   tdm__set_error(st, "rank %d failed: %s", tdm__comm_rank_of(c, x[i].peer), reason));
          }
          /* checked, or (a tagged message another receive wants) redirected into the stash */
          TDM__TRY(tdm__xfer_header(c, &x[i]));
        }
      }
      if (*pr != MPI_REQUEST_NULL) {
        MPI_Test(pr, &d, MPI_STATUS_IGNORE);
        progressed |= d;
      }
      if ((x[i].is_send || *hr == MPI_REQUEST_NULL) && *pr == MPI_REQUEST_NULL && posted[i] < x[i].nbytes) {
        int rc = post_piece(&x[i], &posted[i], pr);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "posting a transfer");
      }
      if (*hr == MPI_REQUEST_NULL && *pr == MPI_REQUEST_NULL && posted[i] == x[i].nbytes) {
        progressed = 1;
        if (!tdm__xfer_done(tr, &x[i])) { /* it went to the stash: this receive starts again */
          started[i] = 0, posted[i] = 0;
          continue;
        }
        x[i].complete = 1;
        left--;
      }
    }
    if (progressed) {
      spins = 0;
      continue;
    }
    if (++spins > 1000) sched_yield();
    if ((spins & 1023) == 0 && tdm_time_now() > deadline) {
      char b[160];
      int who = -1;
      for (int i = 0; i < n && who < 0; i++)
        if (!x[i].complete) who = x[i].peer;
      return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s under MPI waiting for rank %d", c->rank,
                            tdm__call_str(&c->cur, b, sizeof b), c->timeout_s, tdm__comm_rank_of(c, who));
    }
  }
  return TDM_OK;
}

static tdm_status run(tdm__transport *tr, tdm__xfer *x, int n, double deadline) {
  mpi_tr *t = (mpi_tr *)tr;
  if (t->closed) return tdm__set_error(TDM_ERR_REMOTE, "rank %d: the MPI transport was aborted", tdm__active(tr)->rank);
  MPI_Request req[2 * n];
  for (int i = 0; i < 2 * n; i++) req[i] = MPI_REQUEST_NULL;
  tdm_status st = run_posted(tr, x, n, deadline, req);
  if (st != TDM_OK) drop(req, x, n);
  return st;
}

static void mpi_abort_tr(tdm__transport *tr, const char *reason) {
  mpi_tr *t = (mpi_tr *)tr;
  if (t->closed) return;
  t->closed = 1;
  size_t rl = strlen(reason);
  /* as over TCP, op carries the failing status, so a peer reports a mismatch as a mismatch */
  int from = tdm__active(tr)->fail_origin; /* root: 1 + where a relayed failure began, as over TCP */
  tdm__hdr h = {TDM_MSG_MAGIC, TDM_COLL_ABORT, 0, 0, (uint32_t)(-(int)tdm__active(tr)->fail_status), from >= 0 ? from + 1 : 0,
                tdm__active(tr)->comm_id, 0, rl};
  for (int p = 0; p < tr->size; p++) { /* best effort: buffered sends nobody waits for */
    if (p == tr->rank) continue;
    for (int tag = TAG_DATA; tag <= TAG_TAGGED; tag++) { /* whichever kind of receive the peer waits in */
      MPI_Request r[2];
      MPI_Isend(&h, (int)sizeof h, MPI_BYTE, p, tag, MPI_COMM_WORLD, &r[0]);
      MPI_Isend((void *)reason, (int)rl, MPI_BYTE, p, tag, MPI_COMM_WORLD, &r[1]);
      MPI_Request_free(&r[0]);
      MPI_Request_free(&r[1]);
    }
  }
}

static void mpi_destroy(tdm__transport *tr) {
  mpi_tr *t = (mpi_tr *)tr;
  int fin = 0;
  MPI_Finalized(&fin);
  if (t->we_initialised && !fin) {
    if (t->closed) MPI_Abort(MPI_COMM_WORLD, 1); /* peers may be blocked: MPI cannot finalize cleanly */
    else MPI_Finalize();
  }
  tdm__free(t);
}

/* Whether peer has a tagged message (or an abort) waiting; 1 once aborted, so the receive says why. */
static int mpi_pending(tdm__transport *tr, int peer, int slow) {
  (void)slow;
  if (((mpi_tr *)tr)->closed) return 1;
  int flag = 0;
  if (MPI_Iprobe(peer, TAG_TAGGED, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 1;
  return flag;
}

static const tdm__transport_ops mpi_ops = {"mpi", run, mpi_abort_tr, mpi_destroy, NULL, mpi_pending, NULL, NULL, NULL};

tdm_status tdm__mpi_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  (void)cfg;
  int inited = 0, size, rank;
  MPI_Initialized(&inited);
  mpi_tr *t = tdm__calloc(1, sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "mpi: out of memory");
  if (!inited) {
    int provided;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      tdm__free(t);
      return tdm__set_error(TDM_ERR_SYSTEM, "MPI_Init_thread failed");
    }
    t->we_initialised = 1;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != c->size || rank != c->rank) {
    tdm_status st = tdm__set_error(TDM_ERR_MISMATCH, "mpi: MPI says rank %d of %d, the configuration rank %d of %d", rank,
                                   size, c->rank, c->size);
    mpi_destroy(&t->base);
    return st;
  }
  t->base.ops = &mpi_ops;
  t->base.comm = c;
  t->base.rank = rank;
  t->base.size = size;
  *out = &t->base;
  return TDM_OK;
}
#else
tdm_status tdm__mpi_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  (void)cfg;
  (void)out;
  (void)c;
  return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                        "this build has no MPI transport: install openmpi-bin and libopenmpi-dev and rebuild");
}
#endif
