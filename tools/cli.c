#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static FILE *err_stream;
void cli_set_error_stream(FILE *f) { err_stream = f; }
#define ERR (err_stream ? err_stream : stderr)

static const char *dashes(const cli_opt *o) { return o->name[0] && !o->name[1] ? "-" : "--"; }

void cli_help(FILE *f, const char *cmd, const char *usage, const cli_opt *opts, int n) {
  fprintf(f, "usage: tandem %s %s\n\noptions:\n", cmd, usage);
  for (int i = 0; i < n; i++) {
    char left[64];
    const char *arg = opts[i].type == CLI_FLAG ? "" : opts[i].type == CLI_INT ? " N"
                                                  : opts[i].type == CLI_FLOAT ? " X"
                                                  : opts[i].type == CLI_SIZE ? " SIZE"
                                                  : opts[i].type == CLI_CHOICE ? " {choice}" : " VALUE";
    snprintf(left, sizeof left, "%s%s%s", dashes(&opts[i]), opts[i].name, arg);
    fprintf(f, "  %-26s %s", left, opts[i].help);
    if (opts[i].type == CLI_CHOICE) fprintf(f, " (%s)", opts[i].choices);
    if (opts[i].def) fprintf(f, " [default: %s]", opts[i].def);
    fprintf(f, "\n");
  }
  fprintf(f, "  %-26s %s\n", "--help", "show this help");
}

/* A table range given as doubles, as int64 (no range: all of int64). */
static void int_range(const cli_opt *o, int64_t *lo, int64_t *hi) {
  *lo = INT64_MIN, *hi = INT64_MAX;
  if (!(o->min < o->max)) return;
  if (o->min > -9.2e18) *lo = (int64_t)o->min;
  if (o->max < 9.2e18) *hi = (int64_t)o->max;
}

int cli_parse_int(const char *s, int64_t min, int64_t max, int64_t *out) {
  if (!s || !(*s == '-' || *s == '+' || (*s >= '0' && *s <= '9'))) return CLI_NOT_A_NUMBER;
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (end == s || *end) return CLI_NOT_A_NUMBER;
  if (errno == ERANGE || x < min || x > max) return CLI_OUT_OF_RANGE;
  *out = x;
  return 0;
}

int cli_parse_float(const char *s, double min, double max, double *out) {
  /* a decimal number: strtod would also take nan, inf, hex and leading blanks */
  if (!s || !(*s == '-' || *s == '+' || *s == '.' || (*s >= '0' && *s <= '9')) || strpbrk(s, "xXnN"))
    return CLI_NOT_A_NUMBER;
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (end == s || *end) return CLI_NOT_A_NUMBER;
  if (!isfinite(x) || x < min || x > max) return CLI_OUT_OF_RANGE;
  *out = x;
  return 0;
}

int cli_parse_size(const char *s, int64_t max, int64_t *out) {
  if (!s) return CLI_NOT_A_NUMBER;
  size_t i = 0, dot = 0, digits = 0;
  for (; (s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !dot); i++) {
    if (s[i] == '.') dot = i + 1;
    else digits++;
  }
  if (!digits || (dot && dot == i)) return CLI_NOT_A_NUMBER; /* "", ".", "8." */
  int shift = 0;
  switch (s[i]) {
  case 'K': case 'k': shift = 10; i++; break;
  case 'M': case 'm': shift = 20; i++; break;
  case 'G': case 'g': shift = 30; i++; break;
  case 'T': case 't': shift = 40; i++; break;
  default: break;
  }
  if (s[i] == 'B' || s[i] == 'b') i++;
  if (s[i]) return CLI_NOT_A_NUMBER;
  int64_t v;
  if (!dot) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno == ERANGE || x > (INT64_MAX >> shift)) return CLI_OUT_OF_RANGE;
    v = (int64_t)x << shift;
  } else { /* 1.5K: the product must be a whole number of bytes */
    double x = strtod(s, NULL) * (double)((int64_t)1 << shift);
    if (!(x <= 9.0e18)) return CLI_OUT_OF_RANGE;
    if (x != (double)(int64_t)x) return CLI_NOT_A_NUMBER;
    v = (int64_t)x;
  }
  if (v > max) return CLI_OUT_OF_RANGE;
  *out = v;
  return 0;
}

static int set_value(const char *cmd, cli_opt *o, const char *v) {
  const char *d = dashes(o);
  switch (o->type) {
  case CLI_INT: {
    int64_t lo, hi;
    int_range(o, &lo, &hi);
    int r = cli_parse_int(v, lo, hi, (int64_t *)o->dest);
    if (r == CLI_NOT_A_NUMBER)
      fprintf(ERR, "tandem %s: %s%s: '%s' is not an integer; expected %lld..%lld\n", cmd, d, o->name, v, (long long)lo,
              (long long)hi);
    if (r == CLI_OUT_OF_RANGE)
      fprintf(ERR, "tandem %s: %s%s: %s is out of range; expected %lld..%lld\n", cmd, d, o->name, v, (long long)lo,
              (long long)hi);
    return r ? 2 : 0;
  }
  case CLI_FLOAT: {
    double lo = o->min < o->max ? o->min : -HUGE_VAL, hi = o->min < o->max ? o->max : HUGE_VAL;
    int r = cli_parse_float(v, lo, hi, (double *)o->dest);
    if (r == CLI_NOT_A_NUMBER) fprintf(ERR, "tandem %s: %s%s: '%s' is not a number\n", cmd, d, o->name, v);
    if (r == CLI_OUT_OF_RANGE)
      fprintf(ERR, "tandem %s: %s%s: %s is out of range; expected %g..%g\n", cmd, d, o->name, v, lo, hi);
    return r ? 2 : 0;
  }
  case CLI_SIZE: {
    int64_t lo, hi;
    int_range(o, &lo, &hi);
    int64_t x = 0;
    int r = cli_parse_size(v, hi, &x);
    if (!r && x < lo) r = CLI_OUT_OF_RANGE;
    if (r == CLI_NOT_A_NUMBER)
      fprintf(ERR, "tandem %s: %s%s: '%s' is not a size in bytes (like 8, 64K, 1.5M, 2G)\n", cmd, d, o->name, v);
    if (r == CLI_OUT_OF_RANGE)
      fprintf(ERR, "tandem %s: %s%s: %s is out of range; expected %lld..%lld bytes\n", cmd, d, o->name, v,
              (long long)(lo > 0 ? lo : 0), (long long)hi);
    if (!r) *(int64_t *)o->dest = x;
    return r ? 2 : 0;
  }
  case CLI_STRING:
    *(const char **)o->dest = v;
    return 0;
  case CLI_CHOICE: {
    size_t n = strlen(v);
    for (const char *c = o->choices; *c;) {
      const char *bar = strchr(c, '|');
      size_t len = bar ? (size_t)(bar - c) : strlen(c);
      if (len == n && !strncmp(c, v, n)) {
        *(const char **)o->dest = v;
        return 0;
      }
      if (!bar) break;
      c = bar + 1;
    }
    fprintf(ERR, "tandem %s: %s%s: '%s' is not one of %s\n", cmd, d, o->name, v, o->choices);
    return 2;
  }
  case CLI_FLAG:
    *(int *)o->dest = 1;
    return 0;
  }
  return 2;
}

int cli_parse(const char *cmd, const char *usage, cli_opt *opts, int n, int argc, char **argv) {
  for (int i = 0; i < n; i++) {
    if (opts[i].type == CLI_FLAG) *(int *)opts[i].dest = 0;
    if (opts[i].def && opts[i].type != CLI_FLAG && set_value(cmd, &opts[i], opts[i].def)) return 2;
    if (!opts[i].def && (opts[i].type == CLI_STRING || opts[i].type == CLI_CHOICE)) *(const char **)opts[i].dest = NULL;
  }
  for (int a = 0; a < argc; a++) {
    const char *arg = argv[a];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      cli_help(stdout, cmd, usage, opts, n);
      return 1;
    }
    /* --name[=value], or -x for a one-letter option */
    int is_short = arg[0] == '-' && arg[1] && arg[1] != '-' && !arg[2];
    if (strncmp(arg, "--", 2) != 0 && !is_short) {
      fprintf(ERR, "tandem %s: unexpected argument '%s' (see tandem %s --help)\n", cmd, arg, cmd);
      return 2;
    }
    const char *name = arg + (is_short ? 1 : 2), *eq = is_short ? NULL : strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    cli_opt *o = NULL;
    for (int i = 0; i < n; i++)
      if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len) && (!is_short || len == 1)) o = &opts[i];
    if (!o) {
      fprintf(ERR, "tandem %s: unknown option '%s' (see tandem %s --help)\n", cmd, arg, cmd);
      return 2;
    }
    const char *val = NULL;
    if (o->type == CLI_FLAG) {
      if (eq) {
        fprintf(ERR, "tandem %s: %s%s takes no value\n", cmd, dashes(o), o->name);
        return 2;
      }
    } else if (eq) {
      val = eq + 1;
    } else if (a + 1 < argc) {
      val = argv[++a];
    } else {
      fprintf(ERR, "tandem %s: %s%s needs a value\n", cmd, dashes(o), o->name);
      return 2;
    }
    if (set_value(cmd, o, val)) return 2;
    o->seen = 1;
  }
  return 0;
}

int cli_seen(const cli_opt *opts, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(opts[i].name, name)) return opts[i].seen;
  return 0;
}
