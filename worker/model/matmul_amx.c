/* The prefill product of block-quantised weights (Q8_0, Q4_0) on AMX tiles, bf16 in, f32 out.
 *
 * Roles: W is the tiles' A operand, 16 weight rows by 32 columns a tile, in its own row-major
 * order once dequantised and rounded to bf16, so it needs no transpose. x is the B operand:
 * packed once per product into AMX's pair-interleaved layout, one 1 KiB tile per 16 rows of x
 * and 32 columns (tile row k / 2 holds, for each of the 16 rows, elements k and k + 1). A
 * C tile then holds 16 weight rows by 16 rows of x, summed over the whole of cols, and is
 * written to y transposed.
 *
 * Work: each thread dequantises a panel of weight rows into bf16 (it stays in L2) and sweeps
 * all of x with it, four C tiles at a time (32 weight rows by 32 rows of x). Every output is
 * the same chain of tile products in column order whatever n, its row's place and the thread
 * count, so, unlike sgemm, a row's bits do not depend on the batch.
 *
 * Precision: bf16 keeps 8 significant bits. The dequantised weights (d * q) and the
 * activations are each rounded once to nearest even; products and sums are f32. */
#include <cpuid.h>
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "worker/model/matmul_impl.h"

#define T_AMX                                                                                      \
    __attribute__((target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma,"       \
                          "f16c")))

/* Linux: a process asks once for the right to use the tile data state. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define TILE_ELEMS 512 /* bf16 values in one 16 x 32 tile */

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_init(void)
{
    __builtin_cpu_init();
    unsigned a, b, c, d;
    /* leaf 7.0 EDX: AMX-BF16 (22), AMX-TILE (24); leaf 7.1 EAX: AVX512-BF16 (5) */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        cg_log(CG_LOG_INFO, "AMX: the kernel refused the tile state (%s); not used",
               strerror(errno));
        return;
    }
    amx_ok = 1;
}

int cg_amx_supported(void)
{
    pthread_once(&amx_once, amx_init);
    return amx_ok;
}

size_t cg_amx_x_elems(int n, int cols)
{
    return (size_t)((n + 31) / 32 * 32) * (size_t)cols;
}

/* 32-bit lane i: the offset of row i of a 16 x 16 tile of 32-bit elements, in elements (16 i),
 * for the scatter that transposes x into tiles and the gather that transposes C out of them. */
T_AMX static inline __m512i tile_rows(void)
{
    return _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(16));
}

/* Packs rows [g0 * 16, g1 * 16) of x (n rows of cols floats; rows past n are zeros) into xp:
 * the tile of row group g and column block k at xp + (g * (cols / 32) + k) * TILE_ELEMS. */
T_AMX void cg_amx_pack_x(const float *x, int n, int cols, uint16_t *xp, size_t g0, size_t g1)
{
    const size_t kb = (size_t)cols / 32;
    /* element i of a row's 32-column block (as pairs: 32-bit lane i) goes to tile row i */
    const __m512i rows = tile_rows();
    for (size_t g = g0; g < g1; g++)
        for (size_t k = 0; k < kb; k++) {
            uint32_t *t = (uint32_t *)(xp + (g * kb + k) * TILE_ELEMS);
            for (int r = 0; r < 16; r++) {
                const size_t row = g * 16 + (size_t)r;
                __m512i v = _mm512_setzero_si512();
                if (row < (size_t)n) {
                    const float *p = x + row * (size_t)cols + k * 32;
                    v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
                }
                _mm512_i32scatter_epi32(t + r, rows, v, 4);
            }
        }
}

/* Weight rows [r, r + m) dequantised and rounded to bf16, row-major, into panel: d * q is exact
 * in f32 (as cg_qmm_widen gives it), then rounded once. The Q4_0 layout: per 64 columns, 32
 * bytes whose low nibbles are columns 0-31 and high nibbles columns 32-63, each q + 8. */
T_AMX static void load_panel(const cg_weight *w, size_t r, size_t m, uint16_t *panel)
{
    const size_t cols = (size_t)w->cols, nblk = cols / 32;
    for (size_t i = 0; i < m; i++) {
        const uint16_t *sc = w->bscale + (r + i) * nblk;
        __m512i *o = (__m512i *)(void *)(panel + i * cols);
        if (w->dtype == CG_DTYPE_Q8_0) {
            const int8_t *q = (const int8_t *)w->data + (r + i) * cols;
            for (size_t k = 0; k < nblk; k++) {
                const __m512 d = _mm512_set1_ps(_cvtsh_ss(sc[k]));
                const __m512 lo = _mm512_cvtepi32_ps(
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(q + k * 32))));
                const __m512 hi = _mm512_cvtepi32_ps(
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(q + k * 32 + 16))));
                _mm512_storeu_si512(o + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(d, hi),
                                                                        _mm512_mul_ps(d, lo)));
            }
        } else {
            const uint8_t *q = (const uint8_t *)w->data + (r + i) * (cols / 2);
            const __m512i eight = _mm512_set1_epi32(8), mask = _mm512_set1_epi32(15);
            for (size_t k = 0; k < nblk; k += 2) {
                const __m512 d0 = _mm512_set1_ps(_cvtsh_ss(sc[k]));
                const __m512 d1 = _mm512_set1_ps(_cvtsh_ss(sc[k + 1]));
                const __m512i b0 =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(q + k * 16)));
                const __m512i b1 =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(q + k * 16 + 16)));
                const __m512 l0 =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b0, mask), eight));
                const __m512 l1 =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b1, mask), eight));
                const __m512 h0 =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b0, 4), eight));
                const __m512 h1 =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b1, 4), eight));
                _mm512_storeu_si512(o + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(d0, l1),
                                                                        _mm512_mul_ps(d0, l0)));
                _mm512_storeu_si512(o + k + 1, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(d1, h1),
                                                                            _mm512_mul_ps(d1, h0)));
            }
        }
    }
}

/* A C tile (16 weight rows from r0 by 16 rows of x from m0) into y, transposed: column j of the
 * tile is row m0 + j of y. Rows of x at or past n are padding and not written. */
T_AMX static void store_c(const float *c, float *y, size_t rows, size_t r0, size_t m0, size_t n)
{
    const __m512i col = tile_rows();
    for (size_t j = 0; j < 16 && m0 + j < n; j++)
        _mm512_storeu_ps(y + (m0 + j) * rows + r0, _mm512_i32gather_ps(col, c + j, 4));
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tmm0-3: C tiles (16 x 16 f32); tmm4, tmm5: two 16-row tiles of W; tmm6, tmm7: two of x
 * (macros, not an enum: the tile intrinsics paste their register number into assembly) */
#define C00 0
#define C01 1
#define C10 2
#define C11 3
#define W0 4
#define W1 5
#define X0 6
#define X1 7

/* Weight rows [r0, r1) of y (r1 - r0 a multiple of 16); xp as cg_amx_pack_x left it for all n
 * rows. scratch holds panel_rows * cols bf16 + 1024 floats. */
T_AMX void cg_amx_rows(const cg_weight *w, const uint16_t *xp, int n, float *y, size_t r0,
                       size_t r1, size_t panel_rows, void *scratch)
{
    const size_t cols = (size_t)w->cols, rows = (size_t)w->rows, kb = cols / 32;
    const size_t groups = ((size_t)n + 31) / 32 * 2; /* 16-row groups of packed x */
    uint16_t *panel = scratch;
    float *c = (float *)(void *)(panel + panel_rows * cols);
    tile_config cfg = {.palette = 1};
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
    const size_t stride = cols * sizeof(uint16_t);
    for (size_t p = r0; p < r1; p += panel_rows) {
        const size_t pm = CG_MIN(panel_rows, r1 - p);
        load_panel(w, p, pm, panel);
        for (size_t g = 0; g < groups; g += 2) {
            const uint16_t *x0 = xp + g * kb * TILE_ELEMS, *x1 = x0 + kb * TILE_ELEMS;
            for (size_t i = 0; i < pm; i += 32) {
                const int two = i + 32 <= pm; /* a last single 16-row tile of W */
                const uint16_t *w0 = panel + i * cols, *w1 = w0 + 16 * cols;
                _tile_zero(C00);
                _tile_zero(C01);
                _tile_zero(C10);
                _tile_zero(C11);
                for (size_t k = 0; k < kb; k++) {
                    _tile_loadd(X0, x0 + k * TILE_ELEMS, 64);
                    _tile_loadd(X1, x1 + k * TILE_ELEMS, 64);
                    _tile_loadd(W0, w0 + k * 32, stride);
                    _tile_dpbf16ps(C00, W0, X0);
                    _tile_dpbf16ps(C01, W0, X1);
                    if (two) {
                        _tile_loadd(W1, w1 + k * 32, stride);
                        _tile_dpbf16ps(C10, W1, X0);
                        _tile_dpbf16ps(C11, W1, X1);
                    }
                }
                _tile_stored(C00, c, 64);
                _tile_stored(C01, c + 256, 64);
                _tile_stored(C10, c + 512, 64);
                _tile_stored(C11, c + 768, 64);
                for (int t = 0; t < (two ? 4 : 2); t++)
                    store_c(c + t * 256, y, rows, p + i + (size_t)(t / 2) * 16,
                            (g + (size_t)(t % 2)) * 16, (size_t)n);
            }
        }
    }
    _tile_release();
}
