/* The worker's POST /v1/completions: from an assembly (local or pulled), a "# #" prompt or a
 * plain prompt, as JSON or an SSE stream, with logprobs. */
#ifndef CG_API_COMPLETE_H
#define CG_API_COMPLETE_H

#include "base/http.h"

void cg_api_completions(cg_http_req *req, void *app);

#endif
