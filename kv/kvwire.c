/* Per-head KV wire format: header encode/decode with strict validation, body encoder,
 * ?heads= parser and the per-head key string. */
#include "kv/kvwire.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* The payload is raw f32 in host order; the format says little-endian. A big-endian port
 * would byte-swap in encode and decode. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kvwire assumes a little-endian host");
_Static_assert(sizeof(float) == 4, "f32");

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A model id is 1..255 bytes without control characters (it goes into logs and key strings). */
static int model_ok(const char *m, size_t n)
{
    if (n == 0 || n > CG_KVWIRE_MODEL_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)m[i];
        if (c < 0x20 || c == 0x7f) return 0;
    }
    return 1;
}

static size_t padded(size_t n)
{
    return (n + CG_KVWIRE_ALIGN - 1) / CG_KVWIRE_ALIGN * CG_KVWIRE_ALIGN;
}

cg_status cg_kvwire_validate(const cg_kvwire_header *h)
{
    size_t ml = strnlen(h->model, sizeof h->model);
    if (ml == sizeof h->model || !model_ok(h->model, ml)) return CG_E_VALUE;
    if (h->n_layers == 0 || h->n_layers > CG_KVWIRE_DIM_MAX || h->head_dim == 0 ||
        h->head_dim > CG_KVWIRE_DIM_MAX || h->n_tokens == 0 || h->n_heads == 0 ||
        h->total_kv_heads == 0 || h->total_kv_heads > CG_KVWIRE_DIM_MAX ||
        (uint64_t)h->head_start + h->n_heads > h->total_kv_heads)
        return CG_E_VALUE;
    if (h->dtype != CG_KVWIRE_DTYPE_F32) return CG_E_UNSUPPORTED;
    return CG_OK;
}

size_t cg_kvwire_header_size(const cg_kvwire_header *h)
{
    size_t ml = strnlen(h->model, sizeof h->model);
    if (ml == sizeof h->model || !model_ok(h->model, ml)) return 0;
    return padded(CG_KVWIRE_FIXED_BYTES + ml);
}

cg_status cg_kvwire_payload_bytes(const cg_kvwire_header *h, size_t *out)
{
    cg_status st = cg_kvwire_validate(h);
    if (st != CG_OK) return st;
    size_t n = 0;
    /* n_tokens is a full u32, so the product can overflow even in 64 bits. */
    if (__builtin_mul_overflow((size_t)h->n_heads, (size_t)h->n_layers, &n) ||
        __builtin_mul_overflow(n, (size_t)2 * sizeof(float), &n) ||
        __builtin_mul_overflow(n, (size_t)h->n_tokens, &n) ||
        __builtin_mul_overflow(n, (size_t)h->head_dim, &n))
        return CG_E_VALUE;
    *out = n;
    return CG_OK;
}

size_t cg_kvwire_rows_offset(const cg_kvwire_header *h, uint32_t head_rel, uint32_t layer, int kv)
{
    size_t rows = (size_t)h->n_tokens * h->head_dim;
    return (((size_t)head_rel * h->n_layers + layer) * 2 + (size_t)(kv != 0)) * rows;
}

cg_status cg_kvwire_header_encode(const cg_kvwire_header *h, void *out, size_t cap, size_t *n)
{
    size_t payload;
    cg_status st = cg_kvwire_payload_bytes(h, &payload);
    if (st != CG_OK) return st;
    size_t ml = strlen(h->model), hb = padded(CG_KVWIRE_FIXED_BYTES + ml);
    if (hb > UINT32_MAX || payload > SIZE_MAX - hb) return CG_E_VALUE;
    if (cap < hb) return CG_E_TOO_LARGE;
    uint8_t *p = out;
    memset(p, 0, hb);
    memcpy(p, CG_KVWIRE_MAGIC, 4);
    put_u32(p + 4, CG_KVWIRE_VERSION);
    put_u32(p + 8, (uint32_t)hb);
    put_u16(p + 12, (uint16_t)ml);
    memcpy(p + 14, h->model, ml);
    uint8_t *q = p + 14 + ml;
    const uint32_t f[7] = {h->n_layers,   h->head_dim, h->dtype,         h->n_tokens,
                           h->head_start, h->n_heads,  h->total_kv_heads};
    for (int i = 0; i < 7; i++)
        put_u32(q + 4 * i, f[i]);
    *n = hb;
    return CG_OK;
}

cg_status cg_kvwire_encode(const cg_kvwire_header *h, cg_kvwire_rows_fn fn, void *ud, cg_buf *out)
{
    uint8_t head[CG_KVWIRE_FIXED_BYTES + CG_KVWIRE_MODEL_MAX + CG_KVWIRE_ALIGN];
    size_t hb = 0, payload = 0;
    cg_status st = cg_kvwire_header_encode(h, head, sizeof head, &hb);
    if (st != CG_OK) return st;
    st = cg_kvwire_payload_bytes(h, &payload);
    if (st != CG_OK) return st;
    if (payload > out->max || hb > out->max - payload) return CG_E_TOO_LARGE;
    st = cg_buf_append(out, head, hb);
    if (st != CG_OK) return st;
    size_t row_floats = (size_t)h->n_tokens * h->head_dim;
    float *rows = cg_malloc(row_floats * sizeof *rows);
    for (uint32_t i = 0; i < h->n_heads && st == CG_OK; i++) {
        for (uint32_t l = 0; l < h->n_layers && st == CG_OK; l++) {
            for (int kv = 0; kv < 2 && st == CG_OK; kv++) {
                fn(ud, l, h->head_start + i, kv, rows);
                st = cg_buf_append(out, rows, row_floats * sizeof *rows);
            }
        }
    }
    free(rows);
    return st;
}

cg_status cg_kvwire_decode(const void *buf, size_t len, cg_kvwire_header *hdr,
                           const float **payload)
{
    const uint8_t *p = buf;
    cg_kvwire_header h;
    memset(&h, 0, sizeof h);
    *payload = NULL;
    /* Fixed prefix: magic, version, header_bytes, model length. */
    if (!buf || len < 14 || memcmp(p, CG_KVWIRE_MAGIC, 4) != 0) return CG_E_VALUE;
    if (get_u32(p + 4) != CG_KVWIRE_VERSION) return CG_E_UNSUPPORTED;
    uint32_t hb = get_u32(p + 8);
    size_t ml = get_u16(p + 12);
    if (ml == 0 || ml > CG_KVWIRE_MODEL_MAX) return CG_E_VALUE;
    size_t need = CG_KVWIRE_FIXED_BYTES + ml; /* <= 297: no overflow */
    if (hb != padded(need) || len < hb) return CG_E_VALUE;
    if (!model_ok((const char *)p + 14, ml)) return CG_E_VALUE;
    memcpy(h.model, p + 14, ml);
    const uint8_t *q = p + 14 + ml;
    h.n_layers = get_u32(q);
    h.head_dim = get_u32(q + 4);
    h.dtype = get_u32(q + 8);
    h.n_tokens = get_u32(q + 12);
    h.head_start = get_u32(q + 16);
    h.n_heads = get_u32(q + 20);
    h.total_kv_heads = get_u32(q + 24);
    h.header_bytes = hb;
    for (size_t i = need; i < hb; i++)
        if (p[i] != 0) return CG_E_VALUE; /* padding is zero, so a header has one encoding */
    size_t body = 0;
    cg_status st = cg_kvwire_payload_bytes(&h, &body);
    if (st != CG_OK) return st;
    if (len - hb != body) return CG_E_VALUE; /* truncated or trailing bytes */
    if ((uintptr_t)(p + hb) % _Alignof(float) != 0) return CG_E_VALUE;
    *hdr = h;
    *payload = (const float *)(const void *)(p + hb);
    return CG_OK;
}

void cg_kvwire_seal(const void *body, size_t len, const char *name, void *out)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, body, len);
    XXH3_128bits_update(&st, name, strlen(name));
    XXH128_canonicalFromHash((XXH128_canonical_t *)out, XXH3_128bits_digest(&st));
}

cg_status cg_kvwire_unseal(const void *buf, size_t len, const char *name, cg_kvwire_header *hdr,
                           const float **payload)
{
    *payload = NULL;
    if (!buf || len < CG_KVWIRE_SEAL_BYTES) return CG_E_VALUE;
    size_t body = len - CG_KVWIRE_SEAL_BYTES;
    uint8_t want[CG_KVWIRE_SEAL_BYTES];
    cg_kvwire_seal(buf, body, name, want);
    if (memcmp(want, (const uint8_t *)buf + body, CG_KVWIRE_SEAL_BYTES) != 0) return CG_E_VALUE;
    return cg_kvwire_decode(buf, body, hdr, payload);
}

/* Parses a decimal u32 of 1..10 digits at *s, advancing *s. Returns 0 on success. */
static int parse_u32(const char **s, uint32_t *out)
{
    const char *c = *s;
    uint64_t v = 0;
    int n = 0;
    while (*c >= '0' && *c <= '9') {
        if (++n > 10) return -1;
        v = v * 10 + (uint64_t)(*c - '0');
        c++;
    }
    if (n == 0 || v > UINT32_MAX) return -1;
    *out = (uint32_t)v;
    *s = c;
    return 0;
}

cg_status cg_kvwire_parse_heads(const char *s, uint32_t total_heads, uint32_t *start,
                                uint32_t *count)
{
    uint32_t a, b;
    if (total_heads == 0) return CG_E_VALUE;
    if (!s) {
        *start = 0;
        *count = total_heads;
        return CG_OK;
    }
    if (parse_u32(&s, &a) != 0) return CG_E_VALUE;
    b = a;
    if (*s == '-') {
        s++;
        if (parse_u32(&s, &b) != 0) return CG_E_VALUE;
    }
    if (*s != '\0' || a > b || b >= total_heads) return CG_E_VALUE;
    *start = a;
    *count = b - a + 1;
    return CG_OK;
}

cg_status cg_kvwire_head_key(const char *model, uint32_t head, const char *key_hex, char *out,
                             size_t cap)
{
    if (!model || !*model || !key_hex || strlen(key_hex) != 32) return CG_E_VALUE;
    for (int i = 0; i < 32; i++) {
        char c = key_hex[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return CG_E_VALUE;
    }
    int n = snprintf(out, cap, "%s@head:%u@%s", model, head, key_hex);
    if (n < 0 || (size_t)n >= cap) return CG_E_TOO_LARGE;
    return CG_OK;
}
