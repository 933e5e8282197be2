/* Upstream relay: forwards a request to the backend through the curl multi thread and relays
 * the answer. Non-streamed answers are collected in a capped buffer and re-sent with
 * chunk_cache added. Streamed answers (SSE) are parsed event by event and pushed to the
 * client as they arrive: the first data event gains chunk_cache, the others pass through byte
 * for byte, and the gateway ends the stream with "data: [DONE]". A worker's own chunk_cache
 * (its quality comparison, which comes after the last token) is merged into the gateway's.
 * A slow client pauses the upstream transfer; a client that leaves cancels it. */
#include "server/relay.h"

#include <stdio.h>
#include <string.h>
#include "backends/sse.h"
#include "cache/chatreq.h"
#include "backends/worker_client.h"
#include "server/statuspage.h"

/* Queued SSE bytes per stream before the upstream is paused. */
#define STREAM_MAX_BUFFERED (256u * 1024u)

typedef enum { RELAY_INFER, RELAY_MODELS } relay_kind;

typedef struct relay {
    cg_gateway *g;
    int strip_usage;       /* drop usage from streamed events (counted, not asked for) */
    json_t *pending_usage; /* usage that rode on a choice chunk: sent last, in its own chunk */
    relay_kind kind;
    cg_http_req *req; /* NULL once replied */
    char rid[72];     /* for log lines from the multi thread */
    const char *route;
    char model[128]; /* for the status page */
    int want_stream;
    json_t *chunk_cache; /* owned reference; NULL for models */
    cg_upstream_xfer *xfer;
    uint64_t start_ns;

    /* Target (cg_gw_target), copied. */
    int to_chat;
    long long cached_tokens; /* >= 0: forced into usage */
    int count_usage;
    cg_worker *worker; /* owned reference, released at the end */
    char assembly[33]; /* "" = none */
    int backend_is_worker;
    int to_worker;   /* the upstream is a worker (its key, --worker-api-key) */
    int chat_chunks; /* chat chunks sent (the first carries the role) */

    long status;
    int is_sse;
    cg_buf body; /* non-streamed answer, capped */
    int too_large;

    cg_stream *stream;
    cg_sse_parser *sse;
    int first_data_done;
    int client_gone;
    int sse_error;
    int upstream_error; /* the upstream sent an error event: its answer ended there */
    int saw_done;       /* the upstream's [DONE] came: its answer is whole */
    int ttft_done;
    uint64_t ttft_ns; /* start_ns to the first answer byte */
    size_t events;
} relay;

static void relay_free(relay *r)
{
    cg_workers_release(r->g->workers, &r->worker);
    json_decref(r->chunk_cache);
    json_decref(r->pending_usage);
    cg_buf_free(&r->body);
    cg_sse_free(&r->sse);
    cg_stream_unref(&r->stream);
    cg_upstream_xfer_release(&r->xfer);
    free(r);
}

static void observe_ttft(relay *r)
{
    if (r->ttft_done) return;
    r->ttft_done = 1;
    r->ttft_ns = cg_now_ns() - r->start_ns;
    cg_metric_observe(r->g->m_ttft, (double)r->ttft_ns / 1e9);
}

/* Guarantees usage.prompt_tokens_details.cached_tokens: forced to cached when cached >= 0
 * (the tokens the assembly reused), else the backend's own value or 0. count: add the prompt
 * tokens that were not cached to chunkgate_tokens_computed_total. */
static void fix_usage(cg_gateway *g, json_t *obj, long long cached, int count)
{
    json_t *usage = json_object_get(obj, "usage");
    if (json_is_null(usage)) return; /* streams send "usage": null before the last chunk */
    if (!json_is_object(usage)) {
        usage = json_object();
        json_object_set_new(obj, "usage", usage);
    }
    json_t *det = json_object_get(usage, "prompt_tokens_details");
    if (!json_is_object(det)) {
        det = json_object();
        json_object_set_new(usage, "prompt_tokens_details", det);
    }
    if (cached >= 0)
        json_object_set_new(det, "cached_tokens", json_integer((json_int_t)cached));
    else if (!json_is_integer(json_object_get(det, "cached_tokens")))
        json_object_set_new(det, "cached_tokens", json_integer(0));
    json_t *pt = json_object_get(usage, "prompt_tokens");
    if (count && json_is_integer(pt)) {
        json_int_t n =
            json_integer_value(pt) - json_integer_value(json_object_get(det, "cached_tokens"));
        if (n > 0) cg_metric_add(g->m_computed, (double)n);
    }
}

void cg_gw_fix_usage(cg_gateway *g, json_t *obj)
{
    fix_usage(g, obj, -1, 1);
}

/* What a worker's answer says about its decoding goes into the gateway's chunk_cache (the
 * request's own object): the quality comparison (quality_probe), and on a fallback the
 * recomputed tokens it counted. */
static void merge_chunk_cache(relay *r, json_t *obj)
{
    json_t *wcc = json_object_get(obj, "chunk_cache");
    if (!r->chunk_cache || !json_is_object(wcc)) return;
    json_t *q = json_object_get(wcc, "quality"), *rt = json_object_get(wcc, "recomputed_tokens");
    if (q) json_object_set(r->chunk_cache, "quality", q);
    if (json_is_integer(rt) &&
        !json_is_integer(json_object_get(r->chunk_cache, "recomputed_tokens")))
        json_object_set(r->chunk_cache, "recomputed_tokens", rt);
}

/* ---------------------------------------------------------------- stream side */

/* Stream notifications (MHD thread, stream lock held): only forward them to the multi thread. */
static void on_stream_notify(void *arg, int gone)
{
    relay *r = arg;
    if (gone)
        cg_upstream_xfer_cancel(r->xfer);
    else
        cg_upstream_xfer_resume(r->xfer);
}

static void push(relay *r, const char *p, size_t n)
{
    if (r->client_gone) return;
    if (cg_stream_push_nowait(r->stream, p, n) != 0) r->client_gone = 1;
}

/* Writes one event with data replaced by a JSON object, keeping its event and id fields. */
static void push_json_event(relay *r, const cg_sse_event *ev, json_t *obj)
{
    char *text = json_dumps(obj, JSON_COMPACT); /* one line: JSON escapes newlines */
    cg_buf out;
    cg_buf_init_unbounded(&out); /* text is in memory already; the SSE cap bounded its event */
    cg_status st = CG_OK;
    if (ev->event_len) st = cg_buf_printf(&out, "event: %.*s\n", (int)ev->event_len, ev->event);
    if (st == CG_OK && ev->has_id) st = cg_buf_printf(&out, "id: %.*s\n", (int)ev->id_len, ev->id);
    if (st == CG_OK) st = cg_buf_printf(&out, "data: %s\n\n", text);
    (void)st;
    push(r, out.data, out.len);
    cg_buf_free(&out);
    free(text);
}

/* A chunk of its own for usage: the chunk's id, object, created, model and
 * system_fingerprint, no choice. New reference. */
static json_t *usage_chunk(json_t *chunk, json_t *usage)
{
    json_t *u = json_object();
    const char *keep[] = {"id", "object", "created", "model", "system_fingerprint"};
    for (size_t i = 0; i < CG_ARRAY_LEN(keep); i++) {
        json_t *v = json_object_get(chunk, keep[i]);
        if (v) json_object_set(u, keep[i], v);
    }
    json_object_set_new(u, "choices", json_array());
    json_object_set(u, "usage", usage);
    return u;
}

static void on_event(void *arg, const cg_sse_event *ev)
{
    relay *r = arg;
    if (r->client_gone) return;
    if (ev->has_data && ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6)) {
        r->saw_done = 1;
        return; /* the gateway writes its own [DONE] once the upstream has ended cleanly */
    }
    json_t *obj = NULL;
    if (ev->has_data) {
        /* Parse only the events we change: the first data event and usage chunks (every
         * event when it is converted to the chat shape). */
        int want = r->to_chat || !r->first_data_done ||
                   memmem(ev->data, ev->data_len, "\"usage\"", 7) ||
                   memmem(ev->data, ev->data_len, "\"chunk_cache\"", 13) ||
                   memmem(ev->data, ev->data_len, "\"error\"", 7);
        if (want) obj = json_loadb(ev->data, ev->data_len, 0, NULL);
        if (obj && !json_is_object(obj)) {
            json_decref(obj);
            obj = NULL;
        }
    }
    if (obj) {
        /* an error event (a worker or vLLM whose decoding failed): relayed, and the stream
         * then ends without [DONE], whatever the upstream sends after it */
        if (json_is_object(json_object_get(obj, "error")) && !json_object_get(obj, "choices"))
            r->upstream_error = 1;
        if (r->to_chat && !json_object_get(obj, "error"))
            cg_chat_answer_shape(obj, 1, r->chat_chunks++ == 0);
        int upstream_cc = json_object_get(obj, "chunk_cache") != NULL;
        merge_chunk_cache(r, obj);
        if ((!r->first_data_done || upstream_cc) && r->chunk_cache) {
            json_object_set(obj, "chunk_cache", r->chunk_cache);
            r->first_data_done = 1;
        }
        if (json_object_get(obj, "usage")) fix_usage(r->g, obj, r->cached_tokens, r->count_usage);
        json_t *usage = json_object_get(obj, "usage");
        json_t *choices = json_object_get(obj, "choices");
        int usage_only =
            json_is_array(choices) && json_array_size(choices) == 0 && json_is_object(usage);
        if (usage_only && r->pending_usage) json_decref(r->pending_usage), r->pending_usage = NULL;
        if (json_is_object(usage) && !usage_only) {
            /* Usage riding on a choice chunk: OpenAI sends it in a final chunk of its own with
             * "choices": [], and "usage": null on the others. */
            if (!r->strip_usage) {
                json_decref(r->pending_usage);
                r->pending_usage = usage_chunk(obj, usage);
                json_object_set_new(obj, "usage", json_null());
            } else {
                json_object_del(obj, "usage");
            }
        } else if (r->strip_usage) {
            json_object_del(obj, "usage");
        }
        if (!(r->strip_usage && usage_only)) push_json_event(r, ev, obj);
        json_decref(obj);
    } else {
        push(r, ev->raw, ev->raw_len);
    }
    if (ev->has_data) {
        r->events++;
        observe_ttft(r);
    }
}

/* ---------------------------------------------------------------- upstream callbacks */

static int on_head(void *arg, long status, const char *ct)
{
    relay *r = arg;
    r->status = status;
    r->is_sse = r->kind == RELAY_INFER && r->want_stream && status >= 200 && status < 300 && ct &&
                !strncasecmp(ct, "text/event-stream", 17);
    if (!r->is_sse) return CG_UPSTREAM_CONTINUE;
    r->stream = cg_stream_new(STREAM_MAX_BUFFERED, ": keep-alive\n\n");
    r->sse = cg_sse_new(cg_sse_default_params());
    cg_http_add_header(r->req, "X-Accel-Buffering", "no"); /* ask proxies not to buffer */
    cg_http_reply_stream(r->req, (int)status, "text/event-stream", r->stream);
    r->req = NULL; /* replied: the request may be freed from now on */
    cg_stream_set_notify(r->stream, on_stream_notify, r);
    return CG_UPSTREAM_CONTINUE;
}

static int on_body(void *arg, const char *data, size_t len)
{
    relay *r = arg;
    if (!r->is_sse) {
        if (cg_buf_append(&r->body, data, len) != CG_OK) {
            r->too_large = 1;
            return CG_UPSTREAM_ABORT;
        }
        return CG_UPSTREAM_CONTINUE;
    }
    if (r->client_gone) return CG_UPSTREAM_ABORT;
    int w = cg_stream_writable(r->stream);
    if (w < 0) {
        r->client_gone = 1;
        return CG_UPSTREAM_ABORT;
    }
    if (w == 0) return CG_UPSTREAM_PAUSE; /* the drain notification resumes us */
    if (cg_sse_feed(r->sse, data, len, on_event, r) != CG_OK) {
        r->sse_error = 1;
        return CG_UPSTREAM_ABORT;
    }
    return r->client_gone ? CG_UPSTREAM_ABORT : CG_UPSTREAM_CONTINUE;
}

/* Replies to a failed exchange that never started streaming. */
static void reply_failure(relay *r, cg_status st, long http, const char *detail)
{
    cg_gateway *g = r->g;
    char msg[512];
    cg_failkind k = r->too_large                      ? CG_FAIL_TOO_LARGE
                    : st == CG_E_TIMEOUT              ? CG_FAIL_TIMEOUT
                    : st == CG_E_UNAVAILABLE && !http ? CG_FAIL_CONNECT
                                                      : CG_FAIL_INVALID;
    if (k == CG_FAIL_TOO_LARGE)
        snprintf(msg, sizeof msg, "the backend's answer is larger than %zu bytes",
                 g->cfg->max_upstream_bytes);
    else if (k == CG_FAIL_TIMEOUT)
        snprintf(msg, sizeof msg, "the backend timed out: %s", detail);
    else if (k == CG_FAIL_CONNECT)
        snprintf(msg, sizeof msg, "the backend is unreachable: %s", detail);
    else
        snprintf(msg, sizeof msg, "the backend's answer was cut or invalid: %s", detail);
    cg_gw_backend_error(g, k);
    cg_http_reply_error_status(r->req, cg_failkind_http(k), cg_failkind_status(k), NULL, msg);
}

/* A complete non-streamed answer: add chunk_cache and relay it, or turn a bad one into 502. */
static void reply_answer(relay *r)
{
    cg_gateway *g = r->g;
    json_t *obj = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
    int ok = r->status >= 200 && r->status < 300;
    char msg[256];
    if (ok && json_is_object(obj)) {
        if (r->to_chat) cg_chat_answer_shape(obj, 0, 1);
        merge_chunk_cache(r, obj);
        if (r->chunk_cache) json_object_set(obj, "chunk_cache", r->chunk_cache);
        fix_usage(g, obj, r->cached_tokens, r->count_usage);
        observe_ttft(r);
        cg_http_reply_json(r->req, (int)r->status, obj);
        return;
    }
    if (ok) {
        json_decref(obj);
        cg_gw_backend_error(g, CG_FAIL_INVALID);
        snprintf(msg, sizeof msg,
                 "the backend answered HTTP %ld with a body that is not a JSON object", r->status);
        cg_http_reply_error_status(r->req, cg_failkind_http(CG_FAIL_INVALID),
                                   cg_failkind_status(CG_FAIL_INVALID), NULL, msg);
        return;
    }
    /* The upstream refused the gateway's own credentials (--backend-api-key, or
     * --worker-api-key for a worker): not the client's key, whatever the message says (a
     * client's key is never sent upstream). Other refusals, such as a worker's 403 for a KV
     * source it does not trust, are relayed as they came. */
    if (r->status == 401) {
        json_decref(obj);
        cg_gw_backend_error(g, CG_FAIL_STATUS);
        snprintf(msg, sizeof msg,
                 "the upstream refused the gateway's credentials (HTTP 401); check %s",
                 r->to_worker ? "--worker-api-key" : "--backend-api-key");
        cg_http_reply_error(r->req, CG_E_BAD_GATEWAY, NULL, msg);
        return;
    }
    /* A 4xx is usually the client's mistake (unknown model, bad parameter) reported by the
     * backend: relayed, but not counted as a backend failure. */
    if (r->status >= 500) cg_gw_backend_error(g, CG_FAIL_STATUS);
    if (json_is_object(obj) && json_is_object(json_object_get(obj, "error"))) {
        /* The backend's own error in OpenAI shape: relay it with its status. A 429 keeps
         * telling the client when to come back (the upstream's own header is not kept). */
        if (r->status == 429) cg_http_add_header(r->req, "Retry-After", "1");
        cg_http_reply_json(r->req, (int)r->status, obj);
        return;
    }
    json_decref(obj);
    if (r->status < 500) cg_gw_backend_error(g, CG_FAIL_STATUS);
    snprintf(msg, sizeof msg, "the backend answered HTTP %ld without an OpenAI error object",
             r->status);
    cg_http_reply_error_status(r->req, cg_failkind_http(CG_FAIL_STATUS),
                               cg_failkind_status(CG_FAIL_STATUS), NULL, msg);
}

/* /v1/models: the backend's list when it has one, else the configured --model, else 503. */
static void reply_models(relay *r, cg_status st)
{
    cg_gateway *g = r->g;
    if (st == CG_OK && r->status == 200) {
        json_t *obj = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
        if (json_is_object(obj) && json_is_array(json_object_get(obj, "data"))) {
            cg_http_reply_json(r->req, 200, obj);
            return;
        }
        json_decref(obj);
    }
    if (g->cfg->model) {
        cg_http_reply_json(r->req, 200,
                           json_pack("{s:s, s:[{s:s, s:s, s:i, s:s}]}", "object", "list", "data",
                                     "id", g->cfg->model, "object", "model", "created", 0,
                                     "owned_by", "chunkgate"));
        return;
    }
    cg_gw_backend_error(g, st == CG_OK ? CG_FAIL_STATUS : cg_failkind_of(st, CG_FAIL_CONNECT));
    cg_http_reply_error(r->req, CG_E_UNAVAILABLE, NULL,
                        "the backend's model list is unavailable and no --model is configured");
}

/* After the exchange: an assembly the backend did not consume is released on its worker at
 * once (the worker's ttl would hold its pool references for a minute), and a worker that
 * served as the backend and failed is reported. */
static void finish_target(relay *r, cg_status st, const char *detail)
{
    cg_gateway *g = r->g;
    int ok = st == CG_OK && r->status >= 200 && r->status < 300 && !r->client_gone &&
             !r->sse_error && !r->upstream_error;
    if (r->worker && r->backend_is_worker && st != CG_OK && !r->client_gone &&
        strcmp(detail, "cancelled") != 0) {
        cg_workers_error(g->workers, r->worker,
                         st == CG_E_TIMEOUT                     ? CG_FAIL_TIMEOUT
                         : st == CG_E_UNAVAILABLE && !r->status ? CG_FAIL_CONNECT
                         : r->is_sse                            ? CG_FAIL_STREAM
                                                                : CG_FAIL_INVALID,
                         detail);
    } else if (r->worker && r->backend_is_worker && st == CG_OK && r->status >= 500) {
        /* the worker answered its completion with a server error: its failure too, as a
         * failed assemble is, not only the backend's */
        char why[96];
        snprintf(why, sizeof why, "the completion answered HTTP %ld", r->status);
        cg_workers_error(g->workers, r->worker, CG_FAIL_STATUS, why);
    }
    if (r->assembly[0] && r->worker && !(ok && r->backend_is_worker)) {
        cg_wc_release(g->client, cg_worker_url(r->worker), r->assembly, r->rid);
        cg_metric_add(g->m_releases, 1);
    }
    /* Out of the worker's load before the client sees the end: its next request must not be
     * routed as if this one were still running. */
    cg_workers_release(g->workers, &r->worker);
}

/* One line in the status page's recent requests. The status is the one the client got:
 * the upstream's, or what reply_failure answers for a failed exchange. */
static void record_status(relay *r, cg_status st)
{
    int status = r->is_sse || st == CG_OK ? (int)r->status : st == CG_E_TIMEOUT ? 504 : 502;
    cg_recent_rec rec = {.route = r->route,
                         .model = r->model[0] ? r->model : NULL,
                         .status = status ? status : 502,
                         .cached_tokens = r->cached_tokens,
                         .ttft_ms = r->ttft_done ? (double)r->ttft_ns / 1e6 : -1,
                         .chunk_cache = r->chunk_cache};
    cg_recent_ring_add(r->g->recent, &rec);
}

static void on_done(void *arg, cg_status st, long http, const char *detail)
{
    relay *r = arg;
    cg_gateway *g = r->g;
    cg_log_set_request_id(r->rid);
    finish_target(r, st, detail);
    if (r->is_sse) {
        int partial = cg_sse_finish(r->sse);
        cg_stream_set_notify(r->stream, NULL, NULL);
        if (r->client_gone || (st == CG_E_UNAVAILABLE && !strcmp(detail, "cancelled"))) {
            cg_metric_add(g->m_disconnects, 1);
            cg_log(CG_LOG_INFO, "client left after %zu events; upstream cancelled", r->events);
        } else if (st == CG_OK && r->upstream_error) {
            /* its error event went out as it came: no [DONE] after it */
            cg_gw_backend_error(g, CG_FAIL_STREAM);
            cg_log(CG_LOG_WARN, "the backend's stream ended with an error event after %zu events",
                   r->events);
        } else if (st == CG_OK && !r->sse_error && r->saw_done && !partial) {
            if (r->pending_usage) {
                cg_sse_event none = {0};
                push_json_event(r, &none, r->pending_usage);
            }
            push(r, "data: [DONE]\n\n", 14);
        } else {
            /* The answer was cut: say so in the stream (OpenAI clients raise on an error
             * event) and end it without [DONE], so no client takes it for complete. */
            char m[512];
            snprintf(m, sizeof m, "the backend's stream failed after %zu events: %s", r->events,
                     r->sse_error  ? "an event exceeded the size limit"
                     : st != CG_OK ? detail
                     : partial     ? "it ended inside an event"
                                   : "it ended without [DONE]");
            cg_gw_backend_error(g, CG_FAIL_STREAM);
            cg_log(CG_LOG_WARN, "%s", m);
            json_t *err =
                cg_http_error_json(st == CG_E_TIMEOUT ? CG_E_TIMEOUT : CG_E_BAD_GATEWAY, NULL, m);
            char *text = json_dumps(err, JSON_COMPACT);
            cg_buf out;
            cg_buf_init_unbounded(&out); /* an error object around m's 512 bytes */
            cg_status bst = cg_buf_printf(&out, "data: %s\n\n", text);
            (void)bst;
            push(r, out.data, out.len);
            cg_buf_free(&out);
            free(text);
            json_decref(err);
        }
        cg_stream_close(r->stream);
    } else if (r->kind == RELAY_MODELS) {
        reply_models(r, st);
    } else if (r->client_gone) {
        /* Nobody reads this answer, but the parked request still needs one to end. */
        cg_metric_add(g->m_disconnects, 1);
        cg_http_reply_error_status(r->req, CG_HTTP_CLIENT_GONE, CG_E_UNAVAILABLE, NULL,
                                   "the client left; upstream cancelled");
    } else if (st != CG_OK) {
        reply_failure(r, st, http, detail);
    } else {
        reply_answer(r);
    }
    if (r->kind == RELAY_INFER) record_status(r, st);
    cg_log_set_request_id(NULL);
    relay_free(r);
}

/* ---------------------------------------------------------------- entry points */

/* Polled by the multi thread: the client of a request not yet replied to has left (a
 * non-streamed answer, or a stream whose upstream has not answered yet: no write can fail
 * for it). Once streaming, the stream's own notification cancels instead. */
static int on_gone(void *arg)
{
    relay *r = arg;
    if (!r->req || !cg_http_req_gone(r->req)) return 0;
    if (!r->client_gone) {
        cg_log_set_request_id(r->rid);
        cg_log(CG_LOG_INFO, "client left before the answer; upstream cancelled");
        cg_log_set_request_id(NULL);
    }
    r->client_gone = 1;
    return 1;
}

static const cg_upstream_handlers HANDLERS = {on_head, on_body, on_done, on_gone};

static relay *relay_new(cg_gateway *g, cg_http_req *req, relay_kind kind, const char *route)
{
    relay *r = cg_calloc(1, sizeof *r);
    r->g = g;
    r->kind = kind;
    r->req = req;
    r->route = route;
    r->start_ns = cg_now_ns();
    snprintf(r->rid, sizeof r->rid, "%s", cg_http_req_id(req));
    cg_buf_init(&r->body, g->cfg->max_upstream_bytes);
    return r;
}

void cg_gw_relay_to(cg_gateway *g, cg_http_req *req, const cg_gw_target *t, char *body,
                    size_t body_len, int stream, json_t *chunk_cache)
{
    relay *r = relay_new(g, req, RELAY_INFER, t->route);
    r->want_stream = stream;
    r->chunk_cache = chunk_cache;
    if (t->model) snprintf(r->model, sizeof r->model, "%s", t->model);
    r->to_chat = t->to_chat;
    r->cached_tokens = t->cached_tokens;
    r->count_usage = t->count_usage;
    r->worker = t->worker;
    r->backend_is_worker = t->backend_is_worker;
    r->to_worker = t->to_worker;
    r->strip_usage = t->strip_usage;
    if (t->assembly_id) snprintf(r->assembly, sizeof r->assembly, "%s", t->assembly_id);
    cg_upstream_req q = {.base = t->base,
                         .method = "POST",
                         .path = t->path,
                         .body = body,
                         .body_len = body_len,
                         .request_id = r->rid,
                         .to_worker = t->to_worker};
    if (cg_upstream_submit_req(g->client, &q, &HANDLERS, r, &r->xfer) != CG_OK) {
        cg_http_reply_error(req, CG_E_UNAVAILABLE, NULL, "the gateway is stopping");
        if (r->assembly[0] && r->worker)
            cg_wc_release(g->client, cg_worker_url(r->worker), r->assembly, r->rid);
        relay_free(r);
    }
}

void cg_gw_relay(cg_gateway *g, cg_http_req *req, const char *route, const char *path, char *body,
                 size_t body_len, int stream, json_t *chunk_cache)
{
    cg_gw_target t = {.route = route, .path = path, .cached_tokens = -1, .count_usage = 1};
    cg_gw_relay_to(g, req, &t, body, body_len, stream, chunk_cache);
}

/* /v1/models comes from --backend, else from a healthy worker. */
void cg_gw_models(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    relay *r = relay_new(g, req, RELAY_MODELS, "models");
    cg_upstream_req q = {.method = "GET", .path = "/v1/models", .request_id = r->rid};
    if (!g->has_backend) {
        r->worker = cg_workers_pick_any(g->workers, NULL, 0);
        q.base = r->worker ? cg_worker_url(r->worker) : NULL;
        q.to_worker = 1;
    }
    if ((!g->has_backend && !r->worker) ||
        cg_upstream_submit_req(g->client, &q, &HANDLERS, r, NULL) != CG_OK) {
        reply_models(r, CG_E_UNAVAILABLE);
        relay_free(r);
    }
}
