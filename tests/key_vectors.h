/* The pinned chunk-key vectors shared by test_key (XXH3-128) and test_keyhash (SHA-256): six
 * inputs of the canonical encoding and their keys, computed once, independently of this code
 * base, with Python (xxhash 0.8.1 and hashlib):
 *   enc = b"".join(len(f).to_bytes(8, "little") + f for f in fields)
 *   xxhash.xxh3_128_hexdigest(enc);  hashlib.sha256(enc).hexdigest()[:32]
 * A change of the encoding, the field order or the byte order of the key fails there. */
#ifndef CG_TEST_KEY_VECTORS_H
#define CG_TEST_KEY_VECTORS_H

#include <string.h>

#include "cache/key.h"

/* The system key of the sys-mode vector: bytes 0x00..0x0f. */
static const cg_key SYS_KEY = {{0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
                                0x0b, 0x0c, 0x0d, 0x0e, 0x0f}};

typedef struct key_vector {
    const char *model, *salt, *text;
    cg_mode mode;
    const cg_key *sys;
    const char *xxh, *sha;
} key_vector;

/* The vectors (static storage); *n gets their count. */
static inline const key_vector *key_vectors(size_t *n)
{
    static char x1000[1001];
    static const char grusse[] = "Gr\xC3\xBC\xC3\x9F"
                                 "e, \xE4\xB8\x96\xE7\x95\x8C";
    static const key_vector v[] = {
        {"tiny-llama", "", "hello world", CG_MODE_STRICT, NULL, "3d66d47f0c6ab0ef02f5a9b0263224f5",
         "2b4ce80937a368f0dabd1da3b019a795"},
        {"tiny-llama", "tenant-a", "Document A.", CG_MODE_SYS, &SYS_KEY,
         "9b33b2aff5ac8fa2c69006478c488a70", "833519ee6be9a4af1b655e5dc476fb2e"},
        {"m", "", "", CG_MODE_STRICT, NULL, "de520ea750b25fb877f992029de4d6f0",
         "b5ed2f2f574b255a894d3c3f68913915"},
        {"tiny-llama", "", "You are a careful assistant.", CG_MODE_SYS, NULL,
         "c36f67c70e96a86e4d456bd7172f81fe", "45fc49f777b6db5f1641eabe17dc6181"},
        {"tiny-llama", "", grusse, CG_MODE_STRICT, NULL, "205ac4dd805ad19a03b660b1e3ab9bbf",
         "2ff9a81e9e9f47eddc5a55856a36c72e"},
        {"tiny-llama", "salt", x1000, CG_MODE_STRICT, NULL, "35ccfae14a730900aa7073433f949c8f",
         "760d03abda5338f05f18ba9310c882ac"},
    };
    memset(x1000, 'x', 1000);
    *n = sizeof v / sizeof v[0];
    return v;
}

#endif
