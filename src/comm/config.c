/* The communicator's configuration: the names of transports, algorithms and collectives, the
 * launch environment (RANK, WORLD_SIZE, ... parsed strictly, once), TANDEM_ALGO (which algorithm
 * runs which collective) and TANDEM_NET_EMULATE. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "comm/comm_impl.h"
#include "comm/launch_config.h"

static const char *transport_names[] = {"auto", "thread", "shm", "tcp", "mpi"};
_Static_assert(sizeof transport_names / sizeof transport_names[0] == TDM_TRANSPORT_COUNT, "one name per transport");
static const char *coll_names[] = {"send/recv", "all-reduce", "broadcast", "reduce", "reduce-scatter", "all-gather",
                                   "gather", "scatter", "all-to-all", "barrier", "split", "abort", "tagged message"};
_Static_assert(sizeof coll_names / sizeof coll_names[0] == TDM_COLL_KIND_COUNT, "one name per collective");

const char *tdm_transport_name(tdm_transport_kind k) {
  return (unsigned)k < TDM_TRANSPORT_COUNT ? transport_names[k] : "?";
}
const char *tdm_algo_name(tdm_algo a) { return (unsigned)a < TDM_ALGO_COUNT ? tdm__algos[a].name : "?"; }
const char *tdm__coll_name(int k) { return (unsigned)k < TDM_COLL_KIND_COUNT ? coll_names[k] : "?"; }

/* The algorithm named s (the table's names); -1 if none. */
static int find_algo(const char *s) {
  for (int i = 0; s && i < TDM_ALGO_COUNT; i++)
    if (!strcmp(s, tdm__algos[i].name)) return i;
  return -1;
}

/* The index of s among n names (NULL entries never match); -1 if none. */
static int find_name(const char *const *names, int n, const char *s) {
  for (int i = 0; s && i < n; i++)
    if (names[i] && !strcmp(s, names[i])) return i;
  return -1;
}

tdm_status tdm_algo_parse(const char *name, tdm_algo *out) {
  if (!name || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_algo_parse: %s is NULL", !name ? "the name" : "out");
  int i = find_algo(name);
  if (i < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "algorithm '%s'; expected one of auto ring rd rhd tree chain direct shm hier",
                          name ? name : "(null)");
  *out = (tdm_algo)i;
  return TDM_OK;
}

/* ---- configuration ------------------------------------------------------------------------
 * Every variable is parsed strictly, by one function, and a bad value names the variable, the
 * value and what is valid. */

/* The first of names that is set and not empty; *which gets its name. */
static const char *env_first(const char *const *names, const char **which) {
  for (; *names; names++) {
    const char *v = getenv(*names);
    if (v && *v) {
      *which = *names;
      return v;
    }
  }
  return NULL;
}

/* A decimal integer in [lo, hi], nothing else (no blanks, no trailing text). */
static int parse_long(const char *v, long lo, long hi, long *out) {
  if (!v || !*v || isspace((unsigned char)*v)) return 0;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (*end || errno || x < lo || x > hi) return 0;
  *out = x;
  return 1;
}

#define MAX_RANKS (1 << 20)

/* TANDEM_TIMEOUT: positive seconds; *out stays as it is when the variable is unset. */
tdm_status tdm__env_timeout(double *out) {
  const char *t = getenv("TANDEM_TIMEOUT");
  if (!t) return TDM_OK;
  char *end;
  errno = 0;
  double v = strtod(t, &end);
  if (end == t || *end || errno || !(v > 0) || v > 1e9)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: TANDEM_TIMEOUT is '%s'; expected a positive number of seconds",
                          t);
  *out = v;
  return TDM_OK;
}

/* LOCAL_WORLD_SIZE (torchrun) or OMPI_COMM_WORLD_LOCAL_SIZE: ranks on this node; else Slurm's
 * tasks on this node (launch_config.h); 0 when unknown. */
tdm_status tdm__env_local_size(int *out) {
  static const char *vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
  const char *name, *v = env_first(vars, &name);
  long x = 0;
  *out = 0;
  if (!v) return tdm__launch_local_size(out);
  if (!parse_long(v, 1, MAX_RANKS, &x))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s is '%s'; expected the number of ranks on this node, 1..%d",
                          name, v, MAX_RANKS);
  *out = (int)x;
  return TDM_OK;
}

tdm_status tdm_comm_config_from_env(tdm_comm_config *cfg) {
  if (!cfg) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_comm_config_from_env: the config cfg is NULL");
  memset(cfg, 0, sizeof *cfg);
  static const char *rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
  const char *rname = NULL, *sname = NULL;
  const char *rv = env_first(rank_vars, &rname), *sv = env_first(size_vars, &sname);
  long size = 1, rank = 0;
  if (sv && !parse_long(sv, 1, MAX_RANKS, &size))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s is '%s'; expected the number of ranks, an integer 1..%d",
                          sname, sv, MAX_RANKS);
  if (rv && !parse_long(rv, 0, size - 1, &rank)) {
    if (sv)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s is '%s'; expected this process's rank, an integer 0..%ld (%s is %ld)",
                            rname, rv, size - 1, sname, size);
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "environment: %s is '%s' but WORLD_SIZE (or an MPI/Slurm equivalent) is not set, so the only rank is 0",
                          rname, rv);
  }
  if (sv && size > 1 && !rv) /* every process would be rank 0, and wait for ranks that never come */
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "environment: %s is %ld but RANK (or an MPI/Slurm equivalent) is not set; expected each process's "
                          "rank, 0..%ld (tandem run -n N sets both)",
                          sname, size, size - 1);
  cfg->size = (int)size;
  cfg->rank = (int)rank;
  cfg->master_addr = getenv("MASTER_ADDR");
  const char *port = getenv("MASTER_PORT");
  if (port) {
    long p;
    if (!parse_long(port, 1, 65535, &p))
      return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: MASTER_PORT is '%s'; expected a port number, 1..65535", port);
    cfg->master_port = (int)p;
  }
  cfg->job_token = getenv("TANDEM_JOB_TOKEN");
  cfg->store_dir = getenv("TANDEM_STORE_DIR");
  cfg->ifname = getenv("TANDEM_SOCKET_IFNAME");
  TDM__TRY(tdm__env_timeout(&cfg->timeout_s));
  const char *tr = getenv("TANDEM_TRANSPORT");
  cfg->transport = TDM_TRANSPORT_AUTO;
  if (tr) {
    int i = find_name(transport_names, TDM_TRANSPORT_COUNT, tr);
    if (i < 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: TANDEM_TRANSPORT is '%s'; expected auto, thread, shm, tcp or mpi", tr);
    cfg->transport = (tdm_transport_kind)i;
  }
  return tdm__comm_config_from_launch(cfg); /* srun's and mpirun's facts fill in what is not set */
}

/* ---- TANDEM_ALGO ----------------------------------------------------------------------------
 * Read once per communicator at creation. An entry is "collective=algorithm" or a plain
 * algorithm; the names of collectives are the bench's. */
static const char *const algo_coll_names[TDM_COLL_KIND_COUNT] = {
    [TDM_COLL_ALLREDUCE] = "allreduce",     [TDM_COLL_BROADCAST] = "broadcast", [TDM_COLL_REDUCE] = "reduce",
    [TDM_COLL_REDUCE_SCATTER] = "reducescatter", [TDM_COLL_ALLGATHER] = "allgather", [TDM_COLL_GATHER] = "gather",
    [TDM_COLL_SCATTER] = "scatter",         [TDM_COLL_ALLTOALL] = "alltoall"};
#define ALGO_UNSET TDM_ALGO_COUNT

tdm_status tdm__parse_algo_env(struct tdm_comm *c, const char *spec) {
  for (int k = 0; k < TDM_COLL_KIND_COUNT; k++) c->algo_for[k] = ALGO_UNSET;
  c->algo_plain = TDM_ALGO_AUTO;
  if (!spec || !*spec) return TDM_OK;
  char buf[256], list[160];
  if (strlen(spec) >= sizeof buf)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO is %zu characters long; expected entries such as allreduce=rhd,broadcast=chain", strlen(spec));
  snprintf(buf, sizeof buf, "%s", spec);
  int plain_set = 0;
  char *save = NULL;
  for (char *e = strtok_r(buf, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(e, '='), *an = eq ? eq + 1 : e;
    int ai = find_algo(an);
    tdm_algo a = (tdm_algo)ai;
    if (ai < 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO '%s': unknown algorithm '%s'; expected one of auto ring rd rhd tree chain direct shm hier", spec, an);
    if (!eq) { /* a plain name: every collective it can run */
      if (plain_set)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO '%s': two plain algorithms; name the collective of the second (e.g. broadcast=chain)", spec);
      int any = a == TDM_ALGO_AUTO;
      for (int k = 0; k < TDM_COLL_KIND_COUNT; k++) any |= algo_coll_names[k] && tdm__algo_applies(c, k, a);
      if (!any)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO '%s': algorithm '%s' can run no collective on this %d-rank %s communicator%s", spec,
                              an, c->size, tdm_transport_name(c->kind), a == TDM_ALGO_SHM ? " (shm needs the shm transport)" : "");
      c->algo_plain = a;
      plain_set = 1;
      continue;
    }
    *eq = 0;
    char norm[32]; /* reduce-scatter, reduce_scatter and reducescatter are one name */
    size_t j = 0;
    for (const char *q = e; *q && j + 1 < sizeof norm; q++)
      if (*q != '-' && *q != '_') norm[j++] = *q;
    norm[j] = 0;
    int k = find_name(algo_coll_names, TDM_COLL_KIND_COUNT, norm);
    if (k < 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO '%s': unknown collective '%s'; expected allreduce, broadcast, reduce, "
                            "reducescatter, allgather, gather, scatter or alltoall", spec, e);
    if (c->algo_for[k] != ALGO_UNSET)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO '%s': %s is named twice", spec, algo_coll_names[k]);
    if (!tdm__algo_applies(c, k, a))
      return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_ALGO '%s': %s cannot run %s on this %d-rank %s communicator%s; expected %s", spec,
                            an, algo_coll_names[k], c->size, tdm_transport_name(c->kind),
                            a == TDM_ALGO_HIER ? " (hier needs a tcp or mpi job whose ranks are on several nodes: host names or TANDEM_NODE_ID)" : "",
                            tdm__algos_for(c, k, list, sizeof list));
    c->algo_for[k] = a;
  }
  return TDM_OK;
}

/* The algorithm of a call: the call's own choice, else TANDEM_ALGO's for this collective, else
 * its plain name where it applies (a sub-communicator may not allow what its parent did). */
tdm_algo tdm__algo_pick(const struct tdm_comm *c, int kind, tdm_algo a) {
  if (a != TDM_ALGO_AUTO) return a;
  if (c->algo_for[kind] != ALGO_UNSET && tdm__algo_applies(c, kind, c->algo_for[kind])) return c->algo_for[kind];
  if (c->algo_for[kind] == ALGO_UNSET && tdm__algo_applies(c, kind, c->algo_plain)) return c->algo_plain;
  return TDM_ALGO_AUTO;
}

tdm_status tdm__parse_net_emulate(const char *spec, double *lat, double *bw) {
  *lat = 0;
  *bw = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL; /* strtok_r: ranks of the thread transport parse this concurrently */
  int bw_given = 0;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    double v = strtod(tok, &end);
    if (end == tok || !(v >= 0) || !isfinite(v)) goto bad;
    static const struct {
      const char *unit;
      double lat, bw;
    } u[] = {{"ns", 1e-9, 0}, {"us", 1e-6, 0}, {"ms", 1e-3, 0}, {"s", 1, 0},
             {"kbps", 0, 1e3 / 8}, {"mbps", 0, 1e6 / 8}, {"gbps", 0, 1e9 / 8},
             {"KB/s", 0, 1e3}, {"MB/s", 0, 1e6}, {"GB/s", 0, 1e9}};
    int found = 0;
    for (size_t i = 0; i < sizeof u / sizeof u[0] && !found; i++)
      if (!strcasecmp(end, u[i].unit) && !(u[i].unit[1] == 'B' && strcmp(end, u[i].unit))) {
        if (u[i].lat) *lat = v * u[i].lat;
        else *bw = v * u[i].bw, bw_given = 1;
        found = 1;
      }
    if (!found) goto bad;
  }
  /* a link no real network has is a typo (or an overflow that would have meant none at all) */
  if (*lat > 10)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_NET_EMULATE='%s': a latency of %g s; expected at most 10 s", spec, *lat);
  if (bw_given && !(*bw >= 125))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "TANDEM_NET_EMULATE='%s': a bandwidth of %g bytes/s; expected at least 1kbps", spec, *bw);
  return TDM_OK;
bad:
  return tdm__set_error(TDM_ERR_INVALID_ARG,
                        "TANDEM_NET_EMULATE='%s'; expected latency and/or bandwidth such as 100us,1gbps or 2ms,500MB/s", spec);
}

