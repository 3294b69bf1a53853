/* Boxes of logical tensors and the manifest's JSON: how any split of a tensor (flat spans of a
 * buffer, a range of rows or columns, a stage's share) is described, checked and copied. See
 * src/train/ckpt_impl.h and docs/checkpoint-format.md. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "train/ckpt_impl.h"

/* ---- boxes ----------------------------------------------------------------------------------- */
int64_t tdm__box_numel(int nd, const tdm__box *b) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= b->count[d];
  return n;
}

/* [lo, hi) of the sub-tensor of dimensions d.. (rows of dimension d), with the indices of the
 * dimensions before d fixed in *base. */
static void flat_rec(int nd, const int64_t *shape, int d, int64_t lo, int64_t hi, tdm__box *base, tdm__box *out, int *n) {
  if (lo >= hi) return;
  if (d == nd - 1) {
    tdm__box b = *base;
    b.start[d] = lo, b.count[d] = hi - lo;
    out[(*n)++] = b;
    return;
  }
  int64_t inner = 1;
  for (int k = d + 1; k < nd; k++) inner *= shape[k];
  int64_t r0 = lo / inner, r1 = hi / inner;
  tdm__box row = *base;
  row.count[d] = 1;
  if (r0 == r1) { /* within one row */
    row.start[d] = r0;
    flat_rec(nd, shape, d + 1, lo % inner, hi % inner, &row, out, n);
    return;
  }
  if (lo % inner) { /* the end of a first, partial row */
    row.start[d] = r0;
    flat_rec(nd, shape, d + 1, lo % inner, inner, &row, out, n);
    r0++;
  }
  if (r1 > r0) { /* whole rows */
    tdm__box b = *base;
    b.start[d] = r0, b.count[d] = r1 - r0;
    for (int k = d + 1; k < nd; k++) b.start[k] = 0, b.count[k] = shape[k];
    out[(*n)++] = b;
  }
  if (hi % inner) { /* the start of a last, partial row */
    row.start[d] = r1;
    flat_rec(nd, shape, d + 1, 0, hi % inner, &row, out, n);
  }
}

int tdm__flat_boxes(int nd, const int64_t *shape, int64_t lo, int64_t hi, tdm__box *out) {
  int n = 0;
  if (lo >= hi) return 0;
  if (nd == 0) {
    memset(out, 0, sizeof *out);
    return 1;
  }
  tdm__box base;
  memset(&base, 0, sizeof base);
  flat_rec(nd, shape, 0, lo, hi, &base, out, &n);
  return n;
}

int tdm__box_intersect(int nd, const tdm__box *a, const tdm__box *b, tdm__box *out) {
  for (int d = 0; d < nd; d++) {
    int64_t lo = a->start[d] > b->start[d] ? a->start[d] : b->start[d];
    int64_t ea = a->start[d] + a->count[d], eb = b->start[d] + b->count[d], hi = ea < eb ? ea : eb;
    if (lo >= hi) return 0;
    out->start[d] = lo, out->count[d] = hi - lo;
  }
  return 1;
}

void tdm__box_copy(int nd, size_t es, void *dst, const tdm__box *to, const void *src, const tdm__box *from,
                   const tdm__box *part) {
  if (nd == 0) {
    memcpy(dst, src, es);
    return;
  }
  int64_t ss[TDM_MAX_DIMS], ds[TDM_MAX_DIMS], idx[TDM_MAX_DIMS] = {0}; /* strides in elements */
  ss[nd - 1] = ds[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) ss[d] = ss[d + 1] * from->count[d + 1], ds[d] = ds[d + 1] * to->count[d + 1];
  size_t run = (size_t)part->count[nd - 1] * es; /* the last dimension is contiguous in both */
  for (;;) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < nd; d++) {
      int64_t i = part->start[d] + (d < nd - 1 ? idx[d] : 0);
      so += (i - from->start[d]) * ss[d];
      doff += (i - to->start[d]) * ds[d];
    }
    memcpy((char *)dst + doff * (int64_t)es, (const char *)src + so * (int64_t)es, run);
    int d = nd - 2; /* the next row: an odometer over the leading dimensions */
    while (d >= 0 && ++idx[d] == part->count[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

void tdm__box_name(const char *tensor, int nd, const tdm__box *b, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "%s[", tensor);
  for (int d = 0; d < nd && at < n; d++)
    at += (size_t)snprintf(buf + at, n - at, "%s%lld:%lld", d ? "," : "", (long long)b->start[d],
                           (long long)(b->start[d] + b->count[d]));
  if (at < n) snprintf(buf + at, n - at, "]");
}

static int cmp_first_dim(const void *a, const void *b) {
  const tdm__box *x = *(const tdm__box *const *)a, *y = *(const tdm__box *const *)b;
  return (x->start[0] > y->start[0]) - (x->start[0] < y->start[0]);
}

typedef struct {
  int64_t c[TDM_MAX_DIMS];
  int sign;
} corner;

static int cmp_corner(const void *a, const void *b) { /* unused dimensions are 0 in both */
  const corner *x = a, *y = b;
  for (int d = 0; d < TDM_MAX_DIMS; d++)
    if (x->c[d] != y->c[d]) return (x->c[d] > y->c[d]) - (x->c[d] < y->c[d]);
  return 0;
}

/* *ok = 1 when the boxes' signed corners and the tensor's negated ones cancel everywhere. */
static tdm_status corners_cancel(int nd, const int64_t *shape, int n, const tdm__box *const *boxes, const char *what, int *ok) {
  size_t per = (size_t)1 << nd, m = ((size_t)n + 1) * per;
  corner *v = tdm__malloc(sizeof *v * m);
  if (!v) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory checking %d pieces", what, n);
  for (int i = 0; i <= n; i++)
    for (size_t k = 0; k < per; k++) {
      corner *c = &v[(size_t)i * per + k];
      int ends = 0;
      memset(c->c, 0, sizeof c->c);
      for (int d = 0; d < nd; d++) {
        int64_t st = i < n ? boxes[i]->start[d] : 0, ct = i < n ? boxes[i]->count[d] : shape[d];
        int end = (int)(k >> d) & 1;
        c->c[d] = end ? st + ct : st;
        ends += end;
      }
      c->sign = ((ends & 1) ? -1 : 1) * (i < n ? 1 : -1);
    }
  qsort(v, m, sizeof *v, cmp_corner);
  *ok = 1;
  for (size_t i = 0; i < m && *ok;) {
    size_t j = i;
    long long sum = 0;
    while (j < m && cmp_corner(&v[i], &v[j]) == 0) sum += v[j++].sign;
    if (sum) *ok = 0;
    i = j;
  }
  tdm__free(v);
  return TDM_OK;
}

tdm_status tdm__boxes_tile(int nd, const int64_t *shape, int n, const tdm__box *const *boxes, const char *what,
                           const char *tensor) {
  int64_t numel = 1, sum = 0;
  char a[160], b[160];
  for (int d = 0; d < nd; d++) numel *= shape[d];
  for (int i = 0; i < n; i++) {
    for (int d = 0; d < nd; d++)
      if (boxes[i]->start[d] < 0 || boxes[i]->count[d] < 1 || boxes[i]->count[d] > shape[d] - boxes[i]->start[d]) {
        char sh[96];
        tdm__box_name(tensor, nd, boxes[i], a, sizeof a);
        return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: piece %s is empty or lies outside the tensor's shape %s", what, a,
                              tdm_shape_str(nd, shape, sh, sizeof sh));
      }
  }
  /* Every element exactly once, in O(n 2^nd log n): a box's indicator is the signed sum of its
   * 2^nd corners (sign -1 per end coordinate), so the pieces tile the tensor exactly when their
   * corners, with the tensor's own corners negated, cancel at every point. Only when they do not
   * is the (quadratic) search for the offending pair run, with a bounded amount of work. */
  int ok = 0;
  TDM__TRY(corners_cancel(nd, shape, n, boxes, what, &ok));
  if (ok) return TDM_OK;
  tdm_status st = TDM_OK;
  const tdm__box **s = nd > 0 && n > 1 ? tdm__malloc(sizeof *s * (size_t)n) : NULL;
  if (nd > 0 && n > 1 && !s) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", what);
  for (int i = 0; s && i < n; i++) s[i] = boxes[i];
  if (s) qsort(s, (size_t)n, sizeof *s, cmp_first_dim);
  int64_t budget = 20000000; /* pairs compared: a few tenths of a second at most */
  for (int i = 0; s && i < n && st == TDM_OK && budget > 0; i++)
    for (int j = i + 1; j < n && s[j]->start[0] < s[i]->start[0] + s[i]->count[0] && budget-- > 0; j++) {
      tdm__box x;
      if (!tdm__box_intersect(nd, s[i], s[j], &x)) continue;
      tdm__box_name(tensor, nd, s[i], a, sizeof a);
      tdm__box_name(tensor, nd, s[j], b, sizeof b);
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "%s: pieces %s and %s overlap", what, a, b);
      break;
    }
  tdm__free(s);
  TDM__TRY(st);
  if (nd == 0 && n > 1)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the scalar '%s' has %d pieces; expected one", what, tensor, n);
  for (int i = 0; i < n; i++) sum += tdm__box_numel(nd, boxes[i]); /* each inside the shape: sum < n * numel */
  if (sum != numel)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the pieces of '%s' hold %lld elements; the tensor has %lld", what, tensor,
                          (long long)sum, (long long)numel);
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the %d pieces of '%s' overlap and leave elements out (too many to name "
                        "the pair)", what, n, tensor);
}

/* ---- a growing string -------------------------------------------------------------------------- */
void tdm__sbuf_put(tdm__sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 4096;
    while (nc < b->n + n + 1) nc *= 2;
    char *ns = tdm__malloc(nc);
    if (!ns) {
      b->oom = 1;
      return;
    }
    if (b->n) memcpy(ns, b->s, b->n);
    tdm__free(b->s);
    b->s = ns, b->cap = nc;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

void tdm__sbuf_printf(tdm__sbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k < 0 || k >= (int)sizeof tmp) { /* our formats are short; a long one is a bug, not data */
    b->oom = 1;
    return;
  }
  tdm__sbuf_put(b, tmp, (size_t)k);
}

void tdm__sbuf_json_str(tdm__sbuf *b, const char *s) {
  tdm__sbuf_put(b, "\"", 1);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') {
      char e[2] = {'\\', *s};
      tdm__sbuf_put(b, e, 2);
    } else if ((unsigned char)*s < 0x20) {
      tdm__sbuf_printf(b, "\\u%04x", (unsigned char)*s);
    } else {
      tdm__sbuf_put(b, s, 1);
    }
  }
  tdm__sbuf_put(b, "\"", 1);
}

/* ---- the manifest's JSON ------------------------------------------------------------------------ */
void tdm__manifest_free(tdm_ckpt *c) {
  for (int i = 0; c->files && i < c->n_files; i++) {
    tdm__free(c->files[i].name);
    tdm__free(c->files[i].path);
  }
  for (int i = 0; c->tensors && i < c->n_tensors; i++) {
    tdm__free((char *)c->tensors[i].pub.name);
    tdm__free(c->tensors[i].pieces);
  }
  tdm__free(c->files);
  tdm__free(c->tensors);
  c->files = NULL, c->tensors = NULL, c->n_files = c->n_tensors = 0;
}

static char *dup_str(const char *s) {
  char *d = tdm__malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

/* Only the keys named (a NULL-terminated list) may appear, each once (JSON refuses repeats). */
static tdm_status only_keys(const tdm_json *o, const char *path, const char *where, const char *const *keys) {
  if (o->type != TDM_JSON_OBJ) return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s is not an object", path, where);
  for (int i = 0; i < o->n; i++) {
    int known = 0;
    for (int k = 0; keys[k] && !known; k++) known = !strcmp(o->keys[i], keys[k]);
    if (!known) return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s has an unknown field '%.60s'", path, where, o->keys[i]);
  }
  for (int k = 0; keys[k]; k++)
    if (!tdm__json_get(o, keys[k]))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s lacks '%s'", path, where, keys[k]);
  return TDM_OK;
}

static int get_int(const tdm_json *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  const tdm_json *v = tdm__json_get(o, key);
  if (!v || v->type != TDM_JSON_NUM || !v->is_int || v->inum < lo || v->inum > hi) return 0;
  *out = v->inum;
  return 1;
}

static int get_crc(const tdm_json *o, const char *key, uint32_t *out) {
  const tdm_json *v = tdm__json_get(o, key);
  if (!v || v->type != TDM_JSON_STR || strlen(v->str) != 8) return 0;
  uint32_t x = 0;
  for (int i = 0; i < 8; i++) {
    char ch = v->str[i];
    int h = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (h < 0) return 0;
    x = x * 16 + (uint32_t)h;
  }
  *out = x;
  return 1;
}

/* An array of nd integers in [lo, hi]. */
static int get_dims(const tdm_json *o, const char *key, int nd, int64_t lo, int64_t *out) {
  const tdm_json *v = tdm__json_get(o, key);
  if (!v || v->type != TDM_JSON_ARR || v->n != nd) return 0;
  for (int d = 0; d < nd; d++) {
    const tdm_json *x = &v->items[d];
    if (x->type != TDM_JSON_NUM || !x->is_int || x->inum < lo) return 0;
    out[d] = x->inum;
  }
  return 1;
}

static int dtype_of(const char *name, tdm_dtype *dt) {
  for (int k = 0; k < TDM_DTYPE_COUNT; k++)
    if (!strcmp(name, tdm_dtype_name((tdm_dtype)k))) {
      *dt = (tdm_dtype)k;
      return 1;
    }
  return 0;
}

static tdm_status parse_files(tdm_ckpt *c, const tdm_json *files) {
  const char *path = c->path;
  if (!files || files->type != TDM_JSON_ARR || files->n < 1)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: 'files' is not a non-empty array", path);
  if (files->n != c->info.world_size) /* every rank writes its file, so a missing one is a manifest that lies */
    return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: lists %d file%s; the world of %d rank%s that wrote it has one each", path,
                          files->n, files->n == 1 ? "" : "s", c->info.world_size, c->info.world_size == 1 ? "" : "s");
  if (!(c->files = tdm__calloc((size_t)files->n, sizeof *c->files)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  char shards[64];
  tdm__ckpt_shards_name(c->info.step, shards, sizeof shards);
  static const char *const keys[] = {"path", "rank", "bytes", "header_crc32", NULL};
  for (int i = 0; i < files->n; i++) {
    const tdm_json *f = &files->items[i];
    char where[64];
    snprintf(where, sizeof where, "file %d", i);
    TDM__TRY(only_keys(f, path, where, keys));
    tdm__cfile *cf = &c->files[c->n_files++];
    cf->fd = -1;
    const tdm_json *p = tdm__json_get(f, "path");
    int64_t rank, bytes;
    char want[128];
    if (!get_int(f, "rank", i, i, &rank)) /* in rank order */
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: file %d's rank is not %d (one file per rank, in rank order)", path, i, i);
    /* only the names this tandem writes: a manifest never points outside its shards' directory */
    snprintf(want, sizeof want, "%s/rank-%lld.safetensors", shards, (long long)rank);
    if (p->type != TDM_JSON_STR || strcmp(p->str, want))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: file %d is '%.80s'; expected %s", path, i,
                            p->type == TDM_JSON_STR ? p->str : "(not a string)", want);
    if (!get_int(f, "bytes", 8, INT64_MAX, &bytes) || !get_crc(f, "header_crc32", &cf->header_crc))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: file %s has no valid 'bytes' or 'header_crc32'", path, want);
    cf->bytes = bytes;
    size_t pl = strlen(c->dir) + strlen(want) + 2;
    if (!(cf->name = dup_str(want)) || !(cf->path = tdm__malloc(pl))) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
    snprintf(cf->path, pl, "%s/%s", c->dir, want);
  }
  return TDM_OK;
}

static tdm_status parse_pieces(tdm_ckpt *c, tdm__ctensor *t, const tdm_json *ps) {
  const char *path = c->path, *name = t->pub.name;
  int nd = t->pub.ndim;
  if (!ps || ps->type != TDM_JSON_ARR || ps->n < 1)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: tensor '%s' has no pieces", path, name);
  if (!(t->pieces = tdm__calloc((size_t)ps->n, sizeof *t->pieces))) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  static const char *const keys[] = {"file", "offset", "crc32", "start", "count", NULL};
  size_t es = tdm_dtype_size(t->pub.dtype);
  for (int i = 0; i < ps->n; i++) {
    const tdm_json *o = &ps->items[i];
    char where[300];
    snprintf(where, sizeof where, "piece %d of '%.200s'", i, name);
    TDM__TRY(only_keys(o, path, where, keys));
    tdm__piece *p = &t->pieces[t->pub.n_pieces++];
    int64_t file, off;
    if (!get_int(o, "file", 0, c->n_files - 1, &file) || !get_int(o, "offset", 8, INT64_MAX, &off) || !get_crc(o, "crc32", &p->crc) ||
        !get_dims(o, "start", nd, 0, p->box.start) || !get_dims(o, "count", nd, 1, p->box.count))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s has a bad file, offset, crc32, start or count", path, where);
    for (int d = 0; d < nd; d++)
      if (p->box.start[d] > t->pub.shape[d] || p->box.count[d] > t->pub.shape[d] - p->box.start[d])
        return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s lies outside the tensor", path, where);
    p->file = (int)file, p->offset = off;
    p->nbytes = tdm__box_numel(nd, &p->box) * (int64_t)es; /* inside the shape: no overflow */
    const tdm__cfile *f = &c->files[p->file];
    if (p->nbytes > f->bytes - p->offset)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s (bytes %lld..%lld) runs past the end of %s (%lld bytes)", path,
                            where, (long long)p->offset, (long long)(p->offset + p->nbytes), f->name, (long long)f->bytes);
    c->files[p->file].n_pieces++;
  }
  const tdm__box **bs = tdm__malloc(sizeof *bs * (size_t)t->pub.n_pieces);
  if (!bs) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int i = 0; i < t->pub.n_pieces; i++) bs[i] = &t->pieces[i].box;
  tdm_status st = tdm__boxes_tile(nd, t->pub.shape, t->pub.n_pieces, bs, path, name);
  tdm__free(bs);
  return st == TDM_OK ? TDM_OK : tdm__set_error(TDM_ERR_FORMAT, "%s: the manifest is corrupt", tdm_last_error());
}

static tdm_status parse_tensors(tdm_ckpt *c, const tdm_json *ts) {
  const char *path = c->path;
  if (!ts || ts->type != TDM_JSON_ARR) return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: 'tensors' is not an array", path);
  if (!(c->tensors = tdm__calloc((size_t)(ts->n ? ts->n : 1), sizeof *c->tensors)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  static const char *const keys[] = {"name", "dtype", "shape", "pieces", NULL};
  for (int i = 0; i < ts->n; i++) {
    const tdm_json *o = &ts->items[i];
    char where[32];
    snprintf(where, sizeof where, "tensor %d", i);
    TDM__TRY(only_keys(o, path, where, keys));
    tdm__ctensor *t = &c->tensors[c->n_tensors++];
    const tdm_json *nm = tdm__json_get(o, "name"), *dt = tdm__json_get(o, "dtype"), *sh = tdm__json_get(o, "shape");
    if (nm->type != TDM_JSON_STR || !nm->str[0] || dt->type != TDM_JSON_STR || !dtype_of(dt->str, &t->pub.dtype) ||
        sh->type != TDM_JSON_ARR || sh->n > TDM_MAX_DIMS)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: %s has a bad name, dtype or shape", path, where);
    if (!(t->pub.name = dup_str(nm->str))) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
    t->pub.ndim = sh->n;
    int64_t bytes = (int64_t)tdm_dtype_size(t->pub.dtype);
    if (!get_dims(o, "shape", sh->n, 0, t->pub.shape))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: tensor '%s' has a bad shape", path, t->pub.name);
    for (int d = 0; d < sh->n; d++)
      if (__builtin_mul_overflow(bytes, t->pub.shape[d], &bytes))
        return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: tensor '%s' is too large", path, t->pub.name);
    for (int j = 0; j < i; j++)
      if (!strcmp(c->tensors[j].pub.name, t->pub.name))
        return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: tensor '%s' is listed twice", path, t->pub.name);
    if (bytes == 0) return tdm__set_error(TDM_ERR_FORMAT, "%s: manifest: tensor '%s' is empty", path, t->pub.name);
    TDM__TRY(parse_pieces(c, t, tdm__json_get(o, "pieces")));
  }
  return TDM_OK;
}

tdm_status tdm__manifest_parse(tdm_ckpt *c, const char *text, size_t n) {
  tdm_json *j = NULL;
  tdm_status st = tdm__json_parse(text, n, &j);
  if (st != TDM_OK) return st == TDM_ERR_FORMAT ? tdm__set_error(st, "%s: manifest: %s", c->path, tdm_last_error()) : st;
  static const char *const keys[] = {"files", "tensors", NULL};
  st = only_keys(j, c->path, "the manifest", keys);
  if (st == TDM_OK) st = parse_files(c, tdm__json_get(j, "files"));
  if (st == TDM_OK) st = parse_tensors(c, tdm__json_get(j, "tensors"));
  tdm__json_free(j);
  return st;
}
