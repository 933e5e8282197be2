/* Internal to the gateway's handler files (gateway.c, infer.c, relay.c, admin.c): the
 * application state and the functions they share. Not a public interface. */
#ifndef CG_GATEWAY_IMPL_H
#define CG_GATEWAY_IMPL_H

#include <pthread.h>
#include <jansson.h>
#include "backends/openai.h"
#include "cache/key.h"
#include "cache/split.h"
#include "server/gateway.h"
#include "base/http.h"
#include "base/metrics.h"
#include "server/workers.h"
#include "sql/index.h"

struct cg_gateway {
    const cg_gateway_config *cfg; /* borrowed */
    cg_mode default_mode;
    cg_index *index;
    cg_metrics *metrics;
    cg_openai *client; /* the one curl event loop: backend, workers */
    int has_backend;   /* --backend is set (the client's default base URL) */
    cg_workers *workers;
    cg_http_server *http;
    char *index_path;
    /* Tenant id (cg_key_tenant_id) of each API key, in cfg->api_keys order; NULL without
     * keys. An authenticated request's chunk keys are salted with its tenant id. */
    char (*tenants)[CG_KEY_HEX_LEN + 1];

    /* Series updated on every request, looked up once. */
    cg_metric *m_seg_system, *m_seg_chunk, *m_seg_question;
    cg_metric *m_empty, *m_hits, *m_misses, *m_reused, *m_computed;
    cg_metric *m_fallbacks, *m_passthrough, *m_disconnects;
    cg_metric *m_fallback_no_worker, *m_fallback_worker_error, *m_fallback_model;
    cg_metric *m_releases, *m_ttft, *m_assemble;

    /* /readyz caches the backend probe briefly so a busy prober cannot load the backend. */
    pthread_mutex_t ready_mu;
    uint64_t ready_at_ms; /* monotonic time of the last probe; 0 = never */
    cg_status ready_st;
    char ready_msg[256];

    struct cg_status_ring *recent; /* the status page's recent requests (status.c) */
};

/* ---- route handlers ---- */
void cg_gw_completions(cg_http_req *req, void *app);      /* infer.c */
void cg_gw_chat_completions(cg_http_req *req, void *app); /* infer.c */
void cg_gw_models(cg_http_req *req, void *app);           /* relay.c */
void cg_gw_chunks_list(cg_http_req *req, void *app);      /* admin.c */
void cg_gw_chunk_get(cg_http_req *req, void *app);
void cg_gw_chunk_delete(cg_http_req *req, void *app);
void cg_gw_chunks_lookup(cg_http_req *req, void *app);
void cg_gw_chunk_pin(cg_http_req *req, void *app);
void cg_gw_chunk_unpin(cg_http_req *req, void *app);
void cg_gw_workers_list(cg_http_req *req, void *app); /* admin.c */
void cg_gw_workers_add(cg_http_req *req, void *app);
void cg_gw_workers_delete(cg_http_req *req, void *app);
void cg_gw_worker_get(cg_http_req *req, void *app);
void cg_gw_worker_delete(cg_http_req *req, void *app);
void cg_gw_worker_sync(cg_http_req *req, void *app);

/* ---- shared helpers ---- */

/* A request's segments after splitting and keying. Keys exist for cacheable segments only
 * (system and chunk); n_keys of them, in prompt order. */
typedef struct cg_gw_segments {
    cg_split_result split; /* segments, offsets into text */
    const char *text;      /* borrowed: the prompt string or the chat rendering */
    cg_buf rendered;       /* owns the chat rendering */
    const char *separator; /* borrowed: the separator used (request's or --separator) */
    const char *tenant;    /* borrowed: the caller's tenant id, set before splitting; NULL
                              when the request carries no API key */
    const char *salt;      /* the salt of the keys: cache_salt, or with a tenant
                              "<tenant>" / "<tenant>:<cache_salt>"; NULL = none */
    char *salt_owned;      /* owned: the tenant form of salt */
    long long recompute;   /* recompute_prefix_tokens, -1 when absent */
    cg_mode mode;
    cg_key *keys;    /* owned; n_keys entries */
    size_t *key_seg; /* owned; the segment index of each key */
    size_t n_keys;
} cg_gw_segments;

void cg_gw_segments_init(cg_gw_segments *s);
void cg_gw_segments_free(cg_gw_segments *s);

/* The tenant id of the API key the request presented, or NULL (borrowed from g). */
const char *cg_gw_tenant(cg_gateway *g, cg_http_req *req);

/* Parses the extension fields shared by completions, chat and lookup (chunk_separator,
 * chunk_mode, cache_salt) and splits the request (prompt or messages + documents) into
 * segments with keys. out->tenant (may be NULL) must be set before: with a tenant, the salt is
 * always bound to it, so no cache_salt reaches another tenant's keys. chat: 1 for a chat
 * request. On failure returns the status and sets *param to the offending field and msg to a
 * message. */
cg_status cg_gw_segment_request(cg_gateway *g, json_t *body, const char *model, int chat,
                                cg_gw_segments *out, const char **param, char *msg,
                                size_t msglen) CG_WUR;

/* Replies with an error from a (status, param, message) triple; message may be "". */
void cg_gw_reply_error(cg_http_req *req, cg_status st, const char *param, const char *msg);

/* Where a relay sends its request and what it does with the answer. */
typedef struct cg_gw_target {
    const char *route;       /* metrics/log label, e.g. "completions" */
    const char *model;       /* the request's model (borrowed for the call), for the status page */
    const char *base;        /* upstream base URL (borrowed for the call); NULL = --backend */
    const char *path;        /* "/v1/completions", "/v1/chat/completions" */
    int no_auth;             /* the upstream is a worker: no backend api key */
    int to_chat;             /* the upstream speaks completions; answer in chat shape */
    long long cached_tokens; /* >= 0: usage.prompt_tokens_details.cached_tokens is this */
    int count_usage;         /* count usage.prompt_tokens - cached as computed tokens */
    cg_worker *worker;       /* taken over: released (in flight - 1) when the relay ends */
    const char *assembly_id; /* copied; the assembly on worker, released unless consumed */
    int backend_is_worker;   /* the upstream is worker itself (it consumes the assembly) */
} cg_gw_target;

/* Upstream relay (relay.c). Takes over body (forwarded bytes), chunk_cache (a reference,
 * added to the answer; may be NULL) and t->worker. Ends the request: the reply comes from
 * the relay, possibly later and from another thread. */
void cg_gw_relay_to(cg_gateway *g, cg_http_req *req, const cg_gw_target *t, char *body,
                    size_t body_len, int stream, json_t *chunk_cache);

/* Upstream relay to --backend (a plain forward). */
void cg_gw_relay(cg_gateway *g, cg_http_req *req, const char *route, const char *path, char *body,
                 size_t body_len, int stream, json_t *chunk_cache);

/* Adds usage.prompt_tokens_details.cached_tokens (0) when absent, and counts the prompt
 * tokens the backend computed. */
void cg_gw_fix_usage(cg_gateway *g, json_t *obj);

/* Main path (orchestrate.c): assemble on a worker, then complete with the assembly. Takes
 * over body (the request JSON reference), segs (moved: the caller's copy is re-initialised)
 * and ent (the lookup, n = segs->n_keys; may be NULL), and ends the request. */
void cg_gw_orchestrate(cg_gateway *g, cg_http_req *req, json_t *body, cg_gw_segments *segs,
                       cg_index_entry *ent, int chat, int stream);

/* The text_completion answer obj (or one streamed chunk) rewritten in place as a
 * chat.completion (chat.completion.chunk when stream). first: the first streamed chunk, whose
 * delta carries the role. */
void cg_gw_to_chat(json_t *obj, int stream, int first);

/* A completions request body for a chat request: prompt, the sampling fields that mean the
 * same in both APIs, and max_completion_tokens (or max_tokens) as max_tokens. New reference. */
json_t *cg_gw_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len);

/* Counts an upstream failure in chunkgate_backend_errors_total{kind}. */
void cg_gw_backend_error(cg_gateway *g, const char *kind);

/* JSON for one index chunk (admin list/get). New reference. */
json_t *cg_gw_chunk_json(const cg_index_chunk *c);
json_t *cg_gw_placements_json(const cg_index_placement *p, int n);

#endif
