#include <string.h>

#include "core/internal.h"

typedef struct block {
  struct block *next;
  size_t size, used;
  unsigned char *data;
} block;

struct tdm_arena {
  block *head; /* current block; older blocks follow */
  size_t used_total, peak, initial;
  uint64_t mallocs;
  int usage_cat; /* TDM_MEM_COUNT: blocks are counted as allocated; else bytes in use, under it */
};

static block *block_new(tdm_arena *a, size_t size) {
  block *b = tdm__malloc(sizeof *b);
  if (!b) return NULL;
  /* an arena that reports its bytes in use does not count its blocks as well */
  b->data = a->usage_cat < TDM_MEM_COUNT ? tdm__aligned_alloc_cat(size, TDM_MEM_COUNT) : tdm__aligned_alloc(size);
  if (!b->data) {
    tdm__free(b);
    return NULL;
  }
  b->size = size;
  b->used = 0;
  b->next = NULL;
  a->mallocs++;
  return b;
}

tdm_status tdm_arena_create(tdm_arena **out, size_t initial_bytes) {
  return tdm__arena_create_cat(out, initial_bytes, TDM_MEM_COUNT);
}

tdm_status tdm__arena_create_cat(tdm_arena **out, size_t initial_bytes, tdm_mem_category usage_cat) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "arena_create: out is NULL");
  tdm_arena *a = tdm__calloc(1, sizeof *a);
  if (!a) return tdm__set_error(TDM_ERR_NO_MEMORY, "arena_create: out of memory");
  a->initial = initial_bytes < 4096 ? 4096 : initial_bytes;
  a->usage_cat = (int)usage_cat;
  a->head = block_new(a, a->initial);
  if (!a->head) {
    tdm__free(a);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "arena_create: cannot allocate %zu bytes", initial_bytes);
  }
  *out = a;
  return TDM_OK;
}

void tdm_arena_destroy(tdm_arena *a) {
  if (!a) return;
  tdm__mem_account((tdm_mem_category)a->usage_cat, -(int64_t)a->used_total);
  for (block *b = a->head, *n; b; b = n) {
    n = b->next;
    tdm__free(b->data);
    tdm__free(b);
  }
  tdm__free(a);
}

void *tdm_arena_alloc(tdm_arena *a, size_t bytes) {
  TDM__NONNULL(a, NULL, "tdm_arena_alloc: the arena is NULL");
  if (bytes > ((size_t)1 << 62)) { /* rounded up it would wrap to a 64-byte block */
    tdm__set_error(TDM_ERR_NO_MEMORY, "arena: cannot allocate %zu bytes", bytes);
    return NULL;
  }
  size_t need = (bytes + 63) & ~(size_t)63;
  if (need == 0) need = 64;
  block *b = a->head;
  if (b->used + need > b->size) {
    size_t size = b->size * 2;
    if (size < need) size = need;
    block *nb = block_new(a, size);
    if (!nb) {
      tdm__set_error(TDM_ERR_NO_MEMORY, "arena: cannot allocate %zu bytes", size);
      return NULL;
    }
    nb->next = b;
    a->head = b = nb;
  }
  void *p = b->data + b->used;
  b->used += need;
  a->used_total += need;
  tdm__mem_account((tdm_mem_category)a->usage_cat, (int64_t)need);
  if (a->used_total > a->peak) a->peak = a->used_total;
  return p;
}

void tdm_arena_reset(tdm_arena *a) {
  TDM__NONNULL(a, , "tdm_arena_reset: the arena is NULL");
  if (a->head->next) {
    /* Several blocks: replace them with one that holds the peak, so the next round fits. */
    for (block *b = a->head, *n; b; b = n) {
      n = b->next;
      tdm__free(b->data);
      tdm__free(b);
    }
    size_t size = a->peak > a->initial ? a->peak : a->initial;
    a->head = block_new(a, size);
    if (!a->head) a->head = block_new(a, a->initial); /* TDM_ASSERT below if even that fails */
    TDM_ASSERT(a->head != NULL);
  }
  a->head->used = 0;
  tdm__mem_account((tdm_mem_category)a->usage_cat, -(int64_t)a->used_total);
  a->used_total = 0;
}

tdm__arena_pos tdm__arena_mark(const tdm_arena *a) {
  tdm__arena_pos p = {a->head, a->head->used, a->used_total};
  return p;
}

void tdm__arena_rewind(tdm_arena *a, tdm__arena_pos pos) {
  while (a->head != pos.block) { /* blocks made after the mark */
    block *b = a->head;
    TDM_ASSERT(b->next != NULL);
    a->head = b->next;
    tdm__free(b->data);
    tdm__free(b);
  }
  a->head->used = pos.used;
  TDM_ASSERT(a->used_total >= pos.used_total);
  tdm__mem_account((tdm_mem_category)a->usage_cat, -(int64_t)(a->used_total - pos.used_total));
  a->used_total = pos.used_total;
}

size_t tdm_arena_used(const tdm_arena *a) {
  TDM__NONNULL(a, 0, "tdm_arena_used: the arena is NULL");
  return a->used_total;
}
size_t tdm_arena_peak(const tdm_arena *a) {
  TDM__NONNULL(a, 0, "tdm_arena_peak: the arena is NULL");
  return a->peak;
}
uint64_t tdm_arena_mallocs(const tdm_arena *a) {
  TDM__NONNULL(a, 0, "tdm_arena_mallocs: the arena is NULL");
  return a->mallocs;
}
