/* The LoRA terms of one projection for every adapter of a step, reading each adapter's weights
 * where they lie (Punica's SGMV, S-LoRA), see lora_sgmv.py.
 *
 * x     [T, K] bf16, row i at x + i * xs          K even
 * y     [T, N] bf16, row i at y + i * ys          updated: y[i] = bf16(y[i] + (x[i] A_g) B_g)
 * rows  [P] int64, off [G + 1] int64              group g's rows: rows[off[g] .. off[g+1])
 * a[g]  [K/2, Rp, 2] bf16 or NULL                 A_g [K, R_g] packed: Rp = R_g rounded up to
 *                                                 16, a pair of inputs by 16 ranks (one
 *                                                 VDPBF16PS operand), zero past R_g
 * b[g]  bf16                                      B_g [R_g, N] (already scaled by alpha / r)
 *                                                 by blocks of 64 outputs: block j holds its
 *                                                 rows lo_j..hi_j, 64 values each (zeros past
 *                                                 N), at b[g] + span[g][j].offset
 * span[g] [ceil(N/64), 3] int64                   lo_j, hi_j, offset: the ranks whose B rows
 *                                                 are not all zero in block j (a merged
 *                                                 projection's B is block-diagonal: q's ranks
 *                                                 reach q's outputs only); lo = hi: none
 * rank  [G]                                       R_g; a group with a[g] NULL adds nothing
 *
 * Two passes. First every adapter row's t = x A_g in fp32 (exact bf16 products, fp32 sums),
 * then y += t B_g in blocks of 64 output channels, t kept in fp32 and B widened exactly, one
 * rounding to bf16 at the end (torch's path rounds t, the term and the sum: three). A group's
 * weights are read once a step whatever its rows, each block's in one contiguous run, where the
 * gather it replaces copied them
 * once per row. N a multiple of 16.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
int lora_sgmv_supported(void) { return 1; }

static int64_t group_of(const int64_t *off, int64_t G, int64_t p) {
    int64_t lo = 0, hi = G; /* off[lo] <= p < off[hi] */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (off[mid] <= p) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* t[0..Rp) = x_row A (fp32), 4 vectors (64 ranks) at a time. */
static void shrink_row(const uint16_t *xr, int64_t K, const uint16_t *a, int64_t Rp, float *t) {
    for (int64_t r0 = 0; r0 < Rp; r0 += 64) {
        const int nv = (int)((Rp - r0 < 64 ? Rp - r0 : 64) / 16);
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int64_t k2 = 0; k2 < K / 2; k2++) {
            int32_t pair;
            memcpy(&pair, xr + 2 * k2, 4);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            const uint16_t *line = a + (k2 * Rp + r0) * 2;
            for (int v = 0; v < nv; v++)
                acc[v] = _mm512_dpbf16_ps(acc[v], xb, (__m512bh)_mm512_loadu_si512(line + 32 * v));
        }
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(t + r0 + 16 * v, acc[v]);
    }
}

/* Rows p0..p0+MB of a group, channels n0..n0+16*NV: y += t B (bb: B's rows lo..hi there, at a
 * stride of 64). */
#define DEFINE_EXPAND(NAME, MB, NV)                                                            \
    static void NAME(const float *t, int64_t Rp, const uint16_t *bb, int64_t lo, int64_t hi,  \
                     int64_t n0, const int64_t *rows, uint16_t *y, int64_t ys) {               \
        __m512 acc[MB][NV];                                                                    \
        for (int m = 0; m < MB; m++)                                                           \
            for (int v = 0; v < NV; v++) acc[m][v] = _mm512_setzero_ps();                      \
        for (int64_t r = lo; r < hi; r++) {                                                    \
            __m512 bv[NV];                                                                     \
            for (int v = 0; v < NV; v++) bv[v] = bf16_load16(bb + (r - lo) * 64 + 16 * v);     \
            for (int m = 0; m < MB; m++) {                                                     \
                const __m512 tb = _mm512_set1_ps(t[m * Rp + r]);                               \
                for (int v = 0; v < NV; v++) acc[m][v] = _mm512_fmadd_ps(tb, bv[v], acc[m][v]); \
            }                                                                                  \
        }                                                                                      \
        for (int m = 0; m < MB; m++) {                                                         \
            uint16_t *yr = y + rows[m] * ys + n0;                                              \
            for (int v = 0; v < NV; v++)                                                       \
                store16(yr + 16 * v, _mm512_add_ps(acc[m][v], bf16_load16(yr + 16 * v)), NULL); \
        }                                                                                      \
    }
DEFINE_EXPAND(expand_m4, 4, 4)
DEFINE_EXPAND(expand_m1, 1, 4)
DEFINE_EXPAND(expand_m1_v1, 1, 1)

/* One group's rows at channels n0..n0+width (64, or a narrower last block). */
static void expand_block(const float *t, int64_t Rp, const uint16_t *bb, const int64_t *sp,
                         int64_t n0, int64_t width, const int64_t *rows, int64_t n, uint16_t *y,
                         int64_t ys) {
    const int64_t lo = sp[0], hi = sp[1];
    int64_t m = 0;
    if (lo >= hi) return; /* every B row is zero here: the term adds nothing */
    if (width == 64) {
        for (; m + 4 <= n; m += 4) expand_m4(t + m * Rp, Rp, bb, lo, hi, n0, rows + m, y, ys);
        for (; m < n; m++) expand_m1(t + m * Rp, Rp, bb, lo, hi, n0, rows + m, y, ys);
        return;
    }
    for (; m < n; m++)
        for (int64_t c = 0; c < width; c += 16)
            expand_m1_v1(t + m * Rp, Rp, bb + c, lo, hi, n0 + c, rows + m, y, ys);
}

int lora_sgmv_bf16(const uint16_t *x, int64_t xs, int64_t K, uint16_t *y, int64_t ys, int64_t N,
                   int64_t G, const int64_t *rows, const int64_t *off, const uint16_t *const *a,
                   const uint16_t *const *b, const int64_t *rank, const int64_t *const *span) {
    int64_t Rp = 16; /* t's row stride: the largest padded rank of the step */
    for (int64_t g = 0; g < G; g++)
        if (a[g] && (rank[g] + 15) / 16 * 16 > Rp) Rp = (rank[g] + 15) / 16 * 16;
    const int64_t P = off[G], blocks = (N + 63) / 64;
    float *t = malloc(sizeof(float) * (size_t)(P > 0 ? P : 1) * (size_t)Rp);
    if (!t) return -1; /* lora_sgmv.py raises MemoryError */
    _Pragma("omp parallel") {
        _Pragma("omp for schedule(static)") for (int64_t p = 0; p < P; p++) {
            const int64_t g = group_of(off, G, p);
            if (a[g]) shrink_row(x + rows[p] * xs, K, a[g], (rank[g] + 15) / 16 * 16, t + p * Rp);
        }
        /* group-major: a thread takes whole runs of one adapter's B */
        _Pragma("omp for schedule(static)") for (int64_t task = 0; task < G * blocks; task++) {
            const int64_t g = task / blocks, n0 = task % blocks * 64;
            if (!a[g] || off[g + 1] == off[g]) continue;
            const int64_t width = N - n0 < 64 ? N - n0 : 64;
            const int64_t *sp = span[g] + 3 * (n0 / 64);
            expand_block(t + off[g] * Rp, Rp, b[g] + sp[2], sp, n0, width, rows + off[g],
                         off[g + 1] - off[g], y, ys);
        }
    }
    free(t);
    return 0;
}
#else
int lora_sgmv_supported(void) { return 0; }
int lora_sgmv_bf16(const uint16_t *x, int64_t xs, int64_t K, uint16_t *y, int64_t ys, int64_t N,
                   int64_t G, const int64_t *rows, const int64_t *off, const uint16_t *const *a,
                   const uint16_t *const *b, const int64_t *rank, const int64_t *const *span) {
    (void)x, (void)xs, (void)K, (void)y, (void)ys, (void)N, (void)G, (void)rows, (void)off;
    (void)a, (void)b, (void)rank, (void)span;
    return -2;
}
#endif
