/* Durable inventory of the worker's disk tier (DESIGN §8): one SQLite (WAL) row per chunk
 * record in the data file, plus the geometry the data directory was written for. The data
 * itself lives in worker/store/disk.c; this module only holds the SQL. */
#ifndef CG_KVSTORE_H
#define CG_KVSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "base/status.h"

typedef struct cg_kvstore cg_kvstore;

/* Highest schema version (PRAGMA user_version) this build knows. */
#define CG_KVSTORE_SCHEMA_VERSION 1
/* Longest model id stored in the geometry row. */
#define CG_KVSTORE_MODEL_MAX 255
#define CG_KVSTORE_SUM_BYTES 16

/* What a data directory was written for: records are only meaningful to a worker with the
 * same model and block geometry. */
typedef struct cg_kvstore_geometry {
    char model[CG_KVSTORE_MODEL_MAX + 1];
    uint32_t layout;       /* data file layout version (disk.c's CG_DISK_LAYOUT) */
    uint64_t block_bytes;  /* bytes of one slot = one pool block */
    uint32_t block_tokens; /* tokens per block */
    uint32_t n_layers, n_kv_heads, head_dim;
} cg_kvstore_geometry;

/* One chunk record. */
typedef struct cg_kvstore_row {
    cg_key key;
    uint32_t n_tokens;
    const uint32_t *slots; /* n_slots slot indexes in block order; borrowed */
    uint32_t n_slots;
    uint8_t checksum[CG_KVSTORE_SUM_BYTES]; /* XXH3-128 canonical bytes */
    uint64_t last_used;
    const char *model; /* borrowed */
} cg_kvstore_row;

/* Opens or creates the inventory at path (a file path), in WAL mode, and applies pending
 * migrations. sync_full = 1 sets synchronous=FULL (a commit survives power loss), 0 sets
 * NORMAL (a commit survives a process crash). Returns CG_E_UNSUPPORTED for a foreign SQLite
 * file or a newer schema, CG_E_IO on SQLite errors (logged), CG_E_VALUE for a bad path.
 * path is borrowed. *out is owned by the caller: cg_kvstore_close.
 * A cg_kvstore is NOT thread-safe: one caller at a time (the disk tier holds its lock). */
cg_status cg_kvstore_open(const char *path, int sync_full, cg_kvstore **out) CG_WUR;
/* Closes the connection (checkpointing the WAL). Accepts NULL / *kv == NULL; sets it NULL. */
void cg_kvstore_close(cg_kvstore **kv);

/* Reads the geometry row into *out; *found = 0 (and *out zeroed) when none is stored yet. */
cg_status cg_kvstore_geometry_get(cg_kvstore *kv, cg_kvstore_geometry *out, int *found) CG_WUR;
/* Stores the geometry row (created = created_ms). CG_E_CONFLICT if one is stored already. */
cg_status cg_kvstore_geometry_set(cg_kvstore *kv, const cg_kvstore_geometry *g,
                                  uint64_t created_ms) CG_WUR;

/* Inserts one row in its own transaction (committed when this returns). row is borrowed.
 * CG_E_CONFLICT if the key has a row, CG_E_VALUE for n_slots == 0 or n_tokens == 0. */
cg_status cg_kvstore_put(cg_kvstore *kv, const cg_kvstore_row *row) CG_WUR;
/* Deletes the rows of keys[0..n) in one transaction (absent keys are ignored). */
cg_status cg_kvstore_delete(cg_kvstore *kv, const cg_key *keys, size_t n) CG_WUR;
/* Raises last_used of the row of keys[i] to last_used[i] (never lowers it: a late batch
 * cannot age a re-inserted row), all in one transaction; absent keys are ignored. */
cg_status cg_kvstore_touch(cg_kvstore *kv, const cg_key *keys, const uint64_t *last_used,
                           size_t n) CG_WUR;

/* Calls fn for every row, oldest last_used first (ties by key), inside one read transaction.
 * row and its arrays are borrowed for the call. A row whose slot list is not a whole number
 * of u32 reaches fn with n_slots = 0 and slots = NULL, so the caller can drop it.
 * fn returns 0 to go on, non-zero to stop (then this returns CG_OK). fn must not call kv. */
cg_status cg_kvstore_load(cg_kvstore *kv, int (*fn)(void *ud, const cg_kvstore_row *row),
                          void *ud) CG_WUR;

/* PRAGMA integrity_check: CG_OK when it reports "ok", else CG_E_IO (the reason is logged). */
cg_status cg_kvstore_check(cg_kvstore *kv) CG_WUR;

#endif
