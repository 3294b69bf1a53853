/* The launch environment (tandem/cluster.h) applied to a communicator's configuration: what srun
 * and mpirun say fills in what the user did not set. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>

#include "comm/comm_impl.h"
#include "comm/launch_config.h"
#include "tandem/cluster.h"

/* A copy that lives as long as the process (cfg holds pointers); the environment has few
 * distinct values, so equal strings share one copy. */
static const char *keep(const char *s) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static struct kept {
    struct kept *next;
    char s[];
  } *head;
  pthread_mutex_lock(&mu);
  struct kept *k = head;
  while (k && strcmp(k->s, s)) k = k->next;
  if (!k && (k = tdm__malloc(sizeof *k + strlen(s) + 1)) != NULL) {
    strcpy(k->s, s);
    k->next = head;
    head = k;
  }
  pthread_mutex_unlock(&mu);
  return k ? k->s : NULL;
}

/* Rank 0 of a job over several nodes hosts the store at the node list's first host: a name that
 * resolves to loopback here (Debian's 127.0.1.1 line in /etc/hosts) would be unreachable from the
 * other nodes, which would only time out; say so now. */
static tdm_status check_reachable(const tdm_launch_env *e) {
  if (e->launcher != TDM_LAUNCH_SLURM || e->rank != 0 || e->nodes < 2 || strcmp(e->addr_from, "MASTER_ADDR") == 0) return TDM_OK;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(e->master_addr, NULL, &hints, &res) != 0 || !res) return TDM_OK; /* the store names it when it fails */
  char ip[INET_ADDRSTRLEN] = "";
  const struct sockaddr_in *sa = (const struct sockaddr_in *)res->ai_addr;
  inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
  int loop = (ntohl(sa->sin_addr.s_addr) >> 24) == 127;
  freeaddrinfo(res);
  if (loop)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: rank 0 would host the store at %s, the first host of %s, but "
                          "that name resolves to %s here (a loopback line in /etc/hosts?), which the job's other %d nodes "
                          "cannot reach; set MASTER_ADDR to an address of this node that they can", e->master_addr, e->addr_from,
                          ip, e->nodes - 1);
  return TDM_OK;
}

tdm_status tdm__comm_config_from_launch(tdm_comm_config *cfg) {
  tdm_launch_env e;
  TDM__TRY(tdm_launch_env_read(&e));
  TDM__TRY(check_reachable(&e));
  if (e.launcher == TDM_LAUNCH_SLURM) { /* the step's tasks, not the allocation's */
    cfg->rank = e.rank;
    cfg->size = e.size;
  }
  if (e.size != cfg->size || e.rank != cfg->rank) /* cannot happen: both read the same variables */
    return tdm__set_error(TDM_ERR_INTERNAL, "environment: rank %d of %d from %s, but rank %d of %d from the generic reader", e.rank,
                          e.size, tdm_launcher_name(e.launcher), cfg->rank, cfg->size);
  if (!cfg->master_addr && e.master_addr[0] && !(cfg->master_addr = keep(e.master_addr)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "environment: out of memory");
  if (!cfg->master_port && e.master_port) cfg->master_port = e.master_port;
  if (e.job_ident[0] && !(cfg->job_ident = keep(e.job_ident))) return tdm__set_error(TDM_ERR_NO_MEMORY, "environment: out of memory");
  if (e.mpi_bootstrap && cfg->transport == TDM_TRANSPORT_AUTO && !cfg->store_dir) {
#ifdef TANDEM_HAVE_MPI
    cfg->transport = TDM_TRANSPORT_MPI;
#else
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED,
                          "environment: under mpirun across nodes (%d of the %d ranks on this node) with no MASTER_ADDR, and this "
                          "tandem is built without MPI; set MASTER_ADDR (and MASTER_PORT) to rank 0's host, or build with MPI "
                          "(libopenmpi-dev)", e.local_size, e.size);
#endif
  }
  return TDM_OK;
}

tdm_status tdm__launch_local_size(int *out) {
  tdm_launch_env e;
  *out = 0;
  TDM__TRY(tdm_launch_env_read(&e));
  *out = e.local_size;
  return TDM_OK;
}
