/* Every rank of a training job must be started with the same training settings: one that is not
 * (another --lr, --seed or --batch-size given to one rank by hand) trains a replica that silently
 * differs, or hangs in a collective the others never call. Internal to the trainer. */
#ifndef TANDEM_TRAIN_AGREE_H
#define TANDEM_TRAIN_AGREE_H

#include "tandem/comm.h"
#include "tandem/train.h"

/* Collective over comm (one all-gather of a hash per setting; two broadcasts when they differ):
 * TDM_ERR_MISMATCH on every rank when any rank's settings differ from rank 0's, naming the first
 * such rank, the option and both values. Called before any other collective of the run. */
tdm_status tdm__settings_agree(const tdm_train_config *c, tdm_comm_t comm);

#endif
