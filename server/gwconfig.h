/* The gateway's configuration: one table drives its flags, CHUNKGATE_* environment variables,
 * validation and --help (base/config.h). */
#ifndef CG_GWCONFIG_H
#define CG_GWCONFIG_H

#include <stddef.h>
#include "base/config.h"

/* Every setting of the chunkgate executable; filled by cg_config_parse from
 * cg_gateway_options. */
typedef struct cg_gateway_config {
    char *listen;
    char *backend;
    char *backend_api_key;
    char *worker_api_key; /* --worker-api-key, or the key of --worker-api-key-file */
    char *worker_api_key_file;
    cg_strlist workers;
    char *data_dir;
    char *admin_token;
    char *separator;
    int chunk_mode; /* cg_mode */
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
    int log_level; /* cg_log_level */
    long long worker_timeout_ms;
    long long health_interval_ms;
    long long health_timeout_ms;
    long long sync_interval_ms;
    long long load_penalty_tokens;
    long long remote_hit_percent;
    char *events; /* --events: the workers' chunk event stream on Redis */
    char *events_stream;
    char *events_password_file;
    cg_strlist api_keys; /* --api-key, then the keys of --api-key-file (appended at load) */
    char *api_key_file;
    size_t max_header_bytes;
    size_t max_segment_bytes;
    long long max_connections;
    long long conn_timeout_s;
    size_t sndbuf;
    int key_hash; /* cg_key_hash */
    long long index_busy_timeout_ms;
    cg_strlist recompute_defaults; /* --recompute-default MODEL=RATIO[:PREFIX_TOKENS] */
    long long max_json_values;
    long long max_json_depth;
} cg_gateway_config;

/* Per-model recompute defaults (--recompute-default) for requests that send none. */
typedef struct cg_gw_recompute {
    double ratio;     /* recompute_ratio */
    long long prefix; /* recompute_prefix_tokens; -1 = not set */
} cg_gw_recompute;
/* The default of model (exact name first, then "*"): 1 with *out filled, or 0 without one. */
int cg_gateway_recompute_default(const cg_gateway_config *cfg, const char *model,
                                 cg_gw_recompute *out);

extern const cg_cfg_opt cg_gateway_options[];
extern const size_t cg_gateway_n_options;
#define CG_GATEWAY_USAGE "usage: chunkgate [--option VALUE]..."

/* Parses the environment and argv into *cfg (zeroed first) and checks the values the table
 * cannot (separator, backend URL, listen address, API keys). Reads
 * --api-key-file and appends its keys to cfg->api_keys.
 * Returns CG_OK or CG_E_VALUE with a message in err. --help sets *want_help. */
cg_status cg_gateway_config_load(cg_gateway_config *cfg, int argc, char **argv, int *want_help,
                                 char *err, size_t errlen) CG_WUR;
/* Frees what cg_gateway_config_load stored. */
void cg_gateway_config_free(cg_gateway_config *cfg);

#endif
