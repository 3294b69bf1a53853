/* One rank of the resharding test with real processes (tests/multirank/test_reshard.sh), started by
 * tandem run:
 *   reshard_job save DIR MODEL        ZeRO stage 3 over the world: SAVED steps, then a checkpoint
 *   reshard_job resume DIR MODEL OUT  for each stage 0-3: resume from DIR at this world size, save the
 *                                     state as loaded (OUT/s<stage>-loaded), train MORE steps, save
 *                                     (OUT/s<stage>-final); then the same state put in place by hand in
 *                                     data parallelism (from DIR consolidated with its moments), trained
 *                                     alike (OUT/ref-final)
 * MODEL: mlp or gpt (tests/reshard_model.h). The script compares the checkpoints with tandem
 * checkpoint consolidate. Exit 0, or 1 naming the failure. */
#include <unistd.h>

#include "reshard_model.h"

static tdm_status resume_stage(const model_kind *k, tdm_comm_t comm, const char *dir, const char *out, int stage, int W) {
  tdm_grid *g = NULL;
  tdm_engine *e = NULL;
  int r = comm ? tdm_comm_rank(comm) : 0;
  char path[4096], notes[1024];
  tdm_ckpt_resumed res;
  tdm_status st = make_engine(k, stage, comm, &g, &e);
  if (st == TDM_OK) st = tdm_ckpt_resume_engine(dir, e, NULL, NULL, &res, notes, sizeof notes);
  if (st == TDM_OK && (!res.found || res.step != SAVED || res.world_size != 4 || res.data_offset != SAVED * G))
    st = tdm__set_error(TDM_ERR_INTERNAL, "resumed step %lld of a world of %d, position %lld", (long long)res.step, res.world_size,
                        (long long)res.data_offset);
  tdm_ckpt_info ci = {.step = SAVED, .seed = 7, .data_offset = SAVED * G};
  snprintf(path, sizeof path, "%s/s%d-loaded", out, stage);
  if (st == TDM_OK) st = tdm_ckpt_save_engine(path, e, &ci, 2);
  if (st == TDM_OK) st = train(e, k, r, W, SAVED, SAVED + MORE);
  ci.step = SAVED + MORE, ci.data_offset = (SAVED + MORE) * G;
  snprintf(path, sizeof path, "%s/s%d-final", out, stage);
  if (st == TDM_OK) st = tdm_ckpt_save_engine(path, e, &ci, 2);
  tdm_engine_destroy(e);
  tdm_grid_destroy(g);
  return st;
}

static tdm_status reference(const model_kind *k, tdm_comm_t comm, const char *dir, const char *out, int W) {
  int r = comm ? tdm_comm_rank(comm) : 0;
  char file[4096], path[4096];
  snprintf(file, sizeof file, "%s/consolidated.safetensors", out);
  tdm_status st = TDM_OK;
  if (r == 0) { /* the checkpoint as one file, parameters and moments */
    tdm_ckpt *c = NULL;
    st = tdm_ckpt_open_latest(&c, dir, NULL, 0);
    if (st == TDM_OK) st = c ? tdm_ckpt_consolidate(c, file, 1) : tdm__set_error(TDM_ERR_IO, "no checkpoint in %s", dir);
    tdm_ckpt_close(c);
  }
  if (comm) {
    int32_t s = (int32_t)st;
    TDM__TRY(tdm_comm_broadcast(comm, &s, 1, TDM_I32, 0, TDM_ALGO_AUTO));
    if (s != TDM_OK) return r == 0 ? st : tdm__set_error((tdm_status)s, "rank 0 could not consolidate %s", dir);
  }
  TDM__TRY(st);
  tdm_grid *g = NULL;
  tdm_engine *e = NULL;
  st = make_engine(k, 0, comm, &g, &e);
  if (st == TDM_OK) st = inject(e, file);
  if (st == TDM_OK) st = train(e, k, r, W, SAVED, SAVED + MORE);
  tdm_ckpt_info ci = {.step = SAVED + MORE, .seed = 7, .data_offset = (SAVED + MORE) * G};
  snprintf(path, sizeof path, "%s/ref-final", out);
  if (st == TDM_OK) st = tdm_ckpt_save_engine(path, e, &ci, 2);
  tdm_engine_destroy(e);
  tdm_grid_destroy(g);
  return st;
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[1], "save") && strcmp(argv[1], "resume")) || (!strcmp(argv[1], "resume") && argc < 5) ||
      (strcmp(argv[3], "mlp") && strcmp(argv[3], "gpt"))) {
    fprintf(stderr, "usage: reshard_job save DIR mlp|gpt | resume DIR mlp|gpt OUT (under tandem run)\n");
    return 2;
  }
  model_kind k = !strcmp(argv[3], "gpt") ? gpt_kind() : mlp_kind();
  tdm_comm_config cc;
  tdm_comm_t comm = NULL;
  tdm_status st = tdm_comm_config_from_env(&cc);
  int W = st == TDM_OK ? cc.size : 1, r = st == TDM_OK ? cc.rank : 0;
  if (st == TDM_OK && W > 1) st = tdm_comm_create(&comm, &cc);
  if (st == TDM_OK && G % W) st = tdm__set_error(TDM_ERR_INVALID_ARG, "%d ranks do not divide the global batch of %d", W, G);
  if (st == TDM_OK && !strcmp(argv[1], "save")) {
    tdm_grid *g = NULL;
    tdm_engine *e = NULL;
    st = make_engine(&k, 3, comm, &g, &e);
    if (st == TDM_OK) st = train(e, &k, r, W, 0, SAVED);
    tdm_ckpt_info ci = {.step = SAVED, .seed = 7, .data_offset = SAVED * G};
    if (st == TDM_OK) st = tdm_ckpt_save_engine(argv[2], e, &ci, 2);
    tdm_engine_destroy(e);
    tdm_grid_destroy(g);
  } else if (st == TDM_OK) {
    for (int stage = 0; st == TDM_OK && stage <= 3; stage++) st = resume_stage(&k, comm, argv[2], argv[4], stage, W);
    if (st == TDM_OK) st = reference(&k, comm, argv[2], argv[4], W);
  }
  if (st != TDM_OK) {
    fprintf(stderr, "reshard_job %s (rank %d of %d): %s\n", argv[1], r, W, tdm_last_error());
    if (comm) tdm_comm_abort(comm);
  }
  tdm_comm_destroy(comm);
  return st == TDM_OK ? 0 : 1;
}
