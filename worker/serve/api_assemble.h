/* The worker's assembly routes: POST /v1/assemble and DELETE /v1/assemblies/{id}. */
#ifndef CG_API_ASSEMBLE_H
#define CG_API_ASSEMBLE_H

#include "base/http.h"

cg_http_handler_fn cg_api_assemble, cg_api_assembly_delete;

#endif
