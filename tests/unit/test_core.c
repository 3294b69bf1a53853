/* core: status strings, arenas, random numbers, the thread pool, the JSON reader. */
#include "core/json.h"
#include "tdm_test.h"

static void test_status_strings(void) {
  CHECK(!strcmp(tdm_status_str(TDM_OK), "ok"));
  CHECK(!strcmp(tdm_status_str(TDM_ERR_TIMEOUT), "timed out"));
  CHECK(!strcmp(tdm_status_str((tdm_status)-999), "unknown status"));
}

static void test_arena(void) {
  tdm_arena *a;
  CHECK_OK(tdm_arena_create(&a, 4096));
  char *p = tdm_arena_alloc(a, 10), *q = tdm_arena_alloc(a, 100);
  CHECK(((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0 && q >= p + 10);
  for (int round = 0; round < 4; round++) {
    tdm_arena_reset(a);
    for (int i = 0; i < 50; i++) { /* 50 x 1000 bytes: more than the first block */
      char *b = tdm_arena_alloc(a, 1000);
      CHECK(b != NULL);
      memset(b, i, 1000);
    }
  }
  uint64_t m = tdm_arena_mallocs(a);
  tdm_arena_reset(a);
  for (int i = 0; i < 50; i++) tdm_arena_alloc(a, 1000);
  CHECK(tdm_arena_mallocs(a) == m); /* after growing once, a round of the same size allocates nothing */
  CHECK(tdm_arena_peak(a) >= 50 * 1000);
  tdm_arena_destroy(a);
}

/* Every allocation is counted under its category, exactly, and frees give it back; a tape's
 * activations count the arena bytes in use, not its blocks. */
static void test_memory_categories(void) {
  tdm_mem_stats a, b;
  tdm_mem_stats_get(&a);
  void *p = tdm__malloc_cat(1000, TDM_MEM_OPTIM), *q = tdm__aligned_alloc_cat(4096, TDM_MEM_COMM);
  tdm_mem_category old = tdm__mem_scope(TDM_MEM_DATA);
  void *r = tdm__calloc(10, 30);
  tdm__mem_scope(old);
  tdm_mem_stats_get(&b);
  CHECK(b.current[TDM_MEM_OPTIM] - a.current[TDM_MEM_OPTIM] == 1000);
  CHECK(b.current[TDM_MEM_COMM] - a.current[TDM_MEM_COMM] == 4096);
  CHECK(b.current[TDM_MEM_DATA] - a.current[TDM_MEM_DATA] == 300);
  CHECK(b.current_total - a.current_total == 5396);
  CHECK(((uintptr_t)q % 64) == 0 && r && ((char *)r)[299] == 0);
  /* realloc keeps the category and the contents, counts the new size, and refuses aligned blocks */
  memset(p, 7, 1000);
  void *p2 = tdm__realloc(p, 3 << 20); /* past malloc's mmap threshold: moved by remapping */
  CHECK(p2 && ((unsigned char *)p2)[0] == 7 && ((unsigned char *)p2)[999] == 7);
  p = p2 ? p2 : p;
  tdm_mem_stats_get(&b);
  CHECK(b.current[TDM_MEM_OPTIM] - a.current[TDM_MEM_OPTIM] == 3 << 20);
  CHECK(tdm__realloc(q, 8192) == NULL);
  tdm__free(p), tdm__free(q), tdm__free(r);
  tdm_mem_stats_get(&b);
  CHECK(b.current_total == a.current_total && b.peak[TDM_MEM_COMM] >= a.current[TDM_MEM_COMM] + 4096);
  tdm_mem_peak_reset();
  tdm_mem_stats_get(&b);
  CHECK(b.peak_total == b.current_total);
  /* a tape: activations follow the bytes in use and go back to zero at reset */
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 1 << 16));
  tdm_mem_stats_get(&a);
  int64_t shape[2] = {100, 1000};
  CHECK(tdm_zeros(tp, TDM_F32, 2, shape) != NULL); /* 400 KB: more than the first block */
  tdm_mem_stats_get(&b);
  int64_t act = b.current[TDM_MEM_ACTIVATIONS] - a.current[TDM_MEM_ACTIVATIONS];
  CHECK_MSG(act >= 400000 && act < 401000, "%lld activation bytes", (long long)act);
  CHECK(b.current[TDM_MEM_WORKSPACE] - a.current[TDM_MEM_WORKSPACE] < 1000); /* not the new block */
  tdm_tape_reset(tp);
  tdm_mem_stats_get(&b);
  CHECK(b.current[TDM_MEM_ACTIVATIONS] == a.current[TDM_MEM_ACTIVATIONS]);
  tdm_tape_destroy(tp);
  tdm_mem_stats_get(&b);
  CHECK(b.current[TDM_MEM_ACTIVATIONS] == 0);
  CHECK(!strcmp(tdm_mem_category_name(TDM_MEM_OPTIM), "optimizer"));
}

static void test_rng(void) {
  tdm_rng a, b;
  tdm_rng_seed(&a, 7);
  tdm_rng_seed(&b, 7);
  for (int i = 0; i < 100; i++) CHECK(tdm_rng_next(&a) == tdm_rng_next(&b));
  double s = 0, s2 = 0, u = 0;
  for (int i = 0; i < 100000; i++) {
    float x = tdm_rng_normal(&a), v = tdm_rng_uniform(&a);
    s += x;
    s2 += x * x;
    u += v;
    CHECK(v >= 0.0f && v < 1.0f);
  }
  CHECK_NEAR(s / 1e5, 0.0, 0.02);   /* 4 standard errors */
  CHECK_NEAR(s2 / 1e5, 1.0, 0.02);
  CHECK_NEAR(u / 1e5, 0.5, 0.004);
  CHECK(tdm_hash64(1, 2) == tdm_hash64(1, 2) && tdm_hash64(1, 2) != tdm_hash64(1, 3));
}

/* The median: odd and even counts, unsorted input (sorted in place), a burst that moves the mean
 * and not the median, none. */
static void test_median(void) {
  double odd[5] = {5, 1, 4, 2, 3}, even[4] = {10, 2, 8, 4}, burst[5] = {1.0, 1.1, 40.0, 0.9, 1.2};
  CHECK(tdm_median(odd, 5) == 3 && odd[0] == 1 && odd[4] == 5);
  CHECK(tdm_median(even, 4) == 6);
  CHECK(tdm_median(burst, 5) == 1.1);
  CHECK(tdm_median(NULL, 0) == 0);
}

static int64_t counts[100000];
static void mark(void *ctx, int64_t b, int64_t e) {
  (void)ctx;
  for (int64_t i = b; i < e; i++) counts[i]++;
}

static void test_parallel_for_covers_once(void) {
  for (int threads = 1; threads <= 4; threads++) {
    CHECK_OK(tdm_set_num_threads(threads));
    CHECK(tdm_get_num_threads() == threads);
    for (int64_t n = 0; n <= 100000; n = n ? n * 7 : 1) {
      memset(counts, 0, sizeof counts);
      tdm_parallel_for(n, 100, mark, NULL);
      int64_t bad = 0;
      for (int64_t i = 0; i < 100000; i++) bad += counts[i] != (i < n);
      CHECK_MSG(bad == 0, "threads %d n %lld: %lld indices wrong", threads, (long long)n, (long long)bad);
    }
  }
  CHECK(tdm_set_num_threads(-1) == TDM_ERR_INVALID_ARG);
  /* a spin time that is not a number of microseconds, and a default thread count that is not a
   * whole number 0..256 (atoi took "2x" as 2 and "abc" as the default), are refused by name */
  static const struct {
    const char *var, *value;
    int threads;
  } bad[] = {{"TANDEM_SPIN_US", "fast", 3},     {"TANDEM_SPIN_US", "-5", 3},     {"TANDEM_SPIN_US", "50us", 3},
             {"TANDEM_SPIN_US", "", 3},         {"TANDEM_SPIN_US", "1e9", 3},    {"TANDEM_NUM_THREADS", "abc", 0},
             {"TANDEM_NUM_THREADS", "-3", 0},   {"TANDEM_NUM_THREADS", "2x", 0}, {"TANDEM_NUM_THREADS", "1e3", 0},
             {"TANDEM_NUM_THREADS", "300", 0}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv(bad[i].var, bad[i].value, 1);
    CHECK(tdm_set_num_threads(bad[i].threads) == TDM_ERR_INVALID_ARG);
    CHECK_MSG(strstr(tdm_last_error(), bad[i].var) != NULL, "%s='%s': error: %s", bad[i].var, bad[i].value, tdm_last_error());
    unsetenv(bad[i].var);
  }
  setenv("TANDEM_SPIN_US", "0", 1);
  CHECK_OK(tdm_set_num_threads(2));
  unsetenv("TANDEM_SPIN_US");
  setenv("TANDEM_NUM_THREADS", "2", 1);
  CHECK_OK(tdm_set_num_threads(0));
  CHECK(tdm_get_num_threads() == 2);
  unsetenv("TANDEM_NUM_THREADS");
  CHECK_OK(tdm_set_num_threads(1));
}

static void test_json(void) {
  const char *s = "{\"a\": [1, -2, 3.5e2], \"b\": {\"c\": \"x\\\"y\"}, \"t\": true, \"n\": null}";
  tdm_json *j = NULL;
  CHECK_OK(tdm__json_parse(s, strlen(s), &j));
  const tdm_json *a = tdm__json_get(j, "a");
  CHECK(a && a->type == TDM_JSON_ARR && a->n == 3 && a->items[1].inum == -2 && a->items[2].num == 350.0);
  const tdm_json *c = tdm__json_get(tdm__json_get(j, "b"), "c");
  CHECK(c && !strcmp(c->str, "x\"y"));
  tdm__json_free(j);
  const char *bad[] = {"{", "{\"a\" 1}", "[1,]x", "{\"a\": tru}", "\"abc", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    j = NULL;
    CHECK(tdm__json_parse(bad[i], strlen(bad[i]), &j) == TDM_ERR_FORMAT && j == NULL);
  }
  char deep[200];
  memset(deep, '[', sizeof deep);
  CHECK(tdm__json_parse(deep, sizeof deep, &j) == TDM_ERR_FORMAT);
  CHECK_ERR_HAS("nesting");
}

TDM_TEST_MAIN(T(test_status_strings), T(test_arena), T(test_memory_categories), T(test_rng), T(test_median), T(test_parallel_for_covers_once), T(test_json))
