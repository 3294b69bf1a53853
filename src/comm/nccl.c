/* Device communicators (tandem/comm_device.h): creation and mode choice, the identity check every
 * call makes over the host communicator, NCCL's collectives, and the watchdog that aborts NCCL
 * when a collective outlives the timeout. Host staging: nccl_stage.c. Without NCCL at build time
 * every entry point says so. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tandem/comm_device.h"

static const char *const mode_names[TDM_DCOMM_MODE_COUNT] = {"auto", "nccl", "stage"};
const char *tdm_dcomm_mode_name(tdm_dcomm_mode m) { return (unsigned)m < TDM_DCOMM_MODE_COUNT ? mode_names[m] : "?"; }
tdm_dcomm_config tdm_dcomm_config_default(void) { return (tdm_dcomm_config){-1, TDM_DCOMM_AUTO, 0}; }

#ifndef TANDEM_HAVE_NCCL
/* ---- built without NCCL: every call says so --------------------------------------------------- */
#include "core/internal.h"

#define NOT_BUILT                                                                                                      \
  tdm__set_error(TDM_ERR_NOT_SUPPORTED, "device collectives: this tandem was built without NCCL (cmake/nccl.cmake "   \
                                        "found no CUDA toolkit or no nccl.h/libnccl; install them, or set "            \
                                        "CUDAToolkit_ROOT / NCCL_ROOT, and configure again)")
int tdm_dcomm_built(void) { return 0; }
int tdm_dcomm_device_available(const char **why) {
  if (why) *why = "this tandem was built without NCCL";
  return 0;
}
tdm_status tdm_dcomm_create(tdm_comm_t host, const tdm_dcomm_config *cfg, tdm_dcomm_t *out) {
  (void)host, (void)cfg;
  if (out) *out = NULL;
  return NOT_BUILT;
}
void tdm_dcomm_destroy(tdm_dcomm_t d) { (void)d; }
int tdm_dcomm_rank(tdm_dcomm_t d) { return (void)d, -1; }
int tdm_dcomm_size(tdm_dcomm_t d) { return (void)d, 0; }
int tdm_dcomm_device(tdm_dcomm_t d) { return (void)d, -1; }
tdm_dcomm_mode tdm_dcomm_mode_of(tdm_dcomm_t d) { return (void)d, TDM_DCOMM_AUTO; }
double tdm_dcomm_timeout(tdm_dcomm_t d) { return (void)d, 0; }
tdm_status tdm_dcomm_status(tdm_dcomm_t d) { return (void)d, TDM_ERR_NOT_SUPPORTED; }
const char *tdm_dcomm_last_error(tdm_dcomm_t d) { return (void)d, "this tandem was built without NCCL"; }
tdm_status tdm_dcomm_allreduce(tdm_dcomm_t d, const void *s, void *r, size_t n, tdm_dtype dt, tdm_redop op, void *st) {
  (void)d, (void)s, (void)r, (void)n, (void)dt, (void)op, (void)st;
  return NOT_BUILT;
}
tdm_status tdm_dcomm_reduce_scatter(tdm_dcomm_t d, const void *s, void *r, size_t n, tdm_dtype dt, tdm_redop op,
                                    void *st) {
  (void)d, (void)s, (void)r, (void)n, (void)dt, (void)op, (void)st;
  return NOT_BUILT;
}
tdm_status tdm_dcomm_allgather(tdm_dcomm_t d, const void *s, void *r, size_t n, tdm_dtype dt, void *st) {
  (void)d, (void)s, (void)r, (void)n, (void)dt, (void)st;
  return NOT_BUILT;
}
tdm_status tdm_dcomm_broadcast(tdm_dcomm_t d, void *b, size_t n, tdm_dtype dt, int root, void *st) {
  (void)d, (void)b, (void)n, (void)dt, (void)root, (void)st;
  return NOT_BUILT;
}
tdm_status tdm_dcomm_synchronize(tdm_dcomm_t d, void *st) {
  (void)d, (void)st;
  return NOT_BUILT;
}

#else
/* ---- with NCCL ------------------------------------------------------------------------------- */
#include "comm/nccl_impl.h"

#define DCALL_MAGIC 0x4c434454u /* "TDCL" */
#define TAG_CALL 0x7dc0        /* identities of calls, on ctl */
#define TAG_PROBE 0x7dc1       /* answers after a watchdog abort */

static const char *const dcoll_names[] = {"device all-reduce", "device reduce-scatter", "device all-gather",
                                          "device broadcast", "device probe"};

int tdm_dcomm_built(void) { return 1; }

int tdm_dcomm_device_available(const char **why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    cudaGetLastError(); /* not sticky: later calls may try again */
    return 0;
  }
  if (n < 1) {
    if (why) *why = "no CUDA device";
    return 0;
  }
  if (why) *why = "";
  return 1;
}

tdm_status tdm__dcomm_fail(struct tdm_dcomm *d, tdm_status st, const char *fmt, ...) {
  if (!atomic_load(&d->failed)) {
    pthread_mutex_lock(&d->mu);
    if (!atomic_load(&d->failed)) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(d->error, sizeof d->error, fmt, ap);
      va_end(ap);
      d->fail_status = st;
      atomic_store(&d->failed, 1);
    }
    pthread_mutex_unlock(&d->mu);
  }
  return tdm__set_error(d->fail_status, "%s", d->error);
}

tdm_status tdm__dcomm_cuda_fail(struct tdm_dcomm *d, cudaError_t e, const char *what) {
  tdm_status st = e == cudaErrorMemoryAllocation ? TDM_ERR_NO_MEMORY : TDM_ERR_SYSTEM;
  return tdm__dcomm_fail(d, st, "rank %d: %s: %s (%s)", d->rank, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

const char *tdm__dcall_str(const tdm__dcall *c, char *buf, size_t n) {
  const char *name = c->kind <= TDM__DCOLL_PROBE ? dcoll_names[c->kind] : "device call of unknown kind";
  if (c->kind == TDM__DCOLL_BROADCAST)
    snprintf(buf, n, "%s #%llu (%llu x %s, root %d)", name, (unsigned long long)c->seq, (unsigned long long)c->count,
             tdm_dtype_name((tdm_dtype)c->dtype), c->root);
  else if (c->kind == TDM__DCOLL_ALLGATHER)
    snprintf(buf, n, "%s #%llu (%llu x %s per rank)", name, (unsigned long long)c->seq, (unsigned long long)c->count,
             tdm_dtype_name((tdm_dtype)c->dtype));
  else if (c->kind == TDM__DCOLL_PROBE)
    snprintf(buf, n, "%s after #%llu", name, (unsigned long long)c->seq);
  else
    snprintf(buf, n, "%s #%llu (%llu x %s%s, %s)", name, (unsigned long long)c->seq, (unsigned long long)c->count,
             tdm_dtype_name((tdm_dtype)c->dtype), c->kind == TDM__DCOLL_REDUCE_SCATTER ? " per rank" : "",
             tdm_redop_name((tdm_redop)c->op));
  return buf;
}

/* ---- waiting ----------------------------------------------------------------------------------- */
static void nap(void) {
  struct timespec ts = {0, 200000}; /* 0.2 ms: a stream wait costs no core */
  nanosleep(&ts, NULL);
}

tdm_status tdm__dcomm_wait_event(struct tdm_dcomm *d, cudaEvent_t ev, const char *what) {
  double deadline = tdm_time_now() + d->timeout_s;
  for (tdm__backoff_t b = {0};; tdm__backoff(&b)) { /* spin first: copies take microseconds */
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return TDM_OK;
    if (e != cudaErrorNotReady) return tdm__dcomm_cuda_fail(d, e, what);
    if (atomic_load(&d->failed)) return tdm__set_error(d->fail_status, "%s", d->error);
    if (tdm_time_now() > deadline)
      return tdm__dcomm_fail(d, TDM_ERR_TIMEOUT, "rank %d: %s did not finish within %.3g s (the stream is stuck)",
                             d->rank, what, d->timeout_s);
  }
}

/* ---- the watchdog ------------------------------------------------------------------------------ */
/* Under d->mu: ends NCCL's kernels and frees the communicator; releases an injected stall. */
static void abort_nccl_locked(struct tdm_dcomm *d) {
  atomic_store(&d->stall_release, 1); /* first: the abort may wait for the stream */
  if (d->nccl) {
    ncclCommAbort(d->nccl);
    d->nccl = NULL;
  }
}

static void fail_locked(struct tdm_dcomm *d, tdm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_locked(struct tdm_dcomm *d, tdm_status st, const char *fmt, ...) {
  if (atomic_load(&d->failed)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->error, sizeof d->error, fmt, ap);
  va_end(ap);
  d->fail_status = st;
  atomic_store(&d->failed, 1);
}

/* Polls NCCL's asynchronous error and the oldest collective in flight every millisecond; on an
 * error or a collective older than the timeout it aborts NCCL (seconds, where NCCL would wait for
 * ever) and leaves the naming of the missing ranks to the next call (probe). */
static void *watchdog(void *arg) {
  struct tdm_dcomm *d = arg;
  cudaSetDevice(d->device); /* events live on d's device */
  while (!atomic_load(&d->wd_stop)) {
    pthread_mutex_lock(&d->mu);
    if (d->nccl && !atomic_load(&d->failed)) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(d->nccl, &async);
      if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        ncclResult_t bad = r != ncclSuccess ? r : async;
        fail_locked(d, TDM_ERR_REMOTE, "rank %d: NCCL reported an error: %s (%s); the NCCL communicator was aborted",
                    d->rank, ncclGetErrorString(bad), ncclGetLastError(d->nccl));
        d->probe_pending = 1, d->probe_seq = d->seq;
        abort_nccl_locked(d);
      }
      while (d->fl_n > 0 && !atomic_load(&d->failed)) {
        int i = d->fl_head;
        cudaError_t e = cudaEventQuery(d->fl[i].ev);
        if (e == cudaSuccess) {
          d->fl_head = (d->fl_head + 1) % TDM__DCOMM_INFLIGHT, d->fl_n--;
          continue;
        }
        double age = tdm_time_now() - d->fl[i].t0;
        if (e != cudaErrorNotReady || age > d->timeout_s) {
          char w[160];
          tdm__dcall_str(&d->fl[i].call, w, sizeof w);
          if (e != cudaErrorNotReady)
            fail_locked(d, TDM_ERR_SYSTEM, "rank %d: %s failed on the GPU: %s; the NCCL communicator was aborted", d->rank,
                        w, cudaGetErrorString(e));
          else
            fail_locked(d, TDM_ERR_TIMEOUT,
                        "rank %d: %s did not complete within %.3g s; the NCCL communicator was aborted", d->rank, w,
                        d->timeout_s);
          d->probe_pending = 1, d->probe_seq = d->fl[i].call.seq;
          abort_nccl_locked(d);
        }
        break;
      }
    }
    pthread_mutex_unlock(&d->mu);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* ---- the identity check -------------------------------------------------------------------------- */
/* "1, 3 and 4" */
static void rank_list(const int *r, int n, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < n && at + 16 < cap; i++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%d", i == 0 ? "" : (i == n - 1 ? " and " : ", "), r[i]);
}

/* Sends call to every peer and hears every peer's, checking each: the ranks still unheard at the
 * timeout are the ones named. With the MPI transport (no tagged messages) an all-gather of the
 * identities does the check and the transport names whom it waited for. */
static tdm_status exchange(struct tdm_dcomm *d, const tdm__dcall *call, int tag, int check) {
  int P = d->size;
  char a[160], b[160];
  if (P == 1) return TDM_OK;
  if (tdm_comm_transport(d->ctl) == TDM_TRANSPORT_MPI) {
    tdm__dcall all[P];
    tdm_status st = tdm_comm_allgather(d->ctl, call, all, sizeof *call, TDM_U8, TDM_ALGO_DIRECT);
    if (st != TDM_OK)
      return tdm__dcomm_fail(d, st, "rank %d: %s: %s", d->rank, tdm__dcall_str(call, a, sizeof a), tdm_last_error());
    for (int q = 0; q < P && check; q++)
      if (memcmp(&all[q], call, sizeof *call))
        return tdm__dcomm_fail(d, TDM_ERR_MISMATCH, "device collective mismatch: rank %d called %s but rank %d called %s",
                               d->rank, tdm__dcall_str(call, a, sizeof a), q, tdm__dcall_str(&all[q], b, sizeof b));
    return TDM_OK;
  }
  for (int q = 0; q < P; q++) {
    if (q == d->rank) continue;
    tdm_status st = tdm_comm_tsend(d->ctl, q, tag, call, sizeof *call);
    if (st != TDM_OK)
      return tdm__dcomm_fail(d, st, "rank %d: %s: %s", d->rank, tdm__dcall_str(call, a, sizeof a), tdm_last_error());
  }
  int wait[P], n = 0;
  for (int q = 0; q < P; q++)
    if (q != d->rank) wait[n++] = q;
  while (n > 0) {
    tdm__dcall got;
    int from = -1;
    size_t nb = 0;
    tdm_status st = tdm_comm_trecv_among(d->ctl, wait, n, tag, &got, sizeof got, &from, &nb);
    if (st == TDM_ERR_TIMEOUT) {
      char who[256];
      rank_list(wait, n, who, sizeof who);
      return tdm__dcomm_fail(d, TDM_ERR_TIMEOUT, "rank %d: %s: rank%s %s did not %s within %.3g s", d->rank,
                             tdm__dcall_str(call, a, sizeof a), n > 1 ? "s" : "", who,
                             tag == TAG_PROBE ? "answer" : "arrive", d->timeout_s);
    }
    if (st != TDM_OK) {
      char who[256];
      rank_list(wait, n, who, sizeof who);
      return tdm__dcomm_fail(d, st, "rank %d: %s (still waiting for rank%s %s): %s", d->rank,
                             tdm__dcall_str(call, a, sizeof a), n > 1 ? "s" : "", who, tdm_last_error());
    }
    if (check && (nb != sizeof got || memcmp(&got, call, sizeof got)))
      return tdm__dcomm_fail(d, TDM_ERR_MISMATCH, "device collective mismatch: rank %d called %s but rank %d called %s",
                             d->rank, tdm__dcall_str(call, a, sizeof a), from,
                             nb == sizeof got && got.magic == DCALL_MAGIC ? tdm__dcall_str(&got, b, sizeof b)
                                                                          : "something else");
    for (int i = 0; i < n; i++)
      if (wait[i] == from) {
        wait[i] = wait[--n];
        break;
      }
  }
  return TDM_OK;
}

/* After the watchdog aborted NCCL: every rank that is still there answers (its own watchdog fires
 * too, or its next call finds the peers' answers); those that do not are named. */
static tdm_status run_probe(struct tdm_dcomm *d) {
  pthread_mutex_lock(&d->mu); /* the watchdog sets it just after failing d */
  int pending = d->probe_pending;
  d->probe_pending = 0;
  pthread_mutex_unlock(&d->mu);
  if (!pending) return TDM_OK;
  tdm__dcall probe = {DCALL_MAGIC, TDM__DCOLL_PROBE, 0, 0, 0, 0, d->probe_seq, 0};
  char keep[sizeof d->error];
  tdm_status was = d->fail_status;
  memcpy(keep, d->error, sizeof keep);
  atomic_store(&d->failed, 0); /* exchange fails d afresh: keep both stories */
  tdm_status st = d->size == 1 ? TDM_OK : exchange(d, &probe, TAG_PROBE, 0);
  char why[sizeof d->error];
  if (d->size == 1) snprintf(why, sizeof why, "; the stall is on this rank (its GPU, stream or NCCL)");
  else if (st == TDM_OK) snprintf(why, sizeof why, "; every rank answered the probe: the stall is in a GPU or NCCL");
  else snprintf(why, sizeof why, "; probe: %.480s", d->error);
  pthread_mutex_lock(&d->mu);
  snprintf(d->error, sizeof d->error, "%.500s%.500s", keep, why);
  d->fail_status = was;
  atomic_store(&d->failed, 1);
  pthread_mutex_unlock(&d->mu);
  return was;
}

static tdm_status failed_status(struct tdm_dcomm *d) {
  run_probe(d);
  return tdm__set_error(d->fail_status, "%s", d->error);
}

/* ---- creation ---------------------------------------------------------------------------------- */
/* What each rank tells the others at creation. */
typedef struct {
  int32_t status, device;
  uint64_t host;
  char bus[32];
  char why[200];
} rank_info;

static tdm_status env_mode(tdm_dcomm_mode *m) {
  const char *v = getenv("TANDEM_DEVICE_COLL");
  if (!v || !*v) return TDM_OK;
  for (int i = 0; i < TDM_DCOMM_MODE_COUNT; i++)
    if (!strcmp(v, mode_names[i])) {
      *m = (tdm_dcomm_mode)i;
      return TDM_OK;
    }
  return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_DEVICE_COLL='%s': expected auto, nccl or stage", v);
}

static tdm_status env_timeout(double *t) {
  const char *v = getenv("TANDEM_DEVICE_TIMEOUT");
  if (!v || !*v) return TDM_OK;
  char *end;
  double x = strtod(v, &end);
  if (*end || !(x > 0) || x > 1e6)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_DEVICE_TIMEOUT='%s': expected seconds, a number in (0, 1e6]", v);
  *t = x;
  return TDM_OK;
}

/* This rank's own checks: configuration, device. Fills info (status + why on failure). */
static void local_setup(struct tdm_dcomm *d, const tdm_dcomm_config *cfg, rank_info *info) {
  tdm_status st = TDM_OK;
  char why[200] = "";
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (cfg->mode < 0 || cfg->mode >= TDM_DCOMM_MODE_COUNT)
    st = TDM_ERR_INVALID_ARG, snprintf(why, sizeof why, "mode %d is unknown; expected auto, nccl or stage", (int)cfg->mode);
  else if (cfg->timeout_s < 0 || cfg->timeout_s != cfg->timeout_s)
    st = TDM_ERR_INVALID_ARG, snprintf(why, sizeof why, "timeout %g s; expected 0 (default) or more", cfg->timeout_s);
  else if ((st = env_mode(&d->mode)) != TDM_OK || (st = env_timeout(&d->timeout_s)) != TDM_OK)
    snprintf(why, sizeof why, "%s", tdm_last_error());
  else if (e != cudaSuccess || n < 1) {
    st = TDM_ERR_NOT_SUPPORTED;
    snprintf(why, sizeof why, "no CUDA device (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cudaGetLastError();
  } else {
    int dev = cfg->device;
    if (dev < 0) {
      const char *lr = getenv("LOCAL_RANK");
      if (lr && *lr) dev = atoi(lr) % n;
      else if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    }
    if (dev >= n) st = TDM_ERR_INVALID_ARG, snprintf(why, sizeof why, "device %d does not exist (%d CUDA device%s)", dev, n, n > 1 ? "s" : "");
    else if ((e = cudaSetDevice(dev)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess)
      st = TDM_ERR_SYSTEM, snprintf(why, sizeof why, "device %d: %s", dev, cudaGetErrorString(e));
    else if ((e = cudaDeviceGetPCIBusId(info->bus, sizeof info->bus, dev)) != cudaSuccess)
      st = TDM_ERR_SYSTEM, snprintf(why, sizeof why, "device %d: PCI bus id: %s", dev, cudaGetErrorString(e));
    if (st == TDM_OK) d->device = dev;
  }
  if (cfg->mode != TDM_DCOMM_AUTO && st == TDM_OK) d->mode = cfg->mode;
  if (cfg->timeout_s > 0) d->timeout_s = cfg->timeout_s;
  char hn[256] = "";
  gethostname(hn, sizeof hn - 1);
  uint64_t h = 0x51ed;
  for (const char *p = hn; *p; p++) h = tdm_hash64(h, (uint64_t)(unsigned char)*p);
  info->status = st, info->device = d->device, info->host = h;
  snprintf(info->why, sizeof info->why, "%s", why);
}

/* Waits until NCCL's non-blocking call (init, an enqueue, finalize) is done. The lock keeps the
 * watchdog from aborting the communicator under us. */
static tdm_status nccl_wait_ready(struct tdm_dcomm *d, const char *what) {
  double deadline = tdm_time_now() + d->timeout_s;
  for (tdm__backoff_t b = {0};; tdm__backoff(&b)) {
    pthread_mutex_lock(&d->mu);
    if (!d->nccl) {
      pthread_mutex_unlock(&d->mu);
      return atomic_load(&d->failed) ? tdm__set_error(d->fail_status, "%s", d->error)
                                     : tdm__dcomm_fail(d, TDM_ERR_INTERNAL, "rank %d: %s: no NCCL communicator", d->rank, what);
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(d->nccl, &async);
    char last[200] = "";
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress))
      snprintf(last, sizeof last, "%s", ncclGetLastError(d->nccl));
    pthread_mutex_unlock(&d->mu);
    if (r == ncclSuccess && async == ncclSuccess) return TDM_OK;
    if (r != ncclSuccess || async != ncclInProgress)
      return tdm__dcomm_fail(d, TDM_ERR_SYSTEM, "rank %d: %s: %s (%s)", d->rank, what,
                             ncclGetErrorString(r != ncclSuccess ? r : async), last);
    if (tdm_time_now() > deadline)
      return tdm__dcomm_fail(d, TDM_ERR_TIMEOUT, "rank %d: %s did not finish within %.3g s", d->rank, what, d->timeout_s);
  }
}

static tdm_status start_nccl(struct tdm_dcomm *d) {
  struct {
    int32_t ok;
    char why[124];
    ncclUniqueId id;
  } u;
  memset(&u, 0, sizeof u);
  if (d->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&u.id);
    u.ok = r == ncclSuccess;
    if (!u.ok) snprintf(u.why, sizeof u.why, "%s", ncclGetErrorString(r));
  }
  /* the id travels over tandem's own communicator: no second rendezvous for NCCL */
  tdm_status st = tdm_comm_broadcast(d->ctl, &u, sizeof u, TDM_U8, 0, TDM_ALGO_AUTO);
  if (st != TDM_OK) return tdm__dcomm_fail(d, st, "rank %d: NCCL id broadcast: %s", d->rank, tdm_last_error());
  if (!u.ok)
    return tdm__dcomm_fail(d, TDM_ERR_SYSTEM, "rank %d: rank 0 could not make an NCCL id: %s", d->rank, u.why);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0; /* every NCCL wait is ours, with our timeout */
  ncclResult_t r = ncclCommInitRankConfig(&d->nccl, d->size, u.id, d->rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    d->nccl = NULL;
    st = tdm__dcomm_fail(d, TDM_ERR_SYSTEM, "rank %d: ncclCommInitRank: %s (%s)", d->rank, ncclGetErrorString(r),
                         ncclGetLastError(NULL));
  } else {
    st = nccl_wait_ready(d, "ncclCommInitRank");
  }
  /* everyone learns whether everyone is up, so all fail alike */
  int32_t mine = st, all[d->size];
  tdm_status st2 = tdm_comm_allgather(d->ctl, &mine, all, 1, TDM_I32, TDM_ALGO_AUTO);
  if (st != TDM_OK) return st;
  if (st2 != TDM_OK) return tdm__dcomm_fail(d, st2, "rank %d: after ncclCommInitRank: %s", d->rank, tdm_last_error());
  for (int q = 0; q < d->size; q++)
    if (all[q] != TDM_OK)
      return tdm__dcomm_fail(d, (tdm_status)all[q], "rank %d: rank %d could not start NCCL (%s; see its log)", d->rank, q,
                             tdm_status_str((tdm_status)all[q]));
  for (int i = 0; i < TDM__DCOMM_INFLIGHT; i++) {
    cudaError_t e = cudaEventCreateWithFlags(&d->fl[i].ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return tdm__dcomm_cuda_fail(d, e, "cudaEventCreate");
  }
  if (pthread_create(&d->wd, NULL, watchdog, d) != 0)
    return tdm__dcomm_fail(d, TDM_ERR_SYSTEM, "rank %d: could not start the NCCL watchdog thread", d->rank);
  d->wd_started = 1;
  return TDM_OK;
}

static tdm_status create(tdm_comm_t host, const tdm_dcomm_config *cfg, struct tdm_dcomm *d) {
  d->host = host;
  d->rank = tdm_comm_rank(host), d->size = tdm_comm_size(host);
  d->device = -1;
  d->timeout_s = host->timeout_s;
  rank_info me;
  memset(&me, 0, sizeof me);
  local_setup(d, cfg, &me);
  /* our own sub-communicator for the checks: its timeout is ours, its tagged messages its own */
  tdm_status st = tdm_comm_split(host, 0, d->rank, &d->ctl);
  if (st != TDM_OK) return st;
  tdm_comm_set_timeout(d->ctl, d->timeout_s);
  rank_info *all = tdm__calloc((size_t)d->size, sizeof *all);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "device communicator: out of memory");
  st = tdm_comm_allgather(d->ctl, &me, all, sizeof me, TDM_U8, TDM_ALGO_AUTO);
  if (st != TDM_OK) {
    tdm__free(all);
    return tdm__set_error(st, "device communicator: rank %d: exchanging devices: %s", d->rank, tdm_last_error());
  }
  for (int q = 0; q < d->size && st == TDM_OK; q++)
    if (all[q].status != TDM_OK)
      st = tdm__set_error((tdm_status)all[q].status, "device communicator: rank %d: %s", q, all[q].why);
  /* ranks on one GPU: staging (NCCL refuses them) */
  int shared_a = -1, shared_b = -1;
  for (int a = 0; a < d->size && st == TDM_OK && shared_a < 0; a++)
    for (int b = a + 1; b < d->size; b++)
      if (all[a].host == all[b].host && !strcmp(all[a].bus, all[b].bus)) {
        shared_a = a, shared_b = b;
        break;
      }
  if (st == TDM_OK && d->mode == TDM_DCOMM_AUTO) d->mode = shared_a >= 0 ? TDM_DCOMM_STAGE : TDM_DCOMM_NCCL;
  if (st == TDM_OK && d->mode == TDM_DCOMM_NCCL && shared_a >= 0)
    st = tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                        "device communicator: ranks %d and %d share GPU %s on one host and NCCL refuses two ranks on one "
                        "GPU; use TANDEM_DEVICE_COLL=stage (or auto) or one GPU per rank",
                        shared_a, shared_b, all[shared_a].bus);
  tdm__free(all);
  if (st != TDM_OK) return st;
  if (d->mode == TDM_DCOMM_NCCL) return start_nccl(d);
  cudaError_t e = cudaEventCreateWithFlags(&d->stage_ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&d->h2d_ev, cudaEventDisableTiming);
  return e == cudaSuccess ? TDM_OK : tdm__dcomm_cuda_fail(d, e, "cudaEventCreate");
}

tdm_status tdm_dcomm_create(tdm_comm_t host, const tdm_dcomm_config *cfg, tdm_dcomm_t *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "device communicator: out is NULL");
  *out = NULL;
  if (!host) return tdm__set_error(TDM_ERR_INVALID_ARG, "device communicator: the host communicator is NULL");
  if (tdm_comm_status(host) != TDM_OK)
    return tdm__set_error(tdm_comm_status(host), "device communicator: the host communicator has failed: %s",
                          tdm_comm_last_error(host));
  tdm_dcomm_config def = tdm_dcomm_config_default();
  struct tdm_dcomm *d = tdm__calloc(1, sizeof *d);
  if (!d) return tdm__set_error(TDM_ERR_NO_MEMORY, "device communicator: out of memory");
  pthread_mutex_init(&d->mu, NULL);
  tdm_status st = create(host, cfg ? cfg : &def, d);
  if (st != TDM_OK) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", tdm_last_error());
    tdm_dcomm_destroy(d);
    return tdm__set_error(st, "%s", keep);
  }
  tdm_log(TDM_LOG_DEBUG, "device communicator: rank %d of %d on GPU %d, %s, timeout %.3g s", d->rank, d->size, d->device,
          tdm_dcomm_mode_name(d->mode), d->timeout_s);
  *out = d;
  return TDM_OK;
}

void tdm_dcomm_destroy(tdm_dcomm_t d) {
  if (!d) return;
  if (d->device >= 0) cudaSetDevice(d->device);
  /* in flight: let them finish (the watchdog aborts them at the timeout) */
  for (;;) {
    pthread_mutex_lock(&d->mu);
    int busy = d->nccl && d->fl_n > 0 && !atomic_load(&d->failed);
    pthread_mutex_unlock(&d->mu);
    if (!busy || !d->wd_started) break;
    nap();
  }
  if (d->wd_started) {
    atomic_store(&d->wd_stop, 1);
    pthread_join(d->wd, NULL);
  }
  if (d->nccl) {
    if (atomic_load(&d->failed)) {
      ncclCommAbort(d->nccl);
    } else {
      ncclResult_t r = ncclCommFinalize(d->nccl);
      if (r == ncclSuccess || r == ncclInProgress) r = nccl_wait_ready(d, "ncclCommFinalize") == TDM_OK ? ncclSuccess : ncclSystemError;
      if (r == ncclSuccess) ncclCommDestroy(d->nccl);
      else ncclCommAbort(d->nccl);
    }
    d->nccl = NULL;
  }
  for (int i = 0; i < TDM__DCOMM_INFLIGHT; i++)
    if (d->fl[i].ev) cudaEventDestroy(d->fl[i].ev);
  tdm__dstage_free(d);
  tdm_comm_destroy(d->ctl);
  pthread_mutex_destroy(&d->mu);
  tdm__free(d);
}

int tdm_dcomm_rank(tdm_dcomm_t d) { return d ? d->rank : -1; }
int tdm_dcomm_size(tdm_dcomm_t d) { return d ? d->size : 0; }
int tdm_dcomm_device(tdm_dcomm_t d) { return d ? d->device : -1; }
tdm_dcomm_mode tdm_dcomm_mode_of(tdm_dcomm_t d) { return d ? d->mode : TDM_DCOMM_AUTO; }
double tdm_dcomm_timeout(tdm_dcomm_t d) { return d ? d->timeout_s : 0; }
tdm_status tdm_dcomm_status(tdm_dcomm_t d) {
  return !d ? TDM_ERR_INVALID_ARG : atomic_load(&d->failed) ? d->fail_status : TDM_OK;
}
const char *tdm_dcomm_last_error(tdm_dcomm_t d) { return d ? d->error : "device communicator is NULL"; }

void tdm__dcomm_inject_stall(struct tdm_dcomm *d) { d->inject_stall = 1; }

/* ---- collectives --------------------------------------------------------------------------------- */
static ncclDataType_t nccl_type(tdm_dtype dt) { return dt == TDM_BF16 ? ncclBfloat16 : ncclFloat32; }
static ncclRedOp_t nccl_op(tdm_redop op) {
  static const ncclRedOp_t ops[TDM_REDOP_COUNT] = {ncclSum, ncclAvg, ncclProd, ncclMin, ncclMax};
  return ops[op];
}

/* Holds the stream until the watchdog releases it (or 4 timeouts pass): a collective that never
 * completes, for the tests. A host function may sleep but must not call CUDA. */
static void CUDART_CB stall_fn(void *arg) {
  struct tdm_dcomm *d = arg;
  double until = tdm_time_now() + 4 * d->timeout_s;
  while (!atomic_load(&d->stall_release) && tdm_time_now() < until) nap();
}

static tdm_status run_nccl(struct tdm_dcomm *d, const tdm__dcall *call, const void *sendbuf, void *recvbuf,
                           cudaStream_t stream) {
  char w[160];
  tdm__dcall_str(call, w, sizeof w);
  /* a free slot in the ring: wait for the oldest collective (the watchdog retires them) */
  double deadline = tdm_time_now() + d->timeout_s;
  for (;;) {
    pthread_mutex_lock(&d->mu);
    int full = d->fl_n == TDM__DCOMM_INFLIGHT;
    pthread_mutex_unlock(&d->mu);
    if (!full || atomic_load(&d->failed)) break;
    if (tdm_time_now() > deadline)
      return tdm__dcomm_fail(d, TDM_ERR_TIMEOUT, "rank %d: %s: %d collectives still in flight after %.3g s", d->rank, w,
                             TDM__DCOMM_INFLIGHT, d->timeout_s);
    nap();
  }
  pthread_mutex_lock(&d->mu);
  if (atomic_load(&d->failed) || !d->nccl) {
    pthread_mutex_unlock(&d->mu);
    return failed_status(d);
  }
  size_t n = call->count;
  ncclDataType_t t = nccl_type((tdm_dtype)call->dtype);
  /* One rank: an average is the sum. NCCL before 2.29.7 leaves the last count % blocks elements
   * of a one-rank average unwritten (NVIDIA/nccl#1950; test_nccl caught it with 2.28.3 on an
   * H100), while its one-rank sum is a plain copy. */
  tdm_redop rop = d->size == 1 && call->op == TDM_AVG ? TDM_SUM : (tdm_redop)call->op;
  ncclResult_t r;
  switch (call->kind) {
  case TDM__DCOLL_ALLREDUCE: r = ncclAllReduce(sendbuf, recvbuf, n, t, nccl_op(rop), d->nccl, stream); break;
  case TDM__DCOLL_REDUCE_SCATTER: r = ncclReduceScatter(sendbuf, recvbuf, n, t, nccl_op(rop), d->nccl, stream);
    break;
  case TDM__DCOLL_ALLGATHER: r = ncclAllGather(sendbuf, recvbuf, n, t, d->nccl, stream); break;
  default: r = ncclBroadcast(recvbuf, recvbuf, n, t, call->root, d->nccl, stream); break;
  }
  pthread_mutex_unlock(&d->mu);
  if (r == ncclInProgress) { /* the enqueue finishes in the background */
    if (nccl_wait_ready(d, w) != TDM_OK) {
      pthread_mutex_lock(&d->mu);
      abort_nccl_locked(d);
      pthread_mutex_unlock(&d->mu);
      return failed_status(d);
    }
  } else if (r != ncclSuccess) {
    tdm__dcomm_fail(d, TDM_ERR_SYSTEM, "rank %d: %s: NCCL: %s (%s)", d->rank, w, ncclGetErrorString(r),
                    ncclGetLastError(d->nccl));
    pthread_mutex_lock(&d->mu);
    abort_nccl_locked(d);
    pthread_mutex_unlock(&d->mu);
    return failed_status(d);
  }
  pthread_mutex_lock(&d->mu);
  if (d->inject_stall) {
    d->inject_stall = 0;
    atomic_store(&d->stall_release, 0);
    cudaLaunchHostFunc(stream, stall_fn, d);
  }
  int slot = (d->fl_head + d->fl_n) % TDM__DCOMM_INFLIGHT;
  cudaError_t e = cudaEventRecord(d->fl[slot].ev, stream);
  if (e == cudaSuccess) {
    d->fl[slot].t0 = tdm_time_now();
    d->fl[slot].call = *call;
    d->fl_n++;
  }
  pthread_mutex_unlock(&d->mu);
  return e == cudaSuccess ? TDM_OK : tdm__dcomm_cuda_fail(d, e, w);
}

static tdm_status dcall(struct tdm_dcomm *d, int kind, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                        tdm_redop op, int root, void *stream) {
  const char *name = dcoll_names[kind];
  if (!d) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: communicator is NULL", name);
  if (dt != TDM_F32 && dt != TDM_BF16)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "%s: dtype %s; expected f32 or bf16", name, tdm_dtype_name(dt));
  if ((unsigned)op >= TDM_REDOP_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: op %d is unknown; expected sum, avg, prod, min or max", name, (int)op);
  if (root < 0 || root >= d->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: root %d is not a rank of this communicator (size %d)", name, root,
                          d->size);
  if (count > ((size_t)1 << 40) / (size_t)d->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: count %zu is implausibly large", name, count);
  if (count && (!recvbuf || (!sendbuf && kind != TDM__DCOLL_BROADCAST)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: a buffer is NULL with a non-zero count", name);
  if (atomic_load(&d->failed)) return failed_status(d);
  cudaError_t e = cudaSetDevice(d->device);
  if (e != cudaSuccess) return tdm__dcomm_cuda_fail(d, e, "cudaSetDevice");
  tdm__dcall call = {DCALL_MAGIC, (uint32_t)kind, (uint32_t)dt, (uint32_t)op, root, 0, ++d->seq, count};
  TDM__TRY(exchange(d, &call, TAG_CALL, 1)); /* every rank is in this very call before NCCL is */
  if (!count) return TDM_OK;
  if (d->mode == TDM_DCOMM_STAGE) return tdm__dstage_run(d, &call, sendbuf, recvbuf, stream);
  return run_nccl(d, &call, sendbuf, recvbuf, (cudaStream_t)stream);
}

tdm_status tdm_dcomm_allreduce(tdm_dcomm_t d, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                               tdm_redop op, void *stream) {
  return dcall(d, TDM__DCOLL_ALLREDUCE, sendbuf, recvbuf, count, dt, op, 0, stream);
}
tdm_status tdm_dcomm_reduce_scatter(tdm_dcomm_t d, const void *sendbuf, void *recvbuf, size_t recvcount, tdm_dtype dt,
                                    tdm_redop op, void *stream) {
  return dcall(d, TDM__DCOLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dt, op, 0, stream);
}
tdm_status tdm_dcomm_allgather(tdm_dcomm_t d, const void *sendbuf, void *recvbuf, size_t sendcount, tdm_dtype dt,
                               void *stream) {
  return dcall(d, TDM__DCOLL_ALLGATHER, sendbuf, recvbuf, sendcount, dt, TDM_SUM, 0, stream);
}
tdm_status tdm_dcomm_broadcast(tdm_dcomm_t d, void *buf, size_t count, tdm_dtype dt, int root, void *stream) {
  return dcall(d, TDM__DCOLL_BROADCAST, buf, buf, count, dt, TDM_SUM, root, stream);
}

tdm_status tdm_dcomm_synchronize(tdm_dcomm_t d, void *stream) {
  if (!d) return tdm__set_error(TDM_ERR_INVALID_ARG, "device synchronize: communicator is NULL");
  if (atomic_load(&d->failed)) return failed_status(d);
  cudaSetDevice(d->device);
  /* a backstop: the watchdog fails a stuck collective at the timeout, naming it, well before */
  double deadline = tdm_time_now() + 2 * d->timeout_s + 1;
  for (tdm__backoff_t b = {0};; tdm__backoff(&b)) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) return tdm__dcomm_cuda_fail(d, e, "device synchronize");
    if (atomic_load(&d->failed)) break; /* aborted: the stream drains; report it below */
    if (tdm_time_now() > deadline) {
      tdm__dcomm_fail(d, TDM_ERR_TIMEOUT, "rank %d: device synchronize: the stream did not finish within %.3g s",
                      d->rank, 2 * d->timeout_s + 1);
      pthread_mutex_lock(&d->mu);
      abort_nccl_locked(d);
      pthread_mutex_unlock(&d->mu);
      break;
    }
  }
  if (atomic_load(&d->failed)) {
    /* the watchdog's abort unblocks the stream; wait for it (bounded) so buffers are free again */
    double until = tdm_time_now() + d->timeout_s;
    while (cudaStreamQuery((cudaStream_t)stream) == cudaErrorNotReady && tdm_time_now() < until) nap();
    return failed_status(d);
  }
  return TDM_OK;
}
#endif
