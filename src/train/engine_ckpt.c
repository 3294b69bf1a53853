/* An engine's state as a checkpoint of logical tensors, and back into an engine of any layout
 * (tandem/checkpoint.h). A rank writes the elements its optimizer updates (ZeRO: its spans; a
 * pipeline: its chunks', an even share of them per data replica; data parallelism, where every
 * rank holds everything: an even share of the buffer; tensor parallelism: the boxes of its slices,
 * tdm_engine_pieces), as flat ranges or boxes of
 * each parameter and of each of the optimizer's state tensors; loading reads the ranges a rank
 * holds, whatever ranges the writers held. Adam's and SGD's updates are elementwise, so a moment
 * moved to another rank continues exactly as it would have where it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/ckpt_impl.h"

/* What this rank holds of an engine's state. */
typedef struct {
  tdm_params *p;
  tdm_optim *o;
  int n_spans; /* the optimizer's spans: the layout of its state and (stage 3) of the parameters' shard */
  const tdm_optim_span *spans;
  int whole;   /* the parameters are whole on this rank */
  float *shard; /* else: the parameters of the spans, packed span after span */
  float *state;
  int64_t n_state, owned;
  const char *names[2];
  int k; /* state tensors per parameter */
} held;

static tdm_status held_of(tdm_engine *e, held *h) {
  memset(h, 0, sizeof *h);
  h->p = tdm_model_params(tdm_engine_model(e));
  h->o = tdm_engine_optim(e);
  h->n_spans = tdm_engine_shard(e, &h->spans);
  h->whole = tdm_engine_params_whole(e);
  if (!h->whole) {
    tdm_st_tensor ts[3];
    int n = 0;
    TDM__TRY(tdm_engine_shard_state(e, ts, &n));
    for (int i = 0; i < n; i++)
      if (!strcmp(ts[i].name, "model.shard")) h->shard = (float *)ts[i].data;
    if (!h->shard) return tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: %s keeps no parameter shard", tdm_engine_describe(e));
  }
  h->state = tdm_optim_state(h->o, &h->n_state);
  h->owned = tdm_optim_owned(h->o);
  h->k = tdm__optim_state_names(h->o, h->names);
  if (h->n_state != h->k * h->owned)
    return tdm__set_error(TDM_ERR_INTERNAL, "checkpoint: the optimizer keeps %lld state floats for %lld elements; expected %d per element",
                          (long long)h->n_state, (long long)h->owned, h->k);
  return TDM_OK;
}

/* Where element x of the buffer lies in the optimizer's own index space (its spans, packed). */
static int64_t pos_of(const held *h, int64_t x) {
  int64_t at = 0;
  for (int s = 0; s < h->n_spans; s++) {
    if (x >= h->spans[s].lo && x < h->spans[s].hi) return at + x - h->spans[s].lo;
    at += h->spans[s].hi - h->spans[s].lo;
  }
  return -1;
}

/* For each parameter overlapping [lo, hi) of the buffer: fn(ctx, parameter, its offset, [a, b) of the buffer). */
typedef tdm_status (*overlap_fn)(void *ctx, const held *h, tdm_tensor *t, int64_t off, int64_t a, int64_t b);
static tdm_status each_overlap(const held *h, int64_t lo, int64_t hi, overlap_fn fn, void *ctx) {
  for (int i = 0; i < tdm_params_count(h->p); i++) {
    tdm_tensor *t = tdm_params_get(h->p, i);
    int64_t off = tdm_params_offset(h->p, i), end = off + tdm_tensor_numel(t);
    int64_t a = off > lo ? off : lo, b = end < hi ? end : hi;
    if (a < b) TDM__TRY(fn(ctx, h, t, off, a, b));
  }
  return TDM_OK;
}

/* ---- saving ------------------------------------------------------------------------------------ */
static tdm_status put_overlap(void *ctx, const held *h, tdm_tensor *t, int64_t off, int64_t a, int64_t b) {
  tdm_ckpt_writer *w = ctx;
  char name[300];
  snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
  const float *src = h->whole ? tdm_params_data(h->p) + a : h->shard + pos_of(h, a);
  TDM__TRY(tdm_ckpt_writer_flat(w, name, a - off, b - off, src));
  for (int s = 0; s < h->k; s++) {
    snprintf(name, sizeof name, "optim.%s.%s", h->names[s], tdm_tensor_name(t));
    TDM__TRY(tdm_ckpt_writer_flat(w, name, a - off, b - off, h->state + s * h->owned + pos_of(h, a)));
  }
  return TDM_OK;
}

/* fp16's loss scaler is engine state beside the tensors: saved as two metadata values (the scale
 * and the clean steps since it last changed), so that a resumed run, in any layout, goes on with
 * the same scale and doubles it at the same step. */
#define LS_SCALE "tandem.loss_scale"
#define LS_GOOD "tandem.loss_scale_good"

static int is_fp16(tdm_engine *e) { return tdm_tape_autocast(tdm_engine_tape(e)) == TDM_F16; }

static tdm_status restore_loss_scale(tdm_engine *e, const tdm_ckpt *ck) {
  const char *sv = tdm_ckpt_meta(ck, LS_SCALE), *gv = tdm_ckpt_meta(ck, LS_GOOD);
  if (!sv || !gv) return TDM_OK; /* written without fp16: the run's initial scale */
  char *end1, *end2;
  double scale = strtod(sv, &end1);
  long long good = strtoll(gv, &end2, 10);
  if (end1 == sv || *end1 || end2 == gv || *end2 || !(scale > 0) || good < 0)
    return tdm__set_error(TDM_ERR_FORMAT, "%s: metadata %s = '%s', %s = '%s'; expected a positive number and a count",
                          tdm_ckpt_path(ck), LS_SCALE, sv, LS_GOOD, gv);
  return tdm_engine_set_loss_scale(e, scale, good); /* ignored outside fp16 */
}

/* A compressor's state (tandem/compress.h): "compress.residual" (W x the gradient buffer, W the
 * data axis' size, the only axis a compressing engine runs on; row r is data rank r's residuals,
 * which differ between ranks) and "compress.shared" (PowerSGD's Q, bucket after bucket; the same
 * on every rank, written by rank 0). A resumed run with as many ranks continues bit-identically;
 * another rank count or a checkpoint without them starts afresh. */
static tdm_status put_compress(tdm_ckpt_writer *w, tdm_engine *e) {
  int R = tdm_grid_index(tdm_engine_grid(e), TDM_AXIS_DATA), W = tdm_grid_size(tdm_engine_grid(e), TDM_AXIS_DATA);
  int64_t lo, hi, ns, total = 0;
  float *res, *sh;
  int nb = tdm_engine_compress_state(e, 0, &lo, &hi, &res, &sh, &ns);
  if (nb <= 0) return TDM_OK;
  for (int k = 0; k < nb; k++) tdm_engine_compress_state(e, k, &lo, &hi, &res, &sh, &ns), total += ns;
  int64_t shape[2] = {W, tdm_params_numel(tdm_model_params(tdm_engine_model(e)))};
  TDM__TRY(tdm_ckpt_writer_tensor(w, "compress.residual", TDM_F32, 2, shape));
  if (total) TDM__TRY(tdm_ckpt_writer_tensor(w, "compress.shared", TDM_F32, 1, &total));
  for (int k = 0, at = 0; k < nb; k++) {
    tdm_engine_compress_state(e, k, &lo, &hi, &res, &sh, &ns);
    int64_t start[2] = {R, lo}, count[2] = {1, hi - lo};
    if (hi > lo) TDM__TRY(tdm_ckpt_writer_box(w, "compress.residual", start, count, res));
    if (R == 0 && ns) TDM__TRY(tdm_ckpt_writer_flat(w, "compress.shared", at, at + ns, sh));
    at += (int)ns;
  }
  return TDM_OK;
}

static tdm_status put_box(tdm_ckpt_writer *w, const held *h, const tdm_engine_piece *b) {
  const char *pname = tdm_tensor_name(tdm_params_get(h->p, b->param));
  char name[300];
  snprintf(name, sizeof name, "model.%s", pname);
  TDM__TRY(tdm_ckpt_writer_box(w, name, b->start, b->count, b->data));
  for (int s = 0; s < h->k; s++) {
    snprintf(name, sizeof name, "optim.%s.%s", h->names[s], pname);
    TDM__TRY(tdm_ckpt_writer_box(w, name, b->start, b->count, h->state + s * h->owned + b->state_at));
  }
  return TDM_OK;
}

/* Reads it back when the checkpoint has it for as many ranks and the same buckets; else the
 * compressor starts afresh (residuals zero, Q from the seed), with a warning. */
static tdm_status get_compress(tdm_ckpt *ck, tdm_engine *e) {
  int R = tdm_grid_index(tdm_engine_grid(e), TDM_AXIS_DATA), W = tdm_grid_size(tdm_engine_grid(e), TDM_AXIS_DATA);
  int64_t lo, hi, ns, total = 0;
  float *res, *sh;
  int nb = tdm_engine_compress_state(e, 0, &lo, &hi, &res, &sh, &ns);
  if (nb <= 0) return TDM_OK;
  for (int k = 0; k < nb; k++) tdm_engine_compress_state(e, k, &lo, &hi, &res, &sh, &ns), total += ns;
  const tdm_ckpt_tensor *tr = tdm_ckpt_tensor_find(ck, "compress.residual"), *ts = tdm_ckpt_tensor_find(ck, "compress.shared");
  int64_t numel = tdm_params_numel(tdm_model_params(tdm_engine_model(e)));
  char msg[256] = "";
  if (!tr) snprintf(msg, sizeof msg, "the checkpoint holds no compression residuals (written without --compress)");
  else if (tr->ndim != 2 || tr->shape[0] != W || tr->shape[1] != numel)
    snprintf(msg, sizeof msg, "the checkpoint's compression residuals are for %lld ranks; this run has %d", tr->ndim == 2 ? (long long)tr->shape[0] : -1LL, W);
  else if (total && (!ts || ts->ndim != 1 || ts->shape[0] != total))
    snprintf(msg, sizeof msg, "the checkpoint's compressor state does not fit this compressor (%lld values; %lld expected)",
             ts && ts->ndim == 1 ? (long long)ts->shape[0] : 0LL, (long long)total);
  if (msg[0]) { /* zero, whatever a checkpoint tried before this one left half read */
    for (int k = 0; k < nb; k++)
      if (tdm_engine_compress_state(e, k, &lo, &hi, &res, &sh, &ns) > 0 && hi > lo) memset(res, 0, sizeof(float) * (size_t)(hi - lo));
    tdm_engine_compress_state(e, -1, &lo, &hi, &res, &sh, &ns);
    if (R == 0) tdm_log(TDM_LOG_WARN, "resume: %s: they start at zero (and PowerSGD's Q from the seed)", msg);
    return TDM_OK;
  }
  for (int k = 0, at = 0; k < nb; k++) {
    tdm_engine_compress_state(e, k, &lo, &hi, &res, &sh, &ns);
    int64_t start[2] = {R, lo}, count[2] = {1, hi - lo};
    if (hi > lo) TDM__TRY(tdm_ckpt_read_box(ck, "compress.residual", start, count, res));
    if (ns) TDM__TRY(tdm_ckpt_read_flat(ck, "compress.shared", at, at + ns, sh));
    at += (int)ns;
  }
  tdm_engine_compress_state(e, -1, &lo, &hi, &res, &sh, &ns); /* the check starts from what was read */
  return TDM_OK;
}

tdm_status tdm_ckpt_save_engine(const char *dir, tdm_engine *e, const tdm_ckpt_info *info, int keep) {
  if (!dir || !e || !info) return tdm__set_error(TDM_ERR_INVALID_ARG, "checkpoint: NULL argument");
  tdm_comm_t comm = tdm_grid_world(tdm_engine_grid(e));
  held h;
  tdm_status st = held_of(e, &h);
  tdm_ckpt_info ci = *info;
  if (!ci.layout) ci.layout = tdm_engine_describe(e);
  if (!ci.optimizer) ci.optimizer = tdm_optim_kind_name(tdm_optim_get_config(h.o)->kind);
  char ls[2][32];
  const char **kv = NULL;
  if (is_fp16(e)) { /* the caller's pairs, then the scaler's */
    kv = tdm__malloc(sizeof(char *) * (size_t)(2 * ci.n_meta + 4));
    if (!kv) return tdm__ckpt_agree(comm, tdm__set_error(TDM_ERR_NO_MEMORY, "checkpoint: out of memory"), "checkpoint");
    if (ci.n_meta) memcpy(kv, ci.meta_kv, sizeof(char *) * 2 * (size_t)ci.n_meta);
    double scale;
    int64_t good;
    tdm_engine_loss_scale(e, &scale, &good);
    snprintf(ls[0], sizeof ls[0], "%.17g", scale);
    snprintf(ls[1], sizeof ls[1], "%lld", (long long)good);
    kv[2 * ci.n_meta] = LS_SCALE, kv[2 * ci.n_meta + 1] = ls[0], kv[2 * ci.n_meta + 2] = LS_GOOD, kv[2 * ci.n_meta + 3] = ls[1];
    ci.meta_kv = kv, ci.n_meta += 2;
  }
  tdm_ckpt_writer *w;
  tdm_status cs = tdm_ckpt_writer_create(&w, dir, &ci, tdm_optim_steps(h.o), comm);
  if (!w) {
    tdm__free(kv);
    return tdm__ckpt_agree(comm, cs, "checkpoint"); /* out of memory: still answer the others */
  }
  for (int i = 0; st == TDM_OK && i < tdm_params_count(h.p); i++) {
    tdm_tensor *t = tdm_params_get(h.p, i);
    char name[300];
    snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
    st = tdm_ckpt_writer_tensor(w, name, TDM_F32, tdm_tensor_ndim(t), tdm_tensor_shape(t));
    for (int s = 0; st == TDM_OK && s < h.k; s++) {
      snprintf(name, sizeof name, "optim.%s.%s", h.names[s], tdm_tensor_name(t));
      st = tdm_ckpt_writer_tensor(w, name, TDM_F32, tdm_tensor_ndim(t), tdm_tensor_shape(t));
    }
  }
  const tdm_engine_piece *pc;
  int n_pc = tdm_engine_pieces(e, &pc);
  if (n_pc > 0) { /* boxes of the whole parameters (tensor parallelism's slices), each written by one rank */
    for (int k = 0; st == TDM_OK && k < n_pc; k++)
      if (pc[k].write) st = put_box(w, &h, &pc[k]);
  } else {
    /* what this rank updates, shared with the ranks that hold the same (data parallelism: every
     * rank; a pipeline: its stage's data replicas): each writes an even part of it, once */
    int at = 0, n = tdm_engine_replicas(e, &at);
    int64_t owned = 0;
    for (int s = 0; s < h.n_spans; s++) owned += h.spans[s].hi - h.spans[s].lo;
    int64_t from = owned * at / n, to = owned * (at + 1) / n, pos = 0; /* in the spans' packed order */
    for (int s = 0; st == TDM_OK && s < h.n_spans; pos += h.spans[s].hi - h.spans[s].lo, s++) {
      int64_t a = from > pos ? from : pos, b = to < pos + h.spans[s].hi - h.spans[s].lo ? to : pos + h.spans[s].hi - h.spans[s].lo;
      if (a < b) st = each_overlap(&h, h.spans[s].lo + a - pos, h.spans[s].lo + b - pos, put_overlap, w);
    }
  }
  if (st == TDM_OK) st = put_compress(w, e);
  if (st != TDM_OK) tdm__ckpt_writer_fail(w, st);
  st = tdm_ckpt_writer_commit(w, keep);
  tdm__free(kv); /* the writer read the pairs until its commit */
  return st;
}

/* ---- loading ---------------------------------------------------------------------------------- */
/* Reads what this rank holds straight into the engine's buffers: no second copy of the state (at
 * data parallelism that would be three times the model), so a checkpoint that proves corrupt half
 * way leaves them part loaded, and the next one tried is read over all of it. */
static tdm_status get_overlap(void *ctx, const held *h, tdm_tensor *t, int64_t off, int64_t a, int64_t b) {
  tdm_ckpt *ck = ctx;
  char name[300];
  snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
  if (!h->whole) TDM__TRY(tdm_ckpt_read_flat(ck, name, a - off, b - off, h->shard + pos_of(h, a)));
  for (int s = 0; s < h->k; s++) {
    snprintf(name, sizeof name, "optim.%s.%s", h->names[s], tdm_tensor_name(t));
    TDM__TRY(tdm_ckpt_read_flat(ck, name, a - off, b - off, h->state + s * h->owned + pos_of(h, a)));
  }
  return TDM_OK;
}

static tdm_status load(tdm_engine *e, const held *h, tdm_ckpt *ck) {
  const tdm_engine_piece *pc;
  int n_pc = tdm_engine_pieces(e, &pc);
  for (int k = 0; k < n_pc; k++) { /* every box this rank holds, whoever writes it */
    const char *pname = tdm_tensor_name(tdm_params_get(h->p, pc[k].param));
    char name[300];
    snprintf(name, sizeof name, "model.%s", pname);
    TDM__TRY(tdm_ckpt_read_box(ck, name, pc[k].start, pc[k].count, pc[k].data));
    for (int s = 0; s < h->k; s++) {
      snprintf(name, sizeof name, "optim.%s.%s", h->names[s], pname);
      TDM__TRY(tdm_ckpt_read_box(ck, name, pc[k].start, pc[k].count, h->state + s * h->owned + pc[k].state_at));
    }
  }
  if (n_pc > 0) return TDM_OK;
  if (h->whole)
    for (int i = 0; i < tdm_params_count(h->p); i++) {
      tdm_tensor *t = tdm_params_get(h->p, i);
      char name[300];
      snprintf(name, sizeof name, "model.%s", tdm_tensor_name(t));
      TDM__TRY(tdm_ckpt_read_flat(ck, name, 0, tdm_tensor_numel(t), tdm_params_data(h->p) + tdm_params_offset(h->p, i)));
    }
  for (int s = 0; s < h->n_spans; s++) TDM__TRY(each_overlap(h, h->spans[s].lo, h->spans[s].hi, get_overlap, ck));
  return TDM_OK;
}

/* ---- resuming: every rank the same checkpoint, or none ------------------------------------------ */
typedef struct {
  int32_t failed, found;
  int64_t step;
  uint32_t crc;
  int32_t entries;
  char text[496]; /* why this rank failed, or its directory */
} found_rec;

static void describe(const found_rec *r, int rank, char *b, size_t n) {
  if (r->found) snprintf(b, n, "rank %d found step %lld (crc %08x) in %s", rank, (long long)r->step, r->crc, r->text);
  else snprintf(b, n, "rank %d found no checkpoint in %s", rank, r->text);
}

/* Every rank learns what every rank found: an error if any failed or they differ. *entries gets
 * the most entries named like checkpoints any rank has. */
static tdm_status agree_found(tdm_comm_t comm, tdm_status st, const tdm_ckpt *ck, const char *dir, int n_entries, int *entries) {
  found_rec mine = {st != TDM_OK, ck != NULL, ck ? ck->info.step : 0, ck ? ck->crc : 0, n_entries, ""};
  snprintf(mine.text, sizeof mine.text, "%.495s", st != TDM_OK ? tdm_last_error() : dir);
  *entries = n_entries;
  if (!comm) return st;
  int W = tdm_comm_size(comm), R = tdm_comm_rank(comm);
  char own[600];
  snprintf(own, sizeof own, "%s", tdm_last_error());
  found_rec *all = tdm__calloc((size_t)W, sizeof *all);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "resume: out of memory");
  tdm_status cs = tdm_comm_allgather(comm, &mine, all, sizeof mine, TDM_U8, TDM_ALGO_AUTO);
  tdm_status res = cs;
  for (int r = 0; res == TDM_OK && r < W; r++) {
    if (all[r].entries > *entries) *entries = all[r].entries;
    if (all[r].failed) /* this rank's own failure keeps its own status and message */
      res = r == R ? tdm__set_error(st, "%s", own) : tdm__error_from(r, tdm__set_error(TDM_ERR_REMOTE, "rank %d could not open its checkpoint: %.496s", r, all[r].text));
  }
  int same = 1;
  for (int r = 1; res == TDM_OK && r < W; r++)
    same &= all[r].found == all[0].found && (!all[r].found || (all[r].step == all[0].step && all[r].crc == all[0].crc));
  if (res == TDM_OK && !same) {
    char msg[1024] = "", one[600];
    for (int r = 0; r < W && strlen(msg) < 700; r++) {
      describe(&all[r], r, one, sizeof one);
      size_t used = strlen(msg);
      snprintf(msg + used, sizeof msg - used, "%s%s", r ? "; " : "", one);
    }
    res = tdm__set_error(TDM_ERR_MISMATCH,
                         "the ranks found different checkpoints to resume from: %s%s. Every rank must see the same "
                         "checkpoints (a shared directory, or the same files in each)",
                         msg, strlen(msg) >= 700 ? "; ..." : "");
  }
  tdm__free(all);
  return res;
}

static void note(char *notes, size_t n, const char *msg) {
  if (!notes || !n) return;
  size_t used = strlen(notes);
  snprintf(notes + used, n - used, "%s%s", used ? "; " : "", msg);
}

tdm_status tdm_ckpt_resume_engine(const char *dir, tdm_engine *e, tdm_ckpt_accept_fn accept, void *ctx,
                                  tdm_ckpt_resumed *out, char *notes, size_t notes_n) {
  if (!dir || !e || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "resume: NULL argument");
  memset(out, 0, sizeof *out);
  if (notes && notes_n) notes[0] = 0;
  tdm_comm_t comm = tdm_grid_world(tdm_engine_grid(e));
  held h;
  tdm_status hs = held_of(e, &h);
  int64_t below = INT64_MAX;
  for (;;) {
    tdm_ckpt *ck = NULL;
    int n_entries = 0, entries = 0;
    tdm_status st = hs != TDM_OK ? hs : tdm__ckpt_open_below(&ck, dir, below, notes, notes_n, &n_entries);
    st = agree_found(comm, st, ck, dir, n_entries, &entries);
    if (st == TDM_OK && !ck) {
      if (entries == 0) return TDM_OK; /* nothing to resume from */
      return tdm__set_error(TDM_ERR_FORMAT,
                            "no valid checkpoint in %s (%d entr%s named like one%s%s). Nothing was changed: repair or move "
                            "these entries away to start afresh",
                            dir, entries, entries == 1 ? "y" : "ies", notes && notes[0] ? ": " : "", notes && notes[0] ? notes : "");
    }
    if (st != TDM_OK) {
      tdm_ckpt_close(ck);
      return st;
    }
    /* the same checkpoint everywhere: the same answers everywhere, but agreed all the same */
    st = accept ? accept(ctx, ck) : TDM_OK;
    if (st == TDM_OK) st = tdm__ckpt_check_model(ck, h.p);
    if (st == TDM_OK) st = tdm__ckpt_check_optim(ck, h.o, h.p);
    st = tdm__ckpt_agree(comm, st, "resume");
    int corrupt = 0; /* the checkpoint's files, not this run, are at fault: try the one before */
    if (st == TDM_OK) {
      tdm_status ls = load(e, &h, ck);
      if (ls == TDM_OK) ls = get_compress(ck, e);
      corrupt = (st = tdm__ckpt_agree(comm, ls, "resume")) == TDM_ERR_FORMAT;
    }
    if (st == TDM_OK) {
      if (tdm_engine_is_sharded(e)) st = tdm_engine_shard_loaded(e, ck->optim_steps);
      else tdm_optim_set_steps(h.o, ck->optim_steps);
      if (st == TDM_OK) st = restore_loss_scale(e, ck);
      st = tdm__ckpt_agree(comm, st, "resume");
      out->found = 1;
      out->step = ck->info.step, out->optim_steps = ck->optim_steps;
      out->data_epoch = ck->info.data_epoch, out->data_offset = ck->info.data_offset;
      out->world_size = ck->info.world_size, out->crc = ck->crc;
      snprintf(out->layout, sizeof out->layout, "%s", ck->info.layout ? ck->info.layout : "");
      snprintf(out->path, sizeof out->path, "%s", ck->path);
      out->bytes_read = ck->bytes_read;
    }
    if (!corrupt) {
      tdm_ckpt_close(ck);
      return st;
    }
    /* its files proved corrupt on some rank: every rank skips it and tries the one before */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tdm_last_error());
    note(notes, notes_n, msg);
    below = ck->info.step;
    tdm_ckpt_close(ck);
  }
}
