/* The worker's operations routes: GET /healthz, /v1/info, /v1/models, /metrics. */
#ifndef CG_API_OPS_H
#define CG_API_OPS_H

#include "base/http.h"

void cg_api_health(cg_http_req *req, void *app);
void cg_api_info(cg_http_req *req, void *app);
void cg_api_models(cg_http_req *req, void *app);
void cg_api_metrics(cg_http_req *req, void *app);

#endif
