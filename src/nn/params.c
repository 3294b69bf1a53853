/* The parameter store: one data buffer, one gradient buffer, a view per parameter. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tandem/nn.h"
#include "nn/params_impl.h"
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
  int reserved;      /* data and grad are reserved address space (mmap), not heap buffers */
  size_t map_bytes;
  uint64_t seed;
  /* the gradient-norm segments (src/optim/optim.c), built at first use */
  int64_t *seg_lo, n_seg;
  double *seg_sums;
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
  tdm__free(p->seg_lo);
  tdm__free(p->seg_sums);
  if (p->reserved & TDM_RESERVE_DATA) {
    if (p->data) munmap(p->data, p->map_bytes);
  } else {
    tdm__free(p->data);
  }
  if (p->reserved & TDM_RESERVE_GRAD) {
    if (p->grad) munmap(p->grad, p->map_bytes);
  } else if (!p->grad_external) {
    tdm__free(p->grad);
  }
  tdm__free(p);
}

tdm_status tdm_params_declare(tdm_params *p, const char *name, int ndim, const int64_t *shape, tdm_init init,
                              int decay, tdm_tensor **out) {
  if (!p || !name || !out)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: %s NULL",
                          !p ? "the parameters p are" : !name ? "the name is" : "out is");
  if (p->finalized)
    return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_declare: '%s' declared after finalize", name);
  if (ndim < 1 || ndim > TDM_MAX_DIMS)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s' has %d dimensions; expected 1..%d", name, ndim,
                          TDM_MAX_DIMS);
  if (!shape) return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s': the shape is NULL", name);
  for (int i = 0; i < ndim; i++)
    if (shape[i] <= 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s' dimension %d is %lld; expected > 0", name, i,
                            (long long)shape[i]);
  if ((unsigned)init.kind > TDM_INIT_NORMAL || !isfinite(init.a) || !isfinite(init.b) ||
      (init.kind == TDM_INIT_UNIFORM && !(init.a <= init.b)) || (init.kind == TDM_INIT_NORMAL && init.b < 0))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s': init kind %d with a %g, b %g; expected zeros, ones, uniform [a, b) "
                          "with a <= b, or normal (mean a, std b >= 0), finite", name, (int)init.kind, (double)init.a, (double)init.b);
  int64_t numel, total;
  if (tdm__shape_numel(ndim, shape, sizeof(float), &numel) || __builtin_add_overflow(p->numel, numel, &total) ||
      __builtin_mul_overflow(total, (int64_t)sizeof(float), &total))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_declare: '%s': the parameters would hold more than 2^63 bytes", name);
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

/* Fills dst[k] with the initial value of parameter i's element `from + k`, k < n: the element
 * stream of a parameter is hash(seed, i), so any range can be produced alone (ZeRO stage 3 ranks
 * initialise only their shard, to the same values). */
static void init_values(const entry *e, uint64_t seed, int i, int64_t from, int64_t n, float *dst) {
  tdm_rng r;
  tdm_rng_seed(&r, tdm_hash64(seed, (uint64_t)i));
  int draws = e->init.kind == TDM_INIT_NORMAL ? 2 : e->init.kind == TDM_INIT_UNIFORM ? 1 : 0;
  for (int64_t k = 0; k < from * draws; k++) tdm_rng_next(&r); /* skip: the same draws, unused */
  for (int64_t k = 0; k < n; k++) {
    switch (e->init.kind) {
    case TDM_INIT_ZEROS: dst[k] = 0.0f; break;
    case TDM_INIT_ONES: dst[k] = 1.0f; break;
    case TDM_INIT_UNIFORM: dst[k] = e->init.a + (e->init.b - e->init.a) * tdm_rng_uniform(&r); break;
    case TDM_INIT_NORMAL: dst[k] = e->init.a + e->init.b * tdm_rng_normal(&r); break;
    }
  }
}

tdm_status tdm_params_init_strided(const tdm_params *p, int i, int64_t first, int64_t len, int64_t stride, int64_t count,
                                   float *dst) {
  if (!p || !dst)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_init_strided: %s is NULL", !p ? "the parameters p" : "dst");
  int64_t numel = p->finalized && i >= 0 && i < p->n ? p->e[i]->t.numel : -1;
  if (numel < 0 || first < 0 || len < 0 || count < 0 || (count > 1 && stride < len) ||
      (count > 0 && first + (count - 1) * stride + len > numel))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_init_strided: parameter %d (%lld elements%s): %lld runs of %lld from "
                          "%lld every %lld", i, (long long)numel, p->finalized ? "" : ", not finalized", (long long)count,
                          (long long)len, (long long)first, (long long)stride);
  const entry *e = p->e[i];
  if (e->init.kind == TDM_INIT_ZEROS || e->init.kind == TDM_INIT_ONES) {
    for (int64_t k = 0; k < count * len; k++) dst[k] = e->init.kind == TDM_INIT_ONES ? 1.0f : 0.0f;
    return TDM_OK;
  }
  /* one pass over the parameter's stream: skip to each run, draw it */
  tdm_rng r;
  tdm_rng_seed(&r, tdm_hash64(p->seed, (uint64_t)i));
  int normal = e->init.kind == TDM_INIT_NORMAL;
  int64_t at = 0;
  for (int64_t k = 0; k < count; k++) {
    for (int64_t s = first + k * stride; at < s; at++) {
      tdm_rng_next(&r);
      if (normal) tdm_rng_next(&r);
    }
    for (int64_t j = 0; j < len; j++, at++)
      dst[k * len + j] = normal ? e->init.a + e->init.b * tdm_rng_normal(&r)
                                : e->init.a + (e->init.b - e->init.a) * tdm_rng_uniform(&r);
  }
  return TDM_OK;
}

static void bind_views(tdm_params *p) {
  for (int i = 0; i < p->n; i++) {
    entry *e = p->e[i];
    e->t.data = p->data + e->offset;
    e->g.data = p->grad + e->offset;
    e->t.grad = &e->g;
  }
}

tdm_status tdm_params_finalize(tdm_params *p, uint64_t seed) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_finalize: the parameters p are NULL");
  if (p->finalized) return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_finalize: called twice");
  size_t bytes = sizeof(float) * (size_t)(p->numel ? p->numel : 1);
  p->data = tdm__aligned_alloc_cat(bytes, TDM_MEM_PARAMS);
  p->grad = tdm__aligned_alloc_cat(bytes, TDM_MEM_GRADS);
  if (!p->data || !p->grad)
    return tdm__set_error(TDM_ERR_NO_MEMORY, "params_finalize: cannot allocate 2 x %zu bytes", bytes);
  memset(p->grad, 0, bytes);
  p->seed = seed;
  bind_views(p);
  for (int i = 0; i < p->n; i++) init_values(p->e[i], seed, i, 0, p->e[i]->t.numel, p->data + p->e[i]->offset);
  p->finalized = 1;
  return TDM_OK;
}

/* The page size pages are given back in: a transparent huge page (2 MiB) where the kernel makes
 * them for regions that ask (transparent_hugepage "always" or "madvise"), else the base page.
 * Why: a reserved buffer's pages are given back after each use (ZeRO stages 2-3) and come back at
 * the next write, one fault per page; on the development VM a 4 KiB fault cost 12-22 us
 * (bench/page_faults.c), most of stage 2-3's step on a small model, a huge page's 0.2 us per
 * 4 KiB. A span smaller than a huge page is zeroed instead, and its pages stay. */
#define HUGE_PAGE ((size_t)2 << 20)
static size_t release_unit(void) {
  static size_t unit;
  if (unit) return unit;
  size_t u = (size_t)sysconf(_SC_PAGESIZE);
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char line[128] = "";
  if (f) {
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
  }
  if (strstr(line, "[always]") || strstr(line, "[madvise]")) u = HUGE_PAGE;
  return unit = u;
}

static float *reserve(size_t bytes) {
  /* address space only: pages come into being when written and go with tdm_params_release;
   * aligned to the release unit, so that its pages are whole huge pages */
  size_t unit = release_unit();
  unsigned char *m = mmap(NULL, bytes + unit, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return NULL;
  uintptr_t a = ((uintptr_t)m + unit - 1) / unit * unit;
  if (a > (uintptr_t)m) munmap(m, a - (uintptr_t)m);
  if ((uintptr_t)m + bytes + unit > a + bytes) munmap((void *)(a + bytes), (uintptr_t)m + bytes + unit - (a + bytes));
  if (unit == HUGE_PAGE) madvise((void *)a, bytes, MADV_HUGEPAGE);
  return (float *)a;
}

tdm_status tdm_params_finalize_reserved(tdm_params *p, uint64_t seed, int which) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_finalize_reserved: the parameters p are NULL");
  if (p->finalized) return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_finalize: called twice");
  if (!(which & TDM_RESERVE_GRAD) || (which & ~(TDM_RESERVE_DATA | TDM_RESERVE_GRAD)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_finalize_reserved: which = %d; expected TDM_RESERVE_GRAD, with or "
                          "without TDM_RESERVE_DATA", which);
  size_t page = (size_t)sysconf(_SC_PAGESIZE), unit = release_unit(), bytes = sizeof(float) * (size_t)(p->numel ? p->numel : 1);
  p->map_bytes = (bytes + unit - 1) / unit * unit; /* whole release units */
  bytes = (bytes + page - 1) / page * page;
  p->reserved = which;
  p->seed = seed;
  p->grad = reserve(p->map_bytes);
  if (which & TDM_RESERVE_DATA) p->data = reserve(p->map_bytes);
  else if ((p->data = tdm__aligned_alloc_cat(bytes, TDM_MEM_PARAMS)))
    for (int i = 0; i < p->n; i++) init_values(p->e[i], seed, i, 0, p->e[i]->t.numel, p->data + p->e[i]->offset);
  if (!p->grad || !p->data)
    return tdm__set_error(TDM_ERR_NO_MEMORY, "params_finalize: cannot reserve 2 x %zu bytes", bytes);
  bind_views(p);
  p->finalized = 1;
  return TDM_OK;
}

int tdm_params_is_reserved(const tdm_params *p) {
  TDM__NONNULL(p, 0, "tdm_params_is_reserved: the parameters p are NULL");
  return p->reserved;
}

tdm_status tdm_params_init_range(const tdm_params *p, int64_t lo, int64_t hi, float *dst) {
  if (!p || (!dst && hi > lo))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_init_range: %s is NULL", !p ? "the parameters p" : "dst");
  if (!p->finalized || lo < 0 || hi < lo || hi > p->numel)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_init_range: [%lld, %lld) of %lld elements%s", (long long)lo,
                          (long long)hi, (long long)p->numel, p->finalized ? "" : " (not finalized)");
  for (int i = 0; i < p->n; i++) {
    const entry *e = p->e[i];
    int64_t b = e->offset > lo ? e->offset : lo, end = e->offset + e->t.numel < hi ? e->offset + e->t.numel : hi;
    if (b < end) init_values(e, p->seed, i, b - e->offset, end - b, dst + (b - lo));
  }
  return TDM_OK;
}

tdm_status tdm_params_release(tdm_params *p, int which, int64_t lo, int64_t hi) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_release: the parameters p are NULL");
  int mask = which ? TDM_RESERVE_GRAD : TDM_RESERVE_DATA;
  if (!(p->reserved & mask) || lo < 0 || hi < lo || hi > p->numel || (which != 0 && which != 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "params_release: buffer %d, [%lld, %lld) of %lld%s", which,
                          (long long)lo, (long long)hi, (long long)p->numel,
                          p->reserved & mask ? "" : " (that buffer is not reserved)");
  float *buf = which ? p->grad : p->data;
  uintptr_t page = (uintptr_t)release_unit(), a = (uintptr_t)(buf + lo), b = (uintptr_t)(buf + hi);
  uintptr_t pa = (a + page - 1) / page * page, pb = b / page * page;
  if (pa >= pb) { /* no whole page inside: zero the bytes instead */
    memset((void *)a, 0, b - a);
    return TDM_OK;
  }
  memset((void *)a, 0, pa - a); /* the partial pages at the ends are shared with neighbours */
  memset((void *)pb, 0, b - pb);
  if (madvise((void *)pa, pb - pa, MADV_DONTNEED) != 0) memset((void *)pa, 0, pb - pa);
  return TDM_OK;
}

/* ---- segments of the gradient norm ------------------------------------------------------ */
static int64_t segment_len(int64_t numel) {
  int64_t L = 256; /* at most ~4096 segments plus one cut per parameter, whatever the size */
  while (L < 65536 && numel > 4096 * L) L *= 2;
  return L;
}

tdm_status tdm__params_segments(const tdm_params *cp, const int64_t **lo, int64_t *n) {
  tdm_params *p = (tdm_params *)cp; /* the table is a cache */
  if (!p->seg_lo) {
    int64_t L = segment_len(p->numel), cap = p->numel / L + p->n + 2, k = 0;
    int64_t *t = tdm__malloc(sizeof(int64_t) * (size_t)cap);
    double *sums = tdm__malloc(sizeof(double) * (size_t)cap);
    if (!t || !sums) {
      tdm__free(t);
      tdm__free(sums);
      return tdm__set_error(TDM_ERR_NO_MEMORY, "params: out of memory for the gradient-norm segments");
    }
    for (int i = 0; i < p->n; i++) { /* cuts at every parameter start and every multiple of L */
      int64_t b = p->e[i]->offset, e = b + p->e[i]->t.numel;
      for (int64_t x = b; x < e; x = (x / L + 1) * L) t[k++] = x;
    }
    t[k] = p->numel;
    p->seg_lo = t;
    p->seg_sums = sums;
    p->n_seg = k;
  }
  *lo = p->seg_lo;
  *n = p->n_seg;
  return TDM_OK;
}

int64_t tdm__params_segment_at(const tdm_params *p, int64_t off) {
  const int64_t *t;
  int64_t n;
  if (tdm__params_segments(p, &t, &n) != TDM_OK) return -1;
  int64_t a = 0, b = n; /* t[0..n] ascending: find off */
  while (a < b) {
    int64_t m = (a + b) / 2;
    if (t[m] < off) a = m + 1;
    else b = m;
  }
  return a <= n && t[a] == off ? a : -1;
}

double *tdm__params_segment_sums(const tdm_params *p) { return p->seg_sums; }

int tdm__params_index_of(const tdm_params *p, const tdm_tensor *t) {
  if (!p->finalized || !t->data) return -1;
  int64_t off = (const float *)t->data - p->data;
  int a = 0, b = p->n - 1;
  while (a <= b) { /* offsets ascend with the index */
    int m = (a + b) / 2;
    if (p->e[m]->offset < off) a = m + 1;
    else if (p->e[m]->offset > off) b = m - 1;
    else return &p->e[m]->t == t ? m : -1;
  }
  return -1;
}

#define NONNULL_P(ret, fn) TDM__NONNULL(p, ret, fn ": the parameters p are NULL")
int tdm_params_count(const tdm_params *p) {
  NONNULL_P(0, "tdm_params_count");
  return p->n;
}
tdm_tensor *tdm_params_get(const tdm_params *p, int i) {
  NONNULL_P(NULL, "tdm_params_get");
  return (i >= 0 && i < p->n) ? &p->e[i]->t : NULL;
}
int64_t tdm_params_offset(const tdm_params *p, int i) {
  NONNULL_P(-1, "tdm_params_offset");
  if (i < 0 || i >= p->n) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_offset: index %d; expected 0..%d", i, p->n - 1);
    return -1;
  }
  return p->e[i]->offset;
}
int tdm_params_decay(const tdm_params *p, int i) {
  NONNULL_P(0, "tdm_params_decay");
  if (i < 0 || i >= p->n) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_params_decay: index %d; expected 0..%d", i, p->n - 1);
    return 0;
  }
  return p->e[i]->decay;
}
int64_t tdm_params_numel(const tdm_params *p) {
  NONNULL_P(0, "tdm_params_numel");
  return p->numel;
}
float *tdm_params_data(const tdm_params *p) {
  NONNULL_P(NULL, "tdm_params_data");
  return p->data;
}
float *tdm_params_grad(const tdm_params *p) {
  NONNULL_P(NULL, "tdm_params_grad");
  return p->grad;
}

tdm_status tdm_params_set_grad_buffer(tdm_params *p, float *buf) {
  if (!p || !p->finalized) return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_set_grad_buffer: parameters not finalized");
  if (buf && buf == p->grad) return TDM_OK;
  if (p->reserved) return tdm__set_error(TDM_ERR_INVALID_USAGE, "params_set_grad_buffer: the storage is reserved (ZeRO stage 3)");
  float *nb = buf;
  if (!nb && !(nb = tdm__aligned_alloc_cat(sizeof(float) * (size_t)(p->numel ? p->numel : 1), TDM_MEM_GRADS)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "params_set_grad_buffer: out of memory");
  if (nb != p->grad) memcpy(nb, p->grad, sizeof(float) * (size_t)p->numel);
  if (!p->grad_external) tdm__free(p->grad);
  p->grad = nb;
  p->grad_external = buf != NULL;
  for (int i = 0; i < p->n; i++) p->e[i]->g.data = p->grad + p->e[i]->offset;
  return TDM_OK;
}

tdm_tensor *tdm_params_find(const tdm_params *p, const char *name) {
  NONNULL_P(NULL, "tdm_params_find");
  TDM__NONNULL(name, NULL, "tdm_params_find: the name is NULL");
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->e[i]->name, name)) return &p->e[i]->t;
  return NULL;
}

void tdm_params_zero_grad(tdm_params *p) {
  NONNULL_P(, "tdm_params_zero_grad");
  if (p->grad && (p->reserved & TDM_RESERVE_GRAD)) tdm_params_release(p, 1, 0, p->numel);
  else if (p->grad) tdm_k_zero(p->grad, p->numel);
}
