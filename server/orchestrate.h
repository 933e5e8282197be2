/* The request dispatcher and the main path (DESIGN §2): route, assemble on a worker, record,
 * complete with the assembly; or fall back to the plain prompt. */
#ifndef CG_GW_ORCHESTRATE_H
#define CG_GW_ORCHESTRATE_H

#include <jansson.h>
#include "base/http.h"
#include "server/gwstate.h"
#include "server/segments.h"
#include "sql/index.h"

/* Main path (orchestrate.c): assemble on a worker, then complete with the assembly. Takes
 * over body (the request JSON reference), segs (moved: the caller's copy is re-initialised)
 * and ent (the lookup, n = segs->n_keys; may be NULL), and ends the request. */
void cg_gw_orchestrate(cg_gateway *g, cg_http_req *req, json_t *body, cg_gw_segments *segs,
                       cg_index_entry *ent, int chat, int stream);

/* chunk_cache of a request forwarded with the plain prompt: its segments (ent: their lookup,
 * may be NULL), no worker; reason: why it fell back (CG_FALLBACK_NONE for a pass-through).
 * New reference. */
json_t *cg_gw_chunk_cache_plain(const cg_gw_segments *s, const cg_index_entry *ent,
                                cg_fallback reason);

#endif
