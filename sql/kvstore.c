/* The disk tier's inventory in SQLite: schema and migrations, the geometry row, and one row
 * per chunk record. Every statement is prepared once at open. All SQL of the tier is here. */
#include "sql/kvstore.h"
#include "sql/db.h"

#define DB_MODULE "kvstore" /* prefix of this module's SQLite error logs */

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

/* PRAGMA application_id of a disk-tier inventory: "CGDK". Refuses foreign SQLite files
 * (including a gateway index, "CGIX", pointed at by mistake). */
#define APP_ID 0x4347444B

/* migrations[i] takes the schema from version i to i + 1, in one transaction together with
 * the user_version bump. Append new ones; never edit a released one. */
static const char *const migrations[] = {
    /* v1 */
    "CREATE TABLE geometry ("
    "  id           INTEGER PRIMARY KEY CHECK (id = 1),"
    "  model        TEXT NOT NULL,"
    "  layout       INTEGER NOT NULL,"
    "  block_bytes  INTEGER NOT NULL CHECK (block_bytes > 0),"
    "  block_tokens INTEGER NOT NULL CHECK (block_tokens > 0),"
    "  n_layers     INTEGER NOT NULL CHECK (n_layers > 0),"
    "  n_kv_heads   INTEGER NOT NULL CHECK (n_kv_heads > 0),"
    "  head_dim     INTEGER NOT NULL CHECK (head_dim > 0),"
    "  created      INTEGER NOT NULL"
    ");"
    /* slots: u32 little-endian slot indexes in block order. checksum: XXH3-128 (canonical
     * bytes) over the record's slot bytes, then the key, then n_tokens as u32 LE. */
    "CREATE TABLE chunks ("
    "  key       BLOB NOT NULL PRIMARY KEY CHECK (length(key) = 16),"
    "  n_tokens  INTEGER NOT NULL CHECK (n_tokens > 0),"
    "  slots     BLOB NOT NULL CHECK (length(slots) > 0),"
    "  checksum  BLOB NOT NULL CHECK (length(checksum) = 16),"
    "  last_used INTEGER NOT NULL,"
    "  model     TEXT NOT NULL"
    ") WITHOUT ROWID;",
};
_Static_assert(CG_ARRAY_LEN(migrations) == CG_KVSTORE_SCHEMA_VERSION,
               "one migration per schema version");

#define KV_SQL(X)                                                                                  \
    X(S_BEGIN, "BEGIN IMMEDIATE")                                                                  \
    X(S_BEGIN_READ, "BEGIN")                                                                       \
    X(S_COMMIT, "COMMIT")                                                                          \
    X(S_ROLLBACK, "ROLLBACK")                                                                      \
    X(S_GEOM_GET, "SELECT model, layout, block_bytes, block_tokens, n_layers, n_kv_heads,"         \
                  " head_dim FROM geometry WHERE id = 1")                                          \
    X(S_GEOM_SET, "INSERT INTO geometry (id, model, layout, block_bytes, block_tokens, n_layers,"  \
                  " n_kv_heads, head_dim, created) VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")    \
    X(S_PUT, "INSERT INTO chunks (key, n_tokens, slots, checksum, last_used, model)"               \
             " VALUES (?1, ?2, ?3, ?4, ?5, ?6)")                                                   \
    X(S_DELETE, "DELETE FROM chunks WHERE key = ?1")                                               \
    X(S_TOUCH, "UPDATE chunks SET last_used = max(last_used, ?2) WHERE key = ?1")                  \
    X(S_LOAD, "SELECT key, n_tokens, slots, checksum, last_used, model FROM chunks"                \
              " ORDER BY last_used, key")                                                          \
    X(S_INTEGRITY, "PRAGMA integrity_check")

#define STMT_ENUM(name, sql) name,
#define STMT_SQL(name, sql) sql,
enum { KV_SQL(STMT_ENUM) S_COUNT };
static const char *const stmt_sql[] = {KV_SQL(STMT_SQL)};

struct cg_kvstore {
    sqlite3 *db;
    sqlite3_stmt *s[S_COUNT];
    char *path;
    uint32_t *slot_buf; /* decoded slot list handed to load callbacks */
    size_t slot_cap;
    uint8_t *blob_buf; /* encoded slot list for put */
    size_t blob_cap;
};

static cg_status run(cg_kvstore *kv, int which)
{
    if (cg_db_step_done(kv->s[which]) == SQLITE_DONE) return CG_OK;
    cg_db_log(DB_MODULE, kv->db, stmt_sql[which]);
    return CG_E_IO;
}

static const cg_db_schema schema = {
    .module = DB_MODULE,
    .kind = "a chunkgate disk inventory",
    .upgrade_hint = "run a newer chunkgate-worker or use another data dir",
    .app_id = APP_ID,
    .version = CG_KVSTORE_SCHEMA_VERSION,
    .migrations = migrations,
};

static void kvstore_destroy(cg_kvstore *kv)
{
    cg_db_finalize_all(kv->s, S_COUNT);
    if (kv->db) sqlite3_close(kv->db);
    cg_free(&kv->path);
    cg_free(&kv->slot_buf);
    cg_free(&kv->blob_buf);
    free(kv);
}

cg_status cg_kvstore_open(const char *path, int sync_full, cg_kvstore **out)
{
    cg_kvstore *kv = NULL;
    cg_status st = CG_E_IO;
    *out = NULL;
    if (!path || !*path || strcmp(path, ":memory:") == 0) return CG_E_VALUE;
    kv = cg_calloc(1, sizeof *kv);
    kv->path = cg_strdup(path);
    if (cg_db_open(DB_MODULE, path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, 5000, &kv->db) !=
        CG_OK)
        goto out;
    /* WAL: a commit is one append to the log. synchronous=NORMAL survives kill -9; the
     * checksums in the rows catch what power loss could tear (readme-tiers.md). */
    st = cg_db_setup(kv->db, path, &schema,
                     sync_full
                         ? "PRAGMA synchronous = FULL; PRAGMA journal_size_limit = 16777216;"
                         : "PRAGMA synchronous = NORMAL; PRAGMA journal_size_limit = 16777216;");
    if (st != CG_OK) goto out;
    st = cg_db_prepare_all(DB_MODULE, kv->db, stmt_sql, kv->s, S_COUNT);
    if (st != CG_OK) goto out;
    *out = kv;
    kv = NULL;
out:
    if (kv) kvstore_destroy(kv);
    return st;
}

void cg_kvstore_close(cg_kvstore **pkv)
{
    if (!pkv || !*pkv) return;
    kvstore_destroy(*pkv);
    *pkv = NULL;
}

cg_status cg_kvstore_geometry_get(cg_kvstore *kv, cg_kvstore_geometry *out, int *found)
{
    sqlite3_stmt *s = kv->s[S_GEOM_GET];
    memset(out, 0, sizeof *out);
    *found = 0;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(s, 0);
        snprintf(out->model, sizeof out->model, "%s", m ? m : "");
        out->layout = (uint32_t)sqlite3_column_int64(s, 1);
        out->block_bytes = (uint64_t)sqlite3_column_int64(s, 2);
        out->block_tokens = (uint32_t)sqlite3_column_int64(s, 3);
        out->n_layers = (uint32_t)sqlite3_column_int64(s, 4);
        out->n_kv_heads = (uint32_t)sqlite3_column_int64(s, 5);
        out->head_dim = (uint32_t)sqlite3_column_int64(s, 6);
        *found = 1;
        rc = sqlite3_step(s);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        cg_db_log(DB_MODULE, kv->db, stmt_sql[S_GEOM_GET]);
        return CG_E_IO;
    }
    return CG_OK;
}

cg_status cg_kvstore_geometry_set(cg_kvstore *kv, const cg_kvstore_geometry *g, uint64_t created_ms)
{
    sqlite3_stmt *s = kv->s[S_GEOM_SET];
    sqlite3_bind_text(s, 1, g->model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, g->layout);
    sqlite3_bind_int64(s, 3, (sqlite3_int64)g->block_bytes);
    sqlite3_bind_int64(s, 4, g->block_tokens);
    sqlite3_bind_int64(s, 5, g->n_layers);
    sqlite3_bind_int64(s, 6, g->n_kv_heads);
    sqlite3_bind_int64(s, 7, g->head_dim);
    sqlite3_bind_int64(s, 8, (sqlite3_int64)created_ms);
    int rc = cg_db_step_done(s);
    if (rc == SQLITE_DONE) return CG_OK;
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) return CG_E_CONFLICT;
    cg_db_log(DB_MODULE, kv->db, stmt_sql[S_GEOM_SET]);
    return CG_E_IO;
}

cg_status cg_kvstore_put(cg_kvstore *kv, const cg_kvstore_row *row)
{
    if (row->n_slots == 0 || row->n_tokens == 0 || !row->slots) return CG_E_VALUE;
    size_t n = (size_t)row->n_slots * 4;
    if (n > kv->blob_cap) {
        kv->blob_buf = cg_realloc(kv->blob_buf, n);
        kv->blob_cap = n;
    }
    for (uint32_t i = 0; i < row->n_slots; i++) {
        uint32_t v = row->slots[i];
        uint8_t *p = kv->blob_buf + 4 * (size_t)i;
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
        p[2] = (uint8_t)(v >> 16);
        p[3] = (uint8_t)(v >> 24);
    }
    sqlite3_stmt *s = kv->s[S_PUT];
    cg_db_bind_key(s, 1, &row->key);
    sqlite3_bind_int64(s, 2, row->n_tokens);
    sqlite3_bind_blob(s, 3, kv->blob_buf, (int)n, SQLITE_STATIC);
    sqlite3_bind_blob(s, 4, row->checksum, CG_KVSTORE_SUM_BYTES, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, (sqlite3_int64)row->last_used);
    sqlite3_bind_text(s, 6, row->model ? row->model : "", -1, SQLITE_STATIC);
    int rc = cg_db_step_done(s);
    if (rc == SQLITE_DONE) return CG_OK;
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) return CG_E_CONFLICT;
    cg_db_log(DB_MODULE, kv->db, stmt_sql[S_PUT]);
    return CG_E_IO;
}

/* Runs statement which once per key (binding ?1 = key, ?2 = vals[i] when vals), all in one
 * transaction; a single statement autocommits, which is already atomic. */
static cg_status per_key(cg_kvstore *kv, int which, const cg_key *keys, const uint64_t *vals,
                         size_t n)
{
    if (n == 0) return CG_OK;
    cg_status st = n > 1 ? run(kv, S_BEGIN) : CG_OK;
    for (size_t i = 0; i < n && st == CG_OK; i++) {
        cg_db_bind_key(kv->s[which], 1, &keys[i]);
        if (vals) sqlite3_bind_int64(kv->s[which], 2, (sqlite3_int64)vals[i]);
        st = run(kv, which);
    }
    if (n > 1 && st == CG_OK) st = run(kv, S_COMMIT);
    if (st != CG_OK && !sqlite3_get_autocommit(kv->db)) (void)run(kv, S_ROLLBACK);
    return st;
}

cg_status cg_kvstore_delete(cg_kvstore *kv, const cg_key *keys, size_t n)
{
    return per_key(kv, S_DELETE, keys, NULL, n);
}

cg_status cg_kvstore_touch(cg_kvstore *kv, const cg_key *keys, const uint64_t *last_used, size_t n)
{
    return per_key(kv, S_TOUCH, keys, last_used, n);
}

static uint32_t get_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

cg_status cg_kvstore_load(cg_kvstore *kv, int (*fn)(void *ud, const cg_kvstore_row *row), void *ud)
{
    sqlite3_stmt *s = kv->s[S_LOAD];
    cg_status st = run(kv, S_BEGIN_READ);
    if (st != CG_OK) return st;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cg_kvstore_row row;
        memset(&row, 0, sizeof row);
        const void *key = sqlite3_column_blob(s, 0);
        if (!key || sqlite3_column_bytes(s, 0) != (int)sizeof row.key.b) {
            /* Unreachable through the CHECK constraint; such a row cannot be named to fn. */
            cg_log(CG_LOG_WARN, "kvstore: skipping a row whose key is not 16 bytes");
            continue;
        }
        memcpy(row.key.b, key, sizeof row.key.b);
        int64_t nt = sqlite3_column_int64(s, 1);
        row.n_tokens = nt > 0 && nt <= UINT32_MAX ? (uint32_t)nt : 0;
        const uint8_t *slots = sqlite3_column_blob(s, 2);
        size_t nb = (size_t)sqlite3_column_bytes(s, 2);
        const void *sum = sqlite3_column_blob(s, 3);
        int sum_ok = sum && sqlite3_column_bytes(s, 3) == CG_KVSTORE_SUM_BYTES;
        if (sum_ok) memcpy(row.checksum, sum, CG_KVSTORE_SUM_BYTES);
        if (slots && nb > 0 && nb % 4 == 0 && nb / 4 <= UINT32_MAX && sum_ok && row.n_tokens) {
            size_t n = nb / 4;
            if (n > kv->slot_cap) {
                kv->slot_buf = cg_realloc(kv->slot_buf, n * sizeof *kv->slot_buf);
                kv->slot_cap = n;
            }
            for (size_t i = 0; i < n; i++)
                kv->slot_buf[i] = get_u32le(slots + 4 * i);
            row.slots = kv->slot_buf;
            row.n_slots = (uint32_t)n;
        }
        row.last_used = (uint64_t)sqlite3_column_int64(s, 4);
        row.model = (const char *)sqlite3_column_text(s, 5);
        if (fn(ud, &row)) break;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        cg_db_log(DB_MODULE, kv->db, stmt_sql[S_LOAD]);
        st = CG_E_IO;
    }
    sqlite3_reset(s);
    if (run(kv, S_COMMIT) != CG_OK) st = CG_E_IO;
    return st;
}

cg_status cg_kvstore_check(cg_kvstore *kv)
{
    sqlite3_stmt *s = kv->s[S_INTEGRITY];
    cg_status st = CG_E_IO;
    if (sqlite3_step(s) == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (r && strcmp(r, "ok") == 0)
            st = CG_OK;
        else
            cg_log(CG_LOG_ERROR, "kvstore: %s: integrity_check: %s", kv->path, r ? r : "?");
    } else {
        cg_db_log(DB_MODULE, kv->db, stmt_sql[S_INTEGRITY]);
    }
    sqlite3_reset(s);
    return st;
}
