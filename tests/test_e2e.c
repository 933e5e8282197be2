/* End-to-end suite: the real chunkgate gateway in front of two real chunkgate-worker
 * processes (the model made by `chunkgate-worker generate-model`), all on loopback, driven
 * with libcurl. Covers the main path (misses, then hits on the same worker with the reference
 * answer), routing across workers, streaming, chat, tenant isolation, client disconnects and
 * assembly release, worker errors / timeouts / death with fallback, a worker killed
 * mid-stream, restart and reconciliation, stale placements, registration checks, the admin
 * worker API, pinning and metrics. A separate case tests the routing rule itself. */
#include <check.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
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

#include "worker/serve/engine.h"
#include "worker/serve/worker_api.h"
#include "base/base.h"
#include "cache/key.h"
#include "server/workers.h"

#define ADMIN "tok-e2e"
#define MODEL "chunkgate-tiny"

typedef struct proc {
    pid_t pid;
    int port;
    char log[512];
} proc;

static char tmp_root[256], model_dir[300];
static proc gw, wk[2];
static int wport[2];
static cg_model *model; /* the same model in-process, for reference answers */

/* Small documents keep the suite fast on 2 cores; their texts are distinct per test. */
static const char *SYS_A = "You are a careful assistant. Answer from the documents only.";
static const char *SYS_B = "Terse mode: cite the document letter and nothing else.";
static const char *D1 = "Document one. Annual rainfall in the valley averaged 812 millimetres "
                        "between 1990 and 2020; in 2024 two gauges were replaced.";
static const char *D2 = "Document two. The cooperative's bylaws were amended in March: members "
                        "may vote by post and the quorum fell to one third.";

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
    if (!f) return cg_strdup("");
    cg_buf b;
    cg_buf_init(&b, 0);
    char tmp[4096];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        if (cg_buf_append(&b, tmp, n) != CG_OK) break;
    fclose(f);
    return b.data ? b.data : cg_strdup("");
}

/* Starts bin with args (NULL-terminated), output to log; waits for marker and reads the port
 * that follows it. Returns 0 or -1. */
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
    /* Empty the log before the child runs, so a restart never reads the last run's port. */
    int tfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (tfd >= 0) close(tfd);
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
    for (int i = 0; i < 3000; i++) { /* up to 60 s: sanitizer builds start slowly */
        char *text = read_file(log);
        const char *m = strstr(text, marker);
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

/* Sends sig and waits up to 20 s; returns the exit status, 128+signal, or -1. */
static int stop_proc(proc *p, int sig)
{
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
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

/* A loopback port that was free a moment ago (for a worker that must restart on it). */
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

static int start_worker(proc *p, const char *mdir, int port, const char *name,
                        const char *const *extra)
{
    char listen[64], data[400], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(data, sizeof data, "%s/%s-data", tmp_root, name);
    snprintf(log, sizeof log, "%s/%s.log", tmp_root, name);
    const char *args[40] = {"serve",      "--model", mdir,        "--listen", listen,
                            "--data-dir", data,      "--pool-mb", "64"};
    int n = 9;
    for (; extra && *extra; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return spawn(p, WORKER_BIN, args, log, "\"msg\":\"listening on 127.0.0.1:");
}

static int start_gateway(proc *p, const char *name, const char *const *extra)
{
    char data[400], log[400];
    snprintf(data, sizeof data, "%s/%s-data", tmp_root, name);
    snprintf(log, sizeof log, "%s/%s.log", tmp_root, name);
    const char *args[48] = {"--listen", "127.0.0.1:0", "--data-dir", data, "--admin-token", ADMIN};
    int n = 6;
    for (; extra && *extra; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return spawn(p, CHUNKGATE_BIN, args, log, "listening on 127.0.0.1:");
}

static void url_of(int port, char *out, size_t n)
{
    snprintf(out, n, "http://127.0.0.1:%d", port);
}

/* ------------------------------------------------------------ HTTP client */

typedef struct resp {
    long status;
    cg_buf body;
    CURLcode rc;
} resp;

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    return cg_buf_append(&r->body, d, sz * n) == CG_OK ? sz * n : 0;
}

static void http_full(resp *r, int port, const char *method, const char *path, const char *body,
                      const char *token)
{
    memset(r, 0, sizeof *r);
    cg_buf_init(&r->body, 0);
    CURL *e = curl_easy_init();
    char url[512], auth[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    h = curl_slist_append(h, "Content-Type: application/json");
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    r->rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

static json_t *jbody(resp *r)
{
    json_t *j = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, NULL);
    ck_assert_msg(j != NULL, "not JSON (HTTP %ld, curl %d): %.*s", r->status, (int)r->rc,
                  (int)r->body.len, r->body.data ? r->body.data : "");
    return j;
}

/* method path on port with body (taken over, may be NULL); asserts the status; returns the
 * JSON answer (caller decrefs). */
static json_t *call(int port, const char *method, const char *path, json_t *body, const char *token,
                    long want)
{
    char *b = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    resp r;
    http_full(&r, port, method, path, b, token);
    free(b);
    ck_assert_msg(r.status == want, "%s %s: HTTP %ld (want %ld): %.*s", method, path, r.status,
                  want, (int)r.body.len, r.body.data ? r.body.data : "");
    json_t *j = jbody(&r);
    cg_buf_free(&r.body);
    return j;
}

static json_t *gw_call(const char *method, const char *path, json_t *body, long want)
{
    return call(gw.port, method, path, body, NULL, want);
}

static json_t *admin(int port, const char *method, const char *path, json_t *body, long want)
{
    return call(port, method, path, body, ADMIN, want);
}

static void assert_error(json_t *j, const char *code)
{
    json_t *e = json_object_get(j, "error");
    ck_assert_msg(json_is_object(e), "no error object");
    ck_assert(json_string_length(json_object_get(e, "message")) > 0);
    ck_assert(json_is_string(json_object_get(e, "type")));
    ck_assert(json_object_get(e, "param") != NULL);
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), code);
}

static const char *sget(json_t *j, const char *k)
{
    return json_string_value(json_object_get(j, k));
}
static long long iget(json_t *j, const char *k)
{
    return json_integer_value(json_object_get(j, k));
}
static json_t *cc_of(json_t *j)
{
    return json_object_get(j, "chunk_cache");
}
static json_t *seg_of(json_t *j, size_t i)
{
    return json_array_get(json_object_get(cc_of(j), "segments"), i);
}
static long long cached_of(json_t *j)
{
    return iget(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"),
                "cached_tokens");
}
static const char *text_of(json_t *j)
{
    return sget(json_array_get(json_object_get(j, "choices"), 0), "text");
}

static char *rag(const char *sys, const char *a, const char *b, const char *q)
{
    size_t n = strlen(sys) + strlen(a) + (b ? strlen(b) : 0) + strlen(q) + 32;
    char *p = cg_malloc(n);
    if (b)
        snprintf(p, n, "%s # # %s # # %s # # %s", sys, a, b, q);
    else
        snprintf(p, n, "%s # # %s # # %s", sys, a, q);
    return p;
}

/* A greedy completion request through the gateway. */
static json_t *complete(const char *prompt, int max_tokens, const char *salt, long want)
{
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens",
                          max_tokens, "temperature", 0.0);
    if (salt) json_object_set_new(b, "cache_salt", json_string(salt));
    return gw_call("POST", "/v1/completions", b, want);
}

static void key_hex(const char *text, const char *salt, char out[CG_KEY_HEX_LEN + 1])
{
    cg_key k = cg_key_compute(MODEL, strlen(MODEL), CG_MODE_STRICT, salt, salt ? strlen(salt) : 0,
                              NULL, text, strlen(text));
    cg_key_hex(&k, out);
}

/* ------------------------------------------------------------ metrics and state */

static double metric_in(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return -1;
}

static double metric(int port, const char *series)
{
    resp r;
    http_full(&r, port, "GET", "/metrics", NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    double v = metric_in(r.body.data, series);
    cg_buf_free(&r.body);
    return v;
}

/* The gateway's view of the worker at url (new reference) or NULL. */
static json_t *worker_view(int gport, const char *url)
{
    json_t *l = admin(gport, "GET", "/v1/workers", NULL, 200);
    json_t *found = NULL;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(l, "data"), i, w) if (!strcmp(sget(w, "url"), url))
    {
        found = json_incref(w);
    }
    json_decref(l);
    return found;
}

/* Waits up to 30 s for the gateway to report the worker healthy (1) or not (0). */
static int wait_health(int gport, const char *url, int healthy)
{
    for (int i = 0; i < 1500; i++) {
        json_t *w = worker_view(gport, url);
        int h = w && json_is_true(json_object_get(w, "healthy"));
        json_decref(w);
        if (h == healthy) return 1;
        sleep_ms(20);
    }
    return 0;
}

/* The worker's own count of live assemblies (GET /v1/info). */
static long long assemblies_live(int wport_)
{
    json_t *j = call(wport_, "GET", "/v1/info", NULL, NULL, 200);
    long long n = iget(j, "assemblies_live");
    json_decref(j);
    return n;
}

/* Whether the index places the chunk on worker_id (-1: anywhere); flushes via the admin read. */
static int placed(const char *key, long long worker_id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/chunks/%s", key);
    resp r;
    http_full(&r, gw.port, "GET", path, NULL, ADMIN);
    if (r.status == 404) {
        cg_buf_free(&r.body);
        return 0;
    }
    ck_assert_int_eq(r.status, 200);
    json_t *j = jbody(&r);
    cg_buf_free(&r.body);
    int found = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(j, "placements"), i, p)
    {
        if (worker_id < 0 || iget(p, "worker_id") == worker_id) found = 1;
    }
    json_decref(j);
    return found;
}

static long long worker_id_of(const char *url)
{
    json_t *w = worker_view(gw.port, url);
    ck_assert_ptr_nonnull(w);
    long long id = iget(w, "id");
    json_decref(w);
    return id;
}

static int port_of_url(const char *url)
{
    const char *c = strrchr(url, ':');
    return c ? atoi(c + 1) : 0;
}

/* Index of the suite worker with this URL, or -1. */
static int worker_index(const char *url)
{
    for (int i = 0; i < 2; i++)
        if (port_of_url(url) == wport[i]) return i;
    return -1;
}

/* ------------------------------------------------------------ SSE client */

typedef struct sse {
    cg_buf raw;
    size_t scanned;
    int n;
    char *block[4096];
    int data_blocks;
    int stop_after;   /* abort after this many data blocks (0 = never) */
    pid_t kill_after; /* SIGKILL this pid after the first data block */
    long status;
} sse;

static size_t sse_write(char *d, size_t sz, size_t nm, void *ud)
{
    sse *s = ud;
    size_t n = sz * nm;
    for (size_t i = 0; i < n; i++)
        if (d[i] != '\r' && cg_buf_append(&s->raw, d + i, 1) != CG_OK) return 0;
    char *end;
    while (s->raw.data && (end = strstr(s->raw.data + s->scanned, "\n\n")) && s->n < 4096) {
        size_t start = s->scanned;
        s->block[s->n] = cg_strndup(s->raw.data + start, (size_t)(end - s->raw.data) - start);
        if (!strncmp(s->block[s->n], "data:", 5)) s->data_blocks++;
        s->n++;
        s->scanned = (size_t)(end - s->raw.data) + 2;
    }
    if (s->kill_after > 0 && s->data_blocks >= 1) {
        kill(s->kill_after, SIGKILL);
        s->kill_after = 0;
    }
    if (s->stop_after && s->data_blocks >= s->stop_after) return 0;
    return n;
}

static CURLcode sse_post(sse *s, int port, const char *path, json_t *body)
{
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    cg_buf_init(&s->raw, 0);
    CURL *e = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, b);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &s->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    free(b);
    return rc;
}

static void sse_free(sse *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->block[i]);
    cg_buf_free(&s->raw);
}

static json_t *sse_json(sse *s, int i)
{
    if (strncmp(s->block[i], "data: ", 6) != 0) return NULL;
    return json_loads(s->block[i] + 6, 0, NULL);
}

/* ------------------------------------------------------------ reference answers */

/* The answer of an in-process engine on the reference path (one forward over all tokens at
 * their true positions under the strict mask), greedy, sanitised like the worker's. */
static char *reference_text(const char *sys, const char *a, const char *b, const char *q,
                            uint32_t max_tokens)
{
    cg_engine *e = NULL;
    ck_assert_int_eq(cg_engine_open(model, cg_engine_default_params(), &e), CG_OK);
    cg_engine_seg s[4] = {{CG_ROLE_SYSTEM, sys, strlen(sys), NULL},
                          {CG_ROLE_CHUNK, a, strlen(a), NULL},
                          {CG_ROLE_CHUNK, b, strlen(b), NULL},
                          {CG_ROLE_QUESTION, q, strlen(q), NULL}};
    cg_assemble_req ar = {.segs = s,
                          .n_segs = 4,
                          .mode = CG_MODE_STRICT,
                          .reserve_tokens = -1,
                          .path = CG_PATH_REFERENCE};
    cg_assembly_info info;
    char err[256];
    ck_assert_int_eq(cg_engine_assemble(e, &ar, 1, &info, err, sizeof err), CG_OK);
    cg_complete_req cr = {.assembly_id = info.id, .max_tokens = max_tokens};
    cg_complete_result res;
    ck_assert_int_eq(cg_engine_complete(e, &cr, 1, &res, err, sizeof err), CG_OK);
    cg_buf out;
    cg_buf_init(&out, 0);
    cg_utf8_sanitize(res.text, res.text_len, 1, &out);
    char *t = cg_strndup(out.data ? out.data : "", out.len);
    cg_buf_free(&out);
    cg_complete_result_free(&res);
    cg_assembly_info_free(&info);
    cg_engine_close(&e);
    return t;
}

/* ------------------------------------------------------------ fixture */

static void wait_or_die(int ok, const char *what, const char *log)
{
    if (ok) return;
    char *text = read_file(log);
    fprintf(stderr, "%s failed; log:\n%s\n", what, text);
    free(text);
    abort();
}

static void suite_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(tmp_root, sizeof tmp_root, "/tmp/cg_e2e_XXXXXX");
    if (!mkdtemp(tmp_root)) abort();
    snprintf(model_dir, sizeof model_dir, "%s/model", tmp_root);
    char log[400];
    snprintf(log, sizeof log, "%s/gen.log", tmp_root);
    proc gen;
    const char *ga[] = {"generate-model", "--out", model_dir, NULL};
    wait_or_die(spawn(&gen, WORKER_BIN, ga, log, NULL) == 0, "generate-model", log);
    int st;
    waitpid(gen.pid, &st, 0);
    wait_or_die(WIFEXITED(st) && WEXITSTATUS(st) == 0, "generate-model", log);
    char err[256];
    if (cg_model_open(model_dir, &model, err, sizeof err) != CG_OK) {
        fprintf(stderr, "cannot load the model: %s\n", err);
        abort();
    }
    const char *names[] = {"w0", "w1"};
    for (int i = 0; i < 2; i++) {
        wport[i] = free_port();
        wait_or_die(start_worker(&wk[i], model_dir, wport[i], names[i], NULL) == 0, names[i],
                    wk[i].log);
    }
    char u0[64], u1[64];
    url_of(wport[0], u0, sizeof u0);
    url_of(wport[1], u1, sizeof u1);
    /* No --backend: the chosen worker answers the completion. Fast health checks so the
     * failure tests need not wait; no periodic resync, so a stale placement stays until a
     * request finds it. */
    const char *extra[] = {"--worker",
                           u0,
                           "--worker",
                           u1,
                           "--health-interval-ms",
                           "100",
                           "--health-timeout-ms",
                           "2000",
                           "--sync-interval-ms",
                           "0",
                           "--heartbeat-ms",
                           "200",
                           NULL};
    wait_or_die(start_gateway(&gw, "gw", extra) == 0, "chunkgate", gw.log);
    wait_or_die(wait_health(gw.port, u0, 1) && wait_health(gw.port, u1, 1), "worker health",
                gw.log);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void suite_teardown(void)
{
    int rc = gw.pid > 0 ? stop_proc(&gw, SIGTERM) : 0;
    for (int i = 0; i < 2; i++)
        stop_proc(&wk[i], SIGTERM);
    cg_model_close(&model);
    if (rc != 0) fprintf(stderr, "chunkgate exited with %d; logs kept in %s\n", rc, tmp_root);
    if (rc == 0 && !getenv("CG_KEEP_TMP")) nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------ tests: main path */

/* Request 1 (system A + d1 + d2 + q1): all misses. Request 2 (system B + d2 + d1 + q2,
 * strict): both documents hit on the same worker, cached_tokens = their tokens, and the
 * answer equals the worker's own computation and an in-process reference forward. */
START_TEST(main_path_hits_on_same_worker)
{
    double hits0 = metric(gw.port, "chunkgate_chunk_hits_total");
    double reused0 = metric(gw.port, "chunkgate_tokens_reused_total");
    char *p1 = rag(SYS_A, D1, D2, "What changed in 2024?");
    json_t *r1 = complete(p1, 8, NULL, 200);
    json_t *cc = cc_of(r1);
    ck_assert(json_is_false(json_object_get(cc, "fallback")));
    ck_assert(json_is_false(json_object_get(cc, "passthrough")));
    ck_assert_str_eq(sget(cc, "routing"), "least_loaded");
    const char *w1 = sget(cc, "worker");
    ck_assert_int_ge(worker_index(w1), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(cc, "segments")), 3);
    for (size_t i = 0; i < 3; i++) {
        ck_assert(json_is_false(json_object_get(seg_of(r1, i), "hit")));
        ck_assert_str_eq(sget(seg_of(r1, i), "tier"), "miss");
    }
    ck_assert_int_eq(iget(seg_of(r1, 1), "tokens"), (long long)strlen(D1));
    ck_assert_int_eq(cached_of(r1), 0);

    const char *q2 = "Who may vote by post?";
    char *p2 = rag(SYS_B, D2, D1, q2);
    json_t *r2 = complete(p2, 16, NULL, 200);
    cc = cc_of(r2);
    ck_assert(json_is_false(json_object_get(cc, "fallback")));
    ck_assert_str_eq(sget(cc, "worker"), w1);
    ck_assert_str_eq(sget(cc, "routing"), "hit");
    ck_assert(json_is_false(json_object_get(seg_of(r2, 0), "hit"))); /* system B is new */
    ck_assert(json_is_true(json_object_get(seg_of(r2, 1), "hit")));
    ck_assert(json_is_true(json_object_get(seg_of(r2, 2), "hit")));
    ck_assert_str_eq(sget(seg_of(r2, 1), "tier"), "ram");
    char k1[CG_KEY_HEX_LEN + 1], k2[CG_KEY_HEX_LEN + 1];
    key_hex(D1, NULL, k1);
    key_hex(D2, NULL, k2);
    ck_assert_str_eq(sget(seg_of(r2, 1), "key"), k2);
    ck_assert_str_eq(sget(seg_of(r2, 2), "key"), k1);
    /* strict chunks are tokenized alone, byte-level: one token per byte */
    ck_assert_int_eq(cached_of(r2), (long long)(strlen(D1) + strlen(D2)));

    /* the same prompt sent to that worker itself, computed fresh (another salt: no reuse) */
    json_t *direct = call(port_of_url(w1), "POST", "/v1/completions",
                          json_pack("{s:s, s:i, s:f, s:s}", "prompt", p2, "max_tokens", 16,
                                    "temperature", 0.0, "cache_salt", "e2e-reference"),
                          NULL, 200);
    ck_assert_int_eq(cached_of(direct), 0);
    ck_assert_str_eq(text_of(r2), text_of(direct));
    char *ref = reference_text(SYS_B, D2, D1, q2, 16);
    ck_assert_str_eq(text_of(r2), ref);
    ck_assert_uint_eq(strlen(ref) > 0, 1);
    free(ref);
    json_decref(direct);

    /* the index learnt the placements from the assemble answers */
    long long wid = worker_id_of(w1);
    ck_assert(placed(k1, wid));
    ck_assert(placed(k2, wid));
    ck_assert_double_eq(metric(gw.port, "chunkgate_chunk_hits_total"), hits0 + 2);
    ck_assert_double_eq(metric(gw.port, "chunkgate_tokens_reused_total"),
                        reused0 + (double)(strlen(D1) + strlen(D2)));
    json_decref(r1);
    json_decref(r2);
    free(p1);
    free(p2);
}
END_TEST

/* Cold requests with different documents spread over both workers (the tie-break is the
 * first chunk's key, not always worker 0), and a recurring document keeps landing where its
 * KV is. */
START_TEST(misses_spread_and_documents_stick)
{
    const char *first_worker[8];
    json_t *answers[8];
    int used[2] = {0, 0};
    for (int i = 0; i < 8; i++) {
        char doc[160], prompt[400];
        snprintf(doc, sizeof doc, "Spread document %d: the ferry leaves at %d o'clock.", i, 6 + i);
        snprintf(prompt, sizeof prompt, "Spread system. # # %s # # When?", doc);
        answers[i] = complete(prompt, 1, NULL, 200);
        first_worker[i] = sget(cc_of(answers[i]), "worker");
        ck_assert_str_eq(sget(cc_of(answers[i]), "routing"), "least_loaded");
        used[worker_index(first_worker[i])]++;
    }
    ck_assert_msg(used[0] > 0 && used[1] > 0, "all cold requests went to one worker (%d/%d)",
                  used[0], used[1]);
    for (int i = 0; i < 8; i++) {
        char doc[160], prompt[400];
        snprintf(doc, sizeof doc, "Spread document %d: the ferry leaves at %d o'clock.", i, 6 + i);
        snprintf(prompt, sizeof prompt, "Another system prompt. # # %s # # And when back?", doc);
        json_t *r = complete(prompt, 1, NULL, 200);
        ck_assert_str_eq(sget(cc_of(r), "worker"), first_worker[i]);
        ck_assert_str_eq(sget(cc_of(r), "routing"), "hit");
        ck_assert(json_is_true(json_object_get(seg_of(r, 1), "hit")));
        json_decref(r);
    }
    for (int i = 0; i < 8; i++)
        json_decref(answers[i]);
}
END_TEST

/* Streaming through the main path: chunk_cache on the first event, the same text as the
 * non-streamed answer, usage with cached_tokens, one [DONE]. */
START_TEST(streaming_main_path)
{
    const char *sys = "Streaming system prompt.";
    char *p = rag(sys, D2, D1, "Summarise both.");
    json_t *plain = complete(p, 12, NULL, 200);
    ck_assert_int_eq(cached_of(plain), (long long)(strlen(D1) + strlen(D2)));
    sse s = {0};
    CURLcode rc = sse_post(&s, gw.port, "/v1/completions",
                           json_pack("{s:s, s:s, s:i, s:f, s:b, s:{s:b}}", "model", MODEL, "prompt",
                                     p, "max_tokens", 12, "temperature", 0.0, "stream", 1,
                                     "stream_options", "include_usage", 1));
    ck_assert_int_eq(rc, CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    cg_buf text;
    cg_buf_init(&text, 0);
    int first = 1, usage = 0, done = 0;
    for (int i = 0; i < s.n; i++) {
        if (!strcmp(s.block[i], "data: [DONE]")) {
            done++;
            ck_assert_int_eq(i, s.n - 1);
            continue;
        }
        json_t *j = sse_json(&s, i);
        if (!j) continue;
        if (first) {
            json_t *cc = cc_of(j);
            ck_assert(json_is_object(cc));
            ck_assert(json_is_false(json_object_get(cc, "fallback")));
            ck_assert(json_is_true(json_object_get(seg_of(j, 1), "hit")));
            ck_assert(json_is_true(json_object_get(seg_of(j, 2), "hit")));
            first = 0;
        } else {
            ck_assert_ptr_null(cc_of(j));
        }
        const char *t = text_of(j);
        if (t) ck_assert_int_eq(cg_buf_append(&text, t, strlen(t)), CG_OK);
        json_t *u = json_object_get(j, "usage");
        if (json_is_object(u)) {
            usage++;
            /* the system prompt is a hit now too (stored by the first request; BOS + bytes) */
            ck_assert_int_eq(cached_of(j), (long long)(strlen(D1) + strlen(D2) + strlen(sys) + 1));
        }
        json_decref(j);
    }
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(usage, 1);
    ck_assert_str_eq(text.data ? text.data : "", text_of(plain));
    cg_buf_free(&text);
    sse_free(&s);
    /* not asked for: no event carries usage (OpenAI's rule; the gateway still counts it) */
    sse s2 = {0};
    rc = sse_post(&s2, gw.port, "/v1/completions",
                  json_pack("{s:s, s:s, s:i, s:f, s:b}", "model", MODEL, "prompt", p, "max_tokens",
                            12, "temperature", 0.0, "stream", 1));
    ck_assert_int_eq(rc, CURLE_OK);
    int events = 0;
    for (int i = 0; i < s2.n; i++) {
        json_t *j = sse_json(&s2, i);
        if (!j) continue;
        events++;
        ck_assert_ptr_null(json_object_get(j, "usage"));
        ck_assert_int_eq(json_array_size(json_object_get(j, "choices")), 1);
        json_decref(j);
    }
    ck_assert_int_ge(events, 2);
    sse_free(&s2);
    json_decref(plain);
    free(p);
}
END_TEST

/* Chat with documents takes the main path: the rendering's segments are assembled (the
 * documents are the same chunks as in completions), the completion is converted back into
 * chat.completion and chat.completion.chunk objects. */
START_TEST(chat_main_path)
{
    json_t *b = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}], s:[s, s], s:i, s:f}", "model", MODEL,
                          "messages", "role", "system", "content", "Chat system prompt.", "role",
                          "user", "content", "Which document mentions gauges?", "documents", D1, D2,
                          "max_tokens", 6, "temperature", 0.0);
    json_t *stream_body = json_deep_copy(b);
    json_t *r = gw_call("POST", "/v1/chat/completions", b, 200);
    ck_assert_str_eq(sget(r, "object"), "chat.completion");
    ck_assert(!strncmp(sget(r, "id"), "chatcmpl-", 9));
    json_t *msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    ck_assert_str_eq(sget(msg, "role"), "assistant");
    ck_assert(json_is_string(json_object_get(msg, "content")));
    ck_assert(json_is_false(json_object_get(cc_of(r), "fallback")));
    ck_assert(json_is_true(json_object_get(seg_of(r, 1), "hit")));
    ck_assert(json_is_true(json_object_get(seg_of(r, 2), "hit")));
    ck_assert_int_eq(cached_of(r), (long long)(strlen(D1) + strlen(D2)));

    json_object_set_new(stream_body, "stream", json_true());
    sse s = {0};
    ck_assert_int_eq(sse_post(&s, gw.port, "/v1/chat/completions", stream_body), CURLE_OK);
    cg_buf text;
    cg_buf_init(&text, 0);
    int n = 0;
    for (int i = 0; i < s.n; i++) {
        json_t *j = sse_json(&s, i);
        if (!j) continue;
        ck_assert_str_eq(sget(j, "object"), "chat.completion.chunk");
        json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
        ck_assert(json_is_object(delta));
        if (n++ == 0) ck_assert_str_eq(sget(delta, "role"), "assistant");
        const char *t = sget(delta, "content");
        if (t) ck_assert_int_eq(cg_buf_append(&text, t, strlen(t)), CG_OK);
        json_decref(j);
    }
    ck_assert_int_gt(n, 1);
    ck_assert_str_eq(s.block[s.n - 1], "data: [DONE]");
    ck_assert_str_eq(text.data ? text.data : "", sget(msg, "content"));
    cg_buf_free(&text);
    sse_free(&s);
    json_decref(r);

    /* a chat without separators is passed through; without --backend a worker answers it
     * from a plain rendering, in the chat shape */
    r = gw_call("POST", "/v1/chat/completions",
                json_pack("{s:s, s:[{s:s, s:s}], s:i}", "model", MODEL, "messages", "role", "user",
                          "content", "Just a question.", "max_tokens", 3),
                200);
    ck_assert_str_eq(sget(r, "object"), "chat.completion");
    ck_assert(json_is_true(json_object_get(cc_of(r), "passthrough")));
    msg = json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message");
    ck_assert(json_is_string(json_object_get(msg, "content")));
    /* user: Just a question.\nassistant: */
    ck_assert_int_eq(iget(json_object_get(r, "usage"), "prompt_tokens"),
                     (long long)strlen("user: Just a question.\nassistant:") + 1);
    json_decref(r);
}
END_TEST

/* cache_salt changes every key: tenant B never hits tenant A's chunks. */
START_TEST(tenant_isolation)
{
    const char *doc = "Tenant document: the vault code rotates every Tuesday at noon.";
    char *p = rag("Tenant system.", doc, NULL, "When does it rotate?");
    json_t *a1 = complete(p, 1, "tenant-a", 200);
    ck_assert(json_is_false(json_object_get(seg_of(a1, 1), "hit")));
    json_t *a2 = complete(p, 1, "tenant-a", 200);
    ck_assert(json_is_true(json_object_get(seg_of(a2, 1), "hit")));
    json_t *b1 = complete(p, 1, "tenant-b", 200);
    json_t *n1 = complete(p, 1, NULL, 200);
    for (size_t i = 0; i < 2; i++) {
        ck_assert(json_is_false(json_object_get(seg_of(b1, i), "hit")));
        ck_assert(json_is_false(json_object_get(seg_of(n1, i), "hit")));
        ck_assert_str_ne(sget(seg_of(b1, i), "key"), sget(seg_of(a1, i), "key"));
        ck_assert_str_ne(sget(seg_of(n1, i), "key"), sget(seg_of(a1, i), "key"));
    }
    ck_assert_int_eq(cached_of(b1), 0);
    char ka[CG_KEY_HEX_LEN + 1];
    key_hex(doc, "tenant-a", ka);
    ck_assert_str_eq(sget(seg_of(a1, 1), "key"), ka);
    json_decref(a1);
    json_decref(a2);
    json_decref(b1);
    json_decref(n1);
    free(p);
}
END_TEST

/* ------------------------------------------------------------ tests: assemblies */

/* A client that leaves mid-stream: the upstream transfer is cancelled and the worker's
 * assembly is gone; and a backend that fails between assemble and completion: the assembly is
 * released at once (the worker's ttl is a minute), the client gets 502. */
START_TEST(disconnect_and_failure_release_assembly)
{
    double disc0 = metric(gw.port, "chunkgate_client_disconnects_total");
    char *p = rag(SYS_A, D1, D2, "Write a long answer.");
    sse s = {0};
    s.stop_after = 2;
    CURLcode rc = sse_post(&s, gw.port, "/v1/completions",
                           json_pack("{s:s, s:s, s:i, s:f, s:b}", "model", MODEL, "prompt", p,
                                     "max_tokens", 3000, "temperature", 0.0, "stream", 1));
    ck_assert_int_eq(rc, CURLE_WRITE_ERROR);
    sse_free(&s);
    int ok = 0;
    for (int i = 0; i < 500 && !ok; i++) {
        ok = metric(gw.port, "chunkgate_client_disconnects_total") == disc0 + 1 &&
             assemblies_live(wport[0]) == 0 && assemblies_live(wport[1]) == 0;
        if (!ok) sleep_ms(20);
    }
    ck_assert_msg(ok, "the disconnect was not seen or an assembly stayed live");

    /* A gateway whose backend is down: the worker assembles, the completion cannot be sent. */
    char wurl[64], dead[64];
    url_of(wport[0], wurl, sizeof wurl);
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d", free_port());
    proc g2;
    const char *extra[] = {"--worker", wurl, "--backend", dead, "--health-interval-ms",
                           "100",      NULL};
    ck_assert_int_eq(start_gateway(&g2, "gw-dead-backend", extra), 0);
    ck_assert(wait_health(g2.port, wurl, 1));
    double rel0 = metric(g2.port, "chunkgate_assembly_releases_total");
    json_t *e =
        call(g2.port, "POST", "/v1/completions",
             json_pack("{s:s, s:s, s:i}", "model", MODEL, "prompt", p, "max_tokens", 4), NULL, 502);
    assert_error(e, "upstream_unavailable");
    json_decref(e);
    ok = 0;
    for (int i = 0; i < 100 && !ok; i++) { /* 2 s, far below the 60 s ttl */
        ok = assemblies_live(wport[0]) == 0;
        if (!ok) sleep_ms(20);
    }
    ck_assert_msg(ok, "the assembly was not released");
    ck_assert_double_eq(metric(g2.port, "chunkgate_assembly_releases_total"), rel0 + 1);
    json_t *l = admin(g2.port, "GET", "/v1/chunks?limit=1000", NULL, 200);
    size_t placements = 0, i;
    json_t *c;
    json_array_foreach(json_object_get(l, "data"), i, c)
    {
        placements += json_array_size(json_object_get(c, "placements"));
    }
    json_decref(l);
    ck_assert_uint_gt(placements, 0);
    ck_assert_int_eq(stop_proc(&g2, SIGTERM), 0);
    /* restarted on the same index without that worker: its placements are forgotten */
    const char *extra2[] = {"--backend", dead, NULL};
    ck_assert_int_eq(start_gateway(&g2, "gw-dead-backend", extra2), 0);
    l = admin(g2.port, "GET", "/v1/chunks?limit=1000", NULL, 200);
    ck_assert_uint_gt(json_array_size(json_object_get(l, "data")), 0); /* the chunks stay */
    json_array_foreach(json_object_get(l, "data"), i, c)
    {
        ck_assert_uint_eq(json_array_size(json_object_get(c, "placements")), 0);
    }
    json_decref(l);
    ck_assert_int_eq(stop_proc(&g2, SIGTERM), 0);
    free(p);
}
END_TEST

/* ------------------------------------------------------------ tests: worker failures */

/* A worker that errors, times out, or is down: the request is served from the plain prompt
 * by the backend with fallback=true, and each failure is counted by kind. The gateway here
 * has one worker (w2) and worker 0 as a plain OpenAI backend. */
START_TEST(worker_failures_fall_back)
{
    char mdir_copy[300];
    snprintf(mdir_copy, sizeof mdir_copy, "%s", model_dir);
    proc w2;
    int p2 = free_port();
    const char *wextra[] = {"--max-assemblies", "1", NULL};
    ck_assert_int_eq(start_worker(&w2, mdir_copy, p2, "w2", wextra), 0);
    char u2[64], backend[64];
    url_of(p2, u2, sizeof u2);
    url_of(wport[0], backend, sizeof backend);
    proc g3;
    /* Slow health checks: the request path must find the failures itself. (Worker 0 as the
     * backend does not share w2's KV, so this gateway's main path is not exercised here.) */
    const char *extra[] = {"--worker",
                           u2,
                           "--backend",
                           backend,
                           "--worker-timeout-ms",
                           "1500",
                           "--health-interval-ms",
                           "600000",
                           NULL};
    ck_assert_int_eq(start_gateway(&g3, "gw-failures", extra), 0);
    ck_assert(wait_health(g3.port, u2, 1));
    json_t *wv = worker_view(g3.port, u2);
    char sync_path[96];
    snprintf(sync_path, sizeof sync_path, "/v1/workers/%lld/sync", iget(wv, "id"));
    json_decref(wv);
    char *p = rag("Failure system.", "Failure document: the bridge opens at dawn.", NULL,
                  "When does it open?");
    json_t *body = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", p, "max_tokens", 4,
                             "temperature", 0.0);
    json_t *r;

    /* erroring: w2 allows one live assembly and we hold it, so its assemble answers 503 */
    json_t *held = call(p2, "POST", "/v1/assemble",
                        json_pack("{s:[{s:s, s:s}, {s:s, s:s}]}", "segments", "role", "system",
                                  "text", "held", "role", "question", "text", "q"),
                        NULL, 200);
    r = call(g3.port, "POST", "/v1/completions", json_incref(body), NULL, 200);
    ck_assert(json_is_true(json_object_get(cc_of(r), "fallback")));
    ck_assert_str_eq(sget(cc_of(r), "fallback_reason"), "worker_error");
    ck_assert(json_is_null(json_object_get(cc_of(r), "worker")));
    ck_assert_ptr_nonnull(text_of(r));
    json_decref(r);
    ck_assert_double_eq(metric(g3.port, "chunkgate_worker_errors_total{kind=\"status\"}"), 1);
    char path[96];
    snprintf(path, sizeof path, "/v1/assemblies/%s", sget(held, "assembly_id"));
    json_decref(call(p2, "DELETE", path, NULL, NULL, 200));
    json_decref(held);

    /* timing out: a stopped worker accepts the connection and never answers */
    ck_assert_int_eq(kill(w2.pid, SIGSTOP), 0);
    double t0 = now_s();
    r = call(g3.port, "POST", "/v1/completions", json_incref(body), NULL, 200);
    ck_assert(json_is_true(json_object_get(cc_of(r), "fallback")));
    ck_assert_double_ge(now_s() - t0, 1.4);
    json_decref(r);
    ck_assert_double_eq(metric(g3.port, "chunkgate_worker_errors_total{kind=\"timeout\"}"), 1);
    /* a timeout takes it out of routing until a probe answers */
    json_t *down = worker_view(g3.port, u2);
    ck_assert(json_is_false(json_object_get(down, "healthy")));
    json_decref(down);
    kill(w2.pid, SIGCONT);
    json_decref(admin(g3.port, "POST", sync_path, NULL, 200));
    ck_assert(wait_health(g3.port, u2, 1));

    /* down: connection refused */
    ck_assert_int_eq(stop_proc(&w2, SIGKILL), 128 + SIGKILL);
    r = call(g3.port, "POST", "/v1/completions", json_incref(body), NULL, 200);
    ck_assert(json_is_true(json_object_get(cc_of(r), "fallback")));
    json_decref(r);
    ck_assert_double_eq(metric(g3.port, "chunkgate_worker_errors_total{kind=\"connect\"}"), 1);
    /* the worker is down now: the next request falls back without trying it */
    r = call(g3.port, "POST", "/v1/completions", json_incref(body), NULL, 200);
    ck_assert_str_eq(sget(cc_of(r), "fallback_reason"), "no_worker");
    json_decref(r);
    ck_assert_double_eq(metric(g3.port, "chunkgate_fallbacks_total"), 4);
    ck_assert_double_eq(
        metric(g3.port, "chunkgate_fallback_reasons_total{reason=\"worker_error\"}"), 3);
    json_decref(body);
    free(p);
    ck_assert_int_eq(stop_proc(&g3, SIGTERM), 0);
}
END_TEST

/* A worker killed mid-stream: the client gets an error event and the end of the stream, no
 * hang. Requests keep succeeding. When the worker comes back, reconciliation removes the
 * placements it lost; a stale placement found by a request is repaired and resynced. */
START_TEST(kill_restart_reconcile)
{
    char *p = rag(SYS_B, D1, D2, "Long answer please.");
    /* d1 and d2 live on the worker chosen in the first test */
    char k1[CG_KEY_HEX_LEN + 1];
    key_hex(D1, NULL, k1);
    json_t *probe = complete(p, 1, NULL, 200);
    const char *wurl_c = sget(cc_of(probe), "worker");
    char wurl[64];
    snprintf(wurl, sizeof wurl, "%s", wurl_c);
    json_decref(probe);
    int vi = worker_index(wurl), other = 1 - vi;
    long long vid = worker_id_of(wurl);
    ck_assert(placed(k1, vid));

    sse s = {0};
    s.kill_after = wk[vi].pid;
    double t0 = now_s();
    CURLcode rc = sse_post(&s, gw.port, "/v1/completions",
                           json_pack("{s:s, s:s, s:i, s:f, s:b}", "model", MODEL, "prompt", p,
                                     "max_tokens", 4000, "temperature", 0.0, "stream", 1));
    ck_assert_msg(rc == CURLE_OK, "curl: %s", curl_easy_strerror(rc));
    ck_assert_double_lt(now_s() - t0, 30);
    ck_assert_int_eq(s.status, 200);
    json_t *last = sse_json(&s, s.n - 1);
    ck_assert_msg(last && json_is_object(json_object_get(last, "error")),
                  "the stream did not end with an error event: %s", s.block[s.n - 1]);
    json_decref(last);
    for (int i = 0; i < s.n; i++)
        ck_assert_str_ne(s.block[i], "data: [DONE]");
    sse_free(&s);
    int st;
    waitpid(wk[vi].pid, &st, 0);
    wk[vi].pid = 0;

    /* requests keep succeeding: fallback to the other worker, or routed to it */
    for (int i = 0; i < 3; i++) {
        json_t *r = complete(p, 2, NULL, 200);
        json_t *cc = cc_of(r);
        ck_assert(json_is_true(json_object_get(cc, "fallback")) ||
                  worker_index(sget(cc, "worker")) == other);
        json_decref(r);
    }
    ck_assert(wait_health(gw.port, wurl, 0));
    ck_assert(placed(k1, vid)); /* the index does not know yet that the KV is gone */

    /* restart on the same port with an empty cache: reconciliation drops its placements */
    double syncs0 = metric(gw.port, "chunkgate_worker_syncs_total{result=\"ok\"}");
    ck_assert_int_eq(
        start_worker(&wk[vi], model_dir, wport[vi], vi ? "w1-again" : "w0-again", NULL), 0);
    ck_assert(wait_health(gw.port, wurl, 1));
    ck_assert_double_ge(metric(gw.port, "chunkgate_worker_syncs_total{result=\"ok\"}"), syncs0 + 1);
    ck_assert(!placed(k1, vid));

    /* a stale placement: the worker loses a chunk behind the gateway's back */
    const char *d3 = "Stale document three: the archive moved to the east wing in 2019.";
    const char *d4 = "Stale document four: visiting hours are nine to five on weekdays.";
    char *p3 = rag("Stale system.", d3, d4, "Where is the archive?");
    json_t *r = complete(p3, 1, NULL, 200);
    const char *vurl = sget(cc_of(r), "worker");
    int vport = port_of_url(vurl);
    long long v2 = worker_id_of(vurl);
    char k3[CG_KEY_HEX_LEN + 1], path[128];
    key_hex(d3, NULL, k3);
    ck_assert(placed(k3, v2));
    snprintf(path, sizeof path, "/v1/chunks/%s", k3);
    json_decref(call(vport, "DELETE", path, NULL, NULL, 200));
    double stale0 = metric(gw.port, "chunkgate_stale_placements_total");
    syncs0 = metric(gw.port, "chunkgate_worker_syncs_total{result=\"ok\"}");
    json_t *r2 = complete(p3, 1, NULL, 200);
    ck_assert_str_eq(sget(cc_of(r2), "worker"), vurl);               /* d4 still placed there */
    ck_assert(json_is_false(json_object_get(seg_of(r2, 1), "hit"))); /* recomputed */
    ck_assert(json_is_true(json_object_get(seg_of(r2, 2), "hit")));
    ck_assert_double_eq(metric(gw.port, "chunkgate_stale_placements_total"), stale0 + 1);
    int synced = 0;
    for (int i = 0; i < 250 && !synced; i++) {
        synced = metric(gw.port, "chunkgate_worker_syncs_total{result=\"ok\"}") >= syncs0 + 1;
        if (!synced) sleep_ms(20);
    }
    ck_assert_msg(synced, "no resync after a stale placement");
    ck_assert(placed(k3, v2)); /* stored again by the recompute */
    json_t *r3 = complete(p3, 1, NULL, 200);
    ck_assert(json_is_true(json_object_get(seg_of(r3, 1), "hit")));
    json_decref(r);
    json_decref(r2);
    json_decref(r3);
    free(p3);
    free(p);
}
END_TEST

/* ------------------------------------------------------------ tests: admin */

/* A worker of another model (same id, interleaved RoPE; or another model id) is refused. */
START_TEST(registration_mismatch_refused)
{
    struct {
        const char *flag, *value, *dir, *want;
    } cases[] = {{"--rope-style", "interleaved", "model-interleaved", "rope_style"},
                 {"--model-id", "other-tiny", "model-other", "model"}};
    for (size_t i = 0; i < 2; i++) {
        char dir[400], log[400];
        snprintf(dir, sizeof dir, "%s/%s", tmp_root, cases[i].dir);
        snprintf(log, sizeof log, "%s/gen-%zu.log", tmp_root, i);
        proc gen;
        const char *ga[] = {"generate-model", "--out", dir, cases[i].flag, cases[i].value, NULL};
        ck_assert_int_eq(spawn(&gen, WORKER_BIN, ga, log, NULL), 0);
        int st;
        waitpid(gen.pid, &st, 0);
        ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        proc w;
        char name[32], url[64];
        snprintf(name, sizeof name, "mismatch%zu", i);
        int port = free_port();
        ck_assert_int_eq(start_worker(&w, dir, port, name, NULL), 0);
        url_of(port, url, sizeof url);
        json_t *e = admin(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", url), 409);
        assert_error(e, "conflict");
        const char *m = sget(json_object_get(e, "error"), "message");
        ck_assert_msg(strstr(m, cases[i].want) != NULL, "message: %s", m);
        json_decref(e);
        json_t *view = worker_view(gw.port, url);
        ck_assert_ptr_null(view);
        /* at startup, a reachable incompatible --worker stops the gateway (exit 1) */
        if (i == 0) {
            char u0[64], gname[32];
            url_of(wport[0], u0, sizeof u0);
            snprintf(gname, sizeof gname, "gw-mismatch");
            const char *extra[] = {"--worker", u0, "--worker", url, NULL};
            proc g;
            ck_assert_int_eq(start_gateway(&g, gname, extra), -1);
            char *text = read_file(g.log);
            ck_assert_msg(strstr(text, "rope_style") != NULL, "log: %s", text);
            free(text);
        }
        stop_proc(&w, SIGTERM);
    }
    /* unreachable and malformed urls */
    char dead[64];
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d", free_port());
    json_t *e = admin(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", dead), 502);
    assert_error(e, "upstream_unavailable");
    json_decref(e);
    e = admin(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", "ftp://x"), 400);
    assert_error(e, "invalid_value");
    json_decref(e);
    e = admin(gw.port, "POST", "/v1/workers", json_pack("{s:i}", "url", 3), 400);
    json_decref(e);
}
END_TEST

/* GET|POST|DELETE /v1/workers with the admin token; registration syncs the inventory. */
START_TEST(admin_workers)
{
    proc w;
    int port = free_port();
    ck_assert_int_eq(start_worker(&w, model_dir, port, "w-admin", NULL), 0);
    char url[64], slash[80];
    url_of(port, url, sizeof url);
    /* it already holds a chunk: registration must sync it into the index */
    const char *doc = "Admin document: the library closes early on Fridays.";
    json_t *a = call(port, "POST", "/v1/assemble",
                     json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]}", "segments", "role",
                               "system", "text", "Admin system.", "role", "chunk", "text", doc,
                               "role", "question", "text", "When?"),
                     NULL, 200);
    char path[128];
    snprintf(path, sizeof path, "/v1/assemblies/%s", sget(a, "assembly_id"));
    json_decref(call(port, "DELETE", path, NULL, NULL, 200));
    json_decref(a);

    json_t *e = call(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", url), NULL, 401);
    assert_error(e, "invalid_api_key");
    json_decref(e);
    snprintf(slash, sizeof slash, "%s/v1/", url); /* normalised to the same worker */
    json_t *w1 = admin(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", slash), 201);
    ck_assert_str_eq(sget(w1, "url"), url);
    ck_assert(json_is_true(json_object_get(w1, "healthy")));
    ck_assert_str_eq(sget(w1, "model"), MODEL);
    ck_assert_int_eq(iget(w1, "synced_chunks"), 2);
    long long id = iget(w1, "id");
    char kd[CG_KEY_HEX_LEN + 1];
    key_hex(doc, NULL, kd);
    ck_assert(placed(kd, id));
    json_t *again = admin(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", url), 200);
    ck_assert_int_eq(iget(again, "id"), id);
    json_decref(again);
    json_t *l = admin(gw.port, "GET", "/v1/workers", NULL, 200);
    ck_assert_str_eq(sget(l, "object"), "list");
    ck_assert_uint_eq(json_array_size(json_object_get(l, "data")), 3);
    json_decref(l);
    snprintf(path, sizeof path, "/v1/workers/%lld", id);
    json_t *one = admin(gw.port, "GET", path, NULL, 200);
    ck_assert_str_eq(sget(one, "url"), url);
    ck_assert_str_eq(sget(json_object_get(one, "info"), "rope_style"), "half");
    json_decref(one);
    snprintf(path, sizeof path, "/v1/workers/%lld/sync", id);
    json_decref(admin(gw.port, "POST", path, NULL, 200));
    /* the new worker takes requests: its document routes there */
    char *p = rag("Another admin system.", doc, NULL, "Why?");
    json_t *r = complete(p, 1, NULL, 200);
    ck_assert_str_eq(sget(cc_of(r), "worker"), url);
    ck_assert(json_is_true(json_object_get(seg_of(r, 1), "hit")));
    json_decref(r);
    free(p);

    snprintf(path, sizeof path, "/v1/workers/%lld", id);
    json_t *d = admin(gw.port, "DELETE", path, NULL, 200);
    ck_assert(json_is_true(json_object_get(d, "deleted")));
    json_decref(d);
    ck_assert(!placed(kd, id));
    json_decref(admin(gw.port, "DELETE", path, NULL, 404));
    json_decref(admin(gw.port, "GET", path, NULL, 404));
    l = admin(gw.port, "GET", "/v1/workers", NULL, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(l, "data")), 2);
    json_decref(l);
    /* by url */
    json_decref(admin(gw.port, "POST", "/v1/workers", json_pack("{s:s}", "url", url), 201));
    char q[200];
    snprintf(q, sizeof q, "/v1/workers?url=%s", url);
    json_decref(admin(gw.port, "DELETE", q, NULL, 200));
    ck_assert_ptr_null(worker_view(gw.port, url));
    json_decref(w1);
    stop_proc(&w, SIGTERM);
}
END_TEST

/* Pinning: a request with a pinned chunk goes to the worker holding it even when another
 * worker holds more of the request; a pinned chunk cannot be deleted from the index. */
START_TEST(pinning)
{
    char u[2][64];
    for (int i = 0; i < 2; i++)
        url_of(wport[i], u[i], sizeof u[i]);
    const char *small = "Pin document: the tram runs every ten minutes.";
    const char *big1 = "Pin document big one: the museum's west gallery holds the maps from the "
                       "eighteenth century, restored in 2011 and lit since 2015.";
    const char *big2 = "Pin document big two: the east gallery shows photographs of the harbour "
                       "before the 1953 flood and after its rebuilding.";
    /* warm worker 0 with the small document, worker 1 with the two big ones, behind the
     * gateway's back, then sync both */
    for (int i = 0; i < 2; i++) {
        json_t *segs = json_pack("[{s:s, s:s}]", "role", "system", "text", "Pin warm.");
        if (i == 0) {
            json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "chunk", "text", small));
        } else {
            json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "chunk", "text", big1));
            json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "chunk", "text", big2));
        }
        json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "question", "text", "q"));
        json_t *a =
            call(wport[i], "POST", "/v1/assemble", json_pack("{s:o}", "segments", segs), NULL, 200);
        char path[128];
        snprintf(path, sizeof path, "/v1/assemblies/%s", sget(a, "assembly_id"));
        json_decref(call(wport[i], "DELETE", path, NULL, NULL, 200));
        json_decref(a);
        snprintf(path, sizeof path, "/v1/workers/%lld/sync", worker_id_of(u[i]));
        json_decref(admin(gw.port, "POST", path, NULL, 200));
    }
    size_t n = strlen(small) + strlen(big1) + strlen(big2) + 64;
    char *p = cg_malloc(n);
    snprintf(p, n, "Pin system. # # %s # # %s # # %s # # Which?", small, big1, big2);
    char ks[CG_KEY_HEX_LEN + 1], path[128];
    key_hex(small, NULL, ks);
    snprintf(path, sizeof path, "/v1/chunks/%s/pin", ks);
    /* an unknown chunk cannot be pinned */
    json_decref(
        admin(gw.port, "POST", "/v1/chunks/0123456789abcdef0123456789abcdef/pin", NULL, 404));
    json_t *c = admin(gw.port, "POST", path, NULL, 200);
    ck_assert(json_is_true(json_object_get(c, "pinned")));
    json_decref(c);
    json_t *r = complete(p, 1, NULL, 200);
    ck_assert_str_eq(sget(cc_of(r), "routing"), "pinned");
    ck_assert_str_eq(sget(cc_of(r), "worker"), u[0]);
    ck_assert(json_is_true(json_object_get(seg_of(r, 1), "hit")));
    json_decref(r);
    /* a pinned chunk stays in the index */
    snprintf(path, sizeof path, "/v1/chunks/%s", ks);
    json_t *e = admin(gw.port, "DELETE", path, NULL, 409);
    assert_error(e, "conflict");
    json_decref(e);
    snprintf(path, sizeof path, "/v1/chunks/%s/unpin", ks);
    c = admin(gw.port, "POST", path, NULL, 200);
    ck_assert(json_is_false(json_object_get(c, "pinned")));
    json_decref(c);
    /* unpinned: the worker with the most cached tokens wins */
    char *p2 = cg_malloc(n + 16);
    snprintf(p2, n + 16, "Pin system two. # # %s # # %s # # %s # # Which?", small, big1, big2);
    r = complete(p2, 1, NULL, 200);
    ck_assert_str_eq(sget(cc_of(r), "routing"), "hit");
    json_decref(r);
    snprintf(path, sizeof path, "/v1/chunks/%s", ks);
    json_decref(admin(gw.port, "DELETE", path, NULL, 200));
    free(p);
    free(p2);
}
END_TEST

START_TEST(operations_and_metrics)
{
    json_t *m = gw_call("GET", "/v1/models", NULL, 200);
    ck_assert_str_eq(sget(json_array_get(json_object_get(m, "data"), 0), "id"), MODEL);
    json_decref(m);
    json_t *ready = gw_call("GET", "/readyz", NULL, 200);
    ck_assert_str_eq(sget(json_object_get(ready, "checks"), "workers"), "ok");
    json_decref(ready);
    /* a request naming another model is served plain by a worker, which refuses the model */
    json_t *e =
        gw_call("POST", "/v1/completions",
                json_pack("{s:s, s:s}", "model", "no-such-model", "prompt", "s # # d # # q"), 404);
    assert_error(e, "model_not_found");
    json_decref(e);
    resp r;
    http_full(&r, gw.port, "GET", "/metrics", NULL, NULL);
    const char *series[] = {"chunkgate_workers 2",
                            "chunkgate_workers_healthy 2",
                            "chunkgate_routing_decisions_total{kind=\"hit\"}",
                            "chunkgate_routing_decisions_total{kind=\"least_loaded\"}",
                            "chunkgate_routing_decisions_total{kind=\"pinned\"}",
                            "chunkgate_fallback_reasons_total{reason=\"model\"}",
                            "chunkgate_worker_errors_total{kind=\"stream\"}",
                            "chunkgate_assemble_seconds_count",
                            "chunkgate_stale_placements_total"};
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++)
        ck_assert_msg(strstr(r.body.data, series[i]) != NULL, "missing %s", series[i]);
    for (int i = 0; i < 2; i++) {
        char s[160];
        snprintf(s, sizeof s, "chunkgate_worker_healthy{worker=\"http://127.0.0.1:%d\"}", wport[i]);
        ck_assert_double_eq(metric_in(r.body.data, s), 1);
        snprintf(s, sizeof s, "chunkgate_worker_in_flight{worker=\"http://127.0.0.1:%d\"}",
                 wport[i]);
        ck_assert_double_eq(metric_in(r.body.data, s), 0);
    }
    ck_assert_double_ge(metric_in(r.body.data, "chunkgate_routing_decisions_total{kind=\"hit\"}"),
                        10);
    ck_assert_double_ge(metric_in(r.body.data, "chunkgate_chunk_hits_total"), 10);
    ck_assert_double_ge(
        metric_in(r.body.data, "chunkgate_fallback_reasons_total{reason=\"model\"}"), 1);
    cg_buf_free(&r.body);
}
END_TEST

/* Last: SIGTERM stops the gateway cleanly (exit 0, index flushed) after all of the above. */
START_TEST(gateway_stops_cleanly)
{
    char log[600];
    snprintf(log, sizeof log, "%s", gw.log);
    ck_assert_int_eq(stop_proc(&gw, SIGTERM), 0);
    char *text = read_file(log);
    ck_assert_ptr_nonnull(strstr(text, "\"msg\":\"stopped\""));
    ck_assert_ptr_null(strstr(text, "still referenced"));
    free(text);
}
END_TEST

/* ------------------------------------------------------------ unit: routing rule */

START_TEST(route_rule)
{
    cg_route_kind k;
    ck_assert_int_eq(cg_route_pick(NULL, 0, 256, 50, 0, &k), -1);
    /* nothing cached: least loaded; equal load: the tie-break rotates with the key */
    cg_route_cand idle[3] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
    int seen[3] = {0, 0, 0};
    for (uint64_t t = 0; t < 3; t++) {
        int i = cg_route_pick(idle, 3, 256, 50, t, &k);
        ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
        seen[i]++;
    }
    ck_assert(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
    cg_route_cand load[3] = {{0, 3, 0, 0}, {0, 1, 0, 0}, {0, 2, 0, 0}};
    ck_assert_int_eq(cg_route_pick(load, 3, 256, 50, 0, &k), 1);
    /* cached tokens win... */
    cg_route_cand hit[3] = {{0, 0, 0, 0}, {500, 1, 0, 0}, {100, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(hit, 3, 256, 50, 0, &k), 1);
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    /* ...until the load penalty outweighs them */
    cg_route_cand busy[2] = {{0, 0, 0, 0}, {500, 2, 0, 0}};
    ck_assert_int_eq(cg_route_pick(busy, 2, 256, 50, 1, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
    ck_assert_int_eq(cg_route_pick(busy, 2, 100, 50, 0, &k), 1);
    /* a pinned holder wins over more cached tokens elsewhere */
    cg_route_cand pin[3] = {{50, 0, 1, 0}, {900, 0, 0, 0}, {0, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(pin, 3, 256, 50, 2, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_PINNED);
    /* shared remote tier: worth less than a local hit, more than a miss */
    cg_route_cand rem[2] = {{400, 0, 0, 0}, {0, 0, 0, 400}};
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 50, 1, &k), 0); /* idle holder wins */
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    rem[0].in_flight = 1; /* 400 - 256 = 144 < 200: the idle worker fetches instead */
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 50, 0, &k), 1);
    ck_assert_int_eq(k, CG_ROUTE_REMOTE);
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 30, 0, &k), 0); /* 120 < 144 */
    cg_route_cand rem_vs_cold[2] = {{0, 0, 0, 0}, {0, 1, 0, 600}};
    ck_assert_int_eq(cg_route_pick(rem_vs_cold, 2, 256, 50, 0, &k), 1); /* 300 - 256 > 0 */
    ck_assert_int_eq(k, CG_ROUTE_REMOTE);
    rem_vs_cold[1].in_flight = 2;
    ck_assert_int_eq(cg_route_pick(rem_vs_cold, 2, 256, 50, 1, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("e2e");
    TCase *unit = tcase_create("routing_rule");
    tcase_add_test(unit, route_rule);
    suite_add_tcase(s, unit);
    TCase *tc = tcase_create("gateway_and_workers");
    tcase_add_unchecked_fixture(tc, suite_setup, suite_teardown);
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, main_path_hits_on_same_worker);
    tcase_add_test(tc, misses_spread_and_documents_stick);
    tcase_add_test(tc, streaming_main_path);
    tcase_add_test(tc, chat_main_path);
    tcase_add_test(tc, tenant_isolation);
    tcase_add_test(tc, disconnect_and_failure_release_assembly);
    tcase_add_test(tc, worker_failures_fall_back);
    tcase_add_test(tc, kill_restart_reconcile);
    tcase_add_test(tc, registration_mismatch_refused);
    tcase_add_test(tc, admin_workers);
    tcase_add_test(tc, pinning);
    tcase_add_test(tc, operations_and_metrics);
    tcase_add_test(tc, gateway_stops_cleanly);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    /* One process: the tests share the gateway and workers and a later test sees the
     * processes an earlier one restarted. */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
