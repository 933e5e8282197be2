/* The prefill product of block-quantised weights (Q8_0, Q4_0) with AVX512-BF16 dot products
 * (vdpbf16ps), for CPUs that have them without AMX (AMD Zen 4 and later, Intel Cooper Lake).
 * Without it those CPUs widen the weights to f32 for sgemm, at half the rate a bf16 dot gives.
 *
 * Roles: the 16 lanes of a vector are 16 weight rows. Each thread repacks a panel of 32 weight
 * rows so that, per block of 32 columns and per pair of columns, the 16 rows' two values lie in
 * one 64-byte line; the values are the blocks' integers q (Q8_0: -127..127; Q4_0: -8..7), which
 * bf16 holds exactly. x is rounded once to bf16 (nearest even) and a pair of its values is
 * broadcast. Per block, 16 dot products sum the block in f32; then one FMA adds that sum times
 * the weight row's block scale d to the output, in block order.
 *
 * Every output is that one chain whatever n, its row's place and the thread count, so a row's
 * bits do not depend on the batch. Against the f32 prefill, only x's rounding to bf16 (relative
 * 2^-9 per value) is new; the weights are exact. */
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "worker/model/matmul_impl.h"

#define T_BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

#define QK 32    /* columns per block */
#define PAIRS 16 /* column pairs per block */
#define XTILE 4  /* rows of x per kernel call */
#define PANEL 32 /* weight rows per panel: two 16-lane groups */
#define LINE 64  /* bytes of one pair for 16 rows */

static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_ok;

static void bf16_init(void)
{
    unsigned a, b, c, d;
    /* leaf 7.1 EAX bit 5: AVX512-BF16 (the AVX-512 state itself is checked with the ISA) */
    bf16_ok = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

int cg_bf16_supported(void)
{
    pthread_once(&bf16_once, bf16_init);
    return bf16_ok;
}

/* Rows [t0, t1) of x (cols floats each) rounded to bf16 into xb. */
T_BF16 void cg_bf16_pack_x(const float *x, int cols, uint16_t *xb, size_t t0, size_t t1)
{
    for (size_t t = t0; t < t1; t++) {
        const float *p = x + t * (size_t)cols;
        uint16_t *o = xb + t * (size_t)cols;
        for (size_t c = 0; c < (size_t)cols; c += 32)
            _mm512_storeu_si512(o + c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + c + 16),
                                                                    _mm512_loadu_ps(p + c)));
    }
}

/* The bytes of a panel's bf16 values for nblk blocks; its scales follow them. */
static size_t panel_bytes(size_t nblk)
{
    return nblk * PAIRS * LINE * (PANEL / 16);
}

size_t cg_bf16_scratch_bytes(int cols)
{
    const size_t nblk = (size_t)cols / QK;
    return panel_bytes(nblk) + nblk * PANEL * sizeof(float);
}

/* The 32 values of row `row`'s block k as bf16, in column order (32-bit unit p: columns 2p and
 * 2p + 1): small integers, so the conversion through f32 is exact. */
T_BF16 static inline __m512i block_bf16(const cg_weight *w, size_t row, size_t k)
{
    const size_t cols = (size_t)w->cols;
    __m512i lo, hi;
    if (w->dtype == CG_DTYPE_Q8_0) {
        const int8_t *s = (const int8_t *)w->data + row * cols + k * QK;
        lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)s));
        hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(s + 16)));
    } else {
        /* per 64 columns, 32 bytes: low nibbles the even block, high nibbles the odd one */
        const uint8_t *s = (const uint8_t *)w->data + row * (cols / 2) + k / 2 * QK;
        const __m512i eight = _mm512_set1_epi32(8), mask = _mm512_set1_epi32(15);
        const int odd = (int)(k & 1);
        lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)s));
        hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(s + 16)));
        if (odd) {
            lo = _mm512_srli_epi32(lo, 4);
            hi = _mm512_srli_epi32(hi, 4);
        }
        lo = _mm512_sub_epi32(_mm512_and_si512(lo, mask), eight);
        hi = _mm512_sub_epi32(_mm512_and_si512(hi, mask), eight);
    }
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(hi), _mm512_cvtepi32_ps(lo));
}

/* Weight rows [r, r + 16 * groups) into the panel: pw[((k * PAIRS + p) * groups + g) * 32 +
 * 2 * lane + e] holds column 2p + e of block k of row r + 16 g + lane, as bf16 (exact); ds[(k *
 * groups + g) * 16 + lane] that block's scale. A block's 16 column pairs are scattered to their
 * lines as 32-bit units. */
T_BF16 static void load_panel(const cg_weight *w, size_t r, int groups, uint16_t *pw, float *ds)
{
    const size_t nblk = (size_t)w->cols / QK;
    const __m512i line =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(16 * groups));
    uint32_t *pu = (uint32_t *)(void *)pw;
    for (int g = 0; g < groups; g++)
        for (int lane = 0; lane < 16; lane++) {
            const size_t row = r + (size_t)g * 16 + (size_t)lane;
            for (size_t k = 0; k < nblk; k++) {
                _mm512_i32scatter_epi32(pu + (k * PAIRS * (size_t)groups + (size_t)g) * 16 +
                                            (size_t)lane,
                                        line, block_bf16(w, row, k), 4);
                ds[(k * (size_t)groups + (size_t)g) * 16 + (size_t)lane] =
                    _cvtsh_ss(w->bscale[row * nblk + k]);
            }
        }
}

T_BF16 static inline __attribute__((always_inline)) void zero(__m512 v[XTILE][2])
{
#pragma GCC unroll 4
    for (int b = 0; b < XTILE; b++)
#pragma GCC unroll 2
        for (int g = 0; g < 2; g++)
            v[b][g] = _mm512_setzero_ps();
}

/* The panel's 16 * G weight rows against the nb rows xr of x (bf16), into yo[b][0 .. 16 * G). */
T_BF16 static inline __attribute__((always_inline)) void tile(const uint16_t *pw, const float *ds,
                                                              int G, const uint16_t *const *xr,
                                                              int nb, size_t nblk, float *const *yo)
{
    __m512 acc[XTILE][2];
    zero(acc);
    for (size_t k = 0; k < nblk; k++) {
        __m512 s[XTILE][2];
        zero(s);
        const uint16_t *pk = pw + k * PAIRS * (size_t)G * 32;
#pragma GCC unroll 16
        for (int p = 0; p < PAIRS; p++) {
            __m512bh wv[2];
#pragma GCC unroll 2
            for (int g = 0; g < G; g++)
                wv[g] = (__m512bh)_mm512_loadu_si512(pk + ((size_t)p * (size_t)G + (size_t)g) * 32);
#pragma GCC unroll 4
            for (int b = 0; b < nb; b++) {
                uint32_t two;
                memcpy(&two, xr[b] + k * QK + 2 * (size_t)p, 4);
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)two);
#pragma GCC unroll 2
                for (int g = 0; g < G; g++)
                    s[b][g] = _mm512_dpbf16_ps(s[b][g], wv[g], xv);
            }
        }
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            const __m512 d = _mm512_loadu_ps(ds + (k * (size_t)G + (size_t)g) * 16);
#pragma GCC unroll 4
            for (int b = 0; b < nb; b++)
                acc[b][g] = _mm512_fmadd_ps(s[b][g], d, acc[b][g]);
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < nb; b++)
#pragma GCC unroll 2
        for (int g = 0; g < G; g++)
            _mm512_storeu_ps(yo[b] + g * 16, acc[b][g]);
}

#define TILE_FN(G, NB)                                                                             \
    T_BF16 static void tile_##G##_##NB(const uint16_t *pw, const float *ds,                        \
                                       const uint16_t *const *xr, size_t nblk, float *const *yo)   \
    {                                                                                              \
        tile(pw, ds, G, xr, NB, nblk, yo);                                                         \
    }
TILE_FN(1, 1)
TILE_FN(1, 2)
TILE_FN(1, 3)
TILE_FN(1, 4)
TILE_FN(2, 1)
TILE_FN(2, 2)
TILE_FN(2, 3)
TILE_FN(2, 4)
#undef TILE_FN

typedef void (*tile_fn)(const uint16_t *, const float *, const uint16_t *const *, size_t,
                        float *const *);
static const tile_fn tiles[2][XTILE] = {{tile_1_1, tile_1_2, tile_1_3, tile_1_4},
                                        {tile_2_1, tile_2_2, tile_2_3, tile_2_4}};

T_BF16 void cg_bf16_rows(const cg_weight *w, const uint16_t *xb, int n, float *y, size_t r0,
                         size_t r1, void *scratch)
{
    const size_t cols = (size_t)w->cols, rows = (size_t)w->rows, nblk = cols / QK;
    uint16_t *pw = scratch;
    float *ds = (float *)(void *)((char *)scratch + panel_bytes(nblk));
    for (size_t r = r0; r < r1; r += PANEL) {
        const int G = r + PANEL <= r1 ? 2 : 1; /* a last single group of 16 rows */
        load_panel(w, r, G, pw, ds);
        for (int b0 = 0; b0 < n; b0 += XTILE) {
            const int nb = CG_MIN(XTILE, n - b0);
            const uint16_t *xr[XTILE];
            float *yo[XTILE];
            for (int b = 0; b < nb; b++) {
                xr[b] = xb + (size_t)(b0 + b) * cols;
                yo[b] = y + (size_t)(b0 + b) * rows + r;
            }
            tiles[G - 1][nb - 1](pw, ds, xr, nblk, yo);
        }
    }
}
