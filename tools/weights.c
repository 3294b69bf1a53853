/* tandem weights-diff A.safetensors B.safetensors [--rtol R] [--quiet]: first the structure (every
 * tensor name in both files, with the same dtype and shape; each difference named), then per
 * tensor the largest absolute difference relative to the largest magnitude in B. Exit 0 when the
 * structure agrees and every tensor is within rtol (default 0: equal values), 1 when not, 2 on
 * usage or file errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

static const char *desc(const tdm_st_tensor *t, char *buf, size_t n) {
  char sh[128];
  snprintf(buf, n, "%s %s", tdm_dtype_name(t->dtype), tdm_shape_str(t->ndim, t->shape, sh, sizeof sh));
  return buf;
}

/* Largest |x - y| and largest finite |y| over two tensors of one dtype and shape, as doubles.
 * Equal bytes count as no difference (so NaN equals NaN there, as "bit-identical" means); a NaN
 * against a number makes the difference NaN, which no tolerance passes. */
static void compare(const tdm_st_tensor *x, const tdm_st_tensor *y, double *max_diff, double *max_mag) {
  enum { CHUNK = 4096 };
  double a[CHUNK], b[CHUNK];
  size_t es = tdm_dtype_size(x->dtype);
  int64_t n = (int64_t)(x->nbytes / (int64_t)es);
  *max_diff = 0, *max_mag = 0;
  for (int64_t i = 0; i < n; i += CHUNK) {
    int64_t k = n - i < CHUNK ? n - i : CHUNK;
    const char *p = (const char *)x->data + i * (int64_t)es, *q = (const char *)y->data + i * (int64_t)es;
    tdm_convert(a, TDM_F64, p, x->dtype, k);
    tdm_convert(b, TDM_F64, q, y->dtype, k);
    for (int64_t j = 0; j < k; j++) {
      double d = memcmp(p + j * (int64_t)es, q + j * (int64_t)es, es) ? fabs(a[j] - b[j]) : 0;
      if (!isnan(*max_diff) && !(d <= *max_diff)) *max_diff = d; /* a NaN, once met, stays */
      if (isfinite(b[j]) && fabs(b[j]) > *max_mag) *max_mag = fabs(b[j]); /* an inf in both would hide every difference */
    }
  }
}

int tool_weights_diff(int argc, char **argv) {
  double rtol;
  int quiet;
  cli_opt opts[] = {
      {"rtol", CLI_FLOAT, &rtol, "0", "largest allowed relative difference per tensor", NULL, 0, 1e300, 0},
      {"quiet", CLI_FLAG, &quiet, NULL, "print only the summary and the differences", NULL, 0, 0, 0},
  };
  const char *usage = "A.safetensors B.safetensors [options]";
  if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
    cli_help(stdout, "weights-diff", usage, opts, 2);
    return 0;
  }
  if (argc < 2 || argv[0][0] == '-' || argv[1][0] == '-') {
    fprintf(stderr, "usage: tandem weights-diff %s\n", usage);
    return 2;
  }
  int pr = cli_parse("weights-diff", usage, opts, 2, argc - 2, argv + 2);
  if (pr) return pr == 1 ? 0 : 2;
  tdm_safetensors *a = NULL, *b = NULL;
  if (tdm_safetensors_load(&a, argv[0]) != TDM_OK || tdm_safetensors_load(&b, argv[1]) != TDM_OK) {
    fprintf(stderr, "tandem weights-diff: %s\n", tdm_last_error());
    tdm_safetensors_destroy(a);
    return 2;
  }
  int structure = 0, values = 0;
  char da[160], db[160];
  for (int i = 0; i < tdm_safetensors_count(b); i++) {
    const tdm_st_tensor *y = tdm_safetensors_at(b, i);
    if (!tdm_safetensors_find(a, y->name)) {
      printf("%s: only in %s (%s)\n", y->name, argv[1], desc(y, db, sizeof db));
      structure = 1;
    }
  }
  double worst = 0;
  for (int i = 0; i < tdm_safetensors_count(a); i++) {
    const tdm_st_tensor *x = tdm_safetensors_at(a, i), *y = tdm_safetensors_find(b, x->name);
    if (!y) {
      printf("%s: only in %s (%s)\n", x->name, argv[0], desc(x, da, sizeof da));
      structure = 1;
      continue;
    }
    if (x->dtype != y->dtype || x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim)) {
      printf("%s: %s in %s, %s in %s\n", x->name, desc(x, da, sizeof da), argv[0], desc(y, db, sizeof db), argv[1]);
      structure = 1;
      continue;
    }
    double md, mq;
    compare(x, y, &md, &mq);
    double rel = mq > 0 ? md / mq : md;
    if (!isnan(worst) && !(rel <= worst)) worst = rel; /* a NaN stays */
    if (!(rel <= rtol)) values = 1;
    if (!quiet || !(rel <= rtol))
      printf("%-40s max |diff| %.3e  relative %.3e%s\n", x->name, md, rel, rel <= rtol ? "" : "  > rtol");
  }
  printf("worst relative difference %.3e (rtol %.1e)%s: %s\n", worst, rtol,
         structure ? "; names, dtypes or shapes differ" : "", structure || values ? "DIFFERENT" : "same");
  tdm_safetensors_destroy(a);
  tdm_safetensors_destroy(b);
  return structure || values ? 1 : 0;
}
