/* Typed field access on jansson objects, and parsing untrusted bodies within limits
 * (base/json.h). */
#include "base/json.h"

#include <stdio.h>
#include <string.h>

cg_json_limits cg_json_default_limits(void)
{
    cg_json_limits l = {.max_values = 100000, .max_depth = 64};
    return l;
}

cg_status cg_json_check_limits(const char *text, size_t len, const cg_json_limits *l, char *msg,
                               size_t msglen)
{
    const char *p = text, *e = text + len;
    size_t values = 1;
    unsigned depth = 0;
    while (p < e) {
        switch (*p) {
        case '"': { /* skip the string: to the next quote not escaped by an odd run of \ */
            const char *s = ++p;
            for (;;) {
                const char *q = memchr(p, '"', (size_t)(e - p));
                if (!q) return CG_OK; /* unterminated: the parser says so */
                size_t k = 0;
                while (q - k > s && q[-1 - (ptrdiff_t)k] == '\\')
                    k++;
                p = q + 1;
                if (!(k & 1)) break;
            }
            continue;
        }
        case '[':
        case '{':
            if (++depth > l->max_depth) {
                snprintf(msg, msglen, "request JSON nests deeper than %u levels", l->max_depth);
                return CG_E_JSON_LIMIT;
            }
            __attribute__((fallthrough)); /* a container is a value */
        case ',':
            if (++values > l->max_values) {
                snprintf(msg, msglen, "request JSON holds more than %zu values", l->max_values);
                return CG_E_JSON_LIMIT;
            }
            break;
        case ']':
        case '}':
            if (depth) depth--;
            break;
        default:
            break;
        }
        p++;
    }
    return CG_OK;
}

json_t *cg_json_parse_object(const char *text, size_t len, const cg_json_limits *l, cg_status *st,
                             char *msg, size_t msglen)
{
    if (!len) {
        *st = CG_E_JSON;
        snprintf(msg, msglen, "request body is empty; expected a JSON object");
        return NULL;
    }
    if ((*st = cg_json_check_limits(text, len, l, msg, msglen)) != CG_OK) return NULL;
    json_error_t err;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!j) {
        *st = json_error_code(&err) == json_error_invalid_utf8 ? CG_E_UTF8 : CG_E_JSON;
        snprintf(msg, msglen, "invalid JSON at line %d column %d: %s", err.line, err.column,
                 err.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *st = CG_E_TYPE;
        snprintf(msg, msglen, "request body must be a JSON object");
        return NULL;
    }
    *st = CG_OK;
    return j;
}

cg_status cg_json_get(json_t *obj, const char *name, json_type type, int required, json_t **out)
{
    json_t *v = json_object_get(obj, name);
    *out = NULL;
    if (!v || json_is_null(v)) return required ? CG_E_MISSING : CG_OK;
    if (json_typeof(v) != type) return CG_E_TYPE;
    *out = v;
    return CG_OK;
}

cg_status cg_json_get_string(json_t *obj, const char *name, int required, const char **out)
{
    json_t *v;
    cg_status st = cg_json_get(obj, name, JSON_STRING, required, &v);
    *out = v ? json_string_value(v) : NULL;
    return st;
}

cg_status cg_json_get_int(json_t *obj, const char *name, long long def, long long min,
                          long long max, long long *out)
{
    json_t *v = json_object_get(obj, name);
    *out = def;
    if (!v || json_is_null(v)) return CG_OK;
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* Range first: casting a double outside long long is undefined behaviour (found by
         * tests/fuzz/fuzz_json_request with "max_tokens": 1e300). */
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return CG_E_VALUE;
        if (d != (double)(long long)d) return CG_E_TYPE;
        *out = (long long)d;
    } else if (json_is_integer(v))
        *out = json_integer_value(v);
    else
        return CG_E_TYPE;
    return *out < min || *out > max ? CG_E_VALUE : CG_OK;
}

cg_status cg_json_get_number(json_t *obj, const char *name, double def, double min, double max,
                             double *out)
{
    json_t *v = json_object_get(obj, name);
    *out = def;
    if (!v || json_is_null(v)) return CG_OK;
    if (!json_is_number(v)) return CG_E_TYPE;
    *out = json_number_value(v);
    return *out < min || *out > max ? CG_E_VALUE : CG_OK;
}

cg_status cg_json_get_bool(json_t *obj, const char *name, int def, int *out)
{
    json_t *v = json_object_get(obj, name);
    *out = def;
    if (!v || json_is_null(v)) return CG_OK;
    if (!json_is_boolean(v)) return CG_E_TYPE;
    *out = json_is_true(v);
    return CG_OK;
}
