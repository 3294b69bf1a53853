/* tandem — training checkpoints.
 *
 * A checkpoint is one safetensors file, DIR/ckpt-<step>.safetensors: every parameter
 * ("model.<name>"), the optimizer state ("optim.state", f32), and metadata: the step, the
 * optimizer's step count, the world size, the seed, and a CRC-32 of all tensor bytes. It is
 * written under a temporary name, flushed and renamed, then read back and verified before older
 * checkpoints are deleted (two are kept), so a crash never leaves a corrupt file under a final
 * name and a good checkpoint is never replaced by a bad one. Loading takes the newest file that
 * verifies; a corrupt newer one is reported and skipped.
 *
 * The training position is the step: shuffling, dropout and batch order are functions of
 * (seed, epoch, step), so a run resumed from step s continues bit-identically.
 */
#ifndef TANDEM_CHECKPOINT_H
#define TANDEM_CHECKPOINT_H

#include <stdint.h>

#include "tandem/nn.h"
#include "tandem/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_ckpt_info {
  int64_t step;       /* optimizer steps completed */
  int world_size;
  uint64_t seed;
  /* saving only: extra metadata pairs, meta_kv[2i] = key, [2i+1] = value (the trainer stores the
   * model's architecture, so that tandem generate --checkpoint can rebuild it) */
  int n_meta;
  const char *const *meta_kv;
} tdm_ckpt_info;

/* Writes DIR/ckpt-<info->step>.safetensors (creating DIR) and keeps the newest `keep`. */
tdm_status tdm_ckpt_save(const char *dir, const tdm_params *p, const tdm_optim *o, const tdm_ckpt_info *info, int keep);
/* Loads the newest valid checkpoint of DIR into p and o. TDM_ERR_IO with "no checkpoint" when
 * DIR holds none; TDM_ERR_MISMATCH when it does not fit the model or world size. *warning gets a
 * note if newer checkpoints were skipped as corrupt (empty otherwise). */
tdm_status tdm_ckpt_load_latest(const char *dir, tdm_params *p, tdm_optim *o, int world_size, tdm_ckpt_info *info,
                                char *warning, size_t warning_n);

/* The newest checkpoint of DIR that verifies (checksum), written to path; corrupt newer ones are
 * noted in *warning. TDM_ERR_IO when DIR holds none, TDM_ERR_FORMAT when none verifies. */
tdm_status tdm_ckpt_latest(const char *dir, char *path, size_t path_n, char *warning, size_t warning_n);
/* Loads one checkpoint file into p, and into o unless o is NULL; world_size <= 0 accepts any. */
tdm_status tdm_ckpt_load_file(const char *path, tdm_params *p, tdm_optim *o, int world_size, tdm_ckpt_info *info);

#ifdef __cplusplus
}
#endif
#endif
