/* Collective costs with the alpha-beta-gamma model: one row per algorithm of tandem's table
 * (src/comm/algos.c, same order), each costing the steps that algorithm really runs
 * (src/comm/algo/): the ring's 2(p-1) exchanges of n/p, recursive doubling's log p exchanges of
 * n with the fold of a non-power of two, halving-doubling's halving then doubling, the binary tree's
 * reduce up and broadcast down (its critical path, computed), and the hierarchical composition.
 * Messages above 1 MiB go as 1 MiB chunks (tdm__sendrecv_reduce), each paying alpha.
 *
 * Placement: rank r lives on node r / ranks_per_node. A step in which any pair crosses nodes
 * costs the inter-node link; when every rank of a node crosses at once (recursive doubling's far
 * steps) they share the node's link: beta times the ranks per node. */
#include "tandem/sim.h"

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

/* One message of n bytes on link l: alpha per chunk, n beta. */
static double msg(const tdm_sim_link *l, double n, double share) {
  double chunks = n > CHUNK ? ceil(n / CHUNK) : 1;
  return chunks * l->alpha + n * l->beta * share;
}
/* The link a step of distance d (partner r xor d, or r + d around a ring) uses among p ranks. */
static const tdm_sim_link *xor_link(const tdm_sim_cluster *k, int p, int d, double *share) {
  *share = 1;
  for (int r = 0; r < p; r++)
    if ((r ^ d) < p && node_of(k, r) != node_of(k, r ^ d)) {
      *share = k->ranks_per_node < p ? k->ranks_per_node : p; /* every rank of a node crosses */
      return &k->inter;
    }
  return &k->intra;
}
static const tdm_sim_link *ring_link(const tdm_sim_cluster *k, int p) { return p > k->ranks_per_node ? &k->inter : &k->intra; }

/* ---- ring: reduce-scatter (p-1 steps of n/p, reduced), all-gather (p-1 steps of n/p) ---------------- */
static double ring_rs(const tdm_sim_cluster *k, double n, int p) {
  const tdm_sim_link *l = ring_link(k, p);
  return (p - 1) * (msg(l, n / p, 1) + n / p * l->gamma);
}
static double ring_ag(const tdm_sim_cluster *k, double n, int p) { return (p - 1) * msg(ring_link(k, p), n / p, 1); }
static double ring(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  switch (kind) {
  case TDM_SIM_ALLREDUCE: return ring_rs(k, n, p) + ring_ag(k, n, p);
  case TDM_SIM_REDUCE_SCATTER: return ring_rs(k, n, p);
  case TDM_SIM_ALLGATHER: return ring_ag(k, n, p);
  default: return -1;
  }
}

/* ---- folding a non-power of two: the first 2 rem ranks pair, one hands its data over, gets the result */
static double fold(const tdm_sim_cluster *k, double n, int p, int *p2) {
  *p2 = 1 << floor_log2(p);
  if (*p2 == p) return 0;
  double share = 1;
  const tdm_sim_link *l = xor_link(k, 2 * (p - *p2), 1, &share);
  return 2 * msg(l, n, 1) + n * l->gamma;
}

/* ---- recursive doubling: log p exchanges of the whole buffer ------------------------------------- */
static double rd(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (kind == TDM_SIM_ALLREDUCE) {
    int p2;
    double t = fold(k, n, p, &p2), share = 1;
    for (int d = 1; d < p2; d <<= 1) {
      const tdm_sim_link *l = xor_link(k, p2, d, &share);
      t += msg(l, n, share) + n * l->gamma;
    }
    return t;
  }
  if (kind == TDM_SIM_ALLGATHER && pow2(p)) { /* doubling blocks: n/p, 2n/p, ... */
    double t = 0, share = 1;
    for (int d = 1; d < p; d <<= 1) t += msg(xor_link(k, p, d, &share), n * d / p, share);
    return t;
  }
  return -1;
}

/* ---- halving-doubling: reduce-scatter by recursive halving, all-gather by doubling ----------------- */
static double rhd_rs(const tdm_sim_cluster *k, double n, int p2) {
  double t = 0, share = 1, part = n;
  for (int d = p2 >> 1; d >= 1; d >>= 1) { /* halving: the far half first */
    part /= 2;
    const tdm_sim_link *l = xor_link(k, p2, d, &share);
    t += msg(l, part, share) + part * l->gamma;
  }
  return t;
}
static double rhd_ag(const tdm_sim_cluster *k, double n, int p2) {
  double t = 0, share = 1, part = n / p2;
  for (int d = 1; d < p2; d <<= 1, part *= 2) t += msg(xor_link(k, p2, d, &share), part, share);
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
 * Each parent takes its children one after the other; computed on the tree, its critical path. */
static double edge(const tdm_sim_cluster *k, int a, int b, double n, int reduce) {
  const tdm_sim_link *l = node_of(k, a) == node_of(k, b) ? &k->intra : &k->inter;
  return msg(l, n, 1) + (reduce ? n * l->gamma : 0);
}
static double tree_up(const tdm_sim_cluster *k, int r, int p, double n) {
  double t = 0;
  for (int c = 2 * r + 1; c <= 2 * r + 2 && c < p; c++) {
    double ready = tree_up(k, c, p, n);
    t = (t > ready ? t : ready) + edge(k, r, c, n, 1);
  }
  return t;
}
static double tree_down(const tdm_sim_cluster *k, int r, int p, double n, double at) {
  double end = at;
  for (int c = 2 * r + 1; c <= 2 * r + 2 && c < p; c++) {
    at += edge(k, r, c, n, 0);
    double e = tree_down(k, c, p, n, at);
    end = e > end ? e : end;
  }
  return end;
}
static double tree(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (kind == TDM_SIM_ALLREDUCE) return tree_down(k, 0, p, n, tree_up(k, 0, p, n));
  if (kind == TDM_SIM_BROADCAST) { /* binomial: ceil(log2 p) rounds of the whole buffer */
    double t = 0, share = 1;
    for (int d = 1; d < p; d <<= 1) t += msg(xor_link(k, p, d, &share), n, 1);
    return t;
  }
  return -1;
}

/* ---- chain broadcast: 1 MiB pieces pipelined down the line of ranks ----------------------------- */
static double chain(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  if (kind != TDM_SIM_BROADCAST) return -1;
  double pieces = n > CHUNK ? ceil(n / CHUNK) : 1;
  return (p - 1 + pieces - 1) * msg(ring_link(k, p), n / pieces, 1);
}

/* ---- direct: every rank sends each block straight to its owner (p - 1 messages at once) ----------- */
static double direct(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  const tdm_sim_link *l = ring_link(k, p);
  double rs = (p - 1) * (msg(l, n / p, 1) + n / p * l->gamma), ag = (p - 1) * msg(l, n / p, 1);
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
  double barrier = ceil(log2((double)p)) * l->alpha;
  switch (kind) {
  case TDM_SIM_ALLREDUCE: return 2 * barrier + 2 * n * l->beta + (p - 1.0) / p * n * l->gamma;
  case TDM_SIM_REDUCE_SCATTER: return 2 * barrier + n * l->beta + (p - 1.0) / p * n * l->gamma;
  case TDM_SIM_ALLGATHER: return 2 * barrier + n * l->beta * 2;
  default: return -1;
  }
}

/* ---- hierarchical: inside each node reduce-scatter, across nodes all-reduce 1/ppn of the data
 * (all ppn ranks of a node at once, sharing its link), inside each node all-gather. */
static double hier(const tdm_sim_cluster *k, tdm_sim_kind kind, double n, int p) {
  int q = k->ranks_per_node;
  if (q < 2 || p <= q || p % q) return ring(k, kind, n, p); /* one node, or ragged: the flat ring */
  tdm_sim_cluster in = *k, out = *k;
  in.ranks_per_node = q, out.ranks_per_node = 1;
  out.inter.beta *= q;
  int nodes = p / q;
  switch (kind) {
  case TDM_SIM_ALLREDUCE: return ring_rs(&in, n, q) + ring(&out, TDM_SIM_ALLREDUCE, n / q, nodes) + ring_ag(&in, n, q);
  case TDM_SIM_REDUCE_SCATTER: return ring_rs(&in, n, q) + ring_rs(&out, n / q, nodes);
  case TDM_SIM_ALLGATHER: return ring_ag(&out, n / q, nodes) + ring_ag(&in, n, q);
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

double tdm_sim_coll_cost(const tdm_sim_cluster *k, int algo, tdm_sim_kind kind, double n, int p) {
  if (!k || p < 1 || (unsigned)kind >= TDM_SIM_KIND_COUNT || algo < 0 || algo >= TDM_SIM_ALGO_COUNT || !(n >= 0)) return -1;
  if (p == 1) return 0;
  if (algo == TDM_ALGO_AUTO) algo = tdm_sim_auto_algo(k, kind, n, p);
  return rows[algo].cost(k, kind, n, p);
}

double tdm_sim_p2p_cost(const tdm_sim_cluster *k, double n, int a, int b) {
  if (a == b) return 0;
  return msg(node_of(k, a) == node_of(k, b) ? &k->intra : &k->inter, n, 1);
}
