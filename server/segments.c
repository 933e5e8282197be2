/* Splitting and keying a gateway request (server/segments.h). */
#include "server/segments.h"

#include <stdio.h>
#include <string.h>
#include "base/json.h"
#include "cache/chat.h"
#include "cache/chatreq.h"

void cg_gw_segments_init(cg_gw_segments *s)
{
    memset(s, 0, sizeof *s);
    cg_buf_init_unbounded(&s->rendered); /* cg_gw_segments_split caps it for a chat */
}

void cg_gw_segments_free(cg_gw_segments *s)
{
    cg_free(&s->salt_owned);
    cg_split_result_free(&s->split);
    cg_buf_free(&s->rendered);
    cg_free(&s->keys);
    cg_free(&s->key_seg);
    s->n_keys = 0;
}

/* ---------------------------------------------------------------- splitting */

/* The prompt of a completions request: a string, or an array of exactly one string. */
static cg_status get_prompt(json_t *body, const char **text, size_t *len, char *msg, size_t msglen)
{
    json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) return CG_E_MISSING;
    if (json_is_array(p)) {
        if (json_array_size(p) != 1) {
            snprintf(msg, msglen,
                     "prompt arrays must hold exactly one string (got %zu); send one "
                     "request per prompt",
                     json_array_size(p));
            return CG_E_VALUE;
        }
        p = json_array_get(p, 0);
        if (!json_is_string(p)) {
            snprintf(msg, msglen, "prompt must be a string; token-id prompts are not supported");
            return CG_E_TYPE;
        }
    }
    if (!json_is_string(p)) {
        snprintf(msg, msglen, "prompt must be a string");
        return CG_E_TYPE;
    }
    *text = json_string_value(p);
    *len = json_string_length(p);
    return CG_OK;
}

/* A chat rendered into out->rendered and split: with the workers' chat template when they
 * reported one (DESIGN §13; the rendering carries its own special tokens, so no BOS is added),
 * else with the plain rule of cache/chat.h. A chat with non-text parts, or without separators,
 * passes through with its rendering. */
static cg_status render_chat(cg_gateway *g, json_t *body, const cg_chat_req *cr,
                             const cg_split_params *sp, cg_gw_segments *out, const char **param,
                             char *msg, size_t msglen)
{
    cg_status st;
    cg_chat_model *cm = cr->non_text ? NULL : cg_workers_chat_model(g->workers);
    *param = "messages"; /* what a rendering that fails is about */
    if (cm) {
        int agp = 1;
        json_t *kw = NULL;
        char err[512];
        *param = "add_generation_prompt";
        if ((st = cg_json_get_bool(body, "add_generation_prompt", 1, &agp)) != CG_OK) goto out;
        *param = "chat_template_kwargs";
        if ((st = cg_json_get(body, "chat_template_kwargs", JSON_OBJECT, 0, &kw)) != CG_OK)
            goto out;
        if ((st = cg_chat_kwargs_check(kw, msg, msglen)) != CG_OK) goto out;
        *param = "messages";
        cg_chat_render_opts o = {sp->separator, agp, kw};
        st = cg_chat_model_render(cm, cr, &o, &out->rendered, err, sizeof err);
        if (st != CG_OK) {
            snprintf(msg, msglen, "the model's chat template: %s", err);
            goto out;
        }
        out->no_bos = 1;
        st = cg_split_prompt(out->rendered.data ? out->rendered.data : "", out->rendered.len, sp,
                             &out->split);
    } else if (cr->non_text) {
        out->split.passthrough = 1;
        st = cg_chat_req_render_flat(cr, &out->rendered);
    } else {
        st = cg_chat_render(cr->msgs, cr->n_msgs, cr->docs, cr->doc_lens, cr->n_docs, sp,
                            &out->rendered, &out->split);
        if (st == CG_OK && out->split.passthrough) st = cg_chat_req_render_flat(cr, &out->rendered);
    }
out:
    cg_chat_model_unref(&cm);
    return st;
}

/* The quality options: recompute_prefix_tokens and recompute_ratio (the model's
 * --recompute-default fills what the request left out), recompute_select and quality_probe. */
static cg_status reuse_options(cg_gateway *g, json_t *body, const char *model, cg_gw_segments *out,
                               const char **param, char *msg, size_t msglen)
{
    cg_status st = CG_OK;
    *param = "recompute_prefix_tokens";
    out->recompute = -1;
    if (json_object_get(body, "recompute_prefix_tokens") &&
        (st = cg_json_get_int(body, "recompute_prefix_tokens", -1, 0, INT32_MAX,
                              &out->recompute)) != CG_OK) {
        snprintf(msg, msglen, "recompute_prefix_tokens must be an integer >= 0");
        return st;
    }
    *param = "recompute_ratio";
    out->recompute_ratio = -1;
    if (json_object_get(body, "recompute_ratio") &&
        (st = cg_json_get_number(body, "recompute_ratio", -1, 0, 1, &out->recompute_ratio)) !=
            CG_OK) {
        snprintf(msg, msglen, "recompute_ratio must be a number in [0, 1]");
        return st;
    }
    /* The model's defaults fill what the request left out (the field, not null: null is
     * "absent" too). */
    cg_gw_recompute def;
    if (cg_gateway_recompute_default(g->cfg, model, &def)) {
        if (out->recompute_ratio < 0) out->recompute_ratio = def.ratio;
        if (out->recompute < 0 && def.prefix >= 0) out->recompute = def.prefix;
    }
    *param = "recompute_select";
    out->recompute_select = NULL;
    if ((st = cg_json_get_string(body, "recompute_select", 0, &out->recompute_select)) != CG_OK ||
        (out->recompute_select && cg_select_parse(out->recompute_select, &(cg_select){0}) != 0)) {
        snprintf(msg, msglen, "recompute_select must be \"deviation\" or \"question\"");
        return st != CG_OK ? st : CG_E_VALUE;
    }
    *param = "quality_probe";
    if ((st = cg_json_get_bool(body, "quality_probe", 0, &out->quality_probe)) != CG_OK) {
        snprintf(msg, msglen, "quality_probe must be a boolean");
        return st;
    }
    return CG_OK;
}

cg_status cg_gw_segment_request(cg_gateway *g, json_t *body, const char *model, int chat,
                                cg_gw_segments *out, const char **param, char *msg, size_t msglen)
{
    cg_status st;
    const char *sep = NULL, *mode_s = NULL, *salt = NULL;
    msg[0] = '\0';

    *param = "chunk_separator";
    if ((st = cg_json_get_string(body, "chunk_separator", 0, &sep)) != CG_OK) goto out;
    if (sep && !*sep) {
        snprintf(msg, msglen, "chunk_separator must not be empty");
        st = CG_E_VALUE;
        goto out;
    }
    *param = "chunk_mode";
    out->mode = g->default_mode;
    if ((st = cg_json_get_string(body, "chunk_mode", 0, &mode_s)) != CG_OK) goto out;
    if (mode_s && cg_mode_parse(mode_s, &out->mode) != 0) {
        snprintf(msg, msglen, "chunk_mode must be \"strict\" or \"sys\"");
        st = CG_E_VALUE;
        goto out;
    }
    *param = "cache_salt";
    if ((st = cg_json_get_string(body, "cache_salt", 0, &salt)) != CG_OK) goto out;
    if (out->tenant) {
        /* The tenant id prefixes every salt of an authenticated request: a tenant can split
         * its own cache with cache_salt but never pick a salt that another tenant's keys use,
         * and the raw API key never enters a key, a worker request or a log. */
        cg_free(&out->salt_owned);
        size_t n = strlen(out->tenant) + (salt ? strlen(salt) + 1 : 0) + 1;
        out->salt_owned = cg_malloc(n);
        snprintf(out->salt_owned, n, "%s%s%s", out->tenant, salt ? ":" : "", salt ? salt : "");
        salt = out->salt_owned;
    }
    out->salt = salt;
    if ((st = reuse_options(g, body, model, out, param, msg, msglen)) != CG_OK) goto out;

    cg_split_params sp = cg_split_default_params();
    sp.separator = sep ? sep : g->cfg->separator;
    out->separator = sp.separator;
    sp.max_segments = (size_t)g->cfg->max_segments;
    sp.max_segment_bytes = g->cfg->max_segment_bytes;
    if (!chat) {
        const char *text;
        size_t len;
        *param = "prompt";
        if ((st = get_prompt(body, &text, &len, msg, msglen)) != CG_OK) goto out;
        int add_special = 1;
        *param = "add_special_tokens";
        if ((st = cg_json_get_bool(body, "add_special_tokens", 1, &add_special)) != CG_OK) goto out;
        out->no_bos = !add_special;
        *param = "prompt";
        out->text = text;
        st = cg_split_prompt(text, len, &sp, &out->split);
    } else {
        cg_chat_req cr;
        st = cg_chat_req_parse(body, &cr, param, msg, msglen);
        /* The rendering is about as long as the contents; twice the body cap is plenty. */
        out->rendered.max = g->cfg->max_body_bytes * 2 + 65536;
        if (st == CG_OK) st = render_chat(g, body, &cr, &sp, out, param, msg, msglen);
        cg_chat_req_free(&cr);
        out->text = out->rendered.data ? out->rendered.data : "";
    }
    if (st != CG_OK) {
        if (st == CG_E_SEGMENTS)
            snprintf(msg, msglen, "the prompt has more than %lld segments",
                     (long long)g->cfg->max_segments);
        else if (st == CG_E_SEGMENT_SIZE)
            snprintf(msg, msglen, "a prompt segment is longer than %zu bytes",
                     g->cfg->max_segment_bytes);
        goto out;
    }

    /* Keys for the cacheable segments (system and chunks), compacted. */
    size_t ns = out->split.n;
    cg_key_seg *ks = cg_calloc(ns ? ns : 1, sizeof *ks);
    cg_key *all = cg_calloc(ns ? ns : 1, sizeof *all);
    for (size_t i = 0; i < ns; i++)
        ks[i] = (cg_key_seg){out->split.segs[i].role, out->text + out->split.segs[i].off,
                             out->split.segs[i].len};
    cg_key_scope scope = {model, strlen(model),           out->mode,
                          salt,  salt ? strlen(salt) : 0, out->no_bos};
    cg_key_request(&scope, ks, ns, 0, all);
    out->keys = cg_calloc(ns ? ns : 1, sizeof *out->keys);
    out->key_seg = cg_calloc(ns ? ns : 1, sizeof *out->key_seg);
    for (size_t i = 0; i < ns; i++) {
        if (ks[i].role == CG_ROLE_QUESTION) continue;
        out->keys[out->n_keys] = all[i];
        out->key_seg[out->n_keys++] = i;
    }
    free(ks);
    free(all);
    *param = NULL;
out:
    return st;
}
