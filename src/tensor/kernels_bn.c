/* Batch-normalization kernels over (N, C, HW): each runs on the intra-op pool over channels,
 * and each channel's sums run in one fixed order: LANES running sums in float, value i of an
 * image's plane going to sum i mod LANES (its tail to the last lanes), flushed into LANES double
 * sums after every FLUSH / LANES values a lane took, the doubles added up in lane order at the
 * end. (One running sum was a chain of dependent adds, 4 cycles a value: 10% of a resnet20 step;
 * double lanes throughout converted every value, three times the instructions: the backward's
 * sums ran 2-3x slower than now.) A float partial holds at most FLUSH / LANES values, so its
 * rounding stays near float's own (test_resnet: within 4e-6 of the terms' magnitudes). The order
 * depends on the shape alone, never on the thread count. */
#include <stdint.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"

typedef struct {
  float *out;
  const float *x, *dy, *w, *b, *mean, *rstd;
  const double *csdy, *csdyx;
  double *s0, *s1, M;
  int64_t N, C, HW;
  int set;  /* bwd_dx writes dx instead of adding to it */
  int relu; /* fwd: max(y, 0); backward: dy masked where that ReLU gave 0 */
  const float *r; /* fwd_add_relu: relu(bn(x) + r) */
} bn_ctx;

#define LANES 32 /* four vectors of 8: four independent chains of adds (two waited on the add's latency) */
#define FLUSH 1024 /* values summed in float between flushes into the doubles: FLUSH / LANES a lane */

static double lane_total(const double *l) {
  double t = 0;
  for (int j = 0; j < LANES; j++) t += l[j];
  return t;
}

/* LANES floats as NV vectors of 8 (GCC's and Clang's vector extension: one AVX2 register each,
 * or what the target has; one vector of 16 was lowered through the stack); loads of any
 * alignment. */
#define NV (LANES / 8)
typedef float v8 __attribute__((vector_size(8 * sizeof(float)), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(8 * sizeof(float)), aligned(4)));
typedef struct {
  v8 v[NV];
} lanes;

static inline lanes at(const float *p) {
  lanes r;
  for (int j = 0; j < NV; j++) r.v[j] = *(const v8 *)(p + 8 * j);
  return r;
}
static inline lanes add(lanes a, lanes b) {
  for (int j = 0; j < NV; j++) a.v[j] += b.v[j];
  return a;
}
static inline lanes mul(lanes a, lanes b) {
  for (int j = 0; j < NV; j++) a.v[j] *= b.v[j];
  return a;
}
/* (x - m) r, lane by lane */
static inline lanes centred(lanes x, float m, float r) {
  for (int j = 0; j < NV; j++) x.v[j] = (x.v[j] - m) * r;
  return x;
}
/* lanes with a mask of -1 (kept) or 0 (zeroed) */
static inline lanes masked(lanes x, const int32_t *k) {
  for (int j = 0; j < NV; j++) x.v[j] = (v8)((v8i)x.v[j] & *(const v8i *)(k + 8 * j));
  return x;
}
/* The forward's value before its ReLU, x sc + sh: written once here, for the forward and for
 * the backward's mask, so the two round alike (one FMA where the target has it, bit for bit). */
static inline float affine(float x, float sc, float sh) { return x * sc + sh; }
static inline lanes affine_v(lanes x, float sc, float sh) {
  for (int j = 0; j < NV; j++) x.v[j] = x.v[j] * sc + sh;
  return x;
}
/* passed() on LANES values: dy where the ReLU's input v > 0 (its output was v, not 0), else +0 */
static inline lanes passed_v(lanes v, lanes g) {
  for (int j = 0; j < NV; j++) g.v[j] = (v8)((v8i)g.v[j] & (v.v[j] > (v8){0}));
  return g;
}

_Static_assert(LANES == 32, "tail()'s mask table holds 32 lanes");

/* The tail of a plane, values [body, HW): where the plane has LANES values or more, the last
 * LANES of it with the lanes that the body summed zeroed (value i in lane i - (HW - LANES)), else
 * the whole plane from lane 0. (Through an array on the stack each tail cost a store-forwarding
 * stall: at 7x7, a third of the time.) */
#define Z8 0, 0, 0, 0, 0, 0, 0, 0
#define K8 -1, -1, -1, -1, -1, -1, -1, -1
static const int32_t keep[2 * LANES] = {Z8, Z8, Z8, Z8, K8, K8, K8, K8}; /* LANES zeros, then LANES -1s */

static inline lanes tail(const float *p, int64_t body, int64_t HW) {
  if (HW >= LANES) return masked(at(p + HW - LANES), keep + (HW - body)); /* HW - body lanes from the end kept */
  float t[LANES] = {0};
  for (int64_t i = 0; i < HW; i++) t[i] = p[i];
  return at(t);
}

/* d[j] += f[j]; returns zeros, the lanes' next start (by value: with f's address taken, the
 * compiler kept the lanes in memory, a store of each every iteration) */
static inline lanes flush(double *d, lanes f) {
  for (int j = 0; j < LANES; j++) d[j] += f.v[j / 8][j % 8];
  return (lanes){0};
}

static void sums_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  const int64_t HW = k->HW, body = HW / LANES * LANES;
  for (int64_t c = c0; c < c1; c++) {
    double s[LANES] = {0}, q[LANES] = {0};
    lanes fs = {0}, fq = {0};
    int64_t cnt = 0; /* values in each float lane since the last flush */
    for (int64_t n = 0; n < k->N; n++) {
      const float *p = k->x + (n * k->C + c) * HW;
      for (int64_t i = 0; i < body; i += LANES) {
        lanes v = at(p + i);
        fs = add(fs, v), fq = add(fq, mul(v, v));
        if (++cnt == FLUSH / LANES) fs = flush(s, fs), fq = flush(q, fq), cnt = 0;
      }
      if (body < HW) {
        lanes v = tail(p, body, HW);
        fs = add(fs, v), fq = add(fq, mul(v, v));
        if (++cnt == FLUSH / LANES) fs = flush(s, fs), fq = flush(q, fq), cnt = 0;
      }
    }
    fs = flush(s, fs), fq = flush(q, fq);
    k->s0[c] = lane_total(s);
    k->s1[c] = lane_total(q);
  }
}

void tdm_k_bn_sums(const float *x, int64_t N, int64_t C, int64_t HW, double *sum, double *sumsq) {
  bn_ctx k = {.x = x, .s0 = sum, .s1 = sumsq, .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, sums_range, &k);
}

/* The forward's scale and shift of channel c: y = x sc + sh. */
static inline void scale_shift(const bn_ctx *k, int64_t c, float *sc, float *sh) {
  *sc = k->rstd[c] * k->w[c];
  *sh = k->b[c] - k->mean[c] * *sc;
}

static void fwd_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  for (int64_t c = c0; c < c1; c++) {
    float sc, sh;
    scale_shift(k, c, &sc, &sh);
    for (int64_t n = 0; n < k->N; n++) {
      const float *p = k->x + (n * k->C + c) * k->HW;
      float *o = k->out + (n * k->C + c) * k->HW;
      if (k->r) { /* tdm_k_add_relu's expression on the normalised value and r */
        const float *q = k->r + (n * k->C + c) * k->HW;
        for (int64_t i = 0; i < k->HW; i++) {
          float v = affine(p[i], sc, sh) + q[i];
          o[i] = v > 0.0f ? v : 0.0f;
        }
      } else if (k->relu)
        for (int64_t i = 0; i < k->HW; i++) {
          float v = affine(p[i], sc, sh);
          o[i] = v > 0.0f ? v : 0.0f; /* tdm_k_relu_fwd's expression */
        }
      else
        for (int64_t i = 0; i < k->HW; i++) o[i] = affine(p[i], sc, sh);
    }
  }
}

void tdm_k_bn_fwd(float *y, const float *x, const float *w, const float *b, const float *mean, const float *rstd,
                  int64_t N, int64_t C, int64_t HW, int relu) {
  bn_ctx k = {.out = y, .x = x, .w = w, .b = b, .mean = mean, .rstd = rstd, .N = N, .C = C, .HW = HW, .relu = relu};
  tdm_parallel_for(C, 1, fwd_range, &k);
}

void tdm_k_bn_fwd_add_relu(float *y, const float *x, const float *r, const float *w, const float *b, const float *mean,
                           const float *rstd, int64_t N, int64_t C, int64_t HW) {
  bn_ctx k = {.out = y, .x = x, .r = r, .w = w, .b = b, .mean = mean, .rstd = rstd, .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, fwd_range, &k);
}

/* dy where a fused ReLU passed it (its input v > 0, so its output v > 0), else 0:
 * tdm_k_relu_bwd_set's expression. The mask comes from x, which the backward reads anyway: the
 * ReLU's output was a third tensor read by each of the two passes (a quarter and a third of
 * their traffic). */
static inline float passed(float v, float g) { return v > 0.0f ? g : 0.0f; }

static void bwd_sums_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  const int64_t HW = k->HW, body = HW / LANES * LANES;
  for (int64_t c = c0; c < c1; c++) {
    double s[LANES] = {0}, q[LANES] = {0};
    lanes fs = {0}, fq = {0};
    float m = k->mean[c], r = k->rstd[c], sc = 0.0f, sh = 0.0f;
    if (k->relu) scale_shift(k, c, &sc, &sh);
    int64_t cnt = 0; /* values in each float lane since the last flush */
    for (int64_t n = 0; n < k->N; n++) {
      int64_t o = (n * k->C + c) * HW;
      const float *p = k->x + o, *g = k->dy + o;
      for (int64_t i = 0; i < body; i += LANES) {
        lanes xv = at(p + i), gv = at(g + i);
        if (k->relu) gv = passed_v(affine_v(xv, sc, sh), gv);
        fs = add(fs, gv), fq = add(fq, mul(gv, centred(xv, m, r)));
        if (++cnt == FLUSH / LANES) fs = flush(s, fs), fq = flush(q, fq), cnt = 0;
      }
      if (body < HW) {
        lanes xv = tail(p, body, HW), gv = tail(g, body, HW);
        if (k->relu) gv = passed_v(affine_v(xv, sc, sh), gv); /* (the lanes outside the tail: dy's zeros) */
        fs = add(fs, gv), fq = add(fq, mul(gv, centred(xv, m, r)));
        if (++cnt == FLUSH / LANES) fs = flush(s, fs), fq = flush(q, fq), cnt = 0;
      }
    }
    fs = flush(s, fs), fq = flush(q, fq);
    k->s0[c] = lane_total(s);
    k->s1[c] = lane_total(q);
  }
}

void tdm_k_bn_bwd_sums(const float *dy, const float *x, const float *w, const float *b, const float *mean,
                       const float *rstd, int relu, int64_t N, int64_t C, int64_t HW, double *sdy, double *sdyx) {
  bn_ctx k = {.x = x, .dy = dy, .w = w, .b = b, .mean = mean, .rstd = rstd, .relu = relu, .s0 = sdy, .s1 = sdyx,
              .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, bwd_sums_range, &k);
}

static void bwd_dx_range(void *vc, int64_t c0, int64_t c1) {
  bn_ctx *k = vc;
  for (int64_t c = c0; c < c1; c++) {
    float m = k->mean[c], r = k->rstd[c], wr = k->w[c] * r, sc = 0.0f, sh = 0.0f;
    float a = k->M > 0 ? (float)(k->csdy[c] / k->M) : 0.0f, bq = k->M > 0 ? (float)(k->csdyx[c] / k->M) : 0.0f;
    if (k->relu) scale_shift(k, c, &sc, &sh);
    for (int64_t n = 0; n < k->N; n++) {
      int64_t off = (n * k->C + c) * k->HW;
      const float *p = k->x + off, *g = k->dy + off;
      float *o = k->out + off;
      if (k->relu && k->set)
        for (int64_t i = 0; i < k->HW; i++) o[i] = wr * (passed(affine(p[i], sc, sh), g[i]) - a - (p[i] - m) * r * bq);
      else if (k->relu)
        for (int64_t i = 0; i < k->HW; i++) o[i] += wr * (passed(affine(p[i], sc, sh), g[i]) - a - (p[i] - m) * r * bq);
      else if (k->set)
        for (int64_t i = 0; i < k->HW; i++) o[i] = wr * (g[i] - a - (p[i] - m) * r * bq);
      else
        for (int64_t i = 0; i < k->HW; i++) o[i] += wr * (g[i] - a - (p[i] - m) * r * bq);
    }
  }
}

void tdm_k_bn_bwd_dx(float *dx, const float *dy, const float *x, const float *w, const float *b, const float *mean,
                     const float *rstd, int relu, const double *sdy, const double *sdyx, double M, int64_t N, int64_t C,
                     int64_t HW) {
  bn_ctx k = {.out = dx, .x = x, .dy = dy, .w = w, .b = b, .mean = mean, .rstd = rstd, .relu = relu, .csdy = sdy,
              .csdyx = sdyx, .M = M, .N = N, .C = C, .HW = HW};
  tdm_parallel_for(C, 1, bwd_dx_range, &k);
}

void tdm_k_bn_bwd_dx_set(float *dx, const float *dy, const float *x, const float *w, const float *b, const float *mean,
                         const float *rstd, int relu, const double *sdy, const double *sdyx, double M, int64_t N,
                         int64_t C, int64_t HW) {
  bn_ctx k = {.out = dx, .x = x, .dy = dy, .w = w, .b = b, .mean = mean, .rstd = rstd, .relu = relu, .csdy = sdy,
              .csdyx = sdyx, .M = M, .N = N, .C = C, .HW = HW, .set = 1};
  tdm_parallel_for(C, 1, bwd_dx_range, &k);
}
