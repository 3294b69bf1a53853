/* tandem — what cluster software tells a process: Slurm's compressed host lists and the launch
 * environment of srun, mpirun and torchrun-style launchers (tandem run), read into one record.
 *
 *   char **hosts; int n;
 *   tdm_hostlist_expand("node[01-03,07],login1", &hosts, &n); // node01 node02 node03 node07 login1
 *   tdm_hostlist_free(hosts);
 *   tdm_launch_env e; tdm_launch_env_read(&e);               // who started us, and where rank 0 is
 *
 * Every function is thread-safe (it reads the environment and writes only its outputs). */
#ifndef TANDEM_CLUSTER_H
#define TANDEM_CLUSTER_H

#include <stddef.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Slurm host lists -----------------------------------------------------------------------
 * A list is entries separated by commas; an entry is a name with any number of bracketed range
 * lists ("rack[1-2]-n[01-02]" is every combination, the last bracket varying fastest); a range
 * is N or LO-HI, and a low bound written with leading zeros sets the width of every number of
 * that range ("n[08-10]": n08 n09 n10). A list that does not parse (an unbalanced or nested
 * bracket, an empty entry or range, HI < LO, a non-digit in a range) or expands to more than
 * TDM_HOSTLIST_MAX hosts is TDM_ERR_INVALID_ARG naming the list and the position. */
#define TDM_HOSTLIST_MAX (1 << 20)
/* *hosts: n names in order, one allocation that the caller frees with tdm_hostlist_free. */
tdm_status tdm_hostlist_expand(const char *list, char ***hosts, int *n);
void tdm_hostlist_free(char **hosts);
/* The first host (the whole list is still checked); TDM_ERR_INVALID_ARG if it does not fit in n. */
tdm_status tdm_hostlist_first(const char *list, char *out, size_t n);
/* Slurm's tasks per node, "2(x3),1" (2 on each of 3 nodes, then 1): *tasks on node `node`,
 * *nodes in all (either may be NULL). A malformed spec or a node out of range names both. */
tdm_status tdm_slurm_tasks_per_node(const char *spec, int node, int *tasks, int *nodes);

/* ---- the launch environment ----------------------------------------------------------------
 * Which launcher started this process decides where every fact comes from, so they never mix:
 *   ENV    RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun, tandem run)
 *   OMPI   OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (Open MPI's mpirun); across nodes with no
 *          MASTER_ADDR the MPI transport carries the job (MPI bootstraps itself); the store's port
 *          derives from OMPI_MCA_ess_base_jobid as a Slurm job's does
 *   SLURM  a task of srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID,
 *          SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), SLURM_JOB_ID,
 *          SLURM_STEP_ID; rank 0's address is the node list's first host, the port derives from the
 *          job and step ids (tdm_slurm_port); MASTER_ADDR / MASTER_PORT override either
 *   PMI    PMI_RANK/PMI_SIZE (MPICH's hydra), nothing else known
 *   NONE   none of these: rank 0 of 1 */
typedef enum { TDM_LAUNCH_NONE = 0, TDM_LAUNCH_ENV, TDM_LAUNCH_OMPI, TDM_LAUNCH_SLURM, TDM_LAUNCH_PMI } tdm_launcher;
const char *tdm_launcher_name(tdm_launcher l);

typedef struct {
  tdm_launcher launcher;
  int rank, size;
  int local_rank, local_size; /* ranks of this job on this node; local_size 0: unknown */
  int node, nodes;            /* this node's index and the job's node count; nodes 0: unknown */
  char master_addr[256];      /* rank 0's host: MASTER_ADDR, or derived; "": not known (then 127.0.0.1) */
  int master_port;            /* MASTER_PORT, or derived; 0: not known (then 29500) */
  const char *addr_from;      /* where master_addr came from, for messages: "MASTER_ADDR", "SLURM_STEP_NODELIST", ... */
  /* What every rank of the job must see alike (under Slurm: the job, step, task count and node
   * list); the store compares each rank's with rank 0's at rendezvous. "": nothing to check. */
  char job_ident[1024];
  int mpi_bootstrap; /* across nodes under mpirun with no MASTER_ADDR: the MPI transport by default */
} tdm_launch_env;

/* Reads the environment strictly: a malformed value, a node list that does not parse, task counts
 * that do not add up to the world, or srun's variables missing inside a Slurm job with several
 * tasks (`tandem train` run in a batch script without srun) is TDM_ERR_INVALID_ARG naming the
 * variable, its value and what was expected. */
tdm_status tdm_launch_env_read(tdm_launch_env *e);
/* The port of a Slurm job step: 15000 + (4 job + step) mod 15000, below Linux's ephemeral range,
 * different for the steps of one job and for jobs that run side by side. */
int tdm_slurm_port(unsigned long job_id, unsigned long step_id);
/* Intra-op threads for a rank when neither the caller nor TANDEM_NUM_THREADS says: the CPUs this
 * process may run on if a launcher bound it to fewer than the machine has (srun's task plugin,
 * mpirun's binding, a container's cpuset), else the online CPUs divided among the local ranks;
 * at least 1. */
int tdm_launch_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
