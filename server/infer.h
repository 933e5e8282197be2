/* The inference route handlers: POST /v1/completions, POST /v1/chat/completions, and the
 * tokenizer's /tokenize and /detokenize. */
#ifndef CG_GW_INFER_H
#define CG_GW_INFER_H

#include "base/http.h"

void cg_gw_completions(cg_http_req *req, void *app);
void cg_gw_chat_completions(cg_http_req *req, void *app);
/* POST /tokenize and /detokenize (vLLM's shapes), answered by a worker. */
void cg_gw_tokenize(cg_http_req *req, void *app);
void cg_gw_detokenize(cg_http_req *req, void *app);

#endif
