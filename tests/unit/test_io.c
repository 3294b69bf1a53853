/* Files: safetensors (round trip, metadata, hostile headers, edge cases the format allows, saving
 * through planted links and failing half-way), the JSON reader under them, parameter load checks,
 * IDX files (plain, gzip'd, bad magic, truncated, trailing bytes, oversized dimensions, missing,
 * the cache of decompressed copies),
 * text and token files, and FIFOs, pipes and directories where files are expected. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "core/json.h"
#include "tdm_test.h"

static char dir[64];

static const char *path(const char *name) {
  static char buf[4][256];
  static int k;
  char *b = buf[k++ & 3];
  snprintf(b, 256, "%s/%s", dir, name);
  return b;
}

static void write_file(const char *p, const void *data, size_t n) {
  FILE *f = fopen(p, "wb");
  fwrite(data, 1, n, f);
  fclose(f);
}

static int count_entries(const char *d) {
  DIR *dp = opendir(d);
  int n = 0;
  for (struct dirent *e; dp && (e = readdir(dp));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (dp) closedir(dp);
  return n;
}

static int file_is(const char *p, const char *text) {
  char buf[64] = {0};
  FILE *fp = fopen(p, "rb");
  if (!fp) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  return n == strlen(text) && !memcmp(buf, text, n);
}

static void test_safetensors_round_trip(void) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  int64_t b[2] = {-7, 1LL << 40};
  uint16_t h[3] = {0x3c00, 0x4000, 0xc000};
  tdm_st_tensor ts[3] = {{"a.weight", TDM_F32, 2, {2, 3}, a, 24},
                         {"idx", TDM_I64, 1, {2}, b, 16},
                         {"half \"quoted\"", TDM_F16, 1, {3}, h, 6}};
  const char *meta[] = {"n_layer", "12", "note", "tab\there"};
  CHECK_OK(tdm_safetensors_save(path("rt.safetensors"), 3, ts, 2, meta));
  CHECK(count_entries(dir) == 1); /* renamed into place, no temporary left */
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, path("rt.safetensors")));
  if (!f) return;
  CHECK(tdm_safetensors_count(f) == 3);
  const tdm_st_tensor *t = tdm_safetensors_find(f, "a.weight");
  CHECK(t && t->ndim == 2 && t->shape[1] == 3 && !memcmp(t->data, a, 24));
  t = tdm_safetensors_find(f, "idx");
  CHECK(t && t->dtype == TDM_I64 && !memcmp(t->data, b, 16));
  t = tdm_safetensors_find(f, "half \"quoted\"");
  CHECK(t && t->dtype == TDM_F16 && !memcmp(t->data, h, 6));
  CHECK(tdm_safetensors_meta(f, "n_layer") && !strcmp(tdm_safetensors_meta(f, "n_layer"), "12"));
  CHECK(tdm_safetensors_meta(f, "note") && !strcmp(tdm_safetensors_meta(f, "note"), "tab\there"));
  CHECK(tdm_safetensors_meta(f, "missing") == NULL);
  tdm_safetensors_destroy(f);
}

static void write_st(const char *p, const char *header, size_t data_bytes) {
  size_t hn = strlen(header);
  unsigned char buf[4096] = {0};
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hn >> (8 * i));
  memcpy(buf + 8, header, hn);
  write_file(p, buf, 8 + hn + data_bytes);
}

static void test_safetensors_rejects_bad_files(void) {
  static const struct {
    const char *header;
    size_t data;
    const char *expect;
  } bad[] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "within"},     /* truncated data */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12"},    /* size mismatch */
      {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "Q7"},          /* unknown dtype */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "dimension"}, /* negative dim */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},                      /* missing field */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "overlap"},
      {"{\"a\": [1, 2", 8, "bad header"}, /* broken JSON */
      {"[1, 2]", 0, "not a JSON object"},
      /* duplicate tensor names */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "duplicate key 'a'"},
      /* a shape whose product overflows int64 (it wrapped to 0 bytes and was accepted) */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, "overflows"},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[3037000500,3037000500],\"data_offsets\":[0,0]}}", 0, "overflows"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8, "dimension 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "7 dimensions"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "dimension 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "dimension 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-4,4]}}", 8, "0 <= begin <= end"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "0 <= begin <= end"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8]}}", 8, "0 <= begin <= end"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8, "data_offsets"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8, "unknown field 'extra'"},
      {"{\"a\":5}", 0, "tensor 'a': not an object"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "value of 'k' is not a string"},
      {"{\"__metadata__\":[1]}", 0, "__metadata__ is not an object"},
      {"{} x", 0, "trailing characters"},
      {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "\\u0000"},
      {"{\"a\\uzzzz\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "4 hex digits"},
      {"{\"a\xc0\x80\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "invalid UTF-8"},
      {"{\"a\x01\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "control character"},
      /* an empty tensor between two that overlap does not hide the overlap */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "tensors 'a' and 'b' overlap"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_st(path("bad.safetensors"), bad[i].header, bad[i].data);
    tdm_safetensors *f = NULL;
    CHECK_MSG(tdm_safetensors_load(&f, path("bad.safetensors")) == TDM_ERR_FORMAT && f == NULL, "case %zu", i);
    CHECK_ERR_HAS(bad[i].expect);
  }
  unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
  write_file(path("huge.safetensors"), huge, sizeof huge);
  tdm_safetensors *f = NULL;
  CHECK(tdm_safetensors_load(&f, path("huge.safetensors")) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("header length");
  unsigned char past[16] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '}'}; /* 9 header bytes in a 10-byte file */
  write_file(path("past.safetensors"), past, 10);
  CHECK(tdm_safetensors_load(&f, path("past.safetensors")) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("runs past the end of the file");
  write_file(path("tiny.safetensors"), huge, 3);
  CHECK(tdm_safetensors_load(&f, path("tiny.safetensors")) == TDM_ERR_FORMAT);
  CHECK(tdm_safetensors_load(&f, path("absent.safetensors")) == TDM_ERR_IO);
  CHECK_ERR_HAS("absent.safetensors");
}

/* What the format allows at its edges loads, with the right content. */
static void test_safetensors_accepts_edge_cases(void) {
  static const char *ok[] = {
      /* empty tensors at any offset in range: inside another's bytes, at the start, at the end */
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
      "\"s\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
      "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}",
      /* a zero dimension makes any other dimension harmless; a scalar has no dimensions */
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}    ",
      "{}",
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    write_st(path("ok.safetensors"), ok[i], 8);
    tdm_safetensors *f = NULL;
    tdm_status st = tdm_safetensors_load(&f, path("ok.safetensors"));
    CHECK_MSG(st == TDM_OK, "case %zu: %s", i, tdm_last_error());
    if (i == 0 && f) {
      const tdm_st_tensor *z = tdm_safetensors_find(f, "z");
      CHECK(tdm_safetensors_count(f) == 4 && z && z->nbytes == 0 && z->ndim == 1 && z->shape[0] == 0);
    }
    if (i == 1 && f) {
      const tdm_st_tensor *a = tdm_safetensors_find(f, "a"), *b = tdm_safetensors_find(f, "b");
      CHECK(a && a->ndim == 3 && a->shape[1] == 4294967296LL && a->nbytes == 0 && b && b->ndim == 0 && b->nbytes == 4);
    }
    tdm_safetensors_destroy(f);
  }
  /* escapes decode to UTF-8: two names that differ only beyond ASCII stay two names */
  const char *h = "{\"a\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"a\\u00e8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                  "\"\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}";
  write_st(path("utf8.safetensors"), h, 8);
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, path("utf8.safetensors")));
  if (f) {
    const tdm_st_tensor *e = tdm_safetensors_find(f, "a\xc3\xa9"), *g = tdm_safetensors_find(f, "a\xc3\xa8"),
                        *smile = tdm_safetensors_find(f, "\xf0\x9f\x98\x80");
    CHECK(e && g && smile && e != g && (const char *)g->data - (const char *)e->data == 1);
    tdm_safetensors_destroy(f);
  }
  /* a header not padded to 8 bytes and an offset that is not a multiple of 4: the data comes back
   * aligned to its element size, with the file's values (readers load whole elements) */
  unsigned char odd[128] = {0};
  const char *ho = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
  size_t hon = strlen(ho);
  float vals[2] = {1.5f, -2.25f};
  odd[0] = (unsigned char)hon;
  memcpy(odd + 8, ho, hon);
  memcpy(odd + 8 + hon + 1, vals, 8);
  CHECK_OK(tdm_safetensors_parse(&f, odd, 8 + hon + 9, "odd"));
  if (f) {
    const tdm_st_tensor *a = tdm_safetensors_find(f, "a");
    CHECK(a && (uintptr_t)a->data % 4 == 0 && !memcmp(a->data, vals, 8));
    tdm_safetensors_destroy(f);
  }
  /* from memory: the same checks, the given name in messages */
  unsigned char buf[256] = {0};
  const char *hm = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  size_t hn = strlen(hm);
  buf[0] = (unsigned char)hn;
  memcpy(buf + 8, hm, hn);
  CHECK_OK(tdm_safetensors_parse(&f, buf, 8 + hn + 8, "mem"));
  if (f) {
    CHECK(tdm_safetensors_count(f) == 1 && tdm_safetensors_find(f, "a")->nbytes == 8);
    tdm_safetensors_destroy(f);
  }
  CHECK(tdm_safetensors_parse(&f, buf, 8 + hn + 4, "mem") == TDM_ERR_FORMAT && f == NULL);
  CHECK_ERR_HAS("mem: tensor 'a'");
}

/* Runs fn in a child process that must finish within 10 s (a FIFO must never block). */
static int in_child(int (*fn)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    _exit(fn());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
  if (WIFSIGNALED(status)) fprintf(stderr, "  child killed by signal %d (blocked?)\n", WTERMSIG(status));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int err_is(tdm_status st, tdm_status want, const char *text) {
  if (st == want && strstr(tdm_last_error(), text)) return 0;
  fprintf(stderr, "  got %s: %s; expected %s with '%s'\n", tdm_status_str(st), tdm_last_error(), tdm_status_str(want), text);
  return 1;
}

static int load_st_fifo(void) {
  tdm_safetensors *f;
  return err_is(tdm_safetensors_load(&f, path("fifo")), TDM_ERR_IO, "not a regular file but a FIFO or pipe");
}
static int load_text_fifo(void) {
  tdm_dataset *ds;
  return err_is(tdm_dataset_open_text(&ds, path("fifo"), 4), TDM_ERR_IO, "not a regular file but a FIFO or pipe");
}
static int load_tokens_fifo(void) {
  tdm_dataset *ds;
  return err_is(tdm_dataset_open_tokens_u16(&ds, path("fifo"), 4, 50), TDM_ERR_IO, "not a regular file but a FIFO or pipe");
}
static int load_idx_fifo(void) {
  tdm_idx x;
  return err_is(tdm_idx_read(path("fifo"), &x), TDM_ERR_IO, "not a regular file but a FIFO or pipe");
}
static int load_text_pipe(void) { /* what --data-path /dev/stdin is when stdin is a pipe */
  int fds[2];
  if (pipe(fds) != 0) return 1;
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fds[0]);
  tdm_dataset *ds;
  return err_is(tdm_dataset_open_text(&ds, p, 4), TDM_ERR_IO, "not a regular file but a FIFO or pipe");
}

/* Files whose size cannot be known are refused with a message saying so, and a FIFO without a
 * writer never blocks the reader. */
static void test_fifos_and_directories_refused(void) {
  unlink(path("fifo"));
  CHECK(mkfifo(path("fifo"), 0600) == 0);
  CHECK(in_child(load_st_fifo));
  CHECK(in_child(load_text_fifo));
  CHECK(in_child(load_tokens_fifo));
  CHECK(in_child(load_idx_fifo));
  CHECK(in_child(load_text_pipe));
  tdm_dataset *ds;
  tdm_safetensors *f;
  CHECK(tdm_dataset_open_text(&ds, dir, 4) == TDM_ERR_IO);
  CHECK_ERR_HAS("not a regular file but a directory");
  CHECK(tdm_safetensors_load(&f, dir) == TDM_ERR_IO);
  CHECK_ERR_HAS("not a regular file but a directory");
}

/* A symbolic link planted at the old predictable temporary name (and at other plausible ones)
 * must not make the save write through it; the save still succeeds. */
static void test_save_never_follows_planted_links(void) {
  char d[96];
  snprintf(d, sizeof d, "%s/links", dir);
  CHECK(mkdir(d, 0700) == 0);
  char victim[160], w[160], link[8][192];
  snprintf(victim, sizeof victim, "%s/victim", d);
  snprintf(w, sizeof w, "%s/w.safetensors", d);
  write_file(victim, "precious", 8);
  const char *fmt[] = {"%s.tmp", "%s.tmp.%d", "%s~", "%s.part"};
  int n_links = 0;
  for (int i = 0; i < 4; i++, n_links++) {
    snprintf(link[i], sizeof link[i], fmt[i], w, (int)getpid());
    CHECK(symlink(victim, link[i]) == 0);
  }
  snprintf(link[n_links], sizeof link[n_links], "%s/.w.safetensors.tmp", d);
  CHECK(symlink(victim, link[n_links++]) == 0);
  float a[4] = {1, 2, 3, 4};
  tdm_st_tensor t = {"a", TDM_F32, 1, {4}, a, 16};
  CHECK_OK(tdm_safetensors_save(w, 1, &t, 0, NULL));
  CHECK(file_is(victim, "precious"));
  struct stat s;
  CHECK(lstat(w, &s) == 0 && S_ISREG(s.st_mode));
  for (int i = 0; i < n_links; i++) CHECK(lstat(link[i], &s) == 0 && S_ISLNK(s.st_mode));
  CHECK(count_entries(d) == 1 + n_links + 1); /* victim, the links, w: no temporary left */
  tdm_safetensors *f = NULL;
  CHECK_OK(tdm_safetensors_load(&f, w));
  CHECK(f && !memcmp(tdm_safetensors_find(f, "a")->data, a, 16));
  tdm_safetensors_destroy(f);
  /* the final name itself a link: the link is replaced, its target untouched */
  char w2[192];
  snprintf(w2, sizeof w2, "%s/w2.safetensors", d);
  CHECK(symlink(victim, w2) == 0);
  CHECK_OK(tdm_safetensors_save(w2, 1, &t, 0, NULL));
  CHECK(file_is(victim, "precious") && lstat(w2, &s) == 0 && S_ISREG(s.st_mode));
  /* the mode is 0666 less the umask */
  mode_t old = umask(022);
  CHECK_OK(tdm_safetensors_save(w, 1, &t, 0, NULL));
  CHECK(stat(w, &s) == 0 && (s.st_mode & 0777) == 0644);
  umask(077);
  CHECK_OK(tdm_safetensors_save(w, 1, &t, 0, NULL));
  CHECK(stat(w, &s) == 0 && (s.st_mode & 0777) == 0600);
  umask(old);
}

static char fsize_dir[128];
static int save_over_file_size_limit(void) {
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit r = {4096, 4096};
  if (setrlimit(RLIMIT_FSIZE, &r) != 0) return 2;
  static float big[16384];
  tdm_st_tensor t = {"big", TDM_F32, 1, {16384}, big, sizeof big};
  char w[192];
  snprintf(w, sizeof w, "%s/w.safetensors", fsize_dir);
  return err_is(tdm_safetensors_save(w, 1, &t, 0, NULL), TDM_ERR_IO, "w.safetensors: write failed");
}

/* A save that fails half-way leaves the old file as it was and no temporary behind; arguments the
 * reader would refuse are refused before anything is written. */
static void test_save_failures_leave_nothing(void) {
  snprintf(fsize_dir, sizeof fsize_dir, "%s/fsize", dir);
  CHECK(mkdir(fsize_dir, 0700) == 0);
  char w[192];
  snprintf(w, sizeof w, "%s/w.safetensors", fsize_dir);
  write_file(w, "old", 3);
  CHECK(in_child(save_over_file_size_limit));
  CHECK(file_is(w, "old") && count_entries(fsize_dir) == 1);
  float a[2] = {1, 2};
  tdm_st_tensor two[2] = {{"a", TDM_F32, 1, {2}, a, 8}, {"a", TDM_F32, 1, {1}, a, 4}};
  CHECK(tdm_safetensors_save(w, 2, two, 0, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("'a' given twice");
  two[1].name = "b";
  two[1].nbytes = 8; /* (1) F32 is 4 bytes */
  CHECK(tdm_safetensors_save(w, 2, two, 0, NULL) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("tensor 'b': 8 bytes");
  const char *meta[] = {"k", "v", "k", "w"};
  CHECK(tdm_safetensors_save(w, 1, two, 2, meta) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("metadata key 'k' given twice");
  CHECK(file_is(w, "old") && count_entries(fsize_dir) == 1);
  /* a missing directory or a directory as the path: the error names the path */
  char missing[192];
  snprintf(missing, sizeof missing, "%s/none/w.safetensors", fsize_dir);
  CHECK(tdm_safetensors_save(missing, 1, two, 0, NULL) == TDM_ERR_IO);
  CHECK_ERR_HAS(missing);
  CHECK(tdm_safetensors_check_writable(missing) == TDM_ERR_IO);
  CHECK(tdm_safetensors_save(fsize_dir, 1, two, 0, NULL) == TDM_ERR_IO);
  CHECK(tdm_safetensors_check_writable(fsize_dir) == TDM_ERR_IO);
  CHECK_ERR_HAS("is a directory");
  CHECK_OK(tdm_safetensors_check_writable(w));
  CHECK(file_is(w, "old") && count_entries(fsize_dir) == 1);
}

/* Each JSON string used to reserve the rest of the input: 200000 empty strings in 600 KB asked
 * for about 60 GB of address space. In a child limited to 2 GB more than it has (not under ASan,
 * whose shadow memory needs the address space), they parse. */
static int parse_many_strings(void) {
#ifndef __SANITIZE_ADDRESS__
  long vm_kb = 0;
  char line[256];
  FILE *st = fopen("/proc/self/status", "r");
  while (st && fgets(line, sizeof line, st))
    if (sscanf(line, "VmSize: %ld kB", &vm_kb) == 1) break;
  if (st) fclose(st);
  struct rlimit r = {(rlim_t)vm_kb * 1024 + (2ul << 30), (rlim_t)vm_kb * 1024 + (2ul << 30)};
  if (!vm_kb || setrlimit(RLIMIT_AS, &r) != 0) return 2;
#endif
  size_t many = 200000, len = 3 * many + 1;
  char *arr = malloc(len);
  if (!arr) return 3;
  for (size_t i = 0; i < many; i++) memcpy(arr + 3 * i, i ? ",\"\"" : "[\"\"", 3);
  arr[len - 1] = ']';
  tdm_json *big = NULL;
  int bad = err_is(tdm__json_parse(arr, len, &big), TDM_OK, "") ||
            !(big->n == (int)many && big->items[many - 1].type == TDM_JSON_STR && !big->items[many - 1].str[0]);
  tdm__json_free(big);
  free(arr);
  return bad;
}

/* The JSON reader behind the headers is strict (RFC 8259) and decodes every escape. */
static void test_json_strict(void) {
  static const struct {
    const char *text;
    const char *expect; /* NULL: accepted */
  } cases[] = {
      {"{\"a\":1,\"b\":{\"a\":2}}", NULL},
      {"{\"a\":1,\"b\":2,\"a\":3}", "duplicate key 'a'"},
      {"\"\\u0000\"", "\\u0000"},
      {"\"\\ud83d\"", "unpaired"},
      {"\"\\ude00\"", "unpaired"},
      {"\"\\u12g4\"", "4 hex digits"},
      {"\"\\q\"", "unknown escape"},
      {"\"a\tb\"", "control character"},
      {"\"\xed\xa0\x80\"", "invalid UTF-8"}, /* an encoded surrogate */
      {"\"\xf4\x90\x80\x80\"", "invalid UTF-8"}, /* above U+10FFFF */
      {"01", "trailing characters"},
      {"1.", "no digit after '.'"},
      {"1e", "no digit in the exponent"},
      {"-", "bad number"},
      {"+1", "unexpected character"},
      {"1e999", "out of the range"},
      {"[1,2]\0", "trailing characters"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tdm_json *j = NULL;
    size_t n = strlen(cases[i].text) + (i == sizeof cases / sizeof cases[0] - 1); /* the last one holds a NUL */
    tdm_status st = tdm__json_parse(cases[i].text, n, &j);
    if (!cases[i].expect) {
      CHECK_MSG(st == TDM_OK, "case %zu: %s", i, tdm_last_error());
    } else {
      CHECK_MSG(st == TDM_ERR_FORMAT && j == NULL, "case %zu accepted", i);
      CHECK_ERR_HAS(cases[i].expect);
    }
    tdm__json_free(j);
  }
  CHECK(in_child(parse_many_strings));
  const char *nums = "[99999999999999999999, -9223372036854775808, 1e2, 0, -0, \"\\u00e9\\ud83d\\ude00\\/\"]";
  tdm_json *j = NULL;
  CHECK_OK(tdm__json_parse(nums, strlen(nums), &j));
  if (j) {
    CHECK(!j->items[0].is_int && j->items[0].num == 1e20);
    CHECK(j->items[1].is_int && j->items[1].inum == INT64_MIN);
    CHECK(!j->items[2].is_int && j->items[2].num == 100);
    CHECK(j->items[3].is_int && j->items[3].inum == 0 && j->items[4].is_int && j->items[4].inum == 0);
    CHECK(!strcmp(j->items[5].str, "\xc3\xa9\xf0\x9f\x98\x80/"));
  }
  tdm__json_free(j);
}

static void test_params_load_checks_names_and_shapes(void) {
  tdm_model_config mc = tdm_model_config_mlp();
  mc.in_features = 6;
  mc.hidden[0] = 5;
  mc.hidden[1] = 4;
  mc.n_classes = 3;
  tdm_model *a, *b;
  CHECK_OK(tdm_model_create(&a, &mc, 1));
  CHECK_OK(tdm_model_create(&b, &mc, 2));
  CHECK_OK(tdm_params_save(tdm_model_params(a), path("mlp.safetensors"), 0, NULL));
  CHECK(memcmp(tdm_params_data(tdm_model_params(a)), tdm_params_data(tdm_model_params(b)), 4 * 10) != 0);
  CHECK_OK(tdm_params_load(tdm_model_params(b), path("mlp.safetensors"), 0));
  CHECK(!memcmp(tdm_params_data(tdm_model_params(a)), tdm_params_data(tdm_model_params(b)),
                sizeof(float) * (size_t)tdm_params_numel(tdm_model_params(a))));
  /* a wider model must refuse the file, naming the parameter and both shapes, and stay untouched */
  mc.hidden[0] = 7;
  tdm_model *c;
  CHECK_OK(tdm_model_create(&c, &mc, 3));
  float first = tdm_params_data(tdm_model_params(c))[0];
  CHECK(tdm_params_load(tdm_model_params(c), path("mlp.safetensors"), 0) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("layers.0.weight");
  CHECK_ERR_HAS("(5, 6)");
  CHECK_ERR_HAS("(7, 6)");
  CHECK(tdm_params_data(tdm_model_params(c))[0] == first);
  tdm_model_destroy(a);
  tdm_model_destroy(b);
  tdm_model_destroy(c);
}

static void idx_bytes(unsigned char *buf, size_t *n, int ndim, const int *dims, int fill) {
  size_t k = 0, total = 1;
  buf[k++] = 0;
  buf[k++] = 0;
  buf[k++] = 8;
  buf[k++] = (unsigned char)ndim;
  for (int d = 0; d < ndim; d++) {
    buf[k++] = (unsigned char)(dims[d] >> 24);
    buf[k++] = (unsigned char)(dims[d] >> 16);
    buf[k++] = (unsigned char)(dims[d] >> 8);
    buf[k++] = (unsigned char)dims[d];
    total *= (size_t)dims[d];
  }
  for (size_t i = 0; i < total; i++) buf[k++] = (unsigned char)(fill >= 0 ? fill : (int)(i % 10));
  *n = k;
}

static void write_gz(const char *p, const void *data, size_t n) {
  gzFile g = gzopen(p, "wb");
  gzwrite(g, data, (unsigned)n);
  gzclose(g);
}

/* one file's whole content, or NULL (tdm__malloc'd) */
static unsigned char *slurp(const char *p, size_t *n) {
  FILE *fp = fopen(p, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = tdm__malloc((size_t)len + 1);
  *n = b ? fread(b, 1, (size_t)len, fp) : 0;
  fclose(fp);
  return b;
}

/* the one regular file in d (its path in out), or 0 when there is none or more than one */
static int only_file(const char *d, char *out, size_t cap) {
  DIR *dp = opendir(d);
  int n = 0;
  for (struct dirent *e; dp && (e = readdir(dp));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++, snprintf(out, cap, "%s/%s", d, e->d_name);
  if (dp) closedir(dp);
  return n == 1;
}

/* A large .gz is read once through zlib, then from its decompressed copy in TANDEM_CACHE_DIR:
 * trusted only when it has the gzip trailer's CRC-32 and length; a damaged copy is replaced, never
 * read as data; no copy of small files, none when the cache is off, none (and no error) where the
 * directory cannot be made. */
static void test_idx_cache(void) {
  int dims[3] = {300, 70, 70}; /* 1.47 MB of noise: the .gz stays above the 1 MiB threshold */
  size_t n = 16 + 300 * 70 * 70, got = 0;
  unsigned char *plain = tdm__malloc(n);
  size_t k;
  idx_bytes(plain, &k, 3, dims, 0);
  for (size_t i = 16; i < n; i++) plain[i] = (unsigned char)(tdm_hash64(7, i) >> 56);
  const char *src = path("big-idx3-ubyte.gz");
  write_gz(src, plain, n);
  char cache[128], copy[512];
  snprintf(cache, sizeof cache, "%s", path("cache"));
  setenv("TANDEM_CACHE_DIR", cache, 1);
  tdm_idx f;
  CHECK_OK(tdm_idx_read(src, &f));
  CHECK(f.n == 300 * 70 * 70 && f.data && !memcmp(f.data, plain + 16, (size_t)f.n));
  tdm_idx_free(&f);
  CHECK(only_file(cache, copy, sizeof copy));
  CHECK(strstr(copy, "/big-idx3-ubyte-") != NULL); /* named after the original, less .gz */
  unsigned char *c = slurp(copy, &got);
  CHECK(c && got == n && !memcmp(c, plain, n)); /* the plain IDX file */
  tdm__free(c);

  /* read from the copy: the original's body replaced by garbage (same size and time, trailer kept)
   * still reads, so the bytes came from the copy */
  size_t gn = 0;
  unsigned char *gz = slurp(src, &gn), *garbage = tdm__malloc(gn);
  struct stat sb;
  CHECK(gz && garbage && stat(src, &sb) == 0);
  if (gz && garbage) {
    memcpy(garbage, gz, gn);
    memset(garbage + 10, 0xee, gn - 18);
    write_file(src, garbage, gn);
    struct timespec times[2] = {sb.st_atim, sb.st_mtim};
    CHECK(utimensat(AT_FDCWD, src, times, 0) == 0);
    CHECK_OK(tdm_idx_read(src, &f));
    CHECK(f.data && !memcmp(f.data, plain + 16, (size_t)f.n));
    tdm_idx_free(&f);
    /* ... and a damaged copy is not trusted: with the garbage original the read fails */
    c = slurp(copy, &got);
    c[16 + 12345] ^= 1;
    write_file(copy, c, got);
    CHECK(tdm_idx_read(src, &f) != TDM_OK);
    /* with the real original back it reads right and the copy is written anew */
    write_file(src, gz, gn);
    CHECK(utimensat(AT_FDCWD, src, times, 0) == 0); /* the same name in the cache: the damaged copy is replaced */
    CHECK_OK(tdm_idx_read(src, &f));
    CHECK(f.data && !memcmp(f.data, plain + 16, (size_t)f.n));
    tdm_idx_free(&f);
    tdm__free(c);
    c = slurp(copy, &got);
    CHECK(c && got == n && !memcmp(c, plain, n));
    tdm__free(c);
  }
  tdm__free(gz);
  tdm__free(garbage);

  /* off: no copy; a directory that cannot be made: no copy, no error */
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
  CHECK(system(cmd) == 0);
  setenv("TANDEM_CACHE_DIR", "off", 1);
  CHECK_OK(tdm_idx_read(src, &f));
  tdm_idx_free(&f);
  CHECK(access(cache, F_OK) != 0);
  char blocked[160];
  snprintf(blocked, sizeof blocked, "%s/sub", path("big-idx3-ubyte.gz")); /* under a regular file */
  setenv("TANDEM_CACHE_DIR", blocked, 1);
  CHECK_OK(tdm_idx_read(src, &f));
  CHECK(f.data && !memcmp(f.data, plain + 16, (size_t)f.n));
  tdm_idx_free(&f);
  /* small files are not copied */
  setenv("TANDEM_CACHE_DIR", cache, 1);
  idx_bytes(plain, &k, 1, (int[]){4096}, 3);
  write_gz(path("small-idx1-ubyte.gz"), plain, k);
  CHECK_OK(tdm_idx_read(path("small-idx1-ubyte.gz"), &f));
  tdm_idx_free(&f);
  CHECK(access(cache, F_OK) != 0 || count_entries(cache) == 0);
  unsetenv("TANDEM_CACHE_DIR");
  tdm__free(plain);
}

static void test_idx_files(void) {
  unsigned char img[4096], lab[64];
  size_t ni, nl;
  int di[3] = {5, 4, 3}, dl[1] = {5};
  idx_bytes(img, &ni, 3, di, 200);
  idx_bytes(lab, &nl, 1, dl, -1);
  /* a complete set: images gzip'd, labels plain */
  write_gz(path("train-images-idx3-ubyte.gz"), img, ni);
  write_file(path("train-labels-idx1-ubyte"), lab, nl);
  write_gz(path("t10k-images-idx3-ubyte.gz"), img, ni);
  write_gz(path("t10k-labels-idx1-ubyte.gz"), lab, nl);
  tdm_dataset *ds = NULL;
  CHECK_OK(tdm_dataset_open_idx(&ds, dir, 1));
  if (ds) {
    CHECK(tdm_dataset_len(ds) == 5 && tdm_dataset_sample_numel(ds) == 12 && tdm_dataset_num_classes(ds) == 10);
    int64_t idx[2] = {4, 1};
    float x[24];
    int32_t y[2];
    CHECK_OK(tdm_dataset_batch(ds, idx, 2, x, y));
    CHECK(y[0] == 4 && y[1] == 1);
    CHECK_NEAR(x[0], 200.0 / 255.0, 1e-7);
    int64_t badi[1] = {5};
    CHECK(tdm_dataset_batch(ds, badi, 1, x, y) == TDM_ERR_INVALID_ARG);
    tdm_dataset_destroy(ds);
  }
  tdm_idx f;
  /* bad magic */
  unsigned char bad[64];
  memcpy(bad, lab, nl);
  bad[2] = 0x0d;
  write_file(path("magic"), bad, nl);
  CHECK(tdm_idx_read(path("magic"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("magic");
  /* truncated, plain and gzip'd */
  write_file(path("short"), img, ni - 7);
  CHECK(tdm_idx_read(path("short"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("truncated");
  write_gz(path("short.gz"), img, ni - 7);
  CHECK(tdm_idx_read(path("short.gz"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("truncated");
  /* trailing bytes */
  memcpy(bad, lab, nl);
  bad[nl] = 1;
  write_file(path("long"), bad, nl + 1);
  CHECK(tdm_idx_read(path("long"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("follow");
  /* labels that disagree with the images in count */
  int dl2[1] = {4};
  idx_bytes(lab, &nl, 1, dl2, 1);
  write_file(path("train-labels-idx1-ubyte"), lab, nl);
  CHECK(tdm_dataset_open_idx(&ds, dir, 1) == TDM_ERR_MISMATCH);
  CHECK_ERR_HAS("4 labels");
  /* a missing set says where to get it */
  CHECK(tdm_dataset_open_idx(&ds, "/nonexistent-dir", 1) == TDM_ERR_IO);
  CHECK_ERR_HAS("dataset-fashion-mnist");
}

static void idx_header(const char *p, int ndim, const uint32_t *dims) {
  unsigned char b[20] = {0, 0, 8, (unsigned char)ndim};
  for (int d = 0; d < ndim; d++)
    for (int k = 0; k < 4; k++) b[4 + 4 * d + k] = (unsigned char)(dims[d] >> (24 - 8 * k));
  write_file(p, b, 4 + 4 * (size_t)ndim);
}

/* Header fields out of range are named: the oversized dimension (not the one after it), a zero
 * dimension, a product that overflows; a header announcing more data than the file holds is
 * reported as truncated without first allocating what it announces. */
static void test_idx_dimensions(void) {
  tdm_idx f;
  uint32_t big[3] = {2147483648u, 28, 28};
  idx_header(path("big"), 3, big);
  CHECK(tdm_idx_read(path("big"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("dimension 0 is 2147483648: 2147483648 x 28 x 28 make 1683627180032 bytes");
  uint32_t last[3] = {28, 28, 4000000000u};
  idx_header(path("last"), 3, last);
  CHECK(tdm_idx_read(path("last"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("dimension 2 is 4000000000");
  uint32_t all[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}; /* the product overflows int64 */
  idx_header(path("all"), 4, all);
  CHECK(tdm_idx_read(path("all"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("more than");
  uint32_t zero[2] = {5, 0};
  idx_header(path("zero"), 2, zero);
  CHECK(tdm_idx_read(path("zero"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("dimension 1 is 0");
  uint32_t announce[3] = {65536, 65536, 4}; /* 16 GiB announced, nothing there */
  idx_header(path("announce"), 3, announce);
  CHECK(tdm_idx_read(path("announce"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("truncated: the dimensions announce 17179869184 bytes of data, the file has 0");
  unsigned char hdr[16] = {0, 0, 8, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 4};
  write_gz(path("announce.gz"), hdr, sizeof hdr);
  CHECK(tdm_idx_read(path("announce.gz"), &f) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("truncated: the dimensions announce 17179869184 bytes of data, the file has 0");
}

/* llm.c token-file header fields out of range, and vocabularies a uint16 token cannot span. */
static void test_token_file_headers(void) {
  unsigned char buf[1024 + 8] = {0};
  int32_t hdr[256] = {20240520, 1, 4};
  tdm_dataset *ds;
  struct {
    int32_t version, count;
    const char *expect;
  } bad[] = {{2, 4, "version 2; expected 1"}, {1, -1, "the header says -1 tokens, the file holds 4"},
             {1, 2147483647, "the header says 2147483647 tokens"}, {1, 3, "the header says 3 tokens"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hdr[1] = bad[i].version, hdr[2] = bad[i].count;
    memcpy(buf, hdr, sizeof hdr);
    write_file(path("hdr.bin"), buf, sizeof buf);
    CHECK_MSG(tdm_dataset_open_tokens_u16(&ds, path("hdr.bin"), 2, 50) == TDM_ERR_FORMAT, "case %zu", i);
    CHECK_ERR_HAS(bad[i].expect);
  }
  CHECK(tdm_dataset_open_tokens_u16(&ds, path("hdr.bin"), 2, 0) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("vocabulary 0 outside 1..65536");
  CHECK(tdm_dataset_open_tokens_u16(&ds, path("hdr.bin"), 2, 70000) == TDM_ERR_INVALID_ARG);
}

static void test_text_and_token_files(void) {
  write_file(path("t.txt"), "hello, world", 12);
  tdm_dataset *ds = NULL;
  CHECK_OK(tdm_dataset_open_text(&ds, path("t.txt"), 4)); /* 11 targets: 2 whole windows */
  if (ds) {
    CHECK(tdm_dataset_len(ds) == 2 && tdm_dataset_num_classes(ds) == 256);
    int64_t idx[1] = {1};
    int32_t x[4], y[4];
    CHECK_OK(tdm_dataset_tokens(ds, idx, 1, x, y));
    CHECK(x[0] == 'o' && x[3] == 'w' && y[0] == ',' && y[3] == 'o');
    int64_t bad[1] = {2};
    CHECK(tdm_dataset_tokens(ds, bad, 1, x, y) == TDM_ERR_INVALID_ARG);
    tdm_dataset_destroy(ds);
  }
  CHECK(tdm_dataset_open_text(&ds, path("t.txt"), 12) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("do not fill one window");
  /* llm.c layout: header + uint16 tokens */
  unsigned char buf[1024 + 20];
  int32_t hdr[256] = {20240520, 1, 10};
  memcpy(buf, hdr, sizeof hdr);
  for (int i = 0; i < 10; i++) {
    uint16_t v = (uint16_t)(i * 3);
    memcpy(buf + 1024 + 2 * i, &v, 2);
  }
  write_file(path("tok.bin"), buf, sizeof buf);
  CHECK_OK(tdm_dataset_open_tokens_u16(&ds, path("tok.bin"), 3, 50));
  if (ds) {
    int64_t idx[1] = {2};
    int32_t x[3], y[3];
    CHECK_OK(tdm_dataset_tokens(ds, idx, 1, x, y));
    CHECK(x[0] == 18 && y[2] == 27);
    tdm_dataset_destroy(ds);
  }
  CHECK(tdm_dataset_open_tokens_u16(&ds, path("tok.bin"), 3, 20) == TDM_ERR_FORMAT); /* token 21 >= 20 */
  CHECK_ERR_HAS("vocabulary size 20");
  hdr[0] = 7;
  memcpy(buf, hdr, sizeof hdr);
  write_file(path("bad.bin"), buf, sizeof buf);
  CHECK(tdm_dataset_open_tokens_u16(&ds, path("bad.bin"), 3, 50) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("magic 7");
  hdr[0] = 20240520;
  memcpy(buf, hdr, sizeof hdr);
  write_file(path("odd.bin"), buf, sizeof buf - 1);
  CHECK(tdm_dataset_open_tokens_u16(&ds, path("odd.bin"), 3, 50) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("odd");
  CHECK_OK(tdm_dataset_open_text(&ds, "data/tinyshakespeare.txt", 128)); /* the shipped corpus */
  if (ds) {
    CHECK(tdm_dataset_len(ds) == (1115394 - 1) / 128);
    tdm_dataset_destroy(ds);
  }
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/tandem-test-io-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  static const tdm_test_case cases[] = {
      T(test_safetensors_round_trip),         T(test_safetensors_rejects_bad_files), T(test_safetensors_accepts_edge_cases),
      T(test_save_never_follows_planted_links), T(test_save_failures_leave_nothing), T(test_json_strict),
      T(test_params_load_checks_names_and_shapes), T(test_idx_files),             T(test_idx_cache),                   T(test_idx_dimensions),
      T(test_text_and_token_files),           T(test_token_file_headers),          T(test_fifos_and_directories_refused)};
  int rc = tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}
