/* The inference route handlers: POST /v1/completions, POST /v1/chat/completions, and the
 * tokenizer's /tokenize and /detokenize. */
#ifndef CG_GW_INFER_H
#define CG_GW_INFER_H

#include "base/http.h"

/* POST /v1/completions and POST /v1/chat/completions. */
cg_http_handler_fn cg_gw_completions, cg_gw_chat_completions;
/* POST /tokenize and /detokenize (vLLM's shapes), answered by a worker. */
cg_http_handler_fn cg_gw_tokenize, cg_gw_detokenize;

#endif
