/* Token data sets for language models: a text file read as bytes (vocabulary 256), or a uint16
 * token file in llm.c's layout (a header of 256 int32: magic 20240520, version 1, token count;
 * then the tokens). Sample i is the window tokens[i*T, i*T + T) with targets shifted by one. */
#include <stdio.h>
#include <string.h>

#include "core/file.h"
#include "core/internal.h"
#include "train/data/dataset_impl.h"

typedef struct {
  int32_t *tok;
  int64_t n;
  int64_t T;
} text_set;

static tdm_status text_tokens(const tdm_dataset *ds, const int64_t *idx, int64_t n, int32_t *x, int32_t *y) {
  const text_set *t = ds->impl;
  for (int64_t i = 0; i < n; i++) {
    const int32_t *w = t->tok + idx[i] * t->T;
    memcpy(x + i * t->T, w, sizeof(int32_t) * (size_t)t->T);
    memcpy(y + i * t->T, w + 1, sizeof(int32_t) * (size_t)t->T);
  }
  return TDM_OK;
}

static tdm_status text_batch(const tdm_dataset *ds, const int64_t *idx, int64_t n, float *x, int32_t *y) {
  (void)ds, (void)idx, (void)n, (void)x, (void)y;
  return tdm__set_error(TDM_ERR_INVALID_USAGE, "text data set: samples are token windows; use tdm_dataset_tokens");
}

static void text_destroy(tdm_dataset *ds) {
  text_set *t = ds->impl;
  tdm__free(t->tok);
  tdm__free(t);
  tdm__free(ds);
}

static const tdm_dataset_vtable text_vt = {"text", text_batch, text_destroy};

static tdm_status finish(tdm_dataset **out, int32_t *tok, int64_t n, int64_t T, int vocab, const char *path) {
  if (n < T + 1) {
    tdm__free(tok);
    return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: %lld tokens do not fill one window of %lld plus its target; use a shorter --seq-len",
                          path, (long long)n, (long long)T);
  }
  tdm_dataset *ds = tdm__calloc(1, sizeof *ds);
  text_set *t = tdm__calloc(1, sizeof *t);
  if (!ds || !t) {
    tdm__free(ds);
    tdm__free(t);
    tdm__free(tok);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  }
  t->tok = tok;
  t->n = n;
  t->T = T;
  ds->vt = &text_vt;
  ds->impl = t;
  ds->len = (n - 1) / T;
  ds->num_classes = vocab;
  ds->sample_ndim = 1;
  ds->sample_shape[0] = T;
  ds->sample_numel = T;
  ds->tokens = text_tokens;
  *out = ds;
  return TDM_OK;
}

tdm_status tdm_dataset_open_text(tdm_dataset **out, const char *path, int64_t T) {
  return tdm_dataset_open_text_part(out, path, T, 0.0, 1.0);
}

tdm_status tdm_dataset_open_text_part(tdm_dataset **out, const char *path, int64_t T, double from, double to) {
  if (!out || !path || T < 1 || !(from >= 0 && from < to && to <= 1))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "open_text: NULL argument, window %lld < 1 or part [%g, %g) outside [0, 1]",
                          (long long)T, from, to);
  unsigned char *b;
  int64_t n;
  TDM__TRY(tdm__file_read(path, INT64_MAX, "text file", &b, &n));
  int64_t lo = (int64_t)(from * (double)n), hi = (int64_t)(to * (double)n);
  memmove(b, b + lo, (size_t)(hi - lo));
  n = hi - lo;
  int32_t *tok = tdm__malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  if (!tok) {
    tdm__free(b);
    return tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  }
  for (int64_t i = 0; i < n; i++) tok[i] = b[i];
  tdm__free(b);
  return finish(out, tok, n, T, 256, path);
}

tdm_status tdm_dataset_open_tokens_u16(tdm_dataset **out, const char *path, int64_t T, int vocab) {
  if (!out || !path || T < 1 || vocab < 1 || vocab > 65536)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "open_tokens: NULL argument, window %lld < 1 or vocabulary %d outside 1..65536",
                          (long long)T, vocab);
  unsigned char *b;
  int64_t n;
  /* the header's count is an int32: 2^31 uint16 tokens after 1024 bytes at most */
  TDM__TRY(tdm__file_read(path, 1024 + ((int64_t)1 << 32), "token file", &b, &n));
  int32_t hdr[256];
  if (n < (int64_t)sizeof hdr) {
    tdm__free(b);
    return tdm__set_error(TDM_ERR_FORMAT, "%s: %lld bytes; a token file starts with a 1024-byte header", path, (long long)n);
  }
  memcpy(hdr, b, sizeof hdr);
  int64_t count = hdr[2], body = n - (int64_t)sizeof hdr;
  tdm_status st = TDM_OK;
  if (hdr[0] != 20240520) st = tdm__set_error(TDM_ERR_FORMAT, "%s: magic %d; expected 20240520 (llm.c's token files)", path, hdr[0]);
  else if (hdr[1] != 1) st = tdm__set_error(TDM_ERR_FORMAT, "%s: version %d; expected 1", path, hdr[1]);
  else if (body % 2) st = tdm__set_error(TDM_ERR_FORMAT, "%s: %lld bytes of tokens is odd; tokens are uint16", path, (long long)body);
  else if (count < 0 || count * 2 != body)
    st = tdm__set_error(TDM_ERR_FORMAT, "%s: the header says %lld tokens, the file holds %lld", path, (long long)count,
                        (long long)(body / 2));
  int32_t *tok = st == TDM_OK ? tdm__malloc(sizeof(int32_t) * (size_t)(count ? count : 1)) : NULL;
  if (st == TDM_OK && !tok) st = tdm__set_error(TDM_ERR_NO_MEMORY, "%s: out of memory", path);
  for (int64_t i = 0; st == TDM_OK && i < count; i++) {
    uint16_t v;
    memcpy(&v, b + sizeof hdr + 2 * i, 2);
    if (v >= vocab)
      st = tdm__set_error(TDM_ERR_FORMAT, "%s: token %u at position %lld is not below the vocabulary size %d", path, v,
                          (long long)i, vocab);
    else tok[i] = v;
  }
  tdm__free(b);
  if (st != TDM_OK) {
    tdm__free(tok);
    return st;
  }
  return finish(out, tok, count, T, vocab, path);
}

int tdm_dataset_is_tokens(const tdm_dataset *ds) {
  TDM__NONNULL(ds, 0, "tdm_dataset_is_tokens: the data set is NULL");
  return ds->tokens != NULL;
}

tdm_status tdm_dataset_tokens(const tdm_dataset *ds, const int64_t *idx, int64_t n, int32_t *x, int32_t *y) {
  if (!ds || (n > 0 && (!idx || !x || !y)))
    return tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_dataset_tokens: %s is NULL",
                          !ds ? "the data set" : !idx ? "idx" : !x ? "x" : "y");
  if (!ds->tokens)
    return tdm__set_error(TDM_ERR_INVALID_USAGE, "%s data set: samples are not token windows; use tdm_dataset_batch", ds->vt->name);
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= ds->len)
      return tdm__set_error(TDM_ERR_INVALID_ARG, "%s: window %lld is outside [0, %lld)", ds->vt->name, (long long)idx[i],
                            (long long)ds->len);
  return ds->tokens(ds, idx, n, x, y);
}
