/* Check suite for the SQLite chunk index (sql/index.h) and the helpers of sql/db.h: schema
 * versions, the WAL switch, every write op, batched lookups, paging, writer batching,
 * concurrency and kill -9 crash safety. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "sql/db.h"
#include "sql/index.h"
#include "tests/harness/harness.h"

/* ---- fixtures ----------------------------------------------------------------------------- */

static char g_dir[64];
static char g_path[128];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/cg_index_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/index.db", g_dir);
}

static void rm_suffix(const char *suffix)
{
    char p[160];
    snprintf(p, sizeof p, "%s%s", g_path, suffix);
    unlink(p);
}

static void teardown(void)
{
    rm_suffix("");
    rm_suffix("-wal");
    rm_suffix("-shm");
    rmdir(g_dir);
}

/* A deterministic, hash-like key for integer i (what XXH3 keys look like: random bytes). */
static cg_key key_of(uint64_t i)
{
    return th_key_of(i, 12345);
}

static cg_index *open_default(void)
{
    cg_index *ix = NULL;
    ck_assert_int_eq(cg_index_open(g_path, cg_index_default_params(), &ix), CG_OK);
    ck_assert_ptr_nonnull(ix);
    return ix;
}

static void flush_ok(cg_index *ix)
{
    ck_assert_int_eq(cg_index_flush(ix), CG_OK);
}

static void check_ok(cg_index *ix)
{
    char msg[512];
    cg_status st = cg_index_check(ix, msg, sizeof msg);
    ck_assert_msg(st == CG_OK, "index check failed: %s", msg);
    ck_assert_str_eq(msg, "ok");
}

/* Test-only raw access to the file, for properties the API deliberately hides. */
static int64_t raw_int(const char *sql)
{
    char *t = th_sql_text(g_path, sql);
    int64_t v = atoll(t);
    free(t);
    return v;
}

static void raw_exec(const char *sql)
{
    th_sql_exec(g_path, sql);
}

static cg_index_stats stats_of(cg_index *ix)
{
    cg_index_stats st;
    ck_assert_int_eq(cg_index_stats_get(ix, &st), CG_OK);
    return st;
}

/* The stats, asserted to count these chunks, placements and chunk bytes. */
static cg_index_stats expect_totals(cg_index *ix, int64_t chunks, int64_t placements, int64_t bytes)
{
    cg_index_stats st = stats_of(ix);
    ck_assert_int_eq(st.chunks, chunks);
    ck_assert_int_eq(st.placements, placements);
    ck_assert_int_eq(st.bytes, bytes);
    return st;
}

static cg_index_entry lookup1(cg_index *ix, const cg_key *k)
{
    cg_index_entry e;
    memset(&e, 0xAB, sizeof e); /* the lookup must overwrite every field it reports */
    ck_assert_int_eq(cg_index_lookup(ix, k, 1, &e), CG_OK);
    return e;
}

/* ---- open / create / migrate ---------------------------------------------------------------- */

START_TEST(test_create_sets_version)
{
    cg_index *ix = open_default();
    cg_index_stats st = expect_totals(ix, 0, 0, 0);
    ck_assert_int_eq(st.workers, 0);
    ck_assert_int_gt(st.file_bytes, 0);
    check_ok(ix);
    cg_index_close(&ix);
    ck_assert_ptr_null(ix);
    cg_index_close(&ix); /* NULL is accepted */
    ck_assert_int_eq(raw_int("PRAGMA user_version"), CG_INDEX_SCHEMA_VERSION);
    ck_assert_int_eq(raw_int("PRAGMA application_id"), 0x43474958);
    ck_assert_int_eq(raw_int("SELECT count(*) FROM sqlite_schema WHERE name = 'chunks'"), 1);
    /* WAL mode is persistent in the file header. */
    char *mode = th_sql_text(g_path, "PRAGMA journal_mode");
    ck_assert_str_eq(mode, "wal");
    free(mode);
}
END_TEST

/* The one WAL switch every opener uses (sql/db.c): a file goes to WAL; a database where SQLite
 * keeps another mode without an error (in memory) is refused, not taken as WAL. */
START_TEST(test_wal_switch)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(g_path, &db), SQLITE_OK);
    ck_assert_int_eq(cg_db_use_wal("test", db, g_path), CG_OK);
    ck_assert_int_eq(cg_db_use_wal("test", db, g_path), CG_OK); /* already WAL */
    sqlite3_close(db);
    char *mode = th_sql_text(g_path, "PRAGMA journal_mode");
    ck_assert_str_eq(mode, "wal");
    free(mode);

    ck_assert_int_eq(sqlite3_open(":memory:", &db), SQLITE_OK);
    ck_assert_int_eq(cg_db_use_wal("test", db, ":memory:"), CG_E_IO);
    sqlite3_close(db);
}
END_TEST

START_TEST(test_reopen_keeps_data)
{
    cg_index *ix = open_default();
    int64_t w = 0;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://w1:8000", "tiny", 100, &w), CG_OK);
    for (int i = 0; i < 50; i++) {
        cg_key k = key_of(i);
        cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, 10 + i, 1000 + i);
        cg_index_placement_set(ix, &k, w, CG_TIER_RAM, 7, 2000);
    }
    /* no flush: close must drain the queue */
    cg_index_close(&ix);
    ix = open_default();
    cg_index_stats st = expect_totals(ix, 50, 50, 50 * 10 + 49 * 50 / 2);
    ck_assert_int_eq(st.workers, 1);
    cg_key k = key_of(42);
    cg_index_entry e = lookup1(ix, &k);
    ck_assert_int_eq(e.found, 1);
    ck_assert_int_eq(e.bytes, 52);
    ck_assert_int_eq(e.tokens, 7);
    ck_assert_int_eq(e.n_placements, 1);
    ck_assert_int_eq(e.placements[0].worker_id, w);
    int64_t w2 = 0;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://w1:8000", "tiny", 300, &w2), CG_OK);
    ck_assert_int_eq(w2, w); /* same url after reopen -> same id */
    check_ok(ix);
    cg_index_close(&ix);
    ck_assert_int_eq(raw_int("PRAGMA user_version"), CG_INDEX_SCHEMA_VERSION);
}
END_TEST

START_TEST(test_refuse_future_version)
{
    cg_index *ix = open_default();
    cg_index_close(&ix);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", CG_INDEX_SCHEMA_VERSION + 1);
    raw_exec(sql);
    ck_assert_int_eq(cg_index_open(g_path, cg_index_default_params(), &ix), CG_E_UNSUPPORTED);
    ck_assert_ptr_null(ix);
    /* Refusing must not touch the file: its version is still the future one. */
    ck_assert_int_eq(raw_int("PRAGMA user_version"), CG_INDEX_SCHEMA_VERSION + 1);
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", CG_INDEX_SCHEMA_VERSION);
    raw_exec(sql);
    ck_assert_int_eq(cg_index_open(g_path, cg_index_default_params(), &ix), CG_OK);
    cg_index_close(&ix);
}
END_TEST

/* A version 1 file (placements limited to 'ram' and 'disk') is migrated to version 2: its rows
 * and totals are kept, and tier 'remote' is accepted afterwards. */
START_TEST(test_migrate_v1_remote_tier)
{
    cg_index *ix = open_default();
    int64_t w = -1;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://w1", "m", 1, &w), CG_OK);
    cg_key k0 = key_of(1), k1 = key_of(2);
    cg_index_placement_set(ix, &k0, w, CG_TIER_RAM, 10, 2);
    cg_index_placement_set(ix, &k1, w, CG_TIER_DISK, 11, 2);
    flush_ok(ix);
    cg_index_close(&ix);
    /* back to the version 1 table, as an older gateway left it */
    raw_exec("PRAGMA foreign_keys = OFF; BEGIN;"
             "CREATE TABLE p1 (key BLOB NOT NULL REFERENCES chunks (key) ON DELETE CASCADE,"
             " worker_id INTEGER NOT NULL REFERENCES workers (id) ON DELETE CASCADE,"
             " tier TEXT NOT NULL CHECK (tier IN ('ram', 'disk')),"
             " tokens INTEGER NOT NULL CHECK (tokens >= 0), updated INTEGER NOT NULL,"
             " PRIMARY KEY (key, worker_id)) WITHOUT ROWID;"
             "INSERT INTO p1 SELECT * FROM placements; DROP TABLE placements;"
             "ALTER TABLE p1 RENAME TO placements;"
             "CREATE INDEX placements_by_worker ON placements (worker_id);"
             "CREATE TRIGGER placements_ins AFTER INSERT ON placements BEGIN"
             " UPDATE totals SET placements = placements + 1 WHERE id = 1; END;"
             "CREATE TRIGGER placements_del AFTER DELETE ON placements BEGIN"
             " UPDATE totals SET placements = placements - 1 WHERE id = 1; END;"
             "PRAGMA user_version = 1; COMMIT;");
    ck_assert_int_eq(raw_int("SELECT count(*) FROM placements"), 2);
    ix = open_default();
    ck_assert_int_eq(raw_int("PRAGMA user_version"), CG_INDEX_SCHEMA_VERSION);
    check_ok(ix);
    ck_assert_int_eq(stats_of(ix).placements, 2);
    cg_index_entry e = lookup1(ix, &k1);
    ck_assert_int_eq(e.n_placements, 1);
    ck_assert_int_eq(e.placements[0].tier, CG_TIER_DISK);
    ck_assert_int_eq(e.placements[0].tokens, 11);
    /* a shared tier's row takes 'remote' placements, seen while queued and once committed */
    char url[64];
    cg_index_tier_row_url("redis://r:6379", url, sizeof url);
    ck_assert_str_eq(url, "remote:redis://r:6379");
    int64_t t = -1;
    ck_assert_int_eq(cg_index_worker_add(ix, url, "m", 3, &t), CG_OK);
    cg_index_placement_set(ix, &k0, t, CG_TIER_REMOTE, 10, 4);
    e = lookup1(ix, &k0);
    ck_assert_int_eq(e.n_placements, 2);
    ck_assert_int_eq(e.placements[1].worker_id, t);
    ck_assert_int_eq(e.placements[1].tier, CG_TIER_REMOTE);
    flush_ok(ix);
    e = lookup1(ix, &k0);
    ck_assert_int_eq(e.n_placements, 2);
    ck_assert_int_eq(e.placements[1].tier, CG_TIER_REMOTE);
    ck_assert_int_eq(cg_index_entry_tokens_on(&e, t), 10);
    ck_assert_int_eq(raw_int("SELECT count(*) FROM placements WHERE tier = 'remote'"), 1);
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

/* The position of a chunk event stream is committed in order with the writes and survives a
 * reopen; each stream has its own. */
START_TEST(test_stream_position)
{
    cg_index *ix = open_default();
    char pos[48];
    ck_assert_int_eq(cg_index_stream_pos_get(ix, "events", pos, sizeof pos), CG_E_NOT_FOUND);
    cg_index_stream_pos_set(ix, "events", "1700000000000-0");
    cg_index_stream_pos_set(ix, "events", "1700000000001-3");
    cg_index_stream_pos_set(ix, "other", "5-0");
    flush_ok(ix);
    ck_assert_int_eq(cg_index_stream_pos_get(ix, "events", pos, sizeof pos), CG_OK);
    ck_assert_str_eq(pos, "1700000000001-3");
    ck_assert_int_eq(cg_index_stream_pos_get(ix, "events", pos, 4), CG_E_VALUE);
    cg_index_close(&ix);
    ix = open_default();
    ck_assert_int_eq(cg_index_stream_pos_get(ix, "events", pos, sizeof pos), CG_OK);
    ck_assert_str_eq(pos, "1700000000001-3");
    ck_assert_int_eq(cg_index_stream_pos_get(ix, "other", pos, sizeof pos), CG_OK);
    ck_assert_str_eq(pos, "5-0");
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

START_TEST(test_refuse_foreign_file)
{
    raw_exec("CREATE TABLE notes (x TEXT)");
    cg_index *ix = NULL;
    ck_assert_int_eq(cg_index_open(g_path, cg_index_default_params(), &ix), CG_E_UNSUPPORTED);
    ck_assert_ptr_null(ix);
    teardown();
    setup();
    raw_exec("PRAGMA application_id = 1234");
    ck_assert_int_eq(cg_index_open(g_path, cg_index_default_params(), &ix), CG_E_UNSUPPORTED);
    cg_index_params p = cg_index_default_params();
    p.read_conns = 0;
    ck_assert_int_eq(cg_index_open(g_path, p, &ix), CG_E_VALUE);
    ck_assert_int_eq(cg_index_open(":memory:", cg_index_default_params(), &ix), CG_E_VALUE);
}
END_TEST

/* ---- chunk ops ------------------------------------------------------------------------------ */

START_TEST(test_chunk_seen_hit)
{
    cg_index *ix = open_default();
    cg_key k = key_of(1), other = key_of(2);
    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_SYS, 123, 1000);
    flush_ok(ix);
    cg_index_chunk c;
    ck_assert_int_eq(cg_index_chunk_get(ix, &k, &c), CG_OK);
    ck_assert_int_eq(memcmp(c.key.b, k.b, 16), 0);
    ck_assert_str_eq(c.model, "tiny");
    ck_assert_int_eq(c.mode, CG_MODE_SYS);
    ck_assert_int_eq(c.tokens, -1);
    ck_assert_int_eq(c.bytes, 123);
    ck_assert_int_eq(c.first_seen, 1000);
    ck_assert_int_eq(c.last_seen, 1000);
    ck_assert_int_eq(c.last_hit, 0);
    ck_assert_int_eq(c.seen_count, 1);
    ck_assert_int_eq(c.hit_count, 0);
    ck_assert_int_eq(c.pinned, 0);
    ck_assert_int_eq(c.n_placements, 0);
    cg_index_chunk_clear(&c);
    ck_assert_ptr_null(c.model);

    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_SYS, 123, 3000);
    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_SYS, 123, 2000); /* late report: last_seen stays */
    cg_index_chunk_hit(ix, &k, 2500);
    cg_index_chunk_hit(ix, &k, 2400);
    cg_index_chunk_hit(ix, &other, 2400); /* unknown chunk: no row appears */
    flush_ok(ix);
    ck_assert_int_eq(cg_index_chunk_get(ix, &k, &c), CG_OK);
    ck_assert_int_eq(c.first_seen, 1000);
    ck_assert_int_eq(c.last_seen, 3000);
    ck_assert_int_eq(c.seen_count, 3);
    ck_assert_int_eq(c.hit_count, 2);
    ck_assert_int_eq(c.last_hit, 2500);
    cg_index_chunk_clear(&c);
    ck_assert_int_eq(cg_index_chunk_get(ix, &other, &c), CG_E_NOT_FOUND);
    ck_assert_ptr_null(c.model);

    cg_index_stats st = stats_of(ix);
    ck_assert_int_eq(st.chunks, 1);
    ck_assert_int_eq(st.bytes, 123);
    ck_assert_uint_eq(st.ops_applied, 6);
    ck_assert_uint_eq(st.ops_failed, 0);
    ck_assert_uint_eq(st.queue_depth, 0);

    /* bytes changes keep the bytes total right (the trigger sees old and new) */
    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_SYS, 200, 4000);
    cg_index_chunk_seen(ix, &other, "tiny", CG_MODE_STRICT, -1, 4000); /* unknown bytes */
    flush_ok(ix);
    st = stats_of(ix);
    ck_assert_int_eq(st.chunks, 2);
    ck_assert_int_eq(st.bytes, 200);
    cg_index_entry e = lookup1(ix, &other);
    ck_assert_int_eq(e.found, 1);
    ck_assert_int_eq(e.bytes, -1);
    ck_assert_int_eq(e.tokens, -1);
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

START_TEST(test_placements_pin_delete)
{
    cg_tier t;
    ck_assert_str_eq(cg_tier_name(CG_TIER_RAM), "ram");
    ck_assert_str_eq(cg_tier_name(CG_TIER_DISK), "disk");
    ck_assert_int_eq(cg_tier_parse("disk", &t), 0);
    ck_assert_int_eq(t, CG_TIER_DISK);
    ck_assert_int_eq(cg_tier_parse("ram", &t), 0);
    ck_assert_int_eq(t, CG_TIER_RAM);
    ck_assert_str_eq(cg_tier_name(CG_TIER_REMOTE), "remote");
    ck_assert_int_eq(cg_tier_parse("remote", &t), 0);
    ck_assert_int_eq(t, CG_TIER_REMOTE);
    ck_assert_int_eq(cg_tier_parse("ssd", &t), -1);
    ck_assert_int_eq(cg_tier_parse(NULL, &t), -1);
    ck_assert_int_eq(cg_tier_parse("miss", &t), -1); /* a segment's miss is not a tier */
    ck_assert_str_eq(cg_tier_name(CG_TIER_COUNT), "unknown");
    ck_assert_str_eq(cg_tier_seg_name(1, CG_TIER_DISK), "disk");
    ck_assert_str_eq(cg_tier_seg_name(0, CG_TIER_DISK), "miss");
    for (int i = 0; i < CG_TIER_COUNT; i++) { /* every name parses back to its tier */
        ck_assert_int_eq(cg_tier_parse(cg_tier_name((cg_tier)i), &t), 0);
        ck_assert_int_eq(t, i);
    }
    cg_index *ix = open_default();
    int64_t w1, w2;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://a", "tiny", 10, &w1), CG_OK);
    ck_assert_int_eq(cg_index_worker_add(ix, "http://b", "tiny-b", 10, &w2), CG_OK);
    ck_assert_int_ne(w1, w2);
    cg_key k = key_of(7), fresh = key_of(8);
    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, 50, 100);
    cg_index_placement_set(ix, &k, w1, CG_TIER_RAM, 33, 200);
    cg_index_placement_set(ix, &k, w2, CG_TIER_DISK, 34, 210);
    cg_index_placement_set(ix, &k, 9999, CG_TIER_RAM, 35, 220); /* unknown worker: no-op */
    /* a worker reports a chunk the gateway never saw: a stub row with the worker's model */
    cg_index_placement_set(ix, &fresh, w2, CG_TIER_RAM, 12, 230);
    flush_ok(ix);

    cg_index_entry e = lookup1(ix, &k);
    ck_assert_int_eq(e.found, 1);
    ck_assert_int_eq(e.tokens, 34); /* last report wins */
    ck_assert_int_eq(e.n_placements, 2);
    ck_assert_int_eq(e.placements[0].worker_id, w1);
    ck_assert_int_eq(e.placements[0].tier, CG_TIER_RAM);
    ck_assert_int_eq(e.placements[0].tokens, 33);
    ck_assert_int_eq(e.placements[0].updated, 200);
    ck_assert_int_eq(e.placements[1].worker_id, w2);
    ck_assert_int_eq(e.placements[1].tier, CG_TIER_DISK);
    ck_assert_int_eq(e.placements[1].tokens, 34);

    cg_index_chunk c;
    ck_assert_int_eq(cg_index_chunk_get(ix, &fresh, &c), CG_OK);
    ck_assert_str_eq(c.model, "tiny-b");
    ck_assert_int_eq(c.mode, -1);
    ck_assert_int_eq(c.bytes, -1);
    ck_assert_int_eq(c.tokens, 12);
    ck_assert_int_eq(c.seen_count, 0);
    ck_assert_int_eq(c.n_placements, 1);
    cg_index_chunk_clear(&c);
    /* the gateway sees it later: the stub gets model, mode and bytes */
    cg_index_chunk_seen(ix, &fresh, "tiny", CG_MODE_SYS, 77, 300);
    flush_ok(ix);
    ck_assert_int_eq(cg_index_chunk_get(ix, &fresh, &c), CG_OK);
    ck_assert_str_eq(c.model, "tiny");
    ck_assert_int_eq(c.mode, CG_MODE_SYS);
    ck_assert_int_eq(c.bytes, 77);
    ck_assert_int_eq(c.tokens, 12);
    ck_assert_int_eq(c.seen_count, 1);
    cg_index_chunk_clear(&c);

    /* move tier, then evict from w1 */
    cg_index_placement_set(ix, &k, w2, CG_TIER_RAM, 34, 400);
    cg_index_placement_del(ix, &k, w1);
    cg_index_placement_del(ix, &k, w1); /* twice: harmless */
    cg_index_chunk_pin(ix, &k, 1);
    flush_ok(ix);
    e = lookup1(ix, &k);
    ck_assert_int_eq(e.n_placements, 1);
    ck_assert_int_eq(e.placements[0].worker_id, w2);
    ck_assert_int_eq(e.placements[0].tier, CG_TIER_RAM);
    ck_assert_int_eq(e.placements[0].updated, 400);
    ck_assert_int_eq(e.pinned, 1);
    expect_totals(ix, 2, 2, 127);

    cg_index_chunk_pin(ix, &k, 0);
    flush_ok(ix);
    ck_assert_int_eq(lookup1(ix, &k).pinned, 0);

    cg_index_chunk_delete(ix, &k);
    flush_ok(ix);
    e = lookup1(ix, &k);
    ck_assert_int_eq(e.found, 0);
    ck_assert_int_eq(e.n_placements, 0);
    ck_assert_int_eq(e.tokens, 0);
    expect_totals(ix, 1, 1, 77);
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

/* ---- workers -------------------------------------------------------------------------------- */

START_TEST(test_workers)
{
    cg_index *ix = open_default();
    int64_t a, b, a2;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://a:1", "m1", 100, &a), CG_OK);
    ck_assert_int_eq(cg_index_worker_add(ix, "http://b:1", "m1", 110, &b), CG_OK);
    ck_assert_int_eq(cg_index_worker_add(ix, "http://a:1", "m2", 120, &a2), CG_OK);
    ck_assert_int_eq(a, a2);
    ck_assert_int_ne(a, b);
    ck_assert_int_eq(cg_index_worker_add(ix, "", "m1", 1, &a2), CG_E_VALUE);

    cg_index_worker w;
    ck_assert_int_eq(cg_index_worker_get_by_url(ix, "http://a:1", &w), CG_OK);
    ck_assert_int_eq(w.id, a);
    ck_assert_str_eq(w.url, "http://a:1");
    ck_assert_str_eq(w.model, "m2"); /* re-adding updates the model */
    ck_assert_int_eq(w.added, 100);
    ck_assert_int_eq(w.last_seen, 120);
    ck_assert_int_eq(w.healthy, 1);
    cg_index_worker_clear(&w);
    ck_assert_int_eq(cg_index_worker_get_by_url(ix, "http://nope", &w), CG_E_NOT_FOUND);

    ck_assert_int_eq(cg_index_worker_set_health(ix, b, 0, 500), CG_OK);
    ck_assert_int_eq(cg_index_worker_set_health(ix, 424242, 1, 500), CG_E_NOT_FOUND);
    ck_assert_int_eq(cg_index_worker_set_health(ix, a, 1, 700), CG_OK);

    cg_index_worker *list = NULL;
    size_t n = 0;
    ck_assert_int_eq(cg_index_workers_list(ix, &list, &n), CG_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(list[0].id, a);
    ck_assert_int_eq(list[0].healthy, 1);
    ck_assert_int_eq(list[0].last_seen, 700);
    ck_assert_int_eq(list[1].id, b);
    ck_assert_int_eq(list[1].healthy, 0);
    ck_assert_int_eq(list[1].last_seen, 110); /* unhealthy does not refresh last_seen */
    cg_index_workers_free(&list, n);
    ck_assert_ptr_null(list);

    /* deleting a worker removes its placements but keeps the chunks */
    for (int i = 0; i < 20; i++) {
        cg_key k = key_of(100 + i);
        cg_index_chunk_seen(ix, &k, "m1", CG_MODE_STRICT, 5, 1);
        cg_index_placement_set(ix, &k, a, CG_TIER_RAM, 3, 2);
        cg_index_placement_set(ix, &k, b, CG_TIER_DISK, 3, 2);
    }
    ck_assert_int_eq(cg_index_worker_delete(ix, b), CG_OK); /* ordered after the queued ops */
    ck_assert_int_eq(cg_index_worker_delete(ix, b), CG_E_NOT_FOUND);
    cg_key k0 = key_of(100);
    cg_index_placement_set(ix, &k0, b, CG_TIER_RAM, 3, 3); /* deleted worker: no-op */
    flush_ok(ix);
    cg_index_stats st = stats_of(ix);
    ck_assert_int_eq(st.workers, 1);
    ck_assert_int_eq(st.chunks, 20);
    ck_assert_int_eq(st.placements, 20);
    cg_index_entry e = lookup1(ix, &k0);
    ck_assert_int_eq(e.n_placements, 1);
    ck_assert_int_eq(e.placements[0].worker_id, a);
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

/* ---- batched lookup ------------------------------------------------------------------------- */

START_TEST(test_lookup_mix)
{
    cg_index *ix = open_default();
    int64_t w[10];
    for (int i = 0; i < 10; i++) {
        char url[32];
        snprintf(url, sizeof url, "http://w%d", i);
        ck_assert_int_eq(cg_index_worker_add(ix, url, "tiny", 1, &w[i]), CG_OK);
    }
    /* even i: present with i % 11 placements (0..10, capped at 8); odd i: missing */
    for (int i = 0; i < 200; i += 2) {
        cg_key k = key_of(i);
        cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, i, 5);
        for (int j = 0; j < i % 11 && j < 10; j++)
            cg_index_placement_set(ix, &k, w[j], j % 2 ? CG_TIER_DISK : CG_TIER_RAM, i + j, 6);
        for (int h = 0; h < i % 3; h++)
            cg_index_chunk_hit(ix, &k, 7);
    }
    flush_ok(ix);
    cg_key keys[201];
    for (int i = 0; i < 200; i++)
        keys[i] = key_of(i);
    keys[200] = key_of(10); /* duplicate */
    cg_index_entry *out = cg_malloc(201 * sizeof *out);
    memset(out, 0x5A, 201 * sizeof *out);
    ck_assert_int_eq(cg_index_lookup(ix, keys, 201, out), CG_OK);
    for (int i = 0; i < 201; i++) {
        int id = i == 200 ? 10 : i;
        cg_index_entry *e = &out[i];
        if (id % 2) {
            ck_assert_int_eq(e->found, 0);
            ck_assert_int_eq(e->n_placements, 0);
            ck_assert_int_eq(e->seen_count, 0);
            continue;
        }
        ck_assert_int_eq(e->found, 1);
        ck_assert_int_eq(e->bytes, id);
        ck_assert_int_eq(e->seen_count, 1);
        ck_assert_int_eq(e->hit_count, id % 3);
        int np = id % 11;
        ck_assert_int_eq(e->n_placements,
                         np > CG_INDEX_MAX_PLACEMENTS ? CG_INDEX_MAX_PLACEMENTS : np);
        ck_assert_int_eq(e->tokens, np ? id + np - 1 : -1);
        for (int j = 0; j < e->n_placements; j++) {
            ck_assert_int_eq(e->placements[j].worker_id, w[j]);
            ck_assert_int_eq(e->placements[j].tier, j % 2 ? CG_TIER_DISK : CG_TIER_RAM);
            ck_assert_int_eq(e->placements[j].tokens, id + j);
        }
    }
    ck_assert_int_eq(cg_index_lookup(ix, keys, 0, out), CG_OK);
    cg_free(&out);
    cg_index_close(&ix);
}
END_TEST

/* ---- paging --------------------------------------------------------------------------------- */

static int key_cmp(const void *a, const void *b)
{
    return memcmp(a, b, 16);
}

START_TEST(test_paging)
{
    cg_index *ix = open_default();
    enum { N = 1000 };
    cg_key *want = cg_malloc(N * sizeof *want);
    for (int i = 0; i < N; i++) {
        want[i] = key_of(5000 + i);
        cg_index_chunk_seen(ix, &want[i], "tiny", CG_MODE_STRICT, i, 1);
    }
    flush_ok(ix);
    qsort(want, N, sizeof *want, key_cmp);

    cg_index_chunk *rows = NULL;
    size_t n = 0, total = 0;
    cg_key after;
    int have_after = 0, pages = 0;
    for (;;) {
        ck_assert_int_eq(cg_index_chunks_list(ix, have_after ? &after : NULL, 64, &rows, &n),
                         CG_OK);
        if (n == 0) {
            cg_index_chunks_free(&rows, n);
            break;
        }
        pages++;
        ck_assert_uint_le(n, 64);
        for (size_t i = 0; i < n; i++) {
            ck_assert_uint_lt(total, N);
            ck_assert_int_eq(memcmp(rows[i].key.b, want[total].b, 16), 0); /* ascending, complete */
            ck_assert_str_eq(rows[i].model, "tiny");
            ck_assert_int_eq(rows[i].seen_count, 1);
            total++;
        }
        after = rows[n - 1].key;
        have_after = 1;
        cg_index_chunks_free(&rows, n);
        ck_assert_ptr_null(rows);
    }
    ck_assert_uint_eq(total, N);
    ck_assert_int_eq(pages, (N + 63) / 64);

    /* a page that starts mid-way */
    ck_assert_int_eq(cg_index_chunks_list(ix, &want[499], 10, &rows, &n), CG_OK);
    ck_assert_uint_eq(n, 10);
    ck_assert_int_eq(memcmp(rows[0].key.b, want[500].b, 16), 0);
    cg_index_chunks_free(&rows, n);
    ck_assert_int_eq(cg_index_chunks_list(ix, NULL, 0, &rows, &n), CG_E_VALUE);
    ck_assert_int_eq(cg_index_chunks_list(ix, NULL, 10001, &rows, &n), CG_E_VALUE);
    ck_assert_ptr_null(rows);
    cg_free(&want);
    cg_index_close(&ix);
}
END_TEST

/* ---- writer batching and the queue cap ------------------------------------------------------- */

START_TEST(test_writer_batching)
{
    cg_index *ix = NULL;
    cg_index_params p = cg_index_default_params();
    p.batch_max = 1024;
    ck_assert_int_eq(cg_index_open(g_path, p, &ix), CG_OK);
    enum { K = 50000 };
    for (int i = 0; i < K; i++) {
        cg_key k = key_of(i);
        cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, 1, i);
        cg_index_chunk_hit(ix, &k, i);
    }
    flush_ok(ix);
    cg_index_stats st = stats_of(ix);
    ck_assert_uint_eq(st.ops_applied, 2 * K);
    ck_assert_uint_eq(st.ops_failed, 0);
    ck_assert_uint_eq(st.ops_dropped, 0);
    ck_assert_uint_eq(st.queue_depth, 0);
    ck_assert_uint_ge(st.batches, (2 * K + 1023) / 1024); /* at most batch_max ops per batch */
    ck_assert_uint_lt(st.batches, 2 * K / 4);             /* and many ops per transaction */
    ck_assert_int_eq(st.chunks, K);
    ck_assert_int_eq(st.bytes, K);
    for (int i = 0; i < K; i += 997) {
        cg_key k = key_of(i);
        cg_index_entry e = lookup1(ix, &k);
        ck_assert_int_eq(e.found, 1);
        ck_assert_int_eq(e.seen_count, 1);
        ck_assert_int_eq(e.hit_count, 1);
    }
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

START_TEST(test_queue_full_drops)
{
    cg_index *ix = open_default();
    cg_index_close(&ix);
    cg_index_params p = cg_index_default_params();
    p.queue_max = 10;
    p.busy_timeout_ms = 20000;
    ck_assert_int_eq(cg_index_open(g_path, p, &ix), CG_OK);
    int64_t w;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://w", "tiny", 1, &w), CG_OK);
    const uint64_t applied0 = stats_of(ix).ops_applied;
    /* Hold the write lock from another connection so the writer is stuck in BEGIN. */
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(g_path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < 1000; i++) {
        cg_key k = key_of(i);
        cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, 1, 1);
    }
    cg_key pk = key_of(3);
    cg_index_chunk_pin(ix, &pk, 1); /* control op: accepted beyond the cap */
    /* a chunk event's placement is kept too (its stream position follows it); a request's
     * is dropped */
    cg_key ek = key_of(5), rk = key_of(6);
    cg_index_event_placement_set(ix, &ek, w, CG_TIER_RAM, 12, 1);
    cg_index_placement_set(ix, &rk, w, CG_TIER_RAM, 12, 1);
    cg_index_stats st = stats_of(ix);
    ck_assert_uint_eq(st.ops_dropped, 991);
    ck_assert_uint_eq(st.queue_depth, 12);
    ck_assert_int_eq(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    flush_ok(ix);
    st = stats_of(ix);
    ck_assert_uint_eq(st.ops_applied - applied0, 12);
    ck_assert_int_eq(st.chunks, 10);
    ck_assert_int_eq(lookup1(ix, &pk).pinned, 1);
    ck_assert_int_eq(lookup1(ix, &ek).n_placements, 1);
    cg_index_close(&ix);
}
END_TEST

START_TEST(test_batch_lost_when_locked)
{
    cg_index *ix = NULL;
    cg_index_params p = cg_index_default_params();
    p.busy_timeout_ms = 50;
    ck_assert_int_eq(cg_index_open(g_path, p, &ix), CG_OK);
    cg_key k = key_of(1);
    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, 1, 1);
    flush_ok(ix);
    /* Another process holds the write lock longer than the writer's retries. */
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(g_path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < 5; i++)
        cg_index_chunk_hit(ix, &k, 2);
    ck_assert_int_eq(cg_index_flush(ix), CG_E_IO);
    int64_t id = 0;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://w", "tiny", 1, &id), CG_E_IO);
    cg_index_stats st = stats_of(ix);
    ck_assert_uint_eq(st.ops_failed, 6);
    ck_assert_uint_eq(st.ops_applied, 1);
    ck_assert_uint_eq(st.queue_depth, 0);
    ck_assert_int_eq(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    /* The writer recovers: later ops commit. */
    cg_index_chunk_hit(ix, &k, 3);
    flush_ok(ix);
    ck_assert_int_eq(lookup1(ix, &k).hit_count, 1);
    ck_assert_int_eq(cg_index_worker_add(ix, "http://w", "tiny", 1, &id), CG_OK);
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

/* ---- inventory replace ---------------------------------------------------------------------- */

START_TEST(test_inventory_replace)
{
    cg_index *ix = open_default();
    int64_t a, b;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://a", "tiny", 1, &a), CG_OK);
    ck_assert_int_eq(cg_index_worker_add(ix, "http://b", "tiny", 1, &b), CG_OK);
    cg_key k[10];
    for (int i = 0; i < 10; i++) {
        k[i] = key_of(300 + i);
        if (i < 8) cg_index_chunk_seen(ix, &k[i], "tiny", CG_MODE_STRICT, 1, 1);
    }
    for (int i = 0; i < 5; i++)
        cg_index_placement_set(ix, &k[i], a, CG_TIER_RAM, 10, 1);
    cg_index_placement_set(ix, &k[0], b, CG_TIER_RAM, 10, 1);
    /* a's inventory is now k[3..9] (k[8], k[9] are new to the gateway), tiers alternate */
    cg_tier tiers[7];
    int64_t toks[7];
    for (int i = 0; i < 7; i++) {
        tiers[i] = i % 2 ? CG_TIER_DISK : CG_TIER_RAM;
        toks[i] = 100 + i;
    }
    cg_index_worker_placements_replace(ix, a, &k[3], tiers, toks, 7, 50);
    cg_index_worker_placements_replace(ix, 777, &k[0], tiers, toks, 7, 50); /* unknown worker */
    flush_ok(ix);
    cg_index_entry e[10];
    ck_assert_int_eq(cg_index_lookup(ix, k, 10, e), CG_OK);
    for (int i = 0; i < 10; i++) {
        int on_a = 0, on_b = 0;
        for (int j = 0; j < e[i].n_placements; j++) {
            if (e[i].placements[j].worker_id == a) {
                on_a = 1;
                ck_assert_int_eq(e[i].placements[j].tokens, 100 + (i - 3));
                ck_assert_int_eq(e[i].placements[j].tier, (i - 3) % 2 ? CG_TIER_DISK : CG_TIER_RAM);
                ck_assert_int_eq(e[i].placements[j].updated, 50);
            } else {
                ck_assert_int_eq(e[i].placements[j].worker_id, b);
                on_b = 1;
            }
        }
        ck_assert_int_eq(on_a, i >= 3);
        ck_assert_int_eq(on_b, i == 0); /* other workers untouched */
        ck_assert_int_eq(e[i].found, 1);
    }
    ck_assert_int_eq(e[9].seen_count, 0); /* stub row */
    cg_index_stats st = stats_of(ix);
    ck_assert_int_eq(st.placements, 8);
    ck_assert_int_eq(st.chunks, 10);

    cg_index_worker_placements_replace(ix, a, NULL, NULL, NULL, 0, 60); /* a holds nothing */
    flush_ok(ix);
    st = stats_of(ix);
    ck_assert_int_eq(st.placements, 1);
    ck_assert_int_eq(st.chunks, 10); /* chunk rows stay */
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

/* ---- read your writes ------------------------------------------------------------------------ */

/* Lookups see placements still waiting in the write queue: the writer is held in BEGIN by
 * another connection, and the queued set, delete and inventory replace show at once, then
 * remain the same once committed. */
START_TEST(test_queued_placements_visible)
{
    cg_index *ix = NULL;
    cg_index_params p = cg_index_default_params();
    p.busy_timeout_ms = 20000;
    ck_assert_int_eq(cg_index_open(g_path, p, &ix), CG_OK);
    int64_t a, b;
    ck_assert_int_eq(cg_index_worker_add(ix, "http://a", "tiny", 1, &a), CG_OK);
    ck_assert_int_eq(cg_index_worker_add(ix, "http://b", "tiny", 1, &b), CG_OK);
    cg_key k[3] = {key_of(500), key_of(501), key_of(502)};
    cg_index_placement_set(ix, &k[0], a, CG_TIER_RAM, 5, 1);
    cg_index_placement_set(ix, &k[0], b, CG_TIER_RAM, 5, 1);
    flush_ok(ix);

    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(g_path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    cg_index_placement_set(ix, &k[1], a, CG_TIER_DISK, 7, 2);
    cg_index_placement_del(ix, &k[0], a);
    cg_tier tiers[1] = {CG_TIER_RAM};
    int64_t toks[1] = {9};
    cg_index_worker_placements_replace(ix, b, &k[2], tiers, toks, 1, 3);
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* the same once committed */
            ck_assert_int_eq(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
            flush_ok(ix);
        } else {
            ck_assert_uint_gt(stats_of(ix).queue_depth, 0); /* still queued */
        }
        cg_index_entry e[3];
        ck_assert_int_eq(cg_index_lookup(ix, k, 3, e), CG_OK);
        /* k0: deleted from a, and b's inventory no longer holds it */
        ck_assert_int_eq(e[0].n_placements, 0);
        ck_assert_int_eq(cg_index_entry_tokens_on(&e[0], a), 0);
        /* k1: on a, from the queued set */
        ck_assert_int_eq(e[1].found, 1);
        ck_assert_int_eq(e[1].n_placements, 1);
        ck_assert_int_eq(e[1].placements[0].worker_id, a);
        ck_assert_int_eq(e[1].placements[0].tier, CG_TIER_DISK);
        ck_assert_int_eq(cg_index_entry_tokens_on(&e[1], a), 7);
        ck_assert_int_eq(e[1].tokens, 7);
        /* k2: on b, from the queued inventory replace */
        ck_assert_int_eq(e[2].n_placements, 1);
        ck_assert_int_eq(cg_index_entry_tokens_on(&e[2], b), 9);
    }
    sqlite3_close(db);
    check_ok(ix);
    cg_index_close(&ix);
}
END_TEST

/* ---- check detects damage ------------------------------------------------------------------- */

START_TEST(test_check_detects_bad_totals)
{
    cg_index *ix = open_default();
    cg_key k = key_of(1);
    cg_index_chunk_seen(ix, &k, "tiny", CG_MODE_STRICT, 10, 1);
    cg_index_close(&ix);
    raw_exec("UPDATE totals SET chunks = chunks + 5");
    ix = open_default();
    char msg[256];
    ck_assert_int_eq(cg_index_check(ix, msg, sizeof msg), CG_E_IO);
    ck_assert_ptr_nonnull(strstr(msg, "totals"));
    cg_index_close(&ix);
    raw_exec("UPDATE totals SET chunks = chunks - 5");
    raw_exec(
        "PRAGMA foreign_keys = OFF; INSERT INTO placements VALUES (zeroblob(16), 99, 'ram', 1, 1);"
        "UPDATE totals SET placements = placements + 1");
    ix = open_default();
    ck_assert_int_eq(cg_index_check(ix, msg, sizeof msg), CG_E_IO);
    ck_assert_ptr_nonnull(strstr(msg, "foreign_key_check"));
    cg_index_close(&ix);
}
END_TEST

/* ---- concurrency ---------------------------------------------------------------------------- */

enum { CONC_KEYS = 2000, CONC_ROUNDS = 10 };
static cg_index *g_ix;
static atomic_int g_writers_left;
static atomic_long g_lookups;

static void *conc_writer(void *arg)
{
    int base = (int)(intptr_t)arg * CONC_KEYS;
    for (int r = 0; r < CONC_ROUNDS; r++) {
        for (int i = 0; i < CONC_KEYS; i++) {
            cg_key k = key_of(base + i);
            cg_index_chunk_seen(g_ix, &k, "tiny", CG_MODE_STRICT, 8, r);
            cg_index_chunk_hit(g_ix, &k, r);
        }
    }
    atomic_fetch_sub(&g_writers_left, 1);
    return NULL;
}

static void *conc_reader(void *arg)
{
    uint64_t s = (uint64_t)(intptr_t)arg;
    int64_t last_seen[2 * CONC_KEYS] = {0};
    long n = 0;
    int fails = 0;
    while (atomic_load(&g_writers_left) > 0 || n < 100) {
        cg_key keys[8];
        int ids[8];
        for (int j = 0; j < 8; j++) {
            ids[j] = (int)(th_splitmix64(&s) % (2 * CONC_KEYS));
            keys[j] = key_of(ids[j]);
        }
        cg_index_entry e[8];
        if (cg_index_lookup(g_ix, keys, 8, e) != CG_OK) {
            fails++;
            break;
        }
        for (int j = 0; j < 8; j++) {
            if (!e[j].found) {
                if (last_seen[ids[j]] != 0) fails++; /* rows never disappear */
                continue;
            }
            /* a snapshot never shows a hit before its seen (same producer, FIFO queue) */
            if (e[j].hit_count > e[j].seen_count || e[j].seen_count < 1) fails++;
            if (e[j].seen_count < last_seen[ids[j]]) fails++; /* snapshots move forward */
            last_seen[ids[j]] = e[j].seen_count;
        }
        n++;
    }
    atomic_fetch_add(&g_lookups, n);
    return (void *)(intptr_t)fails;
}

START_TEST(test_concurrency)
{
    g_ix = open_default();
    atomic_store(&g_writers_left, 2);
    atomic_store(&g_lookups, 0);
    pthread_t w[2], r[2];
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(pthread_create(&w[i], NULL, conc_writer, (void *)(intptr_t)i), 0);
        ck_assert_int_eq(pthread_create(&r[i], NULL, conc_reader, (void *)(intptr_t)(i + 1)), 0);
    }
    for (int i = 0; i < 2; i++) {
        void *fails;
        ck_assert_int_eq(pthread_join(w[i], NULL), 0);
        ck_assert_int_eq(pthread_join(r[i], &fails), 0);
        ck_assert_int_eq((int)(intptr_t)fails, 0);
    }
    ck_assert_int_ge(atomic_load(&g_lookups), 200);
    flush_ok(g_ix);
    cg_index_stats st = stats_of(g_ix);
    ck_assert_int_eq(st.chunks, 2 * CONC_KEYS);
    ck_assert_uint_eq(st.ops_applied, 2 * 2 * CONC_KEYS * CONC_ROUNDS);
    for (int i = 0; i < 2 * CONC_KEYS; i += 101) {
        cg_key k = key_of(i);
        cg_index_entry e = lookup1(g_ix, &k);
        ck_assert_int_eq(e.seen_count, CONC_ROUNDS);
        ck_assert_int_eq(e.hit_count, CONC_ROUNDS);
    }
    check_ok(g_ix);
    cg_index_close(&g_ix);
}
END_TEST

/* ---- kill -9 -------------------------------------------------------------------------------- */

enum { INV_POOL = 1000, INV_N = 500, RANDOM_KEYS = 100000 };

/* Inventory generation g of worker b: INV_N consecutive keys of the pool, tokens = g. */
static void inventory(uint64_t g, cg_key *keys, cg_tier *tiers, int64_t *toks)
{
    size_t off = (size_t)(g * 137 % INV_N);
    for (size_t i = 0; i < INV_N; i++) {
        keys[i] = key_of(10000000 + off + i);
        tiers[i] = i % 3 ? CG_TIER_RAM : CG_TIER_DISK;
        toks[i] = (int64_t)g;
    }
}

static void child_write_forever(int round, int ready_fd)
{
    cg_index *ix = NULL;
    if (cg_index_open(g_path, cg_index_default_params(), &ix) != CG_OK) _exit(10);
    int64_t a, b;
    if (cg_index_worker_add(ix, "http://a", "tiny", 1, &a) != CG_OK ||
        cg_index_worker_add(ix, "http://b", "tiny", 1, &b) != CG_OK)
        _exit(11);
    uint64_t s = (uint64_t)round * 7919 + 1, g = (uint64_t)round * 1000000 + 1;
    cg_key *keys = cg_malloc(INV_N * sizeof *keys);
    cg_tier *tiers = cg_malloc(INV_N * sizeof *tiers);
    int64_t *toks = cg_malloc(INV_N * sizeof *toks);
    for (int it = 0;; it++) {
        for (int i = 0; i < 2000; i++) {
            uint64_t id = th_splitmix64(&s) % RANDOM_KEYS;
            cg_key k = key_of(id);
            cg_index_chunk_seen(ix, &k, "tiny", id % 2 ? CG_MODE_SYS : CG_MODE_STRICT,
                                (int64_t)(id % 1000), it);
            cg_index_chunk_hit(ix, &k, it);
            cg_index_placement_set(ix, &k, a, CG_TIER_RAM, (int64_t)(id % 97), it);
            if (i % 7 == 0) cg_index_placement_set(ix, &k, b, CG_TIER_DISK, 1, it);
            if (i % 11 == 0) cg_index_placement_del(ix, &k, b);
            if (i % 101 == 0) {
                cg_key d = key_of(th_splitmix64(&s) % RANDOM_KEYS);
                cg_index_chunk_delete(ix, &d);
            }
        }
        inventory(g++, keys, tiers, toks);
        cg_index_worker_placements_replace(ix, b, keys, tiers, toks, INV_N, it);
        if (it % 8 == 0 && cg_index_flush(ix) != CG_OK) _exit(12);
        if (it == 0) {
            char c = 1;
            if (write(ready_fd, &c, 1) != 1) _exit(13);
        }
    }
}

/* Worker b's placements on the inventory pool must be exactly one whole generation. */
static void check_inventory_atomic(cg_index *ix, int64_t b)
{
    cg_key *pool = cg_malloc(INV_POOL * sizeof *pool);
    for (int i = 0; i < INV_POOL; i++)
        pool[i] = key_of(10000000 + i);
    cg_index_entry *e = cg_malloc(INV_POOL * sizeof *e);
    ck_assert_int_eq(cg_index_lookup(ix, pool, INV_POOL, e), CG_OK);
    int64_t gen = -1;
    int count = 0, first = -1;
    for (int i = 0; i < INV_POOL; i++) {
        for (int j = 0; j < e[i].n_placements; j++) {
            ck_assert_int_eq(e[i].placements[j].worker_id, b);
            if (gen < 0) {
                gen = e[i].placements[j].tokens;
                first = i;
            }
            ck_assert_int_eq(e[i].placements[j].tokens, gen); /* one generation only */
            count++;
        }
    }
    ck_assert_int_eq(count, INV_N); /* the whole generation */
    ck_assert_int_eq(first, (int)((uint64_t)gen * 137 % INV_N));
    cg_free(&pool);
    cg_free(&e);
}

START_TEST(test_kill9_crash_safety)
{
    uint64_t s = 42;
    for (int round = 0; round < 4; round++) {
        int fds[2];
        ck_assert_int_eq(pipe(fds), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            child_write_forever(round, fds[1]);
            _exit(0);
        }
        close(fds[1]);
        char c;
        ck_assert_int_eq(read(fds[0], &c, 1), 1); /* first inventory committed */
        close(fds[0]);
        usleep((useconds_t)(20000 + th_splitmix64(&s) % 300000)); /* kill mid-stream */
        ck_assert_int_eq(kill(pid, SIGKILL), 0);
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "child exited on its own (status %d)", status);

        cg_index *ix = open_default();
        check_ok(ix); /* integrity_check == ok, no FK orphans, totals == tables */
        cg_index_worker aw, bw;
        ck_assert_int_eq(cg_index_worker_get_by_url(ix, "http://a", &aw), CG_OK);
        ck_assert_int_eq(cg_index_worker_get_by_url(ix, "http://b", &bw), CG_OK);
        check_inventory_atomic(ix, bw.id);
        cg_index_stats st = stats_of(ix);
        ck_assert_int_gt(st.chunks, INV_N);
        ck_assert_int_eq(st.workers, 2);
        /* every placement points at a live chunk and worker; no chunk is torn */
        cg_index_chunk *rows = NULL;
        size_t n = 0;
        cg_key after;
        int have = 0;
        int64_t seen_rows = 0, seen_places = 0;
        do {
            ck_assert_int_eq(cg_index_chunks_list(ix, have ? &after : NULL, 5000, &rows, &n),
                             CG_OK);
            for (size_t i = 0; i < n; i++) {
                ck_assert(rows[i].hit_count <= rows[i].seen_count || rows[i].seen_count == 0);
                ck_assert(rows[i].last_seen >= rows[i].first_seen);
                ck_assert_int_eq(rows[i].mode == -1, rows[i].seen_count == 0);
                for (int j = 0; j < rows[i].n_placements; j++)
                    ck_assert(rows[i].placements[j].worker_id == bw.id ||
                              rows[i].placements[j].worker_id == aw.id);
                seen_places += rows[i].n_placements;
            }
            seen_rows += (int64_t)n;
            if (n) after = rows[n - 1].key;
            have = 1;
            cg_index_chunks_free(&rows, n);
        } while (n == 5000);
        ck_assert_int_eq(seen_rows, st.chunks);
        ck_assert_int_eq(seen_places, st.placements);
        cg_index_worker_clear(&aw);
        cg_index_worker_clear(&bw);
        cg_index_close(&ix);
    }
}
END_TEST

int main(void)
{
    cg_log_init("test_index", CG_LOG_WARN);
    return th_run_suite(
        "index", "core", 240, (th_fixture){setup, teardown, 1}, CK_FORK_GETENV,
        TH_TESTS(test_create_sets_version, test_wal_switch, test_reopen_keeps_data,
                 test_refuse_future_version, test_migrate_v1_remote_tier, test_stream_position,
                 test_refuse_foreign_file, test_chunk_seen_hit, test_placements_pin_delete,
                 test_workers, test_lookup_mix, test_paging, test_writer_batching,
                 test_queue_full_drops, test_batch_lost_when_locked, test_inventory_replace,
                 test_queued_placements_visible, test_check_detects_bad_totals, test_concurrency,
                 test_kill9_crash_safety));
}
