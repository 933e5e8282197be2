/* Test harness: HTTP over libcurl (one request, many at once), the OpenAI error shape, JSON
 * accessors, metric scrapes and the wait-until helpers. */
#include "tests/harness/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t on_head(char *d, size_t sz, size_t n, void *ud)
{
    th_resp *r = ud;
    size_t len = sz * n;
    return cg_buf_append(&r->head, d, len) == CG_OK ? len : 0;
}

/* The body, and the hang-up of q.stop_after. */
typedef struct sink {
    th_resp *r;
    size_t stop_after;
} sink;

static size_t on_body(char *d, size_t sz, size_t n, void *ud)
{
    sink *s = ud;
    if (cg_buf_append(&s->r->body, d, sz * n) != CG_OK) return 0;
    if (s->stop_after && s->r->body.len >= s->stop_after) return 0;
    return sz * n;
}

/* Chunked upload: a read callback over the body, 700 bytes at a time. */
typedef struct upload {
    const char *p;
    size_t left;
} upload;

static size_t on_read(char *out, size_t sz, size_t n, void *ud)
{
    upload *u = ud;
    size_t k = CG_MIN(sz * n, CG_MIN(u->left, (size_t)700));
    memcpy(out, u->p, k);
    u->p += k;
    u->left -= k;
    return k;
}

/* Everything one easy handle needs while it runs. */
typedef struct xfer {
    CURL *e;
    struct curl_slist *h;
    sink s;
    upload u;
    char url[1024];
} xfer;

CURL *th_easy_json(curl_write_callback write, void *ud, long timeout_s, struct curl_slist **headers)
{
    CURL *e = curl_easy_init();
    *headers = curl_slist_append(NULL, "Expect:");
    *headers = curl_slist_append(*headers, "Content-Type: application/json");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, *headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, ud);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, timeout_s);
    return e;
}

static void xfer_setup(xfer *x, th_resp *r, int port, const th_req *q)
{
    memset(r, 0, sizeof *r);
    cg_buf_init_unbounded(&r->body);
    cg_buf_init_unbounded(&r->head);
    x->s = (sink){r, q->stop_after};
    x->e = th_easy_json(on_body, &x->s,
                        q->timeout_s ? q->timeout_s : th_params_now()->http_timeout_s, &x->h);
    snprintf(x->url, sizeof x->url, "http://127.0.0.1:%d%s", port, q->path);
    curl_easy_setopt(x->e, CURLOPT_URL, x->url);
    curl_easy_setopt(x->e, CURLOPT_HEADERFUNCTION, on_head);
    curl_easy_setopt(x->e, CURLOPT_HEADERDATA, r);
    if (q->token) {
        char auth[512];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", q->token);
        x->h = curl_slist_append(x->h, auth);
    }
    for (const char *const *h = q->headers; h && *h; h++)
        x->h = curl_slist_append(x->h, *h);
    size_t len = q->body && !q->len ? strlen(q->body) : q->len;
    if (q->chunked) {
        x->u = (upload){q->body, len};
        x->h = curl_slist_append(x->h, "Transfer-Encoding: chunked");
        curl_easy_setopt(x->e, CURLOPT_POST, 1L);
        curl_easy_setopt(x->e, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(x->e, CURLOPT_READDATA, &x->u);
    } else if (q->body) {
        curl_easy_setopt(x->e, CURLOPT_POSTFIELDS, q->body);
        curl_easy_setopt(x->e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(x->e, CURLOPT_HTTPHEADER, x->h);
    curl_easy_setopt(x->e, CURLOPT_CUSTOMREQUEST,
                     q->method               ? q->method
                     : q->body || q->chunked ? "POST"
                                             : "GET");
}

static void xfer_done(xfer *x, th_resp *r)
{
    curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &r->status);
    char *ct = NULL;
    curl_easy_getinfo(x->e, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(r->ctype, sizeof r->ctype, "%s", ct ? ct : "");
    th_header(r, "X-Request-Id", r->rid, sizeof r->rid);
    curl_slist_free_all(x->h);
    curl_easy_cleanup(x->e);
}

void th_send(th_resp *r, int port, const th_req *q)
{
    xfer x;
    xfer_setup(&x, r, port, q);
    double t0 = th_now_s();
    r->rc = curl_easy_perform(x.e);
    r->secs = th_now_s() - t0;
    xfer_done(&x, r);
}

void th_http(th_resp *r, int port, const char *method, const char *path, const char *body,
             const char *token, const char *const *headers)
{
    th_req q = {.method = method, .path = path, .body = body, .token = token, .headers = headers};
    th_send(r, port, &q);
}

CURL *th_multi_done(CURLM *m, CURLcode *rc, void **priv)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        CURL *e = msg->easy_handle;
        *rc = msg->data.result;
        if (priv) curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)priv);
        curl_multi_remove_handle(m, e);
        return e;
    }
    return NULL;
}

void th_send_many(th_resp *r, int n, int port, const th_req *q)
{
    CURLM *m = curl_multi_init();
    xfer *x = cg_calloc((size_t)n, sizeof *x);
    for (int i = 0; i < n; i++) {
        xfer_setup(&x[i], &r[i], port, q);
        curl_easy_setopt(x[i].e, CURLOPT_PRIVATE, (char *)&r[i]);
        curl_multi_add_handle(m, x[i].e);
    }
    double t0 = th_now_s();
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        CURLcode rc;
        th_resp *done;
        while (th_multi_done(m, &rc, (void **)&done)) {
            done->rc = rc;
            done->secs = th_now_s() - t0;
        }
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < n; i++)
        xfer_done(&x[i], &r[i]);
    free(x);
    curl_multi_cleanup(m);
}

void th_resp_free(th_resp *r)
{
    cg_buf_free(&r->body);
    cg_buf_free(&r->head);
}

char *th_header(const th_resp *r, const char *name, char *out, size_t n)
{
    out[0] = '\0';
    size_t nl = strlen(name);
    const char *p = r->head.data, *end = p + r->head.len;
    while (p && p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t len = eol ? (size_t)(eol - p) : (size_t)(end - p);
        if (len > nl && p[nl] == ':' && !strncasecmp(p, name, nl)) {
            size_t a = nl + 1, b = len;
            while (a < b && p[a] == ' ')
                a++;
            while (b > a && (p[b - 1] == '\r' || p[b - 1] == ' '))
                b--;
            snprintf(out, n, "%.*s", (int)(b - a), p + a);
        }
        p = eol ? eol + 1 : end;
    }
    return out;
}

json_t *th_json(const th_resp *r)
{
    return json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
}

json_t *th_body_json(const th_resp *r)
{
    json_t *j = th_json(r);
    ck_assert_msg(j != NULL, "not JSON (HTTP %ld, curl %d): %.*s", r->status, (int)r->rc,
                  (int)CG_MIN(r->body.len, 400), r->body.data ? r->body.data : "");
    return j;
}

/* Sends and asserts the status; r is the caller's. */
static void send_expect(th_resp *r, int port, const char *method, const char *path,
                        const char *body, const char *token, long want)
{
    th_http(r, port, method, path, body, token, NULL);
    ck_assert_msg(r->status == want, "%s %s on port %d: HTTP %ld (want %ld, curl %d): %.*s", method,
                  path, port, r->status, want, (int)r->rc, (int)CG_MIN(r->body.len, 400),
                  r->body.data ? r->body.data : "");
}

json_t *th_call_text(int port, const char *method, const char *path, const char *body,
                     const char *token, long want)
{
    th_resp r;
    send_expect(&r, port, method, path, body, token, want);
    json_t *j = th_body_json(&r);
    th_resp_free(&r);
    return j;
}

json_t *th_call(int port, const char *method, const char *path, json_t *body, const char *token,
                long want)
{
    char *b = body ? th_dumps(body) : NULL;
    json_t *j = th_call_text(port, method, path, b, token, want);
    free(b);
    return j;
}

void th_expect(int port, const char *method, const char *path, const char *body, const char *token,
               long want)
{
    th_resp r;
    send_expect(&r, port, method, path, body, token, want);
    th_resp_free(&r);
}

char *th_dumps(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

char *th_rag(const char *sys, const char *d1, const char *d2, const char *q)
{
    size_t n = strlen(sys) + strlen(d1) + (d2 ? strlen(d2) : 0) + strlen(q) + 32;
    char *p = cg_malloc(n);
    if (d2)
        snprintf(p, n, "%s # # %s # # %s # # %s", sys, d1, d2, q);
    else
        snprintf(p, n, "%s # # %s # # %s", sys, d1, q);
    return p;
}

json_t *th_segments(const char *sys, const char *d1, const char *d2, const char *q)
{
    json_t *a = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "system", "text", sys, "role", "chunk",
                          "text", d1);
    if (d2) json_array_append_new(a, json_pack("{s:s,s:s}", "role", "chunk", "text", d2));
    json_array_append_new(a, json_pack("{s:s,s:s}", "role", "question", "text", q));
    return a;
}

/* ------------------------------------------------------------ errors and accessors */

int th_is_error_json(json_t *j, const char *code)
{
    json_t *e = json_object_get(j, "error");
    json_t *param = json_object_get(e, "param");
    return json_is_object(e) && json_is_string(json_object_get(e, "message")) &&
           json_string_length(json_object_get(e, "message")) > 0 &&
           json_is_string(json_object_get(e, "type")) &&
           (json_is_null(param) || json_is_string(param)) && th_sget(e, "code") &&
           !strcmp(th_sget(e, "code"), code);
}

int th_is_error(const th_resp *r, long status, const char *code)
{
    if (r->status != status) return 0;
    json_t *j = th_json(r);
    int ok = th_is_error_json(j, code);
    json_decref(j);
    return ok;
}

void th_assert_error_json(json_t *j, const char *code, const char *param)
{
    char *text = json_dumps(j, JSON_COMPACT);
    ck_assert_msg(th_is_error_json(j, code), "not the error shape with code %s: %s", code,
                  text ? text : "(not JSON)");
    free(text);
    if (param) ck_assert_str_eq(th_sget(json_object_get(j, "error"), "param"), param);
}

void th_assert_error(const th_resp *r, long status, const char *code, const char *param)
{
    ck_assert_msg(r->status == status, "want HTTP %ld got %ld: %.*s", status, r->status,
                  (int)r->body.len, r->body.data ? r->body.data : "");
    json_t *j = th_body_json(r);
    th_assert_error_json(j, code, param);
    json_decref(j);
}

const char *th_sget(json_t *j, const char *k)
{
    return json_string_value(json_object_get(j, k));
}

long long th_iget(json_t *j, const char *k)
{
    return json_integer_value(json_object_get(j, k));
}

int th_bget(json_t *j, const char *k)
{
    return json_is_true(json_object_get(j, k));
}

/* ------------------------------------------------------------ metrics */

int th_metric_find(const char *text, const char *series, double *v)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, series, n) && p[n] == ' ') {
            *v = strtod(p + n + 1, NULL);
            return 1;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return 0;
}

double th_metric_in(const char *text, const char *series)
{
    double v;
    return th_metric_find(text, series, &v) ? v : -1;
}

char *th_scrape(int port)
{
    th_resp r;
    th_http(&r, port, "GET", "/metrics", NULL, NULL, NULL);
    ck_assert_msg(r.status == 200, "GET /metrics on port %d: HTTP %ld (curl %d)", port, r.status,
                  (int)r.rc);
    cg_buf_free(&r.head);
    return r.body.data ? r.body.data : cg_strdup("");
}

double th_metric(int port, const char *series)
{
    char *text = th_scrape(port);
    double v = th_metric_in(text, series);
    free(text);
    return v;
}

double th_counter(int port, const char *series)
{
    char *text = th_scrape(port);
    double v = 0;
    th_metric_find(text, series, &v);
    free(text);
    return v;
}

/* ------------------------------------------------------------ waiting */

int th_wait_until(int timeout_ms, int step_ms, int (*cond)(void *), void *arg)
{
    for (int waited = 0;; waited += step_ms) {
        if (cond(arg)) return 1;
        if (waited >= timeout_ms) return 0;
        th_sleep_ms(step_ms);
    }
}

typedef struct settle {
    int port;
    const char *series;
    double want, v;
} settle;

static int counter_reached(void *arg)
{
    settle *s = arg;
    s->v = th_counter(s->port, s->series);
    return s->v >= s->want;
}

double th_counter_settled(int port, const char *series, double want)
{
    settle s = {port, series, want, 0};
    th_wait_until(5000, 20, counter_reached, &s);
    return s.v;
}

static int healthz_ok(void *arg)
{
    th_req q = {.path = "/healthz", .timeout_s = 2};
    th_resp r;
    th_send(&r, *(int *)arg, &q);
    th_resp_free(&r);
    return r.status == 200;
}

int th_wait_healthz(int port)
{
    return th_wait_until(30000, 20, healthz_ok, &port);
}

typedef struct worker_state {
    int gport;
    const char *token, *url;
    int healthy;
} worker_state;

/* GET /v1/workers on the gateway: the whole answer (new reference), or NULL. */
static json_t *workers_list(int gport, const char *token)
{
    th_resp r;
    th_http(&r, gport, "GET", "/v1/workers", NULL, token, NULL);
    json_t *j = th_json(&r);
    th_resp_free(&r);
    return j;
}

/* Whether entry x of /v1/workers is the worker at url (every worker when url is NULL). */
static int worker_matches(json_t *x, const char *url)
{
    const char *u = th_sget(x, "url");
    return !url || (u && !strcmp(u, url));
}

json_t *th_worker_view(int gport, const char *token, const char *url)
{
    json_t *j = workers_list(gport, token), *x, *found = NULL;
    size_t k;
    json_array_foreach(json_object_get(j, "data"), k, x) if (worker_matches(x, url))
    {
        found = json_incref(x);
    }
    json_decref(j);
    return found;
}

static int worker_is(void *arg)
{
    worker_state *w = arg;
    json_t *x = th_worker_view(w->gport, w->token, w->url);
    int ok = x && th_bget(x, "healthy") == !!w->healthy;
    json_decref(x);
    return ok;
}

int th_wait_worker(int gport, const char *token, const char *url, int healthy)
{
    worker_state w = {gport, token, url, healthy};
    return th_wait_until(30000, 20, worker_is, &w);
}

static long long load_of(json_t *x)
{
    return th_iget(x, "in_flight") + th_iget(x, "running") + th_iget(x, "queued");
}

static int workers_idle(void *arg)
{
    worker_state *w = arg;
    json_t *j = workers_list(w->gport, w->token), *x;
    size_t k;
    int seen = 0, busy = 0;
    json_array_foreach(json_object_get(j, "data"), k, x) if (worker_matches(x, w->url))
    {
        seen++;
        busy += load_of(x) > 0;
    }
    json_decref(j);
    return seen && !busy;
}

int th_wait_workers_idle(int gport, const char *token, const char *url)
{
    worker_state w = {gport, token, url, 1};
    return th_wait_until(30000, 20, workers_idle, &w);
}
