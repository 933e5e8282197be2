/* Process-wide basics: status table, aborting allocator, capped buffers, JSON-lines log, clocks. */
#include "base/base.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

static const struct {
    int http;
    const char *type, *code, *msg, *name;
} status_rows[] = {
#define CG_STATUS_ROW(name, http, type, code, msg) {http, type, code, msg, #name},
    CG_STATUS_TABLE(CG_STATUS_ROW)
#undef CG_STATUS_ROW
};

static unsigned status_index(cg_status st)
{
    return (unsigned)st < CG_STATUS_COUNT ? (unsigned)st : (unsigned)CG_E_INTERNAL;
}
int cg_status_http(cg_status st)
{
    return status_rows[status_index(st)].http;
}
const char *cg_status_type(cg_status st)
{
    return status_rows[status_index(st)].type;
}
const char *cg_status_code(cg_status st)
{
    return status_rows[status_index(st)].code;
}
const char *cg_status_message(cg_status st)
{
    return status_rows[status_index(st)].msg;
}
const char *cg_status_name(cg_status st)
{
    return status_rows[status_index(st)].name;
}

cg_status cg_status_from_http(int http)
{
    for (unsigned i = 1; i < CG_STATUS_COUNT; i++)
        if (status_rows[i].http == http) return (cg_status)i;
    return http >= 500 ? CG_E_BAD_GATEWAY : http >= 400 ? CG_E_VALUE : CG_E_INTERNAL;
}

static void oom(size_t n)
{
    fprintf(stderr, "{\"level\":\"error\",\"msg\":\"out of memory allocating %zu bytes\"}\n", n);
    abort();
}

void *cg_malloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *cg_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *cg_realloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *cg_strdup(const char *s)
{
    return cg_strndup(s, strlen(s));
}

char *cg_strndup(const char *s, size_t n)
{
    char *p = cg_malloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void cg_buf_init(cg_buf *b, size_t max)
{
    assert(max > 0 && "a cg_buf needs a cap; cg_buf_init_unbounded says when it does not");
    b->data = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void cg_buf_init_unbounded(cg_buf *b)
{
    cg_buf_init(b, SIZE_MAX);
}

static cg_status buf_reserve(cg_buf *b, size_t extra)
{
    assert(b->max > 0 && "a cg_buf is appended to only after one of its init calls");
    /* SIZE_MAX - 1 keeps len + extra + 1 (the NUL) from wrapping in an unbounded buffer. */
    size_t max = CG_MIN(b->max, SIZE_MAX - 1);
    if (extra > max || b->len > max - extra) return CG_E_TOO_LARGE;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return CG_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    b->data = cg_realloc(b->data, cap);
    b->cap = cap;
    return CG_OK;
}

cg_status cg_buf_append(cg_buf *b, const void *p, size_t n)
{
    cg_status st = buf_reserve(b, n);
    if (st != CG_OK) return st;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return CG_OK;
}

cg_status cg_buf_printf(cg_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return CG_E_INTERNAL;
    cg_status st = buf_reserve(b, (size_t)n);
    if (st != CG_OK) return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return CG_OK;
}

void cg_buf_reset(cg_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void cg_buf_free(cg_buf *b)
{
    cg_free(&b->data);
    b->len = b->cap = 0;
}

/* ---- logging ---- */

static const char *log_program = "chunkgate";
static cg_log_level log_min = CG_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread char log_rid[64];

void cg_log_init(const char *program, cg_log_level min_level)
{
    log_program = program;
    log_min = min_level;
}

void cg_log_set_request_id(const char *rid)
{
    if (!rid) {
        log_rid[0] = '\0';
        return;
    }
    snprintf(log_rid, sizeof log_rid, "%s", rid);
}

const char *cg_log_request_id(void)
{
    return log_rid;
}

/* Appends s to out as the inside of a JSON string. */
static void json_escape(cg_buf *out, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        cg_status st;
        if (c == '"' || c == '\\')
            st = cg_buf_printf(out, "\\%c", c);
        else if (c < 0x20)
            st = cg_buf_printf(out, "\\u%04x", c);
        else
            st = cg_buf_append(out, s, 1);
        (void)st; /* an unbounded buffer */
    }
}

void cg_log(cg_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < log_min) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);

    cg_buf line;
    cg_buf_init_unbounded(&line); /* msg and rid are fixed arrays; escaping at most sextuples */
    cg_status st = cg_buf_printf(&line, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"prog\":\"%s\"",
                                 when, ts.tv_nsec / 1000000, names[level], log_program);
    if (log_rid[0]) {
        st = cg_buf_printf(&line, ",\"rid\":\"");
        json_escape(&line, log_rid);
        st = cg_buf_append(&line, "\"", 1);
    }
    st = cg_buf_printf(&line, ",\"msg\":\"");
    json_escape(&line, msg);
    st = cg_buf_append(&line, "\"}\n", 3);
    (void)st;
    pthread_mutex_lock(&log_lock);
    fwrite(line.data, 1, line.len, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
    cg_buf_free(&line);
}

/* ---- time ---- */

uint64_t cg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t cg_now_ms(void)
{
    return cg_now_ns() / 1000000ull;
}

uint64_t cg_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void cg_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

void cg_thread_stop(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, int *stop)
{
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    pthread_join(th, NULL);
}

struct timespec cg_deadline_after_ms(uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

int cg_secret_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    /* Compare over the longer length so the time depends only on the lengths, never the bytes. */
    size_t n = la > lb ? la : lb;
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < n; i++) {
        unsigned char ca = i < la ? (unsigned char)a[i] : 0;
        unsigned char cb = i < lb ? (unsigned char)b[i] : 0;
        diff |= ca ^ cb;
    }
    return diff == 0;
}

void cg_hex_encode(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int cg_hex_decode(const char *in, size_t n_bytes, uint8_t *out)
{
    for (size_t i = 0; i < n_bytes; i++) {
        int hi = hexval(in[2 * i]), lo = hi < 0 ? -1 : hexval(in[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

void cg_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
