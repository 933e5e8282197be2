/* Integration suite for the workers' chunk events and the gateways that read them (DESIGN §18),
 * with real processes on loopback: redis-server, one chunkgate-worker with a small RAM pool (2 MiB)
 * and
 * --events, and two chunkgate gateways with --events (inventory resyncs only when asked, so
 * what a gateway knows beyond its start it learns from the events).
 *   - a chunk stored through gateway A is placed in gateway B's index too; a chunk the worker
 *     evicts leaves both indexes (B served no request: it learns it from the stream only). The
 *     lag from the worker's eviction to B's index is printed (and bounded loosely: 2 s);
 *   - a gateway stopped while the stream is trimmed below its position resumes on restart,
 *     counts the gap, resyncs the worker's inventory and is exact; a new gateway is exact from
 *     the inventory plus the stream's tail, without a resync;
 *   - Redis stopped: requests keep succeeding through the gateway, the worker and the gateways
 *     count their errors, and once Redis is back the gateways catch up (exact again);
 *   - events the worker dropped (its queue full while Redis was paused) and a worker restart (a
 *     new epoch) are gaps that resync it: gateway B is exact after each;
 *   - with a disk tier, a chunk RAM cannot keep (written by the disk write-behind) is placed on
 *     disk in gateway B, and spilled chunks stay placed;
 *   - on a Redis Cluster (redis+cluster://, made by tests/redis_cluster.sh when redis-cli is
 *     installed) the events reach gateway B the same way.
 * Exits 77 (skip) when redis-server is missing. */
#include <check.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/chunkevent.h"
#include "tests/harness/harness.h"

#define SKIP_CODE 77
#define MODEL "chunkgate-tiny"
#define STREAM "chunkgate:events"
#define MAX_KEYS 4096

static char g_model[600];
static char g_redis_server[512];

/* ---- Redis ---------------------------------------------------------------------------------- */

static void start_redis(th_proc *p, int port)
{
    th_redis_spawn(p, g_redis_server, port, NULL);
}

/* One chunk event as the test reads it back from the stream. */
typedef struct tev {
    char id[48], op[16], key[33], tier[8];
    uint64_t ts;
} tev;

/* The events after stream id *after (updated), at most cap, into v; returns how many. */
static int read_events(int port, char *after, tev *v, int cap)
{
    redisContext *c = th_redis_connect(port);
    ck_assert(c && !c->err);
    redisReply *r = redisCommand(c, "XRANGE %s (%s + COUNT %d", STREAM, after, cap);
    ck_assert(r && r->type == REDIS_REPLY_ARRAY);
    int n = 0;
    for (size_t i = 0; i < r->elements && n < cap; i++) {
        redisReply *e = r->element[i], *f = e->element[1];
        tev *t = &v[n++];
        memset(t, 0, sizeof *t);
        snprintf(t->id, sizeof t->id, "%s", e->element[0]->str);
        for (size_t k = 0; k + 1 < f->elements; k += 2) {
            const char *name = f->element[k]->str, *val = f->element[k + 1]->str;
            if (!strcmp(name, "op")) snprintf(t->op, sizeof t->op, "%s", val);
            if (!strcmp(name, "k")) snprintf(t->key, sizeof t->key, "%s", val);
            if (!strcmp(name, "t")) snprintf(t->tier, sizeof t->tier, "%s", val);
            if (!strcmp(name, "ts")) t->ts = strtoull(val, NULL, 10);
        }
        snprintf(after, 48, "%s", t->id);
    }
    freeReplyObject(r);
    redisFree(c);
    return n;
}

/* ---- processes ------------------------------------------------------------------------------ */

typedef struct setup {
    th_proc redis, w, ga, gb;
    char redis_url[64], wurl[64];
} setup;

static void start_gateway(setup *s, th_proc *g, const char *name)
{
    const char *ge[] = {"--worker",           s->wurl, "--events", s->redis_url,
                        "--sync-interval-ms", "0",     NULL};
    ck_assert_msg(th_start_gateway(g, CHUNKGATE_BIN, name, ge) == 0, "gateway %s did not start",
                  name);
    ck_assert(th_wait_worker(g->port, NULL, s->wurl, 1));
}

/* Redis, a worker with a 2 MiB pool (chunks are evicted after a few requests) and --events,
 * and gateways A and B reading the events. */
static void start_all_q(setup *s, const char *tag, const char *queue)
{
    memset(s, 0, sizeof *s);
    start_redis(&s->redis, th_free_port());
    snprintf(s->redis_url, sizeof s->redis_url, "redis://127.0.0.1:%d", s->redis.port);
    char name[64];
    snprintf(name, sizeof name, "%s-w", tag);
    const char *we[] = {"--events",       s->redis_url,           "--pool-mb", "2",
                        "--events-queue", queue ? queue : "4096", NULL};
    ck_assert_msg(th_start_worker(&s->w, WORKER_BIN, g_model, 0, name, we) == 0,
                  "worker did not start; log in %s", th_root());
    snprintf(s->wurl, sizeof s->wurl, "http://127.0.0.1:%d", s->w.port);
    snprintf(name, sizeof name, "%s-ga", tag);
    start_gateway(s, &s->ga, name);
    snprintf(name, sizeof name, "%s-gb", tag);
    start_gateway(s, &s->gb, name);
}

static void start_all(setup *s, const char *tag)
{
    start_all_q(s, tag, NULL);
}

/* Stops a gateway with SIGTERM and asserts a clean exit. */
static void stop_gateway(th_proc *g)
{
    int rc = th_stop(g, SIGTERM);
    ck_assert_msg(rc == 0, "gateway %s exited with %d", g->log, rc);
}

static void stop_all(setup *s)
{
    if (s->gb.pid) stop_gateway(&s->gb);
    if (s->ga.pid) stop_gateway(&s->ga);
    ck_assert_int_eq(th_stop(&s->w, SIGTERM), 0);
    th_stop(&s->redis, SIGKILL);
}

/* A RAG completion of document i (a text of its own) through gateway port; returns the HTTP
 * status and the document's chunk key in key (when 200). */
static long ask_sized(int port, int i, size_t bytes, char key[33])
{
    uint64_t st = 0x5eed0000u + (uint64_t)i;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "Document %d.", i);
    char *doc = th_words(bytes, prefix, &st);
    char *prompt = th_rag(TH_SYSTEM, doc, NULL, TH_QUESTION);
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens", 1,
                          "temperature", 0.0);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    free(prompt);
    free(doc);
    th_resp r;
    th_http(&r, port, "POST", "/v1/completions", body, NULL, NULL);
    free(body);
    long status = r.status;
    if (key) key[0] = 0;
    if (status == 200 && key) {
        json_t *j = th_json(&r);
        json_t *seg =
            json_array_get(json_object_get(json_object_get(j, "chunk_cache"), "segments"), 1);
        const char *k = json_string_value(json_object_get(seg, "key"));
        if (k) snprintf(key, 33, "%s", k);
        json_decref(j);
    }
    th_resp_free(&r);
    return status;
}

/* ask_sized with a short document (about 80 tokens: a few fit in the 2 MiB pool). */
static long ask(int port, int i, char key[33])
{
    return ask_sized(port, i, 80, key);
}

/* Asks questions first .. end - 1 (ask) through gateway port; each must answer 200. */
static void ask_each(int port, int first, int end)
{
    for (int i = first; i < end; i++) {
        long status = ask(port, i, NULL);
        ck_assert_msg(status == 200, "question %d answered %ld", i, status);
    }
}

/* The worker's index id on gateway port. */
static long long worker_id(int port)
{
    json_t *j = th_call(port, "GET", "/v1/workers", NULL, NULL, 200);
    long long id = th_iget(json_array_get(json_object_get(j, "data"), 0), "id");
    json_decref(j);
    return id;
}

/* 1 when gateway port's index places key on worker wid; -1 when the index lacks the chunk. */
static int placed(int port, const char *key, long long wid)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/chunks/%s", key);
    th_resp r;
    th_http(&r, port, "GET", path, NULL, NULL, NULL);
    int on = r.status == 404 ? -1 : 0;
    if (r.status == 200) {
        json_t *j = th_json(&r);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(j, "placements"), i, p) on |=
            th_iget(p, "worker_id") == wid;
        json_decref(j);
    }
    th_resp_free(&r);
    return on;
}

/* The tier of gateway port's placement of key on worker wid ("" when none). */
static void placed_tier(int port, const char *key, long long wid, char tier[8])
{
    char path[128];
    snprintf(path, sizeof path, "/v1/chunks/%s", key);
    th_resp r;
    th_http(&r, port, "GET", path, NULL, NULL, NULL);
    tier[0] = 0;
    if (r.status == 200) {
        json_t *j = th_json(&r);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(j, "placements"), i,
                           p) if (th_iget(p, "worker_id") == wid)
            snprintf(tier, 8, "%s", th_sget(p, "tier"));
        json_decref(j);
    }
    th_resp_free(&r);
}

typedef struct keyset {
    char (*k)[33];
    int n;
} keyset;

static int cmp_key(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The worker's inventory, sorted. */
static void worker_keys(const th_proc *w, keyset *out)
{
    json_t *j = th_call(w->port, "GET", "/v1/chunks?limit=100000", NULL, NULL, 200);
    size_t i;
    json_t *c;
    out->n = 0;
    json_array_foreach(json_object_get(j, "data"), i, c) if (out->n < MAX_KEYS)
        snprintf(out->k[out->n++], 33, "%s", th_sget(c, "key"));
    json_decref(j);
    qsort(out->k, (size_t)out->n, 33, cmp_key);
}

/* The keys gateway port's index places on worker wid, sorted. */
static void gateway_keys(int port, long long wid, keyset *out)
{
    char after[33] = "", path[128];
    out->n = 0;
    for (;;) {
        snprintf(path, sizeof path, "/v1/chunks?limit=1000%s%s", after[0] ? "&after=" : "", after);
        json_t *j = th_call(port, "GET", path, NULL, NULL, 200);
        json_t *data = json_object_get(j, "data"), *c, *p;
        size_t i, k;
        json_array_foreach(data, i, c)
        {
            json_array_foreach(json_object_get(c, "placements"), k,
                               p) if (th_iget(p, "worker_id") == wid && out->n < MAX_KEYS)
                snprintf(out->k[out->n++], 33, "%s", th_sget(c, "id"));
            snprintf(after, sizeof after, "%s", th_sget(c, "id"));
        }
        int more = th_bget(j, "has_more");
        json_decref(j);
        if (!more) break;
    }
    qsort(out->k, (size_t)out->n, 33, cmp_key);
}

static int same_keys(const keyset *a, const keyset *b)
{
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->k[i], b->k[i])) return 0;
    return 1;
}

/* Waits up to timeout_ms until gateway port's index places on the worker exactly what it
 * holds; returns 1 when it does. */
static int wait_exact(const setup *s, int port, int timeout_ms)
{
    keyset w = {cg_calloc(MAX_KEYS, 33), 0}, g = {cg_calloc(MAX_KEYS, 33), 0};
    long long wid = worker_id(port);
    int ok = 0;
    for (int t = 0; t <= timeout_ms && !ok; t += 50) {
        worker_keys(&s->w, &w);
        gateway_keys(port, wid, &g);
        ok = w.n > 0 && same_keys(&w, &g);
        if (!ok) th_sleep_ms(50);
    }
    if (!ok)
        fprintf(stderr, "index of gateway :%d: %d keys on the worker, the worker holds %d\n", port,
                g.n, w.n);
    free(w.k);
    free(g.k);
    return ok;
}

/* start_all_q, then questions first .. end - 1 through gateway A, until gateway B's index is
 * exact: the state the resync tests start from. */
static void start_exact(setup *s, const char *tag, const char *queue, int first, int end)
{
    start_all_q(s, tag, queue);
    ask_each(s->ga.port, first, end);
    ck_assert(wait_exact(s, s->gb.port, 5000));
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* A chunk stored through A is placed in B; each chunk the worker evicts leaves A's and B's
 * indexes, B learning it from the stream only. */
START_TEST(test_eviction_reaches_every_gateway)
{
    setup s;
    start_all(&s, "evict");
    long long wa = worker_id(s.ga.port), wb = worker_id(s.gb.port);
    char after[48] = "0-0", key0[33];
    ck_assert_int_eq(ask(s.ga.port, 0, key0), 200);
    /* B served nothing: the placement reaches it through the events */
    int seen = 0;
    for (int t = 0; t < 2000 && !seen; t += 5, th_sleep_ms(5))
        seen = placed(s.gb.port, key0, wb) == 1;
    ck_assert_msg(seen, "gateway B never learned the stored chunk %s", key0);

    tev *ev = cg_calloc(512, sizeof *ev);
    double lag_ms[64];
    int n_lag = 0;
    for (int i = 1; i < 200 && n_lag < 8; i++) {
        ck_assert_int_eq(ask(s.ga.port, i, NULL), 200);
        int n = read_events(s.redis.port, after, ev, 512);
        for (int e = 0; e < n && n_lag < 8; e++) {
            if (strcmp(ev[e].op, "evicted") || strcmp(ev[e].tier, "ram")) continue;
            /* the worker evicted it at ev[e].ts (its wall clock, this machine's) */
            int gone_a = 0, gone_b = 0;
            double t_b = 0;
            for (int t = 0; t < 4000 && !(gone_a && gone_b); t++) {
                if (!gone_b && placed(s.gb.port, ev[e].key, wb) != 1) {
                    gone_b = 1;
                    t_b = (double)cg_wall_ms() - (double)ev[e].ts;
                }
                if (!gone_a) gone_a = placed(s.ga.port, ev[e].key, wa) != 1;
                if (!(gone_a && gone_b)) th_sleep_ms(1);
            }
            ck_assert_msg(gone_a && gone_b, "evicted chunk %s still placed (A %d, B %d)", ev[e].key,
                          !gone_a, !gone_b);
            lag_ms[n_lag++] = t_b;
        }
    }
    ck_assert_msg(n_lag > 0, "the worker evicted nothing with a 2 MiB pool");
    double sorted[64];
    memcpy(sorted, lag_ms, sizeof lag_ms);
    printf("eviction -> gateway B's index, as the test saw it (%d evictions): p50 %.1f ms, max "
           "%.1f ms\n",
           n_lag, th_percentile(sorted, (size_t)n_lag, 0.5),
           th_percentile(sorted, (size_t)n_lag, 1.0));
    for (int g = 0; g < 2; g++) {
        int port = g ? s.gb.port : s.ga.port;
        double sum = th_metric(port, "chunkgate_events_lag_seconds_sum"),
               cnt = th_metric(port, "chunkgate_events_lag_seconds_count"),
               le = th_counter(port, "chunkgate_events_lag_seconds_bucket{le=\"0.1\"}");
        printf("gateway %c: %.0f events applied, mean lag %.2f ms, %.0f%% within 100 ms, last "
               "%.2f ms\n",
               g ? 'B' : 'A', th_counter(port, "chunkgate_events_applied_total"),
               cnt > 0 ? sum / cnt * 1e3 : 0, cnt > 0 ? le / cnt * 100 : 0,
               th_metric(port, "chunkgate_events_last_lag_seconds") * 1e3);
        ck_assert(cnt > 0);
    }
    /* a generous bound: the CI machine is shared and slow; the numbers above are the result */
    for (int i = 0; i < n_lag; i++)
        ck_assert_msg(lag_ms[i] < 2000, "eviction took %.0f ms to reach gateway B", lag_ms[i]);
    ck_assert(wait_exact(&s, s.gb.port, 5000));
    ck_assert_double_eq(th_counter(s.w.port, "chunkgate_worker_events_dropped_total"), 0);
    ck_assert(th_counter(s.w.port, "chunkgate_worker_events_published_total") > 0);
    free(ev);
    stop_all(&s);
}
END_TEST

/* B stopped; the stream trimmed below B's position; B restarted resumes, sees the gap,
 * resyncs and is exact. */
START_TEST(test_trimmed_stream_resync_on_restart)
{
    setup s;
    start_exact(&s, "trim", NULL, 1000, 1006);
    stop_gateway(&s.gb);
    ask_each(s.ga.port, 1006, 1030);
    /* everything B has not read goes, then a few newer events */
    long long trimmed = th_redis_int(s.redis.port, "XTRIM " STREAM " MAXLEN 0");
    ck_assert(trimmed > 0);
    ask_each(s.ga.port, 1030, 1034);
    start_gateway(&s, &s.gb, "trim-gb");
    ck_assert(wait_exact(&s, s.gb.port, 10000));
    double gaps = th_counter(s.gb.port, "chunkgate_events_gaps_total{kind=\"trimmed\"}");
    printf("restarted gateway: %lld entries trimmed while it was down, %.0f trimmed-stream gap "
           "seen, %.0f resyncs\n",
           trimmed, gaps, th_counter(s.gb.port, "chunkgate_events_resyncs_total"));
    ck_assert_double_eq(gaps, 1);
    char *log = th_read_file(s.gb.log, NULL);
    ck_assert_ptr_null(strstr(log, "\"level\":\"error\""));
    free(log);
    /* a new gateway starts from the inventory plus the stream's tail: exact at once, then it
     * follows the stream like the others */
    th_proc gc;
    start_gateway(&s, &gc, "trim-gc");
    ck_assert(wait_exact(&s, gc.port, 5000));
    /* and they follow the stream again */
    ask_each(s.ga.port, 1034, 1040);
    ck_assert(wait_exact(&s, s.gb.port, 5000));
    ck_assert(wait_exact(&s, gc.port, 5000));
    ck_assert(th_counter(gc.port, "chunkgate_events_applied_total") > 0);
    ck_assert_double_eq(th_counter(gc.port, "chunkgate_events_resyncs_total"), 0);
    stop_gateway(&gc);
    stop_all(&s);
}
END_TEST

/* Redis stopped mid-traffic: requests succeed, errors are counted; Redis back: the gateways
 * resync and are exact. */
START_TEST(test_redis_down_and_back)
{
    setup s;
    start_exact(&s, "down", NULL, 2000, 2004);
    int port = s.redis.port;
    th_stop(&s.redis, SIGKILL);
    ask_each(s.ga.port, 2004, 2016);
    double failed = th_counter(s.w.port, "chunkgate_worker_events_failed_total");
    double errs_b = th_counter(s.gb.port, "chunkgate_events_errors_total");
    printf("Redis down: worker events failed %.0f, gateway B read errors %.0f\n", failed, errs_b);
    ck_assert(failed > 0);
    ck_assert(errs_b > 0);
    start_redis(&s.redis, port);
    ask_each(s.ga.port, 2016, 2020);
    ck_assert(wait_exact(&s, s.gb.port, 10000));
    ck_assert(wait_exact(&s, s.ga.port, 10000));
    printf("Redis back: gateway B resyncs %.0f (gaps: resync %.0f, trimmed %.0f)\n",
           th_counter(s.gb.port, "chunkgate_events_resyncs_total"),
           th_counter(s.gb.port, "chunkgate_events_gaps_total{kind=\"resync\"}"),
           th_counter(s.gb.port, "chunkgate_events_gaps_total{kind=\"trimmed\"}"));
    ck_assert(th_counter(s.gb.port, "chunkgate_events_resyncs_total") >= 1);
    stop_all(&s);
}
END_TEST

static int wait_counter_cond(void *arg)
{
    const void **a = arg;
    return th_counter(*(const int *)a[0], a[1]) >= 1;
}

/* Waits up to 10 s until counter series on port is at least 1. */
static int wait_counter(int port, const char *series)
{
    const void *arg[2] = {&port, series};
    return th_wait_until(10000, 20, wait_counter_cond, arg);
}

/* Events of n workers that come and go (pods named anew at each restart), none registered. */
static void flood_sources(int redis_port, int n)
{
    redisContext *c = th_redis_connect(redis_port);
    ck_assert(c && !c->err);
    for (int i = 0; i < n; i++) {
        cg_chunkevent ev = {.seq = 1,
                            .op = CG_CHUNKEVENT_STORED,
                            .tier = CG_TIER_RAM,
                            .tokens = 4,
                            .ts_ms = cg_wall_ms()};
        snprintf(ev.worker, sizeof ev.worker, "gone-pod-%d:8081", i);
        snprintf(ev.epoch, sizeof ev.epoch, "epoch-%d", i);
        snprintf(ev.key, sizeof ev.key, "%032x", i);
        cg_chunkevent_wire w;
        cg_chunkevent_encode(&ev, &w);
        const char *argv[3 + 2 * CG_CHUNKEVENT_MAX_FIELDS] = {"XADD", STREAM, "*"};
        size_t lens[3 + 2 * CG_CHUNKEVENT_MAX_FIELDS] = {4, strlen(STREAM), 1};
        for (int k = 0; k < w.argc; k++)
            argv[3 + k] = w.argv[k], lens[3 + k] = w.lens[k];
        redisReply *r = redisCommandArgv(c, 3 + w.argc, argv, lens);
        ck_assert(r && r->type == REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
    redisFree(c);
}

/* Events dropped by a full queue (Redis paused) flag a resync; a restarted worker (a new
 * epoch) is resynced too; gateway B is exact after each. Before them, the events of 1,100
 * workers that came and went: a gateway keeps following the live one. */
START_TEST(test_dropped_events_and_restart_resync)
{
    setup s;
    start_all_q(&s, "gap", "2");
    /* before the worker's first event: the gateways have heard of more workers than they
     * follow at once, and must still follow this one */
    flood_sources(s.redis.port, 1100);
    ask_each(s.ga.port, 3000, 3004);
    ck_assert(wait_exact(&s, s.gb.port, 5000));
    /* Redis answers nothing for 1.5 s: the worker's queue of 2 overflows */
    redisContext *c = th_redis_connect(s.redis.port);
    ck_assert(c && !c->err);
    redisReply *r = redisCommand(c, "CLIENT PAUSE 1500 ALL");
    ck_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redisFree(c);
    double t0 = th_now_s();
    ask_each(s.ga.port, 3004, 3010);
    double dropped = th_counter(s.w.port, "chunkgate_worker_events_dropped_total");
    ck_assert_msg(dropped > 0,
                  "no event was dropped while Redis was paused (%.0f published, %.0f queued)",
                  th_counter(s.w.port, "chunkgate_worker_events_published_total"),
                  th_counter(s.w.port, "chunkgate_worker_events_queue_depth"));
    while (th_now_s() - t0 < 1.6)
        th_sleep_ms(20);
    ask_each(s.ga.port, 3010, 3012);
    ck_assert(wait_counter(s.gb.port, "chunkgate_events_gaps_total{kind=\"resync\"}"));
    ck_assert(wait_exact(&s, s.gb.port, 10000));
    printf("Redis paused: %.0f events dropped by the worker; gateway B resyncs %.0f\n", dropped,
           th_counter(s.gb.port, "chunkgate_events_resyncs_total"));

    /* the worker restarts (empty, a new epoch) on the same address */
    int port = s.w.port;
    ck_assert_int_eq(th_stop(&s.w, SIGTERM), 0);
    const char *we[] = {"--events", s.redis_url, "--pool-mb", "2", NULL};
    ck_assert(th_start_worker(&s.w, WORKER_BIN, g_model, port, "gap-w2", we) == 0);
    ck_assert(th_wait_worker(s.ga.port, NULL, s.wurl, 1));
    ck_assert(th_wait_worker(s.gb.port, NULL, s.wurl, 1));
    ask_each(s.ga.port, 3012, 3016);
    ck_assert(wait_counter(s.gb.port, "chunkgate_events_gaps_total{kind=\"epoch\"}"));
    ck_assert(wait_exact(&s, s.gb.port, 10000));
    stop_all(&s);
}
END_TEST

/* An entry no batch of events can be (5 MiB in one field): a gateway does not ask for it
 * forever; it goes on from the stream's tail, resyncs every worker, and follows again. */
START_TEST(test_unreadable_entry_skipped)
{
    setup s;
    start_exact(&s, "huge", "64", 4000, 4002);
    const size_t n = (size_t)5 << 20;
    char *v = cg_malloc(n);
    memset(v, 'x', n);
    redisContext *c = th_redis_connect(s.redis.port);
    ck_assert(c && !c->err);
    redisReply *r = redisCommand(c, "XADD %s * w %b", STREAM, v, n);
    ck_assert(r && r->type == REDIS_REPLY_STRING);
    freeReplyObject(r);
    redisFree(c);
    free(v);
    ask_each(s.ga.port, 4002, 4006);
    ck_assert(wait_counter(s.gb.port, "chunkgate_events_gaps_total{kind=\"trimmed\"}"));
    ask_each(s.ga.port, 4006, 4008);
    ck_assert(wait_exact(&s, s.gb.port, 10000));
    stop_all(&s);
}
END_TEST

/* With a disk tier: a chunk RAM cannot keep reaches the disk through the write-behind, and RAM
 * evictions spill there; gateway B learns both tiers from the events. */
START_TEST(test_disk_tier_events)
{
    setup s;
    memset(&s, 0, sizeof s);
    start_redis(&s.redis, th_free_port());
    snprintf(s.redis_url, sizeof s.redis_url, "redis://127.0.0.1:%d", s.redis.port);
    const char *we[] = {"--events", s.redis_url, "--pool-mb", "1", "--disk-mb", "32", NULL};
    ck_assert(th_start_worker(&s.w, WORKER_BIN, g_model, 0, "disk-w", we) == 0);
    snprintf(s.wurl, sizeof s.wurl, "http://127.0.0.1:%d", s.w.port);
    start_gateway(&s, &s.ga, "disk-ga");
    start_gateway(&s, &s.gb, "disk-gb");
    long long wb = worker_id(s.gb.port);
    /* about 400 tokens of KV (1.6 MiB) do not fit a 1 MiB pool */
    char big[33], tier[8] = "";
    ck_assert_int_eq(ask_sized(s.ga.port, 5000, 400, big), 200);
    for (int t = 0; t < 2000 && strcmp(tier, "disk"); t += 5, th_sleep_ms(5))
        placed_tier(s.gb.port, big, wb, tier);
    ck_assert_msg(!strcmp(tier, "disk"), "gateway B places the large chunk in '%s', not disk",
                  tier);
    ask_each(s.ga.port, 5001, 5010);
    ck_assert(th_counter(s.w.port, "chunkgate_worker_spills_total") > 0);
    ck_assert(wait_exact(&s, s.gb.port, 5000));
    stop_all(&s);
}
END_TEST

/* tests/redis_cluster.sh start DIR PORT | stop DIR; its output goes to cluster.log. */
static int cluster_script(const char *cmd, int port)
{
    char line[1200], dir[400];
    snprintf(dir, sizeof dir, "%s/cluster", th_root());
    snprintf(line, sizeof line, "%s/tests/redis_cluster.sh %s %s %d >>%s/cluster.log 2>&1",
             CG_SOURCE_DIR, cmd, dir, port, th_root());
    return system(line);
}

/* The events of a worker on a Redis Cluster (redis+cluster://) reach a gateway reading the
 * cluster: the stream lives on the master of its slot, both find it. */
START_TEST(test_cluster_events)
{
    char cli[512];
    if (!th_which("redis-cli", cli, sizeof cli)) {
        printf("redis-cli is not installed: the cluster case is not run\n");
        return;
    }
    int base = 0;
    for (int p = 23000 + (int)(getpid() % 4000); p < 29000 && !base; p += 7) {
        int ok = 1;
        for (int i = 0; i < 3 && ok; i++)
            ok = th_port_free(p + i) && th_port_free(p + i + 10000);
        if (ok) base = p;
    }
    ck_assert_int_gt(base, 0);
    ck_assert_msg(cluster_script("start", base) == 0, "redis_cluster.sh start failed: see %s",
                  th_root());
    setup s;
    memset(&s, 0, sizeof s);
    snprintf(s.redis_url, sizeof s.redis_url, "redis+cluster://127.0.0.1:%d", base);
    const char *we[] = {"--events", s.redis_url, "--pool-mb", "2", NULL};
    ck_assert(th_start_worker(&s.w, WORKER_BIN, g_model, 0, "cluster-w", we) == 0);
    snprintf(s.wurl, sizeof s.wurl, "http://127.0.0.1:%d", s.w.port);
    start_gateway(&s, &s.ga, "cluster-ga");
    start_gateway(&s, &s.gb, "cluster-gb");
    char key[33];
    ck_assert_int_eq(ask(s.ga.port, 4000, key), 200);
    long long wb = worker_id(s.gb.port);
    int seen = 0;
    for (int t = 0; t < 2000 && !seen; t += 5, th_sleep_ms(5))
        seen = placed(s.gb.port, key, wb) == 1;
    ck_assert_msg(seen, "gateway B never learned the stored chunk %s from the cluster", key);
    ask_each(s.ga.port, 4001, 4012);
    ck_assert(wait_exact(&s, s.gb.port, 5000));
    ck_assert(th_counter(s.gb.port, "chunkgate_events_applied_total") > 0);
    ck_assert_double_eq(th_counter(s.gb.port, "chunkgate_events_errors_total"), 0);
    stop_gateway(&s.gb);
    stop_gateway(&s.ga);
    ck_assert_int_eq(th_stop(&s.w, SIGTERM), 0);
    ck_assert_int_eq(cluster_script("stop", 0), 0);
}
END_TEST

int main(void)
{
    if (!th_need("redis-server", "redis-server", g_redis_server, sizeof g_redis_server))
        return SKIP_CODE;
    if (th_init_with_model("events", WORKER_BIN, g_model, sizeof g_model) != 0) return 1;
    int failed = th_run_tests(
        "events", "events", 180,
        TH_TESTS(test_eviction_reaches_every_gateway, test_trimmed_stream_resync_on_restart,
                 test_redis_down_and_back, test_dropped_events_and_restart_resync,
                 test_unreadable_entry_skipped, test_disk_tier_events, test_cluster_events));
    /* the cluster's nodes are daemons: stop them even when a check failed half-way */
    (void)cluster_script("stop", 0);
    /* a sanitizer report in any worker's or gateway's log fails the suite */
    failed += th_logs_have_sanitizer_reports();
    th_cleanup(failed != 0);
    return failed ? 1 : 0;
}
