#include "core/json.h"

#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

typedef struct {
  const char *s;
  size_t n, i;
  int depth;
} parser;

static void ws(parser *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static tdm_status fail(parser *p, const char *what) {
  return tdm__set_error(TDM_ERR_FORMAT, "JSON: %s at byte %zu", what, p->i);
}

static void free_value(tdm_json *j) {
  if (j->type == TDM_JSON_STR) tdm__free(j->str);
  if (j->type == TDM_JSON_ARR || j->type == TDM_JSON_OBJ) {
    for (int k = 0; k < j->n; k++) {
      free_value(&j->items[k]);
      if (j->keys) tdm__free(j->keys[k]);
    }
    tdm__free(j->items);
    tdm__free(j->keys);
  }
}

static tdm_status parse_string(parser *p, char **out) {
  if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "expected a string");
  p->i++;
  char *buf = tdm__malloc(p->n - p->i + 1);
  if (!buf) return tdm__set_error(TDM_ERR_NO_MEMORY, "JSON: out of memory");
  size_t k = 0;
  while (p->i < p->n && p->s[p->i] != '"') {
    char c = p->s[p->i++];
    if (c == '\\') {
      if (p->i >= p->n) break;
      char e = p->s[p->i++];
      switch (e) {
      case 'n': c = '\n'; break;
      case 't': c = '\t'; break;
      case 'r': c = '\r'; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case 'u': { /* keep it simple: ASCII escapes decode, others become '?' */
        if (p->i + 4 > p->n) { tdm__free(buf); return fail(p, "truncated \\u escape"); }
        unsigned v = (unsigned)strtoul((char[5]){p->s[p->i], p->s[p->i + 1], p->s[p->i + 2], p->s[p->i + 3], 0}, NULL, 16);
        p->i += 4;
        c = v < 128 ? (char)v : '?';
        break;
      }
      default: c = e;
      }
    }
    buf[k++] = c;
  }
  if (p->i >= p->n) {
    tdm__free(buf);
    return fail(p, "unterminated string");
  }
  p->i++;
  buf[k] = 0;
  *out = buf;
  return TDM_OK;
}

static tdm_status parse_value(parser *p, tdm_json *v);

static tdm_status parse_list(parser *p, tdm_json *v, int is_obj) {
  char close = is_obj ? '}' : ']';
  p->i++;
  v->type = is_obj ? TDM_JSON_OBJ : TDM_JSON_ARR;
  int cap = 0;
  ws(p);
  if (p->i < p->n && p->s[p->i] == close) {
    p->i++;
    return TDM_OK;
  }
  for (;;) {
    if (v->n == cap) {
      int nc = cap ? cap * 2 : 8;
      tdm_json *ni = tdm__calloc((size_t)nc, sizeof *ni);
      char **nk = is_obj ? tdm__calloc((size_t)nc, sizeof *nk) : NULL;
      if (!ni || (is_obj && !nk)) {
        tdm__free(ni);
        tdm__free(nk);
        return tdm__set_error(TDM_ERR_NO_MEMORY, "JSON: out of memory");
      }
      if (v->items) memcpy(ni, v->items, sizeof *ni * (size_t)v->n);
      if (v->keys) memcpy(nk, v->keys, sizeof *nk * (size_t)v->n);
      tdm__free(v->items);
      tdm__free(v->keys);
      v->items = ni;
      v->keys = nk;
      cap = nc;
    }
    ws(p);
    if (is_obj) {
      TDM__TRY(parse_string(p, &v->keys[v->n]));
      ws(p);
      if (p->i >= p->n || p->s[p->i] != ':') {
        v->n++; /* so the key is freed */
        return fail(p, "expected ':'");
      }
      p->i++;
    }
    tdm_status st = parse_value(p, &v->items[v->n]);
    v->n++;
    if (st != TDM_OK) return st;
    ws(p);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == close) {
      p->i++;
      return TDM_OK;
    }
    return fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static tdm_status parse_value(parser *p, tdm_json *v) {
  memset(v, 0, sizeof *v);
  ws(p);
  if (p->i >= p->n) return fail(p, "unexpected end");
  if (++p->depth > 64) return fail(p, "nesting deeper than 64");
  char c = p->s[p->i];
  tdm_status st = TDM_OK;
  if (c == '{' || c == '[') {
    st = parse_list(p, v, c == '{');
  } else if (c == '"') {
    v->type = TDM_JSON_STR;
    st = parse_string(p, &v->str);
  } else if (p->n - p->i >= 4 && !strncmp(p->s + p->i, "true", 4)) {
    v->type = TDM_JSON_BOOL;
    v->num = 1;
    p->i += 4;
  } else if (p->n - p->i >= 5 && !strncmp(p->s + p->i, "false", 5)) {
    v->type = TDM_JSON_BOOL;
    p->i += 5;
  } else if (p->n - p->i >= 4 && !strncmp(p->s + p->i, "null", 4)) {
    v->type = TDM_JSON_NULL;
    p->i += 4;
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    char tmp[64];
    size_t k = 0;
    int is_int = 1;
    while (p->i < p->n && k < sizeof tmp - 1 && strchr("+-0123456789.eE", p->s[p->i])) {
      if (strchr(".eE", p->s[p->i])) is_int = 0;
      tmp[k++] = p->s[p->i++];
    }
    tmp[k] = 0;
    char *end;
    v->type = TDM_JSON_NUM;
    v->num = strtod(tmp, &end);
    if (*end) return fail(p, "bad number");
    v->is_int = is_int;
    if (is_int) v->inum = strtoll(tmp, NULL, 10);
  } else {
    st = fail(p, "unexpected character");
  }
  p->depth--;
  return st;
}

tdm_status tdm__json_parse(const char *text, size_t n, tdm_json **out) {
  parser p = {text, n, 0, 0};
  tdm_json *v = tdm__calloc(1, sizeof *v);
  if (!v) return tdm__set_error(TDM_ERR_NO_MEMORY, "JSON: out of memory");
  tdm_status st = parse_value(&p, v);
  if (st == TDM_OK) {
    ws(&p);
    if (p.i != n) st = fail(&p, "trailing characters");
  }
  if (st != TDM_OK) {
    free_value(v);
    tdm__free(v);
    return st;
  }
  *out = v;
  return TDM_OK;
}

void tdm__json_free(tdm_json *j) {
  if (!j) return;
  free_value(j);
  tdm__free(j);
}

const tdm_json *tdm__json_get(const tdm_json *obj, const char *key) {
  if (!obj || obj->type != TDM_JSON_OBJ) return NULL;
  for (int k = 0; k < obj->n; k++)
    if (!strcmp(obj->keys[k], key)) return &obj->items[k];
  return NULL;
}
