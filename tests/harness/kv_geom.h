/* The KV geometry of a test's or bench's RAM pool and disk tier, said once: the parameters of
 * both tiers follow from it, the disk tier's block_bytes as the pool computes them. Header only
 * (no th_ library to link), so the fuzz targets and the kernel benches use it too. A chunk's
 * rows are written and compared from a function of the chunk and the row element. */
#ifndef CG_TEST_KV_GEOM_H
#define CG_TEST_KV_GEOM_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "kv/pool.h"
#include "worker/store/disk.h"

typedef struct th_kv_geom {
    int n_layers, n_kv_heads, head_dim;
    uint32_t block_tokens;
} th_kv_geom;

/* The pool's defaults with geometry g and capacity_bytes (no eviction callback). */
static inline cg_pool_params th_pool_params(th_kv_geom g, size_t capacity_bytes)
{
    cg_pool_params p = cg_pool_default_params();
    p.capacity_bytes = capacity_bytes;
    p.block_tokens = g.block_tokens;
    p.n_layers = g.n_layers;
    p.n_kv_heads = g.n_kv_heads;
    p.head_dim = g.head_dim;
    return p;
}

/* The disk tier's defaults in dir (borrowed) for model_id (borrowed) with geometry g,
 * capacity_bytes and the block bytes of a pool of that geometry. */
static inline cg_disk_params th_disk_params(th_kv_geom g, const char *dir, const char *model_id,
                                            size_t capacity_bytes)
{
    cg_pool_params pp = th_pool_params(g, 0);
    cg_disk_params p = cg_disk_default_params();
    p.dir = dir;
    p.capacity_bytes = capacity_bytes;
    p.block_bytes = cg_pool_block_bytes(&pp);
    p.block_tokens = g.block_tokens;
    p.n_layers = g.n_layers;
    p.n_kv_heads = g.n_kv_heads;
    p.head_dim = g.head_dim;
    p.model_id = model_id;
    return p;
}

/* The value of chunk id's row element e at layer, head, K (kv 0) or V (kv 1) and token t: the
 * pattern th_pool_fill writes and th_pool_matches expects. */
typedef float (*th_kv_val_fn)(unsigned id, int layer, int head, int kv, uint32_t t, int e);

/* Writes every row of pool chunk c (all its tokens, in the pool's geometry) with val of id. */
static inline void th_pool_fill(cg_pool *p, cg_pool_chunk *c, th_kv_val_fn val, unsigned id)
{
    const cg_pool_params g = cg_pool_get_params(p);
    const uint32_t n = cg_pool_chunk_tokens(c);
    float *rows = cg_malloc((size_t)n * (size_t)g.head_dim * sizeof(float));
    for (int l = 0; l < g.n_layers; l++)
        for (int h = 0; h < g.n_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++) {
                for (uint32_t t = 0; t < n; t++)
                    for (int e = 0; e < g.head_dim; e++)
                        rows[(size_t)t * (size_t)g.head_dim + (size_t)e] = val(id, l, h, kv, t, e);
                cg_pool_chunk_write(p, c, l, h, kv, rows);
            }
    free(rows);
}

/* 1 when every element of every row of pool chunk c equals val of id, else 0. */
static inline int th_pool_matches(const cg_pool *p, const cg_pool_chunk *c, th_kv_val_fn val,
                                  unsigned id)
{
    const cg_pool_params g = cg_pool_get_params(p);
    const uint32_t n = cg_pool_chunk_tokens(c);
    float *rows = cg_malloc((size_t)n * (size_t)g.head_dim * sizeof(float));
    int ok = 1;
    for (int l = 0; l < g.n_layers && ok; l++)
        for (int h = 0; h < g.n_kv_heads && ok; h++)
            for (int kv = 0; kv < 2 && ok; kv++) {
                cg_pool_chunk_read(p, c, l, h, kv, rows);
                for (uint32_t t = 0; t < n && ok; t++)
                    for (int e = 0; e < g.head_dim; e++)
                        if (rows[(size_t)t * (size_t)g.head_dim + (size_t)e] !=
                            val(id, l, h, kv, t, e))
                            ok = 0;
            }
    free(rows);
    return ok;
}

#endif
