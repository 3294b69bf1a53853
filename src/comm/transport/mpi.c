/* The MPI transport: point-to-point over MPI, so tandem runs under mpirun or srun across nodes
 * with whatever fabric the MPI library drives. A transfer is two MPI messages on one tag (the
 * header, then the payload; MPI keeps their order); the header is checked before the payload
 * is received. Every wait is an MPI_Test loop bounded by the communicator's deadline. Built
 * only when CMake finds MPI (TANDEM_HAVE_MPI). */
#include "comm/comm_impl.h"

#ifdef TANDEM_HAVE_MPI
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#define TAG_DATA 7

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

static tdm_status run(tdm__transport *tr, tdm__xfer *x, int n, double deadline) {
  mpi_tr *t = (mpi_tr *)tr;
  struct tdm_comm *c = tr->comm;
  if (t->closed) return tdm__set_error(TDM_ERR_REMOTE, "rank %d: the MPI transport was aborted", c->rank);
  MPI_Request req[2 * n];
  int stage[n]; /* sends: 0 posted; recvs: 0 header posted, 1 payload posted; 2 done */
  for (int i = 0; i < n; i++) {
    stage[i] = 0;
    req[2 * i] = req[2 * i + 1] = MPI_REQUEST_NULL;
    int rc;
    if (x[i].is_send) {
      rc = MPI_Isend(&x[i].hdr, (int)sizeof(tdm__hdr), MPI_BYTE, x[i].peer, TAG_DATA, MPI_COMM_WORLD, &req[2 * i]);
      if (rc == MPI_SUCCESS && x[i].nbytes)
        rc = MPI_Isend(x[i].buf, (int)x[i].nbytes, MPI_BYTE, x[i].peer, TAG_DATA, MPI_COMM_WORLD, &req[2 * i + 1]);
    } else {
      rc = MPI_Irecv(&x[i].got, (int)sizeof(tdm__hdr), MPI_BYTE, x[i].peer, TAG_DATA, MPI_COMM_WORLD, &req[2 * i]);
    }
    if (rc != MPI_SUCCESS) return mpi_err(rc, "posting a transfer");
  }
  int left = n;
  unsigned spins = 0;
  while (left > 0) {
    int progressed = 0;
    for (int i = 0; i < n; i++) {
      if (stage[i] == 2) continue;
      int done0 = 1, done1 = 1;
      if (req[2 * i] != MPI_REQUEST_NULL) MPI_Test(&req[2 * i], &done0, MPI_STATUS_IGNORE);
      if (req[2 * i + 1] != MPI_REQUEST_NULL) MPI_Test(&req[2 * i + 1], &done1, MPI_STATUS_IGNORE);
      if (x[i].is_send) {
        if (done0 && done1) stage[i] = 2, left--, progressed = 1, x[i].complete = 1;
        continue;
      }
      if (stage[i] == 0 && done0) {
        progressed = 1;
        if (x[i].got.magic == TDM_MSG_MAGIC && x[i].got.kind == TDM_COLL_ABORT) {
          char reason[600] = {0};
          int len = x[i].got.nbytes < sizeof reason - 1 ? (int)x[i].got.nbytes : (int)sizeof reason - 1;
          MPI_Recv(reason, len, MPI_BYTE, x[i].peer, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          return tdm__set_error(TDM_ERR_REMOTE, "rank %d failed: %s", x[i].peer, reason);
        }
        tdm_status st = tdm__check_header(c, x[i].peer, &x[i].hdr, &x[i].got);
        if (st != TDM_OK) return st;
        if (x[i].nbytes) {
          int rc = MPI_Irecv(x[i].buf, (int)x[i].nbytes, MPI_BYTE, x[i].peer, TAG_DATA, MPI_COMM_WORLD, &req[2 * i + 1]);
          if (rc != MPI_SUCCESS) return mpi_err(rc, "posting a receive");
          stage[i] = 1;
        } else {
          stage[i] = 2, left--, x[i].complete = 1;
        }
      } else if (stage[i] == 1 && done1) {
        stage[i] = 2, left--, progressed = 1, x[i].complete = 1;
      }
    }
    if (progressed) {
      spins = 0;
      continue;
    }
    if (++spins > 1000) sched_yield();
    if ((spins & 1023) == 0 && tdm_time_now() > deadline) {
      char b[160];
      for (int k = 0; k < 2 * n; k++)
        if (req[k] != MPI_REQUEST_NULL) MPI_Cancel(&req[k]), MPI_Request_free(&req[k]);
      return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s under MPI", c->rank,
                            tdm__call_str(&c->cur, b, sizeof b), c->timeout_s);
    }
  }
  return TDM_OK;
}

static void mpi_abort_tr(tdm__transport *tr, const char *reason) {
  mpi_tr *t = (mpi_tr *)tr;
  if (t->closed) return;
  t->closed = 1;
  size_t rl = strlen(reason);
  tdm__hdr h = {TDM_MSG_MAGIC, TDM_COLL_ABORT, 0, 0, 0, 0, tr->comm->comm_id, 0, rl};
  for (int p = 0; p < tr->size; p++) { /* best effort: buffered sends nobody waits for */
    if (p == tr->rank) continue;
    MPI_Request r[2];
    MPI_Isend(&h, (int)sizeof h, MPI_BYTE, p, TAG_DATA, MPI_COMM_WORLD, &r[0]);
    MPI_Isend((void *)reason, (int)rl, MPI_BYTE, p, TAG_DATA, MPI_COMM_WORLD, &r[1]);
    MPI_Request_free(&r[0]);
    MPI_Request_free(&r[1]);
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

static const tdm__transport_ops mpi_ops = {"mpi", run, mpi_abort_tr, mpi_destroy, NULL};

tdm_status tdm__mpi_transport_create(tdm__transport **out, struct tdm_comm *c) {
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
tdm_status tdm__mpi_transport_create(tdm__transport **out, struct tdm_comm *c) {
  (void)out;
  (void)c;
  return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                        "this build has no MPI transport: install openmpi-bin and libopenmpi-dev and rebuild");
}
#endif
