/* Weight products y = x * W^T for f32, f16 and bf16 weights: the prefill path (panels of W
 * widened to f32, then OpenBLAS sgemm), the batch-invariant decode kernel, and the run-time
 * choice between portable C, AVX2 and AVX-512 variants. */
#include "worker/model/matmul.h"

#include <assert.h>
#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"
#include "worker/model/matmul_impl.h"
#include "worker/model/safetensors.h"

static inline size_t esize(cg_dtype dt)
{
    return dt == CG_DTYPE_F32 ? 4 : dt >= CG_DTYPE_Q8 ? 1 : 2;
}

size_t cg_dtype_size(cg_dtype dt)
{
    return esize(dt);
}

/* ---- kernel variants ---- */

/* The decode kernel's unit of work: an rb x nb tile, rb weight rows (wr) against nb rows of
 * x (xr), all `cols` long; out[b * rb + r] = x_b . w_r. pf, when not NULL, is the start of
 * the next rb rows (contiguous), prefetched at the pace this tile reads its own rows. Every (b, r)
 * pair has its own accumulator and goes through the same instructions in the same order whatever
 * nb, rb and the tile's place, which is what makes the decode path batch-invariant. */
typedef void (*tile_fn)(const void *const *wr, const float *const *xr, int cols, float *out,
                        const char *pf);

#define NB_MAX 4 /* largest batch tile of any variant */
#define RB_MAX 4 /* largest row block of any variant */
/* Decode prefetch: T0, one row block ahead; T1/NTA and 2-4 blocks ahead measured alike, no
 * prefetch at all 0.4-0.7x of the read baseline at n = 1 instead of 0.9-1.0x. A prefetch
 * never faults, so the one past a thread's short last block is harmless. */
#define PF_HINT _MM_HINT_T0

typedef struct isa_ops {
    tile_fn tile[4][NB_MAX + 1]; /* [dtype][nb], nb = 1..nb_max */
    int nb_max;                  /* batch rows per tile */
    int rb;                      /* weight rows per tile */
    /* dst[i] = float(src[i]) for i < count, 16-bit dtypes; scale * float(src[i]) for Q8 */
    void (*widen)(cg_dtype dt, const void *src, size_t count, float *dst, float scale);
} isa_ops;

/* -- portable C: one dot product per (b, r), four partial sums combined in a fixed order -- */

#define GENERIC_DOT(NAME, LOAD)                                                                    \
    static float NAME(const float *x, const void *wv, int cols)                                    \
    {                                                                                              \
        const uint16_t *w16 = wv;                                                                  \
        const float *w32 = wv;                                                                     \
        const int8_t *w8 = wv;                                                                     \
        (void)w16;                                                                                 \
        (void)w32;                                                                                 \
        (void)w8;                                                                                  \
        float a[4] = {0, 0, 0, 0};                                                                 \
        int k = 0;                                                                                 \
        for (; k + 4 <= cols; k += 4)                                                              \
            for (int j = 0; j < 4; j++)                                                            \
                a[j] += x[k + j] * LOAD(k + j);                                                    \
        for (int j = 0; k < cols; k++, j++)                                                        \
            a[j] += x[k] * LOAD(k);                                                                \
        return (a[0] + a[1]) + (a[2] + a[3]);                                                      \
    }
#define LOAD_F32(i) w32[i]
#define LOAD_F16(i) cg_f16_to_f32(w16[i])
#define LOAD_BF16(i) cg_bf16_to_f32(w16[i])
#define LOAD_Q8(i) ((float)w8[i])
GENERIC_DOT(dot_f32, LOAD_F32)
GENERIC_DOT(dot_f16, LOAD_F16)
GENERIC_DOT(dot_bf16, LOAD_BF16)
GENERIC_DOT(dot_q8, LOAD_Q8)

#define GENERIC_RB 4
#define GENERIC_TILE(NAME, DOT, NB)                                                                \
    static void NAME(const void *const *wr, const float *const *xr, int cols, float *out,          \
                     const char *pf)                                                               \
    {                                                                                              \
        (void)pf;                                                                                  \
        for (int b = 0; b < NB; b++)                                                               \
            for (int r = 0; r < GENERIC_RB; r++)                                                   \
                out[b * GENERIC_RB + r] = DOT(xr[b], wr[r], cols);                                 \
    }
GENERIC_TILE(gen_f32_1, dot_f32, 1)
GENERIC_TILE(gen_f16_1, dot_f16, 1)
GENERIC_TILE(gen_bf16_1, dot_bf16, 1)
GENERIC_TILE(gen_q8_1, dot_q8, 1)

static void widen_generic(cg_dtype dt, const void *src, size_t count, float *dst, float scale)
{
    if (dt == CG_DTYPE_Q8)
        for (size_t i = 0; i < count; i++)
            dst[i] = (float)((const int8_t *)src)[i] * scale;
    else
        cg_widen16(src, count, dt == CG_DTYPE_BF16, dst);
}

static const isa_ops ops_generic = {
    .tile = {[CG_DTYPE_F32] = {NULL, gen_f32_1},
             [CG_DTYPE_F16] = {NULL, gen_f16_1},
             [CG_DTYPE_BF16] = {NULL, gen_bf16_1},
             [CG_DTYPE_Q8] = {NULL, gen_q8_1}},
    .nb_max = 1,
    .rb = GENERIC_RB,
    .widen = widen_generic,
};

/* -- the SIMD variants: one tile and one widening loop, written once for both widths -- */

/* The register tile: nb rows of x (nb <= NB) against RB weight rows, accumulated in NB x RB
 * vectors of W floats, the weight bytes of the next tile prefetched from pf when it is not
 * NULL. V is the intrinsics' prefix (_mm256, _mm512); P names the width's own functions:
 * P##_ldw (W weights of dtype dt as floats), P##_tail (adds the products of the last
 * cols - k < W columns) and P##_hsum (the sum of a vector's lanes). */
#define SIMD_TILE(P, T, VEC, V, W, RB, NB)                                                         \
    T static inline __attribute__((always_inline)) void P##_tile(                                  \
        cg_dtype dt, int nb, const void *const *wr, const float *const *xr, int cols, float *out,  \
        const char *pf)                                                                            \
    {                                                                                              \
        const size_t es = esize(dt);                                                               \
        VEC acc[NB][RB];                                                                           \
        _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++)                                       \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[b][r] = V##_setzero_ps();     \
        int k = 0;                                                                                 \
        for (; k + W <= cols; k += W) {                                                            \
            if (pf) {                                                                              \
                const char *p = pf + (size_t)k * RB * es;                                          \
                _Pragma("GCC unroll 8") for (size_t l = 0; l < RB * W * es; l += 64)               \
                    _mm_prefetch(p + l, PF_HINT);                                                  \
            }                                                                                      \
            VEC xv[NB];                                                                            \
            _Pragma("GCC unroll 4") for (int b = 0; b < nb; b++) xv[b] = V##_loadu_ps(xr[b] + k);  \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                   \
            {                                                                                      \
                VEC wv = P##_ldw(dt, (const char *)wr[r] + (size_t)k * es);                        \
                _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++) acc[b][r] =                   \
                    V##_fmadd_ps(xv[b], wv, acc[b][r]);                                            \
            }                                                                                      \
        }                                                                                          \
        if (k < cols) P##_tail(dt, nb, wr, xr, k, cols, acc);                                      \
        _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++)                                       \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) out[b * RB + r] =                 \
                P##_hsum(acc[b][r]);                                                               \
    }

/* A tile function of the ops table: P##_tile for dtype DT and NB rows of x. */
#define SIMD_TILE_FN(P, T, DT, NAME, NB)                                                           \
    T static void NAME(const void *const *wr, const float *const *xr, int cols, float *out,        \
                       const char *pf)                                                             \
    {                                                                                              \
        P##_tile(DT, NB, wr, xr, cols, out, pf);                                                   \
    }

/* P##_widen: W values at a time through P##_ldw (int8 times scale, or 16-bit floats), the
 * rest through widen_generic. */
#define SIMD_WIDEN(P, T, VEC, V, W)                                                                \
    T static void P##_widen(cg_dtype dt, const void *src, size_t count, float *dst, float scale)   \
    {                                                                                              \
        const uint16_t *s = src;                                                                   \
        size_t i = 0;                                                                              \
        if (dt == CG_DTYPE_Q8) {                                                                   \
            const int8_t *q = src;                                                                 \
            const VEC sc = V##_set1_ps(scale);                                                     \
            for (; i + W <= count; i += W)                                                         \
                V##_storeu_ps(dst + i, V##_mul_ps(P##_ldw(CG_DTYPE_Q8, q + i), sc));               \
            widen_generic(dt, q + i, count - i, dst + i, scale);                                   \
            return;                                                                                \
        }                                                                                          \
        if (dt == CG_DTYPE_BF16)                                                                   \
            for (; i + W <= count; i += W)                                                         \
                V##_storeu_ps(dst + i, P##_ldw(CG_DTYPE_BF16, s + i));                             \
        else                                                                                       \
            for (; i + W <= count; i += W)                                                         \
                V##_storeu_ps(dst + i, P##_ldw(CG_DTYPE_F16, s + i));                              \
        widen_generic(dt, s + i, count - i, dst + i, scale);                                       \
    }

/* -- AVX2 + FMA + F16C: 8 lanes -- */

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_RB 4
#define AVX2_NB 3

T_AVX2 static inline __m256 avx2_ldw(cg_dtype dt, const void *p)
{
    if (dt == CG_DTYPE_F32) return _mm256_loadu_ps(p);
    if (dt == CG_DTYPE_Q8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p)));
    __m128i h = _mm_loadu_si128(p);
    if (dt == CG_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The tail goes through zero-padded copies: the same FMA, no read past the end. */
T_AVX2 static inline __attribute__((always_inline)) void
avx2_tail(cg_dtype dt, int nb, const void *const *wr, const float *const *xr, int k, int cols,
          __m256 acc[AVX2_NB][AVX2_RB])
{
    const size_t es = esize(dt);
    const int rem = cols - k;
    float xt[AVX2_NB][8];
    _Alignas(32) unsigned char wt[AVX2_RB][32];
    memset(xt, 0, sizeof xt);
    memset(wt, 0, sizeof wt);
    for (int b = 0; b < nb; b++)
        memcpy(xt[b], xr[b] + k, (size_t)rem * sizeof(float));
    for (int r = 0; r < AVX2_RB; r++)
        memcpy(wt[r], (const char *)wr[r] + (size_t)k * es, (size_t)rem * es);
#pragma GCC unroll 8
    for (int r = 0; r < AVX2_RB; r++) {
        __m256 wv = avx2_ldw(dt, wt[r]);
#pragma GCC unroll 8
        for (int b = 0; b < nb; b++)
            acc[b][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xt[b]), wv, acc[b][r]);
    }
}

T_AVX2 static inline float avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

SIMD_TILE(avx2, T_AVX2, __m256, _mm256, 8, AVX2_RB, AVX2_NB)
SIMD_WIDEN(avx2, T_AVX2, __m256, _mm256, 8)

#define AVX2_TILE(DT, NAME, NB) SIMD_TILE_FN(avx2, T_AVX2, DT, NAME, NB)
AVX2_TILE(CG_DTYPE_F32, avx2_f32_1, 1)
AVX2_TILE(CG_DTYPE_F32, avx2_f32_2, 2)
AVX2_TILE(CG_DTYPE_F32, avx2_f32_3, 3)
AVX2_TILE(CG_DTYPE_F16, avx2_f16_1, 1)
AVX2_TILE(CG_DTYPE_F16, avx2_f16_2, 2)
AVX2_TILE(CG_DTYPE_F16, avx2_f16_3, 3)
AVX2_TILE(CG_DTYPE_BF16, avx2_bf16_1, 1)
AVX2_TILE(CG_DTYPE_BF16, avx2_bf16_2, 2)
AVX2_TILE(CG_DTYPE_BF16, avx2_bf16_3, 3)
AVX2_TILE(CG_DTYPE_Q8, avx2_q8_1, 1)
AVX2_TILE(CG_DTYPE_Q8, avx2_q8_2, 2)
AVX2_TILE(CG_DTYPE_Q8, avx2_q8_3, 3)

static const isa_ops ops_avx2 = {
    .tile = {[CG_DTYPE_F32] = {NULL, avx2_f32_1, avx2_f32_2, avx2_f32_3},
             [CG_DTYPE_F16] = {NULL, avx2_f16_1, avx2_f16_2, avx2_f16_3},
             [CG_DTYPE_BF16] = {NULL, avx2_bf16_1, avx2_bf16_2, avx2_bf16_3},
             [CG_DTYPE_Q8] = {NULL, avx2_q8_1, avx2_q8_2, avx2_q8_3}},
    .nb_max = AVX2_NB,
    .rb = AVX2_RB,
    .widen = avx2_widen,
};

/* -- AVX-512 F/BW/VL: 16 lanes, masked loads for the tail -- */

#define T_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define A512_RB 4
#define A512_NB 4

T_512 static inline __m512 a512_ldw(cg_dtype dt, const void *p)
{
    if (dt == CG_DTYPE_F32) return _mm512_loadu_ps(p);
    if (dt == CG_DTYPE_Q8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)));
    __m256i h = _mm256_loadu_si256(p);
    if (dt == CG_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The tail runs masked. */
T_512 static inline __m512 a512_ldw_mask(cg_dtype dt, const void *p, __mmask16 m)
{
    if (dt == CG_DTYPE_F32) return _mm512_maskz_loadu_ps(m, p);
    if (dt == CG_DTYPE_Q8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (dt == CG_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

T_512 static inline __attribute__((always_inline)) void
a512_tail(cg_dtype dt, int nb, const void *const *wr, const float *const *xr, int k, int cols,
          __m512 acc[A512_NB][A512_RB])
{
    const size_t es = esize(dt);
    const __mmask16 m = (__mmask16)((1u << (cols - k)) - 1);
    __m512 xv[A512_NB];
#pragma GCC unroll 4
    for (int b = 0; b < nb; b++)
        xv[b] = _mm512_maskz_loadu_ps(m, xr[b] + k);
#pragma GCC unroll 8
    for (int r = 0; r < A512_RB; r++) {
        __m512 wv = a512_ldw_mask(dt, (const char *)wr[r] + (size_t)k * es, m);
#pragma GCC unroll 8
        for (int b = 0; b < nb; b++)
            acc[b][r] = _mm512_fmadd_ps(xv[b], wv, acc[b][r]);
    }
}

/* The two halves added, then summed as AVX2 does. */
T_512 static inline float a512_hsum(__m512 v)
{
    return avx2_hsum(
        _mm256_add_ps(_mm512_castps512_ps256(v),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

SIMD_TILE(a512, T_512, __m512, _mm512, 16, A512_RB, A512_NB)
SIMD_WIDEN(a512, T_512, __m512, _mm512, 16)

#define A512_TILE(DT, NAME, NB) SIMD_TILE_FN(a512, T_512, DT, NAME, NB)
A512_TILE(CG_DTYPE_F32, a512_f32_1, 1)
A512_TILE(CG_DTYPE_F32, a512_f32_2, 2)
A512_TILE(CG_DTYPE_F32, a512_f32_3, 3)
A512_TILE(CG_DTYPE_F32, a512_f32_4, 4)
A512_TILE(CG_DTYPE_F16, a512_f16_1, 1)
A512_TILE(CG_DTYPE_F16, a512_f16_2, 2)
A512_TILE(CG_DTYPE_F16, a512_f16_3, 3)
A512_TILE(CG_DTYPE_F16, a512_f16_4, 4)
A512_TILE(CG_DTYPE_BF16, a512_bf16_1, 1)
A512_TILE(CG_DTYPE_BF16, a512_bf16_2, 2)
A512_TILE(CG_DTYPE_BF16, a512_bf16_3, 3)
A512_TILE(CG_DTYPE_BF16, a512_bf16_4, 4)
A512_TILE(CG_DTYPE_Q8, a512_q8_1, 1)
A512_TILE(CG_DTYPE_Q8, a512_q8_2, 2)
A512_TILE(CG_DTYPE_Q8, a512_q8_3, 3)
A512_TILE(CG_DTYPE_Q8, a512_q8_4, 4)

static const isa_ops ops_512 = {
    .tile = {[CG_DTYPE_F32] = {NULL, a512_f32_1, a512_f32_2, a512_f32_3, a512_f32_4},
             [CG_DTYPE_F16] = {NULL, a512_f16_1, a512_f16_2, a512_f16_3, a512_f16_4},
             [CG_DTYPE_BF16] = {NULL, a512_bf16_1, a512_bf16_2, a512_bf16_3, a512_bf16_4},
             [CG_DTYPE_Q8] = {NULL, a512_q8_1, a512_q8_2, a512_q8_3, a512_q8_4}},
    .nb_max = A512_NB,
    .rb = A512_RB,
    .widen = a512_widen,
};

/* ---- dispatch ---- */

static const isa_ops *const all_ops[CG_MATMUL_ISA_COUNT] = {&ops_generic, &ops_avx2, &ops_512,
                                                            &ops_512, &ops_512};
static const char *const isa_names[CG_MATMUL_ISA_COUNT] = {"generic", "avx2", "avx512",
                                                           "avx512vnni", "amx"};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static _Atomic int isa_cur = CG_MATMUL_ISA_GENERIC;

static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

int cg_matmul_isa_supported(cg_matmul_isa isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case CG_MATMUL_ISA_GENERIC:
        return 1;
    case CG_MATMUL_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case CG_MATMUL_ISA_AVX512:
        return cg_matmul_isa_supported(CG_MATMUL_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    case CG_MATMUL_ISA_AVX512VNNI:
        return cg_matmul_isa_supported(CG_MATMUL_ISA_AVX512) &&
               __builtin_cpu_supports("avx512vnni");
    case CG_MATMUL_ISA_AMX:
        return cg_matmul_isa_supported(CG_MATMUL_ISA_AVX512VNNI) && cg_amx_supported();
    default:
        return 0;
    }
}

static void isa_init(void)
{
    int cap = CG_MATMUL_ISA_COUNT - 1;
    const char *env = getenv("CG_MATMUL_ISA");
    if (env && *env) {
        int found = -1;
        for (int i = 0; i < CG_MATMUL_ISA_COUNT; i++)
            if (!strcasecmp(env, isa_names[i])) found = i;
        if (found < 0)
            cg_log(CG_LOG_WARN,
                   "CG_MATMUL_ISA=%s is not generic, avx2, avx512, avx512vnni or amx; ignored",
                   env);
        else
            cap = found;
    }
    while (cap > 0 && !cg_matmul_isa_supported((cg_matmul_isa)cap))
        cap--;
    atomic_store(&isa_cur, cap);
}

cg_matmul_isa cg_matmul_isa_active(void)
{
    pthread_once(&isa_once, isa_init);
    return (cg_matmul_isa)atomic_load(&isa_cur);
}

const char *cg_matmul_isa_name(cg_matmul_isa isa)
{
    return (unsigned)isa < CG_MATMUL_ISA_COUNT ? isa_names[isa] : "unknown";
}

cg_status cg_matmul_set_isa(cg_matmul_isa isa)
{
    pthread_once(&isa_once, isa_init);
    if ((unsigned)isa >= CG_MATMUL_ISA_COUNT || !cg_matmul_isa_supported(isa))
        return CG_E_UNSUPPORTED;
    atomic_store(&isa_cur, (int)isa);
    return CG_OK;
}

static const isa_ops *active_ops(void)
{
    return all_ops[cg_matmul_isa_active()];
}

/* ---- scratch ---- */

#define MAX_THREADS 64

struct cg_matmul_scratch {
    void *buf[MAX_THREADS];  /* floats */
    size_t cap[MAX_THREADS]; /* floats */
    void *xp;                /* the amx variant's packed x (bf16), shared by the threads */
    size_t xp_cap;           /* values */
};

cg_matmul_scratch *cg_matmul_scratch_new(void)
{
    openblas_set_num_threads(1);
    return cg_calloc(1, sizeof(cg_matmul_scratch));
}

void cg_matmul_scratch_free(cg_matmul_scratch **ps)
{
    cg_matmul_scratch *s = *ps;
    if (!s) return;
    for (int i = 0; i < MAX_THREADS; i++)
        free(s->buf[i]);
    free(s->xp);
    cg_free(ps);
}

/* *buf, holding at least n elements of size bytes (*cap elements now); contents not kept. */
static void *scratch_grow(void **buf, size_t *cap, size_t n, size_t size)
{
    if (*cap < n) {
        free(*buf);
        *buf = cg_malloc(n * size);
        *cap = n;
    }
    return *buf;
}

static float *scratch_get(cg_matmul_scratch *s, int t, size_t floats)
{
    return scratch_grow(&s->buf[t], &s->cap[t], floats, sizeof(float));
}

static void check_weight(const cg_weight *w)
{
    assert(w->rows >= 0 && w->cols >= 0);
    assert(w->dtype >= CG_DTYPE_F32 && w->dtype <= CG_DTYPE_Q4_0);
    assert(((uintptr_t)w->data & (esize(w->dtype) - 1)) == 0);
    assert(w->dtype != CG_DTYPE_Q8 || w->scale);
    (void)w;
}

static int thread_cap(void)
{
    return CG_MIN(omp_get_max_threads(), MAX_THREADS);
}

/* ---- prefill ---- */

/* Widened panels: at most 1024 columns (wider matrices are cut into equal column blocks whose
 * products accumulate into y), and as many rows as fill 1 MiB of f32 per thread, at least 16.
 * Fewer rows per sgemm call make OpenBLAS repack x too often (down_proj, 4864 columns, lost
 * 23% with 16-row panels over all columns); 512-1024 columns and 0.5-2 MiB measured alike. */
#define PANEL_COLS ((size_t)1024)
#define PANEL_FLOATS ((size_t)256 * 1024)
/* Below ~1M multiply-adds the fork/join costs more than the second core gains. */
#define PAR_MACS ((size_t)1 << 20)

/* Weight rows per AMX panel: 32 to 128, at most 256 KiB of bf16 (the panel is swept over all of
 * x from L2; 64-256 rows measured alike at 512 x 896 and 4096 x 896, 32 best at 4864 columns). */
static size_t amx_panel_rows(size_t cols)
{
    return CG_MAX((size_t)32, CG_MIN((size_t)128, ((size_t)256 << 10) / (cols * 2) / 32 * 32));
}

/* The amx variant's prefill of a block-quantised w: x packed once into bf16 tiles by all threads,
 * then the weight rows split between them at multiples of 16. */
static void prefill_amx(const cg_weight *w, const float *x, int n, float *y, cg_matmul_scratch *s)
{
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    const size_t need = cg_amx_x_elems(n, (int)cols), groups = need / cols / 16;
    uint16_t *xp = scratch_grow(&s->xp, &s->xp_cap, need, sizeof(uint16_t));
    const size_t pr = amx_panel_rows(cols), units = rows / 16;
    const int par = (size_t)n * rows * cols >= PAR_MACS;
#pragma omp parallel if (par) num_threads(thread_cap())
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        cg_amx_pack_x(x, n, (int)cols, xp, groups * t / nt, groups * (t + 1) / nt);
#pragma omp barrier
        const size_t a = units * t / nt * 16, b = units * (t + 1) / nt * 16;
        if (b > a) cg_amx_rows(w, xp, n, y, a, b, pr, scratch_get(s, (int)t, pr * cols / 2 + 1024));
    }
}

/* The avx512vnni variant's prefill of a block-quantised w on a CPU with AVX512-BF16 (and no
 * AMX): x rounded once to bf16 by all threads, then the weight rows split between them at
 * multiples of 16. */
static void prefill_bf16(const cg_weight *w, const float *x, int n, float *y, cg_matmul_scratch *s)
{
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols, units = rows / 16;
    uint16_t *xb = scratch_grow(&s->xp, &s->xp_cap, (size_t)n * cols, sizeof(uint16_t));
    const size_t sfloats = cg_bf16_scratch_bytes((int)cols) / sizeof(float) + 1;
    const int par = (size_t)n * rows * cols >= PAR_MACS;
#pragma omp parallel if (par) num_threads(thread_cap())
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        cg_bf16_pack_x(x, (int)cols, xb, (size_t)n * t / nt, (size_t)n * (t + 1) / nt);
#pragma omp barrier
        const size_t a = units * t / nt * 16, b = units * (t + 1) / nt * 16;
        if (b > a) cg_bf16_rows(w, xb, n, y, a, b, scratch_get(s, (int)t, sfloats));
    }
}

void cg_matmul_prefill(const cg_weight *w, const float *x, int n, float *y, cg_matmul_scratch *s)
{
    check_weight(w);
    if (n <= 0 || w->rows == 0) return;
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    if (cols == 0) {
        memset(y, 0, (size_t)n * rows * sizeof(float));
        return;
    }
    if ((w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0) && rows % 16 == 0) {
        const cg_matmul_isa isa = cg_matmul_isa_active();
        if (isa == CG_MATMUL_ISA_AMX) {
            assert(s);
            prefill_amx(w, x, n, y, s);
            return;
        }
        if (isa == CG_MATMUL_ISA_AVX512VNNI && cg_bf16_supported()) {
            assert(s);
            prefill_bf16(w, x, n, y, s);
            return;
        }
    }
    const isa_ops *ops = active_ops();
    const int par = (size_t)n * rows * cols >= PAR_MACS;
#pragma omp parallel if (par) num_threads(thread_cap())
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        /* contiguous row ranges, cut at multiples of 16 (the sgemm kernels' unroll) */
        size_t a = rows * t / nt / 16 * 16, b = t + 1 == nt ? rows : rows * (t + 1) / nt / 16 * 16;
        if (b > a) {
            if (w->dtype == CG_DTYPE_F32) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)(b - a), (int)cols,
                            1.0f, x, (int)cols, (const float *)w->data + a * cols, (int)cols, 0.0f,
                            y + a, (int)rows);
            } else {
                /* panels of nb rows x kb columns; later column blocks accumulate into y */
                const size_t es = esize(w->dtype);
                const int q8 = w->dtype == CG_DTYPE_Q8;
                /* block dtypes: panels start at a pair of blocks */
                const int blk = w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0;
                const size_t unit = blk ? 64 : 16;
                const size_t kblocks = (cols + PANEL_COLS - 1) / PANEL_COLS;
                const size_t kb = ((cols + kblocks - 1) / kblocks + unit - 1) / unit * unit;
                size_t nb = CG_MAX((size_t)16, PANEL_FLOATS / CG_MIN(kb, cols) / 16 * 16);
                nb = CG_MIN(nb, b - a);
                assert(s);
                float *panel = scratch_get(s, (int)t, nb * kb);
                for (size_t r = a; r < b; r += nb) {
                    const size_t m = CG_MIN(nb, b - r);
                    for (size_t k = 0; k < cols; k += kb) {
                        const size_t kl = CG_MIN(kb, cols - k);
                        for (size_t i = 0; i < m; i++)
                            if (blk)
                                cg_qmm_widen(w, r + i, k, kl, panel + i * kl,
                                             cg_matmul_isa_active());
                            else
                                ops->widen(w->dtype,
                                           (const char *)w->data + ((r + i) * cols + k) * es, kl,
                                           panel + i * kl, q8 ? w->scale[r + i] : 1.0f);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)m, (int)kl,
                                    1.0f, x + k, (int)cols, panel, (int)kl, k ? 1.0f : 0.0f, y + r,
                                    (int)rows);
                    }
                }
            }
        }
    }
}

/* ---- decode ---- */

/* The weights one super-block holds: a quarter of this machine's L2. Without super-blocks,
 * n = 16 from memory ran at 70% of the in-cache rate; 64-256 KiB measured alike. */
#define SUPER_BYTES ((size_t)256 << 10)

/* Below this many weight bytes one thread reads the matrix faster than two are woken. */
#define PAR_BYTES ((size_t)256 * 1024)

static void decode_rows(const isa_ops *ops, const cg_weight *w, const float *x, int n, float *y,
                        size_t r0, size_t r1)
{
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    const size_t rowbytes = cols * esize(w->dtype);
    const size_t rb = (size_t)ops->rb;
    /* rows per super-block: the batch tiles take turns over one stretch of W that stays in L2 */
    const size_t sb = CG_MAX(rb, SUPER_BYTES / rowbytes / rb * rb);
    const void *wr[RB_MAX];
    const float *xr[NB_MAX];
    float out[NB_MAX * RB_MAX];
    for (size_t s0 = r0; s0 < r1; s0 += sb) {
        const size_t s1 = CG_MIN(r1, s0 + sb);
        for (int b0 = 0; b0 < n; b0 += ops->nb_max) {
            const int nb = CG_MIN(ops->nb_max, n - b0);
            for (int b = 0; b < nb; b++)
                xr[b] = x + (size_t)(b0 + b) * cols;
            for (size_t r = s0; r < s1; r += rb) {
                const size_t m = CG_MIN(rb, s1 - r);
                /* a short last block repeats its last row: each (row, x) pair is computed alone */
                for (size_t j = 0; j < rb; j++)
                    wr[j] = (const char *)w->data + (r + CG_MIN(j, m - 1)) * rowbytes;
                /* the first batch tile, which brings W in from memory, prefetches the next rb
                 * rows (into the next super-block too), unless these are the thread's last */
                const char *pf =
                    !b0 && r + rb < r1 ? (const char *)w->data + (r + rb) * rowbytes : NULL;
                ops->tile[w->dtype][nb](wr, xr, (int)cols, out, pf);
                if (w->dtype == CG_DTYPE_Q8)
                    for (int b = 0; b < nb; b++)
                        for (size_t j = 0; j < m; j++)
                            y[(size_t)(b0 + b) * rows + r + j] =
                                out[(size_t)b * rb + j] * w->scale[r + j];
                else
                    for (int b = 0; b < nb; b++)
                        for (size_t j = 0; j < m; j++)
                            y[(size_t)(b0 + b) * rows + r + j] = out[(size_t)b * rb + j];
            }
        }
    }
}

void cg_matmul_decode(const cg_weight *w, const float *x, int n, float *y)
{
    check_weight(w);
    if (w->dtype == CG_DTYPE_Q8_0 || w->dtype == CG_DTYPE_Q4_0) {
        cg_qmm_product(w, x, n, y, cg_matmul_isa_active());
        return;
    }
    if (n <= 0 || w->rows == 0) return;
    if (w->cols == 0) {
        memset(y, 0, (size_t)n * (size_t)w->rows * sizeof(float));
        return;
    }
    const isa_ops *ops = active_ops();
    const size_t rows = (size_t)w->rows, rb = (size_t)ops->rb;
    const size_t blocks = (rows + rb - 1) / rb;
    const int par = rows * (size_t)w->cols * esize(w->dtype) >= PAR_BYTES && blocks > 1;
#pragma omp parallel if (par) num_threads(thread_cap())
    {
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t a = blocks * t / nt * rb, b = CG_MIN(rows, blocks * (t + 1) / nt * rb);
        if (b > a) decode_rows(ops, w, x, n, y, a, b);
    }
}

/* ---- int8 option ---- */

cg_status cg_matmul_quantize_q8(const cg_weight *w, int8_t *q, float *scale, cg_weight *out)
{
    check_weight(w);
    if (w->dtype >= CG_DTYPE_Q8) return CG_E_UNSUPPORTED;
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float amax = 0;
        for (size_t c = 0; c < cols; c++) {
            float v = cg_weight_at(w, r * cols + c);
            if (!isfinite(v)) bad = 1;
            amax = fmaxf(amax, fabsf(v));
        }
        /* an all-zero row keeps scale 0 and q 0 */
        const float s = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        scale[r] = s;
        for (size_t c = 0; c < cols; c++) {
            float v = rintf(cg_weight_at(w, r * cols + c) * inv);
            q[r * cols + c] = (int8_t)fmaxf(-127.0f, fminf(127.0f, isfinite(v) ? v : 0.0f));
        }
    }
    if (bad) return CG_E_VALUE;
    *out = (cg_weight){
        .data = q, .dtype = CG_DTYPE_Q8, .rows = w->rows, .cols = w->cols, .scale = scale};
    return CG_OK;
}
