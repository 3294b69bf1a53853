/* The intra-op pool: persistent workers woken per parallel_for. The caller runs range 0 itself,
 * so a pool of n threads has n-1 workers. Small loops (n < 2 * min_chunk) never wake anyone, and
 * a parallel_for inside a range runs serially on its thread.
 *
 * A worker that finishes a range, and a caller waiting for the others, spin for a short while
 * (TANDEM_SPIN_US, default 50 us) before they sleep on the condition variable: a ResNet step
 * runs some 400 loops of a few hundred microseconds, and a futex wake-up on the development VM
 * takes 30-80 us, so sleeping between them left a core idle 6-7% of a two-thread step. They
 * never spin when the node's ranks x threads exceed its cores (a spinning thread would take
 * the core another rank's thread is waiting for).
 *
 * OpenBLAS is kept at one thread: tdm_k_gemm splits large products over this pool instead. Two
 * pools on the same cores fight (OpenBLAS's idle threads spin in sched_yield while ours work),
 * and one pool lets small GEMMs (attention heads) run side by side. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/cluster.h"

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  pthread_t *workers;
  int n_threads;  /* including the caller */
  int n_workers;  /* n_threads - 1 */
  _Atomic uint64_t generation; /* written under mu; read by spinning workers without it */
  uint64_t born;  /* the generation when the current workers were created */
  _Atomic int pending; /* ranges not yet finished in this generation */
  int stop;
  double spin_s;  /* how long a thread spins before it sleeps */
  /* the current job: written under mu before generation moves on, read after it has */
  tdm_range_fn fn;
  void *ctx;
  int64_t n, n_ranges;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          NULL, 1, 0, 0, 0, 0, 0, 0, NULL, NULL, 0, 0};

static _Thread_local int in_range; /* this thread is running a range of a parallel_for */

static void range_of(int64_t n, int64_t ranges, int64_t i, int64_t *b, int64_t *e) {
  *b = n * i / ranges;
  *e = n * (i + 1) / ranges;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

/* Spins until *gen != old or, without gen, until *cnt == 0, for at most pool.spin_s; 1 if it
 * happened. */
static int spin_until(_Atomic uint64_t *gen, uint64_t old, _Atomic int *cnt) {
  if (pool.spin_s <= 0) return 0;
  double end = tdm_time_now() + pool.spin_s;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (gen ? atomic_load_explicit(gen, memory_order_acquire) != old
              : atomic_load_explicit(cnt, memory_order_acquire) == 0)
        return 1;
      cpu_relax();
    }
    if (tdm_time_now() > end) return 0;
  }
}

static void *worker_main(void *arg) {
  int64_t id = (int64_t)(intptr_t)arg; /* 1..n_workers */
  pthread_mutex_lock(&pool.mu);
  /* Jobs dispatched before this worker existed are not its own; jobs dispatched after it was
   * created but before it got here are. */
  uint64_t seen = pool.born;
  for (;;) {
    if (atomic_load_explicit(&pool.generation, memory_order_relaxed) == seen) {
      pthread_mutex_unlock(&pool.mu);
      int moved = spin_until(&pool.generation, seen, NULL);
      pthread_mutex_lock(&pool.mu);
      if (!moved)
        while (!pool.stop && atomic_load_explicit(&pool.generation, memory_order_relaxed) == seen)
          pthread_cond_wait(&pool.wake, &pool.mu);
    }
    if (pool.stop) break;
    /* the job as one snapshot under mu: a worker outside the last job's ranges may be late, and
     * the caller may already be writing the next one */
    seen = atomic_load_explicit(&pool.generation, memory_order_relaxed);
    tdm_range_fn fn = pool.fn;
    void *ctx = pool.ctx;
    int64_t n = pool.n, ranges = pool.n_ranges;
    if (id >= ranges) continue;
    pthread_mutex_unlock(&pool.mu);
    int64_t b, e;
    range_of(n, ranges, id, &b, &e);
    in_range = 1;
    fn(ctx, b, e);
    in_range = 0;
    int last = atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1;
    pthread_mutex_lock(&pool.mu);
    if (last) pthread_cond_signal(&pool.done); /* the caller may be asleep: it checks pending under mu */
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

/* This node's cores minus threads x its ranks (LOCAL_WORLD_SIZE or the launcher's equivalent
 * when set, else ranks): > 0 when threads would be short of cores, < 0 when one is left over. */
static long cores_short(int threads, int ranks) {
  tdm_launch_env e; /* the launcher's ranks on this node, whichever launcher it is */
  long cores = sysconf(_SC_NPROCESSORS_ONLN), local = tdm_launch_env_read(&e) == TDM_OK && e.local_size > 0 ? e.local_size
                                                                                                          : (ranks > 0 ? ranks : 1);
  return (long)threads * local - cores;
}

static void pool_stop(void) {
  if (!pool.n_workers) return;
  pthread_mutex_lock(&pool.mu);
  pool.stop = 1;
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 0; i < pool.n_workers; i++) pthread_join(pool.workers[i], NULL);
  tdm__free(pool.workers);
  pool.workers = NULL;
  pool.n_workers = 0;
  pool.stop = 0;
}

tdm_status tdm_set_num_threads(int n) {
  if (n < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "set_num_threads: %d threads; expected >= 0", n);
  if (n == 0) {
    const char *e = getenv("TANDEM_NUM_THREADS");
    if (e && *e) { /* strictly: "2x" or "1e3" silently meant another count */
      char *end = NULL;
      long v = strtol(e, &end, 10);
      if (end == e || *end || v < 0 || v > 256)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "set_num_threads: TANDEM_NUM_THREADS='%s'; expected a whole number of threads, 0..256 (0: the default)", e);
      n = (int)v;
    }
    if (n <= 0) n = tdm_launch_default_threads(); /* this node's cores divided among its ranks */
  }
  if (n > 256) return tdm__set_error(TDM_ERR_INVALID_ARG, "set_num_threads: %d threads; expected <= 256", n);
  const char *sp = getenv("TANDEM_SPIN_US");
  char *end = NULL;
  double us = sp ? strtod(sp, &end) : 50.0;
  if (sp && (end == sp || *end || !(us >= 0 && us <= 1e6)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "set_num_threads: TANDEM_SPIN_US='%s'; expected microseconds in [0, 1e6]", sp);
  tdm__blas_single_thread();
  if (n == pool.n_threads && pool.n_workers == n - 1) return TDM_OK;
  pool_stop();
  pool.n_threads = 1;
  /* spin only where every thread of every rank of this node has a core of its own */
  pool.spin_s = n > 1 && cores_short(n, 1) <= 0 && us > 0 ? us * 1e-6 : 0.0;
  if (n > 1) {
    pool.born = pool.generation;
    pool.workers = tdm__calloc((size_t)n - 1, sizeof(pthread_t));
    if (!pool.workers) return tdm__set_error(TDM_ERR_NO_MEMORY, "set_num_threads: out of memory");
    for (int i = 0; i < n - 1; i++) {
      if (pthread_create(&pool.workers[i], NULL, worker_main, (void *)(intptr_t)(i + 1)) != 0) {
        pool.n_workers = i;
        pool_stop();
        return tdm__set_error(TDM_ERR_SYSTEM, "set_num_threads: cannot start thread %d", i + 1);
      }
      pool.n_workers = i + 1;
    }
  }
  pool.n_threads = n;
  return TDM_OK;
}

int tdm_get_num_threads(void) { return pool.n_threads; }

int tdm_spare_core(int ranks) { return cores_short(pool.n_threads, ranks) < 0; }

void tdm_parallel_for(int64_t n, int64_t min_chunk, tdm_range_fn fn, void *ctx) {
  if (n <= 0) return;
  TDM__NONNULL(fn, , "tdm_parallel_for: the function fn is NULL");
  if (min_chunk < 1) min_chunk = 1;
  int64_t ranges = n / min_chunk;
  if (ranges > pool.n_threads) ranges = pool.n_threads;
  if (ranges <= 1 || in_range) {
    fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&pool.mu);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.n = n;
  pool.n_ranges = ranges;
  atomic_store_explicit(&pool.pending, (int)ranges - 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  int64_t b, e;
  range_of(n, ranges, 0, &b, &e);
  in_range = 1;
  fn(ctx, b, e);
  in_range = 0;
  if (!spin_until(NULL, 0, &pool.pending)) {
    pthread_mutex_lock(&pool.mu);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
  }
}
