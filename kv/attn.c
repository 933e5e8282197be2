/* Segment-aware attention (DESIGN §5): per query block and KV head, scores only against the
 * visible key ranges [0, prefix) and [own_start, i], in key tiles with an online softmax, with
 * CBLAS for the products. */
#include "kv/attn.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* Stacked query rows per work item (query slots x the query heads of one KV head). With
 * OpenBLAS at one thread per call (cg_model_open sets it for the whole process) a product may
 * be as large as it likes: 128 rows x KEY_TILE keys keeps the scores tile (128 KiB) and the K
 * and V tiles in L2 and amortises OpenBLAS's packing of K over many rows. */
#define BLOCK_STACKED_ROWS 128
/* Keys per tile on the matrix-matrix path. */
#define KEY_TILE 256
/* OpenBLAS (pthreads build) hands a call to its own thread pool once sgemm's m*n*k exceeds
 * 65536*4 or sgemv's m*n exceeds 2304*4. Where the process left it at more than one thread
 * (tests, tools), both OpenMP threads would ask that pool for help at once: a strict 8.5k
 * prompt ran 25x slower. Then blocks of BLOCK_ROWS_BLAS_THREADED rows and tiles under those
 * sizes keep every product on its calling thread (same results, a few % slower). */
#define BLAS_GEMM_SINGLE_MNK ((size_t)65536 * 4)
#define BLAS_GEMV_SINGLE_MN ((size_t)2304 * 4)
#define BLOCK_ROWS_BLAS_THREADED 64
/* Floats of the per-thread scores tile. */
#define SCORES_FLOATS ((size_t)BLOCK_STACKED_ROWS * KEY_TILE)
/* Items with at most this many stacked rows (decode: one slot x the group) take the few-row
 * path (dots_fn/axpy_fn below): sgemm with a handful of rows spends its time packing K. On an
 * AVX-512 machine sgemm was as fast at 8 rows; on an AVX2 Zen 3 a decode step of 7 query heads
 * per KV head (Qwen2.5-0.5B) took 1.6x as long through sgemm as here (bench_attn). Without
 * the vector kernels the few-row path is one sgemv per row, and stays at 4 rows. */
#define FEW_ROWS 8
#define FEW_ROWS_GEMV 4
/* Keys per tile on the few-row path: nothing to amortise per tile, and 2048 keys of K or V
 * (256 KiB at head_dim 32) stay in L2 for the group's other rows. */
#define FEW_TILE 2048
/* Below this many multiply-adds in the whole call, one thread: waking the second thread
 * costs more than it gains. */
#define PAR_MIN_MACS ((double)(1 << 20))
/* With fewer items than this per thread, each block's keys are split into parts that are
 * merged afterwards (decode with few KV heads; a short question against a long context). */
#define MIN_ITEMS_PER_THREAD 2
/* A part keeps at least this many keys. */
#define MIN_PART_KEYS 512

size_t cg_attn_plan(const cg_role *roles, const uint32_t *lens, size_t n_segs, cg_mode mode,
                    cg_attn_span *spans_out)
{
    size_t n = 0;
    uint32_t slot = 0;
    uint32_t sys_len = 0; /* length of the system segment when it is the first segment */
    for (size_t i = 0; i < n_segs; i++) {
        uint32_t len = lens[i];
        if (len == 0) continue;
        cg_attn_span sp = {.q_start = slot, .q_len = len, .own_start = 0, .prefix = 0};
        if (roles[i] == CG_ROLE_CHUNK) {
            sp.own_start = slot;
            /* sys mode: a chunk also sees the system segment, which sits at slot 0. */
            if (mode == CG_MODE_SYS) sp.prefix = sys_len;
        } else if (roles[i] == CG_ROLE_SYSTEM) {
            if (slot == 0) sys_len = len;
        }
        spans_out[n++] = sp;
        slot += len;
    }
    return n;
}

void cg_attn_mask_dense(const cg_attn_span *spans, size_t n_spans, size_t n_slots, uint8_t *mask)
{
    memset(mask, 0, n_slots * n_slots);
    for (size_t s = 0; s < n_spans; s++) {
        const cg_attn_span *sp = &spans[s];
        for (uint32_t i = sp->q_start; i < sp->q_start + sp->q_len && i < n_slots; i++) {
            uint8_t *row = mask + (size_t)i * n_slots;
            for (uint32_t j = 0; j < sp->prefix && j < n_slots; j++)
                row[j] = 1;
            for (uint32_t j = sp->own_start; j <= i; j++)
                row[j] = 1;
        }
    }
}

/* Highest instruction set the run-time dispatch below may pick: 0 scalar, 1 SSE2, 2 AVX2+FMA,
 * 3 AVX-512F. The tests build the lower levels too, so each path is checked on a machine that
 * has the higher ones. */
#ifndef CG_ATTN_MAX_ISA
#define CG_ATTN_MAX_ISA 3
#endif

/* The run-time cap under it (cg_attn_set_max_isa). */
static _Atomic int max_isa = 3;

void cg_attn_set_max_isa(int level)
{
    atomic_store_explicit(&max_isa, level, memory_order_relaxed);
}

/* ---- softmax vector loops ----
 * The exponentials are most of the work besides the products (one per visible score, against
 * 4*head_dim FLOPs in the products; libm's scalar expf was half the kernel's time), so they
 * run in the widest vectors the CPU has: AVX-512 or AVX2+FMA picked at run time, SSE2 (in
 * the x86-64 baseline) otherwise, a scalar loop elsewhere.
 *
 * e^x for x <= 0: x = k ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product),
 * Cephes' degree-7 polynomial for e^r, times 2^k. Inputs below -87 give e^-87 (~1.6e-38):
 * against a row sum >= 1 (the max's own term) that is below float resolution. Max relative
 * error ~2 ulp. */
#define EXP_LO -87.0f
#define EXP_LOG2E 1.44269504089f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

static inline float exp_neg(float x)
{
    x = x > EXP_LO ? x : EXP_LO;
    float k = (x * EXP_LOG2E + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - k * EXP_LN2_HI - k * EXP_LN2_LO;
    float p = EXP_P0;
    p = p * r + EXP_P1, p = p * r + EXP_P2, p = p * r + EXP_P3, p = p * r + EXP_P4,
    p = p * r + EXP_P5;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

static float max_scalar(const float *s, size_t n)
{
    float m = -INFINITY;
    for (size_t j = 0; j < n; j++)
        m = s[j] > m ? s[j] : m;
    return m;
}

static float exp_sum_scalar(float *s, size_t n, float m)
{
    float sum = 0.0f;
    for (size_t j = 0; j < n; j++) {
        s[j] = exp_neg(s[j] - m);
        sum += s[j];
    }
    return sum;
}

/* Products of the few-row path (decode): a matrix-vector product per row would read K and V
 * once per query head and, in OpenBLAS's sgemv, spends most of its time on the per-key
 * reductions of a short (head_dim) dot product. */
typedef void (*dots_fn)(const float *q, uint32_t m, const float *k, uint32_t n, int d, float scale,
                        float *s, size_t lds);
typedef void (*axpy_fn)(const float *p, size_t ldp, uint32_t m, const float *v, uint32_t n, int d,
                        float *o);

typedef struct vec_ops {
    float (*max)(const float *s, size_t n); /* max of s[0, n), -inf for n = 0 */
    float (*exp_sum)(float *s, size_t n,
                     float m); /* s[j] = e^(s[j] - m), m >= s[j]; returns the sum */
    dots_fn dots; /* s[i*lds + j] = scale * q_i . k_j, i < m, j < n (rows of d floats) */
    axpy_fn axpy; /* o_i += sum_j p[i*ldp + j] v_j, i < m */
} vec_ops;

static void dots_blas(const float *q, uint32_t m, const float *k, uint32_t n, int d, float scale,
                      float *s, size_t lds)
{
    for (uint32_t i = 0; i < m; i++)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, d, scale, k, d, q + (size_t)i * (size_t)d,
                    1, 0.0f, s + i * lds, 1);
}

static void axpy_blas(const float *p, size_t ldp, uint32_t m, const float *v, uint32_t n, int d,
                      float *o)
{
    for (uint32_t i = 0; i < m; i++)
        cblas_sgemv(CblasRowMajor, CblasTrans, (int)n, d, 1.0f, v, d, p + i * ldp, 1, 1.0f,
                    o + (size_t)i * (size_t)d, 1);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

static float max_sse(const float *s, size_t n)
{
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        m0 = _mm_max_ps(m0, _mm_loadu_ps(s + j));
        m1 = _mm_max_ps(m1, _mm_loadu_ps(s + j + 4));
    }
    float t[4];
    _mm_storeu_ps(t, _mm_max_ps(m0, m1));
    float m = CG_MAX(CG_MAX(t[0], t[1]), CG_MAX(t[2], t[3]));
    return CG_MAX(m, max_scalar(s + j, n - j));
}

static float exp_sum_sse(float *s, size_t n, float m)
{
    const __m128 lo = _mm_set1_ps(EXP_LO), magic = _mm_set1_ps(12582912.0f), vm = _mm_set1_ps(m);
    __m128 acc = _mm_setzero_ps();
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        __m128 x = _mm_max_ps(_mm_sub_ps(_mm_loadu_ps(s + j), vm), lo);
        __m128 k = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(EXP_LOG2E)), magic), magic);
        __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(k, _mm_set1_ps(EXP_LN2_HI))),
                              _mm_mul_ps(k, _mm_set1_ps(EXP_LN2_LO)));
        __m128 p = _mm_set1_ps(EXP_P0);
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(EXP_P1));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(EXP_P2));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(EXP_P3));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(EXP_P4));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(EXP_P5));
        p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(p, r), r), r), _mm_set1_ps(1.0f));
        __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(k), _mm_set1_epi32(127)), 23);
        __m128 y = _mm_mul_ps(p, _mm_castsi128_ps(e));
        _mm_storeu_ps(s + j, y);
        acc = _mm_add_ps(acc, y);
    }
    float t[4];
    _mm_storeu_ps(t, acc);
    return (t[0] + t[1]) + (t[2] + t[3]) + exp_sum_scalar(s + j, n - j, m);
}

__attribute__((target("avx2,fma"))) static float max_avx2(const float *s, size_t n)
{
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(s + j));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(s + j + 8));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_max_ps(m0, m1));
    float m = max_scalar(t, 8);
    return CG_MAX(m, max_scalar(s + j, n - j));
}

/* p = e^r, r = x - k ln2, with FMA in vectors of type VEC whose intrinsics start with V
 * (_mm256, _mm512): the AVX2 and AVX-512 kernels evaluate the same terms in the same order. */
#define EXP_POLY_FMA(V, VEC, x, k, p)                                                              \
    do {                                                                                           \
        VEC r_ = V##_fnmadd_ps(k, V##_set1_ps(EXP_LN2_HI), x);                                     \
        r_ = V##_fnmadd_ps(k, V##_set1_ps(EXP_LN2_LO), r_);                                        \
        p = V##_set1_ps(EXP_P0);                                                                   \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(EXP_P1));                                              \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(EXP_P2));                                              \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(EXP_P3));                                              \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(EXP_P4));                                              \
        p = V##_fmadd_ps(p, r_, V##_set1_ps(EXP_P5));                                              \
        p = V##_fmadd_ps(p, V##_mul_ps(r_, r_), V##_add_ps(r_, V##_set1_ps(1.0f)));                \
    } while (0)

__attribute__((target("avx2,fma"))) static float exp_sum_avx2(float *s, size_t n, float m)
{
    const __m256 lo = _mm256_set1_ps(EXP_LO), vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm), lo);
        __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 p;
        EXP_POLY_FMA(_mm256, __m256, x, k, p);
        __m256i e =
            _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
        _mm256_storeu_ps(s + j, y);
        acc = _mm256_add_ps(acc, y);
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    float sum = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    return sum + exp_sum_scalar(s + j, n - j, m);
}

/* Sum of one vector's lanes. */
__attribute__((target("avx2,fma"))) static inline float hsum_avx2(__m256 a)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* dots_fn for d % 8 == 0: eight keys at a time, each row's eight dot products reduced
 * together (lane t of the result = sum of a[t]), the keys staying in L1 across the rows. */
__attribute__((target("avx2,fma"))) static void dots_avx2(const float *q, uint32_t m,
                                                          const float *k, uint32_t n, int d,
                                                          float scale, float *s, size_t lds)
{
    const __m256 vs = _mm256_set1_ps(scale);
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const float *kj = k + (size_t)j * (size_t)d;
        for (uint32_t i = 0; i < m; i++) {
            const float *qi = q + (size_t)i * (size_t)d;
            __m256 a[8];
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++)
                a[t] = _mm256_setzero_ps();
            for (int e = 0; e < d; e += 8) {
                __m256 qv = _mm256_loadu_ps(qi + e);
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++)
                    a[t] = _mm256_fmadd_ps(
                        qv, _mm256_loadu_ps(kj + (size_t)t * (size_t)d + (size_t)e), a[t]);
            }
            __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                       _mm256_permute2f128_ps(h0, h1, 0x31));
            _mm256_storeu_ps(s + i * lds + j, _mm256_mul_ps(sum, vs));
        }
    }
    for (; j < n; j++) {
        const float *kj = k + (size_t)j * (size_t)d;
        for (uint32_t i = 0; i < m; i++) {
            __m256 a = _mm256_setzero_ps();
            for (int e = 0; e < d; e += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)i * (size_t)d + (size_t)e),
                                    _mm256_loadu_ps(kj + e), a);
            s[i * lds + j] = hsum_avx2(a) * scale;
        }
    }
}

/* axpy_fn for d % 8 == 0: 32 output floats of a row in registers across the keys. */
__attribute__((target("avx2,fma"))) static void
axpy_avx2(const float *p, size_t ldp, uint32_t m, const float *v, uint32_t n, int d, float *o)
{
    for (uint32_t i = 0; i < m; i++) {
        const float *pi = p + i * ldp;
        float *oi = o + (size_t)i * (size_t)d;
        int e = 0;
        for (; e + 32 <= d; e += 32) {
            __m256 a0 = _mm256_loadu_ps(oi + e), a1 = _mm256_loadu_ps(oi + e + 8);
            __m256 a2 = _mm256_loadu_ps(oi + e + 16), a3 = _mm256_loadu_ps(oi + e + 24);
            const float *vj = v + e;
            for (uint32_t j = 0; j < n; j++, vj += d) {
                __m256 pj = _mm256_broadcast_ss(pi + j);
                a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
                a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
                a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
                a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
            }
            _mm256_storeu_ps(oi + e, a0);
            _mm256_storeu_ps(oi + e + 8, a1);
            _mm256_storeu_ps(oi + e + 16, a2);
            _mm256_storeu_ps(oi + e + 24, a3);
        }
        for (; e < d; e += 8) {
            __m256 a = _mm256_loadu_ps(oi + e);
            const float *vj = v + e;
            for (uint32_t j = 0; j < n; j++, vj += d)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(pi + j), _mm256_loadu_ps(vj), a);
            _mm256_storeu_ps(oi + e, a);
        }
    }
}

/* AVX-512: the tail runs masked, so no scalar loop. */
__attribute__((target("avx512f"))) static float max_avx512(const float *s, size_t n)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m0 = ninf;
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 mk = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(ninf, mk, s + j));
    }
    return _mm512_reduce_max_ps(m0);
}

__attribute__((target("avx512f"))) static float exp_sum_avx512(float *s, size_t n, float m)
{
    const __m512 lo = _mm512_set1_ps(EXP_LO), vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 mk = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 x = _mm512_max_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vm), lo);
        __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 p;
        EXP_POLY_FMA(_mm512, __m512, x, k, p);
        __m512 y = _mm512_scalef_ps(p, k); /* p * 2^k */
        _mm512_mask_storeu_ps(s + j, mk, y);
        acc = _mm512_mask_add_ps(acc, mk, acc, y);
    }
    return _mm512_reduce_add_ps(acc);
}

static vec_ops pick_vec_ops(int d)
{
    const int cap = CG_MIN(CG_ATTN_MAX_ISA, atomic_load_explicit(&max_isa, memory_order_relaxed));
    vec_ops ops = {max_scalar, exp_sum_scalar, dots_blas, axpy_blas};
    if (cap >= 1) ops.max = max_sse, ops.exp_sum = exp_sum_sse;
    if (cap >= 2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        ops.max = max_avx2, ops.exp_sum = exp_sum_avx2;
        if (d % 8 == 0) ops.dots = dots_avx2, ops.axpy = axpy_avx2;
    }
    if (cap >= 3 && __builtin_cpu_supports("avx512f"))
        ops.max = max_avx512, ops.exp_sum = exp_sum_avx512;
    return ops;
}
#else
static vec_ops pick_vec_ops(int d)
{
    (void)d;
    return (vec_ops){max_scalar, exp_sum_scalar, dots_blas, axpy_blas};
}
#endif

/* ---- the kernel ----
 * Work item: one query block of a span, one KV head, and (when there are too few items to
 * keep every thread busy) one part of the block's visible keys. The query heads that share
 * the KV head are stacked as rows of one product, slot-major (row r*group + j is slot q0+r,
 * query head kvh*group + j), so K and V are read once for the whole group. Keys are walked in
 * tiles with an online softmax (running max and sum per row, output rescaled when the max
 * grows), so the scratch stays a few hundred KiB per thread whatever the key range. */

typedef struct work {
    uint32_t span;
    uint32_t q0, slots; /* query slots [q0, q0+slots) */
    size_t row_index;   /* row of q/out for slot q0 */
    int kvh;
    uint32_t c0, c1; /* visible keys [c0, c1) of the block, counted prefix first */
    uint32_t parts;  /* >1: this is one of `parts` items over the same block */
    size_t partial;  /* parts > 1: index of this item's partial result */
    double cost;
} work;

typedef struct ctx {
    const cg_attn_kv *kv;
    int n_heads, group, d;
    size_t ld;         /* floats between q/out rows */
    uint32_t max_rows; /* stacked rows of the largest block */
    const cg_attn_span *spans;
    const float *q;
    float *out;
    float *partials; /* per split item: o [rows][d], then max [rows], sum [rows] */
    size_t partial_floats;
    vec_ops ops;
    int blas_threaded; /* OpenBLAS may thread a large call: keep products under its limits */
} ctx;

/* Per-thread scratch, bounded by the constants above. */
typedef struct scratch {
    float *qp; /* stacked queries [rows][d] */
    float *o;  /* unnormalised output [rows][d] */
    float *s;  /* scores / probabilities [rows][tile] */
    float *mx, *sum;
} scratch;

/* Online softmax of one row's tile: s[0, valid) are scores, the rest masked. Leaves the
 * probabilities (relative to the running max) in s[0, w) with zeros past valid, and rescales
 * the row's output and sum when the max grows. */
static void softmax_row(const vec_ops *ops, float *s, size_t valid, size_t w, float *mx, float *sum,
                        float *o, int d)
{
    if (valid) {
        float m = ops->max(s, valid);
        if (m > *mx) {
            if (*mx != -INFINITY) {
                float a = expf(*mx - m);
                *sum *= a;
                for (int e = 0; e < d; e++)
                    o[e] *= a;
            }
            *mx = m;
        }
        *sum += ops->exp_sum(s, valid, *mx);
    }
    if (valid < w) memset(s + valid, 0, (w - valid) * sizeof(float));
}

/* ---- one work item ---- */

static void run_item(const ctx *c, const work *w, scratch *sc)
{
    const cg_attn_span *sp = &c->spans[w->span];
    const int d = c->d, group = c->group;
    const size_t gd = (size_t)group * (size_t)d; /* floats of one slot's stacked rows */
    const uint32_t rows = w->slots * (uint32_t)group;
    const float *k = c->kv->k + (size_t)w->kvh * c->kv->head_stride;
    const float *v = c->kv->v + (size_t)w->kvh * c->kv->head_stride;
    const float scale = 1.0f / sqrtf((float)d);
    const int gemv = c->ops.dots == dots_blas; /* no vector kernels: sgemv per row */
    const int few = rows <= (gemv ? FEW_ROWS_GEMV : FEW_ROWS);
    size_t tile = few ? CG_MIN((size_t)FEW_TILE, SCORES_FLOATS / rows) : KEY_TILE;
    if (c->blas_threaded && few && gemv)
        tile = CG_MIN(tile, CG_MAX((size_t)16, BLAS_GEMV_SINGLE_MN / (size_t)d));
    if (c->blas_threaded && !few)
        tile = CG_MIN(tile, CG_MAX((size_t)16, BLAS_GEMM_SINGLE_MNK / ((size_t)rows * (size_t)d)));

    /* Stack the group's query heads: each slot's heads are adjacent in q. */
    for (uint32_t r = 0; r < w->slots; r++)
        memcpy(sc->qp + r * gd, c->q + (w->row_index + r) * c->ld + (size_t)w->kvh * gd,
               gd * sizeof(float));
    memset(sc->o, 0, (size_t)rows * (size_t)d * sizeof(float));
    for (uint32_t i = 0; i < rows; i++) {
        sc->mx[i] = -INFINITY;
        sc->sum[i] = 0.0f;
    }

    /* Keys [c0, c1) in the block's visible order: prefix [0, prefix), then own
     * [own_start, q0+slots); a tile never straddles the two. */
    const uint32_t n_pre = sp->prefix;
    const uint32_t n_vis = n_pre + (w->q0 + w->slots - sp->own_start);
    assert(w->c1 <= n_vis);
    for (uint32_t cc = w->c0; cc < w->c1;) {
        uint32_t seg_end = cc < n_pre ? n_pre : n_vis;
        uint32_t wd = (uint32_t)CG_MIN(tile, (size_t)(CG_MIN(w->c1, seg_end) - cc));
        uint32_t k0 = cc < n_pre ? cc : sp->own_start + (cc - n_pre); /* slot of the first key */
        int own = cc >= n_pre;
        cc += wd;
        /* Slots before the tile's first key see none of it (own range only): the rows of those
         * slots are skipped; the rows that remain form a suffix. */
        uint32_t r_lo = own && k0 > w->q0 ? (k0 - w->q0) * (uint32_t)group : 0;
        uint32_t m = rows - r_lo;
        const float *kt = k + (size_t)k0 * (size_t)d, *vt = v + (size_t)k0 * (size_t)d;
        float *o = sc->o + (size_t)r_lo * (size_t)d;
        float *s = sc->s + (size_t)r_lo * tile;

        if (few) {
            c->ops.dots(sc->qp + (size_t)r_lo * (size_t)d, m, kt, wd, d, scale, s, tile);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)wd, d, scale,
                        sc->qp + (size_t)r_lo * (size_t)d, d, kt, d, 0.0f, s, (int)tile);
        }
        for (uint32_t i = 0; i < m; i++) {
            uint32_t row = r_lo + i;
            size_t valid = wd;
            if (own) { /* causal cut: slot q0 + row/group sees keys up to itself */
                int64_t lim = (int64_t)w->q0 + row / (uint32_t)group - k0 + 1;
                valid = (size_t)CG_MAX((int64_t)0, CG_MIN(lim, (int64_t)wd));
            }
            softmax_row(&c->ops, s + (size_t)i * tile, valid, wd, &sc->mx[row], &sc->sum[row],
                        o + (size_t)i * (size_t)d, d);
        }
        if (few) {
            c->ops.axpy(s, tile, m, vt, wd, d, o);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, d, (int)wd, 1.0f, s,
                        (int)tile, vt, d, 1.0f, o, d);
        }
    }

    if (w->parts > 1) { /* partial result: merged by merge_parts() */
        float *p = c->partials + w->partial * c->partial_floats;
        memcpy(p, sc->o, (size_t)rows * (size_t)d * sizeof(float));
        memcpy(p + (size_t)rows * (size_t)d, sc->mx, rows * sizeof(float));
        memcpy(p + (size_t)rows * (size_t)(d + 1), sc->sum, rows * sizeof(float));
        return;
    }
    for (uint32_t r = 0; r < w->slots; r++) {
        float *dst = c->out + (w->row_index + r) * c->ld + (size_t)w->kvh * gd;
        for (int j = 0; j < group; j++) {
            uint32_t row = r * (uint32_t)group + (uint32_t)j;
            float inv = 1.0f / sc->sum[row]; /* >= 1: the max's own term */
            const float *o = sc->o + (size_t)row * (size_t)d;
            for (int e = 0; e < d; e++)
                dst[(size_t)j * (size_t)d + (size_t)e] = o[e] * inv;
        }
    }
}

/* Combines the partial results of a block split over `parts` consecutive items. */
static void merge_parts(const ctx *c, const work *w)
{
    const int d = c->d, group = c->group;
    const uint32_t rows = w->slots * (uint32_t)group;
    const float *base = c->partials + w->partial * c->partial_floats;
    for (uint32_t row = 0; row < rows; row++) {
        float m = -INFINITY;
        for (uint32_t p = 0; p < w->parts; p++)
            m = CG_MAX(m, base[p * c->partial_floats + (size_t)rows * (size_t)d + row]);
        float *dst = c->out + (w->row_index + row / (uint32_t)group) * c->ld +
                     ((size_t)w->kvh * (size_t)group + row % (uint32_t)group) * (size_t)d;
        float total = 0.0f;
        for (int e = 0; e < d; e++)
            dst[e] = 0.0f;
        for (uint32_t p = 0; p < w->parts; p++) {
            const float *pp = base + p * c->partial_floats;
            float a =
                expf(pp[(size_t)rows * (size_t)d + row] - m); /* 0 for a part that saw no key */
            total += a * pp[(size_t)rows * (size_t)(d + 1) + row];
            for (int e = 0; e < d; e++)
                dst[e] += a * pp[(size_t)row * (size_t)d + (size_t)e];
        }
        float inv = 1.0f / total;
        for (int e = 0; e < d; e++)
            dst[e] *= inv;
    }
}

static int by_cost_desc(const void *a, const void *b)
{
    double x = ((const work *)a)->cost, y = ((const work *)b)->cost;
    return (x < y) - (x > y);
}

void cg_attn_forward(const cg_attn_kv *kv, int n_heads, const cg_attn_span *spans, size_t n_spans,
                     const float *q, float *out)
{
    assert(kv->n_kv_heads > 0 && n_heads % kv->n_kv_heads == 0);
    const int group = n_heads / kv->n_kv_heads;
    const int blas_threaded = openblas_get_num_threads() > 1;
    const int block_rows = blas_threaded ? BLOCK_ROWS_BLAS_THREADED : BLOCK_STACKED_ROWS;
    const uint32_t block = (uint32_t)CG_MAX(1, block_rows / group); /* slots per item */
    ctx c = {.kv = kv,
             .n_heads = n_heads,
             .group = group,
             .d = kv->head_dim,
             .ld = (size_t)n_heads * (size_t)kv->head_dim,
             .spans = spans,
             .q = q,
             .out = out,
             .ops = pick_vec_ops(kv->head_dim),
             .blas_threaded = blas_threaded};

    /* One item per (span, query block, KV head); total work in multiply-adds. */
    size_t n_blocks = 0;
    double total = 0;
    for (size_t si = 0; si < n_spans; si++) {
        const cg_attn_span *sp = &spans[si];
        assert(sp->prefix <= sp->own_start && sp->own_start <= sp->q_start);
        n_blocks += (sp->q_len + block - 1) / block;
        for (uint32_t q0 = sp->q_start; q0 < sp->q_start + sp->q_len; q0 += block) {
            uint32_t slots = CG_MIN(block, sp->q_start + sp->q_len - q0);
            total += (double)slots * (sp->prefix + (q0 - sp->own_start) + (slots + 1) / 2.0);
        }
    }
    if (!n_blocks) return;
    total *= (double)n_heads * (double)kv->head_dim;
    const int threads = total >= PAR_MIN_MACS ? omp_get_max_threads() : 1;
    const size_t n_base = n_blocks * (size_t)kv->n_kv_heads;
    /* Too few items to occupy every thread evenly: split each block's keys into parts. */
    uint32_t parts = 1;
    if (threads > 1 && n_base < (size_t)threads * MIN_ITEMS_PER_THREAD)
        parts = (uint32_t)(((size_t)threads * MIN_ITEMS_PER_THREAD + n_base - 1) / n_base);

    work *items = cg_malloc(n_base * parts * sizeof *items);
    size_t n_items = 0, row_index = 0, n_partial = 0;
    for (size_t si = 0; si < n_spans; si++) {
        const cg_attn_span *sp = &spans[si];
        for (uint32_t q0 = sp->q_start; q0 < sp->q_start + sp->q_len; q0 += block) {
            uint32_t slots = CG_MIN(block, sp->q_start + sp->q_len - q0);
            c.max_rows = CG_MAX(c.max_rows, slots * (uint32_t)group);
            uint32_t n_vis = sp->prefix + (q0 + slots - sp->own_start);
            /* a part must keep enough keys to be worth its merge */
            uint32_t np = CG_MAX(1u, CG_MIN(parts, n_vis / MIN_PART_KEYS));
            for (int h = 0; h < kv->n_kv_heads; h++) {
                for (uint32_t p = 0; p < np; p++) {
                    work w = {.span = (uint32_t)si,
                              .q0 = q0,
                              .slots = slots,
                              .row_index = row_index + (q0 - sp->q_start),
                              .kvh = h,
                              .c0 = (uint32_t)((uint64_t)n_vis * p / np),
                              .c1 = (uint32_t)((uint64_t)n_vis * (p + 1) / np),
                              .parts = np,
                              .partial = np > 1 ? n_partial++ : 0};
                    w.cost = (double)slots * (w.c1 - w.c0);
                    items[n_items++] = w;
                }
            }
        }
        row_index += sp->q_len;
    }
    if (n_partial) {
        c.partial_floats = (size_t)c.max_rows * ((size_t)c.d + 2);
        c.partials = cg_malloc(n_partial * c.partial_floats * sizeof(float));
    }
    /* Largest first, so the dynamic schedule ends on small items (causal blocks grow). */
    work *order = cg_malloc(n_items * sizeof *order);
    memcpy(order, items, n_items * sizeof *order);
    if (threads > 1) qsort(order, n_items, sizeof *order, by_cost_desc);

#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t rows = c.max_rows, d = (size_t)c.d;
        scratch sc = {.qp = cg_malloc(rows * d * sizeof(float)),
                      .o = cg_malloc(rows * d * sizeof(float)),
                      .s = cg_malloc(CG_MAX(SCORES_FLOATS, rows * KEY_TILE) * sizeof(float)),
                      .mx = cg_malloc(rows * sizeof(float)),
                      .sum = cg_malloc(rows * sizeof(float))};
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < n_items; i++)
            run_item(&c, &order[i], &sc);
        cg_free(&sc.qp);
        cg_free(&sc.o);
        cg_free(&sc.s);
        cg_free(&sc.mx);
        cg_free(&sc.sum);
    }
    /* items[] is in creation order: the parts of one block are consecutive */
    for (size_t i = 0; i < n_items; i += items[i].parts)
        if (items[i].parts > 1) merge_parts(&c, &items[i]);
    cg_free(&order);
    cg_free(&items);
    cg_free(&c.partials);
}

/* ---- the attention a set of queries pays each key ---- */

#define MASS_ROWS 16

void cg_attn_key_mass(const cg_attn_kv *kv, int n_heads, const float *q, size_t ld, size_t n_q,
                      size_t n_keys, double *mass)
{
    if (!n_q || !n_keys) return;
    const int d = kv->head_dim, group = n_heads / kv->n_kv_heads;
    const size_t gd = (size_t)group * (size_t)d;
    const float scale = 1.0f / sqrtf((float)d);
    const size_t rows = n_q * (size_t)group;
    float *qp = cg_malloc(CG_MIN(rows, (size_t)MASS_ROWS) * (size_t)d * sizeof(float));
    float *s = cg_malloc((size_t)MASS_ROWS * n_keys * sizeof(float));
    for (int h = 0; h < kv->n_kv_heads; h++) {
        const float *k = kv->k + (size_t)h * kv->head_stride;
        for (size_t r0 = 0; r0 < rows; r0 += MASS_ROWS) {
            const size_t m = CG_MIN((size_t)MASS_ROWS, rows - r0);
            /* row r of the stack: query row r / group, head h * group + r % group */
            for (size_t i = 0; i < m; i++) {
                size_t r = r0 + i;
                memcpy(qp + i * (size_t)d,
                       q + (r / (size_t)group) * ld + (size_t)h * gd +
                           (r % (size_t)group) * (size_t)d,
                       (size_t)d * sizeof(float));
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n_keys, d, scale, qp,
                        d, k, d, 0.0f, s, (int)n_keys);
            for (size_t i = 0; i < m; i++) {
                float *row = s + i * n_keys, mx = -INFINITY;
                for (size_t j = 0; j < n_keys; j++)
                    mx = fmaxf(mx, row[j]);
                double sum = 0;
                for (size_t j = 0; j < n_keys; j++)
                    sum += row[j] = expf(row[j] - mx);
                const double inv = 1.0 / sum;
                for (size_t j = 0; j < n_keys; j++)
                    mass[j] += row[j] * inv;
            }
        }
    }
    free(qp);
    free(s);
}
