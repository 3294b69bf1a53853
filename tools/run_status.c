/* tandem run --status-every SEC: every SEC seconds one line per local rank (step, loss,
 * throughput, step time and its parts, communication share) and the slowest rank. The ranks
 * publish their status as small files in a directory the launcher makes (TANDEM_STATUS_DIR, see
 * src/train/observe.h): no connection, no collective, nothing a rank waits for. */
#define _GNU_SOURCE
#include "run_status.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json.h"
#include "tandem/core.h"

int run_status_open(run_status *s, double every) {
  memset(s, 0, sizeof *s);
  s->every = every;
  if (every <= 0) return 0;
  const char *tmp = getenv("TMPDIR");
  snprintf(s->dir, sizeof s->dir, "%s/tandem-status-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(s->dir)) {
    fprintf(stderr, "tandem run: --status-every: cannot create a directory in %s for the ranks' status: %m\n", tmp && *tmp ? tmp : "/tmp");
    s->dir[0] = 0;
    return 2;
  }
  char ev[32];
  snprintf(ev, sizeof ev, "%g", every);
  setenv("TANDEM_STATUS_DIR", s->dir, 1); /* inherited by every rank */
  setenv("TANDEM_STATUS_EVERY", ev, 1);
  s->start = tdm_time_now();
  s->next = s->start + every;
  return 0;
}

static double num(const tdm_json *o, const char *k) {
  const tdm_json *v = tdm__json_get(o, k);
  return v && v->type == TDM_JSON_NUM ? v->num : NAN;
}

void run_status_tick(run_status *s, int64_t first_rank, int n, int force) {
  if (s->every <= 0 || !s->dir[0]) return;
  double now = tdm_time_now();
  if (!force && now < s->next) return;
  s->next = now + s->every;
  printf("[status %.0fs]", now - s->start);
  int slow = -1, have = 0;
  double slow_ms = 0, sum_ms = 0;
  char lines[64][256];
  int nl = 0;
  for (int i = 0; i < n; i++) {
    int64_t rank = first_rank + i;
    char path[4200];
    snprintf(path, sizeof path, "%s/rank-%lld.json", s->dir, (long long)rank);
    FILE *f = fopen(path, "r");
    char buf[1024];
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[len] = 0;
    tdm_json *j = NULL;
    char line[256];
    if (!len || tdm__json_parse(buf, len, &j) != TDM_OK) {
      snprintf(line, sizeof line, "  rank %lld: no status yet", (long long)rank);
    } else {
      double step_ms = num(j, "step_ms"), age = now - num(j, "time");
      snprintf(line, sizeof line, "  rank %lld: step %.0f/%.0f  loss %.4f  %.0f samples/s  step %.1f ms (forward %.1f, backward %.1f, "
                                  "comm wait %.1f, optimizer %.1f)  comm %.0f%%%s",
               (long long)rank, num(j, "step"), num(j, "total"), num(j, "loss"), num(j, "samples_per_sec"), step_ms,
               num(j, "forward_ms"), num(j, "backward_ms"), num(j, "comm_wait_ms"), num(j, "optimizer_ms"), 100 * num(j, "comm_share"),
               num(j, "final") > 0 ? "  (done)" : age > 2 * s->every + 1 ? "  (no news for a while: stalled?)" : "");
      if (isfinite(step_ms)) {
        have++, sum_ms += step_ms;
        if (slow < 0 || step_ms > slow_ms) slow = (int)rank, slow_ms = step_ms;
      }
    }
    tdm__json_free(j);
    if (nl < 64) memcpy(lines[nl++], line, sizeof line);
  }
  if (have > 1)
    printf(" slowest: rank %d, last step %.1f ms (%.0f%% above the mean of %.1f ms)\n", slow, slow_ms,
           100 * (slow_ms / (sum_ms / have) - 1), sum_ms / have);
  else
    printf("\n");
  for (int i = 0; i < nl; i++) printf("%s\n", lines[i]);
  if (n > nl) printf("  (%d more ranks)\n", n - nl);
  fflush(stdout);
}

void run_status_close(run_status *s) {
  if (!s->dir[0]) return;
  DIR *d = opendir(s->dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", s->dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(s->dir);
  s->dir[0] = 0;
}
