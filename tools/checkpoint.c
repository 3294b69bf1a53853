/* tandem checkpoint info DIR|FILE [--verify]: the newest valid checkpoint of a --checkpoint-dir (or
 * one manifest): step, layout, data position, settings, files and tensors.
 * tandem checkpoint consolidate DIR|FILE OUT.safetensors [--optimizer]: its logical parameters
 * (and with --optimizer the optimizer's moments) as one safetensors file, loadable as weights.
 * Exit 0 on success, 1 when the checkpoint cannot be read or written, 2 on usage errors. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "tandem/tandem.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: tandem checkpoint info DIR|FILE [--verify]\n"
          "       tandem checkpoint consolidate DIR|FILE OUT.safetensors [--optimizer]\n\n"
          "DIR is a --checkpoint-dir of tandem train (its newest valid checkpoint is taken; entries that do not\n"
          "verify are reported and skipped), FILE one checkpoint's manifest (DIR/ckpt-<step>.safetensors).\n"
          "  info         step, layout, data position, settings, files and tensors; --verify also reads every\n"
          "               piece and checks its checksum\n"
          "  consolidate  the parameters as one weights file (tandem train --init-weights, tandem generate\n"
          "               --weights); --optimizer adds the optimizer's moments (\"optim.<kind>.<parameter>\")\n");
}

/* The checkpoint: a manifest named directly, or the newest valid one of a directory. */
static int open_ckpt(const char *what, int verify, tdm_ckpt **out) {
  struct stat sb;
  tdm_status st;
  if (stat(what, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    char notes[4096];
    st = verify ? tdm_ckpt_open_latest_verified(out, what, notes, sizeof notes) : tdm_ckpt_open_latest(out, what, notes, sizeof notes);
    if (st == TDM_OK && notes[0]) fprintf(stderr, "tandem checkpoint: skipped in %s: %s\n", what, notes);
    if (st == TDM_OK && !*out) {
      fprintf(stderr, "tandem checkpoint: no checkpoint in %s\n", what);
      return 1;
    }
  } else {
    st = tdm_ckpt_open(out, what);
    if (st == TDM_OK && verify) st = tdm_ckpt_verify_data(*out);
  }
  if (st != TDM_OK) {
    fprintf(stderr, "tandem checkpoint: %s\n", tdm_last_error());
    tdm_ckpt_close(*out);
    *out = NULL;
    return 1;
  }
  return 0;
}

static const char *human(double b, char *buf, size_t n) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, u++;
  snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

static int info(int argc, char **argv) {
  int verify;
  cli_opt opts[] = {{"verify", CLI_FLAG, &verify, NULL, "read every piece and check its checksum", NULL, 0, 0, 0}};
  if (argc < 1 || argv[0][0] == '-') {
    usage(stderr);
    return 2;
  }
  int r = cli_parse("checkpoint info", "DIR|FILE [--verify]", opts, 1, argc - 1, argv + 1);
  if (r) return r == 1 ? 0 : 2;
  tdm_ckpt *c;
  if (open_ckpt(argv[0], verify, &c)) return 1;
  const tdm_ckpt_info *ci = tdm_ckpt_get_info(c);
  char h[32];
  printf("checkpoint %s (format %d, manifest crc %08x%s)\n", tdm_ckpt_path(c), TDM_CKPT_VERSION, tdm_ckpt_get_crc(c),
         verify ? ", every piece verified" : "");
  printf("step %lld, optimizer %s with %lld steps, seed %llu\n", (long long)ci->step, ci->optimizer ? ci->optimizer : "(none)",
         (long long)tdm_ckpt_get_optim_steps(c), (unsigned long long)ci->seed);
  printf("layout: written by %d rank%s: %s\n", ci->world_size, ci->world_size == 1 ? "" : "s", ci->layout);
  printf("data position: epoch %lld, %lld samples of it consumed\n", (long long)ci->data_epoch, (long long)ci->data_offset);
  printf("settings:");
  for (int i = 0, k = 0; i < tdm_ckpt_meta_count(c); i++) {
    const char *v, *key = tdm_ckpt_meta_at(c, i, &v);
    if (!strncmp(key, "tandem.", 7) && (!strcmp(key, "tandem.kind") || !strcmp(key, "tandem.ckpt_version") ||
                                         !strcmp(key, "tandem.crc32") || !strcmp(key, "tandem.step") ||
                                         !strcmp(key, "tandem.optim_steps") || !strcmp(key, "tandem.world_size") ||
                                         !strcmp(key, "tandem.seed") || !strcmp(key, "tandem.layout") ||
                                         !strcmp(key, "tandem.optim_kind") || !strcmp(key, "tandem.data_epoch") ||
                                         !strcmp(key, "tandem.data_offset")))
      continue; /* printed above */
    printf("%s %s=%s", k++ ? "," : "", key, v);
  }
  printf("\n");
  int64_t total = 0;
  for (int i = 0; i < tdm_ckpt_file_count(c); i++) {
    int64_t b;
    tdm_ckpt_file_at(c, i, &b, NULL);
    total += b;
  }
  printf("files: %d, %s\n", tdm_ckpt_file_count(c), human((double)total, h, sizeof h));
  for (int i = 0; i < tdm_ckpt_file_count(c); i++) {
    int64_t b;
    int np;
    const char *name = tdm_ckpt_file_at(c, i, &b, &np);
    printf("  %-48s %12lld bytes  %5d pieces\n", name, (long long)b, np);
  }
  int64_t values = 0;
  int params = 0;
  for (int i = 0; i < tdm_ckpt_tensor_count(c); i++) {
    const tdm_ckpt_tensor *t = tdm_ckpt_tensor_at(c, i);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    values += n;
    params += !strncmp(t->name, "model.", 6);
  }
  printf("tensors: %d (%d parameters, %d optimizer state), %lld values\n", tdm_ckpt_tensor_count(c), params,
         tdm_ckpt_tensor_count(c) - params, (long long)values);
  for (int i = 0; i < tdm_ckpt_tensor_count(c); i++) {
    const tdm_ckpt_tensor *t = tdm_ckpt_tensor_at(c, i);
    char sh[128];
    printf("  %-48s %s %-16s %4d piece%s\n", t->name, tdm_dtype_name(t->dtype), tdm_shape_str(t->ndim, t->shape, sh, sizeof sh),
           t->n_pieces, t->n_pieces == 1 ? "" : "s");
  }
  tdm_ckpt_close(c);
  return ferror(stdout) ? 1 : 0;
}

static int consolidate(int argc, char **argv) {
  int optimizer;
  cli_opt opts[] = {{"optimizer", CLI_FLAG, &optimizer, NULL, "also the optimizer's moments", NULL, 0, 0, 0}};
  if (argc < 2 || argv[0][0] == '-' || argv[1][0] == '-') {
    usage(stderr);
    return 2;
  }
  int r = cli_parse("checkpoint consolidate", "DIR|FILE OUT.safetensors [--optimizer]", opts, 1, argc - 2, argv + 2);
  if (r) return r == 1 ? 0 : 2;
  if (tdm_safetensors_check_writable(argv[1]) != TDM_OK) {
    fprintf(stderr, "tandem checkpoint: %s\n", tdm_last_error());
    return 1;
  }
  tdm_ckpt *c;
  if (open_ckpt(argv[0], 1, &c)) return 1;
  tdm_status st = tdm_ckpt_consolidate(c, argv[1], optimizer);
  if (st != TDM_OK) fprintf(stderr, "tandem checkpoint: %s\n", tdm_last_error());
  else
    fprintf(stderr, "tandem checkpoint: step %lld of %s (%s) -> %s%s\n", (long long)tdm_ckpt_get_info(c)->step, tdm_ckpt_path(c),
            tdm_ckpt_get_info(c)->layout, argv[1], optimizer ? " (with the optimizer's moments)" : "");
  tdm_ckpt_close(c);
  return st == TDM_OK ? 0 : 1;
}

int tool_checkpoint(int argc, char **argv) {
  if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") || !strcmp(argv[0], "help")) {
    usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  if (!strcmp(argv[0], "info")) return info(argc - 1, argv + 1);
  if (!strcmp(argv[0], "consolidate")) return consolidate(argc - 1, argv + 1);
  fprintf(stderr, "tandem checkpoint: unknown command '%s'; expected info or consolidate\n", argv[0]);
  usage(stderr);
  return 2;
}
