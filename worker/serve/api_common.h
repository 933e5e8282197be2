/* What the worker's route handlers share: the API state and the request helpers (parsing
 * the common fields, field errors in the OpenAI shape). Not a public interface. */
#ifndef CG_API_COMMON_H
#define CG_API_COMMON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/http.h"
#include "base/metrics.h"
#include "worker/serve/api_canary.h"
#include "worker/serve/engine.h"
#include "worker/serve/text.h"
#include "worker/serve/api_params.h"

#define P "chunkgate_worker_"

struct cg_worker_api {
    cg_worker_api_params p;
    cg_engine *e;
    cg_metrics *metrics;
    char instance_id[33];   /* random per process: a gateway sees a restart by it */
    int64_t started_ms;     /* wall clock at start */
    int pulls;              /* KV pulls in flight (atomic) */
    cg_canary *canary;      /* the quality canary (api_canary.h) */
    uint64_t stream_stalls; /* streams cut for a reader that read nothing (atomic) */
};

const cg_model_config *cg_api_cfg(cg_worker_api *a);
/* Admission (cg_engine_admit; force: admit whatever the load): 1 when admitted, else replies
 * 429 with Retry-After and returns 0. */
int cg_api_admit(cg_worker_api *a, cg_http_req *req, int force);
/* The engine's and tokenizer's cancel hook for a request (ud: its cg_http_req): 1 once its
 * client has left. Valid until the reply. */
int cg_api_client_left(void *ud);
/* Replies 404 when the request names another model. Returns 0 when it replied. */
int cg_api_model_ok(cg_worker_api *a, cg_http_req *req, json_t *body);
/* Replies with a field error naming the field; what: the expected form. */
void cg_api_field_error(cg_http_req *req, cg_status st, const char *field, const char *what);
/* Replies with an engine error (err: the engine's message, may be empty). */
void cg_api_engine_error(cg_http_req *req, cg_status st, const char *param, const char *err);

/* The assemble options shared by /v1/assemble and /v1/completions. */
typedef struct cg_api_opts {
    cg_mode mode;
    const char *salt; /* borrowed from the body */
    size_t salt_len;
    long long recompute;
    double recompute_ratio;     /* the request's, else --recompute-ratio */
    cg_select recompute_select; /* the request's, else --recompute-select */
    long long reserve;
    int add_special;   /* add_special_tokens (vLLM): the system segment or plain prompt gets BOS */
    int split_special; /* split_special_tokens (HF, vLLM): special-token text is plain text */
} cg_api_opts;
/* Parses them (mode from mode_field); replies 400 and returns 0 on a bad value. */
int cg_api_parse_opts(cg_worker_api *a, cg_http_req *req, json_t *body, const char *mode_field,
                      cg_api_opts *o);

/* Renders a chat body (messages, documents, add_generation_prompt, chat_template_kwargs,
 * chunk_separator) into out: the model's chat template (*templated = 1: it wrote the special
 * tokens, so none is added) or the plain rendering. Replies 4xx and returns 0 on a bad body. */
int cg_api_chat_prompt(cg_worker_api *a, cg_http_req *req, json_t *body, cg_buf *out,
                       int *templated);

/* Lowercase hex of n_bytes random bytes (at most 32) into out (2 n_bytes + 1). */
void cg_api_random_hex(char *out, size_t n_bytes);

#endif
