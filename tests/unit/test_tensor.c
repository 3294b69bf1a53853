/* Tensors: dtype conversions (round to nearest even), views and copies, argument checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tdm_test.h"

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_bf16(void) {
  CHECK(tdm_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(tdm_f32_to_bf16(-2.0f) == 0xc000);
  CHECK(tdm_f32_to_bf16(f_of(0x3f808000)) == 0x3f80); /* tie, even stays */
  CHECK(tdm_f32_to_bf16(f_of(0x3f818000)) == 0x3f82); /* tie, odd rounds up */
  CHECK(tdm_f32_to_bf16(f_of(0x3f808001)) == 0x3f81); /* above the tie */
  CHECK(tdm_f32_to_bf16(f_of(0x7f7fffff)) == 0x7f80); /* max float rounds to inf */
  uint16_t nan = tdm_f32_to_bf16(NAN);
  CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f));
  for (int i = 0; i < 65536; i++) { /* every bf16 survives the round trip */
    float f = tdm_bf16_to_f32((uint16_t)i);
    if (!isnan(f)) CHECK(tdm_f32_to_bf16(f) == i);
  }
}

static void test_f16(void) {
  CHECK(tdm_f32_to_f16(1.0f) == 0x3c00);
  CHECK(tdm_f32_to_f16(65504.0f) == 0x7bff);
  CHECK(tdm_f32_to_f16(65519.0f) == 0x7bff);
  CHECK(tdm_f32_to_f16(65520.0f) == 0x7c00); /* rounds to infinity */
  CHECK(tdm_f32_to_f16(-INFINITY) == 0xfc00);
  CHECK(tdm_f32_to_f16(5.9604645e-8f) == 0x0001); /* smallest subnormal */
  CHECK(tdm_f32_to_f16(2.9802322e-8f) == 0x0000); /* half of it: tie to even (0) */
  CHECK(tdm_f32_to_f16(4.4703484e-8f) == 0x0001); /* 0.75 of it rounds up */
  CHECK(tdm_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie between 1 and 1+2^-10: even */
  CHECK(tdm_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02); /* tie, odd rounds up */
  CHECK((tdm_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (tdm_f32_to_f16(NAN) & 0x3ff));
  for (int i = 0; i < 65536; i++) {
    float f = tdm_f16_to_f32((uint16_t)i);
    if (!isnan(f)) CHECK(tdm_f32_to_f16(f) == i);
  }
  CHECK(tdm_f16_to_f32(0x3555) == 0.333251953125f);
}

static void test_convert_and_copy(void) {
  int64_t s[2] = {2, 3};
  tdm_tensor *a, *b;
  CHECK_OK(tdm_tensor_create(&a, TDM_F32, 2, s));
  CHECK_OK(tdm_tensor_create(&b, TDM_BF16, 2, s));
  float *d = tdm_tensor_data(a);
  for (int i = 0; i < 6; i++) d[i] = (float)i * 0.5f - 1.0f;
  CHECK_OK(tdm_tensor_copy(b, a));
  for (int i = 0; i < 6; i++) CHECK(tdm_tensor_get(b, i) == d[i]); /* exactly representable */
  int32_t ints[6];
  CHECK_OK(tdm_convert(ints, TDM_I32, d, TDM_F32, 6));
  CHECK(ints[5] == 1 && ints[0] == -1);
  CHECK(tdm_convert(ints, (tdm_dtype)42, d, TDM_F32, 6) == TDM_ERR_INVALID_ARG);
  int64_t s2[2] = {3, 2};
  tdm_tensor *c;
  CHECK_OK(tdm_tensor_create(&c, TDM_F32, 2, s2));
  CHECK(tdm_tensor_copy(c, a) == TDM_ERR_INVALID_ARG);
  CHECK_ERR_HAS("(3, 2)");
  tdm_tensor_destroy(a);
  tdm_tensor_destroy(b);
  tdm_tensor_destroy(c);
}

static void test_views(void) {
  tdm_tape *tp;
  CHECK_OK(tdm_tape_create(&tp, 0));
  int64_t s[3] = {2, 3, 4};
  float data[24];
  for (int i = 0; i < 24; i++) data[i] = (float)i;
  tdm_tensor *x = tdm_from_data(tp, TDM_F32, 3, s, data);
  int perm[3] = {2, 0, 1};
  tdm_tensor *p = tdm_permute(tp, x, perm); /* p[k][i][j] = x[i][j][k] */
  CHECK(tdm_tensor_dim(p, 0) == 4 && tdm_tensor_dim(p, 1) == 2 && tdm_tensor_dim(p, 2) == 3);
  CHECK(!tdm_tensor_is_contiguous(p) && tdm_tensor_data(p) == tdm_tensor_data(x)); /* shares data */
  CHECK(tdm_tensor_get(p, 1 * 6 + 1 * 3 + 2) == 1 * 12 + 2 * 4 + 1);
  tdm_tensor *sl = tdm_slice(tp, x, 2, 1, 2); /* x[:, :, 1:3] */
  CHECK(tdm_tensor_numel(sl) == 12 && tdm_tensor_get(sl, 0) == 1 && tdm_tensor_get(sl, 3) == 6);
  tdm_tensor *c = tdm_contiguous(tp, sl);
  CHECK(tdm_tensor_is_contiguous(c) && ((float *)tdm_tensor_data(c))[11] == 22);
  int64_t r[2] = {-1, 6};
  tdm_tensor *rs = tdm_reshape(tp, x, 2, r);
  CHECK(rs && tdm_tensor_dim(rs, 0) == 4 && tdm_tensor_data(rs) == tdm_tensor_data(x));
  tdm_tensor *t = tdm_transpose(tp, x, 0, -1);
  CHECK(t && tdm_tensor_dim(t, 0) == 4 && tdm_tensor_dim(t, 2) == 2);
  CHECK(tdm_slice(tp, x, 1, 2, 2) == NULL && strstr(tdm_tape_error(tp), "outside axis 1"));
  tdm_tape_destroy(tp);
}

static void test_create_rejects_bad_shapes(void) {
  tdm_tensor *t = NULL;
  int64_t neg[2] = {2, -1};
  CHECK(tdm_tensor_create(&t, TDM_F32, 2, neg) == TDM_ERR_INVALID_ARG && t == NULL);
  CHECK_ERR_HAS("dimension 1 is -1");
  int64_t ok[1] = {1};
  CHECK(tdm_tensor_create(&t, TDM_F32, 9, ok) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_tensor_create(&t, (tdm_dtype)99, 1, ok) == TDM_ERR_INVALID_ARG);
  CHECK(tdm_dtype_size(TDM_BF16) == 2 && !strcmp(tdm_dtype_name(TDM_I64), "i64"));
}

/* tdm_k_gemm splits large products over the pool: every layout matches a double-precision
 * reference on 1 and on 3 threads, and repeats bit for bit on the same thread count (OpenBLAS
 * picks its small-matrix kernel by size, so the bits may differ between thread counts);
 * attention (heads side by side, GEMMs nested in the pool's ranges) agrees across thread counts. */
static void test_gemm_split_is_exact(void) {
  int64_t shapes[2][3] = {{300, 200, 50}, {70, 520, 40}}; /* split along M, along N */
  for (int s = 0; s < 2; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
        float *C1 = malloc(sizeof(float) * (size_t)(M * N)), *C3 = malloc(sizeof(float) * (size_t)(M * N));
        tdm_rng r;
        tdm_rng_seed(&r, 7);
        for (int64_t i = 0; i < M * K; i++) A[i] = tdm_rng_normal(&r);
        for (int64_t i = 0; i < K * N; i++) B[i] = tdm_rng_normal(&r);
        for (int64_t i = 0; i < M * N; i++) C1[i] = C3[i] = 0.5f;
        int64_t lda = ta ? M : K, ldb = tb ? K : N;
        CHECK_OK(tdm_set_num_threads(1));
        tdm_k_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C1, N);
        CHECK_OK(tdm_set_num_threads(3));
        tdm_k_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C3, N);
        double worst = 0;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double ref = 0.5;
            for (int64_t k = 0; k < K; k++)
              ref += 0.5 * (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (double)(tb ? B[j * ldb + k] : B[k * ldb + j]);
            double d = fmax(fabs(ref - C1[i * N + j]), fabs(ref - C3[i * N + j]));
            if (d > worst) worst = d;
          }
        CHECK_MSG(worst < 1e-4, "gemm %d%d %lldx%lldx%lld: max error %g against the reference", ta, tb, (long long)M,
                  (long long)N, (long long)K, worst);
        for (int64_t i = 0; i < M * N; i++) C1[i] = 0.5f;
        tdm_k_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C1, N);
        CHECK_MSG(memcmp(C1, C3, sizeof(float) * (size_t)(M * N)) == 0, "gemm %d%d: two runs on 3 threads differ", ta, tb);
        free(A), free(B), free(C1), free(C3);
      }
  int64_t Bt = 2, T = 40, C = 48, NH = 3;
  float *qkv = malloc(sizeof(float) * (size_t)(Bt * T * 3 * C)), *o1 = malloc(sizeof(float) * (size_t)(Bt * T * C)),
        *o2 = malloc(sizeof(float) * (size_t)(Bt * T * C)), *att = malloc(sizeof(float) * (size_t)(Bt * NH * T * T));
  tdm_rng r;
  tdm_rng_seed(&r, 9);
  for (int64_t i = 0; i < Bt * T * 3 * C; i++) qkv[i] = tdm_rng_normal(&r);
  CHECK_OK(tdm_set_num_threads(1));
  tdm_k_attention_fwd(o1, att, qkv, Bt, T, C, NH);
  CHECK_OK(tdm_set_num_threads(2));
  tdm_k_attention_fwd(o2, att, qkv, Bt, T, C, NH);
  CHECK(memcmp(o1, o2, sizeof(float) * (size_t)(Bt * T * C)) == 0);
  CHECK_OK(tdm_set_num_threads(1));
  free(qkv), free(o1), free(o2), free(att);
}

/* Attention products are blocked along the causal mask (64 rows): at T = 150 (three blocks, the
 * last partial) forward and backward match a plain double-precision implementation. */
static void test_attention_blocks_match_reference(void) {
  enum { B = 2, T = 150, C = 32, NH = 2, HS = C / NH };
  float *qkv = malloc(sizeof(float) * B * T * 3 * C), *out = malloc(sizeof(float) * B * T * C),
        *att = malloc(sizeof(float) * B * NH * T * T), *scratch = malloc(sizeof(float) * B * NH * T * T),
        *dout = malloc(sizeof(float) * B * T * C), *dqkv = malloc(sizeof(float) * B * T * 3 * C);
  double *P = malloc(sizeof(double) * T * T), *dP = malloc(sizeof(double) * T * T);
  double *rq = calloc((size_t)B * T * 3 * C, sizeof(double));
  tdm_rng r;
  tdm_rng_seed(&r, 5);
  for (int i = 0; i < B * T * 3 * C; i++) qkv[i] = tdm_rng_normal(&r), dqkv[i] = 0.25f;
  for (int i = 0; i < B * T * C; i++) dout[i] = tdm_rng_normal(&r);
  CHECK_OK(tdm_set_num_threads(2));
  tdm_k_attention_fwd(out, att, qkv, B, T, C, NH);
  tdm_k_attention_bwd(dqkv, scratch, dout, att, qkv, B, T, C, NH, 1);
  CHECK_OK(tdm_set_num_threads(1));
  double worst_o = 0, worst_g = 0, scale = 1.0 / sqrt((double)HS);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
#define Q(i, d) (double)qkv[((b * T) + (i)) * 3 * C + h * HS + (d)]
#define K(i, d) (double)qkv[((b * T) + (i)) * 3 * C + C + h * HS + (d)]
#define V(i, d) (double)qkv[((b * T) + (i)) * 3 * C + 2 * C + h * HS + (d)]
#define DO(i, d) (double)dout[((b * T) + (i)) * C + h * HS + (d)]
#define G(i, part, d) rq[((b * T) + (i)) * 3 * C + (part) * C + h * HS + (d)]
      for (int i = 0; i < T; i++) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; j++) {
          double sc = 0;
          for (int d = 0; d < HS; d++) sc += Q(i, d) * K(j, d);
          P[i * T + j] = sc * scale;
          if (P[i * T + j] > mx) mx = P[i * T + j];
        }
        for (int j = 0; j <= i; j++) sum += (P[i * T + j] = exp(P[i * T + j] - mx));
        for (int j = 0; j < T; j++) P[i * T + j] = j <= i ? P[i * T + j] / sum : 0;
        for (int d = 0; d < HS; d++) {
          double o = 0;
          for (int j = 0; j <= i; j++) o += P[i * T + j] * V(j, d);
          double e = fabs(o - out[((b * T) + i) * C + h * HS + d]);
          if (e > worst_o) worst_o = e;
        }
      }
      for (int i = 0; i < T; i++) { /* dP = dO V^T, dS = P (dP - rowdot) */
        double dot = 0;
        for (int j = 0; j <= i; j++) {
          double v = 0;
          for (int d = 0; d < HS; d++) v += DO(i, d) * V(j, d);
          dP[i * T + j] = v;
          dot += v * P[i * T + j];
        }
        for (int j = 0; j <= i; j++) dP[i * T + j] = P[i * T + j] * (dP[i * T + j] - dot);
      }
      for (int i = 0; i < T; i++)
        for (int d = 0; d < HS; d++) {
          double dq = 0.25, dk = 0.25, dv = 0.25;
          for (int j = 0; j <= i; j++) dq += scale * dP[i * T + j] * K(j, d);
          for (int j = i; j < T; j++) dk += scale * dP[j * T + i] * Q(j, d), dv += P[j * T + i] * DO(j, d);
          G(i, 0, d) = dq, G(i, 1, d) = dk, G(i, 2, d) = dv;
        }
#undef Q
#undef K
#undef V
#undef DO
#undef G
    }
  for (int i = 0; i < B * T * 3 * C; i++) {
    double e = fabs(rq[i] - dqkv[i]);
    if (e > worst_g) worst_g = e;
  }
  CHECK_MSG(worst_o < 1e-5 && worst_g < 1e-4, "attention T=%d: worst |diff| output %g, gradient %g", T, worst_o, worst_g);
  free(qkv), free(out), free(att), free(scratch), free(dout), free(dqkv), free(P), free(dP), free(rq);
}

TDM_TEST_MAIN(T(test_attention_blocks_match_reference), T(test_gemm_split_is_exact), T(test_bf16), T(test_f16), T(test_convert_and_copy), T(test_views), T(test_create_rejects_bad_shapes))
