/* What the gateway knows of the OpenAI API itself, as opposed to the transport
 * (backends/upstream.h) that carries it to workers and backends alike: how an
 * OpenAI-compatible backend shows it is ready. */
#ifndef CG_OPENAI_H
#define CG_OPENAI_H

#include <stddef.h>
#include "backends/upstream.h"
#include "base/status.h"

/* The path an OpenAI-compatible backend lists its models on; answering it is being ready. */
#define CG_OPENAI_MODELS_PATH "/v1/models"

/* Blocking readiness probe of c's default backend: GET CG_OPENAI_MODELS_PATH through
 * cg_upstream_probe (same arguments, same returns). c is borrowed. */
cg_status cg_openai_probe(cg_upstream *c, long timeout_ms, long *http_status, char *err,
                          size_t errlen) CG_WUR;

/* What an answer (status http, body of len bytes) to GET /healthz says of the server: 1 a
 * chunkgate-worker ({"object": "worker.health"}, or an earlier worker's {"status": "ok",
 * "running": N, "queued": N}), 0 another server. */
int cg_openai_health_is_worker(long http, const char *body, size_t len);

/* What c's default backend is, asked at GET /healthz with the backend's key: 1 a
 * chunkgate-worker, 0 another server (any complete answer below 500), -1 no complete answer
 * (down, timed out, cut, a 5xx): ask again later. Blocking, off the multi thread; c is
 * borrowed. */
int cg_openai_backend_is_worker(cg_upstream *c, long timeout_ms);

/* The same question without blocking: fn(arg, kind) runs once, on the multi thread, with the
 * answer as above. CG_OK when it was asked (fn will run); otherwise fn never runs. */
typedef void (*cg_openai_kind_fn)(void *arg, int kind);
cg_status cg_openai_ask_backend_kind(cg_upstream *c, long timeout_ms, cg_openai_kind_fn fn,
                                     void *arg) CG_WUR;

#endif
