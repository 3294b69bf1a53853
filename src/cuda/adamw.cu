// AdamW in one pass over parameters, gradients and both moments (PyTorch's decoupled decay).
#include <math.h>

#include "cu_common.cuh"

__global__ void adamw_k(float *w, float *m, float *v, const float *g, int64_t n, float lr, float b1, float b2, float eps,
                        float shrink, float step, float inv_bc2s, float gscale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float gi = g[i] * gscale;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * shrink - step * mi / (sqrtf(vi) * inv_bc2s + eps); // the CPU optimizer's arithmetic
  }
}

extern "C" void tdm_cu_adamw(float *w, float *m, float *v, const float *g, int64_t n, float lr, float beta1, float beta2,
                             float eps, float wd, float bc1, float bc2_sqrt, float gscale) {
  adamw_k<<<tdm_cu_blocks(n, 256), 256>>>(w, m, v, g, n, lr, beta1, beta2, eps, 1.0f - lr * wd, lr / bc1, 1.0f / bc2_sqrt,
                                          gscale);
}
