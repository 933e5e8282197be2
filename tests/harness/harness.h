/* The test harness: what every Check suite and every bench that starts processes shares.
 * Runner helpers for Check suites, a per-suite temporary directory, the real binaries started
 * on loopback (port 0, the bound port read from the log), clean stops with sanitizer-report
 * detection, HTTP over libcurl (status, headers, body, timing; SSE streams; many requests at
 * once), raw sockets, JSON accessors, metric scrapes and wait-until helpers.
 *
 * Library cg_test_harness (tests/harness/); every cg_check_test links it. The in-process
 * reference answers (th_engine_answer) live in cg_test_engine, which adds the worker's
 * engine. Functions that assert (ck_assert) say so: call those only inside a test. */
#ifndef CG_TEST_HARNESS_H
#define CG_TEST_HARNESS_H

#include <check.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/base.h"
#include "cache/key.h"

/* ------------------------------------------------------------ Check runner */

/* The NULL-terminated list of tests th_case takes: TH_TESTS(test_a, test_b). */
#define TH_TESTS(...) ((const TTest *const[]){__VA_ARGS__, NULL})

/* Adds a test case named name to s with the NULL-terminated tests; timeout_s > 0 sets its
 * timeout (0 keeps Check's default, CK_DEFAULT_TIMEOUT). Returns the case (owned by s) for
 * fixtures. */
TCase *th_case(Suite *s, const char *name, double timeout_s, const TTest *const *tests);
/* Runs every case of s (taken over) in fork mode mode (CK_FORK_GETENV: as the CK_FORK variable
 * says, CK_FORK, CK_NOFORK) with Check's normal output; returns the exit status for main: 0 when
 * at least one test ran, every test passed and th_failures is 0, else 1 (a CK_RUN_CASE that
 * matches nothing fails). */
int th_run(Suite *s, enum fork_status mode);
/* Setup and teardown of a test case: around each test (each, a checked fixture) or once
 * around the whole case (an unchecked fixture, in the runner process). */
typedef struct th_fixture {
    void (*setup)(void);
    void (*teardown)(void);
    int each;
} th_fixture;

/* A suite with one case: tests, timeout_s as th_case, fixture fx (zeroed: none), fork mode as
 * th_run. Returns th_run's exit status. */
int th_run_suite(const char *suite, const char *tcase, double timeout_s, th_fixture fx,
                 enum fork_status mode, const TTest *const *tests);
/* th_run_suite without a fixture, fork mode from CK_FORK. */
int th_run_tests(const char *suite, const char *tcase, double timeout_s, const TTest *const *tests);

/* Failures counted outside a test (unchecked fixtures, th_stop_clean); th_run adds them. */
extern int th_failures;

/* ------------------------------------------------------------ files and time */

/* Harness-wide settings of a suite, from th_default_params(). */
typedef struct th_params {
    int start_wait_ms;   /* how long th_spawn waits for a start marker (60000) */
    long http_timeout_s; /* limit of one th_send / th_http request (120) */
    long sse_timeout_s;  /* limit of one th_sse_post stream (120) */
} th_params;

th_params th_default_params(void);
/* Starts an integration suite or bench: ignores SIGPIPE, initialises libcurl, applies p (NULL,
 * or a field left 0: the default) and creates the temporary directory /tmp/cg_<name>_XXXXXX (mode
 * 0755, so processes running as nobody reach it). Aborts when the directory cannot be made. */
void th_init(const char *name, const th_params *p);
/* The settings in force. */
const th_params *th_params_now(void);
/* The temporary directory of th_init. */
const char *th_root(void);
/* Writes th_root()/name into out (n bytes); returns out. */
char *th_path(char *out, size_t n, const char *name);
/* Removes the temporary directory unless keep is set or CG_KEEP_TMP is in the environment
 * (then it names the directory on stderr). */
void th_cleanup(int keep);
/* 1 when a log file (*.log) in the temporary directory holds an ASan, LSan or UBSan report
 * (the files are named on stderr), else 0: a suite's programs' reports fail the suite. */
int th_logs_have_sanitizer_reports(void);

/* A new directory /tmp/cg_<name>_XXXXXX for a unit suite; aborts on failure. The caller
 * removes it and frees the path with th_rmdtemp. */
char *th_mkdtemp(const char *name);
/* Removes a directory of th_mkdtemp (th_rmrf) and frees its path (taken over; NULL is fine). */
void th_rmdtemp(char *path);
/* rm -rf path (does not follow links). */
void th_rmrf(const char *path);
/* A file's bytes, NUL-terminated ("" when unreadable); *len (may be NULL) gets the size.
 * Caller frees. */
char *th_read_file(const char *path, size_t *len);
/* Writes n bytes to path (created or truncated); returns 0 or -1. */
int th_write_bytes(const char *path, const void *p, size_t n);
/* Writes the string text to path; returns 0 or -1. */
int th_write_file(const char *path, const char *text);
/* 1 when the file at path contains needle. */
int th_file_has(const char *path, const char *needle);

/* The executable name found on PATH (/usr/bin:/bin when unset), its path in out (n bytes);
 * returns 1, or 0 (out empty) when there is none. */
int th_which(const char *name, char *out, size_t n);

/* th_which for a program a suite cannot run without: 1 when found; else prints the SKIPPED line
 * naming the Debian package and returns 0 (the suite then exits 77). */
int th_need(const char *name, const char *package, char *out, size_t n);
/* th_init(name, NULL), then the tiny model generated by worker_bin into th_root()/model (its
 * path in model, n bytes). Returns 0, or -1 (said on stderr) when the model failed. */
int th_init_with_model(const char *name, const char *worker_bin, char *model, size_t n);

/* Flips bytes of the file at path behind its owner's back: in every slot of slot bytes that
 * holds end bytes, the bytes at first, first + step, ... below end are XORed with mask. Returns
 * the slots changed, or -1 on an I/O error. */
int th_flip_bytes(const char *path, size_t slot, size_t first, size_t step, size_t end,
                  uint8_t mask);

void th_sleep_ms(int ms);
/* Starts redis-server in the foreground on loopback port, without persistence, in dir (its
 * log redis.log there), as a child that dies with this process; waits until it answers PING.
 * Returns its pid, or -1 when it did not come up. */
pid_t th_redis_start(int port, const char *dir);
/* The next value of a SplitMix64 sequence (deterministic test data). */
uint64_t th_splitmix64(uint64_t *state);
/* The next value of an xorshift64* sequence (deterministic: a failure reproduces). */
uint64_t th_xorshift64s(uint64_t *state);
/* Runs the shell command cmd and reads its standard output whole: the bytes (NUL-terminated,
 * caller frees; "" when there were none, NULL when cmd could not be started), their length in
 * *len (may be NULL), and the command's exit code in *code (-1 when it did not exit). */
char *th_run_output(const char *cmd, size_t *len, int *code);
/* The median of v[0..n) (n > 0); sorts v. */
double th_median(double *v, int n);
/* The nearest-rank percentile p (0..1) of v[0..n): v[round(p * (n - 1))] once sorted; sorts
 * v; 0 when n is 0. */
double th_percentile(double *v, size_t n, double p);
/* The next value of a 64-bit LCG, its high 31 bits (the benches' text and data streams). */
uint32_t th_lcg32(uint64_t *state);
/* n bytes of word-like ASCII text starting with prefix and ending in '.', from the LCG at
 * state. Caller frees. */
char *th_words(size_t n, const char *prefix, uint64_t *state);
/* A deterministic, hash-like chunk key for integer i (real keys are XXH3 output: random
 * bytes); salt picks another sequence. */
cg_key th_key_of(uint64_t i, uint64_t salt);
/* 64-bit FNV-1a of n bytes (fingerprints a body compared across processes). */
uint64_t th_fnv1a(const void *p, size_t n);
/* th_fnv1a of the file at path, which must be readable (asserted). */
uint64_t th_file_fnv1a(const char *path);
/* Monotonic seconds. */
double th_now_s(void);

/* One command-line option of a bench, "--name value" (a flag takes no value): the value, read
 * with atoi / atol / atof, stored into *dst. */
typedef enum {
    TH_OPT_FLAG,   /* int, set to 1 */
    TH_OPT_INT,    /* int */
    TH_OPT_LONG,   /* long */
    TH_OPT_SIZE,   /* size_t */
    TH_OPT_DOUBLE, /* double */
    TH_OPT_STR,    /* const char *, borrowed from argv */
} th_opt_type;

typedef struct th_opt {
    const char *name;
    th_opt_type type;
    void *dst;
} th_opt;

/* Reads argv[1..argc) into the n options. Returns 0, or -1 when an option is unknown (it and
 * its value are skipped) or lacks its value. */
int th_parse_opts(int argc, char **argv, const th_opt *opts, size_t n);

/* ------------------------------------------------------------ processes */

typedef struct th_proc {
    pid_t pid;     /* 0 once reaped */
    int port;      /* the port read after the start marker, 0 before */
    int wstatus;   /* waitpid status once reaped (use WIFEXITED and friends) */
    char log[512]; /* stdout and stderr */
    char url[64];  /* http://127.0.0.1:<port> once started */
} th_proc;

enum {
    TH_NOBODY = 1, /* when running as root, drop to uid/gid 65534 first (permission tests) */
};

/* Starts bin with args (NULL-terminated, may be NULL) and env additions ("NAME=value",
 * NULL-terminated, may be NULL); stdout and stderr go to logname (relative to th_root(), or
 * absolute), emptied first so a restart never reads the previous run's port. The child dies
 * with the test process. marker: waits up to start_wait_ms for it in the log and reads the port
 * that follows; NULL = do not wait. flags: TH_NOBODY. Returns 0, or -1 when the start failed
 * (an exit during the wait leaves p->pid 0 and its status in p->wstatus). */
int th_spawn(th_proc *p, const char *bin, const char *const *args, const char *const *env,
             const char *logname, const char *marker, int flags);
/* CPU seconds (user + system, all threads) process pid has used so far, from /proc/PID/stat;
 * -1 when unreadable. */
double th_cpu_seconds(pid_t pid);
/* Waits up to timeout_ms for p to exit by itself: its exit status, 128 + signal, or -1. */
int th_wait_exit(th_proc *p, int timeout_ms);
/* Sends sig and waits up to 20 s: the exit status, 128 + signal, or -1 (then SIGKILL). */
int th_stop(th_proc *p, int sig);
/* 1 when p's log holds an AddressSanitizer, LeakSanitizer or UBSan report. */
int th_log_has_report(const th_proc *p);
/* Stops p with SIGTERM; when it does not exit 0 or its log holds a sanitizer report, says so
 * on stderr (naming what) and counts a failure in th_failures. Returns 1 when clean. For
 * fixtures, which cannot fail a test. */
int th_stop_clean(th_proc *p, const char *what);
/* Prints what failed and p's log to stderr, then aborts (for fixtures). */
void th_die(const char *what, const th_proc *p);
/* Unless OMP_WAIT_POLICY is set, sets it to passive and re-execs the program with argv (call it
 * first in main): libgomp reads the policy when it loads, before main, and its default
 * spin-wait keeps both cores busy after every parallel region, starving the OpenBLAS threads
 * of the next product (as chunkgate-worker serve does for itself). Exits 1 when the re-exec
 * fails. */
void th_omp_passive(char **argv);
/* Runs bin with args to completion (log in logname); returns its exit status as th_wait_exit
 * after at most 60 s, or -1. */
int th_run_cmd(const char *bin, const char *const *args, const char *logname);

/* chunkgate-worker generate-model --out dir plus extra args (NULL-terminated, may be NULL);
 * log gen.log. Returns 0 or -1. */
int th_gen_model(const char *worker_bin, const char *dir, const char *const *extra);
/* chunkgate-worker serve on 127.0.0.1:port (0 = any), log <name>.log, plus extra args; unless
 * extra names them, --data-dir th_root()/<name>-data and --pool-mb 64. Returns 0 or -1. */
int th_start_worker(th_proc *p, const char *worker_bin, const char *model_dir, int port,
                    const char *name, const char *const *extra);
/* chunkgate on 127.0.0.1:0, log <name>.log, plus extra args; unless extra names it,
 * --data-dir th_root()/<name>-data. Returns 0 or -1. */
int th_start_gateway(th_proc *p, const char *gateway_bin, const char *name,
                     const char *const *extra);
/* th_start_gateway with --worker worker_url before extra, then waits until the gateway reports
 * that worker healthy (th_wait_worker; token for GET /v1/workers, may be NULL). Returns 0 or
 * -1. */
int th_start_gateway_to(th_proc *p, const char *gateway_bin, const char *name,
                        const char *worker_url, const char *token, const char *const *extra);
/* tests/fake_backend with args, log <name>.log (it prints "PORT <n>"). Returns 0 or -1. */
int th_start_fake(th_proc *p, const char *fake_bin, const char *name, const char *const *args);

/* ------------------------------------------------------------ HTTP */

/* One request; every field but path may be left 0. */
typedef struct th_req {
    const char *method;         /* NULL: GET, or POST when there is a body */
    const char *path;           /* "/v1/..." on 127.0.0.1:port */
    const char *body;           /* borrowed; NULL = none */
    size_t len;                 /* body bytes; 0 = strlen(body) */
    const char *token;          /* bearer token or NULL */
    const char *const *headers; /* extra header lines, NULL-terminated, or NULL */
    int chunked;                /* upload the body with Transfer-Encoding: chunked */
    size_t stop_after;          /* hang up once this many body bytes arrived (0 = never) */
    long timeout_s;             /* 0 = th_params.http_timeout_s */
} th_req;

typedef struct th_resp {
    long status; /* 0 when no answer came */
    CURLcode rc;
    cg_buf body;
    cg_buf head;     /* the response header lines */
    char ctype[128]; /* Content-Type, "" when absent */
    char rid[96];    /* X-Request-Id, "" when absent */
    double secs;     /* how long the request took */
} th_resp;

/* A new easy handle for JSON requests (Content-Type: application/json, no Expect, TCP_NODELAY,
 * no signals, timeout_s) that hands the answer's bytes to write(ud); it keeps its connection
 * across requests. *headers gets the header list: free it with curl_slist_free_all after
 * curl_easy_cleanup. */
CURL *th_easy_json(curl_write_callback write, void *ud, long timeout_s,
                   struct curl_slist **headers);
/* Sends q to 127.0.0.1:port (with Content-Type: application/json and no Expect) and fills r;
 * free r with th_resp_free. */
void th_send(th_resp *r, int port, const th_req *q);
/* th_send of method path with body (may be NULL), bearer token (may be NULL) and extra header
 * lines (NULL-terminated, may be NULL). */
void th_http(th_resp *r, int port, const char *method, const char *path, const char *body,
             const char *token, const char *const *headers);
void th_resp_free(th_resp *r);
/* The value of response header name (case-insensitive, trimmed) copied into out (n bytes);
 * "" when absent. Returns out. */
char *th_header(const th_resp *r, const char *name, char *out, size_t n);
/* The body as JSON, or NULL. Caller decrefs. */
json_t *th_json(const th_resp *r);
/* The body as JSON; asserts that it is. Caller decrefs. */
json_t *th_body_json(const th_resp *r);
/* method path on port with body (taken over, may be NULL) and token (may be NULL); asserts the
 * status is want and the answer JSON. Returns it (caller decrefs). */
json_t *th_call(int port, const char *method, const char *path, json_t *body, const char *token,
                long want);
/* th_call with a string body (borrowed, may be NULL). */
json_t *th_call_text(int port, const char *method, const char *path, const char *body,
                     const char *token, long want);
/* method path on port with body (borrowed, may be NULL) and token; asserts the status is want.
 */
void th_expect(int port, const char *method, const char *path, const char *body, const char *token,
               long want);
/* Sends q n times at once, over n connections, and waits for all; r[i] gets answer i (free
 * each with th_resp_free). */
void th_send_many(th_resp *r, int n, int port, const th_req *q);

/* The next transfer of m that has finished, removed from m, or NULL when none has; *rc gets its
 * result and *priv (may be NULL) its CURLOPT_PRIVATE pointer. */
CURL *th_multi_done(CURLM *m, CURLcode *rc, void **priv);

/* 1 when j is the OpenAI error shape with this code: an error object with a non-empty string
 * message, a string type, a param that is null or a string, and code. */
int th_is_error_json(json_t *j, const char *code);
/* 1 when r has this status and its body is the error shape of th_is_error_json. */
int th_is_error(const th_resp *r, long status, const char *code);
/* Asserts th_is_error_json, and the param when param is not NULL. */
void th_assert_error_json(json_t *j, const char *code, const char *param);
/* Asserts r's status and th_assert_error_json of its body. */
void th_assert_error(const th_resp *r, long status, const char *code, const char *param);

/* JSON accessors: a member's string (NULL), integer (0) or truth (0). */
const char *th_sget(json_t *j, const char *k);
long long th_iget(json_t *j, const char *k);
int th_bget(json_t *j, const char *k);
/* j's text, compact; takes j over. Caller frees. */
char *th_dumps(json_t *j);

/* The RAG texts the worker suites share: a system prompt, two documents, a question. */
#define TH_SYSTEM "You are a careful assistant. Answer from the documents only."
#define TH_DOC_A                                                                                   \
    "Document A. Annual rainfall in the valley averaged 812 millimetres between 1990 and "         \
    "2020; in 2024 two gauges were replaced."
#define TH_DOC_B                                                                                   \
    "Document B. The cooperative's bylaws were amended in March: members may vote by post "        \
    "and the quorum fell to one third."
#define TH_DOC_C                                                                                   \
    "Document C. The river flooded twice in 2023 and the levee was raised by one metre in the "    \
    "spring of 2024, at a cost of 2.1 million."
#define TH_DOC_D                                                                                   \
    "Document D. Ferry schedules changed in June: boats now leave every forty minutes instead "    \
    "of every hour, and the last one is at 23:10."
#define TH_DOC_E                                                                                   \
    "Document E. The library extended its opening hours to Sundays and added a repair cafe on "    \
    "the first Saturday of each month since 2022."
#define TH_DOC_F                                                                                   \
    "Document F. A new bus line links the station to the hospital; it runs every twelve minutes "  \
    "on weekdays and every half hour on Sundays."
#define TH_QUESTION "What changed in 2024?"

/* The RAG prompt "sys # # d1 # # d2 # # q" (d2 NULL: "sys # # d1 # # q"). Caller frees. */
char *th_rag(const char *sys, const char *d1, const char *d2, const char *q);
/* The segments of the same prompt for POST /v1/assemble: system, chunk d1, chunk d2 (left out
 * when NULL), question. New reference. */
json_t *th_segments(const char *sys, const char *d1, const char *d2, const char *q);

/* ------------------------------------------------------------ SSE */

/* A streamed request, split into blocks as it arrives (a block ends at a blank line). */
typedef struct th_sse {
    /* set before th_sse_post (optional) */
    int stop_after;   /* hang up after this many data blocks (0 = never) */
    pid_t kill_after; /* SIGKILL this pid once the first data block arrived (0 = none) */
    int keep_cr;      /* keep '\r' (default: removed, so CRLF streams split the same) */
    long timeout_s;   /* 0 = th_params.sse_timeout_s */
    /* results */
    long status;
    char ctype[128];
    int n;           /* blocks */
    char **block;    /* the text of each block, without its blank line */
    double *t;       /* th_now_s() when each block arrived */
    int data_blocks; /* blocks that start with "data:" */
    cg_buf raw;      /* everything received */
    size_t scanned;
    int cap;
} th_sse;

/* POSTs body (borrowed) to path on port with token (may be NULL) and reads the stream into s
 * (its options kept, its results reset). Returns the curl code. Free with th_sse_free. */
CURLcode th_sse_post(th_sse *s, int port, const char *path, const char *body, const char *token);
/* Adds n received bytes to s and cuts off its complete blocks (for streams read otherwise,
 * e.g. th_send_many); s may start zeroed. Returns 0 or -1. */
int th_sse_feed(th_sse *s, const char *d, size_t n);
void th_sse_free(th_sse *s);
/* The JSON of block i when it is "data: {...}", else NULL. Caller decrefs. */
json_t *th_sse_json(const th_sse *s, int i);
/* A streamed request read whole: the data payloads of its blocks, in order (a last block
 * without its blank line counts; '\r' kept). *events and each payload are the caller's
 * (th_sse_data_free). Returns the curl code; *status gets the HTTP status. */
CURLcode th_sse_data(int port, const char *path, const char *body, const char *token, long *status,
                     char ***events, int *n_events);
void th_sse_data_free(char **events, int n);

/* ------------------------------------------------------------ metrics and waiting */

/* The value of a Prometheus series (exact name with labels, at a line start) in text; 1 when
 * found (*v set), else 0. */
int th_metric_find(const char *text, const char *series, double *v);
/* The value of series in text, or -1 when absent. */
double th_metric_in(const char *text, const char *series);
/* GET /metrics on port (asserts 200); returns the text, caller frees. */
char *th_scrape(int port);
/* The value of series in port's /metrics (asserts the scrape answered 200), or -1 when
 * absent. */
double th_metric(int port, const char *series);
/* The same, 0 when absent (a counter that has not moved). */
double th_counter(int port, const char *series);
/* th_counter, read again for up to 5 s until it reaches at least want; returns the last value.
 * For the series a server bumps in its request-finished callback (requests_total,
 * request_duration_seconds), which runs after the client already holds the whole reply. */
double th_counter_settled(int port, const char *series, double want);

/* Waits up to timeout_ms, every step_ms, until cond(arg) returns non-zero; returns 1, or 0 on
 * timeout. */
int th_wait_until(int timeout_ms, int step_ms, int (*cond)(void *), void *arg);
/* Waits up to 30 s until GET /healthz on port answers 200; returns 1 or 0. */
int th_wait_healthz(int port);
/* Waits up to 30 s until GET /v1/workers on the gateway (token may be NULL) shows the worker
 * at url healthy (1) or not (0); returns 1 or 0. */
int th_wait_worker(int gport, const char *token, const char *url, int healthy);
/* The gateway's entry for the worker at url in GET /v1/workers (token may be NULL): a new
 * reference, or NULL when the gateway lists no such worker. */
json_t *th_worker_view(int gport, const char *token, const char *url);
/* Waits up to 30 s until the gateway sees the worker at url (every worker when url is NULL)
 * idle: nothing in flight from this gateway, nothing running or queued at its last health
 * check; returns 1 or 0. */
int th_wait_workers_idle(int gport, const char *token, const char *url);

/* ------------------------------------------------------------ SQLite files */

/* The first column of the first row sql gives on the database at path, opened read-only, as
 * text; asserts there is one. Caller frees. */
char *th_sql_text(const char *path, const char *sql);
/* Runs sql on the database at path (tampering, as a bug or an operator could); asserts it
 * worked. */
void th_sql_exec(const char *path, const char *sql);

/* ------------------------------------------------------------ raw sockets */

/* A loopback port that was free a moment ago (for a process that must restart on it). */
int th_free_port(void);
/* 1 when loopback TCP port is free to bind now. */
int th_port_free(int port);
/* A listening loopback socket that never accepts by itself (non-blocking, so accept() tells
 * whether anyone connected); *port gets its port. Returns the fd or -1. */
int th_listen_silent(int *port);
/* A connected TCP socket to 127.0.0.1:port, or -1. */
int th_connect(int port);
/* A loopback connection to port whose receive buffer is 4 KiB (a client that reads slowly or
 * not at all fills it at once). Asserts. */
int th_connect_small_rcvbuf(int port);
/* Sends all n bytes; returns 0 or -1. */
int th_send_all(int fd, const void *p, size_t n);
/* Sends POST path with the JSON text body on the connected socket fd (HTTP/1.1, with a
 * Content-Length; the answer is left for the caller to read). Asserts. */
void th_send_post(int fd, const char *path, const char *body);
/* Reads until the peer closes, timeout_ms passes or max bytes came; returns the bytes (caller
 * frees, NUL-terminated) and sets *closed to 1 when the peer closed or reset. */
char *th_recv(int fd, int timeout_ms, size_t max, int *closed);
/* Reads one HTTP response with a Content-Length (keep-alive) or until close; returns it
 * (caller frees). */
char *th_recv_response(int fd, int timeout_ms);

/* ------------------------------------------------------------ reference answers */
/* In cg_test_engine (tests/harness/engine.c), for suites that hold the model in-process. */

typedef struct cg_model cg_model;
/* chunkgate-worker generate-model --out dir plus extra args (th_gen_model), then the model
 * opened in-process. NULL when either fails (said on stderr). Close with cg_model_close. */
cg_model *th_model_gen_open(const char *worker_bin, const char *dir, const char *const *extra);
#define TH_MODEL_TMP 64
/* The model at dir, or with dir NULL the tiny model generated in process into a fresh
 * directory under /tmp, whose path is left in tmp for the caller to remove (th_rmrf; tmp is ""
 * when nothing was made). NULL, with the reason in err, when either step fails. */
cg_model *th_model_open_or_generate(const char *dir, char tmp[TH_MODEL_TMP], char *err, size_t n);
/* For the bench called name: th_model_open_or_generate, exiting with the reason on stderr when
 * it fails, then the model's geometry printed on stdout. */
cg_model *th_bench_model(const char *name, const char *dir, char tmp[TH_MODEL_TMP]);
/* Closes a model of th_bench_model (*m set to NULL) and removes the one it generated in tmp. */
void th_bench_model_close(cg_model **m, const char tmp[TH_MODEL_TMP]);
/* cg_tok_encode of text[0, len) (with BOS when bos is set) into out, which the caller sized for
 * a byte tokenizer (len + 2 ids); returns the count. */
uint32_t th_tok_into(const cg_model *m, const char *text, size_t len, int bos, int32_t *out);
typedef struct cg_engine cg_engine;
struct cg_assembly_info;
struct cg_engine_seg;
/* The segments of a prompt into segs (room for n + 2): system sys (NULL: none), then as chunks
 * docs[order[0]], ..., docs[order[n - 1]] (order NULL: the first n in order), then question q
 * (NULL: none); the text is borrowed. Returns the count. */
size_t th_engine_segs(struct cg_engine_seg *segs, const char *sys, const char *const *docs,
                      const int *order, size_t n, const char *q);
/* Assembles the strict-mode prompt sys, d1, d2, q with e (borrowed) on path (at clock 1 ms);
 * asserts it worked. *info is the caller's (cg_assembly_info_free). */
void th_engine_assemble(cg_engine *e, const char *sys, const char *d1, const char *d2,
                        const char *q, int path, struct cg_assembly_info *info);
/* The greedy answer of an in-process engine on model m (borrowed) to the strict-mode prompt
 * sys, d1, d2, q computed on path (an engine path: CG_PATH_REFERENCE, CG_PATH_BYPASS, ...),
 * sanitised to UTF-8 as the worker does; asserts every step. Caller frees. */
char *th_engine_answer(cg_model *m, const char *sys, const char *d1, const char *d2, const char *q,
                       uint32_t max_tokens, int path);

/* The RAG workload of the TTFT benches (bench_ttft, bench_shared): a system prompt of
 * TH_RAG_SYS_BYTES, TH_RAG_DOCS documents of TH_RAG_DOC_BYTES and a question of
 * TH_RAG_Q_BYTES, pseudo-words from *state, the documents headed "Document TAG-d.". cold: the
 * documents in order under sys; warm: the same documents reordered 2, 0, 3, 1 under sys2 (a
 * changed system prompt); both end in q. Free with th_rag_free. */
#define TH_RAG_DOCS 4
#define TH_RAG_SYS_BYTES 256
#define TH_RAG_DOC_BYTES 2048
#define TH_RAG_Q_BYTES 64
typedef struct th_rag_work {
    char *sys, *sys2, *q, *docs[TH_RAG_DOCS];
    struct cg_engine_seg *cold, *warm; /* TH_RAG_DOCS + 2 each */
} th_rag_work;
void th_rag_make(th_rag_work *w, const char *tag, uint64_t *state);
void th_rag_free(th_rag_work *w);

/* ------------------------------------------------------------ Redis */
/* In cg_test_redis (tests/harness/redis.c), for suites that link hiredis. */

typedef struct redisContext redisContext;
/* A connection to the redis-server on loopback port with 2 s timeouts (check ->err). */
redisContext *th_redis_connect(int port);
/* The integer reply of the command cmd (no arguments to format) on port. Asserts. */
long long th_redis_int(int port, const char *cmd);
/* 1 when the redis-server on port answers PING. */
int th_redis_up(int port);
/* Starts `server` (a redis-server binary) on loopback port as the test's th_proc (kill -9 and
 * th_stop work; th_redis_start is the plain-pid form for benches), without persistence, plus
 * the NULL-terminated extra arguments (or NULL); waits until it answers. Asserts. */
void th_redis_spawn(th_proc *p, const char *server, int port, const char *const *extra);

#endif
