/* Writing checkpoints from any layout: every rank writes its own file of pieces (boxes of logical
 * tensors), reads it back, and sends rank 0 a description of it (the file's size and header
 * checksum, each piece's tensor, box, offset and checksum); rank 0 checks that the pieces tile
 * every tensor and writes the manifest last. See include/tandem/checkpoint.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "train/ckpt_impl.h"

#define MAX_HEADER (100u << 20)

typedef struct {
  char *name;
  tdm_dtype dt;
  int nd;
  int64_t shape[TDM_MAX_DIMS];
} wtensor;

typedef struct {
  int t; /* declared tensor */
  tdm__box box;
  const void *data;
  int64_t nbytes, offset;
  uint32_t crc;
  char *name; /* in the file: "tensor[a:b,...]" */
} wpiece;

struct tdm_ckpt_writer {
  char *dir;
  tdm_ckpt_info info;
  int64_t optim_steps;
  tdm_comm_t comm;
  int rank, world;
  tdm_status st; /* the first failure, reported at commit */
  char err[512];
  wtensor *t;
  int nt, cap_t;
  wpiece *p;
  int np, cap_p;
  int64_t file_bytes;
  uint32_t header_crc;
};

/* A call after one failed: that failure again, its message too (the detail was empty) */
static tdm_status earlier(tdm_ckpt_writer *w) { return tdm__set_error(w->st, "checkpoint writer: an earlier call failed: %s", w->err); }

static tdm_status fail(tdm_ckpt_writer *w, tdm_status st) {
  if (w->st == TDM_OK && st != TDM_OK) {
    w->st = st;
    snprintf(w->err, sizeof w->err, "%s", tdm_last_error());
  }
  return st;
}

/* Every rank learns whether all succeeded; a failure is reported on every rank with the first
 * failing rank's message. Collective over comm (NULL: one process). */
tdm_status tdm__ckpt_agree(tdm_comm_t comm, tdm_status st, const char *what) {
  if (!comm) return st;
  int W = tdm_comm_size(comm), R = tdm_comm_rank(comm);
  char own[512];
  snprintf(own, sizeof own, "%s", st != TDM_OK ? tdm_last_error() : "");
  int32_t mine = (int32_t)st, *all = tdm__malloc(sizeof(int32_t) * (size_t)W);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", what);
  tdm_status cs = tdm_comm_allgather(comm, &mine, all, 1, TDM_I32, TDM_ALGO_AUTO);
  int first = -1;
  for (int r = 0; cs == TDM_OK && r < W && first < 0; r++)
    if (all[r] != TDM_OK) first = r;
  tdm_status code = first >= 0 ? (tdm_status)all[first] : TDM_OK;
  tdm__free(all);
  TDM__TRY(cs);
  if (first < 0) return TDM_OK;
  char msg[512];
  memcpy(msg, own, sizeof msg);
  TDM__TRY(tdm_comm_broadcast(comm, msg, sizeof msg, TDM_U8, first, TDM_ALGO_AUTO));
  if (first == R) return tdm__set_error(st, "%s", own);
  return tdm__error_from(first, tdm__set_error(code, "%s: rank %d failed: %.480s", what, first, msg));
}

void tdm__ckpt_writer_fail(tdm_ckpt_writer *w, tdm_status st) { fail(w, st); }

static char *dup_str(const char *s) {
  char *d = tdm__malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

tdm_status tdm_ckpt_writer_create(tdm_ckpt_writer **out, const char *dir, const tdm_ckpt_info *info, int64_t optim_steps,
                                  tdm_comm_t comm) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: out is NULL");
  tdm_ckpt_writer *w = tdm__calloc(1, sizeof *w);
  *out = w;
  if (!w) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint writer: out of memory");
  w->comm = comm;
  w->rank = comm ? tdm_comm_rank(comm) : 0;
  w->world = comm ? tdm_comm_size(comm) : 1;
  if (!dir || !info || info->step < 0 || info->step > TDM__CKPT_MAX_STEP || info->world_size < 0 ||
      (info->world_size && info->world_size != w->world) || info->n_meta < 0 || (info->n_meta && !info->meta_kv) ||
      info->data_epoch < 0 || info->data_offset < 0 || optim_steps < 0)
    return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG,
                                  "checkpoint: bad arguments (step %lld, world size %d of a world of %d, data position %lld:%lld, "
                                  "optimizer steps %lld)",
                                  info ? (long long)info->step : -1LL, info ? info->world_size : 0, w->world,
                                  info ? (long long)info->data_epoch : -1LL, info ? (long long)info->data_offset : -1LL,
                                  (long long)optim_steps));
  w->info = *info;
  w->info.world_size = w->world;
  w->optim_steps = optim_steps;
  if (!(w->dir = dup_str(dir))) return fail(w, tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint writer: out of memory"));
  return TDM_OK;
}

void tdm_ckpt_writer_destroy(tdm_ckpt_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->nt; i++) tdm__free(w->t[i].name);
  for (int i = 0; i < w->np; i++) tdm__free(w->p[i].name);
  tdm__free(w->t);
  tdm__free(w->p);
  tdm__free(w->dir);
  tdm__free(w);
}

static int find_tensor(const tdm_ckpt_writer *w, const char *name) {
  for (int i = 0; i < w->nt; i++)
    if (!strcmp(w->t[i].name, name)) return i;
  return -1;
}

tdm_status tdm_ckpt_writer_tensor(tdm_ckpt_writer *w, const char *name, tdm_dtype dt, int ndim, const int64_t *shape) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: NULL");
  if (w->st != TDM_OK) return earlier(w);
  int64_t bytes = (int64_t)tdm_dtype_size(dt);
  int bad = !name || !name[0] || !tdm__utf8_valid(name) || (unsigned)dt >= TDM_DTYPE_COUNT || ndim < 0 || ndim > TDM_MAX_DIMS ||
            (ndim && !shape) || find_tensor(w, name) >= 0 || strlen(name) > 1000;
  for (int d = 0; !bad && d < ndim; d++) bad = shape[d] < 1 || __builtin_mul_overflow(bytes, shape[d], &bytes);
  if (bad)
    return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG,
                                  "checkpoint writer: tensor '%.200s' (dtype %d, %s, %d dimensions): a name given twice, empty or not "
                                  "UTF-8, a dtype that is not tandem's, or a shape that is empty or too large",
                                  name ? name : "(null)", (int)dt, tdm_dtype_name(dt), ndim));
  if (w->nt == w->cap_t) {
    int cap = w->cap_t ? 2 * w->cap_t : 64;
    wtensor *g = tdm__malloc(sizeof *g * (size_t)cap);
    if (!g) return fail(w, tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint writer: out of memory"));
    if (w->nt) memcpy(g, w->t, sizeof *g * (size_t)w->nt);
    tdm__free(w->t);
    w->t = g, w->cap_t = cap;
  }
  wtensor *t = &w->t[w->nt];
  memset(t, 0, sizeof *t);
  if (!(t->name = dup_str(name))) return fail(w, tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint writer: out of memory"));
  t->dt = dt, t->nd = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  w->nt++;
  return TDM_OK;
}

static tdm_status add_piece(tdm_ckpt_writer *w, int ti, const tdm__box *b, const void *data) {
  const wtensor *t = &w->t[ti];
  if (w->np == w->cap_p) {
    int cap = w->cap_p ? 2 * w->cap_p : 256;
    wpiece *g = tdm__malloc(sizeof *g * (size_t)cap);
    if (!g) return fail(w, tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint writer: out of memory"));
    if (w->np) memcpy(g, w->p, sizeof *g * (size_t)w->np);
    tdm__free(w->p);
    w->p = g, w->cap_p = cap;
  }
  wpiece *p = &w->p[w->np];
  memset(p, 0, sizeof *p);
  char name[1200];
  tdm__box_name(t->name, t->nd, b, name, sizeof name);
  if (!(p->name = dup_str(name))) return fail(w, tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint writer: out of memory"));
  p->t = ti, p->box = *b, p->data = data;
  p->nbytes = tdm__box_numel(t->nd, b) * (int64_t)tdm_dtype_size(t->dt);
  w->np++;
  return TDM_OK;
}

tdm_status tdm_ckpt_writer_box(tdm_ckpt_writer *w, const char *name, const int64_t *start, const int64_t *count,
                               const void *data) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_writer_box: the writer w is NULL");
  if (w->st != TDM_OK) return earlier(w);
  if (!name) return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_writer_box: the name is NULL"));
  int ti = find_tensor(w, name);
  if (ti < 0)
    return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: piece of '%.200s', a tensor not declared on this rank",
                                  name));
  const wtensor *t = &w->t[ti];
  if (t->nd > 0 && (!start || !count)) /* a 0-d tensor's box has no dimensions to point at */
    return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_writer_box: %s is NULL for '%.200s'", !start ? "start" : "count",
                                  name));
  tdm__box b;
  int64_t n = 1;
  for (int d = 0; d < t->nd; d++) {
    if (start[d] < 0 || count[d] < 0 || start[d] > t->shape[d] || count[d] > t->shape[d] - start[d])
      return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: a piece of '%.200s' spans [%lld, %lld) of dimension %d, which has %lld",
                                    name, (long long)start[d], (long long)(start[d] + count[d]), d, (long long)t->shape[d]));
    b.start[d] = start[d], b.count[d] = count[d], n *= count[d];
  }
  if (n == 0) return TDM_OK;
  if (!data) return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: a piece of '%.200s' has no data", name));
  return add_piece(w, ti, &b, data);
}

tdm_status tdm_ckpt_writer_flat(tdm_ckpt_writer *w, const char *name, int64_t lo, int64_t hi, const void *data) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: NULL");
  if (w->st != TDM_OK) return earlier(w);
  int ti = name ? find_tensor(w, name) : -1;
  if (ti < 0) return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: piece of '%.200s', a tensor not declared on this rank", name ? name : "(null)"));
  const wtensor *t = &w->t[ti];
  int64_t numel = 1, stride[TDM_MAX_DIMS];
  for (int d = t->nd - 1; d >= 0; d--) stride[d] = numel, numel *= t->shape[d];
  if (lo < 0 || hi < lo || hi > numel)
    return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: elements [%lld, %lld) of '%.200s', which has %lld",
                                  (long long)lo, (long long)hi, name, (long long)numel));
  if (hi > lo && !data) return fail(w, tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: a piece of '%.200s' has no data", name));
  int64_t es = (int64_t)tdm_dtype_size(t->dt), chunk = TDM__CKPT_CHUNK_BYTES / es;
  /* chunks on one grid for every writer: pieces of the same elements line up across layouts */
  for (int64_t a = lo; a < hi;) {
    int64_t b = (a / chunk + 1) * chunk;
    if (b > hi) b = hi;
    tdm__box boxes[2 * TDM_MAX_DIMS];
    int nb = tdm__flat_boxes(t->nd, t->shape, a, b, boxes);
    for (int k = 0; k < nb; k++) {
      int64_t at = 0;
      for (int d = 0; d < t->nd; d++) at += boxes[k].start[d] * stride[d];
      TDM__TRY(add_piece(w, ti, &boxes[k], (const char *)data + (at - lo) * es));
    }
    a = b;
  }
  return TDM_OK;
}

/* ---- this rank's file --------------------------------------------------------------------------- */
/* Reads back the file just written: its size, its header's checksum, every piece's offset, and
 * every piece's bytes against the checksum taken from memory. */
static tdm_status read_back(tdm_ckpt_writer *w, const char *path) {
  int fd = -1;
  int64_t size = 0;
  TDM__TRY(tdm__ckpt_open_regular(path, &fd, &size, "shard file"));
  unsigned char len[8];
  uint64_t hlen = 0;
  tdm_status st = tdm__ckpt_read_at(fd, len, 8, 0) ? TDM_OK : tdm__set_error(TDM_ERR_IO, "%s: cannot read it back", path);
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len[i];
  if (st == TDM_OK && (hlen > MAX_HEADER || hlen > (uint64_t)(size - 8)))
    st = tdm__set_error(TDM_ERR_IO, "%s: read back, its header length %llu does not fit", path, (unsigned long long)hlen);
  unsigned char *h = st == TDM_OK ? tdm__malloc(hlen + 9) : NULL;
  if (st == TDM_OK && !h) st = tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  if (st == TDM_OK && !tdm__ckpt_read_at(fd, h + 8, hlen, 8)) st = tdm__set_error(TDM_ERR_IO, "%s: cannot read it back", path);
  tdm_json *j = NULL;
  if (st == TDM_OK) {
    memcpy(h, len, 8);
    w->header_crc = tdm__crc32(0, h, (int64_t)hlen + 8);
    w->file_bytes = size;
    st = tdm__json_parse((const char *)h + 8, hlen, &j);
  }
  int64_t most = 0;
  for (int i = 0; i < w->np; i++) most = w->p[i].nbytes > most ? w->p[i].nbytes : most;
  void *buf = st == TDM_OK ? tdm__aligned_alloc((size_t)most + 1) : NULL;
  if (st == TDM_OK && !buf) st = tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int i = 0; st == TDM_OK && i < w->np; i++) {
    wpiece *p = &w->p[i];
    const tdm_json *e = tdm__json_get(j, p->name), *off = e ? tdm__json_get(e, "data_offsets") : NULL;
    if (!off || off->type != TDM_JSON_ARR || off->n != 2 || !off->items[0].is_int) {
      st = tdm__set_error(TDM_ERR_INTERNAL, "%s: piece %s is not in the file written", path, p->name);
      break;
    }
    p->offset = 8 + (int64_t)hlen + off->items[0].inum;
    if (!tdm__ckpt_read_at(fd, buf, (size_t)p->nbytes, p->offset) || tdm__crc32(0, buf, p->nbytes) != p->crc)
      st = tdm__set_error(TDM_ERR_IO, "%s: piece %s does not read back as written (a failing disk?)", path, p->name);
  }
  tdm__free(buf);
  tdm__json_free(j);
  tdm__free(h);
  close(fd);
  return st;
}

static tdm_status write_file(tdm_ckpt_writer *w) {
  char sname[64], sdir[4200], path[4300], step[32], rank[16], world[16], ver[16];
  tdm__ckpt_shards_name(w->info.step, sname, sizeof sname);
  if (snprintf(sdir, sizeof sdir, "%s/%s", w->dir, sname) >= (int)sizeof sdir)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: directory name too long: %s", w->dir);
  if (mkdir(w->dir, 0755) != 0 && errno != EEXIST)
    return tdm__set_error(TDM_ERR_IO, "checkpoint: cannot create directory %s: %s", w->dir, strerror(errno));
  if (mkdir(sdir, 0755) != 0 && errno != EEXIST)
    return tdm__set_error(TDM_ERR_IO, "checkpoint: cannot create %s: %s", sdir, strerror(errno));
  snprintf(path, sizeof path, "%s/rank-%d.safetensors", sdir, w->rank);
  snprintf(step, sizeof step, "%lld", (long long)w->info.step);
  snprintf(rank, sizeof rank, "%d", w->rank);
  snprintf(world, sizeof world, "%d", w->world);
  snprintf(ver, sizeof ver, "%d", TDM_CKPT_VERSION);
  /* the header names this file's checkpoint: the manifest's checksum of it ties the two */
  const char *meta[] = {"tandem.kind", "checkpoint-shard", "tandem.ckpt_version", ver, "tandem.step", step,
                        "tandem.rank", rank, "tandem.world_size", world};
  tdm_st_tensor *ts = tdm__calloc((size_t)w->np + 1, sizeof *ts);
  if (!ts) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  for (int i = 0; i < w->np; i++) {
    wpiece *p = &w->p[i];
    const wtensor *t = &w->t[p->t];
    p->crc = tdm__crc32(0, p->data, p->nbytes);
    ts[i] = (tdm_st_tensor){p->name, t->dt, t->nd, {0}, p->data, p->nbytes};
    for (int d = 0; d < t->nd; d++) ts[i].shape[d] = p->box.count[d];
  }
  tdm_st_writer *sw;
  tdm_status st = tdm_safetensors_writer_open(&sw, path, w->np, ts, 5, meta);
  for (int i = 0; st == TDM_OK && i < w->np; i++) st = tdm_safetensors_writer_write(sw, w->p[i].data, (size_t)w->p[i].nbytes);
  if (st == TDM_OK) st = tdm_safetensors_writer_commit(sw);
  else if (sw) tdm_safetensors_writer_abort(sw);
  tdm__free(ts);
  TDM__TRY(st);
  return read_back(w, path);
}

/* ---- what rank 0 learns of every file ------------------------------------------------------------ */
typedef struct {
  unsigned char *b;
  size_t n, cap;
  int oom;
} blob;

static void put(blob *x, const void *p, size_t n) {
  if (x->oom) return;
  if (x->n + n > x->cap) {
    size_t nc = x->cap ? 2 * x->cap : 4096;
    while (nc < x->n + n) nc *= 2;
    unsigned char *g = tdm__malloc(nc);
    if (!g) {
      x->oom = 1;
      return;
    }
    if (x->n) memcpy(g, x->b, x->n);
    tdm__free(x->b);
    x->b = g, x->cap = nc;
  }
  memcpy(x->b + x->n, p, n);
  x->n += n;
}
static void put64(blob *x, int64_t v) { put(x, &v, 8); }

/* file bytes, header crc, tensors (dtype, ndim, shape, name length, name padded to 8), pieces
 * (tensor, offset, crc, start, count): int64 words, this machine's byte order */
static tdm_status describe(const tdm_ckpt_writer *w, blob *x) {
  put64(x, w->file_bytes);
  put64(x, (int64_t)w->header_crc);
  put64(x, w->nt);
  put64(x, w->np);
  for (int i = 0; i < w->nt; i++) {
    const wtensor *t = &w->t[i];
    put64(x, (int64_t)t->dt);
    put64(x, t->nd);
    for (int d = 0; d < t->nd; d++) put64(x, t->shape[d]);
    size_t len = strlen(t->name);
    put64(x, (int64_t)len);
    char pad[8] = {0};
    put(x, t->name, len);
    put(x, pad, (8 - len % 8) % 8);
  }
  for (int i = 0; i < w->np; i++) {
    const wpiece *p = &w->p[i];
    put64(x, p->t);
    put64(x, p->offset);
    put64(x, (int64_t)p->crc);
    for (int d = 0; d < w->t[p->t].nd; d++) put64(x, p->box.start[d]);
    for (int d = 0; d < w->t[p->t].nd; d++) put64(x, p->box.count[d]);
  }
  return x->oom ? tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory") : TDM_OK;
}

typedef struct {
  char *name;
  tdm_dtype dt;
  int nd;
  int64_t shape[TDM_MAX_DIMS];
  int np, cap;
  tdm__piece *p;
} mtensor;

typedef struct {
  const unsigned char *b;
  size_t n, at;
} reader;

static int get64(reader *r, int64_t *v) {
  if (r->n - r->at < 8) return 0;
  memcpy(v, r->b + r->at, 8);
  r->at += 8;
  return 1;
}

/* Adds rank r's tensors and pieces to the merged list. */
static tdm_status merge(int r, reader *rd, mtensor **ts, int *nt, int *cap, int64_t *bytes, uint32_t *hcrc) {
  int64_t fb, hc, n_t, n_p;
  if (!get64(rd, &fb) || !get64(rd, &hc) || !get64(rd, &n_t) || !get64(rd, &n_p) || n_t < 0 || n_p < 0)
    return tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: rank %d's description is malformed", r);
  *bytes = fb, *hcrc = (uint32_t)hc;
  int *map = tdm__malloc(sizeof(int) * (size_t)(n_t + 1));
  if (!map) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  tdm_status st = TDM_OK;
  for (int64_t i = 0; st == TDM_OK && i < n_t; i++) {
    int64_t dt, nd, shape[TDM_MAX_DIMS], len;
    int ok = get64(rd, &dt) && get64(rd, &nd) && nd >= 0 && nd <= TDM_MAX_DIMS;
    for (int d = 0; ok && d < nd; d++) ok = get64(rd, &shape[d]);
    ok = ok && get64(rd, &len) && len > 0 && (size_t)len <= rd->n - rd->at;
    if (!ok) {
      st = tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: rank %d's description is malformed", r);
      break;
    }
    char name[1024]; /* names in a description are not terminated */
    snprintf(name, sizeof name, "%.*s", (int)(len < 1023 ? len : 1023), (const char *)rd->b + rd->at);
    const char *at = (const char *)rd->b + rd->at;
    rd->at += (size_t)len + (8 - (size_t)len % 8) % 8;
    int k = -1;
    for (int j = 0; j < *nt && k < 0; j++)
      if (strlen((*ts)[j].name) == (size_t)len && !memcmp((*ts)[j].name, at, (size_t)len)) k = j;
    if (len > 1000) {
      st = tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: rank %d's description is malformed", r);
      break;
    }
    if (k >= 0) {
      mtensor *m = &(*ts)[k];
      if (m->dt != (tdm_dtype)dt || m->nd != nd || memcmp(m->shape, shape, sizeof(int64_t) * (size_t)nd)) {
        char a[96], b[96];
        st = tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: tensor '%s' is %s %s on rank %d but %s %s on a lower rank", name,
                            tdm_dtype_name((tdm_dtype)dt), tdm_shape_str((int)nd, shape, a, sizeof a), r, tdm_dtype_name(m->dt),
                            tdm_shape_str(m->nd, m->shape, b, sizeof b));
      }
      map[i] = k;
      continue;
    }
    if (*nt == *cap) {
      int nc = *cap ? 2 * *cap : 64;
      mtensor *g = tdm__malloc(sizeof *g * (size_t)nc);
      if (!g) {
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
        break;
      }
      if (*nt) memcpy(g, *ts, sizeof *g * (size_t)*nt);
      tdm__free(*ts);
      *ts = g, *cap = nc;
    }
    mtensor *m = &(*ts)[*nt];
    memset(m, 0, sizeof *m);
    if (!(m->name = dup_str(name))) {
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
      break;
    }
    (*nt)++;
    m->dt = (tdm_dtype)dt, m->nd = (int)nd;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)nd);
    map[i] = *nt - 1;
  }
  for (int64_t i = 0; st == TDM_OK && i < n_p; i++) {
    int64_t ti, off, crc;
    if (!get64(rd, &ti) || ti < 0 || ti >= n_t || !get64(rd, &off) || !get64(rd, &crc)) {
      st = tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: rank %d's description is malformed", r);
      break;
    }
    mtensor *m = &(*ts)[map[ti]];
    tdm__piece p = {r, off, 0, (uint32_t)crc, {{0}, {0}}};
    int ok = 1;
    for (int d = 0; ok && d < m->nd; d++) ok = get64(rd, &p.box.start[d]);
    for (int d = 0; ok && d < m->nd; d++) ok = get64(rd, &p.box.count[d]);
    if (!ok) {
      st = tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: rank %d's description is malformed", r);
      break;
    }
    p.nbytes = tdm__box_numel(m->nd, &p.box) * (int64_t)tdm_dtype_size(m->dt);
    if (m->np == m->cap) {
      int nc = m->cap ? 2 * m->cap : 8;
      tdm__piece *g = tdm__malloc(sizeof *g * (size_t)nc);
      if (!g) {
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
        break;
      }
      if (m->np) memcpy(g, m->p, sizeof *g * (size_t)m->np);
      tdm__free(m->p);
      m->p = g, m->cap = nc;
    }
    m->p[m->np++] = p;
  }
  tdm__free(map);
  return st;
}

static void put_dims(tdm__sbuf *s, int nd, const int64_t *v) {
  tdm__sbuf_put(s, "[", 1);
  for (int d = 0; d < nd; d++) tdm__sbuf_printf(s, "%s%lld", d ? "," : "", (long long)v[d]);
  tdm__sbuf_put(s, "]", 1);
}

/* Rank 0: every rank's description into the manifest's JSON, after checking the tiling. */
static tdm_status build_manifest(const tdm_ckpt_writer *w, const unsigned char *all, const size_t *lens, tdm__sbuf *s) {
  mtensor *ts = NULL;
  int nt = 0, cap = 0;
  int64_t *bytes = tdm__malloc(sizeof(int64_t) * (size_t)w->world);
  uint32_t *hcrc = tdm__malloc(sizeof(uint32_t) * (size_t)w->world);
  tdm_status st = bytes && hcrc ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  size_t at = 0;
  for (int r = 0; st == TDM_OK && r < w->world; r++) {
    reader rd = {all + at, lens[r], 0};
    st = merge(r, &rd, &ts, &nt, &cap, &bytes[r], &hcrc[r]);
    at += lens[r];
  }
  for (int i = 0; st == TDM_OK && i < nt; i++) { /* every element of every tensor once */
    const tdm__box **bs = tdm__malloc(sizeof *bs * (size_t)(ts[i].np + 1));
    if (!bs) {
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
      break;
    }
    for (int k = 0; k < ts[i].np; k++) bs[k] = &ts[i].p[k].box;
    st = tdm__boxes_tile(ts[i].nd, ts[i].shape, ts[i].np, bs, "checkpoint: the ranks' pieces", ts[i].name);
    tdm__free(bs);
  }
  char sname[64];
  tdm__ckpt_shards_name(w->info.step, sname, sizeof sname);
  if (st == TDM_OK) {
    tdm__sbuf_put(s, "{\"files\":[", 10);
    for (int r = 0; r < w->world; r++)
      tdm__sbuf_printf(s, "%s\n{\"path\":\"%s/rank-%d.safetensors\",\"rank\":%d,\"bytes\":%lld,\"header_crc32\":\"%08x\"}",
                       r ? "," : "", sname, r, r, (long long)bytes[r], hcrc[r]);
    tdm__sbuf_put(s, "],\n\"tensors\":[", 14);
    for (int i = 0; i < nt; i++) {
      const mtensor *m = &ts[i];
      tdm__sbuf_printf(s, "%s\n{\"name\":", i ? "," : "");
      tdm__sbuf_json_str(s, m->name);
      tdm__sbuf_printf(s, ",\"dtype\":\"%s\",\"shape\":", tdm_dtype_name(m->dt));
      put_dims(s, m->nd, m->shape);
      tdm__sbuf_put(s, ",\"pieces\":[", 11);
      for (int k = 0; k < m->np; k++) {
        const tdm__piece *p = &m->p[k];
        tdm__sbuf_printf(s, "%s\n {\"file\":%d,\"offset\":%lld,\"crc32\":\"%08x\",\"start\":", k ? "," : "", p->file,
                         (long long)p->offset, p->crc);
        put_dims(s, m->nd, p->box.start);
        tdm__sbuf_put(s, ",\"count\":", 9);
        put_dims(s, m->nd, p->box.count);
        tdm__sbuf_put(s, "}", 1);
      }
      tdm__sbuf_put(s, "]}", 2);
    }
    tdm__sbuf_put(s, "]}\n", 3);
    if (s->oom) st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory for the manifest");
  }
  for (int i = 0; i < nt; i++) {
    tdm__free(ts[i].p);
    tdm__free(ts[i].name);
  }
  tdm__free(ts);
  tdm__free(bytes);
  tdm__free(hcrc);
  return st;
}

/* A checkpoint that failed: this rank's file of it goes, and the shards directory when it is empty,
 * unless a manifest names the step (a disk-full attempt left a whole rank file whose space the
 * retry then lacked). What the error says stays. */
static void drop_own_file(const tdm_ckpt_writer *w) {
  char sname[64], path[4400], manifest[4200];
  struct stat sb;
  if (!w->dir) return; /* it failed before it had one */
  if (snprintf(manifest, sizeof manifest, "%s/ckpt-%012lld.safetensors", w->dir, (long long)w->info.step) >= (int)sizeof manifest ||
      lstat(manifest, &sb) == 0 || !tdm__ckpt_shards_name(w->info.step, sname, sizeof sname))
    return;
  snprintf(path, sizeof path, "%s/%s/rank-%d.safetensors", w->dir, sname, w->rank);
  unlink(path);
  snprintf(path, sizeof path, "%s/%s", w->dir, sname);
  rmdir(path); /* fails, harmlessly, while another rank's file is there */
}

tdm_status tdm_ckpt_writer_commit(tdm_ckpt_writer *w, int keep) {
  if (!w) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint writer: NULL (a rank that could not create one must still "
                                                    "take part: every rank commits)");
  /* every rank makes the same collective calls, failed or not, so none waits for one that gave up */
  tdm_status st = w->st != TDM_OK ? tdm__set_error(w->st, "%s", w->err) : write_file(w);
  st = tdm__ckpt_agree(w->comm, st, "checkpoint");
  blob x = {0};
  unsigned char *all = NULL;
  size_t *lens = NULL, total = 0;
  int64_t *len64 = NULL;
  if (st == TDM_OK) {
    tdm_status mine = describe(w, &x);
    len64 = tdm__malloc(sizeof(int64_t) * (size_t)w->world);
    lens = tdm__malloc(sizeof(size_t) * (size_t)w->world);
    if (mine == TDM_OK && (!len64 || !lens)) mine = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
    st = tdm__ckpt_agree(w->comm, mine, "checkpoint");
  }
  if (st == TDM_OK) {
    int64_t n = (int64_t)x.n;
    st = w->comm ? tdm_comm_allgather(w->comm, &n, len64, 1, TDM_I64, TDM_ALGO_AUTO) : (len64[0] = n, TDM_OK);
  }
  if (st == TDM_OK) {
    for (int r = 0; r < w->world; r++) total += lens[r] = (size_t)len64[r];
    all = tdm__malloc(total + 1);
    st = tdm__ckpt_agree(w->comm, all ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory"), "checkpoint");
  }
  if (st == TDM_OK) {
    if (w->comm) st = tdm_comm_allgather_v(w->comm, x.b, all, total, lens, TDM_U8, TDM_ALGO_AUTO);
    else memcpy(all, x.b, total);
  }
  if (st == TDM_OK) { /* the manifest last, from rank 0; every rank learns how that went */
    tdm_status mine = TDM_OK;
    if (w->rank == 0) {
      tdm__sbuf s = {0};
      mine = build_manifest(w, all, lens, &s);
      if (mine == TDM_OK) mine = tdm__ckpt_write_manifest(w->dir, &w->info, w->optim_steps, s.s, s.n, keep);
      tdm__free(s.s);
    }
    st = tdm__ckpt_agree(w->comm, mine, "checkpoint");
  }
  if (st != TDM_OK) drop_own_file(w);
  tdm__free(x.b);
  tdm__free(all);
  tdm__free(lens);
  tdm__free(len64);
  tdm_ckpt_writer_destroy(w);
  return st;
}

tdm_status tdm_ckpt_save(const char *dir, const tdm_params *p, const tdm_optim *o, const tdm_ckpt_info *info, int keep) {
  if (!p || !o || !info) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: NULL parameters, optimizer or info");
  int64_t numel = tdm_params_numel(p), n_state = 0;
  const float *state = tdm_optim_state(o, &n_state);
  if (tdm_optim_owned(o) != numel)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: the optimizer updates %lld of the %lld elements; tdm_ckpt_save "
                          "saves whole optimizers (tdm_ckpt_save_engine saves shards)", (long long)tdm_optim_owned(o), (long long)numel);
  const char *names[2];
  int k = tdm__optim_state_names(o, names);
  tdm_ckpt_info ci = *info;
  if (!ci.optimizer) ci.optimizer = tdm_optim_kind_name(tdm_optim_get_config(o)->kind);
  if (!ci.layout) ci.layout = "one process";
  tdm_ckpt_writer *w;
  tdm_status st = tdm_ckpt_writer_create(&w, dir, &ci, tdm_optim_steps(o), NULL);
  if (!w) return st; /* out of memory; any other failure is kept in w and reported by commit */
  for (int i = 0; i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    int64_t off = tdm_params_offset(p, i), n = tdm_tensor_numel(t);
    char name[300];
    snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
    tdm_ckpt_writer_tensor(w, name, TDM_F32, tdm_tensor_ndim(t), tdm_tensor_shape(t));
    tdm_ckpt_writer_flat(w, name, 0, n, tdm_params_data(p) + off);
    for (int s = 0; s < k; s++) { /* the state: all of one kind, then the next (tandem/optim.h) */
      snprintf(name, sizeof name, "optim.%s.%s", names[s], tdm_tensor_name(t));
      tdm_ckpt_writer_tensor(w, name, TDM_F32, tdm_tensor_ndim(t), tdm_tensor_shape(t));
      tdm_ckpt_writer_flat(w, name, 0, n, state + s * numel + off);
    }
  }
  return tdm_ckpt_writer_commit(w, keep); /* reports the first failure of the calls above */
}
