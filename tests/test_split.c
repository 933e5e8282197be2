/* Check suite for cache/split: separators, trimming, roles, limits, UTF-8, and a randomized
 * differential test against a naive reference splitter and a naive UTF-8 decoder. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
/* Included, not only linked, to reach the static scalar validator that the vector path is
 * checked against (STYLE: tests reach static functions by including the .c file). */
#include "cache/split.c"
#include "tests/fuzz/fuzz_common.h" /* fuzz_utf8_naive: the reference UTF-8 decoder */
#include "tests/harness/harness.h"

/* ---- helpers ---- */

/* Check records every passing ck_assert through a pipe to the parent; in loops of millions of
 * checks that dominates the run time, so hot loops use this one, which only reports failures. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

static cg_split_params params_sep(const char *sep)
{
    cg_split_params p = cg_split_default_params();
    p.separator = sep;
    return p;
}

/* Splits text with p and checks status OK, passthrough flag, empties and the segment strings. */
static void expect_split(const char *text, const cg_split_params *p, int passthrough,
                         size_t empties, const char *const *want, size_t n_want)
{
    cg_split_result r = {0};
    cg_status st = cg_split_prompt(text, strlen(text), p, &r);
    ck_assert_msg(st == CG_OK, "status %s for \"%s\"", cg_status_name(st), text);
    ck_assert_int_eq(r.passthrough, passthrough);
    ck_assert_uint_eq(r.empty_skipped, empties);
    ck_assert_uint_eq(r.n, n_want);
    for (size_t i = 0; i < n_want; i++) {
        ck_assert_uint_eq(r.segs[i].len, strlen(want[i]));
        ck_assert_msg(memcmp(text + r.segs[i].off, want[i], r.segs[i].len) == 0,
                      "segment %zu is \"%.*s\", want \"%s\"", i, (int)r.segs[i].len,
                      text + r.segs[i].off, want[i]);
        cg_role role = i == 0 ? CG_ROLE_SYSTEM : i + 1 == n_want ? CG_ROLE_QUESTION : CG_ROLE_CHUNK;
        ck_assert_int_eq(r.segs[i].role, role);
    }
    cg_split_result_free(&r);
}

static cg_status split_status(const char *text, size_t len, const cg_split_params *p)
{
    cg_split_result r = {0};
    cg_status st = cg_split_prompt(text, len, p, &r);
    if (st != CG_OK) ck_assert_uint_eq(r.n, 0); /* failures leave an empty result */
    cg_split_result_free(&r);
    return st;
}

/* ---- fixed cases ---- */

START_TEST(test_default_separator)
{
    cg_split_params p = cg_split_default_params();
    ck_assert_str_eq(p.separator, "# #");
    ck_assert_uint_eq(p.max_segments, 256);
    ck_assert_uint_eq(p.max_segment_bytes, 0);
    ck_assert_int_eq(p.check_utf8, 1);
    const char *want[] = {"You are a careful assistant.", "<doc A>", "<doc B>",
                          "What changed in 2024?"};
    expect_split("You are a careful assistant. # # <doc A> # # <doc B> # # What changed in 2024?",
                 &p, 0, 0, want, 4);
    /* NULL params mean the defaults. */
    expect_split("You are a careful assistant. # # <doc A> # # <doc B> # # What changed in 2024?",
                 NULL, 0, 0, want, 4);
}
END_TEST

START_TEST(test_two_segments)
{
    const char *want[] = {"sys", "question?"};
    expect_split("sys # # question?", NULL, 0, 0, want, 2);
    /* No whitespace needed around the separator. */
    expect_split("sys# #question?", NULL, 0, 0, want, 2);
}
END_TEST

START_TEST(test_custom_separator)
{
    cg_split_params p = params_sep("<<DOC>>");
    const char *want[] = {"s", "d1 # # still d1", "q"};
    expect_split("s <<DOC>> d1 # # still d1 <<DOC>>q", &p, 0, 0, want, 3);
    /* A near miss of the separator is text. */
    const char *want2[] = {"a <<DOC> b", "c"};
    expect_split("a <<DOC> b<<DOC>>c", &p, 0, 0, want2, 2);
    /* The default separator is then ordinary text: no "<<DOC>>" means passthrough. */
    expect_split("a # # b", &p, 1, 0, NULL, 0);
    /* One-byte separator. */
    cg_split_params bar = params_sep("|");
    const char *want3[] = {"a", "b", "c"};
    expect_split("a|b||c", &bar, 0, 1, want3, 3);
}
END_TEST

START_TEST(test_long_separator)
{
    /* Longer than 32 bytes: the memmem path. */
    const char *sep = "-----8<----- cut here -----8<-----";
    ck_assert_uint_gt(strlen(sep), 32);
    cg_split_params p = params_sep(sep);
    char text[256];
    snprintf(text, sizeof text, "sys %s -----8<----- doc %s q", sep, sep);
    const char *want[] = {"sys", "-----8<----- doc", "q"};
    expect_split(text, &p, 0, 0, want, 3);
}
END_TEST

START_TEST(test_self_overlapping_separator)
{
    /* Leftmost, non-overlapping matches, like str.split: "aaa" is "aa" + "a". */
    cg_split_params p = params_sep("aa");
    const char *want[] = {"x", "ay", "z"};
    expect_split("xaaayaaz", &p, 0, 0, want, 3);
}
END_TEST

START_TEST(test_separator_at_edges)
{
    const char *want[] = {"sys", "q"};
    expect_split("# # sys # # q", NULL, 0, 1, want, 2);
    expect_split("sys # # q # #", NULL, 0, 1, want, 2);
    expect_split("# # sys # # q # #", NULL, 0, 2, want, 2);
    expect_split("# #sys# #q# #", NULL, 0, 2, want, 2);
}
END_TEST

START_TEST(test_consecutive_separators)
{
    const char *want[] = {"sys", "doc", "q"};
    expect_split("sys # # # # doc # #   \n\t # # q", NULL, 0, 2, want, 3);
    expect_split("sys # ## #doc# ## #q", NULL, 0, 2, want, 3);
}
END_TEST

START_TEST(test_trimming)
{
    /* the question keeps its trailing whitespace: the model continues from it */
    const char *want[] = {"s y s", "d\n\noc", "q \n"};
    expect_split(" \t\r\n\v\f s y s \f\v\n\r\t # # \n d\n\noc \n # # q \n", NULL, 0, 0, want, 3);
    /* Non-ASCII whitespace (U+00A0 NO-BREAK SPACE) is not trimmed. */
    const char *want2[] = {"\xC2\xA0sys", "q"};
    expect_split(" \xC2\xA0sys # # q", NULL, 0, 0, want2, 2);
    /* Offsets point into the text. */
    cg_split_result r = {0};
    const char *t = "  abc # #  de ";
    ck_assert_int_eq(cg_split_prompt(t, strlen(t), NULL, &r), CG_OK);
    ck_assert_uint_eq(r.segs[0].off, 2);
    ck_assert_uint_eq(r.segs[0].len, 3);
    ck_assert_uint_eq(r.segs[1].off, 11);
    ck_assert_uint_eq(r.segs[1].len, 3);
    /* trailing whitespace alone after the last separator is an empty segment */
    ck_assert_int_eq(cg_split_prompt("a # # b # #  \n", 14, NULL, &r), CG_OK);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_uint_eq(r.segs[1].len, 1);
    ck_assert_uint_eq(r.empty_skipped, 1);
    cg_split_result_free(&r);
}
END_TEST

START_TEST(test_roles_n_segments)
{
    char text[4096] = "";
    const char *want[40];
    char names[40][8];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "s%d", i);
        want[i] = names[i];
        if (i) strcat(text, " # # ");
        strcat(text, names[i]);
    }
    expect_split(text, NULL, 0, 0, want, 40);
    ck_assert_str_eq(cg_role_name(CG_ROLE_SYSTEM), "system");
    ck_assert_str_eq(cg_role_name(CG_ROLE_CHUNK), "chunk");
    ck_assert_str_eq(cg_role_name(CG_ROLE_QUESTION), "question");
}
END_TEST

START_TEST(test_passthrough)
{
    /* No separator; or one, but fewer than two non-empty segments: nothing counted. */
    static const char *const plain[] = {
        "Just a plain prompt with # hashes ## and #  # near misses.",
        "",
        "# # hello",
        "hello # #   # #",
        "# #",
        "  # #  # # ",
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(plain); i++)
        expect_split(plain[i], NULL, 1, 0, NULL, 0);
}
END_TEST

START_TEST(test_result_reuse)
{
    cg_split_result r = {0};
    const char *a = "a # # b # # c # # d";
    const char *b = "x # #";
    ck_assert_int_eq(cg_split_prompt(a, strlen(a), NULL, &r), CG_OK);
    ck_assert_uint_eq(r.n, 4);
    ck_assert_int_eq(cg_split_prompt(b, strlen(b), NULL, &r), CG_OK);
    ck_assert_uint_eq(r.n, 0);
    ck_assert_int_eq(r.passthrough, 1);
    ck_assert_uint_eq(r.empty_skipped, 0);
    ck_assert_int_eq(cg_split_prompt(a, strlen(a), NULL, &r), CG_OK);
    ck_assert_uint_eq(r.n, 4);
    ck_assert_int_eq(r.passthrough, 0);
    cg_split_result_free(&r);
    ck_assert_ptr_null(r.segs);
    cg_split_result_free(&r); /* idempotent */
}
END_TEST

START_TEST(test_bad_separator)
{
    cg_split_params p = params_sep("");
    ck_assert_int_eq(split_status("a # # b", 7, &p), CG_E_VALUE);
    p.separator = NULL;
    ck_assert_int_eq(split_status("a # # b", 7, &p), CG_E_VALUE);
}
END_TEST

/* Builds "s0 # # s1 # # ... " with n non-empty segments and some empty ones between. */
static char *make_segments(size_t n, size_t n_empty)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    for (size_t i = 0; i < n; i++) {
        if (i) ck_assert_int_eq(cg_buf_append(&b, " # # ", 5), CG_OK);
        ck_assert_int_eq(cg_buf_printf(&b, "seg%zu", i), CG_OK);
        if (i < n_empty) ck_assert_int_eq(cg_buf_append(&b, " # #  ", 6), CG_OK);
    }
    return b.data;
}

START_TEST(test_segment_limit)
{
    cg_split_params p = cg_split_default_params();
    char *at = make_segments(256, 10);
    char *over = make_segments(257, 0);
    cg_split_result r = {0};
    ck_assert_int_eq(cg_split_prompt(at, strlen(at), &p, &r), CG_OK);
    ck_assert_uint_eq(r.n, 256);
    ck_assert_uint_eq(r.empty_skipped, 10); /* empties do not count toward the limit */
    ck_assert_int_eq(r.segs[255].role, CG_ROLE_QUESTION);
    ck_assert_int_eq(cg_split_prompt(over, strlen(over), &p, &r), CG_E_SEGMENTS);
    ck_assert_uint_eq(r.n, 0);
    ck_assert_int_eq(r.passthrough, 0);
    /* A smaller configured limit, at and one past it. */
    p.max_segments = 3;
    ck_assert_int_eq(split_status("a # # b # # c", 13, &p), CG_OK);
    ck_assert_int_eq(split_status("a # # b # # c # # d", 19, &p), CG_E_SEGMENTS);
    /* 0 = no limit. */
    p.max_segments = 0;
    ck_assert_int_eq(cg_split_prompt(over, strlen(over), &p, &r), CG_OK);
    ck_assert_uint_eq(r.n, 257);
    cg_split_result_free(&r);
    free(at);
    free(over);
}
END_TEST

START_TEST(test_segment_size_limit)
{
    cg_split_params p = cg_split_default_params();
    p.max_segment_bytes = 5;
    ck_assert_int_eq(split_status("abcde # #  12345 # # q", 22, &p), CG_OK);
    ck_assert_int_eq(split_status("abcdef # # q", 12, &p), CG_E_SEGMENT_SIZE);
    ck_assert_int_eq(split_status("a # # q # # 123456", 18, &p), CG_E_SEGMENT_SIZE);
    /* The limit counts trimmed bytes. */
    ck_assert_int_eq(split_status("   abcde    # # q", 17, &p), CG_OK);
    /* Passthrough is never refused for its size. */
    ck_assert_int_eq(split_status("a long prompt without separator", 31, &p), CG_OK);
    ck_assert_int_eq(split_status("a long prompt # #", 17, &p), CG_OK);
}
END_TEST

/* ---- UTF-8 ---- */

static int valid(const char *s)
{
    return cg_utf8_valid(s, strlen(s));
}

START_TEST(test_utf8_cases)
{
    ck_assert(valid(""));
    ck_assert(valid("plain ascii"));
    ck_assert(valid("\xC2\x80"));         /* U+0080 */
    ck_assert(valid("\xDF\xBF"));         /* U+07FF */
    ck_assert(valid("\xE0\xA0\x80"));     /* U+0800 */
    ck_assert(valid("\xED\x9F\xBF"));     /* U+D7FF, last before surrogates */
    ck_assert(valid("\xEE\x80\x80"));     /* U+E000, first after surrogates */
    ck_assert(valid("\xEF\xBF\xBF"));     /* U+FFFF */
    ck_assert(valid("\xF0\x90\x80\x80")); /* U+10000 */
    ck_assert(valid("\xF4\x8F\xBF\xBF")); /* U+10FFFF */
    ck_assert(valid("Gr\xC3\xBC\xC3\x9F"
                    "e \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80"));
    /* Overlongs. */
    ck_assert(!valid("\xC0\xAF"));
    ck_assert(!valid("\xC1\xBF"));
    ck_assert(!valid("\xE0\x80\xAF"));
    ck_assert(!valid("\xE0\x9F\xBF"));
    ck_assert(!valid("\xF0\x80\x80\xAF"));
    ck_assert(!valid("\xF0\x8F\xBF\xBF"));
    /* Surrogates U+D800..U+DFFF. */
    ck_assert(!valid("\xED\xA0\x80"));
    ck_assert(!valid("\xED\xBF\xBF"));
    ck_assert(!valid("\xED\xA0\xBD\xED\xB8\x80")); /* CESU-8 pair */
    /* Above U+10FFFF. */
    ck_assert(!valid("\xF4\x90\x80\x80"));
    ck_assert(!valid("\xF5\x80\x80\x80"));
    ck_assert(!valid("\xFF"));
    ck_assert(!valid("\xFE"));
    /* Truncated sequences, at the end and before ASCII. */
    ck_assert(!valid("\xC3"));
    ck_assert(!valid("abc\xE4\xB8"));
    ck_assert(!valid("\xF0\x9F\x98"));
    ck_assert(!valid("\xE4\xB8x"));
    ck_assert(!valid("\xF0\x9F\x98 "));
    /* Lone continuation bytes. */
    ck_assert(!valid("\x80"));
    ck_assert(!valid("a\xBF"));
    ck_assert(!valid("\xC3\xBC\xBC"));
    /* NUL is valid UTF-8; the length is explicit. */
    ck_assert(cg_utf8_valid("a\0b", 3));
}
END_TEST

START_TEST(test_utf8_in_fast_path)
{
    /* Invalid bytes at every position of a long ASCII run exercise the word-at-a-time path. */
    char buf[200];
    for (size_t pos = 0; pos < 100; pos++) {
        memset(buf, 'a', sizeof buf);
        buf[pos] = (char)0x80;
        ck_assert_msg(!cg_utf8_valid(buf, sizeof buf), "pos %zu", pos);
        memcpy(buf + pos, "\xE2\x82\xAC", 3); /* euro sign: valid */
        ck_assert_msg(cg_utf8_valid(buf, sizeof buf), "pos %zu", pos);
        buf[pos + 2] = 'a'; /* truncate it */
        ck_assert_msg(!cg_utf8_valid(buf, sizeof buf), "pos %zu", pos);
        /* Truncated exactly at the end of the buffer. */
        ck_assert(!cg_utf8_valid(buf, pos + 2));
    }
}
END_TEST

START_TEST(test_split_rejects_invalid_utf8)
{
    const char *t = "sys # # doc \xED\xA0\x80 # # q";
    ck_assert_int_eq(split_status(t, strlen(t), NULL), CG_E_UTF8);
    /* Also without a separator: the whole text is checked. */
    ck_assert_int_eq(split_status("plain \xC0\xAF", 8, NULL), CG_E_UTF8);
    cg_split_params p = cg_split_default_params();
    p.check_utf8 = 0;
    ck_assert_int_eq(split_status(t, strlen(t), &p), CG_OK);
    /* Valid multibyte text splits normally. */
    const char *want[] = {"Systemé", "文書 # 一", "質問?"};
    expect_split("Systemé # # 文書 # 一 # #質問?", NULL, 0, 0, want, 3);
}
END_TEST

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    return th_xorshift64s(&rng_state);
}

/* Checks b[0..n) (n <= 4) against the reference, alone and embedded in ASCII at offsets that
 * cross the vector path's 16- and 64-byte block edges and its padded tail. */
static void check_placements(const unsigned char *b, size_t n)
{
    static const struct {
        size_t buf_len, off;
    } at[] = {{0, 0},   {80, 14}, {80, 62}, {64, 60}, {32, 30},
              {80, 77}, {20, 14}, {96, 63}, {64, 0}};
    int want = fuzz_utf8_naive(b, n);
    unsigned char buf[96];
    for (size_t k = 0; k < CG_ARRAY_LEN(at); k++) {
        size_t len = at[k].buf_len ? at[k].buf_len : n;
        size_t off = at[k].buf_len ? CG_MIN(at[k].off, len - n) : 0;
        memset(buf, 'a', len);
        memcpy(buf + off, b, n);
        CHECK(cg_utf8_valid((char *)buf, len) == want, "%02x %02x %02x %02x (n %zu) in %zu at %zu",
              b[0], n > 1 ? b[1] : 0, n > 2 ? b[2] : 0, n > 3 ? b[3] : 0, n, len, off);
        CHECK(utf8_valid_scalar(buf, len) == want, "scalar, n %zu in %zu at %zu", n, len, off);
    }
}

START_TEST(test_utf8_exhaustive_short)
{
    unsigned char b[4];
    for (unsigned x = 0; x < 256; x++) {
        b[0] = (unsigned char)x;
        check_placements(b, 1);
        for (unsigned y = 0; y < 256; y++) {
            b[1] = (unsigned char)y;
            check_placements(b, 2);
        }
    }
    /* Every 3-byte string starting with a 3-byte lead. */
    for (unsigned x = 0xE0; x <= 0xEF; x++)
        for (unsigned y = 0; y < 256; y++)
            for (unsigned z = 0; z < 256; z++) {
                b[0] = (unsigned char)x;
                b[1] = (unsigned char)y;
                b[2] = (unsigned char)z;
                check_placements(b, 3);
            }
    /* Every 4-byte lead and second byte, with continuation bytes around the edges. */
    static const unsigned char tails[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0, 0xFF};
    for (unsigned x = 0xF0; x <= 0xFF; x++)
        for (unsigned y = 0; y < 256; y++)
            for (size_t t1 = 0; t1 < sizeof tails; t1++)
                for (size_t t2 = 0; t2 < sizeof tails; t2++) {
                    b[0] = (unsigned char)x;
                    b[1] = (unsigned char)y;
                    b[2] = tails[t1];
                    b[3] = tails[t2];
                    check_placements(b, 4);
                }
}
END_TEST

START_TEST(test_utf8_long_random_text)
{
    /* Long valid texts of random code points of every length, then one corrupted byte. */
    static unsigned char buf[4096 + 4];
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = 0, target = rnd() % 4096;
        while (len < target) {
            uint32_t cp;
            switch (rnd() % 5) {
            case 0:
                cp = (uint32_t)(rnd() % 0x80);
                break;
            case 1:
                cp = 0x80 + (uint32_t)(rnd() % (0x800 - 0x80));
                break;
            case 2:
                cp = 0x800 + (uint32_t)(rnd() % (0x10000 - 0x800));
                break;
            case 3:
                cp = 0x10000 + (uint32_t)(rnd() % (0x110000 - 0x10000));
                break;
            default:
                cp = 'a';
                break;
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
            if (cp < 0x80) {
                buf[len++] = (unsigned char)cp;
            } else if (cp < 0x800) {
                buf[len++] = (unsigned char)(0xC0 | cp >> 6);
                buf[len++] = (unsigned char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                buf[len++] = (unsigned char)(0xE0 | cp >> 12);
                buf[len++] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
                buf[len++] = (unsigned char)(0x80 | (cp & 0x3F));
            } else {
                buf[len++] = (unsigned char)(0xF0 | cp >> 18);
                buf[len++] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
                buf[len++] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
                buf[len++] = (unsigned char)(0x80 | (cp & 0x3F));
            }
        }
        CHECK(fuzz_utf8_naive(buf, len), "generator, iter %d", iter);
        CHECK(cg_utf8_valid((char *)buf, len), "iter %d len %zu", iter, len);
        if (!len) continue;
        size_t at = rnd() % len;
        unsigned char saved = buf[at];
        buf[at] = (unsigned char)rnd();
        int want = fuzz_utf8_naive(buf, len);
        CHECK(cg_utf8_valid((char *)buf, len) == want, "iter %d len %zu at %zu", iter, len, at);
        CHECK(utf8_valid_scalar(buf, len) == want, "scalar, iter %d len %zu at %zu", iter, len, at);
        /* Cutting the text anywhere must agree too. */
        size_t cut = rnd() % (len + 1);
        buf[at] = saved;
        CHECK(cg_utf8_valid((char *)buf, cut) == fuzz_utf8_naive(buf, cut), "cut %zu", cut);
    }
}
END_TEST

START_TEST(test_utf8_random_differential)
{
    static const unsigned char edge[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF,
                                         0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE,
                                         0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
    unsigned char buf[128];
    int n_valid = 0;
    for (int iter = 0; iter < 200000; iter++) {
        size_t len = rnd() % sizeof buf;
        for (size_t i = 0; i < len; i++)
            buf[i] = 'a';
        /* A few edge bytes in an ASCII run, so both the fast path and the decoder are hit. */
        size_t k = rnd() % 6;
        for (size_t j = 0; j < k && len; j++) {
            size_t at = rnd() % len;
            size_t run = 1 + rnd() % 4;
            for (size_t r = 0; r < run && at + r < len; r++)
                buf[at + r] = edge[rnd() % sizeof edge];
        }
        int want = fuzz_utf8_naive(buf, len);
        n_valid += want;
        CHECK(cg_utf8_valid((char *)buf, len) == want, "iter %d", iter);
        CHECK(utf8_valid_scalar(buf, len) == want, "scalar, iter %d", iter);
    }
    /* Both outcomes must be well represented for the test to mean something. */
    ck_assert_int_gt(n_valid, 20000);
    ck_assert_int_lt(n_valid, 180000);
}
END_TEST

/* ---- large input ---- */

START_TEST(test_large_prompt)
{
    /* About 3.5 MB: 1000 documents of ~3.5 KB with some UTF-8 and stray '#'. */
    static const char line[] = "# heading \xC3\xA9 \xC3\xBCn \xE4\xB8\x96\xE7\x95\x8C text. ";
    const size_t line_len = sizeof line - 1;
    cg_buf b;
    cg_buf_init_unbounded(&b);
    ck_assert_int_eq(cg_buf_append(&b, "system prompt", 13), CG_OK);
    for (int d = 0; d < 1000; d++) {
        ck_assert_int_eq(cg_buf_append(&b, " # # ", 5), CG_OK);
        ck_assert_int_eq(cg_buf_printf(&b, "doc%d ", d), CG_OK);
        for (int k = 0; k < 100; k++)
            ck_assert_int_eq(cg_buf_append(&b, line, line_len), CG_OK);
    }
    ck_assert_int_eq(cg_buf_append(&b, " # # the question?", 18), CG_OK);
    ck_assert_uint_gt(b.len, 1u << 20);

    cg_split_result r = {0};
    ck_assert_int_eq(cg_split_prompt(b.data, b.len, NULL, &r), CG_E_SEGMENTS); /* 1002 > 256 */
    cg_split_params p = cg_split_default_params();
    p.max_segments = 2000;
    ck_assert_int_eq(cg_split_prompt(b.data, b.len, &p, &r), CG_OK);
    ck_assert_uint_eq(r.n, 1002);
    ck_assert_int_eq(memcmp(b.data + r.segs[0].off, "system prompt", 13), 0);
    ck_assert_uint_eq(r.segs[0].len, 13);
    for (int d = 0; d < 1000; d++) {
        char name[16];
        int nl = snprintf(name, sizeof name, "doc%d ", d);
        ck_assert_int_eq(memcmp(b.data + r.segs[d + 1].off, name, (size_t)nl), 0);
        ck_assert_uint_eq(r.segs[d + 1].len,
                          (size_t)nl + 100 * line_len - 1); /* last ' ' trimmed */
        ck_assert_int_eq(r.segs[d + 1].role, CG_ROLE_CHUNK);
    }
    ck_assert_int_eq(memcmp(b.data + r.segs[1001].off, "the question?", 13), 0);
    ck_assert_int_eq(r.segs[1001].role, CG_ROLE_QUESTION);
    /* One bad byte near the end of megabytes of text is found. */
    b.data[b.len - 3] = (char)0xFF;
    ck_assert_int_eq(cg_split_prompt(b.data, b.len, &p, &r), CG_E_UTF8);
    cg_split_result_free(&r);
    cg_buf_free(&b);
}
END_TEST

/* ---- randomized differential test against a naive splitter ---- */

typedef struct ref_seg {
    size_t off, len;
} ref_seg;

/* Naive reference: byte-by-byte comparison at every offset, then trimming. */
static cg_status ref_split(const char *t, size_t len, const char *sep, size_t max_segs,
                           size_t max_bytes, ref_seg *segs, size_t *n_out, size_t *empties,
                           int *passthrough)
{
    size_t sl = strlen(sep), start = 0, n = 0, e = 0;
    int found = 0;
    *n_out = *empties = 0;
    *passthrough = 0;
    for (size_t i = 0; i <= len; i++) {
        int match = 0;
        if (i + sl <= len) {
            match = 1;
            for (size_t k = 0; k < sl; k++)
                if (t[i + k] != sep[k]) match = 0;
        }
        if (!match && i < len) continue;
        if (match) found = 1;
        size_t a = start, b = i;
        while (a < b && strchr(" \t\n\r\v\f", t[a]) && t[a])
            a++;
        int last = !match, blank = 1;
        for (size_t k = a; k < b; k++)
            blank &= strchr(" \t\n\r\v\f", t[k]) && t[k];
        while ((!last || blank) && b > a && strchr(" \t\n\r\v\f", t[b - 1]) && t[b - 1])
            b--;
        if (a == b) {
            e++;
        } else {
            segs[n].off = a;
            segs[n].len = b - a;
            n++;
        }
        if (!match) break;
        start = i + sl;
        i = start - 1;
    }
    if (!found) {
        *passthrough = 1;
        return CG_OK;
    }
    if (max_segs && n > max_segs) return CG_E_SEGMENTS;
    if (n < 2) {
        *passthrough = 1;
        return CG_OK;
    }
    for (size_t k = 0; k < n; k++)
        if (max_bytes && segs[k].len > max_bytes) return CG_E_SEGMENT_SIZE;
    *n_out = n;
    *empties = e;
    return CG_OK;
}

START_TEST(test_random_differential)
{
    static const char *seps[] = {"# #", "#", "##", "<<DOC>>", "aa", " ", "\n---\n"};
    static const char *atoms[] = {"#", " ", "a", "\n", "\t", "b", "é", "##", "# ", " #"};
    char text[512];
    ref_seg want[520];
    size_t n_split = 0, n_pass = 0, n_err = 0;
    for (int iter = 0; iter < 100000; iter++) {
        const char *sep = seps[rnd() % CG_ARRAY_LEN(seps)];
        size_t len = 0, target = rnd() % 120;
        while (len < target) {
            const char *a = rnd() % 5 == 0 ? sep : atoms[rnd() % CG_ARRAY_LEN(atoms)];
            size_t al = strlen(a);
            if (len + al >= sizeof text) break;
            memcpy(text + len, a, al);
            len += al;
        }
        cg_split_params p = params_sep(sep);
        p.max_segments = rnd() % 4 == 0 ? 1 + rnd() % 8 : 0;
        p.max_segment_bytes = rnd() % 4 == 0 ? 1 + rnd() % 10 : 0;

        size_t wn, we;
        int wp;
        cg_status wst =
            ref_split(text, len, sep, p.max_segments, p.max_segment_bytes, want, &wn, &we, &wp);
        cg_split_result r = {0};
        cg_status st = cg_split_prompt(text, len, &p, &r);
        CHECK(st == wst, "iter %d: status %s want %s for \"%.*s\" sep \"%s\"", iter,
              cg_status_name(st), cg_status_name(wst), (int)len, text, sep);
        if (st == CG_OK) {
            CHECK(r.passthrough == wp && r.n == wn && r.empty_skipped == we,
                  "iter %d: passthrough %d/%d n %zu/%zu empties %zu/%zu", iter, r.passthrough, wp,
                  r.n, wn, r.empty_skipped, we);
            for (size_t k = 0; k < wn; k++) {
                CHECK(r.segs[k].off == want[k].off && r.segs[k].len == want[k].len,
                      "iter %d segment %zu: %zu+%zu want %zu+%zu", iter, k, r.segs[k].off,
                      r.segs[k].len, want[k].off, want[k].len);
                cg_role role = k == 0        ? CG_ROLE_SYSTEM
                               : k + 1 == wn ? CG_ROLE_QUESTION
                                             : CG_ROLE_CHUNK;
                CHECK(r.segs[k].role == role, "iter %d segment %zu role", iter, k);
            }
            if (wp)
                n_pass++;
            else
                n_split++;
        } else {
            n_err++;
        }
        cg_split_result_free(&r);
    }
    /* The generator must reach every outcome often. */
    ck_assert_uint_gt(n_split, 10000);
    ck_assert_uint_gt(n_pass, 5000);
    ck_assert_uint_gt(n_err, 5000);
}
END_TEST

int main(void)
{
    return th_run_tests("split", "core", 0,
                        TH_TESTS(test_default_separator, test_two_segments, test_custom_separator,
                                 test_long_separator, test_self_overlapping_separator,
                                 test_separator_at_edges, test_consecutive_separators,
                                 test_trimming, test_roles_n_segments, test_passthrough,
                                 test_result_reuse, test_bad_separator, test_segment_limit,
                                 test_segment_size_limit, test_utf8_cases, test_utf8_in_fast_path,
                                 test_split_rejects_invalid_utf8, test_utf8_exhaustive_short,
                                 test_utf8_random_differential, test_utf8_long_random_text,
                                 test_large_prompt, test_random_differential));
}
