/* The OpenAI-specific side of the upstream client: the readiness probe (backends/openai.h). */
#include "backends/openai.h"

cg_status cg_openai_probe(cg_upstream *c, long timeout_ms, long *http_status, char *err,
                          size_t errlen)
{
    return cg_upstream_probe(c, CG_OPENAI_MODELS_PATH, timeout_ms, http_status, err, errlen);
}
