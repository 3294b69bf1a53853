/* tandem train --emulate-ranks N: N ranks as threads of this process over the thread transport
 * (TANDEM_NET_EMULATE gives the links a latency and bandwidth), so data parallelism, ZeRO and the
 * collectives can be studied without a launcher. Each thread runs the whole training call as its
 * rank; rank 0 prints and writes the outputs, as under tandem run. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "tandem/tandem.h"

typedef struct {
  tdm_train_config c;
  double slow;      /* > 1: this rank is a straggler, its steps last this many times longer */
  double last;      /* when its previous step ended */
  int (*hook)(void *, int64_t);
  void *hook_ctx;
  tdm_comm_config cc;
  tdm_train_result res;
  tdm_status st;
  char error[1024];
  int origin; /* tdm_last_error_origin of its failure */
} emu_rank;

/* After each step the straggler sleeps (slow - 1) times the step it just made: its compute, as
 * seen by the others, is that much slower. */
static int straggle(void *ctx, int64_t steps_done) {
  emu_rank *e = ctx;
  int stop = e->hook ? e->hook(e->hook_ctx, steps_done) : 0;
  double now = tdm_time_now(), extra = e->last > 0 ? (e->slow - 1) * (now - e->last) : 0; /* not the start-up */
  if (extra > 0) nanosleep(&(struct timespec){(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)}, NULL);
  e->last = tdm_time_now();
  return stop;
}

static void *emu_main(void *arg) {
  emu_rank *e = arg;
  e->c.comm = &e->cc;
  if (e->slow > 1) {
    e->hook = e->c.on_step, e->hook_ctx = e->c.on_step_ctx;
    e->c.on_step = straggle, e->c.on_step_ctx = e;
  }
  if (e->cc.rank != 0) e->c.progress = NULL;
  e->st = tdm_train_run(&e->c, &e->res);
  if (e->st != TDM_OK) snprintf(e->error, sizeof e->error, "%s", tdm_last_error()); /* the detail is per thread */
  e->origin = e->st != TDM_OK ? tdm_last_error_origin() : -1;
  return NULL;
}

int emulate_ranks(const tdm_train_config *c, int n, const char *slow, tdm_train_result *res) {
  int slow_rank = -1;
  double factor = 1;
  int used = 0;
  if (slow && (sscanf(slow, "%d:%lf%n", &slow_rank, &factor, &used) != 2 || slow[used] || slow_rank < 0 || slow_rank >= n ||
               !(factor >= 1 && factor <= 1000))) {
    fprintf(stderr, "tandem train: --emulate-slow '%s'; expected RANK:FACTOR with a rank 0..%d and a factor 1..1000 (2: that rank's "
                    "steps take twice as long)\n", slow, n - 1);
    return 2;
  }
  if (c->threads > 1) {
    fprintf(stderr, "tandem train: --emulate-ranks runs the ranks as threads sharing one compute pool: give --threads 1 "
                    "(given %d)\n", c->threads);
    return 2;
  }
  if (tdm_set_num_threads(1) != TDM_OK) { /* each rank computes on its own thread */
    fprintf(stderr, "tandem train: %s\n", tdm_last_error());
    return 1;
  }
  void *group = NULL;
  emu_rank *r = calloc((size_t)n, sizeof *r);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  if (!r || !th || tdm_comm_thread_group_create(&group, n) != TDM_OK) {
    fprintf(stderr, "tandem train: --emulate-ranks %d: %s\n", n, r && th ? tdm_last_error() : "out of memory");
    free(r);
    free(th);
    return 1;
  }
  int started = 0;
  for (int k = 0; k < n; k++) {
    r[k].c = *c;
    r[k].c.threads = 1;
    r[k].slow = k == slow_rank ? factor : 1;
    r[k].cc = (tdm_comm_config){.rank = k, .size = n, .transport = TDM_TRANSPORT_THREAD, .thread_group = group};
    if (pthread_create(&th[k], NULL, emu_main, &r[k]) != 0) {
      fprintf(stderr, "tandem train: --emulate-ranks %d: cannot start the thread of rank %d\n", n, k);
      break; /* the ranks started fail at their first collective's timeout */
    }
    started++;
  }
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  tdm_comm_thread_group_destroy(group);
  int rc = started == n ? 0 : 1;
  for (int k = 0; k < started; k++)
    if (r[k].st != TDM_OK) {
      char who[48] = ""; /* which rank's failure the others passed on */
      if (r[k].origin >= 0) snprintf(who, sizeof who, " (relayed from rank %d)", r[k].origin);
      fprintf(stderr, "tandem train: rank %d (emulated)%s: %s: %s\n", k, who, tdm_status_str(r[k].st), r[k].error);
      rc = 1;
    }
  if (started) *res = r[0].res;
  free(r);
  free(th);
  return rc;
}
