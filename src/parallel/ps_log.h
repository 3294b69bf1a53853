/* The parameter server's update log, written by each server (ps_server.c; the format and the
 * replay: ps_log.c). Not thread-safe: one server thread writes its log. */
#ifndef TANDEM_PS_LOG_H
#define TANDEM_PS_LOG_H

#include "tandem/engine.h"

typedef struct tdm__ps_log tdm__ps_log;
tdm_status tdm__ps_log_open(tdm__ps_log **out, const char *dir, int server, int servers, int mode, int workers, int64_t lo,
                            int64_t hi, int64_t n_params);
/* One update as the optimizer got it: the gradient (hi - lo floats) and the learning rate. */
tdm_status tdm__ps_log_append(tdm__ps_log *l, int worker, int64_t clock, int64_t version, float lr, const float *grad);
/* Flushes and frees; *updates (if given) gets the number of records. */
tdm_status tdm__ps_log_close(tdm__ps_log *l, int64_t *updates);

#endif
