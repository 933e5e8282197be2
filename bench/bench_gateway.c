/* Gateway overhead: the same warm RAG request (documents cached, max_tokens 1) sent through
 * chunkgate, and sent directly to the worker as the sequence the gateway performs (POST
 * /v1/assemble with keys, then POST /v1/completions with kv_transfer_params). Both run in the
 * same process, interleaved, against the same real chunkgate-worker; the baseline is the
 * direct sequence. Reports p50/p99 of each and of the paired difference, then requests/s
 * through the gateway and directly at 1 and 64 concurrent clients.
 *
 * usage: bench_gateway [--requests N (default 400)] [--seconds S per throughput run
 *        (default 5)] [--log-level L (gateway, default info)] [--doc-bytes B (default 1024)]
 * The binaries come from the build tree; a tiny model is generated into a temp directory. */
#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/key.h"
#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"
#define MAX_CLIENTS 64

/* ------------------------------------------------------------ HTTP */

typedef struct conn {
    CURL *e;
    struct curl_slist *h;
    cg_buf body;
    char url[256];
} conn;

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    conn *c = ud;
    return cg_buf_append(&c->body, d, sz * n) == CG_OK ? sz * n : 0;
}

static void conn_init(conn *c)
{
    memset(c, 0, sizeof *c);
    cg_buf_init_unbounded(&c->body);
    c->e = th_easy_json(on_write, c, 120, &c->h);
}

/* Prepares a POST on c (keep-alive: the handle keeps its connection). */
static void conn_post(conn *c, int port, const char *path, const char *body)
{
    snprintf(c->url, sizeof c->url, "http://127.0.0.1:%d%s", port, path);
    cg_buf_reset(&c->body);
    curl_easy_setopt(c->e, CURLOPT_URL, c->url);
    curl_easy_setopt(c->e, CURLOPT_POSTFIELDS, body);
}

static long conn_status(conn *c)
{
    long st = 0;
    curl_easy_getinfo(c->e, CURLINFO_RESPONSE_CODE, &st);
    return st;
}

static void conn_free(conn *c)
{
    curl_slist_free_all(c->h);
    curl_easy_cleanup(c->e);
    cg_buf_free(&c->body);
}

/* ------------------------------------------------------------ workload */

/* The options (see the top of the file). */
static struct {
    int requests;
    double seconds;
    const char *level;
    size_t doc_bytes;
} opt = {400, 5, "info", 1024};
static const th_opt OPTS[] = {{"--requests", TH_OPT_INT, &opt.requests},
                              {"--seconds", TH_OPT_DOUBLE, &opt.seconds},
                              {"--log-level", TH_OPT_STR, &opt.level},
                              {"--doc-bytes", TH_OPT_SIZE, &opt.doc_bytes}};

static char *gw_body, *assemble_body;
static int gw_port, w_port;

/* Word-like text of n bytes from its own seeded sequence. */
static char *make_text(size_t n, const char *prefix, uint64_t seed)
{
    return th_words(n, prefix, &seed);
}

static void make_workload(size_t doc_bytes)
{
    char *sys = make_text(200, "System: answer from the documents. ", 1);
    char *d1 = make_text(doc_bytes, "Document one. ", 2);
    char *d2 = make_text(doc_bytes, "Document two. ", 3);
    const char *q = "What changed in the valley records?";
    size_t n = strlen(sys) + strlen(d1) + strlen(d2) + strlen(q) + 32;
    char *prompt = cg_malloc(n);
    snprintf(prompt, n, "%s # # %s # # %s # # %s", sys, d1, d2, q);
    json_t *g = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens", 1,
                          "temperature", 0.0);
    gw_body = json_dumps(g, JSON_COMPACT);
    json_decref(g);
    /* The same sequence the gateway sends: segments with the keys it computes. */
    const char *texts[] = {sys, d1, d2, q};
    const char *roles[] = {"system", "chunk", "chunk", "question"};
    json_t *segs = json_array();
    for (int i = 0; i < 4; i++) {
        json_t *s = json_pack("{s:s, s:s}", "role", roles[i], "text", texts[i]);
        if (i < 3) {
            cg_key k = cg_key_compute(MODEL, strlen(MODEL), CG_MODE_STRICT, NULL, 0, NULL, texts[i],
                                      strlen(texts[i]));
            char hex[CG_KEY_HEX_LEN + 1];
            cg_key_hex(&k, hex);
            json_object_set_new(s, "key", json_string(hex));
        }
        json_array_append_new(segs, s);
    }
    json_t *a = json_pack("{s:s, s:s, s:o}", "model", MODEL, "mode", "strict", "segments", segs);
    assemble_body = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    free(sys);
    free(d1);
    free(d2);
    free(prompt);
}

/* The completion body for an assembly id (static buffer). */
static const char *complete_body(conn *assembled)
{
    static char buf[256];
    json_t *j = json_loadb(assembled->body.data, assembled->body.len, 0, NULL);
    const char *id = json_string_value(json_object_get(j, "assembly_id"));
    snprintf(buf, sizeof buf,
             "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"temperature\":0,"
             "\"kv_transfer_params\":{\"assembly_id\":\"%s\"}}",
             id ? id : "none");
    json_decref(j);
    return buf;
}

/* ------------------------------------------------------------ latency */

static double one_gateway(conn *c)
{
    conn_post(c, gw_port, "/v1/completions", gw_body);
    uint64_t t0 = cg_now_ns();
    CURLcode rc = curl_easy_perform(c->e);
    double us = (double)(cg_now_ns() - t0) / 1e3;
    if (rc != CURLE_OK || conn_status(c) != 200) {
        fprintf(stderr, "gateway request failed: %s %ld %.200s\n", curl_easy_strerror(rc),
                conn_status(c), c->body.data ? c->body.data : "");
        exit(1);
    }
    return us;
}

static double one_direct(conn *a, conn *b)
{
    uint64_t t0 = cg_now_ns();
    conn_post(a, w_port, "/v1/assemble", assemble_body);
    CURLcode rc = curl_easy_perform(a->e);
    if (rc != CURLE_OK || conn_status(a) != 200) {
        fprintf(stderr, "assemble failed: %.200s\n", a->body.data ? a->body.data : "");
        exit(1);
    }
    conn_post(b, w_port, "/v1/completions", complete_body(a));
    rc = curl_easy_perform(b->e);
    double us = (double)(cg_now_ns() - t0) / 1e3;
    if (rc != CURLE_OK || conn_status(b) != 200) {
        fprintf(stderr, "completion failed: %.200s\n", b->body.data ? b->body.data : "");
        exit(1);
    }
    return us;
}

/* ------------------------------------------------------------ throughput */

typedef struct client {
    conn a, b;
    int direct;
    int step; /* direct: 0 assemble, 1 completion */
    uint64_t t0;
} client;

/* Runs n clients back to back for seconds; returns requests/s and fills p50/p99 (ms). */
static double throughput(int n, int direct, double seconds, double *p50, double *p99)
{
    CURLM *m = curl_multi_init();
    client *cl = cg_calloc((size_t)n, sizeof *cl);
    size_t cap = 1 << 20, done = 0;
    double *lat = cg_malloc(cap * sizeof *lat);
    for (int i = 0; i < n; i++) {
        conn_init(&cl[i].a);
        conn_init(&cl[i].b);
        cl[i].direct = direct;
        curl_easy_setopt(cl[i].a.e, CURLOPT_PRIVATE, (char *)&cl[i]);
        curl_easy_setopt(cl[i].b.e, CURLOPT_PRIVATE, (char *)&cl[i]);
        cl[i].t0 = cg_now_ns();
        if (direct)
            conn_post(&cl[i].a, w_port, "/v1/assemble", assemble_body);
        else
            conn_post(&cl[i].a, gw_port, "/v1/completions", gw_body);
        curl_multi_add_handle(m, cl[i].a.e);
    }
    uint64_t start = cg_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    int running = n, failures = 0, active = n; /* handles added and not yet removed */
    while (running > 0) {
        curl_multi_perform(m, &running);
        CURL *e;
        CURLcode rc;
        client *c = NULL;
        while ((e = th_multi_done(m, &rc, (void **)&c))) {
            long st = 0;
            curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
            active--;
            if (rc != CURLE_OK || st != 200) failures++;
            uint64_t now = cg_now_ns();
            if (c->direct && c->step == 0) {
                c->step = 1;
                conn_post(&c->b, w_port, "/v1/completions", complete_body(&c->a));
                curl_multi_add_handle(m, c->b.e);
                active++;
                continue;
            }
            if (done < cap) lat[done++] = (double)(now - c->t0) / 1e6;
            if (now >= end) continue; /* this client stops */
            c->step = 0;
            c->t0 = now;
            if (c->direct)
                conn_post(&c->a, w_port, "/v1/assemble", assemble_body);
            else
                conn_post(&c->a, gw_port, "/v1/completions", gw_body);
            curl_multi_add_handle(m, c->a.e);
            active++;
        }
        if (active) curl_multi_poll(m, NULL, 0, 50, NULL);
        running = active;
    }
    double elapsed = (double)(cg_now_ns() - start) / 1e9;
    *p50 = th_percentile(lat, done, 0.5);
    *p99 = th_percentile(lat, done, 0.99);
    if (failures) fprintf(stderr, "  (%d failed requests)\n", failures);
    for (int i = 0; i < n; i++) {
        conn_free(&cl[i].a);
        conn_free(&cl[i].b);
    }
    free(cl);
    free(lat);
    curl_multi_cleanup(m);
    return (double)done / elapsed;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    /* unknown options are ignored, as before */
    (void)th_parse_opts(argc, argv, OPTS, CG_ARRAY_LEN(OPTS));
    if (opt.requests < 10) opt.requests = 10;
    setenv("OMP_WAIT_POLICY", "passive", 0);
    th_init("bench_gw", NULL);
    char model[300];
    th_proc w, gw;
    const char *wargs[] = {"--max-assemblies", "512", NULL};
    if (th_gen_model(WORKER_BIN, th_path(model, sizeof model, "model"), NULL) != 0 ||
        th_start_worker(&w, WORKER_BIN, model, 0, "worker", wargs) != 0 ||
        !th_wait_healthz(w.port)) {
        fprintf(stderr, "the worker did not start (logs in %s)\n", th_root());
        return 1;
    }
    /* On a port chosen here and waited for with /healthz: at --log-level warn the gateway does
     * not log the port it listens on. */
    char listen[64], gdata[300];
    int gport = th_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", gport);
    const char *gargs[] = {
        "--listen",    listen,       "--worker",
        w.url,         "--data-dir", th_path(gdata, sizeof gdata, "gateway-data"),
        "--log-level", opt.level,    NULL};
    if (th_spawn(&gw, CHUNKGATE_BIN, gargs, NULL, "gateway.log", NULL, 0) != 0 ||
        !th_wait_healthz(gport)) {
        fprintf(stderr, "the gateway did not start (logs in %s)\n", th_root());
        return 1;
    }
    w_port = w.port;
    gw_port = gport;
    th_sleep_ms(200); /* the worker's first health check and inventory sync */
    make_workload(opt.doc_bytes);

    conn g, a, b;
    conn_init(&g);
    conn_init(&a);
    conn_init(&b);
    for (int i = 0; i < 20; i++) { /* warm: documents cached, connections open */
        one_gateway(&g);
        one_direct(&a, &b);
    }
    double cpu0 = th_cpu_seconds(gw.pid);
    double *tg = cg_malloc((size_t)opt.requests * sizeof *tg);
    double *td = cg_malloc((size_t)opt.requests * sizeof *td);
    double *diff = cg_malloc((size_t)opt.requests * sizeof *diff);
    for (int i = 0; i < opt.requests; i++) {
        /* alternate the order so drift and caches favour neither */
        if (i & 1) {
            tg[i] = one_gateway(&g);
            td[i] = one_direct(&a, &b);
        } else {
            td[i] = one_direct(&a, &b);
            tg[i] = one_gateway(&g);
        }
        diff[i] = tg[i] - td[i];
    }
    double gw_cpu_us = (th_cpu_seconds(gw.pid) - cpu0) * 1e6 / opt.requests;
    json_t *check = json_loadb(g.body.data, g.body.len, 0, NULL);
    json_int_t cached = json_integer_value(
        json_object_get(json_object_get(json_object_get(check, "usage"), "prompt_tokens_details"),
                        "cached_tokens"));
    json_decref(check);
    printf("workload: system 200 B, 2 documents of %zu B (cached), question 35 B, max_tokens 1; "
           "cached_tokens per request %lld; gateway log level %s\n",
           opt.doc_bytes, (long long)cached, opt.level);
    printf("sequential latency, %d requests each, interleaved (microseconds):\n", opt.requests);
    double dg50 = th_percentile(td, (size_t)opt.requests, 0.5),
           dg99 = th_percentile(td, (size_t)opt.requests, 0.99);
    double gg50 = th_percentile(tg, (size_t)opt.requests, 0.5),
           gg99 = th_percentile(tg, (size_t)opt.requests, 0.99);
    double df50 = th_percentile(diff, (size_t)opt.requests, 0.5),
           df99 = th_percentile(diff, (size_t)opt.requests, 0.99);
    printf("  direct to worker (assemble + complete): p50 %8.0f  p99 %8.0f\n", dg50, dg99);
    printf("  through chunkgate                      : p50 %8.0f  p99 %8.0f\n", gg50, gg99);
    printf("  added by the gateway (paired diff)     : p50 %8.0f  p99 %8.0f   (p50 ratio %.3f)\n",
           df50, df99, gg50 / dg50);
    printf("  gateway CPU per request (user+sys, /proc): %.0f us\n", gw_cpu_us);
    conn_free(&g);
    conn_free(&a);
    conn_free(&b);
    free(tg);
    free(td);
    free(diff);

    printf("throughput, %.0f s per run (requests/s, latency ms):\n", opt.seconds);
    int conc[] = {1, 64};
    for (size_t i = 0; i < 2; i++) {
        double p50d, p99d, p50g, p99g;
        double rd = throughput(conc[i], 1, opt.seconds, &p50d, &p99d);
        double rg = throughput(conc[i], 0, opt.seconds, &p50g, &p99g);
        printf("  %2d clients: direct %7.1f req/s (p50 %6.2f p99 %6.2f)   gateway %7.1f req/s "
               "(p50 %6.2f p99 %6.2f)   gateway/direct %.3f\n",
               conc[i], rd, p50d, p99d, rg, p50g, p99g, rg / rd);
    }
    th_stop(&gw, SIGTERM);
    th_stop(&w, SIGTERM);
    free(gw_body);
    free(assemble_body);
    th_cleanup(0);
    return 0;
}
