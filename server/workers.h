/* The gateway's worker registry: the KV workers it routes to (from --worker and the admin
 * API), their health and load, registration checks against /v1/info, inventory sync into the
 * index when a worker (re)appears, and the cache-aware routing decision. Thread-safe. */
#ifndef CG_WORKERS_H
#define CG_WORKERS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "backends/upstream.h"
#include "cache/chatreq.h"
#include "base/metrics.h"
#include "server/failkind.h"
#include "sql/index.h"

typedef struct cg_workers cg_workers;
/* One registered worker. Reference-counted: a request that was routed to it holds a
 * reference (and counts as in flight) until cg_workers_release, so removing the worker never
 * frees it under a running request. */
typedef struct cg_worker cg_worker;

typedef struct cg_workers_params {
    cg_upstream *client;           /* borrowed: the gateway's curl event loop */
    cg_index *index;               /* borrowed */
    cg_metrics *metrics;           /* borrowed */
    const char *model;             /* borrowed; NULL, or the model every worker must serve */
    long health_interval_ms;       /* GET /healthz period per worker; default 2000 */
    long health_timeout_ms;        /* one probe's limit; default 1000 */
    long sync_interval_ms;         /* full inventory resync period of a healthy worker; 0 = only
                                      when it (re)appears or a stale placement is seen; default
                                      60000 */
    long long load_penalty_tokens; /* routing: each in-flight request costs this many cached
                                      tokens of score; default 256 */
    int remote_hit_percent;        /* routing: a token a worker can read from its shared remote
                                      tier scores this percent of a local one, 1..99; default
                                      50 */
    /* Optional: called by the health thread after each round of probes (the gateway asks
     * what its --backend is there until it knows). */
    void (*tick)(void *ud, uint64_t now_ms);
    void *tick_ud;
} cg_workers_params;

cg_workers_params cg_workers_default_params(void);

/* Creates an empty registry (no thread yet). *out is owned by the caller. */
cg_status cg_workers_open(const cg_workers_params *p, cg_workers **out) CG_WUR;
/* Starts the health-check thread. */
cg_status cg_workers_health_start(cg_workers *r) CG_WUR;
/* Stops the health-check thread (waits for a probe in progress). Idempotent. */
void cg_workers_health_stop(cg_workers *r);
/* Stops, drops every worker and frees. Requests must have released their workers. NULL-safe;
 * sets *r to NULL. */
void cg_workers_close(cg_workers **r);

/* Registers the worker at url (normalised: a trailing "/" or "/v1" is dropped). Fetches
 * {url}/v1/info and checks it against --model and the workers already registered (model id,
 * dtype, RoPE style, key version, KV geometry), then syncs its inventory into the index. A
 * worker that reports a shared remote tier (remote_tier.id) gets that tier's row in the index
 * (cg_index_tier_row_url), shared by every worker reporting the same id.
 * must_reach = 1 (admin API): an unreachable worker is refused (CG_E_UNAVAILABLE); 0
 * (startup): it is registered as down and checked when it comes up. Returns CG_OK
 * (*created = 1 when new, 0 when the url was already registered), CG_E_VALUE (bad url),
 * CG_E_CONFLICT (incompatible), CG_E_UNAVAILABLE, CG_E_BAD_GATEWAY (bad /v1/info) or
 * CG_E_IO (index); err gets a message. *out_json (may be NULL) gets the worker's JSON (new
 * reference). */
cg_status cg_workers_add(cg_workers *r, const char *url, int must_reach, int *created,
                         json_t **out_json, char *err, size_t errlen) CG_WUR;
/* Unregisters a worker by index id (id >= 0) or url and deletes its placements from the
 * index. Requests already routed to it finish. CG_E_NOT_FOUND when unknown. *out_json (may
 * be NULL) gets the removed worker's JSON. */
cg_status cg_workers_remove(cg_workers *r, int64_t id, const char *url, json_t **out_json) CG_WUR;

/* Syncs the worker with index id now (blocking): /v1/info, compatibility, inventory. Returns
 * CG_OK when it is healthy afterwards, CG_E_NOT_FOUND, or CG_E_UNAVAILABLE with the reason in
 * err. *out_json (may be NULL) gets its JSON. */
cg_status cg_workers_sync(cg_workers *r, int64_t id, json_t **out_json, char *err,
                          size_t errlen) CG_WUR;

/* {"object":"list","data":[worker...]} (new reference). */
json_t *cg_workers_list_json(cg_workers *r);
/* One worker's JSON by id, or NULL (new reference). */
json_t *cg_workers_get_json(cg_workers *r, int64_t id);
/* Registered workers, and of those the healthy ones. */
size_t cg_workers_count(cg_workers *r);
size_t cg_workers_healthy(cg_workers *r);
/* The model the worker pool serves (--model, else the first accepted worker's) into buf;
 * returns 0 when none is known yet. */
int cg_workers_model(cg_workers *r, char *buf, size_t n);
/* The chat template the workers reported in /v1/info (one reference, release with
 * cg_chat_model_unref), or NULL when they reported none (or r is NULL): chats then use the
 * plain rendering. */
cg_chat_model *cg_workers_chat_model(cg_workers *r);
/* The pool's context length (max_positions of /v1/info), 0 while no worker was accepted. */
int64_t cg_workers_max_positions(cg_workers *r);

/* ---- routing ---- */

typedef enum {
    CG_ROUTE_HIT,
    CG_ROUTE_LEAST_LOADED,
    CG_ROUTE_PINNED,
    CG_ROUTE_REMOTE,
    CG_ROUTE_KINDS
} cg_route_kind;
/* "hit", "least_loaded", "pinned", "remote"; static storage. */
const char *cg_route_kind_name(cg_route_kind k);

/* One candidate for cg_route_pick. */
typedef struct cg_route_cand {
    int64_t cached;    /* tokens of the request's segments placed on this worker */
    int64_t in_flight; /* requests this gateway routed to it and not finished */
    int pinned;        /* it holds a pinned chunk of the request */
    int64_t remote;    /* tokens of the other segments it can read from its shared remote tier */
    int64_t others;    /* sequences it reported at its last health check (running + queued)
                          beyond this gateway's own requests then: other replicas' load */
} cg_route_cand;

/* The load cg_route_pick weighs c by: in_flight + others. Every replica polls the same
 * report, so every replica sees the same total; the own part is exact now, the others' part
 * is as old as the last probe. (The raw report would count this gateway's requests twice, and
 * keep counting one that finished after the probe.) */
int64_t cg_route_load(const cg_route_cand *c);

/* The routing rule, pure so it can be tested without processes; every gateway replica runs
 * it on the same index and the same reported loads, so replicas pick alike. Candidates
 * holding a pinned chunk of the request, if any, are the only ones considered (kind pinned).
 * Score = cached + remote * remote_pct / 100 - cg_route_load * penalty: a token in the shared
 * tier is worth less than a local one and more than a miss, so a less loaded worker that will
 * fetch can beat the busy one that holds the chunk. The best score wins when its cached > 0
 * (kind hit) or else its remote > 0 (kind remote). Otherwise the least loaded wins (kind
 * least_loaded). Ties go to the first candidate at or after tie % n in rotation order, so
 * equal cold requests spread by their key instead of all landing on candidate 0. Returns the
 * index, or -1 when n == 0. */
int cg_route_pick(const cg_route_cand *c, size_t n, long long penalty, int remote_pct, uint64_t tie,
                  cg_route_kind *kind);

/* Picks a healthy worker for a request whose keys the one index lookup answered (ent[k] for
 * keys[k], with the placements still queued for the index; ent may be NULL when the lookup
 * failed). steer[k] (NULL = all) says
 * whether key k counts in the score: the gateway passes the document chunks only, because the few
 * system prompts that every request shares end up on every worker, and steering by them would send
 * every request to the first worker that cached one (herding). tie: a hash of the request's
 * first chunk. Returns a worker reference counted in flight (give it back with
 * cg_workers_release), or NULL when no worker is healthy. *kind and *cached (steering tokens
 * the index expects to reuse) are set. */
cg_worker *cg_workers_route(cg_workers *r, const cg_index_entry *ent, const unsigned char *steer,
                            size_t n_keys, const cg_key *keys, uint64_t tie, cg_route_kind *kind,
                            int64_t *cached);
/* The least-loaded healthy worker (cg_route_load) whose id (cg_worker_id) is none of the
 * n_skip in skip (may be NULL when n_skip is 0), for a plain prompt or a retry; counted in
 * flight like cg_workers_route. NULL when there is none. */
cg_worker *cg_workers_pick_any(cg_workers *r, const int64_t *skip, size_t n_skip);
/* Ends a routed request: in flight - 1, reference given back. Accepts NULL; sets *w NULL. */
void cg_workers_release(cg_workers *r, cg_worker **w);

const char *cg_worker_url(const cg_worker *w); /* borrowed, lives as long as the reference */
int64_t cg_worker_id(const cg_worker *w);
/* The index row of the shared remote tier w reported at its last sync, or -1 (none). */
int64_t cg_workers_tier_row(cg_workers *r, const cg_worker *w);

/* Reports a failed call to w: counted in chunkgate_worker_errors_total{kind} (a kind with
 * cg_failkind_of_worker); a kind that cg_failkind_marks_down (connect, timeout) also marks it
 * down until a health probe succeeds. */
void cg_workers_error(cg_workers *r, cg_worker *w, cg_failkind kind, const char *detail);
/* The worker reported a miss for a chunk the index placed on it: its cache changed behind
 * the gateway's back (restart, eviction not reported, admin delete). Schedules a full
 * inventory sync of it. */
void cg_workers_stale(cg_workers *r, cg_worker *w);

/* The registered worker whose instance id (GET /v1/info instance_id, the epoch of its chunk
 * events) is instance: *id gets its index id, *tier_row its shared tier's row (or -1). Returns
 * 1, or 0 when no worker has reported that instance (yet). */
int cg_workers_find_instance(cg_workers *r, const char *instance, int64_t *id, int64_t *tier_row);
/* Schedules a full inventory sync of the worker with index id, or of every worker when id < 0
 * (the health thread runs it at once). Returns 1, or 0 when no such worker is registered. */
int cg_workers_resync(cg_workers *r, int64_t id);

/* One round of the health logic at monotonic time now_ms: probes every worker whose check is
 * due (or that needs a sync) and syncs those that came up, changed instance, or are due for a
 * periodic resync. The health thread calls it; it blocks on the network. */
void cg_workers_tick(cg_workers *r, uint64_t now_ms);

#endif
