/* Helpers shared by the fuzz targets. A target checks what must hold after its parser ran
 * (FUZZ_CHECK aborts, so libFuzzer keeps the input), not only that nothing crashed. */
#ifndef TANDEM_FUZZ_H
#define TANDEM_FUZZ_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "fuzz check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                    \
    }                                                                             \
  } while (0)

/* The input as a regular file, for readers that take a path: a memfd, rewritten for each input
 * and opened again through /proc, so nothing touches the disk. */
static inline const char *fuzz_memfile(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("tandem-fuzz", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  FUZZ_CHECK(ftruncate(fd, 0) == 0);
  for (size_t done = 0; done < size;) {
    ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
    FUZZ_CHECK(w > 0);
    done += (size_t)w;
  }
  return path;
}

/* Writes size bytes to path (created or truncated). */
static inline void fuzz_write(const char *path, const void *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0);
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, (const char *)data + done, size - done);
    FUZZ_CHECK(w > 0);
    done += (size_t)w;
  }
  close(fd);
}

static inline int fuzz_rm_(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p), 0;
}
static inline char *fuzz_dir_(void) {
  static char dir[256];
  return dir;
}
static inline void fuzz_rmdir_(void) { nftw(fuzz_dir_(), fuzz_rm_, 16, FTW_DEPTH | FTW_PHYS); }

/* A private directory, for parsers that need real paths (a regular file, where fuzz_memfile's
 * /proc/self/fd/N is a link; or several files): made once, in /dev/shm (memory) when it can be,
 * removed with what it holds at exit (a crash leaves it: tdm-fuzz-*). */
static inline const char *fuzz_tmpdir(void) {
  char *dir = fuzz_dir_();
  if (!dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, 256, "/dev/shm/tdm-fuzz-XXXXXX");
    if (!mkdtemp(dir)) {
      snprintf(dir, 256, "%s/tdm-fuzz-XXXXXX", tmp ? tmp : "/tmp");
      FUZZ_CHECK(mkdtemp(dir) != NULL);
    }
    atexit(fuzz_rmdir_);
  }
  return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
