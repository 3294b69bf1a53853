/* The tandem command: one binary, one subcommand per job. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "tandem/comm.h"
#include "watch.h"

/* A signal that ends a rank (a launcher's SIGTERM, the watchdog's, Ctrl-C) during shared memory's
 * set-up would leave its segment in /dev/shm: removed, then the signal's default action. */
static void on_fatal_signal(int sig) {
  tdm_shm_remove_pending();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: tandem <command> [options]\n\n"
          "commands:\n"
          "  train     train a model (tandem train --help)\n"
          "  plan      the memory a training run will need per rank (tandem train's options, --world N)\n"
          "  simulate  predicted step time and scaling on a described cluster, --ranks 8,64,1024 (tandem simulate --help)\n"
          "  run       start N ranks of a program on this node (tandem run --help)\n"
          "  bench     benchmark collectives, nccl-tests style (tandem bench --help)\n"
          "  generate  sample text from GPT weights (tandem generate --help)\n"
          "  weights-diff A B [--rtol R]   compare two safetensors weight files\n"
          "  ps-server, ps-worker  one rank of a parameter-server job started on its own (--rank R --world N --master HOST:PORT)\n"
          "  ps-replay --ps-log DIR   replay a parameter server's update logs into weights (tandem train's options)\n"
          "  checkpoint info|consolidate   a checkpoint's contents, or its weights as one file (tandem checkpoint --help)\n"
          "  report RUN_DIR [-o FILE]   an HTML report (plots, per-rank times, memory) from a run's metrics and trace\n"
          "  scale --ranks 1,2,4 -- tandem train ...   the same job at each world size: throughput, speed-up, efficiency\n"
          "  trace merge DIR OUT   the per-rank timelines of tandem train --trace DIR as one Chrome trace\n"
          "  help      show this text\n");
}

static int dispatch(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "train")) return tool_train(argc - 2, argv + 2);
  if (!strcmp(cmd, "plan")) return tool_plan(argc - 2, argv + 2);
  if (!strcmp(cmd, "simulate")) return tool_simulate(argc - 2, argv + 2);
  if (!strcmp(cmd, "run")) return tool_run(argc - 2, argv + 2);
  if (!strcmp(cmd, "bench")) return tool_bench(argc - 2, argv + 2);
  if (!strcmp(cmd, "weights-diff")) return tool_weights_diff(argc - 2, argv + 2);
  if (!strcmp(cmd, "generate")) return tool_generate(argc - 2, argv + 2);
  if (!strcmp(cmd, "checkpoint")) return tool_checkpoint(argc - 2, argv + 2);
  if (!strcmp(cmd, "ps-replay")) return tool_ps_replay(argc - 2, argv + 2);
  if (!strcmp(cmd, "report")) return tool_report(argc - 2, argv + 2);
  if (!strcmp(cmd, "scale")) return tool_scale(argc - 2, argv + 2);
  if (!strcmp(cmd, "trace")) return tool_trace(argc - 2, argv + 2);
  if (!strcmp(cmd, "ps-server")) return tool_ps_server(argc - 2, argv + 2);
  if (!strcmp(cmd, "ps-worker")) return tool_ps_worker(argc - 2, argv + 2);
  if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "tandem: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}

int main(int argc, char **argv) {
  int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    struct sigaction sa = {0}, old;
    /* only where the default would end us: an ignored signal (nohup's SIGHUP) stays ignored */
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL) {
      sa.sa_handler = on_fatal_signal;
      sigaction(sigs[i], &sa, NULL);
    }
  }
  watch_launcher(); /* a rank of a tandem run that died stops too */
  int rc = dispatch(argc, argv);
  /* Under an address-space limit (ulimit -v) an OpenBLAS worker whose 128 MiB buffer was refused
     retries forever, and exit's join of it never returns: leave without the library destructors
     (every output is closed by now; tandem train refuses such a limit with the sizes first). */
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    fflush(NULL);
    _exit(rc);
  }
  return rc;
}
