/* A screened top_p row's head, in three passes over the row instead of a dozen torch ops
 * (kernels/screened_row.py; engine/runner/screened_top_p.py says what the head is for).
 *
 * Shapes: u, w [V] fp32: the int8 head's ub and lb of one row's logits, scaled in place by
 * 1 / T. Out: eu, ew [V] exp(u - top), exp(w - top) with 0 on the head; head ids [<= V].
 * The head is the tokens of largest u, whole buckets of 1/16 nat below the row's top, as many
 * buckets as hold at most `most` tokens together (at least the first). exp is fast_exp.h's
 * (relative error ~2e-7, about 2 fp32 ulps).
 */
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "fast_exp.h"

#define ROW_BUCKETS 1024
#define ROW_SCALE 16.0f /* buckets per nat */

static inline int row_bucket(float top, float v) {
    const float d = (top - v) * ROW_SCALE;
    return d >= (float)(ROW_BUCKETS - 1) || d != d ? ROW_BUCKETS - 1 : (int)d;
}

/* Fills eu, ew [V] with exp(u - top), exp(w - top) and bucket [V] with each token's bucket;
 * returns sum eu, summed in double. Shape: 16 tokens a vector. */
static double row_exps(const float *u, const float *w, int64_t V, float top, float *eu, float *ew,
                       uint16_t *bucket) {
    int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    double total = 0.0;
    __m512d su = _mm512_setzero_pd();
    const __m512 t = _mm512_set1_ps(top), scale = _mm512_set1_ps(ROW_SCALE);
    const __m512 cap = _mm512_set1_ps((float)(ROW_BUCKETS - 1));
    for (; j + 16 <= V; j += 16) {
        const __m512 uj = _mm512_loadu_ps(u + j), wj = _mm512_loadu_ps(w + j);
        const __m512 e = exp16(_mm512_sub_ps(uj, t)), f = exp16(_mm512_sub_ps(wj, t));
        _mm512_storeu_ps(eu + j, e);
        _mm512_storeu_ps(ew + j, f);
        su = _mm512_add_pd(su, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        su = _mm512_add_pd(su, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
        /* (top - u) * scale, capped as row_bucket (NaN -> the cap: min_ps returns its second
         * operand when one is NaN) */
        __m512 b = _mm512_min_ps(_mm512_mul_ps(_mm512_sub_ps(t, uj), scale), cap);
        b = _mm512_max_ps(b, _mm512_setzero_ps());
        _mm256_storeu_si256((__m256i *)(bucket + j),
                            _mm512_cvtepi32_epi16(_mm512_cvttps_epi32(b)));
    }
    total = _mm512_reduce_add_pd(su);
#else
    double total = 0.0;
#endif
    for (; j < V; j++) {
        eu[j] = exp_approx(u[j] - top);
        ew[j] = exp_approx(w[j] - top);
        total += eu[j];
        bucket[j] = (uint16_t)row_bucket(top, u[j]);
    }
    return total;
}

/* sum a and sum b [V], in double. */
static void sums_double(const float *a, const float *b, int64_t V, double *d) {
    double sa = 0.0, sb = 0.0;
    _Pragma("omp simd reduction(+ : sa, sb)")
    for (int64_t j = 0; j < V; j++) {
        sa += (double)a[j];
        sb += (double)b[j];
    }
    d[0] = sa;
    d[1] = sb;
}

/* The last bucket of the head: as many of the first buckets as hold at most `most` tokens, and
 * at least the first. */
static int head_last_bucket(const uint16_t *bucket, int64_t V, int64_t most) {
    int64_t count[ROW_BUCKETS] = {0};
    for (int64_t j = 0; j < V; j++)
        count[bucket[j]] += 1;
    int last = 0;
    for (int64_t cum = count[0]; last + 1 < ROW_BUCKETS && cum + count[last + 1] <= most; last++)
        cum += count[last + 1];
    return last;
}

/* Out: f[0] top, f[1] tail_top (the largest u off the head, -inf if none); d[0] sum of eu over
 * the row, d[1] over the head, d[2] over the tail, d[3] sum of ew over the tail (summed again
 * once the head is zeroed: 0 for an empty tail, never a difference's rounding). Returns the
 * head's size.
 * bucket: [V] scratch. */
int64_t screened_row_head(float *u, float *w, int64_t V, float inv_t, int64_t most, float *eu,
                          float *ew, int64_t *head, uint16_t *bucket, float *f, double *d) {
    float top = -INFINITY;
    _Pragma("omp simd reduction(max : top)")
    for (int64_t j = 0; j < V; j++) {
        u[j] *= inv_t;
        w[j] *= inv_t;
        top = u[j] > top ? u[j] : top;
    }
    const double total = row_exps(u, w, V, top, eu, ew, bucket);
    const uint16_t last = (uint16_t)head_last_bucket(bucket, V, most);
    float tail_top = -INFINITY;
    _Pragma("omp simd reduction(max : tail_top)")
    for (int64_t j = 0; j < V; j++)
        tail_top = bucket[j] > last && u[j] > tail_top ? u[j] : tail_top;
    int64_t n = 0;
    for (int64_t j = 0; j < V; j++)
        if (bucket[j] <= last)
            head[n++] = j;
    double on_head = 0.0;
    for (int64_t i = 0; i < n; i++) {
        on_head += eu[head[i]];
        eu[head[i]] = 0.0f;
        ew[head[i]] = 0.0f;
    }
    double tail[2];
    sums_double(eu, ew, V, tail);
    f[0] = top;
    f[1] = tail_top;
    d[0] = total;
    d[1] = on_head;
    d[2] = tail[0];
    d[3] = tail[1];
    return n;
}

/* out[i] = x . w[ids[i]]: x [H] fp32, w [*, H] bf16 rows (row stride ldw), fp32 sums. */
void rows_dot_bf16(const float *x, int64_t H, const uint16_t *w, int64_t ldw, const int64_t *ids,
                   int64_t n, float *out) {
    _Pragma("omp parallel for schedule(static) if (n >= 256)")
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = w + ids[i] * ldw;
        float s = 0.0f;
        _Pragma("omp simd reduction(+ : s)")
        for (int64_t k = 0; k < H; k++)
            s += x[k] * bf16_load(row, k);
        out[i] = s;
    }
}
