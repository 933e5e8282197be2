/* Integration tests: the real chunkgate binary on an ephemeral loopback port, in front of
 * tests/fake_backend (which stands in for the inference backend only), driven over HTTP with
 * libcurl. Covers completions and chat (streamed and not), bad input, admin auth, index
 * contents, restart with the same data dir, backend faults, client disconnects and metrics. */
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "base/base.h"
#include "cache/key.h"

#define ADMIN_TOKEN "tok-admin"
#define MODEL "m-test"

typedef struct proc {
    pid_t pid;
    int port;
    char log[512];
} proc;

/* Started once for the whole suite (unchecked fixture, in the runner process). */
static proc fake, gw;
static char tmp_root[256];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    return (double)cg_now_ns() / 1e9;
}

/* ------------------------------------------------------------ processes */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    cg_buf b;
    cg_buf_init(&b, 0);
    char tmp[4096];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        if (cg_buf_append(&b, tmp, n) != CG_OK) break;
    fclose(f);
    if (!b.data) return cg_strdup("");
    return b.data;
}

/* Starts bin with argv (NULL-terminated), stdout+stderr to log. When marker is non-NULL waits
 * for it in the log and reads the port number that follows it. Returns 0 or -1. */
static int spawn(proc *p, const char *bin, const char *const *args, const char *log,
                 const char *marker)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)bin;
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    snprintf(p->log, sizeof p->log, "%s", log);
    p->port = 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execv(bin, argv);
        _exit(127);
    }
    p->pid = pid;
    if (!marker) return 0;
    for (int i = 0; i < 1000; i++) { /* up to 20 s (sanitizer builds start slowly) */
        char *text = read_file(log);
        const char *m = text ? strstr(text, marker) : NULL;
        if (m) {
            p->port = atoi(m + strlen(marker));
            free(text);
            return p->port > 0 ? 0 : -1;
        }
        free(text);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            p->pid = 0;
            return -1;
        }
        sleep_ms(20);
    }
    return -1;
}

/* Sends sig and waits up to 20 s; returns the exit status, 128+signal, or -1 on timeout. */
static int stop_proc(proc *p, int sig)
{
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    for (int i = 0; i < 1000; i++) {
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        sleep_ms(20);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
    return -1;
}

static int start_gateway(proc *p, const char *data_dir, const char *backend,
                         const char *const *extra, const char *logname)
{
    const char *args[48];
    int n = 0;
    args[n++] = "--listen";
    args[n++] = "127.0.0.1:0";
    args[n++] = "--data-dir";
    args[n++] = data_dir;
    if (backend) {
        args[n++] = "--backend";
        args[n++] = backend;
    }
    for (; extra && *extra; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    char log[512];
    snprintf(log, sizeof log, "%s/%s", tmp_root, logname);
    return spawn(p, CHUNKGATE_BIN, args, log, "listening on 127.0.0.1:");
}

static void fake_url(char *out, size_t n)
{
    snprintf(out, n, "http://127.0.0.1:%d", fake.port);
}

static void suite_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/cg_gateway_test_XXXXXX");
    if (!mkdtemp(tmp_root)) abort();
    const char *fargs[] = {"--delay-ms", "100", "--events", "5", NULL};
    char log[512];
    snprintf(log, sizeof log, "%s/fake.log", tmp_root);
    if (spawn(&fake, FAKE_BACKEND_BIN, fargs, log, "PORT ") != 0) {
        fprintf(stderr, "cannot start %s\n", FAKE_BACKEND_BIN);
        abort();
    }
    char backend[64], dir[300];
    fake_url(backend, sizeof backend);
    snprintf(dir, sizeof dir, "%s/g1", tmp_root);
    const char *extra[] = {"--admin-token",
                           ADMIN_TOKEN,
                           "--max-segments",
                           "8",
                           "--max-body-bytes",
                           "64K",
                           "--backend-timeout-ms",
                           "1500",
                           "--max-upstream-bytes",
                           "64K",
                           "--heartbeat-ms",
                           "200",
                           "--model",
                           "gw-default",
                           NULL};
    if (start_gateway(&gw, dir, backend, extra, "g1.log") != 0) {
        char *text = read_file(gw.log);
        fprintf(stderr, "cannot start chunkgate: %s\n", text ? text : "");
        free(text);
        abort();
    }
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void suite_teardown(void)
{
    int rc = stop_proc(&gw, SIGTERM);
    if (rc != 0) fprintf(stderr, "chunkgate exited with %d; logs kept in %s\n", rc, tmp_root);
    stop_proc(&fake, SIGTERM);
    /* Logs and data dirs go away unless the gateway failed or CG_KEEP_TMP is set. */
    if (rc == 0 && !getenv("CG_KEEP_TMP")) nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------ HTTP client */

typedef struct resp {
    long status;
    cg_buf body;
    char rid[96];
    char ctype[96];
    CURLcode rc;
} resp;

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    if (cg_buf_append(&r->body, d, sz * n) != CG_OK) return 0;
    return sz * n;
}

static size_t on_header(char *d, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    size_t len = sz * n;
    if (len > 16 && !strncasecmp(d, "X-Request-Id: ", 14))
        snprintf(r->rid, sizeof r->rid, "%.*s", (int)(len - 16), d + 14);
    if (len > 16 && !strncasecmp(d, "Content-Type: ", 14))
        snprintf(r->ctype, sizeof r->ctype, "%.*s", (int)(len - 16), d + 14);
    return len;
}

/* One request to port. token: bearer token or NULL; hdr: one extra header or NULL. */
static void http_full(resp *r, int port, const char *method, const char *path, const char *body,
                      size_t len, const char *token, const char *hdr)
{
    memset(r, 0, sizeof *r);
    cg_buf_init(&r->body, 0);
    CURL *e = curl_easy_init();
    char url[512], auth[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    h = curl_slist_append(h, "Content-Type: application/json");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    if (hdr) h = curl_slist_append(h, hdr);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    r->rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

static void http(resp *r, const char *method, const char *path, const char *body)
{
    http_full(r, gw.port, method, path, body, body ? strlen(body) : 0, NULL, NULL);
}

static void admin(resp *r, const char *method, const char *path, const char *body)
{
    http_full(r, gw.port, method, path, body, body ? strlen(body) : 0, ADMIN_TOKEN, NULL);
}

static json_t *jbody(resp *r)
{
    json_t *j = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
    ck_assert_msg(j != NULL, "not JSON (HTTP %ld): %.*s", r->status, (int)r->body.len,
                  r->body.data ? r->body.data : "");
    return j;
}

/* Asserts the OpenAI error shape, the status, the code and (when given) the param. */
static void assert_error(resp *r, long status, const char *code, const char *param)
{
    ck_assert_msg(r->status == status, "want %ld got %ld: %.*s", status, r->status,
                  (int)r->body.len, r->body.data ? r->body.data : "");
    json_t *j = jbody(r);
    json_t *e = json_object_get(j, "error");
    ck_assert(json_is_object(e));
    ck_assert(json_is_string(json_object_get(e, "message")));
    ck_assert(json_string_length(json_object_get(e, "message")) > 0);
    ck_assert(json_is_string(json_object_get(e, "type")));
    ck_assert(json_object_get(e, "param") != NULL);
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
    if (param) ck_assert_str_eq(json_string_value(json_object_get(e, "param")), param);
    json_decref(j);
}

static void assert_healthy(void)
{
    resp r;
    http(&r, "GET", "/healthz", NULL);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    cg_buf_free(&r.body);
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void key_hex(const char *model, cg_mode mode, const char *salt, const cg_key *sys,
                    const char *text, char out[CG_KEY_HEX_LEN + 1])
{
    cg_key k = cg_key_compute(model, strlen(model), mode, salt, salt ? strlen(salt) : 0, sys, text,
                              strlen(text));
    cg_key_hex(&k, out);
}

/* A string unique to this test run, so index counts do not depend on other tests. */
static void nonce(char *out, size_t n)
{
    static int seq;
    snprintf(out, n, "n%d-%" PRIu64 "-%d", (int)getpid(), cg_wall_ms(), ++seq);
}

/* Builds a JSON request body with json_pack semantics; caller frees. */
static char *dumps(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* ------------------------------------------------------------ SSE client */

typedef struct sse {
    cg_buf raw; /* everything received, '\r' removed */
    size_t scanned;
    int n; /* blocks */
    char *block[512];
    double t[512]; /* arrival time of each block */
    long status;
    char ctype[96];
    int stop_after; /* abort after this many data blocks (0 = never) */
    int data_blocks;
} sse;

static size_t sse_write(char *d, size_t sz, size_t nm, void *ud)
{
    sse *s = ud;
    size_t n = sz * nm;
    for (size_t i = 0; i < n; i++)
        if (d[i] != '\r' && cg_buf_append(&s->raw, d + i, 1) != CG_OK) return 0;
    char *end;
    while (s->raw.data && (end = strstr(s->raw.data + s->scanned, "\n\n")) && s->n < 512) {
        size_t start = s->scanned;
        s->block[s->n] = cg_strndup(s->raw.data + start, (size_t)(end - s->raw.data) - start);
        s->t[s->n] = now_s();
        if (!strncmp(s->block[s->n], "data:", 5)) s->data_blocks++;
        s->n++;
        s->scanned = (size_t)(end - s->raw.data) + 2;
    }
    if (s->stop_after && s->data_blocks >= s->stop_after) return 0;
    return n;
}

static size_t sse_header(char *d, size_t sz, size_t n, void *ud)
{
    sse *s = ud;
    size_t len = sz * n;
    if (len > 16 && !strncasecmp(d, "Content-Type: ", 14))
        snprintf(s->ctype, sizeof s->ctype, "%.*s", (int)(len - 16), d + 14);
    return len;
}

static CURLcode sse_post(sse *s, int port, const char *path, const char *body)
{
    int stop = s->stop_after;
    memset(s, 0, sizeof *s);
    s->stop_after = stop;
    cg_buf_init(&s->raw, 0);
    CURL *e = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, sse_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &s->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return rc;
}

static void sse_free(sse *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->block[i]);
    cg_buf_free(&s->raw);
}

/* The JSON of data block i ("data: {...}"), or NULL. */
static json_t *sse_json(sse *s, int i)
{
    if (strncmp(s->block[i], "data: ", 6) != 0) return NULL;
    return json_loads(s->block[i] + 6, 0, NULL);
}

/* ------------------------------------------------------------ metrics */

static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return -1;
}

static char *scrape(void)
{
    resp r;
    http(&r, "GET", "/metrics", NULL);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.ctype, "text/plain"));
    return r.body.data;
}

/* ------------------------------------------------------------ tests: completions */

START_TEST(completion_forwarded_with_chunk_cache)
{
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt,
             "You are exact. %s # # Alpha doc é %s ##  # #   # # Beta doc %s # # Question?", n, n,
             n);
    /* "##" is not the separator; the blank segment between two separators is skipped */
    char *body =
        dumps(json_pack("{s:s, s:s, s:i, s:s, s:s}", "model", MODEL, "prompt", prompt, "max_tokens",
                        16, "chunk_separator", "# #", "cache_salt", "tenant-a"));
    resp r;
    http_full(&r, gw.port, "POST", "/v1/completions", body, strlen(body), NULL,
              "X-Request-Id: gw-test-1");
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.rid, "gw-test-1");
    json_t *j = jbody(&r);
    /* the backend's answer is relayed */
    char want[64];
    snprintf(want, sizeof want, "echo %zu", strlen(prompt));
    ck_assert_str_eq(json_string_value(
                         json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")),
                     want);
    /* the prompt reached the backend byte for byte, without the extension fields */
    json_t *fake_echo = json_object_get(j, "fake");
    ck_assert_int_eq(json_integer_value(json_object_get(fake_echo, "prompt_len")),
                     (json_int_t)strlen(prompt));
    char fnv[17];
    snprintf(fnv, sizeof fnv, "%016" PRIx64, fnv1a(prompt, strlen(prompt)));
    ck_assert_str_eq(json_string_value(json_object_get(fake_echo, "prompt_fnv")), fnv);
    json_t *fields = json_object_get(fake_echo, "fields");
    ck_assert_uint_eq(json_array_size(fields), 3);
    for (size_t i = 0; i < 3; i++) {
        const char *f = json_string_value(json_array_get(fields, i));
        ck_assert_msg(!strcmp(f, "model") || !strcmp(f, "prompt") || !strcmp(f, "max_tokens"),
                      "forwarded %s", f);
    }
    ck_assert_str_eq(json_string_value(json_object_get(fake_echo, "request_id")), "gw-test-1");
    /* cached tokens are reported in OpenAI's field */
    json_t *det = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    ck_assert(json_is_integer(json_object_get(det, "cached_tokens")));
    ck_assert_int_eq(json_integer_value(json_object_get(det, "cached_tokens")), 0);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")),
        (json_int_t)strlen(prompt));
    /* chunk_cache: one entry per cacheable segment, keyed as DESIGN §4 says */
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(json_is_object(cc));
    ck_assert(json_is_true(json_object_get(cc, "fallback")));
    ck_assert(json_is_false(json_object_get(cc, "passthrough")));
    ck_assert(json_is_null(json_object_get(cc, "worker")));
    ck_assert_str_eq(json_string_value(json_object_get(cc, "mode")), "strict");
    ck_assert_int_eq(json_integer_value(json_object_get(cc, "empty_segments")), 1);
    json_t *segs = json_object_get(cc, "segments");
    ck_assert_uint_eq(json_array_size(segs), 3);
    char texts[3][200];
    snprintf(texts[0], sizeof texts[0], "You are exact. %s", n);
    snprintf(texts[1], sizeof texts[1], "Alpha doc é %s ##", n);
    snprintf(texts[2], sizeof texts[2], "Beta doc %s", n);
    const char *roles[] = {"system", "chunk", "chunk"};
    for (size_t i = 0; i < 3; i++) {
        json_t *s = json_array_get(segs, i);
        char hex[CG_KEY_HEX_LEN + 1];
        key_hex(MODEL, CG_MODE_STRICT, "tenant-a", NULL, texts[i], hex);
        ck_assert_str_eq(json_string_value(json_object_get(s, "key")), hex);
        ck_assert_str_eq(json_string_value(json_object_get(s, "role")), roles[i]);
        ck_assert_int_eq(json_integer_value(json_object_get(s, "bytes")),
                         (json_int_t)strlen(texts[i]));
        ck_assert(json_is_false(json_object_get(s, "hit")));
        ck_assert(json_is_null(json_object_get(s, "tokens")));
    }
    json_decref(j);
    cg_buf_free(&r.body);
}
END_TEST

START_TEST(completion_passthrough_and_modes)
{
    /* no separator: forwarded as is, nothing keyed */
    resp r;
    const char *body =
        "{\"model\":\"" MODEL "\", \"prompt\": [\"just a question\"], \"max_tokens\": 3}";
    http(&r, "POST", "/v1/completions", body);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(json_is_true(json_object_get(cc, "passthrough")));
    ck_assert(json_is_false(json_object_get(cc, "fallback")));
    ck_assert_uint_eq(json_array_size(json_object_get(cc, "segments")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "fake"), "prompt_len")),
                     15);
    json_decref(j);
    cg_buf_free(&r.body);

    /* mode sys: chunk keys include the system segment's key; a custom separator */
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "Sys %s ||| Doc %s ||| Q?", n, n);
    char *b = dumps(json_pack("{s:s, s:s, s:s, s:s}", "model", MODEL, "prompt", prompt,
                              "chunk_separator", "|||", "chunk_mode", "sys"));
    http(&r, "POST", "/v1/completions", b);
    free(b);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    json_t *segs = json_object_get(json_object_get(j, "chunk_cache"), "segments");
    ck_assert_uint_eq(json_array_size(segs), 2);
    char sys_text[96], doc_text[96], hex[CG_KEY_HEX_LEN + 1];
    snprintf(sys_text, sizeof sys_text, "Sys %s", n);
    snprintf(doc_text, sizeof doc_text, "Doc %s", n);
    cg_key sk = cg_key_compute(MODEL, strlen(MODEL), CG_MODE_SYS, NULL, 0, NULL, sys_text,
                               strlen(sys_text));
    key_hex(MODEL, CG_MODE_SYS, NULL, NULL, sys_text, hex);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, 0), "key")), hex);
    key_hex(MODEL, CG_MODE_SYS, NULL, &sk, doc_text, hex);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, 1), "key")), hex);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "chunk_cache"), "mode")),
                     "sys");
    json_decref(j);
    cg_buf_free(&r.body);
}
END_TEST

/* Events reach the client as the backend sends them, and the stream ends with one [DONE]. */
START_TEST(completion_stream_incremental)
{
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "S %s # # D %s # # Q", n, n);
    char *b = dumps(json_pack("{s:s, s:s, s:b}", "model", MODEL, "prompt", prompt, "stream", 1));
    sse s = {0};
    double t0 = now_s();
    ck_assert_int_eq(sse_post(&s, gw.port, "/v1/completions", b), CURLE_OK);
    free(b);
    ck_assert_int_eq(s.status, 200);
    ck_assert_str_eq(s.ctype, "text/event-stream");
    /* tok0..tok4, a comment passed through, [DONE] last and once */
    int toks = 0, done = 0, comments = 0, first = -1, last_tok = -1;
    for (int i = 0; i < s.n; i++) {
        if (!strcmp(s.block[i], "data: [DONE]")) {
            done++;
            ck_assert_int_eq(i, s.n - 1);
            continue;
        }
        if (s.block[i][0] == ':') {
            comments += strstr(s.block[i], "fake comment") != NULL;
            continue;
        }
        json_t *j = sse_json(&s, i);
        ck_assert_msg(j != NULL, "block %d is not a JSON data event: %s", i, s.block[i]);
        char want[16];
        snprintf(want, sizeof want, "tok%d ", toks);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(json_object_get(j, "choices"), 0), "text")),
                         want);
        if (toks == 0) {
            first = i;
            json_t *cc = json_object_get(j, "chunk_cache");
            ck_assert(json_is_object(cc));
            ck_assert_uint_eq(json_array_size(json_object_get(cc, "segments")), 2);
            ck_assert(json_is_true(json_object_get(cc, "fallback")));
            ck_assert_int_eq(
                json_integer_value(json_object_get(json_object_get(j, "fake"), "prompt_len")),
                (json_int_t)strlen(prompt));
        } else {
            ck_assert_ptr_null(json_object_get(j, "chunk_cache")); /* only the first event */
        }
        last_tok = i;
        toks++;
        json_decref(j);
    }
    ck_assert_int_eq(toks, 5);
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(comments, 1);
    /* The backend waits 100 ms between events: a relay that buffered the answer would deliver
     * the first event with the last one. */
    ck_assert_msg(s.t[last_tok] - s.t[first] >= 0.3,
                  "events arrived together: first %.3f last %.3f", s.t[first] - t0,
                  s.t[last_tok] - t0);
    sse_free(&s);
}
END_TEST

START_TEST(stream_usage_and_crlf)
{
    /* a usage chunk gets cached_tokens; CRLF line ends from the backend are handled */
    const char *b =
        "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:CRLF # # d # # q\",\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}";
    sse s = {0};
    ck_assert_int_eq(sse_post(&s, gw.port, "/v1/completions", b), CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    int usage_seen = 0, toks = 0;
    for (int i = 0; i < s.n; i++) {
        json_t *j = sse_json(&s, i);
        if (!j) continue;
        if (json_array_size(json_object_get(j, "choices"))) toks++;
        json_t *u = json_object_get(j, "usage");
        if (json_is_object(u)) {
            usage_seen++;
            json_t *c =
                json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
            ck_assert(json_is_integer(c));
            ck_assert_int_eq(json_integer_value(c), 0);
        }
        json_decref(j);
    }
    ck_assert_int_eq(toks, 5);
    ck_assert_int_eq(usage_seen, 1);
    ck_assert_str_eq(s.block[s.n - 1], "data: [DONE]");
    sse_free(&s);
}
END_TEST

/* ------------------------------------------------------------ tests: chat */

START_TEST(chat_with_documents)
{
    char n[64], d1[96], d2[96], sys[96];
    nonce(n, sizeof n);
    snprintf(sys, sizeof sys, "Be brief %s.", n);
    snprintf(d1, sizeof d1, "Doc one %s", n);
    snprintf(d2, sizeof d2, "Doc two %s", n);
    char *b = dumps(json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}], s:[s, s], s:s}", "model", MODEL,
                              "messages", "role", "system", "content", sys, "role", "user",
                              "content", "What now?", "documents", d1, d2, "cache_salt", "t1"));
    resp r;
    http(&r, "POST", "/v1/chat/completions", b);
    free(b);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    ck_assert(json_is_string(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content")));
    json_t *segs = json_object_get(json_object_get(j, "chunk_cache"), "segments");
    ck_assert_uint_eq(json_array_size(segs), 3);
    const char *texts[] = {sys, d1, d2}, *roles[] = {"system", "chunk", "chunk"};
    for (size_t i = 0; i < 3; i++) {
        char hex[CG_KEY_HEX_LEN + 1];
        key_hex(MODEL, CG_MODE_STRICT, "t1", NULL, texts[i], hex);
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, i), "key")), hex);
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, i), "role")),
                         roles[i]);
    }
    /* the backend got no extension field, and the documents as a system message after the
     * system prompt */
    json_t *fake_echo = json_object_get(j, "fake");
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(fake_echo, "fields"), i, f)
    {
        ck_assert_str_ne(json_string_value(f), "documents");
        ck_assert_str_ne(json_string_value(f), "cache_salt");
    }
    json_t *msgs = json_object_get(fake_echo, "messages");
    ck_assert_uint_eq(json_array_size(msgs), 3);
    char joined[256];
    snprintf(joined, sizeof joined, "%s\n\n%s", d1, d2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), sys);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 1), "role")), "system");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                     joined);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 2), "content")),
                     "What now?");
    json_decref(j);
    cg_buf_free(&r.body);
}
END_TEST

START_TEST(chat_separators_in_messages)
{
    char n[64], content[256], sys[96], chunk[96];
    nonce(n, sizeof n);
    snprintf(sys, sizeof sys, "Sys %s", n);
    snprintf(chunk, sizeof chunk, "Chunk %s", n);
    snprintf(content, sizeof content, "%s # # %s # # the question", sys, chunk);
    /* content as text parts; no extension field, so the body is forwarded unchanged */
    char *b = dumps(json_pack("{s:s, s:[{s:s, s:[{s:s, s:s}]}]}", "model", MODEL, "messages",
                              "role", "user", "content", "type", "text", "text", content));
    resp r;
    http(&r, "POST", "/v1/chat/completions", b);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    json_t *segs = json_object_get(json_object_get(j, "chunk_cache"), "segments");
    ck_assert_uint_eq(json_array_size(segs), 2);
    char hex[CG_KEY_HEX_LEN + 1];
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, sys, hex);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, 0), "key")), hex);
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, chunk, hex);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, 1), "key")), hex);
    json_t *sent = json_loads(b, 0, NULL);
    ck_assert(json_equal(json_object_get(json_object_get(j, "fake"), "messages"),
                         json_object_get(sent, "messages")));
    json_decref(sent);
    json_decref(j);
    cg_buf_free(&r.body);
    free(b);

    /* a non-text part makes the request pass-through */
    b = dumps(json_pack("{s:s, s:[{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}}]}]}", "model", MODEL,
                        "messages", "role", "user", "content", "type", "text", "text", content,
                        "type", "image_url", "image_url", "url", "http://x/y.png"));
    http(&r, "POST", "/v1/chat/completions", b);
    free(b);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    ck_assert(json_is_true(json_object_get(json_object_get(j, "chunk_cache"), "passthrough")));
    json_decref(j);
    cg_buf_free(&r.body);
}
END_TEST

START_TEST(chat_stream)
{
    const char *b =
        "{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":[{\"role\":\"system\","
        "\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q\"}],\"documents\":[\"D\"]}";
    sse s = {0};
    ck_assert_int_eq(sse_post(&s, gw.port, "/v1/chat/completions", b), CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    int deltas = 0;
    for (int i = 0; i < s.n; i++) {
        json_t *j = sse_json(&s, i);
        if (!j) continue;
        ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
        if (deltas == 0)
            ck_assert_uint_eq(
                json_array_size(json_object_get(json_object_get(j, "chunk_cache"), "segments")), 2);
        deltas++;
        json_decref(j);
    }
    ck_assert_int_eq(deltas, 5);
    ck_assert_str_eq(s.block[s.n - 1], "data: [DONE]");
    sse_free(&s);
}
END_TEST

/* ------------------------------------------------------------ tests: bad input */

START_TEST(bad_inputs)
{
    struct {
        const char *method, *path, *body;
        long status;
        const char *code, *param;
    } cases[] = {
        {"POST", "/v1/completions", "{not json", 400, "invalid_json", NULL},
        {"POST", "/v1/completions", "", 400, "invalid_json", NULL},
        {"POST", "/v1/completions", "[1,2]", 400, "invalid_type", NULL},
        {"POST", "/v1/completions", "{\"prompt\":\"x\"}", 400, "missing_field", "model"},
        {"POST", "/v1/completions", "{\"model\":5,\"prompt\":\"x\"}", 400, "invalid_type", "model"},
        {"POST", "/v1/completions", "{\"model\":\"\",\"prompt\":\"x\"}", 400, "invalid_value",
         "model"},
        {"POST", "/v1/completions", "{\"model\":\"m\"}", 400, "missing_field", "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":5}", 400, "invalid_type",
         "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 400,
         "invalid_value", "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":[7]}", 400, "invalid_type",
         "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"yes\"}", 400,
         "invalid_type", "stream"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":\"ten\"}",
         400, "invalid_type", "max_tokens"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":-1}", 400,
         "invalid_value", "max_tokens"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"chunk_separator\":\"\"}",
         400, "invalid_value", "chunk_separator"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"chunk_separator\":3}", 400,
         "invalid_type", "chunk_separator"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"chunk_mode\":\"loose\"}",
         400, "invalid_value", "chunk_mode"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"cache_salt\":1}", 400,
         "invalid_type", "cache_salt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"documents\":[\"d\"]}", 400,
         "invalid_value", "documents"},
        /* only the gateway names an assembly or a KV source to a worker (SSRF otherwise) */
        {"POST", "/v1/completions",
         "{\"model\":\"m\",\"prompt\":\"x\",\"kv_transfer_params\":{\"assembly_id\":\"a\","
         "\"worker\":\"http://127.0.0.1:1\"}}",
         400, "invalid_value", "kv_transfer_params"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"kv_transfer_params\":null}",
         400, "invalid_value", "kv_transfer_params"},
        /* 9 segments; the gateway runs with --max-segments 8 */
        {"POST", "/v1/completions",
         "{\"model\":\"m\",\"prompt\":\"a # # b # # c # # d # # e # # f # # g # # h # # q\"}", 400,
         "too_many_segments", "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a # # \xff\xfe # # q\"}", 400,
         "invalid_utf8", NULL},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\"}", 400, "missing_field", "messages"},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":\"hi\"}", 400,
         "invalid_type", "messages"},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[]}", 400, "invalid_value",
         "messages"},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}",
         400, "missing_field", "messages"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "invalid_type",
         "messages"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"documents\":"
         "\"d\"}",
         400, "invalid_type", "documents"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"documents\":[1]}",
         400, "invalid_type", "documents"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_"
         "tokens\":1.5}",
         400, "invalid_type", "max_completion_tokens"},
        {"GET", "/v1/nope", NULL, 404, "not_found", NULL},
        {"POST", "/nope", "{}", 404, "not_found", NULL},
        {"GET", "/v1/completions", NULL, 405, "method_not_allowed", NULL},
        {"PUT", "/v1/chat/completions", "{}", 405, "method_not_allowed", NULL},
        {"DELETE", "/healthz", NULL, 405, "method_not_allowed", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        resp r;
        http(&r, cases[i].method, cases[i].path, cases[i].body);
        ck_assert_msg(r.status == cases[i].status, "case %zu (%s): HTTP %ld %.*s", i,
                      cases[i].body ? cases[i].body : cases[i].path, r.status, (int)r.body.len,
                      r.body.data ? r.body.data : "");
        assert_error(&r, cases[i].status, cases[i].code, cases[i].param);
        cg_buf_free(&r.body);
        assert_healthy();
    }
    /* too large: the gateway runs with --max-body-bytes 64K */
    size_t big = 70 * 1024;
    char *b = malloc(big + 64);
    int k = snprintf(b, 64, "{\"model\":\"m\",\"prompt\":\"");
    memset(b + k, 'a', big);
    strcpy(b + k + big, "\"}");
    resp r;
    http_full(&r, gw.port, "POST", "/v1/completions", b, strlen(b), NULL, NULL);
    assert_error(&r, 413, "request_too_large", NULL);
    cg_buf_free(&r.body);
    free(b);
    assert_healthy();
}
END_TEST

/* ------------------------------------------------------------ tests: admin and index */

START_TEST(admin_auth)
{
    const char *paths[][3] = {{"GET", "/v1/chunks", NULL},
                              {"GET", "/v1/chunks/00000000000000000000000000000000", NULL},
                              {"DELETE", "/v1/chunks/00000000000000000000000000000000", NULL},
                              {"POST", "/v1/chunks/lookup", "{\"keys\":[]}"}};
    for (size_t i = 0; i < 4; i++) {
        resp r;
        http_full(&r, gw.port, paths[i][0], paths[i][1], paths[i][2],
                  paths[i][2] ? strlen(paths[i][2]) : 0, NULL, NULL);
        assert_error(&r, 401, "invalid_api_key", NULL);
        cg_buf_free(&r.body);
        http_full(&r, gw.port, paths[i][0], paths[i][1], paths[i][2],
                  paths[i][2] ? strlen(paths[i][2]) : 0, "tok-admi", NULL);
        assert_error(&r, 401, "invalid_api_key", NULL);
        cg_buf_free(&r.body);
        http_full(&r, gw.port, paths[i][0], paths[i][1], paths[i][2],
                  paths[i][2] ? strlen(paths[i][2]) : 0, ADMIN_TOKEN, NULL);
        ck_assert_msg(r.status == 200 || r.status == 404, "%s %s: %ld", paths[i][0], paths[i][1],
                      r.status);
        cg_buf_free(&r.body);
    }
    /* inference routes do not need the admin token */
    resp r;
    http(&r, "GET", "/v1/models", NULL);
    ck_assert_int_eq(r.status, 200);
    cg_buf_free(&r.body);
}
END_TEST

START_TEST(index_contents_and_admin)
{
    char n[64], prompt[256], sys[96], doc[96];
    nonce(n, sizeof n);
    snprintf(sys, sizeof sys, "Index sys %s", n);
    snprintf(doc, sizeof doc, "Index doc %s", n);
    snprintf(prompt, sizeof prompt, "%s # # %s # # q1", sys, doc);
    char *b = dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    resp r;
    for (int i = 0; i < 2; i++) { /* the same documents twice, once streamed */
        if (i == 0) {
            http(&r, "POST", "/v1/completions", b);
            ck_assert_int_eq(r.status, 200);
            cg_buf_free(&r.body);
        } else {
            char *sb =
                dumps(json_pack("{s:s, s:s, s:b}", "model", MODEL, "prompt", prompt, "stream", 1));
            sse s = {0};
            ck_assert_int_eq(sse_post(&s, gw.port, "/v1/completions", sb), CURLE_OK);
            sse_free(&s);
            free(sb);
        }
    }
    char ks[CG_KEY_HEX_LEN + 1], kd[CG_KEY_HEX_LEN + 1], path[128];
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, sys, ks);
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, doc, kd);

    snprintf(path, sizeof path, "/v1/chunks/%s", kd);
    admin(&r, "GET", path, NULL);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")), kd);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chunk");
    ck_assert_str_eq(json_string_value(json_object_get(j, "model")), MODEL);
    ck_assert_str_eq(json_string_value(json_object_get(j, "mode")), "strict");
    ck_assert_int_eq(json_integer_value(json_object_get(j, "seen_count")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "bytes")), (json_int_t)strlen(doc));
    ck_assert_int_eq(json_integer_value(json_object_get(j, "hit_count")), 0);
    ck_assert(json_is_array(json_object_get(j, "placements")));
    json_decref(j);
    cg_buf_free(&r.body);

    /* lookup by keys, one unknown */
    char lk[256];
    snprintf(lk, sizeof lk, "{\"keys\":[\"%s\",\"%s\",\"ffffffffffffffffffffffffffffffff\"]}", ks,
             kd);
    admin(&r, "POST", "/v1/chunks/lookup", lk);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    json_t *d = json_object_get(j, "data");
    ck_assert_uint_eq(json_array_size(d), 3);
    ck_assert(json_is_true(json_object_get(json_array_get(d, 0), "found")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(d, 1), "seen_count")), 2);
    ck_assert(json_is_false(json_object_get(json_array_get(d, 2), "found")));
    ck_assert(json_is_null(json_object_get(json_array_get(d, 0), "role")));
    json_decref(j);
    cg_buf_free(&r.body);

    /* lookup by prompt: the same keys, with roles */
    admin(&r, "POST", "/v1/chunks/lookup", b);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    d = json_object_get(j, "data");
    ck_assert_uint_eq(json_array_size(d), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "key")), ks);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "role")), "system");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 1), "role")), "chunk");
    ck_assert(json_is_true(json_object_get(json_array_get(d, 1), "found")));
    json_decref(j);
    cg_buf_free(&r.body);
    free(b);

    /* delete, then it is gone */
    admin(&r, "DELETE", path, NULL);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")), kd);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chunk.deleted");
    ck_assert(json_is_true(json_object_get(j, "deleted")));
    json_decref(j);
    cg_buf_free(&r.body);
    admin(&r, "GET", path, NULL);
    assert_error(&r, 404, "not_found", NULL);
    cg_buf_free(&r.body);
    admin(&r, "DELETE", path, NULL);
    assert_error(&r, 404, "not_found", NULL);
    cg_buf_free(&r.body);
    /* malformed keys and lookups */
    admin(&r, "GET", "/v1/chunks/xyz", NULL);
    assert_error(&r, 400, "invalid_value", "key");
    cg_buf_free(&r.body);
    admin(&r, "POST", "/v1/chunks/lookup", "{\"keys\":[\"zz\"]}");
    assert_error(&r, 400, "invalid_value", "keys");
    cg_buf_free(&r.body);
    admin(&r, "POST", "/v1/chunks/lookup", "{\"model\":\"m\"}");
    assert_error(&r, 400, "missing_field", NULL);
    cg_buf_free(&r.body);
}
END_TEST

START_TEST(chunks_paging)
{
    /* make sure there are at least 5 chunks */
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "p1 %s # # p2 %s # # p3 %s # # p4 %s # # p5 %s # # q", n, n, n,
             n, n);
    char *b = dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    resp r;
    http(&r, "POST", "/v1/completions", b);
    ck_assert_int_eq(r.status, 200);
    cg_buf_free(&r.body);
    free(b);

    admin(&r, "GET", "/v1/chunks?limit=1000", NULL);
    ck_assert_int_eq(r.status, 200);
    json_t *all = jbody(&r);
    cg_buf_free(&r.body);
    size_t total = json_array_size(json_object_get(all, "data"));
    ck_assert_uint_ge(total, 5);
    ck_assert(json_is_false(json_object_get(all, "has_more")));

    /* page by 2 and compare */
    char after[64] = "", path[128];
    size_t seen = 0;
    for (int page = 0; page < 10000; page++) {
        snprintf(path, sizeof path, "/v1/chunks?limit=2%s%s", after[0] ? "&after=" : "", after);
        admin(&r, "GET", path, NULL);
        ck_assert_int_eq(r.status, 200);
        json_t *j = jbody(&r);
        cg_buf_free(&r.body);
        ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
        json_t *d = json_object_get(j, "data");
        ck_assert_uint_le(json_array_size(d), 2);
        for (size_t i = 0; i < json_array_size(d); i++, seen++)
            ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, i), "id")),
                             json_string_value(json_object_get(
                                 json_array_get(json_object_get(all, "data"), seen), "id")));
        if (json_array_size(d)) {
            ck_assert_str_eq(json_string_value(json_object_get(j, "first_id")),
                             json_string_value(json_object_get(json_array_get(d, 0), "id")));
            ck_assert_str_eq(json_string_value(json_object_get(j, "last_id")),
                             json_string_value(
                                 json_object_get(json_array_get(d, json_array_size(d) - 1), "id")));
        }
        int more = json_is_true(json_object_get(j, "has_more"));
        if (more)
            snprintf(after, sizeof after, "%s", json_string_value(json_object_get(j, "last_id")));
        json_decref(j);
        if (!more) break;
    }
    ck_assert_uint_eq(seen, total);
    json_decref(all);

    const char *bad[] = {"/v1/chunks?limit=0", "/v1/chunks?limit=1001", "/v1/chunks?limit=x",
                         "/v1/chunks?after=nothex"};
    for (size_t i = 0; i < 4; i++) {
        admin(&r, "GET", bad[i], NULL);
        assert_error(&r, 400, "invalid_value", NULL);
        cg_buf_free(&r.body);
    }
}
END_TEST

START_TEST(models_and_readyz)
{
    resp r;
    http(&r, "GET", "/v1/models", NULL);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "fake-model");
    json_decref(j);
    cg_buf_free(&r.body);
    http(&r, "GET", "/readyz", NULL);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "ready");
    json_decref(j);
    cg_buf_free(&r.body);
}
END_TEST

/* ------------------------------------------------------------ tests: failures */

START_TEST(backend_faults)
{
    struct {
        const char *prompt;
        long status;
        const char *code;
    } cases[] = {
        {"FAULT:500 # # d # # q", 500, "fake_500"}, /* the backend's own error, relayed */
        {"FAULT:TEXT500", 502, "bad_gateway"},      /* not an OpenAI error */
        {"FAULT:BADJSON # # d # # q", 502, "bad_gateway"},
        {"FAULT:STALL:4000", 504, "upstream_timeout"}, /* --backend-timeout-ms 1500 */
        {"FAULT:BIG:100000", 502, "bad_gateway"},      /* --max-upstream-bytes 64K */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *b = dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", cases[i].prompt));
        resp r;
        http(&r, "POST", "/v1/completions", b);
        free(b);
        assert_error(&r, cases[i].status, cases[i].code, NULL);
        cg_buf_free(&r.body);
        assert_healthy();
    }
    /* a stream cut by the backend ends with an error event and no [DONE] */
    sse s = {0};
    const char *sb = "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:CLOSE\",\"stream\":true}";
    ck_assert_int_eq(sse_post(&s, gw.port, "/v1/completions", sb), CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    ck_assert_int_ge(s.n, 2);
    json_t *j = sse_json(&s, s.n - 1);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "bad_gateway");
    json_decref(j);
    for (int i = 0; i < s.n; i++)
        ck_assert_str_ne(s.block[i], "data: [DONE]");
    sse_free(&s);
    /* a stream whose backend stalls before the first event: the gateway commits to a stream
     * only with the first byte of the answer, so the client gets a plain 504 */
    sb = "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:STALL:4000\",\"stream\":true}";
    resp r;
    http(&r, "POST", "/v1/completions", sb);
    assert_error(&r, 504, "upstream_timeout", NULL);
    cg_buf_free(&r.body);
    char *m = scrape();
    ck_assert_double_ge(metric(m, "chunkgate_backend_errors_total{kind=\"timeout\"}"), 2);
    ck_assert_double_ge(metric(m, "chunkgate_backend_errors_total{kind=\"too_large\"}"), 1);
    ck_assert_double_ge(metric(m, "chunkgate_backend_errors_total{kind=\"status\"}"), 2);
    ck_assert_double_ge(metric(m, "chunkgate_backend_errors_total{kind=\"stream\"}"), 1);
    free(m);
    assert_healthy();
}
END_TEST

static json_t *fake_stats(void)
{
    resp r;
    http_full(&r, fake.port, "GET", "/stats", NULL, 0, NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    cg_buf_free(&r.body);
    return j;
}

static long stat_of(json_t *j, const char *k)
{
    return (long)json_integer_value(json_object_get(j, k));
}

/* The client leaves mid-stream: the gateway cancels the upstream transfer at once instead of
 * reading the rest of the answer (the slow stream has 60 events 100 ms apart). */
START_TEST(client_disconnect_cancels_upstream)
{
    json_t *before = fake_stats();
    char *m0 = scrape();
    double disc0 = metric(m0, "chunkgate_client_disconnects_total");
    free(m0);
    sse s = {0};
    s.stop_after = 2;
    const char *b =
        "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:SLOW # # d # # q\",\"stream\":true}";
    double t0 = now_s();
    ck_assert_int_eq(sse_post(&s, gw.port, "/v1/completions", b), CURLE_WRITE_ERROR);
    sse_free(&s);
    json_t *after = NULL;
    int cancelled = 0;
    while (now_s() - t0 < 4.0) { /* the full answer would take 6 s */
        json_decref(after);
        after = fake_stats();
        if (stat_of(after, "streams_aborted") > stat_of(before, "streams_aborted")) {
            cancelled = 1;
            break;
        }
        sleep_ms(50);
    }
    ck_assert_msg(cancelled, "the backend's stream was not cancelled");
    ck_assert_int_eq(stat_of(after, "streams_completed"), stat_of(before, "streams_completed"));
    char *m = scrape();
    ck_assert_double_eq(metric(m, "chunkgate_client_disconnects_total"), disc0 + 1);
    free(m);
    json_decref(before);
    json_decref(after);
    assert_healthy();
}
END_TEST

/* A closed port: connection refused. */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(0x7f000001);
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

START_TEST(backend_down)
{
    char dir[300], backend[64];
    snprintf(dir, sizeof dir, "%s/down", tmp_root);
    snprintf(backend, sizeof backend, "http://127.0.0.1:%d", dead_port());
    proc g2;
    const char *extra[] = {"--model", "gw-default", NULL};
    ck_assert_int_eq(start_gateway(&g2, dir, backend, extra, "down.log"), 0);
    for (int i = 0; i < 2; i++) {
        resp r;
        const char *b = i ? "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true}"
                          : "{\"model\":\"m\",\"prompt\":\"s # # d # # q\"}";
        http_full(&r, g2.port, "POST", "/v1/completions", b, strlen(b), NULL, NULL);
        assert_error(&r, 502, "upstream_unavailable", NULL);
        json_t *j = jbody(&r);
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                         "upstream_error");
        json_decref(j);
        cg_buf_free(&r.body);
        http_full(&r, g2.port, "GET", "/healthz", NULL, 0, NULL, NULL);
        ck_assert_int_eq(r.status, 200);
        cg_buf_free(&r.body);
    }
    resp r;
    http_full(&r, g2.port, "GET", "/readyz", NULL, 0, NULL, NULL);
    assert_error(&r, 503, "upstream_unavailable", NULL);
    cg_buf_free(&r.body);
    http_full(&r, g2.port, "GET", "/v1/models", NULL, 0, NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "gw-default");
    json_decref(j);
    cg_buf_free(&r.body);
    /* the segments were still recorded */
    http_full(&r, g2.port, "GET", "/v1/chunks", NULL, 0, NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    j = jbody(&r);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "data")), 2);
    json_decref(j);
    cg_buf_free(&r.body);
    http_full(&r, g2.port, "GET", "/metrics", NULL, 0, NULL, NULL);
    ck_assert_double_eq(metric(r.body.data, "chunkgate_backend_errors_total{kind=\"connect\"}"), 2);
    cg_buf_free(&r.body);
    ck_assert_int_eq(stop_proc(&g2, SIGTERM), 0);

    /* no backend at all: 503 after validation, 400 still first */
    snprintf(dir, sizeof dir, "%s/nobackend", tmp_root);
    ck_assert_int_eq(start_gateway(&g2, dir, NULL, NULL, "nobackend.log"), 0);
    http_full(&r, g2.port, "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\"}", 26,
              NULL, NULL);
    assert_error(&r, 503, "upstream_unavailable", NULL);
    cg_buf_free(&r.body);
    http_full(&r, g2.port, "POST", "/v1/completions", "{\"model\":1}", 11, NULL, NULL);
    assert_error(&r, 400, "invalid_type", "model");
    cg_buf_free(&r.body);
    http_full(&r, g2.port, "GET", "/v1/models", NULL, 0, NULL, NULL);
    assert_error(&r, 503, "upstream_unavailable", NULL);
    cg_buf_free(&r.body);
    ck_assert_int_eq(stop_proc(&g2, SIGINT), 0);
}
END_TEST

START_TEST(restart_keeps_index)
{
    char dir[300], backend[64], n[64], prompt[256], doc[96], hex[CG_KEY_HEX_LEN + 1], path[128];
    snprintf(dir, sizeof dir, "%s/restart", tmp_root);
    fake_url(backend, sizeof backend);
    nonce(n, sizeof n);
    snprintf(doc, sizeof doc, "Restart doc %s", n);
    snprintf(prompt, sizeof prompt, "sys # # %s # # q", doc);
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, doc, hex);
    snprintf(path, sizeof path, "/v1/chunks/%s", hex);
    char *b = dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    for (int round = 1; round <= 2; round++) {
        proc g;
        ck_assert_int_eq(
            start_gateway(&g, dir, backend, NULL, round == 1 ? "restart1.log" : "restart2.log"), 0);
        resp r;
        if (round == 2) { /* what the first run recorded is still there */
            http_full(&r, g.port, "GET", path, NULL, 0, NULL, NULL);
            ck_assert_int_eq(r.status, 200);
            json_t *j = jbody(&r);
            ck_assert_int_eq(json_integer_value(json_object_get(j, "seen_count")), 1);
            json_decref(j);
            cg_buf_free(&r.body);
        }
        http_full(&r, g.port, "POST", "/v1/completions", b, strlen(b), NULL, NULL);
        ck_assert_int_eq(r.status, 200);
        cg_buf_free(&r.body);
        http_full(&r, g.port, "GET", path, NULL, 0, NULL, NULL);
        ck_assert_int_eq(r.status, 200);
        json_t *j = jbody(&r);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "seen_count")), round);
        json_decref(j);
        cg_buf_free(&r.body);
        ck_assert_int_eq(stop_proc(&g, SIGTERM), 0);
        char *log = read_file(g.log);
        ck_assert_ptr_nonnull(strstr(log, "\"msg\":\"stopped\""));
        free(log);
    }
    free(b);
}
END_TEST

START_TEST(metrics_series)
{
    char *m0 = scrape();
    double misses0 = metric(m0, "chunkgate_chunk_misses_total");
    double empty0 = metric(m0, "chunkgate_empty_segments_total");
    double chunks0 = metric(m0, "chunkgate_segments_total{role=\"chunk\"}");
    double ok0 = metric(m0, "chunkgate_requests_total{route=\"completions\",code=\"200\"}");
    double fb0 = metric(m0, "chunkgate_fallbacks_total");
    free(m0);
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "ms %s # # a %s # #  # # b %s # # q", n, n, n);
    char *b = dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    resp r;
    http(&r, "POST", "/v1/completions", b);
    ck_assert_int_eq(r.status, 200);
    cg_buf_free(&r.body);
    free(b);
    char *m = scrape();
    ck_assert_double_eq(metric(m, "chunkgate_chunk_misses_total"), misses0 + 3);
    ck_assert_double_eq(metric(m, "chunkgate_empty_segments_total"), empty0 + 1);
    ck_assert_double_eq(metric(m, "chunkgate_segments_total{role=\"chunk\"}"), chunks0 + 2);
    ck_assert_double_eq(metric(m, "chunkgate_fallbacks_total"), fb0 + 1);
    ck_assert_double_eq(metric(m, "chunkgate_requests_total{route=\"completions\",code=\"200\"}"),
                        (ok0 < 0 ? 0 : ok0) + 1);
    const char *series[] = {
        "chunkgate_chunk_hits_total",
        "chunkgate_tokens_reused_total",
        "chunkgate_tokens_computed_total",
        "chunkgate_passthrough_total",
        "chunkgate_worker_errors_total{kind=\"connect\"}",
        "chunkgate_index_chunks",
        "chunkgate_index_bytes",
        "chunkgate_index_writer_batches_total",
        "chunkgate_index_writer_queue_depth",
        "chunkgate_ttft_seconds_count",
        "chunkgate_backend_errors_total{kind=\"connect\"}",
        "chunkgate_request_duration_seconds_count{route=\"completions\"}",
        "chunkgate_request_duration_seconds_bucket{route=\"completions\",le=\"+Inf\"}",
        "chunkgate_segments_total{role=\"system\"}",
        "chunkgate_segments_total{role=\"question\"}",
    };
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++)
        ck_assert_msg(metric(m, series[i]) >= 0, "series %s missing", series[i]);
    ck_assert_double_ge(metric(m, "chunkgate_index_chunks"), 3);
    ck_assert_ptr_nonnull(strstr(m, "# TYPE chunkgate_ttft_seconds histogram"));
    free(m);
}
END_TEST

/* Many concurrent streams through the gateway: every one completes with [DONE]. */
START_TEST(concurrent_streams)
{
    enum { N = 100 };
    CURLM *multi = curl_multi_init();
    static sse ss[N];
    CURL *es[N];
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", gw.port);
    const char *b = "{\"model\":\"" MODEL "\",\"prompt\":\"s # # d # # q\",\"stream\":true}";
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; i < N; i++) {
        memset(&ss[i], 0, sizeof ss[i]);
        cg_buf_init(&ss[i].raw, 0);
        es[i] = curl_easy_init();
        curl_easy_setopt(es[i], CURLOPT_URL, url);
        curl_easy_setopt(es[i], CURLOPT_POSTFIELDS, b);
        curl_easy_setopt(es[i], CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(es[i], CURLOPT_WRITEFUNCTION, sse_write);
        curl_easy_setopt(es[i], CURLOPT_WRITEDATA, &ss[i]);
        curl_easy_setopt(es[i], CURLOPT_TIMEOUT, 60L);
        curl_multi_add_handle(multi, es[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < N; i++) {
        ck_assert_msg(ss[i].n > 0 && !strcmp(ss[i].block[ss[i].n - 1], "data: [DONE]"),
                      "stream %d incomplete", i);
        curl_multi_remove_handle(multi, es[i]);
        curl_easy_cleanup(es[i]);
        sse_free(&ss[i]);
    }
    curl_slist_free_all(h);
    curl_multi_cleanup(multi);
    assert_healthy();
}
END_TEST

START_TEST(config_errors_exit_2)
{
    struct {
        const char *args[4];
        int rc;
        const char *text;
    } cases[] = {
        {{"--nope", NULL}, 2, "unknown option"},
        {{"--max-segments", "1", NULL}, 2, "--max-segments"},
        {{"--listen", "127.0.0.1:99999", NULL}, 2, "--listen"},
        {{"--log-level", "chatty", NULL}, 2, "--log-level"},
        {{"--help", NULL}, 0, "CHUNKGATE_BACKEND"},
        {{"--data-dir", "/proc/no/such/dir", "--listen", "127.0.0.1:0"},
         1,
         "cannot create directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char log[512];
        snprintf(log, sizeof log, "%s/cfg%zu.log", tmp_root, i);
        proc p;
        const char *args[5] = {cases[i].args[0], cases[i].args[1], cases[i].args[2],
                               cases[i].args[3], NULL};
        ck_assert_int_eq(spawn(&p, CHUNKGATE_BIN, args, log, NULL), 0);
        int st;
        ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
        ck_assert(WIFEXITED(st));
        ck_assert_msg(WEXITSTATUS(st) == cases[i].rc, "case %zu exited %d", i, WEXITSTATUS(st));
        char *text = read_file(log);
        ck_assert_msg(strstr(text, cases[i].text) != NULL, "case %zu: %s", i, text);
        free(text);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gateway");
    TCase *tc = tcase_create("integration");
    tcase_add_unchecked_fixture(tc, suite_setup, suite_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, completion_forwarded_with_chunk_cache);
    tcase_add_test(tc, completion_passthrough_and_modes);
    tcase_add_test(tc, completion_stream_incremental);
    tcase_add_test(tc, stream_usage_and_crlf);
    tcase_add_test(tc, chat_with_documents);
    tcase_add_test(tc, chat_separators_in_messages);
    tcase_add_test(tc, chat_stream);
    tcase_add_test(tc, bad_inputs);
    tcase_add_test(tc, admin_auth);
    tcase_add_test(tc, index_contents_and_admin);
    tcase_add_test(tc, chunks_paging);
    tcase_add_test(tc, models_and_readyz);
    tcase_add_test(tc, backend_faults);
    tcase_add_test(tc, client_disconnect_cancels_upstream);
    tcase_add_test(tc, backend_down);
    tcase_add_test(tc, restart_keeps_index);
    tcase_add_test(tc, metrics_series);
    tcase_add_test(tc, concurrent_streams);
    tcase_add_test(tc, config_errors_exit_2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
