/* tandem simulate's study as pictures: a self-contained HTML page (--html) and standalone SVG
 * files (--svg), drawn by the report tool's plotter (src/report/svg.c). A study is one or more
 * configurations (--vary OPTION=V1,V2,...), each predicted at every world size of --ranks. */
#ifndef TANDEM_TOOLS_SIMULATE_PAGE_H
#define TANDEM_TOOLS_SIMULATE_PAGE_H

#define SIM_MAX_RANKS 64   /* world sizes in one --ranks */
#define SIM_MAX_CURVES 10  /* configurations in one --vary (the plotter's colours) */

typedef struct {
  char name[96];    /* "allreduce ring"; "" for the only configuration */
  char cluster[320]; /* the cluster it was predicted on, as simulate prints it */
  int n;
  double ranks[SIM_MAX_RANKS], step[SIM_MAX_RANKS], compute[SIM_MAX_RANKS], comm[SIM_MAX_RANKS], exposed[SIM_MAX_RANKS],
      efficiency[SIM_MAX_RANKS]; /* seconds; efficiency 0..1 */
} sim_curve;

typedef struct {
  const char *command; /* the command line, shown on the page */
  const sim_curve *curves;
  int n;
} sim_study;

/* The page: the command, each configuration's cluster and table, and line plots against ranks of
 * the step time, the efficiency and the exposed communication, one line per configuration.
 * 0, or 1 with the error printed. */
int simulate_write_html(const char *path, const sim_study *s);
/* PREFIX-step.svg and PREFIX-efficiency.svg: the page's first two plots as files of their own.
 * 0, or 1 with the error printed. */
int simulate_write_svg(const char *prefix, const sim_study *s);

#endif
