/* Fuzz target for the gateway's request decoding: the body bytes go through what the
 * completions, chat completions and chunk lookup routes do before any I/O, with the limits of
 * a default gateway configuration: cg_json_parse_object (what cg_http_req_json runs: the
 * value and depth limits, duplicate keys refused), checked against a plain jansson parse; the field
 * helpers (model, stream, max_tokens, max_completion_tokens, keys) and cg_gw_segment_request
 * (extension fields, prompt or messages + documents, split/chat rendering, keys); and the
 * chat <-> completions conversions (cg_gw_chat_as_completion of server/fields.c over
 * cache/chatreq.c's cg_chat_as_completion on the body, towards --backend and towards a worker;
 * cg_chat_answer_shape on the body taken as an upstream answer) and the field table's views
 * (cg_gw_worker_fields, cg_gw_check_chat_fields).
 * The HTTP plumbing (cg_http_req), forward_body() and the handlers themselves are static in
 * server/infer.c and server/admin.c and are not reached (see tests/README.md).
 * The pass-through fast path's scan (cg_gw_fast_scan) is checked against jansson: whatever it
 * accepts, jansson parses into exactly the members it reported, with the same values.
 * Invariants: no crash or leak; the limited parse accepts what jansson accepts unless it
 * refuses with CG_E_JSON_LIMIT (or a duplicate key), and then the text really is too deep or
 * too big by a naive count; every refusal is a 4xx status naming a field with a message;
 * a successful split has in-bounds, trimmed, non-empty segments with positional roles and
 * one key per cacheable segment, and decoding the same body again gives the same keys. */
#include "fuzz_common.h"

#include "base/base.h"
#include "cache/key.h"
#include "server/gateway.h"
#include "cache/chatreq.h"
#include "server/fastpath.h"
#include "server/fields.h"
#include "server/gwstate.h"
#include "server/segments.h"
#include "base/http.h"

static cg_gateway_config g_cfg;
static cg_gateway g_gw;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char prog[] = "chunkgate", err[256];
    char *args[] = {prog, NULL};
    int help = 0;
    cg_log_init("fuzz_json_request", (cg_log_level)(CG_LOG_ERROR + 1));
    /* The defaults of the real configuration table: separator, segment and body limits. */
    if (cg_gateway_config_load(&g_cfg, 1, args, &help, err, sizeof err) != CG_OK) {
        fprintf(stderr, "fuzz_json_request: default configuration: %s\n", err);
        abort();
    }
    g_gw.default_mode = (cg_mode)g_cfg.chunk_mode;
    g_gw.cfg = &g_cfg;
    return 0;
}

static void check_error(cg_status st, const char *param, const char *msg, size_t msglen)
{
    FUZZ_CHECK(st != CG_OK);
    int http = cg_status_http(st);
    FUZZ_CHECK(http >= 400 && http < 500); /* bad input is never a server error */
    FUZZ_CHECK(param && *param);
    FUZZ_CHECK(memchr(msg, '\0', msglen) != NULL);
}

/* Splits and keys body as route chat (0: completions) would, and checks the result. */
static void segment(json_t *body, const char *model, int chat)
{
    cg_gw_segments s, again;
    char msg[256], msg2[256];
    const char *param = NULL, *param2 = NULL;
    cg_gw_segments_init(&s);
    cg_gw_segments_init(&again);
    cg_status st = cg_gw_segment_request(&g_gw, body, model, chat, &s, &param, msg, sizeof msg);
    cg_status st2 =
        cg_gw_segment_request(&g_gw, body, model, chat, &again, &param2, msg2, sizeof msg2);
    FUZZ_CHECK(st == st2);
    if (st != CG_OK) {
        check_error(st, param, msg, sizeof msg);
        FUZZ_CHECK(param2 && !strcmp(param, param2) && !strcmp(msg, msg2));
        goto out;
    }
    FUZZ_CHECK(param == NULL && s.text != NULL);
    size_t text_len;
    if (chat) {
        text_len = s.rendered.len;
        FUZZ_CHECK(s.rendered.max == 0 || text_len <= s.rendered.max);
    } else {
        json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p)) p = json_array_get(p, 0);
        FUZZ_CHECK(json_is_string(p) && s.text == json_string_value(p));
        text_len = json_string_length(p);
    }
    if (s.split.passthrough) {
        FUZZ_CHECK(s.split.n == 0 && s.n_keys == 0);
        goto out;
    }
    FUZZ_CHECK(s.split.n >= 2 && s.split.n <= (size_t)g_cfg.max_segments);
    FUZZ_CHECK(s.n_keys == s.split.n - 1); /* every segment but the question */
    for (size_t i = 0; i < s.split.n; i++) {
        const cg_segment *g = &s.split.segs[i];
        FUZZ_CHECK(g->len > 0 && g->off <= text_len && g->len <= text_len - g->off);
        /* trimmed; the question keeps its trailing blanks (what the model continues from) */
        FUZZ_CHECK(!fuzz_is_space((uint8_t)s.text[g->off]));
        if (i + 1 < s.split.n) FUZZ_CHECK(!fuzz_is_space((uint8_t)s.text[g->off + g->len - 1]));
        cg_role want = i == 0               ? CG_ROLE_SYSTEM
                       : i + 1 == s.split.n ? CG_ROLE_QUESTION
                                            : CG_ROLE_CHUNK;
        FUZZ_CHECK(g->role == want);
    }
    for (size_t k = 0; k < s.n_keys; k++) {
        FUZZ_CHECK(s.key_seg[k] == k); /* system and chunks come before the question */
        FUZZ_CHECK(again.n_keys == s.n_keys && cg_key_equal(&s.keys[k], &again.keys[k]));
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key back;
        cg_key_hex(&s.keys[k], hex);
        FUZZ_CHECK(strlen(hex) == CG_KEY_HEX_LEN && cg_key_parse(hex, &back) == 0 &&
                   cg_key_equal(&back, &s.keys[k]));
    }
out:
    cg_gw_segments_free(&s);
    cg_gw_segments_free(&again);
}

/* POST /v1/completions and /v1/chat/completions: the checks of infer.c's handle(). */
static void completions(json_t *body, int chat)
{
    const char *model = NULL;
    int stream;
    long long ll;
    cg_status st = cg_json_get_string(body, "model", 1, &model);
    if (st != CG_OK) {
        FUZZ_CHECK(st == CG_E_MISSING || st == CG_E_TYPE);
        return;
    }
    FUZZ_CHECK(model != NULL);
    if (!*model) return;
    st = cg_json_get_bool(body, "stream", 0, &stream);
    FUZZ_CHECK(st == CG_OK || st == CG_E_TYPE);
    if (st != CG_OK) return;
    FUZZ_CHECK(stream == 0 || stream == 1);
    st = cg_json_get_int(body, "max_tokens", 0, 0, 1LL << 31, &ll);
    FUZZ_CHECK(st == CG_OK || st == CG_E_TYPE || st == CG_E_VALUE);
    if (st != CG_OK) return;
    FUZZ_CHECK(ll >= 0 && ll <= 1LL << 31);
    if (chat) {
        st = cg_json_get_int(body, "max_completion_tokens", 0, 0, 1LL << 31, &ll);
        if (st != CG_OK) return;
    }
    if (!chat && json_object_get(body, "documents")) return; /* refused by handle() */
    segment(body, model, chat);
}

/* POST /v1/chunks/lookup: keys[], or a request to split (admin.c). */
static void lookup(json_t *body)
{
    json_t *jk = json_object_get(body, "keys");
    if (jk && !json_is_null(jk)) {
        if (!json_is_array(jk)) return;
        size_t i;
        json_t *v;
        json_array_foreach(jk, i, v)
        {
            cg_key k;
            if (!json_is_string(v)) return;
            if (cg_key_parse(json_string_value(v), &k) != 0) return;
            char hex[CG_KEY_HEX_LEN + 1];
            cg_key_hex(&k, hex);
            /* a parsed key is 32 hex digits; the canonical form is lowercase */
            FUZZ_CHECK(strlen(json_string_value(v)) == CG_KEY_HEX_LEN);
            FUZZ_CHECK(strncasecmp(hex, json_string_value(v), CG_KEY_HEX_LEN) == 0);
        }
        return;
    }
    const char *model;
    if (cg_json_get_string(body, "model", 1, &model) != CG_OK || !*model) return;
    int chat = json_object_get(body, "messages") != NULL;
    if (!chat && !json_object_get(body, "prompt")) return;
    segment(body, model, chat);
}

/* The numeric helpers on every member, with the ranges the handlers use. */
static void helpers(json_t *body)
{
    const char *name;
    json_t *v;
    json_object_foreach(body, name, v)
    {
        long long ll;
        double d;
        int b;
        const char *s;
        json_t *o;
        cg_status st = cg_json_get_int(body, name, 7, -5, 1LL << 31, &ll);
        if (st == CG_OK) FUZZ_CHECK(ll >= -5 && ll <= 1LL << 31);
        if (st == CG_OK && !json_is_null(v)) FUZZ_CHECK(json_is_number(v));
        if (json_is_null(v)) FUZZ_CHECK(st == CG_OK && ll == 7);
        if (json_is_real(v)) {
            /* a real beyond long long is out of range, not undefined behaviour (http.c fix) */
            double r = json_real_value(v);
            if (r >= 9223372036854775808.0 || r < -9223372036854775808.0)
                FUZZ_CHECK(st == CG_E_VALUE);
            else if (r == (double)(long long)r && r >= -5 && r <= (double)(1LL << 31))
                FUZZ_CHECK(st == CG_OK && ll == (long long)r);
            else if (r != (double)(long long)r)
                FUZZ_CHECK(st == CG_E_TYPE);
        }
        st = cg_json_get_number(body, name, 0.5, 0.0, 2.0, &d);
        if (st == CG_OK) FUZZ_CHECK(d >= 0.0 && d <= 2.0);
        st = cg_json_get_bool(body, name, 1, &b);
        FUZZ_CHECK(st == (json_is_boolean(v) || json_is_null(v) ? CG_OK : CG_E_TYPE));
        st = cg_json_get_string(body, name, 1, &s);
        FUZZ_CHECK(st == (json_is_string(v) ? CG_OK : json_is_null(v) ? CG_E_MISSING : CG_E_TYPE));
        FUZZ_CHECK((st == CG_OK) == (s != NULL));
        st = cg_json_get(body, name, JSON_ARRAY, 0, &o);
        FUZZ_CHECK((st == CG_OK && o) == json_is_array(v));
    }
}

/* The chat <-> completions conversions of cache/chatreq.c: the body as a chat request
 * turned into a completions body, and as an upstream answer rewritten in chat shape. */
static void conversions(json_t *body, const uint8_t *data, size_t size)
{
    size_t plen = size < 64 ? size : 64;
    for (int to_worker = 0; to_worker <= 1; to_worker++) {
        json_t *c = cg_gw_chat_as_completion(body, (const char *)data, plen, to_worker);
        FUZZ_CHECK(json_is_object(c));
        json_t *p = json_object_get(c, "prompt");
        /* jansson refuses invalid UTF-8, so the prompt may be absent, never wrong */
        if (p) FUZZ_CHECK(json_is_string(p) && json_string_length(p) == plen);
        /* nothing of the gateway's, nothing chat-only; towards a worker, only known fields */
        const char *k;
        json_t *v;
        json_object_foreach(c, k, v)
        {
            /* what cg_chat_as_completion writes: the rendering, the limit, logprobs */
            if (!strcmp(k, "prompt") || !strcmp(k, "max_tokens") || !strcmp(k, "logprobs"))
                continue;
            cg_field_rule r = cg_gw_field_rule(k, 1);
            FUZZ_CHECK(r != CG_FIELD_GATEWAY && r != CG_FIELD_CHAT_ONLY && r != CG_FIELD_IGNORED &&
                       r != CG_FIELD_CONVERTED);
            if (to_worker) FUZZ_CHECK(r != CG_FIELD_UNKNOWN);
            /* an unknown chat field never lands on a completions field of the same name */
            if (r == CG_FIELD_UNKNOWN) FUZZ_CHECK(cg_gw_field_rule(k, 0) == CG_FIELD_UNKNOWN);
        }
        json_decref(c);
    }
    json_t *w = cg_gw_worker_fields(body);
    const char *k;
    json_t *v;
    json_object_foreach(w, k, v)
    {
        cg_field_rule r = cg_gw_field_rule(k, 0);
        FUZZ_CHECK(r == CG_FIELD_FORWARD || r == CG_FIELD_WORKER_REFUSES);
        FUZZ_CHECK(json_object_get(body, k) == v);
    }
    json_decref(w);
    const char *param = NULL;
    char msg[256];
    if (cg_gw_check_chat_fields(body, &param, msg, sizeof msg) != CG_OK)
        FUZZ_CHECK(param && cg_gw_field_rule(param, 1) == CG_FIELD_CHAT_ONLY && msg[0]);
    for (int mode = 0; mode < 3; mode++) {
        json_t *ans = json_deep_copy(body);
        FUZZ_CHECK(ans != NULL);
        int stream = mode > 0, first = mode == 1;
        cg_chat_answer_shape(ans, stream, first);
        FUZZ_CHECK(!strcmp(json_string_value(json_object_get(ans, "object")),
                           stream ? "chat.completion.chunk" : "chat.completion"));
        const char *id = json_string_value(json_object_get(ans, "id"));
        if (json_is_string(json_object_get(body, "id")))
            FUZZ_CHECK(id && !strncmp(id, "chatcmpl-", 9));
        size_t i;
        json_t *ch;
        json_array_foreach(json_object_get(ans, "choices"), i, ch)
        {
            if (!json_is_object(ch)) continue;
            FUZZ_CHECK(!json_object_get(ch, "text"));
            FUZZ_CHECK(json_is_object(json_object_get(ch, stream ? "delta" : "message")));
        }
        json_decref(ans);
    }
}

/* Naive counts of a parsed value: values + members, and nesting. */
static void naive_count(json_t *v, unsigned depth, size_t *values, unsigned *max_depth)
{
    (*values)++;
    if (json_is_array(v) || json_is_object(v)) {
        depth++;
        if (depth > *max_depth) *max_depth = depth;
    }
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v)) json_array_foreach(v, i, x) naive_count(x, depth, values, max_depth);
    if (json_is_object(v)) json_object_foreach(v, k, x) naive_count(x, depth, values, max_depth);
}

/* cg_gw_fast_scan against jansson: an accepted text is an object of exactly those members,
 * each with the value its raw text parses to (a string without escapes: its raw bytes). */
static void fast_scan(const uint8_t *data, size_t size, const cg_json_limits *lim)
{
    cg_fast_member m[16];
    size_t n;
    if (!cg_gw_fast_scan((const char *)data, size, lim, m, 16, &n)) return;
    json_error_t err;
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err);
    FUZZ_CHECK(json_is_object(o) && json_object_size(o) == n);
    FUZZ_CHECK(cg_json_check_limits((const char *)data, size, lim, NULL, 0) == CG_OK);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(m[i].key >= (const char *)data &&
                   m[i].key + m[i].key_len <= (const char *)data + size);
        char *k = fuzz_strndup(m[i].key, m[i].key_len);
        json_t *v = json_object_get(o, k);
        FUZZ_CHECK(v != NULL);
        json_t *raw = json_loadb(m[i].val, m[i].val_len, JSON_DECODE_ANY, &err);
        FUZZ_CHECK(raw && json_equal(raw, v));
        FUZZ_CHECK(m[i].type != 's' || json_is_string(v));
        FUZZ_CHECK(m[i].type != 'a' || json_is_array(v));
        if (m[i].type == 's' && !m[i].escaped)
            FUZZ_CHECK(json_string_length(v) == m[i].val_len - 2 &&
                       !memcmp(json_string_value(v), m[i].val + 1, m[i].val_len - 2));
        json_decref(raw);
        free(k);
    }
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t err;
    /* Bodies over the cap never reach the parser (the HTTP layer answers 413). */
    if (size > g_cfg.max_body_bytes) return 0;
    /* Small limits, so the fuzzer reaches them. */
    cg_json_limits lim = {.max_values = 8 + (size_t)(size % 64),
                          .max_depth = 2 + (unsigned)(size % 7)};
    cg_status lst;
    char lmsg[256];
    json_t *limited = cg_json_parse_object((const char *)data, size, &lim, &lst, lmsg, sizeof lmsg);
    json_t *body = json_loadb((const char *)data, size, 0, &err);
    if (limited) {
        FUZZ_CHECK(lst == CG_OK && body && json_is_object(body) && json_equal(limited, body));
        size_t values = 0;
        unsigned depth = 0;
        naive_count(limited, 0, &values, &depth);
        FUZZ_CHECK(depth <= lim.max_depth && values <= lim.max_values + 1);
    } else {
        FUZZ_CHECK(lst != CG_OK && lmsg[0] && cg_status_http(lst) == 400);
        json_t *strict =
            body ? json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err) : NULL;
        int no_dups = strict != NULL;
        json_decref(strict);
        /* (with duplicate keys the parsed object lost values the text still counts) */
        if (lst == CG_E_JSON_LIMIT && no_dups) {
            size_t values = 0;
            unsigned depth = 0;
            naive_count(body, 0, &values, &depth);
            /* refused for a reason: too deep, or more values (commas + containers) than allowed */
            FUZZ_CHECK(depth > lim.max_depth || values > lim.max_values / 2);
        }
        if (body && json_is_object(body) && lst != CG_E_JSON_LIMIT)
            FUZZ_CHECK(strstr(lmsg, "duplicate") != NULL); /* the only other difference */
    }
    json_decref(limited);
    fast_scan(data, size, &lim);
    if (!body) {
        FUZZ_CHECK(err.text[0] != '\0');
        return 0;
    }
    if (json_is_object(body)) {
        helpers(body);
        completions(body, 0);
        completions(body, 1);
        lookup(body);
        conversions(body, data, size);
    }
    json_decref(body);
    return 0;
}
