/* RoPE kernels: absolute rotation for the model forward and delta re-rotation of cached K. */
#include "kv/remap.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* The inner loops use GCC/Clang vector extensions (4 floats = one SSE register at
 * -march=x86-64-v2). GCC 12's -O2 "very cheap" auto-vectoriser refuses these loops (unknown
 * trip count, possible src/dst overlap), so the vector form is spelled out; the compiler
 * still picks the instructions. Loads of a tile happen before its stores, which keeps
 * src == dst (in place) correct. */
typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store4(float *p, v4f v)
{
    memcpy(p, &v, sizeof v);
}

const char *cg_rope_style_name(cg_rope_style s)
{
    static const char *const names[] = {
        [CG_ROPE_HALF] = "half", [CG_ROPE_INTERLEAVED] = "interleaved"};
    return (unsigned)s < CG_ARRAY_LEN(names) ? names[s] : "unknown";
}

/* Rotation table, also the public cg_remap_table. HALF: c/s hold d/2 entries.
 * INTERLEAVED: c/s hold d entries, expanded so that y[j] = x[j]*c[j] + x[j^1]*s[j]
 * (s carries the sign). */
struct cg_remap_table {
    float *c, *s;
    double *inv_freq; /* d/2 entries: theta^(-2i/d) */
    int d;
    cg_rope_style style;
};
typedef struct cg_remap_table table;

/* The per-frequency rates: the rope's own table, or theta^(-2i/d). */
static void fill_inv_freq(const cg_rope *r, double *inv_freq)
{
    for (int i = 0; i < r->head_dim / 2; i++)
        inv_freq[i] = r->inv_freq ? r->inv_freq[i] : pow(r->theta, -2.0 * (double)i / r->head_dim);
}

static double attn_factor(const cg_rope *r)
{
    return r->attn_factor > 0 ? r->attn_factor : 1.0;
}

static void table_init(table *t, const cg_rope *r)
{
    assert(r->head_dim > 0 && r->head_dim % 2 == 0);
    t->d = r->head_dim;
    t->style = r->style;
    t->c = cg_malloc((size_t)t->d * sizeof(float));
    t->s = cg_malloc((size_t)t->d * sizeof(float));
    t->inv_freq = cg_malloc((size_t)(t->d / 2) * sizeof(double));
    fill_inv_freq(r, t->inv_freq);
}

static void table_free(table *t)
{
    cg_free(&t->c);
    cg_free(&t->s);
    cg_free(&t->inv_freq);
}

/* Fills cos/sin for one position (or delta), times scale; angles in double, stored as
 * float. */
static void table_set(table *t, int64_t pos, double scale)
{
    int h = t->d / 2;
    for (int i = 0; i < h; i++) {
        double a = (double)pos * t->inv_freq[i];
        float c = (float)(cos(a) * scale), s = (float)(sin(a) * scale);
        if (t->style == CG_ROPE_HALF) {
            t->c[i] = c;
            t->s[i] = s;
        } else {
            t->c[2 * i] = c;
            t->c[2 * i + 1] = c;
            t->s[2 * i] = -s;
            t->s[2 * i + 1] = s;
        }
    }
}

/* HALF pairing: (x1, x2) = (x[i], x[i+h]) -> (x1 c - x2 s, x1 s + x2 c). */
static void rows_half(const float *src, float *dst, size_t n_rows, int d, const float *c,
                      const float *s)
{
    int h = d / 2;
    int hv = h % 4 == 0 ? h : 0; /* vector part; odd sizes fall back to the scalar loop */
    for (size_t r = 0; r < n_rows; r++) {
        const float *x = src + r * (size_t)d;
        float *y = dst + r * (size_t)d;
        int i = 0;
        for (; i < hv; i += 4) {
            v4f a = load4(x + i), b = load4(x + h + i);
            v4f cc = load4(c + i), ss = load4(s + i);
            store4(y + i, a * cc - b * ss);
            store4(y + h + i, a * ss + b * cc);
        }
        for (; i < h; i++) {
            float a = x[i], b = x[h + i];
            y[i] = a * c[i] - b * s[i];
            y[h + i] = a * s[i] + b * c[i];
        }
    }
}

/* INTERLEAVED pairing: (x[2i], x[2i+1]) with the expanded, sign-folded table. */
static void rows_interleaved(const float *src, float *dst, size_t n_rows, int d, const float *c,
                             const float *s)
{
    int dv = d % 4 == 0 ? d : 0;
    for (size_t r = 0; r < n_rows; r++) {
        const float *x = src + r * (size_t)d;
        float *y = dst + r * (size_t)d;
        int i = 0;
        for (; i < dv; i += 4) {
            v4f a = load4(x + i);
            v4f sw = __builtin_shufflevector(a, a, 1, 0, 3, 2);
            store4(y + i, a * load4(c + i) + sw * load4(s + i));
        }
        for (; i < d; i += 2) {
            float a = x[i], b = x[i + 1];
            y[i] = a * c[i] + b * s[i];
            y[i + 1] = b * c[i + 1] + a * s[i + 1];
        }
    }
}

static void rotate_rows(const table *t, const float *src, float *dst, size_t n_rows)
{
    if (t->style == CG_ROPE_HALF)
        rows_half(src, dst, n_rows, t->d, t->c, t->s);
    else
        rows_interleaved(src, dst, n_rows, t->d, t->c, t->s);
}

void cg_rope_apply(const cg_rope *r, float *x, size_t n_tokens, int n_heads, int64_t pos0)
{
    table t;
    table_init(&t, r);
    size_t stride = (size_t)n_heads * (size_t)r->head_dim;
    for (size_t i = 0; i < n_tokens; i++) {
        /* One table per token, shared by its heads: the heads of a row are n_heads
         * contiguous vectors, i.e. n_heads rows of head_dim. */
        table_set(&t, pos0 + (int64_t)i, attn_factor(r));
        float *row = x + i * stride;
        rotate_rows(&t, row, row, (size_t)n_heads);
    }
    table_free(&t);
}

/* Callers remap a chunk block by block (16 rows per call) with one delta, so the last
 * table is kept per thread: a repeated (rope, delta) costs a comparison instead of a malloc
 * and head_dim/2 pow + sincos, which would otherwise take longer than the rows. */
#define CACHED_MAX_DIM 512
static _Thread_local struct {
    int valid;
    cg_rope rope;
    int64_t delta;
    float c[CACHED_MAX_DIM], s[CACHED_MAX_DIM];
    double inv_freq[CACHED_MAX_DIM / 2];
} last;

void cg_remap_rope(const cg_rope *r, const float *src, float *dst, size_t n_rows, int64_t delta)
{
    if (r->head_dim > CACHED_MAX_DIM) {
        table t;
        table_init(&t, r);
        table_set(&t, delta, 1.0);
        rotate_rows(&t, src, dst, n_rows);
        table_free(&t);
        return;
    }
    assert(r->head_dim > 0 && r->head_dim % 2 == 0);
    table t = {
        .c = last.c, .s = last.s, .inv_freq = last.inv_freq, .d = r->head_dim, .style = r->style};
    if (!last.valid || last.rope.head_dim != r->head_dim || last.rope.theta != r->theta ||
        last.rope.style != r->style || last.rope.inv_freq != r->inv_freq || last.delta != delta) {
        fill_inv_freq(r, t.inv_freq);
        table_set(&t, delta, 1.0);
        last.valid = 1;
        last.rope = *r;
        last.delta = delta;
    }
    rotate_rows(&t, src, dst, n_rows);
}

cg_remap_table *cg_remap_table_new(const cg_rope *r, int64_t delta)
{
    table *t = cg_malloc(sizeof *t);
    table_init(t, r);
    table_set(t, delta, 1.0);
    return t;
}

void cg_remap_table_free(cg_remap_table **t)
{
    if (!*t) return;
    table_free(*t);
    cg_free(t);
}

void cg_remap_rope_table(const cg_remap_table *t, const float *src, float *dst, size_t n_rows)
{
    rotate_rows(t, src, dst, n_rows);
}

void cg_rope_angles(const cg_rope *r, const int64_t *pos, size_t n, float *c, float *s)
{
    const int h = r->head_dim / 2;
    double inv_freq[CACHED_MAX_DIM / 2], *f = inv_freq;
    if (h > CACHED_MAX_DIM / 2) f = cg_malloc((size_t)h * sizeof *f);
    fill_inv_freq(r, f);
    const double scale = attn_factor(r);
    for (size_t t = 0; t < n; t++)
        for (int i = 0; i < h; i++) {
            double a = (double)pos[t] * f[i];
            c[t * (size_t)h + (size_t)i] = (float)(cos(a) * scale);
            s[t * (size_t)h + (size_t)i] = (float)(sin(a) * scale);
        }
    if (f != inv_freq) free(f);
}

void cg_rope_rotate(const cg_rope *r, float *x, size_t n, int n_heads, const float *c,
                    const float *s)
{
    const int d = r->head_dim, h = d / 2;
    const size_t stride = (size_t)n_heads * (size_t)d;
    float ce[CACHED_MAX_DIM], se[CACHED_MAX_DIM];
    for (size_t t = 0; t < n; t++) {
        const float *ct = c + t * (size_t)h, *st = s + t * (size_t)h;
        float *row = x + t * stride;
        if (r->style == CG_ROPE_HALF) {
            rows_half(row, row, (size_t)n_heads, d, ct, st);
            continue;
        }
        for (int i = 0; i < h; i++) { /* the interleaved kernel takes the expanded table */
            ce[2 * i] = ce[2 * i + 1] = ct[i];
            se[2 * i] = -st[i];
            se[2 * i + 1] = st[i];
        }
        rows_interleaved(row, row, (size_t)n_heads, d, ce, se);
    }
}
