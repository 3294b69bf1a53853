/* What giving pages back costs when they are written again: ZeRO stages 2-3 give back a reserved
 * buffer's pages after each use (tdm_params_release), and the next write faults them in again.
 * Times, per 8 MiB, touching the pages again after MADV_DONTNEED with 4 KiB pages, with
 * MADV_POPULATE_WRITE first, and with transparent huge pages (MADV_HUGEPAGE); and a plain
 * memset of resident pages for scale.
 *
 *   ./build/bench/page_faults [MiB=8] [reps=20] */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* n bytes of reserved address space aligned to 2 MiB */
static char *reserve(size_t n) {
  size_t huge = (size_t)2 << 20;
  char *m = mmap(NULL, n + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return NULL;
  return (char *)(((uintptr_t)m + huge - 1) / huge * huge);
}

int main(int argc, char **argv) {
  size_t n = (size_t)(argc > 1 ? atoi(argv[1]) : 8) << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 20;
  char *p = reserve(n), *h = reserve(n);
  if (!p || !h || reps < 1) return 1;
  madvise(h, n, MADV_HUGEPAGE);
  const char *names[] = {"4 KiB pages: give back, write again", "4 KiB pages: give back, populate, write",
                         "huge pages:  give back, write again", "resident:    write"};
  printf("# %zu MiB, %d repetitions, ms per pass\n", n >> 20, reps);
  for (int mode = 0; mode < 4; mode++) {
    char *b = mode == 2 ? h : p;
    memset(b, 1, n);
    double t0 = now();
    for (int r = 0; r < reps; r++) {
      if (mode < 3) madvise(b, n, MADV_DONTNEED);
#ifdef MADV_POPULATE_WRITE
      if (mode == 1) madvise(b, n, MADV_POPULATE_WRITE);
#endif
      memset(b, 1, n);
    }
    double ms = (now() - t0) / reps * 1e3;
    printf("%-42s %8.3f ms  (%.2f us per 4 KiB)\n", names[mode], ms, ms * 1e3 / (double)(n >> 12));
  }
  return 0;
}
