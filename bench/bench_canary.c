/* The quality canary's cost to live requests (DESIGN §15): warm streamed RAG requests (the
 * documents are pool hits placed in a new order each time, the question is new) against two
 * real chunkgate-worker processes in the same run, one with --canary-rate 0 and one with
 * --canary-rate 1 (every request is also computed with a plain causal forward, in the
 * background). Requests go one at a time, back to back, in blocks alternating A B B A, so a
 * drift of the machine's load hits both alike; after a block on the canary worker the bench
 * waits until its canary is idle, so the other worker's block runs on a quiet machine. TTFT =
 * the request sent to its first streamed token.
 *
 * usage: bench_canary [--requests N per block (10)] [--rounds R (3)] [--docs D (4)]
 *        [--doc-bytes B (1024)] [--max-tokens T (8)] [--canary-chunk ROWS (worker default)]
 *        [--model DIR] (the binaries come from the build tree; without --model the tiny model is
 *        generated) */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tests/harness/harness.h"

#define MAX_DOCS 16

static uint64_t rng_state = 42;

/* ---- one streamed request, timed to its first token ---- */

typedef struct timing {
    uint64_t t0, first;
} timing;

static size_t on_data(char *p, size_t sz, size_t n, void *ud)
{
    timing *t = ud;
    if (!t->first && memmem(p, sz * n, "data: {", 7)) t->first = cg_now_ns();
    return sz * n;
}

/* Seconds to the first token, or -1 on failure. */
static double ttft(int port, const char *body)
{
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", port);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    timing t = {cg_now_ns(), 0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK || status != 200 || !t.first) return -1;
    return (double)(t.first - t.t0) / 1e9;
}

/* The body of request i: the documents in a new order, a new question. */
static char *request(char *const *docs, int n_docs, const char *sys, int i, int max_tokens)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    cg_status st = cg_buf_printf(&b, "%s", sys);
    int shift = i % n_docs, rev = (i / n_docs) % 2;
    for (int d = 0; d < n_docs && st == CG_OK; d++) {
        int o = rev ? (n_docs - 1 - d + shift) % n_docs : (d + shift) % n_docs;
        st = cg_buf_printf(&b, " # # %s", docs[o]);
    }
    char q[96];
    snprintf(q, sizeof q, " # # Question %d: what changed in the valley, and who voted?", i);
    if (st == CG_OK) st = cg_buf_printf(&b, "%s", q);
    json_t *j = json_pack("{s:s, s:i, s:i, s:b}", "prompt", b.data, "max_tokens", max_tokens,
                          "temperature", 0, "stream", 1);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    cg_buf_free(&b);
    return text;
}

/* A series of port's /metrics, 0 when absent or unreadable (outside a test: no assertion). */
static double metric(int port, const char *series)
{
    th_resp r;
    th_http(&r, port, "GET", "/metrics", NULL, NULL, NULL);
    double v = r.status == 200 ? th_metric_in(r.body.data ? r.body.data : "", series) : -1;
    th_resp_free(&r);
    return v < 0 ? 0 : v;
}

int main(int argc, char **argv)
{
    int n_req = 10, rounds = 3, n_docs = 4, max_tokens = 8;
    size_t doc_bytes = 1024;
    const char *model = NULL, *chunk = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--requests"))
            n_req = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--docs"))
            n_docs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--doc-bytes"))
            doc_bytes = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-tokens"))
            max_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--canary-chunk"))
            chunk = argv[i + 1];
        else if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_canary [--requests N] [--rounds R] [--docs D] "
                            "[--doc-bytes B] [--max-tokens T] [--canary-chunk ROWS] "
                            "[--model DIR]\n");
            return 2;
        }
    }
    if (argc % 2 == 0 || n_req < 1 || rounds < 1 || n_docs < 2 || n_docs > MAX_DOCS) {
        fprintf(stderr, "bench_canary: bad arguments\n");
        return 2;
    }
    th_init("bench_canary", NULL);
    char model_dir[512];
    if (model) {
        snprintf(model_dir, sizeof model_dir, "%s", model);
    } else {
        snprintf(model_dir, sizeof model_dir, "%s/model", th_root());
        if (th_gen_model(WORKER_BIN, model_dir, NULL) != 0) return 1;
    }
    th_proc w[2];
    const char *names[2] = {"rate0", "rate1"};
    for (int k = 0; k < 2; k++) {
        const char *extra[8] = {"--canary-rate", k ? "1" : "0", "--pool-mb", "512"};
        int n = 4;
        if (chunk) extra[n++] = "--canary-chunk", extra[n++] = chunk;
        extra[n] = NULL;
        if (th_start_worker(&w[k], WORKER_BIN, model_dir, 0, names[k], extra) != 0) {
            fprintf(stderr, "bench_canary: worker %s did not start (see %s)\n", names[k],
                    th_root());
            return 1;
        }
    }
    char *docs[MAX_DOCS];
    for (int d = 0; d < n_docs; d++) {
        char pre[32];
        snprintf(pre, sizeof pre, "Document %d. ", d);
        docs[d] = th_words(doc_bytes, pre, &rng_state);
    }
    char *sys = th_words(256, "System: answer from the documents. ", &rng_state);
    /* warm both pools (and their KV buffers) */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 2; i++) {
            char *b = request(docs, n_docs, sys, 1000 + i, max_tokens);
            if (ttft(w[k].port, b) < 0) return 1;
            free(b);
        }
    for (int wait = 0; wait < 600 && metric(w[1].port, "chunkgate_worker_canary_queue") > 0; wait++)
        th_sleep_ms(100);
    double *t[2] = {cg_calloc((size_t)(n_req * rounds), sizeof(double)),
                    cg_calloc((size_t)(n_req * rounds), sizeof(double))};
    int n_t[2] = {0, 0}, seq = 0;
    const char *ok = "chunkgate_worker_canary_requests_total{kind=\"sampled\",result=\"ok\"}";
    const char *dropped =
        "chunkgate_worker_canary_requests_total{kind=\"sampled\",result=\"dropped\"}";
    double ok0 = metric(w[1].port, ok), dr0 = metric(w[1].port, dropped);
    for (int r = 0; r < rounds; r++)
        for (int kk = 0; kk < 2; kk++) {
            int k = r % 2 ? 1 - kk : kk;
            for (int i = 0; i < n_req; i++) {
                char *b = request(docs, n_docs, sys, seq++, max_tokens);
                double s = ttft(w[k].port, b);
                free(b);
                if (s < 0) {
                    fprintf(stderr, "bench_canary: a request to %s failed\n", names[k]);
                    return 1;
                }
                t[k][n_t[k]++] = s;
            }
            /* the canary worker's background work ends before the other block starts */
            if (k == 1) {
                uint64_t t0 = cg_now_ms();
                while (cg_now_ms() - t0 < 120000 &&
                       (metric(w[1].port, "chunkgate_worker_canary_queue") > 0 ||
                        metric(w[1].port, ok) + metric(w[1].port, dropped) - ok0 - dr0 <
                            (double)n_t[1]))
                    th_sleep_ms(50);
            }
        }
    double done = metric(w[1].port, ok) - ok0, drop = metric(w[1].port, dropped) - dr0;
    double stops = metric(w[1].port, "chunkgate_worker_background_interrupts_total");
    double pieces = metric(w[1].port, "chunkgate_worker_background_pieces_total");
    double p50[2], p90[2], mean[2];
    for (int k = 0; k < 2; k++) {
        mean[k] = 0;
        for (int i = 0; i < n_t[k]; i++)
            mean[k] += t[k][i] / n_t[k];
        p50[k] = th_percentile(t[k], (size_t)n_t[k], 0.5);
        p90[k] = th_percentile(t[k], (size_t)n_t[k], 0.9);
    }
    printf("workload: system 256 B, %d documents of %zu B (pool hits, new order each request), a "
           "new question; stream, max_tokens %d; %d rounds of %d requests per worker, one at a "
           "time\n\n",
           n_docs, doc_bytes, max_tokens, rounds, n_req);
    printf("| worker | requests | TTFT p50 (ms) | TTFT p90 (ms) | TTFT mean (ms) |\n"
           "|---|---|---|---|---|\n");
    for (int k = 0; k < 2; k++)
        printf("| --canary-rate %d | %d | %.1f | %.1f | %.1f |\n", k, n_t[k], p50[k] * 1e3,
               p90[k] * 1e3, mean[k] * 1e3);
    printf("\nTTFT canary 1 / canary 0: p50 %.2fx, p90 %.2fx, mean %.2fx (target p50 <= 1.3x)\n",
           p50[1] / p50[0], p90[1] / p90[0], mean[1] / mean[0]);
    printf("canary comparisons during the measured blocks: %.0f done, %.0f dropped (queue full); "
           "background pieces %.0f run, %.0f stopped for live requests\n",
           done, drop, pieces, stops);
    for (int k = 0; k < 2; k++)
        th_stop_clean(&w[k], names[k]);
    for (int d = 0; d < n_docs; d++)
        free(docs[d]);
    free(sys);
    free(t[0]);
    free(t[1]);
    th_cleanup(th_failures);
    return p50[1] / p50[0] <= 1.3 ? 0 : 3;
}
