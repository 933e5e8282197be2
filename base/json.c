/* Typed field access on jansson objects (base/json.h). */
#include "base/json.h"

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
