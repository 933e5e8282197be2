/* Tests for the weight products (worker/model/matmul.c): every ISA variant this CPU has, for
 * f32, f16 and bf16 weights, against an f64 reference and against the portable variant;
 * exact results on integer data; the decode kernel's batch invariance (bits independent of
 * the batch size, the row's position and the thread count); unaligned pointers; every finite
 * f16 and bf16 value widened exactly. */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/harness.h"
#include "base/base.h"
#include "worker/model/matmul.h"
#include "worker/model/matmul_impl.h"
#include "worker/model/safetensors.h"

/* the three checkpoint dtypes, then the int8 option */
static const cg_dtype dtypes[] = {CG_DTYPE_F32, CG_DTYPE_F16, CG_DTYPE_BF16, CG_DTYPE_Q8};
static const char *const dtype_names[] = {"f32", "f16", "bf16", "q8"};
#define NDT 4

static uint64_t rnd(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return *st >> 33;
}

static double urand(uint64_t *st) /* [-1, 1) */
{
    return (double)rnd(st) / (double)(1ull << 30) - 1.0;
}

/* Reference decoding, written differently from the library's bit tricks. */
static double ref_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

static double ref_bf16(uint16_t h)
{
    int e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp(m, -133) : e == 255 ? INFINITY : ldexp(128 + m, e - 134);
    return h & 0x8000 ? -v : v;
}

/* A weight matrix in one dtype, with the f64 value of every element. The data sits `skew`
 * bytes past malloc's 16-byte alignment (0, or the element size to test unaligned rows). */
typedef struct mat {
    cg_weight w;
    void *raw;
    double *val;
    float *scale; /* Q8 */
} mat;

static uint16_t f16_bits(double v) /* v must be exactly representable */
{
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (ref_f16((uint16_t)h) == fabs(v)) return (uint16_t)(h | (v < 0 ? 0x8000 : 0));
    ck_abort_msg("%g is not an f16 value", v);
    return 0;
}

/* Fills with random values of the dtype (integers in [-4, 4] when `ints`; for Q8, with scale 1,
 * else random q in [-127, 127] and a random scale per row). */
static mat mat_new(cg_dtype dt, int rows, int cols, size_t skew, int ints, uint64_t seed)
{
    mat m;
    size_t n = (size_t)rows * (size_t)cols, es = cg_dtype_size(dt);
    /* no slack after the last element: a read past it is an ASan error */
    m.raw = cg_malloc(n * es + skew);
    char *p = (char *)m.raw + skew;
    m.val = cg_malloc((n + 1) * sizeof(double));
    m.scale = cg_malloc(((size_t)rows + 1) * sizeof(float));
    uint64_t st = seed;
    for (int r = 0; r < rows; r++)
        m.scale[r] = ints ? 1.0f : (float)(0.5 + (double)(rnd(&st) % 1024) / 1024) / 127.0f;
    uint16_t int_f16[9];
    for (int i = 0; i < 9; i++)
        int_f16[i] = f16_bits(i - 4);
    for (size_t i = 0; i < n; i++) {
        if (dt == CG_DTYPE_F32) {
            float f = ints ? (float)((int)(rnd(&st) % 9) - 4) : (float)urand(&st);
            memcpy(p + i * 4, &f, 4);
            m.val[i] = f;
            continue;
        }
        if (dt == CG_DTYPE_Q8) {
            int v = ints ? (int)(rnd(&st) % 9) - 4 : (int)(rnd(&st) % 255) - 127;
            p[i] = (char)(int8_t)v;
            m.val[i] = v * (double)m.scale[i / (size_t)cols]; /* exact in f64 */
            continue;
        }
        uint16_t h;
        if (ints) {
            /* small integers are exact in both 16-bit dtypes */
            int v = (int)(rnd(&st) % 9) - 4;
            float f = (float)v;
            uint32_t u;
            memcpy(&u, &f, 4);
            h = dt == CG_DTYPE_BF16 ? (uint16_t)(u >> 16) : int_f16[v + 4];
        } else if (dt == CG_DTYPE_BF16) {
            /* |w| in [2^-6, 2^2): sign, exponent 121..128, random mantissa */
            h = (uint16_t)((rnd(&st) & 1) << 15 | (121 + rnd(&st) % 8) << 7 | (rnd(&st) & 127));
        } else {
            /* f16: mostly normal values in [2^-6, 2^2), one in 16 subnormal */
            uint32_t e = rnd(&st) % 16 == 0 ? 0 : 9 + rnd(&st) % 8;
            h = (uint16_t)((rnd(&st) & 1) << 15 | e << 10 | (rnd(&st) & 1023));
        }
        memcpy(p + i * 2, &h, 2);
        m.val[i] = dt == CG_DTYPE_F16 ? ref_f16(h) : ref_bf16(h);
    }
    m.w = (cg_weight){.data = p,
                      .dtype = dt,
                      .rows = rows,
                      .cols = cols,
                      .scale = dt == CG_DTYPE_Q8 ? m.scale : NULL};
    return m;
}

static void mat_free(mat *m)
{
    free(m->raw);
    free(m->val);
    free(m->scale);
}

/* x: n rows of `cols` floats, `skew` bytes past malloc's alignment; *raw to free. */
static float *x_new(int n, int cols, size_t skew, int ints, uint64_t seed, void **raw)
{
    size_t len = (size_t)n * (size_t)cols;
    *raw = cg_malloc(len * sizeof(float) + skew);
    float *x = (float *)((char *)*raw + skew);
    uint64_t st = seed;
    for (size_t i = 0; i < len; i++)
        x[i] = ints ? (float)((int)(rnd(&st) % 9) - 4) : (float)urand(&st);
    return x;
}

/* Reference y[i][r] = sum_k x[i][k] * w[r][k] in f64, and the sum of |terms|. */
static void reference(const mat *m, const float *x, int n, double *ref, double *mag)
{
    const int rows = m->w.rows, cols = m->w.cols;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            double s = 0, a = 0;
            for (int k = 0; k < cols; k++) {
                double t = (double)x[(size_t)i * cols + k] * m->val[(size_t)r * cols + k];
                s += t;
                a += fabs(t);
            }
            ref[(size_t)i * rows + r] = s;
            mag[(size_t)i * rows + r] = a;
        }
}

/* Error bound of f32 summation split into `lanes` sequential partial sums combined by a tree:
 * (cols / lanes + log2(lanes) + 1) * 2^-24 * sum |terms|, plus one rounding for Q8's scale,
 * with a little slack. */
static double bound(int cols, int lanes, double mag)
{
    double depth = (cols + lanes - 1) / lanes + log2(lanes) + 3;
    return 1.05 * depth * 0x1p-24 * mag + 1e-30;
}

/* Lanes of the decode kernel's partial sums in each variant; the prefill path is bounded as
 * one sequential sum (lanes 1), which holds for any order OpenBLAS uses. */
static int decode_lanes(cg_matmul_isa isa)
{
    return isa >= CG_MATMUL_ISA_AVX512 ? 16 : isa == CG_MATMUL_ISA_AVX2 ? 8 : 4;
}

static int n_isas;
static cg_matmul_isa isas[CG_MATMUL_ISA_COUNT];
static cg_matmul_scratch *scratch;

static void setup(void)
{
    n_isas = 0;
    for (int i = 0; i < CG_MATMUL_ISA_COUNT; i++)
        if (cg_matmul_isa_supported((cg_matmul_isa)i)) isas[n_isas++] = (cg_matmul_isa)i;
    scratch = cg_matmul_scratch_new();
}

static void teardown(void)
{
    cg_matmul_scratch_free(&scratch);
    ck_assert_ptr_null(scratch);
}

static void use_isa(cg_matmul_isa isa)
{
    ck_assert_int_eq(cg_matmul_set_isa(isa), CG_OK);
    ck_assert_int_eq(cg_matmul_isa_active(), isa);
}

typedef enum { PREFILL, DECODE } path;

static void run(path p, const cg_weight *w, const float *x, int n, float *y)
{
    if (p == PREFILL)
        cg_matmul_prefill(w, x, n, y, scratch);
    else
        cg_matmul_decode(w, x, n, y);
}

/* rows, cols, n; 2100 columns make three column panels in the prefill path */
static const int shapes[][3] = {{1, 1, 1},    {3, 5, 2},      {5, 7, 1},    {4, 8, 3},
                                {7, 16, 5},   {9, 17, 4},     {13, 31, 63}, {16, 33, 64},
                                {33, 100, 1}, {70, 129, 9},   {17, 6, 63},  {130, 300, 8},
                                {64, 896, 2}, {257, 513, 16}, {24, 2100, 7}};

/* Random data: every path, variant and dtype within the bound of its summation order, and each
 * variant's decode within the sum of both bounds of the portable variant's. */
START_TEST(test_against_f64)
{
    for (size_t si = 0; si < CG_ARRAY_LEN(shapes); si++) {
        const int rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
        void *xraw;
        float *x = x_new(n, cols, 0, 0, 100 + si, &xraw);
        double *ref = cg_malloc((size_t)n * rows * sizeof(double));
        double *mag = cg_malloc((size_t)n * rows * sizeof(double));
        float *y = cg_malloc((size_t)n * rows * sizeof(float));
        float *yg = cg_malloc((size_t)n * rows * sizeof(float));
        for (int d = 0; d < NDT; d++) {
            mat m = mat_new(dtypes[d], rows, cols, 0, 0, 7 + si * 3 + d);
            reference(&m, x, n, ref, mag);
            use_isa(CG_MATMUL_ISA_GENERIC);
            cg_matmul_decode(&m.w, x, n, yg);
            for (int v = 0; v < n_isas; v++) {
                use_isa(isas[v]);
                for (int p = 0; p < 2; p++) {
                    memset(y, 0xff, (size_t)n * rows * sizeof(float)); /* NaN: unwritten */
                    run((path)p, &m.w, x, n, y);
                    int lanes = p == PREFILL ? 1 : decode_lanes(isas[v]);
                    for (size_t i = 0; i < (size_t)n * rows; i++) {
                        double e = fabs((double)y[i] - ref[i]);
                        ck_assert_msg(e <= bound(cols, lanes, mag[i]),
                                      "%s %s %s %dx%d n %d [%zu]: %.9g vs %.9g (bound %g)",
                                      p == PREFILL ? "prefill" : "decode",
                                      cg_matmul_isa_name(isas[v]), dtype_names[d], rows, cols, n, i,
                                      y[i], ref[i], bound(cols, lanes, mag[i]));
                        if (p == DECODE)
                            ck_assert(fabs((double)y[i] - yg[i]) <=
                                      bound(cols, lanes, mag[i]) + bound(cols, 4, mag[i]));
                    }
                }
            }
            mat_free(&m);
        }
        free(xraw);
        free(ref);
        free(mag);
        free(y);
        free(yg);
    }
}
END_TEST

/* Integer data: every partial sum is an integer below 2^24, so any summation order gives the
 * exact result; a dropped, repeated or misplaced term cannot hide in a tolerance. */
START_TEST(test_exact_integers)
{
    for (size_t si = 0; si < CG_ARRAY_LEN(shapes); si++) {
        const int rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
        void *xraw;
        float *x = x_new(n, cols, 0, 1, 300 + si, &xraw);
        double *ref = cg_malloc((size_t)n * rows * sizeof(double));
        double *mag = cg_malloc((size_t)n * rows * sizeof(double));
        float *y = cg_malloc((size_t)n * rows * sizeof(float));
        for (int d = 0; d < NDT; d++) {
            mat m = mat_new(dtypes[d], rows, cols, 0, 1, 500 + si * 3 + d);
            reference(&m, x, n, ref, mag);
            for (int v = 0; v < n_isas; v++) {
                use_isa(isas[v]);
                for (int p = 0; p < 2; p++) {
                    memset(y, 0xff, (size_t)n * rows * sizeof(float));
                    run((path)p, &m.w, x, n, y);
                    for (size_t i = 0; i < (size_t)n * rows; i++)
                        ck_assert_msg((double)y[i] == ref[i], "%s %s %s %dx%d n %d [%zu]: %g vs %g",
                                      p == PREFILL ? "prefill" : "decode",
                                      cg_matmul_isa_name(isas[v]), dtype_names[d], rows, cols, n, i,
                                      y[i], ref[i]);
                }
            }
            mat_free(&m);
        }
        free(xraw);
        free(ref);
        free(mag);
        free(y);
    }
}
END_TEST

/* The decode path's batch invariance: a row's bits are the same alone, in any batch size, at
 * any position, and with 1, 2 or 3 threads. */
START_TEST(test_decode_batch_invariant)
{
    /* the last shape is big enough (> 256 KiB of weights) for the kernel to fork threads */
    static const int bshapes[][2] = {{5, 7}, {37, 100}, {70, 129}, {96, 896}, {300, 530}};
    enum { N = 64 };
    uint64_t st = 99;
    for (size_t si = 0; si < CG_ARRAY_LEN(bshapes); si++) {
        const int rows = bshapes[si][0], cols = bshapes[si][1];
        void *xraw;
        float *x = x_new(N, cols, 0, 0, 900 + si, &xraw);
        float *full = cg_malloc((size_t)N * rows * sizeof(float));
        float *xs = cg_malloc((size_t)N * cols * sizeof(float));
        float *ys = cg_malloc((size_t)N * rows * sizeof(float));
        int idx[N];
        for (int d = 0; d < NDT; d++) {
            mat m = mat_new(dtypes[d], rows, cols, 0, 0, 40 + si * 3 + d);
            for (int v = 0; v < n_isas; v++) {
                use_isa(isas[v]);
                cg_matmul_decode(&m.w, x, N, full);
                static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 63, 64};
                for (size_t ni = 0; ni < CG_ARRAY_LEN(ns); ni++) {
                    const int n = ns[ni];
                    for (int rep = 0; rep < (n == 1 ? 4 : 2); rep++) {
                        for (int i = 0; i < n; i++) /* random rows, any order, repeats allowed */
                            idx[i] = (int)(rnd(&st) % N);
                        for (int i = 0; i < n; i++)
                            memcpy(xs + (size_t)i * cols, x + (size_t)idx[i] * cols,
                                   (size_t)cols * sizeof(float));
                        const int threads = 1 + (int)(rnd(&st) % 3);
                        omp_set_num_threads(threads);
                        cg_matmul_decode(&m.w, xs, n, ys);
                        omp_set_num_threads(2);
                        for (int i = 0; i < n; i++)
                            ck_assert_msg(!memcmp(ys + (size_t)i * rows,
                                                  full + (size_t)idx[i] * rows,
                                                  (size_t)rows * sizeof(float)),
                                          "%s %s %dx%d: row %d of a batch of %d (%d threads) "
                                          "differs from row %d of 64",
                                          cg_matmul_isa_name(isas[v]), dtype_names[d], rows, cols,
                                          i, n, threads, idx[i]);
                    }
                }
            }
            mat_free(&m);
        }
        free(xraw);
        free(full);
        free(xs);
        free(ys);
    }
}
END_TEST

/* Weights, x and y at addresses that are only element-aligned give the same bits as aligned
 * ones, in both paths. */
START_TEST(test_unaligned)
{
    static const int ushapes[][3] = {{9, 17, 5}, {70, 129, 9}, {130, 300, 64}};
    for (size_t si = 0; si < CG_ARRAY_LEN(ushapes); si++) {
        const int rows = ushapes[si][0], cols = ushapes[si][1], n = ushapes[si][2];
        void *xraw, *xuraw;
        float *x = x_new(n, cols, 0, 0, 77 + si, &xraw);
        float *xu = x_new(n, cols, 4, 0, 77 + si, &xuraw);
        float *y = cg_malloc((size_t)n * rows * sizeof(float));
        char *yuraw = cg_malloc((size_t)n * rows * sizeof(float) + 64);
        float *yu = (float *)(((uintptr_t)yuraw + 63) & ~(uintptr_t)63) + 1;
        for (int d = 0; d < NDT; d++) {
            mat a = mat_new(dtypes[d], rows, cols, 0, 0, 60 + d);
            mat u = mat_new(dtypes[d], rows, cols, cg_dtype_size(dtypes[d]), 0, 60 + d);
            ck_assert((uintptr_t)u.w.data % 4 != 0 || dtypes[d] == CG_DTYPE_F32);
            for (int v = 0; v < n_isas; v++) {
                use_isa(isas[v]);
                for (int p = 0; p < 2; p++) {
                    run((path)p, &a.w, x, n, y);
                    run((path)p, &u.w, xu, n, yu);
                    ck_assert_msg(!memcmp(y, yu, (size_t)n * rows * sizeof(float)),
                                  "%s %s %s unaligned differs", p == PREFILL ? "prefill" : "decode",
                                  cg_matmul_isa_name(isas[v]), dtype_names[d]);
                }
            }
            mat_free(&a);
            mat_free(&u);
        }
        free(xraw);
        free(xuraw);
        free(y);
        free(yuraw);
    }
}
END_TEST

/* Every finite f16 and bf16 value is widened exactly by every variant and both paths:
 * W holds all of them and x is the identity, so y[j][r] = W[r][j]. */
START_TEST(test_widen_all_values)
{
    enum { COLS = 32 }; /* 2048 rows of 32: all 65536 patterns */
    void *xraw;
    float *x = x_new(COLS, COLS, 0, 0, 1, &xraw);
    memset(x, 0, (size_t)COLS * COLS * sizeof(float));
    for (int j = 0; j < COLS; j++)
        x[j * COLS + j] = 1.0f;
    uint16_t *w = cg_malloc(65536 * sizeof(uint16_t));
    float *y = cg_malloc((size_t)COLS * 2048 * sizeof(float));
    for (int d = 1; d < 3; d++) {
        for (uint32_t h = 0; h < 65536; h++) { /* Inf and NaN become 0: 0 * Inf is NaN */
            double v = d == 1 ? ref_f16((uint16_t)h) : ref_bf16((uint16_t)h);
            w[h] = isfinite(v) ? (uint16_t)h : 0;
        }
        cg_weight cw = {.data = w, .dtype = dtypes[d], .rows = 2048, .cols = COLS};
        for (int v = 0; v < n_isas; v++) {
            use_isa(isas[v]);
            for (int p = 0; p < 2; p++) {
                run((path)p, &cw, x, COLS, y);
                for (uint32_t h = 0; h < 65536; h++) {
                    double want = d == 1 ? ref_f16(w[h]) : ref_bf16(w[h]);
                    float got = y[(size_t)(h % COLS) * 2048 + h / COLS];
                    ck_assert_msg(((double)got == want && !signbit(got) == !signbit(want)) ||
                                      (want == 0 && got == 0), /* -0 + 0 is +0 */
                                  "%s %s 0x%04x: %g vs %g", cg_matmul_isa_name(isas[v]),
                                  dtype_names[d], h, got, want);
                }
            }
        }
    }
    free(xraw);
    free(w);
    free(y);
}
END_TEST

/* Every int8 value times a power-of-two scale is exact in both paths and every variant. */
START_TEST(test_widen_q8)
{
    enum { COLS = 32, ROWS = 8 }; /* 8 rows of 32: all 256 values, scale 2^-r on row r */
    void *xraw;
    float *x = x_new(COLS, COLS, 0, 0, 1, &xraw);
    memset(x, 0, (size_t)COLS * COLS * sizeof(float));
    for (int j = 0; j < COLS; j++)
        x[j * COLS + j] = 1.0f;
    int8_t q[ROWS * COLS];
    float sc[ROWS], y[COLS * ROWS];
    for (int i = 0; i < ROWS * COLS; i++)
        q[i] = (int8_t)(i - 128);
    for (int r = 0; r < ROWS; r++)
        sc[r] = ldexpf(1.0f, -r);
    cg_weight cw = {.data = q, .dtype = CG_DTYPE_Q8, .rows = ROWS, .cols = COLS, .scale = sc};
    for (int v = 0; v < n_isas; v++) {
        use_isa(isas[v]);
        for (int p = 0; p < 2; p++) {
            run((path)p, &cw, x, COLS, y);
            for (int i = 0; i < ROWS * COLS; i++)
                ck_assert_msg(y[(i % COLS) * ROWS + i / COLS] ==
                                  ldexpf((float)(i - 128), -i / COLS),
                              "%s q8 %d", cg_matmul_isa_name(isas[v]), i - 128);
        }
    }
    free(xraw);
}
END_TEST

/* Quantisation: per-row scale max|w| / 127, every element within half a step, the row's
 * largest value at +-127, a zero row at scale 0, Inf refused. */
START_TEST(test_quantize_q8)
{
    enum { ROWS = 9, COLS = 37 };
    int8_t q[ROWS * COLS];
    float sc[ROWS];
    for (int d = 0; d < 3; d++) {
        mat m = mat_new(dtypes[d], ROWS, COLS, 0, 0, 3 + d);
        cg_weight out;
        ck_assert_int_eq(cg_matmul_quantize_q8(&m.w, q, sc, &out), CG_OK);
        ck_assert(out.dtype == CG_DTYPE_Q8 && out.data == q && out.scale == sc);
        ck_assert(out.rows == ROWS && out.cols == COLS);
        for (int r = 0; r < ROWS; r++) {
            double amax = 0;
            int qmax = 0;
            for (int c = 0; c < COLS; c++) {
                amax = fmax(amax, fabs(m.val[r * COLS + c]));
                qmax = abs(q[r * COLS + c]) > qmax ? abs(q[r * COLS + c]) : qmax;
            }
            ck_assert(fabs(sc[r] - amax / 127) <= 1e-6 * amax);
            ck_assert_int_eq(qmax, 127);
            for (int c = 0; c < COLS; c++)
                ck_assert(fabs(q[r * COLS + c] * (double)sc[r] - m.val[r * COLS + c]) <=
                          0.5001 * sc[r]);
        }
        mat_free(&m);
    }
    float w[2 * 3] = {0, 0, 0, 1, -2, 0.5f};
    cg_weight cw = {.data = w, .dtype = CG_DTYPE_F32, .rows = 2, .cols = 3}, out;
    ck_assert_int_eq(cg_matmul_quantize_q8(&cw, q, sc, &out), CG_OK);
    ck_assert(sc[0] == 0.0f && q[0] == 0 && q[1] == 0 && q[2] == 0);
    ck_assert(q[3] == 64 && q[4] == -127 && q[5] == 32); /* 63.5 and 31.75 round to nearest */
    ck_assert_int_eq(cg_matmul_quantize_q8(&out, q, sc, &out), CG_E_UNSUPPORTED);
    w[4] = INFINITY;
    ck_assert_int_eq(cg_matmul_quantize_q8(&cw, q, sc, &out), CG_E_VALUE);
}
END_TEST

/* Widening is exact, so the prefill path gives the same bits in every variant; and it is
 * deterministic for the same rows. Whether a row's bits depend on n or on its position
 * (OpenBLAS's reduction order) is printed, not asserted: the worker does not rely on it. */
START_TEST(test_prefill_deterministic)
{
    static const int pshapes[][3] = {{64, 896, 48}, {130, 300, 33}, {896, 896, 128}};
    for (size_t si = 0; si < CG_ARRAY_LEN(pshapes); si++) {
        const int rows = pshapes[si][0], cols = pshapes[si][1], n = pshapes[si][2];
        void *xraw;
        float *x = x_new(n, cols, 0, 0, 11 + si, &xraw);
        float *y0 = cg_malloc((size_t)n * rows * sizeof(float));
        float *y1 = cg_malloc((size_t)n * rows * sizeof(float));
        for (int d = 0; d < NDT; d++) {
            mat m = mat_new(dtypes[d], rows, cols, 0, 0, 20 + d);
            use_isa(isas[0]);
            cg_matmul_prefill(&m.w, x, n, y0, scratch);
            for (int v = 0; v < n_isas; v++) {
                use_isa(isas[v]);
                cg_matmul_prefill(&m.w, x, n, y1, scratch);
                ck_assert_msg(!memcmp(y0, y1, (size_t)n * rows * sizeof(float)),
                              "prefill %s %s differs from %s", dtype_names[d],
                              cg_matmul_isa_name(isas[v]), cg_matmul_isa_name(isas[0]));
            }
            /* the same rows at other batch sizes and positions */
            int moved = 0;
            static const int ns[] = {1, 3, 17};
            for (size_t ni = 0; ni < CG_ARRAY_LEN(ns); ni++) {
                const int k = ns[ni], off = n - k; /* the last k rows, now at the front */
                cg_matmul_prefill(&m.w, x + (size_t)off * cols, k, y1, scratch);
                moved += memcmp(y1, y0 + (size_t)off * rows, (size_t)k * rows * sizeof(float)) != 0;
            }
            printf("test_matmul: prefill %s %dx%d: rows %s when n and position change\n",
                   dtype_names[d], rows, cols, moved ? "CHANGE bits" : "keep their bits");
            mat_free(&m);
        }
        free(xraw);
        free(y0);
        free(y1);
    }
}
END_TEST

START_TEST(test_empty_and_zero_cols)
{
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {7, 7, 7, 7, 7, 7};
    uint16_t w[6] = {0};
    cg_weight cw = {.data = w, .dtype = CG_DTYPE_BF16, .rows = 3, .cols = 0};
    for (int v = 0; v < n_isas; v++) {
        use_isa(isas[v]);
        for (int p = 0; p < 2; p++) {
            for (int i = 0; i < 6; i++)
                y[i] = 7;
            run((path)p, &cw, x, 2, y); /* cols 0: an empty sum is 0 */
            for (int i = 0; i < 6; i++)
                ck_assert(y[i] == 0.0f);
            y[0] = 7;
            run((path)p, &cw, x, 0, y); /* n 0: nothing is written */
            ck_assert(y[0] == 7.0f);
        }
    }
}
END_TEST

/* The default variant is the best this CPU has, or the one CG_MATMUL_ISA names (ctest runs
 * this case again with CG_MATMUL_ISA=generic); an unsupported variant is refused. */
START_TEST(test_isa_choice)
{
    const char *env = getenv("CG_MATMUL_ISA");
    cg_matmul_isa want = isas[n_isas - 1];
    if (env && *env) {
        int found = -1;
        for (int i = 0; i < CG_MATMUL_ISA_COUNT; i++)
            if (!strcmp(env, cg_matmul_isa_name((cg_matmul_isa)i))) found = i;
        ck_assert_int_ge(found, 0);
        if (cg_matmul_isa_supported((cg_matmul_isa)found)) want = (cg_matmul_isa)found;
    }
    ck_assert_str_eq(cg_matmul_isa_name(cg_matmul_isa_active()), cg_matmul_isa_name(want));
    printf("test_matmul: variants on this CPU:");
    for (int v = 0; v < n_isas; v++)
        printf(" %s", cg_matmul_isa_name(isas[v]));
    printf("; default %s\n", cg_matmul_isa_name(want));
    ck_assert_int_eq(cg_matmul_set_isa(CG_MATMUL_ISA_COUNT), CG_E_UNSUPPORTED);
    ck_assert_str_eq(cg_matmul_isa_name(cg_matmul_isa_active()), cg_matmul_isa_name(want));
    for (int i = 0; i < CG_MATMUL_ISA_COUNT; i++)
        if (!cg_matmul_isa_supported((cg_matmul_isa)i))
            ck_assert_int_eq(cg_matmul_set_isa((cg_matmul_isa)i), CG_E_UNSUPPORTED);
    ck_assert(cg_matmul_isa_supported(CG_MATMUL_ISA_GENERIC));
}
END_TEST

/* ---- block-quantised weights (Q8_0, Q4_0) ---- */

/* Element c of row r of a block-quantised matrix, decoded from the layout matmul.h states. */
static double qval(const cg_weight *w, int r, int c)
{
    const size_t cols = (size_t)w->cols, nblk = cols / 32;
    const double d = ref_f16(w->bscale[(size_t)r * nblk + (size_t)c / 32]);
    if (w->dtype == CG_DTYPE_Q8_0)
        return d * ((const int8_t *)w->data)[(size_t)r * cols + (size_t)c];
    const uint8_t byte =
        ((const uint8_t *)w->data)[(size_t)r * cols / 2 + (size_t)c / 64 * 32 + (size_t)c % 32];
    return d * (((c % 64) < 32 ? byte & 15 : byte >> 4) - 8);
}

/* The product as matmul_quant.c defines it, written from that definition: x to int8 per block
 * of 32 (d = max|x| / 127), integer sums of 4 elements into 16 lanes (lane 8 * (block % 2) +
 * element / 4; Q4_0 sums nibble * x, and its -8 * sum(x) goes to the block's first lane), FMA
 * with dw * dx in block order, lanes summed in a fixed tree. */
static float qref(const cg_weight *w, int r, const float *x)
{
    const int cols = w->cols, nblk = cols / 32;
    float acc[16] = {0};
    for (int k = 0; k < nblk; k++) {
        float amax = 0;
        int q[32];
        for (int e = 0; e < 32; e++)
            amax = fmaxf(amax, fabsf(x[k * 32 + e]));
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        for (int e = 0; e < 32; e++)
            q[e] = (int)fminf(127.0f, fmaxf(-127.0f, rintf(x[k * 32 + e] * id)));
        const float dw = (float)ref_f16(w->bscale[(size_t)r * nblk + k]);
        const float sc = dw * (amax / 127.0f);
        int qsum = 0;
        for (int e = 0; e < 32; e++)
            qsum += q[e];
        for (int j = 0; j < 8; j++) {
            /* Q4_0 lanes hold nibble * x; the block's -8 * sum(x) goes to its first lane */
            const int q4 = w->dtype == CG_DTYPE_Q4_0;
            int s = q4 && j == 0 ? -8 * qsum : 0;
            for (int e = 4 * j; e < 4 * j + 4; e++) {
                const double v = qval(w, r, k * 32 + e);
                s += ((int)lrint(dw ? v / dw : 0) + (q4 ? 8 : 0)) * q[e];
            }
            acc[8 * (k & 1) + j] = fmaf((float)s, sc, acc[8 * (k & 1) + j]);
        }
    }
    float h[8], t[4];
    for (int j = 0; j < 8; j++)
        h[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; j++)
        t[j] = h[j] + h[j + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* f32 weights quantised to dt: the matrix, its buffers and the f32 source. */
typedef struct qmat {
    cg_weight w;
    void *q;
    uint16_t *sc;
    float *src;
} qmat;

static qmat qmat_new(cg_dtype dt, int rows, int cols, uint64_t seed)
{
    qmat m;
    uint64_t st = seed;
    size_t ns = 0, nq = cg_matmul_quant_bytes(dt, rows, cols, &ns);
    m.src = cg_malloc((size_t)rows * (size_t)cols * sizeof(float) + 4);
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
        m.src[i] = (float)(urand(&st) * (i % 7 == 3 ? 0.5 : 0.05)); /* some larger weights */
    m.q = cg_malloc(nq + 1);
    m.sc = cg_malloc(ns * 2 + 2);
    cg_weight f = {.data = m.src, .dtype = CG_DTYPE_F32, .rows = rows, .cols = cols};
    ck_assert_int_eq(cg_matmul_quantize(&f, dt, m.q, m.sc, &m.w), CG_OK);
    ck_assert_ptr_eq(m.w.data, m.q);
    ck_assert_ptr_eq(m.w.bscale, m.sc);
    ck_assert_int_eq(m.w.dtype, dt);
    return m;
}

static void qmat_free(qmat *m)
{
    free(m->q);
    free(m->sc);
    free(m->src);
}

static const cg_dtype qdtypes[] = {CG_DTYPE_Q8_0, CG_DTYPE_Q4_0};
/* rows that are a multiple of 16 take the amx variant's tiles in prefill */
static const int qshapes[][3] = {{1, 64, 1},    {3, 64, 2},   {5, 128, 3},  {4, 192, 5},
                                 {9, 896, 4},   {17, 256, 9}, {33, 64, 16}, {70, 320, 7},
                                 {130, 512, 1}, {8, 4864, 2}, {16, 64, 1},  {48, 896, 33},
                                 {32, 4864, 64}};

/* Whether variant isa's prefill of block-quantised weights runs on bf16 tiles: amx, and
 * avx512vnni on a CPU with AVX512-BF16 (matmul_bf16.c). */
static int qprefill_tiled(cg_matmul_isa isa)
{
    return isa == CG_MATMUL_ISA_AMX || (isa == CG_MATMUL_ISA_AVX512VNNI && cg_bf16_supported());
}

/* The prefill bound of a block-quantised product in a variant: f32 summation, in amx each of x
 * and the dequantised weight rounded once to bf16 (relative 2^-9 each), with AVX512-BF16 x
 * alone (the weights' integers are exact in bf16). */
static double qprefill_bound(cg_matmul_isa isa, int cols, double mag)
{
    const double round = isa == CG_MATMUL_ISA_AMX ? 0x1.02p-8 : qprefill_tiled(isa) ? 0x1p-9 : 0;
    return bound(cols, 1, mag) + round * mag;
}

/* y, the prefill product of variant isa, against x times the dequantised weights summed in f64 */
static void check_qprefill(const cg_weight *w, const float *x, int n, const float *y,
                           cg_matmul_isa isa)
{
    const int rows = w->rows, cols = w->cols;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < cols; k++) {
                const double t = (double)x[(size_t)i * cols + k] * qval(w, r, k);
                ref += t;
                mag += fabs(t);
            }
            const double e = fabs(y[(size_t)i * rows + r] - ref);
            ck_assert_msg(e <= qprefill_bound(isa, cols, mag), "%s prefill %dx%d n=%d: %g off",
                          cg_matmul_isa_name(isa), rows, cols, n, e);
        }
}

/* Every variant's decode kernel equals the reference bit for bit; Q8_0 also with an odd count of
 * blocks (the AVX-512 tile's half pair). A kernel that drops a block, mixes up nibbles, scales or
 * lanes, or sums in another order fails here. The prefill path (dequantised panels, f32 x) is
 * within f32 summation error of the f64 product of the same dequantised weights. */
START_TEST(test_qkernels_exact)
{
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < CG_ARRAY_LEN(qshapes) + 2; s++) {
            int rows, cols, n;
            if (s < CG_ARRAY_LEN(qshapes)) {
                rows = qshapes[s][0], cols = qshapes[s][1], n = qshapes[s][2];
            } else {
                if (qdtypes[d] == CG_DTYPE_Q4_0) continue;
                rows = 11, cols = s == CG_ARRAY_LEN(qshapes) ? 32 : 96, n = 5;
            }
            qmat m = qmat_new(qdtypes[d], rows, cols, 100 + s);
            void *raw;
            float *x = x_new(n, cols, 0, 0, 200 + s, &raw);
            x[0] = 0; /* a zero, and a zero block, go through the sign and scale paths */
            if (n > 1) memset(x + cols, 0, 32 * sizeof(float));
            float *want = cg_malloc((size_t)n * rows * sizeof(float));
            float *y = cg_malloc((size_t)n * rows * sizeof(float));
            for (int i = 0; i < n; i++)
                for (int r = 0; r < rows; r++)
                    want[(size_t)i * rows + r] = qref(&m.w, r, x + (size_t)i * cols);
            for (int v = 0; v < n_isas; v++) {
                use_isa(isas[v]);
                memset(y, 0xff, (size_t)n * rows * sizeof(float));
                run(DECODE, &m.w, x, n, y);
                for (size_t i = 0; i < (size_t)n * rows; i++)
                    if (memcmp(&y[i], &want[i], sizeof(float)))
                        ck_abort_msg("%s %s %dx%d n=%d: y[%zu] = %.9g, reference %.9g",
                                     cg_matmul_isa_name(isas[v]),
                                     qdtypes[d] == CG_DTYPE_Q8_0 ? "q8_0" : "q4_0", rows, cols, n,
                                     i, y[i], want[i]);
                run(PREFILL, &m.w, x, n, y);
                check_qprefill(&m.w, x, n, y, isas[v]);
            }
            free(want);
            free(y);
            free(raw);
            qmat_free(&m);
        }
}
END_TEST

/* x with NaN and infinities quantises alike in every variant (the vector quantiser against the
 * scalar one): a NaN is left out of its block's maximum and its value clamps to -127, an
 * infinite maximum makes the block's scale infinite. The decode outputs of each variant equal
 * the generic ones bit for bit, NaN for NaN; a block of finite x alone stays finite. */
START_TEST(test_qkernels_nonfinite)
{
    for (int d = 0; d < 2; d++) {
        const int rows = 8, cols = 256;
        qmat m = qmat_new(qdtypes[d], rows, cols, 31);
        void *raw;
        float *x = x_new(2, cols, 0, 0, 32, &raw);
        x[3] = x[31] = NAN;       /* row 0: NaN in block 0, first and last; the rest finite */
        x[cols + 5] = NAN;        /* row 1: NaN in block 0, */
        x[cols + 40] = INFINITY;  /* +Inf in block 1, */
        x[cols + 70] = -INFINITY; /* -Inf in block 2 */
        float want[16], y[16];
        use_isa(CG_MATMUL_ISA_GENERIC);
        run(DECODE, &m.w, x, 1, want);
        run(DECODE, &m.w, x + cols, 1, want + rows);
        for (int r = 0; r < rows; r++) {
            ck_assert_msg(isfinite(want[r]), "a NaN in x made output %d %g", r, want[r]);
            ck_assert_msg(!isfinite(want[rows + r]), "infinite x gave a finite output %d", r);
        }
        for (int v = 0; v < n_isas; v++) {
            use_isa(isas[v]);
            run(DECODE, &m.w, x, 1, y);
            run(DECODE, &m.w, x + cols, 1, y + rows);
            for (int i = 0; i < 2 * rows; i++)
                ck_assert_msg((isnan(y[i]) && isnan(want[i])) || !memcmp(&y[i], &want[i], 4),
                              "%s %s: y[%d] = %g, generic %g", cg_matmul_isa_name(isas[v]),
                              d ? "q4_0" : "q8_0", i, y[i], want[i]);
        }
        free(raw);
        qmat_free(&m);
    }
}
END_TEST

/* The tiled prefills (amx; AVX512-BF16 under avx512vnni): a row's bits do not depend on n, on
 * its position, nor on the thread count (each output is one chain of tile products); x rows
 * past a multiple of the tile and a last single 16-row group of W are written, and nothing
 * else is. */
static void check_qprefill_tiled(cg_matmul_isa isa)
{
    static const int ashapes[][3] = {{16, 64, 1}, {48, 896, 70}, {144, 4864, 33}, {80, 192, 7}};
    const int threads = omp_get_max_threads();
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < CG_ARRAY_LEN(ashapes); s++) {
            const int rows = ashapes[s][0], cols = ashapes[s][1], n = ashapes[s][2];
            qmat m = qmat_new(qdtypes[d], rows, cols, 60 + s);
            void *raw;
            float *x = x_new(n, cols, 0, 0, 70 + s, &raw);
            const size_t ny = (size_t)n * rows;
            float *all = cg_malloc((ny + rows) * sizeof(float));
            float *part = cg_malloc((ny + rows) * sizeof(float));
            use_isa(isa);
            all[ny] = part[ny] = 7; /* past the end: untouched */
            cg_matmul_prefill(&m.w, x, n, all, scratch);
            ck_assert(all[ny] == 7);
            check_qprefill(&m.w, x, n, all, isa);
            static const int ns[] = {1, 2, 17, 33};
            for (size_t ni = 0; ni < CG_ARRAY_LEN(ns); ni++) {
                const int k = CG_MIN(ns[ni], n), off = n - k; /* the last k rows, at the front */
                omp_set_num_threads(1 + (int)(ni % 2));
                memset(part, 0xff, (size_t)k * rows * sizeof(float));
                cg_matmul_prefill(&m.w, x + (size_t)off * cols, k, part, scratch);
                ck_assert_mem_eq(part, all + (size_t)off * rows, (size_t)k * rows * sizeof(float));
                ck_assert(part[ny] == 7);
            }
            omp_set_num_threads(threads);
            free(all);
            free(part);
            free(raw);
            qmat_free(&m);
        }
}

START_TEST(test_qprefill_amx)
{
    if (!cg_matmul_isa_supported(CG_MATMUL_ISA_AMX)) {
        printf("test_matmul: no AMX on this CPU: the amx prefill is not run\n");
        return;
    }
    check_qprefill_tiled(CG_MATMUL_ISA_AMX);
}
END_TEST

START_TEST(test_qprefill_bf16)
{
    if (!cg_matmul_isa_supported(CG_MATMUL_ISA_AVX512VNNI) || !cg_bf16_supported()) {
        printf("test_matmul: no AVX512-BF16 on this CPU: the bf16 prefill is not run\n");
        return;
    }
    check_qprefill_tiled(CG_MATMUL_ISA_AVX512VNNI);
}
END_TEST

/* The quantised product stays within its quantisation error of the f32 one: relative to the
 * sum of |terms|, below 1% at q8 and 8% at q4 (measured: about 0.3% and 3%). */
START_TEST(test_qkernels_close_to_f32)
{
    const int rows = 64, cols = 896, n = 3;
    for (int d = 0; d < 2; d++) {
        qmat m = qmat_new(qdtypes[d], rows, cols, 7);
        void *raw;
        float *x = x_new(n, cols, 0, 0, 8, &raw);
        float *y = cg_malloc((size_t)n * rows * sizeof(float));
        cg_matmul_decode(&m.w, x, n, y);
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int r = 0; r < rows; r++) {
                double s = 0, a = 0;
                for (int k = 0; k < cols; k++) {
                    s += (double)x[i * cols + k] * m.src[(size_t)r * cols + k];
                    a += fabs((double)x[i * cols + k] * m.src[(size_t)r * cols + k]);
                }
                worst = fmax(worst, fabs(y[i * rows + r] - s) / a);
            }
        printf("test_matmul: %s worst |error| / sum|terms| = %.4f\n", d ? "q4_0" : "q8_0", worst);
        ck_assert_double_lt(worst, d ? 0.08 : 0.01);
        free(y);
        free(raw);
        qmat_free(&m);
    }
}
END_TEST

/* A decode row's bits do not depend on the batch, its place in it, nor the thread count. */
START_TEST(test_qdecode_batch_invariant)
{
    const int rows = 300, cols = 896, n = 11;
    for (int d = 0; d < 2; d++) {
        qmat m = qmat_new(qdtypes[d], rows, cols, 9);
        void *raw;
        float *x = x_new(n, cols, 0, 0, 10, &raw);
        float *all = cg_malloc((size_t)n * rows * sizeof(float));
        float *one = cg_malloc((size_t)rows * sizeof(float));
        for (int v = 0; v < n_isas; v++) {
            use_isa(isas[v]);
            cg_matmul_decode(&m.w, x, n, all);
            for (int t = 1; t <= 2; t++) {
                omp_set_num_threads(t);
                for (int i = 0; i < n; i++) {
                    cg_matmul_decode(&m.w, x + (size_t)i * cols, 1, one);
                    ck_assert_mem_eq(one, all + (size_t)i * rows, (size_t)rows * sizeof(float));
                }
            }
        }
        free(all);
        free(one);
        free(raw);
        qmat_free(&m);
    }
}
END_TEST

/* The weights as quantised: Q8_0 within half a step of each weight (plus the clamp at f16's
 * rounding of the scale); Q4_0 never worse, per block, than llama.cpp's choice (d = m / -8);
 * dequantised rows as the layout says; refusals. */
START_TEST(test_quantize_blocks)
{
    const int rows = 16, cols = 256;
    for (int d = 0; d < 2; d++) {
        qmat m = qmat_new(qdtypes[d], rows, cols, 11);
        float *row = cg_malloc((size_t)cols * sizeof(float));
        for (int r = 0; r < rows; r++) {
            cg_matmul_dequant_row(&m.w, r, row);
            for (int k = 0; k < cols / 32; k++) {
                const float *v = m.src + (size_t)r * cols + (size_t)k * 32;
                float amax = 0, mx = 0;
                for (int e = 0; e < 32; e++) {
                    amax = fmaxf(amax, fabsf(v[e]));
                    if (fabsf(v[e]) > fabsf(mx)) mx = v[e];
                }
                const double step = ref_f16(m.w.bscale[(size_t)r * (cols / 32) + k]);
                double err = 0, llama = 0;
                const double dl = ref_f16(cg_f32_to_f16(mx / -8.0f)), il = dl ? 1 / dl : 0;
                for (int e = 0; e < 32; e++) {
                    const double got = qval(&m.w, r, k * 32 + e);
                    ck_assert_double_eq(got, row[k * 32 + e]);
                    err += (got - v[e]) * (got - v[e]);
                    if (d == 0)
                        ck_assert_double_le(fabs(got - v[e]),
                                            0.5 * step + fabs(amax - 127 * step) + 1e-12);
                    const double qn = fmin(15, fmax(0, rint(v[e] * (float)il) + 8));
                    llama += ((qn - 8) * dl - v[e]) * ((qn - 8) * dl - v[e]);
                }
                if (d == 1) ck_assert_double_le(err, llama * (1 + 1e-5) + 1e-20);
            }
        }
        free(row);
        qmat_free(&m);
    }
    float f[96] = {0};
    uint8_t q[96];
    uint16_t sc[3];
    cg_weight w = {.data = f, .dtype = CG_DTYPE_F32, .rows = 1, .cols = 96}, out;
    ck_assert_int_eq(cg_matmul_quantize(&w, CG_DTYPE_Q4_0, q, sc, &out), CG_E_VALUE);
    w.cols = 48;
    ck_assert_int_eq(cg_matmul_quantize(&w, CG_DTYPE_Q8_0, q, sc, &out), CG_E_VALUE);
    w.cols = 32;
    ck_assert_int_eq(cg_matmul_quantize(&w, CG_DTYPE_F16, q, sc, &out), CG_E_UNSUPPORTED);
    f[3] = NAN;
    ck_assert_int_eq(cg_matmul_quantize(&w, CG_DTYPE_Q8_0, q, sc, &out), CG_E_VALUE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("matmul");
    tcase_add_checked_fixture(th_case(s, "isa env", 0, TH_TESTS(test_isa_choice)), setup, teardown);
    TCase *tc = th_case(
        s, "core", 300,
        TH_TESTS(test_against_f64, test_exact_integers, test_decode_batch_invariant, test_unaligned,
                 test_widen_all_values, test_widen_q8, test_quantize_q8, test_prefill_deterministic,
                 test_empty_and_zero_cols, test_qkernels_exact, test_qkernels_close_to_f32,
                 test_qdecode_batch_invariant, test_qprefill_amx, test_qprefill_bf16,
                 test_quantize_blocks, test_qkernels_nonfinite));
    tcase_add_checked_fixture(tc, setup, teardown);
    return th_run(s, CK_FORK_GETENV);
}
