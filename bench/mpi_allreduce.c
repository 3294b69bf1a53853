/* The peer side of bench/comm_vs_mpi.sh: MPI_Allreduce timed as tandem bench times its
 * all-reduce (mean of -n iterations after -w warm-ups, the slowest rank's), printing the same
 * nccl-tests columns. Build: mpicc -O2 -o mpi_allreduce bench/mpi_allreduce.c
 * Run:   mpirun -np 2 ./mpi_allreduce -b 8 -e 256M -f 2 [-n 20] [-w 5] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  long long m = 1;
  if (*end == 'K' || *end == 'k') m = 1LL << 10;
  if (*end == 'M' || *end == 'm') m = 1LL << 20;
  if (*end == 'G' || *end == 'g') m = 1LL << 30;
  return (long long)(v * (double)m);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int P, me;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  long long minb = 8, maxb = 32 << 20, f = 2, iters = 20, warm = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) f = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warm = atoll(argv[i + 1]);
  }
  size_t maxc = (size_t)maxb / 4 + 1;
  float *s = malloc(maxc * 4), *r = malloc(maxc * 4);
  if (me == 0) {
    printf("# MPI_Allreduce  ranks %d  minBytes %lld maxBytes %lld step: %lld(factor) warmup iters: %lld iters: %lld\n#\n",
           P, minb, maxb, f, warm, iters);
    printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
  }
  for (long long size = minb; size <= maxb; size *= f) {
    size_t n = (size_t)size / 4;
    double t[2];
    long long wrong[2];
    for (int ip = 0; ip < 2; ip++) {
      for (size_t j = 0; j < n; j++) s[j] = (float)(j % 7) + (float)me + 1;
      for (long long i = 0; i < warm; i++) MPI_Allreduce(ip ? MPI_IN_PLACE : s, ip ? s : r, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (long long i = 0; i < iters; i++) MPI_Allreduce(ip ? MPI_IN_PLACE : s, ip ? s : r, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double us = (MPI_Wtime() - t0) / (double)iters * 1e6;
      MPI_Allreduce(&us, &t[ip], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      for (size_t j = 0; j < n; j++) s[j] = (float)(j % 7) + (float)me + 1;
      MPI_Allreduce(ip ? MPI_IN_PLACE : s, ip ? s : r, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      long long w = 0;
      const float *out = ip ? s : r;
      for (size_t j = 0; j < n; j++) w += out[j] != (float)(P * ((j % 7) + 1) + P * (P - 1) / 2);
      MPI_Allreduce(&w, &wrong[ip], 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
    if (me == 0) {
      double bytes = (double)n * 4, fac = 2.0 * (P - 1) / P;
      printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %5lld  %7.2f  %6.2f  %6.2f  %5lld\n", n * 4, n, "float",
             "sum", -1, t[0], bytes / t[0] / 1e3, bytes / t[0] / 1e3 * fac, wrong[0], t[1], bytes / t[1] / 1e3,
             bytes / t[1] / 1e3 * fac, wrong[1]);
      fflush(stdout);
    }
  }
  free(s);
  free(r);
  MPI_Finalize();
  return 0;
}
