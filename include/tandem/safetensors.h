/* tandem — safetensors files (the format of Hugging Face's safetensors library).
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value"}}
 * then the tensor bytes, offsets relative to the end of the header. Loading is strict and total:
 * the header is strict JSON (UTF-8, no duplicate keys, no trailing characters); every tensor entry
 * has exactly a known dtype, a shape of at most TDM_MAX_DIMS non-negative dimensions whose byte
 * size does not overflow, and data_offsets inside the data whose span is exactly dtype x shape;
 * no two non-empty tensors share a byte (an empty tensor may sit at any offset in range);
 * __metadata__ maps strings to strings. Anything else is TDM_ERR_FORMAT naming the file, the
 * tensor and the problem, never a crash. Only regular files are read (a FIFO is refused, not
 * waited on).
 *
 *   tdm_safetensors *f;
 *   if (tdm_safetensors_load(&f, "w.safetensors") != TDM_OK) ...;
 *   const tdm_st_tensor *t = tdm_safetensors_find(f, "layers.0.weight");
 *   tdm_safetensors_destroy(f);
 *
 * Thread safety: a loaded file is read-only and may be shared. A NULL file, writer, name or key is
 * TDM_ERR_INVALID_ARG naming it in tdm_last_error(); getters then return 0 or NULL.
 */
#ifndef TANDEM_SAFETENSORS_H
#define TANDEM_SAFETENSORS_H

#include <stddef.h>
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
  const void *data; /* little-endian, aligned to the element size: inside the loaded file, or a copy
                       the file owns when the file does not align it */
  int64_t nbytes;
} tdm_st_tensor;

typedef struct tdm_safetensors tdm_safetensors;

/* Reads and validates the whole file. The caller owns *out. */
tdm_status tdm_safetensors_load(tdm_safetensors **out, const char *path);
/* The same from n bytes in memory (copied); name stands for the file in messages. */
tdm_status tdm_safetensors_parse(tdm_safetensors **out, const void *bytes, size_t n, const char *name);
void tdm_safetensors_destroy(tdm_safetensors *f);
int tdm_safetensors_count(const tdm_safetensors *f);
const tdm_st_tensor *tdm_safetensors_at(const tdm_safetensors *f, int i);
const tdm_st_tensor *tdm_safetensors_find(const tdm_safetensors *f, const char *name);
/* A __metadata__ value, or NULL. */
const char *tdm_safetensors_meta(const tdm_safetensors *f, const char *key);

/* Writes the tensors (contiguous data) and metadata pairs meta_kv[2i] = key, [2i+1] = value to
 * path, atomically: into a temporary created exclusively next to it (never following a symbolic
 * link; mode 0666 less the umask), fsync'd, renamed onto path, the directory fsync'd. On failure
 * path is untouched and no temporary is left. Arguments the reader would refuse (duplicate
 * names, nbytes not matching dtype x shape, names not UTF-8) are TDM_ERR_INVALID_ARG. */
tdm_status tdm_safetensors_save(const char *path, int n, const tdm_st_tensor *tensors, int n_meta,
                                const char *const *meta_kv);
/* The same, streamed: the header is written at open (the tensors' data pointers are not used), then
 * every tensor's bytes, in order, through any number of writes; commit renames the file into place
 * (an error, and nothing saved, unless exactly the announced bytes were written); abort leaves
 * nothing. For files larger than memory (ZeRO stage 3 writes the model unit by unit). The writer
 * is freed by commit or abort. One thread per writer. */
typedef struct tdm_st_writer tdm_st_writer;
tdm_status tdm_safetensors_writer_open(tdm_st_writer **out, const char *path, int n, const tdm_st_tensor *tensors,
                                       int n_meta, const char *const *meta_kv);
tdm_status tdm_safetensors_writer_write(tdm_st_writer *w, const void *data, size_t n);
tdm_status tdm_safetensors_writer_commit(tdm_st_writer *w);
void tdm_safetensors_writer_abort(tdm_st_writer *w);
/* Whether tdm_safetensors_save could write path now (its directory takes a new file, path is not
 * a directory): checks an output path before long work, e.g. at the start of training. */
tdm_status tdm_safetensors_check_writable(const char *path);

#ifdef __cplusplus
}
#endif
#endif
