/* Files: safetensors (round trip, metadata, hostile headers), parameter load checks, IDX files
 * (plain, gzip'd, bad magic, truncated, trailing bytes, missing). */
#include <unistd.h>
#include <zlib.h>

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

static void test_safetensors_round_trip(void) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  int64_t b[2] = {-7, 1LL << 40};
  uint16_t h[3] = {0x3c00, 0x4000, 0xc000};
  tdm_st_tensor ts[3] = {{"a.weight", TDM_F32, 2, {2, 3}, a, 24},
                         {"idx", TDM_I64, 1, {2}, b, 16},
                         {"half \"quoted\"", TDM_F16, 1, {3}, h, 6}};
  const char *meta[] = {"n_layer", "12", "note", "tab\there"};
  CHECK_OK(tdm_safetensors_save(path("rt.safetensors"), 3, ts, 2, meta));
  CHECK(access(path("rt.safetensors.tmp"), F_OK) != 0); /* renamed into place */
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
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12"},    /* size mismatch */
      {"{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "Q7"},          /* unknown dtype */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "dimension"}, /* negative dim */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},                      /* missing field */
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "overlap"},
      {"{\"a\": [1, 2", 8, "bad header"}, /* broken JSON */
      {"[1, 2]", 0, "not a JSON object"},
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
  write_file(path("tiny.safetensors"), huge, 3);
  CHECK(tdm_safetensors_load(&f, path("tiny.safetensors")) == TDM_ERR_FORMAT);
  CHECK(tdm_safetensors_load(&f, path("absent.safetensors")) == TDM_ERR_IO);
  CHECK_ERR_HAS("absent.safetensors");
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
  static const tdm_test_case cases[] = {T(test_safetensors_round_trip), T(test_safetensors_rejects_bad_files),
                                        T(test_params_load_checks_names_and_shapes), T(test_idx_files),
                                        T(test_text_and_token_files)};
  int rc = tdm_test_main(cases, 5);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}
