/* How tandem sets OpenBLAS up: one thread (threads.c splits products over its own pool), and
 * which kernels it runs. OpenBLAS (Debian's is built for every x86-64 core) picks its kernels
 * when it loads, from the processor or from OPENBLAS_CORETYPE; the choice matters: on this
 * project's AVX-512 machines sgemm runs at about 200 GFLOP/s on one core with the Cooperlake
 * (AVX-512) kernels and at 108 with the Haswell (AVX2) ones that OPENBLAS_CORETYPE=Haswell,
 * set in their environment, asks for (bench/sgemm_peak; docs/PERFORMANCE.md). tandem never
 * changes the variable: benchmarks say which kernels ran. */
#include "core/internal.h"
#include "tandem/core.h"

char *openblas_get_corename(void); /* from libopenblas */
void openblas_set_num_threads(int num_threads);

void tdm__blas_single_thread(void) { openblas_set_num_threads(1); }

const char *tdm_blas_core(void) {
  const char *name = openblas_get_corename();
  return name ? name : "unknown";
}
