/* The direct convolution kernels for AVX-512 (16-float vectors, 32 registers). CMake compiles
 * this file with -mavx512f on x86; kernels_conv_direct.c calls it only where the CPU has it. */
#include "tensor/conv_direct.h"

#if defined(__AVX512F__)
#define CONV_DIRECT_VL 16
#define CONV_DIRECT_TABLE conv_direct_avx512_table
#include "tensor/conv_direct_impl.h"
const tdm__conv_direct_impl *tdm__conv_direct_avx512(void) { return &conv_direct_avx512_table; }
#else
const tdm__conv_direct_impl *tdm__conv_direct_avx512(void) { return NULL; }
#endif
