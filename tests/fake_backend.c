/* fake_backend: a small OpenAI-compatible backend for the gateway's integration tests. It
 * stands in for the outside world only: deterministic answers derived from the request (so a
 * test can check what was forwarded), real SSE streamed with delays between events, fault
 * modes chosen by a magic word in the prompt, and counters (GET /stats) that show whether a
 * stream was cut early by its client.
 *
 *   fake_backend [--port N] [--events N] [--delay-ms MS]     prints "PORT <n>" on stdout
 *
 * Magic words in the prompt (or in any chat message content):
 *   FAULT:500         500 with an OpenAI error object      FAULT:TEXT500  500 with text/plain
 *   FAULT:401         401 invalid_api_key, as a backend that refuses the gateway's key
 *   FAULT:BADJSON     200 with a body that is not JSON      FAULT:STALL:ms wait ms before answering
 *   FAULT:CLOSE       stream: close the connection after 2 events
 *   FAULT:BIG:n       non-stream answer padded by n bytes   FAULT:SLOW     stream 60 events
 *   FAULT:CRLF        stream with CRLF line ends            FAULT:EVENTS:n stream n events
 *   FAULT:MIDSTALL:ms stream: wait ms after 2 events      FAULT:RST      stream: TCP reset after 2
 *   FAULT:BADSSE      stream: the first event's data is not JSON, then a line without a colon,
 *                     an unknown field and a bad retry, then the normal events
 *   FAULT:HUGESSE:n   stream: after 1 event, one data line of n bytes
 *   FAULT:USAGELAST   stream: usage (when asked for) rides on the last choice chunk instead of
 *                     a chunk of its own, as some backends send it
 *   FAULT:WORKERCC    non-stream answer with a chunk_cache of its own, as a chunkgate worker
 *                     answers ({"recomputed_tokens":7,"quality":{"kl":0.5}})
 *   FAULT:ERRDONE     stream: an error event after 2 events, then [DONE]
 *   FAULT:NODONE      stream: the body ends cleanly after the events, without [DONE]
 *
 *   --worker-info FILE  also stand in for a worker in front of which a proxy is overloaded:
 *                     GET /v1/info answers FILE's JSON (a real worker's, maybe edited), GET
 *                     /v1/chunks an empty inventory, and POST /v1/assemble 429 in text/plain.
 *
 *   POST /control/healthz-stall?ms=MS&count=N  the next N answers to GET /healthz wait MS ms
 *                     first (a worker slow to answer its health checks).
 *   POST /control/assemble-stall?ms=MS  the next POST /v1/assemble waits MS ms before its 429
 *                     (a worker computing a cold prompt); a caller that hangs up meanwhile is
 *                     seen at once and counted in /stats as assembles_abandoned.
 * Libmicrohttpd is used directly (thread per connection, so a stream can simply sleep). */
#include <arpa/inet.h>
#include <sys/socket.h>
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness/harness.h"

#if MHD_VERSION >= 0x00097002
#define MHD_RESULT enum MHD_Result
#else
#define MHD_RESULT int
#endif

static int n_events = 5;
static int delay_ms = 100;
static char *worker_info; /* --worker-info: the file's JSON, NULL when not a worker stand-in */

static pthread_mutex_t stats_mu = PTHREAD_MUTEX_INITIALIZER;
static long st_requests, st_assembles, st_streams_started, st_streams_completed, st_streams_aborted;
static long st_active_streams;
static long healthz_stall_ms, healthz_stalls; /* POST /control/healthz-stall */
static long assemble_stall_ms;                /* POST /control/assemble-stall */
static long st_assembles_abandoned;

typedef struct conn {
    char *body;
    size_t len;
    int is_stream;
    int stream_done;
} conn;

typedef struct stream {
    conn *c;
    struct MHD_Connection *mc;
    int chat, crlf, close_after, stall_ms, events, usage, i, phase;
    int midstall_ms, rst, badsse, usage_last, errdone, nodone;
    long huge, huge_sent; /* FAULT:HUGESSE: bytes of the long line, sent so far */
    char *model;
    json_t *fake; /* echo object for the first event */
    long prompt_len;
} stream;

/* The magic word's numeric argument, or -1 when the word is absent. */
static long magic(const char *text, const char *word)
{
    const char *p = text ? strstr(text, word) : NULL;
    if (!p) return -1;
    p += strlen(word);
    return *p == ':' ? strtol(p + 1, NULL, 10) : 0;
}

static MHD_RESULT reply(struct MHD_Connection *c, unsigned status, const char *ct, const char *body)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", ct);
    MHD_RESULT ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static MHD_RESULT reply_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    MHD_RESULT ret = reply(c, status, "application/json", s);
    free(s);
    return ret;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *s = cls;
    const char *nl = s->crlf ? "\r\n" : "\n";
    if (s->phase == 2) {
        s->c->stream_done = 1;
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (s->huge > 0 && s->i == 1 && s->huge_sent < s->huge + 8) {
        /* One endless-looking data line, sent as fast as the reader takes it. */
        size_t n = 0;
        if (s->huge_sent == 0) {
            memcpy(buf, "data: ", 6);
            n = 6;
        }
        while (n < max && s->huge_sent + (long)n < s->huge + 6)
            buf[n++] = 'x';
        s->huge_sent += (long)n;
        if (s->huge_sent >= s->huge + 6 && n + 2 <= max) {
            buf[n++] = '\n';
            buf[n++] = '\n';
            s->huge_sent = s->huge + 8;
        }
        return (ssize_t)n;
    }
    if (s->i == 0 && s->phase == 0)
        th_sleep_ms(s->stall_ms > 0 ? s->stall_ms : 0);
    else
        th_sleep_ms(delay_ms);
    if (s->midstall_ms && s->i == 2 && s->phase == 0) {
        th_sleep_ms(s->midstall_ms);
        s->midstall_ms = 0;
    }
    if (s->rst && s->i >= 2) {
        /* SO_LINGER 0: closing sends a TCP RST instead of a FIN */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(s->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct linger lg = {1, 0};
        if (ci) setsockopt(ci->connect_fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        if (ci) shutdown(ci->connect_fd, SHUT_RD);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (s->badsse && s->i == 0 && s->phase == 0) {
        s->badsse = 0;
        int n = snprintf(buf, max,
                         "data: {\"id\": \"cmpl-fake\", not json%s%sthis line has no colon%s"
                         "weird-field: 1%sretry: soon%s%s",
                         nl, nl, nl, nl, nl, nl);
        return n > 0 && (size_t)n < max ? n : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (s->close_after && s->i >= s->close_after) return MHD_CONTENT_READER_END_WITH_ERROR;
    char *data = NULL;
    if (s->errdone && s->i == 2 && s->phase == 0) {
        /* decoding failed upstream: an error event, then [DONE], as a worker and vLLM send */
        data = strdup("{\"error\": {\"message\": \"a decode step failed\", \"type\": "
                      "\"server_error\", \"param\": null, \"code\": \"internal_error\"}}");
        s->i = s->events;
        s->phase = 1;
    } else if (s->nodone && s->i >= s->events) {
        s->c->stream_done = 1; /* a clean end of the body without [DONE] */
        return MHD_CONTENT_READER_END_OF_STREAM;
    } else if (s->i < s->events) {
        char text[32];
        snprintf(text, sizeof text, "tok%d ", s->i);
        json_t *ev;
        if (s->chat)
            ev = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:{s:s, s:s}, s:n}]}", "id",
                           "chatcmpl-fake", "object", "chat.completion.chunk", "created",
                           1700000000, "model", s->model, "choices", "index", 0, "delta", "role",
                           "assistant", "content", text, "finish_reason");
        else
            ev = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:s, s:n}]}", "id", "cmpl-fake", "object",
                           "text_completion", "created", 1700000000, "model", s->model, "choices",
                           "index", 0, "text", text, "finish_reason");
        if (s->i == 0) json_object_set(ev, "fake", s->fake);
        if (s->usage) json_object_set_new(ev, "usage", json_null());
        if (s->usage && s->usage_last && s->i == s->events - 1) {
            json_object_set_new(ev, "usage",
                                json_pack("{s:i, s:i, s:i}", "prompt_tokens", (int)s->prompt_len,
                                          "completion_tokens", s->events, "total_tokens",
                                          (int)s->prompt_len + s->events));
            s->phase = 1; /* no chunk of its own */
        }
        data = json_dumps(ev, JSON_COMPACT);
        json_decref(ev);
        s->i++;
    } else if (s->phase == 0 && s->usage) {
        json_t *ev = json_pack("{s:s, s:s, s:[], s:{s:i, s:i, s:i}}", "id", "cmpl-fake", "object",
                               s->chat ? "chat.completion.chunk" : "text_completion", "choices",
                               "usage", "prompt_tokens", (int)s->prompt_len, "completion_tokens",
                               s->events, "total_tokens", (int)s->prompt_len + s->events);
        data = json_dumps(ev, JSON_COMPACT);
        json_decref(ev);
        s->phase = 1;
    } else {
        data = strdup("[DONE]");
        s->phase = 2;
    }
    /* One event per call, with a comment block after the first one. */
    int n = snprintf(buf, max, "data: %s%s%s%s", data, nl, nl,
                     s->i == 1 && s->phase == 0 ? ": fake comment" : "");
    if (s->i == 1 && s->phase == 0 && (size_t)n < max)
        n += snprintf(buf + n, max - (size_t)n, "%s%s", nl, nl);
    free(data);
    if (n < 0 || (size_t)n >= max) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void stream_free(void *cls)
{
    stream *s = cls;
    json_decref(s->fake);
    free(s->model);
    free(s);
}

static MHD_RESULT handle_infer(struct MHD_Connection *mc, conn *c, int chat)
{
    json_error_t err;
    json_t *req = json_loadb(c->body ? c->body : "", c->len, 0, &err);
    if (!json_is_object(req)) {
        json_decref(req);
        return reply_json(mc, 400,
                          json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
                                    "fake: body is not a JSON object", "type",
                                    "invalid_request_error", "param", "code", "invalid_json"));
    }
    /* The text the fault words and the echo are taken from. */
    const char *text = NULL;
    char *joined = NULL;
    if (!chat) {
        json_t *p = json_object_get(req, "prompt");
        if (json_is_array(p)) p = json_array_get(p, 0);
        text = json_string_value(p);
    } else {
        size_t cap = 1, len = 0, i;
        json_t *m;
        joined = calloc(1, 1);
        json_array_foreach(json_object_get(req, "messages"), i, m)
        {
            const char *ct = json_string_value(json_object_get(m, "content"));
            if (!ct) continue;
            size_t n = strlen(ct);
            if (len + n + 2 > cap) joined = realloc(joined, cap = (len + n + 2) * 2);
            if (len) joined[len++] = '\n';
            memcpy(joined + len, ct, n);
            len += n;
            joined[len] = '\0';
        }
        text = joined;
    }
    if (!text) text = "";
    size_t tlen = strlen(text);
    const char *model = json_string_value(json_object_get(req, "model"));
    if (!model) model = "";

    json_t *fields = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(req, k, v) json_array_append_new(fields, json_string(k));
    size_t head = tlen < 32 ? tlen : 32;
    while (head && head < tlen && ((unsigned char)text[head] & 0xC0) == 0x80)
        head--;
    char fnv[17];
    snprintf(fnv, sizeof fnv, "%016" PRIx64, th_fnv1a(text, tlen));
    const char *rid = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "X-Request-Id");
    const char *auth = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Authorization");
    json_t *fake = json_pack("{s:o, s:I, s:s, s:s%, s:s?, s:s?}", "fields", fields, "prompt_len",
                             (json_int_t)tlen, "prompt_fnv", fnv, "prompt_head", text, head,
                             "request_id", rid, "authorization", auth);
    if (chat) json_object_set(fake, "messages", json_object_get(req, "messages"));

    int stream_req = json_is_true(json_object_get(req, "stream"));
    long stall = magic(text, "FAULT:STALL");
    MHD_RESULT ret;
    if (magic(text, "FAULT:401") >= 0) {
        ret = reply_json(mc, 401,
                         json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
                                   "Incorrect API key provided", "type", "invalid_request_error",
                                   "param", "code", "invalid_api_key"));
    } else if (magic(text, "FAULT:500") >= 0) {
        ret = reply_json(mc, 500,
                         json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", "fake failure",
                                   "type", "server_error", "param", "code", "fake_500"));
    } else if (magic(text, "FAULT:TEXT500") >= 0) {
        ret = reply(mc, 500, "text/plain", "oops, the fake backend broke");
    } else if (magic(text, "FAULT:BADJSON") >= 0) {
        if (stall > 0) th_sleep_ms((int)stall);
        ret = reply(mc, 200, "application/json", "{\"id\": \"cmpl-fake\", \"choices\": [");
    } else if (stream_req) {
        stream *s = calloc(1, sizeof *s);
        s->c = c;
        s->chat = chat;
        s->crlf = magic(text, "FAULT:CRLF") >= 0;
        s->close_after = magic(text, "FAULT:CLOSE") >= 0 ? 2 : 0;
        s->stall_ms = stall > 0 ? (int)stall : 0;
        s->mc = mc;
        long ms = magic(text, "FAULT:MIDSTALL");
        s->midstall_ms = ms > 0 ? (int)ms : 0;
        s->rst = magic(text, "FAULT:RST") >= 0;
        s->badsse = magic(text, "FAULT:BADSSE") >= 0;
        s->usage_last = magic(text, "FAULT:USAGELAST") >= 0;
        s->errdone = magic(text, "FAULT:ERRDONE") >= 0;
        s->nodone = magic(text, "FAULT:NODONE") >= 0;
        long huge = magic(text, "FAULT:HUGESSE");
        s->huge = huge > 0 ? huge : 0;
        s->events = magic(text, "FAULT:SLOW") >= 0 ? 60 : n_events;
        long ev = magic(text, "FAULT:EVENTS");
        if (ev > 0) s->events = (int)ev;
        json_t *so = json_object_get(req, "stream_options");
        s->usage = json_is_true(json_object_get(so, "include_usage"));
        s->model = strdup(model);
        s->fake = json_incref(fake);
        s->prompt_len = (long)tlen;
        c->is_stream = 1;
        pthread_mutex_lock(&stats_mu);
        st_streams_started++;
        st_active_streams++;
        pthread_mutex_unlock(&stats_mu);
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        ret = MHD_queue_response(mc, 200, r);
        MHD_destroy_response(r);
    } else {
        if (stall > 0) th_sleep_ms((int)stall);
        char answer[96];
        snprintf(answer, sizeof answer, "echo %zu", tlen);
        json_t *out;
        if (chat)
            out = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:{s:s, s:s}, s:s}]}", "id",
                            "chatcmpl-fake", "object", "chat.completion", "created", 1700000000,
                            "model", model, "choices", "index", 0, "message", "role", "assistant",
                            "content", answer, "finish_reason", "stop");
        else
            out = json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:s, s:s}]}", "id", "cmpl-fake",
                            "object", "text_completion", "created", 1700000000, "model", model,
                            "choices", "index", 0, "text", answer, "finish_reason", "stop");
        json_object_set_new(out, "usage",
                            json_pack("{s:I, s:i, s:I}", "prompt_tokens", (json_int_t)tlen,
                                      "completion_tokens", 2, "total_tokens",
                                      (json_int_t)tlen + 2));
        json_object_set(out, "fake", fake);
        long big = magic(text, "FAULT:BIG");
        if (big > 0) {
            char *pad = malloc((size_t)big + 1);
            memset(pad, 'x', (size_t)big);
            pad[big] = '\0';
            json_object_set_new(out, "padding", json_string(pad));
            free(pad);
        }
        if (magic(text, "FAULT:WORKERCC") >= 0)
            json_object_set_new(
                out, "chunk_cache",
                json_pack("{s:i, s:{s:f}}", "recomputed_tokens", 7, "quality", "kl", 0.5));
        ret = reply_json(mc, 200, out);
    }
    json_decref(fake);
    json_decref(req);
    free(joined);
    return ret;
}

static MHD_RESULT on_access(void *cls, struct MHD_Connection *mc, const char *url,
                            const char *method, const char *version, const char *upload,
                            size_t *upload_size, void **con_cls)
{
    conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size) {
        c->body = realloc(c->body, c->len + *upload_size + 1);
        memcpy(c->body + c->len, upload, *upload_size);
        c->len += *upload_size;
        c->body[c->len] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }
    pthread_mutex_lock(&stats_mu);
    st_requests++;
    pthread_mutex_unlock(&stats_mu);
    if (!strcmp(method, "POST") && !strcmp(url, "/v1/completions")) return handle_infer(mc, c, 0);
    if (!strcmp(method, "POST") && !strcmp(url, "/v1/chat/completions"))
        return handle_infer(mc, c, 1);
    if (!strcmp(method, "GET") && !strcmp(url, "/v1/models"))
        return reply_json(mc, 200,
                          json_pack("{s:s, s:[{s:s, s:s, s:i, s:s}]}", "object", "list", "data",
                                    "id", "fake-model", "object", "model", "created", 0, "owned_by",
                                    "fake"));
    if (worker_info && !strcmp(method, "GET") && !strcmp(url, "/v1/info"))
        return reply(mc, 200, "application/json", worker_info);
    if (worker_info && !strcmp(method, "GET") && !strcmp(url, "/v1/chunks"))
        return reply(mc, 200, "application/json", "{\"object\":\"list\",\"data\":[]}");
    if (worker_info && !strcmp(method, "POST") && !strcmp(url, "/v1/assemble")) {
        pthread_mutex_lock(&stats_mu);
        st_assembles++;
        long stall = assemble_stall_ms;
        assemble_stall_ms = 0;
        pthread_mutex_unlock(&stats_mu);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        for (long waited = 0; ci && waited < stall; waited += 20) {
            struct pollfd pf = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
            char b;
            if (poll(&pf, 1, 20) == 1 &&
                ((pf.revents & (POLLERR | POLLHUP)) ||
                 ((pf.revents & POLLRDHUP) && recv(pf.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0))) {
                pthread_mutex_lock(&stats_mu);
                st_assembles_abandoned++;
                pthread_mutex_unlock(&stats_mu);
                return MHD_NO;
            }
        }
        return reply(mc, 429, "text/plain", "Too Many Requests\n");
    }
    if (!strcmp(method, "POST") && !strcmp(url, "/control/assemble-stall")) {
        const char *ms = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "ms");
        pthread_mutex_lock(&stats_mu);
        assemble_stall_ms = ms ? atol(ms) : 0;
        pthread_mutex_unlock(&stats_mu);
        return reply_json(mc, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!strcmp(method, "POST") && !strcmp(url, "/control/healthz-stall")) {
        const char *ms = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "ms");
        const char *count = MHD_lookup_connection_value(mc, MHD_GET_ARGUMENT_KIND, "count");
        pthread_mutex_lock(&stats_mu);
        healthz_stall_ms = ms ? atol(ms) : 0;
        healthz_stalls = count ? atol(count) : 0;
        pthread_mutex_unlock(&stats_mu);
        return reply_json(mc, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!strcmp(method, "GET") && !strcmp(url, "/healthz")) {
        pthread_mutex_lock(&stats_mu);
        long stall = healthz_stalls > 0 ? healthz_stall_ms : 0;
        if (healthz_stalls > 0) healthz_stalls--;
        pthread_mutex_unlock(&stats_mu);
        if (stall) th_sleep_ms((int)stall);
        return reply_json(mc, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!strcmp(method, "GET") && !strcmp(url, "/stats")) {
        pthread_mutex_lock(&stats_mu);
        json_t *j =
            json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "requests", (int)st_requests,
                      "assembles", (int)st_assembles, "assembles_abandoned",
                      (int)st_assembles_abandoned, "streams_started", (int)st_streams_started,
                      "streams_completed", (int)st_streams_completed, "streams_aborted",
                      (int)st_streams_aborted, "active_streams", (int)st_active_streams);
        pthread_mutex_unlock(&stats_mu);
        return reply_json(mc, 200, j);
    }
    return reply_json(mc, 404,
                      json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
                                "fake: no such route", "type", "invalid_request_error", "param",
                                "code", "not_found"));
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (c->is_stream) {
        pthread_mutex_lock(&stats_mu);
        st_active_streams--;
        if (c->stream_done && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
            st_streams_completed++;
        else
            st_streams_aborted++;
        pthread_mutex_unlock(&stats_mu);
    }
    free(c->body);
    free(c);
}

int main(int argc, char **argv)
{
    unsigned port = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port"))
            port = (unsigned)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--events"))
            n_events = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--delay-ms"))
            delay_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--worker-info")) {
            worker_info = th_read_file(argv[i + 1], NULL);
            if (!*worker_info) {
                fprintf(stderr, "fake_backend: cannot read %s\n", argv[i + 1]);
                return 2;
            }
        } else {
            fprintf(stderr, "fake_backend: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    /* Blocked before any thread starts, so sigwait below is the only receiver. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(0x7f000001); /* loopback only */
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, on_access, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
        MHD_OPTION_CONNECTION_LIMIT, 20000u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "fake_backend: cannot listen\n");
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("PORT %u\n", (unsigned)info->port);
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
    MHD_stop_daemon(d);
    return 0;
}
