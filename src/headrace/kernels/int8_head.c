/* Greedy head from an int8 copy of the weights, exact, for 1 to 64 rows (see int8_head.py).
 *
 * x       [M, H] fp32         the step's final hidden rows
 * packed  [V16/16, H/4, 16, 4] int8: q[v][d] = round(w[v][d] / s[v]); 16 vocabulary rows by
 *                             4 hidden values, the operand layout of one VPDPBUSD; V16 a
 *                             multiple of 64, H a multiple of 4
 * s       [V16] fp32          per-row weight scales max|w_v| / 127 (0 on padding rows)
 * qsum    [V16] int32         sum_d q[v][d]  (undoes the +128 offset of the u8 activations)
 * wl1     [V16] fp32          |w_v|_1 of the full-precision row
 * w       [V, H] bf16         the head itself, for the rescoring
 * idx     [M] int64           out: argmax_v x . w_v (ties: the lowest v)
 *
 * Screening. Each row is quantized to two u8 limbs with one scale (quantize_rows): x is within
 * ex = sx / 508 of its quantized value an entry, and the int8 logit a_v comes from exact int32
 * sums (VPDPBUSD: u8 x s8). With |w - s q| <= s/2 per weight, |x . w_v - a_v| <= ex |w_v|_1 +
 * s_v / 2 (|x|_1 + H ex); the bound b_v takes 1.1 times that. One limb (ex = sx / 2) alone
 * would make the bound ten times looser and keep thousands of candidates on Gemma's
 * heavy-tailed hidden states (int8_screen.c takes one limb with those channels apart). The
 * candidates are kept and rescored as head_cands.h says: the true argmax is among them.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "head_cands.h"
#include "head_envelope.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef struct {
    const uint8_t *x1, *x2;
    const float *sx, *xl1, *s, *wl1;
    const float *xo, *wo; /* [M, K] the outlier channels' values, [V16/16, K, 16] their weights */
    const int32_t *qsum;
    const int8_t *packed;
    int64_t M, H, K, V16, V;
    const env_t *env; /* NULL: screen for the argmax; else keep the sampler's envelope */
} scan_t;

/* The screened logits a[16] of 16 vocabulary rows from v0 (< V), from one row's two-limb sums */
static inline void logits16(float a[16], const int32_t *hi, const int32_t *lo, int64_t v0,
                            const float *s, const int32_t *qsum, float sx, int64_t V) {
#ifdef __AVX512F__
    (void)V;
    const __m512i off = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(qsum + v0)), 7);
    const __m512 q = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512((const void *)lo), off)),
        _mm512_set1_ps(1.0f / 254.0f),
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512((const void *)hi), off)));
    _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sx), _mm512_loadu_ps(s + v0)), q));
#else
    const int n = V - v0 >= 16 ? 16 : (int)(V - v0);
    for (int l = 0; l < n; l++) {
        const int64_t v = v0 + l;
        const float q = (float)(hi[l] - 128 * qsum[v]) + (float)(lo[l] - 128 * qsum[v]) / 254.0f;
        a[l] = sx * s[v] * q;
    }
#endif
}

/* a[16] += x_O . w_O: the outlier channels of one row (xo [K]) against 16 vocabulary rows
 * (wo [K, 16]), in fp32, one explicit fused multiply-add after another (the scan and
 * head_bounds_q8 round alike). */
static inline void outliers16(float a[16], const float *xo, const float *wo, int64_t K) {
    if (K == 0) return;
#ifdef __AVX512F__
    __m512 acc = _mm512_loadu_ps(a);
    for (int64_t k = 0; k < K; k++)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(xo[k]), _mm512_loadu_ps(wo + k * 16), acc);
    _mm512_storeu_ps(a, acc);
#else
    for (int l = 0; l < 16; l++)
        for (int64_t k = 0; k < K; k++) a[l] = fmaf(xo[k], wo[k * 16 + l], a[l]);
#endif
}

/* One 16-row group of row m's two-limb sums: the screened logits, then the shared screen (or
 * the envelope). ex = sx / 508 bounds each activation's error. */
static inline void screen16(const scan_t *g, cands_t *mine, int64_t m, const int32_t *hi,
                            const int32_t *lo, int64_t v0) {
    if (v0 >= g->V) return;
    const float sx = g->sx[m], ex = sx / 508.0f;
    float a[16];
    logits16(a, hi, lo, v0, g->s, g->qsum, sx, g->V);
    outliers16(a, g->xo + m * g->K, g->wo + v0 * g->K, g->K);
    if (g->env)
        envelope16(g->env, m, a, v0, g->s, g->wl1, ex, g->xl1[m]);
    else
        screen_logits(mine + m, a, v0, g->s, g->wl1, ex, g->xl1[m], g->V);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
int head_q8_vnni(void) { return 1; }
/* Both limbs' sums over 4 groups (64 vocabulary rows) and MB rows: 8 * MB independent chains. */
#define DEFINE_DOTS(NAME, MB)                                                                 \
    static inline void NAME(const uint8_t *x1, const uint8_t *x2, int64_t H, const int8_t *p, \
                            int64_t m0, int32_t out[2][4][MB][16], const int8_t *pf,          \
                            unsigned pfmask) {                                               \
        const int64_t H4 = H / 4;                                                            \
        __m512i acc[2][4][MB];                                                               \
        for (int g = 0; g < 4; g++)                                                          \
            for (int m = 0; m < MB; m++)                                                     \
                acc[0][g][m] = acc[1][g][m] = _mm512_setzero_si512();                        \
        for (int64_t d4 = 0; d4 < H4; d4++) {                                                \
            __m512i wv[4];                                                                   \
            for (int g = 0; g < 4; g++) wv[g] = block_line(p, pf, pfmask, g, H4, d4);        \
            for (int m = 0; m < MB; m++) {                                                   \
                int32_t q1, q2;                                                              \
                memcpy(&q1, x1 + (m0 + m) * H + 4 * d4, 4);                                  \
                memcpy(&q2, x2 + (m0 + m) * H + 4 * d4, 4);                                  \
                const __m512i b1 = _mm512_set1_epi32(q1), b2 = _mm512_set1_epi32(q2);        \
                for (int g = 0; g < 4; g++) {                                                \
                    acc[0][g][m] = _mm512_dpbusd_epi32(acc[0][g][m], b1, wv[g]);             \
                    acc[1][g][m] = _mm512_dpbusd_epi32(acc[1][g][m], b2, wv[g]);             \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (int k = 0; k < 2; k++)                                                          \
            for (int g = 0; g < 4; g++)                                                      \
                for (int m = 0; m < MB; m++)                                                 \
                    _mm512_storeu_si512((void *)out[k][g][m], acc[k][g][m]);                 \
    }
#else
int head_q8_vnni(void) { return 0; }
#define DEFINE_DOTS(NAME, MB)                                                                 \
    static inline void NAME(const uint8_t *x1, const uint8_t *x2, int64_t H, const int8_t *p, \
                            int64_t m0, int32_t out[2][4][MB][16], const int8_t *pf,          \
                            unsigned pfmask) {                                               \
        const int64_t H4 = H / 4;                                                            \
        (void)pf;                                                                            \
        (void)pfmask;                                                                        \
        for (int k = 0; k < 2; k++)                                                          \
            for (int g = 0; g < 4; g++)                                                      \
                for (int m = 0; m < MB; m++)                                                 \
                    for (int l = 0; l < 16; l++) {                                           \
                        const uint8_t *xm = (k ? x2 : x1) + (m0 + m) * H;                    \
                        int32_t acc = 0;                                                     \
                        for (int64_t d = 0; d < H; d++)                                      \
                            acc += (int32_t)xm[d] *                                          \
                                   (int32_t)p[((g * H4 + d / 4) * 16 + l) * 4 + d % 4];      \
                        out[k][g][m][l] = acc;                                               \
                    }                                                                        \
    }
#endif
DEFINE_DOTS(dots_m1, 1)
DEFINE_DOTS(dots_m2, 2)

#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
/* Linux hands AMX's tile data to a process only on request (arch_prctl, once per process). */
int head_q8_amx(void) {
    static int ok = -1;
    if (ok < 0) ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
    return ok;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg_t;

/* Tiles 0-1: 16 rows x 64 bytes of the two activation limbs; 2-3: one 64-deep slice of two
 * 16-row vocabulary groups (packed, 16 rows of 4 x 16 bytes); 4-7: int32 sums [16 x 16] of
 * limb x group. */
static void amx_configure(void) {
    tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* sums[k][g][m][l] for limbs k, groups grp and grp + 1, 16 rows from rb: one pass over H. */
static void amx_dots(const uint8_t *x1, const uint8_t *x2, int64_t H, const int8_t *packed,
                     int64_t grp, int64_t rb, int32_t sums[4][16][16]) {
    const int64_t H4 = H / 4;
    const int8_t *g0 = packed + grp * H4 * 64, *g1 = g0 + H4 * 64;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t kc = 0; kc < H / 64; kc++) {
        _tile_loadd(0, x1 + rb * H + kc * 64, H);
        _tile_loadd(1, x2 + rb * H + kc * 64, H);
        _tile_loadd(2, g0 + kc * 16 * 64, 64);
        _tile_loadd(3, g1 + kc * 16 * 64, 64);
        _tile_dpbusd(4, 0, 2);
        _tile_dpbusd(5, 1, 2);
        _tile_dpbusd(6, 0, 3);
        _tile_dpbusd(7, 1, 3);
    }
    _tile_stored(4, sums[0], 64);
    _tile_stored(5, sums[1], 64);
    _tile_stored(6, sums[2], 64);
    _tile_stored(7, sums[3], 64);
}
#else
int head_q8_amx(void) { return 0; }
#endif

/* Per row: the K outlier channels outl apart (xo [M, K]; none for K = 0), the rest x_A as two
 * u8 limbs, x_A ~ sx (x1 - 128) + sx / 254 (x2 - 128) within ex = sx / 508 an entry, the
 * scale, and the bound's factor of s_v: xl1 = |x_A|_1 / 2 + H ex / 2, plus 2.5e-4 |x_O|_1 for
 * the fp32 outlier sum's rounding (int8_screen.c derives it; K <= MAX_OUTLIERS). */
static void quantize_rows(const float *x, int64_t M, int64_t H, const int32_t *outl, int64_t K,
                          uint8_t *x1, uint8_t *x2, float *xo, float *sx, float *xl1) {
    for (int64_t m = 0; m < M; m++) {
        float rest[H];
        memcpy(rest, x + m * H, sizeof(float) * (size_t)H);
        float ol1 = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            xo[m * K + k] = rest[outl[k]];
            ol1 += fabsf(rest[outl[k]]);
        }
        for (int64_t k = 0; k < K; k++) rest[outl[k]] = 0.0f;
        float amax, l1;
        abs_max_sum(rest, H, &amax, &l1);
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        for (int64_t d = 0; d < H; d++) {
            const float t = rest[d] / scale, hi = rintf(t);
            x1[m * H + d] = (uint8_t)((int)hi + 128);
            x2[m * H + d] = (uint8_t)((int)rintf((t - hi) * 254.0f) + 128);
        }
        sx[m] = scale;
        xl1[m] = 0.5f * l1 + 0.5f * (float)H * (scale / 508.0f) + 2.5e-4f * ol1;
    }
}

/* This thread's chunks of the vocabulary (taken dynamically, ascending per thread). */
static void scan_vector(const scan_t *a, cands_t *mine) {
    const int64_t H4 = a->H / 4, M = a->M;
    const int64_t groups = a->V16 / 16, passes = M / 2 + M % 2; /* next is fetched meanwhile */
    _Pragma("omp for schedule(dynamic, 16)")
    for (int64_t grp = 0; grp < groups; grp += 4) {
        const int8_t *p = a->packed + grp * H4 * 64;
        const int8_t *next = grp + 4 < groups ? p + 4 * H4 * 64 : NULL;
        int64_t m0 = 0, pass = 0;
        for (; m0 + 2 <= M; m0 += 2) {
            int32_t acc[2][4][2][16];
            const unsigned pf = next ? prefetch_mask(pass++, passes) : 0u;
            dots_m2(a->x1, a->x2, a->H, p, m0, acc, next, pf);
            for (int g = 0; g < 4; g++)
                for (int m = 0; m < 2; m++)
                    screen16(a, mine, m0 + m, acc[0][g][m], acc[1][g][m], (grp + g) * 16);
        }
        for (; m0 < M; m0++) {
            int32_t acc[2][4][1][16];
            const unsigned pf = next ? prefetch_mask(pass++, passes) : 0u;
            dots_m1(a->x1, a->x2, a->H, p, m0, acc, next, pf);
            for (int g = 0; g < 4; g++)
                screen16(a, mine, m0, acc[0][g][0], acc[1][g][0], (grp + g) * 16);
        }
    }
}

#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
static void scan_amx(const scan_t *a, cands_t *mine) {
    amx_configure(); /* tile state is per thread */
    _Pragma("omp for schedule(static)")
    for (int64_t grp = 0; grp < a->V16 / 16; grp += 2) {
        for (int64_t rb = 0; rb < a->M; rb += 16) {
            int32_t sums[4][16][16];
            amx_dots(a->x1, a->x2, a->H, a->packed, grp, rb, sums);
            for (int64_t r = 0; r < 16 && rb + r < a->M; r++)
                for (int g = 0; g < 2; g++)
                    screen16(a, mine, rb + r, sums[2 * g][r], sums[2 * g + 1][r], (grp + g) * 16);
        }
    }
    _tile_release();
}
#endif

/* Both limbs' sums of every row against the whole vocabulary, screened (per_thread, M lists a
 * thread) or summed into the envelope (env). */
static void scan_all(const float *x, int64_t M, int64_t H, const int32_t *outl, int64_t K,
                     const float *wo, const int8_t *packed, const float *s, const int32_t *qsum,
                     const float *wl1, int64_t V16, int64_t V, const env_t *env,
                     cands_t *per_thread) {
    const int threads = omp_get_max_threads();
    const int64_t M16 = (M + 15) / 16 * 16; /* AMX reads whole 16-row tiles */
    uint8_t *x1 = malloc((size_t)(2 * M16 * H)), *x2 = x1 + M16 * H;
    memset(x1, 128, (size_t)(2 * M16 * H));
    float *sx = malloc(sizeof(float) * (size_t)M), *xl1 = malloc(sizeof(float) * (size_t)M);
    float *xo = malloc(sizeof(float) * (size_t)(M * (K > 0 ? K : 1)));
    quantize_rows(x, M, H, outl, K, x1, x2, xo, sx, xl1);
    const scan_t args = {x1, x2, sx, xl1, s, wl1, xo, wo, qsum, packed, M, H, K, V16, V, env};
    /* Below 4 rows the tiles' fixed costs lose to VNNI (bench/kernels.py, greedy_head) */
    const int amx = M >= 4 && H % 64 == 0 && head_q8_amx();
    _Pragma("omp parallel num_threads(threads)") {
        cands_t *mine = per_thread ? per_thread + omp_get_thread_num() * M : NULL;
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
        if (amx)
            scan_amx(&args, mine);
        else
#endif
            scan_vector(&args, mine);
    }
    (void)amx;
    free(xo);
    free(xl1);
    free(sx);
    free(x1);
}

void head_argmax_q8(const float *x, int64_t M, int64_t H, const int8_t *packed, const float *s,
                    const int32_t *qsum, const float *wl1, int64_t V16, const uint16_t *w,
                    int64_t V, int64_t *idx) {
    const int threads = omp_get_max_threads();
    cands_t *per_thread = malloc(sizeof(cands_t) * (size_t)(threads * M));
    for (int64_t i = 0; i < threads * M; i++) cands_init(per_thread + i, 0);
    scan_all(x, M, H, NULL, 0, NULL, packed, s, qsum, wl1, V16, V, NULL, per_thread);
    _Pragma("omp parallel for schedule(dynamic)")
    for (int64_t m = 0; m < M; m++) idx[m] = rescore(x + m * H, H, w, per_thread, threads, M, m);
    for (int64_t i = 0; i < threads * M; i++) cands_free(per_thread + i);
    free(per_thread);
}

/* The sampler's envelope (head_envelope.h): gmax, gsum, glow [M, V16 / 16] per row and group,
 * with 1 / temperature inv_t [M]; ub, lb [M, V] every token's bounds unless NULL. The K outlier
 * channels outl (weights wo [V16/16, K, 16] fp32) are summed in fp32, apart from the limbs. */
void head_envelope_q8(const float *x, int64_t M, int64_t H, const int32_t *outl, int64_t K,
                      const float *wo, const int8_t *packed, const float *s, const int32_t *qsum,
                      const float *wl1, int64_t V16, int64_t V, const float *inv_t, float *gmax,
                      float *gsum, float *glow, float *ub, float *lb) {
    const env_t env = {gmax, gsum, glow, ub, lb, inv_t, V16 / 16, V};
    if (K > MAX_OUTLIERS) K = MAX_OUTLIERS; /* the caller checks; the bound holds only so */
    scan_all(x, M, H, outl, K, wo, packed, s, qsum, wl1, V16, V, &env, NULL);
}

/* Both limbs' int32 sums of one row (x1, x2 [H]) against one group of 16 vocabulary rows (p:
 * its [H/4, 16, 4] block): exact, so equal to the scan's whatever the order. */
static void group_sums(const uint8_t *x1, const uint8_t *x2, int64_t H, const int8_t *p,
                       int32_t hi[16], int32_t lo[16]) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    __m512i a1 = _mm512_setzero_si512(), a2 = _mm512_setzero_si512();
    for (int64_t d4 = 0; d4 < H / 4; d4++) {
        const __m512i w = _mm512_loadu_si512((const void *)(p + d4 * 64));
        int32_t q1, q2;
        memcpy(&q1, x1 + 4 * d4, 4);
        memcpy(&q2, x2 + 4 * d4, 4);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(q1), w);
        a2 = _mm512_dpbusd_epi32(a2, _mm512_set1_epi32(q2), w);
    }
    _mm512_storeu_si512((void *)hi, a1);
    _mm512_storeu_si512((void *)lo, a2);
#else
    for (int l = 0; l < 16; l++) {
        int32_t s1 = 0, s2 = 0;
        for (int64_t d = 0; d < H; d++) {
            const int32_t q = p[((d / 4) * 16 + l) * 4 + d % 4];
            s1 += (int32_t)x1[d] * q;
            s2 += (int32_t)x2[d] * q;
        }
        hi[l] = s1;
        lo[l] = s2;
    }
#endif
}

/* ub, lb [n, 16] of the groups groups[i] of rows rows[i], as head_envelope_q8 computed them
 * (the same outliers): the same int32 sums (exact), the same float steps. */
void head_bounds_q8(const float *x, int64_t M, int64_t H, const int32_t *outl, int64_t K,
                    const float *wo, const int8_t *packed, const float *s, const int32_t *qsum,
                    const float *wl1, int64_t V, const int64_t *rows, const int64_t *groups,
                    int64_t n, float *ub, float *lb) {
    if (K > MAX_OUTLIERS) K = MAX_OUTLIERS;
    uint8_t *x1 = malloc((size_t)(2 * M * H)), *x2 = x1 + M * H;
    float *sx = malloc(sizeof(float) * (size_t)M), *xl1 = malloc(sizeof(float) * (size_t)M);
    float *xo = malloc(sizeof(float) * (size_t)(M * (K > 0 ? K : 1)));
    quantize_rows(x, M, H, outl, K, x1, x2, xo, sx, xl1);
    _Pragma("omp parallel for schedule(dynamic, 8) if (n >= 64)")
    for (int64_t i = 0; i < n; i++) {
        const int64_t m = rows[i], v0 = groups[i] * 16;
        for (int l = 0; l < 16; l++) ub[i * 16 + l] = lb[i * 16 + l] = -INFINITY;
        if (v0 >= V) continue;
        int32_t hi[16], lo[16];
        group_sums(x1 + m * H, x2 + m * H, H, packed + groups[i] * (H / 4) * 64, hi, lo);
        float a[16];
        logits16(a, hi, lo, v0, s, qsum, sx[m], V);
        outliers16(a, xo + m * K, wo + v0 * K, K);
        bounds16(a, v0, s, wl1, sx[m] / 508.0f, xl1[m], V, ub + i * 16, lb + i * 16);
    }
    free(xo);
    free(xl1);
    free(sx);
    free(x1);
}
