/* The one UTF-8 decoder (base/utf8.h, on utf8proc_iterate): every scalar value round-trips
 * through utf8proc's encoder; the boundaries of Unicode Table 3-7 (overlongs, surrogates, above
 * U+10FFFF, stray continuation bytes, sequences cut short) decode as ill-formed; and
 * cg_utf8_is_prefix accepts exactly the proper prefixes of well-formed sequences, checked
 * against a table-driven reference over every string of up to three bytes. */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>
#include "tests/harness/harness.h"
#include "base/base.h"
#include "base/utf8.h"

START_TEST(every_scalar_value_round_trips)
{
    for (uint32_t c = 0; c <= 0x10FFFF; c++) {
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        unsigned char b[8];
        size_t n = (size_t)utf8proc_encode_char((utf8proc_int32_t)c, b);
        b[n] = 0x80; /* a continuation byte after it is not taken */
        uint32_t got = 0;
        size_t len = cg_utf8_decode(b, n + 1, &got);
        if (len != n || got != c) ck_abort_msg("U+%04X: %zu bytes, U+%04X", c, len, got);
        if (cg_utf8_is_prefix(b, n)) ck_abort_msg("U+%04X: whole sequence taken as a prefix", c);
        for (size_t k = 1; k < n; k++)
            if (!cg_utf8_is_prefix(b, k)) ck_abort_msg("U+%04X: %zu-byte start refused", c, k);
    }
}
END_TEST

START_TEST(ill_formed_sequences)
{
    static const struct {
        const char *s;
        size_t n;
    } bad[] = {
        {"\x80", 1},
        {"\xBF", 1},
        {"\xC0\x80", 2},
        {"\xC1\xBF", 2},
        {"\xE0\x80\x80", 3},
        {"\xE0\x9F\xBF", 3},
        {"\xED\xA0\x80", 3},
        {"\xED\xBF\xBF", 3},
        {"\xF0\x8F\xBF\xBF", 4},
        {"\xF4\x90\x80\x80", 4},
        {"\xF5\x80\x80\x80", 4},
        {"\xF8\x88\x80\x80\x80", 5},
        {"\xFF", 1},
        {"\xC3", 1},
        {"\xE2\x82", 2},
        {"\xF0\x9F\x98", 3},
        {"\xC3\x41", 2},
        {"\xE2\x82\x41", 3},
        {"\xF0\x9F\x98\x41", 4},
        {"\xE2\x82\xAC", 2}, /* cut short by n: the third byte is not read */
        {"", 0},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(bad); i++) {
        uint32_t cp = 0x55;
        ck_assert_msg(cg_utf8_decode(bad[i].s, bad[i].n, &cp) == 0, "case %zu decoded", i);
        ck_assert_uint_eq(cp, 0x55); /* left unchanged */
    }
    uint32_t cp;
    ck_assert_uint_eq(cg_utf8_decode("\0", 1, &cp), 1); /* NUL is a scalar value */
    ck_assert_uint_eq(cp, 0);
    ck_assert_uint_eq(cg_utf8_decode("\xE2\x82\xAC more", SIZE_MAX, &cp), 3); /* n: at least */
    ck_assert_uint_eq(cp, 0x20AC);
}
END_TEST

/* Table 3-7's allowed range of byte k (k >= 1) after lead c, or lo > hi when c is no lead. */
static void allowed(unsigned c, size_t k, unsigned *lo, unsigned *hi, size_t *len)
{
    *lo = 0x80, *hi = 0xBF, *len = 0;
    if (c >= 0xC2 && c <= 0xDF) *len = 2;
    if (c >= 0xE0 && c <= 0xEF) *len = 3;
    if (c >= 0xF0 && c <= 0xF4) *len = 4;
    if (!*len) *lo = 1, *hi = 0;
    if (k != 1) return;
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
}

START_TEST(prefixes_match_table_3_7)
{
    unsigned char b[3];
    size_t n_prefix = 0;
    for (unsigned x = 0; x < 1u << 24; x++) {
        b[0] = (unsigned char)(x >> 16), b[1] = (unsigned char)(x >> 8), b[2] = (unsigned char)x;
        for (size_t n = 1; n <= 3; n++) {
            if (n < 3 && (x & ((1u << (8 * (3 - n))) - 1))) continue; /* each string once */
            unsigned lo, hi;
            size_t len;
            allowed(b[0], 1, &lo, &hi, &len);
            int want = len > n;
            for (size_t k = 1; want && k < n; k++) {
                allowed(b[0], k, &lo, &hi, &len);
                want = b[k] >= lo && b[k] <= hi;
            }
            n_prefix += (size_t)want;
            if (cg_utf8_is_prefix(b, n) != want)
                ck_abort_msg("%02x %02x %02x (n %zu): want %d", b[0], b[1], b[2], n, want);
        }
    }
    /* 51 leads (C2..F4), their allowed second bytes, and third bytes after a four-byte start */
    ck_assert_uint_gt(n_prefix, 51);
    ck_assert(!cg_utf8_is_prefix("\xE2\x82", 0));
    ck_assert(!cg_utf8_is_prefix("\xF0\x9F\x98\x80", 4));
}
END_TEST

int main(void)
{
    return th_run_tests(
        "utf8", "core", 120,
        TH_TESTS(every_scalar_value_round_trips, ill_formed_sequences, prefixes_match_table_3_7));
}
