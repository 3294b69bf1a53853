/* What the data-parallel engines (dp.c, zero.c) share: checking that every rank built the same
 * model, and their switches from the environment. */
#ifndef TANDEM_PARALLEL_COMMON_H
#define TANDEM_PARALLEL_COMMON_H

#include "tandem/comm.h"
#include "tandem/nn.h"

/* Collective over c: TDM_ERR_MISMATCH naming the first rank and parameter that differ (names and
 * shapes) when the ranks' models are not the same. */
tdm_status tdm__check_same_model(tdm_comm_t c, const tdm_params *p);
/* A 0/1 switch from the environment: *out = -1 when unset, else its value; anything else is an
 * error naming the variable. */
tdm_status tdm__env_switch(const char *name, int *out);
/* Whether bucket work of `ranks` ranks on this node runs on the calling thread (1) or the
 * communication thread (0): on the calling thread when no core is spare (TANDEM_DP_INLINE=1/0
 * forces it), since the communication thread could then only take turns with backward. */
tdm_status tdm__inline_comm(int ranks, int *out);

#endif
