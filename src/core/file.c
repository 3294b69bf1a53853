/* Whole files read and written safely; see file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

static const char *kind_of(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO or pipe (its size cannot be known; copy the data to a file)"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "something else";
}

tdm_status tdm__file_open_regular(const char *path, int *fd, int64_t *size) {
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, maybe forever */
  int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (d < 0) return tdm__set_error(TDM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat s;
  if (fstat(d, &s) != 0) {
    tdm_status st = tdm__set_error(TDM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    close(d);
    return st;
  }
  if (!S_ISREG(s.st_mode)) {
    close(d);
    return tdm__set_error(TDM_ERR_IO, "%s: not a regular file but %s", path, kind_of(s.st_mode));
  }
  int fl = fcntl(d, F_GETFL);
  if (fl >= 0) fcntl(d, F_SETFL, fl & ~O_NONBLOCK);
  *fd = d;
  *size = (int64_t)s.st_size;
  return TDM_OK;
}

tdm_status tdm__file_read(const char *path, int64_t max, const char *what, unsigned char **out, int64_t *len) {
  int fd;
  int64_t size;
  TDM__TRY(tdm__file_open_regular(path, &fd, &size));
  if (size > max) {
    close(fd);
    return tdm__set_error(TDM_ERR_FORMAT, "%s: %lld bytes; a %s has at most %lld", path, (long long)size, what,
                          (long long)max);
  }
  unsigned char *b = tdm__malloc((size_t)size + 1);
  if (!b) {
    close(fd);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: cannot hold its %lld bytes", path, (long long)size);
  }
  int64_t got = 0;
  while (got < size) {
    size_t chunk = (size_t)(size - got) > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)(size - got);
    ssize_t r = read(fd, b + got, chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      tdm_status st = r < 0 ? tdm__set_error(TDM_ERR_IO, "%s: read failed after %lld of %lld bytes: %s", path,
                                             (long long)got, (long long)size, strerror(errno))
                            : tdm__set_error(TDM_ERR_IO, "%s: the file shrank to %lld bytes while being read (was %lld)",
                                             path, (long long)got, (long long)size);
      tdm__free(b);
      close(fd);
      return st;
    }
    got += r;
  }
  close(fd);
  b[size] = 0;
  *out = b;
  *len = size;
  return TDM_OK;
}

/* ---- writing --------------------------------------------------------------------------------- */

static uint64_t random64(void) {
  uint64_t r;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
  static _Atomic uint64_t counter; /* no entropy yet: unique per process and call, which is enough with O_EXCL */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return tdm_hash64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30), ((uint64_t)getpid() << 32) + counter++);
}

/* The first failure, and its message, kept for commit and abort. */
static tdm_status keep(tdm__wfile *w, tdm_status st) {
  if (w->st == TDM_OK) {
    w->st = st;
    snprintf(w->err, sizeof w->err, "%s", tdm_last_error());
  }
  return st;
}

static void wfile_free(tdm__wfile *w) {
  tdm__free(w->path);
  tdm__free(w->tmp);
  w->path = w->tmp = NULL;
  w->fd = -1;
}

tdm_status tdm__wfile_open(tdm__wfile *w, const char *path) {
  memset(w, 0, sizeof *w);
  w->fd = -1;
  if (!path || !*path) return tdm__set_error(TDM_ERR_INVALID_ARG, "write file: empty path");
  const char *slash = strrchr(path, '/');
  size_t dlen = slash ? (size_t)(slash - path) + 1 : 0; /* the directory with its '/' */
  const char *base = path + dlen;
  if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: names a directory, not a file", path);
  /* the file is written beside the target and renamed over it: over /dev/null, a FIFO or a
   * socket that would replace the node itself (as root, /dev/null for everyone) */
  struct stat ts;
  if (stat(path, &ts) == 0 && !S_ISREG(ts.st_mode))
    return tdm__set_error(TDM_ERR_IO, "%s is %s; expected a regular file (or a new name) to write", path,
                          S_ISDIR(ts.st_mode) ? "a directory" : kind_of(ts.st_mode));
  size_t blen = strlen(base);
  if (blen > 200) blen = 200; /* the temporary's name must stay below NAME_MAX */
  size_t n = strlen(path) + 1, tn = dlen + blen + 32;
  w->path = tdm__malloc(n);
  w->tmp = tdm__malloc(tn);
  if (!w->path || !w->tmp) {
    wfile_free(w);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  }
  memcpy(w->path, path, n);
  for (int attempt = 0; attempt < 100; attempt++) {
    /* hidden, and not ending in the final name's extension, so directory scans pass it by */
    snprintf(w->tmp, tn, "%.*s.%.*s.tmp-%016llx", (int)dlen, path, (int)blen, base, (unsigned long long)random64());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (w->fd >= 0) return TDM_OK;
    if (errno != EEXIST) break;
  }
  tdm_status st = tdm__set_error(TDM_ERR_IO, "%s: cannot create a temporary file next to it (%s): %s", path, w->tmp,
                                 strerror(errno));
  wfile_free(w);
  return st;
}

tdm_status tdm__wfile_write(tdm__wfile *w, const void *buf, size_t n) {
  if (w->st != TDM_OK) return tdm__set_error(w->st, "%s", w->err);
  const char *p = buf;
  while (n) {
    ssize_t r = write(w->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return keep(w, tdm__set_error(TDM_ERR_IO, "%s: write failed: %s", w->path, r < 0 ? strerror(errno) : "no progress"));
    p += r;
    n -= (size_t)r;
  }
  return TDM_OK;
}

tdm_status tdm__wfile_abort(tdm__wfile *w) {
  tdm_status st = w->st != TDM_OK ? w->st : TDM_ERR_IO;
  if (w->st != TDM_OK && w->err[0]) tdm__set_error(st, "%s", w->err);
  if (w->fd >= 0) close(w->fd);
  if (w->tmp) unlink(w->tmp);
  wfile_free(w);
  return st;
}

/* Makes the rename durable. File systems that cannot sync a directory say EINVAL: nothing to do. */
static tdm_status sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return tdm__set_error(TDM_ERR_IO, "%s: cannot open its directory to sync it: %s", path, strerror(errno));
  int r = fsync(fd), e = errno;
  close(fd);
  if (r != 0 && e != EINVAL && e != EROFS)
    return tdm__set_error(TDM_ERR_IO, "%s: cannot sync its directory: %s", path, strerror(e));
  return TDM_OK;
}

tdm_status tdm__wfile_commit(tdm__wfile *w) {
  if (w->st != TDM_OK) return tdm__wfile_abort(w);
  if (fsync(w->fd) != 0) {
    keep(w, tdm__set_error(TDM_ERR_IO, "%s: fsync failed: %s", w->path, strerror(errno)));
    return tdm__wfile_abort(w);
  }
  int r = close(w->fd);
  w->fd = -1;
  if (r != 0) {
    keep(w, tdm__set_error(TDM_ERR_IO, "%s: close failed: %s", w->path, strerror(errno)));
    return tdm__wfile_abort(w);
  }
  if (rename(w->tmp, w->path) != 0) {
    keep(w, tdm__set_error(TDM_ERR_IO, "%s: cannot rename %s onto it: %s", w->path, w->tmp, strerror(errno)));
    return tdm__wfile_abort(w);
  }
  tdm_status st = sync_dir(w->path);
  wfile_free(w);
  return st;
}

tdm_status tdm__file_check_writable(const char *path) {
  struct stat s;
  if (path && stat(path, &s) == 0 && S_ISDIR(s.st_mode))
    return tdm__set_error(TDM_ERR_IO, "%s is a directory; expected a file name", path);
  tdm__wfile w; /* (refuses a device, FIFO or socket) */
  TDM__TRY(tdm__wfile_open(&w, path));
  close(w.fd);
  w.fd = -1;
  unlink(w.tmp);
  wfile_free(&w);
  return TDM_OK;
}
