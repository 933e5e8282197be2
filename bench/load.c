/* Load test: the real chunkgate in front of one real chunkgate-worker (the worker also answers
 * the completions), driven by a libcurl multi loop holding N keep-alive connections for S
 * seconds with a mix of requests:
 *   hit    a RAG prompt whose documents are cached (8 recurring document sets)   40%
 *   miss   a RAG prompt with a new document                                      15%
 *   stream a cached RAG prompt with "stream": true (must end with [DONE])        20%
 *   plain  a prompt without separator (pass-through)                             10%
 *   bad    invalid JSON, a missing field, or an unknown route (400/404 expected) 15%
 * Reports requests/s, p50/p99 per kind, errors (any other status, a curl error, a stream
 * without [DONE]; deliberate bad requests answered as expected are not errors), and the RSS and
 * open descriptors of both processes at the start and the end.
 *
 * usage: load [--seconds S (60)] [--conns N (64)] [--max-tokens T (4)] [--doc-bytes B (256)]
 * The binaries come from the build tree; a tiny model is generated into a temp directory. */
#include <curl/curl.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"
#define MAX_CONNS 1024
#define N_SETS 8

enum { K_HIT, K_MISS, K_STREAM, K_PLAIN, K_BAD, K_N };
static const char *KIND[K_N] = {"hit", "miss", "stream", "plain", "bad"};
static const int WEIGHT[K_N] = {40, 15, 20, 10, 15};

static int seconds = 60, conns = 64, max_tokens = 4, doc_bytes = 256;
static const th_opt OPTS[] = {{"--seconds", TH_OPT_INT, &seconds},
                              {"--conns", TH_OPT_INT, &conns},
                              {"--max-tokens", TH_OPT_INT, &max_tokens},
                              {"--doc-bytes", TH_OPT_INT, &doc_bytes}};

typedef struct usage {
    long rss_kib;
    int fds, threads;
} usage;

static usage usage_of(pid_t pid)
{
    usage u = {0, 0, 0};
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) u.rss_kib = atol(line + 6);
        if (!strncmp(line, "Threads:", 8)) u.threads = atoi(line + 8);
    }
    if (f) fclose(f);
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') u.fds++;
    if (d) closedir(d);
    return u;
}

/* ------------------------------------------------------------ requests */

static char *set_docs[N_SETS][2];
static unsigned long miss_seq;

static char *doc_text(const char *tag, unsigned long id)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    cg_status st = cg_buf_printf(&b, "Document %s-%lu.", tag, id);
    for (unsigned long i = 0; st == CG_OK && b.len < (size_t)doc_bytes; i++)
        st = cg_buf_printf(&b, " Record %lu of %s %lu notes item %lu.", i, tag, id, i * 31 + id);
    return b.data;
}

static char *rag_body(const char *d1, const char *d2, int stream)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    cg_status st = cg_buf_printf(&b,
                                 "{\"model\":\"" MODEL "\",\"max_tokens\":%d,\"temperature\":0,"
                                 "\"stream\":%s,\"prompt\":\"You are a load test. # # %s # # %s "
                                 "# # What is recorded?\"}",
                                 max_tokens, stream ? "true" : "false", d1, d2);
    (void)st;
    return b.data;
}

typedef struct conn {
    CURL *e;
    struct curl_slist *h;
    int kind;
    long expect[2];
    char *body;
    char url[128];
    cg_buf resp;
    double t0;
} conn;

static double *lat[K_N];
static size_t n_lat[K_N], cap_lat[K_N];
static long done_n[K_N], errors_n[K_N];
static int gw_port;

static size_t on_write(char *d, size_t sz, size_t n, void *ud)
{
    conn *c = ud;
    size_t len = sz * n;
    /* keep only the tail: enough to see [DONE] */
    if (c->resp.len > 4096) cg_buf_reset(&c->resp);
    return cg_buf_append(&c->resp, d, len) == CG_OK ? len : 0;
}

static int pick_kind(void)
{
    int r = rand() % 100, acc = 0;
    for (int k = 0; k < K_N; k++) {
        acc += WEIGHT[k];
        if (r < acc) return k;
    }
    return K_HIT;
}

static void start(CURLM *m, conn *c)
{
    free(c->body);
    c->body = NULL;
    cg_buf_reset(&c->resp);
    c->kind = pick_kind();
    const char *path = "/v1/completions";
    c->expect[0] = 200;
    c->expect[1] = 200;
    int s = rand() % N_SETS;
    switch (c->kind) {
    case K_HIT:
        c->body = rag_body(set_docs[s][0], set_docs[s][1], 0);
        break;
    case K_STREAM:
        c->body = rag_body(set_docs[s][0], set_docs[s][1], 1);
        break;
    case K_MISS: {
        char *d = doc_text("miss", ++miss_seq);
        c->body = rag_body(set_docs[s][0], d, 0);
        free(d);
        break;
    }
    case K_PLAIN: {
        cg_buf b;
        cg_buf_init_unbounded(&b);
        cg_status st = cg_buf_printf(&b,
                                     "{\"model\":\"" MODEL "\",\"max_tokens\":%d,\"prompt\":"
                                     "\"A plain question without documents %d?\"}",
                                     max_tokens, rand() % 1000);
        (void)st;
        c->body = b.data;
        break;
    }
    default: {
        int v = rand() % 3;
        if (v == 0) {
            c->body = cg_strdup("{\"model\":\"" MODEL "\",\"prompt\":\"broken # # json\"");
            c->expect[0] = c->expect[1] = 400;
        } else if (v == 1) {
            c->body = cg_strdup("{\"prompt\":\"no model # # here # # q\"}");
            c->expect[0] = c->expect[1] = 400;
        } else {
            c->body = cg_strdup("{}");
            path = "/v1/no-such-route";
            c->expect[0] = c->expect[1] = 404;
        }
    }
    }
    snprintf(c->url, sizeof c->url, "http://127.0.0.1:%d%s", gw_port, path);
    curl_easy_setopt(c->e, CURLOPT_URL, c->url);
    curl_easy_setopt(c->e, CURLOPT_POSTFIELDS, c->body);
    c->t0 = th_now_s();
    curl_multi_add_handle(m, c->e);
}

static void record(conn *c, CURLcode rc)
{
    double ms = (th_now_s() - c->t0) * 1e3;
    long status = 0;
    curl_easy_getinfo(c->e, CURLINFO_RESPONSE_CODE, &status);
    int ok = rc == CURLE_OK && (status == c->expect[0] || status == c->expect[1]);
    if (ok && c->kind == K_STREAM)
        ok = c->resp.len >= 14 && !memcmp(c->resp.data + c->resp.len - 14, "data: [DONE]\n\n", 14);
    int k = c->kind;
    done_n[k]++;
    if (!ok) {
        errors_n[k]++;
        if (errors_n[k] <= 3)
            fprintf(stderr, "error (%s): curl %d HTTP %ld: %.200s\n", KIND[k], (int)rc, status,
                    c->resp.data ? c->resp.data : "");
    }
    if (n_lat[k] == cap_lat[k]) {
        cap_lat[k] = cap_lat[k] ? cap_lat[k] * 2 : 4096;
        lat[k] = cg_realloc(lat[k], cap_lat[k] * sizeof *lat[k]);
    }
    lat[k][n_lat[k]++] = ms;
}

/* A blocking warm-up request (caches the document sets); returns the HTTP status. */
static long warm(const char *body)
{
    th_resp r;
    th_http(&r, gw_port, "POST", "/v1/completions", body, NULL, NULL);
    th_resp_free(&r);
    return r.status;
}

int main(int argc, char **argv)
{
    (void)th_parse_opts(argc, argv, OPTS, CG_ARRAY_LEN(OPTS)); /* unknown ones are ignored */
    if (conns < 1 || conns > MAX_CONNS) conns = 64;
    th_init("load", NULL);
    setenv("OMP_WAIT_POLICY", "passive", 0);
    char model[300];
    th_proc worker, gateway;
    const char *wa[] = {"--pool-mb", "256", "--max-assemblies", "256", NULL};
    if (th_gen_model(WORKER_BIN, th_path(model, sizeof model, "model"), NULL) != 0 ||
        th_start_worker(&worker, WORKER_BIN, model, 0, "worker", wa) != 0) {
        fprintf(stderr, "the worker did not start (logs in %s)\n", th_root());
        return 1;
    }
    /* Default configuration (log level info: one access line per request). */
    const char *gargs[] = {"--worker", worker.url, "--worker-timeout-ms", "120000", NULL};
    if (th_start_gateway(&gateway, CHUNKGATE_BIN, "gateway", gargs) != 0) {
        fprintf(stderr, "the gateway did not start (logs in %s)\n", th_root());
        return 1;
    }
    gw_port = gateway.port;
    /* the worker must be healthy before the main path is used */
    for (int i = 0; i < 200; i++) {
        char *b = rag_body("warm-up doc", "warm-up doc 2", 0);
        long s = warm(b);
        free(b);
        if (s == 200) break;
        th_sleep_ms(50);
    }
    srand(42);
    for (int s = 0; s < N_SETS; s++) {
        set_docs[s][0] = doc_text("set-a", (unsigned long)s);
        set_docs[s][1] = doc_text("set-b", (unsigned long)s);
        char *b = rag_body(set_docs[s][0], set_docs[s][1], 0);
        if (warm(b) != 200) fprintf(stderr, "warm-up of set %d failed\n", s);
        free(b);
    }
    usage g0 = usage_of(gateway.pid), w0 = usage_of(worker.pid);

    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)conns);
    conn *cs = cg_calloc((size_t)conns, sizeof *cs);
    for (int i = 0; i < conns; i++) {
        conn *c = &cs[i];
        cg_buf_init_unbounded(&c->resp);
        c->e = th_easy_json(on_write, c, 120, &c->h);
        curl_easy_setopt(c->e, CURLOPT_PRIVATE, c);
        start(m, c);
    }
    double t0 = th_now_s(), end = t0 + seconds, next_report = t0 + 10;
    int running = conns;
    usage gmax = g0, wmax = w0;
    while (running > 0) {
        curl_multi_perform(m, &running);
        CURLcode rc;
        conn *c;
        while (th_multi_done(m, &rc, (void **)&c)) {
            record(c, rc);
            if (th_now_s() < end) {
                start(m, c);
                running++;
            }
        }
        if (th_now_s() >= next_report) {
            usage g = usage_of(gateway.pid), w = usage_of(worker.pid);
            gmax.rss_kib = CG_MAX(gmax.rss_kib, g.rss_kib);
            gmax.fds = CG_MAX(gmax.fds, g.fds);
            wmax.rss_kib = CG_MAX(wmax.rss_kib, w.rss_kib);
            wmax.fds = CG_MAX(wmax.fds, w.fds);
            long total = 0;
            for (int k = 0; k < K_N; k++)
                total += done_n[k];
            fprintf(
                stderr,
                "%4.0f s: %ld requests; gateway RSS %ld KiB fds %d; worker RSS %ld KiB fds %d\n",
                th_now_s() - t0, total, g.rss_kib, g.fds, w.rss_kib, w.fds);
            next_report += 10;
        }
        curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    double elapsed = th_now_s() - t0;
    th_sleep_ms(500); /* let both settle: connections closed, assemblies released */
    for (int i = 0; i < conns; i++) {
        curl_easy_cleanup(cs[i].e);
        curl_slist_free_all(cs[i].h);
    }
    curl_multi_cleanup(m);
    th_sleep_ms(500);
    usage g1 = usage_of(gateway.pid), w1 = usage_of(worker.pid);

    long total = 0, errs = 0, bad_ok = 0;
    printf("load: chunkgate + 1 chunkgate-worker, %d connections, %.1f s, max_tokens %d, "
           "documents %d bytes\n",
           conns, elapsed, max_tokens, doc_bytes);
    printf("%8s %9s %8s %10s %10s %7s\n", "kind", "requests", "req/s", "p50 ms", "p99 ms",
           "errors");
    double *all = NULL;
    size_t n_all = 0;
    for (int k = 0; k < K_N; k++) {
        printf("%8s %9ld %8.1f %10.2f %10.2f %7ld\n", KIND[k], done_n[k], done_n[k] / elapsed,
               th_percentile(lat[k], n_lat[k], 0.5), th_percentile(lat[k], n_lat[k], 0.99),
               errors_n[k]);
        total += done_n[k];
        errs += errors_n[k];
        if (k == K_BAD) bad_ok = done_n[k] - errors_n[k];
        all = cg_realloc(all, (n_all + n_lat[k] + 1) * sizeof *all);
        memcpy(all + n_all, lat[k], n_lat[k] * sizeof *all);
        n_all += n_lat[k];
    }
    printf("%8s %9ld %8.1f %10.2f %10.2f %7ld\n", "all", total, total / elapsed,
           th_percentile(all, n_all, 0.5), th_percentile(all, n_all, 0.99), errs);
    printf("errors: %ld (deliberate bad requests answered 400/404 as expected: %ld, not errors)\n",
           errs, bad_ok);
    printf("gateway: RSS %ld -> %ld KiB (max %ld), open fds %d -> %d (max %d), threads %d -> %d\n",
           g0.rss_kib, g1.rss_kib, gmax.rss_kib, g0.fds, g1.fds, gmax.fds, g0.threads, g1.threads);
    printf("worker:  RSS %ld -> %ld KiB (max %ld), open fds %d -> %d (max %d), threads %d -> %d\n",
           w0.rss_kib, w1.rss_kib, wmax.rss_kib, w0.fds, w1.fds, wmax.fds, w0.threads, w1.threads);
    int gexit = th_stop(&gateway, SIGTERM);
    th_stop(&worker, SIGTERM);
    printf("gateway exit status after SIGTERM: %d\n", gexit);
    free(all);
    for (int k = 0; k < K_N; k++)
        free(lat[k]);
    for (int s = 0; s < N_SETS; s++) {
        free(set_docs[s][0]);
        free(set_docs[s][1]);
    }
    free(cs);
    th_cleanup(0);
    return errs ? 1 : 0;
}
