/* One token drawn from each row's distribution (kernels/sample_draw.py): softmax(x) kept to
 * the row's top_p set (engine/runner/top_p.py's rule), by inverse CDF in vocabulary order with
 * the row's uniform number (engine/runner/sampler.py's draw), without sorting or listing the
 * set: the sampler's whole draw in a few passes over the row.
 *
 * Shapes: logits [S, V] bf16 or fp32 (rows `stride` apart), rows [R] (which rows to draw), t [R]
 * (each row is x = logits / t, in fp32, as torch divides; -inf: not allowed), p [R] (>= 1: no
 * top_p), u [R] in [0, 1) -> out [R] token ids. Rows run in parallel. Each pass reads the row
 * a block of DRAW_BLOCK tokens at a time into fp32 (no copy of the row is made); a row's
 * scratch lives on its thread's stack (about 220 KB; glibc's threads have 8 MB).
 *
 * The set. w = exp(x - max) (fast_exp.h, relative error ~2e-7; 0 for -inf) is summed into
 * buckets of 1/16 nat below the row's max (double): every token of a bucket is likelier than
 * every token of a later one, so the buckets whose running mass stays at or below the goal
 * (p Z - 1e-6 Z: "reaches p" to 1e-6 of the mass) are kept whole and those after the one that
 * passes it dropped. That edge bucket's tokens are gathered and walked likeliest first (ties by
 * id), a weighted quickselect narrowing them first: a token is kept while the mass before it is
 * below the goal, the likeliest always. The set is then {x > cut} plus the tokens equal to the
 * cut up to its id: a test per token, no list.
 *
 * The draw. The set's mass per block of DRAW_BLOCK tokens, then u times their sum is located:
 * its block, then its token (the first whose running mass passes it); sums in double.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "fast_exp.h"

#define DRAW_BUCKETS 1024
#define DRAW_PER_NAT 16.0f
#define DRAW_BLOCK 4096
#define DRAW_RULE 1e-6 /* the reference's "reaches p", of Z */
#define DRAW_SMALL 32  /* the quickselect sorts a region this small */

typedef struct {
    float x, w;
    int32_t id;
} draw_token;

typedef struct {
    const void *data; /* the row's first logit */
    int bf16;         /* else fp32 */
    float t;          /* x = logit / t */
    int64_t V;
} draw_source;

/* x of tokens j0 .. j0 + n (n <= DRAW_BLOCK) into xs. */
static void draw_load(draw_source src, int64_t j0, int64_t n, float *xs) {
    int64_t j = 0;
    if (src.bf16) {
        const uint16_t *row = (const uint16_t *)src.data + j0;
#ifdef __AVX512F__
        const __m512 t = _mm512_set1_ps(src.t);
        if (src.t == 1.0f) /* x / 1 is x: no division, each pass of a T = 1 row reads faster */
            for (; j + 16 <= n; j += 16)
                _mm512_storeu_ps(xs + j, bf16_load16(row + j));
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(xs + j, _mm512_div_ps(bf16_load16(row + j), t));
#endif
        for (; j < n; j++)
            xs[j] = bf16_load(row, j) / src.t;
    } else {
        const float *row = (const float *)src.data + j0;
        _Pragma("omp simd")
        for (j = 0; j < n; j++)
            xs[j] = row[j] / src.t;
    }
}

/* Per token of xs[0 .. n), n <= DRAW_BLOCK: w = exp(x - top), 0 for -inf (and NaN:
 * never drawn), and (unless bucket is NULL) its bucket (how far below the max, in 1/16 nat;
 * past the last: the last).
 * Every pass takes both from here, so they agree to the bit. */
static void draw_lanes(const float *xs, int64_t n, float top, float *w, int32_t *bucket) {
    int64_t j = 0;
#ifdef __AVX512F__
    const __m512 vtop = _mm512_set1_ps(top), scale = _mm512_set1_ps(DRAW_PER_NAT);
    const __m512 end = _mm512_set1_ps((float)(DRAW_BUCKETS - 1));
    for (; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, xs + j);
        const __mmask16 real = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_GT_OQ);
        const __m512 d = _mm512_sub_ps(vtop, v);
        _mm512_mask_storeu_ps(w + j, m, _mm512_maskz_mov_ps(real, exp16(_mm512_sub_ps(v, vtop))));
        /* min(NaN, end) is end: a NaN's bucket is the last, as past it */
        const __m512 b = _mm512_min_ps(_mm512_mul_ps(d, scale), end);
        if (bucket)
            _mm512_mask_storeu_epi32(bucket + j, m, _mm512_cvttps_epi32(b));
    }
#endif
    for (; j < n; j++) {
        const float v = xs[j], d = (top - v) * DRAW_PER_NAT;
        w[j] = v > -INFINITY ? exp_approx(v - top) : 0.0f;
        if (bucket)
            bucket[j] = d >= (float)(DRAW_BUCKETS - 1) || d != d ? DRAW_BUCKETS - 1 : (int32_t)d;
    }
}

/* The tokens of xs[0 .. n) in bucket k: their x into ex, their place into at; how many.
 * ex and at hold n + 16. */
static int64_t draw_select(const float *xs, int64_t n, float top, int k, float *ex, int32_t *at) {
    int64_t got = 0, j = 0;
#ifdef __AVX512F__
    const __m512 vtop = _mm512_set1_ps(top), scale = _mm512_set1_ps(DRAW_PER_NAT);
    const __m512 end = _mm512_set1_ps((float)(DRAW_BUCKETS - 1));
    const __m512i want = _mm512_set1_epi32(k), lane = _mm512_setr_epi32(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; j < n; j += 16) {
        const __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, xs + j);
        const __m512 d = _mm512_min_ps(_mm512_mul_ps(_mm512_sub_ps(vtop, v), scale), end);
        const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(m, _mm512_cvttps_epi32(d), want);
        if (!hit)
            continue;
        /* compress in a register, store whole (the memory form is slow on some cores): the
         * lanes past `got` are overwritten by the next hit, or lie past the result */
        _mm512_storeu_ps(ex + got, _mm512_maskz_compress_ps(hit, v));
        _mm512_storeu_si512(at + got, _mm512_maskz_compress_epi32(
                                          hit, _mm512_add_epi32(lane, _mm512_set1_epi32((int)j))));
        got += __builtin_popcount(hit);
    }
#endif
    for (; j < n; j++) {
        const float d = (top - xs[j]) * DRAW_PER_NAT;
        if ((d >= (float)(DRAW_BUCKETS - 1) || d != d ? DRAW_BUCKETS - 1 : (int)d) == k) {
            ex[got] = xs[j];
            at[got++] = (int32_t)j;
        }
    }
    return got;
}

/* first in the order: likelier, then the smaller id */
static inline int draw_before(const draw_token *a, const draw_token *b) {
    return a->x > b->x || (a->x == b->x && a->id < b->id);
}

static int draw_compare(const void *a, const void *b) {
    const draw_token *s = a, *t = b;
    return draw_before(s, t) ? -1 : draw_before(t, s) ? 1 : 0;
}

static float draw_max(draw_source src) {
    float m = -INFINITY, xs[DRAW_BLOCK];
    for (int64_t j0 = 0; j0 < src.V; j0 += DRAW_BLOCK) {
        const int64_t n = j0 + DRAW_BLOCK < src.V ? DRAW_BLOCK : src.V - j0;
        draw_load(src, j0, n, xs);
        _Pragma("omp simd reduction(max : m)")
        for (int64_t j = 0; j < n; j++)
            m = xs[j] > m ? xs[j] : m;
    }
    return m;
}

/* Sums of w per bucket: four partial histograms, so that neighbours in one bucket do not wait
 * on each other's store; summed in a fixed order. */
static void draw_hist(draw_source src, float top, double *mass, int32_t *count) {
    float xs[DRAW_BLOCK], w[DRAW_BLOCK];
    int32_t bucket[DRAW_BLOCK];
    double part[4][DRAW_BUCKETS] = {{0}};
    int32_t many[4][DRAW_BUCKETS] = {{0}};
    for (int64_t j0 = 0; j0 < src.V; j0 += DRAW_BLOCK) {
        const int64_t n = j0 + DRAW_BLOCK < src.V ? DRAW_BLOCK : src.V - j0;
        draw_load(src, j0, n, xs);
        draw_lanes(xs, n, top, w, bucket);
        for (int64_t j = 0; j < n; j++) {
            part[j & 3][bucket[j]] += w[j];
            many[j & 3][bucket[j]] += 1;
        }
    }
    for (int b = 0; b < DRAW_BUCKETS; b++) {
        mass[b] = (part[0][b] + part[1][b]) + (part[2][b] + part[3][b]);
        count[b] = many[0][b] + many[1][b] + many[2][b] + many[3][b];
    }
}

/* Keeps e[0..n) (sorted here) in order while the mass before is below the goal (the first
 * always, if nothing is kept yet); `base` goes up by each kept token's w. */
static void draw_walk(draw_token *e, int64_t n, double *base, double goal, draw_token *last,
                      int *have) {
    qsort(e, (size_t)n, sizeof(draw_token), draw_compare);
    for (int64_t i = 0; i < n && (*base < goal || !*have); i++) {
        *last = e[i];
        *have = 1;
        *base += e[i].w;
    }
}

/* The last kept token of the edge e[0..n) (any order; reordered), `base` the mass of every
 * likelier token: a quickselect by mass. Each round splits the region by a pivot into the
 * likelier, the equal and the less likely tokens; if the likelier reach the goal the cut is
 * among them, else they are all kept, the ties are walked by id, and the rest goes on. */
static draw_token draw_cut(draw_token *e, int64_t n, double base, double goal) {
    int64_t lo = 0, hi = n;
    draw_token last = e[0];
    int have = 0;
    while (hi - lo > DRAW_SMALL) {
        const float pivot = e[lo + (hi - lo) / 2].x;
        int64_t g = lo, q = hi; /* [lo, g): likelier than the pivot; [q, hi): less likely */
        double mass = 0.0;
        draw_token least = e[lo]; /* the last of the likelier ones, in order */
        for (int64_t i = lo; i < q;) {
            const draw_token t = e[i];
            if (t.x > pivot) {
                if (g == lo || draw_before(&least, &t))
                    least = t;
                e[i++] = e[g];
                e[g++] = t;
                mass += t.w;
            } else if (t.x < pivot) {
                e[i] = e[--q];
                e[q] = t;
            } else {
                i++;
            }
        }
        if (g > lo && base + mass >= goal) {
            hi = g; /* nothing after them is kept: the cut is among them */
            continue;
        }
        if (g > lo) {
            last = least;
            have = 1;
            base += mass;
        }
        draw_walk(e + g, q - g, &base, goal, &last, &have);
        if (base >= goal || q == hi)
            return last;
        lo = q;
    }
    draw_walk(e + lo, hi - lo, &base, goal, &last, &have);
    return last;
}

/* The row's cut: the last token of its top_p set in order (x, id); all kept: id = V; id -1:
 * no memory for the edge. */
static draw_token draw_top_p(draw_source src, float top, double p) {
    double mass[DRAW_BUCKETS] = {0};
    int32_t count[DRAW_BUCKETS] = {0};
    draw_token all = {-INFINITY, 0.0f, (int32_t)src.V};
    draw_hist(src, top, mass, count);
    double z = 0.0;
    for (int b = 0; b < DRAW_BUCKETS; b++)
        z += mass[b];
    const double goal = p * z - DRAW_RULE * z;
    double before = 0.0;
    int k = 0;
    for (; k < DRAW_BUCKETS && before + mass[k] < goal; k++)
        before += mass[k];
    if (k == DRAW_BUCKETS || count[k] == 0)
        return all; /* rounding: every bucket stays below the goal */
    draw_token *edge = malloc(sizeof(draw_token) * (size_t)count[k]);
    if (edge == NULL)
        return (draw_token){-INFINITY, 0.0f, -1}; /* no memory: the caller says so */
    int64_t n = 0;
    float xs[DRAW_BLOCK], w[DRAW_BLOCK], ex[DRAW_BLOCK + 16];
    int32_t at[DRAW_BLOCK + 16];
    for (int64_t j0 = 0; j0 < src.V && n < count[k]; j0 += DRAW_BLOCK) {
        const int64_t m = j0 + DRAW_BLOCK < src.V ? DRAW_BLOCK : src.V - j0;
        draw_load(src, j0, m, xs);
        const int64_t got = draw_select(xs, m, top, k, ex, at);
        draw_lanes(ex, got, top, w, NULL); /* the same w as the histogram's, to the bit */
        for (int64_t i = 0; i < got && n < count[k]; i++)
            edge[n++] = (draw_token){ex[i], w[i], (int32_t)(j0 + at[i])};
    }
    const draw_token cut = n > 0 ? draw_cut(edge, n, before, goal) : all;
    free(edge);
    return cut;
}

static inline int draw_kept(float v, int64_t j, draw_token cut) {
    return v > cut.x || (v == cut.x && j <= cut.id);
}

/* The set's w over one block, into w (0 outside the set); returns their sum. */
static double draw_block(draw_source src, int64_t j0, int64_t n, float top, draw_token cut,
                         float *w) {
    float xs[DRAW_BLOCK];
    draw_load(src, j0, n, xs);
    draw_lanes(xs, n, top, w, NULL);
    if (cut.id < j0 + n || cut.x > -INFINITY) {
        _Pragma("omp simd")
        for (int64_t j = 0; j < n; j++)
            w[j] = draw_kept(xs[j], j0 + j, cut) ? w[j] : 0.0f;
    }
    double s = 0.0;
    _Pragma("omp simd reduction(+ : s)")
    for (int64_t j = 0; j < n; j++)
        s += w[j];
    return s;
}

static int64_t draw_row(draw_source src, double p, double u) {
    const int64_t V = src.V;
    const float top = draw_max(src);
    if (!(top > -INFINITY))
        return 0; /* no token allowed (or NaN logits): as the reference, the first */
    const draw_token cut = p < 1.0 ? draw_top_p(src, top, p)
                                   : (draw_token){-INFINITY, 0.0f, (int32_t)V};
    if (cut.id < 0)
        return -1;
    const int64_t nb = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double *sums = malloc(sizeof(double) * (size_t)nb);
    float w[DRAW_BLOCK];
    if (sums == NULL)
        return -1;
    double z = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t j0 = b * DRAW_BLOCK, n = j0 + DRAW_BLOCK < V ? DRAW_BLOCK : V - j0;
        sums[b] = draw_block(src, j0, n, top, cut, w);
        z += sums[b];
    }
    const double target = u * z;
    double cum = 0.0;
    int64_t b = 0;
    while (b < nb - 1 && cum + sums[b] <= target)
        cum += sums[b++];
    free(sums);
    const int64_t j0 = b * DRAW_BLOCK, n = j0 + DRAW_BLOCK < V ? DRAW_BLOCK : V - j0;
    draw_block(src, j0, n, top, cut, w);
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (w[j] == 0.0f)
            continue;
        last = j0 + j;
        cum += w[j];
        if (cum > target)
            return last;
    }
    return last; /* the sums' rounding put the target past the block: its last token */
}

/* out[r]: row r's token; -1 where memory ran out (the caller takes its torch path). */
void sample_draw(const void *logits, int bf16, int64_t stride, int64_t V, int64_t R,
                 const int64_t *rows, const float *t, const double *p, const double *u,
                 int64_t *out) {
    const int64_t size = bf16 ? 2 : 4;
    _Pragma("omp parallel for schedule(dynamic, 1) if (R > 1)")
    for (int64_t r = 0; r < R; r++) {
        const draw_source src = {(const char *)logits + rows[r] * stride * size, bf16, t[r], V};
        out[r] = draw_row(src, p[r], u[r]);
    }
}
