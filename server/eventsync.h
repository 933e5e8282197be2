/* The gateway's reader of the workers' chunk events (DESIGN §18): one thread reads the Redis
 * Stream (XREAD BLOCK from its last position) into the index, so every gateway replica keeps
 * the same view of where chunks are. The position is committed in the index with the
 * placements it covers, so a restarted gateway resumes there. A gap (a worker's sequence jumps,
 * a new epoch, a resync flag, the stream trimmed past the position, Redis lost) resyncs the
 * worker's inventory through the registry (or every worker's), never replays the stream. */
#ifndef CG_EVENTSYNC_H
#define CG_EVENTSYNC_H

#include <stdint.h>

#include "base/metrics.h"
#include "base/status.h"
#include "server/workers.h"
#include "sql/index.h"

typedef struct cg_eventsync cg_eventsync;

typedef struct cg_eventsync_params {
    const char *url;      /* required: redis://HOST:PORT[/DB] or redis+cluster://HOST:PORT;
                             borrowed for cg_eventsync_open */
    const char *password; /* NULL: no AUTH; borrowed for cg_eventsync_open */
    const char *stream;   /* default "chunkgate:events"; borrowed for cg_eventsync_open */
    cg_index *index;      /* borrowed; outlives the reader */
    cg_workers *workers;  /* borrowed; outlives the reader */
    cg_metrics *metrics;  /* borrowed */
    int block_ms;         /* default 500: XREAD BLOCK; also how long a stop may wait */
    int count;            /* default 512: entries per read */
} cg_eventsync_params;

cg_eventsync_params cg_eventsync_default_params(void);

/* Opens the Redis client and finds where to start: the position stored in the index, or (a
 * new gateway, which learns the rest from the workers' inventories) the stream's tail. Call it
 * before the workers are registered, so no event after their inventories is missed. A Redis
 * that is down is not an error: the reader starts from the tail once it answers and resyncs
 * every worker. CG_E_VALUE / CG_E_AUTH with err for a bad URL or password. *out is owned by the
 * caller: cg_eventsync_close. */
cg_status cg_eventsync_open(const cg_eventsync_params *p, cg_eventsync **out, char *err,
                            size_t errlen) CG_WUR;
/* Starts the reader thread. */
cg_status cg_eventsync_start(cg_eventsync *s) CG_WUR;
/* Stops the thread (within about block_ms) and frees s. NULL-safe; sets *s to NULL. */
void cg_eventsync_close(cg_eventsync **s);

#endif
