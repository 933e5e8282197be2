/* Why a request with cacheable segments was served without KV reuse, generated from one
 * table: chunk_cache.fallback_reason on the wire and the reason label of
 * chunkgate_fallback_reasons_total. */
#ifndef CG_FALLBACK_H
#define CG_FALLBACK_H

#include "base/metrics.h"

/* X(enum, name, help): help is the reason's part of the metric's help line. */
#define CG_FALLBACK_TABLE(X)                                                                       \
    X(CG_FALLBACK_NO_WORKER, "no_worker", "none registered or healthy")                            \
    X(CG_FALLBACK_WORKER_ERROR, "worker_error", "assemble failed")                                 \
    X(CG_FALLBACK_MODEL, "model", "the request names another model than the workers serve")

typedef enum {
    CG_FALLBACK_NONE, /* no fallback: reuse as planned, or a pass-through */
#define CG_FALLBACK_ENUM(e, name, help) e,
    CG_FALLBACK_TABLE(CG_FALLBACK_ENUM)
#undef CG_FALLBACK_ENUM
        CG_FALLBACK_COUNT
} cg_fallback;

/* The reason's wire name ("no_worker", ...); NULL for CG_FALLBACK_NONE or an unknown value
 * (chunk_cache.fallback_reason is then null). Static storage. */
const char *cg_fallback_name(cg_fallback f);

/* Registers one series of chunkgate_fallback_reasons_total per reason in m (borrowed) and
 * stores it in out[reason]; out[CG_FALLBACK_NONE] is set to NULL. */
void cg_fallback_metrics(cg_metrics *m, cg_metric *out[CG_FALLBACK_COUNT]);

#endif
