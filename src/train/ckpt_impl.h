/* The checkpoint's internals shared by its files: the opened manifest (checkpoint.c), boxes and
 * the manifest's JSON (ckpt_layout.c), reading pieces (ckpt_read.c), the writer (ckpt_write.c).
 * See include/tandem/checkpoint.h and docs/checkpoint-format.md. */
#ifndef TANDEM_TRAIN_CKPT_IMPL_H
#define TANDEM_TRAIN_CKPT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "tandem/checkpoint.h"

#define TDM__CKPT_MAX_STEP ((int64_t)1 << 62)
#define TDM__CKPT_MAX_WORLD (1 << 24)
#define TDM__CKPT_CHUNK_BYTES ((int64_t)4 << 20) /* a flat span is cut into pieces of at most this */
#define TDM__CKPT_MANIFEST "tandem.manifest"   /* the manifest file's one tensor: the JSON, as u8 */

/* A box of a tensor: [start[d], start[d] + count[d]) in every dimension. */
typedef struct {
  int64_t start[TDM_MAX_DIMS], count[TDM_MAX_DIMS];
} tdm__box;

typedef struct {
  int file;
  int64_t offset, nbytes; /* in the file */
  uint32_t crc;
  tdm__box box;
} tdm__piece;

typedef struct {
  tdm_ckpt_tensor pub;
  tdm__piece *pieces;
} tdm__ctensor;

typedef struct {
  char *name;       /* relative to the checkpoint's directory */
  char *path;       /* as opened */
  int64_t bytes;
  uint32_t header_crc;
  int n_pieces;
  int fd;           /* -1 until first read */
  int header_ok;
} tdm__cfile;

struct tdm_ckpt {
  tdm_safetensors *f; /* the manifest file */
  char *path, *dir;
  tdm_ckpt_info info; /* layout and optimizer point into f's metadata */
  int64_t optim_steps;
  uint32_t crc;
  char **meta; /* the metadata pairs, in file order */
  int n_meta;
  int n_files, n_tensors;
  tdm__cfile *files;
  tdm__ctensor *tensors;
  /* reading */
  int cache_t, cache_p; /* the piece in cache (tensor, piece), -1 when none */
  void *cache;
  int64_t cache_cap, bytes_read;
};

/* ---- boxes (ckpt_layout.c) ---- */
int64_t tdm__box_numel(int nd, const tdm__box *b);
/* Elements [lo, hi) of a tensor's row-major order as boxes, each contiguous in that order, in
 * order: at most 2 x nd - 1 (one for nd 0). Returns their count. */
int tdm__flat_boxes(int nd, const int64_t *shape, int64_t lo, int64_t hi, tdm__box *out);
/* The intersection of a and b into *out; 0 when empty. */
int tdm__box_intersect(int nd, const tdm__box *a, const tdm__box *b, tdm__box *out);
/* Copies box `part` (inside both) from src, row-major over box `from`, into dst, row-major over box `to`. */
void tdm__box_copy(int nd, size_t es, void *dst, const tdm__box *to, const void *src, const tdm__box *from,
                   const tdm__box *part);
/* "name[0:3,5:9]" into buf. */
void tdm__box_name(const char *tensor, int nd, const tdm__box *b, char *buf, size_t n);
/* Whether the boxes lie inside shape and tile it exactly; otherwise an error naming `what`. */
tdm_status tdm__boxes_tile(int nd, const int64_t *shape, int n, const tdm__box *const *boxes, const char *what,
                           const char *tensor);

/* ---- the manifest's JSON (ckpt_layout.c) ---- */
/* Parses and checks the manifest text of c (files and tensors), c->path naming it. */
tdm_status tdm__manifest_parse(tdm_ckpt *c, const char *text, size_t n);
void tdm__manifest_free(tdm_ckpt *c);
/* A growing string. */
typedef struct {
  char *s;
  size_t n, cap;
  int oom;
} tdm__sbuf;
void tdm__sbuf_put(tdm__sbuf *b, const char *s, size_t n);
void tdm__sbuf_printf(tdm__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tdm__sbuf_json_str(tdm__sbuf *b, const char *s);

/* ---- checkpoint.c ---- */
/* The directory of step's shards ("ckpt-<step>.shards"), relative, into out. */
int tdm__ckpt_shards_name(int64_t step, char *out, size_t n);
/* lstat, then open without following a link or blocking; the size. */
tdm_status tdm__ckpt_open_regular(const char *path, int *fd, int64_t *size, const char *what);
int tdm__ckpt_read_at(int fd, void *buf, size_t n, int64_t off);
uint32_t tdm__crc32(uint32_t crc, const void *p, int64_t n);
/* Writes the manifest of step into dir (checksummed, verified by reading it back), then retires
 * older checkpoints beyond keep. */
tdm_status tdm__ckpt_write_manifest(const char *dir, const tdm_ckpt_info *info, int64_t optim_steps, const char *json,
                                    size_t json_n, int keep);
/* Strict: a canonical decimal in [lo, hi]. */
int tdm__ckpt_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

/* The newest valid entry of dir with a step below `below` (INT64_MAX: any; stray names are then
 * noted too), as tdm_ckpt_open_latest but never an error for having none; *n_entries: the entries
 * named like checkpoints. */
tdm_status tdm__ckpt_open_below(tdm_ckpt **out, const char *dir, int64_t below, char *notes, size_t notes_n, int *n_entries);

/* ---- ckpt_write.c ---- */
/* Every rank learns whether all succeeded; a failure is reported on every rank with the first
 * failing rank's message. Collective over comm (NULL: one process). */
tdm_status tdm__ckpt_agree(tdm_comm_t comm, tdm_status st, const char *what);
/* Records a failure (tdm_last_error's message) for commit to report. */
void tdm__ckpt_writer_fail(tdm_ckpt_writer *w, tdm_status st);

/* ---- ckpt_read.c ---- */
void tdm__ckpt_close_files(tdm_ckpt *c);
/* The names of o's state tensors ("exp_avg", "exp_avg_sq"; "momentum_buffer"; none), in the
 * order of its state buffer (tandem/optim.h). */
int tdm__optim_state_names(const tdm_optim *o, const char **names);
/* The checkpoint's "model.*" tensors are exactly p's parameters (TDM_ERR_MISMATCH naming the first
 * difference: another model). */
tdm_status tdm__ckpt_check_model(const tdm_ckpt *c, const tdm_params *p);
/* The checkpoint was written by an optimizer of o's kind and holds its state for every parameter. */
tdm_status tdm__ckpt_check_optim(const tdm_ckpt *c, const tdm_optim *o, const tdm_params *p);

#endif
