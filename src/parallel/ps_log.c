/* The parameter server's update log: every update a server applies, in the order it applied it,
 * with the gradient and learning rate the optimizer got. Replaying a server's log on the initial
 * shard (the seed's values) with the same optimizer redoes exactly those steps, so it reproduces
 * an async or ssp run bit for bit, and can stop after any update to look at the state then.
 *
 * File DIR/ps-server-K.log: a header, then one record per update, each the record header and the
 * n = hi - lo gradient floats:
 *   header  "TDMPSLG1", u32 version 1, u32 server, u32 servers, u32 mode, u32 workers, u32 0,
 *           i64 lo, i64 hi, u64 n_params                                          (56 bytes)
 *   record  u32 "TPSE", u32 worker (sync: the number of workers, the round's sum), i64 update
 *           index, i64 clock, i64 version the gradient was computed on, f32 lr, u32 0,
 *           u64 checksum of the floats                                            (48 bytes) */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "parallel/engine_impl.h"
#include "parallel/ps_log.h"
#include "parallel/ps_msg.h"

#define LOG_MAGIC "TDMPSLG1"
#define REC_MAGIC 0x45535054u /* "TPSE" */

typedef struct {
  char magic[8];
  uint32_t version, server, servers, mode, workers, pad;
  int64_t lo, hi;
  uint64_t n_params;
} log_hdr;
_Static_assert(sizeof(log_hdr) == 56, "the log header is 56 bytes");

typedef struct {
  uint32_t magic, worker;
  int64_t index, clock, version;
  float lr;
  uint32_t pad;
  uint64_t sum;
} log_rec;
_Static_assert(sizeof(log_rec) == 48, "a log record is 48 bytes");

struct tdm__ps_log {
  FILE *f;
  char path[4096];
  int64_t n, index;
};

static void log_path(char *out, size_t n, const char *dir, int server) {
  snprintf(out, n, "%s/ps-server-%d.log", dir, server);
}

tdm_status tdm__ps_log_open(tdm__ps_log **out, const char *dir, int server, int servers, int mode, int workers, int64_t lo,
                            int64_t hi, int64_t n_params) {
  *out = NULL;
  tdm__ps_log *l = tdm__calloc(1, sizeof *l);
  if (!l) return tdm__set_error(TDM_ERR_NO_MEMORY, "ps log: out of memory");
  log_path(l->path, sizeof l->path, dir, server);
  l->n = hi - lo;
  mkdir(dir, 0777); /* servers may share it; an error shows at fopen */
  log_hdr h = {LOG_MAGIC, 1, (uint32_t)server, (uint32_t)servers, (uint32_t)mode, (uint32_t)workers, 0, lo, hi,
               (uint64_t)n_params};
  memcpy(h.magic, LOG_MAGIC, 8);
  l->f = fopen(l->path, "wb");
  if (!l->f || fwrite(&h, sizeof h, 1, l->f) != 1) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "ps log: cannot write %s: %s", l->path, strerror(errno));
    tdm__ps_log_close(l, NULL);
    return st;
  }
  *out = l;
  return TDM_OK;
}

tdm_status tdm__ps_log_append(tdm__ps_log *l, int worker, int64_t clock, int64_t version, float lr, const float *grad) {
  log_rec r = {REC_MAGIC, (uint32_t)worker, l->index++, clock, version, lr, 0, tdm__ps_sum(grad, l->n)};
  if (fwrite(&r, sizeof r, 1, l->f) != 1 || (l->n && fwrite(grad, sizeof(float), (size_t)l->n, l->f) != (size_t)l->n))
    return tdm__set_error(TDM_ERR_IO, "ps log: writing update %lld to %s failed: %s", (long long)r.index, l->path,
                          strerror(errno));
  return TDM_OK;
}

tdm_status tdm__ps_log_close(tdm__ps_log *l, int64_t *updates) {
  if (!l) return TDM_OK;
  tdm_status st = TDM_OK;
  if (l->f && fclose(l->f) != 0) st = tdm__set_error(TDM_ERR_IO, "ps log: closing %s failed: %s", l->path, strerror(errno));
  if (updates) *updates = l->index;
  tdm__free(l);
  return st;
}

/* ---- replay ---------------------------------------------------------------------------------- */
static tdm_status replay_one(FILE *f, const char *path, int s, tdm_params *params, const tdm_optim_config *oc,
                             int64_t until, int *servers, tdm_ps_replay_stats *rs) {
  log_hdr h;
  int64_t numel = tdm_params_numel(params);
  if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, LOG_MAGIC, 8) || h.version != 1)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: not a parameter server log (bad header)", path);
  if ((int)h.server != s || h.lo < 0 || h.hi < h.lo || h.hi > numel || h.n_params != (uint64_t)numel)
    return tdm__set_error(TDM_ERR_MISMATCH, "%s: server %u, keys [%lld, %lld) of %llu parameters; this model has %lld "
                          "(replay with the run's options)", path, h.server, (long long)h.lo, (long long)h.hi,
                          (unsigned long long)h.n_params, (long long)numel);
  *servers = (int)h.servers;
  tdm_optim *opt = NULL;
  tdm_optim_span span = {h.lo, h.hi};
  TDM__TRY(tdm_optim_create_spans(&opt, oc, params, 1, &span));
  float *g = tdm_params_grad(params) + h.lo;
  int64_t n = h.hi - h.lo, k = 0;
  tdm_status st = TDM_OK;
  for (; until < 0 || k < until; k++) {
    log_rec r;
    size_t got = fread(&r, 1, sizeof r, f);
    if (got == 0 && feof(f)) break;
    if (got != sizeof r || r.magic != REC_MAGIC || r.index != k ||
        (n && fread(g, sizeof(float), (size_t)n, f) != (size_t)n)) {
      st = tdm__set_error(TDM_ERR_FORMAT, "%s: update %lld is truncated or malformed", path, (long long)k);
      break;
    }
    if (r.sum != tdm__ps_sum(g, n)) {
      st = tdm__set_error(TDM_ERR_FORMAT, "%s: update %lld (worker %u) fails its checksum: corrupt, not applied", path,
                          (long long)k, r.worker);
      break;
    }
    if ((st = tdm_optim_step(opt, r.lr)) != TDM_OK) break;
  }
  tdm_optim_destroy(opt);
  rs->updates[s < 64 ? s : 63] = k;
  return st;
}

tdm_status tdm_ps_replay(const char *dir, const tdm_model_config *mc, uint64_t seed, const tdm_optim_config *oc,
                         int64_t until, const char *save_path, int n_meta, const char *const *meta_kv,
                         tdm_ps_replay_stats *rs) {
  if (!dir || !mc || !oc || !rs) return tdm__set_error(TDM_ERR_INVALID_ARG, "ps_replay: NULL argument");
  memset(rs, 0, sizeof *rs);
  tdm_model *model = NULL;
  TDM__TRY(tdm_model_create(&model, mc, seed));
  tdm_params *params = tdm_model_params(model);
  tdm_status st = TDM_OK;
  int servers = 1;
  for (int s = 0; st == TDM_OK && s < servers && s < 64; s++) {
    char path[4096];
    log_path(path, sizeof path, dir, s);
    FILE *f = fopen(path, "rb");
    if (!f) {
      st = tdm__set_error(TDM_ERR_IO, "ps_replay: cannot open %s: %s%s", path, strerror(errno),
                          s ? " (the log of server 0 names more servers)" : "");
      break;
    }
    st = replay_one(f, path, s, params, oc, until, &servers, rs);
    fclose(f);
    rs->servers = s + 1;
  }
  if (st == TDM_OK && save_path) st = tdm_params_save(params, save_path, n_meta, meta_kv);
  tdm_model_destroy(model);
  return st;
}
