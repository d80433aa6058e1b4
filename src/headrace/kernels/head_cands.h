/* The exact greedy head's candidate lists, shared by int8_head.c (two u8 limbs) and
 * int8_screen.c (one u8 limb and outlier channels in fp32).
 *
 * A screen gives each vocabulary row v a logit a_v within b_v of x . w_v. Every v whose
 * a_v + b_v reaches max_u (a_u - b_u) may be the argmax: it is kept, per thread and row while
 * the scan runs (filtered by the running maximum lower bound, so no [M, V] scratch is written),
 * and rescored in fp32 from the bf16 row at the end.
 */
#ifndef HEADRACE_HEAD_CANDS_H
#define HEADRACE_HEAD_CANDS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

/* Outlier channels a screen may sum in fp32: the bound's rounding term (2.5e-4 |x_O|_1 s_v,
 * int8_screen.c) holds for at most this many. */
#define MAX_OUTLIERS 32

typedef struct {
    float lower;  /* running max of a_v - b_v */
    int64_t n, cap;
    int64_t limit; /* more candidates than this: give up on the row (overflow), 0: no limit */
    int overflow;
    int32_t *v;   /* candidates, ascending */
    float *upper; /* and their a_v + b_v */
} cands_t;

static inline void cands_init(cands_t *c, int64_t limit) {
    c->lower = -INFINITY;
    c->n = 0;
    c->cap = 1024;
    c->limit = limit;
    c->overflow = 0;
    c->v = malloc(sizeof(int32_t) * 1024);
    c->upper = malloc(sizeof(float) * 1024);
}

static inline void cands_free(cands_t *c) {
    free(c->v);
    free(c->upper);
}

/* Chunks of the vocabulary go to threads dynamically: with as many OpenMP threads as cores, a
 * thread preempted by another process (the HTTP front end, a client) would otherwise hold up
 * the step at the barrier while its partner waits with nothing to do.
 *
 * The screens walk the vocabulary a block of 4 groups (64 rows) at a time and pass over a
 * block once per few hidden rows, from L2 after the first pass: the memory then sits idle
 * unless the next block is fetched meanwhile. Pass j of a block's `passes` prefetches the
 * next block's groups g with g % min(passes, 4) == j (all 4 in one pass issue more misses
 * than a core keeps in flight). 16 rows, one limb: 12.3 -> 9.3 ms. */
static inline unsigned prefetch_mask(int64_t pass, int64_t passes) {
    const int64_t spread = passes < 4 ? passes : 4;
    unsigned mask = 0;
    for (int64_t g = pass; pass < 4 && g < 4; g += spread) mask |= 1u << g;
    return mask;
}

/* How a matmul of M rows over `blocks` blocks of 64 channels is cut into tasks (bf16_linear.c,
 * int8_small.c): whole blocks per thread keep each weight read once; where there are fewer
 * blocks than threads (o_proj's 10 on a 16-core CPU) the rows are split too, in `chunks` of
 * `rows` (a multiple of 4). Threads take `grab` consecutive tasks at a time, so that the block
 * a thread prefetches is mostly the one it takes next. */
typedef struct {
    int64_t chunks, rows, grab;
} block_split_t;

static inline block_split_t block_split(int64_t blocks, int64_t M, int64_t threads) {
    block_split_t s;
    s.chunks = blocks >= threads ? 1 : (threads + blocks - 1) / blocks;
    if (s.chunks > (M + 3) / 4) s.chunks = (M + 3) / 4;
    s.rows = ((M + s.chunks - 1) / s.chunks + 3) / 4 * 4;
    const int64_t per = blocks * s.chunks / (4 * threads);
    s.grab = per > 1 ? per : 1;
    return s;
}

#ifdef __AVX512F__
/* Line d of group g of a block (64 bytes at p + (g * lines + d) * 64), held in a register: GCC
 * otherwise folds it into each dot-product instruction as a memory operand, one load per use,
 * more than Zen 4's load ports feed. With bit g of pfmask set, the same line of the next block
 * (at pf) is prefetched into L2. */
static inline __m512i block_line(const void *p, const void *pf, unsigned pfmask, int g,
                                 int64_t lines, int64_t d) {
    const int64_t at = (g * lines + d) * 64;
    if (pfmask >> g & 1) _mm_prefetch((const char *)pf + at, _MM_HINT_T1);
    __m512i v = _mm512_loadu_si512((const void *)((const char *)p + at));
    __asm__("" : "+v"(v));
    return v;
}
#endif

/* max_d |x_d| and sum_d |x_d|: a row's quantization scale and its bound's |x|_1. */
static inline void abs_max_sum(const float *x, int64_t H, float *amax, float *l1) {
    float m = 0.0f, s = 0.0f;
    for (int64_t d = 0; d < H; d++) {
        const float a = fabsf(x[d]);
        m = a > m ? a : m;
        s += a;
    }
    *amax = m;
    *l1 = s;
}

static inline void keep(cands_t *c, int32_t v, float upper) {
    if (c->overflow) return;
    if (c->n == c->cap) { /* compact: drop those the running lower bound has since excluded */
        int64_t k = 0;
        for (int64_t i = 0; i < c->n; i++)
            if (c->upper[i] >= c->lower) {
                c->v[k] = c->v[i];
                c->upper[k++] = c->upper[i];
            }
        c->n = k;
        if (c->limit > 0 && k > c->limit) { /* a flat distribution: the caller re-screens */
            c->overflow = 1;
            return;
        }
        if (k > c->cap / 2) { /* many tokens within the bound: grow */
            c->cap *= 2;
            c->v = realloc(c->v, sizeof(int32_t) * (size_t)c->cap);
            c->upper = realloc(c->upper, sizeof(float) * (size_t)c->cap);
        }
    }
    c->v[c->n] = v;
    c->upper[c->n++] = upper;
}

/* Screened logits a[16] of rows v0.. (fewer past V): update the lower bound, keep candidates.
 * b_v = 1.1 (ex |w_v|_1 + s_v xl1) + 1e-6 |a_v|: ex bounds each activation's error, xl1 the
 * weight rounding's reach (|x|_1 / 2 + H ex / 2, as |s q_v|_1 <= |w_v|_1 + H s_v / 2); 1.1 and
 * 1e-6 |a_v| cover fp32 rounding in the screen and the rescoring. */
static inline void screen_logits(cands_t *c, const float *a16, int64_t v0, const float *s,
                                 const float *wl1, float ex, float xl1, int64_t V) {
    if (v0 >= V) return; /* padding rows are never candidates */
    const int n = V - v0 >= 16 ? 16 : (int)(V - v0);
#ifdef __AVX512F__
    const __mmask16 valid = (__mmask16)((1u << n) - 1u);
    const __m512 a = _mm512_loadu_ps(a16);
    const __m512 b = _mm512_fmadd_ps(
        _mm512_set1_ps(1e-6f), _mm512_abs_ps(a),
        _mm512_mul_ps(_mm512_set1_ps(1.1f),
                      _mm512_fmadd_ps(_mm512_set1_ps(ex), _mm512_loadu_ps(wl1 + v0),
                                      _mm512_mul_ps(_mm512_loadu_ps(s + v0), _mm512_set1_ps(xl1)))));
    const __m512 up = _mm512_add_ps(a, b), lo = _mm512_sub_ps(a, b);
    /* the horizontal max only where a lane raises the lower bound: rarely, after the start */
    if (_mm512_mask_cmp_ps_mask(valid, lo, _mm512_set1_ps(c->lower), _CMP_GT_OQ))
        c->lower = _mm512_mask_reduce_max_ps(valid, lo);
    float upper[16];
    _mm512_storeu_ps(upper, up);
    uint32_t k = _mm512_mask_cmp_ps_mask(valid, up, _mm512_set1_ps(c->lower), _CMP_GE_OQ);
    while (k) {
        const int l = __builtin_ctz(k);
        keep(c, (int32_t)(v0 + l), upper[l]);
        k &= k - 1;
    }
#else
    float b[16];
    for (int l = 0; l < n; l++) {
        b[l] = 1.1f * (ex * wl1[v0 + l] + s[v0 + l] * xl1) + 1e-6f * fabsf(a16[l]);
        if (a16[l] - b[l] > c->lower) c->lower = a16[l] - b[l];
    }
    for (int l = 0; l < n; l++)
        if (a16[l] + b[l] >= c->lower) keep(c, (int32_t)(v0 + l), a16[l] + b[l]);
#endif
}

/* x . row in fp32, row in bf16 (H a multiple of 4). */
static inline float dot_bf16(const float *x, const uint16_t *row, int64_t H) {
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= H; d += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + d), bf16_load16(row + d), acc);
    float dot = _mm512_reduce_add_ps(acc);
#else
    float dot = 0.0f;
    int64_t d = 0;
#endif
    for (; d < H; d++) dot += x[d] * bf16_load(row, d);
    return dot;
}

/* Row m's argmax among its candidates (ties go to the lowest v, in whatever order the threads
 * took their chunks), or -1 if a thread gave up on the row. */
static inline int64_t rescore(const float *xm, int64_t H, const uint16_t *w,
                              const cands_t *per_thread, int threads, int64_t M, int64_t m) {
    float lower = -INFINITY;
    for (int t = 0; t < threads; t++) {
        const cands_t *c = per_thread + t * M + m;
        if (c->overflow) return -1;
        lower = c->lower > lower ? c->lower : lower;
    }
    float best = -INFINITY;
    int64_t at = -1;
    for (int t = 0; t < threads; t++) {
        const cands_t *c = per_thread + t * M + m;
        for (int64_t i = 0; i < c->n; i++) {
            if (!(c->upper[i] >= lower)) continue;
            if (i + 4 < c->n) /* the rows lie scattered: fetch a few ahead */
                for (int64_t d = 0; d < H; d += 32)
                    __builtin_prefetch(w + (int64_t)c->v[i + 4] * H + d);
            const float dot = dot_bf16(xm, w + (int64_t)c->v[i] * H, H);
            if (dot > best || (dot == best && c->v[i] < at)) {
                best = dot;
                at = c->v[i];
            }
        }
    }
    return at;
}

#endif
