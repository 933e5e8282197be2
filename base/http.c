/* HTTP plumbing on libmicrohttpd: raw framing check, routing, header and body caps, auth,
 * connection limit and request deadline, lingering close, job pool, replies and streams. The
 * threading model and the suspend/resume rules are described in base/http.h. */
#include "base/http.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <stdarg.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <microhttpd.h>
#include "base/http_frame.h"
#include "base/http_guard.h"
#include "base/list.h"

#if MHD_VERSION >= 0x00097002
#define CG_MHD_RESULT enum MHD_Result
#else
#define CG_MHD_RESULT int
#endif

#define MAX_PARAMS 4
/* How often the deadline thread looks for connections that are too slow to send a request. */
#define DEADLINE_TICK_MS 200
/* Errors decided from the head (401, 404, 405) are answered before the body is read when the
 * client waits for 100 Continue, sends chunked, or declares more than this; smaller bodies
 * are read, so the connection stays open for the next request. */
#define EARLY_BODY_BYTES (64u << 10)
/* Lingering close (as nginx's): a connection closed while its client may still be sending is
 * read and discarded for a while first, so the client sees the answer and not a reset. At
 * most LINGER_SOCKETS at once, each for at most LINGER_MS, LINGER_IDLE_MS without a byte, or
 * 2 x max_body_bytes + 1 MiB. */
#define LINGER_SOCKETS 64
#define LINGER_MS 5000
#define LINGER_IDLE_MS 1000

/* One client connection (MHD's socket context), from accept to close: the connection limit
 * counts these, the deadline thread watches them, and the framing check keeps its state here.
 * The fields after `link` belong to the connection's MHD thread. */
typedef struct conn_state {
    int fd;
    uint64_t waiting_since_ns; /* waiting for a request since; 0 = a request is being handled */
    cg_link link;              /* srv->conns (conn_mu) */
    cg_http_server *srv;
    cg_http_frame *frame; /* NULL: framing left to libmicrohttpd (no_framing_check) */
    uint64_t begun, done; /* requests the library started and finished on it */
    int refused;          /* the framing check refused a request ... */
    uint64_t bad_index;   /* ... this one (0-based) */
    int refused_http;     /* with this status */
    char *answer;         /* the refusal's answer, until it is written */
    size_t answer_len;
    int answered;
    int linger; /* read and discard what the client still sends before closing */
} conn_state;

typedef struct linger_sock {
    int fd; /* a dup of the connection's socket: the library's close() does not reset it */
    uint64_t until_ns, idle_until_ns;
    uint64_t left;
} linger_sock;

typedef struct hdr {
    char *name, *value;
    struct hdr *next;
} hdr;

struct cg_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned refs;
    char *buf; /* pending bytes: buf[head..head+len) */
    size_t head, len, cap, max;
    char *heartbeat;
    int closed;     /* producer is done */
    int gone;       /* client left or server stopping */
    int poked;      /* heartbeat requested */
    int suspended;  /* the connection is suspended waiting for bytes */
    int want_drain; /* a non-blocking producer found the queue full */
    int stall_ms;   /* cg_stream_set_stall_timeout: 0 = a push waits for the reader forever */
    int stalled;    /* cut because the reader read nothing for stall_ms */
    int fd;         /* the connection's socket while the reply is live, else -1 */
    void (*notify)(void *arg, int gone);
    void *notify_arg;
    struct MHD_Connection *conn;
    cg_http_server *srv;
    cg_link link; /* srv->streams, the server's live streams (srv->mu) */
};

struct cg_http_req {
    cg_http_server *srv;
    struct MHD_Connection *conn;
    const cg_http_route *route;
    char *params[MAX_PARAMS];
    char method[16];
    char *path;
    cg_buf body;
    cg_status early; /* error decided before the body was read */
    int early_http;
    char rid[65];
    uint64_t start_ns;
    cg_http_caller caller;
    int api_key;           /* index into p.api_keys, or -1 */
    const char *early_msg; /* static message for an early error, or NULL */
    conn_state *cs;        /* the connection's state (MHD socket context) */
    uint64_t index;        /* the request's number on its connection (0-based) */
    int dispatched;
    int suspended; /* parked while a job thread handles it */
    /* While parked, the request is on the server's waiting list (srv->mu), where the heartbeat
     * looks for clients that left: MHD cannot see them while the connection is suspended. */
    int waiting;
    int gone;          /* atomic: the client left before the reply */
    char *bearer;      /* the bearer token, trimmed (cg_http_req_bearer), or NULL */
    cg_link wait_link; /* srv->waiting (srv->mu) */
    struct MHD_Response *resp;
    int resp_status;
    hdr *headers;
    cg_stream *stream;
    void *data;
    cg_link job_link; /* srv->jobs (srv->mu) */
};

struct cg_http_server {
    struct MHD_Daemon *d;
    cg_http_params p;
    uint16_t port;
    int sndbuf; /* p.sndbuf_bytes as SO_SNDBUF takes it; 0 = the kernel's autotuning */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* jobs queued / stopping: job threads only, signalled one job at a
                               time (a broadcast woke every idle job thread per request) */
    pthread_cond_t hb_cv;   /* the heartbeat thread's timer / stopping */
    pthread_cond_t idle_cv; /* a job finished */
    cg_list jobs;           /* cg_http_req by job_link, oldest first */
    unsigned jobs_running;
    pthread_t *job_threads;
    pthread_t hb_thread;
    int stopping;
    int quiesced;
    cg_list streams;
    cg_list waiting; /* parked requests without a reply yet (mu) */
    unsigned long long rid_seq;

    /* Connections: the limit, the request deadline and their counters. */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;    /* wakes the deadline thread at stop */
    cg_list conns;             /* conn_state by link */
    size_t n_conns, n_pending; /* open; admitted by the accept policy, not yet started */
    uint64_t accepted, refused, timed_out, headers_too_large, malformed, lingered;
    pthread_t deadline_thread;
    int deadline_stop;
    int accept_closed; /* cg_http_quiesce: every new connection is closed at once */
    cg_http_frame_limits frame_limits;

    /* Lingering close. */
    pthread_mutex_t linger_mu;
    linger_sock lingers[LINGER_SOCKETS];
    size_t n_lingers;
    int linger_efd;
    int linger_stop;
    pthread_t linger_thread;
};

cg_http_params cg_http_default_params(void)
{
    cg_http_params p;
    memset(&p, 0, sizeof p);
    p.listen = "127.0.0.1:8080";
    p.io_threads = 2;
    p.job_threads = 8;
    p.max_body_bytes = 8u << 20;
    p.max_header_bytes = 16u << 10;
    cg_json_limits jl = cg_json_default_limits();
    p.max_json_values = jl.max_values;
    p.max_json_depth = jl.max_depth;
    p.conn_timeout_s = 60;
    p.max_connections = 4096;
    p.heartbeat_ms = 5000;
    p.sndbuf_bytes = 256u << 10;
    return p;
}

/* ---------------------------------------------------------------- streams */

cg_stream *cg_stream_new(size_t max_buffered, const char *heartbeat)
{
    cg_stream *s = cg_calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    cg_cond_init_monotonic(&s->cv);
    s->refs = 1;
    s->fd = -1;
    s->max = max_buffered ? max_buffered : (1u << 20);
    s->heartbeat = heartbeat ? cg_strdup(heartbeat) : NULL;
    return s;
}

cg_stream *cg_stream_ref(cg_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->refs++;
    pthread_mutex_unlock(&s->mu);
    return s;
}

void cg_stream_unref(cg_stream **sp)
{
    cg_stream *s = *sp;
    if (!s) return;
    *sp = NULL;
    pthread_mutex_lock(&s->mu);
    unsigned left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left) return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->buf);
    free(s->heartbeat);
    free(s);
}

/* Resumes the connection if the reader suspended it. Caller holds s->mu. */
static void stream_wake_locked(cg_stream *s)
{
    if (s->suspended && s->conn) {
        s->suspended = 0;
        MHD_resume_connection(s->conn);
    }
}

/* Marks the client gone and tells the producer. Caller holds s->mu. */
static void stream_gone_locked(cg_stream *s)
{
    if (s->gone) return;
    s->gone = 1;
    pthread_cond_broadcast(&s->cv);
    if (s->notify) s->notify(s->notify_arg, 1);
}

/* Appends bytes to the queue, growing it as needed. Caller holds s->mu. */
static void stream_append_locked(cg_stream *s, const char *p, size_t n)
{
    if (s->head + s->len + n > s->cap) {
        if (s->head) { /* compact before growing */
            memmove(s->buf, s->buf + s->head, s->len);
            s->head = 0;
        }
        if (s->len + n > s->cap) {
            size_t cap = s->cap ? s->cap : 4096;
            while (cap < s->len + n)
                cap *= 2;
            s->buf = cg_realloc(s->buf, cap);
            s->cap = cap;
        }
    }
    memcpy(s->buf + s->head + s->len, p, n);
    s->len += n;
}

int cg_stream_writable(cg_stream *s)
{
    pthread_mutex_lock(&s->mu);
    int rc = s->gone ? -1 : s->len < s->max ? 1 : 0;
    if (rc == 0) {
        s->want_drain = 1;
        stream_wake_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int cg_stream_push_nowait(cg_stream *s, const void *data, size_t len)
{
    pthread_mutex_lock(&s->mu);
    int rc = s->gone ? -1 : 0;
    if (!s->gone && len) {
        stream_append_locked(s, data, len);
        stream_wake_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void cg_stream_set_notify(cg_stream *s, void (*fn)(void *arg, int gone), void *arg)
{
    pthread_mutex_lock(&s->mu);
    s->notify = fn;
    s->notify_arg = arg;
    if (fn && s->gone) fn(arg, 1);
    pthread_mutex_unlock(&s->mu);
}

void cg_stream_set_stall_timeout(cg_stream *s, int stall_ms)
{
    pthread_mutex_lock(&s->mu);
    s->stall_ms = stall_ms > 0 ? stall_ms : 0;
    pthread_mutex_unlock(&s->mu);
}

/* One of s's flags (a field of s), read under its lock. */
static int stream_flag(cg_stream *s, const int *flag)
{
    pthread_mutex_lock(&s->mu);
    int v = *flag;
    pthread_mutex_unlock(&s->mu);
    return v;
}

int cg_stream_stalled(cg_stream *s)
{
    return stream_flag(s, &s->stalled);
}

/* Cuts the connection of a client that stopped reading: an abortive close (SO_LINGER 0, so the
 * close MHD does next sends a reset) frees the kernel's send queue at once, where a FIN would
 * wait behind megabytes the client may never read, and a socket whose window stays shut would
 * linger in zero-window probes for minutes. The shutdown wakes MHD to close it. */
static void cut_connection(int fd)
{
    if (fd < 0) return;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    shutdown(fd, SHUT_RDWR);
}

/* Waits on s->cv for the reader, at most stall_ms when one is set; 1 when that time passed
 * without the reader taking a byte (then the stream is cut: marked gone, and its connection
 * reset, since a client that reads nothing never lets the server write its end).
 * Caller holds s->mu. */
static int stream_wait_reader_locked(cg_stream *s)
{
    if (!s->stall_ms) {
        pthread_cond_wait(&s->cv, &s->mu);
        return 0;
    }
    const size_t len0 = s->len, head0 = s->head;
    struct timespec ts = cg_deadline_after_ms((uint64_t)s->stall_ms);
    while (!s->gone && s->len == len0 && s->head == head0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) break;
    if (s->gone || s->len != len0 || s->head != head0) return 0;
    s->stalled = 1;
    cut_connection(s->fd);
    stream_gone_locked(s);
    return 1;
}

int cg_stream_push(cg_stream *s, const void *data, size_t len)
{
    const char *p = data;
    pthread_mutex_lock(&s->mu);
    while (len) {
        if (s->gone) break;
        if (s->len >= s->max) { /* slow client: wait for the reader to drain */
            stream_wake_locked(s);
            if (stream_wait_reader_locked(s)) break;
            continue;
        }
        size_t n = CG_MIN(len, s->max - s->len);
        stream_append_locked(s, p, n);
        p += n;
        len -= n;
    }
    int rc = s->gone ? -1 : 0;
    stream_wake_locked(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void cg_stream_close(cg_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    stream_wake_locked(s);
    pthread_mutex_unlock(&s->mu);
}

int cg_stream_cancelled(cg_stream *s)
{
    return stream_flag(s, &s->gone);
}

/* MHD content reader: runs on the MHD thread. */
static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    cg_stream *s = cls;
    ssize_t rc;
    pthread_mutex_lock(&s->mu);
    if (s->gone) {
        rc = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (s->len) {
        size_t n = CG_MIN(max, s->len);
        memcpy(out, s->buf + s->head, n);
        s->head += n;
        s->len -= n;
        if (!s->len) s->head = 0;
        pthread_cond_broadcast(&s->cv);
        if (s->want_drain && s->len < s->max / 2) {
            s->want_drain = 0;
            if (s->notify) s->notify(s->notify_arg, 0);
        }
        rc = (ssize_t)n;
    } else if (s->closed) {
        rc = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (s->poked && s->heartbeat) {
        s->poked = 0;
        size_t n = CG_MIN(max, strlen(s->heartbeat));
        memcpy(out, s->heartbeat, n);
        rc = (ssize_t)n;
    } else {
        /* Nothing to send: park the connection until a push, close or poke resumes it. */
        s->poked = 0;
        if (s->conn && !s->suspended) {
            s->suspended = 1;
            MHD_suspend_connection(s->conn);
        }
        rc = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void stream_response_free(void *cls)
{
    cg_stream *s = cls;
    cg_stream_unref(&s);
}

/* 1 when the client of a parked request has closed the connection (or its sending side, as
 * nginx takes it too: a client that stops sending after its request is taken as gone), or
 * the connection failed. Bytes a client pipelined are not looked at. */
static int client_left(const cg_http_req *r)
{
    int fd = r->cs ? r->cs->fd : -1;
    if (fd < 0) return 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) != 1) return 0;
    return (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* Unlinks r from the waiting list. Caller holds srv->mu. */
static void unwait_locked(cg_http_server *srv, cg_http_req *r)
{
    if (!r->waiting) return;
    r->waiting = 0;
    cg_list_remove(&srv->waiting, &r->wait_link);
}

int cg_http_req_gone(const cg_http_req *r)
{
    return __atomic_load_n(&r->gone, __ATOMIC_RELAXED);
}

/* Heartbeat: pokes parked streams so a dead client is noticed by a failing write, and marks
 * parked requests whose client left (cg_http_req_gone). */
static void *heartbeat_main(void *arg)
{
    cg_http_server *srv = arg;
    /* Parked requests are looked at every second at least, so a long heartbeat does not let
     * a decode run on for long after its client left. */
    uint64_t tick_ms = CG_MIN(srv->p.heartbeat_ms, 1000u), last_poke = cg_now_ns();
    pthread_mutex_lock(&srv->mu);
    while (!srv->stopping) {
        struct timespec ts = cg_deadline_after_ms(tick_ms);
        pthread_cond_timedwait(&srv->hb_cv, &srv->mu, &ts);
        if (srv->stopping) break;
        uint64_t now = cg_now_ns();
        if (now - last_poke + 1000000ull >= (uint64_t)srv->p.heartbeat_ms * 1000000ull) {
            last_poke = now;
            for (cg_link *k = srv->streams.head; k; k = k->next) {
                cg_stream *s = CG_LIST_ENTRY(k, cg_stream, link);
                pthread_mutex_lock(&s->mu);
                if (s->suspended) {
                    s->poked = 1;
                    stream_wake_locked(s);
                }
                pthread_mutex_unlock(&s->mu);
            }
        }
        for (cg_link *k = srv->waiting.head; k; k = k->next) {
            cg_http_req *r = CG_LIST_ENTRY(k, cg_http_req, wait_link);
            if (!__atomic_load_n(&r->gone, __ATOMIC_RELAXED) && client_left(r))
                __atomic_store_n(&r->gone, 1, __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* ---------------------------------------------------------------- connections */

/* Marks a connection waiting for a request since now_ns (0: not waiting). cs may be NULL. */
static void conn_waiting(cg_http_server *srv, conn_state *cs, uint64_t now_ns)
{
    if (!cs) return;
    pthread_mutex_lock(&srv->conn_mu);
    cs->waiting_since_ns = now_ns;
    pthread_mutex_unlock(&srv->conn_mu);
}

/* Accept policy (MHD's accepting thread): admits a connection while fewer than max are open
 * or admitted. MHD's own limit is split per io thread; this one counts them all. */
static CG_MHD_RESULT on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    cg_http_server *srv = cls;
    CG_MHD_RESULT ok = MHD_YES;
    pthread_mutex_lock(&srv->conn_mu);
    if (srv->accept_closed) {
        ok = MHD_NO; /* quiesced: cg_http_quiesce */
    } else if (srv->n_conns + srv->n_pending >= srv->p.max_connections) {
        srv->refused++;
        ok = MHD_NO;
    } else {
        srv->n_pending++;
    }
    pthread_mutex_unlock(&srv->conn_mu);
    if (!ok && !srv->accept_closed)
        cg_log(CG_LOG_DEBUG, "connection refused: %u connections are open", srv->p.max_connections);
    return ok;
}

/* ---------------------------------------------------------------- framing check */

/* The framing check runs on every byte libmicrohttpd reads from a client (base/http_guard.c,
 * through the recv() of hook/http_recv_hook.c that the programs link), on the connection's MHD
 * thread. A refused request is answered here, in the OpenAI error shape with Connection:
 * close, once no earlier answer on the connection is still pending; then the library is told
 * the client has finished sending, and closes the connection (lingering, so the client reads
 * the answer). Requests that came in the same read before the refused one are dropped with
 * it. */

static void new_request_id(cg_http_server *srv, char *out, size_t n)
{
    pthread_mutex_lock(&srv->mu);
    unsigned long long seq = ++srv->rid_seq;
    pthread_mutex_unlock(&srv->mu);
    snprintf(out, n, "%08llx%08llx", (unsigned long long)(cg_wall_ms() & 0xffffffffu), seq);
}

/* Writes the refusal once the library owes the client no earlier answer. */
static void guard_try_answer(conn_state *cs)
{
    if (!cs->refused || cs->answered) return;
    uint64_t open = cs->begun - cs->done;
    if (cs->begun > cs->bad_index) open--; /* the refused request itself, never answered */
    if (open) return;
    size_t off = 0;
    while (off < cs->answer_len) {
        ssize_t w =
            send(cs->fd, cs->answer + off, cs->answer_len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) break; /* the socket's buffer is empty here: only a gone client fails */
        off += (size_t)w;
    }
    cs->answered = 1;
    cg_free(&cs->answer);
}

static void guard_refuse(conn_state *cs, cg_status st)
{
    cg_http_server *srv = cs->srv;
    int http = cg_status_http(st);
    cs->refused = 1;
    cs->linger = 1;
    cs->bad_index = cg_http_frame_requests(cs->frame);
    cs->refused_http = http;
    pthread_mutex_lock(&srv->conn_mu);
    if (st == CG_E_HEADERS_TOO_LARGE)
        srv->headers_too_large++;
    else
        srv->malformed++;
    pthread_mutex_unlock(&srv->conn_mu);
    char rid[40];
    new_request_id(srv, rid, sizeof rid);
    const char *msg = cg_http_frame_message(cs->frame);
    json_t *err = cg_http_error_json(st, NULL, msg);
    char *text = json_dumps(err, JSON_COMPACT);
    json_decref(err);
    const char *reason = MHD_get_reason_phrase_for((unsigned)http);
    cg_buf b;
    cg_buf_init_unbounded(&b); /* a status line, four headers, an error from a fixed message */
    cg_status bst =
        cg_buf_printf(&b,
                      "HTTP/1.1 %d %s\r\nConnection: close\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                      "X-Request-Id: %s\r\n\r\n%s",
                      http, reason && *reason ? reason : "Error", strlen(text), rid, text);
    (void)bst; /* an unbounded buffer */
    free(text);
    cs->answer = b.data;
    cs->answer_len = b.len;
    cg_log_set_request_id(rid);
    cg_log(CG_LOG_INFO, "request refused before routing -> %d %s: %s", http, cg_status_code(st),
           msg);
    cg_log_set_request_id(NULL);
    guard_try_answer(cs);
}

static int guard_is_refused(void *conn)
{
    return ((conn_state *)conn)->refused;
}

static ssize_t guard_refused(void *conn)
{
    conn_state *cs = conn;
    if (cs->answered) return 0; /* end of stream: the library closes the connection */
    errno = EAGAIN;             /* an earlier answer is still going out */
    return -1;
}

static ssize_t guard_check(void *conn, void *buf, size_t n)
{
    conn_state *cs = conn;
    if (!cs->frame) return (ssize_t)n;
    cg_status st = cg_http_frame_feed(cs->frame, buf, n, NULL);
    if (st == CG_OK) return (ssize_t)n;
    guard_refuse(cs, st);
    return guard_refused(cs);
}

static const cg_http_guard_ops GUARD_OPS = {guard_check, guard_refused, guard_is_refused};

/* ---------------------------------------------------------------- lingering close */

/* Takes over a socket the library is about to close: a dup keeps it open after the library's
 * close(), and the linger thread reads and discards until the client is done or a bound. */
static void linger_add(cg_http_server *srv, int fd)
{
    pthread_mutex_lock(&srv->linger_mu);
    int d =
        srv->n_lingers < LINGER_SOCKETS && !srv->linger_stop ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (d >= 0) {
        shutdown(d, SHUT_WR); /* the answer is out: FIN after it */
        uint64_t now = cg_now_ns();
        srv->lingers[srv->n_lingers++] =
            (linger_sock){d, now + LINGER_MS * 1000000ull, now + LINGER_IDLE_MS * 1000000ull,
                          2 * (uint64_t)srv->p.max_body_bytes + (1u << 20)};
        srv->lingered++;
        uint64_t one = 1;
        ssize_t w = write(srv->linger_efd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&srv->linger_mu);
}

static void *linger_main(void *arg)
{
    cg_http_server *srv = arg;
    char scratch[64 * 1024];
    struct pollfd pf[LINGER_SOCKETS + 1];
    pthread_mutex_lock(&srv->linger_mu);
    while (!srv->linger_stop) {
        size_t n = srv->n_lingers;
        pf[0] = (struct pollfd){.fd = srv->linger_efd, .events = POLLIN};
        for (size_t i = 0; i < n; i++)
            pf[i + 1] = (struct pollfd){.fd = srv->lingers[i].fd, .events = POLLIN};
        pthread_mutex_unlock(&srv->linger_mu);
        int rc = poll(pf, n + 1, 100);
        if (rc > 0 && (pf[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = read(srv->linger_efd, &v, sizeof v);
            (void)r;
        }
        pthread_mutex_lock(&srv->linger_mu);
        uint64_t now = cg_now_ns();
        /* entries [0, n) are the ones polled; later ones were added meanwhile */
        for (size_t i = n; i-- > 0;) {
            linger_sock *l = &srv->lingers[i];
            int done = now >= l->until_ns || now >= l->idle_until_ns;
            if (!done && (pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) {
                for (int k = 0; k < 16; k++) {
                    ssize_t r = recv(l->fd, scratch, sizeof scratch, MSG_DONTWAIT);
                    if (r > 0) {
                        l->idle_until_ns = now + LINGER_IDLE_MS * 1000000ull;
                        if ((uint64_t)r >= l->left) {
                            done = 1;
                            break;
                        }
                        l->left -= (uint64_t)r;
                        continue;
                    }
                    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                        done = 1;
                    break;
                }
            }
            if (!done) continue;
            close(l->fd);
            srv->lingers[i] = srv->lingers[--srv->n_lingers]; /* entries above i are done */
        }
    }
    for (size_t i = 0; i < srv->n_lingers; i++)
        close(srv->lingers[i].fd);
    srv->n_lingers = 0;
    pthread_mutex_unlock(&srv->linger_mu);
    return NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    cg_http_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_state *cs = cg_calloc(1, sizeof *cs);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        cs->fd = ci ? ci->connect_fd : -1;
        cs->srv = srv;
        /* Before the first byte of any reply: a client that reads slowly gets only this much
         * queued in the kernel, so its stream's producer is held back that soon. */
        if (srv->sndbuf && cs->fd >= 0)
            (void)setsockopt(cs->fd, SOL_SOCKET, SO_SNDBUF, &srv->sndbuf, sizeof srv->sndbuf);
        if (!srv->p.no_framing_check && cs->fd >= 0) {
            cs->frame = cg_http_frame_new(&srv->frame_limits);
            cg_http_guard_set(cs->fd, cs);
        }
        cs->waiting_since_ns = cg_now_ns();
        pthread_mutex_lock(&srv->conn_mu);
        if (srv->n_pending) srv->n_pending--;
        srv->n_conns++;
        srv->accepted++;
        cg_list_push_back(&srv->conns, &cs->link);
        pthread_mutex_unlock(&srv->conn_mu);
        *socket_context = cs;
        return;
    }
    conn_state *cs = *socket_context;
    if (!cs) return;
    *socket_context = NULL;
    if (cs->frame) cg_http_guard_set(cs->fd, NULL);
    if (cs->linger && cs->fd >= 0) linger_add(srv, cs->fd);
    /* MHD closes the socket after this returns; unlinking under conn_mu means the deadline
     * thread never shuts down a descriptor that may already belong to someone else. */
    pthread_mutex_lock(&srv->conn_mu);
    cg_list_remove(&srv->conns, &cs->link);
    srv->n_conns--;
    pthread_mutex_unlock(&srv->conn_mu);
    cg_http_frame_free(&cs->frame);
    free(cs->answer);
    free(cs);
}

/* Returns freed heap memory to the system once enough has piled up. glibc keeps what a
 * request freed in its arenas (one per thread that allocated), so a burst of large bodies
 * would leave the process at its peak for good. Called every DEADLINE_TICK_MS; trims when
 * the free bytes grew by 16 MiB since the last trim. Process-wide (every server shares it). */
static void trim_heap(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static size_t base;
    if (pthread_mutex_trylock(&mu) != 0) return;
    struct mallinfo2 mi = mallinfo2();
    if (mi.fordblks < base) base = mi.fordblks;
    if (mi.fordblks > base + (16u << 20)) {
        malloc_trim(0);
        base = mallinfo2().fordblks;
    }
    pthread_mutex_unlock(&mu);
}

/* Request deadline: a connection that has not delivered a complete request within
 * conn_timeout_s of starting to wait for one is shut down; MHD then sees the end of the
 * socket and closes it like any client that left. MHD's own timeout is an idle timeout, which
 * a client sending one byte a second never reaches (slowloris). */
static void *deadline_main(void *arg)
{
    cg_http_server *srv = arg;
    uint64_t limit = (uint64_t)srv->p.conn_timeout_s * 1000000000ull;
    pthread_mutex_lock(&srv->conn_mu);
    while (!srv->deadline_stop) {
        struct timespec ts = cg_deadline_after_ms(DEADLINE_TICK_MS);
        pthread_cond_timedwait(&srv->conn_cv, &srv->conn_mu, &ts);
        if (srv->deadline_stop) break;
        pthread_mutex_unlock(&srv->conn_mu);
        trim_heap();
        pthread_mutex_lock(&srv->conn_mu);
        if (srv->deadline_stop) break;
        uint64_t now = cg_now_ns();
        for (cg_link *k = srv->conns.head; k; k = k->next) {
            conn_state *cs = CG_LIST_ENTRY(k, conn_state, link);
            if (!cs->waiting_since_ns || now - cs->waiting_since_ns < limit || cs->fd < 0) continue;
            cs->waiting_since_ns = 0; /* once */
            srv->timed_out++;
            shutdown(cs->fd, SHUT_RDWR);
        }
    }
    pthread_mutex_unlock(&srv->conn_mu);
    return NULL;
}

void cg_http_get_stats(cg_http_server *srv, cg_http_stats *out)
{
    pthread_mutex_lock(&srv->conn_mu);
    out->connections = srv->n_conns;
    out->accepted = srv->accepted;
    out->refused = srv->refused;
    out->timed_out = srv->timed_out;
    out->headers_too_large = srv->headers_too_large;
    out->malformed = srv->malformed;
    pthread_mutex_unlock(&srv->conn_mu);
    pthread_mutex_lock(&srv->linger_mu); /* linger_add counts under this one */
    out->lingered = srv->lingered;
    pthread_mutex_unlock(&srv->linger_mu);
}

/* ---------------------------------------------------------------- requests */

static void req_free(cg_http_req **rp)
{
    cg_http_req *r = *rp;
    if (!r) return;
    for (unsigned i = 0; i < MAX_PARAMS; i++)
        free(r->params[i]);
    free(r->path);
    free(r->bearer);
    cg_buf_free(&r->body);
    while (r->headers) {
        hdr *h = r->headers;
        r->headers = h->next;
        free(h->name);
        free(h->value);
        free(h);
    }
    if (r->resp) MHD_destroy_response(r->resp);
    cg_stream_unref(&r->stream);
    free(r);
    *rp = NULL;
}

const char *cg_http_req_method(const cg_http_req *r)
{
    return r->method;
}
const char *cg_http_req_path(const cg_http_req *r)
{
    return r->path;
}
const char *cg_http_req_param(const cg_http_req *r, unsigned i)
{
    return i < MAX_PARAMS ? r->params[i] : NULL;
}
const char *cg_http_req_query(cg_http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}
const char *cg_http_req_header(cg_http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}
const char *cg_http_req_body(const cg_http_req *r, size_t *len)
{
    *len = r->body.len;
    return r->body.data ? r->body.data : "";
}
char *cg_http_req_take_body(cg_http_req *r, size_t *len)
{
    *len = r->body.len;
    char *b = r->body.data ? r->body.data : cg_strdup("");
    cg_buf_init(&r->body, r->body.max);
    return b;
}
void cg_http_req_drop_body(cg_http_req *r)
{
    cg_buf_free(&r->body);
}
const char *cg_http_req_id(const cg_http_req *r)
{
    return r->rid;
}
void cg_http_req_set_data(cg_http_req *r, void *data)
{
    r->data = data;
}
void *cg_http_req_data(const cg_http_req *r)
{
    return r->data;
}

const char *cg_http_req_bearer(cg_http_req *r)
{
    if (r->bearer) return r->bearer;
    const char *h = cg_http_req_header(r, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    /* Whitespace around the token is not part of it (RFC 9110 trims field values; the
     * library keeps trailing blanks). */
    while (*h == ' ' || *h == '\t')
        h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    if (!n) return NULL;
    r->bearer = cg_strndup(h, n);
    return r->bearer;
}

int cg_http_req_client_left(cg_http_req *r)
{
    if (!r || !r->cs || r->cs->fd < 0) return 0;
    struct pollfd p = {.fd = r->cs->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) != 1) return 0;
    if (p.revents & (POLLERR | POLLHUP)) return 1;
    if (!(p.revents & POLLRDHUP)) return 0;
    char b;
    return recv(r->cs->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

cg_http_caller cg_http_req_caller(const cg_http_req *r)
{
    return r->caller;
}
int cg_http_req_api_key(const cg_http_req *r)
{
    return r->api_key;
}

void cg_http_add_header(cg_http_req *r, const char *name, const char *value)
{
    hdr *h = cg_malloc(sizeof *h);
    h->name = cg_strdup(name);
    h->value = cg_strdup(value);
    h->next = r->headers;
    r->headers = h;
}

json_t *cg_http_error_json(cg_status st, const char *param, const char *message)
{
    return json_pack("{s:{s:s, s:s, s:s?, s:s}}", "error", "message",
                     message ? message : cg_status_message(st), "type", cg_status_type(st), "param",
                     param, "code", cg_status_code(st));
}

/* Stores the response; resumes the connection when the reply comes from a job thread. */
static void set_response(cg_http_req *r, int status, struct MHD_Response *resp)
{
    if (r->resp) { /* a second reply is a bug in the handler; keep the first */
        cg_log(CG_LOG_ERROR, "second reply to %s %s ignored", r->method, r->path);
        MHD_destroy_response(resp);
        return;
    }
    MHD_add_response_header(resp, "X-Request-Id", r->rid);
    for (hdr *h = r->headers; h; h = h->next)
        MHD_add_response_header(resp, h->name, h->value);
    r->resp_status = status;
    r->resp = resp;
    if (r->waiting) {
        pthread_mutex_lock(&r->srv->mu);
        unwait_locked(r->srv, r);
        pthread_mutex_unlock(&r->srv->mu);
    }
    if (r->suspended) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

void cg_http_reply_raw(cg_http_req *r, int status, const char *content_type, const void *data,
                       size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(resp, "Content-Type", content_type);
    set_response(r, status, resp);
}

void cg_http_reply_json(cg_http_req *r, int status, json_t *body)
{
    /* A body that an upstream did not send (a 429 in text/plain) or that cannot be written
     * out must not take the process down: it becomes this status's error in the OpenAI shape. */
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) {
        cg_status st = cg_status_from_http(status);
        json_t *e = cg_http_error_json(st, NULL, NULL);
        text = json_dumps(e, JSON_COMPACT);
        json_decref(e);
        if (!text) text = cg_strdup("{\"error\":{\"message\":\"internal error\"}}");
    }
    size_t len = strlen(text);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    set_response(r, status, resp);
}

void cg_http_reply_error_status(cg_http_req *r, int http, cg_status st, const char *param,
                                const char *message)
{
    /* Client-error messages can quote the request (a JSON parse error shows the text near
     * the error), and logs must never carry prompt text: only the code is logged for them. */
    int server_side = http >= 500;
    cg_log(server_side ? CG_LOG_WARN : CG_LOG_INFO, "%s %s -> %d %s%s%s", r->method, r->path, http,
           cg_status_code(st), server_side && message ? ": " : "",
           server_side && message ? message : "");
    cg_http_reply_json(r, http, cg_http_error_json(st, param, message));
}

void cg_http_reply_error(cg_http_req *r, cg_status st, const char *param, const char *message)
{
    cg_http_reply_error_status(r, cg_status_http(st), st, param, message);
}

void cg_http_reply_stream(cg_http_req *r, int status, const char *content_type, cg_stream *s)
{
    cg_http_server *srv = r->srv;
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, cg_stream_ref(s), stream_response_free);
    MHD_add_response_header(resp, "Content-Type", content_type);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    pthread_mutex_lock(&s->mu);
    s->conn = r->conn;
    s->fd = r->cs ? r->cs->fd : -1;
    s->srv = srv;
    pthread_mutex_unlock(&s->mu);
    r->stream = cg_stream_ref(s);
    pthread_mutex_lock(&srv->mu);
    cg_list_push_back(&srv->streams, &s->link);
    pthread_mutex_unlock(&srv->mu);
    set_response(r, status, resp);
}

json_t *cg_http_req_json(cg_http_req *r)
{
    char msg[256];
    cg_status st;
    cg_json_limits l = {r->srv->p.max_json_values, r->srv->p.max_json_depth};
    json_t *j = cg_json_parse_object(r->body.data, r->body.len, &l, &st, msg, sizeof msg);
    if (!j) cg_http_reply_error(r, st, NULL, msg);
    return j;
}

/* ---------------------------------------------------------------- JSON fields */

/* ---------------------------------------------------------------- routing */

/* The path of a request target: an absolute-form target ("http://host/healthz", which RFC 9112
 * requires a server to accept) loses its scheme and authority; "/" when nothing follows them. */
static const char *target_path(const char *url)
{
    const char *p = !strncasecmp(url, "http://", 7)    ? url + 7
                    : !strncasecmp(url, "https://", 8) ? url + 8
                                                       : NULL;
    if (!p) return url;
    const char *slash = strchr(p, '/');
    return slash ? slash : "/";
}

/* Matches path against pattern; fills params with the "*" segments (caller frees). */
static int route_match(const char *pattern, const char *path, char **params)
{
    unsigned np = 0;
    const char *p = pattern, *s = path;
    while (*p && *s) {
        if (*p == '*') {
            const char *end = strchr(s, '/');
            size_t n = end ? (size_t)(end - s) : strlen(s);
            if (!n || np >= MAX_PARAMS) goto fail;
            params[np++] = cg_strndup(s, n);
            s += n;
            p++;
        } else if (*p == *s) {
            p++;
            s++;
        } else {
            goto fail;
        }
    }
    if (!*p && !*s) return 1;
fail:
    for (unsigned i = 0; i < np; i++)
        cg_free(&params[i]);
    return 0;
}

static int rid_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

static void set_request_id(cg_http_req *r)
{
    const char *in = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = in ? strlen(in) : 0;
    int ok = n > 0 && n < sizeof r->rid;
    for (size_t i = 0; ok && i < n; i++)
        ok = rid_char_ok(in[i]);
    if (ok) {
        memcpy(r->rid, in, n + 1);
        return;
    }
    new_request_id(r->srv, r->rid, sizeof r->rid);
}

/* Decides who the request is (route flags in http.h) and whether it may go on. Every
 * configured secret is compared, in constant time, whatever matched: the time taken says
 * nothing about which key, if any, was close. */
static int authorize(cg_http_req *r, unsigned flags)
{
    const cg_http_params *p = &r->srv->p;
    const char *tok = cg_http_req_bearer(r);
    int has_admin = p->admin_token && *p->admin_token;
    int has_keys = p->api_keys && p->api_keys[0];
    int admin = has_admin && tok && cg_secret_equal(tok, p->admin_token);
    int key = -1;
    for (int i = 0; has_keys && p->api_keys[i]; i++) {
        int eq = tok && cg_secret_equal(tok, p->api_keys[i]);
        if (eq && key < 0) key = i;
    }
    r->caller = CG_CALLER_OPEN;
    r->api_key = -1;
    if (flags & CG_ROUTE_ADMIN) {
        if (admin || (!has_admin && !has_keys)) {
            r->caller = CG_CALLER_ADMIN;
            return 1;
        }
        if ((flags & CG_ROUTE_AUTH) && key >= 0) {
            r->caller = CG_CALLER_API_KEY;
            r->api_key = key;
            return 1;
        }
        if (!has_admin)
            r->early_msg = "admin routes are closed: API keys are configured and no admin "
                           "token is set";
        else if (key >= 0)
            r->early_msg = "an API key does not open the admin routes; use the admin token";
        return 0;
    }
    if ((flags & CG_ROUTE_AUTH) && has_keys) {
        if (key < 0) {
            r->early_msg = tok ? "the bearer token is not a valid API key"
                               : "an API key is required: Authorization: Bearer <key>";
            return 0;
        }
        r->caller = CG_CALLER_API_KEY;
        r->api_key = key;
    }
    return 1;
}

struct hdr_sum {
    size_t bytes;
};

static CG_MHD_RESULT sum_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    struct hdr_sum *h = cls;
    size_t v = value ? strlen(value) : 0;
    while (v && (value[v - 1] == ' ' || value[v - 1] == '\t'))
        v--; /* trailing OWS is not value */
    h->bytes += strlen(key) + v;
    return MHD_YES;
}

/* Decides route, auth and size before any body byte is read. */
static void classify(cg_http_req *r)
{
    const cg_http_params *p = &r->srv->p;
    int path_matched = 0;
    for (size_t i = 0; i < p->n_routes; i++) {
        char *params[MAX_PARAMS] = {0};
        if (!route_match(p->routes[i].pattern, r->path, params)) continue;
        /* HEAD is GET without the body (the library leaves the body out) */
        int same = !strcmp(p->routes[i].method, r->method) ||
                   (!strcmp(r->method, "HEAD") && !strcmp(p->routes[i].method, "GET"));
        if (!same) {
            path_matched = 1;
            for (unsigned j = 0; j < MAX_PARAMS; j++)
                free(params[j]);
            continue;
        }
        r->route = &p->routes[i];
        memcpy(r->params, params, sizeof params);
        break;
    }
    if (p->max_header_bytes) {
        /* Checked first: a head over the cap gets 431 whatever the route. */
        struct hdr_sum h = {0};
        MHD_get_connection_values(r->conn, MHD_HEADER_KIND, sum_header, &h);
        if (h.bytes > p->max_header_bytes) {
            r->early = CG_E_HEADERS_TOO_LARGE;
            pthread_mutex_lock(&r->srv->conn_mu);
            r->srv->headers_too_large++;
            pthread_mutex_unlock(&r->srv->conn_mu);
            return;
        }
    }
    if (!r->route) {
        r->early = path_matched ? CG_E_METHOD : CG_E_NOT_FOUND;
        return;
    }
    if (!authorize(r, r->route->flags)) {
        r->early = CG_E_AUTH;
        return;
    }
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > p->max_body_bytes) r->early = CG_E_TOO_LARGE;
}

/* 1 when the client waits for "100 Continue" before it sends the body. */
static int expects_continue(cg_http_req *r)
{
    const char *e = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Expect");
    return e && !strcasecmp(e, "100-continue");
}

/* The body the head announces, in bytes (UINT64_MAX: chunked, size unknown). */
static uint64_t declared_body(cg_http_req *r)
{
    if (MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Transfer-Encoding"))
        return UINT64_MAX;
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Length");
    return cl ? strtoull(cl, NULL, 10) : 0;
}

/* Whether an error decided from the head is answered at once, before the body. Too large a
 * body or head: always. Others: when the client waits for 100 Continue (it must not send the
 * body for nothing), or when the body is chunked or large (reading it would only be waste). */
static int answer_early(cg_http_req *r)
{
    if (r->early == CG_OK) return 0;
    if (r->early == CG_E_TOO_LARGE || r->early == CG_E_HEADERS_TOO_LARGE) return 1;
    uint64_t body = declared_body(r);
    return body && (expects_continue(r) || body > EARLY_BODY_BYTES);
}

/* 1 when the client may still be sending bytes of this request's body. */
static int body_pending(cg_http_req *r)
{
    if (r->cs && r->cs->frame) return !cg_http_frame_idle(r->cs->frame);
    return declared_body(r) > 0;
}

static CG_MHD_RESULT queue_reply(cg_http_req *r)
{
    CG_MHD_RESULT ret = MHD_queue_response(r->conn, (unsigned)r->resp_status, r->resp);
    MHD_destroy_response(r->resp);
    r->resp = NULL;
    return ret;
}

static void early_reply(cg_http_req *r)
{
    char msg[160];
    const char *m = NULL;
    if (r->early == CG_E_NOT_FOUND) {
        snprintf(msg, sizeof msg, "no route for %s %s", r->method, r->path);
        m = msg;
    } else if (r->early == CG_E_METHOD) {
        snprintf(msg, sizeof msg, "method %s is not allowed on %s", r->method, r->path);
        m = msg;
    } else if (r->early == CG_E_TOO_LARGE) {
        snprintf(msg, sizeof msg, "request body is larger than %zu bytes",
                 r->srv->p.max_body_bytes);
        m = msg;
    } else if (r->early == CG_E_HEADERS_TOO_LARGE) {
        snprintf(msg, sizeof msg, "request headers are larger than %zu bytes",
                 r->srv->p.max_header_bytes);
        m = msg;
    } else if (r->early == CG_E_AUTH) {
        m = r->early_msg;
        cg_http_add_header(r, "WWW-Authenticate", "Bearer");
    }
    cg_http_reply_error(r, r->early, NULL, m);
}

static void enqueue_job(cg_http_server *srv, cg_http_req *r)
{
    pthread_mutex_lock(&srv->mu);
    cg_list_push_back(&srv->jobs, &r->job_link);
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
}

static void *job_main(void *arg)
{
    cg_http_server *srv = arg;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
        while (cg_list_empty(&srv->jobs) && !srv->stopping)
            pthread_cond_wait(&srv->cv, &srv->mu);
        cg_link *k = cg_list_pop_front(&srv->jobs);
        if (!k) break; /* stopping and drained */
        cg_http_req *r = CG_LIST_ENTRY(k, cg_http_req, job_link);
        srv->jobs_running++;
        pthread_mutex_unlock(&srv->mu);

        cg_log_set_request_id(r->rid);
        r->route->handler(r, srv->p.app);
        cg_log_set_request_id(NULL);

        pthread_mutex_lock(&srv->mu);
        srv->jobs_running--;
        pthread_cond_broadcast(&srv->idle_cv);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

static CG_MHD_RESULT on_access(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    cg_http_server *srv = cls;
    cg_http_req *r = *con_cls;
    if (!r) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        conn_state *cs = ci ? ci->socket_context : NULL;
        /* A request at or past one the framing check refused: its answer is out, close. */
        if (cs && cs->refused && cs->begun >= cs->bad_index) return MHD_NO;
        r = cg_calloc(1, sizeof *r);
        if (cs) r->index = cs->begun++;
        r->srv = srv;
        r->conn = conn;
        r->start_ns = cg_now_ns();
        snprintf(r->method, sizeof r->method, "%s", method);
        r->path = cg_strdup(target_path(url));
        r->api_key = -1;
        r->cs = cs;
        cg_buf_init(&r->body, srv->p.max_body_bytes);
        set_request_id(r);
        classify(r);
        *con_cls = r;
        if (cs && cs->frame && !cs->refused && cg_http_guard_bytes() == 0) {
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                cg_log(CG_LOG_WARN, "the raw framing check sees no bytes (this program does not "
                                    "link hook/http_recv_hook.c): libmicrohttpd's own checks "
                                    "apply");
        }
        /* A body of known size gets its buffer at once: no growing copies of a large one. */
        uint64_t cl = declared_body(r);
        if (r->early == CG_OK && cl && cl <= srv->p.max_body_bytes) {
            r->body.data = cg_malloc((size_t)cl + 1);
            r->body.cap = (size_t)cl + 1;
        }
        if (answer_early(r)) {
            /* refuse before reading the body; the library closes the connection after the
             * answer, and a client still sending gets a lingering close, not a reset */
            r->dispatched = 1;
            conn_waiting(srv, r->cs, 0);
            if (cs && body_pending(r)) cs->linger = 1;
            early_reply(r);
            return queue_reply(r);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (r->early == CG_OK && cg_buf_append(&r->body, upload, *upload_size) != CG_OK)
            r->early = CG_E_TOO_LARGE;
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->resp) return queue_reply(r); /* resumed after a job replied */
    if (r->dispatched) return MHD_YES;  /* spurious wake-up */
    r->dispatched = 1;
    conn_waiting(srv, r->cs, 0); /* the request is complete: the deadline stops */
    if (r->early != CG_OK) {
        early_reply(r);
        return queue_reply(r);
    }
    if (r->route->flags & CG_ROUTE_INLINE) {
        cg_log_set_request_id(r->rid);
        r->route->handler(r, srv->p.app);
        cg_log_set_request_id(NULL);
        if (!r->resp) cg_http_reply_error(r, CG_E_INTERNAL, NULL, "handler did not reply");
        return queue_reply(r);
    }
    /* Suspend first, then hand over: the job (or what the fast handler started) may resume
     * at once. */
    r->suspended = 1;
    pthread_mutex_lock(&srv->mu);
    r->waiting = 1;
    cg_list_push_back(&srv->waiting, &r->wait_link);
    pthread_mutex_unlock(&srv->mu);
    MHD_suspend_connection(conn);
    cg_http_fast_handler fast = srv->p.fast ? srv->p.fast[r->route - srv->p.routes] : NULL;
    if (fast) {
        cg_log_set_request_id(r->rid);
        int took = fast(r, srv->p.app);
        cg_log_set_request_id(NULL);
        if (took) return MHD_YES; /* r may already be answered: not touched again */
    }
    enqueue_job(srv, r);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    cg_http_server *srv = cls;
    cg_http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    conn_state *cs = r->cs;
    if (r->waiting) {
        pthread_mutex_lock(&srv->mu);
        unwait_locked(srv, r);
        pthread_mutex_unlock(&srv->mu);
    }
    if (cs) {
        cs->done++;
        if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) guard_try_answer(cs);
    }
    cg_stream *s = r->stream;
    if (s) {
        pthread_mutex_lock(&srv->mu);
        cg_list_remove(&srv->streams, &s->link);
        pthread_mutex_unlock(&srv->mu);
        pthread_mutex_lock(&s->mu);
        s->conn = NULL;
        s->fd = -1;
        s->suspended = 0;
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !s->closed) stream_gone_locked(s);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    /* Keep-alive: the connection now waits for its next request. */
    conn_waiting(srv, r->cs, cg_now_ns());
    double secs = (double)(cg_now_ns() - r->start_ns) / 1e9;
    int status = r->resp_status ? r->resp_status : CG_HTTP_CLIENT_GONE;
    if (!r->resp_status && cs && cs->refused && r->index == cs->bad_index)
        status = cs->refused_http; /* the framing check answered it */
    const char *route = r->route ? r->route->name : "unknown";
    cg_log_set_request_id(r->rid);
    /* Health probes arrive every few seconds from every gateway: they log at debug level
     * unless they fail, so the access log shows traffic, not liveness checks. */
    int probe = route && (!strcmp(route, "healthz") || !strcmp(route, "readyz")) && status < 400;
    cg_log(probe ? CG_LOG_DEBUG : CG_LOG_INFO, "%s %s %d %.3fms%s", r->method, r->path, status,
           secs * 1e3,
           toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    cg_log_set_request_id(NULL);
    if (srv->p.done) srv->p.done(srv->p.app, route, status, secs);
    req_free(&r);
}

/* ---------------------------------------------------------------- lifecycle */

/* MHD's own messages become JSON log lines. They are mostly clients that left mid-reply,
 * which is routine, hence debug level; failures that matter are logged by this file. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    cg_log(CG_LOG_DEBUG, "mhd: %s", msg);
}

static cg_status resolve_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len,
                                int *v6)
{
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || strlen(colon + 1) == 0) return CG_E_VALUE;
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof host) return CG_E_VALUE;
    memcpy(host, listen, hl);
    host[hl] = '\0';
    char *h = host;
    if (h[0] == '[' && hl > 1 && h[hl - 1] == ']') {
        h[hl - 1] = '\0';
        h++;
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if (getaddrinfo(*h ? h : NULL, colon + 1, &hints, &res) != 0 || !res) return CG_E_VALUE;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return CG_OK;
}

/* Logs the send buffer client connections get. Linux doubles an SO_SNDBUF request (the other
 * half pays for its bookkeeping) and caps it at net.core.wmem_max first, so what a
 * connection gets is read back from a socket of the listening family. */
static void log_sndbuf(const cg_http_server *srv, int v6)
{
    if (!srv->sndbuf) {
        cg_log(CG_LOG_INFO, "client connections: send buffer left to the kernel's autotuning");
        return;
    }
    int got = 0;
    socklen_t len = sizeof got;
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &srv->sndbuf, sizeof srv->sndbuf) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0)
        got = 0;
    if (fd >= 0) close(fd);
    cg_log(got && got < 2 * srv->sndbuf ? CG_LOG_WARN : CG_LOG_INFO,
           "client connections: send buffer %d KiB asked, %d KiB granted by the kernel%s",
           srv->sndbuf >> 10, got >> 10,
           got && got < 2 * srv->sndbuf ? " (capped by net.core.wmem_max)" : "");
}

/* Frees a server whose threads are not running (or have been joined). */
static void free_server(cg_http_server *srv)
{
    pthread_mutex_destroy(&srv->linger_mu);
    if (srv->linger_efd >= 0) close(srv->linger_efd);
    free(srv->job_threads);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
    pthread_cond_destroy(&srv->hb_cv);
    pthread_cond_destroy(&srv->idle_cv);
    pthread_mutex_destroy(&srv->conn_mu);
    pthread_cond_destroy(&srv->conn_cv);
    free(srv);
}

cg_status cg_http_open(const cg_http_params *p, cg_http_server **out)
{
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t sslen;
    int v6 = 0;
    if (resolve_listen(p->listen, &ss, &sslen, &v6) != CG_OK) {
        cg_log(CG_LOG_ERROR, "cannot parse or resolve listen address '%s' (want HOST:PORT)",
               p->listen);
        return CG_E_VALUE;
    }
    cg_http_server *srv = cg_calloc(1, sizeof *srv);
    srv->p = *p;
    if (!srv->p.max_connections) srv->p.max_connections = 4096;
    if (!srv->p.conn_timeout_s) srv->p.conn_timeout_s = 60;
    srv->sndbuf = (int)CG_MIN(srv->p.sndbuf_bytes, (size_t)INT_MAX / 2);
    cg_json_limits jl = cg_json_default_limits();
    if (!srv->p.max_json_values) srv->p.max_json_values = jl.max_values;
    if (!srv->p.max_json_depth) srv->p.max_json_depth = jl.max_depth;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    cg_cond_init_monotonic(&srv->hb_cv);
    pthread_cond_init(&srv->idle_cv, NULL);
    pthread_mutex_init(&srv->conn_mu, NULL);
    cg_cond_init_monotonic(&srv->conn_cv);
    pthread_mutex_init(&srv->linger_mu, NULL);
    srv->linger_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!p->no_framing_check && cg_http_guard_init(&GUARD_OPS) != 0)
        cg_log(CG_LOG_WARN, "no memory for the framing check's descriptor table; "
                            "libmicrohttpd's own checks apply");
    /* The framing check's head limits sit well inside the library's connection memory, so the
     * library never answers an oversized head itself. */
    srv->frame_limits = cg_http_frame_default_limits();
    srv->frame_limits.max_header_bytes = p->max_header_bytes;
    srv->frame_limits.max_head_bytes = (p->max_header_bytes ? p->max_header_bytes : (16u << 10)) +
                                       srv->frame_limits.max_target + (8u << 10);
    srv->frame_limits.max_body_bytes = p->max_body_bytes;

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    unsigned threads = CG_MAX(1u, p->io_threads);
    /* MHD splits its own limit between the io threads; ours (on_accept) is the real one, so
     * MHD's is set where no thread can reach it first. */
    unsigned mhd_limit = (srv->p.max_connections + 16) * threads;
    /* The memory pool holds the request head, the header list and the I/O buffers: the
     * largest head the framing check lets through, plus room for 100 header entries and the
     * buffers (test_http head_limits_inside_the_library holds it to that). Not more: the
     * library clears the whole pool before every request of a connection. */
    size_t pool = srv->frame_limits.max_head_bytes + (16u << 10);
    srv->d = MHD_start_daemon(
        flags, 0, on_accept, srv, on_access, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, srv->p.conn_timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!srv->d) {
        cg_log(CG_LOG_ERROR, "cannot listen on %s: %s", p->listen, strerror(errno));
        free_server(srv);
        return CG_E_IO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = info ? info->port : 0;
    log_sndbuf(srv, v6);
    unsigned nj = CG_MAX(1u, p->job_threads);
    srv->job_threads = cg_calloc(nj, sizeof(pthread_t));
    for (unsigned i = 0; i < nj; i++)
        pthread_create(&srv->job_threads[i], NULL, job_main, srv);
    pthread_create(&srv->hb_thread, NULL, heartbeat_main, srv);
    pthread_create(&srv->deadline_thread, NULL, deadline_main, srv);
    pthread_create(&srv->linger_thread, NULL, linger_main, srv);
    *out = srv;
    return CG_OK;
}

uint16_t cg_http_port(const cg_http_server *s)
{
    return s->port;
}

void cg_http_quiesce(cg_http_server *srv)
{
    pthread_mutex_lock(&srv->mu);
    int done = srv->quiesced;
    srv->quiesced = 1;
    pthread_mutex_unlock(&srv->mu);
    if (done) return;
    /* New connections are closed as soon as they are accepted, so a client fails at once
     * instead of waiting for an answer that never comes. Not MHD_quiesce_daemon: on an epoll
     * daemon with its own threads it races them (both take the listening socket out of the
     * epoll set, and the loser's epoll_ctl fails, which aborts the process). */
    pthread_mutex_lock(&srv->conn_mu);
    srv->accept_closed = 1;
    pthread_mutex_unlock(&srv->conn_mu);
}

void cg_http_close(cg_http_server **sp)
{
    cg_http_server *srv = *sp;
    if (!srv) return;
    *sp = NULL;
    cg_http_quiesce(srv);
    /* Let queued handlers finish (they resume their connections), then end live streams so
     * no connection stays suspended: MHD refuses to stop with suspended connections. */
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    pthread_cond_broadcast(&srv->cv);
    pthread_cond_broadcast(&srv->hb_cv);
    pthread_mutex_unlock(&srv->mu);
    for (unsigned i = 0; i < CG_MAX(1u, srv->p.job_threads); i++)
        pthread_join(srv->job_threads[i], NULL);
    pthread_join(srv->hb_thread, NULL);
    for (int round = 0; round < 50; round++) {
        int live = 0;
        pthread_mutex_lock(&srv->mu);
        for (cg_link *k = srv->streams.head; k; k = k->next) {
            cg_stream *s = CG_LIST_ENTRY(k, cg_stream, link);
            pthread_mutex_lock(&s->mu);
            stream_gone_locked(s);
            stream_wake_locked(s);
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            live++;
        }
        pthread_mutex_unlock(&srv->mu);
        if (!live) break;
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    /* The deadline thread may shut sockets down until MHD has closed them all. */
    MHD_stop_daemon(srv->d);
    cg_thread_stop(srv->deadline_thread, &srv->conn_mu, &srv->conn_cv, &srv->deadline_stop);
    pthread_mutex_lock(&srv->linger_mu);
    srv->linger_stop = 1;
    pthread_mutex_unlock(&srv->linger_mu);
    pthread_join(srv->linger_thread, NULL);
    free_server(srv);
}
