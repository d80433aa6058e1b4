/* CPU kernels of the decode step, loaded through ctypes (see build.py).
 *
 * Built at first use with the machine's own compiler (-O3 -march=native -fopenmp). Threads come
 * from the OpenMP runtime torch has already loaded, so they are torch's own pool: no second
 * pool competes for the cores. Every kernel has a bf16 and an fp32 variant, sharing one body.
 *
 * bf16 is stored as its top 16 bits of an IEEE float; loads widen exactly, stores round to
 * nearest even (as torch does).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "fast_exp.h"

/* Elements below which the elementwise kernels stay on the calling thread (a decode step of up
 * to about a dozen rows): a decode row of 640-2,048 values takes 1-2 us, a fork-join of the
 * thread pool 2-20 us more, and 20-75 us where another process holds the other core (an
 * RMSNorm of one row measured 2.2 us alone against 20-77 us through the pool, with a test run
 * beside it); a server's front end shares the engine's cores. */
#define PARALLEL_MIN 8192

/* Greedy pick: x [R, V] -> idx [R], the first index of each row's maximum, as torch.argmax
 * (a NaN counts as the maximum, as in torch). Blocks of 1024: a vectorised max per block, and
 * a scan for its index only where a block beats the best so far. */
#define ARGMAX_BLOCK 1024
#define DEFINE_ARGMAX(NAME, T, LOAD)                                                          \
    void NAME(const T *x, int64_t R, int64_t V, int64_t *idx) {                              \
        _Pragma("omp parallel for schedule(static) if (R > 1)")                              \
        for (int64_t r = 0; r < R; r++) {                                                    \
            const T *row = x + r * V;                                                        \
            float best = -INFINITY;                                                          \
            int64_t at = 0;                                                                  \
            for (int64_t j0 = 0; j0 < V; j0 += ARGMAX_BLOCK) {                               \
                const int64_t j1 = j0 + ARGMAX_BLOCK < V ? j0 + ARGMAX_BLOCK : V;            \
                float m = -INFINITY;                                                         \
                int nans = 0;                                                                \
                _Pragma("omp simd reduction(max : m) reduction(+ : nans)")                   \
                for (int64_t j = j0; j < j1; j++) {                                          \
                    const float f = LOAD(row, j);                                            \
                    m = f > m ? f : m;                                                       \
                    nans += f != f;                                                          \
                }                                                                            \
                if (nans) {                                                                  \
                    for (int64_t j = j0; j < j1; j++)                                        \
                        if (LOAD(row, j) != LOAD(row, j)) {                                  \
                            at = j;                                                          \
                            break;                                                           \
                        }                                                                    \
                    break;                                                                   \
                }                                                                            \
                if (m > best || j0 == 0) {                                                   \
                    for (int64_t j = j0; j < j1; j++)                                        \
                        if (LOAD(row, j) == m) {                                             \
                            at = j;                                                          \
                            break;                                                           \
                        }                                                                    \
                    best = m;                                                                \
                }                                                                            \
            }                                                                                \
            idx[r] = at;                                                                     \
        }                                                                                    \
    }

DEFINE_ARGMAX(argmax_bf16, uint16_t, bf16_load)
DEFINE_ARGMAX(argmax_f32, float, f32_load)

/* ---- Fused elementwise ops of a bf16 layer: each reads its input once and writes once, with
 * the same roundings to bf16 as the torch ops it replaces (fp32 inside, bf16 at each step torch
 * stores a bf16 tensor). */

/* 0.5 x (1 + tanh u) written as x / (1 + e^(-2u)): the same function without the
 * cancellation of 1 + tanh u near -1 (torch's form loses most digits for x < -3). */
static inline float gelu_tanh(float x) {
    const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
    return x / (1.0f + exp_approx(-2.0f * u));
}

static inline float silu(float x) { return x / (1.0f + exp_approx(-x)); }

static inline float bf16_round(float f) {
    uint16_t h;
    bf16_store(&h, 0, f);
    return bf16_load(&h, 0);
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
static inline __m512 bf16_round16(__m512 f) { /* round to bf16 and widen back */
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(f);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline __m512 act16(__m512 x, int act) {
    const __m512 one = _mm512_set1_ps(1.0f);
    if (act == 1) return _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608f),
                                   _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
    const __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
    return _mm512_div_ps(x, _mm512_add_ps(one, e)); /* as gelu_tanh() below */
}
#endif

/* out [T, I] = bf16(act(gate)) * up, rounded, from gate_up [T, 2I] (row stride `stride`):
 * the merged [gate | up] projection. act: 0 = gelu (tanh approximation), 1 = silu. */
void act_mul_bf16(const uint16_t *gate_up, int64_t T, int64_t I, int64_t stride, int act,
                  uint16_t *out) {
    _Pragma("omp parallel for schedule(static) if (T * I >= PARALLEL_MIN)")
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *g = gate_up + t * stride, *u = g + I;
        uint16_t *o = out + t * I;
        int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
        for (; i + 16 <= I; i += 16) {
            const __m512 a = bf16_round16(act16(bf16_load16(g + i), act));
            const __m512 y = _mm512_mul_ps(a, bf16_load16(u + i));
            _mm256_storeu_si256((__m256i *)(o + i), (__m256i)_mm512_cvtneps_pbh(y));
        }
#endif
        for (; i < I; i++) {
            const float x = bf16_load(g, i);
            const float a = bf16_round(act == 0 ? gelu_tanh(x) : silu(x));
            bf16_store(o, i, a * bf16_load(u, i));
        }
    }
}

/* Rotary embedding of bf16 heads in the rotate-half layout (transformers'), with the sign of
 * rotate-half folded into sin ([-sin, sin]): for d < R/2, with h = R/2,
 *   y[d] = x[d] c[d] + x[d + h] s[d],   y[d + h] = x[d + h] c[d + h] + x[d] s[d + h],
 * each product and the sum rounded to bf16, as torch's `x * cos + roll(x) * sin` rounds.
 * x: head j of row t at x + t * stride + j * D (a [T, H, D] view with contiguous heads);
 * cos, sin: [T, R] bf16; out: [T, H, D] contiguous; dims R..D-1 are copied unrotated. */
void rope_bf16(const uint16_t *x, int64_t T, int64_t H, int64_t D, int64_t stride,
               const uint16_t *cos, const uint16_t *sin, int64_t R, uint16_t *out) {
    const int64_t half = R / 2;
    _Pragma("omp parallel for schedule(static) if (T * H * D >= PARALLEL_MIN)")
    for (int64_t r = 0; r < T * H; r++) {
        const int64_t t = r / H;
        const uint16_t *xr = x + t * stride + (r % H) * D, *c = cos + t * R, *s = sin + t * R;
        uint16_t *o = out + r * D;
        int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
        for (; i + 16 <= half; i += 16) {
            const __m512 x1 = bf16_load16(xr + i), x2 = bf16_load16(xr + half + i);
            const __m512 y1 = _mm512_add_ps(bf16_round16(_mm512_mul_ps(x1, bf16_load16(c + i))),
                                            bf16_round16(_mm512_mul_ps(x2, bf16_load16(s + i))));
            const __m512 y2 =
                _mm512_add_ps(bf16_round16(_mm512_mul_ps(x2, bf16_load16(c + half + i))),
                              bf16_round16(_mm512_mul_ps(x1, bf16_load16(s + half + i))));
            _mm256_storeu_si256((__m256i *)(o + i), (__m256i)_mm512_cvtneps_pbh(y1));
            _mm256_storeu_si256((__m256i *)(o + half + i), (__m256i)_mm512_cvtneps_pbh(y2));
        }
#endif
        for (; i < half; i++) {
            const float x1 = bf16_load(xr, i), x2 = bf16_load(xr, half + i);
            bf16_store(o, i, bf16_round(x1 * bf16_load(c, i)) + bf16_round(x2 * bf16_load(s, i)));
            bf16_store(o, half + i, bf16_round(x2 * bf16_load(c, half + i)) +
                                        bf16_round(x1 * bf16_load(s, half + i)));
        }
        if (R < D) memcpy(o + R, xr + R, (size_t)(D - R) * sizeof(uint16_t));
    }
}

/* RMSNorm of bf16 rows in fp32. Row r of x starts at x + (r / inner) * outer + (r % inner) * D
 * (a [T, inner, D] view with contiguous heads, or plain [T, D] with inner = 1). scale: fp32
 * [scale_rows, D], row r uses row r % scale_rows. cast_first = 0 (Gemma): bf16(n * scale);
 * cast_first = 1 (Llama): bf16(bf16(n) * scale). With a residual [rows, D]:
 * out = bf16(residual + normed), the post-norm residual add of Gemma 3. out: [rows, D]. */
void rms_norm_bf16(const uint16_t *x, int64_t rows, int64_t D, int64_t inner, int64_t outer,
                   const float *scale, int64_t scale_rows, int cast_first, float eps,
                   const uint16_t *residual, uint16_t *out) {
    _Pragma("omp parallel for schedule(static) if (rows * D >= PARALLEL_MIN)")
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + (r / inner) * outer + (r % inner) * D;
        const float *sr = scale + (r % scale_rows) * D;
        uint16_t *o = out + r * D;
        float ss = 0.0f;
        int64_t d0 = 0;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
        __m512 acc = _mm512_setzero_ps();
        for (; d0 + 16 <= D; d0 += 16) {
            const __m512 v = bf16_load16(xr + d0);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        ss = _mm512_reduce_add_ps(acc);
#endif
        for (int64_t d = d0; d < D; d++) ss += bf16_load(xr, d) * bf16_load(xr, d);
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        int64_t d = 0;
#if defined(__AVX512F__) && defined(__AVX512BF16__)
        const __m512 vinv = _mm512_set1_ps(inv);
        for (; d + 16 <= D; d += 16) {
            const __m512 n = _mm512_mul_ps(bf16_load16(xr + d), vinv);
            const __m512 sc = _mm512_loadu_ps(sr + d);
            __m512 y = _mm512_mul_ps(cast_first ? bf16_round16(n) : n, sc);
            if (residual) y = _mm512_add_ps(bf16_load16(residual + r * D + d), bf16_round16(y));
            _mm256_storeu_si256((__m256i *)(o + d), (__m256i)_mm512_cvtneps_pbh(y));
        }
#endif
        for (; d < D; d++) {
            const float n = bf16_load(xr, d) * inv;
            float y = cast_first ? bf16_round(n) * sr[d] : n * sr[d];
            if (residual) y = bf16_load(residual, r * D + d) + bf16_round(y);
            bf16_store(o, d, y);
        }
    }
}

/* Grammar masks: x [N, V] logits; rows [R] the rows to mask; mask [R, W] int32 words, bit j % 32
 * of word j / 32 set when token j is allowed (llguidance's and xgrammar's layout). Disallowed
 * tokens become -inf in place. Whole words are the common case (all allowed inside a JSON
 * string, none allowed between its tokens), so they are tested first. */
#define DEFINE_TOKEN_MASK(NAME, T, NEG_INF)                                                    \
    void NAME(T *x, int64_t V, const int64_t *rows, int64_t R, const int32_t *mask,            \
              int64_t W) {                                                                     \
        _Pragma("omp parallel for schedule(static) if (R > 1)")                               \
        for (int64_t k = 0; k < R; k++) {                                                     \
            T *row = x + rows[k] * V;                                                         \
            const int32_t *m = mask + k * W;                                                  \
            for (int64_t w = 0; w < W; w++) {                                                 \
                const uint32_t bits = (uint32_t)m[w];                                         \
                if (bits == 0xFFFFFFFFu) continue;                                            \
                const int64_t j0 = w * 32, j1 = j0 + 32 < V ? j0 + 32 : V;                    \
                for (int64_t j = j0; j < j1; j++)                                             \
                    if (!((bits >> (j - j0)) & 1u)) row[j] = NEG_INF;                         \
            }                                                                                 \
        }                                                                                     \
    }

DEFINE_TOKEN_MASK(token_mask_bf16, uint16_t, (uint16_t)0xFF80)
DEFINE_TOKEN_MASK(token_mask_f32, float, -INFINITY)
