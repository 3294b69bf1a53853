/* Shared by the data-parallel engines; see common.h. */
#include "parallel/common.h"

#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static uint64_t structure_hash(const tdm_params *p, int upto) {
  uint64_t h = 0x7a6e6d;
  for (int i = 0; i < upto; i++) {
    tdm_tensor *t = tdm_params_get(p, i);
    for (const char *s = tdm_tensor_name(t); *s; s++) h = tdm_hash64(h, (uint64_t)(unsigned char)*s);
    for (int d = 0; d < tdm_tensor_ndim(t); d++) h = tdm_hash64(h, (uint64_t)tdm_tensor_dim(t, d));
  }
  return h;
}

/* Every rank's model must be the same: compare hashes of growing prefixes to name the first
 * parameter that differs. */
tdm_status tdm__check_same_model(tdm_comm_t c, const tdm_params *p) {
  int P = tdm_comm_size(c), n = tdm_params_count(p);
  uint64_t mine[2] = {structure_hash(p, n), (uint64_t)n}, *all = tdm__malloc(sizeof(uint64_t) * 2 * (size_t)P);
  if (!all) return tdm__set_error(TDM_ERR_NO_MEMORY, "model check: out of memory");
  tdm_status st = tdm_comm_allgather(c, mine, all, 2, TDM_I64, TDM_ALGO_AUTO);
  int bad = -1;
  for (int r = 0; st == TDM_OK && r < P && bad < 0; r++)
    if (all[2 * r] != all[0]) bad = r;
  if (st == TDM_OK && bad >= 0) {
    /* find the first differing parameter: bisect on prefixes, collectively */
    int lo = 0, hi = n;
    for (int r = 0; r < P; r++) /* the same bound on every rank: the loop is collective */
      if ((int)all[2 * r + 1] < hi || r == 0) hi = r == 0 ? (int)all[1] : ((int)all[2 * r + 1] < hi ? (int)all[2 * r + 1] : hi);
    for (int k = 1; k <= hi && st == TDM_OK; k++) {
      uint64_t h = structure_hash(p, k), *hs = all;
      st = tdm_comm_allgather(c, &h, hs, 1, TDM_I64, TDM_ALGO_AUTO);
      if (st == TDM_OK && hs[bad] != hs[0]) {
        lo = k - 1;
        break;
      }
      lo = k;
    }
    if (st == TDM_OK) {
      tdm_tensor *t = tdm_params_get(p, lo < n ? lo : n - 1);
      char s[96];
      st = tdm__set_error(TDM_ERR_MISMATCH,
                          "rank %d built a different model than rank 0: they differ at parameter %d "
                          "(here '%s' %s; %d parameters here) — give every rank the same model options",
                          bad, lo, t ? tdm_tensor_name(t) : "?", t ? tdm_shape_str(tdm_tensor_ndim(t), tdm_tensor_shape(t), s, sizeof s) : "",
                          n);
    }
  }
  tdm__free(all);
  return st;
}

/* A 0/1 switch from the environment: -1 when unset, else its value; anything else is an error. */
tdm_status tdm__env_switch(const char *name, int *out) {
  const char *v = getenv(name);
  *out = -1;
  if (!v || !*v) return TDM_OK;
  if (strcmp(v, "0") && strcmp(v, "1"))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "environment: %s is '%s'; expected 0 or 1", name, v);
  *out = v[0] == '1';
  return TDM_OK;
}

tdm_status tdm__inline_comm(int ranks, int *out) {
  int forced;
  TDM__TRY(tdm__env_switch("TANDEM_DP_INLINE", &forced));
  *out = forced >= 0 ? forced : !tdm_spare_core(ranks);
  return TDM_OK;
}
