/* Checkpoints that reshard, in one process (ranks are threads over the thread transport): boxes cut
 * any flat range and copy any intersection; pieces of any split (columns, blocks, flat spans, a
 * scalar, a tensor only one rank holds) read back exactly, reading only the pieces asked for; the
 * pieces must tile every tensor; corrupt, truncated, swapped and missing files are named; an
 * engine saved at 4 ranks, ZeRO stage 3, resumes at 1, 2 and 3 ranks at every stage with the
 * saved state bit for bit, and trains on as the same state injected into data parallelism does;
 * another model or optimizer, and ranks that see different checkpoints, are refused; a corrupt
 * newest checkpoint falls back on every rank; the sampler's positions carry over to another
 * global batch without a sample skipped or repeated. */
#include <pthread.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reshard_model.h"
#include "tdm_test.h"
#include "train/ckpt_impl.h"

static char dir[64];

static const char *path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *path(const char *fmt, ...) {
  static char buf[16][600];
  static _Atomic int k;
  char *b = buf[k++ & 15], name[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  snprintf(b, 600, "%s/%s", dir, name);
  return b;
}

/* ---- boxes ---------------------------------------------------------------------------------------- */
static void test_flat_boxes(void) {
  static const int64_t shapes[][5] = {{1, 7}, {2, 3, 5}, {3, 2, 3, 4}, {4, 2, 1, 3, 2}, {0}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    int nd = (int)shapes[s][0];
    const int64_t *shape = shapes[s] + 1;
    int64_t n = 1, stride[TDM_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) stride[d] = n, n *= shape[d];
    for (int64_t lo = 0; lo <= n; lo++)
      for (int64_t hi = lo; hi <= n; hi++) {
        tdm__box b[2 * TDM_MAX_DIMS];
        int nb = tdm__flat_boxes(nd, shape, lo, hi, b);
        CHECK(nb <= (nd ? 2 * nd - 1 : 1) && (hi > lo || nb == 0));
        int64_t next = lo; /* boxes in order, each contiguous in row-major order: flat lo, lo + 1, ... */
        for (int k = 0; k < nb; k++) {
          int64_t idx[TDM_MAX_DIMS] = {0}, total = tdm__box_numel(nd, &b[k]);
          for (int64_t e = 0; e < total; e++) {
            int64_t flat = 0, rem = e;
            for (int d = nd - 1; d >= 0; d--) idx[d] = rem % b[k].count[d], rem /= b[k].count[d];
            for (int d = 0; d < nd; d++) flat += (b[k].start[d] + idx[d]) * stride[d];
            if (flat != next++) {
              CHECK_MSG(0, "shape %zu, [%lld, %lld): box %d element %lld is %lld", s, (long long)lo, (long long)hi, k,
                        (long long)e, (long long)flat);
              k = nb;
              break;
            }
          }
        }
        CHECK_MSG(next == hi || nb == 0, "shape %zu, [%lld, %lld): boxes end at %lld", s, (long long)lo, (long long)hi,
                  (long long)next);
      }
  }
}

static void test_box_copy(void) {
  const int nd = 3;
  const int64_t shape[3] = {4, 5, 6};
  tdm__box a = {{1, 0, 2}, {3, 4, 3}}, b = {{0, 2, 0}, {3, 3, 6}}, part;
  CHECK(tdm__box_intersect(nd, &a, &b, &part));
  CHECK(part.start[0] == 1 && part.count[0] == 2 && part.start[1] == 2 && part.count[1] == 2 && part.start[2] == 2 &&
        part.count[2] == 3);
  float src[36], dst[54];
  for (int64_t i = 0; i < 36; i++) { /* a's elements: the value is the flat index in the tensor */
    int64_t x = a.start[0] + i / 12, y = a.start[1] + (i / 3) % 4, z = a.start[2] + i % 3;
    src[i] = (float)((x * shape[1] + y) * shape[2] + z);
  }
  for (int i = 0; i < 54; i++) dst[i] = -1;
  tdm__box_copy(nd, sizeof(float), dst, &b, src, &a, &part);
  for (int64_t i = 0; i < 54; i++) {
    int64_t x = b.start[0] + i / 18, y = b.start[1] + (i / 6) % 3, z = b.start[2] + i % 6;
    int inside = x >= 1 && x < 3 && y >= 2 && y < 4 && z >= 2 && z < 5;
    float want = inside ? (float)((x * shape[1] + y) * shape[2] + z) : -1;
    CHECK_MSG(dst[i] == want, "element %lld: %g, expected %g", (long long)i, dst[i], want);
  }
  tdm__box d = {{0, 4, 0}, {1, 1, 6}};
  CHECK(!tdm__box_intersect(nd, &a, &d, &part));
}

/* ---- ranks as threads ----------------------------------------------------------------------------- */
typedef struct {
  int r, P;
  void *group, *arg;
  void (*fn)(int r, int P, tdm_comm_t comm, void *arg);
} rank_arg;

static void *rank_main(void *va) {
  rank_arg *a = va;
  tdm_comm_t comm = NULL;
  if (a->P > 1) {
    tdm_comm_config cc = {0};
    cc.rank = a->r, cc.size = a->P, cc.transport = TDM_TRANSPORT_THREAD, cc.thread_group = a->group, cc.timeout_s = 60;
    CHECK_OK(tdm_comm_create(&comm, &cc));
  }
  a->fn(a->r, a->P, comm, a->arg);
  tdm_comm_destroy(comm);
  return NULL;
}

static void run_ranks(int P, void (*fn)(int, int, tdm_comm_t, void *), void *arg) {
  void *group = NULL;
  if (P > 1) CHECK_OK(tdm_comm_thread_group_create(&group, P));
  pthread_t th[8];
  rank_arg args[8];
  for (int r = 0; r < P; r++) {
    args[r] = (rank_arg){r, P, group, arg, fn};
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
  if (group) tdm_comm_thread_group_destroy(group);
}

/* ---- pieces of any split ---------------------------------------------------------------------------- */
static float value(int t, int64_t i) { return (float)t * 1000.0f + (float)i + 0.25f; }

/* Fills a box of tensor t (shape) with value(t, flat index), row-major over the box. */
static void fill_box(int t, int nd, const int64_t *shape, const int64_t *start, const int64_t *count, float *out) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= count[d];
  for (int64_t e = 0; e < n; e++) {
    int64_t rem = e, flat = 0, mul = 1, idx[TDM_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) idx[d] = start[d] + rem % count[d], rem /= count[d];
    for (int d = nd - 1; d >= 0; d--) flat += idx[d] * mul, mul *= shape[d];
    out[e] = value(t, flat);
  }
}

static const int64_t col_shape[2] = {7, 5}, cube_shape[3] = {4, 3, 6}, flat_shape[2] = {10, 7};

static void write_splits(int r, int P, tdm_comm_t comm, void *arg) {
  (void)arg;
  tdm_ckpt_info ci = {.step = 4, .seed = 9, .data_epoch = 1, .data_offset = 17, .layout = "threads"};
  tdm_ckpt_writer *w;
  CHECK_OK(tdm_ckpt_writer_create(&w, path("splits"), &ci, 4, comm));
  float col[7 * 5], cube[4 * 3 * 6], flat[70], scalar = value(3, 0);
  int32_t stage[5] = {50, 51, 52, 53, 54};
  /* columns (a tensor-parallel split), blocks of the last dimension, a flat span, a scalar, a
   * tensor only the last rank declares (a pipeline stage's) */
  int64_t cs[2] = {0, 5 * r / P}, cc[2] = {7, 5 * (r + 1) / P - 5 * r / P};
  int64_t bs[3] = {0, 0, 2 * r}, bc[3] = {4, 3, 2};
  int64_t lo = 70 * r / P, hi = 70 * (r + 1) / P;
  fill_box(0, 2, col_shape, cs, cc, col);
  fill_box(1, 3, cube_shape, bs, bc, cube);
  for (int64_t i = lo; i < hi; i++) flat[i - lo] = value(2, i);
  CHECK_OK(tdm_ckpt_writer_tensor(w, "col", TDM_F32, 2, col_shape));
  CHECK_OK(tdm_ckpt_writer_tensor(w, "cube", TDM_F32, 3, cube_shape));
  CHECK_OK(tdm_ckpt_writer_tensor(w, "flat", TDM_F32, 2, flat_shape));
  CHECK_OK(tdm_ckpt_writer_tensor(w, "scalar", TDM_F32, 0, NULL));
  CHECK_OK(tdm_ckpt_writer_box(w, "col", cs, cc, col));
  CHECK_OK(tdm_ckpt_writer_box(w, "cube", bs, bc, cube));
  CHECK_OK(tdm_ckpt_writer_flat(w, "flat", lo, hi, flat));
  if (r == 0) CHECK_OK(tdm_ckpt_writer_box(w, "scalar", NULL, NULL, &scalar));
  if (r == P - 1) {
    int64_t s5 = 5, z = 0, c5 = 5;
    CHECK_OK(tdm_ckpt_writer_tensor(w, "stage", TDM_I32, 1, &s5));
    CHECK_OK(tdm_ckpt_writer_box(w, "stage", &z, &c5, stage));
  }
  CHECK_OK(tdm_ckpt_writer_commit(w, 2));
}

static void test_any_split_reads_back(void) {
  run_ranks(3, write_splits, NULL);
  tdm_ckpt *c = NULL;
  char notes[512];
  CHECK_OK(tdm_ckpt_open_latest(&c, path("splits"), notes, sizeof notes));
  if (!c) return;
  const tdm_ckpt_info *ci = tdm_ckpt_get_info(c);
  CHECK(ci->step == 4 && ci->world_size == 3 && ci->data_epoch == 1 && ci->data_offset == 17 && !strcmp(ci->layout, "threads") &&
        !ci->optimizer && tdm_ckpt_get_optim_steps(c) == 4);
  CHECK(tdm_ckpt_tensor_count(c) == 5 && tdm_ckpt_file_count(c) == 3);
  const tdm_ckpt_tensor *col = tdm_ckpt_tensor_find(c, "col"), *st = tdm_ckpt_tensor_find(c, "stage");
  CHECK(col && col->n_pieces == 3 && st && st->dtype == TDM_I32);
  /* every tensor whole, then boxes across the writers' pieces */
  float buf[128];
  CHECK_OK(tdm_ckpt_read_flat(c, "flat", 0, 70, buf));
  for (int i = 0; i < 70; i++) CHECK_MSG(buf[i] == value(2, i), "flat[%d] = %g", i, buf[i]);
  CHECK_OK(tdm_ckpt_read_flat(c, "cube", 5, 61, buf)); /* a flat range of a tensor written in blocks */
  for (int i = 5; i < 61; i++) CHECK_MSG(buf[i - 5] == value(1, i), "cube[%d] = %g", i, buf[i - 5]);
  int64_t bs[2] = {2, 1}, bc[2] = {4, 3}; /* rows 2..5, columns 1..3: across all three column pieces */
  CHECK_OK(tdm_ckpt_read_box(c, "col", bs, bc, buf));
  for (int i = 0; i < 12; i++) CHECK_MSG(buf[i] == value(0, (2 + i / 3) * 5 + 1 + i % 3), "col box %d = %g", i, buf[i]);
  int64_t fs[2] = {3, 2}, fc[2] = {5, 4}; /* a box of a tensor written as flat spans */
  CHECK_OK(tdm_ckpt_read_box(c, "flat", fs, fc, buf));
  for (int i = 0; i < 20; i++) CHECK_MSG(buf[i] == value(2, (3 + i / 4) * 7 + 2 + i % 4), "flat box %d = %g", i, buf[i]);
  CHECK_OK(tdm_ckpt_read_flat(c, "scalar", 0, 1, buf));
  CHECK(buf[0] == value(3, 0));
  int32_t s[5];
  CHECK_OK(tdm_ckpt_read_flat(c, "stage", 1, 4, s));
  CHECK(s[0] == 51 && s[2] == 53);
  CHECK(tdm_ckpt_read_flat(c, "flat", 60, 71, buf) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("elements [60, 71) asked of 'flat', which has 70");
  CHECK(tdm_ckpt_read_flat(c, "nothing", 0, 1, buf) == TDM_ERR_INVALID_ARG);
  tdm_ckpt_close(c);
  /* only the pieces asked for are read: column 0 lies in rank 0's piece alone (7 rows x 1 column) */
  CHECK_OK(tdm_ckpt_open_latest(&c, path("splits"), NULL, 0));
  int64_t s0[2] = {0, 0}, c0[2] = {7, 1};
  CHECK_OK(tdm_ckpt_read_box(c, "col", s0, c0, buf));
  CHECK_MSG(tdm_ckpt_bytes_read(c) == 7 * 1 * 4, "read %lld bytes", (long long)tdm_ckpt_bytes_read(c));
  CHECK_OK(tdm_ckpt_verify_data(c));
  tdm_ckpt_close(c);
}

/* Ranks whose pieces do not tile a tensor: every rank fails, nothing is taken for a checkpoint. */
typedef struct {
  const char *sub;
  int64_t lo[2], hi[2];
  int other_shape; /* rank 1 declares (2, 3) instead of (6) */
  const char *error;
} tiling;

static void write_tiling(int r, int P, tdm_comm_t comm, void *arg) {
  (void)P;
  const tiling *t = arg;
  tdm_ckpt_info ci = {.step = 2};
  tdm_ckpt_writer *w;
  float data[6] = {0};
  int64_t six = 6, two_three[2] = {2, 3};
  CHECK_OK(tdm_ckpt_writer_create(&w, path("%s", t->sub), &ci, 0, comm));
  if (r == 1 && t->other_shape) CHECK_OK(tdm_ckpt_writer_tensor(w, "x", TDM_F32, 2, two_three));
  else CHECK_OK(tdm_ckpt_writer_tensor(w, "x", TDM_F32, 1, &six));
  CHECK_OK(tdm_ckpt_writer_flat(w, "x", t->lo[r], t->hi[r], data));
  tdm_status st = tdm_ckpt_writer_commit(w, 2);
  CHECK_MSG(st == TDM_ERR_INVALID_ARG, "rank %d committed a checkpoint whose pieces do not tile (%s)", r, tdm_status_str(st));
  CHECK_ERR_HAS(t->error); /* on every rank */
}

static void test_pieces_must_tile(void) {
  static const tiling cases[] = {
      {"overlap", {0, 2}, {4, 6}, 0, "pieces x[0:4] and x[2:6] overlap"},
      {"gap", {0, 3}, {2, 6}, 0, "the pieces of 'x' hold 5 elements; the tensor has 6"},
      {"shape", {0, 3}, {3, 6}, 1, "tensor 'x' is f32 (2, 3) on rank 1 but f32 (6) on a lower rank"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    run_ranks(2, write_tiling, (void *)&cases[i]);
    CHECK_MSG(tdm_ckpt_count_entries(path("%s", cases[i].sub), NULL, 0) == 0, "%s: a manifest was written", cases[i].sub);
  }
}

/* The tiling check itself: random grids of boxes in 1-3 dimensions tile; a box grown, shrunk or
 * moved by one element does not (each named); tens of thousands of pieces are checked (once a
 * pairwise search, quadratic: a crafted manifest stalled a resume). */
static uint64_t rng_state = 88172645463325252ull;
static int64_t rnd(int64_t n) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (int64_t)(rng_state % (uint64_t)n);
}

static void test_tiling_check(void) {
  enum { MAXB = 4096 };
  static tdm__box boxes[MAXB];
  static const tdm__box *bp[MAXB];
  for (int trial = 0; trial < 60; trial++) {
    int nd = 1 + trial % 3, n = 1, cuts[3][9], nc[3];
    int64_t shape[3];
    for (int d = 0; d < nd; d++) { /* each dimension cut at up to 7 random places */
      shape[d] = 2 + rnd(12), nc[d] = 0, cuts[d][nc[d]++] = 0;
      for (int64_t x = 1; x < shape[d]; x++)
        if (rnd(3) == 0 && nc[d] < 8) cuts[d][nc[d]++] = (int)x;
      cuts[d][nc[d]] = (int)shape[d];
      n *= nc[d];
    }
    for (int i = 0; i < n; i++) {
      int rem = i;
      for (int d = 0; d < nd; d++) {
        int k = rem % nc[d];
        rem /= nc[d];
        boxes[i].start[d] = cuts[d][k], boxes[i].count[d] = cuts[d][k + 1] - cuts[d][k];
      }
      bp[i] = &boxes[i];
    }
    CHECK_MSG(tdm__boxes_tile(nd, shape, n, bp, "test", "x") == TDM_OK, "trial %d: a grid of %d boxes: %s", trial, n, tdm_last_error());
    /* one box changed by one element in one dimension, where it stays inside the shape */
    int i = (int)rnd(n), d = (int)rnd(nd), how = (int)rnd(3);
    tdm__box keep = boxes[i];
    if (how == 0 && boxes[i].start[d] + boxes[i].count[d] < shape[d]) boxes[i].count[d]++;
    else if (how == 1 && boxes[i].count[d] > 1) boxes[i].count[d]--;
    else if (boxes[i].start[d] > 0) boxes[i].start[d]--;
    else if (boxes[i].start[d] + boxes[i].count[d] < shape[d]) boxes[i].start[d]++;
    if (memcmp(&keep, &boxes[i], sizeof keep) == 0) continue;
    tdm_status st = tdm__boxes_tile(nd, shape, n, bp, "test", "x");
    CHECK_MSG(st == TDM_ERR_INVALID_ARG && (strstr(tdm_last_error(), "overlap") || strstr(tdm_last_error(), "elements")),
              "trial %d: box %d changed in dimension %d: %d, '%s'", trial, i, d, st, tdm_last_error());
  }
  /* as many elements as the tensor, but one shared and one left out: the pair is named */
  tdm__box o[2] = {{{0}, {3}}, {{2}, {3}}};
  const tdm__box *op[2] = {&o[0], &o[1]};
  int64_t six = 6;
  CHECK(tdm__boxes_tile(1, &six, 2, op, "test", "x") == TDM_ERR_INVALID_ARG && strstr(tdm_last_error(), "x[0:3] and x[2:5] overlap"));
  /* a scalar has one piece */
  CHECK(tdm__boxes_tile(0, NULL, 1, op, "test", "s") == TDM_OK);
  CHECK(tdm__boxes_tile(0, NULL, 2, op, "test", "s") == TDM_ERR_INVALID_ARG && strstr(tdm_last_error(), "expected one"));
  /* 40,000 one-element pieces of a (200, 200) tensor, then with the last one doubled */
  int64_t sq[2] = {200, 200};
  tdm__box *many = malloc(sizeof *many * 40000);
  const tdm__box **mp = malloc(sizeof *mp * 40000);
  CHECK(many && mp);
  if (!many || !mp) return;
  for (int k = 0; k < 40000; k++) {
    memset(&many[k], 0, sizeof many[k]);
    many[k].start[0] = k / 200, many[k].start[1] = k % 200, many[k].count[0] = many[k].count[1] = 1;
    mp[k] = &many[k];
  }
  CHECK_MSG(tdm__boxes_tile(2, sq, 40000, mp, "test", "w") == TDM_OK, "%s", tdm_last_error());
  mp[39999] = &many[0];
  CHECK(tdm__boxes_tile(2, sq, 40000, mp, "test", "w") == TDM_ERR_INVALID_ARG && strstr(tdm_last_error(), "w[0:1,0:1] and w[0:1,0:1] overlap"));
  free(many);
  free(mp);
}

/* ---- files that do not verify ------------------------------------------------------------------------- */
static void write_steps(int r, int P, tdm_comm_t comm, void *arg) {
  for (int64_t step = 4; step <= 8; step += 4) {
    tdm_ckpt_info ci = {.step = step};
    tdm_ckpt_writer *w;
    float x[64];
    int64_t n = 64;
    for (int i = 0; i < 64; i++) x[i] = value((int)step, i);
    CHECK_OK(tdm_ckpt_writer_create(&w, path("%s", (const char *)arg), &ci, step, comm));
    CHECK_OK(tdm_ckpt_writer_tensor(w, "x", TDM_F32, 1, &n));
    CHECK_OK(tdm_ckpt_writer_flat(w, "x", 64 * r / P, 64 * (r + 1) / P, x + 64 * r / P));
    CHECK_OK(tdm_ckpt_writer_commit(w, 5));
  }
}

static void copy_file(const char *from, const char *to) {
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  CHECK(system(cmd) == 0);
}

static void poke(const char *file, int64_t at) {
  FILE *f = fopen(file, "r+b");
  CHECK(f != NULL);
  if (!f) return;
  fseek(f, at, SEEK_SET);
  int ch = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(ch ^ 0x55, f);
  fclose(f);
}

/* The newest valid checkpoint of d, its step, and whether the notes name `why`. */
static int64_t latest_step(const char *d, int verified, const char *why) {
  tdm_ckpt *c = NULL;
  char notes[2048] = "";
  tdm_status st = verified ? tdm_ckpt_open_latest_verified(&c, d, notes, sizeof notes) : tdm_ckpt_open_latest(&c, d, notes, sizeof notes);
  int64_t step = st == TDM_OK && c ? tdm_ckpt_get_info(c)->step : -1;
  CHECK_MSG(!why || strstr(notes, why), "notes '%s' lack '%s'", notes, why);
  tdm_ckpt_close(c);
  return step;
}

static void test_corrupt_files_are_named(void) {
  run_ranks(2, write_steps, "bad");
  const char *m8 = path("bad/ckpt-000000000008.safetensors"), *r1 = path("bad/ckpt-000000000008.shards/rank-1.safetensors"),
             *r1_4 = path("bad/ckpt-000000000004.shards/rank-1.safetensors"), *save = path("bad-rank-1");
  copy_file(r1, save);
  tdm_ckpt *c = NULL;
  CHECK_OK(tdm_ckpt_open(&c, m8));
  if (!c) return;
  int64_t at = c->tensors[0].pieces[1].offset; /* rank 1's piece */
  tdm_ckpt_close(c);
  /* a flipped byte in a piece: the manifest still opens; reading the piece fails, naming it */
  poke(r1, at + 3);
  CHECK_OK(tdm_ckpt_open(&c, m8));
  float x[64];
  if (c) {
    CHECK_OK(tdm_ckpt_read_flat(c, "x", 0, 32, x)); /* rank 0's piece is fine */
    CHECK(tdm_ckpt_read_flat(c, "x", 0, 64, x) == TDM_ERR_FORMAT);
    CHECK_ERR_HAS("rank-1.safetensors: piece x[32:64] (bytes ");
    CHECK_ERR_HAS("fails its checksum (the manifest says ");
    tdm_ckpt_close(c);
  }
  CHECK(latest_step(path("bad"), 1, "fails its checksum") == 4); /* a tool that reads everything falls back */
  CHECK(latest_step(path("bad"), 0, NULL) == 8);                  /* opening alone does not read the pieces */
  /* one byte more: the manifest disagrees with the file */
  copy_file(save, r1);
  FILE *f = fopen(r1, "ab");
  fputc(0, f);
  fclose(f);
  CHECK(tdm_ckpt_open(&c, m8) == TDM_ERR_FORMAT && !c);
  CHECK_ERR_HAS("rank-1.safetensors is ");
  CHECK_ERR_HAS(" bytes, but the manifest");
  CHECK_ERR_HAS("the manifest disagrees with the files");
  CHECK(latest_step(path("bad"), 0, "the manifest disagrees with the files") == 4);
  /* another checkpoint's file of the same size: its header is not the one the manifest lists */
  copy_file(r1_4, r1);
  CHECK_OK(tdm_ckpt_open(&c, m8));
  if (c) {
    CHECK(tdm_ckpt_verify_data(c) == TDM_ERR_FORMAT);
    CHECK_ERR_HAS("is not the one the manifest");
    CHECK_ERR_HAS("a shard of another checkpoint, or a manifest that disagrees with its files");
    tdm_ckpt_close(c);
  }
  /* missing */
  CHECK(unlink(r1) == 0);
  CHECK(tdm_ckpt_open(&c, m8) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("rank-1.safetensors is missing (the manifest lists 2 files): the checkpoint is incomplete");
  CHECK(latest_step(path("bad"), 0, "is missing") == 4);
  copy_file(save, r1);
  CHECK(latest_step(path("bad"), 1, NULL) == 8);
}

/* ---- engines: any layout into any other ------------------------------------------------------------- */
typedef enum { SAVE, RESUME, INJECT } action;

typedef struct {
  const model_kind *k;
  action act;
  int stage;
  const char *from, *to;   /* the checkpoint read (RESUME), or the consolidated file (INJECT); where to save */
  float *params;           /* rank 0: the parameters after loading (RESUME) and at the end */
  float *final;
  int64_t numel;
  int64_t bytes_read[8], held[8];
  int found;
  tdm_status st[8];
  char err[8][512];
} engine_job;

static tdm_status engine_rank(const engine_job *jc, int r, int P, tdm_comm_t comm, engine_job *j) {
  tdm_grid *g = NULL;
  tdm_engine *e = NULL;
  tdm_status st = make_engine(jc->k, jc->stage, comm, &g, &e);
  int64_t step = 0, n = 0;
  float *buf = NULL;
  if (st == TDM_OK) {
    n = tdm_params_numel(tdm_model_params(tdm_engine_model(e)));
    if (!(buf = malloc(sizeof(float) * (size_t)n))) st = TDM_ERR_NO_MEMORY;
  }
  if (st == TDM_OK && jc->act == SAVE) {
    st = train(e, jc->k, r, P, 0, SAVED);
    step = SAVED;
  } else if (st == TDM_OK && jc->act == RESUME) {
    tdm_ckpt_resumed res;
    char notes[1024];
    st = tdm_ckpt_resume_engine(jc->from, e, NULL, NULL, &res, notes, sizeof notes);
    if (st == TDM_OK && (!res.found || res.step != SAVED || res.optim_steps != SAVED || res.world_size != 4 ||
                         res.data_epoch != 0 || res.data_offset != SAVED * G || !strstr(res.layout, "zero stage 3, 4 ranks")))
      st = tdm__set_error(TDM_ERR_INTERNAL, "resumed: found %d, step %lld, optim steps %lld, world %d, position %lld:%lld, %s",
                          res.found, (long long)res.step, (long long)res.optim_steps, res.world_size, (long long)res.data_epoch,
                          (long long)res.data_offset, res.layout);
    j->bytes_read[r] = res.bytes_read;
    const tdm_optim_span *sp;
    int ns = tdm_engine_shard(e, &sp);
    for (int s = 0; s < ns; s++) j->held[r] += sp[s].hi - sp[s].lo;
    if (st == TDM_OK) st = tdm_engine_read_params(e, 0, n, buf);
    if (st == TDM_OK && r == 0) memcpy(j->params, buf, sizeof(float) * (size_t)n);
    step = SAVED;
    if (st == TDM_OK && jc->to) { /* the state as loaded, saved again from this layout */
      tdm_ckpt_info ci = {.step = SAVED, .seed = 7, .data_offset = SAVED * G};
      st = tdm_ckpt_save_engine(path("%s-loaded", jc->to), e, &ci, 2);
    }
  } else if (st == TDM_OK && jc->act == INJECT) {
    st = inject(e, jc->from);
    step = SAVED;
  }
  if (st == TDM_OK && jc->act != SAVE) st = train(e, jc->k, r, P, SAVED, SAVED + MORE), step = SAVED + MORE;
  if (st == TDM_OK) st = tdm_engine_read_params(e, 0, n, buf);
  if (st == TDM_OK && r == 0 && j->final) memcpy(j->final, buf, sizeof(float) * (size_t)n);
  if (st == TDM_OK && jc->to) {
    tdm_ckpt_info ci = {.step = step, .seed = 7, .data_offset = step * G};
    st = tdm_ckpt_save_engine(path("%s", jc->to), e, &ci, 2);
  }
  free(buf);
  tdm_engine_destroy(e);
  tdm_grid_destroy(g);
  return st;
}

static void engine_thread(int r, int P, tdm_comm_t comm, void *arg) {
  engine_job *j = arg;
  j->st[r] = engine_rank(j, r, P, comm, j);
  if (j->st[r] != TDM_OK) {
    snprintf(j->err[r], sizeof j->err[r], "%s", tdm_last_error());
    if (comm) tdm_comm_abort(comm);
  }
}

static int run_engine(engine_job *j, int P) {
  run_ranks(P, engine_thread, j);
  int ok = 1;
  for (int r = 0; r < P; r++) {
    CHECK_MSG(j->st[r] == TDM_OK, "%d ranks, stage %d, %s: rank %d: %s", P, j->stage,
              j->act == SAVE ? "save" : j->act == RESUME ? "resume" : "inject", r, j->err[r]);
    ok &= j->st[r] == TDM_OK;
  }
  return ok;
}

/* Every logical tensor of two checkpoints, bit for bit. */
static int same_state(const char *a, const char *b) {
  tdm_ckpt *x = NULL, *y = NULL;
  CHECK_OK(tdm_ckpt_open_latest(&x, a, NULL, 0));
  CHECK_OK(tdm_ckpt_open_latest(&y, b, NULL, 0));
  int same = x && y && tdm_ckpt_tensor_count(x) == tdm_ckpt_tensor_count(y) &&
             tdm_ckpt_get_optim_steps(x) == tdm_ckpt_get_optim_steps(y) && tdm_ckpt_get_info(x)->step == tdm_ckpt_get_info(y)->step;
  for (int i = 0; same && i < tdm_ckpt_tensor_count(x); i++) {
    const tdm_ckpt_tensor *t = tdm_ckpt_tensor_at(x, i);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    float *u = malloc(sizeof(float) * (size_t)n), *v = malloc(sizeof(float) * (size_t)n);
    same = u && v && tdm_ckpt_tensor_find(y, t->name) && tdm_ckpt_read_flat(x, t->name, 0, n, u) == TDM_OK &&
           tdm_ckpt_read_flat(y, t->name, 0, n, v) == TDM_OK && !memcmp(u, v, sizeof(float) * (size_t)n);
    if (!same) fprintf(stderr, "  %s differs between %s and %s\n", t->name, a, b);
    free(u);
    free(v);
  }
  tdm_ckpt_close(x);
  tdm_ckpt_close(y);
  return same;
}

static void check_resharding(const model_kind *k, const char *name) {
  engine_job save = {k, SAVE, 3, NULL, NULL, NULL, NULL, 0, {0}, {0}, 0, {0}, {{0}}};
  char saved[64], consolidated[600];
  snprintf(saved, sizeof saved, "%s-saved", name);
  save.to = saved;
  if (!run_engine(&save, 4)) return;
  tdm_ckpt *c = NULL;
  CHECK_OK(tdm_ckpt_open_latest(&c, path("%s", saved), NULL, 0));
  if (!c) return;
  snprintf(consolidated, sizeof consolidated, "%s", path("%s.safetensors", name));
  CHECK_OK(tdm_ckpt_consolidate(c, consolidated, 1));
  int64_t total = 0, numel = 0;
  for (int i = 0; i < c->n_tensors; i++)
    for (int p = 0; p < c->tensors[i].pub.n_pieces; p++) total += c->tensors[i].pieces[p].nbytes;
  for (int i = 0; i < c->n_tensors; i++)
    if (!strncmp(c->tensors[i].pub.name, "model.", 6)) {
      int64_t n = 1;
      for (int d = 0; d < c->tensors[i].pub.ndim; d++) n *= c->tensors[i].pub.shape[d];
      numel += n;
    }
  float *want = malloc(sizeof(float) * (size_t)numel), *params = malloc(sizeof(float) * (size_t)numel),
        *final = malloc(sizeof(float) * (size_t)numel), *ref = malloc(sizeof(float) * (size_t)numel);
  { /* the saved parameters, in buffer order (the manifest lists them in that order) */
    int64_t at = 0;
    for (int i = 0; i < c->n_tensors; i++)
      if (!strncmp(c->tensors[i].pub.name, "model.", 6)) {
        int64_t n = 1;
        for (int d = 0; d < c->tensors[i].pub.ndim; d++) n *= c->tensors[i].pub.shape[d];
        CHECK_OK(tdm_ckpt_read_flat(c, c->tensors[i].pub.name, 0, n, want + at));
        at += n;
      }
  }
  tdm_ckpt_close(c);
  for (int P = 1; P <= 3; P++) {
    engine_job inj = {k, INJECT, 0, consolidated, NULL, NULL, ref, 0, {0}, {0}, 0, {0}, {{0}}};
    char to[64];
    snprintf(to, sizeof to, "%s-%d-ref", name, P);
    inj.to = to;
    if (!run_engine(&inj, P)) continue;
    for (int stage = 0; stage <= 3; stage++) {
      char out[64];
      snprintf(out, sizeof out, "%s-%d-%d", name, P, stage);
      engine_job j = {k, RESUME, stage, path("%s", saved), out, params, final, 0, {0}, {0}, 0, {0}, {{0}}};
      if (!run_engine(&j, P)) continue;
      /* loaded: the parameters, and (saved again from this layout) every moment, bit for bit */
      CHECK_MSG(!memcmp(params, want, sizeof(float) * (size_t)numel), "%s at %d ranks, stage %d: the loaded parameters differ", name, P, stage);
      char loaded[80], outb[80], refb[80];
      snprintf(loaded, sizeof loaded, "%s-loaded", out);
      CHECK_MSG(same_state(path("%s", saved), path("%s", loaded)), "%s at %d ranks, stage %d: the state saved after loading differs", name, P, stage);
      /* trained on: what the same state at this world size gives (stage 0, put in place by hand) */
      CHECK_MSG(!memcmp(final, ref, sizeof(float) * (size_t)numel), "%s at %d ranks, stage %d: %d more steps differ from the injected state's", name,
                P, stage, MORE);
      snprintf(outb, sizeof outb, "%s", out);
      snprintf(refb, sizeof refb, "%s", to);
      CHECK_MSG(same_state(path("%s", outb), path("%s", refb)), "%s at %d ranks, stage %d: the moments after %d more steps differ", name, P,
                stage, MORE);
      /* each rank read the pieces that overlap what it holds: at stage 3 its share, not everything
       * (at most twice what it holds: the writers' pieces it only partly needs); at 1 rank all */
      int64_t most = 0;
      for (int r = 0; r < P; r++) {
        most = j.bytes_read[r] > most ? j.bytes_read[r] : most;
        int64_t need = j.held[r] * 4 * 3; /* the parameters and Adam's two moments */
        if (stage == 3 && P > 1)
          CHECK_MSG(j.bytes_read[r] <= 2 * need && j.bytes_read[r] < total, "%s at %d ranks, stage 3: rank %d read %lld bytes, holds %lld of %lld",
                    name, P, r, (long long)j.bytes_read[r], (long long)need, (long long)total);
      }
      if (P == 1) CHECK_MSG(most == total, "%s at 1 rank: read %lld of %lld bytes", name, (long long)most, (long long)total);
    }
  }
  free(want);
  free(params);
  free(final);
  free(ref);
}

static void test_mlp_reshards(void) {
  model_kind k = mlp_kind();
  check_resharding(&k, "mlp");
}

static void test_gpt_reshards(void) {
  model_kind k = gpt_kind();
  check_resharding(&k, "gpt");
}

/* ---- what cannot resume, and falling back ------------------------------------------------------------- */
typedef struct {
  model_kind k;
  int stage;
  const char *dirs[4]; /* per rank */
  const char *save_to; /* after loading, the state saved again here */
  tdm_status st[4];
  char err[4][600], notes[4][1024];
  tdm_ckpt_resumed res[4];
} resume_job;

static void resume_thread(int r, int P, tdm_comm_t comm, void *arg) {
  (void)P;
  resume_job *j = arg;
  tdm_grid *g = NULL;
  tdm_engine *e = NULL;
  j->st[r] = make_engine(&j->k, j->stage, comm, &g, &e);
  if (j->st[r] == TDM_OK) j->st[r] = tdm_ckpt_resume_engine(j->dirs[r], e, NULL, NULL, &j->res[r], j->notes[r], sizeof j->notes[r]);
  if (j->st[r] == TDM_OK && j->save_to) {
    tdm_ckpt_info ci = {.step = j->res[r].step, .seed = 7, .data_offset = j->res[r].data_offset};
    j->st[r] = tdm_ckpt_save_engine(j->save_to, e, &ci, 2);
  }
  snprintf(j->err[r], sizeof j->err[r], "%s", tdm_last_error());
  tdm_engine_destroy(e);
  tdm_grid_destroy(g);
}

static void test_what_cannot_resume(void) {
  /* mlp-saved (Adam, step 3) from the test above, or made here */
  if (tdm_ckpt_count_entries(path("mlp-saved"), NULL, 0) < 1) {
    model_kind k = mlp_kind();
    engine_job save = {&k, SAVE, 3, NULL, "mlp-saved", NULL, NULL, 0, {0}, {0}, 0, {0}, {{0}}};
    run_engine(&save, 4);
  }
  resume_job j = {gpt_kind(), 1, {path("mlp-saved"), path("mlp-saved")}, NULL, {0}, {{0}}, {{0}}, {{0}}};
  run_ranks(2, resume_thread, &j);
  for (int r = 0; r < 2; r++)
    CHECK_MSG(j.st[r] == TDM_ERR_MISMATCH && strstr(j.err[r], "is missing: is this the same model?"), "rank %d: %s", r, j.err[r]);
  resume_job o = {mlp_kind(), 2, {path("mlp-saved"), path("mlp-saved")}, NULL, {0}, {{0}}, {{0}}, {{0}}};
  o.k.oc = tdm_optim_config_default(TDM_OPT_SGD);
  o.k.oc.momentum = 0.9f;
  run_ranks(2, resume_thread, &o);
  for (int r = 0; r < 2; r++)
    CHECK_MSG(o.st[r] == TDM_ERR_MISMATCH && strstr(o.err[r], "written with optimizer adam; this optimizer is sgd"), "rank %d: %s", r, o.err[r]);
  /* the ranks see different directories */
  CHECK(mkdir(path("empty"), 0755) == 0);
  resume_job d = {mlp_kind(), 0, {path("mlp-saved"), path("empty")}, NULL, {0}, {{0}}, {{0}}, {{0}}};
  run_ranks(2, resume_thread, &d);
  for (int r = 0; r < 2; r++) {
    CHECK_MSG(d.st[r] == TDM_ERR_MISMATCH && strstr(d.err[r], "the ranks found different checkpoints to resume from: rank 0 found step 3 (crc "),
              "rank %d: %s", r, d.err[r]);
    CHECK_MSG(strstr(d.err[r], "; rank 1 found no checkpoint in ") != NULL, "rank %d: %s", r, d.err[r]);
  }
}

static void test_corrupt_newest_falls_back(void) {
  model_kind k = mlp_kind();
  engine_job save = {&k, SAVE, 3, NULL, "fb", NULL, NULL, 0, {0}, {0}, 0, {0}, {{0}}};
  if (!run_engine(&save, 4)) return;
  float params[8192]; /* a step-5 checkpoint beside it: resumed, trained on, saved */
  engine_job on = {&k, RESUME, 3, path("fb"), "fb", params, NULL, 0, {0}, {0}, 0, {0}, {{0}}};
  if (!run_engine(&on, 4)) return;
  /* a byte of a parameter's piece in rank 2's file of step 5: read by whoever holds it */
  tdm_ckpt *c = NULL;
  CHECK_OK(tdm_ckpt_open(&c, path("fb/ckpt-000000000005.safetensors")));
  if (!c) return;
  int64_t at = -1;
  for (int i = 0; i < c->n_tensors && at < 0; i++)
    for (int p = 0; p < c->tensors[i].pub.n_pieces && at < 0; p++)
      if (c->tensors[i].pieces[p].file == 2 && !strncmp(c->tensors[i].pub.name, "model.", 6)) at = c->tensors[i].pieces[p].offset;
  tdm_ckpt_close(c);
  char cmd[1400]; /* step 3 alone, to compare with what the fallback loads */
  snprintf(cmd, sizeof cmd, "mkdir '%s' && cp -r '%s' '%s' '%s'", path("fb3"), path("fb/ckpt-000000000003.safetensors"),
           path("fb/ckpt-000000000003.shards"), path("fb3"));
  CHECK(system(cmd) == 0);
  poke(path("fb/ckpt-000000000005.shards/rank-2.safetensors"), at + 1);
  for (int stage = 0; stage <= 3; stage += 3) {
    char again[64];
    snprintf(again, sizeof again, "fb-again-%d", stage);
    resume_job j = {mlp_kind(), stage, {path("fb"), path("fb"), path("fb")}, path("%s", again), {0}, {{0}}, {{0}}, {{0}}};
    run_ranks(3, resume_thread, &j);
    /* what was read of step 5 before the corrupt piece is read over: step 3's state, whole */
    CHECK_MSG(j.st[0] == TDM_OK && same_state(path("fb3"), path("%s", again)), "stage %d: the state after falling back is not step 3's", stage);
    for (int r = 0; r < 3; r++) {
      CHECK_MSG(j.st[r] == TDM_OK && j.res[r].found && j.res[r].step == 3, "stage %d, rank %d: %s (step %lld)", stage, r, j.err[r],
                (long long)j.res[r].step);
      CHECK_MSG(strstr(j.notes[r], "rank-2.safetensors: piece model.") && strstr(j.notes[r], "fails its checksum"), "stage %d, rank %d: notes '%s'",
                stage, r, j.notes[r]);
    }
  }
  /* nothing valid left: an error on every rank naming both */
  struct stat sb;
  CHECK(stat(path("fb/ckpt-000000000003.safetensors"), &sb) == 0);
  poke(path("fb/ckpt-000000000003.safetensors"), (int64_t)sb.st_size - 10); /* in the manifest's text */
  resume_job n = {mlp_kind(), 1, {path("fb"), path("fb")}, NULL, {0}, {{0}}, {{0}}, {{0}}};
  run_ranks(2, resume_thread, &n);
  for (int r = 0; r < 2; r++)
    CHECK_MSG(n.st[r] == TDM_ERR_FORMAT && strstr(n.err[r], "no valid checkpoint in") && strstr(n.err[r], "checksum mismatch") &&
                  strstr(n.err[r], "fails its checksum") && strstr(n.err[r], "Nothing was changed"),
              "rank %d: %s", r, n.err[r]);
}

/* ---- the sampler: positions carry over to another global batch ---------------------------------- */
/* Runs ranks x accum x batch over steps [from, to) of the sampler set to (at, epoch, offset); marks
 * each position of epoch `epoch` consumed in seen[]; returns the epoch of step `to`. */
static int64_t consume(const tdm_dataset *ds, int W, int64_t K, int64_t B, tdm_last_batch last, int64_t at, int64_t epoch,
                       int64_t offset, int64_t from, int64_t to, int want_epoch, int *seen, int64_t N) {
  int64_t e_end = -1;
  for (int r = 0; r < W; r++) {
    tdm_sampler *s;
    tdm_sampler_config sc = {B, K, W, r, 11, last, r % 2};
    CHECK_OK(tdm_sampler_create(&s, ds, &sc));
    if (!s) return -1;
    if (at >= 0) CHECK_OK(tdm_sampler_set_position(s, at, epoch, offset));
    CHECK_OK(tdm_sampler_seek(s, from));
    for (int64_t step = from; step < to; step++)
      for (int64_t m = 0; m < K; m++) {
        int64_t e = tdm_sampler_epoch(s), n, first;
        const float *x;
        const int32_t *y;
        CHECK_OK(tdm_sampler_next(s, &x, &y, &n, &first));
        if (e != want_epoch) continue;
        for (int64_t i = 0; i < n; i++) seen[(first + i) % N]++;
      }
    int64_t o;
    tdm_sampler_locate(s, to, &e_end, &o);
    tdm_sampler_destroy(s);
  }
  return e_end;
}

static void test_sampler_positions_carry_over(void) {
  tdm_dataset *ds;
  int64_t shp[1] = {3};
  const int64_t N = 100;
  CHECK_OK(tdm_dataset_open_synthetic(&ds, N, 1, shp, 4, 5, 0));
  if (!ds) return;
  /* 2 ranks x accum 2 x batch 3 (G 12) for 5 steps: 60 samples; then 3 ranks x batch 3 (G 9) to the
   * epoch's end: 40 more, in ceil(40 / 9) = 5 steps, the last padded from the order's start */
  for (int pad = 0; pad <= 1; pad++) {
    tdm_last_batch last = pad ? TDM_LAST_PAD : TDM_LAST_DROP;
    int seen[100] = {0};
    consume(ds, 2, 2, 3, last, -1, 0, 0, 0, 5, 0, seen, N);
    tdm_sampler *s;
    tdm_sampler_config a = {3, 2, 2, 0, 11, last, 0};
    CHECK_OK(tdm_sampler_create(&s, ds, &a));
    int64_t e, off;
    tdm_sampler_locate(s, 5, &e, &off); /* the position a checkpoint after step 5 records */
    CHECK(e == 0 && off == 60);
    tdm_sampler_locate(s, pad ? 9 : 8, &e, &off); /* the epoch's end: the next one's start */
    CHECK_MSG(e == 1 && off == 0, "%s: step %d starts at %lld:%lld", pad ? "pad" : "drop", pad ? 9 : 8, (long long)e, (long long)off);
    tdm_sampler_destroy(s);
    int64_t steps = pad ? 5 : 4; /* drop: 4 whole batches of 9 (36), the last 4 samples dropped */
    int64_t next_epoch = consume(ds, 3, 1, 3, last, 5, 0, 60, 5, 5 + steps, 0, seen, N);
    CHECK(next_epoch == 1);
    int twice = 0, missing = 0;
    for (int i = 0; i < N; i++) twice += seen[i] > 1, missing += seen[i] == 0;
    /* pad: every sample once, and the last batch's 5 padding samples (from the order's start) twice */
    CHECK_MSG(pad ? (missing == 0 && twice == 5) : (missing == 4 && twice == 0), "%s: %d missing, %d twice", pad ? "pad" : "drop",
              missing, twice);
    for (int i = 0; i < (pad ? 5 : 0); i++) CHECK_MSG(seen[i] == 2, "pad: position %d seen %d times", i, seen[i]);
    /* and the next epoch starts at its beginning */
    tdm_sampler_config b = {3, 1, 3, 0, 11, last, 0};
    CHECK_OK(tdm_sampler_create(&s, ds, &b));
    CHECK_OK(tdm_sampler_set_position(s, 5, 0, 60));
    CHECK(tdm_sampler_epoch_start(s, 1) == 5 + steps && tdm_sampler_epoch_start(s, 2) == 5 + steps + (pad ? 12 : 11));
    tdm_sampler_locate(s, 5 + steps, &e, &off);
    CHECK(e == 1 && off == 0);
    CHECK(tdm_sampler_seek(s, 4) == TDM_ERR_INVALID_ARG);
    CHECK_ERR_HAS("step 4 is before step 5, where the sampler's position was set");
    CHECK(tdm_sampler_set_position(s, 5, 0, 101) == TDM_ERR_INVALID_ARG);
    tdm_sampler_destroy(s);
  }
  tdm_dataset_destroy(ds);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/tandem-test-reshard-XXXXXX");
  if (!mkdtemp(dir)) return 1;
  static const tdm_test_case cases[] = {T(test_flat_boxes), T(test_box_copy), T(test_any_split_reads_back), T(test_pieces_must_tile), T(test_tiling_check),
                                        T(test_corrupt_files_are_named), T(test_mlp_reshards), T(test_gpt_reshards),
                                        T(test_what_cannot_resume), T(test_corrupt_newest_falls_back),
                                        T(test_sampler_positions_carry_over)};
  int rc = tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}
