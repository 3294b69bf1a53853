/* LD_PRELOAD shim for test_launcher.sh: from the Nth call on (TDM_FAIL_FORK_AT=N), fork() fails
 * with EAGAIN, as it does when the process limit is reached. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

pid_t fork(void) {
  static int calls;
  const char *at = getenv("TDM_FAIL_FORK_AT");
  if (at && ++calls >= atoi(at)) {
    errno = EAGAIN;
    return -1;
  }
  pid_t (*real)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "fork");
  return real();
}
