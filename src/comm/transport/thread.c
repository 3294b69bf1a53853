/* The thread transport: ranks are threads of one process. A send copies the message into the
 * receiver's queue for that sender and never blocks, so no exchange can deadlock; a receive
 * waits on the group's condition variable until its message is at the head of the queue.
 * One mutex guards the group: this transport is for tests and simulation, not for speed. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "comm/comm_impl.h"

typedef struct msg {
  struct msg *next;
  tdm__hdr hdr;
  char data[];
} msg;

typedef struct {
  msg *head, *tail;
} queue;

typedef struct tdm__thread_group {
  int size;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  queue *q; /* q[from * size + to] */
  int failed;
  tdm_status fail_status;
  char reason[512];
  int fail_origin; /* the rank whose failure reason gives (tdm_last_error_origin on the others) */
  unsigned char *joined; /* joined[r]: a communicator of rank r is in the group now */
  uint64_t clock;        /* counts joins and leaves: their order */
  uint64_t *left;        /* left[r]: when rank r's communicator was destroyed (0: never, or it joined again).
                            What it had not sent by then never comes: a rank that joined before that
                            fails a receive from it at once; one that joined after waits (it may rejoin) */
} group;

typedef struct {
  tdm__transport base;
  group *g;
  uint64_t joined_at; /* the group's clock when this rank joined */
} thread_tr;

/* Under g->mu: the peer's communicator was destroyed after this rank's joined. */
static int gone(const thread_tr *t, int peer) { return t->g->left[peer] > t->joined_at; }

tdm_status tdm_comm_thread_group_create(void **out, int size) {
  if (!out || size < 1 || size > 4096)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "thread_group_create: size %d%s; expected 1..4096 and an out pointer", size, out ? "" : ", out NULL");
  group *g = tdm__calloc(1, sizeof *g);
  if (!g) return tdm__set_error(TDM_ERR_NO_MEMORY, "thread_group_create: out of memory");
  g->q = tdm__calloc((size_t)size * (size_t)size, sizeof(queue));
  g->joined = tdm__calloc((size_t)size, 1);
  g->left = tdm__calloc((size_t)size, sizeof *g->left);
  if (!g->q || !g->joined || !g->left) {
    tdm__free(g->q);
    tdm__free(g->joined);
    tdm__free(g->left);
    tdm__free(g);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "thread_group_create: out of memory");
  }
  g->size = size;
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &a);
  pthread_condattr_destroy(&a);
  *out = g;
  return TDM_OK;
}

void tdm_comm_thread_group_destroy(void *vg) {
  group *g = vg;
  if (!g) return;
  for (int i = 0; i < g->size * g->size; i++)
    for (msg *m = g->q[i].head, *n; m; m = n) {
      n = m->next;
      tdm__free(m);
    }
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  tdm__free(g->q);
  tdm__free(g->joined);
  tdm__free(g->left);
  tdm__free(g);
}

static tdm_status post(group *g, int from, int to, const tdm__hdr *h, const void *buf) {
  msg *m = tdm__malloc_cat(sizeof *m + h->nbytes, TDM_MEM_COMM);
  if (!m) return tdm__set_error(TDM_ERR_NO_MEMORY, "thread transport: out of memory for a %llu-byte message",
                                (unsigned long long)h->nbytes);
  m->next = NULL;
  m->hdr = *h;
  if (h->nbytes) memcpy(m->data, buf, h->nbytes);
  queue *q = &g->q[from * g->size + to];
  if (q->tail) q->tail->next = m;
  else q->head = m;
  q->tail = m;
  return TDM_OK;
}

/* The group's failure as this rank's error: relayed, unless it is this rank's own. */
static tdm_status group_error(const group *g, int me) {
  return tdm__error_from(g->fail_origin != me ? g->fail_origin : -1, tdm__set_error(g->fail_status, "%s", g->reason));
}

static tdm_status run(tdm__transport *t, tdm__xfer *x, int n, double deadline) {
  thread_tr *tt = (thread_tr *)t;
  group *g = tt->g;
  struct tdm_comm *c = tdm__active(t);
  int me = t->rank;
  tdm_status st = TDM_OK;
  pthread_mutex_lock(&g->mu);
  if (g->failed) {
    st = group_error(g, me);
    goto out;
  }
  for (int i = 0; i < n && st == TDM_OK; i++)
    if (x[i].is_send) {
      st = post(g, me, x[i].peer, &x[i].hdr, x[i].buf);
      x[i].complete = 1;
    }
  if (st == TDM_OK) pthread_cond_broadcast(&g->cv);
  for (int i = 0; i < n && st == TDM_OK; i++) {
    if (x[i].is_send) continue;
    queue *q = &g->q[x[i].peer * g->size + me];
    while (!q->head && !g->failed && !gone(tt, x[i].peer)) {
      double left = deadline - tdm_time_now();
      if (left <= 0) {
        char b[160];
        st = tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s waiting for rank %d", c->rank,
                            tdm__call_str(&c->cur, b, sizeof b), c->timeout_s, tdm__comm_rank_of(c, x[i].peer));
        goto out;
      }
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      double wake = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (left < 0.5 ? left : 0.5);
      ts.tv_sec = (time_t)wake;
      ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
      pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    if (!q->head && !g->failed) { /* the peer is gone: as a closed connection over tcp */
      char b[160];
      st = tdm__set_error(TDM_ERR_REMOTE, "rank %d: %s: rank %d destroyed its communicator before sending what this rank waits for",
                          c->rank, tdm__call_str(&c->cur, b, sizeof b), tdm__comm_rank_of(c, x[i].peer));
      goto out;
    }
    if (!q->head) { /* failed while we waited */
      st = group_error(g, me);
      goto out;
    }
    msg *m = q->head;
    if (m->hdr.kind == TDM_COLL_ABORT) { /* leave it: everyone waiting on that rank must see it */
      st = tdm__error_from(x[i].peer, tdm__set_error(TDM_ERR_REMOTE, "%s", m->data));
      goto out;
    }
    q->head = m->next;
    if (!q->head) q->tail = NULL;
    x[i].got = m->hdr;
    st = tdm__xfer_header(c, &x[i]); /* the sizes now agree (or the message goes to the stash) */
    if (st == TDM_OK && x[i].nbytes) memcpy(x[i].buf, m->data, x[i].nbytes);
    tdm__free(m);
    if (st == TDM_OK && !tdm__xfer_done(t, &x[i])) { /* stashed: this receive reads on */
      i--;
      continue;
    }
    x[i].complete = st == TDM_OK;
  }
out:
  pthread_mutex_unlock(&g->mu);
  return st;
}

static void thread_abort(tdm__transport *t, const char *reason) {
  group *g = ((thread_tr *)t)->g;
  pthread_mutex_lock(&g->mu);
  if (!g->failed) {
    /* the whole group fails: a thread job has no way to go on without one of its ranks */
    g->failed = 1;
    g->fail_status = tdm__active(t)->fail_status ? tdm__active(t)->fail_status : TDM_ERR_REMOTE;
    snprintf(g->reason, sizeof g->reason, "rank %d failed: %s", t->rank, reason);
    int from = tdm__active(t)->fail_origin; /* a relayed failure names where it began */
    g->fail_origin = from >= 0 ? from : t->rank;
  }
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void thread_destroy(tdm__transport *t) {
  group *g = ((thread_tr *)t)->g;
  pthread_mutex_lock(&g->mu);
  g->joined[t->rank] = 0;
  g->left[t->rank] = ++g->clock;
  pthread_cond_broadcast(&g->cv); /* a rank waiting on this one hears it now, not at its timeout */
  pthread_mutex_unlock(&g->mu);
  tdm__free(t);
}

static int thread_pending(tdm__transport *t, int peer, int slow) {
  (void)slow;
  group *g = ((thread_tr *)t)->g;
  pthread_mutex_lock(&g->mu);
  int r = g->failed || gone((thread_tr *)t, peer) || g->q[peer * g->size + t->rank].head != NULL;
  pthread_mutex_unlock(&g->mu);
  return r;
}

/* ---- shared buffers: the ranks are threads of one process, so any memory is shared ------------
 * Rank 0 maps it and hands the address to the others through a broadcast; a count in the page in
 * front of the buffer says how many views are left, and the last one unmapped frees it. */
#define SHARED_HEAD 4096
static tdm_status thread_shared_map(tdm__transport *t, struct tdm_comm *c, size_t bytes, void **base) {
  (void)t;
  *base = NULL;
  int64_t at = 0;
  if (c->rank == 0) {
    void *m = mmap(NULL, bytes + SHARED_HEAD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      atomic_store((_Atomic int *)m, c->size);
      at = (int64_t)(uintptr_t)m;
    }
  }
  TDM__TRY(tdm_comm_broadcast(c, &at, 1, TDM_I64, 0, TDM_ALGO_AUTO));
  if (!at) return tdm__set_error(TDM_ERR_NO_MEMORY, "shared buffer: rank 0 could not map %zu bytes", bytes);
  *base = (char *)(uintptr_t)at + SHARED_HEAD;
  return TDM_OK;
}

static void thread_shared_unmap(tdm__transport *t, void *base, size_t bytes) {
  (void)t;
  char *m = (char *)base - SHARED_HEAD;
  if (atomic_fetch_sub((_Atomic int *)m, 1) == 1) munmap(m, bytes + SHARED_HEAD);
}

static tdm_status thread_shared_wait(tdm__transport *t, tdm__waiter *w, struct tdm_comm *c, int peer, double deadline,
                                     const char *what) {
  group *g = ((thread_tr *)t)->g;
  if (!tdm__backoff(&w->b)) return TDM_OK;
  pthread_mutex_lock(&g->mu);
  tdm_status st = g->failed ? group_error(g, t->rank) : TDM_OK;
  /* (a peer that left is not failed here: it may have done its part between the caller's look at
   * the shared flags and this wait, and only the caller can look again) */
  pthread_mutex_unlock(&g->mu);
  if (st == TDM_OK && tdm_time_now() > deadline) {
    if (peer >= 0)
      return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s waiting for rank %d", c->rank, what,
                            c->timeout_s, tdm__comm_rank_of(c, peer));
    return tdm__set_error(TDM_ERR_TIMEOUT, "rank %d: %s timed out after %.0f s", c->rank, what, c->timeout_s);
  }
  return st;
}

static const tdm__transport_ops thread_ops = {"thread",         run,           thread_abort,        thread_destroy,
                                              NULL,             thread_pending, thread_shared_map, thread_shared_unmap,
                                              thread_shared_wait};

tdm_status tdm__thread_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  group *g = cfg->thread_group;
  if (!g)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "comm_create: the thread transport (TANDEM_TRANSPORT=thread) joins ranks that are threads of one "
                          "process, and none were given (cfg.thread_group): use tandem train --emulate-ranks N, or shm, "
                          "tcp or mpi between processes");
  if (g->size != c->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: the thread group has %d ranks but the config says %d",
                          g->size, c->size);
  /* two threads as one rank both waited out the timeout for the rank nobody was */
  pthread_mutex_lock(&g->mu);
  int twice = g->joined[c->rank];
  g->joined[c->rank] = 1;
  uint64_t at = 0;
  if (!twice) g->left[c->rank] = 0, at = ++g->clock;
  pthread_mutex_unlock(&g->mu);
  if (twice)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_create: rank %d already joined this thread group (each of its %d threads takes "
                          "its own rank)", c->rank, g->size);
  thread_tr *t = tdm__calloc(1, sizeof *t);
  if (!t) {
    pthread_mutex_lock(&g->mu);
    g->joined[c->rank] = 0;
    pthread_mutex_unlock(&g->mu);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "comm_create: out of memory");
  }
  t->base.ops = &thread_ops;
  t->base.comm = c;
  t->base.rank = c->rank;
  t->base.size = c->size;
  t->g = g;
  t->joined_at = at;
  *out = &t->base;
  return TDM_OK;
}
