/* The worker's operations routes: GET /healthz, /v1/info, /v1/models, /metrics. */
#ifndef CG_API_OPS_H
#define CG_API_OPS_H

#include "base/http.h"

/* GET /healthz, /v1/info, /v1/models and /metrics. */
cg_http_handler_fn cg_api_health, cg_api_info, cg_api_models, cg_api_metrics;

#endif
