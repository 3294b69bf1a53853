/* LD_PRELOAD module for tests/multirank/test_reshard.sh: kills this process with SIGKILL in the
 * middle of saving a checkpoint, at a chosen point, as a power cut or an OOM kill would.
 *   TDM_KILL_RENAME=TEXT  just before renaming a file onto a name containing TEXT (a rank's file or
 *                         the manifest, complete in its temporary)
 *   TDM_KILL_WRITE=TEXT   in a write to a file whose name contains TEXT: half the bytes, then killed
 *   TDM_KILL_RANK=R       only in the process whose RANK is R (default: any)
 * Only the first attempt of a tandem run (TANDEM_RESTART_COUNT unset or 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int armed(void) {
  const char *want = getenv("TDM_KILL_RANK"), *rank = getenv("RANK"), *restart = getenv("TANDEM_RESTART_COUNT");
  if (restart && strcmp(restart, "0")) return 0;
  return !want || (rank && !strcmp(want, rank));
}

int rename(const char *from, const char *to) {
  static int (*real)(const char *, const char *);
  if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
  const char *text = getenv("TDM_KILL_RENAME");
  if (text && *text && strstr(to, text) && armed()) raise(SIGKILL);
  return real(from, to);
}

ssize_t write(int fd, const void *buf, size_t n) {
  static ssize_t (*real)(int, const void *, size_t);
  if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
  const char *text = getenv("TDM_KILL_WRITE");
  if (text && *text && fd > 2 && n > 1 && armed()) {
    char link[64], name[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, name, sizeof name - 1);
    if (k > 0) {
      name[k] = 0;
      if (strstr(name, text)) {
        real(fd, buf, n / 2);
        raise(SIGKILL);
      }
    }
  }
  return real(fd, buf, n);
}
