/* Chunk keys: XXH3-128 streamed over the length-prefixed fields, so segment bytes are hashed
 * in place and never copied. The encoding is pinned by tests/test_key.c. DESIGN §4. */
#include "cache/key.h"

#include <string.h>

/* The state struct is needed on the stack (no malloc per key); the header and the library
 * come from the same libxxhash package, so its layout matches. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "cache/base.h"

const char *cg_mode_name(cg_mode m)
{
    switch (m) {
    case CG_MODE_STRICT:
        return "strict";
    case CG_MODE_SYS:
        return "sys";
    }
    return "unknown";
}

int cg_mode_parse(const char *s, cg_mode *out)
{
    if (!s) return -1;
    if (strcmp(s, "strict") == 0) {
        *out = CG_MODE_STRICT;
        return 0;
    }
    if (strcmp(s, "sys") == 0) {
        *out = CG_MODE_SYS;
        return 0;
    }
    return -1;
}

/* One field of the encoding: its length as an unsigned 64-bit little-endian integer, then its
 * bytes. The prefix makes the concatenation unambiguous ("ab"+"c" differs from "a"+"bc"). */
static void put_field(XXH3_state_t *st, const void *p, size_t n)
{
    uint8_t len[8];
    uint64_t v = (uint64_t)n;
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(v >> (8 * i));
    (void)XXH3_128bits_update(st, len, sizeof len);
    if (n) (void)XXH3_128bits_update(st, p, n);
}

cg_key cg_key_compute(const char *model, size_t model_len, cg_mode mode, const char *salt,
                      size_t salt_len, const cg_key *sys_key, const char *text, size_t text_len)
{
    XXH3_state_t st;
    const char *mode_name = cg_mode_name(mode);

    XXH3_INITSTATE(&st);
    (void)XXH3_128bits_reset(&st);
    put_field(&st, CG_KEY_VERSION, strlen(CG_KEY_VERSION));
    put_field(&st, model, model_len);
    put_field(&st, mode_name, strlen(mode_name));
    put_field(&st, salt, salt_len);
    /* Only mode sys ties a chunk to its system segment; a strict key must not depend on it. */
    if (mode == CG_MODE_SYS && sys_key)
        put_field(&st, sys_key->b, sizeof sys_key->b);
    else
        put_field(&st, NULL, 0);
    put_field(&st, text, text_len);

    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&st));
    cg_key k;
    memcpy(k.b, canon.digest, sizeof k.b);
    return k;
}

void cg_key_hex(const cg_key *k, char out[CG_KEY_HEX_LEN + 1])
{
    cg_hex_encode(k->b, sizeof k->b, out);
}

int cg_key_parse(const char *hex, cg_key *out)
{
    if (!hex || strnlen(hex, CG_KEY_HEX_LEN + 1) != CG_KEY_HEX_LEN) return -1;
    cg_key k;
    if (cg_hex_decode(hex, sizeof k.b, k.b) != 0) return -1;
    *out = k;
    return 0;
}

int cg_key_equal(const cg_key *a, const cg_key *b)
{
    return memcmp(a->b, b->b, sizeof a->b) == 0;
}
