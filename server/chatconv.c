/* Chat <-> completions conversions (server/chatconv.h). */
#include "server/chatconv.h"

#include <stdio.h>
#include <string.h>
#include "base/base.h"
#include "server/fields.h"

json_t *cg_gw_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len,
                                 int to_worker)
{
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(prompt ? prompt : "", prompt_len));
    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!mt || json_is_null(mt)) mt = json_object_get(body, "max_tokens");
    if (mt && !json_is_null(mt)) json_object_set(o, "max_tokens", mt);
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        cg_field_rule r = cg_gw_field_rule(k, 1);
        /* An unknown chat field goes to --backend, unless it is a completions field there
         * (prompt, echo, suffix, ...): it would mean something else in the completion. */
        if (r == CG_FIELD_FORWARD || r == CG_FIELD_WORKER_REFUSES ||
            (r == CG_FIELD_UNKNOWN && !to_worker && cg_gw_field_rule(k, 0) == CG_FIELD_UNKNOWN))
            json_object_set(o, k, v);
    }
    return o;
}

void cg_gw_to_chat(json_t *obj, int stream, int first)
{
    const char *id = json_string_value(json_object_get(obj, "id"));
    if (id && strncmp(id, "chatcmpl-", 9) != 0) {
        char nid[160];
        snprintf(nid, sizeof nid, "chatcmpl-%s", strncmp(id, "cmpl-", 5) ? id : id + 5);
        json_object_set_new(obj, "id", json_string(nid));
    }
    json_object_set_new(obj, "object",
                        json_string(stream ? "chat.completion.chunk" : "chat.completion"));
    size_t i;
    json_t *ch;
    json_array_foreach(json_object_get(obj, "choices"), i, ch)
    {
        if (!json_is_object(ch)) continue;
        json_t *text = json_object_get(ch, "text");
        json_t *m = json_object();
        if (!stream || first) json_object_set_new(m, "role", json_string("assistant"));
        if (!stream)
            json_object_set(m, "content", json_is_string(text) ? text : json_null());
        else if (json_is_string(text) && (first || json_string_length(text)))
            json_object_set(m, "content", text);
        json_object_set_new(ch, stream ? "delta" : "message", m);
        json_object_del(ch, "text");
        if (!json_object_get(ch, "logprobs")) json_object_set_new(ch, "logprobs", json_null());
    }
}
