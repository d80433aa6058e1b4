/* The top_p set of each row without sorting the vocabulary (kernels/top_p_scan.py; the rule is
 * engine/runner/top_p.py's).
 *
 * Shapes: x [R, V] fp32 logits over the temperature, p [R].
 * A token's bucket is how far below the row's largest it is, in quarter octaves of
 * probability: b = min(255, floor((max - x) * 4 / ln 2)); every token of a bucket is at least as
 * likely as every token of the next. One pass finds the max, a second sums exp(x - max) into
 * the 256 buckets (double; fast_exp.h's exp, relative error ~2e-7); the buckets before the one
 * where the mass nears p * Z hold tokens surely kept ("sure"), the one or two around it the
 * edge that the caller sorts, the rest is surely dropped. A third pass lists the sure and the
 * edge tokens' ids, ascending. Rows run in parallel.
 */
#include <math.h>
#include <stdint.h>

#include "fast_exp.h"

#define TOP_P_BUCKETS 256
#define TOP_P_BLOCK 1024
#define TOP_P_SCALE 5.77078016f /* 4 / ln 2: quarter octaves per nat */
#define TOP_P_MARGIN 1e-5 /* of Z: past the approximate exp's rounding and the 1e-6 rule */

static inline int top_p_bucket(float top, float v) {
    const float d = (top - v) * TOP_P_SCALE;
    return d >= 255.0f || d != d ? 255 : (int)d;
}

static float top_p_max(const float *row, int64_t V) {
    float m = -INFINITY;
    _Pragma("omp simd reduction(max : m)")
    for (int64_t j = 0; j < V; j++)
        m = row[j] > m ? row[j] : m;
    return m;
}

static void top_p_hist(const float *row, int64_t V, float top, double *mass, int64_t *count) {
    float w[TOP_P_BLOCK];
    for (int64_t j0 = 0; j0 < V; j0 += TOP_P_BLOCK) {
        const int64_t n = j0 + TOP_P_BLOCK < V ? TOP_P_BLOCK : V - j0;
        _Pragma("omp simd")
        for (int64_t j = 0; j < n; j++)
            w[j] = exp_approx(row[j0 + j] - top);
        for (int64_t j = 0; j < n; j++) {
            const int b = top_p_bucket(top, row[j0 + j]);
            mass[b] += w[j];
            count[b] += 1;
        }
    }
}

/* Per row: its max, Z = sum exp(x - max), the first edge bucket and the last one, how many
 * sure and edge tokens there are. */
void top_p_scan(const float *x, int64_t R, int64_t V, const double *p, float *top, double *total,
                int64_t *first, int64_t *last, int64_t *n_sure, int64_t *n_edge) {
    _Pragma("omp parallel for schedule(dynamic, 1)")
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * V;
        double mass[TOP_P_BUCKETS] = {0};
        int64_t count[TOP_P_BUCKETS] = {0};
        const float m = top_p_max(row, V);
        top_p_hist(row, V, m, mass, count);
        double z = 0.0;
        for (int b = 0; b < TOP_P_BUCKETS; b++)
            z += mass[b];
        const double goal = p[r] * z;
        double cum = 0.0;
        int64_t f = -1, l = TOP_P_BUCKETS - 1, sure = 0, edge = 0;
        for (int b = 0; b < TOP_P_BUCKETS; b++) {
            cum += mass[b];
            if (f < 0 && cum >= goal - TOP_P_MARGIN * z)
                f = b;
            if (cum >= goal + TOP_P_MARGIN * z) {
                l = b;
                break;
            }
        }
        if (f < 0)
            f = l;
        for (int b = 0; b < TOP_P_BUCKETS; b++) {
            if (b < f)
                sure += count[b];
            else if (b <= l)
                edge += count[b];
        }
        top[r] = m;
        total[r] = z;
        first[r] = f;
        last[r] = l;
        n_sure[r] = sure;
        n_edge[r] = edge;
    }
}

/* The ids of each row's sure tokens (at sure_ids + sure_at[r]) and edge tokens (at edge_ids +
 * edge_at[r]), ascending. */
void top_p_collect(const float *x, int64_t R, int64_t V, const float *top, const int64_t *first,
                   const int64_t *last, const int64_t *sure_at, const int64_t *edge_at,
                   int64_t *sure_ids, int64_t *edge_ids) {
    _Pragma("omp parallel for schedule(dynamic, 1)")
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * V;
        int64_t *s = sure_ids + sure_at[r], *e = edge_ids + edge_at[r];
        const int f = (int)first[r], l = (int)last[r];
        for (int64_t j = 0; j < V; j++) {
            const int b = top_p_bucket(top[r], row[j]);
            if (b < f)
                *s++ = j;
            else if (b <= l)
                *e++ = j;
        }
    }
}
