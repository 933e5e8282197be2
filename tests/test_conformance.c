/* OpenAI conformance of the gateway, end to end: a chat message without content, usage in a
 * stream only when asked for and always in a final chunk of its own (also from a backend that
 * puts it on its last choice chunk), parameters a completion cannot honour refused by name on
 * every path (never dropped), unknown fields passed to --backend and not to a worker,
 * prompt + max_tokens beyond the context refused on the main path and in pass-through, and
 * chunk_cache agreeing with cached_tokens after a worker failed and another one answered.
 * The real chunkgate in front of tests/fake_backend and of real chunkgate-worker processes. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness/harness.h"

#define MODEL "chunkgate-tiny"

static th_proc fake, gwb, wa, wb, gww;
static char backend[64], ua[64], ub[64], model_dir[400];

static void setup(void)
{
    if (th_init_with_model("conformance", WORKER_BIN, model_dir, sizeof model_dir) != 0) abort();
    const char *fargs[] = {"--delay-ms", "5", "--events", "4", NULL};
    if (th_start_fake(&fake, FAKE_BACKEND_BIN, "fake", fargs) != 0) th_die("fake backend", &fake);
    snprintf(backend, sizeof backend, "http://127.0.0.1:%d", fake.port);
    const char *eb[] = {"--backend", backend, NULL};
    if (th_start_gateway(&gwb, CHUNKGATE_BIN, "gwb", eb) != 0) th_die("gateway (backend)", &gwb);
    /* Worker A holds one assembly at a time (a held one makes its assemble fail); worker B
     * takes bodies up to 64 KiB only (what the gateway forwards to it shows). */
    const char *xa[] = {"--max-assemblies", "1", NULL};
    const char *xb[] = {"--max-body", "64K", NULL};
    if (th_start_worker(&wa, WORKER_BIN, model_dir, 0, "wa", xa) != 0) th_die("worker A", &wa);
    if (th_start_worker(&wb, WORKER_BIN, model_dir, 0, "wb", xb) != 0) th_die("worker B", &wb);
    snprintf(ua, sizeof ua, "http://127.0.0.1:%d", wa.port);
    snprintf(ub, sizeof ub, "http://127.0.0.1:%d", wb.port);
    const char *ew[] = {"--worker", ub, "--health-interval-ms", "200", NULL};
    if (th_start_gateway(&gww, CHUNKGATE_BIN, "gww", ew) != 0) th_die("gateway (worker)", &gww);
    if (!th_wait_worker(gww.port, NULL, ub, 1)) th_die("worker B healthy", &gww);
}

static void teardown(void)
{
    th_stop_clean(&gwb, "chunkgate (backend)");
    th_stop_clean(&gww, "chunkgate (workers)");
    th_stop_clean(&wa, "worker A");
    th_stop_clean(&wb, "worker B");
    th_stop(&fake, SIGTERM);
    th_cleanup(th_failures);
}

/* POSTs body (taken over) to path; returns the answer's status, and its error code and param
 * into code / param when it is an error. */
static long post(int port, const char *path, json_t *body, char *code, char *param, json_t **out)
{
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    th_resp r;
    th_http(&r, port, "POST", path, b, NULL, NULL);
    free(b);
    json_t *j = th_json(&r);
    json_t *e = json_object_get(j, "error");
    if (code) snprintf(code, 64, "%s", json_string_value(json_object_get(e, "code")) ?: "");
    if (param) snprintf(param, 64, "%s", json_string_value(json_object_get(e, "param")) ?: "");
    long st = r.status;
    if (st != 200 && st != 400 && st != 413)
        fprintf(stderr, "%s: HTTP %ld %.*s\n", path, st, (int)r.body.len, r.body.data);
    th_resp_free(&r);
    if (out)
        *out = j;
    else
        json_decref(j);
    return st;
}

/* ------------------------------------------------------------ chat messages */

START_TEST(message_without_content)
{
    char code[64], param[64];
    /* a user (or system, developer, tool) message must have content, as OpenAI requires */
    const char *roles[] = {"user", "system", "developer", "tool"};
    for (size_t i = 0; i < CG_ARRAY_LEN(roles); i++) {
        json_t *b = json_pack("{s:s, s:[{s:s}, {s:s, s:s}]}", "model", "m", "messages", "role",
                              roles[i], "role", "user", "content", "q");
        ck_assert_int_eq(post(gwb.port, "/v1/chat/completions", b, code, param, NULL), 400);
        ck_assert_str_eq(code, "missing_field");
        ck_assert_str_eq(param, "messages");
    }
    /* an assistant turn may go without (its tool calls stand for it) */
    json_t *b = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:[]}, {s:s, s:s}]}", "model", "m",
                          "messages", "role", "user", "content", "hi", "role", "assistant",
                          "tool_calls", "role", "user", "content", "q");
    ck_assert_int_eq(post(gwb.port, "/v1/chat/completions", b, code, param, NULL), 200);
}
END_TEST

/* ------------------------------------------------------------ stream usage */

/* Checks a stream's events: usage appears only when asked, then exactly once, in the last
 * event before [DONE], with "choices": [] and cached_tokens; no choice chunk carries it. */
static void check_usage_events(char **ev, int n, int asked, const char *what)
{
    ck_assert_msg(n >= 2 && !strcmp(ev[n - 1], "[DONE]"), "%s: no [DONE]", what);
    int with_usage = 0;
    for (int i = 0; i < n - 1; i++) {
        json_t *j = json_loads(ev[i], 0, NULL);
        ck_assert_msg(json_is_object(j), "%s: event %d is not JSON: %s", what, i, ev[i]);
        json_t *u = json_object_get(j, "usage");
        json_t *choices = json_object_get(j, "choices");
        if (json_is_object(u)) {
            with_usage++;
            ck_assert_msg(asked, "%s: usage sent without being asked for: %s", what, ev[i]);
            ck_assert_msg(i == n - 2, "%s: usage in event %d of %d: %s", what, i, n, ev[i]);
            ck_assert_msg(json_is_array(choices) && json_array_size(choices) == 0,
                          "%s: usage rides on a choice chunk: %s", what, ev[i]);
            ck_assert(json_is_integer(
                json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")));
            ck_assert(json_is_integer(json_object_get(u, "completion_tokens")));
        } else {
            ck_assert_msg(!u || (asked && json_is_null(u)), "%s: %s", what, ev[i]);
            ck_assert_msg(json_array_size(choices) > 0, "%s: a chunk without choices or usage",
                          what);
        }
        json_decref(j);
    }
    ck_assert_int_eq(with_usage, asked ? 1 : 0);
}

START_TEST(stream_usage_only_when_asked_final_chunk)
{
    /* the fake backend sends usage in a chunk of its own, or (FAULT:USAGELAST) on its last
     * choice chunk; through the gateway the client sees OpenAI's shape either way */
    for (int rides = 0; rides <= 1; rides++)
        for (int chat = 0; chat <= 1; chat++)
            for (int asked = 0; asked <= 1; asked++) {
                const char *text = rides ? "FAULT:USAGELAST hello" : "hello";
                json_t *b =
                    chat ? json_pack("{s:s, s:b, s:[{s:s, s:s}]}", "model", "m", "stream", 1,
                                     "messages", "role", "user", "content", text)
                         : json_pack("{s:s, s:b, s:s}", "model", "m", "stream", 1, "prompt", text);
                if (asked)
                    json_object_set_new(b, "stream_options",
                                        json_pack("{s:b}", "include_usage", 1));
                char *s = json_dumps(b, JSON_COMPACT);
                json_decref(b);
                char **ev;
                int n;
                long status;
                ck_assert_int_eq(th_sse_data(gwb.port,
                                             chat ? "/v1/chat/completions" : "/v1/completions", s,
                                             NULL, &status, &ev, &n),
                                 CURLE_OK);
                ck_assert_int_eq(status, 200);
                char what[96];
                snprintf(what, sizeof what, "%s, usage %s, %s", chat ? "chat" : "completion",
                         asked ? "asked" : "not asked",
                         rides ? "backend puts it on the last choice" : "backend chunk");
                check_usage_events(ev, n, asked, what);
                th_sse_data_free(ev, n);
                free(s);
            }
}
END_TEST

/* ------------------------------------------------------------ parameters */

/* Asserts the fake backend's answer ans lists field among the request fields it received;
 * takes ans over. */
static void assert_backend_saw(json_t *ans, const char *field)
{
    json_t *fields = json_object_get(json_object_get(ans, "fake"), "fields");
    int seen = 0;
    size_t k;
    json_t *f;
    json_array_foreach(fields, k, f) seen |= !strcmp(json_string_value(f), field);
    ck_assert_msg(seen, "%s did not reach the backend", field);
    json_decref(ans);
}

/* A chat that reaches a worker is answered through /v1/completions: what a completion cannot
 * honour is refused by name, by the gateway (no completions equivalent) or by the worker (a
 * sampling option it does not implement), and never dropped. Neutral values pass. */
START_TEST(chat_parameters_refused_by_name)
{
    struct {
        const char *field, *value; /* JSON */
        long status;
        const char *param;
    } cases[] = {
        {"tools", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 400, "tools"},
        {"tool_choice", "\"required\"", 400, "tool_choice"},
        {"echo", "true", 400, "echo"},
        {"logprobs", "true", 200, NULL}, /* honoured: a completion's logprobs, in chat shape */
        {"response_format", "{\"type\":\"json_object\"}", 400, "response_format"},
        {"top_k", "5", 400, "top_k"},
        {"presence_penalty", "0.5", 400, "presence_penalty"},
        {"logit_bias", "{\"5\":10}", 400, "logit_bias"},
        {"tools", "[]", 200, NULL},
        {"tool_choice", "\"auto\"", 200, NULL},
        {"logprobs", "false", 200, NULL},
        {"presence_penalty", "0", 200, NULL},
        {"metadata", "{\"a\":\"b\"}", 200, NULL},
        /* vLLM's sampling fields: refused unless neutral, never dropped */
        {"ignore_eos", "true", 400, "ignore_eos"},
        {"ignore_eos", "false", 200, NULL},
        {"min_p", "0.1", 400, "min_p"},
        {"min_p", "0", 200, NULL},
        {"skip_special_tokens", "false", 400, "skip_special_tokens"},
        {"skip_special_tokens", "true", 200, NULL},
        {"stop_token_ids", "[7]", 400, "stop_token_ids"},
        {"guided_choice", "[\"a\",\"b\"]", 400, "guided_choice"},
    };
    for (int sep = 0; sep <= 1; sep++)
        for (size_t i = 0; i < CG_ARRAY_LEN(cases); i++) {
            const char *content = sep ? "A system. # # A document. # # A question?" : "Hello?";
            json_t *b =
                json_pack("{s:s, s:i, s:f, s:[{s:s, s:s}]}", "model", MODEL, "max_tokens", 2,
                          "temperature", 0.0, "messages", "role", "user", "content", content);
            json_object_set_new(b, cases[i].field,
                                json_loads(cases[i].value, JSON_DECODE_ANY, NULL));
            char code[64], param[64];
            long st = post(gww.port, "/v1/chat/completions", b, code, param, NULL);
            ck_assert_msg(st == cases[i].status, "%s %s (separators %d): HTTP %ld %s",
                          cases[i].field, cases[i].value, sep, st, code);
            if (cases[i].param) ck_assert_str_eq(param, cases[i].param);
        }
    /* through --backend the chat itself is forwarded: its tools reach the backend */
    json_t *b = json_pack("{s:s, s:[{s:s, s:s}], s:[{s:s}]}", "model", "m", "messages", "role",
                          "user", "content", "Hello?", "tools", "type", "function");
    json_t *ans;
    ck_assert_int_eq(post(gwb.port, "/v1/chat/completions", b, NULL, NULL, &ans), 200);
    assert_backend_saw(ans, "tools");
}
END_TEST

/* Fields the gateway does not know: passed unchanged to --backend (which may know them), not
 * to a worker (which would ignore them after parsing them again). Worker B takes 64 KiB bodies:
 * a 200 KB unknown field would not fit. */
START_TEST(unknown_fields_rule)
{
    char *pad = cg_malloc(200001);
    memset(pad, 'u', 200000);
    pad[200000] = '\0';
    for (int sep = 0; sep <= 1; sep++) {
        const char *prompt = sep ? "Unknown system. # # Unknown doc. # # Unknown q?" : "Unknown q?";
        json_t *b = json_pack("{s:s, s:s, s:i, s:f, s:s}", "model", MODEL, "prompt", prompt,
                              "max_tokens", 2, "temperature", 0.0, "vendor_padding", pad);
        char code[64];
        long st = post(gww.port, "/v1/completions", b, code, NULL, NULL);
        ck_assert_msg(st == 200, "separators %d: HTTP %ld %s", sep, st, code);
    }
    json_t *b =
        json_pack("{s:s, s:s, s:i}", "model", "m", "prompt", "Hello # # doc # # q?", "vendor_x", 7);
    json_t *ans;
    ck_assert_int_eq(post(gwb.port, "/v1/completions", b, NULL, NULL, &ans), 200);
    assert_backend_saw(ans, "vendor_x");
    free(pad);
}
END_TEST

/* ------------------------------------------------------------ context length */

/* prompt + max_tokens beyond the model's context (32768 positions) is 400
 * context_length_exceeded, as OpenAI and vLLM answer, on the main path (streamed or not,
 * completion or chat) and in pass-through; never an answer cut short. */
START_TEST(context_length_exceeded_on_every_path)
{
    for (int sep = 0; sep <= 1; sep++)
        for (int chat = 0; chat <= 1; chat++)
            for (int stream = 0; stream <= 1; stream++) {
                const char *p = sep ? "Context system. # # Context doc. # # Context question?"
                                    : "Context question without separators?";
                json_t *b = chat ? json_pack("{s:s, s:[{s:s, s:s}]}", "model", MODEL, "messages",
                                             "role", "user", "content", p)
                                 : json_pack("{s:s, s:s}", "model", MODEL, "prompt", p);
                json_object_set_new(b, "max_tokens", json_integer(32760));
                json_object_set_new(b, "stream", json_boolean(stream));
                char code[64];
                long st = post(gww.port, chat ? "/v1/chat/completions" : "/v1/completions", b, code,
                               NULL, NULL);
                ck_assert_msg(st == 400 && !strcmp(code, "context_length_exceeded"),
                              "separators %d chat %d stream %d: HTTP %ld %s", sep, chat, stream, st,
                              code);
            }
}
END_TEST

/* ------------------------------------------------------------ fast path */

/* A pass-through completion takes the fast path (its bytes are forwarded as they came, from
 * the HTTP thread); the same request written with an escape in its prompt takes the ordinary
 * path (jansson, split, the job pool). Both answers are the same, and both are counted. */
START_TEST(pass_through_fast_and_ordinary_paths_agree)
{
    const char *fast_body = "{\"model\":\"m\",\"prompt\":\"Say hello there.\",\"max_tokens\":3,"
                            "\"vendor\":[1,\"x\"]}";
    const char *slow_body =
        "{\"model\":\"m\",\"prompt\":\"Say hello\\u0020there.\",\"max_tokens\":3,"
        "\"vendor\":[1,\"x\"]}";
    double before = th_metric(gwb.port, "chunkgate_passthrough_total");
    double fast0 = th_metric(gwb.port, "chunkgate_fast_path_total");
    json_t *ans[2];
    for (int i = 0; i < 2; i++) {
        th_resp r;
        const char *rid[] = {"X-Request-Id: same-id", NULL};
        th_http(&r, gwb.port, "POST", "/v1/completions", i ? slow_body : fast_body, NULL, rid);
        ck_assert_int_eq(r.status, 200);
        ans[i] = th_json(&r);
        th_resp_free(&r);
        ck_assert_double_eq(th_metric(gwb.port, "chunkgate_fast_path_total"), fast0 + 1);
    }
    char *a = json_dumps(ans[0], JSON_SORT_KEYS), *b = json_dumps(ans[1], JSON_SORT_KEYS);
    ck_assert_msg(!strcmp(a, b), "fast: %s\nordinary: %s", a, b);
    free(a);
    free(b);
    json_decref(ans[0]);
    json_decref(ans[1]);
    ck_assert_double_eq(th_metric(gwb.port, "chunkgate_passthrough_total"), before + 2);
}
END_TEST

/* Every field only the gateway reads (the field table's) sends a pass-through the ordinary way:
 * checked there (a bad value is a 400), and never forwarded to --backend. */
START_TEST(gateway_fields_leave_the_fast_path)
{
    double fast0 = th_metric(gwb.port, "chunkgate_fast_path_total");
    th_resp r;
    th_http(&r, gwb.port, "POST", "/v1/completions",
            "{\"model\":\"m\",\"prompt\":\"Hello there.\",\"recompute_ratio\":5}", NULL, NULL);
    th_assert_error(&r, 400, "invalid_value", "recompute_ratio");
    th_resp_free(&r);
    json_t *ans;
    json_t *b = json_pack("{s:s, s:s, s:b, s:f}", "model", "m", "prompt", "Hello there.",
                          "quality_probe", 0, "recompute_ratio", 0.5);
    ck_assert_int_eq(post(gwb.port, "/v1/completions", b, NULL, NULL, &ans), 200);
    json_t *fields = json_object_get(json_object_get(ans, "fake"), "fields");
    size_t k;
    json_t *f;
    json_array_foreach(fields, k, f)
    {
        ck_assert_str_ne(json_string_value(f), "quality_probe");
        ck_assert_str_ne(json_string_value(f), "recompute_ratio");
    }
    json_decref(ans);
    ck_assert_double_eq(th_metric(gwb.port, "chunkgate_fast_path_total"), fast0);
}
END_TEST

/* A --backend that is a chunkgate worker answers with a chunk_cache of its own, which the
 * gateway merges into its own: on the fast path that one is shared by every pass-through
 * request, so the merge must not leak into the next answer. */
START_TEST(backend_chunk_cache_stays_with_its_request)
{
    const char *with = "{\"model\":\"m\",\"prompt\":\"FAULT:WORKERCC here\",\"max_tokens\":2}";
    const char *without = "{\"model\":\"m\",\"prompt\":\"plain here\",\"max_tokens\":2}";
    double fast0 = th_metric(gwb.port, "chunkgate_fast_path_total");
    for (int i = 0; i < 3; i++) {
        th_resp r;
        th_http(&r, gwb.port, "POST", "/v1/completions", i == 1 ? with : without, NULL, NULL);
        ck_assert_int_eq(r.status, 200);
        json_t *j = th_json(&r), *cc = json_object_get(j, "chunk_cache");
        ck_assert(json_is_object(cc));
        json_t *rt = json_object_get(cc, "recomputed_tokens"), *q = json_object_get(cc, "quality");
        if (i == 1) {
            ck_assert_int_eq(json_integer_value(rt), 7);
            ck_assert(json_is_object(q));
        } else {
            ck_assert_msg(json_is_null(rt) && !q, "request %d: %.*s", i, (int)r.body.len,
                          r.body.data);
        }
        json_decref(j);
        th_resp_free(&r);
    }
    ck_assert_double_eq(th_metric(gwb.port, "chunkgate_fast_path_total"), fast0 + 3);
}
END_TEST

/* ------------------------------------------------------------ fallback */

/* Worker A holds the request's chunks but fails its assemble (its one assembly slot is held);
 * worker B holds the document chunk too, from a request under another system prompt. The
 * gateway assembles on B: chunk_cache names B and its hit, and it adds up to
 * usage.prompt_tokens_details.cached_tokens. B holds less than A, so A stays the first choice
 * whenever the index learns of B's chunk (a health check that times out on a slow build makes
 * the gateway resync B's inventory); were they equal, the route would be a coin toss. */
START_TEST(fallback_chunk_cache_agrees_with_cached_tokens)
{
    /* Routing by cached tokens alone: a health check that lands while A computes the held
     * assembly below reads A's load as 1, and at the default penalty (256 tokens a request)
     * that outweighs A's 88 cached tokens, so the gateway went to B with no fallback */
    const char *ex[] = {"--worker",
                        ua,
                        "--health-interval-ms",
                        "200",
                        "--sync-interval-ms",
                        "0",
                        "--load-penalty-tokens",
                        "0",
                        NULL};
    th_proc g;
    if (th_start_gateway(&g, CHUNKGATE_BIN, "gfallback", ex) != 0) th_die("gateway", &g);
    ck_assert(th_wait_worker(g.port, NULL, ua, 1));
    const char *prompt = "Fallback system prompt. # # Fallback document: the ferry leaves at "
                         "nine and returns at five. # # When does the ferry leave?";
    json_t *req = json_pack("{s:s, s:s, s:i, s:f}", "model", MODEL, "prompt", prompt, "max_tokens",
                            2, "temperature", 0.0);
    /* A holds the chunks, through this gateway (A alone): the index knows */
    th_resp r;
    const char *ct[] = {"Content-Type: application/json", NULL};
    json_t *ans;
    ck_assert_int_eq(post(g.port, "/v1/completions", json_incref(req), NULL, NULL, &ans), 200);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(ans, "chunk_cache"), "worker")), ua);
    json_decref(ans);
    /* B joins; it is synced as it appears, holding nothing yet */
    char body[160];
    snprintf(body, sizeof body, "{\"url\":\"%s\"}", ub);
    th_http(&r, g.port, "POST", "/v1/workers", body, NULL, ct);
    ck_assert_msg(r.status == 200 || r.status == 201, "adding B: HTTP %ld %.*s", r.status,
                  (int)r.body.len, r.body.data);
    th_resp_free(&r);
    ck_assert(th_wait_worker(g.port, NULL, ub, 1));
    /* B holds the document, from a request of its own under another system prompt */
    json_t *direct = json_deep_copy(req);
    json_object_set_new(direct, "chunk_separator", json_string("# #"));
    json_object_set_new(direct, "prompt",
                        json_string("Another system prompt. # # Fallback document: the ferry "
                                    "leaves at nine and returns at five. # # When?"));
    ck_assert_int_eq(post(wb.port, "/v1/completions", direct, NULL, NULL, NULL), 200);
    /* A's one assembly slot is taken: its assemble answers 503 */
    th_http(&r, wa.port, "POST", "/v1/assemble",
            "{\"segments\":[{\"role\":\"system\",\"text\":\"held\"},{\"role\":\"question\","
            "\"text\":\"q\"}]}",
            NULL, ct);
    ck_assert_int_eq(r.status, 200);
    json_t *held = th_json(&r);
    th_resp_free(&r);
    ck_assert_int_eq(post(g.port, "/v1/completions", json_incref(req), NULL, NULL, &ans), 200);
    json_t *cc = json_object_get(ans, "chunk_cache");
    long long cached = json_integer_value(json_object_get(
        json_object_get(json_object_get(ans, "usage"), "prompt_tokens_details"), "cached_tokens"));
    long long hit_tokens = 0;
    int hits = 0;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(cc, "segments"), i, s)
    {
        if (!json_is_true(json_object_get(s, "hit"))) continue;
        hits++;
        hit_tokens += json_integer_value(json_object_get(s, "tokens"));
    }
    const char *worker = json_string_value(json_object_get(cc, "worker"));
    fprintf(stderr,
            "fallback: worker %s (A %s, B %s), fallback %d, %d hits, %lld hit tokens, "
            "cached_tokens %lld\n",
            worker ? worker : "null", ua, ub, json_is_true(json_object_get(cc, "fallback")), hits,
            hit_tokens, cached);
    char *ccs = json_dumps(cc, JSON_COMPACT);
    ck_assert_msg(json_is_true(json_object_get(cc, "fallback")), "no fallback: %s", ccs);
    free(ccs);
    ck_assert_str_eq(json_string_value(json_object_get(cc, "fallback_reason")), "worker_error");
    ck_assert_msg(hits == 1, "B reused %d chunks; it holds the document only", hits);
    ck_assert_msg(cached > 0, "B reused nothing");
    ck_assert_int_eq(hit_tokens, cached);
    ck_assert_msg(worker && !strcmp(worker, ub), "answered by %s", worker ? worker : "null");
    json_decref(ans);
    char path[96];
    snprintf(path, sizeof path, "/v1/assemblies/%s",
             json_string_value(json_object_get(held, "assembly_id")));
    th_http(&r, wa.port, "DELETE", path, NULL, NULL, NULL);
    th_resp_free(&r);
    json_decref(held);
    json_decref(req);
    th_stop_clean(&g, "chunkgate (fallback)");
}
END_TEST

int main(void)
{
    return th_run_suite(
        "conformance", "conformance", 120, (th_fixture){setup, teardown, 0}, CK_FORK_GETENV,
        TH_TESTS(message_without_content, stream_usage_only_when_asked_final_chunk,
                 chat_parameters_refused_by_name, unknown_fields_rule,
                 context_length_exceeded_on_every_path, pass_through_fast_and_ordinary_paths_agree,
                 backend_chunk_cache_stays_with_its_request, gateway_fields_leave_the_fast_path,
                 fallback_chunk_cache_agrees_with_cached_tokens));
}
