/* The worker's assembly routes: POST /v1/assemble and DELETE /v1/assemblies/{id}. */
#include "worker/serve/api_assemble.h"

#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "base/tier.h"
#include "worker/serve/api_common.h"

static const char *role_parse(const char *s, cg_role *out)
{
    static const cg_role roles[] = {CG_ROLE_SYSTEM, CG_ROLE_CHUNK, CG_ROLE_QUESTION};
    for (size_t i = 0; i < CG_ARRAY_LEN(roles); i++)
        if (s && !strcmp(s, cg_role_name(roles[i]))) {
            *out = roles[i];
            return s;
        }
    return NULL;
}

static json_t *assembly_json(cg_worker_api *a, const cg_assembly_info *info)
{
    json_t *segs = json_array(), *ev = json_array(), *sp = json_array();
    char hex[CG_KEY_HEX_LEN + 1];
    for (size_t i = 0; i < info->n_segs; i++) {
        const cg_engine_seg_result *s = &info->segs[i];
        cg_key_hex(&s->key, hex);
        json_array_append_new(segs,
                              json_pack("{s:s, s:s, s:i, s:i, s:b, s:s, s:b}", "key", hex, "role",
                                        cg_role_name(s->role), "offset", (int)s->offset, "n_tokens",
                                        (int)s->n_tokens, "hit", s->hit, "tier",
                                        cg_tier_seg_name(s->hit, s->tier), "stored", s->stored));
    }
    for (size_t i = 0; i < info->n_evicted; i++) {
        cg_key_hex(&info->evicted[i], hex);
        json_array_append_new(ev, json_string(hex));
    }
    for (size_t i = 0; i < info->n_spilled; i++) {
        cg_key_hex(&info->spilled[i], hex);
        json_array_append_new(sp, json_string(hex));
    }
    return json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:I}", "object",
                     "assembly", "assembly_id", info->id, "model", cg_api_cfg(a)->model_id,
                     "n_tokens", (int)info->n_tokens, "cached_tokens", (int)info->cached_tokens,
                     "computed_tokens", (int)info->computed_tokens, "recomputed_tokens",
                     (int)info->recomputed_tokens, "segments", segs, "evicted", ev, "spilled", sp,
                     "ttl_ms", (json_int_t)info->ttl_ms);
}

void cg_api_assemble(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    json_t *body = cg_http_req_json(req);
    cg_engine_seg *segs = NULL;
    cg_key *keys = NULL;
    cg_assembly_info info = {0};
    char err[512], field[64];
    int admitted = 0;
    if (!body) return;
    if (!cg_api_admit(a, req, 0)) {
        json_decref(body);
        return;
    }
    admitted = 1;
    if (!cg_api_model_ok(a, req, body)) goto out;
    cg_api_opts o;
    if (!cg_api_parse_opts(a, req, body, "mode", &o)) goto out;
    json_t *arr = NULL;
    cg_status st = cg_json_get(body, "segments", JSON_ARRAY, 1, &arr);
    if (st != CG_OK) {
        cg_api_field_error(req, st, "segments", "an array of {role, text, key?}");
        goto out;
    }
    size_t n = json_array_size(arr);
    if (n == 0) {
        cg_http_reply_error(req, CG_E_VALUE, "segments", "segments must not be empty");
        goto out;
    }
    if (n > a->p.max_segments) {
        char msg[128];
        snprintf(msg, sizeof msg, "%zu segments; at most %zu are allowed", n, a->p.max_segments);
        cg_http_reply_error(req, CG_E_SEGMENTS, "segments", msg);
        goto out;
    }
    segs = cg_calloc(n, sizeof *segs);
    keys = cg_calloc(n, sizeof *keys);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(arr, i), *text = NULL;
        const char *role = NULL, *key = NULL;
        if (!json_is_object(s)) {
            snprintf(field, sizeof field, "segments[%zu]", i);
            cg_api_field_error(req, CG_E_TYPE, field, "an object {role, text, key?}");
            goto out;
        }
        snprintf(field, sizeof field, "segments[%zu].role", i);
        if ((st = cg_json_get_string(s, "role", 1, &role)) != CG_OK) {
            cg_api_field_error(req, st, field, "a string");
            goto out;
        }
        if (!role_parse(role, &segs[i].role)) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s '%.32s' is unknown; use system, chunk or question", field,
                     role);
            cg_http_reply_error(req, CG_E_VALUE, field, msg);
            goto out;
        }
        snprintf(field, sizeof field, "segments[%zu].text", i);
        if ((st = cg_json_get(s, "text", JSON_STRING, 1, &text)) != CG_OK) {
            cg_api_field_error(req, st, field, "a string");
            goto out;
        }
        segs[i].text = json_string_value(text);
        segs[i].len = json_string_length(text);
        snprintf(field, sizeof field, "segments[%zu].key", i);
        if ((st = cg_json_get_string(s, "key", 0, &key)) != CG_OK) {
            cg_api_field_error(req, st, field, "a string of 32 hex characters");
            goto out;
        }
        if (key) {
            if (cg_key_parse(key, &keys[i]) != 0) {
                char msg[128];
                snprintf(msg, sizeof msg, "%s must be 32 hex characters", field);
                cg_http_reply_error(req, CG_E_VALUE, field, msg);
                goto out;
            }
            segs[i].key = &keys[i];
        }
    }
    cg_assemble_req ar = {.segs = segs,
                          .n_segs = n,
                          .mode = o.mode,
                          .salt = o.salt,
                          .salt_len = o.salt_len,
                          .recompute_prefix_tokens = (uint32_t)o.recompute,
                          .recompute_ratio = (float)o.recompute_ratio,
                          .recompute_select = o.recompute_select,
                          .reserve_tokens = o.reserve,
                          .no_bos = !o.add_special,
                          .split_special = o.split_special,
                          .cancelled = cg_api_client_left,
                          .cancel_ud = req,
                          .path = CG_PATH_CACHED};
    st = cg_engine_assemble(a->e, &ar, cg_now_ms(), &info, err, sizeof err);
    /* The work is done: leave before answering, so that a load report read after the answer
     * (GET /healthz, an event) no longer counts this request (DESIGN §18). */
    cg_engine_leave(a->e);
    admitted = 0;
    if (st != CG_OK) {
        cg_api_engine_error(req, st,
                            st == CG_E_KEY_MISMATCH || st == CG_E_VALUE ? "segments" : NULL, err);
        goto out;
    }
    cg_log(CG_LOG_INFO, "assembly %s: %u tokens, %u cached, %zu segments, %zu evicted", info.id,
           info.n_tokens, info.cached_tokens, info.n_segs, info.n_evicted);
    cg_http_reply_json(req, 200, assembly_json(a, &info));
out:
    if (admitted) cg_engine_leave(a->e);
    cg_assembly_info_free(&info);
    free(segs);
    free(keys);
    json_decref(body);
}

void cg_api_assembly_delete(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    const char *id = cg_http_req_param(req, 0);
    if (cg_engine_release(a->e, id, cg_now_ms()) != CG_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "assembly '%.64s' is unknown, expired or consumed", id);
        cg_http_reply_error(req, CG_E_NOT_FOUND, "assembly_id", msg);
        return;
    }
    cg_http_reply_json(req, 200,
                       json_pack("{s:s, s:s, s:b}", "id", id, "object", "assembly", "deleted", 1));
}
