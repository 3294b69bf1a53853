/* powersgd:RANK (Vogels, Karimireddy and Jaggi 2019): each matrix M of a bucket (gradient plus
 * residual) is sent as two thin factors, with one step of power iteration warm-started from the
 * last step's Q: P = M Q, all-reduced (mean) and orthonormalised; Q = Mᵀ P, all-reduced (mean);
 * the average gradient becomes P Qᵀ and the residual keeps M - P Qᵀ. (The all-reduce comes before
 * the orthonormalisation, as in the paper: a sum of orthonormal bases is not one.) Vectors, and
 * matrices whose factors would not be smaller, travel whole in the Q all-reduce. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/compress.h"
#include "tandem/kernels.h"

typedef struct {
  int64_t off, rows, cols;
  int r;           /* this matrix's rank: min(RANK, rows, cols) */
  int64_t p_at, q_at; /* where its P and Q lie in pbuf and qbuf */
} pmat;

typedef struct {
  int64_t n;
  float *resid;       /* n: what this rank has not sent (zero for the vectors) */
  pmat *m;            /* the compressed matrices */
  int nm;
  const tdm__cmat *dense; /* the wrapper's: which parameters travel whole */
  int n_dense_src;
  int64_t np, nq, nd; /* floats of all P, all Q, all dense values */
  float *pbuf, *qbuf; /* qbuf: the Qs, then the dense values */
  int *is_dense;      /* per wrapper matrix */
  uint64_t seed;      /* Q's start, and a fresh column for a Q column that vanished */
} psgd;

static tdm_status parse(const char *spec, const char *arg, double *value) {
  char *end = NULL;
  long v = strtol(arg, &end, 10);
  if (!*arg || !end || *end)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "compress '%s': the rank '%s' is not a whole number; expected powersgd:RANK with RANK >= 1",
                          spec, arg);
  if (v < 1 || v > 4096)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "compress '%s': the rank %ld is out of range; expected powersgd:RANK with 1 <= RANK <= 4096",
                          spec, v);
  *value = (double)v;
  return TDM_OK;
}

static void destroy(void *vs) {
  psgd *p = vs;
  if (!p) return;
  tdm__free(p->resid);
  tdm__free(p->m);
  tdm__free(p->pbuf);
  tdm__free(p->qbuf);
  tdm__free(p->is_dense);
  tdm__free(p);
}

static void fill_normal(tdm_rng *rng, float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = tdm_rng_normal(rng);
}

static tdm_status create(void **out, double value, int64_t n, int n_mats, const tdm__cmat *mats, uint64_t seed) {
  psgd *p = tdm__calloc(1, sizeof *p);
  if (!p) return tdm__set_error(TDM_ERR_NO_MEMORY, "powersgd: out of memory");
  int R = (int)value;
  p->n = n, p->dense = mats, p->n_dense_src = n_mats;
  p->m = tdm__calloc((size_t)(n_mats ? n_mats : 1), sizeof *p->m);
  p->is_dense = tdm__calloc((size_t)(n_mats ? n_mats : 1), sizeof(int));
  p->resid = tdm__calloc((size_t)(n ? n : 1), sizeof(float));
  if (!p->m || !p->is_dense || !p->resid) {
    destroy(p);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "powersgd: out of memory");
  }
  for (int i = 0; i < n_mats; i++) {
    const tdm__cmat *M = &mats[i];
    int64_t r = R;
    if (r > M->rows) r = M->rows;
    if (r > M->cols) r = M->cols;
    if (M->rows < 2 || r * (M->rows + M->cols) >= M->rows * M->cols) { /* nothing to gain */
      p->is_dense[i] = 1;
      p->nd += M->rows * M->cols;
      continue;
    }
    p->m[p->nm++] = (pmat){M->off, M->rows, M->cols, (int)r, p->np, p->nq};
    p->np += M->rows * r, p->nq += M->cols * r;
  }
  p->pbuf = tdm__malloc_cat(sizeof(float) * (size_t)(p->np + 1), TDM_MEM_COMM);
  p->qbuf = tdm__malloc_cat(sizeof(float) * (size_t)(p->nq + p->nd + 1), TDM_MEM_COMM);
  if (!p->pbuf || !p->qbuf) {
    destroy(p);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "powersgd: out of memory");
  }
  p->seed = seed;
  tdm_rng rng;
  tdm_rng_seed(&rng, seed); /* the same seed on every rank: the same start */
  fill_normal(&rng, p->qbuf, p->nq);
  *out = p;
  return TDM_OK;
}

/* ---- the steps on one matrix (shared with the tests) --------------------------------------------- */
void tdm__psgd_p(const float *M, int64_t rows, int64_t cols, int r, const float *Q, float *P) {
  tdm_k_gemm(0, 0, rows, r, cols, 1.0f, M, cols, Q, r, 0.0f, P, r);
}

void tdm__psgd_orthonormalise(float *P, int64_t rows, int r) {
  for (int k = 0; k < r; k++) {
    double n0 = 0;
    for (int64_t i = 0; i < rows; i++) n0 += (double)P[i * r + k] * P[i * r + k];
    for (int pass = 0; pass < 2; pass++) /* Gram-Schmidt twice: orthogonal to rounding even after cancellation */
      for (int l = 0; l < k; l++) {
        double d = 0;
        for (int64_t i = 0; i < rows; i++) d += (double)P[i * r + k] * P[i * r + l];
        for (int64_t i = 0; i < rows; i++) P[i * r + k] = (float)(P[i * r + k] - d * P[i * r + l]);
      }
    double nn = 0;
    for (int64_t i = 0; i < rows; i++) nn += (double)P[i * r + k] * P[i * r + k];
    /* what is left of a column that lay in the others' span is rounding, no direction: drop it */
    double inv = nn > 1e-60 && nn > 1e-10 * n0 ? 1.0 / sqrt(nn) : 0;
    for (int64_t i = 0; i < rows; i++) P[i * r + k] = (float)(P[i * r + k] * inv);
  }
}

void tdm__psgd_q(const float *M, int64_t rows, int64_t cols, int r, const float *P, float *Q) {
  tdm_k_gemm(1, 0, cols, r, rows, 1.0f, M, cols, P, r, 0.0f, Q, r);
}

void tdm__psgd_approx(const float *P, const float *Q, int64_t rows, int64_t cols, int r, float *out) {
  tdm_k_gemm(0, 1, rows, cols, r, 1.0f, P, r, Q, r, 0.0f, out, cols);
}

/* ---- one bucket ------------------------------------------------------------------------------------ */
static tdm_status reduce(void *vs, tdm_comm_t c, float *g, tdm__csent *sent) {
  psgd *p = vs;
  double s = 0, ws = 0, wa = 0;
  /* the vectors (and small matrices) whole, after the Qs; what they send is their own value */
  float *d = p->qbuf + p->nq;
  for (int i = 0; i < p->n_dense_src; i++) {
    const tdm__cmat *M = &p->dense[i];
    if (!p->is_dense[i]) continue;
    for (int64_t a = 0; a < M->rows; a++)
      for (int64_t b = 0; b < M->cols; b++) {
        float v = g[M->off + a * M->cols + b];
        double w = tdm__cw_row(a) * tdm__cw_col(b);
        s += v, ws += w * v, wa += w * fabs((double)v);
        *d++ = v;
      }
  }
  for (int i = 0; i < p->nm; i++) { /* M = gradient + residual; P = M Q */
    pmat *m = &p->m[i];
    float *acc = p->resid + m->off;
    const float *gm = g + m->off;
    for (int64_t e = 0; e < m->rows * m->cols; e++) acc[e] += gm[e];
    tdm__psgd_p(acc, m->rows, m->cols, m->r, p->qbuf + m->q_at, p->pbuf + m->p_at);
  }
  tdm_algo algo = c ? tdm_comm_rank_order_algo(c) : TDM_ALGO_AUTO;
  if (c && p->np) TDM__TRY(tdm_comm_allreduce(c, p->pbuf, p->pbuf, (size_t)p->np, TDM_F32, TDM_AVG, algo));
  for (int i = 0; i < p->nm; i++) {
    pmat *m = &p->m[i];
    tdm__psgd_orthonormalise(p->pbuf + m->p_at, m->rows, m->r);
    tdm__psgd_q(p->resid + m->off, m->rows, m->cols, m->r, p->pbuf + m->p_at, p->qbuf + m->q_at);
  }
  if (c && p->nq + p->nd) TDM__TRY(tdm_comm_allreduce(c, p->qbuf, p->qbuf, (size_t)(p->nq + p->nd), TDM_F32, TDM_AVG, algo));
  d = p->qbuf + p->nq;
  for (int i = 0; i < p->n_dense_src; i++) {
    const tdm__cmat *M = &p->dense[i];
    if (!p->is_dense[i]) continue;
    memcpy(g + M->off, d, sizeof(float) * (size_t)(M->rows * M->cols));
    d += M->rows * M->cols;
  }
  for (int i = 0; i < p->nm; i++) { /* ĝ = P Qᵀ; the residual keeps M - ĝ */
    pmat *m = &p->m[i];
    const float *P = p->pbuf + m->p_at, *Q = p->qbuf + m->q_at;
    tdm__psgd_approx(P, Q, m->rows, m->cols, m->r, g + m->off);
    float *acc = p->resid + m->off;
    for (int64_t e = 0; e < m->rows * m->cols; e++) acc[e] -= g[m->off + e];
    /* what was sent, from the factors: Σ_ij a_i b_j (P Qᵀ)_ij = Σ_k (Σ_i a_i P_ik)(Σ_j b_j Q_jk) */
    for (int k = 0; k < m->r; k++) {
      double ps = 0, pw = 0, pa = 0, qs = 0, qw = 0, qa = 0;
      for (int64_t a = 0; a < m->rows; a++) {
        double v = P[a * m->r + k], w = tdm__cw_row(a);
        ps += v, pw += w * v, pa += w * fabs(v);
      }
      for (int64_t b = 0; b < m->cols; b++) {
        double v = Q[b * m->r + k], w = tdm__cw_col(b);
        qs += v, qw += w * v, qa += w * fabs(v);
      }
      s += ps * qs, ws += pw * qw, wa += (double)m->r * pa * qa;
    }
    /* a Q column that vanished (a zero gradient) would stay zero: start it afresh, alike on every
     * rank, from the seed and the matrix's Q alone (so a resumed run draws the same) */
    for (int k = 0; k < m->r; k++) {
      int zero = 1;
      for (int64_t b = 0; b < m->cols && zero; b++) zero = p->qbuf[m->q_at + b * m->r + k] == 0;
      if (!zero) continue;
      uint64_t h = tdm_hash64(p->seed, (uint64_t)i * 4096 + (uint64_t)k);
      for (int64_t b = 0; b < m->cols * m->r; b++) {
        uint32_t bits;
        memcpy(&bits, &p->qbuf[m->q_at + b], 4);
        h = tdm_hash64(h, bits);
      }
      tdm_rng rng;
      tdm_rng_seed(&rng, h);
      for (int64_t b = 0; b < m->cols; b++) p->qbuf[m->q_at + b * m->r + k] = tdm_rng_normal(&rng);
    }
  }
  sent->sum = s, sent->wsum = ws, sent->abs = wa;
  sent->payload = 4 * (uint64_t)(p->np + p->nq + p->nd);
  return TDM_OK;
}

static const float *residual(const void *vs) { return ((const psgd *)vs)->resid; }
static float *shared(void *vs, int64_t *n) {
  psgd *p = vs;
  *n = p->nq;
  return p->qbuf;
}

const tdm__compressor_ops tdm__compress_powersgd_ops = {"powersgd", "powersgd:RANK with RANK >= 1", parse, create, destroy, reduce, residual, shared};
