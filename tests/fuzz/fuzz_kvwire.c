/* Fuzz target for the per-head KV wire format (kv/kvwire.c), which the gateway and other
 * workers read from the network. Input: [mode][bytes...]; mode % 4:
 *  0: cg_kvwire_decode of the bytes (a heap copy of exactly their size, 8-byte aligned);
 *  1: the same at an odd address (the decoder must refuse, not fault);
 *  2: cg_kvwire_parse_heads: [total_heads u32 LE][the ?heads= string, cut at a NUL];
 *  3: cg_kvwire_head_key: [head u32][cap u8][model][0xFF][key hex].
 * Invariants: decode never reads outside the buffer; a decoded body is exactly header +
 * payload, its header validates and re-encodes to the same bytes, and the whole body
 * re-encodes byte for byte from its rows; parse_heads agrees with a reference parser;
 * head_key writes what snprintf would, within cap. */
#include "fuzz_common.h"

#include <stdbool.h>

#include "base/base.h"
#include "kv/kvwire.h"

typedef struct rows_src {
    const cg_kvwire_header *h;
    const float *payload;
} rows_src;

static void rows_from_payload(void *ud, uint32_t layer, uint32_t head, int kv, float *rows)
{
    const rows_src *s = ud;
    FUZZ_CHECK(head >= s->h->head_start && head - s->h->head_start < s->h->n_heads);
    FUZZ_CHECK(layer < s->h->n_layers && (kv == 0 || kv == 1));
    size_t off = cg_kvwire_rows_offset(s->h, head - s->h->head_start, layer, kv);
    memcpy(rows, s->payload + off, (size_t)s->h->n_tokens * s->h->head_dim * sizeof(float));
}

static void decode(const uint8_t *data, size_t size, int misalign)
{
    /* malloc'd memory is 16-byte aligned; +1 makes the payload unaligned */
    uint8_t *mem = malloc(size + (size_t)misalign + 1);
    if (!mem) abort();
    uint8_t *buf = mem + misalign;
    if (size) memcpy(buf, data, size);
    cg_kvwire_header h;
    const float *payload = (const float *)1;
    cg_status st = cg_kvwire_decode(buf, size, &h, &payload);
    if (st != CG_OK) {
        FUZZ_CHECK(st == CG_E_VALUE || st == CG_E_UNSUPPORTED);
        FUZZ_CHECK(payload == NULL);
        goto out;
    }
    FUZZ_CHECK(!misalign || ((uintptr_t)buf + h.header_bytes) % 4 == 0);
    FUZZ_CHECK(cg_kvwire_validate(&h) == CG_OK);
    FUZZ_CHECK(h.header_bytes <= size && h.header_bytes % CG_KVWIRE_ALIGN == 0);
    FUZZ_CHECK(cg_kvwire_header_size(&h) == h.header_bytes);
    FUZZ_CHECK((const uint8_t *)payload == buf + h.header_bytes);
    size_t body = 0;
    FUZZ_CHECK(cg_kvwire_payload_bytes(&h, &body) == CG_OK && body == size - h.header_bytes);
    /* the header has one encoding */
    uint8_t head[CG_KVWIRE_FIXED_BYTES + CG_KVWIRE_MODEL_MAX + CG_KVWIRE_ALIGN];
    size_t hn = 0;
    FUZZ_CHECK(cg_kvwire_header_encode(&h, head, sizeof head, &hn) == CG_OK);
    FUZZ_CHECK(hn == h.header_bytes && memcmp(head, buf, hn) == 0);
    FUZZ_CHECK(cg_kvwire_header_encode(&h, head, hn - 1, &hn) == CG_E_TOO_LARGE);
    /* the last rows end exactly at the end of the payload */
    size_t last = cg_kvwire_rows_offset(&h, h.n_heads - 1, h.n_layers - 1, 1);
    FUZZ_CHECK((last + (size_t)h.n_tokens * h.head_dim) * sizeof(float) == body);
    /* and the whole body comes back byte for byte from its rows */
    cg_buf out;
    cg_buf_init(&out, size);
    rows_src src = {&h, payload};
    FUZZ_CHECK(cg_kvwire_encode(&h, rows_from_payload, &src, &out) == CG_OK);
    FUZZ_CHECK(out.len == size && memcmp(out.data, buf, size) == 0);
    cg_buf_free(&out);
    if (size > h.header_bytes) {
        cg_buf small;
        cg_buf_init(&small, size - 1);
        FUZZ_CHECK(cg_kvwire_encode(&h, rows_from_payload, &src, &small) == CG_E_TOO_LARGE);
        cg_buf_free(&small);
    }
out:
    free(mem);
}

/* "a" or "a-b", 1..10 decimal digits each, a <= b < total. */
static bool ref_heads(const char *s, uint32_t total, uint32_t *start, uint32_t *count)
{
    uint64_t v[2] = {0, 0};
    int k = 0;
    const char *c = s;
    for (;;) {
        int digits = 0;
        while (*c >= '0' && *c <= '9') {
            if (++digits > 10) return false;
            v[k] = v[k] * 10 + (uint64_t)(*c++ - '0');
        }
        if (!digits || v[k] > UINT32_MAX) return false;
        if (*c == '-' && k == 0) {
            c++;
            k = 1;
            continue;
        }
        break;
    }
    if (*c) return false;
    if (k == 0) v[1] = v[0];
    if (total == 0 || v[0] > v[1] || v[1] >= total) return false;
    *start = (uint32_t)v[0];
    *count = (uint32_t)(v[1] - v[0] + 1);
    return true;
}

static void heads(fuzz_in *in)
{
    uint32_t total = fuzz_u32(in);
    if (total > 4096 && (total & 1)) total %= 4096; /* keep small totals frequent */
    char *s = fuzz_strndup(in->p, in->n);
    uint32_t a = 7, n = 7, ra = 0, rn = 0;
    cg_status st = cg_kvwire_parse_heads(s, total, &a, &n);
    bool ok = ref_heads(s, total, &ra, &rn);
    FUZZ_CHECK((st == CG_OK) == ok);
    if (ok)
        FUZZ_CHECK(a == ra && n == rn && n >= 1 && (uint64_t)a + n <= total);
    else
        FUZZ_CHECK(st == CG_E_VALUE);
    st = cg_kvwire_parse_heads(NULL, total, &a, &n);
    FUZZ_CHECK(total ? st == CG_OK && a == 0 && n == total : st == CG_E_VALUE);
    free(s);
}

static void head_key(fuzz_in *in)
{
    uint32_t head = fuzz_u32(in);
    size_t cap = fuzz_u8(in), ml, kl;
    const uint8_t *m = fuzz_field(in, 0xFF, &ml);
    const uint8_t *k = fuzz_field(in, 0xFF, &kl);
    char *model = fuzz_strndup(m, ml), *hex = fuzz_strndup(k, kl);
    char *out = malloc(cap ? cap : 1), want[1024];
    if (!out) abort();
    cg_status st = cg_kvwire_head_key(model, head, hex, out, cap);
    int hex_ok = strlen(hex) == 32;
    for (size_t i = 0; i < 32 && hex_ok; i++)
        hex_ok = (hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f');
    if (!*model || !hex_ok) {
        FUZZ_CHECK(st == CG_E_VALUE);
    } else {
        int n = snprintf(want, sizeof want, "%s@head:%u@%s", model, head, hex);
        if ((size_t)n >= cap) {
            FUZZ_CHECK(st == CG_E_TOO_LARGE);
        } else {
            FUZZ_CHECK(st == CG_OK && strcmp(out, want) == 0);
        }
    }
    free(out);
    free(model);
    free(hex);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_in in = {data, size};
    uint8_t mode = fuzz_u8(&in);
    switch (mode % 4) {
    case 0:
        decode(in.p, in.n, 0);
        break;
    case 1:
        decode(in.p, in.n, 1);
        break;
    case 2:
        heads(&in);
        break;
    default:
        head_key(&in);
        break;
    }
    return 0;
}
