/* The fallback reasons, from the one table in server/fallback.h. */
#include "server/fallback.h"

#include <stdio.h>

#include "base/base.h"

static const struct {
    const char *name, *help;
} rows[CG_FALLBACK_COUNT] = {
#define CG_FALLBACK_ROW(e, name, help) [e] = {name, help},
    CG_FALLBACK_TABLE(CG_FALLBACK_ROW)
#undef CG_FALLBACK_ROW
};

const char *cg_fallback_name(cg_fallback f)
{
    return (unsigned)f < CG_FALLBACK_COUNT ? rows[f].name : NULL;
}

void cg_fallback_metrics(cg_metrics *m, cg_metric *out[CG_FALLBACK_COUNT])
{
    /* "by reason: no_worker (none registered or healthy), worker_error (...), model (...)." */
    char help[512];
    size_t n = (size_t)snprintf(help, sizeof help, "%s",
                                "Requests with cacheable segments served without KV reuse, by "
                                "reason:");
    for (int f = CG_FALLBACK_NONE + 1; f < CG_FALLBACK_COUNT && n < sizeof help; f++)
        n += (size_t)snprintf(help + n, sizeof help - n, " %s (%s)%s", rows[f].name, rows[f].help,
                              f + 1 < CG_FALLBACK_COUNT ? "," : ".");
    out[CG_FALLBACK_NONE] = NULL;
    for (int f = CG_FALLBACK_NONE + 1; f < CG_FALLBACK_COUNT; f++) {
        char labels[64];
        snprintf(labels, sizeof labels, "reason=\"%s\"", rows[f].name);
        out[f] = cg_metrics_counter(m, "chunkgate_fallback_reasons_total", help, labels);
    }
}
