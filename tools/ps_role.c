/* tandem ps-server / tandem ps-worker: one rank of a parameter-server job started on its own (a
 * host each, say): --rank R --world N --master HOST:PORT give the rendezvous every rank of the job
 * shares (rank 0, a worker, hosts it at HOST:PORT), the rest are tandem train's options, the same
 * on every rank. The role is checked against the rank: servers are the last --ps-servers ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *value_of(const char *arg, const char *name, int *consumed, int argc, char **argv, int i) {
  size_t n = strlen(name);
  if (strncmp(arg, name, n)) return NULL;
  if (arg[n] == '=') return *consumed = 1, arg + n + 1;
  if (arg[n] == 0) return *consumed = 2, i + 1 < argc ? argv[i + 1] : "";
  return NULL;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

static int ps_role(int server, int argc, char **argv) {
  const char *cmd = server ? "ps-server" : "ps-worker";
  const char *rank_s = NULL, *world_s = NULL, *master = NULL, *servers_s = NULL;
  char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
  if (!rest) return 1;
  int n = 0;
  for (int i = 0; i < argc;) {
    int used = 0;
    const char *v;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: tandem %s --rank R --world N --master HOST:PORT --ps-servers S [tandem train's options]\n\n"
             "One rank of a parameter-server job started on its own (as on several hosts): every rank gets the same\n"
             "--world, --master and training options; rank 0 (a worker) hosts the rendezvous at HOST:PORT. Ranks\n"
             "0..N-S-1 are workers (tandem ps-worker), N-S..N-1 servers (tandem ps-server). The transport is tcp\n"
             "unless TANDEM_TRANSPORT says otherwise; TANDEM_TIMEOUT bounds every wait (the rendezvous too).\n",
             cmd);
      free(rest);
      return 0;
    }
    if ((v = value_of(argv[i], "--rank", &used, argc, argv, i))) rank_s = v;
    else if ((v = value_of(argv[i], "--world", &used, argc, argv, i))) world_s = v;
    else if ((v = value_of(argv[i], "--master", &used, argc, argv, i))) master = v;
    else {
      if ((v = value_of(argv[i], "--ps-servers", &used, argc, argv, i))) servers_s = v;
      for (int k = 0; k < (used ? used : 1) && i + k < argc; k++) rest[n++] = argv[i + k];
      i += used ? used : 1;
      continue;
    }
    i += used;
  }
  rest[n] = NULL;
  long rank, world, servers, port;
  const char *colon = master ? strrchr(master, ':') : NULL;
  char host[256] = "";
  int bad = 0;
  if (!rank_s || !world_s || !master || !servers_s) {
    fprintf(stderr, "tandem %s: give --rank R, --world N, --master HOST:PORT and --ps-servers S (missing %s)\n", cmd,
            !rank_s ? "--rank" : !world_s ? "--world" : !master ? "--master" : "--ps-servers");
    bad = 1;
  } else if (!parse_int(world_s, 2, 1 << 20, &world)) {
    fprintf(stderr, "tandem %s: --world '%s'; expected the job's number of ranks, workers and servers, at least 2\n", cmd, world_s);
    bad = 1;
  } else if (!parse_int(rank_s, 0, world - 1, &rank)) {
    fprintf(stderr, "tandem %s: --rank '%s'; expected this rank, 0..%ld (--world %ld)\n", cmd, rank_s, world - 1, world);
    bad = 1;
  } else if (!colon || colon == master || (size_t)(colon - master) >= sizeof host || !parse_int(colon + 1, 1, 65535, &port)) {
    fprintf(stderr, "tandem %s: --master '%s'; expected HOST:PORT (rank 0's address and a port 1..65535)\n", cmd, master);
    bad = 1;
  } else if (!parse_int(servers_s, 1, world - 1, &servers)) {
    fprintf(stderr, "tandem %s: --ps-servers '%s' with --world %ld; expected 1..%ld\n", cmd, servers_s, world, world - 1);
    bad = 1;
  } else if ((rank >= world - servers) != server) {
    fprintf(stderr, "tandem %s: rank %ld of %ld with %ld server%s is a %s (servers are ranks %ld..%ld): start it with tandem %s\n",
            cmd, rank, world, servers, servers == 1 ? "" : "s", server ? "worker" : "server", world - servers, world - 1,
            server ? "ps-worker" : "ps-server");
    bad = 1;
  }
  if (bad) {
    free(rest);
    return 2;
  }
  memcpy(host, master, (size_t)(colon - master));
  char b[32];
  snprintf(b, sizeof b, "%ld", rank);
  setenv("RANK", b, 1);
  snprintf(b, sizeof b, "%ld", world);
  setenv("WORLD_SIZE", b, 1);
  snprintf(b, sizeof b, "%ld", port);
  setenv("MASTER_PORT", b, 1);
  setenv("MASTER_ADDR", host, 1);
  setenv("TANDEM_TRANSPORT", "tcp", 0); /* several hosts: shm cannot reach them */
  int r = tool_train_as(cmd, n, rest);
  free(rest);
  return r;
}

int tool_ps_server(int argc, char **argv) { return ps_role(1, argc, argv); }
int tool_ps_worker(int argc, char **argv) { return ps_role(0, argc, argv); }
