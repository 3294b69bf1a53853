/* Conversions between f32 and the 16-bit storage types, vectorised and split over the pool: mixed
 * precision converts activations on every op, so these run at memory speed. Round to nearest even,
 * NaN stays NaN, overflow gives infinity (the scalar tdm_f32_to_bf16 / _f16 agree bit for bit on
 * every non-NaN value). */
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tandem/tensor.h"
#ifdef __F16C__
#include <immintrin.h>
#endif

typedef struct {
  void *dst;
  const void *src;
} cv_ctx;

static void f32_to_bf16_range(void *vc, int64_t i0, int64_t i1) {
  cv_ctx *c = vc;
  const uint32_t *restrict s = c->src;
  uint16_t *restrict d = c->dst;
  for (int64_t i = i0; i < i1; i++) {
    uint32_t u = s[i];
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
  }
}

static void bf16_to_f32_range(void *vc, int64_t i0, int64_t i1) {
  cv_ctx *c = vc;
  const uint16_t *restrict s = c->src;
  uint32_t *restrict d = c->dst;
  for (int64_t i = i0; i < i1; i++) d[i] = (uint32_t)s[i] << 16;
}

static void f32_to_f16_range(void *vc, int64_t i0, int64_t i1) {
  cv_ctx *c = vc;
  const float *restrict s = c->src;
  uint16_t *restrict d = c->dst;
  int64_t i = i0;
#ifdef __F16C__
  for (; i + 8 <= i1; i += 8)
    _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < i1; i++) d[i] = tdm_f32_to_f16(s[i]);
}

static void f16_to_f32_range(void *vc, int64_t i0, int64_t i1) {
  cv_ctx *c = vc;
  const uint16_t *restrict s = c->src;
  float *restrict d = c->dst;
  int64_t i = i0;
#ifdef __F16C__
  for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
  for (; i < i1; i++) d[i] = tdm_f16_to_f32(s[i]);
}

#define CHUNK 32768
void tdm_k_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  cv_ctx c = {dst, src};
  tdm_parallel_for(n, CHUNK, f32_to_bf16_range, &c);
}
void tdm_k_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
  cv_ctx c = {dst, src};
  tdm_parallel_for(n, CHUNK, bf16_to_f32_range, &c);
}
void tdm_k_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
  cv_ctx c = {dst, src};
  tdm_parallel_for(n, CHUNK, f32_to_f16_range, &c);
}
void tdm_k_f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
  cv_ctx c = {dst, src};
  tdm_parallel_for(n, CHUNK, f16_to_f32_range, &c);
}

/* Rounds f32 values to the precision of a 16-bit type, staying f32 (what a product on 16-bit
 * inputs sees): x -> f32(bf16(x)). In place allowed. */
static void round_bf16_range(void *vc, int64_t i0, int64_t i1) {
  cv_ctx *c = vc;
  const uint32_t *s = c->src;
  uint32_t *d = c->dst;
  for (int64_t i = i0; i < i1; i++) {
    uint32_t u = s[i];
    uint32_t r = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    d[i] = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : r;
  }
}

static void round_f16_range(void *vc, int64_t i0, int64_t i1) {
  cv_ctx *c = vc;
  const float *s = c->src;
  float *d = c->dst;
  int64_t i = i0;
#ifdef __F16C__
  for (; i + 8 <= i1; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT)));
#endif
  for (; i < i1; i++) d[i] = tdm_f16_to_f32(tdm_f32_to_f16(s[i]));
}

void tdm_k_round_bf16(float *dst, const float *src, int64_t n) {
  cv_ctx c = {dst, src};
  tdm_parallel_for(n, CHUNK, round_bf16_range, &c);
}
void tdm_k_round_f16(float *dst, const float *src, int64_t n) {
  cv_ctx c = {dst, src};
  tdm_parallel_for(n, CHUNK, round_f16_range, &c);
}
