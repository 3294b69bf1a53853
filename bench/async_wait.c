/* What a non-blocking all-reduce waited for costs beside the blocking call of the same size: data
 * parallelism hands its buckets to the communication thread (tdm_comm_iallreduce) and the
 * training thread waits for them, where `tandem bench` and the simulator's calibration call the
 * blocking collective. Per size, medians of 60 iterations (after 10) of: the blocking call; one
 * iallreduce + wait; two queued back to back, then both waited for (per call).
 *
 *   TANDEM_TRANSPORT=tcp TANDEM_NET_EMULATE=100us,10gbps ./build/tandem run -n 2 -- \
 *     ./build/bench/async_wait [BYTES...]   (default: the MLP's two buckets, 537640 and 1605632) */
#include <stdio.h>
#include <stdlib.h>

#include "tandem/comm.h"
#include "tandem/core.h"

enum { WARM = 10, RUNS = 60 };

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v) {
  qsort(v, RUNS, sizeof *v, cmp);
  return v[RUNS / 2];
}

int main(int argc, char **argv) {
  size_t sizes[16] = {537640, 1605632}, ns = 2, most = 0;
  if (argc > 17) {
    fprintf(stderr, "async_wait: %d sizes; expected at most 16\n", argc - 1);
    return 2;
  }
  if (argc > 1) ns = 0;
  for (int i = 1; i < argc; i++) {
    long long b = atoll(argv[i]);
    if (b < 4) {
      fprintf(stderr, "async_wait: a size of %s bytes; expected at least 4\n", argv[i]);
      return 2;
    }
    sizes[ns++] = (size_t)b;
  }
  for (size_t s = 0; s < ns; s++) most = sizes[s] > most ? sizes[s] : most;
  tdm_comm_t c;
  if (tdm_comm_create_from_env(&c) != TDM_OK) {
    fprintf(stderr, "async_wait: %s\n", tdm_last_error());
    return 1;
  }
  float *buf = calloc(most / 4, sizeof(float));
  int rc = buf ? 0 : 1;
  for (size_t s = 0; s < ns && !rc; s++) {
    size_t n = sizes[s] / 4;
    double tb[RUNS], ta[RUNS], tq[RUNS];
    for (int i = 0; i < WARM + RUNS && !rc; i++) {
      tdm_work_t w, w1, w2;
      double t0 = tdm_time_now();
      rc |= tdm_comm_allreduce(c, buf, buf, n, TDM_F32, TDM_AVG, TDM_ALGO_AUTO) != TDM_OK;
      double t1 = tdm_time_now();
      rc |= tdm_comm_iallreduce(c, buf, buf, n, TDM_F32, TDM_AVG, TDM_ALGO_AUTO, &w) != TDM_OK || tdm_work_wait(w) != TDM_OK;
      double t2 = tdm_time_now();
      rc |= tdm_comm_iallreduce(c, buf, buf, n, TDM_F32, TDM_AVG, TDM_ALGO_AUTO, &w1) != TDM_OK ||
            tdm_comm_iallreduce(c, buf, buf, n, TDM_F32, TDM_AVG, TDM_ALGO_AUTO, &w2) != TDM_OK ||
            tdm_work_wait(w1) != TDM_OK || tdm_work_wait(w2) != TDM_OK;
      double t3 = tdm_time_now();
      if (i >= WARM) tb[i - WARM] = t1 - t0, ta[i - WARM] = t2 - t1, tq[i - WARM] = (t3 - t2) / 2;
    }
    if (rc) fprintf(stderr, "async_wait: rank %d: %s\n", tdm_comm_rank(c), tdm_last_error());
    else if (tdm_comm_rank(c) == 0)
      printf("%zu B on %d ranks: blocking %.3f ms, iallreduce + wait %.3f ms, two queued %.3f ms each\n", (size_t)n * 4,
             tdm_comm_size(c), median(tb) * 1e3, median(ta) * 1e3, median(tq) * 1e3);
  }
  free(buf);
  tdm_comm_destroy(c);
  return rc;
}
