/* Helpers on the gateway's state that every gateway module uses (server/gwstate.h). */
#include "server/gwstate.h"

#include <stdio.h>

void cg_gw_reply_error(cg_http_req *req, cg_status st, const char *param, const char *msg)
{
    cg_http_reply_error(req, st, param, msg && *msg ? msg : NULL);
}

const char *cg_gw_tenant(cg_gateway *g, cg_http_req *req)
{
    int k = cg_http_req_api_key(req);
    return g->tenants && k >= 0 && (size_t)k < g->cfg->api_keys.n ? g->tenants[k] : NULL;
}

void cg_gw_backend_error(cg_gateway *g, cg_failkind kind)
{
    char labels[64];
    snprintf(labels, sizeof labels, "kind=\"%s\"", cg_failkind_name(kind));
    cg_metrics_inc(g->metrics, "chunkgate_backend_errors_total", CG_GW_BACKEND_ERRORS_HELP, labels,
                   1);
}
