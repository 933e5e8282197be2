/* The worker's chunk events (DESIGN §18): every change of where a chunk is (stored, spilled,
 * promoted, evicted, deleted, per tier, and the remote tier's writes) is appended to a Redis
 * Stream (XADD ... MAXLEN ~ N) in the format of base/chunkevent.h, so every gateway keeps the
 * same view of the worker's chunks. Publishing never blocks a request: cg_events_emit puts the
 * event in a bounded queue that one publisher thread drains. An event Redis does not take
 * (down, slow) stays queued and is sent again, so a short outage loses nothing; a full queue
 * drops the new event (counted) and flags the next one queued for resync. */
#ifndef CG_EVENTS_H
#define CG_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "base/chunkevent.h"
#include "base/status.h"
#include "cache/key.h"

typedef struct cg_events cg_events;

/* Stream the events go to unless configured otherwise. */
#define CG_EVENTS_DEFAULT_STREAM "chunkgate:events"

typedef struct cg_events_params {
    const char *url;      /* required: redis://HOST:PORT[/DB] or redis+cluster://HOST:PORT;
                             borrowed for cg_events_open */
    const char *password; /* NULL: no AUTH; borrowed for cg_events_open */
    const char *stream;   /* default CG_EVENTS_DEFAULT_STREAM; borrowed for cg_events_open */
    size_t maxlen;        /* default 100000: entries the stream keeps, about (MAXLEN ~) */
    size_t queue_max;     /* default 4096: events waiting for the publisher */
    const char *epoch;    /* required: this run's id (the instance id of /v1/info), at most
                             CG_CHUNKEVENT_NAME_MAX bytes; borrowed for cg_events_open */
    int timeout_ms;       /* default 500: the most one XADD may take */
} cg_events_params;

/* The defaults above. */
cg_events_params cg_events_default_params(void);

/* Opens the Redis client (a Redis that is down is retried later; a bad URL or a refused
 * password is CG_E_VALUE / CG_E_AUTH with err) and the queue; nothing is published before
 * cg_events_start. *out is owned by the caller: cg_events_close. */
cg_status cg_events_open(cg_events_params p, cg_events **out, char *err, size_t errlen) CG_WUR;

/* The worker's load as events report it: sequences decoding and admitted requests not decoding.
 * Called by the publisher thread for each event. */
typedef void (*cg_events_load_fn)(void *ud, uint32_t *running, uint32_t *queued);

/* Names the worker (at most CG_CHUNKEVENT_NAME_MAX bytes, copied) and starts the publisher
 * thread. load (may be NULL) and ud must stay valid until cg_events_unload or the close. Call
 * once. */
cg_status cg_events_start(cg_events *e, const char *worker, cg_events_load_fn load,
                          void *ud) CG_WUR;

/* Stops calling the load function (waits for a call in progress): before what it reads is
 * freed. Later events report a load of 0. Accepts NULL. */
void cg_events_unload(cg_events *e);

/* Publishes what is queued for at most 1 s (the rest is given up), stops the publisher,
 * closes the client and frees e. Accepts NULL / *e == NULL; sets *e to NULL. */
void cg_events_close(cg_events **e);

/* Queues one event about the chunk's place in tier (never waits on the network; e NULL:
 * nothing). A full queue drops it, counted, and flags the next one for resync. Safe from any
 * thread, also under the pool's lock. */
void cg_events_emit(cg_events *e, cg_chunkevent_op op, const cg_key *key, cg_tier tier,
                    uint32_t tokens);

/* Waits until every event queued before the call was published, at most timeout_ms:
 * CG_OK or CG_E_TIMEOUT. */
cg_status cg_events_flush(cg_events *e, int timeout_ms) CG_WUR;

typedef struct cg_events_stats {
    uint64_t queued;    /* events queued */
    uint64_t published; /* ... appended to the stream */
    uint64_t dropped;   /* not queued: the queue was full */
    uint64_t failed;    /* XADD attempts Redis did not take (down, slow, refused): retried */
    uint64_t depth;     /* gauge: waiting in the queue */
    uint64_t seq;       /* gauge: the last sequence number given */
} cg_events_stats;

/* Snapshot of the counters (zero for e NULL). */
cg_events_stats cg_events_get_stats(cg_events *e);

#endif
