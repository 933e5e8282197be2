/* Chunk keys: XXH3-128 (or SHA-256) streamed over the length-prefixed fields, so segment bytes
 * are hashed in place and never copied. The encoding is pinned by tests/test_key.c and
 * tests/test_keyhash.c. DESIGN §4. */
#include "cache/key.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The state struct is needed on the stack (no malloc per key); the header and the library
 * come from the same libxxhash package, so its layout matches. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "base/base.h"

const char *const cg_mode_names[] = {"strict", "sys", NULL};
const char *const cg_key_hash_names[] = {"xxhash", "sha256", NULL};

const char *cg_mode_name(cg_mode m)
{
    return (unsigned)m < 2 ? cg_mode_names[m] : "unknown";
}

/* The index of s in names (NULL-terminated), or -1. */
static int name_index(const char *const *names, const char *s)
{
    for (int i = 0; s && names[i]; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

int cg_mode_parse(const char *s, cg_mode *out)
{
    int i = name_index(cg_mode_names, s);
    if (i >= 0) *out = (cg_mode)i;
    return i >= 0 ? 0 : -1;
}

const char *const cg_select_names[] = {"deviation", "question", NULL};

int cg_select_parse(const char *s, cg_select *out)
{
    int i = name_index(cg_select_names, s);
    if (i >= 0) *out = (cg_select)i;
    return i >= 0 ? 0 : -1;
}

const char *cg_key_hash_name(cg_key_hash h)
{
    return h == CG_KEY_HASH_SHA256 ? "sha256" : "xxhash";
}

int cg_key_hash_parse(const char *s, cg_key_hash *out)
{
    int i = s && !strcmp(s, "xxh3") ? CG_KEY_HASH_XXH3 : name_index(cg_key_hash_names, s);
    if (i >= 0) *out = (cg_key_hash)i;
    return i >= 0 ? 0 : -1;
}

/* Written once at startup, before threads; read-only afterwards. */
static cg_key_hash g_hash = CG_KEY_HASH_XXH3;

void cg_key_set_hash(cg_key_hash h)
{
    g_hash = h;
}

cg_key_hash cg_key_get_hash(void)
{
    return g_hash;
}

/* ---- SHA-256 through libcrypto's EVP interface ---- */

/* OpenSSL 3 looks an algorithm up by name on every EVP_DigestInit with EVP_sha256(); fetching
 * it once makes a short key about twice as fast. It lives until the process ends. */
static EVP_MD *g_sha256;
static pthread_once_t g_sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    g_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!g_sha256) abort(); /* libcrypto without SHA-256: nothing sensible to do */
}

static EVP_MD_CTX *sha256_begin(void)
{
    pthread_once(&g_sha256_once, sha256_fetch);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, g_sha256, NULL) != 1) abort(); /* out of memory */
    return c;
}

static void sha256_end(EVP_MD_CTX *c, uint8_t out[32])
{
    unsigned n = 0;
    if (EVP_DigestFinal_ex(c, out, &n) != 1 || n != 32) abort();
    EVP_MD_CTX_free(c);
}

/* One hash state of either kind, fed field by field. */
typedef struct key_state {
    cg_key_hash h;
    XXH3_state_t xx;
    EVP_MD_CTX *sha;
} key_state;

static void ks_update(key_state *st, const void *p, size_t n)
{
    if (st->h == CG_KEY_HASH_SHA256) {
        if (EVP_DigestUpdate(st->sha, p, n) != 1) abort();
    } else {
        (void)XXH3_128bits_update(&st->xx, p, n);
    }
}

/* One field of the encoding: its length as an unsigned 64-bit little-endian integer, then its
 * bytes. The prefix makes the concatenation unambiguous ("ab"+"c" differs from "a"+"bc"). */
static void put_field(key_state *st, const void *p, size_t n)
{
    uint8_t len[8];
    uint64_t v = (uint64_t)n;
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(v >> (8 * i));
    ks_update(st, len, sizeof len);
    if (n) ks_update(st, p, n);
}

/* The key, with field 5 (the system context of a sys-mode chunk) being sys_key's 16 bytes,
 * followed by one byte 0x00 when sys_no_bos (the system segment was tokenized without BOS, so
 * the chunk's KV was computed after other tokens). */
static cg_key key_compute(cg_key_hash h, const char *model, size_t model_len, cg_mode mode,
                          const char *salt, size_t salt_len, const cg_key *sys_key, int sys_no_bos,
                          const char *text, size_t text_len)
{
    key_state st;
    const char *mode_name = cg_mode_name(mode);
    cg_key k;

    st.h = h;
    st.sha = NULL;
    if (h == CG_KEY_HASH_SHA256) {
        st.sha = sha256_begin();
    } else {
        XXH3_INITSTATE(&st.xx);
        (void)XXH3_128bits_reset(&st.xx);
    }
    put_field(&st, CG_KEY_VERSION, strlen(CG_KEY_VERSION));
    put_field(&st, model, model_len);
    put_field(&st, mode_name, strlen(mode_name));
    put_field(&st, salt, salt_len);
    /* Only mode sys ties a chunk to its system segment; a strict key must not depend on it. */
    if (mode == CG_MODE_SYS && sys_key) {
        uint8_t ctx[sizeof sys_key->b + 1];
        memcpy(ctx, sys_key->b, sizeof sys_key->b);
        ctx[sizeof sys_key->b] = 0;
        put_field(&st, ctx, sizeof sys_key->b + (sys_no_bos ? 1 : 0));
    } else
        put_field(&st, NULL, 0);
    put_field(&st, text, text_len);

    if (h == CG_KEY_HASH_SHA256) {
        uint8_t d[32];
        sha256_end(st.sha, d);
        memcpy(k.b, d, sizeof k.b); /* the first 16 bytes, in digest order */
    } else {
        XXH128_canonical_t canon;
        XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&st.xx));
        memcpy(k.b, canon.digest, sizeof k.b);
    }
    return k;
}

cg_key cg_key_compute_with(cg_key_hash h, const char *model, size_t model_len, cg_mode mode,
                           const char *salt, size_t salt_len, const cg_key *sys_key,
                           const char *text, size_t text_len)
{
    return key_compute(h, model, model_len, mode, salt, salt_len, sys_key, 0, text, text_len);
}

cg_key cg_key_compute(const char *model, size_t model_len, cg_mode mode, const char *salt,
                      size_t salt_len, const cg_key *sys_key, const char *text, size_t text_len)
{
    return cg_key_compute_with(g_hash, model, model_len, mode, salt, salt_len, sys_key, text,
                               text_len);
}

void cg_key_tenant_id(const char *key, size_t len, char out[CG_KEY_HEX_LEN + 1])
{
    static const char domain[] = "chunkgate-tenant-v1"; /* and its NUL: a separator */
    EVP_MD_CTX *c = sha256_begin();
    uint8_t d[32];
    if (EVP_DigestUpdate(c, domain, sizeof domain) != 1 || EVP_DigestUpdate(c, key, len) != 1)
        abort();
    sha256_end(c, d);
    cg_hex_encode(d, 16, out);
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

void cg_key_request(const cg_key_scope *sc, const cg_key_seg *segs, size_t n, int with_question,
                    cg_key *keys)
{
    const int chain = sc->mode == CG_MODE_SYS && n > 0 && segs[0].role == CG_ROLE_SYSTEM;
    for (size_t i = 0; i < n; i++) {
        if (segs[i].role == CG_ROLE_QUESTION && !with_question) {
            memset(&keys[i], 0, sizeof keys[i]);
            continue;
        }
        const cg_key *sys_key = chain && i > 0 ? &keys[0] : NULL;
        keys[i] = key_compute(g_hash, sc->model, sc->model_len, sc->mode, sc->salt,
                              sc->salt ? sc->salt_len : 0, sys_key, sc->sys_no_bos, segs[i].text,
                              segs[i].len);
    }
}
