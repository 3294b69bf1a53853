/* The parameter store: one data buffer, one gradient buffer, a view per parameter. */
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tandem/nn.h"
#include "tensor/tensor_impl.h"

typedef struct {
  tdm_tensor t, g; /* the parameter view and its gradient view */
  char *name;
  tdm_init init;
  int decay;
  int64_t offset;
} entry;

struct tdm_params {
  entry **e; /* stable addresses: tensors handed out at declare time must not move */
  int n, cap;
  int64_t numel;
  float *data, *grad;
  int grad_external; /* grad is the caller's (tdm_params_set_grad_buffer) */
  int finalized;
};

tdm_status tdm_params_create(tdm_params **out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "params_create: out is NULL");
  *out = tdm__calloc(1, sizeof **out);
  return *out ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "params_create: out of memory");
}

void tdm_params_destroy(tdm_params *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) {
    tdm__free(p->e[i]->name);
    tdm__free(p->e[i]);
  }
  tdm__free(p->e);
  tdm__free(p->data);
  if (!p->grad_external) tdm__free(p->grad);
  tdm__free(p);
}

tdm_status tdm_params_declare(tdm_params *p, const char *name, int ndim, const int64_t *shape, tdm_init init,
                              int decay, tdm_tensor **out) {
  if (!p || !name || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: NULL argument");
  if (p->finalized)
    return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_declare: '%s' declared after finalize", name);
  if (ndim < 1 || ndim > TDM_MAX_DIMS)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s' has %d dimensions; expected 1..%d", name, ndim,
                          TDM_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] <= 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s' dimension %d is %lld; expected > 0", name, i,
                            (long long)shape[i]);
  if (tdm_params_find(p, name))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s' is declared twice", name);
  if (p->n == p->cap) {
    int nc = p->cap ? 2 * p->cap : 16;
    entry **ne = tdm__malloc(sizeof(entry *) * (size_t)nc);
    if (!ne) return tdm__set_error(TDM_ERR_NO_MEMORY, "params_declare: out of memory");
    if (p->e) memcpy(ne, p->e, sizeof(entry *) * (size_t)p->n);
    tdm__free(p->e);
    p->e = ne;
    p->cap = nc;
  }
  entry *e = tdm__calloc(1, sizeof *e);
  char *nm = tdm__malloc(strlen(name) + 1);
  if (!e || !nm) {
    tdm__free(e);
    tdm__free(nm);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "params_declare: out of memory");
  }
  strcpy(nm, name);
  e->name = nm;
  e->init = init;
  e->decay = decay;
  tdm__tensor_init(&e->t, TDM_F32, ndim, shape);
  tdm__tensor_init(&e->g, TDM_F32, ndim, shape);
  e->t.flags = TDM_TF_PARAM | TDM_TF_REQUIRES_GRAD;
  e->t.name = e->name;
  e->g.name = e->name;
  e->offset = p->numel;
  p->numel += e->t.numel;
  p->e[p->n++] = e;
  *out = &e->t;
  return TDM_OK;
}

tdm_status tdm_params_finalize(tdm_params *p, uint64_t seed) {
  if (p->finalized) return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_finalize: called twice");
  size_t bytes = sizeof(float) * (size_t)(p->numel ? p->numel : 1);
  p->data = tdm__aligned_alloc(bytes);
  p->grad = tdm__aligned_alloc(bytes);
  if (!p->data || !p->grad)
    return tdm__set_error(TDM_ERR_NO_MEMORY, "params_finalize: cannot allocate 2 x %zu bytes", bytes);
  memset(p->grad, 0, bytes);
  for (int i = 0; i < p->n; i++) {
    entry *e = p->e[i];
    float *d = p->data + e->offset;
    e->t.data = d;
    e->g.data = p->grad + e->offset;
    e->t.grad = &e->g;
    tdm_rng r;
    tdm_rng_seed(&r, tdm_hash64(seed, (uint64_t)i));
    for (int64_t k = 0; k < e->t.numel; k++) {
      switch (e->init.kind) {
      case TDM_INIT_ZEROS: d[k] = 0.0f; break;
      case TDM_INIT_ONES: d[k] = 1.0f; break;
      case TDM_INIT_UNIFORM: d[k] = e->init.a + (e->init.b - e->init.a) * tdm_rng_uniform(&r); break;
      case TDM_INIT_NORMAL: d[k] = e->init.a + e->init.b * tdm_rng_normal(&r); break;
      }
    }
  }
  p->finalized = 1;
  return TDM_OK;
}

int tdm_params_count(const tdm_params *p) { return p->n; }
tdm_tensor *tdm_params_get(const tdm_params *p, int i) { return (i >= 0 && i < p->n) ? &p->e[i]->t : NULL; }
int64_t tdm_params_offset(const tdm_params *p, int i) { return p->e[i]->offset; }
int tdm_params_decay(const tdm_params *p, int i) { return p->e[i]->decay; }
int64_t tdm_params_numel(const tdm_params *p) { return p->numel; }
float *tdm_params_data(const tdm_params *p) { return p->data; }
float *tdm_params_grad(const tdm_params *p) { return p->grad; }

tdm_status tdm_params_set_grad_buffer(tdm_params *p, float *buf) {
  if (!p || !p->finalized) return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_set_grad_buffer: parameters not finalized");
  if (buf && buf == p->grad) return TDM_OK;
  float *nb = buf;
  if (!nb && !(nb = tdm__aligned_alloc(sizeof(float) * (size_t)(p->numel ? p->numel : 1))))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "params_set_grad_buffer: out of memory");
  if (nb != p->grad) memcpy(nb, p->grad, sizeof(float) * (size_t)p->numel);
  if (!p->grad_external) tdm__free(p->grad);
  p->grad = nb;
  p->grad_external = buf != NULL;
  for (int i = 0; i < p->n; i++) p->e[i]->g.data = p->grad + p->e[i]->offset;
  return TDM_OK;
}

tdm_tensor *tdm_params_find(const tdm_params *p, const char *name) {
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->e[i]->name, name)) return &p->e[i]->t;
  return NULL;
}

void tdm_params_zero_grad(tdm_params *p) {
  if (p->grad) tdm_k_zero(p->grad, p->numel);
}
