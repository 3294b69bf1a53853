/* Reading checkpoints: the pieces that overlap what is asked for, each read whole with pread and
 * checked (the file's header against the manifest once, the piece's CRC-32 every time), then
 * copied box by box; loading whole parameters and optimizers; consolidating into one file. See
 * include/tandem/checkpoint.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train/ckpt_impl.h"

#define MAX_HEADER (100u << 20)

void tdm__ckpt_close_files(tdm_ckpt *c) {
  for (int i = 0; c->files && i < c->n_files; i++)
    if (c->files[i].fd >= 0) {
      close(c->files[i].fd);
      c->files[i].fd = -1;
    }
}

/* The file open, and its header the one the manifest lists. */
static tdm_status file_ready(tdm_ckpt *c, int fi) {
  tdm__cfile *f = &c->files[fi];
  if (f->fd < 0) {
    int64_t size = 0;
    if (access(f->path, F_OK) != 0 && errno == ENOENT)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: shard file %s is missing: the checkpoint is incomplete", c->path, f->path);
    TDM__TRY(tdm__ckpt_open_regular(f->path, &f->fd, &size, "shard file"));
    if (size != f->bytes)
      return tdm__set_error(TDM_ERR_FORMAT, "%s is %lld bytes, but the manifest %s lists %lld: the manifest disagrees with the files",
                            f->path, (long long)size, c->path, (long long)f->bytes);
  }
  if (f->header_ok) return TDM_OK;
  unsigned char len[8];
  if (!tdm__ckpt_read_at(f->fd, len, 8, 0)) return tdm__set_error(TDM_ERR_IO, "%s: cannot read its header: %s", f->path, strerror(errno));
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len[i];
  if (hlen > MAX_HEADER || hlen > (uint64_t)(f->bytes - 8))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: header length %llu does not fit the file: the file is corrupt", f->path,
                          (unsigned long long)hlen);
  unsigned char *h = tdm__malloc(hlen + 8);
  if (!h) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", f->path);
  memcpy(h, len, 8);
  tdm_status st = TDM_OK;
  if (!tdm__ckpt_read_at(f->fd, h + 8, hlen, 8)) st = tdm__set_error(TDM_ERR_IO, "%s: cannot read its header: %s", f->path, strerror(errno));
  uint32_t crc = st == TDM_OK ? tdm__crc32(0, h, (int64_t)hlen + 8) : 0;
  tdm__free(h);
  TDM__TRY(st);
  if (crc != f->header_crc)
    return tdm__set_error(TDM_ERR_FORMAT,
                          "%s: its header (crc %08x) is not the one the manifest %s lists (%08x): a shard of another "
                          "checkpoint, or a manifest that disagrees with its files",
                          f->path, crc, c->path, f->header_crc);
  f->header_ok = 1;
  return TDM_OK;
}

/* Piece pi of tensor ti, read whole and checked, in c->cache. */
static tdm_status read_piece(tdm_ckpt *c, int ti, int pi, const void **data) {
  const tdm__ctensor *t = &c->tensors[ti];
  const tdm__piece *p = &t->pieces[pi];
  if (c->cache_t == ti && c->cache_p == pi) {
    *data = c->cache;
    return TDM_OK;
  }
  c->cache_t = c->cache_p = -1;
  if (p->nbytes > c->cache_cap) {
    tdm__free(c->cache);
    c->cache_cap = 0;
    if (!(c->cache = tdm__aligned_alloc((size_t)p->nbytes)))
      return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: cannot hold a piece of %lld bytes", (long long)p->nbytes);
    c->cache_cap = p->nbytes;
  }
  TDM__TRY(file_ready(c, p->file));
  const tdm__cfile *f = &c->files[p->file];
  char name[400];
  tdm__box_name(t->pub.name, t->pub.ndim, &p->box, name, sizeof name);
  if (!tdm__ckpt_read_at(f->fd, c->cache, (size_t)p->nbytes, p->offset))
    return tdm__set_error(TDM_ERR_FORMAT, "%s: cannot read piece %s (bytes %lld..%lld): %s", f->path, name, (long long)p->offset,
                          (long long)(p->offset + p->nbytes), errno ? strerror(errno) : "the file ends before it");
  c->bytes_read += p->nbytes;
  uint32_t crc = tdm__crc32(0, c->cache, p->nbytes);
  if (crc != p->crc)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: piece %s (bytes %lld..%lld) fails its checksum (the manifest says %08x, read %08x): the file is corrupt",
                          f->path, name, (long long)p->offset, (long long)(p->offset + p->nbytes), p->crc, crc);
  c->cache_t = ti, c->cache_p = pi;
  *data = c->cache;
  return TDM_OK;
}

static int tensor_index(const tdm_ckpt *c, const char *name) {
  for (int i = 0; i < c->n_tensors; i++)
    if (!strcmp(c->tensors[i].pub.name, name)) return i;
  return -1;
}

/* The box need of tensor ti into dst (row-major over need), from every piece that overlaps it:
 * the pieces tile the tensor, so every element comes from exactly one. */
static tdm_status read_into(tdm_ckpt *c, int ti, const tdm__box *need, void *dst) {
  const tdm__ctensor *t = &c->tensors[ti];
  size_t es = tdm_dtype_size(t->pub.dtype);
  for (int i = 0; i < t->pub.n_pieces; i++) {
    tdm__box part;
    if (!tdm__box_intersect(t->pub.ndim, need, &t->pieces[i].box, &part)) continue;
    const void *src = NULL;
    TDM__TRY(read_piece(c, ti, i, &src));
    tdm__box_copy(t->pub.ndim, es, dst, need, src, &t->pieces[i].box, &part);
  }
  return TDM_OK;
}

tdm_status tdm_ckpt_read_box(tdm_ckpt *c, const char *name, const int64_t *start, const int64_t *count, void *dst) {
  if (!c || !name)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_read_box: %s is NULL", !c ? "the checkpoint c" : "the name");
  int ti = c && name ? tensor_index(c, name) : -1;
  if (ti < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: no tensor '%s' in the checkpoint", c ? c->path : "?", name ? name : "(null)");
  const tdm_ckpt_tensor *t = &c->tensors[ti].pub;
  if (t->ndim > 0 && (!start || !count)) /* a 0-d tensor's box has no dimensions to point at */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_read_box: %s is NULL for '%s'", !start ? "start" : "count", name);
  tdm__box b;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (start[d] < 0 || count[d] < 0 || count[d] > t->shape[d] - start[d] || start[d] > t->shape[d])
      return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: dimension %d of the box asked of '%s' starts at %lld for %lld; the tensor has %lld",
                            c->path, d, name, (long long)start[d], (long long)count[d], (long long)t->shape[d]);
    b.start[d] = start[d], b.count[d] = count[d], n *= count[d];
  }
  if (n == 0) return TDM_OK;
  if (!dst)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_read_box: dst is NULL for %lld elements of '%s'", (long long)n, name);
  return read_into(c, ti, &b, dst);
}

tdm_status tdm_ckpt_read_flat(tdm_ckpt *c, const char *name, int64_t lo, int64_t hi, void *dst) {
  if (!c || !name || (!dst && hi > lo))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_read_flat: %s is NULL",
                          !c ? "the checkpoint c" : !name ? "the name" : "dst");
  int ti = c && name ? tensor_index(c, name) : -1;
  if (ti < 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: no tensor '%s' in the checkpoint", c ? c->path : "?", name ? name : "(null)");
  const tdm_ckpt_tensor *t = &c->tensors[ti].pub;
  int64_t numel = 1, stride[TDM_MAX_DIMS];
  for (int d = t->ndim - 1; d >= 0; d--) stride[d] = numel, numel *= t->shape[d];
  if (lo < 0 || hi < lo || hi > numel)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: elements [%lld, %lld) asked of '%s', which has %lld", c->path, (long long)lo,
                          (long long)hi, name, (long long)numel);
  tdm__box boxes[2 * TDM_MAX_DIMS];
  int nb = tdm__flat_boxes(t->ndim, t->shape, lo, hi, boxes);
  size_t es = tdm_dtype_size(t->dtype);
  for (int k = 0; k < nb; k++) { /* each box is contiguous in row-major order: its place in dst */
    int64_t at = 0;
    for (int d = 0; d < t->ndim; d++) at += boxes[k].start[d] * stride[d];
    TDM__TRY(read_into(c, ti, &boxes[k], (char *)dst + (at - lo) * (int64_t)es));
  }
  return TDM_OK;
}

tdm_status tdm_ckpt_verify_data(tdm_ckpt *c) {
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_ckpt_verify_data: the checkpoint c is NULL");
  for (int i = 0; i < c->n_files; i++) TDM__TRY(file_ready(c, i));
  for (int ti = 0; ti < c->n_tensors; ti++)
    for (int pi = 0; pi < c->tensors[ti].pub.n_pieces; pi++) {
      const void *d;
      TDM__TRY(read_piece(c, ti, pi, &d));
    }
  return TDM_OK;
}

int64_t tdm_ckpt_bytes_read(const tdm_ckpt *c) {
  TDM__NONNULL(c, 0, "tdm_ckpt_bytes_read: the checkpoint c is NULL");
  return c->bytes_read;
}

/* ---- the model and the optimizer against the manifest ------------------------------------------- */
int tdm__optim_state_names(const tdm_optim *o, const char **names) {
  if (!o) return 0;
  int64_t n_state = 0;
  tdm_optim_state(o, &n_state);
  const tdm_optim_config *oc = tdm_optim_get_config(o);
  if (oc->kind == TDM_OPT_SGD) {
    /* the configuration decides, not the state held: a parameter server's worker holds none (its
     * servers keep the momentum), and read "without momentum" it refused its own checkpoints */
    if (!(oc->momentum > 0) && !n_state) return 0;
    names[0] = "momentum_buffer";
    return 1;
  }
  names[0] = "exp_avg", names[1] = "exp_avg_sq";
  return 2;
}

tdm_status tdm__ckpt_check_model(const tdm_ckpt *c, const tdm_params *p) {
  int n = tdm_params_count(p), in_file = 0;
  for (int i = 0; i < c->n_tensors; i++) in_file += !strncmp(c->tensors[i].pub.name, "model.", 6);
  for (int i = 0; i < n; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[300], a[96], b[96];
    snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
    const tdm_ckpt_tensor *s = tdm_ckpt_tensor_find(c, name);
    if (!s)
      return tdm__set_error(TDM_ERR_MISMATCH, "%s: parameter '%s' is missing: is this the same model?", c->path, tdm_tensor_name(t));
    if (s->dtype != TDM_F32 || s->ndim != tdm_tensor_ndim(t) ||
        memcmp(s->shape, tdm_tensor_shape(t), sizeof(int64_t) * (size_t)s->ndim))
      return tdm__set_error(TDM_ERR_MISMATCH, "%s: parameter '%s' is %s %s in the checkpoint; the model expects %s %s", c->path,
                            tdm_tensor_name(t), tdm_dtype_name(s->dtype), tdm_shape_str(s->ndim, s->shape, a, sizeof a),
                            tdm_dtype_name(TDM_F32), tdm_shape_str(tdm_tensor_ndim(t), tdm_tensor_shape(t), b, sizeof b));
  }
  if (in_file != n)
    return tdm__set_error(TDM_ERR_MISMATCH, "%s holds %d parameters; the model has %d: is this the same model?", c->path, in_file, n);
  return TDM_OK;
}

tdm_status tdm__ckpt_check_optim(const tdm_ckpt *c, const tdm_optim *o, const tdm_params *p) {
  const char *names[2];
  int k = tdm__optim_state_names(o, names);
  const char *kind = tdm_optim_kind_name(tdm_optim_get_config(o)->kind), *ck = c->info.optimizer;
  if (!ck || strcmp(ck, kind))
    return tdm__set_error(TDM_ERR_MISMATCH, "%s: written with optimizer %s; this optimizer is %s: the optimizer cannot change on resume",
                          c->path, ck ? ck : "(none)", kind);
  int in_file = 0;
  for (int i = 0; i < c->n_tensors; i++) in_file += !strncmp(c->tensors[i].pub.name, "optim.", 6);
  for (int s = 0; s < k; s++)
    for (int i = 0; i < tdm_params_count(p); i++) {
      tdm_tensor *t = tdm_params_get(p, i);
      char name[300];
      snprintf(name, sizeof name, "optim.%s.%s", names[s], tdm_tensor_name(t));
      const tdm_ckpt_tensor *x = tdm_ckpt_tensor_find(c, name);
      if (!x || x->dtype != TDM_F32 || x->ndim != tdm_tensor_ndim(t) ||
          memcmp(x->shape, tdm_tensor_shape(t), sizeof(int64_t) * (size_t)x->ndim))
        return tdm__set_error(TDM_ERR_MISMATCH, "%s: the optimizer state '%s' is %s: is it the same optimizer (%s%s)?", c->path,
                              name, x ? "of another dtype or shape" : "missing", kind,
                              !strcmp(kind, "sgd") ? (k ? ", with momentum" : ", without momentum") : "");
    }
  if (in_file != k * tdm_params_count(p))
    return tdm__set_error(TDM_ERR_MISMATCH, "%s holds %d optimizer tensors; this optimizer (%s%s) keeps %d: is it the same optimizer?",
                          c->path, in_file, kind, !strcmp(kind, "sgd") ? (k ? ", with momentum" : ", without momentum") : "",
                          k * tdm_params_count(p));
  return TDM_OK;
}

/* ---- whole parameters and optimizers ------------------------------------------------------------ */
tdm_status tdm_ckpt_restore(tdm_ckpt *c, tdm_params *p, tdm_optim *o) {
  if (!c || !p) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint restore: NULL argument");
  TDM__TRY(tdm__ckpt_check_model(c, p));
  int64_t numel = tdm_params_numel(p), n_state = 0;
  float *state = o ? tdm_optim_state(o, &n_state) : NULL;
  if (o) {
    TDM__TRY(tdm__ckpt_check_optim(c, o, p));
    if (tdm_optim_owned(o) != numel)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint restore: the optimizer updates %lld of the %lld elements; "
                            "restore loads whole optimizers (tdm_ckpt_resume_engine loads shards)",
                            (long long)tdm_optim_owned(o), (long long)numel);
  }
  /* staged: a file that proves corrupt half way leaves p and o as they were */
  float *w = tdm__aligned_alloc(sizeof(float) * (size_t)(numel + n_state + 1));
  if (!w) return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint restore: cannot stage %lld floats", (long long)(numel + n_state));
  const char *names[2];
  int k = tdm__optim_state_names(o, names);
  tdm_status st = TDM_OK;
  for (int i = 0; st == TDM_OK && i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[300];
    int64_t off = tdm_params_offset(p, i), n = tdm_tensor_numel(t);
    snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
    st = tdm_ckpt_read_flat(c, name, 0, n, w + off);
    for (int s = 0; st == TDM_OK && s < k; s++) { /* state: all of one kind, then the next (tandem/optim.h) */
      snprintf(name, sizeof name, "optim.%s.%s", names[s], tdm_tensor_name(t));
      st = tdm_ckpt_read_flat(c, name, 0, n, w + numel + s * numel + off);
    }
  }
  if (st == TDM_OK) {
    memcpy(tdm_params_data(p), w, sizeof(float) * (size_t)numel);
    if (n_state) memcpy(state, w + numel, sizeof(float) * (size_t)n_state);
    if (o) tdm_optim_set_steps(o, c->optim_steps);
  }
  tdm__free(w);
  return st;
}

/* ---- one file of the logical tensors -------------------------------------------------------------- */
static int skipped_key(const char *k) { /* the checkpoint's own, which depend on the layout or the file */
  static const char *const own[] = {"tandem.kind", "tandem.ckpt_version", "tandem.crc32", "tandem.world_size", "tandem.layout",
                                     "format"};
  for (size_t i = 0; i < sizeof own / sizeof *own; i++)
    if (!strcmp(k, own[i])) return 1;
  return 0;
}

tdm_status tdm_ckpt_consolidate(tdm_ckpt *c, const char *out_path, int with_optimizer) {
  if (!c || !out_path) return tdm__set_error(TDM_ERR_INVALID_ARG, "consolidate: NULL argument");
  tdm_st_tensor *ts = tdm__calloc((size_t)c->n_tensors + 1, sizeof *ts);
  int *which = tdm__calloc((size_t)c->n_tensors + 1, sizeof *which);
  const char **meta = tdm__calloc(2 * (size_t)c->n_meta + 4, sizeof *meta);
  if (!ts || !which || !meta) {
    tdm__free(ts);
    tdm__free(which);
    tdm__free(meta);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "consolidate: out of memory");
  }
  int n = 0, nm = 0;
  for (int pass = 0; pass < 2; pass++) /* the parameters first, then (with_optimizer) the rest, in manifest order */
    for (int i = 0; i < c->n_tensors; i++) {
      const tdm_ckpt_tensor *t = &c->tensors[i].pub;
      int param = !strncmp(t->name, "model.", 6);
      if (pass == 0 ? !param : (param || !with_optimizer)) continue;
      ts[n] = (tdm_st_tensor){param ? t->name + 6 : t->name, t->dtype, t->ndim, {0}, NULL, 0};
      memcpy(ts[n].shape, t->shape, sizeof t->shape);
      ts[n].nbytes = (int64_t)tdm_dtype_size(t->dtype);
      for (int d = 0; d < t->ndim; d++) ts[n].nbytes *= t->shape[d];
      which[n++] = i;
    }
  meta[nm++] = "format", meta[nm++] = "pt";
  for (int i = 0; i < c->n_meta; i++)
    if (!skipped_key(c->meta[2 * i]) && (with_optimizer || strcmp(c->meta[2 * i], "tandem.optim_kind")))
      meta[nm++] = c->meta[2 * i], meta[nm++] = c->meta[2 * i + 1];
  tdm_st_writer *w = NULL;
  tdm_status st = tdm_safetensors_writer_open(&w, out_path, n, ts, nm / 2, meta);
  void *buf = NULL;
  int64_t cap = 0;
  for (int k = 0; st == TDM_OK && k < n; k++) { /* one tensor at a time */
    if (ts[k].nbytes > cap) {
      tdm__free(buf);
      if (!(buf = tdm__aligned_alloc((size_t)ts[k].nbytes))) {
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "consolidate: cannot hold '%s' (%lld bytes)", ts[k].name, (long long)ts[k].nbytes);
        break;
      }
      cap = ts[k].nbytes;
    }
    const tdm_ckpt_tensor *t = &c->tensors[which[k]].pub;
    int64_t es = (int64_t)tdm_dtype_size(t->dtype);
    st = tdm_ckpt_read_flat(c, t->name, 0, ts[k].nbytes / es, buf);
    if (st == TDM_OK) st = tdm_safetensors_writer_write(w, buf, (size_t)ts[k].nbytes);
  }
  if (w) {
    if (st == TDM_OK) st = tdm_safetensors_writer_commit(w);
    else tdm_safetensors_writer_abort(w);
  }
  tdm__free(buf);
  tdm__free(ts);
  tdm__free(which);
  tdm__free(meta);
  return st;
}
