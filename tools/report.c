/* tandem report RUN_DIR|METRICS [-o report.html]: one self-contained HTML page (inline SVG, no
 * script, no network) from a run's metrics and, when present, its trace files. Exit 0 on success,
 * 1 when the run cannot be read or the page written, 2 on usage errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "core/file.h"
#include "core/internal.h"
#include "report/run.h"
#include "tandem/tandem.h"

/* Writes the page to path through a temporary renamed into place: never half a report. */
int report_write_page(const char *path, tdm_status (*render)(FILE *, const void *), const void *what, const char *cmd) {
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (!m) {
    fprintf(stderr, "tandem %s: out of memory\n", cmd);
    return 1;
  }
  tdm_status st = render(m, what);
  if (fclose(m) != 0 && st == TDM_OK) st = tdm__set_error(TDM_ERR_NO_MEMORY, "out of memory");
  tdm__wfile w;
  if (st == TDM_OK) st = tdm__wfile_open(&w, path);
  if (st == TDM_OK) st = tdm__wfile_write(&w, buf, len) == TDM_OK ? tdm__wfile_commit(&w) : tdm__wfile_abort(&w);
  free(buf);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem %s: cannot write %s: %s\n", cmd, path, tdm_last_error());
    return 1;
  }
  return 0;
}

static tdm_status render_run(FILE *f, const void *r) { return tdm__report_html(f, r); }

int tool_report(int argc, char **argv) {
  const char *out = NULL;
  cli_opt opts[] = {{"o", CLI_STRING, &out, NULL, "write the page here (default: RUN_DIR/report.html, or METRICS.html)", NULL, 0, 0, 0}};
  static const char *use = "RUN_DIR|METRICS [-o report.html]\n\nRUN_DIR holds a run's metrics (tandem train --metrics RUN_DIR/metrics.jsonl; "
                           "one run per directory)\nand, optionally, its trace files (*.json, here or in a directory below).";
  if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
    cli_help(stdout, "report", use, opts, 1);
    return 0;
  }
  if (argc < 1 || argv[0][0] == '-') {
    fprintf(stderr, "tandem report: no run directory given; usage: tandem report RUN_DIR|METRICS [-o report.html]\n");
    return 2;
  }
  int r = cli_parse("report", use, opts, 1, argc - 1, argv + 1);
  if (r) return r == 1 ? 0 : 2;
  tdm__run *run;
  if (tdm__run_load(argv[0], stderr, &run) != TDM_OK) {
    fprintf(stderr, "tandem report: %s\n", tdm_last_error());
    return 1;
  }
  char def[4200];
  struct stat sb;
  if (!out) {
    if (stat(argv[0], &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(def, sizeof def, "%s/report.html", argv[0]);
    else snprintf(def, sizeof def, "%s.html", argv[0]);
    out = def;
  }
  int rc = report_write_page(out, render_run, run, "report");
  if (rc == 0)
    printf("tandem report: %s: %d steps%s%s -> %s\n", run->metrics, run->n_steps, run->trace ? ", with trace" : "",
           run->skipped ? " (some lines skipped: see the page)" : "", out);
  tdm__run_free(run);
  return rc;
}
