/* Which direct convolution kernels run (conv_direct_impl.h is their body): the CPU's best at the
 * first call (AVX-512, else AVX2 with FMA, else none: every convolution runs im2col + GEMM),
 * unless TANDEM_CONV or tdm_k_conv2d_direct_select / _enable say otherwise. Asking the CPU, not
 * the compiler, lets one binary (a container image, a portable or sanitizer build) run the
 * kernels each machine has; -march=native builds get the same choice. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/conv_direct.h"

/* The table for isa where both the build and this CPU have it, else NULL. */
static const tdm__conv_direct_impl *cpu_has(const char *isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (!strcmp(isa, "avx512")) {
    return __builtin_cpu_supports("avx512f") ? tdm__conv_direct_avx512() : NULL;
  }
  if (!strcmp(isa, "avx2")) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? tdm__conv_direct_avx2() : NULL;
  }
#else
  (void)isa;
#endif
  return NULL;
}

static const tdm__conv_direct_impl *best(void) {
  const tdm__conv_direct_impl *t = cpu_has("avx512");
  return t ? t : cpu_has("avx2");
}

static const tdm__conv_direct_impl *_Atomic impl; /* the kernels in use; NULL: none here */
static _Atomic int enabled = -1;                  /* -1: TANDEM_CONV not read yet */
static _Atomic int winograd = 1;                  /* 3x3 and 5x5 stride 1: Winograd */
static _Atomic int wino_tile = 4;                 /* 3x3: F(4x4, 3x3) (4) or F(2x2, 3x3) (2) */

/* Once per process (a second run could undo a select() or enable() made in between). */
static void setup_once(void) {
  const char *e = getenv("TANDEM_CONV");
  const tdm__conv_direct_impl *t = best();
  int on = !(e && !strcmp(e, "im2col"));
  if (e && (!strcmp(e, "avx2") || !strcmp(e, "avx512"))) {
    const tdm__conv_direct_impl *want = cpu_has(e);
    if (want) t = want;
    else /* a kernel cannot fail the step: say so, run the default */
      tdm_log(TDM_LOG_WARN, "TANDEM_CONV='%s': this CPU or build has no %s kernels; %s%s run", e, e,
              t ? t->isa : "im2col + GEMM", t ? " kernels" : "s");
  } else if (e && strcmp(e, "im2col") && strcmp(e, "direct")) {
    tdm_log(TDM_LOG_WARN, "TANDEM_CONV='%s' is none of 'direct', 'im2col', 'avx2', 'avx512': the default runs", e);
  }
  impl = t;
  const char *wg = getenv("TANDEM_WINOGRAD");
  if (wg && (!strcmp(wg, "0") || !strcmp(wg, "off"))) winograd = 0;
  else if (wg && !strcmp(wg, "2x2")) wino_tile = 2;
  else if (wg && strcmp(wg, "1") && strcmp(wg, "on") && strcmp(wg, "4x4"))
    tdm_log(TDM_LOG_WARN, "TANDEM_WINOGRAD='%s' is none of 'on', 'off', '1', '0', '4x4', '2x2': Winograd stays on (4x4)",
            wg);
  enabled = on;
}

static void setup(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (enabled < 0) pthread_once(&once, setup_once);
}

void tdm_k_conv2d_direct_enable(int on) {
  setup();
  enabled = !!on;
}

int tdm_k_conv2d_winograd_enable(int on) {
  setup();
  return atomic_exchange(&winograd, !!on);
}

int tdm_k_conv2d_winograd_tile(int tile) {
  setup();
  if (tile != 2 && tile != 4) return wino_tile;
  return atomic_exchange(&wino_tile, tile);
}

int tdm_k_conv2d_winograd_on(const tdm_conv_shape *s) {
  if (!s) return tdm_k_conv2d_direct_isa() && winograd;
  if (!tdm_k_conv2d_direct_fits(s)) return 0;
  const tdm__conv_direct_impl *t = impl;
  return winograd && t->wino_fits(s);
}

int tdm_k_conv2d_direct_select(const char *isa) {
  setup();
  const tdm__conv_direct_impl *t = isa ? cpu_has(isa) : best();
  if (!t) return 0;
  impl = t;
  return 1;
}

const char *tdm_k_conv2d_direct_isa(void) {
  setup();
  const tdm__conv_direct_impl *t = impl;
  return t && enabled ? t->isa : NULL;
}

int tdm_k_conv2d_direct_fits(const tdm_conv_shape *s) {
  if (!s) return 0;
  setup();
  int same = s->stride == 1 && ((s->KH == 3 && s->pad == 1) || (s->KH == 5 && s->pad == 2));
  int halve = s->stride == 2 && s->KH == 3 && s->pad == 1;
  return enabled && impl && s->KH == s->KW && (same || halve) && s->N > 0 && s->Ci > 0 && s->Co > 0 && s->H > 0 &&
         s->W > 0 && s->OH == (s->H + 2 * s->pad - s->KH) / s->stride + 1 &&
         s->OW == (s->W + 2 * s->pad - s->KW) / s->stride + 1;
}

/* Enough for every set this CPU has (their layouts differ either way): a select() between the
 * sizing and the call cannot overrun the workspace. */
int64_t tdm_k_conv2d_direct_ws_floats(const tdm_conv_shape *s) {
  if (!tdm_k_conv2d_direct_fits(s)) return 0;
  const tdm__conv_direct_impl *a = cpu_has("avx2"), *b = cpu_has("avx512");
  int64_t x = a ? a->ws_floats(s) : 0, y = b ? b->ws_floats(s) : 0;
  return x > y ? x : y;
}

void tdm_k_conv2d_fwd_direct(float *out, const float *x, const float *w, const float *b, float *ws,
                             const tdm_conv_shape *s) {
  if (!tdm_k_conv2d_direct_fits(s)) return; /* (sets impl up on a first call) */
  const tdm__conv_direct_impl *t = impl;
  if (winograd && t->wino_fits(s)) t->wino_fwd(out, x, w, b, ws, s, wino_tile);
  else t->fwd(out, x, w, b, ws, s);
}

void tdm_k_conv2d_bwd_direct(float *dx, int dx_set, float *dw, float *db, const float *dout, const float *x,
                             const float *w, float *ws, const tdm_conv_shape *s) {
  if (!tdm_k_conv2d_direct_fits(s)) return;
  const tdm__conv_direct_impl *t = impl;
  if (winograd && t->wino_fits(s)) { /* they share ws, one after the other */
    int tile = wino_tile;
    if (dx) t->wino_dx(dx, dx_set, dout, w, ws, s, tile);
    if (dw && t->wino_dw(dw, dout, x, ws, s, tile)) dw = NULL; /* (declined at several hundred channels) */
    if (dw || db) t->bwd(NULL, 0, dw, db, dout, x, w, ws, s);
  } else {
    t->bwd(dx, dx_set, dw, db, dout, x, w, ws, s);
  }
}
