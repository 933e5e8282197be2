/* Integration suite of several gateways behind one load balancer (DESIGN §18), with real
 * processes on loopback: redis-server, two chunkgate-workers with --events, three chunkgate
 * gateways reading the events, and nginx (Debian nginx-light) spreading the clients over the
 * gateways round robin, as the README's "Running several gateways" deploys them.
 *   - a RAG workload of reordered documents under changing system prompts gets, through the
 *     three gateways, a chunk hit rate within 2 points of the same workload through one gateway
 *     (on fresh workers each time): every replica routes as well as a lone gateway would;
 *   - kill -9 of one gateway under load from several clients: every request still succeeds
 *     (nginx takes the others), and the gateway restarted on its data directory resumes the
 *     stream from its stored position, without a gap, and is exact;
 *   - a fourth gateway started with an empty index routes its first request to the worker that
 *     holds the request's chunks.
 * Exits 77 (skip) when redis-server or nginx is missing. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "tests/harness/harness.h"

#define SKIP_CODE 77
#define MODEL "chunkgate-tiny"
#define N_GW 3
#define N_DOCS 12
#define N_REQ 60 /* requests of the hit-rate workload */
#define CLIENTS 4
#define PER_CLIENT 12

static char g_model[600];
static char g_redis_server[512], g_nginx[512];

/* ---- the workload ---------------------------------------------------------------------------- */

static const char *const systems[] = {
    "You are a helpful assistant. Answer from the documents.",
    "Answer briefly, citing the document you used.",
    "You are the front desk of the city archive; be polite.",
};

/* Document d of the workload (its own words, about 60 tokens). Caller frees. */
static char *doc(int d)
{
    uint64_t st = 0xd0c0000u + (uint64_t)d;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "Archive note %d.", d);
    return th_words(300, prefix, &st);
}

/* Request i of the workload: a system prompt of three, three distinct documents of N_DOCS in
 * an order of their own, and a question. Deterministic in i. Caller frees. */
static char *workload_prompt(int i)
{
    uint64_t st = 0x5eedu + (uint64_t)i * 7919u;
    int d[3];
    for (int k = 0; k < 3; k++) {
        int again;
        do {
            d[k] = (int)(th_splitmix64(&st) % N_DOCS);
            again = 0;
            for (int j = 0; j < k; j++)
                again |= d[j] == d[k];
        } while (again);
    }
    char *t[3];
    for (int k = 0; k < 3; k++)
        t[k] = doc(d[k]);
    size_t n = strlen(t[0]) + strlen(t[1]) + strlen(t[2]) + 400;
    char *p = cg_malloc(n);
    snprintf(p, n, "%s # # %s # # %s # # %s # # Which note mentions item %d?",
             systems[th_splitmix64(&st) % 3], t[0], t[1], t[2], i);
    for (int k = 0; k < 3; k++)
        free(t[k]);
    return p;
}

/* POST /v1/completions of prompt through port: the HTTP status; the answer's chunk_cache in
 * *cc when 200 and cc is not NULL (new reference). */
static long complete_at(int port, const char *prompt, json_t **cc)
{
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens", 2,
                          "temperature", 0.0);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    th_resp r;
    th_http(&r, port, "POST", "/v1/completions", body, NULL, NULL);
    free(body);
    long status = r.status;
    if (cc) *cc = NULL;
    if (status == 200 && cc) {
        json_t *j = th_json(&r);
        *cc = json_incref(json_object_get(j, "chunk_cache"));
        json_decref(j);
    }
    th_resp_free(&r);
    return status;
}

/* Runs the workload through port; returns the chunk hit rate over every cacheable segment. */
static double run_workload(int port)
{
    int hits = 0, total = 0;
    for (int i = 0; i < N_REQ; i++) {
        char *p = workload_prompt(i);
        json_t *cc;
        long st = complete_at(port, p, &cc);
        ck_assert_msg(st == 200, "workload request %d: HTTP %ld", i, st);
        ck_assert(json_is_false(json_object_get(cc, "fallback")));
        size_t k;
        json_t *s;
        json_array_foreach(json_object_get(cc, "segments"), k, s)
        {
            total++;
            hits += json_is_true(json_object_get(s, "hit"));
        }
        json_decref(cc);
        free(p);
    }
    return (double)hits / total;
}

/* ---- processes ------------------------------------------------------------------------------- */

typedef struct farm {
    th_proc redis, w[2], g[N_GW + 1], lb;
    char redis_url[64], stream[48];
    int lb_port;
} farm;

/* Gateway i of f (data directory <tag>-g<i>-data, kept across restarts). */
static void start_gateway(farm *f, int i, const char *tag)
{
    char name[64];
    snprintf(name, sizeof name, "%s-g%d", tag, i);
    const char *ge[] = {"--worker",
                        f->w[0].url,
                        "--worker",
                        f->w[1].url,
                        "--events",
                        f->redis_url,
                        "--events-stream",
                        f->stream,
                        "--health-interval-ms",
                        "200",
                        NULL};
    ck_assert_msg(th_start_gateway(&f->g[i], CHUNKGATE_BIN, name, ge) == 0,
                  "gateway %s did not start; log in %s", name, th_root());
    for (int k = 0; k < 2; k++)
        ck_assert(th_wait_worker(f->g[i].port, NULL, f->w[k].url, 1));
}

/* nginx in the foreground on a free port, round robin over the first n gateways of f. A
 * gateway that refuses the connection or fails before answering is skipped, POST included
 * (non_idempotent): the request has not reached a worker's decoding then. */
static void start_lb(farm *f, int n, const char *tag)
{
    char dir[400], conf[480], text[4096], servers[1024] = "";
    snprintf(dir, sizeof dir, "%s/%s-nginx", th_root(), tag);
    mkdir(dir, 0777);
    chmod(dir, 0777); /* its workers run as nobody when the test runs as root */
    for (int i = 0; i < n; i++) {
        size_t l = strlen(servers);
        snprintf(servers + l, sizeof servers - l,
                 "    server 127.0.0.1:%d max_fails=1 fail_timeout=10s;\n", f->g[i].port);
    }
    f->lb_port = th_free_port();
    snprintf(text, sizeof text,
             "daemon off;\nworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log;\n"
             "events { worker_connections 512; }\n"
             "http {\n  access_log off;\n  client_body_temp_path %s/body;\n"
             "  proxy_temp_path %s/proxy;\n  fastcgi_temp_path %s/fastcgi;\n"
             "  uwsgi_temp_path %s/uwsgi;\n  scgi_temp_path %s/scgi;\n"
             "  upstream gateways {\n%s    keepalive 16;\n  }\n"
             "  server {\n    listen 127.0.0.1:%d;\n    location / {\n"
             "      proxy_pass http://gateways;\n      proxy_http_version 1.1;\n"
             "      proxy_set_header Connection \"\";\n      proxy_buffering off;\n"
             "      proxy_next_upstream error timeout non_idempotent;\n"
             "      proxy_connect_timeout 1s;\n"
             "      proxy_read_timeout 120s;\n    }\n  }\n}\n",
             dir, dir, dir, dir, dir, dir, dir, servers, f->lb_port);
    snprintf(conf, sizeof conf, "%s/nginx.conf", dir);
    ck_assert_int_eq(th_write_file(conf, text), 0);
    char log[64];
    snprintf(log, sizeof log, "%s-nginx.log", tag);
    const char *args[] = {"-p", dir, "-e", "stderr", "-c", conf, NULL};
    ck_assert_int_eq(th_spawn(&f->lb, g_nginx, args, NULL, log, NULL, 0), 0);
    ck_assert_msg(th_wait_healthz(f->lb_port), "nginx on %d did not come up; see %s/%s", f->lb_port,
                  th_root(), log);
}

/* Redis and two fresh workers with --events on stream <tag>:events. */
static void start_workers(farm *f, const char *tag)
{
    memset(f, 0, sizeof *f);
    th_redis_spawn(&f->redis, g_redis_server, th_free_port(), NULL);
    snprintf(f->redis_url, sizeof f->redis_url, "redis://127.0.0.1:%d", f->redis.port);
    snprintf(f->stream, sizeof f->stream, "%s:events", tag);
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s-w%d", tag, k);
        const char *we[] = {"--events", f->redis_url, "--events-stream", f->stream, NULL};
        ck_assert_msg(th_start_worker(&f->w[k], WORKER_BIN, g_model, 0, name, we) == 0,
                      "worker %s did not start; log in %s", name, th_root());
    }
}

static void stop_farm(farm *f)
{
    if (f->lb.pid) th_stop(&f->lb, SIGTERM);
    for (int i = 0; i <= N_GW; i++)
        if (f->g[i].pid) ck_assert_int_eq(th_stop(&f->g[i], SIGTERM), 0);
    for (int k = 0; k < 2; k++)
        ck_assert_int_eq(th_stop(&f->w[k], SIGTERM), 0);
    th_stop(&f->redis, SIGKILL);
}

/* ---- load while a gateway dies --------------------------------------------------------------- */

typedef struct client {
    int port, id;
    int sent, failed;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    for (int i = 0; i < PER_CLIENT; i++) {
        char *p = workload_prompt(1000 + c->id * PER_CLIENT + i);
        long st = complete_at(c->port, p, NULL);
        free(p);
        c->sent++;
        if (st != 200) c->failed++;
    }
    return NULL;
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* The same workload through one gateway and through three behind nginx, each time on fresh
 * workers: the hit rates agree within 2 points. */
START_TEST(hit_rate_of_three_matches_one)
{
    farm one;
    start_workers(&one, "one");
    start_gateway(&one, 0, "one");
    double r1 = run_workload(one.g[0].port);
    stop_farm(&one);

    farm three;
    start_workers(&three, "three");
    for (int i = 0; i < N_GW; i++)
        start_gateway(&three, i, "three");
    start_lb(&three, N_GW, "three");
    double r3 = run_workload(three.lb_port);
    /* every replica served part of it */
    for (int i = 0; i < N_GW; i++)
        ck_assert_double_gt(
            th_metric(three.g[i].port,
                      "chunkgate_requests_total{route=\"completions\",code=\"200\"}"),
            0);
    printf("hit rate: one gateway %.1f%%, three behind nginx %.1f%% (%d requests)\n", 100 * r1,
           100 * r3, N_REQ);
    ck_assert_msg(r1 > 0.5, "the workload reuses little even through one gateway: %.3f", r1);
    ck_assert_msg(r3 >= r1 - 0.02, "three gateways: hit rate %.3f, one gateway: %.3f", r3, r1);
    stop_farm(&three);
}
END_TEST

/* kill -9 of one gateway under load: nginx takes the others and no request fails; restarted
 * on its data directory, the gateway resumes the stream where it stopped (no gap) and places
 * what the workers hold; a fourth gateway with an empty index routes its first request to the
 * holder of its chunks. */
START_TEST(gateway_killed_under_load_and_a_new_one)
{
    farm f;
    start_workers(&f, "kill");
    for (int i = 0; i < N_GW; i++)
        start_gateway(&f, i, "kill");
    start_lb(&f, N_GW, "kill");
    for (int i = 0; i < 6; i++) { /* some chunks placed before the load */
        char *p = workload_prompt(i);
        ck_assert_int_eq(complete_at(f.lb_port, p, NULL), 200);
        free(p);
    }

    client c[CLIENTS];
    pthread_t th[CLIENTS];
    double t_load = th_now_s();
    for (int i = 0; i < CLIENTS; i++) {
        c[i] = (client){.port = f.lb_port, .id = i};
        ck_assert_int_eq(pthread_create(&th[i], NULL, client_main, &c[i]), 0);
    }
    th_sleep_ms(300);
    ck_assert_int_eq(kill(f.g[1].pid, SIGKILL), 0);
    double t_kill = th_now_s();
    int sent = 0, failed = 0;
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        sent += c[i].sent;
        failed += c[i].failed;
    }
    ck_assert_int_eq(th_stop(&f.g[1], SIGKILL), 128 + SIGKILL);
    printf("kill -9 of one gateway of three under %d clients: %d of %d requests failed "
           "(the gateway was killed %.2f s into the load)\n",
           CLIENTS, failed, sent, t_kill - t_load);
    ck_assert_int_eq(sent, CLIENTS * PER_CLIENT);
    ck_assert_msg(failed == 0, "%d requests failed after a gateway was killed", failed);

    /* restarted on the same data directory: it resumes from its stored stream position */
    start_gateway(&f, 1, "kill");
    char log[600];
    snprintf(log, sizeof log, "%s/kill-g1.log", th_root());
    ck_assert_msg(th_file_has(log, "chunk events: resuming"),
                  "the restarted gateway did not "
                  "resume the stream; see %s",
                  log);
    double gaps = th_metric(f.g[1].port, "chunkgate_events_gaps_total{kind=\"trimmed\"}");
    ck_assert_double_eq(gaps, 0);
    /* and routes like the others: the next request through it hits where the others would */
    char *p = workload_prompt(0);
    json_t *cc;
    ck_assert_int_eq(complete_at(f.g[1].port, p, &cc), 200);
    ck_assert_str_eq(th_sget(cc, "routing"), "hit");
    json_decref(cc);
    free(p);

    /* a fourth gateway, empty index: its first request goes to the holder */
    const char *fresh = "A fresh note: the reading room reopens on the first of March.";
    char prompt[400];
    snprintf(prompt, sizeof prompt, "%s # # %s # # When does it reopen?", systems[2], fresh);
    json_t *first;
    ck_assert_int_eq(complete_at(f.g[0].port, prompt, &first), 200);
    char holder[64];
    snprintf(holder, sizeof holder, "%s", th_sget(first, "worker"));
    json_decref(first);
    start_gateway(&f, N_GW, "kill");
    ck_assert_int_eq(complete_at(f.g[N_GW].port, prompt, &cc), 200);
    ck_assert_str_eq(th_sget(cc, "worker"), holder);
    ck_assert_str_eq(th_sget(cc, "routing"), "hit");
    size_t k;
    json_t *s;
    json_array_foreach(json_object_get(cc, "segments"), k, s)
        ck_assert(json_is_true(json_object_get(s, "hit")));
    json_decref(cc);
    stop_farm(&f);
}
END_TEST

int main(void)
{
    if (!th_need("redis-server", "redis-server", g_redis_server, sizeof g_redis_server))
        return SKIP_CODE;
    /* nginx lives in /usr/sbin, which a user's PATH may lack */
    if (access(strcpy(g_nginx, "/usr/sbin/nginx"), X_OK) != 0 &&
        !th_need("nginx", "nginx-light", g_nginx, sizeof g_nginx))
        return SKIP_CODE;
    if (th_init_with_model("replicas", WORKER_BIN, g_model, sizeof g_model) != 0) return 1;
    int failed = th_run_tests(
        "replicas", "replicas", 240,
        TH_TESTS(hit_rate_of_three_matches_one, gateway_killed_under_load_and_a_new_one));
    failed += th_logs_have_sanitizer_reports();
    th_cleanup(failed != 0);
    return failed ? 1 : 0;
}
