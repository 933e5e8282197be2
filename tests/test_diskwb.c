/* Check suite for the disk write-behind (worker/store/diskwb.h) over a real disk tier: queued
 * chunks reach the disk byte for byte, a full queue drops (never blocks) and counts, a cancel
 * leaves nothing behind for the writer to put back, close writes what is queued, and the disk
 * records the writer drops to make room are handed out once. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/harness.h"
#include "base/base.h"
#include "kv/pool.h"
#include "worker/store/disk.h"
#include "worker/store/diskwb.h"
#include "tests/harness/kv_geom.h"

#define BLOCK_TOKENS 4
#define GEOM ((th_kv_geom){2, 2, 8, BLOCK_TOKENS})

static char g_dir[64];
static size_t g_block;

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cg_diskwb_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    cg_pool_params pp = th_pool_params(GEOM, 0);
    g_block = cg_pool_block_bytes(&pp);
}

static void teardown(void)
{
    static const char *names[] = {"kv.blocks", "kv.db", "kv.db-wal", "kv.db-shm"};
    char p[128];
    for (size_t i = 0; i < CG_ARRAY_LEN(names); i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

static cg_disk *open_disk(size_t slots)
{
    cg_disk *d = NULL;
    ck_assert_int_eq(cg_disk_open(th_disk_params(GEOM, g_dir, "wb-test", slots * g_block), &d),
                     CG_OK);
    return d;
}

static cg_key key_of(uint32_t i)
{
    cg_key k;
    uint64_t s = (uint64_t)i * 0x9e3779b97f4a7c15ull + 1;
    for (int b = 0; b < 16; b++) {
        s ^= s >> 29;
        s *= 0xbf58476d1ce4e5b9ull;
        k.b[b] = (uint8_t)(s >> 56);
    }
    return k;
}

/* A chunk's blocks: byte j of block b of chunk i is a function of (i, b, j). */
typedef struct chunk {
    uint32_t id;
    uint8_t *data;
} chunk;

static const void *chunk_block(void *ud, uint32_t b)
{
    chunk *c = ud;
    return c->data + (size_t)b * g_block;
}

static chunk make_chunk(uint32_t id, uint32_t tokens)
{
    uint32_t nb = (tokens + BLOCK_TOKENS - 1) / BLOCK_TOKENS;
    chunk c = {id, cg_malloc((size_t)nb * g_block)};
    for (size_t j = 0; j < (size_t)nb * g_block; j++)
        c.data[j] = (uint8_t)(id * 7u + j * 13u + (j >> 9));
    return c;
}

static uint32_t tokens_of(uint32_t i)
{
    return 1 + i % (3 * BLOCK_TOKENS);
}

/* The disk holds chunk i exactly as made. */
static void assert_on_disk(cg_disk *d, uint32_t i)
{
    uint32_t nt = tokens_of(i);
    cg_key k = key_of(i);
    size_t len = cg_disk_chunk_bytes(d, nt);
    uint8_t *buf = cg_malloc(len);
    ck_assert_msg(cg_disk_contains(d, &k), "chunk %u is not on disk", i);
    ck_assert_int_eq(cg_disk_get_buf(d, &k, nt, buf, len, 1), CG_OK);
    chunk want = make_chunk(i, nt);
    ck_assert(memcmp(buf, want.data, len) == 0);
    free(want.data);
    free(buf);
}

static cg_status put(cg_diskwb *w, uint32_t i)
{
    chunk c = make_chunk(i, tokens_of(i));
    cg_key k = key_of(i);
    /* the queue copies: the source is gone right after the call */
    cg_status st = cg_diskwb_put(w, &k, tokens_of(i), chunk_block, &c, cg_now_ms());
    memset(c.data, 0xee, 1);
    free(c.data);
    return st;
}

/* A write-behind over d with p; asserts it opened. */
static cg_diskwb *open_wb(cg_disk *d, cg_diskwb_params p)
{
    cg_diskwb *w = NULL;
    ck_assert_int_eq(cg_diskwb_open(d, p, &w), CG_OK);
    return w;
}

START_TEST(test_writes_reach_disk)
{
    cg_disk *d = open_disk(256);
    cg_diskwb *w = open_wb(d, cg_diskwb_default_params());
    for (uint32_t i = 0; i < 40; i++)
        ck_assert_int_eq(put(w, i), CG_OK);
    ck_assert_int_eq(cg_diskwb_flush(w, 30000), CG_OK);
    cg_diskwb_stats s = cg_diskwb_get_stats(w, cg_now_ms());
    ck_assert_uint_eq(s.puts, 40);
    ck_assert_uint_eq(s.written, 40);
    ck_assert_uint_eq(s.depth, 0);
    ck_assert_uint_eq(s.bytes, 0);
    ck_assert_uint_eq(s.oldest_age_ms, 0);
    for (uint32_t i = 0; i < 40; i++)
        assert_on_disk(d, i);
    /* a chunk already on disk is a success, nothing rewritten */
    ck_assert_int_eq(put(w, 3), CG_OK);
    ck_assert_int_eq(cg_diskwb_flush(w, 30000), CG_OK);
    ck_assert_uint_eq(cg_diskwb_get_stats(w, cg_now_ms()).written, 41);
    ck_assert_int_eq(cg_disk_check(d), CG_OK);
    cg_diskwb_close(&w);
    ck_assert_ptr_null(w);
    cg_diskwb_close(&w); /* NULL-safe */
    cg_disk_close(&d);
}
END_TEST

START_TEST(test_full_queue_drops)
{
    cg_disk *d = open_disk(1024);
    cg_diskwb_params p = cg_diskwb_default_params();
    p.max_bytes = 2 * g_block;
    cg_diskwb *w = open_wb(d, p);
    /* larger than the whole queue: never queued */
    chunk big = make_chunk(1000, 3 * BLOCK_TOKENS);
    cg_key bk = key_of(1000);
    ck_assert_int_eq(cg_diskwb_put(w, &bk, 3 * BLOCK_TOKENS, chunk_block, &big, 1), CG_E_FULL);
    free(big.data);
    ck_assert_int_eq(cg_diskwb_put(w, &bk, 0, chunk_block, &big, 1), CG_E_VALUE);
    cg_diskwb_close(&w);

    /* one chunk at a time: a burst is partly dropped, the rest written, all counted */
    p = cg_diskwb_default_params();
    p.max_items = 1;
    w = open_wb(d, p);
    int queued = 0;
    for (uint32_t i = 0; i < 200; i++)
        queued += put(w, i) == CG_OK;
    ck_assert_int_eq(cg_diskwb_flush(w, 30000), CG_OK);
    cg_diskwb_stats s = cg_diskwb_get_stats(w, cg_now_ms());
    ck_assert_uint_eq(s.puts, (uint64_t)queued);
    ck_assert_uint_eq(s.puts + s.drops, 200);
    ck_assert_uint_eq(s.written, s.puts);
    ck_assert_int_gt(queued, 0);
    int on_disk = 0;
    for (uint32_t i = 0; i < 200; i++) {
        cg_key k = key_of(i);
        on_disk += cg_disk_contains(d, &k);
    }
    ck_assert_int_eq(on_disk, queued);
    cg_diskwb_close(&w);
    ck_assert_int_eq(
        cg_diskwb_open(d, (cg_diskwb_params){.max_items = 0, .max_bytes = 1, .max_dropped = 1}, &w),
        CG_E_VALUE);
    cg_disk_close(&d);
}
END_TEST

/* cancel + remove, racing the writer: the chunk never comes back. */
START_TEST(test_cancel_then_remove)
{
    cg_disk *d = open_disk(1024);
    cg_diskwb_params p = cg_diskwb_default_params();
    p.max_items = 1024;
    cg_diskwb *w = open_wb(d, p);
    size_t cancelled = 0;
    for (uint32_t i = 0; i < 60; i++) {
        for (uint32_t j = 0; j < 4; j++) /* others ahead of it, sometimes */
            ck_assert_int_eq(put(w, 500 + i * 4 + j), CG_OK);
        ck_assert_int_eq(put(w, i), CG_OK);
        if (i % 3 == 0) ck_assert_int_eq(put(w, i), CG_OK); /* queued twice */
        cg_key k = key_of(i);
        cancelled += cg_diskwb_cancel(w, &k);
        cg_status st = cg_disk_remove(d, &k);
        ck_assert(st == CG_OK || st == CG_E_NOT_FOUND);
    }
    ck_assert_int_eq(cg_diskwb_flush(w, 30000), CG_OK);
    for (uint32_t i = 0; i < 60; i++) {
        cg_key k = key_of(i);
        ck_assert_msg(!cg_disk_contains(d, &k), "chunk %u came back after its removal", i);
    }
    cg_diskwb_stats s = cg_diskwb_get_stats(w, cg_now_ms());
    ck_assert_uint_eq(s.cancelled, cancelled);
    ck_assert_uint_eq(s.written + s.cancelled, s.puts);
    ck_assert_uint_eq(s.depth, 0);
    ck_assert_int_eq(cg_disk_check(d), CG_OK);
    cg_diskwb_close(&w);
    cg_disk_close(&d);
}
END_TEST

START_TEST(test_close_writes_queue)
{
    cg_disk *d = open_disk(512);
    cg_diskwb *w = open_wb(d, cg_diskwb_default_params());
    int n = 0;
    for (uint32_t i = 0; i < 50; i++)
        n += put(w, i) == CG_OK;
    ck_assert_int_eq(n, 50);
    cg_diskwb_close(&w);
    for (uint32_t i = 0; i < 50; i++)
        assert_on_disk(d, i);
    cg_disk_close(&d);
}
END_TEST

START_TEST(test_dropped_keys)
{
    cg_disk *d = open_disk(6); /* room for two or three chunks */
    cg_diskwb *w = open_wb(d, cg_diskwb_default_params());
    for (uint32_t i = 0; i < 30; i++) {
        ck_assert_int_eq(put(w, i), CG_OK);
        ck_assert_int_eq(cg_diskwb_flush(w, 30000), CG_OK);
    }
    cg_pool_evictions ev = {0};
    cg_diskwb_take_dropped(w, &ev);
    ck_assert_uint_eq(ev.n, cg_disk_get_stats(d).drops);
    ck_assert_uint_gt(ev.n, 10);
    for (size_t i = 0; i < ev.n; i++)
        ck_assert(!cg_disk_contains(d, &ev.keys[i]));
    size_t before = ev.n;
    cg_diskwb_take_dropped(w, &ev); /* handed out once */
    ck_assert_uint_eq(ev.n, before);
    cg_pool_evictions_free(&ev);
    cg_diskwb_close(&w);
    cg_disk_close(&d);
}
END_TEST

int main(void)
{
    return th_run_suite("diskwb", "core", 120, (th_fixture){setup, teardown, 1}, CK_FORK_GETENV,
                        TH_TESTS(test_writes_reach_disk, test_full_queue_drops,
                                 test_cancel_then_remove, test_close_writes_queue,
                                 test_dropped_keys));
}
