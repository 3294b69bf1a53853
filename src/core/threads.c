/* The intra-op pool: persistent workers woken per parallel_for. The caller runs range 0 itself,
 * so a pool of n threads has n-1 workers. Small loops (n < 2 * min_chunk) never wake anyone, and
 * a parallel_for inside a range runs serially on its thread.
 *
 * OpenBLAS is kept at one thread: tdm_k_gemm splits large products over this pool instead. Two
 * pools on the same cores fight (OpenBLAS's idle threads spin in sched_yield while ours work),
 * and one pool lets small GEMMs (attention heads) run side by side. */
#include <pthread.h>
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
  uint64_t generation;
  uint64_t born;  /* the generation when the current workers were created */
  int pending;    /* ranges not yet finished in this generation */
  int stop;
  /* the current job */
  tdm_range_fn fn;
  void *ctx;
  int64_t n, n_ranges;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          NULL, 1, 0, 0, 0, 0, 0, NULL, NULL, 0, 0};

static _Thread_local int in_range; /* this thread is running a range of a parallel_for */

static void range_of(int64_t i, int64_t *b, int64_t *e) {
  *b = pool.n * i / pool.n_ranges;
  *e = pool.n * (i + 1) / pool.n_ranges;
}

static void *worker_main(void *arg) {
  int64_t id = (int64_t)(intptr_t)arg; /* 1..n_workers */
  pthread_mutex_lock(&pool.mu);
  /* Jobs dispatched before this worker existed are not its own; jobs dispatched after it was
   * created but before it got here are. */
  uint64_t seen = pool.born;
  for (;;) {
    while (!pool.stop && pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.mu);
    if (pool.stop) break;
    seen = pool.generation;
    if (id >= pool.n_ranges) continue;
    pthread_mutex_unlock(&pool.mu);
    int64_t b, e;
    range_of(id, &b, &e);
    in_range = 1;
    pool.fn(pool.ctx, b, e);
    in_range = 0;
    pthread_mutex_lock(&pool.mu);
    if (--pool.pending == 0) pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
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
    n = e ? atoi(e) : 0;
    if (n <= 0) n = tdm_launch_default_threads(); /* this node's cores divided among its ranks */
  }
  if (n > 256) return tdm__set_error(TDM_ERR_INVALID_ARG, "set_num_threads: %d threads; expected <= 256", n);
  tdm__blas_single_thread();
  if (n == pool.n_threads && pool.n_workers == n - 1) return TDM_OK;
  pool_stop();
  pool.n_threads = 1;
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

int tdm_spare_core(int ranks) {
  tdm_launch_env e; /* the launcher's ranks on this node, whichever launcher it is */
  long cores = sysconf(_SC_NPROCESSORS_ONLN), local = tdm_launch_env_read(&e) == TDM_OK && e.local_size > 0 ? e.local_size
                                                                                                          : (ranks > 0 ? ranks : 1);
  return cores > (long)pool.n_threads * local;
}

void tdm_parallel_for(int64_t n, int64_t min_chunk, tdm_range_fn fn, void *ctx) {
  if (n <= 0) return;
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
  pool.pending = (int)ranges - 1;
  pool.generation++;
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  int64_t b, e;
  range_of(0, &b, &e);
  in_range = 1;
  fn(ctx, b, e);
  in_range = 0;
  pthread_mutex_lock(&pool.mu);
  while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
}
