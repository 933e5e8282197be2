/* A chunk event (DESIGN §18): one change of where a worker's chunk is, as the worker appends it
 * to a Redis Stream and every gateway reads it back. The one definition of its fields, so the
 * worker's publisher and the gateway's reader cannot disagree. An event is a stream entry of
 * field/value pairs, all text:
 *   w    worker name (--events-id; stable across restarts)
 *   e    epoch: the worker's instance id, new at every start (GET /v1/info "instance_id")
 *   s    sequence number, 1, 2, ... per epoch; a jump means events were lost
 *   op   what happened (the table below)
 *   k    chunk key, 32 hex digits
 *   t    tier the change concerns: ram, disk or remote
 *   n    the chunk's tokens
 *   run  sequences the worker is decoding now
 *   q    requests admitted and not decoding now (prefilling, or waiting for a place)
 *   ts   wall-clock milliseconds when the worker made the change
 *   r    present ("1") on the first event after events were lost: resync this worker */
#ifndef CG_CHUNKEVENT_H
#define CG_CHUNKEVENT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/tier.h"

/* Operations: enum name, wire name, meaning. */
#define CG_CHUNKEVENT_OPS(X)                                                                       \
    X(STORED, "stored", "the chunk is now held in the tier")                                       \
    X(SPILLED, "spilled", "it left RAM for the disk tier")                                         \
    X(PROMOTED, "promoted", "it was read back into RAM from the disk or the remote tier")          \
    X(EVICTED, "evicted", "it left the tier to make room")                                         \
    X(DELETED, "deleted", "it was deleted from every tier of the worker")                          \
    X(FAILED, "failed", "a write to the tier failed: the tier does not hold it")

typedef enum {
#define CG_CHUNKEVENT_ENUM(e, name, help) CG_CHUNKEVENT_##e,
    CG_CHUNKEVENT_OPS(CG_CHUNKEVENT_ENUM)
#undef CG_CHUNKEVENT_ENUM
        CG_CHUNKEVENT_N_OPS
} cg_chunkevent_op;

/* Wire name of op; static storage ("?" when out of range). */
const char *cg_chunkevent_op_name(cg_chunkevent_op op);

/* Longest worker name and epoch (bytes, without the NUL). */
#define CG_CHUNKEVENT_NAME_MAX 127
/* Field/value pairs of an encoded event, at most. */
#define CG_CHUNKEVENT_MAX_FIELDS 11

typedef struct cg_chunkevent {
    char worker[CG_CHUNKEVENT_NAME_MAX + 1];
    char epoch[CG_CHUNKEVENT_NAME_MAX + 1];
    uint64_t seq;
    cg_chunkevent_op op;
    char key[33]; /* 32 lowercase hex digits */
    cg_tier tier;
    uint32_t tokens;
    uint32_t running, queued;
    uint64_t ts_ms;
    int resync;
} cg_chunkevent;

/* The text of an encoded event's values (owned by the caller, reused between events). */
typedef struct cg_chunkevent_wire {
    const char *argv[2 * CG_CHUNKEVENT_MAX_FIELDS];
    size_t lens[2 * CG_CHUNKEVENT_MAX_FIELDS];
    int argc;
    char num[6][24];
} cg_chunkevent_wire;

/* Encodes ev as field/value pairs into w (argv points into ev and w: both must outlive its
 * use). */
void cg_chunkevent_encode(const cg_chunkevent *ev, cg_chunkevent_wire *w);

/* Decodes an entry's n field/value strings (fields[2i], fields[2i+1], lens borrowed) into
 * *out. Unknown fields are ignored (newer workers may add some). CG_E_VALUE when a field this
 * version needs is missing or malformed. */
cg_status cg_chunkevent_decode(size_t n, const char *const *fields, const size_t *lens,
                               cg_chunkevent *out) CG_WUR;

#endif
