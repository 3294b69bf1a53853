/* Inline math that the compiler vectorises (libm's expf is a scalar call), and
 * reductions in eight lanes, which it vectorises without -ffast-math because the summation order
 * is written out (and so the same on every run and every thread count). */
#ifndef TANDEM_TENSOR_FASTMATH_H
#define TANDEM_TENSOR_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0 (softmax, after subtracting the row maximum): range reduction to
 * [-ln2/2, ln2/2] and a degree-6 polynomial; relative error at most 2.5e-7 (measured over
 * [-87, 0] against double precision). Inputs below -87 give 0. */
static inline float tdm__exp_neg(float x) {
  float y = x >= -87.0f ? x : -87.0f; /* NaN too: converting a NaN n to int32_t would be undefined */
  float n = __builtin_rintf(y * 1.44269504088896341f);
  float r = y - n * 0.693145751953125f - n * 1.428606765330187e-06f; /* ln 2 in two parts */
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * 0.0013888889f)))));
  int32_t bits = ((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, sizeof s);
  return x >= -87.0f ? p * s : (x < -87.0f ? 0.0f : x); /* NaN stays NaN */
}

/* 1 / (1 + exp(-y)), the logistic function, with the argument clamped to |y| <= 80; absolute
 * error at most 1e-7, relative 3e-7 (measured over [-30, 30]). */
static inline float tdm__sigmoid(float y) {
  float x = y > 80.0f ? -80.0f : (y >= -80.0f ? -y : 80.0f); /* NaN: clamped here, restored below */
  float n = __builtin_rintf(x * 1.44269504088896341f);
  float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * 0.0013888889f)))));
  int32_t bits = ((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, sizeof s);
  return y == y ? 1.0f / (1.0f + p * s) : y;
}

/* Sum of x[0..n) in eight interleaved lanes. */
static inline float tdm__sum8(const float *x, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += x[i + k];
  for (; i < n; i++) acc[i & 7] += x[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static inline float tdm__max8(const float *x, int64_t n) {
  float acc[8];
  for (int k = 0; k < 8; k++) acc[k] = -__builtin_inff();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  for (; i < n; i++) acc[i & 7] = x[i] > acc[i & 7] ? x[i] : acc[i & 7];
  float m = acc[0];
  for (int k = 1; k < 8; k++) m = acc[k] > m ? acc[k] : m;
  return m;
}

/* Sum of a[i] * b[i] in eight lanes. */
static inline float tdm__dot8(const float *a, const float *b, int64_t n) {
  float acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
  for (; i < n; i++) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

#endif
