/* tandem — core services: logging, time, random numbers, arenas, the intra-op thread pool.
 *
 *   tdm_set_num_threads(0);              // 0 = all cores (or TANDEM_NUM_THREADS)
 *   tdm_rng r; tdm_rng_seed(&r, 42);
 *   float u = tdm_rng_uniform(&r);       // [0, 1)
 *   tdm_arena *a; tdm_arena_create(&a, 1 << 20);
 *   float *x = tdm_arena_alloc(a, 1000 * sizeof(float));
 *   tdm_arena_reset(a);                  // everything from a is gone; memory is kept
 *
 * A NULL generator, arena, timings or function sets TDM_ERR_INVALID_ARG in tdm_last_error() and
 * does nothing: getters then return 0, tdm_arena_alloc NULL, tdm_rng_uniform/_normal and tdm_median NAN.
 */
#ifndef TANDEM_CORE_H
#define TANDEM_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- logging --------------------------------------------------------------------------- */
typedef enum { TDM_LOG_ERROR = 0, TDM_LOG_WARN, TDM_LOG_INFO, TDM_LOG_DEBUG } tdm_log_level;
/* Messages at or below the level go to stderr. Default WARN, or TANDEM_LOG=error|warn|info|debug. */
void tdm_log_set_level(tdm_log_level level);
tdm_log_level tdm_log_get_level(void);
void tdm_log(tdm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- time ------------------------------------------------------------------------------ */
/* Monotonic clock in seconds. Thread-safe. */
double tdm_time_now(void);
/* The median of n timings (the mean of the middle two when n is even; 0 when n is 0): sorts v in
 * place. The benchmarks' and the calibration's statistic: one burst of other work on a shared
 * machine moves a mean of a few iterations 2-4x and a median not at all. Thread-safe on distinct v. */
double tdm_median(double *v, size_t n);

/* ---- random numbers ---------------------------------------------------------------------
 * xoshiro256** seeded through splitmix64: fast, reproducible across platforms. A tdm_rng is a
 * plain value; not thread-safe (give each thread its own). */
typedef struct tdm_rng {
  uint64_t s[4];
} tdm_rng;
void tdm_rng_seed(tdm_rng *r, uint64_t seed);
uint64_t tdm_rng_next(tdm_rng *r);
float tdm_rng_uniform(tdm_rng *r);            /* [0, 1) with 24 random bits */
float tdm_rng_normal(tdm_rng *r);             /* N(0, 1), Box-Muller */
/* Counter-based hash: the same (key, counter) always gives the same bits. Used where a random
 * value must depend only on its position (dropout masks), not on how work is split. */
uint64_t tdm_hash64(uint64_t key, uint64_t counter);

/* ---- arenas ------------------------------------------------------------------------------
 * A bump allocator. Allocations are 64-byte aligned and live until the next reset. Reset keeps
 * one block as large as the peak use so far, so a loop that allocates the same each iteration
 * calls malloc only in its first iterations. Not thread-safe. */
typedef struct tdm_arena tdm_arena;
tdm_status tdm_arena_create(tdm_arena **out, size_t initial_bytes);
void tdm_arena_destroy(tdm_arena *a);
/* NULL when out of memory (and the thread's error detail is set). */
void *tdm_arena_alloc(tdm_arena *a, size_t bytes);
void tdm_arena_reset(tdm_arena *a);
size_t tdm_arena_used(const tdm_arena *a);
size_t tdm_arena_peak(const tdm_arena *a);
/* How many times this arena has called malloc: steady-state loops keep it constant. */
uint64_t tdm_arena_mallocs(const tdm_arena *a);

/* Heap allocations the library has made so far (all threads): a steady-state training step
 * leaves it unchanged, which benchmarks and tests check. */
uint64_t tdm_alloc_count(void);

/* ---- memory by category -------------------------------------------------------------------
 * Every allocation the library makes is counted under one category, so the memory planner
 * (tandem plan) can be checked against what a run really holds. Activations count the bytes in
 * use in the tapes' arenas (not the arena blocks' slack); parameters and gradients that live in
 * reserved address space (ZeRO stage 3) count the pages they hold. Thread-safe. */
typedef enum {
  TDM_MEM_PARAMS = 0,  /* model parameters (fp32 master copy and gathered units) */
  TDM_MEM_GRADS,       /* parameter gradients */
  TDM_MEM_OPTIM,       /* optimizer state (momentum, Adam moments) */
  TDM_MEM_ACTIVATIONS, /* forward activations and their gradients (the tape) */
  TDM_MEM_COMM,        /* communication buffers (buckets, scratch, transport rings) */
  TDM_MEM_DATA,        /* data sets and batches */
  TDM_MEM_WORKSPACE,   /* everything else */
  TDM_MEM_COUNT
} tdm_mem_category;
const char *tdm_mem_category_name(tdm_mem_category c);
typedef struct tdm_mem_stats {
  int64_t current[TDM_MEM_COUNT], peak[TDM_MEM_COUNT]; /* bytes */
  int64_t current_total, peak_total;                   /* peak_total: the peak of the sum */
} tdm_mem_stats;
void tdm_mem_stats_get(tdm_mem_stats *out);
/* Starts a new measurement: every peak becomes the current value. */
void tdm_mem_peak_reset(void);

/* ---- intra-op threads ------------------------------------------------------------------
 * One process-wide pool runs the element-wise kernels and splits large products; OpenBLAS runs
 * single-threaded inside it.
 * tdm_set_num_threads(0) picks TANDEM_NUM_THREADS if set, otherwise all online cores.
 * Not thread-safe with respect to concurrent kernels: call it between steps. */
tdm_status tdm_set_num_threads(int n);
int tdm_get_num_threads(void);
/* 1 if a core is left over after every rank on this node runs tdm_get_num_threads() threads:
 * LOCAL_WORLD_SIZE ranks when set, else ranks (what helper threads, prefetch and communication,
 * need to run beside compute rather than take turns with it). */
int tdm_spare_core(int ranks);
/* The OpenBLAS kernels this process runs ("Cooperlake", "Haswell", ...): chosen by OpenBLAS
 * when it loads, from the processor or OPENBLAS_CORETYPE. Thread-safe; the string is static. */
const char *tdm_blas_core(void);
/* One core's FMA peak in GFLOP/s, measured once per process (independent 256- and 512-bit FMAs,
 * about 0.1 s); 0 where it cannot be measured (not x86-64). Not thread-safe on the first call. */
double tdm_fma_peak_gflops(void);

/* Runs fn(ctx, begin, end) over [0, n) split into at most num_threads contiguous ranges, each
 * at least min_chunk long. Returns when all ranges are done. Must not be called from inside fn. */
typedef void (*tdm_range_fn)(void *ctx, int64_t begin, int64_t end);
void tdm_parallel_for(int64_t n, int64_t min_chunk, tdm_range_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
