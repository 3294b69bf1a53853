/* The tensor struct, shared by the library's own files (users see an opaque handle). */
#ifndef TANDEM_TENSOR_IMPL_H
#define TANDEM_TENSOR_IMPL_H

#include "tandem/autograd.h"
#include "tandem/tensor.h"

struct tdm_node;
struct tdm_tape;

enum {
  TDM_TF_REQUIRES_GRAD = 1u << 0,
  TDM_TF_PARAM = 1u << 1,      /* a model parameter; its grad is a view of the grad buffer */
  TDM_TF_OWNS_DATA = 1u << 2,  /* data came from tdm__aligned_alloc */
  TDM_TF_HEAP = 1u << 3,       /* the struct itself came from the heap */
};

typedef void (*tdm__grad_hook)(void *ctx, tdm_tensor *param);

struct tdm_tensor {
  tdm_dtype dtype;
  int ndim;
  int64_t shape[TDM_MAX_DIMS];
  int64_t stride[TDM_MAX_DIMS];
  int64_t numel;
  void *data;
  tdm_tensor *grad;
  struct tdm_node *node;  /* the tape node that produced this tensor, NULL for leaves */
  uint32_t flags;
  uint64_t tape_epoch;    /* leaves: the tape epoch in which first_use was set */
  int32_t first_use;      /* leaves: index of the first node that read this in that epoch */
  tdm__grad_hook hook;    /* leaves: fires when the gradient is final in backward */
  void *hook_ctx;
  tdm_fetch_hook_fn fetch; /* parameters: runs before their values are read (ZeRO stage 3) */
  void *fetch_ctx;
  tdm_grad_range_hook_fn range_hook; /* leaves: part of the gradient is final (ZeRO stage 3) */
  void *range_ctx;
  struct tdm_tensor *alias; /* views: the parameter whose memory this one shares, if any */
  const char *name;
};

static inline int tdm__requires_grad(const tdm_tensor *t) {
  return t && (t->flags & TDM_TF_REQUIRES_GRAD);
}

/* The parameter whose memory t is or shares, when it has a fetch hook; else NULL. */
static inline tdm_tensor *tdm__fetchable(tdm_tensor *t) {
  tdm_tensor *p = t->alias ? t->alias : t;
  return p->fetch ? p : NULL;
}

/* The element count of a shape of non-negative dimensions, in *numel; 0, or -1 when the count, or
 * the count times elem bytes, passes INT64_MAX (a size that would wrap into a small allocation). */
int tdm__shape_numel(int ndim, const int64_t *shape, size_t elem, int64_t *numel);

/* Fills shape/stride/numel for a contiguous layout. */
void tdm__tensor_init(tdm_tensor *t, tdm_dtype dt, int ndim, const int64_t *shape);
int tdm__shape_equal(const tdm_tensor *a, const tdm_tensor *b);

#endif
