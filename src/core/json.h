/* A small, strict JSON reader (RFC 8259) for the file headers we parse (safetensors) and tests.
 * Not for hot paths. Depth is bounded so hostile input cannot exhaust the stack; strings are
 * valid UTF-8 without NUL; duplicate keys in an object, trailing characters, and numbers that are
 * not finite doubles are errors. */
#ifndef TANDEM_JSON_H
#define TANDEM_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

typedef enum { TDM_JSON_NULL, TDM_JSON_BOOL, TDM_JSON_NUM, TDM_JSON_STR, TDM_JSON_ARR, TDM_JSON_OBJ } tdm_json_type;

typedef struct tdm_json {
  tdm_json_type type;
  double num;
  int64_t inum;  /* the value, when is_int */
  int is_int;    /* written without fraction or exponent, and fits in int64 */
  char *str;     /* TDM_JSON_STR */
  int n;         /* items in an array or object */
  struct tdm_json *items;
  char **keys;   /* objects */
} tdm_json;

/* Parses text[0..n) (one value, whitespace around it). On error returns TDM_ERR_FORMAT with the
 * byte offset in the error detail (TDM_ERR_NO_MEMORY when out of memory). */
tdm_status tdm__json_parse(const char *text, size_t n, tdm_json **out);
void tdm__json_free(tdm_json *j);
/* Whether the C string s is valid UTF-8 (what a JSON string may hold). */
int tdm__utf8_valid(const char *s);
const tdm_json *tdm__json_get(const tdm_json *obj, const char *key);

#endif
