/* Conversions between the chat and completions shapes of OpenAI requests and answers, for
 * upstreams that speak completions only. */
#ifndef CG_GW_CHATCONV_H
#define CG_GW_CHATCONV_H

#include <jansson.h>
#include <stddef.h>

/* The text_completion answer obj (or one streamed chunk) rewritten in place as a
 * chat.completion (chat.completion.chunk when stream). first: the first streamed chunk, whose
 * delta carries the role. */
void cg_gw_to_chat(json_t *obj, int stream, int first);

/* A completions request body for a chat request (server/fields.h): prompt, max_completion_tokens
 * (or max_tokens) as max_tokens, the fields that mean the same in both APIs and those
 * chunkgate-worker refuses by name; unknown fields too unless to_worker (but not one that is a
 * completions field, such as prompt or echo: it would mean something else). CHAT_ONLY fields are
 * left out: check them first (cg_gw_check_chat_fields). New reference; body is borrowed. */
json_t *cg_gw_chat_as_completion(json_t *body, const char *prompt, size_t prompt_len,
                                 int to_worker);

#endif
