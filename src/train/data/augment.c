/* Image augmentation: random crop with zero padding and horizontal flip (torchvision's RandomCrop(
 * size, padding) and RandomHorizontalFlip), each image's draw a hash of (seed, epoch, position)
 * alone, so a sample gets the same augmentation whatever the world size, batch or thread. */
#include <string.h>

#include "core/internal.h"
#include "tandem/data.h"

void tdm_augment_draw(uint64_t seed, int64_t epoch, int64_t position, int pad, int flip, int *dy, int *dx, int *flipped) {
  if (!dy || !dx || !flipped) {
    tdm__set_error(TDM_ERR_INVALID_ARG, "tdm_augment_draw: %s is NULL", !dy ? "dy" : !dx ? "dx" : "flipped");
    return;
  }
  uint64_t h = tdm_hash64(tdm_hash64(seed ^ 0x61756775u, (uint64_t)epoch), (uint64_t)position);
  uint64_t span = pad > 0 ? 2 * (uint64_t)pad + 1 : 1; /* (2 * INT_MAX + 1 overflowed int) */
  *dy = pad > 0 ? (int)((int64_t)(h % span) - pad) : 0;
  *dx = pad > 0 ? (int)((int64_t)((h >> 20) % span) - pad) : 0;
  *flipped = flip ? (int)((h >> 40) & 1) : 0;
}

tdm_status tdm_augment_images(float *x, int64_t n, int64_t C, int64_t H, int64_t W, int pad, int flip, uint64_t seed,
                              int64_t epoch, int64_t first, float *scratch) {
  if (!x || !scratch || n < 0 || C < 1 || H < 1 || W < 1 || pad < 0 || pad > H || pad > W)
    return tdm__set_error(TDM_ERR_INVALID_ARG, "augment: %lld images of %lldx%lldx%lld, padding %d; expected padding 0..%lld%s",
                          (long long)n, (long long)C, (long long)H, (long long)W, pad, (long long)(H < W ? H : W),
                          !x || !scratch ? " and both buffers (one is NULL)" : C < 1 || H < 1 || W < 1 ? " and images of at least 1x1x1" : "");
  int64_t per = C * H * W;
  for (int64_t i = 0; i < n; i++) {
    int dy, dx, fl;
    tdm_augment_draw(seed, epoch, first + i, pad, flip, &dy, &dx, &fl);
    if (!dy && !dx && !fl) continue;
    float *img = x + i * per;
    memcpy(scratch, img, sizeof(float) * (size_t)per);
    for (int64_t c = 0; c < C; c++)
      for (int64_t yy = 0; yy < H; yy++) {
        int64_t sy = yy + dy; /* the padded image cropped at (pad + dy, pad + dx) */
        float *o = img + (c * H + yy) * W;
        for (int64_t xx = 0; xx < W; xx++) {
          int64_t sx = (fl ? W - 1 - xx : xx) + dx;
          o[xx] = sy >= 0 && sy < H && sx >= 0 && sx < W ? scratch[(c * H + sy) * W + sx] : 0.0f;
        }
      }
  }
  return TDM_OK;
}
