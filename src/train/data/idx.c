/* IDX files (LeCun's MNIST format), read through zlib so .gz and plain files both work; a large
 * .gz is read from its decompressed copy in the cache when the copy checks out (idx_cache.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/file.h"
#include "core/internal.h"
#include "tandem/data.h"
#include "train/data/idx_cache.h"

#define MAX_IDX_BYTES ((int64_t)1 << 34)

/* Reads up to n bytes; *got says how many came before the end of the data. */
static tdm_status read_some(gzFile g, void *buf, size_t n, size_t *got, const char *path, const char *what) {
  *got = 0;
  while (*got < n) {
    unsigned chunk = n - *got > (1u << 30) ? (1u << 30) : (unsigned)(n - *got);
    int r = gzread(g, (char *)buf + *got, chunk);
    if (r < 0) {
      int zerr;
      const char *msg = gzerror(g, &zerr);
      return tdm__set_error(TDM_ERR_FORMAT, "%s: cannot read the %s: %s", path, what, msg);
    }
    if (r == 0) break;
    *got += (size_t)r;
  }
  return TDM_OK;
}

static tdm_status read_exact(gzFile g, void *buf, size_t n, const char *path, const char *what) {
  size_t got;
  TDM__TRY(read_some(g, buf, n, &got, path, what));
  if (got < n)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: truncated: the %s needs %zu bytes, the file has %zu", path, what, n, got);
  return TDM_OK;
}

/* The product of the dimensions, checked: 1..2^34 bytes in all. When it is out of range the
 * message names the largest dimension, the one that made it so. */
static tdm_status check_dims(const tdm_idx *f, const char *path) {
  char dims[96] = "";
  int big = 0, overflow = 0;
  int64_t n = 1;
  for (int d = 0; d < f->ndim; d++) {
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? " x " : "", (long long)f->dims[d]);
    if (f->dims[d] > f->dims[big]) big = d;
    if (f->dims[d] == 0)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: dimension %d is 0 (of %s); expected at least 1", path, d, dims);
    overflow |= __builtin_mul_overflow(n, f->dims[d], &n);
  }
  if (overflow || n > MAX_IDX_BYTES)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: dimension %d is %lld: %s make %s%lld bytes; at most 2^34 in all", path, big,
                          (long long)f->dims[big], dims, overflow ? "more than " : "", overflow ? (long long)INT64_MAX : (long long)n);
  return TDM_OK;
}

/* The data, in a buffer that grows with what the file really holds: a header announcing 16 GiB
 * in a small file costs no more than the file. A plain file whose size was checked against its
 * header (`exact`) is read into one aligned block, which from 8 MiB is backed by huge pages: a
 * fault per 2 MiB instead of per 4 KiB page (12-22 us each on the development VM, 11,500 of them
 * for Fashion-MNIST's training images). */
static tdm_status read_data(gzFile g, tdm_idx *out, const char *path, int exact) {
  size_t n = (size_t)out->n, cap = exact || n < ((size_t)1 << 20) ? n : ((size_t)1 << 20), got = 0;
  uint8_t *buf = exact ? tdm__aligned_alloc(cap) : tdm__malloc(cap);
  while (buf) {
    size_t r;
    tdm_status st = read_some(g, buf + got, cap - got, &r, path, "data");
    got += r;
    if (st != TDM_OK || got < cap) {
      tdm__free(buf);
      return st != TDM_OK ? st
                          : tdm__set_error(TDM_ERR_FORMAT, "%s: truncated: the dimensions announce %zu bytes of data, the file has %zu",
                                           path, n, got);
    }
    if (got == n) break;
    size_t nc = cap * 2 < n ? cap * 2 : n;
    uint8_t *nb = tdm__realloc(buf, nc); /* large blocks move by remapping: no copy, no page touched again */
    if (!nb) tdm__free(buf);
    buf = nb;
    cap = nc;
  }
  if (!buf) return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot hold %zu bytes", path, n);
  out->data = buf;
  return TDM_OK;
}

/* Reads the IDX file open as fd (fsize bytes; closed here) into *out. */
static tdm_status read_fd(const char *path, int fd, int64_t fsize, tdm_idx *out) {
  memset(out, 0, sizeof *out);
  gzFile g = gzdopen(fd, "rb");
  if (!g) {
    close(fd);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot open a zlib stream", path);
  }
  unsigned char hdr[4];
  tdm_status st = read_exact(g, hdr, 4, path, "header");
  if (st == TDM_OK && (hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08 || hdr[3] < 1 || hdr[3] > 4))
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: bad IDX magic %02x %02x %02x %02x; expected 00 00 08 (unsigned bytes) and 1..4 dims",
                        path, hdr[0], hdr[1], hdr[2], hdr[3]);
  if (st == TDM_OK) {
    out->ndim = hdr[3];
    unsigned char b[16];
    st = read_exact(g, b, 4 * (size_t)out->ndim, path, "dimensions");
    for (int d = 0; st == TDM_OK && d < out->ndim; d++)
      out->dims[d] = ((int64_t)b[4 * d] << 24) | ((int64_t)b[4 * d + 1] << 16) | ((int64_t)b[4 * d + 2] << 8) | b[4 * d + 3];
    if (st == TDM_OK) st = check_dims(out, path);
    if (st == TDM_OK) {
      out->n = 1;
      for (int d = 0; d < out->ndim; d++) out->n *= out->dims[d];
    }
  }
  /* an uncompressed file says its length: check it before reading */
  int64_t header = 4 + 4 * (int64_t)out->ndim;
  if (st == TDM_OK && gzdirect(g) && fsize - header != out->n)
    st = fsize - header < out->n
             ? tdm__set_error(TDM_ERR_FORMAT, "%s: truncated: the dimensions announce %lld bytes of data, the file has %lld",
                              path, (long long)out->n, (long long)(fsize - header))
             : tdm__set_error(TDM_ERR_FORMAT, "%s: %lld bytes follow the %lld the dimensions announce", path,
                              (long long)(fsize - header - out->n), (long long)out->n);
  if (st == TDM_OK) st = read_data(g, out, path, gzdirect(g));
  if (st == TDM_OK) {
    char extra;
    if (gzread(g, &extra, 1) != 0)
      st = tdm__set_error(TDM_ERR_FORMAT, "%s: bytes follow the %lld the dimensions announce", path, (long long)out->n);
  }
  gzclose(g);
  if (st != TDM_OK) tdm_idx_free(out);
  return st;
}

tdm_status tdm_idx_read(const char *path, tdm_idx *out) {
  if (!path || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_idx_read: %s is NULL", !path ? "the path" : "out");
  memset(out, 0, sizeof *out);
  int fd, cfd;
  int64_t fsize, csize;
  TDM__TRY(tdm__file_open_regular(path, &fd, &fsize));
  tdm__idx_cache c;
  int cached = tdm__idx_cache_find(path, fd, fsize, &c);
  if (cached && access(c.path, R_OK) == 0 && tdm__file_open_regular(c.path, &cfd, &csize) == TDM_OK) {
    if (read_fd(c.path, cfd, csize, out) == TDM_OK && tdm__idx_cache_matches(&c, out)) {
      close(fd);
      return TDM_OK;
    }
    tdm_idx_free(out); /* stale or damaged: decompressed again below, and rewritten */
  }
  TDM__TRY(read_fd(path, fd, fsize, out));
  if (cached) tdm__idx_cache_store(&c, out);
  return TDM_OK;
}

void tdm_idx_free(tdm_idx *f) {
  if (!f) return; /* a no-op, as every other free */
  tdm__free(f->data);
  f->data = NULL;
}
