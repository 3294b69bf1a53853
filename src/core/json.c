#include "core/json.h"

#include <errno.h>
#include <math.h>
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

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The 4 hex digits of a \u escape at p->i, or -1. */
static long hex4(parser *p) {
  if (p->n - p->i < 4) return -1;
  long v = 0;
  for (int k = 0; k < 4; k++) {
    int h = hexval(p->s[p->i + (size_t)k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  p->i += 4;
  return v;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 (overlong forms, surrogates and code points
 * above U+10FFFF are invalid). */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (!len || len > n) return 0;
  for (size_t k = 1; k < len; k++)
    if ((s[k] & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
      (c == 0xf4 && s[1] > 0x8f))
    return 0;
  return len;
}

int tdm__utf8_valid(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    size_t len = u[i] < 0x80 ? 1 : utf8_len(u + i, n - i);
    if (!len) return 0;
    i += len;
  }
  return 1;
}

static size_t put_utf8(char *out, unsigned long cp) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), 2;
  if (cp < 0x10000)
    return out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[2] = (char)(0x80 | (cp & 0x3f)), 3;
  out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* A JSON string as UTF-8 without NUL bytes (a C string cannot hold U+0000, so \u0000 is refused
 * rather than silently cutting a name short). */
static tdm_status parse_string(parser *p, char **out) {
  if (p->i >= p->n || p->s[p->i] != '"') return fail(p, "expected a string");
  p->i++;
  size_t end = p->i; /* the closing quote: the decoded string is never longer than the raw one */
  while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->n) return fail(p, "unterminated string");
  char *buf = tdm__malloc(end - p->i + 1);
  if (!buf) return tdm__set_error(TDM_ERR_NO_MEMORY, "JSON: out of memory");
  size_t k = 0;
  const char *err = NULL;
  while (!err && p->s[p->i] != '"') {
    unsigned char c = (unsigned char)p->s[p->i];
    if (c < 0x20) {
      err = "control character in a string";
    } else if (c >= 0x80) {
      size_t len = utf8_len((const unsigned char *)p->s + p->i, end - p->i);
      if (!len) err = "invalid UTF-8 in a string";
      for (size_t j = 0; j < len; j++) buf[k++] = p->s[p->i++];
    } else if (c != '\\') {
      buf[k++] = (char)c;
      p->i++;
    } else {
      char e = p->s[p->i + 1];
      p->i += 2;
      switch (e) {
      case '"': case '\\': case '/': buf[k++] = e; break;
      case 'n': buf[k++] = '\n'; break;
      case 't': buf[k++] = '\t'; break;
      case 'r': buf[k++] = '\r'; break;
      case 'b': buf[k++] = '\b'; break;
      case 'f': buf[k++] = '\f'; break;
      case 'u': {
        long cp = hex4(p);
        if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate needs its low half */
          long lo = -1;
          if (p->n - p->i >= 2 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            p->i += 2;
            lo = hex4(p);
          }
          cp = lo >= 0xdc00 && lo <= 0xdfff ? 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00) : -2;
        } else if (cp >= 0xdc00 && cp <= 0xdfff) {
          cp = -2;
        }
        if (cp == -1) err = "\\u needs 4 hex digits";
        else if (cp == -2) err = "unpaired UTF-16 surrogate in a \\u escape";
        else if (cp == 0) err = "\\u0000 in a string is not supported";
        else k += put_utf8(buf + k, (unsigned long)cp);
        break;
      }
      default: err = "unknown escape in a string";
      }
    }
  }
  if (err) {
    tdm__free(buf);
    return fail(p, err);
  }
  p->i++;
  buf[k] = 0;
  *out = buf;
  return TDM_OK;
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Duplicate keys would make a lookup's answer depend on which copy it meets first. */
static tdm_status check_unique_keys(parser *p, const tdm_json *v) {
  if (v->n < 2) return TDM_OK;
  char **k = tdm__malloc(sizeof *k * (size_t)v->n);
  if (!k) return tdm__set_error(TDM_ERR_NO_MEMORY, "JSON: out of memory");
  memcpy(k, v->keys, sizeof *k * (size_t)v->n);
  qsort(k, (size_t)v->n, sizeof *k, cmp_key);
  tdm_status st = TDM_OK;
  for (int i = 1; i < v->n && st == TDM_OK; i++)
    if (!strcmp(k[i - 1], k[i]))
      st = tdm__set_error(TDM_ERR_FORMAT, "JSON: duplicate key '%.80s%s' in the object that ends at byte %zu", k[i],
                          strlen(k[i]) > 80 ? "..." : "", p->i);
  tdm__free(k);
  return st;
}

/* RFC 8259's grammar exactly: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. Integers are exact
 * in inum when they fit in int64; every number must be finite as a double. */
static tdm_status parse_number(parser *p, tdm_json *v) {
  size_t b = p->i, i = p->i;
  const char *s = p->s;
#define DIGITS(at) ((at) < p->n && s[at] >= '0' && s[at] <= '9')
  int is_int = 1;
  if (i < p->n && s[i] == '-') i++;
  if (!DIGITS(i)) return fail(p, "bad number");
  if (s[i] == '0') i++;
  else
    while (DIGITS(i)) i++;
  if (i < p->n && s[i] == '.') {
    is_int = 0;
    i++;
    if (!DIGITS(i)) return fail(p, "bad number: no digit after '.'");
    while (DIGITS(i)) i++;
  }
  if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
    is_int = 0;
    i++;
    if (i < p->n && (s[i] == '+' || s[i] == '-')) i++;
    if (!DIGITS(i)) return fail(p, "bad number: no digit in the exponent");
    while (DIGITS(i)) i++;
  }
#undef DIGITS
  char tmp[64];
  if (i - b >= sizeof tmp) return fail(p, "number longer than 63 characters");
  memcpy(tmp, s + b, i - b);
  tmp[i - b] = 0;
  p->i = i;
  v->type = TDM_JSON_NUM;
  errno = 0;
  v->num = strtod(tmp, NULL);
  if (!isfinite(v->num)) return fail(p, "number out of the range of a double");
  if (is_int) {
    errno = 0;
    v->inum = strtoll(tmp, NULL, 10);
    v->is_int = errno != ERANGE;
  }
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
      if (cap > (1 << 29)) return fail(p, "more than 2^29 items in one array or object");
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
      return is_obj ? check_unique_keys(p, v) : TDM_OK;
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
    st = parse_number(p, v);
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
