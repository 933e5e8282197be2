/* Integration suite for chunkgate-worker: generates a model with the binary, starts the real
 * server on an ephemeral loopback port and talks HTTP to it with libcurl: info, assemble
 * (misses, then hits at new offsets), completions from an assembly equal to the "# #" prompt
 * and to an in-process reference forward, SSE, inventory and KV export, release, bad inputs,
 * client disconnects, concurrency and metrics. */
#include <check.h>
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/serve/engine.h"
#include "worker/serve/worker_api.h"
#include "base/base.h"
#include "kv/kvwire.h"
#include "tests/harness/harness.h"

static char model_dir[300], data_dir[300];
static th_proc worker;
static cg_model *model; /* the same model, loaded in-process for reference answers */

static const char *SYS1 = TH_SYSTEM, *SYS2 = "Terse mode: cite the document letter.";
static const char *DOCA = TH_DOC_A, *DOCB = TH_DOC_B, *QUESTION = TH_QUESTION;

/* ---- HTTP ---- */

/* A request to the worker; asserts it got an answer (or was cut on purpose). */
static th_resp http(const char *method, const char *path, const char *body)
{
    th_resp r;
    th_http(&r, worker.port, method, path, body, NULL, NULL);
    ck_assert_msg(r.rc == CURLE_OK || r.rc == CURLE_WRITE_ERROR, "%s %s: %s", method, path,
                  curl_easy_strerror(r.rc));
    return r;
}

/* Request expecting a status; returns the parsed JSON body (caller decrefs). */
static json_t *call(const char *method, const char *path, json_t *body, long want)
{
    return th_call(worker.port, method, path, body, NULL, want);
}

static json_t *greedy(json_t *extra, long max_tokens)
{
    json_t *b = json_pack("{s:i, s:f}", "max_tokens", (int)max_tokens, "temperature", 0.0);
    json_object_update(b, extra);
    json_decref(extra);
    return b;
}

/* Decodes the assembly of a (greedy, max_tokens) through kv_transfer_params; asserts the status
 * is want and returns the answer (caller decrefs). */
static json_t *complete_assembly(json_t *a, long max_tokens, long want)
{
    json_t *ktp =
        json_pack("{s:{s:s}}", "kv_transfer_params", "assembly_id", th_sget(a, "assembly_id"));
    return call("POST", "/v1/completions", greedy(ktp, max_tokens), want);
}

/* The answer an in-process engine gives on the reference path (one forward under the mask). */
static char *reference_text(const char *sys, const char *d1, const char *d2, const char *q,
                            uint32_t max_tokens)
{
    return th_engine_answer(model, sys, d1, d2, q, max_tokens, CG_PATH_REFERENCE);
}

/* The value of series in the metrics text; asserts it is there. */
static double metric(const char *text, const char *series)
{
    double v = 0;
    ck_assert_msg(th_metric_find(text, series, &v), "metric %s missing", series);
    return v;
}

#define DECODED "chunkgate_worker_decode_tokens_total"

/* ---- tests ---- */

START_TEST(test_info)
{
    json_t *j = call("GET", "/v1/info", NULL, 200);
    const cg_model_config *c = cg_model_cfg(model);
    ck_assert_str_eq(th_sget(j, "model"), c->model_id);
    ck_assert_int_eq(th_iget(j, "n_layers"), c->n_layers);
    ck_assert_int_eq(th_iget(j, "n_heads"), c->n_heads);
    ck_assert_int_eq(th_iget(j, "n_kv_heads"), c->n_kv_heads);
    ck_assert_int_eq(th_iget(j, "head_dim"), c->head_dim);
    ck_assert_int_eq(th_iget(j, "max_positions"), c->max_pos);
    ck_assert_int_eq(th_iget(j, "vocab_size"), c->vocab_size);
    ck_assert_str_eq(th_sget(j, "dtype"), "f32");
    ck_assert_str_eq(th_sget(j, "rope_style"), "half");
    ck_assert_str_eq(th_sget(j, "key_version"), CG_KEY_VERSION);
    ck_assert_int_eq(th_iget(j, "block_tokens"), 16);
    ck_assert_int_eq(th_iget(j, "pool_capacity_bytes"), 64 << 20);
    ck_assert_int_eq(th_iget(j, "disk_capacity_bytes"), 0); /* no --disk-mb: RAM only */
    ck_assert_int_eq(json_array_size(json_object_get(j, "tiers")), 1);
    ck_assert_int_eq(th_iget(j, "tp"), 1);
    ck_assert(json_is_null(json_object_get(j, "kv_source")));
    json_t *modes = json_object_get(j, "isolation_modes");
    ck_assert_int_eq(json_array_size(modes), 2);
    ck_assert_str_eq(json_string_value(json_array_get(modes, 0)), "strict");
    ck_assert_str_eq(json_string_value(json_array_get(modes, 1)), "sys");
    json_decref(j);
    j = call("GET", "/v1/models", NULL, 200);
    ck_assert_str_eq(th_sget(j, "object"), "list");
    json_t *m0 = json_array_get(json_object_get(j, "data"), 0);
    ck_assert_str_eq(th_sget(m0, "id"), c->model_id);
    ck_assert_str_eq(th_sget(m0, "object"), "model");
    json_decref(j);
    j = call("GET", "/healthz", NULL, 200);
    json_decref(j);
    struct stat sb;
    ck_assert_int_eq(stat(data_dir, &sb), 0); /* created by the worker */
}
END_TEST

START_TEST(test_assemble_twice)
{
    const cg_model_config *c = cg_model_cfg(model);
    /* misses */
    json_t *a = call("POST", "/v1/assemble",
                     json_pack("{s:o, s:s}", "segments", th_segments(SYS1, DOCA, DOCB, QUESTION),
                               "mode", "strict"),
                     200);
    json_t *segs = json_object_get(a, "segments");
    ck_assert_int_eq(json_array_size(segs), 4);
    long long off = 0, total = 0;
    const char *texts[] = {SYS1, DOCA, DOCB, QUESTION};
    for (size_t i = 0; i < 4; i++) {
        json_t *s = json_array_get(segs, i);
        ck_assert(json_is_false(json_object_get(s, "hit")));
        ck_assert_str_eq(th_sget(s, "tier"), "miss");
        ck_assert_int_eq(th_iget(s, "offset"), off);
        ck_assert_int_eq(th_iget(s, "n_tokens"), (long long)strlen(texts[i]) + (i == 0));
        off += th_iget(s, "n_tokens");
        /* the worker's key is the gateway's key: the same function over the same fields */
        cg_key k = cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_STRICT, NULL, 0, NULL,
                                  texts[i], strlen(texts[i]));
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(&k, hex);
        ck_assert_str_eq(th_sget(s, "key"), hex);
    }
    total = off;
    ck_assert_int_eq(th_iget(a, "n_tokens"), total);
    ck_assert_int_eq(th_iget(a, "cached_tokens"), 0);
    ck_assert_int_eq(strlen(th_sget(a, "assembly_id")), 32);
    ck_assert_int_gt(th_iget(a, "ttl_ms"), 0);
    ck_assert(json_is_array(json_object_get(a, "evicted")));

    /* hits at new offsets: another system prompt, chunks swapped, keys given by the client */
    json_t *s2 = th_segments(SYS2, DOCB, DOCA, QUESTION);
    json_object_set(json_array_get(s2, 1), "key", json_object_get(json_array_get(segs, 2), "key"));
    json_object_set(json_array_get(s2, 2), "key", json_object_get(json_array_get(segs, 1), "key"));
    json_t *b = call("POST", "/v1/assemble", json_pack("{s:o}", "segments", s2), 200);
    json_t *bs = json_object_get(b, "segments");
    ck_assert(json_is_false(json_object_get(json_array_get(bs, 0), "hit")));
    long long cached = 0;
    for (size_t i = 1; i <= 2; i++) {
        json_t *s = json_array_get(bs, i);
        ck_assert(json_is_true(json_object_get(s, "hit")));
        ck_assert_str_eq(th_sget(s, "tier"), "ram");
        cached += th_iget(s, "n_tokens");
    }
    ck_assert_int_ne(th_iget(json_array_get(bs, 2), "offset"),
                     th_iget(json_array_get(segs, 1), "offset"));
    ck_assert_int_eq(th_iget(b, "cached_tokens"), cached);

    /* release both; a second release is 404 */
    char path[128];
    snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(a, "assembly_id"));
    json_decref(call("DELETE", path, NULL, 200));
    json_t *e = call("DELETE", path, NULL, 404);
    th_assert_error_json(e, "not_found", NULL);
    json_decref(e);
    snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(b, "assembly_id"));
    json_decref(call("DELETE", path, NULL, 200));
    json_decref(a);
    json_decref(b);
}
END_TEST

/* The text of a non-streamed completion. */
static char *completion_text(json_t *j, const char *finish_want)
{
    ck_assert_str_eq(th_sget(j, "object"), "text_completion");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    ck_assert_ptr_nonnull(ch);
    if (finish_want) ck_assert_str_eq(th_sget(ch, "finish_reason"), finish_want);
    json_t *u = json_object_get(j, "usage");
    ck_assert_int_eq(th_iget(u, "total_tokens"),
                     th_iget(u, "prompt_tokens") + th_iget(u, "completion_tokens"));
    ck_assert(json_is_integer(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")));
    return cg_strdup(th_sget(ch, "text"));
}

START_TEST(test_kv_transfer_equals_prompt)
{
    const char *sys = "You answer in one line. Context follows.";
    /* via /v1/assemble + kv_transfer_params */
    json_t *a = call("POST", "/v1/assemble",
                     json_pack("{s:o}", "segments", th_segments(sys, DOCB, DOCA, QUESTION)), 200);
    /* a "# #" prompt whose max_tokens does not fit is refused before its prefill */
    char *pf = th_rag(sys, "A document nobody computed yet.", NULL, QUESTION);
    double pre0 = th_metric(worker.port, "chunkgate_worker_prefill_tokens_total");
    json_t *nf = call("POST", "/v1/completions",
                      greedy(json_pack("{s:s}", "prompt", pf), cg_model_cfg(model)->max_pos), 400);
    th_assert_error_json(nf, "context_length_exceeded", "max_tokens");
    json_decref(nf);
    ck_assert_double_eq(th_metric(worker.port, "chunkgate_worker_prefill_tokens_total"), pre0);
    free(pf);
    /* a max_tokens beyond the context is refused before the assembly is consumed: the same
     * request with fewer succeeds */
    json_t *big = complete_assembly(a, cg_model_cfg(model)->max_pos, 400);
    th_assert_error_json(big, "context_length_exceeded", "max_tokens");
    json_decref(big);
    json_t *r1 = complete_assembly(a, 24, 200);
    /* echo of an assembly: the prompt it was built from, then the answer */
    json_t *ae = call("POST", "/v1/assemble",
                      json_pack("{s:o}", "segments", th_segments(sys, DOCB, DOCA, QUESTION)), 200);
    json_t *re = call("POST", "/v1/completions",
                      greedy(json_pack("{s:{s:s}, s:b}", "kv_transfer_params", "assembly_id",
                                       th_sget(ae, "assembly_id"), "echo", 1),
                             4),
                      200);
    char *te = completion_text(re, NULL);
    ck_assert_msg(strstr(te, QUESTION) && strstr(te, DOCA), "echo: '%.200s'", te);
    free(te);
    json_decref(re);
    json_decref(ae);
    char *t1 = completion_text(r1, NULL);
    json_t *u1 = json_object_get(r1, "usage");
    ck_assert_int_eq(th_iget(u1, "prompt_tokens"), th_iget(a, "n_tokens"));
    ck_assert_int_eq(th_iget(json_object_get(u1, "prompt_tokens_details"), "cached_tokens"),
                     th_iget(a, "cached_tokens"));
    /* consumed: a second use is 404 */
    json_t *e = complete_assembly(a, 4, 404);
    th_assert_error_json(e, "not_found", NULL);
    json_decref(e);

    /* the plain "# #" prompt: the worker splits and assembles itself, now with hits */
    char *p = th_rag(sys, DOCB, DOCA, QUESTION);
    json_t *r2 = call("POST", "/v1/completions", greedy(json_pack("{s:s}", "prompt", p), 24), 200);
    char *t2 = completion_text(r2, NULL);
    ck_assert_str_eq(t1, t2);
    json_t *u2 = json_object_get(r2, "usage");
    ck_assert_int_eq(th_iget(u2, "prompt_tokens"), th_iget(a, "n_tokens"));
    ck_assert_int_eq(th_iget(json_object_get(u2, "prompt_tokens_details"), "cached_tokens"),
                     th_iget(a, "n_tokens") - (long long)strlen(QUESTION));

    /* both equal the reference forward over the whole prompt, computed in-process */
    char *ref = reference_text(sys, DOCB, DOCA, QUESTION, 24);
    ck_assert_str_eq(t1, ref);

    /* seeded sampling is reproducible over HTTP */
    json_t *s1 = call("POST", "/v1/completions",
                      json_pack("{s:s, s:i, s:f, s:f, s:i}", "prompt", p, "max_tokens", 16,
                                "temperature", 0.9, "top_p", 0.95, "seed", 1234),
                      200);
    json_t *s2 = call("POST", "/v1/completions",
                      json_pack("{s:s, s:i, s:f, s:f, s:i}", "prompt", p, "max_tokens", 16,
                                "temperature", 0.9, "top_p", 0.95, "seed", 1234),
                      200);
    char *x1 = completion_text(s1, NULL), *x2 = completion_text(s2, NULL);
    ck_assert_str_eq(x1, x2);

    /* a prompt without separator is passed through: BOS + bytes, no cache */
    json_t *pl =
        call("POST", "/v1/completions", greedy(json_pack("{s:s}", "prompt", "plain"), 3), 200);
    json_t *pu = json_object_get(pl, "usage");
    ck_assert_int_eq(th_iget(pu, "prompt_tokens"), 6);
    ck_assert_int_eq(th_iget(json_object_get(pu, "prompt_tokens_details"), "cached_tokens"), 0);

    free(t1);
    free(t2);
    free(ref);
    free(p);
    free(x1);
    free(x2);
    json_decref(a);
    json_decref(r1);
    json_decref(r2);
    json_decref(s1);
    json_decref(s2);
    json_decref(pl);
}
END_TEST

/* recompute_prefix_tokens and mode sys over HTTP */
START_TEST(test_recompute_and_sys)
{
    const char *sys = "Recompute test system prompt.";
    const char *q = "Which document is about rain?";
    json_t *a = call("POST", "/v1/assemble",
                     json_pack("{s:o, s:i}", "segments", th_segments(sys, DOCA, DOCB, q),
                               "recompute_prefix_tokens", 100000),
                     200);
    /* chunks hit (stored by earlier tests) or miss, either way their tokens are recomputed */
    ck_assert_int_ge(th_iget(a, "computed_tokens"),
                     (long long)(strlen(DOCA) + strlen(DOCB) + strlen(q)));
    json_t *r = complete_assembly(a, 16, 200);
    char *t = completion_text(r, NULL);
    char *ref = th_engine_answer(model, sys, DOCA, DOCB, q, 16, CG_PATH_CAUSAL);
    ck_assert_str_eq(t, ref);
    free(t);
    free(ref);
    json_decref(r);
    json_decref(a);

    /* mode sys: chunk keys depend on the system segment's key */
    const cg_model_config *c = cg_model_cfg(model);
    json_t *b = call("POST", "/v1/assemble",
                     json_pack("{s:o, s:s, s:s}", "segments", th_segments(sys, DOCA, DOCB, q),
                               "mode", "sys", "cache_salt", "tenant-7"),
                     200);
    json_t *segs = json_object_get(b, "segments");
    cg_key ks = cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_SYS, "tenant-7", 8, NULL,
                               sys, strlen(sys));
    cg_key ka = cg_key_compute(c->model_id, strlen(c->model_id), CG_MODE_SYS, "tenant-7", 8, &ks,
                               DOCA, strlen(DOCA));
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(&ks, hex);
    ck_assert_str_eq(th_sget(json_array_get(segs, 0), "key"), hex);
    cg_key_hex(&ka, hex);
    ck_assert_str_eq(th_sget(json_array_get(segs, 1), "key"), hex);
    ck_assert(json_is_false(json_object_get(json_array_get(segs, 1), "hit")));
    char path[128];
    snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(b, "assembly_id"));
    json_decref(call("DELETE", path, NULL, 200));
    json_decref(b);
}
END_TEST

/* Mode sys: a chunk computed after BOS + system is not served to a request whose system
 * segment has no BOS (add_special_tokens: false), and the other way round: its KV was computed
 * after other tokens. The no-BOS chunks are then stored under their own keys. */
START_TEST(test_sys_bos_keys)
{
    const char *sys = "BOS test system prompt.", *q = "Which document is about rain?";
    char keys[2][2][CG_KEY_HEX_LEN + 1];
    for (int pass = 0; pass < 3; pass++) {
        const int bos = pass != 1; /* BOS, without BOS, BOS again */
        json_t *body = json_pack("{s:o, s:s, s:b}", "segments", th_segments(sys, DOCA, DOCB, q),
                                 "mode", "sys", "add_special_tokens", bos);
        json_t *a = call("POST", "/v1/assemble", body, 200);
        json_t *segs = json_object_get(a, "segments");
        for (int i = 1; i <= 2; i++) {
            json_t *sg = json_array_get(segs, (size_t)i);
            ck_assert_msg(json_is_boolean(json_object_get(sg, "hit")) &&
                              json_is_true(json_object_get(sg, "hit")) == (pass == 2),
                          "pass %d: chunk %d hit %d", pass, i,
                          json_is_true(json_object_get(sg, "hit")));
            if (pass < 2)
                snprintf(keys[pass][i - 1], CG_KEY_HEX_LEN + 1, "%s", th_sget(sg, "key"));
            else
                ck_assert_str_eq(th_sget(sg, "key"), keys[0][i - 1]);
        }
        char path[128];
        snprintf(path, sizeof path, "/v1/assemblies/%s", th_sget(a, "assembly_id"));
        json_decref(call("DELETE", path, NULL, 200));
        json_decref(a);
    }
    ck_assert_str_ne(keys[0][0], keys[1][0]);
    ck_assert_str_ne(keys[0][1], keys[1][1]);
}
END_TEST

/* /tokenize and /detokenize are bounded by the model's positions: a text of more tokens, or
 * more ids, is refused (400 context_length_exceeded) instead of answered at any size. */
START_TEST(test_tokenize_bounds)
{
    const long long max_pos = cg_model_cfg(model)->max_pos;
    char *text = cg_malloc((size_t)max_pos + 2);
    memset(text, 'x', (size_t)max_pos + 1);
    text[max_pos + 1] = '\0';
    /* byte-level: one token per byte; max_pos tokens fit, max_pos + 1 do not */
    text[max_pos] = '\0';
    json_t *ok = call("POST", "/tokenize",
                      json_pack("{s:s, s:b}", "prompt", text, "add_special_tokens", 0), 200);
    ck_assert_int_eq(th_iget(ok, "count"), max_pos);
    json_decref(ok);
    text[max_pos] = 'x';
    char *tb = th_dumps(json_pack("{s:s, s:b}", "prompt", text, "add_special_tokens", 0));
    th_resp r = http("POST", "/tokenize", tb);
    free(tb);
    th_assert_error(&r, 400, "context_length_exceeded", "prompt");
    th_resp_free(&r);
    free(text);
    json_t *ids = json_array();
    for (long long i = 0; i <= max_pos; i++)
        json_array_append_new(ids, json_integer('x'));
    char *body = th_dumps(json_pack("{s:o}", "tokens", ids));
    th_resp d = http("POST", "/detokenize", body);
    th_assert_error(&d, 400, "context_length_exceeded", "tokens");
    th_resp_free(&d);
    free(body);
}
END_TEST

START_TEST(test_stream)
{
    char *p = th_rag(SYS1, DOCA, DOCB, "Stream the answer, please.");
    json_t *nb = call("POST", "/v1/completions", greedy(json_pack("{s:s}", "prompt", p), 20), 200);
    char *want = completion_text(nb, NULL);
    const char *want_finish =
        th_sget(json_array_get(json_object_get(nb, "choices"), 0), "finish_reason");

    json_t *body = greedy(json_pack("{s:s, s:b, s:{s:b}}", "prompt", p, "stream", 1,
                                    "stream_options", "include_usage", 1),
                          20);
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    th_resp r = http("POST", "/v1/completions", b);
    free(b);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.ctype, "text/event-stream"));
    /* events: "data: {json}\n\n" ... "data: [DONE]\n\n", heartbeat comments allowed */
    cg_buf text;
    cg_buf_init_unbounded(&text);
    const char *s = r.body.data, *end = r.body.data + r.body.len;
    int done = 0, finals = 0, events = 0, usages = 0;
    while (s < end) {
        const char *e = strstr(s, "\n\n");
        ck_assert_msg(e != NULL, "event without terminating blank line: %.80s", s);
        if (*s == ':') { /* comment */
            s = e + 2;
            continue;
        }
        ck_assert_msg(!done, "data after [DONE]");
        ck_assert_msg(strncmp(s, "data: ", 6) == 0, "event does not start with 'data: '");
        if ((size_t)(e - s) == 12 && !strncmp(s + 6, "[DONE]", 6)) {
            done = 1;
        } else {
            json_error_t je;
            json_t *j = json_loadb(s + 6, (size_t)(e - s - 6), 0, &je);
            ck_assert_msg(j != NULL, "event is not JSON: %s", je.text);
            ck_assert_str_eq(th_sget(j, "object"), "text_completion");
            json_t *u = json_object_get(j, "usage");
            if (u) {
                /* usage (asked for): a last chunk of its own with no choice, as OpenAI sends
                 * it, after the finish reason */
                usages++;
                ck_assert_int_eq(finals, 1);
                ck_assert_int_eq(json_array_size(json_object_get(j, "choices")), 0);
                ck_assert_int_eq(th_iget(u, "prompt_tokens"),
                                 th_iget(json_object_get(nb, "usage"), "prompt_tokens"));
                ck_assert_int_eq(
                    th_iget(json_object_get(u, "prompt_tokens_details"), "cached_tokens"),
                    th_iget(json_object_get(json_object_get(nb, "usage"), "prompt_tokens_details"),
                            "cached_tokens"));
                json_decref(j);
                s = e + 2;
                continue;
            }
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            const char *t = th_sget(ch, "text");
            cg_status st = cg_buf_append(&text, t, strlen(t));
            (void)st;
            if (!json_is_null(json_object_get(ch, "finish_reason"))) {
                finals++;
                ck_assert_str_eq(th_sget(ch, "finish_reason"), want_finish);
            }
            events++;
            json_decref(j);
        }
        s = e + 2;
    }
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(finals, 1);
    ck_assert_int_eq(usages, 1);
    ck_assert_int_ge(events, 2);
    ck_assert_str_eq(text.data ? text.data : "", want);
    cg_buf_free(&text);
    th_resp_free(&r);
    free(want);
    free(p);
    json_decref(nb);
}
END_TEST

/* The client leaves mid-stream: decoding stops, the server keeps serving. */
START_TEST(test_stream_disconnect)
{
    char *p = th_rag(SYS2, DOCA, DOCB, "Write a very long answer.");
    /* without disconnect this prompt decodes all 1500 tokens */
    json_t *full =
        call("POST", "/v1/completions", greedy(json_pack("{s:s}", "prompt", p), 1500), 200);
    json_t *u = json_object_get(full, "usage");
    int eos_early = th_iget(u, "completion_tokens") < 1500;
    json_t *m0 = call("GET", "/v1/info", NULL, 200);
    json_decref(m0);
    th_resp before = http("GET", "/metrics", NULL);
    double dec0 = metric(before.body.data, DECODED);
    th_resp_free(&before);

    char *b = th_dumps(greedy(json_pack("{s:s, s:b}", "prompt", p, "stream", 1), 1500));
    /* read the first few events, then hang up */
    th_req q = {.path = "/v1/completions", .body = b, .stop_after = 600};
    th_resp r;
    th_send(&r, worker.port, &q);
    ck_assert_int_eq(r.rc, CURLE_WRITE_ERROR);
    free(b);
    th_resp_free(&r);
    /* the request finishes on the server soon after; then the counter stops moving */
    double dec1 = 0, prev = -1;
    for (int i = 0; i < 100; i++) {
        th_sleep_ms(200);
        th_resp m = http("GET", "/metrics", NULL);
        dec1 = metric(m.body.data, DECODED);
        th_resp_free(&m);
        if (dec1 == prev && dec1 > dec0) break;
        prev = dec1;
    }
    if (!eos_early) ck_assert_msg(dec1 - dec0 < 1500, "decoding went on after the client left");
    json_t *h = call("GET", "/healthz", NULL, 200);
    json_decref(h);
    free(p);
    json_decref(full);
}
END_TEST

START_TEST(test_inventory)
{
    const char *doc = "Document Inventory. Twelve crates of apples were shipped on Tuesday.";
    json_t *a = call("POST", "/v1/assemble",
                     json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s}]}", "segments", "role", "system",
                               "text", "Inventory system.", "role", "chunk", "text", doc, "role",
                               "question", "text", "How many crates?"),
                     200);
    json_t *cseg = json_array_get(json_object_get(a, "segments"), 1);
    const char *key = th_sget(cseg, "key");
    const uint32_t offset = (uint32_t)th_iget(cseg, "offset");
    ck_assert_uint_gt(offset, 0);
    char path[256];
    snprintf(path, sizeof path, "/v1/chunks/%s", key);
    /* referenced by the live assembly: no delete */
    json_t *e = call("DELETE", path, NULL, 409);
    th_assert_error_json(e, "conflict", NULL);
    json_decref(e);
    json_t *c = call("GET", path, NULL, 200);
    ck_assert_str_eq(th_sget(c, "key"), key);
    ck_assert_int_eq(th_iget(c, "tokens"), (long long)strlen(doc));
    ck_assert_int_eq(th_iget(c, "bytes") % (16 * 4096), 0);
    ck_assert_str_eq(th_sget(c, "tier"), "ram");
    ck_assert_int_eq(json_array_size(json_object_get(c, "tiers")), 1); /* no disk tier here */
    ck_assert_int_gt(th_iget(c, "last_used"), 1600000000000LL);
    /* the per-head key strings: {model}@head:{h}@{key}, one per KV head */
    json_t *hk = json_object_get(c, "head_keys");
    ck_assert_int_eq(json_array_size(hk), cg_model_cfg(model)->n_kv_heads);
    for (size_t h = 0; h < json_array_size(hk); h++) {
        char want[256];
        snprintf(want, sizeof want, "%s@head:%zu@%s", cg_model_cfg(model)->kv_model, h, key);
        ck_assert_str_eq(json_string_value(json_array_get(hk, h)), want);
    }
    json_decref(c);

    /* the list holds it; paging with limit/after walks every chunk once, in key order */
    json_t *l = call("GET", "/v1/chunks", NULL, 200);
    ck_assert_str_eq(th_sget(l, "object"), "list");
    size_t n = json_array_size(json_object_get(l, "data"));
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= !strcmp(th_sget(json_array_get(json_object_get(l, "data"), i), "key"), key);
    ck_assert(found);
    ck_assert_uint_ge(n, 2);
    char after[64] = "";
    size_t walked = 0;
    for (;;) {
        char q[160];
        snprintf(q, sizeof q, "/v1/chunks?limit=1%s%s", after[0] ? "&after=" : "", after);
        json_t *pg = call("GET", q, NULL, 200);
        json_t *d = json_object_get(pg, "data");
        if (json_array_size(d) == 0) {
            ck_assert(json_is_false(json_object_get(pg, "has_more")));
            json_decref(pg);
            break;
        }
        ck_assert_int_eq(json_array_size(d), 1);
        const char *k = th_sget(json_array_get(d, 0), "key");
        if (after[0]) ck_assert_int_gt(strcmp(k, after), 0);
        snprintf(after, sizeof after, "%s", k);
        walked++;
        int more = json_is_true(json_object_get(pg, "has_more"));
        json_decref(pg);
        if (!more) break;
    }
    ck_assert_uint_eq(walked, n);

    /* KV export (kv/kvwire.h): heads 0-1 of the chunk, per head, per layer, K then V */
    const cg_model_config *mc = cg_model_cfg(model);
    const size_t nt = strlen(doc), hd = (size_t)mc->head_dim;
    char kvp[256];
    snprintf(kvp, sizeof kvp, "/v1/chunks/%s/kv?heads=0-1", key);
    th_resp kc = http("GET", kvp, NULL);
    ck_assert_int_eq(kc.status, 200);
    cg_kvwire_header hc, ha;
    const float *pc = NULL, *pa = NULL;
    ck_assert_int_eq(cg_kvwire_decode(kc.body.data, kc.body.len, &hc, &pc), CG_OK);
    ck_assert_str_eq(hc.model, mc->kv_model);
    ck_assert_uint_eq(hc.n_tokens, nt);
    ck_assert_uint_eq(hc.head_start, 0);
    ck_assert_uint_eq(hc.n_heads, 2);
    ck_assert_uint_eq(hc.n_layers, (uint32_t)mc->n_layers);
    ck_assert_uint_eq(hc.total_kv_heads, (uint32_t)mc->n_kv_heads);
    ck_assert_uint_eq(kc.body.len, hc.header_bytes + 2 * mc->n_layers * 2 * nt * hd * 4);
    snprintf(kvp, sizeof kvp, "/v1/chunks/%s/kv?heads=3-9", key);
    th_resp bad = http("GET", kvp, NULL);
    ck_assert_int_eq(bad.status, 400);
    th_resp_free(&bad);
    /* the assembly's KV, all heads: at the chunk's offset, V is the stored V and K is the
     * stored K rotated by R(offset) (strict: stored at virtual position 0) */
    snprintf(kvp, sizeof kvp, "/v1/assemblies/%s/kv", th_sget(a, "assembly_id"));
    th_resp ka = http("GET", kvp, NULL);
    ck_assert_int_eq(ka.status, 200);
    ck_assert_int_eq(cg_kvwire_decode(ka.body.data, ka.body.len, &ha, &pa), CG_OK);
    ck_assert_uint_eq(ha.n_tokens, (uint32_t)th_iget(a, "n_tokens"));
    ck_assert_uint_eq(ha.n_heads, (uint32_t)mc->n_kv_heads);
    cg_rope rope = cg_model_rope(model);
    float *rot = cg_malloc(nt * hd * sizeof(float));
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t ly = 0; ly < hc.n_layers; ly++) {
            const float *ck = pc + cg_kvwire_rows_offset(&hc, h, ly, 0);
            const float *cv = pc + cg_kvwire_rows_offset(&hc, h, ly, 1);
            const float *ak = pa + cg_kvwire_rows_offset(&ha, h, ly, 0) + offset * hd;
            const float *av = pa + cg_kvwire_rows_offset(&ha, h, ly, 1) + offset * hd;
            ck_assert_int_eq(memcmp(cv, av, nt * hd * sizeof(float)), 0);
            cg_remap_rope(&rope, ck, rot, nt, offset);
            ck_assert_int_eq(memcmp(rot, ak, nt * hd * sizeof(float)), 0);
            ck_assert(memcmp(ck, ak, nt * hd * sizeof(float)) != 0); /* it was rotated */
        }
    free(rot);
    th_resp_free(&kc);
    th_resp_free(&ka);

    /* released: now it can be deleted, and is gone */
    char ap[128];
    snprintf(ap, sizeof ap, "/v1/assemblies/%s", th_sget(a, "assembly_id"));
    json_decref(call("DELETE", ap, NULL, 200));
    json_t *d = call("DELETE", path, NULL, 200);
    ck_assert(json_is_true(json_object_get(d, "deleted")));
    json_decref(d);
    e = call("GET", path, NULL, 404);
    th_assert_error_json(e, "not_found", NULL);
    json_decref(e);
    e = call("DELETE", path, NULL, 404);
    json_decref(e);
    e = call("GET", "/v1/chunks/nothex", NULL, 400);
    th_assert_error_json(e, "invalid_value", NULL);
    json_decref(e);
    json_decref(l);
    json_decref(a);
}
END_TEST

/* logprobs (legacy completions shape, plus token_ids): the greedy token is the top entry, its
 * logprob the largest; the same in a stream. */
START_TEST(test_logprobs)
{
    char *p = th_rag(SYS1, DOCA, DOCB, QUESTION);
    json_t *r = call("POST", "/v1/completions",
                     greedy(json_pack("{s:s, s:i}", "prompt", p, "logprobs", 3), 12), 200);
    json_t *ch = json_array_get(json_object_get(r, "choices"), 0);
    json_t *lp = json_object_get(ch, "logprobs");
    json_t *ids = json_object_get(lp, "token_ids"), *vals = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs"), *offs = json_object_get(lp, "text_offset");
    size_t n = json_array_size(ids), off = 0;
    ck_assert_int_eq((long long)n, th_iget(json_object_get(r, "usage"), "completion_tokens"));
    ck_assert_int_eq(json_array_size(vals), n);
    ck_assert_int_eq(json_array_size(tops), n);
    ck_assert_int_eq(json_array_size(json_object_get(lp, "tokens")), n);
    for (size_t t = 0; t < n; t++) {
        double v = json_real_value(json_array_get(vals, t)), mass = 0, best = -INFINITY;
        ck_assert(v <= 0);
        json_t *top = json_array_get(tops, t);
        ck_assert_int_ge(json_object_size(top), 1);
        ck_assert_int_le(json_object_size(top), 3);
        const char *k;
        json_t *x;
        json_object_foreach(top, k, x)
        {
            mass += exp(json_real_value(x));
            best = fmax(best, json_real_value(x));
        }
        ck_assert(mass <= 1.0 + 1e-9);
        ck_assert(v == best); /* greedy picks the most likely token */
        /* text_offset: bytes generated before the token (byte tokens are one byte each) */
        ck_assert_int_eq(json_integer_value(json_array_get(offs, t)), (long long)off);
        off += json_integer_value(json_array_get(ids, t)) < 256;
    }
    /* streamed: every chunk carries the entries of its tokens; together, the same ids */
    json_t *body =
        greedy(json_pack("{s:s, s:i, s:b}", "prompt", p, "logprobs", 3, "stream", 1), 12);
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    th_resp sr = http("POST", "/v1/completions", b);
    free(b);
    ck_assert_int_eq(sr.status, 200);
    size_t k = 0;
    for (char *q = sr.body.data; q && (q = strstr(q, "data: {"));) {
        q += 6;
        json_t *j = json_loads(q, JSON_DISABLE_EOF_CHECK, NULL);
        ck_assert_ptr_nonnull(j);
        json_t *cl = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
        json_t *ci = json_object_get(cl, "token_ids");
        for (size_t t = 0; t < json_array_size(ci); t++, k++)
            ck_assert_int_eq(json_integer_value(json_array_get(ci, t)),
                             json_integer_value(json_array_get(ids, k)));
        json_decref(j);
    }
    ck_assert_uint_eq(k, n);
    th_resp_free(&sr);
    json_decref(r);
    /* without logprobs the field is null */
    r = call("POST", "/v1/completions", greedy(json_pack("{s:s}", "prompt", p), 2), 200);
    ck_assert(json_is_null(
        json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs")));
    json_decref(r);
    free(p);
    /* chat: top_logprobs written 3.0 is 3, as its check accepts it */
    r = call("POST", "/v1/chat/completions",
             greedy(json_pack("{s:[{s:s, s:s}], s:b, s:f}", "messages", "role", "user", "content",
                              "Hello", "logprobs", 1, "top_logprobs", 3.0),
                    2),
             200);
    json_t *c0 = json_array_get(
        json_object_get(
            json_object_get(json_array_get(json_object_get(r, "choices"), 0), "logprobs"),
            "content"),
        0);
    ck_assert_int_eq(json_array_size(json_object_get(c0, "top_logprobs")), 3);
    json_decref(r);
}
END_TEST

START_TEST(test_bad_inputs)
{
    static const struct {
        const char *method, *path, *body;
        long status;
        const char *code;
    } cases[] = {
        {"POST", "/v1/assemble", "{not json", 400, "invalid_json"},
        {"POST", "/v1/assemble", "", 400, "invalid_json"},
        {"POST", "/v1/assemble", "[1,2]", 400, "invalid_type"},
        {"POST", "/v1/assemble", "{}", 400, "missing_field"},
        {"POST", "/v1/assemble", "{\"segments\":\"abc\"}", 400, "invalid_type"},
        {"POST", "/v1/assemble", "{\"segments\":[]}", 400, "invalid_value"},
        {"POST", "/v1/assemble", "{\"segments\":[7]}", 400, "invalid_type"},
        {"POST", "/v1/assemble", "{\"segments\":[{\"role\":\"boss\",\"text\":\"x\"}]}", 400,
         "invalid_value"},
        {"POST", "/v1/assemble", "{\"segments\":[{\"role\":\"chunk\"}]}", 400, "missing_field"},
        {"POST", "/v1/assemble", "{\"segments\":[{\"role\":\"chunk\",\"text\":5}]}", 400,
         "invalid_type"},
        {"POST", "/v1/assemble", "{\"segments\":[{\"role\":\"chunk\",\"text\":\"\"}]}", 400,
         "invalid_value"},
        {"POST", "/v1/assemble",
         "{\"segments\":[{\"role\":\"chunk\",\"text\":\"a\"},{\"role\":\"system\",\"text\":\"b\"}]"
         "}",
         400, "invalid_value"},
        {"POST", "/v1/assemble",
         "{\"mode\":\"loose\",\"segments\":[{\"role\":\"chunk\",\"text\":\"a\"}]}", 400,
         "invalid_value"},
        {"POST", "/v1/assemble", "{\"mode\":3,\"segments\":[{\"role\":\"chunk\",\"text\":\"a\"}]}",
         400, "invalid_type"},
        {"POST", "/v1/assemble",
         "{\"segments\":[{\"role\":\"chunk\",\"text\":\"a\",\"key\":\"xyz\"}]}", 400,
         "invalid_value"},
        {"POST", "/v1/assemble",
         "{\"segments\":[{\"role\":\"chunk\",\"text\":\"poison\",\"key\":"
         "\"00112233445566778899aabbccddeeff\"}]}",
         400, "chunk_key_mismatch"},
        {"POST", "/v1/assemble",
         "{\"recompute_prefix_tokens\":-1,\"segments\":[{\"role\":\"chunk\",\"text\":\"a\"}]}", 400,
         "invalid_value"},
        {"POST", "/v1/assemble",
         "{\"model\":\"gpt-9\",\"segments\":[{\"role\":\"chunk\",\"text\":\"a\"}]}", 404,
         "model_not_found"},
        {"POST", "/v1/completions", "{}", 400, "missing_field"},
        {"POST", "/v1/completions", "{\"prompt\":5}", 400, "invalid_type"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":-1}", 400, "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":\"many\"}", 400,
         "invalid_type"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400,
         "invalid_type"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"top_p\":0}", 400, "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "invalid_type"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"n\":2}", 400, "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"logprobs\":21}", 400, "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"logprobs\":\"x\"}", 400, "invalid_type"},
        {"POST", "/v1/completions",
         "{\"kv_transfer_params\":{\"assembly_id\":\"ffffffffffffffffffffffffffffffff\","
         "\"worker\":\"gopher://x\"}}",
         403, "forbidden"}, /* only --kv-source, unless --kv-request-source 1 (test_tp) */
        {"POST", "/v1/completions", "{\"prompt\":\"a # # b\",\"chunk_mode\":\"x\"}", 400,
         "invalid_value"},
        {"POST", "/v1/completions",
         "{\"kv_transfer_params\":{\"assembly_id\":\"ffffffffffffffffffffffffffffffff\"}}", 404,
         "not_found"},
        {"POST", "/v1/completions", "{\"kv_transfer_params\":{\"assembly_id\":5}}", 400,
         "invalid_type"},
        {"POST", "/v1/completions", "{\"kv_transfer_params\":\"x\"}", 400, "invalid_type"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"model\":\"gpt-9\"}", 404,
         "model_not_found"},
        /* fields a route would ignore: the chat route's, the other route's mode, vLLM's */
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"documents\":[\"d\"]}", 400,
         "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a # # b\",\"mode\":\"sys\"}", 400,
         "invalid_value"},
        {"POST", "/v1/assemble",
         "{\"chunk_mode\":\"sys\",\"segments\":[{\"role\":\"chunk\",\"text\":\"a\"}]}", 400,
         "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"ignore_eos\":true}", 400, "invalid_value"},
        {"POST", "/v1/completions", "{\"prompt\":\"a\",\"ignore_eos\":1000}", 400, "invalid_value"},
        {"POST", "/tokenize",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chunk_separator\":7}", 400,
         "invalid_type"},
        {"POST", "/tokenize",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chunk_separator\":\"\"}", 400,
         "invalid_value"},
        {"POST", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"kv_transfer_params\":"
         "{\"assembly_id\":\"ffffffffffffffffffffffffffffffff\"}}",
         400, "invalid_value"},
        {"DELETE", "/v1/assemblies/ffffffffffffffffffffffffffffffff", NULL, 404, "not_found"},
        {"GET", "/v1/assemblies/abc/kv", NULL, 404, "not_found"},
        {"GET", "/v1/nothing", NULL, 404, "not_found"},
        {"PUT", "/v1/assemble", "{}", 405, "method_not_allowed"},
        {"GET", "/v1/chunks?limit=0", NULL, 400, "invalid_value"},
        {"GET", "/v1/chunks?after=zz", NULL, 400, "invalid_value"},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(cases); i++) {
        th_resp r = http(cases[i].method, cases[i].path, cases[i].body);
        ck_assert_msg(r.status == cases[i].status,
                      "case %zu (%s %s %s): status %ld want %ld: %.200s", i, cases[i].method,
                      cases[i].path, cases[i].body ? cases[i].body : "", r.status, cases[i].status,
                      r.body.data);
        json_t *j = th_body_json(&r);
        th_assert_error_json(j, cases[i].code, NULL);
        json_decref(j);
        th_resp_free(&r);
    }
    /* nothing was stored under the key a client tried to claim */
    json_t *e = call("GET", "/v1/chunks/00112233445566778899aabbccddeeff", NULL, 404);
    json_decref(e);
    /* a prompt longer than the model's positions */
    size_t n = (size_t)cg_model_cfg(model)->max_pos + 10;
    char *big = cg_malloc(n + 1);
    memset(big, 'x', n);
    big[n] = '\0';
    e = call("POST", "/v1/completions", json_pack("{s:s}", "prompt", big), 400);
    th_assert_error_json(e, "context_length_exceeded", NULL);
    json_decref(e);
    memcpy(big + n / 2, " # # ", 5);
    e = call("POST", "/v1/completions", json_pack("{s:s}", "prompt", big), 400);
    th_assert_error_json(e, "context_length_exceeded", NULL);
    json_decref(e);
    free(big);
    /* still serving */
    e = call("GET", "/healthz", NULL, 200);
    ck_assert_str_eq(th_sget(e, "status"), "ok");
    json_decref(e);
}
END_TEST

typedef struct par {
    char *prompt;
    char *text;
} par;

static void *par_main(void *arg)
{
    par *p = arg;
    json_t *b = greedy(json_pack("{s:s}", "prompt", p->prompt), 12);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    th_resp r = http("POST", "/v1/completions", s);
    free(s);
    if (r.status == 200) {
        json_t *j = json_loadb(r.body.data, r.body.len, 0, NULL);
        p->text = cg_strdup(json_string_value(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
        json_decref(j);
    }
    th_resp_free(&r);
    return NULL;
}

START_TEST(test_concurrent)
{
    char *prompt = th_rag(SYS2, DOCB, DOCA, "Answer concurrently.");
    par ps[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        ps[i] = (par){prompt, NULL};
        pthread_create(&th[i], NULL, par_main, &ps[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        ck_assert_ptr_nonnull(ps[i].text);
        ck_assert_str_eq(ps[i].text, ps[0].text);
    }
    for (int i = 0; i < 4; i++)
        free(ps[i].text);
    free(prompt);
}
END_TEST

START_TEST(test_metrics)
{
    th_resp r = http("GET", "/metrics", NULL);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.ctype, "text/plain"));
    const char *t = r.body.data;
    ck_assert_double_eq(metric(t, "chunkgate_worker_pool_capacity_bytes"), 64.0 * 1048576);
    ck_assert_double_gt(metric(t, "chunkgate_worker_pool_used_bytes"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_pool_chunks"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_chunk_hits_total"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_chunk_misses_total"), 0);
    ck_assert_double_ge(metric(t, "chunkgate_worker_evictions_total"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_tokens_reused_total"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_tokens_computed_total"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_prefill_tokens_total"), 0);
    ck_assert_double_gt(metric(t, "chunkgate_worker_decode_tokens_total"), 0);
    ck_assert_double_eq(metric(t, "chunkgate_worker_assemblies_live"), 0);
    ck_assert_double_gt(
        metric(t, "chunkgate_worker_requests_total{route=\"assemble\",code=\"200\"}"), 0);
    ck_assert_double_gt(
        metric(t, "chunkgate_worker_requests_total{route=\"assemble\",code=\"400\"}"), 0);
    ck_assert_double_gt(
        metric(t, "chunkgate_worker_requests_total{route=\"completions\",code=\"200\"}"), 0);
    ck_assert_ptr_nonnull(strstr(
        t, "chunkgate_worker_request_duration_seconds_bucket{route=\"completions\",le=\"+Inf\"}"));
    ck_assert_ptr_nonnull(strstr(t, "# TYPE chunkgate_worker_chunk_hits_total counter"));
    ck_assert_ptr_nonnull(strstr(t, "# TYPE chunkgate_worker_pool_used_bytes gauge"));
    th_resp_free(&r);
}
END_TEST

/* --quant over HTTP: a q8 and a q4 worker on the same checkpoint report their weights' dtype,
 * and their greedy answers to a "# #" prompt equal the in-process reference forward of the
 * same quantised model; an unknown value is refused at start with the choices listed. */
START_TEST(test_quant)
{
    const char *sys = "You answer in one line. Context follows.";
    char *p = th_rag(sys, DOCA, DOCB, QUESTION);
    for (int qi = 1; qi <= 2; qi++) {
        const char *name = cg_quant_name((cg_quant)qi);
        char log[32];
        snprintf(log, sizeof log, "worker-%s", name);
        const char *extra[] = {"--quant", name, NULL};
        th_proc wq;
        if (th_start_worker(&wq, WORKER_BIN, model_dir, 0, log, extra) != 0)
            th_die("the --quant worker", &wq);
        json_t *j = th_call(wq.port, "GET", "/v1/info", NULL, NULL, 200);
        ck_assert_str_eq(th_sget(j, "weights_dtype"), qi == 1 ? "q8_0" : "q4_0");
        json_decref(j);
        json_t *r = th_call(wq.port, "POST", "/v1/completions",
                            greedy(json_pack("{s:s}", "prompt", p), 16), NULL, 200);
        char *t = completion_text(r, NULL);
        char err[256] = "";
        cg_model *mq = NULL;
        ck_assert_int_eq(cg_model_open_quant(model_dir, (cg_quant)qi, &mq, err, sizeof err), CG_OK);
        char *ref = th_engine_answer(mq, sys, DOCA, DOCB, QUESTION, 16, CG_PATH_REFERENCE);
        ck_assert_str_eq(t, ref);
        free(ref);
        free(t);
        json_decref(r);
        cg_model_close(&mq);
        ck_assert(th_stop_clean(&wq, "the --quant worker"));
    }
    free(p);
    th_proc g;
    const char *wa[] = {"serve", "--model", model_dir, "--quant", "q5", NULL};
    ck_assert_int_eq(th_spawn(&g, WORKER_BIN, wa, NULL, "wquant.log", NULL, 0), 0);
    ck_assert_int_eq(th_wait_exit(&g, 30000), 2);
    char path[400];
    char *text = th_read_file(th_path(path, sizeof path, "wquant.log"), NULL);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(strstr(text, "--quant: 'q5' is not one of none, q8, q4"), "%s", text);
    free(text);
}
END_TEST

int main(void)
{
    cg_log_init("test_worker", CG_LOG_WARN);
    th_init("test_worker", &(th_params){.http_timeout_s = 300});
    th_path(model_dir, sizeof model_dir, "model");
    th_path(data_dir, sizeof data_dir, "data/sub");
    const char *seed[] = {"--seed", "3", NULL};
    if (!(model = th_model_gen_open(WORKER_BIN, model_dir, seed))) return EXIT_FAILURE;
    const char *extra[] = {"--data-dir", data_dir, "--assembly-ttl-ms", "30000", NULL};
    if (th_start_worker(&worker, WORKER_BIN, model_dir, 0, "worker", extra) != 0)
        th_die("the worker", &worker);
    /* test_metrics last: it reads the counters the others moved */
    int failed =
        th_run_tests("worker", "http", 300,
                     TH_TESTS(test_info, test_assemble_twice, test_kv_transfer_equals_prompt,
                              test_recompute_and_sys, test_sys_bos_keys, test_tokenize_bounds,
                              test_stream, test_stream_disconnect, test_inventory, test_logprobs,
                              test_bad_inputs, test_concurrent, test_quant, test_metrics));
    /* graceful shutdown on SIGTERM: exit 0, no sanitizer report */
    failed |= !th_stop_clean(&worker, "chunkgate-worker");
    cg_model_close(&model);
    th_cleanup(failed);
    curl_global_cleanup();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
