/* tandem trace merge DIR OUT: the per-rank timelines of a --trace run as one file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tandem/trace.h"

static void usage(FILE *f) {
  fprintf(f, "usage: tandem trace merge DIR OUT.json\n\n"
             "  Merges DIR/trace.rank<R>.json (written by tandem train --trace DIR) into one Chrome trace, each\n"
             "  rank's clock moved onto rank 0's with the offsets measured at the run's start and end (recorded\n"
             "  in OUT's otherData.tandem_clock). Open OUT in https://ui.perfetto.dev or chrome://tracing.\n"
             "  A rank's trace its run never closed (killed, crashed, stopped) is merged up to its last whole\n"
             "  event; OUT's otherData.unclosed lists such ranks and where each stops.\n");
}

int tool_trace(int argc, char **argv) {
  if (argc >= 1 && (!strcmp(argv[argc - 1], "--help") || !strcmp(argv[argc - 1], "-h"))) { /* trace --help, trace merge --help */
    usage(stdout);
    return 0;
  }
  if (argc != 3 || strcmp(argv[0], "merge") != 0) {
    if (argc >= 1 && strcmp(argv[0], "merge") != 0) fprintf(stderr, "tandem trace: unknown subcommand '%s'; expected merge\n", argv[0]);
    else fprintf(stderr, "tandem trace merge: expected DIR and OUT.json (%d argument%s given)\n", argc ? argc - 1 : 0, argc == 2 ? "" : "s");
    usage(stderr);
    return 2;
  }
  int ranks = 0, unclosed = 0;
  tdm_status st = tdm_trace_merge(argv[1], argv[2], &ranks, &unclosed);
  if (st != TDM_OK) {
    fprintf(stderr, "tandem %s\n", tdm_last_error()); /* the detail starts with "trace merge: " */
    return 1;
  }
  printf("merged %d rank%s into %s (open in https://ui.perfetto.dev or chrome://tracing)\n", ranks, ranks == 1 ? "" : "s",
         argv[2]);
  if (unclosed) /* a run that stopped: still merged, and said */
    printf("%d of the traces %s not closed (the run stopped, or the file's end is damaged): each is merged up to its last "
           "whole event; otherData.unclosed says where each one ends\n", unclosed, unclosed == 1 ? "was" : "were");
  return 0;
}
