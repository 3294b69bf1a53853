/* The rendezvous store's requests (tdm__store_parse, what the server runs on each client's
 * buffer) on a fuzzed stream, consumed request by request as the server does. A request accepted
 * is whole and inside the bytes, its command one of S, O, G, A, its key 1..TDM_STORE_MAX_KEY bytes
 * without NUL (the server keeps it as a C string), its value at most TDM_STORE_MAX_VAL bytes (a
 * get's none, an add's 8): so nothing the server allocates for it is larger; every proper
 * prefix of it asks for more bytes. A stream that stops short asks for more; anything else is
 * refused (the server drops the client), with a reason. */
#include "fuzz.h"

#include "comm/net.h"

/* What the parser must say about the request at the start of b (n bytes): 1, 0 or -1. */
static int expected(const uint8_t *b, size_t n) {
  if (n < TDM_STORE_REQ_HEAD) return 0;
  uint32_t kl;
  uint64_t vl;
  memcpy(&kl, b + 1, 4);
  memcpy(&vl, b + 5, 8);
  int cmd_ok = ((b[0] == 'S' || b[0] == 'O') && vl <= TDM_STORE_MAX_VAL) || (b[0] == 'G' && vl == 0) || (b[0] == 'A' && vl == 8);
  if (!cmd_ok || kl == 0 || kl > TDM_STORE_MAX_KEY) return -1;
  if (n < TDM_STORE_REQ_HEAD + kl) return 0;
  if (memchr(b + TDM_STORE_REQ_HEAD, 0, kl)) return -1;
  return n < TDM_STORE_REQ_HEAD + kl + vl ? 0 : 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t at = 0;
  for (int k = 0; k < 1000; k++) {
    const uint8_t *b = data + at;
    size_t n = size - at;
    tdm__store_req rq;
    const char *why = NULL;
    int r = tdm__store_parse(b, n, &rq, &why);
    FUZZ_CHECK(r == expected(b, n));
    if (r < 0) FUZZ_CHECK(why && *why);
    if (r <= 0) return 0;
    FUZZ_CHECK(rq.cmd == b[0] && rq.key == b + TDM_STORE_REQ_HEAD && rq.val == rq.key + rq.key_len);
    FUZZ_CHECK(rq.key_len >= 1 && rq.key_len <= TDM_STORE_MAX_KEY && rq.val_len <= TDM_STORE_MAX_VAL);
    FUZZ_CHECK(rq.bytes == TDM_STORE_REQ_HEAD + rq.key_len + rq.val_len && rq.bytes <= n);
    FUZZ_CHECK(strnlen((const char *)rq.key, rq.key_len) == rq.key_len);
    for (size_t cut = 0; cut < rq.bytes; cut += 1 + cut / 2) { /* the server sees a request arrive in pieces */
      tdm__store_req part;
      FUZZ_CHECK(tdm__store_parse(b, cut, &part, &why) == 0);
    }
    at += rq.bytes;
  }
  return 0;
}
