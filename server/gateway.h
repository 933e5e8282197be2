/* The chunkgate gateway: lifetime, route table and operations routes. Its configuration is
 * server/gwconfig.h; the handlers live in server/infer.c (completions, chat),
 * server/relay.c (upstream relay, SSE), server/admin.c (chunk admin). */
#ifndef CG_GATEWAY_H
#define CG_GATEWAY_H

#include <stddef.h>
#include <stdint.h>
#include "server/gwconfig.h"

typedef struct cg_gateway cg_gateway;

/* Creates the data directory, opens the index, starts the upstream client, registers the
 * --worker list (a reachable worker that does not match the others fails the start), starts
 * the health checks and the HTTP server. cfg is borrowed and must outlive the gateway. *out
 * is owned by the caller. */
cg_status cg_gateway_open(const cg_gateway_config *cfg, cg_gateway **out) CG_WUR;
/* The bound port (the real one when the listen port was 0). */
uint16_t cg_gateway_port(const cg_gateway *g);
/* Graceful stop: stop accepting, let upstream transfers finish for up to cfg->drain_ms,
 * cancel the rest, stop the HTTP server, flush and close the index. Accepts NULL; sets
 * *g to NULL. */
void cg_gateway_close(cg_gateway **g);

#endif
