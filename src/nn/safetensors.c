/* safetensors reading and writing; see include/tandem/safetensors.h for the layout. */
#include "tandem/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
  tdm__free(f->meta);
  tdm__free(f->t);
  tdm__free(f->bytes);
  tdm__free(f);
}

static int cmp_begin(const void *a, const void *b) {
  const tdm_st_tensor *x = a, *y = b;
  return (x->data > y->data) - (x->data < y->data);
}

static tdm_status parse_header(tdm_safetensors *f, const char *path, const tdm_json *h, const unsigned char *data,
                               int64_t data_size) {
  if (h->type != TDM_JSON_OBJ) return tdm__set_error(TDM_ERR_FORMAT, "%s: header is not a JSON object", path);
  f->t = tdm__calloc((size_t)(h->n ? h->n : 1), sizeof *f->t);
  if (!f->t) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int k = 0; k < h->n; k++) {
    const char *key = h->keys[k];
    const tdm_json *v = &h->items[k];
    if (!strcmp(key, "__metadata__")) {
      if (v->type != TDM_JSON_OBJ) return tdm__set_error(TDM_ERR_FORMAT, "%s: __metadata__ is not an object", path);
      f->meta = tdm__calloc((size_t)(2 * v->n + 1), sizeof(char *));
      if (!f->meta) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
      for (int m = 0; m < v->n; m++) {
        if (v->items[m].type != TDM_JSON_STR)
          return tdm__set_error(TDM_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", path, v->keys[m]);
        f->meta[2 * m] = dup_str(v->keys[m]);
        f->meta[2 * m + 1] = dup_str(v->items[m].str);
        f->n_meta = m + 1;
        if (!f->meta[2 * m] || !f->meta[2 * m + 1]) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
      }
      continue;
    }
    tdm_st_tensor *t = &f->t[f->n];
    if (!(t->name = dup_str(key))) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
    f->n++;
    const tdm_json *dt = tdm__json_get(v, "dtype"), *sh = tdm__json_get(v, "shape"),
                   *off = tdm__json_get(v, "data_offsets");
    if (!dt || dt->type != TDM_JSON_STR || !sh || sh->type != TDM_JSON_ARR || !off || off->type != TDM_JSON_ARR ||
        off->n != 2)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%s' lacks a string dtype, a shape array or two data_offsets",
                            path, key);
    int found = 0;
    for (int i = 0; i < N_ST_DTYPES; i++)
      if (!strcmp(dt->str, st_dtypes[i].name)) {
        t->dtype = st_dtypes[i].dt;
        found = 1;
      }
    if (!found)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%s' has dtype %s; supported: F32 F64 BF16 F16 I32 I64 U8",
                            path, key, dt->str);
    if (sh->n > TDM_MAX_DIMS)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%s' has %d dimensions; at most %d supported", path, key,
                            sh->n, TDM_MAX_DIMS);
    t->ndim = sh->n;
    int64_t numel = 1;
    for (int d = 0; d < sh->n; d++) {
      const tdm_json *x = &sh->items[d];
      if (x->type != TDM_JSON_NUM || !x->is_int || x->inum < 0 || x->inum > ((int64_t)1 << 40))
        return tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%s' dimension %d is not a non-negative integer", path, key, d);
      t->shape[d] = x->inum;
      numel *= x->inum;
      if (numel > ((int64_t)1 << 40))
        return tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%s' is implausibly large", path, key);
    }
    const tdm_json *b = &off->items[0], *e = &off->items[1];
    if (b->type != TDM_JSON_NUM || e->type != TDM_JSON_NUM || !b->is_int || !e->is_int || b->inum < 0 ||
        e->inum < b->inum || e->inum > data_size)
      return tdm__set_error(TDM_ERR_FORMAT,
                            "%s: tensor '%s' data_offsets do not lie within the %lld data bytes (file truncated?)", path,
                            key, (long long)data_size);
    t->nbytes = e->inum - b->inum;
    if (t->nbytes != numel * (int64_t)tdm_dtype_size(t->dtype))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: tensor '%s' holds %lld bytes; its dtype and shape need %lld", path, key,
                            (long long)t->nbytes, (long long)(numel * (int64_t)tdm_dtype_size(t->dtype)));
    t->data = data + b->inum;
  }
  /* No two tensors may share bytes. */
  tdm_st_tensor *sorted = tdm__malloc(sizeof *sorted * (size_t)(f->n ? f->n : 1));
  if (!sorted) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  memcpy(sorted, f->t, sizeof *sorted * (size_t)f->n);
  qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
  for (int i = 1; i < f->n; i++)
    if ((const unsigned char *)sorted[i - 1].data + sorted[i - 1].nbytes > (const unsigned char *)sorted[i].data) {
      tdm_status st = tdm__set_error(TDM_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path, sorted[i - 1].name,
                                     sorted[i].name);
      tdm__free(sorted);
      return st;
    }
  tdm__free(sorted);
  return TDM_OK;
}

tdm_status tdm_safetensors_load(tdm_safetensors **out, const char *path) {
  if (!out || !path) return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_load: NULL argument");
  FILE *fp = fopen(path, "rb");
  if (!fp) return tdm__set_error(TDM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  tdm_safetensors *f = tdm__calloc(1, sizeof *f);
  tdm_status st = TDM_OK;
  if (!f) {
    fclose(fp);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  }
  if (fseek(fp, 0, SEEK_END) != 0 || (f->size = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0) {
    st = tdm__set_error(TDM_ERR_IO, "%s: cannot determine the size: %s", path, strerror(errno));
    goto done;
  }
  if (f->size < 8) {
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: %lld bytes; a safetensors file has at least 8", path, (long long)f->size);
    goto done;
  }
  f->bytes = tdm__malloc((size_t)f->size);
  if (!f->bytes) {
    st = tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot hold %lld bytes", path, (long long)f->size);
    goto done;
  }
  if (fread(f->bytes, 1, (size_t)f->size, fp) != (size_t)f->size) {
    st = tdm__set_error(TDM_ERR_IO, "%s: short read", path);
    goto done;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->bytes[i];
  if (hlen > MAX_HEADER || hlen > (uint64_t)(f->size - 8)) {
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: header length %llu does not fit the file of %lld bytes (at most %u)", path,
                        (unsigned long long)hlen, (long long)f->size, MAX_HEADER);
    goto done;
  }
  tdm_json *h = NULL;
  if ((st = tdm__json_parse((const char *)f->bytes + 8, hlen, &h)) != TDM_OK) {
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: bad header: %s", path, tdm_last_error());
    goto done;
  }
  st = parse_header(f, path, h, f->bytes + 8 + hlen, f->size - 8 - (int64_t)hlen);
  tdm__json_free(h);
done:
  fclose(fp);
  if (st != TDM_OK) {
    tdm_safetensors_destroy(f);
    return st;
  }
  *out = f;
  return TDM_OK;
}

int tdm_safetensors_count(const tdm_safetensors *f) { return f->n; }
const tdm_st_tensor *tdm_safetensors_at(const tdm_safetensors *f, int i) {
  return (i >= 0 && i < f->n) ? &f->t[i] : NULL;
}
const tdm_st_tensor *tdm_safetensors_find(const tdm_safetensors *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}
const char *tdm_safetensors_meta(const tdm_safetensors *f, const char *key) {
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

tdm_status tdm_safetensors_save(const char *path, int n, const tdm_st_tensor *tensors, int n_meta,
                                const char *const *meta_kv) {
  if (!path || n < 0 || (n && !tensors) || n_meta < 0 || (n_meta && !meta_kv))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: bad arguments");
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
    const char *dn = st_name(t->dtype);
    if (!dn) {
      tdm__free(h.s);
      return tdm__set_error(TDM_ERR_INVALID_ARG, "safetensors_save: tensor '%s' has unsupported dtype %s", t->name,
                            tdm_dtype_name(t->dtype));
    }
    if (!first) puts_(&h, ",");
    first = 0;
    put_json_str(&h, t->name);
    puts_(&h, ":{\"dtype\":\"");
    puts_(&h, dn);
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
  if (h.oom) {
    tdm__free(h.s);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "safetensors_save: out of memory");
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *fp = fopen(tmp, "wb");
  if (!fp) {
    tdm__free(h.s);
    return tdm__set_error(TDM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  }
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
  int ok = fwrite(len, 1, 8, fp) == 8 && fwrite(h.s, 1, h.n, fp) == h.n;
  for (int i = 0; ok && i < n; i++)
    ok = fwrite(tensors[i].data, 1, (size_t)tensors[i].nbytes, fp) == (size_t)tensors[i].nbytes;
  ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
  ok = (fclose(fp) == 0) && ok;
  tdm__free(h.s);
  if (!ok || rename(tmp, path) != 0) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    unlink(tmp);
    return st;
  }
  return TDM_OK;
}
