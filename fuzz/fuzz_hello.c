/* The handshake every store and mesh connection opens with (16 bytes: magic, version, token
 * length, rank; then the job token), read two ways: by a listener's gate (tdm__net_hello_parse,
 * fed as the gate feeds it: never more bytes than it asks for), and by a rank that dialled a
 * mesh peer (tdm__net_recv_hello, from a socket holding the bytes, then closed).
 * Input: a byte choosing the listener's token (none, empty, a short one, one of the longest
 * length allowed), then the stream. The gate asks for at most what its buffer holds and accepts
 * exactly the valid hello (right magic, version, token length and token), taking the rank it
 * claims and no byte more; it refuses magic, version and an overlong token after the first 16
 * bytes, a wrong token only after all of it, each with a reason. The dialler accepts the same
 * hellos and fails on anything else with TDM_ERR_MISMATCH (a refusal) or TDM_ERR_REMOTE (the
 * stream ended), never waiting. */
#include "fuzz.h"

#include <sys/socket.h>

#include "comm/net.h"
#include "tandem/core.h"

#define MAGIC 0x54444d54u

static const char *token_of(uint8_t b) {
  static char longest[TDM_NET_MAX_TOKEN + 1];
  if (!longest[0]) memset(longest, 'k', TDM_NET_MAX_TOKEN);
  switch (b % 4) {
  case 0: return NULL;
  case 1: return "";
  case 2: return "fuzz-token";
  default: return longest;
  }
}

/* Whether s (n bytes) starts with a valid hello for token; its rank. */
static int valid(const uint8_t *s, size_t n, const char *token, int32_t *rank) {
  size_t tl = token ? strlen(token) : 0;
  uint32_t w[3];
  if (n < TDM_NET_HELLO_BYTES + tl) return 0;
  memcpy(w, s, 12);
  memcpy(rank, s + 12, 4);
  return w[0] == MAGIC && w[1] == TDM_NET_VERSION && w[2] == tl && (!tl || !memcmp(s + 16, token, tl));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *token = token_of(data[0]);
  const uint8_t *s = data + 1;
  size_t n = size - 1;

  /* the gate: a buffer of the largest hello, filled only as far as asked */
  static unsigned char buf[TDM_NET_HELLO_BYTES + TDM_NET_MAX_TOKEN];
  size_t len = 0, need = 0;
  int32_t rank = -1, want_rank = -1;
  const char *why = NULL;
  int r;
  while ((r = tdm__net_hello_parse(buf, len, MAGIC, token, &need, &rank, &why)) == 0) {
    FUZZ_CHECK(need > 0 && need <= sizeof buf - len);
    if (len == n) break; /* the stream ended: the gate would wait, then drop it */
    size_t k = need < n - len ? need : n - len;
    k = k > 1 && (s[len] & 1) ? k / 2 : k; /* bytes arrive in pieces */
    memcpy(buf + len, s + len, k);
    len += k;
  }
  int ok = valid(s, n, token, &want_rank);
  FUZZ_CHECK((r == 1) == ok);
  if (r == 1) FUZZ_CHECK(rank == want_rank && len == TDM_NET_HELLO_BYTES + (token ? strlen(token) : 0));
  if (r < 0) {
    FUZZ_CHECK(why && *why);
    uint32_t tl;
    memcpy(&tl, s + 8, 4);
    int early = strcmp(why, "wrong job token") != 0;
    FUZZ_CHECK(len == (early ? TDM_NET_HELLO_BYTES : TDM_NET_HELLO_BYTES + tl));
  }

  /* the dialler: the bytes after the first word (which tdm__net_dial read) wait in a socket */
  if (n < 4) return 0;
  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  size_t put = n - 4 < 65536 ? n - 4 : 65536; /* within the socket's buffer: never blocks */
  FUZZ_CHECK(put == 0 || send(sv[1], s + 4, put, MSG_DONTWAIT) == (ssize_t)put);
  close(sv[1]);
  uint32_t first;
  memcpy(&first, s, 4);
  int32_t their = -1;
  tdm_status st = tdm__net_recv_hello(sv[0], first, MAGIC, token, &their, tdm_time_now() + 5);
  close(sv[0]);
  FUZZ_CHECK((st == TDM_OK) == (ok && put == n - 4));
  if (st == TDM_OK) FUZZ_CHECK(their == want_rank);
  else FUZZ_CHECK(st == TDM_ERR_MISMATCH || st == TDM_ERR_REMOTE);
  return 0;
}
