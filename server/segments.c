/* Splitting and keying a gateway request (server/segments.h). */
#include "server/segments.h"

#include <stdio.h>
#include <string.h>
#include "base/json.h"
#include "cache/chat.h"

void cg_gw_segments_init(cg_gw_segments *s)
{
    memset(s, 0, sizeof *s);
    cg_buf_init(&s->rendered, 0);
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

/* Chat messages into cg_chat_msg rows. Content arrays of text parts are joined with '\n' into
 * parts[i]; a content part of another type (image, audio) makes the request pass-through,
 * because only text can be split and keyed. */
static cg_status get_messages(json_t *body, cg_chat_msg **out, size_t *n_out, cg_buf **parts_out,
                              int *non_text, char *msg, size_t msglen)
{
    json_t *ms = json_object_get(body, "messages");
    *out = NULL;
    *parts_out = NULL;
    *n_out = 0;
    *non_text = 0;
    if (!ms || json_is_null(ms)) return CG_E_MISSING;
    if (!json_is_array(ms)) {
        snprintf(msg, msglen, "messages must be an array");
        return CG_E_TYPE;
    }
    size_t n = json_array_size(ms);
    if (!n) {
        snprintf(msg, msglen, "messages must not be empty");
        return CG_E_VALUE;
    }
    cg_chat_msg *rows = cg_calloc(n, sizeof *rows);
    cg_buf *parts = cg_calloc(n, sizeof *parts);
    *out = rows;
    *parts_out = parts;
    *n_out = n;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(ms, i);
        cg_buf_init(&parts[i], 0);
        if (!json_is_object(m)) {
            snprintf(msg, msglen, "messages[%zu] must be an object", i);
            return CG_E_TYPE;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || !json_string_length(role)) {
            snprintf(msg, msglen, "messages[%zu].role must be a non-empty string", i);
            return role ? CG_E_TYPE : CG_E_MISSING;
        }
        rows[i].role = json_string_value(role);
        json_t *c = json_object_get(m, "content");
        if (!c || json_is_null(c)) {
            /* Only an assistant turn may go without (its tool calls stand for it), as in
             * OpenAI's API; every other message needs its content. */
            if (!strcmp(rows[i].role, "assistant")) continue;
            snprintf(msg, msglen, "messages[%zu].content is required for role %.32s", i,
                     rows[i].role);
            return CG_E_MISSING;
        }
        if (json_is_string(c)) {
            rows[i].content = json_string_value(c);
            rows[i].content_len = json_string_length(c);
            continue;
        }
        if (!json_is_array(c)) {
            snprintf(msg, msglen, "messages[%zu].content must be a string or an array of parts", i);
            return CG_E_TYPE;
        }
        size_t j;
        json_t *part;
        json_array_foreach(c, j, part)
        {
            json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
            if (!json_is_string(type)) {
                snprintf(msg, msglen, "messages[%zu].content[%zu] must be an object with a type", i,
                         j);
                return CG_E_TYPE;
            }
            if (strcmp(json_string_value(type), "text") != 0) {
                *non_text = 1;
                continue;
            }
            json_t *text = json_object_get(part, "text");
            if (!json_is_string(text)) {
                snprintf(msg, msglen, "messages[%zu].content[%zu].text must be a string", i, j);
                return CG_E_TYPE;
            }
            cg_status st = CG_OK;
            if (parts[i].len) st = cg_buf_append(&parts[i], "\n", 1);
            if (st == CG_OK)
                st = cg_buf_append(&parts[i], json_string_value(text), json_string_length(text));
            (void)st; /* unlimited buffer; the body cap bounds it */
        }
        rows[i].content = parts[i].len ? parts[i].data : NULL;
        rows[i].content_len = parts[i].len;
    }
    return CG_OK;
}

static cg_status get_documents(json_t *body, const char ***docs, size_t **lens, size_t *n,
                               char *msg, size_t msglen)
{
    json_t *d = json_object_get(body, "documents");
    *docs = NULL;
    *lens = NULL;
    *n = 0;
    if (!d || json_is_null(d)) return CG_OK;
    if (!json_is_array(d)) {
        snprintf(msg, msglen, "documents must be an array of strings");
        return CG_E_TYPE;
    }
    size_t k = json_array_size(d);
    *docs = cg_calloc(k ? k : 1, sizeof **docs);
    *lens = cg_calloc(k ? k : 1, sizeof **lens);
    for (size_t i = 0; i < k; i++) {
        json_t *s = json_array_get(d, i);
        if (!json_is_string(s)) {
            snprintf(msg, msglen, "documents[%zu] must be a string", i);
            return CG_E_TYPE;
        }
        (*docs)[i] = json_string_value(s);
        (*lens)[i] = json_string_length(s);
    }
    *n = k;
    return CG_OK;
}

cg_status cg_gw_segment_request(cg_gateway *g, json_t *body, const char *model, int chat,
                                cg_gw_segments *out, const char **param, char *msg, size_t msglen)
{
    cg_status st;
    const char *sep = NULL, *mode_s = NULL, *salt = NULL;
    cg_chat_msg *msgs = NULL;
    cg_buf *parts = NULL;
    size_t n_msgs = 0, n_docs = 0;
    const char **docs = NULL;
    size_t *doc_lens = NULL;
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
    *param = "recompute_prefix_tokens";
    out->recompute = -1;
    if (json_object_get(body, "recompute_prefix_tokens") &&
        (st = cg_json_get_int(body, "recompute_prefix_tokens", -1, 0, INT32_MAX,
                              &out->recompute)) != CG_OK) {
        snprintf(msg, msglen, "recompute_prefix_tokens must be an integer >= 0");
        goto out;
    }

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
        out->text = text;
        st = cg_split_prompt(text, len, &sp, &out->split);
    } else {
        int non_text;
        *param = "messages";
        if ((st = get_messages(body, &msgs, &n_msgs, &parts, &non_text, msg, msglen)) != CG_OK)
            goto out;
        *param = "documents";
        if ((st = get_documents(body, &docs, &doc_lens, &n_docs, msg, msglen)) != CG_OK) goto out;
        *param = "messages";
        /* The rendering is about as long as the contents; twice the body cap is plenty. */
        out->rendered.max = g->cfg->max_body_bytes * 2 + 65536;
        if (non_text) {
            cg_split_result_free(&out->split);
            out->split.passthrough = 1;
            st = CG_OK;
        } else {
            st = cg_chat_render(msgs, n_msgs, docs, doc_lens, n_docs, &sp, &out->rendered,
                                &out->split);
        }
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
    cg_key_scope scope = {model, strlen(model), out->mode, salt, salt ? strlen(salt) : 0};
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
    if (parts)
        for (size_t i = 0; i < n_msgs; i++)
            cg_buf_free(&parts[i]);
    free(parts);
    free(msgs);
    free(docs);
    free(doc_lens);
    return st;
}
