/* Typed field access on jansson objects, with the project's status codes: a wrong type is
 * CG_E_TYPE, a missing required field CG_E_MISSING, a value out of range CG_E_VALUE. */
#ifndef CG_JSON_H
#define CG_JSON_H

#include <jansson.h>
#include "base/status.h"

/* ---- JSON field helpers: on a type error they return CG_E_TYPE / CG_E_MISSING ---- */
/* *out is borrowed from obj; absent and not required -> CG_OK with *out = NULL. */
cg_status cg_json_get(json_t *obj, const char *name, json_type type, int required, json_t **out) CG_WUR;
/* Convenience wrappers; def is used when absent. */
cg_status cg_json_get_string(json_t *obj, const char *name, int required, const char **out) CG_WUR;
cg_status cg_json_get_int(json_t *obj, const char *name, long long def, long long min, long long max,
                          long long *out) CG_WUR;
cg_status cg_json_get_number(json_t *obj, const char *name, double def, double min, double max,
                             double *out) CG_WUR;
cg_status cg_json_get_bool(json_t *obj, const char *name, int def, int *out) CG_WUR;

#endif
