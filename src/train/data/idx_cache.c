/* A decompressed copy of a large gzip'd IDX file, kept in a cache directory so that later runs,
 * and every rank of a run, skip inflating it: Fashion-MNIST's training images are 26 MB of gzip,
 * 0.3 s of zlib in each process, most of a short run's start (and of the test suite's time).
 *
 * The copy is used only when its bytes' CRC-32 and length equal the ones the original's gzip
 * trailer records, so a stale, torn or edited copy is never read as data: it is decompressed again
 * and rewritten. Where the directory cannot be made or written the run goes on without a copy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/file.h"
#include "core/internal.h"
#include "train/data/idx_cache.h"

enum { MIN_GZ_BYTES = 1 << 20 }; /* smaller files inflate in a few milliseconds: not worth a copy */

/* TANDEM_CACHE_DIR, else $XDG_CACHE_HOME/tandem, else $HOME/.cache/tandem; "" or "off": none. */
static int cache_dir(char *out, size_t cap) {
  const char *d = getenv("TANDEM_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  int n;
  if (d) {
    if (!*d || !strcmp(d, "off")) return 0;
    n = snprintf(out, cap, "%s", d);
  } else if (x && *x) {
    n = snprintf(out, cap, "%s/tandem", x);
  } else if (h && *h) {
    n = snprintf(out, cap, "%s/.cache/tandem", h);
  } else {
    return 0;
  }
  return n > 0 && (size_t)n < cap;
}

/* mkdir -p for the cache directory's last two levels (~/.cache/tandem on a fresh account) */
static int make_dir(const char *dir) {
  struct stat sb;
  if (stat(dir, &sb) == 0) return S_ISDIR(sb.st_mode);
  char parent[1024];
  snprintf(parent, sizeof parent, "%s", dir);
  char *slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = 0;
    if (stat(parent, &sb) != 0) (void)mkdir(parent, 0777);
  }
  return mkdir(dir, 0777) == 0 || (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
}

int tdm__idx_cache_find(const char *src, int fd, int64_t size, tdm__idx_cache *c) {
  memset(c, 0, sizeof *c);
  unsigned char head[2], tail[8];
  if (size < MIN_GZ_BYTES || pread(fd, head, 2, 0) != 2 || head[0] != 0x1f || head[1] != 0x8b) return 0;
  if (pread(fd, tail, 8, size - 8) != 8) return 0;
  c->crc = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 | (uint32_t)tail[3] << 24;
  c->isize = (uint32_t)tail[4] | (uint32_t)tail[5] << 8 | (uint32_t)tail[6] << 16 | (uint32_t)tail[7] << 24;
  char dir[1024];
  if (!cache_dir(dir, sizeof dir)) return 0;
  /* the name: the original's without .gz, and a hash of where it is, its size and its time (two
   * copies of a file share nothing; the CRC, not the name, is what makes a copy trusted) */
  struct stat sb;
  char *real = realpath(src, NULL);
  uint64_t h = 0x7a6e64656d;
  for (const char *p = real ? real : src; *p; p++) h = tdm_hash64(h, (unsigned char)*p);
  free(real);
  if (fstat(fd, &sb) == 0) h = tdm_hash64(tdm_hash64(h, (uint64_t)sb.st_mtim.tv_sec), (uint64_t)sb.st_mtim.tv_nsec);
  h = tdm_hash64(h, (uint64_t)size);
  const char *base = strrchr(src, '/');
  base = base ? base + 1 : src;
  size_t bl = strlen(base);
  if (bl > 3 && !strcmp(base + bl - 3, ".gz")) bl -= 3;
  if (bl > 200) bl = 200;
  int n = snprintf(c->path, sizeof c->path, "%s/%.*s-%016llx", dir, (int)bl, base, (unsigned long long)h);
  if (n <= 0 || (size_t)n >= sizeof c->path) return 0;
  snprintf(c->dir, sizeof c->dir, "%s", dir);
  return 1;
}

/* The IDX header as the file holds it: 00 00 08 ndim, then each dimension big-endian. */
static size_t header_bytes(const tdm_idx *f, unsigned char *b) {
  b[0] = 0, b[1] = 0, b[2] = 0x08, b[3] = (unsigned char)f->ndim;
  for (int d = 0; d < f->ndim; d++)
    for (int k = 0; k < 4; k++) b[4 + 4 * d + k] = (unsigned char)(f->dims[d] >> (24 - 8 * k));
  return 4 + 4 * (size_t)f->ndim;
}

int tdm__idx_cache_matches(const tdm__idx_cache *c, const tdm_idx *f) {
  unsigned char h[20];
  size_t hn = header_bytes(f, h);
  uLong crc = crc32_z(0L, h, hn);
  crc = crc32_z(crc, f->data, (z_size_t)f->n);
  return (uint32_t)crc == c->crc && (uint32_t)(hn + (uint64_t)f->n) == c->isize;
}

void tdm__idx_cache_store(const tdm__idx_cache *c, const tdm_idx *f) {
  if (!make_dir(c->dir)) return;
  unsigned char h[20];
  size_t hn = header_bytes(f, h);
  tdm__wfile w;
  if (tdm__wfile_open(&w, c->path) != TDM_OK) return;
  if (tdm__wfile_write(&w, h, hn) != TDM_OK || tdm__wfile_write(&w, f->data, (size_t)f->n) != TDM_OK) {
    (void)tdm__wfile_abort(&w);
    return;
  }
  (void)tdm__wfile_commit(&w); /* a copy that could not be written costs the next run the inflate, nothing more */
}
