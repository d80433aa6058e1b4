/* Greedy head, exact: one u8 limb and the hidden state's outlier channels in fp32, for CPUs
 * with AVX-512 VNNI and no AMX (see int8_head.py).
 *
 * x       [M, H] fp32             the step's final hidden rows (H a multiple of 4)
 * outl    [K] int32               the outlier channels (K <= 32), taken out of the u8 limb
 * wo      [V16/16, K, 16] fp32    the head's weights in those channels, 16 vocabulary rows a
 *                                 vector
 * packed, s, qsum, wl1, V16, w, V as in int8_head.c
 * limit                           candidates a row may keep before it is given up
 * idx     [M] int64               out: argmax_v x . w_v (ties: the lowest v), or -1 where the
 *                                 row kept more than `limit` candidates (a flat distribution;
 *                                 the caller screens it again with two limbs)
 * returns                         the candidates kept, summed over rows (`limit` for a row given
 *                                 up): what the rescoring cost
 *
 * Two limbs (int8_head.c) cost as many VNNI multiply-adds as the bf16 matmul makes bf16 ones:
 * without AMX they only break even with it. One limb halves them, but its scale follows the
 * row's largest entry, and Gemma's hidden states have a few channels tens of times larger than
 * the rest (the same ones on text and random prompts): taken out and added in fp32 (K fused
 * multiply-adds per 16 vocabulary rows, a tenth of the int8 work at K = 16), the rest
 * quantize on a grid fine enough that the bound keeps a few dozen candidates a row on text.
 *
 * Bound: x_A (x without the outliers) is within ex = sx / 2 of sx (q - 128) an entry, and
 * |w - s q| <= s / 2, so |x_A . w_v - a_A| <= ex |w_v|_1 + s_v (|x_A|_1 + H ex) / 2; the fp32
 * outlier sum adds at most 32 u |x_O|_1 max|w_v| (u = 2^-24, max|w_v| = 127 s_v), taken as
 * s_v 2.5e-4 |x_O|_1. The shared screen (head_cands.h) takes 1.1 times the bound.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "head_cands.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* One limb's sums over 4 groups (64 vocabulary rows) and MB rows: 4 * MB independent chains. */
#define DEFINE_DOTS1(NAME, MB)                                                                 \
    static inline void NAME(const uint8_t *xq, int64_t H, const int8_t *p, int64_t m0,          \
                            int32_t out[4][MB][16], const int8_t *pf, unsigned pfmask) {       \
        const int64_t H4 = H / 4;                                                              \
        __m512i acc[4][MB];                                                                    \
        for (int g = 0; g < 4; g++)                                                            \
            for (int m = 0; m < MB; m++) acc[g][m] = _mm512_setzero_si512();                   \
        for (int64_t d4 = 0; d4 < H4; d4++) {                                                  \
            __m512i wv[4];                                                                     \
            for (int g = 0; g < 4; g++) wv[g] = block_line(p, pf, pfmask, g, H4, d4);          \
            for (int m = 0; m < MB; m++) {                                                     \
                int32_t q;                                                                     \
                memcpy(&q, xq + (m0 + m) * H + 4 * d4, 4);                                     \
                const __m512i b = _mm512_set1_epi32(q);                                        \
                for (int g = 0; g < 4; g++) acc[g][m] = _mm512_dpbusd_epi32(acc[g][m], b, wv[g]); \
            }                                                                                  \
        }                                                                                      \
        for (int g = 0; g < 4; g++)                                                            \
            for (int m = 0; m < MB; m++) _mm512_storeu_si512((void *)out[g][m], acc[g][m]);    \
    }
#else
#define DEFINE_DOTS1(NAME, MB)                                                                 \
    static inline void NAME(const uint8_t *xq, int64_t H, const int8_t *p, int64_t m0,          \
                            int32_t out[4][MB][16], const int8_t *pf, unsigned pfmask) {       \
        const int64_t H4 = H / 4;                                                              \
        (void)pf;                                                                              \
        (void)pfmask;                                                                          \
        for (int g = 0; g < 4; g++)                                                            \
            for (int m = 0; m < MB; m++)                                                       \
                for (int l = 0; l < 16; l++) {                                                 \
                    int32_t acc = 0;                                                           \
                    for (int64_t d = 0; d < H; d++)                                            \
                        acc += (int32_t)xq[(m0 + m) * H + d] *                                 \
                               (int32_t)p[((g * H4 + d / 4) * 16 + l) * 4 + d % 4];            \
                    out[g][m][l] = acc;                                                        \
                }                                                                              \
    }
#endif
DEFINE_DOTS1(dots1_m1, 1)
DEFINE_DOTS1(dots1_m4, 4)

typedef struct {
    const uint8_t *xq;
    const float *xo;       /* [M, K] the outlier channels' values */
    const float *sx, *xl1; /* per row: scale, the bound's weight-rounding factor */
    const float *s, *wl1, *wo;
    const int32_t *qsum;
    const int8_t *packed;
    int64_t M, H, K, V16, V;
} scan1_t;

/* Row m's screened logits of 16 vocabulary rows from v0: a = sx s (sum - 128 qsum) + x_O . w_O */
static inline void logits16(const scan1_t *a, const int32_t *sum, int64_t v0, int64_t m,
                            float out[16]) {
    const float *wo = a->wo + v0 * a->K, *xo = a->xo + m * a->K;
#ifdef __AVX512F__
    const __m512i off = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(a->qsum + v0)), 7);
    const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512((const void *)sum), off));
    __m512 acc = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(a->sx[m]), _mm512_loadu_ps(a->s + v0)), q);
    for (int64_t k = 0; k < a->K; k++)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(xo[k]), _mm512_loadu_ps(wo + k * 16), acc);
    _mm512_storeu_ps(out, acc);
#else
    for (int l = 0; l < 16; l++) {
        float acc = a->sx[m] * a->s[v0 + l] * (float)(sum[l] - 128 * a->qsum[v0 + l]);
        for (int64_t k = 0; k < a->K; k++) acc += xo[k] * wo[k * 16 + l];
        out[l] = acc;
    }
#endif
}

/* Screen the 64 vocabulary rows of group block grp for every row. */
static void scan_block(const scan1_t *a, cands_t *mine, int64_t grp, const int8_t *next) {
    const int64_t H4 = a->H / 4, M = a->M;
    const int8_t *p = a->packed + grp * H4 * 64;
    float logits[16];
    const int64_t passes = M / 4 + M % 4; /* over the rows: next is fetched meanwhile */
    int64_t pass = 0;
    int64_t m0 = 0;
    for (; m0 + 4 <= M; m0 += 4) {
        int32_t acc[4][4][16];
        dots1_m4(a->xq, a->H, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        for (int g = 0; g < 4; g++)
            for (int m = 0; m < 4; m++) {
                const int64_t v0 = (grp + g) * 16;
                logits16(a, acc[g][m], v0, m0 + m, logits);
                screen_logits(mine + m0 + m, logits, v0, a->s, a->wl1, a->sx[m0 + m] / 2,
                              a->xl1[m0 + m], a->V);
            }
    }
    for (; m0 < M; m0++) {
        int32_t acc[4][1][16];
        dots1_m1(a->xq, a->H, p, m0, acc, next, next ? prefetch_mask(pass++, passes) : 0u);
        for (int g = 0; g < 4; g++) {
            const int64_t v0 = (grp + g) * 16;
            logits16(a, acc[g][0], v0, m0, logits);
            screen_logits(mine + m0, logits, v0, a->s, a->wl1, a->sx[m0] / 2, a->xl1[m0],
                          a->V);
        }
    }
}

/* A thread keeps what reaches its running lower bound, which starts low: on a flat
 * distribution the lists would swell (and give up on rows) before the scan meets the top. So
 * each thread first screens a sample of 1 in SAMPLE blocks from the whole vocabulary for the
 * bounds alone, drops what it kept, then takes chunks of the whole. */
#define SAMPLE 64
static void scan1(const scan1_t *a, cands_t *mine) {
    const int64_t groups = a->V16 / 16, bytes = a->H / 4 * 64; /* a group's */
    for (int64_t grp = 0; grp < groups; grp += 4 * SAMPLE) scan_block(a, mine, grp, NULL);
    for (int64_t m = 0; m < a->M; m++) mine[m].n = 0;
    _Pragma("omp for schedule(dynamic, 16)")
    for (int64_t grp = 0; grp < groups; grp += 4) {
        const int8_t *next = grp + 4 < groups ? a->packed + (grp + 4) * bytes : NULL;
        scan_block(a, mine, grp, next);
    }
}

/* Per row: the outlier channels' values apart, the rest on one u8 grid of scale sx. */
static void quantize1(const float *x, int64_t M, int64_t H, const int32_t *outl, int64_t K,
                      uint8_t *xq, float *xo, float *sx, float *xl1) {
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * H;
        float rest[H];
        memcpy(rest, xm, sizeof(float) * (size_t)H);
        float ol1 = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            xo[m * K + k] = xm[outl[k]];
            ol1 += fabsf(xm[outl[k]]);
            rest[outl[k]] = 0.0f;
        }
        float amax, l1;
        abs_max_sum(rest, H, &amax, &l1);
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        for (int64_t d = 0; d < H; d++) xq[m * H + d] = (uint8_t)((int)rintf(rest[d] / scale) + 128);
        sx[m] = scale;
        xl1[m] = 0.5f * l1 + 0.25f * (float)H * scale + 2.5e-4f * ol1;
    }
}

int64_t head_argmax_q8_outliers(const float *x, int64_t M, int64_t H, const int32_t *outl,
                             int64_t K, const float *wo, const int8_t *packed, const float *s,
                             const int32_t *qsum, const float *wl1, int64_t V16,
                             const uint16_t *w, int64_t V, int64_t limit, int64_t *idx) {
    const int threads = omp_get_max_threads();
    if (K > MAX_OUTLIERS) K = MAX_OUTLIERS; /* the bound's rounding term assumes at most 32 */
    uint8_t *xq = malloc((size_t)(M * H));
    float *xo = malloc(sizeof(float) * (size_t)(M * (K > 0 ? K : 1)));
    float *sx = malloc(sizeof(float) * (size_t)M), *xl1 = malloc(sizeof(float) * (size_t)M);
    cands_t *per_thread = malloc(sizeof(cands_t) * (size_t)(threads * M));
    quantize1(x, M, H, outl, K, xq, xo, sx, xl1);
    for (int64_t i = 0; i < threads * M; i++) cands_init(per_thread + i, limit);
    const scan1_t args = {xq, xo, sx, xl1, s, wl1, wo, qsum, packed, M, H, K, V16, V};
    _Pragma("omp parallel num_threads(threads)") scan1(&args, per_thread + omp_get_thread_num() * M);
    _Pragma("omp parallel for schedule(dynamic)")
    for (int64_t m = 0; m < M; m++) idx[m] = rescore(x + m * H, H, w, per_thread, threads, M, m);
    int64_t kept = 0;
    for (int64_t i = 0; i < threads * M; i++) {
        kept += per_thread[i].overflow ? limit : per_thread[i].n;
        cands_free(per_thread + i);
    }
    free(per_thread);
    free(xl1);
    free(sx);
    free(xo);
    free(xq);
    return kept;
}
