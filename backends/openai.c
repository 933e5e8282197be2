/* The OpenAI-specific side of the upstream client: the readiness probe, and whether the
 * backend is a chunkgate-worker (backends/openai.h). */
#include "backends/openai.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

cg_status cg_openai_probe(cg_upstream *c, long timeout_ms, long *http_status, char *err,
                          size_t errlen)
{
    return cg_upstream_probe(c, CG_OPENAI_MODELS_PATH, timeout_ms, NULL, http_status, err, errlen);
}

#define HEALTH_BODY_MAX (64 << 10)

int cg_openai_health_is_worker(long http, const char *body, size_t len)
{
    json_t *j = http == 200 ? json_loadb(body ? body : "", len, 0, NULL) : NULL;
    const char *object = json_string_value(json_object_get(j, "object"));
    const char *status = json_string_value(json_object_get(j, "status"));
    int worker = object ? !strcmp(object, "worker.health")
                        : status && !strcmp(status, "ok") &&
                              json_is_integer(json_object_get(j, "running")) &&
                              json_is_integer(json_object_get(j, "queued"));
    json_decref(j);
    return worker;
}

int cg_openai_backend_is_worker(cg_upstream *c, long timeout_ms)
{
    cg_buf body;
    cg_buf_init(&body, HEALTH_BODY_MAX);
    long http = 0;
    char err[256];
    cg_status st = cg_upstream_probe(c, "/healthz", timeout_ms, &body, &http, err, sizeof err);
    int kind = st == CG_OK ? cg_openai_health_is_worker(http, body.data, body.len) : -1;
    cg_buf_free(&body);
    return kind;
}

/* ---- the same, asked without blocking */

typedef struct kind_ask {
    cg_buf body;
    long status;
    cg_openai_kind_fn fn;
    void *arg;
} kind_ask;

static int ask_head(void *arg, long status, const char *content_type)
{
    ((kind_ask *)arg)->status = status;
    return CG_UPSTREAM_CONTINUE;
}

static int ask_body(void *arg, const char *data, size_t len)
{
    kind_ask *k = arg;
    return cg_buf_append(&k->body, data, len) == CG_OK ? CG_UPSTREAM_CONTINUE : CG_UPSTREAM_ABORT;
}

static void ask_done(void *arg, cg_status st, long http, const char *detail)
{
    kind_ask *k = arg;
    long status = http ? http : k->status;
    int kind = st == CG_OK && status && status < 500
                   ? cg_openai_health_is_worker(status, k->body.data, k->body.len)
                   : -1;
    k->fn(k->arg, kind);
    cg_buf_free(&k->body);
    free(k);
}

static const cg_upstream_handlers ASK_HANDLERS = {ask_head, ask_body, ask_done, NULL};

cg_status cg_openai_ask_backend_kind(cg_upstream *c, long timeout_ms, cg_openai_kind_fn fn,
                                     void *arg)
{
    kind_ask *k = cg_calloc(1, sizeof *k);
    cg_buf_init(&k->body, HEALTH_BODY_MAX);
    k->fn = fn;
    k->arg = arg;
    cg_upstream_req r = {.method = "GET", .path = "/healthz", .idle_timeout_ms = timeout_ms};
    cg_status st = cg_upstream_submit_req(c, &r, &ASK_HANDLERS, k, NULL);
    if (st != CG_OK) {
        cg_buf_free(&k->body);
        free(k);
    }
    return st;
}
