#include "tandem/status.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

static const struct {
  tdm_status st;
  const char *text;
} status_names[] = {
#define TDM__STATUS_NAME(name, value, text) {name, text},
    TDM_STATUS_LIST(TDM__STATUS_NAME)
#undef TDM__STATUS_NAME
};
static_assert(sizeof(status_names) / sizeof(status_names[0]) == TDM_STATUS_COUNT,
              "TDM_STATUS_COUNT must match TDM_STATUS_LIST");

static _Thread_local char err_buf[1024];
/* The relayed rank, and the start of the message that relayed it: an error whose text still holds
 * that start wraps the relayed one (callers add context: "step 7: %s"), any other is new. */
static _Thread_local int err_origin = -1;
static _Thread_local char origin_key[48];

const char *tdm_status_str(tdm_status st) {
  for (int i = 0; i < TDM_STATUS_COUNT; i++)
    if (status_names[i].st == st) return status_names[i].text;
  return "unknown status";
}

const char *tdm_last_error(void) { return err_buf; }

void tdm_clear_error(void) {
  err_buf[0] = 0;
  err_origin = -1;
}

int tdm_last_error_origin(void) { return err_origin; }

tdm_status tdm__error_from(int rank, tdm_status st) {
  if (rank < 0 || !err_buf[0]) return st;
  /* a wrap of the relayed error keeps the key of the error itself: the inner text may come back
   * alone later (a caller that restores its own message after a communicator's wrapped it) */
  if (err_origin == rank && strstr(err_buf, origin_key)) return st;
  err_origin = rank;
  size_t n = strnlen(err_buf, sizeof origin_key - 1);
  memcpy(origin_key, err_buf, n);
  origin_key[n] = 0;
  return st;
}

tdm_status tdm__set_error(tdm_status st, const char *fmt, ...) {
  /* format aside first: callers may pass tdm_last_error() itself as an argument */
  char tmp[sizeof err_buf];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (err_origin >= 0 && !strstr(tmp, origin_key)) err_origin = -1;
  memcpy(err_buf, tmp, sizeof err_buf);
  return st;
}

void tdm__assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "tandem: internal invariant failed: %s at %s:%d\n", expr, file, line);
  abort();
}
