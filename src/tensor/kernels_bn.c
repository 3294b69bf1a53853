/* Batch-normalization kernels over (N, C, HW): each runs on the intra-op pool over channels,
 * and each channel's sums run in one fixed order, in double: LANES running sums, value i of each
 * image's plane going to sum i mod LANES, added up in lane order at the end. (One running sum
 * was a chain of dependent adds, 4 cycles a value: 10% of a resnet20 step; the lanes are two
 * vectors of doubles, two chains.) The order depends on the shape alone, never on the thread count. */
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

typedef struct {
  float *out;
  const float *x, *dy, *ry, *w, *b, *mean, *rstd; /* ry: a fused ReLU's output (its mask), or NULL */
  const double *csdy, *csdyx;
  double *s0, *s1, M;
  int64_t N, C, HW;
  int set;  /* bwd_dx writes dx instead of adding to it */
  int relu; /* fwd: max(y, 0) */
} bn_ctx;

#define LANES 16

static double lane_total(const double *l) {
  double t = 0;
  for (int j = 0; j < LANES; j++) t += l[j];
  return t;
}

static void sums_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  const int64_t HW = k->HW, body = HW / LANES * LANES;
  for (int64_t c = c0; c < c1; c++) {
    double s[LANES] = {0}, q[LANES] = {0};
    for (int64_t n = 0; n < k->N; n++) {
      const float *p = k->x + (n * k->C + c) * HW;
      for (int64_t i = 0; i < body; i += LANES)
        for (int j = 0; j < LANES; j++) {
          double v = p[i + j];
          s[j] += v;
          q[j] += v * v;
        }
      for (int64_t i = body; i < HW; i++) {
        double v = p[i];
        s[i - body] += v;
        q[i - body] += v * v;
      }
    }
    k->s0[c] = lane_total(s);
    k->s1[c] = lane_total(q);
  }
}

void tdm_k_bn_sums(const float *x, int64_t N, int64_t C, int64_t HW, double *sum, double *sumsq) {
  bn_ctx k = {.x = x, .s0 = sum, .s1 = sumsq, .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, sums_range, &k);
}

static void fwd_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  for (int64_t c = c0; c < c1; c++) {
    float sc = k->rstd[c] * k->w[c], sh = k->b[c] - k->mean[c] * sc;
    for (int64_t n = 0; n < k->N; n++) {
      const float *p = k->x + (n * k->C + c) * k->HW;
      float *o = k->out + (n * k->C + c) * k->HW;
      if (k->relu)
        for (int64_t i = 0; i < k->HW; i++) {
          float v = p[i] * sc + sh;
          o[i] = v > 0.0f ? v : 0.0f; /* tdm_k_relu_fwd's expression */
        }
      else
        for (int64_t i = 0; i < k->HW; i++) o[i] = p[i] * sc + sh;
    }
  }
}

void tdm_k_bn_fwd(float *y, const float *x, const float *w, const float *b, const float *mean, const float *rstd,
                  int64_t N, int64_t C, int64_t HW, int relu) {
  bn_ctx k = {.out = y, .x = x, .w = w, .b = b, .mean = mean, .rstd = rstd, .N = N, .C = C, .HW = HW, .relu = relu};
  tdm_parallel_for(C, 1, fwd_range, &k);
}

/* dy where a fused ReLU passed it (its output > 0), else 0: tdm_k_relu_bwd_set's expression */
static inline float passed(const float *ry, const float *g, int64_t i) { return ry ? (ry[i] > 0.0f ? g[i] : 0.0f) : g[i]; }

static void bwd_sums_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  const int64_t HW = k->HW, body = HW / LANES * LANES;
  for (int64_t c = c0; c < c1; c++) {
    double s[LANES] = {0}, q[LANES] = {0};
    float m = k->mean[c], r = k->rstd[c];
    for (int64_t n = 0; n < k->N; n++) {
      int64_t o = (n * k->C + c) * HW;
      const float *p = k->x + o, *g = k->dy + o, *ry = k->ry ? k->ry + o : NULL;
      if (ry) /* two loops, so that the common one stays free of the test */
        for (int64_t i = 0; i < body; i += LANES)
          for (int j = 0; j < LANES; j++) {
            float gv = passed(ry, g, i + j);
            s[j] += gv;
            q[j] += (double)gv * (double)((p[i + j] - m) * r);
          }
      else
        for (int64_t i = 0; i < body; i += LANES)
          for (int j = 0; j < LANES; j++) {
            s[j] += g[i + j];
            q[j] += (double)g[i + j] * (double)((p[i + j] - m) * r);
          }
      for (int64_t i = body; i < HW; i++) {
        float gv = passed(ry, g, i);
        s[i - body] += gv;
        q[i - body] += (double)gv * (double)((p[i] - m) * r);
      }
    }
    k->s0[c] = lane_total(s);
    k->s1[c] = lane_total(q);
  }
}

void tdm_k_bn_bwd_sums(const float *dy, const float *relu_y, const float *x, const float *mean, const float *rstd,
                       int64_t N, int64_t C, int64_t HW, double *sdy, double *sdyx) {
  bn_ctx k = {.x = x, .dy = dy, .ry = relu_y, .mean = mean, .rstd = rstd, .s0 = sdy, .s1 = sdyx, .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, bwd_sums_range, &k);
}

static void bwd_dx_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  for (int64_t c = c0; c < c1; c++) {
    float m = k->mean[c], r = k->rstd[c], wr = k->w[c] * r;
    float a = k->M > 0 ? (float)(k->csdy[c] / k->M) : 0.0f, bq = k->M > 0 ? (float)(k->csdyx[c] / k->M) : 0.0f;
    for (int64_t n = 0; n < k->N; n++) {
      int64_t off = (n * k->C + c) * k->HW;
      const float *p = k->x + off, *g = k->dy + off, *ry = k->ry ? k->ry + off : NULL;
      float *o = k->out + off;
      if (ry && k->set)
        for (int64_t i = 0; i < k->HW; i++) o[i] = wr * (passed(ry, g, i) - a - (p[i] - m) * r * bq);
      else if (ry)
        for (int64_t i = 0; i < k->HW; i++) o[i] += wr * (passed(ry, g, i) - a - (p[i] - m) * r * bq);
      else if (k->set)
        for (int64_t i = 0; i < k->HW; i++) o[i] = wr * (g[i] - a - (p[i] - m) * r * bq);
      else
        for (int64_t i = 0; i < k->HW; i++) o[i] += wr * (g[i] - a - (p[i] - m) * r * bq);
    }
  }
}

void tdm_k_bn_bwd_dx(float *dx, const float *dy, const float *relu_y, const float *x, const float *w, const float *mean,
                     const float *rstd, const double *sdy, const double *sdyx, double M, int64_t N, int64_t C, int64_t HW) {
  bn_ctx k = {.out = dx, .x = x, .dy = dy, .ry = relu_y, .w = w, .mean = mean, .rstd = rstd, .csdy = sdy, .csdyx = sdyx,
              .M = M, .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, bwd_dx_range, &k);
}

void tdm_k_bn_bwd_dx_set(float *dx, const float *dy, const float *relu_y, const float *x, const float *w,
                         const float *mean, const float *rstd, const double *sdy, const double *sdyx, double M, int64_t N,
                         int64_t C, int64_t HW) {
  bn_ctx k = {.out = dx, .x = x, .dy = dy, .ry = relu_y, .w = w, .mean = mean, .rstd = rstd, .csdy = sdy, .csdyx = sdyx,
              .M = M, .N = N, .C = C, .HW = HW, .set = 1};
  tdm_parallel_for(C, 1, bwd_dx_range, &k);
}
