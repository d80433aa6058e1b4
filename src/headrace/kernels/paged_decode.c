/* Decode attention over a paged KV cache: one query token per sequence, read in place.
 *
 * q      [B, Hq, D]          the step's queries
 * kc, vc [N, bs, Hkv, D]     one layer's pools
 * tables [B, W] int64        block ids; tables[b][0] holds position base[b]
 * base   [B] int64           position of the first slot of tables[b][0]
 * lo, hi [B] int64           sequence b attends to positions [lo, hi)   (hi - lo >= 1)
 * out    [B, Hq, D]
 * Query heads h with h / (Hq / Hkv) == g share KV head g (grouped-query attention).
 * Exact softmax: all scores of a (sequence, KV head) pair first, then the weighted sum of V,
 * divided by the sum of weights once at the end. Scores lie row-major, s [n, G], so that a
 * row's G scores are one store and 16 lanes always hold the same G heads in the same order.
 * One task per (sequence, KV head); the AVX-512 path keeps G query rows' sums in registers
 * (G = 1, 2, 4 or 8 and D a multiple of 16), the portable path covers every other shape.
 * Benchmark: bench/kernels.py --only decode.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "fast_exp.h"

#define MAXG 8
#define MAXCH 4 /* column chunks of 16 the weighted sum takes in one pass over the rows */
#define PREFETCH_ROWS 8

#ifdef __AVX512F__
/* r[g] = sum of the 16 lanes of a[g], g < 4: shuffles shared by the four sums (13 instructions
 * where four separate reductions take 32). */
static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
    z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(1, 0, 3, 2)));
    z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castps512_ps128(z);
}

/* s[i * G + g] = q_g . k_i for the n rows at kc + off[i]; qf [G, D] fp32. */
#define DEFINE_SCORES16(NAME, T, LOAD16)                                                      \
    static inline __attribute__((always_inline)) void NAME(                                  \
        const float *qf, const T *kc, const T *vc, const int64_t *off, int64_t n, int64_t D, \
        float *s, int G) {                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                    \
            const T *k = kc + off[i];                                                        \
            if (i + PREFETCH_ROWS < n) { /* rows of scattered blocks: the prefetcher stalls */ \
                const char *nk = (const char *)(kc + off[i + PREFETCH_ROWS]);                \
                const char *nv = (const char *)(vc + off[i + PREFETCH_ROWS]);                \
                for (int64_t b = 0; b < D * (int64_t)sizeof(T); b += 64) {                   \
                    _mm_prefetch(nk + b, _MM_HINT_T0);                                       \
                    _mm_prefetch(nv + b, _MM_HINT_T1); /* V for the weighted sum, into L2 */ \
                }                                                                            \
            }                                                                                \
            __m512 acc[MAXG];                                                                \
            for (int g = 0; g < G; g++) acc[g] = _mm512_setzero_ps();                       \
            for (int64_t c = 0; c < D; c += LANES) {                                         \
                const __m512 kf = LOAD16(k + c);                                             \
                for (int g = 0; g < G; g++)                                                  \
                    acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qf + g * D + c), kf, acc[g]);  \
            }                                                                                \
            if (G >= 4) {                                                                    \
                for (int g = 0; g < G; g += 4)                                               \
                    _mm_storeu_ps(s + i * G + g,                                             \
                                  hsum4(acc[g], acc[g + 1], acc[g + 2], acc[g + 3]));        \
            } else {                                                                         \
                for (int g = 0; g < G; g++) s[i * G + g] = _mm512_reduce_add_ps(acc[g]);     \
            }                                                                                \
        }                                                                                    \
    }
/* acc [G, D] = sum_i w[i * G + g] * v_i over CH 16-wide column chunks at c0: G x CH sums in
 * registers, and a pass over the rows reads 64 * CH contiguous bytes of each. */
#define DEFINE_WSUM16(NAME, T, LOAD16)                                                        \
    static inline __attribute__((always_inline)) void NAME##_pass(                           \
        const float *w, const T *vc, const int64_t *off, int64_t n, int64_t D, float *acc,   \
        int G, int64_t c0, int CH) {                                                         \
        __m512 a[MAXG * MAXCH];                                                              \
        for (int j = 0; j < G * CH; j++) a[j] = _mm512_setzero_ps();                        \
        for (int64_t i = 0; i < n; i++)                                                      \
            for (int g = 0; g < G; g++) {                                                    \
                const __m512 wg = _mm512_set1_ps(w[i * G + g]);                              \
                for (int c = 0; c < CH; c++)                                                 \
                    a[g * CH + c] = _mm512_fmadd_ps(wg, LOAD16(vc + off[i] + c0 + c * LANES), \
                                                    a[g * CH + c]);                          \
            }                                                                                \
        for (int g = 0; g < G; g++)                                                          \
            for (int c = 0; c < CH; c++)                                                     \
                _mm512_storeu_ps(acc + g * D + c0 + c * LANES, a[g * CH + c]);               \
    }                                                                                        \
    static inline __attribute__((always_inline)) void NAME(                                  \
        const float *w, const T *vc, const int64_t *off, int64_t n, int64_t D, float *acc,   \
        int G) {                                                                             \
        const int CH = G == 8 ? 2 : MAXCH; /* at most 16 sums */                             \
        int64_t c0 = 0;                                                                      \
        for (; c0 + CH * LANES <= D; c0 += CH * LANES)                                       \
            NAME##_pass(w, vc, off, n, D, acc, G, c0, CH);                                   \
        for (; c0 < D; c0 += LANES) NAME##_pass(w, vc, off, n, D, acc, G, c0, 1);            \
    }
DEFINE_SCORES16(scores16_bf16, uint16_t, bf16_load16)
DEFINE_SCORES16(scores16_f32, float, f32_load16)
DEFINE_WSUM16(wsum16_bf16, uint16_t, bf16_load16)
DEFINE_WSUM16(wsum16_f32, float, f32_load16)
/* A constant G in each call lets the compiler unroll the g loops and keep acc in registers. */
#define DISPATCH_G(FN, G, ...)                                                                \
    switch (G) {                                                                             \
    case 1: FN(__VA_ARGS__, 1); break;                                                       \
    case 2: FN(__VA_ARGS__, 2); break;                                                       \
    case 4: FN(__VA_ARGS__, 4); break;                                                       \
    default: FN(__VA_ARGS__, 8); break;                                                      \
    }
#define FAST_OK(G, D) ((D) % LANES == 0 && ((G) == 1 || (G) == 2 || (G) == 4 || (G) == 8))

/* v's lanes combined (op) with those G, 2G, ... apart: every lane then holds its head's total
 * (16 % G == 0, so lane l is head l % G in every chunk of s [n, G]). */
static inline __m512 fold_heads(__m512 v, int G, int is_max) {
    for (int shift = 8; shift >= G; shift /= 2) {
        const __m512i idx = _mm512_and_si512(
            _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                             _mm512_set1_epi32(shift)),
            _mm512_set1_epi32(15));
        const __m512 r = _mm512_permutexvar_ps(idx, v);
        v = is_max ? _mm512_max_ps(v, r) : _mm512_add_ps(v, r);
    }
    return v;
}

/* s [n, G] -> e^(s - max) per head, in place; inv[g] = 1 / the head's sum. */
static void softmax16(float *s, int64_t n, int G, float *inv) {
    const int64_t total = n * G;
    __m512 m = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < total; j += LANES) {
        const __mmask16 k = total - j >= LANES ? 0xffff : (__mmask16)((1u << (total - j)) - 1);
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, s + j));
    }
    m = fold_heads(m, G, 1);
    for (int64_t j = 0; j < total; j += LANES) {
        const __mmask16 k = total - j >= LANES ? 0xffff : (__mmask16)((1u << (total - j)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m));
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    sum = fold_heads(sum, G, 0);
    float lanes[LANES];
    _mm512_storeu_ps(lanes, sum);
    for (int g = 0; g < G; g++) inv[g] = 1.0f / lanes[g];
}
#else
#define FAST_OK(G, D) 0
#define DISPATCH_G(...)
static inline void softmax16(float *s, int64_t n, int G, float *inv) {
    (void)s, (void)n, (void)G, (void)inv;
}
#endif

/* The portable softmax: the same result as softmax16 up to the order of the sums. */
static void softmax_rows(float *s, int64_t n, int64_t G, float *inv) {
    for (int64_t g = 0; g < G; g++) {
        float m = -INFINITY, sum = 0.0f;
        for (int64_t i = 0; i < n; i++) m = s[i * G + g] > m ? s[i * G + g] : m;
        for (int64_t i = 0; i < n; i++) {
            s[i * G + g] = exp_approx(s[i * G + g] - m);
            sum += s[i * G + g];
        }
        inv[g] = 1.0f / sum;
    }
}

#define DEFINE_PAGED_DECODE(NAME, T, LOAD, STORE, SCORES16, WSUM16)                           \
    int NAME(const T *q, const T *kc, const T *vc, const int64_t *tables, int64_t width,     \
             const int64_t *base, const int64_t *lo, const int64_t *hi, int64_t B,           \
             int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, float scale, T *out) {          \
        const int64_t G = Hq / Hkv;                                                          \
        const int fast = FAST_OK(G, D);                                                      \
        int failed = 0;                                                                      \
        /* one task (a 1-row step of a model with one KV head): no thread pool to wake */    \
        _Pragma("omp parallel for schedule(dynamic, 1) reduction(| : failed) if (B * Hkv > 1)") \
        for (int64_t task = 0; task < B * Hkv; task++) {                                     \
            const int64_t b = task / Hkv, h = task % Hkv, n = hi[b] - lo[b];                 \
            float *qf = malloc(sizeof(float) * (size_t)(2 * G * D + G * n + G) +             \
                               sizeof(int64_t) * (size_t)n);                                 \
            if (!qf) {                                                                       \
                failed = 1;                                                                  \
                continue;                                                                    \
            }                                                                                \
            float *acc = qf + G * D, *s = acc + G * D, *inv = s + G * n;                     \
            int64_t *off = (int64_t *)(inv + G);                                             \
            for (int64_t i = 0; i < n; i++) {                                                \
                const int64_t rel = lo[b] + i - base[b];                                     \
                const int64_t slot = tables[b * width + rel / bs] * bs + rel % bs;           \
                off[i] = (slot * Hkv + h) * D;                                               \
            }                                                                                \
            for (int64_t g = 0; g < G; g++)                                                  \
                for (int64_t d = 0; d < D; d++)                                              \
                    qf[g * D + d] = LOAD(q, (b * Hq + h * G + g) * D + d) * scale;           \
            if (fast) {                                                                      \
                DISPATCH_G(SCORES16, G, qf, kc, vc, off, n, D, s)                            \
                softmax16(s, n, (int)G, inv);                                                \
                DISPATCH_G(WSUM16, G, s, vc, off, n, D, acc)                                 \
            } else {                                                                         \
                for (int64_t i = 0; i < n; i++)                                              \
                    for (int64_t g = 0; g < G; g++) {                                        \
                        float dot = 0.0f;                                                    \
                        for (int64_t d = 0; d < D; d++)                                      \
                            dot += qf[g * D + d] * LOAD(kc, off[i] + d);                     \
                        s[i * G + g] = dot;                                                  \
                    }                                                                        \
                softmax_rows(s, n, G, inv);                                                  \
                memset(acc, 0, sizeof(float) * (size_t)(G * D));                             \
                for (int64_t i = 0; i < n; i++)                                              \
                    for (int64_t g = 0; g < G; g++)                                          \
                        for (int64_t d = 0; d < D; d++)                                      \
                            acc[g * D + d] += s[i * G + g] * LOAD(vc, off[i] + d);           \
            }                                                                                \
            for (int64_t g = 0; g < G; g++)                                                  \
                for (int64_t d = 0; d < D; d++)                                              \
                    STORE(out, (b * Hq + h * G + g) * D + d, acc[g * D + d] * inv[g]);       \
            free(qf);                                                                        \
        }                                                                                    \
        return failed;                                                                       \
    }

#ifdef __AVX512F__
DEFINE_PAGED_DECODE(paged_decode_bf16, uint16_t, bf16_load, bf16_store, scores16_bf16,
                    wsum16_bf16)
DEFINE_PAGED_DECODE(paged_decode_f32, float, f32_load, f32_store, scores16_f32, wsum16_f32)
#else
DEFINE_PAGED_DECODE(paged_decode_bf16, uint16_t, bf16_load, bf16_store, _, _)
DEFINE_PAGED_DECODE(paged_decode_f32, float, f32_load, f32_store, _, _)
#endif
