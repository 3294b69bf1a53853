/* safetensors reading and writing; see include/tandem/safetensors.h for the layout. */
#include "tandem/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/internal.h"
#include "core/json.h"

#define MAX_HEADER (100u << 20)

struct tdm_safetensors {
  unsigned char *bytes; /* the whole file */
  int64_t size;
  tdm_st_tensor *t;
  int n;
  char **meta; /* key, value pairs */
  int n_meta;
  void **copies; /* n: aligned copies of tensors the file does not align, else NULL */
};

static const struct {
  const char *name;
  tdm_dtype dt;
} st_dtypes[] = {{"F32", TDM_F32}, {"F64", TDM_F64}, {"BF16", TDM_BF16}, {"F16", TDM_F16},
                 {"I32", TDM_I32}, {"I64", TDM_I64}, {"U8", TDM_U8}};
#define N_ST_DTYPES (int)(sizeof st_dtypes / sizeof st_dtypes[0])

static const char *st_name(tdm_dtype dt) {
  for (int i = 0; i < N_ST_DTYPES; i++)
    if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
  return NULL;
}

static char *dup_str(const char *s) {
  char *d = tdm__malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

void tdm_safetensors_destroy(tdm_safetensors *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) tdm__free((char *)f->t[i].name);
  for (int i = 0; i < 2 * f->n_meta; i++) tdm__free(f->meta[i]);
  for (int i = 0; f->copies && i < f->n; i++) tdm__free(f->copies[i]);
  tdm__free(f->copies);
  tdm__free(f->meta);
  tdm__free(f->t);
  tdm__free(f->bytes);
  tdm__free(f);
}

/* The bytes that dtype x shape need, or -1 when a dimension is negative or the product overflows. */
static int64_t shape_bytes(tdm_dtype dt, int ndim, const int64_t *shape) {
  int64_t n = (int64_t)tdm_dtype_size(dt);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0) return -1;
  for (int d = 0; d < ndim; d++)
    if (shape[d] == 0) return 0; /* before any product can overflow */
  for (int d = 0; d < ndim; d++)
    if (__builtin_mul_overflow(n, shape[d], &n)) return -1;
  return n;
}

static int cmp_begin(const void *a, const void *b) {
  const tdm_st_tensor *x = *(const tdm_st_tensor *const *)a, *y = *(const tdm_st_tensor *const *)b;
  return (x->data > y->data) - (x->data < y->data);
}

/* Tensor names are JSON keys, so the reader has refused duplicates already. */
static tdm_status check_overlap(tdm_safetensors *f, const char *path) {
  const tdm_st_tensor **s = tdm__malloc(sizeof *s * (size_t)(f->n ? f->n : 1));
  if (!s) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  int k = 0;
  for (int i = 0; i < f->n; i++)
    if (f->t[i].nbytes > 0) s[k++] = &f->t[i]; /* an empty tensor shares no byte, wherever it points */
  qsort(s, (size_t)k, sizeof *s, cmp_begin);
  tdm_status st = TDM_OK;
  for (int i = 1; i < k && st == TDM_OK; i++)
    if ((const unsigned char *)s[i - 1]->data + s[i - 1]->nbytes > (const unsigned char *)s[i]->data)
      st = tdm__set_error(TDM_ERR_FORMAT, "%s: tensors '%.100s' and '%.100s' overlap", path, s[i - 1]->name,
                          s[i]->name);
  tdm__free(s);
  return st;
}

/* The format does not require alignment (a header need not be padded to 8 bytes, an offset need
 * not be a multiple of the element size), but readers of t->data load whole elements: a tensor
 * that is not aligned to its element size gets an aligned copy. */
static tdm_status align_tensors(tdm_safetensors *f, const char *path) {
  for (int i = 0; i < f->n; i++) {
    tdm_st_tensor *t = &f->t[i];
    if (!t->nbytes || (uintptr_t)t->data % tdm_dtype_size(t->dtype) == 0) continue;
    if (!f->copies && !(f->copies = tdm__calloc((size_t)f->n, sizeof *f->copies)))
      return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
    if (!(f->copies[i] = tdm__aligned_alloc((size_t)t->nbytes)))
      return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot copy tensor '%.100s' (%lld bytes)", path, t->name,
                            (long long)t->nbytes);
    memcpy(f->copies[i], t->data, (size_t)t->nbytes);
    t->data = f->copies[i];
  }
  return TDM_OK;
}

static tdm_status parse_meta(tdm_safetensors *f, const char *path, const tdm_json *v) {
  if (v->type != TDM_JSON_OBJ) return tdm__set_error(TDM_ERR_FORMAT, "%s: __metadata__ is not an object", path);
  if (f->meta) return tdm__set_error(TDM_ERR_INTERNAL, "%s: two __metadata__", path); /* JSON refuses duplicates */
  f->meta = tdm__calloc((size_t)(2 * v->n + 1), sizeof(char *));
  if (!f->meta) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int m = 0; m < v->n; m++) {
    if (v->items[m].type != TDM_JSON_STR)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: __metadata__ value of '%.100s' is not a string", path, v->keys[m]);
    f->meta[2 * m] = dup_str(v->keys[m]);
    f->meta[2 * m + 1] = dup_str(v->items[m].str);
    f->n_meta = m + 1;
    if (!f->meta[2 * m] || !f->meta[2 * m + 1]) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  }
  return TDM_OK;
}

/* One tensor entry: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} and nothing else. */
static tdm_status parse_tensor(tdm_st_tensor *t, const char *path, const char *key, const tdm_json *v,
                               const unsigned char *data, int64_t data_size) {
#define BAD(...) tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%.100s': " __VA_ARGS__)
  if (v->type != TDM_JSON_OBJ) return BAD("not an object", path, key);
  for (int k = 0; k < v->n; k++)
    if (strcmp(v->keys[k], "dtype") && strcmp(v->keys[k], "shape") && strcmp(v->keys[k], "data_offsets"))
      return BAD("unknown field '%.100s'; expected dtype, shape and data_offsets", path, key, v->keys[k]);
  const tdm_json *dt = tdm__json_get(v, "dtype"), *sh = tdm__json_get(v, "shape"), *off = tdm__json_get(v, "data_offsets");
  if (!dt || dt->type != TDM_JSON_STR) return BAD("no dtype string", path, key);
  if (!sh || sh->type != TDM_JSON_ARR) return BAD("no shape array", path, key);
  if (!off || off->type != TDM_JSON_ARR || off->n != 2) return BAD("no data_offsets [begin, end]", path, key);
  int found = 0;
  for (int i = 0; i < N_ST_DTYPES && !found; i++)
    if (!strcmp(dt->str, st_dtypes[i].name)) t->dtype = st_dtypes[i].dt, found = 1;
  if (!found) return BAD("dtype %.20s; supported: F32 F64 BF16 F16 I32 I64 U8", path, key, dt->str);
  if (sh->n > TDM_MAX_DIMS) return BAD("%d dimensions; at most %d supported", path, key, sh->n, TDM_MAX_DIMS);
  t->ndim = sh->n;
  for (int d = 0; d < sh->n; d++) {
    const tdm_json *x = &sh->items[d];
    if (x->type != TDM_JSON_NUM || !x->is_int || x->inum < 0)
      return BAD("dimension %d is not a non-negative 64-bit integer", path, key, d);
    t->shape[d] = x->inum;
  }
  int64_t need = shape_bytes(t->dtype, t->ndim, t->shape);
  char sbuf[160];
  if (need < 0)
    return BAD("shape %s of %s overflows 64 bits in bytes", path, key, tdm_shape_str(t->ndim, t->shape, sbuf, sizeof sbuf),
               dt->str);
  const tdm_json *b = &off->items[0], *e = &off->items[1];
  if (b->type != TDM_JSON_NUM || e->type != TDM_JSON_NUM || !b->is_int || !e->is_int || b->inum < 0 || e->inum < b->inum)
    return BAD("data_offsets are not two integers 0 <= begin <= end", path, key);
  if (e->inum > data_size)
    return BAD("data_offsets [%lld, %lld] do not lie within the %lld data bytes (file truncated?)", path, key,
               (long long)b->inum, (long long)e->inum, (long long)data_size);
  t->nbytes = e->inum - b->inum;
  if (t->nbytes != need)
    return BAD("data_offsets [%lld, %lld] hold %lld bytes; %s %s needs %lld", path, key, (long long)b->inum,
               (long long)e->inum, (long long)t->nbytes, dt->str, tdm_shape_str(t->ndim, t->shape, sbuf, sizeof sbuf),
               (long long)need);
  t->data = data + b->inum;
  return TDM_OK;
#undef BAD
}

static tdm_status parse_header(tdm_safetensors *f, const char *path, const tdm_json *h, const unsigned char *data,
                               int64_t data_size) {
  if (h->type != TDM_JSON_OBJ) return tdm__set_error(TDM_ERR_FORMAT, "%s: header is not a JSON object", path);
  f->t = tdm__calloc((size_t)(h->n ? h->n : 1), sizeof *f->t);
  if (!f->t) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int k = 0; k < h->n; k++) {
    if (!strcmp(h->keys[k], "__metadata__")) {
      TDM__TRY(parse_meta(f, path, &h->items[k]));
      continue;
    }
    tdm_st_tensor *t = &f->t[f->n];
    if (!(t->name = dup_str(h->keys[k]))) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
    f->n++;
    TDM__TRY(parse_tensor(t, path, h->keys[k], &h->items[k], data, data_size));
  }
  TDM__TRY(check_overlap(f, path));
  return align_tensors(f, path);
}

/* Parses f->bytes[0..f->size), which f owns. */
static tdm_status parse_bytes(tdm_safetensors *f, const char *path) {
  if (f->size < 8)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: %lld bytes; a safetensors file has at least 8", path, (long long)f->size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->bytes[i];
  if (hlen > (uint64_t)(f->size - 8))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%lld bytes; truncated?)",
                          path, (unsigned long long)hlen, (long long)f->size);
  if (hlen > MAX_HEADER)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: header length %llu is above the limit of %u bytes", path,
                          (unsigned long long)hlen, MAX_HEADER);
  tdm_json *h = NULL;
  tdm_status st = tdm__json_parse((const char *)f->bytes + 8, (size_t)hlen, &h);
  if (st != TDM_OK) return st == TDM_ERR_FORMAT ? tdm__set_error(st, "%s: bad header: %s", path, tdm_last_error()) : st;
  st = parse_header(f, path, h, f->bytes + 8 + hlen, f->size - 8 - (int64_t)hlen);
  tdm__json_free(h);
  return st;
}

static tdm_status finish_load(tdm_safetensors **out, tdm_safetensors *f, const char *path) {
  tdm_status st = parse_bytes(f, path);
  if (st != TDM_OK) {
    tdm_safetensors_destroy(f);
    return st;
  }
  *out = f;
  return TDM_OK;
}

tdm_status tdm_safetensors_load(tdm_safetensors **out, const char *path) {
  if (!out || !path) return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_load: NULL argument");
  *out = NULL;
  tdm_safetensors *f = tdm__calloc(1, sizeof *f);
  if (!f) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  tdm_status st = tdm__file_read(path, INT64_MAX, "safetensors file", &f->bytes, &f->size);
  if (st != TDM_OK) {
    tdm__free(f);
    return st;
  }
  return finish_load(out, f, path);
}

tdm_status tdm_safetensors_parse(tdm_safetensors **out, const void *bytes, size_t n, const char *name) {
  if (!out || (!bytes && n) || !name) return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_parse: NULL argument");
  *out = NULL;
  tdm_safetensors *f = tdm__calloc(1, sizeof *f);
  if (!f || !(f->bytes = tdm__malloc(n ? n : 1))) {
    tdm__free(f);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot hold %zu bytes", name, n);
  }
  if (n) memcpy(f->bytes, bytes, n);
  f->size = (int64_t)n;
  return finish_load(out, f, name);
}

int tdm_safetensors_count(const tdm_safetensors *f) {
  TDM__NONNULL(f, 0, "tdm_safetensors_count: the file f is NULL");
  return f->n;
}
const tdm_st_tensor *tdm_safetensors_at(const tdm_safetensors *f, int i) {
  TDM__NONNULL(f, NULL, "tdm_safetensors_at: the file f is NULL");
  return (i >= 0 && i < f->n) ? &f->t[i] : NULL;
}
const tdm_st_tensor *tdm_safetensors_find(const tdm_safetensors *f, const char *name) {
  TDM__NONNULL(f, NULL, "tdm_safetensors_find: the file f is NULL");
  TDM__NONNULL(name, NULL, "tdm_safetensors_find: the name is NULL");
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}
const char *tdm_safetensors_meta(const tdm_safetensors *f, const char *key) {
  TDM__NONNULL(f, NULL, "tdm_safetensors_meta: the file f is NULL");
  TDM__NONNULL(key, NULL, "tdm_safetensors_meta: the key is NULL");
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
  return NULL;
}

/* ---- writing ------------------------------------------------------------------------------- */
typedef struct {
  char *s;
  size_t n, cap;
  int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t nc = (b->cap ? b->cap * 2 : 4096);
    while (nc < b->n + n + 1) nc *= 2;
    char *ns = tdm__malloc(nc);
    if (!ns) {
      b->oom = 1;
      return;
    }
    if (b->s) memcpy(ns, b->s, b->n);
    tdm__free(b->s);
    b->s = ns;
    b->cap = nc;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }
static void put_json_str(sbuf *b, const char *s) {
  puts_(b, "\"");
  for (; *s; s++) {
    char esc[8];
    if (*s == '"' || *s == '\\') {
      esc[0] = '\\';
      esc[1] = *s;
      put(b, esc, 2);
    } else if ((unsigned char)*s < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", (unsigned char)*s);
      puts_(b, esc);
    } else {
      put(b, s, 1);
    }
  }
  puts_(b, "\"");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* What the reader would refuse, refused before anything is written: a file tandem writes is always
 * one it can read back. names[] holds n pointers to sort. */
static tdm_status check_save_args(const char *path, int n, const tdm_st_tensor *ts, int n_meta, const char *const *kv,
                                  const char **names, int need_data) {
#define BAD(...) tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: %s: " __VA_ARGS__)
  for (int i = 0; i < n_meta; i++) {
    if (!kv[2 * i] || !kv[2 * i + 1]) return BAD("metadata pair %d has a NULL key or value", path, i);
    if (!tdm__utf8_valid(kv[2 * i]) || !tdm__utf8_valid(kv[2 * i + 1]))
      return BAD("metadata '%.100s' is not valid UTF-8", path, kv[2 * i]);
    for (int j = 0; j < i; j++)
      if (!strcmp(kv[2 * j], kv[2 * i])) return BAD("metadata key '%.100s' given twice", path, kv[2 * i]);
  }
  for (int i = 0; i < n; i++) {
    const tdm_st_tensor *t = &ts[i];
    if (!t->name || !strcmp(t->name, "__metadata__") || !tdm__utf8_valid(t->name))
      return BAD("tensor %d's name is NULL, __metadata__ or not UTF-8", path, i);
    if (!st_name(t->dtype))
      return BAD("tensor '%.100s' has unsupported dtype %s", path, t->name, tdm_dtype_name(t->dtype));
    if (t->ndim < 0 || t->ndim > TDM_MAX_DIMS)
      return BAD("tensor '%.100s' has %d dimensions; expected 0..%d", path, t->name, t->ndim, TDM_MAX_DIMS);
    int64_t need = shape_bytes(t->dtype, t->ndim, t->shape);
    if (need < 0 || t->nbytes != need || (need && need_data && !t->data))
      return BAD("tensor '%.100s': %lld bytes at %p do not match its dtype and shape (%lld bytes)", path, t->name,
                 (long long)t->nbytes, t->data, (long long)need);
    names[i] = t->name;
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  for (int i = 1; i < n; i++)
    if (!strcmp(names[i - 1], names[i])) return BAD("tensor name '%.100s' given twice", path, names[i]);
  return TDM_OK;
#undef BAD
}

struct tdm_st_writer {
  tdm__wfile w;
  int64_t total, written;
};

tdm_status tdm_safetensors_writer_open(tdm_st_writer **out, const char *path, int n, const tdm_st_tensor *tensors,
                                       int n_meta, const char *const *meta_kv) {
  if (!out || !path || n < 0 || (n && !tensors) || n_meta < 0 || (n_meta && !meta_kv))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: bad arguments");
  *out = NULL;
  const char **names = tdm__malloc(sizeof *names * (size_t)(n ? n : 1));
  if (!names) return tdm__set_error(TDM_ERR_NO_MEMORY, "safetensors_save: out of memory");
  tdm_status st = check_save_args(path, n, tensors, n_meta, meta_kv, names, 0);
  tdm__free(names);
  if (st != TDM_OK) return st;
  sbuf h = {0};
  char num[64];
  puts_(&h, "{");
  int first = 1;
  if (n_meta) {
    puts_(&h, "\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
      if (i) puts_(&h, ",");
      put_json_str(&h, meta_kv[2 * i]);
      puts_(&h, ":");
      put_json_str(&h, meta_kv[2 * i + 1]);
    }
    puts_(&h, "}");
    first = 0;
  }
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    const tdm_st_tensor *t = &tensors[i];
    if (!first) puts_(&h, ",");
    first = 0;
    put_json_str(&h, t->name);
    puts_(&h, ":{\"dtype\":\"");
    puts_(&h, st_name(t->dtype));
    puts_(&h, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)t->shape[d]);
      puts_(&h, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + t->nbytes));
    puts_(&h, num);
    off += t->nbytes;
  }
  puts_(&h, "}");
  while (!h.oom && h.n % 8) puts_(&h, " "); /* keep the data 8-byte aligned */
  tdm_st_writer *w = h.oom ? NULL : tdm__calloc(1, sizeof *w);
  if (!w) {
    tdm__free(h.s);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "safetensors_save: out of memory");
  }
  w->total = off;
  if ((st = tdm__wfile_open(&w->w, path)) != TDM_OK) {
    tdm__free(h.s);
    tdm__free(w);
    return st;
  }
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
  tdm__wfile_write(&w->w, len, 8);
  tdm__wfile_write(&w->w, h.s, h.n);
  tdm__free(h.s);
  *out = w;
  return TDM_OK;
}

tdm_status tdm_safetensors_writer_write(tdm_st_writer *w, const void *data, size_t n) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_safetensors_writer_write: the writer w is NULL");
  if (!data && n) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_safetensors_writer_write: data is NULL for %zu bytes", n);
  if ((int64_t)n > w->total - w->written)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: %s: %zu more bytes than the %lld the header announces",
                          w->w.path, n - (size_t)(w->total - w->written), (long long)w->total);
  w->written += (int64_t)n;
  return tdm__wfile_write(&w->w, data, n);
}

tdm_status tdm_safetensors_writer_commit(tdm_st_writer *w) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_safetensors_writer_commit: the writer w is NULL");
  tdm_status st;
  if (w->written != w->total) {
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: %s: %lld data bytes written of the %lld announced; nothing saved",
                        w->w.path, (long long)w->written, (long long)w->total);
    tdm__wfile_abort(&w->w);
  } else {
    st = tdm__wfile_commit(&w->w); /* after a failed write, commit removes the temporary and returns that error */
  }
  tdm__free(w);
  return st;
}

void tdm_safetensors_writer_abort(tdm_st_writer *w) {
  if (!w) return;
  tdm__wfile_abort(&w->w);
  tdm__free(w);
}

tdm_status tdm_safetensors_save(const char *path, int n, const tdm_st_tensor *tensors, int n_meta,
                                const char *const *meta_kv) {
  for (int i = 0; tensors && i < n; i++)
    if (tensors[i].nbytes && !tensors[i].data)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: %s: tensor '%.100s' has no data", path ? path : "?",
                            tensors[i].name ? tensors[i].name : "?");
  tdm_st_writer *w;
  TDM__TRY(tdm_safetensors_writer_open(&w, path, n, tensors, n_meta, meta_kv));
  for (int i = 0; i < n; i++) tdm_safetensors_writer_write(w, tensors[i].data, (size_t)tensors[i].nbytes);
  return tdm_safetensors_writer_commit(w);
}

tdm_status tdm_safetensors_check_writable(const char *path) { return tdm__file_check_writable(path); }
