/* The recorder's own cost (bench/trace_cost.sh builds and runs it): nanoseconds per span with
 * tracing off (the branch), on (clock reads + the ring), and per span written by the flush.
 * CPU time of this thread (a busy machine stretches wall time). Medians of 7 rounds of 2^20 spans (written in rounds of 4096, below the ring's flush mark). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tandem/tandem.h"

/* This thread's CPU time: other jobs on a busy machine inflate wall time, not this. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

enum { N = 1 << 20, CHUNK = 4096, ROUNDS = 7 };

/* What an instrumented call site does: read the clock if on, work, record. */
static double spans(double *flush_s) {
  tdm_trace_args a = TDM_TRACE_ARGS_INIT;
  double t_flush = 0, t0 = cpu_now();
  for (int i = 0; i < N; i += CHUNK) {
    for (int k = 0; k < CHUNK; k++) {
      double s = tdm_trace_begin();
      a.seq = k;
      if (s > 0) tdm_trace_span("compute", "op", s, tdm_trace_now(), &a);
    }
    double f0 = cpu_now();
    tdm_trace *t = tdm_trace_current();
    if (t) tdm_trace_flush(t);
    t_flush += cpu_now() - f0;
  }
  *flush_s = t_flush;
  return cpu_now() - t0 - t_flush;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "/tmp";
  double off[ROUNDS], on[ROUNDS], fl[ROUNDS], f;
  for (int r = 0; r < ROUNDS; r++) {
    off[r] = spans(&f) / N * 1e9;
    tdm_trace *t;
    if (tdm_trace_open(&t, dir, 0, 1) != TDM_OK) {
      fprintf(stderr, "%s\n", tdm_last_error());
      return 1;
    }
    on[r] = spans(&f) / N * 1e9;
    fl[r] = f / N * 1e9;
    tdm_trace_close(t);
  }
  qsort(off, ROUNDS, sizeof(double), cmp);
  qsort(on, ROUNDS, sizeof(double), cmp);
  qsort(fl, ROUNDS, sizeof(double), cmp);
  printf("%.2f %.2f %.2f\n", off[ROUNDS / 2], on[ROUNDS / 2], fl[ROUNDS / 2]);
  return 0;
}
