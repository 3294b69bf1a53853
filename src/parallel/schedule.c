/* Pipeline schedules as data: the generators (GPipe, 1F1B, interleaved 1F1B, ZB-H1), the verifier
 * that simulates every rank's list against the others, the trace writer, and the cut of a model
 * into chunks (include/tandem/pipeline.h). */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/pipeline_impl.h"

static const char *kind_names[] = {"gpipe", "1f1b", "interleaved", "zb1p"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == TDM_PP_SCHEDULE_COUNT, "one name per schedule");
static const char *op_names[] = {"forward",         "backward",        "backward (input)", "backward (weights)",
                                 "send activation", "recv activation", "send gradient",    "recv gradient",
                                 "optimizer"};
_Static_assert(sizeof op_names / sizeof op_names[0] == TDM_PP_OP_COUNT, "one name per action");

const char *tdm_pp_schedule_name(tdm_pp_schedule_kind k) {
  return (unsigned)k < TDM_PP_SCHEDULE_COUNT ? kind_names[k] : "?";
}
const char *tdm_pp_op_name(tdm_pp_op op) { return (unsigned)op < TDM_PP_OP_COUNT ? op_names[op] : "?"; }

tdm_status tdm_pp_schedule_parse(const char *name, tdm_pp_schedule_kind *out) {
  if (!name || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_pp_schedule_parse: %s is NULL", !name ? "the name" : "out");
  for (int k = 0; name && k < TDM_PP_SCHEDULE_COUNT; k++)
    if (!strcmp(name, kind_names[k])) {
      *out = (tdm_pp_schedule_kind)k;
      return TDM_OK;
    }
  return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule '%s'; expected gpipe, 1f1b, interleaved or zb1p",
                        name ? name : "(null)");
}

int tdm_pp_chunk_rank(const tdm_pp_schedule *s, int chunk) {
  TDM__NONNULL(s, -1, "tdm_pp_chunk_rank: the schedule s is NULL");
  return chunk % s->P;
}

/* ---- building ---------------------------------------------------------------------------------- */
tdm_status tdm_pp_schedule_alloc(tdm_pp_schedule **out, tdm_pp_schedule_kind kind, int P, int V, int M) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: out is NULL");
  *out = NULL;
  /* a rank's actions (about 6 V M) are indexed in 24 bits, and the verifier keeps a V M table */
  if (P < 1 || V < 1 || M < 1 || P > 4096 || V > 256 || M > (1 << 20) || (P == 1 && V > 1) || (int64_t)V * M > (1 << 20))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline schedule: %d ranks, %d chunks per rank, %d micro-batches; expected 1..4096 ranks, "
                          "1..256 chunks per rank (1 on a single rank), 1..2^20 micro-batches, chunks x micro-batches at most 2^20",
                          P, V, M);
  tdm_pp_schedule *s = tdm__calloc(1, sizeof *s);
  if (!s) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  s->kind = kind, s->P = P, s->V = V, s->M = M;
  s->n = tdm__calloc((size_t)P, sizeof(int));
  s->cap = tdm__calloc((size_t)P, sizeof(int));
  s->a = tdm__calloc((size_t)P, sizeof(tdm_pp_action *));
  s->peak = tdm__calloc((size_t)P, sizeof(int));
  if (!s->n || !s->cap || !s->a || !s->peak) {
    tdm_pp_schedule_destroy(s);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  }
  *out = s;
  return TDM_OK;
}

void tdm_pp_schedule_destroy(tdm_pp_schedule *s) {
  if (!s) return;
  for (int r = 0; s->a && r < s->P; r++) tdm__free(s->a[r]);
  tdm__free(s->a);
  tdm__free(s->n);
  tdm__free(s->cap);
  tdm__free(s->peak);
  tdm__free(s);
}

tdm_status tdm_pp_schedule_push(tdm_pp_schedule *s, int rank, tdm_pp_op op, int chunk, int mb) {
  if (!s || rank < 0 || rank >= s->P || (unsigned)op >= TDM_PP_OP_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: push to rank %d of %d, action %d", rank, s ? s->P : 0,
                          (int)op);
  if (s->n[rank] == s->cap[rank]) {
    int nc = s->cap[rank] ? 2 * s->cap[rank] : 64;
    tdm_pp_action *na = tdm__malloc(sizeof *na * (size_t)nc);
    if (!na) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
    if (s->a[rank]) memcpy(na, s->a[rank], sizeof *na * (size_t)s->n[rank]);
    tdm__free(s->a[rank]);
    s->a[rank] = na;
    s->cap[rank] = nc;
  }
  s->a[rank][s->n[rank]++] = (tdm_pp_action){op, chunk, mb, 0, 0};
  return TDM_OK;
}

/* ---- the generators ------------------------------------------------------------------------------
 * Each forward is preceded by the receive of its input and followed by the send of its output;
 * each backward by the receive of its output's gradient and followed by the send of its input's.
 * Backwards of a chunk run in micro-batch order in every schedule, so the gradients accumulate in
 * the order one process accumulating the same micro-batches uses. */
#define PUSH(op, c, m) TDM__TRY(tdm_pp_schedule_push(s, r, op, c, m))

static tdm_status emit_forward(tdm_pp_schedule *s, int r, int c, int m) {
  int C = s->P * s->V;
  if (c > 0) PUSH(TDM_PP_RECV_ACT, c, m);
  PUSH(TDM_PP_FORWARD, c, m);
  if (c < C - 1) PUSH(TDM_PP_SEND_ACT, c, m);
  return TDM_OK;
}

/* split: the input pass only (its weight pass is emitted on its own, emit_weight) */
static tdm_status emit_backward(tdm_pp_schedule *s, int r, int c, int m, int split) {
  int C = s->P * s->V;
  if (c < C - 1) PUSH(TDM_PP_RECV_GRAD, c, m);
  PUSH(split ? TDM_PP_BACKWARD_INPUT : TDM_PP_BACKWARD, c, m);
  if (c > 0) PUSH(TDM_PP_SEND_GRAD, c, m);
  return TDM_OK;
}

static tdm_status emit_weight(tdm_pp_schedule *s, int r, int c, int m) {
  PUSH(TDM_PP_BACKWARD_WEIGHT, c, m);
  return TDM_OK;
}

static tdm_status gen_gpipe(tdm_pp_schedule *s, int r) {
  for (int m = 0; m < s->M; m++) TDM__TRY(emit_forward(s, r, r, m));
  for (int m = 0; m < s->M; m++) TDM__TRY(emit_backward(s, r, r, m, 0));
  return TDM_OK;
}

static tdm_status gen_1f1b(tdm_pp_schedule *s, int r) {
  int M = s->M, w = s->P - 1 - r < M ? s->P - 1 - r : M;
  for (int m = 0; m < w; m++) TDM__TRY(emit_forward(s, r, r, m));
  for (int i = 0; i < M - w; i++) {
    TDM__TRY(emit_forward(s, r, r, w + i));
    TDM__TRY(emit_backward(s, r, r, i, 0));
  }
  for (int m = M - w; m < M; m++) TDM__TRY(emit_backward(s, r, r, m, 0));
  return TDM_OK;
}

/* Megatron's order: micro-batches in groups of P; a group runs through chunk 0 of the rank, then
 * chunk 1, ...; backwards take the chunks in reverse. Warm-up: 2 (P - r - 1) + (V - 1) P forwards. */
static void interleaved_item(const tdm_pp_schedule *s, int i, int forward, int *k, int *m) {
  int P = s->P, V = s->V, M = s->M;
  int g = i / (P * V), first = g * P, size = M - first < P ? M - first : P; /* the last group may be smaller */
  int j = i - g * P * V;
  *k = j / size;
  *m = first + j % size;
  if (!forward) *k = V - 1 - *k;
}

/* As Megatron runs it: each exchange comes after the compute and sends what it made while it
 * receives the inputs of the next forward and backward (send_forward_backward_recv_forward_backward),
 * so the neighbours' exchanges pair up even when a send waits for its receiver. */
static tdm_status gen_interleaved(tdm_pp_schedule *s, int r) {
  int P = s->P, C = P * s->V, total = s->M * s->V, k, m;
  int warm = 2 * (P - r - 1) + (s->V - 1) * P;
  if (s->M == P || warm > total) warm = total; /* Megatron: with M = P every forward comes first */
#define FWD(i, c, mb) (interleaved_item(s, i, 1, &k, &mb), c = k * P + r)
#define BWD(i, c, mb) (interleaved_item(s, i, 0, &k, &mb), c = k * P + r)
  int c, c2, m2;
  FWD(0, c, m);
  if (c > 0) PUSH(TDM_PP_RECV_ACT, c, m);
  /* warm-up forwards */
  for (int i = 0; i < warm; i++) {
    FWD(i, c, m);
    PUSH(TDM_PP_FORWARD, c, m);
    if (c < C - 1) PUSH(TDM_PP_SEND_ACT, c, m);
    if (i + 1 < total) {
      FWD(i + 1, c2, m2);
      if (c2 > 0) PUSH(TDM_PP_RECV_ACT, c2, m2);
    }
    if (i == warm - 1) { /* the first backward's gradient */
      BWD(0, c2, m2);
      if (c2 < C - 1) PUSH(TDM_PP_RECV_GRAD, c2, m2);
    }
  }
  if (warm == 0) {
    BWD(0, c2, m2);
    if (c2 < C - 1) PUSH(TDM_PP_RECV_GRAD, c2, m2);
  }
  /* steady: forward, backward, one exchange */
  for (int i = 0; i < total - warm; i++) {
    int f = warm + i;
    FWD(f, c, m);
    PUSH(TDM_PP_FORWARD, c, m);
    BWD(i, c2, m2);
    PUSH(TDM_PP_BACKWARD, c2, m2);
    if (c < C - 1) PUSH(TDM_PP_SEND_ACT, c, m);
    if (c2 > 0) PUSH(TDM_PP_SEND_GRAD, c2, m2);
    if (f + 1 < total) {
      FWD(f + 1, c, m);
      if (c > 0) PUSH(TDM_PP_RECV_ACT, c, m);
    }
    if (i + 1 < total) {
      BWD(i + 1, c2, m2);
      if (c2 < C - 1) PUSH(TDM_PP_RECV_GRAD, c2, m2);
    }
  }
  /* cool-down backwards */
  for (int i = total - warm; i < total; i++) {
    BWD(i, c2, m2);
    PUSH(TDM_PP_BACKWARD, c2, m2);
    if (c2 > 0) PUSH(TDM_PP_SEND_GRAD, c2, m2);
    if (i + 1 < total) {
      BWD(i + 1, c2, m2);
      if (c2 < C - 1) PUSH(TDM_PP_RECV_GRAD, c2, m2);
    }
  }
#undef FWD
#undef BWD
  return TDM_OK;
}

/* ZB-H1: 1F1B's order of forwards and input passes; rank r runs each weight pass r input passes
 * late (keeping at most P micro-batches, 1F1B's first rank's peak), and the ones left at the end
 * fill what would be 1F1B's cool-down bubble. */
static tdm_status gen_zb1p(tdm_pp_schedule *s, int r) {
  int M = s->M, w = s->P - 1 - r < M ? s->P - 1 - r : M, next_w = 0;
  for (int m = 0; m < w; m++) TDM__TRY(emit_forward(s, r, r, m));
  for (int i = 0; i < M; i++) {
    if (i < M - w) TDM__TRY(emit_forward(s, r, r, w + i));
    TDM__TRY(emit_backward(s, r, r, i, 1));
    if (i - next_w + 1 > r) TDM__TRY(emit_weight(s, r, r, next_w++));
  }
  while (next_w < M) TDM__TRY(emit_weight(s, r, r, next_w++));
  return TDM_OK;
}

tdm_status tdm__pp_schedule_generate(tdm_pp_schedule *s) {
  tdm_status st = TDM_OK;
  for (int r = 0; st == TDM_OK && r < s->P; r++) {
    if (s->kind == TDM_PP_ZB1P) st = gen_zb1p(s, r);
    else if (s->kind == TDM_PP_GPIPE) st = gen_gpipe(s, r);
    else if (s->kind == TDM_PP_1F1B) st = gen_1f1b(s, r);
    else if (s->kind == TDM_PP_INTERLEAVED) st = gen_interleaved(s, r);
    if (st == TDM_OK) st = tdm_pp_schedule_push(s, r, TDM_PP_OPTIM, -1, -1);
  }
  return st;
}

tdm_status tdm_pp_schedule_create(tdm_pp_schedule **out, tdm_pp_schedule_kind kind, int P, int V, int M) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: out is NULL");
  *out = NULL;
  if ((unsigned)kind >= TDM_PP_SCHEDULE_COUNT)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: kind %d; expected 0..%d", (int)kind, TDM_PP_SCHEDULE_COUNT - 1);
  if (kind != TDM_PP_INTERLEAVED && V != 1)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule %s: %d virtual stages per rank; only interleaved takes more than 1",
                          kind_names[kind], V);
  if (kind == TDM_PP_INTERLEAVED && (P < 2 || V < 2))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline schedule interleaved: %d pipeline ranks, %d virtual stages per rank; expected at least 2 "
                          "of each (use 1f1b otherwise)", P, V);
  /* Megatron's groups of P micro-batches: with a smaller last group the order can deadlock (the
   * verifier finds, e.g., P 4, V 3, M 5 waiting in a cycle), so whole groups only */
  if (kind == TDM_PP_INTERLEAVED && (M < P || M % P))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline schedule interleaved: %d micro-batches for %d pipeline ranks; it needs a multiple of the "
                          "ranks, at least %d (give --microbatches %d or %d, or use 1f1b)",
                          M, P, P, M < P ? P : M / P * P, (M / P + 1) * P);
  tdm_pp_schedule *s;
  TDM__TRY(tdm_pp_schedule_alloc(&s, kind, P, V, M));
  tdm_status st = tdm__pp_schedule_generate(s);
  if (st == TDM_OK) st = tdm_pp_schedule_verify(s, NULL);
  if (st != TDM_OK) {
    tdm_pp_schedule_destroy(s);
    return st;
  }
  *out = s;
  return TDM_OK;
}
#undef PUSH

/* ---- the verifier ------------------------------------------------------------------------------
 * The simulation runs a list as the engine does. The main thread computes; a run of consecutive
 * sends and receives is one exchange, which it hands to its communication thread and goes on. That
 * thread runs exchanges one at a time in order (tdm_comm_p2p_batch); a message moves once its
 * sender and its receiver are both in the exchanges that hold it (the worst case of every
 * transport: a send may wait for its receiver) and an exchange ends when all of its messages have
 * moved. A forward waits for the exchange that brings its input, a backward for the one that brings
 * its output's gradient, the optimizer for every exchange. Messages from one rank to another
 * arrive in the order they were sent. */
enum { F_GOT_ACT = 1, F_FWD = 2, F_SENT_ACT = 4, F_GOT_GRAD = 8, F_BWD_IN = 16, F_BWD_W = 32, F_SENT_GRAD = 64, F_SPLIT = 128 };

static const char *what(const tdm_pp_action *a, char *b, size_t n) {
  if (a->op == TDM_PP_OPTIM) snprintf(b, n, "%s", op_names[a->op]);
  else snprintf(b, n, "%s, chunk %d, micro-batch %d", tdm_pp_op_name(a->op), a->chunk, a->mb);
  return b;
}

static tdm_status bad(const tdm_pp_schedule *s, int r, int i, const char *why) {
  char b[96];
  return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule %s (P %d, V %d, M %d): rank %d, action %d (%s): %s",
                        tdm_pp_schedule_name(s->kind), s->P, s->V, s->M, r, i, what(&s->a[r][i], b, sizeof b), why);
}

/* Each rank's list on its own: what it runs is its own, in an order its data allow, and complete. */
static tdm_status check_rank(const tdm_pp_schedule *s, int r, unsigned *fl) {
  int P = s->P, V = s->V, M = s->M, C = P * V, optim = -1;
  memset(fl, 0, sizeof *fl * (size_t)V * (size_t)M);
  for (int i = 0; i < s->n[r]; i++) {
    const tdm_pp_action *a = &s->a[r][i];
    if ((unsigned)a->op >= TDM_PP_OP_COUNT) return bad(s, r, i, "unknown action");
    if (optim >= 0) return bad(s, r, i, "comes after the optimizer step");
    if (a->op == TDM_PP_OPTIM) {
      optim = i;
      continue;
    }
    char why[160];
    if (a->chunk < 0 || a->chunk >= C) {
      snprintf(why, sizeof why, "chunk %d does not exist: the model has %d (0..%d)", a->chunk, C, C - 1);
      return bad(s, r, i, why);
    }
    if (a->chunk % P != r) {
      snprintf(why, sizeof why, "chunk %d lives on rank %d", a->chunk, a->chunk % P);
      return bad(s, r, i, why);
    }
    if (a->mb < 0 || a->mb >= M) {
      snprintf(why, sizeof why, "micro-batch %d does not exist: the step has %d (0..%d)", a->mb, M, M - 1);
      return bad(s, r, i, why);
    }
    unsigned *f = &fl[(a->chunk / P) * M + a->mb];
    int first = a->chunk == 0, last = a->chunk == C - 1;
#define NEED(cond, msg)                    \
  do {                                     \
    if (!(cond)) return bad(s, r, i, msg); \
  } while (0)
#define ONCE(bit) NEED(!(*f & (bit)), "appears twice")
    switch (a->op) {
    case TDM_PP_RECV_ACT:
      NEED(!first, "the first chunk has no chunk before it to receive from");
      ONCE(F_GOT_ACT);
      *f |= F_GOT_ACT;
      break;
    case TDM_PP_FORWARD:
      ONCE(F_FWD);
      NEED(first || (*f & F_GOT_ACT), "runs before its input is received");
      *f |= F_FWD;
      break;
    case TDM_PP_SEND_ACT:
      NEED(!last, "the last chunk has no chunk after it to send to");
      ONCE(F_SENT_ACT);
      NEED(*f & F_FWD, "sends an output its forward has not made yet");
      *f |= F_SENT_ACT;
      break;
    case TDM_PP_RECV_GRAD:
      NEED(!last, "the last chunk has no chunk after it to receive a gradient from");
      ONCE(F_GOT_GRAD);
      *f |= F_GOT_GRAD;
      break;
    case TDM_PP_BACKWARD:
    case TDM_PP_BACKWARD_INPUT:
      ONCE(F_BWD_IN);
      NEED(*f & F_FWD, "runs before its forward");
      NEED(last || (*f & F_GOT_GRAD), "runs before the gradient of its output is received");
      *f |= F_BWD_IN | (a->op == TDM_PP_BACKWARD ? F_BWD_W : F_SPLIT);
      break;
    case TDM_PP_BACKWARD_WEIGHT:
      ONCE(F_BWD_W);
      NEED(*f & F_SPLIT, "runs before its input pass (backward (input))");
      *f |= F_BWD_W;
      break;
    case TDM_PP_SEND_GRAD:
      NEED(!first, "the first chunk has no chunk before it to send a gradient to");
      ONCE(F_SENT_GRAD);
      NEED(*f & F_BWD_IN, "sends a gradient its backward has not made yet");
      *f |= F_SENT_GRAD;
      break;
    default:
      break;
    }
#undef ONCE
#undef NEED
  }
  /* complete: every chunk micro-batch of this rank, each part once */
  static const struct {
    unsigned bit;
    tdm_pp_op op;
  } parts[] = {{F_GOT_ACT, TDM_PP_RECV_ACT},   {F_FWD, TDM_PP_FORWARD},     {F_SENT_ACT, TDM_PP_SEND_ACT},
               {F_GOT_GRAD, TDM_PP_RECV_GRAD}, {F_BWD_IN, TDM_PP_BACKWARD}, {F_BWD_W, TDM_PP_BACKWARD_WEIGHT},
               {F_SENT_GRAD, TDM_PP_SEND_GRAD}};
  for (int k = 0; k < V; k++)
    for (int m = 0; m < M; m++) {
      int c = k * P + r;
      unsigned f = fl[k * M + m], want = F_FWD | F_BWD_IN | F_BWD_W;
      if (c > 0) want |= F_GOT_ACT | F_SENT_GRAD;
      if (c < C - 1) want |= F_SENT_ACT | F_GOT_GRAD;
      for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        if ((want & parts[p].bit) && !(f & parts[p].bit))
          return tdm__set_error(TDM_ERR_INVALID_ARG,
                                "pipeline schedule %s (P %d, V %d, M %d): rank %d never runs '%s' for chunk %d, micro-batch %d",
                                tdm_pp_schedule_name(s->kind), P, V, M, r, tdm_pp_op_name(parts[p].op), c, m);
    }
  if (optim < 0)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule %s (P %d, V %d, M %d): rank %d has no optimizer step",
                          tdm_pp_schedule_name(s->kind), P, V, M, r);
  return TDM_OK;
}

static int is_send(tdm_pp_op op) { return op == TDM_PP_SEND_ACT || op == TDM_PP_SEND_GRAD; }
static int is_recv(tdm_pp_op op) { return op == TDM_PP_RECV_ACT || op == TDM_PP_RECV_GRAD; }
static int is_comm(tdm_pp_op op) { return is_send(op) || is_recv(op); }

/* The peer of a send or receive, and the message as the receiver names it: (kind, chunk, mb). */
static int peer_of(const tdm_pp_schedule *s, const tdm_pp_action *a, int *kind, int *chunk) {
  *kind = a->op == TDM_PP_SEND_ACT || a->op == TDM_PP_RECV_ACT ? 0 : 1;
  switch (a->op) {
  case TDM_PP_SEND_ACT: *chunk = a->chunk + 1; return (a->chunk + 1) % s->P;
  case TDM_PP_RECV_ACT: *chunk = a->chunk; return (a->chunk - 1) % s->P;
  case TDM_PP_SEND_GRAD: *chunk = a->chunk - 1; return (a->chunk - 1) % s->P;
  case TDM_PP_RECV_GRAD: *chunk = a->chunk; return (a->chunk + 1) % s->P;
  default: *chunk = -1; return -1;
  }
}
static const char *kind_word[] = {"activation", "gradient"};

static double cost_of(const tdm_pp_costs *c, tdm_pp_op op) {
  switch (op) {
  case TDM_PP_FORWARD: return c->forward;
  case TDM_PP_BACKWARD: return c->backward;
  case TDM_PP_BACKWARD_INPUT: return c->backward_input;
  case TDM_PP_BACKWARD_WEIGHT: return c->backward_weight;
  default: return 0;
  }
}

typedef struct {
  int *v, n, cap;
} ivec;
static int ivec_push(ivec *v, int x) {
  if (v->n == v->cap) {
    int nc = v->cap ? 2 * v->cap : 16;
    int *nv = tdm__malloc(sizeof(int) * (size_t)nc);
    if (!nv) return 0;
    if (v->v) memcpy(nv, v->v, sizeof(int) * (size_t)v->n);
    tdm__free(v->v);
    v->v = nv, v->cap = nc;
  }
  v->v[v->n++] = x;
  return 1;
}

typedef struct {
  const tdm_pp_schedule *s;
  int P;
  int **partner; /* partner[r][i]: rank * 2^24 + action index of the other end, -1 for compute */
  int **ex;      /* ex[r][i]: the exchange (first action index) action i belongs to, -1 for compute */
  char **moved;
  double **mt;   /* when the message moved */
} sim;

static void sim_free(sim *m) {
  for (int r = 0; r < m->P; r++) {
    if (m->partner) tdm__free(m->partner[r]);
    if (m->ex) tdm__free(m->ex[r]);
    if (m->moved) tdm__free(m->moved[r]);
    if (m->mt) tdm__free(m->mt[r]);
  }
  tdm__free(m->partner), tdm__free(m->ex), tdm__free(m->moved), tdm__free(m->mt);
}

#define PR(x) ((x) >> 24)
#define PI(x) ((x) & 0xffffff)

/* Pairs the k-th send from a to b with the k-th receive on b from a, and checks they name the same
 * message. */
static tdm_status match(tdm_pp_schedule *s, sim *m) {
  int P = s->P;
  char b1[96], why[320];
  ivec *out = tdm__calloc((size_t)P * (size_t)P, sizeof *out), *in = tdm__calloc((size_t)P * (size_t)P, sizeof *in);
  tdm_status st = out && in ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  for (int r = 0; st == TDM_OK && r < P; r++)
    for (int i = 0; i < s->n[r]; i++) {
      int kind, chunk, peer = peer_of(s, &s->a[r][i], &kind, &chunk);
      if (peer < 0) continue;
      ivec *v = is_send(s->a[r][i].op) ? &out[r * P + peer] : &in[r * P + peer];
      if (!ivec_push(v, i)) {
        st = tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
        break;
      }
    }
  for (int a = 0; st == TDM_OK && a < P; a++)
    for (int b = 0; st == TDM_OK && b < P; b++) {
      ivec *o = &out[a * P + b], *iv = &in[b * P + a];
      for (int k = 0; k < o->n && k < iv->n; k++) {
        const tdm_pp_action *sa = &s->a[a][o->v[k]], *ra = &s->a[b][iv->v[k]];
        int sk, sc, rk, rc;
        peer_of(s, sa, &sk, &sc);
        peer_of(s, ra, &rk, &rc);
        if (sk != rk || sc != rc || sa->mb != ra->mb) {
          snprintf(why, sizeof why,
                   "the next message from rank %d is the %s for chunk %d, micro-batch %d (its action %d, %s): messages "
                   "between two ranks arrive in the order sent",
                   a, kind_word[sk], sc, sa->mb, o->v[k], what(sa, b1, sizeof b1));
          st = bad(s, b, iv->v[k], why);
          break;
        }
        m->partner[a][o->v[k]] = b << 24 | iv->v[k];
        m->partner[b][iv->v[k]] = a << 24 | o->v[k];
      }
      if (st == TDM_OK && o->n > iv->n) {
        snprintf(why, sizeof why, "rank %d never receives it", b);
        st = bad(s, a, o->v[iv->n], why);
      } else if (st == TDM_OK && iv->n > o->n) {
        snprintf(why, sizeof why, "waits forever: rank %d never sends it", a);
        st = bad(s, b, iv->v[o->n], why);
      }
    }
  for (int k = 0; out && in && k < P * P; k++) tdm__free(out[k].v), tdm__free(in[k].v);
  tdm__free(out), tdm__free(in);
  return st;
}

/* Ranks that did not finish wait on each other: from r, follow each rank's exchange to the peer of
 * its first message that has not moved, until a rank repeats, and name that cycle. */
static tdm_status deadlock(const tdm_pp_schedule *s, const sim *m, const int *cur, int r) {
  int P = s->P, x = r;
  char msgbuf[1024], b[96];
  int *seen = tdm__calloc((size_t)P, sizeof(int)), *at_action = tdm__calloc((size_t)P, sizeof(int));
  if (!seen || !at_action) {
    tdm__free(seen), tdm__free(at_action);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  }
  for (int q = 0; q < P; q++) { /* the first message of q's current exchange that has not moved */
    at_action[q] = -1;
    for (int i = cur[q]; i >= 0 && i < s->n[q] && m->ex[q][i] == cur[q]; i++)
      if (!m->moved[q][i]) {
        at_action[q] = i;
        break;
      }
  }
  while (!seen[x] && at_action[x] >= 0) {
    seen[x] = 1;
    x = PR(m->partner[x][at_action[x]]);
  }
  if (at_action[x] < 0) { /* cannot happen: a rank that waits has an exchange that waits */
    tdm__free(seen), tdm__free(at_action);
    return tdm__set_error(TDM_ERR_INTERNAL, "pipeline schedule: rank %d stops without waiting", x);
  }
  size_t at = (size_t)snprintf(msgbuf, sizeof msgbuf, "pipeline schedule %s (P %d, V %d, M %d) deadlocks: rank %d",
                               tdm_pp_schedule_name(s->kind), P, s->V, s->M, x);
  int start = x;
  do {
    int i = at_action[x], nx = PR(m->partner[x][i]);
    at += (size_t)snprintf(msgbuf + at, at < sizeof msgbuf ? sizeof msgbuf - at : 0, "%s waits at action %d (%s) for rank %d",
                           x == start ? "" : ", which", i, what(&s->a[x][i], b, sizeof b), nx);
    x = nx;
  } while (x != start && at < sizeof msgbuf);
  tdm__free(seen), tdm__free(at_action);
  return tdm__set_error(TDM_ERR_INVALID_ARG, "%s", msgbuf);
}

/* For every compute action of rank r, the action whose exchange brings its input: the nearest
 * earlier receive of its activation (forward) or of its output's gradient (backward), -1 when
 * none; in inp[i]. One pass with a table of the last receive per (kind, chunk, micro-batch), left
 * all -1 again (a backward search per action made a schedule of 16,384 micro-batches take 35 s). */
static void inputs_of(const tdm_pp_schedule *s, int r, int *inp, int *table) {
  int V = s->V, M = s->M;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < s->n[r]; i++) {
      const tdm_pp_action *a = &s->a[r][i];
      int kind = a->op == TDM_PP_RECV_ACT || a->op == TDM_PP_FORWARD ? 0
                 : a->op == TDM_PP_RECV_GRAD || a->op == TDM_PP_BACKWARD || a->op == TDM_PP_BACKWARD_INPUT ? 1 : -1;
      int lc = a->chunk / s->P;
      if (pass == 0) inp[i] = -1;
      if (kind < 0 || lc < 0 || lc >= V || a->mb < 0 || a->mb >= M) continue; /* (check_rank names such actions) */
      int *slot = &table[((size_t)kind * (size_t)V + (size_t)lc) * (size_t)M + (size_t)a->mb];
      if (pass == 1) *slot = -1;
      else if (a->op == TDM_PP_RECV_ACT || a->op == TDM_PP_RECV_GRAD) *slot = i;
      else inp[i] = *slot;
    }
}

tdm_status tdm_pp_schedule_verify(tdm_pp_schedule *s, const tdm_pp_costs *costs) {
  if (!s) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: NULL");
  tdm_pp_costs unit = {1, 2, 1, 1};
  if (!costs) costs = &unit;
  int P = s->P, V = s->V, M = s->M;
  sim m = {s, P, tdm__calloc((size_t)P, sizeof(int *)), tdm__calloc((size_t)P, sizeof(int *)),
           tdm__calloc((size_t)P, sizeof(char *)), tdm__calloc((size_t)P, sizeof(double *))};
  unsigned *fl = tdm__malloc(sizeof(unsigned) * (size_t)V * (size_t)M);
  /* per rank: the main thread's next action and time; the exchanges it has issued, which its
   * communication thread runs in order: the current one (its first action), and when it started */
  int *pc = tdm__calloc((size_t)P, sizeof(int)), *held = tdm__calloc((size_t)P, sizeof(int)), *scan = tdm__calloc((size_t)P, sizeof(int));
  int **inp = tdm__calloc((size_t)P, sizeof(int *)), *table = tdm__malloc(sizeof(int) * 2 * (size_t)V * (size_t)M);
  int *cur = tdm__malloc(sizeof(int) * (size_t)P), *issued = tdm__calloc((size_t)P, sizeof(int));
  double *t = tdm__calloc((size_t)P, sizeof(double)), *busy = tdm__calloc((size_t)P, sizeof(double));
  double *comm_free = tdm__calloc((size_t)P, sizeof(double));
  tdm_status st = fl && pc && held && scan && inp && table && cur && issued && t && busy && comm_free && m.partner && m.ex && m.moved && m.mt
                      ? TDM_OK
                      : tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  for (int r = 0; st == TDM_OK && r < P; r++) {
    size_t n = (size_t)(s->n[r] ? s->n[r] : 1);
    m.partner[r] = tdm__malloc(sizeof(int) * n), m.ex[r] = tdm__malloc(sizeof(int) * n);
    m.moved[r] = tdm__calloc(n, 1), m.mt[r] = tdm__calloc(n, sizeof(double));
    inp[r] = tdm__malloc(sizeof(int) * n);
    if (!m.partner[r] || !m.ex[r] || !m.moved[r] || !m.mt[r] || !inp[r]) {
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
      break;
    }
    for (int i = 0; i < s->n[r]; i++) {
      m.partner[r][i] = -1;
      m.ex[r][i] = !is_comm(s->a[r][i].op) ? -1 : i > 0 && m.ex[r][i - 1] >= 0 ? m.ex[r][i - 1] : i;
      s->a[r][i].start = s->a[r][i].end = -1;
    }
    s->peak[r] = 0;
    cur[r] = -1;
  }
  for (int r = 0; st == TDM_OK && r < P; r++) st = check_rank(s, r, fl);
  if (st == TDM_OK) {
    for (size_t k = 0; k < 2 * (size_t)V * (size_t)M; k++) table[k] = -1;
    for (int r = 0; r < P; r++) inputs_of(s, r, inp[r], table);
  }
  if (st == TDM_OK) st = match(s, &m);
  /* an exchange has ended when its last action has an end time */
#define ENDED(r, e) (s->a[r][ex_last(s, &m, r, e)].end >= 0)
  for (int progress = 1; st == TDM_OK && progress;) {
    progress = 0;
    for (int r = 0; r < P; r++) {
      /* the main thread: issues exchanges, computes when its inputs are there */
      while (pc[r] < s->n[r]) {
        tdm_pp_action *a = &s->a[r][pc[r]];
        if (is_comm(a->op)) { /* issue the exchange; it starts when the ones before it have ended */
          int e = pc[r];
          while (pc[r] < s->n[r] && m.ex[r][pc[r]] == e) s->a[r][pc[r]++].start = t[r]; /* issued at */
          issued[r]++;
          progress = 1;
          continue;
        }
        double ready = t[r];
        if (a->op == TDM_PP_OPTIM) { /* after every exchange */
          int last = -1;
          for (int j = pc[r] - 1; j >= 0 && last < 0; j--)
            if (is_comm(s->a[r][j].op)) last = j;
          if (last >= 0 && s->a[r][last].end < 0) break;
          if (last >= 0 && s->a[r][last].end > ready) ready = s->a[r][last].end;
        } else {
          int in = inp[r][pc[r]];
          if (in >= 0 && s->a[r][in].end < 0) break; /* waits for that exchange */
          if (in >= 0 && s->a[r][in].end > ready) ready = s->a[r][in].end;
        }
        double c = cost_of(costs, a->op);
        a->start = ready;
        a->end = t[r] = ready + c;
        busy[r] += c;
        if (a->op == TDM_PP_FORWARD && ++held[r] > s->peak[r]) s->peak[r] = held[r];
        if (a->op == TDM_PP_BACKWARD || a->op == TDM_PP_BACKWARD_WEIGHT) held[r]--;
        pc[r]++;
        progress = 1;
      }
      /* the communication thread: the oldest issued exchange that has not ended */
      for (;;) {
        if (cur[r] < 0) { /* the next issued exchange, if any */
          /* exchanges end in the order issued: scan[r] passes the ended ones and the actions that
             start none, once (a scan from 0 each time was quadratic) */
          while (scan[r] < pc[r] && !(m.ex[r][scan[r]] == scan[r] && s->a[r][scan[r]].end < 0 && s->a[r][scan[r]].start >= 0))
            scan[r]++;
          int next = scan[r] < pc[r] ? scan[r] : -1;
          if (next < 0) break;
          cur[r] = next;
          double st0 = s->a[r][next].start > comm_free[r] ? s->a[r][next].start : comm_free[r];
          for (int j = next; j < s->n[r] && m.ex[r][j] == next; j++) s->a[r][j].start = st0;
        }
        int e = cur[r], all = 1, i;
        double end = s->a[r][e].start;
        for (i = e; i < s->n[r] && m.ex[r][i] == e; i++) {
          if (!m.moved[r][i]) {
            int q = PR(m.partner[r][i]), j = PI(m.partner[r][i]);
            if (cur[q] >= 0 && m.ex[q][j] == cur[q]) { /* the other end is in its exchange */
              double tm = s->a[r][i].start > s->a[q][j].start ? s->a[r][i].start : s->a[q][j].start;
              m.moved[r][i] = m.moved[q][j] = 1;
              m.mt[r][i] = m.mt[q][j] = tm;
              progress = 1;
            }
          }
          if (!m.moved[r][i]) all = 0;
          else if (m.mt[r][i] > end) end = m.mt[r][i];
        }
        if (!all) break;
        for (int k = e; k < i; k++) s->a[r][k].end = end;
        comm_free[r] = end;
        cur[r] = -1;
        progress = 1;
      }
    }
  }
#undef ENDED
  for (int r = 0; st == TDM_OK && r < P; r++)
    if (pc[r] < s->n[r] || cur[r] >= 0) st = deadlock(s, &m, cur, r);
  if (st == TDM_OK) {
    double mk = 0, sum = 0;
    for (int r = 0; r < P; r++)
      for (int i = 0; i < s->n[r]; i++)
        if (cost_of(costs, s->a[r][i].op) > 0 && s->a[r][i].end > mk) mk = s->a[r][i].end;
    for (int r = 0; r < P; r++) sum += busy[r];
    s->makespan = mk;
    s->busy = sum;
    s->bubble = mk > 0 ? (P * mk - sum) / (P * mk) : 0;
    s->bubble_ratio = sum > 0 ? (P * mk - sum) / sum : 0;
  }
  sim_free(&m);
  for (int r = 0; inp && r < P; r++) tdm__free(inp[r]);
  tdm__free(inp), tdm__free(table), tdm__free(scan);
  tdm__free(fl), tdm__free(pc), tdm__free(held), tdm__free(cur), tdm__free(issued), tdm__free(t), tdm__free(busy);
  tdm__free(comm_free);
  return st;
}
#undef PR
#undef PI

/* ---- drawing ------------------------------------------------------------------------------------- */
static char letter(tdm_pp_op op) {
  return op == TDM_PP_FORWARD ? 'F' : op == TDM_PP_BACKWARD ? 'B' : op == TDM_PP_BACKWARD_INPUT ? 'b' : 'W';
}

tdm_status tdm_pp_schedule_write_trace(const tdm_pp_schedule *s, const char *path, double unit_us) {
  if (!s || !path) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline trace: NULL argument");
  if (unit_us <= 0) unit_us = 1000;
  FILE *f = fopen(path, "w");
  if (!f) return tdm__set_error(TDM_ERR_IO, "pipeline trace: cannot write %s", path);
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":\"%s\",\"P\":%d,\"V\":%d,\"M\":%d,\"bubble\":%.6f},"
             "\"traceEvents\":[\n", tdm_pp_schedule_name(s->kind), s->P, s->V, s->M, s->bubble);
  int first = 1;
  for (int r = 0; r < s->P; r++) {
    fprintf(f, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d\"}}", first ? "" : ",\n", r, r);
    first = 0;
    for (int i = 0; i < s->n[r]; i++) {
      const tdm_pp_action *a = &s->a[r][i];
      if (a->op > TDM_PP_BACKWARD_WEIGHT) continue;
      fprintf(f, ",\n{\"name\":\"%c%d\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                 "\"args\":{\"chunk\":%d,\"micro_batch\":%d}}",
              letter(a->op), a->mb, tdm_pp_op_name(a->op), r, a->start * unit_us, (a->end - a->start) * unit_us, a->chunk, a->mb);
    }
  }
  fprintf(f, "\n]}\n");
  int bad_write = ferror(f);
  if (fclose(f) != 0 || bad_write) return tdm__set_error(TDM_ERR_IO, "pipeline trace: writing %s failed", path);
  return TDM_OK;
}

void tdm_pp_schedule_draw(const tdm_pp_schedule *s, char *buf, size_t n) {
  if (!buf || !n) return;
  size_t at = 0;
  buf[0] = 0;
  TDM__NONNULL(s, , "tdm_pp_schedule_draw: the schedule s is NULL");
  int width = (int)(s->makespan + 0.5);
  for (int r = 0; r < s->P && at + 1 < n; r++) { /* two characters per cost unit: F3, B3, b3 (input pass), W3 */
    int w = snprintf(buf + at, n - at, "rank %d |", r);
    if (w < 0 || (size_t)w >= n - at) { /* no room for the row: the rows that fit (the untruncated length ran past n) */
      buf[at] = 0;
      return;
    }
    at += (size_t)w;
    for (int x = 0; x < width && at + 3 < n; x++) {
      const tdm_pp_action *hit = NULL;
      for (int i = 0; i < s->n[r] && !hit; i++) {
        const tdm_pp_action *a = &s->a[r][i];
        if (a->op <= TDM_PP_BACKWARD_WEIGHT && a->start <= x + 0.5 && a->end > x + 0.5) hit = a;
      }
      buf[at++] = hit ? letter(hit->op) : '.';
      buf[at++] = hit ? (char)('0' + hit->mb % 10) : '.';
    }
    if (at + 2 < n) buf[at++] = '|', buf[at++] = '\n';
    buf[at] = 0;
  }
}

/* ---- the cut ---------------------------------------------------------------------------------------- */
tdm_status tdm_pp_partition(int n_layers, int C, const int *split, int n_split, double first_cost, double block_cost,
                            double last_cost, int *first_block) {
  if (!first_block || C < 1) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline cut: %d chunks", C);
  if (!(first_cost >= 0 && block_cost >= 0 && last_cost >= 0 && first_cost + block_cost + last_cost < 1e300))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline cut: costs %g, %g, %g (first, block, last); expected finite values >= 0",
                          first_cost, block_cost, last_cost);
  if (C > n_layers)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline cut: %d chunks (pipeline ranks x virtual stages) for %d transformer blocks; every chunk "
                          "needs at least one block: use at most %d",
                          C, n_layers, n_layers);
  if (split && n_split > 0) {
    if (n_split != C)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "--pp-split gives %d counts; expected %d (one per chunk: pipeline ranks x virtual stages)",
                            n_split, C);
    int64_t sum = 0;
    for (int c = 0; c < C; c++) {
      if (split[c] < 1)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "--pp-split: chunk %d gets %d blocks; expected at least 1", c, split[c]);
      sum += split[c];
    }
    if (sum != n_layers)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "--pp-split adds up to %lld blocks; the model has %d", (long long)sum, n_layers);
    first_block[0] = 0;
    for (int c = 0; c < C; c++) first_block[c + 1] = first_block[c] + split[c];
    return TDM_OK;
  }
  /* best[c][l]: the least possible most-expensive chunk when chunks 0..c-1 hold blocks 0..l-1 */
  size_t W = (size_t)n_layers + 1;
  double *best = tdm__malloc(sizeof(double) * (size_t)(C + 1) * W);
  int *from = tdm__malloc(sizeof(int) * (size_t)(C + 1) * W);
  if (!best || !from) {
    tdm__free(best), tdm__free(from);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline cut: out of memory");
  }
  for (size_t k = 0; k < (size_t)(C + 1) * W; k++) best[k] = -1, from[k] = -1;
  best[0] = 0;
  for (int c = 1; c <= C; c++)
    for (int l = c; l <= n_layers - (C - c); l++)
      for (int j = c - 1; j < l; j++) { /* chunk c-1 holds blocks [j, l) */
        double prev = best[(size_t)(c - 1) * W + (size_t)j];
        if (prev < 0) continue;
        double cost = (l - j) * block_cost + (c == 1 ? first_cost : 0) + (c == C ? last_cost : 0);
        double v = prev > cost ? prev : cost;
        double *cell = &best[(size_t)c * W + (size_t)l];
        if (*cell < 0 || v < *cell - 1e-12 * (v > 1 ? v : 1)) *cell = v, from[(size_t)c * W + (size_t)l] = j;
      }
  int l = n_layers;
  first_block[C] = n_layers;
  for (int c = C; c >= 1; c--) {
    l = from[(size_t)c * W + (size_t)l];
    first_block[c - 1] = l;
  }
  tdm__free(best), tdm__free(from);
  return TDM_OK;
}
