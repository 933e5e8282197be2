/* The worker's POST /v1/completions and POST /v1/chat/completions: from an assembly (local or
 * pulled), a "# #" prompt or a plain prompt, as JSON or an SSE stream, with logprobs. */
#ifndef CG_API_COMPLETE_H
#define CG_API_COMPLETE_H

#include <jansson.h>

#include "base/http.h"
#include "worker/serve/api_params.h"

cg_http_handler_fn cg_api_completions, cg_api_chat_completions;

/* Completes a completions-shaped body (owned: released here) and replies; chat: the answer
 * takes the chat.completion shapes. */
void cg_api_complete_body(cg_worker_api *a, cg_http_req *req, json_t *body, int chat);

#endif
