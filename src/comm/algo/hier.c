/* The hierarchical all-reduce, for ranks on several nodes: reduce-scatter inside each node over
 * shared memory, all-reduce of each piece between the nodes (one rank per node and piece, over
 * the job's transport), all-gather inside the node. Only 1/L of the data crosses between nodes
 * per rank (L ranks a node), every link between nodes carries it once, and the rest moves
 * through shared memory.
 *
 * The plan is made once, when the communicator is created (tdm__hier_setup): every rank's node
 * (TANDEM_NODE_ID, else the host name), nodes numbered in the order of their first rank, a
 * rank's local index its place among its node's ranks; a shm communicator per node (made over
 * a tdm_comm_split of the node's ranks, which carries the segment's name) and a sub-communicator
 * per local index ("lane") joining the ranks with that index on every node.
 *
 * Uneven nodes (3 ranks on one, 1 on another): the buffer is cut into as many pieces as the
 * smallest node has ranks (lanes = min L); local ranks beyond that own no piece, take part in
 * the node's reduce-scatter and all-gather only, and join no lane. Any count works: pieces are
 * tdm__blocks(count, lanes), some possibly empty.
 *
 * Summation order, fixed: each element is summed inside each node in rank order (the shm
 * reduce-scatter's order), then the node sums in node order (the direct algorithm over the lane),
 * so every rank gets the same bits on every run, whatever the count. That is not the flat
 * rank-order sum ((r0 + r1) + r2) + r3 of the direct and shm algorithms: 2 nodes of 2 form
 * (r0 + r1) + (r2 + r3). The two agree exactly where no rounding happens (integers, integer-valued
 * floats) and within rounding otherwise; they are the same order when every node but the first
 * has one rank. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_impl.h"

struct tdm__hier {
  int n_nodes, node, lanes, local, local_size;
  tdm_comm_t node_comm; /* shm, this node's ranks in rank order; NULL when the node has one rank */
  tdm_comm_t lane;      /* ranks of local index `local` on every node, in node order; NULL: none */
  size_t *parts;        /* [local_size]: the piece of each local rank */
  void *scratch;        /* this rank's piece between the phases */
  size_t scratch_bytes;
};

int tdm__hier_usable(const struct tdm_comm *c) { return c && c->hier != NULL; }

void tdm__hier_destroy(struct tdm__hier *h) {
  if (!h) return;
  tdm_comm_destroy(h->lane);
  tdm_comm_destroy(h->node_comm);
  tdm__free(h->parts);
  tdm__free(h->scratch);
  tdm__free(h);
}

#define NAME_BYTES 128

/* This rank's node: "id:" TANDEM_NODE_ID, else "host:" the host name. */
static tdm_status node_name(char *out) {
  const char *id = getenv("TANDEM_NODE_ID");
  memset(out, 0, NAME_BYTES);
  if (id) {
    if (!*id || strlen(id) > NAME_BYTES - 8)
      return tdm__set_error(TDM_ERR_INVALID_ARG,
                            "environment: TANDEM_NODE_ID is '%.64s'%s; expected a name of 1..%d characters that the ranks of one node share",
                            id, strlen(id) > 64 ? "..." : "", NAME_BYTES - 8);
    snprintf(out, NAME_BYTES, "id:%s", id);
    return TDM_OK;
  }
  char host[NAME_BYTES] = "";
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
  snprintf(out, NAME_BYTES, "host:%.*s", NAME_BYTES - 8, host);
  return TDM_OK;
}

/* The shm communicator of this node's ranks, made over a split of c (collective over c). */
static tdm_status make_node_comm(struct tdm_comm *c, struct tdm__hier *h, int *ok) {
  tdm_comm_t nt = NULL;
  TDM__TRY(tdm_comm_split(c, h->node, c->rank, &nt));
  *ok = 1;
  if (h->local_size > 1) {
    tdm_status st = tdm__comm_create_node(nt, &h->node_comm);
    if (st != TDM_OK) {
      tdm_log(TDM_LOG_WARN, "hierarchical all-reduce off: node %d's shared memory: %s", h->node, tdm_last_error());
      *ok = 0;
    }
  }
  tdm_status cs = tdm_comm_status(nt); /* a failure of c's own links fails the split's too */
  tdm_comm_destroy(nt);
  return cs == TDM_OK ? TDM_OK : tdm__set_error(cs, "%s", tdm_comm_last_error(c));
}

tdm_status tdm__hier_setup(struct tdm_comm *c) {
  const char *id = getenv("TANDEM_NODE_ID");
  if (!id && c->local_size == c->size) return TDM_OK; /* the launcher says: one node */
  int P = c->size;
  uint64_t seq0 = c->seq; /* the set-up's calls are not the caller's: numbering starts after it */
  char mine[NAME_BYTES], *all = tdm__malloc((size_t)P * NAME_BYTES);
  int *node_of = tdm__malloc(sizeof(int) * (size_t)P), *first = tdm__malloc(sizeof(int) * (size_t)P);
  tdm_status st = all && node_of && first ? node_name(mine) : tdm__set_error(TDM_ERR_NO_MEMORY, "hier: out of memory");
  /* every rank parses the same kind of value: a bad one fails on every rank before any message */
  if (st == TDM_OK) st = tdm_comm_allgather(c, mine, all, NAME_BYTES, TDM_U8, TDM_ALGO_AUTO);
  int M = 0;
  for (int r = 0; st == TDM_OK && r < P; r++) { /* nodes in the order of their first rank */
    int j = 0;
    while (j < M && memcmp(all + (size_t)first[j] * NAME_BYTES, all + (size_t)r * NAME_BYTES, NAME_BYTES)) j++;
    if (j == M) first[M++] = r;
    node_of[r] = j;
  }
  tdm__free(all);
  tdm__free(first);
  if (st != TDM_OK || M < 2) {
    tdm__free(node_of);
    c->seq = seq0;
    return st;
  }
  struct tdm__hier *h = tdm__calloc(1, sizeof *h);
  if (!h) {
    tdm__free(node_of);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "hier: out of memory");
  }
  h->n_nodes = M, h->node = node_of[c->rank], h->lanes = P;
  for (int j = 0; j < M; j++) {
    int L = 0;
    for (int r = 0; r < P; r++) {
      if (node_of[r] != j) continue;
      if (r == c->rank) h->local = L;
      L++;
    }
    if (j == h->node) h->local_size = L;
    if (L < h->lanes) h->lanes = L;
  }
  h->parts = tdm__calloc((size_t)h->local_size, sizeof(size_t));
  int ok = 1;
  st = make_node_comm(c, h, &ok); /* collective over c: every rank takes part, whatever it lacks */
  if (!h->parts) {
    tdm_log(TDM_LOG_WARN, "hierarchical all-reduce off: out of memory");
    ok = 0;
  }
  if (st == TDM_OK) st = tdm_comm_split(c, h->local < h->lanes ? h->local : -1, h->node, &h->lane);
  /* one rank that could not set up its node turns the plan off everywhere */
  int32_t all_ok = ok;
  if (st == TDM_OK) st = tdm_comm_allreduce(c, &all_ok, &all_ok, 1, TDM_I32, TDM_MIN, TDM_ALGO_AUTO);
  c->seq = seq0;
  atomic_store(&c->bytes_sent, 0);
  if (st != TDM_OK || !all_ok) {
    tdm__hier_destroy(h);
    tdm__free(node_of);
    return st;
  }
  if (h->lane) /* out of the range the caller's splits draw from (c's numbering restarts) */
    h->lane->comm_id = (uint32_t)tdm_hash64(c->comm_id * 1000003ull + 0x6869657200000000ull, (uint64_t)h->local) | 2u;
  c->hier = h;
  c->node_of = node_of;
  tdm_log(TDM_LOG_INFO, "hierarchical all-reduce: rank %d is %d of %d on node %d of %d (%d lanes)", c->rank, h->local,
          h->local_size, h->node, M, h->lanes);
  return TDM_OK;
}

/* Reduce-scatter in the node, all-reduce in the lane, all-gather in the node. AVG sums here (the
 * caller divides by c's size once). A failure of a phase fails c, naming it. */
tdm_status tdm__allreduce_hier(struct tdm_comm *c, const void *sendbuf, void *recvbuf, size_t count, tdm_dtype dt,
                               tdm_redop op) {
  struct tdm__hier *h = c->hier;
  size_t es = tdm_dtype_size(dt);
  tdm_redop sub = op == TDM_AVG ? TDM_SUM : op;
  if (sendbuf != recvbuf && count) memcpy(recvbuf, sendbuf, count * es);
  for (int q = 0; q < h->local_size; q++) {
    size_t off;
    h->parts[q] = 0;
    if (q < h->lanes) tdm_comm_block(count, h->lanes, q, &off, &h->parts[q]);
  }
  size_t len = h->parts[h->local];
  uint64_t before = tdm_comm_bytes_sent(h->node_comm) + tdm_comm_bytes_sent(h->lane);
  tdm_status st = TDM_OK;
  const char *phase = "the all-reduce between nodes (ranks below: node numbers)";
  int in_node = 0; /* the phase runs on the node's communicator, which numbers its ranks locally */
  void *piece = recvbuf; /* a node of one rank: its piece is the whole buffer */
  if (h->node_comm) {
    if (len * es > h->scratch_bytes) {
      tdm__free(h->scratch);
      h->scratch = tdm__aligned_alloc_cat(len * es + 64, TDM_MEM_COMM);
      h->scratch_bytes = h->scratch ? len * es : 0;
      if (!h->scratch) return tdm__comm_fail(c, TDM_ERR_NO_MEMORY, "hierarchical all-reduce: out of memory for %zu bytes", len * es);
    }
    piece = h->scratch;
    phase = "the reduce-scatter in the node (ranks below: local ranks)", in_node = 1;
    st = tdm_comm_reduce_scatter_v(h->node_comm, recvbuf, piece, count, h->parts, dt, sub, TDM_ALGO_AUTO);
  }
  if (st == TDM_OK && h->lane) {
    phase = "the all-reduce between nodes (ranks below: node numbers)", in_node = 0;
    st = tdm_comm_allreduce(h->lane, piece, piece, len, dt, sub, TDM_ALGO_DIRECT); /* node order */
  }
  if (st == TDM_OK && h->node_comm) {
    phase = "the all-gather in the node (ranks below: local ranks)", in_node = 1;
    st = tdm_comm_allgather_v(h->node_comm, piece, recvbuf, count, h->parts, dt, TDM_ALGO_AUTO);
  }
  tdm__count_sent(c, tdm_comm_bytes_sent(h->node_comm) + tdm_comm_bytes_sent(h->lane) - before);
  if (st != TDM_OK) {
    /* the node's communicator numbers its ranks 0..local_size-1: a relayed failure's origin there
     * is the rank of c on this node with that index */
    if (tdm_last_error_origin() >= 0 && in_node) {
      int o = tdm_last_error_origin(), w = -1;
      for (int r = 0, q = 0; r < c->size && w < 0; r++)
        if (c->node_of[r] == h->node && q++ == o) w = r;
      char inner[1024];
      snprintf(inner, sizeof inner, "%s", tdm_last_error());
      tdm_clear_error(); /* (and its origin) */
      tdm__error_from(w, tdm__set_error(st, "%s", inner));
    }
    tdm__comm_fail(c, st, "hierarchical all-reduce #%llu (%zu x %s), %s on node %d: %s", (unsigned long long)c->cur.seq, count,
                   tdm_dtype_name(dt), phase, h->node, tdm_last_error());
    /* tell everyone, as a failed message does: the node's peers through its segment, the other
     * nodes through c's connections (a peer waiting in the other communicator would wait for its
     * timeout) */
    tdm_comm_abort(h->node_comm);
    c->tr->ops->abort(c->tr, c->error);
    return tdm__comm_error(c);
  }
  return TDM_OK;
}
