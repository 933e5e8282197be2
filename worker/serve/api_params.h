/* The worker API's state type and its parameters: shared by the public interface
 * (worker/serve/worker_api.h) and the route handlers (worker/serve/api_common.h), so neither
 * includes the other. */
#ifndef CG_API_PARAMS_H
#define CG_API_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "cache/chatreq.h"
#include "worker/serve/engine.h"

typedef struct cg_worker_api cg_worker_api;

typedef struct cg_worker_api_params {
    cg_engine *engine; /* borrowed; outlives the api */
    const char
        *separator; /* borrowed; default CG_SPLIT_DEFAULT_SEPARATOR (prompts of /v1/completions) */
    size_t max_segments;         /* default 256 */
    uint32_t default_max_tokens; /* /v1/completions max_tokens when absent; default 16 */
    /* Backend role: an assembly id this worker does not hold is pulled from a worker of the
     * kv_sources allow-list (worker/serve/kvpull.h): the one its request's
     * kv_transfer_params.worker names (the gateway names the worker that assembled it), else
     * the first. A name is a URL chosen by whoever sent the request: one not on the list is
     * refused unless kv_request_source is set, because the worker would otherwise connect
     * wherever a client points it. */
    const char *const *kv_sources; /* borrowed, n_kv_sources base URLs; NULL/0 = none */
    size_t n_kv_sources;
    int kv_request_source; /* 1: kv_transfer_params.worker may name any source; default 0 */
    int tp;                /* tensor-parallel ranks of a pull; default 1 */
    long kv_timeout_ms;    /* per pull request; default 5000 */
    int kv_max_pulls;      /* pulls at once; more are answered 503 at once; default 4 */
    /* The model's chat template (borrowed; outlives the api), or NULL: chats then take the
     * plain rendering of cache/chat.h. */
    cg_chat_model *chat;
    /* The shared remote tier, as /v1/info reports it (the engine holds the client): its URL
     * (never a password) and the name the gateway groups workers by. Borrowed; NULL/"" =
     * none; remote_id NULL/"" = the URL. */
    const char *remote_url;
    const char *remote_id;
    /* This run's instance id (32 hex digits, copied), also the epoch of its chunk events;
     * NULL/"" = a random one. */
    const char *instance_id;
    /* Quality of reuse (DESIGN §15). */
    double recompute_ratio;     /* a request's recompute_ratio when it sends none; default 0 */
    cg_select recompute_select; /* a request's recompute_select when it sends none */
    double canary_rate;         /* fraction of completions decoded from an assembly that are also
                                   compared with a plain causal forward in the background; 0.01 */
    uint32_t canary_tokens;     /* generated tokens a comparison covers (teacher forcing); 16 */
    uint32_t canary_queue;      /* sampled comparisons waiting; more are dropped; default 4 */
    /* A streamed completion whose client reads nothing for this long, with the stream's buffer
     * full, is cut (its decode was parked meanwhile: worker/serve/sched.h); default 30000 ms */
    int stream_stall_ms;
    /* --api-key: every route but /healthz needs it as a bearer token (the HTTP server checks
     * it); also sent to --kv-source, which is expected to share it. Borrowed; NULL = open. */
    const char *api_key;
    /* The default of a request's split_special_tokens (--split-special-tokens); default 0:
     * special-token text in a prompt is its control token, as Hugging Face does */
    int split_special;
} cg_worker_api_params;

#endif
