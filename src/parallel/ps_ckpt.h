/* A parameter server's shard in a format-3 checkpoint (ps_ckpt.c): each server writes keys
 * [lo, hi) of every "model.*" tensor and of the optimizer's "optim.<state>.*" tensors, the workers
 * write nothing (the manifest is worker 0's: the step, the data position, the run's settings), so
 * the checkpoint is the same logical tensors data parallelism writes and either resumes the other.
 * Not thread-safe: the server's thread. */
#ifndef TANDEM_PS_CKPT_H
#define TANDEM_PS_CKPT_H

#include "tandem/checkpoint.h"

/* Collective over world (every worker calls tdm_ckpt_writer_* with nothing to add: see
 * tdm_ps_workers_checkpoint). */
tdm_status tdm__ps_ckpt_save(const char *dir, tdm_comm_t world, tdm_params *p, tdm_optim *o, int64_t lo, int64_t hi,
                             int64_t step, int keep);
/* Reads keys [lo, hi) of the parameters and the optimizer state from the manifest at path, which
 * must have checksum crc (the one the workers resumed from); *optim_steps gets its step count. */
tdm_status tdm__ps_ckpt_load(const char *path, uint32_t crc, tdm_params *p, tdm_optim *o, int64_t lo, int64_t hi,
                             int64_t *optim_steps);

#endif
