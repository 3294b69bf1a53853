/* Device all-reduce bandwidth: NCCL against host staging (tandem/comm_device.h), f32, out of place,
 * sizes 1 KiB to 256 MiB, the two alternating call by call, medians. Under `tandem run -n P` (ranks
 * sharing one GPU) only staging runs. bench/nccl_allreduce.sh runs both. Prints a table on rank 0. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One timed all-reduce: enqueue and wait (the staged path's host part is synchronous anyway). */
static double one(tdm_dcomm_t d, const void *src, void *dst, size_t n) {
  double t0 = tdm_time_now();
  if (tdm_dcomm_allreduce(d, src, dst, n, TDM_F32, TDM_SUM, NULL) != TDM_OK || tdm_dcomm_synchronize(d, NULL) != TDM_OK) {
    fprintf(stderr, "nccl_allreduce: %s\n", tdm_last_error());
    exit(1);
  }
  return tdm_time_now() - t0;
}

int main(int argc, char **argv) {
  size_t max_bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (256u << 20);
  tdm_comm_t host;
  if (tdm_comm_create_from_env(&host) != TDM_OK) {
    fprintf(stderr, "nccl_allreduce: %s\n", tdm_last_error());
    return 1;
  }
  int P = tdm_comm_size(host), r = tdm_comm_rank(host);
  tdm_dcomm_config cfg = tdm_dcomm_config_default();
  tdm_dcomm_t nccl = NULL, stage = NULL;
  cfg.mode = TDM_DCOMM_STAGE;
  if (tdm_dcomm_create(host, &cfg, &stage) != TDM_OK) {
    fprintf(stderr, "nccl_allreduce: %s\n", tdm_last_error());
    return tdm_dcomm_device_available(NULL) ? 1 : 77;
  }
  cfg.mode = TDM_DCOMM_NCCL;
  if (P == 1 && tdm_dcomm_create(host, &cfg, &nccl) != TDM_OK) {
    fprintf(stderr, "nccl_allreduce: %s\n", tdm_last_error());
    return 1;
  }
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, tdm_dcomm_device(stage));
  void *src, *dst;
  if (cudaMalloc(&src, max_bytes) != cudaSuccess || cudaMalloc(&dst, max_bytes) != cudaSuccess) {
    fprintf(stderr, "nccl_allreduce: cudaMalloc of 2 x %zu bytes failed\n", max_bytes);
    return 1;
  }
  cudaMemset(src, 0, max_bytes);
  if (r == 0) {
    printf("# device all-reduce, f32 sum, out of place, %d rank%s on %s, median of the timed calls (us), "
           "algorithm bandwidth = bytes / time\n",
           P, P > 1 ? "s sharing the GPU" : "", prop.name);
    printf("%10s %6s %12s %12s %11s %11s %9s\n", "bytes", "calls", "nccl_us", "stage_us", "nccl_GB/s", "stage_GB/s",
           "stage/nccl");
  }
  for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    size_t n = bytes / 4;
    int reps = bytes <= (1u << 20) ? 50 : bytes <= (16u << 20) ? 20 : 7;
    double tn[64], ts[64];
    one(stage, src, dst, n); /* warm-up: buffers, connections */
    if (nccl) one(nccl, src, dst, n);
    for (int i = 0; i < reps; i++) { /* alternate, so drift hits both alike */
      ts[i] = one(stage, src, dst, n);
      if (nccl) tn[i] = one(nccl, src, dst, n);
    }
    double ms = median(ts, reps) * 1e6, mn = nccl ? median(tn, reps) * 1e6 : 0;
    if (r == 0) {
      if (nccl)
        printf("%10zu %6d %12.1f %12.1f %11.2f %11.2f %9.2f\n", bytes, reps, mn, ms, (double)bytes / mn / 1e3,
               (double)bytes / ms / 1e3, ms / mn);
      else
        printf("%10zu %6d %12s %12.1f %11s %11.2f %9s\n", bytes, reps, "-", ms, "-", (double)bytes / ms / 1e3, "-");
      fflush(stdout);
    }
  }
  cudaFree(src), cudaFree(dst);
  tdm_dcomm_destroy(nccl);
  tdm_dcomm_destroy(stage);
  tdm_comm_destroy(host);
  return 0;
}
