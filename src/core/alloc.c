#include <stdatomic.h>
#include <stdlib.h>

#include "core/internal.h"

static atomic_uint_fast64_t n_mallocs;

void *tdm__malloc(size_t n) {
  atomic_fetch_add_explicit(&n_mallocs, 1, memory_order_relaxed);
  return malloc(n ? n : 1);
}

void *tdm__calloc(size_t n, size_t size) {
  atomic_fetch_add_explicit(&n_mallocs, 1, memory_order_relaxed);
  return calloc(n ? n : 1, size ? size : 1);
}

void *tdm__aligned_alloc(size_t n) {
  atomic_fetch_add_explicit(&n_mallocs, 1, memory_order_relaxed);
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
  return p;
}

void tdm__free(void *p) { free(p); }

uint64_t tdm__malloc_count(void) { return atomic_load(&n_mallocs); }

uint64_t tdm_alloc_count(void) { return tdm__malloc_count(); }
