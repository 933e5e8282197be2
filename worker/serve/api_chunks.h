/* The worker's inventory and KV export routes: GET /v1/chunks, GET|DELETE /v1/chunks/{key},
 * GET /v1/chunks/{key}/kv, GET /v1/assemblies/{id}/kv and /logits. */
#ifndef CG_API_CHUNKS_H
#define CG_API_CHUNKS_H

#include "base/http.h"

void cg_api_chunks(cg_http_req *req, void *app);
void cg_api_chunk_get(cg_http_req *req, void *app);
void cg_api_chunk_delete(cg_http_req *req, void *app);
void cg_api_chunk_kv(cg_http_req *req, void *app);
void cg_api_assembly_kv(cg_http_req *req, void *app);
void cg_api_assembly_logits(cg_http_req *req, void *app);

#endif
