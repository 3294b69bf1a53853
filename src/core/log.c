#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/core.h"

static int log_level = -1; /* -1: not yet read from TANDEM_LOG */

static tdm_log_level level_from_env(void) {
  const char *e = getenv("TANDEM_LOG");
  if (!e) return TDM_LOG_WARN;
  if (!strcmp(e, "error")) return TDM_LOG_ERROR;
  if (!strcmp(e, "info")) return TDM_LOG_INFO;
  if (!strcmp(e, "debug")) return TDM_LOG_DEBUG;
  if (strcmp(e, "warn") && strcmp(e, "")) /* said once, not silently taken as the default */
    fprintf(stderr, "tandem warn: TANDEM_LOG='%s' is not error, warn, info or debug: logging warnings and errors\n", e);
  return TDM_LOG_WARN;
}

void tdm_log_set_level(tdm_log_level level) { log_level = (int)level; }

tdm_log_level tdm_log_get_level(void) {
  if (log_level < 0) log_level = (int)level_from_env();
  return (tdm_log_level)log_level;
}

void tdm_log(tdm_log_level level, const char *fmt, ...) {
  if (level > tdm_log_get_level()) return;
  static const char *names[] = {"error", "warn", "info", "debug"};
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line so lines of concurrent threads do not interleave mid-line. */
  fprintf(stderr, "tandem %s: %s\n", names[level], line);
}
