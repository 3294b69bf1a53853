/* Every CUDA kernel of src/cuda/ against tandem's CPU kernel (tandem/kernels.h) or optimizer on
 * the same inputs. Tolerances (max |gpu - cpu| <= atol + rtol |cpu|), per dtype:
 *   fp32 element-wise, norms, softmax, cross-entropy, AdamW:   atol 1e-5, rtol 1e-4 (order of sums, FMA)
 *   fp32 products (cuBLAS, no TF32), attention:                atol 1e-4, rtol 1e-4
 *   TF32 products (10-bit mantissa inputs):                    atol 3e-2, rtol 1e-2
 *   bf16 products, fp32 accumulation, against the CPU product of the same bf16-rounded inputs:
 *                                                              atol 1e-4, rtol 1e-4; bf16 output: rtol 2^-7
 *   f32 -> bf16 conversion: bit for bit (round to nearest even on both sides).
 *   bf16 outputs of fp32 kernels (layernorm, bias + GELU, the loss's gradient): within one bf16
 *   ulp of the CPU's fp32 value (rtol 2^-7: two values a hair apart can round to neighbours; atol
 *   1e-6 for the forward, 1e-9 for the gradient).
 *   flash attention (bf16 q, k, v, dO, P, dS; fp32 accumulation) against the CPU attention of the
 *   same bf16-rounded q, k, v and dO: out atol 1e-2 + rtol 1e-2, dqkv atol 3e-2 + rtol 3e-2, and
 *   each with a relative L2 error ||gpu - cpu|| / ||cpu|| below 1e-2.
 * Skips (exit 77, ctest "Skipped") when the machine has no CUDA device. */
#include "tdm_test.h"
#include "cuda/cuda_kernels.h"
#include "tandem/cuda.h"
#include "tandem/kernels.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { /* uniform [-1, 1) */
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *host_rand(int64_t n, float scale) {
  float *p = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) p[i] = frand() * scale;
  return p;
}
static void *dev_from(const void *h, size_t bytes) {
  void *d = NULL;
  CHECK_OK(tdm_cuda_malloc(&d, bytes, "test buffer"));
  if (d && h) CHECK_OK(tdm_cuda_to_device(d, h, bytes));
  else if (d) CHECK_OK(tdm_cuda_memset0(d, bytes));
  return d;
}
static float *from_dev(const void *d, int64_t n) {
  float *h = malloc((size_t)n * sizeof(float));
  CHECK_OK(tdm_cuda_sync("test"));
  CHECK_OK(tdm_cuda_to_host(h, d, (size_t)n * sizeof(float)));
  return h;
}
static float *from_dev_bf16(const void *d, int64_t n) {
  uint16_t *h = malloc((size_t)n * 2);
  float *f = malloc((size_t)n * sizeof(float));
  CHECK_OK(tdm_cuda_sync("test"));
  CHECK_OK(tdm_cuda_to_host(h, d, (size_t)n * 2));
  tdm_k_bf16_to_f32(f, h, n);
  free(h);
  return f;
}
static double rel_l2(const float *got, const float *ref, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) d += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]), r += (double)ref[i] * ref[i];
  return r > 0 ? sqrt(d / r) : sqrt(d);
}
static int close_to(const char *label, const float *got, const float *ref, int64_t n, double atol, double rtol) {
  double mabs;
  double r = tdm_test_rel_err(got, ref, n, atol, rtol, &mabs);
  printf("    %-34s max |diff| %.3g (%.3g of tolerance)\n", label, mabs, r);
  CHECK_MSG(r <= 1.0, "%s: off by %.3g x tolerance (atol %g, rtol %g)", label, r, atol, rtol);
  return r <= 1.0;
}

static void gemm_case(int ta, int tb, int tf32, int bf16, int c_bf16) {
  int64_t M = 67, N = 45, K = 129;
  float alpha = 0.7f, beta = 0.3f;
  float *A = host_rand(M * K, 1), *B = host_rand(K * N, 1), *C = host_rand(M * N, 1), *ref = malloc((size_t)(M * N) * 4);
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  if (bf16) tdm_k_round_bf16(A, A, M * K), tdm_k_round_bf16(B, B, K * N);
  memcpy(ref, C, (size_t)(M * N) * 4);
  tdm_k_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, ref, N);
  void *dA, *dB, *dC;
  if (bf16) {
    uint16_t *a16 = malloc((size_t)(M * K) * 2), *b16 = malloc((size_t)(K * N) * 2);
    tdm_k_f32_to_bf16(a16, A, M * K), tdm_k_f32_to_bf16(b16, B, K * N);
    dA = dev_from(a16, (size_t)(M * K) * 2), dB = dev_from(b16, (size_t)(K * N) * 2);
    free(a16), free(b16);
  } else {
    dA = dev_from(A, (size_t)(M * K) * 4), dB = dev_from(B, (size_t)(K * N) * 4);
  }
  float *got;
  if (c_bf16) { /* beta 0 with a bf16 output */
    memset(ref, 0, (size_t)(M * N) * 4);
    tdm_k_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, ref, N);
    dC = dev_from(NULL, (size_t)(M * N) * 2);
    CHECK(tdm_cu_gemm(ta, tb, M, N, K, alpha, dA, lda, dB, ldb, 0.0f, dC, N, TDM_CU_BF16, 1) == 0);
    uint16_t *c16 = malloc((size_t)(M * N) * 2);
    CHECK_OK(tdm_cuda_sync("gemm"));
    CHECK_OK(tdm_cuda_to_host(c16, dC, (size_t)(M * N) * 2));
    got = malloc((size_t)(M * N) * 4);
    tdm_k_bf16_to_f32(got, c16, M * N);
    free(c16);
  } else {
    dC = dev_from(C, (size_t)(M * N) * 4);
    tdm_cu_gemm_set_tf32(tf32);
    CHECK(tdm_cu_gemm(ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, N, bf16 ? TDM_CU_BF16 : TDM_CU_F32, 0) == 0);
    tdm_cu_gemm_set_tf32(0);
    got = from_dev(dC, M * N);
  }
  char label[64];
  snprintf(label, sizeof label, "gemm %s%s %s", ta ? "T" : "N", tb ? "T" : "N",
           c_bf16 ? "bf16->bf16" : bf16 ? "bf16->f32" : tf32 ? "tf32" : "f32");
  if (c_bf16) close_to(label, got, ref, M * N, 1e-3, 1.0 / 128);
  else if (tf32) close_to(label, got, ref, M * N, 3e-2, 1e-2);
  else close_to(label, got, ref, M * N, 1e-4, 1e-4);
  tdm_cuda_free(dA), tdm_cuda_free(dB), tdm_cuda_free(dC);
  free(A), free(B), free(C), free(ref), free(got);
}

static void test_gemm(void) {
  for (int t = 0; t < 4; t++) gemm_case(t >> 1, t & 1, 0, 0, 0);
  for (int t = 0; t < 4; t++) gemm_case(t >> 1, t & 1, 1, 0, 0);
  for (int t = 0; t < 4; t++) gemm_case(t >> 1, t & 1, 0, 1, 0);
  gemm_case(0, 1, 0, 1, 1);
}

static void test_gemm_batched(void) {
  int64_t M = 33, N = 17, K = 40, nb = 5;
  float *A = host_rand(nb * M * K, 1), *B = host_rand(nb * K * N, 1), *ref = calloc((size_t)(nb * M * N), 4);
  for (int64_t b = 0; b < nb; b++) tdm_k_gemm(0, 1, M, N, K, 1.0f, A + b * M * K, K, B + b * K * N, K, 0.0f, ref + b * M * N, N);
  float *dA = dev_from(A, (size_t)(nb * M * K) * 4), *dB = dev_from(B, (size_t)(nb * K * N) * 4), *dC = dev_from(NULL, (size_t)(nb * M * N) * 4);
  CHECK(tdm_cu_gemm_batched(0, 1, M, N, K, 1.0f, dA, K, M * K, dB, K, K * N, 0.0f, dC, N, M * N, nb, TDM_CU_F32, 0) == 0);
  float *got = from_dev(dC, nb * M * N);
  close_to("gemm batched NT f32", got, ref, nb * M * N, 1e-4, 1e-4);
  tdm_cuda_free(dA), tdm_cuda_free(dB), tdm_cuda_free(dC);
  free(A), free(B), free(ref), free(got);
}

static void test_bias_residual(void) {
  int64_t N = 300, O = 77;
  float *x = host_rand(N * O, 1), *b = host_rand(O, 1), *y = host_rand(N * O, 1), *res = host_rand(N * O, 1);
  float *ref = malloc((size_t)(N * O) * 4), *dref = calloc((size_t)O, 4);
  for (int64_t i = 0; i < N * O; i++) ref[i] = res[i] + (y[i] + b[i % O]);
  float *dout = dev_from(NULL, (size_t)(N * O) * 4), *dres = dev_from(res, (size_t)(N * O) * 4),
        *dy = dev_from(y, (size_t)(N * O) * 4), *db = dev_from(b, (size_t)O * 4);
  tdm_cu_residual_bias_add(dout, dres, dy, db, N, O);
  float *got = from_dev(dout, N * O);
  close_to("residual + bias add", got, ref, N * O, 1e-30, 1e-7);
  free(got);
  /* bias forward: x + b per row */
  float *dx = dev_from(x, (size_t)(N * O) * 4);
  tdm_cu_bias_fwd(dx, db, N, O);
  for (int64_t i = 0; i < N * O; i++) ref[i] = x[i] + b[i % O];
  got = from_dev(dx, N * O);
  close_to("bias forward", got, ref, N * O, 1e-30, 1e-7);
  free(got);
  /* bias backward: db += column sums of x (db starts at b) */
  for (int64_t c = 0; c < O; c++) {
    double s = b[c];
    for (int64_t r = 0; r < N; r++) s += x[r * O + c];
    dref[c] = (float)s;
  }
  CHECK_OK(tdm_cuda_to_device(dx, x, (size_t)(N * O) * 4));
  tdm_cu_bias_bwd(db, dx, N, O);
  got = from_dev(db, O);
  close_to("bias backward (column sums)", got, dref, O, 1e-5, 1e-4);
  free(got);
  tdm_cuda_free(dout), tdm_cuda_free(dres), tdm_cuda_free(dy), tdm_cuda_free(db), tdm_cuda_free(dx);
  free(x), free(b), free(y), free(res), free(ref), free(dref);
}

static void test_embedding(void) {
  int64_t B = 3, T = 50, C = 40, V = 20, N = B * T; /* V < N: tokens repeat, the scatter-add meets */
  float *wte = host_rand(V * C, 1), *wpe = host_rand(T * C, 1), *dout = host_rand(N * C, 1);
  int32_t *idx = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) idx[i] = (int32_t)((i * 7 + i / 3) % V);
  float *ref = malloc((size_t)(N * C) * 4), *dwte_ref = calloc((size_t)(V * C), 4), *dwpe_ref = calloc((size_t)(T * C), 4);
  tdm_k_embedding_fwd(ref, wte, idx, 0, N, C);
  float *d_wte = dev_from(wte, (size_t)(V * C) * 4), *d_out = dev_from(NULL, (size_t)(N * C) * 4);
  int32_t *d_idx = dev_from(idx, (size_t)N * 4);
  tdm_cu_embedding_fwd(d_out, d_wte, d_idx, N, C);
  float *got = from_dev(d_out, N * C);
  close_to("embedding forward", got, ref, N * C, 1e-30, 0);
  free(got);
  tdm_k_embedding_bwd(dwte_ref, dout, idx, 0, N, C);
  float *d_dout = dev_from(dout, (size_t)(N * C) * 4), *d_dwte = dev_from(NULL, (size_t)(V * C) * 4);
  tdm_cu_embedding_bwd(d_dwte, d_dout, d_idx, N, C);
  got = from_dev(d_dwte, V * C);
  close_to("embedding backward", got, dwte_ref, V * C, 1e-5, 1e-4);
  free(got);
  /* GPT's input: wte[idx] + wpe[t]; backward into both tables */
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = 0; c < C; c++) ref[i * C + c] += wpe[(i % T) * C + c];
  float *d_wpe = dev_from(wpe, (size_t)(T * C) * 4), *d_dwpe = dev_from(NULL, (size_t)(T * C) * 4);
  tdm_cu_gpt_embed_fwd(d_out, d_wte, d_wpe, d_idx, B, T, C);
  got = from_dev(d_out, N * C);
  close_to("gpt embedding forward", got, ref, N * C, 1e-30, 1e-7);
  free(got);
  CHECK_OK(tdm_cuda_memset0(d_dwte, (size_t)(V * C) * 4));
  tdm_cu_gpt_embed_bwd(d_dwte, d_dwpe, d_dout, d_idx, B, T, C);
  for (int64_t i = 0; i < N; i++)
    for (int64_t c = 0; c < C; c++) dwpe_ref[(i % T) * C + c] += dout[i * C + c];
  got = from_dev(d_dwte, V * C);
  close_to("gpt embedding backward wte", got, dwte_ref, V * C, 1e-5, 1e-4);
  free(got);
  got = from_dev(d_dwpe, T * C);
  close_to("gpt embedding backward wpe", got, dwpe_ref, T * C, 1e-5, 1e-4);
  free(got);
  tdm_cuda_free(d_wte), tdm_cuda_free(d_out), tdm_cuda_free(d_idx), tdm_cuda_free(d_dout), tdm_cuda_free(d_dwte);
  tdm_cuda_free(d_wpe), tdm_cuda_free(d_dwpe);
  free(wte), free(wpe), free(dout), free(idx), free(ref), free(dwte_ref), free(dwpe_ref);
}

static void test_layernorm(void) {
  int64_t N = 517, C = 771; /* rows over several chunks of the dw/db kernel; C not a multiple of 32 */
  float *x = host_rand(N * C, 2), *w = host_rand(C, 1), *b = host_rand(C, 1), *dout = host_rand(N * C, 1);
  for (int64_t i = 0; i < N * C; i++) x[i] += 0.5f; /* a non-zero mean */
  float *out = malloc((size_t)(N * C) * 4), *mean = malloc((size_t)N * 4), *rstd = malloc((size_t)N * 4);
  tdm_k_layernorm_fwd(out, mean, rstd, x, w, b, N, C, 1e-5f);
  float *dx = host_rand(N * C, 1), *dw = host_rand(C, 1), *db = host_rand(C, 1); /* backward accumulates onto these */
  float *d_dx = dev_from(dx, (size_t)(N * C) * 4), *d_dw = dev_from(dw, (size_t)C * 4), *d_db = dev_from(db, (size_t)C * 4);
  tdm_k_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, N, C);
  float *d_x = dev_from(x, (size_t)(N * C) * 4), *d_w = dev_from(w, (size_t)C * 4), *d_b = dev_from(b, (size_t)C * 4),
        *d_out = dev_from(NULL, (size_t)(N * C) * 4), *d_mean = dev_from(NULL, (size_t)N * 4),
        *d_rstd = dev_from(NULL, (size_t)N * 4), *d_dout = dev_from(dout, (size_t)(N * C) * 4);
  tdm_cu_layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f);
  float *g = from_dev(d_out, N * C);
  close_to("layernorm forward", g, out, N * C, 1e-5, 1e-4);
  free(g);
  g = from_dev(d_mean, N);
  close_to("layernorm mean", g, mean, N, 1e-5, 1e-4);
  free(g);
  g = from_dev(d_rstd, N);
  close_to("layernorm rstd", g, rstd, N, 1e-5, 1e-4);
  free(g);
  uint16_t *d_out16 = dev_from(NULL, (size_t)(N * C) * 2);
  tdm_cu_layernorm_fwd_bf16(d_out16, d_mean, d_rstd, d_x, d_w, d_b, N, C, 1e-5f);
  g = from_dev_bf16(d_out16, N * C);
  close_to("layernorm forward, bf16 output", g, out, N * C, 1e-6, 1.0 / 128);
  free(g);
  tdm_cuda_free(d_out16);
  tdm_cu_layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
  g = from_dev(d_dx, N * C);
  close_to("layernorm backward dx (+=)", g, dx, N * C, 1e-5, 1e-4);
  free(g);
  g = from_dev(d_dw, C);
  close_to("layernorm backward dw (+=)", g, dw, C, 1e-4, 1e-4);
  free(g);
  g = from_dev(d_db, C);
  close_to("layernorm backward db (+=)", g, db, C, 1e-4, 1e-4);
  free(g);
  void *ds[] = {d_dx, d_dw, d_db, d_x, d_w, d_b, d_out, d_mean, d_rstd, d_dout};
  for (int k = 0; k < 10; k++) tdm_cuda_free(ds[k]);
  free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
}

static void test_gelu(void) {
  int64_t n = 100003;
  float *x = host_rand(n, 5), *dout = host_rand(n, 1), *y = malloc((size_t)n * 4), *dx = malloc((size_t)n * 4);
  tdm_k_gelu_fwd(y, x, n);
  tdm_k_gelu_bwd_set(dx, dout, x, n);
  float *d_x = dev_from(x, (size_t)n * 4), *d_y = dev_from(NULL, (size_t)n * 4), *d_dout = dev_from(dout, (size_t)n * 4),
        *d_dx = dev_from(NULL, (size_t)n * 4);
  tdm_cu_gelu_fwd(d_y, d_x, n);
  tdm_cu_gelu_bwd(d_dx, d_dout, d_x, n);
  float *g = from_dev(d_y, n);
  close_to("gelu forward", g, y, n, 1e-5, 1e-4);
  free(g);
  g = from_dev(d_dx, n);
  close_to("gelu backward", g, dx, n, 1e-5, 1e-4);
  free(g);
  /* bias + GELU in one pass: x (N, O) += b, y = gelu(x) */
  int64_t O = 1001, N = n / O;
  float *b = host_rand(O, 1), *xb = malloc((size_t)(N * O) * 4), *d_b = dev_from(b, (size_t)O * 4);
  for (int64_t i = 0; i < N * O; i++) xb[i] = x[i] + b[i % O];
  tdm_k_gelu_fwd(y, xb, N * O);
  CHECK_OK(tdm_cuda_to_device(d_x, x, (size_t)n * 4));
  tdm_cu_bias_gelu_fwd(d_y, d_x, d_b, N, O);
  g = from_dev(d_x, N * O);
  close_to("bias + gelu: biased input", g, xb, N * O, 1e-30, 1e-7);
  free(g);
  g = from_dev(d_y, N * O);
  close_to("bias + gelu: output", g, y, N * O, 1e-5, 1e-4);
  free(g);
  uint16_t *d_y16 = dev_from(NULL, (size_t)(N * O) * 2);
  CHECK_OK(tdm_cuda_to_device(d_x, x, (size_t)n * 4));
  tdm_cu_bias_gelu_fwd_bf16(d_y16, d_x, d_b, N, O);
  g = from_dev(d_x, N * O);
  close_to("bias + gelu bf16: biased input", g, xb, N * O, 1e-30, 1e-7);
  free(g);
  g = from_dev_bf16(d_y16, N * O);
  close_to("bias + gelu bf16: output", g, y, N * O, 1e-6, 1.0 / 128);
  free(g);
  tdm_cuda_free(d_y16);
  tdm_cuda_free(d_x), tdm_cuda_free(d_y), tdm_cuda_free(d_dout), tdm_cuda_free(d_dx), tdm_cuda_free(d_b);
  free(x), free(dout), free(y), free(dx), free(b), free(xb);
}

static void attention_case(int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t n = B * T * C, na = B * NH * T * T;
  float *qkv = host_rand(3 * n, 1), *dout = host_rand(n, 1), *out = malloc((size_t)n * 4), *att = malloc((size_t)na * 4);
  float *dqkv = calloc((size_t)(3 * n), 4), *scratch = malloc((size_t)na * 4), *bias = host_rand(3 * C, 1);
  float *d_qkv_unbiased = dev_from(qkv, (size_t)(3 * n) * 4);
  for (int64_t i = 0; i < 3 * n; i++) qkv[i] += bias[i % (3 * C)]; /* the CPU gets qkv + bias, the GPU adds it */
  tdm_k_attention_fwd(out, att, qkv, B, T, C, NH);
  tdm_k_attention_bwd(dqkv, scratch, dout, att, qkv, B, T, C, NH, 0);
  float *d_qkv = dev_from(qkv, (size_t)(3 * n) * 4), *d_out = dev_from(NULL, (size_t)n * 4),
        *d_qkvr = dev_from(NULL, (size_t)(3 * n) * 4), *d_att = dev_from(NULL, (size_t)na * 4),
        *d_y = dev_from(NULL, (size_t)n * 4), *d_dout = dev_from(dout, (size_t)n * 4),
        *d_dqkv = dev_from(NULL, (size_t)(3 * n) * 4), *d_dqkvr = dev_from(NULL, (size_t)(3 * n) * 4),
        *d_datt = dev_from(NULL, (size_t)na * 4), *d_dy = dev_from(NULL, (size_t)n * 4);
  float *d_bias = dev_from(bias, (size_t)(3 * C) * 4);
  tdm_cu_attention_fwd(d_out, d_qkvr, d_att, d_y, d_qkv_unbiased, d_bias, B, T, C, NH);
  tdm_cu_attention_bwd(d_dqkv, d_dqkvr, d_datt, d_dy, d_dout, d_qkvr, d_att, B, T, C, NH);
  char label[80];
  float *g = from_dev(d_out, n);
  snprintf(label, sizeof label, "attention out B%lld T%lld C%lld NH%lld", (long long)B, (long long)T, (long long)C, (long long)NH);
  close_to(label, g, out, n, 1e-4, 1e-4);
  free(g);
  g = from_dev(d_att, na);
  close_to("attention probabilities", g, att, na, 1e-5, 1e-4);
  free(g);
  g = from_dev(d_dqkv, 3 * n);
  close_to("attention backward dqkv", g, dqkv, 3 * n, 1e-4, 1e-4);
  free(g);
  void *ds[] = {d_qkv, d_out, d_qkvr, d_att, d_y, d_dout, d_dqkv, d_dqkvr, d_datt, d_dy, d_qkv_unbiased, d_bias};
  for (int k = 0; k < 12; k++) tdm_cuda_free(ds[k]);
  free(qkv), free(dout), free(out), free(att), free(dqkv), free(scratch), free(bias);
}

static void test_attention(void) {
  attention_case(2, 67, 96, 4); /* T not a multiple of 32, head size 24 */
  attention_case(1, 256, 128, 2);
}

/* The fused flash kernel against the CPU attention of the same bf16-rounded q, k, v and dO. */
static void flash_case(int64_t B, int64_t T, int64_t C, int64_t NH, int out_bf16) {
  int64_t n = B * T * C, na = B * NH * T * T;
  CHECK(tdm_cu_flash_supported(C / NH, B * NH));
  float *qkv = host_rand(3 * n, 1), *bias = host_rand(3 * C, 1), *dout = host_rand(n, 1);
  float *d_qkv = dev_from(qkv, (size_t)(3 * n) * 4), *d_bias = dev_from(bias, (size_t)(3 * C) * 4);
  float *d_dout = dev_from(dout, (size_t)n * 4);
  for (int64_t i = 0; i < 3 * n; i++) qkv[i] += bias[i % (3 * C)]; /* as the split adds it, in fp32 */
  tdm_k_round_bf16(qkv, qkv, 3 * n), tdm_k_round_bf16(dout, dout, n);
  float *out = malloc((size_t)n * 4), *att = malloc((size_t)na * 4), *scratch = malloc((size_t)na * 4);
  float *dqkv = calloc((size_t)(3 * n), 4);
  tdm_k_attention_fwd(out, att, qkv, B, T, C, NH);
  tdm_k_attention_bwd(dqkv, scratch, dout, att, qkv, B, T, C, NH, 0);
  float *d_qkvr = dev_from(NULL, (size_t)(3 * n) * 4), *d_lse = dev_from(NULL, (size_t)(B * NH * T) * 4);
  float *junk = host_rand(3 * n, 9); /* dqkv starts as garbage: backward sets it */
  float *d_drow = dev_from(NULL, (size_t)(B * NH * T) * 4), *d_dqkv = dev_from(junk, (size_t)(3 * n) * 4);
  free(junk);
  void *d_out = dev_from(NULL, (size_t)n * (out_bf16 ? 2 : 4));
  tdm_cu_attention_split(d_qkvr, d_qkv, d_bias, B, T, C, NH);
  tdm_cu_flash_attention_fwd(d_out, out_bf16, d_lse, d_qkvr, B, T, C, NH);
  tdm_cu_flash_attention_bwd(d_dqkv, d_drow, d_dout, d_out, out_bf16, d_qkvr, d_lse, B, T, C, NH);
  char label[96];
  float *g = out_bf16 ? from_dev_bf16(d_out, n) : from_dev(d_out, n);
  snprintf(label, sizeof label, "flash out B%lld T%lld hs%lld%s", (long long)B, (long long)T, (long long)(C / NH),
           out_bf16 ? " (bf16)" : "");
  close_to(label, g, out, n, 1e-2, 1e-2);
  double e = rel_l2(g, out, n);
  printf("    %-34s relative L2 error %.3g\n", "", e);
  CHECK_MSG(e < 1e-2, "%s: relative L2 error %.3g", label, e);
  free(g);
  g = from_dev(d_dqkv, 3 * n); /* set, not accumulated: the random start must be gone */
  close_to("flash backward dqkv", g, dqkv, 3 * n, 3e-2, 3e-2);
  e = rel_l2(g, dqkv, 3 * n);
  printf("    %-34s relative L2 error %.3g\n", "", e);
  CHECK_MSG(e < 1e-2, "flash dqkv: relative L2 error %.3g", e);
  free(g);
  void *ds[] = {d_qkv, d_bias, d_dout, d_qkvr, d_lse, d_drow, d_dqkv, d_out};
  for (int k = 0; k < 8; k++) tdm_cuda_free(ds[k]);
  free(qkv), free(bias), free(dout), free(out), free(att), free(scratch), free(dqkv);
}

static void test_flash_attention(void) {
  CHECK(!tdm_cu_flash_supported(24, 8) && !tdm_cu_flash_supported(64, 65536));
  flash_case(2, 67, 128, 2, 0);  /* head size 64, T past one tile by 3 */
  flash_case(2, 67, 128, 2, 1);  /* the same with a bf16 output (what the GPT keeps) */
  flash_case(1, 256, 128, 2, 0); /* four tiles */
  flash_case(1, 130, 64, 4, 0);  /* head size 16 */
  flash_case(2, 100, 128, 4, 1); /* head size 32 */
  flash_case(1, 150, 256, 2, 0); /* head size 128 */
}

static void test_cross_entropy(void) {
  int64_t N = 37, V = 1001;
  float *logits = host_rand(N * V, 4), *lse = malloc((size_t)N * 4), *dl = calloc((size_t)(N * V), 4);
  int32_t *tgt = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) tgt[i] = (int32_t)((i * 97) % V);
  int64_t count = 0, bad = -1;
  float ref_loss = tdm_k_cross_entropy_fwd(logits, tgt, 0, N, V, -100, lse, &count, &bad);
  tdm_k_cross_entropy_bwd(dl, logits, tgt, 0, N, V, -100, lse, 1.0f / (float)N);
  float *d_logits = dev_from(logits, (size_t)(N * V) * 4), *d_loss = dev_from(NULL, (size_t)N * 4), *d_sum = dev_from(NULL, 4);
  int32_t *d_tgt = dev_from(tgt, (size_t)N * 4);
  tdm_cu_cross_entropy(d_loss, d_logits, d_logits, d_tgt, N, V, 1.0f / (float)N); /* in place */
  tdm_cu_sum(d_sum, d_loss, N);
  float *s = from_dev(d_sum, 1), mean = s[0] / (float)N;
  printf("    cross-entropy mean loss %.7f (CPU %.7f)\n", mean, ref_loss);
  CHECK_NEAR(mean, ref_loss, 1e-5 + 1e-5 * fabs(ref_loss));
  float *g = from_dev(d_logits, N * V);
  close_to("cross-entropy dlogits (in place)", g, dl, N * V, 1e-7, 1e-4);
  free(g), free(s);
  /* the gradient in bf16, into its own buffer */
  uint16_t *d_dl16 = dev_from(NULL, (size_t)(N * V) * 2);
  CHECK_OK(tdm_cuda_to_device(d_logits, logits, (size_t)(N * V) * 4));
  tdm_cu_cross_entropy_bf16grad(d_loss, d_dl16, d_logits, d_tgt, N, V, 1.0f / (float)N);
  tdm_cu_sum(d_sum, d_loss, N);
  s = from_dev(d_sum, 1);
  CHECK_NEAR(s[0] / (float)N, ref_loss, 1e-5 + 1e-5 * fabs(ref_loss));
  g = from_dev_bf16(d_dl16, N * V);
  close_to("cross-entropy dlogits (bf16)", g, dl, N * V, 1e-9, 1.0 / 128);
  free(g), free(s);
  tdm_cuda_free(d_dl16);
  /* a target outside the vocabulary gives NAN for its row */
  tgt[3] = (int32_t)V;
  CHECK_OK(tdm_cuda_to_device(d_tgt, tgt, (size_t)N * 4));
  tdm_cu_cross_entropy(d_loss, NULL, d_logits, d_tgt, N, V, 1.0f);
  g = from_dev(d_loss, N);
  CHECK(isnan(g[3]) && !isnan(g[2]));
  free(g);
  tdm_cuda_free(d_logits), tdm_cuda_free(d_loss), tdm_cuda_free(d_sum), tdm_cuda_free(d_tgt);
  free(logits), free(lse), free(dl), free(tgt);
}

/* AdamW against tandem's CPU optimizer over 3 steps with clipping: two parameters, the matrix decayed. */
static void test_adamw_clip(void) {
  tdm_params *p;
  CHECK_OK(tdm_params_create(&p));
  tdm_tensor *w, *b;
  int64_t ws[2] = {300, 70}, bs[1] = {70};
  CHECK_OK(tdm_params_declare(p, "w", 2, ws, (tdm_init){TDM_INIT_NORMAL, 0, 0.5f}, 1, &w));
  CHECK_OK(tdm_params_declare(p, "b", 1, bs, (tdm_init){TDM_INIT_NORMAL, 0, 0.5f}, 0, &b));
  CHECK_OK(tdm_params_finalize(p, 7));
  int64_t n = tdm_params_numel(p);
  tdm_optim_config oc = tdm_optim_config_default(TDM_OPT_ADAMW);
  oc.lr = 1e-2f, oc.beta2 = 0.95f, oc.weight_decay = 0.1f, oc.decay_matrices_only = 1;
  tdm_optim *opt;
  CHECK_OK(tdm_optim_create(&opt, &oc, p));
  float *d_w = dev_from(tdm_params_data(p), (size_t)n * 4), *d_g = dev_from(NULL, (size_t)n * 4),
        *d_m = dev_from(NULL, (size_t)n * 4), *d_v = dev_from(NULL, (size_t)n * 4);
  double *d_part = dev_from(NULL, (TDM_CU_SUMSQ_BLOCKS + 1) * sizeof(double));
  int64_t off_b = tdm_params_offset(p, 1);
  for (int step = 1; step <= 3; step++) {
    float *gr = tdm_params_grad(p);
    for (int64_t i = 0; i < n; i++) gr[i] = frand() * (step == 2 ? 10.0f : 0.01f); /* step 2 clipped */
    CHECK_OK(tdm_cuda_to_device(d_g, gr, (size_t)n * 4));
    double ssq = 0;
    for (int64_t i = 0; i < n; i++) ssq += (double)gr[i] * gr[i];
    tdm_cu_sumsq(d_part + TDM_CU_SUMSQ_BLOCKS, d_part, d_g, n);
    double got_ssq = 0;
    CHECK_OK(tdm_cuda_sync("sumsq"));
    CHECK_OK(tdm_cuda_to_host(&got_ssq, d_part + TDM_CU_SUMSQ_BLOCKS, sizeof got_ssq));
    printf("    step %d: sum of squares %.12g (host %.12g)\n", step, got_ssq, ssq);
    CHECK_NEAR(got_ssq, ssq, 1e-12 * ssq);
    float norm = 0, gnorm = (float)sqrt(got_ssq);
    CHECK_OK(tdm_clip_grad_norm(p, 1.0f, &norm));
    CHECK_NEAR(gnorm, norm, 1e-6 * norm);
    float coef = tdm_clip_coef(gnorm, 1.0f);
    CHECK_OK(tdm_optim_step(opt, oc.lr));
    float bc1 = 1.0f - powf(oc.beta1, (float)step), bc2s = sqrtf(1.0f - powf(oc.beta2, (float)step));
    tdm_cu_adamw(d_w, d_m, d_v, d_g, off_b, oc.lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, bc1, bc2s, coef);
    tdm_cu_adamw(d_w + off_b, d_m + off_b, d_v + off_b, d_g + off_b, n - off_b, oc.lr, oc.beta1, oc.beta2, oc.eps, 0.0f,
                 bc1, bc2s, coef);
    float *got = from_dev(d_w, n);
    char label[48];
    snprintf(label, sizeof label, "AdamW + clipping, step %d", step);
    close_to(label, got, tdm_params_data(p), n, 1e-6, 1e-5);
    free(got);
  }
  int64_t ns;
  float *state = tdm_optim_state(opt, &ns);
  float *gm = from_dev(d_m, n), *gv = from_dev(d_v, n);
  close_to("AdamW first moment", gm, state, n, 1e-7, 1e-5);
  close_to("AdamW second moment", gv, state + n, n, 1e-9, 1e-5);
  free(gm), free(gv);
  tdm_cuda_free(d_w), tdm_cuda_free(d_g), tdm_cuda_free(d_m), tdm_cuda_free(d_v), tdm_cuda_free(d_part);
  tdm_optim_destroy(opt);
  tdm_params_destroy(p);
}

static void test_convert(void) {
  int64_t n = 65537;
  float *x = host_rand(n, 100);
  x[0] = 1.00390625f; /* a tie: 1 + 2^-8 rounds to even (1.0) */
  uint16_t *ref = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
  tdm_k_f32_to_bf16(ref, x, n);
  float *d_x = dev_from(x, (size_t)n * 4);
  uint16_t *d_h = dev_from(NULL, (size_t)n * 2);
  tdm_cu_f32_to_bf16(d_h, d_x, n);
  CHECK_OK(tdm_cuda_sync("convert"));
  CHECK_OK(tdm_cuda_to_host(got, d_h, (size_t)n * 2));
  CHECK_MSG(!memcmp(got, ref, (size_t)n * 2), "f32 -> bf16 differs from the CPU's rounding");
  tdm_cu_bf16_to_f32(d_x, d_h, n);
  float *back = from_dev(d_x, n), *ref_back = malloc((size_t)n * 4);
  tdm_k_bf16_to_f32(ref_back, ref, n);
  CHECK_MSG(!memcmp(back, ref_back, (size_t)n * 4), "bf16 -> f32 differs");
  printf("    f32 <-> bf16: %lld values bit for bit\n", (long long)n);
  tdm_cuda_free(d_x), tdm_cuda_free(d_h);
  free(x), free(ref), free(got), free(back), free(ref_back);
}

/* Out of device memory: a clear error naming what and how much, and the device still usable. */
static void test_oom(void) {
  void *p = NULL;
  tdm_status st = tdm_cuda_malloc(&p, (size_t)1 << 50, "a test's petabyte");
  CHECK(st == TDM_ERR_NO_MEMORY && p == NULL);
  CHECK_ERR_HAS("a test's petabyte");
  CHECK_ERR_HAS("GiB free");
  printf("    %s\n", tdm_last_error());
  CHECK_OK(tdm_cuda_malloc(&p, 1024, "after the failure"));
  tdm_cuda_free(p);
}

int main(void) {
  if (tdm_cuda_init() != TDM_OK) {
    printf("SKIP test_cuda_kernels: %s\n", tdm_last_error());
    return 77; /* ctest: SKIP_RETURN_CODE 77 */
  }
  char name[256];
  size_t fr = 0, tot = 0;
  CHECK_OK(tdm_cuda_device_info(name, sizeof name, &fr, &tot));
  printf("device: %s, %.1f GiB free of %.1f\n", name, (double)fr / 1073741824.0, (double)tot / 1073741824.0);
  static const tdm_test_case cases[] = {T(test_gemm), T(test_gemm_batched), T(test_bias_residual), T(test_embedding),
                                        T(test_layernorm), T(test_gelu), T(test_attention), T(test_flash_attention),
                                        T(test_cross_entropy),
                                        T(test_adamw_clip), T(test_convert), T(test_oom)};
  return tdm_test_main(cases, (int)(sizeof cases / sizeof cases[0]));
}
