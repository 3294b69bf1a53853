/* tandem — gradient compression for data parallelism: communication hooks that send fewer bytes.
 *
 * --compress SPEC (tdm_engine_dp_config.compress) picks what a gradient bucket becomes on the
 * wire:
 *   none            f32, averaged by the all-reduce (the default)
 *   bf16 | fp16     the all-reduce in a 16-bit dtype (tdm_engine_dp_config.wire_dtype)
 *   topk:RATIO      0 < RATIO <= 1: each rank sends the k = ceil(RATIO x n) values of largest
 *                   magnitude of its bucket (n values) with their offsets in it, 7k bytes (f32
 *                   value, 3-byte offset; 8k for buckets of more than 2^24 values); the ranks
 *                   all-gather them and every rank sums the sparse parts in rank order, then
 *                   divides by the rank count: the same bits on every rank, whatever the
 *                   transport.
 *   powersgd:RANK   RANK >= 1 (Vogels et al. 2019): each matrix M (a parameter of 2 or more
 *                   dimensions, as rows = its first dimension x the rest) is sent as two thin
 *                   factors: P = M Q, all-reduced (mean) and orthonormalised; Q = Mᵀ P, all-reduced;
 *                   the average gradient becomes P Qᵀ. Q is kept for the next step (warm start).
 *                   Vectors (biases, norms), and matrices too small to gain, go uncompressed
 *                   in one all-reduce per bucket.
 * Both keep an error-feedback residual per rank: what was not sent is added to the next step's
 * gradient. compress_start (--compress-start N) sends the first N optimizer steps uncompressed
 * (PowerSGD's warm-up). Compressed buckets are exchanged after backward (no overlap): both
 * compressors need the whole bucket and a collective whose size depends on it.
 *
 * Checks, always on: error feedback telescopes — for each bucket, the sum over all steps of what
 * was taken out of the gradient (the sparse values, or P Qᵀ) plus the residual equals the sum of
 * the gradients, to rounding (checked on two weighted sums every step; a violation fails the step
 * with TDM_ERR_INTERNAL naming the bucket). Per bucket and step: the compression ratio and the
 * relative error ||g - ĝ|| / ||g|| (tdm_engine_compress_stats; in the metrics of tandem train).
 *
 * Checkpoints keep the compressor's state (src/train/engine_ckpt.c): every rank's residuals as
 * rows of "compress.residual" (ranks x parameters) and PowerSGD's Q as "compress.shared", so a run
 * resumed on as many ranks continues bit-identically. Resumed on another rank count, or from a
 * checkpoint written without compression, the residuals start at zero and Q from the seed (a
 * warning says so).
 */
#ifndef TANDEM_COMPRESS_H
#define TANDEM_COMPRESS_H

#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TDM_OK when spec is one of the forms above; else TDM_ERR_INVALID_ARG naming the value and what
 * was expected. NULL is "none". */
tdm_status tdm_compress_check(const char *spec);
/* 1 when spec names a compressor with error feedback (topk, powersgd); 0 for none, bf16, fp16. */
int tdm_compress_is_hook(const char *spec);

/* One bucket's numbers for the last compressed step. */
typedef struct tdm_compress_stats {
  int64_t elements;        /* the bucket's gradient values */
  uint64_t payload_bytes;  /* what this rank put on the wire for it (topk: 7k; powersgd: the factors and vectors) */
  uint64_t bytes_sent;     /* measured: the growth of tdm_comm_bytes_sent over the bucket's exchange */
  double ratio;            /* 4 x elements / payload_bytes */
  double rel_err;          /* ||g - ĝ|| / ||g||: g this rank's gradient plus its residual, ĝ what it sent */
  double telescope_err;    /* |Σ ĝ + residual - Σ g| over all steps, relative to Σ |g|: rounding only */
} tdm_compress_stats;

#ifdef __cplusplus
}
#endif
#endif
