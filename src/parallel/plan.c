/* The memory planner (include/tandem/plan.h). Parameters, gradients and optimizer state follow
 * from the layout the engines use; activations from walking the model's ops with the tape's rules
 * of allocation (src/parallel/plan_tape.c). */
#include "tandem/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tape_impl.h"
#include "core/internal.h"
#include "comm/comm_impl.h"
#include "comm/net.h"
#include "parallel/common.h"
#include "parallel/layout.h"
#include "parallel/plan_tape.h"
#include "tandem/kernels.h"

tdm_plan_config tdm_plan_config_default(void) {
  tdm_plan_config c;
  memset(&c, 0, sizeof c);
  c.model = tdm_model_config_mlp();
  c.optim = tdm_optim_config_default(TDM_OPT_ADAM);
  c.engine = tdm_engine_config_default();
  c.world = 1;
  c.batch = 64;
  c.transport = TDM_TRANSPORT_AUTO;
  return c;
}

/* The tape's arrays of nodes and leaves double from 64 entries; at the last growth both the old
 * and the new array exist. */
static int64_t grown_array(int64_t n, int64_t elem) {
  int64_t cap = 64;
  while (cap < n) cap *= 2;
  return (cap > 64 ? cap + cap / 2 : cap) * elem;
}

/* ---- stage 3: what is gathered and held as the engine runs ---------------------------------------
 * Forward touches the units in parameter order (the GPT's tied embedding once more at the end, for
 * the logits), backward in the reverse order. Parameters: the engine keeps the most recently used
 * units, at most two, making room before it gathers (src/parallel/zero.c, fetch), plus the next
 * unit arriving when it prefetches. Gradients: a unit's are written from backward's first touch of
 * it until its last (where they are reduce-scattered and given back); when the reduction runs on
 * the communication thread, the next unit's may be written before it ends. */
typedef struct {
  int64_t params, grads; /* elements at the peak */
} units_peak;

static units_peak stage3_peaks(const tdm__layout *L, int tied, int prefetch) {
  int ng = L->ng, n = 2 * (ng + tied);
  int *seq = tdm__malloc(sizeof(int) * (size_t)(n ? n : 1));
  uint64_t *last = tdm__calloc((size_t)(ng ? ng : 1), sizeof(uint64_t));
  unsigned char *res = tdm__calloc((size_t)(ng ? ng : 1), 1), *fly = tdm__calloc((size_t)(ng ? ng : 1), 1);
  units_peak out = {0, 0};
  if (!seq || !last || !res || !fly) goto done;
  int k = 0;
  for (int g = ng - 1; g >= 0; g--) seq[k++] = g; /* forward: parameter order is group order reversed */
  if (tied) seq[k++] = ng - 1;
  for (int i = k - 1; i >= 0; i--) seq[k + (k - 1 - i)] = seq[i]; /* backward */
  int64_t held = 0, gmax = 0;
  for (int g = 0; g < ng; g++) gmax = L->g[g].hi - L->g[g].lo > gmax ? L->g[g].hi - L->g[g].lo : gmax;
#define G(x) (L->g[x].hi - L->g[x].lo)
  uint64_t clock = 0;
  for (int i = 0; i < n; i++) {
    int u = seq[i], bwd = i >= n / 2;
    last[u] = ++clock;
    if (!res[u]) {
      for (;;) { /* room first: at most one other resident */
        int others = 0, lru = -1;
        for (int g = 0; g < ng; g++)
          if (g != u && res[g]) others++, lru = lru < 0 || last[g] < last[lru] ? g : lru;
        if (others <= 1) break;
        res[lru] = 0;
      }
      res[u] = 1, fly[u] = 0;
      int next = bwd ? u + 1 : u - 1;
      if (prefetch && next >= 0 && next < ng && !res[next]) fly[next] = 1;
    }
    int64_t sum = 0;
    for (int g = 0; g < ng; g++) sum += (res[g] || fly[g]) ? G(g) : 0;
    if (sum > out.params) out.params = sum;
    if (i == n / 2 - 1) memset(fly, 0, (size_t)ng);
    if (!bwd) continue;
    /* gradients: held from the unit's first touch in backward to its last */
    int first = 1, again = 0;
    for (int j = n / 2; j < i; j++) first &= seq[j] != u;
    for (int j = i + 1; j < n; j++) again |= seq[j] == u;
    if (first) held += G(u);
    if (held + (prefetch ? gmax : 0) > out.grads) out.grads = held + (prefetch ? gmax : 0);
    if (!again) held -= G(u);
  }
#undef G
done:
  tdm__free(seq), tdm__free(last), tdm__free(res), tdm__free(fly);
  return out;
}

/* ---- the plan ---------------------------------------------------------------------------------- */
tdm_status tdm_plan_compute(const tdm_plan_config *c, tdm_plan *out) {
  if (!c || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "plan: NULL argument");
  memset(out, 0, sizeof *out);
  int P = c->world > 0 ? c->world : 1;
  int stage = c->engine.kind == TDM_ENGINE_ZERO ? c->engine.zero.stage : 0;
  if (stage < 0 || stage > 3) return tdm__set_error(TDM_ERR_INVALID_ARG, "plan: ZeRO stage %d; expected 0..3", stage);
  if (c->batch < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "plan: batch %lld; expected >= 1", (long long)c->batch);
  /* the model's parameters, in address space only: names, shapes and offsets without memory; what
   * their bookkeeping holds (names, views, the gradient-norm segments) is measured as it is made */
  tdm_mem_stats before, after;
  tdm_mem_stats_get(&before);
  tdm_model *m;
  TDM__TRY(tdm_model_create_with(&m, &c->model, 0, TDM_RESERVE_DATA | TDM_RESERVE_GRAD));
  tdm_params *params = tdm_model_params(m);
  const int64_t *cuts;
  int64_t n_seg = 0;
  if (tdm_params_segments(params, &cuts, &n_seg) != TDM_OK) {
    tdm_model_destroy(m);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "plan: out of memory");
  }
  tdm_mem_stats_get(&after);
  int64_t metadata = after.current[TDM_MEM_WORKSPACE] - before.current[TDM_MEM_WORKSPACE];
  int n_param_tensors = tdm_params_count(params);
  int64_t n = tdm_params_numel(params), owned = n;
  tdm__layout L = {0};
  int inline_comm = 0;
  tdm_status st = tdm__inline_comm(P, &inline_comm);
  int64_t accum = c->engine.accum > 1 ? c->engine.accum : 1, G2 = 0; /* stage 2: the most written at once */
  units_peak u3 = {0, 0};
  int64_t part = 0, wire = 0; /* the largest part a rank reduces; compressed buckets' bytes */
  if (st == TDM_OK && stage == 0 && P > 1) { /* data parallelism's buckets, split in blocks */
    st = tdm__layout_make(&L, params, 0, c->engine.dp.bucket_bytes, c->engine.dp.first_bucket_bytes, 1, 1);
    for (int k = 0; st == TDM_OK && k < L.ng; k++) {
      int64_t gk = L.g[k].hi - L.g[k].lo, blk = (gk + P - 1) / P;
      if (blk > part) part = blk;
      if (c->engine.dp.wire_dtype != TDM_F32 && c->engine.dp.wire_dtype) wire += gk * 2 + 64;
    }
    out->n_groups = L.ng;
    tdm__layout_free(&L);
  }
  if (st == TDM_OK && stage > 0) {
    st = tdm__layout_make(&L, params, stage == 3, c->engine.zero.bucket_bytes, 0, c->engine.zero.unit_modules, P);
    owned = 0;
    for (int r = 0; st == TDM_OK && r < P; r++) {
      int64_t o = tdm__layout_owned(&L, r);
      if (o > owned) owned = o;
    }
    for (int k = 0; st == TDM_OK && k < L.ng; k++)
      for (int r = 0; r < P; r++) part = L.g[k].cut[r + 1] - L.g[k].cut[r] > part ? L.g[k].cut[r + 1] - L.g[k].cut[r] : part;
    for (int k = 0; st == TDM_OK && k < L.ng; k++) {
      int64_t gk = L.g[k].hi - L.g[k].lo, pair = gk + (k + 1 < L.ng && !inline_comm ? L.g[k + 1].hi - L.g[k + 1].lo : 0);
      if (gk > out->max_group) out->max_group = gk;
      if (pair > G2) G2 = pair; /* being written, and (on the communication thread) the one before, reducing */
    }
    out->n_groups = L.ng;
    if (st == TDM_OK && stage == 3)
      u3 = stage3_peaks(&L, c->model.kind == TDM_MODEL_GPT || (c->model.kind == TDM_MODEL_LLAMA && c->model.tie_embeddings),
                        c->engine.zero.prefetch && !inline_comm);
  }
  tdm__layout_free(&L);
  tdm_model_destroy(m);
  TDM__TRY(st);
  out->n_params = n;
  out->owned = owned;
  out->stage = stage;
  out->world = P;
  int64_t *b = out->bytes;
  /* parameters: whole below stage 3; then the shard and the units gathered at once */
  b[TDM_MEM_PARAMS] = 4 * (stage < 3 ? n : owned + u3.params);
  /* gradients: whole at stages 0-1; at 2-3 the shard and what backward has written and not yet
   * reduced, or everything while micro-batches accumulate */
  b[TDM_MEM_GRADS] = 4 * (stage < 2 ? n : owned + (accum > 1 ? n : stage == 2 ? G2 : u3.grads));
  int adam = c->optim.kind != TDM_OPT_SGD;
  b[TDM_MEM_OPTIM] = 4 * owned * (adam ? 2 : c->optim.momentum > 0 ? 1 : 0);
  int lm = c->model.kind == TDM_MODEL_GPT || c->model.kind == TDM_MODEL_LLAMA;
  int64_t T = lm ? (c->seq_len > 0 ? c->seq_len : c->model.block_size) : 1;
  tdm__tape_plan tr = {0, 0, 0}, ev = {0, 0, 0};
  TDM__TRY(tdm__plan_tape(&c->model, c->batch, T, accum, 1, c->engine.recompute, c->engine.precision, &tr));
  if (c->eval_batch > 0) TDM__TRY(tdm__plan_tape(&c->model, c->eval_batch, T, 1, 0, c->engine.recompute, c->engine.precision, &ev));
  int64_t nodes = tr.nodes;
  out->act_train = tr.bytes;
  out->act_eval = ev.bytes;
  b[TDM_MEM_ACTIVATIONS] = out->act_train > out->act_eval ? out->act_train : out->act_eval;
  b[TDM_MEM_DATA] = c->data_bytes;
  /* communication: on shared memory a P-th of the segment every rank maps; elsewhere the direct
   * algorithms' scratch, P chunks of at most 1 MiB as large as the largest part */
  if (P > 1 && c->transport == TDM_TRANSPORT_SHM) b[TDM_MEM_COMM] = (int64_t)(tdm__shm_segment_bytes(P) / (size_t)P) + wire;
  else if (P > 1) b[TDM_MEM_COMM] = (int64_t)P * 4 * (part < (1 << 18) ? part : (1 << 18)) + 64 + wire;
  /* rank 0 hosts the rendezvous store for the whole run: its gate for strangers and a small
   * buffer per connected rank (src/comm/store/store.c) */
  if (P > 1) b[TDM_MEM_COMM] += (int64_t)tdm__net_gate_bytes() + 4096 * (int64_t)P;
  /* workspace: the parameters' bookkeeping as measured, the engine's segment sums, the tape's
   * arrays; the engine's own few structures are left out (a few KB) */
  b[TDM_MEM_WORKSPACE] = metadata + 8 * (n_seg + 1) + grown_array(nodes, 8) + grown_array(n_param_tensors + tr.leaves, 16);
  /* traffic: stages 0-2 reduce-scatter and all-gather Ψ (2Ψ(N-1)/N), stage 3 gathers twice */
  out->comm_per_step = 4.0 * (double)n * (double)(P - 1) / P * (stage == 3 ? 3 : 2);
  for (int k = 0; k < TDM_MEM_COUNT; k++) out->total += b[k];
  return TDM_OK;
}

static void human(char *buf, size_t n, double bytes) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (fabs(bytes) >= 1024 && k < 4) bytes /= 1024, k++;
  snprintf(buf, n, k ? "%.2f %s" : "%.0f %s", bytes, u[k]);
}

void tdm_plan_print(FILE *f, const tdm_plan *p, int64_t limit) {
  static const char *what[TDM_MEM_COUNT] = {
      "parameters (fp32)", "gradients", "optimizer state", "activations (tape, peak of a step or an evaluation)",
      "communication buffers", "data sets and batches", "workspace"};
  char h[32];
  fprintf(f, "memory plan per rank: %s, %d rank%s, %lld parameters", p->stage ? "ZeRO" : "data parallel", p->world,
          p->world == 1 ? "" : "s", (long long)p->n_params);
  if (p->stage) fprintf(f, ", stage %d (%d %s, this rank updates at most %lld)", p->stage, p->n_groups,
                        p->stage == 3 ? "units" : "buckets", (long long)p->owned);
  fprintf(f, "\n");
  for (int k = 0; k < TDM_MEM_COUNT; k++) {
    human(h, sizeof h, (double)p->bytes[k]);
    fprintf(f, "  %-14s %12s  %s\n", tdm_mem_category_name((tdm_mem_category)k), h, what[k]);
  }
  human(h, sizeof h, (double)p->total);
  fprintf(f, "  %-14s %12s\n", "total", h);
  if (limit > 0) {
    char l[32];
    human(l, sizeof l, (double)limit);
    fprintf(f, "  %s the memory limit of %s\n", p->total <= limit ? "fits" : "EXCEEDS", l);
  }
}

tdm_status tdm_plan_check(const tdm_plan *p, int64_t limit) {
  if (limit <= 0 || p->total <= limit) return TDM_OK;
  int big = 0;
  for (int k = 1; k < TDM_MEM_COUNT; k++)
    if (p->bytes[k] > p->bytes[big]) big = k;
  char t[32], l[32], o[32], g[32];
  human(t, sizeof t, (double)p->total);
  human(l, sizeof l, (double)limit);
  human(o, sizeof o, (double)(p->total - limit));
  human(g, sizeof g, (double)p->bytes[big]);
  /* what would make the largest part smaller: only the model's state is sharded by ZeRO */
  const char *hint = "";
  switch ((tdm_mem_category)big) {
  case TDM_MEM_PARAMS: hint = p->stage < 3 ? ": --zero 3 shards it over the ranks" : ": more ranks shard it further"; break;
  case TDM_MEM_GRADS:
    hint = p->stage < 2 ? ": --zero 2 shards it over the ranks" : ": smaller buckets (--bucket-mb) or more ranks shrink it";
    break;
  case TDM_MEM_OPTIM: hint = p->stage < 1 ? ": --zero 1 shards it over the ranks" : ": more ranks shard it further"; break;
  case TDM_MEM_ACTIVATIONS: hint = ": a smaller --batch-size (with --accum to keep the global batch) shrinks it"; break;
  case TDM_MEM_COMM: hint = ": smaller buckets (--bucket-mb) shrink it"; break;
  case TDM_MEM_DATA: hint = ": every rank loads the whole data set; a smaller data set shrinks it"; break;
  default: break;
  }
  return tdm__set_error(TDM_ERR_INVALID_ARG,
                        "the plan needs %s per rank, %s more than --memory-limit %s; the largest part is %s (%s)%s", t, o,
                        l, tdm_mem_category_name((tdm_mem_category)big), g, hint);
}
