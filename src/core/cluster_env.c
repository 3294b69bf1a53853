/* The launch environment (tandem/cluster.h): which launcher started us decides where rank, world,
 * locality and rank 0's address come from, read strictly in one place; and the default thread
 * count that divides a node's cores among its ranks. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/cluster.h"

static const char *launcher_names[] = {"none", "env", "ompi", "slurm", "pmi"};

const char *tdm_launcher_name(tdm_launcher l) { return (unsigned)l <= TDM_LAUNCH_PMI ? launcher_names[l] : "?"; }

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* A decimal integer in [lo, hi] and nothing else. */
static int parse_ulong(const char *v, unsigned long lo, unsigned long hi, unsigned long *out) {
  if (!v || !isdigit((unsigned char)*v)) return 0;
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, 10);
  if (*end || errno || x < lo || x > hi) return 0;
  *out = x;
  return 1;
}

/* Variable `name`, required when `need`; *out untouched when absent and not needed. */
static tdm_status num(const char *name, unsigned long lo, unsigned long hi, int need, const char *what, unsigned long *out) {
  const char *v = env(name);
  if (!v) {
    if (!need) return TDM_OK;
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s is not set; expected %s", name, what);
  }
  if (!parse_ulong(v, lo, hi, out))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s is '%s'; expected %s, %lu..%lu", name, v, what, lo, hi);
  return TDM_OK;
}

#define MAXR (1UL << 20)

int tdm_slurm_port(unsigned long job_id, unsigned long step_id) {
  return 15000 + (int)((job_id % 15000 * 4 + step_id % 4) % 15000);
}

static tdm_status read_env_launcher(tdm_launch_env *e) {
  unsigned long r = 0, s = 1, lr = 0, ls = 0;
  TDM__TRY(num("WORLD_SIZE", 1, MAXR, 0, "the number of ranks", &s));
  TDM__TRY(num("RANK", 0, s - 1, 0, "this process's rank (below WORLD_SIZE)", &r));
  TDM__TRY(num("LOCAL_WORLD_SIZE", 1, s, 0, "the ranks on this node (at most WORLD_SIZE)", &ls));
  TDM__TRY(num("LOCAL_RANK", 0, ls ? ls - 1 : s - 1, 0, "this rank's index on its node (below LOCAL_WORLD_SIZE)", &lr));
  e->rank = (int)r, e->size = (int)s, e->local_rank = (int)lr, e->local_size = (int)ls;
  return TDM_OK;
}

static tdm_status read_ompi(tdm_launch_env *e) {
  unsigned long r = 0, s = 1, lr = 0, ls = 0, nodes = 0;
  TDM__TRY(num("OMPI_COMM_WORLD_SIZE", 1, MAXR, 1, "the number of ranks", &s));
  TDM__TRY(num("OMPI_COMM_WORLD_RANK", 0, s - 1, 1, "this process's rank (below OMPI_COMM_WORLD_SIZE)", &r));
  TDM__TRY(num("OMPI_COMM_WORLD_LOCAL_SIZE", 1, s, 0, "the ranks on this node (at most OMPI_COMM_WORLD_SIZE)", &ls));
  TDM__TRY(num("OMPI_COMM_WORLD_LOCAL_RANK", 0, ls ? ls - 1 : s - 1, 0, "this rank's index on its node", &lr));
  TDM__TRY(num("OMPI_MCA_orte_num_nodes", 1, MAXR, 0, "the number of nodes", &nodes));
  e->rank = (int)r, e->size = (int)s, e->local_rank = (int)lr, e->local_size = (int)ls, e->nodes = (int)nodes;
  unsigned long job = 0; /* two mpirun jobs on one host must not meet on one port */
  if (parse_ulong(env("OMPI_MCA_ess_base_jobid"), 0, 0xffffffffUL, &job)) e->master_port = tdm_slurm_port(job, 0);
  /* across nodes MPI bootstraps itself: no rendezvous address is needed */
  e->mpi_bootstrap = ls > 0 && ls < s && !env("MASTER_ADDR");
  return TDM_OK;
}

static tdm_status read_slurm(tdm_launch_env *e) {
  unsigned long job = 0, step = 0, r = 0, s = 1, lr = 0, node = 0;
  const char *step_tasks = env("SLURM_STEP_NUM_TASKS");
  TDM__TRY(num("SLURM_JOB_ID", 0, 0xffffffffUL, 1, "the job id", &job));
  if (!step_tasks) { /* a batch script, or salloc's shell: not a task of srun */
    unsigned long n = 1;
    TDM__TRY(num("SLURM_NTASKS", 1, MAXR, 0, "the job's task count", &n));
    if (n > 1)
      return tdm__set_error(TDM_ERR_INVALID_ARG,
                            "environment: Slurm job %lu has SLURM_NTASKS=%lu but this process is not a task of srun "
                            "(SLURM_STEP_NUM_TASKS is not set); start the ranks with `srun tandem ...`, or one process with "
                            "`tandem run -n N -- tandem ...`", job, n);
    e->launcher = TDM_LAUNCH_NONE; /* one process in an allocation: nothing to rendezvous with */
    return TDM_OK;
  }
  TDM__TRY(num("SLURM_STEP_ID", 0, 0xffffffffUL, 0, "the step id", &step));
  TDM__TRY(num("SLURM_STEP_NUM_TASKS", 1, MAXR, 1, "the step's task count", &s));
  TDM__TRY(num("SLURM_PROCID", 0, s - 1, 1, "this task's rank (below SLURM_STEP_NUM_TASKS)", &r));
  TDM__TRY(num("SLURM_NODEID", 0, MAXR, 1, "this node's index in the step", &node));
  const char *list_var = "SLURM_STEP_NODELIST", *list = env(list_var);
  if (!list) list = env(list_var = "SLURM_JOB_NODELIST");
  if (!list) list = env(list_var = "SLURM_NODELIST");
  if (!list) return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: a task of srun with no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST");
  char **hosts;
  int nh;
  tdm_status st = tdm_hostlist_expand(list, &hosts, &nh);
  if (st != TDM_OK) return tdm__set_error(st, "environment: %s: %s", list_var, tdm_last_error());
  const char *tpn_var = "SLURM_STEP_TASKS_PER_NODE", *tpn = env(tpn_var);
  if (!tpn) tpn = env(tpn_var = "SLURM_TASKS_PER_NODE");
  int local = 0, nodes = 0;
  if (tpn && (st = tdm_slurm_tasks_per_node(tpn, 0, NULL, &nodes)) == TDM_OK) {
    long sum = 0;
    for (int k = 0; k < nodes && sum <= (long)MAXR; k++) { /* the counts must make the step */
      int t = 0;
      tdm_slurm_tasks_per_node(tpn, k, &t, NULL);
      sum += t;
    }
    if (nodes != nh)
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s='%s' counts %d nodes but %s='%s' names %d", tpn_var, tpn, nodes,
                          list_var, list, nh);
    else if (sum != (long)s)
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s='%s' adds up to %ld tasks but SLURM_STEP_NUM_TASKS is %lu",
                          tpn_var, tpn, sum, s);
    else if (node >= (unsigned long)nodes)
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "environment: SLURM_NODEID is %lu but the step has %d nodes (%s='%s')", node, nodes,
                          list_var, list);
    else
      tdm_slurm_tasks_per_node(tpn, (int)node, &local, NULL);
  } else if (tpn) {
    st = tdm__set_error(st, "environment: %s: %s", tpn_var, tdm_last_error());
  }
  if (st == TDM_OK) st = num("SLURM_LOCALID", 0, local ? (unsigned long)local - 1 : s - 1, 1,
                             "this task's index on its node (below its tasks on this node)", &lr);
  if (st == TDM_OK && strlen(hosts[0]) >= sizeof e->master_addr)
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s: the first host '%.40s...' is too long", list_var, hosts[0]);
  if (st == TDM_OK) {
    snprintf(e->master_addr, sizeof e->master_addr, "%s", hosts[0]);
    e->addr_from = list_var;
    e->master_port = tdm_slurm_port(job, step);
    /* rank 0 must be on the first node for its address to be the first host (srun's block and
     * cyclic distributions put it there; an arbitrary one may not) */
    const char *me = env("SLURMD_NODENAME");
    if (r == 0 && me && strcmp(me, hosts[0]) && !env("MASTER_ADDR"))
      st = tdm__set_error(TDM_ERR_INVALID_ARG, "environment: rank 0 runs on %s but the first host of %s='%s' is %s; set "
                          "MASTER_ADDR to rank 0's host (an arbitrary task distribution?)", me, list_var, list, hosts[0]);
    size_t n = (size_t)snprintf(e->job_ident, sizeof e->job_ident, "Slurm job %lu step %lu, %lu tasks, %s=%s", job, step, s,
                                list_var, list);
    if (n >= sizeof e->job_ident) /* a list too long to compare whole: its expansion's size and ends */
      snprintf(e->job_ident, sizeof e->job_ident, "Slurm job %lu step %lu, %lu tasks, %d nodes %s..%s", job, step, s, nh,
               hosts[0], hosts[nh - 1]);
  }
  tdm_hostlist_free(hosts);
  TDM__TRY(st);
  e->rank = (int)r, e->size = (int)s, e->local_rank = (int)lr, e->local_size = local, e->node = (int)node, e->nodes = nh;
  return TDM_OK;
}

tdm_status tdm_launch_env_read(tdm_launch_env *e) {
  if (!e) return tdm__set_error(TDM_ERR_INVALID_ARG, "launch_env_read: NULL");
  memset(e, 0, sizeof *e);
  e->size = 1;
  e->addr_from = "";
  tdm_status st;
  if (env("RANK") || env("WORLD_SIZE")) e->launcher = TDM_LAUNCH_ENV, st = read_env_launcher(e);
  else if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) e->launcher = TDM_LAUNCH_OMPI, st = read_ompi(e);
  else if (env("SLURM_JOB_ID") && (env("SLURM_PROCID") || env("SLURM_NTASKS"))) e->launcher = TDM_LAUNCH_SLURM, st = read_slurm(e);
  else if (env("PMI_RANK")) {
    unsigned long r = 0, s = 1;
    e->launcher = TDM_LAUNCH_PMI;
    st = num("PMI_SIZE", 1, MAXR, 1, "the number of ranks", &s);
    if (st == TDM_OK) st = num("PMI_RANK", 0, s - 1, 1, "this process's rank (below PMI_SIZE)", &r);
    e->rank = (int)r, e->size = (int)s;
  } else
    st = TDM_OK;
  TDM__TRY(st);
  /* the user's address and port win over anything derived */
  const char *a = env("MASTER_ADDR");
  if (a) {
    if (strlen(a) >= sizeof e->master_addr)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: MASTER_ADDR is %zu characters; at most %zu", strlen(a),
                            sizeof e->master_addr - 1);
    snprintf(e->master_addr, sizeof e->master_addr, "%s", a);
    e->addr_from = "MASTER_ADDR";
  }
  unsigned long p = 0;
  TDM__TRY(num("MASTER_PORT", 1, 65535, 0, "a port number", &p));
  if (p) e->master_port = (int)p;
  return TDM_OK;
}

int tdm_launch_default_threads(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online < 1) online = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    long mine = CPU_COUNT(&set);
    if (mine >= 1 && mine < online) return (int)mine; /* a launcher bound us: its share is ours */
  }
  tdm_launch_env e;
  long local = tdm_launch_env_read(&e) == TDM_OK && e.local_size > 0 ? e.local_size : 1;
  return (int)(online / local > 0 ? online / local : 1);
}
