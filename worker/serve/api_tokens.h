/* The worker's POST /tokenize and POST /detokenize (vLLM's shapes). */
#ifndef CG_API_TOKENS_H
#define CG_API_TOKENS_H

#include "base/http.h"

cg_http_handler_fn cg_api_tokenize, cg_api_detokenize;

#endif
