/* Reading a rank's trace file, including one its run never closed (killed, crashed, hung and
 * stopped by the launcher): the trace a user needs most is the one of a run that did not end.
 * The recorder writes `{"traceEvents":[` and then each event whole on a line of its own
 * (strings escape every control character), flushing at checkpoints and when a ring fills; a
 * file that stops anywhere after that header keeps every event up to the last whole line. */
#include <stdio.h>
#include <string.h>

#include "core/file.h"
#include "core/internal.h"
#include "core/trace_read.h"

static const char header[] = "{\"traceEvents\":[";

/* text[0, cut) without trailing white space and one trailing comma, then "\n]}": parsed. */
static tdm_status close_at(const char *text, size_t cut, tdm_json **doc) {
  while (cut > 0 && (text[cut - 1] == '\n' || text[cut - 1] == ' ' || text[cut - 1] == '\r' || text[cut - 1] == '\t')) cut--;
  if (cut > 0 && text[cut - 1] == ',') cut--;
  char *t = tdm__malloc(cut + 4);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "trace: out of memory");
  memcpy(t, text, cut);
  memcpy(t + cut, "\n]}", 4);
  tdm_status st = tdm__json_parse(t, cut + 3, doc);
  tdm__free(t);
  return st;
}

tdm_status tdm__trace_parse(const char *text, size_t n, tdm_json **doc, int *unclosed) {
  *doc = NULL, *unclosed = 0;
  tdm_status st = tdm__json_parse(text, n, doc);
  if (st == TDM_OK || st == TDM_ERR_NO_MEMORY) return st;
  char why[320];
  snprintf(why, sizeof why, "%s", tdm_last_error());
  size_t h = sizeof header - 1;
  if (n < h || memcmp(text, header, h) != 0) return tdm__set_error(st, "%s", why); /* not a tandem recorder's file */
  /* the whole text as it stands (it ended after an event), then cut before each of the last few
   * line starts (it ended inside one: a buffer flushed part-way) */
  if ((st = close_at(text, n, doc)) == TDM_OK) return *unclosed = 1, TDM_OK;
  size_t at = n;
  for (int tries = 0; tries < 4 && st != TDM_ERR_NO_MEMORY; tries++) {
    while (at > h && text[at - 1] != '\n') at--;
    at = at > h ? at - 1 : h; /* before the newline that starts the line, or right after the header: no events */
    if ((st = close_at(text, at, doc)) == TDM_OK) return *unclosed = 1, TDM_OK;
    if (at == h) break;
  }
  if (st == TDM_ERR_NO_MEMORY) return st;
  return tdm__set_error(TDM_ERR_FORMAT, "%s", why);
}

tdm_status tdm__trace_read(const char *path, int64_t max, tdm_json **doc, int *unclosed) {
  unsigned char *text = NULL;
  int64_t n = 0;
  *doc = NULL, *unclosed = 0;
  TDM__TRY(tdm__file_read(path, max, "trace file", &text, &n));
  tdm_status st = tdm__trace_parse((const char *)text, (size_t)n, doc, unclosed);
  tdm__free(text);
  return st;
}
