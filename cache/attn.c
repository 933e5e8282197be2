/* Segment-aware attention (DESIGN §5): per query block, scores only against the visible
 * key ranges [0, prefix) and [own_start, i], with CBLAS for the products. */
#include "cache/attn.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cache/base.h"

/* Query rows per work item. */
#define BLOCK_ROWS 64
/* Scores scratch per thread is at most this many floats (16 MiB); very long key ranges
 * shrink the query block instead of growing the scratch. */
#define SCRATCH_FLOATS ((size_t)4 << 20)
/* OpenBLAS (pthreads build) threads one sgemm when m*n*k exceeds 65536*4. Two OpenMP
 * threads each asking its small thread pool for help would oversubscribe the two cores
 * and serialise on the pool's lock, so every product here is cut into key tiles that
 * stay under that size and runs single-threaded inside its OpenMP thread. */
#define GEMM_SINGLE_MNK ((size_t)65536 * 4)

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

typedef struct work {
    uint32_t span;
    uint32_t q0, rows; /* slots [q0, q0+rows) */
    size_t row_index;  /* row of q/out for slot q0 */
    int head;
} work;

/* S[:, col0 .. col0+n) = scale * Q K[k0 .. k0+n)^T, in key tiles small enough that
 * OpenBLAS runs each product on the calling thread. */
static void scores(const float *q, int ldq, const float *k, int d, uint32_t k0, uint32_t n, int m,
                   float scale, float *s, size_t lds, size_t col0, uint32_t tile)
{
    for (uint32_t t = 0; t < n; t += tile) {
        uint32_t w = CG_MIN(tile, n - t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, (int)w, d, scale, q, ldq,
                    k + (size_t)(k0 + t) * (size_t)d, d, 0.0f, s + col0 + t, (int)lds);
    }
}

/* O (+)= P[:, col0 .. col0+n) V[k0 .. k0+n), tiled like scores(). */
static void apply_v(const float *p, size_t ldp, size_t col0, const float *v, int d, uint32_t k0,
                    uint32_t n, int m, float *o, int ldo, int accumulate, uint32_t tile)
{
    for (uint32_t t = 0; t < n; t += tile) {
        uint32_t w = CG_MIN(tile, n - t);
        float beta = (accumulate || t > 0) ? 1.0f : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, (int)w, 1.0f, p + col0 + t,
                    (int)ldp, v + (size_t)(k0 + t) * (size_t)d, d, beta, o, ldo);
    }
}

static void run_item(const cg_attn_kv *kv, int n_heads, const cg_attn_span *sp, const work *w,
                     const float *q, float *out, float *s)
{
    int d = kv->head_dim;
    int ld = n_heads * d;
    int group = n_heads / kv->n_kv_heads;
    int kvh = w->head / group;
    const float *k = kv->k + (size_t)kvh * kv->head_stride;
    const float *v = kv->v + (size_t)kvh * kv->head_stride;
    const float *qb = q + w->row_index * (size_t)ld + (size_t)w->head * (size_t)d;
    float *ob = out + w->row_index * (size_t)ld + (size_t)w->head * (size_t)d;
    int m = (int)w->rows;

    /* Columns: [0, prefix) then own keys [own_start, q0+rows). */
    uint32_t n_pre = sp->prefix;
    uint32_t n_own = w->q0 + w->rows - sp->own_start;
    size_t width = (size_t)n_pre + n_own;
    size_t per_tile = GEMM_SINGLE_MNK / ((size_t)m * (size_t)d);
    uint32_t tile = (uint32_t)CG_MAX(per_tile, (size_t)16);
    float scale = 1.0f / sqrtf((float)d);

    if (n_pre) scores(qb, ld, k, d, 0, n_pre, m, scale, s, width, 0, tile);
    scores(qb, ld, k, d, sp->own_start, n_own, m, scale, s, width, n_pre, tile);

    for (int r = 0; r < m; r++) {
        float *row = s + (size_t)r * width;
        /* Causal cut inside the own range: slot q0+r sees own keys up to itself. */
        size_t valid = n_pre + (w->q0 + (uint32_t)r - sp->own_start) + 1;
        float mx = -INFINITY;
        for (size_t j = 0; j < valid; j++)
            mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (size_t j = 0; j < valid; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (size_t j = 0; j < valid; j++)
            row[j] *= inv;
        for (size_t j = valid; j < width; j++)
            row[j] = 0.0f;
    }

    if (n_pre) apply_v(s, width, 0, v, d, 0, n_pre, m, ob, ld, 0, tile);
    apply_v(s, width, n_pre, v, d, sp->own_start, n_own, m, ob, ld, n_pre > 0, tile);
}

void cg_attn_forward(const cg_attn_kv *kv, int n_heads, const cg_attn_span *spans, size_t n_spans,
                     const float *q, float *out)
{
    assert(kv->n_kv_heads > 0 && n_heads % kv->n_kv_heads == 0);
    /* Work list: (span, query block, head). */
    size_t n_items = 0, cap = 0;
    work *items = NULL;
    size_t row_index = 0;
    size_t max_scratch = 0;
    for (size_t si = 0; si < n_spans; si++) {
        const cg_attn_span *sp = &spans[si];
        assert(sp->prefix <= sp->own_start && sp->own_start <= sp->q_start);
        uint32_t q0 = sp->q_start;
        while (q0 < sp->q_start + sp->q_len) {
            size_t remaining = sp->q_start + sp->q_len - q0;
            /* Widest row of this block is the last one; pick the block so that
             * rows * width stays under the scratch budget. */
            size_t width_max =
                (size_t)sp->prefix + (q0 + CG_MIN(remaining, (size_t)BLOCK_ROWS)) - sp->own_start;
            size_t rows = CG_MIN(remaining, (size_t)BLOCK_ROWS);
            if (rows * width_max > SCRATCH_FLOATS)
                rows = CG_MAX((size_t)1, SCRATCH_FLOATS / width_max);
            size_t width = (size_t)sp->prefix + (q0 + rows) - sp->own_start;
            max_scratch = CG_MAX(max_scratch, rows * width);
            for (int h = 0; h < n_heads; h++) {
                if (n_items == cap) {
                    cap = cap ? cap * 2 : 64;
                    items = cg_realloc(items, cap * sizeof *items);
                }
                items[n_items++] = (work){.span = (uint32_t)si,
                                          .q0 = q0,
                                          .rows = (uint32_t)rows,
                                          .row_index = row_index + (q0 - sp->q_start),
                                          .head = h};
            }
            q0 += (uint32_t)rows;
        }
        row_index += sp->q_len;
    }

#pragma omp parallel
    {
        float *s = cg_malloc(max_scratch * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < n_items; i++)
            run_item(kv, n_heads, &spans[items[i].span], &items[i], q, out, s);
        cg_free(&s);
    }
    cg_free(&items);
}
