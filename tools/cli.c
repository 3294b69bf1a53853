#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void cli_help(FILE *f, const char *cmd, const char *usage, const cli_opt *opts, int n) {
  fprintf(f, "usage: tandem %s %s\n\noptions:\n", cmd, usage);
  for (int i = 0; i < n; i++) {
    char left[64];
    const char *arg = opts[i].type == CLI_FLAG ? "" : opts[i].type == CLI_INT ? " N"
                                                  : opts[i].type == CLI_FLOAT ? " X"
                                                  : opts[i].type == CLI_CHOICE ? " {choice}" : " VALUE";
    snprintf(left, sizeof left, "--%s%s", opts[i].name, arg);
    fprintf(f, "  %-26s %s", left, opts[i].help);
    if (opts[i].type == CLI_CHOICE) fprintf(f, " (%s)", opts[i].choices);
    if (opts[i].def) fprintf(f, " [default: %s]", opts[i].def);
    fprintf(f, "\n");
  }
  fprintf(f, "  %-26s %s\n", "--help", "show this help");
}

static int set_value(const char *cmd, cli_opt *o, const char *v) {
  char *end;
  switch (o->type) {
  case CLI_INT: {
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) {
      fprintf(stderr, "tandem %s: --%s: '%s' is not an integer\n", cmd, o->name, v);
      return 2;
    }
    if (o->min < o->max && (x < o->min || x > o->max)) {
      fprintf(stderr, "tandem %s: --%s: %lld is out of range; expected %.0f..%.0f\n", cmd, o->name, x, o->min, o->max);
      return 2;
    }
    *(int64_t *)o->dest = x;
    return 0;
  }
  case CLI_FLOAT: {
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x)) {
      fprintf(stderr, "tandem %s: --%s: '%s' is not a number\n", cmd, o->name, v);
      return 2;
    }
    if (o->min < o->max && (x < o->min || x > o->max)) {
      fprintf(stderr, "tandem %s: --%s: %g is out of range; expected %g..%g\n", cmd, o->name, x, o->min, o->max);
      return 2;
    }
    *(double *)o->dest = x;
    return 0;
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
    fprintf(stderr, "tandem %s: --%s: '%s' is not one of %s\n", cmd, o->name, v, o->choices);
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
    if (strncmp(arg, "--", 2) != 0) {
      fprintf(stderr, "tandem %s: unexpected argument '%s' (see tandem %s --help)\n", cmd, arg, cmd);
      return 2;
    }
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    cli_opt *o = NULL;
    for (int i = 0; i < n; i++)
      if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len)) o = &opts[i];
    if (!o) {
      fprintf(stderr, "tandem %s: unknown option '%s' (see tandem %s --help)\n", cmd, arg, cmd);
      return 2;
    }
    const char *val = NULL;
    if (o->type == CLI_FLAG) {
      if (eq) {
        fprintf(stderr, "tandem %s: --%s takes no value\n", cmd, o->name);
        return 2;
      }
    } else if (eq) {
      val = eq + 1;
    } else if (a + 1 < argc) {
      val = argv[++a];
    } else {
      fprintf(stderr, "tandem %s: --%s needs a value\n", cmd, o->name);
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
