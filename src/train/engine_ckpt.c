/* Checkpoints of a parallelism engine's state (see engine_ckpt.h). */
#include "train/engine_ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* Every rank learns whether all succeeded; a failure is reported on every rank with the first
 * failing rank's message. Collective over comm (NULL: one process). */
static tdm_status all_agree(tdm_comm_t comm, tdm_status st, const char *what) {
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
  return tdm__set_error(code, "%s: rank %d failed: %.480s", what, first, msg);
}

static const tdm_st_tensor *find_in(void *ctx, const char *name) { return tdm_ckpt_find(ctx, name); }

tdm_status tdm__engine_ckpt_save(tdm_engine *e, tdm_comm_t comm, const char *dir, const tdm_ckpt_info *info, int keep) {
  int R = comm ? tdm_comm_rank(comm) : 0, W = comm ? tdm_comm_size(comm) : 1;
  tdm_params *p = tdm_model_params(tdm_engine_model(e));
  tdm_optim *o = tdm_engine_optim(e);
  if (!tdm_engine_is_sharded(e)) { /* the same on every rank: rank 0 writes it */
    tdm_status st = R == 0 ? tdm_ckpt_save(dir, p, o, info, keep) : TDM_OK;
    return all_agree(comm, st, "checkpoint");
  }
  /* every rank's shard first, then the main file that lists them: a main file that verifies
   * means every shard was written */
  tdm_st_tensor ts[3];
  int n = 0;
  uint32_t crc = 0;
  tdm_status st = tdm_engine_shard_state(e, ts, &n);
  if (st == TDM_OK) st = tdm_ckpt_save_shard(dir, info, R, n, ts, &crc);
  TDM__TRY(all_agree(comm, st, "checkpoint shard"));
  uint32_t *crcs = tdm__malloc(sizeof(uint32_t) * (size_t)W);
  char *list = tdm__malloc((size_t)W * 9 + 1);
  int np = tdm_params_count(p), whole = tdm_engine_params_whole(e);
  tdm_st_tensor *mt = tdm__calloc((size_t)(np + 1), sizeof *mt);
  char **names = tdm__calloc((size_t)(np + 1), sizeof(char *));
  const char **kv = tdm__calloc(2 * (size_t)(info->n_meta + 1), sizeof(char *));
  st = crcs && list && mt && names && kv ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
  if (st == TDM_OK && comm) st = tdm_comm_allgather(comm, &crc, crcs, 1, TDM_I32, TDM_ALGO_AUTO);
  else if (st == TDM_OK) crcs[0] = crc;
  if (st == TDM_OK && R == 0) {
    list[0] = 0;
    for (int r = 0; r < W; r++) snprintf(list + strlen(list), 10, "%s%08x", r ? "," : "", crcs[r]);
    int k = 0;
    for (int i = 0; whole && st == TDM_OK && i < np; i++) { /* the parameters, whole below stage 3 */
      tdm_tensor *t = tdm_params_get(p, i);
      size_t len = strlen(tdm_tensor_name(t)) + 8;
      if (!(names[i] = tdm__malloc(len))) {
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory");
        break;
      }
      snprintf(names[i], len, "model.%s", tdm_tensor_name(t));
      mt[k] = (tdm_st_tensor){names[i], TDM_F32, tdm_tensor_ndim(t), {0}, tdm_tensor_data(t), tdm_tensor_numel(t) * 4};
      memcpy(mt[k].shape, tdm_tensor_shape(t), sizeof(int64_t) * (size_t)tdm_tensor_ndim(t));
      k++;
    }
    for (int i = 0; i < 2 * info->n_meta; i++) kv[i] = info->meta_kv[i];
    kv[2 * info->n_meta] = "tandem.shard_crcs";
    kv[2 * info->n_meta + 1] = list;
    tdm_ckpt_info mi = *info;
    mi.n_meta = info->n_meta + 1;
    mi.meta_kv = kv;
    if (st == TDM_OK) st = tdm_ckpt_save_tensors(dir, &mi, tdm_optim_steps(o), k, mt, keep);
  }
  for (int i = 0; names && i < np; i++) tdm__free(names[i]);
  tdm__free(names);
  tdm__free(mt);
  tdm__free(kv);
  tdm__free(list);
  tdm__free(crcs);
  return all_agree(comm, st, "checkpoint");
}

/* fp16's loss scaler, which the trainer stores beside the settings: the resumed run goes on with
 * the scale and the count of clean steps it had, so it stays bit-identical. */
static tdm_status restore_loss_scale(tdm_engine *e, const tdm_ckpt *ck) {
  const char *sv = tdm_ckpt_meta(ck, "tandem.loss_scale"), *gv = tdm_ckpt_meta(ck, "tandem.loss_scale_good");
  if (!sv || !gv) return TDM_OK;
  char *end1, *end2;
  double scale = strtod(sv, &end1);
  long long good = strtoll(gv, &end2, 10);
  if (end1 == sv || *end1 || end2 == gv || *end2 || !(scale > 0) || good < 0)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: loss scale '%s', clean steps '%s'; expected a positive number and a count",
                          tdm_ckpt_path(ck), sv, gv);
  return tdm_engine_set_loss_scale(e, scale, good);
}

tdm_status tdm__engine_ckpt_restore(tdm_engine *e, int rank, int world, const tdm_ckpt *ck) {
  TDM__TRY(restore_loss_scale(e, ck));
  tdm_params *p = tdm_model_params(tdm_engine_model(e));
  int sharded_file = tdm_ckpt_meta(ck, "tandem.shard_crcs") != NULL;
  if (sharded_file != tdm_engine_is_sharded(e)) /* the settings check names the stages; this is a last guard */
    return tdm__set_error(TDM_ERR_MISMATCH, "%s was written %s shards; this run (%s) %s them",
                          tdm_ckpt_path(ck), sharded_file ? "with" : "without", tdm_engine_describe(e),
                          tdm_engine_is_sharded(e) ? "needs" : "has none of");
  if (!sharded_file) return tdm_ckpt_restore(ck, p, tdm_engine_optim(e), world);
  if (tdm_engine_params_whole(e)) TDM__TRY(tdm_ckpt_restore(ck, p, NULL, world));
  else if (tdm_ckpt_get_info(ck)->world_size != world)
    return tdm__set_error(TDM_ERR_MISMATCH, "%s was written by %d ranks; this run has %d", tdm_ckpt_path(ck),
                          tdm_ckpt_get_info(ck)->world_size, world);
  tdm_ckpt *shard;
  TDM__TRY(tdm_ckpt_open_shard(ck, rank, &shard));
  tdm_status st = tdm_engine_load_shard_state(e, find_in, shard, tdm_ckpt_get_optim_steps(ck));
  if (st != TDM_OK) st = tdm__set_error(st, "%s: %s", tdm_ckpt_path(shard), tdm_last_error());
  tdm_ckpt_close(shard);
  return st;
}
