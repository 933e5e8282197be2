/* The upstream failure kinds, from the one table in server/failkind.h. */
#include "server/failkind.h"

static const struct {
    const char *label;
    int http;
    cg_status status;
    int down, worker;
} rows[CG_FAILKIND_COUNT] = {
#define CG_FAILKIND_ROW(e, label, http, status, down, worker)                                      \
    [e] = {label, http, status, down, worker},
    CG_FAILKIND_TABLE(CG_FAILKIND_ROW)
#undef CG_FAILKIND_ROW
};

const char *cg_failkind_name(cg_failkind k)
{
    return (unsigned)k < CG_FAILKIND_COUNT ? rows[k].label : "unknown";
}

int cg_failkind_http(cg_failkind k)
{
    return (unsigned)k < CG_FAILKIND_COUNT ? rows[k].http : 502;
}

cg_status cg_failkind_status(cg_failkind k)
{
    return (unsigned)k < CG_FAILKIND_COUNT ? rows[k].status : CG_E_BAD_GATEWAY;
}

int cg_failkind_marks_down(cg_failkind k)
{
    return (unsigned)k < CG_FAILKIND_COUNT && rows[k].down;
}

int cg_failkind_of_worker(cg_failkind k)
{
    return (unsigned)k < CG_FAILKIND_COUNT && rows[k].worker;
}

cg_failkind cg_failkind_of(cg_status st, cg_failkind otherwise)
{
    return st == CG_E_TIMEOUT       ? CG_FAIL_TIMEOUT
           : st == CG_E_UNAVAILABLE ? CG_FAIL_CONNECT
                                    : otherwise;
}
