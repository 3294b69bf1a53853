/* Internal helpers shared by the library's files: error setting, invariants, counted malloc. */
#ifndef TANDEM_CORE_INTERNAL_H
#define TANDEM_CORE_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>

#include "tandem/core.h"
#include "tandem/status.h"

/* Sets the calling thread's error detail and returns st, so: return tdm__set_error(...). */
tdm_status tdm__set_error(tdm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Marks the error just set as relaying rank's failure (tdm_last_error_origin) and returns st:
 * return tdm__error_from(peer, tdm__set_error(...)). rank < 0: leaves the error this process's own. */
tdm_status tdm__error_from(int rank, tdm_status st);
/* FNV-1a of a NUL-terminated string: equal strings hash alike on every rank and run. */
uint64_t tdm__hash_str(const char *s);

_Noreturn void tdm__assert_fail(const char *expr, const char *file, int line);
/* Always on: for invariants of our own code, never for checking the caller's input. */
#define TDM_ASSERT(x) ((x) ? (void)0 : tdm__assert_fail(#x, __FILE__, __LINE__))

/* OpenBLAS at one thread (blas_config.c: the file that also chooses its kernels). */
void tdm__blas_single_thread(void);

/* Allocation through these is counted, so tests can prove a steady-state step allocates nothing. */
void *tdm__malloc(size_t n);
void *tdm__calloc(size_t n, size_t size);
void *tdm__aligned_alloc(size_t n); /* 64-byte aligned, free with tdm__free */
/* Resizes a block from tdm__malloc / calloc (not aligned_alloc: NULL), keeping its category; on
 * failure NULL and p untouched, as realloc. */
void *tdm__realloc(void *p, size_t n);
void tdm__free(void *p);
/* The same, counted under category c instead of the calling thread's current one. */
void *tdm__malloc_cat(size_t n, tdm_mem_category c);
void *tdm__aligned_alloc_cat(size_t n, tdm_mem_category c);
/* Sets the calling thread's category for tdm__malloc / calloc / aligned_alloc (default:
 * workspace) and returns the previous one, to restore it: a scope. */
tdm_mem_category tdm__mem_scope(tdm_mem_category c);
/* Counts memory not allocated through these (mapped pages, arena bytes in use). */
void tdm__mem_account(tdm_mem_category c, int64_t delta);
/* An arena that counts its bytes in use under usage_cat (the tape: activations) and its blocks
 * not at all; TDM_MEM_COUNT: the blocks are counted as allocated, as tdm_arena_create does. */
tdm_status tdm__arena_create_cat(tdm_arena **out, size_t initial_bytes, tdm_mem_category usage_cat);
uint64_t tdm__malloc_count(void);
/* A position in an arena, and a rewind to it: everything allocated since is given back at once
 * (transient scratch of one op, a recomputed block). Blocks made since are freed; the peak keeps
 * the high-water mark, so after the next reset one block holds it all and no malloc recurs. */
typedef struct {
  void *block;
  size_t used, used_total;
} tdm__arena_pos;
tdm__arena_pos tdm__arena_mark(const tdm_arena *a);
void tdm__arena_rewind(tdm_arena *a, tdm__arena_pos pos);

#define TDM__TRY(expr)                   \
  do {                                   \
    tdm_status tdm__st = (expr);         \
    if (tdm__st != TDM_OK) return tdm__st; \
  } while (0)

/* A public function given a NULL handle or pointer p: sets TDM_ERR_INVALID_ARG with msg (a literal naming the function
 * and the argument) and returns ret, the function's documented sentinel; ret is empty in a void function. */
#define TDM__NONNULL(p, ret, msg)                     \
  do {                                                \
    if (!(p)) {                                       \
      tdm__set_error(TDM_ERR_INVALID_ARG, "%s", msg); \
      return ret;                                     \
    }                                                 \
  } while (0)

#endif
