/* The gateway's chunk index: a durable SQLite (WAL) view of which worker holds which chunk.
 * Reads run on a small pool of read connections; every write goes through one writer
 * thread that applies queued operations in batches, so request threads never wait on disk.
 * DESIGN §9, §11. Schema, durability and writer design: README.md, "Chunk index". */
#ifndef CG_INDEX_H
#define CG_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include "cache/key.h"
#include "base/status.h"
#include "base/tier.h" /* cg_tier: where a placement's KV is */

typedef struct cg_index cg_index;

/* Placements reported per chunk by cg_index_lookup / cg_index_chunk_get / cg_index_chunks_list. */
#define CG_INDEX_MAX_PLACEMENTS 8
/* Highest schema version (PRAGMA user_version) this build knows. */
#define CG_INDEX_SCHEMA_VERSION 3

typedef struct cg_index_params {
    int read_conns;         /* read connections in the pool (default 4) */
    int busy_timeout_ms;    /* wait on a lock held by another process (default 5000) */
    int64_t cache_kib;      /* writer page cache, KiB (default 65536) */
    int64_t read_cache_kib; /* page cache per read connection, KiB (default 8192) */
    int64_t mmap_bytes;     /* mmap for reads, bytes; 0 = off (default 2 GiB, capped by SQLite) */
    size_t queue_max;       /* queued ops before hot-path ops are dropped (default 1<<20) */
    size_t batch_max;       /* most ops applied in one write transaction (default 16384) */
    int synchronous_full;   /* 1: PRAGMA synchronous=FULL (fsync per commit); default 0=NORMAL */
    int wal_autocheckpoint; /* WAL pages before the writer checkpoints (default 1000 = 4 MiB) */
} cg_index_params;

cg_index_params cg_index_default_params(void);

/* Opens or creates the index file at path (a file path; ":memory:" is not supported because
 * the read pool needs a shared file), applies pending schema migrations (each in its own
 * transaction) and starts the writer thread. Fails with CG_E_UNSUPPORTED if the file has a
 * newer schema version than CG_INDEX_SCHEMA_VERSION or is not a chunkgate index, CG_E_IO on
 * any SQLite error; the reason is logged. path is borrowed. On success *out owns the index. */
cg_status cg_index_open(const char *path, cg_index_params params, cg_index **out) CG_WUR;

/* Flushes every queued write, stops the writer, closes all connections. Accepts NULL and
 * *ix == NULL; sets *ix to NULL. */
void cg_index_close(cg_index **ix);

/* ---- Request path: batched lookup --------------------------------------------------------- */

typedef struct cg_index_placement {
    int64_t worker_id;
    cg_tier tier;
    int64_t tokens;
    int64_t updated; /* ms epoch of the last report */
} cg_index_placement;

typedef struct cg_index_entry {
    int found;      /* 0: no chunk row; the other fields are zero */
    int64_t tokens; /* -1: unknown until a worker reports it */
    int64_t bytes;  /* segment text bytes; -1: unknown */
    int64_t seen_count;
    int64_t hit_count;
    int pinned;
    int n_placements; /* at most CG_INDEX_MAX_PLACEMENTS, ordered by worker_id */
    cg_index_placement placements[CG_INDEX_MAX_PLACEMENTS];
} cg_index_entry;

/* Looks up n keys in one read transaction (a consistent snapshot) and fills out[0..n).
 * keys and out are borrowed; out must hold n entries. Duplicate keys are fine. Safe to call
 * from any number of threads; it takes a connection from the read pool. Sees every write
 * committed before it starts, and the placements (set, delete, inventory replace) still
 * waiting in the write queue: the index is the one owner of where a chunk is, also for the
 * moment between learning a placement and committing it. */
cg_status cg_index_lookup(cg_index *ix, const cg_key *keys, size_t n, cg_index_entry *out) CG_WUR;
/* Tokens of the chunk on worker_id according to e (a lookup result; NULL = unknown), or 0 when
 * e places it elsewhere only. */
int64_t cg_index_entry_tokens_on(const cg_index_entry *e, int64_t worker_id);

/* ---- Asynchronous writes ------------------------------------------------------------------- *
 * Each call copies its arguments into the writer queue and returns at once; the writer
 * thread applies them in order, many per transaction. Hot-path ops (seen, hit, placement set
 * and delete) are dropped and counted in stats.ops_dropped when queue_max ops are already
 * waiting, because the index is a view the workers can rebuild; control ops (inventory
 * replace, pin, delete) are never dropped. Ops on a worker id that does not exist are no-ops.
 * All strings and arrays are borrowed (copied before return). */

/* Upserts a chunk row: a new row gets first_seen = last_seen = now, seen_count = 1; an
 * existing one gets seen_count + 1, last_seen = max(last_seen, now), and its model, mode and
 * bytes set. bytes is the segment's text length. */
void cg_index_chunk_seen(cg_index *ix, const cg_key *key, const char *model, cg_mode mode,
                         int64_t bytes, int64_t now_ms);
/* hit_count + 1, last_hit = max(last_hit, now). No-op for an unknown chunk. */
void cg_index_chunk_hit(cg_index *ix, const cg_key *key, int64_t now_ms);
/* Records that worker_id holds key in tier with tokens (>= 0) tokens; also sets the chunk's
 * tokens. A chunk the gateway has not seen yet gets a row with the worker's model, unknown
 * mode and bytes, and seen_count 0. */
void cg_index_placement_set(cg_index *ix, const cg_key *key, int64_t worker_id, cg_tier tier,
                            int64_t tokens, int64_t now_ms);
/* Forgets that worker_id holds key (evicted). The chunk row stays. */
void cg_index_placement_del(cg_index *ix, const cg_key *key, int64_t worker_id);
/* The two above for the changes chunk events report (server/eventsync.c): never dropped when
 * the queue is full, as the stream position that follows them is not, so a position is never
 * committed past an event whose change was lost. */
void cg_index_event_placement_set(cg_index *ix, const cg_key *key, int64_t worker_id, cg_tier tier,
                                  int64_t tokens, int64_t now_ms);
void cg_index_event_placement_del(cg_index *ix, const cg_key *key, int64_t worker_id);
/* Full inventory sync: worker_id's placements become exactly keys[0..n) (tiers[i], tokens[i])
 * in one atomic step. n may be 0 (the worker holds nothing). Arrays are copied. */
void cg_index_worker_placements_replace(cg_index *ix, int64_t worker_id, const cg_key *keys,
                                        const cg_tier *tiers, const int64_t *tokens, size_t n,
                                        int64_t now_ms);
/* Sets or clears the chunk's pinned flag. No-op for an unknown chunk. */
void cg_index_chunk_pin(cg_index *ix, const cg_key *key, int pinned);
/* Deletes the chunk row and all its placements. */
void cg_index_chunk_delete(cg_index *ix, const cg_key *key);

/* Records that the events of Redis Stream stream are applied up to entry id position (both
 * copied). Ordered with the other writes and never dropped: it commits with, or after, the
 * placements the events before it changed. */
void cg_index_stream_pos_set(cg_index *ix, const char *stream, const char *position);
/* The committed position of stream into out (cap bytes): CG_OK, CG_E_NOT_FOUND (none yet),
 * CG_E_VALUE (longer than cap) or CG_E_IO. */
cg_status cg_index_stream_pos_get(cg_index *ix, const char *stream, char *out, size_t cap) CG_WUR;

/* Blocks until every op enqueued before the call is committed (or failed, see stats).
 * Returns CG_E_IO if an op failed while this call waited, CG_OK otherwise. */
cg_status cg_index_flush(cg_index *ix) CG_WUR;

/* ---- Workers (synchronous: they wait for their own commit, and stay ordered with the queue) - */

/* A shared remote tier has a row in the workers table, under the url "remote:" + its id, so
 * that its placements (tier CG_TIER_REMOTE) have a worker id like any other. Writes the url
 * into out (cap bytes; truncated ids still name one row each as long as they differ within
 * cap). */
#define CG_INDEX_TIER_ROW_PREFIX "remote:"
void cg_index_tier_row_url(const char *tier_id, char *out, size_t cap);

typedef struct cg_index_worker {
    int64_t id;
    char *url;   /* owned by the struct: cg_index_worker_clear / cg_index_workers_free */
    char *model; /* owned by the struct */
    int64_t added;
    int64_t last_seen;
    int healthy;
} cg_index_worker;

/* Registers a worker. Idempotent: the same url returns the same id (model and last_seen are
 * updated). url and model are borrowed. */
cg_status cg_index_worker_add(cg_index *ix, const char *url, const char *model, int64_t now_ms,
                              int64_t *id) CG_WUR;
/* Fills *out (caller clears it with cg_index_worker_clear). CG_E_NOT_FOUND if no such url. */
cg_status cg_index_worker_get_by_url(cg_index *ix, const char *url, cg_index_worker *out) CG_WUR;
/* All workers ordered by id into a new array *out of *n entries; caller frees it with
 * cg_index_workers_free. */
cg_status cg_index_workers_list(cg_index *ix, cg_index_worker **out, size_t *n) CG_WUR;
/* Removes the worker and all its placements. CG_E_NOT_FOUND if no such id. */
cg_status cg_index_worker_delete(cg_index *ix, int64_t id) CG_WUR;
/* Sets the health flag; healthy = 1 also sets last_seen = max(last_seen, now).
 * CG_E_NOT_FOUND if no such id. */
cg_status cg_index_worker_set_health(cg_index *ix, int64_t id, int healthy, int64_t now_ms) CG_WUR;
/* Frees the strings of one worker and zeroes it. Accepts NULL. */
void cg_index_worker_clear(cg_index_worker *w);
/* Frees an array from cg_index_workers_list and sets *arr to NULL. Accepts NULL. */
void cg_index_workers_free(cg_index_worker **arr, size_t n);

/* ---- Admin reads ---------------------------------------------------------------------------- */

typedef struct cg_index_chunk {
    cg_key key;
    char *model;    /* owned by the struct: cg_index_chunk_clear / cg_index_chunks_free */
    int mode;       /* cg_mode value, or -1 when unknown (row created by a worker report) */
    int64_t tokens; /* -1: unknown */
    int64_t bytes;  /* -1: unknown */
    int64_t first_seen, last_seen, last_hit; /* ms epoch; last_hit 0 = never */
    int64_t seen_count, hit_count;
    int pinned;
    int n_placements; /* at most CG_INDEX_MAX_PLACEMENTS, ordered by worker_id */
    cg_index_placement placements[CG_INDEX_MAX_PLACEMENTS];
} cg_index_chunk;

/* Fills *out for one key (caller clears it). CG_E_NOT_FOUND if absent. */
cg_status cg_index_chunk_get(cg_index *ix, const cg_key *key, cg_index_chunk *out) CG_WUR;
/* One page of chunks in key order, strictly after *after (NULL: from the first key), at most
 * limit rows (1..10000). *out is a new array of *n rows; caller frees it with
 * cg_index_chunks_free. The next page starts after the last row's key. */
cg_status cg_index_chunks_list(cg_index *ix, const cg_key *after, size_t limit,
                               cg_index_chunk **out, size_t *n) CG_WUR;
/* Frees the model string of one chunk and zeroes it. Accepts NULL. */
void cg_index_chunk_clear(cg_index_chunk *c);
/* Frees an array from cg_index_chunks_list and sets *arr to NULL. Accepts NULL. */
void cg_index_chunks_free(cg_index_chunk **arr, size_t n);

typedef struct cg_index_stats {
    /* Durable totals kept by triggers in the same transactions as the rows (O(1) to read). */
    int64_t chunks;
    int64_t placements;
    int64_t bytes;      /* sum of chunks.bytes (known ones) */
    int64_t file_bytes; /* page_count * page_size of the main file (WAL excluded) */
    int64_t workers;
    /* Writer counters since open. */
    uint64_t batches;     /* write transactions committed */
    uint64_t ops_applied; /* ops committed (an op that matched no row counts as applied) */
    uint64_t ops_failed;  /* ops whose statement or transaction failed (logged) */
    uint64_t ops_dropped; /* hot-path ops refused because the queue was full */
    uint64_t queue_depth; /* ops enqueued and not yet committed */
} cg_index_stats;

/* Fills *out (totals from the latest committed state). */
cg_status cg_index_stats_get(cg_index *ix, cg_index_stats *out) CG_WUR;

/* Verifies the file: PRAGMA integrity_check, PRAGMA foreign_key_check, and the totals row
 * against count(*) / sum(bytes). CG_OK if all hold; otherwise CG_E_IO and a description in
 * msg (borrowed buffer of msg_len bytes, may be NULL). Reads a full snapshot: O(rows). */
cg_status cg_index_check(cg_index *ix, char *msg, size_t msg_len) CG_WUR;

#endif
