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
#include "parallel/tp_model.h"
#include "parallel/pipeline_impl.h"
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

/* ---- activations: the tape's allocations, op by op ---------------------------------------------- */
typedef struct {
  int64_t fwd, bwd; /* bytes forward, bytes backward adds */
  int train;        /* recording: nodes and gradients; dropout active */
  int64_t nodes;    /* recorded ops */
  int half;         /* mixed precision: activations and their gradients in 16 bits (the sizes below
                       are given in f32 and halved; an op's transient f32 copies are left out) */
} tape_bytes;

static int64_t al(int64_t b) {
  b = (b + 63) / 64 * 64;
  return b ? b : 64;
}
#define TENSOR al((int64_t)sizeof(tdm_tensor))
#define NODE al((int64_t)sizeof(tdm_node))

/* A tensor of `bytes` (as f32) made in forward; when recording it gets a node, and in backward a gradient. */
static void op_out(tape_bytes *a, int64_t bytes) {
  if (a->half) bytes /= 2;
  a->fwd += TENSOR + al(bytes);
  if (a->train) a->fwd += NODE, a->bwd += TENSOR + al(bytes), a->nodes++;
}
/* A view: only its struct; recorded and given a gradient like an op's output. */
static void op_view(tape_bytes *a, int64_t bytes) {
  if (a->half) bytes /= 2;
  a->fwd += TENSOR;
  if (a->train) a->fwd += NODE, a->bwd += TENSOR + al(bytes), a->nodes++;
}
static void op_saved(tape_bytes *a, int64_t bytes) { a->fwd += al(bytes); }      /* kept for backward */
static void bwd_scratch(tape_bytes *a, int64_t bytes) { if (a->train) a->bwd += al(bytes); }
static void input(tape_bytes *a, int64_t bytes) { a->fwd += TENSOR + al(bytes); } /* the batch */

static void linear(tape_bytes *a, int64_t N, int64_t out) { op_out(a, 4 * N * out); }
static void dropout(tape_bytes *a, float p, int64_t n) {
  if (a->train && p > 0) op_out(a, 4 * n);
}
static void layernorm(tape_bytes *a, int64_t N, int64_t C) {
  op_out(a, 4 * N * C);
  op_saved(a, 8 * N);
}
static void rmsnorm(tape_bytes *a, int64_t N, int64_t C) {
  op_out(a, 4 * N * C);
  op_saved(a, 4 * N);
}
static void cross_entropy(tape_bytes *a, int64_t N) {
  op_saved(a, 4 * N); /* log-sum-exp per row */
  op_out(a, 4);       /* the loss; backward seeds its gradient */
}

/* Attention's (B, NH, T, T) probabilities: kept for backward, or under selective recomputation
 * rebuilt there (a transient of backward). */
static void attention_probs(tape_bytes *a, int64_t bytes, tdm_recompute rc) {
  if (a->half) bytes /= 2; /* stored in 16 bits (the f32 chunk each pass converts through is left out) */
  if (rc == TDM_RECOMPUTE_SELECTIVE && a->train) bwd_scratch(a, bytes);
  else op_saved(a, bytes);
  bwd_scratch(a, bytes);
}

static void gpt_block_tape(const tdm_model_config *m, int64_t B, int64_t T, tdm_recompute rc, tape_bytes *a) {
  int64_t N = B * T, C = m->n_embd, NH = m->n_head;
  layernorm(a, N, C);
  linear(a, N, 3 * C);
  op_out(a, 4 * N * C); /* attention */
  attention_probs(a, 4 * B * NH * T * T, rc);
  linear(a, N, C);
  dropout(a, m->dropout, N * C);
  op_out(a, 4 * N * C); /* residual */
  layernorm(a, N, C);
  linear(a, N, 4 * C);
  op_out(a, 4 * N * 4 * C); /* gelu */
  linear(a, N, C);
  dropout(a, m->dropout, N * C);
  op_out(a, 4 * N * C); /* residual */
}

static void llama_block_tape(const tdm_model_config *m, int64_t B, int64_t T, tdm_recompute rc, tape_bytes *a) {
  int64_t N = B * T, C = m->n_embd, NH = m->n_head, hs = C / NH, KV = m->n_kv_head * hs, F = m->ffn_hidden;
  rmsnorm(a, N, C);
  linear(a, N, C), op_out(a, 4 * N * C), op_saved(a, 4 * (2 * T * (hs / 2) + 1));   /* q, RoPE */
  linear(a, N, KV), op_out(a, 4 * N * KV), op_saved(a, 4 * (2 * T * (hs / 2) + 1)); /* k, RoPE */
  linear(a, N, KV);                                                                  /* v */
  op_out(a, 4 * N * C); /* attention */
  attention_probs(a, 4 * B * NH * T * T, rc);
  linear(a, N, C);
  dropout(a, m->dropout, N * C);
  op_out(a, 4 * N * C); /* residual */
  rmsnorm(a, N, C);
  linear(a, N, F), linear(a, N, F);
  op_out(a, 4 * N * F); /* SwiGLU */
  linear(a, N, C);
  dropout(a, m->dropout, N * C);
  op_out(a, 4 * N * C); /* residual */
}

/* Blocks [first, last) of a GPT or a Llama. Under block recomputation (training) a block keeps
 * its output alone (one recorded node and its gradient), and its backward runs the block again
 * with gradients on, all of it given back afterwards: one block's forward and backward on top
 * of the rest at the peak. */
static void blocks_tape(const tdm_model_config *m, int64_t B, int64_t T, int64_t first, int64_t last, tdm_recompute rc,
                        tape_bytes *a) {
  int64_t transient = 0;
  for (int64_t l = first; l < last; l++) {
    if (rc == TDM_RECOMPUTE_BLOCK && a->train) {
      tape_bytes b = {0, 0, 1, 0, a->half};
      if (m->kind == TDM_MODEL_LLAMA) llama_block_tape(m, B, T, TDM_RECOMPUTE_NONE, &b);
      else gpt_block_tape(m, B, T, TDM_RECOMPUTE_NONE, &b);
      int64_t t = b.fwd + b.bwd - (TENSOR + al(4 * B * T * m->n_embd)); /* its output's gradient is the kept one's */
      if (t > transient) transient = t;
      op_out(a, 4 * B * T * m->n_embd); /* the block's output */
      a->fwd += al(64) + 2 * al(8 * (int64_t)(1 + 16)); /* the call, the node's inputs (parameters) */
    } else if (m->kind == TDM_MODEL_LLAMA) {
      llama_block_tape(m, B, T, rc, a);
    } else {
      gpt_block_tape(m, B, T, rc, a);
    }
  }
  bwd_scratch(a, transient);
}

/* A GPT's blocks [first, last), with the embeddings and the head as asked (a pipeline's chunk). */
static void gpt_range_tape(const tdm_model_config *m, int64_t B, int64_t T, int64_t first, int64_t last, int embed, int head,
                           tdm_recompute rc, tape_bytes *a) {
  int64_t N = B * T, C = m->n_embd;
  if (embed) {
    op_out(a, 4 * N * C);  /* token embedding */
    op_view(a, 4 * T * C); /* position embedding rows */
    op_out(a, 4 * N * C);  /* their sum */
    dropout(a, m->dropout, N * C);
  }
  blocks_tape(m, B, T, first, last, rc, a);
  if (head) {
    layernorm(a, N, C);
    linear(a, N, m->vocab_size);
    cross_entropy(a, N);
  }
}

/* A Llama's decoder layers [first, last), with the embedding and the head as asked. */
static void llama_range_tape(const tdm_model_config *m, int64_t B, int64_t T, int64_t first, int64_t last, int embed, int head,
                             tdm_recompute rc, tape_bytes *a) {
  int64_t N = B * T, C = m->n_embd;
  if (embed) {
    op_out(a, 4 * N * C); /* token embedding */
    dropout(a, m->dropout, N * C);
  }
  blocks_tape(m, B, T, first, last, rc, a);
  if (head) {
    rmsnorm(a, N, C);
    linear(a, N, m->vocab_size);
    cross_entropy(a, N);
  }
}

/* ---- tensor parallelism: rank t's tape (src/parallel/tp_model.c, tp_gpt.c, tp_llama.c), its ops
 * custom ones --------------------------------------------------------------------------------------
 * A custom op makes its array of inputs and its context; backward its arrays of gradients; the
 * vocabulary-parallel ops keep their state besides (tp_ops.c). */
static void custom_op(tape_bytes *a, int n) {
  a->fwd += al(8 * n) + al(48);
  bwd_scratch(a, al(8 * n) + al(n));
}

/* An f32 tensor whatever the precision: the tensor-parallel ops' outputs (they widen 16-bit inputs
 * with a cast, an f32 tensor, and sum in f32). */
static void f32_out(tape_bytes *a, int64_t bytes) {
  int h = a->half;
  a->half = 0, op_out(a, bytes), a->half = h;
}
static void f32_view(tape_bytes *a, int64_t bytes) {
  int h = a->half;
  a->half = 0, op_view(a, bytes), a->half = h;
}
/* f (identity forward, all-reduce backward): a header over its input, widened first when 16-bit */
static void tp_f(tape_bytes *a, int64_t bytes) {
  if (a->half) f32_out(a, bytes); /* the cast */
  custom_op(a, 1), f32_view(a, bytes);
}
/* g (all-reduce forward): its f32 sum, the input widened first when 16-bit */
static void tp_g(tape_bytes *a, int64_t bytes) {
  if (a->half) f32_out(a, bytes);
  custom_op(a, 1), f32_out(a, bytes);
}

/* One split block (attention, then the MLP); *mark: backward's bytes before block 0's attention. */
static void tp_block_tape(const tdm_model_config *m, int64_t B, int64_t T, int Tp, tdm_recompute rc, tape_bytes *a, int64_t *mark) {
  int llama = m->kind == TDM_MODEL_LLAMA, comm = Tp > 1;
  int64_t N = B * T, C = m->n_embd, Ct = C / Tp, Ht = m->n_head / Tp, hs = C / m->n_head;
  int64_t KVt = llama ? m->n_kv_head / Tp * hs : 0, Ft = llama ? (m->ffn_hidden + Tp - 1) / Tp : 0, rope = 4 * (2 * T * (hs / 2) + 1);
  for (int k = 0; k < 2; k++) { /* attention, then the MLP */
    if (llama) rmsnorm(a, N, C);
    else layernorm(a, N, C);
    if (comm) tp_f(a, 4 * N * C); /* f: a header over the norm's output */
    if (k == 0 && mark) *mark = a->bwd; /* backward has not yet made these gradients at block 0's attention */
    if (k == 0) {
      if (llama) { /* this rank's query heads and key/value heads, RoPE on q and k */
        linear(a, N, Ct), op_out(a, 4 * N * Ct), op_saved(a, rope);
        linear(a, N, KVt), op_out(a, 4 * N * KVt), op_saved(a, rope);
        linear(a, N, KVt);
      } else {
        linear(a, N, 3 * Ct);
      }
      op_out(a, 4 * N * Ct); /* attention over this rank's heads */
      /* the probabilities (backward's scores: scratch, below); selective keeps none and rebuilds
       * one block's in backward (counted with the scores, below) */
      if (!(rc == TDM_RECOMPUTE_SELECTIVE && a->train)) op_saved(a, (a->half ? 2 : 4) * B * Ht * T * T);
    } else if (llama) {
      linear(a, N, Ft), linear(a, N, Ft);
      op_out(a, 4 * N * Ft); /* SwiGLU */
    } else {
      linear(a, N, 4 * Ct);
      op_out(a, 4 * N * 4 * Ct); /* gelu */
    }
    linear(a, N, C); /* row-parallel: partial sums */
    if (comm) tp_g(a, 4 * N * C);
    if (!llama) op_out(a, 4 * N * C); /* GPT: the bias */
    dropout(a, m->dropout, N * C);
    op_out(a, 4 * N * C); /* residual */
  }
}

/* GPT's or Llama's; Ft: a Llama's SwiGLU units on this rank (the most any rank has). Under block
 * recomputation each split block keeps its output alone and runs again in backward (one block's
 * forward and backward on top of the rest at the peak, as blocks_tape). */
static void tp_model_tape(const tdm_model_config *m, int64_t B, int64_t T, int64_t accum, int Tp, int64_t Vt, tdm_recompute rc,
                          tape_bytes *a) {
  int llama = m->kind == TDM_MODEL_LLAMA;
  int64_t N = B * T, C = m->n_embd, Ht = m->n_head / Tp, comm = Tp > 1;
  int64_t mark = 0, transient = 0;
  input(a, 4 * N);
  input(a, 4 * N);
  custom_op(a, 2); /* the embedding rows this rank holds: its output, the lookup's start, the indices kept */
  f32_out(a, 4 * N * C);
  op_saved(a, 64), op_saved(a, 64);
  if (comm) tp_g(a, 4 * N * C);
  if (a->half) op_out(a, 4 * N * C); /* the rows cast to 16 bits, as one process's embedding stores them */
  if (!llama) op_view(a, 4 * T * C), op_out(a, 4 * N * C); /* GPT: the position embedding's rows, added */
  dropout(a, m->dropout, N * C);
  for (int64_t l = 0; l < m->n_layer; l++) {
    if (rc == TDM_RECOMPUTE_BLOCK && a->train) {
      tape_bytes b = {0, 0, 1, 0, a->half};
      tp_block_tape(m, B, T, Tp, TDM_RECOMPUTE_NONE, &b, NULL);
      int64_t t = b.fwd + b.bwd + al((a->half ? 2 : 4) * B * Ht * T * T);
      if (t > transient) transient = t;
      op_out(a, 4 * N * C); /* the block's output */
      a->fwd += al(64) + 2 * al(8 * (int64_t)(1 + 16)); /* the call, the node's inputs (parameters) */
    } else {
      tp_block_tape(m, B, T, Tp, rc, a, l == 0 ? &mark : NULL);
    }
  }
  bwd_scratch(a, transient);
  if (llama) rmsnorm(a, N, C);
  else layernorm(a, N, C);
  if (comm) tp_f(a, 4 * N * C);
  linear(a, N, Vt);
  if (a->half) f32_out(a, 4 * N * Vt); /* the loss reads 16-bit logits widened */
  custom_op(a, 2); /* the cross-entropy: its state, the ranks' row maxima, the row sums, max and lse */
  op_saved(a, al(80) + al(8 * (2 * N * Tp + 2 * N + 1)) + 2 * al(4 * (N + 1)) + 64);
  op_out(a, 4);
  /* an attention backward takes the scores (B, Ht, T, T) as scratch and gives them back: the peak
   * is the end of backward, or block 0's attention with the gradients made until then */
  int64_t scores = al(4 * B * Ht * T * T);
  if (rc == TDM_RECOMPUTE_SELECTIVE) scores *= 2; /* and the probabilities rebuilt */
  if (a->train && m->n_layer > 0 && rc != TDM_RECOMPUTE_BLOCK && scores > mark) a->bwd += scores - mark;
  if (a->train && accum > 1) a->fwd += TENSOR + al(4);
}

/* Tensor parallelism's tape (the other layouts': src/parallel/plan_tape.c). */
static int64_t tp_tape_total(const tdm_model_config *m, int64_t B, int64_t T, int64_t accum, int train, int64_t *nodes, int Tp,
                             int64_t Vt, tdm_recompute rc, tdm_dtype precision) {
  tape_bytes a = {0, 0, train, 0, precision != TDM_F32};
  tp_model_tape(m, B, T, accum, Tp, Vt, train ? rc : TDM_RECOMPUTE_NONE, &a);
  if (nodes) *nodes = a.nodes;
  return a.fwd + a.bwd;
}

/* The tape's arrays of nodes and leaves double from 64 entries; at the last growth both the old
 * and the new array exist. */
static int64_t grown_array(int64_t n, int64_t elem) {
  int64_t cap = 64;
  while (cap < n) cap *= 2;
  return (cap > 64 ? cap + cap / 2 : cap) * elem;
}

/* ---- stage 3: what is gathered and held as the engine runs ---------------------------------------
 * Forward touches the units in parameter order (a large table a block of rows at a time: its units,
 * src/parallel/layout.c); a tied embedding's table is read again at the end for the logits, and
 * again in backward for the logits' input gradient without its own (the embedding's backward adds
 * that, block by block); then backward touches the units in the reverse order, writing their
 * gradients. Parameters: the engine keeps the most recently used units, at most two, making room
 * before it gathers (src/parallel/zero.c, fetch), plus the next unit arriving when it prefetches
 * (up the indices when the gradients are written, down otherwise). Gradients: a unit's are written
 * from backward's first touch of it until its last (where they are reduce-scattered and given
 * back); when the reduction runs on the communication thread, the next unit's may be written
 * before it ends. */
typedef struct {
  int64_t params, grads; /* elements at the peak */
} units_peak;

/* tied: the parameter index of the tied table, or -1. */
static units_peak stage3_peaks(const tdm__layout *L, int tied, int prefetch) {
  int ng = L->ng, nt = tied >= 0 ? L->n_of[tied] : 0, n = 2 * ng + 2 * nt;
  int *seq = tdm__malloc(sizeof(int) * (size_t)(n ? n : 1));
  unsigned char *wr = tdm__calloc((size_t)(n ? n : 1), 1); /* the touch writes the unit's gradients */
  uint64_t *last = tdm__calloc((size_t)(ng ? ng : 1), sizeof(uint64_t));
  unsigned char *res = tdm__calloc((size_t)(ng ? ng : 1), 1), *fly = tdm__calloc((size_t)(ng ? ng : 1), 1);
  units_peak out = {0, 0};
  if (!seq || !wr || !last || !res || !fly) goto done;
  int k = 0;
  for (int g = ng - 1; g >= 0; g--) seq[k++] = g; /* forward: parameter order is group order reversed */
  for (int r = 0; r < 2; r++) /* the logits, then their input gradient: the table's blocks up its rows */
    for (int g = nt - 1; g >= 0; g--) seq[k++] = L->group_of[tied] + g;
  int fwd_end = k - nt; /* backward starts with the head's */
  for (int g = 0; g < ng; g++) wr[k] = 1, seq[k++] = g;
  int64_t held = 0, gmax = 0;
  for (int g = 0; g < ng; g++) gmax = L->g[g].hi - L->g[g].lo > gmax ? L->g[g].hi - L->g[g].lo : gmax;
#define G(x) (L->g[x].hi - L->g[x].lo)
  uint64_t clock = 0;
  for (int i = 0; i < n; i++) {
    int u = seq[i];
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
      int next = wr[i] ? u + 1 : u - 1;
      if (prefetch && next >= 0 && next < ng && !res[next]) fly[next] = 1;
    }
    int64_t sum = 0;
    for (int g = 0; g < ng; g++) sum += (res[g] || fly[g]) ? G(g) : 0;
    if (sum > out.params) out.params = sum;
    if (i == fwd_end - 1) memset(fly, 0, (size_t)ng);
    if (!wr[i]) continue;
    /* gradients: held from the unit's first touch in backward to its last */
    int first = 1, again = 0;
    for (int j = fwd_end; j < i; j++) first &= !wr[j] || seq[j] != u;
    for (int j = i + 1; j < n; j++) again |= wr[j] && seq[j] == u;
    if (first) held += G(u);
    if (held + (prefetch ? gmax : 0) > out.grads) out.grads = held + (prefetch ? gmax : 0);
    if (!again) held -= G(u);
  }
#undef G
done:
  tdm__free(seq), tdm__free(wr), tdm__free(last), tdm__free(res), tdm__free(fly);
  return out;
}

void tdm_plan_gpt_costs(const tdm_model_config *m, int64_t T, double *embed, double *block, double *head) {
  if (!m || !embed || !block || !head) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_plan_gpt_costs: %s is NULL",
                   !m ? "the model config m" : !embed ? "embed" : !block ? "block" : "head");
    return;
  }
  double C = (double)m->n_embd, V = (double)m->vocab_size, t = (double)(T > 0 ? T : m->block_size);
  *embed = 2 * C;                                    /* the sum of the two embeddings */
  *block = 24 * C * C + 4 * t * C + 30 * C;          /* the four matmuls, attention's two, norms and GELU */
  *head = 2 * C * V + 10 * V + 10 * C;               /* the logits, the loss, the final norm */
}

void tdm_plan_llama_costs(const tdm_model_config *m, int64_t T, double *embed, double *block, double *head) {
  if (!m || !embed || !block || !head) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_plan_llama_costs: %s is NULL",
                   !m ? "the model config m" : !embed ? "embed" : !block ? "block" : "head");
    return;
  }
  double C = (double)m->n_embd, V = (double)m->vocab_size, t = (double)(T > 0 ? T : m->block_size), F = (double)m->ffn_hidden;
  double KV = m->n_head > 0 ? C / (double)m->n_head * (double)m->n_kv_head : C;
  *embed = C;                                        /* the lookup */
  *block = 4 * C * C + 4 * C * KV + 6 * C * F        /* q and o, k and v, gate, up and down */
           + 4 * t * C + 6 * (C + KV) + 5 * F + 10 * C; /* attention's two products, RoPE, SwiGLU, the norms */
  *head = 2 * C * V + 10 * V + 5 * C;                /* the logits, the loss, the final norm */
}

void tdm_plan_layer_costs(const tdm_model_config *m, int64_t T, double *embed, double *block, double *head) {
  if (m && m->kind == TDM_MODEL_LLAMA) tdm_plan_llama_costs(m, T, embed, block, head);
  else tdm_plan_gpt_costs(m, T, embed, block, head);
}

/* ---- a pipeline: each stage's chunks, and the activations its schedule holds at once ------------------
 * A chunk micro-batch's tape lives from its first action (the receive of its input, or its forward)
 * to its backward (weight pass, for zero-bubble); it holds the chunk's ops, the received input and
 * its gradient, the received output gradient. The stage's batches live for the step. */
static tape_bytes chunk_tape(const tdm_model_config *m, const tdm__pp_layout *L, int c, int64_t B, int64_t T, int64_t accum,
                             tdm_recompute rc, int half) {
  tape_bytes a = {0, 0, 1, 0, half};
  int64_t N = B * T;
  if (m->kind == TDM_MODEL_LLAMA) llama_range_tape(m, B, T, L->first_block[c], L->first_block[c + 1], c == 0, c == L->C - 1, rc, &a);
  else gpt_range_tape(m, B, T, L->first_block[c], L->first_block[c + 1], c == 0, c == L->C - 1, rc, &a);
  if (c > 0) a.fwd += 2 * (TENSOR + al((half ? 2 : 4) * N * m->n_embd)); /* the input received, its gradient */
  if (c < L->C - 1) a.fwd += TENSOR + al(4 * N * m->n_embd);             /* the output's gradient received (f32) */
  if (c == L->C - 1 && accum > 1) a.fwd += TENSOR + al(4);   /* backward's seed 1/M */
  return a;
}

static tdm_status plan_pipeline(const tdm_plan_config *c, const tdm_params *params, tdm_plan *out) {
  tdm_engine_config ec = c->engine;
  if (!ec.pp.seq_len) ec.pp.seq_len = c->seq_len; /* the cut the engine makes for this length */
  tdm__pp_layout L;
  TDM__TRY(tdm__pp_layout_make(&c->model, &ec, c->pipeline, &L));
  const tdm_model_config *m = &c->model;
  int64_t T = c->seq_len > 0 ? c->seq_len : m->block_size, B = c->batch, N = B * T;
  int64_t *lo = tdm__malloc(sizeof(int64_t) * (size_t)(L.C + 1));
  tape_bytes *bytes = tdm__malloc(sizeof(tape_bytes) * (size_t)L.C);
  if (!lo || !bytes) {
    tdm__free(lo), tdm__free(bytes), tdm__pp_layout_free(&L);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "plan: out of memory");
  }
  for (int k = 0; k < L.C; k++) { /* where chunk k starts: block first_block[k]'s first parameter */
    char name[64];
    if (m->kind == TDM_MODEL_LLAMA) snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", L.first_block[k]);
    else snprintf(name, sizeof name, "transformer.h.%d.ln_1.weight", L.first_block[k]);
    tdm_tensor *t = tdm_params_find(params, name);
    lo[k] = k == 0 || !t ? 0 : (const float *)tdm_tensor_data(t) - tdm_params_data(params);
    bytes[k] = chunk_tape(m, &L, k, B, T, L.M, c->engine.recompute, c->engine.precision != TDM_F32);
  }
  lo[L.C] = tdm_params_numel(params);
  out->pipeline = L.P, out->virtual_stages = L.V, out->microbatches = L.M;
  out->bubble = L.s->bubble, out->bubble_ratio = L.s->bubble_ratio;
  snprintf(out->schedule, sizeof out->schedule, "%s", tdm_pp_schedule_name(L.s->kind));
  int adam = c->optim.kind != TDM_OPT_SGD;
  int tied = m->kind == TDM_MODEL_GPT || m->tie_embeddings; /* the last stage keeps a copy of the embedding */
  int64_t wte = tied ? m->vocab_size * m->n_embd : 0;
  for (int r = 0; r < L.P && r < TDM_PLAN_MAX_STAGES; r++) {
    tdm_plan_stage *ps = &out->stages[r];
    memset(ps, 0, sizeof *ps);
    int64_t owned = 0;
    for (int k = r; k < L.C; k += L.P) owned += lo[k + 1] - lo[k];
    int last = (L.C - 1) % L.P == r;
    ps->first_block = L.first_block[r], ps->last_block = L.first_block[r + 1] - 1;
    ps->bytes[TDM_MEM_PARAMS] = 4 * (owned + (last && L.P > 1 ? wte : 0));
    ps->bytes[TDM_MEM_GRADS] = 4 * owned;
    int64_t D = c->engine.pp.zero_stage == 1 && c->world > 1 ? c->world : 1; /* ZeRO-1: the largest data rank's part */
    ps->bytes[TDM_MEM_OPTIM] = 4 * ((owned + D - 1) / D) * (adam ? 2 : c->optim.momentum > 0 ? 1 : 0);
    /* the schedule's tapes as they come and go: a forward's bytes from the forward to the backward
     * (the weight pass), a backward's while it runs (to the weight pass, for an input pass) */
    int64_t held = 0, peak = 0;
    int n = 0, most = 0;
    for (int i = 0; i < L.s->n[r]; i++) {
      const tdm_pp_action *a = &L.s->a[r][i];
      const tape_bytes *tb = a->op == TDM_PP_OPTIM ? NULL : &bytes[a->chunk];
      if (a->op == TDM_PP_FORWARD) held += tb->fwd, n++;
      else if (a->op == TDM_PP_BACKWARD_INPUT) held += tb->bwd;
      else if (a->op == TDM_PP_BACKWARD) peak = held + tb->bwd > peak ? held + tb->bwd : peak, held -= tb->fwd, n--;
      else if (a->op == TDM_PP_BACKWARD_WEIGHT) held -= tb->fwd + tb->bwd, n--;
      if (held > peak) peak = held;
      if (n > most) most = n;
    }
    ps->peak = most;
    ps->bytes[TDM_MEM_ACTIVATIONS] = peak + L.M * 2 * (TENSOR + al(4 * N)); /* and the step's batches */
    /* messages: copies of the input gradients sent, and the tied head's part carried along */
    ps->bytes[TDM_MEM_COMM] = (r > 0 || L.V > 1) && L.P > 1 ? 4 * N * (m->n_embd + (tied ? m->vocab_size + m->n_embd : 0)) * 2 : 0;
    int W = c->world * L.P; /* every rank's share of the world's segment */
    if (c->world <= 1 && W > 1 && c->transport == TDM_TRANSPORT_SHM) ps->bytes[TDM_MEM_COMM] += (int64_t)(tdm__shm_segment_bytes(W) / (size_t)W);
    for (int k = 0; k < TDM_MEM_COUNT; k++) ps->total += ps->bytes[k];
  }
  out->n_stages = L.P < TDM_PLAN_MAX_STAGES ? L.P : TDM_PLAN_MAX_STAGES;
  tdm__free(lo), tdm__free(bytes);
  tdm__pp_layout_free(&L);
  return TDM_OK;
}

/* ---- the plan ---------------------------------------------------------------------------------- */
tdm_status tdm_plan_compute(const tdm_plan_config *c, tdm_plan *out) {
  if (!c || !out) return tdm__set_error(TDM_ERR_INVALID_ARG, "plan: NULL argument");
  memset(out, 0, sizeof *out);
  /* what the plan multiplies: each in a range whose products stay within 64 bits */
  const char *bad = c->world < 0 || c->world > (1 << 20) ? "world" : c->tensor < 0 || c->tensor > 4096 ? "tensor"
                    : c->pipeline < 0 || c->pipeline > TDM_PLAN_MAX_STAGES ? "pipeline" : c->batch > ((int64_t)1 << 32) ? "batch"
                    : c->seq_len < 0 || (c->model.block_size > 0 && c->seq_len > c->model.block_size) ? "seq_len"
                    : c->eval_batch < 0 || c->eval_batch > ((int64_t)1 << 32) ? "eval_batch" : c->data_bytes < 0 ? "data_bytes"
                    : (unsigned)c->transport >= TDM_TRANSPORT_COUNT ? "transport" : (unsigned)c->engine.kind >= TDM_ENGINE_KIND_COUNT ? "engine kind"
                    : (unsigned)c->optim.kind >= TDM_OPT_KIND_COUNT ? "optimizer kind" : c->engine.accum < 0 || c->engine.accum > (1 << 20) ? "accum"
                    : NULL;
  if (bad)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "plan: %s is out of range (world %d, tensor %d, pipeline %d, batch %lld, seq_len %lld, "
                          "eval_batch %lld, data_bytes %lld, transport %d, engine %d, optimizer %d, accum %lld); expected world 0..2^20, "
                          "tensor 0..4096, pipeline 0..%d, batches up to 2^32, seq_len up to the block size, the rest >= 0 and known",
                          bad, c->world, c->tensor, c->pipeline, (long long)c->batch, (long long)c->seq_len, (long long)c->eval_batch,
                          (long long)c->data_bytes, (int)c->transport, (int)c->engine.kind, (int)c->optim.kind,
                          (long long)c->engine.accum, TDM_PLAN_MAX_STAGES);
  int P = c->world > 0 ? c->world : 1;
  int stage = c->engine.kind == TDM_ENGINE_ZERO ? c->engine.zero.stage : 0;
  int tp = c->engine.kind == TDM_ENGINE_TP, Tp = c->tensor > 1 ? c->tensor : 1, W = P * Tp;
  /* the 3-D grid: the pipeline engine with a tensor axis, planned as the pipeline (see below) */
  int grid3 = Tp > 1 && c->pipeline > 1 && c->engine.kind == TDM_ENGINE_PIPELINE;
  if (Tp > 1 && !tp && !grid3)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "plan: %d tensor-parallel ranks with the %s engine; expected the tp engine, or the "
                          "pipeline engine with more than one stage", Tp, tdm_engine_kind_name(c->engine.kind));
  if (grid3) TDM__TRY(tdm_engine_check(&c->model, &c->engine, W * c->pipeline, P, Tp, c->pipeline));
  if (tp) TDM__TRY(tdm__tp_check(&c->model, Tp));
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
  int n_param_tensors = tdm_params_count(params);
  int64_t n = tdm_params_numel(params), owned = n;
  /* tensor parallelism: the rank holding the most (the largest block of the vocabulary), its store
   * as the engine declares it (address space only), the pieces of its norm */
  tdm_params *whole = params, *local = NULL;
  int64_t Vt = 0, n_pieces = 0, n_rep = 0;
  if (tp) {
    int tmax = 0;
    for (int t = 0; t < Tp; t++) {
      int64_t ln = tdm__tp_local_numel(whole, Tp, t);
      if (t == 0 || ln > owned) owned = ln, tmax = t;
    }
    Vt = c->model.vocab_size * (tmax + 1) / Tp - c->model.vocab_size * tmax / Tp;
    tdm_status ls = tdm_params_create(&local);
    for (int i = 0; ls == TDM_OK && i < n_param_tensors; i++) {
      tdm__tp_slice sl;
      int64_t shape[TDM_MAX_DIMS];
      tdm_tensor *t;
      tdm__tp_slice_of(whole, i, Tp, tmax, &sl, shape);
      n_rep += !sl.sharded;
      ls = tdm_params_declare(local, tdm_tensor_name(tdm_params_get(whole, i)), tdm_tensor_ndim(tdm_params_get(whole, i)), shape,
                              (tdm_init){TDM_INIT_ZEROS, 0, 0}, tdm_params_decay(whole, i), &t);
    }
    if (ls == TDM_OK) ls = tdm_params_finalize_reserved(local, 0, TDM_RESERVE_DATA | TDM_RESERVE_GRAD);
    if (ls == TDM_OK) ls = tdm__tp_norm_pieces(whole, Tp, tmax, NULL, &n_pieces);
    const int64_t *lc;
    int64_t ln;
    if (ls == TDM_OK && P > 1) ls = tdm_params_segments(local, &lc, &ln); /* data parallelism's layout makes them */
    if (ls != TDM_OK) {
      tdm_params_destroy(local);
      tdm_model_destroy(m);
      return ls;
    }
    params = local; /* data parallelism's buckets are spans of the slices */
  }
  tdm_mem_stats_get(&after);
  int64_t metadata = after.current[TDM_MEM_WORKSPACE] - before.current[TDM_MEM_WORKSPACE];
  tdm__layout L = {0};
  int inline_comm = 0;
  tdm_status st = tdm__inline_comm(P, &inline_comm);
  int64_t accum = c->engine.accum > 1 ? c->engine.accum : 1, G2 = 0; /* stage 2: the most written at once */
  int in_place = 0; /* stage 2 run as stage 1 */
  units_peak u3 = {0, 0};
  int64_t part = 0, wire = 0; /* the largest part a rank reduces; compressed buckets' bytes */
  if (st == TDM_OK && stage == 0 && P > 1) { /* data parallelism's buckets, split in blocks */
    st = tdm__layout_make(&L, params, 0, c->engine.dp.bucket_bytes, c->engine.dp.first_bucket_bytes, 1, 1, 0);
    for (int k = 0; st == TDM_OK && k < L.ng; k++) {
      int64_t gk = L.g[k].hi - L.g[k].lo, blk = (gk + P - 1) / P;
      if (blk > part) part = blk;
      if (c->engine.dp.wire_dtype != TDM_F32 && c->engine.dp.wire_dtype) wire += gk * 2 + 64;
    }
    out->n_groups = L.ng;
    tdm__layout_free(&L);
  }
  if (st == TDM_OK && stage > 0) {
    st = tdm__layout_make(&L, params, stage == 3, c->engine.zero.bucket_bytes, 0, c->engine.zero.unit_modules, P, 1);
    owned = 0;
    for (int r = 0; st == TDM_OK && r < P; r++) {
      int64_t o = tdm__layout_owned(&L, r);
      if (o > owned) owned = o;
    }
    for (int k = 0; st == TDM_OK && k < L.ng; k++)
      for (int r = 0; r < P; r++) part = L.g[k].cut[r + 1] - L.g[k].cut[r] > part ? L.g[k].cut[r + 1] - L.g[k].cut[r] : part;
    for (int k = 0; st == TDM_OK && k < L.ng; k++)
      if (L.g[k].hi - L.g[k].lo > out->max_group) out->max_group = L.g[k].hi - L.g[k].lo;
    if (st == TDM_OK) G2 = tdm__layout_in_flight(&L, inline_comm);
    out->n_groups = L.ng;
    /* stage 2 on ranks that share memory, when the whole gradient is no larger than what stage 2
     * holds at its peak: the engine reduces in place in a shared buffer, as at stage 1 (zero.c) */
    int zero_copy = -1;
    const char *emu = getenv("TANDEM_NET_EMULATE");
    if (st == TDM_OK) st = tdm__env_switch("TANDEM_DP_ZERO_COPY", &zero_copy);
    if (st == TDM_OK && stage == 2 && P > 1 && (c->transport == TDM_TRANSPORT_SHM || c->transport == TDM_TRANSPORT_THREAD) &&
        zero_copy != 0 && !(emu && *emu) && tdm__layout_whole_in_flight(&L, inline_comm))
      in_place = 1;
    if (st == TDM_OK && stage == 3) { /* the token embedding is parameter 0 of both language models */
      int tied = c->model.kind == TDM_MODEL_GPT || (c->model.kind == TDM_MODEL_LLAMA && c->model.tie_embeddings) ? 0 : -1;
      u3 = stage3_peaks(&L, tied, c->engine.zero.prefetch && !inline_comm);
    }
  }
  tdm__layout_free(&L);
  if (st == TDM_OK && c->pipeline > 1) st = plan_pipeline(c, params, out);
  if (st == TDM_OK && grid3) { /* each rank keeps a store of its slices of the whole model (parameters and gradients)
                                  and the optimizer state of its chunks' slices; the activations are the pipeline's
                                  (an upper bound: the split heads and MLP units hold less) */
    int64_t most = 0;
    for (int t = 0; t < Tp; t++) most = tdm__tp_local_numel(params, Tp, t) > most ? tdm__tp_local_numel(params, Tp, t) : most;
    for (int r = 0; r < out->n_stages; r++) {
      tdm_plan_stage *ps = &out->stages[r];
      ps->bytes[TDM_MEM_PARAMS] = ps->bytes[TDM_MEM_GRADS] = 4 * most;
      ps->bytes[TDM_MEM_OPTIM] = (ps->bytes[TDM_MEM_OPTIM] + Tp - 1) / Tp;
    }
  }
  tdm_params_destroy(local);
  tdm_model_destroy(m);
  TDM__TRY(st);
  out->n_params = n;
  out->owned = owned;
  out->stage = stage;
  out->world = P;
  out->tensor = Tp;
  int64_t *b = out->bytes, held = tp ? owned : n; /* tensor parallelism: this rank's slices */
  /* parameters: whole below stage 3; then the shard and the units gathered at once */
  b[TDM_MEM_PARAMS] = 4 * (stage < 3 ? held : owned + u3.params);
  /* gradients: whole at stages 0-1; at 2-3 the shard and what backward has written and not yet
   * reduced, or everything while micro-batches accumulate */
  b[TDM_MEM_GRADS] = 4 * (stage < 2 || in_place ? held : owned + (accum > 1 ? n : stage == 2 ? G2 : u3.grads));
  int adam = c->optim.kind != TDM_OPT_SGD;
  /* tensor parallelism with ZeRO stage 1: the largest data rank's part of the slices (cut on rows) */
  int64_t o1 = tp && c->engine.tp.zero_stage == 1 && P > 1 ? (owned + P - 1) / P : owned;
  b[TDM_MEM_OPTIM] = 4 * o1 * (adam ? 2 : c->optim.momentum > 0 ? 1 : 0);
  int lm = c->model.kind == TDM_MODEL_GPT || c->model.kind == TDM_MODEL_LLAMA;
  int64_t T = lm ? (c->seq_len > 0 ? c->seq_len : c->model.block_size) : 1;
  tdm__tape_plan tr = {0, 0, 0}, ev = {0, 0, 0};
  if (tp) { /* GPT or Llama in f32 without recomputation (tdm_engine_check refuses the rest) */
    tr.bytes = tp_tape_total(&c->model, c->batch, T, accum, 1, &tr.nodes, Tp, Vt, c->engine.recompute, c->engine.precision);
    if (c->eval_batch > 0) ev.bytes = tp_tape_total(&c->model, c->eval_batch, T, 1, 0, NULL, Tp, Vt, c->engine.recompute, c->engine.precision);
  } else if (c->model.kind == TDM_MODEL_RESNET) { /* no walk yet: said, never a wrong number */
    out->act_unknown = 1;
  } else {
    TDM__TRY(tdm__plan_tape(&c->model, c->batch, T, accum, 1, c->engine.recompute, c->engine.precision, &tr));
    if (c->eval_batch > 0)
      TDM__TRY(tdm__plan_tape(&c->model, c->eval_batch, T, 1, 0, c->engine.recompute, c->engine.precision, &ev));
  }
  int64_t nodes = tr.nodes;
  out->act_train = tr.bytes;
  out->act_eval = ev.bytes;
  b[TDM_MEM_ACTIVATIONS] = out->act_train > out->act_eval ? out->act_train : out->act_eval;
  b[TDM_MEM_DATA] = c->data_bytes;
  /* communication: on shared memory a share of the segment every rank of the world maps; the
   * direct algorithms' scratch (P chunks of at most 1 MiB as large as the largest part) on every
   * communicator that sends messages: the data axis's unless it is the world on shared memory,
   * the tensor axis's likewise (its all-reduces of activations, row statistics and the norm's
   * segment sums are in rank order) */
  int shm = c->transport == TDM_TRANSPORT_SHM;
  if (W > 1 && shm) b[TDM_MEM_COMM] = (int64_t)(tdm__shm_segment_bytes(W) / (size_t)W) + wire;
  if (P > 1 && !(shm && P == W)) b[TDM_MEM_COMM] += (int64_t)P * 4 * (part < (1 << 18) ? part : (1 << 18)) + 64 + wire * !shm;
  if (Tp > 1 && !(shm && Tp == W)) {
    int64_t NC = c->batch * T * c->model.n_embd, N2 = 2 * c->batch * T, most = 0;
    int64_t need[3][2] = {{(NC + Tp - 1) / Tp, 4}, {(N2 + Tp - 1) / Tp, 8}, {(n_seg + Tp - 1) / Tp, 8}};
    for (int k = 0; k < 3; k++) {
      int64_t chunk = need[k][0] < (1 << 20) / need[k][1] ? need[k][0] : (1 << 20) / need[k][1];
      most = Tp * chunk * need[k][1] + 64 > most ? Tp * chunk * need[k][1] + 64 : most;
    }
    b[TDM_MEM_COMM] += most;
  }
  /* rank 0 hosts the rendezvous store for the whole run: its gate for strangers and a small
   * buffer per connected rank (src/comm/store/store.c) */
  if (W > 1) b[TDM_MEM_COMM] += (int64_t)tdm__net_gate_bytes() + 4096 * (int64_t)W;
  /* workspace: the parameters' bookkeeping as measured, the engine's segment sums, the tape's
   * arrays; the engine's own few structures are left out (a few KB), but for tensor parallelism's
   * per-parameter ones: the norm's pieces and their sums, the replicas' hashes, the slices, the
   * buffer that assembles parameters */
  b[TDM_MEM_WORKSPACE] = metadata + 8 * (n_seg + 1) + grown_array(nodes, 8) + grown_array(n_param_tensors + tr.leaves, 16);
  if (tp)
    b[TDM_MEM_WORKSPACE] += n_pieces * ((int64_t)sizeof(tdm__tp_piece) + 8) + 4 * (int64_t)n_param_tensors +
                            8 * (int64_t)W * n_rep + tdm__tp_model_bookkeeping(&c->model, n_param_tensors) +
                            (Tp > 1 ? TDM__TP_STAGE_BYTES : 0);
  /* traffic: stages 0-2 reduce-scatter and all-gather Ψ (2Ψ(N-1)/N), stage 3 gathers twice; tensor
   * parallelism all-reduces activations of B x T x C twice per block forward and backward, and
   * once more for the embedding and the head (2(T-1)/T of each) */
  out->comm_per_step = 4.0 * (double)held * (double)(P - 1) / P * (stage == 3 ? 3 : 2);
  if (tp && Tp > 1)
    out->comm_per_step += (double)accum * (4 * c->model.n_layer + 2) * 4.0 * (double)(c->batch * T * c->model.n_embd) *
                          2.0 * (Tp - 1) / Tp;
  if (out->pipeline > 1) { /* per rank: the stage that needs most, with what every rank holds besides */
    int worst = 0;
    for (int r = 0; r < out->n_stages; r++) {
      tdm_plan_stage *ps = &out->stages[r];
      ps->bytes[TDM_MEM_DATA] = b[TDM_MEM_DATA], ps->bytes[TDM_MEM_WORKSPACE] = b[TDM_MEM_WORKSPACE];
      ps->bytes[TDM_MEM_COMM] += b[TDM_MEM_COMM];
      ps->total = 0;
      for (int k = 0; k < TDM_MEM_COUNT; k++) ps->total += ps->bytes[k];
      if (ps->total > out->stages[worst].total) worst = r;
    }
    memcpy(b, out->stages[worst].bytes, sizeof out->stages[worst].bytes);
    out->owned = out->stages[worst].bytes[TDM_MEM_GRADS] / 4;
  }
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
  if (!f || !p) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_plan_print: %s is NULL", !f ? "the stream f" : "the plan p");
    return;
  }
  static const char *what[TDM_MEM_COUNT] = {
      "parameters (fp32)", "gradients", "optimizer state", "activations (tape, peak of a step or an evaluation)",
      "communication buffers", "data sets and batches", "workspace"};
  char h[32];
  if (p->pipeline > 1) {
    fprintf(f, "pipeline: %s, %d stages%s x %d data, %d micro-batches: bubble %.3f of the step (idle/busy %.3f), simulated "
               "with forward 1, backward 2\n",
            p->schedule, p->pipeline, p->virtual_stages > 1 ? " (interleaved)" : "", p->world, p->microbatches, p->bubble,
            p->bubble_ratio);
    for (int r = 0; r < p->n_stages; r++) {
      const tdm_plan_stage *ps = &p->stages[r];
      char a[32], t[32];
      human(a, sizeof a, (double)ps->bytes[TDM_MEM_ACTIVATIONS]);
      human(t, sizeof t, (double)ps->total);
      fprintf(f, "  stage %-3d blocks %d-%d%s  holds at most %d %smicro-batch%s: activations %s, total %s\n", r, ps->first_block,
              ps->last_block, p->virtual_stages > 1 ? " and more" : "", ps->peak, p->virtual_stages > 1 ? "chunk " : "",
              ps->peak == 1 ? "" : "es", a, t);
    }
  }
  if (p->tensor > 1 && p->pipeline > 1)
    fprintf(f, "memory plan per rank: tensor parallel %d x pipeline %d x data parallel %d (the stage that needs most), %lld parameters (this rank's slices: at most %lld)",
            p->tensor, p->pipeline, p->world, (long long)p->n_params, (long long)p->owned);
  else if (p->tensor > 1)
    fprintf(f, "memory plan per rank: tensor parallel %d x data parallel %d, %lld parameters (this rank's slices: at most %lld)",
            p->tensor, p->world, (long long)p->n_params, (long long)p->owned);
  else
    fprintf(f, "memory plan per rank: %s, %d rank%s, %lld parameters",
            p->pipeline > 1 ? "pipeline (the stage that needs most)" : p->stage ? "ZeRO" : "data parallel", p->world * (p->pipeline > 1 ? p->pipeline : 1),
            p->world * (p->pipeline > 1 ? p->pipeline : 1) == 1 ? "" : "s", (long long)p->n_params);
  if (p->stage) fprintf(f, ", stage %d (%d %s, this rank updates at most %lld)", p->stage, p->n_groups,
                        p->stage == 3 ? "units" : "buckets", (long long)p->owned);
  fprintf(f, "\n");
  for (int k = 0; k < TDM_MEM_COUNT; k++) {
    human(h, sizeof h, (double)p->bytes[k]);
    if (k == TDM_MEM_ACTIVATIONS && p->act_unknown)
      fprintf(f, "  %-14s %12s  %s\n", tdm_mem_category_name((tdm_mem_category)k), "?", "NOT ESTIMATED for this model (resnet): left out of the total");
    else
      fprintf(f, "  %-14s %12s  %s\n", tdm_mem_category_name((tdm_mem_category)k), h, what[k]);
  }
  human(h, sizeof h, (double)p->total);
  fprintf(f, "  %-14s %12s%s\n", "total", h, p->act_unknown ? "  without the activations" : "");
  if (limit > 0) {
    char l[32];
    human(l, sizeof l, (double)limit);
    fprintf(f, "  %s the memory limit of %s%s\n", p->total <= limit ? "fits" : "EXCEEDS", l,
            p->act_unknown && p->total <= limit ? " without the activations, which are not estimated" : "");
  }
}

tdm_status tdm_plan_check(const tdm_plan *p, int64_t limit) {
  if (!p) return tdm__set_error(TDM_ERR_INVALID_ARG, "plan_check: NULL plan");
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
