/* tandem — training checkpoints.
 *
 * A checkpoint is one safetensors file, DIR/ckpt-<step, 12 digits>.safetensors: every parameter
 * ("model.<name>"), the optimizer state ("optim.state", f32), and metadata: the format version
 * ("tandem.ckpt_version", 2), the step, the optimizer's step count, the world size, the seed,
 * whatever the caller adds (the trainer stores the model, its architecture and the settings a
 * resumed run must share), and a CRC-32 ("tandem.crc32", 8 lowercase hex digits) of everything
 * else: every metadata key and value, every tensor's name, dtype, shape and bytes (the exact
 * byte stream is tdm_ckpt_checksum's). Metadata values are parsed strictly: a step of "abc",
 * "3.5", "-1" or "1e3" is corruption, as is a step that differs from the file's name.
 *
 * Writing: to a temporary file, flushed and renamed (tdm_safetensors_save), then read back and
 * verified; only then are older checkpoints retired, and only those that verify, beyond the
 * newest `keep` valid ones: never the one just written, never a file that does not verify, never
 * a name that is not a checkpoint's. A crash never leaves a corrupt file under a final name and a
 * good checkpoint is never replaced by a bad one.
 *
 * Reading: tdm_ckpt_open_latest takes the newest entry that verifies. Entries are examined
 * without following links or opening anything but regular files (lstat, then
 * O_NOFOLLOW|O_NONBLOCK), so a directory, a dangling link or a FIFO under a checkpoint's name
 * is reported and skipped, never blocks; so is a corrupt or unreadable file, or a stray name
 * such as ckpt-1.safetensors. A directory holding such entries but no valid checkpoint is an
 * error, never a silent start from step 0.
 *
 * Older files: checkpoints of format 1 (written before "tandem.ckpt_version" existed; their
 * header was not covered by the checksum) and unknown versions are refused, naming the version.
 *
 * A job writing into DIR holds tdm_ckpt_lock's lock (DIR/.lock, flock, holding its pid) for its
 * whole run, so a second job fails at start naming the first's pid.
 *
 * The training position is the step: shuffling, dropout and batch order are functions of
 * (seed, epoch, step), so a run resumed from step s continues bit-identically.
 *
 *   tdm_ckpt *ck;
 *   char notes[1024];
 *   if (tdm_ckpt_open_latest(&ck, "ckpt", notes, sizeof notes) == TDM_OK && ck) {
 *     tdm_ckpt_restore(ck, params, optim, world_size);
 *     tdm_ckpt_close(ck);
 *   }
 *
 * Thread safety: none needed beyond the caller's; a tdm_ckpt is read-only once opened.
 */
#ifndef TANDEM_CHECKPOINT_H
#define TANDEM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/nn.h"
#include "tandem/optim.h"
#include "tandem/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TDM_CKPT_VERSION 2 /* the format this tandem writes and the only one it reads */

typedef struct tdm_ckpt_info {
  int64_t step;       /* optimizer steps completed */
  int world_size;
  uint64_t seed;
  /* saving only: extra metadata pairs, meta_kv[2i] = key, [2i+1] = value (the trainer stores the
   * model's architecture, so that tandem generate --checkpoint can rebuild it, and the settings a
   * resumed run must share); keys must not repeat each other or the checkpoint's own keys */
  int n_meta;
  const char *const *meta_kv;
} tdm_ckpt_info;

/* Writes DIR/ckpt-<info->step>.safetensors (creating DIR), verifies it, then deletes older valid
 * checkpoints beyond the newest `keep` valid ones (the new one counts). */
tdm_status tdm_ckpt_save(const char *dir, const tdm_params *p, const tdm_optim *o, const tdm_ckpt_info *info, int keep);

/* The same with the caller's tensors (names "model.<parameter>" and "optim.state" by convention)
 * and the optimizer's step count. */
tdm_status tdm_ckpt_save_tensors(const char *dir, const tdm_ckpt_info *info, int64_t optim_steps, int n,
                                 const tdm_st_tensor *tensors, int keep);

/* Sharded checkpoints (ZeRO). Each rank first writes its shard, DIR/ckpt-<step>.shards/rank-<r>.safetensors
 * (a checkpoint file of its own: verified, checksummed, "tandem.shard_rank" in its metadata), and
 * gets its checksum; then rank 0 writes the main file with tdm_ckpt_save_tensors, listing every
 * shard's checksum in order as "tandem.shard_crcs" (8 lowercase hex digits each, comma-separated,
 * exactly one per rank: anything else is corruption, found when the main file is opened). The main
 * file is written last, so a checkpoint whose main file verifies has all its shards; retiring a
 * checkpoint removes its shards too. */
tdm_status tdm_ckpt_save_shard(const char *dir, const tdm_ckpt_info *info, int rank, int n, const tdm_st_tensor *tensors,
                               uint32_t *crc);

/* A verified checkpoint, held in memory. */
typedef struct tdm_ckpt tdm_ckpt;

/* Opens and verifies one file: a regular file (not a link, directory or FIFO), format version,
 * checksum, strict metadata. TDM_ERR_IO when it cannot be read, TDM_ERR_FORMAT when it is not a
 * valid checkpoint; the caller closes *out. */
tdm_status tdm_ckpt_open(tdm_ckpt **out, const char *path);
/* The newest valid checkpoint of DIR. *out = NULL (TDM_OK) when DIR does not exist or has no entry
 * named ckpt-*.safetensors; TDM_ERR_FORMAT when it has such entries but none is valid. Every entry
 * skipped is noted in *notes ("; "-separated, empty when none; notes may be NULL). */
tdm_status tdm_ckpt_open_latest(tdm_ckpt **out, const char *dir, char *notes, size_t notes_n);
void tdm_ckpt_close(tdm_ckpt *c);
const tdm_ckpt_info *tdm_ckpt_get_info(const tdm_ckpt *c); /* step, world size, seed; no meta_kv */
uint32_t tdm_ckpt_get_crc(const tdm_ckpt *c);
const char *tdm_ckpt_path(const tdm_ckpt *c);
const char *tdm_ckpt_meta(const tdm_ckpt *c, const char *key); /* a metadata value, or NULL */
int64_t tdm_ckpt_get_optim_steps(const tdm_ckpt *c);
const tdm_st_tensor *tdm_ckpt_find(const tdm_ckpt *c, const char *name); /* a tensor, or NULL */
/* Rank `rank`'s shard of a sharded checkpoint, verified and checked against the checksum the main
 * file lists for it (TDM_ERR_FORMAT naming both when it is another checkpoint's shard). */
tdm_status tdm_ckpt_open_shard(const tdm_ckpt *c, int rank, tdm_ckpt **out);
/* Loads the checkpoint into p, and into o unless o is NULL, after checking everything (world size
 * unless world_size <= 0, every parameter's shape, the optimizer state's size): TDM_ERR_MISMATCH
 * leaves p and o untouched. */
tdm_status tdm_ckpt_restore(const tdm_ckpt *c, tdm_params *p, tdm_optim *o, int world_size);

/* Entries of DIR named ckpt-*.safetensors, valid or not (0 when DIR does not exist; -1 with the
 * error set when it cannot be read): a run that starts afresh refuses a directory that holds
 * another run's checkpoints. *first gets one such name (may be NULL). */
int tdm_ckpt_count_entries(const char *dir, char *first, size_t first_n);

/* Creates DIR if needed and locks it for this process: DIR/.lock, flock'd, holds the pid.
 * TDM_ERR_INVALID_USAGE naming the holder's pid when another process holds it. The lock lasts
 * until tdm_ckpt_unlock(*fd) or the process ends; the file stays. */
tdm_status tdm_ckpt_lock(const char *dir, int *fd);
void tdm_ckpt_unlock(int fd);

/* The checksum stored as "tandem.crc32": CRC-32 (zlib) over the metadata pairs sorted by key,
 * "tandem.crc32" itself left out, each as u32 key length, key, u32 value length, value; then the
 * tensors sorted by name, each as u32 name length, name, u32 dtype-name length, dtype name
 * (tdm_dtype_name: "f32"), u32 ndim, ndim x i64 dimensions, i64 byte count, the bytes (integers little-endian). */
tdm_status tdm_ckpt_checksum(int n_meta, const char *const *meta_kv, int n, const tdm_st_tensor *tensors, uint32_t *crc);

/* For tools that only read (tandem generate): the path of DIR's newest valid checkpoint
 * (TDM_ERR_IO "no checkpoint in DIR" when it has none), and loading one file's weights. */
tdm_status tdm_ckpt_latest(const char *dir, char *path, size_t path_n, char *warning, size_t warning_n);
tdm_status tdm_ckpt_load_file(const char *path, tdm_params *p, tdm_optim *o, int world_size, tdm_ckpt_info *info);

#ifdef __cplusplus
}
#endif
#endif
