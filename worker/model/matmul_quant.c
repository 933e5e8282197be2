/* Block-quantised weights (--quant q8 / q4): quantisation at load, and the product
 * y = x * W^T with x quantised to int8 per block of 32 (llama.cpp's scheme for Q8_0 and Q4_0
 * weights), integer dot products per block (vpdpbusd with AVX-512 VNNI, vpmaddubsw +
 * vpmaddwd with AVX2 and AVX-512 BW, portable C), and the block scales applied in f32.
 *
 * Every variant computes the same bits. A row's dot product is held in 16 f32 lanes: lane
 * 8h + j gathers, for every block k with k % 2 == h, the integer sum of its elements 4j..4j+3
 * (exact), times dw[k] * dx[k], accumulated by FMA in block order; the lanes are summed in
 * one fixed order at the end. The AVX-512 tile holds this in one zmm, AVX2 in two ymm, the
 * scalar reference in an array. So tests compare the variants for equality, and a row's
 * result depends neither on the batch nor on the thread count. */
#include "worker/model/matmul_impl.h"

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "worker/model/safetensors.h"

#define QK 32      /* elements per block */
#define QNB_MAX 4  /* largest batch tile */
#define QRB 4      /* weight rows per tile (AVX-512, generic) */
#define QRB_AVX2 4 /* AVX2 tile rows: 4 x 1 or 2 x 2 batch rows, x 2 halves of accumulators */

/* One quantised row of x: q[cols] int8 values, a[cols] = |q|, per block d (scale, f32) and
 * c = -8 * sum(q) (the Q4_0 offset: w = nibble - 8, folded into the integer sum). */
typedef struct qrow {
    const int8_t *q;
    const uint8_t *a;
    const float *d;
    const int32_t *c;
} qrow;

typedef void (*qtile_fn)(const uint8_t *const *wq, const uint16_t *const *wd, const qrow *xr,
                         int nblk, float *out, const char *pf);

/* Quantises one row of x (cols floats) into q, a, d, c: see qrow. */
typedef void (*qxrow_fn)(const float *x, int cols, int8_t *q, uint8_t *a, float *d, int32_t *c);

typedef struct qops {
    qtile_fn tile[2][QNB_MAX + 1]; /* [0: Q8_0, 1: Q4_0][nb] */
    int nb_max, rb;
    qxrow_fn xrow; /* the row quantiser of x, bit for bit the same in every variant */
} qops;

static void quantize_x_row(const float *x, int cols, int8_t *q, uint8_t *a, float *d, int32_t *c);

/* The lanes' final sum, in the order of matmul.c's a512_hsum: halves added, then 8 -> 4 -> 2
 * -> 1 as avx2_hsum does. */
static float lanes_sum(const float l[16])
{
    float h[8], t[4];
    for (int j = 0; j < 8; j++)
        h[j] = l[j] + l[j + 8];
    for (int j = 0; j < 4; j++)
        t[j] = h[j] + h[j + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* ---- portable C: the reference every variant must equal ---- */

static float gen_qdot(cg_dtype dt, const uint8_t *w, const uint16_t *wd, const qrow *x, int nblk)
{
    float acc[16] = {0};
    for (int k = 0; k < nblk; k++) {
        const int h = k & 1;
        const float sc = cg_f16_to_f32(wd[k]) * x->d[k];
        for (int j = 0; j < 8; j++) {
            int32_t s = 0;
            for (int i = 0; i < 4; i++) {
                const int e = 4 * j + i;
                int wv;
                if (dt == CG_DTYPE_Q8_0)
                    wv = (int8_t)w[(size_t)k * QK + (size_t)e];
                else {
                    const uint8_t byte = w[(size_t)(k / 2) * QK + (size_t)e];
                    wv = h ? byte >> 4 : byte & 15;
                }
                s += wv * x->q[(size_t)k * QK + (size_t)e];
            }
            if (dt == CG_DTYPE_Q4_0 && j == 0) s += x->c[k];
            acc[8 * h + j] = fmaf((float)s, sc, acc[8 * h + j]);
        }
    }
    return lanes_sum(acc);
}

#define GEN_FN(DT, NAME)                                                                           \
    static void NAME(const uint8_t *const *wq, const uint16_t *const *wd, const qrow *xr,          \
                     int nblk, float *out, const char *pf)                                         \
    {                                                                                              \
        (void)pf;                                                                                  \
        for (int r = 0; r < QRB; r++)                                                              \
            out[r] = gen_qdot(DT, wq[r], wd[r], xr, nblk);                                         \
    }
GEN_FN(CG_DTYPE_Q8_0, gen_q8_1)
GEN_FN(CG_DTYPE_Q4_0, gen_q4_1)

static const qops qops_generic = {
    .tile = {{NULL, gen_q8_1}, {NULL, gen_q4_1}}, .nb_max = 1, .rb = QRB, .xrow = quantize_x_row};

/* ---- AVX2: one ymm per block, even blocks in acc[0], odd in acc[1] ---- */

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))

T_AVX2 static void quantize_x_row_avx2(const float *x, int cols, int8_t *q, uint8_t *a, float *d,
                                       int32_t *c);

T_AVX2 static inline float avx2q_hsum(__m256 lo, __m256 hi)
{
    __m256 v = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T_AVX2 static inline __m256i avx2q_idot(__m256i u8, __m256i s8)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1));
}

/* One block k (h = k % 2) for rb rows against nb rows of x: raw[r] holds row r's bytes of the
 * block (Q8_0) or of its pair (Q4_0: low nibbles block k - h, high nibbles block k - h + 1). */
T_AVX2 static inline __attribute__((always_inline)) void
avx2q_step(int q8, int h, int nb, int rb, int k, const __m256i *raw, const uint16_t *const *wd,
           const qrow *xr, __m256 acc[2][2][QRB_AVX2])
{
    __m256i xa[2], xq[2], xc[2];
    float xd[2];
#pragma GCC unroll 2
    for (int b = 0; b < nb; b++) {
        xq[b] = _mm256_loadu_si256((const void *)(xr[b].q + (size_t)k * QK));
        if (q8)
            xa[b] = _mm256_loadu_si256((const void *)(xr[b].a + (size_t)k * QK));
        else
            xc[b] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(xr[b].c[k]));
        xd[b] = xr[b].d[k];
    }
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++) {
        __m256i w = raw[r];
        if (!q8) {
            if (h) w = _mm256_srli_epi16(w, 4);
            w = _mm256_and_si256(w, _mm256_set1_epi8(0x0f));
        }
        const float dw = _cvtsh_ss(wd[r][k]);
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++) {
            __m256i i;
            if (q8)
                i = avx2q_idot(xa[b], _mm256_sign_epi8(w, xq[b]));
            else
                i = _mm256_add_epi32(xc[b], avx2q_idot(w, xq[b]));
            acc[h][b][r] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(dw * xd[b]), acc[h][b][r]);
        }
    }
}

/* rb rows of W (2 or 4) against nb rows of x (1 or 2; rb * nb <= 4 keeps the accumulators in
 * 8 of the 16 registers). The blocks go in pairs, so a Q4_0 pair is loaded once. out[b * os +
 * r]; pf: the next rb rows, prefetched a pair's share at a time. */
T_AVX2 static inline __attribute__((always_inline)) void
avx2q_tile(cg_dtype dt, int nb, int rb, const uint8_t *const *wq, const uint16_t *const *wd,
           const qrow *xr, int nblk, float *out, int os, const char *pf)
{
    const int q8 = dt == CG_DTYPE_Q8_0;
    const size_t pairbytes = q8 ? 64 : 32;
    __m256 acc[2][2][QRB_AVX2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
        for (int b = 0; b < nb; b++)
#pragma GCC unroll 4
            for (int r = 0; r < rb; r++)
                acc[h][b][r] = _mm256_setzero_ps();
    __m256i raw[QRB_AVX2];
    int k = 0;
    for (; k + 1 < nblk; k += 2) {
        if (pf) {
            const char *pp = pf + (size_t)(k / 2) * (size_t)rb * pairbytes;
            for (size_t l = 0; l < (size_t)rb * pairbytes; l += 64)
                _mm_prefetch(pp + l, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++)
            raw[r] = _mm256_loadu_si256((const void *)(wq[r] + (size_t)(q8 ? k : k / 2) * QK));
        avx2q_step(q8, 0, nb, rb, k, raw, wd, xr, acc);
        if (q8)
#pragma GCC unroll 4
            for (int r = 0; r < rb; r++)
                raw[r] = _mm256_loadu_si256((const void *)(wq[r] + (size_t)(k + 1) * QK));
        avx2q_step(q8, 1, nb, rb, k + 1, raw, wd, xr, acc);
    }
    if (k < nblk) { /* an odd last block: Q8_0 only (Q4_0 rows hold whole pairs) */
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++)
            raw[r] = _mm256_loadu_si256((const void *)(wq[r] + (size_t)k * QK));
        avx2q_step(q8, 0, nb, rb, k, raw, wd, xr, acc);
    }
#pragma GCC unroll 2
    for (int b = 0; b < nb; b++)
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++)
            out[b * os + r] = avx2q_hsum(acc[0][b][r], acc[1][b][r]);
}

/* A decode step (one row of x) takes 4 rows of W at a time; two rows of x take them 2 and 2. */
#define AVX2_FN(DT, NAME1, NAME2)                                                                  \
    T_AVX2 static void NAME1(const uint8_t *const *wq, const uint16_t *const *wd, const qrow *xr,  \
                             int nblk, float *out, const char *pf)                                 \
    {                                                                                              \
        avx2q_tile(DT, 1, 4, wq, wd, xr, nblk, out, QRB_AVX2, pf);                                 \
    }                                                                                              \
    T_AVX2 static void NAME2(const uint8_t *const *wq, const uint16_t *const *wd, const qrow *xr,  \
                             int nblk, float *out, const char *pf)                                 \
    {                                                                                              \
        const size_t half = 2 * (size_t)nblk * (DT == CG_DTYPE_Q8_0 ? QK : QK / 2);                \
        avx2q_tile(DT, 2, 2, wq, wd, xr, nblk, out, QRB_AVX2, pf);                                 \
        avx2q_tile(DT, 2, 2, wq + 2, wd + 2, xr, nblk, out + 2, QRB_AVX2, pf ? pf + half : NULL);  \
    }
AVX2_FN(CG_DTYPE_Q8_0, avx2q_q8_1, avx2q_q8_2)
AVX2_FN(CG_DTYPE_Q4_0, avx2q_q4_1, avx2q_q4_2)

static const qops qops_avx2 = {
    .tile = {{NULL, avx2q_q8_1, avx2q_q8_2}, {NULL, avx2q_q4_1, avx2q_q4_2}},
    .nb_max = 2,
    .rb = QRB_AVX2,
    .xrow = quantize_x_row_avx2};

/* ---- AVX-512: one zmm per pair of blocks (matmul_quant_a512.inc) ---- */

#define T_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define T_512V __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

T_512 static inline float q512_hsum(__m512 v)
{
    return avx2q_hsum(_mm512_castps512_ps256(v),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

#define Q512_TARGET T_512
#define Q512_VNNI 0
#define Q512(name) a512q_##name
#include "worker/model/matmul_quant_a512.inc"
#undef Q512_TARGET
#undef Q512_VNNI
#undef Q512

#define Q512_TARGET T_512V
#define Q512_VNNI 1
#define Q512(name) a512v_##name
#include "worker/model/matmul_quant_a512.inc"
#undef Q512_TARGET
#undef Q512_VNNI
#undef Q512

static const qops qops_512 = {.tile = {{NULL, a512q_q8_1, a512q_q8_2, a512q_q8_3, a512q_q8_4},
                                       {NULL, a512q_q4_1, a512q_q4_2, a512q_q4_3, a512q_q4_4}},
                              .nb_max = 4,
                              .rb = QRB,
                              .xrow = quantize_x_row_avx2};
static const qops qops_512v = {.tile = {{NULL, a512v_q8_1, a512v_q8_2, a512v_q8_3, a512v_q8_4},
                                        {NULL, a512v_q4_1, a512v_q4_2, a512v_q4_3, a512v_q4_4}},
                               .nb_max = 4,
                               .rb = QRB,
                               .xrow = quantize_x_row_avx2};

static const qops *const all_qops[CG_MATMUL_ISA_COUNT] = {&qops_generic, &qops_avx2, &qops_512,
                                                          &qops_512v, &qops_512v};

/* Round to nearest even, as rintf does, for |v| < 2^22, inline (rintf is a library call
 * without SSE4.1, and quantising a model makes billions of them). */
static inline float round_even(float v)
{
    return (v + 12582912.0f) - 12582912.0f;
}

/* ---- activations: int8 per block of 32 ---- */

/* x quantised: n rows of q, a (cols bytes each), d and c (nblk each). */
typedef struct qx {
    void *mem;
    int8_t *q;
    uint8_t *a;
    float *d;
    int32_t *c;
} qx;

static void quantize_x_row(const float *x, int cols, int8_t *q, uint8_t *a, float *d, int32_t *c)
{
    for (int k = 0; k < cols / QK; k++) {
        const float *xs = x + (size_t)k * QK;
        float amax = 0;
        for (int i = 0; i < QK; i++)
            amax = fmaxf(amax, fabsf(xs[i]));
        /* NaN and Inf pass through to the result as they do in the 16-bit products */
        const float dk = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < QK; i++) {
            float v = fminf(127.0f, fmaxf(-127.0f, xs[i] * id)); /* NaN -> -127 */
            v = round_even(v);
            const int8_t qi = (int8_t)(int)v;
            q[(size_t)k * QK + (size_t)i] = qi;
            a[(size_t)k * QK + (size_t)i] = (uint8_t)(qi < 0 ? -qi : qi);
            sum += qi;
        }
        d[k] = isfinite(amax) ? dk : amax;
        c[k] = -8 * sum;
    }
}

/* quantize_x_row with AVX2, bit for bit: max(a, b) gives b where a is NaN, so |x| that is NaN
 * leaves the maximum alone and a NaN product clamps to -127, as fmaxf does; vroundps rounds to
 * nearest even as round_even does. A decode step quantises x before every product, and the
 * scalar loop (fmaxf and fminf are library calls without -ffinite-math-only) was about a twentieth
 * of a q4 step on an AVX2 machine. */
T_AVX2 static void quantize_x_row_avx2(const float *x, int cols, int8_t *q, uint8_t *a, float *d,
                                       int32_t *c)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f),
                 hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int k = 0; k < cols / QK; k++) {
        const float *xs = x + (size_t)k * QK;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xs + 8 * j);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[j]), m);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float dk = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i qi[4];
        for (int j = 0; j < 4; j++) {
            __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[j], vid), lo), hi);
            qi[j] = _mm256_cvtps_epi32(
                _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        __m256i s =
            _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        /* packs interleave the 128-bit lanes: dwords 0-3 hold elements 0-3 of each group of 8 */
        __m256i b =
            _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        b = _mm256_permutevar8x32_epi32(b, order);
        _mm256_storeu_si256((void *)(q + (size_t)k * QK), b);
        _mm256_storeu_si256((void *)(a + (size_t)k * QK), _mm256_abs_epi8(b));
        d[k] = isfinite(amax) ? dk : amax;
        c[k] = -8 * _mm_cvtsi128_si32(s4);
    }
}

/* x quantised to int8 per block of 32, each row by xrow. */
static void quantize_x(const float *x, int n, int cols, qx *out, qxrow_fn xrow)
{
    const size_t nblk = (size_t)cols / QK, ne = (size_t)n * (size_t)cols;
    const size_t ps = (ne + 63) & ~(size_t)63;
    char *m = cg_malloc(2 * ps + (size_t)n * nblk * 8 + 128);
    char *p = (char *)(((uintptr_t)m + 63) & ~(uintptr_t)63);
    out->mem = m;
    out->q = (int8_t *)p;
    out->a = (uint8_t *)(p + ps);
    out->d = (float *)(p + 2 * ps);
    out->c = (int32_t *)(out->d + (size_t)n * nblk);
#pragma omp parallel for if (ne >= ((size_t)1 << 18)) schedule(static)
    for (int t = 0; t < n; t++)
        xrow(x + (size_t)t * (size_t)cols, cols, out->q + (size_t)t * (size_t)cols,
             out->a + (size_t)t * (size_t)cols, out->d + (size_t)t * nblk,
             out->c + (size_t)t * nblk);
}

/* ---- the product ---- */

/* Weights one super-block holds, as matmul.c's decode: the batch tiles take turns over a
 * stretch of W that stays in L2. */
#define SUPER_BYTES ((size_t)256 << 10)
#define PAR_BYTES ((size_t)256 * 1024)

static size_t row_bytes(const cg_weight *w)
{
    return w->dtype == CG_DTYPE_Q8_0 ? (size_t)w->cols : (size_t)w->cols / 2;
}

static void qrows(const qops *ops, const cg_weight *w, const qx *x, int n, float *y, size_t r0,
                  size_t r1)
{
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols, nblk = cols / QK;
    const size_t rb = (size_t)ops->rb, rowbytes = row_bytes(w);
    const size_t sb = CG_MAX(rb, SUPER_BYTES / rowbytes / rb * rb);
    const int t4 = w->dtype == CG_DTYPE_Q4_0;
    const uint8_t *wq[QRB];
    const uint16_t *wd[QRB];
    qrow xr[QNB_MAX];
    float out[QNB_MAX * QRB];
    for (size_t s0 = r0; s0 < r1; s0 += sb) {
        const size_t s1 = CG_MIN(r1, s0 + sb);
        for (int b0 = 0; b0 < n; b0 += ops->nb_max) {
            const int nb = CG_MIN(ops->nb_max, n - b0);
            for (int b = 0; b < nb; b++) {
                const size_t t = (size_t)(b0 + b);
                xr[b] = (qrow){x->q + t * cols, x->a + t * cols, x->d + t * nblk, x->c + t * nblk};
            }
            for (size_t r = s0; r < s1; r += rb) {
                const size_t m = CG_MIN(rb, s1 - r);
                /* a short last block repeats its last row: each (row, x) pair is computed alone */
                for (size_t j = 0; j < rb; j++) {
                    const size_t rr = r + CG_MIN(j, m - 1);
                    wq[j] = (const uint8_t *)w->data + rr * rowbytes;
                    wd[j] = w->bscale + rr * nblk;
                }
                const char *pf =
                    !b0 && r + rb < r1 ? (const char *)w->data + (r + rb) * rowbytes : NULL;
                ops->tile[t4][nb](wq, wd, xr, (int)nblk, out, pf);
                for (int b = 0; b < nb; b++)
                    for (size_t j = 0; j < m; j++)
                        y[(size_t)(b0 + b) * rows + r + j] = out[(size_t)b * rb + j];
            }
        }
    }
}

void cg_qmm_product(const cg_weight *w, const float *x, int n, float *y, cg_matmul_isa isa)
{
    assert(w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0);
    assert(w->cols % (w->dtype == CG_DTYPE_Q4_0 ? 2 * QK : QK) == 0 && w->bscale);
    if (n <= 0 || w->rows == 0) return;
    if (w->cols == 0) {
        memset(y, 0, (size_t)n * (size_t)w->rows * sizeof(float));
        return;
    }
    const qops *ops = all_qops[isa];
    qx xq;
    quantize_x(x, n, w->cols, &xq, ops->xrow);
    const size_t rows = (size_t)w->rows, rb = (size_t)ops->rb;
    const size_t blocks = (rows + rb - 1) / rb;
    const int par = rows * row_bytes(w) * (size_t)CG_MIN(n, 16) >= PAR_BYTES && blocks > 1;
#pragma omp parallel if (par) num_threads(CG_MIN(omp_get_max_threads(), 64))
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t a = blocks * t / nt * rb, b = CG_MIN(rows, blocks * (t + 1) / nt * rb);
        if (b > a) qrows(ops, w, &xq, n, y, a, b);
    }
    free(xq.mem);
}

/* ---- widening, for the prefill path's panels ---- */

/* Exact in every variant: d * q is a product of an f16 and an integer below 2^8, which f32
 * holds exactly. */
static void widen_generic(const cg_weight *w, size_t row, size_t c0, size_t count, float *dst)
{
    const size_t cols = (size_t)w->cols, nblk = cols / QK;
    const uint16_t *sc = w->bscale + row * nblk;
    for (size_t i = 0; i < count; i++) {
        const size_t c = c0 + i;
        const float d = cg_f16_to_f32(sc[c / QK]);
        if (w->dtype == CG_DTYPE_Q8_0) {
            dst[i] = d * (float)((const int8_t *)w->data)[row * cols + c];
        } else {
            const uint8_t b =
                ((const uint8_t *)w->data)[row * (cols / 2) + c / (2 * QK) * QK + c % QK];
            dst[i] = d * (float)(((c % (2 * QK)) < QK ? b & 15 : b >> 4) - 8);
        }
    }
}

T_AVX2 static void widen_avx2(const cg_weight *w, size_t row, size_t c0, size_t count, float *dst)
{
    const size_t cols = (size_t)w->cols, nblk = cols / QK;
    const uint16_t *sc = w->bscale + row * nblk;
    size_t i = 0;
    if (w->dtype == CG_DTYPE_Q8_0) {
        const int8_t *q = (const int8_t *)w->data + row * cols + c0;
        for (; i + QK <= count; i += QK) {
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(sc[(c0 + i) / QK]));
            for (size_t j = 0; j < QK; j += 8) {
                __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(q + i + j)));
                _mm256_storeu_ps(dst + i + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
            }
        }
    } else if (c0 % (2 * QK) == 0) {
        const uint8_t *q = (const uint8_t *)w->data + row * (cols / 2) + c0 / 2;
        for (; i + 2 * QK <= count; i += 2 * QK) {
            const __m256 d0 = _mm256_set1_ps(_cvtsh_ss(sc[(c0 + i) / QK]));
            const __m256 d1 = _mm256_set1_ps(_cvtsh_ss(sc[(c0 + i) / QK + 1]));
            const __m256i eight = _mm256_set1_epi32(8), mask = _mm256_set1_epi32(15);
            for (size_t j = 0; j < QK; j += 8) {
                __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(q + i / 2 + j)));
                __m256i lo = _mm256_sub_epi32(_mm256_and_si256(b, mask), eight);
                __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight);
                _mm256_storeu_ps(dst + i + j, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(lo)));
                _mm256_storeu_ps(dst + i + QK + j, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(hi)));
            }
        }
    }
    if (i < count) widen_generic(w, row, c0 + i, count - i, dst + i);
}

void cg_qmm_widen(const cg_weight *w, size_t row, size_t c0, size_t count, float *dst,
                  cg_matmul_isa isa)
{
    if (isa == CG_MATMUL_ISA_GENERIC)
        widen_generic(w, row, c0, count, dst);
    else
        widen_avx2(w, row, c0, count, dst);
}

/* ---- weights ---- */

float cg_weight_at(const cg_weight *w, size_t i)
{
    if (w->dtype == CG_DTYPE_F32) {
        float f;
        memcpy(&f, (const char *)w->data + i * 4, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)w->data + i * 2, sizeof h);
    return w->dtype == CG_DTYPE_BF16 ? cg_bf16_to_f32(h) : cg_f16_to_f32(h);
}

size_t cg_matmul_quant_bytes(cg_dtype dt, int rows, int cols, size_t *scale_count)
{
    const size_t n = (size_t)rows * (size_t)cols;
    if (scale_count) *scale_count = n / QK;
    return dt == CG_DTYPE_Q4_0 ? n / 2 : n;
}

/* One Q8_0 block: d = max |v| / 127 (rounded to f16 first, so q is rounded against the scale
 * the kernels use), q = round(v / d). */
static uint16_t q8_block(const float *v, int8_t *q)
{
    float amax = 0;
    for (int i = 0; i < QK; i++)
        amax = fmaxf(amax, fabsf(v[i]));
    const uint16_t dh = cg_f32_to_f16(amax / 127.0f);
    const float d = cg_f16_to_f32(dh), id = d > 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < QK; i++)
        q[i] = (int8_t)(int)round_even(fminf(127.0f, fmaxf(-127.0f, v[i] * id)));
    return dh;
}

/* One Q4_0-class block: w = (n - 8) * d with n in 0..15. llama.cpp's Q4_0 takes d = m / -8
 * for the element m of largest magnitude; here that scale and seven smaller ones are tried
 * and the one with the least squared error is kept, so the error is never above Q4_0's for
 * the same f16 scale rounding. n[e] for e < 32 goes to the caller's 32 entries. */
static uint16_t q4_block(const float *v, uint8_t n[QK])
{
    float m = 0;
    for (int i = 0; i < QK; i++)
        if (fabsf(v[i]) > fabsf(m)) m = v[i];
    uint16_t best_h = 0;
    float best_err = INFINITY;
    for (int c = 0; c < 8; c++) {
        const uint16_t dh = cg_f32_to_f16(m / (-8.0f + 0.25f * (float)c));
        const float d = cg_f16_to_f32(dh), id = d != 0 ? 1.0f / d : 0.0f;
        float err = 0;
        for (int i = 0; i < QK; i++) {
            const float k = round_even(fminf(7.0f, fmaxf(-8.0f, v[i] * id))) + 8.0f;
            const float e = v[i] - (k - 8.0f) * d;
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_h = dh;
        }
    }
    const float d = cg_f16_to_f32(best_h), id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < QK; i++)
        n[i] = (uint8_t)(round_even(fminf(7.0f, fmaxf(-8.0f, v[i] * id))) + 8.0f);
    return best_h;
}

cg_status cg_matmul_quantize(const cg_weight *w, cg_dtype to, void *q, uint16_t *scales,
                             cg_weight *out)
{
    if (w->dtype != CG_DTYPE_F32 && w->dtype != CG_DTYPE_F16 && w->dtype != CG_DTYPE_BF16)
        return CG_E_UNSUPPORTED;
    if (to != CG_DTYPE_Q8_0 && to != CG_DTYPE_Q4_0) return CG_E_UNSUPPORTED;
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols, nblk = cols / QK;
    if (cols % (to == CG_DTYPE_Q4_0 ? 2 * QK : QK)) return CG_E_VALUE;
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float v[2 * QK];
        for (size_t k = 0; k < nblk; k += 2) {
            const size_t nk = CG_MIN((size_t)2, nblk - k);
            for (size_t i = 0; i < nk * QK; i++) {
                v[i] = cg_weight_at(w, r * cols + k * QK + i);
                if (!isfinite(v[i])) bad = 1, v[i] = 0;
            }
            if (to == CG_DTYPE_Q8_0) {
                for (size_t h = 0; h < nk; h++)
                    scales[r * nblk + k + h] =
                        q8_block(v + h * QK, (int8_t *)q + r * cols + (k + h) * QK);
            } else {
                /* a pair of blocks in 32 bytes: byte i holds element i (low nibble) and
                 * element 32 + i (high nibble) */
                uint8_t lo[QK], hi[QK];
                scales[r * nblk + k] = q4_block(v, lo);
                scales[r * nblk + k + 1] = q4_block(v + QK, hi);
                uint8_t *dst = (uint8_t *)q + r * (cols / 2) + k / 2 * QK;
                for (int i = 0; i < QK; i++)
                    dst[i] = (uint8_t)(lo[i] | hi[i] << 4);
            }
        }
    }
    if (bad) return CG_E_VALUE;
    *out = (cg_weight){.data = q, .dtype = to, .rows = w->rows, .cols = w->cols, .bscale = scales};
    return CG_OK;
}

void cg_matmul_dequant_row(const cg_weight *w, int row, float *out)
{
    const size_t cols = (size_t)w->cols, nblk = cols / QK;
    const uint16_t *sc = w->bscale + (size_t)row * nblk;
    if (w->dtype == CG_DTYPE_Q8_0) {
        const int8_t *q = (const int8_t *)w->data + (size_t)row * cols;
        for (size_t i = 0; i < cols; i++)
            out[i] = cg_f16_to_f32(sc[i / QK]) * (float)q[i];
        return;
    }
    const uint8_t *q = (const uint8_t *)w->data + (size_t)row * (cols / 2);
    for (size_t i = 0; i < cols; i++) {
        const size_t pair = i / (2 * QK), e = i % (2 * QK);
        const uint8_t byte = q[pair * QK + e % QK];
        const int nib = e < QK ? byte & 15 : byte >> 4;
        out[i] = cg_f16_to_f32(sc[i / QK]) * (float)(nib - 8);
    }
}
