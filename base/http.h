/* HTTP plumbing shared by the gateway and the worker, on libmicrohttpd.
 *
 * Threading model. MHD runs an internal epoll loop on a small pool of threads (one per core
 * by default). Those threads only move bytes: they read headers and bodies and write
 * responses, so one of them can hold thousands of idle or streaming connections. Route
 * handlers that may block (upstream HTTP, model compute) never run there: once the body is
 * complete, the connection is suspended and the request goes to a job pool; the handler
 * replies from that thread, which resumes the connection. Cheap handlers (health, metrics)
 * are marked inline and run on the MHD thread.
 *
 * Streams (SSE). A streamed reply is a cg_stream that a producer pushes bytes into from any
 * thread. MHD pulls from it; when it is empty the connection is suspended and the next push
 * resumes it. A suspended connection cannot see its client leave, so the server pokes idle
 * streams every heartbeat interval: the reader then writes an SSE comment, and a dead client
 * fails that write. The producer learns of it through cg_stream_push()'s return value and
 * cancels its upstream. Streams are reference-counted, so neither side outlives the other's
 * memory. */
#ifndef CG_HTTP_H
#define CG_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "base/base.h"
#include "base/json.h"

typedef struct cg_http_server cg_http_server;
typedef struct cg_http_req cg_http_req;
typedef struct cg_stream cg_stream;

/* A route handler. It must end the request with exactly one cg_http_reply_* call (from any
 * thread, possibly later); after that it must not touch req. Handlers are declared with the
 * function type (`cg_http_handler_fn cg_foo;`) and stored as a cg_http_handler. */
typedef void cg_http_handler_fn(cg_http_req *req, void *app);
typedef cg_http_handler_fn *cg_http_handler;
/* A route's fast handler, tried on the MHD thread when the body is complete, before the
 * request goes to the job pool: returns 1 when it took the request (it then ends it exactly
 * as a handler does, now or later from any thread), 0 to leave it to the handler, untouched.
 * It must not block. */
typedef int (*cg_http_fast_handler)(cg_http_req *req, void *app);

/* Route flags. Auth (the bearer token, compared in constant time with cg_secret_equal):
 *   ADMIN        the admin token. Without an admin token the route is open, unless API keys
 *                are configured: then it is closed to everyone (an API key never opens it).
 *   AUTH         one of the API keys when any is configured, else open. The admin token is
 *                not an API key.
 *   ADMIN | AUTH the admin token (caller CG_CALLER_ADMIN), or an API key (CG_CALLER_API_KEY:
 *                the handler must scope its answer to that key's tenant); open when neither
 *                an admin token nor API keys are configured. */
enum {
    CG_ROUTE_INLINE = 1 << 0, /* cheap, non-blocking: runs on the MHD thread */
    CG_ROUTE_ADMIN = 1 << 1,
    CG_ROUTE_AUTH = 1 << 2,
};

/* Who a request was authorised as. */
typedef enum {
    CG_CALLER_OPEN,    /* no credential needed on this route */
    CG_CALLER_ADMIN,   /* the admin token (or an admin route open for lack of one) */
    CG_CALLER_API_KEY, /* one of the API keys: cg_http_req_api_key says which */
} cg_http_caller;

/* One route. pattern is a path where "*" matches exactly one non-empty path segment, e.g.
 * "/v1/chunks/ *\/kv" (without the spaces). Matched segments are read with
 * cg_http_req_param(req, i). The first route whose pattern matches decides: a matching
 * pattern with another method answers 405. */
typedef struct cg_http_route {
    const char *method; /* "GET", "POST", "DELETE" */
    const char *pattern;
    cg_http_handler handler;
    unsigned flags;
    const char *name; /* label for metrics and logs, e.g. "completions" */
} cg_http_route;

/* Called once per finished request (any thread) with the route name ("unknown" for 404),
 * the HTTP status sent, and the duration; for metrics and the access log. */
typedef void (*cg_http_done_fn)(void *app, const char *route, int status, double seconds);

typedef struct cg_http_params {
    const char *listen;          /* "HOST:PORT"; port 0 picks a free port */
    unsigned io_threads;         /* MHD epoll threads; default 2 */
    unsigned job_threads;        /* blocking-handler pool; default 8 */
    size_t max_body_bytes;       /* default 8 MiB; larger -> 413 */
    size_t max_header_bytes;     /* sum of the request's header name and value bytes; larger ->
                                    431. Default 16 KiB; 0 = no cap on that sum (the raw head is
                                    still capped, see base/http_frame.h) */
    size_t max_json_values;      /* cg_http_req_json: values + members a body may hold; more ->
                                    400 json_too_complex. Default 100000 (base/json.h) */
    unsigned max_json_depth;     /* cg_http_req_json: nesting; deeper -> 400. Default 64 */
    unsigned conn_timeout_s;     /* a connection silent this long is closed (MHD), and so is one
                                    that has not delivered a complete request (headers and body)
                                    this long after it began waiting for one (accept, or the end
                                    of the previous reply): slow clients cannot hold it. Replies
                                    and streams are not limited by it. Default 60 */
    unsigned max_connections;    /* open client connections; one more is accepted and closed at
                                    once, without a reply. Exact across io threads. Default 4096 */
    unsigned heartbeat_ms;       /* stream poke interval; default 5000 */
    size_t sndbuf_bytes;         /* SO_SNDBUF of every client connection: caps what the kernel
                                    queues for a client that reads slowly or not at all, so a
                                    stream's producer is held back (and a stalled reader noticed)
                                    after about this much. Linux doubles it for its bookkeeping
                                    and caps the request at net.core.wmem_max; setting it turns
                                    the kernel's autotuning off for the connection. Default
                                    256 KiB; 0 = the kernel's autotuning (up to tcp_wmem's max,
                                    4 MiB by default) */
    const char *admin_token;     /* borrowed; NULL/"" = admin routes open */
    const char *const *api_keys; /* borrowed, NULL-terminated; NULL = inference routes open */
    const cg_http_route *routes; /* borrowed, n_routes entries, must outlive the server */
    size_t n_routes;
    const cg_http_fast_handler *fast; /* borrowed, NULL or n_routes entries: routes[i]'s fast
                                         handler or NULL; saves the job-pool hop for what it
                                         can take */
    void *app;                        /* passed to handlers and done */
    cg_http_done_fn done;
    int no_framing_check; /* 1: leave the raw request framing to libmicrohttpd alone (its
                             own HTML errors, no RFC 9112 strictness); for tests that show
                             what the library does. Default 0: checked (base/http_frame.h) */
} cg_http_params;

cg_http_params cg_http_default_params(void);

/* Connection counters since start. */
typedef struct cg_http_stats {
    size_t connections;         /* open now */
    uint64_t accepted;          /* connections admitted */
    uint64_t refused;           /* closed at accept: max_connections open */
    uint64_t timed_out;         /* closed for not delivering a request within conn_timeout_s */
    uint64_t headers_too_large; /* 431 answered by our header count */
    uint64_t malformed;         /* refused by the framing check (400, 413, 414, 501, 505) */
    uint64_t lingered;          /* connections closed with a lingering close */
} cg_http_stats;

/* Starts listening and serving. *out is owned by the caller (cg_http_close). */
cg_status cg_http_open(const cg_http_params *p, cg_http_server **out) CG_WUR;
/* The bound port (useful with port 0). */
uint16_t cg_http_port(const cg_http_server *s);
/* Stops taking new connections (each is closed as soon as it is accepted, so its client
 * fails at once); requests already accepted go on. For a graceful stop: quiesce, let work drain,
 * then cg_http_close. */
void cg_http_quiesce(cg_http_server *s);
/* Stops accepting, waits for in-flight handlers (up to a few seconds), frees. NULL-safe. */
void cg_http_close(cg_http_server **s);
/* Fills *out with the connection counters. */
void cg_http_get_stats(cg_http_server *s, cg_http_stats *out);

/* ---- request accessors (borrowed pointers valid until the reply) ---- */
const char *cg_http_req_method(const cg_http_req *r);
const char *cg_http_req_path(const cg_http_req *r);
/* The i-th "*" segment of the matched pattern (URL-decoded), or NULL. */
const char *cg_http_req_param(const cg_http_req *r, unsigned i);
/* Query-string argument or NULL. */
const char *cg_http_req_query(cg_http_req *r, const char *name);
/* Request header (case-insensitive) or NULL. */
const char *cg_http_req_header(cg_http_req *r, const char *name);
const char *cg_http_req_body(const cg_http_req *r, size_t *len);
/* Hands the body over (NUL-terminated, caller frees), e.g. to forward it unchanged; the request
 * keeps an empty one. */
char *cg_http_req_take_body(cg_http_req *r, size_t *len);
/* Frees the body once it is parsed and no longer needed (a large one would otherwise live
 * until the reply is sent). */
void cg_http_req_drop_body(cg_http_req *r);
/* The request id: the client's X-Request-Id when it is sane, else a generated one. */
const char *cg_http_req_id(const cg_http_req *r);
/* The bearer token the request presented, without the whitespace around it (borrowed from r),
 * or NULL. */
const char *cg_http_req_bearer(cg_http_req *r);
/* How the request was authorised (see the route flags). */
cg_http_caller cg_http_req_caller(const cg_http_req *r);
/* The index in params.api_keys of the key the request presented, or -1. */
int cg_http_req_api_key(const cg_http_req *r);
/* Per-request user data for the handler's own state (not freed by the server). */
void cg_http_req_set_data(cg_http_req *r, void *data);
void *cg_http_req_data(const cg_http_req *r);

/* Parses the body as a JSON object within params.max_json_values / max_json_depth, refusing
 * duplicate keys (cg_json_parse_object). On failure replies 400 itself and returns NULL.
 * The caller owns the returned reference. */
json_t *cg_http_req_json(cg_http_req *r);
/* 1 when the client has closed its side of the connection (or it failed) while the request
 * is handled: long work for it (tokenizing a huge prompt) may stop. Cheap: one poll. A client
 * that half-closes after its request counts as gone. Only before the reply. */
int cg_http_req_client_left(cg_http_req *r);
/* The status of a reply nobody reads because its client left (nginx's "client closed
 * request"), as counted and logged for a request left without any reply: not a 5xx, and
 * logged at info level. */
#define CG_HTTP_CLIENT_GONE 499

/* 1 once the server saw the client of r leave while r waited for its reply (checked at each
 * heartbeat, and at least every second: MHD cannot see it while the connection is parked). A client
 * that closes its sending side after the request counts as gone. Any thread may ask until r is
 * replied; the reply still has to be made (it goes nowhere). */
int cg_http_req_gone(const cg_http_req *r);

/* ---- replies: exactly one per request ---- */
/* Adds a response header to the coming reply (copied). */
void cg_http_add_header(cg_http_req *r, const char *name, const char *value);
/* Replies with body json (reference taken over) and the given status. */
void cg_http_reply_json(cg_http_req *r, int status, json_t *body);
/* Replies with raw bytes (copied). */
void cg_http_reply_raw(cg_http_req *r, int status, const char *content_type, const void *data,
                       size_t len);
/* Replies with the OpenAI error shape {"error":{"message","type","param","code"}}, status from
 * cg_status_http(st). message NULL uses the table's message; param may be NULL. */
void cg_http_reply_error(cg_http_req *r, cg_status st, const char *param, const char *message);
/* Same, with an explicit HTTP status (e.g. the status an upstream returned). */
void cg_http_reply_error_status(cg_http_req *r, int http, cg_status st, const char *param,
                                const char *message);
/* Replies with a stream; the reply takes its own reference (the caller keeps its own). */
void cg_http_reply_stream(cg_http_req *r, int status, const char *content_type, cg_stream *s);

/* Builds the OpenAI error object (new reference). */
json_t *cg_http_error_json(cg_status st, const char *param, const char *message);

/* ---- streams ---- */
/* New stream with one reference for the caller. max_buffered caps the bytes queued and not
 * yet sent (a slow client makes cg_stream_push wait rather than grow memory without bound).
 * heartbeat: bytes written when a poke finds it idle, e.g. ": keep-alive\n\n"; NULL = none. */
cg_stream *cg_stream_new(size_t max_buffered, const char *heartbeat);
cg_stream *cg_stream_ref(cg_stream *s);
void cg_stream_unref(cg_stream **s);
/* Queues bytes. Blocks while the buffer is full. Returns 0, or -1 once the client is gone
 * (the producer should then cancel its upstream work). */
int cg_stream_push(cg_stream *s, const void *data, size_t len);
/* Bounds how long cg_stream_push waits for a reader that takes nothing: once stall_ms pass
 * with the buffer full and not one byte read, the stream is cut (the connection is reset,
 * the client counts as gone) and the push returns -1. 0 (the default) waits forever. */
void cg_stream_set_stall_timeout(cg_stream *s, int stall_ms);
/* 1 when the stream was cut by the stall timeout. */
int cg_stream_stalled(cg_stream *s);
/* Marks the end: the reply completes once the queued bytes are sent. */
void cg_stream_close(cg_stream *s);
/* 1 once the client is gone or the server is stopping. */
int cg_stream_cancelled(cg_stream *s);

/* Non-blocking producer side, for a producer that must never wait (the curl multi thread
 * serves every upstream at once, so one slow client must not stall it).
 * cg_stream_writable: 1 while fewer than max_buffered bytes are queued; 0 when the queue is
 * full, and then the notify callback fires (gone = 0) once it has drained below half;
 * -1 once the client is gone. */
int cg_stream_writable(cg_stream *s);
/* Queues all len bytes without waiting; the queue may exceed max_buffered by this call's
 * bytes (check cg_stream_writable first). Returns 0, or -1 once the client is gone. */
int cg_stream_push_nowait(cg_stream *s, const void *data, size_t len);
/* Registers fn(arg, gone): gone = 0 when the queue drained (see cg_stream_writable), gone = 1
 * once when the client goes away or the server stops. fn runs on a server thread with the
 * stream's lock held: it must be quick, must not block and must not call cg_stream_* on s.
 * fn NULL removes it; once this returns, the previous fn is not running and will not run
 * again. If the client is already gone, fn(arg, 1) runs before this returns. */
void cg_stream_set_notify(cg_stream *s, void (*fn)(void *arg, int gone), void *arg);

#endif
