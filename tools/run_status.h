/* tandem run --status-every: the launcher's periodic one-line-per-rank view (run_status.c). */
#ifndef TANDEM_TOOLS_RUN_STATUS_H
#define TANDEM_TOOLS_RUN_STATUS_H

#include <stdint.h>

typedef struct {
  double every, start, next;
  char dir[4096]; /* where the ranks write rank-R.json; "" when off */
} run_status;

/* every > 0: makes the directory and sets TANDEM_STATUS_DIR / TANDEM_STATUS_EVERY for the ranks
 * about to start. Returns 0, or 2 (printed) when the directory cannot be made. */
int run_status_open(run_status *s, double every);
/* When due (or force), prints the status of ranks first_rank .. first_rank + n - 1. */
void run_status_tick(run_status *s, int64_t first_rank, int n, int force);
/* Removes the directory and what the ranks left in it. */
void run_status_close(run_status *s);

#endif
