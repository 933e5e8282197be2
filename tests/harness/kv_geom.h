/* The KV geometry of a test's or bench's RAM pool and disk tier, said once: the parameters of
 * both tiers follow from it, the disk tier's block_bytes as the pool computes them. Header only
 * (no th_ library to link), so the fuzz targets and the kernel benches use it too. */
#ifndef CG_TEST_KV_GEOM_H
#define CG_TEST_KV_GEOM_H

#include <stddef.h>
#include <stdint.h>

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

#endif
