/* The head's logits of a few-row step from a GGUF's Q8_0 blocks, see q8_head.py.
 *
 * x   [M, K] bf16, row m at x + m * xs        M <= 4, K a multiple of 32
 * wp  [N/16, K/32, 544] u8                     a chunk: 32 inputs x 16 channels of int8 codes
 *                                              (input-major, 512 bytes), then the 16 channels'
 *                                              fp16 scales (32 bytes); one stream
 * y   [M, N] f32                               y[m, n] = sum_b d[n, b] sum_k q[n, k] x[m, k]
 *
 * Each product q x is exact in fp32 (8-bit q, bf16 x), the block's sum is fp32, and the fp16
 * scale multiplies it once: the GGUF's own weights d q and fp32 logits, where the bf16 head rounds
 * each d q to 8 bits of mantissa and its logits to bf16. 16 channels a vector, the inputs
 * broadcast: no horizontal sums, and each thread streams one contiguous range of the weight
 * (178 MB for Gemma 3's 262k x 640, against 335 MB of bf16), which the hardware prefetcher
 * follows.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
int q8_head_supported(void) { return 1; }

#define Q8_CHUNK 544

/* 16 channels at p (their K/32 chunks) for MB rows of xf [MB, K] fp32 -> y[m, n0..n0+15]. The
 * logits stay fp32: a bf16 logit near 30 is 1/8 wide, a factor of e^(1/8) in probability. */
#define DEFINE_GROUP(NAME, MB)                                                                 \
    static inline void NAME(const float *xf, int64_t K, const uint8_t *p, float *y,           \
                            int64_t N, int64_t n0) {                                           \
        __m512 acc[MB];                                                                        \
        for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();                             \
        for (int64_t b = 0; b < K / 32; b++, p += Q8_CHUNK) {                                  \
            __m512 part[MB];                                                                   \
            for (int m = 0; m < MB; m++) part[m] = _mm512_setzero_ps();                        \
            for (int i = 0; i < 32; i++) {                                                     \
                const __m128i q = _mm_loadu_si128((const __m128i *)(p + 16 * i));              \
                const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));                 \
                for (int m = 0; m < MB; m++)                                                   \
                    part[m] = _mm512_fmadd_ps(w, _mm512_set1_ps(xf[m * K + 32 * b + i]),      \
                                              part[m]);                                        \
            }                                                                                  \
            const __m512 d =                                                                   \
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 512)));               \
            for (int m = 0; m < MB; m++) acc[m] = _mm512_fmadd_ps(part[m], d, acc[m]);         \
        }                                                                                      \
        for (int m = 0; m < MB; m++)                                                           \
            _mm512_storeu_ps(y + m * N + n0, acc[m]);                                          \
    }
DEFINE_GROUP(group_m1, 1)
DEFINE_GROUP(group_m2, 2)
DEFINE_GROUP(group_m3, 3)
DEFINE_GROUP(group_m4, 4)

/* 0, or -1 where M is out of range or the fp32 copy of x could not be had (y not written). */
int q8_head(const uint16_t *x, int64_t M, int64_t K, int64_t xs, const uint8_t *wp, int64_t N,
            float *y) {
    if (M < 1 || M > 4) return -1;
    float *xf = malloc(sizeof(float) * (size_t)(M * K));
    if (!xf) return -1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) xf[m * K + k] = bf16_load(x + m * xs, k);
    const int64_t groups = N / 16, size = (K / 32) * Q8_CHUNK;
    /* static: each thread one contiguous range of the stream */
    _Pragma("omp parallel for schedule(static)")
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *p = wp + g * size;
        switch (M) {
            case 1: group_m1(xf, K, p, y, N, g * 16); break;
            case 2: group_m2(xf, K, p, y, N, g * 16); break;
            case 3: group_m3(xf, K, p, y, N, g * 16); break;
            default: group_m4(xf, K, p, y, N, g * 16); break;
        }
    }
    free(xf);
    return 0;
}
#else
int q8_head_supported(void) { return 0; }
int q8_head(const uint16_t *x, int64_t M, int64_t K, int64_t xs, const uint8_t *wp, int64_t N,
            float *y) {
    (void)x, (void)M, (void)K, (void)xs, (void)wp, (void)N, (void)y;
    return -1;
}
#endif
