/* Process-wide basics shared by every component: an allocator that aborts on OOM,
 * JSON-lines logging with the request id, monotonic time. */
#ifndef CG_BASE_H
#define CG_BASE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include "base/status.h"

#define CG_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CG_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Allocation never returns NULL: out of memory aborts the process (Redis zmalloc). */
void *cg_malloc(size_t n);
void *cg_calloc(size_t count, size_t size);
void *cg_realloc(void *p, size_t n);
char *cg_strdup(const char *s);
char *cg_strndup(const char *s, size_t n);
/* Frees *pp and sets it to NULL; accepts NULL and *pp == NULL. */
#define cg_free(pp)                                                                                \
    do {                                                                                           \
        free(*(pp));                                                                               \
        *(pp) = NULL;                                                                              \
    } while (0)

/* Growable byte buffer with a hard cap (curl dynbuf). Owns its bytes. Every buffer names its
 * cap when it starts; one whose size something else already bounds starts unbounded, by name. */
typedef struct cg_buf {
    char *data; /* always NUL-terminated when len > 0 or after cg_buf_append */
    size_t len;
    size_t cap;
    size_t max; /* most bytes it may hold; SIZE_MAX when unbounded */
} cg_buf;
/* Starts an empty buffer that holds at most max bytes. max must not be 0: a missing cap is a
 * programming error, asserted; where assertions are off, the buffer holds nothing and every
 * non-empty append fails with CG_E_TOO_LARGE. A zeroed cg_buf is the same mistake. */
void cg_buf_init(cg_buf *b, size_t max);
/* Starts an empty buffer without a cap, for one whose size something else bounds: the caller
 * says what, next to the call. */
void cg_buf_init_unbounded(cg_buf *b);
/* Appends n bytes. Returns CG_E_TOO_LARGE when len + n would exceed max. */
cg_status cg_buf_append(cg_buf *b, const void *p, size_t n) CG_WUR;
cg_status cg_buf_printf(cg_buf *b, const char *fmt, ...) CG_WUR
    __attribute__((format(printf, 2, 3)));
void cg_buf_reset(cg_buf *b);
void cg_buf_free(cg_buf *b);

typedef enum { CG_LOG_DEBUG, CG_LOG_INFO, CG_LOG_WARN, CG_LOG_ERROR } cg_log_level;

/* Sets the minimum level that is written (default INFO) and the program name. */
void cg_log_init(const char *program, cg_log_level min_level);
/* Sets the request id that cg_log() adds to every line from this thread (copied; NULL clears). */
void cg_log_set_request_id(const char *rid);
const char *cg_log_request_id(void);
/* Writes one JSON line to stderr: {"ts","level","prog","rid","msg"}. No trailing newline in fmt. */
void cg_log(cg_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Formats a message into err (errlen bytes, always NUL-terminated, truncated to fit); does
 * nothing when err is NULL or errlen is 0. Fallible functions that take (err, errlen) describe
 * their failure with it. */
void cg_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Monotonic clock in nanoseconds / milliseconds; wall clock in milliseconds since the epoch. */
uint64_t cg_now_ns(void);
uint64_t cg_now_ms(void);
uint64_t cg_wall_ms(void);

/* Initialises cv to time its waits on CLOCK_MONOTONIC, so that a wall-clock step neither
 * shortens nor stretches them. Destroy it with pthread_cond_destroy. */
void cg_cond_init_monotonic(pthread_cond_t *cv);
/* The absolute CLOCK_MONOTONIC time ms milliseconds from now, for pthread_cond_timedwait on a
 * condition variable made by cg_cond_init_monotonic (every timed wait in chunkgate is). */
struct timespec cg_deadline_after_ms(uint64_t ms);
/* Stops th, a thread that waits on cv under mu until *stop is set: sets *stop under mu, wakes
 * every waiter on cv, and joins th. */
void cg_thread_stop(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, int *stop);

/* Constant-time comparison of two NUL-terminated secrets; returns 1 if equal. */
int cg_secret_equal(const char *a, const char *b);

/* Lowercase hex of n bytes into out (2n+1 bytes). Parses 2n hex chars; returns 0 on success. */
void cg_hex_encode(const uint8_t *in, size_t n, char *out);
int cg_hex_decode(const char *in, size_t n_bytes, uint8_t *out);

#endif
