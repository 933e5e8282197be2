/* Per-head KV wire format (DESIGN §7, §8): the binary body of GET /v1/chunks/{key}/kv and
 * GET /v1/assemblies/{id}/kv. A small little-endian header, then per head, per layer, K then
 * V, each [n_tokens][head_dim] f32 LE. Byte-for-byte layout: docs/worker.md ("Per-head KV wire
 * format") and openapi/worker.yaml. The decoder is strict: it is fed untrusted network bytes. */
#ifndef CG_KVWIRE_H
#define CG_KVWIRE_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/status.h"

#define CG_KVWIRE_MAGIC "CGKV"
#define CG_KVWIRE_VERSION 1
#define CG_KVWIRE_DTYPE_F32 0
/* Longest model id in a header. */
#define CG_KVWIRE_MODEL_MAX 255
/* Header size without the model id: magic, version, header_bytes, model length, 7 u32. */
#define CG_KVWIRE_FIXED_BYTES 42
/* The header is zero-padded to a multiple of this, so the payload of a malloc'd buffer is
 * float-aligned. */
#define CG_KVWIRE_ALIGN 8
/* Geometry fields above this are refused (far beyond any model; keeps sizes sane). */
#define CG_KVWIRE_DIM_MAX 65535u

typedef struct cg_kvwire_header {
    char model[CG_KVWIRE_MODEL_MAX + 1]; /* NUL-terminated; 1..255 bytes, no control chars */
    uint32_t n_layers;                   /* 1..CG_KVWIRE_DIM_MAX */
    uint32_t head_dim;                   /* 1..CG_KVWIRE_DIM_MAX */
    uint32_t dtype;                      /* CG_KVWIRE_DTYPE_F32 */
    uint32_t n_tokens;                   /* >= 1 */
    uint32_t head_start;                 /* first KV head in this payload */
    uint32_t n_heads;        /* >= 1 heads in this payload: head_start .. head_start+n_heads-1 */
    uint32_t total_kv_heads; /* the model's KV heads, 1..CG_KVWIRE_DIM_MAX, >= start+n_heads */
    uint32_t header_bytes;   /* set by encode/decode: bytes before the payload */
} cg_kvwire_header;

/* Checks every field of h (ignores header_bytes). CG_OK, CG_E_UNSUPPORTED for an unknown
 * dtype, CG_E_VALUE otherwise. */
cg_status cg_kvwire_validate(const cg_kvwire_header *h) CG_WUR;
/* Encoded header size of h (padded to CG_KVWIRE_ALIGN), 0 when the model id is invalid. */
size_t cg_kvwire_header_size(const cg_kvwire_header *h);
/* Payload bytes n_heads * n_layers * 2 * n_tokens * head_dim * 4 into *out; CG_E_VALUE when
 * h is invalid or the size overflows size_t. */
cg_status cg_kvwire_payload_bytes(const cg_kvwire_header *h, size_t *out) CG_WUR;
/* Float index in the payload of the rows [n_tokens][head_dim] of head head_start + head_rel,
 * layer, kv (0 = K, 1 = V). h must be valid and the indexes in range. */
size_t cg_kvwire_rows_offset(const cg_kvwire_header *h, uint32_t head_rel, uint32_t layer, int kv);

/* Writes the header of h into out (cap bytes) and its size into *n (h->header_bytes is not
 * read). CG_E_VALUE when h is invalid (CG_E_UNSUPPORTED for the dtype), CG_E_TOO_LARGE when
 * cap is short. For streaming: send the header, then the rows in payload order. */
cg_status cg_kvwire_header_encode(const cg_kvwire_header *h, void *out, size_t cap,
                                  size_t *n) CG_WUR;

/* Fills rows[n_tokens][head_dim] with K (kv 0) or V (kv 1) of one layer and one KV head
 * (the absolute head index, head_start <= head < head_start + n_heads). */
typedef void (*cg_kvwire_rows_fn)(void *ud, uint32_t layer, uint32_t head, int kv, float *rows);

/* Appends the whole body to out: the header, then for each head in the range, for each
 * layer, K rows then V rows, as fn gives them. Returns CG_E_VALUE / CG_E_UNSUPPORTED for an
 * invalid h, CG_E_TOO_LARGE when out's cap is reached (out then holds a partial body). */
cg_status cg_kvwire_encode(const cg_kvwire_header *h, cg_kvwire_rows_fn fn, void *ud,
                           cg_buf *out) CG_WUR;

/* Decodes a whole body of len bytes. Validates the magic, version, header size and padding,
 * every field, and that len is exactly header + payload. On CG_OK *hdr is filled and
 * *payload points into buf at the first float (borrowed: valid while buf is); buf must be
 * 4-byte aligned (malloc'd memory is). Returns CG_E_UNSUPPORTED for an unknown version or
 * dtype, CG_E_VALUE for anything else malformed; never reads outside buf[0..len). */
cg_status cg_kvwire_decode(const void *buf, size_t len, cg_kvwire_header *hdr,
                           const float **payload) CG_WUR;

/* Parses the ?heads= value: "a" or "a-b" (inclusive, decimal), 0 <= a <= b < total_heads,
 * into *start and *count. s == NULL means all heads. CG_E_VALUE when malformed or out of
 * range (including total_heads == 0). */
cg_status cg_kvwire_parse_heads(const char *s, uint32_t total_heads, uint32_t *start,
                                uint32_t *count) CG_WUR;

/* Sealed values (the shared KV tier on Redis, DESIGN §16): a body as cg_kvwire_encode writes
 * it, followed by CG_KVWIRE_SEAL_BYTES bytes: the XXH3-128 (canonical, big-endian bytes) of
 * the body followed by the name the value is stored under (its per-head key string). The
 * name binds a value to its key, so a value copied under another key fails like a corrupt
 * one; the header catches another model or geometry. Byte layout: docs/worker.md ("Shared KV
 * tier"). */
#define CG_KVWIRE_SEAL_BYTES 16

/* Writes the seal of body (len bytes) stored under name (NUL-terminated) into out
 * (CG_KVWIRE_SEAL_BYTES bytes; append them to the body). */
void cg_kvwire_seal(const void *body, size_t len, const char *name, void *out);

/* Checks the seal of a sealed value of len bytes stored under name, then decodes its body
 * like cg_kvwire_decode (*payload points into buf; buf 4-byte aligned). Returns CG_E_VALUE
 * when the value is shorter than a seal, the seal does not match (corrupt, truncated, or
 * stored under another name) or the body is malformed; CG_E_UNSUPPORTED for an unknown
 * version or dtype. Never reads outside buf[0..len). */
cg_status cg_kvwire_unseal(const void *buf, size_t len, const char *name, cg_kvwire_header *hdr,
                           const float **payload) CG_WUR;

/* Formats the per-head key string "{model}@head:{head}@{key_hex}" into out (cap bytes,
 * NUL-terminated). key_hex must be 32 lowercase hex characters and model non-empty
 * (CG_E_VALUE); CG_E_TOO_LARGE when out is short. */
cg_status cg_kvwire_head_key(const char *model, uint32_t head, const char *key_hex, char *out,
                             size_t cap) CG_WUR;

#endif
