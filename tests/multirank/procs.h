/* Helpers for tests that fork real ranks: a free port, and waiting for children with a deadline
 * (whoever is left then is killed, so a hang fails the test instead of stalling it). */
#ifndef TDM_TEST_PROCS_H
#define TDM_TEST_PROCS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tandem/core.h"

/* A port that was free a moment ago on 127.0.0.1. */
static inline int procs_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (struct sockaddr *)&sa, sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd);
  return ntohs(sa.sin_port);
}

/* Reaps whichever of pids[0..n) has exited, without waiting: codes[r] = exit code, or 128 +
 * signal (codes[r] < 0: still running). Returns how many are still running. */
static inline int procs_reap(int n, const pid_t *pids, int *codes) {
  int status, left = 0;
  for (int r = 0; r < n; r++)
    if (codes[r] < 0 && waitpid(pids[r], &status, WNOHANG) == pids[r])
      codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  for (int r = 0; r < n; r++) left += codes[r] < 0;
  return left;
}

/* Kills (and reaps) whoever of pids[0..n) is still running: codes[r] = 999 for them. */
static inline void procs_kill_left(int n, const pid_t *pids, int *codes, const char *why) {
  for (int r = 0; r < n; r++)
    if (codes[r] < 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
      codes[r] = 999;
      fprintf(stderr, "  process %d (pid %d) %s: killed\n", r, (int)pids[r], why);
    }
}

/* Waits up to timeout seconds for all of pids[0..n); kills the rest. Returns the time taken. */
static inline double procs_wait_all(int n, const pid_t *pids, int *codes, double timeout) {
  double t0 = tdm_time_now();
  for (int r = 0; r < n; r++) codes[r] = -1;
  while (procs_reap(n, pids, codes) > 0 && tdm_time_now() - t0 < timeout) usleep(10000);
  procs_kill_left(n, pids, codes, "did not finish in time");
  return tdm_time_now() - t0;
}

/* In a forked rank's function (a local `rank` in scope): on cond, print the rank, the message and
 * tandem's last error, and return 1 (the rank's exit code). */
#define FAILIF(cond, ...)                           \
  do {                                              \
    if (cond) {                                     \
      fprintf(stderr, "  rank %d: ", rank);         \
      fprintf(stderr, __VA_ARGS__);                 \
      fprintf(stderr, " (%s)\n", tdm_last_error()); \
      return 1;                                     \
    }                                               \
  } while (0)

#endif
