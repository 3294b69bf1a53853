/* What a training run checks and agrees on before its first step: its output paths can be
 * written, its checkpoint directory is its own (locked), and every rank resumes from the same
 * checkpoint, written by a run with the same settings. Internal to the trainer. */
#ifndef TANDEM_TRAIN_RUN_START_H
#define TANDEM_TRAIN_RUN_START_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/comm.h"
#include "tandem/engine.h"
#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/train.h"

/* The settings a resumed run must share with its checkpoint, stored in the checkpoint's metadata.
 * group: the name --resume-override takes to allow a change (NULL: never allowed). */
enum { TDM__IDENTITY_MAX = 24 };
typedef struct {
  int n;
  const char *key[TDM__IDENTITY_MAX], *what[TDM__IDENTITY_MAX], *group[TDM__IDENTITY_MAX];
  char value[TDM__IDENTITY_MAX][96];
  const char *kv[2 * TDM__IDENTITY_MAX]; /* key, value pairs, for tdm_ckpt_info.meta_kv */
  /* a setting the run may take from its checkpoint instead (--last-batch auto): returns 1 when it
     did, and the checkpoint's value becomes the run's */
  int (*adopt[TDM__IDENTITY_MAX])(void *ctx, const char *ckpt_value);
  void *adopt_ctx[TDM__IDENTITY_MAX];
  unsigned char newer[TDM__IDENTITY_MAX]; /* a setting checkpoints of earlier versions lack: absent, it is not compared */
} tdm__run_identity;

/* Adds a setting (key as stored, words for messages, override group or NULL, value). */
void tdm__identity_add(tdm__run_identity *id, const char *key, const char *what, const char *group, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The setting added last may be taken from the checkpoint by adopt (see above). */
void tdm__identity_adopt(tdm__run_identity *id, int (*adopt)(void *ctx, const char *ckpt_value), void *ctx);
/* The setting added last is new in this version: a checkpoint without it resumes as before. */
void tdm__identity_newer(tdm__run_identity *id);

typedef struct {
  const tdm_train_config *cfg;
  tdm_comm_t comm; /* NULL for one process */
  int rank, world;
  tdm_engine *engine;  /* resumed into: what this rank holds of the parameters and optimizer */
  tdm__run_identity *id; /* a setting adopted from the checkpoint is written back into it */
  FILE *progress; /* rank 0's progress stream, or NULL */
} tdm__start_in;

typedef struct {
  int lock_fd;       /* the checkpoint directory's lock (rank 0 with checkpoints), or -1 */
  FILE *metrics;     /* rank 0 with --metrics */
  int64_t step;      /* the step training starts from */
  int64_t resumed_from; /* the checkpoint's step, or -1 */
  int64_t data_epoch, data_offset; /* where the checkpoint's data stream stood (tandem/sampler.h) */
  char ckpt_path[4096]; /* resumed: the manifest, and its checksum (a parameter server's servers load it too) */
  uint32_t ckpt_crc;
} tdm__start_out;

/* Rank 0 opens its outputs (weights' directory probed, metrics opened, checkpoint directory
 * created, locked and probed; a directory holding checkpoints is refused without --resume), and
 * (several ranks) one all-gather makes every rank fail alike if it failed; then with --resume
 * tdm_ckpt_resume_engine loads the newest valid checkpoint, whatever layout wrote it, after
 * checking it against the identity. Collective over comm. Release *out with
 * tdm__run_start_release, also on failure. */
tdm_status tdm__run_start(const tdm__start_in *in, tdm__start_out *out);
void tdm__run_start_release(tdm__start_out *out);

#endif
