/* Check suite for the worker's disk tier (worker/store/disk.h): exact round trips and
 * accounting, restart, LRU drop, oversize chunks, corruption and torn writes (kill -9 in a
 * loop) never served, open-time validation, geometry refusal, the pool adapter and a
 * multi-threaded smoke test. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker/store/disk.h"
#include "base/base.h"
#include "kv/pool.h"
#include "sql/kvstore.h"
#include "tests/harness/harness.h"
#include "tests/harness/kv_geom.h"

/* Geometry: 2 layers, 2 KV heads, head_dim 8, 4 tokens a block -> 1024-byte blocks. */
#define LAYERS 2
#define HEADS 2
#define HD 8
#define BT 4
#define BB ((size_t)HEADS * LAYERS * 2 * BT * HD * sizeof(float))
#define MODEL "test-model"
#define GEOM ((th_kv_geom){LAYERS, HEADS, HD, BT})

static char g_dir[64];

static void rm_dir_files(const char *dir)
{
    static const char *names[] = {"kv.blocks", "kv.db", "kv.db-wal", "kv.db-shm"};
    char p[160];
    for (size_t i = 0; i < CG_ARRAY_LEN(names); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
}

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cg_disk_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void teardown(void)
{
    rm_dir_files(g_dir);
    rmdir(g_dir);
}

static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_dir, name);
}

/* A hash-like key for integer i (real keys are XXH3 output). */
static cg_key key_of(uint64_t i)
{
    return th_key_of(i, 7);
}

/* Token count of a key's chunk in the kill -9 and thread tests: 1..max, a function of the key. */
static uint32_t tokens_of(const cg_key *k, uint32_t max)
{
    uint64_t v;
    memcpy(&v, k->b + 8, 8);
    return 1 + (uint32_t)(v % max);
}

static size_t chunk_bytes(uint32_t n_tokens)
{
    return (size_t)((n_tokens + BT - 1) / BT) * BB;
}

/* The bytes of a key's chunk: a pure function of (key, n_tokens), so a reader can tell
 * exactly what a writer that was killed meant to write. */
static void fill_chunk(const cg_key *k, uint32_t n_tokens, uint8_t *buf)
{
    uint64_t s;
    memcpy(&s, k->b, 8);
    s ^= (uint64_t)n_tokens << 40;
    size_t n = chunk_bytes(n_tokens);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = th_splitmix64(&s);
        memcpy(buf + i, &v, 8);
    }
}

typedef struct chunk_src {
    const uint8_t *buf;
} chunk_src;

static const void *src_block(void *ud, uint32_t i)
{
    return ((chunk_src *)ud)->buf + (size_t)i * BB;
}

static cg_disk_params params_for(const char *dir, size_t slots)
{
    /* the capacity is rounded down to whole slots */
    return th_disk_params(GEOM, dir, MODEL, slots * BB + 100);
}

static cg_disk *open_disk(size_t slots)
{
    cg_disk *d = NULL;
    ck_assert_int_eq(cg_disk_open(params_for(g_dir, slots), &d), CG_OK);
    ck_assert_ptr_nonnull(d);
    return d;
}

static void check_ok(cg_disk *d)
{
    ck_assert_int_eq(cg_disk_check(d), CG_OK);
}

static cg_status put_key(cg_disk *d, const cg_key *k, uint32_t n_tokens, uint64_t now,
                         cg_pool_evictions *dropped)
{
    uint8_t *buf = cg_malloc(chunk_bytes(n_tokens));
    fill_chunk(k, n_tokens, buf);
    chunk_src s = {buf};
    cg_status st = cg_disk_put(d, k, n_tokens, src_block, &s, now, dropped);
    free(buf);
    return st;
}

/* Reads a chunk back. CG_OK only with exactly the expected bytes: anything else fails the
 * test at once, because serving wrong KV is the one thing the tier must never do. */
static cg_status get_key(cg_disk *d, const cg_key *k, uint32_t n_tokens, uint64_t now)
{
    size_t n = chunk_bytes(n_tokens);
    uint8_t *got = cg_malloc(n), *want = cg_malloc(n);
    memset(got, 0xAB, n);
    cg_status st = cg_disk_get_buf(d, k, n_tokens, got, n, now);
    if (st == CG_OK) {
        fill_chunk(k, n_tokens, want);
        ck_assert_msg(memcmp(got, want, n) == 0, "served bytes differ from what was written");
    }
    free(got);
    free(want);
    return st;
}

/* The slot list of key's row, read through a second inventory connection. */
static uint32_t g_found_slots[256];
static uint32_t g_found_n;
static cg_key g_find_key;
static int find_row(void *ud, const cg_kvstore_row *row)
{
    (void)ud;
    if (!cg_key_equal(&row->key, &g_find_key)) return 0;
    g_found_n = row->n_slots;
    memcpy(g_found_slots, row->slots, row->n_slots * sizeof *row->slots);
    return 1;
}

static uint32_t slots_of(const cg_key *k)
{
    char p[160];
    path_in(p, sizeof p, "kv.db");
    cg_kvstore *kv = NULL;
    ck_assert_int_eq(cg_kvstore_open(p, 0, &kv), CG_OK);
    g_find_key = *k;
    g_found_n = 0;
    ck_assert_int_eq(cg_kvstore_load(kv, find_row, NULL), CG_OK);
    cg_kvstore_close(&kv);
    return g_found_n;
}

/* Overwrites n bytes at off in kv.blocks. */
static void poke(off_t off, const void *bytes, size_t n)
{
    char p[160];
    path_in(p, sizeof p, "kv.blocks");
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, bytes, n, off), (ssize_t)n);
    close(fd);
}

/* Runs one SQL statement on kv.db directly (tampering, as a bug or an operator could). */
static void sql_exec(const char *sql)
{
    char p[160];
    path_in(p, sizeof p, "kv.db");
    th_sql_exec(p, sql);
}

typedef struct dst_t {
    uint8_t **b;
    int calls;
} dst_t;

static void *dst_block(void *ud, uint32_t i)
{
    dst_t *dd = ud;
    dd->calls++;
    return dd->b[i];
}

/* Rewrites key's row to name slots[0..n). */
static void set_slots(const cg_key *key, const uint32_t *slots, uint32_t n)
{
    ck_assert_uint_gt(n, 0);
    ck_assert_uint_le(n, 256);
    char hex[33], blob[2 * 4 * 256 + 1], sql[2600];
    cg_hex_encode(key->b, 16, hex);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t le[4] = {(uint8_t)slots[i], (uint8_t)(slots[i] >> 8), (uint8_t)(slots[i] >> 16),
                         (uint8_t)(slots[i] >> 24)};
        cg_hex_encode(le, 4, blob + 8 * i);
    }
    snprintf(sql, sizeof sql, "UPDATE chunks SET slots = x'%s' WHERE key = x'%s'", blob, hex);
    sql_exec(sql);
}

/* ---- round trip, accounting ----------------------------------------------------------------- */

START_TEST(test_round_trip)
{
    cg_disk *d = open_disk(64);
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.capacity_bytes, 64 * BB);
    ck_assert_uint_eq(s.block_bytes, BB);
    ck_assert_uint_eq(s.slots_total, 64);
    ck_assert_uint_eq(s.used_bytes, 0);
    ck_assert_uint_eq(cg_disk_get_params(d).capacity_bytes, 64 * BB);

    static const uint32_t toks[] = {1, 4, 5, 13, 64};
    size_t total = 0;
    for (size_t i = 0; i < CG_ARRAY_LEN(toks); i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(put_key(d, &k, toks[i], 100 + i, NULL), CG_OK);
        total += chunk_bytes(toks[i]);
        ck_assert_uint_eq(cg_disk_chunk_bytes(d, toks[i]), chunk_bytes(toks[i]));
    }
    s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.chunks, CG_ARRAY_LEN(toks));
    ck_assert_uint_eq(s.used_bytes, total);
    ck_assert_uint_eq(s.chunk_bytes, total);
    ck_assert_uint_eq(s.bytes_written, total);
    ck_assert_uint_eq(s.spills, CG_ARRAY_LEN(toks));
    ck_assert_uint_eq(s.slots_free, 64 - total / BB);
    check_ok(d);

    for (size_t i = 0; i < CG_ARRAY_LEN(toks); i++) {
        cg_key k = key_of(i);
        ck_assert(cg_disk_contains(d, &k));
        cg_disk_chunk_info info;
        ck_assert_int_eq(cg_disk_peek(d, &k, &info), CG_OK);
        ck_assert_uint_eq(info.tokens, toks[i]);
        ck_assert_uint_eq(info.bytes, chunk_bytes(toks[i]));
        ck_assert_uint_eq(info.last_used, 100 + i);
        ck_assert_int_eq(get_key(d, &k, toks[i], 200 + i), CG_OK);
    }
    s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.restores, CG_ARRAY_LEN(toks));
    ck_assert_uint_eq(s.bytes_read, total);
    ck_assert_uint_eq(s.checksum_failures, 0);

    /* The same key again: nothing written, it becomes most recently used. */
    cg_key k0 = key_of(0);
    ck_assert_int_eq(put_key(d, &k0, 1, 999, NULL), CG_OK);
    s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.spills, CG_ARRAY_LEN(toks));
    ck_assert_uint_eq(s.bytes_written, total);

    ck_assert_int_eq(put_key(d, &k0, 2, 999, NULL), CG_E_CONFLICT); /* same key, other size */

    /* Wrong token count, unknown key, short buffer, zero tokens. */
    uint8_t small[16];
    ck_assert_int_eq(get_key(d, &k0, 2, 1), CG_E_CONFLICT);
    cg_key nope = key_of(1000);
    ck_assert_int_eq(get_key(d, &nope, 1, 1), CG_E_NOT_FOUND);
    ck_assert(!cg_disk_contains(d, &nope));
    cg_disk_chunk_info info;
    ck_assert_int_eq(cg_disk_peek(d, &nope, &info), CG_E_NOT_FOUND);
    ck_assert_int_eq(cg_disk_get_buf(d, &k0, 1, small, sizeof small, 1), CG_E_VALUE);
    ck_assert_int_eq(put_key(d, &nope, 0, 1, NULL), CG_E_VALUE);

    /* Per-block destination callback (as into freshly inserted pool blocks). */
    cg_key k3 = key_of(3);
    uint8_t *blocks[4];
    for (int i = 0; i < 4; i++)
        blocks[i] = cg_malloc(BB);
    dst_t dd = {blocks, 0};
    ck_assert_int_eq(cg_disk_get(d, &k3, 13, dst_block, &dd, 5), CG_OK);
    ck_assert_int_eq(dd.calls, 4);
    uint8_t *want = cg_malloc(4 * BB);
    fill_chunk(&k3, 13, want);
    for (int i = 0; i < 4; i++) {
        ck_assert_mem_eq(blocks[i], want + i * BB, BB);
        free(blocks[i]);
    }
    free(want);

    /* Remove: row first, then slots. */
    ck_assert_int_eq(cg_disk_remove(d, &k3), CG_OK);
    ck_assert_int_eq(cg_disk_remove(d, &k3), CG_E_NOT_FOUND);
    ck_assert(!cg_disk_contains(d, &k3));
    s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.removes, 1);
    ck_assert_uint_eq(s.used_bytes, total - 4 * BB);
    check_ok(d);
    cg_disk_close(&d);
    ck_assert_ptr_null(d);
    cg_disk_close(&d); /* NULL-safe */

    d = open_disk(64);
    ck_assert(!cg_disk_contains(d, &k3));
    ck_assert_uint_eq(cg_disk_get_stats(d).chunks, CG_ARRAY_LEN(toks) - 1);
    cg_disk_close(&d);

    /* The inventory is in WAL mode (cg_db_use_wal), persistent in the file header. */
    char p[160];
    path_in(p, sizeof p, "kv.db");
    char *mode = th_sql_text(p, "PRAGMA journal_mode");
    ck_assert_str_eq(mode, "wal");
    free(mode);
}
END_TEST

START_TEST(test_sync_mode)
{
    cg_disk_params p = params_for(g_dir, 16);
    p.sync = 1;
    cg_disk *d = NULL;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_OK);
    cg_key k = key_of(5);
    ck_assert_int_eq(put_key(d, &k, 9, 1, NULL), CG_OK);
    ck_assert_int_eq(get_key(d, &k, 9, 2), CG_OK);
    check_ok(d);
    cg_disk_close(&d);
}
END_TEST

/* ---- restart ----------------------------------------------------------------------------------
 */

/* The chunks cg_disk_foreach lists, in its order; at most cap (<= 128) of them. */
typedef struct list_ctx {
    cg_key keys[128];
    uint64_t last_used[128];
    uint32_t tokens[128];
    size_t n, cap;
} list_ctx;

static void list_fn(void *ud, const cg_disk_chunk_info *info)
{
    list_ctx *c = ud;
    ck_assert_uint_lt(c->n, c->cap);
    c->keys[c->n] = info->key;
    c->tokens[c->n] = info->tokens;
    c->last_used[c->n++] = info->last_used;
}

START_TEST(test_restart)
{
    cg_disk *d = open_disk(64);
    for (uint64_t i = 0; i < 10; i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(put_key(d, &k, (uint32_t)(1 + 3 * i), 1000 + i, NULL), CG_OK);
    }
    /* Restoring key 2 makes it most recently used; that order must survive the restart. */
    cg_key k2 = key_of(2);
    ck_assert_int_eq(get_key(d, &k2, 7, 5000), CG_OK);
    cg_disk_stats before = cg_disk_get_stats(d);
    cg_disk_close(&d);

    d = open_disk(64);
    cg_disk_stats after = cg_disk_get_stats(d);
    ck_assert_uint_eq(after.chunks, 10);
    ck_assert_uint_eq(after.used_bytes, before.used_bytes);
    ck_assert_uint_eq(after.open_dropped, 0);
    check_ok(d);
    list_ctx c = {.cap = 64};
    cg_disk_foreach(d, list_fn, &c);
    ck_assert_uint_eq(c.n, 10);
    ck_assert(cg_key_equal(&c.keys[9], &k2));
    ck_assert_uint_eq(c.last_used[9], 5000);
    for (size_t i = 1; i < c.n; i++)
        ck_assert_uint_le(c.last_used[i - 1], c.last_used[i]);
    for (uint64_t i = 0; i < 10; i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(get_key(d, &k, (uint32_t)(1 + 3 * i), 6000), CG_OK);
    }
    /* New records after the restart do not land on old ones. */
    for (uint64_t i = 10; i < 14; i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(put_key(d, &k, 8, 7000, NULL), CG_OK);
    }
    check_ok(d);
    for (uint64_t i = 0; i < 14; i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(get_key(d, &k, i < 10 ? (uint32_t)(1 + 3 * i) : 8, 8000), CG_OK);
    }
    cg_disk_close(&d);
}
END_TEST

/* ---- LRU drop, oversize --------------------------------------------------------------------- */

START_TEST(test_lru_drop_when_full)
{
    cg_disk *d = open_disk(16);
    cg_pool_evictions dropped = {0};
    for (uint64_t i = 0; i < 4; i++) { /* 4 chunks x 4 slots = full */
        cg_key k = key_of(i);
        ck_assert_int_eq(put_key(d, &k, 16, 10 + i, &dropped), CG_OK);
    }
    ck_assert_uint_eq(dropped.n, 0);
    ck_assert_uint_eq(cg_disk_get_stats(d).slots_free, 0);
    cg_key k0 = key_of(0), k1 = key_of(1), k2 = key_of(2), k3 = key_of(3);
    ck_assert_int_eq(get_key(d, &k0, 16, 20), CG_OK); /* 0 is now the newest */

    cg_key k4 = key_of(4);
    ck_assert_int_eq(put_key(d, &k4, 13, 30, &dropped), CG_OK); /* needs 4 slots: drops 1 */
    ck_assert_uint_eq(dropped.n, 1);
    ck_assert(cg_key_equal(&dropped.keys[0], &k1));
    ck_assert(!cg_disk_contains(d, &k1));
    ck_assert_int_eq(get_key(d, &k1, 16, 31), CG_E_NOT_FOUND);

    cg_key k5 = key_of(5);
    ck_assert_int_eq(put_key(d, &k5, 32, 40, &dropped), CG_OK); /* 8 slots: drops 2 and 3 */
    ck_assert_uint_eq(dropped.n, 3);
    ck_assert(cg_key_equal(&dropped.keys[1], &k2));
    ck_assert(cg_key_equal(&dropped.keys[2], &k3));
    ck_assert_int_eq(get_key(d, &k0, 16, 41), CG_OK);
    ck_assert_int_eq(get_key(d, &k4, 13, 42), CG_OK);
    ck_assert_int_eq(get_key(d, &k5, 32, 43), CG_OK);
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.drops, 3);
    ck_assert_uint_eq(s.chunks, 3);
    ck_assert_uint_eq(s.used_bytes, 16 * BB);
    ck_assert_uint_eq(s.chunk_bytes, 16 * BB);
    check_ok(d);
    cg_pool_evictions_free(&dropped);
    cg_disk_close(&d);

    /* The drops are durable. */
    d = open_disk(16);
    ck_assert(!cg_disk_contains(d, &k1) && !cg_disk_contains(d, &k2));
    ck_assert_uint_eq(cg_disk_get_stats(d).chunks, 3);
    cg_disk_close(&d);
}
END_TEST

START_TEST(test_chunk_bigger_than_disk)
{
    cg_disk *d = open_disk(16);
    cg_key a = key_of(1);
    ck_assert_int_eq(put_key(d, &a, 8, 1, NULL), CG_OK);
    cg_pool_evictions dropped = {0};
    cg_key big = key_of(2);
    ck_assert_int_eq(put_key(d, &big, 16 * BT + 1, 2, &dropped), CG_E_FULL);
    ck_assert_uint_eq(dropped.n, 0); /* nothing dropped for a chunk that can never fit */
    ck_assert(cg_disk_contains(d, &a));
    ck_assert(!cg_disk_contains(d, &big));
    /* Exactly the whole disk fits, dropping the rest. */
    ck_assert_int_eq(put_key(d, &big, 16 * BT, 3, &dropped), CG_OK);
    ck_assert_uint_eq(dropped.n, 1);
    ck_assert_int_eq(get_key(d, &big, 16 * BT, 4), CG_OK);
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.full, 1);
    ck_assert_uint_eq(s.slots_free, 0);
    check_ok(d);
    cg_pool_evictions_free(&dropped);
    cg_disk_close(&d);
}
END_TEST

/* ---- corruption --------------------------------------------------------------------------- */

START_TEST(test_corruption_detected)
{
    cg_disk *d = open_disk(64);
    cg_key a = key_of(1), b = key_of(2), c = key_of(3);
    ck_assert_int_eq(put_key(d, &a, 20, 1, NULL), CG_OK); /* 5 slots */
    ck_assert_int_eq(put_key(d, &b, 20, 2, NULL), CG_OK);
    ck_assert_int_eq(put_key(d, &c, 7, 3, NULL), CG_OK);

    /* One flipped byte in the middle slot of a. */
    ck_assert_uint_eq(slots_of(&a), 5);
    uint8_t byte;
    off_t off = (off_t)g_found_slots[2] * (off_t)BB + 333;
    {
        char p[160];
        path_in(p, sizeof p, "kv.blocks");
        int fd = open(p, O_RDONLY);
        ck_assert_int_eq(pread(fd, &byte, 1, off), 1);
        close(fd);
    }
    byte ^= 0x01;
    poke(off, &byte, 1);
    size_t used_before = cg_disk_get_stats(d).used_bytes;
    ck_assert_int_eq(get_key(d, &a, 20, 10), CG_E_IO);
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.checksum_failures, 1);
    ck_assert_uint_eq(s.restores, 0);
    ck_assert(!cg_disk_contains(d, &a)); /* the record is gone */
    ck_assert_int_eq(get_key(d, &a, 20, 11), CG_E_NOT_FOUND);
    ck_assert_uint_eq(s.used_bytes, used_before - 5 * BB);
    ck_assert_int_eq(get_key(d, &b, 20, 12), CG_OK); /* neighbours unaffected */
    check_ok(d);

    /* The last (partial) block of c: bytes past its tokens are covered too. */
    ck_assert_uint_eq(slots_of(&c), 2);
    uint8_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    poke((off_t)g_found_slots[1] * (off_t)BB + (off_t)BB - 8, junk, sizeof junk);
    ck_assert_int_eq(get_key(d, &c, 7, 13), CG_E_IO);
    ck_assert_uint_eq(cg_disk_get_stats(d).checksum_failures, 2);
    cg_disk_close(&d);

    /* Gone after a restart as well; b survives. */
    d = open_disk(64);
    ck_assert(!cg_disk_contains(d, &a) && !cg_disk_contains(d, &c));
    ck_assert_int_eq(get_key(d, &b, 20, 14), CG_OK);
    cg_disk_close(&d);
}
END_TEST

START_TEST(test_swapped_rows_and_truncated_file)
{
    cg_disk *d = open_disk(64);
    cg_key a = key_of(1), b = key_of(2);
    ck_assert_int_eq(put_key(d, &a, 12, 1, NULL), CG_OK);
    ck_assert_int_eq(put_key(d, &b, 12, 2, NULL), CG_OK);
    cg_disk_close(&d);

    /* Rows that name the other record's slots (same size, so open accepts them): the checksum
     * covers the key, so neither can verify. */
    uint32_t sa[8], sb[8];
    ck_assert_uint_eq(slots_of(&a), 3);
    memcpy(sa, g_found_slots, sizeof sa);
    ck_assert_uint_eq(slots_of(&b), 3);
    memcpy(sb, g_found_slots, sizeof sb);
    set_slots(&a, sb, 3);
    set_slots(&b, sa, 3);
    d = open_disk(64);
    ck_assert_uint_eq(cg_disk_get_stats(d).chunks, 2);
    ck_assert_int_eq(get_key(d, &a, 12, 3), CG_E_IO);
    ck_assert_int_eq(get_key(d, &b, 12, 4), CG_E_IO);
    ck_assert_uint_eq(cg_disk_get_stats(d).checksum_failures, 2);
    ck_assert_uint_eq(cg_disk_get_stats(d).chunks, 0);
    ck_assert_int_eq(put_key(d, &a, 12, 5, NULL), CG_OK);
    check_ok(d);
    cg_disk_close(&d);

    /* The data file truncated behind our back: it grows back with zeros, which fail. */
    char p[160];
    path_in(p, sizeof p, "kv.blocks");
    ck_assert_int_eq(truncate(p, 0), 0);
    d = open_disk(64);
    ck_assert(cg_disk_contains(d, &a));
    ck_assert_int_eq(get_key(d, &a, 12, 6), CG_E_IO);
    ck_assert_uint_eq(cg_disk_get_stats(d).checksum_failures, 1);
    check_ok(d);
    cg_disk_close(&d);
}
END_TEST

START_TEST(test_open_drops_bad_rows)
{
    cg_disk *d = open_disk(64);
    for (uint64_t i = 0; i < 8; i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(put_key(d, &k, 16, i, NULL), CG_OK); /* 4 slots each: 0..31 */
    }
    cg_disk_close(&d);

    /* Shrinking the capacity: records past the end are out of range. */
    d = open_disk(20);
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.open_dropped, 3);
    ck_assert_uint_eq(s.chunks, 5);
    ck_assert_uint_eq(s.capacity_bytes, 20 * BB);
    for (uint64_t i = 0; i < 5; i++) {
        cg_key k = key_of(i);
        ck_assert_int_eq(get_key(d, &k, 16, 100), CG_OK);
    }
    check_ok(d);
    cg_disk_close(&d);
    struct stat sb;
    char p[160];
    path_in(p, sizeof p, "kv.blocks");
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_size, (off_t)(20 * BB));

    /* Overlap: key 1's row names key 0's slots -> both dropped. Wrong slot count for key 2
     * (8 tokens need 2 slots, the row lists 4). */
    cg_key k0 = key_of(0), k1 = key_of(1), k2 = key_of(2), k3 = key_of(3);
    char hex0[33];
    cg_hex_encode(k0.b, 16, hex0);
    char sql[512];
    char hex1[33];
    cg_hex_encode(k1.b, 16, hex1);
    snprintf(sql, sizeof sql,
             "UPDATE chunks SET slots = (SELECT slots FROM chunks WHERE key = x'%s') WHERE key = "
             "x'%s'",
             hex0, hex1);
    sql_exec(sql);
    char hex2[33];
    cg_hex_encode(k2.b, 16, hex2);
    snprintf(sql, sizeof sql, "UPDATE chunks SET n_tokens = 8 WHERE key = x'%s'", hex2);
    sql_exec(sql);
    /* A row with a slot list that is not whole u32s. */
    char hex3[33];
    cg_hex_encode(k3.b, 16, hex3);
    snprintf(sql, sizeof sql, "UPDATE chunks SET slots = x'0c000000ff' WHERE key = x'%s'", hex3);
    sql_exec(sql);

    d = open_disk(20);
    s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.open_dropped, 4);
    ck_assert_uint_eq(s.chunks, 1);
    ck_assert(!cg_disk_contains(d, &k0) && !cg_disk_contains(d, &k1));
    ck_assert(!cg_disk_contains(d, &k2) && !cg_disk_contains(d, &k3));
    cg_key k4 = key_of(4);
    ck_assert_int_eq(get_key(d, &k4, 16, 200), CG_OK);
    ck_assert_uint_eq(s.used_bytes, 4 * BB);
    check_ok(d);
    cg_disk_close(&d);
}
END_TEST

/* ---- races made deterministic: the callbacks run outside the tier's lock --------------------- */

typedef struct race_ctx {
    cg_disk *d;
    cg_key key;
    uint32_t n_tokens;
    const uint8_t *buf;
    uint8_t *out;
    int step;
    cg_status seen[4];
} race_ctx;

/* While the key is being written: it is invisible, a second put conflicts, remove works. */
static const void *racing_src(void *ud, uint32_t i)
{
    race_ctx *c = ud;
    if (i == 0 && c->step++ == 0) {
        c->seen[0] = get_key(c->d, &c->key, c->n_tokens, 1);
        c->seen[1] = cg_disk_contains(c->d, &c->key) ? CG_OK : CG_E_NOT_FOUND;
        c->seen[2] = put_key(c->d, &c->key, c->n_tokens, 1, NULL);
        c->seen[3] = cg_disk_remove(c->d, &c->key);
    }
    return c->buf + (size_t)i * BB;
}

/* While the key is being read: remove it, and fill the disk with another chunk. */
static void *racing_dst(void *ud, uint32_t i)
{
    race_ctx *c = ud;
    if (i == 0 && c->step++ == 0) {
        c->seen[0] = cg_disk_remove(c->d, &c->key);
        cg_key other = key_of(999);
        c->seen[1] = put_key(c->d, &other, 16 * BT, 2, NULL); /* needs the whole disk */
        cg_key small = key_of(998);
        c->seen[2] = put_key(c->d, &small, 8 * BT, 3, NULL); /* fits in the free half */
    }
    return c->out + (size_t)i * BB;
}

START_TEST(test_callback_races)
{
    cg_disk *d = open_disk(16);
    race_ctx c = {.d = d, .key = key_of(7), .n_tokens = 8 * BT};
    uint8_t *buf = cg_malloc(8 * BB), *out = cg_malloc(8 * BB);
    fill_chunk(&c.key, c.n_tokens, buf);
    c.buf = buf;
    ck_assert_int_eq(cg_disk_put(d, &c.key, c.n_tokens, racing_src, &c, 1, NULL), CG_OK);
    ck_assert_int_eq(c.seen[0], CG_E_NOT_FOUND);
    ck_assert_int_eq(c.seen[1], CG_E_NOT_FOUND);
    ck_assert_int_eq(c.seen[2], CG_E_CONFLICT);
    ck_assert_int_eq(c.seen[3], CG_OK); /* removed mid-write: never committed */
    ck_assert(!cg_disk_contains(d, &c.key));
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.used_bytes, 0);
    ck_assert_uint_eq(s.spills, 0);
    check_ok(d);

    /* Now a real record, removed while it is being read: the read still completes and
     * verifies (its slots are not reused under it), then the slots are freed. */
    ck_assert_int_eq(put_key(d, &c.key, c.n_tokens, 2, NULL), CG_OK);
    c.step = 0;
    c.out = out;
    ck_assert_int_eq(cg_disk_get(d, &c.key, c.n_tokens, racing_dst, &c, 3), CG_OK);
    ck_assert_mem_eq(out, buf, 8 * BB);
    ck_assert_int_eq(c.seen[0], CG_OK);
    ck_assert_int_eq(c.seen[1], CG_E_FULL); /* its 8 slots are still being read */
    ck_assert_int_eq(c.seen[2], CG_OK);
    ck_assert(!cg_disk_contains(d, &c.key));
    s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.chunks, 1);
    ck_assert_uint_eq(s.used_bytes, 8 * BB);
    ck_assert_uint_eq(s.checksum_failures, 0);
    check_ok(d);
    free(buf);
    free(out);
    cg_disk_close(&d);
}
END_TEST

/* ---- torn writes: kill -9 in a loop --------------------------------------------------------- */

#define TORN_KEYS 400
#define TORN_MAX_TOKENS 40

static void torn_child(const char *dir, uint64_t seed)
{
    cg_log_init("test_disk_child", CG_LOG_ERROR);
    cg_disk *d = NULL;
    if (cg_disk_open(params_for(dir, 64), &d) != CG_OK) _exit(3);
    uint64_t s = seed;
    uint8_t *buf = cg_malloc(chunk_bytes(TORN_MAX_TOKENS));
    for (uint64_t now = 1;; now++) {
        uint64_t r = th_splitmix64(&s);
        cg_key k = key_of(r % TORN_KEYS);
        uint32_t nt = tokens_of(&k, TORN_MAX_TOKENS);
        if (r % 16 == 0) {
            cg_status ignored = cg_disk_remove(d, &k); /* absent is fine */
            (void)ignored;
        } else if (r % 16 == 1) {
            cg_status ignored = cg_disk_get_buf(d, &k, nt, buf, chunk_bytes(nt), now);
            (void)ignored;
        } else {
            fill_chunk(&k, nt, buf);
            chunk_src src = {buf};
            if (cg_disk_put(d, &k, nt, src_block, &src, now, NULL) == CG_E_IO) _exit(4);
        }
    }
}

START_TEST(test_torn_writes_never_served)
{
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    uint64_t rs = seed;
    size_t served = 0, detected = 0, rounds_with_records = 0;
    for (int round = 0; round < 12; round++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) torn_child(g_dir, seed + (uint64_t)round * 7919);
        /* Kill it at a random moment: before it opens, mid-write, mid-commit, mid-drop. */
        usleep((useconds_t)(th_splitmix64(&rs) % 60000));
        ck_assert_int_eq(kill(pid, SIGKILL), 0);
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "child ended on its own (status %d): the tier failed", status);

        /* Every third round also fakes what power loss could do under synchronous=NORMAL: a
         * committed row whose slot bytes did not all reach the disk. */
        int inject = round % 3 == 2;
        if (inject) {
            uint8_t junk[512];
            for (size_t i = 0; i < sizeof junk; i++)
                junk[i] = (uint8_t)th_splitmix64(&rs);
            poke((off_t)(th_splitmix64(&rs) % (64 * BB - sizeof junk)), junk, sizeof junk);
        }

        cg_disk *d = open_disk(64);
        check_ok(d); /* inventory intact (integrity_check), slots consistent */
        list_ctx v = {.cap = 128};
        cg_disk_foreach(d, list_fn, &v);
        if (v.n) rounds_with_records++;
        size_t bad = 0;
        for (size_t i = 0; i < v.n; i++) {
            ck_assert_uint_eq(v.tokens[i], tokens_of(&v.keys[i], TORN_MAX_TOKENS));
            cg_status st = get_key(d, &v.keys[i], v.tokens[i], 1u << 30); /* asserts bytes */
            if (st == CG_OK) {
                served++;
            } else {
                ck_assert_int_eq(st, CG_E_IO);
                bad++;
            }
        }
        cg_disk_stats s = cg_disk_get_stats(d);
        ck_assert_uint_eq(s.checksum_failures, bad);
        /* kill -9 alone never tears a record: data is written before its row commits. */
        if (!inject) ck_assert_uint_eq(bad, 0);
        detected += bad;
        ck_assert_uint_eq(s.chunks, v.n - bad); /* detected records are gone */
        check_ok(d);
        cg_disk_close(&d);
    }
    ck_assert_uint_gt(rounds_with_records, 3);
    ck_assert_uint_gt(served, 0);
    fprintf(stderr, "torn: %zu records served intact, %zu torn records detected\n", served,
            detected);
}
END_TEST

/* ---- geometry, lock -------------------------------------------------------------------------- */

START_TEST(test_geometry_mismatch_refused)
{
    cg_disk *d = open_disk(16);
    cg_key k = key_of(1);
    ck_assert_int_eq(put_key(d, &k, 5, 1, NULL), CG_OK);

    /* A second process (or open) on the same directory. */
    cg_disk *d2 = NULL;
    ck_assert_int_eq(cg_disk_open(params_for(g_dir, 16), &d2), CG_E_CONFLICT);
    ck_assert_ptr_null(d2);
    cg_disk_close(&d);

    cg_disk_params p = params_for(g_dir, 16);
    p.model_id = "another-model";
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_UNSUPPORTED);
    ck_assert_ptr_null(d);

    p = params_for(g_dir, 16);
    p.head_dim = HD * 2;
    p.block_bytes = BB * 2;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_UNSUPPORTED);

    p = params_for(g_dir, 16);
    p.n_layers = LAYERS * 2;
    p.n_kv_heads = HEADS / 2; /* same block bytes, other geometry */
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_UNSUPPORTED);

    p = params_for(g_dir, 16);
    p.block_tokens = BT * 2;
    p.block_bytes = BB * 2;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_UNSUPPORTED);

    /* Bad parameters. */
    p = params_for(g_dir, 16);
    p.block_bytes = BB + 4;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_VALUE);
    p = params_for(g_dir, 16);
    p.capacity_bytes = BB - 1;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_VALUE);
    p = params_for(g_dir, 16);
    p.model_id = "";
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_VALUE);
    p = params_for(NULL, 16);
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_VALUE);

    /* The right geometry still opens and serves; a different capacity is fine. */
    d = open_disk(32);
    ck_assert_int_eq(get_key(d, &k, 5, 2), CG_OK);
    cg_disk_close(&d);
}
END_TEST

/* --disk-mb beyond the filesystem's free space: refused at open, not found out at a spill
 * after records were dropped for it */
START_TEST(test_no_room_refused)
{
    /* slots of 1 MiB, so that 2 TiB (more than any test machine has free) is 2M of them */
    char big[600];
    snprintf(big, sizeof big, "%s/big", g_dir);
    cg_disk_params p = th_disk_params((th_kv_geom){2, 2, 2048, 16}, big, MODEL, (size_t)2 << 40);
    ck_assert_uint_eq(p.block_bytes, (size_t)1 << 20);
    struct statvfs fs;
    ck_assert_int_eq(statvfs(g_dir, &fs), 0);
    if ((unsigned long long)fs.f_bavail * fs.f_frsize >= (2ull << 40)) {
        printf("test_no_room_refused: this filesystem has 2 TiB free; not checked\n");
        return;
    }
    cg_disk *d = NULL;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_E_UNAVAILABLE);
    ck_assert_ptr_null(d);
    /* refused before the file was sized: nothing of the 2 TiB is left behind */
    char blocks[700];
    snprintf(blocks, sizeof blocks, "%s/kv.blocks", big);
    struct stat sb;
    ck_assert_int_eq(stat(blocks, &sb), 0);
    ck_assert_int_lt(sb.st_size, (off_t)1 << 30);
    /* a capacity that fits opens in the same directory */
    p.capacity_bytes = (size_t)4 << 20;
    ck_assert_int_eq(cg_disk_open(p, &d), CG_OK);
    check_ok(d);
    cg_disk_close(&d);
}
END_TEST

/* Removes g_dir's kv.db.damaged-* files; returns how many there were, and the size of the
 * first (the set-aside inventory) in *bytes. */
static int remove_damaged(off_t *bytes)
{
    DIR *dir = opendir(g_dir);
    ck_assert_ptr_nonnull(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (strncmp(e->d_name, "kv.db.damaged-", 14) != 0) continue;
        char p[400];
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        struct stat sb;
        if (!strchr(e->d_name + 14, '-') && stat(p, &sb) == 0) *bytes = sb.st_size;
        ck_assert_int_eq(unlink(p), 0);
        n++;
    }
    closedir(dir);
    return n;
}

/* Overwrites n bytes of g_dir's kv.db at offset with 0xA5. */
static void scribble_db(off_t offset, size_t n)
{
    char p[160];
    path_in(p, sizeof p, "kv.db");
    int fd = open(p, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    uint8_t *junk = cg_malloc(n);
    memset(junk, 0xA5, n);
    ck_assert_int_eq(pwrite(fd, junk, n, offset), (ssize_t)n);
    free(junk);
    close(fd);
}

/* A damaged inventory (its header, then a page of its tables) does not keep the tier from
 * opening: the file is kept aside as kv.db.damaged-<ms>, the tier starts empty and works. */
START_TEST(test_damaged_inventory_set_aside)
{
    for (int where = 0; where < 2; where++) {
        cg_disk *d = open_disk(64);
        for (uint64_t i = 0; i < 40; i++) {
            cg_key k = key_of(i);
            ck_assert_int_eq(put_key(d, &k, 5, 1000 + i, NULL), CG_OK);
        }
        cg_disk_close(&d); /* checkpoints the WAL into kv.db */
        char p[160];
        path_in(p, sizeof p, "kv.db");
        struct stat sb;
        ck_assert_int_eq(stat(p, &sb), 0);
        ck_assert_int_gt(sb.st_size, 4096);
        if (where == 0)
            scribble_db(0, 100); /* the header: not a database */
        else
            scribble_db(sb.st_size - 4096, 4096); /* the last page: the header still reads */
        d = open_disk(64);
        cg_disk_stats st = cg_disk_get_stats(d);
        ck_assert_uint_eq(st.chunks, 0);
        ck_assert_uint_eq(st.used_bytes, 0);
        cg_key k = key_of(1000);
        ck_assert_int_eq(put_key(d, &k, 9, 5000, NULL), CG_OK);
        ck_assert_int_eq(get_key(d, &k, 9, 5001), CG_OK);
        check_ok(d);
        cg_disk_close(&d);
        off_t kept = 0;
        ck_assert_int_eq(remove_damaged(&kept), 1);
        ck_assert_int_eq(kept, sb.st_size);
        /* and the new inventory is sound */
        d = open_disk(64);
        ck_assert_uint_eq(cg_disk_get_stats(d).chunks, 1);
        ck_assert_int_eq(get_key(d, &k, 9, 6000), CG_OK);
        cg_disk_close(&d);
        rm_dir_files(g_dir);
    }
}
END_TEST

START_TEST(test_foreign_inventory_refused)
{
    sql_exec("CREATE TABLE something (x INTEGER)");
    cg_disk *d = NULL;
    ck_assert_int_eq(cg_disk_open(params_for(g_dir, 16), &d), CG_E_UNSUPPORTED);
    ck_assert_ptr_null(d);
}
END_TEST

/* ---- the pool's block layout and eviction callback ------------------------------------------ */

typedef struct spill_ctx {
    cg_disk *d;
    size_t spilled;
} spill_ctx;

static cg_pool *g_pool;

static void on_evict(void *ud, const cg_key *key, const cg_pool_chunk *c)
{
    spill_ctx *s = ud;
    cg_disk_pool_src src = {g_pool, c};
    if (cg_disk_put(s->d, key, cg_pool_chunk_tokens(c), cg_disk_pool_block, &src, 77, NULL) ==
        CG_OK)
        s->spilled++;
}

static float pool_val(unsigned chunk, int l, int h, int kv, uint32_t t, int dd)
{
    return (float)((int)chunk * 100000 + l * 10000 + h * 1000 + kv * 500 + (int)t * 10 + dd);
}

START_TEST(test_pool_spill_and_restore)
{
    cg_disk *d = open_disk(64);
    spill_ctx sc = {d, 0};
    cg_pool_params pp = th_pool_params(GEOM, 6 * BB); /* two chunks of 10 tokens (3 blocks) */
    pp.on_evict = on_evict;
    pp.on_evict_ud = &sc;
    ck_assert_uint_eq(cg_pool_block_bytes(&pp), BB);
    ck_assert_int_eq(cg_pool_open(pp, &g_pool), CG_OK);
    const uint32_t nt = 10;
    for (int i = 0; i < 3; i++) {
        cg_key k = key_of(100 + (uint64_t)i);
        cg_pool_chunk *c = NULL;
        ck_assert_int_eq(cg_pool_insert(g_pool, &k, nt, (uint64_t)i, &c, NULL), CG_OK);
        th_pool_fill(g_pool, c, pool_val, (unsigned)i);
        cg_pool_publish(g_pool, c, (uint64_t)i);
        cg_pool_release(g_pool, &c, (uint64_t)i);
    }
    /* The third insert evicted chunk 0: spilled from inside the pool's callback. */
    ck_assert_uint_eq(sc.spilled, 1);
    cg_key k0 = key_of(100);
    ck_assert(cg_disk_contains(d, &k0));
    cg_pool_chunk *c = NULL;
    ck_assert_int_eq(cg_pool_get(g_pool, &k0, 10, &c), CG_E_NOT_FOUND);

    /* Restore: read the blocks, check them against the pool layout
     * [head][layer][K,V][block_tokens][head_dim], and copy them into a new pool chunk. */
    uint8_t *buf = cg_malloc(3 * BB);
    ck_assert_int_eq(cg_disk_get_buf(d, &k0, nt, buf, 3 * BB, 11), CG_OK);
    const float *f = (const float *)buf;
    float *rows = cg_malloc(nt * HD * sizeof *rows);
    ck_assert_int_eq(cg_pool_insert(g_pool, &k0, nt, 12, &c, NULL), CG_OK);
    for (int l = 0; l < LAYERS; l++)
        for (int h = 0; h < HEADS; h++)
            for (int kv = 0; kv < 2; kv++) {
                for (uint32_t t = 0; t < nt; t++) {
                    size_t blk = t / BT, tt = t % BT;
                    const float *row =
                        f + blk * (BB / 4) + ((((size_t)h * LAYERS + l) * 2 + kv) * BT + tt) * HD;
                    for (int dd = 0; dd < HD; dd++) {
                        ck_assert(row[dd] == pool_val(0, l, h, kv, t, dd));
                        rows[t * HD + dd] = row[dd];
                    }
                }
                cg_pool_chunk_write(g_pool, c, l, h, kv, rows);
            }
    cg_pool_publish(g_pool, c, 12);
    cg_pool_release(g_pool, &c, 12);
    /* Inserting chunk 0 again evicted chunk 1, spilled as well. */
    ck_assert_uint_eq(sc.spilled, 2);
    ck_assert_int_eq(cg_pool_get(g_pool, &k0, 13, &c), CG_OK);
    ck_assert_uint_eq(cg_pool_chunk_tokens(c), nt);
    ck_assert(th_pool_matches(g_pool, c, pool_val, 0));
    cg_pool_release(g_pool, &c, 14);
    free(rows);
    free(buf);
    ck_assert_int_eq(cg_pool_check(g_pool), CG_OK);
    cg_pool_close(&g_pool);
    check_ok(d);
    cg_disk_close(&d);
}
END_TEST

/* ---- threads -------------------------------------------------------------------------------- */

#define MT_THREADS 4
#define MT_OPS 2500
#define MT_KEYS 64
#define MT_MAX_TOKENS 24

typedef struct mt_arg {
    cg_disk *d;
    uint64_t seed;
    size_t gets_ok, puts_ok;
} mt_arg;

static int g_mt_failed;

static void info_noop(void *ud, const cg_disk_chunk_info *info)
{
    (void)info;
    (*(size_t *)ud)++;
}

static void *mt_main(void *p)
{
    mt_arg *a = p;
    uint64_t s = a->seed;
    size_t maxb = chunk_bytes(MT_MAX_TOKENS);
    uint8_t *buf = cg_malloc(maxb), *want = cg_malloc(maxb);
    for (int i = 0; i < MT_OPS; i++) {
        uint64_t r = th_splitmix64(&s);
        cg_key k = key_of(r % MT_KEYS);
        uint32_t nt = tokens_of(&k, MT_MAX_TOKENS);
        uint64_t now = (uint64_t)i;
        switch ((r >> 32) % 20) {
        case 0:
        case 1:
            if (cg_disk_remove(a->d, &k) == CG_E_IO) g_mt_failed = 1;
            break;
        case 2: {
            size_t n = 0;
            cg_disk_foreach(a->d, info_noop, &n);
            cg_disk_chunk_info info;
            if (cg_disk_peek(a->d, &k, &info) == CG_OK && info.tokens != nt) g_mt_failed = 1;
            break;
        }
        default:
            if ((r >> 20) % 2) {
                fill_chunk(&k, nt, buf);
                chunk_src src = {buf};
                cg_status st = cg_disk_put(a->d, &k, nt, src_block, &src, now, NULL);
                if (st == CG_OK)
                    a->puts_ok++;
                else if (st != CG_E_CONFLICT && st != CG_E_FULL)
                    g_mt_failed = 1;
            } else {
                cg_status st = cg_disk_get_buf(a->d, &k, nt, buf, maxb, now);
                if (st == CG_OK) {
                    fill_chunk(&k, nt, want);
                    if (memcmp(buf, want, chunk_bytes(nt)) != 0) g_mt_failed = 1;
                    a->gets_ok++;
                } else if (st != CG_E_NOT_FOUND) {
                    g_mt_failed = 1;
                }
            }
        }
    }
    free(buf);
    free(want);
    return NULL;
}

START_TEST(test_threads_smoke)
{
    cg_disk *d = open_disk(48);
    pthread_t t[MT_THREADS];
    mt_arg a[MT_THREADS];
    g_mt_failed = 0;
    for (int i = 0; i < MT_THREADS; i++) {
        a[i] = (mt_arg){.d = d, .seed = 1234 + (uint64_t)i * 99};
        ck_assert_int_eq(pthread_create(&t[i], NULL, mt_main, &a[i]), 0);
    }
    size_t gets = 0, puts = 0;
    for (int i = 0; i < MT_THREADS; i++) {
        pthread_join(t[i], NULL);
        gets += a[i].gets_ok;
        puts += a[i].puts_ok;
    }
    ck_assert_int_eq(g_mt_failed, 0);
    ck_assert_uint_gt(gets, 100);
    ck_assert_uint_gt(puts, 100);
    cg_disk_stats s = cg_disk_get_stats(d);
    ck_assert_uint_eq(s.checksum_failures, 0); /* no slot was ever reused under a reader */
    ck_assert_uint_eq(s.io_errors, 0);
    ck_assert_uint_eq(s.used_bytes, s.chunk_bytes); /* nothing in flight is left behind */
    ck_assert_uint_gt(s.drops, 0);
    check_ok(d);
    cg_disk_close(&d);

    d = open_disk(48);
    list_ctx v = {.cap = 128};
    cg_disk_foreach(d, list_fn, &v);
    ck_assert_uint_eq(v.n, s.chunks);
    for (size_t i = 0; i < v.n; i++)
        ck_assert_int_eq(get_key(d, &v.keys[i], v.tokens[i], 1), CG_OK);
    cg_disk_close(&d);
}
END_TEST

int main(void)
{
    cg_log_init("test_disk", CG_LOG_ERROR);
    return th_run_suite(
        "disk", "core", 120, (th_fixture){setup, teardown, 1}, CK_FORK_GETENV,
        TH_TESTS(test_round_trip, test_sync_mode, test_restart, test_lru_drop_when_full,
                 test_no_room_refused, test_chunk_bigger_than_disk, test_corruption_detected,
                 test_swapped_rows_and_truncated_file, test_open_drops_bad_rows,
                 test_callback_races, test_torn_writes_never_served, test_geometry_mismatch_refused,
                 test_foreign_inventory_refused, test_damaged_inventory_set_aside,
                 test_pool_spill_and_restore, test_threads_smoke));
}
