/* Chrome trace files read generically for the report: the complete events ("ph":"X", with name,
 * cat, ts and dur in microseconds, pid, tid) of one or more files ({"traceEvents":[...]} or a bare
 * array), summed per process (= rank) into forward / backward / communication / optimizer / other
 * time, and the communication that ran while backward did (hidden). Names and categories are
 * matched by words (forward, backward, allreduce/comm/bucket/gather/scatter/send/recv, optimizer/
 * update/step), so the trace writer's exact vocabulary is not hard-wired. */
#ifndef TANDEM_REPORT_TRACE_H
#define TANDEM_REPORT_TRACE_H

#include <stdint.h>

#include "tandem/status.h"

enum { TDM__TK_FWD, TDM__TK_BWD, TDM__TK_COMM, TDM__TK_OPT, TDM__TK_OTHER, TDM__TK_COUNT };

typedef struct {
  int64_t pid;
  double us[TDM__TK_COUNT]; /* summed durations per kind */
  double comm_hidden_us;    /* communication time inside backward spans of the same process */
  int64_t events;
  char name[64]; /* the process_name metadata event's ("rank 0"), or "" */
  int file;      /* which file (in reading order) gave its events: a process is read from one file only */
} tdm__trace_proc;

struct tdm__trace {
  tdm__trace_proc *procs; /* sorted by pid */
  int n_procs;
  int files, events, ignored; /* files read, complete events used, other events */
  char notes[4][320];
  int n_notes;
  int unclosed, unclosed_noted; /* trace files their runs never closed; those named in notes */
};
typedef struct tdm__trace tdm__trace;

/* Adds the events of one trace file. A process (pid) already read from an earlier file is
 * skipped and noted: a merged trace beside the per-rank files must not count twice. A file that is not a trace (not JSON, no events) is
 * TDM_ERR_FORMAT naming it; the caller may note it and go on. */
tdm_status tdm__trace_add_file(tdm__trace *t, const char *path);
/* Kind of an event from its name and category. */
int tdm__trace_kind(const char *name, const char *cat);
void tdm__trace_free(tdm__trace *t);

#endif
