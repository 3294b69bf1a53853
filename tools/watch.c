/* The rank side of tandem run's death handling (watch.h). Only system calls after start: the
 * thread may run while the process forks (a nested tandem run), so it takes no locks. */
#define _GNU_SOURCE
#include "watch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static pid_t launcher;
static unsigned long long launcher_start;
static char stop_note[160];

unsigned long long watch_start_time(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  /* "pid (comm) state ppid ..." : comm may hold spaces and parentheses, so count from the last ')' */
  char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X') return 0;
  p += 2; /* the state is field 3; the start time field 22 */
  for (int field = 3; field < 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  if (!p) return 0;
  return strtoull(p, NULL, 10);
}

static int launcher_alive(void) {
  if (!launcher_start) return kill(launcher, 0) == 0 || errno == EPERM;
  errno = 0;
  unsigned long long st = watch_start_time(launcher);
  if (st) return st == launcher_start;
  /* unread: gone (no such entry, a zombie), or this process short of descriptors or memory, which
     says nothing of the launcher (out of descriptors a healthy rank stopped itself "the launcher is gone") */
  return errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == EAGAIN || errno == EINTR;
}

static _Noreturn void stop(void) {
  if (write(2, stop_note, strlen(stop_note)) < 0) { /* nothing more to do about it */
  }
  kill(getpid(), SIGTERM); /* as if the launcher had stopped us: handlers run, the default kills */
  sleep(5);
  _exit(128 + SIGTERM);
}

static void *watch_main(void *arg) {
  (void)arg;
  int pfd = -1;
#ifdef SYS_pidfd_open
  pfd = (int)syscall(SYS_pidfd_open, launcher, 0); /* readable when it exits; -1 where unsupported */
#endif
  for (;;) {
    /* checked after pidfd_open too: then pfd surely refers to the launcher, not a reused pid */
    if (!launcher_alive()) stop();
    if (pfd < 0) {
      sleep(1);
      continue;
    }
    struct pollfd pf = {pfd, POLLIN, 0};
    if (poll(&pf, 1, 1000) > 0) stop(); /* it exited */
  }
  return NULL;
}

void watch_launcher(void) {
  const char *p = getenv("TANDEM_LAUNCHER_PID"), *s = getenv("TANDEM_LAUNCHER_START");
  if (!p || !*p) return;
  char *end;
  long pid = strtol(p, &end, 10);
  if (*end || pid <= 1 || pid == getpid()) {
    fprintf(stderr, "tandem: ignoring TANDEM_LAUNCHER_PID '%s': not the pid of another process\n", p);
    return;
  }
  launcher = (pid_t)pid;
  launcher_start = s && *s ? strtoull(s, &end, 10) : 0;
  if (s && *s && (*end || !launcher_start)) {
    fprintf(stderr, "tandem: ignoring TANDEM_LAUNCHER_START '%s': not a start time; watching pid %ld alone\n", s, pid);
    launcher_start = 0;
  }
  snprintf(stop_note, sizeof stop_note, "tandem: the launcher (tandem run, pid %ld) is gone: stopping this process (%ld)\n",
           pid, (long)getpid());
  /* started by the launcher itself, which set SIGKILL as our parent-death signal: SIGTERM instead,
   * so that the handler main installs runs (it removes a shared-memory segment still being set
   * up); the thread below ends us within 5 s of the launcher's death anyway */
  if (getppid() == launcher) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) stop(); /* it died in between: no signal will come */
  }
  pthread_t th;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&a, 256 * 1024);
  if (pthread_create(&th, &a, watch_main, NULL) != 0) {
    if (!launcher_alive()) stop(); /* no thread: at least do not start after the launcher died */
    fprintf(stderr, "tandem: cannot start the thread that watches the launcher (pid %ld)\n", pid);
  }
  pthread_attr_destroy(&a);
}
