/* Table-driven command-line options for the tandem subcommands: every option has a type, a
 * default and a help line, so --help lists them all and a bad value names the option. Options are
 * written --name VALUE or --name=VALUE; an option whose name is one letter is written -x VALUE
 * (nccl-tests' style). Every number goes through the checked parsers below: the whole text must
 * be the number (no trailing junk, no leading space), integers must fit in int64, floats must be
 * finite (no nan, no inf), and both must lie in the option's range. */
#ifndef TANDEM_CLI_H
#define TANDEM_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/status.h"

/* CLI_SIZE: a byte count, int64_t, with an optional K, M, G or T suffix (powers of 1024) and B. */
typedef enum { CLI_INT, CLI_FLOAT, CLI_STRING, CLI_FLAG, CLI_CHOICE, CLI_SIZE } cli_type;

typedef struct cli_opt {
  const char *name; /* without the leading -- */
  cli_type type;
  void *dest;       /* int64_t*, double*, const char**, int*, const char**, int64_t* */
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
/* Where cli_parse writes its error messages (NULL: stderr, the default). */
void cli_set_error_stream(FILE *f);
/* Whether the user gave option `name`. */
int cli_seen(const cli_opt *opts, int n, const char *name);

/* The checked parsers behind the table, for numbers that come from elsewhere (positional
 * arguments, file metadata). Each returns 0 and sets *out, or returns CLI_NOT_A_NUMBER or
 * CLI_OUT_OF_RANGE and leaves *out alone. */
enum { CLI_NOT_A_NUMBER = 1, CLI_OUT_OF_RANGE = 2 };
int cli_parse_int(const char *s, int64_t min, int64_t max, int64_t *out);
int cli_parse_float(const char *s, double min, double max, double *out);
int cli_parse_size(const char *s, int64_t max, int64_t *out);

int tool_train(int argc, char **argv);
int tool_train_as(const char *cmd, int argc, char **argv); /* tandem train under another name (ps-worker) in its messages */
int tool_plan(int argc, char **argv);
int tool_simulate(int argc, char **argv);
int tool_ps_replay(int argc, char **argv);
int tool_ps_server(int argc, char **argv); /* ps_role.c */
int tool_ps_worker(int argc, char **argv);
int tool_run(int argc, char **argv);
int tool_bench(int argc, char **argv);
int tool_bench_gpt(int argc, char **argv);
int tool_bench_llama(int argc, char **argv);
int tool_weights_diff(int argc, char **argv);
int tool_generate(int argc, char **argv);
int tool_checkpoint(int argc, char **argv);
int tool_report(int argc, char **argv);
int tool_scale(int argc, char **argv);
int tool_trace(int argc, char **argv);
struct tdm_train_config;
struct tdm_train_result;
/* The options of tandem train (tools/train.c), shared by plan, ps-replay and simulate, which add their
 * own n_extra: parses argv into *c. Returns 0, 1 (--help printed) or 2 (a usage error, printed). */
int train_options(const char *cmd, const char *usage, int argc, char **argv, struct tdm_train_config *c, int n_extra,
                  const cli_opt *extra);
/* Writes what render writes to path through a temporary renamed into place (tools/report.c): never
 * half a page. 0, or 1 with the error printed as "tandem CMD: cannot write PATH: ...". */
int report_write_page(const char *path, tdm_status (*render)(FILE *, const void *), const void *what, const char *cmd);
/* tandem train --emulate-ranks N (tools/emulate.c): 0, 1 (a rank failed) or 2 (usage). */
int emulate_ranks(const struct tdm_train_config *c, int n, const char *slow, struct tdm_train_result *res);

#endif
