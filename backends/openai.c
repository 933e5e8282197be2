/* The OpenAI-specific side of the upstream client: the readiness probe, and whether the
 * backend is a chunkgate-worker (backends/openai.h). */
#include "backends/openai.h"

#include <jansson.h>
#include <string.h>

cg_status cg_openai_probe(cg_upstream *c, long timeout_ms, long *http_status, char *err,
                          size_t errlen)
{
    return cg_upstream_probe(c, CG_OPENAI_MODELS_PATH, timeout_ms, NULL, http_status, err, errlen);
}

int cg_openai_backend_is_worker(cg_upstream *c, long timeout_ms)
{
    cg_buf body;
    cg_buf_init(&body, 64 << 10);
    long http = 0;
    char err[256];
    cg_status st = cg_upstream_probe(c, "/healthz", timeout_ms, &body, &http, err, sizeof err);
    int kind = -1;
    if (st == CG_OK) {
        json_t *j = http == 200 ? json_loadb(body.data ? body.data : "", body.len, 0, NULL) : NULL;
        const char *object = json_string_value(json_object_get(j, "object"));
        kind = object && !strcmp(object, "worker.health");
        json_decref(j);
    } else if (st == CG_E_BAD_GATEWAY && http) {
        kind = 0; /* it answered, with more than a health answer holds */
    }
    cg_buf_free(&body);
    return kind;
}
