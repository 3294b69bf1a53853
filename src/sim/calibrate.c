/* Calibration: alpha and beta of a communicator's links from timed exchanges, gamma from the
 * reduction kernel the algorithms use, and the all-reduce measurements the validation compares
 * the costs with. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/sim.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Every rank sends n bytes to the next rank around the ring while it receives n from the one
 * before, all at once, as every step of the algorithms runs, so that ranks sharing cores and
 * links (and waiting on each other) are measured as they will run; iters times, rank 0's mean. */
static tdm_status exchange(tdm_comm_t c, char *s, char *r, size_t n, int iters, double *out) {
  int me = tdm_comm_rank(c), P = tdm_comm_size(c);
  double t[64];
  if (iters > 64) iters = 64;
  for (int i = -2; i < iters; i++) {
    double t0 = tdm_time_now();
    TDM__TRY(tdm_comm_sendrecv(c, (me + 1) % P, s, n, (me + P - 1) % P, r, n, 5));
    if (i >= 0) t[i] = tdm_time_now() - t0;
  }
  double sum = 0; /* the mean, as tandem bench reports: a loaded machine's stalls are part of the cost */
  for (int i = 0; i < iters; i++) sum += t[i];
  *out = sum / iters;
  return TDM_OK;
}

tdm_status tdm_sim_calibrate_link(tdm_comm_t c, size_t max_bytes, tdm_sim_link *out, double *pingpong) {
  if (!c || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "calibrate: NULL argument");
  if (tdm_comm_size(c) < 2) return tdm__set_error(TDM_ERR_INVALID_ARG, "calibrate: %d rank; expected 2 or more", tdm_comm_size(c));
  if (max_bytes < 4096) max_bytes = 4096;
  char *s = tdm__malloc(max_bytes), *r = tdm__malloc(max_bytes);
  if (!s || !r) {
    tdm__free(s), tdm__free(r);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "calibrate: out of memory");
  }
  memset(s, 1, max_bytes);
  int me = tdm_comm_rank(c);
  double sw = 0, swn = 0, swnn = 0, swt = 0, swnt = 0, res[4] = {0, 0, 0, 0};
  tdm_status st = tdm_comm_barrier(c);
  for (size_t n = 8; st == TDM_OK && n <= max_bytes; n *= 4) {
    double t;
    st = exchange(c, s, r, n, n <= 65536 ? 40 : n <= 1048576 ? 15 : 7, &t);
    if (st == TDM_OK && me == 0 && t > 0) { /* weighted least squares on t = alpha + n beta, weight 1/t^2 */
      double w = 1 / (t * t), x = (double)n;
      sw += w, swn += w * x, swnn += w * x * x, swt += w * t, swnt += w * x * t;
    }
  }
  if (st == TDM_OK && me == 0) {
    double det = sw * swnn - swn * swn;
    res[0] = det != 0 ? (swt * swnn - swn * swnt) / det : 0;
    res[1] = det != 0 ? (sw * swnt - swn * swt) / det : 0;
    if (res[0] < 0) res[0] = 0;
    if (res[1] < 0) res[1] = 0;
    /* gamma: the reduction of 4 MiB of f32 into 4 MiB, as the algorithms reduce a received block */
    size_t nf = (max_bytes < (4u << 20) ? max_bytes : (4u << 20)) / 4;
    double g[9];
    for (int i = -1; i < 9; i++) {
      double t0 = tdm_time_now();
      tdm_reduce_local(r, s, nf, TDM_F32, TDM_SUM);
      if (i >= 0) g[i] = (tdm_time_now() - t0) / (double)(nf * 4);
    }
    res[2] = median(g, 9);
  }
  /* ping-pong: rank 0 sends 8 bytes, rank 1 answers; half the round trip */
  double pp[31];
  for (int i = -2; st == TDM_OK && i < 31; i++) {
    double t0 = tdm_time_now();
    if (me == 0) {
      st = tdm_comm_send(c, 1, 7, s, 8);
      if (st == TDM_OK) st = tdm_comm_recv(c, 1, 7, r, 8);
    } else if (me == 1) {
      st = tdm_comm_recv(c, 0, 7, r, 8);
      if (st == TDM_OK) st = tdm_comm_send(c, 0, 7, s, 8);
    }
    if (i >= 0) pp[i] = (tdm_time_now() - t0) / 2;
  }
  if (st == TDM_OK && me == 0) res[3] = median(pp, 31);
  if (st == TDM_OK) st = tdm_comm_broadcast(c, res, 4, TDM_F64, 0, TDM_ALGO_AUTO);
  tdm__free(s), tdm__free(r);
  TDM__TRY(st);
  out->alpha = res[0], out->beta = res[1], out->gamma = res[2];
  if (pingpong) *pingpong = res[3];
  return TDM_OK;
}

tdm_status tdm_sim_measure_allreduce(tdm_comm_t c, tdm_algo algo, size_t n, int iters, double *seconds) {
  if (!c || !seconds || iters < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "measure: NULL argument or %d iterations", iters);
  size_t count = n / 4 ? n / 4 : 1;
  float *buf = tdm__malloc(count * 4);
  double *t = tdm__malloc(sizeof(double) * (size_t)iters);
  if (!buf || !t) {
    tdm__free(buf), tdm__free(t);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "measure: out of memory");
  }
  for (size_t i = 0; i < count; i++) buf[i] = 1;
  tdm_status st = TDM_OK;
  for (int i = -2; st == TDM_OK && i < iters; i++) {
    st = tdm_comm_barrier(c);
    double t0 = tdm_time_now();
    if (st == TDM_OK) st = tdm_comm_allreduce(c, buf, buf, count, TDM_F32, TDM_SUM, algo);
    double el = tdm_time_now() - t0; /* the slowest rank's time is the collective's */
    if (st == TDM_OK) st = tdm_comm_allreduce(c, &el, &el, 1, TDM_F64, TDM_MAX, TDM_ALGO_AUTO);
    if (i >= 0) t[i] = el;
  }
  if (st == TDM_OK) *seconds = median(t, iters);
  tdm__free(buf), tdm__free(t);
  return st;
}
