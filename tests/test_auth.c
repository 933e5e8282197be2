/* Integration suite for authentication and tenant isolation: the real chunkgate in front of a
 * real chunkgate-worker on loopback. API keys (--api-key, --api-key-file) guard the inference
 * routes, the admin token alone opens the admin routes, keys are salted per tenant so tenant B
 * never sees tenant A's chunks (hits, chunk_cache, keys, the tenant-scoped lookup), a forged key
 * cannot overwrite another chunk's KV, and no secret and no prompt text reaches the logs. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/key.h"
#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"
#define KEY1 "sk-test-key-1" /* tenant id pinned below (Python hashlib) */
#define KEY2 "sk-file-key-2"
#define KEY3 "sk-file-key-3"
#define ADMIN "adm-secret-9f3e"
#define WRONG "sk-WRONG-token-77"
#define MARK "PURPLE-OKAPI-4417" /* a prompt word that must never reach a log */

static th_proc wk, gw, gw2;
static char model_dir[300], wurl[64];

static void setup(void)
{
    if (th_init_with_model("auth", WORKER_BIN, model_dir, sizeof model_dir) != 0) abort();
    if (th_start_worker(&wk, WORKER_BIN, model_dir, 0, "w", NULL) != 0) th_die("worker", &wk);
    snprintf(wurl, sizeof wurl, "http://127.0.0.1:%d", wk.port);
    char keyfile[400];
    snprintf(keyfile, sizeof keyfile, "%s/keys.txt", th_root());
    /* comments, blank lines, surrounding blanks and CRLF are all tolerated */
    if (th_write_file(keyfile, "# tenants\n\n   " KEY2 "  \r\n" KEY3 "\n") != 0) abort();
    const char *extra[] = {"--api-key",
                           KEY1,
                           "--api-key-file",
                           keyfile,
                           "--admin-token",
                           ADMIN,
                           "--model",
                           MODEL,
                           "--health-interval-ms",
                           "200",
                           NULL};
    if (th_start_gateway_to(&gw, CHUNKGATE_BIN, "gw", wurl, ADMIN, extra) != 0)
        th_die("gateway (or worker health)", &gw);
    /* API keys and no admin token: the admin routes are closed to everyone */
    const char *extra2[] = {"--worker", wurl, "--api-key", KEY1, NULL};
    if (th_start_gateway(&gw2, CHUNKGATE_BIN, "gw2", extra2) != 0) th_die("gateway 2", &gw2);
}

static void teardown(void)
{
    th_stop_clean(&gw, "chunkgate");
    th_stop_clean(&gw2, "chunkgate (2)");
    th_stop_clean(&wk, "chunkgate-worker");
    th_cleanup(th_failures);
}

static char *completion(const char *sys, const char *doc, const char *q, const char *salt)
{
    json_t *b = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", "", "max_tokens", 1,
                          "temperature", 0.0);
    char prompt[2048];
    snprintf(prompt, sizeof prompt, "%s # # %s # # %s", sys, doc, q);
    json_object_set_new(b, "prompt", json_string(prompt));
    if (salt) json_object_set_new(b, "cache_salt", json_string(salt));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* POST /v1/completions with token; asserts 200 and returns the answer. */
static json_t *complete_as(const char *token, const char *body)
{
    return th_call_text(gw.port, "POST", "/v1/completions", body, token, 200);
}

static json_t *seg(json_t *answer, size_t i)
{
    return json_array_get(json_object_get(json_object_get(answer, "chunk_cache"), "segments"), i);
}

static int hit(json_t *answer, size_t i)
{
    return json_is_true(json_object_get(seg(answer, i), "hit"));
}

static const char *key_of(json_t *answer, size_t i)
{
    return json_string_value(json_object_get(seg(answer, i), "key"));
}

/* ------------------------------------------------------------ API keys */

START_TEST(inference_routes_need_an_api_key)
{
    char *body = completion("Auth system.", "Auth document.", "Question?", NULL);
    struct {
        const char *method, *path, *body;
    } routes[] = {{"POST", "/v1/completions", body},
                  {"POST", "/v1/chat/completions",
                   "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                   "\"max_tokens\":1}"},
                  {"GET", "/v1/models", NULL}};
    /* no token, a wrong one, a prefix of a key, a key plus a byte, the admin token */
    const char *bad[] = {NULL, WRONG, "sk-test-key-", KEY1 "x", ADMIN, "Bearer"};
    int refused = 0;
    for (size_t i = 0; i < CG_ARRAY_LEN(routes); i++) {
        for (size_t k = 0; k < CG_ARRAY_LEN(bad); k++) {
            th_resp r;
            th_http(&r, gw.port, routes[i].method, routes[i].path, routes[i].body, bad[k], NULL);
            ck_assert_msg(th_is_error(&r, 401, "invalid_api_key"), "%s %s token %zu: HTTP %ld %.*s",
                          routes[i].method, routes[i].path, k, r.status, (int)r.body.len,
                          r.body.data ? r.body.data : "");
            json_t *j = th_json(&r);
            ck_assert_str_eq(
                json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                "authentication_error");
            json_decref(j);
            ck_assert_ptr_nonnull(strcasestr(r.head.data, "WWW-Authenticate: Bearer"));
            th_resp_free(&r);
            refused++;
        }
        const char *good[] = {KEY1, KEY2, KEY3};
        for (size_t k = 0; k < CG_ARRAY_LEN(good); k++) {
            th_resp r;
            th_http(&r, gw.port, routes[i].method, routes[i].path, routes[i].body, good[k], NULL);
            ck_assert_msg(r.status == 200, "%s %s key %zu: HTTP %ld %.*s", routes[i].method,
                          routes[i].path, k, r.status, (int)r.body.len,
                          r.body.data ? r.body.data : "");
            th_resp_free(&r);
        }
    }
    /* operations routes stay open */
    const char *open_paths[] = {"/healthz", "/readyz", "/metrics"};
    for (size_t i = 0; i < CG_ARRAY_LEN(open_paths); i++) {
        th_resp r;
        th_http(&r, gw.port, "GET", open_paths[i], NULL, NULL, NULL);
        ck_assert_msg(r.status == 200, "%s: %ld", open_paths[i], r.status);
        th_resp_free(&r);
    }
    fprintf(stderr, "auth: %d refused requests (401), 9 accepted\n", refused);
    free(body);
}
END_TEST

START_TEST(admin_routes_take_only_the_admin_token)
{
    struct {
        const char *method, *path, *body;
    } routes[] = {{"GET", "/v1/chunks", NULL},
                  {"GET", "/v1/workers", NULL},
                  {"GET", "/v1/chunks/00000000000000000000000000000000", NULL},
                  {"DELETE", "/v1/chunks/00000000000000000000000000000000", NULL},
                  {"POST", "/v1/workers", "{\"url\":\"http://127.0.0.1:1\"}"}};
    const char *bad[] = {NULL, KEY1, KEY2, WRONG};
    for (size_t i = 0; i < CG_ARRAY_LEN(routes); i++)
        for (size_t k = 0; k < CG_ARRAY_LEN(bad); k++) {
            th_resp r;
            th_http(&r, gw.port, routes[i].method, routes[i].path, routes[i].body, bad[k], NULL);
            ck_assert_msg(th_is_error(&r, 401, "invalid_api_key"), "%s %s token %zu: HTTP %ld",
                          routes[i].method, routes[i].path, k, r.status);
            th_resp_free(&r);
        }
    th_resp r;
    th_expect(gw.port, "GET", "/v1/chunks", NULL, ADMIN, 200);
    /* a lookup by raw keys could probe any tenant: refused to an API key */
    th_http(&r, gw.port, "POST", "/v1/chunks/lookup",
            "{\"keys\":[\"00000000000000000000000000000000\"]}", KEY1, NULL);
    ck_assert_msg(th_is_error(&r, 403, "forbidden"), "HTTP %ld", r.status);
    th_resp_free(&r);
    /* API keys configured, no admin token: the admin routes are closed, keys or not */
    const char *tokens[] = {NULL, KEY1};
    for (size_t k = 0; k < 2; k++) {
        th_http(&r, gw2.port, "GET", "/v1/chunks", NULL, tokens[k], NULL);
        ck_assert_msg(th_is_error(&r, 401, "invalid_api_key"), "gw2: HTTP %ld", r.status);
        ck_assert_ptr_nonnull(strstr(r.body.data, "no admin token"));
        th_resp_free(&r);
    }
}
END_TEST

/* ------------------------------------------------------------ tenants */

START_TEST(tenant_id_is_pinned)
{
    /* hashlib.sha256(b"chunkgate-tenant-v1\x00" + b"sk-test-key-1").hexdigest()[:32] */
    char id[CG_KEY_HEX_LEN + 1];
    cg_key_tenant_id(KEY1, strlen(KEY1), id);
    ck_assert_str_eq(id, "813d6e847d0abe5d07c813f0a5840a40");
    char id2[CG_KEY_HEX_LEN + 1];
    cg_key_tenant_id(KEY2, strlen(KEY2), id2);
    ck_assert_str_ne(id, id2);
}
END_TEST

static json_t *lookup_as(const char *token, const char *body)
{
    return th_call_text(gw.port, "POST", "/v1/chunks/lookup", body, token, 200);
}

static int found_any(json_t *lookup)
{
    size_t i;
    json_t *e;
    int any = 0;
    json_array_foreach(json_object_get(lookup, "data"), i, e) any |=
        json_is_true(json_object_get(e, "found"));
    return any;
}

START_TEST(tenant_b_cannot_detect_tenant_a)
{
    const char *sys = "Tenant system prompt.";
    const char *doc = "Tenant A's document: the vault code rotates every Tuesday at noon.";
    char *p = completion(sys, doc, "When does it rotate?", NULL);
    json_t *a1 = complete_as(KEY1, p);
    ck_assert(!hit(a1, 1));
    json_t *a2 = complete_as(KEY1, p);
    ck_assert_msg(hit(a2, 0) && hit(a2, 1), "tenant A does not hit its own chunks");
    /* A's key is the documented function of its tenant id */
    char tenant[CG_KEY_HEX_LEN + 1], want[CG_KEY_HEX_LEN + 1];
    cg_key_tenant_id(KEY1, strlen(KEY1), tenant);
    cg_key k = cg_key_compute(MODEL, strlen(MODEL), CG_MODE_STRICT, tenant, strlen(tenant), NULL,
                              doc, strlen(doc));
    cg_key_hex(&k, want);
    ck_assert_str_eq(key_of(a1, 1), want);

    /* B (and a third tenant C): the same prompt, with no cache_salt, with A's tenant id, with
     * "" and with "x" as cache_salt: the first sight is always a miss, never A's key */
    const char *b_salts[] = {NULL, tenant, "", "x"};
    for (size_t s = 0; s < CG_ARRAY_LEN(b_salts); s++) {
        char *pb = completion(sys, doc, "When does it rotate?", b_salts[s]);
        const char *who[] = {KEY2, KEY3};
        for (int t = 0; t < 2; t++) {
            json_t *b = complete_as(who[t], pb);
            for (size_t i = 0; i < 2; i++) {
                ck_assert_msg(!hit(b, i), "tenant %d hit segment %zu (salt %zu)", t, i, s);
                ck_assert_str_ne(key_of(b, i), key_of(a1, i));
            }
            json_t *det = json_object_get(json_object_get(b, "usage"), "prompt_tokens_details");
            ck_assert_int_eq(json_integer_value(json_object_get(det, "cached_tokens")), 0);
            json_decref(b);
        }
        free(pb);
    }
    /* A tenant partitions its own cache with cache_salt: A with "x" misses, then hits. */
    char *px = completion(sys, doc, "When does it rotate?", "x");
    json_t *ax1 = complete_as(KEY1, px);
    ck_assert(!hit(ax1, 1));
    json_t *ax2 = complete_as(KEY1, px);
    ck_assert(hit(ax2, 1));

    /* The tenant-scoped lookup: a document only A has sent is found by A, not by B */
    const char *only_a = "Only tenant A has sent this document about the eastern pumping station.";
    char *pa = completion(sys, only_a, "q", NULL);
    json_decref(complete_as(KEY1, pa));
    char lk[2048];
    snprintf(lk, sizeof lk, "{\"model\":\"" MODEL "\",\"prompt\":\"%s # # %s # # q\"}", sys,
             only_a);
    json_t *lb = lookup_as(KEY2, lk);
    json_t *la = lookup_as(KEY1, lk);
    ck_assert_int_eq(json_array_size(json_object_get(la, "data")), 2);
    json_t *ea = json_array_get(json_object_get(la, "data"), 1);
    json_t *eb = json_array_get(json_object_get(lb, "data"), 1);
    ck_assert(json_is_true(json_object_get(ea, "found")));
    ck_assert_int_ge(json_integer_value(json_object_get(ea, "seen_count")), 1);
    ck_assert(json_is_false(json_object_get(eb, "found")));
    ck_assert_str_ne(json_string_value(json_object_get(eb, "key")),
                     json_string_value(json_object_get(ea, "key")));
    /* the operator sees everything: A's key by raw key with the admin token */
    char kb[256];
    snprintf(kb, sizeof kb, "{\"keys\":[\"%s\"]}", json_string_value(json_object_get(ea, "key")));
    json_t *adm = lookup_as(ADMIN, kb);
    ck_assert(found_any(adm));
    free(pa);
    json_decref(adm);
    json_decref(la);
    json_decref(lb);
    json_decref(ax1);
    json_decref(ax2);
    json_decref(a1);
    json_decref(a2);
    free(px);
    free(p);
}
END_TEST

/* ------------------------------------------------------------ integrity */

/* A client that talks to the worker directly and sends chunk text B under chunk A's key is
 * refused, and A's KV stays exactly as it was. */
START_TEST(forged_key_cannot_overwrite_kv)
{
    const char *ta = "Integrity document A: the reservoir holds 4.2 million cubic metres.";
    const char *tb = "Forged text B: the reservoir is empty and the dam has been removed.";
    cg_key ka = cg_key_compute(MODEL, strlen(MODEL), CG_MODE_STRICT, NULL, 0, NULL, ta, strlen(ta));
    char ha[CG_KEY_HEX_LEN + 1];
    cg_key_hex(&ka, ha);
    char body[2048];
    snprintf(body, sizeof body,
             "{\"segments\":[{\"role\":\"system\",\"text\":\"s\"},{\"role\":\"chunk\",\"text\":"
             "\"%s\",\"key\":\"%s\"},{\"role\":\"question\",\"text\":\"q\"}]}",
             ta, ha);
    th_resp r;
    json_t *j = th_call_text(wk.port, "POST", "/v1/assemble", body, NULL, 200);
    char path[128];
    snprintf(path, sizeof path, "/v1/assemblies/%s",
             json_string_value(json_object_get(j, "assembly_id")));
    json_decref(j);
    th_http(&r, wk.port, "DELETE", path, NULL, NULL, NULL);
    th_resp_free(&r);
    snprintf(path, sizeof path, "/v1/chunks/%s/kv", ha);
    th_resp before;
    th_http(&before, wk.port, "GET", path, NULL, NULL, NULL);
    ck_assert_int_eq(before.status, 200);
    ck_assert_uint_gt(before.body.len, 1000);
    /* the forgery, as a miss and as a would-be overwrite of a held chunk */
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body,
                 "{\"segments\":[{\"role\":\"system\",\"text\":\"s\"},{\"role\":\"chunk\",\"text\":"
                 "\"%s\",\"key\":\"%s\"},{\"role\":\"question\",\"text\":\"q\"}]}",
                 tb, ha);
        th_http(&r, wk.port, "POST", "/v1/assemble", body, NULL, NULL);
        ck_assert_msg(th_is_error(&r, 400, "chunk_key_mismatch"), "HTTP %ld", r.status);
        th_resp_free(&r);
    }
    th_resp after;
    th_http(&after, wk.port, "GET", path, NULL, NULL, NULL);
    ck_assert_int_eq(after.status, 200);
    ck_assert_uint_eq(after.body.len, before.body.len);
    ck_assert(memcmp(after.body.data, before.body.data, before.body.len) == 0);
    th_resp_free(&before);
    th_resp_free(&after);
}
END_TEST

/* ------------------------------------------------------------ logs */

START_TEST(logs_hold_no_secret_and_no_prompt)
{
    char *p =
        completion("System " MARK ".", "Document " MARK ".", "Question " MARK "?", "salt-" MARK);
    json_decref(complete_as(KEY1, p));
    json_decref(complete_as(KEY2, p));
    /* streamed */
    json_t *b = json_loads(p, 0, NULL);
    json_object_set_new(b, "stream", json_true());
    char *ps = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    th_resp r;
    th_expect(gw.port, "POST", "/v1/completions", ps, KEY3, 200);
    /* chat */
    th_http(
        &r, gw.port, "POST", "/v1/chat/completions",
        "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":"
        "\"Chat " MARK " # # doc " MARK "\"},{\"role\":\"user\",\"content\":\"ask " MARK "\"}]}",
        KEY1, NULL);
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
    /* errors that quote the request: invalid JSON near the word, a bad field, bad UTF-8 */
    th_http(&r, gw.port, "POST", "/v1/completions",
            "{\"model\":\"" MODEL "\",\"prompt\":\"" MARK " # # x # # q\",}", KEY1, NULL);
    ck_assert(th_is_error(&r, 400, "invalid_json"));
    th_resp_free(&r);
    th_expect(gw.port, "POST", "/v1/completions",
              "{\"model\":\"" MODEL "\",\"prompt\":\"" MARK "\",\"max_tokens\":\"" MARK "\"}", KEY1,
              400);
    /* refused credentials */
    th_expect(gw.port, "POST", "/v1/completions", p, WRONG, 401);
    th_expect(gw.port, "GET", "/v1/chunks", NULL, KEY2, 401);
    th_expect(gw.port, "GET", "/v1/chunks", NULL, ADMIN, 200);
    th_sleep_ms(300); /* access lines are written when the connection completes */

    const char *secrets[] = {KEY1, KEY2, KEY3, ADMIN, WRONG, MARK, "Bearer "};
    const th_proc *procs[] = {&gw, &gw2, &wk};
    size_t lines = 0;
    for (size_t i = 0; i < CG_ARRAY_LEN(procs); i++) {
        char *log = th_read_file(procs[i]->log, NULL);
        for (const char *c = log; *c; c++)
            lines += *c == '\n';
        for (size_t k = 0; k < CG_ARRAY_LEN(secrets); k++)
            ck_assert_msg(!strstr(log, secrets[k]), "'%s' appears in %s", secrets[k],
                          procs[i]->log);
        free(log);
    }
    ck_assert_uint_gt(lines, 20); /* the logs were written and are non-trivial */
    fprintf(stderr, "logs: %zu lines of the gateway and the worker hold no secret, no prompt\n",
            lines);
    free(ps);
    free(p);
}
END_TEST

/* ------------------------------------------------------------ gateway to worker */

/* A worker with --api-key-file answers only /healthz without its key; a gateway with
 * --worker-api-key sends it on every worker call (health, info, assemble, the completion), so
 * its requests are assembled and cached; a gateway without it refuses to start. */
START_TEST(worker_key_between_gateway_and_worker)
{
    const char *wkey = "wk-secret-5b1d";
    char keyfile[400], url[64];
    snprintf(keyfile, sizeof keyfile, "%s/worker-key.txt", th_root());
    ck_assert_int_eq(th_write_file(keyfile, "# the workers' key\n  wk-secret-5b1d \n"), 0);
    th_proc w, g, g0;
    const char *wargs[] = {"--api-key-file", keyfile, NULL};
    ck_assert_int_eq(th_start_worker(&w, WORKER_BIN, model_dir, 0, "wkey", wargs), 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", w.port);
    th_expect(w.port, "GET", "/healthz", NULL, NULL, 200);
    const char *routes[][2] = {{"GET", "/v1/info"},   {"GET", "/metrics"},
                               {"GET", "/v1/chunks"}, {"GET", "/v1/models"},
                               {"POST", "/tokenize"}, {"POST", "/v1/completions"}};
    for (size_t i = 0; i < CG_ARRAY_LEN(routes); i++) {
        const char *body = routes[i][0][0] == 'P' ? "{\"prompt\":\"hi\",\"max_tokens\":1}" : NULL;
        th_resp r;
        th_http(&r, w.port, routes[i][0], routes[i][1], body, NULL, NULL);
        ck_assert_msg(r.status == 401, "%s %s without the key: %ld", routes[i][0], routes[i][1],
                      r.status);
        th_resp_free(&r);
        th_http(&r, w.port, routes[i][0], routes[i][1], body, WRONG, NULL);
        ck_assert_msg(r.status == 401, "%s %s with a wrong key: %ld", routes[i][0], routes[i][1],
                      r.status);
        th_resp_free(&r);
        th_http(&r, w.port, routes[i][0], routes[i][1], body, wkey, NULL);
        ck_assert_msg(r.status == 200, "%s %s with the key: %ld", routes[i][0], routes[i][1],
                      r.status);
        th_resp_free(&r);
    }
    /* the gateway with the key: healthy, assembled, a hit the second time */
    const char *gargs[] = {"--worker-api-key", wkey, "--health-interval-ms", "200", NULL};
    ck_assert_int_eq(th_start_gateway_to(&g, CHUNKGATE_BIN, "gkey", url, NULL, gargs), 0);
    char *b = completion("Worker key system.", "Worker key document.", "Why?", NULL);
    for (int round = 0; round < 2; round++) {
        json_t *a = th_call_text(g.port, "POST", "/v1/completions", b, NULL, 200);
        json_t *cc = json_object_get(a, "chunk_cache");
        ck_assert_msg(json_is_false(json_object_get(cc, "fallback")), "round %d fell back", round);
        ck_assert_int_eq(hit(a, 1), round == 1);
        json_decref(a);
    }
    free(b);
    ck_assert(!th_file_has(g.log, wkey));
    ck_assert(!th_file_has(w.log, wkey));
    /* a gateway without it refuses to start, and says why */
    const char *g0args[] = {"--worker", url, NULL};
    ck_assert_int_ne(th_start_gateway(&g0, CHUNKGATE_BIN, "gnokey", g0args), 0);
    ck_assert(th_file_has(g0.log, "answered HTTP 401"));
    ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w, SIGTERM), 0);
}
END_TEST

static int knows_worker_backend(void *log)
{
    return th_file_has(log, "is a chunkgate-worker");
}

/* A chunkgate-worker as --backend (a decoding worker of a disaggregated setup, or the worker
 * alone) splits a "# #" prompt that falls back to it by itself: the gateway learns what its
 * backend is and sends the tenant's salt along, so tenant B never hits tenant A's chunks in
 * the backend's pool either. */
START_TEST(fallback_to_a_worker_backend_keeps_tenants_apart)
{
    th_proc w2, g3;
    ck_assert_int_eq(th_start_worker(&w2, WORKER_BIN, model_dir, 0, "w2", NULL), 0);
    char backend[64];
    snprintf(backend, sizeof backend, "http://127.0.0.1:%d", w2.port);
    /* no --worker: every request falls back to the plain prompt on --backend */
    const char *ga[] = {"--backend", backend, "--api-key", KEY1, "--api-key", KEY2, NULL};
    ck_assert_int_eq(th_start_gateway(&g3, CHUNKGATE_BIN, "g3", ga), 0);
    ck_assert(th_wait_until(10000, 20, knows_worker_backend, (void *)g3.log));
    char *p = completion("Backend tenant system.", "A document only tenant A has sent to it.",
                         "What is it?", NULL);
    const char *hits = "chunkgate_worker_chunk_hits_total";
    for (int i = 0; i < 2; i++)
        json_decref(th_call_text(g3.port, "POST", "/v1/completions", p, KEY1, 200));
    double a = th_metric(w2.port, hits);
    ck_assert_double_ge(a, 2); /* A's second request hit its own two segments */
    json_decref(th_call_text(g3.port, "POST", "/v1/completions", p, KEY2, 200));
    ck_assert_msg(th_metric(w2.port, hits) == a, "tenant B hit tenant A's chunks on the backend");
    ck_assert_int_eq(th_stop(&g3, SIGTERM), 0);
    ck_assert_int_eq(th_stop(&w2, SIGTERM), 0);

    /* A backend that has not answered yet (nothing listens there): a salted request is refused
     * rather than sent either way; one without a salt goes on and finds the backend down. */
    char down[64];
    snprintf(down, sizeof down, "http://127.0.0.1:%d", th_free_port());
    const char *gd[] = {"--backend", down, NULL};
    th_proc g4;
    ck_assert_int_eq(th_start_gateway(&g4, CHUNKGATE_BIN, "g4", gd), 0);
    char *salted = completion("Backend tenant system.", "A document.", "Q?", "tenant-x");
    th_resp r;
    th_http(&r, g4.port, "POST", "/v1/completions", salted, NULL, NULL);
    ck_assert_msg(th_is_error(&r, 503, "upstream_unavailable") &&
                      strstr(r.body.data, "has not answered GET /healthz"),
                  "HTTP %ld %s", r.status, r.body.data);
    th_resp_free(&r);
    free(salted);
    th_http(&r, g4.port, "POST", "/v1/completions", p, NULL, NULL);
    ck_assert_int_eq(r.status, 502);
    th_resp_free(&r);
    /* nor is a salted prompt without separators: nothing in it would be kept apart */
    th_http(&r, g4.port, "POST", "/v1/completions",
            "{\"model\":\"" MODEL "\",\"max_tokens\":1,\"prompt\":\"Plain.\",\"cache_salt\":\"s\"}",
            NULL, NULL);
    ck_assert_int_eq(r.status, 502);
    th_resp_free(&r);
    free(p);
    ck_assert_int_eq(th_stop(&g4, SIGTERM), 0);
}
END_TEST

int main(void)
{
    return th_run_suite(
        "auth", "auth", 120, (th_fixture){setup, teardown, 0}, CK_FORK_GETENV,
        TH_TESTS(inference_routes_need_an_api_key, admin_routes_take_only_the_admin_token,
                 tenant_id_is_pinned, tenant_b_cannot_detect_tenant_a,
                 fallback_to_a_worker_backend_keeps_tenants_apart, forged_key_cannot_overwrite_kv,
                 logs_hold_no_secret_and_no_prompt, worker_key_between_gateway_and_worker));
}
