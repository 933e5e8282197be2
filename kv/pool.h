/* KV pool of the worker (DESIGN §8): fixed-size blocks in one allocation, a free list,
 * reference-counted chunks keyed by cg_key, LRU eviction of unreferenced chunks, exact
 * byte accounting. Per-head layout inside a block so any head range is contiguous. */
#ifndef CG_POOL_H
#define CG_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "base/status.h"

typedef struct cg_pool cg_pool;
/* One cached chunk: its key, token count and blocks. Handles are reference-counted. */
typedef struct cg_pool_chunk cg_pool_chunk;

/* Called with the pool lock held, for each chunk about to be evicted, BEFORE its blocks are
 * freed: the data accessors below (tokens/key/bytes/read/rows) may be used on c, no other
 * pool function may be called (it would deadlock). key and c are borrowed for the call. */
typedef void (*cg_pool_evict_fn)(void *ud, const cg_key *key, const cg_pool_chunk *c);

typedef struct cg_pool_params {
    size_t capacity_bytes;     /* default 256 MiB (--pool-mb); rounded down to whole blocks */
    uint32_t block_tokens;     /* default 16 */
    int n_layers;              /* required, > 0 (default 0) */
    int n_kv_heads;            /* required, > 0 (default 0) */
    int head_dim;              /* required, > 0 (default 0) */
    cg_pool_evict_fn on_evict; /* optional, default NULL */
    void *on_evict_ud;
} cg_pool_params;

cg_pool_params cg_pool_default_params(void);

/* Block layout: a block holds block_tokens token slots for every layer and KV head, as
 * floats in [head][layer][K,V][block_tokens][head_dim]. block_bytes is the size of one. */
size_t cg_pool_block_bytes(const cg_pool_params *p);

/* Creates a pool; the block memory is one allocation of capacity_bytes rounded down to
 * block_bytes. Returns CG_E_VALUE when a geometry field is not positive or the capacity
 * holds no block. *out is owned by the caller: cg_pool_close. */
cg_status cg_pool_open(cg_pool_params p, cg_pool **out) CG_WUR;
/* Frees the pool and all chunks; accepts NULL / *pp == NULL, sets *pp to NULL. Every
 * handle must have been released. */
void cg_pool_close(cg_pool **pp);
/* The parameters the pool was opened with (capacity_bytes as rounded). */
cg_pool_params cg_pool_get_params(const cg_pool *p);

/* Keys evicted by an insert, appended in eviction order. Caller-owned; zero-initialise,
 * free with cg_pool_evictions_free. */
typedef struct cg_pool_evictions {
    cg_key *keys;
    size_t n, cap;
} cg_pool_evictions;
void cg_pool_evictions_free(cg_pool_evictions *e);
/* Appends a copy of k (e NULL: nothing). */
void cg_pool_evictions_add(cg_pool_evictions *e, const cg_key *k);

/* Reserves blocks for a new chunk of n_tokens (> 0) and returns it referenced (refs = 1)
 * in the "filling" state: invisible to cg_pool_get until cg_pool_publish. The caller writes
 * its data (cg_pool_chunk_write), then publishes, then releases when done with it. Releasing
 * an unpublished chunk drops it (a failed computation leaves nothing behind).
 * When free blocks are short, unreferenced chunks are evicted in LRU order (on_evict is
 * called for each, then its key is appended to *evicted when evicted is not NULL) until the
 * new chunk fits; nothing is evicted when eviction cannot make it fit.
 * Returns CG_OK; CG_E_CONFLICT when a chunk with this key exists (filling or ready; use
 * cg_pool_get); CG_E_FULL when it cannot fit because the rest is referenced or n_tokens
 * needs more blocks than the pool has: the caller then computes without storing.
 * CG_E_VALUE for n_tokens == 0. */
cg_status cg_pool_insert(cg_pool *p, const cg_key *key, uint32_t n_tokens, uint64_t now,
                         cg_pool_chunk **out, cg_pool_evictions *evicted) CG_WUR;
/* Makes a filling chunk visible to cg_pool_get (its data is complete). */
void cg_pool_publish(cg_pool *p, cg_pool_chunk *c, uint64_t now);

/* Looks a published chunk up and takes a reference (counts a hit); the chunk cannot be
 * evicted until cg_pool_release. Returns CG_OK, or CG_E_NOT_FOUND (counts a miss) when it
 * is absent, still filling, or removed. */
cg_status cg_pool_get(cg_pool *p, const cg_key *key, uint64_t now, cg_pool_chunk **out) CG_WUR;
/* Takes one more reference on a held handle (e.g. a second assembly using it). */
void cg_pool_retain(cg_pool *p, cg_pool_chunk *c);
/* Gives a reference back and sets *c to NULL (accepts NULL). At zero references a
 * published chunk becomes the most recently used evictable chunk (last_used = now); an
 * unpublished or removed chunk is freed. */
void cg_pool_release(cg_pool *p, cg_pool_chunk **c, uint64_t now);

/* Removes a chunk by key. Unreferenced: freed now. Referenced or filling: it leaves the
 * index at once (lookups miss, the key may be inserted again) and its blocks are freed when
 * the last reference is released; *deferred (optional) tells which. on_evict is not called.
 * Returns CG_OK or CG_E_NOT_FOUND. */
cg_status cg_pool_remove(cg_pool *p, const cg_key *key, int *deferred) CG_WUR;

/* Data accessors. They take no lock: a chunk's geometry never changes, and its data is
 * written only by the inserter before publish. c is borrowed (hold a reference). */
uint32_t cg_pool_chunk_tokens(const cg_pool_chunk *c);
const cg_key *cg_pool_chunk_key(const cg_pool_chunk *c);
/* Bytes the chunk occupies in the pool: its blocks * block_bytes. */
size_t cg_pool_chunk_bytes(const cg_pool *p, const cg_pool_chunk *c);
uint32_t cg_pool_chunk_blocks(const cg_pool_chunk *c);
/* Copies rows [n_tokens][head_dim] (contiguous) into the chunk's K (kv 0) or V (kv 1) of
 * one layer and KV head. */
void cg_pool_chunk_write(cg_pool *p, cg_pool_chunk *c, int layer, int head, int kv,
                         const float *rows);
/* Copies the chunk's rows of one layer/head/kv out to rows_out[n_tokens][head_dim]. */
void cg_pool_chunk_read(const cg_pool *p, const cg_pool_chunk *c, int layer, int head, int kv,
                        float *rows_out);
/* Zero-copy view of block block_idx (< cg_pool_chunk_blocks): returns its rows of one
 * layer/head/kv, [*n_rows][head_dim] contiguous; *n_rows is block_tokens except in the last
 * block. Borrowed pointer, valid while the chunk is referenced. */
const float *cg_pool_chunk_rows(const cg_pool *p, const cg_pool_chunk *c, uint32_t block_idx,
                                int layer, int head, int kv, uint32_t *n_rows);

/* Writable view of the whole block block_idx (< cg_pool_chunk_blocks) of a chunk that is
 * still filling (between cg_pool_insert and cg_pool_publish): cg_pool_block_bytes bytes in
 * the block layout above, for restoring a chunk's blocks as they were saved (disk tier).
 * Borrowed pointer, valid while the chunk is referenced. */
void *cg_pool_chunk_block(cg_pool *p, cg_pool_chunk *c, uint32_t block_idx);

/* Inventory of published chunks (removed and filling ones are not listed). */
typedef struct cg_pool_chunk_info {
    cg_key key;
    uint32_t tokens;
    size_t bytes;       /* blocks * block_bytes */
    uint64_t last_used; /* the now of the last insert/publish/get/release */
    uint32_t refs;
} cg_pool_chunk_info;
/* Calls fn once per published chunk, with the pool lock held (fn must not call the pool).
 * info is borrowed for the call. */
void cg_pool_foreach(cg_pool *p, void (*fn)(void *ud, const cg_pool_chunk_info *info), void *ud);
/* Info on one published chunk without taking a reference or counting a hit/miss.
 * Returns CG_OK or CG_E_NOT_FOUND. */
cg_status cg_pool_peek(cg_pool *p, const cg_key *key, cg_pool_chunk_info *out) CG_WUR;

typedef struct cg_pool_stats {
    size_t capacity_bytes; /* blocks_total * block_bytes */
    size_t block_bytes;
    size_t blocks_total, blocks_free;
    size_t bytes_used;        /* (blocks_total - blocks_free) * block_bytes */
    size_t chunks;            /* chunks holding blocks: published, filling, removal pending */
    size_t referenced_chunks; /* chunks with refs > 0 */
    uint64_t evictions, inserts, hits, misses;
    uint64_t full; /* inserts refused with CG_E_FULL */
} cg_pool_stats;
cg_pool_stats cg_pool_get_stats(cg_pool *p);

/* Checks every internal invariant (block ownership and counts, free list, LRU, index);
 * returns CG_OK or CG_E_INTERNAL (and logs what broke). For tests; O(blocks + chunks). */
cg_status cg_pool_check(cg_pool *p) CG_WUR;

#endif
