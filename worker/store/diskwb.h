/* Write-behind to the disk tier (DESIGN §16): a computed chunk's blocks are copied into a
 * bounded queue and written to the disk tier (worker/store/disk.h) by one background thread,
 * so that a crash (kill -9) loses at most the chunks still queued, and a request never waits
 * for the disk. A full queue drops the write (counted); the chunk stays in RAM and still
 * reaches the disk when it is evicted (spill) or flushed at shutdown. Each write is an
 * ordinary cg_disk_put, so the disk tier's crash-safety rules hold unchanged. */
#ifndef CG_DISKWB_H
#define CG_DISKWB_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cache/key.h"
#include "kv/pool.h"
#include "worker/store/disk.h"

typedef struct cg_diskwb cg_diskwb;

typedef struct cg_diskwb_params {
    size_t max_items;   /* default 64: chunks queued or being written, >= 1 */
    size_t max_bytes;   /* default 64 MiB: their bytes (whole blocks); a chunk larger than this
                           is never queued */
    size_t max_dropped; /* default 4096: keys of disk records the writer dropped (LRU) kept
                           for cg_diskwb_take_dropped; older ones are forgotten */
    /* default NULL: called by the writer thread, no lock held, after each write it attempted:
     * the chunk, whether the disk holds it now (ok), and the records dropped to make room
     * (borrowed for the call; also kept for cg_diskwb_take_dropped). */
    void (*on_written)(void *ud, const cg_key *key, uint32_t n_tokens, int ok,
                       const cg_pool_evictions *dropped);
    void *on_written_ud;
} cg_diskwb_params;

cg_diskwb_params cg_diskwb_default_params(void);

/* Starts the writer over disk d (borrowed: it must outlive the write-behind). CG_E_VALUE for
 * max_items or max_bytes 0. *out is owned by the caller: cg_diskwb_close. */
cg_status cg_diskwb_open(cg_disk *d, cg_diskwb_params p, cg_diskwb **out) CG_WUR;

/* Writes every chunk still queued, stops the writer and frees w. Accepts NULL / *w == NULL,
 * sets *w to NULL. No other call on w may be running. */
void cg_diskwb_close(cg_diskwb **w);

/* Queues a write of key's n_tokens (> 0): its ceil(n_tokens / block_tokens) blocks are copied
 * from src (cg_disk_src_fn; the bytes need to stay valid only during the call). now: the
 * caller's monotonic milliseconds (for the queue's age). Never blocks on the disk. CG_OK when
 * queued; CG_E_FULL when the queue holds max_items chunks or the bytes would pass max_bytes
 * (dropped, counted in stats.drops); CG_E_VALUE for n_tokens 0. */
cg_status cg_diskwb_put(cg_diskwb *w, const cg_key *key, uint32_t n_tokens, cg_disk_src_fn src,
                        void *src_ud, uint64_t now) CG_WUR;

/* Forgets the queued writes of key and waits for a write of key in progress to finish, so that
 * a cg_disk_remove after it cannot be undone by the writer. Returns how many queued writes
 * were removed. */
size_t cg_diskwb_cancel(cg_diskwb *w, const cg_key *key);

/* Waits until every write queued before the call has been attempted, at most timeout_ms:
 * CG_OK or CG_E_TIMEOUT. */
cg_status cg_diskwb_flush(cg_diskwb *w, int timeout_ms) CG_WUR;

/* Appends to out the keys of disk records that the writer's puts dropped to make room (LRU)
 * since the last call, and forgets them. out as cg_pool_evictions (zero-initialised, freed by
 * the caller with cg_pool_evictions_free). */
void cg_diskwb_take_dropped(cg_diskwb *w, cg_pool_evictions *out);

typedef struct cg_diskwb_stats {
    uint64_t puts;          /* writes queued */
    uint64_t drops;         /* writes refused because the queue was full */
    uint64_t written;       /* writes that reached the disk (or found the chunk there) */
    uint64_t failed;        /* writes the disk refused (full of records being read, I/O) */
    uint64_t cancelled;     /* writes removed by cg_diskwb_cancel */
    uint64_t depth;         /* gauge: chunks queued or being written */
    uint64_t bytes;         /* gauge: their bytes */
    uint64_t oldest_age_ms; /* gauge: age of the oldest chunk not yet written, at now */
} cg_diskwb_stats;

/* Snapshot at monotonic time now (milliseconds, the clock of cg_diskwb_put). */
cg_diskwb_stats cg_diskwb_get_stats(cg_diskwb *w, uint64_t now);

#endif
