/* Clock offsets against rank 0 by ping-pong (tdm_comm_clock_offset): what lines up the ranks'
 * traces. The sample with the smallest round trip bounds the error best: rank 0's reading lies
 * somewhere inside that round trip, so the offset is known within half of it. */
#include "comm/comm_impl.h"

enum { CLOCK_TAG = 0x7c10c };

tdm_status tdm_comm_clock_offset(tdm_comm_t c, int rounds, double *offset, double *uncertainty) {
  if (!c || !offset || !uncertainty) return tdm__set_error(TDM_ERR_INVALID_ARG, "clock offset: NULL argument");
  if (rounds < 1 || rounds > 1000)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "clock offset: %d rounds; expected 1..1000", rounds);
  *offset = 0, *uncertainty = 0;
  int P = tdm_comm_size(c), me = tdm_comm_rank(c);
  if (P == 1) return TDM_OK;
  if (me == 0) { /* each rank in turn: answer its pings with this clock's reading */
    for (int r = 1; r < P; r++)
      for (int k = 0; k < rounds; k++) {
        double ping;
        TDM__TRY(tdm_comm_recv(c, r, CLOCK_TAG, &ping, sizeof ping));
        double now = tdm_time_now();
        TDM__TRY(tdm_comm_send(c, r, CLOCK_TAG, &now, sizeof now));
      }
    return TDM_OK;
  }
  double best_rtt = -1;
  for (int k = 0; k < rounds; k++) {
    double t_send = tdm_time_now(), remote;
    TDM__TRY(tdm_comm_send(c, 0, CLOCK_TAG, &t_send, sizeof t_send));
    TDM__TRY(tdm_comm_recv(c, 0, CLOCK_TAG, &remote, sizeof remote));
    double t_recv = tdm_time_now(), rtt = t_recv - t_send;
    if (best_rtt < 0 || rtt < best_rtt) {
      best_rtt = rtt;
      *offset = remote - (t_send + rtt / 2);
      *uncertainty = rtt / 2;
    }
  }
  return TDM_OK;
}
