/* Sub-communicators (tdm_comm_split): a child speaks through its parent's transport with its own
 * id in every header and its own rank map. */
#include <string.h>

#include "comm/comm_impl.h"

static tdm_status child(tdm_comm_t c, int *members, int n, int me, uint32_t id, tdm_comm_t *out);

tdm_status tdm_comm_split(tdm_comm_t c, int color, int key, tdm_comm_t *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "split: out is NULL");
  *out = NULL;
  if (!c) return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_comm_split: the communicator is NULL");
  int32_t mine[2] = {color, key}, *all = tdm__malloc(sizeof(int32_t) * 2 * (size_t)c->size);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "split: out of memory");
  tdm_status st = tdm_comm_allgather(c, mine, all, 2, TDM_I32, TDM_ALGO_RING);
  if (st != TDM_OK || color < 0) {
    tdm__free(all);
    return st;
  }
  int n = 0, me = 0, *members = tdm__malloc(sizeof(int) * (size_t)c->size);
  if (!members) {
    tdm__free(all);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "split: out of memory");
  }
  for (int i = 0; i < c->size; i++)
    if (all[2 * i] == color) members[n++] = i;
  for (int i = 1; i < n; i++) /* order by (key, old rank): insertion sort, groups are small */
    for (int j = i; j > 0 && (all[2 * members[j - 1] + 1] > all[2 * members[j] + 1]); j--) {
      int t = members[j];
      members[j] = members[j - 1];
      members[j - 1] = t;
    }
  for (int i = 0; i < n; i++)
    if (members[i] == c->rank) me = i;
  tdm__free(all);
  return child(c, members, n, me, (uint32_t)tdm_hash64(c->comm_id * 1000003ull + c->seq, (uint64_t)(uint32_t)color) | 2u, out);
}

/* A child of c over members[0..n) (c's ranks, in the child's order; takes members), whose rank me
 * is this one, with the given id. */
static tdm_status child(tdm_comm_t c, int *members, int n, int me, uint32_t id, tdm_comm_t *out) {
  struct tdm_comm *s = tdm__calloc(1, sizeof *s);
  if (!s) {
    tdm__free(members);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "split: out of memory");
  }
  /* the child speaks through the parent's transport, with its own id in every header */
  for (int i = 0; i < n; i++) members[i] = c->map ? c->map[members[i]] : members[i];
  s->rank = me;
  s->fail_origin = -1;
  s->size = n;
  s->kind = c->kind;
  s->tr = c->tr;
  s->owns_transport = 0;
  s->map = s->map_owned = members;
  s->comm_id = id;
  s->timeout_s = c->timeout_s;
  s->local_size = c->local_size;
  memcpy(s->algo_for, c->algo_for, sizeof s->algo_for);
  s->algo_plain = c->algo_plain;
  if (c->emu_link_free) { /* the child's links are its parent's, emulated alike */
    s->emu_latency_s = c->emu_latency_s;
    s->emu_bytes_per_s = c->emu_bytes_per_s;
    s->emu_link_free = tdm__calloc((size_t)n, sizeof(double));
  }
  if (c->node_of && (s->node_of = tdm__malloc(sizeof(int) * (size_t)n))) /* emulation knows the child's nodes */
    for (int i = 0; i < n; i++) s->node_of[i] = c->node_of[tdm__comm_rank_of(c, members[i])];
  pthread_mutex_init(&s->q_mu, NULL);
  pthread_cond_init(&s->q_cv, NULL);
  *out = s;
  return TDM_OK;
}

tdm_status tdm_comm_subset(tdm_comm_t c, const int *ranks, int n, tdm_comm_t *out) {
  if (!out) return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_subset: out is NULL");
  *out = NULL;
  if (!c || !ranks || n < 1 || n > c->size)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_subset: %d ranks of a communicator of %d; expected 1..%d", n,
                          c ? c->size : 0, c ? c->size : 0);
  int me = -1;
  uint64_t h = 0x5355425345540000ull ^ (uint64_t)n;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= c->size || (i && ranks[i] <= ranks[i - 1]))
      return tdm__set_error(TDM_ERR_INVALID_ARG, "comm_subset: rank %d (entry %d); expected ranks of 0..%d in increasing order",
                            ranks[i], i, c->size - 1);
    if (ranks[i] == c->rank) me = i;
    h = tdm_hash64(h, (uint64_t)ranks[i]);
  }
  if (me < 0) return TDM_OK; /* not a member */
  int *members = tdm__malloc(sizeof(int) * (size_t)n);
  if (!members) return tdm__set_error(TDM_ERR_NO_MEMORY, "comm_subset: out of memory");
  for (int i = 0; i < n; i++) members[i] = c->map ? c->map[ranks[i]] : ranks[i];
  return child(c, members, n, me, (uint32_t)tdm_hash64(c->comm_id, h) | 2u, out);
}
