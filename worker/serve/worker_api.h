/* HTTP API of chunkgate-worker (openapi/worker.yaml): assemble, completions and chat
 * completions (OpenAI, SSE), tokenize and detokenize (vLLM), inventory, KV export, health and
 * metrics, as route handlers on base/http.h. */
#ifndef CG_WORKER_API_H
#define CG_WORKER_API_H

#include <stddef.h>
#include <stdint.h>

#include "base/http.h"
#include "worker/serve/api_params.h"

cg_worker_api_params cg_worker_api_default_params(void);

/* Creates the api state (with its own metrics registry). Caller frees with cg_worker_api_free,
 * after the HTTP server that uses it has stopped. */
cg_worker_api *cg_worker_api_new(cg_worker_api_params p);
void cg_worker_api_free(cg_worker_api **api);

/* The route table (static storage): pass it with app = the api and done = cg_worker_api_done
 * in cg_http_params. */
const cg_http_route *cg_worker_api_routes(size_t *n_routes);
/* The request-finished callback: requests_total{route,code} and request_duration_seconds. */
void cg_worker_api_done(void *app, const char *route, int status, double seconds);

#endif
