/* IDX files (LeCun's MNIST format), read through zlib so .gz and plain files both work. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "core/internal.h"
#include "tandem/data.h"

static tdm_status read_exact(gzFile g, void *buf, size_t n, const char *path, const char *what) {
  size_t got = 0;
  while (got < n) {
    unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
    int r = gzread(g, (char *)buf + got, chunk);
    if (r < 0) {
      int zerr;
      const char *msg = gzerror(g, &zerr);
      return tdm__set_error(TDM_ERR_FORMAT, "%s: cannot read the %s: %s", path, what, msg);
    }
    if (r == 0)
      return tdm__set_error(TDM_ERR_FORMAT, "%s: truncated: the %s needs %zu bytes, the file has %zu", path, what, n,
                            got);
    got += (size_t)r;
  }
  return TDM_OK;
}

tdm_status tdm_idx_read(const char *path, tdm_idx *out) {
  memset(out, 0, sizeof *out);
  gzFile g = gzopen(path, "rb");
  if (!g) return tdm__set_error(TDM_ERR_IO, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
  unsigned char hdr[4];
  tdm_status st = read_exact(g, hdr, 4, path, "header");
  if (st == TDM_OK && (hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08 || hdr[3] < 1 || hdr[3] > 4))
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: bad IDX magic %02x %02x %02x %02x; expected 00 00 08 (unsigned bytes) and 1..4 dims",
                        path, hdr[0], hdr[1], hdr[2], hdr[3]);
  if (st == TDM_OK) {
    out->ndim = hdr[3];
    out->n = 1;
    for (int d = 0; d < out->ndim && st == TDM_OK; d++) {
      unsigned char b[4];
      st = read_exact(g, b, 4, path, "dimensions");
      out->dims[d] = ((int64_t)b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
      out->n *= out->dims[d];
      if (st == TDM_OK && (out->dims[d] == 0 || out->n > ((int64_t)1 << 34)))
        st = tdm__set_error(TDM_ERR_FORMAT, "%s: dimension %d is %lld; expected 1..2^34 elements in all", path, d,
                            (long long)out->dims[d]);
    }
  }
  if (st == TDM_OK && !(out->data = tdm__malloc((size_t)out->n)))
    st = tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot hold %lld bytes", path, (long long)out->n);
  if (st == TDM_OK) st = read_exact(g, out->data, (size_t)out->n, path, "data");
  if (st == TDM_OK) {
    char extra;
    if (gzread(g, &extra, 1) != 0)
      st = tdm__set_error(TDM_ERR_FORMAT, "%s: bytes follow the %lld the dimensions announce", path, (long long)out->n);
  }
  gzclose(g);
  if (st != TDM_OK) tdm_idx_free(out);
  return st;
}

void tdm_idx_free(tdm_idx *f) {
  tdm__free(f->data);
  f->data = NULL;
}
