/* The pipeline engine: a transformer's blocks (GPT's or Llama's decoder layers) cut into chunks
 * over the grid's pipeline axis, each step a verified schedule (tandem/pipeline.h) run action by
 * action.
 *
 * Parameters keep the whole model's names, order and offsets: every rank declares them all in
 * reserved address space and touches only its chunks' spans (and, on the last rank, a copy of the
 * tied embedding), so weights and checkpoints stay those of one process. Each chunk micro-batch in
 * flight has its own tape (a slot), made at its first action and reset after its backward.
 *
 * Bit for bit what one process accumulating the same micro-batches computes:
 *   - dropout masks are keyed by sample and block (tdm_model_forward_range), not by the cut;
 *   - every chunk runs its backwards in micro-batch order (every generated schedule does; the
 *     test checks it), so each gradient adds up in one process's order;
 *   - the tied embedding (GPT's always, Llama's when tie_embeddings; an untied head is a
 *     parameter of the last chunk like any other): one process adds, for each micro-batch, the
 *     head's gradient (a GEMM accumulating into wte's gradient) and then the embedding's; the sum of a first-stage part
 *     and a last-stage part cannot give the same bits. So the last chunk does not differentiate
 *     the head's weight (it uses a detached view); it sends the logits' gradient and the head's
 *     input along with its input gradient, the chunks between pass them on with theirs, and chunk
 *     0 runs the head's weight GEMM into wte's gradient right before its own backward (or weight
 *     pass), as one process does. After the update the first rank sends wte to the last.
 *   - mixed precision (bf16, fp16): every tape autocasts as one process's does; an activation
 *     crosses stages in its 16 bits (the next chunk's input is the same 16-bit tensor one process
 *     has there, so its gradient rounds where one process's does), gradients and the tied head's
 *     message go widened to f32 (exact), and the last chunk seeds backward with the loss scale;
 *   - the gradient norm from segment sums (optim.h), each segment held by one rank, summed over
 *     the pipeline (exact), combined in segment order; the data axis averages gradients in rank
 *     order as data parallelism does.
 *
 * Exchanges (runs of consecutive sends and receives in the list) go to the world communicator's
 * progress thread, one at a time in order (so they never share the transport with another
 * thread), while the main thread computes; a compute action waits for the exchange that brings
 * its input. This is what the verifier simulates.
 *
 * The 3-D grid (a tensor axis of T > 1 beside the pipeline; GPT or Llama): each chunk's blocks
 * run split over the tensor axis (tp_model.c: tdm__tp_model_range); this rank computes with its own store
 * of slices (q->work) and the whole model stays in address space only, as the tensor-parallel
 * engine keeps it. The activations between stages are replicated over the tensor axis: tensor rank t of one
 * stage talks to tensor rank t of the next (the pipeline axis' communicator). The tied head's
 * message carries the logits' gradient of this rank's vocabulary rows, so chunk 0 on tensor rank t
 * adds the head's part of its own rows of wte's gradient. The tensor axis' collectives run on the
 * calling thread through the world's transport, which serves one call at a time: the exchanges
 * run there too, in list order (q->sync; a verified schedule cannot deadlock so either: an
 * exchange's messages depend only on the exchanges before it), without overlap. The norm's
 * segments sum the tensor ranks' pieces in rank order (as the tensor-parallel engine does), then
 * the pipeline's (one rank's term each); so a 3-D grid gives the tensor-parallel engine's weights
 * at the same tensor and data sizes bit for bit, and one process's within rounding. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "nn/model_impl.h"
#include "nn/params_impl.h"
#include "parallel/common.h"
#include "parallel/engine_impl.h"
#include "parallel/pipeline_impl.h"
#include "parallel/tp_model.h"
#include "tandem/kernels.h"
#include "tandem/plan.h"
#include "tandem/trace.h"

typedef struct {
  tdm_tape *tape;
  int chunk, mb;             /* -1: free */
  tdm_tensor *in, *out, *gout, *logits, *head_in;
  float *tied;               /* the tied head's (logits gradient, head input) received: chunks before the last */
  int bwd_done, grad_sent;   /* its backward (weight pass) has run; its input's gradient has gone */
} slot;

typedef struct {
  float *p;
  size_t n;
  int used;
} buffer;

typedef struct {
  int lo, hi;                /* its actions */
  tdm_p2p_op *ops;
  int n_ops;
  float **owned;             /* pool buffers it sends, given back when it ends */
  int n_owned;
  tdm_comm_t comm;
  tdm_work_t work;
  int state;                 /* 0 waiting to be issued, 1 issued, 2 ended and waited for */
} exch;

typedef struct {
  tdm_pp_schedule *s;
  int P, V, C, M, stage, D;
  int *first_block;          /* C + 1 */
  int tied;                  /* P > 1: the head's tied weight lives on another rank than the last chunk */
  tdm_comm_t pp, world;
  const tdm_pp_action *list; /* this rank's actions */
  int n_list;
  exch *ex;                  /* this rank's exchanges, in list order */
  int n_ex;
  int *ex_of;                /* per action: its exchange, or -1 */
  int *input_ex;             /* per compute action: the exchange bringing its input, or -1 */
  slot *slots;
  int n_slots;
  buffer *bufs;
  int n_bufs;
  tdm_tape *data;            /* the step's batches */
  tdm_tensor **x, **y;
  int64_t *base;
  int fetched;
  tdm_tape *eval;
  float *packed;             /* checkpoints: the spans' values */
  int64_t n_packed, wte_lo, wte_hi; /* wte: in the work store */
  int wte_i;
  int64_t n_held;            /* parameters held: the spans and the tied copy */
  int tied_stale;            /* the last rank's copy of the tied embedding awaits the first rank's */
  double *red;               /* the segment sums and the step's numbers, summed over the pipeline */
  double loss_sum, correct, rows;
  int64_t samples;
  double t_fwd, t_bwd, t_wait;
  /* the 3-D grid (T > 1); with T = 1: work is the model's store, tg NULL */
  tdm_params *work;          /* the store compute, gradients, spans and the optimizer use */
  tdm_tensor *wte;           /* its token embedding (this rank's vocabulary rows) */
  int64_t vt;                /* and their count */
  tdm__tp_model *tg;
  tdm_comm_t tcomm;
  int T, t, sync;
  tdm_optim_span *full;      /* this rank's chunks' spans of the store (e->spans: the optimizer's) */
  int n_full;
  int zero1;                 /* ZeRO stage 1 on the data axis: e->spans is this data rank's 1/D of full */
  tdm_recompute recompute;   /* the slots' tapes recompute their chunks' blocks in backward */
  tdm_dtype adt;             /* the activations' dtype: f32, or bf16 / f16 under mixed precision */
  size_t esz;                /* its size in bytes */
  int64_t *zcut;             /* zero1: data rank d updates [zcut[d], zcut[d+1]) of full, packed */
  int64_t *held_at;          /* per parameter: the optimizer-state index of its first local element, or -1 */
  tdm__tp_piece *np;         /* the norm's pieces in this rank's chunks */
  int64_t n_np;
  tdm_engine_piece *boxes;   /* checkpoints: this rank's slices as boxes */
  int64_t steps_done;        /* optimizer steps run (the drift check's cadence) */
  int n_boxes;
} pp_state;

/* ---- small helpers ---------------------------------------------------------------------------- */
static float *buf_get(pp_state *q, size_t n) {
  for (int i = 0; i < q->n_bufs; i++)
    if (!q->bufs[i].used && q->bufs[i].n == n) {
      q->bufs[i].used = 1;
      return q->bufs[i].p;
    }
  buffer *nb = tdm__malloc(sizeof *nb * (size_t)(q->n_bufs + 1));
  float *p = tdm__malloc_cat(sizeof(float) * (n ? n : 1), TDM_MEM_COMM);
  if (!nb || !p) {
    tdm__free(nb), tdm__free(p);
    return NULL;
  }
  if (q->bufs) memcpy(nb, q->bufs, sizeof *nb * (size_t)q->n_bufs);
  tdm__free(q->bufs);
  q->bufs = nb;
  q->bufs[q->n_bufs++] = (buffer){p, n, 1};
  return p;
}
static void buf_put(pp_state *q, float *p) {
  for (int i = 0; p && i < q->n_bufs; i++)
    if (q->bufs[i].p == p) q->bufs[i].used = 0;
}

static int chunk_rank(const pp_state *q, int c) { return c % q->P; }
/* Block l's first parameter: where its chunk's span starts. */
static tdm_tensor *block_first(const tdm_model *m, int l) {
  return m->cfg.kind == TDM_MODEL_LLAMA ? m->lblocks[l].attn_norm : m->blocks[l].ln_1.weight;
}
static int block_param(const tdm_engine *e, int l) { return tdm__params_index_of(e->params, block_first(e->model, l)); }
static int tag_of(const pp_state *q, int kind, int chunk, int mb) { /* the receiver's chunk */
  return (int)((((uint64_t)mb * 3 + (uint64_t)kind) * (uint64_t)q->C + (uint64_t)chunk) & 0x7fffffff);
}

static const char *act_str(const tdm_pp_action *a, char *b, size_t n) {
  if (a->op == TDM_PP_OPTIM) snprintf(b, n, "optimizer");
  else snprintf(b, n, "%s, chunk %d, micro-batch %d", tdm_pp_op_name(a->op), a->chunk, a->mb);
  return b;
}

static slot *slot_find(pp_state *q, int c, int m) {
  for (int i = 0; i < q->n_slots; i++)
    if (q->slots[i].chunk == c && q->slots[i].mb == m) return &q->slots[i];
  return NULL;
}

static tdm_status slot_get(pp_state *q, int c, int m, slot **out) {
  slot *s = slot_find(q, c, m);
  for (int i = 0; !s && i < q->n_slots; i++)
    if (q->slots[i].chunk < 0) s = &q->slots[i];
  if (!s) { /* a new tape: the schedule holds more chunk micro-batches than ever before */
    slot *ns = tdm__malloc(sizeof *ns * (size_t)(q->n_slots + 1));
    if (!ns) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
    if (q->slots) memcpy(ns, q->slots, sizeof *ns * (size_t)q->n_slots);
    tdm__free(q->slots);
    q->slots = ns;
    s = &q->slots[q->n_slots];
    memset(s, 0, sizeof *s);
    TDM__TRY(tdm_tape_create(&s->tape, 1u << 20));
    TDM__TRY(tdm_tape_set_recompute(s->tape, q->recompute)); /* a chunk's blocks as data parallelism's */
    TDM__TRY(tdm_tape_set_autocast(s->tape, q->adt));
    s->chunk = -1;
    q->n_slots++;
  }
  if (s->chunk < 0) {
    tdm_tape *t = s->tape;
    memset(s, 0, sizeof *s);
    s->tape = t;
    s->chunk = c, s->mb = m;
    tdm_tape_reset(t);
  }
  *out = s;
  return TDM_OK;
}

static void slot_release_if_done(pp_state *q, slot *s) {
  if (!s->bwd_done || !s->grad_sent) return;
  buf_put(q, s->tied);
  s->tied = NULL;
  s->chunk = s->mb = -1;
  tdm_tape_reset(s->tape);
}

/* The batches of micro-batches 0..m, fetched in order (every rank draws all of them, so the
 * samplers of all stages stay in step). */
static tdm_status need_batch(pp_state *q, tdm_batch_fn next, void *ctx, int m) {
  for (; q->fetched <= m; q->fetched++) {
    int k = q->fetched;
    TDM__TRY(next(ctx, q->data, k, &q->x[k], &q->y[k], &q->base[k]));
    if (!q->x[k] || !q->y[k]) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline: the batch source gave no tensors");
    if (tdm_tensor_ndim(q->x[k]) != 2)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline: micro-batch %d's input is %d-d; expected (batch, T) token ids", k,
                            tdm_tensor_ndim(q->x[k]));
  }
  return TDM_OK;
}

static int64_t act_numel(const pp_state *q, const tdm_model *m, int mb) {
  return tdm_tensor_numel(q->x[mb]) * m->cfg.n_embd;
}
static int64_t tied_numel(const pp_state *q, const tdm_model *m, int mb) {
  return tdm_tensor_numel(q->x[mb]) * (q->vt + m->cfg.n_embd);
}

/* n values of dtype dt (f32, bf16, f16) as f32 (exact) */
static void widen(float *dst, const void *src, tdm_dtype dt, int64_t n) {
  if (dt == TDM_BF16) tdm_k_bf16_to_f32(dst, src, n);
  else if (dt == TDM_F16) tdm_k_f16_to_f32(dst, src, n);
  else memcpy(dst, src, sizeof(float) * (size_t)n);
}

/* ---- exchanges -------------------------------------------------------------------------------------- */
static tdm_status run_exchange(void *ctx) {
  exch *x = ctx;
  return tdm_comm_p2p_batch(x->comm, x->ops, x->n_ops);
}

static tdm_status add_op(exch *x, int peer, int is_send, int tag, void *buf, size_t nbytes) {
  x->ops[x->n_ops++] = (tdm_p2p_op){peer, is_send, tag, buf, nbytes};
  return TDM_OK;
}

/* Prepares exchange k's messages (receive buffers on the slots' tapes, copies of what it sends)
 * and hands it to the progress thread. */
static tdm_status issue(tdm_engine *e, pp_state *q, int k, tdm_batch_fn next, void *ctx) {
  exch *x = &q->ex[k];
  x->n_ops = 0, x->n_owned = 0;
  tdm_model *mdl = e->model;
  int C = q->C;
  for (int i = x->lo; i < x->hi; i++) {
    const tdm_pp_action *a = &q->list[i];
    int c = a->chunk, m = a->mb;
    TDM__TRY(need_batch(q, next, ctx, m));
    size_t an = (size_t)act_numel(q, mdl, m), tn = (size_t)tied_numel(q, mdl, m);
    slot *s;
    TDM__TRY(slot_get(q, c, m, &s));
    int64_t shape[3] = {tdm_tensor_dim(q->x[m], 0), tdm_tensor_dim(q->x[m], 1), mdl->cfg.n_embd};
    switch (a->op) {
    case TDM_PP_RECV_ACT:
      s->in = tdm_new(s->tape, q->adt, 3, shape);
      if (!s->in) return tdm__set_error(tdm_tape_status(s->tape), "%s", tdm_tape_error(s->tape));
      tdm_tensor_set_requires_grad(s->in, 1);
      add_op(x, chunk_rank(q, c - 1), 0, tag_of(q, 0, c, m), tdm_tensor_data(s->in), an * q->esz);
      break;
    case TDM_PP_SEND_ACT: /* the slot's output lives until its backward, after this exchange has ended */
      if (tdm_tensor_dtype(s->out) != q->adt)
        return tdm__set_error(TDM_ERR_INTERNAL, "pipeline: chunk %d's output is %s; the stages pass %s", c,
                              tdm_dtype_name(tdm_tensor_dtype(s->out)), tdm_dtype_name(q->adt));
      add_op(x, chunk_rank(q, c + 1), 1, tag_of(q, 0, c + 1, m), tdm_tensor_data(s->out), an * q->esz);
      break;
    case TDM_PP_RECV_GRAD:
      s->gout = tdm_new(s->tape, TDM_F32, 3, shape);
      if (!s->gout) return tdm__set_error(tdm_tape_status(s->tape), "%s", tdm_tape_error(s->tape));
      add_op(x, chunk_rank(q, c + 1), 0, tag_of(q, 1, c, m), tdm_tensor_data(s->gout), an * 4);
      if (q->tied) {
        if (!(s->tied = buf_get(q, tn))) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
        add_op(x, chunk_rank(q, c + 1), 0, tag_of(q, 2, c, m), s->tied, tn * 4);
      }
      break;
    case TDM_PP_SEND_GRAD: { /* copies: the slot goes before the exchange may end */
      float *g = buf_get(q, an);
      tdm_tensor *gin = s->in ? tdm_tensor_grad(s->in) : NULL;
      if (!g) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
      if (gin) widen(g, tdm_tensor_data(gin), tdm_tensor_dtype(gin), (int64_t)an);
      else memset(g, 0, an * 4); /* no path from the input to the output: its gradient is zero */
      x->owned[x->n_owned++] = g;
      add_op(x, chunk_rank(q, c - 1), 1, tag_of(q, 1, c - 1, m), g, an * 4);
      if (q->tied) {
        float *t = s->tied; /* the chunks between pass the last chunk's on */
        if (c == C - 1) {
          int64_t N = tdm_tensor_numel(q->x[m]);
          if (!(t = buf_get(q, tn))) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
          tdm_tensor *gl = tdm_tensor_grad(s->logits);
          widen(t, tdm_tensor_data(gl), tdm_tensor_dtype(gl), N * q->vt);
          widen(t + N * q->vt, tdm_tensor_data(s->head_in), tdm_tensor_dtype(s->head_in), N * mdl->cfg.n_embd);
        }
        s->tied = NULL;
        x->owned[x->n_owned++] = t;
        add_op(x, chunk_rank(q, c - 1), 1, tag_of(q, 2, c - 1, m), t, tn * 4);
      }
      s->grad_sent = 1;
      slot_release_if_done(q, s);
      break;
    }
    default:
      return tdm__set_error(TDM_ERR_INTERNAL, "pipeline: action %d is no message", (int)a->op);
    }
  }
  x->comm = q->pp;
  x->state = 1;
  if (!q->sync) return tdm__comm_icall(q->world, run_exchange, x, &x->work);
  tdm_status st = run_exchange(x); /* the 3-D grid: here, in list order */
  x->state = 2;
  for (int b = 0; b < x->n_owned; b++) buf_put(q, x->owned[b]);
  x->n_owned = 0;
  if (st != TDM_OK) {
    char b[96];
    return tdm__set_error(st, "pipeline stage %d, exchange at its action %d (%s): %s", q->stage, x->lo,
                          act_str(&q->list[x->lo], b, sizeof b), tdm_last_error());
  }
  return TDM_OK;
}

/* Waits for exchanges 0..k (they end in order) and gives their buffers back. */
static tdm_status wait_through(pp_state *q, int k, double *waited) {
  double t0 = tdm_time_now();
  tdm_status first = TDM_OK;
  for (int j = 0; j <= k && j < q->n_ex; j++) {
    exch *x = &q->ex[j];
    if (x->state != 1) continue;
    tdm_status st = tdm_work_wait(x->work);
    x->state = 2;
    for (int b = 0; b < x->n_owned; b++) buf_put(q, x->owned[b]);
    x->n_owned = 0;
    if (st != TDM_OK && first == TDM_OK) {
      char b[96];
      first = tdm__set_error(st, "pipeline stage %d, exchange at its action %d (%s): %s", q->stage, x->lo,
                             act_str(&q->list[x->lo], b, sizeof b), tdm_last_error());
    }
  }
  double t1 = tdm_time_now();
  if (waited) *waited += t1 - t0;
  if (tdm_trace_on()) {
    tdm_trace_args ta = TDM_TRACE_ARGS_INIT;
    ta.index = k;
    tdm_trace_span("idle", "wait for exchange", t0, t1, &ta);
  }
  return first;
}

/* After a failure: tell every rank (the world fails with this stage's reason: the other stages wait
 * on this one within the step, whether or not an exchange of it was in flight; a last stage whose
 * loss failed left the first waiting out the timeout for gradients), let the issued exchanges end. */
static tdm_status fail(pp_state *q, tdm_status st) {
  tdm_status keep = tdm__set_error(st, "%s", tdm_last_error());
  if (q->world && tdm_comm_status(q->world) == TDM_OK) { /* (a failed world already told the others) */
    char mine[512], why[600];
    snprintf(mine, sizeof mine, "%s", tdm_last_error());
    snprintf(why, sizeof why, "pipeline stage %d failed: %s", q->stage, mine);
    int origin = tdm_last_error_origin(); /* a relayed failure stays relayed */
    tdm_comm_abort_why(q->world, keep, why);
    tdm__error_from(origin, tdm__set_error(keep, "%s", mine));
  }
  wait_through(q, q->n_ex - 1, NULL);
  for (int i = 0; i < q->n_slots; i++) q->slots[i].chunk = -1;
  for (int i = 0; i < q->n_bufs; i++) q->bufs[i].used = 0;
  return tdm__set_error(keep, "%s", tdm_last_error()[0] ? tdm_last_error() : "pipeline step failed");
}

/* ---- compute ------------------------------------------------------------------------------------- */
static tdm_status forward(tdm_engine *e, pp_state *q, slot *s, uint64_t seed) {
  int c = s->chunk, m = s->mb;
  tdm_tape *t = s->tape;
  tdm_tape_set_training(t, 1);
  tdm_tape_set_dropout_key(t, seed, q->base[m]);
  if (q->tg) { /* the 3-D grid: the chunk's blocks split over the tensor axis, the loss vocabulary-parallel */
    tdm__tp_range r = {q->first_block[c], q->first_block[c + 1], c == 0, c == q->C - 1, NULL, NULL, NULL};
    if (r.head && q->tied) r.head_weight = tdm_detach(t, q->wte);
    tdm_tensor *h = tdm__tp_model_range(q->tg, t, c == 0 ? q->x[m] : s->in, &r, q->y[m], &q->correct, &q->rows);
    if (h && r.head) s->logits = r.logits, s->head_in = r.head_input, q->loss_sum += *(const float *)tdm_tensor_data(h);
    if (!h) return tdm__set_error(tdm_tape_status(t), "forward: %s", tdm_tape_error(t));
    s->out = h;
    return TDM_OK;
  }
  tdm_gpt_range r = {q->first_block[c], q->first_block[c + 1], c == 0, c == q->C - 1, NULL, NULL};
  if (r.head && q->tied) r.head_weight = tdm_detach(t, e->model->wte.weight); /* its gradient is chunk 0's to add */
  tdm_tensor *h = tdm_model_forward_range(e->model, t, c == 0 ? q->x[m] : s->in, &r);
  if (h && r.head) {
    s->logits = h, s->head_in = r.head_input;
    h = tdm_cross_entropy(t, h, q->y[m], -100);
    if (h) {
      q->loss_sum += *(const float *)tdm_tensor_data(h);
      tdm__engine_count_correct(s->logits, q->y[m], &q->correct, &q->rows);
    }
  }
  if (!h) return tdm__set_error(tdm_tape_status(t), "forward: %s", tdm_tape_error(t));
  s->out = h;
  return TDM_OK;
}

/* Chunk 0: the tied head's part of wte's gradient, from what the last chunk sent. */
static void tied_grad(tdm_engine *e, pp_state *q, slot *s) {
  if (!q->tied || s->chunk != 0) return;
  const tdm_model_config *mc = &e->model->cfg;
  int64_t N = tdm_tensor_numel(q->x[s->mb]);
  float *g = tdm_params_grad(q->work) + q->wte_lo;
  if (q->tg) { /* the tensor-parallel head's product, as the tensor-parallel engine's */
    tdm_k_linear_bwd(NULL, g, NULL, s->tied, s->tied + N * q->vt, tdm_tensor_data(q->wte), N, mc->n_embd, q->vt);
    return;
  }
  for (int64_t r0 = 0; r0 < q->vt; r0 += TDM_HEAD_ROWS) { /* tdm_lm_head's blocks, as one process's embedding adds them */
    int64_t r1 = r0 + TDM_HEAD_ROWS < q->vt ? r0 + TDM_HEAD_ROWS : q->vt;
    tdm_k_gemm(1, 0, r1 - r0, mc->n_embd, N, 1.0f, s->tied + r0, q->vt, s->tied + N * q->vt, mc->n_embd, 1.0f, g + r0 * mc->n_embd,
               mc->n_embd);
  }
}

static tdm_status backward(tdm_engine *e, pp_state *q, slot *s, tdm_pp_op op) {
  tdm_tape *t = s->tape;
  tdm_tensor *g = s->gout;
  if (s->chunk == q->C - 1) { /* seeded with 1/M (times fp16's loss scale), as one process accumulating M micro-batches */
    g = NULL;
    double seed = tdm__engine_seed_scale(e); /* fp16: the loss scale over the data ranks */
    if (q->M > 1 || seed != 1.0) {
      int64_t one[1] = {1};
      if (!(g = tdm_new(t, TDM_F32, 0, one))) return tdm__set_error(tdm_tape_status(t), "%s", tdm_tape_error(t));
      *(float *)tdm_tensor_data(g) = seed == 1.0 ? 1.0f / (float)q->M : (float)(seed / (double)q->M);
    }
  }
  tdm_status st;
  if (op == TDM_PP_BACKWARD_WEIGHT) {
    tied_grad(e, q, s);
    st = tdm_backward_params(t);
  } else if (op == TDM_PP_BACKWARD_INPUT) {
    st = tdm_backward_inputs(t, s->out, g);
  } else {
    tied_grad(e, q, s);
    st = g ? tdm_backward_with(t, s->out, g) : tdm_backward(t, s->out);
  }
  if (st != TDM_OK) return tdm__set_error(st, "backward: %s", tdm_last_error());
  if (op != TDM_PP_BACKWARD_INPUT) s->bwd_done = 1;
  if (s->chunk == 0) s->grad_sent = 1; /* nothing to send */
  slot_release_if_done(q, s);
  return TDM_OK;
}

/* ---- the step ------------------------------------------------------------------------------------- */
/* The first rank's tied embedding to the last rank's copy, after an update or a checkpoint load. */
static tdm_status sync_tied(tdm_engine *e, pp_state *q) {
  if (!q->tied || !q->tied_stale) return TDM_OK;
  (void)e;
  float *w = tdm_params_data(q->work) + q->wte_lo;
  size_t n = (size_t)(q->wte_hi - q->wte_lo) * 4;
  if (q->stage == 0) TDM__TRY(tdm_comm_send(q->pp, chunk_rank(q, q->C - 1), 7, w, n));
  else if (q->stage == chunk_rank(q, q->C - 1)) TDM__TRY(tdm_comm_recv(q->pp, 0, 7, w, n));
  q->tied_stale = 0;
  return TDM_OK;
}

static tdm_status finish(tdm_engine *e, pp_state *q, float lr, tdm_step_stats *st);

static tdm_status run_list(tdm_engine *e, pp_state *q, tdm_batch_fn next, void *ctx, uint64_t seed, float lr,
                           tdm_step_stats *st) {
  char b[96];
  for (int i = 0; i < q->n_list; i++) {
    const tdm_pp_action *a = &q->list[i];
    tdm_status s_ = TDM_OK;
    if (q->ex_of[i] >= 0) { /* the start of an exchange: issue it and go on */
      int k = q->ex_of[i];
      s_ = issue(e, q, k, next, ctx);
      if (s_ == TDM_OK) {
        i = q->ex[k].hi - 1;
        continue;
      }
    } else if (a->op == TDM_PP_OPTIM) {
      s_ = wait_through(q, q->n_ex - 1, &q->t_wait);
      if (s_ == TDM_OK) s_ = finish(e, q, lr, st);
    } else {
      if (q->input_ex[i] >= 0) s_ = wait_through(q, q->input_ex[i], &q->t_wait);
      if (s_ == TDM_OK) s_ = need_batch(q, next, ctx, a->mb);
      slot *s = NULL;
      if (s_ == TDM_OK) s_ = slot_get(q, a->chunk, a->mb, &s);
      double t0 = tdm_time_now();
      if (s_ == TDM_OK && a->op == TDM_PP_FORWARD) {
        s_ = forward(e, q, s, seed);
        q->samples += a->chunk == q->C - 1 ? tdm_tensor_dim(q->x[a->mb], 0) : 0;
        q->t_fwd += tdm_time_now() - t0;
      } else if (s_ == TDM_OK) {
        s_ = backward(e, q, s, a->op);
        q->t_bwd += tdm_time_now() - t0;
      }
      if (s_ == TDM_OK && tdm_trace_on()) { /* the schedule's action, as tandem plan --trace draws it */
        tdm_trace_args ta = TDM_TRACE_ARGS_INIT;
        ta.index = a->mb, ta.chunk = a->chunk;
        tdm_trace_span("pipeline", tdm_pp_op_name(a->op), t0, tdm_trace_now(), &ta);
      }
    }
    if (s_ != TDM_OK) {
      if (strncmp(tdm_last_error(), "pipeline stage", 14)) /* an exchange's failure names itself */
        tdm__set_error(s_, "pipeline stage %d, action %d (%s): %s", q->stage, i, act_str(a, b, sizeof b), tdm_last_error());
      return fail(q, s_);
    }
  }
  return TDM_OK;
}

static void zero_owned_grads(tdm_engine *e) {
  const pp_state *q = e->impl;
  float *g = tdm_params_grad(((pp_state *)e->impl)->work);
  for (int i = 0; i < q->n_full; i++) tdm_k_zero(g + q->full[i].lo, q->full[i].hi - q->full[i].lo);
}

/* The 3-D grid: the replicated parameters of this rank's chunks (layer norms, the row-parallel
 * projections' biases, wpe) must be bitwise identical on every tensor rank of its stage, as the
 * tensor-parallel engine checks them: every cfg.tp.check_every steps, before the step's first
 * forward, their hashes are all-gathered over the tensor axis and a difference fails the step,
 * naming the parameter (the world is aborted, so the other stages stop too). */
static uint64_t hash_floats(const float *x, int64_t n) {
  uint64_t h = 0x7470647269667400ull;
  const uint32_t *u = (const uint32_t *)(const void *)x;
  for (int64_t i = 0; i < n; i++) h = tdm_hash64(h, u[i]);
  return h;
}

static tdm_status check_replicas(tdm_engine *e, pp_state *q) {
  int64_t every = e->cfg.tp.check_every;
  if (!q->tg || every <= 0 || q->steps_done % every != 0) return TDM_OK;
  int n = 0, np = tdm_params_count(q->work);
  for (int i = 0; i < np; i++) n += q->held_at[i] >= 0 && !tdm__tp_model_slice(q->tg, i)->sharded;
  uint64_t *h = tdm__malloc(sizeof(uint64_t) * (size_t)(n ? n : 1) * (size_t)(q->T + 1));
  if (!h) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  uint64_t *all = h + n;
  for (int i = 0, k = 0; i < np; i++)
    if (q->held_at[i] >= 0 && !tdm__tp_model_slice(q->tg, i)->sharded) {
      tdm_tensor *t = tdm_params_get(q->work, i);
      h[k++] = hash_floats(tdm_tensor_data(t), tdm_tensor_numel(t));
    }
  tdm_status st = tdm_comm_allgather(q->tcomm, h, all, (size_t)n, TDM_I64, TDM_ALGO_AUTO);
  for (int i = 0, k = 0; st == TDM_OK && i < np; i++) {
    if (q->held_at[i] < 0 || tdm__tp_model_slice(q->tg, i)->sharded) continue;
    for (int r = 1; r < q->T && st == TDM_OK; r++)
      if (all[(size_t)r * (size_t)n + (size_t)k] != all[k])
        st = tdm__set_error(TDM_ERR_MISMATCH,
                            "tensor parallelism: the replicated parameter '%s' has drifted: tensor rank %d's copy differs from "
                            "tensor rank 0's on pipeline stage %d after %lld steps; it must be bitwise identical on every tensor "
                            "rank (a nondeterministic kernel, or a rank given other weights)",
                            tdm_tensor_name(tdm_params_get(q->work, i)), r, q->stage, (long long)q->steps_done);
    k++;
  }
  tdm__free(h);
  if (st != TDM_OK && q->world) { /* the other stages are waiting for this one: stop them */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", tdm_last_error());
    tdm_comm_abort(q->world);
    return tdm__set_error(st, "%s", msg);
  }
  return st;
}

static tdm_status pp_step(tdm_engine *e, tdm_batch_fn next, void *ctx, uint64_t seed, float lr, tdm_step_stats *st) {
  pp_state *q = e->impl;
  TDM__TRY(check_replicas(e, q));
  tdm_tape_reset(q->data);
  q->fetched = 0;
  q->loss_sum = q->correct = q->rows = 0;
  q->samples = 0;
  q->t_fwd = q->t_bwd = q->t_wait = 0;
  for (int k = 0; k < q->n_ex; k++) q->ex[k].state = 0;
  zero_owned_grads(e);
  TDM__TRY(sync_tied(e, q));
  return run_list(e, q, next, ctx, seed, lr, st);
}

/* The schedule's last action: the data axis averages, the pipeline sums the norm's segments and
 * the step's numbers, then clipping, the update, and the tied embedding to the last rank. */
static tdm_status finish(tdm_engine *e, pp_state *q, float lr, tdm_step_stats *st) {
  double t0 = tdm_time_now();
  float *g = tdm_params_grad(q->work);
  if (e->comm) /* as data parallelism averages: rank order, every element alike */
    for (int i = 0; i < q->n_full; i++)
      TDM__TRY(tdm_comm_allreduce(e->comm, g + q->full[i].lo, g + q->full[i].lo, (size_t)(q->full[i].hi - q->full[i].lo),
                                  TDM_F32, TDM_AVG, tdm_comm_rank_order_algo(e->comm)));
  int64_t ns = e->n_seg;
  memset(q->red, 0, sizeof(double) * (size_t)(ns + 4));
  if (q->tg) /* each piece's sum, added in piece order (as the tensor-parallel engine adds them) */
    for (int64_t k = 0; k < q->n_np; k++) {
      const float *x = g + q->np[k].local;
      double sq = 0;
      for (int64_t j = 0; j < q->np[k].len; j++) sq += (double)x[j] * x[j];
      q->red[q->np[k].seg] += sq;
    }
  else
    for (int i = 0; i < q->n_full; i++)
      TDM__TRY(tdm_grad_sumsq_segments(e->params, q->full[i].lo, q->full[i].hi, g + q->full[i].lo, q->red));
  if (q->stage == chunk_rank(q, q->C - 1) && q->t == 0)
    q->red[ns] = q->loss_sum, q->red[ns + 1] = q->correct, q->red[ns + 2] = q->rows, q->red[ns + 3] = (double)q->samples;
  if (q->tcomm) /* the tensor ranks' parts of each segment, in rank order */
    TDM__TRY(tdm_comm_allreduce(q->tcomm, q->red, q->red, (size_t)(ns + 4), TDM_F64, TDM_SUM, tdm_comm_rank_order_algo(q->tcomm)));
  /* over the pipeline each entry has one rank's term: the sum is exact in any order */
  if (q->pp) TDM__TRY(tdm_comm_allreduce(q->pp, q->red, q->red, (size_t)(ns + 4), TDM_F64, TDM_SUM, TDM_ALGO_AUTO));
  double sumsq = tdm_grad_sumsq_combine(q->red, ns);
  st->loss = q->red[ns] / q->M;
  st->correct = q->red[ns + 1], st->rows = q->red[ns + 2], st->samples = (int64_t)q->red[ns + 3];
  st->t_forward = q->t_fwd, st->t_backward = q->t_bwd;
  double t1 = tdm_time_now();
  st->t_comm_wait = q->t_wait + (t1 - t0);
  TDM__TRY(tdm__engine_update(e, sumsq, lr, st));
  q->tied_stale = 1;
  q->steps_done++;
  TDM__TRY(sync_tied(e, q));
  st->t_update = tdm_time_now() - t1;
  if (tdm_trace_on()) {
    tdm_trace_span("sync", "average gradients", t0, t1, NULL);
    tdm_trace_span("optimizer", "optimizer", t1, t1 + st->t_update, NULL);
  }
  return TDM_OK;
}

static const tdm__engine_ops pipeline_zero1_ops;

/* ---- the engine's hooks ---------------------------------------------------------------------------- */
static void pp_zero_grad(tdm_engine *e) { zero_owned_grads(e); }
static void pp_begin_backward(tdm_engine *e, int last) { (void)e, (void)last; }
static tdm_status pp_end_backward(tdm_engine *e, int last, double *wait_s) { (void)e, (void)last, (void)wait_s; return TDM_OK; }
static tdm_status pp_grad_sumsq(tdm_engine *e, double *sumsq) {
  (void)e, (void)sumsq;
  return tdm__set_error(TDM_ERR_INTERNAL, "pipeline: the step is the schedule's");
}

/* ZeRO stage 1 on the data axis: data rank d keeps the optimizer state of (and updates) the d-th
 * even part of its chunks' spans, packed in order; then every data rank's updated part goes to
 * every rank of the data axis. The gradients are still averaged whole (the same all-reduce, so
 * the norm's segment sums and every update are the bits of --zero 0). */
static tdm_status gather_zero1(tdm_engine *e, pp_state *q) {
  if (!q->zero1 || !e->comm) return TDM_OK;
  float *w = tdm_params_data(q->work);
  int64_t at = q->zcut[e->rank], all = q->zcut[q->D];
  size_t parts[q->D];
  for (int r = 0; r < q->D; r++) parts[r] = (size_t)(q->zcut[r + 1] - q->zcut[r]);
  if (q->n_full == 1) /* one span: in place */
    return tdm_comm_allgather_v(e->comm, w + q->full[0].lo + at, w + q->full[0].lo, (size_t)all, parts, TDM_F32,
                                tdm_comm_rank_order_algo(e->comm));
  for (int i = 0; i < e->n_spans; at += e->spans[i].hi - e->spans[i].lo, i++)
    memcpy(q->packed + at, w + e->spans[i].lo, sizeof(float) * (size_t)(e->spans[i].hi - e->spans[i].lo));
  TDM__TRY(tdm_comm_allgather_v(e->comm, q->packed + q->zcut[e->rank], q->packed, (size_t)all, parts, TDM_F32,
                                tdm_comm_rank_order_algo(e->comm)));
  at = 0;
  for (int i = 0; i < q->n_full; at += q->full[i].hi - q->full[i].lo, i++)
    memcpy(w + q->full[i].lo, q->packed + at, sizeof(float) * (size_t)(q->full[i].hi - q->full[i].lo));
  return TDM_OK;
}

static tdm_status pp_update(tdm_engine *e, float lr, float coef) {
  float *g = tdm_params_grad(((pp_state *)e->impl)->work);
  for (int i = 0; i < e->n_spans; i++) tdm_grad_scale(g + e->spans[i].lo, e->spans[i].hi - e->spans[i].lo, coef);
  TDM__TRY(tdm_optim_step(e->opt, lr));
  return gather_zero1(e, (pp_state *)e->impl);
}

static int owns(const tdm_engine *e, int64_t i) {
  const pp_state *q = e->impl;
  for (int k = 0; k < q->n_full; k++)
    if (i >= q->full[k].lo && i < q->full[k].hi) return 1;
  return 0;
}

/* ---- the 3-D grid's parameters: the slices of this rank's chunks ----------------------------------- */
/* [lo, hi) of the whole model to every rank of this data replica: each element from the one rank
 * that holds it (its chunk's stage; tensor rank 0 for a replicated parameter), zeros elsewhere,
 * summed over the tensor axis, then the pipeline (one term each: exact). */
static tdm_status tp3_read(tdm_engine *e, pp_state *q, int64_t lo, int64_t hi, float *dst) {
  memset(dst, 0, sizeof(float) * (size_t)(hi - lo));
  for (int i = 0; i < tdm_params_count(e->params); i++) {
    int64_t off = tdm_params_offset(e->params, i), n = tdm_tensor_numel(tdm_params_get(e->params, i));
    const tdm__tp_slice *s = tdm__tp_model_slice(q->tg, i);
    if (off + n <= lo || off >= hi || q->held_at[i] < 0 || (!s->sharded && q->t != 0)) continue;
    const float *v = tdm_tensor_data(tdm_params_get(q->work, i));
    for (int64_t r = 0; r < s->count; r++) {
      int64_t a = off + s->first + r * s->stride, b = a + s->len, x0 = a > lo ? a : lo, x1 = b < hi ? b : hi;
      if (x0 < x1) memcpy(dst + (x0 - lo), v + r * s->len + (x0 - a), sizeof(float) * (size_t)(x1 - x0));
    }
  }
  if (q->tcomm) TDM__TRY(tdm_comm_allreduce(q->tcomm, dst, dst, (size_t)(hi - lo), TDM_F32, TDM_SUM, TDM_ALGO_AUTO));
  if (q->pp) TDM__TRY(tdm_comm_allreduce(q->pp, dst, dst, (size_t)(hi - lo), TDM_F32, TDM_SUM, TDM_ALGO_AUTO));
  return TDM_OK;
}

/* World rank 0 writes the whole model, window after window read as above by its data replica. */
static tdm_status tp3_stream(tdm_engine *e, pp_state *q, tdm_status (*write)(void *, const float *, int64_t), void *ctx) {
  if (e->rank != 0) return TDM_OK; /* another data replica: the same values */
  int64_t n = tdm_params_numel(e->params), K = (int64_t)1 << 18;
  float *buf = tdm__malloc_cat(sizeof(float) * (size_t)K, TDM_MEM_WORKSPACE);
  if (!buf) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  tdm_status st = TDM_OK;
  int writer = q->stage == 0 && q->t == 0;
  for (int64_t x = 0; st == TDM_OK && x < n; x += K) {
    int64_t y = x + K < n ? x + K : n;
    st = tp3_read(e, q, x, y, buf);
    if (st == TDM_OK && writer) st = write(ctx, buf, y - x);
  }
  tdm__free(buf);
  return st;
}

/* Every rank reads its slices of its chunks' parameters (and the last rank its tied embedding's). */
static tdm_status tp3_load(tdm_engine *e, pp_state *q, const char *path) {
  int last = q->tied && q->stage == chunk_rank(q, q->C - 1);
  int64_t n = 0;
  for (int i = 0; i < tdm_params_count(q->work); i++)
    if (q->held_at[i] >= 0 || (last && i == q->wte_i)) n += tdm__tp_model_slice(q->tg, i)->count;
  if (n > (int64_t)1 << 30) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline: %lld slices", (long long)n);
  int64_t *lo = tdm__malloc(sizeof(int64_t) * 2 * (size_t)(n ? n : 1));
  float **dst = tdm__malloc(sizeof(float *) * (size_t)(n ? n : 1));
  tdm_status st = lo && dst ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  for (int i = 0, k = 0; st == TDM_OK && i < tdm_params_count(q->work); i++) {
    if (!(q->held_at[i] >= 0 || (last && i == q->wte_i))) continue;
    const tdm__tp_slice *s = tdm__tp_model_slice(q->tg, i);
    int64_t off = tdm_params_offset(e->params, i);
    float *mine = tdm_tensor_data(tdm_params_get(q->work, i));
    for (int64_t r = 0; r < s->count; r++, k++) {
      lo[k] = off + s->first + r * s->stride;
      lo[n + k] = lo[k] + s->len;
      dst[k] = mine + r * s->len;
    }
  }
  if (st == TDM_OK) st = tdm_params_load_spans(e->params, path, 0, (int)n, lo, lo + n, dst);
  tdm__free(lo), tdm__free(dst);
  return st;
}

static int tp3_held(void *ctx, int i, int64_t *state_at) {
  const pp_state *q = ctx;
  *state_at = q->held_at[i];
  return q->held_at[i] >= 0;
}

/* Checkpoints: the 3-D grid's state as boxes of the whole parameters (its slices of its chunks). */
static int pp_pieces(const tdm_engine *e, const tdm_engine_piece **pieces) {
  const pp_state *q = e->impl;
  if (pieces) *pieces = q->boxes;
  return q->tg ? q->n_boxes : 0;
}

/* The first non-finite parameter value of any rank's chunks, as an index into the whole model. */
static tdm_status pp_first_nonfinite(tdm_engine *e, int64_t *index) {
  pp_state *q = e->impl;
  int64_t key = INT64_MAX;
  if (!q->tg) {
    const float *w = tdm_params_data(q->work);
    for (int k = 0; k < q->n_full && key == INT64_MAX; k++)
      for (int64_t i = q->full[k].lo; i < q->full[k].hi; i++)
        if (!isfinite(w[i])) {
          key = i;
          break;
        }
  }
  for (int i = 0; q->tg && i < tdm_params_count(q->work) && key == INT64_MAX; i++) {
    if (q->held_at[i] < 0) continue;
    const tdm__tp_slice *s = tdm__tp_model_slice(q->tg, i);
    const float *v = tdm_tensor_data(tdm_params_get(q->work, i));
    for (int64_t k = 0; k < s->count * s->len; k++)
      if (!isfinite(v[k])) {
        key = tdm_params_offset(e->params, i) + s->first + (k / s->len) * s->stride + k % s->len;
        break;
      }
  }
  if (q->world) TDM__TRY(tdm_comm_allreduce(q->world, &key, &key, 1, TDM_I64, TDM_MIN, TDM_ALGO_AUTO));
  *index = key == INT64_MAX ? -1 : key;
  return TDM_OK;
}

/* Every rank of the pipeline gets [lo, hi): each element from its owner (zeros elsewhere, summed:
 * exact). */
static tdm_status pp_read_params(tdm_engine *e, int64_t lo, int64_t hi, float *dst) {
  pp_state *q = e->impl;
  if (q->tg) return tp3_read(e, q, lo, hi, dst);
  const float *w = tdm_params_data(e->params);
  for (int64_t i = lo; i < hi; i++) dst[i - lo] = owns(e, i) ? w[i] : 0.0f;
  if (q->pp && hi > lo) TDM__TRY(tdm_comm_allreduce(q->pp, dst, dst, (size_t)(hi - lo), TDM_F32, TDM_SUM, TDM_ALGO_AUTO));
  return TDM_OK;
}

/* World rank 0 (stage 0 of data replica 0) writes, chunk after chunk in parameter order; the other
 * stages of replica 0 send theirs. */
static tdm_status pp_stream_params(tdm_engine *e, tdm_status (*write)(void *, const float *, int64_t), void *ctx) {
  pp_state *q = e->impl;
  if (q->tg) return tp3_stream(e, q, write, ctx);
  if (e->rank != 0) return TDM_OK; /* another data replica: the same values */
  tdm_params *p = e->params;
  for (int c = 0; c < q->C; c++) {
    int64_t lo = c == 0 ? 0 : tdm_params_offset(p, block_param(e, q->first_block[c]));
    int64_t hi = c == q->C - 1 ? tdm_params_numel(p) : tdm_params_offset(p, block_param(e, q->first_block[c + 1]));
    int owner = chunk_rank(q, c);
    float *w = tdm_params_data(p) + lo;
    if (owner == 0 && q->stage == 0) TDM__TRY(write(ctx, w, hi - lo));
    else if (q->stage == 0) {
      TDM__TRY(tdm_comm_recv(q->pp, owner, 11, w, (size_t)(hi - lo) * 4)); /* into the reserved pages, then gone */
      tdm_status st = write(ctx, w, hi - lo);
      tdm_params_release(p, 0, lo, hi);
      TDM__TRY(st);
    } else if (owner == q->stage) {
      TDM__TRY(tdm_comm_send(q->pp, 0, 11, w, (size_t)(hi - lo) * 4));
    }
  }
  return TDM_OK;
}

static tdm_status pp_load_weights(tdm_engine *e, const char *path) {
  pp_state *q = e->impl;
  if (q->tg) return tp3_load(e, q, path);
  int n = q->n_full + 1;
  int64_t *los = tdm__malloc(sizeof(int64_t) * (size_t)n), *his = tdm__malloc(sizeof(int64_t) * (size_t)n);
  float **dst = tdm__malloc(sizeof(float *) * (size_t)n);
  tdm_status st = los && his && dst ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  int k = 0;
  if (st == TDM_OK && q->tied && q->stage == chunk_rank(q, q->C - 1)) /* the tied copy first: it comes first */
    los[k] = q->wte_lo, his[k] = q->wte_hi, dst[k] = tdm_params_data(e->params) + q->wte_lo, k++;
  for (int i = 0; st == TDM_OK && i < q->n_full; i++)
    los[k] = q->full[i].lo, his[k] = q->full[i].hi, dst[k] = tdm_params_data(e->params) + q->full[i].lo, k++;
  if (st == TDM_OK) st = tdm_params_load_spans(e->params, path, 0, k, los, his, dst);
  tdm__free(los), tdm__free(his), tdm__free(dst);
  return st;
}

/* Checkpoints: this rank's spans, packed (the last rank's copy of the tied embedding is not part of
 * its state: it comes from the first rank before it is next used). */
static float *pp_param_shard(tdm_engine *e) {
  pp_state *q = e->impl;
  if (q->tg) return tdm_params_data(q->work); /* the 3-D grid: its boxes (pp_pieces) say where */
  const float *w = tdm_params_data(e->params);
  int64_t at = 0;
  for (int i = 0; i < e->n_spans; i++) {
    memcpy(q->packed + at, w + e->spans[i].lo, sizeof(float) * (size_t)(e->spans[i].hi - e->spans[i].lo));
    at += e->spans[i].hi - e->spans[i].lo;
  }
  return q->packed;
}

static tdm_status pp_shard_changed(tdm_engine *e) {
  pp_state *q = e->impl;
  float *w = tdm_params_data(e->params);
  int64_t at = 0;
  for (int i = 0; !q->tg && i < e->n_spans; i++) {
    memcpy(w + e->spans[i].lo, q->packed + at, sizeof(float) * (size_t)(e->spans[i].hi - e->spans[i].lo));
    at += e->spans[i].hi - e->spans[i].lo;
  }
  q->tied_stale = 1; /* collective: at the next step or evaluation */
  return gather_zero1(e, q); /* zero1: the other data ranks' parts of the chunks (collective too) */
}

/* Evaluation: the batch goes through the chunks in order, each rank running its own and passing
 * the activations on; the last rank's numbers go to every rank of the pipeline. */
static tdm_status pp_eval(tdm_engine *e, tdm_tensor *x, tdm_tensor *y, double *loss, double *correct, double *rows) {
  pp_state *q = e->impl;
  TDM__TRY(sync_tied(e, q));
  tdm_tape *t = q->eval;
  tdm_tape_reset(t);
  tdm_tape_set_grad_enabled(t, 0);
  tdm_tape_set_training(t, 0);
  int64_t shape[3] = {tdm_tensor_dim(x, 0), tdm_tensor_dim(x, 1), e->model->cfg.n_embd};
  size_t nbytes = (size_t)(shape[0] * shape[1] * shape[2]) * q->esz;
  double num[3] = {0, 0, 0};
  tdm_tensor *h = NULL;
  for (int c = 0; c < q->C; c++) {
    if (chunk_rank(q, c) != q->stage) continue;
    if (c > 0) {
      h = tdm_new(t, q->adt, 3, shape);
      if (!h) break;
      TDM__TRY(tdm_comm_recv(q->pp, chunk_rank(q, c - 1), 13, tdm_tensor_data(h), nbytes));
    }
    if (q->tg) { /* the 3-D grid: the last chunk's range ends with the loss */
      tdm__tp_range r = {q->first_block[c], q->first_block[c + 1], c == 0, c == q->C - 1, NULL, NULL, NULL};
      double cr = 0, rw = 0;
      h = tdm__tp_model_range(q->tg, t, c == 0 ? x : h, &r, y, &cr, &rw);
      if (!h) break;
      if (c < q->C - 1) TDM__TRY(tdm_comm_send(q->pp, chunk_rank(q, c + 1), 13, tdm_tensor_data(h), nbytes));
      else num[0] = *(const float *)tdm_tensor_data(h), num[1] = cr, num[2] = rw;
      continue;
    }
    tdm_gpt_range r = {q->first_block[c], q->first_block[c + 1], c == 0, c == q->C - 1, NULL, NULL};
    h = tdm_model_forward_range(e->model, t, c == 0 ? x : h, &r);
    if (!h) break;
    if (c < q->C - 1) {
      TDM__TRY(tdm_comm_send(q->pp, chunk_rank(q, c + 1), 13, tdm_tensor_data(h), nbytes));
    } else {
      tdm_tensor *l = tdm_cross_entropy(t, h, y, -100);
      if (!l) break;
      num[0] = *(const float *)tdm_tensor_data(l);
      tdm__engine_count_correct(h, y, &num[1], &num[2]);
    }
  }
  tdm_tape_set_grad_enabled(t, 1);
  if (tdm_tape_status(t) != TDM_OK) return tdm__set_error(tdm_tape_status(t), "evaluation: %s", tdm_tape_error(t));
  if (q->pp) TDM__TRY(tdm_comm_allreduce(q->pp, num, num, 3, TDM_F64, TDM_SUM, TDM_ALGO_AUTO));
  *loss = num[0], *correct = num[1], *rows = num[2];
  return TDM_OK;
}

/* ---- create / destroy -------------------------------------------------------------------------------- */
/* Whether the output head is the token embedding: GPT's always, Llama's when tie_embeddings. */
static int head_tied(const tdm_model_config *mc) { return mc->kind == TDM_MODEL_GPT || mc->tie_embeddings; }

tdm_status tdm__pp_layout_make(const tdm_model_config *mc, const tdm_engine_config *ec, int P, tdm__pp_layout *out) {
  memset(out, 0, sizeof *out);
  const tdm_engine_pipeline_config *pc = &ec->pp;
  if (mc->kind != TDM_MODEL_GPT && mc->kind != TDM_MODEL_LLAMA)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "pipeline: the %s model; pipeline parallelism cuts a transformer's blocks (use --model "
                          "gpt or llama)", tdm_model_kind_name(mc->kind));
  if (pc->virtual_stages < 0 || pc->virtual_stages > 256 || (pc->virtual_stages > 1 && pc->schedule != TDM_PP_INTERLEAVED))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline: %d virtual stages per rank with the %s schedule; only interleaved takes "
                          "more than 1 (up to 256)", pc->virtual_stages, tdm_pp_schedule_name(pc->schedule));
  out->P = P;
  out->V = pc->virtual_stages > 0 ? pc->virtual_stages : pc->schedule == TDM_PP_INTERLEAVED ? 2 : 1;
  out->C = P * out->V;
  out->M = (int)(ec->accum > 1 ? ec->accum : 1);
  if (mc->n_layer < out->C)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline: %d stages x %d virtual stages = %d chunks for a model of %lld blocks; every chunk needs "
                          "a block (at most %lld chunks)",
                          P, out->V, out->C, (long long)mc->n_layer, (long long)mc->n_layer);
  if (!(out->first_block = tdm__malloc(sizeof(int) * (size_t)(out->C + 1))))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  double ce, cb, ch;
  int64_t T = ec->pp.seq_len > 0 && ec->pp.seq_len < mc->block_size ? ec->pp.seq_len : mc->block_size;
  tdm_plan_layer_costs(mc, T, &ce, &cb, &ch);
  if (out->C > 1 && head_tied(mc)) { /* the tied head's weight gradient runs on chunk 0 (tied_grad): a third of the
                                       * head's training work (its forward's product again), counted there */
    double dw = 2.0 * (double)mc->n_embd * (double)mc->vocab_size / 3.0;
    ce += dw, ch -= dw;
  }
  tdm_status st = tdm_pp_partition((int)mc->n_layer, out->C, pc->split, pc->n_split, ce, cb, ch, out->first_block);
  if (st == TDM_OK) st = tdm_pp_schedule_create(&out->s, pc->schedule, P, out->V, out->M);
  if (st != TDM_OK) tdm__pp_layout_free(out);
  return st;
}

void tdm__pp_layout_free(tdm__pp_layout *l) {
  tdm__free(l->first_block);
  tdm_pp_schedule_destroy(l->s);
  l->first_block = NULL, l->s = NULL;
}

static tdm_status pp_check(const tdm_model_config *mc, const tdm_engine_config *ec, const int *sizes) {
  TDM__TRY(tdm__tp_check(mc, sizes[TDM_AXIS_TENSOR])); /* the 3-D grid: the heads over the tensor axis */
  tdm__pp_layout L;
  TDM__TRY(tdm__pp_layout_make(mc, ec, sizes[TDM_AXIS_PIPELINE], &L));
  tdm__pp_layout_free(&L);
  return TDM_OK;
}

/* The exchanges of this rank's list, and which one each compute action waits for. */
static tdm_status index_list(pp_state *q) {
  int n = q->n_list;
  q->ex_of = tdm__malloc(sizeof(int) * (size_t)(n ? n : 1));
  q->input_ex = tdm__malloc(sizeof(int) * (size_t)(n ? n : 1));
  q->ex = tdm__calloc((size_t)(n ? n : 1), sizeof *q->ex);
  if (!q->ex_of || !q->input_ex || !q->ex) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  int *in_ex = tdm__malloc(sizeof(int) * (size_t)(n ? n : 1)); /* per action: its exchange */
  if (!in_ex) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  for (int i = 0; i < n; i++) {
    q->ex_of[i] = q->input_ex[i] = in_ex[i] = -1;
    tdm_pp_op op = q->list[i].op;
    int comm = op >= TDM_PP_SEND_ACT && op <= TDM_PP_RECV_GRAD;
    if (!comm) continue;
    if (i > 0 && in_ex[i - 1] >= 0) {
      in_ex[i] = in_ex[i - 1];
      q->ex[in_ex[i]].hi = i + 1;
    } else {
      in_ex[i] = q->n_ex;
      q->ex_of[i] = q->n_ex;
      q->ex[q->n_ex].lo = i, q->ex[q->n_ex].hi = i + 1;
      q->n_ex++;
    }
  }
  int most = 0;
  for (int k = 0; k < q->n_ex; k++) most = q->ex[k].hi - q->ex[k].lo > most ? q->ex[k].hi - q->ex[k].lo : most;
  for (int k = 0; k < q->n_ex; k++)
    if (!(q->ex[k].ops = tdm__malloc(sizeof(tdm_p2p_op) * (size_t)(2 * most))) ||
        !(q->ex[k].owned = tdm__malloc(sizeof(float *) * (size_t)(2 * most)))) {
      tdm__free(in_ex);
      return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
    }
  for (int i = 0; i < n; i++) {
    const tdm_pp_action *a = &q->list[i];
    tdm_pp_op want = a->op == TDM_PP_FORWARD ? TDM_PP_RECV_ACT
                     : a->op == TDM_PP_BACKWARD || a->op == TDM_PP_BACKWARD_INPUT ? TDM_PP_RECV_GRAD
                                                                                  : TDM_PP_OP_COUNT;
    for (int j = i - 1; want != TDM_PP_OP_COUNT && j >= 0; j--)
      if (q->list[j].op == want && q->list[j].chunk == a->chunk && q->list[j].mb == a->mb) {
        q->input_ex[i] = in_ex[j];
        break;
      }
  }
  tdm__free(in_ex);
  return TDM_OK;
}

/* Before anything collective, so that every rank stops alike. */
static tdm_status check_zero(const tdm_engine *e, int T) {
  int stage = e->cfg.pp.zero_stage;
  if (stage < 0 || stage > 1)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "pipeline: ZeRO stage %d on the data axis; expected 0 or 1 (stages 2 and 3 shard the "
                          "gradients and parameters, which each stage keeps whole for its micro-batches)", stage);
  (void)T;
  return TDM_OK;
}

/* The optimizer's spans (e->spans): this rank's chunks' spans, or with ZeRO stage 1 the d-th even
 * part of them in packed order (data rank d; what a checkpoint's replica d would write). In the
 * 3-D grid the parts are cut on rows of the slices and the boxes become this data rank's parts of
 * them (zero1_boxes.c). */
static tdm_status make_zero1(tdm_engine *e, pp_state *q, int64_t owned) {
  q->zero1 = e->cfg.pp.zero_stage == 1; /* checked by check_zero */
  if (!q->zero1) {
    e->spans = q->full, e->n_spans = q->n_full;
    return TDM_OK;
  }
  int D = e->comm ? q->D : 1, d = e->comm ? e->rank : 0;
  if (!(q->zcut = tdm__malloc(sizeof(int64_t) * (size_t)(D + 1))) || !(e->spans = tdm__malloc(sizeof *e->spans * (size_t)q->n_full)))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  for (int r = 0; r <= D; r++) q->zcut[r] = q->tg ? tdm__boxes_align(e->params, q->boxes, q->n_boxes, owned * r / D) : owned * r / D;
  int64_t lo = q->zcut[d], hi = q->zcut[d + 1], pos = 0;
  if (q->tg) q->n_boxes = tdm__boxes_window(e->params, q->boxes, q->n_boxes, lo, hi);
  e->n_spans = 0;
  for (int k = 0; k < q->n_full; pos += q->full[k].hi - q->full[k].lo, k++) {
    int64_t a = lo > pos ? lo : pos, b = hi < pos + q->full[k].hi - q->full[k].lo ? hi : pos + q->full[k].hi - q->full[k].lo;
    if (a < b) e->spans[e->n_spans++] = (tdm_optim_span){q->full[k].lo + a - pos, q->full[k].lo + b - pos};
  }
  e->ops = &pipeline_zero1_ops; /* each data rank writes its own part of a checkpoint */
  return TDM_OK;
}

static tdm_status pp_create(tdm_engine *e, const tdm_model_config *mc, uint64_t seed) {
  TDM__TRY(tdm__tp_check(mc, tdm_grid_size(e->grid, TDM_AXIS_TENSOR)));
  pp_state *q = tdm__calloc(1, sizeof *q);
  if (!q) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  e->impl = q;
  const tdm_engine_pipeline_config *pc = &e->cfg.pp;
  q->P = tdm_grid_size(e->grid, TDM_AXIS_PIPELINE);
  q->stage = tdm_grid_index(e->grid, TDM_AXIS_PIPELINE);
  q->recompute = e->cfg.recompute;
  q->adt = e->cfg.precision == TDM_BF16 || e->cfg.precision == TDM_F16 ? e->cfg.precision : TDM_F32;
  q->esz = tdm_dtype_size(q->adt);
  q->D = e->size;
  q->pp = tdm_grid_comm(e->grid, TDM_AXIS_PIPELINE);
  q->world = tdm_grid_world(e->grid);
  q->tied = q->P > 1 && head_tied(mc);
  tdm__pp_layout L;
  TDM__TRY(tdm__pp_layout_make(mc, &e->cfg, q->P, &L));
  q->s = L.s, q->first_block = L.first_block, q->V = L.V, q->C = L.C, q->M = L.M;
  q->list = q->s->a[q->stage];
  q->n_list = q->s->n[q->stage];
  /* every parameter declared, in reserved address space; this rank's chunks initialised (the 3-D
   * grid: the whole model in address space only, its slices in a store of their own) */
  TDM__TRY(tdm_model_create_with(&e->model, mc, seed, TDM_RESERVE_DATA | TDM_RESERVE_GRAD));
  e->params = tdm_model_params(e->model);
  if (q->world) TDM__TRY(tdm__check_same_model(q->world, e->params)); /* names and shapes: the same everywhere */
  q->T = tdm_grid_size(e->grid, TDM_AXIS_TENSOR);
  TDM__TRY(check_zero(e, q->T));
  q->t = tdm_grid_index(e->grid, TDM_AXIS_TENSOR);
  q->tcomm = tdm_grid_comm(e->grid, TDM_AXIS_TENSOR);
  q->work = e->params;
  if (q->T > 1 && e->cfg.tp.check_every < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tensor parallelism: check_every %lld; expected >= 0 (0: never)",
                          (long long)e->cfg.tp.check_every);
  if (q->T > 1) {
    TDM__TRY(tdm__tp_model_create(&q->tg, e->params, mc, q->tcomm, q->T, q->t));
    q->work = tdm__tp_model_params(q->tg);
    q->sync = 1;
  }
  q->wte_i = tdm__params_index_of(e->params, e->model->wte.weight);
  q->wte = tdm_params_get(q->work, q->wte_i);
  q->vt = tdm_tensor_dim(q->wte, 0);
  q->wte_lo = (const float *)tdm_tensor_data(q->wte) - tdm_params_data(q->work);
  q->wte_hi = q->wte_lo + tdm_tensor_numel(q->wte);
  int np = tdm_params_count(e->params);
  q->n_full = q->V;
  if (!(q->full = tdm__malloc(sizeof *q->full * (size_t)q->V)) || !(q->held_at = tdm__malloc(sizeof(int64_t) * (size_t)(np ? np : 1))))
    return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  for (int i = 0; i < np; i++) q->held_at[i] = -1;
  int64_t owned = 0;
  for (int k = 0; k < q->V; k++) { /* chunk c: parameters [i0, i1) of the store */
    int c = k * q->P + q->stage;
    int i0 = c == 0 ? 0 : block_param(e, q->first_block[c]), i1 = c == q->C - 1 ? np : block_param(e, q->first_block[c + 1]);
    q->full[k].lo = tdm_params_offset(q->work, i0);
    q->full[k].hi = i1 == np ? tdm_params_numel(q->work) : tdm_params_offset(q->work, i1);
    for (int i = i0; i < i1; i++) q->held_at[i] = owned + tdm_params_offset(q->work, i) - q->full[k].lo;
    if (!q->tg)
      TDM__TRY(tdm_params_init_range(e->params, q->full[k].lo, q->full[k].hi, tdm_params_data(e->params) + q->full[k].lo));
    owned += q->full[k].hi - q->full[k].lo;
  }
  int last_rank = q->stage == chunk_rank(q, q->C - 1), copy = q->tied && last_rank;
  if (copy && !q->tg) TDM__TRY(tdm_params_init_range(e->params, q->wte_lo, q->wte_hi, tdm_params_data(e->params) + q->wte_lo));
  q->n_packed = q->tg && !(e->cfg.pp.zero_stage == 1 && q->n_full > 1) ? 0 : owned; /* zero1 over chunks: the gather's staging */
  q->n_held = q->tg ? 0 : owned + (copy ? q->wte_hi - q->wte_lo : 0); /* the slices' store counts itself */
  tdm__mem_account(TDM_MEM_PARAMS, 4 * q->n_held);
  tdm__mem_account(TDM_MEM_GRADS, q->tg ? 0 : 4 * owned);
  if (e->comm) /* the data replicas start alike */
    for (int k = 0; k < q->n_full; k++)
      TDM__TRY(tdm_comm_broadcast(e->comm, tdm_params_data(q->work) + q->full[k].lo, (size_t)(q->full[k].hi - q->full[k].lo),
                                  TDM_F32, 0, TDM_ALGO_AUTO));
  if (q->tg) { /* the norm's pieces and the checkpoints' boxes of this rank's chunks */
    int64_t n_all;
    TDM__TRY(tdm__tp_norm_pieces(e->params, q->T, q->t, NULL, &n_all));
    if (!(q->np = tdm__malloc(sizeof *q->np * (size_t)(n_all ? n_all : 1)))) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
    TDM__TRY(tdm__tp_norm_pieces(e->params, q->T, q->t, q->np, &n_all));
    for (int64_t k = 0; k < n_all; k++) /* in this rank's spans: kept, in order */
      for (int v = 0; v < q->n_full; v++)
        if (q->np[k].local >= q->full[v].lo && q->np[k].local < q->full[v].hi) {
          q->np[q->n_np++] = q->np[k];
          break;
        }
    int D = e->cfg.pp.zero_stage == 1 ? 1 : e->size, d = D == 1 ? 0 : e->rank; /* zero1: each data rank writes its part */
    q->n_boxes = tdm__tp_model_boxes(q->tg, e->params, D, d, tp3_held, q, NULL);
    if (!(q->boxes = tdm__malloc(sizeof *q->boxes * (size_t)(q->n_boxes ? q->n_boxes : 1))))
      return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
    tdm__tp_model_boxes(q->tg, e->params, D, d, tp3_held, q, q->boxes);
  }
  TDM__TRY(make_zero1(e, q, owned));
  TDM__TRY(tdm_optim_create_spans(&e->opt, &e->ocfg, q->work, e->n_spans, e->spans));
  const int64_t *cut;
  TDM__TRY(tdm_params_segments(e->params, &cut, &e->n_seg));
  q->red = tdm__malloc(sizeof(double) * (size_t)(e->n_seg + 4));
  q->packed = tdm__malloc(sizeof(float) * (size_t)(q->n_packed ? q->n_packed : 1));
  q->x = tdm__calloc((size_t)q->M, sizeof(tdm_tensor *));
  q->y = tdm__calloc((size_t)q->M, sizeof(tdm_tensor *));
  q->base = tdm__calloc((size_t)q->M, sizeof(int64_t));
  if (!q->red || !q->packed || !q->x || !q->y || !q->base) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline: out of memory");
  TDM__TRY(tdm_tape_create(&q->data, 1u << 16));
  TDM__TRY(tdm_tape_create(&q->eval, 1u << 20));
  TDM__TRY(tdm_tape_set_autocast(q->eval, q->adt));
  TDM__TRY(index_list(q));
  char blocks[64] = "";
  for (int k = 0, at = 0; k < q->V && at < (int)sizeof blocks; k++) {
    int c = k * q->P + q->stage;
    at += snprintf(blocks + at, sizeof blocks - (size_t)at, "%s%d-%d", k ? "," : "", q->first_block[c], q->first_block[c + 1] - 1);
  }
  char tensor[32] = "";
  if (q->T > 1) snprintf(tensor, sizeof tensor, " x %d tensor", q->T);
  char full[512]; /* then cut to the description's size: it is for people, the plan prints every stage */
  snprintf(full, sizeof full, "pipeline %s, %d stage%s%s%.0d%s x %d data%s, %d micro-batches, bubble %.3f (stage %d: blocks %.40s)",
           tdm_pp_schedule_name(pc->schedule), q->P, q->P == 1 ? "" : "s", q->V > 1 ? " x virtual " : "", q->V > 1 ? q->V : 0, tensor,
           q->D, q->zero1 && q->D > 1 ? " (ZeRO stage 1)" : "", q->M, q->s->bubble, q->stage, blocks);
  size_t n = strlen(full) < sizeof e->desc ? strlen(full) : sizeof e->desc - 1;
  memcpy(e->desc, full, n);
  e->desc[n] = '\0';
  return TDM_OK;
}

static void pp_destroy(tdm_engine *e) {
  pp_state *q = e->impl;
  if (!q) return;
  if (q->ex) { /* an error path may have left exchanges issued */
    for (int k = 0; k < q->n_ex; k++)
      if (q->ex[k].state == 1) tdm_work_wait(q->ex[k].work);
    for (int k = 0; k < q->n_ex; k++) tdm__free(q->ex[k].ops), tdm__free(q->ex[k].owned);
  }
  for (int i = 0; i < q->n_slots; i++) tdm_tape_destroy(q->slots[i].tape);
  for (int i = 0; i < q->n_bufs; i++) tdm__free(q->bufs[i].p);
  if (e->params) {
    tdm__mem_account(TDM_MEM_PARAMS, -4 * q->n_held);
    int64_t owned = 0;
    for (int k = 0; q->full && k < q->n_full; k++) owned += q->full[k].hi - q->full[k].lo;
    tdm__mem_account(TDM_MEM_GRADS, -4 * owned);
  }
  tdm__free(q->slots), tdm__free(q->bufs), tdm__free(q->ex), tdm__free(q->ex_of), tdm__free(q->input_ex);
  tdm_tape_destroy(q->data), tdm_tape_destroy(q->eval);
  tdm__free(q->x), tdm__free(q->y), tdm__free(q->base), tdm__free(q->red), tdm__free(q->packed), tdm__free(q->first_block);
  tdm_pp_schedule_destroy(q->s);
  if (q->tg) { /* the optimizer points at the slices' store: it goes first */
    tdm_optim_destroy(e->opt);
    e->opt = NULL;
    tdm__tp_model_destroy(q->tg);
  }
  tdm__free(q->held_at), tdm__free(q->np), tdm__free(q->boxes), tdm__free(q->zcut);
  if (q->full != e->spans) tdm__free(q->full); /* zero1 (or a failed create): its own array */
  tdm__free(q);
  e->impl = NULL;
}

/* The row, and the same engine with ZeRO stage 1 on the data axis (pp_create picks it): the
 * optimizer state is split over the data axis too, so each data rank writes its part of a
 * checkpoint (tdm_engine_replicas). Mixed precision (.mixed): bf16, and fp16 whose overflowed
 * steps every rank skips alike (the norm is global), beside a tensor axis too (the tensor-parallel
 * engine's bits).
 * Recomputation (.recompute): each chunk micro-batch's tape recomputes its blocks in backward (a
 * split backward computes a recomputed block's parameter gradients in its first pass: recompute.c),
 * the tensor-parallel stages' split blocks too (tp_model.c). */
#define PP_OPS(SPLIT) \
  { \
    .name = "pipeline", \
    .create = pp_create, \
    .destroy = pp_destroy, \
    .zero_grad = pp_zero_grad, \
    .begin_backward = pp_begin_backward, \
    .end_backward = pp_end_backward, \
    .grad_sumsq = pp_grad_sumsq, \
    .update = pp_update, \
    .read_params = pp_read_params, \
    .stream_params = pp_stream_params, \
    .load_weights = pp_load_weights, \
    .param_shard = pp_param_shard, \
    .shard_changed = pp_shard_changed, \
    .axes = 1u << TDM_AXIS_PIPELINE | 1u << TDM_AXIS_TENSOR, /* the tensor axis: the 3-D grid */ \
    .step = pp_step, \
    .eval = pp_eval, \
    .check = pp_check, \
    .split = 1u << TDM_AXIS_PIPELINE | 1u << TDM_AXIS_TENSOR | (SPLIT), \
    .first_nonfinite = pp_first_nonfinite, \
    .pieces = pp_pieces, \
    .recompute = 1, \
    .mixed = 1, \
  }
const tdm__engine_ops tdm__engine_pipeline_ops = PP_OPS(0);
static const tdm__engine_ops pipeline_zero1_ops = PP_OPS(1u << TDM_AXIS_DATA);
