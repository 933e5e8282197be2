/* Prompt splitter: "system # # chunk # # ... # # question" into trimmed segments with roles.
 * Zero-copy: segments are offsets into the caller's text. DESIGN §3. */
#ifndef CG_SPLIT_H
#define CG_SPLIT_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

/* The separator of prompt segments unless configured otherwise (DESIGN §3; LMCache blend
 * mode uses the same one). */
#define CG_SPLIT_DEFAULT_SEPARATOR "# #"

typedef enum { CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_QUESTION } cg_role;

/* "system" / "chunk" / "question"; static storage. */
const char *cg_role_name(cg_role r);

typedef struct cg_segment {
    size_t off; /* byte offset of the trimmed segment in the text */
    size_t len; /* trimmed length in bytes, > 0 (the text after the last separator keeps its
                   trailing whitespace: the model continues from it) */
    cg_role role;
} cg_segment;

typedef struct cg_split_params {
    const char *separator;    /* borrowed; default CG_SPLIT_DEFAULT_SEPARATOR */
    size_t max_segments;      /* default 256; more non-empty segments -> CG_E_SEGMENTS */
    size_t max_segment_bytes; /* default 0 = no limit; larger -> CG_E_SEGMENT_SIZE */
    int check_utf8;           /* default 1: invalid UTF-8 anywhere in text -> CG_E_UTF8 */
} cg_split_params;

cg_split_params cg_split_default_params(void);

typedef struct cg_split_result {
    cg_segment *segs; /* owned; free with cg_split_result_free */
    size_t n;
    size_t cap;
    size_t empty_skipped; /* segments that were empty after trimming */
    int passthrough;      /* 1: no separator in the text (or fewer than two non-empty
                             segments); the request goes on unchanged and segs is empty */
} cg_split_result;

/* Splits text[0..len) by p->separator (literal, not a pattern).
 * Roles: first non-empty segment system, last question, those between chunk.
 * The result may be reused across calls (it is reset first). Returns CG_OK, CG_E_UTF8,
 * CG_E_SEGMENTS, CG_E_SEGMENT_SIZE or CG_E_VALUE (empty separator). */
cg_status cg_split_prompt(const char *text, size_t len, const cg_split_params *p,
                          cg_split_result *out) CG_WUR;
void cg_split_result_free(cg_split_result *r);

/* Returns 1 if s[0..len) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int cg_utf8_valid(const char *s, size_t len);

#endif
