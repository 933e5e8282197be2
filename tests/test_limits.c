/* Integration suite for the gateway's limits, each at the limit and one past it: request
 * headers (431), body with and without Content-Length (413), segments and segment size (400),
 * JSON values and depth (400), open connections (the extra one is closed), the backend's
 * answer size (502); the memory that hostile JSON bodies cost (peak and after); and slow
 * clients (slowloris): headers or bodies dribbled in are cut by --conn-timeout-s while other
 * clients are served as before. The real chunkgate in front of tests/fake_backend. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/harness.h"

#define HDR_MAX 4096
#define BODY_MAX 4096
#define SEG_BYTES 1000
#define MAX_CONN 8
#define UP_MAX 65536

static th_proc fake, gw, gws;
static char backend[64];

static void setup(void)
{
    th_init("limits", NULL);
    const char *fargs[] = {"--delay-ms", "100", "--events", "5", NULL};
    if (th_start_fake(&fake, FAKE_BACKEND_BIN, "fake", fargs) != 0) th_die("fake backend", &fake);
    snprintf(backend, sizeof backend, "http://127.0.0.1:%d", fake.port);
    const char *extra[] = {"--backend",
                           backend,
                           "--max-header-bytes",
                           "4K",
                           "--max-body-bytes",
                           "4K",
                           "--max-segments",
                           "8",
                           "--max-segment-bytes",
                           "1000",
                           "--max-connections",
                           "8",
                           "--max-upstream-bytes",
                           "64K",
                           "--max-json-values",
                           "1000",
                           "--max-json-depth",
                           "16",
                           NULL};
    if (th_start_gateway(&gw, CHUNKGATE_BIN, "gw", extra) != 0) th_die("gateway", &gw);
    const char *extra_s[] = {"--backend", backend, "--conn-timeout-s", "2", NULL};
    if (th_start_gateway(&gws, CHUNKGATE_BIN, "gws", extra_s) != 0) th_die("gateway (slow)", &gws);
}

static void teardown(void)
{
    th_stop_clean(&gw, "chunkgate");
    th_stop_clean(&gws, "chunkgate (slow clients)");
    th_stop(&fake, SIGTERM);
    th_cleanup(th_failures);
}

/* Sends a raw request (Connection: close is the caller's) and returns the whole answer. */
static char *raw(int port, const char *req, size_t len)
{
    int fd = th_connect(port);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(th_send_all(fd, req, len), 0);
    int closed;
    char *ans = th_recv(fd, 10000, 1 << 20, &closed);
    close(fd);
    return ans;
}

static int status_of(const char *ans)
{
    return strncmp(ans, "HTTP/1.1 ", 9) ? 0 : atoi(ans + 9);
}

static char *pad(size_t n, char c)
{
    char *p = cg_malloc(n + 1);
    memset(p, c, n);
    p[n] = '\0';
    return p;
}

/* ------------------------------------------------------------ headers */

/* The header bytes counted are the sum of names and values: "Host" "x" "Connection" "close"
 * "X-Pad" pad -> 20 + pad. */
static char *head_request(const char *method, const char *path, size_t pad_len, const char *body)
{
    char *p = pad(pad_len, 'h');
    cg_buf b;
    cg_buf_init_unbounded(&b);
    cg_status st = cg_buf_printf(
        &b, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: %s\r\n", method, path, p);
    if (body) /* Content-Type + application/json = 28, Content-Length + digits */
        st = cg_buf_printf(&b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                           strlen(body), body);
    else
        st = cg_buf_printf(&b, "\r\n");
    ck_assert_int_eq(st, CG_OK);
    free(p);
    return b.data;
}

START_TEST(headers_at_and_past_the_limit)
{
    size_t fixed = strlen("Host") + 1 + strlen("Connection") + strlen("close") + strlen("X-Pad");
    for (int past = 0; past <= 1; past++) {
        char *req = head_request("GET", "/healthz", HDR_MAX - fixed + (size_t)past, NULL);
        char *ans = raw(gw.port, req, strlen(req));
        ck_assert_msg(status_of(ans) == (past ? 431 : 200), "past=%d: %.200s", past, ans);
        if (past)
            ck_assert_ptr_nonnull(strstr(ans, "\"code\":\"request_header_fields_too_large\""));
        free(ans);
        free(req);
    }
    /* the same on the inference route, with a body */
    const char *body = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":1}";
    char cl[16];
    snprintf(cl, sizeof cl, "%zu", strlen(body));
    fixed +=
        strlen("Content-Type") + strlen("application/json") + strlen("Content-Length") + strlen(cl);
    for (int past = 0; past <= 1; past++) {
        char *req = head_request("POST", "/v1/completions", HDR_MAX - fixed + (size_t)past, body);
        char *ans = raw(gw.port, req, strlen(req));
        ck_assert_msg(status_of(ans) == (past ? 431 : 200), "past=%d: %.300s", past, ans);
        free(ans);
        free(req);
    }
    /* far past: a head larger than MHD's connection memory (2 x 4 KiB + 32 KiB) */
    char *req = head_request("GET", "/healthz", 200000, NULL);
    int fd = th_connect(gw.port);
    (void)th_send_all(fd, req, strlen(req)); /* the server may close before it has all of it */
    int closed;
    char *ans = th_recv(fd, 5000, 1 << 20, &closed);
    close(fd);
    fprintf(stderr, "limits: a 200 KB head gets: %.*s (closed %d)\n", (int)strcspn(ans, "\r\n"),
            ans, closed);
    ck_assert_msg(status_of(ans) == 431 || (closed && !*ans), "200 KB head: %.200s", ans);
    free(ans);
    free(req);
    ck_assert_double_ge(th_metric(gw.port, "chunkgate_http_headers_too_large_total"), 2);
}
END_TEST

/* ------------------------------------------------------------ body */

/* A valid completion body of exactly n bytes (pass-through: no separator). */
static char *body_of(size_t n)
{
    const char *head = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":1,\"pad\":\"";
    size_t fixed = strlen(head) + 2;
    ck_assert_uint_gt(n, fixed);
    char *p = pad(n - fixed, 'b');
    char *b = cg_malloc(n + 1);
    snprintf(b, n + 1, "%s%s\"}", head, p);
    free(p);
    ck_assert_uint_eq(strlen(b), n);
    return b;
}

START_TEST(body_at_and_past_the_limit)
{
    for (int past = 0; past <= 1; past++) {
        char *b = body_of(BODY_MAX + (size_t)past);
        th_resp r;
        th_http(&r, gw.port, "POST", "/v1/completions", b, NULL, NULL);
        if (past)
            ck_assert_msg(th_is_error(&r, 413, "request_too_large"), "HTTP %ld", r.status);
        else
            ck_assert_msg(r.status == 200, "HTTP %ld: %.*s", r.status, (int)r.body.len,
                          r.body.data);
        th_resp_free(&r);
        /* chunked: no Content-Length, the cap applies while reading */
        cg_buf q;
        cg_buf_init_unbounded(&q);
        cg_status st =
            cg_buf_printf(&q,
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                          "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                          "\r\n%zx\r\n%s\r\n0\r\n\r\n",
                          strlen(b), b);
        ck_assert_int_eq(st, CG_OK);
        char *ans = raw(gw.port, q.data, q.len);
        ck_assert_msg(status_of(ans) == (past ? 413 : 200), "chunked past=%d: %.200s", past, ans);
        free(ans);
        cg_buf_free(&q);
        free(b);
    }
}
END_TEST

/* ------------------------------------------------------------ segments */

static long post_status(const char *body, char *code, size_t n)
{
    th_resp r;
    th_http(&r, gw.port, "POST",
            strstr(body, "\"messages\"") ? "/v1/chat/completions" : "/v1/completions", body, NULL,
            NULL);
    long s = r.status;
    json_t *j = th_json(&r);
    snprintf(code, n, "%s",
             json_string_value(json_object_get(json_object_get(j, "error"), "code")) ?: "");
    json_decref(j);
    th_resp_free(&r);
    return s;
}

START_TEST(segments_at_and_past_the_limits)
{
    char code[64];
    /* 8 segments pass, 9 do not */
    const char *eight =
        "{\"model\":\"m\",\"prompt\":\"s # # 1 # # 2 # # 3 # # 4 # # 5 # # 6 # # q\"}";
    const char *nine =
        "{\"model\":\"m\",\"prompt\":\"s # # 1 # # 2 # # 3 # # 4 # # 5 # # 6 # # 7 # # q\"}";
    ck_assert_int_eq(post_status(eight, code, sizeof code), 200);
    ck_assert_int_eq(post_status(nine, code, sizeof code), 400);
    ck_assert_str_eq(code, "too_many_segments");
    /* a chunk, the system segment, the question: 1000 bytes pass, 1001 do not */
    for (int where = 0; where < 3; where++)
        for (int past = 0; past <= 1; past++) {
            char *p = pad(SEG_BYTES + (size_t)past, 'a' + (char)where);
            char body[4096];
            snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s # # %s # # %s\"}",
                     where == 0 ? p : "s", where == 1 ? p : "d", where == 2 ? p : "q");
            long st = post_status(body, code, sizeof code);
            ck_assert_msg(st == (past ? 400 : 200), "where %d past %d: %ld", where, past, st);
            if (past) ck_assert_str_eq(code, "segment_too_large");
            free(p);
        }
    /* surrounding blanks are trimmed before the size counts */
    char *p = pad(SEG_BYTES, 'z');
    char body[4096];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"s # #    %s    # # q\"}", p);
    ck_assert_int_eq(post_status(body, code, sizeof code), 200);
    /* chat: a document over the limit */
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
             "\"documents\":[\"%sz\"]}",
             p);
    ck_assert_int_eq(post_status(body, code, sizeof code), 400);
    ck_assert_str_eq(code, "segment_too_large");
    /* a prompt without separator is not split, so only the body cap applies */
    char *big = pad(3 * SEG_BYTES, 'n');
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s\"}", big);
    ck_assert_int_eq(post_status(body, code, sizeof code), 200);
    free(big);
    free(p);
}
END_TEST

/* ------------------------------------------------------------ JSON */

/* {"model":"m","prompt":"hi","x":[0,...]} with k array elements. Counted as the limits count:
 * 1 + containers + commas = 1 + 2 + 2 + (k - 1) = k + 4 values. */
static char *array_body(size_t k)
{
    const char *head = "{\"model\":\"m\",\"prompt\":\"hi\",\"x\":[";
    size_t hl = strlen(head), n = hl + 2 * k + 2;
    char *b = cg_malloc(n + 1);
    memcpy(b, head, hl);
    for (size_t i = 0; i < k; i++)
        memcpy(b + hl + 2 * i, "0,", 2);
    memcpy(b + hl + 2 * k - 1, "]}", 3);
    return b;
}

START_TEST(json_values_depth_and_duplicates)
{
    char code[64];
    /* --max-json-values 1000 */
    for (int past = 0; past <= 1; past++) {
        char *b = array_body(1000 - 4 + (size_t)past);
        long st = post_status(b, code, sizeof code);
        ck_assert_msg(st == (past ? 400 : 200), "past=%d: %ld %s", past, st, code);
        if (past) ck_assert_str_eq(code, "json_too_complex");
        free(b);
    }
    /* --max-json-depth 16: the body object is level 1 */
    for (int past = 0; past <= 1; past++) {
        cg_buf b;
        cg_buf_init_unbounded(&b);
        int n = 15 + past;
        ck_assert_int_eq(cg_buf_printf(&b, "{\"model\":\"m\",\"prompt\":\"hi\",\"x\":"), CG_OK);
        for (int i = 0; i < n; i++)
            ck_assert_int_eq(cg_buf_append(&b, "[", 1), CG_OK);
        for (int i = 0; i < n; i++)
            ck_assert_int_eq(cg_buf_append(&b, "]", 1), CG_OK);
        ck_assert_int_eq(cg_buf_append(&b, "}", 1), CG_OK);
        long st = post_status(b.data, code, sizeof code);
        ck_assert_msg(st == (past ? 400 : 200), "depth %d: %ld %s", n + 1, st, code);
        if (past) ck_assert_str_eq(code, "json_too_complex");
        cg_buf_free(&b);
    }
    /* duplicate keys, at the top and nested, are refused (a backend reading the other copy
     * would serve another request than the one the gateway checked and keyed) */
    const char *dups[] = {"{\"model\":\"m\",\"prompt\":\"a # # b # # c\",\"prompt\":\"x\"}",
                          "{\"model\":\"m\",\"prompt\":\"hi\",\"x\":{\"a\":1,\"a\":2}}",
                          "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"role\":\"system\","
                          "\"content\":\"q\"}]}"};
    for (size_t i = 0; i < CG_ARRAY_LEN(dups); i++) {
        ck_assert_int_eq(post_status(dups[i], code, sizeof code), 400);
        ck_assert_str_eq(code, "invalid_json");
    }
}
END_TEST

/* VmRSS or VmHWM of a process in MiB, or -1. */
static long proc_mib(pid_t pid, const char *field)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    char *t = th_read_file(path, NULL);
    const char *p = strstr(t, field);
    long kb = p ? strtol(p + strlen(field) + 1, NULL, 10) : -1;
    free(t);
    return kb < 0 ? -1 : kb / 1024;
}

typedef struct big_post {
    const char *body;
    int port;
    long status;
    char code[64];
} big_post;

static void *post_big(void *arg)
{
    big_post *b = arg;
    th_resp r;
    th_http(&r, b->port, "POST", "/v1/completions", b->body, NULL, NULL);
    b->status = r.status;
    json_t *j = th_json(&r);
    snprintf(b->code, sizeof b->code, "%s",
             json_string_value(json_object_get(json_object_get(j, "error"), "code")) ?: "");
    json_decref(j);
    th_resp_free(&r);
    return NULL;
}

/* Four 8 MB bodies at once, each a 4-million-element array, then four 8 MB prompts: the
 * gateway's peak RSS rises by less than 300 MB and comes back down afterwards. */
START_TEST(hostile_json_memory)
{
    char *arr = array_body(4000000 - 1);
    size_t sl = 8 * 1000 * 1000;
    char *str = cg_malloc(sl + 1);
    const char *sh = "{\"model\":\"m\",\"max_tokens\":1,\"prompt\":\"";
    memcpy(str, sh, strlen(sh));
    memset(str + strlen(sh), 'a', sl - strlen(sh) - 2);
    memcpy(str + sl - 2, "\"}", 3);
    /* the peak since now (Linux >= 4.0 resets VmHWM on "5" into clear_refs) */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)gws.pid);
    int reset = th_write_file(path, "5") == 0;
    long before = proc_mib(gws.pid, "VmRSS:");
    for (int round = 0; round < 2; round++) {
        big_post p[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            p[i] = (big_post){round ? str : arr, gws.port, 0, ""};
            pthread_create(&th[i], NULL, post_big, &p[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            if (round == 0)
                ck_assert_msg(p[i].status == 400 && !strcmp(p[i].code, "json_too_complex"),
                              "4M-element array: HTTP %ld %s", p[i].status, p[i].code);
            else
                ck_assert_msg(p[i].status == 200, "8 MB prompt: HTTP %ld", p[i].status);
        }
    }
    long peak = proc_mib(gws.pid, "VmHWM:");
    long after = -1;
    for (int i = 0; i < 30; i++) { /* the heap is trimmed every 200 ms */
        th_sleep_ms(100);
        after = proc_mib(gws.pid, "VmRSS:");
        if (after <= before + 32) break;
    }
    fprintf(stderr,
            "hostile JSON: gateway RSS %ld MiB before, peak %ld MiB%s, %ld MiB after (4 x 8 MB "
            "arrays of 4M elements, then 4 x 8 MB prompts, at once)\n",
            before, peak, reset ? "" : " (peak of the process's life: clear_refs refused)", after);
    free(arr);
    free(str);
#ifdef CG_SANITIZE_BUILD
    fprintf(stderr, "hostile JSON: RSS bounds not checked in a sanitizer build\n");
#else
    if (reset) ck_assert_msg(peak - before < 300, "peak rose by %ld MiB", peak - before);
    ck_assert_msg(after <= before + 32, "RSS stayed at %ld MiB (from %ld)", after, before);
#endif
}
END_TEST

/* ------------------------------------------------------------ upstream answer size */

START_TEST(upstream_answer_at_and_past_the_limit)
{
    /* The fake's answer to FAULT:BIG:k grows by exactly one byte per unit of k (same digit
     * count): measure it directly once, then ask the gateway for exactly the limit. */
    const char *rid[] = {"X-Request-Id: limit-test-0001", NULL};
    th_resp r;
    th_http(&r, fake.port, "POST", "/v1/completions",
            "{\"model\":\"m\",\"prompt\":\"FAULT:BIG:50000\"}", NULL, rid);
    ck_assert_int_eq(r.status, 200);
    size_t l0 = r.body.len;
    th_resp_free(&r);
    long k = 50000 + (long)(UP_MAX - l0);
    ck_assert_int_lt(k, 99999);
    for (int past = 0; past <= 1; past++) {
        char body[128];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"FAULT:BIG:%ld\"}", k + past);
        th_http(&r, gw.port, "POST", "/v1/completions", body, NULL, rid);
        if (past) {
            ck_assert_msg(th_is_error(&r, 502, "bad_gateway"), "past: HTTP %ld", r.status);
        } else {
            ck_assert_msg(r.status == 200, "at the limit: HTTP %ld %.200s", r.status, r.body.data);
            json_t *j = th_json(&r);
            ck_assert_uint_eq(json_string_length(json_object_get(j, "padding")), (size_t)k);
            json_decref(j);
        }
        th_resp_free(&r);
    }
}
END_TEST

/* ------------------------------------------------------------ connections */

/* 1 when the server closed fd (a refused connection is closed at once). */
static int peer_closed(int fd)
{
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

START_TEST(connections_at_and_past_the_limit)
{
    int fds[MAX_CONN];
    for (int i = 0; i < MAX_CONN; i++) {
        fds[i] = th_connect(gw.port);
        ck_assert_int_ge(fds[i], 0);
    }
    /* at the limit: all 8 are admitted and served. Connections of earlier requests may still
     * be counted for a moment (their close is noticed asynchronously), so a socket refused
     * then is opened again until the gateway counts exactly these 8. */
    const char *q = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    int at_limit = 0;
    char *ans = NULL;
    for (int round = 0; round < 100 && !at_limit; round++) {
        th_sleep_ms(50);
        for (int i = 0; i < MAX_CONN; i++)
            if (peer_closed(fds[i])) {
                close(fds[i]);
                fds[i] = th_connect(gw.port);
            }
        th_sleep_ms(50);
        if (peer_closed(fds[MAX_CONN - 1])) continue;
        ck_assert_int_eq(th_send_all(fds[MAX_CONN - 1], q, strlen(q)), 0);
        free(ans);
        ans = th_recv_response(fds[MAX_CONN - 1], 5000);
        at_limit = status_of(ans) == 200 && strstr(ans, "\nchunkgate_http_connections 8\n");
    }
    ck_assert_msg(at_limit, "8 connections were never open and served at once: %.100s", ans);
    free(ans);
    /* past it: a 9th is accepted by the kernel and closed at once without a reply */
    th_resp r;
    th_http(&r, gw.port, "GET", "/healthz", NULL, NULL, NULL);
    fprintf(stderr, "limits: the 9th connection gets curl error %d (%s)\n", (int)r.rc,
            curl_easy_strerror(r.rc));
    ck_assert_msg(r.rc == CURLE_GOT_NOTHING || r.rc == CURLE_RECV_ERROR ||
                      r.rc == CURLE_SEND_ERROR || r.rc == CURLE_COULDNT_CONNECT,
                  "the 9th connection was served: curl %d HTTP %ld", (int)r.rc, r.status);
    th_resp_free(&r);
    /* the 8 open ones are unaffected */
    for (int i = 0; i < MAX_CONN; i++) {
        const char *h = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        ck_assert_int_eq(th_send_all(fds[i], h, strlen(h)), 0);
        ans = th_recv_response(fds[i], 5000);
        ck_assert_msg(status_of(ans) == 200, "connection %d: %.100s", i, ans);
        free(ans);
    }
    for (int i = 0; i < MAX_CONN; i++)
        close(fds[i]);
    /* room again once they are gone */
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        th_http(&r, gw.port, "GET", "/healthz", NULL, NULL, NULL);
        ok = r.status == 200;
        th_resp_free(&r);
        if (!ok) th_sleep_ms(20);
    }
    ck_assert(ok);
    ck_assert_double_ge(th_metric(gw.port, "chunkgate_http_connections_refused_total"), 1);
}
END_TEST

/* ------------------------------------------------------------ slow clients */

#define N_SLOW 50

typedef struct slow {
    int fd[N_SLOW];
    double closed_at[N_SLOW]; /* 0 = still open */
    double t0;
    volatile int stop;
} slow;

/* Dribbles one byte every 250 ms into each connection until the server closes it. */
static void *dribble(void *arg)
{
    slow *s = arg;
    while (!s->stop) {
        int open = 0;
        for (int i = 0; i < N_SLOW; i++) {
            if (s->closed_at[i] > 0) continue;
            char c = 'a';
            if (send(s->fd[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
                s->closed_at[i] = th_now_s();
                continue;
            }
            char tmp[256];
            ssize_t n = recv(s->fd[i], tmp, sizeof tmp, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                s->closed_at[i] = th_now_s();
                continue;
            }
            open++;
        }
        if (!open || th_now_s() - s->t0 > 12) break;
        th_sleep_ms(250);
    }
    return NULL;
}

static double pct(double *v, int n, double p)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[(int)(p * (n - 1) + 0.5)];
}

static void measure(double *lat, int n)
{
    for (int i = 0; i < n; i++) {
        th_resp r;
        th_http(&r, gws.port, "POST", "/v1/completions",
                "{\"model\":\"m\",\"prompt\":\"sys # # doc # # q\",\"max_tokens\":1}", NULL, NULL);
        ck_assert_msg(r.status == 200, "a normal request failed: HTTP %ld curl %d", r.status,
                      (int)r.rc);
        lat[i] = r.secs * 1e3;
        th_resp_free(&r);
    }
}

START_TEST(slow_clients_are_cut_others_unaffected)
{
    double before[20], during[20];
    measure(before, 20);
    slow s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < N_SLOW; i++) {
        s.fd[i] = th_connect(gws.port);
        ck_assert_int_ge(s.fd[i], 0);
        const char *start =
            i < 40
                ? "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "
                : "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: 100000\r\n\r\n{\"model\":\"m\",\"prompt\":\"";
        ck_assert_int_eq(th_send_all(s.fd[i], start, strlen(start)), 0);
    }
    s.t0 = th_now_s();
    pthread_t th;
    pthread_create(&th, NULL, dribble, &s);
    th_sleep_ms(300);
    measure(during, 20);
    /* a stream longer than the timeout is not cut: 60 events 100 ms apart */
    char **ev;
    int nev;
    long status;
    ck_assert_int_eq(
        th_sse_data(gws.port, "/v1/completions",
                    "{\"model\":\"m\",\"prompt\":\"FAULT:SLOW # # d # # q\",\"stream\":true}", NULL,
                    &status, &ev, &nev),
        CURLE_OK);
    ck_assert_int_eq(status, 200);
    ck_assert_int_eq(nev, 61);
    ck_assert_str_eq(ev[nev - 1], "[DONE]");
    th_sse_data_free(ev, nev);
    /* nor is a request whose answer takes longer than the timeout (the backend waits 3 s) */
    th_resp slow_answer;
    th_http(&slow_answer, gws.port, "POST", "/v1/completions",
            "{\"model\":\"m\",\"prompt\":\"FAULT:STALL:3000\"}", NULL, NULL);
    ck_assert_int_eq(slow_answer.status, 200);
    ck_assert_double_ge(slow_answer.secs, 2.9);
    th_resp_free(&slow_answer);
    pthread_join(th, NULL);
    double worst = 0;
    int cut = 0;
    for (int i = 0; i < N_SLOW; i++) {
        if (s.closed_at[i] > 0) {
            cut++;
            worst = CG_MAX(worst, s.closed_at[i] - s.t0);
        }
        close(s.fd[i]);
    }
    ck_assert_msg(cut == N_SLOW, "%d of %d slow clients were cut", cut, N_SLOW);
    ck_assert_double_lt(worst, 2 * 2 + 2); /* --conn-timeout-s 2, checked every 200 ms */
    ck_assert_double_ge(th_metric(gws.port, "chunkgate_http_connections_timed_out_total"), N_SLOW);
    double b50 = pct(before, 20, 0.5), bmax = pct(before, 20, 1.0);
    double d50 = pct(during, 20, 0.5), dmax = pct(during, 20, 1.0);
    fprintf(stderr,
            "slowloris: %d slow clients (40 headers, 10 bodies, 1 byte / 250 ms) all cut within "
            "%.2f s; normal requests p50 %.2f ms max %.2f ms before, p50 %.2f ms max %.2f ms "
            "during\n",
            N_SLOW, worst, b50, bmax, d50, dmax);
}
END_TEST

int main(void)
{
    return th_run_suite("limits", "limits", 120, (th_fixture){setup, teardown, 0}, CK_FORK_GETENV,
                        TH_TESTS(headers_at_and_past_the_limit, body_at_and_past_the_limit,
                                 segments_at_and_past_the_limits, json_values_depth_and_duplicates,
                                 hostile_json_memory, upstream_answer_at_and_past_the_limit,
                                 connections_at_and_past_the_limit,
                                 slow_clients_are_cut_others_unaffected));
}
