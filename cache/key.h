/* Chunk keys: XXH3-128 (default) or the first 16 bytes of SHA-256 over a canonical
 * length-prefixed encoding. DESIGN §4. The encoding is documented byte for byte in README.md
 * ("Chunk key encoding"). */
#ifndef CG_KEY_H
#define CG_KEY_H

#include <stddef.h>
#include <stdint.h>
#include "cache/split.h"

typedef struct cg_key {
    uint8_t b[16]; /* XXH3-128 canonical (big-endian) byte order, or SHA-256 bytes 0..15 */
} cg_key;

#define CG_KEY_HEX_LEN 32
#define CG_KEY_VERSION "chunkgate-key-v1"

typedef enum { CG_MODE_STRICT, CG_MODE_SYS } cg_mode;

/* "strict", "sys" in cg_mode order, NULL-terminated (the values of --chunk-mode). */
extern const char *const cg_mode_names[];
/* "strict" / "sys"; static storage. */
const char *cg_mode_name(cg_mode m);
/* Parses a mode name; returns 0 on success, -1 if unknown. */
int cg_mode_parse(const char *s, cg_mode *out);

/* How a worker's recompute_ratio chooses the chunk tokens it recomputes. */
typedef enum {
    /* CacheBlend: the tokens whose K/V at layer 1 deviate most from a full-attention pass */
    CG_SELECT_DEVIATION,
    /* the tokens the question attends to most (ProphetKV): the question's queries in every
     * layer, over the placed KV, summed per token; a prompt without a question falls back to
     * deviation */
    CG_SELECT_QUESTION,
} cg_select;
/* "deviation", "question" in cg_select order, NULL-terminated (the values of
 * --recompute-select). */
extern const char *const cg_select_names[];
/* Parses a selection name; returns 0 on success, -1 if unknown. */
int cg_select_parse(const char *s, cg_select *out);

/* The hash over the encoding. XXH3-128 is fast but not built to resist crafted collisions;
 * SHA-256 (its first 16 bytes) is, at a higher cost. Gateway and workers must use the same. */
typedef enum { CG_KEY_HASH_XXH3, CG_KEY_HASH_SHA256 } cg_key_hash;

/* "xxhash", "sha256" in cg_key_hash order, NULL-terminated (the values of --key-hash). */
extern const char *const cg_key_hash_names[];
/* "xxhash" / "sha256" (the names of --key-hash and of key_hash in /v1/info); static storage. */
const char *cg_key_hash_name(cg_key_hash h);
/* Parses "xxhash" (alias "xxh3") or "sha256"; returns 0 on success, -1 if unknown. */
int cg_key_hash_parse(const char *s, cg_key_hash *out);
/* Sets the process-wide hash that cg_key_compute uses (default CG_KEY_HASH_XXH3). Call it once
 * at startup, before any thread computes keys. */
void cg_key_set_hash(cg_key_hash h);
cg_key_hash cg_key_get_hash(void);

/* Computes a segment key with the process-wide hash (cg_key_set_hash). model and salt are borrowed
 * byte strings (salt may be NULL with salt_len 0). sys_key is the system segment's key in mode sys,
 * NULL otherwise (the system segment's own key is computed with sys_key NULL). */
cg_key cg_key_compute(const char *model, size_t model_len, cg_mode mode, const char *salt,
                      size_t salt_len, const cg_key *sys_key, const char *text, size_t text_len);
/* The same with an explicit hash. */
cg_key cg_key_compute_with(cg_key_hash h, const char *model, size_t model_len, cg_mode mode,
                           const char *salt, size_t salt_len, const cg_key *sys_key,
                           const char *text, size_t text_len);

/* One segment of a request, as the key loop sees it (text borrowed). */
typedef struct cg_key_seg {
    cg_role role;
    const char *text;
    size_t len;
} cg_key_seg;

/* What every key of a request shares (all borrowed; salt may be NULL with salt_len 0). */
typedef struct cg_key_scope {
    const char *model;
    size_t model_len;
    cg_mode mode;
    const char *salt;
    size_t salt_len;
    /* The system segment is tokenized without BOS (add_special_tokens: false). In mode sys a
     * chunk's KV depends on it, so its key does too (README "Chunk key encoding", field 5). */
    int sys_no_bos;
} cg_key_scope;

/* The keys of a request's segments, in prompt order: the one loop both programs run, so the
 * gateway's keys and the worker's are computed the same way (DESIGN §4). keys[i] is the key
 * of segs[i]. In mode sys the key of every segment after a leading system segment chains the
 * system segment's key. A question segment is cacheable nowhere: its key is computed only
 * when with_question is set (the worker reports it), else keys[i] is zeroed. */
void cg_key_request(const cg_key_scope *scope, const cg_key_seg *segs, size_t n, int with_question,
                    cg_key *keys);

/* The tenant id of an API key: lowercase hex of the first 16 bytes of
 * SHA-256("chunkgate-tenant-v1" || 0x00 || key), whatever the key hash. The gateway salts the
 * keys of an authenticated request with it, so the raw API key never enters a key, a log or a
 * worker request. key is borrowed (len bytes). */
void cg_key_tenant_id(const char *key, size_t len, char out[CG_KEY_HEX_LEN + 1]);

/* 32 lowercase hex characters + NUL into out. */
void cg_key_hex(const cg_key *k, char out[CG_KEY_HEX_LEN + 1]);
/* Parses exactly 32 hex characters (NUL-terminated); returns 0 on success, -1 otherwise. */
int cg_key_parse(const char *hex, cg_key *out);
int cg_key_equal(const cg_key *a, const cg_key *b);

#endif
