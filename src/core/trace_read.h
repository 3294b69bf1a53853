/* Reading a rank's trace file (src/core/trace_read.c), closed or not. Thread-safe (no state). */
#ifndef TDM_CORE_TRACE_READ_H
#define TDM_CORE_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

#include "core/json.h"
#include "tandem/status.h"

/* Parses text as a trace. A tandem recorder's file its run never closed (it starts with the
 * recorder's header and stops after, or inside, an event) is read up to its last whole event:
 * *unclosed = 1, *doc holds only traceEvents. Else *unclosed = 0. *doc: the caller's, freed with
 * tdm__json_free; NULL on error (TDM_ERR_FORMAT with the parser's message). */
tdm_status tdm__trace_parse(const char *text, size_t n, tdm_json **doc, int *unclosed);
/* The same on the file at path, of at most max bytes. */
tdm_status tdm__trace_read(const char *path, int64_t max, tdm_json **doc, int *unclosed);

#endif
