/* Check suite for cache/key: pinned XXH3-128 vectors of the canonical encoding, a one-shot
 * re-encoding check, the fields each key depends on, hex round trip and parsing. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/base.h"
#include "cache/key.h"
#include "tests/harness/harness.h"
#include "tests/key_vectors.h"

static cg_key key_of(const char *model, cg_mode mode, const char *salt, const cg_key *sys,
                     const char *text, size_t text_len)
{
    return cg_key_compute(model, strlen(model), mode, salt, salt ? strlen(salt) : 0, sys, text,
                          text_len);
}

static void hex_of(const cg_key *k, char *out)
{
    cg_key_hex(k, out);
}

/* The pinned XXH3-128 vectors (tests/key_vectors.h). */
START_TEST(test_pinned_vectors)
{
    size_t n;
    const key_vector *v = key_vectors(&n);
    for (size_t i = 0; i < n; i++) {
        cg_key k = key_of(v[i].model, v[i].mode, v[i].salt, v[i].sys, v[i].text, strlen(v[i].text));
        char hex[CG_KEY_HEX_LEN + 1];
        hex_of(&k, hex);
        ck_assert_msg(strcmp(hex, v[i].xxh) == 0, "vector %zu: %s want %s", i, hex, v[i].xxh);
    }
}
END_TEST

/* The encoding, built byte by byte in memory here, hashed in one shot. */
static size_t put(uint8_t *buf, size_t at, const void *p, size_t n)
{
    for (int i = 0; i < 8; i++)
        buf[at + i] = (uint8_t)((uint64_t)n >> (8 * i));
    if (n) memcpy(buf + at + 8, p, n);
    return at + 8 + n;
}

static cg_key oneshot(const char *model, size_t model_len, const char *mode, const char *salt,
                      size_t salt_len, const cg_key *sys, const char *text, size_t text_len)
{
    size_t cap = 6 * 8 + 16 + 16 + model_len + 8 + salt_len + text_len;
    uint8_t *buf = cg_malloc(cap);
    size_t n = 0;
    n = put(buf, n, "chunkgate-key-v1", 16);
    n = put(buf, n, model, model_len);
    n = put(buf, n, mode, strlen(mode));
    n = put(buf, n, salt, salt_len);
    n = put(buf, n, sys ? sys->b : NULL, sys ? 16 : 0);
    n = put(buf, n, text, text_len);
    ck_assert_uint_le(n, cap);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, n));
    cg_key k;
    memcpy(k.b, c.digest, 16);
    free(buf);
    return k;
}

START_TEST(test_worked_example_bytes)
{
    /* The worked example in the README: these 91 bytes, and their digest. */
    static const char want_hex[] = "1000000000000000"
                                   "6368756e6b676174652d6b65792d7631" /* "chunkgate-key-v1" */
                                   "0a00000000000000"
                                   "74696e792d6c6c616d61" /* "tiny-llama" */
                                   "0600000000000000"
                                   "737472696374"     /* "strict" */
                                   "0000000000000000" /* salt "" */
                                   "0000000000000000" /* no system key */
                                   "0b00000000000000"
                                   "68656c6c6f20776f726c64"; /* "hello world" */
    uint8_t enc[91];
    ck_assert_uint_eq(strlen(want_hex), 2 * sizeof enc);
    ck_assert_int_eq(cg_hex_decode(want_hex, sizeof enc, enc), 0);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(enc, sizeof enc));
    cg_key k = cg_key_compute("tiny-llama", 10, CG_MODE_STRICT, NULL, 0, NULL, "hello world", 11);
    ck_assert_mem_eq(k.b, c.digest, 16);
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(&k, hex);
    ck_assert_str_eq(hex, "3d66d47f0c6ab0ef02f5a9b0263224f5");
}
END_TEST

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    return th_xorshift64s(&rng_state);
}

static void fill(char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (char)(rnd() & 0xFF);
}

START_TEST(test_streaming_equals_oneshot)
{
    /* Lengths cross XXH3's internal thresholds (16, 128, 240 bytes, 1 KiB stripes, 64 KiB). */
    static const size_t lens[] = {0,   1,    15,   16,   17,   128,   129,  240,
                                  241, 1023, 1024, 1025, 4096, 65536, 70001};
    static char text[70001], model[300], salt[300];
    for (size_t i = 0; i < CG_ARRAY_LEN(lens); i++) {
        for (int rep = 0; rep < 8; rep++) {
            size_t ml = rnd() % sizeof model, sl = rnd() % 3 == 0 ? 0 : rnd() % sizeof salt;
            fill(text, lens[i]);
            fill(model, ml);
            fill(salt, sl);
            cg_mode mode = rep & 1 ? CG_MODE_SYS : CG_MODE_STRICT;
            const cg_key *sys = rep & 2 ? &SYS_KEY : NULL;
            cg_key got = cg_key_compute(model, ml, mode, salt, sl, sys, text, lens[i]);
            cg_key want = oneshot(model, ml, cg_mode_name(mode), salt, sl,
                                  mode == CG_MODE_SYS ? sys : NULL, text, lens[i]);
            ck_assert_msg(cg_key_equal(&got, &want), "len %zu rep %d", lens[i], rep);
        }
    }
}
END_TEST

START_TEST(test_fields_matter)
{
    const char *t = "The same chunk text.";
    size_t tl = strlen(t);
    cg_key strict = key_of("m", CG_MODE_STRICT, "", NULL, t, tl);
    cg_key sys = key_of("m", CG_MODE_SYS, "", NULL, t, tl);
    cg_key salted = key_of("m", CG_MODE_STRICT, "tenant-1", NULL, t, tl);
    cg_key salted2 = key_of("m", CG_MODE_STRICT, "tenant-2", NULL, t, tl);
    cg_key model2 = key_of("m2", CG_MODE_STRICT, "", NULL, t, tl);
    cg_key text2 = key_of("m", CG_MODE_STRICT, "", NULL, t, tl - 1);
    ck_assert(!cg_key_equal(&strict, &sys));
    ck_assert(!cg_key_equal(&strict, &salted));
    ck_assert(!cg_key_equal(&salted, &salted2));
    ck_assert(!cg_key_equal(&strict, &model2));
    ck_assert(!cg_key_equal(&strict, &text2));
    /* NULL salt and "" salt are the same empty field. */
    cg_key nullsalt = cg_key_compute("m", 1, CG_MODE_STRICT, NULL, 0, NULL, t, tl);
    ck_assert(cg_key_equal(&strict, &nullsalt));
    /* Deterministic. */
    cg_key again = key_of("m", CG_MODE_STRICT, "", NULL, t, tl);
    ck_assert(cg_key_equal(&strict, &again));
}
END_TEST

START_TEST(test_sys_key_only_in_sys_mode)
{
    const char *t = "chunk";
    cg_key other = SYS_KEY;
    other.b[15] ^= 1;
    cg_key strict_none = key_of("m", CG_MODE_STRICT, "", NULL, t, 5);
    cg_key strict_a = key_of("m", CG_MODE_STRICT, "", &SYS_KEY, t, 5);
    cg_key strict_b = key_of("m", CG_MODE_STRICT, "", &other, t, 5);
    ck_assert(cg_key_equal(&strict_none, &strict_a));
    ck_assert(cg_key_equal(&strict_a, &strict_b));
    cg_key sys_none = key_of("m", CG_MODE_SYS, "", NULL, t, 5);
    cg_key sys_a = key_of("m", CG_MODE_SYS, "", &SYS_KEY, t, 5);
    cg_key sys_b = key_of("m", CG_MODE_SYS, "", &other, t, 5);
    ck_assert(!cg_key_equal(&sys_none, &sys_a));
    ck_assert(!cg_key_equal(&sys_a, &sys_b));
    ck_assert(!cg_key_equal(&sys_none, &strict_none)); /* the mode name is hashed */
}
END_TEST

START_TEST(test_length_prefix_disambiguates)
{
    /* Plain concatenation would make these equal. */
    cg_key a = key_of("ab", CG_MODE_STRICT, "c", NULL, "t", 1);
    cg_key b = key_of("a", CG_MODE_STRICT, "bc", NULL, "t", 1);
    ck_assert(!cg_key_equal(&a, &b));
    cg_key c = key_of("m", CG_MODE_STRICT, "s", NULL, "xy", 2);
    cg_key d = key_of("m", CG_MODE_STRICT, "sx", NULL, "y", 1);
    ck_assert(!cg_key_equal(&c, &d));
    /* A model name that spells out a mode field does not collide either. */
    static const char spelled[] = "m\x06\0\0\0\0\0\0\0strict";
    cg_key e = cg_key_compute(spelled, sizeof spelled - 1, CG_MODE_STRICT, NULL, 0, NULL, "t", 1);
    cg_key f = key_of("m", CG_MODE_STRICT, "", NULL, "t", 1);
    ck_assert(!cg_key_equal(&e, &f));
}
END_TEST

START_TEST(test_hex_round_trip)
{
    for (int i = 0; i < 1000; i++) {
        cg_key k;
        for (int j = 0; j < 16; j++)
            k.b[j] = (uint8_t)rnd();
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(&k, hex);
        ck_assert_uint_eq(strlen(hex), 32);
        for (int j = 0; j < 32; j++)
            ck_assert(strchr("0123456789abcdef", hex[j]) != NULL);
        cg_key back;
        ck_assert_int_eq(cg_key_parse(hex, &back), 0);
        ck_assert(cg_key_equal(&k, &back));
    }
    cg_key k;
    ck_assert_int_eq(cg_key_parse("000102030405060708090a0b0c0d0e0f", &k), 0);
    ck_assert(cg_key_equal(&k, &SYS_KEY));
    /* Uppercase is accepted and means the same bytes. */
    ck_assert_int_eq(cg_key_parse("000102030405060708090A0B0C0D0E0F", &k), 0);
    ck_assert(cg_key_equal(&k, &SYS_KEY));
}
END_TEST

START_TEST(test_parse_rejects)
{
    cg_key k = SYS_KEY, before = SYS_KEY;
    ck_assert_int_eq(cg_key_parse("", &k), -1);
    ck_assert_int_eq(cg_key_parse(NULL, &k), -1);
    ck_assert_int_eq(cg_key_parse("000102030405060708090a0b0c0d0e0", &k), -1);   /* 31 */
    ck_assert_int_eq(cg_key_parse("000102030405060708090a0b0c0d0e0f0", &k), -1); /* 33 */
    ck_assert_int_eq(cg_key_parse("000102030405060708090a0b0c0d0e0g", &k), -1);
    ck_assert_int_eq(cg_key_parse("g00102030405060708090a0b0c0d0e0f", &k), -1);
    ck_assert_int_eq(cg_key_parse("00010203040506070809 a0b0c0d0e0f", &k), -1);
    ck_assert_int_eq(cg_key_parse("0x0102030405060708090a0b0c0d0e0f", &k), -1);
    ck_assert_int_eq(cg_key_parse("000102030405060708090a0b0c0d0e-f", &k), -1);
    ck_assert(cg_key_equal(&k, &before)); /* untouched on failure */
}
END_TEST

/* The request loop: each key equals its own cg_key_compute; in mode sys everything after the
 * system segment chains its key; a question has a key only on request. */
START_TEST(test_request_keys)
{
    const char *m = "tiny-llama", *salt = "t";
    cg_key_seg segs[] = {{CG_ROLE_SYSTEM, "You are terse.", 14},
                         {CG_ROLE_CHUNK, "Doc A", 5},
                         {CG_ROLE_CHUNK, "Doc B", 5},
                         {CG_ROLE_QUESTION, "Why?", 4}};
    const cg_mode modes[] = {CG_MODE_STRICT, CG_MODE_SYS};
    for (int mi = 0; mi < 2; mi++) {
        cg_key_scope sc = {m, strlen(m), modes[mi], salt, 1, 0};
        cg_key k[4], kq[4], zero;
        memset(&zero, 0, sizeof zero);
        cg_key_request(&sc, segs, 4, 0, k);
        cg_key_request(&sc, segs, 4, 1, kq);
        cg_key sys = cg_key_compute(m, strlen(m), modes[mi], salt, 1, NULL, segs[0].text, 14);
        ck_assert(cg_key_equal(&k[0], &sys));
        for (int i = 1; i < 4; i++) {
            cg_key want =
                cg_key_compute(m, strlen(m), modes[mi], salt, 1,
                               modes[mi] == CG_MODE_SYS ? &sys : NULL, segs[i].text, segs[i].len);
            ck_assert(cg_key_equal(&kq[i], &want));
            if (i < 3) ck_assert(cg_key_equal(&k[i], &want));
        }
        ck_assert(cg_key_equal(&k[3], &zero));
        /* without a leading system segment nothing chains */
        cg_key c[2];
        cg_key_request(&sc, segs + 1, 2, 0, c);
        cg_key plain = cg_key_compute(m, strlen(m), modes[mi], salt, 1, NULL, "Doc B", 5);
        ck_assert(cg_key_equal(&c[1], &plain));
    }
}
END_TEST

/* In mode sys a chunk's KV depends on whether the system segment got BOS, so its key does:
 * field 5 holds the system key followed by one byte 0x00 when the system segment is tokenized
 * without BOS. The system segment's own key, strict keys and the BOS case are unchanged. */
START_TEST(test_sys_no_bos)
{
    const char *m = "tiny-llama";
    cg_key_seg segs[] = {{CG_ROLE_SYSTEM, "You are terse.", 14}, {CG_ROLE_CHUNK, "Doc A", 5}};
    for (int mi = 0; mi < 2; mi++) {
        const cg_mode mode = mi ? CG_MODE_SYS : CG_MODE_STRICT;
        cg_key bos[2], nobos[2];
        cg_key_request(&(cg_key_scope){m, strlen(m), mode, NULL, 0, 0}, segs, 2, 0, bos);
        cg_key_request(&(cg_key_scope){m, strlen(m), mode, NULL, 0, 1}, segs, 2, 0, nobos);
        ck_assert(cg_key_equal(&bos[0], &nobos[0]));
        ck_assert_int_eq(cg_key_equal(&bos[1], &nobos[1]), mode == CG_MODE_STRICT);
        if (mode == CG_MODE_STRICT) continue;
        /* the encoding, byte for byte (README "Chunk key encoding") */
        uint8_t enc[256];
        size_t n = 0;
        const struct {
            const void *p;
            size_t len;
        } f[] = {{CG_KEY_VERSION, 16}, {m, strlen(m)}, {"sys", 3}, {"", 0},
                 {nobos[0].b, 17},     {"Doc A", 5}};
        uint8_t ctx[17];
        memcpy(ctx, nobos[0].b, 16);
        ctx[16] = 0;
        for (size_t i = 0; i < CG_ARRAY_LEN(f); i++) {
            for (int b = 0; b < 8; b++)
                enc[n++] = (uint8_t)((uint64_t)f[i].len >> (8 * b));
            memcpy(enc + n, i == 4 ? ctx : f[i].p, f[i].len);
            n += f[i].len;
        }
        XXH128_canonical_t canon;
        XXH128_canonicalFromHash(&canon, XXH3_128bits(enc, n));
        ck_assert_mem_eq(nobos[1].b, canon.digest, 16);
    }
}
END_TEST

START_TEST(test_mode_names)
{
    ck_assert_str_eq(cg_mode_name(CG_MODE_STRICT), "strict");
    ck_assert_str_eq(cg_mode_name(CG_MODE_SYS), "sys");
    cg_mode m = CG_MODE_SYS;
    ck_assert_int_eq(cg_mode_parse("strict", &m), 0);
    ck_assert_int_eq(m, CG_MODE_STRICT);
    ck_assert_int_eq(cg_mode_parse("sys", &m), 0);
    ck_assert_int_eq(m, CG_MODE_SYS);
    ck_assert_int_eq(cg_mode_parse("STRICT", &m), -1);
    ck_assert_int_eq(cg_mode_parse("system", &m), -1);
    ck_assert_int_eq(cg_mode_parse("", &m), -1);
    ck_assert_int_eq(cg_mode_parse(NULL, &m), -1);
    ck_assert_int_eq(m, CG_MODE_SYS);
}
END_TEST

int main(void)
{
    return th_run_tests("key", "core", 0,
                        TH_TESTS(test_pinned_vectors, test_worked_example_bytes,
                                 test_streaming_equals_oneshot, test_fields_matter,
                                 test_sys_key_only_in_sys_mode, test_length_prefix_disambiguates,
                                 test_hex_round_trip, test_parse_rejects, test_mode_names,
                                 test_request_keys, test_sys_no_bos));
}
