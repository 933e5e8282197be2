/* The chunkgate gateway: configuration table, application state and lifetime. The handlers
 * live in server/infer.c (completions, chat), server/relay.c (upstream relay, SSE),
 * server/admin.c (chunk admin) and server/gateway.c (operations routes). */
#ifndef CG_GATEWAY_H
#define CG_GATEWAY_H

#include <stddef.h>
#include <stdint.h>
#include "base/config.h"

/* Every setting of the chunkgate executable; filled by cg_config_parse from
 * cg_gateway_options. */
typedef struct cg_gateway_config {
    char *listen;
    char *backend;
    char *backend_api_key;
    cg_strlist workers;
    char *data_dir;
    char *admin_token;
    char *separator;
    char *chunk_mode;
    size_t max_body_bytes;
    long long max_segments;
    size_t max_upstream_bytes;
    char *model;
    long long backend_timeout_ms;
    long long connect_timeout_ms;
    long long io_threads;
    long long job_threads;
    long long heartbeat_ms;
    long long drain_ms;
    char *log_level;
    long long worker_timeout_ms;
    long long health_interval_ms;
    long long health_timeout_ms;
    long long sync_interval_ms;
    long long load_penalty_tokens;
    cg_strlist api_keys; /* --api-key, then the keys of --api-key-file (appended at load) */
    char *api_key_file;
    size_t max_header_bytes;
    size_t max_segment_bytes;
    long long max_connections;
    long long conn_timeout_s;
    char *key_hash;
    long long index_busy_timeout_ms;
} cg_gateway_config;

extern const cg_cfg_opt cg_gateway_options[];
extern const size_t cg_gateway_n_options;
#define CG_GATEWAY_USAGE "usage: chunkgate [--option VALUE]..."

/* Parses the environment and argv into *cfg (zeroed first) and checks the values the table
 * cannot (log level, chunk mode, separator, backend URL, listen address, key hash). Reads
 * --api-key-file and appends its keys to cfg->api_keys.
 * Returns CG_OK or CG_E_VALUE with a message in err. --help sets *want_help. */
cg_status cg_gateway_config_load(cg_gateway_config *cfg, int argc, char **argv, int *want_help,
                                 char *err, size_t errlen) CG_WUR;
/* Frees what cg_gateway_config_load stored. */
void cg_gateway_config_free(cg_gateway_config *cfg);

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
