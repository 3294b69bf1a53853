/* tandem train under an elastic launcher: the batch at this round's world size (run.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "run.h"

int run_elastic_batch(tdm_train_config *c) {
  const char *mode = getenv("TANDEM_ELASTIC_BATCH"), *full = getenv("TANDEM_ELASTIC_FULL_WORLD"), *ws = getenv("WORLD_SIZE");
  if (!mode || !*mode) return 0;
  int64_t F, W;
  if (!full || cli_parse_int(full, 1, 1 << 20, &F) || !ws || cli_parse_int(ws, 1, 1 << 20, &W)) {
    fprintf(stderr, "tandem train: TANDEM_ELASTIC_BATCH=%s needs TANDEM_ELASTIC_FULL_WORLD and WORLD_SIZE, whole numbers "
                    "in 1..2^20 (given '%s' and '%s'; tandem run --nnodes MIN:MAX sets them)\n", mode, full ? full : "",
            ws ? ws : "");
    return 2;
  }
  int64_t B = c->batch_size, K = c->engine.accum > 1 ? c->engine.accum : 1;
  if (!strcmp(mode, "keep")) {
    if ((K * F) % W) {
      fprintf(stderr, "tandem train: --elastic-batch keep: the global batch %lld (%lld ranks x batch %lld x accum %lld, the "
                      "full job) cannot be kept at world size %lld: accumulation %lld x %lld / %lld is not a whole number; "
                      "choose an --accum that works at every world size, or --elastic-batch scale-lr\n",
              (long long)(F * B * K), (long long)F, (long long)B, (long long)K, (long long)W, (long long)K, (long long)F,
              (long long)W);
      return 2;
    }
    c->engine.accum = K * F / W;
    fprintf(stderr, "tandem train: --elastic-batch keep: world size %lld of %lld: accumulation %lld (given %lld), global "
                    "batch %lld = %lld ranks x batch %lld x accum %lld, lr %g\n", (long long)W, (long long)F,
            (long long)c->engine.accum, (long long)K, (long long)(W * B * c->engine.accum), (long long)W, (long long)B,
            (long long)c->engine.accum, c->lr);
    return 0;
  }
  if (!strcmp(mode, "scale-lr")) { /* Goyal et al. 2017: the learning rate follows the global batch */
    double lr0 = c->lr;
    c->lr = lr0 * (double)W / (double)F;
    if (c->resume) { /* the checkpoint's global batch may be another round's */
      static char ov[512];
      if (!c->resume_override || !*c->resume_override) snprintf(ov, sizeof ov, "batch");
      else if (!strstr(c->resume_override, "batch")) snprintf(ov, sizeof ov, "%.400s,batch", c->resume_override);
      else snprintf(ov, sizeof ov, "%.500s", c->resume_override);
      c->resume_override = ov;
    }
    fprintf(stderr, "tandem train: --elastic-batch scale-lr: world size %lld of %lld: global batch %lld = %lld ranks x batch "
                    "%lld x accum %lld (the full job's %lld), lr %g (given %g, for the full job)\n", (long long)W,
            (long long)F, (long long)(W * B * K), (long long)W, (long long)B, (long long)K, (long long)(F * B * K), c->lr,
            lr0);
    return 0;
  }
  fprintf(stderr, "tandem train: TANDEM_ELASTIC_BATCH is '%s'; expected keep or scale-lr\n", mode);
  return 2;
}
