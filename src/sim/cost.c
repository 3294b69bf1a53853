/* Collective costs with the alpha-beta-gamma model: one row per algorithm of tandem's table
 * (src/comm/algos.c, same order), each costing the steps that algorithm really runs
 * (src/comm/algo/): the ring's 2(p-1) exchanges of n/p, recursive doubling's log p exchanges of
 * n with the fold of a non-power of two, halving-doubling's halving then doubling, the binary tree's
 * reduce up and broadcast down (its critical path, computed), direct's p - 1 messages at once, and
 * the hierarchical composition. Messages above 1 MiB go as 1 MiB chunks (tdm__sendrecv_reduce),
 * each paying alpha; the tree's broadcast down and direct's all-gather send theirs whole.
 *
 * Every step is costed by step(): the wire (alpha, beta: no core needed) plus the CPU work of the
 * rank (the messages' cpu_alpha and cpu_beta, the reduction's gamma); and when the ranks working at
 * once on a node need more than its cores (cpu_cores), that work takes `active` ranks' work over
 * cpu_cores instead, after the wire: the ranks of a step wait on their links together and then
 * want the cores together (the validation's ring exchanges at 3 and 8 ranks on 2 cores fit this
 * within 5-8% on average, the wire hiding the crowding 12-22%). So ranks sharing cores cost what
 * they cost and a tree level with two ranks busy is not charged for eight.
 *
 * Placement: rank r lives on node r / ranks_per_node. A step in which any pair crosses nodes
 * costs the inter-node link; when every rank of a node crosses at once (recursive doubling's far
 * steps) they share the node's link, beta times the ranks per node, unless links are pairwise. */
#include "core/internal.h"
#include "tandem/sim.h"
#include "sim/sim_impl.h"

#include <math.h>
#include <string.h>

#define CHUNK (1048576.0)

typedef double (*cost_fn)(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p);

static int node_of(const tdm_sim_cluster *k, int r) { return r / (k->ranks_per_node > 0 ? k->ranks_per_node : 1); }
static int pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }
static int floor_log2(int p) {
  int l = 0;
  while ((1 << (l + 1)) <= p) l++;
  return l;
}
static int imin(int a, int b) { return a < b ? a : b; }
static double chunks_of(double n) { return n > CHUNK ? ceil(n / CHUNK) : 1; }
/* Ranks of the busiest node among p that all work at once. */
static int on_node(const tdm_sim_cluster *k, int p) { return imin(p, k->ranks_per_node > 0 ? k->ranks_per_node : 1); }

/* How much of a message of `piece` bytes is copied from beyond the L2 (big_bytes): none up to
 * half of it (the message and its copy in the socket buffers fit), all from its size on, in
 * between in proportion. On the 2-core VM at 8 ranks, direct's all-gather of 512 KiB blocks
 * costs 0.24 ns/B a message's CPU work, of 1 MiB blocks 0.53 and of 8 MiB 0.54: a step at the
 * L2, the largest size inside it as cheap as the smallest, not only the bytes beyond it dearer. */
double tdm__sim_big_share(const tdm_sim_link *l, double piece) {
  if (!(l->big_bytes > 0) || piece <= l->big_bytes / 2) return 0;
  return piece >= l->big_bytes ? 1 : (piece - l->big_bytes / 2) / (l->big_bytes / 2);
}

/* One step. Each rank sends `fan` messages of n bytes at once to different peers, as `chunks`
 * pieces each (cross: ranks of a node sending across at once, sharing its link), does `cpu_msgs`
 * messages' worth of CPU work (1: it sends one and receives one; 0.5: one end of a message) and
 * reduces `red` bytes; `active` ranks of the node do the same at once. */
double tdm__sim_step(const tdm_sim_cluster *k, const tdm_sim_link *l, double n, double chunks, int fan, double cross, double cpu_msgs,
                   double red, int active) {
  double wire = l->pairwise ? chunks * l->alpha + n * l->beta /* every message on a link of its own */
                            : fan * chunks * l->alpha + n * l->beta * fan * cross;
  int fanned = fan > 1 && (l->fan_alpha > 0 || l->fan_beta > 0); /* messages to several peers at once: their own terms */
  double ca = fanned ? l->fan_alpha : l->cpu_alpha, cb = fanned ? l->fan_beta : l->cpu_beta;
  double factor = fanned && l->fan_big_factor >= 1 ? l->fan_big_factor : l->big_factor;
  /* a piece that outgrows the L2 costs big_factor on every byte: a message's own size decides,
   * not its step's (a fan of 7 x 512 KiB, 3.5 MiB together, costs a 512 KiB message's per byte).
   * A message of several chunks goes as whole 1 MiB chunks and the rest (tdm__sendrecv_reduce):
   * 1.02 MiB is a chunk of 1 MiB and one of 23 KiB, not two of half a MiB */
  double share = 0;
  if (factor > 1 && n > 0) {
    double full = chunks > 1 ? (chunks - 1) * CHUNK : 0;
    share = full > 0 && n > full && n <= full + CHUNK ? (full * tdm__sim_big_share(l, CHUNK) + (n - full) * tdm__sim_big_share(l, n - full)) / n
                                                      : tdm__sim_big_share(l, chunks > 0 ? n / chunks : n);
  }
  double per_byte = 1 + share * (factor - 1);
  double cpu = cpu_msgs * (chunks * ca + n * cb * per_byte) + red * l->gamma;
  /* the ranks of a step run in lockstep: all wait on their links at once, then all want a core at
   * once, so crowded cores add to the wire rather than hide under it; stagger is the share of that
   * excess that does hide (a rank at work while others wait: then the step is the larger of wire
   * + work and the crowded work). Fan steps keep lockstep: their terms were fitted as such. */
  if (k->cpu_cores > 0 && active * cpu / k->cpu_cores > cpu) {
    double excess = active * cpu / k->cpu_cores - cpu, hidden = excess > wire ? excess - wire : 0;
    double stagger = fanned ? 0 : l->stagger;
    cpu += excess - stagger * (excess - hidden);
  }
  return wire + cpu;
}
/* A one-way message (a fold, the tree's edges, a broadcast's, a pipeline's send): half a message's
 * work at each end, and its receiver, blocked waiting for it, wakes (an exchange's ranks are busy
 * sending when theirs arrive). The wake-up is an idle core's: with `node` ranks sharing fewer
 * cores, the receiver's core runs another rank the rest of the time, cpu_cores / node of it idle,
 * and its wake-ups meet either of the VM's two modes (wake_shared, their mean); a rank with a core
 * of its own that repeats a collective meets the fast one (the 2-rank tree's 1 KiB all-reduce in
 * five validations: 0.43-0.46 ms, two one-way messages of the fast mode's 0.21). */
static double oneway(const tdm_sim_cluster *k, const tdm_sim_link *l, double n, double chunks, double red, int active, int node) {
  int shared = k->cpu_cores > 0 && node > k->cpu_cores;
  double idle = shared ? k->cpu_cores / node : 1, wake = shared && l->wake_shared > 0 ? l->wake_shared : l->wake;
  return wake * idle + tdm__sim_step(k, l, n, chunks, 1, 1, 0.5, red, active);
}
/* An exchange: every active rank sends n to one peer while receiving n from another (reducing red). */
static double xchg(const tdm_sim_cluster *k, const tdm_sim_link *l, double n, double cross, double red, int active) {
  return tdm__sim_step(k, l, n, chunks_of(n), 1, cross, 1, red, active);
}

/* The link a step of distance d (partner r xor d, or r + d around a ring) uses among p ranks;
 * *cross: how many ranks of a node cross at once (every rank of it, when any does). */
static const tdm_sim_link *xor_link(const tdm_sim_cluster *k, int p, int d, double *cross) {
  *cross = 1;
  for (int r = 0; r < p; r++)
    if ((r ^ d) < p && node_of(k, r) != node_of(k, r ^ d)) {
      *cross = k->ranks_per_node < p ? k->ranks_per_node : p;
      return &k->inter;
    }
  return &k->intra;
}
static const tdm_sim_link *ring_link(const tdm_sim_cluster *k, int p) { return p > k->ranks_per_node ? &k->inter : &k->intra; }

/* ---- ring: reduce-scatter (p-1 steps of n/p, reduced), all-gather (p-1 steps of n/p) ----------------
 * active: ranks of a node working at once (the hierarchical row's outer ring runs one per rank). */
static double ring_rs(const tdm_sim_cluster *k, double n, int p, int active) {
  return (p - 1) * xchg(k, ring_link(k, p), n / p, 1, n / p, active);
}
static double ring_ag(const tdm_sim_cluster *k, double n, int p, int active) { return (p - 1) * xchg(k, ring_link(k, p), n / p, 1, 0, active); }
static double ring(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  int a = on_node(k, p);
  switch (kind) {
  case TDM_SIM_ALLREDUCE: return ring_rs(k, n, p, a) + ring_ag(k, n, p, a);
  case TDM_SIM_REDUCE_SCATTER: return ring_rs(k, n, p, a);
  case TDM_SIM_ALLGATHER: return ring_ag(k, n, p, a);
  default: return -1;
  }
}

/* ---- folding a non-power of two: the first 2 rem ranks pair, one hands its data over (the other
 * reduces it), and gets the result back; one end of a message each time */
static double fold(const tdm_sim_cluster *k, double n, int p, int *p2) {
  *p2 = 1 << floor_log2(p);
  if (*p2 == p) return 0;
  double cross = 1;
  int a = on_node(k, 2 * (p - *p2));
  const tdm_sim_link *l = xor_link(k, 2 * (p - *p2), 1, &cross);
  return oneway(k, l, n, chunks_of(n), n, a, on_node(k, p)) + oneway(k, l, n, chunks_of(n), 0, a, on_node(k, p));
}

/* ---- recursive doubling: log p exchanges of the whole buffer ------------------------------------- */
static double rd(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (kind == TDM_SIM_ALLREDUCE) {
    int p2;
    double t = fold(k, n, p, &p2), cross = 1;
    for (int d = 1; d < p2; d <<= 1) {
      const tdm_sim_link *l = xor_link(k, p2, d, &cross);
      t += xchg(k, l, n, cross, n, on_node(k, p2));
    }
    return t;
  }
  if (kind == TDM_SIM_ALLGATHER && pow2(p)) { /* doubling blocks: n/p, 2n/p, ... */
    double t = 0, cross = 1;
    for (int d = 1; d < p; d <<= 1) {
      const tdm_sim_link *l = xor_link(k, p, d, &cross);
      t += xchg(k, l, n * d / p, cross, 0, on_node(k, p));
    }
    return t;
  }
  return -1;
}

/* ---- halving-doubling: reduce-scatter by recursive halving, all-gather by doubling ----------------- */
static double rhd_rs(const tdm_sim_cluster *k, double n, int p2) {
  double t = 0, cross = 1, part = n;
  for (int d = p2 >> 1; d >= 1; d >>= 1) { /* halving: the far half first */
    part /= 2;
    const tdm_sim_link *l = xor_link(k, p2, d, &cross);
    t += xchg(k, l, part, cross, part, on_node(k, p2));
  }
  return t;
}
static double rhd_ag(const tdm_sim_cluster *k, double n, int p2) {
  double t = 0, cross = 1, part = n / p2;
  for (int d = 1; d < p2; d <<= 1, part *= 2) {
    const tdm_sim_link *l = xor_link(k, p2, d, &cross);
    t += xchg(k, l, part, cross, 0, on_node(k, p2));
  }
  return t;
}
static double rhd(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  int p2;
  if (kind == TDM_SIM_ALLREDUCE) {
    double f = fold(k, n, p, &p2);
    return f + rhd_rs(k, n, p2) + rhd_ag(k, n, p2);
  }
  if (kind == TDM_SIM_REDUCE_SCATTER && pow2(p)) return rhd_rs(k, n, p);
  return -1;
}

/* ---- the binary tree rooted at rank 0 (children 2r+1, 2r+2): reduce up, broadcast down -------------
 * Each parent takes its children one after the other (in 1 MiB chunks, reducing each), then sends
 * the result down whole, to one child after the other; computed on the tree, its critical path. The ranks busy at once are those
 * of one level: its parents, each with one child at a time. */
static int tree_active(const tdm_sim_cluster *k, int r, int p) {
  /* level d holds ranks 2^d - 1 .. 2^(d+1) - 2; a parent q has a child when 2q + 1 < p, that is
   * q < p / 2 (counted in closed form: a loop over the level made 262,144 ranks cost 18 s) */
  int64_t d = floor_log2(r + 1), lo = ((int64_t)1 << d) - 1, hi = ((int64_t)1 << (d + 1)) - 1;
  if (hi > p / 2) hi = p / 2;
  int64_t parents = hi > lo ? hi - lo : 0;
  return (int)(2 * (parents > 0 ? parents : 1) < on_node(k, p) ? 2 * (parents > 0 ? parents : 1) : on_node(k, p));
}
/* An edge between parent a and child b: its whole time; *wire: the part on the link alone. */
static double edge(const tdm_sim_cluster *k, int a, int b, int p, double n, int up, double *wire) {
  const tdm_sim_link *l = node_of(k, a) == node_of(k, b) ? &k->intra : &k->inter;
  double chunks = up ? chunks_of(n) : 1;
  if (wire) {
    tdm_sim_link w = *l;
    w.cpu_alpha = w.cpu_beta = w.gamma = 0;
    *wire = oneway(k, &w, n, chunks, 0, 1, on_node(k, p));
  }
  return oneway(k, l, n, chunks, up ? n : 0, tree_active(k, a, p), on_node(k, p));
}
/* Reduce up: a child sends as soon as its subtree is reduced, without waiting for its parent (the
 * transport's buffers take the message), so its message travels while the parent takes its other
 * child; the parent then receives and reduces it (the rest of the edge's time). */
static double tree_up(const tdm_sim_cluster *k, int r, int p, double n) {
  double t = 0;
  for (int c = 2 * r + 1; c <= 2 * r + 2 && c < p; c++) {
    double wire, whole = edge(k, r, c, p, n, 1, &wire), arrived = tree_up(k, c, p, n) + wire;
    t = (t > arrived ? t : arrived) + (whole - wire);
  }
  return t;
}
static double tree_down(const tdm_sim_cluster *k, int r, int p, double n, double at) {
  double end = at;
  for (int c = 2 * r + 1; c <= 2 * r + 2 && c < p; c++) {
    at += edge(k, r, c, p, n, 0, NULL);
    double e = tree_down(k, c, p, n, at);
    end = e > end ? e : end;
  }
  return end;
}
static double tree(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (kind == TDM_SIM_ALLREDUCE) return tree_down(k, 0, p, n, tree_up(k, 0, p, n));
  if (kind == TDM_SIM_BROADCAST) { /* binomial: ceil(log2 p) rounds of the whole buffer, 2^i senders in round i */
    double t = 0, cross = 1;
    for (int d = 1; d < p; d <<= 1) {
      const tdm_sim_link *l = xor_link(k, p, d, &cross);
      t += oneway(k, l, n, chunks_of(n), 0, imin(2 * d, on_node(k, p)), on_node(k, p));
    }
    return t;
  }
  return -1;
}

/* ---- chain broadcast: 1 MiB pieces pipelined down the line of ranks (each receives one piece while
 * it sends the one before) ----------------------------------------------------------------------------- */
static double chain(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (kind != TDM_SIM_BROADCAST) return -1;
  double pieces = chunks_of(n);
  return (p - 1 + pieces - 1) * tdm__sim_step(k, ring_link(k, p), n / pieces, 1, 1, 1, 1, 0, on_node(k, p));
}

/* ---- direct: every rank sends each block straight to its owner, p - 1 messages at once: the
 * reduce-scatter in rounds of 1 MiB pieces and one of the rest (each rank reducing the p - 1 it
 * receives), the all-gather in one exchange of whole blocks. On pairwise links the p - 1 travel
 * side by side; on a shared link one after the other. */
static double direct(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  const tdm_sim_link *l = ring_link(k, p);
  double rounds = chunks_of(n / p), last = n / p - (rounds - 1) * CHUNK; /* whole chunks, then the rest */
  int a = on_node(k, p);
  double rs = (rounds - 1) * tdm__sim_step(k, l, CHUNK, 1, p - 1, 1, p - 1, (p - 1) * CHUNK, a) +
              tdm__sim_step(k, l, last, 1, p - 1, 1, p - 1, (p - 1) * last, a);
  double ag = tdm__sim_step(k, l, n / p, 1, p - 1, 1, p - 1, 0, a);
  switch (kind) {
  case TDM_SIM_ALLREDUCE: return rs + ag;
  case TDM_SIM_REDUCE_SCATTER: return rs;
  case TDM_SIM_ALLGATHER: return ag;
  default: return -1;
  }
}

/* ---- shared memory (one node): copy in, a barrier, each rank reduces its block of all p, a
 * barrier, copy out. beta is the memory copy's (the shm transport's), alpha a barrier's round. */
static double shm(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (p > k->ranks_per_node) return -1;
  const tdm_sim_link *l = &k->intra;
  double barrier = ceil(log2((double)p)) * l->alpha, red = (p - 1.0) / p * n;
  /* the copies as one step of n each way (copy in: one end of a message, copy out: the other) */
  tdm_sim_link c = *l;
  c.alpha = 0, c.pairwise = 1;
  switch (kind) {
  case TDM_SIM_ALLREDUCE: c.beta *= 2; return 2 * barrier + tdm__sim_step(k, &c, n, 1, 1, 1, 1, red, p);
  case TDM_SIM_REDUCE_SCATTER: return 2 * barrier + tdm__sim_step(k, &c, n, 1, 1, 1, 0.5, red, p);
  case TDM_SIM_ALLGATHER: c.beta *= 2; return 2 * barrier + tdm__sim_step(k, &c, n, 1, 1, 1, 1, 0, p);
  default: return -1;
  }
}

/* ---- hierarchical: inside each node reduce-scatter, across nodes all-reduce 1/ppn of the data
 * (all ppn ranks of a node at once, sharing its link unless links are pairwise), inside each node
 * all-gather. */
static double hier(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  int q = k->ranks_per_node;
  if (q < 2 || p <= q || p % q) return ring(k, kind, n, p); /* one node, or ragged: the flat ring */
  tdm_sim_cluster in = *k, out = *k;
  in.ranks_per_node = q, out.ranks_per_node = 1;
  if (!out.inter.pairwise) out.inter.beta *= q;
  int nodes = p / q;
  switch (kind) {
  case TDM_SIM_ALLREDUCE: return ring_rs(&in, n, q, q) + ring_rs(&out, n / q, nodes, q) + ring_ag(&out, n / q, nodes, q) + ring_ag(&in, n, q, q);
  case TDM_SIM_REDUCE_SCATTER: return ring_rs(&in, n, q, q) + ring_rs(&out, n / q, nodes, q);
  case TDM_SIM_ALLGATHER: return ring_ag(&out, n / q, nodes, q) + ring_ag(&in, n, q, q);
  default: return -1;
  }
}

/* The table, keyed like tandem's (tdm__algos in src/comm/algos.c), plus the hierarchical row. */
static const struct {
  const char *name;
  cost_fn cost;
} rows[TDM_SIM_ALGO_COUNT] = {
    [TDM_ALGO_AUTO] = {"auto", NULL}, [TDM_ALGO_RING] = {"ring", ring},       [TDM_ALGO_RD] = {"rd", rd},
    [TDM_ALGO_RHD] = {"rhd", rhd},     [TDM_ALGO_TREE] = {"tree", tree},      [TDM_ALGO_CHAIN] = {"chain", chain},
    [TDM_ALGO_DIRECT] = {"direct", direct}, [TDM_ALGO_SHM] = {"shm", shm},   [TDM_SIM_ALGO_HIER] = {"hier", hier},
};

const char *tdm_sim_algo_name(int a) { return a >= 0 && a < TDM_SIM_ALGO_COUNT ? rows[a].name : "?"; }
int tdm_sim_algo_parse(const char *s) {
  for (int a = 0; s && a < TDM_SIM_ALGO_COUNT; a++)
    if (!strcmp(s, rows[a].name)) return a;
  return -1;
}

/* tandem's AUTO rules (src/comm/collective.c), with shared memory usable when every rank is on one
 * node and the cluster says so. */
int tdm_sim_auto_algo(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  TDM__NONNULL(k, -1, "tdm_sim_auto_algo: the cluster k is NULL");
  int shm_ok = k->shm && p <= k->ranks_per_node;
  switch (kind) {
  case TDM_SIM_ALLREDUCE: /* a world on several nodes of several ranks gets the hierarchical plan */
    if (p > k->ranks_per_node && k->ranks_per_node > 1) return TDM_ALGO_HIER;
    return shm_ok ? TDM_ALGO_SHM : n <= 4096 ? TDM_ALGO_RD : n <= 262144 ? TDM_ALGO_RHD : TDM_ALGO_RING;
  case TDM_SIM_REDUCE_SCATTER: return shm_ok ? TDM_ALGO_SHM : pow2(p) && n <= 1048576 ? TDM_ALGO_RHD : TDM_ALGO_RING;
  case TDM_SIM_ALLGATHER: return shm_ok ? TDM_ALGO_SHM : pow2(p) && n <= 1048576 ? TDM_ALGO_RD : TDM_ALGO_RING;
  case TDM_SIM_BROADCAST: return n >= 4194304 && p > 2 ? TDM_ALGO_CHAIN : TDM_ALGO_TREE;
  default: return TDM_ALGO_RING;
  }
}

int tdm_sim_engine_algo(const tdm_sim_cluster *k, tdm_sim_kind kind, int p, int grads) {
  TDM__NONNULL(k, -1, "tdm_sim_engine_algo: the cluster k is NULL");
  if (grads && kind == TDM_SIM_ALLREDUCE && p > k->ranks_per_node && k->ranks_per_node > 1) return TDM_SIM_ALGO_HIER;
  return k->shm && p <= k->ranks_per_node ? TDM_ALGO_SHM : TDM_ALGO_DIRECT;
}

double tdm_sim_coll_cost(const tdm_sim_cluster *k, int algo, tdm_sim_kind kind, double n, int p) {
  if (!k || p < 1 || (unsigned)kind >= TDM_SIM_KIND_COUNT || algo < 0 || algo >= TDM_SIM_ALGO_COUNT || !(n >= 0)) return -1;
  if (p == 1) return 0;
  if (algo == TDM_ALGO_AUTO) algo = tdm_sim_auto_algo(k, kind, n, p);
  return rows[algo].cost(k, kind, n, p);
}

/* The tree's all-reduce repeated back to back: each rank runs its part (its children's messages
 * received and reduced in order, its own sent up, the result received from its parent and sent to
 * each child in order) and starts the next as it ends, its clock in t[r]; a message arrives a wire
 * after its sender began it, the sender's and receiver's work as edge() has them. The first
 * repeat is tree()'s critical path; later ones overlap the leaves' next messages with the root's
 * last sends down. Each repeat's time is the slowest rank's own, and the median of repeats 2..REPS
 * is returned, as tandem bench takes the median of its iterations. NAN when the arrays cannot be
 * had (the caller falls back to one). */
#define TREE_REPS 8
static double tree_repeated(const tdm_sim_cluster *k, double n, int p) {
  double *t = tdm__calloc((size_t)p * 4, sizeof *t);
  if (!t) return NAN;
  double *sent = t + p, *mid = t + 2 * (size_t)p, *down = t + 3 * (size_t)p, rep[TREE_REPS];
  for (int i = 0; i < TREE_REPS; i++) {
    for (int r = p - 1; r >= 0; r--) { /* up: children (larger ranks) before their parents */
      double c_t = t[r], wire;
      for (int c = 2 * r + 1; c <= 2 * r + 2 && c < p; c++) {
        double whole = edge(k, r, c, p, n, 1, &wire), arrived = sent[c] + wire;
        c_t = (c_t > arrived ? c_t : arrived) + (whole - wire);
      }
      if (r > 0) sent[r] = c_t, c_t += edge(k, (r - 1) / 2, r, p, n, 1, NULL);
      mid[r] = c_t;
    }
    double most = 0;
    for (int r = 0; r < p; r++) { /* down: parents before their children */
      double c_t = r > 0 && down[r] > mid[r] ? down[r] : mid[r];
      for (int c = 2 * r + 1; c <= 2 * r + 2 && c < p; c++) c_t += edge(k, r, c, p, n, 0, NULL), down[c] = c_t;
      most = c_t - t[r] > most ? c_t - t[r] : most;
      t[r] = c_t;
    }
    rep[i] = most;
  }
  tdm__free(t);
  return tdm_median(rep + 1, TREE_REPS - 1);
}

double tdm_sim_coll_cost_repeated(const tdm_sim_cluster *k, int algo, tdm_sim_kind kind, double n, int p) {
  double one = tdm_sim_coll_cost(k, algo, kind, n, p);
  if (one <= 0) return one;
  if (algo == TDM_ALGO_AUTO) algo = tdm_sim_auto_algo(k, kind, n, p);
  if (algo != TDM_ALGO_TREE || kind != TDM_SIM_ALLREDUCE) return one;
  double rep = tree_repeated(k, n, p);
  return isnan(rep) ? one : rep;
}

double tdm_sim_p2p_cost(const tdm_sim_cluster *k, double n, int a, int b) {
  TDM__NONNULL(k, -1, "tdm_sim_p2p_cost: the cluster k is NULL");
  if (a == b) return 0;
  const tdm_sim_link *l = node_of(k, a) == node_of(k, b) ? &k->intra : &k->inter;
  return oneway(k, l, n, chunks_of(n), 0, 2, 2);
}
