/* Check suite for cache/chat: the rendering rule of messages + documents into segments, on
 * fixed message shapes and on random conversations against a naive reference rendering. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/chat.h"
#include "cache/chatreq.h"
#include "cache/split.h"
#include "tests/harness/harness.h"

#define MSG(r, c)                                                                                  \
    {                                                                                              \
        r, c, sizeof(c) - 1                                                                        \
    }

/* Reports only failures: a passing ck_assert costs a pipe write, and the random test makes
 * hundreds of thousands of checks. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

typedef struct rendered {
    cg_status st;
    cg_buf text;
    cg_split_result segs;
} rendered;

static rendered render_docs(const cg_chat_msg *m, size_t n, const char *const *docs, size_t n_docs,
                            const cg_split_params *p)
{
    rendered r;
    size_t lens[512];
    ck_assert_uint_le(n_docs, 512);
    for (size_t i = 0; i < n_docs; i++)
        lens[i] = strlen(docs[i]);
    cg_buf_init_unbounded(&r.text);
    memset(&r.segs, 0, sizeof r.segs);
    r.st = cg_chat_render(m, n, docs, lens, n_docs, p, &r.text, &r.segs);
    return r;
}

static void rendered_free(rendered *r)
{
    cg_buf_free(&r->text);
    cg_split_result_free(&r->segs);
}

/* Checks an OK rendering: exact text, segment strings, positional roles, and that splitting
 * the text again gives the same segments. */
static void expect_rendered(const rendered *r, const cg_split_params *p, const char *text,
                            const char *const *want, size_t n_want, size_t empties)
{
    CHECK(r->st == CG_OK, "status %s", cg_status_name(r->st));
    CHECK(r->segs.passthrough == 0, "unexpected passthrough");
    CHECK(r->segs.empty_skipped == empties, "empty_skipped %zu want %zu", r->segs.empty_skipped,
          empties);
    CHECK(r->text.len == strlen(text) && memcmp(r->text.data, text, r->text.len) == 0,
          "text \"%s\" want \"%s\"", r->text.data, text);
    CHECK(r->segs.n == n_want, "%zu segments, want %zu", r->segs.n, n_want);
    for (size_t i = 0; i < n_want; i++) {
        const cg_segment *s = &r->segs.segs[i];
        CHECK(s->len == strlen(want[i]) && memcmp(r->text.data + s->off, want[i], s->len) == 0,
              "segment %zu \"%.*s\" want \"%s\"", i, (int)s->len, r->text.data + s->off, want[i]);
        cg_role role = i == 0 ? CG_ROLE_SYSTEM : i + 1 == n_want ? CG_ROLE_QUESTION : CG_ROLE_CHUNK;
        CHECK(s->role == role, "segment %zu role %s", i, cg_role_name(s->role));
    }
    cg_split_result again = {0};
    CHECK(cg_split_prompt(r->text.data, r->text.len, p, &again) == CG_OK, "re-split failed");
    CHECK(again.n == n_want, "re-split gives %zu segments, want %zu", again.n, n_want);
    for (size_t i = 0; i < n_want; i++)
        CHECK(again.segs[i].off == r->segs.segs[i].off &&
                  again.segs[i].len == r->segs.segs[i].len &&
                  again.segs[i].role == r->segs.segs[i].role,
              "re-split segment %zu differs", i);
    cg_split_result_free(&again);
}

/* render_docs, then expect_rendered of its result. */
static void expect_render(const cg_chat_msg *m, size_t n, const char *const *docs, size_t n_docs,
                          const cg_split_params *p, const char *text, const char *const *want,
                          size_t n_want, size_t empties)
{
    rendered r = render_docs(m, n, docs, n_docs, p);
    expect_rendered(&r, p, text, want, n_want, empties);
    rendered_free(&r);
}

static void expect_passthrough(const rendered *r)
{
    ck_assert_msg(r->st == CG_OK, "status %s", cg_status_name(r->st));
    ck_assert_int_eq(r->segs.passthrough, 1);
    ck_assert_uint_eq(r->segs.n, 0);
    ck_assert_uint_eq(r->text.len, 0);
}

START_TEST(test_system_and_user_with_separators)
{
    cg_chat_msg m[] = {MSG("system", "You are careful. # # Rules doc."),
                       MSG("user", "Doc A # # Doc B # # What changed?")};
    const char *want[] = {"You are careful.", "Rules doc.", "Doc A", "Doc B",
                          "user: What changed?\nassistant:"};
    /* The separator contains ' ', so segments are joined by "\n# #\n". */
    expect_render(m, 2, NULL, 0, NULL,
                  "You are careful.\n# #\nRules doc.\n# #\nDoc A\n# #\nDoc B\n# #\n"
                  "user: What changed?\nassistant:",
                  want, 5, 0);
}
END_TEST

START_TEST(test_documents_array)
{
    cg_chat_msg m[] = {MSG("system", "S"), MSG("user", "Q?")};
    const char *docs[] = {"  D1  ", " \n ", "D2 # # D3", "", "Learn C#"};
    /* Empty documents are skipped and counted; a document holding the separator is split. */
    const char *want[] = {"S", "D1", "D2", "D3", "Learn C#", "user: Q?\nassistant:"};
    expect_render(m, 2, docs, 5, NULL,
                  "S\n# #\nD1\n# #\nD2\n# #\nD3\n# #\nLearn C#\n# #\nuser: Q?\nassistant:", want, 6,
                  2);
}
END_TEST

START_TEST(test_documents_before_conversation_chunks)
{
    cg_chat_msg m[] = {MSG("user", "U1 # # q"), MSG("developer", "S # # SD")};
    const char *docs[] = {"D"};
    /* System parts (from any position), then documents, then conversation chunks. */
    const char *want[] = {"S", "SD", "D", "U1", "user: q\nassistant:"};
    expect_render(m, 2, docs, 1, NULL,
                  "S\n# #\nSD\n# #\nD\n# #\nU1\n# #\nuser: q\nassistant:", want, 5, 0);
}
END_TEST

START_TEST(test_multi_turn)
{
    cg_chat_msg m[] = {MSG("system", "S"),           MSG("user", "doc1 # # q1"),
                       {"assistant", NULL, 0},       MSG("tool", "result # # "),
                       MSG("assistant", "a1 # #a2"), MSG("user", "q2")};
    /* "result # # " has one non-empty part (its last), and one empty part, counted. The
     * assistant message without content gets a bare "assistant:" line. */
    const char *want[] = {
        "S", "doc1", "a1",
        "user: q1\nassistant:\ntool: result\nassistant: a2\nuser: q2\nassistant:"};
    expect_render(m, 6, NULL, 0, NULL,
                  "S\n# #\ndoc1\n# #\na1\n# #\n"
                  "user: q1\nassistant:\ntool: result\nassistant: a2\nuser: q2\nassistant:",
                  want, 4, 1);
}
END_TEST

START_TEST(test_no_system_message)
{
    /* Roles are positional: without a system message the first chunk takes position 0. */
    cg_chat_msg m[] = {MSG("user", "Q")};
    const char *docs[] = {"D1", "D2"};
    const char *want[] = {"D1", "D2", "user: Q\nassistant:"};
    expect_render(m, 1, docs, 2, NULL, "D1\n# #\nD2\n# #\nuser: Q\nassistant:", want, 3, 0);
}
END_TEST

START_TEST(test_no_conversation)
{
    cg_chat_msg m[] = {MSG("system", "S # # D")};
    const char *want[] = {"S", "D", "assistant:"};
    expect_render(m, 1, NULL, 0, NULL, "S\n# #\nD\n# #\nassistant:", want, 3, 0);
    const char *docs[] = {"only doc"};
    const char *want2[] = {"only doc", "assistant:"};
    expect_render(NULL, 0, docs, 1, NULL, "only doc\n# #\nassistant:", want2, 2, 0);
}
END_TEST

START_TEST(test_passthrough)
{
    cg_chat_msg m[] = {MSG("system", "S # no separator"), MSG("user", "plain question"),
                       MSG("assistant", "a"), MSG("user", "q2")};
    rendered r = render_docs(m, 4, NULL, 0, NULL);
    expect_passthrough(&r);
    rendered_free(&r);
    /* Documents all empty and no system message: only a question would remain. */
    const char *docs[] = {"   ", ""};
    r = render_docs(m + 1, 1, docs, 2, NULL);
    expect_passthrough(&r);
    ck_assert_uint_eq(r.segs.empty_skipped, 0);
    rendered_free(&r);
    /* No messages, no documents. */
    r = render_docs(NULL, 0, NULL, 0, NULL);
    expect_passthrough(&r);
    rendered_free(&r);
    /* A separator but only empty parts: only a question would remain. */
    cg_chat_msg only_sep[] = {MSG("user", " # # ")};
    r = render_docs(only_sep, 1, NULL, 0, NULL);
    expect_passthrough(&r);
    rendered_free(&r);
}
END_TEST

START_TEST(test_custom_separator)
{
    cg_split_params p = cg_split_default_params();
    p.separator = "<<DOC>>";
    cg_chat_msg m[] = {MSG("system", "S<<DOC>>D1"), MSG("user", "q # # still q")};
    const char *want[] = {"S", "D1", "user: q # # still q\nassistant:"};
    /* The separator has no ' ', so ' ' pads it. */
    expect_render(m, 2, NULL, 0, &p, "S <<DOC>> D1 <<DOC>> user: q # # still q\nassistant:", want,
                  3, 0);
}
END_TEST

/* Asserts that rendering m (n messages, docs) is refused with st and gives nothing. */
static void expect_refused(const cg_chat_msg *m, size_t n, const char *const *docs, size_t n_docs,
                           const cg_split_params *p, cg_status st)
{
    rendered r = render_docs(m, n, docs, n_docs, p);
    ck_assert_int_eq(r.st, st);
    ck_assert_uint_eq(r.text.len, 0);
    ck_assert_uint_eq(r.segs.n, 0);
    rendered_free(&r);
}

START_TEST(test_ambiguous_rendering_refused)
{
    /* A role name holding the separator would add a segment on re-split. */
    cg_chat_msg m[] = {MSG("system", "S # # D"), MSG("x # # y", "q")};
    expect_refused(m, 2, NULL, 0, NULL, CG_E_VALUE);
    /* A separator that forms across "<role>: " and the content. */
    cg_split_params p = cg_split_default_params();
    p.separator = ": #";
    cg_chat_msg m2[] = {MSG("system", "S : # D"), MSG("user", "#tag")};
    expect_refused(m2, 2, NULL, 0, &p, CG_E_VALUE);
}
END_TEST

START_TEST(test_invalid_utf8)
{
    cg_chat_msg bad_content[] = {MSG("system", "S # # D"), MSG("user", "q \xC0\xAF")};
    expect_refused(bad_content, 2, NULL, 0, NULL, CG_E_UTF8);
    /* Also when the request would pass through. */
    cg_chat_msg bad_plain[] = {MSG("user", "q \xED\xA0\x80")};
    expect_refused(bad_plain, 1, NULL, 0, NULL, CG_E_UTF8);
    cg_chat_msg ok[] = {MSG("user", "q")};
    const char *bad_doc[] = {"fine", "trunc \xE4\xB8"};
    expect_refused(ok, 1, bad_doc, 2, NULL, CG_E_UTF8);
    cg_chat_msg bad_role[] = {MSG("us\xFF"
                                  "er",
                                  "a # # q")};
    expect_refused(bad_role, 1, NULL, 0, NULL, CG_E_UTF8);
    /* Valid multibyte text renders. */
    cg_chat_msg utf[] = {MSG("system", "Système # # 文書"), MSG("user", "質問？")};
    const char *want[] = {"Système", "文書", "user: 質問？\nassistant:"};
    expect_render(utf, 2, NULL, 0, NULL, "Système\n# #\n文書\n# #\nuser: 質問？\nassistant:", want,
                  3, 0);
}
END_TEST

START_TEST(test_too_many_segments)
{
    cg_split_params p = cg_split_default_params();
    p.max_segments = 4;
    cg_chat_msg m[] = {MSG("system", "S"), MSG("user", "q")};
    const char *docs[] = {"D1", "D2", "D3"};
    /* S + 2 documents + question = 4: at the limit. */
    rendered r = render_docs(m, 2, docs, 2, &p);
    ck_assert_int_eq(r.st, CG_OK);
    ck_assert_uint_eq(r.segs.n, 4);
    rendered_free(&r);
    /* One more: refused, nothing left behind. */
    expect_refused(m, 2, docs, 3, &p, CG_E_SEGMENTS);
    /* The default limit of 256 counts every segment. */
    static char names[300][8];
    static const char *many[300];
    for (int i = 0; i < 300; i++) {
        snprintf(names[i], sizeof names[i], "d%d", i);
        many[i] = names[i];
    }
    r = render_docs(m, 2, many, 254, NULL);
    ck_assert_int_eq(r.st, CG_OK);
    ck_assert_uint_eq(r.segs.n, 256);
    rendered_free(&r);
    expect_refused(m, 2, many, 255, NULL, CG_E_SEGMENTS);
}
END_TEST

START_TEST(test_segment_size_and_buffer_cap)
{
    cg_split_params p = cg_split_default_params();
    /* Every segment counts, the question too: "user: q\nassistant:" is 18 bytes. */
    p.max_segment_bytes = 18;
    cg_chat_msg m[] = {MSG("system", "S # # 12345678"), MSG("user", "q")};
    rendered r = render_docs(m, 2, NULL, 0, &p);
    ck_assert_int_eq(r.st, CG_OK);
    rendered_free(&r);
    cg_chat_msg big[] = {MSG("system", "S # # 1234567890123456789"), MSG("user", "q")};
    expect_refused(big, 2, NULL, 0, &p, CG_E_SEGMENT_SIZE);
    p.max_segment_bytes = 17;
    expect_refused(m, 2, NULL, 0, &p, CG_E_SEGMENT_SIZE);

    /* text_out's cap. */
    size_t lens[1] = {0};
    cg_buf text;
    cg_buf_init(&text, 20);
    cg_split_result segs = {0};
    ck_assert_int_eq(cg_chat_render(m, 2, NULL, lens, 0, NULL, &text, &segs), CG_E_TOO_LARGE);
    ck_assert_uint_eq(text.len, 0);
    ck_assert_uint_eq(segs.n, 0);
    text.max = 64;
    ck_assert_int_eq(cg_chat_render(m, 2, NULL, lens, 0, NULL, &text, &segs), CG_OK);
    ck_assert_uint_eq(segs.n, 3);
    cg_buf_free(&text);
    cg_split_result_free(&segs);
}
END_TEST

START_TEST(test_bad_arguments)
{
    cg_buf text;
    cg_buf_init_unbounded(&text);
    cg_split_result segs = {0};
    cg_chat_msg m[] = {MSG("user", "a # # q")};
    cg_chat_msg no_role[] = {{NULL, "a # # q", 7}};
    cg_chat_msg empty_role[] = {{"", "a # # q", 7}};
    cg_chat_msg null_content[] = {{"user", NULL, 3}};
    cg_split_params p = cg_split_default_params();
    ck_assert_int_eq(cg_chat_render(no_role, 1, NULL, NULL, 0, NULL, &text, &segs), CG_E_VALUE);
    ck_assert_int_eq(cg_chat_render(empty_role, 1, NULL, NULL, 0, NULL, &text, &segs), CG_E_VALUE);
    ck_assert_int_eq(cg_chat_render(null_content, 1, NULL, NULL, 0, NULL, &text, &segs),
                     CG_E_VALUE);
    ck_assert_int_eq(cg_chat_render(NULL, 1, NULL, NULL, 0, NULL, &text, &segs), CG_E_VALUE);
    ck_assert_int_eq(cg_chat_render(m, 1, NULL, NULL, 2, NULL, &text, &segs), CG_E_VALUE);
    p.separator = "";
    ck_assert_int_eq(cg_chat_render(m, 1, NULL, NULL, 0, &p, &text, &segs), CG_E_VALUE);
    ck_assert_int_eq(cg_chat_render(m, 1, NULL, NULL, 0, NULL, &text, &segs), CG_OK);
    ck_assert_uint_eq(segs.n, 2);
    ck_assert(cg_chat_is_system_role("system"));
    ck_assert(cg_chat_is_system_role("developer"));
    ck_assert(!cg_chat_is_system_role("user"));
    ck_assert(!cg_chat_is_system_role("System"));
    ck_assert(!cg_chat_is_system_role(NULL));
    cg_buf_free(&text);
    cg_split_result_free(&segs);
}
END_TEST

/* ---- random conversations against a naive reference rendering ---- */

static uint64_t rng_state = 0xB7E151628AED2A6Bull;
static uint64_t rnd(void)
{
    return th_xorshift64s(&rng_state);
}

typedef struct strv {
    char *s[600];
    size_t n;
} strv;

static int ws(char c)
{
    return c && strchr(" \t\n\r\v\f", c) != NULL;
}

/* Naive split of s by sep into trimmed non-empty parts (appended to out as copies). Returns
 * the number of empty parts. */
static size_t naive_parts(const char *s, const char *sep, strv *out, int *had_sep)
{
    size_t len = strlen(s), sl = strlen(sep), start = 0, empties = 0;
    *had_sep = 0;
    for (size_t i = 0; i <= len; i++) {
        int match = i + sl <= len && strncmp(s + i, sep, sl) == 0;
        if (!match && i < len) continue;
        *had_sep |= match;
        size_t a = start, b = i;
        while (a < b && ws(s[a]))
            a++;
        while (b > a && ws(s[b - 1]))
            b--;
        if (a == b)
            empties++;
        else
            out->s[out->n++] = cg_strndup(s + a, b - a);
        if (!match) break;
        start = i + sl;
        i = start - 1;
    }
    return empties;
}

static void strv_free(strv *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->s[i]);
    v->n = 0;
}

START_TEST(test_random_conversations)
{
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool"};
    static const char *atoms[] = {"# #", "#", " ", "\n", "C#", "a", "bc", "é", "# ", " #", "##"};
    size_t n_rendered = 0, n_pass = 0;
    for (int iter = 0; iter < 20000; iter++) {
        char bufs[12][64];
        cg_chat_msg m[8];
        const char *docs[4];
        size_t n_msgs = rnd() % 6, n_docs = rnd() % 4 == 0 ? 1 + rnd() % 3 : 0;
        for (size_t i = 0; i < n_msgs + n_docs; i++) {
            size_t len = 0, target = rnd() % 40;
            while (len < target) {
                const char *a = atoms[rnd() % CG_ARRAY_LEN(atoms)];
                size_t al = strlen(a);
                if (len + al >= sizeof bufs[i]) break;
                memcpy(bufs[i] + len, a, al);
                len += al;
            }
            bufs[i][len] = '\0';
        }
        for (size_t i = 0; i < n_msgs; i++) {
            m[i].role = roles[rnd() % CG_ARRAY_LEN(roles)];
            m[i].content = bufs[i];
            m[i].content_len = strlen(bufs[i]);
        }
        for (size_t i = 0; i < n_docs; i++)
            docs[i] = bufs[n_msgs + i];

        /* The reference rendering, straight from the documented rule. */
        strv segs = {.n = 0};
        size_t empties = 0;
        int any_sep = 0, had;
        strv tmp = {.n = 0};
        for (size_t i = 0; i < n_msgs; i++) {
            size_t e = naive_parts(m[i].content, "# #", &tmp, &had);
            any_sep |= had;
            if (had) empties += e;
            if (cg_chat_is_system_role(m[i].role)) {
                for (size_t k = 0; k < tmp.n; k++)
                    segs.s[segs.n++] = cg_strdup(tmp.s[k]);
            }
            strv_free(&tmp);
        }
        for (size_t i = 0; i < n_docs; i++) {
            empties += naive_parts(docs[i], "# #", &tmp, &had);
            for (size_t k = 0; k < tmp.n; k++)
                segs.s[segs.n++] = cg_strdup(tmp.s[k]);
            strv_free(&tmp);
        }
        cg_buf q;
        cg_buf_init_unbounded(&q);
        for (size_t i = 0; i < n_msgs; i++) {
            if (cg_chat_is_system_role(m[i].role)) continue;
            naive_parts(m[i].content, "# #", &tmp, &had);
            for (size_t k = 0; k + 1 < tmp.n; k++)
                segs.s[segs.n++] = cg_strdup(tmp.s[k]);
            if (tmp.n)
                ck_assert_int_eq(cg_buf_printf(&q, "%s: %s\n", m[i].role, tmp.s[tmp.n - 1]), CG_OK);
            else
                ck_assert_int_eq(cg_buf_printf(&q, "%s:\n", m[i].role), CG_OK);
            strv_free(&tmp);
        }
        ck_assert_int_eq(cg_buf_append(&q, "assistant:", 10), CG_OK);
        segs.s[segs.n++] = cg_strdup(q.data);
        int want_pass = (!any_sep && n_docs == 0) || segs.n < 2;

        rendered r = render_docs(m, n_msgs, docs, n_docs, NULL);
        CHECK(r.st == CG_OK, "iter %d: %s", iter, cg_status_name(r.st));
        if (want_pass) {
            expect_passthrough(&r);
            n_pass++;
        } else {
            cg_buf joined;
            cg_buf_init_unbounded(&joined);
            for (size_t k = 0; k < segs.n; k++) {
                if (k) ck_assert_int_eq(cg_buf_append(&joined, "\n# #\n", 5), CG_OK);
                ck_assert_int_eq(cg_buf_append(&joined, segs.s[k], strlen(segs.s[k])), CG_OK);
            }
            expect_rendered(&r, NULL, joined.data, (const char *const *)segs.s, segs.n, empties);
            cg_buf_free(&joined);
            n_rendered++;
        }
        rendered_free(&r);
        cg_buf_free(&q);
        strv_free(&segs);
    }
    ck_assert_uint_gt(n_rendered, 5000);
    ck_assert_uint_gt(n_pass, 1000);
}
END_TEST

/* chat_template_kwargs become template variables: at most CG_CHAT_MAX_KWARGS (400) of them, so
 * one request cannot make a render cost what 80,000 did. */
START_TEST(test_kwargs_cap)
{
    cg_chat_model *m = NULL;
    char err[256];
    ck_assert_int_eq(cg_chat_model_new("{{ k0 }}{% for m in messages %}{{ m.content }}{% endfor %}",
                                       NULL, NULL, &m, err, sizeof err),
                     CG_OK);
    json_t *body = json_pack("{s:[{s:s,s:s}]}", "messages", "role", "user", "content", "hi");
    cg_chat_req r;
    const char *param = NULL;
    ck_assert_int_eq(cg_chat_req_parse(body, &r, &param, err, sizeof err), CG_OK);
    json_t *kw = json_object();
    char k[16];
    for (int i = 0; i < CG_CHAT_MAX_KWARGS; i++) {
        snprintf(k, sizeof k, "k%d", i);
        json_object_set_new(kw, k, json_string("x"));
    }
    cg_chat_render_opts o = {"# #", 1, kw};
    cg_buf out;
    cg_buf_init_unbounded(&out);
    ck_assert_int_eq(cg_chat_kwargs_check(kw, err, sizeof err), CG_OK);
    ck_assert_int_eq(cg_chat_model_render(m, &r, &o, &out, err, sizeof err), CG_OK);
    ck_assert_str_eq(out.data, "xhi");
    json_object_set_new(kw, "one_more", json_true());
    ck_assert_int_eq(cg_chat_kwargs_check(kw, err, sizeof err), CG_E_VALUE);
    ck_assert_str_eq(err, "chat_template_kwargs has 401 keys; at most 400 are accepted");
    err[0] = '\0';
    ck_assert_int_eq(cg_chat_model_render(m, &r, &o, &out, err, sizeof err), CG_E_VALUE);
    ck_assert_ptr_nonnull(strstr(err, "at most 400"));
    cg_buf_free(&out);
    json_decref(kw);
    cg_chat_req_free(&r);
    json_decref(body);
    cg_chat_model_unref(&m);
}
END_TEST

int main(void)
{
    return th_run_tests("chat", "core", 0,
                        TH_TESTS(test_system_and_user_with_separators, test_documents_array,
                                 test_documents_before_conversation_chunks, test_multi_turn,
                                 test_no_system_message, test_no_conversation, test_passthrough,
                                 test_custom_separator, test_ambiguous_rendering_refused,
                                 test_invalid_utf8, test_too_many_segments,
                                 test_segment_size_and_buffer_cap, test_bad_arguments,
                                 test_random_conversations, test_kwargs_cap));
}
