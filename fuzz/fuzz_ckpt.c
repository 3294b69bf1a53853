/* Checkpoint files through tdm_ckpt_open (format version, the checksum over every metadata pair
 * and tensor, the strict metadata) and a sharded checkpoint's list of shard checksums
 * ("tandem.shard_crcs") through tdm_ckpt_open_shard. Each input is opened as it is, and again
 * re-signed when it is a safetensors file (its "tandem.crc32" recomputed and the file written
 * anew), so that mutations get past the checksum to the checks behind it.
 * After a success: step, optimizer steps, world size and seed in range and written canonically,
 * format 2, kind checkpoint, and the checksum stored is the one computed here over the file's
 * metadata and tensors; a shard opened is its rank's (its own metadata says so) and its checksum
 * is the rank's entry of a well-formed list: exactly world-size entries of 8 lowercase hex digits.
 * After a failure: TDM_ERR_FORMAT or TDM_ERR_IO whose detail starts with the file's path (a rank
 * outside the world: TDM_ERR_INVALID_ARG).
 * The directory holds the shards of step 5 on 2 ranks, which the seed valid-sharded lists.
 * TANDEM_FUZZ_CKPT_SEEDS=DIR writes the seeds (fuzz/corpus/ckpt) into DIR. */
#include "fuzz.h"

#include "core/json.h"
#include "tandem/checkpoint.h"

#define STEP 5
#define MAX_STEP ((int64_t)1 << 62)
#define MAX_WORLD (1 << 24)

static char dir[300], raw_path[400], signed_path[400];

/* ---- a file's metadata pairs and tensors, parsed here ------------------------------------------ */
typedef struct {
  tdm_safetensors *f;
  tdm_json *json;
  const char **kv; /* room for one more pair */
  int n, nt;
  tdm_st_tensor *ts;
} parsed;

static void release(parsed *p) {
  free(p->ts);
  free(p->kv);
  tdm__json_free(p->json);
  tdm_safetensors_destroy(p->f);
}

static int parse(parsed *p, const uint8_t *data, size_t size) {
  memset(p, 0, sizeof *p);
  if (tdm_safetensors_parse(&p->f, data, size, "fuzz") != TDM_OK) return 0;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
  FUZZ_CHECK(tdm__json_parse((const char *)data + 8, hlen, &p->json) == TDM_OK); /* the reader took it */
  const tdm_json *m = tdm__json_get(p->json, "__metadata__");
  p->n = m ? m->n : 0;
  p->kv = malloc(sizeof *p->kv * (2 * (size_t)p->n + 2));
  for (int i = 0; i < p->n; i++) {
    FUZZ_CHECK(m->items[i].type == TDM_JSON_STR);
    p->kv[2 * i] = m->keys[i];
    p->kv[2 * i + 1] = m->items[i].str;
  }
  p->nt = tdm_safetensors_count(p->f);
  p->ts = malloc(sizeof *p->ts * ((size_t)p->nt + 1));
  for (int i = 0; i < p->nt; i++) p->ts[i] = *tdm_safetensors_at(p->f, i);
  return 1;
}

static uint8_t *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  FUZZ_CHECK(f != NULL);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)len + 1);
  FUZZ_CHECK(b && fread(b, 1, (size_t)len, f) == (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

/* ---- the checks ----------------------------------------------------------------------------------- */
static int starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* Whether meta is v written canonically (as the writer writes it). */
static int canonical(const char *meta, unsigned long long v) {
  char s[32];
  snprintf(s, sizeof s, "%llu", v);
  return meta && !strcmp(meta, s);
}

/* Entry r of a well-formed shard list of W entries into want; 0 if the list is not well-formed. */
static int list_entry(const char *list, int W, int r, char want[9]) {
  int k = 0;
  for (const char *at = list;; k++) {
    size_t n = strcspn(at, ",");
    if (n != 8 || strspn(at, "0123456789abcdef") < 8) return 0;
    if (k == r) memcpy(want, at, 8), want[8] = 0;
    if (!at[n]) break;
    at += n + 1;
  }
  return k + 1 == W;
}

static void check_shards(const tdm_ckpt *c) {
  const tdm_ckpt_info *in = tdm_ckpt_get_info(c);
  const char *list = tdm_ckpt_meta(c, "tandem.shard_crcs");
  tdm_ckpt *s = (tdm_ckpt *)1;
  if (!list) {
    FUZZ_CHECK(tdm_ckpt_open_shard(c, 0, &s) == TDM_ERR_FORMAT && s == NULL);
    FUZZ_CHECK(starts_with(tdm_last_error(), tdm_ckpt_path(c)));
    return;
  }
  int W = in->world_size, ranks[] = {-1, 0, 1, 2, W - 1, W};
  char want[9], got[16];
  FUZZ_CHECK(list_entry(list, W, 0, want)); /* checked at open */
  for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
    int r = ranks[i];
    s = (tdm_ckpt *)1;
    tdm_status st = tdm_ckpt_open_shard(c, r, &s);
    if (r < 0 || r >= W) {
      FUZZ_CHECK(st == TDM_ERR_INVALID_ARG && s == NULL);
      continue;
    }
    char sp[800];
    snprintf(sp, sizeof sp, "%s/ckpt-%012lld.shards/rank-%d.safetensors", dir, (long long)in->step, r);
    if (st != TDM_OK) {
      FUZZ_CHECK(s == NULL && (st == TDM_ERR_FORMAT || st == TDM_ERR_IO));
      FUZZ_CHECK(starts_with(tdm_last_error(), tdm_ckpt_path(c)) || starts_with(tdm_last_error(), sp));
      continue;
    }
    FUZZ_CHECK(list_entry(list, W, r, want));
    snprintf(got, sizeof got, "%08x", tdm_ckpt_get_crc(s));
    FUZZ_CHECK(!strcmp(got, want));
    FUZZ_CHECK(!strcmp(tdm_ckpt_path(s), sp) && canonical(tdm_ckpt_meta(s, "tandem.shard_rank"), (unsigned)r));
    FUZZ_CHECK(tdm_ckpt_get_info(s)->step == in->step && tdm_ckpt_get_info(s)->world_size == W);
    tdm_ckpt_close(s);
  }
}

/* Opens path, which holds data[0..size). */
static void check_open(const char *path, const uint8_t *data, size_t size) {
  tdm_ckpt *c = (tdm_ckpt *)1;
  tdm_status st = tdm_ckpt_open(&c, path);
  if (st != TDM_OK) {
    FUZZ_CHECK(c == NULL && (st == TDM_ERR_FORMAT || st == TDM_ERR_IO));
    FUZZ_CHECK(starts_with(tdm_last_error(), path));
    return;
  }
  parsed p;
  FUZZ_CHECK(parse(&p, data, size));
  const tdm_ckpt_info *in = tdm_ckpt_get_info(c);
  int64_t os = tdm_ckpt_get_optim_steps(c);
  FUZZ_CHECK(in->step >= 0 && in->step <= MAX_STEP && os >= 0 && os <= MAX_STEP);
  FUZZ_CHECK(in->world_size >= 1 && in->world_size <= MAX_WORLD);
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.step"), (unsigned long long)in->step));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.optim_steps"), (unsigned long long)os));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.world_size"), (unsigned long long)in->world_size));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.seed"), (unsigned long long)in->seed));
  FUZZ_CHECK(canonical(tdm_ckpt_meta(c, "tandem.ckpt_version"), TDM_CKPT_VERSION));
  FUZZ_CHECK(!strcmp(tdm_ckpt_meta(c, "tandem.kind"), "checkpoint"));
  uint32_t crc;
  char hex[16];
  FUZZ_CHECK(tdm_ckpt_checksum(p.n, p.kv, p.nt, p.ts, &crc) == TDM_OK && crc == tdm_ckpt_get_crc(c));
  snprintf(hex, sizeof hex, "%08x", crc);
  FUZZ_CHECK(!strcmp(tdm_ckpt_meta(c, "tandem.crc32"), hex));
  for (int i = 0; i < p.nt; i++) FUZZ_CHECK(tdm_ckpt_find(c, p.ts[i].name) != NULL);
  check_shards(c);
  tdm_ckpt_close(c);
  release(&p);
}

/* Writes path with the pairs and tensors of p and its checksum recomputed (added if missing). */
static int sign_to(const char *path, parsed *p) {
  int k = 0;
  while (k < p->n && strcmp(p->kv[2 * k], "tandem.crc32")) k++;
  if (k == p->n) p->kv[2 * p->n++] = "tandem.crc32";
  uint32_t crc;
  char hex[16];
  FUZZ_CHECK(tdm_ckpt_checksum(p->n, p->kv, p->nt, p->ts, &crc) == TDM_OK);
  snprintf(hex, sizeof hex, "%08x", crc);
  p->kv[2 * k + 1] = hex;
  int ok = tdm_safetensors_save(path, p->nt, p->ts, p->n, p->kv) == TDM_OK;
  p->kv[2 * k + 1] = NULL; /* hex goes out of scope */
  return ok;
}

/* ---- the directory and the seeds ----------------------------------------------------------------- */
static float weights[6] = {0.5f, -1, 2, 3.25f, 0, 7}, state[4] = {1, 2, 3, 4}, shard_state[2][3] = {{1, 1, 1}, {2, 2, 2}};

static void copy_file(const char *from, const char *to) {
  size_t n;
  uint8_t *b = read_all(from, &n);
  fuzz_write(to, b, n);
  free(b);
}

/* The seed at out/name: the checkpoint from with key set to value (NULL: left out), re-signed. */
static void signed_seed(const char *out, const char *name, const char *from, const char *key, const char *value) {
  char to[800];
  size_t n;
  uint8_t *b = read_all(from, &n);
  parsed p;
  FUZZ_CHECK(parse(&p, b, n));
  int k = 0;
  while (k < p.n && strcmp(p.kv[2 * k], key)) k++;
  if (k == p.n) p.kv[2 * p.n++] = key;
  if (value) p.kv[2 * k + 1] = value;
  else p.kv[2 * k] = p.kv[2 * (p.n - 1)], p.kv[2 * k + 1] = p.kv[2 * (p.n - 1) + 1], p.n--;
  snprintf(to, sizeof to, "%s/%s", out, name);
  FUZZ_CHECK(sign_to(to, &p));
  release(&p);
  free(b);
}

static void write_seeds(const char *out, const uint32_t crc[2]) {
  char sd[400], from[800], to[800], list[32];
  snprintf(sd, sizeof sd, "%s/seeds", dir);
  tdm_st_tensor ts[2] = {{"model.w", TDM_F32, 2, {2, 3}, weights, sizeof weights},
                         {"optim.state", TDM_F32, 1, {4}, state, sizeof state}};
  const char *extra[] = {"tandem.model", "mlp"};
  tdm_ckpt_info info = {STEP, 1, 7, 1, extra};
  FUZZ_CHECK(tdm_ckpt_save_tensors(sd, &info, 3, 2, ts, 1) == TDM_OK);
  snprintf(from, sizeof from, "%s/ckpt-%012d.safetensors", sd, STEP);
  snprintf(to, sizeof to, "%s/valid-plain", out);
  copy_file(from, to);
  snprintf(list, sizeof list, "%08x,%08x", crc[0], crc[1]);
  const char *sharded[] = {"tandem.shard_crcs", list};
  tdm_ckpt_info si = {STEP, 2, 7, 1, sharded};
  char md[400];
  snprintf(md, sizeof md, "%s/sharded", dir);
  FUZZ_CHECK(tdm_ckpt_save_tensors(md, &si, 3, 1, ts, 1) == TDM_OK);
  snprintf(from, sizeof from, "%s/ckpt-%012d.safetensors", md, STEP);
  snprintf(to, sizeof to, "%s/valid-sharded", out);
  copy_file(from, to);
  snprintf(from, sizeof from, "%s/ckpt-%012d.shards/rank-1.safetensors", dir, STEP);
  snprintf(to, sizeof to, "%s/valid-shard-rank-1", out);
  copy_file(from, to);
  static const char *const bad[][3] = {
      {"bad-step-text", "tandem.step", "abc"},        {"bad-step-leading-zero", "tandem.step", "05"},
      {"bad-step-too-large", "tandem.step", "4611686018427387905"},
      {"bad-world-0", "tandem.world_size", "0"},      {"bad-world-too-large", "tandem.world_size", "16777217"},
      {"bad-seed-negative", "tandem.seed", "-7"},     {"bad-version-3", "tandem.ckpt_version", "3"},
      {"bad-format-1", "tandem.ckpt_version", NULL},  {"bad-kind", "tandem.kind", "weights"},
      {"bad-shard-list-short", "tandem.shard_crcs", "00000000"},
      {"bad-shard-list-junk", "tandem.shard_crcs", "zz,,0123456789"},
  };
  snprintf(from, sizeof from, "%s/valid-plain", out);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) signed_seed(out, bad[i][0], from, bad[i][1], bad[i][2]);
  /* and with a world of 2 around the shards: one entry too many, upper case */
  static const char *const lists[][2] = {{"bad-shard-list-long", "%08x,%08x,%08x"}, {"bad-shard-list-upper", "%08X,%08X"}};
  snprintf(from, sizeof from, "%s/valid-sharded", out);
  for (int i = 0; i < 2; i++) {
    snprintf(list, sizeof list, lists[i][1], crc[0], crc[1], crc[0]);
    signed_seed(out, lists[i][0], from, "tandem.shard_crcs", list);
  }
  size_t n;
  snprintf(from, sizeof from, "%s/valid-plain", out);
  uint8_t *b = read_all(from, &n);
  b[n - 1] ^= 1; /* a bit of optim.state */
  snprintf(to, sizeof to, "%s/bad-checksum", out);
  fuzz_write(to, b, n);
  free(b);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "%s", fuzz_tmpdir());
  snprintf(raw_path, sizeof raw_path, "%s/ckpt-%012d.safetensors", dir, STEP);
  snprintf(signed_path, sizeof signed_path, "%s/ckpt-%012d.safetensors", dir, STEP + 1);
  uint32_t crc[2];
  for (int r = 0; r < 2; r++) {
    tdm_st_tensor t = {"optim.state.shard", TDM_F32, 1, {3}, shard_state[r], sizeof shard_state[r]};
    tdm_ckpt_info info = {STEP, 2, 7, 0, NULL};
    FUZZ_CHECK(tdm_ckpt_save_shard(dir, &info, r, 1, &t, &crc[r]) == TDM_OK);
  }
  const char *out = getenv("TANDEM_FUZZ_CKPT_SEEDS");
  if (out) write_seeds(out, crc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) setup(), ready = 1;
  fuzz_write(raw_path, data, size);
  check_open(raw_path, data, size);
  parsed p;
  if (parse(&p, data, size)) {
    if (sign_to(signed_path, &p)) {
      size_t n;
      uint8_t *b = read_all(signed_path, &n);
      check_open(signed_path, b, n);
      free(b);
    }
    release(&p);
  }
  return 0;
}
