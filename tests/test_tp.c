/* Integration suite for the backend role with tensor parallelism, with real processes: one
 * chunkgate-worker builds assemblies (the source), others serve /v1/completions with
 * --kv-source and --tp N and pull the KV head range by head range, one request per rank.
 * With 4 KV heads, tp 1, 2, 4 and 8 (two ranks per head) give the same tokens and the same
 * logprobs as the source decoding its own assembly (the single-process path); the source's
 * assembly is released; another model or geometry at the source is refused. With several KV
 * workers behind a gateway, the decoding backend's --kv-source list is an allow-list: it pulls
 * from the worker the gateway names, and refuses (403) one that is not on the list. */
#include <check.h>
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/serve/kvpull.h"
#include "worker/model/model.h"
#include "base/base.h"
#include "tests/harness/harness.h"

#define ERRLEN 512
#define MAX_TOKENS 24
#define TOP 5

static char model_dir[300], other_dir[300], kv2_dir[300];

/* the source, a source with another model id, a source with 2 KV heads, backends tp 1/2/4/8
 * (which trust a request's kv_transfer_params.worker: --kv-request-source 1), a backend that
 * does not (the default), and one whose --kv-source never answers */
static th_proc src, src_other, src_kv2, be[4], guarded, hung;
/* a second source, a third one no backend lists, a backend listing src and src2, and a
 * gateway routing to src and src2 with that backend */
static th_proc src2, src3, multi, gw;
static int hung_fd = -1;
static const int TPS[4] = {1, 2, 4, 8};

static const char *SYS = "You answer in one line, from the documents only.";
static const char *DOCA = TH_DOC_A, *DOCB = TH_DOC_B, *QUESTION = TH_QUESTION;

/* ---- processes ---- */

/* Starts `chunkgate-worker serve --model dir --pool-mb 16` plus extra arguments
 * (NULL-terminated); returns 0 once it listens, -1 when it did not (an exit leaves its status
 * in w->wstatus). */
static int start(th_proc *w, const char *name, const char *dir, const char *const *extra)
{
    const char *args[32] = {"--pool-mb", "16"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 30; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return th_start_worker(w, WORKER_BIN, dir, 0, name, args);
}

/* SIGTERM; returns 0 when the worker exited cleanly (status 0: no sanitizer report either). */
static int stop(th_proc *w)
{
    if (w->pid <= 0) return 0;
    return th_stop_clean(w, "chunkgate-worker") ? 0 : -1;
}

/* ---- HTTP ---- */

/* A request to w; asserts that it was answered. */
static th_resp http(const th_proc *w, const char *method, const char *path, const char *body)
{
    th_resp r;
    th_http(&r, w->port, method, path, body, NULL, NULL);
    ck_assert_msg(r.rc == CURLE_OK, "%s %s%s: %s", method, w->url, path, curl_easy_strerror(r.rc));
    return r;
}

static json_t *call(const th_proc *w, const char *method, const char *path, json_t *body, long want)
{
    return th_call(w->port, method, path, body, NULL, want);
}

/* An absent counter has not moved: 0. */
static double metric(const th_proc *w, const char *series)
{
    return th_counter(w->port, series);
}

/* Counted by the source once its reply is out: read with th_counter_settled. */
#define KV_REQUESTS "chunkgate_worker_requests_total{route=\"assembly_kv\",code=\"200\"}"

/* Assembles the test prompt on w; returns the assembly (caller decrefs). */
static json_t *assemble(const th_proc *w)
{
    json_t *segs = th_segments(SYS, DOCA, DOCB, QUESTION);
    return call(w, "POST", "/v1/assemble", json_pack("{s:o}", "segments", segs), 200);
}

/* Decodes assembly id on w (greedy, logprobs); worker_url: kv_transfer_params.worker or NULL. */
static json_t *decode(const th_proc *w, const char *id, const char *worker_url, long want)
{
    json_t *ktp = json_pack("{s:s}", "assembly_id", id);
    if (worker_url) json_object_set_new(ktp, "worker", json_string(worker_url));
    return call(w, "POST", "/v1/completions",
                json_pack("{s:o, s:i, s:f, s:i}", "kv_transfer_params", ktp, "max_tokens",
                          MAX_TOKENS, "temperature", 0.0, "logprobs", TOP),
                want);
}

static json_t *choice0(json_t *r)
{
    return json_array_get(json_object_get(r, "choices"), 0);
}

static int close_enough(double a, double b)
{
    return fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b));
}

/* The same tokens, and logprobs of the chosen and top tokens within 1e-6 relative; returns how
 * many of the chosen tokens' logprobs are bit-identical. */
static int assert_same_decode(json_t *got, json_t *ref, int tp)
{
    json_t *g = json_object_get(choice0(got), "logprobs"),
           *r = json_object_get(choice0(ref), "logprobs");
    ck_assert_str_eq(th_sget(choice0(got), "text"), th_sget(choice0(ref), "text"));
    json_t *gi = json_object_get(g, "token_ids"), *ri = json_object_get(r, "token_ids");
    ck_assert_int_eq(json_array_size(gi), json_array_size(ri));
    ck_assert_int_gt(json_array_size(ri), 0);
    int exact = 0;
    for (size_t t = 0; t < json_array_size(ri); t++) {
        ck_assert_int_eq(json_integer_value(json_array_get(gi, t)),
                         json_integer_value(json_array_get(ri, t)));
        double a = json_real_value(json_array_get(json_object_get(g, "token_logprobs"), t));
        double b = json_real_value(json_array_get(json_object_get(r, "token_logprobs"), t));
        ck_assert_msg(close_enough(a, b), "tp %d, token %zu: logprob %.17g vs %.17g", tp, t, a, b);
        exact += a == b;
        json_t *gt = json_array_get(json_object_get(g, "top_logprobs"), t);
        json_t *rt = json_array_get(json_object_get(r, "top_logprobs"), t);
        ck_assert_int_eq(json_object_size(gt), json_object_size(rt));
        const char *k;
        json_t *v;
        json_object_foreach(rt, k, v)
        {
            json_t *o = json_object_get(gt, k);
            ck_assert_msg(o != NULL, "tp %d, token %zu: top entry missing", tp, t);
            ck_assert(close_enough(json_real_value(o), json_real_value(v)));
        }
    }
    json_t *gu = json_object_get(got, "usage"), *ru = json_object_get(ref, "usage");
    ck_assert_int_eq(th_iget(gu, "prompt_tokens"), th_iget(ru, "prompt_tokens"));
    return exact;
}

/* ---- tests ---- */

START_TEST(test_slices)
{
    /* 4 KV heads: tp 1, 2, 4 own 4, 2, 1 heads; tp 8 shares each head between 2 ranks */
    for (int t = 0; t < 4; t++) {
        int tp = TPS[t], covered[4] = {0};
        ck_assert_int_eq(cg_tp_check(4, tp), CG_OK);
        for (int r = 0; r < tp; r++) {
            cg_tp_slice s = cg_tp_slice_of(4, tp, r);
            ck_assert_int_eq(s.n_heads, tp <= 4 ? 4 / tp : 1);
            ck_assert_int_eq(s.head0, tp <= 4 ? r * (4 / tp) : r / 2);
            ck_assert_int_eq(s.leader, tp <= 4 ? 1 : r % 2 == 0);
            for (int h = s.head0; h < s.head0 + s.n_heads; h++)
                covered[h] += s.leader;
        }
        for (int h = 0; h < 4; h++)
            ck_assert_int_eq(covered[h], 1); /* every head written exactly once */
    }
    ck_assert_int_eq(cg_tp_check(4, 3), CG_E_VALUE);
    ck_assert_int_eq(cg_tp_check(4, 6), CG_E_VALUE);
    ck_assert_int_eq(cg_tp_check(4, 12), CG_OK);
    ck_assert_int_eq(cg_tp_check(8, 2), CG_OK);
    ck_assert(cg_kvpull_url_ok("http://127.0.0.1:8090"));
    ck_assert(cg_kvpull_url_ok("https://worker-1.example/"));
    ck_assert(!cg_kvpull_url_ok("ftp://127.0.0.1"));
    ck_assert(!cg_kvpull_url_ok("http://"));
    ck_assert(!cg_kvpull_url_ok("http://a b"));
    ck_assert(!cg_kvpull_url_ok(NULL));
}
END_TEST

START_TEST(test_tp_matrix)
{
    /* the single-process path: the source decodes its own assembly */
    json_t *a = assemble(&src);
    char path[128];
    snprintf(path, sizeof path, "/v1/assemblies/%s/logits", th_sget(a, "assembly_id"));
    th_resp lg = http(&src, "GET", path, NULL);
    ck_assert_int_eq(lg.status, 200);
    th_resp_free(&lg);
    json_t *ref = decode(&src, th_sget(a, "assembly_id"), NULL, 200);
    json_decref(a);

    for (int t = 0; t < 4; t++) {
        const int tp = TPS[t];
        double kv0 = metric(&src, KV_REQUESTS);
        double pulls0 = metric(&be[t], "chunkgate_worker_kv_pull_requests_total");
        a = assemble(&src);
        const char *id = th_sget(a, "assembly_id");
        /* backend tp 1 has no --kv-source: the request names the worker */
        json_t *got = decode(&be[t], id, tp == 1 ? src.url : NULL, 200);
        int exact = assert_same_decode(got, ref, tp);
        /* usage reports the source's cached tokens */
        ck_assert_int_eq(
            th_iget(json_object_get(json_object_get(got, "usage"), "prompt_tokens_details"),
                    "cached_tokens"),
            th_iget(a, "cached_tokens"));
        ck_assert_int_gt(th_iget(a, "cached_tokens"), 0);
        fprintf(stderr, "tp %d: %d of %d token logprobs bit-identical to the single-process path\n",
                tp, exact, MAX_TOKENS);
        /* each rank fetched its heads with its own request, and only those */
        ck_assert_double_eq(th_counter_settled(src.port, KV_REQUESTS, kv0 + tp) - kv0, tp);
        ck_assert_double_eq(metric(&be[t], "chunkgate_worker_kv_pull_requests_total") - pulls0, tp);
        /* the source's assembly was released after the pull; the pulled copy was consumed */
        ck_assert_double_eq(metric(&src, "chunkgate_worker_assemblies_live"), 0);
        ck_assert_double_eq(metric(&be[t], "chunkgate_worker_assemblies_live"), 0);
        json_t *e = decode(&be[t], id, tp == 1 ? src.url : NULL, 404);
        ck_assert_str_eq(th_sget(json_object_get(e, "error"), "code"), "not_found");
        json_decref(e);
        json_decref(got);
        json_decref(a);
    }
    json_decref(ref);
}
END_TEST

/* The KV arrives through a stream too, with the same text. */
START_TEST(test_stream)
{
    json_t *a = assemble(&src);
    json_t *ref = decode(&src, th_sget(a, "assembly_id"), NULL, 200);
    json_decref(a);
    a = assemble(&src);
    json_t *body = json_pack("{s:{s:s}, s:i, s:f, s:b}", "kv_transfer_params", "assembly_id",
                             th_sget(a, "assembly_id"), "max_tokens", MAX_TOKENS, "temperature",
                             0.0, "stream", 1);
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    th_resp r = http(&be[2], "POST", "/v1/completions", b);
    free(b);
    ck_assert_int_eq(r.status, 200);
    cg_buf text;
    cg_buf_init_unbounded(&text);
    int done = 0;
    for (char *p = r.body.data; p && (p = strstr(p, "data: "));) {
        p += 6;
        if (!strncmp(p, "[DONE]", 6)) {
            done = 1;
            break;
        }
        json_t *j = json_loads(p, JSON_DISABLE_EOF_CHECK, NULL);
        ck_assert_ptr_nonnull(j);
        const char *t = th_sget(choice0(j), "text");
        ck_assert_int_eq(cg_buf_append(&text, t, strlen(t)), CG_OK);
        json_decref(j);
    }
    ck_assert(done);
    ck_assert_str_eq(text.data ? text.data : "", th_sget(choice0(ref), "text"));
    cg_buf_free(&text);
    th_resp_free(&r);
    json_decref(ref);
    json_decref(a);
}
END_TEST

START_TEST(test_refusals)
{
    /* unknown at the source */
    json_t *e = decode(&be[2], "0123456789abcdef0123456789abcdef", NULL, 404);
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "code"), "not_found");
    json_decref(e);

    /* a source serving another model id: refused, and its assembly released */
    json_t *a = assemble(&src_other);
    e = decode(&be[2], th_sget(a, "assembly_id"), src_other.url, 502);
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "code"), "bad_gateway");
    ck_assert_ptr_nonnull(
        strstr(th_sget(json_object_get(e, "error"), "message"), "chunkgate-other"));
    ck_assert_double_eq(metric(&src_other, "chunkgate_worker_assemblies_live"), 0);
    json_decref(e);
    json_decref(a);

    /* the same model id with other weights (2 KV heads): the fingerprint in the KV model
     * gives it away */
    a = assemble(&src_kv2);
    e = decode(&be[1], th_sget(a, "assembly_id"), src_kv2.url, 502);
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "code"), "bad_gateway");
    ck_assert_ptr_nonnull(
        strstr(th_sget(json_object_get(e, "error"), "message"), "another model or checkpoint"));
    ck_assert_double_eq(metric(&src_kv2, "chunkgate_worker_assemblies_live"), 0);
    json_decref(e);
    json_decref(a);
    ck_assert_double_gt(metric(&be[1], "chunkgate_worker_kv_pulls_total{result=\"error\"}"), 0);

    /* max_tokens beyond the context: refused after the logits, before any KV moves, and the
     * source keeps its assembly: the same request with fewer tokens succeeds */
    json_t *info = call(&be[2], "GET", "/v1/info", NULL, 200);
    const long long max_pos = th_iget(info, "max_positions");
    json_decref(info);
    a = assemble(&src);
    json_t *ktp =
        json_pack("{s:s, s:s}", "assembly_id", th_sget(a, "assembly_id"), "worker", src.url);
    e = call(&be[2], "POST", "/v1/completions",
             json_pack("{s:o, s:I, s:f}", "kv_transfer_params", ktp, "max_tokens",
                       (json_int_t)max_pos, "temperature", 0.0),
             400);
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "code"), "context_length_exceeded");
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "param"), "max_tokens");
    json_decref(e);
    ck_assert_double_eq(metric(&src, "chunkgate_worker_assemblies_live"), 1);
    json_decref(decode(&be[2], th_sget(a, "assembly_id"), src.url, 200));
    json_decref(a);

    /* a worker URL that is not http(s) */
    e = decode(&be[2], "0123456789abcdef0123456789abcdef", "file:///etc/passwd", 400);
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "param"), "kv_transfer_params.worker");
    json_decref(e);
    /* nobody listens there */
    e = decode(&be[2], "0123456789abcdef0123456789abcdef", "http://127.0.0.1:1", 503);
    json_decref(e);
    /* the backends still serve */
    a = assemble(&src);
    json_t *ok = decode(&be[3], th_sget(a, "assembly_id"), NULL, 200);
    json_decref(ok);
    json_decref(a);

    /* a tp that does not split the KV heads is refused at start */
    th_proc w;
    const char *bad[] = {"--kv-source", src.url, "--tp", "3", NULL};
    ck_assert_int_eq(start(&w, "tp3", model_dir, bad), -1);
    ck_assert(WIFEXITED(w.wstatus) && WEXITSTATUS(w.wstatus) != 0);
    ck_assert(th_file_has(w.log, "--tp 3 cannot split"));
}
END_TEST

/* A request cannot choose where the worker pulls KV from: without --kv-request-source the
 * worker refuses kv_transfer_params.worker with 403 and connects nowhere. (Before, it sent a
 * GET and a DELETE to any host and port a client named.) */
START_TEST(test_request_source_refused)
{
    int port, fd = th_listen_silent(&port);
    ck_assert_int_ge(fd, 0);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    double pulls0 = metric(&guarded, "chunkgate_worker_kv_pull_requests_total");
    json_t *e = decode(&guarded, "0123456789abcdef0123456789abcdef", url, 403);
    ck_assert_str_eq(th_sget(json_object_get(e, "error"), "param"), "kv_transfer_params.worker");
    json_decref(e);
    ck_assert_int_eq(accept(fd, NULL, NULL), -1); /* nobody connected */
    ck_assert_double_eq(metric(&guarded, "chunkgate_worker_kv_pull_requests_total"), pulls0);
    close(fd);
    /* its configured --kv-source still works */
    json_t *a = assemble(&src);
    json_t *ok = decode(&guarded, th_sget(a, "assembly_id"), NULL, 200);
    json_decref(ok);
    json_decref(a);
}
END_TEST

typedef struct pull_call {
    const th_proc *w;
    th_resp r;
    int done;
} pull_call;

static void *pull_thread(void *arg)
{
    pull_call *pc = arg;
    const char *body = "{\"kv_transfer_params\":{\"assembly_id\":"
                       "\"0123456789abcdef0123456789abcdef\"},\"max_tokens\":1}";
    pc->r = http(pc->w, "POST", "/v1/completions", body);
    __atomic_store_n(&pc->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Pulls from a source that never answers are bounded: one at a time here (--kv-max-pulls 1),
 * the next is answered 503 with Retry-After at once instead of waiting for a job thread, and
 * the stuck pull ends at --kv-timeout-ms with 504. Other requests keep being served. */
START_TEST(test_pulls_bounded)
{
    pull_call first = {.w = &hung};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, pull_thread, &first), 0);
    /* wait until the first pull holds the only slot */
    for (int i = 0; i < 200 && metric(&hung, "chunkgate_worker_kv_pulls_in_flight") < 1; i++)
        th_sleep_ms(10);
    ck_assert_double_eq(metric(&hung, "chunkgate_worker_kv_pulls_in_flight"), 1);
    pull_call second = {.w = &hung};
    pull_thread(&second);
    ck_assert_int_eq(second.r.status, 503);
    char retry_after[16];
    ck_assert_str_eq(th_header(&second.r, "Retry-After", retry_after, sizeof retry_after), "1");
    ck_assert_msg(!__atomic_load_n(&first.done, __ATOMIC_ACQUIRE),
                  "the busy answer waited for the stuck pull");
    th_resp_free(&second.r);
    /* an unrelated request is served meanwhile */
    th_resp h = http(&hung, "GET", "/healthz", NULL);
    ck_assert_int_eq(h.status, 200);
    th_resp_free(&h);
    pthread_join(t, NULL);
    ck_assert_int_eq(first.r.status, 504);
    th_resp_free(&first.r);
    ck_assert_double_eq(metric(&hung, "chunkgate_worker_kv_pulls_total{result=\"busy\"}"), 1);
    ck_assert_double_eq(metric(&hung, "chunkgate_worker_kv_pulls_in_flight"), 0);
}
END_TEST

/* Several KV workers behind one gateway: the backend multi lists src and src2 (--kv-source
 * twice), the gateway names the worker that assembled each request in
 * kv_transfer_params.worker, and multi pulls from that one. Cold documents spread over both
 * sources; every answer is the assembling source's own computation; each source served the
 * pulls of its own assemblies. */
START_TEST(test_several_sources)
{
    json_t *mi = call(&multi, "GET", "/v1/info", NULL, 200);
    json_t *listed = json_object_get(mi, "kv_sources");
    ck_assert_int_eq(json_array_size(listed), 2);
    ck_assert_str_eq(json_string_value(json_array_get(listed, 1)), src2.url);
    json_decref(mi);
    json_t *si = call(&src, "GET", "/v1/info", NULL, 200);
    char *model = cg_strdup(th_sget(si, "model"));
    json_decref(si);
    const char *ok_pulls = "chunkgate_worker_kv_pulls_total{result=\"ok\"}";
    double pulls0 = metric(&multi, ok_pulls);
    double kv0[2] = {metric(&src, KV_REQUESTS), metric(&src2, KV_REQUESTS)};
    /* The earlier tests called the sources directly: until the gateway's health checks see
     * both idle, it counts that as other replicas' load and routes every cold request to the
     * idle-looking source (rightly). */
    ck_assert_msg(th_wait_workers_idle(gw.port, NULL, NULL),
                  "the gateway does not see both sources idle");
    /* Each request its own system prompt: nothing is cached across them, so every one is
     * routed cold, by load (none: they run one at a time) and then by its document's key. */
    enum { N = 8 };
    char prompt[N][300];
    char *text[N];
    int used[2] = {0, 0}, by[N];
    for (int i = 0; i < N; i++) {
        snprintf(prompt[i], sizeof prompt[i],
                 "Pull system %d. # # Pull document %d: the ferry leaves pier %d at dawn. # # "
                 "Which pier?",
                 i, i, 2 + i);
        json_t *r = th_call(gw.port, "POST", "/v1/completions",
                            json_pack("{s:s, s:s, s:i, s:f}", "model", model, "prompt", prompt[i],
                                      "max_tokens", 8, "temperature", 0.0),
                            NULL, 200);
        json_t *cc = json_object_get(r, "chunk_cache");
        ck_assert(json_is_false(json_object_get(cc, "fallback")));
        const char *w = th_sget(cc, "worker");
        ck_assert_ptr_nonnull(w);
        int k = !strcmp(w, src.url) ? 0 : !strcmp(w, src2.url) ? 1 : -1;
        ck_assert_msg(k >= 0, "routed to %s, not a source", w);
        used[k]++;
        by[i] = k;
        text[i] = cg_strdup(th_sget(choice0(r), "text"));
        json_decref(r);
    }
    /* the assembling source computing the same prompt itself (another salt: no reuse), after
     * the routed requests so that it adds no load while they are routed */
    for (int i = 0; i < N; i++) {
        json_t *direct = call(by[i] ? &src2 : &src, "POST", "/v1/completions",
                              json_pack("{s:s, s:i, s:f, s:s}", "prompt", prompt[i], "max_tokens",
                                        8, "temperature", 0.0, "cache_salt", "direct"),
                              200);
        ck_assert_str_eq(text[i], th_sget(choice0(direct), "text"));
        json_decref(direct);
        free(text[i]);
    }
    free(model);
    ck_assert_msg(used[0] > 0 && used[1] > 0, "the cold requests did not spread (%d/%d)", used[0],
                  used[1]);
    /* every answer was decoded on multi from a pull of the source that assembled it */
    ck_assert_double_eq(metric(&multi, ok_pulls) - pulls0, N);
    ck_assert_double_eq(th_counter_settled(src.port, KV_REQUESTS, kv0[0] + used[0]) - kv0[0],
                        used[0]);
    ck_assert_double_eq(th_counter_settled(src2.port, KV_REQUESTS, kv0[1] + used[1]) - kv0[1],
                        used[1]);

    /* a listed source named in another spelling of its base URL is the same worker */
    json_t *a = assemble(&src2);
    char slash[96];
    snprintf(slash, sizeof slash, "%s/v1/", src2.url);
    json_t *got = decode(&multi, th_sget(a, "assembly_id"), slash, 200);
    json_decref(got);
    json_decref(a);
}
END_TEST

/* A third KV worker, reachable but not on multi's --kv-source list: naming it is refused with
 * 403 in the OpenAI error shape, and multi never contacts it (the SSRF guard). */
START_TEST(test_unlisted_source_refused)
{
    json_t *a = assemble(&src3);
    const char *id = th_sget(a, "assembly_id");
    double pulls0 = metric(&multi, "chunkgate_worker_kv_pull_requests_total");
    double kv0 = metric(&src3, KV_REQUESTS);
    json_t *e = decode(&multi, id, src3.url, 403);
    th_assert_error_json(e, "forbidden", "kv_transfer_params.worker");
    json_decref(e);
    ck_assert_double_eq(metric(&multi, "chunkgate_worker_kv_pull_requests_total"), pulls0);
    ck_assert_double_eq(metric(&src3, KV_REQUESTS), kv0);
    /* nobody took or released it: it is still there */
    ck_assert_double_eq(metric(&src3, "chunkgate_worker_assemblies_live"), 1);
    char path[128];
    snprintf(path, sizeof path, "/v1/assemblies/%s", id);
    th_resp r = http(&src3, "DELETE", path, NULL);
    ck_assert_int_eq(r.status, 200);
    th_resp_free(&r);
    json_decref(a);
}
END_TEST

int main(void)
{
    int failed = 1;
    cg_log_init("test_tp", CG_LOG_WARN);
    th_init("test_tp", &(th_params){.http_timeout_s = 300});
    th_path(model_dir, sizeof model_dir, "model");
    th_path(other_dir, sizeof other_dir, "model-other");
    th_path(kv2_dir, sizeof kv2_dir, "model-kv2");
    const char *seed[] = {"--seed", "3", NULL};
    const char *other[] = {"--seed", "3", "--model-id", "chunkgate-other", NULL};
    char err[ERRLEN];
    cg_model_gen_params gp = cg_model_gen_default_params();
    gp.seed = 3;
    gp.n_kv_heads = 2; /* same model id, another geometry */
    if (th_gen_model(WORKER_BIN, model_dir, seed) != 0 ||
        th_gen_model(WORKER_BIN, other_dir, other) != 0 ||
        cg_model_generate(kv2_dir, gp, err, sizeof err) != CG_OK) {
        fprintf(stderr, "generate-model failed\n");
        goto out;
    }
    if (start(&src, "source", model_dir, NULL) != 0 ||
        start(&src_other, "source-other", other_dir, NULL) != 0 ||
        start(&src_kv2, "source-kv2", kv2_dir, NULL) != 0) {
        fprintf(stderr, "a source worker did not start; logs in %s\n", th_root());
        goto out;
    }
    for (int t = 0; t < 4; t++) {
        char name[16], tps[8];
        snprintf(name, sizeof name, "tp%d", TPS[t]);
        snprintf(tps, sizeof tps, "%d", TPS[t]);
        const char *with_src[] = {"--kv-source",         src.url, "--tp", tps,
                                  "--kv-request-source", "1",     NULL};
        const char *no_src[] = {"--tp", tps, "--kv-request-source", "1", NULL};
        if (start(&be[t], name, model_dir, TPS[t] == 1 ? no_src : with_src) != 0) {
            fprintf(stderr, "backend tp %d did not start; logs in %s\n", TPS[t], th_root());
            goto out;
        }
    }
    /* the suite's checks run in forked children; the listener lives in this process */
    int hung_port;
    hung_fd = th_listen_silent(&hung_port);
    if (hung_fd < 0) goto out;
    char hung_url[64];
    snprintf(hung_url, sizeof hung_url, "http://127.0.0.1:%d", hung_port);
    const char *guarded_args[] = {"--kv-source", src.url, NULL};
    const char *hung_args[] = {"--kv-source", hung_url, "--kv-max-pulls", "1", "--kv-timeout-ms",
                               "1500",        NULL};
    if (start(&guarded, "guarded", model_dir, guarded_args) != 0 ||
        start(&hung, "hung", model_dir, hung_args) != 0) {
        fprintf(stderr, "a guarded backend did not start; logs in %s\n", th_root());
        goto out;
    }
    if (start(&src2, "source2", model_dir, NULL) != 0 ||
        start(&src3, "source3", model_dir, NULL) != 0) {
        fprintf(stderr, "a source worker did not start; logs in %s\n", th_root());
        goto out;
    }
    const char *multi_args[] = {"--kv-source", src.url, "--kv-source", src2.url, NULL};
    const char *gw_args[] = {"--worker",  src.url,   "--worker", src2.url,
                             "--backend", multi.url, NULL};
    if (start(&multi, "multi", model_dir, multi_args) != 0 ||
        th_start_gateway(&gw, CHUNKGATE_BIN, "gw", gw_args) != 0 ||
        !th_wait_worker(gw.port, NULL, src.url, 1) || !th_wait_worker(gw.port, NULL, src2.url, 1)) {
        fprintf(stderr, "the several-sources setup did not start; logs in %s\n", th_root());
        goto out;
    }
    Suite *s = suite_create("tp");
    th_case(s, "processes", 300,
            TH_TESTS(test_slices, test_tp_matrix, test_request_source_refused, test_pulls_bounded,
                     test_stream, test_refusals, test_several_sources,
                     test_unlisted_source_refused));
    failed = th_run(s, CK_FORK_GETENV);
out:
    failed += stop(&src) != 0;
    failed += stop(&src_other) != 0;
    failed += stop(&src_kv2) != 0;
    for (int t = 0; t < 4; t++)
        failed += stop(&be[t]) != 0;
    failed += stop(&guarded) != 0;
    failed += stop(&hung) != 0;
    if (gw.pid > 0) failed += !th_stop_clean(&gw, "chunkgate");
    failed += stop(&multi) != 0;
    failed += stop(&src2) != 0;
    failed += stop(&src3) != 0;
    if (hung_fd >= 0) close(hung_fd);
    th_cleanup(failed);
    curl_global_cleanup();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
