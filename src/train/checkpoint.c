/* Checkpoints: the manifest file (verified safetensors), the directory (names, listing, rotation)
 * and the lock; see include/tandem/checkpoint.h and docs/checkpoint-format.md. The manifest's
 * JSON and boxes are in ckpt_layout.c, reading pieces in ckpt_read.c, writing in ckpt_write.c. */
#include "tandem/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/json.h"
#include "train/ckpt_impl.h"

#define MAX_HEADER (100u << 20) /* as the safetensors reader */
#define CRC_KEY "tandem.crc32"

/* ---- the checksum ---------------------------------------------------------------------------- */
static uLong crc_bytes(uLong crc, const void *p, int64_t n) {
  const unsigned char *b = p;
  while (n > 0) { /* crc32 takes uInt lengths */
    uInt k = n > (1 << 30) ? (1u << 30) : (uInt)n;
    crc = crc32(crc, b, k);
    b += k;
    n -= k;
  }
  return crc;
}
static uLong crc_le(uLong crc, uint64_t v, int nbytes) {
  unsigned char b[8];
  for (int i = 0; i < nbytes; i++) b[i] = (unsigned char)(v >> (8 * i));
  return crc_bytes(crc, b, nbytes);
}
static uLong crc_str(uLong crc, const char *s) {
  size_t n = strlen(s);
  return crc_bytes(crc_le(crc, n, 4), s, (int64_t)n);
}
static int cmp_pair(const void *a, const void *b) { return strcmp(**(const char *const *const *)a, **(const char *const *const *)b); }
static int cmp_tensor(const void *a, const void *b) {
  return strcmp((*(const tdm_st_tensor *const *)a)->name, (*(const tdm_st_tensor *const *)b)->name);
}

tdm_status tdm_ckpt_checksum(int n_meta, const char *const *meta_kv, int n, const tdm_st_tensor *ts, uint32_t *out) {
  if (!out || n_meta < 0 || n < 0 || (n_meta && !meta_kv) || (n && !ts))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint checksum: %d metadata pairs at %p, %d tensors at %p, out %p; expected counts >= 0 "
                          "and the arrays and out given", n_meta, (const void *)meta_kv, n, (const void *)ts, (void *)out);
  for (int i = 0; i < 2 * n_meta; i++)
    if (!meta_kv[i]) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint checksum: metadata %s %d is NULL", i % 2 ? "value" : "key", i / 2);
  for (int i = 0; i < n; i++)
    if (!ts[i].name || ts[i].ndim < 0 || ts[i].ndim > TDM_MAX_DIMS || ts[i].nbytes < 0 || (ts[i].nbytes && !ts[i].data))
      return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint checksum: tensor %d ('%s'): %d dimensions, %lld bytes at %p; expected a name, "
                            "0..%d dimensions and the bytes", i, ts[i].name ? ts[i].name : "(null)", ts[i].ndim, (long long)ts[i].nbytes,
                            ts[i].data, TDM_MAX_DIMS);
  const char *const **pairs = tdm__malloc(sizeof *pairs * (size_t)(n_meta + 1));
  const tdm_st_tensor **tp = tdm__malloc(sizeof *tp * (size_t)(n + 1));
  if (!pairs || !tp) {
    tdm__free(pairs);
    tdm__free(tp);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint checksum: out of memory");
  }
  for (int i = 0; i < n_meta; i++) pairs[i] = meta_kv + 2 * i;
  for (int i = 0; i < n; i++) tp[i] = ts + i;
  qsort(pairs, (size_t)n_meta, sizeof *pairs, cmp_pair);
  qsort(tp, (size_t)n, sizeof *tp, cmp_tensor);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int i = 0; i < n_meta; i++)
    if (strcmp(pairs[i][0], CRC_KEY)) crc = crc_str(crc_str(crc, pairs[i][0]), pairs[i][1]);
  for (int i = 0; i < n; i++) {
    const tdm_st_tensor *t = tp[i];
    crc = crc_str(crc_str(crc, t->name), tdm_dtype_name(t->dtype));
    crc = crc_le(crc, (uint64_t)t->ndim, 4);
    for (int d = 0; d < t->ndim; d++) crc = crc_le(crc, (uint64_t)t->shape[d], 8);
    crc = crc_bytes(crc_le(crc, (uint64_t)t->nbytes, 8), t->data, t->nbytes);
  }
  tdm__free(pairs);
  tdm__free(tp);
  *out = (uint32_t)crc;
  return TDM_OK;
}

/* ---- strict values and names ----------------------------------------------------------------- */
/* A canonical decimal (no sign, space, exponent, point or leading zero) in [lo, hi]. */
int tdm__ckpt_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (!s || !*s || (s[0] == '0' && s[1])) return 0;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return 0;
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return 0;
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

static tdm_status meta_u64(const tdm_safetensors *f, const char *path, const char *key, uint64_t lo, uint64_t hi,
                           uint64_t *out) {
  const char *v = tdm_safetensors_meta(f, key);
  if (!v) return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata lacks %s: not a tandem checkpoint", path, key);
  if (!tdm__ckpt_parse_u64(v, lo, hi, out))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata %s is '%.40s'; expected an integer in %llu..%llu: the file is corrupt",
                          path, key, v, (unsigned long long)lo, (unsigned long long)hi);
  return TDM_OK;
}

static int path_of(const char *dir, int64_t step, char *out, size_t n) {
  return snprintf(out, n, "%s/ckpt-%012lld.safetensors", dir, (long long)step) < (int)n;
}

int tdm__ckpt_shards_name(int64_t step, char *out, size_t n) {
  return snprintf(out, n, "ckpt-%012lld.shards", (long long)step) < (int)n;
}

/* The directory of step's shards, under dir. */
static int shards_of(const char *dir, int64_t step, char *out, size_t n) {
  return snprintf(out, n, "%s/ckpt-%012lld.shards", dir, (long long)step) < (int)n;
}

/* ckpt-<digits>.safetensors written exactly as path_of writes it: 1 with *step; a name that only
 * looks like one (ckpt-1.safetensors, ckpt-0000000x.safetensors): -1; anything else: 0. */
static int name_step(const char *name, int64_t *step) {
  const char *suffix = ".safetensors";
  size_t n = strlen(name), ns = strlen(suffix);
  if (strncmp(name, "ckpt-", 5) || n < 5 + ns || strcmp(name + n - ns, suffix)) return 0;
  size_t nd = n - 5 - ns;
  uint64_t v = 0;
  if (nd < 12 || nd > 19) return -1;
  for (size_t i = 0; i < nd; i++) {
    char ch = name[5 + i];
    if (ch < '0' || ch > '9') return -1;
    v = v * 10 + (uint64_t)(ch - '0'); /* at most 19 digits: no overflow */
  }
  char again[32];
  if (v > (uint64_t)TDM__CKPT_MAX_STEP || snprintf(again, sizeof again, "%012llu", (unsigned long long)v) != (int)nd ||
      strncmp(again, name + 5, nd))
    return -1;
  *step = (int64_t)v;
  return 1;
}

static void note(char *notes, size_t n, const char *msg) {
  if (!notes || !n) return;
  size_t used = strlen(notes);
  snprintf(notes + used, n - used, "%s%s", used ? "; " : "", msg);
}

uint32_t tdm__crc32(uint32_t crc, const void *p, int64_t n) { return (uint32_t)crc_bytes(crc, p, n); }

/* ---- opening a file without following links or blocking ----------------------------------------- */
static const char *kind_of(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISLNK(m) ? "a symbolic link" : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) || S_ISBLK(m) ? "a device" : "not a regular file";
}

tdm_status tdm__ckpt_open_regular(const char *path, int *fd_out, int64_t *size, const char *what) {
  struct stat a, b;
  if (lstat(path, &a) != 0) return tdm__set_error(TDM_ERR_IO, "%s: cannot examine: %s", path, strerror(errno));
  if (!S_ISREG(a.st_mode))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: %s, not a %s", path, kind_of(a.st_mode), what);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return tdm__set_error(TDM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (fstat(fd, &b) != 0 || !S_ISREG(b.st_mode) || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
    close(fd);
    return tdm__set_error(TDM_ERR_IO, "%s: replaced while being opened", path);
  }
  *fd_out = fd;
  *size = (int64_t)b.st_size;
  return TDM_OK;
}

int tdm__ckpt_read_at(int fd, void *buf, size_t n, int64_t off) {
  for (size_t got = 0; got < n;) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    got += (size_t)r;
  }
  return 1;
}

/* The __metadata__ pairs of the file's header, in file order (pointers into *json). */
static tdm_status read_meta(int fd, int64_t size, const char *path, tdm_json **json, const char ***kv, int *n_kv) {
  unsigned char len[8];
  if (size < 8 || !tdm__ckpt_read_at(fd, len, 8, 0)) return tdm__set_error(TDM_ERR_FORMAT, "%s: truncated header", path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len[i];
  if (hlen > MAX_HEADER || hlen > (uint64_t)(size - 8))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: header length %llu does not fit the file", path, (unsigned long long)hlen);
  char *h = tdm__malloc(hlen + 1);
  if (!h) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  tdm_status st = tdm__ckpt_read_at(fd, h, hlen, 8) ? tdm__json_parse(h, hlen, json) : tdm__set_error(TDM_ERR_IO, "%s: short read", path);
  tdm__free(h);
  TDM__TRY(st);
  const tdm_json *m = tdm__json_get(*json, "__metadata__");
  int n = m && m->type == TDM_JSON_OBJ ? m->n : 0;
  *kv = tdm__malloc(sizeof **kv * (size_t)(2 * n + 1));
  if (!*kv) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int i = 0; i < n; i++) {
    if (m->items[i].type != TDM_JSON_STR)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata %s is not a string", path, m->keys[i]);
    (*kv)[2 * i] = m->keys[i];
    (*kv)[2 * i + 1] = m->items[i].str;
    for (int j = 0; j < i; j++)
      if (!strcmp(m->keys[j], m->keys[i])) return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata %s appears twice", path, m->keys[i]);
  }
  *n_kv = n;
  return TDM_OK;
}

/* ---- the manifest ------------------------------------------------------------------------------ */
/* Checks what the metadata says (version first: another version may sum differently). */
static tdm_status verify(tdm_ckpt *c, int n_kv, const char *const *kv) {
  const char *path = c->path, *ver = tdm_safetensors_meta(c->f, "tandem.ckpt_version"),
             *kind = tdm_safetensors_meta(c->f, "tandem.kind"), *want = tdm_safetensors_meta(c->f, CRC_KEY);
  if (!kind || strcmp(kind, "checkpoint"))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: not a tandem checkpoint (no tandem.kind = checkpoint in its metadata)", path);
  if (!ver)
    return tdm__set_error(TDM_ERR_FORMAT,
                          "%s: checkpoint format 1 (written by an older tandem; its header is not covered by the checksum): "
                          "this tandem reads format %d only; resume it with the tandem that wrote it, or start afresh",
                          path, TDM_CKPT_VERSION);
  if (!strcmp(ver, "2"))
    return tdm__set_error(TDM_ERR_FORMAT,
                          "%s: checkpoint format 2 (written by an older tandem, before checkpoints resharded): this tandem "
                          "reads format %d only; resume it with the tandem that wrote it, or start afresh",
                          path, TDM_CKPT_VERSION);
  char vs[16];
  snprintf(vs, sizeof vs, "%d", TDM_CKPT_VERSION);
  if (strcmp(ver, vs))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: checkpoint format version '%.40s'; this tandem reads version %d only", path,
                          ver, TDM_CKPT_VERSION);
  int n = tdm_safetensors_count(c->f);
  tdm_st_tensor *ts = tdm__malloc(sizeof *ts * (size_t)(n ? n : 1));
  if (!ts) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  for (int i = 0; i < n; i++) ts[i] = *tdm_safetensors_at(c->f, i);
  tdm_status st = tdm_ckpt_checksum(n_kv, kv, n, ts, &c->crc);
  tdm__free(ts);
  TDM__TRY(st);
  char got[16];
  snprintf(got, sizeof got, "%08x", c->crc);
  if (!want || strcmp(want, got))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: checksum mismatch (stored %.16s, computed %s): the file is corrupt", path,
                          want ? want : "none", got);
  uint64_t step, ostep, ws, seed, epoch, offset;
  TDM__TRY(meta_u64(c->f, path, "tandem.step", 0, (uint64_t)TDM__CKPT_MAX_STEP, &step));
  TDM__TRY(meta_u64(c->f, path, "tandem.optim_steps", 0, (uint64_t)TDM__CKPT_MAX_STEP, &ostep));
  TDM__TRY(meta_u64(c->f, path, "tandem.world_size", 1, TDM__CKPT_MAX_WORLD, &ws));
  TDM__TRY(meta_u64(c->f, path, "tandem.seed", 0, UINT64_MAX, &seed));
  TDM__TRY(meta_u64(c->f, path, "tandem.data_epoch", 0, (uint64_t)TDM__CKPT_MAX_STEP, &epoch));
  TDM__TRY(meta_u64(c->f, path, "tandem.data_offset", 0, (uint64_t)TDM__CKPT_MAX_STEP, &offset));
  const char *layout = tdm_safetensors_meta(c->f, "tandem.layout"), *okind = tdm_safetensors_meta(c->f, "tandem.optim_kind");
  if (!layout) return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata lacks tandem.layout: not a tandem checkpoint", path);
  if (okind && !strcmp(okind, "")) return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata tandem.optim_kind is empty", path);
  c->info = (tdm_ckpt_info){(int64_t)step, (int)ws, seed, 0, NULL, (int64_t)epoch, (int64_t)offset, layout, okind};
  c->optim_steps = (int64_t)ostep;
  const tdm_st_tensor *m = tdm_safetensors_find(c->f, TDM__CKPT_MANIFEST);
  if (n != 1 || !m || m->dtype != TDM_U8 || m->ndim != 1)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: holds %d tensors; a manifest holds exactly one, '%s' (u8)", path, n,
                          TDM__CKPT_MANIFEST);
  return tdm__manifest_parse(c, m->data, (size_t)m->nbytes);
}

/* Every file the manifest lists is a regular file of the size it lists (reading then checks each
 * file's header and each piece it reads). */
static tdm_status check_files(tdm_ckpt *c) {
  for (int i = 0; i < c->n_files; i++) {
    const tdm__cfile *f = &c->files[i];
    struct stat sb;
    if (lstat(f->path, &sb) != 0) {
      if (errno == ENOENT)
        return tdm__set_error(TDM_ERR_FORMAT, "%s: shard file %s is missing (the manifest lists %d file%s): the checkpoint is incomplete",
                              c->path, f->path, c->n_files, c->n_files == 1 ? "" : "s");
      return tdm__set_error(TDM_ERR_IO, "%s: cannot examine %s: %s", c->path, f->path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
      return tdm__set_error(TDM_ERR_FORMAT, "%s: %s is %s, not a shard file", c->path, f->path, kind_of(sb.st_mode));
    if ((int64_t)sb.st_size != f->bytes)
      return tdm__set_error(TDM_ERR_FORMAT, "%s is %lld bytes, but the manifest %s lists %lld: the manifest disagrees with the files",
                            f->path, (long long)sb.st_size, c->path, (long long)f->bytes);
  }
  return TDM_OK;
}

/* Keeps the metadata pairs, in file order, for tdm_ckpt_meta_at. */
static tdm_status keep_meta(tdm_ckpt *c, int n_kv, const char *const *kv) {
  if (!(c->meta = tdm__calloc(2 * (size_t)n_kv + 1, sizeof(char *)))) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  c->n_meta = n_kv; /* entries NULL until copied: tdm_ckpt_close frees what there is */
  for (int i = 0; i < 2 * n_kv; i++) {
    if (!(c->meta[i] = tdm__malloc(strlen(kv[i]) + 1))) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
    strcpy(c->meta[i], kv[i]);
  }
  return TDM_OK;
}

void tdm_ckpt_close(tdm_ckpt *c) {
  if (!c) return;
  tdm__ckpt_close_files(c);
  tdm__manifest_free(c);
  tdm_safetensors_destroy(c->f);
  for (int i = 0; c->meta && i < 2 * c->n_meta; i++) tdm__free(c->meta[i]);
  tdm__free(c->meta);
  tdm__free(c->cache);
  tdm__free(c->path);
  tdm__free(c->dir);
  tdm__free(c);
}

tdm_status tdm_ckpt_open(tdm_ckpt **out, const char *path) {
  if (!out || !path) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_open: %s is NULL", !out ? "out" : "the path");
  *out = NULL;
  int fd = -1;
  int64_t size = 0;
  TDM__TRY(tdm__ckpt_open_regular(path, &fd, &size, "checkpoint file"));
  tdm_ckpt *c = tdm__calloc(1, sizeof *c);
  if (c) {
    c->cache_t = c->cache_p = -1;
    c->path = tdm__malloc(strlen(path) + 1);
    c->dir = tdm__malloc(strlen(path) + 2);
  }
  if (!c || !c->path || !c->dir) {
    close(fd);
    tdm_ckpt_close(c);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  }
  strcpy(c->path, path);
  strcpy(c->dir, path);
  char *slash = strrchr(c->dir, '/');
  if (!slash) strcpy(c->dir, ".");
  else if (slash == c->dir) c->dir[1] = 0;
  else *slash = 0;
  /* the safetensors reader opens by name: give it this descriptor's, so that what it reads is
   * the regular file examined above, whatever happens to the name meanwhile */
  char self[64];
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  tdm_status st = tdm_safetensors_load(&c->f, access(self, F_OK) == 0 ? self : path);
  if (st != TDM_OK && !strncmp(tdm_last_error(), self, strlen(self))) { /* name the file, not the descriptor */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tdm_last_error() + strlen(self));
    tdm__set_error(st, "%s%s", path, msg);
  }
  tdm_json *json = NULL;
  const char **kv = NULL;
  int n_kv = 0;
  if (st == TDM_OK) st = read_meta(fd, size, path, &json, &kv, &n_kv);
  if (st == TDM_OK) st = verify(c, n_kv, kv);
  if (st == TDM_OK) st = check_files(c);
  if (st == TDM_OK) st = keep_meta(c, n_kv, kv);
  tdm__free(kv);
  tdm__json_free(json);
  close(fd);
  if (st != TDM_OK) {
    tdm_ckpt_close(c);
    return st;
  }
  *out = c;
  return TDM_OK;
}

#define NONNULL_C(ret, fn) TDM__NONNULL(c, ret, fn ": the checkpoint c is NULL")
const tdm_ckpt_info *tdm_ckpt_get_info(const tdm_ckpt *c) {
  NONNULL_C(NULL, "tdm_ckpt_get_info");
  return &c->info;
}
uint32_t tdm_ckpt_get_crc(const tdm_ckpt *c) {
  NONNULL_C(0, "tdm_ckpt_get_crc");
  return c->crc;
}
const char *tdm_ckpt_path(const tdm_ckpt *c) {
  NONNULL_C(NULL, "tdm_ckpt_path");
  return c->path;
}
const char *tdm_ckpt_meta(const tdm_ckpt *c, const char *key) {
  NONNULL_C(NULL, "tdm_ckpt_meta");
  TDM__NONNULL(key, NULL, "tdm_ckpt_meta: the key is NULL");
  return tdm_safetensors_meta(c->f, key);
}
int64_t tdm_ckpt_get_optim_steps(const tdm_ckpt *c) {
  NONNULL_C(-1, "tdm_ckpt_get_optim_steps");
  return c->optim_steps;
}
int tdm_ckpt_tensor_count(const tdm_ckpt *c) {
  NONNULL_C(0, "tdm_ckpt_tensor_count");
  return c->n_tensors;
}
const tdm_ckpt_tensor *tdm_ckpt_tensor_at(const tdm_ckpt *c, int i) {
  NONNULL_C(NULL, "tdm_ckpt_tensor_at");
  return i >= 0 && i < c->n_tensors ? &c->tensors[i].pub : NULL;
}
const tdm_ckpt_tensor *tdm_ckpt_tensor_find(const tdm_ckpt *c, const char *name) {
  NONNULL_C(NULL, "tdm_ckpt_tensor_find");
  TDM__NONNULL(name, NULL, "tdm_ckpt_tensor_find: the name is NULL");
  for (int i = 0; i < c->n_tensors; i++)
    if (!strcmp(c->tensors[i].pub.name, name)) return &c->tensors[i].pub;
  return NULL;
}
int tdm_ckpt_file_count(const tdm_ckpt *c) {
  NONNULL_C(0, "tdm_ckpt_file_count");
  return c->n_files;
}
const char *tdm_ckpt_file_at(const tdm_ckpt *c, int i, int64_t *bytes, int *n_pieces) {
  NONNULL_C(NULL, "tdm_ckpt_file_at");
  if (i < 0 || i >= c->n_files) return NULL;
  if (bytes) *bytes = c->files[i].bytes;
  if (n_pieces) *n_pieces = c->files[i].n_pieces;
  return c->files[i].name;
}

int tdm_ckpt_meta_count(const tdm_ckpt *c) {
  NONNULL_C(0, "tdm_ckpt_meta_count");
  return c->n_meta;
}
const char *tdm_ckpt_meta_at(const tdm_ckpt *c, int i, const char **value) {
  NONNULL_C(NULL, "tdm_ckpt_meta_at");
  if (i < 0 || i >= c->n_meta) return NULL;
  if (value) *value = c->meta[2 * i + 1];
  return c->meta[2 * i];
}

/* ---- the directory --------------------------------------------------------------------------- */
typedef struct {
  int64_t step; /* -1: a name that only looks like a checkpoint's */
  char name[256];
} entry;

static int cmp_newest(const void *a, const void *b) {
  const entry *x = a, *y = b;
  return (x->step < y->step) - (x->step > y->step);
}

/* The entries named ckpt-*.safetensors, newest first (stray names last). *n = 0 when dir does not
 * exist; TDM_ERR_IO when it cannot be read. The caller frees *out. */
static tdm_status list_entries(const char *dir, entry **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!dir) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint directory: the directory name is NULL");
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? TDM_OK : tdm__set_error(TDM_ERR_IO, "checkpoint directory %s: cannot read: %s", dir, strerror(errno));
  int cap = 0;
  struct dirent *e;
  tdm_status st = TDM_OK;
  while ((e = readdir(d))) {
    int64_t step = -1;
    int k = name_step(e->d_name, &step);
    if (k == 0 || strlen(e->d_name) >= sizeof(*out)->name) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      entry *grown = tdm__malloc(sizeof *grown * (size_t)cap);
      if (!grown) {
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
        break;
      }
      if (*n) memcpy(grown, *out, sizeof *grown * (size_t)*n);
      tdm__free(*out);
      *out = grown;
    }
    (*out)[*n].step = k > 0 ? step : -1;
    snprintf((*out)[(*n)++].name, sizeof(*out)->name, "%s", e->d_name);
  }
  closedir(d);
  if (st == TDM_OK && *n) qsort(*out, (size_t)*n, sizeof **out, cmp_newest);
  return st;
}

int tdm_ckpt_count_entries(const char *dir, char *first, size_t first_n) {
  entry *es;
  int n;
  if (list_entries(dir, &es, &n) != TDM_OK) return -1;
  if (n && first && first_n) snprintf(first, first_n, "%s", es[0].name);
  tdm__free(es);
  return n;
}

/* Opens the entry (and with verify_data reads every piece); on failure notes why (the entry is
 * skipped, never used, never deleted). */
static tdm_status open_entry(const char *dir, const entry *e, tdm_ckpt **out, char *notes, size_t notes_n, int verify_data) {
  char path[4096], msg[1280];
  snprintf(path, sizeof path, "%s/%s", dir, e->name);
  tdm_status st;
  *out = NULL;
  if (e->step < 0) {
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: not a checkpoint's name (ckpt-<12-digit step>.safetensors)", path);
  } else if ((st = tdm_ckpt_open(out, path)) == TDM_OK && (*out)->info.step != e->step) {
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: its metadata says step %lld, its name step %lld: the file is corrupt", path,
                        (long long)(*out)->info.step, (long long)e->step);
  } else if (st == TDM_OK && verify_data) {
    st = tdm_ckpt_verify_data(*out);
  }
  if (st != TDM_OK) {
    tdm_ckpt_close(*out);
    *out = NULL;
    snprintf(msg, sizeof msg, "%s", tdm_last_error());
    note(notes, notes_n, msg);
  }
  return st;
}

static tdm_status open_latest(tdm_ckpt **out, const char *dir, char *notes, size_t notes_n, int verify_data) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_open_latest: out is NULL");
  *out = NULL;
  if (notes && notes_n) notes[0] = 0;
  entry *es;
  int n;
  TDM__TRY(list_entries(dir, &es, &n));
  tdm_status st = TDM_OK;
  for (int i = 0; i < n; i++) /* stray names first: they have no step to be newer or older by */
    if (es[i].step < 0) open_entry(dir, &es[i], out, notes, notes_n, 0);
  for (int i = 0; i < n && !*out && es[i].step >= 0; i++) {
    st = open_entry(dir, &es[i], out, notes, notes_n, verify_data);
    if (st == TDM_ERR_NO_MEMORY) break;
  }
  tdm__free(es);
  if (*out) return TDM_OK;
  if (n == 0) return TDM_OK;
  if (st == TDM_ERR_NO_MEMORY) return st;
  return tdm__set_error(TDM_ERR_FORMAT, "no valid checkpoint in %s (%d entr%s named like one: %s)", dir, n, n == 1 ? "y" : "ies",
                        notes && notes[0] ? notes : "all invalid");
}

tdm_status tdm_ckpt_open_latest(tdm_ckpt **out, const char *dir, char *notes, size_t notes_n) {
  return open_latest(out, dir, notes, notes_n, 0);
}

tdm_status tdm_ckpt_open_latest_verified(tdm_ckpt **out, const char *dir, char *notes, size_t notes_n) {
  return open_latest(out, dir, notes, notes_n, 1);
}

tdm_status tdm__ckpt_open_below(tdm_ckpt **out, const char *dir, int64_t below, char *notes, size_t notes_n, int *n_entries) {
  *out = NULL;
  entry *es;
  int n;
  TDM__TRY(list_entries(dir, &es, &n));
  *n_entries = n;
  tdm_status st = TDM_OK;
  for (int i = 0; i < n && below == INT64_MAX; i++) /* stray names, noted once */
    if (es[i].step < 0) open_entry(dir, &es[i], out, notes, notes_n, 0);
  for (int i = 0; i < n && !*out && es[i].step >= 0; i++) {
    if (es[i].step >= below) continue;
    st = open_entry(dir, &es[i], out, notes, notes_n, 0);
    if (st == TDM_ERR_NO_MEMORY) break;
  }
  tdm__free(es);
  return st == TDM_ERR_NO_MEMORY ? st : TDM_OK;
}

tdm_status tdm_ckpt_latest(const char *dir, char *path, size_t path_n, char *warning, size_t warning_n) {
  if (!path || !path_n) return tdm__set_error(TDM_ERR_INVALID_ARG, "ckpt_latest: no buffer for the path (%p, %zu bytes)", (void *)path, path_n);
  tdm_ckpt *c;
  TDM__TRY(tdm_ckpt_open_latest_verified(&c, dir, warning, warning_n));
  if (!c) return tdm__set_error(TDM_ERR_IO, "no checkpoint in %s", dir);
  size_t need = strlen(c->path) + 1;
  tdm_status st = TDM_OK;
  if (need > path_n) /* a cut path names another file */
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "ckpt_latest: the path %s needs %zu bytes; the buffer has %zu", c->path, need, path_n);
  else
    memcpy(path, c->path, need);
  tdm_ckpt_close(c);
  return st;
}

/* ---- writing the manifest, retiring old checkpoints --------------------------------------------- */
/* Whether name is one this tandem writes into a shards directory: rank-<r>.safetensors, or the
 * temporary of one (.rank-<r>.safetensors.tmp-<16 hex digits>, as core/file.c names them). */
static int ours_in_shards(const char *name, int *rank) {
  int r, end = 0;
  char again[96];
  if (sscanf(name, "rank-%d.safetensors%n", &r, &end) == 1 && !name[end] && r >= 0) {
    snprintf(again, sizeof again, "rank-%d.safetensors", r);
    if (!strcmp(again, name)) return *rank = r, 1;
  }
  if (sscanf(name, ".rank-%d.safetensors.tmp-%n", &r, &end) == 1 && r >= 0 && strlen(name + end) == 16 &&
      strspn(name + end, "0123456789abcdef") == 16) {
    snprintf(again, sizeof again, ".rank-%d.safetensors.tmp-", r);
    if (!strncmp(again, name, strlen(again))) return *rank = -1, 1;
  }
  return 0;
}

/* Removes from step's shards directory the files this tandem writes there, but those that `keep`
 * (a rank's file, or NULL) says to keep; then the directory if empty. */
static void remove_shards(const char *dir, int64_t step, const tdm_ckpt *keep) {
  char sdir[4096], path[4096 + 300];
  if (!shards_of(dir, step, sdir, sizeof sdir)) return;
  DIR *d = opendir(sdir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    int r, kept = 0;
    if (!ours_in_shards(e->d_name, &r)) continue;
    for (int i = 0; keep && i < keep->n_files && !kept; i++) kept = !strcmp(strrchr(keep->files[i].name, '/') + 1, e->d_name);
    if (kept) continue;
    snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
    unlink(path);
  }
  closedir(d);
  if (!keep) rmdir(sdir); /* fails, harmlessly, if anything else is there */
}

/* What a job killed while saving left (the lock makes this job the directory's only writer):
 * shards directories below step whose checkpoint never got its manifest, which no manifest will
 * ever name, and temporaries of manifests (.ckpt-<step>.safetensors.tmp-<16 hex digits>, as
 * core/file.c names them) up to step. */
static void remove_orphans(const char *dir, int64_t step) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  int64_t *orphans = NULL;
  int n = 0, cap = 0;
  while ((e = readdir(d))) {
    unsigned long long s;
    int end = 0;
    char again[64], path[4096 + 300];
    struct stat sb;
    if (sscanf(e->d_name, ".ckpt-%llu.safetensors.tmp-%n", &s, &end) == 1 && end > 0 && (int64_t)s <= step &&
        strlen(e->d_name + end) == 16 && strspn(e->d_name + end, "0123456789abcdef") == 16 &&
        snprintf(again, sizeof again, ".ckpt-%012llu.safetensors.tmp-", s) == end && !strncmp(again, e->d_name, (size_t)end)) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
      continue;
    }
    if (sscanf(e->d_name, "ckpt-%llu.shards%n", &s, &end) != 1 || e->d_name[end] || (int64_t)s >= step) continue;
    if (!tdm__ckpt_shards_name((int64_t)s, again, sizeof again) || strcmp(again, e->d_name)) continue;
    if (!path_of(dir, (int64_t)s, path, sizeof path) || lstat(path, &sb) == 0 || errno != ENOENT) continue;
    if (n == cap) {
      int64_t *g = tdm__malloc(sizeof *g * (size_t)(cap = cap ? 2 * cap : 8));
      if (!g) break;
      if (n) memcpy(g, orphans, sizeof *g * (size_t)n);
      tdm__free(orphans);
      orphans = g;
    }
    orphans[n++] = (int64_t)s;
  }
  closedir(d);
  for (int i = 0; i < n; i++) remove_shards(dir, orphans[i], NULL);
  tdm__free(orphans);
}

/* Deletes valid checkpoints older than `step` beyond the keep - 1 newest valid ones: the manifest
 * first (the checkpoint is gone), then its shards. */
static void retire_old(const char *dir, int64_t step, int keep) {
  entry *es;
  int n;
  if (list_entries(dir, &es, &n) != TDM_OK) return; /* nothing is deleted that was not examined */
  int kept = 1;                                      /* the one just written */
  for (int i = 0; i < n; i++) {
    if (es[i].step < 0 || es[i].step >= step) continue;
    tdm_ckpt *c;
    if (open_entry(dir, &es[i], &c, NULL, 0, 0) != TDM_OK) continue; /* not valid: not ours to delete */
    tdm_ckpt_close(c);
    if (kept < keep) {
      kept++;
      continue;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, es[i].name);
    if (unlink(path) == 0) remove_shards(dir, es[i].step, NULL);
  }
  tdm__free(es);
  remove_orphans(dir, step);
}

tdm_status tdm__ckpt_write_manifest(const char *dir, const tdm_ckpt_info *info, int64_t optim_steps, const char *json,
                                    size_t json_n, int keep) {
  enum { BASE_META = 10 };
  int n_meta = BASE_META + info->n_meta + (info->optimizer != NULL);
  const char **meta = tdm__calloc(2 * (size_t)n_meta, sizeof(char *));
  if (!meta) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  char crc[16] = "", step[32], ostep[32], ws[16], seed[32], ver[16], ep[32], off[32];
  snprintf(ver, sizeof ver, "%d", TDM_CKPT_VERSION);
  snprintf(step, sizeof step, "%lld", (long long)info->step);
  snprintf(ostep, sizeof ostep, "%lld", (long long)optim_steps);
  snprintf(ws, sizeof ws, "%d", info->world_size);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)info->seed);
  snprintf(ep, sizeof ep, "%lld", (long long)info->data_epoch);
  snprintf(off, sizeof off, "%lld", (long long)info->data_offset);
  const char *base[2 * BASE_META] = {"tandem.kind", "checkpoint", "tandem.ckpt_version", ver, "tandem.step", step,
                                     "tandem.optim_steps", ostep, "tandem.world_size", ws, "tandem.seed", seed,
                                     "tandem.data_epoch", ep, "tandem.data_offset", off,
                                     "tandem.layout", info->layout ? info->layout : "", CRC_KEY, crc};
  memcpy(meta, base, sizeof base);
  for (int i = 0; i < 2 * info->n_meta; i++) meta[2 * BASE_META + i] = info->meta_kv[i];
  if (info->optimizer) meta[2 * (n_meta - 1)] = "tandem.optim_kind", meta[2 * (n_meta - 1) + 1] = info->optimizer;
  tdm_status st = TDM_OK;
  for (int i = BASE_META; st == TDM_OK && i < n_meta; i++) /* a repeated key would be read back ambiguously */
    for (int j = 0; j < i; j++)
      if (!meta[2 * i] || !meta[2 * i + 1] || !strcmp(meta[2 * i], meta[2 * j])) {
        st = tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: metadata key '%s' is missing, empty or repeated",
                            meta[2 * i] ? meta[2 * i] : "(null)");
        break;
      }
  char path[4096];
  if (st == TDM_OK && !path_of(dir, info->step, path, sizeof path))
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: directory name too long: %s", dir);
  tdm_st_tensor t = {TDM__CKPT_MANIFEST, TDM_U8, 1, {(int64_t)json_n}, json, (int64_t)json_n};
  if (st == TDM_OK) {
    uint32_t sum = 0;
    st = tdm_ckpt_checksum(n_meta, meta, 1, &t, &sum);
    snprintf(crc, sizeof crc, "%08x", sum);
    if (st == TDM_OK) st = tdm_safetensors_save(path, 1, &t, n_meta, meta);
  }
  tdm__free(meta);
  TDM__TRY(st);
  tdm_ckpt *check; /* read it back: only a verified checkpoint may retire older ones */
  st = tdm_ckpt_open(&check, path);
  if (st != TDM_OK) { /* (a rank's file elsewhere, or of another step): no manifest stays that names missing pieces */
    char why[600];
    snprintf(why, sizeof why, "%s", tdm_last_error());
    unlink(path);
    return tdm__set_error(st, "%s (the manifest was removed again)", why);
  }
  remove_shards(dir, info->step, check); /* what an attempt at this step killed earlier left there */
  tdm_ckpt_close(check);
  retire_old(dir, info->step, keep > 0 ? keep : 1);
  return TDM_OK;
}

/* ---- the directory lock ------------------------------------------------------------------------ */
tdm_status tdm_ckpt_lock(const char *dir, int *fd_out) {
  if (!dir || !fd_out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_lock: %s is NULL", !dir ? "the directory" : "fd_out");
  *fd_out = -1;
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return tdm__set_error(TDM_ERR_IO, "checkpoint directory %s: cannot create: %s", dir, strerror(errno));
  char path[4096];
  if (snprintf(path, sizeof path, "%s/.lock", dir) >= (int)sizeof path)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint directory name too long: %s", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "checkpoint directory %s: cannot create the lock file %s: %s", dir, path,
                                   fd < 0 ? strerror(errno) : "not a regular file");
    if (fd >= 0) close(fd);
    return st;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    char pid[32] = "";
    ssize_t r = pread(fd, pid, sizeof pid - 1, 0);
    pid[r > 0 ? r : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    close(fd);
    if (e != EWOULDBLOCK) return tdm__set_error(TDM_ERR_IO, "checkpoint directory %s: cannot lock %s: %s", dir, path, strerror(e));
    return tdm__set_error(TDM_ERR_INVALID_USAGE,
                          "checkpoint directory %s is in use by another job (pid %s holds %s): two jobs must not write "
                          "checkpoints into one directory; wait for it to end or choose another --checkpoint-dir",
                          dir, pid[0] ? pid : "unknown", path);
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "checkpoint directory %s: cannot write %s: %s", dir, path, strerror(errno));
    close(fd);
    return st;
  }
  *fd_out = fd;
  return TDM_OK;
}

tdm_status tdm_ckpt_lock_check(const char *dir, int fd) {
  char path[4096];
  struct stat held, now;
  if (fd < 0) return TDM_OK;
  if (!dir) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint lock check: directory NULL for lock fd %d", fd);
  snprintf(path, sizeof path, "%s/.lock", dir);
  if (fstat(fd, &held) == 0 && stat(path, &now) == 0 && held.st_dev == now.st_dev && held.st_ino == now.st_ino) return TDM_OK;
  return tdm__set_error(TDM_ERR_IO, "checkpoint directory %s was removed or replaced while this job ran (its lock %s is not the one "
                        "this job holds): not writing checkpoints where another job could write too", dir, path);
}

void tdm_ckpt_unlock(int fd) {
  if (fd >= 0) close(fd); /* the file stays: removing it would race with a job about to lock it */
}
