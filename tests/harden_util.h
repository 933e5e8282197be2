/* Helpers shared by the hardening suites (tests/test_auth.c, test_limits.c, test_faults.c,
 * test_crash.c, test_keyhash.c, test_valgrind.c): start the real binaries on loopback with
 * their output in a log file, talk to them with libcurl or raw sockets, read metrics. */
#ifndef CG_HARDEN_UTIL_H
#define CG_HARDEN_UTIL_H

#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>
#include "base/base.h"

typedef struct hu_proc {
    pid_t pid;
    int port;
    char log[512];
} hu_proc;

/* Creates the suite's temporary directory (/tmp/cg_<name>_XXXXXX), ignores SIGPIPE and
 * initialises libcurl. Aborts on failure. */
void hu_init(const char *name);
/* The temporary directory. */
const char *hu_root(void);
/* Removes the temporary directory unless keep or CG_KEEP_TMP is set. */
void hu_cleanup(int keep);

void hu_sleep_ms(int ms);
double hu_now_s(void);
/* A file's bytes (NUL-terminated; "" when unreadable). Caller frees. */
char *hu_read_file(const char *path);
/* Writes text to path; returns 0 or -1. */
int hu_write_file(const char *path, const char *text);
/* rm -rf path. */
void hu_rmrf(const char *path);
/* A loopback port that was free a moment ago. */
int hu_free_port(void);

/* Starts bin with args (NULL-terminated) and env additions ("NAME=value", NULL-terminated,
 * may be NULL), stdout and stderr into hu_root()/logname. as_nobody: when running as root,
 * the child drops to uid/gid 65534 first (permission tests). marker: waits up to 60 s for it
 * in the log and reads the port that follows; NULL = do not wait. Returns 0 or -1. */
int hu_spawn(hu_proc *p, const char *bin, const char *const *args, const char *const *env,
             const char *logname, const char *marker, int as_nobody);
/* Sends sig and waits up to 20 s: the exit status, 128 + signal, or -1 (then SIGKILL). */
int hu_stop(hu_proc *p, int sig);
/* Waits up to timeout_ms for the process to exit by itself: its status as hu_stop, or -1. */
int hu_wait_exit(hu_proc *p, int timeout_ms);
/* For unchecked fixtures (which cannot fail a test): stops p with SIGTERM and counts a failure
 * in hu_failures when it does not exit 0 or its log holds a sanitizer report. Returns 1 when
 * clean. */
int hu_stop_clean(hu_proc *p, const char *what);
extern int hu_failures;

/* chunkgate-worker generate-model --out dir (the default tiny model). Returns 0 or -1. */
int hu_gen_model(const char *worker_bin, const char *dir);
/* chunkgate-worker serve on 127.0.0.1:port (0 = any), data dir hu_root()/<name>-data, log
 * <name>.log, pool 64 MiB, plus extra args. */
int hu_start_worker(hu_proc *p, const char *worker_bin, const char *model_dir, int port,
                    const char *name, const char *const *extra);
/* chunkgate on 127.0.0.1:0 with --data-dir hu_root()/<name>-data, log <name>.log, plus extra
 * args. */
int hu_start_gateway(hu_proc *p, const char *gateway_bin, const char *name,
                     const char *const *extra);

/* ---- HTTP with libcurl ---- */

typedef struct hu_resp {
    long status;
    cg_buf body;
    cg_buf head; /* response header lines */
    CURLcode rc;
    double secs;
} hu_resp;

/* One request to 127.0.0.1:port. body may be NULL; token: bearer token or NULL; headers:
 * extra header lines (NULL-terminated) or NULL. Free with hu_resp_free. */
void hu_http(hu_resp *r, int port, const char *method, const char *path, const char *body,
             const char *token, const char *const *headers);
void hu_resp_free(hu_resp *r);
/* The body as JSON, or NULL. Caller decrefs. */
json_t *hu_json(const hu_resp *r);
/* 1 when r is the OpenAI error shape with this status and code. */
int hu_is_error(const hu_resp *r, long status, const char *code);

/* The value of a Prometheus series (exact name with labels) in /metrics, or -1. */
double hu_metric(int port, const char *series);
/* Waits up to 30 s until GET /v1/workers on the gateway shows url healthy (or not). */
int hu_wait_worker(int gport, const char *token, const char *url, int healthy);

/* A streamed request: the data payloads of every event, in order (caller frees each and the
 * array). Returns the curl code; *status gets the HTTP status. */
CURLcode hu_sse(int port, const char *path, const char *body, const char *token, long *status,
                char ***events, int *n_events);
void hu_sse_free(char **events, int n);

/* ---- raw sockets ---- */

/* A connected TCP socket to 127.0.0.1:port, or -1. */
int hu_connect(int port);
/* Sends all bytes; returns 0 or -1. */
int hu_send(int fd, const void *p, size_t n);
/* Reads until the peer closes, timeout_ms passes, or max bytes; returns the bytes (caller
 * frees, NUL-terminated) and sets *closed to 1 when the peer closed or reset. */
char *hu_recv(int fd, int timeout_ms, size_t max, int *closed);
/* Reads one HTTP response with a Content-Length (keep-alive) or until close; returns it
 * (caller frees). */
char *hu_recv_response(int fd, int timeout_ms);

#endif
