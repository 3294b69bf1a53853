/* What a training run tells the outside about itself, besides its per-step records: the metrics
 * file's run header (who wrote the records that follow: a run id, the configuration's hash, the
 * configuration, the plan, the environment), and the live status each rank publishes for
 * `tandem run --status-every`. Internal to the trainer; the report (src/report/) reads both. */
#ifndef TANDEM_TRAIN_OBSERVE_H
#define TANDEM_TRAIN_OBSERVE_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/plan.h"
#include "tandem/train.h"
#include "train/run_start.h"

typedef struct {
  const tdm_train_config *cfg;
  const tdm__run_identity *id;
  const tdm_plan *plan;
  int world, data, tensor, pipeline; /* ranks in all and on each axis */
  int64_t batch, accum, global_batch, total_steps, start_step, resumed_from, parameters;
  int threads;
  const char *engine, *transport;
} tdm__header_in;

/* The configuration's hash: the identity's keys and values (what a resumed run must share). */
uint64_t tdm__config_hash(const tdm__run_identity *id);

/* Writes one JSON line {"tandem_run":{...}} to f: run_id (fresh for every start), job (the
 * launcher's TANDEM_JOB_TOKEN; the same across its restarts), attempt (TANDEM_RESTART_COUNT),
 * resumed_from, config_hash, the configuration, the plan per memory category, the environment.
 * Not thread-safe (one writer: rank 0). */
void tdm__metrics_header(FILE *f, const tdm__header_in *in);

/* One rank's live status: written, at most every TANDEM_STATUS_EVERY / 2 seconds (0.5 s when
 * unset), to $TANDEM_STATUS_DIR/rank-R.json (a temporary renamed over it: a reader never sees
 * half a file). Nothing happens without TANDEM_STATUS_DIR. final: written whatever the time. */
typedef struct {
  int rank, world;
  int64_t step, total;
  double loss, samples_per_sec, step_ms, forward_ms, backward_ms, comm_wait_ms, optimizer_ms;
  double comm_share; /* this rank's communication wait over its step time, since the start */
} tdm__status;
void tdm__status_publish(const tdm__status *s, int final);

#endif
