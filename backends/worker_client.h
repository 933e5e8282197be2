/* The gateway's client for the worker API (openapi/worker.yaml): JSON calls to any worker URL
 * over the one curl event loop of backends/upstream.h, either asynchronous (the request path:
 * assemble, release) or blocking for threads that may wait (health checks, inventory sync,
 * admin registration), and parsers for the worker's answers (info, assembly, inventory). */
#ifndef CG_WORKER_CLIENT_H
#define CG_WORKER_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "backends/upstream.h"
#include "cache/key.h"
#include "cache/split.h"
#include "base/status.h"
#include "base/tier.h"

/* Largest worker answer the client reads (an assembly or one inventory page). */
#define CG_WC_MAX_BYTES (64u << 20)

/* Called once, on the curl thread, when a call ends. st is the transport status (CG_OK when
 * an HTTP answer arrived, whatever its status; CG_E_UNAVAILABLE: no connection or cancelled;
 * CG_E_TIMEOUT; CG_E_BAD_GATEWAY: cut or larger than the cap). http is the status (0 without
 * a head). body is the answer parsed as JSON (a new reference the callee takes over, NULL when
 * it is not JSON). detail is a borrowed message, never NULL. */
typedef void (*cg_wc_done_fn)(void *arg, cg_status st, long http, json_t *body, const char *detail);

/* Starts method path on the worker at base (borrowed) with body (taken over; NULL = none).
 * timeout_ms: longest silence from the worker. rid: X-Request-Id (borrowed, may be NULL).
 * gone (may be NULL): polled about every 100 ms while the call runs; non-zero cancels it
 * (fn then gets CG_E_UNAVAILABLE, "cancelled"), as cg_upstream_handlers.gone.
 * On CG_OK fn runs exactly once; when ref is non-NULL *ref is a transfer reference the caller
 * gives back with cg_upstream_xfer_release (to cancel the call). On failure fn never runs. */
cg_status cg_wc_call(cg_upstream *c, const char *base, const char *method, const char *path,
                     char *body, size_t body_len, const char *rid, long timeout_ms,
                     cg_wc_done_fn fn, int (*gone)(void *arg), void *arg,
                     cg_upstream_xfer **ref) CG_WUR;

/* The same, blocking the calling thread (never the curl thread) until the answer. Returns the
 * transport status as above; *http gets the status and *out the parsed body (caller
 * decrefs; NULL when not JSON). err gets a message on failure. */
cg_status cg_wc_call_sync(cg_upstream *c, const char *base, const char *method, const char *path,
                          char *body, size_t body_len, long timeout_ms, long *http, json_t **out,
                          char *err, size_t errlen) CG_WUR;

/* DELETE {base}/v1/assemblies/{id}, fire and forget (a 404 means already consumed). */
void cg_wc_release(cg_upstream *c, const char *base, const char *assembly_id, const char *rid);

/* The message of an OpenAI error body ({"error":{"message"}}), or NULL. Borrowed from j. */
const char *cg_wc_error_message(json_t *j);

/* ---- GET /v1/info ---- */

typedef struct cg_wc_info {
    char *model, *dtype, *rope_style, *key_version; /* owned */
    char *key_hash;    /* owned; "xxhash" when the worker does not report key_hash */
    char *instance;    /* owned; the worker's instance id or start time when it reports one
                          (instance_id, started_ms or start_time), else NULL */
    char *remote_tier; /* owned; the id of the shared remote tier it reads and writes
                          (remote_tier.id), else NULL: workers with the same id share one */
    int64_t n_layers, n_kv_heads, head_dim, max_positions;
    char *chat_template;         /* owned; the model's chat template, NULL when it has none */
    char *bos_token, *eos_token; /* owned; its special-token strings, NULL when none */
} cg_wc_info;

/* Parses an info answer into *out (zeroed first; clear with cg_wc_info_clear). CG_E_VALUE
 * with a message when a required field (model, dtype, rope_style, key_version) is missing. */
cg_status cg_wc_info_parse(json_t *j, cg_wc_info *out, char *err, size_t errlen) CG_WUR;
void cg_wc_info_clear(cg_wc_info *i);
/* Copies src into *dst (dst zeroed or cleared first). */
void cg_wc_info_copy(cg_wc_info *dst, const cg_wc_info *src);
/* 1 when two workers can share one index: same model id, dtype, RoPE style, key version, key
 * hash, chat template and KV geometry (layers, KV heads, head dim). Otherwise 0 and msg names
 * the first difference. */
int cg_wc_info_compatible(const cg_wc_info *a, const cg_wc_info *b, char *msg, size_t msglen);

/* ---- POST /v1/assemble ---- */

typedef struct cg_wc_seg {
    cg_key key;
    cg_role role;
    int64_t offset, n_tokens;
    int hit;      /* its KV came from the worker's pool */
    int stored;   /* a miss whose KV is now in the pool */
    cg_tier tier; /* with hit: where it came from (RAM when the worker did not say); on the
                     wire, cg_tier_seg_name(hit, tier) */
} cg_wc_seg;

typedef struct cg_wc_assembly {
    char id[33];
    int64_t n_tokens, cached_tokens, computed_tokens, ttl_ms;
    int64_t recomputed_tokens; /* -1: a worker that does not report it */
    cg_wc_seg *segs;           /* owned */
    size_t n_segs;
    cg_key *evicted; /* owned */
    size_t n_evicted;
} cg_wc_assembly;

/* Parses an Assembly answer (zeroed first; free with cg_wc_assembly_free). CG_E_VALUE with a
 * message when it is malformed. */
cg_status cg_wc_assembly_parse(json_t *j, cg_wc_assembly *out, char *err, size_t errlen) CG_WUR;
void cg_wc_assembly_free(cg_wc_assembly *a);

/* ---- GET /v1/chunks (every page) ---- */

typedef struct cg_wc_chunk {
    cg_key key;
    int64_t tokens;
    int disk; /* 1: in the worker's disk tier, 0: RAM */
} cg_wc_chunk;

/* Reads the worker's whole inventory, page by page (blocking; not on the curl thread).
 * *out is a new array of *n rows (caller frees). Returns CG_OK, or the transport status /
 * CG_E_BAD_GATEWAY with a message in err. */
cg_status cg_wc_inventory(cg_upstream *c, const char *base, long timeout_ms, cg_wc_chunk **out,
                          size_t *n, char *err, size_t errlen) CG_WUR;

#endif
