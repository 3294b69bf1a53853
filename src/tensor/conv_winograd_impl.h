/* Winograd F(2x2, 3x3) for the 3x3, stride 1, pad 1 convolutions (resnet20's 3x3 ones but its
 * first and its two strided ones), and F(2x2, 5x5) for the 5x5, pad 2 ones (the small CNN's
 * second): the forward, the input gradient (the same convolution of the output gradient with the
 * weights flipped and transposed) and the weight gradient (below, "the weight gradient").
 * Included by conv_direct_impl.h, whose vector macros (VL, vf, v_*) and register tile (OB output
 * channels x PB vectors) it uses.
 *
 * What follows is written for F(2x2, 3x3); F(2x2, 5x5) is the same with a 6x6 input patch and 36
 * points (g->n, g->P): 36 products per input channel for 4 outputs where the direct kernel does
 * 100 (2.78x fewer), its padded rows split the same way (a patch's six columns are even k, odd k,
 * ..., odd k + 2), only the transforms (wino_g, wino_bt5, wino_at5, wino_a5, wino_gt5) its own.
 * Its points are 0, 1, -1, 2, -2 and infinity: over 20,000 random 6x6 patches and 5x5 filters of
 * N(0, 1) values, fp32 gave a mean error of 2.5e-6 (max 6e-5) against float64, where 0, +-1, +-1/2
 * gave 2.8e-6 (9e-5).
 *
 * A 2x2 block of outputs is Y = A' [ (G g G') * (B' d B) ] A over its 4x4 input patch d: the 16
 * products per input channel replace the direct kernel's 36 multiplies (2.25x fewer), and the
 * transforms are adds. In the transformed domain the products over input channels are 16
 * independent products, one per point xi of the 4x4 grid:
 *     M[xi][co][t] = sum over ci of U[xi][co][ci] V[xi][ci][t],   t a 2x2 tile of outputs,
 * which run in the forward's register tile (OB channels x PB vectors of tiles, the input
 * channel the reduction). Tiles are vectorised along a tile row: each padded input row is split
 * into its even and odd columns once, so the four columns of VL consecutive tiles' patches are
 * four contiguous loads (even k, odd k, even k + 1, odd k + 1).
 *
 * Work goes in blocks: G images making about 64 tiles (so the late layers' 4x4 tile grids still
 * fill vectors), one image, or a band of the tile rows of one beyond 1024 tiles (so a large
 * image's transformed data stays bounded); a block transforms its input (V: 16 x Ci x Tb floats),
 * computes M point by point for a chunk of output channels at a time and transforms it back into
 * the output rows. Each thread takes blocks one at a time into scratch of its own (wino_range).
 *
 * Bits: each output of the forward and input gradient depends on its own patch and the weights
 * only, in a fixed order (the sum over input channels in order, then the transform): not on the
 * block, the slot, the thread count or the batch split. They differ from the direct kernel's (the transforms round), within
 * the tolerance of the reference tests (tests/unit/test_resnet.c). */

#define WINO_SLOTS 16    /* scratch slots: threads at work at once (threads beyond it idle); the weight gradient's partial sums */
#define WINO_TILES 64 /* tile slots a block of small images aims at */
#ifndef WINO_TILES4
#define WINO_TILES4 32 /* the same for F(4x4, 3x3) */
#endif
#ifndef WINO_BAND
#define WINO_BAND 1024 /* tiles of an image beyond which a block is a band of its tile rows */
#endif
#ifndef WINO_M_FLOATS
#define WINO_M_FLOATS (24 << 10) /* M's chunk: 96 KiB */
#endif

typedef struct {
  int r, tm, n, P, pad;  /* the kernel's size (3 or 5), a tile's outputs a side (2 or 4), its input size tm + r - 1,
                          * its points n^2, the padding */
  int64_t N, I, O, H, W; /* images, input and output channels, size (the output's too) */
  int64_t TH, TW, Timg;  /* tile rows and columns per image, their product */
  int64_t RW;            /* one phase (the columns j with j % tm the same) of a split padded row */
  int64_t Hp, Lpl;       /* padded rows; floats per split plane */
  int64_t G, R, nband;   /* a block: G images, or (G = 1) a band of R tile rows of one; bands per image */
  int64_t Tr, Tb, nblk;  /* slots per image (or band) in a block, per block (whole vectors); blocks */
  int64_t nob;           /* output-channel blocks of OB */
  int64_t CC;            /* output channels per chunk of M (a multiple of OB) */
  int64_t vp, mp;        /* floats from one point's rows to the next's: V's (I x Tb), M's (CC x Tb) */
  int64_t v, m, slot;    /* a slot's layout: the split planes (from 0), V, M; its size */
  int narrow;            /* the transforms gather and scatter a vector's slots as VL / TW tile rows (below) */
  int64_t GI;            /* images whose planes are split at once: VL / Timg where narrow and Timg < VL, else 1 */
} wgeo;

/* n floats, rounded up to an odd number of 64-byte lines: the 16 points' rows, written or read
 * side by side by the transforms, then start in 16 different cache sets. (At 7x7, 64 channels,
 * V's points were 18 KiB apart: eight of them in each of two sets of the 8-way L1.) */
static int64_t point_stride(int64_t n) {
  n = (n + 15) / 16 * 16;
  return n / 16 % 2 ? n : n + 16;
}

/* tiles: the tile slots a block aims at; G > 0 (whole images only) sets the images of a block instead */
static void wgeo_of(int r, int tm, int64_t N, int64_t I, int64_t O, int64_t H, int64_t W, int64_t tiles, int64_t G,
                    wgeo *g) {
  g->r = r, g->tm = tm, g->n = tm + r - 1, g->P = g->n * g->n, g->pad = r / 2;
  g->N = N, g->I = I, g->O = O, g->H = H, g->W = W;
  g->TH = (H + tm - 1) / tm, g->TW = (W + tm - 1) / tm, g->Timg = g->TH * g->TW;
  g->RW = up(g->TW, VL) + VL; /* loads reach k + (n - 1) / tm for k up to up(TW, VL) - 1 */
  g->Hp = tm * g->TH + r - 1;
  g->Lpl = g->Hp * tm * g->RW;
  if (g->Timg > WINO_BAND) { /* large images in bands of tile rows (a 224x224 one, whole, would
                              * need 16 x 12544 floats a channel) */
    g->G = 1, g->R = WINO_BAND / g->TW;
    if (g->R < 1) g->R = 1;
    if (g->R > g->TH) g->R = g->TH;
  } else { /* whole images, small ones several to a block (their tile grids fill few vectors);
            * bands of 64 tiles ran ResNet's 28x28 layers 1.5x slower than whole images */
    g->G = (tiles + g->Timg - 1) / g->Timg, g->R = g->TH;
    if (g->G > N) g->G = N > 0 ? N : 1;
  }
  /* Rows narrower than a vector (TW a divisor of VL: 7x7 and 14x14 images in 4x4 tiles, 7x7 in
   * 2x2 ones) left half or three quarters of each transform's lanes idle; narrow, a vector of
   * slots is VL / TW whole tile rows, of one image or (Timg < VL) of several, each row's output
   * whole vectors (tm TW a multiple of VL). Whole images only (no bands). */
  g->narrow = g->TW < VL && VL % g->TW == 0 && tm * g->TW % VL == 0 && g->R == g->TH &&
              (g->Timg % VL == 0 || VL % g->Timg == 0);
  g->GI = g->narrow && g->Timg < VL ? VL / g->Timg : 1;
  if (g->narrow) { /* a block's tiles whole register tiles of the products (PB vectors): none a
                    * vector or two (at 1/3 or 2/3 of their rate); the multiple nearest the aim
                    * (7x7 in 4x4 tiles: 24, not 48: 1.05-1.1x at one thread and two) */
    int64_t q = PB * VL, m = q;
    while (m % g->Timg) m += q; /* the least common multiple of Timg and PB VL */
    g->G = (g->G * g->Timg + m / 2) / m * m / g->Timg;
    if (g->G < m / g->Timg) g->G = m / g->Timg;
    if (g->G > N) g->G = N > 0 ? N : 1;
  }
  if (G > 0 && g->R == g->TH) g->G = G < N ? G : (N > 0 ? N : 1);
  g->nband = (g->TH + g->R - 1) / g->R;
  g->Tr = g->R * g->TW;
  /* a row's stores run up(TW, VL) slots from its start: the last one's spill fits (narrow: no spill) */
  g->Tb = g->narrow ? up(g->G * g->Tr, VL) : up(g->G * g->Tr - g->TW + up(g->TW, VL), VL);
  g->nblk = (N + g->G - 1) / g->G * g->nband;
  g->nob = up(O, OB) / OB;
  g->v = up(g->GI * g->Lpl, 16);
  g->vp = point_stride(I * g->Tb);
  g->m = g->v + g->P * g->vp;
  g->CC = WINO_M_FLOATS / (g->P * g->Tb) / OB * OB;
  if (g->CC < OB) g->CC = OB;
  if (g->CC > g->nob * OB) g->CC = g->nob * OB;
  g->mp = point_stride(g->CC * g->Tb);
  g->slot = up(g->m + g->P * g->mp, 16);
}

/* The kernel's size r (3 or 5), and a tile's outputs a side: 4 (F(4x4, 3x3)) where tile asks for
 * it and the kernel is 3x3, else 2 (F(2x2, 3x3), F(2x2, 5x5)). */
static int wino_r(const tdm_conv_shape *s) { return s->KH == 5 ? 5 : 3; }
static int wino_tm(const tdm_conv_shape *s, int tile) { return s->KH == 3 && tile == 4 ? 4 : 2; }

/* Tile slots a block aims at: F(4x4, 3x3)'s tiles are 4x the outputs, its V 2.25x the floats */
static int64_t wino_tiles(int tm) { return tm == 4 ? WINO_TILES4 : WINO_TILES; }

static int64_t wino_slots(const wgeo *g) { return g->nblk < WINO_SLOTS ? g->nblk : WINO_SLOTS; }

typedef struct {
  int64_t n0, nn, ty0, ty1; /* its images, and its tile rows of each */
} wblk;

/* Block blk's images and tile rows; tile (i, ty) of it has slot i Tr + (ty - ty0) TW. */
static wblk wblock(const wgeo *g, int64_t blk) {
  wblk b;
  int64_t band = blk % g->nband;
  b.n0 = blk / g->nband * g->G;
  b.nn = g->N - b.n0 < g->G ? g->N - b.n0 : g->G;
  b.ty0 = band * g->R;
  b.ty1 = b.ty0 + g->R < g->TH ? b.ty0 + g->R : g->TH;
  return b;
}

/* The first slot past the block's last row's stores (its lanes past TW included); narrow, past
 * its tiles (the vector's slots beyond them hold what the missing images' rows gave: not zeros). */
static int64_t wblock_used(const wgeo *g, const wblk *b) {
  if (g->narrow) return b->nn * g->Tr;
  return (b->nn - 1) * g->Tr + (b->ty1 - b->ty0 - 1) * g->TW + up(g->TW, VL);
}

/* Narrow: the plane base of each of the VL / TW tile rows of the vector of slots from t0 (slots
 * counted from image i0 of the block, which has ni images from there, their planes at pl, Lpl
 * apart): image i's tile row ty at pl + i Lpl + tm ty ls. Rows of missing images read image 0's. */
static inline void wino_segs(const wgeo *g, const float *pl, int64_t t0, int64_t ni, int64_t ls, const float **base) {
  for (int64_t s = 0; s < VL / g->TW; s++) {
    int64_t t = t0 + s * g->TW, i = t / g->Timg, ty = t % g->Timg / g->TW;
    base[s] = pl + (i < ni ? i : 0) * g->Lpl + g->tm * ty * ls;
  }
}

/* U[xi][ob][ci][c] = (G g G')[xi] of output channel ob OB + c's filter for input channel ci
 * (zeros past O); flip: g is w[ci][co] rotated by 180 degrees (the input gradient's filter). */
static int64_t wino_u_floats(const wgeo *g) { return g->P * g->nob * g->I * OB; }

/* o[0, os, .. n os) = G f for r filter taps f[0, fs, ..): F(2, 3)'s G has rows 1 0 0, (1 1 1) / 2,
 * (1 -1 1) / 2, 0 0 1; F(2, 5)'s (its points 0, 1, -1, 2, -2 and infinity) rows 1/4 0 0 0 0,
 * -(1 1 1 1 1) / 6, -(1 -1 1 -1 1) / 6, (1 2 4 8 16) / 24, (1 -2 4 -8 16) / 24, 0 0 0 0 1;
 * F(4, 3)'s (the same points) rows 1/4 0 0, -(1 1 1) / 6, -(1 -1 1) / 6, (1 2 4) / 24,
 * (1 -2 4) / 24, 0 0 1. */
static inline __attribute__((always_inline)) void wino_g(int r, int n, const float *f, int64_t fs, float *o,
                                                         int64_t os) {
  if (r == 3 && n == 6) { /* (multiplied by 1/6 and 1/24: no division in a new transform) */
    float f0 = f[0], f1 = f[fs], f2 = f[2 * fs], a = f0 + f2, b = f0 + 4.0f * f2;
    o[0] = 0.25f * f0;
    o[os] = -(a + f1) * (1.0f / 6.0f);
    o[2 * os] = -(a - f1) * (1.0f / 6.0f);
    o[3 * os] = (b + 2.0f * f1) * (1.0f / 24.0f);
    o[4 * os] = (b - 2.0f * f1) * (1.0f / 24.0f);
    o[5 * os] = f2;
    return;
  }
  if (r == 3) {
    o[0] = f[0];
    o[os] = 0.5f * (f[0] + f[fs] + f[2 * fs]);
    o[2 * os] = 0.5f * (f[0] - f[fs] + f[2 * fs]);
    o[3 * os] = f[2 * fs];
    return;
  }
  float f0 = f[0], f1 = f[fs], f2 = f[2 * fs], f3 = f[3 * fs], f4 = f[4 * fs];
  o[0] = 0.25f * f0;
  o[os] = -(f0 + f1 + f2 + f3 + f4) / 6.0f;
  o[2 * os] = -(f0 - f1 + f2 - f3 + f4) / 6.0f;
  o[3 * os] = (f0 + 2.0f * f1 + 4.0f * f2 + 8.0f * f3 + 16.0f * f4) / 24.0f;
  o[4 * os] = (f0 - 2.0f * f1 + 4.0f * f2 - 8.0f * f3 + 16.0f * f4) / 24.0f;
  o[5 * os] = f4;
}

typedef struct {
  float *U;
  const float *w;
  const wgeo *g;
  int flip;
} wfilt_ctx;

/* Filters [a, b) of the nob x I (output block, input channel) pairs: on the pool, as each
 * convolution's first step (serial, it left the second thread idle 1-2 ms a step). A pair's OB
 * channels side by side (f[tap][c], t, u likewise): the transforms' expressions run once per
 * channel as before (the same bits), in a loop the compiler makes vectors of, and each point's OB
 * floats are one store (one scalar store a point and channel, 36 lines apart, was most of
 * F(4x4, 3x3)'s filter transform: 8% of a 7x7 forward). r and n constants in each copy. */
static inline __attribute__((always_inline)) void filters_range(const wfilt_ctx *k, int64_t a, int64_t b, int r,
                                                                int n) {
  float *U = k->U;
  const float *w = k->w;
  const wgeo *g = k->g;
  int flip = k->flip, rr = r * r;
  int64_t os = g->nob * g->I * OB; /* from one point to the next */
  for (int64_t pair = a; pair < b; pair++) {
    int64_t ob = pair / g->I, ci = pair % g->I;
    float f[25][OB], t[6][5][OB], u[6][6][OB];
    for (int64_t c = 0; c < OB; c++) {
      int64_t co = ob * OB + c;
      for (int q = 0; q < rr; q++)
        f[q][c] = co >= g->O ? 0.0f : flip ? w[(ci * g->O + co) * rr + rr - 1 - q] : w[(co * g->I + ci) * rr + q];
    }
    for (int j = 0; j < r; j++) /* G g, column j */
      for (int c = 0; c < OB; c++) wino_g(r, n, &f[j][c], r * OB, &t[0][j][c], 5 * OB);
    for (int i = 0; i < n; i++) /* (G g) G', row i */
      for (int c = 0; c < OB; c++) wino_g(r, n, &t[i][0][c], OB, &u[i][0][c], OB);
    float *o = U + (ob * g->I + ci) * OB;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++)
        for (int c = 0; c < OB; c++) o[(i * n + j) * os + c] = u[i][j][c];
  }
}

static void wino_filters_range(void *vc, int64_t a, int64_t b) {
  const wfilt_ctx *k = vc;
  if (k->g->r == 5) filters_range(k, a, b, 5, 6);
  else if (k->g->n == 6) filters_range(k, a, b, 3, 6);
  else filters_range(k, a, b, 3, 4);
}

static void wino_filters(float *U, const float *w, const wgeo *g, int flip) {
  wfilt_ctx k = {U, w, g, flip};
  tdm_parallel_for(g->nob * g->I, 16, wino_filters_range, &k);
}

/* ---- vector shuffles ---------------------------------------------------------------------- */

#if defined(CONV_DIRECT_EMULATE)
static inline void v_split(vf a, vf b, vf *ev, vf *od) {
  for (int i = 0; i < VL / 2; i++) {
    ev->f[i] = a.f[2 * i], od->f[i] = a.f[2 * i + 1];
    ev->f[VL / 2 + i] = b.f[2 * i], od->f[VL / 2 + i] = b.f[2 * i + 1];
  }
}
static inline void v_zip(vf a, vf b, vf *lo, vf *hi) {
  for (int i = 0; i < VL / 2; i++) {
    lo->f[2 * i] = a.f[i], lo->f[2 * i + 1] = b.f[i];
    hi->f[2 * i] = a.f[VL / 2 + i], hi->f[2 * i + 1] = b.f[VL / 2 + i];
  }
}
static inline vf v_sub(vf a, vf b) {
  for (int i = 0; i < VL; i++) a.f[i] -= b.f[i];
  return a;
}
static inline vf v_keep(vf v, int64_t n) {
  for (int64_t i = n < 0 ? 0 : n; i < VL; i++) v.f[i] = 0.0f;
  return v;
}
static inline vf v_load_n(const float *p, int64_t n) { /* reads the first n lanes only */
  vf v = v_zero();
  for (int64_t i = 0; i < n && i < VL; i++) v.f[i] = p[i];
  return v;
}
static inline void v_sum4_add(float *p, int add, vf a, vf b, vf c, vf d) { /* p[0..4) (+)= the four vectors' sums */
  float s[4] = {v_sum(a), v_sum(b), v_sum(c), v_sum(d)};
  for (int i = 0; i < 4; i++) p[i] = add ? p[i] + s[i] : s[i];
}
/* VL / tw runs of tw floats, run s from p[s] + o (tw a divisor of VL) */
static inline vf v_segs(const float *const *p, int64_t o, int64_t tw) {
  vf v;
  for (int i = 0; i < VL; i++) v.f[i] = p[i / tw][o + i % tw];
  return v;
}
#elif VL == 8
/* evens and odds of a[0..8) b[0..8) */
static inline void v_split(vf a, vf b, vf *ev, vf *od) {
  *ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
  *od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
/* a0 b0 a1 b1 ... as two vectors */
static inline void v_zip(vf a, vf b, vf *lo, vf *hi) {
  vf l = _mm256_unpacklo_ps(a, b), h = _mm256_unpackhi_ps(a, b);
  *lo = _mm256_permute2f128_ps(l, h, 0x20);
  *hi = _mm256_permute2f128_ps(l, h, 0x31);
}
#define v_sub _mm256_sub_ps
/* the first n lanes (n <= 0: none) of a masked load; the others read as zeros */
static inline __m256i v_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < VL ? n : VL)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf v_load_n(const float *p, int64_t n) { return _mm256_maskload_ps(p, v_mask(n)); }
/* p[0..4) += (add) or = the four vectors' sums, in one fixed order (pairs of lanes, then the halves) */
static inline void v_sum4_add(float *p, int add, vf a, vf b, vf c, vf d) {
  vf h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(p, add ? _mm_add_ps(_mm_loadu_ps(p), s) : s);
}
/* VL / tw runs of tw floats, run s from p[s] + o: tw 4 or 2 (narrow rows' gathers) */
static inline vf v_segs(const float *const *p, int64_t o, int64_t tw) {
  __m128 lo, hi;
  if (tw == 4) {
    lo = _mm_loadu_ps(p[0] + o), hi = _mm_loadu_ps(p[1] + o);
  } else {
    lo = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(p[0] + o)), (const __m64 *)(p[1] + o));
    hi = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(p[2] + o)), (const __m64 *)(p[3] + o));
  }
  return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}
/* v with its lanes from n on zeroed (an AND: masked stores are microcoded on AMD's cores) */
static inline vf v_keep(vf v, int64_t n) {
  static const int32_t ones[2 * VL] = {-1, -1, -1, -1, -1, -1, -1, -1};
  n = n < 0 ? 0 : n > VL ? VL : n;
  return _mm256_and_ps(v, _mm256_loadu_ps((const float *)(ones + VL - n)));
}
#else
static inline void v_split(vf a, vf b, vf *ev, vf *od) {
  const __m512i e = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i o = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  *ev = _mm512_permutex2var_ps(a, e, b);
  *od = _mm512_permutex2var_ps(a, o, b);
}
static inline void v_zip(vf a, vf b, vf *lo, vf *hi) {
  const __m512i l = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i h = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  *lo = _mm512_permutex2var_ps(a, l, b);
  *hi = _mm512_permutex2var_ps(a, h, b);
}
#define v_sub _mm512_sub_ps
static inline __mmask16 v_mask(int64_t n) { return n >= VL ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
static inline vf v_load_n(const float *p, int64_t n) { return _mm512_maskz_loadu_ps(v_mask(n), p); }
static inline __m256 v_half_sum(vf v) { /* lanes i + (i + 8) */
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
static inline void v_sum4_add(float *p, int add, vf a, vf b, vf c, vf d) {
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v_half_sum(a), v_half_sum(b)), _mm256_hadd_ps(v_half_sum(c), v_half_sum(d)));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(p, add ? _mm_add_ps(_mm_loadu_ps(p), s) : s);
}
static inline vf v_keep(vf v, int64_t n) { return _mm512_maskz_mov_ps(v_mask(n), v); }
/* VL / tw runs of tw floats, run s from p[s] + o: tw 8 or 4 (narrow rows' gathers) */
static inline vf v_segs(const float *const *p, int64_t o, int64_t tw) {
  if (tw == 8) {
    __m512d a = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(p[0] + o)));
    return _mm512_castpd_ps(_mm512_insertf64x4(a, _mm256_castps_pd(_mm256_loadu_ps(p[1] + o)), 1));
  }
  vf v = _mm512_castps128_ps512(_mm_loadu_ps(p[0] + o));
  v = _mm512_insertf32x4(v, _mm_loadu_ps(p[1] + o), 1);
  v = _mm512_insertf32x4(v, _mm_loadu_ps(p[2] + o), 2);
  return _mm512_insertf32x4(v, _mm_loadu_ps(p[3] + o), 3);
}
#endif

/* p[0..n) = 0 in vectors, the last few one by one: as a loop of float stores GCC made each a
 * memset call, and the blocks' short runs (a few floats a row, 256 rows a block) spent 2-3% of
 * a resnet20 step in the calls. (The empty asm keeps the tail a loop.) */
static inline void zero_floats(float *p, int64_t n) {
  int64_t i = 0;
  for (; i + VL <= n; i += VL) v_store(p + i, v_zero());
  for (; i < n; i++) {
    p[i] = 0.0f;
    __asm__("" : : "r"(p + i));
  }
}

/* ---- input: split planes and their transform ------------------------------------------------ */

/* The zero-padded plane of an H x W channel, each padded row as its tm phases, RW floats each:
 * phase q holds the padded columns j with j % tm == q, column j at j / tm (tm = 2: the even
 * columns, then the odd ones). Padded column j is input column j - pad: input columns x0 + tm i + q
 * (x0 a multiple of tm VL) go to phase (q + pad) % tm at x0 / tm + i + (q + pad) / tm. tm VL
 * columns at a time, split into their phases by v_split (twice over for tm = 4); past the row's
 * end the lanes are zeroed (the right padding: loaded from the next rows, or masked where the
 * load would leave the plane; vectors wholly past it are zeros, not loaded). The plane's other
 * entries that the transforms read (the padding rows, each phase's entries before and after the
 * stores) are the same for every plane of a convolution and never stored to: wino_planes_clear
 * zeroes them once, as a thread takes its first block (set per row and plane, they were a third
 * of the split's time, and at 7x7 the padding rows as many stores as the data). */
static inline __attribute__((always_inline)) void split_plane(float *pl, const float *src, const wgeo *g, int64_t ty0,
                                                              int64_t ty1, int tm, int p) {
  int64_t ls = tm * g->RW, xe = up(g->W, tm * VL); /* a padded row's floats; the columns the vector loop covers */
  int64_t r0 = tm * ty0, r1 = tm * ty1 + g->r - 1; /* the padded rows tile rows [ty0, ty1) read */
  for (int64_t y = r0 > p ? r0 - p : 0; y < g->H && y + p < r1; y++) {
    float *row = pl + (y + p) * ls;
    const float *s = src + y * g->W;
    for (int64_t x = 0; x < xe; x += tm * VL) {
      vf in[4], ph[4];
      int64_t n = g->W - x;
      if (n >= tm * VL)
        for (int j = 0; j < tm; j++) in[j] = v_load(s + x + j * VL);
      else if ((g->H - 1 - y) * g->W >= tm * VL - n) /* the loads stay in the plane */
        for (int j = 0; j < tm; j++) in[j] = n - j * VL > 0 ? v_keep(v_load(s + x + j * VL), n - j * VL) : v_zero();
      else
        for (int j = 0; j < tm; j++) in[j] = n - j * VL > 0 ? v_load_n(s + x + j * VL, n - j * VL) : v_zero();
      if (tm == 2) {
        v_split(in[0], in[1], &ph[0], &ph[1]);
      } else { /* evens and odds, then the evens' and the odds' own */
        vf e0, o0, e1, o1;
        v_split(in[0], in[1], &e0, &o0);
        v_split(in[2], in[3], &e1, &o1);
        v_split(e0, e1, &ph[0], &ph[2]);
        v_split(o0, o1, &ph[1], &ph[3]);
      }
      for (int q = 0; q < tm; q++) v_store(row + (q + p) % tm * g->RW + x / tm + (q + p) / tm, ph[q]);
    }
  }
}

/* Zeros in the GI planes at pl (wino_split_plane: all a convolution's planes store the same
 * entries), before a thread's first block. */
static void wino_planes_clear(float *pl, const wgeo *g) { zero_floats(pl, g->GI * g->Lpl); }

/* tm and the padding constants in each copy (its divisions by tm were a third of F(4x4, 3x3)'s
 * input at 14x14) */
static void wino_split_plane(float *pl, const float *src, const wgeo *g, int64_t ty0, int64_t ty1) {
  if (g->tm == 4) split_plane(pl, src, g, ty0, ty1, 4, 1);
  else if (g->pad == 1) split_plane(pl, src, g, ty0, ty1, 2, 1);
  else split_plane(pl, src, g, ty0, ty1, 2, 2);
}

/* F(2, 5)'s B' on six vectors, in place: rows 4 0 -5 0 1 0, 0 -4 -4 1 1 0, 0 4 -4 -1 1 0,
 * 0 -2 -1 2 1 0, 0 2 -1 -2 1 0, 0 4 0 -5 0 1 (F(4, 3)'s too: the same points). */
static inline void wino_bt5(vf d[6]) {
  vf p = v_fma(v_set1(-4.0f), d[2], d[4]), q = v_fma(v_set1(-4.0f), d[1], d[3]);
  vf s = v_sub(d[4], d[2]), t = v_sub(d[3], d[1]);
  vf b0 = v_fma(v_set1(4.0f), d[0], v_fma(v_set1(-5.0f), d[2], d[4]));
  vf b5 = v_fma(v_set1(4.0f), d[1], v_fma(v_set1(-5.0f), d[3], d[5]));
  t = v_add(t, t);
  d[0] = b0, d[1] = v_add(p, q), d[2] = v_sub(p, q), d[3] = v_add(s, t), d[4] = v_sub(s, t), d[5] = b5;
}

/* V[xi] = (B' d B)[xi] of VL 4x4 patches d (F(2x2, 3x3)), at V, ldv floats from one point to the next. */
static inline void wino_tf_in4(vf d[4][4], float *V, int64_t ldv) {
  vf t[4][4];
  for (int c = 0; c < 4; c++) { /* B' d: rows d0 - d2, d1 + d2, d2 - d1, d1 - d3 */
    t[0][c] = v_sub(d[0][c], d[2][c]);
    t[1][c] = v_add(d[1][c], d[2][c]);
    t[2][c] = v_sub(d[2][c], d[1][c]);
    t[3][c] = v_sub(d[1][c], d[3][c]);
  }
  for (int r = 0; r < 4; r++) { /* (B' d) B: the same over columns */
    v_store(V + (r * 4 + 0) * ldv, v_sub(t[r][0], t[r][2]));
    v_store(V + (r * 4 + 1) * ldv, v_add(t[r][1], t[r][2]));
    v_store(V + (r * 4 + 2) * ldv, v_sub(t[r][2], t[r][1]));
    v_store(V + (r * 4 + 3) * ldv, v_sub(t[r][1], t[r][3]));
  }
}

/* The same for VL 6x6 patches h (F(2x2, 5x5), F(4x4, 3x3)): B' over each patch row's columns
 * first, then over the rows, column by column. */
static inline void wino_tf_in6(vf h[6][6], float *V, int64_t ldv) {
  for (int r = 0; r < 6; r++) wino_bt5(h[r]);
  for (int c = 0; c < 6; c++) {
    vf d[6] = {h[0][c], h[1][c], h[2][c], h[3][c], h[4][c], h[5][c]};
    wino_bt5(d);
    for (int r = 0; r < 6; r++) v_store(V + (r * 6 + c) * ldv, d[r]);
  }
}

/* V[xi][ci][slot] = (B' d B)[xi] for the tiles of tile rows [ty0, ty1) of one split plane, V at
 * the slot of row ty0's first tile, VL tiles at a time (lanes past TW spill into the next row's
 * slots, which that row then writes). All the plane's rows in one call: called per row, the
 * set-up of the 16 store streams cost more than a row's one or two vectors of work at 7x7 and
 * 14x14 (1.4 million calls a resnet20 step). A tile k's n columns are tm k .. tm k + n - 1,
 * column j of them at phase j % tm, k + j / tm of the split rows (tm = 2: even k, odd k, even
 * k + 1, ...). tm and n constants in each copy: the loads' offsets fold. */
static inline __attribute__((always_inline)) void in_rows(float *V, int64_t ldv, const float *pl, int64_t ty0,
                                                          int64_t ty1, const wgeo *g, int tm, int n) {
  int64_t ls = tm * g->RW;
  for (int64_t ty = ty0; ty < ty1; ty++, V += g->TW) {
    const float *r0 = pl + tm * ty * ls;
    for (int64_t k = 0; k < g->TW; k += VL) {
      if (n == 4) {
        vf d[4][4];
        for (int r = 0; r < 4; r++)
          for (int j = 0; j < 4; j++) d[r][j] = v_load(r0 + r * ls + k + j % tm * g->RW + j / tm);
        wino_tf_in4(d, V + k, ldv);
      } else {
        vf h[6][6];
        for (int r = 0; r < 6; r++)
          for (int j = 0; j < 6; j++) h[r][j] = v_load(r0 + r * ls + k + j % tm * g->RW + j / tm);
        wino_tf_in6(h, V + k, ldv);
      }
    }
  }
}

/* The same, narrow (wgeo_of): slots [0, VL) (GI > 1: GI images' tiles) or [0, Timg) of ni
 * images' planes at pl, a vector's VL / TW tile rows gathered from their planes. */
static inline __attribute__((always_inline)) void in_narrow(float *V, int64_t ldv, const float *pl, int64_t ni,
                                                            const wgeo *g, int tm, int n) {
  int64_t ls = tm * g->RW, nvec = g->GI > 1 ? 1 : g->Timg / VL;
  for (int64_t t = 0; t < nvec * VL; t += VL) {
    const float *base[VL];
    wino_segs(g, pl, t, ni, ls, base);
    if (n == 4) {
      vf d[4][4];
      for (int r = 0; r < 4; r++)
        for (int j = 0; j < 4; j++) d[r][j] = v_segs(base, r * ls + j % tm * g->RW + j / tm, g->TW);
      wino_tf_in4(d, V + t, ldv);
    } else {
      vf h[6][6];
      for (int r = 0; r < 6; r++)
        for (int j = 0; j < 6; j++) h[r][j] = v_segs(base, r * ls + j % tm * g->RW + j / tm, g->TW);
      wino_tf_in6(h, V + t, ldv);
    }
  }
}

static void wino_in_rows(float *V, int64_t ldv, const float *pl, int64_t ty0, int64_t ty1, const wgeo *g) {
  if (g->n == 4) in_rows(V, ldv, pl, ty0, ty1, g, 2, 4);
  else if (g->tm == 2) in_rows(V, ldv, pl, ty0, ty1, g, 2, 6);
  else in_rows(V, ldv, pl, ty0, ty1, g, 4, 6);
}

static void wino_in_narrow(float *V, int64_t ldv, const float *pl, int64_t ni, const wgeo *g) {
  if (g->n == 4) in_narrow(V, ldv, pl, ni, g, 2, 4);
  else if (g->tm == 2) in_narrow(V, ldv, pl, ni, g, 2, 6);
  else in_narrow(V, ldv, pl, ni, g, 4, 6);
}

/* V[xi][ci][slot of (i, ty)] for block b's tiles of x (ldv floats from one point to the next),
 * each image's channel split into the plane at pl and transformed before the next: one plane,
 * in L1 (a plane per image and channel was 330 KiB of a 7x7 block's scratch, with V past L2). */
static void wino_input(float *V, int64_t ldv, float *pl, const float *x, const wgeo *g, const wblk *b) {
  if (g->narrow) { /* GI images' planes of a channel at a time (their tiles: whole vectors) */
    for (int64_t i0 = 0; i0 < b->nn; i0 += g->GI)
      for (int64_t ci = 0; ci < g->I; ci++) {
        int64_t ni = b->nn - i0 < g->GI ? b->nn - i0 : g->GI;
        for (int64_t i = 0; i < ni; i++)
          wino_split_plane(pl + i * g->Lpl, x + ((b->n0 + i0 + i) * g->I + ci) * g->H * g->W, g, 0, g->TH);
        wino_in_narrow(V + ci * g->Tb + i0 * g->Tr, ldv, pl, ni, g);
      }
    return;
  }
  for (int64_t i = 0; i < b->nn; i++)
    for (int64_t ci = 0; ci < g->I; ci++) {
      wino_split_plane(pl, x + ((b->n0 + i) * g->I + ci) * g->H * g->W, g, b->ty0, b->ty1);
      wino_in_rows(V + ci * g->Tb + i * g->Tr, ldv, pl, b->ty0, b->ty1, g);
    }
}

/* ---- the 16 products: M[xi][c][t] for OB output channels ------------------------------------ */

/* The direct forward's conv_tile with a 1x1 kernel: its loop over taps and their offset table
 * made it 1.5x slower here (32 channels at 14x14: 7.9 against 5.0 ms a forward). */

static inline __attribute__((always_inline)) void wino_tile(int P, float *M, const float *V, const float *U,
                                                            const wgeo *g) {
  vf acc[OB][PB];
  for (int c = 0; c < OB; c++)
    for (int j = 0; j < P; j++) acc[c][j] = v_zero();
  for (int64_t ci = 0; ci < g->I; ci++, V += g->Tb, U += OB) {
    vf v[PB];
    for (int j = 0; j < P; j++) {
      v[j] = v_load(V + VL * j);
      V_PIN(v[j]); /* one load for the OB products (GCC would fold it into each FMA) */
    }
    for (int c = 0; c < OB; c++) {
      vf b = v_set1(U[c]);
      for (int j = 0; j < P; j++) acc[c][j] = v_fma(b, v[j], acc[c][j]);
    }
  }
  for (int c = 0; c < OB; c++)
    for (int j = 0; j < P; j++) v_store(M + c * g->Tb + VL * j, acc[c][j]);
}

/* A last single vector of tiles for two channel blocks at once (U0's and U1's, M0's and M1's):
 * wino_tile(1, ..) has OB accumulators, each FMA waiting on its own previous one (half the
 * FMA's rate on AVX2); 2 OB of them keep both units busy. The same sums in the same order, so
 * the bits of wino_tile(1, ..) on each block. (28x28 images, 7 vectors a block: 3 + 3 + 1.) */
static inline __attribute__((always_inline)) void wino_tile_1x2(float *M0, float *M1, const float *V, const float *U0,
                                                                const float *U1, const wgeo *g) {
  vf acc[2][OB];
  for (int c = 0; c < OB; c++) acc[0][c] = v_zero(), acc[1][c] = v_zero();
  for (int64_t ci = 0; ci < g->I; ci++, V += g->Tb, U0 += OB, U1 += OB) {
    vf v = v_load(V);
    V_PIN(v);
    for (int c = 0; c < OB; c++) acc[0][c] = v_fma(v_set1(U0[c]), v, acc[0][c]);
    for (int c = 0; c < OB; c++) acc[1][c] = v_fma(v_set1(U1[c]), v, acc[1][c]);
  }
  for (int c = 0; c < OB; c++) v_store(M0 + c * g->Tb, acc[0][c]), v_store(M1 + c * g->Tb, acc[1][c]);
}

/* ---- output: the transform back, into the output rows --------------------------------------- */

/* F(2, 5)'s A' on six vectors: rows 1 1 1 1 1 0 and 0 1 -1 2 -2 1. */
static inline void wino_at5(const vf m[6], vf *y0, vf *y1) {
  vf a = v_add(m[1], m[2]), b = v_sub(m[1], m[2]), c = v_add(m[3], m[4]), d = v_sub(m[3], m[4]);
  *y0 = v_add(v_add(m[0], a), c);
  *y1 = v_add(v_add(b, v_add(d, d)), m[5]);
}

typedef struct {
  const wgeo *g;
  const float *x;  /* (N, I, H, W) */
  float *y;        /* (N, O, H, W) */
  const float *U;  /* wino_filters */
  const float *bias;
  float *ws;       /* WINO slots */
  int add;         /* y += (the input gradient into an existing one), else y = conv + bias */
  _Atomic int64_t next; /* the next block not yet taken */
} wino_ctx;

/* F(4, 3)'s A' on six vectors: rows 1 1 1 1 1 0, 0 1 -1 2 -2 0, 0 1 1 4 4 0, 0 1 -1 8 -8 1. */
static inline void wino_at43(const vf m[6], vf y[4]) {
  vf a = v_add(m[1], m[2]), b = v_sub(m[1], m[2]), c = v_add(m[3], m[4]), d = v_sub(m[3], m[4]);
  y[0] = v_add(v_add(m[0], a), c);
  y[1] = v_fma(v_set1(2.0f), d, b);
  y[2] = v_fma(v_set1(4.0f), c, a);
  y[3] = v_add(v_fma(v_set1(8.0f), d, b), m[5]);
}

/* Output row a (of tm) of VL tiles, Y[a][q] its columns tm t + q of tile t, into the row's tm
 * vectors of output columns, in order. */
static inline void wino_interleave(int tm, vf *Y, vf *o) {
  if (tm == 2) {
    v_zip(Y[0], Y[1], &o[0], &o[1]);
    return;
  }
  vf l02, h02, l13, h13;
  v_zip(Y[0], Y[2], &l02, &h02);
  v_zip(Y[1], Y[3], &l13, &h13);
  v_zip(l02, l13, &o[0], &o[1]);
  v_zip(h02, h13, &o[2], &o[3]);
}

/* Y[a][j] = (A' m A)[a][j] of VL tiles, m's points at M, ldm floats apart: output row a's column
 * j of each tile (F(2, 3)'s A' rows: m0 + m1 + m2, m1 - m2 - m3). */
static inline void wino_out_tf(const wgeo *g, const float *M, int64_t ldm, vf Y[4][4]) {
  if (g->r == 3 && g->tm == 2) {
    vf m[4][4], s[2][4];
    for (int xi = 0; xi < 16; xi++) m[xi / 4][xi % 4] = v_load(M + xi * ldm);
    for (int j = 0; j < 4; j++) {
      s[0][j] = v_add(v_add(m[0][j], m[1][j]), m[2][j]);
      s[1][j] = v_sub(v_sub(m[1][j], m[2][j]), m[3][j]);
    }
    for (int a = 0; a < 2; a++)
      Y[a][0] = v_add(v_add(s[a][0], s[a][1]), s[a][2]), Y[a][1] = v_sub(v_sub(s[a][1], s[a][2]), s[a][3]);
  } else if (g->tm == 2) {
    vf s[2][6];
    for (int j = 0; j < 6; j++) {
      vf m[6];
      for (int i = 0; i < 6; i++) m[i] = v_load(M + (i * 6 + j) * ldm);
      wino_at5(m, &s[0][j], &s[1][j]);
    }
    for (int a = 0; a < 2; a++) wino_at5(s[a], &Y[a][0], &Y[a][1]);
  } else {
    vf s[6][4]; /* A' over each column j's six points */
    for (int j = 0; j < 6; j++) {
      vf m[6];
      for (int i = 0; i < 6; i++) m[i] = v_load(M + (i * 6 + j) * ldm);
      wino_at43(m, s[j]);
    }
    for (int a = 0; a < 4; a++) {
      vf r[6] = {s[0][a], s[1][a], s[2][a], s[3][a], s[4][a], s[5][a]};
      wino_at43(r, Y[a]);
    }
  }
}

/* nv output vectors v into a row from d, n of whose columns are left: added (the lanes past n
 * zeroed), or with the bias; buffered, only the n columns are written (through a buffer). */
static inline __attribute__((always_inline)) void wino_store(const wino_ctx *c, float *d, const vf *v, int nv,
                                                             int64_t n, int buffered, float bias, vf bv) {
  if (buffered) {
    float buf[4 * VL];
    for (int j = 0; j < nv; j++) v_store(buf + j * VL, v[j]);
    if (c->add)
      for (int64_t x = 0; x < n; x++) d[x] += buf[x];
    else
      for (int64_t x = 0; x < n; x++) d[x] = buf[x] + bias;
  } else if (c->add) {
    for (int j = 0; j < nv; j++)
      v_store(d + j * VL, v_add(v_load(d + j * VL), n - j * VL < VL ? v_keep(v[j], n - j * VL) : v[j]));
  } else {
    for (int j = 0; j < nv; j++) v_store(d + j * VL, v_add(v[j], bv));
  }
}

/* Output channel co of tile row ty of image n (its tiles at slot t0 of M's rows, ldm apart):
 * Y = A' m A per tile (F(2, 3)'s A' rows: m0 + m1 + m2, m1 - m2 - m3), the output rows' tile
 * columns interleaved and stored (with the bias, or added) into y. Whole vectors: a row's last
 * group runs past its end into the next rows, so it goes first (their own groups, after it,
 * write those columns again; added, the lanes past the end are zeros); a row whose end would run
 * past the block's last row, ylim - 1 (into rows another block writes, or another plane, or past
 * y), ends through a buffer. */
static void wino_out_row(const wino_ctx *c, const float *M, int64_t ldm, int64_t n, int64_t co, int64_t ty, int64_t ylim) {
  const wgeo *g = c->g;
  int tm = g->tm;
  float *y0 = c->y + ((n * g->O + co) * g->H + tm * ty) * g->W;
  float bias = c->bias ? c->bias[co] : 0.0f;
  vf bv = v_set1(bias);
  int rows = g->H - tm * ty < tm ? (int)(g->H - tm * ty) : tm;
  int64_t groups = (g->TW + VL - 1) / VL;
  for (int64_t q = 0; q < groups; q++) {
    int64_t k = (q == 0 ? groups - 1 : q - 1) * VL; /* the last group first */
    vf Y[4][4]; /* output row a's columns tm t + j, for its VL tiles t */
    wino_out_tf(g, M + k, ldm, Y);
    for (int a = 0; a < rows; a++) {
      vf o[4];
      wino_interleave(tm, Y[a], o);
      int64_t n0 = g->W - tm * k; /* the row's columns left from its group's start */
      /* (a buffer where the stores would leave the block's rows) */
      wino_store(c, y0 + a * g->W + tm * k, o, tm, n0,
                 n0 < tm * VL && (ylim - 1 - tm * ty - a) * g->W < tm * VL - n0, bias, bv);
    }
  }
}

/* Narrow: output channel co of the vector of slots from t0 of a block (its images from n0, nn of
 * them; M at the vector): its VL / TW tile rows, each row's outputs tm TW columns (whole vectors)
 * from the row's start. A row's stores run past its end into the next rows (tm TW - W columns),
 * which are written after it (the same vector's, the next vectors', the next channels'); the
 * last row of an image's last channel (the next image's first plane: written before, or by
 * another block) ends through a buffer. */
static void wino_out_narrow(const wino_ctx *c, const float *M, int64_t ldm, int64_t n0, int64_t nn, int64_t co,
                            int64_t t0) {
  const wgeo *g = c->g;
  int tm = g->tm, per = (int)(tm * g->TW / VL); /* vectors of an output row of a tile row */
  vf Y[4][4], o[4][4];
  wino_out_tf(g, M, ldm, Y);
  for (int a = 0; a < tm; a++) wino_interleave(tm, Y[a], o[a]);
  float bias = c->bias ? c->bias[co] : 0.0f;
  vf bv = v_set1(bias);
  for (int64_t s = 0; s < VL / g->TW; s++) {
    int64_t t = t0 + s * g->TW, i = t / g->Timg, ty = t % g->Timg / g->TW;
    if (i >= nn) break;
    int rows = g->H - tm * ty < tm ? (int)(g->H - tm * ty) : tm;
    float *y0 = c->y + (((n0 + i) * g->O + co) * g->H + tm * ty) * g->W;
    for (int a = 0; a < rows; a++)
      wino_store(c, y0 + a * g->W, o[a] + s * per, per, g->W,
                 per * VL > g->W && co == g->O - 1 && tm * ty + a == g->H - 1, bias, bv);
  }
}

static void wino_block(const wino_ctx *c, float *slot, int64_t blk) {
  const wgeo *g = c->g;
  float *V = slot + g->v, *M = slot + g->m;
  wblk b = wblock(g, blk);
  wino_input(V, g->vp, slot, c->x, g, &b);
  /* slots past the block's tiles (a short last block or band): zeros, not stale or unset memory */
  int64_t used = wblock_used(g, &b), ylim = g->tm * b.ty1 < g->H ? g->tm * b.ty1 : g->H;
  for (int xi = 0; xi < g->P; xi++)
    for (int64_t ci = 0; ci < g->I; ci++) zero_floats(V + xi * g->vp + ci * g->Tb + used, g->Tb - used);
  /* output channels in chunks of CC, point by point: a point's V (Ci x Tb) stays in L1 while the
   * chunk's channel blocks read it, and the chunk's M (16 x CC x Tb) stays in L2 with V until
   * it is transformed back (all channels at once spilled M out of L2 at 64 channels) */
  for (int64_t c0 = 0; c0 < g->nob * OB; c0 += g->CC) {
    int64_t c1 = c0 + g->CC < g->nob * OB ? c0 + g->CC : g->nob * OB;
    int64_t tw = g->Tb / (PB * VL) * (PB * VL); /* slots in whole register tiles; one vector or two left */
    for (int xi = 0; xi < g->P; xi++) {
      const float *Vx = V + xi * g->vp;
      for (int64_t ob = c0 / OB; ob < c1 / OB; ob++) {
        const float *Ux = c->U + (xi * g->nob + ob) * g->I * OB;
        float *Mx = M + xi * g->mp + (ob * OB - c0) * g->Tb;
        for (int64_t t = 0; t < tw; t += PB * VL) wino_tile(PB, Mx + t, Vx + t, Ux, g);
        if (g->Tb - tw == 2 * VL) wino_tile(2, Mx + tw, Vx + tw, Ux, g);
        else if (g->Tb - tw == VL) { /* blocks in pairs, at the second of each; an odd last one alone */
          if ((ob - c0 / OB) % 2) wino_tile_1x2(Mx - OB * g->Tb + tw, Mx + tw, Vx + tw, Ux - g->I * OB, Ux, g);
          else if (ob + 1 == c1 / OB) wino_tile(1, Mx + tw, Vx + tw, Ux, g);
        }
      }
    }
    for (int64_t co = c0; co < c1 && co < g->O; co++)
      if (g->narrow)
        for (int64_t t = 0; t < b.nn * g->Tr; t += VL)
          wino_out_narrow(c, M + (co - c0) * g->Tb + t, g->mp, b.n0, b.nn, co, t);
      else
        for (int64_t i = 0; i < b.nn; i++)
          for (int64_t ty = b.ty0; ty < b.ty1; ty++)
            wino_out_row(c, M + (co - c0) * g->Tb + i * g->Tr + (ty - b.ty0) * g->TW, g->mp, b.n0 + i, co, ty, ylim);
  }
}

/* A thread's range of slots [a, b) uses slot a's scratch and takes blocks one at a time until
 * none is left. Each slot's fixed share of blocks, run in turn, went through 16 slots' scratch
 * (400 KiB each at 28x28: out of L2 between slots), and left a thread the host had slowed
 * finishing alone; taking blocks into one thread's scratch ran resnet20 1.11x as fast at one
 * thread and 1.14-1.18x at two (docs/PERFORMANCE.md, eleventh run). Which thread or slot runs a
 * block changes no output bit (each output is its own patch's). */
static void wino_range(void *vc, int64_t a, int64_t b) {
  wino_ctx *c = vc;
  const wgeo *g = c->g;
  (void)b;
  int first = 1;
  for (int64_t blk; (blk = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) < g->nblk; first = 0) {
    if (first) wino_planes_clear(c->ws + a * g->slot, g);
    wino_block(c, c->ws + a * g->slot, blk);
  }
}

/* ---- the weight gradient ------------------------------------------------------------------- */

/* The forward's transpose: with dM = A dY A' per tile (A, the transpose of A': rows 1 0, 1 1,
 * 1 -1, 0 -1),
 *     dU[xi][co][ci] = sum over tiles t of dM[xi][co][t] V[xi][ci][t],   dw += G' dU G,
 * V the forward's input transform. The sum over tiles runs in VL lanes, in register tiles of DCO
 * output x DCI input channels (AVX2: 4 x 2, 6 loads for 8 FMAs; 16 wide: 4 x 4), each block's
 * lanes added into a slot's partial sums (16 Op Ip floats, four accumulators' lanes at a time);
 * the slots are added in slot order at the end. Bits: the block and slot of each tile are the
 * shape's, so nothing depends on the thread count (the batch split does change them, as it
 * changes any sum over images). */

/* The weight gradient's register tile: channel counts that are multiples of 4 fill it (a 3 x 3
 * tile padded resnet20's 16 channels to 18: 27% more products, the sum at the FMA's peak) */
#if VL == 8
#define DCO 4
#define DCI 2
#else
#define DCO 4
#define DCI 4
#endif

#ifndef WINO_DW_L1
#define WINO_DW_L1 6144 /* floats of a point's V and dM rows a block aims at: 24 KiB, in L1 */
#endif
#ifndef WINO_DW_L1_4
#define WINO_DW_L1_4 12288 /* F(4x4, 3x3): 48 KiB (fewer lane sums and partial-sum passes; 7x7, 64 channels: 1.1-1.3x) */
#endif

typedef struct {
  wgeo g;                /* blocks, split planes, rows of Tb tile slots */
  int64_t Ip, Op;        /* channels up to whole register tiles (the rows past them zeros) */
  int64_t vp, mp;        /* floats from one point's rows to the next's: V's (Ip x Tb), dM's (Op x Tb) */
  int64_t v, mg, slot;   /* a slot's layout: the split plane, V (16 points), dM (16 points) */
  int64_t part;          /* a slot's partial sums: 16 x Op x Ip */
  int64_t S;             /* slots */
} dgeo;

static void dgeo_of(const tdm_conv_shape *s, int tm, dgeo *d) {
  wgeo *g = &d->g;
  d->Ip = up(s->Ci, DCI), d->Op = up(s->Co, DCO);
  /* a point's V and dM rows in L1 while every register tile sweeps them (beyond it, each tile
   * streamed them from L2 again); fewer tiles cost more lane sums per product */
  int64_t tiles = (tm == 4 ? WINO_DW_L1_4 : WINO_DW_L1) / (d->Ip + d->Op);
  wgeo_of(wino_r(s), tm, s->N, s->Ci, s->Co, s->H, s->W, tiles > 2 * VL ? tiles : 2 * VL, 0, g);
  /* Blocks of near-equal images, an even number of them: threads take slots in turn, and two of
   * them took 72 and 56 of 128 images at 7x7 (6 blocks of 24, the last 8) and at 14x14 (11 of
   * 12, the last 8). The sizes are the shape's, so the sums' order is too. Narrow blocks of
   * several images a vector (GI) keep whole vectors; the forward's whole register tiles do not
   * matter here (the sums run over the tiles, in vectors). */
  if (g->nband == 1 && g->nblk > 1) {
    int64_t nb = g->nblk + g->nblk % 2, G = up((s->N + nb - 1) / nb, g->GI);
    wgeo_of(wino_r(s), tm, s->N, s->Ci, s->Co, s->H, s->W, 0, G, g);
  }
  d->v = g->v;
  d->vp = point_stride(d->Ip * g->Tb), d->mp = point_stride(d->Op * g->Tb);
  d->mg = d->v + g->P * d->vp;
  d->slot = up(d->mg + g->P * d->mp, 16);
  d->part = g->P * d->Op * d->Ip;
  d->S = g->nblk < WINO_SLOTS ? g->nblk : WINO_SLOTS;
}

/* Each slot's partial sums are 16 Op Ip floats: 17 MiB at 512 channels, x 16 slots. Beyond
 * WINO_DW_PARTS floats in all, the direct kernel forms the weight gradient (its bits, too, do
 * not depend on the thread count), so the workspace stays within tens of MiB. */
#ifndef WINO_DW_PARTS
#define WINO_DW_PARTS ((int64_t)8 << 20)
#endif
static int64_t wino_dw_floats(const tdm_conv_shape *s, int tm) {
  dgeo d;
  dgeo_of(s, tm, &d);
  return d.S * d.part <= WINO_DW_PARTS ? d.S * (d.slot + d.part) + 16 : 0;
}

/* q[0, qs, .. 6 qs) = A (a, b): a, a + b, a - b, a + 2 b, a - 2 b, b. */
static inline void wino_a5(vf a, vf b, vf *q, int qs) {
  vf b2 = v_add(b, b);
  q[0] = a, q[qs] = v_add(a, b), q[2 * qs] = v_sub(a, b), q[3 * qs] = v_add(a, b2), q[4 * qs] = v_sub(a, b2), q[5 * qs] = b;
}

/* q[0, qs, .. 6 qs) = F(4, 3)'s A (its A' transposed: rows 1 0 0 0, 1 1 1 1, 1 -1 1 -1, 1 2 4 8,
 * 1 -2 4 -8, 0 0 0 1) y for four values y[0, ys, ..). */
static inline void wino_a43(const vf *y, int ys, vf *q, int qs) {
  vf e = v_add(y[0], y[2 * ys]), f = v_add(y[ys], y[3 * ys]);
  vf g = v_fma(v_set1(4.0f), y[2 * ys], y[0]), h = v_fma(v_set1(8.0f), y[3 * ys], v_add(y[ys], y[ys]));
  q[0] = y[0], q[qs] = v_add(e, f), q[2 * qs] = v_sub(e, f), q[3 * qs] = v_add(g, h), q[4 * qs] = v_sub(g, h);
  q[5 * qs] = y[3 * ys];
}

/* dM[xi] = (A dY A')[xi] of VL tiles at Mg (ldm floats from one point to the next), from in[a][j]:
 * the tile row's output-gradient row a, its columns j VL .. j VL + VL - 1 from tile 0's (zeros
 * past the plane and past the row), split here into their tm column phases. */
static inline void wino_dy_tf(const wgeo *g, vf in[4][4], float *Mg, int64_t ldm) {
  if (g->tm == 4) {
    vf y[4][4]; /* row a's columns 4 t + b of its VL tiles t */
    for (int a = 0; a < 4; a++) {
      vf e0, o0, e1, o1;
      v_split(in[a][0], in[a][1], &e0, &o0);
      v_split(in[a][2], in[a][3], &e1, &o1);
      v_split(e0, e1, &y[a][0], &y[a][2]);
      v_split(o0, o1, &y[a][1], &y[a][3]);
    }
    vf q[6][4]; /* A over the rows, phase by phase */
    for (int b = 0; b < 4; b++) wino_a43(&y[0][b], 4, &q[0][b], 4);
    for (int i = 0; i < 6; i++) {
      vf c[6];
      wino_a43(q[i], 1, c, 1);
      for (int j = 0; j < 6; j++) v_store(Mg + (i * 6 + j) * ldm, c[j]);
    }
    return;
  }
  vf e0, o0, e1, o1;
  v_split(in[0][0], in[0][1], &e0, &o0);
  v_split(in[1][0], in[1][1], &e1, &o1);
  if (g->r == 5) { /* A = F(2, 5)'s A' transposed: rows 1 0, 1 1, 1 -1, 1 2, 1 -2, 0 1 */
    vf q[6][2];
    wino_a5(e0, e1, &q[0][0], 2), wino_a5(o0, o1, &q[0][1], 2);
    for (int i = 0; i < 6; i++) {
      vf c[6];
      wino_a5(q[i][0], q[i][1], c, 1);
      for (int j = 0; j < 6; j++) v_store(Mg + (i * 6 + j) * ldm, c[j]);
    }
    return;
  }
  vf q[4][2] = {{e0, o0}, {v_add(e0, e1), v_add(o0, o1)}, {v_sub(e0, e1), v_sub(o0, o1)},
                {v_sub(v_zero(), e1), v_sub(v_zero(), o1)}};
  for (int i = 0; i < 4; i++) {
    v_store(Mg + (i * 4 + 0) * ldm, q[i][0]);
    v_store(Mg + (i * 4 + 1) * ldm, v_add(q[i][0], q[i][1]));
    v_store(Mg + (i * 4 + 2) * ldm, v_sub(q[i][0], q[i][1]));
    v_store(Mg + (i * 4 + 3) * ldm, v_sub(v_zero(), q[i][1]));
  }
}

/* dM[xi][co][t0 + tx] for tile row ty of one output-gradient plane, VL tiles at a time: rows
 * tm ty .. tm ty + tm - 1 (zeros past the plane), split into their column phases (zeros past the row). */
static void wino_dy_row(float *Mg, int64_t ldm, const float *dy, int64_t ty, const wgeo *g) {
  int tm = g->tm;
  for (int64_t k = 0; k < g->TW; k += VL) {
    int64_t x = tm * k, n = g->W - x;
    vf in[4][4];
    for (int a = 0; a < tm; a++) {
      const float *r = dy + (tm * ty + a) * g->W + x;
      for (int j = 0; j < tm; j++)
        in[a][j] = tm * ty + a >= g->H ? v_zero() : n >= tm * VL ? v_load(r + j * VL) : v_load_n(r + j * VL, n - j * VL);
    }
    wino_dy_tf(g, in, Mg + k, ldm);
  }
}

/* The same, narrow (wgeo_of): output channel co's vector of slots from t0 of a block (images
 * from n0, nn of them), its VL / TW tile rows' output rows whole vectors from their starts. */
static void wino_dy_narrow(float *Mg, int64_t ldm, const float *dy, int64_t n0, int64_t nn, int64_t co, int64_t t0,
                           const wgeo *g) {
  int tm = g->tm, per = (int)(tm * g->TW / VL);
  vf in[4][4];
  for (int64_t s = 0; s < VL / g->TW; s++) {
    int64_t t = t0 + s * g->TW, i = t / g->Timg, ty = t % g->Timg / g->TW;
    const float *p = dy + (((n0 + (i < nn ? i : 0)) * g->O + co) * g->H + tm * ty) * g->W; /* (missing images: zeroed after) */
    for (int a = 0; a < tm; a++)
      for (int j = 0; j < per; j++)
        in[a][s * per + j] = tm * ty + a >= g->H ? v_zero() : v_load_n(p + a * g->W + j * VL, g->W - j * VL);
  }
  wino_dy_tf(g, in, Mg, ldm);
}

typedef struct {
  const dgeo *d;
  const float *x, *dy;
  float *ws; /* S slots, then S partial sums */
  _Atomic int64_t next; /* the next slot not yet taken */
} dw_wctx;

/* add: the block's sums added to the slot's partial sums (else they are its first: stored, the
 * slot not cleared before: a pass over 590 KiB a slot at 64 channels in 4x4 tiles) */
static void wino_dw_block(const dw_wctx *c, float *slot, float *part, int64_t blk, int add) {
  const dgeo *d = c->d;
  const wgeo *g = &d->g;
  float *V = slot + d->v, *Mg = slot + d->mg;
  wblk b = wblock(g, blk);
  wino_input(V, d->vp, slot, c->x, g, &b);
  if (g->narrow)
    for (int64_t co = 0; co < g->O; co++)
      for (int64_t t = 0; t < b.nn * g->Tr; t += VL) wino_dy_narrow(Mg + co * g->Tb + t, d->mp, c->dy, b.n0, b.nn, co, t, g);
  else
    for (int64_t i = 0; i < b.nn; i++)
      for (int64_t co = 0; co < g->O; co++)
        for (int64_t ty = b.ty0; ty < b.ty1; ty++)
          wino_dy_row(Mg + co * g->Tb + i * g->Tr + (ty - b.ty0) * g->TW, d->mp,
                      c->dy + ((b.n0 + i) * g->O + co) * g->H * g->W, ty, g);
  /* the lanes summed: whole vectors over the block's tiles; past the rows' stores, and in the
   * channels past the last (up to a whole register tile), zeros (the stores' lanes past TW are zeros in dM) */
  int64_t used = wblock_used(g, &b), Tv = up((b.nn - 1) * g->Tr + (b.ty1 - b.ty0) * g->TW, VL);
  for (int xi = 0; xi < g->P; xi++) {
    for (int64_t r = 0; r < d->Ip; r++)
      zero_floats(V + xi * d->vp + r * g->Tb + (r < g->I ? used : 0), Tv - (r < g->I ? used : 0));
    for (int64_t r = 0; r < d->Op; r++)
      zero_floats(Mg + xi * d->mp + r * g->Tb + (r < g->O ? used : 0), Tv - (r < g->O ? used : 0));
  }
  int64_t nit = d->Ip / DCI, nct = d->Op / DCO;
  for (int xi = 0; xi < g->P; xi++)
    for (int64_t ct = 0; ct < nct; ct++) {
      const float *m = Mg + xi * d->mp + DCO * ct * g->Tb;
      for (int64_t it = 0; it < nit; it++) {
        const float *v = V + xi * d->vp + DCI * it * g->Tb;
        vf acc[DCO][DCI];
        for (int a = 0; a < DCO; a++)
          for (int b = 0; b < DCI; b++) acc[a][b] = v_zero();
        for (int64_t t = 0; t < Tv; t += VL) {
          vf mv[DCO], vv[DCI];
          for (int a = 0; a < DCO; a++) {
            mv[a] = v_load(m + a * g->Tb + t);
            V_PIN(mv[a]); /* in registers: GCC would fold the loads into the FMAs */
          }
          for (int b = 0; b < DCI; b++) {
            vv[b] = v_load(v + b * g->Tb + t);
            V_PIN(vv[b]);
          }
          for (int a = 0; a < DCO; a++)
            for (int b = 0; b < DCI; b++) acc[a][b] = v_fma(mv[a], vv[b], acc[a][b]);
        }
        /* the tile's sums, row by row, four at a time (DCO x DCI is a multiple of 4) */
        float *p = part + ((xi * nct + ct) * nit + it) * (DCO * DCI);
        const vf *r = &acc[0][0];
        for (int q = 0; q < DCO * DCI; q += 4) v_sum4_add(p + q, add, r[q], r[q + 1], r[q + 2], r[q + 3]);
      }
    }
}

/* A thread's range [a, b) takes slots one at a time until none is left (as wino_range takes
 * blocks), each with its fixed blocks and partial sums, in slot a's scratch (one thread's
 * scratch stays in cache): the sums' order is the shape's whichever thread runs a slot. */
static void wino_dw_range(void *vc, int64_t a, int64_t b) {
  dw_wctx *c = vc;
  const dgeo *d = c->d;
  (void)b;
  int first = 1;
  for (int64_t s; (s = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed)) < d->S; first = 0) {
    if (first) wino_planes_clear(c->ws + a * d->slot, &d->g);
    float *part = c->ws + d->S * d->slot + s * d->part;
    int64_t b0 = s * d->g.nblk / d->S;
    for (int64_t blk = b0; blk < (s + 1) * d->g.nblk / d->S; blk++) wino_dw_block(c, c->ws + a * d->slot, part, blk, blk > b0);
  }
}

typedef struct {
  const dgeo *d;
  float *parts;
  float *dw;
} dw_fctx;

/* The slots' partial sums added into the first, in slot order. */
static void wino_dw_sum(void *vc, int64_t a, int64_t b) {
  dw_fctx *c = vc;
  for (int64_t s = 1; s < c->d->S; s++) {
    const float *p = c->parts + s * c->d->part;
    for (int64_t i = a; i < b; i++) c->parts[i] += p[i];
  }
}

/* o[0, os, .. 5 os) = G' u for F(2, 5)'s G (wino_g) and six values u[0, us, ..). */
static void wino_gt5(const float *u, int64_t us, float *o, int64_t os) {
  float sp = u[us] + u[2 * us], sm = u[us] - u[2 * us], tp = u[3 * us] + u[4 * us], tm = u[3 * us] - u[4 * us];
  o[0] = 0.25f * u[0] - sp / 6.0f + tp / 24.0f;
  o[os] = -sm / 6.0f + tm / 12.0f;
  o[2 * os] = (tp - sp) / 6.0f;
  o[3 * os] = -sm / 6.0f + tm / 3.0f;
  o[4 * os] = -sp / 6.0f + 2.0f * tp / 3.0f + u[5 * us];
}

/* o[0, os, os 2) = G' u for F(4, 3)'s G (wino_g) and six values u[0, us, ..). */
static void wino_gt43(const float *u, int64_t us, float *o, int64_t os) {
  float sp = u[us] + u[2 * us], sm = u[us] - u[2 * us], tp = u[3 * us] + u[4 * us], tm = u[3 * us] - u[4 * us];
  o[0] = 0.25f * u[0] - sp * (1.0f / 6.0f) + tp * (1.0f / 24.0f);
  o[os] = -sm * (1.0f / 6.0f) + tm * (1.0f / 12.0f);
  o[2 * os] = (tp - sp) * (1.0f / 6.0f) + u[5 * us];
}

/* G' u for a 6-point tile: F(2, 5)'s (r = 5) or F(4, 3)'s (r = 3). */
static inline void wino_gt6(int r, const float *u, int64_t us, float *o, int64_t os) {
  if (r == 5) wino_gt5(u, us, o, os);
  else wino_gt43(u, us, o, os);
}

/* dw[co][ci] += G' dU G. */
static void wino_dw_final(void *vc, int64_t a, int64_t b) {
  dw_fctx *c = vc;
  const dgeo *d = c->d;
  int64_t I = d->g.I, nit = d->Ip / DCI, nct = d->Op / DCO;
  int P = d->g.P;
  for (int64_t pair = a; pair < b; pair++) {
    int64_t co = pair / I, ci = pair % I;
    float u[36];
    for (int xi = 0; xi < P; xi++)
      u[xi] = c->parts[((xi * nct + co / DCO) * nit + ci / DCI) * (DCO * DCI) + (co % DCO) * DCI + ci % DCI];
    if (d->g.n == 6) { /* F(2x2, 5x5), F(4x4, 3x3) */
      int r = d->g.r;
      float t[5][6], *w = c->dw + pair * r * r, o[5];
      for (int j = 0; j < 6; j++) wino_gt6(r, u + j, 6, &t[0][j], 6); /* G' dU, column j */
      for (int k = 0; k < r; k++) {                                    /* (G' dU) G, row k */
        wino_gt6(r, t[k], 1, o, 1);
        for (int l = 0; l < r; l++) w[k * r + l] += o[l];
      }
      continue;
    }
    float t[3][4];
    for (int j = 0; j < 4; j++) { /* G' dU: rows u0 + (u1 + u2) / 2, (u1 - u2) / 2, (u1 + u2) / 2 + u3 */
      t[0][j] = u[j] + 0.5f * (u[4 + j] + u[8 + j]);
      t[1][j] = 0.5f * (u[4 + j] - u[8 + j]);
      t[2][j] = 0.5f * (u[4 + j] + u[8 + j]) + u[12 + j];
    }
    float *w = c->dw + pair * 9;
    for (int k = 0; k < 3; k++) { /* (G' dU) G */
      w[k * 3 + 0] += t[k][0] + 0.5f * (t[k][1] + t[k][2]);
      w[k * 3 + 1] += 0.5f * (t[k][1] - t[k][2]);
      w[k * 3 + 2] += 0.5f * (t[k][1] + t[k][2]) + t[k][3];
    }
  }
}

/* ---- the entry points ---------------------------------------------------------------------- */

/* 3x3 pad 1 or 5x5 pad 2, stride 1; at 8 channels or more each way: with fewer (a network's
 * first layer, on 1 or 3 image channels) the transforms outweigh the products saved, and the
 * direct kernel is faster (28x28, 1 -> 16 channels, 3x3: 18 against 23 GFLOP/s forward, 11
 * against 20 weight gradient). The kernels themselves take any channel count (test_conv_emulated
 * runs them on 2-40). */
static int wino_fits(const tdm_conv_shape *s) {
  return s->stride == 1 && s->KH == s->KW && ((s->KH == 3 && s->pad == 1) || (s->KH == 5 && s->pad == 2)) &&
         s->OH == s->H && s->OW == s->W && s->Ci >= 8 && s->Co >= 8;
}

/* U first, then the slots; for both directions (the input gradient swaps I and O), and the
 * weight gradient's slots and partial sums; for either tile size (the caller's choice may change
 * between the sizing and the call). */
static int64_t wino_ws_any(const tdm_conv_shape *s) {
  int64_t best = 0;
  for (int tm = 2; tm <= wino_tm(s, 4); tm += 2) {
    for (int d = 0; d < 2; d++) {
      wgeo g;
      wgeo_of(wino_r(s), tm, s->N, d ? s->Co : s->Ci, d ? s->Ci : s->Co, s->H, s->W, wino_tiles(tm), 0, &g);
      int64_t f = up(wino_u_floats(&g), 16) + wino_slots(&g) * g.slot;
      if (f > best) best = f;
    }
    int64_t d = wino_dw_floats(s, tm);
    if (d > best) best = d;
  }
  return best + 16; /* + alignment */
}

static int64_t wino_ws_floats(const tdm_conv_shape *s) { return wino_fits(s) ? wino_ws_any(s) : 0; }

static void wino_run(float *y, const float *x, const float *w, const float *b, float *ws, int flip, int add, int r,
                     int tm, int64_t N, int64_t I, int64_t O, int64_t H, int64_t W) {
  wgeo g;
  wgeo_of(r, tm, N, I, O, H, W, wino_tiles(tm), 0, &g);
  ws = aligned(ws);
  float *U = ws;
  wino_filters(U, w, &g, flip);
  wino_ctx c = {&g, x, y, U, b, ws + up(wino_u_floats(&g), 16), add, 0};
  tdm_parallel_for(wino_slots(&g), 1, wino_range, &c);
}

/* tile: 4 for F(4x4, 3x3) on 3x3 kernels, 2 for F(2x2, 3x3) (5x5 kernels: F(2x2, 5x5) either way) */
static void wino_fwd(float *out, const float *x, const float *w, const float *b, float *ws, const tdm_conv_shape *s,
                     int tile) {
  wino_run(out, x, w, b, ws, 0, 0, wino_r(s), wino_tm(s, tile), s->N, s->Ci, s->Co, s->H, s->W);
}

/* dx (= or +=) the convolution of dout with w flipped and transposed. */
static void wino_dx(float *dx, int dx_set, const float *dout, const float *w, float *ws, const tdm_conv_shape *s,
                    int tile) {
  wino_run(dx, dout, w, NULL, ws, 1, !dx_set, wino_r(s), wino_tm(s, tile), s->N, s->Co, s->Ci, s->H, s->W);
}

/* dw += the weight gradient (dw's layout: w's): 1, or 0 where the partial sums would be too
 * large (beyond WINO_DW_PARTS: nothing done, the direct kernel's to do). F(4x4, 3x3)'s 36 points
 * reach it at fewer channels than F(2x2, 3x3)'s 16: there the smaller tile runs. */
static int wino_dw(float *dw, const float *dout, const float *x, float *ws, const tdm_conv_shape *s, int tile) {
  dgeo d;
  dgeo_of(s, wino_tm(s, tile), &d);
  if (d.S * d.part > WINO_DW_PARTS) {
    if (d.g.tm == 2) return 0;
    dgeo_of(s, 2, &d);
    if (d.S * d.part > WINO_DW_PARTS) return 0;
  }
  ws = aligned(ws);
  dw_wctx c = {&d, x, dout, ws, 0};
  tdm_parallel_for(d.S, 1, wino_dw_range, &c);
  dw_fctx f = {&d, ws + d.S * d.slot, dw};
  tdm_parallel_for(d.part, 1024, wino_dw_sum, &f);
  tdm_parallel_for(s->Co * s->Ci, 16, wino_dw_final, &f);
  return 1;
}
