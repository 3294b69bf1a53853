/* The cache of decompressed IDX files (idx_cache.c): used by tdm_idx_read for gzip'd files of
 * 1 MiB or more. The directory: TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem, else
 * $HOME/.cache/tandem; TANDEM_CACHE_DIR="" or "off" turns the cache off.
 * Thread safety: the functions are (each call has its own tdm__idx_cache); processes share the
 * directory safely (copies are written to a temporary and renamed). */
#ifndef TANDEM_TRAIN_DATA_IDX_CACHE_H
#define TANDEM_TRAIN_DATA_IDX_CACHE_H

#include <stdint.h>

#include "tandem/data.h"

typedef struct {
  char dir[1024], path[1300]; /* the cache directory, and the copy's path in it */
  uint32_t crc, isize;        /* the gzip trailer's CRC-32 and length (mod 2^32) of the original's content */
} tdm__idx_cache;

/* Whether src (open as fd, size bytes) gets a cached copy: a gzip file of at least 1 MiB and a
 * cache directory configured. Fills *c; reads nothing but src's first 2 and last 8 bytes. */
int tdm__idx_cache_find(const char *src, int fd, int64_t size, tdm__idx_cache *c);
/* Whether f (read from the copy) is the original's content: its CRC-32 and length. */
int tdm__idx_cache_matches(const tdm__idx_cache *c, const tdm_idx *f);
/* Writes f as the copy (creating the directory); failures are silent: the cache is only a shortcut. */
void tdm__idx_cache_store(const tdm__idx_cache *c, const tdm_idx *f);

#endif
