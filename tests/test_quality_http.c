/* Quality of reuse over HTTP (DESIGN §15), real chunkgate-worker and chunkgate processes: the
 * worker's recompute_ratio (assemble, completions and chat, --recompute-ratio default, refused
 * out of range), quality_probe (chunk_cache.quality in JSON answers and as the last event of a
 * stream, KL ~ 0 at recompute_ratio 1), the canary (--canary-rate 1 moves the canary metrics and
 * the /healthz summary after sampled requests, --canary-rate 0 does not), and the gateway (both
 * options passed through, --recompute-default per model, chunk_cache.recomputed_tokens and
 * .quality, canary figures in /v1/stats and on the status page). */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"

static th_proc wk, w0, gw;
static char model_dir[300], wurl[64];

/* A RAG prompt: system, three documents in the given order, question. */
static const char *DOCS[3] = {
    "Document A. The harbour town exported dried cod and tar; in 1761 a fire destroyed the "
    "customs house and the ledgers moved to the church vault.",
    "Document B. Rainfall in the valley averaged 812 millimetres; in 2024 the two oldest gauges "
    "were replaced after drifting by four percent.",
    "Document C. The cooperative amended its bylaws in March: postal votes, a quorum of one "
    "third, and a three-year term for the treasurer.",
};

static void prompt(char *out, size_t n, int a, int b, int c)
{
    snprintf(out, n,
             "You answer from the documents. # # %s # # %s # # %s # # Question: what "
             "changed in 2024?",
             DOCS[a], DOCS[b], DOCS[c]);
}

static json_t *post(int port, const char *path, json_t *body, long want)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    th_resp r;
    th_http(&r, port, "POST", path, text, NULL, NULL);
    free(text);
    ck_assert_msg(r.status == want, "%s: HTTP %ld (want %ld): %.*s", path, r.status, want,
                  (int)r.body.len, r.body.data ? r.body.data : "");
    json_t *j = th_json(&r);
    th_resp_free(&r);
    ck_assert_ptr_nonnull(j);
    return j;
}

static json_t *healthz(int port)
{
    th_resp r;
    th_http(&r, port, "GET", "/healthz", NULL, NULL, NULL);
    json_t *j = th_json(&r);
    th_resp_free(&r);
    return j;
}

static void setup(void)
{
    if (th_init_with_model("quality", WORKER_BIN, model_dir, sizeof model_dir) != 0) abort();
    const char *e[] = {"--canary-rate", "1", "--canary-tokens", "6", NULL};
    if (th_start_worker(&wk, WORKER_BIN, model_dir, 0, "wk", e) != 0) abort();
    const char *e0[] = {"--canary-rate", "0", "--recompute-ratio", "1", NULL};
    if (th_start_worker(&w0, WORKER_BIN, model_dir, 0, "w0", e0) != 0) abort();
    snprintf(wurl, sizeof wurl, "http://127.0.0.1:%d", wk.port);
    const char *g[] = {"--health-interval-ms",
                       "200",
                       "--recompute-default",
                       MODEL "=0.5:4",
                       "--recompute-default",
                       "*=0.2",
                       NULL};
    if (th_start_gateway_to(&gw, CHUNKGATE_BIN, "gw", wurl, NULL, g) != 0) abort();
}

static void teardown(void)
{
    th_stop_clean(&gw, "chunkgate");
    th_stop_clean(&wk, "chunkgate-worker (canary 1)");
    th_stop_clean(&w0, "chunkgate-worker (canary 0)");
    th_cleanup(th_failures);
}

/* ---- the worker ---- */

/* field: value is refused with a 400 naming the field, by /v1/assemble (with segs) and by
 * /v1/completions; takes value's reference. */
static void refused_on_both(json_t *segs, const char *field, json_t *value)
{
    json_t *e =
        post(wk.port, "/v1/assemble", json_pack("{s:O, s:O}", "segments", segs, field, value), 400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                     field);
    json_decref(e);
    e = post(wk.port, "/v1/completions", json_pack("{s:s, s:O}", "prompt", "a # # b", field, value),
             400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                     field);
    json_decref(e);
    json_decref(value);
}

START_TEST(worker_recompute_ratio)
{
    /* Segments of one chunk of known length (the tiny model's tokens are bytes). */
    json_t *segs =
        json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}]", "role", "system", "text", "Sys.", "role",
                  "chunk", "text", DOCS[0], "role", "question", "text", "Q?");
    json_t *a = post(wk.port, "/v1/assemble",
                     json_pack("{s:O, s:f}", "segments", segs, "recompute_ratio", 0.5), 200);
    int n = (int)strlen(DOCS[0]);
    ck_assert_int_eq(json_integer_value(json_object_get(a, "recomputed_tokens")), (n + 1) / 2);
    json_decref(a);
    /* no field: the worker's --recompute-ratio (0 here, 1 on w0) */
    a = post(wk.port, "/v1/assemble", json_pack("{s:O}", "segments", segs), 200);
    ck_assert_int_eq(json_integer_value(json_object_get(a, "recomputed_tokens")), 0);
    json_decref(a);
    a = post(w0.port, "/v1/assemble", json_pack("{s:O}", "segments", segs), 200);
    ck_assert_int_eq(json_integer_value(json_object_get(a, "recomputed_tokens")), n);
    json_decref(a);
    /* out of range, wrong type: 400 naming the field, on both routes */
    json_t *bad[] = {json_real(1.5), json_real(-0.1), json_string("half")};
    for (size_t i = 0; i < CG_ARRAY_LEN(bad); i++)
        refused_on_both(segs, "recompute_ratio", bad[i]);
    /* recompute_select: the question's ranking recomputes as many tokens; an unknown ranking
     * or another type is refused naming the field */
    a = post(wk.port, "/v1/assemble",
             json_pack("{s:O, s:f, s:s}", "segments", segs, "recompute_ratio", 0.5,
                       "recompute_select", "question"),
             200);
    ck_assert_int_eq(json_integer_value(json_object_get(a, "recomputed_tokens")), (n + 1) / 2);
    json_decref(a);
    json_t *bad_sel[] = {json_string("best"), json_integer(1)};
    for (size_t i = 0; i < CG_ARRAY_LEN(bad_sel); i++)
        refused_on_both(segs, "recompute_select", bad_sel[i]);
    json_t *e = post(wk.port, "/v1/completions",
                     json_pack("{s:s, s:s}", "prompt", "a # # b", "quality_probe", "yes"), 400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                     "quality_probe");
    json_decref(e);
    json_decref(segs);
    /* /v1/info says what the defaults are */
    th_resp r;
    th_http(&r, w0.port, "GET", "/v1/info", NULL, NULL, NULL);
    json_t *info = th_json(&r);
    ck_assert(json_real_value(json_object_get(info, "recompute_ratio")) == 1.0);
    ck_assert_str_eq(json_string_value(json_object_get(info, "recompute_select")), "deviation");
    ck_assert(json_real_value(json_object_get(info, "canary_rate")) == 0.0);
    json_decref(info);
    th_resp_free(&r);
}
END_TEST

static json_t *quality_of(json_t *answer)
{
    return json_object_get(json_object_get(answer, "chunk_cache"), "quality");
}

START_TEST(worker_quality_probe)
{
    char p[1024];
    prompt(p, sizeof p, 0, 1, 2);
    json_t *j = post(w0.port, "/v1/completions",
                     json_pack("{s:s, s:i, s:b, s:f, s:i}", "prompt", p, "max_tokens", 12,
                               "quality_probe", 1, "recompute_ratio", 1.0, "temperature", 0),
                     200);
    json_t *q = quality_of(j);
    ck_assert_msg(json_is_object(q), "no chunk_cache.quality");
    ck_assert_msg(json_real_value(json_object_get(q, "kl")) <= 1e-6, "KL at r=1: %g",
                  json_real_value(json_object_get(q, "kl")));
    ck_assert(json_real_value(json_object_get(q, "top1_agree")) == 1.0);
    /* the prompt's end and 11 generated tokens: --canary-tokens is 16 on w0 */
    ck_assert_int_eq(json_integer_value(json_object_get(q, "tokens_compared")), 12);
    ck_assert_int_gt(
        json_integer_value(json_object_get(json_object_get(j, "chunk_cache"), "recomputed_tokens")),
        300);
    json_decref(j);
    /* reordered, from the pool, no recompute: reuse costs something */
    prompt(p, sizeof p, 2, 0, 1);
    j = post(w0.port, "/v1/completions",
             json_pack("{s:s, s:i, s:b, s:f, s:i}", "prompt", p, "max_tokens", 4, "quality_probe",
                       1, "recompute_ratio", 0.0, "temperature", 0),
             200);
    q = quality_of(j);
    ck_assert(json_is_object(q));
    ck_assert_msg(json_real_value(json_object_get(q, "kl")) > 1e-4, "KL at r=0: %g",
                  json_real_value(json_object_get(q, "kl")));
    ck_assert_int_eq(json_integer_value(json_object_get(q, "tokens_compared")), 4);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "chunk_cache"), "recomputed_tokens")),
        0);
    json_decref(j);
    /* a plain prompt has no reuse to compare */
    j = post(
        w0.port, "/v1/completions",
        json_pack("{s:s, s:i, s:b}", "prompt", "plain prompt", "max_tokens", 2, "quality_probe", 1),
        200);
    ck_assert(json_is_null(quality_of(j)));
    json_decref(j);
    /* the worker's own chat route passes both options on */
    j = post(w0.port, "/v1/chat/completions",
             json_pack("{s:[{s:s, s:s}], s:[s, s], s:i, s:b, s:f, s:i}", "messages", "role", "user",
                       "content", "What changed?", "documents", DOCS[0], DOCS[2], "max_tokens", 3,
                       "quality_probe", 1, "recompute_ratio", 1.0, "temperature", 0),
             200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    q = quality_of(j);
    ck_assert_msg(json_is_object(q), "no quality on a worker chat answer");
    ck_assert_int_eq(json_integer_value(json_object_get(q, "tokens_compared")), 3);
    ck_assert(json_real_value(json_object_get(q, "kl")) <= 1e-6);
    json_decref(j);
    /* without quality_probe there is no chunk_cache */
    j = post(w0.port, "/v1/completions", json_pack("{s:s, s:i}", "prompt", p, "max_tokens", 2),
             200);
    ck_assert_ptr_null(json_object_get(j, "chunk_cache"));
    json_decref(j);
}
END_TEST

/* The stream's last event before [DONE] carries the comparison; no event before it does. */
static json_t *stream_quality(int port, const char *path, json_t *body, int *n_before)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    long status = 0;
    char **ev = NULL;
    int n = 0;
    ck_assert_int_eq(th_sse_data(port, path, text, NULL, &status, &ev, &n), CURLE_OK);
    free(text);
    ck_assert_int_eq(status, 200);
    ck_assert_int_ge(n, 3);
    ck_assert_str_eq(ev[n - 1], "[DONE]");
    json_t *last = json_loads(ev[n - 2], 0, NULL);
    ck_assert_ptr_nonnull(last);
    ck_assert_int_eq(json_array_size(json_object_get(last, "choices")), 0);
    json_t *cc = json_incref(json_object_get(last, "chunk_cache"));
    json_decref(last);
    *n_before = 0;
    for (int i = 0; i < n - 2; i++) {
        json_t *e = json_loads(ev[i], 0, NULL);
        *n_before += json_object_get(e, "chunk_cache") != NULL;
        json_decref(e);
    }
    th_sse_data_free(ev, n);
    return cc;
}

START_TEST(worker_stream_probe)
{
    char p[1024];
    prompt(p, sizeof p, 1, 2, 0);
    int before = 0;
    json_t *cc = stream_quality(wk.port, "/v1/completions",
                                json_pack("{s:s, s:i, s:b, s:b, s:f, s:i}", "prompt", p,
                                          "max_tokens", 10, "stream", 1, "quality_probe", 1,
                                          "recompute_ratio", 0.3, "temperature", 0),
                                &before);
    ck_assert_int_eq(before, 0);
    json_t *q = json_object_get(cc, "quality");
    ck_assert(json_is_object(q));
    /* --canary-tokens 6 on this worker: the prompt's end and 6 generated tokens */
    ck_assert_int_eq(json_integer_value(json_object_get(q, "tokens_compared")), 7);
    ck_assert(json_real_value(json_object_get(q, "kl")) >= 0);
    ck_assert_int_gt(json_integer_value(json_object_get(cc, "recomputed_tokens")), 0);
    json_decref(cc);
}
END_TEST

static double sampled_ok(int port)
{
    return th_metric(port, "chunkgate_worker_canary_requests_total{kind=\"sampled\","
                           "result=\"ok\"}");
}

START_TEST(canary_metrics_move)
{
    ck_assert(sampled_ok(wk.port) <= 0);
    char p[1024];
    int orders[3][3] = {{0, 1, 2}, {2, 1, 0}, {1, 0, 2}};
    for (int i = 0; i < 3; i++) {
        prompt(p, sizeof p, orders[i][0], orders[i][1], orders[i][2]);
        json_t *j =
            post(wk.port, "/v1/completions",
                 json_pack("{s:s, s:i, s:i}", "prompt", p, "max_tokens", 8, "temperature", 0), 200);
        json_decref(j);
        /* one at a time: the queue holds 4, nothing is dropped */
        for (int t = 0; t < 300 && sampled_ok(wk.port) < i + 1; t++)
            th_sleep_ms(100);
    }
    ck_assert_msg(sampled_ok(wk.port) == 3, "sampled comparisons: %g", sampled_ok(wk.port));
    const char *l = "{mode=\"strict\",recompute_ratio=\"0.00\",recompute_prefix_tokens=\"0\","
                    "recompute_select=\"deviation\"}";
    char series[256];
    snprintf(series, sizeof series, "chunkgate_worker_canary_kl_nats_count%s", l);
    ck_assert(th_metric(wk.port, series) == 3);
    snprintf(series, sizeof series, "chunkgate_worker_canary_tokens_compared_total%s", l);
    ck_assert(th_metric(wk.port, series) == 21); /* 3 x (prompt end + 6 tokens) */
    snprintf(series, sizeof series, "chunkgate_worker_canary_top1_agreed_total%s", l);
    double agreed = th_metric(wk.port, series);
    ck_assert(agreed >= 0 && agreed <= 21);
    snprintf(series, sizeof series, "chunkgate_worker_canary_top1_agreement_ratio_count%s", l);
    ck_assert(th_metric(wk.port, series) == 3);
    json_t *h = healthz(wk.port);
    json_t *c = json_object_get(h, "canary");
    ck_assert_int_ge(json_integer_value(json_object_get(c, "requests")), 3);
    ck_assert(json_real_value(json_object_get(c, "kl_mean")) > 0);
    json_decref(h);
    /* --canary-rate 0: no comparison unless asked */
    prompt(p, sizeof p, 0, 2, 1);
    json_t *j = post(w0.port, "/v1/completions",
                     json_pack("{s:s, s:i}", "prompt", p, "max_tokens", 4), 200);
    json_decref(j);
    th_sleep_ms(500);
    ck_assert(sampled_ok(w0.port) <= 0);
}
END_TEST

/* ---- the gateway ---- */

START_TEST(gateway_pass_through)
{
    char p[1024];
    prompt(p, sizeof p, 0, 1, 2);
    /* the model's default: ratio 0.5 and 4 prefix tokens */
    json_t *j =
        post(gw.port, "/v1/completions",
             json_pack("{s:s, s:s, s:i}", "model", MODEL, "prompt", p, "max_tokens", 2), 200);
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(json_is_false(json_object_get(cc, "fallback")));
    int n = 0;
    for (int i = 0; i < 3; i++)
        n += (int)strlen(DOCS[i]) + 1; /* " " around each */
    json_int_t rec = json_integer_value(json_object_get(cc, "recomputed_tokens"));
    ck_assert_msg(rec >= n / 2 - 3 && rec <= n / 2 + 12, "recomputed %lld of ~%d", (long long)rec,
                  n);
    ck_assert_ptr_null(json_object_get(cc, "quality")); /* not asked */
    json_decref(j);
    /* the request's own values win */
    j = post(gw.port, "/v1/completions",
             json_pack("{s:s, s:s, s:i, s:f, s:i}", "model", MODEL, "prompt", p, "max_tokens", 2,
                       "recompute_ratio", 0.0, "recompute_prefix_tokens", 0),
             200);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "chunk_cache"), "recomputed_tokens")),
        0);
    json_decref(j);
    /* quality_probe reaches the worker, its comparison comes back in chunk_cache */
    j = post(gw.port, "/v1/completions",
             json_pack("{s:s, s:s, s:i, s:b, s:f, s:i}", "model", MODEL, "prompt", p, "max_tokens",
                       5, "quality_probe", 1, "recompute_ratio", 1.0, "temperature", 0),
             200);
    json_t *q = quality_of(j);
    ck_assert_msg(json_is_object(q), "no quality through the gateway");
    ck_assert_int_eq(json_integer_value(json_object_get(q, "tokens_compared")), 5);
    ck_assert(json_real_value(json_object_get(q, "kl")) <= 1e-6);
    ck_assert_ptr_nonnull(json_object_get(json_object_get(j, "chunk_cache"), "segments"));
    json_decref(j);
    /* chat, streamed: the gateway's chunk_cache on the first event, and again with the
     * comparison on the last */
    int before = 0;
    json_t *body =
        json_pack("{s:s, s:[{s:s, s:s}], s:[s, s], s:i, s:b, s:b, s:i}", "model", MODEL, "messages",
                  "role", "user", "content", "What changed?", "documents", DOCS[1], DOCS[2],
                  "max_tokens", 3, "stream", 1, "quality_probe", 1, "temperature", 0);
    cc = stream_quality(gw.port, "/v1/chat/completions", body, &before);
    ck_assert_int_eq(before, 1);
    ck_assert_ptr_nonnull(json_object_get(cc, "segments"));
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(cc, "quality"), "tokens_compared")), 3);
    json_decref(cc);
    /* refused by the gateway itself */
    json_t *e = post(
        gw.port, "/v1/completions",
        json_pack("{s:s, s:s, s:f}", "model", MODEL, "prompt", p, "recompute_ratio", 1.5), 400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                     "recompute_ratio");
    json_decref(e);
    e = post(gw.port, "/v1/completions",
             json_pack("{s:s, s:s, s:s}", "model", MODEL, "prompt", p, "recompute_select", "best"),
             400);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(e, "error"), "param")),
                     "recompute_select");
    json_decref(e);
}
END_TEST

START_TEST(gateway_status_quality)
{
    /* The probes above (and sampled requests: --canary-rate 1) reach the worker's summary,
     * which the gateway reads with every health check. */
    char p[1024];
    prompt(p, sizeof p, 2, 0, 1);
    json_t *j = post(gw.port, "/v1/completions",
                     json_pack("{s:s, s:s, s:i, s:b}", "model", MODEL, "prompt", p, "max_tokens", 2,
                               "quality_probe", 1),
                     200);
    json_decref(j);
    /* recompute_select reaches the worker through the gateway: its comparison is a setting
     * of its own */
    j = post(gw.port, "/v1/completions",
             json_pack("{s:s, s:s, s:i, s:b, s:s}", "model", MODEL, "prompt", p, "max_tokens", 2,
                       "quality_probe", 1, "recompute_select", "question"),
             200);
    json_decref(j);
    json_t *quality = NULL;
    int found = 0;
    for (int t = 0; t < 100 && found != 3; t++) {
        th_resp r;
        th_http(&r, gw.port, "GET", "/v1/stats", NULL, NULL, NULL);
        json_t *s = th_json(&r);
        th_resp_free(&r);
        json_decref(quality);
        quality = json_incref(json_object_get(s, "quality"));
        json_decref(s);
        size_t i;
        json_t *row;
        json_array_foreach(json_object_get(quality, "settings"), i, row)
        {
            const char *sel = json_string_value(json_object_get(row, "recompute_select"));
            if (!strcmp(json_string_value(json_object_get(row, "recompute_ratio")), "0.50") &&
                !strcmp(json_string_value(json_object_get(row, "recompute_prefix_tokens")), "1-8"))
                found |= sel && !strcmp(sel, "deviation")  ? 1
                         : sel && !strcmp(sel, "question") ? 2
                                                           : 0;
        }
        if (found != 3) th_sleep_ms(100);
    }
    ck_assert_msg(found & 1, "the default setting's comparison is not in /v1/stats");
    ck_assert_msg(found & 2, "recompute_select \"question\" is not a setting in /v1/stats");
    ck_assert_int_ge(json_integer_value(json_object_get(quality, "requests")), 1);
    ck_assert(json_is_real(json_object_get(quality, "top1_agreement")));
    json_decref(quality);
    th_resp r;
    th_http(&r, gw.port, "GET", "/", NULL, NULL, NULL);
    ck_assert_ptr_nonnull(strstr(r.body.data, "Reuse quality"));
    th_resp_free(&r);
}
END_TEST

int main(void)
{
    th_fixture fx = {setup, teardown, 0};
    return th_run_suite("quality_http", "http", 240, fx, CK_FORK_GETENV,
                        TH_TESTS(worker_recompute_ratio, worker_quality_probe, worker_stream_probe,
                                 canary_metrics_move, gateway_pass_through,
                                 gateway_status_quality));
}
