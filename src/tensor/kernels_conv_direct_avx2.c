/* The direct convolution kernels for AVX2 with FMA (8-float vectors, 16 registers). CMake
 * compiles this file with -mavx2 -mfma on x86; kernels_conv_direct.c calls it only where the CPU
 * has both. */
#include "tensor/conv_direct.h"

#if defined(__AVX2__) && defined(__FMA__)
#define CONV_DIRECT_VL 8
#define CONV_DIRECT_TABLE conv_direct_avx2_table
#include "tensor/conv_direct_impl.h"
const tdm__conv_direct_impl *tdm__conv_direct_avx2(void) { return &conv_direct_avx2_table; }
#else
const tdm__conv_direct_impl *tdm__conv_direct_avx2(void) { return NULL; }
#endif
