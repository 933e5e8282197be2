/* Typed field access on jansson objects, with the project's status codes: a wrong type is
 * CG_E_TYPE, a missing required field CG_E_MISSING, a value out of range CG_E_VALUE. */
#ifndef CG_JSON_H
#define CG_JSON_H

#include <stddef.h>
#include <jansson.h>
#include "base/status.h"

/* ---- parsing untrusted request bodies ---- */
/* What a request body may hold. A parsed JSON value costs jansson about 50-100 bytes whatever
 * its text, so a body of 8 MiB of "0," would take hundreds of MiB: the values are counted (a
 * scan that allocates nothing) before anything is built. */
typedef struct cg_json_limits {
    size_t max_values;  /* values + object members; default 100000 */
    unsigned max_depth; /* nesting of arrays and objects; default 64 */
} cg_json_limits;

cg_json_limits cg_json_default_limits(void);

/* Counts without building: CG_OK, or CG_E_JSON_LIMIT with a message in msg (msglen bytes) when
 * text holds more than max_values values or nests deeper than max_depth. Not a validator:
 * malformed text is left for the parser (the counts are an upper bound for valid text). */
cg_status cg_json_check_limits(const char *text, size_t len, const cg_json_limits *l, char *msg,
                               size_t msglen) CG_WUR;

/* Parses text as one JSON object within the limits. Duplicate keys in any object are refused
 * (CG_E_JSON): a gateway and a backend that pick different copies would read different
 * requests. Returns a new reference, or NULL with *st (CG_E_JSON, CG_E_UTF8, CG_E_TYPE: not an
 * object, CG_E_JSON_LIMIT) and a message in msg. */
json_t *cg_json_parse_object(const char *text, size_t len, const cg_json_limits *l, cg_status *st,
                             char *msg, size_t msglen);

/* ---- JSON field helpers: on a type error they return CG_E_TYPE / CG_E_MISSING ---- */
/* *out is borrowed from obj; absent and not required -> CG_OK with *out = NULL. */
cg_status cg_json_get(json_t *obj, const char *name, json_type type, int required,
                      json_t **out) CG_WUR;
/* Convenience wrappers; def is used when absent. */
cg_status cg_json_get_string(json_t *obj, const char *name, int required, const char **out) CG_WUR;
cg_status cg_json_get_int(json_t *obj, const char *name, long long def, long long min,
                          long long max, long long *out) CG_WUR;
cg_status cg_json_get_number(json_t *obj, const char *name, double def, double min, double max,
                             double *out) CG_WUR;
cg_status cg_json_get_bool(json_t *obj, const char *name, int def, int *out) CG_WUR;

#endif
