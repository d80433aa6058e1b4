/* u8 x s8 matmul for decode-sized steps (a few to a few dozen rows), see int8_linear.py.
 *
 * q     [M, K] u8                             activations, zero point 128 (quantize_rows_u8)
 * sx    [M] fp32                              their per-row scales
 * wp    [N/16, K/4, 16, 4] s8                 W [N, K] packed: 16 output channels by a quad of
 *                                             inputs, one VPDPBUSD operand; N a multiple of 64
 * qsum  [N] int32                             sum_k W[n][k], for the zero point
 * sw    [N] fp32                              the weights' per-channel scales
 * bias  [N] bf16 or NULL
 * y     [M, N] bf16    y = bf16(bf16(sw * sum_k (q - 128) W) * sx + bias)
 *
 * The sums are exact in int32, so they equal oneDNN's u8 x s8 matmul's; the two roundings to
 * bf16 are the ones int8_linear.py's oneDNN path makes (oneDNN's bf16 output, then the row
 * scale), so a row's result does not depend on which of the two served its step. oneDNN's int8
 * matmul is slow on a few rows (below bf16 at 16 rows here); this walks the channels a block
 * of 64 at a time as bf16_linear.c does, once per 4 rows from L2, fetching the next block
 * meanwhile, and threads grab blocks as they free up.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "head_cands.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
int linear_q8_supported(void) { return 1; }

/* 4 groups (64 channels) x MB rows: acc[g][m] += q_m[4k..4k+3] . wp[g][k][:][:] over k. */
#define DEFINE_QTILE(NAME, MB)                                                                 \
    static inline void NAME(const uint8_t *q, int64_t K, const int8_t *p, int64_t m0,         \
                            __m512i acc[4][MB], const int8_t *pf, unsigned pfmask) {           \
        const int64_t K4 = K / 4;                                                              \
        for (int g = 0; g < 4; g++)                                                            \
            for (int m = 0; m < MB; m++) acc[g][m] = _mm512_setzero_si512();                   \
        for (int64_t k4 = 0; k4 < K4; k4++) {                                                  \
            __m512i wv[4];                                                                     \
            for (int g = 0; g < 4; g++) wv[g] = block_line(p, pf, pfmask, g, K4, k4);          \
            for (int m = 0; m < MB; m++) {                                                     \
                int32_t quad;                                                                  \
                memcpy(&quad, q + (m0 + m) * K + 4 * k4, 4);                                   \
                const __m512i b = _mm512_set1_epi32(quad);                                     \
                for (int g = 0; g < 4; g++) acc[g][m] = _mm512_dpbusd_epi32(acc[g][m], b, wv[g]); \
            }                                                                                  \
        }                                                                                      \
    }
DEFINE_QTILE(qtile_m4, 4)
DEFINE_QTILE(qtile_m2, 2)
DEFINE_QTILE(qtile_m1, 1)

typedef struct {
    const int32_t *qsum;
    const float *sw, *sx;
    const uint16_t *bias;
    uint16_t *y;
    int64_t N;
} qout_t;

/* 16 channels of row m from n: the zero point's term out, the two scales with their roundings. */
static inline void qstore16(const qout_t *o, int64_t m, int64_t n, __m512i acc) {
    const __m512i zp = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(o->qsum + n)), 7);
    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, zp)),
                                   _mm512_loadu_ps(o->sw + n));
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 r = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    store16(o->y + m * o->N + n, _mm512_mul_ps(r, _mm512_set1_ps(o->sx[m])),
            o->bias ? o->bias + n : NULL);
}

#define QSTORE_TILE(MB)                                                                        \
    for (int g = 0; g < 4; g++)                                                                \
        for (int m = 0; m < MB; m++) qstore16(o, m0 + m, n0 + g * 16, acc[g][m]);

/* Rows m0..m1 of the block of channels n0..n0+63 (p: its packed weights, next: the next
 * block's, fetched over the passes). */
static void qblock_rows(const uint8_t *q, int64_t K, const int8_t *p, const int8_t *next,
                        int64_t n0, int64_t m0, int64_t m1, const qout_t *o) {
    const int64_t M = m1 - m0, passes = M / 4 + (M % 4) / 2 + M % 2;
    int64_t pass = 0;
    for (; m0 + 4 <= m1; m0 += 4) {
        __m512i acc[4][4];
        qtile_m4(q, K, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        QSTORE_TILE(4)
    }
    for (; m0 + 2 <= m1; m0 += 2) {
        __m512i acc[4][2];
        qtile_m2(q, K, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        QSTORE_TILE(2)
    }
    for (; m0 < m1; m0++) {
        __m512i acc[4][1];
        qtile_m1(q, K, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        QSTORE_TILE(1)
    }
}

void linear_q8(const uint8_t *q, const float *sx, int64_t M, int64_t K, const int8_t *wp,
               const int32_t *qsum, const float *sw, int64_t N, const uint16_t *bias,
               uint16_t *y) {
    const qout_t o = {qsum, sw, sx, bias, y, N};
    const int64_t blocks = N / 64, group = 16 * K; /* a group of 16 channels, in bytes */
    const block_split_t split = block_split(blocks, M, omp_get_max_threads());
    const int64_t chunks = split.chunks, rows = split.rows, grab = split.grab;
    _Pragma("omp parallel for schedule(dynamic, grab)")
    for (int64_t task = 0; task < blocks * chunks; task++) {
        const int64_t blk = task / chunks, m0 = task % chunks * rows;
        const int64_t m1 = m0 + rows < M ? m0 + rows : M;
        const int8_t *p = wp + blk * 4 * group;
        const int8_t *next = blk + 1 < blocks ? p + 4 * group : NULL;
        if (m0 < m1) qblock_rows(q, K, p, next, blk * 64, m0, m1, &o);
    }
}
#else
int linear_q8_supported(void) { return 0; }
void linear_q8(const uint8_t *q, const float *sx, int64_t M, int64_t K, const int8_t *wp,
               const int32_t *qsum, const float *sw, int64_t N, const uint16_t *bias,
               uint16_t *y) {
    (void)q, (void)sx, (void)M, (void)K, (void)wp, (void)qsum, (void)sw, (void)N, (void)bias;
    (void)y;
}
#endif
