/* Tests of the HTTP layer (base/http.c) with a real in-process server on port 0 and libcurl:
 * routing, 404/405, HEAD, body caps with and without Content-Length, request ids, bearer auth
 * (also before a 100-continue body), streams (blocking and non-blocking producers, close,
 * client disconnect), quiesce, the JSON field helpers; and over raw sockets, the framing check
 * in front of libmicrohttpd (RFC 9112 refusals in the OpenAI shape, chunked bodies cut at the
 * cap, lingering close), next to what the library answers without it. */
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "base/http.h"
#include "base/metrics.h"
#include "tests/harness/harness.h"

static cg_http_server *srv;
static uint16_t port;

/* ------------------------------------------------------------ test handlers */

static void h_hello(cg_http_req *r, void *app)
{
    cg_http_reply_json(r, 200, json_pack("{s:s}", "hello", "world"));
}

static void h_item(cg_http_req *r, void *app)
{
    cg_http_reply_json(
        r, 200,
        json_pack("{s:s, s:s?}", "id", cg_http_req_param(r, 0), "q", cg_http_req_query(r, "q")));
}

static void h_echo(cg_http_req *r, void *app)
{
    json_t *j = cg_http_req_json(r);
    if (!j) return;
    size_t len;
    cg_http_req_body(r, &len);
    cg_http_reply_json(r, 200, json_pack("{s:I, s:o}", "n", (json_int_t)len, "obj", j));
}

static void h_ok(cg_http_req *r, void *app)
{
    cg_http_reply_json(r, 200, json_pack("{s:b}", "ok", 1));
}

/* A reply made from another thread after ms, so that the handler returns first. */
typedef struct later {
    cg_http_req *r;
    int ms, status;
    json_t *body;
} later;

static void *later_main(void *arg)
{
    later *l = arg;
    th_sleep_ms(l->ms);
    cg_http_reply_json(l->r, l->status, l->body);
    free(l);
    return NULL;
}

/* Replies to r with status and body (taken over) from a new thread after ms. */
static void reply_later(cg_http_req *r, int ms, int status, json_t *body)
{
    later *l = cg_malloc(sizeof *l);
    *l = (later){r, ms, status, body};
    pthread_t t;
    pthread_create(&t, NULL, later_main, l);
    pthread_detach(t);
}

/* Replies from another thread, later: the job thread returns first. */
static void h_late(cg_http_req *r, void *app)
{
    reply_later(r, 50, 202, json_pack("{s:s}", "late", "yes"));
}

/* Stream producers. prod_* are shared with the test body (same process: the server runs in
 * the forked test child). */
static pthread_mutex_t prod_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t prod_cv = PTHREAD_COND_INITIALIZER;
static int prod_gone_seen; /* push returned -1 */
static int prod_pushed;    /* pushes that succeeded */
static int notify_drains, notify_gone;
static int prod_finished;

typedef struct prod {
    cg_stream *s;
    int n, delay_ms;
} prod;

static void *blocking_producer(void *arg)
{
    prod *p = arg;
    for (int i = 0; i < p->n; i++) {
        char line[64];
        int len = snprintf(line, sizeof line, "data: %d\n\n", i);
        if (cg_stream_push(p->s, line, (size_t)len) != 0) {
            pthread_mutex_lock(&prod_mu);
            prod_gone_seen = 1;
            pthread_cond_broadcast(&prod_cv);
            pthread_mutex_unlock(&prod_mu);
            break;
        }
        pthread_mutex_lock(&prod_mu);
        prod_pushed++;
        pthread_mutex_unlock(&prod_mu);
        if (p->delay_ms) th_sleep_ms(p->delay_ms);
    }
    cg_stream_close(p->s);
    cg_stream_unref(&p->s);
    pthread_mutex_lock(&prod_mu);
    prod_finished = 1;
    pthread_cond_broadcast(&prod_cv);
    pthread_mutex_unlock(&prod_mu);
    free(p);
    return NULL;
}

static void start_stream(cg_http_req *r, int n, int delay_ms, size_t max)
{
    prod *p = calloc(1, sizeof *p);
    p->s = cg_stream_new(max, ": hb\n\n");
    p->n = n;
    p->delay_ms = delay_ms;
    cg_http_reply_stream(r, 200, "text/event-stream", p->s);
    pthread_t t;
    pthread_create(&t, NULL, blocking_producer, p);
    pthread_detach(t);
}

static void h_stream(cg_http_req *r, void *app)
{
    start_stream(r, 20, 5, 1 << 16);
}
static void h_slow(cg_http_req *r, void *app)
{
    start_stream(r, 400, 25, 1 << 16);
}

/* Non-blocking producer: pushes 256 KiB through a 1 KiB queue, waiting for drain notices. */
#define NB_TOTAL (256 * 1024)
static void on_notify(void *arg, int gone)
{
    pthread_mutex_lock(&prod_mu);
    if (gone)
        notify_gone++;
    else
        notify_drains++;
    pthread_cond_broadcast(&prod_cv);
    pthread_mutex_unlock(&prod_mu);
}

static void *nowait_producer(void *arg)
{
    cg_stream *s = arg;
    char chunk[512];
    size_t sent = 0;
    cg_stream_set_notify(s, on_notify, NULL);
    while (sent < NB_TOTAL) {
        int w = cg_stream_writable(s);
        if (w < 0) break;
        if (w == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_mutex_lock(&prod_mu);
            int before = notify_drains;
            while (notify_drains == before && !notify_gone &&
                   pthread_cond_timedwait(&prod_cv, &prod_mu, &ts) == 0) {
            }
            pthread_mutex_unlock(&prod_mu);
            continue;
        }
        for (size_t i = 0; i < sizeof chunk; i++)
            chunk[i] = (char)('a' + (sent + i) % 26);
        if (cg_stream_push_nowait(s, chunk, sizeof chunk) != 0) break;
        sent += sizeof chunk;
    }
    cg_stream_set_notify(s, NULL, NULL);
    cg_stream_close(s);
    cg_stream_unref(&s);
    return NULL;
}

static void h_nowait(cg_http_req *r, void *app)
{
    cg_stream *s = cg_stream_new(1024, NULL);
    cg_http_reply_stream(r, 200, "application/octet-stream", s);
    pthread_t t;
    pthread_create(&t, NULL, nowait_producer, s);
    pthread_detach(t);
}

/* A producer that parks with nothing to send: only the heartbeat can find the client gone. */
static void *idle_producer(void *arg)
{
    cg_stream *s = arg;
    cg_stream_set_notify(s, on_notify, NULL);
    cg_stream_push(s, "data: first\n\n", 13);
    for (int i = 0; i < 500 && !cg_stream_cancelled(s); i++)
        th_sleep_ms(10);
    int gone = cg_stream_cancelled(s); /* not under prod_mu: on_notify takes it under s's lock */
    pthread_mutex_lock(&prod_mu);
    prod_gone_seen = gone;
    prod_finished = 1;
    pthread_cond_broadcast(&prod_cv);
    pthread_mutex_unlock(&prod_mu);
    cg_stream_set_notify(s, NULL, NULL);
    cg_stream_close(s);
    cg_stream_unref(&s);
    return NULL;
}

static void h_idle(cg_http_req *r, void *app)
{
    cg_stream *s = cg_stream_new(4096, ": hb\n\n");
    cg_http_reply_stream(r, 200, "text/event-stream", s);
    pthread_t t;
    pthread_create(&t, NULL, idle_producer, s);
    pthread_detach(t);
}

/* A producer that pushes 1 KiB at a time until its client has let nothing through for 2 s
 * (the stall cut), and counts what it got through: what the server holds for a client that
 * never reads. */
static size_t flood_bytes;
static int flood_stalled;
static void *flood_producer(void *arg)
{
    cg_stream *s = arg;
    char chunk[1024];
    memset(chunk, 'f', sizeof chunk);
    while (cg_stream_push(s, chunk, sizeof chunk) == 0) {
        pthread_mutex_lock(&prod_mu);
        flood_bytes += sizeof chunk;
        prod_pushed++;
        pthread_cond_broadcast(&prod_cv);
        pthread_mutex_unlock(&prod_mu);
    }
    int stalled = cg_stream_stalled(s);
    cg_stream_close(s);
    cg_stream_unref(&s);
    pthread_mutex_lock(&prod_mu);
    flood_stalled = stalled;
    prod_finished = 1;
    pthread_cond_broadcast(&prod_cv);
    pthread_mutex_unlock(&prod_mu);
    return NULL;
}

static void h_flood(cg_http_req *r, void *app)
{
    cg_stream *s = cg_stream_new(4096, NULL);
    cg_stream_set_stall_timeout(s, 2000);
    cg_http_reply_stream(r, 200, "application/octet-stream", s);
    pthread_t t;
    pthread_create(&t, NULL, flood_producer, s);
    pthread_detach(t);
}

/* A reply without a body, as a handler could make from an upstream answer that was not JSON:
 * the status's error in the OpenAI shape, never a crash. */
static void h_nobody(cg_http_req *r, void *app)
{
    cg_http_reply_json(r, atoi(cg_http_req_param(r, 0)), NULL);
}

/* A route with a fast handler: "inline" is answered on the MHD thread, "later" from another
 * thread after the fast handler returned, anything else goes to the job pool. */
static void h_fast_job(cg_http_req *r, void *app)
{
    cg_http_reply_json(r, 200, json_pack("{s:s}", "path", "job"));
}
static int h_fast(cg_http_req *r, void *app)
{
    size_t n;
    const char *b = cg_http_req_body(r, &n);
    if (n == 6 && !memcmp(b, "inline", 6)) {
        cg_http_reply_json(r, 200, json_pack("{s:s}", "path", "inline"));
        return 1;
    }
    if (n == 5 && !memcmp(b, "later", 5)) {
        reply_later(r, 30, 200, json_pack("{s:s}", "path", "later"));
        return 1;
    }
    return 0;
}

static const cg_http_route routes[] = {
    {"GET", "/t/hello", h_hello, CG_ROUTE_INLINE, "hello"},
    {"GET", "/t/items/*", h_item, 0, "item"},
    {"GET", "/t/items/*/sub/*", h_item, 0, "item_sub"},
    {"POST", "/t/echo", h_echo, 0, "echo"},
    {"POST", "/t/secure", h_echo, CG_ROUTE_AUTH, "secure"},
    {"GET", "/t/admin", h_ok, CG_ROUTE_ADMIN, "admin"},
    {"GET", "/t/auth", h_ok, CG_ROUTE_AUTH, "auth"},
    {"GET", "/t/late", h_late, 0, "late"},
    {"GET", "/t/stream", h_stream, 0, "stream"},
    {"GET", "/t/slow", h_slow, 0, "slow"},
    {"GET", "/t/nowait", h_nowait, 0, "nowait"},
    {"GET", "/t/idle", h_idle, 0, "idle"},
    {"GET", "/t/flood", h_flood, 0, "flood"},
    {"GET", "/t/nobody/*", h_nobody, 0, "nobody"},
    {"POST", "/t/fast", h_fast_job, 0, "fast"},
};
static cg_http_fast_handler fast[sizeof routes / sizeof routes[0]];

static const char *const api_keys[] = {"key-one", "key-two", NULL};
static int done_calls;
static int done_last_status;
static char done_last_route[32];
static void on_done(void *app, const char *route, int status, double seconds)
{
    pthread_mutex_lock(&prod_mu);
    done_calls++;
    done_last_status = status;
    snprintf(done_last_route, sizeof done_last_route, "%s", route);
    pthread_mutex_unlock(&prod_mu);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    cg_http_params p = cg_http_default_params();
    p.listen = "127.0.0.1:0";
    p.max_body_bytes = 4096;
    p.heartbeat_ms = 100;
    p.admin_token = "s3cret-admin";
    p.api_keys = api_keys;
    p.routes = routes;
    p.n_routes = sizeof routes / sizeof routes[0];
    fast[p.n_routes - 1] = h_fast;
    p.fast = fast;
    p.done = on_done;
    ck_assert_int_eq(cg_http_open(&p, &srv), CG_OK);
    port = cg_http_port(srv);
    ck_assert_uint_gt(port, 0);
}

static void teardown(void)
{
    cg_http_close(&srv);
    ck_assert_ptr_null(srv);
}

/* ------------------------------------------------------------ client */

/* One request to the server, cut after stop_after bytes (0 = never). */
static void http_cut(th_resp *r, const char *method, const char *path, const char *body, size_t len,
                     const char *const *headers, int chunked, size_t stop_after)
{
    /* method, path, body, len, token, headers, chunked, stop_after, timeout_s */
    th_req q = {method, path, body, len, NULL, headers, chunked, stop_after, 20};
    th_send(r, port, &q);
}

static void http(th_resp *r, const char *method, const char *path, const char *body, size_t len,
                 const char *const *headers, int chunked)
{
    http_cut(r, method, path, body, len, headers, chunked, 0);
}

/* Asserts the OpenAI error shape with the given code. */
static void assert_error(th_resp *r, long status, const char *code)
{
    th_assert_error(r, status, code, NULL);
}

/* Locks prod_mu and waits (up to secs) until *flag is set; returns with prod_mu held. */
static void wait_locked(const int *flag, int secs)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += secs;
    pthread_mutex_lock(&prod_mu);
    while (!*flag && pthread_cond_timedwait(&prod_cv, &prod_mu, &ts) == 0) {
    }
}

/* ------------------------------------------------------------ raw sockets */

static int raw_connect(uint16_t to)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(to)};
    a.sin_addr.s_addr = htonl(0x7f000001);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Sends everything, blocking; returns 0, or the errno of the failed send. */
static int raw_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return errno ? errno : EPIPE;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads until the peer closes or timeout_ms without data; NUL-terminated, caller frees.
 * *closed: 1 when the peer closed (0: timed out; -1: reset). */
static char *raw_recv(int fd, int timeout_ms, int *closed)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    int c = 0;
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, timeout_ms) <= 0) break;
        char tmp[16384];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n == 0) {
            c = 1;
            break;
        }
        if (n < 0) {
            c = -1;
            break;
        }
        ck_assert_int_eq(cg_buf_append(&b, tmp, (size_t)n), CG_OK);
    }
    if (closed) *closed = c;
    if (!b.data) ck_assert_int_eq(cg_buf_append(&b, "", 0), CG_OK);
    return b.data;
}

/* One exchange on a new connection: the whole answer, read until the server closes. */
static char *raw_exchange(uint16_t to, const char *req, size_t len)
{
    int fd = raw_connect(to);
    ck_assert_int_eq(raw_send(fd, req, len), 0);
    int closed;
    char *ans = raw_recv(fd, 5000, &closed);
    ck_assert_msg(closed == 1, "the server did not close: %.200s", ans);
    close(fd);
    return ans;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Status lines in raw answers: at the start or right after a line end. */
static int status_lines(const char *ans)
{
    return !strncmp(ans, "HTTP/1.1 ", 9) + count_of(ans, "\nHTTP/1.1 ");
}

/* A raw answer is one HTTP/1.1 response with this status and an OpenAI error with this code,
 * and the server closes. */
static void assert_raw_error(const char *ans, int status, const char *code)
{
    char want[32];
    snprintf(want, sizeof want, "HTTP/1.1 %d ", status);
    ck_assert_msg(!strncmp(ans, want, strlen(want)), "want %d: %.300s", status, ans);
    ck_assert_msg(status_lines(ans) == 1, "more than one status line: %.600s", ans);
    ck_assert_msg(strstr(ans, "Content-Type: application/json\r\n"), "not JSON: %.300s", ans);
    const char *body = strstr(ans, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    json_t *j = json_loads(body + 4, 0, NULL);
    ck_assert_msg(j != NULL, "body is not one JSON value: %s", body + 4);
    json_t *e = json_object_get(j, "error");
    ck_assert(json_is_string(json_object_get(e, "message")));
    ck_assert(json_is_string(json_object_get(e, "type")));
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
    json_decref(j);
}

/* ------------------------------------------------------------ tests */

START_TEST(routing)
{
    th_resp r;
    http(&r, "GET", "/t/hello", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.ctype, "application/json");
    json_t *j = th_body_json(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "hello")), "world");
    json_decref(j);
    th_resp_free(&r);

    http(&r, "GET", "/t/items/abc%20d?q=1", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 200);
    j = th_body_json(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")), "abc d");
    ck_assert_str_eq(json_string_value(json_object_get(j, "q")), "1");
    json_decref(j);
    th_resp_free(&r);

    http(&r, "GET", "/t/items/x/sub/y", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);

    /* "*" matches one non-empty segment only */
    const char *missing[] = {"/t/items/", "/t/items/a/b", "/t/nope", "/", "/t/hello/"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        http(&r, "GET", missing[i], NULL, 0, NULL, 0);
        assert_error(&r, 404, "not_found");
        th_resp_free(&r);
    }
    http(&r, "POST", "/t/hello", "{}", 2, NULL, 0);
    assert_error(&r, 405, "method_not_allowed");
    th_resp_free(&r);
    http(&r, "DELETE", "/t/items/1", NULL, 0, NULL, 0);
    assert_error(&r, 405, "method_not_allowed");
    th_resp_free(&r);

    /* a reply may come later from another thread */
    http(&r, "GET", "/t/late", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 202);
    th_resp_free(&r);
    th_sleep_ms(50); /* the done callback runs after the reply is sent */
    pthread_mutex_lock(&prod_mu);
    ck_assert_int_eq(done_last_status, 202);
    ck_assert_str_eq(done_last_route, "late");
    ck_assert_int_ge(done_calls, 10);
    pthread_mutex_unlock(&prod_mu);
}
END_TEST

/* A fast handler takes what it can on the MHD thread (answering at once or later, from
 * another thread), and leaves the rest to the job pool; over keep-alive too. */
START_TEST(fast_handlers)
{
    const char *bodies[] = {"inline", "later", "other", "inline", "later"};
    const char *paths[] = {"inline", "later", "job", "inline", "later"};
    for (size_t i = 0; i < 5; i++) {
        th_resp r;
        http(&r, "POST", "/t/fast", bodies[i], strlen(bodies[i]), NULL, 0);
        ck_assert_int_eq(r.status, 200);
        json_t *j = th_body_json(&r);
        ck_assert_str_eq(json_string_value(json_object_get(j, "path")), paths[i]);
        ck_assert_str_ne(r.rid, "");
        json_decref(j);
        th_resp_free(&r);
    }
    /* pipelined on one connection: the answers come in order */
    const char *two = "POST /t/fast HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nlater"
                      "POST /t/fast HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: "
                      "close\r\n\r\ninline";
    char *ans = raw_exchange(port, two, strlen(two));
    const char *a = strstr(ans, "\"later\""), *b = strstr(ans, "\"inline\"");
    ck_assert_msg(a && b && a < b, "%s", ans);
    free(ans);
}
END_TEST

START_TEST(json_body)
{
    th_resp r;
    const char *ok = "{\"a\": [1, 2], \"b\": \"x\"}";
    http(&r, "POST", "/t/echo", ok, strlen(ok), NULL, 0);
    ck_assert_int_eq(r.status, 200);
    json_t *j = th_body_json(&r);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "n")), (json_int_t)strlen(ok));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "obj"), "b")), "x");
    json_decref(j);
    th_resp_free(&r);

    struct {
        const char *body;
        const char *code;
    } bad[] = {{"", "invalid_json"},
               {"{bad", "invalid_json"},
               {"[1, 2]", "invalid_type"},
               {"\"s\"", "invalid_json"},
               {"{\"a\": \"\xff\"}", "invalid_utf8"},
               {"{\"a\": 1, \"a\": 1}", "invalid_json"}, /* duplicate keys, even equal */
               {"{\"a\": [{\"b\": 1, \"b\": 2}]}", "invalid_json"}}; /* at any depth */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        http(&r, "POST", "/t/echo", bad[i].body, strlen(bad[i].body), NULL, 0);
        assert_error(&r, 400, bad[i].code);
        th_resp_free(&r);
    }
    /* nesting: the default limit is 64 levels (the body object is level 1) */
    for (int past = 0; past <= 1; past++) {
        char deep[200] = "{\"a\":";
        int n = 63 + past;
        size_t at = strlen(deep);
        for (int i = 0; i < n; i++)
            deep[at++] = '[';
        for (int i = 0; i < n; i++)
            deep[at++] = ']';
        deep[at++] = '}';
        deep[at] = '\0';
        http(&r, "POST", "/t/echo", deep, at, NULL, 0);
        if (past)
            assert_error(&r, 400, "json_too_complex");
        else
            ck_assert_int_eq(r.status, 200);
        th_resp_free(&r);
    }
}
END_TEST

/* The value count and depth scan on its own: counts 1 + containers + commas, skips strings
 * (escaped quotes and brackets in them included), and leaves malformed text to the parser. */
START_TEST(json_limits_scan)
{
    cg_json_limits l = {.max_values = 5, .max_depth = 3};
    char msg[128];
    struct {
        const char *text;
        cg_status st;
    } cases[] = {
        {"{\"a\":[1,2]}", CG_OK},                     /* 1 + 2 + 1 = 4 */
        {"{\"a\":[1,2,3]}", CG_OK},                   /* 5 */
        {"{\"a\":[1,2,3,4]}", CG_E_JSON_LIMIT},       /* 6 */
        {"{\"a\":\"[[[[,,,,,,]]]]\"}", CG_OK},        /* inside a string */
        {"{\"a\":\"\\\"[[[[,,,,,\"}", CG_OK},         /* an escaped quote does not end it */
        {"{\"a\":\"\\\\\",[[[[\"}", CG_E_JSON_LIMIT}, /* an escaped backslash does */
        {"[[[]]]", CG_OK},
        {"[[[[]]]]", CG_E_JSON_LIMIT},
        {"{\"a\":\"unterminated [[[[[[", CG_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        msg[0] = '\0';
        cg_status st =
            cg_json_check_limits(cases[i].text, strlen(cases[i].text), &l, msg, sizeof msg);
        ck_assert_msg(st == cases[i].st, "case %zu (%s): %s", i, cases[i].text, cg_status_name(st));
        if (st != CG_OK) ck_assert_str_ne(msg, "");
    }
    cg_status st;
    const char *ok = "{\"a\":1,\"b\":{\"a\":2}}", *dup = "{\"a\":1,\"a\":2}";
    json_t *j = cg_json_parse_object(ok, strlen(ok), &l, &st, msg, sizeof msg);
    ck_assert_ptr_nonnull(j); /* the same key in different objects is fine */
    json_decref(j);
    ck_assert_ptr_null(cg_json_parse_object(dup, strlen(dup), &l, &st, msg, sizeof msg));
    ck_assert_int_eq(st, CG_E_JSON);
    ck_assert_ptr_nonnull(strstr(msg, "duplicate"));
}
END_TEST

START_TEST(body_caps)
{
    /* max_body_bytes is 4096 */
    char *big = malloc(8192);
    memset(big, ' ', 8192);
    big[0] = '{';
    big[4000] = '}';
    th_resp r;
    http(&r, "POST", "/t/echo", big, 4096, NULL, 0); /* at the cap: fine */
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
    http(&r, "POST", "/t/echo", big, 4097, NULL, 0); /* Content-Length over the cap */
    assert_error(&r, 413, "request_too_large");
    th_resp_free(&r);
    http(&r, "POST", "/t/echo", big, 8192, NULL, 1); /* chunked: no Content-Length */
    assert_error(&r, 413, "request_too_large");
    th_resp_free(&r);
    http(&r, "POST", "/t/echo", big, 4096, NULL, 1); /* chunked, within the cap */
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
    free(big);
    /* the server still serves */
    http(&r, "GET", "/t/hello", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
}
END_TEST

START_TEST(request_ids)
{
    th_resp r;
    const char *mine[] = {"X-Request-Id: abc-123_x.y", NULL};
    http(&r, "GET", "/t/hello", NULL, 0, mine, 0);
    ck_assert_str_eq(r.rid, "abc-123_x.y");
    th_resp_free(&r);

    http(&r, "GET", "/t/hello", NULL, 0, NULL, 0);
    ck_assert_uint_ge(strlen(r.rid), 8);
    char first[96];
    snprintf(first, sizeof first, "%s", r.rid);
    th_resp_free(&r);
    http(&r, "GET", "/t/nope", NULL, 0, NULL, 0); /* errors carry one too */
    ck_assert_uint_ge(strlen(r.rid), 8);
    ck_assert_str_ne(r.rid, first);
    th_resp_free(&r);

    /* unsafe characters or an overlong id are replaced by a generated one */
    const char *bad[] = {"X-Request-Id: bad id\"<>", NULL};
    http(&r, "GET", "/t/hello", NULL, 0, bad, 0);
    ck_assert_uint_ge(strlen(r.rid), 8);
    ck_assert_ptr_null(strchr(r.rid, '<'));
    th_resp_free(&r);
    char longid[128] = "X-Request-Id: ";
    memset(longid + 14, 'a', 100);
    longid[114] = '\0';
    const char *lng[] = {longid, NULL};
    http(&r, "GET", "/t/hello", NULL, 0, lng, 0);
    ck_assert_uint_lt(strlen(r.rid), 65);
    th_resp_free(&r);
}
END_TEST

START_TEST(bearer_auth)
{
    struct {
        const char *path, *header;
        long status;
    } cases[] = {
        {"/t/admin", NULL, 401},
        {"/t/admin", "Authorization: Bearer wrong", 401},
        {"/t/admin", "Authorization: Bearer s3cret-admi", 401},   /* prefix */
        {"/t/admin", "Authorization: Bearer s3cret-admin2", 401}, /* longer */
        {"/t/admin", "Authorization: Basic s3cret-admin", 401},
        {"/t/admin", "Authorization: Bearer key-one", 401}, /* an API key is not the admin token */
        {"/t/admin", "Authorization: Bearer s3cret-admin", 200},
        {"/t/admin", "Authorization: bearer   s3cret-admin", 200},
        {"/t/auth", NULL, 401},
        {"/t/auth", "Authorization: Bearer key-three", 401},
        {"/t/auth", "Authorization: Bearer key-two", 200},
        {"/t/auth", "Authorization: Bearer key-one", 200},
        {"/t/hello", "Authorization: Bearer anything", 200}, /* open route */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_resp r;
        const char *h[] = {cases[i].header, NULL};
        http(&r, "GET", cases[i].path, NULL, 0, cases[i].header ? h : NULL, 0);
        ck_assert_msg(r.status == cases[i].status, "case %zu: %ld", i, r.status);
        if (r.status == 401) assert_error(&r, 401, "invalid_api_key");
        th_resp_free(&r);
    }
    /* the comparison itself: equal only when bytes and length match */
    ck_assert_int_eq(cg_secret_equal("abc", "abc"), 1);
    ck_assert_int_eq(cg_secret_equal("abc", "abd"), 0);
    ck_assert_int_eq(cg_secret_equal("abc", "ab"), 0);
    ck_assert_int_eq(cg_secret_equal("", "a"), 0);
    ck_assert_int_eq(cg_secret_equal("", ""), 1);
}
END_TEST

START_TEST(stream_complete)
{
    th_resp r;
    http(&r, "GET", "/t/stream", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.rc, CURLE_OK);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.ctype, "text/event-stream");
    /* every event, in order, nothing else but heartbeats */
    cg_buf want;
    cg_buf_init_unbounded(&want);
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(cg_buf_printf(&want, "data: %d\n\n", i), CG_OK);
    cg_buf got;
    cg_buf_init_unbounded(&got);
    const char *p = r.body.data;
    while (p && *p) { /* drop heartbeat comments */
        const char *end = strstr(p, "\n\n");
        ck_assert_ptr_nonnull(end);
        if (strncmp(p, ": hb", 4) != 0)
            ck_assert_int_eq(cg_buf_append(&got, p, (size_t)(end - p) + 2), CG_OK);
        p = end + 2;
    }
    ck_assert_str_eq(got.data, want.data);
    cg_buf_free(&want);
    cg_buf_free(&got);
    th_resp_free(&r);
}
END_TEST

/* Reads path, hangs up after stop_after bytes (asserting the cut), and waits up to secs for
 * *flag under prod_mu; returns with prod_mu held. */
static void hang_up_and_wait(const char *path, size_t stop_after, int secs, const int *flag)
{
    th_resp r;
    http_cut(&r, "GET", path, NULL, 0, NULL, 0, stop_after);
    ck_assert_int_eq(r.rc, CURLE_WRITE_ERROR);
    th_resp_free(&r);
    wait_locked(flag, secs);
}

/* The client leaves after the first bytes: the producer's push must fail soon after. */
START_TEST(stream_client_disconnect)
{
    hang_up_and_wait("/t/slow", 1, 5, &prod_gone_seen);
    int gone = prod_gone_seen, pushed = prod_pushed;
    pthread_mutex_unlock(&prod_mu);
    ck_assert_msg(gone, "producer never learned that the client left");
    ck_assert_int_lt(pushed, 400); /* it stopped early */
}
END_TEST

/* Idle stream: only the heartbeat poke can notice the client left; the notify fires. */
START_TEST(stream_idle_disconnect_heartbeat)
{
    hang_up_and_wait("/t/idle", 5, 6, &prod_finished);
    int gone = prod_gone_seen, ngone = notify_gone;
    pthread_mutex_unlock(&prod_mu);
    ck_assert_msg(gone, "an idle stream never noticed its client left");
    ck_assert_int_eq(ngone, 1);
}
END_TEST

/* Non-blocking producer through a small queue: all bytes arrive intact, in order, and the
 * producer was paced by drain notifications. */
START_TEST(stream_nowait_backpressure)
{
    th_resp r;
    http(&r, "GET", "/t/nowait", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.rc, CURLE_OK);
    ck_assert_uint_eq(r.body.len, NB_TOTAL);
    for (size_t i = 0; i < NB_TOTAL; i++)
        if (r.body.data[i] != (char)('a' + i % 26)) ck_abort_msg("byte %zu is wrong", i);
    th_resp_free(&r);
    pthread_mutex_lock(&prod_mu);
    int drains = notify_drains;
    pthread_mutex_unlock(&prod_mu);
    ck_assert_int_gt(drains, 0);
}
END_TEST

/* Many concurrent streams on one server: all complete. */
START_TEST(many_streams)
{
    enum { N = 64 };
    th_resp rs[N];
    th_req q = {.path = "/t/stream", .timeout_s = 30};
    th_send_many(rs, N, port, &q);
    for (int i = 0; i < N; i++) {
        ck_assert_ptr_nonnull(strstr(rs[i].body.data, "data: 19\n\n"));
        th_resp_free(&rs[i]);
    }
}
END_TEST

START_TEST(quiesce_refuses_new_connections)
{
    th_resp r;
    http(&r, "GET", "/t/hello", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
    cg_http_quiesce(srv);
    cg_http_quiesce(srv); /* idempotent */
    /* the connection is closed unanswered (the listening socket stays open until the stop) */
    http(&r, "GET", "/t/hello", NULL, 0, NULL, 0);
    ck_assert_msg(r.rc != CURLE_OK && r.status == 0, "after quiesce: curl %d, status %ld",
                  (int)r.rc, r.status);
    th_resp_free(&r);
}
END_TEST

static size_t to_buf(char *d, size_t sz, size_t n, void *ud)
{
    return cg_buf_append(ud, d, sz * n) == CG_OK ? sz * n : 0;
}

static void *stop_main(void *arg)
{
    cg_http_close(arg);
    return NULL;
}

/* Stopping the server with a stream open ends it and releases its producer. */
START_TEST(stop_with_live_stream)
{
    cg_buf body;
    cg_buf_init_unbounded(&body);
    CURLM *m = curl_multi_init();
    CURL *e = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/t/slow", (unsigned)port);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, to_buf);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    curl_multi_add_handle(m, e);
    int running = 1;
    while (running && body.len < 20) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    ck_assert_uint_ge(body.len, 20);
    /* stop while the stream is live; keep the client reading so nothing stays blocked */
    cg_http_server *s = srv;
    srv = NULL;
    uint64_t t0 = cg_now_ms();
    pthread_t stopper;
    pthread_create(&stopper, NULL, stop_main, &s);
    while (running) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 50, NULL);
        ck_assert_uint_lt(cg_now_ms() - t0, 10000);
    }
    pthread_join(stopper, NULL);
    ck_assert_ptr_null(s);
    wait_locked(&prod_finished, 5);
    int gone = prod_gone_seen, pushed = prod_pushed;
    pthread_mutex_unlock(&prod_mu);
    ck_assert(gone);
    ck_assert_int_lt(pushed, 400);
    curl_multi_remove_handle(m, e);
    curl_easy_cleanup(e);
    curl_multi_cleanup(m);
    cg_buf_free(&body);
}
END_TEST

/* The metrics registry finds every series again (through its index, across its growth), keeps
 * series of one name apart by labels and type, and exposes them in creation order. */
START_TEST(metrics_registry_lookups)
{
    cg_metrics *m = cg_metrics_new();
    enum { N = 300 };
    cg_metric *c[N];
    char labels[64];
    for (int i = 0; i < N; i++) {
        snprintf(labels, sizeof labels, "route=\"r%d\"", i);
        c[i] = cg_metrics_counter(m, "t_total", "Test.", labels);
        cg_metric_add(c[i], i);
    }
    cg_metric *plain = cg_metrics_counter(m, "t_total", "Test.", NULL);
    ck_assert_ptr_eq(cg_metrics_counter(m, "t_total", "Test.", ""), plain);
    cg_metric *g = cg_metrics_gauge(m, "t_gauge", "Test.", "route=\"r1\"");
    ck_assert_ptr_ne(g, c[1]);
    for (int i = 0; i < N; i++) {
        snprintf(labels, sizeof labels, "route=\"r%d\"", i);
        ck_assert_ptr_eq(cg_metrics_counter(m, "t_total", "Test.", labels), c[i]);
        ck_assert_double_eq(cg_metric_value(c[i]), i);
        ck_assert_ptr_ne(c[i], plain);
    }
    cg_buf out;
    cg_buf_init_unbounded(&out);
    cg_metrics_render(m, &out);
    ck_assert(cg_buf_append(&out, "", 1) == CG_OK);
    const char *r0 = strstr(out.data, "t_total{route=\"r0\"} 0");
    const char *r299 = strstr(out.data, "t_total{route=\"r299\"} 299");
    ck_assert(r0 && r299 && r0 < r299);
    cg_buf_free(&out);
    cg_metrics_free(&m);
}
END_TEST

START_TEST(json_helpers)
{
    json_t *o = json_loads(
        "{\"s\":\"x\",\"i\":7,\"r\":2.0,\"f\":2.5,\"b\":true,\"n\":null,\"big\":99}", 0, NULL);
    const char *s;
    long long i;
    double d;
    int b;
    json_t *v;
    ck_assert_int_eq(cg_json_get_string(o, "s", 1, &s), CG_OK);
    ck_assert_str_eq(s, "x");
    ck_assert_int_eq(cg_json_get_string(o, "absent", 0, &s), CG_OK);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(cg_json_get_string(o, "absent", 1, &s), CG_E_MISSING);
    ck_assert_int_eq(cg_json_get_string(o, "n", 1, &s), CG_E_MISSING); /* null = absent */
    ck_assert_int_eq(cg_json_get_string(o, "i", 0, &s), CG_E_TYPE);
    ck_assert_int_eq(cg_json_get_int(o, "i", 0, 0, 10, &i), CG_OK);
    ck_assert_int_eq(i, 7);
    ck_assert_int_eq(cg_json_get_int(o, "r", 0, 0, 10, &i), CG_OK); /* 2.0 is an integer */
    ck_assert_int_eq(i, 2);
    ck_assert_int_eq(cg_json_get_int(o, "f", 0, 0, 10, &i), CG_E_TYPE);
    ck_assert_int_eq(cg_json_get_int(o, "big", 0, 0, 10, &i), CG_E_VALUE);
    ck_assert_int_eq(cg_json_get_int(o, "absent", 42, 0, 10, &i), CG_OK);
    ck_assert_int_eq(i, 42);
    ck_assert_int_eq(cg_json_get_int(o, "s", 0, 0, 10, &i), CG_E_TYPE);
    ck_assert_int_eq(cg_json_get_number(o, "f", 0, 0, 10, &d), CG_OK);
    ck_assert(d == 2.5);
    ck_assert_int_eq(cg_json_get_number(o, "f", 0, 3, 10, &d), CG_E_VALUE);
    ck_assert_int_eq(cg_json_get_number(o, "b", 0, 0, 10, &d), CG_E_TYPE);
    ck_assert_int_eq(cg_json_get_bool(o, "b", 0, &b), CG_OK);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(cg_json_get_bool(o, "i", 0, &b), CG_E_TYPE);
    ck_assert_int_eq(cg_json_get_bool(o, "absent", 1, &b), CG_OK);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(cg_json_get(o, "i", JSON_INTEGER, 1, &v), CG_OK);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(cg_json_get(o, "i", JSON_ARRAY, 1, &v), CG_E_TYPE);
    json_decref(o);

    json_t *e = cg_http_error_json(CG_E_SEGMENTS, "prompt", NULL);
    json_t *err = json_object_get(e, "error");
    ck_assert_str_eq(json_string_value(json_object_get(err, "code")), "too_many_segments");
    ck_assert_str_eq(json_string_value(json_object_get(err, "param")), "prompt");
    ck_assert_str_eq(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    json_decref(e);
    e = cg_http_error_json(CG_E_TIMEOUT, NULL, "slow");
    err = json_object_get(e, "error");
    ck_assert(json_is_null(json_object_get(err, "param")));
    ck_assert_str_eq(json_string_value(json_object_get(err, "message")), "slow");
    json_decref(e);
}
END_TEST

/* ------------------------------------------------------------ framing (raw sockets) */

#define HOST "Host: x\r\n"

/* RFC 9112 framing errors get one clean answer in the OpenAI shape, and the connection closes.
 * Without the framing check libmicrohttpd 0.9.75 answers most of these itself with HTML (a
 * malformed Content-Length even with its status line twice), or not at all. */
START_TEST(framing_refusals)
{
    char big_target[12000];
    memset(big_target, 'a', sizeof big_target);
    big_target[0] = '/';
    big_target[sizeof big_target - 1] = '\0';
    char *long_url = NULL, *many = NULL;
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_buf_printf(&b, "GET %s HTTP/1.1\r\n" HOST "\r\n", big_target), CG_OK);
    long_url = b.data;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_buf_printf(&b, "GET /t/hello HTTP/1.1\r\n" HOST), CG_OK);
    for (int i = 0; i < 150; i++)
        ck_assert_int_eq(cg_buf_printf(&b, "X-H%d: v\r\n", i), CG_OK);
    ck_assert_int_eq(cg_buf_printf(&b, "\r\n"), CG_OK);
    many = b.data;
    const struct {
        const char *req;
        int status;
        const char *code;
    } cases[] = {
        {"POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: -1\r\n\r\n", 400, "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: abc\r\n\r\n", 400, "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: 99999999999999999999999\r\n\r\n", 400,
         "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400,
         "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
         "2\r\n{}\r\n0\r\n\r\n",
         400, "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
         400, "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Transfer-Encoding: gzip\r\n\r\n", 501,
         "not_implemented"},
        /* whitespace after a framing value: libmicrohttpd frames it otherwise (no answer and
         * the pipelined request swallowed; its own HTML 400 with the headers twice) */
        {"POST /t/echo HTTP/1.1\r\n" HOST "Transfer-Encoding: chunked \r\n\r\n2\r\n{}\r\n0\r\n\r\n"
         "GET /t/hello HTTP/1.1\r\n" HOST "\r\n",
         400, "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST
         "Transfer-Encoding: chunked\t\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
         400, "bad_request"},
        {"POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: 2 \r\n\r\n{}", 400, "bad_request"},
        {"GET /t/hello HTTP/1.1\r\n" HOST "X-A : b\r\n\r\n", 400, "bad_request"},
        {"GET /t/hello HTTP/1.1\r\n" HOST "X-A: b\r\n c\r\n\r\n", 400, "bad_request"},
        {"GET /t/hello HTTP/1.1\r\n\r\n", 400, "bad_request"},
        {"GET /t/hello HTTP/2.0\r\n" HOST "\r\n", 505, "http_version_not_supported"},
        {long_url, 414, "uri_too_long"},
        {many, 431, "request_header_fields_too_large"},
    };
    cg_http_stats st0, st1;
    cg_http_get_stats(srv, &st0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *ans = raw_exchange(port, cases[i].req, strlen(cases[i].req));
        assert_raw_error(ans, cases[i].status, cases[i].code);
        ck_assert_ptr_nonnull(strstr(ans, "Connection: close\r\n"));
        ck_assert_ptr_nonnull(strstr(ans, "X-Request-Id: "));
        free(ans);
    }
    cg_http_get_stats(srv, &st1);
    ck_assert_uint_eq(st1.malformed - st0.malformed, sizeof cases / sizeof cases[0] - 1);
    ck_assert_uint_eq(st1.headers_too_large - st0.headers_too_large, 1);
    free(long_url);
    free(many);
    /* the server goes on serving */
    th_resp r;
    http(&r, "GET", "/t/hello", NULL, 0, NULL, 0);
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
}
END_TEST

/* What libmicrohttpd answers by itself when the framing check is off: the reason the check
 * exists. With 0.9.75 a malformed Content-Length gets its status line and headers twice and an
 * HTML page, a bad chunk size an HTML page, and whitespace before a colon is accepted. */
START_TEST(library_alone)
{
    cg_http_params p = cg_http_default_params();
    p.listen = "127.0.0.1:0";
    p.max_body_bytes = 4096;
    p.routes = routes;
    p.n_routes = sizeof routes / sizeof routes[0];
    p.no_framing_check = 1;
    cg_http_server *lib = NULL;
    ck_assert_int_eq(cg_http_open(&p, &lib), CG_OK);
    uint16_t lport = cg_http_port(lib);
    const char *cl = "POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: abc\r\n\r\n";
    char *ans = raw_exchange(lport, cl, strlen(cl));
    fprintf(stderr, "libmicrohttpd %s alone, Content-Length: abc ->\n%s\n", MHD_get_version(), ans);
    ck_assert(!strncmp(ans, "HTTP/1.1 400 ", 13));
    ck_assert_ptr_null(strstr(ans, "application/json")); /* not ours: the library's page */
    if (MHD_VERSION == 0x00097500) {
        ck_assert_int_eq(status_lines(ans), 2);
        ck_assert_ptr_nonnull(strstr(ans, "<html>"));
    }
    free(ans);
    const char *chunk = "POST /t/echo HTTP/1.1\r\n" HOST "Transfer-Encoding: chunked\r\n\r\nzz\r\n";
    ans = raw_exchange(lport, chunk, strlen(chunk));
    ck_assert_ptr_null(strstr(ans, "application/json"));
    free(ans);
    const char *ws = "GET /t/hello HTTP/1.1\r\n" HOST "X-A : b\r\nConnection: close\r\n\r\n";
    ans = raw_exchange(lport, ws, strlen(ws));
    if (MHD_VERSION == 0x00097500) ck_assert(!strncmp(ans, "HTTP/1.1 200 ", 13));
    free(ans);
    cg_http_close(&lib);
}
END_TEST

/* A chunk that declares more than the body cap is refused at its size line: 413 at once, not
 * after the connection timeout (the client never sends the rest). */
START_TEST(chunked_cut_at_the_cap)
{
    const char *head = "POST /t/echo HTTP/1.1\r\n" HOST "Transfer-Encoding: chunked\r\n\r\n"
                       "fffffff\r\nabcdefgh";
    int fd = raw_connect(port);
    double t0 = th_now_s();
    ck_assert_int_eq(raw_send(fd, head, strlen(head)), 0);
    int closed;
    char *ans = raw_recv(fd, 3000, &closed);
    double dt = th_now_s() - t0;
    close(fd);
    assert_raw_error(ans, 413, "request_too_large");
    ck_assert_msg(dt < 2.0, "413 after %.2f s", dt);
    free(ans);
    /* several small chunks that add up past the cap (4096): cut at the one that passes it */
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(
        cg_buf_printf(&b, "POST /t/echo HTTP/1.1\r\n" HOST "Transfer-Encoding: chunked\r\n\r\n"),
        CG_OK);
    for (int i = 0; i < 5; i++) {
        char data[1001];
        memset(data, ' ', 1000);
        data[1000] = '\0';
        ck_assert_int_eq(cg_buf_printf(&b, "3e8\r\n%s\r\n", data), CG_OK);
    }
    fd = raw_connect(port);
    ck_assert_int_eq(raw_send(fd, b.data, b.len), 0); /* no last chunk: the client would go on */
    ans = raw_recv(fd, 3000, &closed);
    close(fd);
    assert_raw_error(ans, 413, "request_too_large");
    free(ans);
    cg_buf_free(&b);
}
END_TEST

/* Clients that write their whole body before reading (Python's urllib) get the 413, not a
 * broken pipe: the server reads and discards what they send after the answer (lingering
 * close) before it closes. */
START_TEST(lingering_close)
{
    /* 1 MiB against a 4 KiB cap: more than the socket buffers take at first, and within what
     * a lingering close reads (2 x the cap + 1 MiB; a client that sends more than that is cut,
     * so a 2 MiB body failed now and then, when the buffers had not grown to take the rest) */
    size_t n = 1u << 20;
    char *body = malloc(n);
    memset(body, 'x', n);
    for (int chunked = 0; chunked <= 1; chunked++) {
        char head[256];
        snprintf(head, sizeof head,
                 chunked ? "POST /t/echo HTTP/1.1\r\n" HOST
                           "Transfer-Encoding: chunked\r\n\r\n%zx\r\n"
                         : "POST /t/echo HTTP/1.1\r\n" HOST "Content-Length: %zu\r\n\r\n",
                 n);
        int fd = raw_connect(port);
        ck_assert_int_eq(raw_send(fd, head, strlen(head)), 0);
        int err = raw_send(fd, body, n);
        ck_assert_msg(err == 0, "chunked=%d: sending the body failed: %s", chunked, strerror(err));
        int closed;
        char *ans = raw_recv(fd, 5000, &closed);
        close(fd);
        assert_raw_error(ans, 413, "request_too_large");
        free(ans);
    }
    free(body);
    cg_http_stats st;
    for (int i = 0; i < 100; i++) { /* counted when the library lets go of the socket */
        cg_http_get_stats(srv, &st);
        if (st.lingered >= 2) break;
        th_sleep_ms(20);
    }
    ck_assert_uint_ge(st.lingered, 2);
}
END_TEST

/* Expect: 100-continue without a valid key gets 401 before the client sends the body; with one
 * the body is asked for and served. */
START_TEST(expect_continue_auth)
{
    const char *head = "POST /t/secure HTTP/1.1\r\n" HOST "Content-Length: 2\r\n"
                       "Expect: 100-continue\r\n\r\n";
    int fd = raw_connect(port);
    ck_assert_int_eq(raw_send(fd, head, strlen(head)), 0);
    int closed;
    char *ans = raw_recv(fd, 3000, &closed);
    close(fd);
    ck_assert_msg(!strstr(ans, "100 Continue"), "asked for the body first: %.200s", ans);
    assert_raw_error(ans, 401, "invalid_api_key");
    free(ans);
    const char *ok = "POST /t/secure HTTP/1.1\r\n" HOST "Authorization: Bearer key-one\r\n"
                     "Content-Length: 2\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n";
    fd = raw_connect(port);
    ck_assert_int_eq(raw_send(fd, ok, strlen(ok)), 0);
    ans = raw_recv(fd, 500, &closed); /* the server waits for the body now */
    ck_assert_msg(strstr(ans, "HTTP/1.1 100 Continue"), "no 100 Continue: %.200s", ans);
    free(ans);
    ck_assert_int_eq(raw_send(fd, "{}", 2), 0);
    ans = raw_recv(fd, 3000, &closed);
    close(fd);
    ck_assert_msg(strstr(ans, "HTTP/1.1 200 "), "%.200s", ans);
    free(ans);
}
END_TEST

/* An absolute-form target (RFC 9112 §3.2.2: a server must accept it) names the same route as
 * its path, and a bearer token is compared without the whitespace around it (the library
 * keeps trailing blanks in the value). */
START_TEST(absolute_form_and_padded_token)
{
    const struct {
        const char *req;
        const char *status;
    } cases[] = {
        {"GET http://localhost/t/hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
         "HTTP/1.1 200 "},
        {"GET HTTP://x/t/items/abc HTTP/1.1\r\n" HOST "Connection: close\r\n\r\n", "HTTP/1.1 200 "},
        {"GET http://x/t/nope HTTP/1.1\r\n" HOST "Connection: close\r\n\r\n", "HTTP/1.1 404 "},
        {"GET /t/admin HTTP/1.1\r\n" HOST "Authorization: Bearer s3cret-admin \t\r\n"
         "Connection: close\r\n\r\n",
         "HTTP/1.1 200 "},
        {"GET /t/auth HTTP/1.1\r\n" HOST "Authorization: Bearer key-one  \r\n"
         "Connection: close\r\n\r\n",
         "HTTP/1.1 200 "},
        {"GET /t/auth HTTP/1.1\r\n" HOST "Authorization: Bearer key-one x\r\n"
         "Connection: close\r\n\r\n",
         "HTTP/1.1 401 "},
        {"GET /t/auth HTTP/1.1\r\n" HOST "Authorization: Bearer  \r\n"
         "Connection: close\r\n\r\n",
         "HTTP/1.1 401 "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *ans = raw_exchange(port, cases[i].req, strlen(cases[i].req));
        ck_assert_msg(!strncmp(ans, cases[i].status, strlen(cases[i].status)), "case %zu: %.200s",
                      i, ans);
        free(ans);
    }
}
END_TEST

START_TEST(reply_without_body)
{
    const struct {
        const char *path;
        long status;
        const char *code;
    } cases[] = {
        {"/t/nobody/429", 429, "rate_limit_exceeded"},
        {"/t/nobody/502", 502, "bad_gateway"},
        {"/t/nobody/503", 503, "upstream_unavailable"},
        {"/t/nobody/418", 418, "invalid_value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_resp r;
        http(&r, "GET", cases[i].path, NULL, 0, NULL, 0);
        assert_error(&r, cases[i].status, cases[i].code);
        th_resp_free(&r);
    }
}
END_TEST

/* HEAD is served by GET routes, without the body. */
START_TEST(head_on_get_routes)
{
    const char *paths[] = {"/t/hello", "/t/items/abc"}; /* inline and job-pool routes */
    for (size_t i = 0; i < 2; i++) {
        char req[256];
        snprintf(req, sizeof req, "HEAD %s HTTP/1.1\r\n" HOST "Connection: close\r\n\r\n",
                 paths[i]);
        char *ans = raw_exchange(port, req, strlen(req));
        ck_assert_msg(!strncmp(ans, "HTTP/1.1 200 ", 13), "%s: %.200s", paths[i], ans);
        ck_assert_ptr_nonnull(strstr(ans, "Content-Length: "));
        const char *end = strstr(ans, "\r\n\r\n");
        ck_assert_ptr_nonnull(end);
        ck_assert_str_eq(end + 4, ""); /* no body */
        free(ans);
    }
    const char *post_only = "HEAD /t/echo HTTP/1.1\r\n" HOST "Connection: close\r\n\r\n";
    char *ans = raw_exchange(port, post_only, strlen(post_only));
    ck_assert(!strncmp(ans, "HTTP/1.1 405 ", 13));
    free(ans);
}
END_TEST

/* A malformed request pipelined behind one still being answered waits for that answer, then
 * gets its own; the answers never interleave. */
START_TEST(refusal_after_pending_answer)
{
    int fd = raw_connect(port);
    const char *first = "GET /t/stream HTTP/1.1\r\n" HOST "\r\n";
    ck_assert_int_eq(raw_send(fd, first, strlen(first)), 0);
    th_sleep_ms(30); /* the stream is under way (20 events, 5 ms apart) */
    const char *bad = "GET /t/hello HTTP/1.1\r\n" HOST "X-A : b\r\n\r\n";
    ck_assert_int_eq(raw_send(fd, bad, strlen(bad)), 0);
    int closed;
    char *ans = raw_recv(fd, 5000, &closed);
    close(fd);
    ck_assert_int_eq(closed, 1);
    ck_assert(!strncmp(ans, "HTTP/1.1 200 ", 13));
    const char *second = strstr(ans + 1, "HTTP/1.1 ");
    ck_assert_msg(second != NULL, "no second answer: %.300s", ans);
    ck_assert_int_eq(count_of(ans, "data: "), 20); /* the whole stream came first */
    ck_assert_ptr_null(strstr(second, "data: "));
    assert_raw_error(second, 400, "bad_request");
    free(ans);
}
END_TEST

/* Sends the raw request in b (freed then) to the server: a head at its cap reaches the
 * router (its JSON 404), one past it (past) gets the framing check's JSON 431. */
static void exchange_at_cap(cg_buf *b, int past)
{
    char *ans = raw_exchange(port, b->data, b->len);
    if (past)
        assert_raw_error(ans, 431, "request_header_fields_too_large");
    else
        assert_raw_error(ans, 404, "not_found");
    free(ans);
    cg_buf_free(b);
}

/* The framing check's head limits lie inside the library's connection memory: a head just
 * inside them reaches the router (its JSON 404), and one past them gets the check's JSON 431,
 * never the library's own HTML 431. */
START_TEST(head_limits_inside_the_library)
{
    /* default limits: 16 KiB of names + values, 100 fields, 8 KiB target */
    cg_buf b;
    char target[8193]; /* an 8 KiB target */
    memset(target, 't', 8192);
    target[0] = '/';
    target[8192] = '\0';
    for (int past = 0; past <= 1; past++) {
        cg_buf_init_unbounded(&b);
        ck_assert_int_eq(cg_buf_printf(&b, "GET %s HTTP/1.1\r\nHost: x\r\n", target), CG_OK);
        size_t sum = 4 + 1; /* Host: x */
        char val[200];
        memset(val, 'v', sizeof val);
        val[160] = '\0';
        for (int i = 0; i < 97; i++) { /* 97 x (5 + 160), values padded with blanks */
            ck_assert_int_eq(cg_buf_printf(&b, "X-%03d:  %s  \r\n", i, val), CG_OK);
            sum += 5 + 160;
        }
        sum += 10 + 5 + 5;                        /* Connection: close, and the name X-end */
        size_t last = 16384 - sum + (size_t)past; /* 100 fields, 16 KiB (+1) of names + values */
        char *lv = malloc(last + 1);
        memset(lv, 'w', last);
        lv[last] = '\0';
        ck_assert_int_eq(cg_buf_printf(&b, "X-end: %s\r\nConnection: close\r\n\r\n", lv), CG_OK);
        free(lv);
        exchange_at_cap(&b, past);
    }
    /* the raw head at its cap (16 KiB + 8 KiB + 8 KiB): an 8 KiB target, 100 fields, blanks */
    for (int past = 0; past <= 1; past++) {
        cg_buf_init_unbounded(&b);
        ck_assert_int_eq(
            cg_buf_printf(&b, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n", target),
            CG_OK);
        for (int i = 0; i < 97; i++)
            ck_assert_int_eq(cg_buf_printf(&b, "X-%03d: v\r\n", i), CG_OK);
        size_t blanks = 32768 - b.len - strlen("X-end: v\r\n\r\n") + (size_t)past;
        ck_assert_int_eq(cg_buf_append(&b, "X-end: ", 7), CG_OK);
        for (size_t i = 0; i < blanks; i++)
            ck_assert_int_eq(cg_buf_append(&b, " ", 1), CG_OK);
        ck_assert_int_eq(cg_buf_append(&b, "v\r\n\r\n", 5), CG_OK);
        ck_assert_uint_eq(b.len, 32768 + (size_t)past);
        exchange_at_cap(&b, past);
    }
}
END_TEST

/* The accepted socket in this process whose peer is the client socket fd, or -1. */
static int server_side_of(int fd)
{
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&me, &len), 0);
    for (int s = 0; s < 4096; s++) {
        struct sockaddr_in peer;
        len = sizeof peer;
        if (s != fd && getpeername(s, (struct sockaddr *)&peer, &len) == 0 &&
            peer.sin_family == AF_INET && peer.sin_port == me.sin_port &&
            peer.sin_addr.s_addr == me.sin_addr.s_addr)
            return s;
    }
    return -1;
}

/* params.sndbuf_bytes caps the kernel's send buffer of every client connection: the accepted
 * socket has what the kernel grants for it (twice the request on Linux), and a client that
 * never reads holds only about that much before the stream's producer is held back (and cut
 * by its stall timeout). Over loopback the kernel's autotuning starts such a socket at about
 * 1 MiB and lets it grow to tcp_wmem's max (4 MiB by default). */
START_TEST(send_buffer_capped)
{
    enum { CAP = 16 << 10 };
    cg_http_params p = cg_http_default_params();
    p.listen = "127.0.0.1:0";
    p.routes = routes;
    p.n_routes = sizeof routes / sizeof routes[0];
    p.sndbuf_bytes = CAP;
    cg_http_server *capped = NULL;
    ck_assert_int_eq(cg_http_open(&p, &capped), CG_OK);
    /* what the kernel grants for the cap, on a socket of our own */
    int probe = socket(AF_INET, SOCK_STREAM, 0), want = CAP, granted = 0;
    socklen_t len = sizeof granted;
    ck_assert_int_eq(setsockopt(probe, SOL_SOCKET, SO_SNDBUF, &want, sizeof want), 0);
    ck_assert_int_eq(getsockopt(probe, SOL_SOCKET, SO_SNDBUF, &granted, &len), 0);
    close(probe);
    ck_assert_int_ge(granted, CAP);
    /* a client with a small receive buffer that asks for a stream and never reads it */
    int fd = socket(AF_INET, SOCK_STREAM, 0), rcv = 4096;
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(cg_http_port(capped))};
    a.sin_addr.s_addr = htonl(0x7f000001);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "GET /t/flood HTTP/1.1\r\nHost: x\r\n\r\n";
    ck_assert_int_eq(raw_send(fd, req, strlen(req)), 0);
    /* once the stream has begun, the server's side of the connection is open in this process */
    wait_locked(&prod_pushed, 10);
    ck_assert_int_gt(prod_pushed, 0);
    pthread_mutex_unlock(&prod_mu);
    int sfd = server_side_of(fd);
    ck_assert_int_ge(sfd, 0);
    int got = 0;
    len = sizeof got;
    ck_assert_int_eq(getsockopt(sfd, SOL_SOCKET, SO_SNDBUF, &got, &len), 0);
    ck_assert_int_eq(got, granted);
    /* the producer is held back, then cut for the stall */
    wait_locked(&prod_finished, 30);
    size_t through = flood_bytes;
    int finished = prod_finished, stalled = flood_stalled;
    pthread_mutex_unlock(&prod_mu);
    ck_assert_msg(finished && stalled, "the stream was not cut for its stall");
    /* the kernel's buffer, the client's window, the library's 16 KiB block and our 4 KiB
     * queue, with room to spare; autotuning lets more than 1 MiB through */
    ck_assert_msg(through < 256u << 10, "%zu bytes went to a client that never reads", through);
    close(fd);
    cg_http_close(&capped);
}
END_TEST

START_TEST(bad_listen_address)
{
    cg_http_params p = cg_http_default_params();
    p.routes = routes;
    p.n_routes = 1;
    cg_http_server *s = NULL;
    p.listen = "no-port";
    ck_assert_int_eq(cg_http_open(&p, &s), CG_E_VALUE);
    ck_assert_ptr_null(s);
    /* the port of the running server is taken */
    char taken[64];
    snprintf(taken, sizeof taken, "127.0.0.1:%u", (unsigned)port);
    p.listen = taken;
    ck_assert_int_ne(cg_http_open(&p, &s), CG_OK);
    ck_assert_ptr_null(s);
}
END_TEST

int main(void)
{
    return th_run_suite(
        "http", "server", 60, (th_fixture){setup, teardown, 1}, CK_FORK_GETENV,
        TH_TESTS(routing, json_body, json_limits_scan, fast_handlers, body_caps, request_ids,
                 bearer_auth, stream_complete, stream_client_disconnect,
                 stream_idle_disconnect_heartbeat, stream_nowait_backpressure, many_streams,
                 quiesce_refuses_new_connections, stop_with_live_stream, json_helpers,
                 metrics_registry_lookups, bad_listen_address, framing_refusals, library_alone,
                 chunked_cut_at_the_cap, lingering_close, expect_continue_auth, head_on_get_routes,
                 absolute_form_and_padded_token, reply_without_body, refusal_after_pending_answer,
                 head_limits_inside_the_library, send_buffer_capped));
}
