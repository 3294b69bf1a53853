/* A parameter server's shard in a checkpoint: see ps_ckpt.h. */
#include <stdio.h>
#include <string.h>

#include "parallel/ps_ckpt.h"
#include "train/ckpt_impl.h"

/* For each parameter overlapping [lo, hi): its name and [a, b) of the buffer. */
typedef tdm_status (*range_fn)(void *ctx, tdm_tensor *t, int64_t off, int64_t a, int64_t b);
static tdm_status each_in(tdm_params *p, int64_t lo, int64_t hi, range_fn fn, void *ctx) {
  for (int i = 0; i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    int64_t off = tdm_params_offset(p, i), end = off + tdm_tensor_numel(t);
    int64_t a = off > lo ? off : lo, b = end < hi ? end : hi;
    if (a < b) TDM__TRY(fn(ctx, t, off, a, b));
  }
  return TDM_OK;
}

typedef struct {
  tdm_ckpt_writer *w;
  tdm_ckpt *ck;
  tdm_params *p;
  float *state;
  int64_t lo, owned;
  int k;
  const char *names[2];
} shard_io;

static tdm_status put(void *ctx, tdm_tensor *t, int64_t off, int64_t a, int64_t b) {
  shard_io *x = ctx;
  char name[300];
  snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
  TDM__TRY(tdm_ckpt_writer_flat(x->w, name, a - off, b - off, tdm_params_data(x->p) + a));
  for (int s = 0; s < x->k; s++) {
    snprintf(name, sizeof name, "optim.%s.%s", x->names[s], tdm_tensor_name(t));
    TDM__TRY(tdm_ckpt_writer_flat(x->w, name, a - off, b - off, x->state + s * x->owned + (a - x->lo)));
  }
  return TDM_OK;
}

static tdm_status get(void *ctx, tdm_tensor *t, int64_t off, int64_t a, int64_t b) {
  shard_io *x = ctx;
  char name[300];
  snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
  TDM__TRY(tdm_ckpt_read_flat(x->ck, name, a - off, b - off, tdm_params_data(x->p) + a));
  for (int s = 0; s < x->k; s++) {
    snprintf(name, sizeof name, "optim.%s.%s", x->names[s], tdm_tensor_name(t));
    TDM__TRY(tdm_ckpt_read_flat(x->ck, name, a - off, b - off, x->state + s * x->owned + (a - x->lo)));
  }
  return TDM_OK;
}

static tdm_status shard_of(shard_io *x, tdm_params *p, tdm_optim *o, int64_t lo, int64_t hi) {
  memset(x, 0, sizeof *x);
  int64_t n_state = 0;
  x->p = p, x->lo = lo;
  x->state = tdm_optim_state(o, &n_state);
  x->owned = tdm_optim_owned(o);
  x->k = tdm__optim_state_names(o, x->names);
  if (x->owned != hi - lo || n_state != x->k * x->owned)
    return tdm__set_error(TDM_ERR_INTERNAL, "parameter server checkpoint: the optimizer holds %lld elements (%lld state floats); "
                          "the shard [%lld, %lld) has %lld", (long long)x->owned, (long long)n_state, (long long)lo,
                          (long long)hi, (long long)(hi - lo));
  return TDM_OK;
}

tdm_status tdm__ps_ckpt_save(const char *dir, tdm_comm_t world, tdm_params *p, tdm_optim *o, int64_t lo, int64_t hi,
                             int64_t step, int keep) {
  shard_io x;
  tdm_status st = shard_of(&x, p, o, lo, hi);
  tdm_ckpt_info ci = {.step = step};
  ci.optimizer = tdm_optim_kind_name(tdm_optim_get_config(o)->kind);
  tdm_ckpt_writer *w = NULL;
  tdm_status cs = tdm_ckpt_writer_create(&w, dir, &ci, tdm_optim_steps(o), world);
  if (!w) return tdm__ckpt_agree(world, cs, "checkpoint");
  x.w = w;
  for (int i = 0; st == TDM_OK && i < tdm_params_count(p); i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    char name[300];
    snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
    st = tdm_ckpt_writer_tensor(w, name, TDM_F32, tdm_tensor_ndim(t), tdm_tensor_shape(t));
    for (int s = 0; st == TDM_OK && s < x.k; s++) {
      snprintf(name, sizeof name, "optim.%s.%s", x.names[s], tdm_tensor_name(t));
      st = tdm_ckpt_writer_tensor(w, name, TDM_F32, tdm_tensor_ndim(t), tdm_tensor_shape(t));
    }
  }
  if (st == TDM_OK) st = each_in(p, lo, hi, put, &x);
  if (st != TDM_OK) tdm__ckpt_writer_fail(w, st);
  return tdm_ckpt_writer_commit(w, keep);
}

tdm_status tdm__ps_ckpt_load(const char *path, uint32_t crc, tdm_params *p, tdm_optim *o, int64_t lo, int64_t hi,
                             int64_t *optim_steps) {
  shard_io x;
  TDM__TRY(shard_of(&x, p, o, lo, hi));
  tdm_ckpt *ck = NULL;
  TDM__TRY(tdm_ckpt_open(&ck, path));
  tdm_status st = TDM_OK;
  if (tdm_ckpt_get_crc(ck) != crc)
    st = tdm__set_error(TDM_ERR_MISMATCH, "%s has checksum %08x; the workers resumed from one with %08x (the checkpoint "
                        "changed, or the server sees another directory)", path, tdm_ckpt_get_crc(ck), crc);
  if (st == TDM_OK) st = tdm__ckpt_check_model(ck, p);
  if (st == TDM_OK) st = tdm__ckpt_check_optim(ck, o, p);
  x.ck = ck;
  if (st == TDM_OK) st = each_in(p, lo, hi, get, &x);
  if (st == TDM_OK) {
    *optim_steps = tdm_ckpt_get_optim_steps(ck);
    tdm_optim_set_steps(o, *optim_steps);
  }
  tdm_ckpt_close(ck);
  return st;
}
