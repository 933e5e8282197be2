/* Suite of the gateway's routing: the rule itself (cg_route_pick in server/workers.c: least
 * loaded when nothing is cached, with a tie-break that rotates with the key; cached tokens win
 * until the load penalty outweighs them; a pinned holder wins over everything; the load is the
 * gateway's own in-flight count plus what the worker reported beyond it), and, with real
 * workers and gateways on loopback, the reported load: a worker kept busy by gateway A is seen
 * as loaded by gateway B, which sent it nothing, so B routes cold requests elsewhere. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/workers.h"
#include "tests/harness/harness.h"

START_TEST(route_rule)
{
    cg_route_kind k;
    ck_assert_int_eq(cg_route_pick(NULL, 0, 256, 50, 0, &k), -1);
    /* nothing cached: least loaded; equal load: the tie-break rotates with the key */
    cg_route_cand idle[3] = {{0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}};
    int seen[3] = {0, 0, 0};
    for (uint64_t t = 0; t < 3; t++) {
        int i = cg_route_pick(idle, 3, 256, 50, t, &k);
        ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
        seen[i]++;
    }
    ck_assert(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
    cg_route_cand load[3] = {{0, 3, 0, 0, 0}, {0, 1, 0, 0, 0}, {0, 2, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(load, 3, 256, 50, 0, &k), 1);
    /* cached tokens win... */
    cg_route_cand hit[3] = {{0, 0, 0, 0, 0}, {500, 1, 0, 0, 0}, {100, 0, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(hit, 3, 256, 50, 0, &k), 1);
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    /* ...until the load penalty outweighs them */
    cg_route_cand busy[2] = {{0, 0, 0, 0, 0}, {500, 2, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(busy, 2, 256, 50, 1, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
    ck_assert_int_eq(cg_route_pick(busy, 2, 100, 50, 0, &k), 1);
    /* a pinned holder wins over more cached tokens elsewhere */
    cg_route_cand pin[3] = {{50, 0, 1, 0, 0}, {900, 0, 0, 0, 0}, {0, 0, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(pin, 3, 256, 50, 2, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_PINNED);
    /* shared remote tier: worth less than a local hit, more than a miss */
    cg_route_cand rem[2] = {{400, 0, 0, 0, 0}, {0, 0, 0, 400, 0}};
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 50, 1, &k), 0); /* idle holder wins */
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    rem[0].in_flight = 1; /* 400 - 256 = 144 < 200: the idle worker fetches instead */
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 50, 0, &k), 1);
    ck_assert_int_eq(k, CG_ROUTE_REMOTE);
    ck_assert_int_eq(cg_route_pick(rem, 2, 256, 30, 0, &k), 0); /* 120 < 144 */
    cg_route_cand rem_vs_cold[2] = {{0, 0, 0, 0, 0}, {0, 1, 0, 600, 0}};
    ck_assert_int_eq(cg_route_pick(rem_vs_cold, 2, 256, 50, 0, &k), 1); /* 300 - 256 > 0 */
    ck_assert_int_eq(k, CG_ROUTE_REMOTE);
    rem_vs_cold[1].in_flight = 2;
    ck_assert_int_eq(cg_route_pick(rem_vs_cold, 2, 256, 50, 1, &k), 0);
    ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
}
END_TEST

/* The load a worker reports beyond this gateway's own requests counts like requests in
 * flight from here. */
START_TEST(route_reported_load)
{
    cg_route_kind k;
    /* nothing in flight from here, but candidate 0 runs 3 sequences for other replicas: 1 wins,
     * whatever the tie-break says */
    cg_route_cand cold[2] = {{0, 0, 0, 0, 3}, {0, 0, 0, 0, 0}};
    for (uint64_t t = 0; t < 4; t++) {
        ck_assert_int_eq(cg_route_pick(cold, 2, 256, 50, t, &k), 1);
        ck_assert_int_eq(k, CG_ROUTE_LEAST_LOADED);
    }
    /* own and others' load add up: 2 + 1 = 3 against 0 + 2 = 2 */
    cg_route_cand both[2] = {{0, 2, 0, 0, 1}, {0, 0, 0, 0, 2}};
    ck_assert_int_eq(cg_route_load(&both[0]), 3);
    ck_assert_int_eq(cg_route_pick(both, 2, 256, 50, 0, &k), 1);
    both[1].others = 4;
    ck_assert_int_eq(cg_route_pick(both, 2, 256, 50, 1, &k), 0);
    /* others' load outweighs cached tokens as in-flight requests do */
    cg_route_cand hit[2] = {{0, 0, 0, 0, 0}, {500, 0, 0, 0, 2}};
    ck_assert_int_eq(cg_route_pick(hit, 2, 256, 50, 1, &k), 0); /* 500 - 512 < 0 */
    ck_assert_int_eq(cg_route_pick(hit, 2, 100, 50, 0, &k), 1); /* 500 - 200 > 0 */
    ck_assert_int_eq(k, CG_ROUTE_HIT);
    /* Two replicas, same index state: A has 3 requests on worker 0, B has 1 on worker 1, and
     * each learns the other's from the workers' reports. Both see loads 3 and 1 and pick
     * worker 1; on its own count alone B would pick worker 0, the one A keeps busy. */
    cg_route_cand seen_by_a[2] = {{0, 3, 0, 0, 0}, {0, 0, 0, 0, 1}};
    cg_route_cand seen_by_b[2] = {{0, 0, 0, 0, 3}, {0, 1, 0, 0, 0}};
    for (uint64_t t = 0; t < 4; t++) {
        ck_assert_int_eq(cg_route_pick(seen_by_a, 2, 256, 50, t, &k), 1);
        ck_assert_int_eq(cg_route_pick(seen_by_b, 2, 256, 50, t, &k), 1);
    }
    ck_assert_int_eq(cg_route_load(&seen_by_a[0]), cg_route_load(&seen_by_b[0]));
    ck_assert_int_eq(cg_route_load(&seen_by_a[1]), cg_route_load(&seen_by_b[1]));
    cg_route_cand own_only_b[2] = {{0, 0, 0, 0, 0}, {0, 1, 0, 0, 0}};
    ck_assert_int_eq(cg_route_pick(own_only_b, 2, 256, 50, 1, &k), 0);
}
END_TEST

/* ------------------------------------------------------------ real processes */

#define HOLD 3 /* streams gateway A keeps open on worker 0 */

static char model_dir[300];

/* The gateway's view of the worker at url: its JSON (new reference), asserted present. */
static json_t *worker_view(int gport, const char *url)
{
    json_t *found = th_worker_view(gport, NULL, url);
    ck_assert_msg(found != NULL, "gateway on %d does not list %s", gport, url);
    return found;
}

/* The worker's load as gateway gport sees it from the health checks: running + queued. */
static long long reported_load(int gport, const char *url)
{
    json_t *w = worker_view(gport, url);
    long long n = th_iget(w, "running") + th_iget(w, "queued");
    json_decref(w);
    return n;
}

typedef struct {
    int gport;
    const char *url;
    long long at_least, at_most;
} load_wait;

static int load_in_range(void *arg)
{
    load_wait *lw = arg;
    long long n = reported_load(lw->gport, lw->url);
    return n >= lw->at_least && n <= lw->at_most;
}

/* A streamed plain completion through the gateway at port by a client that never reads (a
 * small receive buffer): the gateway pauses its upstream, the worker parks the sequence, and
 * the request stays admitted there while the socket is open. Returns the socket. */
static int held_stream(int port)
{
    int fd = th_connect_small_rcvbuf(port);
    /* top logprobs make each event large, so the buffers on the way fill long before the end */
    char *b = th_dumps(json_pack("{s:s, s:s, s:i, s:f, s:b, s:i}", "model", "chunkgate-tiny",
                                 "prompt", "Plain prompt about the harbour", "max_tokens", 30000,
                                 "temperature", 0.0, "stream", 1, "logprobs", 20));
    th_send_post(fd, "/v1/completions", b);
    free(b);
    return fd;
}

/* A cold RAG request (a document no worker holds) through the gateway at port: the URL of the
 * worker it was routed to (caller frees). Asserts it was routed by load. */
static char *cold_request(int port, int i)
{
    char prompt[300];
    snprintf(prompt, sizeof prompt,
             "Load system. # # Load document %d: the tram stops at platform %d. # # Where?", i,
             3 + i);
    json_t *r = th_call(port, "POST", "/v1/completions",
                        json_pack("{s:s, s:s, s:i, s:f}", "model", "chunkgate-tiny", "prompt",
                                  prompt, "max_tokens", 1, "temperature", 0.0),
                        NULL, 200);
    json_t *cc = json_object_get(r, "chunk_cache");
    ck_assert_str_eq(th_sget(cc, "routing"), "least_loaded");
    ck_assert(json_is_false(json_object_get(cc, "fallback")));
    char *url = cg_strdup(th_sget(cc, "worker"));
    json_decref(r);
    return url;
}

/* Gateway A routes only to worker 0 and keeps HOLD streams open there. Gateway B routes to
 * both workers and has sent worker 0 nothing (its in_flight there is 0), yet it sees worker
 * 0's load through /healthz and sends every cold request to worker 1. Once the streams are
 * gone and worker 0 reports itself idle again, B's cold requests spread over both: the load,
 * not the keys, steered them. */
START_TEST(replica_sees_load_of_another)
{
    th_proc wk[2], ga, gb;
    const char *names[] = {"w0", "w1"};
    /* no stall cut while the test holds the streams */
    const char *wargs[] = {"--stream-stall-ms", "600000", NULL};
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(th_start_worker(&wk[i], WORKER_BIN, model_dir, 0, names[i], wargs), 0);
    const char *aargs[] = {"--health-interval-ms", "100", "--conn-timeout-s", "600", NULL};
    ck_assert_int_eq(th_start_gateway_to(&ga, CHUNKGATE_BIN, "ga", wk[0].url, NULL, aargs), 0);
    const char *bargs[] = {"--worker", wk[1].url, "--health-interval-ms", "100", NULL};
    ck_assert_int_eq(th_start_gateway_to(&gb, CHUNKGATE_BIN, "gb", wk[0].url, NULL, bargs), 0);
    ck_assert(th_wait_worker(gb.port, NULL, wk[1].url, 1));

    int fds[HOLD];
    for (int i = 0; i < HOLD; i++)
        fds[i] = held_stream(ga.port);
    /* B learns worker 0's load from its health checks (slow machines: up to a minute) */
    load_wait busy = {gb.port, wk[0].url, HOLD, 1 << 30};
    ck_assert_msg(th_wait_until(60000, 50, load_in_range, &busy),
                  "gateway B never saw the load gateway A put on worker 0 (it sees %lld)",
                  reported_load(gb.port, wk[0].url));
    json_t *v = worker_view(gb.port, wk[0].url);
    ck_assert_int_eq(th_iget(v, "in_flight"), 0); /* B itself sent it nothing */
    json_decref(v);

    for (int i = 0; i < 8; i++) {
        char *url = cold_request(gb.port, i);
        ck_assert_msg(!strcmp(url, wk[1].url), "cold request %d went to the busy worker %s", i,
                      url);
        free(url);
    }
    /* still held: the routing above saw the load, not a race with its end */
    ck_assert_int_ge(reported_load(gb.port, wk[0].url), HOLD);

    /* the clients leave; worker 0 reports itself idle to B, and cold requests spread again */
    for (int i = 0; i < HOLD; i++)
        close(fds[i]);
    load_wait idle = {gb.port, wk[0].url, 0, 0};
    ck_assert_msg(th_wait_until(60000, 50, load_in_range, &idle),
                  "worker 0 still reports %lld sequences after its clients left",
                  reported_load(gb.port, wk[0].url));
    int to0 = 0;
    for (int i = 8; i < 24; i++) {
        char *url = cold_request(gb.port, i);
        to0 += !strcmp(url, wk[0].url);
        free(url);
    }
    ck_assert_msg(to0 > 0, "no cold request went to the idle worker 0");

    ck_assert_int_eq(th_stop(&gb, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&ga, SIGTERM), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(th_stop(&wk[i], SIGTERM), 0);
}
END_TEST

/* The worker's load count, read straight from its /healthz. */
static long long worker_load(int port)
{
    json_t *h = th_call(port, "GET", "/healthz", NULL, NULL, 200);
    long long n = th_iget(h, "running") + th_iget(h, "queued");
    json_decref(h);
    return n;
}

/* A request the worker has answered is no load any more: it leaves its admission before the
 * answer goes out, so a health check read right after the answer (as a gateway's may be) never
 * counts it. Were it counted, a gateway would see phantom load from other replicas on an idle
 * worker until its next check, and route a cached request away from its chunks. The window is
 * small, so the test takes many answers of each kind. */
START_TEST(answered_request_is_no_load)
{
    th_proc w;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "w-answered", NULL), 0);
    int port = w.port;
    for (int i = 0; i < 150; i++) {
        json_t *r = th_call(port, "POST", "/v1/completions",
                            json_pack("{s:s, s:s, s:i, s:f}", "model", "chunkgate-tiny", "prompt",
                                      "Answered prompt", "max_tokens", 1, "temperature", 0.0),
                            NULL, 200);
        json_decref(r);
        ck_assert_msg(worker_load(port) == 0, "answered completion %d still counted as load", i);
        r = th_call(port, "POST", "/v1/assemble",
                    json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}]}", "model", "chunkgate-tiny",
                              "segments", "role", "system", "text", "Answered system.", "role",
                              "question", "text", "Where?"),
                    NULL, 200);
        ck_assert_msg(worker_load(port) == 0, "answered assembly %d still counted as load", i);
        char path[128];
        snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(r, "assembly_id"));
        json_decref(th_call(port, "DELETE", path, NULL, NULL, 200));
        json_decref(r);
    }
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

static void procs_setup(void)
{
    if (th_init_with_model("routing", WORKER_BIN, model_dir, sizeof model_dir) != 0) abort();
}

static void procs_teardown(void)
{
    th_cleanup(th_failures != 0);
}

int main(void)
{
    Suite *s = suite_create("routing");
    th_case(s, "routing_rule", 0, TH_TESTS(route_rule, route_reported_load));
    TCase *tc = th_case(s, "replicas", 300,
                        TH_TESTS(replica_sees_load_of_another, answered_request_is_no_load));
    tcase_add_unchecked_fixture(tc, procs_setup, procs_teardown);
    return th_run(s, CK_FORK_GETENV);
}
