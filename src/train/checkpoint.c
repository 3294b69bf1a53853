/* Checkpoints as verified safetensors files; see include/tandem/checkpoint.h. */
#include "tandem/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/internal.h"
#include "tandem/safetensors.h"
#include "tensor/tensor_impl.h"

static uint32_t crc_of(const tdm_st_tensor *ts, int n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int i = 0; i < n; i++) {
    const unsigned char *p = ts[i].data;
    for (int64_t left = ts[i].nbytes; left > 0;) { /* crc32 takes uInt lengths */
      uInt k = left > (1 << 30) ? (1u << 30) : (uInt)left;
      crc = crc32(crc, p, k);
      p += k;
      left -= k;
    }
  }
  return (uint32_t)crc;
}

static void path_of(const char *dir, int64_t step, char *out, size_t n) {
  snprintf(out, n, "%s/ckpt-%012lld.safetensors", dir, (long long)step);
}

/* Steps of the checkpoints in dir, newest first. */
static int list_steps(const char *dir, int64_t *steps, int max) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < max) {
    long long s;
    char tail[32];
    if (sscanf(e->d_name, "ckpt-%lld.%31s", &s, tail) == 2 && !strcmp(tail, "safetensors")) steps[n++] = s;
  }
  closedir(d);
  for (int i = 1; i < n; i++) /* newest first */
    for (int j = i; j > 0 && steps[j - 1] < steps[j]; j--) {
      int64_t t = steps[j];
      steps[j] = steps[j - 1];
      steps[j - 1] = t;
    }
  return n;
}

/* Reads and verifies a checkpoint's checksum; the caller destroys *out. */
static tdm_status open_verified(const char *path, tdm_safetensors **out) {
  tdm_safetensors *f;
  TDM__TRY(tdm_safetensors_load(&f, path));
  const char *want = tdm_safetensors_meta(f, "tandem.crc32");
  int n = tdm_safetensors_count(f);
  tdm_st_tensor *ts = tdm__malloc(sizeof *ts * (size_t)(n ? n : 1));
  if (!ts) {
    tdm_safetensors_destroy(f);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  }
  for (int i = 0; i < n; i++) ts[i] = *tdm_safetensors_at(f, i);
  char got[16];
  snprintf(got, sizeof got, "%08x", crc_of(ts, n));
  tdm__free(ts);
  if (!want || strcmp(want, got)) { /* want lives in f: the message first, then the file goes */
    tdm_status st = tdm__set_error(TDM_ERR_FORMAT, "%s: checksum mismatch (stored %s, computed %s): the file is corrupt",
                                   path, want ? want : "none", got);
    tdm_safetensors_destroy(f);
    return st;
  }
  *out = f;
  return TDM_OK;
}

tdm_status tdm_ckpt_save(const char *dir, const tdm_params *p, const tdm_optim *o, const tdm_ckpt_info *info, int keep) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return tdm__set_error(TDM_ERR_IO, "checkpoint: cannot create directory %s: %s", dir, strerror(errno));
  int n = tdm_params_count(p);
  int64_t n_state = 0;
  float *state = tdm_optim_state(o, &n_state);
  tdm_st_tensor *ts = tdm__calloc((size_t)n + 1, sizeof *ts);
  char **names = tdm__calloc((size_t)n + 1, sizeof(char *));
  if (!ts || !names) {
    tdm__free(ts);
    tdm__free(names);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    names[i] = tdm__malloc(strlen(t->name) + 8);
    sprintf(names[i], "model.%s", t->name);
    ts[k++] = (tdm_st_tensor){names[i], TDM_F32, t->ndim, {0}, t->data, t->numel * 4};
    memcpy(ts[k - 1].shape, t->shape, sizeof t->shape);
  }
  if (n_state) ts[k++] = (tdm_st_tensor){"optim.state", TDM_F32, 1, {n_state}, state, n_state * 4};
  char crc[16], step[32], ostep[32], ws[16], seed[32];
  snprintf(crc, sizeof crc, "%08x", crc_of(ts, k));
  snprintf(step, sizeof step, "%lld", (long long)info->step);
  snprintf(ostep, sizeof ostep, "%lld", (long long)tdm_optim_steps(o));
  snprintf(ws, sizeof ws, "%d", info->world_size);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)info->seed);
  enum { BASE_META = 7, MAX_EXTRA = 16 };
  const char *meta[2 * (BASE_META + MAX_EXTRA)] = {"format", "pt", "tandem.kind", "checkpoint", "tandem.step", step,
                                                   "tandem.optim_steps", ostep, "tandem.world_size", ws, "tandem.seed",
                                                   seed, "tandem.crc32", crc};
  int n_meta = BASE_META;
  for (int i = 0; i < info->n_meta && i < MAX_EXTRA; i++, n_meta++) {
    meta[2 * n_meta] = info->meta_kv[2 * i];
    meta[2 * n_meta + 1] = info->meta_kv[2 * i + 1];
  }
  char path[4096];
  path_of(dir, info->step, path, sizeof path);
  tdm_status st = tdm_safetensors_save(path, k, ts, n_meta, meta);
  for (int i = 0; i < n; i++) tdm__free(names[i]);
  tdm__free(names);
  tdm__free(ts);
  TDM__TRY(st);
  tdm_safetensors *check; /* read it back: only a verified checkpoint may retire older ones */
  TDM__TRY(open_verified(path, &check));
  tdm_safetensors_destroy(check);
  int64_t steps[1024];
  int m = list_steps(dir, steps, 1024);
  for (int i = keep > 0 ? keep : 1; i < m; i++) {
    char old[4096];
    path_of(dir, steps[i], old, sizeof old);
    unlink(old);
  }
  return TDM_OK;
}

tdm_status tdm_ckpt_load_file(const char *path, tdm_params *p, tdm_optim *o, int world_size, tdm_ckpt_info *info) {
  tdm_safetensors *f;
  TDM__TRY(open_verified(path, &f));
  tdm_status st = TDM_OK;
  const char *ws = tdm_safetensors_meta(f, "tandem.world_size"), *step = tdm_safetensors_meta(f, "tandem.step"),
             *ostep = tdm_safetensors_meta(f, "tandem.optim_steps"), *seed = tdm_safetensors_meta(f, "tandem.seed");
  if (!ws || !step || !ostep) st = tdm__set_error(TDM_ERR_FORMAT, "%s: not a tandem checkpoint (metadata missing)", path);
  else if (world_size > 0 && atoi(ws) != world_size)
    st = tdm__set_error(TDM_ERR_MISMATCH,
                        "%s was written by %s ranks; this run has %d. Resume with the same number of ranks (or start afresh in another --checkpoint-dir)",
                        path, ws, world_size);
  int n = tdm_params_count(p);
  for (int i = 0; st == TDM_OK && i < n; i++) { /* check everything before changing anything */
    tdm_tensor *t = tdm_params_get(p, i);
    char name[300];
    snprintf(name, sizeof name, "model.%s", t->name);
    const tdm_st_tensor *s = tdm_safetensors_find(f, name);
    if (!s || s->nbytes != t->numel * 4 || s->dtype != TDM_F32)
      st = tdm__set_error(TDM_ERR_MISMATCH, "%s: parameter '%s' is missing or has another shape: is this the same model?",
                          path, t->name);
  }
  int64_t n_state = 0;
  float *state = o ? tdm_optim_state(o, &n_state) : NULL;
  const tdm_st_tensor *os = tdm_safetensors_find(f, "optim.state");
  if (st == TDM_OK && o && (os ? os->nbytes : 0) != n_state * 4)
    st = tdm__set_error(TDM_ERR_MISMATCH, "%s: optimizer state of %lld floats; this optimizer has %lld: is it the same optimizer?",
                        path, (long long)(os ? os->nbytes / 4 : 0), (long long)n_state);
  if (st == TDM_OK) {
    for (int i = 0; i < n; i++) {
      tdm_tensor *t = tdm_params_get(p, i);
      char name[300];
      snprintf(name, sizeof name, "model.%s", t->name);
      memcpy(t->data, tdm_safetensors_find(f, name)->data, (size_t)t->numel * 4);
    }
    if (o) {
      if (n_state) memcpy(state, os->data, (size_t)n_state * 4);
      tdm_optim_set_steps(o, atoll(ostep));
    }
    info->step = atoll(step);
    info->world_size = atoi(ws);
    info->seed = seed ? strtoull(seed, NULL, 10) : 0;
  }
  tdm_safetensors_destroy(f);
  return st;
}

tdm_status tdm_ckpt_load_latest(const char *dir, tdm_params *p, tdm_optim *o, int world_size, tdm_ckpt_info *info,
                                char *warning, size_t warning_n) {
  if (warning && warning_n) warning[0] = 0;
  int64_t steps[1024];
  int m = list_steps(dir, steps, 1024);
  if (m == 0) return tdm__set_error(TDM_ERR_IO, "no checkpoint in %s", dir);
  for (int i = 0; i < m; i++) {
    char path[4096];
    path_of(dir, steps[i], path, sizeof path);
    tdm_status st = tdm_ckpt_load_file(path, p, o, world_size, info);
    if (st == TDM_OK) return TDM_OK;
    if (st != TDM_ERR_FORMAT) return st; /* a good file that does not fit: say so, do not skip */
    if (warning && warning_n) { /* corrupt: note it and fall back to the previous one */
      size_t used = strlen(warning);
      snprintf(warning + used, warning_n - used, "%s%s", used ? "; " : "", tdm_last_error());
    }
  }
  return tdm__set_error(TDM_ERR_FORMAT, "no valid checkpoint in %s: %s", dir, warning ? warning : "all corrupt");
}

tdm_status tdm_ckpt_latest(const char *dir, char *path, size_t path_n, char *warning, size_t warning_n) {
  if (warning && warning_n) warning[0] = 0;
  int64_t steps[1024];
  int m = list_steps(dir, steps, 1024);
  if (m == 0) return tdm__set_error(TDM_ERR_IO, "no checkpoint in %s", dir);
  for (int i = 0; i < m; i++) {
    path_of(dir, steps[i], path, path_n);
    tdm_safetensors *f;
    if (open_verified(path, &f) == TDM_OK) {
      tdm_safetensors_destroy(f);
      return TDM_OK;
    }
    if (warning && warning_n) {
      size_t used = strlen(warning);
      snprintf(warning + used, warning_n - used, "%s%s", used ? "; " : "", tdm_last_error());
    }
  }
  return tdm__set_error(TDM_ERR_FORMAT, "no valid checkpoint in %s: %s", dir, warning ? warning : "all corrupt");
}
