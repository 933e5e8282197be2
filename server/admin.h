/* The admin route handlers (behind --admin-token): the chunk index and the worker registry. */
#ifndef CG_GW_ADMIN_H
#define CG_GW_ADMIN_H

#include "base/http.h"

/* GET /v1/chunks, GET|DELETE /v1/chunks/{key}, POST /v1/chunks/lookup,
 * POST /v1/chunks/{key}/pin and /unpin. */
cg_http_handler_fn cg_gw_chunks_list, cg_gw_chunk_get, cg_gw_chunk_delete, cg_gw_chunks_lookup,
    cg_gw_chunk_pin, cg_gw_chunk_unpin;
/* GET|POST|DELETE /v1/workers, GET|DELETE /v1/workers/{id}, POST /v1/workers/{id}/sync. */
cg_http_handler_fn cg_gw_workers_list, cg_gw_workers_add, cg_gw_workers_delete, cg_gw_worker_get,
    cg_gw_worker_delete, cg_gw_worker_sync;

#endif
