/* The pass-through fast path: a completions request that changes nothing on its way (no
 * separator in its prompt, no extension field, not streamed, a --backend to take it) is
 * checked by a scan of its bytes that builds nothing, and its original bytes are forwarded,
 * on the HTTP thread that read it. Anything else, or anything the scan is not sure of, takes
 * the ordinary path (jansson, split, keys, the job pool), which gives the same answer, only
 * slower; in particular every error is answered by the ordinary path. */
#ifndef CG_GW_FASTPATH_H
#define CG_GW_FASTPATH_H

#include <stddef.h>
#include "base/http.h"
#include "base/json.h"

/* One top-level member of a scanned object: raw text between the key's quotes, and the raw
 * text of the value (a string's includes its quotes). */
typedef struct cg_fast_member {
    const char *key, *val;
    size_t key_len, val_len;
    char type;   /* 's' string, 'n' number, 't' true, 'f' false, 'z' null, 'a' array */
    int escaped; /* a string value holding a backslash escape (its raw text is not its value) */
} cg_fast_member;

/* Scans text as one JSON object whose values are strings, numbers, true/false/null or arrays
 * of those (no nested object), every string valid UTF-8, keys without escapes and unique,
 * within the limits. Conservative: returns 1 only for text that jansson (json_loadb with
 * JSON_REJECT_DUPLICATES) parses into exactly those members with those values; 0 for
 * anything else, valid or not (numbers with an exponent or over 24 characters, \u0000, lone
 * surrogates, more than max_members members, ...). Fills m[0..*n). */
int cg_gw_fast_scan(const char *text, size_t len, const cg_json_limits *l, cg_fast_member *m,
                    size_t max_members, size_t *n);

/* Tried on the HTTP thread before a /v1/completions request goes to the job pool: takes the
 * request (and returns 1) when it is a pass-through to --backend that the fast path can
 * forward unchanged; 0 otherwise (nothing done). app is the cg_gateway. */
int cg_gw_completions_fast(cg_http_req *req, void *app);

#endif
