/* Cluster descriptions: defaults, the file (JSON, strict: every field present and valid), checks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/internal.h"
#include "core/json.h"
#include "tandem/sim.h"

void tdm_sim_cluster_default(tdm_sim_cluster *k) {
  TDM__NONNULL(k, , "tdm_sim_cluster_default: the cluster k is NULL");
  memset(k, 0, sizeof *k);
  k->ranks_per_node = 8;
  k->cores_per_node = 0;
  k->threads = 1;
  k->compute_ranks = 1;
  k->intra = (tdm_sim_link){.alpha = 2e-6, .beta = 1.0 / 100e9, .gamma = 1.0 / 10e9};
  k->inter = (tdm_sim_link){.alpha = 10e-6, .beta = 1.0 / 12.5e9, .gamma = 1.0 / 10e9};
  k->shm = 0;
  k->flops = 1e12;
  k->optim_rate = 1e9;
  k->overhead = 0;
}

static tdm_status bad(const char *where, const char *field, double v, const char *want) {
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s is %g; expected %s", where, field, v, want);
}

tdm_status tdm_sim_cluster_check(const tdm_sim_cluster *k, const char *where) {
  if (!k) return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: NULL cluster");
  if (!where) where = "cluster";
  if (k->ranks_per_node < 1) return bad(where, "ranks_per_node", k->ranks_per_node, "an integer >= 1");
  if (k->cores_per_node < 0) return bad(where, "cores_per_node", k->cores_per_node, "an integer >= 0 (0: unlimited)");
  if (k->threads < 1) return bad(where, "threads", k->threads, "an integer >= 1");
  if (k->compute_ranks < 1) return bad(where, "compute.ranks", k->compute_ranks, "an integer >= 1 (ranks computing on a node when the rate was measured)");
  const tdm_sim_link *l[2] = {&k->intra, &k->inter};
  const char *ln[2] = {"intra", "inter"};
  char f[64];
  for (int i = 0; i < 2; i++) {
    const double v[12] = {l[i]->alpha,    l[i]->beta, l[i]->gamma,       l[i]->cpu_alpha, l[i]->cpu_beta,  l[i]->fan_alpha,
                          l[i]->fan_beta, l[i]->wake, l[i]->wake_shared, l[i]->big_bytes, l[i]->big_factor, l[i]->handoff};
    const char *vn[12] = {"alpha", "beta", "gamma", "cpu_alpha", "cpu_beta", "fan_alpha", "fan_beta", "wake", "wake_shared", "big_bytes", "big_factor", "handoff"};
    for (int j = 0; j < 12; j++)
      if (!(v[j] >= 0) || !isfinite(v[j])) {
        snprintf(f, sizeof f, "%s.%s", ln[i], vn[j]);
        return bad(where, f, v[j], "a finite number >= 0 (seconds, per byte for beta, gamma, cpu_beta and fan_beta)");
      }
    if (l[i]->big_factor > 0 && l[i]->big_factor < 1) { /* 0: zero-initialised, none */
      snprintf(f, sizeof f, "%s.big_factor", ln[i]);
      return bad(where, f, l[i]->big_factor, "1 or more (what a byte of a message of big_bytes or more costs against one of a small message)");
    }
    if (!(l[i]->fan_big_factor == 0 || l[i]->fan_big_factor >= 1) || !isfinite(l[i]->fan_big_factor)) {
      snprintf(f, sizeof f, "%s.fan_big_factor", ln[i]);
      return bad(where, f, l[i]->fan_big_factor, "0 (big_factor's) or 1 or more (big_factor for messages to several peers at once)");
    }
    if (!(l[i]->stagger >= 0 && l[i]->stagger <= 1)) {
      snprintf(f, sizeof f, "%s.stagger", ln[i]);
      return bad(where, f, l[i]->stagger, "a share from 0 (crowded cores' work follows the wire) to 1 (it hides under the others' wire)");
    }
    if (l[i]->pairwise != 0 && l[i]->pairwise != 1) {
      snprintf(f, sizeof f, "%s.pairwise", ln[i]);
      return bad(where, f, l[i]->pairwise, "0 (a rank's messages share its link) or 1 (a link per pair of ranks)");
    }
  }
  if (!(k->cpu_cores >= 0) || !isfinite(k->cpu_cores)) return bad(where, "cpu_cores", k->cpu_cores, "a finite number >= 0 (0: unlimited)");
  if (k->allreduce_algo < 0 || k->allreduce_algo >= TDM_SIM_ALGO_COUNT || k->allreduce_algo == TDM_ALGO_CHAIN)
    return bad(where, "the all-reduce algorithm", k->allreduce_algo, "one of the table's rows that all-reduce");
  if (!(k->flops > 0) || !isfinite(k->flops)) return bad(where, "compute.flops", k->flops, "FLOP/s > 0");
  if (!(k->optim_rate > 0) || !isfinite(k->optim_rate)) return bad(where, "compute.optimizer", k->optim_rate, "elements/s > 0");
  if (!(k->overhead >= 0) || !isfinite(k->overhead)) return bad(where, "compute.overhead", k->overhead, "seconds >= 0");
  if (!(k->compute_cv >= 0) || !isfinite(k->compute_cv)) return bad(where, "compute.cv", k->compute_cv, "a spread >= 0 (0: steps do not vary)");
  return TDM_OK;
}

/* ---- reading -------------------------------------------------------------------------------------- */
static tdm_status num(const tdm_json *o, const char *path, const char *obj, const char *key, double *out) {
  const tdm_json *v = o ? tdm__json_get(o, key) : NULL;
  if (!v) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the field %s%s%s is missing", path, obj, *obj ? "." : "", key);
  if (v->type != TDM_JSON_NUM)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the field %s%s%s is not a number", path, obj, *obj ? "." : "", key);
  *out = v->num;
  return TDM_OK;
}
static tdm_status object(const tdm_json *root, const char *path, const char *key, const tdm_json **out) {
  *out = tdm__json_get(root, key);
  if (!*out) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: the object \"%s\" is missing", path, key);
  if ((*out)->type != TDM_JSON_OBJ) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: \"%s\" is not an object", path, key);
  return TDM_OK;
}
/* A field that files written before it existed lack: def when absent, else as num(). */
static tdm_status optional(const tdm_json *o, const char *path, const char *obj, const char *key, double def, double *out) {
  if (!o || !tdm__json_get(o, key)) {
    *out = def;
    return TDM_OK;
  }
  return num(o, path, obj, key, out);
}
/* A link's fields: alpha, beta, gamma required; the CPU part and pairwise optional (0: the plain
 * alpha-beta-gamma link of files calibrated before them). */
static tdm_status link_of(const tdm_json *o, const char *path, const char *name, tdm_sim_link *l) {
  double pw = 0;
  TDM__TRY(num(o, path, name, "alpha", &l->alpha));
  TDM__TRY(num(o, path, name, "beta", &l->beta));
  TDM__TRY(num(o, path, name, "gamma", &l->gamma));
  TDM__TRY(optional(o, path, name, "cpu_alpha", 0, &l->cpu_alpha));
  TDM__TRY(optional(o, path, name, "cpu_beta", 0, &l->cpu_beta));
  TDM__TRY(optional(o, path, name, "fan_alpha", 0, &l->fan_alpha));
  TDM__TRY(optional(o, path, name, "fan_beta", 0, &l->fan_beta));
  TDM__TRY(optional(o, path, name, "wake", 0, &l->wake));
  TDM__TRY(optional(o, path, name, "wake_shared", 0, &l->wake_shared)); /* 0: wake (files calibrated before it) */
  TDM__TRY(optional(o, path, name, "big_bytes", 0, &l->big_bytes));
  TDM__TRY(optional(o, path, name, "big_factor", 1, &l->big_factor));
  TDM__TRY(optional(o, path, name, "fan_big_factor", 0, &l->fan_big_factor));
  TDM__TRY(optional(o, path, name, "handoff", 0, &l->handoff));
  TDM__TRY(optional(o, path, name, "stagger", 0, &l->stagger)); /* 0: lockstep (files calibrated before it) */
  TDM__TRY(optional(o, path, name, "pairwise", 0, &pw));
  if (pw != 0 && pw != 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s.pairwise is %g; expected 0 or 1", path, name, pw);
  l->pairwise = (int)pw;
  return TDM_OK;
}
static tdm_status integer(const tdm_json *o, const char *path, const char *key, int *out) {
  double v = 0;
  TDM__TRY(num(o, path, "", key, &v));
  if (v != floor(v) || v < -1e9 || v > 1e9) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s is %g; expected an integer", path, key, v);
  *out = (int)v;
  return TDM_OK;
}

tdm_status tdm_sim_cluster_load(const char *path, tdm_sim_cluster *k) {
  if (!path || !k) return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: NULL cluster file or cluster");
  int fd = -1;
  int64_t size = 0;
  if (tdm__file_open_regular(path, &fd, &size) != TDM_OK) { /* a directory or a FIFO is named as such, not "not JSON" */
    char why[600];
    snprintf(why, sizeof why, "%s", tdm_last_error());
    return tdm__set_error(TDM_ERR_IO, "cluster file: %s", why);
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return tdm__set_error(TDM_ERR_IO, "cluster file %s: %s", path, strerror(errno));
  }
  char *text = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 > cap) {
      char *t = realloc(text, cap = cap * 2 + 8192);
      if (!t) {
        free(text), fclose(f);
        return tdm__set_error(TDM_ERR_NO_MEMORY, "cluster file %s: out of memory", path);
      }
      text = t;
    }
    size_t r = fread(text + n, 1, cap - n, f);
    n += r;
    if (r == 0 || n > (1 << 22)) break;
  }
  fclose(f);
  tdm_json *j = NULL;
  tdm_status st = tdm__json_parse(text, n, &j);
  free(text);
  if (st != TDM_OK) return tdm__set_error(st, "cluster file %s: not valid JSON: %s", path, tdm_last_error());
  tdm_sim_cluster c;
  tdm_sim_cluster_default(&c);
  const tdm_json *intra, *inter, *comp;
  double shm = 0;
  if (j->type != TDM_JSON_OBJ) st = tdm__set_error(TDM_ERR_INVALID_ARG, "%s: expected a JSON object", path);
  if (st == TDM_OK) st = integer(j, path, "ranks_per_node", &c.ranks_per_node);
  if (st == TDM_OK) st = integer(j, path, "cores_per_node", &c.cores_per_node);
  if (st == TDM_OK) st = integer(j, path, "threads", &c.threads);
  if (st == TDM_OK) st = num(j, path, "", "shm", &shm);
  if (st == TDM_OK) st = object(j, path, "intra", &intra);
  if (st == TDM_OK) st = link_of(intra, path, "intra", &c.intra);
  if (st == TDM_OK) st = object(j, path, "inter", &inter);
  if (st == TDM_OK) st = link_of(inter, path, "inter", &c.inter);
  if (st == TDM_OK) st = optional(j, path, "", "cpu_cores", c.cores_per_node, &c.cpu_cores);
  if (st == TDM_OK) st = object(j, path, "compute", &comp);
  if (st == TDM_OK) st = num(comp, path, "compute", "flops", &c.flops);
  if (st == TDM_OK) st = num(comp, path, "compute", "optimizer", &c.optim_rate);
  if (st == TDM_OK) st = num(comp, path, "compute", "overhead", &c.overhead);
  double cr = 1;
  if (st == TDM_OK) st = num(comp, path, "compute", "ranks", &cr);
  if (st == TDM_OK && (cr != (int)cr || cr < 1 || cr > 1e6))
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "%s: compute.ranks is %g; expected an integer >= 1", path, cr);
  c.compute_ranks = (int)cr;
  if (st == TDM_OK) st = optional(comp, path, "compute", "cv", 0, &c.compute_cv);
  if (st == TDM_OK) {
    const tdm_json *m = tdm__json_get(comp, "model");
    if (m && m->type == TDM_JSON_STR) snprintf(c.compute_model, sizeof c.compute_model, "%s", m->str);
  }
  c.shm = shm != 0;
  tdm__json_free(j);
  TDM__TRY(st);
  TDM__TRY(tdm_sim_cluster_check(&c, path));
  *k = c;
  return TDM_OK;
}

tdm_status tdm_sim_cluster_save(const char *path, const tdm_sim_cluster *k, const char *extra) {
  TDM__TRY(tdm_sim_cluster_check(k, "cluster"));
  if (extra && *extra) { /* members of an object: the file must load again */
    size_t n = strlen(extra);
    char *obj = malloc(n + 3);
    tdm_json *j = NULL;
    if (!obj) return tdm__set_error(TDM_ERR_NO_MEMORY, "cluster file: out of memory");
    snprintf(obj, n + 3, "{%s}", extra);
    tdm_status st = tdm__json_parse(obj, n + 2, &j);
    free(obj);
    tdm__json_free(j);
    if (st != TDM_OK) return tdm__set_error(TDM_ERR_INVALID_ARG, "cluster file: extra members %.60s%s are not JSON: %s", extra, n > 60 ? "..." : "", tdm_last_error());
  }
  /* the compute model's name as a JSON string: escaped, at most its array's bytes */
  char model[2 * sizeof k->compute_model * 3 + 1];
  size_t mo = 0;
  for (size_t i = 0; i < sizeof k->compute_model && k->compute_model[i]; i++) {
    unsigned char ch = (unsigned char)k->compute_model[i];
    if (ch == '"' || ch == '\\') model[mo++] = '\\', model[mo++] = (char)ch;
    else if (ch < 0x20) mo += (size_t)snprintf(model + mo, sizeof model - mo, "\\u%04x", ch);
    else model[mo++] = (char)ch;
  }
  model[mo] = 0;
  char tmp[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cluster file: path too long");
  FILE *f = fopen(tmp, "w");
  if (!f) return tdm__set_error(TDM_ERR_IO, "cluster file %s: %s", tmp, strerror(errno));
  fprintf(f, "{\n  \"ranks_per_node\": %d,\n  \"cores_per_node\": %d,\n  \"threads\": %d,\n  \"shm\": %d,\n", k->ranks_per_node,
          k->cores_per_node, k->threads, k->shm);
  fprintf(f, "  \"cpu_cores\": %.4g,\n", k->cpu_cores);
  const tdm_sim_link *l[2] = {&k->intra, &k->inter};
  for (int i = 0; i < 2; i++)
    fprintf(f,
            "  \"%s\": {\"alpha\": %.6e, \"beta\": %.6e, \"gamma\": %.6e, \"cpu_alpha\": %.6e, \"cpu_beta\": %.6e, "
            "\"fan_alpha\": %.6e, \"fan_beta\": %.6e, \"wake\": %.6e, \"wake_shared\": %.6e, \"big_bytes\": %.0f, \"big_factor\": %.4f, "
            "\"fan_big_factor\": %.4f, \"pairwise\": %d, \"handoff\": %.6e, \"stagger\": %.4f},\n",
            i ? "inter" : "intra", l[i]->alpha, l[i]->beta, l[i]->gamma, l[i]->cpu_alpha, l[i]->cpu_beta, l[i]->fan_alpha,
            l[i]->fan_beta, l[i]->wake, l[i]->wake_shared, l[i]->big_bytes, l[i]->big_factor, l[i]->fan_big_factor, l[i]->pairwise,
            l[i]->handoff, l[i]->stagger);
  fprintf(f, "  \"compute\": {\"flops\": %.6e, \"optimizer\": %.6e, \"overhead\": %.6e, \"ranks\": %d, \"cv\": %.4f, \"model\": \"%s\"}%s\n",
          k->flops, k->optim_rate, k->overhead, k->compute_ranks, k->compute_cv, model, extra && *extra ? "," : "");
  if (extra && *extra) fprintf(f, "  %s\n", extra);
  fprintf(f, "}\n");
  int bad_write = ferror(f);
  if (fclose(f) != 0 || bad_write) {
    remove(tmp);
    return tdm__set_error(TDM_ERR_IO, "cluster file %s: write failed: %s", tmp, strerror(errno));
  }
  if (rename(tmp, path) != 0) {
    remove(tmp);
    return tdm__set_error(TDM_ERR_IO, "cluster file %s: %s", path, strerror(errno));
  }
  return TDM_OK;
}
