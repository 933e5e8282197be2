/* Check suite for the per-head KV wire format (kv/kvwire.h): round trips over shapes and
 * head ranges, the exact header bytes, every truncation, corrupted fields, ?heads= parsing
 * and the per-head key string. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kv/kvwire.h"
#include "tests/harness/harness.h"

/* The value the test model holds at (layer, head, kv, token, dim): exact in f32 and unique. */
static float val(uint32_t l, uint32_t h, int kv, uint32_t t, uint32_t d)
{
    return (float)(l * 1000000u + h * 10000u + (uint32_t)kv * 5000u + t * 64u + d) * 0.25f;
}

typedef struct src {
    uint32_t n_tokens, head_dim;
    uint32_t calls;
} src;

static void rows_of(void *ud, uint32_t layer, uint32_t head, int kv, float *rows)
{
    src *s = ud;
    s->calls++;
    for (uint32_t t = 0; t < s->n_tokens; t++)
        for (uint32_t d = 0; d < s->head_dim; d++)
            rows[(size_t)t * s->head_dim + d] = val(layer, head, kv, t, d);
}

static cg_kvwire_header hdr_of(const char *model, uint32_t layers, uint32_t hd, uint32_t tokens,
                               uint32_t start, uint32_t n, uint32_t total)
{
    cg_kvwire_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.model, sizeof h.model, "%s", model);
    h.n_layers = layers;
    h.head_dim = hd;
    h.dtype = CG_KVWIRE_DTYPE_F32;
    h.n_tokens = tokens;
    h.head_start = start;
    h.n_heads = n;
    h.total_kv_heads = total;
    return h;
}

/* Encodes h into a fresh buffer (caller frees b). */
static void encode(const cg_kvwire_header *h, cg_buf *b)
{
    src s = {h->n_tokens, h->head_dim, 0};
    cg_buf_init_unbounded(b);
    ck_assert_int_eq(cg_kvwire_encode(h, rows_of, &s, b), CG_OK);
    ck_assert_uint_eq(s.calls, h->n_heads * h->n_layers * 2);
}

START_TEST(test_round_trip_shapes)
{
    static const struct {
        const char *model;
        uint32_t layers, hd, tokens, start, n, total;
    } cases[] = {
        {"m", 1, 1, 1, 0, 1, 1},
        {"chunkgate-tiny", 4, 16, 37, 0, 4, 4},
        {"chunkgate-tiny", 4, 16, 37, 1, 2, 4},
        {"chunkgate-tiny", 4, 16, 37, 3, 1, 4},
        {"meta-llama/Llama-3.1-8B", 2, 128, 5, 6, 2, 8},
        {"a-model-id-of-odd-length", 3, 8, 100, 0, 8, 8},
        {"x2", 1, 64, 16, 2, 1, 3},
    };
    for (size_t c = 0; c < CG_ARRAY_LEN(cases); c++) {
        cg_kvwire_header h = hdr_of(cases[c].model, cases[c].layers, cases[c].hd, cases[c].tokens,
                                    cases[c].start, cases[c].n, cases[c].total);
        cg_buf b;
        encode(&h, &b);
        size_t payload = 0;
        ck_assert_int_eq(cg_kvwire_payload_bytes(&h, &payload), CG_OK);
        ck_assert_uint_eq(payload,
                          (size_t)h.n_heads * h.n_layers * 2 * h.n_tokens * h.head_dim * 4);
        size_t hb = cg_kvwire_header_size(&h);
        ck_assert_uint_eq(hb % CG_KVWIRE_ALIGN, 0);
        ck_assert_uint_ge(hb, CG_KVWIRE_FIXED_BYTES + strlen(h.model));
        ck_assert_uint_lt(hb, CG_KVWIRE_FIXED_BYTES + strlen(h.model) + CG_KVWIRE_ALIGN);
        ck_assert_uint_eq(b.len, hb + payload);

        cg_kvwire_header got;
        const float *pl = NULL;
        ck_assert_int_eq(cg_kvwire_decode(b.data, b.len, &got, &pl), CG_OK);
        ck_assert_str_eq(got.model, h.model);
        ck_assert_uint_eq(got.n_layers, h.n_layers);
        ck_assert_uint_eq(got.head_dim, h.head_dim);
        ck_assert_uint_eq(got.dtype, 0);
        ck_assert_uint_eq(got.n_tokens, h.n_tokens);
        ck_assert_uint_eq(got.head_start, h.head_start);
        ck_assert_uint_eq(got.n_heads, h.n_heads);
        ck_assert_uint_eq(got.total_kv_heads, h.total_kv_heads);
        ck_assert_uint_eq(got.header_bytes, hb);
        ck_assert_ptr_eq(pl, (const float *)(const void *)(b.data + hb));
        /* Per head, per layer, K then V, [tokens][head_dim]: check every float. */
        size_t i = 0;
        for (uint32_t hh = 0; hh < h.n_heads; hh++)
            for (uint32_t l = 0; l < h.n_layers; l++)
                for (int kv = 0; kv < 2; kv++) {
                    ck_assert_uint_eq(cg_kvwire_rows_offset(&got, hh, l, kv), i);
                    for (uint32_t t = 0; t < h.n_tokens; t++)
                        for (uint32_t d = 0; d < h.head_dim; d++, i++)
                            ck_assert(pl[i] == val(l, h.head_start + hh, kv, t, d));
                }
        ck_assert_uint_eq(i * 4, payload);
        cg_buf_free(&b);
    }
}
END_TEST

/* The header byte for byte, as documented. */
START_TEST(test_header_bytes)
{
    cg_kvwire_header h = hdr_of("tiny", 2, 3, 5, 1, 2, 4);
    uint8_t out[64];
    size_t n = 0;
    ck_assert_int_eq(cg_kvwire_header_encode(&h, out, sizeof out, &n), CG_OK);
    static const uint8_t want[48] = {
        'C', 'G', 'K', 'V', 1, 0, 0, 0, 48, 0, 0, 0, 4, 0, 't', 'i', 'n', 'y', /* 18 */
        2,   0,   0,   0,   3, 0, 0, 0, 0,  0, 0, 0, 5, 0, 0,   0,             /* 34 */
        1,   0,   0,   0,   2, 0, 0, 0, 4,  0, 0, 0,                           /* 46 */
        0,   0};                                                               /* pad to 48 */
    ck_assert_uint_eq(n, sizeof want);
    ck_assert_mem_eq(out, want, sizeof want);
    ck_assert_int_eq(cg_kvwire_header_encode(&h, out, 47, &n), CG_E_TOO_LARGE);
    /* A model of 6 bytes: 48 bytes exactly, no padding. */
    h = hdr_of("tiny12", 2, 3, 5, 1, 2, 4);
    ck_assert_int_eq(cg_kvwire_header_encode(&h, out, sizeof out, &n), CG_OK);
    ck_assert_uint_eq(n, 48);
}
END_TEST

START_TEST(test_every_truncation_rejected)
{
    cg_kvwire_header h = hdr_of("chunkgate-tiny", 2, 4, 3, 1, 2, 4);
    cg_buf b;
    encode(&h, &b);
    /* Each prefix in an exact-size heap block, so ASan catches any read past the length. */
    for (size_t len = 0; len < b.len; len++) {
        char *copy = cg_malloc(len ? len : 1);
        memcpy(copy, b.data, len);
        cg_kvwire_header got;
        const float *pl = (const float *)1;
        ck_assert_int_ne(cg_kvwire_decode(copy, len, &got, &pl), CG_OK);
        ck_assert_ptr_null(pl);
        free(copy);
    }
    /* Trailing bytes. */
    char *longer = cg_malloc(b.len + 4);
    memcpy(longer, b.data, b.len);
    memset(longer + b.len, 0, 4);
    cg_kvwire_header got;
    const float *pl = NULL;
    ck_assert_int_eq(cg_kvwire_decode(longer, b.len + 4, &got, &pl), CG_E_VALUE);
    ck_assert_int_eq(cg_kvwire_decode(longer, b.len, &got, &pl), CG_OK);
    ck_assert_int_eq(cg_kvwire_decode(NULL, 0, &got, &pl), CG_E_VALUE);
    free(longer);
    cg_buf_free(&b);
}
END_TEST

static void put32(char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (char)(v >> (8 * i));
}

/* Decodes a copy of b with one u32 at off replaced by v. */
static cg_status decode_with_u32(const cg_buf *b, size_t off, uint32_t v)
{
    char *c = cg_malloc(b->len);
    memcpy(c, b->data, b->len);
    put32(c + off, v);
    cg_kvwire_header got;
    const float *pl = NULL;
    cg_status st = cg_kvwire_decode(c, b->len, &got, &pl);
    free(c);
    return st;
}

START_TEST(test_corrupted_fields_rejected)
{
    cg_kvwire_header h = hdr_of("tiny", 2, 4, 3, 1, 2, 4); /* header 48 bytes */
    cg_buf b;
    encode(&h, &b);
    const size_t q = 18;                                          /* first u32 after the model */
    ck_assert_int_eq(decode_with_u32(&b, 0, 0x564B4743u), CG_OK); /* "CGKV" itself */
    ck_assert_int_eq(decode_with_u32(&b, 0, 0x564B4744u), CG_E_VALUE); /* magic */
    ck_assert_int_eq(decode_with_u32(&b, 4, 2), CG_E_UNSUPPORTED);     /* version */
    ck_assert_int_eq(decode_with_u32(&b, 4, 0), CG_E_UNSUPPORTED);
    ck_assert_int_eq(decode_with_u32(&b, 8, 40), CG_E_VALUE); /* header_bytes */
    ck_assert_int_eq(decode_with_u32(&b, 8, 56), CG_E_VALUE);
    ck_assert_int_eq(decode_with_u32(&b, 8, 0xffffffffu), CG_E_VALUE);
    ck_assert_int_eq(decode_with_u32(&b, q, 0), CG_E_VALUE); /* n_layers */
    ck_assert_int_eq(decode_with_u32(&b, q, 3), CG_E_VALUE); /* size mismatch */
    ck_assert_int_eq(decode_with_u32(&b, q, 0x80000000u), CG_E_VALUE);
    ck_assert_int_eq(decode_with_u32(&b, q + 4, 0), CG_E_VALUE); /* head_dim */
    ck_assert_int_eq(decode_with_u32(&b, q + 4, 8), CG_E_VALUE);
    ck_assert_int_eq(decode_with_u32(&b, q + 8, 1), CG_E_UNSUPPORTED);      /* dtype */
    ck_assert_int_eq(decode_with_u32(&b, q + 12, 0), CG_E_VALUE);           /* n_tokens */
    ck_assert_int_eq(decode_with_u32(&b, q + 12, 0xffffffffu), CG_E_VALUE); /* overflow-ish */
    ck_assert_int_eq(decode_with_u32(&b, q + 16, 3), CG_E_VALUE);           /* start+n > total */
    ck_assert_int_eq(decode_with_u32(&b, q + 16, 0xffffffffu), CG_E_VALUE); /* u32 wrap */
    ck_assert_int_eq(decode_with_u32(&b, q + 16, 2), CG_OK);                /* heads 2-3 of 4 */
    ck_assert_int_eq(decode_with_u32(&b, q + 20, 0), CG_E_VALUE);           /* n_heads */
    ck_assert_int_eq(decode_with_u32(&b, q + 20, 3), CG_E_VALUE);
    ck_assert_int_eq(decode_with_u32(&b, q + 24, 2), CG_E_VALUE); /* total heads */
    ck_assert_int_eq(decode_with_u32(&b, q + 24, 0), CG_E_VALUE);
    ck_assert_int_eq(decode_with_u32(&b, q + 24, 100000), CG_E_VALUE);

    /* Model length and bytes, padding. */
    char *c = cg_malloc(b.len);
    cg_kvwire_header got;
    const float *pl = NULL;
    memcpy(c, b.data, b.len);
    c[12] = 0; /* model length 0 */
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_E_VALUE);
    memcpy(c, b.data, b.len);
    c[12] = 5; /* longer model: swallows a byte of n_layers (a control character) */
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_E_VALUE);
    memcpy(c, b.data, b.len);
    c[13] = 1; /* 260 bytes > the maximum */
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_E_VALUE);
    memcpy(c, b.data, b.len);
    c[15] = '\n'; /* control character in the model */
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_E_VALUE);
    memcpy(c, b.data, b.len);
    c[15] = '\0';
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_E_VALUE);
    memcpy(c, b.data, b.len);
    c[47] = 1; /* non-zero padding */
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_E_VALUE);
    /* Payload bytes are not validated (any float is KV), only their count. */
    memcpy(c, b.data, b.len);
    c[b.len - 1] ^= 0x55;
    ck_assert_int_eq(cg_kvwire_decode(c, b.len, &got, &pl), CG_OK);
    free(c);

    /* Misaligned buffer: refused instead of handing out a misaligned float pointer. */
    char *m = cg_malloc(b.len + 1);
    memcpy(m + 1, b.data, b.len);
    ck_assert_int_eq(cg_kvwire_decode(m + 1, b.len, &got, &pl), CG_E_VALUE);
    free(m);
    cg_buf_free(&b);
}
END_TEST

/* Random byte flips and random buffers: never a crash, and anything accepted is consistent. */
START_TEST(test_random_mutations)
{
    cg_kvwire_header h = hdr_of("chunkgate-tiny", 2, 4, 3, 0, 4, 4);
    cg_buf b;
    encode(&h, &b);
    uint64_t s = 42;
    size_t accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        char *c = cg_malloc(b.len);
        memcpy(c, b.data, b.len);
        int flips = 1 + iter % 3;
        for (int f = 0; f < flips; f++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % 60; /* the header and the first payload bytes */
            c[pos] = (char)(s >> 13);
        }
        size_t len = iter % 7 == 0 ? (size_t)(s >> 40) % (b.len + 1) : b.len;
        cg_kvwire_header got;
        const float *pl = NULL;
        if (cg_kvwire_decode(c, len, &got, &pl) == CG_OK) {
            size_t payload = 0;
            ck_assert_int_eq(cg_kvwire_payload_bytes(&got, &payload), CG_OK);
            ck_assert_uint_eq(got.header_bytes + payload, len);
            ck_assert_uint_le(got.head_start + got.n_heads, got.total_kv_heads);
            accepted++;
        }
        free(c);
    }
    ck_assert_uint_gt(accepted, 0); /* payload-only flips stay valid */
    cg_buf_free(&b);
}
END_TEST

START_TEST(test_encode_refuses_bad_header_and_cap)
{
    cg_buf b;
    cg_buf_init_unbounded(&b);
    src s = {3, 4, 0};
    cg_kvwire_header h = hdr_of("tiny", 2, 4, 3, 3, 2, 4); /* heads 3..4 of 4 */
    ck_assert_int_eq(cg_kvwire_encode(&h, rows_of, &s, &b), CG_E_VALUE);
    h = hdr_of("", 2, 4, 3, 0, 1, 4);
    ck_assert_int_eq(cg_kvwire_encode(&h, rows_of, &s, &b), CG_E_VALUE);
    ck_assert_uint_eq(cg_kvwire_header_size(&h), 0);
    h = hdr_of("tiny", 2, 4, 3, 0, 1, 4);
    h.dtype = 1;
    ck_assert_int_eq(cg_kvwire_encode(&h, rows_of, &s, &b), CG_E_UNSUPPORTED);
    h = hdr_of("tiny", 2, 4, 0xffffffffu, 0, 4, 4);
    h.head_dim = CG_KVWIRE_DIM_MAX;
    h.n_layers = CG_KVWIRE_DIM_MAX;
    size_t n;
    ck_assert_int_eq(cg_kvwire_payload_bytes(&h, &n), CG_E_VALUE); /* overflows size_t */
    ck_assert_uint_eq(s.calls, 0);
    cg_buf_free(&b);
    /* A capped buffer: refused up front, nothing appended. */
    cg_buf_init(&b, 100);
    h = hdr_of("tiny", 2, 4, 3, 0, 1, 4); /* 48 + 192 bytes */
    ck_assert_int_eq(cg_kvwire_encode(&h, rows_of, &s, &b), CG_E_TOO_LARGE);
    ck_assert_uint_eq(b.len, 0);
    cg_buf_free(&b);
}
END_TEST

START_TEST(test_parse_heads)
{
    static const struct {
        const char *spec;
        uint32_t total, start, n;
    } good[] = {{NULL, 4, 0, 4},  {"0-3", 4, 0, 4}, {"2", 4, 2, 1},
                {"1-2", 4, 1, 2}, {"3-3", 4, 3, 1}, {"007", 8, 7, 1}};
    uint32_t a = 99, n = 99;
    for (size_t i = 0; i < CG_ARRAY_LEN(good); i++) {
        ck_assert_int_eq(cg_kvwire_parse_heads(good[i].spec, good[i].total, &a, &n), CG_OK);
        ck_assert_uint_eq(a, good[i].start);
        ck_assert_uint_eq(n, good[i].n);
    }
    static const char *bad[] = {"",
                                "-",
                                "4",
                                "0-4",
                                "2-1",
                                "a",
                                "1-",
                                "-1",
                                "1-2-",
                                "1 -2",
                                " 1",
                                "1 ",
                                "+1",
                                "1--2",
                                "0x1",
                                "1,2",
                                "99999999999",
                                "4294967295",
                                "4294967296-4294967297",
                                "1-99999999999"};
    for (size_t i = 0; i < CG_ARRAY_LEN(bad); i++) {
        a = 77;
        n = 77;
        ck_assert_msg(cg_kvwire_parse_heads(bad[i], 4, &a, &n) == CG_E_VALUE, "accepted '%s'",
                      bad[i]);
        ck_assert_uint_eq(a, 77);
    }
    ck_assert_int_eq(cg_kvwire_parse_heads("0", 0, &a, &n), CG_E_VALUE);
    ck_assert_int_eq(cg_kvwire_parse_heads(NULL, 0, &a, &n), CG_E_VALUE);
}
END_TEST

START_TEST(test_head_key)
{
    char out[128];
    const char *hex = "00112233445566778899aabbccddeeff";
    ck_assert_int_eq(cg_kvwire_head_key("chunkgate-tiny", 3, hex, out, sizeof out), CG_OK);
    ck_assert_str_eq(out, "chunkgate-tiny@head:3@00112233445566778899aabbccddeeff");
    ck_assert_int_eq(cg_kvwire_head_key("m", 0, hex, out, sizeof out), CG_OK);
    ck_assert_str_eq(out, "m@head:0@00112233445566778899aabbccddeeff");
    ck_assert_int_eq(cg_kvwire_head_key("m", 4294967295u, hex, out, sizeof out), CG_OK);
    ck_assert_str_eq(out, "m@head:4294967295@00112233445566778899aabbccddeeff");
    /* Exactly fitting, one byte short. */
    size_t need = strlen("m@head:0@") + 32 + 1;
    ck_assert_int_eq(cg_kvwire_head_key("m", 0, hex, out, need), CG_OK);
    ck_assert_int_eq(cg_kvwire_head_key("m", 0, hex, out, need - 1), CG_E_TOO_LARGE);
    ck_assert_int_eq(cg_kvwire_head_key("", 0, hex, out, sizeof out), CG_E_VALUE);
    ck_assert_int_eq(
        cg_kvwire_head_key("m", 0, "00112233445566778899AABBCCDDEEFF", out, sizeof out),
        CG_E_VALUE);
    ck_assert_int_eq(cg_kvwire_head_key("m", 0, "0011", out, sizeof out), CG_E_VALUE);
    ck_assert_int_eq(
        cg_kvwire_head_key("m", 0, "00112233445566778899aabbccddeeff0", out, sizeof out),
        CG_E_VALUE);
}
END_TEST

/* A sealed value decodes under its own name only; every flipped bit, every truncation, an
 * appended byte and another name are refused. */
START_TEST(test_seal)
{
    cg_kvwire_header h = hdr_of("chunkgate-tiny", 2, 8, 5, 1, 1, 4), got;
    cg_buf b;
    encode(&h, &b);
    const char *name = "chunkgate-tiny@head:1@00112233445566778899aabbccddeeff";
    uint8_t seal[CG_KVWIRE_SEAL_BYTES];
    cg_kvwire_seal(b.data, b.len, name, seal);
    ck_assert_int_eq(cg_buf_append(&b, seal, sizeof seal), CG_OK);
    const size_t len = b.len;
    char *v = cg_malloc(len + 1);
    memcpy(v, b.data, len);
    const float *pl = NULL;
    ck_assert_int_eq(cg_kvwire_unseal(v, len, name, &got, &pl), CG_OK);
    ck_assert_uint_eq(got.n_tokens, 5);
    ck_assert_uint_eq(got.head_start, 1);
    ck_assert(pl != NULL && pl[0] == val(0, 1, 0, 0, 0));
    /* the same bytes under the key of another head or chunk */
    ck_assert_int_eq(cg_kvwire_unseal(v, len,
                                      "chunkgate-tiny@head:2@00112233445566778899aabbccddeeff",
                                      &got, &pl),
                     CG_E_VALUE);
    ck_assert_ptr_null(pl);
    ck_assert_int_eq(cg_kvwire_unseal(v, len,
                                      "chunkgate-tiny@head:1@00112233445566778899aabbccddeefe",
                                      &got, &pl),
                     CG_E_VALUE);
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            v[i] ^= (char)(1 << bit);
            ck_assert_int_ne(cg_kvwire_unseal(v, len, name, &got, &pl), CG_OK);
            v[i] ^= (char)(1 << bit);
        }
    for (size_t n = 0; n < len; n++)
        ck_assert_int_ne(cg_kvwire_unseal(v, n, name, &got, &pl), CG_OK);
    v[len] = 0;
    ck_assert_int_ne(cg_kvwire_unseal(v, len + 1, name, &got, &pl), CG_OK);
    ck_assert_int_eq(cg_kvwire_unseal(NULL, 0, name, &got, &pl), CG_E_VALUE);
    /* a well-sealed body of another model still decodes: the caller compares the header */
    cg_kvwire_header other = hdr_of("other-model", 2, 8, 5, 1, 1, 4);
    cg_buf ob;
    encode(&other, &ob);
    cg_kvwire_seal(ob.data, ob.len, name, seal);
    ck_assert_int_eq(cg_buf_append(&ob, seal, sizeof seal), CG_OK);
    ck_assert_int_eq(cg_kvwire_unseal(ob.data, ob.len, name, &got, &pl), CG_OK);
    ck_assert_str_eq(got.model, "other-model");
    cg_buf_free(&ob);
    free(v);
    cg_buf_free(&b);
}
END_TEST

int main(void)
{
    return th_run_tests("kvwire", "core", 0,
                        TH_TESTS(test_round_trip_shapes, test_header_bytes,
                                 test_every_truncation_rejected, test_corrupted_fields_rejected,
                                 test_random_mutations, test_encode_refuses_bad_header_and_cap,
                                 test_parse_heads, test_head_key, test_seal));
}
