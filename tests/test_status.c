/* Status page suite: the real chunkgate in front of one real chunkgate-worker (model from
 * `chunkgate-worker generate-model`) on loopback. Two RAG requests (the second reorders the
 * same documents, so they hit), then GET /v1/stats must show them (requests, hit rate, tokens
 * reused, chunks indexed, the healthy worker, the recent requests with their hits), and the
 * page GET / rendered by headless Chromium must show the same numbers. Without chromium the
 * JSON checks still run and the test exits 77 (ctest: skipped). */
#include <check.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"

#define ADMIN "tok-status"
#define MODEL "chunkgate-tiny"
#define SKIP_CODE 77

static char model_dir[300];
static const char *worker_url;
static th_proc gw, wk;
static const char *chromium; /* path, or NULL when not installed */

static void http(th_resp *r, const char *method, const char *path, const char *body,
                 const char *token)
{
    th_http(r, gw.port, method, path, body, token, NULL);
}

/* GET /v1/stats with the admin token; asserts 200. Caller decrefs. */
static json_t *stats(void)
{
    th_resp r;
    http(&r, "GET", "/v1/stats", NULL, ADMIN);
    ck_assert_msg(r.status == 200, "GET /v1/stats: HTTP %ld", r.status);
    json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
    ck_assert_msg(j != NULL, "/v1/stats is not JSON");
    th_resp_free(&r);
    return j;
}

static long long num(json_t *j, const char *a, const char *b)
{
    json_t *v = json_object_get(json_object_get(j, a), b);
    ck_assert_msg(json_is_number(v), "stats.%s.%s missing", a, b);
    return (long long)json_number_value(v);
}

static json_t *rag(const char *first, const char *second, const char *q)
{
    char prompt[1024];
    snprintf(prompt, sizeof prompt, "You answer from the documents only. # # %s # # %s # # %s",
             first, second, q);
    th_resp r;
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens", 4,
                          "temperature", 0.0);
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    http(&r, "POST", "/v1/completions", text, NULL);
    free(text);
    ck_assert_msg(r.status == 200, "completion: HTTP %ld: %.*s", r.status, (int)r.body.len,
                  r.body.data ? r.body.data : "");
    json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
    th_resp_free(&r);
    ck_assert(j != NULL);
    return j;
}

/* ------------------------------------------------------------ setup */

static void suite_setup(void)
{
    th_init("status", NULL);
    th_path(model_dir, sizeof model_dir, "model");
    if (th_gen_model(WORKER_BIN, model_dir, NULL) != 0) {
        fprintf(stderr, "generate-model failed; see %s/gen.log\n", th_root());
        abort();
    }
    if (th_start_worker(&wk, WORKER_BIN, model_dir, 0, "w", NULL) != 0)
        th_die("chunkgate-worker", &wk);
    worker_url = wk.url;
    const char *gwa[] = {"--admin-token",        ADMIN, "--worker", worker_url,
                         "--health-interval-ms", "100", NULL};
    if (th_start_gateway(&gw, CHUNKGATE_BIN, "gw", gwa) != 0) th_die("chunkgate", &gw);
}

static void suite_teardown(void)
{
    th_stop(&gw, SIGTERM);
    th_stop(&wk, SIGTERM);
    th_cleanup(0);
}

/* ------------------------------------------------------------ tests */

START_TEST(stats_need_the_admin_token_page_does_not)
{
    th_resp r;
    http(&r, "GET", "/v1/stats", NULL, NULL);
    ck_assert_int_eq(r.status, 401);
    th_resp_free(&r);
    http(&r, "GET", "/v1/stats", NULL, "wrong");
    ck_assert_int_eq(r.status, 401);
    th_resp_free(&r);
    /* The page itself is static (no data): a browser cannot send a bearer on navigation. */
    http(&r, "GET", "/", NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(strstr(r.ctype, "text/html") != NULL, "content type %s", r.ctype);
    ck_assert(cg_buf_append(&r.body, "", 1) == CG_OK);
    ck_assert(strstr(r.body.data, "<title>chunkgate status</title>") != NULL);
    ck_assert(strstr(r.body.data, "fetch('/v1/stats'") != NULL);
    /* Self-contained: nothing is loaded from another origin. */
    ck_assert(strstr(r.body.data, "http://") == NULL && strstr(r.body.data, "https://") == NULL);
    ck_assert(strstr(r.body.data, " src=") == NULL && strstr(r.body.data, "<link") == NULL);
    th_resp_free(&r);
}
END_TEST

START_TEST(stats_and_page_show_the_hits)
{
    /* The worker must be healthy before the first request, or it falls back. */
    int healthy = 0;
    for (int i = 0; i < 1500 && !healthy; i++) {
        json_t *s = stats();
        healthy = num(s, "workers", "healthy") == 1;
        json_decref(s);
        if (!healthy) th_sleep_ms(20);
    }
    ck_assert_msg(healthy, "the worker never became healthy");
    json_t *s0 = stats();
    ck_assert_int_eq(num(s0, "requests", "total"), 0);
    ck_assert_int_eq(json_array_size(json_object_get(s0, "recent")), 0);
    json_decref(s0);

    const char *d1 = "Document one. The lighthouse was rebuilt in 1911 after the storm.";
    const char *d2 = "Document two. The harbour dues were halved for fishing boats in May.";
    json_t *r1 = rag(d1, d2, "When was the lighthouse rebuilt?");
    json_t *r2 = rag(d2, d1, "What happened to the harbour dues?");
    long long cached = (long long)json_integer_value(json_object_get(
        json_object_get(json_object_get(r2, "usage"), "prompt_tokens_details"), "cached_tokens"));
    ck_assert_msg(cached > 0, "the reordered documents did not hit");
    json_decref(r1);
    json_decref(r2);

    /* Index writes are asynchronous, and a request is recorded once its response has been
     * handed to the connection: wait until the three chunks (system + 2 documents) are
     * committed and both requests are counted. */
    json_t *s = NULL;
    for (int i = 0; i < 500; i++) {
        json_decref(s);
        s = stats();
        if (num(s, "index", "chunks") >= 3 && num(s, "requests", "total") >= 2) break;
        th_sleep_ms(20);
    }
    long long chunks = num(s, "index", "chunks");
    ck_assert_int_ge(chunks, 3);
    ck_assert_int_eq(num(s, "requests", "total"), 2);
    ck_assert_int_eq(num(s, "requests", "errors"), 0);
    long long hits = num(s, "segments", "hits"), misses = num(s, "segments", "misses");
    /* Request 1: system and both documents miss; request 2: the same three hit. */
    ck_assert_int_eq(hits, 3);
    ck_assert_int_eq(misses, 3);
    double rate = json_real_value(json_object_get(json_object_get(s, "segments"), "hit_rate_pct"));
    ck_assert(rate > 49.9 && rate < 50.1);
    long long reused = num(s, "tokens", "reused");
    ck_assert_int_eq(reused, cached);
    ck_assert_int_eq(num(s, "workers", "registered"), 1);
    json_t *w = json_array_get(json_object_get(json_object_get(s, "workers"), "data"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(w, "url")), worker_url);
    ck_assert(json_is_true(json_object_get(w, "healthy")));
    json_t *recent = json_object_get(s, "recent");
    ck_assert_int_eq(json_array_size(recent), 2);
    json_t *newest = json_array_get(recent, 0), *oldest = json_array_get(recent, 1);
    ck_assert_int_eq(json_integer_value(json_object_get(newest, "status")), 200);
    ck_assert_str_eq(json_string_value(json_object_get(newest, "route")), "completions");
    ck_assert_str_eq(json_string_value(json_object_get(newest, "model")), MODEL);
    ck_assert_str_eq(json_string_value(json_object_get(newest, "worker")), worker_url);
    ck_assert_str_eq(json_string_value(json_object_get(newest, "routing")), "hit");
    ck_assert_int_eq(json_integer_value(json_object_get(newest, "hits")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(newest, "cached_tokens")), cached);
    ck_assert(json_is_number(json_object_get(newest, "ttft_ms")));
    ck_assert_int_eq(json_integer_value(json_object_get(oldest, "hits")), 0);
    json_t *segs = json_object_get(newest, "segments");
    ck_assert_int_eq(json_array_size(segs), 3);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, 1), "role")), "chunk");
    ck_assert(json_is_true(json_object_get(json_array_get(segs, 1), "hit")));
    ck_assert_int_eq(strlen(json_string_value(json_object_get(json_array_get(segs, 1), "key"))),
                     32);
    /* No prompt text is kept. */
    char *dump = json_dumps(s, JSON_COMPACT);
    ck_assert(strstr(dump, "lighthouse") == NULL && strstr(dump, ADMIN) == NULL);
    free(dump);

    if (!chromium) {
        json_decref(s);
        return;
    }
    /* The page, rendered: --virtual-time-budget lets its fetch of /v1/stats finish before the
     * DOM is dumped; the token travels in the fragment. */
    char cmd[2048], dom_path[400], err_path[400];
    snprintf(dom_path, sizeof dom_path, "%s/dom.html", th_root());
    snprintf(err_path, sizeof err_path, "%s/chromium.log", th_root());
    snprintf(cmd, sizeof cmd,
             "HOME='%s' timeout 120 '%s' --headless --no-sandbox --disable-gpu "
             "--no-first-run --user-data-dir='%s/chrome' --virtual-time-budget=10000 "
             "--dump-dom 'http://127.0.0.1:%d/#token=%s' >'%s' 2>'%s'",
             th_root(), chromium, th_root(), gw.port, ADMIN, dom_path, err_path);
    int rc = system(cmd);
    char *dom = th_read_file(dom_path, NULL);
    if (rc != 0 || !strstr(dom, "</html>")) {
        char *e = th_read_file(err_path, NULL);
        ck_abort_msg("chromium failed (%d): %s", rc, e);
    }
    char want[256];
    const char *frags[8];
    char f[8][256];
    int n = 0;
    snprintf(f[n], sizeof f[n], "id=\"hit-rate\">%.1f%%<", rate);
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "id=\"tokens-reused\">%lld<", reused);
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "id=\"chunks\">%lld<", chunks);
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "id=\"requests\">2<");
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "id=\"workers-healthy\">1 / 1<");
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "<td>%s</td>", worker_url);
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "class=\"seg chunk hit\"");
    frags[n] = f[n], n++;
    snprintf(f[n], sizeof f[n], "<td>%s</td>", MODEL);
    frags[n] = f[n], n++;
    for (int i = 0; i < n; i++) {
        snprintf(want, sizeof want, "%s", frags[i]);
        ck_assert_msg(strstr(dom, want) != NULL, "the rendered page lacks %s; DOM:\n%s", want, dom);
    }
    printf("status page rendered by chromium: %s, %s, %s\n", f[0], f[1], f[2]);
    free(dom);
    json_decref(s);
}
END_TEST

/* The chromium binary: $CHROMIUM, else chromium or chromium-browser on PATH. */
static const char *find_chromium(void)
{
    const char *env = getenv("CHROMIUM");
    if (env && *env) return access(env, X_OK) == 0 ? env : NULL;
    static char path[1024];
    if (th_which("chromium", path, sizeof path) || th_which("chromium-browser", path, sizeof path))
        return path;
    return NULL;
}

int main(void)
{
    chromium = find_chromium();
    if (th_run_suite(
            "status", "stack", 300, (th_fixture){suite_setup, suite_teardown, 0}, CK_NOFORK,
            TH_TESTS(stats_need_the_admin_token_page_does_not, stats_and_page_show_the_hits)))
        return EXIT_FAILURE;
    if (!chromium) {
        printf("SKIP: chromium not found (apt-get install chromium, or set CHROMIUM): the "
               "/v1/stats checks passed, the page was not rendered\n");
        return SKIP_CODE;
    }
    return EXIT_SUCCESS;
}
