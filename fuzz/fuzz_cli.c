/* The option parser of the tandem command (tools/cli.c) on a fuzzed argv (arguments separated by
 * NUL bytes) against a table with every kind of option. After a success every value must lie in
 * its option's range (integers, sizes), be finite (floats) and be one of the choices. */
#include "fuzz.h"

#include <math.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *devnull;
  if (!devnull) cli_set_error_stream(devnull = fopen("/dev/null", "w")); /* a message per input otherwise */
  char *buf = malloc(size + 1), *argv[64];
  FUZZ_CHECK(buf);
  memcpy(buf, data, size);
  buf[size] = 0;
  int argc = 0;
  for (size_t i = 0; i <= size && argc < 64;) { /* NUL-separated words */
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  int64_t steps, n, bytes, any;
  double lr, x;
  const char *name, *choice;
  int flag;
  cli_opt opts[] = {
      {"steps", CLI_INT, &steps, "0", "an integer with a range", NULL, 0, 1e12, 0},
      {"any", CLI_INT, &any, "-5", "an integer without a range", NULL, 0, 0, 0},
      {"n", CLI_INT, &n, "20", "a one-letter option", NULL, 1, 1e9, 0},
      {"lr", CLI_FLOAT, &lr, "0.001", "a float with a range", NULL, 0, 1e3, 0},
      {"x", CLI_FLOAT, &x, "0", "a float without a range", NULL, 0, 0, 0},
      {"b", CLI_SIZE, &bytes, "8", "a size", NULL, 0, (double)((int64_t)1 << 40), 0},
      {"name", CLI_STRING, &name, NULL, "a string", NULL, 0, 0, 0},
      {"mode", CLI_CHOICE, &choice, "a", "a choice", "a|bb|ccc", 0, 0, 0},
      {"flag", CLI_FLAG, &flag, NULL, "a flag", NULL, 0, 0, 0},
  };
  int r = cli_parse("fuzz", "[options]", opts, 9, argc, argv);
  FUZZ_CHECK(r >= 0 && r <= 2);
  if (r == 0) {
    FUZZ_CHECK(steps >= 0 && steps <= 1000000000000LL && n >= 1 && n <= 1000000000);
    FUZZ_CHECK(isfinite(lr) && lr >= 0 && lr <= 1e3 && isfinite(x));
    FUZZ_CHECK(bytes >= 0 && bytes <= ((int64_t)1 << 40));
    FUZZ_CHECK(!strcmp(choice, "a") || !strcmp(choice, "bb") || !strcmp(choice, "ccc"));
    FUZZ_CHECK(flag == 0 || flag == 1);
    (void)name, (void)any;
  }
  free(buf);
  return 0;
}
