/* Chunk events at scale (DESIGN §18), with real processes on loopback: redis-server, one
 * chunkgate-worker with --events, and chunkgate gateways with --events.
 *
 *  1. convergence of a new replica: the worker really holds CHUNKS chunks (computed through
 *     POST /v1/assemble, 250 chunks of a few tokens a request, one 8-token pool block each); a
 * gateway started then, with an empty index, is timed from its start until its index places all of
 * them (its inventory sync of the worker, GET /v1/chunks in pages, into SQLite), against the
 * baseline of the bench itself reading the same inventory over HTTP (every page, parsed) in the
 * same run.
 *  2. gateway CPU per event: the bench appends events to the stream as the worker would
 *     (its name and epoch, the sequence continued: the gateway applies them like the worker's
 *     own), at RATE events/s for SECONDS, half "stored" of a new key and half "evicted" of a
 *     key stored 1,000 events earlier. The gateway's CPU (user + system, /proc) over the run,
 *     less its idle CPU over as long (health checks), per event applied; next to it, the CPU
 *     per event of the redis-server that takes the XADDs and serves the XREADs (the baseline:
 *     the least any consumer of the stream costs the machine). Then BURST events appended as
 *     fast as the bench can: how many the gateway applies per second.
 *
 * usage: bench_events [--chunks N (100000)] [--rate R (10000)] [--seconds S (5)]
 *                     [--burst B (100000)] */
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

#define STREAM "chunkgate:events"
#define PER_REQ 250 /* chunk segments per assemble request */
#define WORKER_NAME "bench-w0"

static void die(const char *what)
{
    fprintf(stderr, "bench_events: %s (logs in %s)\n", what, th_root());
    exit(1);
}

/* GET port path: the body as JSON (NULL unless 200). */
static json_t *get_json(int port, const char *path)
{
    th_resp r;
    th_http(&r, port, "GET", path, NULL, NULL, NULL);
    json_t *j = r.status == 200 ? th_json(&r) : NULL;
    th_resp_free(&r);
    return j;
}

/* A metric of the gateway on port (0 when absent or unreadable). */
static double metric(int port, const char *series)
{
    th_resp r;
    th_http(&r, port, "GET", "/metrics", NULL, NULL, NULL);
    double v = 0;
    if (r.status != 200 || !r.body.data || !th_metric_find(r.body.data, series, &v)) v = 0;
    th_resp_free(&r);
    return v;
}

/* The chunks the gateway on port has synced from its one worker (-1 when not healthy). */
static long long synced_chunks(int port)
{
    json_t *j = get_json(port, "/v1/workers");
    json_t *w = json_array_get(json_object_get(j, "data"), 0);
    long long n = w && json_is_true(json_object_get(w, "healthy"))
                      ? json_integer_value(json_object_get(w, "synced_chunks"))
                      : -1;
    json_decref(j);
    return n;
}

/* Fills the worker with n chunks of a few tokens each. */
static void fill_worker(int port, long n)
{
    for (long done = 0; done < n;) {
        json_t *segs = json_array();
        json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "system", "text", "Bench."));
        long k = 0;
        for (; k < PER_REQ && done + k < n; k++) {
            char text[64];
            snprintf(text, sizeof text, "c%ld", done + k);
            json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "chunk", "text", text));
        }
        json_array_append_new(segs, json_pack("{s:s, s:s}", "role", "question", "text", "Q?"));
        char *body = th_dumps(json_pack("{s:s, s:o}", "model", "chunkgate-tiny", "segments", segs));
        th_resp r;
        th_http(&r, port, "POST", "/v1/assemble", body, NULL, NULL);
        free(body);
        if (r.status != 200) die("an assemble request failed");
        json_t *j = th_json(&r);
        char path[128];
        snprintf(path, sizeof path, "/v1/assemblies/%s",
                 json_string_value(json_object_get(j, "assembly_id")));
        json_decref(j);
        th_resp_free(&r);
        th_http(&r, port, "DELETE", path, NULL, NULL, NULL);
        th_resp_free(&r);
        done += k;
    }
}

/* The bench's own read of the worker's inventory: every page, parsed. Returns the chunks. */
static long read_inventory(int port)
{
    char after[40] = "", path[160];
    long n = 0;
    for (;;) {
        snprintf(path, sizeof path, "/v1/chunks?limit=10000%s%s", after[0] ? "&after=" : "", after);
        json_t *j = get_json(port, path);
        if (!j) die("GET /v1/chunks failed");
        n += (long)json_array_size(json_object_get(j, "data"));
        const char *last = json_string_value(json_object_get(j, "last_key"));
        int more = json_is_true(json_object_get(j, "has_more")) && last;
        if (more) snprintf(after, sizeof after, "%s", last);
        json_decref(j);
        if (!more) break;
    }
    return n;
}

/* The last event of the stream, decoded. */
static void last_event(redisContext *c, cg_chunkevent *ev)
{
    redisReply *r = redisCommand(c, "XREVRANGE %s + - COUNT 1", STREAM);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 1) die("the stream is empty");
    redisReply *f = r->element[0]->element[1];
    const char *fv[64];
    size_t lv[64];
    for (size_t i = 0; i < f->elements && i < 64; i++) {
        fv[i] = f->element[i]->str;
        lv[i] = f->element[i]->len;
    }
    if (cg_chunkevent_decode(f->elements, fv, lv, ev) != CG_OK) die("undecodable event");
    freeReplyObject(r);
}

/* Appends events [from, to) of the synthetic sequence (pipelined) after *ev (advanced). */
static void append_events(redisContext *c, cg_chunkevent *ev, long from, long to)
{
    for (long i = from; i < to; i++) {
        long k = i / 2;
        int evict = (i & 1) && k >= 1000;
        cg_key key = th_key_of((uint64_t)(evict ? k - 1000 : k), 0xe7e7);
        cg_key_hex(&key, ev->key);
        ev->op = evict ? CG_CHUNKEVENT_EVICTED : CG_CHUNKEVENT_STORED;
        ev->seq++;
        ev->ts_ms = cg_wall_ms();
        cg_chunkevent_wire w;
        cg_chunkevent_encode(ev, &w);
        const char *argv[4 + 2 * CG_CHUNKEVENT_MAX_FIELDS] = {"XADD", STREAM, "*"};
        size_t lens[4 + 2 * CG_CHUNKEVENT_MAX_FIELDS] = {4, strlen(STREAM), 1};
        for (int a = 0; a < w.argc; a++) {
            argv[3 + a] = w.argv[a];
            lens[3 + a] = w.lens[a];
        }
        redisAppendCommandArgv(c, 3 + w.argc, argv, lens);
    }
    for (long i = from; i < to; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) die("XADD failed");
        freeReplyObject(r);
    }
}

/* Waits until the gateway has applied target events in all; returns the seconds waited. */
static double wait_applied(int port, double target)
{
    double t0 = th_now_s();
    while (metric(port, "chunkgate_events_applied_total") < target) {
        if (th_now_s() - t0 > 120) die("the gateway did not apply the events within 120 s");
        th_sleep_ms(5);
    }
    return th_now_s() - t0;
}

int main(int argc, char **argv)
{
    long chunks = 100000, rate = 10000, seconds = 5, burst = 100000;
    const th_opt opts[] = {{"--chunks", TH_OPT_LONG, &chunks},
                           {"--rate", TH_OPT_LONG, &rate},
                           {"--seconds", TH_OPT_LONG, &seconds},
                           {"--burst", TH_OPT_LONG, &burst}};
    if (th_parse_opts(argc, argv, opts, CG_ARRAY_LEN(opts)) != 0 || chunks < 1 || rate < 100 ||
        seconds < 1 || burst < 0) {
        fprintf(stderr, "usage: bench_events [--chunks N] [--rate R (>= 100)] [--seconds S] "
                        "[--burst B]\n");
        return 2;
    }
    th_init("bench_events", NULL);
    char model[400], rdir[400], url[64];
    th_path(model, sizeof model, "model");
    th_path(rdir, sizeof rdir, "redis");
    mkdir(rdir, 0755);
    int rport = th_free_port();
    pid_t redis = th_redis_start(rport, rdir);
    if (redis < 0) die("redis-server did not start");
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", rport);
    if (th_gen_model(WORKER_BIN, model, NULL) != 0) die("generate-model failed");
    th_proc w, g1, g2;
    char maxlen[32];
    snprintf(maxlen, sizeof maxlen, "%ld", 2 * (chunks + rate * seconds + burst));
    /* a chunk "c<n>" is one block of 8 tokens: the pool holds 131,072 of them (3 GiB touched
     * for 100k chunks of the tiny model) */
    const char *wa[] = {
        "--events",       url,         "--events-id", WORKER_NAME,      "--events-maxlen",
        maxlen,           "--pool-mb", "4096",        "--block-tokens", "8",
        "--max-segments", "300",       NULL};
    if (th_start_worker(&w, WORKER_BIN, model, 0, "worker", wa) != 0)
        die("the worker did not start");

    /* 1. a new replica's convergence */
    double t0 = th_now_s();
    fill_worker(w.port, chunks);
    printf("worker filled with %ld chunks in %.1f s\n", chunks, th_now_s() - t0);
    double tb = th_now_s();
    long held = read_inventory(w.port);
    double base_s = th_now_s() - tb;
    if (held < chunks) {
        fprintf(stderr, "the worker holds %ld chunks, not %ld\n", held, chunks);
        die("the worker holds fewer chunks than it was given");
    }
    const char *ga[] = {"--worker", w.url, "--events", url, "--sync-interval-ms", "0", NULL};
    double ts = th_now_s();
    if (th_start_gateway(&g1, CHUNKGATE_BIN, "gateway1", ga) != 0) die("gateway 1 did not start");
    while (synced_chunks(g1.port) < held) {
        if (th_now_s() - ts > 300) die("gateway 1 did not converge within 300 s");
        th_sleep_ms(10);
    }
    double conv_s = th_now_s() - ts;
    printf("\n1. a new gateway converges with %ld chunks placed on the worker\n", held);
    printf("   gateway start to index complete  %8.3f s\n", conv_s);
    printf("   baseline: the bench reads the same inventory over HTTP  %8.3f s\n", base_s);
    printf("   ratio (convergence / inventory read)  %.2fx\n", conv_s / base_s);

    /* 2. CPU per event */
    redisContext *rc = th_redis_connect(rport);
    if (!rc || rc->err) die("cannot connect to redis-server");
    if (th_start_gateway(&g2, CHUNKGATE_BIN, "gateway2", ga) != 0) die("gateway 2 did not start");
    while (synced_chunks(g2.port) < held)
        th_sleep_ms(10);
    cg_chunkevent ev;
    last_event(rc, &ev);
    if (strcmp(ev.worker, WORKER_NAME) != 0) die("the last event is not the worker's");
    ev.tier = CG_TIER_RAM;
    ev.tokens = 8;
    ev.resync = 0;
    double applied0 = metric(g2.port, "chunkgate_events_applied_total");
    double c_idle0 = th_cpu_seconds(g2.pid);
    th_sleep_ms((int)(seconds * 1000));
    double idle = th_cpu_seconds(g2.pid) - c_idle0;
    long total = rate * seconds, step = rate / 100; /* a batch every 10 ms */
    double g0 = th_cpu_seconds(g2.pid), r0 = th_cpu_seconds(redis), w0 = th_now_s();
    for (long i = 0; i < total; i += step) {
        double due = w0 + (double)i / (double)rate;
        while (th_now_s() < due)
            th_sleep_ms(1);
        append_events(rc, &ev, i, CG_MIN(i + step, total));
    }
    double sent_s = th_now_s() - w0;
    double drain = wait_applied(g2.port, applied0 + (double)total);
    double gcpu = th_cpu_seconds(g2.pid) - g0, rcpu = th_cpu_seconds(redis) - r0;
    double idle_share = idle * (sent_s + drain) / (double)seconds;
    double per_ev = (gcpu - idle_share) / (double)total * 1e6;
    double redis_per_ev = rcpu / (double)total * 1e6;
    printf("\n2. gateway CPU per event at %ld events/s for %ld s (%ld events, sent in %.2f s, "
           "applied %.3f s after the last)\n",
           rate, seconds, total, sent_s, drain);
    printf("   gateway CPU %.2f s (idle over as long: %.2f s): %.1f us/event, %.1f%% of a core\n",
           gcpu, idle_share, per_ev, 100 * (gcpu - idle_share) / (sent_s + drain));
    printf("   baseline: redis-server (XADD + XREAD) %.2f s: %.1f us/event\n", rcpu, redis_per_ev);
    printf("   ratio (gateway / redis-server)  %.2fx\n", per_ev / redis_per_ev);
    double lag = metric(g2.port, "chunkgate_events_last_lag_seconds");
    printf("   lag of the last event applied  %.1f ms\n", lag * 1e3);

    double a1 = metric(g2.port, "chunkgate_events_applied_total");
    double tb0 = th_now_s();
    for (long i = 0; i < burst; i += 1000)
        append_events(rc, &ev, total + i, total + CG_MIN(i + 1000, burst));
    double burst_send = th_now_s() - tb0;
    wait_applied(g2.port, a1 + (double)burst);
    double burst_s = th_now_s() - tb0;
    printf("\n   burst: %ld events appended in %.2f s, all applied after %.2f s: %.0f events/s\n",
           burst, burst_send, burst_s, (double)burst / burst_s);
    double gaps = metric(g2.port, "chunkgate_events_gaps_total{kind=\"sequence\"}");
    if (gaps != 0) die("the gateway saw a sequence gap: the bench's events were not continuous");

    redisFree(rc);
    th_stop(&g2, SIGTERM);
    th_stop(&g1, SIGTERM);
    th_stop(&w, SIGTERM);
    kill(redis, SIGKILL);
    th_cleanup(0);
    return 0;
}
