/* Before the first step: outputs, the checkpoint directory's lock, and the agreed resume; see
 * run_start.h. */
#include "train/run_start.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "tandem/checkpoint.h"

void tdm__identity_add(tdm__run_identity *id, const char *key, const char *what, const char *group, const char *fmt, ...) {
  TDM_ASSERT(id->n < TDM__IDENTITY_MAX);
  int i = id->n++;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(id->value[i], sizeof id->value[i], fmt, ap);
  va_end(ap);
  id->key[i] = key, id->what[i] = what, id->group[i] = group;
  id->kv[2 * i] = key, id->kv[2 * i + 1] = id->value[i];
}

void tdm__identity_adopt(tdm__run_identity *id, int (*adopt)(void *ctx, const char *ckpt_value), void *ctx) {
  TDM_ASSERT(id->n > 0);
  id->adopt[id->n - 1] = adopt, id->adopt_ctx[id->n - 1] = ctx;
}

void tdm__identity_newer(tdm__run_identity *id) {
  TDM_ASSERT(id->n > 0);
  id->newer[id->n - 1] = 1;
}

/* ---- outputs --------------------------------------------------------------------------------- */
/* Creates and removes a file in dir, as the writers will create theirs (a temporary, renamed). */
static tdm_status probe_dir(const char *dir, const char *option) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s/.tandem-probe-XXXXXX", dir);
  int fd = mkstemp(tmp);
  if (fd < 0) return tdm__set_error(TDM_ERR_IO, "train: %s: cannot create files in %s: %s", option, dir, strerror(errno));
  close(fd);
  unlink(tmp);
  return TDM_OK;
}

static tdm_status probe_file(const char *path, const char *option) {
  struct stat sb;
  if (!*path) return tdm__set_error(TDM_ERR_INVALID_ARG, "train: %s is empty; expected a file name", option);
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
    return tdm__set_error(TDM_ERR_IO, "train: %s %s is a directory; expected a file name", option, path);
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) /* written beside and renamed over: the node would be replaced */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: %s %s is %s; expected a regular file (or a new name)", option, path,
                          S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISCHR(sb.st_mode) ? "a character device" : S_ISBLK(sb.st_mode) ? "a block device" : "a socket or other special file");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  return probe_dir(dir, option);
}

/* Whether two output paths are one file: the same name, or both there and the same inode. */
static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return !strcmp(a, b) || (stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

static tdm_status open_outputs(const tdm_train_config *c, tdm__start_out *out) {
  if (c->save_weights && c->metrics && same_file(c->save_weights, c->metrics)) /* the weights would replace the metrics */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "train: --save-weights and --metrics are both '%s'; expected two files",
                          c->save_weights);
  if (c->save_weights) TDM__TRY(probe_file(c->save_weights, "--save-weights"));
  if (c->metrics && !(out->metrics = fopen(c->metrics, "a"))) /* never truncated: restarts and resumes append */
    return tdm__set_error(TDM_ERR_IO, "train: cannot write metrics to %s: %s", c->metrics, strerror(errno));
  if (out->metrics) { /* a record cut off by a kill: end its line, so what follows starts a line of its own */
    FILE *r = fopen(c->metrics, "r");
    if (r && fseek(r, -1, SEEK_END) == 0 && fgetc(r) != '\n') fputc('\n', out->metrics);
    if (r) fclose(r);
  }
  if (!c->checkpoint_dir) return TDM_OK;
  TDM__TRY(tdm_ckpt_lock(c->checkpoint_dir, &out->lock_fd));
  TDM__TRY(probe_dir(c->checkpoint_dir, "--checkpoint-dir"));
  if (c->resume) return TDM_OK;
  char first[256] = "";
  int n = tdm_ckpt_count_entries(c->checkpoint_dir, first, sizeof first);
  if (n < 0) return TDM_ERR_IO;
  if (n > 0) /* starting afresh here would overwrite and rotate away another run's checkpoints */
    return tdm__set_error(TDM_ERR_INVALID_USAGE,
                          "--checkpoint-dir %s already holds %d checkpoint entr%s (%s): pass --resume to continue from the "
                          "newest valid one, or start afresh in an empty or new directory",
                          c->checkpoint_dir, n, n == 1 ? "y" : "ies", first);
  return TDM_OK;
}

/* ---- the checkpoint against this run ----------------------------------------------------------- */
static const char *const override_groups[] = {"seed", "batch", "data"};

static int overridden(const char *list, const char *group) {
  size_t n = strlen(group);
  for (const char *p = list; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
    if (strncmp(p, group, n) == 0 && (p[n] == ',' || p[n] == 0)) return 1;
  }
  return 0;
}

static tdm_status check_overrides(const char *list) {
  for (const char *p = list; p && *p;) {
    size_t n = strcspn(p, ",");
    int known = 0;
    for (size_t g = 0; g < sizeof override_groups / sizeof *override_groups; g++)
      known |= n == strlen(override_groups[g]) && !strncmp(p, override_groups[g], n);
    if (!known)
      return tdm__set_error(TDM_ERR_INVALID_ARG,
                            "--resume-override: '%.*s'; expected a comma-separated list of seed, batch, data (the model "
                            "and the optimizer cannot change on resume)",
                            (int)n, p);
    p += n + (p[n] == ',');
  }
  return TDM_OK;
}

/* Every setting of the identity must equal the checkpoint's (or be overridden). The layout (world
 * size, ZeRO stage) may differ: checkpoints reshard. Called on every rank with the agreed checkpoint. */
typedef struct {
  tdm__run_identity *id;
  const char *overrides;
  FILE *progress;
} identity_check;

static tdm_status check_identity(void *ctx, const tdm_ckpt *ck) {
  const identity_check *ic = ctx;
  tdm__run_identity *id = ic->id;
  char diff[900] = "";
  int refused = 0, fixed = 0;
  for (int i = 0; i < id->n; i++) {
    const char *v = tdm_ckpt_meta(ck, id->key[i]);
    if ((v && !strcmp(v, id->value[i])) || (!v && id->newer[i])) continue;
    if (v && strlen(v) < sizeof id->value[i] && id->adopt[i] && id->adopt[i](id->adopt_ctx[i], v)) {
      if (ic->progress) fprintf(ic->progress, "tandem train: %s: %s, as the checkpoint's (%s here otherwise)\n", id->what[i], v, id->value[i]);
      snprintf(id->value[i], sizeof id->value[i], "%s", v); /* the checkpoints this run writes carry it on */
      continue;
    }
    int allowed = id->group[i] && overridden(ic->overrides, id->group[i]);
    refused += !allowed;
    fixed += !allowed && !id->group[i];
    size_t used = strlen(diff);
    snprintf(diff + used, sizeof diff - used, "%s%s %s in the checkpoint, %s in this run%s", used ? "; " : "", id->what[i],
             v ? v : "(none)", id->value[i], allowed ? " (--resume-override)" : "");
  }
  if (!diff[0]) return TDM_OK;
  if (!refused) {
    if (ic->progress) fprintf(ic->progress, "tandem train: resuming with changed settings: %s\n", diff);
    return TDM_OK;
  }
  return tdm__set_error(TDM_ERR_MISMATCH, "%s (step %lld) was written by a run with other settings: %s. %s",
                        tdm_ckpt_path(ck), (long long)tdm_ckpt_get_info(ck)->step, diff,
                        fixed ? "The model and the optimizer cannot change on resume: start afresh in another "
                                "--checkpoint-dir (--init-weights can take the weights)"
                              : "Resume with the checkpoint's settings, or allow the change with --resume-override "
                                "(seed, batch, data)");
}

/* ---- agreement ------------------------------------------------------------------------------- */
/* Every rank learns whether every rank could start (rank 0 opened the outputs and locked the
 * directory): a failure is reported on every rank, none waits for one that gave up. */
static tdm_status agree_start(const tdm__start_in *in, tdm_status st) {
  typedef struct {
    int32_t failed, pad;
    char text[504];
  } rec;
  int W = in->world;
  rec mine = {st != TDM_OK, 0, ""};
  char own[1024];
  snprintf(own, sizeof own, "%s", tdm_last_error());
  snprintf(mine.text, sizeof mine.text, "%.503s", st != TDM_OK ? own : "");
  rec *all = tdm__calloc((size_t)W, sizeof *all);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "train: out of memory");
  tdm_status cs = tdm_comm_allgather(in->comm, &mine, all, sizeof mine, TDM_U8, TDM_ALGO_AUTO);
  for (int r = 0; cs == TDM_OK && st == TDM_OK && r < W; r++)
    if (all[r].failed) st = tdm__error_from(r, tdm__set_error(TDM_ERR_REMOTE, "rank %d could not start: %.503s", r, all[r].text));
  tdm__free(all);
  if (mine.failed) return tdm__set_error(st, "%s", own); /* this rank's own reason */
  return st != TDM_OK ? st : cs;
}

/* Every rank reads the same data. The options agreed before the first collective (agree.h), but
 * what the files hold is known only once they are read: a node with another copy of the data set
 * (an older one) trained its shard on other samples, silently. One all-gather of a hash per
 * identity value (data set, its size and checksum, ...), and two broadcasts when one differs. */
static tdm_status agree_identity(const tdm__start_in *in) {
  const tdm__run_identity *id = in->id;
  int W = in->world, n = id->n;
  uint64_t mine[TDM__IDENTITY_MAX] = {0}, *all = tdm__calloc((size_t)W * TDM__IDENTITY_MAX, sizeof *all);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "train: out of memory");
  for (int i = 0; i < n; i++) mine[i] = tdm__hash_str(id->value[i]);
  tdm_status st = tdm_comm_allgather(in->comm, mine, all, TDM__IDENTITY_MAX, TDM_I64, TDM_ALGO_AUTO);
  int r = -1, k = -1; /* the first rank and value that differ from rank 0's */
  for (int q = 1; st == TDM_OK && q < W && k < 0; q++)
    for (int i = 0; i < n && k < 0; i++)
      if (all[(size_t)q * TDM__IDENTITY_MAX + i] != all[i]) r = q, k = i;
  tdm__free(all);
  if (st != TDM_OK || k < 0) return st;
  char v0[96], vr[96];
  memcpy(v0, id->value[k], sizeof v0);
  memcpy(vr, id->value[k], sizeof vr);
  TDM__TRY(tdm_comm_broadcast(in->comm, v0, sizeof v0, TDM_U8, 0, TDM_ALGO_AUTO));
  TDM__TRY(tdm_comm_broadcast(in->comm, vr, sizeof vr, TDM_U8, r, TDM_ALGO_AUTO));
  v0[sizeof v0 - 1] = vr[sizeof vr - 1] = 0;
  return tdm__set_error(TDM_ERR_MISMATCH,
                        "the ranks do not read the same data: %s is %s on rank %d but %s on rank 0%s. Every rank must read "
                        "the same files (--data-dir, --data-path): a node holds another copy?",
                        id->what[k], vr, r, v0, in->rank == r ? " (this rank differs)" : "");
}

/* Every rank writes its own file of each checkpoint and may read any other's: they must share the
 * directory. Rank 0 creates a file there; every rank looks for it in its own --checkpoint-dir. */
static tdm_status check_shared(const tdm__start_in *in, const char *dir) {
  struct {
    char dir[3072], name[64];
  } probe = {"", ""};
  char path[4096];
  tdm_status st = TDM_OK;
  if (in->rank == 0) {
    snprintf(path, sizeof path, "%s/.tandem-shared-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) st = tdm__set_error(TDM_ERR_IO, "train: --checkpoint-dir: cannot create files in %s: %s", dir, strerror(errno));
    else close(fd);
    snprintf(probe.dir, sizeof probe.dir, "%s", dir);
    snprintf(probe.name, sizeof probe.name, "%s", strrchr(path, '/') + 1);
  }
  TDM__TRY(agree_start(in, st));
  st = tdm_comm_broadcast(in->comm, &probe, sizeof probe, TDM_U8, 0, TDM_ALGO_AUTO);
  snprintf(path, sizeof path, "%s/%s", dir, probe.name);
  if (st == TDM_OK && access(path, F_OK) != 0)
    st = tdm__set_error(TDM_ERR_INVALID_USAGE,
                        "checkpoint directory %s (rank %d) is not the one rank 0 writes into (%s): a file rank 0 just "
                        "created there is not in it. Every rank writes its own part of each checkpoint: give every rank "
                        "the same --checkpoint-dir, on a file system all of them share",
                        dir, in->rank, probe.dir);
  st = agree_start(in, st);
  if (in->rank == 0) unlink(path);
  return st;
}

tdm_status tdm__run_start(const tdm__start_in *in, tdm__start_out *out) {
  const tdm_train_config *c = in->cfg;
  *out = (tdm__start_out){-1, NULL, 0, -1, 0, 0, "", 0};
  tdm_status st = c->resume ? check_overrides(c->resume_override) : TDM_OK;
  if (st == TDM_OK && in->rank == 0) st = open_outputs(c, out);
  if (in->comm) st = agree_start(in, st);
  if (st == TDM_OK && in->comm) st = agree_identity(in);
  if (st == TDM_OK && in->comm && c->checkpoint_dir) st = check_shared(in, c->checkpoint_dir);
  if (st != TDM_OK || !c->resume || !c->checkpoint_dir) return st;
  /* every rank opens the newest valid checkpoint and reads what it holds, whatever layout wrote it */
  identity_check ic = {in->id, c->resume_override, in->progress};
  tdm_ckpt_resumed res;
  char notes[2048];
  st = tdm_ckpt_resume_engine(c->checkpoint_dir, in->engine, check_identity, &ic, &res, notes, sizeof notes);
  if (notes[0] && in->progress) fprintf(in->progress, "tandem train: skipped in %s: %s\n", c->checkpoint_dir, notes);
  TDM__TRY(st);
  if (!res.found) {
    if (in->progress) fprintf(in->progress, "tandem train: no checkpoint in %s yet: starting from step 0\n", c->checkpoint_dir);
    return TDM_OK;
  }
  out->step = out->resumed_from = res.step;
  out->data_epoch = res.data_epoch, out->data_offset = res.data_offset;
  snprintf(out->ckpt_path, sizeof out->ckpt_path, "%s", res.path);
  out->ckpt_crc = res.crc;
  if (in->progress) {
    fprintf(in->progress, "tandem train: resumed from step %lld of %s", (long long)res.step, c->checkpoint_dir);
    if (strcmp(res.layout, tdm_engine_describe(in->engine)))
      fprintf(in->progress, " (written by %s; resharded to %s)", res.layout, tdm_engine_describe(in->engine));
    fprintf(in->progress, "\n");
  }
  return TDM_OK;
}

void tdm__run_start_release(tdm__start_out *out) {
  tdm_ckpt_unlock(out->lock_fd);
  out->lock_fd = -1;
  if (out->metrics) fclose(out->metrics);
  out->metrics = NULL;
}
