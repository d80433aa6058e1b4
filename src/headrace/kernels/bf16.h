/* bf16 as stored by torch (the top 16 bits of an IEEE float), shared by the C kernels.
 * Loads widen exactly; stores round to nearest even, as torch does, and keep NaN a quiet NaN. */
#ifndef HEADRACE_BF16_H
#define HEADRACE_BF16_H

#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static inline float bf16_load(const uint16_t *p, int64_t i) {
    uint32_t bits = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void bf16_store(uint16_t *p, int64_t i, float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) { /* NaN stays a quiet NaN */
        p[i] = (uint16_t)((bits >> 16) | 0x40u);
        return;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);
    p[i] = (uint16_t)(bits >> 16);
}

/* fp32's, so that one kernel body serves both stored dtypes. */
static inline float f32_load(const float *p, int64_t i) { return p[i]; }
static inline void f32_store(float *p, int64_t i, float f) { p[i] = f; }

#ifdef __AVX512F__
#define LANES 16 /* fp32 lanes of a vector */
static inline __m512 f32_load16(const float *p) { return _mm512_loadu_ps(p); }

/* 16 lanes of fp32 from 16 stored bf16 values. */
static inline __m512 bf16_load16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* The decode matmuls' output (bf16_linear.c, block_linear.c): 16 channels' fp32 sums plus the
 * bias, rounded to bf16 once. */
static inline void store16(uint16_t *y, __m512 v, const uint16_t *bias) {
    if (bias) v = _mm512_add_ps(v, bf16_load16(bias));
    _mm256_storeu_si256((__m256i *)y, (__m256i)_mm512_cvtneps_pbh(v));
}

/* A tile's 4 groups x MB rows of acc into y [M, N] at rows m0.., channels n0.. */
#define STORE_TILE(MB)                                                                         \
    for (int g = 0; g < 4; g++)                                                                \
        for (int m = 0; m < MB; m++)                                                           \
            store16(y + (m0 + m) * N + n0 + g * 16, acc[g][m], bias ? bias + n0 + g * 16 : NULL);
#endif

#endif
