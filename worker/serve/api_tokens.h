/* The worker's POST /tokenize and POST /detokenize (vLLM's shapes). */
#ifndef CG_API_TOKENS_H
#define CG_API_TOKENS_H

#include "base/http.h"

void cg_api_tokenize(cg_http_req *req, void *app);
void cg_api_detokenize(cg_http_req *req, void *app);

#endif
