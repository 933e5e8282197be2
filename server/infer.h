/* The inference route handlers: POST /v1/completions and POST /v1/chat/completions. */
#ifndef CG_GW_INFER_H
#define CG_GW_INFER_H

#include "base/http.h"

void cg_gw_completions(cg_http_req *req, void *app);
void cg_gw_chat_completions(cg_http_req *req, void *app);

#endif
