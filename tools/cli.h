/* Table-driven command-line options for the tandem subcommands: every option has a type, a
 * default and a help line, so --help lists them all and a bad value names the option. */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H

#include <stdint.h>
#include <stdio.h>

typedef enum { CLI_INT, CLI_FLOAT, CLI_STRING, CLI_FLAG, CLI_CHOICE } cli_type;

typedef struct cli_opt {
  const char *name; /* without the leading -- */
  cli_type type;
  void *dest;       /* int64_t*, double*, const char**, int*, const char** */
  const char *def;  /* default as text, NULL for none */
  const char *help;
  const char *choices; /* CLI_CHOICE: "a|b|c" */
  double min, max;     /* numeric range (inclusive) when min < max */
  int seen;
} cli_opt;

/* Sets defaults, parses argv. Returns 0 on success, 1 if --help was printed, 2 on error (the
 * message is printed to stderr). */
int cli_parse(const char *cmd, const char *usage, cli_opt *opts, int n, int argc, char **argv);
void cli_help(FILE *f, const char *cmd, const char *usage, const cli_opt *opts, int n);
/* Whether the user gave option `name`. */
int cli_seen(const cli_opt *opts, int n, const char *name);

int tool_train(int argc, char **argv);
int tool_run(int argc, char **argv);
int tool_bench(int argc, char **argv);
int tool_bench_gpt(int argc, char **argv);
int tool_weights_diff(int argc, char **argv);
int tool_generate(int argc, char **argv);

#endif
