/* The gateway's SQLite index: schema and migrations, a pool of read connections, and one
 * writer thread that applies queued updates in batched transactions. All SQL lives here. */
#include "sql/index.h"
#include "sql/db.h"

#define DB_MODULE "index" /* prefix of this module's SQLite error logs */

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/map.h"

/* PRAGMA application_id of a chunkgate index: "CGIX". Lets us refuse foreign SQLite files. */
#define APP_ID 0x43474958
#define LIST_LIMIT_MAX 10000
/* The WAL file is truncated back to this size after a checkpoint so it cannot stay large. */
#define WAL_SIZE_LIMIT (64 * 1024 * 1024)

/* ---- Schema ------------------------------------------------------------------------------- *
 * migrations[i] takes the schema from version i to i + 1. Each runs in its own transaction
 * together with the PRAGMA user_version bump, so a crash leaves either version i or i + 1.
 * Append new migrations; never edit a released one. */
static const char *const migrations[] = {
    /* v1 */
    "CREATE TABLE workers ("
    "  id        INTEGER PRIMARY KEY,"
    "  url       TEXT NOT NULL UNIQUE,"
    "  model     TEXT NOT NULL,"
    "  added     INTEGER NOT NULL,"
    "  last_seen INTEGER NOT NULL,"
    "  healthy   INTEGER NOT NULL DEFAULT 1 CHECK (healthy IN (0, 1))"
    ");"
    /* mode, tokens, bytes are NULL while unknown: a worker reported the chunk before the
     * gateway saw its text (mode, bytes), or no worker has reported its tokens yet. */
    "CREATE TABLE chunks ("
    "  key        BLOB NOT NULL PRIMARY KEY CHECK (length(key) = 16),"
    "  model      TEXT NOT NULL,"
    "  mode       TEXT CHECK (mode IN ('strict', 'sys')),"
    "  tokens     INTEGER CHECK (tokens >= 0),"
    "  bytes      INTEGER CHECK (bytes >= 0),"
    "  first_seen INTEGER NOT NULL,"
    "  last_seen  INTEGER NOT NULL,"
    "  last_hit   INTEGER NOT NULL DEFAULT 0,"
    "  seen_count INTEGER NOT NULL DEFAULT 0 CHECK (seen_count >= 0),"
    "  hit_count  INTEGER NOT NULL DEFAULT 0 CHECK (hit_count >= 0),"
    "  pinned     INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1))"
    ") WITHOUT ROWID;"
    "CREATE TABLE placements ("
    "  key       BLOB NOT NULL REFERENCES chunks (key) ON DELETE CASCADE,"
    "  worker_id INTEGER NOT NULL REFERENCES workers (id) ON DELETE CASCADE,"
    "  tier      TEXT NOT NULL CHECK (tier IN ('ram', 'disk')),"
    "  tokens    INTEGER NOT NULL CHECK (tokens >= 0),"
    "  updated   INTEGER NOT NULL,"
    "  PRIMARY KEY (key, worker_id)"
    ") WITHOUT ROWID;"
    /* Inventory sync and worker removal delete by worker; the PK serves lookups by key. */
    "CREATE INDEX placements_by_worker ON placements (worker_id);"
    /* Totals for /metrics, kept by triggers in the same transaction as the rows: reading
     * them is O(1), where count(*) over 10M chunks would scan the table. */
    "CREATE TABLE totals ("
    "  id         INTEGER PRIMARY KEY CHECK (id = 1),"
    "  chunks     INTEGER NOT NULL,"
    "  placements INTEGER NOT NULL,"
    "  bytes      INTEGER NOT NULL"
    ");"
    "INSERT INTO totals (id, chunks, placements, bytes) VALUES (1, 0, 0, 0);"
    "CREATE TRIGGER chunks_ins AFTER INSERT ON chunks BEGIN"
    "  UPDATE totals SET chunks = chunks + 1, bytes = bytes + coalesce(new.bytes, 0)"
    "  WHERE id = 1; END;"
    "CREATE TRIGGER chunks_del AFTER DELETE ON chunks BEGIN"
    "  UPDATE totals SET chunks = chunks - 1, bytes = bytes - coalesce(old.bytes, 0)"
    "  WHERE id = 1; END;"
    "CREATE TRIGGER chunks_bytes AFTER UPDATE OF bytes ON chunks"
    "  WHEN old.bytes IS NOT new.bytes BEGIN"
    "  UPDATE totals SET bytes = bytes + coalesce(new.bytes, 0) - coalesce(old.bytes, 0)"
    "  WHERE id = 1; END;"
    "CREATE TRIGGER placements_ins AFTER INSERT ON placements BEGIN"
    "  UPDATE totals SET placements = placements + 1 WHERE id = 1; END;"
    "CREATE TRIGGER placements_del AFTER DELETE ON placements BEGIN"
    "  UPDATE totals SET placements = placements - 1 WHERE id = 1; END;",
    /* v2: tier 'remote' (a shared remote tier's row holds its placements). SQLite cannot
     * change a CHECK constraint in place: the table is rebuilt, rows copied as they are.
     * DROP TABLE drops its index and triggers without firing them, so totals stay right. */
    "CREATE TABLE placements_v2 ("
    "  key       BLOB NOT NULL REFERENCES chunks (key) ON DELETE CASCADE,"
    "  worker_id INTEGER NOT NULL REFERENCES workers (id) ON DELETE CASCADE,"
    "  tier      TEXT NOT NULL CHECK (tier IN ('ram', 'disk', 'remote')),"
    "  tokens    INTEGER NOT NULL CHECK (tokens >= 0),"
    "  updated   INTEGER NOT NULL,"
    "  PRIMARY KEY (key, worker_id)"
    ") WITHOUT ROWID;"
    "INSERT INTO placements_v2 (key, worker_id, tier, tokens, updated)"
    "  SELECT key, worker_id, tier, tokens, updated FROM placements;"
    "DROP TABLE placements;"
    "ALTER TABLE placements_v2 RENAME TO placements;"
    "CREATE INDEX placements_by_worker ON placements (worker_id);"
    "CREATE TRIGGER placements_ins AFTER INSERT ON placements BEGIN"
    "  UPDATE totals SET placements = placements + 1 WHERE id = 1; END;"
    "CREATE TRIGGER placements_del AFTER DELETE ON placements BEGIN"
    "  UPDATE totals SET placements = placements - 1 WHERE id = 1; END;",
    /* v3: how far the chunk events of each Redis Stream are applied (DESIGN §18), committed
     * with the placements they changed, so a restarted gateway resumes there. */
    "CREATE TABLE IF NOT EXISTS streams ("
    "  name     TEXT PRIMARY KEY,"
    "  position TEXT NOT NULL"
    ") WITHOUT ROWID;",
};
_Static_assert(CG_ARRAY_LEN(migrations) == CG_INDEX_SCHEMA_VERSION,
               "one migration per schema version");

#define CHUNK_COLS                                                                                 \
    "key, model, mode, tokens, bytes, first_seen, last_seen, last_hit, seen_count, hit_count, "    \
    "pinned"

/* Statements of the writer connection, prepared once at open. */
#define WRITE_SQL(X)                                                                               \
    X(W_BEGIN, "BEGIN IMMEDIATE")                                                                  \
    X(W_COMMIT, "COMMIT")                                                                          \
    X(W_ROLLBACK, "ROLLBACK")                                                                      \
    X(W_SAVEPOINT, "SAVEPOINT replace_op")                                                         \
    X(W_RELEASE, "RELEASE replace_op")                                                             \
    X(W_ROLLBACK_TO, "ROLLBACK TO replace_op")                                                     \
    X(W_SEEN, "INSERT INTO chunks (key, model, mode, bytes, first_seen, last_seen, seen_count)"    \
              " VALUES (?1, ?2, ?3, ?4, ?5, ?5, 1) ON CONFLICT (key) DO UPDATE SET"                \
              " model = excluded.model, mode = excluded.mode, bytes = excluded.bytes,"             \
              " last_seen = max(last_seen, excluded.last_seen), seen_count = seen_count + 1")      \
    X(W_HIT, "UPDATE chunks SET hit_count = hit_count + 1, last_hit = max(last_hit, ?2)"           \
             " WHERE key = ?1")                                                                    \
    X(W_WORKER_MODEL, "SELECT model FROM workers WHERE id = ?1")                                   \
    X(W_CHUNK_STUB, "INSERT INTO chunks (key, model, tokens, first_seen, last_seen)"               \
                    " VALUES (?1, ?2, ?3, ?4, ?4) ON CONFLICT (key) DO UPDATE SET"                 \
                    " tokens = excluded.tokens")                                                   \
    X(W_PLACE, "INSERT INTO placements (key, worker_id, tier, tokens, updated)"                    \
               " VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (key, worker_id) DO UPDATE SET"           \
               " tier = excluded.tier, tokens = excluded.tokens, updated = excluded.updated")      \
    X(W_PLACE_DEL, "DELETE FROM placements WHERE key = ?1 AND worker_id = ?2")                     \
    X(W_WORKER_PLACES_DEL, "DELETE FROM placements WHERE worker_id = ?1")                          \
    X(W_PIN, "UPDATE chunks SET pinned = ?2 WHERE key = ?1")                                       \
    X(W_CHUNK_PLACES_DEL, "DELETE FROM placements WHERE key = ?1")                                 \
    X(W_CHUNK_DEL, "DELETE FROM chunks WHERE key = ?1")                                            \
    X(W_WORKER_ADD, "INSERT INTO workers (url, model, added, last_seen, healthy)"                  \
                    " VALUES (?1, ?2, ?3, ?3, 1) ON CONFLICT (url) DO UPDATE SET"                  \
                    " model = excluded.model, last_seen = max(last_seen, excluded.last_seen)"      \
                    " RETURNING id")                                                               \
    X(W_WORKER_DEL, "DELETE FROM workers WHERE id = ?1")                                           \
    X(W_STREAM_POS, "INSERT INTO streams (name, position) VALUES (?1, ?2)"                         \
                    " ON CONFLICT (name) DO UPDATE SET position = excluded.position")              \
    X(W_WORKER_HEALTH, "UPDATE workers SET healthy = ?2,"                                          \
                       " last_seen = CASE WHEN ?2 THEN max(last_seen, ?3) ELSE last_seen END"      \
                       " WHERE id = ?1")

/* Statements of each read connection, prepared once at open. */
#define READ_SQL(X)                                                                                \
    X(R_BEGIN, "BEGIN")                                                                            \
    X(R_COMMIT, "COMMIT")                                                                          \
    X(R_ROLLBACK, "ROLLBACK")                                                                      \
    X(R_LOOKUP, "SELECT c.tokens, c.bytes, c.seen_count, c.hit_count, c.pinned,"                   \
                " p.worker_id, p.tier, p.tokens, p.updated"                                        \
                " FROM chunks AS c LEFT JOIN placements AS p ON p.key = c.key"                     \
                " WHERE c.key = ?1 ORDER BY p.worker_id")                                          \
    X(R_CHUNK_GET, "SELECT " CHUNK_COLS " FROM chunks WHERE key = ?1")                             \
    X(R_CHUNK_PAGE, "SELECT " CHUNK_COLS " FROM chunks WHERE key > ?1 ORDER BY key LIMIT ?2")      \
    X(R_CHUNK_PLACEMENTS, "SELECT worker_id, tier, tokens, updated FROM placements"                \
                          " WHERE key = ?1 ORDER BY worker_id LIMIT ?2")                           \
    X(R_WORKER_BY_URL, "SELECT id, url, model, added, last_seen, healthy FROM workers"             \
                       " WHERE url = ?1")                                                          \
    X(R_WORKERS_ALL, "SELECT id, url, model, added, last_seen, healthy FROM workers ORDER BY id")  \
    X(R_STREAM_POS, "SELECT position FROM streams WHERE name = ?1")                                \
    X(R_TOTALS, "SELECT t.chunks, t.placements, t.bytes, (SELECT count(*) FROM workers),"          \
                " (SELECT page_count FROM pragma_page_count()) *"                                  \
                " (SELECT page_size FROM pragma_page_size())"                                      \
                " FROM totals AS t WHERE t.id = 1")                                                \
    X(R_INTEGRITY, "PRAGMA integrity_check")                                                       \
    X(R_FK_CHECK, "PRAGMA foreign_key_check")                                                      \
    X(R_TOTALS_CHECK, "SELECT (SELECT count(*) FROM chunks), (SELECT count(*) FROM placements),"   \
                      " (SELECT coalesce(sum(bytes), 0) FROM chunks),"                             \
                      " t.chunks, t.placements, t.bytes FROM totals AS t WHERE t.id = 1")          \
    X(R_INVARIANTS, "SELECT count(*) FROM chunks WHERE last_seen < first_seen"                     \
                    " OR (mode IS NULL) <> (seen_count = 0)")

#define STMT_ENUM(name, sql) name,
#define STMT_SQL(name, sql) sql,
enum { WRITE_SQL(STMT_ENUM) W_COUNT };
enum { READ_SQL(STMT_ENUM) R_COUNT };
static const char *const write_sql[] = {WRITE_SQL(STMT_SQL)};
static const char *const read_sql[] = {READ_SQL(STMT_SQL)};

/* ---- Queue -------------------------------------------------------------------------------- */

enum op_type {
    OP_SEEN,
    OP_HIT,
    OP_PLACE_SET,
    OP_PLACE_DEL,
    OP_REPLACE,
    OP_PIN,
    OP_DELETE,
    OP_WORKER_ADD,
    OP_WORKER_DEL,
    OP_WORKER_HEALTH,
    OP_STREAM_POS,
};

/* A synchronous op lives on its caller's stack; the caller waits until done is set. */
typedef struct sync_slot {
    const char *url, *model; /* borrowed from the waiting caller */
    cg_status st;
    int64_t id;
    int done;
} sync_slot;

typedef struct replace_set {
    size_t n;
    cg_key *keys;
    uint8_t *tiers;
    int64_t *tokens;
} replace_set;

/* 64 bytes: the queue holds up to queue_max of these. */
typedef struct op {
    uint8_t type, tier, mode, flag; /* flag: pinned or healthy */
    cg_key key;
    int64_t worker_id, tokens, bytes, now;
    union {
        char *model;      /* OP_SEEN, owned; OP_STREAM_POS: "name\0position", owned */
        replace_set *rep; /* OP_REPLACE, owned */
        sync_slot *sync;  /* OP_WORKER_*, borrowed */
    } u;
} op;

/* A placement op (set or delete) of one (key, worker) waiting in the queue; only the newest
 * op of the pair is kept. seq: the op's position in the queue. */
typedef struct pend {
    cg_key key;
    int64_t worker_id, tokens, now;
    uint64_t seq;
    uint8_t tier, del;
    struct pend *next; /* the key's next worker, in the order they were queued */
} pend;

/* The queued placements of one key: what a lookup of the key reads. */
typedef struct pend_key {
    cg_map_node node;
    cg_key key;
    pend *first;
} pend_key;

/* An inventory replace waiting in the queue: until it commits, the index's placements of the
 * worker are superseded by the pend entries the replace queued. */
typedef struct pend_replace {
    int64_t worker_id;
    uint64_t seq;
    struct pend_replace *next;
} pend_replace;

typedef struct opvec {
    op *v;
    size_t n, cap;
} opvec;

typedef struct rconn {
    sqlite3 *db;
    sqlite3_stmt *s[R_COUNT];
} rconn;

struct cg_index {
    cg_index_params params;
    sqlite3 *wdb; /* used by the writer thread only (and by open/close) */
    sqlite3_stmt *ws[W_COUNT];

    rconn *rc;
    int n_rc;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;
    int *pool_free; /* stack of free read connection indexes */
    int n_free;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t work_cv, done_cv;
    opvec pending;
    uint64_t enq_seq, done_seq; /* ops enqueued / ops finished (committed or failed) */
    int writer_idle, stop, waiters;
    uint64_t batches, applied, failed, dropped;

    pthread_t writer;
    int writer_started, sync_inited;

    /* Placements still in the queue, so lookups see them before the writer commits (under
     * mu; see "Queued placements" below). */
    cg_map pend;            /* pend_key by node, keyed by key */
    pend_replace *replaces; /* inventory replaces queued, newest first */
};

/* Same spelling as cg_mode_name(); kept here so the index does not depend on key.c. */
static const char *const mode_names[] = {"strict", "sys"};

cg_index_params cg_index_default_params(void)
{
    cg_index_params p = {
        .read_conns = 4,
        .busy_timeout_ms = 5000,
        .cache_kib = 65536,
        .read_cache_kib = 8192,
        .mmap_bytes = (int64_t)2 << 30,
        .queue_max = (size_t)1 << 20,
        .batch_max = 16384,
        .wal_autocheckpoint = 1000,
    };
    return p;
}

/* ---- Small SQLite helpers ----------------------------------------------------------------- */

/* NULL columns read as -1 (unknown). */
static int64_t col_int_or_neg(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, i);
}

static cg_tier col_tier(sqlite3_stmt *s, int i)
{
    cg_tier t = CG_TIER_RAM;
    return cg_tier_parse((const char *)sqlite3_column_text(s, i), &t) == 0 ? t : CG_TIER_RAM;
}

/* An op's tier byte: a known tier, else RAM. */
static uint8_t tier_byte(cg_tier t)
{
    return (unsigned)t < CG_TIER_COUNT ? (uint8_t)t : (uint8_t)CG_TIER_RAM;
}

void cg_index_tier_row_url(const char *tier_id, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", CG_INDEX_TIER_ROW_PREFIX, tier_id ? tier_id : "");
}

static int col_mode(sqlite3_stmt *s, int i)
{
    const char *m = (const char *)sqlite3_column_text(s, i);
    if (!m) return -1;
    return strcmp(m, "sys") == 0 ? CG_MODE_SYS : CG_MODE_STRICT;
}

static char *col_strdup(sqlite3_stmt *s, int i)
{
    const char *t = (const char *)sqlite3_column_text(s, i);
    return cg_strdup(t ? t : "");
}

/* Opens a connection with the settings shared by the writer and the readers. */
static cg_status open_conn(const char *path, int flags, const cg_index_params *p, int64_t cache_kib,
                           sqlite3 **db)
{
    char sql[256];
    if (cg_db_open(DB_MODULE, path, flags, p->busy_timeout_ms, db) != CG_OK) return CG_E_IO;
    snprintf(sql, sizeof sql, "PRAGMA cache_size = %lld; PRAGMA mmap_size = %lld;",
             (long long)-cache_kib, (long long)p->mmap_bytes);
    return cg_db_exec(DB_MODULE, *db, sql, "configure connection");
}

/* ---- Open: version checks and migrations --------------------------------------------------- */

static const cg_db_schema schema = {
    .module = DB_MODULE,
    .kind = "a chunkgate index",
    .upgrade_hint = "run a newer chunkgate or point it at another index file",
    .app_id = APP_ID,
    .version = CG_INDEX_SCHEMA_VERSION,
    .migrations = migrations,
};

/* ---- Queued placements ---------------------------------------------------------------------
 * The index is the one owner of where a chunk is. Writes are asynchronous, so a placement the
 * gateway has just learned sits in the queue for a while; lookups must still see it (read your
 * writes). Every queued placement op also updates this overlay under mu, and the writer drops
 * an entry once the op that made it has been applied. A lookup copies the overlay entries of
 * its keys before it reads SQLite: an entry committed meanwhile is in the snapshot too, and
 * applying it again changes nothing. */

static pend_key *pend_key_find(cg_index *ix, const cg_key *k)
{
    cg_map_node *n = cg_map_find(&ix->pend, k);
    return n ? CG_MAP_ENTRY(n, pend_key, node) : NULL;
}

/* Where worker wid's entry is in g's list, or where it would be appended. */
static pend **pend_find_locked(pend_key *g, int64_t wid)
{
    pend **pp = &g->first;
    while (*pp && (*pp)->worker_id != wid)
        pp = &(*pp)->next;
    return pp;
}

/* Unlinks and frees *pp, and g with it once g holds no worker. */
static void pend_drop_locked(cg_index *ix, pend_key *g, pend **pp)
{
    pend *dead = *pp;
    *pp = dead->next;
    free(dead);
    if (!g->first) {
        cg_map_remove(&ix->pend, &g->node);
        free(g);
    }
}

/* Records the queued op seq for (key, worker). */
static void pend_put_locked(cg_index *ix, const cg_key *k, int64_t wid, uint8_t tier,
                            int64_t tokens, int64_t now, int del, uint64_t seq)
{
    pend_key *g = pend_key_find(ix, k);
    if (!g) {
        g = cg_calloc(1, sizeof *g);
        g->key = *k;
        cg_map_add(&ix->pend, &g->node);
    }
    pend **pp = pend_find_locked(g, wid);
    if (!*pp) {
        *pp = cg_calloc(1, sizeof **pp);
        (*pp)->key = *k;
        (*pp)->worker_id = wid;
    }
    (*pp)->tier = tier;
    (*pp)->tokens = tokens;
    (*pp)->now = now;
    (*pp)->del = (uint8_t)(del != 0);
    (*pp)->seq = seq;
}

/* The op seq on (key, worker) was applied: its entry goes unless a newer op replaced it. */
static void pend_done_locked(cg_index *ix, const cg_key *k, int64_t wid, uint64_t seq)
{
    pend_key *g = pend_key_find(ix, k);
    if (!g) return;
    pend **pp = pend_find_locked(g, wid);
    if (*pp && (*pp)->seq == seq) pend_drop_locked(ix, g, pp);
}

/* A replace of wid's inventory was queued as op seq: older entries of wid are superseded. */
static void pend_replace_locked(cg_index *ix, int64_t wid, uint64_t seq)
{
    cg_map_iter it = cg_map_iter_start(&ix->pend);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        pend_key *g = CG_MAP_ENTRY(n, pend_key, node);
        pend **pp = pend_find_locked(g, wid);
        if (*pp) pend_drop_locked(ix, g, pp); /* may free g: the iteration allows it */
    }
    pend_replace *r = cg_calloc(1, sizeof *r);
    r->worker_id = wid;
    r->seq = seq;
    r->next = ix->replaces;
    ix->replaces = r;
}

static void pend_replace_done_locked(cg_index *ix, int64_t wid, uint64_t seq)
{
    for (pend_replace **pp = &ix->replaces; *pp; pp = &(*pp)->next)
        if ((*pp)->worker_id == wid && (*pp)->seq == seq) {
            pend_replace *dead = *pp;
            *pp = dead->next;
            free(dead);
            return;
        }
}

static void pend_free_all(cg_index *ix)
{
    cg_map_iter it = cg_map_iter_start(&ix->pend);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        pend_key *g = CG_MAP_ENTRY(n, pend_key, node);
        while (g->first) {
            pend *dead = g->first;
            g->first = dead->next;
            free(dead);
        }
        free(g);
    }
    cg_map_free(&ix->pend);
    while (ix->replaces) {
        pend_replace *dead = ix->replaces;
        ix->replaces = dead->next;
        free(dead);
    }
}

/* Queues o's overlay entries; seq is the position o gets in the queue. Called with mu held. */
static void pend_enqueued_locked(cg_index *ix, const op *o, uint64_t seq)
{
    if (o->type == OP_PLACE_SET)
        pend_put_locked(ix, &o->key, o->worker_id, o->tier, o->tokens, o->now, 0, seq);
    else if (o->type == OP_PLACE_DEL)
        pend_put_locked(ix, &o->key, o->worker_id, 0, 0, 0, 1, seq);
    else if (o->type == OP_REPLACE) {
        pend_replace_locked(ix, o->worker_id, seq);
        for (size_t i = 0; i < o->u.rep->n; i++)
            pend_put_locked(ix, &o->u.rep->keys[i], o->worker_id, o->u.rep->tiers[i],
                            o->u.rep->tokens[i], o->now, 0, seq);
    }
}

/* o, at queue position seq, has been applied (or failed). Called with mu held. */
static void pend_applied_locked(cg_index *ix, const op *o, uint64_t seq)
{
    if (o->type == OP_PLACE_SET || o->type == OP_PLACE_DEL) {
        pend_done_locked(ix, &o->key, o->worker_id, seq);
    } else if (o->type == OP_REPLACE) {
        pend_replace_done_locked(ix, o->worker_id, seq);
        for (size_t i = 0; i < o->u.rep->n; i++)
            pend_done_locked(ix, &o->u.rep->keys[i], o->worker_id, seq);
    }
}

/* What the queue says about one key, copied for a lookup. */
typedef struct pend_view {
    pend *v; /* copies; next unused */
    size_t n;
    int64_t *replaced; /* workers with a queued inventory replace */
    size_t n_replaced;
} pend_view;

static void pend_view_take(cg_index *ix, const cg_key *keys, size_t n, pend_view *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&ix->mu);
    size_t cap = 0, rcap = 0;
    for (pend_replace *r = ix->replaces; r; r = r->next) {
        if (out->n_replaced == rcap) {
            rcap = rcap ? rcap * 2 : 4;
            out->replaced = cg_realloc(out->replaced, rcap * sizeof *out->replaced);
        }
        out->replaced[out->n_replaced++] = r->worker_id;
    }
    for (size_t i = 0; i < n; i++) {
        pend_key *g = pend_key_find(ix, &keys[i]);
        for (pend *p = g ? g->first : NULL; p; p = p->next) {
            if (out->n == cap) {
                cap = cap ? cap * 2 : 8;
                out->v = cg_realloc(out->v, cap * sizeof *out->v);
            }
            out->v[out->n++] = *p;
        }
    }
    pthread_mutex_unlock(&ix->mu);
}

static void pend_view_free(pend_view *v)
{
    cg_free(&v->v);
    cg_free(&v->replaced);
}

static void entry_drop_placement(cg_index_entry *e, int i)
{
    memmove(&e->placements[i], &e->placements[i + 1],
            (size_t)(e->n_placements - i - 1) * sizeof e->placements[0]);
    e->n_placements--;
}

/* Sets (or, del, removes) worker wid's placement in e, keeping worker_id order. */
static void entry_put_placement(cg_index_entry *e, const pend *p)
{
    int i = 0;
    while (i < e->n_placements && e->placements[i].worker_id < p->worker_id)
        i++;
    int here = i < e->n_placements && e->placements[i].worker_id == p->worker_id;
    if (p->del) {
        if (here) entry_drop_placement(e, i);
        return;
    }
    if (!here) {
        if (e->n_placements == CG_INDEX_MAX_PLACEMENTS) return;
        memmove(&e->placements[i + 1], &e->placements[i],
                (size_t)(e->n_placements - i) * sizeof e->placements[0]);
        e->n_placements++;
    }
    e->placements[i] = (cg_index_placement){p->worker_id, (cg_tier)p->tier, p->tokens, p->now};
    if (!e->found) {
        e->found = 1;
        e->bytes = -1;
    }
    e->tokens = p->tokens;
}

/* Applies the queued placements of key to e, the committed state. */
static void pend_view_apply(const pend_view *v, const cg_key *key, cg_index_entry *e)
{
    for (size_t r = 0; r < v->n_replaced; r++)
        for (int i = e->n_placements - 1; i >= 0; i--)
            if (e->placements[i].worker_id == v->replaced[r]) entry_drop_placement(e, i);
    for (size_t i = 0; i < v->n; i++)
        if (cg_key_equal(&v->v[i].key, key)) entry_put_placement(e, &v->v[i]);
}

static void *writer_main(void *arg);

/* SQLite's memory statistics take a global mutex on every allocation, which serializes the
 * read connections; nothing here reads those statistics. Only effective before SQLite is
 * initialized in this process (otherwise SQLITE_MISUSE, harmless). */
static void sqlite_global_config(void)
{
    (void)sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

static void index_destroy(cg_index *ix)
{
    if (ix->rc) {
        for (int i = 0; i < ix->n_rc; i++) {
            cg_db_finalize_all(ix->rc[i].s, R_COUNT);
            sqlite3_close(ix->rc[i].db);
        }
        cg_free(&ix->rc);
    }
    cg_db_finalize_all(ix->ws, W_COUNT);
    /* The writer's connection closes last: as the last connection it checkpoints the WAL
     * into the main file and removes it. */
    if (ix->wdb) sqlite3_close(ix->wdb);
    if (ix->sync_inited) {
        pthread_mutex_destroy(&ix->pool_mu);
        pthread_cond_destroy(&ix->pool_cv);
        pthread_mutex_destroy(&ix->mu);
        pthread_cond_destroy(&ix->work_cv);
        pthread_cond_destroy(&ix->done_cv);
    }
    cg_free(&ix->pool_free);
    cg_free(&ix->pending.v);
    pend_free_all(ix);
    free(ix);
}

cg_status cg_index_open(const char *path, cg_index_params params, cg_index **out)
{
    cg_index *ix = NULL;
    cg_status st = CG_E_IO;
    char sql[256];

    *out = NULL;
    if (!path || !*path || strcmp(path, ":memory:") == 0 || params.read_conns < 1 ||
        params.read_conns > 64 || params.queue_max < 1 || params.batch_max < 1 ||
        params.cache_kib < 0 || params.read_cache_kib < 0 || params.mmap_bytes < 0) {
        cg_log(CG_LOG_ERROR, "index: invalid path or parameters");
        return CG_E_VALUE;
    }
    /* Each connection is used by one thread at a time (NOMUTEX), but the library must be
     * built thread-safe for separate connections to run in parallel. */
    if (!sqlite3_threadsafe()) {
        cg_log(CG_LOG_ERROR, "index: SQLite is built without thread support");
        return CG_E_UNSUPPORTED;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sqlite_global_config);
    ix = cg_calloc(1, sizeof *ix);
    ix->params = params;
    CG_MAP_INIT(&ix->pend, pend_key, node, key);

    if (open_conn(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &params, params.cache_kib,
                  &ix->wdb) != CG_OK)
        goto out;
    /* SQLite silently opens a write-protected file read-only; every write would then fail
     * while requests go on as if recorded. Refuse it at start with the reason instead. */
    if (sqlite3_db_readonly(ix->wdb, "main") == 1) {
        cg_log(CG_LOG_ERROR,
               "index: %s is read-only for this process (file permissions or a read-only "
               "file system); the index must be writable",
               path);
        goto out;
    }
    /* WAL: readers never block the writer nor each other. synchronous=NORMAL in WAL mode
     * syncs only at checkpoints: a commit survives a process crash (kill -9) but the last
     * commits may be lost on power loss; the database is never corrupted either way. The
     * index is a view workers can rebuild, so that trade buys commits without fsync. */
    snprintf(sql, sizeof sql,
             "PRAGMA synchronous = %s; PRAGMA foreign_keys = ON; PRAGMA recursive_triggers = OFF;"
             " PRAGMA wal_autocheckpoint = %d;"
             " PRAGMA journal_size_limit = %d;",
             params.synchronous_full ? "FULL" : "NORMAL", params.wal_autocheckpoint,
             WAL_SIZE_LIMIT);
    st = cg_db_setup(ix->wdb, path, &schema, sql);
    if (st != CG_OK) goto out;
    st = CG_E_IO;
    if (cg_db_prepare_all(DB_MODULE, ix->wdb, write_sql, ix->ws, W_COUNT) != CG_OK) goto out;

    ix->n_rc = params.read_conns;
    ix->rc = cg_calloc((size_t)ix->n_rc, sizeof *ix->rc);
    ix->pool_free = cg_calloc((size_t)ix->n_rc, sizeof *ix->pool_free);
    for (int i = 0; i < ix->n_rc; i++) {
        rconn *c = &ix->rc[i];
        if (open_conn(path, SQLITE_OPEN_READWRITE, &params, params.read_cache_kib, &c->db) != CG_OK)
            goto out;
        if (cg_db_exec(DB_MODULE, c->db, "PRAGMA query_only = ON", "configure reader") != CG_OK ||
            cg_db_prepare_all(DB_MODULE, c->db, read_sql, c->s, R_COUNT) != CG_OK)
            goto out;
        ix->pool_free[ix->n_free++] = i;
    }

    pthread_mutex_init(&ix->pool_mu, NULL);
    pthread_cond_init(&ix->pool_cv, NULL);
    pthread_mutex_init(&ix->mu, NULL);
    pthread_cond_init(&ix->work_cv, NULL);
    pthread_cond_init(&ix->done_cv, NULL);
    ix->sync_inited = 1;
    if (pthread_create(&ix->writer, NULL, writer_main, ix) != 0) {
        cg_log(CG_LOG_ERROR, "index: cannot start the writer thread");
        goto out;
    }
    ix->writer_started = 1;
    st = CG_OK;
    *out = ix;
    ix = NULL;
out:
    if (ix) index_destroy(ix);
    return st;
}

void cg_index_close(cg_index **pix)
{
    if (!pix || !*pix) return;
    cg_index *ix = *pix;
    if (ix->writer_started) {
        pthread_mutex_lock(&ix->mu);
        ix->stop = 1;
        pthread_cond_signal(&ix->work_cv);
        pthread_mutex_unlock(&ix->mu);
        pthread_join(ix->writer, NULL); /* the writer drains the queue before it exits */
    }
    index_destroy(ix);
    *pix = NULL;
}

/* ---- Writer thread ------------------------------------------------------------------------ */

static void op_free(op *o)
{
    if (o->type == OP_SEEN || o->type == OP_STREAM_POS) {
        cg_free(&o->u.model);
    } else if (o->type == OP_REPLACE && o->u.rep) {
        cg_free(&o->u.rep->keys);
        cg_free(&o->u.rep->tiers);
        cg_free(&o->u.rep->tokens);
        cg_free(&o->u.rep);
    }
}

/* Runs one statement whose bindings are set; logs on failure. Returns the SQLite code. */
static int wstep(cg_index *ix, int which)
{
    int rc = cg_db_step_done(ix->ws[which]);
    if (rc != SQLITE_DONE) cg_db_log(DB_MODULE, ix->wdb, write_sql[which]);
    return rc;
}

static cg_status wrun(cg_index *ix, int which)
{
    return wstep(ix, which) == SQLITE_DONE ? CG_OK : CG_E_IO;
}

/* Binds the worker's model into ?idx of stmt. Returns 1 if the worker exists, 0 if not,
 * -1 on error. */
static int bind_worker_model(cg_index *ix, int64_t worker_id, sqlite3_stmt *stmt, int idx)
{
    sqlite3_stmt *s = ix->ws[W_WORKER_MODEL];
    sqlite3_bind_int64(s, 1, worker_id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) sqlite3_bind_value(stmt, idx, sqlite3_column_value(s, 0)); /* copies */
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc == SQLITE_ROW) return 1;
    if (rc == SQLITE_DONE) return 0;
    cg_db_log(DB_MODULE, ix->wdb, write_sql[W_WORKER_MODEL]);
    return -1;
}

/* Stub chunk row (if new) + placement upsert; the worker's model is already bound. */
static cg_status place_one(cg_index *ix, const cg_key *key, int64_t worker_id, int tier,
                           int64_t tokens, int64_t now)
{
    sqlite3_stmt *s = ix->ws[W_CHUNK_STUB];
    cg_db_bind_key(s, 1, key);
    sqlite3_bind_int64(s, 3, tokens);
    sqlite3_bind_int64(s, 4, now);
    /* step_done clears bindings; keep the model binding for the next placement */
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    }
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        cg_db_log(DB_MODULE, ix->wdb, write_sql[W_CHUNK_STUB]);
        return CG_E_IO;
    }
    s = ix->ws[W_PLACE];
    cg_db_bind_key(s, 1, key);
    sqlite3_bind_int64(s, 2, worker_id);
    sqlite3_bind_text(s, 3, cg_tier_name((cg_tier)tier), -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, tokens);
    sqlite3_bind_int64(s, 5, now);
    return wrun(ix, W_PLACE);
}

static cg_status apply_replace(cg_index *ix, const op *o)
{
    const replace_set *r = o->u.rep;
    int w = bind_worker_model(ix, o->worker_id, ix->ws[W_CHUNK_STUB], 2);
    if (w <= 0) return w < 0 ? CG_E_IO : CG_OK;
    /* A savepoint makes the inventory swap all-or-nothing even inside a larger batch. */
    if (wrun(ix, W_SAVEPOINT) != CG_OK) return CG_E_IO;
    sqlite3_bind_int64(ix->ws[W_WORKER_PLACES_DEL], 1, o->worker_id);
    cg_status st = wrun(ix, W_WORKER_PLACES_DEL);
    for (size_t i = 0; st == CG_OK && i < r->n; i++)
        st = place_one(ix, &r->keys[i], o->worker_id, r->tiers[i], r->tokens[i], o->now);
    sqlite3_clear_bindings(ix->ws[W_CHUNK_STUB]);
    if (st != CG_OK) (void)wrun(ix, W_ROLLBACK_TO);
    if (wrun(ix, W_RELEASE) != CG_OK) st = CG_E_IO;
    return st;
}

/* Applies one op inside the open transaction. CG_E_IO means the op failed; other codes are
 * results for a synchronous caller (CG_E_NOT_FOUND). */
static cg_status apply_op(cg_index *ix, op *o)
{
    sqlite3_stmt *s;
    switch ((enum op_type)o->type) {
    case OP_SEEN:
        s = ix->ws[W_SEEN];
        cg_db_bind_key(s, 1, &o->key);
        sqlite3_bind_text(s, 2, o->u.model, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, mode_names[o->mode], -1, SQLITE_STATIC);
        if (o->bytes >= 0) sqlite3_bind_int64(s, 4, o->bytes);
        sqlite3_bind_int64(s, 5, o->now);
        return wrun(ix, W_SEEN);
    case OP_HIT:
        s = ix->ws[W_HIT];
        cg_db_bind_key(s, 1, &o->key);
        sqlite3_bind_int64(s, 2, o->now);
        return wrun(ix, W_HIT);
    case OP_PLACE_SET: {
        int w = bind_worker_model(ix, o->worker_id, ix->ws[W_CHUNK_STUB], 2);
        if (w <= 0) return w < 0 ? CG_E_IO : CG_OK; /* unknown worker: nothing to record */
        cg_status st = place_one(ix, &o->key, o->worker_id, o->tier, o->tokens, o->now);
        sqlite3_clear_bindings(ix->ws[W_CHUNK_STUB]);
        return st;
    }
    case OP_PLACE_DEL:
        s = ix->ws[W_PLACE_DEL];
        cg_db_bind_key(s, 1, &o->key);
        sqlite3_bind_int64(s, 2, o->worker_id);
        return wrun(ix, W_PLACE_DEL);
    case OP_REPLACE:
        return apply_replace(ix, o);
    case OP_PIN:
        s = ix->ws[W_PIN];
        cg_db_bind_key(s, 1, &o->key);
        sqlite3_bind_int(s, 2, o->flag);
        return wrun(ix, W_PIN);
    case OP_DELETE:
        cg_db_bind_key(ix->ws[W_CHUNK_PLACES_DEL], 1, &o->key);
        if (wrun(ix, W_CHUNK_PLACES_DEL) != CG_OK) return CG_E_IO;
        cg_db_bind_key(ix->ws[W_CHUNK_DEL], 1, &o->key);
        return wrun(ix, W_CHUNK_DEL);
    case OP_WORKER_ADD: {
        s = ix->ws[W_WORKER_ADD];
        sqlite3_bind_text(s, 1, o->u.sync->url, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, o->u.sync->model, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, o->now);
        int rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) o->u.sync->id = sqlite3_column_int64(s, 0);
        int rc2 = cg_db_step_done(s); /* finish the statement so its write is complete */
        if (rc != SQLITE_ROW || rc2 != SQLITE_DONE) {
            cg_db_log(DB_MODULE, ix->wdb, write_sql[W_WORKER_ADD]);
            return CG_E_IO;
        }
        return CG_OK;
    }
    case OP_WORKER_DEL:
        sqlite3_bind_int64(ix->ws[W_WORKER_PLACES_DEL], 1, o->worker_id);
        if (wrun(ix, W_WORKER_PLACES_DEL) != CG_OK) return CG_E_IO;
        sqlite3_bind_int64(ix->ws[W_WORKER_DEL], 1, o->worker_id);
        if (wrun(ix, W_WORKER_DEL) != CG_OK) return CG_E_IO;
        return sqlite3_changes(ix->wdb) ? CG_OK : CG_E_NOT_FOUND;
    case OP_WORKER_HEALTH:
        s = ix->ws[W_WORKER_HEALTH];
        sqlite3_bind_int64(s, 1, o->worker_id);
        sqlite3_bind_int(s, 2, o->flag);
        sqlite3_bind_int64(s, 3, o->now);
        if (wrun(ix, W_WORKER_HEALTH) != CG_OK) return CG_E_IO;
        return sqlite3_changes(ix->wdb) ? CG_OK : CG_E_NOT_FOUND;
    case OP_STREAM_POS:
        s = ix->ws[W_STREAM_POS];
        sqlite3_bind_text(s, 1, o->u.model, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, o->u.model + strlen(o->u.model) + 1, -1, SQLITE_STATIC);
        return wrun(ix, W_STREAM_POS);
    }
    return CG_E_INTERNAL;
}

static int is_sync(const op *o)
{
    return o->type == OP_WORKER_ADD || o->type == OP_WORKER_DEL || o->type == OP_WORKER_HEALTH;
}

/* Applies ops[0..n) in one transaction. Returns how many failed; *committed tells whether the
 * transaction committed. A failed statement fails its op only (SQLite rolls back just that
 * statement); an error that aborts the transaction, or a failed COMMIT, fails the batch. */
static size_t apply_batch(cg_index *ix, op *ops, size_t n, int *committed)
{
    size_t failed = 0;
    *committed = 0;
    /* BEGIN IMMEDIATE waits busy_timeout for another process's write lock (an operator's
     * sqlite3 shell); try a few times before giving the batch up. */
    for (int tries = 1;; tries++) {
        int rc = wstep(ix, W_BEGIN) & 0xff; /* primary code */
        if (rc == SQLITE_DONE) break;
        if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || tries == 3) goto lost;
    }
    for (size_t i = 0; i < n; i++) {
        cg_status st = apply_op(ix, &ops[i]);
        if (is_sync(&ops[i])) ops[i].u.sync->st = st;
        if (st == CG_E_IO) failed++;
        if (sqlite3_get_autocommit(ix->wdb)) goto lost; /* the transaction was rolled back */
    }
    if (wrun(ix, W_COMMIT) != CG_OK) {
        (void)wrun(ix, W_ROLLBACK);
        goto lost;
    }
    *committed = 1;
    return failed;
lost:
    if (!sqlite3_get_autocommit(ix->wdb)) (void)wrun(ix, W_ROLLBACK);
    cg_log(CG_LOG_ERROR, "index: a write batch of %zu ops was not applied", n);
    for (size_t i = 0; i < n; i++)
        if (is_sync(&ops[i])) ops[i].u.sync->st = CG_E_IO;
    return n;
}

static void *writer_main(void *arg)
{
    cg_index *ix = arg;
    opvec work = {0};
    pthread_mutex_lock(&ix->mu);
    for (;;) {
        while (ix->pending.n == 0 && !ix->stop) {
            ix->writer_idle = 1;
            pthread_cond_wait(&ix->work_cv, &ix->mu);
            ix->writer_idle = 0;
        }
        if (ix->pending.n == 0) break; /* stop requested and the queue is drained */
        /* Take everything queued in O(1); producers keep appending to the other vector. */
        opvec t = ix->pending;
        ix->pending = work;
        work = t;
        const uint64_t seq0 = ix->done_seq; /* ops finish in order: work.v[0] is op seq0 */
        pthread_mutex_unlock(&ix->mu);

        for (size_t i = 0; i < work.n; i += ix->params.batch_max) {
            size_t k = CG_MIN(ix->params.batch_max, work.n - i);
            int committed;
            size_t failed = apply_batch(ix, work.v + i, k, &committed);
            pthread_mutex_lock(&ix->mu);
            ix->done_seq += k;
            ix->batches += (uint64_t)committed;
            ix->applied += k - failed;
            ix->failed += failed;
            for (size_t j = i; j < i + k; j++) {
                pend_applied_locked(ix, &work.v[j], seq0 + j);
                /* Last touch of a sync slot: its owner may return as soon as we unlock. */
                if (is_sync(&work.v[j])) work.v[j].u.sync->done = 1;
            }
            if (ix->waiters) pthread_cond_broadcast(&ix->done_cv);
            pthread_mutex_unlock(&ix->mu);
            for (size_t j = i; j < i + k; j++)
                op_free(&work.v[j]);
        }
        work.n = 0;
        pthread_mutex_lock(&ix->mu);
    }
    pthread_mutex_unlock(&ix->mu);
    cg_free(&work.v);
    return NULL;
}

/* Appends o (taking its payload). Returns 1 if queued, 0 if dropped because the queue is
 * full (only when droppable). Called with ix->mu held. */
static int enqueue_locked(cg_index *ix, const op *o, int droppable)
{
    if (droppable && ix->enq_seq - ix->done_seq >= ix->params.queue_max) {
        ix->dropped++;
        return 0;
    }
    opvec *q = &ix->pending;
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 1024;
        q->v = cg_realloc(q->v, q->cap * sizeof *q->v);
    }
    q->v[q->n++] = *o;
    pend_enqueued_locked(ix, o, ix->enq_seq);
    ix->enq_seq++;
    if (ix->writer_idle) pthread_cond_signal(&ix->work_cv);
    return 1;
}

static void enqueue(cg_index *ix, op *o, int droppable)
{
    pthread_mutex_lock(&ix->mu);
    int queued = enqueue_locked(ix, o, droppable);
    pthread_mutex_unlock(&ix->mu);
    if (!queued) op_free(o);
}

/* Queues a synchronous op and waits for its transaction to commit. */
static cg_status run_sync(cg_index *ix, op *o, sync_slot *slot)
{
    slot->st = CG_E_INTERNAL;
    slot->done = 0;
    o->u.sync = slot;
    pthread_mutex_lock(&ix->mu);
    (void)enqueue_locked(ix, o, 0);
    ix->waiters++;
    while (!slot->done)
        pthread_cond_wait(&ix->done_cv, &ix->mu);
    ix->waiters--;
    pthread_mutex_unlock(&ix->mu);
    return slot->st;
}

void cg_index_chunk_seen(cg_index *ix, const cg_key *key, const char *model, cg_mode mode,
                         int64_t bytes, int64_t now_ms)
{
    op o = {
        .type = OP_SEEN, .key = *key, .mode = mode == CG_MODE_SYS, .bytes = bytes, .now = now_ms};
    o.u.model = cg_strdup(model ? model : "");
    enqueue(ix, &o, 1);
}

void cg_index_chunk_hit(cg_index *ix, const cg_key *key, int64_t now_ms)
{
    op o = {.type = OP_HIT, .key = *key, .now = now_ms};
    enqueue(ix, &o, 1);
}

static void placement_set(cg_index *ix, const cg_key *key, int64_t worker_id, cg_tier tier,
                          int64_t tokens, int64_t now_ms, int droppable)
{
    op o = {.type = OP_PLACE_SET,
            .key = *key,
            .worker_id = worker_id,
            .tier = tier_byte(tier),
            .tokens = tokens,
            .now = now_ms};
    enqueue(ix, &o, droppable);
}

void cg_index_placement_set(cg_index *ix, const cg_key *key, int64_t worker_id, cg_tier tier,
                            int64_t tokens, int64_t now_ms)
{
    placement_set(ix, key, worker_id, tier, tokens, now_ms, 1);
}

void cg_index_event_placement_set(cg_index *ix, const cg_key *key, int64_t worker_id, cg_tier tier,
                                  int64_t tokens, int64_t now_ms)
{
    placement_set(ix, key, worker_id, tier, tokens, now_ms, 0);
}

static void placement_del(cg_index *ix, const cg_key *key, int64_t worker_id, int droppable)
{
    op o = {.type = OP_PLACE_DEL, .key = *key, .worker_id = worker_id};
    enqueue(ix, &o, droppable);
}

void cg_index_placement_del(cg_index *ix, const cg_key *key, int64_t worker_id)
{
    placement_del(ix, key, worker_id, 1);
}

void cg_index_event_placement_del(cg_index *ix, const cg_key *key, int64_t worker_id)
{
    placement_del(ix, key, worker_id, 0);
}

void cg_index_worker_placements_replace(cg_index *ix, int64_t worker_id, const cg_key *keys,
                                        const cg_tier *tiers, const int64_t *tokens, size_t n,
                                        int64_t now_ms)
{
    op o = {.type = OP_REPLACE, .worker_id = worker_id, .now = now_ms};
    replace_set *r = cg_calloc(1, sizeof *r);
    r->n = n;
    r->keys = cg_malloc(n * sizeof *r->keys);
    r->tiers = cg_malloc(n * sizeof *r->tiers);
    r->tokens = cg_malloc(n * sizeof *r->tokens);
    if (n) {
        memcpy(r->keys, keys, n * sizeof *r->keys);
        memcpy(r->tokens, tokens, n * sizeof *r->tokens);
    }
    for (size_t i = 0; i < n; i++)
        r->tiers[i] = tier_byte(tiers[i]);
    o.u.rep = r;
    enqueue(ix, &o, 0);
}

void cg_index_chunk_pin(cg_index *ix, const cg_key *key, int pinned)
{
    op o = {.type = OP_PIN, .key = *key, .flag = pinned != 0};
    enqueue(ix, &o, 0);
}

void cg_index_chunk_delete(cg_index *ix, const cg_key *key)
{
    op o = {.type = OP_DELETE, .key = *key};
    enqueue(ix, &o, 0);
}

void cg_index_stream_pos_set(cg_index *ix, const char *stream, const char *position)
{
    size_t a = strlen(stream) + 1, b = strlen(position) + 1;
    op o = {.type = OP_STREAM_POS};
    o.u.model = cg_malloc(a + b);
    memcpy(o.u.model, stream, a);
    memcpy(o.u.model + a, position, b);
    enqueue(ix, &o, 0);
}

cg_status cg_index_flush(cg_index *ix)
{
    pthread_mutex_lock(&ix->mu);
    uint64_t target = ix->enq_seq, failed0 = ix->failed;
    ix->waiters++;
    while (ix->done_seq < target)
        pthread_cond_wait(&ix->done_cv, &ix->mu);
    ix->waiters--;
    int failed = ix->failed != failed0;
    pthread_mutex_unlock(&ix->mu);
    return failed ? CG_E_IO : CG_OK;
}

cg_status cg_index_worker_add(cg_index *ix, const char *url, const char *model, int64_t now_ms,
                              int64_t *id)
{
    if (!url || !*url || !model) return CG_E_VALUE;
    sync_slot slot = {.url = url, .model = model};
    op o = {.type = OP_WORKER_ADD, .now = now_ms};
    cg_status st = run_sync(ix, &o, &slot);
    if (st == CG_OK) *id = slot.id;
    return st;
}

cg_status cg_index_worker_delete(cg_index *ix, int64_t id)
{
    sync_slot slot = {0};
    op o = {.type = OP_WORKER_DEL, .worker_id = id};
    return run_sync(ix, &o, &slot);
}

cg_status cg_index_worker_set_health(cg_index *ix, int64_t id, int healthy, int64_t now_ms)
{
    sync_slot slot = {0};
    op o = {.type = OP_WORKER_HEALTH, .worker_id = id, .flag = healthy != 0, .now = now_ms};
    return run_sync(ix, &o, &slot);
}

/* ---- Read pool ---------------------------------------------------------------------------- *
 * A request thread borrows any free connection for one read transaction. A pool (default 4)
 * rather than one connection per thread: the HTTP layer's thread count is not ours to know,
 * and with 2 cores two readers already keep both busy; the spare connections cover threads
 * that are preempted while holding one. The pool mutex is held only to pop/push an index. */

static rconn *pool_get(cg_index *ix)
{
    pthread_mutex_lock(&ix->pool_mu);
    while (ix->n_free == 0)
        pthread_cond_wait(&ix->pool_cv, &ix->pool_mu);
    rconn *c = &ix->rc[ix->pool_free[--ix->n_free]];
    pthread_mutex_unlock(&ix->pool_mu);
    return c;
}

static void pool_put(cg_index *ix, rconn *c)
{
    pthread_mutex_lock(&ix->pool_mu);
    ix->pool_free[ix->n_free++] = (int)(c - ix->rc);
    pthread_cond_signal(&ix->pool_cv);
    pthread_mutex_unlock(&ix->pool_mu);
}

static cg_status read_begin(rconn *c)
{
    if (cg_db_step_done(c->s[R_BEGIN]) == SQLITE_DONE) return CG_OK;
    cg_db_log(DB_MODULE, c->db, "BEGIN");
    return CG_E_IO;
}

/* Ends the read transaction; a failed read rolls back (there is nothing to undo). */
static cg_status read_end(rconn *c, cg_status st)
{
    if (sqlite3_get_autocommit(c->db)) return st;
    if (cg_db_step_done(c->s[st == CG_OK ? R_COMMIT : R_ROLLBACK]) != SQLITE_DONE) {
        cg_db_log(DB_MODULE, c->db, "end read transaction");
        return st == CG_OK ? CG_E_IO : st;
    }
    return st;
}

/* Steps s, a query for at most one row: CG_OK with the row to read, CG_E_NOT_FOUND when there
 * is none, CG_E_IO (logged as what) on an error. The caller resets s. */
static cg_status step_row(rconn *c, sqlite3_stmt *s, const char *what)
{
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) return CG_OK;
    if (rc == SQLITE_DONE) return CG_E_NOT_FOUND;
    cg_db_log(DB_MODULE, c->db, what);
    return CG_E_IO;
}

static void fill_placement(sqlite3_stmt *s, int col, cg_index_placement *p)
{
    p->worker_id = sqlite3_column_int64(s, col);
    p->tier = col_tier(s, col + 1);
    p->tokens = sqlite3_column_int64(s, col + 2);
    p->updated = sqlite3_column_int64(s, col + 3);
}

cg_status cg_index_lookup(cg_index *ix, const cg_key *keys, size_t n, cg_index_entry *out)
{
    if (n == 0) return CG_OK;
    pend_view pv;
    pend_view_take(ix, keys, n, &pv); /* before the snapshot: see "Queued placements" */
    rconn *c = pool_get(ix);
    cg_status st = read_begin(c);
    sqlite3_stmt *s = c->s[R_LOOKUP];
    for (size_t i = 0; st == CG_OK && i < n; i++) {
        cg_index_entry *e = &out[i];
        e->found = 0;
        e->tokens = e->bytes = e->seen_count = e->hit_count = 0;
        e->pinned = e->n_placements = 0;
        cg_db_bind_key(s, 1, &keys[i]);
        int rc;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            if (!e->found) {
                e->found = 1;
                e->tokens = col_int_or_neg(s, 0);
                e->bytes = col_int_or_neg(s, 1);
                e->seen_count = sqlite3_column_int64(s, 2);
                e->hit_count = sqlite3_column_int64(s, 3);
                e->pinned = sqlite3_column_int(s, 4);
            }
            if (sqlite3_column_type(s, 5) != SQLITE_NULL &&
                e->n_placements < CG_INDEX_MAX_PLACEMENTS)
                fill_placement(s, 5, &e->placements[e->n_placements++]);
        }
        sqlite3_reset(s);
        if (rc != SQLITE_DONE) {
            cg_db_log(DB_MODULE, c->db, "lookup");
            st = CG_E_IO;
        }
        pend_view_apply(&pv, &keys[i], e);
    }
    sqlite3_clear_bindings(s);
    st = read_end(c, st);
    pool_put(ix, c);
    pend_view_free(&pv);
    return st;
}

int64_t cg_index_entry_tokens_on(const cg_index_entry *e, int64_t worker_id)
{
    for (int p = 0; e && p < e->n_placements; p++)
        if (e->placements[p].worker_id == worker_id) return e->placements[p].tokens;
    return 0;
}

/* ---- Admin reads -------------------------------------------------------------------------- */

static void fill_worker(sqlite3_stmt *s, cg_index_worker *w)
{
    w->id = sqlite3_column_int64(s, 0);
    w->url = col_strdup(s, 1);
    w->model = col_strdup(s, 2);
    w->added = sqlite3_column_int64(s, 3);
    w->last_seen = sqlite3_column_int64(s, 4);
    w->healthy = sqlite3_column_int(s, 5);
}

void cg_index_worker_clear(cg_index_worker *w)
{
    if (!w) return;
    cg_free(&w->url);
    cg_free(&w->model);
    memset(w, 0, sizeof *w);
}

void cg_index_workers_free(cg_index_worker **arr, size_t n)
{
    if (!arr || !*arr) return;
    for (size_t i = 0; i < n; i++)
        cg_index_worker_clear(&(*arr)[i]);
    cg_free(arr);
}

cg_status cg_index_stream_pos_get(cg_index *ix, const char *stream, char *out, size_t cap)
{
    if (cap) out[0] = 0;
    rconn *c = pool_get(ix);
    sqlite3_stmt *s = c->s[R_STREAM_POS];
    sqlite3_bind_text(s, 1, stream, -1, SQLITE_STATIC);
    cg_status st = step_row(c, s, "stream position");
    if (st == CG_OK) {
        const char *v = (const char *)sqlite3_column_text(s, 0);
        if (!v || strlen(v) >= cap)
            st = CG_E_VALUE;
        else
            memcpy(out, v, strlen(v) + 1);
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    pool_put(ix, c);
    return st;
}

cg_status cg_index_worker_get_by_url(cg_index *ix, const char *url, cg_index_worker *out)
{
    memset(out, 0, sizeof *out);
    if (!url) return CG_E_VALUE;
    rconn *c = pool_get(ix);
    sqlite3_stmt *s = c->s[R_WORKER_BY_URL];
    sqlite3_bind_text(s, 1, url, -1, SQLITE_STATIC);
    cg_status st = step_row(c, s, "worker by url");
    if (st == CG_OK) fill_worker(s, out);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    pool_put(ix, c);
    return st;
}

cg_status cg_index_workers_list(cg_index *ix, cg_index_worker **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    rconn *c = pool_get(ix);
    sqlite3_stmt *s = c->s[R_WORKERS_ALL];
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            *out = cg_realloc(*out, cap * sizeof **out);
        }
        fill_worker(s, &(*out)[(*n)++]);
    }
    sqlite3_reset(s);
    pool_put(ix, c);
    if (rc != SQLITE_DONE) {
        cg_index_workers_free(out, *n);
        *n = 0;
        return CG_E_IO;
    }
    return CG_OK;
}

void cg_index_chunk_clear(cg_index_chunk *c)
{
    if (!c) return;
    cg_free(&c->model);
    memset(c, 0, sizeof *c);
}

void cg_index_chunks_free(cg_index_chunk **arr, size_t n)
{
    if (!arr || !*arr) return;
    for (size_t i = 0; i < n; i++)
        cg_index_chunk_clear(&(*arr)[i]);
    cg_free(arr);
}

/* Fills a chunk from a CHUNK_COLS row, then reads its placements (same read transaction). */
static cg_status fill_chunk(rconn *c, sqlite3_stmt *s, cg_index_chunk *out)
{
    memset(out, 0, sizeof *out);
    const void *k = sqlite3_column_blob(s, 0);
    if (k && sqlite3_column_bytes(s, 0) == (int)sizeof out->key.b)
        memcpy(out->key.b, k, sizeof out->key.b);
    out->model = col_strdup(s, 1);
    out->mode = col_mode(s, 2);
    out->tokens = col_int_or_neg(s, 3);
    out->bytes = col_int_or_neg(s, 4);
    out->first_seen = sqlite3_column_int64(s, 5);
    out->last_seen = sqlite3_column_int64(s, 6);
    out->last_hit = sqlite3_column_int64(s, 7);
    out->seen_count = sqlite3_column_int64(s, 8);
    out->hit_count = sqlite3_column_int64(s, 9);
    out->pinned = sqlite3_column_int(s, 10);

    sqlite3_stmt *p = c->s[R_CHUNK_PLACEMENTS];
    cg_db_bind_key(p, 1, &out->key);
    sqlite3_bind_int(p, 2, CG_INDEX_MAX_PLACEMENTS);
    int rc;
    while ((rc = sqlite3_step(p)) == SQLITE_ROW && out->n_placements < CG_INDEX_MAX_PLACEMENTS)
        fill_placement(p, 0, &out->placements[out->n_placements++]);
    sqlite3_reset(p);
    sqlite3_clear_bindings(p);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        cg_db_log(DB_MODULE, c->db, "chunk placements");
        return CG_E_IO;
    }
    return CG_OK;
}

cg_status cg_index_chunk_get(cg_index *ix, const cg_key *key, cg_index_chunk *out)
{
    memset(out, 0, sizeof *out);
    rconn *c = pool_get(ix);
    cg_status st = read_begin(c);
    if (st == CG_OK) {
        sqlite3_stmt *s = c->s[R_CHUNK_GET];
        cg_db_bind_key(s, 1, key);
        st = step_row(c, s, "chunk get");
        if (st == CG_OK) st = fill_chunk(c, s, out);
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
    st = read_end(c, st == CG_E_NOT_FOUND ? CG_OK : st) == CG_OK ? st : CG_E_IO;
    pool_put(ix, c);
    if (st != CG_OK) cg_index_chunk_clear(out);
    return st;
}

cg_status cg_index_chunks_list(cg_index *ix, const cg_key *after, size_t limit,
                               cg_index_chunk **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > LIST_LIMIT_MAX) return CG_E_VALUE;
    size_t cap = CG_MIN(limit, (size_t)64);
    *out = cg_malloc(cap * sizeof **out);
    rconn *c = pool_get(ix);
    cg_status st = read_begin(c);
    if (st == CG_OK) {
        sqlite3_stmt *s = c->s[R_CHUNK_PAGE];
        /* A zero-length BLOB sorts before every 16-byte key. */
        if (after)
            cg_db_bind_key(s, 1, after);
        else
            sqlite3_bind_zeroblob(s, 1, 0);
        sqlite3_bind_int64(s, 2, (int64_t)limit);
        int rc = SQLITE_DONE;
        while (st == CG_OK && *n < limit && (rc = sqlite3_step(s)) == SQLITE_ROW) {
            if (*n == cap) {
                cap = CG_MIN(cap * 2, limit);
                *out = cg_realloc(*out, cap * sizeof **out);
            }
            st = fill_chunk(c, s, &(*out)[(*n)++]);
        }
        if (st == CG_OK && *n < limit && rc != SQLITE_DONE) {
            cg_db_log(DB_MODULE, c->db, "chunk page");
            st = CG_E_IO;
        }
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
    st = read_end(c, st);
    pool_put(ix, c);
    if (st != CG_OK) {
        cg_index_chunks_free(out, *n);
        *n = 0;
    }
    return st;
}

cg_status cg_index_stats_get(cg_index *ix, cg_index_stats *out)
{
    memset(out, 0, sizeof *out);
    rconn *c = pool_get(ix);
    sqlite3_stmt *s = c->s[R_TOTALS];
    cg_status st = CG_OK;
    if (sqlite3_step(s) == SQLITE_ROW) {
        out->chunks = sqlite3_column_int64(s, 0);
        out->placements = sqlite3_column_int64(s, 1);
        out->bytes = sqlite3_column_int64(s, 2);
        out->workers = sqlite3_column_int64(s, 3);
        out->file_bytes = sqlite3_column_int64(s, 4);
    } else {
        cg_db_log(DB_MODULE, c->db, "totals");
        st = CG_E_IO;
    }
    sqlite3_reset(s);
    pool_put(ix, c);

    pthread_mutex_lock(&ix->mu);
    out->batches = ix->batches;
    out->ops_applied = ix->applied;
    out->ops_failed = ix->failed;
    out->ops_dropped = ix->dropped;
    out->queue_depth = ix->enq_seq - ix->done_seq;
    pthread_mutex_unlock(&ix->mu);
    return st;
}

/* ---- Check -------------------------------------------------------------------------------- */

static cg_status check_conn(rconn *c, char *msg, size_t msg_len)
{
    sqlite3_stmt *s = c->s[R_INTEGRITY];
    int rc = sqlite3_step(s);
    const char *r = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(s, 0) : NULL;
    if (!r || strcmp(r, "ok") != 0) {
        snprintf(msg, msg_len, "integrity_check: %s", r ? r : sqlite3_errmsg(c->db));
        sqlite3_reset(s);
        return CG_E_IO;
    }
    sqlite3_reset(s);

    s = c->s[R_FK_CHECK];
    rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) {
        if (rc == SQLITE_ROW)
            snprintf(msg, msg_len,
                     "foreign_key_check: table %s row %lld violates a reference to %s",
                     (const char *)sqlite3_column_text(s, 0), (long long)sqlite3_column_int64(s, 1),
                     (const char *)sqlite3_column_text(s, 2));
        else
            snprintf(msg, msg_len, "foreign_key_check: %s", sqlite3_errmsg(c->db));
        sqlite3_reset(s);
        return CG_E_IO;
    }
    sqlite3_reset(s);

    s = c->s[R_TOTALS_CHECK];
    if (sqlite3_step(s) != SQLITE_ROW) {
        snprintf(msg, msg_len, "totals: %s", sqlite3_errmsg(c->db));
        sqlite3_reset(s);
        return CG_E_IO;
    }
    int64_t v[6];
    for (int i = 0; i < 6; i++)
        v[i] = sqlite3_column_int64(s, i);
    sqlite3_reset(s);
    if (v[0] != v[3] || v[1] != v[4] || v[2] != v[5]) {
        snprintf(msg, msg_len,
                 "totals row (chunks %lld, placements %lld, bytes %lld) differs from the tables "
                 "(%lld, %lld, %lld)",
                 (long long)v[3], (long long)v[4], (long long)v[5], (long long)v[0],
                 (long long)v[1], (long long)v[2]);
        return CG_E_IO;
    }

    s = c->s[R_INVARIANTS];
    int64_t bad = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_reset(s);
    if (bad != 0) {
        snprintf(msg, msg_len,
                 "%lld chunk rows break last_seen >= first_seen or "
                 "(mode unknown) == (never seen)",
                 (long long)bad);
        return CG_E_IO;
    }
    snprintf(msg, msg_len, "ok");
    return CG_OK;
}

cg_status cg_index_check(cg_index *ix, char *msg, size_t msg_len)
{
    char scratch[8];
    if (!msg || msg_len == 0) {
        msg = scratch;
        msg_len = sizeof scratch;
    }
    rconn *c = pool_get(ix);
    cg_status st = read_begin(c);
    if (st == CG_OK)
        st = check_conn(c, msg, msg_len);
    else
        snprintf(msg, msg_len, "cannot begin a read transaction");
    st = read_end(c, st);
    pool_put(ix, c);
    return st;
}
