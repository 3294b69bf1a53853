/* The compute rate from a measured step: a short run of the described training on this process,
 * its per-step metrics read back (forward, backward, optimizer, the whole step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/sim.h"
#include "tandem/train.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double field(const char *line, const char *key) {
  const char *p = strstr(line, key);
  return p ? atof(p + strlen(key)) : -1;
}

tdm_status tdm_sim_calibrate_compute(const tdm_train_config *cfg, int steps, double fwd_bwd_flops, int64_t n_params,
                                     tdm_sim_cluster *k, char *detail, size_t n) {
  if (!cfg || !k || steps < 4 || !(fwd_bwd_flops > 0))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "calibrate: NULL argument, %d steps (expected >= 4) or %g FLOPs", steps, fwd_bwd_flops);
  char path[] = "/tmp/tandem-calibrate-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return tdm__set_error(TDM_ERR_IO, "calibrate: a temporary file in /tmp: cannot be made");
  close(fd);
  remove(path); /* the trainer makes it anew */
  tdm_train_config c = *cfg;
  c.steps = steps, c.epochs = 1, c.metrics = path, c.progress = NULL, c.save_weights = NULL, c.checkpoint_dir = NULL;
  c.val_every = 1000000000, c.resume = 0, c.max_time = 0;
  tdm_train_result r;
  tdm_status st = tdm_train_run(&c, &r);
  FILE *f = st == TDM_OK ? fopen(path, "r") : NULL;
  if (st == TDM_OK && !f) st = tdm__set_error(TDM_ERR_IO, "calibrate: the metrics of the measured run (%s) cannot be read", path);
  double fb[4096], op[4096], all[4096];
  int m = 0;
  char line[4096];
  while (f && m < 4096 && fgets(line, sizeof line, f)) {
    double step = field(line, "\"step\":"), t = field(line, "\"step_time_ms\":");
    if (t < 0 || step < 2) continue; /* evaluation lines; the first steps warm up */
    fb[m] = field(line, "\"time_forward_ms\":") + field(line, "\"time_backward_ms\":");
    op[m] = field(line, "\"time_optimizer_ms\":");
    all[m++] = t;
  }
  if (f) fclose(f);
  remove(path);
  TDM__TRY(st);
  if (m < 1) return tdm__set_error(TDM_ERR_IO, "calibrate: the measured run wrote no step metrics after its warm-up");
  qsort(fb, (size_t)m, sizeof(double), cmp_double);
  qsort(op, (size_t)m, sizeof(double), cmp_double);
  qsort(all, (size_t)m, sizeof(double), cmp_double);
  double tfb = fb[m / 2] * 1e-3, top = op[m / 2] * 1e-3, tall = all[m / 2] * 1e-3;
  if (!(tfb > 0)) return tdm__set_error(TDM_ERR_IO, "calibrate: the measured forward and backward took %g s", tfb);
  k->flops = fwd_bwd_flops / tfb;
  k->optim_rate = top > 0 ? (double)n_params / top : 1e12;
  k->overhead = tall - tfb - top > 0 ? tall - tfb - top : 0;
  /* the spread, robustly: half the 16th-84th percentile range (one standard deviation of a normal
   * distribution) over the median; a shared machine's few steps preempted for tens of
   * milliseconds would make a standard deviation of them */
  k->compute_cv = (fb[(int)(0.84 * (m - 1))] - fb[(int)(0.16 * (m - 1))]) / 2 / fb[m / 2];
  snprintf(k->compute_model, sizeof k->compute_model, "%s", cfg->model ? cfg->model : "?");
  if (detail)
    snprintf(detail, n, "compute: %s, median of %d steps: forward+backward %.3f ms (%.3g FLOP/s, spread %.2f), optimizer %.3f ms, step %.3f ms",
             k->compute_model, m, tfb * 1e3, k->flops, k->compute_cv, top * 1e3, tall * 1e3);
  return TDM_OK;
}
