/* Device communicators where there is no GPU, or no NCCL in the build (every CPU machine and CI):
 * the errors say which; the real collectives are tested on a GPU by tests/cuda/test_nccl.c. */
#include "tdm_test.h"

static void test_without_gpu(void) {
  tdm_comm_config cfg = {.rank = 0, .size = 1, .transport = TDM_TRANSPORT_TCP, .timeout_s = 10};
  tdm_comm_t host = NULL;
  CHECK_OK(tdm_comm_create(&host, &cfg));
  tdm_dcomm_t d = (tdm_dcomm_t)1;
  CHECK(tdm_dcomm_create(host, NULL, NULL) != TDM_OK);
  const char *why = NULL;
  int gpu = tdm_dcomm_device_available(&why);
  CHECK(why != NULL);
  if (!tdm_dcomm_built()) {
    CHECK(!gpu);
    CHECK(tdm_dcomm_create(host, NULL, &d) == TDM_ERR_NOT_SUPPORTED && d == NULL);
    CHECK_ERR_HAS("built without NCCL");
    CHECK(tdm_dcomm_allreduce(NULL, NULL, NULL, 1, TDM_F32, TDM_SUM, NULL) == TDM_ERR_NOT_SUPPORTED);
    CHECK_ERR_HAS("built without NCCL");
  } else if (!gpu) {
    CHECK(tdm_dcomm_create(host, NULL, &d) == TDM_ERR_NOT_SUPPORTED && d == NULL);
    CHECK_ERR_HAS("device communicator: rank 0: no CUDA device");
    CHECK(tdm_dcomm_allreduce(NULL, NULL, NULL, 1, TDM_F32, TDM_SUM, NULL) == TDM_ERR_INVALID_ARG);
    CHECK_ERR_HAS("communicator is NULL");
  } else {
    printf("     a GPU is here: test_nccl tests the device communicator on it\n");
  }
  CHECK(tdm_dcomm_create(NULL, NULL, &d) != TDM_OK && d == NULL);
  CHECK(!strcmp(tdm_dcomm_mode_name(TDM_DCOMM_STAGE), "stage") && !strcmp(tdm_dcomm_mode_name(TDM_DCOMM_NCCL), "nccl"));
  tdm_comm_destroy(host);
}

int main(void) {
  static const tdm_test_case cases[] = {{"without_gpu", test_without_gpu}};
  return tdm_test_main(cases, 1);
}
