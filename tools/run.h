/* What `tandem run` (run.c) and its elastic form (run_elastic.c) share: a rank's process and
 * output, how ranks are started and stopped, the store's socket. Single-threaded: the launcher's
 * loop. */
#ifndef TANDEM_TOOLS_RUN_H
#define TANDEM_TOOLS_RUN_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "tandem/train.h"

#define MAX_RANKS 256
#define TAIL_LINES 8
/* A rank's exit status when its failure was passed on from another rank (tdm_last_error_origin):
 * the launcher names a rank that failed of its own accord over one that relayed it. */
#define TANDEM_EXIT_RELAYED 4
/* How long a relayed failure waits for the rank it came from to end before the ranks are stopped:
 * the origin aborts its links first, then writes its error and cleans up. */
#define RUN_RELAY_GRACE_S 3.0

typedef struct {
  pid_t pid;
  int fd;            /* read end of the rank's stdout+stderr; -1 once it is closed */
  char partial[4096];
  size_t plen;
  char tail[TAIL_LINES][512];
  int ntail;
  int done, code, sig;
  double stopped_since; /* when it was first seen stopped (SIGSTOP), or 0 */
  int stopped;          /* found stopped when another rank failed, and blamed: the others waited for it */
  FILE *log;         /* open for the whole run, restarts included */
  char log_path[4096];
  int log_failed;
} rank_t;

/* How much a failure tells about its cause, to choose whom to name among ranks that failed
 * together: 3 killed by a signal, 2 failed of its own accord, 1 relayed another's failure
 * (TANDEM_EXIT_RELAYED), 0 not failed. */
int run_fail_weight(const rank_t *r);
/* Prints what rank idx wrote, prefixed "[rank idx] "; final: also a last line without newline. */
void run_drain(rank_t *r, int idx, int final);
const char *run_self_exe(void);
/* Sends sig to ranks[0..n) still running (group: to their process groups too). */
void run_signal_ranks(rank_t *ranks, int n, int sig, int group);
/* Removes the shm segments a reaped rank created and could not unlink. */
void run_remove_segments_of(pid_t pid);
/* The child's side of fork: environment (name, value pairs; NULL ends), output, exec. */
_Noreturn void run_start_rank(char **prog, int out_fd, int store_fd, pid_t launcher, const char *const *env);
/* Opens the store's listening socket on master (port 0: any); returns the fd or -1 (printed). */
int run_store_socket(const char *master, int64_t nnodes, int64_t *port);

typedef struct {
  int min_nodes, max_nodes, local;
  char host[256];
  int port;
  const char *token;
  double timeout_s, last_call_s;
  int64_t max_restarts;
  int scale_lr; /* --elastic-batch scale-lr; else keep */
  char **prog;
} run_elastic_opts;

/* "N" or "MIN:MAX" with 1 <= MIN <= MAX <= 4096; prints the error and returns 2 otherwise. */
int run_parse_nnodes(const char *s, int *min, int *max);
/* "HOST:PORT" with PORT in 1..65535; prints the error and returns 2 otherwise. */
int run_parse_endpoint(const char *s, char *host, size_t n, int *port);
/* The elastic launcher: returns the exit status. */
int run_elastic(const run_elastic_opts *o);

/* tandem train under an elastic launcher (TANDEM_ELASTIC_BATCH, TANDEM_ELASTIC_FULL_WORLD,
 * WORLD_SIZE): adjusts the accumulation (keep) or the learning rate (scale-lr) to this round's
 * world size and says so on stderr. Returns 0, or 2 with the error printed. */
int run_elastic_batch(tdm_train_config *c);

#endif
