/* The worker's chunk KV tiers as the engine sees them: the RAM pool (kv/pool.h), below it the
 * disk tier (worker/store/disk.h) and the shared remote tier on Redis (base/remote.h).
 * Finds a chunk in RAM, then on disk, then in Redis (read back and verified; a remote hit is
 * placed in RAM), stores computed chunks (in RAM, and in the background to Redis and to disk:
 * DESIGN §16), spills RAM evictions to disk, and places a chunk's rows into a request's KV at
 * any offset (K re-rotated by R(p - v), V copied: DESIGN §6, §8). */
#ifndef CG_TIERS_H
#define CG_TIERS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tier.h"
#include "cache/key.h"
#include "kv/pool.h"
#include "worker/model/model.h"
#include "worker/store/disk.h"
#include "worker/store/diskwb.h"
#include "base/remote.h"
#include "worker/store/events.h"

typedef struct cg_tiers cg_tiers;

typedef struct cg_tiers_params {
    size_t pool_bytes;     /* RAM pool capacity */
    uint32_t block_tokens; /* pool block size in tokens */
    size_t disk_bytes;     /* 0 = no disk tier */
    const char *disk_dir;  /* required with disk_bytes; borrowed for cg_tiers_open */
    int disk_sync;         /* cg_disk_params.sync */
    /* Disk write-behind (worker/store/diskwb.h): every stored chunk is queued for the disk
     * tier at once, not only when RAM evicts it. 0 items = off. Needs a disk tier. */
    size_t disk_wb_items;
    size_t disk_wb_bytes;
    /* The shared remote tier (borrowed; it must outlive the tiers), or NULL. */
    cg_remote *remote;
    /* Chunk events (worker/store/events.h; borrowed, it must outlive the tiers), or NULL: every
     * change of where a chunk is goes there. */
    cg_events *events;
} cg_tiers_params;

/* Opens the pool and, with disk_bytes > 0, the disk tier over model m (borrowed; it must
 * outlive the tiers). CG_E_VALUE when the pool or the disk cannot hold one block, or
 * cg_disk_open's statuses. Caller closes with cg_tiers_close. */
cg_status cg_tiers_open(const cg_model *m, const cg_tiers_params *p, cg_tiers **out) CG_WUR;
/* The disk tier's directory under disk_dir: "kv-{kv_model}-{8 hex of the model id's XXH3}"
 * (characters other than letters, digits, '.', '-' and '_' as '_'), so each checkpoint keeps its
 * own KV and a worker switched to another model, or to other weights under the same id, starts an
 * empty tier beside the old one instead of refusing to start. 0, or -1 when it does not fit cap. */
int cg_tiers_disk_dir(const cg_model_config *c, const char *disk_dir, char *out, size_t cap);
void cg_tiers_close(cg_tiers **t);

cg_pool *cg_tiers_pool(cg_tiers *t);
cg_disk *cg_tiers_disk(cg_tiers *t); /* NULL without a disk tier */

/* Upper bounds (seconds) of the remote read latency histogram; one more bucket is +Inf. */
#define CG_TIERS_REMOTE_BOUNDS 14
extern const double cg_tiers_remote_read_bounds[CG_TIERS_REMOTE_BOUNDS];

typedef struct cg_tiers_stats {
    uint64_t restores, restore_failures; /* disk records read back and verified / failed */
    uint64_t spills, spill_failures;     /* RAM evictions written to disk / dropped */
    /* Remote tier. A lookup that reaches Redis ends as exactly one of hits, misses, invalid,
     * errors; skipped lookups were not sent. */
    uint64_t remote_hits;       /* chunks read back from Redis and verified */
    uint64_t remote_misses;     /* a head's value was missing */
    uint64_t remote_invalid;    /* a value was corrupt, truncated, under another key, or of
                                   another model or geometry: never used */
    uint64_t remote_errors;     /* the read failed (down, slow, protocol): a miss */
    uint64_t remote_skipped;    /* not sent: the request's remote read had failed already */
    uint64_t remote_bytes_read; /* value bytes of remote hits */
    uint64_t remote_puts;       /* chunks queued for Redis (write-behind) */
    uint64_t remote_put_drops;  /* chunks not queued: the write-behind queue was full */
    /* Remote read latency (every read sent, whatever its outcome): per bucket of
     * cg_tiers_remote_read_bounds (not cumulative) and the sum in seconds. */
    uint64_t remote_read_buckets[CG_TIERS_REMOTE_BOUNDS + 1];
    double remote_read_seconds;
    cg_diskwb_stats wb; /* the disk write-behind's (zero without one) */
} cg_tiers_stats;
cg_tiers_stats cg_tiers_get_stats(cg_tiers *t);

/* A cached chunk's KV as found: a referenced pool chunk, or (when RAM had no room for a chunk
 * read from disk) its blocks in a private buffer, in the pool's block layout. */
typedef struct cg_cached {
    cg_pool_chunk *c;
    float *buf; /* owned; n_blocks * block bytes */
    uint32_t n_tokens, n_blocks;
    cg_tier tier; /* the tier it was found in */
} cg_cached;

/* One request's lookups (zero-initialise): once a remote read fails (down, slow), the rest of
 * the request does not ask Redis again, so a slow Redis costs a request at most one timeout. */
typedef struct cg_tiers_req {
    int remote_failed;
} cg_tiers_req;

/* The disk records dropped by spills that this thread's inserts cause go into *dropped until
 * cg_tiers_collect(t, NULL) (spills run in the pool's eviction callback, on the inserting
 * thread). */
void cg_tiers_collect(cg_tiers *t, cg_pool_evictions *dropped);

/* Finds key: the RAM pool, then the disk tier, then the remote tier. want: the token count the
 * segment needs (0 = any). CG_OK fills *out (give it back with cg_tiers_drop, or keep out->c);
 * otherwise a miss (CG_E_CONFLICT: a chunk of another length holds the key). A value read from
 * Redis is used only when all of its heads are there and each one's seal, model id, geometry
 * and head index check out; anything else is a miss, counted. RAM evictions made to read a
 * chunk back go into ev. rq: the request's lookup state (may be NULL). */
cg_status cg_tiers_lookup(cg_tiers *t, const cg_key *key, uint32_t want, uint64_t now,
                          cg_pool_evictions *ev, cg_tiers_req *rq, cg_cached *out) CG_WUR;
void cg_tiers_drop(cg_tiers *t, cg_cached *c, uint64_t now);

/* Stores rows [v, v+n) of src as a new published chunk; returns it referenced. It is queued for
 * the remote tier and the disk write-behind too (never waiting for either; a full queue drops
 * that copy and counts it). CG_E_FULL: RAM could not keep it; with a disk write-behind the
 * rows are queued for the disk tier all the same (the caller uses its rows unstored).
 * CG_E_CONFLICT: nothing stored. */
cg_status cg_tiers_store(cg_tiers *t, const cg_key *key, cg_kv *src, uint32_t v, uint32_t n,
                         uint64_t now, cg_pool_evictions *ev, cg_pool_chunk **out) CG_WUR;

/* The remote client's on_written hook (cg_remote_params) when events are on: events is the
 * cg_events; a chunk's write-behind becomes a stored (or failed) event of the remote tier. */
void cg_tiers_remote_written(void *events, size_t n, const char *const *keys, uint64_t tokens,
                             cg_status st);

/* Places a cached chunk at slot p of dst, its K rotated by delta. */
void cg_tiers_place(cg_tiers *t, cg_kv *dst, uint32_t p, const cg_cached *c, int64_t delta);
/* The same for a referenced pool chunk. */
void cg_tiers_place_chunk(cg_tiers *t, cg_kv *dst, uint32_t p, cg_pool_chunk *c, int64_t delta);
/* Places rows [v, v+n) of src (a miss the pool could not store) at slot p of dst. */
void cg_tiers_place_rows(cg_tiers *t, cg_kv *dst, uint32_t p, cg_kv *src, uint32_t v, uint32_t n,
                         int64_t delta);

/* Appends to out the keys of disk records the disk write-behind dropped to make room (LRU)
 * since the last call; nothing without a write-behind. */
void cg_tiers_take_dropped(cg_tiers *t, cg_pool_evictions *out);

/* Sorts keys that left RAM (or the disk) into what the gateway must learn: still in RAM:
 * nothing; on disk: spilled; neither: evicted. evicted and spilled have room for n each. */
void cg_tiers_classify(cg_tiers *t, const cg_key *keys, size_t n, cg_key *evicted,
                       size_t *n_evicted, cg_key *spilled, size_t *n_spilled);

/* Per-head KV of a chunk (DESIGN §7): for each KV head in [h0, h1], each layer, K then V,
 * [tokens][head_dim] f32. A chunk on disk is read back first; evictions made for it are
 * counted in *evictions. *out is malloc'd (caller frees). CG_E_NOT_FOUND or CG_E_VALUE. */
cg_status cg_tiers_export(cg_tiers *t, const cg_key *key, int h0, int h1, uint64_t now, void **out,
                          size_t *len, uint32_t *tokens, size_t *evictions) CG_WUR;

/* Removes key from every tier: RAM, disk (and its write-behind queue), and the remote tier
 * (after the writes queued for it; a failure there is logged, the local removal stands).
 * CG_E_CONFLICT (nothing removed) when it is referenced; CG_E_NOT_FOUND when no tier holds
 * it; CG_E_IO. */
cg_status cg_tiers_delete(cg_tiers *t, const cg_key *key) CG_WUR;

/* Writes every RAM chunk to the disk tier, least recently used first; returns how many.
 * 0 without a disk tier. */
size_t cg_tiers_flush(cg_tiers *t, uint64_t now);

/* Waits up to timeout_ms for the write-behind queues (disk, then remote) to be attempted:
 * CG_OK or CG_E_TIMEOUT. For tests, benches and shutdown. */
cg_status cg_tiers_wait_writes(cg_tiers *t, int timeout_ms) CG_WUR;

#endif
