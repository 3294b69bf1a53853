/* The 48-byte header every message carries (tdm__check_header, which the tcp and shm transports
 * run on each header received) and the published identity of a call (tdm__check_call, which shm
 * runs on a peer's announcement and on each slot's ready word), against the call expected.
 * Input: the expected header (48 bytes; its magic is always right: it is ours), then 48 bytes
 * XORed into it to make the one received (missing bytes: 0, so a short input is a match), then
 * a byte for the communicator (size, rank, whether it is a sub-communicator mapping its ranks
 * onto a larger transport's) and one for the peer (a transport rank, maybe outside it).
 * Accepted exactly when every field equals; a refusal fails the communicator with
 * TDM_ERR_REMOTE (bad magic) or TDM_ERR_MISMATCH, the detail naming the peer's rank. */
#include "fuzz.h"

#include "comm/comm_impl.h"

static void make_comm(struct tdm_comm *c, int *map, uint8_t shape) {
  memset(c, 0, sizeof *c);
  c->size = 1 + shape % 8;
  c->rank = (shape / 8) % c->size;
  if (shape & 0x80) { /* a sub-communicator: its rank i is the transport's rank 2i + 1 */
    for (int i = 0; i < c->size; i++) map[i] = 2 * i + 1;
    c->map = map;
  }
  c->comm_id = 7;
}

/* The detail names the peer by its rank in c (or -1 when it is not in c). */
static void check_refusal(struct tdm_comm *c, tdm_status st, int peer) {
  FUZZ_CHECK(atomic_load(&c->failed) && c->fail_status == st && !strcmp(tdm_last_error(), c->error));
  char who[32];
  snprintf(who, sizeof who, "rank %d ", tdm__comm_rank_of(c, peer));
  FUZZ_CHECK(strstr(c->error, who) != NULL);
}

static tdm__call call_of(const tdm__hdr *h) { return (tdm__call){h->kind, h->dtype, h->op, h->root, h->count, h->seq}; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t in[98] = {0};
  memcpy(in, data, size < sizeof in ? size : sizeof in);
  tdm__hdr want, got;
  memcpy(&want, in, sizeof want);
  want.magic = TDM_MSG_MAGIC;
  uint8_t g[sizeof got];
  memcpy(g, &want, sizeof g);
  for (size_t i = 0; i < sizeof g; i++) g[i] ^= in[48 + i];
  memcpy(&got, g, sizeof got);
  struct tdm_comm c;
  int map[8];
  make_comm(&c, map, in[96]);
  int peer = in[97] % (2 * c.size + 2);

  int same = !memcmp(&want, &got, sizeof want);
  tdm_status st = tdm__check_header(&c, peer, &want, &got);
  FUZZ_CHECK((st == TDM_OK) == same);
  if (!same) {
    FUZZ_CHECK(st == (got.magic != TDM_MSG_MAGIC ? TDM_ERR_REMOTE : TDM_ERR_MISMATCH));
    check_refusal(&c, st, peer);
  } else {
    FUZZ_CHECK(!atomic_load(&c.failed));
  }

  /* the same fields as published calls (shm): the magic and the byte count are not part of them */
  make_comm(&c, map, in[96]);
  tdm__call w = call_of(&want), k = call_of(&got);
  int same_call = w.kind == k.kind && w.dtype == k.dtype && w.op == k.op && w.root == k.root && w.count == k.count &&
                  w.seq == k.seq && want.comm_id == got.comm_id;
  st = tdm__check_call(&c, peer, &w, want.comm_id, &k, got.comm_id);
  FUZZ_CHECK((st == TDM_OK) == same_call);
  if (!same_call) check_refusal(&c, TDM_ERR_MISMATCH, peer);

  /* any call prints within any buffer */
  char small[24], big[200];
  memset(small, 'x', sizeof small);
  FUZZ_CHECK(tdm__call_str(&k, small, sizeof small) == small && strlen(small) < sizeof small);
  FUZZ_CHECK(tdm__call_str(&k, big, sizeof big) == big && strlen(big) < sizeof big);
  return 0;
}
