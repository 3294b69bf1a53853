/* The planner's activations: one micro-batch of a model walked op by op with the tape's rules of
 * allocation, forward then backward, exact to the byte. Every arena block is rounded up to 64
 * bytes: a tensor is its struct and its data, a recorded op adds a node, and backward gives each
 * activation that needs one a gradient where it is first touched (walking the ops in reverse).
 * Ops take transient scratch between a mark and a rewind (an attention backward's scores, a 16-bit
 * op's f32 copies, a recomputed block), which raises the peak without staying; so the walk keeps
 * the running total and its peak rather than a sum. */
#include <string.h>

#include "autograd/tape_impl.h"
#include "core/internal.h"
#include "parallel/plan_tape.h"
#include "tandem/kernels.h"

static int64_t al(int64_t b) {
  b = (b + 63) / 64 * 64;
  return b ? b : 64;
}
#define TENSOR al((int64_t)sizeof(tdm_tensor))
#define NODE al((int64_t)sizeof(tdm_node))

typedef struct {
  int64_t n;  /* elements */
  int esz;    /* bytes per element */
  int grad;   /* requires a gradient */
  int arena;  /* an activation: its gradient comes from the arena (parameters' live in their buffer) */
  int done;   /* backward has made its gradient */
} sim_t;

typedef struct {
  int in[4], n_in;
  int64_t bwd_trans;   /* transient bytes while its backward runs, above the gradients it takes */
  int64_t bwd_persist; /* scratch its backward takes and keeps (the convolution's columns) */
} sim_op;

typedef struct sim {
  int64_t cur, peak, nodes, inner_nodes;
  int train;  /* gradients recorded (a training micro-batch) */
  int esz;    /* bytes of an activation: 4, or 2 under autocast */
  int recompute; /* tdm_recompute */
  int fp16;      /* loss scaling: backward has a seed tensor */
  sim_t *t;
  int nt, capt;
  sim_op *op;
  int nop, capop;
  int oom;
} sim;

static void bump(sim *s, int64_t bytes) {
  s->cur += bytes;
  if (s->cur > s->peak) s->peak = s->cur;
}
static void transient(sim *s, int64_t bytes) {
  if (s->cur + bytes > s->peak) s->peak = s->cur + bytes;
}

static int new_t(sim *s, int64_t n, int esz, int grad, int arena) {
  if (s->nt == s->capt) {
    int cap = s->capt ? 2 * s->capt : 256;
    sim_t *p = tdm__malloc(sizeof *p * (size_t)cap);
    if (!p) {
      s->oom = 1;
      return 0;
    }
    if (s->t) memcpy(p, s->t, sizeof *p * (size_t)s->nt);
    tdm__free(s->t);
    s->t = p, s->capt = cap;
  }
  s->t[s->nt] = (sim_t){n, esz, grad, arena, 0};
  return s->nt++;
}

/* The batch: its tensor and data, no gradient. */
static int input(sim *s, int64_t n, int esz) {
  bump(s, TENSOR + al(n * esz));
  return new_t(s, n, esz, 0, 0);
}
/* A parameter: nothing on the tape; its gradient lives in the parameters' buffer. */
static int param(sim *s, int64_t n) { return new_t(s, n, 4, 1, 0); }

static int recorded(sim *s, int n_in, const int *ins) {
  int any = 0;
  for (int i = 0; i < n_in; i++) any |= s->t[ins[i]].grad;
  return s->train && any;
}

static void push_op(sim *s, int n_in, const int *ins, int64_t bwd_trans) {
  if (s->nop == s->capop) {
    int cap = s->capop ? 2 * s->capop : 256;
    sim_op *p = tdm__malloc(sizeof *p * (size_t)cap);
    if (!p) {
      s->oom = 1;
      return;
    }
    if (s->op) memcpy(p, s->op, sizeof *p * (size_t)s->nop);
    tdm__free(s->op);
    s->op = p, s->capop = cap;
  }
  sim_op *o = &s->op[s->nop++];
  memset(o, 0, sizeof *o);
  o->n_in = n_in < 4 ? n_in : 4;
  memcpy(o->in, ins, sizeof(int) * (size_t)o->n_in);
  o->bwd_trans = bwd_trans;
  s->nodes++;
}

/* An op: its output of n elements (esz bytes each) and saved bytes (already rounded) persist,
 * fwd_trans is taken and given back before its node is recorded; backward's bwd_trans likewise. */
static int op(sim *s, int64_t n, int esz, int n_in, const int *ins, int64_t saved, int64_t fwd_trans, int64_t bwd_trans) {
  int rec = recorded(s, n_in, ins);
  bump(s, TENSOR + al(n * esz) + saved);
  transient(s, fwd_trans);
  if (rec) {
    bump(s, NODE + (n_in > 4 ? al(8 * n_in) : 0));
    push_op(s, n_in, ins, bwd_trans);
  }
  return new_t(s, n, esz, rec, 1);
}

/* A view: only its struct, recorded and given a gradient like an op's output. */
static int view(sim *s, int64_t n, int esz, int in) {
  int rec = recorded(s, 1, &in);
  bump(s, TENSOR);
  if (rec) {
    bump(s, NODE);
    push_op(s, 1, &in, 0);
  }
  return new_t(s, n, esz, rec, 1);
}

/* Each recorded op in reverse, taking the gradients of its inputs that are activations not yet
 * given one, then its transient scratch. */
static void backward_ops(sim *s) {
  for (int k = s->nop - 1; k >= 0; k--) {
    sim_op *o = &s->op[k];
    for (int i = 0; i < o->n_in; i++) {
      sim_t *t = &s->t[o->in[i]];
      if (t->grad && t->arena && !t->done) {
        bump(s, TENSOR + al(t->n * (t->esz == 2 ? 2 : 4)));
        t->done = 1;
      }
    }
    transient(s, o->bwd_trans);
    bump(s, o->bwd_persist);
  }
}

/* Backward from the loss: its gradient (and a seed tensor of its own), then the ops. */
static void backward(sim *s, int loss, int64_t seed_bytes) {
  bump(s, seed_bytes);
  if (s->t[loss].grad && !s->t[loss].done) {
    bump(s, TENSOR + al(4));
    s->t[loss].done = 1;
  }
  backward_ops(s);
}

/* ---- the ops the models use -------------------------------------------------------------------
 * Under autocast (esz 2) every op converts what it reads to f32 scratch and computes its output
 * there before storing it in 16 bits; products also round their f32 inputs (parameters, the
 * batch) to the 16-bit precision in scratch. The terms below are those scratch blocks, as each op
 * takes them (src/autograd/mixed.c's helpers). */
static int64_t cv(const sim *s, int t) { return s->t[t].esz == 2 ? al(4 * s->t[t].n) : 0; } /* tdm__f32 */
static int64_t rnd(const sim *s, int t) { return s->esz == 2 ? al(4 * s->t[t].n) : cv(s, t); } /* tdm__f32_round */
static int64_t gcv(const sim *s, int t) { return s->t[t].grad ? cv(s, t) : 0; }                 /* tdm__grad_f32 */
static int64_t out16(const sim *s, int64_t n) { return s->esz == 2 ? al(4 * n) : 0; }          /* tdm__f32_out */

/* An op whose backward reads its output's gradient as f32: that is known once the output exists. */
static int op_dy(sim *s, int64_t n, int esz, int n_in, const int *ins, int64_t saved, int64_t fwd, int64_t bwd) {
  int y = op(s, n, esz, n_in, ins, saved, fwd, bwd);
  if (s->t[y].grad) s->op[s->nop - 1].bwd_trans += cv(s, y);
  return y;
}

/* A weight beyond TDM_LP_PANEL floats is rounded a panel at a time: output rows forward, input
 * columns backward. */
static int64_t rnd_w(const sim *s, int64_t in, int64_t out, int fwd) {
  if (s->esz != 2) return 0; /* f32: the weight itself */
  if (in * out <= TDM_LP_PANEL) return al(4 * in * out);
  int64_t along = fwd ? in : out, k = TDM_LP_PANEL / along > 0 ? TDM_LP_PANEL / along : 1;
  return al(4 * k * along);
}
static int linear(sim *s, int x, int w, int b, int64_t N, int64_t out) {
  int ins[3] = {x, w, b};
  int64_t in = s->t[w].n / out, big = s->esz == 2 && s->t[w].n > TDM_LP_PANEL;
  int64_t fwd = rnd(s, x) + (big ? out16(s, N * out) + rnd_w(s, in, out, 1) : rnd_w(s, in, out, 1) + out16(s, N * out));
  int64_t bwd = (s->t[x].grad ? (big ? gcv(s, x) + rnd_w(s, in, out, 0) : rnd_w(s, in, out, 0) + gcv(s, x)) : 0) + rnd(s, x);
  return op_dy(s, N * out, s->esz, b >= 0 ? 3 : 2, ins, 0, fwd, bwd);
}
/* relu, gelu: backward reads x */
static int unary(sim *s, int x) {
  int64_t n = s->t[x].n;
  return op_dy(s, n, s->esz, 1, &x, 0, cv(s, x) + out16(s, n), gcv(s, x) + cv(s, x));
}
static int add(sim *s, int a, int b) {
  int ins[2] = {a, b};
  int64_t n = s->t[a].n > s->t[b].n ? s->t[a].n : s->t[b].n;
  return op_dy(s, n, s->esz, 2, ins, 0, cv(s, a) + cv(s, b) + out16(s, n), gcv(s, a) + gcv(s, b));
}
static int dropout(sim *s, int x, float p) {
  if (!s->train || !(p > 0)) return x;
  int64_t n = s->t[x].n;
  return op_dy(s, n, s->esz, 1, &x, 0, cv(s, x) + out16(s, n), gcv(s, x));
}
static int layernorm(sim *s, int x, int w, int b, int64_t N) {
  int ins[3] = {x, w, b};
  int64_t n = s->t[x].n;
  return op_dy(s, n, s->esz, 3, ins, al(8 * N), cv(s, x) + out16(s, n), gcv(s, x) + cv(s, x));
}
static int rmsnorm(sim *s, int x, int w, int64_t N) {
  int ins[2] = {x, w};
  int64_t n = s->t[x].n;
  return op_dy(s, n, s->esz, 2, ins, al(4 * N), cv(s, x) + out16(s, n), gcv(s, x) + cv(s, x));
}
static int cross_entropy(sim *s, int logits, int targets, int64_t N) {
  int ins[2] = {logits, targets};
  return op(s, 1, 4, 2, ins, al(4 * N), cv(s, logits), gcv(s, logits) + cv(s, logits));
}
static int embedding(sim *s, int table, int idx, int64_t N, int64_t C) {
  int ins[2] = {table, idx};
  return op_dy(s, N * C, s->esz, 2, ins, 0, out16(s, N * C), 0);
}
/* tdm_lm_head (src/autograd/ops_head.c): a block of R0 = min(V, TDM_HEAD_ROWS) rows of the table at
 * a time. Forward: the input rounded, the f32 logits and (16-bit) a panel of the table rounded.
 * Backward: x's f32 gradient, the input rounded for the table's gradient (untied), and (16-bit) a
 * block of the logits' gradient as f32 and a panel of the table; tied, the embedding's backward
 * (emb_op) takes the input rounded and a block of the logits' gradient instead. */
static int lm_head(sim *s, int x, int w, int64_t N, int64_t V, int emb_op) {
  int ins[2] = {x, w}, h16 = s->esz == 2;
  int64_t C = s->t[w].n / V, R0 = V < TDM_HEAD_ROWS ? V : TDM_HEAD_ROWS, rows = TDM_LP_PANEL / C > 0 ? TDM_LP_PANEL / C : 1;
  int64_t panel = TDM_LP_PANEL < C * R0 ? TDM_LP_PANEL : C * R0;
  int64_t fwd = rnd(s, x) + out16(s, N * V) + (h16 ? al(4 * (rows < R0 ? rows : R0) * C) : 0);
  int64_t bwd = gcv(s, x) + (emb_op >= 0 ? 0 : rnd(s, x)) + (h16 ? al(4 * N * R0) + (s->t[x].grad ? al(4 * panel) : 0) : 0);
  int y = op(s, N * V, s->esz, 2, ins, 0, fwd, bwd);
  if (emb_op >= 0 && s->t[y].grad) s->op[emb_op].bwd_trans += rnd(s, x) + (h16 ? al(4 * N * R0) : 0);
  return y;
}
/* Attention keeps the probabilities (B, NH, T, T) in the activation dtype (computed in f32 scratch,
 * a chunk of batches at a time, when that is 16 bits); its backward takes a chunk's worth as
 * scratch, and an f32 chunk of 16-bit ones. Under selective recomputation a recorded one keeps
 * none: forward computes them chunk by chunk in scratch, backward rebuilds them there. */
static int attention(sim *s, int n_in, const int *ins, int64_t out, int64_t B, int64_t NH, int64_t groups, int64_t T) {
  int keep = !(s->recompute == TDM_RECOMPUTE_SELECTIVE && recorded(s, n_in, ins));
  int64_t PT = B * NH * T * T, chunk = al(4 * tdm__attn_batches(B, groups) * NH * T * T);
  int64_t fwd = out16(s, out) + (s->esz == 2 || !keep ? chunk : 0), bwd = chunk + (keep && s->esz == 4 ? 0 : chunk);
  for (int i = 0; i < n_in; i++) fwd += cv(s, ins[i]), bwd += gcv(s, ins[i]) + cv(s, ins[i]);
  return op_dy(s, out, s->esz, n_in, ins, keep ? al(PT * s->esz) : 0, fwd, bwd);
}
static int rope(sim *s, int x, int64_t T, int64_t hs) {
  int64_t n = s->t[x].n;
  return op_dy(s, n, s->esz, 1, &x, al(4 * (2 * T * (hs / 2) + 1)), cv(s, x) + out16(s, n), gcv(s, x));
}
/* backward under autocast converts a piece at a time: five f32 buffers of TDM_LP_PIECE elements */
static int swiglu(sim *s, int g, int u) {
  int ins[2] = {g, u};
  int64_t n = s->t[g].n, piece = n < TDM_LP_PIECE ? n : TDM_LP_PIECE;
  int y = op(s, n, s->esz, 2, ins, 0, cv(s, g) + cv(s, u) + out16(s, n), s->esz == 2 ? al(4 * 5 * (piece ? piece : 1)) : 0);
  return y;
}

/* ---- the models -------------------------------------------------------------------------------- */
typedef struct {
  const tdm_model_config *m;
  int64_t B, T;
} shape;

static int gpt_block(sim *s, const shape *sh, int x) {
  const tdm_model_config *m = sh->m;
  int64_t N = sh->B * sh->T, C = m->n_embd, NH = m->n_head;
  int ln1w = param(s, C), ln1b = param(s, C), aw = param(s, 3 * C * C), ab = param(s, 3 * C), pw = param(s, C * C),
      pb = param(s, C), ln2w = param(s, C), ln2b = param(s, C), fw = param(s, 4 * C * C), fb = param(s, 4 * C),
      mw = param(s, 4 * C * C), mb = param(s, C);
  int h = linear(s, layernorm(s, x, ln1w, ln1b, N), aw, ab, N, 3 * C);
  h = attention(s, 1, &h, N * C, sh->B, NH, NH, sh->T);
  h = dropout(s, linear(s, h, pw, pb, N, C), m->dropout);
  x = add(s, x, h);
  h = unary(s, linear(s, layernorm(s, x, ln2w, ln2b, N), fw, fb, N, 4 * C)); /* gelu */
  h = dropout(s, linear(s, h, mw, mb, N, C), m->dropout);
  return add(s, x, h);
}

static int llama_block(sim *s, const shape *sh, int x) {
  const tdm_model_config *m = sh->m;
  int64_t N = sh->B * sh->T, C = m->n_embd, NH = m->n_head, hs = C / NH, KV = m->n_kv_head * hs, F = m->ffn_hidden;
  int n1 = param(s, C), wq = param(s, C * C), wk = param(s, KV * C), wv = param(s, KV * C), wo = param(s, C * C),
      n2 = param(s, C), wg = param(s, F * C), wu = param(s, F * C), wd = param(s, C * F);
  int h = rmsnorm(s, x, n1, N);
  int q = rope(s, linear(s, h, wq, -1, N, C), sh->T, hs);
  int k = rope(s, linear(s, h, wk, -1, N, KV), sh->T, hs);
  int qkv[3] = {q, k, linear(s, h, wv, -1, N, KV)};
  int a = attention(s, 3, qkv, N * C, sh->B, NH, m->n_kv_head, sh->T);
  x = add(s, x, dropout(s, linear(s, a, wo, -1, N, C), m->dropout));
  h = rmsnorm(s, x, n2, N);
  h = swiglu(s, linear(s, h, wg, -1, N, F), linear(s, h, wu, -1, N, F));
  return add(s, x, dropout(s, linear(s, h, wd, -1, N, C), m->dropout));
}

typedef int (*block_walk)(sim *s, const shape *sh, int x);

static void sim_free(sim *s) {
  tdm__free(s->t);
  tdm__free(s->op);
}

/* A block under block recomputation (tdm_checkpoint): forward keeps its output, the call and two
 * arrays of its inputs (the block's input and its parameters) and a node; the block itself runs
 * with gradients off in scratch. Backward runs it again in scratch, recording its nodes, on a
 * detached view of the input, and backpropagates through it: the peak of that is transient. */
static int checkpointed(sim *s, const shape *sh, block_walk walk, int x, int n_params) {
  if (!s->train || s->recompute != TDM_RECOMPUTE_BLOCK) return walk(s, sh, x);
  sim inner;
  memset(&inner, 0, sizeof inner);
  inner.esz = s->esz, inner.recompute = TDM_RECOMPUTE_NONE; /* a nested checkpoint is not made */
  int xi = new_t(&inner, s->t[x].n, s->t[x].esz, 0, 1);
  walk(&inner, sh, xi); /* gradients off */
  int64_t fwd_trans = inner.peak;
  s->oom |= inner.oom;
  sim_free(&inner);
  memset(&inner, 0, sizeof inner);
  inner.esz = s->esz, inner.train = 1, inner.recompute = TDM_RECOMPUTE_NONE;
  bump(&inner, TENSOR); /* the detached view */
  xi = new_t(&inner, s->t[x].n, s->t[x].esz, s->t[x].grad, 1);
  int yi = walk(&inner, sh, xi);
  if (!inner.oom) inner.t[yi].done = 1; /* its gradient is the first run's output's */
  backward_ops(&inner);
  int64_t bwd_trans = inner.peak;
  if (inner.nodes > s->inner_nodes) s->inner_nodes = inner.nodes;
  s->oom |= inner.oom;
  sim_free(&inner);
  int ins[1] = {x};
  int rec = recorded(s, 1, ins) || n_params > 0;
  bump(s, TENSOR + al(s->t[x].n * s->t[x].esz) + al(16)); /* the output and the call */
  transient(s, fwd_trans);
  bump(s, al(8 * (1 + n_params)));
  if (rec) {
    bump(s, NODE + al(8 * (1 + n_params)));
    push_op(s, 1, ins, bwd_trans);
  }
  return new_t(s, s->t[x].n, s->t[x].esz, rec, 1);
}

static void model(sim *s, const tdm_model_config *m, int64_t B, int64_t T, int64_t accum) {
  int loss = -1;
  switch (m->kind) {
  case TDM_MODEL_MLP: {
    int x = input(s, B * m->in_features, 4), y = input(s, B, 4);
    for (int i = 0; i <= m->n_hidden; i++) {
      int64_t in = i ? m->hidden[i - 1] : m->in_features, out = i < m->n_hidden ? m->hidden[i] : m->n_classes;
      x = linear(s, x, param(s, in * out), param(s, out), B, out);
      if (i < m->n_hidden) x = dropout(s, unary(s, x), m->dropout); /* relu */
    }
    loss = cross_entropy(s, x, y, B);
    break;
  }
  case TDM_MODEL_CNN: {
    int x = input(s, B * m->in_channels * m->height * m->width, 4), y = input(s, B, 4);
    int64_t H = m->height, W = m->width, ci = m->in_channels, ch[2] = {m->c1, m->c2};
    for (int k = 0; k < 2; k++) { /* conv 5x5 pad 2 (its shape and one image's columns kept), relu, maxpool 2 (argmax kept) */
      int ins[3] = {x, param(s, ch[k] * ci * 25), param(s, ch[k])};
      int64_t cols = 4 * ci * 25 * H * W;
      x = op(s, B * ch[k] * H * W, 4, 3, ins, al((int64_t)sizeof(tdm_conv_shape)) + al(cols), 0, 0);
      if (s->t[x].grad) s->op[s->nop - 1].bwd_persist = al(cols); /* backward's columns, kept */
      x = unary(s, x);
      H /= 2, W /= 2;
      x = op(s, B * ch[k] * H * W, 4, 1, &x, al(4 * B * ch[k] * H * W), 0, 0);
      ci = ch[k];
    }
    x = dropout(s, view(s, B * ci * H * W, 4, x), m->dropout); /* flatten */
    x = linear(s, x, param(s, ci * H * W * m->n_classes), param(s, m->n_classes), B, m->n_classes);
    loss = cross_entropy(s, x, y, B);
    break;
  }
  case TDM_MODEL_GPT: {
    shape sh = {m, B, T};
    int64_t N = B * T, C = m->n_embd;
    int x = input(s, N, 4), y = input(s, N, 4), wte = param(s, m->vocab_size * C), wpe = param(s, m->block_size * C);
    int tok = embedding(s, wte, x, N, C), emb = s->t[tok].grad ? s->nop - 1 : -1;
    int h = add(s, tok, view(s, T * C, 4, wpe));
    h = dropout(s, h, m->dropout);
    for (int64_t l = 0; l < m->n_layer; l++) h = checkpointed(s, &sh, gpt_block, h, 12);
    h = layernorm(s, h, param(s, C), param(s, C), N);
    loss = cross_entropy(s, lm_head(s, h, wte, N, m->vocab_size, emb), y, N);
    break;
  }
  case TDM_MODEL_LLAMA: {
    shape sh = {m, B, T};
    int64_t N = B * T, C = m->n_embd;
    int x = input(s, N, 4), y = input(s, N, 4), emb = param(s, m->vocab_size * C);
    int tok = embedding(s, emb, x, N, C), eop = s->t[tok].grad && m->tie_embeddings ? s->nop - 1 : -1;
    int h = dropout(s, tok, m->dropout);
    for (int64_t l = 0; l < m->n_layer; l++) h = checkpointed(s, &sh, llama_block, h, 9);
    h = rmsnorm(s, h, param(s, C), N);
    loss = cross_entropy(s, lm_head(s, h, m->tie_embeddings ? emb : param(s, m->vocab_size * C), N, m->vocab_size, eop), y, N);
    break;
  }
  default:
    return;
  }
  if (s->train) backward(s, loss, accum > 1 || s->fp16 ? TENSOR + al(4) : 0); /* backward's seed: 1/accum, x the loss scale */
}

tdm_status tdm__plan_tape(const tdm_model_config *m, int64_t B, int64_t T, int64_t accum, int train, tdm_recompute recompute,
                          tdm_dtype precision, tdm__tape_plan *out) {
  if (m->kind != TDM_MODEL_MLP && m->kind != TDM_MODEL_CNN && m->kind != TDM_MODEL_GPT && m->kind != TDM_MODEL_LLAMA)
    return tdm__set_error(TDM_ERR_NOT_SUPPORTED, "plan: the activations of --model %s are not estimated (no walk of its tape)",
                          tdm_model_kind_name(m->kind));
  sim s;
  memset(&s, 0, sizeof s);
  s.train = train;
  s.esz = precision == TDM_BF16 || precision == TDM_F16 ? 2 : 4;
  s.fp16 = precision == TDM_F16;
  s.recompute = recompute;
  model(&s, m, B, T, accum);
  memset(out, 0, sizeof *out);
  out->bytes = s.peak;
  out->nodes = s.nodes + s.inner_nodes;
  out->leaves = s.inner_nodes ? 1 : 0;
  sim_free(&s);
  if (s.oom) return tdm__set_error(TDM_ERR_NO_MEMORY, "plan: out of memory walking the model");
  return TDM_OK;
}
