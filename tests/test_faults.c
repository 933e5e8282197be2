/* Integration suite for faults, each with the behaviour the README documents: a backend that
 * stalls mid-stream, resets the connection, sends invalid SSE or an endless line; a worker
 * killed while it assembles; a full disk tier; unreadable data directories; the SQLite index
 * locked by another process or read-only; a worker restarted behind the gateway's back (its
 * new instance_id triggers a resync). Real chunkgate and chunkgate-worker processes on
 * loopback; tests/fake_backend stands in for the inference backend. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/key.h"
#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"

static th_proc fake, gw;
static char backend[64], model_dir[300];

static void setup(void)
{
    if (th_init_with_model("faults", WORKER_BIN, model_dir, sizeof model_dir) != 0) abort();
    const char *fargs[] = {"--delay-ms", "50", "--events", "5", NULL};
    if (th_start_fake(&fake, FAKE_BACKEND_BIN, "fake", fargs) != 0) th_die("fake backend", &fake);
    snprintf(backend, sizeof backend, "http://127.0.0.1:%d", fake.port);
    const char *extra[] = {"--backend", backend, "--backend-timeout-ms", "1500", "--heartbeat-ms",
                           "200",       NULL};
    if (th_start_gateway(&gw, CHUNKGATE_BIN, "gw", extra) != 0) th_die("gateway", &gw);
}

static void teardown(void)
{
    th_stop_clean(&gw, "chunkgate");
    th_stop(&fake, SIGTERM);
    th_cleanup(th_failures);
}

static void assert_serves(int port)
{
    th_resp r;
    th_http(&r, port, "POST", "/v1/completions",
            "{\"model\":\"m\",\"prompt\":\"still # # serving # # ?\",\"max_tokens\":1}", NULL,
            NULL);
    ck_assert_msg(r.status == 200, "the gateway does not serve: HTTP %ld", r.status);
    th_resp_free(&r);
}

/* The streamed answer to prompt: events (data payloads), with checks common to all. */
static int stream(const char *prompt, char ***ev, double *secs)
{
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s\",\"stream\":true}", prompt);
    long status;
    int n;
    double t0 = th_now_s();
    CURLcode rc = th_sse_data(gw.port, "/v1/completions", body, NULL, &status, ev, &n);
    *secs = th_now_s() - t0;
    ck_assert_msg(rc == CURLE_OK, "curl %d", (int)rc);
    ck_assert_int_eq(status, 200);
    return n;
}

static const char *error_code(const char *event)
{
    static char code[64];
    json_t *j = json_loads(event, 0, NULL);
    snprintf(code, sizeof code, "%s",
             json_string_value(json_object_get(json_object_get(j, "error"), "code")) ?: "");
    json_decref(j);
    return code;
}

/* ------------------------------------------------------------ backend faults */

START_TEST(backend_stream_faults)
{
    char **ev;
    double secs;
    /* stalls after 2 events for longer than --backend-timeout-ms: error event, no [DONE] */
    int n = stream("FAULT:MIDSTALL:5000 # # d # # q", &ev, &secs);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(error_code(ev[2]), "upstream_timeout");
    ck_assert_double_lt(secs, 4.5);
    th_sse_data_free(ev, n);
    /* an error event from the backend, then its [DONE]: relayed, and no [DONE] after it */
    n = stream("FAULT:ERRDONE # # d # # q", &ev, &secs);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(error_code(ev[2]), "internal_error");
    th_sse_data_free(ev, n);
    /* a body that ends without [DONE]: cut, so an error event and no [DONE] */
    n = stream("FAULT:NODONE # # d # # q", &ev, &secs);
    ck_assert_int_eq(n, 6);
    ck_assert_str_eq(error_code(ev[5]), "bad_gateway");
    th_sse_data_free(ev, n);
    /* a TCP reset after 2 events: error event, no [DONE] */
    n = stream("FAULT:RST # # d # # q", &ev, &secs);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(error_code(ev[2]), "bad_gateway");
    th_sse_data_free(ev, n);
    /* invalid SSE: a data event that is not JSON is relayed as it came (the gateway edits only
     * the events it must), lines without a colon and unknown fields are ignored (WHATWG), and
     * chunk_cache goes on the first data event that is a JSON object; [DONE] as usual */
    n = stream("FAULT:BADSSE # # d # # q", &ev, &secs);
    ck_assert_int_eq(n, 7);
    ck_assert_str_eq(ev[0], "{\"id\": \"cmpl-fake\", not json");
    json_t *j = json_loads(ev[1], 0, NULL);
    ck_assert_ptr_nonnull(json_object_get(j, "chunk_cache"));
    json_decref(j);
    ck_assert_str_eq(ev[n - 1], "[DONE]");
    th_sse_data_free(ev, n);
    /* a line longer than the parser's cap (1 MiB): the stream ends with an error event, the
     * upstream is dropped, memory stays bounded */
    n = stream("FAULT:HUGESSE:3000000 # # d # # q", &ev, &secs);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(error_code(ev[1]), "bad_gateway");
    th_sse_data_free(ev, n);
    ck_assert_double_ge(th_metric(gw.port, "chunkgate_backend_errors_total{kind=\"stream\"}"), 3);
    /* not streamed: a reset or invalid JSON before any byte to the client is a plain 502 */
    th_resp r;
    th_http(&r, gw.port, "POST", "/v1/completions",
            "{\"model\":\"m\",\"prompt\":\"FAULT:BADJSON\"}", NULL, NULL);
    ck_assert(th_is_error(&r, 502, "bad_gateway"));
    th_resp_free(&r);
    th_http(&r, gw.port, "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"FAULT:500\"}",
            NULL, NULL);
    ck_assert(th_is_error(&r, 500, "fake_500"));
    th_resp_free(&r);
    /* the backend refuses the gateway's --backend-api-key: a 502 that says so, not the
     * client's 401 invalid_api_key */
    th_http(&r, gw.port, "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"FAULT:401\"}",
            NULL, NULL);
    ck_assert(th_is_error(&r, 502, "bad_gateway"));
    ck_assert_ptr_nonnull(strstr(r.body.data, "--backend-api-key"));
    th_resp_free(&r);
    assert_serves(gw.port);
}
END_TEST

/* ------------------------------------------------------------ worker faults */

typedef struct call {
    int port;
    const char *body;
    int stream;
    th_resp r;
    double secs;
} call;

static void *do_call(void *arg)
{
    call *c = arg;
    double t0 = th_now_s();
    th_http(&c->r, c->port, "POST", "/v1/completions", c->body, NULL, NULL);
    c->secs = th_now_s() - t0;
    return NULL;
}

/* A long cold assemble: one 12 KB document (about 12,000 tokens: seconds of compute even on a
 * fast machine; the test kills the worker 400 ms in). */
static char *long_prompt(int stream)
{
    cg_buf doc;
    cg_buf_init_unbounded(&doc);
    for (int i = 0; doc.len < 12000; i++) {
        cg_status st =
            cg_buf_printf(&doc, "Paragraph %d of the long record describes site %d. ", i, i * 7);
        ck_assert_int_eq(st, CG_OK);
    }
    json_t *b = json_pack("{s:s, s:s+++, s:i, s:b}", "model", MODEL, "prompt", "Long system. # # ",
                          doc.data, " # # ", "Summarise.", "max_tokens", 2, "stream", stream);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    cg_buf_free(&doc);
    return s;
}

/* Kills the worker 400 ms into the request; returns the finished call. */
static void kill_during(call *c, th_proc *w)
{
    pthread_t th;
    pthread_create(&th, NULL, do_call, c);
    th_sleep_ms(400);
    ck_assert_int_eq(kill(w->pid, SIGKILL), 0);
    pthread_join(th, NULL);
    th_wait_exit(w, 5000);
    char *log = th_read_file(w->log, NULL);
    ck_assert_msg(!strstr(log, "\"msg\":\"assembly "), "the assemble finished before the kill");
    free(log);
}

START_TEST(worker_killed_during_assemble)
{
    /* with --backend: the client gets the backend's answer to the plain prompt */
    th_proc w1, g1;
    ck_assert_int_eq(th_start_worker(&w1, WORKER_BIN, model_dir, 0, "kill1", NULL), 0);
    const char *e1[] = {"--backend", backend, "--health-interval-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g1, CHUNKGATE_BIN, "gkill1", w1.url, NULL, e1), 0);
    char *body = long_prompt(0);
    call c = {.port = g1.port, .body = body};
    kill_during(&c, &w1);
    ck_assert_msg(c.r.status == 200, "HTTP %ld", c.r.status);
    json_t *j = th_json(&c.r);
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(json_is_true(json_object_get(cc, "fallback")));
    ck_assert_str_eq(json_string_value(json_object_get(cc, "fallback_reason")), "worker_error");
    json_decref(j);
    fprintf(stderr, "worker killed during assemble: fallback answer after %.2f s\n", c.secs);
    th_resp_free(&c.r);
    ck_assert_double_ge(th_metric(g1.port, "chunkgate_worker_errors_total{kind=\"connect\"}") +
                            th_metric(g1.port, "chunkgate_worker_errors_total{kind=\"invalid\"}"),
                        1);
    ck_assert(th_wait_worker(g1.port, NULL, w1.url, 0));
    assert_serves(g1.port);
    ck_assert_int_eq(th_stop(&g1, SIGTERM), 0);
    free(body);

    /* without --backend and no other worker: a clean 503 at once, streamed or not */
    for (int s = 0; s <= 1; s++) {
        th_proc w2, g2;
        char name[32];
        snprintf(name, sizeof name, "kill2-%d", s);
        ck_assert_int_eq(th_start_worker(&w2, WORKER_BIN, model_dir, 0, name, NULL), 0);
        const char *e2[] = {"--health-interval-ms", "200", NULL};
        snprintf(name, sizeof name, "gkill2-%d", s);
        ck_assert_int_eq(th_start_gateway_to(&g2, CHUNKGATE_BIN, name, w2.url, NULL, e2), 0);
        body = long_prompt(s);
        call c2 = {.port = g2.port, .body = body};
        kill_during(&c2, &w2);
        ck_assert_msg(th_is_error(&c2.r, 503, "upstream_unavailable"), "stream %d: HTTP %ld %.*s",
                      s, c2.r.status, (int)c2.r.body.len, c2.r.body.data);
        ck_assert_double_lt(c2.secs, 10);
        th_resp_free(&c2.r);
        ck_assert_int_eq(th_stop(&g2, SIGTERM), 0);
        free(body);
    }
}
END_TEST

static const char *DOCS[] = {
    "Doc 0. Annual rainfall in the valley averaged 812 millimetres between 1990 and 2020.",
    "Doc 1. The cooperative's bylaws were amended in March: members may vote by post.",
    "Doc 2. The river flooded twice in 2023 and the levee was raised by one metre.",
    "Doc 3. Ferry schedules changed in June: boats now leave every forty minutes.",
    "Doc 4. The library extended its opening hours to Sundays and added a repair cafe.",
    "Doc 5. A new bus line links the station to the hospital every twelve minutes.",
    "Doc 6. The school canteen switched suppliers and serves a vegetarian dish daily.",
    "Doc 7. Street lighting was replaced with LED lamps on all main roads.",
    "Doc 8. The town hall roof was repaired after the storm of January.",
    "Doc 9. Parking fees in the centre doubled and a park-and-ride opened.",
};

START_TEST(full_disk_tier_keeps_serving)
{
    th_proc w, g;
    const char *we[] = {"--pool-mb", "2", "--disk-mb", "1", NULL};
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "fulldisk", we), 0);
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gfull", w.url, NULL, NULL), 0);
    int served = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 10; i++) {
            char body[1024];
            snprintf(body, sizeof body,
                     "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"prompt\":\"System. # # %s # # %s "
                     "# # Question?\"}",
                     DOCS[i], DOCS[(i + 3) % 10]);
            th_resp r;
            th_http(&r, g.port, "POST", "/v1/completions", body, NULL, NULL);
            ck_assert_msg(r.status == 200, "HTTP %ld %.*s", r.status, (int)r.body.len, r.body.data);
            json_t *j = th_json(&r);
            ck_assert(
                json_is_false(json_object_get(json_object_get(j, "chunk_cache"), "fallback")));
            json_decref(j);
            th_resp_free(&r);
            served++;
        }
    double spills = th_metric(w.port, "chunkgate_worker_spills_total");
    double drops = th_metric(w.port, "chunkgate_worker_disk_drops_total");
    fprintf(stderr, "full disk tier: %d requests served, %.0f spills, %.0f disk drops\n", served,
            spills, drops);
    ck_assert_double_gt(spills, 0);
    ck_assert_double_gt(drops, 0); /* the disk was full and made room */
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* ------------------------------------------------------------ data directories */

/* A directory this process (root: as nobody) cannot read or write. */
static void unreadable_dir(const char *path)
{
    ck_assert_int_eq(mkdir(path, 0700), 0);
    if (geteuid() != 0) ck_assert_int_eq(chmod(path, 0), 0);
    /* as root the spawned process runs as nobody, for whom a root-owned 0700 is closed */
}

START_TEST(unreadable_data_dir_refuses_to_start)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/closed-w", th_root());
    unreadable_dir(dir);
    char listen[] = "127.0.0.1:0";
    const char *wa[] = {"serve", "--model", model_dir, "--listen", listen, "--data-dir", dir, NULL};
    th_proc w;
    ck_assert_int_eq(th_spawn(&w, WORKER_BIN, wa, NULL, "closed-w.log", NULL, 1), 0);
    int rc = th_wait_exit(&w, 30000);
    char *log = th_read_file(w.log, NULL);
    ck_assert_msg(rc == 1, "worker exit %d: %s", rc, log);
    ck_assert_msg(strstr(log, "data dir") && strstr(log, "Permission denied"), "%s", log);
    fprintf(stderr, "worker, unreadable data dir: exit %d: %.*s\n", rc, (int)strcspn(log, "\n"),
            log);
    free(log);

    snprintf(dir, sizeof dir, "%s/closed-g", th_root());
    unreadable_dir(dir);
    const char *ga[] = {"--listen", "127.0.0.1:0", "--data-dir", dir, "--backend", backend, NULL};
    th_proc g;
    ck_assert_int_eq(th_spawn(&g, CHUNKGATE_BIN, ga, NULL, "closed-g.log", NULL, 1), 0);
    rc = th_wait_exit(&g, 30000);
    log = th_read_file(g.log, NULL);
    ck_assert_msg(rc == 1, "gateway exit %d: %s", rc, log);
    ck_assert_msg(strstr(log, "not readable and writable"), "%s", log);
    fprintf(stderr, "gateway, unreadable data dir: exit %d\n", rc);
    free(log);
}
END_TEST

START_TEST(read_only_index_refuses_to_start)
{
    char dir[400], db[450];
    snprintf(dir, sizeof dir, "%s/ro-data", th_root());
    snprintf(db, sizeof db, "%s/index.db", dir);
    /* a first run creates the index, then it is made read-only for the gateway's user */
    th_proc g;
    const char *ga[] = {"--listen", "127.0.0.1:0", "--data-dir", dir, "--backend", backend, NULL};
    ck_assert_int_eq(th_spawn(&g, CHUNKGATE_BIN, ga, NULL, "ro1.log", "listening on 127.0.0.1:", 0),
                     0);
    assert_serves(g.port);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    if (geteuid() == 0) {
        ck_assert_int_eq(chown(dir, 65534, 65534), 0); /* the directory is nobody's */
        ck_assert_int_eq(chmod(db, 0644), 0);          /* the file root's: read-only to nobody */
    } else {
        ck_assert_int_eq(chmod(db, 0444), 0);
    }
    ck_assert_int_eq(th_spawn(&g, CHUNKGATE_BIN, ga, NULL, "ro2.log", NULL, 1), 0);
    int rc = th_wait_exit(&g, 30000);
    char *log = th_read_file(g.log, NULL);
    ck_assert_msg(rc == 1, "gateway exit %d: %s", rc, log);
    ck_assert_msg(strstr(log, "read-only"), "%s", log);
    fprintf(stderr, "gateway, read-only index: exit %d\n", rc);
    free(log);
}
END_TEST

/* ------------------------------------------------------------ index locked */

static sqlite3 *lock_index(const char *db)
{
    sqlite3 *s = NULL;
    ck_assert_int_eq(sqlite3_open(db, &s), SQLITE_OK);
    sqlite3_busy_timeout(s, 5000); /* the gateway's writer may be inside a transaction */
    ck_assert_int_eq(sqlite3_exec(s, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
    return s;
}

static void unlock_index(sqlite3 *s)
{
    ck_assert_int_eq(sqlite3_exec(s, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(s);
}

/* n requests, each with a fresh document; returns the worst latency in ms. */
static double send_docs(int port, const char *tag, int n)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"prompt\":\"sys # # doc %s %d # # q\",\"max_tokens\":1}", tag,
                 i);
        th_resp r;
        th_http(&r, port, "POST", "/v1/completions", body, NULL, NULL);
        ck_assert_msg(r.status == 200, "HTTP %ld", r.status);
        worst = CG_MAX(worst, r.secs * 1e3);
        th_resp_free(&r);
    }
    return worst;
}

static int index_has(int port, const char *tag, int i)
{
    char doc[64], body[256];
    snprintf(doc, sizeof doc, "doc %s %d", tag, i);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"sys # # %s # # q\"}", doc);
    json_t *j = th_call_text(port, "POST", "/v1/chunks/lookup", body, NULL, 200);
    int found =
        json_is_true(json_object_get(json_array_get(json_object_get(j, "data"), 1), "found"));
    json_decref(j);
    return found;
}

START_TEST(locked_index_keeps_serving)
{
    th_proc g;
    const char *ge[] = {"--backend", backend, "--index-busy-timeout-ms", "500", NULL};
    ck_assert_int_eq(th_start_gateway(&g, CHUNKGATE_BIN, "glock", ge), 0);
    char db[450];
    snprintf(db, sizeof db, "%s/glock-data/index.db", th_root());
    send_docs(g.port, "warm", 1);

    /* a short lock (300 ms) is waited out: nothing is lost */
    sqlite3 *s = lock_index(db);
    double w1 = send_docs(g.port, "short", 5);
    th_sleep_ms(300);
    unlock_index(s);
    for (int i = 0; i < 5; i++)
        ck_assert_msg(index_has(g.port, "short", i), "write %d lost after a short lock", i);
    ck_assert_double_eq(th_metric(g.port, "chunkgate_index_writer_ops_failed_total"), 0);

    /* a long lock (held until a batch gave up: 3 x 500 ms): requests go on, the batch is
     * given up and counted */
    s = lock_index(db);
    double w2 = send_docs(g.port, "long", 5);
    th_expect(g.port, "GET", "/readyz", NULL, NULL, 200);
    double failed = 0;
    for (int i = 0; i < 100 && failed <= 0; i++) {
        failed = th_metric(g.port, "chunkgate_index_writer_ops_failed_total");
        if (failed <= 0) th_sleep_ms(50);
    }
    unlock_index(s);
    ck_assert_double_gt(failed, 0);
    /* after the lock: new writes land, the index is whole */
    send_docs(g.port, "after", 3);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(index_has(g.port, "after", i), "write %d lost after the lock", i);
    fprintf(stderr,
            "locked index: worst request latency %.1f ms (short lock), %.1f ms (long lock); "
            "%.0f index updates given up and counted\n",
            w1, w2, failed);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    /* the file is consistent */
    char *check = th_sql_text(db, "PRAGMA integrity_check");
    ck_assert_str_eq(check, "ok");
    free(check);
}
END_TEST

/* ------------------------------------------------------------ worker stand-ins */

/* Starts tests/fake_backend as a worker stand-in (its /v1/info a real worker's, with
 * key_version replaced when not NULL) whose POST /v1/assemble answers 429 text/plain, as a
 * proxy in front of an overloaded worker may. */
static void start_stand_in(th_proc *sp, const char *name, const char *key_version, int port)
{
    th_proc w;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, name, NULL), 0);
    json_t *info = th_call_text(w.port, "GET", "/v1/info", NULL, NULL, 200);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
    if (key_version) json_object_set_new(info, "key_version", json_string(key_version));
    char path[400], log[64];
    snprintf(path, sizeof path, "%s/%s-info.json", th_root(), name);
    char *text = th_dumps(info);
    ck_assert_int_eq(th_write_file(path, text), 0);
    free(text);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    const char *args[] = {"--worker-info", path, "--port", ps, NULL};
    snprintf(log, sizeof log, "%s-stand-in.log", name);
    ck_assert_int_eq(th_spawn(sp, FAKE_BACKEND_BIN, args, NULL, log, "PORT ", 0), 0);
    snprintf(sp->url, sizeof sp->url, "http://127.0.0.1:%d", sp->port);
}

START_TEST(worker_429_text_plain_is_a_rate_limit_error)
{
    th_proc s, g;
    start_stand_in(&s, "busy", NULL, 0);
    const char *ge[] = {"--health-interval-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gbusy", s.url, NULL, ge), 0);
    for (int stream = 0; stream <= 1; stream++) {
        char body[256], ra[16];
        snprintf(body, sizeof body,
                 "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"stream\":%s,"
                 "\"prompt\":\"Sys. # # A document. # # Why?\"}",
                 stream ? "true" : "false");
        th_resp r;
        th_http(&r, g.port, "POST", "/v1/completions", body, NULL, NULL);
        ck_assert_msg(th_is_error(&r, 429, "rate_limit_exceeded"), "HTTP %ld %.*s", r.status,
                      (int)r.body.len, r.body.data ? r.body.data : "");
        ck_assert_str_eq(th_header(&r, "Retry-After", ra, sizeof ra), "1");
        th_resp_free(&r);
    }
    /* and it keeps serving */
    th_expect(g.port, "GET", "/healthz", NULL, NULL, 200);
    ck_assert_double_ge(th_metric(g.port, "chunkgate_worker_busy_total"), 2);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    th_stop(&s, SIGTERM);
}
END_TEST

/* Two workers behind an overloaded proxy (429 to every assemble) and one real worker: every
 * request reaches the real one, whichever worker its route picks first, and asks each busy one
 * at most once. */
START_TEST(busy_workers_are_each_asked_once)
{
    enum { N = 6 };
    th_proc a, b, w, g;
    start_stand_in(&a, "busy-a", NULL, 0);
    start_stand_in(&b, "busy-b", NULL, 0);
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "free", NULL), 0);
    char wurl[64];
    snprintf(wurl, sizeof wurl, "http://127.0.0.1:%d", w.port);
    const char *ge[] = {"--worker", b.url, "--worker", wurl, "--health-interval-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gthree", a.url, NULL, ge), 0);
    ck_assert(th_wait_worker(g.port, NULL, b.url, 1));
    ck_assert(th_wait_worker(g.port, NULL, wurl, 1));
    for (int i = 0; i < N; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\":\"" MODEL "\",\"max_tokens\":1,"
                 "\"prompt\":\"Sys. # # Document number %d. # # Why?\"}",
                 i);
        th_resp r;
        th_http(&r, g.port, "POST", "/v1/completions", body, NULL, NULL);
        ck_assert_msg(r.status == 200, "request %d: HTTP %ld %.*s", i, r.status, (int)r.body.len,
                      r.body.data ? r.body.data : "");
        th_resp_free(&r);
    }
    long asked = 0;
    for (th_proc *s = &a; s; s = s == &a ? &b : NULL) {
        json_t *st = th_call(s->port, "GET", "/stats", NULL, NULL, 200);
        long n = (long)json_integer_value(json_object_get(st, "assembles"));
        ck_assert_int_le(n, N);
        asked += n;
        json_decref(st);
    }
    ck_assert_double_eq(th_metric(g.port, "chunkgate_worker_busy_total"), (double)asked);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    th_stop(&w, SIGTERM);
    th_stop(&b, SIGTERM);
    th_stop(&a, SIGTERM);
}
END_TEST

/* 1 when the gateway at gport lists the worker at url as healthy. */
static int listed_healthy(int gport, const char *url)
{
    json_t *w = th_worker_view(gport, NULL, url);
    int ok = w && json_is_true(json_object_get(w, "healthy"));
    json_decref(w);
    return ok;
}

static int stand_in_down(void *arg)
{
    const th_proc *g = ((const th_proc *const *)arg)[0], *s = ((const th_proc *const *)arg)[1];
    return !listed_healthy(g->port, s->url);
}

/* A worker whose health probe times out once stays in routing; two timeouts in a row take it
 * out, and it is back once it answers in time again. */
START_TEST(one_slow_health_check_keeps_the_worker)
{
    th_proc s, g;
    start_stand_in(&s, "slowhz", NULL, 0);
    /* a timeout well above an ordinary probe's time on a loaded machine, and stalls well
     * above the timeout */
    const char *ge[] = {"--health-interval-ms", "100", "--health-timeout-ms", "500", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gslowhz", s.url, NULL, ge), 0);
    th_expect(s.port, "POST", "/control/healthz-stall?ms=1500&count=1", "", NULL, 200);
    for (double t0 = th_now_s(); th_now_s() - t0 < 3; th_sleep_ms(10))
        ck_assert_msg(listed_healthy(g.port, s.url), "one missed health check took it out");
    ck_assert(th_file_has(g.log, "missed a health check"));
    th_expect(s.port, "POST", "/control/healthz-stall?ms=1500&count=3", "", NULL, 200);
    const th_proc *both[] = {&g, &s};
    ck_assert_msg(th_wait_until(10000, 10, stand_in_down, (void *)both),
                  "two missed health checks in a row left it in routing");
    ck_assert(th_wait_worker(g.port, NULL, s.url, 1));
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    th_stop(&s, SIGTERM);
}
END_TEST

/* A worker that answers its completion with a server error (here a stand-in asked to, for a
 * plain prompt that goes straight to it) is counted as that worker's failure, as a failed
 * assemble is: in its errors and in chunkgate_worker_errors_total{kind="status"}. */
START_TEST(worker_completion_5xx_is_the_workers_error)
{
    th_proc s, g;
    start_stand_in(&s, "w500", NULL, 0);
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gw500", s.url, NULL, NULL), 0);
    double before = th_metric(g.port, "chunkgate_worker_errors_total{kind=\"status\"}");
    th_resp r;
    th_http(&r, g.port, "POST", "/v1/completions",
            "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"prompt\":\"FAULT:500 plain\"}", NULL,
            NULL);
    ck_assert_int_eq(r.status, 500);
    th_resp_free(&r);
    json_t *w = th_worker_view(g.port, NULL, s.url);
    ck_assert_int_eq(json_integer_value(json_object_get(w, "errors")), 1);
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(w, "last_error")), "HTTP 500"));
    json_decref(w);
    ck_assert_double_eq(th_metric(g.port, "chunkgate_worker_errors_total{kind=\"status\"}"),
                        before + 1);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    th_stop(&s, SIGTERM);
}
END_TEST

START_TEST(worker_of_another_key_version_is_refused)
{
    th_proc s, g, w;
    th_resp r;
    start_stand_in(&s, "kv", "chunkgate-key-v0", 0);
    /* configured and reachable at start-up: the gateway refuses to start, as for any worker
     * that does not match, and the log says why */
    const char *ge[] = {"--worker", s.url, NULL};
    ck_assert_int_eq(th_start_gateway(&g, CHUNKGATE_BIN, "gkv", ge), -1);
    ck_assert_int_ne(th_wait_exit(&g, 20000), 0);
    ck_assert(th_file_has(g.log, "key_version 'chunkgate-key-v0'"));
    th_stop(&s, SIGTERM);

    /* configured while down, up later with another key version: out of routing */
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    const char *ge2[] = {"--worker", url, "--health-interval-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway(&g, CHUNKGATE_BIN, "gkv1", ge2), 0);
    start_stand_in(&s, "kv1", "chunkgate-key-v0", port);
    int refused = 0;
    for (int i = 0; i < 150 && !refused; i++) {
        json_t *ws = th_call_text(g.port, "GET", "/v1/workers", NULL, NULL, 200);
        const char *state = th_sget(json_array_get(json_object_get(ws, "data"), 0), "state");
        refused = state && !strcmp(state, "refused");
        json_decref(ws);
        if (!refused) th_sleep_ms(100);
    }
    ck_assert_msg(refused, "the worker of another key version is not refused");
    ck_assert(th_file_has(g.log, "key_version 'chunkgate-key-v0'"));
    th_http(&r, g.port, "POST", "/v1/completions",
            "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"prompt\":\"S. # # D. # # Q?\"}", NULL,
            NULL);
    ck_assert_msg(r.status == 503, "HTTP %ld", r.status);
    th_resp_free(&r);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);

    /* registered at run time: 409, and the log says why */
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "kvreal", NULL), 0);
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gkv2", w.url, NULL, NULL), 0);
    char body[160];
    snprintf(body, sizeof body, "{\"url\":\"%s\"}", s.url);
    th_http(&r, g.port, "POST", "/v1/workers", body, NULL, NULL);
    th_assert_error(&r, 409, "conflict", "url");
    th_resp_free(&r);
    ck_assert(th_file_has(g.log, "key_version 'chunkgate-key-v0'"));
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
    th_stop(&s, SIGTERM);
}
END_TEST

/* What the gateway refuses at the main path's door: echo with logprobs on a prompt it would
 * assemble (the worker would answer without the prompt's logprobs, as there is no causal
 * forward of it), and a worker URL with credentials in it (shown in /metrics, /v1/workers,
 * /v1/stats and the logs). */
START_TEST(main_path_refusals)
{
    th_proc w, g;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "refuse", NULL), 0);
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "grefuse", w.url, NULL, NULL), 0);
    th_resp r;
    th_http(&r, g.port, "POST", "/v1/completions",
            "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"echo\":true,\"logprobs\":1,"
            "\"prompt\":\"Sys. # # D. # # Q?\"}",
            NULL, NULL);
    th_assert_error(&r, 400, "invalid_value", "echo");
    th_resp_free(&r);
    /* without separators the worker scores the prompt itself */
    json_t *j = th_call_text(g.port, "POST", "/v1/completions",
                             "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"echo\":true,"
                             "\"logprobs\":1,\"prompt\":\"Plain.\"}",
                             NULL, 200);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    ck_assert_uint_ge(json_array_size(json_object_get(lp, "tokens")), 6);
    json_decref(j);

    char body[200];
    snprintf(body, sizeof body, "{\"url\":\"http://user:pw@127.0.0.1:%d\"}", w.port);
    th_http(&r, g.port, "POST", "/v1/workers", body, NULL, NULL);
    th_assert_error(&r, 400, "invalid_value", "url");
    th_resp_free(&r);
    json_t *ws = th_call_text(g.port, "GET", "/v1/workers", NULL, NULL, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(ws, "data")), 1);
    json_decref(ws);
    char *metrics = th_scrape(g.port);
    ck_assert_ptr_null(strstr(metrics, "user:pw"));
    free(metrics);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    char url[96];
    snprintf(url, sizeof url, "http://user:pw@127.0.0.1:%d", w.port);
    const char *ge[] = {"--worker", url, NULL};
    ck_assert_int_eq(th_start_gateway(&g, CHUNKGATE_BIN, "gcreds", ge), -1);
    ck_assert_int_ne(th_wait_exit(&g, 20000), 0);
    ck_assert(th_file_has(g.log, "must not hold credentials"));
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* A gateway started before its worker (compose, systemd): the worker is down at first, and
 * once it listens the gateway must use it within about half a second, not a whole
 * --health-interval-ms (5 s here) later, while /healthz already says 200. */
START_TEST(worker_up_after_gateway_serves_at_once)
{
    int port = th_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    th_proc g, w;
    const char *ge[] = {"--worker", url, "--health-interval-ms", "5000", NULL};
    ck_assert_int_eq(th_start_gateway(&g, CHUNKGATE_BIN, "gup", ge), 0);
    th_expect(g.port, "GET", "/healthz", NULL, NULL, 200);
    th_expect(g.port, "GET", "/readyz", NULL, NULL, 503);
    th_resp r;
    th_http(&r, g.port, "GET", "/v1/models", NULL, NULL, NULL);
    ck_assert_msg(r.status == 503, "HTTP %ld", r.status);
    th_resp_free(&r);
    th_sleep_ms(1500); /* the gateway has probed it down a few times */
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, port, "up", NULL), 0);
    double t0 = th_now_s(), took = -1;
    while (th_now_s() - t0 < 8) {
        th_http(&r, g.port, "GET", "/v1/models", NULL, NULL, NULL);
        long st = r.status;
        th_resp_free(&r);
        if (st == 200) {
            took = th_now_s() - t0;
            break;
        }
        th_sleep_ms(20);
    }
    ck_assert_msg(took >= 0 && took < 1.5,
                  "/v1/models answered 200 %.2f s after the worker came up", took);
    th_expect(g.port, "GET", "/readyz", NULL, NULL, 200);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* ------------------------------------------------------------ clients that leave */

/* What the gateway and its worker must let go of once a client left. */
typedef struct gone_watch {
    int gport, wport;
    const char *worker_gauge; /* the worker's series that must fall to 0 */
} gone_watch;

static int upstream_idle(void *arg)
{
    gone_watch *gw_ = arg;
    return th_metric(gw_->gport, "chunkgate_upstream_in_flight") == 0 &&
           th_metric(gw_->wport, gw_->worker_gauge) == 0;
}

/* A streamed client that leaves after 1 s while the backend is silent: 10 s before its first
 * byte (the gateway has not answered the client yet), or 10 s after its first two events (the
 * stream is open and parked). Only the heartbeat shows that the client left: a failed write,
 * or the parked connection's end. That must cancel the upstream transfer and release the
 * assembly on its worker within a heartbeat or two, not when the backend speaks again. */
START_TEST(stream_client_gone_while_backend_silent)
{
    th_proc w, g;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "gone", NULL), 0);
    const char *ge[] = {"--backend", backend, "--heartbeat-ms", "200", "--backend-timeout-ms",
                        "30000",     NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "ggone", w.url, NULL, ge), 0);
    const char *faults[] = {"FAULT:STALL:10000", "FAULT:MIDSTALL:10000"};
    for (int i = 0; i < 2; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\":\"" MODEL "\",\"stream\":true,\"prompt\":\"Sys. # # A document "
                 "for the silent backend. # # %s Why?\"}",
                 faults[i]);
        th_sse s = {.timeout_s = 1};
        double t0 = th_now_s();
        th_sse_post(&s, g.port, "/v1/completions", body, NULL);
        /* nothing before the first byte; the first two events before the stall */
        ck_assert_int_eq(s.data_blocks, i ? 2 : 0);
        th_sse_free(&s);
        gone_watch gwch = {g.port, w.port, "chunkgate_worker_assemblies_live"};
        ck_assert_msg(th_wait_until(1500, 20, upstream_idle, &gwch),
                      "%s: %.1f s after the client left: upstream_in_flight %.0f, "
                      "assemblies_live %.0f",
                      faults[i], th_now_s() - t0 - 1,
                      th_metric(g.port, "chunkgate_upstream_in_flight"),
                      th_metric(w.port, "chunkgate_worker_assemblies_live"));
        ck_assert_double_lt(th_now_s() - t0, 5);
    }
    ck_assert_double_ge(th_metric(g.port, "chunkgate_client_disconnects_total"), 1);
    assert_serves(g.port);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* 1 once the stand-in at *(int *)arg saw an assemble's caller hang up. */
static int assemble_abandoned(void *arg)
{
    json_t *st = th_call(*(int *)arg, "GET", "/stats", NULL, NULL, 200);
    int gone = json_integer_value(json_object_get(st, "assembles_abandoned")) > 0;
    json_decref(st);
    return gone;
}

static int counted_499(void *port)
{
    return th_metric(*(int *)port,
                     "chunkgate_requests_total{route=\"completions\",code=\"499\"}") == 1;
}

static int logged_assemble_cancel(void *log)
{
    return th_file_has(log, "client left during the assemble");
}

/* A client that leaves while the gateway waits on the worker's assemble (a cold prompt being
 * computed) cancels it within a heartbeat or two: the worker sees its caller go, which stops
 * its computing (test_engine's test_client_left), and the gateway counts a disconnect, not a
 * worker error. */
START_TEST(client_gone_during_assemble_cancels_it)
{
    th_proc s, g;
    start_stand_in(&s, "slowasm", NULL, 0);
    const char *ge[] = {"--heartbeat-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gslowasm", s.url, NULL, ge), 0);
    th_expect(s.port, "POST", "/control/assemble-stall?ms=30000", "", NULL, 200);
    double d0 = th_metric(g.port, "chunkgate_client_disconnects_total");
    th_req q = {.path = "/v1/completions",
                .body = "{\"model\":\"" MODEL "\",\"max_tokens\":1,"
                        "\"prompt\":\"Sys. # # A cold document. # # Q?\"}",
                .timeout_s = 1};
    th_resp r;
    th_send(&r, g.port, &q);
    ck_assert_int_eq(r.status, 0); /* still assembling when the client gave up */
    th_resp_free(&r);
    ck_assert_msg(th_wait_until(5000, 20, assemble_abandoned, &s.port),
                  "the assemble ran on after its client left");
    ck_assert(th_wait_until(2000, 20, logged_assemble_cancel, (void *)g.log));
    ck_assert_double_eq(th_metric(g.port, "chunkgate_client_disconnects_total"), d0 + 1);
    /* counted as nginx counts a client that closed its request, not as a server error (the
     * count is made when the HTTP layer ends the request, just after the log line) */
    ck_assert(th_wait_until(5000, 20, counted_499, &g.port));
    ck_assert_double_le(/* -1: no such series */
                        th_metric(g.port,
                                  "chunkgate_requests_total{route=\"completions\",code=\"503\"}"),
                        0);
    json_t *w = th_worker_view(g.port, NULL, s.url);
    ck_assert_int_eq(json_integer_value(json_object_get(w, "errors")), 0);
    ck_assert(json_is_true(json_object_get(w, "healthy")));
    json_decref(w);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    th_stop(&s, SIGTERM);
}
END_TEST

/* A client that gives up on a long non-streamed completion: nothing is written to it before
 * the end, so only the parked connection's end shows that it left. The gateway must cancel its
 * upstream transfer, and the worker (the backend here) stop decoding and free the sequence,
 * within about a second, not when max_tokens is reached. */
START_TEST(non_stream_client_gone_cancels_decode)
{
    th_proc w, g;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "gone-ns", NULL), 0);
    const char *ge[] = {"--heartbeat-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "ggone-ns", w.url, NULL, ge), 0);
    th_req q = {.path = "/v1/completions",
                .body = "{\"model\":\"" MODEL "\",\"max_tokens\":20000,"
                        "\"prompt\":\"Sys. # # A document to decode after. # # Go on.\"}",
                .timeout_s = 1};
    th_resp r;
    double t0 = th_now_s();
    th_send(&r, g.port, &q);
    ck_assert_int_eq(r.status, 0); /* still decoding when the client gave up */
    th_resp_free(&r);
    ck_assert_double_eq(th_metric(w.port, "chunkgate_worker_sequences_running"), 1);
    gone_watch gwch = {g.port, w.port, "chunkgate_worker_sequences_running"};
    ck_assert_msg(th_wait_until(2500, 20, upstream_idle, &gwch),
                  "%.1f s after the client left: upstream_in_flight %.0f, sequences_running %.0f",
                  th_now_s() - t0 - 1, th_metric(g.port, "chunkgate_upstream_in_flight"),
                  th_metric(w.port, "chunkgate_worker_sequences_running"));
    ck_assert(th_file_has(g.log, "client left before the answer; upstream cancelled"));
    ck_assert(th_file_has(w.log, "client left; decoding stopped after"));
    th_expect(g.port, "POST", "/v1/completions",
              "{\"model\":\"" MODEL "\",\"max_tokens\":2,\"prompt\":\"S. # # D. # # Q?\"}", NULL,
              200);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* ------------------------------------------------------------ prompt lengths */

/* The prompt "Sys. # # <reps x a sentence> # # Q?" for model. Caller frees. */
static char *long_doc_body(const char *model, int reps)
{
    const char *sentence = "The cooperative's bylaws were amended in March: members may vote by "
                           "post and the quorum fell to one third. ";
    cg_buf b;
    cg_buf_init_unbounded(&b);
    cg_status st =
        cg_buf_printf(&b, "{\"model\":\"%s\",\"max_tokens\":1,\"prompt\":\"Sys. # # ", model);
    for (int i = 0; i < reps; i++)
        st |= cg_buf_printf(&b, "%s", sentence);
    st |= cg_buf_printf(&b, " # # Q?\"}");
    ck_assert_int_eq(st, CG_OK);
    return b.data;
}

/* Only tokens count against the model's positions. On a Llama 2 geometry (4096 positions)
 * with a SentencePiece tokenizer (tests/data/tokenizers/spm), a document of 4279 bytes is 3762
 * tokens and fits; one of 4814 bytes is 4232 tokens and does not (400 context_length_exceeded,
 * through the gateway as from the worker). "Sys." is 7 tokens for 4 bytes: the worker must
 * not assume a segment has at most bytes + 2 tokens (it wrote past such a buffer). */
START_TEST(tokens_not_bytes_count_against_positions)
{
    char dir[300], tok[400];
    snprintf(dir, sizeof dir, "%s/llama2", th_root());
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizers/spm", CG_SOURCE_DIR);
    const char *gen[] = {"--preset", "llama2", "--tokenizer", tok, NULL};
    ck_assert_int_eq(th_gen_model(WORKER_BIN, dir, gen), 0);
    th_proc w, g;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, dir, 0, "len", NULL), 0);
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "glen", w.url, NULL, NULL), 0);
    json_t *t = th_call_text(w.port, "POST", "/tokenize", "{\"prompt\":\"Sys.\"}", NULL, 200);
    ck_assert_int_gt(th_iget(t, "count"), 6);
    json_decref(t);
    char *fits = long_doc_body("chunkgate-llama2", 40),
         *too_long = long_doc_body("chunkgate-llama2", 45);
    ck_assert_uint_gt(strlen(fits), 4096 + 100);
    json_t *j = th_call_text(g.port, "POST", "/v1/completions", fits, NULL, 200);
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(!json_is_true(json_object_get(cc, "fallback")));
    json_decref(j);
    th_resp r;
    th_http(&r, g.port, "POST", "/v1/completions", too_long, NULL, NULL);
    th_assert_error(&r, 400, "context_length_exceeded", NULL);
    ck_assert_ptr_nonnull(strstr(r.body.data, "4096 positions"));
    th_resp_free(&r);
    free(fits);
    free(too_long);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

/* ------------------------------------------------------------ worker restart */

static json_t *info_of(int port)
{
    json_t *j = th_call_text(port, "GET", "/v1/info", NULL, NULL, 200);
    return j;
}

START_TEST(restarted_worker_is_resynced)
{
    int port = th_free_port();
    th_proc w, g;
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, port, "rs", NULL), 0);
    json_t *i1 = info_of(port);
    const char *id1 = json_string_value(json_object_get(i1, "instance_id"));
    ck_assert_uint_eq(strlen(id1), 32);
    long long started = json_integer_value(json_object_get(i1, "started_ms"));
    ck_assert_int_gt(started, (long long)cg_wall_ms() - 120000);
    ck_assert_int_le(started, (long long)cg_wall_ms());
    const char *ge[] = {"--health-interval-ms", "500", "--sync-interval-ms", "0", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "grs", w.url, NULL, ge), 0);
    const char *doc = "Restart document: the observatory reopens in May.";
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"prompt\":\"Sys. # # %s # # When?\"}",
             doc);
    th_expect(g.port, "POST", "/v1/completions", body, NULL, 200);
    double syncs0 = th_metric(g.port, "chunkgate_worker_syncs_total{result=\"ok\"}");
    double stale0 = th_metric(g.port, "chunkgate_stale_placements_total");

    /* kill -9 and restart on the same port at once: the cache is gone */
    ck_assert_int_eq(th_stop(&w, SIGKILL), 128 + SIGKILL);
    double t0 = th_now_s();
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, port, "rs-again", NULL), 0);
    json_t *i2 = info_of(port);
    ck_assert_str_ne(json_string_value(json_object_get(i2, "instance_id")), id1);
    int synced = 0;
    for (int i = 0; i < 300 && !synced; i++) {
        synced = th_metric(g.port, "chunkgate_worker_syncs_total{result=\"ok\"}") > syncs0;
        if (!synced) th_sleep_ms(20);
    }
    double took = th_now_s() - t0;
    ck_assert_msg(synced, "no resync within 6 s of the restart");
    char *log = th_read_file(g.log, NULL);
    ck_assert_ptr_nonnull(strstr(log, "restarted (instance "));
    free(log);
    /* the index no longer claims the chunk there, so the next request is an honest miss */
    char key[CG_KEY_HEX_LEN + 1], path[128];
    cg_key k =
        cg_key_compute(MODEL, strlen(MODEL), CG_MODE_STRICT, NULL, 0, NULL, doc, strlen(doc));
    cg_key_hex(&k, key);
    snprintf(path, sizeof path, "/v1/chunks/%s", key);
    json_t *c = th_call_text(g.port, "GET", path, NULL, NULL, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(c, "placements")), 0);
    json_decref(c);
    th_expect(g.port, "POST", "/v1/completions", body, NULL, 200);
    ck_assert_double_eq(th_metric(g.port, "chunkgate_stale_placements_total"), stale0);
    fprintf(stderr, "worker restart: resynced %.2f s after the restart began\n", took);
    json_decref(i1);
    json_decref(i2);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = th_case(s, "faults", 120,
                        TH_TESTS(backend_stream_faults, worker_killed_during_assemble,
                                 full_disk_tier_keeps_serving, unreadable_data_dir_refuses_to_start,
                                 read_only_index_refuses_to_start, locked_index_keeps_serving,
                                 restarted_worker_is_resynced));
    tcase_add_unchecked_fixture(tc, setup, teardown);
    /* Workers that misbehave at the gateway's door, each played by a stand-in. */
    tc = th_case(s, "stand-ins", 120,
                 TH_TESTS(worker_429_text_plain_is_a_rate_limit_error,
                          busy_workers_are_each_asked_once, one_slow_health_check_keeps_the_worker,
                          worker_completion_5xx_is_the_workers_error,
                          worker_of_another_key_version_is_refused,
                          worker_up_after_gateway_serves_at_once, main_path_refusals));
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tc = th_case(s, "lengths", 120, TH_TESTS(tokens_not_bytes_count_against_positions));
    tcase_add_unchecked_fixture(tc, setup, teardown);
    /* Clients that leave while the gateway waits on an upstream. */
    tc = th_case(s, "client-gone", 120,
                 TH_TESTS(stream_client_gone_while_backend_silent,
                          non_stream_client_gone_cancels_decode,
                          client_gone_during_assemble_cancels_it));
    tcase_add_unchecked_fixture(tc, setup, teardown);
    return th_run(s, CK_FORK_GETENV);
}
