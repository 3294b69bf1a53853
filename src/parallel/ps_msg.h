/* The parameter server's messages (tagged, on the world communicator): a fixed header, then the
 * shard's floats. The header names the key range and carries a checksum of the payload, so a push
 * for keys a server does not own or a corrupted one is named and never applied. */
#ifndef TANDEM_PS_MSG_H
#define TANDEM_PS_MSG_H

#include <stdint.h>
#include <string.h>

#include "tandem/core.h"

#define TDM_PS_MAGIC 0x53505354u /* "TSPS" */
#define TDM_PS_TAG_TO_SERVER 0x7053
#define TDM_PS_TAG_TO_WORKER 0x7054

/* PULL: the shard once every live worker has asked (the workers' final meeting); LOST: server 0's
 * list of the workers lost (the answer: int32 ranks, hi of them) */
/* CKPT: a checkpoint of step clock once every live worker asks (answered as PULL, then written
 * by all together); RESUME: load the shard from the checkpoint the workers resumed from (payload:
 * its manifest's path, NUL-padded to hi 4-byte words; lost: the manifest's checksum; clock: its step) */
typedef enum { TDM_PS_PUSH = 1, TDM_PS_DONE, TDM_PS_PARAMS, TDM_PS_PULL, TDM_PS_LOST, TDM_PS_CKPT, TDM_PS_RESUME } tdm__ps_kind;
#define TDM_PS_PATH_MAX 4096

typedef struct tdm__ps_msg {
  uint32_t magic, kind;
  int64_t clock;   /* push: the worker's step; params: pushes of this worker applied */
  int64_t version; /* push: the shard version its gradient was computed on; params: the version now */
  int64_t lo, hi;  /* the key range of the payload */
  float lr;        /* push: the step's learning rate; params: the staleness of this worker's last push */
  uint32_t lost;   /* params: the workers this server has lost so far */
  uint64_t sum;    /* tdm__ps_sum of the payload */
} tdm__ps_msg;
_Static_assert(sizeof(tdm__ps_msg) == 56, "the parameter server's header is 56 bytes");

/* A checksum of n floats (their bits), in 64-bit words. */
static inline uint64_t tdm__ps_sum(const float *v, int64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    uint64_t w;
    memcpy(&w, v + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  if (i < n) {
    uint32_t w;
    memcpy(&w, v + i, 4);
    h = (h ^ w) * 0x100000001b3ull;
  }
  return tdm_hash64(h, 0x5053);
}

#endif
