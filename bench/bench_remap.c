/* Remap bandwidth against memcpy bandwidth in the same run (DESIGN §6: remap is
 * memory-bound; the target is a fraction of memcpy). Also remap straight out of pool blocks.
 *
 * usage: bench_remap [buffer_mb (default 64)] [reps (default 15)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kv/pool.h"
#include "kv/remap.h"
#include "tests/harness/kv_geom.h"

static volatile float sink;

/* Best of reps, in seconds. Read + write bytes count the same for both sides. */
typedef void (*kernel_fn)(void *ctx);

static double best_time(kernel_fn fn, void *ctx, int reps)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = cg_now_ns();
        fn(ctx);
        uint64_t t1 = cg_now_ns();
        double s = (double)(t1 - t0) / 1e9;
        if (s < best) best = s;
    }
    return best;
}

typedef struct flat {
    const cg_rope *r;
    float *src, *dst;
    size_t n_rows, bytes;
    int64_t delta;
} flat;

static void do_memcpy(void *ctx)
{
    flat *f = ctx;
    memcpy(f->dst, f->src, f->bytes);
    sink = f->dst[f->bytes / sizeof(float) / 2];
}

static void do_remap(void *ctx)
{
    flat *f = ctx;
    cg_remap_rope(f->r, f->src, f->dst, f->n_rows, f->delta);
    sink = f->dst[f->bytes / sizeof(float) / 2];
}

static void do_remap_inplace(void *ctx)
{
    flat *f = ctx;
    cg_remap_rope(f->r, f->dst, f->dst, f->n_rows, f->delta);
    sink = f->dst[f->bytes / sizeof(float) / 2];
}

/* Pool case: every layer/head K of one chunk, block by block, into a contiguous
 * per-head destination (what assembly does with a hit); V is copied in both variants. */
typedef struct pooled {
    const cg_remap_table *t; /* NULL: cg_remap_rope per block (thread-local table) */
    const cg_rope *r;
    cg_pool *pool;
    cg_pool_chunk *c;
    int layers, heads, hd;
    float *dst;
    int remap;
} pooled;

static void do_pool(void *ctx)
{
    pooled *b = ctx;
    uint32_t nb = cg_pool_chunk_blocks(b->c);
    size_t tokens = cg_pool_chunk_tokens(b->c);
    for (int h = 0; h < b->heads; h++) {
        for (int l = 0; l < b->layers; l++) {
            float *k_out =
                b->dst + (((size_t)h * (size_t)b->layers + (size_t)l) * 2) * tokens * (size_t)b->hd;
            float *v_out = k_out + tokens * (size_t)b->hd;
            for (uint32_t i = 0; i < nb; i++) {
                uint32_t n = 0;
                const float *k = cg_pool_chunk_rows(b->pool, b->c, i, l, h, 0, &n);
                const float *v = cg_pool_chunk_rows(b->pool, b->c, i, l, h, 1, &n);
                size_t bytes = (size_t)n * (size_t)b->hd * sizeof(float);
                if (b->remap && b->t)
                    cg_remap_rope_table(b->t, k, k_out, n);
                else if (b->remap)
                    cg_remap_rope(b->r, k, k_out, n, 1234);
                else
                    memcpy(k_out, k, bytes);
                memcpy(v_out, v, bytes);
                k_out += (size_t)n * (size_t)b->hd;
                v_out += (size_t)n * (size_t)b->hd;
            }
        }
    }
    sink = b->dst[0];
}

int main(int argc, char **argv)
{
    size_t mb = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 15;
    size_t bytes = mb << 20;
    float *src = cg_malloc(bytes), *dst = cg_malloc(bytes);
    for (size_t i = 0; i < bytes / sizeof(float); i++)
        src[i] = (float)(i % 1000) * 0.001f;
    memset(dst, 0, bytes);

    printf("flat buffer %zu MiB, best of %d, GB/s = (read + write bytes) / time\n", mb, reps);
    printf("%-6s %-12s %10s %10s %10s %8s %8s\n", "hd", "style", "memcpy", "remap", "in-place",
           "ratio", "ratio_ip");
    static const int dims[] = {32, 128};
    for (size_t di = 0; di < 2; di++) {
        for (int style = 0; style < 2; style++) {
            cg_rope r = {.head_dim = dims[di], .theta = 10000.0, .style = (cg_rope_style)style};
            flat f = {.r = &r,
                      .src = src,
                      .dst = dst,
                      .bytes = bytes,
                      .delta = 4321,
                      .n_rows = bytes / sizeof(float) / (size_t)dims[di]};
            double tm = best_time(do_memcpy, &f, reps);
            double tr = best_time(do_remap, &f, reps);
            double ti = best_time(do_remap_inplace, &f, reps);
            double gm = 2.0 * (double)bytes / tm / 1e9, gr = 2.0 * (double)bytes / tr / 1e9;
            double gi = 2.0 * (double)bytes / ti / 1e9;
            printf("%-6d %-12s %10.2f %10.2f %10.2f %8.2f %8.2f\n", dims[di],
                   cg_rope_style_name(r.style), gm, gr, gi, gr / gm, gi / gm);
        }
    }
    free(src);
    free(dst);

    /* Pool: 8 layers x 4 kv heads x hd 128, block 16, one chunk filling about buffer_mb. */
    cg_pool_params pp = th_pool_params((th_kv_geom){8, 4, 128, 16}, 0);
    size_t per_token = (size_t)pp.n_layers * (size_t)pp.n_kv_heads * 2 * 128 * sizeof(float);
    uint32_t tokens = (uint32_t)(bytes / per_token);
    tokens -= tokens % 16;
    pp.capacity_bytes = (size_t)tokens * per_token + cg_pool_block_bytes(&pp);
    cg_pool *pool = NULL;
    if (cg_pool_open(pp, &pool) != CG_OK) return 1;
    cg_key key = {{1}};
    cg_pool_chunk *c = NULL;
    if (cg_pool_insert(pool, &key, tokens, 0, &c, NULL) != CG_OK) return 1;
    float *rows = cg_malloc((size_t)tokens * 128 * sizeof(float));
    for (size_t i = 0; i < (size_t)tokens * 128; i++)
        rows[i] = (float)(i % 777) * 0.01f;
    for (int l = 0; l < pp.n_layers; l++)
        for (int h = 0; h < pp.n_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++)
                cg_pool_chunk_write(pool, c, l, h, kv, rows);
    cg_pool_publish(pool, c, 0);
    free(rows);
    size_t chunk_bytes = (size_t)tokens * per_token;
    float *out = cg_malloc(chunk_bytes);
    memset(out, 0, chunk_bytes);
    printf("\npool chunk: %u tokens, %d layers x %d kv heads x hd 128, block 16 (%.1f MiB)\n",
           tokens, pp.n_layers, pp.n_kv_heads, (double)chunk_bytes / (1 << 20));
    printf("%-12s %10s %10s %10s %8s %8s\n", "style", "memcpy", "table", "per-call", "ratio",
           "ratio_pc");
    for (int style = 0; style < 2; style++) {
        cg_rope r = {.head_dim = 128, .theta = 10000.0, .style = (cg_rope_style)style};
        cg_remap_table *t = cg_remap_table_new(&r, 1234);
        pooled b = {.t = t,
                    .r = &r,
                    .pool = pool,
                    .c = c,
                    .layers = pp.n_layers,
                    .heads = pp.n_kv_heads,
                    .hd = 128,
                    .dst = out,
                    .remap = 0};
        double tm = best_time(do_pool, &b, reps);
        b.remap = 1;
        double tr = best_time(do_pool, &b, reps);
        b.t = NULL;
        double tc = best_time(do_pool, &b, reps);
        double gm = 2.0 * (double)chunk_bytes / tm / 1e9, gr = 2.0 * (double)chunk_bytes / tr / 1e9;
        double gc = 2.0 * (double)chunk_bytes / tc / 1e9;
        printf("%-12s %10.2f %10.2f %10.2f %8.2f %8.2f\n", cg_rope_style_name(r.style), gm, gr, gc,
               gr / gm, gc / gm);
        cg_remap_table_free(&t);
    }
    free(out);
    cg_pool_release(pool, &c, 1);
    cg_pool_close(&pool);
    return 0;
}
