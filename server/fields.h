/* What the gateway forwards of a request, field by field. One table says, for every field the
 * gateway knows in completions and in chat requests, whether it is the gateway's own, the
 * same in both APIs and honoured by chunkgate-worker, a sampling field chunkgate-worker
 * refuses by name, a chat field without a completions equivalent, or one without effect on
 * the answer. The rule for the rest (unknown fields): passed unchanged to --backend, which may
 * know them; dropped towards a chunkgate-worker, which would ignore them (so a large unknown
 * field is never parsed a second time there). docs/gateway.md, "Fields the gateway forwards",
 * has the table. */
#ifndef CG_GW_FIELDS_H
#define CG_GW_FIELDS_H

#include <jansson.h>
#include <stddef.h>
#include "base/status.h"

typedef enum {
    CG_FIELD_UNKNOWN,        /* not in the table */
    CG_FIELD_GATEWAY,        /* read by the gateway, never forwarded as the client sent it */
    CG_FIELD_FORWARD,        /* the same in completions and chat; chunkgate-worker honours it */
    CG_FIELD_WORKER_REFUSES, /* forwarded; chunkgate-worker refuses it by name unless neutral */
    CG_FIELD_CONVERTED,      /* chat only, rewritten for completions (messages, max_*tokens,
                                logprobs + top_logprobs) */
    CG_FIELD_RENDER,         /* chat only, read by whoever renders the chat: the gateway on the
                                main path, the worker's chat route otherwise (documents,
                                add_generation_prompt, chat_template_kwargs) */
    CG_FIELD_CHAT_ONLY,      /* chat only, no completions equivalent: refused unless neutral
                                when a chat is answered through /v1/completions */
    CG_FIELD_IGNORED,        /* no effect on the answer (metadata, store, service_tier) */
} cg_field_rule;

/* The rule for field name in a chat (chat = 1) or completions request. */
cg_field_rule cg_gw_field_rule(const char *name, int chat);
/* The same for a name of len bytes, not NUL-terminated (the fast path's keys). */
cg_field_rule cg_gw_field_rulen(const char *name, size_t len, int chat);

/* The request extensions of the table (README "Request extensions": chunk_separator,
 * documents, ...), which an OpenAI-compatible backend would not know. Whether body (borrowed)
 * has one; and removing every one from body. */
int cg_gw_has_ext_fields(json_t *body);
void cg_gw_del_ext_fields(json_t *body);

/* The first field of body (borrowed) that only the gateway sets on its upstream requests
 * (kv_transfer_params): a client's copy would steer the worker, so it is refused. NULL when
 * there is none; static storage. */
const char *cg_gw_gateway_only_field(json_t *body);

/* A chat answered through /v1/completions (any chat with separators or documents, and every
 * chat without --backend) cannot honour the CHAT_ONLY fields: CG_OK when body has none, or
 * only neutral values (tools [], tool_choice "none"/"auto", logprobs false, ...); else
 * CG_E_VALUE with *param (static) and a message. body is borrowed. */
cg_status cg_gw_check_chat_fields(json_t *body, const char **param, char *msg, size_t msglen);

/* The completions fields of src (a completions request) that go to a chunkgate-worker:
 * FORWARD and WORKER_REFUSES, shared with src. New reference. */
json_t *cg_gw_worker_fields(json_t *src);

/* The chat fields of src (a chat request) that go to a chunkgate-worker's chat route: every
 * field of the table (CHAT_ONLY ones are checked first, cg_gw_check_chat_fields); unknown and
 * IGNORED ones stay here. Shared with src. New reference. */
json_t *cg_gw_worker_chat_fields(json_t *src);

/* A completions request body for a chat whose rendering is prompt (cache/chatreq.h's
 * cg_chat_as_completion: prompt, max_tokens, logprobs, the sampling fields), plus every other
 * FORWARD and WORKER_REFUSES field of the table, and unknown fields unless to_worker (but not
 * one that is a completions field, such as prompt or echo: it would mean something else
 * there). CHAT_ONLY fields are left out: check them first. New reference; body borrowed. */
json_t *cg_gw_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len,
                                 int to_worker);

#endif
