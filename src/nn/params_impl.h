/* Parameter-store internals shared with the optimizer (the gradient-norm segments). */
#ifndef TANDEM_PARAMS_IMPL_H
#define TANDEM_PARAMS_IMPL_H

#include "tandem/nn.h"
#include "tandem/safetensors.h"

/* The cut points of the gradient-norm segments, ascending, lo[0] = 0 and lo[n] = numel: every
 * parameter start and every multiple of a length chosen from numel alone (so the same for every
 * layout). Built at first use (the only allocation), owned by p. */
tdm_status tdm__params_segments(const tdm_params *p, const int64_t **lo, int64_t *n);
/* The segment that starts at element off (n for off = numel), -1 if off is not a cut point. */
int64_t tdm__params_segment_at(const tdm_params *p, int64_t off);
/* Scratch for one double per segment, owned by p (valid after tdm__params_segments). */
double *tdm__params_segment_sums(const tdm_params *p);

/* The index of parameter t (one of p's), -1 if it is not one. O(log n). */
int tdm__params_index_of(const tdm_params *p, const tdm_tensor *t);

/* The safetensors entries of p's parameters in order (f32, names and shapes, no data), as a
 * weights file lists them; *out is tdm__malloc'd. */
tdm_status tdm_params_st_tensors(const tdm_params *p, tdm_st_tensor **out);

#endif
