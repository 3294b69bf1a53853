/* tandem — the training loop for classifiers (MLP, CNN on IDX image data sets).
 *
 * tdm_train_run does what `tandem train` does: open the data, build the model, train with the
 * chosen optimizer, evaluate on the test set after every epoch, write metrics and weights.
 *
 *   tdm_train_config c = tdm_train_config_default();
 *   c.epochs = 1;
 *   c.progress = stderr;
 *   tdm_train_result r;
 *   if (tdm_train_run(&c, &r) == TDM_OK) printf("%.4f\n", r.test_accuracy);
 *
 * Metrics (JSON lines, one object per line): per step {"step", "epoch", "loss",
 * "samples_per_sec", "step_time_ms", "time_forward_ms", "time_backward_ms",
 * "time_optimizer_ms", "lr"}; per evaluation {"epoch", "step", "test_loss", "test_accuracy"}.
 * Not thread-safe (it sets the intra-op thread count).
 */
#ifndef TANDEM_TRAIN_H
#define TANDEM_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_train_config {
  const char *model;     /* "mlp" | "cnn" */
  const char *data;      /* "fashion-mnist" (any MNIST-layout IDX directory) */
  const char *data_dir;
  int64_t epochs;        /* used when steps == 0 */
  int64_t steps;         /* > 0: train exactly this many steps */
  int64_t batch_size;
  double lr;
  const char *optimizer; /* "sgd" | "adam" | "adamw" */
  double weight_decay;   /* < 0: the optimizer's default */
  double momentum;       /* SGD */
  double dropout;
  uint64_t seed;
  int threads;           /* 0: all cores */
  const char *init_weights, *save_weights, *metrics; /* NULL for none */
  int64_t eval_batch;
  FILE *progress;        /* live progress and evaluation lines; NULL for silence */
} tdm_train_config;

typedef struct tdm_train_result {
  int64_t steps;
  double final_loss;      /* loss of the last step */
  double test_loss, test_accuracy;
  double samples_per_sec; /* training samples / training wall time (evaluation excluded) */
  double train_seconds;
} tdm_train_result;

/* Defaults of `tandem train`: mlp on fashion-mnist, 1 epoch, batch 64, Adam lr 1e-3, dropout
 * 0.3, seed 42. */
tdm_train_config tdm_train_config_default(void);
tdm_status tdm_train_run(const tdm_train_config *cfg, tdm_train_result *res);

#ifdef __cplusplus
}
#endif
#endif
