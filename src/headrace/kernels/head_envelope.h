/* Per-token bounds of the int8 head's logits, kept per group of 16 vocabulary rows for the
 * exact sampler (int8_head.py, engine/runner/screened_sampler.py).
 *
 * The screen gives each token v a logit a_v within b_v of x . w_v (int8_head.c derives b_v);
 * ub_v = a_v + b_v and lb_v = a_v - b_v then bracket the fp32 logit. A sampled row reads the
 * envelope exp(ub_v / T) as a proposal: per group g of 16 rows the kernel keeps
 *   gmax[m][g] = max ub_v,  gsum[m][g] = sum exp((ub_v - gmax) / T),  glow[m][g] = max lb_v
 * (a [M, V/16] summary instead of an [M, V] tensor: the group mass is exp(gmax / T) gsum),
 * and a group's ub_v and lb_v are computed again, bit for bit, for the proposals drawn from it
 * (head_bounds_q8). The exp is exp_approx's (relative error ~2e-7): it only weighs proposals.
 */
#ifndef HEADRACE_HEAD_ENVELOPE_H
#define HEADRACE_HEAD_ENVELOPE_H

#include <math.h>
#include <stdint.h>

#include "fast_exp.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef struct {
    float *gmax, *gsum, *glow; /* [M, G] (padding groups left as the caller set them) */
    float *ub, *lb;            /* [M, V] every token's bounds, or NULL (tests) */
    const float *inv_t;        /* [M] 1 / temperature */
    int64_t G, V;
} env_t;

/* ub and lb of 16 rows from v0 (lanes past V: -inf), from the screened logits a16; the same
 * b_v as screen_logits (head_cands.h). */
static inline void bounds16(const float *a16, int64_t v0, const float *s, const float *wl1,
                            float ex, float xl1, int64_t V, float *up, float *lo) {
    const int n = V - v0 >= 16 ? 16 : (int)(V - v0);
    for (int l = 0; l < 16; l++) {
        if (l >= n) {
            up[l] = lo[l] = -INFINITY;
            continue;
        }
        /* explicit fmaf: the scan and head_bounds_q8 round alike whatever GCC contracts */
        const float b = fmaf(1e-6f, fabsf(a16[l]), 1.1f * fmaf(ex, wl1[v0 + l], s[v0 + l] * xl1));
        up[l] = a16[l] + b;
        lo[l] = a16[l] - b;
    }
}

static inline void envelope16(const env_t *e, int64_t m, const float *a16, int64_t v0,
                              const float *s, const float *wl1, float ex, float xl1) {
    if (v0 >= e->V) return;
    float up[16], lo[16];
    bounds16(a16, v0, s, wl1, ex, xl1, e->V, up, lo);
    float mx = -INFINITY, lmx = -INFINITY, sum = 0.0f;
    for (int l = 0; l < 16; l++) {
        mx = up[l] > mx ? up[l] : mx;
        lmx = lo[l] > lmx ? lo[l] : lmx;
    }
    const float it = e->inv_t[m];
#ifdef __AVX512F__
    const __m512 u = _mm512_loadu_ps(up);
    const __mmask16 valid = _mm512_cmp_ps_mask(u, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    const __m512 w = exp16(_mm512_mul_ps(_mm512_sub_ps(u, _mm512_set1_ps(mx)), _mm512_set1_ps(it)));
    sum = _mm512_mask_reduce_add_ps(valid, w);
#else
    for (int l = 0; l < 16; l++)
        if (up[l] > -INFINITY) sum += exp_approx((up[l] - mx) * it);
#endif
    const int64_t at = m * e->G + v0 / 16;
    e->gmax[at] = mx;
    e->gsum[at] = sum;
    e->glow[at] = lmx;
    if (e->ub) {
        const int n = e->V - v0 >= 16 ? 16 : (int)(e->V - v0);
        for (int l = 0; l < n; l++) {
            e->ub[m * e->V + v0 + l] = up[l];
            e->lb[m * e->V + v0 + l] = lo[l];
        }
    }
}

#endif
