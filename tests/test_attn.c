/* Tests for segment-aware attention: the plan against DESIGN §5's table (naive rule), and the
 * blocked CBLAS forward against a naive O(n^2) attention under the dense mask. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/attn.h"
#include "cache/base.h"

static unsigned rnd(unsigned *st)
{
    *st = *st * 1103515245u + 12345u;
    return (*st >> 8) & 0xffffff;
}

static float frand(unsigned *st)
{
    return (float)rnd(st) / (float)0x800000 - 1.0f;
}

typedef struct layout {
    cg_role roles[16];
    uint32_t lens[16];
    size_t n;
    uint32_t total;
} layout;

/* system, 0..6 chunks, question; some segments empty; sometimes no question. */
static layout random_layout(unsigned *st, uint32_t max_len)
{
    layout l = {.n = 0, .total = 0};
    l.roles[l.n] = CG_ROLE_SYSTEM;
    l.lens[l.n++] = rnd(st) % 4 == 0 ? 0 : rnd(st) % max_len + 1;
    size_t chunks = rnd(st) % 7;
    for (size_t i = 0; i < chunks; i++) {
        l.roles[l.n] = CG_ROLE_CHUNK;
        l.lens[l.n++] = rnd(st) % 5 == 0 ? 0 : rnd(st) % max_len + 1;
    }
    if (rnd(st) % 5 != 0) {
        l.roles[l.n] = CG_ROLE_QUESTION;
        l.lens[l.n++] = rnd(st) % max_len + 1;
    }
    for (size_t i = 0; i < l.n; i++)
        l.total += l.lens[i];
    return l;
}

/* DESIGN §5 written directly: j <= i, and system/question rows see everything before them;
 * a chunk row sees its own chunk, plus the system segment in mode sys. */
static int naive_visible(const layout *l, cg_mode mode, uint32_t i, uint32_t j)
{
    if (j > i) return 0;
    size_t si = 0, sj = 0;
    uint32_t start = 0;
    for (size_t s = 0; s < l->n; s++) {
        if (i >= start && i < start + l->lens[s]) si = s;
        if (j >= start && j < start + l->lens[s]) sj = s;
        start += l->lens[s];
    }
    if (l->roles[si] != CG_ROLE_CHUNK) return 1;
    if (si == sj) return 1;
    return mode == CG_MODE_SYS && l->roles[sj] == CG_ROLE_SYSTEM;
}

START_TEST(test_plan_matches_table)
{
    unsigned st = 12345;
    for (int iter = 0; iter < 300; iter++) {
        layout l = random_layout(&st, 12);
        for (int m = 0; m < 2; m++) {
            cg_mode mode = (cg_mode)m;
            cg_attn_span spans[16];
            size_t ns = cg_attn_plan(l.roles, l.lens, l.n, mode, spans);
            size_t nonempty = 0;
            for (size_t i = 0; i < l.n; i++)
                nonempty += l.lens[i] > 0;
            ck_assert_uint_eq(ns, nonempty);
            size_t n = l.total;
            uint8_t *mask = cg_malloc(n * n + 1);
            cg_attn_mask_dense(spans, ns, n, mask);
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t j = 0; j < n; j++)
                    ck_assert_msg(mask[(size_t)i * n + j] == naive_visible(&l, mode, i, j),
                                  "iter %d mode %d i %u j %u", iter, m, i, j);
            free(mask);
        }
    }
}
END_TEST

/* Hand-written layout: system 2, chunk 3, chunk 2, question 2 (slots 0..8). */
START_TEST(test_plan_hand)
{
    cg_role roles[] = {CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_CHUNK, CG_ROLE_QUESTION};
    uint32_t lens[] = {2, 3, 2, 2};
    cg_attn_span sp[4];
    ck_assert_uint_eq(cg_attn_plan(roles, lens, 4, CG_MODE_STRICT, sp), 4);
    ck_assert_uint_eq(sp[1].q_start, 2);
    ck_assert_uint_eq(sp[1].own_start, 2);
    ck_assert_uint_eq(sp[1].prefix, 0);
    ck_assert_uint_eq(sp[2].own_start, 5);
    ck_assert_uint_eq(sp[3].own_start, 0);
    ck_assert_uint_eq(cg_attn_plan(roles, lens, 4, CG_MODE_SYS, sp), 4);
    ck_assert_uint_eq(sp[2].prefix, 2);
    ck_assert_uint_eq(sp[2].own_start, 5);
    uint8_t mask[81];
    cg_attn_mask_dense(sp, 4, 9, mask);
    /* slot 6 (second chunk, sys mode): sees 0,1 and 5,6 only */
    uint8_t want[9] = {1, 1, 0, 0, 0, 1, 1, 0, 0};
    ck_assert(memcmp(mask + 6 * 9, want, 9) == 0);
}
END_TEST

/* Naive attention in double over the dense mask (for long ranges, where n x n bytes would
 * not fit, the mask row is written from the span's definition instead). */
static void naive_attn(const cg_attn_kv *kv, int n_heads, const cg_attn_span *spans, size_t ns,
                       size_t n_slots, const float *q, float *out)
{
    int dense = n_slots <= 4096;
    uint8_t *mask = cg_malloc(dense ? n_slots * n_slots : n_slots);
    if (dense) cg_attn_mask_dense(spans, ns, n_slots, mask);
    int d = kv->head_dim, ld = n_heads * d, group = n_heads / kv->n_kv_heads;
    double *sc = cg_malloc(n_slots * sizeof(double));
    size_t row = 0;
    for (size_t s = 0; s < ns; s++) {
        for (uint32_t i = spans[s].q_start; i < spans[s].q_start + spans[s].q_len; i++, row++) {
            uint8_t *mrow = dense ? mask + (size_t)i * n_slots : mask;
            if (!dense)
                for (size_t j = 0; j < n_slots; j++)
                    mrow[j] = j <= i && (j < spans[s].prefix || j >= spans[s].own_start);
            for (int h = 0; h < n_heads; h++) {
                const float *qh = q + row * (size_t)ld + (size_t)h * (size_t)d;
                const float *k = kv->k + (size_t)(h / group) * kv->head_stride;
                const float *v = kv->v + (size_t)(h / group) * kv->head_stride;
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j < n_slots; j++) {
                    if (!mrow[j]) continue;
                    double dot = 0;
                    for (int e = 0; e < d; e++)
                        dot += (double)qh[e] * k[j * (size_t)d + (size_t)e];
                    sc[j] = dot / sqrt((double)d);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (size_t j = 0; j < n_slots; j++)
                    if (mrow[j]) sum += (sc[j] = exp(sc[j] - mx));
                float *oh = out + row * (size_t)ld + (size_t)h * (size_t)d;
                for (int e = 0; e < d; e++) {
                    double acc = 0;
                    for (size_t j = 0; j < n_slots; j++)
                        if (mrow[j]) acc += sc[j] / sum * v[j * (size_t)d + (size_t)e];
                    oh[e] = (float)acc;
                }
            }
        }
    }
    free(sc);
    free(mask);
}

/* Runs forward vs naive for one configuration; returns the max abs difference. */
static double compare(unsigned *st, int n_heads, int n_kv, int d, const cg_attn_span *spans,
                      size_t ns, size_t n_slots, float qscale)
{
    size_t n_rows = 0;
    for (size_t s = 0; s < ns; s++)
        n_rows += spans[s].q_len;
    size_t stride = n_slots * (size_t)d + 8; /* padded: head_stride need not be tight */
    float *k = cg_malloc((size_t)n_kv * stride * sizeof(float));
    float *v = cg_malloc((size_t)n_kv * stride * sizeof(float));
    float *q = cg_malloc(n_rows * (size_t)n_heads * (size_t)d * sizeof(float) + 4);
    float *o1 = cg_malloc(n_rows * (size_t)n_heads * (size_t)d * sizeof(float) + 4);
    float *o2 = cg_malloc(n_rows * (size_t)n_heads * (size_t)d * sizeof(float) + 4);
    for (size_t i = 0; i < (size_t)n_kv * stride; i++)
        k[i] = frand(st), v[i] = frand(st);
    for (size_t i = 0; i < n_rows * (size_t)n_heads * (size_t)d; i++)
        q[i] = qscale * frand(st);
    cg_attn_kv kv = {.k = k, .v = v, .head_stride = stride, .n_kv_heads = n_kv, .head_dim = d};
    cg_attn_forward(&kv, n_heads, spans, ns, q, o1);
    naive_attn(&kv, n_heads, spans, ns, n_slots, q, o2);
    double m = 0;
    for (size_t i = 0; i < n_rows * (size_t)n_heads * (size_t)d; i++) {
        double e = fabs((double)o1[i] - (double)o2[i]);
        if (!(e <= m)) m = e; /* NaN propagates as failure */
    }
    free(k);
    free(v);
    free(q);
    free(o1);
    free(o2);
    return m;
}

START_TEST(test_forward_random_layouts)
{
    static const int shapes[][3] = {{4, 4, 8}, {4, 2, 16}, {6, 2, 32}, {8, 1, 64}, {2, 1, 128}};
    unsigned st = 777;
    for (int iter = 0; iter < 24; iter++) {
        const int *sh = shapes[iter % 5];
        layout l = random_layout(&st, 150); /* own ranges cross the 64-row blocks */
        if (l.total == 0) continue;
        cg_mode mode = (cg_mode)(iter % 2);
        cg_attn_span spans[16];
        size_t ns = cg_attn_plan(l.roles, l.lens, l.n, mode, spans);
        double e = compare(&st, sh[0], sh[1], sh[2], spans, ns, l.total, 2.0f);
        ck_assert_msg(e <= 1e-5, "iter %d heads %d/%d d %d slots %u: max diff %g", iter, sh[0],
                      sh[1], sh[2], l.total, e);
    }
}
END_TEST

/* Decode: q_len 1 at the end of 300 cached slots; chunk rows of a sys-mode layout queried
 * alone (prefix > 0, own_start far from 0); several single-row spans. */
START_TEST(test_forward_decode_and_prefix)
{
    unsigned st = 4242;
    cg_attn_span dec = {.q_start = 299, .q_len = 1, .own_start = 0, .prefix = 0};
    ck_assert(compare(&st, 8, 2, 32, &dec, 1, 300, 3.0f) <= 1e-5);
    cg_attn_span sys[2] = {{.q_start = 150, .q_len = 100, .own_start = 140, .prefix = 37},
                           {.q_start = 260, .q_len = 1, .own_start = 0, .prefix = 0}};
    ck_assert(compare(&st, 4, 4, 16, sys, 2, 261, 3.0f) <= 1e-5);
    cg_attn_span ones[3] = {{.q_start = 5, .q_len = 1, .own_start = 5, .prefix = 0},
                            {.q_start = 9, .q_len = 1, .own_start = 3, .prefix = 2},
                            {.q_start = 0, .q_len = 1, .own_start = 0, .prefix = 0}};
    ck_assert(compare(&st, 2, 2, 8, ones, 3, 10, 1.0f) <= 1e-5);
}
END_TEST

/* A key range wider than the scratch budget (4M floats / 64 rows): the block shrinks. */
START_TEST(test_forward_long_range)
{
    unsigned st = 99;
    cg_attn_span sp = {.q_start = 70000 - 3, .q_len = 3, .own_start = 0, .prefix = 0};
    ck_assert(compare(&st, 1, 1, 8, &sp, 1, 70000, 4.0f) <= 1e-5);
}
END_TEST

/* The check must be able to fail: a visible key whose value differs changes the output. */
START_TEST(test_forward_sees_visible_only)
{
    /* one head, d 2: slot 2 is a strict chunk of length 1 at own_start 2 -> output == v[2] */
    float k[6] = {5, 0, 5, 0, 1, 0}, v[6] = {100, 100, 100, 100, 1, 2};
    float q[2] = {1, 0}, out[2];
    cg_attn_kv kv = {.k = k, .v = v, .head_stride = 6, .n_kv_heads = 1, .head_dim = 2};
    cg_attn_span sp = {.q_start = 2, .q_len = 1, .own_start = 2, .prefix = 0};
    cg_attn_forward(&kv, 1, &sp, 1, q, out);
    ck_assert_float_eq_tol(out[0], 1.0f, 1e-6);
    ck_assert_float_eq_tol(out[1], 2.0f, 1e-6);
    sp.own_start = 0; /* plain causal: the large values at slots 0 and 1 dominate */
    cg_attn_forward(&kv, 1, &sp, 1, q, out);
    ck_assert(out[0] > 50.0f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attn");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_plan_matches_table);
    tcase_add_test(tc, test_plan_hand);
    tcase_add_test(tc, test_forward_random_layouts);
    tcase_add_test(tc, test_forward_decode_and_prefix);
    tcase_add_test(tc, test_forward_long_range);
    tcase_add_test(tc, test_forward_sees_visible_only);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
