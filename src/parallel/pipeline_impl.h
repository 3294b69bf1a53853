/* Pipeline internals shared by schedule.c, pipeline.c and the tests. */
#ifndef TANDEM_PIPELINE_IMPL_H
#define TANDEM_PIPELINE_IMPL_H

#include "tandem/engine.h"
#include "tandem/pipeline.h"

/* Fills an empty schedule (tdm_pp_schedule_alloc) with s->kind's lists, without the guards of
 * tdm_pp_schedule_create and without verifying: the tests show what the verifier catches. */
tdm_status tdm__pp_schedule_generate(tdm_pp_schedule *s);

/* How the pipeline engine lays a transformer (GPT, Llama) out: P ranks x V chunks, the cut (chunk c holds blocks
 * [first_block[c], first_block[c + 1])) and the verified schedule for M micro-batches. Refuses,
 * naming the values, more chunks than blocks, a --pp-split that does not add up, and fewer
 * micro-batches than the schedule needs. */
typedef struct {
  int P, V, C, M;
  int *first_block;
  tdm_pp_schedule *s;
} tdm__pp_layout;
tdm_status tdm__pp_layout_make(const tdm_model_config *mc, const tdm_engine_config *ec, int P, tdm__pp_layout *out);
void tdm__pp_layout_free(tdm__pp_layout *l);

#endif
