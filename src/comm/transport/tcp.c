/* placeholder replaced in the next step */
#include "comm/comm_impl.h"
tdm_status tdm__tcp_transport_create(tdm__transport **out, struct tdm_comm *c, const tdm_comm_config *cfg) {
  (void)out; (void)c; (void)cfg;
  return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "tcp transport: not built yet");
}
