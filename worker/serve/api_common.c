/* Helpers of the worker's route handlers (worker/serve/api_common.h). */
#include "worker/serve/api_common.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/json.h"

const cg_model_config *cg_api_cfg(cg_worker_api *a)
{
    return cg_model_cfg(cg_engine_model(a->e));
}

int cg_api_admit(cg_worker_api *a, cg_http_req *req, int force)
{
    if (cg_engine_admit(a->e, force) == CG_OK) return 1;
    cg_http_add_header(req, "Retry-After", "1");
    cg_http_reply_error(req, CG_E_RATE_LIMIT, NULL,
                        "the worker is at --max-running + --max-queue requests; retry shortly");
    return 0;
}

int cg_api_client_left(void *ud)
{
    return cg_http_req_client_left(ud);
}

/* Replies 404 when the request names another model. Returns 0 when it replied. */
int cg_api_model_ok(cg_worker_api *a, cg_http_req *req, json_t *body)
{
    const char *model = NULL;
    cg_status st = cg_json_get_string(body, "model", 0, &model);
    if (st != CG_OK) {
        cg_http_reply_error(req, st, "model", "model must be a string");
        return 0;
    }
    if (model && strcmp(model, cg_api_cfg(a)->model_id) != 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "model '%.128s' is not served here; this worker serves '%s'",
                 model, cg_api_cfg(a)->model_id);
        cg_http_reply_error(req, CG_E_MODEL, "model", msg);
        return 0;
    }
    return 1;
}

/* Replies with a field error naming the field. */
void cg_api_field_error(cg_http_req *req, cg_status st, const char *field, const char *what)
{
    char msg[256];
    if (st == CG_E_MISSING)
        snprintf(msg, sizeof msg, "%s is required", field);
    else if (st == CG_E_TYPE)
        snprintf(msg, sizeof msg, "%s must be %s", field, what);
    else
        snprintf(msg, sizeof msg, "%s is out of range (%s)", field, what);
    cg_http_reply_error(req, st, field, msg);
}

int cg_api_parse_opts(cg_worker_api *a, cg_http_req *req, json_t *body, const char *mode_field,
                      cg_api_opts *o)
{
    cg_status st;
    const char *mode = NULL;
    json_t *salt = NULL;
    o->mode = CG_MODE_STRICT;
    /* /v1/assemble calls it mode, the completion routes chunk_mode: the other route's name
     * would be ignored */
    const char *other = strcmp(mode_field, "mode") ? "mode" : "chunk_mode";
    json_t *ov = json_object_get(body, other);
    if (ov && !json_is_null(ov)) {
        char msg[160];
        snprintf(msg, sizeof msg, "this route reads the isolation mode from %s, not %s", mode_field,
                 other);
        cg_http_reply_error(req, CG_E_VALUE, other, msg);
        return 0;
    }
    if ((st = cg_json_get_string(body, mode_field, 0, &mode)) != CG_OK) {
        cg_api_field_error(req, st, mode_field, "a string");
        return 0;
    }
    if (mode && cg_mode_parse(mode, &o->mode) != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be \"strict\" or \"sys\"", mode_field);
        cg_http_reply_error(req, CG_E_VALUE, mode_field, msg);
        return 0;
    }
    if ((st = cg_json_get(body, "cache_salt", JSON_STRING, 0, &salt)) != CG_OK) {
        cg_api_field_error(req, st, "cache_salt", "a string");
        return 0;
    }
    o->salt = salt ? json_string_value(salt) : NULL;
    o->salt_len = salt ? json_string_length(salt) : 0;
    long long maxpos = cg_api_cfg(a)->max_pos;
    if ((st = cg_json_get_int(body, "recompute_prefix_tokens", 0, 0, INT32_MAX, &o->recompute)) !=
        CG_OK) {
        cg_api_field_error(req, st, "recompute_prefix_tokens", "an integer >= 0");
        return 0;
    }
    if ((st = cg_json_get_number(body, "recompute_ratio", a->p.recompute_ratio, 0.0, 1.0,
                                 &o->recompute_ratio)) != CG_OK) {
        cg_api_field_error(req, st, "recompute_ratio", "a number in [0, 1]");
        return 0;
    }
    const char *select = NULL;
    o->recompute_select = a->p.recompute_select;
    if ((st = cg_json_get_string(body, "recompute_select", 0, &select)) != CG_OK) {
        cg_api_field_error(req, st, "recompute_select", "a string");
        return 0;
    }
    if (select && cg_select_parse(select, &o->recompute_select) != 0) {
        cg_http_reply_error(req, CG_E_VALUE, "recompute_select",
                            "recompute_select must be \"deviation\" or \"question\"");
        return 0;
    }
    if ((st = cg_json_get_int(body, "reserve_tokens", -1, 0, maxpos, &o->reserve)) != CG_OK) {
        cg_api_field_error(req, st, "reserve_tokens", "an integer >= 0");
        return 0;
    }
    if ((st = cg_json_get_bool(body, "add_special_tokens", 1, &o->add_special)) != CG_OK) {
        cg_api_field_error(req, st, "add_special_tokens", "a boolean");
        return 0;
    }
    if ((st = cg_json_get_bool(body, "split_special_tokens", a->p.split_special,
                               &o->split_special)) != CG_OK) {
        cg_api_field_error(req, st, "split_special_tokens", "a boolean");
        return 0;
    }
    return 1;
}

void cg_api_engine_error(cg_http_req *req, cg_status st, const char *param, const char *err)
{
    /* the engine stopped because its client left: nobody reads this, and it is no 5xx */
    int http = st == CG_E_UNAVAILABLE && cg_http_req_client_left(req) ? CG_HTTP_CLIENT_GONE
                                                                      : cg_status_http(st);
    cg_http_reply_error_status(req, http, st, param, err && err[0] ? err : NULL);
}

void cg_api_random_hex(char *out, size_t n_bytes)
{
    uint8_t b[32];
    if (n_bytes > sizeof b) n_bytes = sizeof b;
    if (getrandom(b, n_bytes, 0) != (ssize_t)n_bytes) {
        uint64_t s = cg_now_ns();
        for (size_t i = 0; i < n_bytes; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (uint8_t)(s >> 56);
        }
    }
    cg_hex_encode(b, n_bytes, out);
}
