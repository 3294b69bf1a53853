// The launch-error check the host code runs after each phase.
#include "cu_common.cuh"

extern "C" int tdm_cu_check(const char **msg) {
  cudaError_t e = cudaGetLastError();
  if (msg) *msg = cudaGetErrorString(e);
  return (int)e;
}
