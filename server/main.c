/* chunkgate: the gateway executable. Parses the configuration, starts the gateway, logs the
 * bound address, and stops gracefully on SIGINT/SIGTERM. Exit status: 0 after a clean stop,
 * 1 when startup fails, 2 for a bad configuration. */
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include "cache/key.h"
#include "server/gateway.h"
#include "base/base.h"
#include "base/signals.h"

/* Every streamed answer holds two sockets (client and backend), so 1,000 streams need more
 * descriptors than the usual soft limit of 1024: raise it to the hard limit. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
    rlim_t before = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
        cg_log(CG_LOG_DEBUG, "open file limit raised from %llu to %llu", (unsigned long long)before,
               (unsigned long long)rl.rlim_cur);
}

int main(int argc, char **argv)
{
    cg_gateway_config cfg;
    cg_gateway *g = NULL;
    char err[512] = "";
    int help = 0, rc = 0;

    if (cg_gateway_config_load(&cfg, argc, argv, &help, err, sizeof err) != CG_OK) {
        fprintf(stderr, "chunkgate: %s\n", err);
        rc = 2;
        goto out;
    }
    if (help) {
        cg_config_help(stdout, CG_GATEWAY_USAGE, cg_gateway_options, cg_gateway_n_options);
        goto out;
    }
    cg_log_init("chunkgate", (cg_log_level)cfg.log_level);

    cg_signals_block_stop(); /* before any thread starts; taken below */

    raise_fd_limit();
    /* Buffers of 256 KiB and more (request bodies, prompt strings, forwarded bodies) get their
     * own mappings and go back to the system when freed. Setting the threshold also stops
     * glibc from raising it after each large free, which would put the next 8 MiB bodies on
     * the heap for good. Smaller frees are returned by the HTTP layer's heap trim, every
     * 16 MiB; glibc's own trim of the heap top on every free past 128 KiB is off, as it
     * would give pages back and fault them in again request after request. */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024);
    if (cg_gateway_open(&cfg, &g) != CG_OK) {
        rc = 1;
        goto out;
    }
    const char *colon = strrchr(cfg.listen, ':');
    cg_log(CG_LOG_INFO, "listening on %.*s:%u", (int)(colon - cfg.listen), cfg.listen,
           (unsigned)cg_gateway_port(g));
    /* Counts only: neither a key nor the admin token is ever logged. */
    cg_log(CG_LOG_INFO,
           "backend %s, %zu worker(s), data dir %s, admin routes %s, inference routes %s "
           "(%zu API key(s)), key hash %s",
           cfg.backend ? cfg.backend : "(none: the chosen worker answers)", cfg.workers.n,
           cfg.data_dir,
           cfg.admin_token  ? "need the admin token"
           : cfg.api_keys.n ? "closed"
                            : "open",
           cfg.api_keys.n ? "need an API key" : "open", cfg.api_keys.n,
           cg_key_hash_names[cfg.key_hash]);

    cg_signals_wait_stop();
    cg_gateway_close(&g);
    cg_log(CG_LOG_INFO, "stopped");
out:
    cg_gateway_config_free(&cfg);
    return rc;
}
