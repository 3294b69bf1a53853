/* tandem — training checkpoints that any layout can write and any layout can read.
 *
 * A checkpoint is a set of logical tensors, each named, typed and shaped as if one process held
 * it: the model's parameters ("model.<name>"), the optimizer's moments per parameter
 * ("optim.exp_avg.<name>" and "optim.exp_avg_sq.<name>" for Adam and AdamW,
 * "optim.momentum_buffer.<name>" for SGD with momentum), with the step, the optimizer's step
 * count, the data stream's position and the seed. Its files (docs/checkpoint-format.md):
 *
 *   DIR/ckpt-<step, 12 digits>.safetensors           the manifest, written last by rank 0
 *   DIR/ckpt-<step, 12 digits>.shards/rank-<r>.safetensors   rank r's pieces, one file per rank
 *
 * Each rank writes the pieces it holds into its own file (no gather to rank 0); a piece is a box
 * of a logical tensor (a range [start, start + count) in every dimension), so a tensor can be
 * split along any dimensions: ZeRO's flat spans are cut into boxes, a tensor-parallel split is one
 * box per rank. The manifest lists every logical tensor and, for every piece, which file holds it,
 * at which byte offset, and its CRC-32; its own header carries the step, the layout, the data
 * position and the settings (metadata) and a CRC-32 over all of it. The pieces of a tensor tile it
 * exactly (every element once), which the writer and the reader check.
 *
 * Writing is atomic: every file goes to an exclusive temporary, is fsync'd and renamed; each rank
 * reads its file back and checks it; only then does rank 0 write the manifest, read it back, and
 * retire older checkpoints (verified ones only, beyond the newest `keep`, with their shards). A
 * checkpoint exists when its manifest does, and a manifest is written only after every rank's
 * file is in place: a crash at any moment leaves the previous checkpoint the newest valid one.
 *
 * Reading reads only what is needed: opening verifies the manifest (checksum, strict metadata,
 * that the pieces tile every tensor) and that every file it lists is a regular file of the size
 * listed; reading a tensor's range then reads (pread) only the pieces that overlap it, each whole,
 * checking the file's header and the piece's CRC-32. A missing file, a file of another size or
 * header (a shard of another checkpoint), or a corrupt piece is TDM_ERR_FORMAT naming the file.
 *
 * Directories: tdm_ckpt_open_latest takes the newest entry that verifies; an entry that does not
 * (a directory, link or FIFO under a checkpoint's name, a corrupt manifest, a missing or
 * mismatched shard file, a stray name such as ckpt-1.safetensors) is noted and skipped, never
 * opened beyond lstat when not a regular file, never deleted. A directory holding such entries but
 * no valid checkpoint is an error, never a silent start from step 0. A job writing into DIR holds
 * tdm_ckpt_lock's lock (DIR/.lock, flock, holding its pid) for its whole run.
 *
 * Resharding: tdm_ckpt_resume_engine loads a checkpoint written by any layout (world size, ZeRO
 * stage 0-3) into an engine of any other, each rank reading only the ranges it holds, and falls
 * back past a checkpoint whose files turn out corrupt to the previous one, on every rank alike.
 *
 *   // every rank, after tdm_engine_create at any world size and stage:
 *   tdm_ckpt_resumed res;
 *   char notes[2048];
 *   if (tdm_ckpt_resume_engine("ckpt", engine, NULL, NULL, &res, notes, sizeof notes) == TDM_OK && res.found)
 *     tdm_sampler_set_position(sampler, res.step, res.data_epoch, res.data_offset);
 *   ...
 *   tdm_ckpt_info ci = {.step = step, .seed = seed, .data_epoch = e, .data_offset = o};
 *   tdm_ckpt_save_engine("ckpt", engine, &ci, 2);          // collective
 *
 * Format 3 (this one) replaced format 2 (one main file plus per-rank shards of one layout): files
 * of format 1 or 2 are refused, naming their version.
 *
 * Thread safety: none needed beyond the caller's. A tdm_ckpt caches open files and the last piece
 * read: one thread per tdm_ckpt. A writer belongs to one thread.
 *
 * A NULL checkpoint, writer, path, name or buffer is TDM_ERR_INVALID_ARG naming it; getters then
 * set tdm_last_error() and return NULL, 0 (counts, crc, bytes) or -1 (tdm_ckpt_get_optim_steps).
 */
#ifndef TANDEM_CHECKPOINT_H
#define TANDEM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/comm.h"
#include "tandem/engine.h"
#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDM_CKPT_VERSION 3 /* the format this tandem writes and the only one it reads */

typedef struct tdm_ckpt_info {
  int64_t step;       /* optimizer steps completed */
  int world_size;     /* the writer's (saving: 0 takes the communicator's size) */
  uint64_t seed;
  /* saving only: extra metadata pairs, meta_kv[2i] = key, [2i+1] = value (the trainer stores the
   * model's architecture, so that tandem generate --checkpoint can rebuild it, and the settings a
   * resumed run must share); keys must not repeat each other or the checkpoint's own keys */
  int n_meta;
  const char *const *meta_kv;
  /* where the data stream stands after `step` steps (tandem/sampler.h): the epoch, and how many
   * samples of the epoch's order were consumed */
  int64_t data_epoch, data_offset;
  const char *layout;    /* how the writer was laid out, in words ("zero stage 3, 4 ranks, 7 units"); NULL: none */
  const char *optimizer; /* the optimizer's kind ("adam", "adamw", "sgd"); NULL: none (no optimizer state) */
} tdm_ckpt_info;

/* ---- writing: any layout ------------------------------------------------------------------------
 * Every rank creates a writer, declares the logical tensors it holds pieces of, adds its pieces,
 * and commits; commit is collective over comm (NULL: one process) and returns the same status on
 * every rank. Ranks may declare different sets of tensors (a pipeline stage declares its own);
 * declarations of one name must agree; the pieces of all ranks together must tile every declared
 * tensor exactly (TDM_ERR_INVALID_ARG naming the tensor otherwise). The data pointers must stay
 * valid until commit returns; nothing is copied. Errors of the calls before commit are kept and
 * reported by commit (so every rank still reaches it). */
typedef struct tdm_ckpt_writer tdm_ckpt_writer;
tdm_status tdm_ckpt_writer_create(tdm_ckpt_writer **out, const char *dir, const tdm_ckpt_info *info, int64_t optim_steps,
                                  tdm_comm_t comm);
tdm_status tdm_ckpt_writer_tensor(tdm_ckpt_writer *w, const char *name, tdm_dtype dt, int ndim, const int64_t *shape);
/* A box: elements [start[d], start[d] + count[d]) of every dimension d, data row-major over the box. */
tdm_status tdm_ckpt_writer_box(tdm_ckpt_writer *w, const char *name, const int64_t *start, const int64_t *count,
                               const void *data);
/* Elements [lo, hi) of the tensor in row-major order (data holds hi - lo elements): cut into
 * boxes (at most 2 x ndim - 1 per 4 MiB chunk). */
tdm_status tdm_ckpt_writer_flat(tdm_ckpt_writer *w, const char *name, int64_t lo, int64_t hi, const void *data);
/* Writes this rank's file, then (rank 0) the manifest, and retires older checkpoints beyond the
 * newest `keep` valid ones (the new one counts). Frees w. Collective. */
tdm_status tdm_ckpt_writer_commit(tdm_ckpt_writer *w, int keep);
/* Frees a writer that will not be committed (nothing is written). */
void tdm_ckpt_writer_destroy(tdm_ckpt_writer *w);

/* One process: the parameters ("model.<name>") and the state of an optimizer over all of them. */
tdm_status tdm_ckpt_save(const char *dir, const tdm_params *p, const tdm_optim *o, const tdm_ckpt_info *info, int keep);

/* ---- reading ------------------------------------------------------------------------------------ */
typedef struct tdm_ckpt tdm_ckpt;

/* Opens and verifies one manifest: a regular file (not a link, directory or FIFO), format version,
 * checksum, strict metadata, the pieces, and that every file it lists exists with the size listed.
 * TDM_ERR_IO when it cannot be read, TDM_ERR_FORMAT when it is not a valid checkpoint. */
tdm_status tdm_ckpt_open(tdm_ckpt **out, const char *path);
/* The newest valid checkpoint of DIR. *out = NULL (TDM_OK) when DIR does not exist or has no entry
 * named ckpt-*.safetensors; TDM_ERR_FORMAT when it has such entries but none is valid. Every entry
 * skipped is noted in *notes ("; "-separated, empty when none; notes may be NULL). */
tdm_status tdm_ckpt_open_latest(tdm_ckpt **out, const char *dir, char *notes, size_t notes_n);
/* The same, but a checkpoint counts as valid only when every byte of every piece verifies
 * (tdm_ckpt_verify_data): for tools that read everything anyway (consolidate, generate). */
tdm_status tdm_ckpt_open_latest_verified(tdm_ckpt **out, const char *dir, char *notes, size_t notes_n);
void tdm_ckpt_close(tdm_ckpt *c);
const tdm_ckpt_info *tdm_ckpt_get_info(const tdm_ckpt *c); /* no meta_kv: see tdm_ckpt_meta */
uint32_t tdm_ckpt_get_crc(const tdm_ckpt *c);                /* the manifest's checksum */
const char *tdm_ckpt_path(const tdm_ckpt *c);               /* the manifest's path */
const char *tdm_ckpt_meta(const tdm_ckpt *c, const char *key); /* a metadata value, or NULL */
int tdm_ckpt_meta_count(const tdm_ckpt *c);
const char *tdm_ckpt_meta_at(const tdm_ckpt *c, int i, const char **value); /* the i-th key, and its value */
int64_t tdm_ckpt_get_optim_steps(const tdm_ckpt *c);

/* The logical tensors, in the manifest's order. */
typedef struct tdm_ckpt_tensor {
  const char *name;
  tdm_dtype dtype;
  int ndim;
  int64_t shape[TDM_MAX_DIMS];
  int n_pieces;
} tdm_ckpt_tensor;
int tdm_ckpt_tensor_count(const tdm_ckpt *c);
const tdm_ckpt_tensor *tdm_ckpt_tensor_at(const tdm_ckpt *c, int i);
const tdm_ckpt_tensor *tdm_ckpt_tensor_find(const tdm_ckpt *c, const char *name); /* or NULL */
/* The files, relative to the checkpoint's directory, with their sizes and how many pieces each holds. */
int tdm_ckpt_file_count(const tdm_ckpt *c);
const char *tdm_ckpt_file_at(const tdm_ckpt *c, int i, int64_t *bytes, int *n_pieces);

/* Reads a box of a tensor (dst row-major over the box), or elements [lo, hi) of its row-major
 * order, from the pieces that overlap it (each read whole and checked). TDM_ERR_INVALID_ARG for a
 * range outside the tensor, TDM_ERR_FORMAT for a file or piece that does not verify. */
tdm_status tdm_ckpt_read_box(tdm_ckpt *c, const char *name, const int64_t *start, const int64_t *count, void *dst);
tdm_status tdm_ckpt_read_flat(tdm_ckpt *c, const char *name, int64_t lo, int64_t hi, void *dst);
/* Reads every piece and checks every checksum. */
tdm_status tdm_ckpt_verify_data(tdm_ckpt *c);
/* Bytes of pieces read from the files so far (each piece counted once per read). */
int64_t tdm_ckpt_bytes_read(const tdm_ckpt *c);

/* Loads whole parameters, and o (an optimizer over all of them) unless NULL, after checking
 * everything that can be checked without reading (every parameter's name and shape, the
 * optimizer's kind and state): TDM_ERR_MISMATCH leaves p and o untouched. */
tdm_status tdm_ckpt_restore(tdm_ckpt *c, tdm_params *p, tdm_optim *o);

/* Writes the logical parameters as one safetensors weights file (names without "model.", the
 * checkpoint's own metadata pairs, the step), loadable as weights (tandem train --init-weights,
 * tandem generate --weights); with_optimizer adds every "optim.*" tensor (weights loaders skip
 * them). Streams tensor by tensor: holds one tensor at a time. Atomic, as every file here. */
tdm_status tdm_ckpt_consolidate(tdm_ckpt *c, const char *out_path, int with_optimizer);

/* ---- an engine's state (collective over the engine's world) ------------------------------------
 * Saves the parameters, optimizer moments and step count of any engine: each rank writes the
 * elements it updates (data parallelism: an even share of the buffer each). info->layout and
 * info->optimizer are taken from the engine when NULL. */
tdm_status tdm_ckpt_save_engine(const char *dir, tdm_engine *e, const tdm_ckpt_info *info, int keep);

/* A parameter server's checkpoint (src/parallel/ps*.c), called by every worker at the same step:
 * the servers answer once every live worker asked (so every push before it is in), then workers
 * and servers write it together over the job's world: the servers their key ranges of the
 * parameters and the optimizer state, worker 0 the manifest (info: the run's step, data position,
 * settings; the optimizer's step count is the servers'). The same logical tensors as every engine
 * writes: data parallelism resumes it, and it resumes data parallelism's. Refused after a worker
 * was lost (a checkpoint needs every rank of the job). */
tdm_status tdm_ps_workers_checkpoint(tdm_engine *e, const char *dir, const tdm_ckpt_info *info, int keep);
/* After the workers resumed the parameters from the manifest at path (checksum crc, step): every
 * server loads its range of the parameters and the optimizer state from it, and answers with its
 * shard, which must equal what this worker read (TDM_ERR_MISMATCH otherwise). Every worker calls
 * it before its first step. */
tdm_status tdm_ps_workers_resumed(tdm_engine *e, const char *manifest, uint32_t crc, int64_t step);

typedef struct tdm_ckpt_resumed {
  int found;                   /* 0: DIR held no checkpoint (nothing was loaded) */
  int64_t step, optim_steps;   /* of the checkpoint loaded */
  int64_t data_epoch, data_offset;
  int world_size;              /* the writer's */
  uint32_t crc;                /* the manifest's checksum */
  char layout[160];            /* the writer's, in words */
  char path[4096];             /* the manifest loaded */
  int64_t bytes_read;          /* of pieces, by this rank (the pieces that overlap what it holds) */
} tdm_ckpt_resumed;
/* Called on every rank with the checkpoint about to be loaded (every rank has the same one), to
 * refuse it (a run's settings: TDM_ERR_MISMATCH with a message), before anything is read. */
typedef tdm_status (*tdm_ckpt_accept_fn)(void *ctx, const tdm_ckpt *ck);
/* Loads the newest valid checkpoint of dir into e, whatever layout wrote it: the parameters and
 * optimizer state of what this rank holds, read from the pieces that overlap it, and the step
 * count. Every rank lists dir itself; they must find the same checkpoint (TDM_ERR_MISMATCH naming
 * what each found otherwise). A checkpoint that another model or optimizer wrote is refused
 * (TDM_ERR_MISMATCH, nothing loaded); one whose files prove corrupt when read (on any rank) is
 * noted and the next older one is tried, on every rank alike; when none is left, TDM_ERR_FORMAT
 * naming why each failed. Pieces are read straight into the engine's buffers (no second copy of
 * the state), so after such a failure the engine is part loaded: train it only after a success.
 * notes gets every entry skipped ("; "-separated). Every rank returns the same status.
 * *out->found = 0 (TDM_OK) when dir holds no checkpoint at all. */
tdm_status tdm_ckpt_resume_engine(const char *dir, tdm_engine *e, tdm_ckpt_accept_fn accept, void *ctx,
                                  tdm_ckpt_resumed *out, char *notes, size_t notes_n);

/* ---- the directory ------------------------------------------------------------------------------ */
/* Entries of DIR named ckpt-*.safetensors, valid or not (0 when DIR does not exist; -1 with the
 * error set when it cannot be read): a run that starts afresh refuses a directory that holds
 * another run's checkpoints. *first gets one such name (may be NULL). */
int tdm_ckpt_count_entries(const char *dir, char *first, size_t first_n);

/* Creates DIR if needed and locks it for this process: DIR/.lock, flock'd, holds the pid.
 * TDM_ERR_INVALID_USAGE naming the holder's pid when another process holds it. The lock lasts
 * until tdm_ckpt_unlock(*fd) or the process ends; the file stays. */
tdm_status tdm_ckpt_lock(const char *dir, int *fd);
void tdm_ckpt_unlock(int fd);
/* Whether DIR's lock file is still the one fd holds: TDM_ERR_IO naming DIR when the directory was
 * removed or replaced since (a job that recreated it would hold no lock there, and a second job
 * could then lock and write it too). fd -1: TDM_OK; dir NULL with a lock: TDM_ERR_INVALID_ARG. */
tdm_status tdm_ckpt_lock_check(const char *dir, int fd);

/* The checksum stored as "tandem.crc32" in a manifest: CRC-32 (zlib) over the metadata pairs
 * sorted by key, "tandem.crc32" itself left out, each as u32 key length, key, u32 value length,
 * value; then the tensors sorted by name, each as u32 name length, name, u32 dtype-name length,
 * dtype name (tdm_dtype_name: "u8"), u32 ndim, ndim x i64 dimensions, i64 byte count, the bytes
 * (integers little-endian). */
tdm_status tdm_ckpt_checksum(int n_meta, const char *const *meta_kv, int n, const tdm_st_tensor *tensors, uint32_t *crc);

/* For tools that only read (tandem generate): the path of DIR's newest checkpoint whose every
 * piece verifies (TDM_ERR_IO "no checkpoint in DIR" when it has none). */
tdm_status tdm_ckpt_latest(const char *dir, char *path, size_t path_n, char *warning, size_t warning_n);

#ifdef __cplusplus
}
#endif
#endif
