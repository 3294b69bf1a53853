/* Gradient compressors with error feedback (include/tandem/compress.h): the interface each one
 * implements (one file each, compress_<name>.c, one row in the table of compress_hook.c) and the
 * wrapper the data-parallel engine (dp.c) drives, which keeps the always-on checks and the stats. */
#ifndef TANDEM_PARALLEL_COMPRESS_H
#define TANDEM_PARALLEL_COMPRESS_H

#include "tandem/comm.h"
#include "tandem/compress.h"

/* A parameter inside a bucket: its offset from the bucket's start and its shape as a matrix
 * (rows = the first dimension, cols = the rest; a vector or scalar: rows 1). */
typedef struct {
  int64_t off, rows, cols;
} tdm__cmat;

/* Weights of the telescoping check: element (i, j) of a matrix weighs a(i) b(j), in [1, 2) each,
 * so that a weighted sum of a product P Qᵀ factors (sum over k of (Σ a P_k)(Σ b Q_k)). */
double tdm__cw_row(int64_t i);
double tdm__cw_col(int64_t j);

/* What a reduce reports: sums over what it took out of g + residual this step (ĝ: top-k's
 * values, PowerSGD's P Qᵀ and the vectors' own values), plain and weighted, computed from what
 * went on the wire, not from the residual; abs: a bound on the weighted sum of |ĝ| terms for the
 * rounding tolerance. */
typedef struct {
  double sum, wsum, abs;
  uint64_t payload;
} tdm__csent;

typedef struct tdm__compressor_ops {
  const char *name;   /* "topk" */
  const char *form;   /* "topk:RATIO with 0 < RATIO <= 1" */
  /* Parses the text after "name:"; TDM_ERR_INVALID_ARG naming it and form otherwise. */
  tdm_status (*parse)(const char *spec, const char *arg, double *value);
  /* One bucket of n values made of mats (sorted by offset, covering [0, n)). seed: the same on every rank. */
  tdm_status (*create)(void **state, double value, int64_t n, int n_mats, const tdm__cmat *mats, uint64_t seed);
  void (*destroy)(void *state);
  /* g: this rank's gradient of the bucket; on return the average over the ranks of what they
   * sent (the same bits on every rank), and the residual holds what this rank did not send.
   * Collective over c (c NULL: one rank). */
  tdm_status (*reduce)(void *state, tdm_comm_t c, float *g, tdm__csent *sent);
  const float *(*residual)(const void *state); /* n values */
  /* Optional: state the ranks share and a checkpoint must keep (PowerSGD's Q); *n its floats. */
  float *(*shared)(void *state, int64_t *n);
} tdm__compressor_ops;

extern const tdm__compressor_ops tdm__compress_topk_ops;
extern const tdm__compressor_ops tdm__compress_powersgd_ops;

/* The wrapper: one compressor over a model's buckets. */
typedef struct tdm__compress tdm__compress;
/* spec: "topk:0.01", "powersgd:4" (tdm_compress_is_hook); start: uncompressed steps first. */
tdm_status tdm__compress_create(tdm__compress **out, const char *spec, int64_t start, uint64_t seed);
void tdm__compress_destroy(tdm__compress *cz);
/* Adds bucket number tdm__compress_buckets(cz); mats need not be sorted. */
tdm_status tdm__compress_add_bucket(tdm__compress *cz, int64_t n, int n_mats, const tdm__cmat *mats);
int tdm__compress_buckets(const tdm__compress *cz);
/* Whether optimizer step `step` (0-based) is compressed (step >= start). */
int tdm__compress_active(const tdm__compress *cz, int64_t step);
/* Reduces bucket k in place (see reduce above), then checks the telescoping sums and records the
 * bucket's stats. Collective over c. */
tdm_status tdm__compress_bucket(tdm__compress *cz, int k, tdm_comm_t c, float *g);
/* The last compressed step's stats, one per bucket; returns their count (0 before any). */
int tdm__compress_stats(const tdm__compress *cz, const tdm_compress_stats **out);
const char *tdm__compress_name(const tdm__compress *cz); /* "topk:0.01" */
/* Bucket k's residual, writable (checkpoints read into it; tests break it on purpose). */
float *tdm__compress_residual(tdm__compress *cz, int k);
/* After the residuals were written in place (a checkpoint read into them): the telescoping sums
 * start over from them, as if they were the first gradients. */
void tdm__compress_rebase(tdm__compress *cz);
/* Bucket k's shared state (NULL, *n = 0 when the compressor has none), writable. */
float *tdm__compress_shared(tdm__compress *cz, int k, int64_t *n);

/* PowerSGD's steps on one matrix (rows x cols, row-major), shared with the tests: P = M Q
 * (rows x r), orthonormalise P's columns in place (Gram-Schmidt; a column with nothing left
 * becomes zero), Q = Mᵀ P (cols x r), out = P Qᵀ. */
void tdm__psgd_p(const float *M, int64_t rows, int64_t cols, int r, const float *Q, float *P);
void tdm__psgd_orthonormalise(float *P, int64_t rows, int r);
void tdm__psgd_q(const float *M, int64_t rows, int64_t cols, int r, const float *P, float *Q);
void tdm__psgd_approx(const float *P, const float *Q, int64_t rows, int64_t cols, int r, float *out);

#endif
