/* topk:RATIO — each rank sends the k = ceil(RATIO x n) values of largest magnitude of its bucket
 * (gradient plus residual) with their offsets in the bucket: k f32 values, then k offsets of 3
 * bytes (buckets of up to 2^24 values; 4 bytes beyond), so 7k bytes a bucket, 4 / (7 RATIO) times
 * fewer than f32 (topk:0.01: 57x; with 4-byte offsets, 8k bytes, k rounded up per bucket fell just
 * short of 50x). The ranks all-gather them and every rank adds the sparse parts in rank order, then
 * divides by the rank count. The rest stays in the residual for the next step (error feedback). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/compress.h"

typedef struct {
  int64_t n, k;
  int iw;       /* bytes an offset takes on the wire: 3, or 4 for buckets of more than 2^24 values */
  float *resid; /* n: after a step, what this rank has not sent yet */
  float *mag;   /* n: scratch for the selection */
  unsigned char *send, *recv; /* k (4 + iw) bytes (k f32 values, then k offsets); recv: P x that */
  int recv_ranks;
  int n_mats;
  const tdm__cmat *mats; /* the wrapper's, sorted by offset: for the check's weights */
} topk;

static tdm_status parse(const char *spec, const char *arg, double *value) {
  char *end = NULL;
  double v = strtod(arg, &end);
  if (!*arg || !end || *end || !isfinite(v))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "compress '%s': the ratio '%s' is not a number; expected topk:RATIO with 0 < RATIO <= 1",
                          spec, arg);
  if (!(v > 0 && v <= 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "compress '%s': the ratio %g is out of range; expected topk:RATIO with 0 < RATIO <= 1 (the share of "
                          "each bucket's values sent)", spec, v);
  *value = v;
  return TDM_OK;
}

static void destroy(void *vs) {
  topk *t = vs;
  if (!t) return;
  tdm__free(t->resid);
  tdm__free(t->mag);
  tdm__free(t->send);
  tdm__free(t->recv);
  tdm__free(t);
}

static tdm_status create(void **out, double ratio, int64_t n, int n_mats, const tdm__cmat *mats, uint64_t seed) {
  (void)seed;
  topk *t = tdm__calloc(1, sizeof *t);
  if (!t) return tdm__set_error(TDM_ERR_NO_MEMORY, "topk: out of memory");
  t->n = n;
  t->k = (int64_t)ceil(ratio * (double)n - 1e-9); /* 0.01 x 100 is 1, not 2 */
  if (t->k < 1) t->k = 1;
  if (t->k > n) t->k = n;
  if (t->k > INT32_MAX || n > INT32_MAX) {
    destroy(t);
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "topk: a bucket of %lld values; indices are 32-bit (use smaller --bucket-mb)", (long long)n);
  }
  t->n_mats = n_mats, t->mats = mats;
  t->resid = tdm__calloc((size_t)(n ? n : 1), sizeof(float));
  t->mag = tdm__malloc(sizeof(float) * (size_t)(n ? n : 1));
  t->iw = n <= ((int64_t)1 << 24) ? 3 : 4;
  t->send = tdm__malloc_cat((size_t)t->k * (size_t)(4 + t->iw), TDM_MEM_COMM);
  if (!t->resid || !t->mag || !t->send) {
    destroy(t);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "topk: out of memory");
  }
  *out = t;
  return TDM_OK;
}

static float mag(float x) { return isnan(x) ? INFINITY : fabsf(x); }

/* The (0-based) k-th smallest of a[0..n) (a is permuted): Hoare's selection. */
static float kth_smallest(float *a, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi]; /* median of three */
    float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) {
        float s = a[i];
        a[i] = a[j], a[j] = s;
        i++, j--;
      }
    }
    if (k <= j) hi = j;
    else if (k >= i) lo = i;
    else return a[k];
  }
  return a[k];
}

/* The k-th largest magnitude of acc, exactly. A strided sample of 4096 magnitudes gives a lower
 * bound that about 2k + 8 / 4096 of the values pass; the selection then runs on those candidates
 * only (the k-th largest of all is the k-th largest of the values above any bound that at least k
 * pass). When fewer than k pass, on the whole bucket. */
static float kth_largest(topk *t, const float *acc) {
  int64_t n = t->n, k = t->k, c = 0;
  enum { S = 4096 };
  if (n > 4 * S && k < n / 8) {
    float *smp = t->mag;
    for (int64_t j = 0; j < S; j++) smp[j] = mag(acc[j * (n / S) + (j * 7919) % (n / S)]);
    int64_t q = 2 * (k * S + n - 1) / n + 8; /* the sample's q-th largest */
    float lo = kth_smallest(smp, S, S - q);
    for (int64_t i = 0; i < n; i++) {
      float a = mag(acc[i]);
      if (a >= lo) t->mag[c++] = a;
    }
    if (c >= k) return kth_smallest(t->mag, c, c - k);
  }
  for (int64_t i = 0; i < n; i++) t->mag[i] = mag(acc[i]);
  return kth_smallest(t->mag, n, n - k);
}

static tdm_status reduce(void *vs, tdm_comm_t c, float *g, tdm__csent *sent) {
  topk *t = vs;
  int64_t n = t->n, k = t->k;
  float *acc = t->resid;
  for (int64_t i = 0; i < n; i++) acc[i] += g[i];
  float thr = kth_largest(t, acc);
  int64_t above = 0;
  for (int64_t i = 0; i < n; i++) above += mag(acc[i]) > thr;
  /* the values above the threshold, then those equal to it in index order: exactly k */
  const size_t entry = 4 + (size_t)t->iw, iw = (size_t)t->iw;
  float *val = (float *)t->send; /* then the offsets, little-endian, iw bytes each */
  unsigned char *off = t->send + 4 * (size_t)k;
  int64_t j = 0, ties = k - above;
  double s = 0, ws = 0, wa = 0;
  int m = 0;
  for (int64_t i = 0; i < n && j < k; i++) {
    float a = mag(acc[i]);
    if (!(a > thr || (a == thr && ties > 0))) continue;
    if (!(a > thr)) ties--;
    val[j] = acc[i];
    for (size_t b = 0; b < iw; b++) off[(size_t)j * iw + b] = (unsigned char)((uint64_t)i >> (8 * b));
    while (m + 1 < t->n_mats && t->mats[m + 1].off <= i) m++;
    int64_t f = i - t->mats[m].off;
    double w = tdm__cw_row(f / t->mats[m].cols) * tdm__cw_col(f % t->mats[m].cols);
    s += val[j], ws += w * val[j], wa += w * fabs((double)val[j]);
    acc[i] = 0; /* sent: nothing of it is left */
    j++;
  }
  sent->sum = s, sent->wsum = ws, sent->abs = wa, sent->payload = (uint64_t)k * entry;
  int P = c ? tdm_comm_size(c) : 1;
  const unsigned char *all = t->send;
  if (P > 1) {
    if (t->recv_ranks != P) {
      tdm__free(t->recv);
      if (!(t->recv = tdm__malloc_cat((size_t)k * entry * (size_t)P, TDM_MEM_COMM))) {
        t->recv_ranks = 0;
        return tdm__set_error(TDM_ERR_NO_MEMORY, "topk: out of memory");
      }
      t->recv_ranks = P;
    }
    TDM__TRY(tdm_comm_allgather(c, t->send, t->recv, (size_t)k * entry, TDM_U8, TDM_ALGO_AUTO));
    all = t->recv;
  }
  /* the sum in rank order: the same bits on every rank */
  memset(g, 0, sizeof(float) * (size_t)n);
  for (int r = 0; r < P; r++) {
    const unsigned char *rv = all + (size_t)r * entry * (size_t)k, *ro = rv + 4 * (size_t)k; /* any alignment */
    for (int64_t q = 0; q < k; q++) {
      uint64_t i = 0;
      for (size_t b = 0; b < iw; b++) i |= (uint64_t)ro[(size_t)q * iw + b] << (8 * b);
      if (i >= (uint64_t)n)
        return tdm__set_error(TDM_ERR_REMOTE, "topk: rank %d sent offset %llu for a bucket of %lld values", r, (unsigned long long)i,
                              (long long)n);
      float v;
      memcpy(&v, rv + 4 * (size_t)q, 4);
      g[i] += v;
    }
  }
  if (P > 1)
    for (int64_t i = 0; i < n; i++) g[i] /= (float)P;
  return TDM_OK;
}

static const float *residual(const void *vs) { return ((const topk *)vs)->resid; }

const tdm__compressor_ops tdm__compress_topk_ops = {"topk", "topk:RATIO with 0 < RATIO <= 1", parse, create, destroy, reduce, residual, NULL};
