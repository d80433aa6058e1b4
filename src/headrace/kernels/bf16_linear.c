/* bf16 matmul for decode-sized steps (a few to a few dozen rows), see bf16_linear.py.
 *
 * x     [M, K] bf16, row m at x + m * xs      K even
 * wp    [N/16, K/2, 16, 2] bf16               W [N, K] packed: 16 output channels by a pair of
 *                                             inputs, one VDPBF16PS operand; N a multiple of 64
 * bias  [N] bf16 or NULL
 * y     [M, N] bf16                           y = bf16(x W^T + bias), fp32 sums
 *
 * At 16 rows oneDNN's bf16 matmul reads Gemma's layer weights from memory and multiplies them
 * in turn (59% of the VDPBF16PS rate here, the memory idle while it multiplies). This walks the
 * outputs a block of 64 channels at a time, passes over the block once per 4 rows (from L2
 * after the first pass) and fetches the next block meanwhile (head_cands.h's prefetch_mask).
 * Threads take a few blocks at a time as they free up (a thread preempted by the front end is
 * not waited for), and share a block's rows only where blocks are fewer. Products are exact in
 * fp32 (bf16 x bf16); only the order of the sums differs from oneDNN's.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "head_cands.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
int linear_bf16_supported(void) { return 1; }

/* 4 groups (64 channels) x MB rows: acc[g][m] += x_m[2k, 2k+1] . wp[g][k][:][:] over k. */
#define DEFINE_TILE(NAME, MB)                                                                  \
    static inline void NAME(const uint16_t *x, int64_t xs, int64_t K, const uint16_t *p,      \
                            int64_t m0, __m512 acc[4][MB], const uint16_t *pf,                \
                            unsigned pfmask) {                                                 \
        const int64_t K2 = K / 2;                                                              \
        for (int g = 0; g < 4; g++)                                                            \
            for (int m = 0; m < MB; m++) acc[g][m] = _mm512_setzero_ps();                      \
        for (int64_t k2 = 0; k2 < K2; k2++) {                                                  \
            __m512bh wv[4];                                                                    \
            for (int g = 0; g < 4; g++) wv[g] = (__m512bh)block_line(p, pf, pfmask, g, K2, k2); \
            for (int m = 0; m < MB; m++) {                                                     \
                int32_t pair;                                                                  \
                memcpy(&pair, x + (m0 + m) * xs + 2 * k2, 4);                                  \
                const __m512bh b = (__m512bh)_mm512_set1_epi32(pair);                          \
                for (int g = 0; g < 4; g++) acc[g][m] = _mm512_dpbf16_ps(acc[g][m], b, wv[g]); \
            }                                                                                  \
        }                                                                                      \
    }
DEFINE_TILE(tile_m4, 4)
DEFINE_TILE(tile_m2, 2)
DEFINE_TILE(tile_m1, 1)

/* Rows m0..m1 of the block of channels n0..n0+63 (p: its packed weights, next: the next
 * block's, fetched over the passes). */
static void block_rows(const uint16_t *x, int64_t xs, int64_t K, const uint16_t *p,
                       const uint16_t *next, int64_t n0, int64_t m0, int64_t m1, int64_t N,
                       const uint16_t *bias, uint16_t *y) {
    const int64_t M = m1 - m0, passes = M / 4 + (M % 4) / 2 + M % 2;
    int64_t pass = 0;
    for (; m0 + 4 <= m1; m0 += 4) {
        __m512 acc[4][4];
        tile_m4(x, xs, K, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        STORE_TILE(4)
    }
    for (; m0 + 2 <= m1; m0 += 2) {
        __m512 acc[4][2];
        tile_m2(x, xs, K, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        STORE_TILE(2)
    }
    for (; m0 < m1; m0++) {
        __m512 acc[4][1];
        tile_m1(x, xs, K, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        STORE_TILE(1)
    }
}

void linear_bf16(const uint16_t *x, int64_t M, int64_t K, int64_t xs, const uint16_t *wp,
                 int64_t N, const uint16_t *bias, uint16_t *y) {
    const int64_t blocks = N / 64, group = 16 * K; /* a group of 16 channels, in bf16 */
    const block_split_t split = block_split(blocks, M, omp_get_max_threads());
    const int64_t chunks = split.chunks, rows = split.rows, grab = split.grab;
    _Pragma("omp parallel for schedule(dynamic, grab)")
    for (int64_t task = 0; task < blocks * chunks; task++) {
        const int64_t blk = task / chunks, m0 = task % chunks * rows;
        const int64_t m1 = m0 + rows < M ? m0 + rows : M;
        const uint16_t *p = wp + blk * 4 * group;
        const uint16_t *next = blk + 1 < blocks ? p + 4 * group : NULL;
        if (m0 < m1) block_rows(x, xs, K, p, next, blk * 64, m0, m1, N, bias, y);
    }
}
#else
int linear_bf16_supported(void) { return 0; }
void linear_bf16(const uint16_t *x, int64_t M, int64_t K, int64_t xs, const uint16_t *wp,
                 int64_t N, const uint16_t *bias, uint16_t *y) {
    (void)x, (void)M, (void)K, (void)xs, (void)wp, (void)N, (void)bias, (void)y;
}
#endif
