/* Tests for the RoPE kernels: remap(rotate(x, v), p - v) == rotate(x, p), norms, in place. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kv/remap.h"
#include "tests/harness/harness.h"

static float frand(unsigned *st)
{
    *st = *st * 1103515245u + 12345u;
    return (float)((*st >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand(&seed);
}

/* Max |a-b| / max(1, |b|) over n values. */
static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)b[i]));
        if (e > m) m = e;
    }
    return m;
}

static const int dims[] = {2, 6, 8, 32, 64, 128};
static const int64_t offsets[] = {0, 1, 1000, 100000};

START_TEST(test_style_names)
{
    ck_assert_str_eq(cg_rope_style_name(CG_ROPE_HALF), "half");
    ck_assert_str_eq(cg_rope_style_name(CG_ROPE_INTERLEAVED), "interleaved");
}
END_TEST

/* The remap identity, for both styles, several head sizes and offsets, positive and negative
 * deltas: rows stored at virtual position v and moved to p equal rows rotated at p. */
START_TEST(test_remap_equals_rotation)
{
    for (int style = 0; style < 2; style++) {
        for (size_t di = 0; di < CG_ARRAY_LEN(dims); di++) {
            cg_rope r = {.head_dim = dims[di], .theta = 10000.0, .style = (cg_rope_style)style};
            size_t n = 37, heads = 3, d = (size_t)dims[di];
            size_t total = n * heads * d;
            float *x = cg_malloc(total * sizeof(float));
            float *atv = cg_malloc(total * sizeof(float));
            float *atp = cg_malloc(total * sizeof(float));
            float *moved = cg_malloc(total * sizeof(float));
            fill(x, total, 7u + (unsigned)di);
            for (size_t vi = 0; vi < CG_ARRAY_LEN(offsets); vi++) {
                for (size_t pi = 0; pi < CG_ARRAY_LEN(offsets); pi++) {
                    int64_t v = offsets[vi], p = offsets[pi];
                    memcpy(atv, x, total * sizeof(float));
                    memcpy(atp, x, total * sizeof(float));
                    cg_rope_apply(&r, atv, n, (int)heads, v);
                    cg_rope_apply(&r, atp, n, (int)heads, p);
                    /* Rows are [n][heads*d]: as remap rows they are n*heads vectors. */
                    cg_remap_rope(&r, atv, moved, n * heads, p - v);
                    double e = max_rel(moved, atp, total);
                    ck_assert_msg(e <= 1e-5, "style %d d %zu v %lld p %lld: rel err %g", style, d,
                                  (long long)v, (long long)p, e);
                    /* delta 0 is the identity up to cos(0)=1, sin(0)=0: exact. */
                    if (v == p) ck_assert(memcmp(moved, atv, total * sizeof(float)) == 0);
                }
            }
            free(x);
            free(atv);
            free(atp);
            free(moved);
        }
    }
}
END_TEST

/* The remap must actually rotate: a nonzero delta changes the data (guards against a no-op). */
START_TEST(test_remap_changes_data)
{
    for (int style = 0; style < 2; style++) {
        cg_rope r = {.head_dim = 64, .theta = 10000.0, .style = (cg_rope_style)style};
        float x[64], y[64];
        fill(x, 64, 99);
        cg_remap_rope(&r, x, y, 1, 5);
        ck_assert(max_rel(x, y, 64) > 1e-2);
    }
}
END_TEST

/* In place gives the same bytes as out of place. */
START_TEST(test_in_place)
{
    for (int style = 0; style < 2; style++) {
        for (size_t di = 0; di < CG_ARRAY_LEN(dims); di++) {
            cg_rope r = {.head_dim = dims[di], .theta = 500000.0, .style = (cg_rope_style)style};
            size_t n = 19 * (size_t)dims[di];
            float *a = cg_malloc(n * sizeof(float));
            float *b = cg_malloc(n * sizeof(float));
            fill(a, n, 3);
            cg_remap_rope(&r, a, b, 19, -1234);
            cg_remap_rope(&r, a, a, 19, -1234);
            ck_assert(memcmp(a, b, n * sizeof(float)) == 0);
            free(a);
            free(b);
        }
    }
}
END_TEST

/* A precomputed table gives the same bytes as cg_remap_rope, block by block. */
START_TEST(test_table)
{
    for (int style = 0; style < 2; style++) {
        cg_rope r = {.head_dim = 64, .theta = 10000.0, .style = (cg_rope_style)style};
        size_t rows = 50, n = rows * 64;
        float *x = cg_malloc(n * sizeof(float));
        float *a = cg_malloc(n * sizeof(float));
        float *b = cg_malloc(n * sizeof(float));
        fill(x, n, 21);
        cg_remap_rope(&r, x, a, rows, -98765);
        cg_remap_table *t = cg_remap_table_new(&r, -98765);
        for (size_t i = 0; i < rows; i += 16)
            cg_remap_rope_table(t, x + i * 64, b + i * 64, rows - i < 16 ? rows - i : 16);
        cg_remap_table_free(&t);
        ck_assert_ptr_null(t);
        cg_remap_table_free(&t);
        ck_assert(memcmp(a, b, n * sizeof(float)) == 0);
        free(x);
        free(a);
        free(b);
    }
}
END_TEST

/* Successive calls that differ only in theta, style or delta must not reuse each other's
 * cos/sin (cg_remap_rope keeps the last table per thread). */
START_TEST(test_no_stale_table)
{
    float x[64], a[64], b[64], ref[64];
    fill(x, 64, 8);
    cg_rope r1 = {.head_dim = 64, .theta = 10000.0, .style = CG_ROPE_HALF};
    cg_rope r2 = {.head_dim = 64, .theta = 500000.0, .style = CG_ROPE_HALF};
    cg_rope r3 = {.head_dim = 64, .theta = 10000.0, .style = CG_ROPE_INTERLEAVED};
    cg_remap_table *t = cg_remap_table_new(&r1, 77);
    cg_remap_rope_table(t, x, ref, 1);
    cg_remap_table_free(&t);
    cg_remap_rope(&r1, x, a, 1, 77);
    cg_remap_rope(&r2, x, b, 1, 77);
    ck_assert(memcmp(a, ref, sizeof a) == 0);
    ck_assert(memcmp(b, ref, sizeof b) != 0);
    cg_remap_rope(&r3, x, b, 1, 77);
    ck_assert(memcmp(b, ref, sizeof b) != 0);
    cg_remap_rope(&r1, x, b, 1, 78);
    ck_assert(memcmp(b, ref, sizeof b) != 0);
    cg_remap_rope(&r1, x, b, 1, 77);
    ck_assert(memcmp(b, ref, sizeof b) == 0);
}
END_TEST

/* A hand-computed 2-D case: head_dim 2 has one pair with theta_0 = 1, so the angle is the
 * position itself, for both pairings (they coincide for d = 2). */
START_TEST(test_hand_2d)
{
    for (int style = 0; style < 2; style++) {
        cg_rope r = {.head_dim = 2, .theta = 10000.0, .style = (cg_rope_style)style};
        float x[2] = {1.0f, 0.0f};
        cg_rope_apply(&r, x, 1, 1, 1); /* rotate (1,0) by 1 radian */
        ck_assert_float_eq_tol(x[0], (float)cos(1.0), 1e-7);
        ck_assert_float_eq_tol(x[1], (float)sin(1.0), 1e-7);
        float y[2] = {0.5f, 2.0f}, z[2];
        cg_remap_rope(&r, y, z, 1, 3);
        double c = cos(3.0), s = sin(3.0);
        ck_assert_float_eq_tol(z[0], (float)(0.5 * c - 2.0 * s), 1e-6);
        ck_assert_float_eq_tol(z[1], (float)(0.5 * s + 2.0 * c), 1e-6);
    }
}
END_TEST

/* A hand-computed 4-D case separating the two pairings: pairs (0,2),(1,3) for HALF and
 * (0,1),(2,3) for INTERLEAVED; theta = 100 gives angles pos*1 and pos*0.1. */
START_TEST(test_hand_pairing)
{
    double a0 = 2.0, a1 = 2.0 * 0.1, c0 = cos(a0), s0 = sin(a0), c1 = cos(a1), s1 = sin(a1);
    float x[4] = {1, 2, 3, 4}, y[4];
    cg_rope h = {.head_dim = 4, .theta = 100.0, .style = CG_ROPE_HALF};
    cg_remap_rope(&h, x, y, 1, 2);
    ck_assert_float_eq_tol(y[0], (float)(1 * c0 - 3 * s0), 1e-6);
    ck_assert_float_eq_tol(y[2], (float)(1 * s0 + 3 * c0), 1e-6);
    ck_assert_float_eq_tol(y[1], (float)(2 * c1 - 4 * s1), 1e-6);
    ck_assert_float_eq_tol(y[3], (float)(2 * s1 + 4 * c1), 1e-6);
    cg_rope g = {.head_dim = 4, .theta = 100.0, .style = CG_ROPE_INTERLEAVED};
    cg_remap_rope(&g, x, y, 1, 2);
    ck_assert_float_eq_tol(y[0], (float)(1 * c0 - 2 * s0), 1e-6);
    ck_assert_float_eq_tol(y[1], (float)(1 * s0 + 2 * c0), 1e-6);
    ck_assert_float_eq_tol(y[2], (float)(3 * c1 - 4 * s1), 1e-6);
    ck_assert_float_eq_tol(y[3], (float)(3 * s1 + 4 * c1), 1e-6);
}
END_TEST

/* Each rotation pair keeps its length. */
START_TEST(test_pair_norms)
{
    for (int style = 0; style < 2; style++) {
        int d = 128;
        cg_rope r = {.head_dim = d, .theta = 10000.0, .style = (cg_rope_style)style};
        float x[4 * 128], y[4 * 128];
        fill(x, 4 * 128, 11);
        cg_remap_rope(&r, x, y, 4, 777);
        for (int row = 0; row < 4; row++) {
            for (int i = 0; i < d / 2; i++) {
                int a = style == CG_ROPE_HALF ? i : 2 * i;
                int b = style == CG_ROPE_HALF ? i + d / 2 : 2 * i + 1;
                const float *px = x + row * d, *py = y + row * d;
                double n0 = hypot(px[a], px[b]), n1 = hypot(py[a], py[b]);
                ck_assert_msg(fabs(n0 - n1) <= 1e-6 * fmax(1.0, n0), "pair %d: %g vs %g", i, n0,
                              n1);
            }
        }
    }
}
END_TEST

/* cg_rope_apply rotates row t to pos0 + t: rotating rows one at a time gives the same. */
START_TEST(test_apply_positions)
{
    cg_rope r = {.head_dim = 16, .theta = 10000.0, .style = CG_ROPE_HALF};
    float all[5 * 2 * 16], one[2 * 16];
    fill(all, CG_ARRAY_LEN(all), 5);
    float orig[5 * 2 * 16];
    memcpy(orig, all, sizeof all);
    cg_rope_apply(&r, all, 5, 2, 40);
    for (int t = 0; t < 5; t++) {
        memcpy(one, orig + t * 32, sizeof one);
        cg_rope_apply(&r, one, 1, 2, 40 + t);
        ck_assert(memcmp(one, all + t * 32, sizeof one) == 0);
    }
}
END_TEST

int main(void)
{
    return th_run_tests("remap", "core", 0,
                        TH_TESTS(test_style_names, test_remap_equals_rotation,
                                 test_remap_changes_data, test_in_place, test_table,
                                 test_no_stale_table, test_hand_2d, test_hand_pairing,
                                 test_pair_norms, test_apply_positions));
}
