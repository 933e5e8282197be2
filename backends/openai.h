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

/* What c's default backend is, asked at GET /healthz with the backend's key: 1 when it answers
 * as a chunkgate-worker does ({"object": "worker.health", ...}), 0 when it answers anything
 * else (another server, another status), -1 when it did not answer (down, timed out): ask
 * again later. Blocking, off the multi thread; c is borrowed. */
int cg_openai_backend_is_worker(cg_upstream *c, long timeout_ms);

#endif
