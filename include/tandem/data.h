/* tandem — data sets for training.
 *
 * A data set is an opaque handle behind one interface (size, sample shape, batch assembly) so the
 * sampler and the trainer do not care where samples come from. Readers so far:
 *   - IDX (MNIST / Fashion-MNIST): the four standard files, gzip'd or not, fully validated;
 *   - synthetic: a generator (a Gaussian sample and a teacher's label per index);
 *   - text as bytes (tiny Shakespeare) and llm.c's uint16 token files, as windows of T tokens.
 *
 *   tdm_dataset *train;
 *   if (tdm_dataset_open_idx(&train, "/usr/share/datasets/fashion-mnist", 1) != TDM_OK) ...
 *   tdm_dataset_batch(train, indices, 64, x, y);   // x (64, 1, 28, 28) in [0, 1], y (64)
 *
 * Thread safety: batch assembly only reads, so threads may share a data set. A NULL data set or
 * pointer is TDM_ERR_INVALID_ARG naming it (getters return 0 and set tdm_last_error()); freeing
 * or destroying NULL does nothing.
 */
#ifndef TANDEM_DATA_H
#define TANDEM_DATA_H

#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One IDX file of unsigned bytes: dims (big-endian in the file) and data. */
typedef struct tdm_idx {
  int ndim;
  int64_t dims[4];
  uint8_t *data; /* owned; free with tdm_idx_free */
  int64_t n;     /* product of dims */
} tdm_idx;
/* Reads path (plain or gzip'd). Checks the magic (0x0000 08 ndim), that the data length equals
 * the product of the dims, and that nothing follows it. */
tdm_status tdm_idx_read(const char *path, tdm_idx *out);
void tdm_idx_free(tdm_idx *f);

typedef struct tdm_dataset tdm_dataset;
/* MNIST-layout IDX set in dir: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. */
tdm_status tdm_dataset_open_idx(tdm_dataset **out, const char *dir, int train);
/* Synthetic classification: n samples of the given shape, labels from a random linear teacher
 * fixed by seed; sample i depends only on (seed, first_index + i), so a test split is the same
 * task drawn from other indices. */
tdm_status tdm_dataset_open_synthetic(tdm_dataset **out, int64_t n, int ndim, const int64_t *shape, int classes,
                                      uint64_t seed, uint64_t first_index);
/* Language-model data: a text file as bytes (vocabulary 256), or llm.c's uint16 token file
 * (1024-byte header: magic 20240520, version 1, token count; every token below vocab). Sample i is
 * the window of T tokens starting at i*T; its targets are the same window shifted by one. */
tdm_status tdm_dataset_open_text(tdm_dataset **out, const char *path, int64_t T);
/* The part [from, to) of the file (fractions of its length): a train / validation split. */
tdm_status tdm_dataset_open_text_part(tdm_dataset **out, const char *path, int64_t T, double from, double to);
int tdm_dataset_is_tokens(const tdm_dataset *ds);
tdm_status tdm_dataset_open_tokens_u16(tdm_dataset **out, const char *path, int64_t T, int vocab);
/* Token windows x (n, T) and targets y (n, T) of a token data set. */
tdm_status tdm_dataset_tokens(const tdm_dataset *ds, const int64_t *idx, int64_t n, int32_t *x, int32_t *y);
/* CIFAR-style binary batches in dir (CIFAR-10's binary version): records of a label byte and a
 * channels x height x width image (channel-major, row by row); training reads data_batch_1.bin,
 * data_batch_2.bin, ... as far as they go, test reads test_batch.bin. A file that is not a whole
 * number of records, or a label >= classes, is TDM_ERR_FORMAT naming the file and the sizes. */
tdm_status tdm_dataset_open_cifar(tdm_dataset **out, const char *dir, int train, int channels, int height, int width,
                                  int classes);
/* Augments images x (n, C, H, W) in place: a random crop of the image zero-padded by pad on every
 * side (a shift of -pad..pad in each direction) and, with flip, a horizontal flip with probability
 * 1/2 (applied to the crop), as torchvision's RandomCrop(H, padding=pad) + RandomHorizontalFlip.
 * Image i's draw depends only on (seed, epoch, first + i): give first the position of the batch's
 * first sample in the epoch's order (tdm_sampler_next's) and N ranks augment exactly as one
 * process. scratch holds C*H*W floats. tdm_augment_draw gives the draw: shifts dy, dx, flipped. */
tdm_status tdm_augment_images(float *x, int64_t n, int64_t C, int64_t H, int64_t W, int pad, int flip, uint64_t seed,
                              int64_t epoch, int64_t first, float *scratch);
void tdm_augment_draw(uint64_t seed, int64_t epoch, int64_t position, int pad, int flip, int *dy, int *dx, int *flipped);
void tdm_dataset_destroy(tdm_dataset *ds);
int64_t tdm_dataset_len(const tdm_dataset *ds);
int tdm_dataset_num_classes(const tdm_dataset *ds);
/* Shape of one sample (e.g. 1, 28, 28); returns its number of axes. */
int tdm_dataset_sample_shape(const tdm_dataset *ds, int64_t *shape);
int64_t tdm_dataset_sample_numel(const tdm_dataset *ds);
/* Writes samples idx[0..n) as floats into x (n x sample_numel) and their labels into y (n). */
tdm_status tdm_dataset_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y);

#ifdef __cplusplus
}
#endif
#endif
