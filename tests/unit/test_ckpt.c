#define _GNU_SOURCE /* memmem */
/* Checkpoint files and directories: the checksum covers the header (every metadata key and value,
 * tensor names, dtypes, shapes) as well as the data; metadata values are parsed strictly; format
 * versions are checked; entries that are not valid checkpoints (directory, FIFO, links, stray
 * names, corrupt files) are reported and skipped without blocking, and rotation never deletes
 * them; the directory lock names its holder. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tdm_test.h"

static char dir[64];

static const char *path(const char *name) {
  static char buf[8][512];
  static int k;
  char *b = buf[k++ & 7];
  snprintf(b, 512, "%s/%s", dir, name);
  return b;
}

/* Two parameters w (2, 3) and b (3), and SGD with momentum (state: 9 floats). */
typedef struct {
  tdm_params *p;
  tdm_optim *o;
} model;

static model make(float base) {
  model m;
  tdm_tensor *t;
  int64_t s2[2] = {2, 3}, s1[1] = {3};
  tdm_params_create(&m.p);
  tdm_params_declare(m.p, "w", 2, s2, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 1, &t);
  tdm_params_declare(m.p, "b", 1, s1, (tdm_init){TDM_INIT_ZEROS, 0, 0}, 0, &t);
  tdm_params_finalize(m.p, 0);
  float *w = tdm_params_data(m.p);
  for (int i = 0; i < 9; i++) w[i] = base + (float)i;
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_SGD);
  oc.momentum = 0.9f;
  tdm_optim_create(&m.o, &oc, m.p);
  int64_t n;
  float *st = tdm_optim_state(m.o, &n);
  for (int i = 0; i < n; i++) st[i] = -base - (float)i;
  return m;
}
static void unmake(model m) {
  tdm_optim_destroy(m.o);
  tdm_params_destroy(m.p);
}

static const char *const extra[] = {"tandem.model", "mlp", "n_layer", "2"};

static void save(const char *d, int64_t step, float base, int keep) {
  model m = make(base);
  tdm_ckpt_info ci = {.step = step, .world_size = 1, .seed = 7, .n_meta = 2, .meta_kv = extra};
  CHECK_OK(tdm_ckpt_save(d, m.p, m.o, &ci, keep));
  unmake(m);
}

static void rm_rf(const char *d) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  CHECK(system(cmd) == 0);
}

static int exists(const char *p) {
  struct stat sb;
  return lstat(p, &sb) == 0;
}

static void test_round_trip(void) {
  save(dir, 5, 1.0f, 2);
  tdm_ckpt *c = NULL;
  CHECK_OK(tdm_ckpt_open(&c, path("ckpt-000000000005.safetensors")));
  if (!c) return;
  CHECK(tdm_ckpt_get_info(c)->step == 5 && tdm_ckpt_get_info(c)->world_size == 1 && tdm_ckpt_get_info(c)->seed == 7);
  CHECK(tdm_ckpt_meta(c, "n_layer") && !strcmp(tdm_ckpt_meta(c, "n_layer"), "2"));
  CHECK(tdm_ckpt_meta(c, "tandem.ckpt_version") && !strcmp(tdm_ckpt_meta(c, "tandem.ckpt_version"), "3"));
  CHECK(tdm_ckpt_get_info(c)->optimizer && !strcmp(tdm_ckpt_get_info(c)->optimizer, "sgd"));
  /* the logical tensors: the parameters and SGD's momentum per parameter, with their shapes */
  const tdm_ckpt_tensor *w = tdm_ckpt_tensor_find(c, "model.w"), *mw = tdm_ckpt_tensor_find(c, "optim.momentum_buffer.w");
  CHECK(tdm_ckpt_tensor_count(c) == 4 && w && mw && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3 && mw->shape[1] == 3);
  CHECK(tdm_ckpt_file_count(c) == 1);
  model m = make(100.0f);
  CHECK_OK(tdm_ckpt_restore(c, m.p, m.o));
  model want = make(1.0f);
  int64_t n;
  CHECK(!memcmp(tdm_params_data(m.p), tdm_params_data(want.p), 9 * sizeof(float)));
  CHECK(!memcmp(tdm_optim_state(m.o, &n), tdm_optim_state(want.o, &n), 9 * sizeof(float)));
  unmake(m);
  /* another optimizer kind, or SGD without momentum (no state): refused before anything changes */
  m = make(100.0f);
  tdm_optim *adam;
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAM);
  CHECK_OK(tdm_optim_create(&adam, &oc, m.p));
  CHECK(tdm_ckpt_restore(c, m.p, adam) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("written with optimizer sgd; this optimizer is adam");
  CHECK(tdm_params_data(m.p)[0] == 100.0f);
  tdm_optim_destroy(adam);
  oc = tdm_optim_config_default(TDM_OPT_SGD);
  CHECK_OK(tdm_optim_create(&adam, &oc, m.p));
  CHECK(tdm_ckpt_restore(c, m.p, adam) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("holds 2 optimizer tensors; this optimizer (sgd, without momentum) keeps 0");
  tdm_optim_destroy(adam);
  unmake(m);
  unmake(want);
  /* a model of another shape is refused before anything changes */
  tdm_params *p;
  tdm_tensor *t;
  int64_t s[2] = {3, 2}, s1[1] = {3};
  tdm_params_create(&p);
  tdm_params_declare(p, "w", 2, s, (tdm_init){TDM_INIT_ONES, 0, 0}, 1, &t);
  tdm_params_declare(p, "b", 1, s1, (tdm_init){TDM_INIT_ONES, 0, 0}, 0, &t);
  tdm_params_finalize(p, 0);
  CHECK(tdm_ckpt_restore(c, p, NULL) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("parameter 'w' is f32 (2, 3) in the checkpoint; the model expects f32 (3, 2)");
  CHECK(tdm_params_data(p)[0] == 1.0f);
  tdm_params_destroy(p);
  tdm_ckpt_close(c);
}

/* The file's bytes, and the same with `from` replaced by `to` (same length) in the header. */
static int patch(const char *src, const char *dst, const char *from, const char *to) {
  FILE *f = fopen(src, "rb");
  if (!f) return 0;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char *at = memmem(buf, n, from, strlen(from));
  if (!at || strlen(from) != strlen(to)) return 0;
  memcpy(at, to, strlen(to));
  f = fopen(dst, "wb");
  fwrite(buf, 1, n, f);
  fclose(f);
  return 1;
}

static void test_checksum_covers_the_header(void) {
  save(dir, 8, 2.0f, 2);
  char good[512];
  snprintf(good, sizeof good, "%s", path("ckpt-000000000008.safetensors"));
  static const char *const edits[][2] = {
      {"\"tandem.step\":\"8\"", "\"tandem.step\":\"9\""},           /* a value */
      {"\"tandem.world_size\":\"1\"", "\"tandem.world_size\":\"3\""}, /* another */
      {"\"n_layer\":\"2\"", "\"n_layex\":\"2\""},                     /* a key */
      {"\"model.w\"", "\"model.v\""},                                 /* a tensor's name (in the manifest) */
      {"\"dtype\":\"f32\"", "\"dtype\":\"i32\""},                     /* its dtype (same size) */
      {"\"shape\":[2,3]", "\"shape\":[3,2]"},                         /* its shape (same bytes) */
      {"\"count\":[2,3]", "\"count\":[3,2]"},                         /* a piece's box */
      {"\"tandem.data_offset\":\"0\"", "\"tandem.data_offset\":\"1\""}, /* the data position */
  };
  for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
    CHECK_MSG(patch(good, path("edited.safetensors"), edits[i][0], edits[i][1]), "%s not in the header", edits[i][0]);
    tdm_ckpt *c = NULL;
    tdm_status st = tdm_ckpt_open(&c, path("edited.safetensors"));
    CHECK_MSG(st == TDM_ERR_FORMAT && strstr(tdm_last_error(), "checksum mismatch"), "%s -> %s: %s", edits[i][1],
              tdm_status_str(st), tdm_last_error());
    tdm_ckpt_close(c);
  }
  tdm_ckpt *c = NULL;
  CHECK_OK(tdm_ckpt_open(&c, good)); /* the original still verifies */
  tdm_ckpt_close(c);
}

/* A checkpoint whose checksum is right but whose metadata says `key` = `value` (or lacks it): a
 * real checkpoint of step 3 (whose shard file stays beside it), its metadata edited, signed again. */
static tdm_status signed_with(const char *key, const char *value) {
  save(dir, 3, 3.0f, 5);
  tdm_ckpt *real = NULL;
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_ckpt_open(&real, path("ckpt-000000000003.safetensors")));
  CHECK_OK(tdm_safetensors_load(&f, path("ckpt-000000000003.safetensors")));
  if (!real || !f) return TDM_ERR_INTERNAL;
  const char *meta[32][2];
  int n = 0;
  for (int i = 0; i < tdm_ckpt_meta_count(real) && n < 31; i++) {
    meta[n][0] = tdm_ckpt_meta_at(real, i, &meta[n][1]);
    if (!strcmp(meta[n][0], key) && !value) continue; /* drop it */
    if (!strcmp(meta[n][0], key)) meta[n][1] = value;
    n++;
  }
  tdm_st_tensor t = *tdm_safetensors_find(f, "tandem.manifest");
  uint32_t crc;
  char hex[16];
  CHECK_OK(tdm_ckpt_checksum(n, &meta[0][0], 1, &t, &crc));
  snprintf(hex, sizeof hex, "%08x", crc);
  for (int i = 0; i < n; i++)
    if (!strcmp(meta[i][0], "tandem.crc32")) meta[i][1] = hex;
  CHECK_OK(tdm_safetensors_save(path("signed.safetensors"), 1, &t, n, &meta[0][0]));
  tdm_safetensors_destroy(f);
  tdm_ckpt_close(real);
  if (!strcmp(key, "duplicate")) { /* the writer refuses a repeated key: rename one in the file */
    FILE *fp = fopen(path("signed.safetensors"), "r+b");
    char head[8192] = {0};
    size_t got = fp ? fread(head, 1, sizeof head - 1, fp) : 0;
    char *at = got ? strstr(head + 8, "\"tandem.seed\"") : NULL;
    CHECK(at != NULL);
    if (at) {
      memcpy(at, "\"tandem.step\"", 13); /* as long as "tandem.seed" */
      fseek(fp, at - head, SEEK_SET);
      fwrite(at, 1, 13, fp);
    }
    if (fp) fclose(fp);
  }
  tdm_ckpt *c = NULL;
  tdm_status st = tdm_ckpt_open(&c, path("signed.safetensors"));
  tdm_ckpt_close(c);
  return st;
}

static void test_metadata_is_parsed_strictly(void) {
  CHECK_OK(signed_with("tandem.step", "3")); /* the signing itself is right */
  static const char *const bad_steps[] = {"abc", "3.5", "-1", "1e3", "", "007", "+3", " 3", "3 ", "0x10",
                                          "4611686018427387905", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad_steps / sizeof *bad_steps; i++) {
    tdm_status st = signed_with("tandem.step", bad_steps[i]);
    CHECK_MSG(st == TDM_ERR_FORMAT && strstr(tdm_last_error(), "metadata tandem.step is"), "step '%s' -> %s: %s",
              bad_steps[i], tdm_status_str(st), tdm_last_error());
  }
  CHECK(signed_with("tandem.world_size", "0") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("metadata tandem.world_size is '0'; expected an integer in 1..");
  CHECK(signed_with("tandem.seed", "-5") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("tandem.seed is '-5'");
  CHECK(signed_with("tandem.optim_steps", "2.0") == TDM_ERR_FORMAT);
  /* a manifest must list one file per rank of its world (caught by fuzz_ckpt's checks: a world of 2 with
   * one file was accepted) */
  CHECK(signed_with("tandem.world_size", "2") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("manifest: lists 1 file; the world of 2 ranks that wrote it has one each");
  CHECK(signed_with("tandem.world_size", NULL) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("lacks tandem.world_size");
  CHECK(signed_with("duplicate", NULL) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("duplicate key 'tandem.step'");
  CHECK(signed_with("tandem.ckpt_version", NULL) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("checkpoint format 1");
  CHECK(signed_with("tandem.ckpt_version", "2") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("checkpoint format 2 (written by an older tandem, before checkpoints resharded)");
  CHECK(signed_with("tandem.ckpt_version", "4") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("format version '4'; this tandem reads version 3 only");
  CHECK(signed_with("tandem.data_offset", "x") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("metadata tandem.data_offset is 'x'");
  CHECK(signed_with("tandem.layout", NULL) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("lacks tandem.layout");
  CHECK(signed_with("tandem.kind", "weights") == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("not a tandem checkpoint");
}

static void test_bad_entries_are_skipped_and_never_deleted(void) {
  char d[128];
  snprintf(d, sizeof d, "%s/dir", dir);
  save(d, 4, 4.0f, 5);
  save(d, 8, 8.0f, 5);
  char p[600], q[600];
  snprintf(p, sizeof p, "%s/ckpt-000000000012.safetensors", d);
  CHECK(mkdir(p, 0755) == 0); /* a directory */
  snprintf(p, sizeof p, "%s/ckpt-000000000016.safetensors", d);
  CHECK(mkfifo(p, 0644) == 0); /* a FIFO: opening it for reading would block */
  snprintf(p, sizeof p, "%s/ckpt-000000000020.safetensors", d);
  CHECK(symlink("/nonexistent/x", p) == 0); /* a dangling link */
  snprintf(p, sizeof p, "%s/ckpt-000000000024.safetensors", d);
  CHECK(symlink("ckpt-000000000008.safetensors", p) == 0); /* a link to a good one: not followed */
  snprintf(p, sizeof p, "%s/ckpt-000000000004.safetensors", d);
  snprintf(q, sizeof q, "%s/ckpt-000000000028.safetensors", d);
  CHECK(link(p, q) == 0); /* a valid file under another step's name */
  snprintf(q, sizeof q, "%s/ckpt-000000000032.safetensors", d);
  CHECK(patch(p, q, "\"tandem.step\":\"4\"", "\"tandem.step\":\"5\"")); /* corrupt header */
  static const char *const strays[] = {"ckpt-1.safetensors", "ckpt-0000000x.safetensors", "ckpt-000000000008.safetensors.bak",
                                       "ckpt-0000000000040.safetensors"};
  for (int i = 0; i < 4; i++) {
    snprintf(q, sizeof q, "%s/%s", d, strays[i]);
    CHECK(link(p, q) == 0);
  }
  tdm_ckpt *c = NULL;
  char notes[4096];
  CHECK_OK(tdm_ckpt_open_latest(&c, d, notes, sizeof notes));
  CHECK(c && tdm_ckpt_get_info(c)->step == 8);
  tdm_ckpt_close(c);
  static const char *const expected[] = {"000012.safetensors: a directory, not a checkpoint file",
                                         "000016.safetensors: a FIFO, not a checkpoint file",
                                         "000020.safetensors: a symbolic link, not a checkpoint file",
                                         "000024.safetensors: a symbolic link, not a checkpoint file",
                                         "000028.safetensors: its metadata says step 4, its name step 28",
                                         "000032.safetensors: checksum mismatch",
                                         "ckpt-1.safetensors: not a checkpoint's name",
                                         "ckpt-0000000x.safetensors: not a checkpoint's name",
                                         "ckpt-0000000000040.safetensors: not a checkpoint's name"};
  for (size_t i = 0; i < sizeof expected / sizeof *expected; i++)
    CHECK_MSG(strstr(notes, expected[i]), "notes lack '%s': %s", expected[i], notes);
  CHECK(!strstr(notes, ".bak")); /* not named like a checkpoint at all: not even mentioned */
  CHECK(tdm_ckpt_count_entries(d, NULL, 0) == 11); /* the 8 canonical names and 3 strays ending .safetensors */
  /* rotation keeps the new one and the newest older valid one (8), deletes 4, touches nothing else */
  save(d, 36, 36.0f, 2);
  snprintf(p, sizeof p, "%s/ckpt-000000000004.safetensors", d);
  CHECK(!exists(p));
  const char *kept[] = {"ckpt-000000000008.safetensors", "ckpt-000000000012.safetensors", "ckpt-000000000016.safetensors",
                        "ckpt-000000000020.safetensors", "ckpt-000000000024.safetensors", "ckpt-000000000028.safetensors",
                        "ckpt-000000000032.safetensors", "ckpt-000000000036.safetensors", "ckpt-1.safetensors",
                        "ckpt-000000000008.safetensors.bak"};
  for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
    snprintf(p, sizeof p, "%s/%s", d, kept[i]);
    CHECK_MSG(exists(p), "%s was deleted", kept[i]);
  }
  save(d, 40, 40.0f, 2); /* now 8 is beyond the two newest valid ones */
  snprintf(p, sizeof p, "%s/ckpt-000000000008.safetensors", d);
  CHECK(!exists(p));
  snprintf(p, sizeof p, "%s/ckpt-000000000036.safetensors", d);
  CHECK(exists(p));
  rm_rf(d);
}

static void test_no_valid_checkpoint_is_an_error(void) {
  char d[128], p[300];
  tdm_ckpt *c = (tdm_ckpt *)1;
  snprintf(d, sizeof d, "%s/none", dir);
  CHECK_OK(tdm_ckpt_open_latest(&c, d, NULL, 0)); /* no directory: nothing to resume */
  CHECK(c == NULL);
  CHECK(mkdir(d, 0755) == 0);
  CHECK_OK(tdm_ckpt_open_latest(&c, d, NULL, 0)); /* empty */
  CHECK(c == NULL);
  snprintf(p, sizeof p, "%s/ckpt-000000000004.safetensors", d);
  CHECK(mkfifo(p, 0644) == 0);
  snprintf(p, sizeof p, "%s/ckpt-000000000002.safetensors", d);
  FILE *f = fopen(p, "wb");
  fputs("garbage", f);
  fclose(f);
  char notes[1024];
  CHECK(tdm_ckpt_open_latest(&c, d, notes, sizeof notes) == TDM_ERR_FORMAT && c == NULL);
  CHECK_ERR_HAS("no valid checkpoint in");
  CHECK_ERR_HAS("2 entries named like one");
  CHECK_ERR_HAS("a FIFO");
  char path_out[512];
  CHECK(tdm_ckpt_latest(d, path_out, sizeof path_out, notes, sizeof notes) == TDM_ERR_FORMAT);
  rm_rf(d);
}

static void test_lock_names_the_holder(void) {
  char d[128], want[64];
  snprintf(d, sizeof d, "%s/locked", dir);
  int a = -1, b = -1;
  CHECK_OK(tdm_ckpt_lock(d, &a)); /* creates the directory */
  CHECK(tdm_ckpt_lock(d, &b) == TDM_ERR_INVALID_USAGE && b == -1); /* flock: per open file, so also within a process */
  snprintf(want, sizeof want, "in use by another job (pid %ld holds", (long)getpid());
  CHECK_ERR_HAS(want);
  tdm_ckpt_unlock(a);
  CHECK_OK(tdm_ckpt_lock(d, &b));
  tdm_ckpt_unlock(b);
  CHECK(tdm_ckpt_count_entries(d, NULL, 0) == 0); /* .lock is not a checkpoint */
  rm_rf(d);
}

/* The lock check: the directory still holds this job's lock file; removed and made again by
 * someone else, it does not (a second job could lock it), and the error names the directory. */
static void test_lock_check_sees_a_replaced_directory(void) {
  char d[128], gone[160];
  snprintf(d, sizeof d, "%s/relocked", dir);
  snprintf(gone, sizeof gone, "%s.gone", d);
  int a = -1;
  CHECK_OK(tdm_ckpt_lock(d, &a));
  CHECK_OK(tdm_ckpt_lock_check(d, a));
  CHECK_OK(tdm_ckpt_lock_check(d, -1)); /* no lock held: nothing to check */
  CHECK(tdm_ckpt_lock_check(NULL, a) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("directory NULL");
  CHECK(rename(d, gone) == 0 && mkdir(d, 0755) == 0);
  CHECK(tdm_ckpt_lock_check(d, a) == TDM_ERR_IO);
  CHECK_ERR_HAS("was removed or replaced while this job ran");
  CHECK_ERR_HAS(d);
  tdm_ckpt_unlock(a);
  rm_rf(d), rm_rf(gone);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/tandem-test-ckpt-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  static const tdm_test_case cases[] = {T(test_round_trip), T(test_checksum_covers_the_header), T(test_metadata_is_parsed_strictly),
                                        T(test_bad_entries_are_skipped_and_never_deleted), T(test_no_valid_checkpoint_is_an_error),
                                        T(test_lock_names_the_holder), T(test_lock_check_sees_a_replaced_directory)};
  int rc = tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
  rm_rf(dir);
  return rc;
}
