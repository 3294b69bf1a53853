/* Pipeline internals shared by schedule.c, pipeline.c and the tests. */
#ifndef TANDEM_PIPELINE_IMPL_H
#define TANDEM_PIPELINE_IMPL_H

#include "tandem/pipeline.h"

/* Fills an empty schedule (tdm_pp_schedule_alloc) with s->kind's lists, without the guards of
 * tdm_pp_schedule_create and without verifying: the tests show what the verifier catches. */
tdm_status tdm__pp_schedule_generate(tdm_pp_schedule *s);

#endif
