/* A minimal test harness: CHECK records a failure with file:line and goes on; each test
 * function is one case; main prints "N passed, N failed" and exits non-zero on any failure. */
#ifndef TDM_TEST_H
#define TDM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"
#include "core/internal.h" /* tdm__malloc_count for the allocation tests */

static _Atomic int tdm_test_failures_; /* CHECK may run on several threads */

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
      tdm_test_failures_++;                                                \
    }                                                                      \
  } while (0)

#define CHECK_MSG(cond, ...)                                               \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
      tdm_test_failures_++;                                                \
    }                                                                      \
  } while (0)

#define CHECK_OK(expr)                                                                     \
  do {                                                                                     \
    tdm_status st_ = (expr);                                                               \
    if (st_ != TDM_OK) {                                                                   \
      fprintf(stderr, "  FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,           \
              tdm_status_str(st_), tdm_last_error());                                      \
      tdm_test_failures_++;                                                                \
    }                                                                                      \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                              \
  do {                                                                                     \
    double a_ = (a), b_ = (b);                                                             \
    if (!(fabs(a_ - b_) <= (tol))) {                                                       \
      fprintf(stderr, "  FAIL %s:%d: %s = %.9g, %s = %.9g (tolerance %g)\n", __FILE__,     \
              __LINE__, #a, a_, #b, b_, (double)(tol));                                    \
      tdm_test_failures_++;                                                                \
    }                                                                                      \
  } while (0)

/* The error detail contains the given text. */
#define CHECK_ERR_HAS(text)                                                                 \
  CHECK_MSG(strstr(tdm_last_error(), (text)) != NULL, "error '%s' lacks '%s'", tdm_last_error(), (text))

typedef struct {
  const char *name;
  void (*fn)(void);
} tdm_test_case;

/* The sanitizer pass of make test (TANDEM_TEST_LIGHT set by CTest, as for the shell tests) leaves
 * out a slow test's repetitions; TANDEM_TEST_FULL=1 (make test-san-full) runs them. */
static inline int tdm_test_light(void) {
  const char *l = getenv("TANDEM_TEST_LIGHT"), *f = getenv("TANDEM_TEST_FULL");
  return l && *l && !(f && !strcmp(f, "1"));
}

static inline int tdm_test_main(const tdm_test_case *cases, int n) {
  int passed = 0, failed = 0;
  for (int i = 0; i < n; i++) {
    int before = tdm_test_failures_;
    double t0 = tdm_time_now(); /* each case's wall time: what to trim when make test grows */
    cases[i].fn();
    double dt = tdm_time_now() - t0;
    if (tdm_test_failures_ == before) {
      passed++;
      printf("ok   %s (%.2f s)\n", cases[i].name, dt);
    } else {
      failed++;
      printf("FAIL %s (%.2f s)\n", cases[i].name, dt);
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

#define TDM_TEST_MAIN(...)                                             \
  int main(void) {                                                     \
    static const tdm_test_case cases_[] = {__VA_ARGS__};               \
    return tdm_test_main(cases_, (int)(sizeof cases_ / sizeof cases_[0])); \
  }
#define T(fn) {#fn, fn}

/* max |a - b| over n floats; infinity where either holds a NaN (fmax would drop it, and a kernel
 * writing NaN would pass every tolerance). */
static inline double tdm_test_max_abs_diff(const float *a, const float *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (d != d) return INFINITY;
    if (d > m) m = d;
  }
  return m;
}

/* p[0..n) = scale x standard normal draws of a generator seeded with seed. */
static inline void tdm_test_fill_normal(float *p, int64_t n, uint64_t seed, float scale) {
  tdm_rng r;
  tdm_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) p[i] = scale * tdm_rng_normal(&r);
}

/* A convolution from a row {N, Ci, H, W, Co, K, stride, pad}, its output size derived. */
static inline tdm_conv_shape tdm_test_conv_shape(const int64_t k[8]) {
  tdm_conv_shape s = {k[0], k[1], k[2], k[3], k[4], k[5], k[5], k[6], k[7], 0, 0};
  s.OH = (s.H + 2 * s.pad - s.KH) / s.stride + 1;
  s.OW = (s.W + 2 * s.pad - s.KW) / s.stride + 1;
  return s;
}

/* A convolution case for the kernel tests: normal inputs (x, dy and b of scale 1, w of 0.3, from
 * seeds seed .. seed + 3), the per-image im2col reference's output and gradients, and the
 * tolerance the kernels are held to, 1e-4 sqrt(fan-in + output pixels). */
typedef struct {
  tdm_conv_shape s;
  int64_t nx, nw, ny;
  float *x, *w, *b, *dy;  /* inputs */
  float *y, *dx, *dw, *db; /* the reference's */
  double tol;
} tdm_test_conv_ref;

static inline void tdm_test_conv_ref_init(tdm_test_conv_ref *r, const int64_t k[8], uint64_t seed) {
  tdm_conv_shape s = r->s = tdm_test_conv_shape(k);
  r->nx = s.N * s.Ci * s.H * s.W, r->nw = s.Co * s.Ci * s.KH * s.KW, r->ny = s.N * s.Co * s.OH * s.OW;
  r->x = malloc(sizeof(float) * r->nx), r->w = malloc(sizeof(float) * r->nw), r->b = malloc(sizeof(float) * s.Co);
  r->dy = malloc(sizeof(float) * r->ny), r->y = malloc(sizeof(float) * r->ny);
  r->dx = calloc(r->nx, sizeof(float)), r->dw = calloc(r->nw, sizeof(float)), r->db = calloc(s.Co, sizeof(float));
  float *col = malloc(sizeof(float) * s.Ci * s.KH * s.KW * s.OH * s.OW);
  tdm_test_fill_normal(r->x, r->nx, seed, 1), tdm_test_fill_normal(r->w, r->nw, seed + 1, 0.3f);
  tdm_test_fill_normal(r->b, s.Co, seed + 2, 1), tdm_test_fill_normal(r->dy, r->ny, seed + 3, 1);
  tdm_k_conv2d_fwd(r->y, r->x, r->w, r->b, col, &s);
  tdm_k_conv2d_bwd(r->dx, r->dw, r->db, r->dy, r->x, r->w, col, &s);
  free(col);
  r->tol = 1e-4 * sqrt((double)(s.Ci * s.KH * s.KW + s.N * s.OH * s.OW));
}

static inline void tdm_test_conv_ref_free(tdm_test_conv_ref *r) {
  free(r->x), free(r->w), free(r->b), free(r->dy), free(r->y), free(r->dx), free(r->dw), free(r->db);
}

/* max |a - b| / (atol + rtol |b|) over n floats: <= 1 means within tolerance. */
static inline double tdm_test_rel_err(const float *a, const float *b, int64_t n, double atol, double rtol,
                                      double *max_abs) {
  double worst = 0, mabs = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    double r = d / (atol + rtol * fabs((double)b[i]));
    if (!(r <= worst)) worst = r; /* NaN makes it fail */
    if (d > mabs) mabs = d;
  }
  if (max_abs) *max_abs = mabs;
  return worst;
}

#endif
