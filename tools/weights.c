/* tandem weights-diff A.safetensors B.safetensors [--rtol R]: per tensor, the largest absolute
 * difference relative to the largest magnitude in B. Exit 0 when every tensor is within rtol
 * (default 0: bit-identical), 1 when not, 2 on usage or file errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

int tool_weights_diff(int argc, char **argv) {
  if (argc < 2 || argv[0][0] == '-') {
    fprintf(stderr, "usage: tandem weights-diff A.safetensors B.safetensors [--rtol R] [--quiet]\n");
    return 2;
  }
  double rtol = 0;
  int quiet = 0;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--rtol") && i + 1 < argc) rtol = atof(argv[++i]);
    else if (!strcmp(argv[i], "--quiet")) quiet = 1;
    else {
      fprintf(stderr, "tandem weights-diff: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  tdm_safetensors *a, *b;
  if (tdm_safetensors_load(&a, argv[0]) != TDM_OK || tdm_safetensors_load(&b, argv[1]) != TDM_OK) {
    fprintf(stderr, "tandem weights-diff: %s\n", tdm_last_error());
    return 2;
  }
  int bad = 0, same_names = tdm_safetensors_count(a) == tdm_safetensors_count(b);
  double worst = 0;
  for (int i = 0; i < tdm_safetensors_count(a); i++) {
    const tdm_st_tensor *x = tdm_safetensors_at(a, i), *y = tdm_safetensors_find(b, x->name);
    if (!y || y->nbytes != x->nbytes || x->dtype != TDM_F32 || y->dtype != TDM_F32) {
      fprintf(stderr, "  %s: missing in %s or of another shape / dtype\n", x->name, argv[1]);
      same_names = 0;
      continue;
    }
    const float *p = x->data, *q = y->data;
    double md = 0, mq = 0;
    for (int64_t k = 0; k < x->nbytes / 4; k++) {
      double d = fabs((double)p[k] - (double)q[k]);
      if (!(d <= md)) md = d;
      if (fabs(q[k]) > mq) mq = fabs(q[k]);
    }
    double rel = mq > 0 ? md / mq : md;
    if (!(rel <= worst)) worst = rel;
    if (!(rel <= rtol)) bad = 1;
    if (!quiet) printf("%-40s max |diff| %.3e  relative %.3e%s\n", x->name, md, rel, rel <= rtol ? "" : "  > rtol");
  }
  printf("worst relative difference %.3e (rtol %.1e): %s\n", worst, rtol, bad || !same_names ? "DIFFERENT" : "same");
  tdm_safetensors_destroy(a);
  tdm_safetensors_destroy(b);
  return bad || !same_names ? 1 : 0;
}
