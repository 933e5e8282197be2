/* Tests for the KV pool: round trips, layout, exact accounting, LRU order, references that
 * block eviction, the eviction callback, removal, randomized invariants, two threads. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kv/pool.h"
#include "tests/harness/harness.h"
#include "tests/harness/kv_geom.h"

/* Geometry used throughout: block = 3 heads * 2 layers * 2 * 4 tokens * 4 dims floats. */
#define LAYERS 2
#define HEADS 3
#define HD 4
#define BT 4
#define BLOCK_BYTES ((size_t)HEADS * LAYERS * 2 * BT * HD * sizeof(float))

static cg_pool *open_pool(size_t n_blocks, cg_pool_evict_fn fn, void *ud)
{
    cg_pool_params pp = th_pool_params((th_kv_geom){LAYERS, HEADS, HD, BT}, n_blocks * BLOCK_BYTES);
    pp.on_evict = fn;
    pp.on_evict_ud = ud;
    cg_pool *p = NULL;
    ck_assert_int_eq(cg_pool_open(pp, &p), CG_OK);
    return p;
}

static cg_key key_of(unsigned id)
{
    cg_key k;
    memset(&k, 0, sizeof k);
    /* Spread ids over the first bytes (bucket hash) and keep them recoverable. */
    k.b[0] = (uint8_t)(id * 37u);
    k.b[8] = (uint8_t)id;
    k.b[9] = (uint8_t)(id >> 8);
    return k;
}

static unsigned id_of(const cg_key *k)
{
    return k->b[8] | (unsigned)k->b[9] << 8;
}

/* Integer-valued floats (< 2^24): exact to compare. */
static float pattern(unsigned id, int layer, int head, int kv, uint32_t t, int e)
{
    return (float)((((((id % 997u) * LAYERS + (unsigned)layer) * HEADS + (unsigned)head) * 2 +
                     (unsigned)kv) *
                        8u +
                    t % 8u) *
                       HD +
                   (unsigned)e);
}

static cg_pool_chunk *insert_filled(cg_pool *p, unsigned id, uint32_t tokens, uint64_t now,
                                    cg_pool_evictions *ev)
{
    cg_key k = key_of(id);
    cg_pool_chunk *c = NULL;
    ck_assert_int_eq(cg_pool_insert(p, &k, tokens, now, &c, ev), CG_OK);
    ck_assert_ptr_nonnull(c);
    th_pool_fill(p, c, pattern, id);
    cg_pool_publish(p, c, now);
    return c;
}

static void assert_accounting(cg_pool *p)
{
    ck_assert_int_eq(cg_pool_check(p), CG_OK);
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.block_bytes, BLOCK_BYTES);
    ck_assert_uint_eq(s.bytes_used, (s.blocks_total - s.blocks_free) * s.block_bytes);
    ck_assert_uint_le(s.blocks_free, s.blocks_total);
    ck_assert_uint_eq(s.capacity_bytes, s.blocks_total * s.block_bytes);
}

/* The end of a test: frees the evictions list, checks the accounting, closes the pool. */
static void close_checked(cg_pool **p, cg_pool_evictions *ev)
{
    cg_pool_evictions_free(ev);
    assert_accounting(*p);
    cg_pool_close(p);
}

static int has_key(const cg_pool *p, unsigned id)
{
    cg_pool_chunk_info info;
    cg_key k = key_of(id);
    return cg_pool_peek((cg_pool *)p, &k, &info) == CG_OK;
}

START_TEST(test_params)
{
    cg_pool_params pp = cg_pool_default_params();
    ck_assert_uint_eq(pp.block_tokens, 16);
    cg_pool *p = NULL;
    ck_assert_int_eq(cg_pool_open(pp, &p), CG_E_VALUE); /* geometry missing */
    ck_assert_ptr_null(p);
    pp.n_layers = LAYERS, pp.n_kv_heads = HEADS, pp.head_dim = HD, pp.block_tokens = BT;
    ck_assert_uint_eq(cg_pool_block_bytes(&pp), BLOCK_BYTES);
    pp.capacity_bytes = BLOCK_BYTES - 1;
    ck_assert_int_eq(cg_pool_open(pp, &p), CG_E_VALUE);
    pp.capacity_bytes = 5 * BLOCK_BYTES + 7; /* rounded down to 5 blocks */
    ck_assert_int_eq(cg_pool_open(pp, &p), CG_OK);
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.blocks_total, 5);
    ck_assert_uint_eq(s.blocks_free, 5);
    ck_assert_uint_eq(s.capacity_bytes, 5 * BLOCK_BYTES);
    ck_assert_uint_eq(cg_pool_get_params(p).capacity_bytes, 5 * BLOCK_BYTES);
    cg_pool_close(&p);
    ck_assert_ptr_null(p);
    cg_pool_close(&p); /* NULL is fine */
}
END_TEST

START_TEST(test_round_trip_and_layout)
{
    cg_pool *p = open_pool(10, NULL, NULL);
    cg_pool_chunk *c = insert_filled(p, 1, 10, 1, NULL); /* 3 blocks: 4 + 4 + 2 rows */
    ck_assert_uint_eq(cg_pool_chunk_tokens(c), 10);
    ck_assert_uint_eq(cg_pool_chunk_blocks(c), 3);
    ck_assert_uint_eq(cg_pool_chunk_bytes(p, c), 3 * BLOCK_BYTES);
    ck_assert_uint_eq(id_of(cg_pool_chunk_key(c)), 1);
    ck_assert(th_pool_matches(p, c, pattern, 1));
    ck_assert(!th_pool_matches(p, c, pattern, 2)); /* the comparison can fail */

    /* Zero-copy rows equal the written rows, block by block. */
    for (int l = 0; l < LAYERS; l++)
        for (int h = 0; h < HEADS; h++)
            for (int kv = 0; kv < 2; kv++) {
                uint32_t t = 0;
                for (uint32_t b = 0; b < 3; b++) {
                    uint32_t n = 0;
                    const float *r = cg_pool_chunk_rows(p, c, b, l, h, kv, &n);
                    ck_assert_uint_eq(n, b < 2 ? 4 : 2);
                    for (uint32_t i = 0; i < n; i++, t++)
                        for (int e = 0; e < HD; e++)
                            ck_assert(r[i * HD + e] == pattern(1, l, h, kv, t, e));
                }
                ck_assert_uint_eq(t, 10);
            }
    /* Per-head layout [head][layer][K,V][bt][hd]: a head's data is one contiguous run. */
    uint32_t n;
    const float *h0 = cg_pool_chunk_rows(p, c, 0, 0, 0, 0, &n);
    ck_assert_ptr_eq(cg_pool_chunk_rows(p, c, 0, 0, 0, 1, &n), h0 + BT * HD);
    ck_assert_ptr_eq(cg_pool_chunk_rows(p, c, 0, 1, 0, 0, &n), h0 + 2 * BT * HD);
    ck_assert_ptr_eq(cg_pool_chunk_rows(p, c, 0, 0, 1, 0, &n), h0 + LAYERS * 2 * BT * HD);
    cg_pool_release(p, &c, 2);
    ck_assert_ptr_null(c);
    assert_accounting(p);
    cg_pool_close(&p);
}
END_TEST

START_TEST(test_accounting)
{
    cg_pool *p = open_pool(10, NULL, NULL);
    cg_pool_chunk *a = insert_filled(p, 1, 9, 1, NULL);  /* 3 blocks */
    cg_pool_chunk *b = insert_filled(p, 2, 4, 1, NULL);  /* 1 block */
    cg_pool_chunk *c = insert_filled(p, 3, 13, 1, NULL); /* 4 blocks */
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.blocks_free, 2);
    ck_assert_uint_eq(s.bytes_used, 8 * BLOCK_BYTES);
    ck_assert_uint_eq(s.chunks, 3);
    ck_assert_uint_eq(s.referenced_chunks, 3);
    ck_assert_uint_eq(s.inserts, 3);
    assert_accounting(p);
    cg_pool_release(p, &a, 2);
    cg_pool_release(p, &b, 2);
    s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.referenced_chunks, 1);
    ck_assert_uint_eq(s.bytes_used, 8 * BLOCK_BYTES); /* released chunks stay cached */
    int deferred = -1;
    cg_key k2 = key_of(2);
    ck_assert_int_eq(cg_pool_remove(p, &k2, &deferred), CG_OK);
    ck_assert_int_eq(deferred, 0);
    ck_assert_int_eq(cg_pool_remove(p, &k2, &deferred), CG_E_NOT_FOUND);
    s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.bytes_used, 7 * BLOCK_BYTES);
    ck_assert_uint_eq(s.chunks, 2);
    /* 5 blocks needed, 3 free: evicts a (3 blocks, unreferenced), keeps c (held). */
    cg_pool_evictions ev = {0};
    cg_pool_chunk *d = insert_filled(p, 4, 20, 3, &ev);
    ck_assert_uint_eq(ev.n, 1);
    ck_assert_uint_eq(id_of(&ev.keys[0]), 1);
    s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.evictions, 1);
    ck_assert_uint_eq(s.blocks_free, 1);
    ck_assert_uint_eq(s.bytes_used, 9 * BLOCK_BYTES);
    ck_assert_uint_eq(s.bytes_used, cg_pool_chunk_bytes(p, c) + cg_pool_chunk_bytes(p, d));
    assert_accounting(p);
    cg_pool_release(p, &c, 4);
    cg_pool_release(p, &d, 4);
    close_checked(&p, &ev);
}
END_TEST

START_TEST(test_lru_order)
{
    cg_pool *p = open_pool(10, NULL, NULL);
    cg_pool_chunk *a = insert_filled(p, 1, 12, 1, NULL); /* 3 blocks each */
    cg_pool_chunk *b = insert_filled(p, 2, 12, 1, NULL);
    cg_pool_chunk *c = insert_filled(p, 3, 12, 1, NULL);
    cg_pool_release(p, &b, 10); /* LRU: b a c */
    cg_pool_release(p, &a, 11);
    cg_pool_release(p, &c, 12);
    cg_key ka = key_of(1);
    ck_assert_int_eq(cg_pool_get(p, &ka, 13, &a), CG_OK); /* touch a: b c a */
    ck_assert(th_pool_matches(p, a, pattern, 1));
    cg_pool_release(p, &a, 14);
    cg_pool_evictions ev = {0};
    cg_pool_chunk *d = insert_filled(p, 4, 12, 15, &ev); /* free 1 -> evicts b */
    ck_assert_uint_eq(ev.n, 1);
    ck_assert_uint_eq(id_of(&ev.keys[0]), 2);
    cg_pool_release(p, &d, 16);                          /* c a d */
    cg_pool_chunk *e = insert_filled(p, 5, 24, 17, &ev); /* 6 blocks, free 1 -> c, a */
    ck_assert_uint_eq(ev.n, 3);
    ck_assert_uint_eq(id_of(&ev.keys[1]), 3);
    ck_assert_uint_eq(id_of(&ev.keys[2]), 1);
    ck_assert(has_key(p, 4) && has_key(p, 5) && !has_key(p, 1) && !has_key(p, 2) && !has_key(p, 3));
    cg_pool_chunk_info info;
    cg_key kd = key_of(4);
    ck_assert_int_eq(cg_pool_peek(p, &kd, &info), CG_OK);
    ck_assert_uint_eq(info.last_used, 16);
    ck_assert_uint_eq(info.refs, 0);
    cg_pool_release(p, &e, 18);
    close_checked(&p, &ev);
}
END_TEST

START_TEST(test_referenced_never_evicted)
{
    cg_pool *p = open_pool(10, NULL, NULL);
    cg_pool_chunk *held = NULL;
    for (unsigned id = 0; id < 10; id++) {
        cg_pool_chunk *c = insert_filled(p, id, 4, id, NULL);
        if (id == 3)
            held = c;
        else
            cg_pool_release(p, &c, id);
    }
    ck_assert_uint_eq(cg_pool_get_stats(p).blocks_free, 0);
    cg_pool_chunk *hold[10] = {0};
    for (unsigned id = 10; id < 19; id++)
        hold[id - 10] = insert_filled(p, id, 4, id, NULL);
    ck_assert(has_key(p, 3));
    for (unsigned id = 0; id < 10; id++)
        if (id != 3) ck_assert(!has_key(p, id));
    ck_assert(th_pool_matches(p, held, pattern, 3));
    /* Everything is referenced now: no room, and nothing changes. */
    cg_key k = key_of(50);
    cg_pool_chunk *c = NULL;
    cg_pool_evictions ev = {0};
    ck_assert_int_eq(cg_pool_insert(p, &k, 1, 30, &c, &ev), CG_E_FULL);
    ck_assert_ptr_null(c);
    ck_assert_uint_eq(ev.n, 0);
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.full, 1);
    ck_assert_uint_eq(s.referenced_chunks, 10);
    /* One released chunk frees exactly its room: a 1-block insert then succeeds. */
    cg_pool_release(p, &hold[4], 31);
    ck_assert_int_eq(cg_pool_insert(p, &k, 4, 32, &c, &ev), CG_OK);
    ck_assert_uint_eq(ev.n, 1);
    ck_assert_uint_eq(id_of(&ev.keys[0]), 14);
    /* A 2-block insert cannot fit without evicting referenced chunks: refused, no eviction. */
    cg_key k2 = key_of(51);
    cg_pool_chunk *c2 = NULL;
    ck_assert_int_eq(cg_pool_insert(p, &k2, 5, 33, &c2, &ev), CG_E_FULL);
    ck_assert_uint_eq(ev.n, 1);
    cg_pool_release(p, &c, 34); /* unpublished: dropped */
    ck_assert(!has_key(p, 50));
    for (int i = 0; i < 9; i++)
        cg_pool_release(p, &hold[i], 35);
    cg_pool_release(p, &held, 35);
    close_checked(&p, &ev);
}
END_TEST

typedef struct evict_log {
    unsigned ids[64];
    int data_ok[64];
    size_t n;
    cg_pool *pool;
} evict_log;

static void on_evict(void *ud, const cg_key *key, const cg_pool_chunk *c)
{
    evict_log *log = ud;
    unsigned id = id_of(key);
    log->ids[log->n] = id;
    log->data_ok[log->n] =
        cg_key_equal(key, cg_pool_chunk_key(c)) && th_pool_matches(log->pool, c, pattern, id);
    log->n++;
}

START_TEST(test_evict_callback)
{
    evict_log log = {.n = 0};
    cg_pool *p = open_pool(4, on_evict, &log);
    log.pool = p;
    for (unsigned id = 1; id <= 4; id++) {
        cg_pool_chunk *c = insert_filled(p, id, 3, id, NULL);
        cg_pool_release(p, &c, id);
    }
    /* 3 blocks: evicts 1, 2, 3; each seen with its data intact before the blocks are reused. */
    cg_pool_chunk *c = insert_filled(p, 9, 12, 10, NULL);
    ck_assert_uint_eq(log.n, 3);
    for (size_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(log.ids[i], i + 1);
        ck_assert(log.data_ok[i]);
    }
    cg_pool_release(p, &c, 11);
    /* cg_pool_remove is not an eviction: no callback. */
    cg_key k9 = key_of(9);
    ck_assert_int_eq(cg_pool_remove(p, &k9, NULL), CG_OK);
    ck_assert_uint_eq(log.n, 3);
    assert_accounting(p);
    cg_pool_close(&p);
}
END_TEST

START_TEST(test_too_big)
{
    cg_pool *p = open_pool(4, NULL, NULL);
    cg_pool_chunk *a = insert_filled(p, 1, 4, 1, NULL);
    cg_pool_release(p, &a, 1);
    cg_key k = key_of(2);
    cg_pool_chunk *c = NULL;
    cg_pool_evictions ev = {0};
    ck_assert_int_eq(cg_pool_insert(p, &k, 4 * BT + 1, 2, &c, &ev), CG_E_FULL);
    ck_assert_uint_eq(ev.n, 0); /* nothing evicted for a hopeless insert */
    ck_assert(has_key(p, 1));
    ck_assert_int_eq(cg_pool_insert(p, &k, 0, 2, &c, &ev), CG_E_VALUE);
    ck_assert_int_eq(cg_pool_insert(p, &k, 4 * BT, 2, &c, &ev), CG_OK); /* exactly full fits */
    ck_assert_uint_eq(ev.n, 1);
    cg_pool_release(p, &c, 3);
    close_checked(&p, &ev);
}
END_TEST

START_TEST(test_filling_and_remove)
{
    cg_pool *p = open_pool(8, NULL, NULL);
    cg_key k = key_of(7);
    cg_pool_chunk *c = NULL, *g = NULL, *dup = NULL;
    ck_assert_int_eq(cg_pool_insert(p, &k, 5, 1, &c, NULL), CG_OK);
    ck_assert_int_eq(cg_pool_get(p, &k, 1, &g), CG_E_NOT_FOUND); /* still filling */
    ck_assert_int_eq(cg_pool_insert(p, &k, 5, 1, &dup, NULL), CG_E_CONFLICT);
    ck_assert(!has_key(p, 7));
    th_pool_fill(p, c, pattern, 7);
    cg_pool_publish(p, c, 2);
    ck_assert_int_eq(cg_pool_get(p, &k, 3, &g), CG_OK);
    ck_assert_ptr_eq(g, c);
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.hits, 1);
    ck_assert_uint_eq(s.misses, 1);
    /* Referenced: removal is deferred; lookups miss at once; the key can come back. */
    int deferred = 0;
    ck_assert_int_eq(cg_pool_remove(p, &k, &deferred), CG_OK);
    ck_assert_int_eq(deferred, 1);
    cg_pool_chunk *miss = NULL;
    ck_assert_int_eq(cg_pool_get(p, &k, 4, &miss), CG_E_NOT_FOUND);
    ck_assert_uint_eq(cg_pool_get_stats(p).blocks_free, 6);
    cg_pool_chunk *again = insert_filled(p, 7, 5, 5, NULL);
    ck_assert(th_pool_matches(p, c, pattern, 7)); /* the old one is intact while held */
    cg_pool_release(p, &c, 6);
    ck_assert_uint_eq(cg_pool_get_stats(p).blocks_free, 4); /* still held by g */
    cg_pool_release(p, &g, 6);
    ck_assert_uint_eq(cg_pool_get_stats(p).blocks_free, 6);
    /* retain adds a reference: after one release the chunk is still held once. */
    cg_pool_chunk *alias = again;
    cg_pool_retain(p, again);
    cg_pool_release(p, &again, 7);
    cg_pool_chunk_info info;
    ck_assert_int_eq(cg_pool_peek(p, &k, &info), CG_OK);
    ck_assert_uint_eq(info.refs, 1);
    ck_assert_uint_eq(info.last_used, 5);
    ck_assert_uint_eq(cg_pool_get_stats(p).referenced_chunks, 1);
    assert_accounting(p);
    cg_pool_release(p, &alias, 8);
    ck_assert_int_eq(cg_pool_peek(p, &k, &info), CG_OK);
    ck_assert_uint_eq(info.refs, 0);
    ck_assert_uint_eq(info.last_used, 8);
    /* Filling chunk removed: freed when the inserter releases it. */
    cg_key k8 = key_of(8);
    cg_pool_chunk *f = NULL;
    ck_assert_int_eq(cg_pool_insert(p, &k8, 3, 10, &f, NULL), CG_OK);
    ck_assert_int_eq(cg_pool_remove(p, &k8, &deferred), CG_OK);
    ck_assert_int_eq(deferred, 1);
    assert_accounting(p);
    cg_pool_release(p, &f, 11);
    assert_accounting(p);
    cg_pool_close(&p);
}
END_TEST

typedef struct inv {
    size_t n;
    size_t bytes;
    uint32_t tokens;
} inv;

static void count_inv(void *ud, const cg_pool_chunk_info *info)
{
    inv *v = ud;
    v->n++;
    v->bytes += info->bytes;
    v->tokens += info->tokens;
}

START_TEST(test_inventory)
{
    cg_pool *p = open_pool(10, NULL, NULL);
    cg_pool_chunk *a = insert_filled(p, 1, 5, 1, NULL);
    cg_pool_chunk *b = insert_filled(p, 2, 1, 1, NULL);
    cg_key k = key_of(3);
    cg_pool_chunk *filling = NULL;
    ck_assert_int_eq(cg_pool_insert(p, &k, 3, 1, &filling, NULL), CG_OK);
    cg_pool_release(p, &b, 2);
    inv v = {0};
    cg_pool_foreach(p, count_inv, &v);
    ck_assert_uint_eq(v.n, 2); /* the filling chunk is not listed */
    ck_assert_uint_eq(v.tokens, 6);
    ck_assert_uint_eq(v.bytes, 3 * BLOCK_BYTES);
    ck_assert_uint_eq(cg_pool_get_stats(p).chunks, 3);
    cg_pool_release(p, &a, 3);
    cg_pool_release(p, &filling, 3);
    cg_pool_close(&p);
}
END_TEST

static unsigned rnd(unsigned *st)
{
    *st = *st * 1103515245u + 12345u;
    return (*st >> 8) & 0xffffff;
}

/* Random ops against a model of which handles are held; invariants after each op. */
START_TEST(test_random_stress)
{
    cg_pool *p = open_pool(24, NULL, NULL);
    enum { N_KEYS = 40, MAX_HELD = 32 };
    cg_pool_chunk *held[MAX_HELD] = {0};
    unsigned held_id[MAX_HELD];
    size_t n_held = 0;
    unsigned st = 2024;
    uint64_t now = 0;
    cg_pool_evictions ev = {0};
    for (int op = 0; op < 4000; op++) {
        now++;
        unsigned r = rnd(&st) % 10, id = rnd(&st) % N_KEYS;
        cg_key k = key_of(id);
        if (r < 4 && n_held < MAX_HELD) {
            cg_pool_chunk *c = NULL;
            uint32_t tokens = rnd(&st) % 30 + 1;
            size_t before = ev.n;
            cg_pool_stats s0 = cg_pool_get_stats(p);
            cg_status stt = cg_pool_insert(p, &k, tokens, now, &c, &ev);
            if (stt == CG_OK) {
                th_pool_fill(p, c, pattern, id);
                if (rnd(&st) % 8 == 0) {
                    cg_pool_release(p, &c, now); /* abandoned before publish */
                    ck_assert(!has_key(p, id));
                } else {
                    cg_pool_publish(p, c, now);
                    held[n_held] = c;
                    held_id[n_held++] = id;
                }
                for (size_t i = before; i < ev.n; i++)
                    for (size_t j = 0; j < n_held; j++)
                        ck_assert(!cg_key_equal(&ev.keys[i], cg_pool_chunk_key(held[j])));
            } else if (stt == CG_E_FULL) {
                ck_assert_uint_eq(ev.n, before);
                cg_pool_stats s1 = cg_pool_get_stats(p);
                ck_assert_uint_eq(s1.blocks_free, s0.blocks_free);
            } else {
                ck_assert_int_eq(stt, CG_E_CONFLICT);
                ck_assert_int_eq(cg_pool_peek(p, &k, &(cg_pool_chunk_info){0}), CG_OK);
            }
        } else if (r < 6 && n_held < MAX_HELD) {
            cg_pool_chunk *c = NULL;
            if (cg_pool_get(p, &k, now, &c) == CG_OK) {
                ck_assert(th_pool_matches(p, c, pattern, id));
                held[n_held] = c;
                held_id[n_held++] = id;
            }
        } else if (r < 9 && n_held > 0) {
            size_t i = rnd(&st) % n_held;
            ck_assert(th_pool_matches(p, held[i], pattern, held_id[i]));
            cg_pool_release(p, &held[i], now);
            held[i] = held[n_held - 1];
            held_id[i] = held_id[n_held - 1];
            n_held--;
        } else {
            int deferred = 0;
            int present = has_key(p, id);
            ck_assert_int_eq(cg_pool_remove(p, &k, &deferred), present ? CG_OK : CG_E_NOT_FOUND);
            ck_assert(!has_key(p, id));
        }
        assert_accounting(p);
        /* every held chunk's blocks are still its own */
        for (size_t i = 0; i < n_held; i++)
            ck_assert(th_pool_matches(p, held[i], pattern, held_id[i]));
        ck_assert_uint_le(cg_pool_get_stats(p).referenced_chunks, n_held);
    }
    while (n_held)
        cg_pool_release(p, &held[--n_held], now);
    assert_accounting(p);
    ck_assert_uint_eq(cg_pool_get_stats(p).referenced_chunks, 0);
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert(s.evictions > 0 && s.full > 0 && s.hits > 0);
    cg_pool_evictions_free(&ev);
    cg_pool_close(&p);
}
END_TEST

typedef struct thread_arg {
    cg_pool *pool;
    unsigned seed;
    int bad;
} thread_arg;

static void *thread_main(void *ud)
{
    thread_arg *a = ud;
    unsigned st = a->seed;
    for (int op = 0; op < 3000; op++) {
        unsigned id = rnd(&st) % 24;
        cg_key k = key_of(id);
        cg_pool_chunk *c = NULL;
        if (cg_pool_get(a->pool, &k, (uint64_t)op, &c) == CG_OK) {
            if (!th_pool_matches(a->pool, c, pattern, id)) a->bad++;
            cg_pool_release(a->pool, &c, (uint64_t)op);
            continue;
        }
        cg_pool_evictions ev = {0};
        if (cg_pool_insert(a->pool, &k, rnd(&st) % 20 + 1, (uint64_t)op, &c, &ev) == CG_OK) {
            th_pool_fill(a->pool, c, pattern, id);
            cg_pool_publish(a->pool, c, (uint64_t)op);
            if (!th_pool_matches(a->pool, c, pattern, id)) a->bad++;
            cg_pool_release(a->pool, &c, (uint64_t)op);
        }
        cg_pool_evictions_free(&ev);
        if (op % 97 == 0) {
            cg_status rs = cg_pool_remove(a->pool, &k, NULL);
            if (rs != CG_OK && rs != CG_E_NOT_FOUND) a->bad++;
        }
    }
    return NULL;
}

START_TEST(test_threads)
{
    cg_pool *p = open_pool(16, NULL, NULL);
    thread_arg a[2] = {{.pool = p, .seed = 1, .bad = 0}, {.pool = p, .seed = 2, .bad = 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, thread_main, &a[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(a[0].bad + a[1].bad, 0);
    assert_accounting(p);
    cg_pool_stats s = cg_pool_get_stats(p);
    ck_assert_uint_eq(s.referenced_chunks, 0);
    ck_assert(s.hits > 0 && s.evictions > 0);
    cg_pool_close(&p);
}
END_TEST

int main(void)
{
    return th_run_tests("pool", "core", 300,
                        TH_TESTS(test_params, test_round_trip_and_layout, test_accounting,
                                 test_lru_order, test_referenced_never_evicted, test_evict_callback,
                                 test_too_big, test_filling_and_remove, test_inventory,
                                 test_random_stress, test_threads));
}
