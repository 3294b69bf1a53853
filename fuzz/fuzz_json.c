/* The JSON reader (src/core/json.c). After a success the tree must hold what RFC 8259 allows and
 * what the reader promises: strings valid UTF-8 without NUL, keys unique in each object, numbers
 * finite, integers exact; after a failure the status is a format error naming a byte offset.
 * The same bytes as a trace (src/core/trace_read.c): complete JSON reads as it is; otherwise only
 * text that starts with the recorder's header may be read, as an unclosed trace of events. */
#include "fuzz.h"

#include <math.h>

#include "core/json.h"
#include "core/trace_read.h"

static void walk(const tdm_json *j, int depth) {
  FUZZ_CHECK(depth <= 64);
  switch (j->type) {
  case TDM_JSON_STR: FUZZ_CHECK(j->str && tdm__utf8_valid(j->str)); break;
  case TDM_JSON_NUM:
    FUZZ_CHECK(isfinite(j->num));
    FUZZ_CHECK(!j->is_int || (double)j->inum == j->num);
    break;
  case TDM_JSON_ARR:
  case TDM_JSON_OBJ:
    FUZZ_CHECK(j->n >= 0 && (j->n == 0 || j->items));
    for (int k = 0; k < j->n; k++) {
      walk(&j->items[k], depth + 1);
      if (j->type != TDM_JSON_OBJ) continue;
      FUZZ_CHECK(tdm__utf8_valid(j->keys[k]));
      FUZZ_CHECK(tdm__json_get(j, j->keys[k]) == &j->items[k]); /* unique: the lookup finds this one */
    }
    break;
  default: break;
  }
}

static void as_trace(const uint8_t *data, size_t size, int json_ok) {
  tdm_json *t = NULL;
  int unclosed = -1;
  tdm_status st = tdm__trace_parse((const char *)data, size, &t, &unclosed);
  if (st != TDM_OK) {
    FUZZ_CHECK(t == NULL && !json_ok && (st == TDM_ERR_FORMAT || st == TDM_ERR_NO_MEMORY));
    return;
  }
  FUZZ_CHECK(t != NULL && unclosed == !json_ok);
  if (unclosed) {
    static const char header[] = "{\"traceEvents\":[";
    FUZZ_CHECK(size >= sizeof header - 1 && !memcmp(data, header, sizeof header - 1));
    const tdm_json *ev = tdm__json_get(t, "traceEvents");
    FUZZ_CHECK(ev && ev->type == TDM_JSON_ARR);
  }
  walk(t, 1);
  tdm__json_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tdm_json *j = NULL;
  tdm_status st = tdm__json_parse((const char *)data, size, &j);
  if (st != TDM_OK) {
    FUZZ_CHECK(j == NULL && (st == TDM_ERR_FORMAT || st == TDM_ERR_NO_MEMORY));
    FUZZ_CHECK(st != TDM_ERR_FORMAT || !strncmp(tdm_last_error(), "JSON: ", 6));
    as_trace(data, size, 0);
    return 0;
  }
  walk(j, 1);
  tdm__json_free(j);
  as_trace(data, size, 1);
  return 0;
}
