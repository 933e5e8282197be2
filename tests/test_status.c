/* Status page suite: the real chunkgate in front of one real chunkgate-worker (model from
 * `chunkgate-worker generate-model`) on loopback. Two RAG requests (the second reorders the
 * same documents, so they hit), then GET /v1/stats must show them (requests, hit rate, tokens
 * reused, chunks indexed, the healthy worker, the recent requests with their hits), and the
 * page GET / rendered by headless Chromium must show the same numbers. Without chromium the
 * JSON checks still run and the test exits 77 (ctest: skipped). */
#include <check.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"

#define ADMIN "tok-status"
#define MODEL "chunkgate-tiny"
#define SKIP_CODE 77

static char tmp_root[256], model_dir[300], worker_url[64];
static pid_t gw_pid, wk_pid;
static int gw_port;
static const char *chromium; /* path, or NULL when not installed */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cg_buf b;
    cg_buf_init(&b, 0);
    if (f) {
        char tmp[4096];
        size_t n;
        while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
            if (cg_buf_append(&b, tmp, n) != CG_OK) break;
        fclose(f);
    }
    char *s = cg_malloc(b.len + 1);
    if (b.len) memcpy(s, b.data, b.len);
    s[b.len] = '\0';
    cg_buf_free(&b);
    return s;
}

/* Starts bin with args, output to log; with marker, waits for it and returns the port that
 * follows it (0 on failure). */
static int spawn(pid_t *pid, const char *bin, const char *const *args, const char *log,
                 const char *marker)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)bin;
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    fflush(NULL);
    *pid = fork();
    if (*pid < 0) return 0;
    if (*pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execv(bin, argv);
        _exit(127);
    }
    if (!marker) return 0;
    for (int i = 0; i < 3000; i++) {
        char *text = slurp(log);
        const char *m = strstr(text, marker);
        int port = m ? atoi(m + strlen(marker)) : 0;
        free(text);
        if (port > 0) return port;
        if (waitpid(*pid, NULL, WNOHANG) == *pid) break;
        sleep_ms(20);
    }
    fprintf(stderr, "%s did not start; see %s\n", bin, log);
    return 0;
}

static void stop(pid_t *pid)
{
    if (*pid <= 0) return;
    kill(*pid, SIGTERM);
    waitpid(*pid, NULL, 0);
    *pid = 0;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(0x7f000001);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) abort();
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

/* ------------------------------------------------------------ HTTP client */

typedef struct resp {
    long status;
    char ctype[128];
    cg_buf body;
} resp;

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    return cg_buf_append(&r->body, d, sz * n) == CG_OK ? sz * n : 0;
}

static void http(resp *r, const char *method, const char *path, const char *body,
                 const char *token)
{
    memset(r, 0, sizeof *r);
    cg_buf_init(&r->body, 0);
    CURL *e = curl_easy_init();
    char url[512], auth[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", gw_port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    char *ct = NULL;
    curl_easy_getinfo(e, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(r->ctype, sizeof r->ctype, "%s", ct ? ct : "");
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

/* GET /v1/stats with the admin token; asserts 200. Caller decrefs. */
static json_t *stats(void)
{
    resp r;
    http(&r, "GET", "/v1/stats", NULL, ADMIN);
    ck_assert_msg(r.status == 200, "GET /v1/stats: HTTP %ld", r.status);
    json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
    ck_assert_msg(j != NULL, "/v1/stats is not JSON");
    cg_buf_free(&r.body);
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
    resp r;
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt,
                          "max_tokens", 4, "temperature", 0.0);
    char *text = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    http(&r, "POST", "/v1/completions", text, NULL);
    free(text);
    ck_assert_msg(r.status == 200, "completion: HTTP %ld: %.*s", r.status, (int)r.body.len,
                  r.body.data ? r.body.data : "");
    json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
    cg_buf_free(&r.body);
    ck_assert(j != NULL);
    return j;
}

/* ------------------------------------------------------------ setup */

static void suite_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/cg_status_XXXXXX");
    if (!mkdtemp(tmp_root)) abort();
    snprintf(model_dir, sizeof model_dir, "%s/model", tmp_root);
    char log[400], data[400], listen[64];
    snprintf(log, sizeof log, "%s/gen.log", tmp_root);
    pid_t gen;
    const char *ga[] = {"generate-model", "--out", model_dir, NULL};
    spawn(&gen, WORKER_BIN, ga, log, NULL);
    int st = 0;
    waitpid(gen, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "generate-model failed; see %s\n", log);
        abort();
    }
    int wp = free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", wp);
    snprintf(data, sizeof data, "%s/w-data", tmp_root);
    snprintf(log, sizeof log, "%s/worker.log", tmp_root);
    const char *wa[] = {"serve", "--model", model_dir, "--listen", listen, "--data-dir", data,
                        "--pool-mb", "64", NULL};
    if (!spawn(&wk_pid, WORKER_BIN, wa, log, "\"msg\":\"listening on 127.0.0.1:")) abort();
    snprintf(worker_url, sizeof worker_url, "http://127.0.0.1:%d", wp);
    snprintf(data, sizeof data, "%s/gw-data", tmp_root);
    snprintf(log, sizeof log, "%s/gw.log", tmp_root);
    const char *gwa[] = {"--listen", "127.0.0.1:0", "--data-dir", data, "--admin-token", ADMIN,
                         "--worker", worker_url, "--health-interval-ms", "100", NULL};
    gw_port = spawn(&gw_pid, CHUNKGATE_BIN, gwa, log, "listening on 127.0.0.1:");
    if (!gw_port) abort();
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void suite_teardown(void)
{
    stop(&gw_pid);
    stop(&wk_pid);
    if (!getenv("CG_KEEP_TMP")) nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------ tests */

START_TEST(stats_need_the_admin_token_page_does_not)
{
    resp r;
    http(&r, "GET", "/v1/stats", NULL, NULL);
    ck_assert_int_eq(r.status, 401);
    cg_buf_free(&r.body);
    http(&r, "GET", "/v1/stats", NULL, "wrong");
    ck_assert_int_eq(r.status, 401);
    cg_buf_free(&r.body);
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
    cg_buf_free(&r.body);
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
        if (!healthy) sleep_ms(20);
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

    /* Index writes are asynchronous: wait until the three chunks (system + 2 documents) are
     * committed. */
    json_t *s = NULL;
    for (int i = 0; i < 500; i++) {
        json_decref(s);
        s = stats();
        if (num(s, "index", "chunks") >= 3) break;
        sleep_ms(20);
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
    snprintf(dom_path, sizeof dom_path, "%s/dom.html", tmp_root);
    snprintf(err_path, sizeof err_path, "%s/chromium.log", tmp_root);
    snprintf(cmd, sizeof cmd,
             "HOME='%s' timeout 120 '%s' --headless --no-sandbox --disable-gpu "
             "--no-first-run --user-data-dir='%s/chrome' --virtual-time-budget=10000 "
             "--dump-dom 'http://127.0.0.1:%d/#token=%s' >'%s' 2>'%s'",
             tmp_root, chromium, tmp_root, gw_port, ADMIN, dom_path, err_path);
    int rc = system(cmd);
    char *dom = slurp(dom_path);
    if (rc != 0 || !strstr(dom, "</html>")) {
        char *e = slurp(err_path);
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
        ck_assert_msg(strstr(dom, want) != NULL, "the rendered page lacks %s; DOM:\n%s", want,
                      dom);
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
    const char *names[] = {"chromium", "chromium-browser"};
    const char *p = getenv("PATH");
    for (size_t k = 0; k < 2; k++) {
        const char *s = p ? p : "/usr/bin";
        while (*s) {
            const char *e = strchr(s, ':');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            snprintf(path, sizeof path, "%.*s/%s", (int)len, s, names[k]);
            if (access(path, X_OK) == 0) return path;
            s += len + (e != NULL);
        }
    }
    return NULL;
}

int main(void)
{
    chromium = find_chromium();
    Suite *su = suite_create("status");
    TCase *tc = tcase_create("stack");
    tcase_add_unchecked_fixture(tc, suite_setup, suite_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, stats_need_the_admin_token_page_does_not);
    tcase_add_test(tc, stats_and_page_show_the_hits);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed) return EXIT_FAILURE;
    if (!chromium) {
        printf("SKIP: chromium not found (apt-get install chromium, or set CHROMIUM): the "
               "/v1/stats checks passed, the page was not rendered\n");
        return SKIP_CODE;
    }
    return EXIT_SUCCESS;
}
