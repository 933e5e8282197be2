/* Chunk keys: XXH3-128 over a canonical length-prefixed encoding. DESIGN §4.
 * The encoding is documented byte for byte in README.md ("Chunk key encoding"). */
#ifndef CG_KEY_H
#define CG_KEY_H

#include <stddef.h>
#include <stdint.h>

typedef struct cg_key {
    uint8_t b[16]; /* XXH3-128 canonical (big-endian) byte order */
} cg_key;

#define CG_KEY_HEX_LEN 32
#define CG_KEY_VERSION "chunkgate-key-v1"

typedef enum { CG_MODE_STRICT, CG_MODE_SYS } cg_mode;

/* "strict" / "sys"; static storage. */
const char *cg_mode_name(cg_mode m);
/* Parses a mode name; returns 0 on success, -1 if unknown. */
int cg_mode_parse(const char *s, cg_mode *out);

/* Computes a segment key. model and salt are borrowed byte strings (salt may be NULL with
 * salt_len 0). sys_key is the system segment's key in mode sys, NULL otherwise (the system
 * segment's own key is computed with sys_key NULL). */
cg_key cg_key_compute(const char *model, size_t model_len, cg_mode mode, const char *salt,
                      size_t salt_len, const cg_key *sys_key, const char *text, size_t text_len);

/* 32 lowercase hex characters + NUL into out. */
void cg_key_hex(const cg_key *k, char out[CG_KEY_HEX_LEN + 1]);
/* Parses exactly 32 hex characters (NUL-terminated); returns 0 on success, -1 otherwise. */
int cg_key_parse(const char *hex, cg_key *out);
int cg_key_equal(const cg_key *a, const cg_key *b);

#endif
