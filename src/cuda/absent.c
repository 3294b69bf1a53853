/* include/tandem/cuda.h when the library is built without the CUDA backend: every call says so. */
#ifndef TANDEM_HAVE_CUDA
#include "core/internal.h"
#include "tandem/cuda.h"

#define NO_CUDA(fn)                                                                                             \
  tdm__set_error(TDM_ERR_NOT_SUPPORTED, "%s: tandem was built without CUDA (configure with -DTANDEM_CUDA=ON " \
                                        "on a machine with the CUDA toolkit)", fn)

int tdm_cuda_built(void) { return 0; }
tdm_status tdm_cuda_init(void) { return NO_CUDA("cuda"); }
tdm_status tdm_cuda_device_info(char *buf, size_t buf_len, size_t *free_bytes, size_t *total_bytes) {
  (void)buf, (void)buf_len, (void)free_bytes, (void)total_bytes;
  return NO_CUDA("cuda");
}
tdm_status tdm_cuda_malloc(void **out, size_t bytes, const char *what) {
  (void)bytes, (void)what;
  if (out) *out = NULL;
  return NO_CUDA("cuda_malloc");
}
void tdm_cuda_free(void *p) { (void)p; }
tdm_status tdm_cuda_to_device(void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src, (void)bytes;
  return NO_CUDA("cuda_to_device");
}
tdm_status tdm_cuda_to_host(void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src, (void)bytes;
  return NO_CUDA("cuda_to_host");
}
tdm_status tdm_cuda_copy(void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src, (void)bytes;
  return NO_CUDA("cuda_copy");
}
tdm_status tdm_cuda_memset0(void *p, size_t bytes) {
  (void)p, (void)bytes;
  return NO_CUDA("cuda_memset0");
}
tdm_status tdm_cuda_sync(const char *where) {
  (void)where;
  return NO_CUDA("cuda_sync");
}
void tdm_cuda_set_tf32(int on) { (void)on; }
tdm_status tdm_cuda_gpt_create(tdm_cuda_gpt **out, const tdm_model_config *mc, const tdm_params *params, int64_t B,
                               int64_t T, int precision) {
  (void)mc, (void)params, (void)B, (void)T, (void)precision;
  if (out) *out = NULL;
  return NO_CUDA("cuda gpt");
}
void tdm_cuda_gpt_destroy(tdm_cuda_gpt *g) { (void)g; }
tdm_status tdm_cuda_gpt_set_profile(tdm_cuda_gpt *g, int on) {
  (void)g, (void)on;
  return NO_CUDA("cuda gpt");
}
int tdm_cuda_gpt_profile(const tdm_cuda_gpt *g, const char **names, double *ms, int cap) {
  (void)g, (void)names, (void)ms, (void)cap;
  return 0;
}
tdm_status tdm_cuda_gpt_forward(tdm_cuda_gpt *g, const int32_t *idx, const int32_t *targets, float *loss) {
  (void)g, (void)idx, (void)targets, (void)loss;
  return NO_CUDA("cuda gpt");
}
tdm_status tdm_cuda_gpt_logits(const tdm_cuda_gpt *g, float *host) {
  (void)g, (void)host;
  return NO_CUDA("cuda gpt");
}
tdm_status tdm_cuda_gpt_zero_grad(tdm_cuda_gpt *g) {
  (void)g;
  return NO_CUDA("cuda gpt");
}
tdm_status tdm_cuda_gpt_backward(tdm_cuda_gpt *g) {
  (void)g;
  return NO_CUDA("cuda gpt");
}
tdm_status tdm_cuda_gpt_update(tdm_cuda_gpt *g, const tdm_optim_config *oc, float lr, float clip, float *norm_out) {
  (void)g, (void)oc, (void)lr, (void)clip, (void)norm_out;
  return NO_CUDA("cuda gpt");
}
tdm_status tdm_cuda_gpt_download(const tdm_cuda_gpt *g, tdm_params *params, int grads) {
  (void)g, (void)params, (void)grads;
  return NO_CUDA("cuda gpt");
}
tdm_cuda_gpt_plan tdm_cuda_gpt_get_plan(const tdm_cuda_gpt *g) {
  (void)g;
  tdm_cuda_gpt_plan p = {0};
  return p;
}
#else
typedef int tdm__cuda_absent_unused; /* ISO C wants a translation unit to declare something */
#endif
