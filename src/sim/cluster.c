/* Cluster descriptions: defaults, the file (JSON, strict: every field present and valid), checks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "core/json.h"
#include "tandem/sim.h"

void tdm_sim_cluster_default(tdm_sim_cluster *k) {
  memset(k, 0, sizeof *k);
  k->ranks_per_node = 8;
  k->cores_per_node = 0;
  k->threads = 1;
  k->compute_ranks = 1;
  k->intra = (tdm_sim_link){2e-6, 1.0 / 100e9, 1.0 / 10e9};
  k->inter = (tdm_sim_link){10e-6, 1.0 / 12.5e9, 1.0 / 10e9};
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
    const double v[3] = {l[i]->alpha, l[i]->beta, l[i]->gamma};
    const char *vn[3] = {"alpha", "beta", "gamma"};
    for (int j = 0; j < 3; j++)
      if (!(v[j] >= 0) || !isfinite(v[j])) {
        snprintf(f, sizeof f, "%s.%s", ln[i], vn[j]);
        return bad(where, f, v[j], "a finite number >= 0 (seconds, per byte for beta and gamma)");
      }
  }
  if (k->allreduce_algo < 0 || k->allreduce_algo >= TDM_SIM_ALGO_COUNT || k->allreduce_algo == TDM_ALGO_CHAIN)
    return bad(where, "the all-reduce algorithm", k->allreduce_algo, "one of the table's rows that all-reduce");
  if (!(k->flops > 0) || !isfinite(k->flops)) return bad(where, "compute.flops", k->flops, "FLOP/s > 0");
  if (!(k->optim_rate > 0) || !isfinite(k->optim_rate)) return bad(where, "compute.optimizer", k->optim_rate, "elements/s > 0");
  if (!(k->overhead >= 0) || !isfinite(k->overhead)) return bad(where, "compute.overhead", k->overhead, "seconds >= 0");
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
static tdm_status integer(const tdm_json *o, const char *path, const char *key, int *out) {
  double v = 0;
  TDM__TRY(num(o, path, "", key, &v));
  if (v != floor(v) || v < -1e9 || v > 1e9) return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %s is %g; expected an integer", path, key, v);
  *out = (int)v;
  return TDM_OK;
}

tdm_status tdm_sim_cluster_load(const char *path, tdm_sim_cluster *k) {
  if (!path || !k) return tdm__set_error(TDM_ERR_INVALID_ARG, "simulate: NULL cluster file or cluster");
  FILE *f = fopen(path, "rb");
  if (!f) return tdm__set_error(TDM_ERR_IO, "cluster file %s: %s", path, strerror(errno));
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
  if (st == TDM_OK) st = num(intra, path, "intra", "alpha", &c.intra.alpha);
  if (st == TDM_OK) st = num(intra, path, "intra", "beta", &c.intra.beta);
  if (st == TDM_OK) st = num(intra, path, "intra", "gamma", &c.intra.gamma);
  if (st == TDM_OK) st = object(j, path, "inter", &inter);
  if (st == TDM_OK) st = num(inter, path, "inter", "alpha", &c.inter.alpha);
  if (st == TDM_OK) st = num(inter, path, "inter", "beta", &c.inter.beta);
  if (st == TDM_OK) st = num(inter, path, "inter", "gamma", &c.inter.gamma);
  if (st == TDM_OK) st = object(j, path, "compute", &comp);
  if (st == TDM_OK) st = num(comp, path, "compute", "flops", &c.flops);
  if (st == TDM_OK) st = num(comp, path, "compute", "optimizer", &c.optim_rate);
  if (st == TDM_OK) st = num(comp, path, "compute", "overhead", &c.overhead);
  double cr = 1;
  if (st == TDM_OK) st = num(comp, path, "compute", "ranks", &cr);
  if (st == TDM_OK && (cr != (int)cr || cr < 1 || cr > 1e6))
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "%s: compute.ranks is %g; expected an integer >= 1", path, cr);
  c.compute_ranks = (int)cr;
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
  char tmp[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "cluster file: path too long");
  FILE *f = fopen(tmp, "w");
  if (!f) return tdm__set_error(TDM_ERR_IO, "cluster file %s: %s", tmp, strerror(errno));
  fprintf(f, "{\n  \"ranks_per_node\": %d,\n  \"cores_per_node\": %d,\n  \"threads\": %d,\n  \"shm\": %d,\n", k->ranks_per_node,
          k->cores_per_node, k->threads, k->shm);
  fprintf(f, "  \"intra\": {\"alpha\": %.6e, \"beta\": %.6e, \"gamma\": %.6e},\n", k->intra.alpha, k->intra.beta, k->intra.gamma);
  fprintf(f, "  \"inter\": {\"alpha\": %.6e, \"beta\": %.6e, \"gamma\": %.6e},\n", k->inter.alpha, k->inter.beta, k->inter.gamma);
  fprintf(f, "  \"compute\": {\"flops\": %.6e, \"optimizer\": %.6e, \"overhead\": %.6e, \"ranks\": %d, \"model\": \"%s\"}%s\n",
          k->flops, k->optim_rate, k->overhead, k->compute_ranks, k->compute_model, extra && *extra ? "," : "");
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
