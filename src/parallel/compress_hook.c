/* The compressors' table, the spec parser, and the wrapper dp.c drives: per bucket it runs the
 * compressor, checks that error feedback telescopes and records the stats (parallel/compress.h). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/compress.h"

/* ---- the table: one row per compressor --------------------------------------------------------- */
static const tdm__compressor_ops *const compressors[] = {&tdm__compress_topk_ops, &tdm__compress_powersgd_ops};
#define N_COMPRESSORS ((int)(sizeof compressors / sizeof compressors[0]))

static tdm_status expected(const char *spec) {
  char forms[256] = "none, bf16, fp16";
  for (int i = 0; i < N_COMPRESSORS; i++) {
    size_t l = strlen(forms);
    snprintf(forms + l, sizeof forms - l, ", %s", compressors[i]->form);
  }
  return tdm__set_error(TDM_ERR_INVALID_ARG, "compress '%s': unknown; expected one of %s", spec, forms);
}

/* -1 for none/bf16/fp16, else the row; *value the parsed argument. */
static tdm_status parse(const char *spec, int *row, double *value) {
  *row = -1;
  if (!spec || !strcmp(spec, "none") || !strcmp(spec, "bf16") || !strcmp(spec, "fp16")) return TDM_OK;
  const char *colon = strchr(spec, ':');
  size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
  for (int i = 0; i < N_COMPRESSORS; i++)
    if (strlen(compressors[i]->name) == len && !strncmp(spec, compressors[i]->name, len)) {
      if (!colon)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "compress '%s': no argument; expected %s", spec, compressors[i]->form);
      *row = i;
      return compressors[i]->parse(spec, colon + 1, value);
    }
  return expected(spec);
}

tdm_status tdm_compress_check(const char *spec) {
  int row;
  double v;
  return parse(spec, &row, &v);
}

int tdm_compress_is_hook(const char *spec) {
  int row;
  double v;
  return parse(spec, &row, &v) == TDM_OK && row >= 0;
}

/* ---- weights of the telescoping check ------------------------------------------------------------ */
double tdm__cw_row(int64_t i) { return 1.0 + (double)(tdm_hash64(0x726f77, (uint64_t)i) >> 54) / 1024.0; }
double tdm__cw_col(int64_t j) { return 1.0 + (double)(tdm_hash64(0x636f6c, (uint64_t)j) >> 54) / 1024.0; }

/* ---- the wrapper ---------------------------------------------------------------------------------- */
typedef struct {
  void *state;
  int64_t n;
  int n_mats;
  tdm__cmat *mats;
  double g_sum, g_wsum;       /* Σ over steps of the gradients, plain and weighted */
  double sent_sum, sent_wsum; /* Σ over steps of what was sent */
  double tol, scale;          /* rounding allowed so far; Σ weighted |g| (for the relative figure) */
} cbucket;

struct tdm__compress {
  const tdm__compressor_ops *ops;
  double value;
  int64_t start;
  uint64_t seed;
  char name[64];
  cbucket *b;
  tdm_compress_stats *stats;
  int nb, cap, have_stats;
  double *wr, *wc;     /* the check's weights, by row and by column, for the largest matrix */
  int64_t nwr, nwc;
};

static tdm_status weights(double **w, int64_t *have, int64_t need, double (*f)(int64_t)) {
  if (need <= *have) return TDM_OK;
  double *n = tdm__malloc(sizeof(double) * (size_t)need);
  if (!n) return tdm__set_error(TDM_ERR_NO_MEMORY, "compress: out of memory");
  for (int64_t i = 0; i < need; i++) n[i] = f(i);
  tdm__free(*w);
  *w = n, *have = need;
  return TDM_OK;
}

tdm_status tdm__compress_create(tdm__compress **out, const char *spec, int64_t start, uint64_t seed) {
  *out = NULL;
  int row;
  double v;
  TDM__TRY(parse(spec, &row, &v));
  if (row < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "compress '%s': not a compressor with error feedback (the wire dtype does that)",
                          spec ? spec : "none");
  if (start < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "compress start %lld; expected a number of steps >= 0", (long long)start);
  tdm__compress *cz = tdm__calloc(1, sizeof *cz);
  if (!cz) return tdm__set_error(TDM_ERR_NO_MEMORY, "compress: out of memory");
  cz->ops = compressors[row], cz->value = v, cz->start = start, cz->seed = seed;
  snprintf(cz->name, sizeof cz->name, "%s", spec);
  *out = cz;
  return TDM_OK;
}

void tdm__compress_destroy(tdm__compress *cz) {
  if (!cz) return;
  for (int k = 0; k < cz->nb; k++) {
    cz->ops->destroy(cz->b[k].state);
    tdm__free(cz->b[k].mats);
  }
  tdm__free(cz->b);
  tdm__free(cz->stats);
  tdm__free(cz->wr);
  tdm__free(cz->wc);
  tdm__free(cz);
}

static int by_off(const void *a, const void *b) {
  int64_t x = ((const tdm__cmat *)a)->off, y = ((const tdm__cmat *)b)->off;
  return (x > y) - (x < y);
}

tdm_status tdm__compress_add_bucket(tdm__compress *cz, int64_t n, int n_mats, const tdm__cmat *mats) {
  if (cz->nb == cz->cap) {
    int cap = cz->cap ? 2 * cz->cap : 8;
    cbucket *nb = tdm__malloc(sizeof *nb * (size_t)cap);
    tdm_compress_stats *ns = tdm__malloc(sizeof *ns * (size_t)cap);
    if (!nb || !ns) {
      tdm__free(nb);
      tdm__free(ns);
      return tdm__set_error(TDM_ERR_NO_MEMORY, "compress: out of memory");
    }
    if (cz->nb) memcpy(nb, cz->b, sizeof *nb * (size_t)cz->nb), memcpy(ns, cz->stats, sizeof *ns * (size_t)cz->nb);
    tdm__free(cz->b);
    tdm__free(cz->stats);
    cz->b = nb, cz->stats = ns, cz->cap = cap;
  }
  cbucket *b = &cz->b[cz->nb];
  memset(b, 0, sizeof *b);
  b->n = n, b->n_mats = n_mats;
  b->mats = tdm__malloc(sizeof *b->mats * (size_t)(n_mats ? n_mats : 1));
  if (!b->mats) return tdm__set_error(TDM_ERR_NO_MEMORY, "compress: out of memory");
  if (n_mats) memcpy(b->mats, mats, sizeof *mats * (size_t)n_mats);
  qsort(b->mats, (size_t)n_mats, sizeof *b->mats, by_off);
  for (int i = 0, at = 0; i < n_mats; at = (int)(b->mats[i].off + b->mats[i].rows * b->mats[i].cols), i++)
    if (b->mats[i].off != at || b->mats[i].rows < 1 || b->mats[i].cols < 1 ||
        (i == n_mats - 1 && b->mats[i].off + b->mats[i].rows * b->mats[i].cols != n)) {
      tdm__free(b->mats);
      return tdm__set_error(TDM_ERR_INVALID_ARG, "compress: bucket %d's parameters do not tile its %lld values", cz->nb, (long long)n);
    }
  tdm_status st = TDM_OK;
  for (int i = 0; i < n_mats && st == TDM_OK; i++) {
    st = weights(&cz->wr, &cz->nwr, b->mats[i].rows, tdm__cw_row);
    if (st == TDM_OK) st = weights(&cz->wc, &cz->nwc, b->mats[i].cols, tdm__cw_col);
  }
  if (st == TDM_OK) st = cz->ops->create(&b->state, cz->value, n, n_mats, b->mats, cz->seed + (uint64_t)cz->nb * 0x9e3779b97f4a7c15ull);
  if (st != TDM_OK) {
    tdm__free(b->mats);
    return st;
  }
  memset(&cz->stats[cz->nb], 0, sizeof cz->stats[0]);
  cz->nb++;
  return TDM_OK;
}

int tdm__compress_buckets(const tdm__compress *cz) { return cz->nb; }
int tdm__compress_active(const tdm__compress *cz, int64_t step) { return cz && step >= cz->start; }
const char *tdm__compress_name(const tdm__compress *cz) { return cz->name; }

/* In one pass over a bucket: for x and (if y) for y, Σ v, Σ w v, Σ w |v| (w = row weight x column
 * weight of each matrix), and Σ (x + y)² (y NULL: Σ x²). */
static void sums(const tdm__compress *cz, const cbucket *b, const float *x, const float *y, double xs[3], double ys[3], double *sq) {
  double s[6] = {0}, q = 0;
  for (int m = 0; m < b->n_mats; m++) {
    const tdm__cmat *M = &b->mats[m];
    for (int64_t i = 0; i < M->rows; i++) {
      const float *xr = x + M->off + i * M->cols, *yr = y ? y + M->off + i * M->cols : NULL;
      double r[6] = {0};
      for (int64_t j = 0; j < M->cols; j++) {
        double w = cz->wc[j], v = xr[j], u = yr ? yr[j] : 0;
        r[0] += v, r[1] += w * v, r[2] += w * fabs(v);
        r[3] += u, r[4] += w * u, r[5] += w * fabs(u);
        q += (v + u) * (v + u);
      }
      double a = cz->wr[i];
      s[0] += r[0], s[3] += r[3];
      for (int k = 1; k < 6; k += (k == 2 ? 2 : 1)) s[k] += a * r[k];
    }
  }
  for (int k = 0; k < 3; k++) xs[k] = s[k];
  if (ys)
    for (int k = 0; k < 3; k++) ys[k] = s[3 + k];
  *sq = q;
}

tdm_status tdm__compress_bucket(tdm__compress *cz, int k, tdm_comm_t c, float *g) {
  if (k < 0 || k >= cz->nb) return tdm__set_error(TDM_ERR_INVALID_ARG, "compress: bucket %d of %d", k, cz->nb);
  cbucket *b = &cz->b[k];
  const float *r = cz->ops->residual(b->state);
  double gs[3], rs_old[3], rs_new[3], acc2, r2;
  sums(cz, b, g, r, gs, rs_old, &acc2); /* acc2: ||g + residual||² */
  uint64_t sent0 = tdm_comm_bytes_sent(c);
  tdm__csent sent = {0, 0, 0, 0};
  TDM__TRY(cz->ops->reduce(b->state, c, g, &sent));
  uint64_t sent1 = tdm_comm_bytes_sent(c);
  r = cz->ops->residual(b->state);
  sums(cz, b, r, NULL, rs_new, NULL, &r2);
  b->g_sum += gs[0], b->g_wsum += gs[1], b->sent_sum += sent.sum, b->sent_wsum += sent.wsum;
  b->scale += gs[2];
  /* each step rounds g + residual (half an ulp each), the residual update and ĝ's own terms */
  b->tol += 8.0 * FLT_EPSILON * (gs[2] + rs_old[2] + rs_new[2] + sent.abs) + 1e-30;
  double e0 = fabs(b->sent_sum + rs_new[0] - b->g_sum), e1 = fabs(b->sent_wsum + rs_new[1] - b->g_wsum);
  /* the plain sum's weights are 1, the weighted one's at most 4: the same tolerance covers both */
  if (!(e0 <= b->tol && e1 <= b->tol))
    return tdm__set_error(TDM_ERR_INTERNAL,
                          "compress %s, bucket %d: error feedback does not telescope: sent + residual differs from the sum "
                          "of the gradients by %.3g (weighted %.3g), beyond rounding (%.3g)",
                          cz->name, k, e0, e1, b->tol);
  tdm_compress_stats *s = &cz->stats[k];
  s->elements = b->n;
  s->payload_bytes = sent.payload;
  s->bytes_sent = sent1 - sent0;
  s->ratio = sent.payload ? 4.0 * (double)b->n / (double)sent.payload : 0;
  s->rel_err = acc2 > 0 ? sqrt(r2 / acc2) : 0;
  s->telescope_err = b->scale > 0 ? e1 / b->scale : 0;
  cz->have_stats = 1;
  return TDM_OK;
}

float *tdm__compress_residual(tdm__compress *cz, int k) {
  return k >= 0 && k < cz->nb ? (float *)cz->ops->residual(cz->b[k].state) : NULL;
}

void tdm__compress_rebase(tdm__compress *cz) {
  for (int k = 0; k < cz->nb; k++) {
    cbucket *b = &cz->b[k];
    double rs[3], sq;
    sums(cz, b, cz->ops->residual(b->state), NULL, rs, NULL, &sq);
    b->g_sum = rs[0], b->g_wsum = rs[1], b->sent_sum = b->sent_wsum = 0;
    b->tol = 8.0 * FLT_EPSILON * rs[2], b->scale = rs[2];
  }
}

float *tdm__compress_shared(tdm__compress *cz, int k, int64_t *n) {
  *n = 0;
  return k >= 0 && k < cz->nb && cz->ops->shared ? cz->ops->shared(cz->b[k].state, n) : NULL;
}

int tdm__compress_stats(const tdm__compress *cz, const tdm_compress_stats **out) {
  if (!cz || !cz->have_stats) return 0;
  if (out) *out = cz->stats;
  return cz->nb;
}
