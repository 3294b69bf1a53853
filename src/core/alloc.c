/* Counted, categorised heap allocation.
 *
 * Every block carries a 16-byte header just before the pointer handed out: its size, its memory
 * category and how far the real start of the block lies before it (aligned blocks pad more).
 * The per-category byte counts then follow every allocation and free exactly, which is what the
 * memory planner is checked against (include/tandem/core.h, tdm_mem_stats). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/internal.h"

static atomic_uint_fast64_t n_mallocs;

#define HUGE_BLOCK ((size_t)8 << 20) /* aligned blocks from this size ask for huge pages */
#define HUGE_PAGE ((size_t)2 << 20)  /* an x86-64 transparent huge page */

typedef struct {
  uint64_t size;
  uint32_t cat, pad; /* pad: bytes from the block's start to the pointer handed out */
} hdr;
_Static_assert(sizeof(hdr) == 16, "the allocation header is 16 bytes");

static const char *cat_names[] = {"parameters", "gradients", "optimizer", "activations", "communication", "data",
                                  "workspace"};
_Static_assert(sizeof cat_names / sizeof cat_names[0] == TDM_MEM_COUNT, "one name per memory category");

static _Atomic int64_t cur[TDM_MEM_COUNT], peak[TDM_MEM_COUNT];
static _Atomic int64_t cur_total, peak_total;
static _Thread_local int scope_cat = TDM_MEM_WORKSPACE;

const char *tdm_mem_category_name(tdm_mem_category c) {
  return (unsigned)c < TDM_MEM_COUNT ? cat_names[c] : "?";
}

static void raise_peak(_Atomic int64_t *pk, int64_t v) {
  int64_t p = atomic_load_explicit(pk, memory_order_relaxed);
  while (v > p && !atomic_compare_exchange_weak_explicit(pk, &p, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void tdm__mem_account(tdm_mem_category c, int64_t delta) {
  if ((unsigned)c >= TDM_MEM_COUNT || delta == 0) return;
  int64_t v = atomic_fetch_add_explicit(&cur[c], delta, memory_order_relaxed) + delta;
  int64_t t = atomic_fetch_add_explicit(&cur_total, delta, memory_order_relaxed) + delta;
  if (delta > 0) {
    raise_peak(&peak[c], v);
    raise_peak(&peak_total, t);
  }
}

tdm_mem_category tdm__mem_scope(tdm_mem_category c) {
  int old = scope_cat;
  if ((unsigned)c < TDM_MEM_COUNT) scope_cat = (int)c;
  return (tdm_mem_category)old;
}

static void *finish(unsigned char *block, size_t pad, size_t n, tdm_mem_category c) {
  if (!block) return NULL;
  atomic_fetch_add_explicit(&n_mallocs, 1, memory_order_relaxed);
  hdr *h = (hdr *)(block + pad) - 1;
  h->size = n;
  h->cat = (uint32_t)c;
  h->pad = (uint32_t)pad;
  tdm__mem_account(c, (int64_t)n);
  return block + pad;
}

void *tdm__malloc_cat(size_t n, tdm_mem_category c) {
  if (n > SIZE_MAX - 64) return NULL;
  return finish(malloc(n + sizeof(hdr)), sizeof(hdr), n, c);
}

void *tdm__aligned_alloc_cat(size_t n, tdm_mem_category c) {
  if (n > SIZE_MAX - 128) return NULL;
  void *p = NULL;
  if (posix_memalign(&p, 64, n + 64) != 0) return NULL;
  /* A large block (the tape's arena and workspace: hundreds of MiB for a ResNet batch) asks for
   * transparent huge pages: its first write faults once per 2 MiB, not per 4 KiB page, which on
   * the development VM cost 12-22 us apiece (bench/page_faults.c): the first two training steps
   * of resnet20 took 1.7-2 s each, the third 0.3 s. Where the kernel has no huge pages this does
   * nothing. Not the collectives' scratch: with huge pages the direct all-reduce of 64 MiB at 8
   * ranks took twice as long (its user time 2.6 -> 6.5 s; its slots, 1 MiB apart, likely share
   * cache sets once physically contiguous). */
  if (n >= HUGE_BLOCK) {
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1), /* the whole pages inside */
              hi = ((uintptr_t)p + n + 64) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (hi > lo && c != TDM_MEM_COMM) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
  }
  return finish(p, 64, n, c);
}

void *tdm__malloc(size_t n) { return tdm__malloc_cat(n, (tdm_mem_category)scope_cat); }
void *tdm__aligned_alloc(size_t n) { return tdm__aligned_alloc_cat(n, (tdm_mem_category)scope_cat); }

void *tdm__calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  size_t bytes = n * size;
  void *p = tdm__malloc(bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

void *tdm__realloc(void *p, size_t n) {
  if (!p) return tdm__malloc(n);
  hdr *h = (hdr *)p - 1;
  if (h->pad != sizeof(hdr) || n > SIZE_MAX - 64) return NULL; /* an aligned block cannot move through realloc */
  size_t old = h->size;
  tdm_mem_category c = (tdm_mem_category)h->cat;
  unsigned char *b = realloc((unsigned char *)h, n + sizeof(hdr));
  if (!b) return NULL;
  ((hdr *)b)->size = n;
  atomic_fetch_add_explicit(&n_mallocs, 1, memory_order_relaxed);
  tdm__mem_account(c, (int64_t)n - (int64_t)old);
  return b + sizeof(hdr);
}

void tdm__free(void *p) {
  if (!p) return;
  hdr *h = (hdr *)p - 1;
  tdm__mem_account((tdm_mem_category)h->cat, -(int64_t)h->size);
  free((unsigned char *)p - h->pad);
}

uint64_t tdm__malloc_count(void) { return atomic_load(&n_mallocs); }

uint64_t tdm_alloc_count(void) { return tdm__malloc_count(); }

void tdm_mem_stats_get(tdm_mem_stats *out) {
  if (!out) return;
  for (int c = 0; c < TDM_MEM_COUNT; c++) {
    out->current[c] = atomic_load(&cur[c]);
    out->peak[c] = atomic_load(&peak[c]);
  }
  out->current_total = atomic_load(&cur_total);
  out->peak_total = atomic_load(&peak_total);
}

void tdm_mem_peak_reset(void) {
  for (int c = 0; c < TDM_MEM_COUNT; c++) atomic_store(&peak[c], atomic_load(&cur[c]));
  atomic_store(&peak_total, atomic_load(&cur_total));
}
