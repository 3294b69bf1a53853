/* Whole files read and written safely, for every reader and writer of files in the library.
 *
 * Reading: only regular files. A FIFO or a pipe has no size to check a header against and a FIFO
 * would block the open until a writer comes, so they are refused with a message saying so; the
 * open itself never blocks (O_NONBLOCK).
 *
 * Writing: into a temporary created exclusively (O_CREAT | O_EXCL | O_NOFOLLOW, a random name in
 * the final name's directory, mode 0666 less the umask), written, fsync'd, renamed onto the final
 * name and the directory fsync'd. A symbolic link planted at any name is never followed, a crash
 * never leaves a half-written file under the final name, and every failure removes the temporary.
 *
 *   tdm__wfile w;
 *   TDM__TRY(tdm__wfile_open(&w, path));
 *   if (tdm__wfile_write(&w, buf, n) != TDM_OK) return tdm__wfile_abort(&w);  // keeps the error
 *   return tdm__wfile_commit(&w);
 *
 * Thread safety: the functions are; one tdm__wfile belongs to one thread.
 */
#ifndef TANDEM_CORE_FILE_H
#define TANDEM_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

/* Opens path for reading if it is a regular file: *fd (blocking mode, close-on-exec; the caller
 * closes it) and its size. Otherwise TDM_ERR_IO naming path and what it is instead. */
tdm_status tdm__file_open_regular(const char *path, int *fd, int64_t *size);

/* Reads the whole regular file path into *out (tdm__malloc'd, caller frees; one spare zero byte
 * after the end). Files larger than max bytes are refused with TDM_ERR_FORMAT naming what. */
tdm_status tdm__file_read(const char *path, int64_t max, const char *what, unsigned char **out, int64_t *len);

typedef struct tdm__wfile {
  int fd;
  char *path, *tmp; /* tdm__malloc'd */
  tdm_status st;    /* the first failure: later writes do nothing, commit returns it */
  char err[320];    /* its message, which commit and abort set again (the caller's calls since may have replaced it) */
} tdm__wfile;

/* Creates the exclusive temporary for path. On failure nothing is left behind. */
tdm_status tdm__wfile_open(tdm__wfile *w, const char *path);
/* Appends n bytes (retrying short writes and EINTR). */
tdm_status tdm__wfile_write(tdm__wfile *w, const void *buf, size_t n);
/* fsync, close, rename onto the final name, fsync the directory; removes the temporary on failure. */
tdm_status tdm__wfile_commit(tdm__wfile *w);
/* Closes and removes the temporary; returns the first failure recorded (TDM_ERR_IO if none), so a
 * caller can `return tdm__wfile_abort(&w)` and keep the error detail it already set. */
tdm_status tdm__wfile_abort(tdm__wfile *w);

/* Whether a file can be written at path the way tdm__wfile does it (the directory exists and takes
 * a new file, path is not a directory), by creating and removing a temporary there: for checking
 * output paths before long work. */
tdm_status tdm__file_check_writable(const char *path);

#endif
