/* Helpers shared by the fuzz targets. A target checks what must hold after its parser ran
 * (FUZZ_CHECK aborts, so libFuzzer keeps the input), not only that nothing crashed. */
#ifndef TANDEM_FUZZ_H
#define TANDEM_FUZZ_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
