#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "tensor/tensor_impl.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {
    [TDM_F32] = {"f32", 4}, [TDM_F64] = {"f64", 8}, [TDM_BF16] = {"bf16", 2}, [TDM_F16] = {"f16", 2},
    [TDM_I32] = {"i32", 4}, [TDM_I64] = {"i64", 8}, [TDM_U8] = {"u8", 1},
};
_Static_assert(sizeof(dtypes) / sizeof(dtypes[0]) == TDM_DTYPE_COUNT, "dtype table must cover every dtype");

size_t tdm_dtype_size(tdm_dtype dt) { return (unsigned)dt < TDM_DTYPE_COUNT ? dtypes[dt].size : 0; }
const char *tdm_dtype_name(tdm_dtype dt) { return (unsigned)dt < TDM_DTYPE_COUNT ? dtypes[dt].name : "?"; }

/* ---- bf16 / f16 -------------------------------------------------------------------------- */
uint16_t tdm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                          /* to nearest even */
  return (uint16_t)(u >> 16);
}

float tdm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t tdm_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  int32_t E = (int32_t)(absx >> 23);
  uint32_t m = absx & 0x7fffffu;
  if (E >= 113) { /* normal in f16 */
    uint32_t h = ((uint32_t)(E - 112) << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
  }
  if (absx < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
  m |= 0x800000u;
  int shift = 126 - E; /* 14..24: value in units of 2^-24 */
  uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float tdm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0) {
    float v = (float)m * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) bits = sign | 0x7f800000u | (m << 13);
  else bits = sign | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* ---- element access ------------------------------------------------------------------- */
static inline double load(const void *p, tdm_dtype dt) {
  switch (dt) {
  case TDM_F32: return *(const float *)p;
  case TDM_F64: return *(const double *)p;
  case TDM_BF16: return tdm_bf16_to_f32(*(const uint16_t *)p);
  case TDM_F16: return tdm_f16_to_f32(*(const uint16_t *)p);
  case TDM_I32: return *(const int32_t *)p;
  case TDM_I64: return (double)*(const int64_t *)p;
  case TDM_U8: return *(const uint8_t *)p;
  default: return 0;
  }
}

/* A float into an integer type: NaN as 0, beyond the range its nearest end (the C cast is undefined
 * there: 300 into u8 gave 44, 1e30 into i64 INT64_MIN) */
static inline double sat(double v, double lo, double hi) { return v != v ? 0 : v < lo ? lo : v > hi ? hi : v; }

static inline void store(void *p, tdm_dtype dt, double v) {
  switch (dt) {
  case TDM_F32: *(float *)p = (float)v; break;
  case TDM_F64: *(double *)p = v; break;
  case TDM_BF16: *(uint16_t *)p = tdm_f32_to_bf16((float)v); break;
  case TDM_F16: *(uint16_t *)p = tdm_f32_to_f16((float)v); break;
  case TDM_I32: *(int32_t *)p = (int32_t)sat(v, INT32_MIN, INT32_MAX); break;
  case TDM_I64: *(int64_t *)p = v >= 0x1p63 ? INT64_MAX : (int64_t)sat(v, -0x1p63, 0x1p63); break; /* (2^63 - 1 is no double) */
  case TDM_U8: *(uint8_t *)p = (uint8_t)sat(v, 0, 255); break;
  default: break;
  }
}

tdm_status tdm_convert(void *dst, tdm_dtype dst_dt, const void *src, tdm_dtype src_dt, int64_t n) {
  if ((unsigned)dst_dt >= TDM_DTYPE_COUNT || (unsigned)src_dt >= TDM_DTYPE_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "convert: dtype %d -> %d; expected values below %d",
                          (int)src_dt, (int)dst_dt, TDM_DTYPE_COUNT);
  if (n < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "convert: count %lld < 0", (long long)n);
  if (n > 0 && (!dst || !src))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "convert: %s buffer is NULL for %lld elements", !dst ? "the destination" : "the source", (long long)n);
  if (dst_dt == src_dt) {
    memmove(dst, src, (size_t)n * tdm_dtype_size(dst_dt));
    return TDM_OK;
  }
  /* The hot pairs get plain loops the compiler vectorises. */
  if (src_dt == TDM_F32 && dst_dt == TDM_BF16) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = tdm_f32_to_bf16(((const float *)src)[i]);
  } else if (src_dt == TDM_BF16 && dst_dt == TDM_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = tdm_bf16_to_f32(((const uint16_t *)src)[i]);
  } else if (src_dt == TDM_F32 && dst_dt == TDM_F16) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = tdm_f32_to_f16(((const float *)src)[i]);
  } else if (src_dt == TDM_F16 && dst_dt == TDM_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = tdm_f16_to_f32(((const uint16_t *)src)[i]);
  } else {
    size_t ds = tdm_dtype_size(dst_dt), ss = tdm_dtype_size(src_dt);
    for (int64_t i = 0; i < n; i++)
      store((char *)dst + (size_t)i * ds, dst_dt, load((const char *)src + (size_t)i * ss, src_dt));
  }
  return TDM_OK;
}

/* ---- construction ---------------------------------------------------------------------- */
void tdm__tensor_init(tdm_tensor *t, tdm_dtype dt, int ndim, const int64_t *shape) {
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->ndim = ndim;
  t->numel = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t->shape[i] = shape[i];
    t->stride[i] = t->numel;
    t->numel *= shape[i];
  }
}

int tdm__shape_numel(int ndim, const int64_t *shape, size_t elem, int64_t *numel) {
  int64_t n = 1, b;
  for (int i = 0; i < ndim; i++)
    if (__builtin_mul_overflow(n, shape[i], &n)) return -1;
  if (__builtin_mul_overflow(n, (int64_t)elem, &b)) return -1;
  *numel = n;
  return 0;
}

static tdm_status check_shape(const char *who, tdm_dtype dt, int ndim, const int64_t *shape) {
  if ((unsigned)dt >= TDM_DTYPE_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: dtype %d is not a tandem dtype", who, (int)dt);
  if (ndim < 0 || ndim > TDM_MAX_DIMS)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %d dimensions; expected 0..%d", who, ndim, TDM_MAX_DIMS);
  if (ndim > 0 && !shape) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: shape is NULL", who);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: dimension %d is %lld; expected >= 0", who, i,
                            (long long)shape[i]);
  int64_t n;
  char b[160];
  if (tdm__shape_numel(ndim, shape, tdm_dtype_size(dt), &n))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: shape %s holds more than 2^63 bytes of %s", who,
                          tdm_shape_str(ndim, shape, b, sizeof b), tdm_dtype_name(dt));
  return TDM_OK;
}

tdm_status tdm_tensor_create(tdm_tensor **out, tdm_dtype dt, int ndim, const int64_t *shape) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor_create: out is NULL");
  TDM__TRY(check_shape("tensor_create", dt, ndim, shape));
  tdm_tensor *t = tdm__malloc(sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor_create: out of memory");
  tdm__tensor_init(t, dt, ndim, shape);
  size_t bytes = (size_t)t->numel * tdm_dtype_size(dt);
  t->data = tdm__aligned_alloc(bytes);
  if (!t->data) {
    tdm__free(t);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor_create: cannot allocate %zu bytes", bytes);
  }
  memset(t->data, 0, bytes);
  t->flags = TDM_TF_OWNS_DATA | TDM_TF_HEAP;
  *out = t;
  return TDM_OK;
}

tdm_status tdm_tensor_wrap(tdm_tensor **out, tdm_dtype dt, int ndim, const int64_t *shape, void *data) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor_wrap: out is NULL");
  TDM__TRY(check_shape("tensor_wrap", dt, ndim, shape));
  tdm_tensor *t = tdm__malloc(sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "tensor_wrap: out of memory");
  tdm__tensor_init(t, dt, ndim, shape);
  if (!data && t->numel) { /* a later fill or kernel would write through it */
    long long n = (long long)t->numel;
    tdm__free(t);
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_tensor_wrap: data is NULL for a tensor of %lld elements; expected a buffer",
                          n);
  }
  t->data = data;
  t->flags = TDM_TF_HEAP;
  *out = t;
  return TDM_OK;
}

void tdm_tensor_destroy(tdm_tensor *t) {
  if (!t || !(t->flags & TDM_TF_HEAP)) return; /* arena tensors die with their arena */
  if (t->grad && (t->grad->flags & TDM_TF_HEAP)) tdm_tensor_destroy(t->grad); /* a heap leaf's own gradient */
  if (t->flags & TDM_TF_OWNS_DATA) tdm__free(t->data);
  tdm__free(t);
}

#define NONNULL_T(ret, fn) TDM__NONNULL(t, ret, fn ": the tensor is NULL")
tdm_dtype tdm_tensor_dtype(const tdm_tensor *t) {
  NONNULL_T(TDM_DTYPE_COUNT, "tdm_tensor_dtype");
  return t->dtype;
}
int tdm_tensor_ndim(const tdm_tensor *t) {
  NONNULL_T(-1, "tdm_tensor_ndim");
  return t->ndim;
}
int64_t tdm_tensor_dim(const tdm_tensor *t, int axis) {
  NONNULL_T(-1, "tdm_tensor_dim");
  if (axis < 0) axis += t->ndim;
  return (axis >= 0 && axis < t->ndim) ? t->shape[axis] : -1;
}
const int64_t *tdm_tensor_shape(const tdm_tensor *t) {
  NONNULL_T(NULL, "tdm_tensor_shape");
  return t->shape;
}
const int64_t *tdm_tensor_strides(const tdm_tensor *t) {
  NONNULL_T(NULL, "tdm_tensor_strides");
  return t->stride;
}
int64_t tdm_tensor_numel(const tdm_tensor *t) {
  NONNULL_T(0, "tdm_tensor_numel");
  return t->numel;
}
void *tdm_tensor_data(const tdm_tensor *t) {
  NONNULL_T(NULL, "tdm_tensor_data");
  return t->data;
}
tdm_tensor *tdm_tensor_grad(const tdm_tensor *t) {
  NONNULL_T(NULL, "tdm_tensor_grad");
  return t->grad;
}
const char *tdm_tensor_name(const tdm_tensor *t) {
  NONNULL_T(NULL, "tdm_tensor_name");
  return t->name ? t->name : "";
}

int tdm_tensor_is_contiguous(const tdm_tensor *t) {
  NONNULL_T(0, "tdm_tensor_is_contiguous");
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

int tdm__shape_equal(const tdm_tensor *a, const tdm_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

char *tdm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  TDM__NONNULL(buf || !n, NULL, "tdm_shape_str: buf is NULL");
  if (ndim > 0) TDM__NONNULL(shape, NULL, "tdm_shape_str: the shape is NULL");
  size_t k = 0;
  k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "(");
  for (int i = 0; i < ndim; i++)
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
  snprintf(buf + k, k < n ? n - k : 0, ")");
  return buf;
}

static int64_t offset_of(const tdm_tensor *t, int64_t flat) {
  int64_t off = 0;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t n = t->shape[d];
    off += (flat % n) * t->stride[d];
    flat /= n;
  }
  return off;
}

double tdm_tensor_get(const tdm_tensor *t, int64_t i) {
  NONNULL_T(NAN, "tdm_tensor_get");
  if (i < 0 || i >= t->numel) return NAN;
  return load((const char *)t->data + offset_of(t, i) * (int64_t)tdm_dtype_size(t->dtype), t->dtype);
}

void tdm_tensor_fill(tdm_tensor *t, double v) {
  NONNULL_T(, "tdm_tensor_fill");
  size_t es = tdm_dtype_size(t->dtype);
  for (int64_t i = 0; i < t->numel; i++) store((char *)t->data + offset_of(t, i) * (int64_t)es, t->dtype, v);
}

tdm_status tdm_tensor_copy(tdm_tensor *dst, const tdm_tensor *src) {
  if (!dst || !src) return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor_copy: NULL tensor");
  if (!tdm__shape_equal(dst, src)) {
    char a[96], b[96];
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor_copy: shapes differ: dst %s, src %s",
                          tdm_shape_str(dst->ndim, dst->shape, a, sizeof a),
                          tdm_shape_str(src->ndim, src->shape, b, sizeof b));
  }
  if (tdm_tensor_is_contiguous(dst) && tdm_tensor_is_contiguous(src))
    return tdm_convert(dst->data, dst->dtype, src->data, src->dtype, src->numel);
  size_t ds = tdm_dtype_size(dst->dtype), ss = tdm_dtype_size(src->dtype);
  int64_t idx[TDM_MAX_DIMS] = {0}, so = 0, doff = 0;
  for (int64_t i = 0; i < src->numel; i++) {
    store((char *)dst->data + doff * (int64_t)ds, dst->dtype, load((const char *)src->data + so * (int64_t)ss, src->dtype));
    for (int d = src->ndim - 1; d >= 0; d--) {
      idx[d]++;
      so += src->stride[d];
      doff += dst->stride[d];
      if (idx[d] < src->shape[d]) break;
      so -= src->stride[d] * src->shape[d];
      doff -= dst->stride[d] * dst->shape[d];
      idx[d] = 0;
    }
  }
  return TDM_OK;
}
