/* Integration tests: the real chunkgate binary on an ephemeral loopback port, in front of
 * tests/fake_backend (which stands in for the inference backend only), driven over HTTP with
 * libcurl. Covers completions and chat (streamed and not), bad input, admin auth, index
 * contents, restart with the same data dir, backend faults, client disconnects and metrics. */
#include <check.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/base.h"
#include "cache/key.h"
#include "tests/harness/harness.h"

#define ADMIN_TOKEN "tok-admin"
#define MODEL "m-test"

/* Started once for the whole suite (unchecked fixture, in the runner process). */
static th_proc fake, gw;

/* ------------------------------------------------------------ processes */

/* chunkgate with --backend backend (NULL: none) plus extra; name: its log and data dir. */
static int start_gateway(th_proc *p, const char *name, const char *backend,
                         const char *const *extra)
{
    const char *args[48];
    int n = 0;
    if (backend) {
        args[n++] = "--backend";
        args[n++] = backend;
    }
    for (; extra && *extra; extra++)
        args[n++] = *extra;
    args[n] = NULL;
    return th_start_gateway(p, CHUNKGATE_BIN, name, args);
}

static void suite_setup(void)
{
    /* 20 s to start (sanitizer builds start slowly), 30 s a request */
    th_init("gateway_test",
            &(th_params){.start_wait_ms = 20000, .http_timeout_s = 30, .sse_timeout_s = 30});
    const char *fargs[] = {"--delay-ms", "100", "--events", "5", NULL};
    if (th_start_fake(&fake, FAKE_BACKEND_BIN, "fake", fargs) != 0) th_die(FAKE_BACKEND_BIN, &fake);
    const char *extra[] = {"--admin-token",
                           ADMIN_TOKEN,
                           "--max-segments",
                           "8",
                           "--max-body-bytes",
                           "64K",
                           "--backend-timeout-ms",
                           "1500",
                           "--max-upstream-bytes",
                           "64K",
                           "--heartbeat-ms",
                           "200",
                           "--model",
                           "gw-default",
                           NULL};
    if (start_gateway(&gw, "g1", fake.url, extra) != 0) th_die("chunkgate", &gw);
}

static void suite_teardown(void)
{
    int rc = th_stop(&gw, SIGTERM);
    if (rc != 0) fprintf(stderr, "chunkgate exited with %d\n", rc);
    th_stop(&fake, SIGTERM);
    /* Logs and data dirs go away unless the gateway failed or CG_KEEP_TMP is set. */
    th_cleanup(rc != 0);
}

/* ------------------------------------------------------------ HTTP client */

static void http(th_resp *r, const char *method, const char *path, const char *body)
{
    th_http(r, gw.port, method, path, body, NULL, NULL);
}

static void admin(th_resp *r, const char *method, const char *path, const char *body)
{
    th_http(r, gw.port, method, path, body, ADMIN_TOKEN, NULL);
}

static void assert_healthy(void)
{
    json_t *j = th_call_text(gw.port, "GET", "/healthz", NULL, NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
}

static void key_hex(const char *model, cg_mode mode, const char *salt, const cg_key *sys,
                    const char *text, char out[CG_KEY_HEX_LEN + 1])
{
    cg_key k = cg_key_compute(model, strlen(model), mode, salt, salt ? strlen(salt) : 0, sys, text,
                              strlen(text));
    cg_key_hex(&k, out);
}

/* Asserts that segment i of segs (an answer's chunk_cache segments) is keyed as text is under
 * mode, salt and system key sys. */
static void assert_seg_key(json_t *segs, size_t i, cg_mode mode, const char *salt,
                           const cg_key *sys, const char *text)
{
    char hex[CG_KEY_HEX_LEN + 1];
    key_hex(MODEL, mode, salt, sys, text, hex);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, i), "key")), hex);
}

/* A string unique to this test run, so index counts do not depend on other tests. */
static void nonce(char *out, size_t n)
{
    static int seq;
    snprintf(out, n, "n%d-%" PRIu64 "-%d", (int)getpid(), cg_wall_ms(), ++seq);
}

/* ------------------------------------------------------------ metrics */

static char *scrape(void)
{
    th_resp r;
    http(&r, "GET", "/metrics", NULL);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.ctype, "text/plain"));
    cg_buf_free(&r.head);
    return r.body.data;
}

/* ------------------------------------------------------------ tests: completions */

START_TEST(completion_forwarded_with_chunk_cache)
{
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt,
             "You are exact. %s # # Alpha doc é %s ##  # #   # # Beta doc %s # # Question?", n, n,
             n);
    /* "##" is not the separator; the blank segment between two separators is skipped */
    char *body =
        th_dumps(json_pack("{s:s, s:s, s:i, s:s, s:s}", "model", MODEL, "prompt", prompt,
                           "max_tokens", 16, "chunk_separator", "# #", "cache_salt", "tenant-a"));
    th_resp r;
    const char *rid[] = {"X-Request-Id: gw-test-1", NULL};
    th_http(&r, gw.port, "POST", "/v1/completions", body, NULL, rid);
    free(body);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.rid, "gw-test-1");
    json_t *j = th_body_json(&r);
    /* the backend's answer is relayed */
    char want[64];
    snprintf(want, sizeof want, "echo %zu", strlen(prompt));
    ck_assert_str_eq(json_string_value(
                         json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")),
                     want);
    /* the prompt reached the backend byte for byte, without the extension fields */
    json_t *fake_echo = json_object_get(j, "fake");
    ck_assert_int_eq(json_integer_value(json_object_get(fake_echo, "prompt_len")),
                     (json_int_t)strlen(prompt));
    char fnv[17];
    snprintf(fnv, sizeof fnv, "%016" PRIx64, th_fnv1a(prompt, strlen(prompt)));
    ck_assert_str_eq(json_string_value(json_object_get(fake_echo, "prompt_fnv")), fnv);
    json_t *fields = json_object_get(fake_echo, "fields");
    ck_assert_uint_eq(json_array_size(fields), 3);
    for (size_t i = 0; i < 3; i++) {
        const char *f = json_string_value(json_array_get(fields, i));
        ck_assert_msg(!strcmp(f, "model") || !strcmp(f, "prompt") || !strcmp(f, "max_tokens"),
                      "forwarded %s", f);
    }
    ck_assert_str_eq(json_string_value(json_object_get(fake_echo, "request_id")), "gw-test-1");
    /* cached tokens are reported in OpenAI's field */
    json_t *det = json_object_get(json_object_get(j, "usage"), "prompt_tokens_details");
    ck_assert(json_is_integer(json_object_get(det, "cached_tokens")));
    ck_assert_int_eq(json_integer_value(json_object_get(det, "cached_tokens")), 0);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")),
        (json_int_t)strlen(prompt));
    /* chunk_cache: one entry per cacheable segment, keyed as DESIGN §4 says */
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(json_is_object(cc));
    ck_assert(json_is_true(json_object_get(cc, "fallback")));
    ck_assert(json_is_false(json_object_get(cc, "passthrough")));
    ck_assert(json_is_null(json_object_get(cc, "worker")));
    ck_assert_str_eq(json_string_value(json_object_get(cc, "mode")), "strict");
    ck_assert_int_eq(json_integer_value(json_object_get(cc, "empty_segments")), 1);
    json_t *segs = json_object_get(cc, "segments");
    ck_assert_uint_eq(json_array_size(segs), 3);
    char texts[3][200];
    snprintf(texts[0], sizeof texts[0], "You are exact. %s", n);
    snprintf(texts[1], sizeof texts[1], "Alpha doc é %s ##", n);
    snprintf(texts[2], sizeof texts[2], "Beta doc %s", n);
    const char *roles[] = {"system", "chunk", "chunk"};
    for (size_t i = 0; i < 3; i++) {
        json_t *s = json_array_get(segs, i);
        assert_seg_key(segs, i, CG_MODE_STRICT, "tenant-a", NULL, texts[i]);
        ck_assert_str_eq(json_string_value(json_object_get(s, "role")), roles[i]);
        ck_assert_int_eq(json_integer_value(json_object_get(s, "bytes")),
                         (json_int_t)strlen(texts[i]));
        ck_assert(json_is_false(json_object_get(s, "hit")));
        ck_assert(json_is_null(json_object_get(s, "tokens")));
    }
    json_decref(j);
    th_resp_free(&r);
}
END_TEST

START_TEST(completion_passthrough_and_modes)
{
    /* no separator: forwarded as is, nothing keyed */
    const char *body =
        "{\"model\":\"" MODEL "\", \"prompt\": [\"just a question\"], \"max_tokens\": 3}";
    json_t *j = th_call_text(gw.port, "POST", "/v1/completions", body, NULL, 200);
    json_t *cc = json_object_get(j, "chunk_cache");
    ck_assert(json_is_true(json_object_get(cc, "passthrough")));
    ck_assert(json_is_false(json_object_get(cc, "fallback")));
    ck_assert_uint_eq(json_array_size(json_object_get(cc, "segments")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "fake"), "prompt_len")),
                     15);
    json_decref(j);

    /* mode sys: chunk keys include the system segment's key; a custom separator */
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "Sys %s ||| Doc %s ||| Q?", n, n);
    char *b = th_dumps(json_pack("{s:s, s:s, s:s, s:s}", "model", MODEL, "prompt", prompt,
                                 "chunk_separator", "|||", "chunk_mode", "sys"));
    j = th_call_text(gw.port, "POST", "/v1/completions", b, NULL, 200);
    free(b);
    json_t *segs = json_object_get(json_object_get(j, "chunk_cache"), "segments");
    ck_assert_uint_eq(json_array_size(segs), 2);
    char sys_text[96], doc_text[96];
    snprintf(sys_text, sizeof sys_text, "Sys %s", n);
    snprintf(doc_text, sizeof doc_text, "Doc %s", n);
    cg_key sk = cg_key_compute(MODEL, strlen(MODEL), CG_MODE_SYS, NULL, 0, NULL, sys_text,
                               strlen(sys_text));
    assert_seg_key(segs, 0, CG_MODE_SYS, NULL, NULL, sys_text);
    assert_seg_key(segs, 1, CG_MODE_SYS, NULL, &sk, doc_text);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "chunk_cache"), "mode")),
                     "sys");
    json_decref(j);
}
END_TEST

/* Events reach the client as the backend sends them, and the stream ends with one [DONE]. */
START_TEST(completion_stream_incremental)
{
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "S %s # # D %s # # Q", n, n);
    char *b = th_dumps(json_pack("{s:s, s:s, s:b}", "model", MODEL, "prompt", prompt, "stream", 1));
    th_sse s = {0};
    double t0 = th_now_s();
    ck_assert_int_eq(th_sse_post(&s, gw.port, "/v1/completions", b, NULL), CURLE_OK);
    free(b);
    ck_assert_int_eq(s.status, 200);
    ck_assert_str_eq(s.ctype, "text/event-stream");
    /* tok0..tok4, a comment passed through, [DONE] last and once */
    int toks = 0, done = 0, comments = 0, first = -1, last_tok = -1;
    for (int i = 0; i < s.n; i++) {
        if (!strcmp(s.block[i], "data: [DONE]")) {
            done++;
            ck_assert_int_eq(i, s.n - 1);
            continue;
        }
        if (s.block[i][0] == ':') {
            comments += strstr(s.block[i], "fake comment") != NULL;
            continue;
        }
        json_t *j = th_sse_json(&s, i);
        ck_assert_msg(j != NULL, "block %d is not a JSON data event: %s", i, s.block[i]);
        char want[16];
        snprintf(want, sizeof want, "tok%d ", toks);
        ck_assert_str_eq(json_string_value(json_object_get(
                             json_array_get(json_object_get(j, "choices"), 0), "text")),
                         want);
        if (toks == 0) {
            first = i;
            json_t *cc = json_object_get(j, "chunk_cache");
            ck_assert(json_is_object(cc));
            ck_assert_uint_eq(json_array_size(json_object_get(cc, "segments")), 2);
            ck_assert(json_is_true(json_object_get(cc, "fallback")));
            ck_assert_int_eq(
                json_integer_value(json_object_get(json_object_get(j, "fake"), "prompt_len")),
                (json_int_t)strlen(prompt));
        } else {
            ck_assert_ptr_null(json_object_get(j, "chunk_cache")); /* only the first event */
        }
        last_tok = i;
        toks++;
        json_decref(j);
    }
    ck_assert_int_eq(toks, 5);
    ck_assert_int_eq(done, 1);
    ck_assert_int_eq(comments, 1);
    /* The backend waits 100 ms between events: a relay that buffered the answer would deliver
     * the first event with the last one. */
    ck_assert_msg(s.t[last_tok] - s.t[first] >= 0.3,
                  "events arrived together: first %.3f last %.3f", s.t[first] - t0,
                  s.t[last_tok] - t0);
    th_sse_free(&s);
}
END_TEST

START_TEST(stream_usage_and_crlf)
{
    /* a usage chunk gets cached_tokens; CRLF line ends from the backend are handled */
    const char *b =
        "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:CRLF # # d # # q\",\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}";
    th_sse s = {0};
    ck_assert_int_eq(th_sse_post(&s, gw.port, "/v1/completions", b, NULL), CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    int usage_seen = 0, toks = 0;
    for (int i = 0; i < s.n; i++) {
        json_t *j = th_sse_json(&s, i);
        if (!j) continue;
        if (json_array_size(json_object_get(j, "choices"))) toks++;
        json_t *u = json_object_get(j, "usage");
        if (json_is_object(u)) {
            usage_seen++;
            json_t *c =
                json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
            ck_assert(json_is_integer(c));
            ck_assert_int_eq(json_integer_value(c), 0);
        }
        json_decref(j);
    }
    ck_assert_int_eq(toks, 5);
    ck_assert_int_eq(usage_seen, 1);
    ck_assert_str_eq(s.block[s.n - 1], "data: [DONE]");
    th_sse_free(&s);
}
END_TEST

/* ------------------------------------------------------------ tests: chat */

START_TEST(chat_with_documents)
{
    char n[64], d1[96], d2[96], sys[96];
    nonce(n, sizeof n);
    snprintf(sys, sizeof sys, "Be brief %s.", n);
    snprintf(d1, sizeof d1, "Doc one %s", n);
    snprintf(d2, sizeof d2, "Doc two %s", n);
    char *b = th_dumps(json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s}], s:[s, s], s:s}", "model", MODEL,
                                 "messages", "role", "system", "content", sys, "role", "user",
                                 "content", "What now?", "documents", d1, d2, "cache_salt", "t1"));
    json_t *j = th_call_text(gw.port, "POST", "/v1/chat/completions", b, NULL, 200);
    free(b);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    ck_assert(json_is_string(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content")));
    json_t *segs = json_object_get(json_object_get(j, "chunk_cache"), "segments");
    ck_assert_uint_eq(json_array_size(segs), 3);
    const char *texts[] = {sys, d1, d2}, *roles[] = {"system", "chunk", "chunk"};
    for (size_t i = 0; i < 3; i++) {
        assert_seg_key(segs, i, CG_MODE_STRICT, "t1", NULL, texts[i]);
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(segs, i), "role")),
                         roles[i]);
    }
    /* the backend got no extension field, and the documents as a system message after the
     * system prompt */
    json_t *fake_echo = json_object_get(j, "fake");
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(fake_echo, "fields"), i, f)
    {
        ck_assert_str_ne(json_string_value(f), "documents");
        ck_assert_str_ne(json_string_value(f), "cache_salt");
    }
    json_t *msgs = json_object_get(fake_echo, "messages");
    ck_assert_uint_eq(json_array_size(msgs), 3);
    char joined[256];
    snprintf(joined, sizeof joined, "%s\n\n%s", d1, d2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), sys);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 1), "role")), "system");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                     joined);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(msgs, 2), "content")),
                     "What now?");
    json_decref(j);
}
END_TEST

START_TEST(chat_separators_in_messages)
{
    char n[64], content[256], sys[96], chunk[96];
    nonce(n, sizeof n);
    snprintf(sys, sizeof sys, "Sys %s", n);
    snprintf(chunk, sizeof chunk, "Chunk %s", n);
    snprintf(content, sizeof content, "%s # # %s # # the question", sys, chunk);
    /* content as text parts; no extension field, so the body is forwarded unchanged */
    char *b = th_dumps(json_pack("{s:s, s:[{s:s, s:[{s:s, s:s}]}]}", "model", MODEL, "messages",
                                 "role", "user", "content", "type", "text", "text", content));
    json_t *j = th_call_text(gw.port, "POST", "/v1/chat/completions", b, NULL, 200);
    json_t *segs = json_object_get(json_object_get(j, "chunk_cache"), "segments");
    ck_assert_uint_eq(json_array_size(segs), 2);
    assert_seg_key(segs, 0, CG_MODE_STRICT, NULL, NULL, sys);
    assert_seg_key(segs, 1, CG_MODE_STRICT, NULL, NULL, chunk);
    json_t *sent = json_loads(b, 0, NULL);
    ck_assert(json_equal(json_object_get(json_object_get(j, "fake"), "messages"),
                         json_object_get(sent, "messages")));
    json_decref(sent);
    json_decref(j);
    free(b);

    /* a non-text part makes the request pass-through */
    b = th_dumps(json_pack("{s:s, s:[{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}}]}]}", "model", MODEL,
                           "messages", "role", "user", "content", "type", "text", "text", content,
                           "type", "image_url", "image_url", "url", "http://x/y.png"));
    j = th_call_text(gw.port, "POST", "/v1/chat/completions", b, NULL, 200);
    free(b);
    ck_assert(json_is_true(json_object_get(json_object_get(j, "chunk_cache"), "passthrough")));
    json_decref(j);
}
END_TEST

START_TEST(chat_stream)
{
    const char *b =
        "{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":[{\"role\":\"system\","
        "\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q\"}],\"documents\":[\"D\"]}";
    th_sse s = {0};
    ck_assert_int_eq(th_sse_post(&s, gw.port, "/v1/chat/completions", b, NULL), CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    int deltas = 0;
    for (int i = 0; i < s.n; i++) {
        json_t *j = th_sse_json(&s, i);
        if (!j) continue;
        ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
        if (deltas == 0)
            ck_assert_uint_eq(
                json_array_size(json_object_get(json_object_get(j, "chunk_cache"), "segments")), 2);
        deltas++;
        json_decref(j);
    }
    ck_assert_int_eq(deltas, 5);
    ck_assert_str_eq(s.block[s.n - 1], "data: [DONE]");
    th_sse_free(&s);
}
END_TEST

/* ------------------------------------------------------------ tests: bad input */

START_TEST(bad_inputs)
{
    struct {
        const char *method, *path, *body;
        long status;
        const char *code, *param;
    } cases[] = {
        {"POST", "/v1/completions", "{not json", 400, "invalid_json", NULL},
        {"POST", "/v1/completions", "", 400, "invalid_json", NULL},
        {"POST", "/v1/completions", "[1,2]", 400, "invalid_type", NULL},
        {"POST", "/v1/completions", "{\"prompt\":\"x\"}", 400, "missing_field", "model"},
        {"POST", "/v1/completions", "{\"model\":5,\"prompt\":\"x\"}", 400, "invalid_type", "model"},
        {"POST", "/v1/completions", "{\"model\":\"\",\"prompt\":\"x\"}", 400, "invalid_value",
         "model"},
        {"POST", "/v1/completions", "{\"model\":\"m\"}", 400, "missing_field", "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":5}", 400, "invalid_type",
         "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 400,
         "invalid_value", "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":[7]}", 400, "invalid_type",
         "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"yes\"}", 400,
         "invalid_type", "stream"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":\"ten\"}",
         400, "invalid_type", "max_tokens"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":-1}", 400,
         "invalid_value", "max_tokens"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"chunk_separator\":\"\"}",
         400, "invalid_value", "chunk_separator"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"chunk_separator\":3}", 400,
         "invalid_type", "chunk_separator"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"chunk_mode\":\"loose\"}",
         400, "invalid_value", "chunk_mode"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"cache_salt\":1}", 400,
         "invalid_type", "cache_salt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\",\"documents\":[\"d\"]}", 400,
         "invalid_value", "documents"},
        /* only the gateway names an assembly or a KV source to a worker (SSRF otherwise) */
        {"POST", "/v1/completions",
         "{\"model\":\"m\",\"prompt\":\"x\",\"kv_transfer_params\":{\"assembly_id\":\"a\","
         "\"worker\":\"http://127.0.0.1:1\"}}",
         400, "invalid_value", "kv_transfer_params"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"kv_transfer_params\":null}",
         400, "invalid_value", "kv_transfer_params"},
        /* 9 segments; the gateway runs with --max-segments 8 */
        {"POST", "/v1/completions",
         "{\"model\":\"m\",\"prompt\":\"a # # b # # c # # d # # e # # f # # g # # h # # q\"}", 400,
         "too_many_segments", "prompt"},
        {"POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a # # \xff\xfe # # q\"}", 400,
         "invalid_utf8", NULL},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\"}", 400, "missing_field", "messages"},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":\"hi\"}", 400,
         "invalid_type", "messages"},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[]}", 400, "invalid_value",
         "messages"},
        {"POST", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}",
         400, "missing_field", "messages"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "invalid_type",
         "messages"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"documents\":"
         "\"d\"}",
         400, "invalid_type", "documents"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"documents\":[1]}",
         400, "invalid_type", "documents"},
        {"POST", "/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_"
         "tokens\":1.5}",
         400, "invalid_type", "max_completion_tokens"},
        {"GET", "/v1/nope", NULL, 404, "not_found", NULL},
        {"POST", "/nope", "{}", 404, "not_found", NULL},
        {"GET", "/v1/completions", NULL, 405, "method_not_allowed", NULL},
        {"PUT", "/v1/chat/completions", "{}", 405, "method_not_allowed", NULL},
        {"DELETE", "/healthz", NULL, 405, "method_not_allowed", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_resp r;
        http(&r, cases[i].method, cases[i].path, cases[i].body);
        ck_assert_msg(r.status == cases[i].status, "case %zu (%s): HTTP %ld %.*s", i,
                      cases[i].body ? cases[i].body : cases[i].path, r.status, (int)r.body.len,
                      r.body.data ? r.body.data : "");
        th_assert_error(&r, cases[i].status, cases[i].code, cases[i].param);
        th_resp_free(&r);
        assert_healthy();
    }
    /* too large: the gateway runs with --max-body-bytes 64K */
    size_t big = 70 * 1024;
    char *b = malloc(big + 64);
    int k = snprintf(b, 64, "{\"model\":\"m\",\"prompt\":\"");
    memset(b + k, 'a', big);
    strcpy(b + k + big, "\"}");
    th_resp r;
    th_http(&r, gw.port, "POST", "/v1/completions", b, NULL, NULL);
    th_assert_error(&r, 413, "request_too_large", NULL);
    th_resp_free(&r);
    free(b);
    assert_healthy();
}
END_TEST

/* A field of the wrong type is named with the type it must have (it said "must be a string"
 * for booleans and objects), and a malformed stream_options is refused, as the worker and
 * OpenAI refuse it, rather than forwarded. */
START_TEST(wrong_types_say_what_they_must_be)
{
    struct {
        const char *body, *param, *message;
    } cases[] = {
        {"{\"model\":\"m\",\"prompt\":\"x\",\"add_special_tokens\":\"no\"}", "add_special_tokens",
         "add_special_tokens must be a boolean"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"add_special_tokens\":{}}", "add_special_tokens",
         "add_special_tokens must be a boolean"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true,\"stream_options\":\"usage\"}",
         "stream_options", "stream_options must be an object {include_usage: boolean}"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true,\"stream_options\":"
         "{\"include_usage\":\"yes\"}}",
         "stream_options", "stream_options must be an object {include_usage: boolean}"},
        {"{\"model\":\"m\",\"prompt\":\"x\",\"quality_probe\":[]}", "quality_probe",
         "quality_probe must be a boolean"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        th_resp r;
        http(&r, "POST", "/v1/completions", cases[i].body);
        th_assert_error(&r, 400, "invalid_type", cases[i].param);
        json_t *j = th_json(&r);
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                         cases[i].message);
        json_decref(j);
        th_resp_free(&r);
    }
    /* null and a well-formed object still pass */
    th_expect(gw.port, "POST", "/v1/completions",
              "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":null}", NULL, 200);
    assert_healthy();
}
END_TEST

/* ------------------------------------------------------------ tests: admin and index */

START_TEST(admin_auth)
{
    const char *paths[][3] = {{"GET", "/v1/chunks", NULL},
                              {"GET", "/v1/chunks/00000000000000000000000000000000", NULL},
                              {"DELETE", "/v1/chunks/00000000000000000000000000000000", NULL},
                              {"POST", "/v1/chunks/lookup", "{\"keys\":[]}"}};
    for (size_t i = 0; i < 4; i++) {
        th_resp r;
        th_http(&r, gw.port, paths[i][0], paths[i][1], paths[i][2], NULL, NULL);
        th_assert_error(&r, 401, "invalid_api_key", NULL);
        th_resp_free(&r);
        th_http(&r, gw.port, paths[i][0], paths[i][1], paths[i][2], "tok-admi", NULL);
        th_assert_error(&r, 401, "invalid_api_key", NULL);
        th_resp_free(&r);
        th_http(&r, gw.port, paths[i][0], paths[i][1], paths[i][2], ADMIN_TOKEN, NULL);
        ck_assert_msg(r.status == 200 || r.status == 404, "%s %s: %ld", paths[i][0], paths[i][1],
                      r.status);
        th_resp_free(&r);
    }
    /* inference routes do not need the admin token */
    th_expect(gw.port, "GET", "/v1/models", NULL, NULL, 200);
}
END_TEST

START_TEST(index_contents_and_admin)
{
    char n[64], prompt[256], sys[96], doc[96];
    nonce(n, sizeof n);
    snprintf(sys, sizeof sys, "Index sys %s", n);
    snprintf(doc, sizeof doc, "Index doc %s", n);
    snprintf(prompt, sizeof prompt, "%s # # %s # # q1", sys, doc);
    char *b = th_dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    th_resp r;
    for (int i = 0; i < 2; i++) { /* the same documents twice, once streamed */
        if (i == 0) {
            th_expect(gw.port, "POST", "/v1/completions", b, NULL, 200);
        } else {
            char *sb = th_dumps(
                json_pack("{s:s, s:s, s:b}", "model", MODEL, "prompt", prompt, "stream", 1));
            th_sse s = {0};
            ck_assert_int_eq(th_sse_post(&s, gw.port, "/v1/completions", sb, NULL), CURLE_OK);
            th_sse_free(&s);
            free(sb);
        }
    }
    char ks[CG_KEY_HEX_LEN + 1], kd[CG_KEY_HEX_LEN + 1], path[128];
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, sys, ks);
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, doc, kd);

    snprintf(path, sizeof path, "/v1/chunks/%s", kd);
    json_t *j = th_call_text(gw.port, "GET", path, NULL, ADMIN_TOKEN, 200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")), kd);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chunk");
    ck_assert_str_eq(json_string_value(json_object_get(j, "model")), MODEL);
    ck_assert_str_eq(json_string_value(json_object_get(j, "mode")), "strict");
    ck_assert_int_eq(json_integer_value(json_object_get(j, "seen_count")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "bytes")), (json_int_t)strlen(doc));
    ck_assert_int_eq(json_integer_value(json_object_get(j, "hit_count")), 0);
    ck_assert(json_is_array(json_object_get(j, "placements")));
    json_decref(j);

    /* lookup by keys, one unknown */
    char lk[256];
    snprintf(lk, sizeof lk, "{\"keys\":[\"%s\",\"%s\",\"ffffffffffffffffffffffffffffffff\"]}", ks,
             kd);
    j = th_call_text(gw.port, "POST", "/v1/chunks/lookup", lk, ADMIN_TOKEN, 200);
    json_t *d = json_object_get(j, "data");
    ck_assert_uint_eq(json_array_size(d), 3);
    ck_assert(json_is_true(json_object_get(json_array_get(d, 0), "found")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(d, 1), "seen_count")), 2);
    ck_assert(json_is_false(json_object_get(json_array_get(d, 2), "found")));
    ck_assert(json_is_null(json_object_get(json_array_get(d, 0), "role")));
    json_decref(j);

    /* lookup by prompt: the same keys, with roles */
    j = th_call_text(gw.port, "POST", "/v1/chunks/lookup", b, ADMIN_TOKEN, 200);
    d = json_object_get(j, "data");
    ck_assert_uint_eq(json_array_size(d), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "key")), ks);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "role")), "system");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 1), "role")), "chunk");
    ck_assert(json_is_true(json_object_get(json_array_get(d, 1), "found")));
    json_decref(j);
    free(b);

    /* delete, then it is gone */
    j = th_call_text(gw.port, "DELETE", path, NULL, ADMIN_TOKEN, 200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "id")), kd);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "chunk.deleted");
    ck_assert(json_is_true(json_object_get(j, "deleted")));
    json_decref(j);
    admin(&r, "GET", path, NULL);
    th_assert_error(&r, 404, "not_found", NULL);
    th_resp_free(&r);
    admin(&r, "DELETE", path, NULL);
    th_assert_error(&r, 404, "not_found", NULL);
    th_resp_free(&r);
    /* malformed keys and lookups */
    admin(&r, "GET", "/v1/chunks/xyz", NULL);
    th_assert_error(&r, 400, "invalid_value", "key");
    th_resp_free(&r);
    admin(&r, "POST", "/v1/chunks/lookup", "{\"keys\":[\"zz\"]}");
    th_assert_error(&r, 400, "invalid_value", "keys");
    th_resp_free(&r);
    admin(&r, "POST", "/v1/chunks/lookup", "{\"model\":\"m\"}");
    th_assert_error(&r, 400, "missing_field", NULL);
    th_resp_free(&r);
}
END_TEST

START_TEST(chunks_paging)
{
    /* make sure there are at least 5 chunks */
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "p1 %s # # p2 %s # # p3 %s # # p4 %s # # p5 %s # # q", n, n, n,
             n, n);
    char *b = th_dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    th_resp r;
    th_expect(gw.port, "POST", "/v1/completions", b, NULL, 200);
    free(b);

    json_t *all = th_call_text(gw.port, "GET", "/v1/chunks?limit=1000", NULL, ADMIN_TOKEN, 200);
    size_t total = json_array_size(json_object_get(all, "data"));
    ck_assert_uint_ge(total, 5);
    ck_assert(json_is_false(json_object_get(all, "has_more")));

    /* page by 2 and compare */
    char after[64] = "", path[128];
    size_t seen = 0;
    for (int page = 0; page < 10000; page++) {
        snprintf(path, sizeof path, "/v1/chunks?limit=2%s%s", after[0] ? "&after=" : "", after);
        json_t *j = th_call_text(gw.port, "GET", path, NULL, ADMIN_TOKEN, 200);
        ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
        json_t *d = json_object_get(j, "data");
        ck_assert_uint_le(json_array_size(d), 2);
        for (size_t i = 0; i < json_array_size(d); i++, seen++)
            ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, i), "id")),
                             json_string_value(json_object_get(
                                 json_array_get(json_object_get(all, "data"), seen), "id")));
        if (json_array_size(d)) {
            ck_assert_str_eq(json_string_value(json_object_get(j, "first_id")),
                             json_string_value(json_object_get(json_array_get(d, 0), "id")));
            ck_assert_str_eq(json_string_value(json_object_get(j, "last_id")),
                             json_string_value(
                                 json_object_get(json_array_get(d, json_array_size(d) - 1), "id")));
        }
        int more = json_is_true(json_object_get(j, "has_more"));
        if (more)
            snprintf(after, sizeof after, "%s", json_string_value(json_object_get(j, "last_id")));
        json_decref(j);
        if (!more) break;
    }
    ck_assert_uint_eq(seen, total);
    json_decref(all);

    const char *bad[] = {"/v1/chunks?limit=0", "/v1/chunks?limit=1001", "/v1/chunks?limit=x",
                         "/v1/chunks?after=nothex"};
    for (size_t i = 0; i < 4; i++) {
        admin(&r, "GET", bad[i], NULL);
        th_assert_error(&r, 400, "invalid_value", NULL);
        th_resp_free(&r);
    }
}
END_TEST

START_TEST(models_and_readyz)
{
    json_t *j = th_call_text(gw.port, "GET", "/v1/models", NULL, NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "fake-model");
    json_decref(j);
    j = th_call_text(gw.port, "GET", "/readyz", NULL, NULL, 200);
    ck_assert_str_eq(json_string_value(json_object_get(j, "status")), "ready");
    json_decref(j);
}
END_TEST

/* ------------------------------------------------------------ tests: failures */

START_TEST(backend_faults)
{
    struct {
        const char *prompt;
        long status;
        const char *code;
    } cases[] = {
        {"FAULT:500 # # d # # q", 500, "fake_500"}, /* the backend's own error, relayed */
        {"FAULT:TEXT500", 502, "bad_gateway"},      /* not an OpenAI error */
        {"FAULT:BADJSON # # d # # q", 502, "bad_gateway"},
        {"FAULT:STALL:4000", 504, "upstream_timeout"}, /* --backend-timeout-ms 1500 */
        {"FAULT:BIG:100000", 502, "bad_gateway"},      /* --max-upstream-bytes 64K */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *b = th_dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", cases[i].prompt));
        th_resp r;
        http(&r, "POST", "/v1/completions", b);
        free(b);
        th_assert_error(&r, cases[i].status, cases[i].code, NULL);
        th_resp_free(&r);
        assert_healthy();
    }
    /* a stream cut by the backend ends with an error event and no [DONE] */
    th_sse s = {0};
    const char *sb = "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:CLOSE\",\"stream\":true}";
    ck_assert_int_eq(th_sse_post(&s, gw.port, "/v1/completions", sb, NULL), CURLE_OK);
    ck_assert_int_eq(s.status, 200);
    ck_assert_int_ge(s.n, 2);
    json_t *j = th_sse_json(&s, s.n - 1);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "bad_gateway");
    json_decref(j);
    for (int i = 0; i < s.n; i++)
        ck_assert_str_ne(s.block[i], "data: [DONE]");
    th_sse_free(&s);
    /* a stream whose backend stalls before the first event: the gateway commits to a stream
     * only with the first byte of the answer, so the client gets a plain 504 */
    sb = "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:STALL:4000\",\"stream\":true}";
    th_resp r;
    http(&r, "POST", "/v1/completions", sb);
    th_assert_error(&r, 504, "upstream_timeout", NULL);
    th_resp_free(&r);
    char *m = scrape();
    ck_assert_double_ge(th_metric_in(m, "chunkgate_backend_errors_total{kind=\"timeout\"}"), 2);
    ck_assert_double_ge(th_metric_in(m, "chunkgate_backend_errors_total{kind=\"too_large\"}"), 1);
    ck_assert_double_ge(th_metric_in(m, "chunkgate_backend_errors_total{kind=\"status\"}"), 2);
    ck_assert_double_ge(th_metric_in(m, "chunkgate_backend_errors_total{kind=\"stream\"}"), 1);
    free(m);
    assert_healthy();
}
END_TEST

static json_t *fake_stats(void)
{
    json_t *j = th_call_text(fake.port, "GET", "/stats", NULL, NULL, 200);
    return j;
}

static long stat_of(json_t *j, const char *k)
{
    return (long)json_integer_value(json_object_get(j, k));
}

/* The client leaves mid-stream: the gateway cancels the upstream transfer at once instead of
 * reading the rest of the answer (the slow stream has 60 events 100 ms apart). */
START_TEST(client_disconnect_cancels_upstream)
{
    json_t *before = fake_stats();
    char *m0 = scrape();
    double disc0 = th_metric_in(m0, "chunkgate_client_disconnects_total");
    free(m0);
    th_sse s = {0};
    s.stop_after = 2;
    const char *b =
        "{\"model\":\"" MODEL "\",\"prompt\":\"FAULT:SLOW # # d # # q\",\"stream\":true}";
    double t0 = th_now_s();
    ck_assert_int_eq(th_sse_post(&s, gw.port, "/v1/completions", b, NULL), CURLE_WRITE_ERROR);
    th_sse_free(&s);
    json_t *after = NULL;
    int cancelled = 0;
    while (th_now_s() - t0 < 4.0) { /* the full answer would take 6 s */
        json_decref(after);
        after = fake_stats();
        if (stat_of(after, "streams_aborted") > stat_of(before, "streams_aborted")) {
            cancelled = 1;
            break;
        }
        th_sleep_ms(50);
    }
    ck_assert_msg(cancelled, "the backend's stream was not cancelled");
    ck_assert_int_eq(stat_of(after, "streams_completed"), stat_of(before, "streams_completed"));
    char *m = scrape();
    ck_assert_double_eq(th_metric_in(m, "chunkgate_client_disconnects_total"), disc0 + 1);
    free(m);
    json_decref(before);
    json_decref(after);
    assert_healthy();
}
END_TEST

START_TEST(backend_down)
{
    char backend[64];
    snprintf(backend, sizeof backend, "http://127.0.0.1:%d", th_free_port()); /* refused */
    th_proc g2;
    const char *extra[] = {"--model", "gw-default", NULL};
    ck_assert_int_eq(start_gateway(&g2, "down", backend, extra), 0);
    for (int i = 0; i < 2; i++) {
        th_resp r;
        const char *b = i ? "{\"model\":\"m\",\"prompt\":\"x\",\"stream\":true}"
                          : "{\"model\":\"m\",\"prompt\":\"s # # d # # q\"}";
        th_http(&r, g2.port, "POST", "/v1/completions", b, NULL, NULL);
        th_assert_error(&r, 502, "upstream_unavailable", NULL);
        json_t *j = th_body_json(&r);
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                         "upstream_error");
        json_decref(j);
        th_resp_free(&r);
        th_expect(g2.port, "GET", "/healthz", NULL, NULL, 200);
    }
    th_resp r;
    th_http(&r, g2.port, "GET", "/readyz", NULL, NULL, NULL);
    th_assert_error(&r, 503, "upstream_unavailable", NULL);
    th_resp_free(&r);
    json_t *j = th_call_text(g2.port, "GET", "/v1/models", NULL, NULL, 200);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "gw-default");
    json_decref(j);
    /* the segments were still recorded */
    j = th_call_text(g2.port, "GET", "/v1/chunks", NULL, NULL, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "data")), 2);
    json_decref(j);
    th_http(&r, g2.port, "GET", "/metrics", NULL, NULL, NULL);
    ck_assert_double_eq(
        th_metric_in(r.body.data, "chunkgate_backend_errors_total{kind=\"connect\"}"), 2);
    th_resp_free(&r);
    ck_assert_int_eq(th_stop(&g2, SIGTERM), 0);

    /* no backend at all: 503 after validation, 400 still first */
    ck_assert_int_eq(start_gateway(&g2, "nobackend", NULL, NULL), 0);
    th_http(&r, g2.port, "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\"}", NULL,
            NULL);
    th_assert_error(&r, 503, "upstream_unavailable", NULL);
    th_resp_free(&r);
    th_http(&r, g2.port, "POST", "/v1/completions", "{\"model\":1}", NULL, NULL);
    th_assert_error(&r, 400, "invalid_type", "model");
    th_resp_free(&r);
    th_http(&r, g2.port, "GET", "/v1/models", NULL, NULL, NULL);
    th_assert_error(&r, 503, "upstream_unavailable", NULL);
    th_resp_free(&r);
    ck_assert_int_eq(th_stop(&g2, SIGINT), 0);
}
END_TEST

START_TEST(restart_keeps_index)
{
    char dir[300], n[64], prompt[256], doc[96], hex[CG_KEY_HEX_LEN + 1], path[128];
    th_path(dir, sizeof dir, "restart");
    const char *same_dir[] = {"--data-dir", dir, NULL};
    nonce(n, sizeof n);
    snprintf(doc, sizeof doc, "Restart doc %s", n);
    snprintf(prompt, sizeof prompt, "sys # # %s # # q", doc);
    key_hex(MODEL, CG_MODE_STRICT, NULL, NULL, doc, hex);
    snprintf(path, sizeof path, "/v1/chunks/%s", hex);
    char *b = th_dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    for (int round = 1; round <= 2; round++) {
        th_proc g;
        ck_assert_int_eq(
            start_gateway(&g, round == 1 ? "restart1" : "restart2", fake.url, same_dir), 0);
        if (round == 2) { /* what the first run recorded is still there */
            json_t *j = th_call_text(g.port, "GET", path, NULL, NULL, 200);
            ck_assert_int_eq(json_integer_value(json_object_get(j, "seen_count")), 1);
            json_decref(j);
        }
        th_expect(g.port, "POST", "/v1/completions", b, NULL, 200);
        json_t *j = th_call_text(g.port, "GET", path, NULL, NULL, 200);
        ck_assert_int_eq(json_integer_value(json_object_get(j, "seen_count")), round);
        json_decref(j);
        ck_assert_int_eq(th_stop(&g, SIGTERM), 0);
        char *log = th_read_file(g.log, NULL);
        ck_assert_ptr_nonnull(strstr(log, "\"msg\":\"stopped\""));
        free(log);
    }
    free(b);
}
END_TEST

#define OK_COMPLETIONS "chunkgate_requests_total{route=\"completions\",code=\"200\"}"

START_TEST(metrics_series)
{
    char *m0 = scrape();
    double misses0 = th_metric_in(m0, "chunkgate_chunk_misses_total");
    double empty0 = th_metric_in(m0, "chunkgate_empty_segments_total");
    double chunks0 = th_metric_in(m0, "chunkgate_segments_total{role=\"chunk\"}");
    double ok0 = th_metric_in(m0, OK_COMPLETIONS);
    double fb0 = th_metric_in(m0, "chunkgate_fallbacks_total");
    free(m0);
    char n[64], prompt[512];
    nonce(n, sizeof n);
    snprintf(prompt, sizeof prompt, "ms %s # # a %s # #  # # b %s # # q", n, n, n);
    char *b = th_dumps(json_pack("{s:s, s:s}", "model", MODEL, "prompt", prompt));
    th_expect(gw.port, "POST", "/v1/completions", b, NULL, 200);
    free(b);
    char *m = scrape();
    ck_assert_double_eq(th_metric_in(m, "chunkgate_chunk_misses_total"), misses0 + 3);
    ck_assert_double_eq(th_metric_in(m, "chunkgate_empty_segments_total"), empty0 + 1);
    ck_assert_double_eq(th_metric_in(m, "chunkgate_segments_total{role=\"chunk\"}"), chunks0 + 2);
    ck_assert_double_eq(th_metric_in(m, "chunkgate_fallbacks_total"), fb0 + 1);
    /* counted once the reply is out, so it may trail the client by a moment */
    double ok_want = (ok0 < 0 ? 0 : ok0) + 1;
    ck_assert_double_eq(th_counter_settled(gw.port, OK_COMPLETIONS, ok_want), ok_want);
    const char *series[] = {
        "chunkgate_chunk_hits_total",
        "chunkgate_tokens_reused_total",
        "chunkgate_tokens_computed_total",
        "chunkgate_passthrough_total",
        "chunkgate_worker_errors_total{kind=\"connect\"}",
        "chunkgate_index_chunks",
        "chunkgate_index_bytes",
        "chunkgate_index_writer_batches_total",
        "chunkgate_index_writer_queue_depth",
        "chunkgate_ttft_seconds_count",
        "chunkgate_backend_errors_total{kind=\"connect\"}",
        "chunkgate_request_duration_seconds_count{route=\"completions\"}",
        "chunkgate_request_duration_seconds_bucket{route=\"completions\",le=\"+Inf\"}",
        "chunkgate_segments_total{role=\"system\"}",
        "chunkgate_segments_total{role=\"question\"}",
    };
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++)
        ck_assert_msg(th_metric_in(m, series[i]) >= 0, "series %s missing", series[i]);
    ck_assert_double_ge(th_metric_in(m, "chunkgate_index_chunks"), 3);
    ck_assert_ptr_nonnull(strstr(m, "# TYPE chunkgate_ttft_seconds histogram"));
    free(m);
}
END_TEST

/* Many concurrent streams through the gateway: every one completes with [DONE]. */
START_TEST(concurrent_streams)
{
    enum { N = 100 };
    static th_resp rs[N];
    th_req q = {.path = "/v1/completions",
                .body = "{\"model\":\"" MODEL "\",\"prompt\":\"s # # d # # q\",\"stream\":true}",
                .timeout_s = 60};
    th_send_many(rs, N, gw.port, &q);
    for (int i = 0; i < N; i++) {
        th_sse s = {0};
        th_sse_feed(&s, rs[i].body.data, rs[i].body.len);
        ck_assert_msg(s.n > 0 && !strcmp(s.block[s.n - 1], "data: [DONE]"), "stream %d incomplete",
                      i);
        th_sse_free(&s);
        th_resp_free(&rs[i]);
    }
    assert_healthy();
}
END_TEST

START_TEST(config_errors_exit_2)
{
    struct {
        const char *args[4];
        int rc;
        const char *text;
    } cases[] = {
        {{"--nope", NULL}, 2, "unknown option"},
        {{"--max-segments", "1", NULL}, 2, "--max-segments"},
        {{"--listen", "127.0.0.1:99999", NULL}, 2, "--listen"},
        {{"--log-level", "chatty", NULL}, 2, "--log-level"},
        {{"--help", NULL}, 0, "CHUNKGATE_BACKEND"},
        {{"--data-dir", "/proc/no/such/dir", "--listen", "127.0.0.1:0"},
         1,
         "cannot create directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char log[32];
        snprintf(log, sizeof log, "cfg%zu.log", i);
        const char *args[5] = {cases[i].args[0], cases[i].args[1], cases[i].args[2],
                               cases[i].args[3], NULL};
        int rc = th_run_cmd(CHUNKGATE_BIN, args, log);
        ck_assert_msg(rc == cases[i].rc, "case %zu exited %d", i, rc);
        char path[512];
        char *text = th_read_file(th_path(path, sizeof path, log), NULL);
        ck_assert_msg(strstr(text, cases[i].text) != NULL, "case %zu: %s", i, text);
        free(text);
    }
}
END_TEST

int main(void)
{
    return th_run_suite(
        "gateway", "integration", 120, (th_fixture){suite_setup, suite_teardown, 0}, CK_FORK_GETENV,
        TH_TESTS(completion_forwarded_with_chunk_cache, completion_passthrough_and_modes,
                 completion_stream_incremental, stream_usage_and_crlf, chat_with_documents,
                 chat_separators_in_messages, chat_stream, bad_inputs,
                 wrong_types_say_what_they_must_be, admin_auth, index_contents_and_admin,
                 chunks_paging, models_and_readyz, backend_faults,
                 client_disconnect_cancels_upstream, backend_down, restart_keeps_index,
                 metrics_series, concurrent_streams, config_errors_exit_2));
}
