/* The worker's POST /tokenize and POST /detokenize in vLLM's request and response shapes: a
 * prompt (or a chat, rendered as /v1/chat/completions renders it) into token ids with the
 * model's tokenizer, and ids back into text. The whole text is tokenized as one piece, as
 * vLLM does; a "# #" prompt's segments are tokenized one by one only when it is completed.
 * Both are admitted like completions (429 beyond --max-running + --max-queue), and both are
 * bounded by what the model could ever use: a text of more tokens than its positions is
 * refused as soon as the tokenizer passes that count, and so are more ids than positions, so
 * neither answer grows past max_pos tokens' worth (an 8 MB text once cost 400 MB of JSON). */
#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "cache/chat_template.h"
#include "worker/serve/api_common.h"
#include "worker/serve/api_tokens.h"

static const cg_tokenizer *tokenizer(cg_worker_api *a)
{
    return cg_model_tokenizer(cg_engine_model(a->e));
}

/* token_strs: each id's vocabulary string. */
static json_t *token_strs(const cg_tokenizer *t, const cg_tokens *ids)
{
    json_t *out = json_array();
    for (size_t i = 0; i < ids->n; i++) {
        size_t n = 0;
        const char *s = cg_tokenizer_token_str(t, ids->ids[i], &n);
        json_array_append_new(out, s ? cg_json_text(s, n) : json_null());
    }
    return out;
}

void cg_api_tokenize(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    json_t *body = cg_http_req_json(req);
    cg_buf chat;
    cg_tokens ids = {0};
    cg_buf_init(&chat, cg_chat_template_default_limits().max_output); /* the render bound */
    int admitted = 0;
    if (!body) return;
    if (!cg_api_model_ok(a, req, body)) goto out;
    int is_chat = json_object_get(body, "messages") != NULL, templated = 0, add = 1, strs = 0;
    const char *text = NULL;
    size_t len = 0;
    cg_status st;
    if (is_chat) {
        if (!cg_api_chat_prompt(a, req, body, &chat, &templated)) goto out;
        text = chat.data ? chat.data : "";
        len = chat.len;
    } else {
        json_t *p = json_object_get(body, "prompt");
        if (!json_is_string(p)) {
            cg_api_field_error(req, p ? CG_E_TYPE : CG_E_MISSING, "prompt",
                               "a string (or send messages for a chat)");
            goto out;
        }
        text = json_string_value(p);
        len = json_string_length(p);
    }
    /* vLLM: a chat rendered by the template carries its special tokens already */
    if ((st = cg_json_get_bool(body, "add_special_tokens", !templated, &add)) != CG_OK) {
        cg_api_field_error(req, st, "add_special_tokens", "a boolean");
        goto out;
    }
    int split = 0;
    if ((st = cg_json_get_bool(body, "split_special_tokens", a->p.split_special, &split)) !=
        CG_OK) {
        cg_api_field_error(req, st, "split_special_tokens", "a boolean");
        goto out;
    }
    if ((st = cg_json_get_bool(body, "return_token_strs", 0, &strs)) != CG_OK) {
        cg_api_field_error(req, st, "return_token_strs", "a boolean");
        goto out;
    }
    const long long max_pos = cg_api_cfg(a)->max_pos;
    cg_encode_opts eo = cg_encode_default_opts();
    eo.add_special = add;
    eo.split_special = split;
    eo.cancelled = cg_api_client_left;
    eo.cancel_ud = req;
    eo.max_tokens = (size_t)max_pos;
    if (!(admitted = cg_api_admit(a, req, 0))) goto out;
    st = cg_tokenizer_encode_opts(tokenizer(a), text, len, &eo, &ids);
    /* the work is done: leave before replying, so the client's next request finds the place */
    cg_engine_leave(a->e);
    admitted = 0;
    if (st != CG_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "the text has more tokens than the model's %lld positions",
                 max_pos);
        cg_http_reply_error(req, st, is_chat ? "messages" : "prompt",
                            st == CG_E_UTF8      ? "the text is not valid UTF-8"
                            : st == CG_E_CONTEXT ? msg
                                                 : NULL);
        goto out;
    }
    json_t *tok = json_array();
    for (size_t i = 0; i < ids.n; i++)
        json_array_append_new(tok, json_integer(ids.ids[i]));
    cg_http_reply_json(req, 200,
                       json_pack("{s:I, s:I, s:o, s:o}", "count", (json_int_t)ids.n,
                                 "max_model_len", (json_int_t)cg_api_cfg(a)->max_pos, "tokens", tok,
                                 "token_strs",
                                 strs ? token_strs(tokenizer(a), &ids) : json_null()));
out:
    if (admitted) cg_engine_leave(a->e);
    cg_tokens_free(&ids);
    cg_buf_free(&chat);
    json_decref(body);
}

void cg_api_detokenize(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    json_t *body = cg_http_req_json(req), *tokens = NULL;
    int32_t *ids = NULL;
    cg_buf text;
    cg_buf_init_unbounded(&text); /* at most max_pos vocabulary entries, checked below */
    int admitted = 0;
    if (!body) return;
    if (!cg_api_model_ok(a, req, body)) goto out;
    cg_status st = cg_json_get(body, "tokens", JSON_ARRAY, 1, &tokens);
    size_t n = tokens ? json_array_size(tokens) : 0;
    const long long max_pos = cg_api_cfg(a)->max_pos;
    if (st != CG_OK) {
        cg_api_field_error(req, st, "tokens", "an array of token ids");
        goto out;
    }
    if (n > (size_t)max_pos) {
        char msg[160];
        snprintf(msg, sizeof msg, "%zu token ids; the model holds %lld positions", n, max_pos);
        cg_http_reply_error(req, CG_E_CONTEXT, "tokens", msg);
        goto out;
    }
    int32_t vocab = cg_tokenizer_vocab_size(tokenizer(a));
    ids = cg_malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(tokens, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            char msg[160];
            snprintf(msg, sizeof msg, "tokens[%zu] must be a token id in [0, %d)", i, (int)vocab);
            cg_http_reply_error(req, json_is_integer(v) ? CG_E_VALUE : CG_E_TYPE, "tokens", msg);
            goto out;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (!(admitted = cg_api_admit(a, req, 0))) goto out;
    st = cg_tokenizer_decode(tokenizer(a), ids, n, 0, &text);
    cg_engine_leave(a->e); /* before replying, as /tokenize */
    admitted = 0;
    if (st != CG_OK) {
        cg_http_reply_error(req, st, "tokens", NULL);
        goto out;
    }
    cg_http_reply_json(
        req, 200, json_pack("{s:o}", "prompt", cg_json_text(text.data ? text.data : "", text.len)));
out:
    if (admitted) cg_engine_leave(a->e);
    free(ids);
    cg_buf_free(&text);
    json_decref(body);
}
