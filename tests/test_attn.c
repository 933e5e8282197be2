/* Tests for segment-aware attention: the plan against DESIGN §5's table (naive rule), and the
 * blocked CBLAS forward against a naive O(n^2) attention under the dense mask. */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/attn.h"
#include "base/base.h"
#include "tests/harness/harness.h"

/* The compile-time cap of the kernel under test (tests/attn.cmake builds the lower ones). */
#ifndef CG_ATTN_MAX_ISA
#define CG_ATTN_MAX_ISA 3
#endif

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

/* Spans over n_slots keys, for compare_shapes. */
typedef struct span_set {
    const char *name;
    const cg_attn_span *spans;
    size_t n_spans, n_slots;
} span_set;

/* Ten rounds over the five shapes (heads, KV heads, head_dim), OpenBLAS at one thread per call
 * for the first five and two for the others, each span set in turn from one random stream
 * (seed): every one within 1e-5 of the reference. */
static void compare_shapes(const int shapes[5][3], unsigned seed, const span_set *l, size_t n,
                           float qscale)
{
    unsigned st = seed;
    for (int i = 0; i < 10; i++) {
        const int *sh = shapes[i % 5];
        openblas_set_num_threads(i < 5 ? 1 : 2);
        for (size_t k = 0; k < n; k++) {
            double e =
                compare(&st, sh[0], sh[1], sh[2], l[k].spans, l[k].n_spans, l[k].n_slots, qscale);
            ck_assert_msg(e <= 1e-5, "%s heads %d/%d d %d: max diff %g", l[k].name, sh[0], sh[1],
                          sh[2], e);
        }
    }
}

/* Spans long enough to cross the kernel's key tiles (256 keys) and query blocks (128 stacked
 * rows): causal, and a sys-mode layout whose prefix and own ranges start and end mid-tile.
 * Shapes cover group sizes 1..8 and head_dim with and without a multiple of 8. Run with
 * OpenBLAS at one thread per call (the worker's setting: the largest tiles) and at two (tiles
 * kept under OpenBLAS's threading sizes). */
START_TEST(test_forward_large_tiles)
{
    static const int shapes[5][3] = {{8, 4, 32}, {8, 1, 64}, {16, 2, 16}, {3, 3, 40}, {4, 2, 12}};
    cg_role roles[] = {CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_CHUNK, CG_ROLE_QUESTION};
    uint32_t lens[] = {300, 517, 389, 70};
    cg_attn_span causal = {.q_start = 0, .q_len = 1100, .own_start = 0, .prefix = 0};
    cg_attn_span spans[4];
    size_t ns = cg_attn_plan(roles, lens, 4, CG_MODE_SYS, spans);
    span_set l[] = {{"causal", &causal, 1, 1100}, {"sys layout", spans, ns, 1276}};
    compare_shapes(shapes, 31337, l, 2, 3.0f);
}
END_TEST

/* Decode-sized work (one or two query slots, up to 4 stacked rows: the few-row path) over
 * several of its 2048-key tiles, with a prefix, a causal cut between the two slots, and head_dim
 * with and without a multiple of 8; and 8 stacked rows (the smallest matrix-matrix case). */
START_TEST(test_forward_decode_long)
{
    static const int shapes[5][3] = {{8, 4, 32}, {4, 1, 32}, {2, 2, 12}, {4, 2, 64}, {8, 1, 16}};
    cg_attn_span one = {.q_start = 5000, .q_len = 1, .own_start = 0, .prefix = 0};
    cg_attn_span two[2] = {{.q_start = 4700, .q_len = 2, .own_start = 2100, .prefix = 2090},
                           {.q_start = 4702, .q_len = 1, .own_start = 4702, .prefix = 0}};
    span_set l[] = {{"decode", &one, 1, 5001}, {"two rows", two, 2, 4703}};
    compare_shapes(shapes, 2024, l, 2, 4.0f);
}
END_TEST

/* Few work items for many threads: each block's keys are split into parts computed apart and
 * merged (one KV head; decode and a question block), including a part boundary that falls
 * between the prefix and the own range. Four threads are asked for so that the split happens
 * whatever the machine's core count. */
START_TEST(test_forward_split_keys)
{
    omp_set_num_threads(4);
    openblas_set_num_threads(1);
    unsigned st = 555;
    cg_attn_span dec = {.q_start = 4000, .q_len = 1, .own_start = 0, .prefix = 0};
    double e = compare(&st, 8, 1, 64, &dec, 1, 4001, 4.0f);
    ck_assert_msg(e <= 1e-5, "decode: max diff %g", e);
    cg_attn_span qb = {.q_start = 3000, .q_len = 64, .own_start = 0, .prefix = 0};
    e = compare(&st, 4, 1, 32, &qb, 1, 3064, 4.0f);
    ck_assert_msg(e <= 1e-5, "question block: max diff %g", e);
    cg_attn_span pre = {.q_start = 3500, .q_len = 40, .own_start = 1700, .prefix = 1100};
    e = compare(&st, 4, 2, 32, &pre, 1, 3540, 4.0f);
    ck_assert_msg(e <= 1e-5, "prefix + own: max diff %g", e);
}
END_TEST

/* Very peaked rows. Random: scores spread over tens. Exact: scores that float holds exactly
 * (head_dim 4, so the scale is 1/2; integer q and k), spread down to -400 below each row's max,
 * so most exponentials fall in the range where the kernel's exp clamps; the output must still
 * match the double-precision reference. */
START_TEST(test_forward_peaked)
{
    unsigned st = 8080;
    cg_attn_span sp[2] = {{.q_start = 0, .q_len = 700, .own_start = 0, .prefix = 0},
                          {.q_start = 700, .q_len = 1, .own_start = 0, .prefix = 0}};
    double e = compare(&st, 4, 2, 32, sp, 2, 701, 20.0f);
    ck_assert_msg(e <= 1e-5, "random: max diff %g", e);

    enum { N = 600, D = 4, H = 2 };
    float *k = cg_calloc(N * D, sizeof(float)), *v = cg_malloc(N * D * sizeof(float));
    float *q = cg_calloc(N * H * D, sizeof(float)), *o1 = cg_malloc(N * H * D * sizeof(float));
    float *o2 = cg_malloc(N * H * D * sizeof(float));
    for (int j = 0; j < N; j++) {
        k[j * D] = j == 0 ? 0.0f : -(float)((j * 7) % 401); /* key 0 holds every row's max */
        for (int e2 = 0; e2 < D; e2++)
            v[j * D + e2] = frand(&st);
    }
    for (int i = 0; i < N; i++) {
        q[(i * H + 0) * D] = 1.0f; /* head 0: scores 0 .. -200 */
        q[(i * H + 1) * D] = 2.0f; /* head 1: scores 0 .. -400 */
    }
    cg_attn_kv kv = {.k = k, .v = v, .head_stride = N * D, .n_kv_heads = 1, .head_dim = D};
    cg_attn_span causal = {.q_start = 0, .q_len = N, .own_start = 0, .prefix = 0};
    cg_attn_forward(&kv, H, &causal, 1, q, o1);
    naive_attn(&kv, H, &causal, 1, N, q, o2);
    double m = 0;
    for (int i = 0; i < N * H * D; i++) {
        double d = fabs((double)o1[i] - (double)o2[i]);
        if (!(d <= m)) m = d;
    }
    ck_assert_msg(m <= 1e-6, "exact scores: max diff %g", m);
    free(k);
    free(v);
    free(q);
    free(o1);
    free(o2);
}
END_TEST

/* The softmax weights themselves, to a few ulp: with one-hot values (v_j = e_j, head_dim 64)
 * the output of a row is its weight vector. Scores are exact in float (scale 1/8, integer q and
 * k) and their fractional parts cover [0, 1) in steps of 1/8, down to -112 below the max.
 * Rows: a 64-slot causal span (matrix path, 128 stacked rows) and a single decode row
 * (few-row path). */
START_TEST(test_forward_softmax_weights)
{
    enum { N = 64, D = 64, H = 2 };
    float *k = cg_calloc(N * D, sizeof(float)), *v = cg_calloc(N * D, sizeof(float));
    float *q = cg_calloc(N * H * D, sizeof(float)), *o = cg_malloc(N * H * D * sizeof(float));
    for (int j = 0; j < N; j++) {
        k[j * D] = j == 5 ? 1.0f : -(float)((j * 37) % 113); /* max at key 5 for rows >= 5 */
        v[j * D + j] = 1.0f;
    }
    for (int i = 0; i < N; i++) {
        q[(i * H + 0) * D] = 1.0f; /* scores k/8 */
        q[(i * H + 1) * D] = 3.0f; /* scores 3k/8 */
    }
    cg_attn_kv kv = {.k = k, .v = v, .head_stride = N * D, .n_kv_heads = 1, .head_dim = D};
    cg_attn_span spans[2][1] = {{{.q_start = 0, .q_len = N, .own_start = 0, .prefix = 0}},
                                {{.q_start = N - 1, .q_len = 1, .own_start = 0, .prefix = 0}}};
    double worst = 0;
    openblas_set_num_threads(1);
    for (int c = 0; c < 2; c++) {
        cg_attn_forward(&kv, H, spans[c], 1, q + (c ? (size_t)(N - 1) * H * D : 0), o);
        for (uint32_t r = 0; r < spans[c][0].q_len; r++) {
            uint32_t slot = spans[c][0].q_start + r;
            for (int h = 0; h < H; h++) {
                double a = h ? 3.0 : 1.0, mx = -INFINITY, sum = 0;
                for (uint32_t j = 0; j <= slot; j++)
                    mx = fmax(mx, a * k[j * D] / 8.0);
                for (uint32_t j = 0; j <= slot; j++)
                    sum += exp(a * k[j * D] / 8.0 - mx);
                const float *row = o + ((size_t)r * H + (size_t)h) * D;
                for (uint32_t j = 0; j < N; j++) {
                    double want = j <= slot ? exp(a * k[j * D] / 8.0 - mx) / sum : 0.0;
                    double err = fabs(row[j] - want);
                    /* relative where the weight is a normal float; absolute below */
                    double rel = want > 1e-30 ? err / want : err / 1e-30;
                    ck_assert_msg(rel <= 5e-7, "case %d slot %u head %d key %u: %.9g vs %.9g", c,
                                  slot, h, j, row[j], want);
                    worst = fmax(worst, rel);
                }
            }
        }
    }
    fprintf(stderr, "softmax weights: worst relative error %.3g\n", worst);
    free(k);
    free(v);
    free(q);
    free(o);
}
END_TEST

/* The check must be able to fail: a visible key whose value differs changes the output. */
/* cg_attn_key_mass against the softmax written out in double: grouped-query heads, more
 * rows than one block of its scratch, a padded head stride; every row and head adds 1 in all;
 * a key that matches one query head's direction takes that head's weight. */
START_TEST(test_key_mass)
{
    unsigned st = 7;
    static const int shapes[][3] = {{4, 2, 16}, {6, 3, 32}, {8, 1, 8}};
    for (size_t c = 0; c < CG_ARRAY_LEN(shapes); c++) {
        const int nh = shapes[c][0], nkv = shapes[c][1], d = shapes[c][2], group = nh / nkv;
        const size_t n_q = 7, n_keys = 300, stride = n_keys * (size_t)d + 8;
        float *k = cg_malloc((size_t)nkv * stride * sizeof(float));
        float *q = cg_malloc(n_q * (size_t)nh * (size_t)d * sizeof(float));
        for (size_t i = 0; i < (size_t)nkv * stride; i++)
            k[i] = frand(&st);
        for (size_t i = 0; i < n_q * (size_t)nh * (size_t)d; i++)
            q[i] = 3.0f * frand(&st);
        /* key 123 of kv head 0 points along row 2's head 0, scaled up */
        for (int e = 0; e < d; e++)
            k[123 * (size_t)d + (size_t)e] = 8.0f * q[2 * (size_t)nh * (size_t)d + (size_t)e];
        cg_attn_kv kv = {.k = k, .v = k, .head_stride = stride, .n_kv_heads = nkv, .head_dim = d};
        double *got = cg_calloc(n_keys, sizeof(double)), *want = cg_calloc(n_keys, sizeof(double));
        got[5] = want[5] = 1.0; /* it adds to what is there */
        cg_attn_key_mass(&kv, nh, q, (size_t)nh * (size_t)d, n_q, n_keys, got);
        double *sc = cg_malloc(n_keys * sizeof(double)), total = 0;
        for (size_t t = 0; t < n_q; t++)
            for (int h = 0; h < nh; h++) {
                const float *qh = q + (t * (size_t)nh + (size_t)h) * (size_t)d;
                const float *kh = k + (size_t)(h / group) * stride;
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j < n_keys; j++) {
                    double dot = 0;
                    for (int e = 0; e < d; e++)
                        dot += (double)qh[e] * kh[j * (size_t)d + (size_t)e];
                    sc[j] = dot / sqrt((double)d);
                    mx = fmax(mx, sc[j]);
                }
                for (size_t j = 0; j < n_keys; j++)
                    sum += (sc[j] = exp(sc[j] - mx));
                for (size_t j = 0; j < n_keys; j++)
                    want[j] += sc[j] / sum;
            }
        for (size_t j = 0; j < n_keys; j++) {
            ck_assert_msg(fabs(got[j] - want[j]) <= 1e-5 * fmax(1.0, want[j]),
                          "shape %zu key %zu: %g, want %g", c, j, got[j], want[j]);
            total += got[j];
        }
        ck_assert_msg(fabs(total - 1.0 - (double)(n_q * (size_t)nh)) < 1e-6, "total %g", total);
        ck_assert_msg(got[123] > 0.9, "the matching key took %g", got[123]);
        free(sc);
        free(got);
        free(want);
        free(k);
        free(q);
    }
}
END_TEST

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
    out[0] = -1.0f; /* no spans: nothing is written */
    cg_attn_forward(&kv, 1, &sp, 0, q, out);
    ck_assert(out[0] == -1.0f);
}
END_TEST

/* The run-time cap (cg_attn_set_max_isa): every level matches the reference, and the levels
 * run different loops (scalar sums against vector lanes), so on a CPU with AVX2 the capped
 * output differs in its last bits from the uncapped one: the cap takes effect. */
static float *forward_at(int level, const cg_attn_kv *kv, const cg_attn_span *sp, const float *q,
                         size_t n_out)
{
    float *o = cg_malloc(n_out * sizeof(float));
    cg_attn_set_max_isa(level);
    cg_attn_forward(kv, 4, sp, 1, q, o);
    cg_attn_set_max_isa(3);
    return o;
}

START_TEST(test_forward_runtime_cap)
{
    cg_attn_span sp = {.q_start = 0, .q_len = 600, .own_start = 0, .prefix = 0};
    for (int level = 0; level <= 3; level++) {
        unsigned st = 5150;
        cg_attn_set_max_isa(level);
        double e = compare(&st, 4, 2, 32, &sp, 1, 600, 3.0f);
        cg_attn_set_max_isa(3);
        ck_assert_msg(e <= 1e-5, "level %d: max diff %g", level, e);
    }
    const size_t n_slots = 600, d = 32, n_out = n_slots * 4 * d;
    float *k = cg_malloc(2 * n_slots * d * sizeof(float));
    float *v = cg_malloc(2 * n_slots * d * sizeof(float));
    float *q = cg_malloc(n_out * sizeof(float));
    unsigned st = 99;
    for (size_t i = 0; i < 2 * n_slots * d; i++)
        k[i] = frand(&st), v[i] = frand(&st);
    for (size_t i = 0; i < n_out; i++)
        q[i] = 3.0f * frand(&st);
    cg_attn_kv kv = {.k = k, .v = v, .head_stride = n_slots * d, .n_kv_heads = 2, .head_dim = 32};
    float *top = forward_at(3, &kv, &sp, q, n_out), *low = forward_at(0, &kv, &sp, q, n_out);
    if (CG_ATTN_MAX_ISA >= 2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        ck_assert_msg(memcmp(top, low, n_out * sizeof(float)) != 0,
                      "the scalar cap ran the same loops as the widest");
    free(top);
    free(low);
    free(k);
    free(v);
    free(q);
}
END_TEST

int main(void)
{
    return th_run_tests(
        "attn", "core", 300,
        TH_TESTS(test_plan_matches_table, test_plan_hand, test_forward_random_layouts,
                 test_forward_decode_and_prefix, test_forward_long_range,
                 test_forward_sees_visible_only, test_forward_large_tiles, test_forward_decode_long,
                 test_forward_split_keys, test_forward_peaked, test_forward_softmax_weights,
                 test_key_mass, test_forward_runtime_cap));
}
