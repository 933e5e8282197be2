/* The worker's POST /v1/chat/completions: the chat is rendered into one prompt (the model's
 * chat template with the documents in the system message, DESIGN §13, or the plain rule of
 * cache/chat.h for a model without one), then completed like a completions request: a
 * rendering with separators reuses its chunks' KV, and the answer takes the chat shapes. */
#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "cache/chat_template.h"
#include "cache/chatreq.h"
#include "worker/serve/api_common.h"
#include "worker/serve/api_complete.h"

/* Chat fields that do not go on to the completion: they are read here, or mean something else
 * in a completions request. */
static const char *const CHAT_ONLY[] = {"messages",
                                        "documents",
                                        "max_completion_tokens",
                                        "logprobs",
                                        "top_logprobs",
                                        "add_generation_prompt",
                                        "chat_template_kwargs",
                                        "tool_choice",
                                        "parallel_tool_calls"};

static int chat_only(const char *k)
{
    for (size_t i = 0; i < CG_ARRAY_LEN(CHAT_ONLY); i++)
        if (!strcmp(k, CHAT_ONLY[i])) return 1;
    return 0;
}

/* The chat fields a completion cannot carry as they are; replies 400 and returns 0. */
static int check_chat_fields(cg_http_req *req, json_t *body)
{
    cg_status st;
    int lp = 0;
    long long top;
    if ((st = cg_json_get_bool(body, "logprobs", 0, &lp)) != CG_OK) {
        cg_api_field_error(req, st, "logprobs", "a boolean");
        return 0;
    }
    if ((st = cg_json_get_int(body, "top_logprobs", 0, 0, CG_SCHED_TOP_MAX, &top)) != CG_OK ||
        (top > 0 && !lp)) {
        cg_api_field_error(req, st == CG_OK ? CG_E_VALUE : st, "top_logprobs",
                           "an integer in [0, 20], with logprobs true");
        return 0;
    }
    if (json_is_true(json_object_get(body, "echo"))) {
        cg_http_reply_error(req, CG_E_VALUE, "echo",
                            "echo is not supported in chat completions; use /v1/completions");
        return 0;
    }
    /* an assembly would be decoded in place of the messages */
    json_t *kv = json_object_get(body, "kv_transfer_params");
    if (kv && !json_is_null(kv)) {
        cg_http_reply_error(req, CG_E_VALUE, "kv_transfer_params",
                            "kv_transfer_params is not supported in chat completions (the "
                            "messages would be ignored); use /v1/completions");
        return 0;
    }
    return 1;
}

int cg_api_chat_prompt(cg_worker_api *a, cg_http_req *req, json_t *body, cg_buf *out,
                       int *templated)
{
    cg_chat_req cr = {0};
    const char *param = NULL;
    char msg[512];
    int agp = 1;
    json_t *kwargs = NULL;
    cg_status st;
    if ((st = cg_json_get_bool(body, "add_generation_prompt", 1, &agp)) != CG_OK) {
        cg_api_field_error(req, st, "add_generation_prompt", "a boolean");
        return 0;
    }
    if ((st = cg_json_get(body, "chat_template_kwargs", JSON_OBJECT, 0, &kwargs)) != CG_OK) {
        cg_api_field_error(req, st, "chat_template_kwargs", "an object");
        return 0;
    }
    if ((st = cg_chat_kwargs_check(kwargs, msg, sizeof msg)) != CG_OK) {
        cg_http_reply_error(req, st, "chat_template_kwargs", msg);
        return 0;
    }
    st = cg_chat_req_parse(body, &cr, &param, msg, sizeof msg);
    if (st != CG_OK) {
        cg_http_reply_error(req, st, param, msg);
        goto out;
    }
    const char *sep = NULL;
    if ((st = cg_json_get_string(body, "chunk_separator", 0, &sep)) != CG_OK || (sep && !*sep)) {
        cg_api_field_error(req, st == CG_OK ? CG_E_VALUE : st, "chunk_separator",
                           "a non-empty string");
        st = st == CG_OK ? CG_E_VALUE : st;
        goto out;
    }
    if (!sep) sep = a->p.separator;
    *templated = a->p.chat != NULL;
    if (a->p.chat) {
        char err[480];
        cg_chat_render_opts o = {sep, agp, kwargs};
        st = cg_chat_model_render(a->p.chat, &cr, &o, out, err, sizeof err);
        if (st != CG_OK) {
            snprintf(msg, sizeof msg, "the model's chat template: %s", err);
            cg_http_reply_error(req, st == CG_E_TOO_LARGE ? st : CG_E_VALUE, "messages", msg);
        }
        goto out;
    }
    if (cr.non_text) {
        st = CG_E_UNSUPPORTED;
        cg_http_reply_error(req, CG_E_VALUE, "messages",
                            "only text content parts are supported by chunkgate-worker");
        goto out;
    }
    cg_split_params sp = cg_split_default_params();
    sp.separator = sep;
    sp.max_segments = a->p.max_segments;
    cg_split_result segs = {0};
    st = cg_chat_render(cr.msgs, cr.n_msgs, cr.docs, cr.doc_lens, cr.n_docs, &sp, out, &segs);
    if (st == CG_OK && segs.passthrough) st = cg_chat_req_render_flat(&cr, out);
    cg_split_result_free(&segs);
    if (st != CG_OK) cg_api_engine_error(req, st, "messages", NULL);
out:
    cg_chat_req_free(&cr);
    return st == CG_OK;
}

void cg_api_chat_completions(cg_http_req *req, void *app)
{
    cg_worker_api *a = app;
    json_t *body = cg_http_req_json(req);
    int templated = 0;
    if (!body) return;
    cg_buf text;
    cg_buf_init(&text, cg_chat_template_default_limits().max_output); /* the render bound */
    if (!check_chat_fields(req, body) || !cg_api_chat_prompt(a, req, body, &text, &templated)) {
        cg_buf_free(&text);
        json_decref(body);
        return;
    }
    json_t *cb = cg_chat_as_completion(body, text.data, text.len);
    cg_buf_free(&text);
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) if (!chat_only(k) && !json_object_get(cb, k))
        json_object_set(cb, k, v);
    /* the template wrote the model's special tokens (BOS included) itself, unless the client
     * says otherwise (as /tokenize then counts) */
    if (templated && !json_object_get(body, "add_special_tokens"))
        json_object_set_new(cb, "add_special_tokens", json_false());
    json_decref(body);
    cg_api_complete_body(a, req, cb, 1);
}
