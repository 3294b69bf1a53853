/* A training run as its files tell it, for tandem report and tandem scale: the metrics JSON lines
 * one run wrote (its run headers, step records, evaluations, measured memory, parameter servers'
 * reports) and, when present, its Chrome trace files.
 *
 *   tdm__run *r;
 *   if (tdm__run_load("runs/a", &r) != TDM_OK) fprintf(stderr, "%s\n", tdm_last_error());
 *   ... r->steps[i].loss ...;  tdm__report_html(f, r);  tdm__run_free(r);
 *
 * Loading refuses what cannot be one run: a missing or empty directory, no metrics, metrics of
 * different runs in one directory or one file (a later run header that is neither a resume nor a
 * restart of the same job). A line that is not a whole JSON record (a run killed mid-write) is
 * skipped and noted. Not thread-safe per run; nothing global. */
#ifndef TANDEM_REPORT_RUN_H
#define TANDEM_REPORT_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "core/json.h"
#include "tandem/core.h"
#include "tandem/status.h"

enum { TDM__RT_STEP, TDM__RT_FWD, TDM__RT_BWD, TDM__RT_WAIT, TDM__RT_OPT, TDM__RT_COUNT }; /* per-rank times */

typedef struct {
  int64_t step, epoch;
  double loss, grad_norm, samples_per_sec, tokens_per_sec, lr, train_accuracy; /* NAN when absent */
  double step_ms, fwd_ms, bwd_ms, wait_ms, opt_ms;
  double time_s;        /* training time at the end of this step: the step times summed in order */
  int world;
  int64_t global_batch, grad_bytes;
  double compress_ratio; /* mean over buckets; NAN without compression */
  int slowest;          /* the slowest rank, -1 when the record has no per-rank times */
  int n_ranks;          /* per-rank times: rank_ms[r * TDM__RT_COUNT + k] */
  double *rank_ms;
  int attempt;          /* which run header's records it is (0: the first) */
} tdm__step_rec;

typedef struct {
  int64_t step;
  int validation; /* 1: val_loss (language models, every --val-every), 0: test_loss (end of epoch) */
  double loss, accuracy, time_s;
} tdm__eval_rec;

typedef struct {
  char run_id[40], config_hash[40], job[40];
  int attempt;
  int64_t resumed_from, start_step;
  char started[40];
  char where[300]; /* file:line */
} tdm__run_header;

typedef struct tdm__trace tdm__trace; /* report/trace.h */

typedef struct tdm__run {
  char path[4096];     /* the directory (or file) given */
  char metrics[4096];  /* the metrics file read */
  tdm__run_header *headers;
  int n_headers;
  tdm_json *header_json; /* the first header's "tandem_run" object (configuration, plan, environment), or NULL */
  tdm_json *header_doc;  /* owns it */
  tdm__step_rec *steps;  /* one per step, in step order (a restart's record replaces the earlier one) */
  int n_steps;
  tdm__eval_rec *evals;
  int n_evals;
  int64_t mem_peak[TDM_MEM_COUNT + 1]; /* measured at the end (+1: the total); -1 when not recorded */
  tdm_json **ps;        /* parameter servers' reports (METRICS.psK) */
  int n_ps;
  int skipped;          /* lines that were not whole records */
  int replaced;         /* step records replaced by a restart's */
  char notes[16][320];  /* what the report should say about its input (the first 16) */
  int n_notes;
  tdm__trace *trace;    /* NULL without trace files */
} tdm__run;

/* Reads a run directory (its metrics: *.jsonl files, and METRICS.psK next to them; its traces:
 * *.json here and one directory level down) or a metrics file. Each skipped line is also told on
 * err (NULL: not told). Free with tdm__run_free. */
tdm_status tdm__run_load(const char *path, FILE *err, tdm__run **out);
void tdm__run_free(tdm__run *r);

/* Reads one metrics stream (name: for messages) into r; what tdm__run_load does per file. */
tdm_status tdm__run_parse(tdm__run *r, FILE *in, const char *name, FILE *err);
tdm__run *tdm__run_new(void);

/* A string or number member of the header's "config" (or "env", "identity") object; NULL if absent. */
const tdm_json *tdm__run_header_get(const tdm__run *r, const char *object, const char *key);

/* Mean of a step field over the steps after the first (its warm-up), NAN without any. */
double tdm__run_mean(const tdm__run *r, size_t field_offset);

/* The self-contained HTML report (inline SVG, no script): curves, throughput, step time per rank,
 * hidden communication, memory against the plan, configuration and environment, stragglers. */
tdm_status tdm__report_html(FILE *f, const tdm__run *r);

/* The page's head and style, and its end: shared with tandem scale's report. */
void tdm__html_begin(FILE *f, const char *title);
void tdm__html_end(FILE *f);

#endif
