/* A small JSON reader for file headers we parse (safetensors) and tests. Not for hot paths.
 * Depth and size are bounded so hostile input cannot exhaust the stack. */
#ifndef TANDEM_JSON_H
#define TANDEM_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

typedef enum { TDM_JSON_NULL, TDM_JSON_BOOL, TDM_JSON_NUM, TDM_JSON_STR, TDM_JSON_ARR, TDM_JSON_OBJ } tdm_json_type;

typedef struct tdm_json {
  tdm_json_type type;
  double num;
  int64_t inum;  /* exact when the number is an integer */
  int is_int;
  char *str;     /* TDM_JSON_STR */
  int n;         /* items in an array or object */
  struct tdm_json *items;
  char **keys;   /* objects */
} tdm_json;

/* Parses text[0..n). On error returns TDM_ERR_FORMAT with the byte offset in the error detail. */
tdm_status tdm__json_parse(const char *text, size_t n, tdm_json **out);
void tdm__json_free(tdm_json *j);
const tdm_json *tdm__json_get(const tdm_json *obj, const char *key);

#endif
