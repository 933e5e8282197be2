/* The field table of server/fields.h. */
#include "server/fields.h"

#include <stdio.h>
#include <string.h>
#include "base/base.h"
#include "cache/chatreq.h"

#define C 1 /* completions */
#define H 2 /* chat */
/* A request extension (README "Request extensions"): an OpenAI-compatible backend would not
 * know it, so it is never forwarded there (cg_gw_has_ext_fields, cg_gw_del_ext_fields). */
#define EXT 4
/* Set by the gateway only, on its upstream requests: refused from a client
 * (cg_gw_gateway_only_field). */
#define SET_BY_GATEWAY 8

static const struct {
    const char *name;
    unsigned where; /* C, H: the APIs it is in; EXT, SET_BY_GATEWAY: the lists it is on */
    cg_field_rule rule;
} FIELDS[] = {
    /* the gateway's own: extensions (README "Request extensions") and what only it sets */
    {"chunk_separator", C | H | EXT, CG_FIELD_GATEWAY},
    {"chunk_mode", C | H | EXT, CG_FIELD_GATEWAY},
    {"cache_salt", C | H | EXT, CG_FIELD_GATEWAY},
    {"recompute_prefix_tokens", C | H | EXT, CG_FIELD_GATEWAY},
    {"recompute_ratio", C | H | EXT, CG_FIELD_GATEWAY},
    {"recompute_select", C | H | EXT, CG_FIELD_GATEWAY},
    {"quality_probe", C | H | EXT, CG_FIELD_GATEWAY},
    {"documents", C | EXT, CG_FIELD_GATEWAY},
    {"documents", H | EXT, CG_FIELD_RENDER},
    {"add_generation_prompt", H, CG_FIELD_RENDER},
    {"chat_template_kwargs", H, CG_FIELD_RENDER},
    {"kv_transfer_params", C | H | SET_BY_GATEWAY, CG_FIELD_GATEWAY},
    /* honoured by chunkgate-worker (worker/serve/api_complete.c) */
    {"model", C | H, CG_FIELD_FORWARD},
    {"prompt", C, CG_FIELD_FORWARD},
    {"max_tokens", C, CG_FIELD_FORWARD},
    {"temperature", C | H, CG_FIELD_FORWARD},
    {"top_p", C | H, CG_FIELD_FORWARD},
    {"n", C | H, CG_FIELD_FORWARD},
    {"seed", C | H, CG_FIELD_FORWARD},
    {"stop", C | H, CG_FIELD_FORWARD},
    {"stream", C | H, CG_FIELD_FORWARD},
    {"stream_options", C | H, CG_FIELD_FORWARD},
    {"user", C | H, CG_FIELD_FORWARD},
    {"logprobs", C, CG_FIELD_FORWARD}, /* completions: an integer */
    {"echo", C, CG_FIELD_FORWARD},
    {"return_tokens_as_token_ids", C, CG_FIELD_FORWARD},
    {"add_special_tokens", C, CG_FIELD_FORWARD},
    {"split_special_tokens", C | H, CG_FIELD_FORWARD}, /* also sent with the assemble */
    /* sampling fields chunkgate-worker refuses by name (their neutral values pass) */
    {"best_of", C, CG_FIELD_WORKER_REFUSES},
    {"suffix", C, CG_FIELD_WORKER_REFUSES},
    {"presence_penalty", C | H, CG_FIELD_WORKER_REFUSES},
    {"frequency_penalty", C | H, CG_FIELD_WORKER_REFUSES},
    {"repetition_penalty", C | H, CG_FIELD_WORKER_REFUSES},
    {"min_tokens", C | H, CG_FIELD_WORKER_REFUSES},
    {"top_k", C | H, CG_FIELD_WORKER_REFUSES},
    {"logit_bias", C | H, CG_FIELD_WORKER_REFUSES},
    {"response_format", C | H, CG_FIELD_WORKER_REFUSES},
    {"guided_json", C | H, CG_FIELD_WORKER_REFUSES},
    {"guided_regex", C | H, CG_FIELD_WORKER_REFUSES},
    {"tools", C, CG_FIELD_WORKER_REFUSES},
    {"functions", C, CG_FIELD_WORKER_REFUSES},
    {"min_p", C | H, CG_FIELD_WORKER_REFUSES},
    {"ignore_eos", C | H, CG_FIELD_WORKER_REFUSES},
    {"use_beam_search", C | H, CG_FIELD_WORKER_REFUSES},
    {"include_stop_str_in_output", C | H, CG_FIELD_WORKER_REFUSES},
    {"skip_special_tokens", C | H, CG_FIELD_WORKER_REFUSES},
    {"stop_token_ids", C | H, CG_FIELD_WORKER_REFUSES},
    {"allowed_token_ids", C | H, CG_FIELD_WORKER_REFUSES},
    {"bad_words", C | H, CG_FIELD_WORKER_REFUSES},
    {"prompt_logprobs", C | H, CG_FIELD_WORKER_REFUSES},
    {"guided_choice", C | H, CG_FIELD_WORKER_REFUSES},
    {"guided_grammar", C | H, CG_FIELD_WORKER_REFUSES},
    {"structured_outputs", C | H, CG_FIELD_WORKER_REFUSES},
    /* chat fields rewritten for completions */
    {"messages", H, CG_FIELD_CONVERTED},
    {"max_tokens", H, CG_FIELD_CONVERTED},
    {"max_completion_tokens", H, CG_FIELD_CONVERTED},
    {"logprobs", H, CG_FIELD_CONVERTED}, /* chat: a boolean, with top_logprobs */
    {"top_logprobs", H, CG_FIELD_CONVERTED},
    /* chat fields without a completions equivalent */
    {"tools", H, CG_FIELD_CHAT_ONLY},
    {"functions", H, CG_FIELD_CHAT_ONLY},
    {"tool_choice", H, CG_FIELD_CHAT_ONLY},
    {"function_call", H, CG_FIELD_CHAT_ONLY},
    {"parallel_tool_calls", H, CG_FIELD_CHAT_ONLY},
    {"echo", H, CG_FIELD_CHAT_ONLY}, /* the worker's chat refuses it too */
    {"audio", H, CG_FIELD_CHAT_ONLY},
    {"modalities", H, CG_FIELD_CHAT_ONLY},
    {"prediction", H, CG_FIELD_CHAT_ONLY},
    {"reasoning_effort", H, CG_FIELD_CHAT_ONLY},
    {"web_search_options", H, CG_FIELD_CHAT_ONLY},
    /* no effect on the answer */
    {"metadata", C | H, CG_FIELD_IGNORED},
    {"store", C | H, CG_FIELD_IGNORED},
    {"service_tier", C | H, CG_FIELD_IGNORED},
};

cg_field_rule cg_gw_field_rulen(const char *name, size_t len, int chat)
{
    unsigned where = chat ? H : C;
    for (size_t i = 0; i < CG_ARRAY_LEN(FIELDS); i++)
        if ((FIELDS[i].where & where) && strlen(FIELDS[i].name) == len &&
            !memcmp(FIELDS[i].name, name, len))
            return FIELDS[i].rule;
    return CG_FIELD_UNKNOWN;
}

cg_field_rule cg_gw_field_rule(const char *name, int chat)
{
    return cg_gw_field_rulen(name, strlen(name), chat);
}

int cg_gw_has_ext_fields(json_t *body)
{
    for (size_t i = 0; i < CG_ARRAY_LEN(FIELDS); i++)
        if ((FIELDS[i].where & EXT) && json_object_get(body, FIELDS[i].name)) return 1;
    return 0;
}

void cg_gw_del_ext_fields(json_t *body)
{
    for (size_t i = 0; i < CG_ARRAY_LEN(FIELDS); i++)
        if (FIELDS[i].where & EXT) json_object_del(body, FIELDS[i].name);
}

const char *cg_gw_gateway_only_field(json_t *body)
{
    for (size_t i = 0; i < CG_ARRAY_LEN(FIELDS); i++)
        if ((FIELDS[i].where & SET_BY_GATEWAY) && json_object_get(body, FIELDS[i].name))
            return FIELDS[i].name;
    return NULL;
}

/* A value that asks for nothing: null, false, 0, "", [], {}. */
static int empty_value(json_t *v)
{
    return json_is_null(v) || json_is_false(v) || (json_is_integer(v) && !json_integer_value(v)) ||
           (json_is_string(v) && !json_string_length(v)) ||
           (json_is_array(v) && !json_array_size(v)) || (json_is_object(v) && !json_object_size(v));
}

/* Whether a CHAT_ONLY field's value asks for nothing a completion cannot give. */
static int chat_only_neutral(const char *name, json_t *v)
{
    if (empty_value(v)) return 1;
    if (!strcmp(name, "tool_choice") || !strcmp(name, "function_call"))
        return json_is_string(v) &&
               (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"));
    if (!strcmp(name, "parallel_tool_calls")) return json_is_boolean(v); /* no tools: no calls */
    if (!strcmp(name, "modalities"))
        return json_is_array(v) && json_array_size(v) == 1 &&
               json_is_string(json_array_get(v, 0)) &&
               !strcmp(json_string_value(json_array_get(v, 0)), "text");
    return 0;
}

cg_status cg_gw_check_chat_fields(json_t *body, const char **param, char *msg, size_t msglen)
{
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        if (cg_gw_field_rule(k, 1) != CG_FIELD_CHAT_ONLY || chat_only_neutral(k, v)) continue;
        for (size_t i = 0; i < CG_ARRAY_LEN(FIELDS); i++)
            if (!strcmp(FIELDS[i].name, k)) *param = FIELDS[i].name; /* static storage */
        snprintf(msg, msglen,
                 "%s is not supported here: chunkgate answers this chat through /v1/completions "
                 "(a prompt with separators or documents, or no --backend), which has no %s; "
                 "remove it or use its neutral value",
                 *param, *param);
        return CG_E_VALUE;
    }
    return CG_OK;
}

/* The fields of src that go to a chunkgate-worker: towards its chat route every field of the
 * table but IGNORED and GATEWAY ones, towards its completions route only what it reads. */
static json_t *worker_fields(json_t *src, int chat)
{
    json_t *o = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v)
    {
        cg_field_rule r = cg_gw_field_rule(k, chat);
        int keep = chat ? r != CG_FIELD_UNKNOWN && r != CG_FIELD_IGNORED && r != CG_FIELD_GATEWAY
                        : r == CG_FIELD_FORWARD || r == CG_FIELD_WORKER_REFUSES;
        if (keep) json_object_set(o, k, v);
    }
    return o;
}

json_t *cg_gw_worker_chat_fields(json_t *src)
{
    return worker_fields(src, 1);
}

json_t *cg_gw_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len, int to_worker)
{
    json_t *o = cg_chat_as_completion(body, prompt, prompt_len);
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        if (json_object_get(o, k)) continue;
        cg_field_rule r = cg_gw_field_rule(k, 1);
        if (r == CG_FIELD_FORWARD || r == CG_FIELD_WORKER_REFUSES ||
            (r == CG_FIELD_UNKNOWN && !to_worker && cg_gw_field_rule(k, 0) == CG_FIELD_UNKNOWN))
            json_object_set(o, k, v);
    }
    return o;
}

json_t *cg_gw_worker_fields(json_t *src)
{
    return worker_fields(src, 0);
}
