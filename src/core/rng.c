#include <math.h>

#include "core/internal.h"
#include "tandem/core.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void tdm_rng_seed(tdm_rng *r, uint64_t seed) {
  TDM__NONNULL(r, , "tdm_rng_seed: the generator is NULL");
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tdm_rng_next(tdm_rng *r) {
  TDM__NONNULL(r, 0, "tdm_rng_next: the generator is NULL");
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float tdm_rng_uniform(tdm_rng *r) {
  TDM__NONNULL(r, NAN, "tdm_rng_uniform: the generator is NULL");
  return (float)(tdm_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

float tdm_rng_normal(tdm_rng *r) {
  TDM__NONNULL(r, NAN, "tdm_rng_normal: the generator is NULL");
  /* Box-Muller on doubles; u1 in (0, 1] so log() is finite. */
  double u1 = ((double)(tdm_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(tdm_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t tdm__hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

uint64_t tdm_hash64(uint64_t key, uint64_t counter) {
  uint64_t x = key ^ (counter * 0xD6E8FEB86659FD93ull);
  x = (x ^ (x >> 32)) * 0xD6E8FEB86659FD93ull;
  x = (x ^ (x >> 32)) * 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 32);
}
