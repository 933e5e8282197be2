/* KV pool: block allocator with a free list, reference-counted chunks, LRU eviction. */
#include "kv/pool.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/list.h"
#include "base/map.h"

struct cg_pool_chunk {
    cg_key key;
    uint32_t n_tokens, n_blocks;
    uint32_t *blocks; /* block ids, in token order */
    uint32_t refs;
    int published; /* data complete, visible to lookups */
    int detached;  /* removed from the index; freed at the last release */
    uint64_t last_used;
    /* p->lru: exactly the published, indexed chunks with refs == 0 (head = oldest). */
    cg_link lru_link;
    cg_map_node index_node; /* p->index: every chunk that is not detached, by key */
    cg_link all_link;       /* p->all: every live chunk, for cg_pool_check */
};

struct cg_pool {
    cg_pool_params params;
    size_t block_bytes, block_floats, head_floats; /* head_floats: one [bt][hd] slab */
    size_t blocks_total;
    float *data;
    uint32_t *free_stack; /* ids of free blocks; top at n_free - 1 */
    size_t n_free;
    uint32_t *block_refs; /* owners per block: 0 free, 1 owned by one chunk */
    cg_map index;         /* cg_pool_chunk by index_node, keyed by key */
    cg_list lru;          /* cg_pool_chunk by lru_link */
    size_t lru_blocks;    /* blocks an eviction of the whole LRU list would free */
    cg_list all;          /* cg_pool_chunk by all_link */
    size_t n_chunks, n_referenced;
    uint64_t evictions, inserts, hits, misses, full;
    pthread_mutex_t mu;
};

cg_pool_params cg_pool_default_params(void)
{
    return (cg_pool_params){
        .capacity_bytes = (size_t)256 << 20,
        .block_tokens = 16,
    };
}

size_t cg_pool_block_bytes(const cg_pool_params *p)
{
    if (p->n_layers <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0 || p->block_tokens == 0)
        return 0;
    return (size_t)p->n_kv_heads * (size_t)p->n_layers * 2 * p->block_tokens * (size_t)p->head_dim *
           sizeof(float);
}

cg_status cg_pool_open(cg_pool_params params, cg_pool **out)
{
    *out = NULL;
    size_t bb = cg_pool_block_bytes(&params);
    if (bb == 0 || params.capacity_bytes / bb == 0 || params.capacity_bytes / bb > UINT32_MAX)
        return CG_E_VALUE;
    cg_pool *p = cg_calloc(1, sizeof *p);
    p->block_bytes = bb;
    p->block_floats = bb / sizeof(float);
    p->head_floats = (size_t)params.block_tokens * (size_t)params.head_dim;
    p->blocks_total = params.capacity_bytes / bb;
    params.capacity_bytes = p->blocks_total * bb;
    p->params = params;
    p->data = cg_malloc(p->blocks_total * bb);
    p->free_stack = cg_malloc(p->blocks_total * sizeof(uint32_t));
    p->block_refs = cg_calloc(p->blocks_total, sizeof(uint32_t));
    /* Pushed in reverse so the first allocations take the low blocks. */
    for (size_t i = 0; i < p->blocks_total; i++)
        p->free_stack[i] = (uint32_t)(p->blocks_total - 1 - i);
    p->n_free = p->blocks_total;
    CG_MAP_INIT(&p->index, cg_pool_chunk, index_node, key);
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return CG_OK;
}

static void chunk_free(cg_pool *p, cg_pool_chunk *c)
{
    for (uint32_t i = 0; i < c->n_blocks; i++) {
        uint32_t b = c->blocks[i];
        assert(p->block_refs[b] > 0);
        if (--p->block_refs[b] == 0) p->free_stack[p->n_free++] = b;
    }
    cg_list_remove(&p->all, &c->all_link);
    p->n_chunks--;
    free(c->blocks);
    free(c);
}

void cg_pool_close(cg_pool **pp)
{
    cg_pool *p = *pp;
    if (!p) return;
    while (!cg_list_empty(&p->all))
        chunk_free(p, CG_LIST_ENTRY(p->all.head, cg_pool_chunk, all_link));
    pthread_mutex_destroy(&p->mu);
    cg_map_free(&p->index);
    free(p->block_refs);
    free(p->free_stack);
    free(p->data);
    free(p);
    *pp = NULL;
}

cg_pool_params cg_pool_get_params(const cg_pool *p)
{
    return p->params;
}

void cg_pool_evictions_free(cg_pool_evictions *e)
{
    cg_free(&e->keys);
    e->n = e->cap = 0;
}

/* ---- index ---- */

static cg_pool_chunk *index_find(const cg_pool *p, const cg_key *k)
{
    cg_map_node *n = cg_map_find(&p->index, k);
    return n ? CG_MAP_ENTRY(n, cg_pool_chunk, index_node) : NULL;
}

/* ---- LRU ---- */

static void lru_push(cg_pool *p, cg_pool_chunk *c)
{
    cg_list_push_back(&p->lru, &c->lru_link);
    p->lru_blocks += c->n_blocks;
}

static void lru_unlink(cg_pool *p, cg_pool_chunk *c)
{
    cg_list_remove(&p->lru, &c->lru_link);
    p->lru_blocks -= c->n_blocks;
}

void cg_pool_evictions_add(cg_pool_evictions *e, const cg_key *k)
{
    if (!e) return;
    if (e->n == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 8;
        e->keys = cg_realloc(e->keys, e->cap * sizeof *e->keys);
    }
    e->keys[e->n++] = *k;
}

/* Evicts the least recently used unreferenced chunk. Lock held. */
static void evict_one(cg_pool *p, cg_pool_evictions *evicted)
{
    assert(!cg_list_empty(&p->lru));
    cg_pool_chunk *c = CG_LIST_ENTRY(p->lru.head, cg_pool_chunk, lru_link);
    assert(c->refs == 0 && c->published && !c->detached);
    /* The callback sees the data before the blocks go back to the free list. */
    if (p->params.on_evict) p->params.on_evict(p->params.on_evict_ud, &c->key, c);
    if (evicted) cg_pool_evictions_add(evicted, &c->key);
    lru_unlink(p, c);
    cg_map_remove(&p->index, &c->index_node);
    p->evictions++;
    chunk_free(p, c);
}

cg_status cg_pool_insert(cg_pool *p, const cg_key *key, uint32_t n_tokens, uint64_t now,
                         cg_pool_chunk **out, cg_pool_evictions *evicted)
{
    *out = NULL;
    if (n_tokens == 0) return CG_E_VALUE;
    cg_status st = CG_OK;
    size_t need = ((size_t)n_tokens + p->params.block_tokens - 1) / p->params.block_tokens;
    pthread_mutex_lock(&p->mu);
    if (index_find(p, key)) {
        st = CG_E_CONFLICT;
        goto out;
    }
    /* Evict only when it will succeed: a refused insert leaves the pool as it was. */
    if (need > p->blocks_total || p->n_free + p->lru_blocks < need) {
        p->full++;
        st = CG_E_FULL;
        goto out;
    }
    while (p->n_free < need)
        evict_one(p, evicted);

    cg_pool_chunk *c = cg_calloc(1, sizeof *c);
    c->key = *key;
    c->n_tokens = n_tokens;
    c->n_blocks = (uint32_t)need;
    c->blocks = cg_malloc(need * sizeof(uint32_t));
    for (size_t i = 0; i < need; i++) {
        uint32_t b = p->free_stack[--p->n_free];
        assert(p->block_refs[b] == 0);
        p->block_refs[b] = 1;
        c->blocks[i] = b;
    }
    c->refs = 1;
    c->last_used = now;
    cg_list_push_back(&p->all, &c->all_link);
    p->n_chunks++;
    p->n_referenced++;
    p->inserts++;
    cg_map_add(&p->index, &c->index_node);
    *out = c;
out:
    pthread_mutex_unlock(&p->mu);
    return st;
}

void cg_pool_publish(cg_pool *p, cg_pool_chunk *c, uint64_t now)
{
    pthread_mutex_lock(&p->mu);
    assert(c->refs > 0);
    c->published = 1;
    c->last_used = now;
    pthread_mutex_unlock(&p->mu);
}

static void take_ref(cg_pool *p, cg_pool_chunk *c)
{
    if (c->refs++ == 0) {
        lru_unlink(p, c);
        p->n_referenced++;
    }
}

cg_status cg_pool_get(cg_pool *p, const cg_key *key, uint64_t now, cg_pool_chunk **out)
{
    cg_status st = CG_OK;
    *out = NULL;
    pthread_mutex_lock(&p->mu);
    cg_pool_chunk *c = index_find(p, key);
    if (!c || !c->published) {
        p->misses++;
        st = CG_E_NOT_FOUND;
        goto out;
    }
    take_ref(p, c);
    c->last_used = now;
    p->hits++;
    *out = c;
out:
    pthread_mutex_unlock(&p->mu);
    return st;
}

void cg_pool_retain(cg_pool *p, cg_pool_chunk *c)
{
    pthread_mutex_lock(&p->mu);
    assert(c->refs > 0);
    take_ref(p, c);
    pthread_mutex_unlock(&p->mu);
}

void cg_pool_release(cg_pool *p, cg_pool_chunk **cp, uint64_t now)
{
    cg_pool_chunk *c = *cp;
    if (!c) return;
    *cp = NULL;
    pthread_mutex_lock(&p->mu);
    assert(c->refs > 0);
    if (--c->refs == 0) {
        p->n_referenced--;
        if (c->detached) {
            chunk_free(p, c);
        } else if (!c->published) {
            cg_map_remove(&p->index, &c->index_node);
            chunk_free(p, c);
        } else {
            c->last_used = now;
            lru_push(p, c);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

cg_status cg_pool_remove(cg_pool *p, const cg_key *key, int *deferred)
{
    cg_status st = CG_OK;
    int later = 0;
    pthread_mutex_lock(&p->mu);
    cg_pool_chunk *c = index_find(p, key);
    if (!c) {
        st = CG_E_NOT_FOUND;
        goto out;
    }
    cg_map_remove(&p->index, &c->index_node);
    if (c->refs == 0) {
        lru_unlink(p, c);
        chunk_free(p, c);
    } else {
        c->detached = 1;
        later = 1;
    }
out:
    pthread_mutex_unlock(&p->mu);
    if (deferred) *deferred = later;
    return st;
}

/* ---- data ---- */

uint32_t cg_pool_chunk_tokens(const cg_pool_chunk *c)
{
    return c->n_tokens;
}
const cg_key *cg_pool_chunk_key(const cg_pool_chunk *c)
{
    return &c->key;
}
uint32_t cg_pool_chunk_blocks(const cg_pool_chunk *c)
{
    return c->n_blocks;
}

size_t cg_pool_chunk_bytes(const cg_pool *p, const cg_pool_chunk *c)
{
    return (size_t)c->n_blocks * p->block_bytes;
}

/* Start of the [block_tokens][head_dim] slab of (layer, head, kv) in block b. */
static float *slab(const cg_pool *p, uint32_t b, int layer, int head, int kv)
{
    assert(layer >= 0 && layer < p->params.n_layers);
    assert(head >= 0 && head < p->params.n_kv_heads);
    assert(kv == 0 || kv == 1);
    size_t i = ((size_t)head * (size_t)p->params.n_layers + (size_t)layer) * 2 + (size_t)kv;
    return p->data + (size_t)b * p->block_floats + i * p->head_floats;
}

static uint32_t rows_in_block(const cg_pool *p, const cg_pool_chunk *c, uint32_t i)
{
    uint32_t bt = p->params.block_tokens;
    return i + 1 < c->n_blocks ? bt : c->n_tokens - i * bt;
}

void cg_pool_chunk_write(cg_pool *p, cg_pool_chunk *c, int layer, int head, int kv,
                         const float *rows)
{
    size_t hd = (size_t)p->params.head_dim;
    for (uint32_t i = 0; i < c->n_blocks; i++) {
        uint32_t n = rows_in_block(p, c, i);
        memcpy(slab(p, c->blocks[i], layer, head, kv), rows, n * hd * sizeof(float));
        rows += n * hd;
    }
}

void cg_pool_chunk_read(const cg_pool *p, const cg_pool_chunk *c, int layer, int head, int kv,
                        float *rows_out)
{
    size_t hd = (size_t)p->params.head_dim;
    for (uint32_t i = 0; i < c->n_blocks; i++) {
        uint32_t n = rows_in_block(p, c, i);
        memcpy(rows_out, slab(p, c->blocks[i], layer, head, kv), n * hd * sizeof(float));
        rows_out += n * hd;
    }
}

const float *cg_pool_chunk_rows(const cg_pool *p, const cg_pool_chunk *c, uint32_t block_idx,
                                int layer, int head, int kv, uint32_t *n_rows)
{
    assert(block_idx < c->n_blocks);
    *n_rows = rows_in_block(p, c, block_idx);
    return slab(p, c->blocks[block_idx], layer, head, kv);
}

void *cg_pool_chunk_block(cg_pool *p, cg_pool_chunk *c, uint32_t block_idx)
{
    assert(block_idx < c->n_blocks);
    assert(!c->published && c->refs > 0); /* only the inserter writes, before publish */
    return p->data + (size_t)c->blocks[block_idx] * p->block_floats;
}

/* ---- inventory, stats, invariants ---- */

static cg_pool_chunk_info info_of(const cg_pool *p, const cg_pool_chunk *c)
{
    return (cg_pool_chunk_info){.key = c->key,
                                .tokens = c->n_tokens,
                                .bytes = (size_t)c->n_blocks * p->block_bytes,
                                .last_used = c->last_used,
                                .refs = c->refs};
}

void cg_pool_foreach(cg_pool *p, void (*fn)(void *ud, const cg_pool_chunk_info *info), void *ud)
{
    pthread_mutex_lock(&p->mu);
    cg_map_iter it = cg_map_iter_start(&p->index);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        const cg_pool_chunk *c = CG_MAP_ENTRY(n, cg_pool_chunk, index_node);
        if (!c->published) continue;
        cg_pool_chunk_info info = info_of(p, c);
        fn(ud, &info);
    }
    pthread_mutex_unlock(&p->mu);
}

cg_status cg_pool_peek(cg_pool *p, const cg_key *key, cg_pool_chunk_info *out)
{
    cg_status st = CG_E_NOT_FOUND;
    pthread_mutex_lock(&p->mu);
    cg_pool_chunk *c = index_find(p, key);
    if (c && c->published) {
        *out = info_of(p, c);
        st = CG_OK;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

cg_pool_stats cg_pool_get_stats(cg_pool *p)
{
    pthread_mutex_lock(&p->mu);
    cg_pool_stats s = {
        .capacity_bytes = p->blocks_total * p->block_bytes,
        .block_bytes = p->block_bytes,
        .blocks_total = p->blocks_total,
        .blocks_free = p->n_free,
        .bytes_used = (p->blocks_total - p->n_free) * p->block_bytes,
        .chunks = p->n_chunks,
        .referenced_chunks = p->n_referenced,
        .evictions = p->evictions,
        .inserts = p->inserts,
        .hits = p->hits,
        .misses = p->misses,
        .full = p->full,
    };
    pthread_mutex_unlock(&p->mu);
    return s;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            cg_log(CG_LOG_ERROR, "pool invariant broken: %s", #cond);                              \
            st = CG_E_INTERNAL;                                                                    \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

cg_status cg_pool_check(cg_pool *p)
{
    cg_status st = CG_OK;
    uint32_t *owners = cg_calloc(p->blocks_total, sizeof(uint32_t));
    pthread_mutex_lock(&p->mu);
    CHECK(p->n_free <= p->blocks_total);
    for (size_t i = 0; i < p->n_free; i++) {
        uint32_t b = p->free_stack[i];
        CHECK(b < p->blocks_total);
        CHECK(p->block_refs[b] == 0);
        CHECK(owners[b] == 0);
        owners[b] = UINT32_MAX; /* marks "on the free list" to catch duplicates */
    }
    size_t n_chunks = 0, n_ref = 0, n_idx = 0, lru_expect = 0, lru_blocks_expect = 0;
    for (cg_link *k = p->all.head; k; k = k->next) {
        cg_pool_chunk *c = CG_LIST_ENTRY(k, cg_pool_chunk, all_link);
        n_chunks++;
        n_ref += c->refs > 0;
        CHECK(c->n_blocks == (c->n_tokens + p->params.block_tokens - 1) / p->params.block_tokens);
        for (uint32_t i = 0; i < c->n_blocks; i++) {
            uint32_t b = c->blocks[i];
            CHECK(b < p->blocks_total);
            CHECK(owners[b] == 0); /* neither free nor owned by another chunk */
            owners[b] = 1;
            CHECK(p->block_refs[b] == 1);
        }
        CHECK(!c->detached || c->refs > 0); /* a detached chunk lives only while held */
        CHECK(c->published || c->refs > 0); /* a filling chunk is held by its inserter */
        if (!c->detached) {
            CHECK(index_find(p, &c->key) == c);
            n_idx++;
        }
        if (c->refs == 0) {
            lru_expect++;
            lru_blocks_expect += c->n_blocks;
        }
    }
    for (size_t b = 0; b < p->blocks_total; b++)
        CHECK(owners[b] != 0); /* no block leaked */
    CHECK(n_chunks == p->n_chunks);
    CHECK(n_ref == p->n_referenced);
    CHECK(n_idx == cg_map_count(&p->index));
    size_t lru_n = 0, lru_b = 0;
    for (cg_link *k = p->lru.head, *prev = NULL; k; prev = k, k = k->next) {
        cg_pool_chunk *c = CG_LIST_ENTRY(k, cg_pool_chunk, lru_link);
        CHECK(k->prev == prev);
        CHECK(c->refs == 0 && c->published && !c->detached);
        lru_n++;
        lru_b += c->n_blocks;
        if (!k->next) CHECK(p->lru.tail == k);
    }
    CHECK(lru_n == lru_expect);
    CHECK(lru_b == lru_blocks_expect && lru_b == p->lru_blocks);
out:
    pthread_mutex_unlock(&p->mu);
    free(owners);
    return st;
}
