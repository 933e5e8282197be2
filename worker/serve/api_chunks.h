/* The worker's inventory and KV export routes: GET /v1/chunks, GET|DELETE /v1/chunks/{key},
 * GET /v1/chunks/{key}/kv, GET /v1/assemblies/{id}/kv and /logits. */
#ifndef CG_API_CHUNKS_H
#define CG_API_CHUNKS_H

#include "base/http.h"

/* GET /v1/chunks, GET|DELETE /v1/chunks/{key} and GET /v1/chunks/{key}/kv. */
cg_http_handler_fn cg_api_chunks, cg_api_chunk_get, cg_api_chunk_delete, cg_api_chunk_kv;
/* GET /v1/assemblies/{id}/kv and /logits. */
cg_http_handler_fn cg_api_assembly_kv, cg_api_assembly_logits;

#endif
