/* Disk tier of the worker's KV cache (DESIGN §8): a data file of fixed-size slots (one slot =
 * one pool block, same per-head layout), a durable SQLite inventory (sql/kvstore.h), XXH3-128
 * checksums verified on every read, LRU drop when full. Survives restarts and kill -9; a torn
 * or corrupted record is detected and dropped, never served. Layout and crash-safety argument:
 * docs/worker.md ("Disk tier internals"). */
#ifndef CG_DISK_H
#define CG_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "cache/key.h"
#include "kv/pool.h"
#include "base/status.h"

typedef struct cg_disk cg_disk;

/* Data file layout version, stored in the inventory's geometry row. */
#define CG_DISK_LAYOUT 1

typedef struct cg_disk_params {
    const char *dir;       /* required: data directory, created if missing; borrowed */
    size_t capacity_bytes; /* default 1 GiB (--disk-mb); rounded down to whole slots */
    size_t block_bytes;    /* required: cg_pool_block_bytes() of the pool (checked against the
                              geometry below) */
    uint32_t block_tokens; /* default 16; the pool's block_tokens */
    int n_layers;          /* required, > 0 */
    int n_kv_heads;        /* required, > 0 */
    int head_dim;          /* required, > 0 */
    const char *model_id;  /* required, 1..255 bytes; borrowed for the call */
    int sync;              /* 1: fdatasync the data file before each inventory commit and
                              SQLite synchronous=FULL, so a spill survives power loss;
                              0 (default): a spill survives a process crash (kill -9), and a
                              record torn by power loss is caught by its checksum */
} cg_disk_params;

cg_disk_params cg_disk_default_params(void);

/* Opens (or creates) the tier in params.dir: DIR/kv.blocks (the slots) and DIR/kv.db (the
 * inventory). Loads the inventory and drops (counted in stats.open_dropped) every row whose
 * slots are out of range (e.g. the capacity shrank), overlap another row's, or do not match
 * its token count. Takes an exclusive lock on DIR/kv.blocks: a second process on the same
 * directory gets CG_E_CONFLICT.
 * Returns CG_E_VALUE for bad parameters (block_bytes inconsistent with the geometry, no slot
 * fits the capacity), CG_E_UNSUPPORTED when the directory was written for another model or
 * geometry (logged with both; use another directory or delete it), CG_E_IO on I/O or SQLite
 * errors. *out is owned by the caller: cg_disk_close. */
cg_status cg_disk_open(cg_disk_params params, cg_disk **out) CG_WUR;
/* Closes the files and frees everything; accepts NULL / *d == NULL, sets *d to NULL. No call
 * on d may be running. Everything already put stays durable. */
void cg_disk_close(cg_disk **d);
/* The parameters the tier was opened with (capacity_bytes as rounded; dir and model_id point
 * into d). */
cg_disk_params cg_disk_get_params(const cg_disk *d);
/* Bytes a chunk of n_tokens occupies on disk: ceil(n_tokens / block_tokens) * block_bytes. */
size_t cg_disk_chunk_bytes(const cg_disk *d, uint32_t n_tokens);

/* Source of a chunk's data for cg_disk_put: returns block block_idx (0 .. n_blocks-1) of the
 * chunk, block_bytes bytes in the pool's block layout. The bytes must stay valid and unchanged
 * until cg_disk_put returns (several blocks are gathered into one write). */
typedef const void *(*cg_disk_src_fn)(void *ud, uint32_t block_idx);
/* Destination for cg_disk_get: returns where block block_idx goes (block_bytes writable
 * bytes). The bytes are not verified until cg_disk_get returns CG_OK: on any other status
 * the caller must discard them. */
typedef void *(*cg_disk_dst_fn)(void *ud, uint32_t block_idx);

/* Writes a chunk of n_tokens (> 0) to disk: ceil(n_tokens / block_tokens) blocks taken from
 * src, then commits its inventory row (the row only ever names fully written slots).
 * When free slots are short, the least recently used records are dropped until it fits
 * (each dropped key is appended to *dropped when dropped is not NULL; counted in
 * stats.drops); records being read are skipped, and nothing is dropped when it cannot fit.
 * Safe to call from the pool's eviction callback (it never calls the pool; the src callback
 * may use the pool's lock-free data accessors).
 * Returns CG_OK when stored, or when the key is already on disk (same key = same bytes;
 * it becomes most recently used, nothing is written); CG_E_FULL when the chunk is larger
 * than the whole tier or the space is held by records being read; CG_E_CONFLICT when
 * another thread is writing the same key, or the key is on disk with another token count;
 * CG_E_IO on a write or SQLite error (nothing is
 * stored); CG_E_VALUE for n_tokens == 0. */
cg_status cg_disk_put(cg_disk *d, const cg_key *key, uint32_t n_tokens, cg_disk_src_fn src,
                      void *src_ud, uint64_t now, cg_pool_evictions *dropped) CG_WUR;

/* Reads a chunk back: every block to dst, then verifies the checksum over the bytes read,
 * the key and n_tokens. n_tokens is the count the caller sized dst for (from cg_disk_peek).
 * Returns CG_OK (a restore; the record becomes most recently used and stays on disk),
 * CG_E_NOT_FOUND, CG_E_CONFLICT when the record has another token count, CG_E_IO when the
 * checksum does not match or the read fails: the record is dropped, stats.checksum_failures
 * (or io_errors) counts it, and the caller treats it as a miss and discards dst's bytes. */
cg_status cg_disk_get(cg_disk *d, const cg_key *key, uint32_t n_tokens, cg_disk_dst_fn dst,
                      void *dst_ud, uint64_t now) CG_WUR;
/* cg_disk_get into one buffer of len >= cg_disk_chunk_bytes(d, n_tokens) bytes (blocks back
 * to back; CG_E_VALUE when len is short). */
cg_status cg_disk_get_buf(cg_disk *d, const cg_key *key, uint32_t n_tokens, void *buf, size_t len,
                          uint64_t now) CG_WUR;

/* cg_disk_src_fn over a pool chunk: ud is a cg_disk_pool_src whose chunk is referenced (or
 * is being evicted, inside the pool's eviction callback). */
typedef struct cg_disk_pool_src {
    const cg_pool *pool;
    const cg_pool_chunk *chunk;
} cg_disk_pool_src;
const void *cg_disk_pool_block(void *ud, uint32_t block_idx);

typedef struct cg_disk_chunk_info {
    cg_key key;
    uint32_t tokens;
    size_t bytes;       /* slots * block_bytes */
    uint64_t last_used; /* the now of the last put or restore */
} cg_disk_chunk_info;

/* 1 when a readable record of key is on disk (a record being written is not). */
int cg_disk_contains(cg_disk *d, const cg_key *key);
/* Info on one record without touching its LRU position. CG_OK or CG_E_NOT_FOUND. */
cg_status cg_disk_peek(cg_disk *d, const cg_key *key, cg_disk_chunk_info *out) CG_WUR;
/* Makes a readable record the most recently used (as a restore does), so that spills made
 * before reading it drop other records first. CG_OK or CG_E_NOT_FOUND. */
cg_status cg_disk_touch(cg_disk *d, const cg_key *key, uint64_t now) CG_WUR;
/* Deletes the record's row, then frees its slots (after in-flight reads of it finish).
 * A record still being written is discarded when its write ends. CG_OK, CG_E_NOT_FOUND, or
 * CG_E_IO when the row cannot be deleted (the record then stays). */
cg_status cg_disk_remove(cg_disk *d, const cg_key *key) CG_WUR;
/* Calls fn once per readable record, least recently used first, with the tier's lock held
 * (fn must not call d). info is borrowed for the call. */
void cg_disk_foreach(cg_disk *d, void (*fn)(void *ud, const cg_disk_chunk_info *info), void *ud);

typedef struct cg_disk_stats {
    size_t capacity_bytes; /* slots_total * block_bytes */
    size_t block_bytes;
    size_t slots_total, slots_free;
    size_t used_bytes;  /* (slots_total - slots_free) * block_bytes: readable records, writes
                           in flight, removed records still being read */
    size_t chunks;      /* readable records */
    size_t chunk_bytes; /* their slots * block_bytes */
    uint64_t spills;    /* records written */
    uint64_t restores;  /* successful cg_disk_get */
    uint64_t drops;     /* records dropped to make room (LRU) */
    uint64_t removes;   /* records removed by cg_disk_remove */
    uint64_t checksum_failures;         /* reads whose checksum did not match (record dropped) */
    uint64_t io_errors;                 /* failed reads/writes/commits */
    uint64_t full;                      /* puts refused with CG_E_FULL */
    uint64_t bytes_written, bytes_read; /* slot bytes of successful spills / restores */
    uint64_t open_dropped; /* inventory rows dropped at open (out of range, overlap, invalid) */
} cg_disk_stats;
cg_disk_stats cg_disk_get_stats(cg_disk *d);

/* Checks every internal invariant (slot bitmap against the records, free count, LRU list,
 * index) and the inventory's integrity; CG_OK or CG_E_INTERNAL (logged). For tests. */
cg_status cg_disk_check(cg_disk *d) CG_WUR;

#endif
