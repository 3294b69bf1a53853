/* The report's readers (src/report/): the input as a metrics stream (tdm__run_parse) and as a
 * Chrome trace file (tdm__trace_add_file). A metrics stream read without error holds one record
 * per step in increasing step order, per-rank times that exist when counted, a slowest rank among
 * them, training times that never decrease, and renders as a whole page; an error is a mismatch
 * of runs (naming "different runs"). A trace's per-kind times are not negative and the hidden
 * communication lies within both the communication and the backward time. */
#include "fuzz.h"

#include <math.h>

#include "report/run.h"
#include "report/trace.h"

static void metrics(const uint8_t *data, size_t size) {
  tdm__run *r = tdm__run_new();
  FUZZ_CHECK(r);
  FILE *f = size ? fmemopen((void *)data, size, "r") : fopen("/dev/null", "r");
  FUZZ_CHECK(f);
  tdm_status st = tdm__run_parse(r, f, "fuzz.jsonl", NULL);
  fclose(f);
  if (st != TDM_OK) {
    FUZZ_CHECK(st == TDM_ERR_NO_MEMORY || (st == TDM_ERR_MISMATCH && strstr(tdm_last_error(), "different runs")));
    tdm__run_free(r);
    return;
  }
  FUZZ_CHECK(r->skipped >= 0 && r->n_notes <= 16);
  for (int i = 0; i < r->n_steps; i++) {
    const tdm__step_rec *s = &r->steps[i];
    FUZZ_CHECK(i == 0 || s->step > r->steps[i - 1].step);
    FUZZ_CHECK(i == 0 || s->time_s >= r->steps[i - 1].time_s);
    FUZZ_CHECK(s->n_ranks >= 0 && (s->n_ranks == 0 || s->rank_ms));
    FUZZ_CHECK(s->n_ranks == 0 ? s->slowest == -1 : (s->slowest >= 0 && s->slowest < s->n_ranks));
  }
  for (int i = 1; i < r->n_evals; i++) FUZZ_CHECK(r->evals[i].step >= r->evals[i - 1].step);
  if (r->n_steps > 0) {
    char *page = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&page, &len);
    FUZZ_CHECK(m);
    FUZZ_CHECK(tdm__report_html(m, r) == TDM_OK);
    fclose(m);
    FUZZ_CHECK(len > 20 && !strcmp(page + len - 8, "</html>\n") && !strstr(page, "<script"));
    free(page);
  }
  tdm__run_free(r);
}

static void trace(const uint8_t *data, size_t size) {
  tdm__trace t;
  memset(&t, 0, sizeof t);
  if (tdm__trace_add_file(&t, fuzz_memfile(data, size)) == TDM_OK) {
    for (int p = 0; p < t.n_procs; p++) {
      const tdm__trace_proc *q = &t.procs[p];
      for (int k = 0; k < TDM__TK_COUNT; k++) FUZZ_CHECK(q->us[k] >= 0);
      double tol = 1e-6 * (1 + q->us[TDM__TK_COMM] + q->us[TDM__TK_BWD]);
      FUZZ_CHECK(q->comm_hidden_us >= -tol && q->comm_hidden_us <= q->us[TDM__TK_COMM] + tol &&
                 q->comm_hidden_us <= q->us[TDM__TK_BWD] + tol);
      FUZZ_CHECK(p == 0 || t.procs[p - 1].pid < q->pid);
    }
  }
  tdm__trace_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  metrics(data, size);
  trace(data, size);
  return 0;
}
