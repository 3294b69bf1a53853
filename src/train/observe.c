/* The metrics file's run header and the ranks' live status; see observe.h. */
#include "train/observe.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/core.h"
#include "tandem/kernels.h"

extern char **environ;

static uint64_t hash_str(uint64_t h, const char *s) {
  for (; s && *s; s++) h = tdm_hash64(h ^ (unsigned char)*s, 0x9e37);
  return tdm_hash64(h, 0x5eb); /* an end mark: "ab","c" differs from "a","bc" */
}

uint64_t tdm__config_hash(const tdm__run_identity *id) {
  uint64_t h = 0x7a6e64656dull;
  for (int i = 0; i < id->n; i++) h = hash_str(hash_str(h, id->key[i]), id->value[i]);
  return h;
}

/* A JSON string (quotes included); control characters and non-ASCII bytes as \u escapes of the
 * byte, so that whatever a path or variable holds, the line stays valid JSON. */
static void put_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void put_kv(FILE *f, const char *k, const char *v, int *first) {
  fprintf(f, "%s", *first ? "" : ",");
  *first = 0;
  put_str(f, k);
  fputc(':', f);
  put_str(f, v);
}

/* The variables that change how a run performs; never the job's token, descriptors or pids. */
static int env_relevant(const char *kv) {
  static const char *const skip[] = {"TANDEM_JOB_TOKEN=", "TANDEM_STORE_FD=", "TANDEM_LAUNCHER_", "TANDEM_STATUS_DIR="};
  for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
    if (!strncmp(kv, skip[i], strlen(skip[i]))) return 0;
  return !strncmp(kv, "TANDEM_", 7) || !strncmp(kv, "OMP_NUM_THREADS=", 16) || !strncmp(kv, "OPENBLAS_", 9) ||
         !strncmp(kv, "WORLD_SIZE=", 11) || !strncmp(kv, "LOCAL_WORLD_SIZE=", 17);
}

void tdm__metrics_header(FILE *f, const tdm__header_in *in) {
  const tdm_train_config *c = in->cfg;
  const char *token = getenv("TANDEM_JOB_TOKEN"), *attempt = getenv("TANDEM_RESTART_COUNT");
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t run_id = tdm_hash64(tdm_hash64((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec, (uint64_t)getpid()),
                               hash_str(0, token));
  char when[32] = "";
  struct tm tm;
  if (gmtime_r(&ts.tv_sec, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  struct utsname un;
  int have_un = uname(&un) == 0;
  fprintf(f, "{\"tandem_run\":{\"run_id\":\"%016llx\",\"config_hash\":\"%016llx\",\"job\":\"%016llx\",\"attempt\":%d,"
             "\"resumed_from\":%lld,\"start_step\":%lld,\"started\":\"%s\",",
          (unsigned long long)run_id, (unsigned long long)tdm__config_hash(in->id),
          (unsigned long long)(token && *token ? hash_str(0, token) : 0), attempt ? atoi(attempt) : 0,
          (long long)in->resumed_from, (long long)in->start_step, when);
  fprintf(f, "\"config\":{");
  int first = 1;
  put_kv(f, "model", c->model, &first);
  put_kv(f, "data", c->data, &first);
  put_kv(f, "optimizer", c->optimizer, &first);
  put_kv(f, "engine", in->engine, &first);
  put_kv(f, "transport", in->transport, &first);
  put_kv(f, "lr_schedule", c->lr_schedule, &first);
  fprintf(f, ",\"lr\":%g,\"world_size\":%d,\"data_ranks\":%d,\"tensor_ranks\":%d,\"pipeline_stages\":%d,\"batch_size\":%lld,"
             "\"accum\":%lld,\"global_batch\":%lld,\"steps\":%lld,\"threads\":%d,\"parameters\":%lld,\"seed\":%llu}",
          c->lr, in->world, in->data, in->tensor, in->pipeline, (long long)in->batch, (long long)in->accum,
          (long long)in->global_batch, (long long)in->total_steps, in->threads, (long long)in->parameters,
          (unsigned long long)c->seed);
  fprintf(f, ",\"identity\":{");
  first = 1;
  for (int i = 0; i < in->id->n; i++) put_kv(f, in->id->key[i], in->id->value[i], &first);
  fprintf(f, "},\"plan\":{");
  for (int k = 0; k < TDM_MEM_COUNT; k++)
    fprintf(f, "\"%s\":%lld,", tdm_mem_category_name((tdm_mem_category)k), (long long)in->plan->bytes[k]);
  fprintf(f, "\"total\":%lld,\"activations_estimated\":%s,\"comm_bytes_per_step\":%.0f}", (long long)in->plan->total,
          in->plan->act_unknown ? "false" : "true", in->plan->comm_per_step);
  fprintf(f, ",\"env\":{");
  first = 1;
  put_kv(f, "host", host, &first);
  if (have_un) {
    char os[400];
    snprintf(os, sizeof os, "%s %s %s", un.sysname, un.release, un.machine);
    put_kv(f, "os", os, &first);
  }
  char cores[32];
  snprintf(cores, sizeof cores, "%ld", sysconf(_SC_NPROCESSORS_ONLN));
  put_kv(f, "cores", cores, &first);
  put_kv(f, "blas_core", tdm_blas_core(), &first); /* OpenBLAS's kernels: AVX-512 or AVX2 doubles sgemm */
  const char *conv = tdm_k_conv2d_direct_isa(); /* the direct convolutions' kernels, or none: im2col + GEMM */
  put_kv(f, "conv_isa", conv ? conv : "none", &first);
  put_kv(f, "conv_winograd",
         !tdm_k_conv2d_winograd_on(NULL) ? "off" : tdm_k_conv2d_winograd_tile(0) == 4 ? "4x4" : "2x2",
         &first); /* 3x3 stride 1: F(4x4, 3x3) or F(2x2, 3x3) */
#ifdef __VERSION__
  put_kv(f, "compiler", __VERSION__, &first);
#endif
  for (char **e = environ; e && *e; e++) {
    if (!env_relevant(*e)) continue;
    char key[128];
    size_t n = strcspn(*e, "=");
    snprintf(key, sizeof key, "%.*s", (int)(n < sizeof key ? n : sizeof key - 1), *e);
    put_kv(f, key, *e + n + ((*e)[n] == '='), &first);
  }
  fprintf(f, "}}}\n");
}

/* ---- live status --------------------------------------------------------------------------- */
void tdm__status_publish(const tdm__status *s, int final) {
  static double last = -1e300, every = -1;
  const char *dir = getenv("TANDEM_STATUS_DIR");
  if (!dir || !*dir) return;
  if (every < 0) {
    const char *e = getenv("TANDEM_STATUS_EVERY");
    double v = e ? atof(e) / 2 : 0.5;
    every = v > 0.05 ? v : 0.05;
  }
  double now = tdm_time_now();
  if (!final && now - last < every) return;
  last = now;
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/rank-%d.json", dir, s->rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return; /* the launcher's view is a convenience: never a reason to stop training */
  fprintf(f, "{\"rank\":%d,\"world_size\":%d,\"step\":%lld,\"total\":%lld,\"loss\":%.6g,\"samples_per_sec\":%.1f,"
             "\"step_ms\":%.3f,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"comm_wait_ms\":%.3f,\"optimizer_ms\":%.3f,"
             "\"comm_share\":%.4f,\"final\":%d,\"time\":%.3f}\n",
          s->rank, s->world, (long long)s->step, (long long)s->total, isfinite(s->loss) ? s->loss : -1.0, s->samples_per_sec,
          s->step_ms, s->forward_ms, s->backward_ms, s->comm_wait_ms, s->optimizer_ms, s->comm_share, final, now);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad || rename(tmp, path) != 0) unlink(tmp);
}
