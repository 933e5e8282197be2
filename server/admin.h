/* The admin route handlers (behind --admin-token): the chunk index and the worker registry. */
#ifndef CG_GW_ADMIN_H
#define CG_GW_ADMIN_H

#include "base/http.h"

void cg_gw_chunks_list(cg_http_req *req, void *app);
void cg_gw_chunk_get(cg_http_req *req, void *app);
void cg_gw_chunk_delete(cg_http_req *req, void *app);
void cg_gw_chunks_lookup(cg_http_req *req, void *app);
void cg_gw_chunk_pin(cg_http_req *req, void *app);
void cg_gw_chunk_unpin(cg_http_req *req, void *app);
void cg_gw_workers_list(cg_http_req *req, void *app);
void cg_gw_workers_add(cg_http_req *req, void *app);
void cg_gw_workers_delete(cg_http_req *req, void *app);
void cg_gw_worker_get(cg_http_req *req, void *app);
void cg_gw_worker_delete(cg_http_req *req, void *app);
void cg_gw_worker_sync(cg_http_req *req, void *app);

#endif
