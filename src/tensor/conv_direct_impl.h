/* The direct convolution kernels' body, included once per instruction set by
 * kernels_conv_direct_avx2.c and kernels_conv_direct_avx512.c (each compiled with its -m flags;
 * kernels_conv_direct.c picks one at run time). The includer defines CONV_DIRECT_VL (8: AVX2
 * with FMA, 16: AVX-512) and CONV_DIRECT_TABLE, the name of the table it exports.
 *
 * conv2d without a column matrix, for the convolutions ResNets and the small CNN are made of:
 * stride 1, square 3x3 (pad 1) or 5x5 (pad 2) kernels, which keep the image's size, and 3x3
 * stride 2 (below).
 *
 * Each image plane is copied once into a zero-padded plane of width Wp = W + 2 pad. On that
 * plane an output pixel (y, x) and its input tap (ky, kx) are q = y Wp + x and q + ky Wp + kx:
 * every tap is the same contiguous run of memory shifted by a constant, so a block of VL output
 * pixels is one unaligned VL-float load per tap and input channel, and the products are FMAs on
 * registers (AVX-512: 8 output channels x 48 pixels; AVX2: 4 x 24). The two columns of a row
 * that fall in the padding are computed and dropped (7% more work at 28x28, 29% at 7x7) instead
 * of the nine-fold column matrix im2col writes and the GEMM reads back. The input gradient is the
 * same kernel on the padded output gradient with the weights flipped and transposed; the weight
 * gradient keeps
 * per-lane sums of output gradient x shifted input in registers (AVX-512: 2 output channels x 9
 * taps, or 4 x 5; AVX2: 3 x 3 or 2 x 5) and adds them across lanes at the end.
 *
 * Bits: forward and input gradient compute each image alone, the weight gradient each (output
 * channels, input channel) task over two fixed halves of the images, each half in (image, pixel)
 * order, the halves added in order: nothing depends on the thread count (the vector width
 * does: the AVX2 kernels sum the weight gradient in 8 lanes, the AVX-512 ones in 16).
 * TANDEM_CONV=im2col turns the path off (benchmarks compare the two).
 *
 * The 3x3 and 5x5 stride-1 "same" shapes with 8 channels or more run Winograd instead (conv_winograd_impl.h,
 * included below, in the same table; kernels_conv_direct.c chooses).
 *
 * With CONV_DIRECT_EMULATE defined, the vectors are arrays of VL floats and every operation a
 * loop: tests/unit/test_conv_emulated.c runs the 16-wide kernels' logic on any machine (what an
 * AVX2 machine cannot run of the AVX-512 build). */
#if !defined(CONV_DIRECT_EMULATE)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "tandem/core.h"
#include "tandem/kernels.h"
#include "tensor/conv_direct.h"
#include "tensor/fastmath.h"

/* The kernels are written once over a vector of VL floats: AVX-512 (32 registers of 16) or
 * AVX2 with FMA (16 registers of 8). The register tiles differ because the register files do:
 * the forward's OB output channels x PB vectors of pixels, the weight gradient's DB x DT below. */
#if defined(CONV_DIRECT_EMULATE)
#define VL CONV_DIRECT_VL
#define OB (VL == 16 ? 8 : 4)
typedef struct {
  float f[VL];
} vf;
static inline vf v_load(const float *p) {
  vf v;
  memcpy(v.f, p, sizeof v.f);
  return v;
}
static inline void v_store(float *p, vf v) { memcpy(p, v.f, sizeof v.f); }
static inline vf v_fma(vf a, vf b, vf c) {
  for (int i = 0; i < VL; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
  return c;
}
static inline vf v_set1(float x) {
  vf v;
  for (int i = 0; i < VL; i++) v.f[i] = x;
  return v;
}
static inline vf v_zero(void) { return v_set1(0.0f); }
static inline vf v_add(vf a, vf b) {
  for (int i = 0; i < VL; i++) a.f[i] += b.f[i];
  return a;
}
static inline float v_sum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < VL; i++) s += v.f[i];
  return s;
}
#define V_PIN(x) ((void)0)
#define DIRECT_ISA "emulated"
#elif CONV_DIRECT_VL == 16
#define VL 16
#define OB 8 /* output channels per forward tile: 8 x 3 accumulators + 3 pixel vectors + 1 weight */
typedef __m512 vf;
#define v_load _mm512_loadu_ps
#define v_store _mm512_storeu_ps
#define v_fma _mm512_fmadd_ps
#define v_set1 _mm512_set1_ps
#define v_zero _mm512_setzero_ps
#define v_add _mm512_add_ps
static inline float v_sum(vf v) { return _mm512_reduce_add_ps(v); }
#define DIRECT_ISA "avx512"
#elif CONV_DIRECT_VL == 8
#define VL 8
#define OB 4 /* 4 x 3 accumulators + 3 pixel vectors + 1 weight: the 16 ymm registers */
typedef __m256 vf;
#define v_load _mm256_loadu_ps
#define v_store _mm256_storeu_ps
#define v_fma _mm256_fmadd_ps
#define v_set1 _mm256_set1_ps
#define v_zero _mm256_setzero_ps
#define v_add _mm256_add_ps
static inline float v_sum(vf v) { /* a fixed order: lanes i and i + 4, then pairs, then the two */
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
#define DIRECT_ISA "avx2"
#else
#error "CONV_DIRECT_VL must be 8 or 16"
#endif
#ifndef V_PIN /* keeps a loaded vector in a register: GCC would fold its load into each FMA */
#define V_PIN(x) __asm__("" : "+v"(x))
#endif
#define PB 3        /* pixel vectors per forward tile */
#define DW_GROUPS 2 /* image halves of the weight gradient (dw_range) */

typedef struct {
  int64_t N, Ci, Co, H, W, K, KK, p, S, OH, OW;
  int64_t Wp;  /* the padded plane's width */
  int64_t Wg;  /* the output grid's width: Wp, or for stride 2 a phase plane's, ceil(Wp / 2) */
  int64_t Lq;  /* output pixels on the grid, whole vectors */
  int64_t Lsp; /* one (phase) plane of an input channel */
  int64_t Ls;  /* an input channel: S*S phase planes */
  int64_t Hg;  /* stride 2: a phase plane's rows */
  int64_t Lqp; /* stride 2: a phase plane's pixels, whole vectors (the input gradient's grid, s2dx_range) */
  int64_t Lsd; /* stride 2: a plane of the output gradient shifted by one row and column (Wg wide) */
  int64_t off[25];
} geo;

static int64_t up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Stride 2 reads the padded input through its four phase planes (even / odd rows x even / odd
 * columns): tap (ky, kx) of output (oy, ox) is padded pixel (2 oy + ky, 2 ox + kx), which is
 * pixel (oy + ky / 2, ox + kx / 2) of phase plane (ky % 2, kx % 2): again a constant shift. */
static void geo_of(const tdm_conv_shape *s, geo *g) {
  g->N = s->N, g->Ci = s->Ci, g->Co = s->Co, g->H = s->H, g->W = s->W, g->K = s->KH, g->KK = s->KH * s->KH;
  g->p = s->pad, g->S = s->stride, g->OH = s->OH, g->OW = s->OW, g->Wp = s->W + 2 * s->pad;
  int64_t Hp = s->H + 2 * s->pad, Hg = (Hp + g->S - 1) / g->S, r = (g->K - 1) / g->S;
  g->Wg = (g->Wp + g->S - 1) / g->S;
  g->Lq = up(g->OH * g->Wg, VL);
  int64_t need = g->Lq + r * g->Wg + r; /* past the last shifted load */
  if (need < Hg * g->Wg) need = Hg * g->Wg;
  g->Lsp = up(need, VL);
  g->Ls = g->S * g->S * g->Lsp;
  g->Hg = Hg, g->Lqp = up(Hg * g->Wg, VL);
  need = g->Lqp + g->Wg + 1; /* past the last shifted load */
  g->Lsd = up(need > (Hg + 1) * g->Wg ? need : (Hg + 1) * g->Wg, VL);
  for (int64_t t = 0; t < g->KK; t++) {
    int64_t ky = t / g->K, kx = t % g->K;
    g->off[t] = ((ky % g->S) * g->S + kx % g->S) * g->Lsp + (ky / g->S) * g->Wg + kx / g->S;
  }
}

/* The weight gradient's register tile: DB output channels x DT taps (accumulators), DT dividing
 * K x K. AVX-512: 2 x 9 (3x3) or 4 x 5 (5x5); AVX2's 16 registers: 3 x 3 or 2 x 5. */
#if VL == 16
static int64_t dw_ob(const geo *g) { return g->K == 3 ? 2 : 4; }
static int64_t dw_taps(const geo *g) { return g->K == 3 ? 9 : 5; }
#else
static int64_t dw_ob(const geo *g) { return g->K == 3 ? 3 : 2; }
static int64_t dw_taps(const geo *g) { return g->K == 3 ? 3 : 5; }
#endif

typedef struct {
  int64_t xpad, opg, wp, total; /* offsets (floats) into the forward's workspace */
} fwd_layout;
typedef struct {
  int64_t xpad, dpad, dxpg, wp, st, total;
} bwd_layout;

static fwd_layout fwd_of(const geo *g) {
  fwd_layout l;
  l.xpad = 0;
  l.opg = l.xpad + g->N * g->Ci * g->Ls;
  l.wp = l.opg + g->N * up(g->Co, OB) * g->Lq;
  l.total = l.wp + up(g->Co, OB) * g->Ci * g->KK;
  return l;
}

static bwd_layout bwd_of(const geo *g) {
  bwd_layout l;
  int64_t cor = up(g->Co, dw_ob(g)), tasks = cor / dw_ob(g) * g->Ci * (g->KK / dw_taps(g));
  l.xpad = 0;
  l.dpad = l.xpad + g->N * g->Ci * g->Ls;
  /* dpad: the output gradient padded (stride 1) or on its grid (stride 2, the weight gradient),
   * or shifted (stride 2, the input gradient); dxpg: the input gradient on the padded grid (stride
   * 1) or on a phase plane (stride 2) */
  int64_t dp = cor * g->Ls > g->Co * g->Lsd ? cor * g->Ls : g->Co * g->Lsd, dq = g->Lq > g->Lqp ? g->Lq : g->Lqp;
  l.dxpg = l.dpad + g->N * dp;
  l.wp = l.dxpg + g->N * up(g->Ci, OB) * dq;
  l.st = l.wp + up(g->Ci, OB) * g->Co * g->KK;
  l.total = l.st + DW_GROUPS * tasks * dw_ob(g) * dw_taps(g) * VL;
  return l;
}

/* ---- padding ---------------------------------------------------------------------------- */

typedef struct {
  const geo *g;
  float *dst;       /* planes of Ls floats */
  const float *src; /* planes of H*W floats */
  int64_t C, Cd;    /* channels per image in src, and in dst (extra planes are zeros) */
} pad_ctx;

static void pad_range(void *vc, int64_t a, int64_t b) {
  pad_ctx *c = vc;
  const geo *g = c->g;
  for (int64_t i = a; i < b; i++) { /* i: image x dst channel */
    int64_t n = i / c->Cd, ch = i % c->Cd;
    float *d = c->dst + i * g->Ls;
    if (ch >= c->C) {
      memset(d, 0, sizeof(float) * (size_t)g->Ls);
      continue;
    }
    const float *s = c->src + (n * c->C + ch) * g->H * g->W;
    memset(d, 0, sizeof(float) * (size_t)(g->p * g->Wp));
    for (int64_t y = 0; y < g->H; y++) {
      float *row = d + (y + g->p) * g->Wp;
      for (int64_t x = 0; x < g->p; x++) row[x] = 0.0f, row[g->p + g->W + x] = 0.0f;
      memcpy(row + g->p, s + y * g->W, sizeof(float) * (size_t)g->W);
    }
    memset(d + (g->H + g->p) * g->Wp, 0, sizeof(float) * (size_t)(g->Ls - (g->H + g->p) * g->Wp));
  }
}

/* Stride 2: each channel's padded pixels scattered into its four phase planes. A row's pixels
 * go to two planes, by the parity of their padded column: as two loops of stride-2 reads, which
 * the compiler vectorises (one loop working out each pixel's plane and place ran scalar, 1.5% of
 * a resnet20 step). */
static void phase_range(void *vc, int64_t a, int64_t b) {
  pad_ctx *c = vc;
  const geo *g = c->g;
  int64_t p = g->p, W = g->W;
  for (int64_t i = a; i < b; i++) {
    float *d = c->dst + i * g->Ls;
    memset(d, 0, sizeof(float) * (size_t)g->Ls);
    const float *s = c->src + i * g->H * W;
    for (int64_t y = 0; y < g->H; y++) {
      int64_t r = y + p;
      const float *restrict row = s + y * W;
      /* padded column x + p: parity q goes to plane (r & 1, q) at column (x + p) >> 1 */
      float *restrict to[2] = {d + (r & 1) * 2 * g->Lsp + (r >> 1) * g->Wg, d + ((r & 1) * 2 + 1) * g->Lsp + (r >> 1) * g->Wg};
      float *restrict e = to[p & 1], *restrict o = to[(p + 1) & 1]; /* x even: column parity p's; x odd: the other */
      int64_t e0 = p >> 1, o0 = (p + 1) >> 1;
      for (int64_t j = 0; 2 * j < W; j++) e[e0 + j] = row[2 * j];
      for (int64_t j = 0; 2 * j + 1 < W; j++) o[o0 + j] = row[2 * j + 1];
    }
  }
}

static void pad_planes(const geo *g, float *dst, const float *src, int64_t C, int64_t Cd) {
  pad_ctx c = {g, dst, src, C, Cd};
  tdm_parallel_for(g->N * Cd, 4, g->S == 1 ? pad_range : phase_range, &c);
}

/* Stride 2's output gradient on the output grid (rows of Wg, zeros past OW and past the rows),
 * for the weight gradient: Cd planes of Lq floats per image, those past C zeros. */
static void grid_range(void *vc, int64_t a, int64_t b) {
  pad_ctx *c = vc;
  const geo *g = c->g;
  for (int64_t i = a; i < b; i++) {
    int64_t n = i / c->Cd, ch = i % c->Cd;
    float *d = c->dst + i * g->Lq;
    memset(d, 0, sizeof(float) * (size_t)g->Lq);
    if (ch >= c->C) continue;
    const float *s = c->src + (n * c->C + ch) * g->OH * g->OW;
    for (int64_t y = 0; y < g->OH; y++) memcpy(d + y * g->Wg, s + y * g->OW, sizeof(float) * (size_t)g->OW);
  }
}

/* ---- the convolution on the padded grid (forward and input gradient) --------------------- */

/* out[c][qs[j] .. qs[j] + VL) for OB channels and P vectors j, over I input planes of the image,
 * from packed weights wp[i][t][OB]. P is a constant at each call, so acc lives in registers. */
static inline __attribute__((always_inline)) void conv_tile(int P, float *out, int64_t Lq, const float *in, int64_t I,
                                                            int64_t Ls, const float *wp, const geo *g, const int64_t *qs) {
  vf acc[OB][PB];
  for (int c = 0; c < OB; c++)
    for (int j = 0; j < PB; j++) acc[c][j] = v_zero();
  for (int64_t i = 0; i < I; i++) {
    const float *src = in + i * Ls, *w = wp + i * g->KK * OB;
    for (int64_t t = 0; t < g->KK; t++, w += OB) {
      const float *s = src + g->off[t];
      vf v[PB];
      for (int j = 0; j < P; j++) v[j] = v_load(s + qs[j]);
      for (int c = 0; c < OB; c++) {
        vf b = v_set1(w[c]);
        for (int j = 0; j < P; j++) acc[c][j] = v_fma(b, v[j], acc[c][j]);
      }
    }
  }
  for (int c = 0; c < OB; c++)
    for (int j = 0; j < P; j++) v_store(out + c * Lq + qs[j], acc[c][j]);
}

typedef struct {
  const geo *g;
  float *out;       /* (N, Or, Lq) */
  const float *in;  /* (N, Istride planes of Ls) */
  const float *wp;  /* (Or / OB, I, KK, OB) */
  int64_t I, Istride, Or;
} conv_ctx;

/* Whether the output's rows, each in whole vectors from its first column, take fewer vectors
 * than the grid (its rows Wg wide, the padding columns included) by an eighth or more: where
 * the padding is a large share of a short row (5x5 at 14x14: 18 columns for 14, 28 vectors
 * against 32). The last vector of a row must end inside the grid (its loads, too, then stay in
 * the plane). Only the positions computed change, not any output's sum: the same bits. */
static int rows_pay(const geo *g) {
  int64_t per = (g->OW + VL - 1) / VL, rows = g->OH * per;
  return g->S == 1 && (g->OH - 1) * g->Wg + per * VL <= g->Lq && 8 * rows <= 7 * (g->Lq / VL);
}

static void conv_range(void *vc, int64_t a, int64_t b) {
  conv_ctx *c = vc;
  const geo *g = c->g;
  int64_t nob = c->Or / OB, wstride = c->I * g->KK * OB, grid[PB];
  for (int j = 0; j < PB; j++) grid[j] = VL * j;
  int rows = rows_pay(g);
  int64_t per = (g->OW + VL - 1) / VL, nv = rows ? g->OH * per : g->Lq / VL; /* vectors */
  for (int64_t n = a; n < b; n++) {
    float *out = c->out + n * c->Or * g->Lq;
    const float *in = c->in + n * c->Istride * g->Ls;
    /* the output-channel blocks innermost: the input rows a tile reads stay in L1 for all of them
     * (outermost, each block streamed the image's planes from L2 again); the last one or two
     * vectors in one tile (alone, each would wait on its FMAs' latency) */
    for (int64_t v = 0; v < nv; v += PB) {
      int P = nv - v < PB ? (int)(nv - v) : PB;
      int64_t qs[PB], q0 = rows ? 0 : v * VL;
      for (int j = 0; j < P; j++) qs[j] = rows ? (v + j) / per * g->Wg + (v + j) % per * VL : grid[j];
      for (int64_t ob = 0; ob < nob; ob++) {
        float *o = out + ob * OB * g->Lq + q0;
        const float *w = c->wp + ob * wstride;
        if (P == PB) conv_tile(PB, o, g->Lq, in + q0, c->I, g->Ls, w, g, qs);
        else if (P == 2) conv_tile(2, o, g->Lq, in + q0, c->I, g->Ls, w, g, qs);
        else conv_tile(1, o, g->Lq, in + q0, c->I, g->Ls, w, g, qs);
      }
    }
  }
}

/* ---- copies out of the padded grid ---------------------------------------------------------- */

typedef struct {
  const geo *g;
  float *dst;       /* (N, C, H, W) */
  const float *src; /* (N, Cs, Lq) */
  const float *bias;
  int64_t C, Cs, add;
} unpad_ctx;

static void unpad_range(void *vc, int64_t a, int64_t b) {
  unpad_ctx *c = vc;
  const geo *g = c->g;
  for (int64_t i = a; i < b; i++) {
    int64_t n = i / c->C, ch = i % c->C;
    float *d = c->dst + i * g->OH * g->OW, bv = c->bias ? c->bias[ch] : 0.0f;
    const float *s = c->src + (n * c->Cs + ch) * g->Lq;
    for (int64_t y = 0; y < g->OH; y++) { /* (stride 1: OH, OW, Wg are H, W, Wp) */
      float *restrict dr = d + y * g->OW;
      const float *restrict sr = s + y * g->Wg;
      if (c->add)
        for (int64_t x = 0; x < g->OW; x++) dr[x] += sr[x];
      else
        for (int64_t x = 0; x < g->OW; x++) dr[x] = sr[x] + bv;
    }
  }
}

/* ---- one image at a time: pad, convolve, copy out ------------------------------------------- */

/* Each image's planes are padded, convolved and copied out before the next image's: its padded
 * input and output grid (tens of KiB) stay in the core's cache between the three steps, where
 * three passes over the batch (megabytes each) went to memory and back twice; two threads share
 * that bandwidth. The same arithmetic in the same order: the bits are the three passes'. */
typedef struct {
  pad_ctx pad;    /* Cd planes per image */
  conv_ctx conv;
  unpad_ctx out;  /* C planes per image */
} image_ctx;

static void image_range(void *vc, int64_t a, int64_t b) {
  image_ctx *c = vc;
  for (int64_t n = a; n < b; n++) {
    if (c->pad.g->S == 1) pad_range(&c->pad, n * c->pad.Cd, (n + 1) * c->pad.Cd);
    else phase_range(&c->pad, n * c->pad.Cd, (n + 1) * c->pad.Cd);
    conv_range(&c->conv, n, n + 1);
    unpad_range(&c->out, n * c->out.C, (n + 1) * c->out.C);
  }
}

/* ---- the strided input gradient ------------------------------------------------------------ */

/* Stride 2's input gradient, dx[ci][iy][ix] = sum over co, ky, kx of w[co][ci][ky][kx] dout[co][oy][ox]
 * where iy + p = 2 oy + ky (and so for the columns), is four stride-1 convolutions, one per
 * phase of the padded input: a padded row R = 2 a + ry takes the taps ky of R's parity, ky = ry
 * or ry + 2 (K = 3: one tap for odd rows, two for even), from output rows oy = a + (ry - ky) / 2,
 * that is a or a - 1. With the output gradient shifted one row and column down and right (dsh,
 * Wg wide, a zero first row and column), those are rows a + 1 and a of dsh: constant offsets,
 * so each phase is the forward's register-tiled convolution (conv_tile) over a phase plane's grid
 * (Hg x Wg), with its own taps and weights, then copied into dx's pixels of that phase. The last
 * column's shifted load wraps into the next row's first, dsh's zero column, where the true
 * neighbour lies past the output's last column (OW <= Wg - 1): a zero either way.
 * Each dx value is one phase's sum, in the order of conv_tile (input channel, then tap): the bits
 * are the shape's, whatever the thread count. (It replaced im2col, a GEMM, zeroing dx, and
 * col2im's strided adds: 1.15-1.45x on this gradient, build/bench/conv_kernels.) */
typedef struct {
  const geo *g;
  geo ph[4];         /* phase 2 ry + rx: g with its taps (KK, off), its grid (Lq = Lqp) and dsh's planes (Ls = Lsd) */
  const float *wp[4];
  const float *dout; /* (N, Co, OH, OW) */
  float *dsh;        /* (N, Co, Lsd) */
  float *grid;       /* (N, Ir, Lqp) */
  float *dx;         /* (N, Ci, H, W) */
  int64_t Ir;
  int add;
} s2dx_ctx;

static void s2dx_phases(s2dx_ctx *c, const float *w, float *wp) {
  const geo *g = c->g;
  for (int ph = 0; ph < 4; ph++) {
    int ry = ph / 2, rx = ph % 2;
    geo *q = &c->ph[ph];
    *q = *g;
    q->KK = 0, q->Lq = g->Lqp, q->Ls = g->Lsd;
    int64_t ky[25], kx[25];
    for (int64_t a = ry; a < g->K; a += 2)
      for (int64_t b = rx; b < g->K; b += 2) {
        ky[q->KK] = a, kx[q->KK] = b;
        q->off[q->KK++] = (1 + (ry - a) / 2) * g->Wg + (1 + (rx - b) / 2);
      }
    /* wp[ib][co][t][c] = w[co][ib OB + c][ky_t][kx_t] (zeros past Ci) */
    for (int64_t ib = 0; ib < c->Ir / OB; ib++)
      for (int64_t co = 0; co < g->Co; co++)
        for (int64_t t = 0; t < q->KK; t++)
          for (int64_t k = 0; k < OB; k++) {
            int64_t ci = ib * OB + k;
            wp[((ib * g->Co + co) * q->KK + t) * OB + k] = ci < g->Ci ? w[(co * g->Ci + ci) * g->KK + ky[t] * g->K + kx[t]] : 0.0f;
          }
    c->wp[ph] = wp;
    wp += c->Ir * g->Co * q->KK;
  }
}

static void s2dx_range(void *vc, int64_t a, int64_t b) {
  s2dx_ctx *c = vc;
  const geo *g = c->g;
  for (int64_t n = a; n < b; n++) {
    for (int64_t co = 0; co < g->Co; co++) { /* dsh: row oy + 1, column ox + 1 = dout (oy, ox) */
      float *d = c->dsh + (n * g->Co + co) * g->Lsd;
      const float *s = c->dout + (n * g->Co + co) * g->OH * g->OW;
      memset(d, 0, sizeof(float) * (size_t)g->Lsd);
      for (int64_t oy = 0; oy < g->OH; oy++) memcpy(d + (oy + 1) * g->Wg + 1, s + oy * g->OW, sizeof(float) * (size_t)g->OW);
    }
    for (int ph = 0; ph < 4; ph++) {
      int ry = ph / 2, rx = ph % 2;
      conv_ctx cc = {&c->ph[ph], c->grid, c->dsh, c->wp[ph], g->Co, g->Co, c->Ir};
      conv_range(&cc, n, n + 1);
      /* phase pixel (a, b) is padded (2 a + ry, 2 b + rx): input (2 a + ry - p, 2 b + rx - p) */
      int64_t b0 = (g->p - rx + 1) / 2, b1 = (g->W - 1 + g->p - rx) / 2 + 1; /* the columns inside */
      for (int64_t ci = 0; ci < g->Ci; ci++) {
        const float *src = c->grid + (n * c->Ir + ci) * g->Lqp;
        float *img = c->dx + (n * g->Ci + ci) * g->H * g->W;
        for (int64_t r = 0; r < g->Hg; r++) {
          int64_t iy = 2 * r + ry - g->p;
          if (iy < 0 || iy >= g->H) continue;
          const float *sr = src + r * g->Wg;
          float *dr = img + iy * g->W + rx - g->p; /* column of b = 0 */
          if (c->add)
            for (int64_t q = b0; q < b1; q++) dr[2 * q] += sr[q];
          else
            for (int64_t q = b0; q < b1; q++) dr[2 * q] = sr[q];
        }
      }
    }
  }
}

/* ---- the weight gradient ------------------------------------------------------------------ */

typedef struct {
  const geo *g;
  const float *xpad;        /* (N, Ci, Ls) */
  const float *d0;          /* image 0's first output-gradient plane, at pixel (0, 0) */
  int64_t dchan;            /* from one output-gradient plane to the next (dpad: Ls; grid: Lq) */
  float *st;                /* per image group and task: DB x DT x VL partial sums */
  float *dw;
  int64_t Cor, nb, tasks;   /* dpad's channels per image; images per cache-sized chunk; tasks */
} dw_ctx;

static inline __attribute__((always_inline)) void dw_task(int DB, int DT, const dw_ctx *c, int64_t unit, int64_t n0,
                                                          int64_t n1) {
  const geo *g = c->g;
  int64_t task = unit % c->tasks;
  int64_t groups = g->KK / DT, ci = (task / groups) % g->Ci, cb = task / (groups * g->Ci), t0 = task % groups * DT;
  float *st = c->st + unit * DB * DT * VL;
  vf acc[4][9];
  for (int o = 0; o < DB; o++)
    for (int t = 0; t < DT; t++) acc[o][t] = v_load(st + (o * DT + t) * VL);
  for (int64_t n = n0; n < n1; n++) {
    const float *x = c->xpad + (n * g->Ci + ci) * g->Ls, *d = c->d0 + (n * c->Cor + cb * DB) * c->dchan;
    for (int64_t q = 0; q < g->Lq; q += VL) {
      vf dv[4];
      for (int o = 0; o < DB; o++) {
        dv[o] = v_load(d + o * c->dchan + q);
        V_PIN(dv[o]); /* in a register: GCC would fold its load into each of DT FMAs */
      }
      for (int t = 0; t < DT; t++) {
        vf xv = v_load(x + g->off[t0 + t] + q);
        V_PIN(xv); /* one load for the DB products (GCC would fold it into each FMA) */
        for (int o = 0; o < DB; o++) acc[o][t] = v_fma(dv[o], xv, acc[o][t]);
      }
    }
  }
  for (int o = 0; o < DB; o++)
    for (int t = 0; t < DT; t++) v_store(st + (o * DT + t) * VL, acc[o][t]);
}

/* The images are cut into DW_GROUPS halves whatever the thread count (so the sums' order is the
 * shape's alone), each with its own partial sums: a unit is (half, task), and two threads take
 * a half each and never read the same planes. (Split by task instead, both threads streamed
 * every input plane: the weight gradient ran 1.15x faster on 2 threads than on 1.) */

static void dw_range(void *vc, int64_t a, int64_t b) {
  dw_ctx *c = vc;
  const geo *g = c->g;
  for (int64_t u0 = a; u0 < b;) { /* the units of one half at a time */
    int64_t half = u0 / c->tasks, u1 = (half + 1) * c->tasks < b ? (half + 1) * c->tasks : b;
    int64_t lo = g->N * half / DW_GROUPS, hi = g->N * (half + 1) / DW_GROUPS;
    /* chunks of images outermost: a chunk's planes stay in cache while every task of the range
     * passes over them; each task's partial sums wait in st between chunks */
    for (int64_t n0 = lo; n0 < hi; n0 += c->nb) {
      int64_t n1 = n0 + c->nb < hi ? n0 + c->nb : hi;
      for (int64_t u = u0; u < u1; u++) {
#if VL == 16
        if (g->K == 3) dw_task(2, 9, c, u, n0, n1);
        else dw_task(4, 5, c, u, n0, n1);
#else
        if (g->K == 3) dw_task(3, 3, c, u, n0, n1);
        else dw_task(2, 5, c, u, n0, n1);
#endif
      }
    }
    u0 = u1;
  }
}

/* dw += the halves' partial sums, added lane by lane in half order, then across the lanes. */
static void dw_reduce(void *vc, int64_t a, int64_t b) {
  dw_ctx *c = vc;
  const geo *g = c->g;
  int64_t DB = dw_ob(g), DT = dw_taps(g), groups = g->KK / DT, per = DB * DT * VL;
  for (int64_t task = a; task < b; task++) {
    int64_t ci = (task / groups) % g->Ci, cb = task / (groups * g->Ci), t0 = task % groups * DT;
    for (int64_t o = 0; o < DB; o++) {
      int64_t co = cb * DB + o;
      if (co >= g->Co) break;
      for (int64_t t = 0; t < DT; t++) {
        vf v = v_load(c->st + task * per + (o * DT + t) * VL);
        for (int h = 1; h < DW_GROUPS; h++) v = v_add(v, v_load(c->st + (h * c->tasks + task) * per + (o * DT + t) * VL));
        c->dw[(co * g->Ci + ci) * g->KK + t0 + t] += v_sum(v);
      }
    }
  }
}

/* ---- the entry points --------------------------------------------------------------------- */

static float *aligned(float *ws) { return (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63); }

#include "tensor/conv_winograd_impl.h"

static int64_t ws_floats(const tdm_conv_shape *s) {
  geo g;
  geo_of(s, &g);
  int64_t f = fwd_of(&g).total, b = bwd_of(&g).total, w = wino_ws_floats(s);
  f = (f > b ? f : b) + 16; /* + alignment */
  return f > w ? f : w;
}

static void fwd(float *out, const float *x, const float *w, const float *b, float *ws, const tdm_conv_shape *s) {
  geo g;
  geo_of(s, &g);
  fwd_layout l = fwd_of(&g);
  ws = aligned(ws);
  float *xpad = ws + l.xpad, *opg = ws + l.opg, *wp = ws + l.wp;
  int64_t Or = up(g.Co, OB);
  for (int64_t ob = 0; ob < Or / OB; ob++) /* wp[ob][ci][t][c] = w[ob OB + c][ci][t] */
    for (int64_t ci = 0; ci < g.Ci; ci++)
      for (int64_t t = 0; t < g.KK; t++)
        for (int64_t c = 0; c < OB; c++) {
          int64_t co = ob * OB + c;
          wp[((ob * g.Ci + ci) * g.KK + t) * OB + c] = co < g.Co ? w[(co * g.Ci + ci) * g.KK + t] : 0.0f;
        }
  image_ctx c = {{&g, xpad, x, g.Ci, g.Ci}, {&g, opg, xpad, wp, g.Ci, g.Ci, Or}, {&g, out, opg, b, g.Co, Or, 0}};
  tdm_parallel_for(g.N, 1, image_range, &c);
}

typedef struct {
  const float *dout;
  float *db;
  int64_t N, Co, P;
} db_ctx;

static void db_range(void *vc, int64_t a, int64_t b) {
  db_ctx *c = vc;
  for (int64_t co = a; co < b; co++) {
    float acc = 0.0f; /* each plane in 8 lanes (one dependent chain of adds took 4% of a CNN step) */
    for (int64_t n = 0; n < c->N; n++) acc += tdm__sum8(c->dout + (n * c->Co + co) * c->P, c->P);
    c->db[co] += acc;
  }
}

static void bwd(float *dx, int dx_set, float *dw, float *db, const float *dout, const float *x, const float *w,
                float *ws, const tdm_conv_shape *s) {
  geo g;
  geo_of(s, &g);
  bwd_layout l = bwd_of(&g);
  ws = aligned(ws);
  int64_t DB = dw_ob(&g), Cor = up(g.Co, DB);
  float *xpad = ws + l.xpad, *dpad = ws + l.dpad;
  if (db) {
    db_ctx c = {dout, db, g.N, g.Co, g.OH * g.OW};
    tdm_parallel_for(g.Co, 1, db_range, &c);
  }
  /* stride 1: dout padded (the input's geometry) for dx and dw; with dx, in its per-image pass */
  if (g.S == 1 && dw && !dx) pad_planes(&g, dpad, dout, g.Co, Cor);
  if (dx && g.S != 1) {
    s2dx_ctx c = {.g = &g, .dout = dout, .dsh = dpad, .grid = ws + l.dxpg, .dx = dx, .Ir = up(g.Ci, OB), .add = !dx_set};
    s2dx_phases(&c, w, ws + l.wp);
    tdm_parallel_for(g.N, 1, s2dx_range, &c);
  }
  if (dx && g.S == 1) { /* dx = the convolution of dout with w flipped and transposed: wp[ib][co][t][c] = w[co][ib OB + c][KK-1-t] */
    float *dxpg = ws + l.dxpg, *wp = ws + l.wp;
    int64_t Ir = up(g.Ci, OB);
    for (int64_t ib = 0; ib < Ir / OB; ib++)
      for (int64_t co = 0; co < g.Co; co++)
        for (int64_t t = 0; t < g.KK; t++)
          for (int64_t c = 0; c < OB; c++) {
            int64_t ci = ib * OB + c;
            wp[((ib * g.Co + co) * g.KK + t) * OB + c] = ci < g.Ci ? w[(co * g.Ci + ci) * g.KK + g.KK - 1 - t] : 0.0f;
          }
    image_ctx c = {{&g, dpad, dout, g.Co, Cor}, {&g, dxpg, dpad, wp, g.Co, Cor, Ir}, {&g, dx, dxpg, NULL, g.Ci, Ir, !dx_set}};
    tdm_parallel_for(g.N, 1, image_range, &c);
  }
  if (dw) {
    pad_planes(&g, xpad, x, g.Ci, g.Ci);
    const float *d0 = dpad + g.p * g.Wp + g.p; /* stride 1: dout (0, 0) in its padded plane */
    int64_t dchan = g.Ls;
    if (g.S != 1) { /* stride 2: dout on the output grid, in dpad's room */
      pad_ctx pc = {&g, dpad, dout, g.Co, Cor};
      tdm_parallel_for(g.N * Cor, 4, grid_range, &pc);
      d0 = dpad, dchan = g.Lq;
    }
    int64_t DT = dw_taps(&g), tasks = Cor / DB * g.Ci * (g.KK / DT);
    memset(ws + l.st, 0, sizeof(float) * (size_t)(DW_GROUPS * tasks * DB * DT * VL));
    int64_t per_image = (g.Ci * g.Ls + Cor * dchan) * (int64_t)sizeof(float), nb = ((int64_t)384 << 10) / per_image;
    /* (the grid whole: over the output's rows alone, 2 vectors a row at 14x14, it ran 10-20% slower) */
    dw_ctx c = {&g, xpad, d0, dchan, ws + l.st, dw, Cor, nb < 1 ? 1 : nb, tasks};
    tdm_parallel_for(DW_GROUPS * tasks, 1, dw_range, &c);
    tdm_parallel_for(tasks, 16, dw_reduce, &c);
  }
}

static const tdm__conv_direct_impl CONV_DIRECT_TABLE = {DIRECT_ISA, ws_floats, fwd, bwd, wino_fits, wino_fwd, wino_dx, wino_dw};
