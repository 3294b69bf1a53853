/* Before the first step: outputs, the checkpoint directory's lock, and the agreed resume; see
 * run_start.h. */
#include "train/run_start.h"

#include "train/engine_ckpt.h"

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
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
    return tdm__set_error(TDM_ERR_IO, "train: %s %s is a directory; expected a file name", option, path);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  return probe_dir(dir, option);
}

static tdm_status open_outputs(const tdm_train_config *c, tdm__start_out *out) {
  if (c->save_weights) TDM__TRY(probe_file(c->save_weights, "--save-weights"));
  if (c->metrics && !(out->metrics = fopen(c->metrics, "w")))
    return tdm__set_error(TDM_ERR_IO, "train: cannot write metrics to %s: %s", c->metrics, strerror(errno));
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

/* The world size, then every setting of the identity must equal the checkpoint's (or be overridden). */
static tdm_status check_identity(const tdm_ckpt *ck, const tdm__run_identity *id, int world, const char *overrides, FILE *progress) {
  if (tdm_ckpt_get_info(ck)->world_size != world) /* the sampler's slices and the averaging depend on it */
    return tdm__set_error(TDM_ERR_MISMATCH,
                          "%s was written by %d ranks; this run has %d. Resume with the same number of ranks (or start afresh in another --checkpoint-dir)",
                          tdm_ckpt_path(ck), tdm_ckpt_get_info(ck)->world_size, world);
  char diff[900] = "";
  int refused = 0, fixed = 0;
  for (int i = 0; i < id->n; i++) {
    const char *v = tdm_ckpt_meta(ck, id->key[i]);
    if (v && !strcmp(v, id->value[i])) continue;
    int allowed = id->group[i] && overridden(overrides, id->group[i]);
    refused += !allowed;
    fixed += !allowed && !id->group[i];
    size_t used = strlen(diff);
    snprintf(diff + used, sizeof diff - used, "%s%s %s in the checkpoint, %s in this run%s", used ? "; " : "", id->what[i],
             v ? v : "(none)", id->value[i], allowed ? " (--resume-override)" : "");
  }
  if (!diff[0]) return TDM_OK;
  if (!refused) {
    if (progress) fprintf(progress, "tandem train: resuming with changed settings: %s\n", diff);
    return TDM_OK;
  }
  return tdm__set_error(TDM_ERR_MISMATCH, "%s (step %lld) was written by a run with other settings: %s. %s",
                        tdm_ckpt_path(ck), (long long)tdm_ckpt_get_info(ck)->step, diff,
                        fixed ? "The model and the optimizer cannot change on resume: start afresh in another "
                                "--checkpoint-dir (--init-weights can take the weights)"
                              : "Resume with the checkpoint's settings, or allow the change with --resume-override "
                                "(seed, batch, data)");
}

/* This rank's checkpoint, checked and loaded; *ck stays NULL when the directory holds none. */
static tdm_status open_and_load(const tdm__start_in *in, tdm_ckpt **ck) {
  const tdm_train_config *c = in->cfg;
  char notes[2048];
  tdm_status st = tdm_ckpt_open_latest(ck, c->checkpoint_dir, notes, sizeof notes);
  if (st == TDM_OK && notes[0] && in->progress)
    fprintf(in->progress, "tandem train: skipped in %s: %s\n", c->checkpoint_dir, notes);
  if (st != TDM_OK)
    return tdm__set_error(st, "%s. Nothing was changed: repair or move these entries away to start afresh", tdm_last_error());
  if (!*ck) return TDM_OK;
  TDM__TRY(check_identity(*ck, in->id, in->world, c->resume_override, in->progress));
  return tdm__engine_ckpt_restore(in->engine, in->rank, in->world, *ck);
}

/* ---- agreement ------------------------------------------------------------------------------- */
typedef struct {
  int32_t failed, found;
  int64_t step;
  uint32_t crc, pad;
  char text[496]; /* why this rank failed, or its checkpoint directory */
} start_rec;

static void describe(const start_rec *r, int rank, char *b, size_t n) {
  if (r->found) snprintf(b, n, "rank %d found step %lld (crc %08x) in %s", rank, (long long)r->step, r->crc, r->text);
  else snprintf(b, n, "rank %d found no checkpoint in %s", rank, r->text);
}

static tdm_status agree(const tdm__start_in *in, const start_rec *mine) {
  int W = in->world;
  start_rec *all = tdm__calloc((size_t)W, sizeof *all);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "train: out of memory");
  tdm_status st = tdm_comm_allgather(in->comm, mine, all, sizeof *mine, TDM_U8, TDM_ALGO_AUTO);
  for (int r = 0; st == TDM_OK && r < W; r++)
    if (all[r].failed) /* this rank's own failure keeps its own status and message */
      st = r == in->rank ? TDM_ERR_INTERNAL /* the caller keeps its own */
                         : tdm__set_error(TDM_ERR_REMOTE, "rank %d could not start: %.496s", r, all[r].text);
  int same = 1;
  for (int r = 1; st == TDM_OK && r < W; r++)
    same &= all[r].found == all[0].found && (!all[r].found || (all[r].step == all[0].step && all[r].crc == all[0].crc));
  if (st == TDM_OK && !same) {
    char msg[1024] = "", one[600];
    for (int r = 0; r < W && strlen(msg) < 700; r++) {
      describe(&all[r], r, one, sizeof one);
      size_t used = strlen(msg);
      snprintf(msg + used, sizeof msg - used, "%s%s", r ? "; " : "", one);
    }
    st = tdm__set_error(TDM_ERR_MISMATCH,
                        "the ranks found different checkpoints to resume from: %s%s. Every rank must see the same "
                        "checkpoints (a shared directory, or the same files in each)",
                        msg, strlen(msg) >= 700 ? "; ..." : "");
  }
  tdm__free(all);
  return st;
}

tdm_status tdm__run_start(const tdm__start_in *in, tdm__start_out *out) {
  const tdm_train_config *c = in->cfg;
  *out = (tdm__start_out){-1, NULL, 0, -1};
  tdm_ckpt *ck = NULL;
  tdm_status st = c->resume ? check_overrides(c->resume_override) : TDM_OK;
  if (st == TDM_OK && in->rank == 0) st = open_outputs(c, out);
  if (st == TDM_OK && c->resume && c->checkpoint_dir) st = open_and_load(in, &ck);
  if (in->comm) { /* every rank reaches this, failed or not, so none waits for one that gave up */
    start_rec mine = {st != TDM_OK, ck != NULL, ck ? tdm_ckpt_get_info(ck)->step : 0, ck ? tdm_ckpt_get_crc(ck) : 0, 0, ""};
    char own[1024];
    snprintf(own, sizeof own, "%s", tdm_last_error());
    snprintf(mine.text, sizeof mine.text, "%.495s", st != TDM_OK ? own : c->checkpoint_dir ? c->checkpoint_dir : "");
    tdm_status ag = agree(in, &mine);
    if (st == TDM_OK) st = ag;
    else tdm__set_error(st, "%s", own); /* this rank's own reason, not what the others said */
  }
  if (st == TDM_OK && ck) {
    out->step = out->resumed_from = tdm_ckpt_get_info(ck)->step;
    if (in->progress) fprintf(in->progress, "tandem train: resumed from step %lld of %s\n", (long long)out->step, c->checkpoint_dir);
  } else if (st == TDM_OK && c->resume && c->checkpoint_dir && in->progress) {
    fprintf(in->progress, "tandem train: no checkpoint in %s yet: starting from step 0\n", c->checkpoint_dir);
  }
  tdm_ckpt_close(ck);
  return st;
}

void tdm__run_start_release(tdm__start_out *out) {
  tdm_ckpt_unlock(out->lock_fd);
  out->lock_fd = -1;
  if (out->metrics) fclose(out->metrics);
  out->metrics = NULL;
}
