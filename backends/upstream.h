/* The upstream client, on libcurl: every HTTP exchange the gateway starts, with its workers
 * and with OpenAI-compatible inference backends alike, goes through one pool and one loop.
 *
 * Why one multi thread. The gateway must hold 1,000 concurrent streamed answers on 2 cores.
 * A blocking curl_easy_perform per request would pin one thread per stream for the whole
 * answer: 1,000 threads, 1,000 stacks, and a scheduler busy switching between them. Instead
 * every upstream transfer is an easy handle driven by ONE thread with libcurl's event API:
 * curl_multi_socket_action on the thread's own epoll set, so a wakeup costs the sockets that
 * are ready, never a scan of all transfers (curl_multi_poll/perform would poll and visit all
 * 1,000 on every event). A request handler (on a job thread) only builds the request and
 * hands it over with cg_upstream_submit(); it returns at once. The multi thread calls the
 * transfer's callbacks as bytes arrive, and they push into the client's reply (a cg_stream,
 * whose bytes MHD's epoll threads write out) or into a capped buffer. So nothing blocks per
 * request anywhere: epoll threads only move bytes to clients, the multi thread only moves
 * bytes from backends, and the cost of an idle stream is two sockets and a few kilobytes.
 * The multi handle keeps a pool of idle connections for reuse.
 *
 * Callbacks never block the multi thread: a consumer that cannot take more bytes (a slow
 * client) returns CG_UPSTREAM_PAUSE, and calls cg_upstream_xfer_resume() from any thread when it
 * can take them again. Cancellation (a client that went away) works the same way. */
#ifndef CG_UPSTREAM_H
#define CG_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>
#include "base/base.h"
#include "base/status.h"

typedef struct cg_upstream cg_upstream;
typedef struct cg_upstream_xfer cg_upstream_xfer;

typedef struct cg_upstream_params {
    const char *base_url;       /* e.g. "http://127.0.0.1:8000" (copied); a trailing "/" or
                                   "/v1" is dropped, request paths start with "/v1/". NULL: no
                                   default upstream; every request names its own (the gateway
                                   without --backend still talks to its workers) */
    const char *api_key;        /* sent as "Authorization: Bearer ..." when set (copied) */
    const char *worker_api_key; /* sent the same way instead of api_key on requests to a
                                   worker (cg_upstream_req.to_worker); copied; NULL = none */
    long connect_timeout_ms;    /* default 3000 */
    long idle_timeout_ms;       /* longest silence from the backend, before the first byte or
                                   between two reads, before CG_E_TIMEOUT; default 300000 */
    long max_idle_conns;        /* idle connections kept for reuse; default 1024 */
    long dns_cache_s;           /* seconds a resolved host name is reused before it is looked up
                                   again (CURLOPT_DNS_CACHE_TIMEOUT; libcurl's own default is 60,
                                   which kept a restarted worker on a new address unreachable);
                                   0 = looked up for every new connection; default 2, the gateway
                                   sets at most its health interval. Negative: the default */
} cg_upstream_params;

cg_upstream_params cg_upstream_default_params(void);

/* Return values of on_body. */
enum { CG_UPSTREAM_CONTINUE = 0, CG_UPSTREAM_PAUSE = 1, CG_UPSTREAM_ABORT = -1 };

/* A transfer's callbacks. All run on the multi thread, one at a time per transfer; they must
 * not block. arg is the consumer's, passed back unchanged. */
typedef struct cg_upstream_handlers {
    /* The response head is complete (called before the first on_body, or before on_done when
     * the body is empty). content_type is borrowed, may be NULL. Return CG_UPSTREAM_CONTINUE or
     * CG_UPSTREAM_ABORT. NULL = accept. */
    int (*on_head)(void *arg, long status, const char *content_type);
    /* Body bytes (borrowed). Return CG_UPSTREAM_CONTINUE when they were consumed,
     * CG_UPSTREAM_PAUSE when they were NOT consumed (they come again after
     * cg_upstream_xfer_resume), or CG_UPSTREAM_ABORT. */
    int (*on_body)(void *arg, const char *data, size_t len);
    /* Exactly once, last. st: CG_OK when the exchange completed (whatever the HTTP status);
     * CG_E_UNAVAILABLE when the backend could not be reached (or the client is stopping, or
     * the transfer was cancelled); CG_E_TIMEOUT; CG_E_BAD_GATEWAY for a broken reply (reset,
     * truncated, not HTTP); the status the consumer gave to cg_upstream_xfer_abort. http_status
     * is 0 when no head arrived. detail is a borrowed human message, never NULL. */
    void (*on_done)(void *arg, cg_status st, long http_status, const char *detail);
    /* Polled about every 100 ms while the transfer runs, paused or not: non-zero when the
     * consumer no longer wants the answer (its client left). The transfer is then cancelled
     * as by cg_upstream_xfer_cancel. NULL = always wanted. */
    int (*gone)(void *arg);
} cg_upstream_handlers;

/* Starts the client and its multi thread. *out is owned by the caller (cg_upstream_close). */
cg_status cg_upstream_open(const cg_upstream_params *p, cg_upstream **out) CG_WUR;

/* Waits up to timeout_ms for the transfers in flight to end; returns how many are left. */
size_t cg_upstream_drain(cg_upstream *c, uint64_t timeout_ms);

/* Refuses new transfers (cg_upstream_submit then fails with CG_E_UNAVAILABLE), ends every
 * transfer in flight (on_done with CG_E_UNAVAILABLE) and joins the multi thread. The client
 * stays allocated, so threads that still hold it may call submit safely. Idempotent. */
void cg_upstream_shutdown(cg_upstream *c);
/* cg_upstream_shutdown, then frees. Accepts NULL; sets *c to NULL. */
void cg_upstream_close(cg_upstream **c);

/* Transfers submitted and not yet done. */
size_t cg_upstream_in_flight(cg_upstream *c);

/* One request for cg_upstream_submit_req. Strings are borrowed for the call. */
typedef struct cg_upstream_req {
    const char *base;   /* upstream base URL, normalised as base_url; NULL: the client's */
    const char *method; /* "GET", "POST", "DELETE" */
    const char *path;   /* "/v1/completions" */
    char *body;         /* taken over (freed by the client, also on failure); NULL = none */
    size_t body_len;
    const char *request_id; /* sent as X-Request-Id; may be NULL */
    long idle_timeout_ms;   /* 0: the client's idle_timeout_ms */
    int to_worker;          /* 1: the upstream is a worker: send worker_api_key, not api_key */
} cg_upstream_req;

/* Starts the request r; see cg_upstream_submit for the contract. CG_E_VALUE (no handler runs,
 * body freed) when neither r->base nor the client has a base URL. */
cg_status cg_upstream_submit_req(cg_upstream *c, const cg_upstream_req *r,
                                 const cg_upstream_handlers *h, void *arg,
                                 cg_upstream_xfer **ref) CG_WUR;

/* Starts a request: method "GET" or "POST", path like "/v1/completions" (borrowed),
 * body (taken over, freed by the client; NULL for none) of body_len bytes, sent as
 * application/json. request_id (borrowed, may be NULL) goes out as X-Request-Id.
 * h is copied. On CG_OK the handlers will run exactly once to on_done, and when ref is
 * non-NULL *ref is a reference the caller must give back with cg_upstream_xfer_release.
 * On failure (CG_E_UNAVAILABLE: client stopping) no handler runs and body is freed. */
cg_status cg_upstream_submit(cg_upstream *c, const char *method, const char *path, char *body,
                             size_t body_len, const char *request_id, const cg_upstream_handlers *h,
                             void *arg, cg_upstream_xfer **ref) CG_WUR;

/* Thread-safe and non-blocking (safe under the consumer's own locks), and no-ops once the
 * transfer is done: resume a paused transfer; cancel it (on_done gets CG_E_UNAVAILABLE,
 * detail "cancelled"); abort it with the consumer's own status (e.g. CG_E_BAD_GATEWAY when
 * the body is too large). The abort happens on the multi thread's next turn. */
void cg_upstream_xfer_resume(cg_upstream_xfer *x);
void cg_upstream_xfer_cancel(cg_upstream_xfer *x);
void cg_upstream_xfer_abort(cg_upstream_xfer *x, cg_status st, const char *detail);
/* Gives back a reference from cg_upstream_submit; accepts NULL; sets *x to NULL. */
void cg_upstream_xfer_release(cg_upstream_xfer **x);

/* Blocking probe for readiness, off the multi thread: GET {base}{path} (path borrowed) with
 * timeout_ms for the whole exchange, with the backend's key. The body goes to body (NULL:
 * discarded; a body beyond body's bound fails the probe with CG_E_BAD_GATEWAY). Returns CG_OK
 * when the backend answered with an HTTP status below 500 (*http_status set),
 * CG_E_UNAVAILABLE / CG_E_TIMEOUT / CG_E_BAD_GATEWAY otherwise, with a message in err. What to
 * probe is the caller's: backends/openai.h probes an OpenAI-compatible backend. */
cg_status cg_upstream_probe(cg_upstream *c, const char *path, long timeout_ms, cg_buf *body,
                            long *http_status, char *err, size_t errlen) CG_WUR;

/* The normalised base URL (borrowed, lives as long as c), or NULL when it has none. */
const char *cg_upstream_base_url(const cg_upstream *c);

/* The normalised form of an upstream base URL ("http://h:1/v1/" -> "http://h:1"): trailing
 * "/" and one trailing "/v1" are dropped. Returns a new string the caller frees. */
char *cg_upstream_base_normalise(const char *url);

#endif
