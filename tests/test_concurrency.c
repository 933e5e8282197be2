/* Concurrency suite with real processes (DESIGN §14): many requests at once through a real
 * chunkgate-worker and a real gateway. Concurrent answers equal the same requests run alone;
 * over --max-running + --max-queue the worker sheds with 429 + Retry-After and every other
 * request succeeds; the gateway sends a request a busy worker refused to another worker, and
 * passes the 429 on when all are busy; a client that disconnects frees its sequence; clients
 * that never read hold no place among --max-running and are cut after --stream-stall-ms; 64
 * clients for CG_SOAK_SECONDS (default 60) neither deadlock nor leak. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/harness/harness.h"

#define N_PROMPTS 8

static char model_dir[512];
static th_proc wk;    /* the main worker: --max-running 4 --max-queue 4 */
static th_proc tight; /* --max-running 1 --max-queue 1 */
static th_proc wk2;   /* a second worker for the gateway */
static th_proc gw;    /* gateway in front of tight and wk2 */

static const char *DOC[] = {
    "Document A. The harbour town exported dried cod and tar throughout the century.",
    "Document B. Annual rainfall in the valley averaged 812 millimetres between 1990 and 2020.",
    "Document C. The cooperative's bylaws were amended in March: members may vote by post.",
};

/* Prompt i: a plain prompt, or a "# #" RAG prompt over two documents. */
static char *prompt_of(int i)
{
    char *p = malloc(1024);
    if (i % 2)
        snprintf(p, 1024, "System %d. # # %s # # %s # # Question %d: what changed?", i, DOC[i % 3],
                 DOC[(i + 1) % 3], i);
    else
        snprintf(p, 1024, "Plain prompt number %d about %s", i, DOC[i % 3]);
    return p;
}

static char *body_of(int i, int max_tokens, int stream)
{
    char *p = prompt_of(i);
    json_t *b = json_pack("{s:s, s:i, s:f, s:b}", "prompt", p, "max_tokens", max_tokens,
                          "temperature", 0.0, "stream", stream);
    if (!stream) json_object_set_new(b, "model", json_string("chunkgate-tiny"));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    free(p);
    return s;
}

typedef struct call {
    int port, i, max_tokens;
    const char *path;
    th_resp r;
} call;

static void *do_call(void *arg)
{
    call *c = arg;
    char *b = body_of(c->i, c->max_tokens, 0);
    th_http(&c->r, c->port, "POST", c->path, b, NULL, NULL);
    free(b);
    return NULL;
}

static char *text_of(const th_resp *r)
{
    json_t *j = th_json(r);
    ck_assert_ptr_nonnull(j);
    const char *t = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    ck_assert_msg(t != NULL, "no choices[0].text: %.*s", (int)r->body.len, r->body.data);
    char *out = strdup(t);
    json_decref(j);
    return out;
}

/* Each request alone, then all at once: the same text (greedy, batch-invariant kernels). */
START_TEST(concurrent_equals_alone)
{
    char *alone[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        call c = {.port = wk.port, .i = i, .max_tokens = 24, .path = "/v1/completions"};
        do_call(&c);
        ck_assert_int_eq(c.r.status, 200);
        alone[i] = text_of(&c.r);
        th_resp_free(&c.r);
    }
    call cs[N_PROMPTS];
    pthread_t th[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        cs[i] = (call){
            .port = wk.port, .i = (i + 3) % N_PROMPTS, .max_tokens = 24, .path = "/v1/completions"};
        ck_assert_int_eq(pthread_create(&th[i], NULL, do_call, &cs[i]), 0);
    }
    for (int i = 0; i < N_PROMPTS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_PROMPTS; i++) {
        ck_assert_msg(cs[i].r.status == 200, "status %ld: %.200s", cs[i].r.status,
                      cs[i].r.body.data);
        char *t = text_of(&cs[i].r);
        ck_assert_str_eq(t, alone[cs[i].i]);
        free(t);
        th_resp_free(&cs[i].r);
    }
    for (int i = 0; i < N_PROMPTS; i++)
        free(alone[i]);
    ck_assert(th_metric(wk.port, "chunkgate_worker_decode_steps_total") <
              th_metric(wk.port, "chunkgate_worker_decode_rows_total"));
}
END_TEST

/* Beyond --max-running + --max-queue (2 here) the worker answers 429 with Retry-After at once,
 * in the OpenAI error shape; every other request succeeds. */
START_TEST(shedding)
{
    enum { N = 8 };
    call cs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        cs[i] = (call){.port = tight.port, .i = i, .max_tokens = 160, .path = "/v1/completions"};
        ck_assert_int_eq(pthread_create(&th[i], NULL, do_call, &cs[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    int ok = 0, shed = 0;
    for (int i = 0; i < N; i++) {
        if (cs[i].r.status == 200) {
            ok++;
        } else {
            ck_assert_msg(th_is_error(&cs[i].r, 429, "rate_limit_exceeded"), "status %ld: %.200s",
                          cs[i].r.status, cs[i].r.body.data);
            ck_assert_ptr_nonnull(strcasestr(cs[i].r.head.data, "Retry-After: 1"));
            shed++;
        }
        th_resp_free(&cs[i].r);
    }
    ck_assert_int_ge(ok, 2);
    ck_assert_int_ge(shed, 1);
    ck_assert_int_eq(ok + shed, N);
    ck_assert_double_eq(th_metric(tight.port, "chunkgate_worker_rate_limited_total"), shed);
    ck_assert_double_eq(th_metric(tight.port, "chunkgate_worker_requests_admitted"), 0);
}
END_TEST

/* Through the gateway: a RAG request that the routed worker refuses (429) goes to the other
 * worker; with every worker busy, the client gets the 429 with Retry-After. */
START_TEST(gateway_routes_around_busy)
{
    enum { N = 8 };
    double busy0 = th_metric(gw.port, "chunkgate_worker_busy_total");
    call cs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        cs[i] =
            (call){.port = gw.port, .i = 2 * i + 1, .max_tokens = 120, .path = "/v1/completions"};
        ck_assert_int_eq(pthread_create(&th[i], NULL, do_call, &cs[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    int ok = 0, shed = 0;
    for (int i = 0; i < N; i++) {
        if (cs[i].r.status == 200)
            ok++;
        else if (th_is_error(&cs[i].r, 429, "rate_limit_exceeded") &&
                 strcasestr(cs[i].r.head.data, "Retry-After"))
            shed++;
        else
            ck_abort_msg("status %ld: %.300s", cs[i].r.status, cs[i].r.body.data);
        th_resp_free(&cs[i].r);
    }
    ck_assert_int_eq(ok + shed, N);
    /* the tight worker takes 2; the others either went to wk2 or were refused by both */
    ck_assert_int_ge(ok, 3);
    ck_assert_double_gt(th_metric(gw.port, "chunkgate_worker_busy_total"), busy0);
}
END_TEST

/* Two gauges of the worker at port that must both fall to 0. */
typedef struct gauges {
    int port;
    const char *a, *b;
} gauges;

static int gauges_zero(void *arg)
{
    const gauges *g = arg;
    return th_metric(g->port, g->a) == 0 && th_metric(g->port, g->b) == 0;
}

/* Waits up to timeout_ms until series a and b of the worker at port are both 0; returns 1, or 0
 * on timeout. */
static int wait_zero(int port, const char *a, const char *b, int timeout_ms)
{
    gauges g = {port, a, b};
    return th_wait_until(timeout_ms, 50, gauges_zero, &g);
}

/* A streaming client that disconnects after a few events: its sequence leaves the batch at
 * the next step, and its assembly and requests are given back. */
START_TEST(disconnect_frees_sequence)
{
    int fd = th_connect(wk.port);
    ck_assert_int_ge(fd, 0);
    char *b = body_of(1, 2000, 1);
    th_send_post(fd, "/v1/completions", b);
    free(b);
    int closed = 0;
    char *got = th_recv(fd, 2000, 4096, &closed);
    ck_assert_ptr_nonnull(strstr(got, "data: "));
    free(got);
    ck_assert_double_eq(th_metric(wk.port, "chunkgate_worker_sequences_running"), 1);
    close(fd);
    ck_assert_msg(wait_zero(wk.port, "chunkgate_worker_sequences_running",
                            "chunkgate_worker_requests_admitted", 15000),
                  "the sequence of a client that left is still running");
    ck_assert_double_eq(th_metric(wk.port, "chunkgate_worker_assemblies_live"), 0);
    /* it stopped well before its 2000 tokens */
    ck_assert_double_lt(th_metric(wk.port, "chunkgate_worker_decode_tokens_total"), 1000);
}
END_TEST

/* A streaming client with a small receive buffer that never reads: connected to port, its
 * request sent; returns the socket. */
static int stalled_stream(int port, int max_tokens)
{
    int fd = th_connect_small_rcvbuf(port);
    /* top logprobs make each event large, so the socket buffers fill within seconds */
    json_t *j =
        json_pack("{s:s, s:i, s:f, s:b, s:i}", "prompt", "Plain prompt about the harbour",
                  "max_tokens", max_tokens, "temperature", 0.0, "stream", 1, "logprobs", 20);
    char *b = th_dumps(j);
    th_send_post(fd, "/v1/completions", b);
    free(b);
    return fd;
}

/* --max-running streaming clients that never read must not hold the running set: their
 * sequences are parked once they fall behind, a plain completion is served at once, and the
 * streams are cut after --stream-stall-ms without a read. */
START_TEST(slow_readers_hold_no_slot)
{
    enum { N = 2 };
    th_proc w;
    /* A small send buffer, as the clients' receive buffers are small: the streams fall behind
     * after some 650 tokens each rather than 1,400 at the default --sndbuf, which a sanitizer
     * build on a busy machine decodes in minutes. */
    const char *args[] = {"--max-running", "2",        "--max-queue", "8", "--stream-stall-ms",
                          "30000",         "--sndbuf", "16K",         NULL};
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "slow", args), 0);
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = stalled_stream(w.port, 30000);
    /* wait until their buffers are full: both are parked (or, where nothing parks them,
     * decoding has stopped for 3 s) */
    double last = -1;
    int still = 0, parked = 0;
    for (int t = 0; t < 1800 && still < 30 && !parked; t++) { /* sanitizer builds are slow */
        th_sleep_ms(100);
        double rows = th_counter(w.port, "chunkgate_worker_decode_rows_total");
        still = rows > 0 && rows == last ? still + 1 : 0;
        last = rows;
        parked = th_metric(w.port, "chunkgate_worker_sequences_parked") == N;
    }
    ck_assert_msg(parked || still >= 30, "the stalled streams kept decoding");
    /* a plain completion is served while the slow readers are still connected */
    char *b = body_of(2, 8, 0);
    th_resp r;
    th_send(&r, w.port, &(th_req){.path = "/v1/completions", .body = b, .timeout_s = 20});
    free(b);
    ck_assert_msg(r.status == 200, "a completion behind %d slow readers: status %ld (curl %d)", N,
                  r.status, (int)r.rc);
    th_resp_free(&r);
    ck_assert_double_eq(th_metric(w.port, "chunkgate_worker_sequences_parked"), N);
    ck_assert_double_eq(th_metric(w.port, "chunkgate_worker_sequences_running"), 0);
    /* without a read for --stream-stall-ms the streams are cut and everything is freed */
    ck_assert_msg(wait_zero(w.port, "chunkgate_worker_requests_admitted",
                            "chunkgate_worker_sequences_parked", 90000),
                  "stalled streams still admitted after the stall timeout");
    ck_assert_double_eq(th_counter(w.port, "chunkgate_worker_stream_stalls_total"), N);
    for (int i = 0; i < N; i++) {
        int closed = 0;
        char *got = th_recv(fds[i], 10000, 64u << 20, &closed);
        ck_assert_msg(closed, "a cut stream's connection is still open");
        free(got);
        close(fds[i]);
    }
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* /tokenize and /detokenize are admitted like completions: with the worker's one place
 * (--max-running 1 --max-queue 0) held by a stream, both are answered 429 at once; once the
 * stream's client has left they are served again. */
START_TEST(tokenize_is_admitted)
{
    th_proc w;
    const char *args[] = {"--max-running", "1", "--max-queue", "0", NULL};
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "admit", args), 0);
    int fd = stalled_stream(w.port, 30000);
    int held = 0;
    for (int t = 0; t < 200 && !held; t++) {
        held = th_metric(w.port, "chunkgate_worker_requests_admitted") == 1;
        if (!held) th_sleep_ms(20);
    }
    ck_assert(held);
    const char *tok = "{\"prompt\":\"hello\"}", *detok = "{\"tokens\":[104,105]}";
    th_resp r;
    th_http(&r, w.port, "POST", "/tokenize", tok, NULL, NULL);
    th_assert_error(&r, 429, "rate_limit_exceeded", NULL);
    th_resp_free(&r);
    th_http(&r, w.port, "POST", "/detokenize", detok, NULL, NULL);
    th_assert_error(&r, 429, "rate_limit_exceeded", NULL);
    th_resp_free(&r);
    close(fd);
    int freed = 0;
    for (int t = 0; t < 300 && !freed; t++) {
        freed = th_metric(w.port, "chunkgate_worker_requests_admitted") == 0;
        if (!freed) th_sleep_ms(50);
    }
    ck_assert(freed);
    json_decref(th_call_text(w.port, "POST", "/tokenize", tok, NULL, 200));
    json_decref(th_call_text(w.port, "POST", "/detokenize", detok, NULL, 200));
    ck_assert_double_eq(th_metric(w.port, "chunkgate_worker_requests_admitted"), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* 64 clients for CG_SOAK_SECONDS through the gateway: every answer is 200 or a clean 429;
 * nothing hangs; afterwards nothing is running or admitted. */
typedef struct soak {
    int id;
    double until;
    int ok, shed, bad;
} soak;

static void *soak_main(void *arg)
{
    soak *s = arg;
    for (int k = 0; th_now_s() < s->until; k++) {
        call c = {.port = gw.port,
                  .i = (s->id + k) % 6,
                  .max_tokens = 8 + (s->id % 8),
                  .path = "/v1/completions"};
        do_call(&c);
        if (c.r.status == 200)
            s->ok++;
        else if (th_is_error(&c.r, 429, "rate_limit_exceeded"))
            s->shed++, th_sleep_ms(20);
        else
            s->bad++, fprintf(stderr, "soak: status %ld rc %d: %.200s\n", c.r.status, (int)c.r.rc,
                              c.r.body.data ? c.r.body.data : "");
        th_resp_free(&c.r);
    }
    return NULL;
}

START_TEST(soak_64_clients)
{
    enum { N = 64 };
    const char *env = getenv("CG_SOAK_SECONDS");
    double secs = env ? atof(env) : 60.0;
    soak s[N];
    pthread_t th[N];
    double until = th_now_s() + secs;
    for (int i = 0; i < N; i++) {
        s[i] = (soak){.id = i, .until = until};
        ck_assert_int_eq(pthread_create(&th[i], NULL, soak_main, &s[i]), 0);
    }
    int ok = 0, shed = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        ok += s[i].ok, shed += s[i].shed, bad += s[i].bad;
    }
    fprintf(stderr, "soak: %.0f s, 64 clients: %d ok, %d shed (429), %d bad\n", secs, ok, shed,
            bad);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_gt(ok, N);
    th_proc *ws[] = {&tight, &wk2};
    for (int i = 0; i < 2; i++) {
        int idle = 0;
        for (int t = 0; t < 100 && !idle; t++) {
            idle = th_metric(ws[i]->port, "chunkgate_worker_requests_admitted") == 0 &&
                   th_metric(ws[i]->port, "chunkgate_worker_sequences_running") == 0;
            if (!idle) th_sleep_ms(50);
        }
        ck_assert_msg(idle, "worker %d still busy after the soak", i);
    }
    th_resp h;
    th_http(&h, gw.port, "GET", "/healthz", NULL, NULL, NULL);
    ck_assert_int_eq(h.status, 200);
    th_resp_free(&h);
}
END_TEST

int main(void)
{
    th_init("concurrency", NULL);
    snprintf(model_dir, sizeof model_dir, "%s/model", th_root());
    int failed = 1;
    char gwa[128], gwb[128];
    const char *main_args[] = {"--max-running", "4", "--max-queue", "4", NULL};
    const char *tight_args[] = {"--max-running", "1", "--max-queue", "1", NULL};
    const char *wk2_args[] = {"--max-running", "4", "--max-queue", "12", NULL};
    if (th_gen_model(WORKER_BIN, model_dir, NULL) != 0 ||
        th_start_worker(&wk, WORKER_BIN, model_dir, 0, "worker", main_args) != 0 ||
        th_start_worker(&tight, WORKER_BIN, model_dir, 0, "tight", tight_args) != 0 ||
        th_start_worker(&wk2, WORKER_BIN, model_dir, 0, "worker2", wk2_args) != 0) {
        fprintf(stderr, "a worker did not start; logs in %s\n", th_root());
        goto out;
    }
    snprintf(gwa, sizeof gwa, "http://127.0.0.1:%d", tight.port);
    snprintf(gwb, sizeof gwb, "http://127.0.0.1:%d", wk2.port);
    const char *gw_args[] = {"--worker", gwa, "--worker", gwb, "--health-interval-ms", "200", NULL};
    if (th_start_gateway(&gw, CHUNKGATE_BIN, "gateway", gw_args) != 0 ||
        !th_wait_worker(gw.port, NULL, gwa, 1) || !th_wait_worker(gw.port, NULL, gwb, 1)) {
        fprintf(stderr, "the gateway did not start; logs in %s\n", th_root());
        goto out;
    }
    failed = th_run_suite("concurrency", "processes", 400, (th_fixture){0}, CK_NOFORK,
                          TH_TESTS(concurrent_equals_alone, shedding, gateway_routes_around_busy,
                                   disconnect_frees_sequence, slow_readers_hold_no_slot,
                                   tokenize_is_admitted, soak_64_clients));
out:
    th_stop_clean(&gw, "chunkgate");
    th_stop_clean(&wk, "worker");
    th_stop_clean(&tight, "tight worker");
    th_stop_clean(&wk2, "worker2");
    failed += th_failures;
    th_cleanup(failed != 0);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
