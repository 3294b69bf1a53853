/* Checkpoints of a parallelism engine's state, in the format of tandem/checkpoint.h. Data
 * parallelism: rank 0 writes the parameters and the optimizer state, as one file. Sharded engines
 * (ZeRO): every rank writes its shard (optimizer state, its spans, and at stage 3 its parameter
 * pieces: no gather to rank 0), then rank 0 the main file, holding the parameters when they are
 * whole and the shards' checksums. Internal to the trainer. */
#ifndef TANDEM_TRAIN_ENGINE_CKPT_H
#define TANDEM_TRAIN_ENGINE_CKPT_H

#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/engine.h"

/* Collective over comm (the world; NULL for one process): every rank returns the same status. */
tdm_status tdm__engine_ckpt_save(tdm_engine *e, tdm_comm_t comm, const char *dir, const tdm_ckpt_info *info, int keep);
/* Loads ck (this rank's newest valid checkpoint) into the engine: the parameters and optimizer, or
 * this rank's shard, checked against the checksum the main file lists. Not collective. */
tdm_status tdm__engine_ckpt_restore(tdm_engine *e, int rank, int world, const tdm_ckpt *ck);

#endif
