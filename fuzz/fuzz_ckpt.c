/* Checkpoints (format 3) as a resume reads them: a manifest and the rank files it lists, through
 * tdm_ckpt_open (the manifest's version, checksum, strict metadata, the JSON of files, tensors and
 * pieces: ranks in the world, paths, boxes inside their tensor, pieces that tile it, file indices,
 * offsets inside the files; every listed file a regular file of the listed size), then
 * tdm_ckpt_verify_data (each rank file's header against the manifest, each piece's CRC-32) and
 * reads of every tensor (tdm_ckpt_read_flat, tdm_ckpt_read_box) across its pieces.
 *
 * An input is a bundle of files, each a u32 little-endian length and its bytes (a length past
 * the end takes the rest): the manifest, then the files of ranks 0, 1, ... (at most 8). They are
 * written into a private directory as ckpt-<step>.safetensors and ckpt-<step>.shards/rank-<r>
 * .safetensors, the step read from the manifest's metadata (0 when it has none). Each input is
 * opened as it is, and again re-signed: the manifest's "tandem.crc32" recomputed and, in its
 * JSON, each file's "bytes" and "header_crc32" and each piece's "crc32" set to what the given
 * files hold, so that mutations get past the checksums to the checks behind them.
 *
 * After a successful open: the metadata canonical and in range, the checksum the one computed
 * here; every file listed once, named after its rank, of its real size; every tensor's pieces
 * inside it, in their file, of count x element size bytes, and covering every element exactly
 * once (counted here element by element). After a successful verification: every header and
 * piece matches its CRC-32 as computed here. A read that succeeds returns exactly the bytes the
 * pieces hold (assembled here element by element); one that fails is TDM_ERR_FORMAT or
 * TDM_ERR_IO after a verification that failed too. Every failure is TDM_ERR_FORMAT or TDM_ERR_IO
 * whose message starts with the path of a file in the directory.
 * TANDEM_FUZZ_CKPT_SEEDS=DIR writes the seeds (fuzz/corpus/ckpt) into DIR: checkpoints written by
 * the library (1 rank; 2 ranks at ZeRO stage 3; 3 ranks of boxes of every kind), and copies
 * edited to hold one fault each. */
#include "fuzz.h" /* first: _GNU_SOURCE (memmem) */

#include <pthread.h>

#include "core/json.h"
#include "tandem/tandem.h"
#include "train/ckpt_impl.h"

#define MAX_PARTS 9 /* the manifest and 8 ranks */
#define DEFAULT_STEP 0

typedef struct {
  const uint8_t *p;
  size_t n;
} part;

static char dir[300];
static int verbose; /* TANDEM_FUZZ_VERBOSE=1: say what each open and verification gave */

static int split(const uint8_t *d, size_t n, part *parts) {
  int k = 0;
  while (k < MAX_PARTS && n >= 4) {
    uint32_t len = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
    d += 4, n -= 4;
    if (len > n) len = (uint32_t)n;
    parts[k].p = d, parts[k].n = len, k++;
    d += len, n -= len;
  }
  return k;
}

static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

static uint64_t le64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
  return v;
}

/* ---- the files of one input ------------------------------------------------------------------------- */
static char written[MAX_PARTS + 1][512];
static int n_written;

static void clear_dir(void) {
  for (int i = n_written - 1; i >= 0; i--) remove(written[i]); /* files, then the shards directory */
  n_written = 0;
}

static void manifest_path(int64_t step, char *out, size_t n) { snprintf(out, n, "%s/ckpt-%012lld.safetensors", dir, (long long)step); }

static void write_files(int64_t step, const part *parts, int np, const uint8_t *manifest, size_t mn) {
  clear_dir();
  char sd[400];
  snprintf(sd, sizeof sd, "%s/ckpt-%012lld.shards", dir, (long long)step);
  FUZZ_CHECK(mkdir(sd, 0700) == 0);
  snprintf(written[n_written++], 512, "%s", sd);
  for (int r = 0; r + 1 < np; r++) {
    snprintf(written[n_written], 512, "%s/rank-%d.safetensors", sd, r);
    fuzz_write(written[n_written++], parts[r + 1].p, parts[r + 1].n);
  }
  manifest_path(step, written[n_written], 512);
  fuzz_write(written[n_written++], manifest, mn);
}

/* ---- the checks ---------------------------------------------------------------------------------------- */
static int canonical(const char *meta, unsigned long long v) {
  char s[32];
  snprintf(s, sizeof s, "%llu", v);
  return meta && !strcmp(meta, s);
}

static void check_failure(tdm_status st) {
  FUZZ_CHECK(st == TDM_ERR_FORMAT || st == TDM_ERR_IO);
  FUZZ_CHECK(starts_with(tdm_last_error(), dir));
}

/* The rank file a manifest's file entry names (the bytes written for it). */
static const part *file_part(const tdm_ckpt *c, int fi, const part *parts, int np) {
  const char *slash = strrchr(c->files[fi].name, '/');
  int r = -1;
  FUZZ_CHECK(slash && sscanf(slash + 1, "rank-%d.safetensors", &r) == 1 && r >= 0);
  FUZZ_CHECK(r + 1 < np); /* opened: it exists */
  return &parts[r + 1];
}

/* Every element of the tensor, assembled from its pieces' bytes here: exp (numel x es bytes). */
static void assemble(const tdm__ctensor *t, const tdm_ckpt *c, const part *parts, int np, uint8_t *exp, uint8_t *seen) {
  int nd = t->pub.ndim;
  size_t es = tdm_dtype_size(t->pub.dtype);
  for (int i = 0; i < t->pub.n_pieces; i++) {
    const tdm__piece *p = &t->pieces[i];
    const part *f = file_part(c, p->file, parts, np);
    int64_t n = tdm__box_numel(nd, &p->box);
    for (int64_t e = 0; e < n; e++) {
      int64_t rem = e, flat = 0, mul = 1;
      for (int d = nd - 1; d >= 0; d--) {
        int64_t idx = p->box.start[d] + rem % p->box.count[d];
        rem /= p->box.count[d];
        flat += idx * mul;
        mul *= t->pub.shape[d];
      }
      FUZZ_CHECK(!seen[flat]); /* no element twice */
      seen[flat] = 1;
      memcpy(exp + flat * (int64_t)es, f->p + p->offset + e * (int64_t)es, es);
    }
  }
}

static void check_reads(tdm_ckpt *c, const part *parts, int np, int verified) {
  for (int ti = 0; ti < c->n_tensors; ti++) {
    const tdm__ctensor *t = &c->tensors[ti];
    int nd = t->pub.ndim;
    size_t es = tdm_dtype_size(t->pub.dtype);
    int64_t numel = 1;
    for (int d = 0; d < nd; d++) numel *= t->pub.shape[d];
    uint8_t *exp = malloc((size_t)numel * es), *got = malloc((size_t)numel * es + 1), *seen = calloc((size_t)numel, 1);
    FUZZ_CHECK(exp && got && seen);
    assemble(t, c, parts, np, exp, seen);
    for (int64_t e = 0; e < numel; e++) FUZZ_CHECK(seen[e]); /* every element once */
    /* the whole tensor, a flat range across pieces, and a box in its middle */
    int64_t lo = numel / 3, hi = numel - numel / 4, start[TDM_MAX_DIMS], count[TDM_MAX_DIMS], bn = 1;
    for (int d = 0; d < nd; d++) {
      start[d] = t->pub.shape[d] / 3;
      count[d] = t->pub.shape[d] - start[d] - t->pub.shape[d] / 4;
      bn *= count[d];
    }
    for (int k = 0; k < 3; k++) {
      tdm_status st = k == 0 ? tdm_ckpt_read_flat(c, t->pub.name, 0, numel, got)
                      : k == 1 ? tdm_ckpt_read_flat(c, t->pub.name, lo, hi, got)
                               : tdm_ckpt_read_box(c, t->pub.name, start, count, got);
      if (st != TDM_OK) {
        FUZZ_CHECK(!verified);
        check_failure(st);
        continue;
      }
      if (k < 2) {
        int64_t from = k ? lo : 0, to = k ? hi : numel;
        FUZZ_CHECK(!memcmp(got, exp + from * (int64_t)es, (size_t)(to - from) * es));
        continue;
      }
      for (int64_t e = 0; e < bn; e++) { /* element e of the box, row-major over it */
        int64_t rem = e, flat = 0, mul = 1;
        for (int d = nd - 1; d >= 0; d--) {
          flat += (start[d] + rem % count[d]) * mul;
          rem /= count[d];
          mul *= t->pub.shape[d];
        }
        FUZZ_CHECK(!memcmp(got + e * (int64_t)es, exp + flat * (int64_t)es, es));
      }
    }
    free(exp), free(got), free(seen);
  }
}

/* Whether the checkpoint verified whole. */
static int check_manifest(tdm_ckpt *c, const char *path, const part *parts, int np) {
  const tdm_ckpt_info *in = tdm_ckpt_get_info(c);
  int64_t os = tdm_ckpt_get_optim_steps(c);
  FUZZ_CHECK(in->step >= 0 && in->step <= TDM__CKPT_MAX_STEP && os >= 0 && os <= TDM__CKPT_MAX_STEP);
  FUZZ_CHECK(in->world_size >= 1 && in->world_size <= TDM__CKPT_MAX_WORLD);
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.step"), (unsigned long long)in->step));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.optim_steps"), (unsigned long long)os));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.world_size"), (unsigned long long)in->world_size));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.seed"), (unsigned long long)in->seed));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.data_epoch"), (unsigned long long)in->data_epoch));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.data_offset"), (unsigned long long)in->data_offset));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.ckpt_version"), TDM_CKPT_VERSION));
  FUZZ_CHECK(!strcmp(tdm_ckpt_meta(c, "tandem.kind"), "checkpoint") && tdm_ckpt_meta(c, "tandem.layout"));
  /* the checksum, over the file as read here */
  tdm_safetensors *f;
  FUZZ_CHECK(tdm_safetensors_load(&f, path) == TDM_OK);
  FUZZ_CHECK(tdm_safetensors_count(f) == 1);
  const tdm_st_tensor *m = tdm_safetensors_at(f, 0);
  FUZZ_CHECK(!strcmp(m->name, TDM__CKPT_MANIFEST) && m->dtype == TDM_U8 && m->ndim == 1);
  int nm = tdm_ckpt_meta_count(c);
  const char **kv = malloc(sizeof *kv * (2 * (size_t)nm + 1));
  FUZZ_CHECK(kv);
  for (int i = 0; i < nm; i++) kv[2 * i] = tdm_ckpt_meta_at(c, i, &kv[2 * i + 1]);
  uint32_t crc;
  char hex[16];
  FUZZ_CHECK(tdm_ckpt_checksum(nm, kv, 1, m, &crc) == TDM_OK && crc == tdm_ckpt_get_crc(c));
  snprintf(hex, sizeof hex, "%08x", crc);
  FUZZ_CHECK(!strcmp(tdm_ckpt_meta(c, "tandem.crc32"), hex));
  free(kv);
  tdm_safetensors_destroy(f);
  /* the files: one per rank, in rank order, each of its real size */
  FUZZ_CHECK(c->n_files == in->world_size);
  int pieces_in_files = 0, pieces = 0;
  for (int i = 0; i < c->n_files; i++) {
    char want[128];
    const part *fp = file_part(c, i, parts, np);
    snprintf(want, sizeof want, "ckpt-%012lld.shards/rank-%d.safetensors", (long long)in->step, (int)(fp - parts) - 1);
    FUZZ_CHECK(!strcmp(c->files[i].name, want) && (int)(fp - parts) - 1 == i);
    FUZZ_CHECK(c->files[i].bytes == (int64_t)fp->n);
    for (int j = 0; j < i; j++) FUZZ_CHECK(strcmp(c->files[i].name, c->files[j].name));
    pieces_in_files += c->files[i].n_pieces;
  }
  /* the tensors: named once, every piece a box inside the tensor and inside its file (tiling:
   * check_reads counts every element) */
  for (int ti = 0; ti < c->n_tensors; ti++) {
    const tdm__ctensor *t = &c->tensors[ti];
    FUZZ_CHECK(t->pub.name[0] && t->pub.ndim >= 0 && t->pub.ndim <= TDM_MAX_DIMS && t->pub.n_pieces >= 1);
    for (int j = 0; j < ti; j++) FUZZ_CHECK(strcmp(t->pub.name, c->tensors[j].pub.name));
    for (int d = 0; d < t->pub.ndim; d++) FUZZ_CHECK(t->pub.shape[d] >= 1);
    for (int i = 0; i < t->pub.n_pieces; i++) {
      const tdm__piece *p = &t->pieces[i];
      FUZZ_CHECK(p->file >= 0 && p->file < c->n_files);
      for (int d = 0; d < t->pub.ndim; d++)
        FUZZ_CHECK(p->box.start[d] >= 0 && p->box.count[d] >= 1 && p->box.start[d] + p->box.count[d] <= t->pub.shape[d]);
      FUZZ_CHECK(p->nbytes == tdm__box_numel(t->pub.ndim, &p->box) * (int64_t)tdm_dtype_size(t->pub.dtype));
      FUZZ_CHECK(p->offset >= 8 && p->offset + p->nbytes <= c->files[p->file].bytes);
    }
    pieces += t->pub.n_pieces;
  }
  FUZZ_CHECK(pieces == pieces_in_files);
  /* the data */
  tdm_status st = tdm_ckpt_verify_data(c);
  if (verbose) fprintf(stderr, "    verify: %s\n", st == TDM_OK ? "ok" : tdm_last_error());
  if (st != TDM_OK) check_failure(st);
  else {
    for (int i = 0; i < c->n_files; i++) {
      const part *fp = file_part(c, i, parts, np);
      uint64_t hlen = le64(fp->p);
      FUZZ_CHECK(hlen <= fp->n - 8 && tdm__crc32(0, fp->p, (int64_t)hlen + 8) == c->files[i].header_crc);
    }
    for (int ti = 0; ti < c->n_tensors; ti++)
      for (int i = 0; i < c->tensors[ti].pub.n_pieces; i++) {
        const tdm__piece *p = &c->tensors[ti].pieces[i];
        FUZZ_CHECK(tdm__crc32(0, file_part(c, p->file, parts, np)->p + p->offset, p->nbytes) == p->crc);
      }
  }
  check_reads(c, parts, np, st == TDM_OK);
  return st == TDM_OK;
}

/* Whether the checkpoint opened and verified whole. */
static int check_open(const char *path, const part *parts, int np, const char *how) {
  tdm_ckpt *c = (tdm_ckpt *)1;
  tdm_status st = tdm_ckpt_open(&c, path);
  if (verbose) fprintf(stderr, "  %s: open: %s\n", how, st == TDM_OK ? "ok" : tdm_last_error());
  if (st != TDM_OK) {
    FUZZ_CHECK(c == NULL);
    check_failure(st);
    return 0;
  }
  int whole = check_manifest(c, path, parts, np);
  tdm_ckpt_close(c);
  return whole;
}

/* ---- re-signing ------------------------------------------------------------------------------------------ */
static const tdm_json *get(const tdm_json *o, const char *key) { return o && o->type == TDM_JSON_OBJ ? tdm__json_get(o, key) : NULL; }
static int get_i(const tdm_json *o, const char *key, int64_t *v) {
  const tdm_json *x = get(o, key);
  if (!x || x->type != TDM_JSON_NUM || !x->is_int) return 0;
  return *v = x->inum, 1;
}

typedef struct {
  const part *parts;
  int np;
  const tdm_json *files;
  int fix; /* set bytes and checksums to the files' */
} resign_ctx;

/* The rank file that files[fi] names, or NULL. */
static const part *listed(const resign_ctx *x, int64_t fi) {
  int64_t r;
  if (!x->files || x->files->type != TDM_JSON_ARR || fi < 0 || fi >= x->files->n || !get_i(&x->files->items[fi], "rank", &r) ||
      r < 0 || r + 1 >= x->np)
    return NULL;
  return &x->parts[r + 1];
}

static void emit(tdm__sbuf *b, const tdm_json *v, const resign_ctx *x, int kind, size_t es);

/* kind: 0 any, 1 the root, 2 a file, 3 a tensor, 4 a piece (es: its element size) */
static void emit_obj(tdm__sbuf *b, const tdm_json *v, const resign_ctx *x, int kind, size_t es) {
  char over[3][32] = {"", "", ""}; /* bytes, header_crc32, crc32 */
  if (x->fix && kind == 2) {
    int64_t r;
    if (get_i(v, "rank", &r) && r >= 0 && r + 1 < x->np) {
      const part *p = &x->parts[r + 1];
      snprintf(over[0], 32, "%zu", p->n);
      if (p->n >= 8 && le64(p->p) <= p->n - 8) snprintf(over[1], 32, "\"%08x\"", tdm__crc32(0, p->p, (int64_t)le64(p->p) + 8));
    }
  }
  if (x->fix && kind == 4) {
    int64_t fi, off, n = (int64_t)es;
    const tdm_json *cnt = get(v, "count");
    const part *p = get_i(v, "file", &fi) && get_i(v, "offset", &off) && off >= 0 ? listed(x, fi) : NULL;
    for (int d = 0; p && cnt && cnt->type == TDM_JSON_ARR && d < cnt->n; d++)
      if (cnt->items[d].type != TDM_JSON_NUM || !cnt->items[d].is_int || cnt->items[d].inum < 0 ||
          __builtin_mul_overflow(n, cnt->items[d].inum, &n))
        p = NULL;
    if (p && cnt && es && off <= (int64_t)p->n && n <= (int64_t)p->n - off) snprintf(over[2], 32, "\"%08x\"", tdm__crc32(0, p->p + off, n));
  }
  tdm__sbuf_put(b, "{", 1);
  for (int i = 0; i < v->n; i++) {
    const char *k = v->keys[i];
    if (i) tdm__sbuf_put(b, ",", 1);
    tdm__sbuf_json_str(b, k);
    tdm__sbuf_put(b, ":", 1);
    const char *o = kind == 2 && !strcmp(k, "bytes")          ? over[0]
                    : kind == 2 && !strcmp(k, "header_crc32") ? over[1]
                    : kind == 4 && !strcmp(k, "crc32")        ? over[2]
                                                              : "";
    if (o[0]) tdm__sbuf_put(b, o, strlen(o));
    else if (kind == 1 && !strcmp(k, "files") && v->items[i].type == TDM_JSON_ARR) {
      tdm__sbuf_put(b, "[", 1);
      for (int j = 0; j < v->items[i].n; j++) {
        if (j) tdm__sbuf_put(b, ",", 1);
        emit(b, &v->items[i].items[j], x, 2, 0);
      }
      tdm__sbuf_put(b, "]", 1);
    } else if (kind == 1 && !strcmp(k, "tensors") && v->items[i].type == TDM_JSON_ARR) {
      tdm__sbuf_put(b, "[", 1);
      for (int j = 0; j < v->items[i].n; j++) {
        if (j) tdm__sbuf_put(b, ",", 1);
        emit(b, &v->items[i].items[j], x, 3, 0);
      }
      tdm__sbuf_put(b, "]", 1);
    } else if (kind == 3 && !strcmp(k, "pieces") && v->items[i].type == TDM_JSON_ARR) {
      const tdm_json *dt = get(v, "dtype");
      size_t tes = 0;
      for (int d = 0; dt && dt->type == TDM_JSON_STR && d < TDM_DTYPE_COUNT; d++)
        if (!strcmp(dt->str, tdm_dtype_name((tdm_dtype)d))) tes = tdm_dtype_size((tdm_dtype)d);
      tdm__sbuf_put(b, "[", 1);
      for (int j = 0; j < v->items[i].n; j++) {
        if (j) tdm__sbuf_put(b, ",", 1);
        emit(b, &v->items[i].items[j], x, 4, tes);
      }
      tdm__sbuf_put(b, "]", 1);
    } else {
      emit(b, &v->items[i], x, 0, 0);
    }
  }
  tdm__sbuf_put(b, "}", 1);
}

static void emit(tdm__sbuf *b, const tdm_json *v, const resign_ctx *x, int kind, size_t es) {
  switch (v->type) {
  case TDM_JSON_NULL: tdm__sbuf_put(b, "null", 4); break;
  case TDM_JSON_BOOL: v->num ? tdm__sbuf_put(b, "true", 4) : tdm__sbuf_put(b, "false", 5); break;
  case TDM_JSON_NUM:
    if (v->is_int) tdm__sbuf_printf(b, "%lld", (long long)v->inum);
    else tdm__sbuf_printf(b, "%.17g", v->num);
    break;
  case TDM_JSON_STR: tdm__sbuf_json_str(b, v->str); break;
  case TDM_JSON_ARR:
    tdm__sbuf_put(b, "[", 1);
    for (int i = 0; i < v->n; i++) {
      if (i) tdm__sbuf_put(b, ",", 1);
      emit(b, &v->items[i], x, 0, 0);
    }
    tdm__sbuf_put(b, "]", 1);
    break;
  case TDM_JSON_OBJ: emit_obj(b, v, x, kind, es); break;
  }
}

/* Writes to path the manifest parts[0] (a safetensors file) with its JSON's file sizes and
 * checksums set to the files' (fix) and "tandem.crc32" recomputed. 0 when parts[0] is not a
 * safetensors file with string metadata. */
static int resign(const char *path, const part *parts, int np, int fix) {
  tdm_safetensors *f = NULL;
  tdm_json *h = NULL, *j = NULL;
  if (tdm_safetensors_parse(&f, parts[0].p, parts[0].n, "fuzz") != TDM_OK) return 0;
  FUZZ_CHECK(tdm__json_parse((const char *)parts[0].p + 8, le64(parts[0].p), &h) == TDM_OK); /* the reader took it */
  const tdm_json *m = get(h, "__metadata__");
  int n = m && m->type == TDM_JSON_OBJ ? m->n : 0, nt = tdm_safetensors_count(f), ok = 1;
  const char **kv = malloc(sizeof *kv * (2 * (size_t)n + 2));
  tdm_st_tensor *ts = malloc(sizeof *ts * ((size_t)nt + 1));
  FUZZ_CHECK(kv && ts);
  for (int i = 0; i < n; i++) {
    ok &= m->items[i].type == TDM_JSON_STR;
    kv[2 * i] = m->keys[i], kv[2 * i + 1] = m->items[i].str ? m->items[i].str : "";
  }
  tdm__sbuf b = {0};
  for (int i = 0; ok && i < nt; i++) {
    ts[i] = *tdm_safetensors_at(f, i);
    if (strcmp(ts[i].name, TDM__CKPT_MANIFEST) || ts[i].dtype != TDM_U8 || ts[i].ndim != 1 ||
        tdm__json_parse(ts[i].data, (size_t)ts[i].nbytes, &j) != TDM_OK)
      continue;
    resign_ctx x = {parts, np, get(j, "files"), fix};
    emit(&b, j, &x, j->type == TDM_JSON_OBJ ? 1 : 0, 0);
    FUZZ_CHECK(!b.oom);
    ts[i].data = b.s, ts[i].nbytes = ts[i].shape[0] = (int64_t)b.n;
  }
  int k = 0;
  while (k < n && strcmp(kv[2 * k], "tandem.crc32")) k++;
  if (k == n) kv[2 * n++] = "tandem.crc32";
  uint32_t crc = 0;
  char hex[16];
  FUZZ_CHECK(!ok || tdm_ckpt_checksum(n, kv, nt, ts, &crc) == TDM_OK);
  snprintf(hex, sizeof hex, "%08x", crc);
  kv[2 * k + 1] = hex;
  ok = ok && tdm_safetensors_save(path, nt, ts, n, kv) == TDM_OK;
  tdm__free(b.s); /* the library's allocator */
  free(kv);
  free(ts);
  tdm__json_free(j);
  tdm__json_free(h);
  tdm_safetensors_destroy(f);
  return ok;
}

/* ---- one input ---------------------------------------------------------------------------------------- */
static int64_t step_of(const part *m) {
  tdm_safetensors *f = NULL;
  uint64_t step = DEFAULT_STEP;
  if (tdm_safetensors_parse(&f, m->p, m->n, "fuzz") == TDM_OK &&
      !tdm__ckpt_parse_u64(tdm_safetensors_meta(f, "tandem.step"), 0, (uint64_t)TDM__CKPT_MAX_STEP, &step))
    step = DEFAULT_STEP;
  tdm_safetensors_destroy(f);
  return (int64_t)step;
}

static uint8_t *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  FUZZ_CHECK(f != NULL);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)len + 1);
  FUZZ_CHECK(b && fread(b, 1, (size_t)len, f) == (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void seeds(const char *out);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "%s", fuzz_tmpdir());
    verbose = getenv("TANDEM_FUZZ_VERBOSE") != NULL;
    const char *out = getenv("TANDEM_FUZZ_CKPT_SEEDS");
    if (out) seeds(out);
  }
  part parts[MAX_PARTS];
  int np = split(data, size, parts);
  if (np == 0) return 0;
  int64_t step = step_of(&parts[0]);
  char mpath[400];
  manifest_path(step, mpath, sizeof mpath);
  write_files(step, parts, np, parts[0].p, parts[0].n);
  /* re-signed, a checkpoint that verified as given is the same one (its JSON spaced otherwise) */
  if (!check_open(mpath, parts, np, "as given") && resign(mpath, parts, np, 1)) {
    size_t n;
    uint8_t *b = read_all(mpath, &n);
    if (n != parts[0].n || memcmp(b, parts[0].p, n)) check_open(mpath, parts, np, "re-signed");
    free(b);
  }
  clear_dir();
  return 0;
}

/* ---- the seeds ---------------------------------------------------------------------------------------------- */
/* Packs DIR's newest checkpoint of step (manifest, then its rank files) into out/name, with the
 * manifest's text `from` replaced by `to` (re-signed) when given, and `edit` applied. */
typedef void (*edit_fn)(part *parts, int *np, uint8_t **owned);

static void pack(const char *out, const char *name, const char *src, int64_t step, const char *from, const char *to, edit_fn edit) {
  char p[800];
  part parts[MAX_PARTS];
  uint8_t *owned[MAX_PARTS] = {0};
  int np = 0;
  size_t n;
  snprintf(p, sizeof p, "%s/ckpt-%012lld.safetensors", src, (long long)step);
  owned[np] = read_all(p, &n), parts[np].p = owned[np], parts[np].n = n, np++;
  for (int r = 0; r < MAX_PARTS - 1; r++) {
    snprintf(p, sizeof p, "%s/ckpt-%012lld.shards/rank-%d.safetensors", src, (long long)step, r);
    if (access(p, F_OK)) break;
    owned[np] = read_all(p, &n), parts[np].p = owned[np], parts[np].n = n, np++;
  }
  if (from) { /* the JSON's text (or "meta:KEY": a metadata value) edited, the metadata signed again */
    tdm_safetensors *f = NULL;
    tdm_json *h = NULL;
    FUZZ_CHECK(tdm_safetensors_parse(&f, owned[0], parts[0].n, "seed") == TDM_OK);
    FUZZ_CHECK(tdm__json_parse((const char *)owned[0] + 8, le64(owned[0]), &h) == TDM_OK);
    const tdm_st_tensor *t = tdm_safetensors_find(f, TDM__CKPT_MANIFEST);
    const tdm_json *meta = get(h, "__metadata__");
    const char **kv = malloc(sizeof *kv * (2 * (size_t)meta->n + 2));
    int nm = meta->n, is_meta = starts_with(from, "meta:");
    for (int i = 0; i < nm; i++) {
      kv[2 * i] = meta->keys[i], kv[2 * i + 1] = meta->items[i].str;
      if (is_meta && !strcmp(kv[2 * i], from + 5)) kv[2 * i + 1] = to;
    }
    size_t fl = strlen(from), tl = strlen(to), jn = (size_t)t->nbytes;
    char *text = malloc(jn + tl + 1);
    memcpy(text, t->data, jn);
    if (!is_meta) {
      char *at = memmem(text, jn, from, fl);
      FUZZ_CHECK(at != NULL);
      memmove(at + tl, at + fl, jn - (size_t)(at - text) - fl);
      memcpy(at, to, tl);
      jn = jn - fl + tl;
    }
    tdm_st_tensor nt = *t;
    nt.data = text, nt.nbytes = nt.shape[0] = (int64_t)jn;
    uint32_t crc;
    char hex[16];
    FUZZ_CHECK(tdm_ckpt_checksum(nm, kv, 1, &nt, &crc) == TDM_OK);
    snprintf(hex, sizeof hex, "%08x", crc);
    for (int i = 0; i < nm; i++)
      if (!strcmp(kv[2 * i], "tandem.crc32")) kv[2 * i + 1] = hex;
    snprintf(p, sizeof p, "%s/edited.safetensors", dir);
    FUZZ_CHECK(tdm_safetensors_save(p, 1, &nt, nm, kv) == TDM_OK);
    free(kv), free(text);
    tdm__json_free(h);
    tdm_safetensors_destroy(f);
    free(owned[0]);
    owned[0] = read_all(p, &n), parts[0].p = owned[0], parts[0].n = n;
    remove(p);
  }
  if (edit) edit(parts, &np, owned);
  size_t total = 0;
  for (int i = 0; i < np; i++) total += 4 + parts[i].n;
  uint8_t *b = malloc(total), *w = b;
  for (int i = 0; i < np; i++) {
    uint32_t l = (uint32_t)parts[i].n;
    for (int k = 0; k < 4; k++) *w++ = (uint8_t)(l >> (8 * k));
    memcpy(w, parts[i].p, parts[i].n), w += parts[i].n;
  }
  snprintf(p, sizeof p, "%s/%s", out, name);
  fuzz_write(p, b, total);
  free(b);
  for (int i = 0; i < MAX_PARTS; i++) free(owned[i]);
}

static void flip_last_byte_of_rank1(part *parts, int *np, uint8_t **owned) {
  (void)np;
  owned[2][parts[2].n - 1] ^= 1; /* a piece's byte */
}
static void flip_header_of_rank1(part *parts, int *np, uint8_t **owned) {
  (void)np;
  uint8_t *at = memmem(owned[2], parts[2].n, "\"tandem.rank\":\"1\"", 17);
  FUZZ_CHECK(at != NULL);
  at[15] = '0'; /* rank 1's file says rank 0: the header's checksum no longer matches */
}
static void truncate_rank1(part *parts, int *np, uint8_t **owned) {
  (void)owned;
  (void)np;
  parts[2].n -= 4;
}
static void drop_rank1(part *parts, int *np, uint8_t **owned) {
  (void)parts, (void)owned;
  *np = 2;
}
static void swap_ranks(part *parts, int *np, uint8_t **owned) {
  (void)np, (void)owned;
  part t = parts[1];
  parts[1] = parts[2], parts[2] = t;
}

/* ranks as threads over the thread transport */
typedef struct {
  int r, P;
  void *group;
  const char *dir;
  int kind; /* 0: an engine at ZeRO stage 3; 1: boxes of every kind */
} seed_rank;

static void *seed_rank_main(void *va) {
  seed_rank *a = va;
  tdm_comm_t comm = NULL;
  tdm_comm_config cc = {0};
  cc.rank = a->r, cc.size = a->P, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
  FUZZ_CHECK(tdm_comm_create(&comm, &cc) == TDM_OK);
  if (a->kind == 0) {
    tdm_model_config mc = tdm_model_config_mlp();
    mc.in_features = 6, mc.n_hidden = 1, mc.hidden[0] = 5, mc.n_classes = 3;
    tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAM);
    tdm_engine_config ec = tdm_engine_config_default();
    ec.kind = TDM_ENGINE_ZERO, ec.zero.stage = 3, ec.zero.bucket_bytes = 64;
    tdm_grid *g = NULL;
    tdm_engine *e = NULL;
    FUZZ_CHECK(tdm_grid_create(&g, comm, 0, 1, 1) == TDM_OK);
    FUZZ_CHECK(tdm_engine_create(&e, &mc, 7, &oc, g, &ec) == TDM_OK);
    tdm_ckpt_info ci = {.step = 3, .seed = 7, .data_epoch = 1, .data_offset = 24};
    FUZZ_CHECK(tdm_ckpt_save_engine(a->dir, e, &ci, 2) == TDM_OK);
    tdm_engine_destroy(e);
    tdm_grid_destroy(g);
  } else {
    int r = a->r, P = a->P;
    tdm_ckpt_info ci = {.step = 4, .seed = 9, .data_epoch = 0, .data_offset = 17, .layout = "threads"};
    tdm_ckpt_writer *w;
    FUZZ_CHECK(tdm_ckpt_writer_create(&w, a->dir, &ci, 4, comm) == TDM_OK);
    static const int64_t col_shape[2] = {4, 3}, cube_shape[3] = {2, 2, 3}, flat_shape[2] = {3, 5}, i64_shape[1] = {2};
    float col[12], cube[12], flat[15], scalar = 0.5f;
    uint16_t half[15];
    for (int i = 0; i < 15; i++) col[i % 12] = cube[i % 12] = flat[i] = (float)(r * 100 + i), half[i] = (uint16_t)(0x3f80 + i);
    int64_t cs[2] = {0, 3 * r / P}, cc2[2] = {4, 3 * (r + 1) / P - 3 * r / P}; /* columns */
    int64_t bs[3] = {r % 2, 0, 0}, bc[3] = {1, 2, 3};                          /* blocks of rows */
    int64_t lo = 15 * r / P, hi = 15 * (r + 1) / P;                            /* flat spans */
    FUZZ_CHECK(tdm_ckpt_writer_tensor(w, "col", TDM_F32, 2, col_shape) == TDM_OK);
    FUZZ_CHECK(tdm_ckpt_writer_tensor(w, "cube", TDM_F32, 3, cube_shape) == TDM_OK);
    FUZZ_CHECK(tdm_ckpt_writer_tensor(w, "flat", TDM_BF16, 2, flat_shape) == TDM_OK);
    FUZZ_CHECK(tdm_ckpt_writer_tensor(w, "scalar", TDM_F32, 0, NULL) == TDM_OK);
    FUZZ_CHECK(tdm_ckpt_writer_box(w, "col", cs, cc2, col) == TDM_OK);
    if (r < 2) FUZZ_CHECK(tdm_ckpt_writer_box(w, "cube", bs, bc, cube) == TDM_OK);
    FUZZ_CHECK(tdm_ckpt_writer_flat(w, "flat", lo, hi, half) == TDM_OK);
    if (r == 0) FUZZ_CHECK(tdm_ckpt_writer_box(w, "scalar", NULL, NULL, &scalar) == TDM_OK);
    if (r == P - 1) { /* a tensor only the last rank declares (a pipeline stage's) */
      int64_t z = 0, v[2] = {-1, 1 << 30};
      FUZZ_CHECK(tdm_ckpt_writer_tensor(w, "stage", TDM_I64, 1, i64_shape) == TDM_OK);
      FUZZ_CHECK(tdm_ckpt_writer_box(w, "stage", &z, i64_shape, v) == TDM_OK);
    }
    FUZZ_CHECK(tdm_ckpt_writer_commit(w, 2) == TDM_OK);
  }
  tdm_comm_destroy(comm);
  return NULL;
}

static void run_ranks(int P, const char *d, int kind) {
  void *group = NULL;
  pthread_t th[4];
  seed_rank a[4];
  FUZZ_CHECK(tdm_comm_thread_group_create(&group, P) == TDM_OK);
  for (int r = 0; r < P; r++) {
    a[r] = (seed_rank){r, P, group, d, kind};
    FUZZ_CHECK(pthread_create(&th[r], NULL, seed_rank_main, &a[r]) == 0);
  }
  for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
  tdm_comm_thread_group_destroy(group);
}

static void seeds(const char *out) {
  char one[400], zero3[400], boxes[400];
  snprintf(one, sizeof one, "%s/seed-one", dir);
  snprintf(zero3, sizeof zero3, "%s/seed-zero3", dir);
  snprintf(boxes, sizeof boxes, "%s/seed-boxes", dir);
  /* 1 rank: two parameters and SGD's momentum */
  tdm_params *p;
  tdm_tensor *t;
  int64_t s2[2] = {2, 3}, s1[1] = {3};
  FUZZ_CHECK(tdm_params_create(&p) == TDM_OK);
  tdm_params_declare(p, "w", 2, s2, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 1, &t);
  tdm_params_declare(p, "b", 1, s1, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &t);
  FUZZ_CHECK(tdm_params_finalize(p, 0) == TDM_OK);
  for (int i = 0; i < 9; i++) tdm_params_data(p)[i] = 0.5f + (float)i;
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_SGD);
  oc.momentum = 0.9f;
  tdm_optim *o;
  FUZZ_CHECK(tdm_optim_create(&o, &oc, p) == TDM_OK);
  static const char *const extra[] = {"tandem.model", "mlp"};
  tdm_ckpt_info ci = {.step = 5, .world_size = 1, .seed = 7, .n_meta = 1, .meta_kv = extra};
  FUZZ_CHECK(tdm_ckpt_save(one, p, o, &ci, 2) == TDM_OK);
  tdm_optim_destroy(o);
  tdm_params_destroy(p);
  run_ranks(2, zero3, 0); /* 2 ranks, ZeRO stage 3, Adam */
  run_ranks(3, boxes, 1); /* 3 ranks: columns, blocks, flat spans of bf16, a scalar, one rank's i64 tensor */
  pack(out, "valid-1rank", one, 5, NULL, NULL, NULL);
  pack(out, "valid-2rank-zero3", zero3, 3, NULL, NULL, NULL);
  pack(out, "valid-3rank-boxes", boxes, 4, NULL, NULL, NULL);
  /* one fault each, signed (the manifest's checksum is right) */
  static const char *const bad[][3] = {
      {"bad-overlap", "\"start\":[0,1],\"count\":[4,1]", "\"start\":[0,0],\"count\":[4,1]"},
      {"bad-gap", "\"start\":[0,2],\"count\":[4,1]", "\"start\":[0,2],\"count\":[3,1]"},
      {"bad-box-outside", "\"start\":[0,2],\"count\":[4,1]", "\"start\":[0,2],\"count\":[4,2]"},
      {"bad-file-index", "\"file\":2,", "\"file\":3,"},
      {"bad-offset-past-end", "\"offset\":", "\"offset\":9999"},
      {"bad-count-zero", "\"start\":[0,2],\"count\":[4,1]", "\"start\":[0,2],\"count\":[4,0]"},
      {"bad-rank-outside-world", "\"rank\":2", "\"rank\":3"},
      {"bad-path-elsewhere", "\"path\":\"ckpt-000000000004.shards/rank-0", "\"path\":\"../ckpt-000000000004.shards/rank-0"},
      {"bad-unknown-field", "\"dtype\":\"f32\"", "\"dtype\":\"f32\",\"stride\":1"},
      {"bad-dtype", "\"dtype\":\"bf16\"", "\"dtype\":\"f8\""},
      {"bad-shape-7d", "\"shape\":[2,2,3]", "\"shape\":[2,2,3,1,1,1,1]"},
      {"bad-shape-zero", "\"shape\":[4,3]", "\"shape\":[4,0]"},
      {"bad-scalar-box", "\"start\":[],\"count\":[]", "\"start\":[0],\"count\":[1]"},
      {"bad-file-listed-twice", "rank-1.safetensors\",\"rank\":1,", "rank-0.safetensors\",\"rank\":0,"},
      {"bad-tensor-twice", "\"name\":\"cube\"", "\"name\":\"col\""},
      {"bad-crc-text", "\"crc32\":\"", "\"crc32\":\"X"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) pack(out, bad[i][0], boxes, 4, bad[i][1], bad[i][2], NULL);
  pack(out, "bad-format-2", one, 5, "meta:tandem.ckpt_version", "2", NULL);
  pack(out, "bad-step-leading-zero", one, 5, "meta:tandem.step", "05", NULL);
  pack(out, "bad-world-0", one, 5, "meta:tandem.world_size", "0", NULL);
  pack(out, "found-files-fewer-than-world", zero3, 3, "meta:tandem.world_size", "3", NULL);
  pack(out, "bad-files-out-of-order", zero3, 3, "rank-0.safetensors\",\"rank\":0,", "rank-1.safetensors\",\"rank\":1,", NULL);
  pack(out, "bad-piece-crc", zero3, 3, NULL, NULL, flip_last_byte_of_rank1);
  pack(out, "bad-rank-header", zero3, 3, NULL, NULL, flip_header_of_rank1);
  pack(out, "bad-rank-truncated", zero3, 3, NULL, NULL, truncate_rank1);
  pack(out, "bad-rank-missing", zero3, 3, NULL, NULL, drop_rank1);
  pack(out, "bad-ranks-swapped", zero3, 3, NULL, NULL, swap_ranks);
}
