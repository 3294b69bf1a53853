/* Slurm's compressed node lists and tasks per node against hand-expanded lists; the launch
 * environment of srun, mpirun and torchrun read into one record (which launcher wins, rank 0's
 * address and port, local ranks, the default threads); the bad inputs named; and tasks whose job
 * identities differ stopped at rendezvous with both views named. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "tdm_test.h"
#include "tandem/cluster.h"

/* Expands list and compares with the space-separated names in want. */
static void expect_hosts(const char *list, const char *want) {
  char **h = NULL;
  int n = -1;
  tdm_status st = tdm_hostlist_expand(list, &h, &n);
  CHECK_MSG(st == TDM_OK, "%s: %s", list, tdm_last_error());
  if (st != TDM_OK) return;
  char got[4096] = "";
  size_t at = 0;
  for (int i = 0; i < n; i++) at += (size_t)snprintf(got + at, sizeof got - at, "%s%s", i ? " " : "", h[i]);
  CHECK_MSG(!strcmp(got, want), "%s expands to '%s'; expected '%s'", list, got, want);
  CHECK(h[n] == NULL);
  char first[64];
  CHECK_OK(tdm_hostlist_first(list, first, sizeof first));
  CHECK(n > 0 && !strcmp(first, h[0]));
  tdm_hostlist_free(h);
}

static void test_hostlist_expand(void) {
  expect_hosts("node[01-04,07]", "node01 node02 node03 node04 node07");
  expect_hosts("a[1-2],b3", "a1 a2 b3");
  expect_hosts("vm", "vm");
  expect_hosts("n[8-10]", "n8 n9 n10");
  expect_hosts("n[08-10]", "n08 n09 n10");
  expect_hosts("n[098-101]", "n098 n099 n100 n101");
  expect_hosts("x[5]", "x5");
  expect_hosts("rack[1-2]-n[01-02]", "rack1-n01 rack1-n02 rack2-n01 rack2-n02");
  expect_hosts("gpu[1,3]x.cl[0-1],login", "gpu1x.cl0 gpu1x.cl1 gpu3x.cl0 gpu3x.cl1 login");
  expect_hosts("c[1-2]-ib,c[9-10]", "c1-ib c2-ib c9 c10");
  expect_hosts("n[0-0]", "n0");
  char **h;
  int n;
  CHECK_OK(tdm_hostlist_expand("big[0-99999]", &h, &n));
  CHECK(n == 100000 && !strcmp(h[0], "big0") && !strcmp(h[99999], "big99999") && !strcmp(h[12345], "big12345"));
  tdm_hostlist_free(h);
}

static void expect_bad_list(const char *list, const char *why) {
  char **h = (char **)1;
  int n = 7;
  tdm_status st = tdm_hostlist_expand(list, &h, &n);
  CHECK_MSG(st == TDM_ERR_INVALID_ARG, "'%s' was accepted", list);
  CHECK(h == NULL && n == 0);
  CHECK_ERR_HAS(why);
  char want[300];
  snprintf(want, sizeof want, "Slurm node list '%s'", list);
  if (*list) CHECK_ERR_HAS(want);
  char first[64];
  CHECK(tdm_hostlist_first(list, first, sizeof first) == TDM_ERR_INVALID_ARG); /* a bad tail fails the first host too */
}

static void test_hostlist_bad(void) {
  expect_bad_list("", "empty");
  expect_bad_list("node[01-", "a '[' that is never closed at character 5");
  expect_bad_list("node]1", "a ']' without its '['");
  expect_bad_list("n[[1]]", "a '[' inside brackets");
  expect_bad_list("a,,b", "an empty entry at character 3");
  expect_bad_list("a,", "an empty entry");
  expect_bad_list("n[3-1]", "high bound is below its low bound");
  expect_bad_list("n[1-x]", "not a digit");
  expect_bad_list("n[]", "empty brackets");
  expect_bad_list("n[1-]", "a range without a bound");
  expect_bad_list("n[1,,2]", "an empty range");
  expect_bad_list("a b", "a blank");
  expect_bad_list("n[0-2000000]", "more than 1048576 hosts");
  expect_bad_list("a[1-1024]b[1-1025]", "more than 1048576 hosts");
  expect_bad_list("n[1234567890]", "more than 9 digits");
  expect_bad_list("ok1,bad[2", "never closed");
  char first[4];
  CHECK(tdm_hostlist_first("node1", first, sizeof first) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("the first host is 5 characters; at most 3");
}

static void test_tasks_per_node(void) {
  int t = -1, nodes = -1;
  CHECK_OK(tdm_slurm_tasks_per_node("2(x3),1", 0, &t, &nodes));
  CHECK(t == 2 && nodes == 4);
  CHECK_OK(tdm_slurm_tasks_per_node("2(x3),1", 2, &t, NULL));
  CHECK(t == 2);
  CHECK_OK(tdm_slurm_tasks_per_node("2(x3),1", 3, &t, NULL));
  CHECK(t == 1);
  CHECK_OK(tdm_slurm_tasks_per_node("16", 0, &t, &nodes));
  CHECK(t == 16 && nodes == 1);
  CHECK_OK(tdm_slurm_tasks_per_node("3,1(x2),4", 3, &t, &nodes));
  CHECK(t == 4 && nodes == 4);
  const char *bad[] = {"", "2(x)", "0", "2,", "2(y3)", "2(x3", "x", "2(x0)", "-1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CHECK_MSG(tdm_slurm_tasks_per_node(bad[i], 0, &t, &nodes) == TDM_ERR_INVALID_ARG, "'%s' was accepted", bad[i]);
    CHECK_ERR_HAS("expected counts such as 2(x3),1");
  }
  CHECK(tdm_slurm_tasks_per_node("2(x3),1", 4, &t, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("'2(x3),1' covers 4 nodes; this is node 4");
}

static void test_slurm_port(void) {
  CHECK(tdm_slurm_port(0, 0) == 15000);
  CHECK(tdm_slurm_port(1, 0) == 15004 && tdm_slurm_port(1, 1) == 15005);
  CHECK(tdm_slurm_port(4242, 0) != tdm_slurm_port(4243, 0) && tdm_slurm_port(4242, 0) != tdm_slurm_port(4242, 1));
  for (unsigned long j = 0; j < 100000; j += 997)
    for (unsigned long s = 0; s < 6; s++) CHECK(tdm_slurm_port(j, s) >= 15000 && tdm_slurm_port(j, s) < 30000);
  CHECK(tdm_slurm_port(123456, 4294967294UL) >= 15000); /* the batch step's id */
}

static const char *launch_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_orte_num_nodes", "PMI_RANK", "PMI_SIZE",
                                    "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
                                    "SLURM_NODEID", "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                    "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURMD_NODENAME",
                                    "TANDEM_TRANSPORT", "TANDEM_NUM_THREADS", NULL};
static void clear_env(void) {
  for (int i = 0; launch_vars[i]; i++) unsetenv(launch_vars[i]);
}

/* Task 3 of 6 on the second of three nodes, 2 tasks each. */
static void set_slurm(void) {
  clear_env();
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_STEP_ID", "1", 1);
  setenv("SLURM_NTASKS", "6", 1);
  setenv("SLURM_STEP_NUM_TASKS", "6", 1);
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_STEP_NODELIST", "node[01-02,07]", 1);
  setenv("SLURM_JOB_NODELIST", "node[01-09]", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)", 1);
  setenv("SLURMD_NODENAME", "node02", 1);
}

static void test_launch_slurm(void) {
  tdm_launch_env e;
  set_slurm();
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.launcher == TDM_LAUNCH_SLURM && !strcmp(tdm_launcher_name(e.launcher), "slurm"));
  CHECK(e.rank == 3 && e.size == 6 && e.local_rank == 1 && e.local_size == 2 && e.node == 1 && e.nodes == 3);
  CHECK(!strcmp(e.master_addr, "node01") && !strcmp(e.addr_from, "SLURM_STEP_NODELIST"));
  CHECK(e.master_port == tdm_slurm_port(4242, 1));
  CHECK(strstr(e.job_ident, "Slurm job 4242 step 1, 6 tasks, SLURM_STEP_NODELIST=node[01-02,07]") != NULL);
  CHECK(!e.mpi_bootstrap);
  /* the communicator's configuration takes all of it */
  tdm_comm_config cfg;
  CHECK_OK(tdm_comm_config_from_env(&cfg));
  CHECK(cfg.rank == 3 && cfg.size == 6 && cfg.master_addr && !strcmp(cfg.master_addr, "node01"));
  CHECK(cfg.master_port == tdm_slurm_port(4242, 1) && cfg.job_ident && strstr(cfg.job_ident, "node[01-02,07]"));
  /* uneven nodes: this node's own count */
  setenv("SLURM_STEP_TASKS_PER_NODE", "3,2,1", 1);
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.local_size == 2);
  /* the job's node list when the step's is missing */
  setenv("SLURM_STEP_TASKS_PER_NODE", "1(x6),0", 1);
  CHECK(tdm_launch_env_read(&e) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("SLURM_STEP_TASKS_PER_NODE");
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)", 1);
  unsetenv("SLURM_STEP_NODELIST");
  setenv("SLURM_JOB_NODELIST", "node[02,01],node07", 1);
  setenv("SLURMD_NODENAME", "node01", 1);
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(!strcmp(e.master_addr, "node02") && !strcmp(e.addr_from, "SLURM_JOB_NODELIST"));
  /* the user's address and port win */
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  setenv("MASTER_PORT", "2345", 1);
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(!strcmp(e.master_addr, "10.1.2.3") && e.master_port == 2345 && !strcmp(e.addr_from, "MASTER_ADDR"));
  CHECK_OK(tdm_comm_config_from_env(&cfg));
  CHECK(!strcmp(cfg.master_addr, "10.1.2.3") && cfg.master_port == 2345 && cfg.rank == 3);
  clear_env();
}

static void expect_bad_env(const char *var, const char *value, const char *why) {
  set_slurm();
  if (value) setenv(var, value, 1);
  else unsetenv(var);
  tdm_launch_env e;
  CHECK_MSG(tdm_launch_env_read(&e) == TDM_ERR_INVALID_ARG, "%s=%s was accepted", var, value ? value : "(unset)");
  CHECK_ERR_HAS(why);
  tdm_comm_config cfg; /* the communicator refuses it alike */
  CHECK(tdm_comm_config_from_env(&cfg) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS(why);
}

static void test_launch_slurm_bad(void) {
  expect_bad_env("SLURM_STEP_NODELIST", "node[01-02,07", "SLURM_STEP_NODELIST: Slurm node list 'node[01-02,07': a '[' that is never closed");
  expect_bad_env("SLURM_STEP_NODELIST", "node[1-4]", "SLURM_STEP_TASKS_PER_NODE='2(x3)' counts 3 nodes but SLURM_STEP_NODELIST='node[1-4]' names 4");
  expect_bad_env("SLURM_STEP_TASKS_PER_NODE", "2(x2),1", "adds up to 5 tasks but SLURM_STEP_NUM_TASKS is 6");
  expect_bad_env("SLURM_STEP_TASKS_PER_NODE", "2(x3", "SLURM_STEP_TASKS_PER_NODE: Slurm tasks per node '2(x3'");
  expect_bad_env("SLURM_PROCID", "6", "SLURM_PROCID is '6'; expected this");
  expect_bad_env("SLURM_LOCALID", "2", "SLURM_LOCALID is '2'");
  expect_bad_env("SLURM_NODEID", "3", "SLURM_NODEID is 3 but the step has 3 nodes");
  expect_bad_env("SLURM_JOB_ID", "12x", "SLURM_JOB_ID is '12x'");
  /* rank 0 away from the first host: its address would be wrong */
  set_slurm();
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_LOCALID", "0", 1);
  tdm_launch_env e;
  CHECK(tdm_launch_env_read(&e) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 0 runs on node02 but the first host of SLURM_STEP_NODELIST='node[01-02,07]' is node01; set MASTER_ADDR");
  setenv("MASTER_ADDR", "node02", 1);
  CHECK_OK(tdm_launch_env_read(&e));
  /* rank 0 of a 3-node step whose first host resolves to loopback here: unreachable, said at once */
  unsetenv("MASTER_ADDR");
  setenv("SLURM_STEP_NODELIST", "localhost,node[02,07]", 1);
  setenv("SLURMD_NODENAME", "localhost", 1);
  tdm_comm_config cfg;
  CHECK(tdm_comm_config_from_env(&cfg) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("rank 0 would host the store at localhost, the first host of SLURM_STEP_NODELIST, but that name resolves to 127.");
  CHECK_ERR_HAS("which the job's other 2 nodes cannot reach; set MASTER_ADDR");
  setenv("MASTER_ADDR", "10.9.8.7", 1);
  CHECK_OK(tdm_comm_config_from_env(&cfg));
  CHECK(!strcmp(cfg.master_addr, "10.9.8.7"));
  /* a batch script's shell with several tasks, not a task of srun */
  clear_env();
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
  CHECK(tdm_launch_env_read(&e) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("Slurm job 77 has SLURM_NTASKS=4 but this process is not a task of srun");
  setenv("SLURM_NTASKS", "1", 1); /* one task: one process, nothing to meet */
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.size == 1 && e.rank == 0 && e.launcher == TDM_LAUNCH_NONE);
  clear_env();
}

static void test_launch_others(void) {
  tdm_launch_env e;
  clear_env();
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.launcher == TDM_LAUNCH_NONE && e.size == 1 && e.rank == 0 && e.local_size == 0 && !e.master_addr[0] && !e.master_port);
  /* tandem run / torchrun inside an srun step: its own variables, none of Slurm's */
  set_slurm();
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.launcher == TDM_LAUNCH_ENV && e.rank == 1 && e.size == 2 && e.local_size == 2 && !e.master_addr[0] && !e.job_ident[0]);
  setenv("LOCAL_RANK", "2", 1);
  CHECK(tdm_launch_env_read(&e) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("LOCAL_RANK is '2'");
  /* Open MPI across two nodes: MPI bootstraps, no MASTER_ADDR needed */
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  setenv("SLURM_JOB_ID", "5", 1); /* mpirun inside an allocation: Open MPI's facts win */
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.launcher == TDM_LAUNCH_OMPI && e.rank == 1 && e.size == 4 && e.local_rank == 1 && e.local_size == 2 && e.mpi_bootstrap);
  tdm_comm_config cfg;
  tdm_status st = tdm_comm_config_from_env(&cfg);
  CHECK_MSG(st == TDM_OK ? cfg.transport == TDM_TRANSPORT_MPI : strstr(tdm_last_error(), "built without MPI") != NULL,
            "%s", tdm_last_error());
  setenv("TANDEM_TRANSPORT", "tcp", 1); /* the user's choice stands */
  CHECK_OK(tdm_comm_config_from_env(&cfg));
  CHECK(cfg.transport == TDM_TRANSPORT_TCP);
  unsetenv("TANDEM_TRANSPORT");
  setenv("MASTER_ADDR", "10.0.0.1", 1); /* an address given: the usual rendezvous */
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(!e.mpi_bootstrap);
  unsetenv("MASTER_ADDR");
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1); /* one node: shared memory as before */
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(!e.mpi_bootstrap && e.master_port == 0);
  setenv("OMPI_MCA_ess_base_jobid", "1155268609", 1); /* the store's port from the job */
  CHECK_OK(tdm_launch_env_read(&e));
  CHECK(e.master_port == tdm_slurm_port(1155268609UL, 0));
  unsetenv("OMPI_MCA_ess_base_jobid");
  CHECK_OK(tdm_comm_config_from_env(&cfg));
  CHECK(cfg.transport == TDM_TRANSPORT_AUTO);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "5", 1);
  CHECK(tdm_launch_env_read(&e) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("OMPI_COMM_WORLD_LOCAL_SIZE is '5'; expected the ranks on this node (at most OMPI_COMM_WORLD_SIZE), 1..4");
  clear_env();
}

/* Threads: the node's CPUs divided among its ranks (or a launcher's binding, kept). */
static void test_default_threads(void) {
  clear_env();
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
  long mine = CPU_COUNT(&set);
  int bound = mine < online;
  CHECK(tdm_launch_default_threads() == (bound ? mine : online));
  set_slurm(); /* 2 tasks on this node */
  CHECK(tdm_launch_default_threads() == (bound ? mine : (online / 2 > 0 ? online / 2 : 1)));
  setenv("SLURM_STEP_TASKS_PER_NODE", "3,2,1", 1);
  setenv("SLURM_NODEID", "0", 1);
  CHECK(tdm_launch_default_threads() == (bound ? mine : (online / 3 > 0 ? online / 3 : 1)));
  CHECK_OK(tdm_set_num_threads(0));
  CHECK(tdm_get_num_threads() == (bound ? mine : (online / 3 > 0 ? online / 3 : 1)));
  setenv("TANDEM_NUM_THREADS", "2", 1); /* an explicit count wins */
  CHECK_OK(tdm_set_num_threads(0));
  CHECK(tdm_get_num_threads() == 2);
  clear_env();
  CHECK_OK(tdm_set_num_threads(1));
}

/* Two ranks of one job that disagree on the node list: the second stops at rendezvous, naming both. */
typedef struct {
  tdm_comm_config cfg;
  tdm_status st;
  char err[1024];
} rank_run;

static void *run_rank(void *arg) {
  rank_run *r = arg;
  tdm_comm_t c = NULL;
  r->st = tdm_comm_create(&c, &r->cfg);
  snprintf(r->err, sizeof r->err, "%s", r->st == TDM_OK ? "" : tdm_last_error());
  tdm_comm_destroy(c);
  return NULL;
}

static void test_ident_mismatch(void) {
  clear_env();
  char dir[] = "/tmp/tandem-ident-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  const char *ident[2][2] = {{"Slurm job 9 step 0, 2 tasks, SLURM_STEP_NODELIST=n[1-2]", "Slurm job 9 step 0, 2 tasks, SLURM_STEP_NODELIST=n[1-2]"},
                             {"Slurm job 9 step 0, 2 tasks, SLURM_STEP_NODELIST=n[1-2]", "Slurm job 9 step 0, 2 tasks, SLURM_STEP_NODELIST=n[1,3]"}};
  for (int k = 0; k < 2; k++) {
    char sub[64];
    snprintf(sub, sizeof sub, "%s/%d", dir, k);
    rank_run r[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
      memset(&r[i], 0, sizeof r[i]);
      r[i].cfg = (tdm_comm_config){.rank = i, .size = 2, .transport = TDM_TRANSPORT_TCP, .timeout_s = k ? 2 : 30,
                                   .store_dir = sub, .job_ident = ident[k][i]};
      pthread_create(&th[i], NULL, run_rank, &r[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    if (!k) {
      CHECK_MSG(r[0].st == TDM_OK && r[1].st == TDM_OK, "%s / %s", r[0].err, r[1].err);
    } else {
      CHECK(r[1].st == TDM_ERR_MISMATCH);
      CHECK_MSG(strstr(r[1].err, "rank 1 sees Slurm job 9 step 0, 2 tasks, SLURM_STEP_NODELIST=n[1,3], but rank 0 sees Slurm job 9 "
                                 "step 0, 2 tasks, SLURM_STEP_NODELIST=n[1-2]") != NULL, "%s", r[1].err);
      CHECK(r[0].st != TDM_OK); /* rank 0 waits for a peer that left: its timeout, not a hang */
    }
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  static const tdm_test_case cases[] = {
      {"hostlist_expand", test_hostlist_expand}, {"hostlist_bad", test_hostlist_bad},
      {"tasks_per_node", test_tasks_per_node},   {"slurm_port", test_slurm_port},
      {"launch_slurm", test_launch_slurm},       {"launch_slurm_bad", test_launch_slurm_bad},
      {"launch_others", test_launch_others},     {"default_threads", test_default_threads},
      {"ident_mismatch", test_ident_mismatch},
  };
  return tdm_test_main(cases, (int)(sizeof cases / sizeof *cases));
}
