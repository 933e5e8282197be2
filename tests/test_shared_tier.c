/* Integration suite for the shared KV tier on Redis and the disk write-behind (DESIGN §16), with
 * real processes on loopback: redis-server (one node, and a 3-master Redis Cluster made by
 * tests/redis_cluster.sh with redis-cli --cluster create), chunkgate-worker and chunkgate.
 *   - worker B hits the chunks worker A computed, with the same answer and the same KV bytes,
 *     on one node and on a cluster (whose keys spread over the three masters); a value read
 *     straight from Redis is a worker's per-head export plus its seal (what a TP backend reads);
 *   - values corrupted, truncated, copied under another key or written for another model are
 *     misses on a fresh worker, counted, and its answers do not change;
 *   - Redis killed (and stopped) mid-traffic: every request still succeeds; errors counted; a
 *     request pays at most one failed read; the worker reconnects when Redis is back;
 *   - kill -9 of a worker after traffic: a restart serves its chunks from disk (and, as the
 *     control, does not without the write-behind);
 *   - the gateway learns the shared tier from /v1/info, records remote presence in its index and
 *     routes a request to a worker that fetches instead of computing.
 * Exits 77 (skip) with a reason when redis-server or redis-cli is missing. */
#include <check.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "kv/kvwire.h"
#include "worker/model/model.h"
#include "tests/harness/harness.h"

#define SKIP_CODE 77
#define MODEL "chunkgate-tiny"
#define KV_HEADS 4

static char g_model[600];
static char g_redis_server[512], g_redis_cli[512];

static const char *SYS = TH_SYSTEM;
static const char *DOC[6] = {TH_DOC_A, TH_DOC_B, TH_DOC_C, TH_DOC_D, TH_DOC_E, TH_DOC_F};
static const char *QUESTION = TH_QUESTION;

/* ---- Redis ---------------------------------------------------------------------------------- */

/* redis-server in the foreground on port, no persistence (a child of the test: kill -9 works). */
static void start_redis(th_proc *p, int port)
{
    static const char *const extra[] = {"--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru",
                                        NULL};
    th_redis_spawn(p, g_redis_server, port, extra);
}

/* The value under name (caller frees); NULL when missing. */
static char *redis_get(int port, const char *name, size_t *len)
{
    redisContext *c = th_redis_connect(port);
    ck_assert(c && !c->err);
    redisReply *r = redisCommand(c, "GET %s", name);
    ck_assert(r != NULL);
    char *v = NULL;
    if (r->type == REDIS_REPLY_STRING) {
        v = cg_malloc(r->len + 1);
        memcpy(v, r->str, r->len);
        *len = r->len;
    }
    freeReplyObject(r);
    redisFree(c);
    return v;
}

static void redis_set(int port, const char *name, const void *v, size_t len)
{
    redisContext *c = th_redis_connect(port);
    ck_assert(c && !c->err);
    redisReply *r = redisCommand(c, "SET %s %b", name, v, len);
    ck_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redisFree(c);
}

/* ---- workers and requests ------------------------------------------------------------------ */

static void start_worker(th_proc *p, const char *name, const char *const *extra)
{
    ck_assert_msg(th_start_worker(p, WORKER_BIN, g_model, 0, name, extra) == 0,
                  "worker %s did not start; log in %s", name, th_root());
}

static char *remote_url(int port)
{
    static char url[8][64];
    static int i;
    char *u = url[i++ % 8];
    snprintf(u, 64, "redis://127.0.0.1:%d", port);
    return u;
}

static double metric(const th_proc *w, const char *series)
{
    return th_metric(w->port, series);
}

/* Segments: the system prompt, the given documents, the question. */
static json_t *segs_of(const char *const *texts, int n)
{
    json_t *a = json_pack("[{s:s,s:s}]", "role", "system", "text", SYS);
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s,s:s}", "role", "chunk", "text", texts[i]));
    json_array_append_new(a, json_pack("{s:s,s:s}", "role", "question", "text", QUESTION));
    return a;
}

typedef struct outcome {
    int ok;
    char tier[8][8]; /* per segment */
    char key[8][33];
    int n;
    char text[512];
} outcome;

/* assemble + complete (greedy, 8 tokens) of the given documents on a worker; checked when
 * must_ok. */
static outcome ask_texts(const th_proc *w, const char *const *texts, int n, int must_ok)
{
    outcome o;
    memset(&o, 0, sizeof o);
    json_t *b = json_pack("{s:s, s:o}", "model", MODEL, "segments", segs_of(texts, n));
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    th_resp r;
    th_http(&r, w->port, "POST", "/v1/assemble", body, NULL, NULL);
    free(body);
    if (must_ok)
        ck_assert_msg(r.status == 200, "assemble: HTTP %ld: %.300s", r.status,
                      r.body.data ? r.body.data : "");
    if (r.status != 200) {
        th_resp_free(&r);
        return o;
    }
    json_t *j = th_json(&r);
    th_resp_free(&r);
    json_t *segs = json_object_get(j, "segments");
    o.n = (int)json_array_size(segs);
    for (int i = 0; i < o.n && i < 8; i++) {
        json_t *s = json_array_get(segs, (size_t)i);
        snprintf(o.tier[i], sizeof o.tier[i], "%s", json_string_value(json_object_get(s, "tier")));
        snprintf(o.key[i], sizeof o.key[i], "%s", json_string_value(json_object_get(s, "key")));
    }
    json_t *cb = json_pack("{s:s, s:i, s:f, s:{s:s}}", "model", MODEL, "max_tokens", 8,
                           "temperature", 0.0, "kv_transfer_params", "assembly_id",
                           json_string_value(json_object_get(j, "assembly_id")));
    json_decref(j);
    body = json_dumps(cb, JSON_COMPACT);
    json_decref(cb);
    th_http(&r, w->port, "POST", "/v1/completions", body, NULL, NULL);
    free(body);
    if (must_ok)
        ck_assert_msg(r.status == 200, "completions: HTTP %ld: %.300s", r.status,
                      r.body.data ? r.body.data : "");
    if (r.status == 200) {
        j = th_json(&r);
        const char *t = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        snprintf(o.text, sizeof o.text, "%s", t ? t : "");
        json_decref(j);
        o.ok = 1;
    }
    th_resp_free(&r);
    return o;
}

/* The same with documents DOC[docs[i]]. */
static outcome ask(const th_proc *w, const int *docs, int n, int must_ok)
{
    const char *texts[8];
    for (int i = 0; i < n && i < 8; i++)
        texts[i] = DOC[docs[i]];
    return ask_texts(w, texts, n, must_ok);
}

/* Segments of o (system and chunks) whose tier is t. */
static int count_tier(const outcome *o, const char *t)
{
    int n = 0;
    for (int i = 0; i < o->n - 1; i++)
        n += !strcmp(o->tier[i], t);
    return n;
}

/* Waits until w's write-behind queues are empty and at least n values reached Redis. */
static void wait_remote_writes(const th_proc *w, double n)
{
    for (int i = 0; i < 400; i++) {
        if (metric(w, "chunkgate_worker_remote_writes_total") >= n &&
            metric(w, "chunkgate_worker_remote_queue_chunks") == 0)
            return;
        th_sleep_ms(25);
    }
    ck_abort_msg("the remote write-behind did not write %g values", n);
}

/* GET path on w: its raw body (caller frees). */
static cg_buf get_raw(const th_proc *w, const char *path)
{
    th_resp r;
    th_http(&r, w->port, "GET", path, NULL, NULL, NULL);
    ck_assert_msg(r.status == 200, "GET %s: %ld", path, r.status);
    cg_buf_free(&r.head);
    return r.body;
}

/* the model's KV identity (model id and weights' fingerprint), which names its values */
static char g_kv_model[160];

static void head_name(const char *key, int h, char *out, size_t cap)
{
    ck_assert_int_eq(cg_kvwire_head_key(g_kv_model, (uint32_t)h, key, out, cap), CG_OK);
}

/* ---- one node ------------------------------------------------------------------------------ */

static void share_between_workers(int redis_port, const char *url, int cluster)
{
    th_proc a, b;
    const char *ea[] = {"--remote", url, NULL};
    start_worker(&a, cluster ? "ca" : "a", ea);
    start_worker(&b, cluster ? "cb" : "b", ea);
    const int docs[] = {0, 1, 2, 3, 4, 5};
    outcome oa = ask(&a, docs, 6, 1);
    ck_assert_int_eq(count_tier(&oa, "miss"), 7);
    wait_remote_writes(&a, 7 * KV_HEADS);

    outcome ob = ask(&b, docs, 6, 1);
    ck_assert_msg(count_tier(&ob, "remote") == 7, "worker B: %d of 7 segments from the remote tier",
                  count_tier(&ob, "remote"));
    ck_assert_str_eq(ob.text, oa.text);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_remote_hits_total"), 7);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_remote_reads_total{outcome=\"hit\"}"), 7);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_remote_read_seconds_count"), 7);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_chunk_misses_total"), 0);
    ck_assert_double_gt(metric(&b, "chunkgate_worker_remote_read_bytes_total"), 0);
    ck_assert_double_eq(metric(&a, "chunkgate_worker_remote_written_bytes_total"),
                        metric(&b, "chunkgate_worker_remote_read_bytes_total"));
    json_t *info = NULL;
    th_resp r;
    th_http(&r, b.port, "GET", "/v1/info", NULL, NULL, NULL);
    info = th_json(&r);
    th_resp_free(&r);
    json_t *rt = json_object_get(info, "remote_tier");
    ck_assert_str_eq(json_string_value(json_object_get(rt, "id")), url);
    ck_assert_int_eq(json_is_true(json_object_get(rt, "cluster")), cluster);
    json_decref(info);

    /* The KV is byte for byte the same on both workers; the value in Redis is the per-head
     * export plus the seal, which is what a TP rank reading Redis gets. */
    for (int s = 0; s < 7; s++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/chunks/%s/kv", oa.key[s]);
        cg_buf ka = get_raw(&a, path), kb = get_raw(&b, path);
        ck_assert_uint_eq(ka.len, kb.len);
        ck_assert(memcmp(ka.data, kb.data, ka.len) == 0);
        cg_buf_free(&ka);
        cg_buf_free(&kb);
        if (cluster || s > 1) continue;
        for (int h = 0; h < KV_HEADS; h++) {
            char name[CG_KVWIRE_MODEL_MAX + 64];
            head_name(oa.key[s], h, name, sizeof name);
            size_t len = 0;
            char *v = redis_get(redis_port, name, &len);
            ck_assert_ptr_nonnull(v);
            snprintf(path, sizeof path, "/v1/chunks/%s/kv?heads=%d", oa.key[s], h);
            cg_buf one = get_raw(&a, path);
            ck_assert_uint_eq(len, one.len + CG_KVWIRE_SEAL_BYTES);
            ck_assert(memcmp(v, one.data, one.len) == 0);
            cg_kvwire_header hd;
            const float *pl;
            ck_assert_int_eq(cg_kvwire_unseal(v, len, name, &hd, &pl), CG_OK);
            ck_assert_uint_eq(hd.head_start, (uint32_t)h);
            ck_assert_uint_eq(hd.n_heads, 1);
            cg_buf_free(&one);
            free(v);
        }
    }
    ck_assert_int_eq(th_stop(&a, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&b, SIGTERM), 0);
}

START_TEST(test_single_node_share)
{
    th_proc redis;
    start_redis(&redis, th_free_port());
    share_between_workers(redis.port, remote_url(redis.port), 0);
    /* the chunks' values, and the workers' chunk events (on by default with --remote) */
    ck_assert_int_eq(th_redis_int(redis.port, "EXISTS chunkgate:events"), 1);
    ck_assert_int_eq(th_redis_int(redis.port, "DBSIZE"), 7 * KV_HEADS + 1);
    /* no TTL unless asked for: memory is Redis's job (maxmemory + allkeys-lru) */
    redisContext *rc = th_redis_connect(redis.port);
    redisReply *k = redisCommand(rc, "RANDOMKEY");
    ck_assert(k && k->type == REDIS_REPLY_STRING);
    redisReply *ttl = redisCommand(rc, "TTL %s", k->str);
    ck_assert(ttl && ttl->type == REDIS_REPLY_INTEGER);
    ck_assert_int_eq(ttl->integer, -1);
    freeReplyObject(ttl);
    freeReplyObject(k);
    redisFree(rc);
    th_stop(&redis, SIGKILL);
}
END_TEST

static json_t *info_of(const th_proc *w)
{
    th_resp r;
    th_http(&r, w->port, "GET", "/v1/info", NULL, NULL, NULL);
    json_t *j = th_json(&r);
    th_resp_free(&r);
    ck_assert_ptr_nonnull(j);
    return j;
}

/* Another checkpoint under the same model id (another seed: same geometry and tokenizer) never
 * reads this one's values: its KV would be decoded by other weights. */
START_TEST(test_other_weights_same_id)
{
    th_proc redis, a, b;
    start_redis(&redis, th_free_port());
    const char *url = remote_url(redis.port);
    const char *ea[] = {"--remote", url, NULL};
    start_worker(&a, "wa", ea);
    const int docs[] = {0, 1, 2};
    outcome oa = ask(&a, docs, 3, 1);
    ck_assert_int_eq(count_tier(&oa, "miss"), 4);
    wait_remote_writes(&a, 4 * KV_HEADS);
    char other[400];
    snprintf(other, sizeof other, "%s/other-seed", th_root());
    const char *gen[] = {"--seed", "99", NULL};
    ck_assert_int_eq(th_gen_model(WORKER_BIN, other, gen), 0);
    ck_assert_msg(th_start_worker(&b, WORKER_BIN, other, 0, "wother", ea) == 0,
                  "worker wother did not start; log in %s", th_root());
    json_t *ia = info_of(&a), *ib = info_of(&b);
    ck_assert_str_eq(th_sget(ia, "model"), th_sget(ib, "model"));
    ck_assert_str_ne(th_sget(ia, "kv_model"), th_sget(ib, "kv_model"));
    json_decref(ia);
    json_decref(ib);
    outcome ob = ask(&b, docs, 3, 1);
    ck_assert_int_eq(count_tier(&ob, "remote"), 0);
    ck_assert_int_eq(count_tier(&ob, "miss"), 4);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_remote_hits_total"), 0);
    ck_assert_int_eq(th_stop(&a, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&b, SIGTERM), 0);
    th_stop(&redis, SIGKILL);
}
END_TEST

/* ---- cluster ------------------------------------------------------------------------------ */

static int ports_free(int base)
{
    for (int i = 0; i < 3; i++) {
        for (int bus = 0; bus < 2; bus++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in sa = {.sin_family = AF_INET,
                                     .sin_port = htons((uint16_t)(base + i + bus * 10000)),
                                     .sin_addr.s_addr = htonl(0x7f000001)};
            int ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
            close(fd);
            if (!ok) return 0;
        }
    }
    return 1;
}

/* tests/redis_cluster.sh start DIR PORT | stop DIR; its output goes to cluster.log. */
static int run_script(const char *cmd, const char *dir, int port)
{
    char line[1200], ports[16] = "";
    if (port) snprintf(ports, sizeof ports, "%d", port);
    snprintf(line, sizeof line, "%s/tests/redis_cluster.sh %s %s %s >>%s/cluster.log 2>&1",
             CG_SOURCE_DIR, cmd, dir, ports, th_root());
    return system(line);
}

START_TEST(test_cluster_share)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/cluster", th_root());
    int base = 0;
    unsigned seed = (unsigned)getpid();
    for (int t = 0; t < 200 && !base; t++) {
        int p = 21000 + (int)(rand_r(&seed) % 9000);
        if (ports_free(p)) base = p;
    }
    ck_assert_int_gt(base, 0);
    ck_assert_msg(run_script("start", dir, base) == 0, "redis_cluster.sh start failed: see %s",
                  th_root());
    char url[64];
    snprintf(url, sizeof url, "redis+cluster://127.0.0.1:%d", base);
    share_between_workers(base, url, 1);
    /* the 28 keys are spread over the three masters, and the stream of chunk events is on one */
    long long total = 0;
    for (int i = 0; i < 3; i++) {
        long long n = th_redis_int(base + i, "DBSIZE");
        ck_assert_msg(n > 0, "master %d holds no key", base + i);
        total += n;
    }
    ck_assert_int_eq(total, 7 * KV_HEADS + 1);
    ck_assert_int_eq(run_script("stop", dir, 0), 0);
}
END_TEST

/* ---- corrupt values ------------------------------------------------------------------------ */

START_TEST(test_corrupt_values_are_misses)
{
    th_proc redis, a, c, d;
    start_redis(&redis, th_free_port());
    const char *e[] = {"--remote", remote_url(redis.port), NULL};
    start_worker(&a, "corrupt-a", e);
    const int docs[] = {0, 1, 2, 3, 4};
    outcome oa = ask(&a, docs, 5, 1);
    wait_remote_writes(&a, 6 * KV_HEADS);
    ck_assert_int_eq(th_stop(&a, SIGTERM), 0);

    char name[256], other[256];
    size_t len = 0, olen = 0;
    /* doc 0: one bit flipped deep in the payload of head 0 */
    head_name(oa.key[1], 0, name, sizeof name);
    char *v = redis_get(redis.port, name, &len);
    v[len / 2] ^= 0x10;
    redis_set(redis.port, name, v, len);
    free(v);
    /* doc 1: head 1 truncated */
    head_name(oa.key[2], 1, name, sizeof name);
    v = redis_get(redis.port, name, &len);
    redis_set(redis.port, name, v, len - 40);
    free(v);
    /* doc 2: head 2 holds doc 3's head 2 (a whole, well-sealed value under another key) */
    head_name(oa.key[3], 2, name, sizeof name);
    head_name(oa.key[4], 2, other, sizeof other);
    v = redis_get(redis.port, other, &olen);
    redis_set(redis.port, name, v, olen);
    free(v);
    /* doc 4: head 3 rewritten for another model, sealed correctly under its key */
    head_name(oa.key[5], 3, name, sizeof name);
    v = redis_get(redis.port, name, &len);
    cg_kvwire_header h;
    const float *pl = NULL;
    ck_assert_int_eq(cg_kvwire_unseal(v, len, name, &h, &pl), CG_OK);
    snprintf(h.model, sizeof h.model, "another-model");
    uint8_t hb[512];
    size_t hn = 0;
    ck_assert_int_eq(cg_kvwire_header_encode(&h, hb, sizeof hb, &hn), CG_OK);
    size_t payload = len - CG_KVWIRE_SEAL_BYTES - h.header_bytes;
    char *f = cg_malloc(hn + payload + CG_KVWIRE_SEAL_BYTES);
    memcpy(f, hb, hn);
    memcpy(f + hn, pl, payload);
    cg_kvwire_seal(f, hn + payload, name, f + hn + payload);
    redis_set(redis.port, name, f, hn + payload + CG_KVWIRE_SEAL_BYTES);
    free(f);
    free(v);

    const char *ec[] = {"--remote", remote_url(redis.port), "--remote-ttl-s", "3600", NULL};
    start_worker(&c, "corrupt-c", ec);
    outcome oc = ask(&c, docs, 5, 1);
    ck_assert_str_eq(oc.tier[0], "remote"); /* the system prompt was left alone */
    for (int s = 1; s <= 3; s++)
        ck_assert_msg(!strcmp(oc.tier[s], "miss"), "segment %d: tier %s", s, oc.tier[s]);
    ck_assert_str_eq(oc.tier[4], "remote");
    ck_assert_str_eq(oc.tier[5], "miss");
    ck_assert_str_eq(oc.text, oa.text);
    ck_assert_double_eq(metric(&c, "chunkgate_worker_remote_reads_total{outcome=\"invalid\"}"), 4);
    ck_assert_double_eq(metric(&c, "chunkgate_worker_remote_hits_total"), 2);
    char *log = th_read_file(c.log, NULL);
    ck_assert_ptr_nonnull(strstr(log, "corrupt or truncated"));
    ck_assert_ptr_nonnull(strstr(log, "another model, geometry or head"));
    free(log);
    /* the worker that recomputed them wrote them again: the next one reads them all */
    wait_remote_writes(&c, 4 * KV_HEADS);
    char cmd[300];
    head_name(oa.key[1], 0, name, sizeof name); /* rewritten by c, with its TTL */
    snprintf(cmd, sizeof cmd, "TTL %s", name);
    long long ttl = th_redis_int(redis.port, cmd);
    ck_assert_msg(ttl > 3000 && ttl <= 3600, "TTL %lld", ttl);
    head_name(oa.key[0], 0, name, sizeof name); /* written by a, without */
    snprintf(cmd, sizeof cmd, "TTL %s", name);
    ck_assert_int_eq(th_redis_int(redis.port, cmd), -1);
    start_worker(&d, "corrupt-d", e);
    outcome od = ask(&d, docs, 5, 1);
    ck_assert_int_eq(count_tier(&od, "remote"), 6);
    ck_assert_str_eq(od.text, oa.text);
    ck_assert_double_eq(metric(&d, "chunkgate_worker_remote_reads_total{outcome=\"invalid\"}"), 0);
    ck_assert_int_eq(th_stop(&c, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&d, SIGTERM), 0);
    th_stop(&redis, SIGKILL);
}
END_TEST

/* ---- Redis down, Redis slow ------------------------------------------------------------------ */

/* Requests sent by a thread of their own while the test kills and restarts Redis; the counters
 * and the stop flag are shared with the test's thread (atomics). */
typedef struct traffic {
    const th_proc *w;
    int stop, done, failed;
} traffic;

static int atomic_get(const int *v)
{
    return __atomic_load_n(v, __ATOMIC_ACQUIRE);
}

static void *traffic_main(void *arg)
{
    traffic *t = arg;
    for (int i = 0; !atomic_get(&t->stop); i++) {
        /* every request brings a new document (stored, queued for Redis) and one seen before
         * (looked up in Redis once RAM has dropped it) */
        char fresh[256], seen[256];
        snprintf(fresh, sizeof fresh, "%s Copy %d.", DOC[i % 6], i);
        int k = i > 12 ? i - 12 : 0; /* the new document of request k */
        snprintf(seen, sizeof seen, "%s Copy %d.", DOC[k % 6], k);
        const char *texts[2] = {fresh, seen};
        outcome o = ask_texts(t->w, texts, 2, 0);
        __atomic_add_fetch(o.ok ? &t->done : &t->failed, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

START_TEST(test_redis_down_and_slow)
{
    th_proc redis, a, b;
    int port = th_free_port();
    start_redis(&redis, port);
    const char *e[] = {"--remote", remote_url(port), "--remote-timeout-ms", "300", "--pool-mb", "2",
                       NULL};
    start_worker(&a, "down-a", e); /* 2 MiB of RAM: chunks leave it, so remote reads go on */
    traffic t = {.w = &a};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, traffic_main, &t), 0);
    for (int i = 0; i < 3000 && atomic_get(&t.done) < 10 && !atomic_get(&t.failed); i++)
        th_sleep_ms(20);
    th_stop(&redis, SIGKILL);
    int at_kill = atomic_get(&t.done);
    for (int i = 0; i < 3000 && atomic_get(&t.done) < at_kill + 20 && !atomic_get(&t.failed); i++)
        th_sleep_ms(20);
    __atomic_store_n(&t.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    ck_assert_int_eq(t.failed, 0);
    ck_assert_int_ge(t.done, at_kill + 20);
    double errs = metric(&a, "chunkgate_worker_remote_errors_total{kind=\"unavailable\"}") +
                  metric(&a, "chunkgate_worker_remote_errors_total{kind=\"timeout\"}");
    ck_assert_double_gt(errs, 0);
    ck_assert_double_gt(metric(&a, "chunkgate_worker_remote_reads_total{outcome=\"error\"}") +
                            metric(&a, "chunkgate_worker_remote_queue_failures_total"),
                        0);

    /* back: the worker reconnects by itself (after its backoff) and writes again */
    start_redis(&redis, port);
    int written = 0;
    for (int i = 0; i < 200 && !written; i++) {
        char text[256];
        snprintf(text, sizeof text, "%s Back %d.", DOC[i % 6], i);
        const char *texts[1] = {text};
        ask_texts(&a, texts, 1, 1);
        th_sleep_ms(100);
        /* a chunk's value, not only the chunk events (their client reconnects sooner) */
        written = th_redis_int(port, "DBSIZE") - th_redis_int(port, "EXISTS chunkgate:events") > 0;
    }
    ck_assert_msg(written, "nothing reached Redis after it came back");
    ck_assert_double_gt(metric(&a, "chunkgate_worker_remote_reconnects_total"), 0);

    /* a write-behind queue of 1 MiB: a 2,048-token document (8 MiB of KV) is dropped and
     * counted, the system prompt is written, the request does not notice */
    th_proc c;
    const char *ec[] = {"--remote", remote_url(port), "--remote-queue-mb", "1", NULL};
    start_worker(&c, "drops-c", ec);
    char big[2100];
    for (size_t i = 0; i < 2048; i++)
        big[i] = (char)('a' + (i * 7 + i / 26) % 26);
    big[2048] = 0;
    const char *bt[1] = {big};
    outcome oc = ask_texts(&c, bt, 1, 1);
    ck_assert_int_eq(count_tier(&oc, "miss"), 2);
    wait_remote_writes(&c, KV_HEADS);
    ck_assert_double_eq(metric(&c, "chunkgate_worker_remote_queue_drops_total"), 1);
    ck_assert_double_eq(metric(&c, "chunkgate_worker_remote_writes_total"), KV_HEADS);
    char name[256], cmd[300];
    head_name(oc.key[1], 0, name, sizeof name);
    snprintf(cmd, sizeof cmd, "EXISTS %s", name);
    ck_assert_int_eq(th_redis_int(port, cmd), 0);
    ck_assert_int_eq(th_stop(&c, SIGTERM), 0);

    /* slow (stopped): a fresh worker's request with five remote chunks pays one failed read and
     * skips the rest; it succeeds by computing */
    start_worker(&b, "slow-b", e);
    kill(redis.pid, SIGSTOP);
    const int five[] = {1, 2, 3, 4, 5};
    outcome o = ask(&b, five, 5, 1);
    kill(redis.pid, SIGCONT);
    ck_assert_int_eq(count_tier(&o, "miss"), 6);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_remote_reads_total{outcome=\"error\"}"), 1);
    ck_assert_double_eq(metric(&b, "chunkgate_worker_remote_reads_total{outcome=\"skipped\"}"), 5);
    ck_assert_double_ge(metric(&b, "chunkgate_worker_remote_errors_total{kind=\"timeout\"}"), 1);
    ck_assert_int_eq(th_stop(&a, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&b, SIGTERM), 0);
    th_stop(&redis, SIGKILL);
}
END_TEST

/* ---- kill -9 and the disk write-behind ------------------------------------------------------- */

static void kill9_restart(const char *name, const char *write_behind, int want_disk)
{
    th_proc w;
    const char *e[] = {"--disk-mb", "64", "--disk-write-behind", write_behind, NULL};
    start_worker(&w, name, e); /* 64 MiB of RAM: nothing is evicted, nothing spills */
    outcome first[3];
    for (int i = 0; i < 3; i++) {
        int docs[2] = {2 * i, 2 * i + 1};
        first[i] = ask(&w, docs, 2, 1);
    }
    if (want_disk) {
        for (int i = 0;
             i < 400 && metric(&w, "chunkgate_worker_disk_write_behind_written_total") < 7; i++)
            th_sleep_ms(25);
        ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_write_behind_written_total"), 7);
        ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_write_behind_queue_chunks"), 0);
    }
    ck_assert_double_eq(metric(&w, "chunkgate_worker_spills_total"), 0);
    ck_assert_int_eq(th_stop(&w, SIGKILL), 128 + SIGKILL);
    start_worker(&w, name, e);
    for (int i = 0; i < 3; i++) {
        int docs[2] = {2 * i, 2 * i + 1};
        outcome o = ask(&w, docs, 2, 1);
        ck_assert_str_eq(o.text, first[i].text);
        if (want_disk)
            ck_assert_msg(count_tier(&o, "miss") == 0, "prompt %d after kill -9: %d misses", i,
                          count_tier(&o, "miss"));
        else if (i == 0)
            ck_assert_int_eq(count_tier(&o, "miss"), 3);
    }
    if (want_disk) ck_assert_double_eq(metric(&w, "chunkgate_worker_disk_hits_total"), 7);
    ck_assert_double_eq(metric(&w, "chunkgate_worker_checksum_failures_total"), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}

START_TEST(test_kill9_restart_serves_from_disk)
{
    kill9_restart("wb", "64", 1);
    /* the control: without the write-behind nothing computed reached the disk */
    kill9_restart("nowb", "0", 0);
}
END_TEST

/* ---- the gateway ------------------------------------------------------------------------------
 */

static json_t *gw_json(int port, const char *method, const char *path, const char *body)
{
    th_resp r;
    th_http(&r, port, method, path, body, NULL, NULL);
    ck_assert_msg(r.status == 200, "%s %s: %ld %.300s", method, path, r.status,
                  r.body.data ? r.body.data : "");
    json_t *j = th_json(&r);
    th_resp_free(&r);
    ck_assert_ptr_nonnull(j);
    return j;
}

START_TEST(test_gateway_routes_to_shared_tier)
{
    th_proc redis, a, b, g;
    start_redis(&redis, th_free_port());
    const char *e[] = {"--remote", remote_url(redis.port), NULL};
    start_worker(&a, "gw-a", e);
    start_worker(&b, "gw-b", e);
    char ua[64], ub[64];
    snprintf(ua, sizeof ua, "http://127.0.0.1:%d", a.port);
    snprintf(ub, sizeof ub, "http://127.0.0.1:%d", b.port);
    const char *ge[] = {"--worker", ua, "--worker", ub, NULL};
    ck_assert_int_eq(th_start_gateway(&g, CHUNKGATE_BIN, "gw", ge), 0);
    ck_assert(th_wait_worker(g.port, NULL, ua, 1));
    ck_assert(th_wait_worker(g.port, NULL, ub, 1));
    json_t *wl = gw_json(g.port, "GET", "/v1/workers", NULL);
    for (size_t i = 0; i < 2; i++)
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(json_object_get(wl, "data"), i), "remote_tier")),
                         remote_url(redis.port));
    json_decref(wl);

    char prompt[2048];
    snprintf(prompt, sizeof prompt, "%s # # %s # # %s # # %s", SYS, DOC[0], DOC[1], QUESTION);
    json_t *rb = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens",
                           8, "temperature", 0.0);
    char *body = json_dumps(rb, JSON_COMPACT);
    json_decref(rb);
    json_t *r1 = gw_json(g.port, "POST", "/v1/completions", body);
    json_t *cc1 = json_object_get(r1, "chunk_cache");
    const char *first = json_string_value(json_object_get(cc1, "worker"));
    ck_assert_ptr_nonnull(first);
    const th_proc *computed = !strcmp(first, ua) ? &a : &b;
    const char *other = computed == &a ? ub : ua;
    wait_remote_writes(computed, 3 * KV_HEADS);

    /* the index records the documents in the shared tier */
    const char *doc_key = json_string_value(
        json_object_get(json_array_get(json_object_get(cc1, "segments"), 1), "key"));
    char path[128];
    snprintf(path, sizeof path, "/v1/chunks/%s", doc_key);
    json_t *ch = gw_json(g.port, "GET", path, NULL);
    int remote_placements = 0;
    size_t i;
    json_t *pl;
    json_array_foreach(json_object_get(ch, "placements"), i, pl) remote_placements +=
        !strcmp(json_string_value(json_object_get(pl, "tier")), "remote");
    ck_assert_int_eq(remote_placements, 1);
    json_decref(ch);

    /* the worker that computed them leaves: the other one is chosen for the shared tier and
     * fetches instead of computing */
    snprintf(path, sizeof path, "/v1/workers?url=%s", first);
    th_resp dr;
    th_http(&dr, g.port, "DELETE", path, NULL, NULL, NULL);
    ck_assert_msg(dr.status == 200, "DELETE /v1/workers: %ld %.200s", dr.status,
                  dr.body.data ? dr.body.data : "");
    th_resp_free(&dr);
    json_t *r2 = gw_json(g.port, "POST", "/v1/completions", body);
    json_t *cc2 = json_object_get(r2, "chunk_cache");
    ck_assert_str_eq(json_string_value(json_object_get(cc2, "worker")), other);
    ck_assert_str_eq(json_string_value(json_object_get(cc2, "routing")), "remote");
    json_t *s;
    json_array_foreach(json_object_get(cc2, "segments"), i, s) if (i < 3)
        ck_assert_str_eq(json_string_value(json_object_get(s, "tier")), "remote");
    ck_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(r1, "choices"), 0), "text")),
                     json_string_value(json_object_get(
                         json_array_get(json_object_get(r2, "choices"), 0), "text")));
    th_resp mr;
    th_http(&mr, g.port, "GET", "/metrics", NULL, NULL, NULL);
    ck_assert_ptr_nonnull(
        strstr(mr.body.data, "chunkgate_routing_decisions_total{kind=\"remote\"} 1"));
    th_resp_free(&mr);
    json_decref(r1);
    json_decref(r2);
    free(body);
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&a, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&b, SIGTERM), 0);
    th_stop(&redis, SIGKILL);
}
END_TEST

int main(void)
{
    if (!th_which("redis-server", g_redis_server, sizeof g_redis_server) ||
        !th_which("redis-cli", g_redis_cli, sizeof g_redis_cli)) {
        printf("SKIPPED: redis-server or redis-cli is not installed (Debian: redis-server, "
               "redis-tools)\n");
        return SKIP_CODE;
    }
    if (th_init_with_model("shared_tier", WORKER_BIN, g_model, sizeof g_model) != 0) return 1;
    cg_model *m = NULL;
    if (cg_model_open(g_model, &m, NULL, 0) != CG_OK) return 1;
    snprintf(g_kv_model, sizeof g_kv_model, "%s", cg_model_cfg(m)->kv_model);
    cg_model_close(&m);
    int failed = th_run_tests(
        "shared_tier", "shared_tier", 120,
        TH_TESTS(test_single_node_share, test_other_weights_same_id, test_cluster_share,
                 test_corrupt_values_are_misses, test_redis_down_and_slow,
                 test_kill9_restart_serves_from_disk, test_gateway_routes_to_shared_tier));
    /* the cluster's nodes are daemons: stop them even when a check failed half-way */
    char dir[400];
    snprintf(dir, sizeof dir, "%s/cluster", th_root());
    (void)run_script("stop", dir, 0);
    /* a sanitizer report in any worker's or gateway's log fails the suite */
    failed += th_logs_have_sanitizer_reports();
    th_cleanup(failed != 0);
    return failed ? 1 : 0;
}
