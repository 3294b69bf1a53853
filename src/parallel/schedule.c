/* Pipeline schedules as data: the generators (GPipe, 1F1B, interleaved 1F1B, ZB-H1), the verifier
 * that simulates every rank's list against the others, the trace writer, and the cut of a model
 * into chunks (include/tandem/pipeline.h). */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "parallel/pipeline_impl.h"

static const char *kind_names[] = {"gpipe", "1f1b", "interleaved", "zb1p"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == TDM_PP_SCHEDULE_COUNT, "one name per schedule");
static const char *op_names[] = {"forward",       "backward",        "backward (input)", "backward (weights)",
                                 "send activation", "recv activation", "send gradient",   "recv gradient",
                                 "send tied",     "recv tied",       "optimizer"};
_Static_assert(sizeof op_names / sizeof op_names[0] == TDM_PP_OP_COUNT, "one name per action");

const char *tdm_pp_schedule_name(tdm_pp_schedule_kind k) {
  return (unsigned)k < TDM_PP_SCHEDULE_COUNT ? kind_names[k] : "?";
}
const char *tdm_pp_op_name(tdm_pp_op op) { return (unsigned)op < TDM_PP_OP_COUNT ? op_names[op] : "?"; }

tdm_status tdm_pp_schedule_parse(const char *name, tdm_pp_schedule_kind *out) {
  for (int k = 0; name && k < TDM_PP_SCHEDULE_COUNT; k++)
    if (!strcmp(name, kind_names[k])) {
      *out = (tdm_pp_schedule_kind)k;
      return TDM_OK;
    }
  return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule '%s'; expected gpipe, 1f1b, interleaved or zb1p",
                        name ? name : "(null)");
}

int tdm_pp_chunk_rank(const tdm_pp_schedule *s, int chunk) { return chunk % s->P; }

/* ---- building ---------------------------------------------------------------------------------- */
tdm_status tdm_pp_schedule_alloc(tdm_pp_schedule **out, tdm_pp_schedule_kind kind, int P, int V, int M, int tied) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: out is NULL");
  *out = NULL;
  if (P < 1 || V < 1 || M < 1 || P > 4096 || V > 256 || M > (1 << 20) || (P == 1 && V > 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline schedule: %d ranks, %d chunks per rank, %d micro-batches; expected 1..4096 ranks, "
                          "1..256 chunks per rank (1 on a single rank), 1..2^20 micro-batches",
                          P, V, M);
  tdm_pp_schedule *s = tdm__calloc(1, sizeof *s);
  if (!s) return tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  s->kind = kind, s->P = P, s->V = V, s->M = M, s->tied = tied && P > 1;
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
  if (s->tied && c == 0 && !split) PUSH(TDM_PP_RECV_TIED, c, m);
  PUSH(split ? TDM_PP_BACKWARD_INPUT : TDM_PP_BACKWARD, c, m);
  if (s->tied && c == C - 1) PUSH(TDM_PP_SEND_TIED, c, m);
  if (c > 0) PUSH(TDM_PP_SEND_GRAD, c, m);
  return TDM_OK;
}

static tdm_status emit_weight(tdm_pp_schedule *s, int r, int c, int m) {
  if (s->tied && c == 0) PUSH(TDM_PP_RECV_TIED, c, m);
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

static tdm_status gen_interleaved(tdm_pp_schedule *s, int r) {
  int P = s->P, V = s->V, total = s->M * V, k, m;
  int warm = 2 * (P - r - 1) + (V - 1) * P;
  if (s->M == P || warm > total) warm = total; /* Megatron: with M = P every forward comes first */
  for (int i = 0; i < warm; i++) {
    interleaved_item(s, i, 1, &k, &m);
    TDM__TRY(emit_forward(s, r, k * P + r, m));
  }
  for (int i = 0; i < total - warm; i++) {
    interleaved_item(s, warm + i, 1, &k, &m);
    TDM__TRY(emit_forward(s, r, k * P + r, m));
    interleaved_item(s, i, 0, &k, &m);
    TDM__TRY(emit_backward(s, r, k * P + r, m, 0));
  }
  for (int i = total - warm; i < total; i++) {
    interleaved_item(s, i, 0, &k, &m);
    TDM__TRY(emit_backward(s, r, k * P + r, m, 0));
  }
  return TDM_OK;
}

/* ZB-H1: the order of forwards and input passes is 1F1B's; a rank postpones weight passes (at most
 * P - 1 - r of them, which keeps its activations within 1F1B's peak on the first rank) and runs
 * them where it would otherwise wait for a message. Built by a unit-cost simulation of all ranks
 * (forward, input pass and weight pass one unit each), then verified like any other list. */
typedef struct {
  int r, pos, n_main;     /* the 1F1B main list: forwards and input passes, as (op, m) */
  int *main_op, *main_m;
  int *wq, wq_head, wq_tail; /* postponed weight passes (micro-batches) */
  long t;
  int done;
} zb_rank;

static tdm_status gen_zb1p(tdm_pp_schedule *s) {
  int P = s->P, M = s->M;
  zb_rank *z = tdm__calloc((size_t)P, sizeof *z);
  long *sent_act = tdm__malloc(sizeof(long) * (size_t)P * (size_t)M); /* when chunk r's output of m was sent */
  long *sent_grad = tdm__malloc(sizeof(long) * (size_t)P * (size_t)M);
  tdm_status st = z && sent_act && sent_grad ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  for (int r = 0; st == TDM_OK && r < P; r++) {
    z[r].r = r;
    z[r].main_op = tdm__malloc(sizeof(int) * 2 * (size_t)M);
    z[r].main_m = tdm__malloc(sizeof(int) * 2 * (size_t)M);
    z[r].wq = tdm__malloc(sizeof(int) * (size_t)M);
    if (!z[r].main_op || !z[r].main_m || !z[r].wq) {
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
      break;
    }
    int w = P - 1 - r < M ? P - 1 - r : M, k = 0;
    for (int m = 0; m < w; m++) z[r].main_op[k] = 0, z[r].main_m[k++] = m;
    for (int i = 0; i < M - w; i++) {
      z[r].main_op[k] = 0, z[r].main_m[k++] = w + i;
      z[r].main_op[k] = 1, z[r].main_m[k++] = i;
    }
    for (int m = M - w; m < M; m++) z[r].main_op[k] = 1, z[r].main_m[k++] = m;
    z[r].n_main = k;
  }
  for (int i = 0; st == TDM_OK && i < P * M; i++) sent_act[i] = sent_grad[i] = -1;
  int left = P;
  while (st == TDM_OK && left > 0) {
    zb_rank *q = NULL; /* the rank that is earliest in time decides next */
    for (int r = 0; r < P; r++)
      if (!z[r].done && (!q || z[r].t < q->t)) q = &z[r];
    int r = q->r, pending = q->wq_tail - q->wq_head;
    if (q->pos == q->n_main) { /* every weight pass left, then the step */
      while (st == TDM_OK && q->wq_head < q->wq_tail) st = emit_weight(s, r, r, q->wq[q->wq_head++]);
      q->done = 1, left--;
      continue;
    }
    int op = q->main_op[q->pos], m = q->main_m[q->pos];
    long ready = op == 0 ? (r == 0 ? 0 : sent_act[(r - 1) * M + m]) : (r == P - 1 ? 0 : sent_grad[(r + 1) * M + m]);
    if (ready < 0 || ready > q->t) { /* the input has not come: a postponed weight pass, or wait */
      if (pending) {
        st = emit_weight(s, r, r, q->wq[q->wq_head++]);
        q->t += 1;
      } else {
        q->t += 1;
      }
      continue;
    }
    q->pos++;
    q->t += 1;
    if (op == 0) {
      st = emit_forward(s, r, r, m);
      sent_act[r * M + m] = q->t;
    } else {
      st = emit_backward(s, r, r, m, 1);
      sent_grad[r * M + m] = q->t;
      q->wq[q->wq_tail++] = m;
      if (st == TDM_OK && q->wq_tail - q->wq_head > r) { /* too many postponed: one now */
        st = emit_weight(s, r, r, q->wq[q->wq_head++]);
        q->t += 1;
      }
    }
  }
  for (int r = 0; z && r < P; r++) tdm__free(z[r].main_op), tdm__free(z[r].main_m), tdm__free(z[r].wq);
  tdm__free(z);
  tdm__free(sent_act);
  tdm__free(sent_grad);
  return st;
}

tdm_status tdm__pp_schedule_generate(tdm_pp_schedule *s) {
  tdm_status st = TDM_OK;
  if (s->kind == TDM_PP_ZB1P) st = gen_zb1p(s);
  for (int r = 0; st == TDM_OK && r < s->P; r++) {
    if (s->kind == TDM_PP_GPIPE) st = gen_gpipe(s, r);
    else if (s->kind == TDM_PP_1F1B) st = gen_1f1b(s, r);
    else if (s->kind == TDM_PP_INTERLEAVED) st = gen_interleaved(s, r);
    if (st == TDM_OK) st = tdm_pp_schedule_push(s, r, TDM_PP_OPTIM, -1, -1);
  }
  return st;
}

tdm_status tdm_pp_schedule_create(tdm_pp_schedule **out, tdm_pp_schedule_kind kind, int P, int V, int M, int tied) {
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
  TDM__TRY(tdm_pp_schedule_alloc(&s, kind, P, V, M, tied));
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

/* ---- the verifier --------------------------------------------------------------------------------- */
enum { F_GOT_ACT = 1, F_FWD = 2, F_SENT_ACT = 4, F_GOT_GRAD = 8, F_BWD_IN = 16, F_BWD_W = 32, F_SENT_GRAD = 64,
       F_SENT_TIED = 128, F_GOT_TIED = 256, F_SPLIT = 512 };

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
    if (a->chunk < 0 || a->chunk >= C || a->chunk % P != r) {
      snprintf(why, sizeof why, "chunk %d %s", a->chunk,
               a->chunk < 0 || a->chunk >= C ? "does not exist" : "lives on another rank");
      if (a->chunk >= 0 && a->chunk < C) snprintf(why, sizeof why, "chunk %d lives on rank %d", a->chunk, a->chunk % P);
      return bad(s, r, i, why);
    }
    if (a->mb < 0 || a->mb >= M) {
      snprintf(why, sizeof why, "micro-batch %d does not exist: the step has %d (0..%d)", a->mb, M, M - 1);
      return bad(s, r, i, why);
    }
    unsigned *f = &fl[(a->chunk / P) * M + a->mb];
    int c = a->chunk, first = c == 0, last = c == C - 1;
#define NEED(cond, msg)                        \
  do {                                         \
    if (!(cond)) return bad(s, r, i, msg);     \
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
      if (a->op == TDM_PP_BACKWARD) {
        NEED(!s->tied || !first || (*f & F_GOT_TIED), "runs before the tied weight's part of the gradient is received");
        *f |= F_BWD_W;
      } else {
        *f |= F_SPLIT;
      }
      *f |= F_BWD_IN;
      break;
    case TDM_PP_BACKWARD_WEIGHT:
      ONCE(F_BWD_W);
      NEED(*f & F_SPLIT, "runs before its input pass (backward (input))");
      NEED(!s->tied || !first || (*f & F_GOT_TIED), "runs before the tied weight's part of the gradient is received");
      *f |= F_BWD_W;
      break;
    case TDM_PP_SEND_GRAD:
      NEED(!first, "the first chunk has no chunk before it to send a gradient to");
      ONCE(F_SENT_GRAD);
      NEED(*f & F_BWD_IN, "sends a gradient its backward has not made yet");
      *f |= F_SENT_GRAD;
      break;
    case TDM_PP_SEND_TIED:
      NEED(s->tied && last, "only the last chunk sends the tied weight's part, and only with a tied weight across ranks");
      ONCE(F_SENT_TIED);
      NEED(*f & F_BWD_IN, "sends what its backward has not made yet");
      *f |= F_SENT_TIED;
      break;
    case TDM_PP_RECV_TIED:
      NEED(s->tied && first, "only the first chunk receives the tied weight's part, and only with a tied weight across ranks");
      ONCE(F_GOT_TIED);
      *f |= F_GOT_TIED;
      break;
    default:
      break;
    }
#undef ONCE
#undef NEED
  }
  /* complete: every chunk micro-batch of this rank, each part once */
  for (int k = 0; k < V; k++)
    for (int m = 0; m < M; m++) {
      int c = k * P + r;
      unsigned f = fl[k * M + m], want = F_FWD | F_BWD_IN | F_BWD_W;
      if (c > 0) want |= F_GOT_ACT | F_SENT_GRAD;
      if (c < C - 1) want |= F_SENT_ACT | F_GOT_GRAD;
      if (s->tied && c == C - 1) want |= F_SENT_TIED;
      if (s->tied && c == 0) want |= F_GOT_TIED;
      if ((f & want) == want) continue;
      static const struct { unsigned bit; tdm_pp_op op; } parts[] = {
          {F_GOT_ACT, TDM_PP_RECV_ACT},   {F_FWD, TDM_PP_FORWARD},     {F_SENT_ACT, TDM_PP_SEND_ACT},
          {F_GOT_GRAD, TDM_PP_RECV_GRAD}, {F_BWD_IN, TDM_PP_BACKWARD}, {F_BWD_W, TDM_PP_BACKWARD_WEIGHT},
          {F_SENT_GRAD, TDM_PP_SEND_GRAD}, {F_SENT_TIED, TDM_PP_SEND_TIED}, {F_GOT_TIED, TDM_PP_RECV_TIED}};
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

/* Messages travel on links (from, to, kind), first in, first out, as the engine's links do. */
typedef struct {
  int chunk, mb, from_action;
  double t;
} msg;
typedef struct {
  msg *q;
  int head, tail, cap;
} link_q;

static int kind_of(tdm_pp_op op) {
  return op == TDM_PP_SEND_ACT || op == TDM_PP_RECV_ACT ? 0 : op == TDM_PP_SEND_GRAD || op == TDM_PP_RECV_GRAD ? 1 : 2;
}
static const char *kind_word[] = {"activation", "gradient", "tied"};

/* The peer of a send or receive, and the (chunk, micro-batch) the message is for at the receiver. */
static int peer_of(const tdm_pp_schedule *s, const tdm_pp_action *a, int *chunk) {
  int C = s->P * s->V;
  switch (a->op) {
  case TDM_PP_SEND_ACT: *chunk = a->chunk + 1; return (a->chunk + 1) % s->P;
  case TDM_PP_RECV_ACT: *chunk = a->chunk; return (a->chunk - 1) % s->P;
  case TDM_PP_SEND_GRAD: *chunk = a->chunk - 1; return (a->chunk - 1) % s->P;
  case TDM_PP_RECV_GRAD: *chunk = a->chunk; return (a->chunk + 1) % s->P;
  case TDM_PP_SEND_TIED: *chunk = 0; return 0;
  case TDM_PP_RECV_TIED: *chunk = 0; return (C - 1) % s->P;
  default: *chunk = -1; return -1;
  }
}

static int is_send(tdm_pp_op op) { return op == TDM_PP_SEND_ACT || op == TDM_PP_SEND_GRAD || op == TDM_PP_SEND_TIED; }
static int is_recv(tdm_pp_op op) { return op == TDM_PP_RECV_ACT || op == TDM_PP_RECV_GRAD || op == TDM_PP_RECV_TIED; }

static double cost_of(const tdm_pp_costs *c, tdm_pp_op op) {
  switch (op) {
  case TDM_PP_FORWARD: return c->forward;
  case TDM_PP_BACKWARD: return c->backward;
  case TDM_PP_BACKWARD_INPUT: return c->backward_input;
  case TDM_PP_BACKWARD_WEIGHT: return c->backward_weight;
  default: return 0;
  }
}

tdm_status tdm_pp_schedule_verify(tdm_pp_schedule *s, const tdm_pp_costs *costs) {
  if (!s) return tdm__set_error(TDM_ERR_INVALID_ARG, "pipeline schedule: NULL");
  tdm_pp_costs unit = {1, 2, 1, 1};
  if (!costs) costs = &unit;
  int P = s->P, V = s->V, M = s->M;
  unsigned *fl = tdm__malloc(sizeof(unsigned) * (size_t)V * (size_t)M);
  int *pc = tdm__calloc((size_t)P, sizeof(int)), *held = tdm__calloc((size_t)P, sizeof(int));
  double *t = tdm__calloc((size_t)P, sizeof(double)), *busy = tdm__calloc((size_t)P, sizeof(double));
  link_q *L = tdm__calloc((size_t)P * (size_t)P * 3, sizeof *L);
  char b1[96], b2[96];
  tdm_status st = fl && pc && held && t && busy && L ? TDM_OK : tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
  for (int r = 0; st == TDM_OK && r < P; r++) st = check_rank(s, r, fl);
  /* run every rank until it waits for a message not yet sent; again until nobody moves */
  for (int moved = 1; st == TDM_OK && moved;) {
    moved = 0;
    for (int r = 0; st == TDM_OK && r < P; r++) {
      for (; st == TDM_OK && pc[r] < s->n[r]; pc[r]++) {
        tdm_pp_action *a = &s->a[r][pc[r]];
        int chunk, peer = peer_of(s, a, &chunk);
        if (is_send(a->op)) {
          link_q *q = &L[((size_t)r * (size_t)P + (size_t)peer) * 3 + (size_t)kind_of(a->op)];
          if (q->tail == q->cap) {
            int nc = q->cap ? 2 * q->cap : 16;
            msg *nq = tdm__malloc(sizeof *nq * (size_t)nc);
            if (!nq) {
              st = tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
              break;
            }
            if (q->q) memcpy(nq, q->q, sizeof *nq * (size_t)q->tail);
            tdm__free(q->q);
            q->q = nq, q->cap = nc;
          }
          q->q[q->tail++] = (msg){chunk, a->mb, pc[r], t[r]};
          a->start = a->end = t[r];
        } else if (is_recv(a->op)) {
          link_q *q = &L[((size_t)peer * (size_t)P + (size_t)r) * 3 + (size_t)kind_of(a->op)];
          if (q->head == q->tail) break; /* waits */
          msg *h = &q->q[q->head];
          if (h->chunk != chunk || h->mb != a->mb) {
            char why[300];
            snprintf(why, sizeof why,
                     "the next %s message from rank %d is for chunk %d, micro-batch %d (its action %d, %s): the ranks "
                     "send and receive in different orders",
                     kind_word[kind_of(a->op)], peer, h->chunk, h->mb, h->from_action, what(&s->a[peer][h->from_action], b1, sizeof b1));
            st = bad(s, r, pc[r], why);
            break;
          }
          q->head++;
          if (h->t > t[r]) t[r] = h->t;
          a->start = a->end = t[r];
        } else {
          double c = cost_of(costs, a->op);
          a->start = t[r];
          a->end = t[r] += c;
          busy[r] += c;
          if (a->op == TDM_PP_FORWARD) {
            if (++held[r] > s->peak[r]) s->peak[r] = held[r];
          } else if (a->op == TDM_PP_BACKWARD || a->op == TDM_PP_BACKWARD_WEIGHT) {
            held[r]--;
          }
        }
        moved = 1;
      }
    }
  }
  /* a rank that did not finish waits for a message that never comes: name why */
  for (int r = 0; st == TDM_OK && r < P; r++) {
    if (pc[r] == s->n[r]) continue;
    int chunk, peer = peer_of(s, &s->a[r][pc[r]], &chunk);
    if (pc[peer] == s->n[peer]) {
      char why[200];
      snprintf(why, sizeof why, "waits forever: rank %d finishes its list without sending it", peer);
      st = bad(s, r, pc[r], why);
      break;
    }
    /* a cycle of waits: follow who waits for whom from r until a rank repeats */
    int *seen = tdm__calloc((size_t)P, sizeof(int)), x = r, step = 1;
    if (!seen) {
      st = tdm__set_error(TDM_ERR_NO_MEMORY, "pipeline schedule: out of memory");
      break;
    }
    while (!seen[x]) {
      seen[x] = step++;
      int c2;
      x = peer_of(s, &s->a[x][pc[x]], &c2);
    }
    char msgbuf[1024];
    size_t at = (size_t)snprintf(msgbuf, sizeof msgbuf, "pipeline schedule %s (P %d, V %d, M %d) deadlocks: ",
                                 tdm_pp_schedule_name(s->kind), P, V, M);
    int start = x;
    do {
      int c2, nx = peer_of(s, &s->a[x][pc[x]], &c2);
      if (x == start) at += (size_t)snprintf(msgbuf + at, sizeof msgbuf - at, "rank %d", x);
      at += (size_t)snprintf(msgbuf + at, at < sizeof msgbuf ? sizeof msgbuf - at : 0, "%s waits at action %d (%s) for rank %d",
                             x == start ? "" : ", which", pc[x], what(&s->a[x][pc[x]], b2, sizeof b2), nx);
      x = nx;
    } while (x != start && at < sizeof msgbuf);
    tdm__free(seen);
    st = tdm__set_error(TDM_ERR_INVALID_ARG, "%s", msgbuf);
  }
  /* every send received */
  for (size_t k = 0; st == TDM_OK && k < (size_t)P * (size_t)P * 3; k++) {
    link_q *q = &L[k];
    if (q->head == q->tail) continue;
    int from = (int)(k / 3 / (size_t)P), to = (int)(k / 3 % (size_t)P);
    char why[160];
    snprintf(why, sizeof why, "rank %d never receives it", to);
    st = bad(s, from, q->q[q->head].from_action, why);
  }
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
  for (size_t k = 0; L && k < (size_t)P * (size_t)P * 3; k++) tdm__free(L[k].q);
  tdm__free(L), tdm__free(fl), tdm__free(pc), tdm__free(held), tdm__free(t), tdm__free(busy);
  return st;
}

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
  int width = (int)(s->makespan + 0.5);
  for (int r = 0; r < s->P && at + 1 < n; r++) { /* two characters per cost unit: F3, B3, b3 (input pass), W3 */
    at += (size_t)snprintf(buf + at, n - at, "rank %d |", r);
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
  if (C > n_layers)
    return tdm__set_error(TDM_ERR_INVALID_ARG,
                          "pipeline cut: %d chunks (pipeline ranks x virtual stages) for %d transformer blocks; every chunk "
                          "needs at least one block: use at most %d",
                          C, n_layers, n_layers);
  if (split && n_split > 0) {
    if (n_split != C)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "--pp-split gives %d counts; expected %d (one per chunk: pipeline ranks x virtual stages)",
                            n_split, C);
    int sum = 0;
    for (int c = 0; c < C; c++) {
      if (split[c] < 1)
        return tdm__set_error(TDM_ERR_INVALID_ARG, "--pp-split: chunk %d gets %d blocks; expected at least 1", c, split[c]);
      sum += split[c];
    }
    if (sum != n_layers)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "--pp-split adds up to %d blocks; the model has %d", sum, n_layers);
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
