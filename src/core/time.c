#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "core/internal.h"
#include "tandem/core.h"

double tdm_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tdm_median(double *v, size_t n) {
  if (!n) return 0;
  TDM__NONNULL(v, NAN, "tdm_median: the timings v are NULL");
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
