/* The launch environment applied to a communicator's configuration (src/comm/launch_config.c). */
#ifndef TDM_COMM_LAUNCH_CONFIG_H
#define TDM_COMM_LAUNCH_CONFIG_H
#include "tandem/comm.h"

/* Called at the end of tdm_comm_config_from_env: under srun, the rank and world of the job step,
 * rank 0's address and port from the node list and job id where MASTER_ADDR / MASTER_PORT are
 * not set, and the job's identity for the store to check; under mpirun across nodes with no
 * MASTER_ADDR, the MPI transport (when TANDEM_TRANSPORT is auto). Strings it sets live as long
 * as the process. */
tdm_status tdm__comm_config_from_launch(tdm_comm_config *cfg);
/* Ranks on this node as the launcher says (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or
 * Slurm's tasks on this node); 0: unknown. */
tdm_status tdm__launch_local_size(int *out);
#endif
