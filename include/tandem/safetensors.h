/* tandem — safetensors files (the format of Hugging Face's safetensors library).
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value"}}
 * then the tensor bytes, offsets relative to the end of the header. Every field is validated on
 * load (offsets inside the file, sizes matching dtype x shape, no overlap), so a truncated or
 * hostile file gives TDM_ERR_FORMAT naming the tensor and the problem, never a crash.
 *
 *   tdm_safetensors *f;
 *   if (tdm_safetensors_load(&f, "w.safetensors") != TDM_OK) ...;
 *   const tdm_st_tensor *t = tdm_safetensors_find(f, "layers.0.weight");
 *   tdm_safetensors_destroy(f);
 *
 * Thread safety: a loaded file is read-only and may be shared.
 */
#ifndef TANDEM_SAFETENSORS_H
#define TANDEM_SAFETENSORS_H

#include <stdint.h>

#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_st_tensor {
  const char *name;
  tdm_dtype dtype;
  int ndim;
  int64_t shape[TDM_MAX_DIMS];
  const void *data; /* inside the loaded file; little-endian */
  int64_t nbytes;
} tdm_st_tensor;

typedef struct tdm_safetensors tdm_safetensors;

/* Reads and validates the whole file. The caller owns *out. */
tdm_status tdm_safetensors_load(tdm_safetensors **out, const char *path);
void tdm_safetensors_destroy(tdm_safetensors *f);
int tdm_safetensors_count(const tdm_safetensors *f);
const tdm_st_tensor *tdm_safetensors_at(const tdm_safetensors *f, int i);
const tdm_st_tensor *tdm_safetensors_find(const tdm_safetensors *f, const char *name);
/* A __metadata__ value, or NULL. */
const char *tdm_safetensors_meta(const tdm_safetensors *f, const char *key);

/* Writes the tensors (contiguous data) and metadata pairs meta_kv[2i] = key, [2i+1] = value to
 * path.tmp, flushes it, and renames it to path. */
tdm_status tdm_safetensors_save(const char *path, int n, const tdm_st_tensor *tensors, int n_meta,
                                const char *const *meta_kv);

#ifdef __cplusplus
}
#endif
#endif
