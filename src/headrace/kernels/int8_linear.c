/* Dynamic per-row int8 quantization of bf16 activations, for oneDNN's u8 x s8 matmuls
 * (see int8_linear.py).
 *
 * x      [T, D] bf16, row t at x + t * stride
 * q      [Tp, D] u8          q[t][d] = round(x[t][d] / s[t]) + 128, in 1..255; rows T..Tp-1
 *                            (bucket padding) are 128, the zero point, so they add nothing
 * s      [Tp] fp32           s[t] = max_d |x[t][d]| / 127 (0 for an all-zero or padding row)
 *
 * One pass per row for the maximum, one to quantize; a row of Gemma's widths (640-2,048) stays
 * in L1 between them. Rounding is to nearest even, as torch.round.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

void quantize_rows_u8(const uint16_t *x, int64_t T, int64_t D, int64_t stride, int64_t Tp,
                      uint8_t *q, float *s) {
    _Pragma("omp parallel for schedule(static)")
    for (int64_t t = 0; t < Tp; t++) {
        uint8_t *qt = q + t * D;
        if (t >= T) {
            memset(qt, 128, (size_t)D);
            s[t] = 0.0f;
            continue;
        }
        const uint16_t *xt = x + t * stride;
        float amax = 0.0f;
        int64_t d = 0;
#ifdef __AVX512F__
        __m512 m = _mm512_setzero_ps();
        for (; d + 16 <= D; d += 16) m = _mm512_max_ps(m, _mm512_abs_ps(bf16_load16(xt + d)));
        amax = _mm512_reduce_max_ps(m);
#endif
        for (; d < D; d++) amax = fmaxf(amax, fabsf(bf16_load(xt, d)));
        s[t] = amax / 127.0f;
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        d = 0;
#ifdef __AVX512F__
        const __m512 vinv = _mm512_set1_ps(inv);
        const __m512i off = _mm512_set1_epi32(128);
        for (; d + 16 <= D; d += 16) {
            const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(bf16_load16(xt + d), vinv));
            _mm_storeu_si128((__m128i *)(qt + d), _mm512_cvtusepi32_epi8(_mm512_add_epi32(r, off)));
        }
#endif
        for (; d < D; d++) qt[d] = (uint8_t)((int32_t)nearbyintf(bf16_load(xt, d) * inv) + 128);
    }
}

/* y [T, O] bf16 in place: y[t][o] = bf16(y[t][o] * s[t] (+ bias[o])), fp32 inside. oneDNN's
 * int8 matmul has no per-row source scale; this applies the activations' after it. */
void scale_rows_bf16(uint16_t *y, int64_t T, int64_t O, const float *s, const uint16_t *bias) {
    _Pragma("omp parallel for schedule(static)")
    for (int64_t t = 0; t < T; t++) {
        uint16_t *yt = y + t * O;
        const float st = s[t];
        int64_t o = 0;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
        const __m512 vs = _mm512_set1_ps(st);
        for (; o + 16 <= O; o += 16) {
            __m512 v = _mm512_mul_ps(bf16_load16(yt + o), vs);
            if (bias) v = _mm512_add_ps(v, bf16_load16(bias + o));
            _mm256_storeu_si256((__m256i *)(yt + o), (__m256i)_mm512_cvtneps_pbh(v));
        }
#endif
        for (; o < O; o++) {
            bf16_store(yt, o, bf16_load(yt, o) * st + (bias ? bf16_load(bias, o) : 0.0f));
        }
    }
}
