/* Slurm's compressed host lists ("node[01-04,07],login1") and tasks per node ("2(x3),1"),
 * parsed strictly (tandem/cluster.h). A list is walked twice, once to count and once to copy,
 * so the expansion is one allocation of exactly the right size. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/cluster.h"

#define MAX_NAME 256   /* one expanded host name, with its terminator */
#define MAX_GROUPS 16  /* bracketed range lists in one entry */
#define MAX_DIGITS 9   /* a bound below 10^9: no overflow, and no cluster is larger */

typedef struct {
  unsigned long lo, hi;
  int width; /* digits of the low bound as written: n[08-10] pads to 2 */
} range;

typedef struct {
  const char *lit; /* the text before this group */
  size_t lit_len;
  const char *body; /* inside the brackets */
  size_t body_len;
  unsigned long count; /* numbers the group stands for */
} group;

typedef int (*host_fn)(void *ctx, const char *name, size_t len);

static tdm_status bad(const char *list, size_t at, const char *why) {
  return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm node list '%s': %s at character %zu; expected names such as "
                        "node[01-04,07],login1", list, why, at + 1);
}

/* The k-th range of a group body ("1-3,07"); k < 0 counts them. Returns -1 after setting the error. */
static int range_at(const char *list, const char *body, size_t len, long k, range *out, unsigned long *total) {
  size_t i = 0;
  long idx = 0;
  unsigned long sum = 0;
  while (i <= len) {
    size_t s = i;
    while (i < len && body[i] != ',') i++;
    const char *r = body + s;
    size_t rl = i - s, dash = rl;
    for (size_t j = 0; j < rl; j++)
      if (r[j] == '-') { dash = j; break; }
    size_t at = (size_t)(r - list);
    if (rl == 0) return bad(list, at, "an empty range"), -1;
    if (dash == 0 || dash + 1 == rl) return bad(list, at, "a range without a bound"), -1;
    range g;
    unsigned long v[2] = {0, 0};
    size_t from[2] = {0, dash + 1}, to[2] = {dash, rl};
    for (int b = 0; b < (dash < rl ? 2 : 1); b++) {
      if (to[b] - from[b] > MAX_DIGITS) return bad(list, at + from[b], "a number of more than 9 digits"), -1;
      for (size_t j = from[b]; j < to[b]; j++) {
        if (!isdigit((unsigned char)r[j])) return bad(list, at + j, "a character that is not a digit in a range"), -1;
        v[b] = v[b] * 10 + (unsigned long)(r[j] - '0');
      }
    }
    g.lo = v[0];
    g.hi = dash < rl ? v[1] : v[0];
    g.width = (int)to[0];
    if (g.hi < g.lo) return bad(list, at, "a range whose high bound is below its low bound"), -1;
    sum += g.hi - g.lo + 1;
    if (sum > TDM_HOSTLIST_MAX) return bad(list, at, "more than 1048576 hosts"), -1;
    if (idx == k) {
      *out = g;
      return 0;
    }
    idx++;
    i++; /* past the comma */
  }
  if (total) *total = sum;
  return (int)idx;
}

/* Calls fn for every host of one entry (list[s, e)), the last group varying fastest. */
static tdm_status walk_entry(const char *list, size_t s, size_t e, host_fn fn, void *ctx, unsigned long *hosts) {
  group g[MAX_GROUPS];
  int ng = 0;
  size_t lit = s, i = s;
  if (s == e) return bad(list, s, "an empty entry");
  while (i < e) {
    char ch = list[i];
    if (ch == ']') return bad(list, i, "a ']' without its '['");
    if (isspace((unsigned char)ch) || iscntrl((unsigned char)ch)) return bad(list, i, "a blank or control character");
    if (ch != '[') {
      i++;
      continue;
    }
    size_t close = i + 1;
    while (close < e && list[close] != ']' && list[close] != '[') close++;
    if (close >= e) return bad(list, i, "a '[' that is never closed");
    if (list[close] == '[') return bad(list, close, "a '[' inside brackets");
    if (ng == MAX_GROUPS) return bad(list, i, "more than 16 bracketed lists in one name");
    g[ng] = (group){list + lit, i - lit, list + i + 1, close - i - 1, 0};
    if (g[ng].body_len == 0) return bad(list, i, "empty brackets");
    if (range_at(list, g[ng].body, g[ng].body_len, -1, NULL, &g[ng].count) < 0) return TDM_ERR_INVALID_ARG;
    ng++;
    i = lit = close + 1;
  }
  unsigned long n = 1;
  for (int k = 0; k < ng; k++) {
    if (n * g[k].count > TDM_HOSTLIST_MAX) return bad(list, s, "more than 1048576 hosts");
    n *= g[k].count;
  }
  if (*hosts + n > TDM_HOSTLIST_MAX) return bad(list, s, "more than 1048576 hosts");
  *hosts += n;
  unsigned long idx[MAX_GROUPS] = {0}; /* the odometer: an index into each group's numbers */
  for (unsigned long h = 0; h < n; h++) {
    char name[MAX_NAME];
    size_t len = 0;
    for (int k = 0; k < ng; k++) {
      range r = {0, 0, 0};
      unsigned long left = idx[k];
      for (long q = 0;; q++) { /* the range that holds the idx[k]-th number */
        range_at(list, g[k].body, g[k].body_len, q, &r, NULL);
        if (left <= r.hi - r.lo) break;
        left -= r.hi - r.lo + 1;
      }
      int w = snprintf(name + len, len < MAX_NAME ? MAX_NAME - len : 0, "%.*s%0*lu", (int)g[k].lit_len, g[k].lit, r.width,
                       r.lo + left);
      len += (size_t)(w > 0 ? w : 0);
    }
    int w = snprintf(name + len, len < MAX_NAME ? MAX_NAME - len : 0, "%.*s", (int)(e - lit), list + lit);
    len += (size_t)(w > 0 ? w : 0);
    if (len >= MAX_NAME) return bad(list, s, "a host name of 256 characters or more");
    if (fn && fn(ctx, name, len)) return TDM_OK; /* the caller has what it wanted */
    for (int k = ng - 1; k >= 0; k--) {
      if (++idx[k] < g[k].count) break;
      idx[k] = 0;
    }
  }
  return TDM_OK;
}

/* Every host of the list, in order; *n gets their number. */
static tdm_status walk(const char *list, host_fn fn, void *ctx, unsigned long *n) {
  *n = 0;
  if (!list) return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm node list: NULL");
  size_t len = strlen(list), s = 0;
  if (len == 0) return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm node list is empty; expected names such as node[01-04,07]");
  int depth = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && list[i] == '[') depth++;
    if (i < len && list[i] == ']') depth--;
    if (i == len || (list[i] == ',' && depth == 0)) {
      TDM__TRY(walk_entry(list, s, i, fn, ctx, n));
      s = i + 1;
    }
  }
  return TDM_OK;
}

typedef struct {
  char **ptr;
  char *text;
  size_t bytes;
  unsigned long n;
} fill_ctx;

static int count_bytes(void *ctx, const char *name, size_t len) {
  (void)name;
  ((fill_ctx *)ctx)->bytes += len + 1;
  return 0;
}

static int copy_name(void *ctx, const char *name, size_t len) {
  fill_ctx *f = ctx;
  memcpy(f->text, name, len);
  f->text[len] = 0;
  f->ptr[f->n++] = f->text;
  f->text += len + 1;
  return 0;
}

tdm_status tdm_hostlist_expand(const char *list, char ***hosts, int *n) {
  if (!hosts || !n) return tdm__set_error(TDM_ERR_INVALID_ARG, "hostlist_expand: NULL argument");
  *hosts = NULL;
  *n = 0;
  fill_ctx f = {0};
  unsigned long count;
  TDM__TRY(walk(list, count_bytes, &f, &count));
  size_t head = (count + 1) * sizeof(char *);
  char **p = tdm__malloc(head + f.bytes);
  if (!p) return tdm__set_error(TDM_ERR_NO_MEMORY, "hostlist_expand: out of memory for %lu hosts", count);
  fill_ctx c = {p, (char *)p + head, 0, 0};
  walk(list, copy_name, &c, &count);
  p[count] = NULL;
  *hosts = p;
  *n = (int)count;
  return TDM_OK;
}

void tdm_hostlist_free(char **hosts) { tdm__free(hosts); }

typedef struct {
  char *out;
  size_t cap, len;
  int got;
} first_ctx;

static int take_first(void *ctx, const char *name, size_t len) {
  first_ctx *f = ctx;
  if (!f->got) {
    f->got = 1;
    f->len = len;
    if (len < f->cap) memcpy(f->out, name, len + 1);
  }
  return 0; /* go on: the rest of the list must parse too */
}

tdm_status tdm_hostlist_first(const char *list, char *out, size_t n) {
  first_ctx f = {out, n, 0, 0};
  unsigned long count;
  if (!out || !n) return tdm__set_error(TDM_ERR_INVALID_ARG, "hostlist_first: no output buffer");
  TDM__TRY(walk(list, take_first, &f, &count));
  if (f.len >= n)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm node list '%s': the first host is %zu characters; at most %zu", list, f.len,
                          n - 1);
  return TDM_OK;
}

/* ---- tasks per node ------------------------------------------------------------------------ */
static int read_num(const char **p, long *v) {
  const char *s = *p;
  if (!isdigit((unsigned char)*s)) return 0;
  long x = 0;
  while (isdigit((unsigned char)*s)) {
    x = x * 10 + (*s++ - '0');
    if (x > TDM_HOSTLIST_MAX) return 0;
  }
  *p = s;
  *v = x;
  return 1;
}

tdm_status tdm_slurm_tasks_per_node(const char *spec, int node, int *tasks, int *nodes) {
  if (!spec || !*spec)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm tasks per node: empty; expected counts such as 2(x3),1");
  const char *p = spec;
  long seen = 0, mine = -1;
  for (;;) {
    long t, rep = 1;
    if (!read_num(&p, &t) || t < 1) goto malformed;
    if (*p == '(') {
      p++;
      if (*p++ != 'x' || !read_num(&p, &rep) || rep < 1 || *p++ != ')') goto malformed;
    }
    if (node >= seen && node < seen + rep) mine = t;
    seen += rep;
    if (seen > TDM_HOSTLIST_MAX) goto malformed;
    if (!*p) break;
    if (*p++ != ',') goto malformed;
  }
  if (nodes) *nodes = (int)seen;
  if (tasks) {
    if (mine < 0)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm tasks per node '%s' covers %ld nodes; this is node %d", spec, seen, node);
    *tasks = (int)mine;
  }
  return TDM_OK;
malformed:
  return tdm__set_error(TDM_ERR_INVALID_ARG, "Slurm tasks per node '%s': cannot parse at character %d; expected counts such as 2(x3),1",
                        spec, (int)(p - spec) + 1);
}
