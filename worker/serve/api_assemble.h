/* The worker's assembly routes: POST /v1/assemble and DELETE /v1/assemblies/{id}. */
#ifndef CG_API_ASSEMBLE_H
#define CG_API_ASSEMBLE_H

#include "base/http.h"

void cg_api_assemble(cg_http_req *req, void *app);
void cg_api_assembly_delete(cg_http_req *req, void *app);

#endif
