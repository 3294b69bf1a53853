/* Ranks die with their launcher. `tandem run` sets a parent-death signal in each rank it starts
 * and exports TANDEM_LAUNCHER_PID and TANDEM_LAUNCHER_START (its start time, so a reused pid is
 * not mistaken for it); every tandem process that sees them watches the launcher and stops
 * itself when it is gone, which covers ranks started through a shell or wrapper that forks (the
 * launcher is then not their parent, and the signal reaches only the wrapper). */
#ifndef TANDEM_WATCH_H
#define TANDEM_WATCH_H

#include <sys/types.h>

/* A process's start time in clock ticks since boot (/proc/PID/stat), 0 if it cannot be read or
 * the process is a zombie (it has exited). */
unsigned long long watch_start_time(pid_t pid);
/* Starts the watchdog thread if TANDEM_LAUNCHER_PID is set; when the launcher is gone (exited,
 * or its pid now belongs to another process) prints why to stderr, sends itself SIGTERM and
 * exits. A launcher that is gone already stops us at once. A rank that is the launcher's own child
 * turns its parent-death signal from SIGKILL into SIGTERM, which tandem's handler turns into its
 * clean-up (shared-memory names) and then the default death. */
void watch_launcher(void);

#endif
