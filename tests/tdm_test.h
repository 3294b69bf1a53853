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
