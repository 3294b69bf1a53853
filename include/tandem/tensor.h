/* tandem — tensors: dtype, shape, strides and a pointer to data.
 *
 * A tensor is an opaque handle. Its memory comes from one of three places:
 *   - a tape's arena (activations; see autograd.h): freed by tdm_tape_reset;
 *   - the heap, through tdm_tensor_create: freed by tdm_tensor_destroy;
 *   - memory the caller owns, through tdm_tensor_wrap (parameter views into one buffer).
 *
 *   int64_t shape[2] = {2, 3};
 *   tdm_tensor *t;
 *   if (tdm_tensor_create(&t, TDM_F32, 2, shape) != TDM_OK) ...;
 *   float *x = tdm_tensor_data(t);            // (2, 3), row-major, contiguous
 *   tdm_tensor_destroy(t);
 *
 * Compute is in f32. bf16 and f16 are storage types: tdm_tensor_convert moves between them
 * with round-to-nearest-even. Indices are i32 or i64. Thread safety: a tensor may be read by
 * many threads; writing needs exclusive access.
 *
 * Getters given a NULL tensor set TDM_ERR_INVALID_ARG in tdm_last_error() and return -1 (ndim, dim,
 * row_argmax), 0 (numel, is_contiguous), NAN (get), NULL (pointers, name) or TDM_DTYPE_COUNT (dtype).
 */
#ifndef TANDEM_TENSOR_H
#define TANDEM_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDM_MAX_DIMS 6

typedef enum tdm_dtype {
  TDM_F32 = 0,
  TDM_F64,
  TDM_BF16,
  TDM_F16,
  TDM_I32,
  TDM_I64,
  TDM_U8,
  TDM_DTYPE_COUNT
} tdm_dtype;

typedef struct tdm_tensor tdm_tensor;

size_t tdm_dtype_size(tdm_dtype dt);
/* "f32", "bf16", ...; "?" for out-of-range values. */
const char *tdm_dtype_name(tdm_dtype dt);

/* Scalar conversions, round-to-nearest-even, NaN kept NaN, overflow to infinity. */
uint16_t tdm_f32_to_bf16(float f);
float tdm_bf16_to_f32(uint16_t h);
uint16_t tdm_f32_to_f16(float f);
float tdm_f16_to_f32(uint16_t h);

/* Heap tensor, contiguous, zero-filled. Caller owns it: tdm_tensor_destroy. */
tdm_status tdm_tensor_create(tdm_tensor **out, tdm_dtype dt, int ndim, const int64_t *shape);
/* Tensor over caller-owned contiguous memory; destroy frees only the handle. data may be NULL
 * only for a tensor of 0 elements. */
tdm_status tdm_tensor_wrap(tdm_tensor **out, tdm_dtype dt, int ndim, const int64_t *shape, void *data);
void tdm_tensor_destroy(tdm_tensor *t);

tdm_dtype tdm_tensor_dtype(const tdm_tensor *t);
int tdm_tensor_ndim(const tdm_tensor *t);
int64_t tdm_tensor_dim(const tdm_tensor *t, int axis); /* axis may be negative */
const int64_t *tdm_tensor_shape(const tdm_tensor *t);
const int64_t *tdm_tensor_strides(const tdm_tensor *t); /* in elements */
int64_t tdm_tensor_numel(const tdm_tensor *t);
int tdm_tensor_is_contiguous(const tdm_tensor *t);
/* Pointer to the first element (strides apply from there). */
void *tdm_tensor_data(const tdm_tensor *t);
/* The gradient (contiguous, same shape; f32, or bf16 / f16 for a 16-bit activation under mixed
 * precision) after backward; NULL if none flowed here. */
tdm_tensor *tdm_tensor_grad(const tdm_tensor *t);
const char *tdm_tensor_name(const tdm_tensor *t);
/* Formats "(2, 3, 4)" into buf; returns buf (NULL if buf or shape is NULL). */
char *tdm_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* Copies src into dst element by element, converting dtype; shapes must match, strides may
 * differ (so it also makes contiguous copies of views). Not in place. */
tdm_status tdm_tensor_copy(tdm_tensor *dst, const tdm_tensor *src);
/* Element (flattened logical index i) as double, whatever the dtype and strides. */
double tdm_tensor_get(const tdm_tensor *t, int64_t i);
/* Every element v; into an integer dtype saturated to its range, NaN as 0 (as tdm_convert). */
void tdm_tensor_fill(tdm_tensor *t, double v);

/* The index of the largest element along the last axis in row `row` of a contiguous f32, bf16 or
 * f16 tensor (the first of equals), or -1 for another dtype: a prediction from logits. */
int64_t tdm_tensor_row_argmax(const tdm_tensor *t, int64_t row);

/* Converts n contiguous elements from one dtype to another (any pair of the dtypes above). */
tdm_status tdm_convert(void *dst, tdm_dtype dst_dt, const void *src, tdm_dtype src_dt, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
