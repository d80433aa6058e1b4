/* Decode-sized matmuls on a GGUF's own block-quantized weights, see block_linear.py.
 *
 * x      [M, K] bf16, row m at x + m * xs      K a multiple of B (16 or 32), K even
 * wp     [N/64, K/B, CHUNK] u8               W[n, k] = scale[n, k/B] * code[n, k] + offset[n, k/B]
 *        a chunk: 64 channels x B inputs of codes (each 0..127) in B/2 lines, one a pair of
 *        inputs: the codes' low 4 bits (64 bytes, two codes a byte), then P planes of their
 *        higher bits (16 bytes each: bit 4, 5, 6 of the pair's 128 codes); then the 64
 *        channels' scales and shifts (offset - 128 * scale, below), f32:
 *        CHUNK = B/2 (64 + 16 P) + 512 bytes, one stream for the whole weight
 * bias   [N] bf16 or NULL
 * y      [M, N] bf16                           y = bf16(x W^T + bias), fp32 sums
 *
 * Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K blocks are all `scale * code + offset` with codes under 64,
 * so a step reads 4-6 bits a weight plus 8 bytes a block (0.75-1.25 bytes) where the bf16 kernel
 * reads 2. A code becomes a bf16 operand by one byte interleave: 0x4300 | c is the bf16 of 128 + c
 * (exact for c < 128: [128, 256) has a spacing of 1 in bf16), so each block's dot product is
 * sum x (128 + c), exact products in fp32, and the block adds scale * that + shift * sum x.
 * Tiling and threads follow bf16_linear.c: 64 channels at a time, two rows a pass; the codes of
 * those 64 channels lie in one stream, which the hardware prefetcher follows, and the next
 * block's are prefetched into L2 meanwhile.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
int linear_blocks_supported(void) { return 1; }

/* The codes of a pair of inputs (a line at p: 64 channels x 2 inputs) as 4 vectors of 32 bf16
 * operands 128 + code: the low nibbles, each plane's bit added where set (a byte mask), then
 * each code byte interleaved with 0x43 makes the bf16 0x4300 | code. pack() orders each 64
 * codes so that the low and high halves of every 128-bit lane hold the two groups' pairs in
 * turn (what VPUNPCKLBW / VPUNPCKHBW take). */
static inline void code_lines(const uint8_t *p, int planes, __m512bh wv[4]) {
    const __m512i hi = _mm512_set1_epi8(0x43), low = _mm512_set1_epi8(0x0f);
    __m512i nib = _mm512_loadu_si512((const void *)p);
    __asm__("" : "+v"(nib)); /* one load, not one per use */
    __m512i raw[2] = {_mm512_and_si512(nib, low), _mm512_and_si512(_mm512_srli_epi16(nib, 4), low)};
    for (int b = 0; b < planes; b++)
        for (int h = 0; h < 2; h++) {
            uint64_t bits;
            memcpy(&bits, p + 64 + 16 * b + 8 * h, 8);
            raw[h] = _mm512_mask_add_epi8(raw[h], (__mmask64)bits, raw[h],
                                          _mm512_set1_epi8((char)(16 << b)));
        }
    for (int h = 0; h < 2; h++) {
        wv[2 * h] = (__m512bh)_mm512_unpacklo_epi8(raw[h], hi);
        wv[2 * h + 1] = (__m512bh)_mm512_unpackhi_epi8(raw[h], hi);
    }
}

/* 4 groups (64 channels) x MB rows over the K/B chunks at p; sx[m * KB + b]: row m's sum over
 * block b's inputs. */
#define DEFINE_TILE(NAME, MB, PLANES)                                                          \
    static inline void NAME(const uint16_t *x, int64_t xs, int64_t K, int64_t B,              \
                            const uint8_t *p, const float *sx, int64_t m0, __m512 acc[4][MB], \
                            const uint8_t *pf) {                                               \
        const int64_t B2 = B / 2, KB = K / B, line = 64 + 16 * PLANES, chunk = B2 * line + 512; \
        for (int g = 0; g < 4; g++)                                                            \
            for (int m = 0; m < MB; m++) acc[g][m] = _mm512_setzero_ps();                      \
        for (int64_t b = 0; b < KB; b++, p += chunk, pf = pf ? pf + chunk : NULL) {            \
            __m512 part[4][MB];                                                                \
            for (int g = 0; g < 4; g++)                                                        \
                for (int m = 0; m < MB; m++) part[g][m] = _mm512_setzero_ps();                 \
            for (int64_t j = 0; j < B2; j++) {                                                 \
                if (pf) _mm_prefetch((const char *)pf + j * line, _MM_HINT_T1);                \
                if (pf && PLANES) _mm_prefetch((const char *)pf + j * line + 64, _MM_HINT_T1); \
                __m512bh wv[4];                                                                \
                code_lines(p + j * line, PLANES, wv);                                          \
                for (int m = 0; m < MB; m++) {                                                 \
                    int32_t pair;                                                              \
                    memcpy(&pair, x + (m0 + m) * xs + b * B + 2 * j, 4);                       \
                    const __m512bh v = (__m512bh)_mm512_set1_epi32(pair);                      \
                    for (int g = 0; g < 4; g++)                                                \
                        part[g][m] = _mm512_dpbf16_ps(part[g][m], v, wv[g]);                   \
                }                                                                              \
            }                                                                                  \
            const float *sc = (const float *)(p + B2 * line), *sh = sc + 64;                   \
            if (pf)                                                                            \
                for (int i = 0; i < 8; i++)                                                    \
                    _mm_prefetch((const char *)pf + B2 * line + 64 * i, _MM_HINT_T1);          \
            for (int g = 0; g < 4; g++) {                                                      \
                const __m512 s = _mm512_loadu_ps(sc + g * 16);                                 \
                const __m512 o = _mm512_loadu_ps(sh + g * 16);                                 \
                for (int m = 0; m < MB; m++) {                                                 \
                    acc[g][m] = _mm512_fmadd_ps(part[g][m], s, acc[g][m]);                     \
                    acc[g][m] = _mm512_fmadd_ps(o, _mm512_set1_ps(sx[(m0 + m) * KB + b]),     \
                                                acc[g][m]);                                    \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
DEFINE_TILE(tile_m2_p0, 2, 0)
DEFINE_TILE(tile_m1_p0, 1, 0)
DEFINE_TILE(tile_m2_p1, 2, 1)
DEFINE_TILE(tile_m1_p1, 1, 1)
DEFINE_TILE(tile_m2_p2, 2, 2)
DEFINE_TILE(tile_m1_p2, 1, 2)
DEFINE_TILE(tile_m2_p3, 2, 3)
DEFINE_TILE(tile_m1_p3, 1, 3)

/* The tile of MB rows for P planes (each P its own unrolled loop). */
#define TILE(MB, P, ...)                                                                       \
    switch (P) {                                                                               \
        case 0: tile_m##MB##_p0(__VA_ARGS__); break;                                           \
        case 1: tile_m##MB##_p1(__VA_ARGS__); break;                                           \
        case 2: tile_m##MB##_p2(__VA_ARGS__); break;                                           \
        default: tile_m##MB##_p3(__VA_ARGS__); break;                                          \
    }

/* Rows m0..m1 of the channels n0..n0+63; the next block's codes are prefetched on the first
 * pass (later passes read this block's from L2). */
static void block_rows(const uint16_t *x, int64_t xs, int64_t K, int64_t B, int64_t P,
                       const uint8_t *p, const float *sx, const uint8_t *next, int64_t n0,
                       int64_t m0, int64_t m1, int64_t N, const uint16_t *bias, uint16_t *y) {
    for (; m0 + 2 <= m1; m0 += 2, next = NULL) {
        __m512 acc[4][2];
        TILE(2, P, x, xs, K, B, p, sx, m0, acc, next)
        STORE_TILE(2)
    }
    if (m0 < m1) {
        __m512 acc[4][1];
        TILE(1, P, x, xs, K, B, p, sx, m0, acc, next)
        STORE_TILE(1)
    }
}

/* 0, or -1 where P is out of range or the row sums' buffer could not be had (y not written). */
int linear_blocks(const uint16_t *x, int64_t M, int64_t K, int64_t xs, int64_t B, int64_t P,
                  const uint8_t *wp, int64_t N, const uint16_t *bias, uint16_t *y) {
    if (P < 0 || P > 3) return -1;
    const int64_t KB = K / B, blocks = N / 64, size = KB * (B / 2 * (64 + 16 * P) + 512);
    float *sx = malloc(sizeof(float) * (size_t)(M * KB)); /* each row's sum over each block */
    if (!sx) return -1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < KB; b++) {
            float s = 0.0f;
            for (int64_t k = b * B; k < (b + 1) * B; k++) s += bf16_load(x + m * xs, k);
            sx[m * KB + b] = s;
        }
    /* a few consecutive blocks per grab, so that the block a thread prefetches is mostly the
     * one it takes next (bf16_linear.c) */
    const int64_t threads = omp_get_max_threads();
    const int64_t grab = blocks / (4 * threads) > 1 ? blocks / (4 * threads) : 1;
    _Pragma("omp parallel for schedule(dynamic, grab)")
    for (int64_t blk = 0; blk < blocks; blk++) {
        const uint8_t *p = wp + blk * size;
        const uint8_t *next = blk + 1 < blocks ? p + size : NULL;
        block_rows(x, xs, K, B, P, p, sx, next, blk * 64, 0, M, N, bias, y);
    }
    free(sx);
    return 0;
}
#else
int linear_blocks_supported(void) { return 0; }
int linear_blocks(const uint16_t *x, int64_t M, int64_t K, int64_t xs, int64_t B, int64_t P,
                  const uint8_t *wp, int64_t N, const uint16_t *bias, uint16_t *y) {
    (void)x, (void)M, (void)K, (void)xs, (void)B, (void)P, (void)wp, (void)N, (void)bias, (void)y;
    return -1;
}
#endif
