/* A main() for fuzz targets built without libFuzzer: runs the target once on each file given
 * (each regular file in a directory given), so the seed corpus is checked by every build.
 *   fuzz_json_replay fuzz/corpus/json */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot open\n", path);
    return 1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += r;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  if (!buf) return 1;
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
  int inputs = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat s;
    if (stat(argv[i], &s) != 0) {
      fprintf(stderr, "%s: does not exist\n", argv[i]);
      bad++;
      continue;
    }
    if (!S_ISDIR(s.st_mode)) {
      bad += run_file(argv[i]);
      inputs++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    char *names[4096];
    int n = 0;
    for (struct dirent *e; d && n < 4096 && (e = readdir(d));)
      if (e->d_name[0] != '.') names[n++] = strdup(e->d_name);
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp);
    for (int k = 0; k < n; k++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[i], names[k]);
      bad += run_file(p);
      inputs++;
      free(names[k]);
    }
  }
  printf("replayed %d inputs%s\n", inputs, bad ? "; some could not be read" : "");
  return bad || !inputs ? 1 : 0; /* a crash or a failed check has aborted before this */
}
