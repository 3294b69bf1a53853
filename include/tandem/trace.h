/* tandem — timelines: spans recorded per thread, written per rank as Chrome trace event JSON
 * (open in https://ui.perfetto.dev or chrome://tracing), merged across ranks with their clocks
 * lined up.
 *
 *   tdm_trace *t;
 *   tdm_trace_open(&t, "traces", rank, world);   // traces/trace.rank<rank>.json; tracing is on
 *   double t0 = tdm_trace_begin();               // 0 when tracing is off
 *   ... work ...
 *   tdm_trace_span("compute", "forward", t0, tdm_trace_now(), NULL);
 *   tdm_trace_close(t);                           // writes what is left and the metadata
 *   tdm_trace_merge("traces", "merged.json", NULL, NULL);
 *
 * Off (no recorder open), every call below costs one load and one branch, and allocates and
 * writes nothing. On, each thread records into a ring of its own (lock-free: the thread writes,
 * the flush reads), so memory is bounded; a full ring drops new spans and counts them (the count
 * is in the file). Events reach the file at tdm_trace_flush (the trainer flushes when a ring is
 * half full, at checkpoints and at the end).
 *
 * Which recorder a thread records into: the one it attached (tdm_trace_attach), else the one
 * opened last in the process. Threads the library starts (the communication thread, the data
 * prefetch thread) attach to the recorder of the thread that started them, so N emulated ranks
 * in one process each get their own rows.
 *
 * Strings given to the recording calls (names, categories, algo) must stay valid until the
 * recorder is flushed: pass string literals or names that live as long as the run. */
#ifndef TANDEM_TRACE_H
#define TANDEM_TRACE_H

#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_trace tdm_trace;

/* Optional arguments of a span; TDM_TRACE_NONE (or NULL for algo) leaves one out. Written as the
 * event's "args". */
#define TDM_TRACE_NONE INT64_MIN
typedef struct tdm_trace_args {
  /* comm: the communicator's id (the same on its ranks); index: a bucket, unit or micro-batch;
   * chunk: a pipeline's model chunk */
  int64_t bytes, seq, step, index, ranks, comm, chunk;
  const char *algo;
} tdm_trace_args;
/* All absent: start from this and fill in what applies. */
#define TDM_TRACE_ARGS_INIT \
  {TDM_TRACE_NONE, TDM_TRACE_NONE, TDM_TRACE_NONE, TDM_TRACE_NONE, TDM_TRACE_NONE, TDM_TRACE_NONE, TDM_TRACE_NONE, NULL}

/* Non-zero while some recorder is open. One relaxed load. */
extern int tdm__trace_flag;
static inline int tdm_trace_on(void) { return __atomic_load_n(&tdm__trace_flag, __ATOMIC_RELAXED); }
/* The trace clock: tdm_time_now (monotonic seconds). */
double tdm_trace_now(void);
/* tdm_trace_now() when tracing is on, else 0 (no clock read). */
static inline double tdm_trace_begin(void) { return tdm_trace_on() ? tdm_trace_now() : 0; }

/* Makes dir (one level) if missing, checks a file can be written there, and opens
 * dir/trace.rank<rank>.json (replacing an older one). Errors name the directory and the reason:
 * the CLI calls this before anything else, so a bad --trace fails at the start. The calling
 * thread is attached to the new recorder. Not thread-safe with other open/close calls. */
tdm_status tdm_trace_open(tdm_trace **out, const char *dir, int rank, int world);
/* Flushes, writes the metadata (threads, clock offsets, dropped spans) and closes the file; then
 * frees t. Call it when no thread records into t any more (after the communicators are
 * destroyed). NULL: nothing. Returns the first write error. */
tdm_status tdm_trace_close(tdm_trace *t);
/* Writes the spans recorded so far. Thread-safe (with recording and with other flushes). */
tdm_status tdm_trace_flush(tdm_trace *t);
/* Flushes when some thread's ring is at least half full: cheap enough to call every step. */
tdm_status tdm_trace_flush_if_needed(tdm_trace *t);

/* The calling thread records into t from now on (NULL: into the recorder opened last). */
void tdm_trace_attach(tdm_trace *t);
/* The recorder the calling thread records into (NULL when tracing is off). */
tdm_trace *tdm_trace_current(void);
/* Names the calling thread's row ("training", "communication", "prefetch"); name must be a
 * string literal or live as long as the process. Threads not named are "thread N". */
void tdm_trace_name_thread(const char *name);

/* A span [t0, t1] (seconds of tdm_trace_now) on the calling thread's row: a Chrome "X" event.
 * Spans of one thread must nest (a span that starts inside another ends inside it). */
void tdm_trace_span(const char *cat, const char *name, double t0, double t1, const tdm_trace_args *a);
/* A span that may overlap others (a bucket's all-reduce from its launch to its completion): a
 * Chrome async pair ("b"/"e"), shown on its own track under the process. */
void tdm_trace_async(const char *cat, const char *name, double t0, double t1, const tdm_trace_args *a);

/* The offset of this rank's clock against rank 0's, measured at the start (which = 0) or the end
 * (which = 1) of the run: rank 0's clock reads local + offset_s, within +- uncertainty_s, at
 * local time at_s. tdm_trace_merge applies it, interpolated between the two. */
tdm_status tdm_trace_set_clock(tdm_trace *t, int which, double at_s, double offset_s, double uncertainty_s);

/* Reads every dir/trace.rank<R>.json, lines their clocks up with rank 0's (each rank's offsets,
 * interpolated linearly in time between the start and end measurements), and writes one Chrome
 * trace to out (a process row per rank; otherData.tandem_clock lists the offsets used). A file
 * its run never closed (killed, crashed, stopped by the launcher) is merged up to its last whole
 * event, with the offsets measured before it stopped; otherData.unclosed lists such ranks and
 * where each one's last event ends. Errors: no trace files, a file that is not a tandem trace,
 * ranks missing or of different worlds. *ranks, *unclosed (optional): the number of ranks merged,
 * and of those whose files were not closed. */
tdm_status tdm_trace_merge(const char *dir, const char *out, int *ranks, int *unclosed);

#ifdef __cplusplus
}
#endif
#endif
