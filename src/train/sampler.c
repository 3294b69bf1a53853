/* The distributed sampler; see include/tandem/sampler.h. The prefetch thread works one micro-
 * batch ahead in a second buffer; positions are plain counters, so seeking is exact. A step's place
 * in the sample stream is found from the position the sampler was set to (the anchor): its epoch
 * continues from that sample, later epochs start at 0. */
#include "tandem/sampler.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "tandem/trace.h"

typedef struct {
  float *x;
  int32_t *y;
  int64_t n, first, epoch, pos; /* pos: micro-batch counter this slot holds */
  tdm_status st;
  char err[512];
} slot;

struct tdm_sampler {
  const tdm_dataset *ds;
  tdm_trace *trace; /* the prefetch thread records into the creator's recorder */
  tdm_sampler_config cfg;
  int64_t N, G, steps_per_epoch;
  int64_t *order, order_epoch;
  int64_t *idx;
  int64_t a_step, a_epoch, a_off, a_rem; /* the anchor: step a_step starts at sample a_off of epoch
                                            a_epoch, which has a_rem steps from there */
  int64_t pos;   /* next micro-batch to hand out, counted from the very start */
  slot slots[2];
  int ready[2];  /* slot holds the batch for slots[i].pos */
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int tokens; /* token windows: x holds int32 tokens, y one target per token */
  int stop, started, busy;
  int64_t want; /* the micro-batch the thread prepares next */
};

static void shuffle(tdm_sampler *s, int64_t epoch) {
  if (s->order_epoch == epoch) return;
  tdm_rng r;
  tdm_rng_seed(&r, tdm_hash64(s->cfg.seed ^ 0x5348554646ull, (uint64_t)epoch));
  for (int64_t i = 0; i < s->N; i++) s->order[i] = i;
  for (int64_t i = s->N - 1; i > 0; i--) {
    int64_t j = (int64_t)(tdm_rng_next(&r) % (uint64_t)(i + 1)), t = s->order[i];
    s->order[i] = s->order[j];
    s->order[j] = t;
  }
  s->order_epoch = epoch;
}

/* Steps an epoch has left from sample `off` on: the last, incomplete global batch is kept
 * (partial: smaller; pad: filled from the start of the order) or dropped. */
static int64_t steps_left(const tdm_sampler *s, int64_t off) {
  int64_t left = s->N - off;
  if (left <= 0) return 0;
  return s->cfg.last == TDM_LAST_DROP ? left / s->G : (left + s->G - 1) / s->G; /* partial: G is the batch */
}

/* The epoch of step (>= the anchor's) and the sample of its order where the step's global batch starts. */
static void locate(const tdm_sampler *s, int64_t step, int64_t *epoch, int64_t *first) {
  int64_t k = step - s->a_step;
  if (k < s->a_rem) {
    *epoch = s->a_epoch, *first = s->a_off + k * s->G;
    return;
  }
  k -= s->a_rem;
  *epoch = s->a_epoch + 1 + k / s->steps_per_epoch;
  *first = (k % s->steps_per_epoch) * s->G;
}

/* Fills sl with micro-batch number pos (over the whole run). Not thread-safe by itself. */
static void assemble(tdm_sampler *s, slot *sl, int64_t pos) {
  int64_t K = s->cfg.accum, B = s->cfg.batch, W = s->cfg.world;
  int64_t step = pos / K, m = pos % K, epoch, base;
  locate(s, step, &epoch, &base);
  shuffle(s, epoch);
  int64_t first = s->cfg.last == TDM_LAST_PARTIAL ? base : base + m * B * W + (int64_t)s->cfg.rank * B;
  int64_t n = B;
  if (s->cfg.last == TDM_LAST_PARTIAL && s->N - first < B) n = s->N - first;
  for (int64_t i = 0; i < n; i++) s->idx[i] = s->order[(first + i) % s->N]; /* pad wraps around */
  sl->st = s->tokens ? tdm_dataset_tokens(s->ds, s->idx, n, (int32_t *)sl->x, sl->y)
                     : tdm_dataset_batch(s->ds, s->idx, n, sl->x, sl->y);
  if (sl->st != TDM_OK) snprintf(sl->err, sizeof sl->err, "%s", tdm_last_error());
  sl->n = n;
  sl->first = first;
  sl->epoch = epoch;
  sl->pos = pos;
}

/* The producer works at most one micro-batch ahead: batch q goes into slot q & 1, and the
 * consumer, holding batch pos - 1 in the other slot, has let go of slot q & 1 once q <= pos. */
static void *prefetch_main(void *arg) {
  tdm_sampler *s = arg;
  tdm_trace_attach(s->trace);
  tdm_trace_name_thread("prefetch");
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->stop && s->want > s->pos) pthread_cond_wait(&s->cv, &s->mu);
    if (s->stop) break;
    int64_t q = s->want;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    double t0 = tdm_trace_begin();
    assemble(s, &s->slots[q & 1], q);
    if (t0 > 0) {
      tdm_trace_args a = TDM_TRACE_ARGS_INIT;
      a.index = q; /* the batch */
      tdm_trace_span("data", "assemble batch", t0, tdm_trace_now(), &a);
    }
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    if (s->want == q) { /* otherwise a seek moved on meanwhile: this batch is stale */
      s->ready[q & 1] = 1;
      s->want = q + 1;
    }
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

tdm_status tdm_sampler_create(tdm_sampler **out, const tdm_dataset *ds, const tdm_sampler_config *cfg) {
  if (!out || !ds || !cfg)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_sampler_create: %s is NULL",
                          !out ? "out" : !ds ? "the data set" : "the config");
  if (cfg->batch < 1 || cfg->accum < 1 || cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: batch %lld, accum %lld, rank %d of %d; expected positive sizes",
                          cfg ? (long long)cfg->batch : 0, cfg ? (long long)cfg->accum : 0, cfg ? cfg->rank : 0,
                          cfg ? cfg->world : 0);
  int64_t G;
  if ((unsigned)cfg->last > TDM_LAST_DROP || __builtin_mul_overflow(cfg->batch, (int64_t)cfg->world, &G) ||
      __builtin_mul_overflow(G, cfg->accum, &G))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: last-batch rule %d, batch %lld x %d ranks x accum %lld; expected partial, pad or "
                          "drop and a global batch below 2^63", (int)cfg->last, (long long)cfg->batch, cfg->world, (long long)cfg->accum);
  if (cfg->last == TDM_LAST_PARTIAL && (cfg->world > 1 || cfg->accum > 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: a partial last batch needs one rank and no accumulation; use pad or drop");
  tdm_sampler *s = tdm__calloc(1, sizeof *s);
  if (!s) return tdm__set_error(TDM_ERR_NO_MEMORY, "sampler: out of memory");
  s->ds = ds;
  s->cfg = *cfg;
  s->N = tdm_dataset_len(ds);
  s->G = cfg->batch * cfg->world * cfg->accum;
  s->steps_per_epoch = cfg->last == TDM_LAST_PARTIAL ? (s->N + cfg->batch - 1) / cfg->batch
                       : cfg->last == TDM_LAST_PAD   ? (s->N + s->G - 1) / s->G
                                                     : s->N / s->G;
  if (s->steps_per_epoch < 1) {
    tdm__free(s);
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "sampler: %lld samples do not fill one global batch of %lld (%d ranks x accum %lld x batch %lld); "
                          "expected a smaller --batch-size, fewer ranks or less accumulation (or --last-batch pad)",
                          (long long)tdm_dataset_len(ds), (long long)(cfg->batch * cfg->world * cfg->accum), cfg->world,
                          (long long)cfg->accum, (long long)cfg->batch);
  }
  int64_t per = tdm_dataset_sample_numel(ds);
  s->tokens = tdm_dataset_is_tokens(ds);
  s->order = tdm__malloc(sizeof(int64_t) * (size_t)s->N);
  s->idx = tdm__malloc(sizeof(int64_t) * (size_t)cfg->batch);
  for (int k = 0; k < 2; k++) {
    s->slots[k].x = tdm__aligned_alloc(sizeof(float) * (size_t)(cfg->batch * per));
    s->slots[k].y = tdm__malloc(sizeof(int32_t) * (size_t)(cfg->batch * (s->tokens ? per : 1)));
  }
  s->order_epoch = -1;
  s->a_rem = s->steps_per_epoch;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (!s->order || !s->idx || !s->slots[0].x || !s->slots[1].x || !s->slots[0].y || !s->slots[1].y) {
    tdm_sampler_destroy(s);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "sampler: out of memory for two batches of %lld samples of %lld values (%.3g GB)",
                          (long long)cfg->batch, (long long)per, 2.0 * (double)cfg->batch * (double)per * 4 / 1e9);
  }
  if (cfg->prefetch) {
    s->trace = tdm_trace_current();
    if (pthread_create(&s->th, NULL, prefetch_main, s) != 0) {
      tdm_sampler_destroy(s);
      return tdm__set_error(TDM_ERR_SYSTEM, "sampler: cannot start the prefetch thread");
    }
    s->started = 1;
  }
  *out = s;
  return TDM_OK;
}

void tdm_sampler_destroy(tdm_sampler *s) {
  if (!s) return;
  if (s->started) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
  }
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  for (int k = 0; k < 2; k++) {
    tdm__free(s->slots[k].x);
    tdm__free(s->slots[k].y);
  }
  tdm__free(s->order);
  tdm__free(s->idx);
  tdm__free(s);
}

int64_t tdm_sampler_steps_per_epoch(const tdm_sampler *s) {
  TDM__NONNULL(s, 0, "tdm_sampler_steps_per_epoch: the sampler s is NULL");
  return s->steps_per_epoch;
}
int64_t tdm_sampler_epoch(const tdm_sampler *s) {
  TDM__NONNULL(s, -1, "tdm_sampler_epoch: the sampler s is NULL");
  int64_t e, f;
  locate(s, s->pos / s->cfg.accum, &e, &f);
  return e;
}

void tdm_sampler_locate(const tdm_sampler *s, int64_t step, int64_t *epoch, int64_t *offset) {
  if (!s || !epoch || !offset) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_sampler_locate: %s is NULL", !s ? "the sampler s" : !epoch ? "epoch" : "offset");
    return;
  }
  if (step < s->a_step) step = s->a_step;
  locate(s, step, epoch, offset);
}

int64_t tdm_sampler_epoch_start(const tdm_sampler *s, int64_t epoch) {
  TDM__NONNULL(s, -1, "tdm_sampler_epoch_start: the sampler s is NULL");
  if (epoch <= s->a_epoch) return s->a_step;
  return s->a_step + s->a_rem + (epoch - s->a_epoch - 1) * s->steps_per_epoch;
}

tdm_status tdm_sampler_set_position(tdm_sampler *s, int64_t step, int64_t epoch, int64_t offset) {
  if (!s) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_sampler_set_position: the sampler s is NULL");
  if (step < 0 || epoch < 0 || offset < 0 || offset > s->N)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: position step %lld at sample %lld of epoch %lld; expected a sample in 0..%lld",
                          (long long)step, (long long)offset, (long long)epoch, (long long)s->N);
  pthread_mutex_lock(&s->mu);
  while (s->busy) pthread_cond_wait(&s->cv, &s->mu); /* an assembly in progress finishes first */
  s->a_step = step, s->a_epoch = epoch, s->a_off = offset, s->a_rem = steps_left(s, offset);
  s->pos = s->want = step * s->cfg.accum;
  s->ready[0] = s->ready[1] = 0;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return TDM_OK;
}

tdm_status tdm_sampler_set_last(tdm_sampler *s, tdm_last_batch last) {
  if (!s) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_sampler_set_last: the sampler s is NULL");
  if (!s || (last != TDM_LAST_PARTIAL && last != TDM_LAST_PAD) || (s->cfg.last != TDM_LAST_PARTIAL && s->cfg.last != TDM_LAST_PAD) ||
      s->cfg.world != 1 || s->cfg.accum != 1)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: set_last %d on rule %d with %d ranks and accum %lld; expected partial <-> pad on "
                          "one rank without accumulation", (int)last, s ? (int)s->cfg.last : -1, s ? s->cfg.world : 0,
                          s ? (long long)s->cfg.accum : 0);
  pthread_mutex_lock(&s->mu);
  while (s->busy) pthread_cond_wait(&s->cv, &s->mu); /* a batch assembled under the old rule is dropped */
  s->cfg.last = last;
  s->ready[0] = s->ready[1] = 0;
  s->want = s->pos;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return TDM_OK;
}

tdm_status tdm_sampler_seek(tdm_sampler *s, int64_t step) {
  if (!s) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_sampler_seek: the sampler s is NULL");
  int64_t samples;
  if (__builtin_mul_overflow(step, s->G, &samples)) /* the samples before it must count */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: step %lld of global batches of %lld passes 2^63 samples", (long long)step,
                          (long long)s->G);
  if (step < s->a_step)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "sampler: step %lld is before step %lld, where the sampler's position was set",
                          (long long)step, (long long)s->a_step);
  pthread_mutex_lock(&s->mu);
  while (s->busy) pthread_cond_wait(&s->cv, &s->mu); /* an assembly in progress finishes first */
  s->pos = s->want = step * s->cfg.accum;
  s->ready[0] = s->ready[1] = 0;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return TDM_OK;
}

tdm_status tdm_sampler_next(tdm_sampler *s, const float **x, const int32_t **y, int64_t *n, int64_t *first) {
  if (!s || !x || !y || !n || !first)  /* checked before a batch is consumed */
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_sampler_next: %s is NULL",
                          !s ? "the sampler s" : !x ? "x" : !y ? "y" : !n ? "n" : "first");
  slot *sl = &s->slots[s->pos & 1];
  if (s->started) {
    pthread_mutex_lock(&s->mu);
    while (!(s->ready[s->pos & 1] && sl->pos == s->pos)) pthread_cond_wait(&s->cv, &s->mu);
    s->ready[s->pos & 1] = 0;
    s->pos++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
  } else {
    assemble(s, sl, s->pos);
    s->pos++;
  }
  if (sl->st != TDM_OK) return tdm__set_error(sl->st, "%s", sl->err);
  *x = sl->x;
  *y = sl->y;
  *n = sl->n;
  *first = sl->first;
  return TDM_OK;
}
