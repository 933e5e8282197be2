/* Redis client for one node or a Redis Cluster (the remote KV tier, DESIGN §16, and the chunk
 * events, §18): pipelined batch reads and writes, single commands, MOVED/ASK redirects,
 * write-behind queue, fail-fast backoff, deadlines.
 *
 * I/O model: hiredis connects (redisConnectWithTimeout) and parses replies (its reader); the
 * commands are written here as RESP with sendmsg() from an iovec list, so multi-MiB values go
 * to the socket without being copied into a command buffer, MSG_NOSIGNAL keeps a closed peer
 * from raising SIGPIPE, and one poll() loop serves every node of a call under one deadline.
 *
 * Locks: each node has a mutex guarding its connection pool and backoff state, never held
 * across network I/O (a call marks a connection busy, then talks on it unlocked). A call that
 * needs several nodes takes their connections in increasing node index, so two calls cannot
 * wait on each other. The slot map sits behind a rwlock; the write-behind queue has its own
 * mutex. Counters are updated with relaxed atomics. */
#include "base/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/list.h"

/* Largest batch one call takes (keys). */
#define BATCH_MAX 65536
/* Bytes read from a socket per recv(). */
#define RECV_CHUNK (64 * 1024)
/* A bulk reply of at least this many bytes is received straight into the value's own buffer
 * (the one handed to the caller) instead of through the reply parser's buffer: no copy, no
 * growth of a second value-sized buffer. Smaller replies go through hiredis's parser. */
#define BIG_MIN (64 * 1024)
/* Value buffers kept for reuse by cg_remote_values_free (at most value_cache_bytes). */
#define CACHE_SLOTS 16
/* Values up to this size are copied next to the command header; larger ones are sent from
 * the caller's memory. */
#define INLINE_MAX (16 * 1024)
/* iovecs per sendmsg(). */
#define IOV_BATCH 64
/* The writer stores up to this many queued items, or this many bytes, per pipelined batch. */
#define WRITER_BATCH_ITEMS 8
#define WRITER_BATCH_BYTES ((size_t)16 << 20)
/* Marks a reply slot that answers an ASKING sent before the op's command. */
#define ASK_FLAG ((size_t)1 << (sizeof(size_t) * 8 - 1))

#define ST_ADD(r, field, v) __atomic_fetch_add(&(r)->st.field, (uint64_t)(v), __ATOMIC_RELAXED)
#define ST_GET(r, field) __atomic_load_n(&(r)->st.field, __ATOMIC_RELAXED)

/* ---- nodes and connections ---------------------------------------------------------------- */

typedef struct conn {
    redisContext *ctx; /* NULL: not connected */
    int busy;          /* held by a call (node mu) */
} conn;

typedef struct node {
    char *host;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a connection was given back */
    conn *conns;
    int n_conns;
    uint64_t retry_at_ms; /* mu: no connection attempt before this (monotonic) */
    int backoff_ms;       /* mu: wait imposed by the next failure */
    int failed;           /* mu: the last attempt or connection failed */
} node;

/* One write-behind item: a chunk's keys and values, copied, in one allocation. */
typedef struct qitem {
    cg_link link; /* on the queue */
    uint64_t seq;
    uint64_t tag; /* the caller's, handed to params.on_written */
    size_t n;
    size_t bytes; /* value + key bytes, what the queue bound counts */
    char **keys;
    char **vals;
    size_t *lens;
} qitem;

struct cg_remote {
    cg_remote_params p;
    char *password; /* owned copy, NULL: no AUTH */
    cg_remote_url url;

    pthread_mutex_t nodes_mu; /* adding nodes */
    node *nodes[CG_REMOTE_MAX_NODES];
    int n_nodes; /* atomic: nodes[0 .. n_nodes-1] are published; node 0 is the seed */

    pthread_rwlock_t map_lock;
    int16_t slots[CG_REMOTE_SLOTS]; /* map_lock: slot -> node index, -1 unknown */
    int map_loaded;                 /* map_lock */
    int map_stale;                  /* atomic: a redirect or a node failure asks for a refresh */
    pthread_mutex_t refresh_mu;
    pthread_cond_t refresh_cv;
    int refreshing;      /* refresh_mu */
    uint64_t map_at_ms;  /* refresh_mu: when the last refresh finished */
    unsigned refresh_rr; /* refresh_mu: where the next refresh starts among the nodes */

    pthread_mutex_t qmu;
    pthread_cond_t qcv;                 /* items or stop for the writer */
    pthread_cond_t qdone;               /* the writer finished a batch */
    cg_list queue;                      /* qmu: qitems, oldest first */
    size_t q_items, q_bytes, q_writing; /* reserved, queued or being written */
    uint64_t q_seq, q_done;             /* last appended / last finished item seq */
    int q_stop;
    pthread_t writer;
    int writer_started;

    pthread_mutex_t cache_mu; /* recycled value buffers (cg_remote_values_free) */
    struct {
        char *p;
        size_t cap;
    } cache[CACHE_SLOTS];
    size_t cache_n, cache_bytes;

    pthread_mutex_t err_mu;
    char last_err[256]; /* err_mu: last server-side refusal worth telling the operator */
    uint64_t log_at_ms; /* atomic: rate limit of repeated warnings */

    cg_remote_stats st;
};

static void set_last_err(cg_remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_last_err(cg_remote *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&r->err_mu);
    vsnprintf(r->last_err, sizeof r->last_err, fmt, ap);
    pthread_mutex_unlock(&r->err_mu);
    va_end(ap);
}

/* Logs at most one warning a second: a Redis outage must not flood the log. */
#define LOG_LIMITED(r, ...)                                                                        \
    do {                                                                                           \
        uint64_t now_ = cg_now_ms(), last_ = __atomic_load_n(&(r)->log_at_ms, __ATOMIC_RELAXED);   \
        if (now_ >= last_ + 1000 &&                                                                \
            __atomic_compare_exchange_n(&(r)->log_at_ms, &last_, now_, 0, __ATOMIC_RELAXED,        \
                                        __ATOMIC_RELAXED))                                         \
            cg_log(CG_LOG_WARN, __VA_ARGS__);                                                      \
    } while (0)

static void count_error(cg_remote *r, cg_status st)
{
    if (st == CG_OK || st == CG_E_NOT_FOUND) return;
    ST_ADD(r, errors, 1);
    switch (st) {
    case CG_E_UNAVAILABLE:
        ST_ADD(r, errors_unavailable, 1);
        break;
    case CG_E_TIMEOUT:
        ST_ADD(r, errors_timeout, 1);
        break;
    case CG_E_BAD_GATEWAY:
        ST_ADD(r, errors_protocol, 1);
        break;
    default:
        ST_ADD(r, errors_other, 1);
        break;
    }
}

/* Waits on cv until deadline_ns (monotonic); returns ETIMEDOUT once it has passed. */
static int cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns)
{
    if (cg_now_ns() >= deadline_ns) return ETIMEDOUT;
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    return pthread_cond_timedwait(cv, mu, &ts);
}

static node *node_new(const char *host, int port, int n_conns, int backoff_min_ms)
{
    node *nd = cg_calloc(1, sizeof *nd);
    nd->host = cg_strdup(host);
    nd->port = port;
    pthread_mutex_init(&nd->mu, NULL);
    cg_cond_init_monotonic(&nd->cv);
    nd->conns = cg_calloc((size_t)n_conns, sizeof *nd->conns);
    nd->n_conns = n_conns;
    nd->backoff_ms = backoff_min_ms;
    return nd;
}

static void node_free(node **pnd)
{
    node *nd = *pnd;
    if (!nd) return;
    for (int i = 0; i < nd->n_conns; i++)
        if (nd->conns[i].ctx) redisFree(nd->conns[i].ctx);
    free(nd->conns);
    pthread_cond_destroy(&nd->cv);
    pthread_mutex_destroy(&nd->mu);
    free(nd->host);
    free(nd);
    *pnd = NULL;
}

static int nodes_count(cg_remote *r)
{
    return __atomic_load_n(&r->n_nodes, __ATOMIC_ACQUIRE);
}

/* Index of the node host:port, added when new; -1 when CG_REMOTE_MAX_NODES are known. */
static int node_find_or_add(cg_remote *r, const char *host, size_t host_len, int port)
{
    int n = nodes_count(r);
    for (int i = 0; i < n; i++)
        if (r->nodes[i]->port == port && strlen(r->nodes[i]->host) == host_len &&
            memcmp(r->nodes[i]->host, host, host_len) == 0)
            return i;
    pthread_mutex_lock(&r->nodes_mu);
    n = r->n_nodes;
    int found = -1;
    for (int i = 0; i < n && found < 0; i++)
        if (r->nodes[i]->port == port && strlen(r->nodes[i]->host) == host_len &&
            memcmp(r->nodes[i]->host, host, host_len) == 0)
            found = i;
    if (found < 0 && n < CG_REMOTE_MAX_NODES) {
        char *h = cg_strndup(host, host_len);
        r->nodes[n] = node_new(h, port, r->p.conns_per_node, r->p.backoff_min_ms);
        free(h);
        __atomic_store_n(&r->n_nodes, n + 1, __ATOMIC_RELEASE);
        found = n;
    }
    pthread_mutex_unlock(&r->nodes_mu);
    return found;
}

/* ---- output: RESP commands as an iovec list ------------------------------------------------ */

typedef struct seg {
    const char *ext; /* NULL: bytes at off in the header buffer */
    size_t off, len;
} seg;

typedef struct outq {
    cg_buf hdr; /* unbounded: a call's commands are bounded by its batch limits */
    seg *segs;
    size_t n_segs, cap_segs;
    size_t cur, cur_off; /* first segment not fully sent, and its bytes already sent */
} outq;

static void out_init(outq *o)
{
    memset(o, 0, sizeof *o);
    cg_buf_init_unbounded(&o->hdr); /* BATCH_MAX keys, INLINE_MAX bytes copied per argument */
}

static void out_seg(outq *o, const char *ext, size_t off, size_t len)
{
    if (o->n_segs && !ext && !o->segs[o->n_segs - 1].ext &&
        o->segs[o->n_segs - 1].off + o->segs[o->n_segs - 1].len == off) {
        o->segs[o->n_segs - 1].len += len;
        return;
    }
    if (o->n_segs == o->cap_segs) {
        o->cap_segs = o->cap_segs ? o->cap_segs * 2 : 16;
        o->segs = cg_realloc(o->segs, o->cap_segs * sizeof *o->segs);
    }
    o->segs[o->n_segs++] = (seg){ext, off, len};
}

static void out_copy(outq *o, const void *p, size_t len)
{
    out_seg(o, NULL, o->hdr.len, len);
    cg_status st = cg_buf_append(&o->hdr, p, len);
    (void)st; /* unbounded: cannot fail */
}

static void out_arg(outq *o, const void *p, size_t len)
{
    char h[32];
    int k = snprintf(h, sizeof h, "$%zu\r\n", len);
    out_copy(o, h, (size_t)k);
    if (len > INLINE_MAX)
        out_seg(o, p, 0, len);
    else
        out_copy(o, p, len);
    out_copy(o, "\r\n", 2);
}

/* Appends one command; the argv bytes larger than INLINE_MAX are borrowed until it is sent. */
static void out_cmd(outq *o, int argc, const char *const *argv, const size_t *lens)
{
    char h[32];
    int k = snprintf(h, sizeof h, "*%d\r\n", argc);
    out_copy(o, h, (size_t)k);
    for (int i = 0; i < argc; i++)
        out_arg(o, argv[i], lens ? lens[i] : strlen(argv[i]));
}

static int out_pending(const outq *o)
{
    return o->cur < o->n_segs;
}

static void out_free(outq *o)
{
    cg_buf_free(&o->hdr);
    free(o->segs);
    memset(o, 0, sizeof *o);
}

/* ---- one node's part of a call, and the poll loop ------------------------------------------ */

typedef struct group {
    int ni; /* node index */
    node *nd;
    conn *cn;
    outq out;
    size_t n_expect, n_got;
    redisReply **rep; /* n_expect replies, in command order */
    size_t *map;      /* n_expect: op index (| ASK_FLAG for the ASKING reply before it) */
    cg_status st;     /* I/O outcome on this connection */
    char *big;        /* a large bulk string being received in place (BIG_MIN bytes or more) */
    size_t big_len, big_got; /* its length, and bytes received of big_len + 2 (with CRLF) */
    size_t big_cap;          /* its buffer's size */
    size_t fed;              /* bytes given to the reply parser */
} group;

static void group_free(group *g)
{
    for (size_t i = 0; i < g->n_got; i++)
        if (g->rep[i]) freeReplyObject(g->rep[i]);
    free(g->rep);
    free(g->map);
    free(g->big);
    out_free(&g->out);
}

static int group_fd(const group *g)
{
    return g->cn->ctx->fd;
}

static cg_status send_some(group *g)
{
    outq *o = &g->out;
    while (out_pending(o)) {
        struct iovec iov[IOV_BATCH];
        int k = 0;
        for (size_t i = o->cur; i < o->n_segs && k < IOV_BATCH; i++, k++) {
            const seg *s = &o->segs[i];
            const char *base = s->ext ? s->ext : o->hdr.data + s->off;
            size_t skip = i == o->cur ? o->cur_off : 0;
            iov[k].iov_base = (void *)(base + skip);
            iov[k].iov_len = s->len - skip;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t n = sendmsg(group_fd(g), &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return CG_OK;
            return CG_E_UNAVAILABLE;
        }
        size_t left = (size_t)n;
        while (left && o->cur < o->n_segs) {
            size_t rest = o->segs[o->cur].len - o->cur_off;
            if (left >= rest) {
                left -= rest;
                o->cur++;
                o->cur_off = 0;
            } else {
                o->cur_off += left;
                left = 0;
            }
        }
    }
    return CG_OK;
}

/* A buffer of at least need bytes: a recycled one (no page faults) or a new one. */
static char *buf_get(cg_remote *r, size_t need, size_t *cap)
{
    char *p = NULL;
    pthread_mutex_lock(&r->cache_mu);
    for (size_t i = 0; i < r->cache_n; i++)
        if (r->cache[i].cap >= need && r->cache[i].cap / 2 <= need) {
            p = r->cache[i].p;
            *cap = r->cache[i].cap;
            r->cache_bytes -= *cap;
            r->cache[i] = r->cache[--r->cache_n];
            break;
        }
    pthread_mutex_unlock(&r->cache_mu);
    if (!p) {
        p = cg_malloc(need);
        *cap = need;
    }
    return p;
}

/* Keeps p for reuse when the cache has room, else frees it. */
static void buf_put(cg_remote *r, char *p, size_t cap)
{
    pthread_mutex_lock(&r->cache_mu);
    if (r->cache_n == CACHE_SLOTS && r->cache_bytes + cap <= r->p.value_cache_bytes) {
        /* Full of slots: make room by dropping the smallest buffer if p is larger. */
        size_t k = 0;
        for (size_t i = 1; i < r->cache_n; i++)
            if (r->cache[i].cap < r->cache[k].cap) k = i;
        if (r->cache[k].cap < cap) {
            free(r->cache[k].p);
            r->cache_bytes -= r->cache[k].cap;
            r->cache[k] = r->cache[--r->cache_n];
        }
    }
    if (r->cache_n < CACHE_SLOTS && r->cache_bytes + cap <= r->p.value_cache_bytes) {
        r->cache[r->cache_n].p = p;
        r->cache[r->cache_n++].cap = cap;
        r->cache_bytes += cap;
        p = NULL;
    }
    pthread_mutex_unlock(&r->cache_mu);
    free(p);
}

/* Completes the in-place bulk string: checks its CRLF and appends it as a reply whose string
 * is the buffer itself (freeReplyObject frees both with free()). */
static cg_status big_finish(group *g)
{
    if (g->big[g->big_len] != '\r' || g->big[g->big_len + 1] != '\n') return CG_E_BAD_GATEWAY;
    g->big[g->big_len] = 0;
    redisReply *rep = cg_calloc(1, sizeof *rep);
    rep->type = REDIS_REPLY_STRING;
    rep->str = g->big;
    rep->len = g->big_len;
    rep->elements = g->big_cap; /* unused for a string: marks a recyclable buffer */
    g->rep[g->n_got++] = rep;
    g->big = NULL;
    g->big_len = g->big_got = g->big_cap = 0;
    return CG_OK;
}

/* With the parser between replies and a complete "$<len>\r\n" header of a large value at its
 * cursor, takes the value over: allocates its buffer, moves the bytes already read into it and
 * advances the parser past them. Returns 1 when taken over, 2 when a bulk header has started
 * but is not complete (wait for more bytes), 0 when the parser should go on, -1 when the length
 * is larger than value_max_bytes. */
static int big_take(cg_remote *r, group *g, redisReader *rd)
{
    if (rd->ridx != -1 || rd->pos >= rd->len || rd->buf[rd->pos] != '$') return 0;
    const char *p = rd->buf + rd->pos + 1, *end = rd->buf + rd->len;
    size_t len = 0;
    const char *q = p;
    for (; q < end && *q >= '0' && *q <= '9' && q - p < 19; q++)
        len = len * 10 + (size_t)(*q - '0');
    if (q + 1 >= end && q - p < 19) return 2; /* header not complete yet: wait for it */
    if (q == p || q + 1 >= end || q[0] != '\r' || q[1] != '\n' || len < BIG_MIN) return 0;
    if (len > r->p.value_max_bytes) {
        LOG_LIMITED(r, "remote: a reply from %s:%d is larger than value_max_bytes (%zu)",
                    g->nd->host, g->nd->port, r->p.value_max_bytes);
        return -1;
    }
    const char *payload = q + 2;
    size_t have = CG_MIN((size_t)(end - payload), len + 2);
    g->big = buf_get(r, len + 2, &g->big_cap);
    g->big_len = len;
    g->big_got = have;
    memcpy(g->big, payload, have);
    rd->pos = (size_t)(payload + have - rd->buf);
    if (rd->pos == rd->len || rd->pos >= 1024) {
        sdsrange(rd->buf, (ssize_t)rd->pos, -1);
        rd->pos = 0;
        rd->len = sdslen(rd->buf);
    }
    return 1;
}

/* Parses what the reader holds into replies, taking large values over. */
static cg_status parse_some(cg_remote *r, group *g, redisReader *rd)
{
    while (g->n_got < g->n_expect && !g->big) {
        int t = big_take(r, g, rd);
        if (t < 0) return CG_E_TOO_LARGE;
        if (t == 2) break;
        if (t == 1) {
            if (g->big_got == g->big_len + 2 && big_finish(g) != CG_OK) return CG_E_BAD_GATEWAY;
            continue;
        }
        void *rep = NULL;
        if (redisReaderGetReply(rd, &rep) != REDIS_OK) {
            LOG_LIMITED(r, "remote: protocol error from %s:%d: %s", g->nd->host, g->nd->port,
                        rd->errstr);
            return CG_E_BAD_GATEWAY;
        }
        if (!rep) break;
        g->rep[g->n_got++] = rep;
    }
    return CG_OK;
}

static cg_status recv_some(cg_remote *r, group *g)
{
    char buf[RECV_CHUNK];
    redisReader *rd = g->cn->ctx->reader;
    for (int round = 0; round < 64; round++) {
        ssize_t n;
        if (g->big)
            n = recv(group_fd(g), g->big + g->big_got, g->big_len + 2 - g->big_got, 0);
        else
            n = recv(group_fd(g), buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return CG_OK;
            return CG_E_UNAVAILABLE;
        }
        if (n == 0) return CG_E_UNAVAILABLE; /* closed by the server */
        if (g->big) {
            g->big_got += (size_t)n;
            if (g->big_got < g->big_len + 2) continue;
            if (big_finish(g) != CG_OK) return CG_E_BAD_GATEWAY;
        } else if (redisReaderFeed(rd, buf, (size_t)n) != REDIS_OK) {
            return CG_E_BAD_GATEWAY;
        } else if ((g->fed += (size_t)n) > r->p.value_max_bytes * g->n_expect + 65536) {
            /* The parser builds every element of a reply as it goes (this hiredis has no
             * element cap): a reply of many small elements is bounded by its bytes here. */
            LOG_LIMITED(r, "remote: replies from %s:%d are larger than value_max_bytes (%zu)",
                        g->nd->host, g->nd->port, r->p.value_max_bytes);
            return CG_E_TOO_LARGE;
        }
        cg_status st = parse_some(r, g, rd);
        if (st != CG_OK) return st;
        size_t buffered = rd->len - rd->pos;
        if (g->n_got == g->n_expect) {
            if (buffered) return CG_E_BAD_GATEWAY; /* bytes nobody asked for */
            return CG_OK;
        }
        /* A reply the parser is buffering whole: refuse it before it gets large. */
        if (buffered > r->p.value_max_bytes + 1024) {
            LOG_LIMITED(r, "remote: a reply from %s:%d is larger than value_max_bytes (%zu)",
                        g->nd->host, g->nd->port, r->p.value_max_bytes);
            return CG_E_TOO_LARGE;
        }
        if (!g->big && (size_t)n < sizeof buf) return CG_OK;
    }
    return CG_OK;
}

/* Sends every group's commands and reads its n_expect replies, all groups at once, until done,
 * an I/O failure (g->st) or deadline_ns (CG_E_TIMEOUT for the groups not done). */
static void pump(cg_remote *r, group *gs, size_t ng, uint64_t deadline_ns)
{
    struct pollfd *pfd = cg_calloc(ng ? ng : 1, sizeof *pfd);
    size_t *idx = cg_calloc(ng ? ng : 1, sizeof *idx);
    for (;;) {
        size_t np = 0;
        for (size_t i = 0; i < ng; i++) {
            group *g = &gs[i];
            if (!g->cn || g->st != CG_OK) continue;
            short ev = 0;
            if (out_pending(&g->out)) ev |= POLLOUT;
            if (g->n_got < g->n_expect) ev |= POLLIN;
            if (!ev) continue;
            pfd[np] = (struct pollfd){.fd = group_fd(g), .events = ev};
            idx[np++] = i;
        }
        if (!np) break;
        uint64_t now = cg_now_ns();
        if (now >= deadline_ns) {
            for (size_t k = 0; k < np; k++)
                gs[idx[k]].st = CG_E_TIMEOUT;
            break;
        }
        uint64_t left = deadline_ns - now;
        int ms = (int)CG_MIN((left + 999999) / 1000000, (uint64_t)INT_MAX);
        int rc = poll(pfd, (nfds_t)np, ms);
        if (rc < 0) {
            if (errno == EINTR) continue;
            for (size_t k = 0; k < np; k++)
                gs[idx[k]].st = CG_E_UNAVAILABLE;
            break;
        }
        for (size_t k = 0; k < np; k++) {
            group *g = &gs[idx[k]];
            short re = pfd[k].revents;
            if (!re) continue;
            if ((re & POLLOUT) && out_pending(&g->out)) g->st = send_some(g);
            if (g->st == CG_OK && (re & (POLLIN | POLLHUP | POLLERR))) {
                if (g->n_got < g->n_expect)
                    g->st = recv_some(r, g);
                else if (re & (POLLHUP | POLLERR))
                    g->st = CG_E_UNAVAILABLE;
            }
        }
    }
    free(pfd);
    free(idx);
}

/* ---- connection pool ---------------------------------------------------------------------- */

static cg_status conn_open(cg_remote *r, node *nd, conn *cn, uint64_t deadline_ns);

/* A connection-level failure: the stream is in an unknown state or the node is unusable. */
static int conn_failure(cg_status st)
{
    return st == CG_E_UNAVAILABLE || st == CG_E_TIMEOUT || st == CG_E_BAD_GATEWAY ||
           st == CG_E_AUTH || st == CG_E_VALUE;
}

/* What a caller sees of a group's I/O status: an oversized reply is the protocol class, as a
 * wrong reply is (only conn_release tells the two apart). */
static cg_status caller_status(cg_status st)
{
    return st == CG_E_TOO_LARGE ? CG_E_BAD_GATEWAY : st;
}

/* Gives cn back. A connection failure closes it and the node's idle connections, and starts
 * (or doubles) the node's backoff: no call connects to it again before retry_at_ms. A reply
 * refused for its size (CG_E_TOO_LARGE) closes cn alone: the stream stopped inside the reply,
 * but the node is fine, and one oversized value must not take it from every caller. */
static void conn_release(cg_remote *r, node *nd, conn *cn, cg_status st)
{
    pthread_mutex_lock(&nd->mu);
    if (st == CG_E_TOO_LARGE && cn->ctx) {
        redisFree(cn->ctx);
        cn->ctx = NULL;
    } else if (conn_failure(st)) {
        if (cn->ctx) redisFree(cn->ctx);
        cn->ctx = NULL;
        for (int i = 0; i < nd->n_conns; i++) {
            conn *o = &nd->conns[i];
            if (!o->busy && o->ctx) {
                redisFree(o->ctx);
                o->ctx = NULL;
            }
        }
        uint64_t now = cg_now_ms();
        /* Calls that were already on the wire when the node failed report it too: one backoff
         * step per failure episode, not one per connection. */
        if (now >= nd->retry_at_ms) {
            if (!nd->failed)
                LOG_LIMITED(r, "remote: %s:%d failed (%s); retrying in %d ms", nd->host, nd->port,
                            cg_status_name(st), nd->backoff_ms);
            nd->retry_at_ms = now + (uint64_t)nd->backoff_ms;
            nd->backoff_ms = CG_MIN(nd->backoff_ms * 2, r->p.backoff_max_ms);
        }
        nd->failed = 1;
        if (r->url.cluster) __atomic_store_n(&r->map_stale, 1, __ATOMIC_RELAXED);
    }
    cn->busy = 0;
    pthread_cond_signal(&nd->cv);
    pthread_mutex_unlock(&nd->mu);
}

/* An idle connection must have nothing to read: bytes would be replies to nobody (and would be
 * taken for the next command's), EOF means the server closed it (e.g. its idle timeout). */
static int conn_idle_clean(cg_remote *r, const node *nd, redisContext *ctx)
{
    char b;
    ssize_t n = recv(ctx->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (n > 0)
        LOG_LIMITED(r, "remote: %s:%d sent bytes nobody asked for; reconnecting", nd->host,
                    nd->port);
    return 0;
}

/* Takes a connection of nd, connecting it when needed. Fails fast with CG_E_UNAVAILABLE while
 * the node is in its backoff; CG_E_TIMEOUT when every connection stays busy until the
 * deadline; the connect's failure otherwise. */
static cg_status conn_acquire(cg_remote *r, node *nd, uint64_t deadline_ns, conn **out)
{
    *out = NULL;
    conn *pick = NULL;
    pthread_mutex_lock(&nd->mu);
    for (;;) {
        if (cg_now_ms() < nd->retry_at_ms) {
            pthread_mutex_unlock(&nd->mu);
            ST_ADD(r, fast_fails, 1);
            return CG_E_UNAVAILABLE;
        }
        for (int i = 0; i < nd->n_conns && !pick; i++)
            if (!nd->conns[i].busy && nd->conns[i].ctx) pick = &nd->conns[i];
        for (int i = 0; i < nd->n_conns && !pick; i++)
            if (!nd->conns[i].busy) pick = &nd->conns[i];
        if (pick) break;
        if (cond_wait_until(&nd->cv, &nd->mu, deadline_ns) == ETIMEDOUT) {
            pthread_mutex_unlock(&nd->mu);
            return CG_E_TIMEOUT;
        }
    }
    pick->busy = 1;
    pthread_mutex_unlock(&nd->mu);
    if (pick->ctx && !conn_idle_clean(r, nd, pick->ctx)) {
        redisFree(pick->ctx); /* reconnect below: not a failure of the node */
        pick->ctx = NULL;
    }
    if (!pick->ctx) {
        cg_status st = conn_open(r, nd, pick, deadline_ns);
        if (st != CG_OK) {
            conn_release(r, nd, pick, st);
            return st;
        }
    }
    *out = pick;
    return CG_OK;
}

/* Class of an error reply: CG_E_AUTH, CG_E_UNAVAILABLE (the server cannot serve now),
 * CG_E_FULL (out of memory with a noeviction policy) or CG_E_BAD_GATEWAY. */
static cg_status error_reply_status(const redisReply *rep)
{
    static const struct {
        const char *prefix;
        cg_status st;
    } map[] = {
        {"NOAUTH", CG_E_AUTH},
        {"WRONGPASS", CG_E_AUTH},
        {"NOPERM", CG_E_AUTH},
        {"LOADING", CG_E_UNAVAILABLE},
        {"CLUSTERDOWN", CG_E_UNAVAILABLE},
        {"TRYAGAIN", CG_E_UNAVAILABLE},
        {"MASTERDOWN", CG_E_UNAVAILABLE},
        {"BUSY", CG_E_UNAVAILABLE},
        {"OOM", CG_E_FULL},
    };
    for (size_t i = 0; i < CG_ARRAY_LEN(map); i++) {
        size_t k = strlen(map[i].prefix);
        if (rep->len >= k && memcmp(rep->str, map[i].prefix, k) == 0 &&
            (rep->len == k || rep->str[k] == ' '))
            return map[i].st;
    }
    return CG_E_BAD_GATEWAY;
}

/* Connects cn to nd and runs the handshake (AUTH, SELECT) within the deadline. */
static cg_status conn_open(cg_remote *r, node *nd, conn *cn, uint64_t deadline_ns)
{
    cg_status st = CG_OK;
    group g = {0};
    out_init(&g.out);
    uint64_t now = cg_now_ns();
    if (now >= deadline_ns) return CG_E_TIMEOUT;
    uint64_t left_us = (deadline_ns - now) / 1000;
    struct timeval tv = {.tv_sec = (time_t)(left_us / 1000000),
                         .tv_usec = (long)(left_us % 1000000)};
    redisContext *ctx = redisConnectWithTimeout(nd->host, nd->port, tv);
    if (!ctx || ctx->err) {
        int timed_out = ctx && (strstr(ctx->errstr, "timed out") != NULL);
        st = timed_out ? CG_E_TIMEOUT : CG_E_UNAVAILABLE;
        if (ctx) redisFree(ctx);
        ST_ADD(r, connect_failures, 1);
        return st;
    }
    int fl = fcntl(ctx->fd, F_GETFL);
    if (fl < 0 || fcntl(ctx->fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
        fcntl(ctx->fd, F_SETFD, FD_CLOEXEC) < 0) {
        redisFree(ctx);
        ST_ADD(r, connect_failures, 1);
        return CG_E_UNAVAILABLE;
    }
    cn->ctx = ctx;

    int db = r->url.cluster ? 0 : r->url.db;
    size_t n_cmd = (r->password ? 1 : 0) + (db ? 1 : 0);
    if (n_cmd) {
        g.nd = nd;
        g.cn = cn;
        g.n_expect = n_cmd;
        g.rep = cg_calloc(n_cmd, sizeof *g.rep);
        g.map = cg_calloc(n_cmd, sizeof *g.map);
        if (r->password) {
            const char *argv[] = {"AUTH", r->password};
            out_cmd(&g.out, 2, argv, NULL);
        }
        char dbs[16];
        if (db) {
            snprintf(dbs, sizeof dbs, "%d", db);
            const char *argv[] = {"SELECT", dbs};
            out_cmd(&g.out, 2, argv, NULL);
        }
        pump(r, &g, 1, deadline_ns);
        /* a handshake reply over the size bound is a broken node, not one oversized value */
        st = caller_status(g.st);
        for (size_t i = 0; st == CG_OK && i < n_cmd; i++) {
            const redisReply *rep = g.rep[i];
            int is_auth = r->password && i == 0;
            if (rep->type == REDIS_REPLY_STATUS && rep->len == 2 && memcmp(rep->str, "OK", 2) == 0)
                continue;
            if (rep->type == REDIS_REPLY_ERROR && is_auth) {
                set_last_err(r, "Redis at %s:%d refused the password: %.*s", nd->host, nd->port,
                             (int)CG_MIN(rep->len, 160), rep->str);
                st = CG_E_AUTH;
            } else if (rep->type == REDIS_REPLY_ERROR && error_reply_status(rep) == CG_E_AUTH) {
                set_last_err(r, "Redis at %s:%d needs a password: %.*s", nd->host, nd->port,
                             (int)CG_MIN(rep->len, 160), rep->str);
                st = CG_E_AUTH;
            } else if (rep->type == REDIS_REPLY_ERROR) {
                set_last_err(r, "Redis at %s:%d refused SELECT %d: %.*s", nd->host, nd->port, db,
                             (int)CG_MIN(rep->len, 160), rep->str);
                st = CG_E_VALUE;
            } else {
                st = CG_E_BAD_GATEWAY;
            }
        }
        if (st == CG_E_AUTH || st == CG_E_VALUE) {
            pthread_mutex_lock(&r->err_mu);
            LOG_LIMITED(r, "remote: %s", r->last_err);
            pthread_mutex_unlock(&r->err_mu);
        }
        group_free(&g);
    }
    if (st != CG_OK) {
        ST_ADD(r, connect_failures, 1);
        return st; /* the caller's conn_release closes cn->ctx */
    }
    ST_ADD(r, connects, 1);
    pthread_mutex_lock(&nd->mu);
    if (nd->failed) {
        ST_ADD(r, reconnects, 1);
        cg_log(CG_LOG_INFO, "remote: %s:%d is back", nd->host, nd->port);
    }
    nd->failed = 0;
    nd->backoff_ms = r->p.backoff_min_ms;
    pthread_mutex_unlock(&nd->mu);
    return CG_OK;
}

/* ---- cluster slot map ---------------------------------------------------------------------- */

static uint16_t crc16_xmodem(const unsigned char *p, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int k = 0; k < 8; k++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned cg_remote_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(key + from, '}', len - from);
        if (close && close > key + from) {
            key += from;
            len = (size_t)(close - key);
        }
    }
    return crc16_xmodem((const unsigned char *)key, len) & (CG_REMOTE_SLOTS - 1);
}

/* Parses a CLUSTER SLOTS reply from node `from` into a new table and installs it. */
static cg_status map_install(cg_remote *r, const redisReply *rep, const node *from)
{
    if (rep->type == REDIS_REPLY_ERROR) {
        set_last_err(r,
                     "Redis at %s:%d refused CLUSTER SLOTS (is it a cluster node? use "
                     "redis:// for a single node): %.*s",
                     from->host, from->port, (int)CG_MIN(rep->len, 160), rep->str);
        cg_status st = error_reply_status(rep);
        return st == CG_E_BAD_GATEWAY ? CG_E_VALUE : st;
    }
    if (rep->type != REDIS_REPLY_ARRAY) return CG_E_BAD_GATEWAY;
    int16_t *tab = cg_malloc(sizeof r->slots);
    for (size_t i = 0; i < CG_REMOTE_SLOTS; i++)
        tab[i] = -1;
    cg_status st = CG_OK;
    for (size_t i = 0; i < rep->elements && st == CG_OK; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2) {
            st = CG_E_BAD_GATEWAY;
            break;
        }
        long long a = e->element[0]->integer, b = e->element[1]->integer;
        const redisReply *h = e->element[2]->element[0], *pt = e->element[2]->element[1];
        if (a < 0 || b < a || b >= CG_REMOTE_SLOTS || h->type != REDIS_REPLY_STRING ||
            h->len > 255 || pt->type != REDIS_REPLY_INTEGER || pt->integer < 1 ||
            pt->integer > 65535) {
            st = CG_E_BAD_GATEWAY;
            break;
        }
        if (h->len == 1 && h->str[0] == '?') continue; /* endpoint unknown: not routable */
        const char *host = h->len ? h->str : from->host;
        size_t host_len = h->len ? h->len : strlen(from->host);
        int ni = node_find_or_add(r, host, host_len, (int)pt->integer);
        if (ni < 0) {
            LOG_LIMITED(r, "remote: the cluster has more than %d nodes", CG_REMOTE_MAX_NODES);
            st = CG_E_BAD_GATEWAY;
            break;
        }
        for (long long s = a; s <= b; s++)
            tab[s] = (int16_t)ni;
    }
    if (st == CG_OK) {
        pthread_rwlock_wrlock(&r->map_lock);
        memcpy(r->slots, tab, sizeof r->slots);
        r->map_loaded = 1;
        pthread_rwlock_unlock(&r->map_lock);
        ST_ADD(r, map_refreshes, 1);
    }
    free(tab);
    return st;
}

static int map_is_loaded(cg_remote *r)
{
    pthread_rwlock_rdlock(&r->map_lock);
    int v = r->map_loaded;
    pthread_rwlock_unlock(&r->map_lock);
    return v;
}

/* Loads the slot map with CLUSTER SLOTS from the first node that answers. Unless force, does
 * nothing when a refresh finished less than backoff_min_ms ago (or ends while waiting here). */
static cg_status map_refresh(cg_remote *r, uint64_t deadline_ns, int force)
{
    pthread_mutex_lock(&r->refresh_mu);
    uint64_t asked = cg_now_ms();
    while (r->refreshing) {
        if (cond_wait_until(&r->refresh_cv, &r->refresh_mu, deadline_ns) == ETIMEDOUT) {
            pthread_mutex_unlock(&r->refresh_mu);
            return CG_E_TIMEOUT;
        }
    }
    int loaded = map_is_loaded(r);
    if (loaded && (r->map_at_ms >= asked ||
                   (!force && cg_now_ms() < r->map_at_ms + (uint64_t)r->p.backoff_min_ms))) {
        pthread_mutex_unlock(&r->refresh_mu);
        return CG_OK;
    }
    r->refreshing = 1;
    unsigned start = r->refresh_rr++;
    pthread_mutex_unlock(&r->refresh_mu);

    __atomic_store_n(&r->map_stale, 0, __ATOMIC_RELAXED);
    cg_status st = CG_E_UNAVAILABLE;
    int n = nodes_count(r);
    for (int k = 0; k < n && st != CG_OK; k++) {
        node *nd = r->nodes[(start + (unsigned)k) % (unsigned)n];
        conn *cn = NULL;
        cg_status ast = conn_acquire(r, nd, deadline_ns, &cn);
        if (ast != CG_OK) {
            if (ast != CG_E_UNAVAILABLE || st == CG_E_UNAVAILABLE) st = ast;
            if (ast == CG_E_AUTH || ast == CG_E_TIMEOUT) break;
            continue;
        }
        group g = {.nd = nd, .cn = cn, .n_expect = 1};
        out_init(&g.out);
        g.rep = cg_calloc(1, sizeof *g.rep);
        g.map = cg_calloc(1, sizeof *g.map);
        const char *argv[] = {"CLUSTER", "SLOTS"};
        out_cmd(&g.out, 2, argv, NULL);
        pump(r, &g, 1, deadline_ns);
        conn_release(r, nd, cn, g.st);
        st = g.st == CG_OK ? map_install(r, g.rep[0], nd) : caller_status(g.st);
        group_free(&g);
        if (st == CG_E_VALUE || st == CG_E_TIMEOUT) break;
    }
    if (st != CG_OK) __atomic_store_n(&r->map_stale, 1, __ATOMIC_RELAXED);

    pthread_mutex_lock(&r->refresh_mu);
    r->refreshing = 0;
    r->map_at_ms = cg_now_ms();
    pthread_cond_broadcast(&r->refresh_cv);
    pthread_mutex_unlock(&r->refresh_mu);
    return st;
}

static int route(cg_remote *r, const char *key, size_t klen)
{
    if (!r->url.cluster) return 0;
    unsigned slot = cg_remote_key_slot(key, klen);
    pthread_rwlock_rdlock(&r->map_lock);
    int ni = r->slots[slot];
    pthread_rwlock_unlock(&r->map_lock);
    return ni;
}

/* Parses "MOVED <slot> <host>:<port>" / "ASK ..." (prefix already matched, p after it). An
 * empty host means the node that answered. Returns the target's node index or -1. */
static int parse_redirect(cg_remote *r, const char *p, size_t len, const node *from,
                          unsigned *slot_out)
{
    char buf[320];
    if (len >= sizeof buf) return -1;
    memcpy(buf, p, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    unsigned long slot = strtoul(buf, &end, 10);
    if (errno || end == buf || *end != ' ' || slot >= CG_REMOTE_SLOTS) return -1;
    const char *addr = end + 1;
    const char *colon = strrchr(addr, ':');
    if (!colon) return -1;
    char *pend = NULL;
    unsigned long port = strtoul(colon + 1, &pend, 10);
    if (pend == colon + 1 || *pend || port < 1 || port > 65535) return -1;
    const char *host = addr;
    size_t host_len = (size_t)(colon - addr);
    if (host_len == 0) {
        host = from->host;
        host_len = strlen(from->host);
    }
    if (host_len > 255) return -1;
    *slot_out = (unsigned)slot;
    return node_find_or_add(r, host, host_len, (int)port);
}

/* ---- running a batch ----------------------------------------------------------------------- */

typedef enum { OP_GET, OP_SET, OP_DEL, OP_PING, OP_CMD } op_kind;

typedef struct op {
    const char *key;
    size_t klen;
    const void *val;
    size_t vlen;
    int node;   /* target this round */
    int pinned; /* node fixed by the caller (PING) */
    int ask;    /* send ASKING first (one round) */
    int done;
    redisReply *rep; /* owned */
    /* OP_CMD: the whole command (borrowed); key is one of its arguments. */
    int argc;
    const char *const *argv;
    const size_t *argvlen;
} op;

static void ops_free_replies(op *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i].rep) {
            freeReplyObject(ops[i].rep);
            ops[i].rep = NULL;
        }
}

static void op_command(cg_remote *r, op_kind kind, const op *o, outq *out)
{
    switch (kind) {
    case OP_GET:
    case OP_DEL: {
        const char *argv[] = {kind == OP_GET ? "GET" : "DEL", o->key};
        size_t lens[] = {3, o->klen};
        out_cmd(out, 2, argv, lens);
        break;
    }
    case OP_SET: {
        char ttl[16];
        int k = snprintf(ttl, sizeof ttl, "%u", r->p.ttl_s);
        const char *argv[] = {"SET", o->key, o->val, "EX", ttl};
        size_t lens[] = {3, o->klen, o->vlen, 2, (size_t)k};
        out_cmd(out, r->p.ttl_s ? 5 : 3, argv, lens);
        break;
    }
    case OP_PING: {
        const char *argv[] = {"PING"};
        out_cmd(out, 1, argv, NULL);
        break;
    }
    case OP_CMD:
        out_cmd(out, o->argc, o->argv, o->argvlen);
        break;
    }
}

/* Checks a final (non-redirect) reply for kind. CG_OK, CG_E_NOT_FOUND (GET: nil), or the
 * error's class. */
static cg_status op_check(cg_remote *r, op_kind kind, const redisReply *rep, const node *nd)
{
    if (rep->type == REDIS_REPLY_ERROR) {
        cg_status st = error_reply_status(rep);
        if (st == CG_E_AUTH)
            set_last_err(r, "Redis at %s:%d needs a password (%s or a password file): %.*s",
                         nd->host, nd->port, CG_REMOTE_PASSWORD_ENV, (int)CG_MIN(rep->len, 160),
                         rep->str);
        LOG_LIMITED(r, "remote: %s:%d replied %.*s", nd->host, nd->port, (int)CG_MIN(rep->len, 160),
                    rep->str);
        return st;
    }
    switch (kind) {
    case OP_GET:
        if (rep->type == REDIS_REPLY_NIL) return CG_E_NOT_FOUND;
        if (rep->type != REDIS_REPLY_STRING) return CG_E_BAD_GATEWAY;
        if (rep->len > r->p.value_max_bytes) return CG_E_BAD_GATEWAY;
        return CG_OK;
    case OP_SET:
        return rep->type == REDIS_REPLY_STATUS && rep->len == 2 && !memcmp(rep->str, "OK", 2)
                   ? CG_OK
                   : CG_E_BAD_GATEWAY;
    case OP_DEL:
        return rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0 && rep->integer <= 1
                   ? CG_OK
                   : CG_E_BAD_GATEWAY;
    case OP_PING:
        return rep->type == REDIS_REPLY_STATUS && rep->len == 4 && !memcmp(rep->str, "PONG", 4)
                   ? CG_OK
                   : CG_E_BAD_GATEWAY;
    case OP_CMD:
        return CG_OK; /* the caller reads the reply */
    }
    return CG_E_BAD_GATEWAY;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Runs one round: every op not done goes to its node; returns the I/O outcome. Replies land
 * in ops[i].rep (a refused ASKING is CG_E_BAD_GATEWAY). */
static cg_status run_round(cg_remote *r, op_kind kind, op *ops, size_t n, uint64_t deadline_ns)
{
    int nodes_used[CG_REMOTE_MAX_NODES];
    size_t per_node[CG_REMOTE_MAX_NODES];
    int group_of[CG_REMOTE_MAX_NODES];
    size_t ng = 0;
    memset(per_node, 0, sizeof per_node);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].done) continue;
        if (!per_node[ops[i].node]++) nodes_used[ng++] = ops[i].node;
        if (ops[i].ask) per_node[ops[i].node]++;
    }
    qsort(nodes_used, ng, sizeof *nodes_used, cmp_int);
    group *gs = cg_calloc(ng ? ng : 1, sizeof *gs);
    cg_status st = CG_OK;
    size_t acquired = 0;
    for (size_t k = 0; k < ng; k++) {
        group *g = &gs[k];
        g->ni = nodes_used[k];
        g->nd = r->nodes[g->ni];
        out_init(&g->out);
        group_of[g->ni] = (int)k;
        g->rep = cg_calloc(per_node[g->ni], sizeof *g->rep);
        g->map = cg_calloc(per_node[g->ni], sizeof *g->map);
    }
    /* Connections in increasing node index: calls never wait on each other in a cycle. */
    for (size_t k = 0; k < ng && st == CG_OK; k++) {
        st = conn_acquire(r, gs[k].nd, deadline_ns, &gs[k].cn);
        if (st == CG_OK) acquired++;
    }
    if (st == CG_OK) {
        for (size_t i = 0; i < n; i++) {
            if (ops[i].done) continue;
            group *g = &gs[group_of[ops[i].node]];
            if (ops[i].ask) {
                const char *argv[] = {"ASKING"};
                out_cmd(&g->out, 1, argv, NULL);
                g->map[g->n_expect++] = i | ASK_FLAG;
            }
            op_command(r, kind, &ops[i], &g->out);
            g->map[g->n_expect++] = i;
        }
        pump(r, gs, ng, deadline_ns);
    }
    for (size_t k = 0; k < acquired; k++) {
        conn_release(r, gs[k].nd, gs[k].cn, gs[k].st);
        if (st == CG_OK && gs[k].st != CG_OK) st = caller_status(gs[k].st);
    }
    if (st == CG_OK) {
        for (size_t k = 0; k < ng && st == CG_OK; k++) {
            group *g = &gs[k];
            for (size_t j = 0; j < g->n_got; j++) {
                redisReply *rep = g->rep[j];
                size_t m = g->map[j];
                if (m & ASK_FLAG) {
                    if (rep->type != REDIS_REPLY_STATUS) st = CG_E_BAD_GATEWAY;
                    continue;
                }
                if (ops[m].rep) freeReplyObject(ops[m].rep);
                ops[m].rep = rep;
                g->rep[j] = NULL;
            }
        }
    }
    for (size_t k = 0; k < ng; k++)
        group_free(&gs[k]);
    free(gs);
    return st;
}

/* Runs ops (keys routed by slot unless pinned) until each has a final reply, following up to
 * max_redirects rounds of MOVED/ASK. CG_OK when every reply is good; for GET, CG_E_NOT_FOUND
 * as soon as one key is missing; else the first failure. Replies stay in ops[i].rep. */
static cg_status exec_ops(cg_remote *r, op_kind kind, op *ops, size_t n, uint64_t deadline_ns)
{
    cg_status st = CG_OK;
    for (int round = 0;; round++) {
        if (r->url.cluster &&
            (!map_is_loaded(r) || __atomic_load_n(&r->map_stale, __ATOMIC_RELAXED))) {
            cg_status mst = map_refresh(r, deadline_ns, 0);
            if (mst != CG_OK && !map_is_loaded(r)) return mst;
        }
        for (size_t i = 0; i < n; i++) {
            if (ops[i].done || ops[i].ask || ops[i].pinned) continue;
            ops[i].node = route(r, ops[i].key, ops[i].klen);
            if (ops[i].node < 0) {
                LOG_LIMITED(r, "remote: no node serves the slot of key %s", ops[i].key);
                __atomic_store_n(&r->map_stale, 1, __ATOMIC_RELAXED);
                return CG_E_UNAVAILABLE;
            }
        }
        st = run_round(r, kind, ops, n, deadline_ns);
        if (st != CG_OK) return st;
        int redirected = 0, missing = 0;
        for (size_t i = 0; i < n; i++) {
            op *o = &ops[i];
            if (o->done) continue;
            redisReply *rep = o->rep;
            node *from = r->nodes[o->node];
            o->ask = 0;
            if (rep->type == REDIS_REPLY_ERROR) {
                int moved = rep->len > 6 && !memcmp(rep->str, "MOVED ", 6);
                int ask = rep->len > 4 && !memcmp(rep->str, "ASK ", 4);
                if (moved || ask) {
                    if (!r->url.cluster) {
                        LOG_LIMITED(r,
                                    "remote: %s:%d replied %.*s: it is a cluster node, use "
                                    "redis+cluster://",
                                    from->host, from->port, (int)CG_MIN(rep->len, 80), rep->str);
                        return CG_E_BAD_GATEWAY;
                    }
                    size_t skip = moved ? 6 : 4;
                    unsigned slot = 0;
                    int ni = parse_redirect(r, rep->str + skip, rep->len - skip, from, &slot);
                    if (ni < 0) return CG_E_BAD_GATEWAY;
                    if (moved) {
                        pthread_rwlock_wrlock(&r->map_lock);
                        r->slots[slot] = (int16_t)ni;
                        pthread_rwlock_unlock(&r->map_lock);
                        __atomic_store_n(&r->map_stale, 1, __ATOMIC_RELAXED);
                        ST_ADD(r, redirects_moved, 1);
                        if (o->pinned) o->node = ni;
                    } else {
                        o->node = ni;
                        o->ask = 1;
                        ST_ADD(r, redirects_ask, 1);
                    }
                    freeReplyObject(rep);
                    o->rep = NULL;
                    redirected = 1;
                    continue;
                }
            }
            cg_status cst = op_check(r, kind, rep, from);
            if (cst == CG_E_NOT_FOUND) {
                missing = 1;
            } else if (cst != CG_OK) {
                return cst;
            }
            o->done = 1;
        }
        if (missing) return CG_E_NOT_FOUND;
        if (!redirected) return CG_OK;
        if (round >= r->p.max_redirects) {
            LOG_LIMITED(r, "remote: more than %d redirects in one call", r->p.max_redirects);
            return CG_E_BAD_GATEWAY;
        }
    }
}

static uint64_t deadline_after(const cg_remote *r, uint64_t t0)
{
    return t0 + (uint64_t)r->p.timeout_ms * 1000000ull;
}

/* ---- public calls ------------------------------------------------------------------------- */

cg_remote_params cg_remote_default_params(void)
{
    cg_remote_params p = {0};
    p.timeout_ms = 200;
    p.ttl_s = 0;
    p.queue_max_items = 256;
    p.queue_max_bytes = (size_t)256 << 20;
    p.backoff_min_ms = 100;
    p.backoff_max_ms = 10000;
    p.conns_per_node = 4;
    p.max_redirects = 5;
    p.value_max_bytes = (size_t)256 << 20;
    p.drain_ms = 2000;
    p.value_cache_bytes = (size_t)64 << 20;
    return p;
}

static int host_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
}

cg_status cg_remote_parse_url(const char *url, cg_remote_url *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!url || !*url) {
        cg_seterr(err, errlen, "remote URL is empty");
        return CG_E_VALUE;
    }
    const char *p;
    if (!strncmp(url, "redis://", 8)) {
        p = url + 8;
    } else if (!strncmp(url, "redis+cluster://", 16)) {
        p = url + 16;
        out->cluster = 1;
    } else if (!strncmp(url, "rediss://", 9)) {
        cg_seterr(err, errlen, "remote URL %s: TLS (rediss://) is not supported", url);
        return CG_E_VALUE;
    } else {
        cg_seterr(err, errlen,
                  "remote URL %s: must start with redis:// (one node) or redis+cluster:// (a "
                  "Redis Cluster)",
                  url);
        return CG_E_VALUE;
    }
    if (strchr(p, '@')) {
        cg_seterr(err, errlen,
                  "remote URL must not carry a user or password: set %s or use a password file",
                  CG_REMOTE_PASSWORD_ENV);
        return CG_E_VALUE;
    }
    const char *hs, *he;
    if (*p == '[') {
        hs = p + 1;
        he = strchr(hs, ']');
        if (!he || he == hs) {
            cg_seterr(err, errlen, "remote URL %s: unterminated or empty [IPv6] host", url);
            return CG_E_VALUE;
        }
        for (const char *c = hs; c < he; c++)
            if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') ||
                  (*c >= 'A' && *c <= 'F') || *c == ':' || *c == '.')) {
                cg_seterr(err, errlen, "remote URL %s: invalid IPv6 address", url);
                return CG_E_VALUE;
            }
        p = he + 1;
    } else {
        hs = p;
        while (host_char_ok(*p))
            p++;
        he = p;
        if (he == hs) {
            cg_seterr(err, errlen, "remote URL %s: missing host", url);
            return CG_E_VALUE;
        }
    }
    if ((size_t)(he - hs) >= sizeof out->host) {
        cg_seterr(err, errlen, "remote URL %s: host is longer than 255 bytes", url);
        return CG_E_VALUE;
    }
    memcpy(out->host, hs, (size_t)(he - hs));
    out->host[he - hs] = 0;
    if (*p != ':') {
        cg_seterr(err, errlen, "remote URL %s: expected :port after the host", url);
        return CG_E_VALUE;
    }
    p++;
    long port = 0;
    const char *ds = p;
    while (*p >= '0' && *p <= '9' && p - ds < 6)
        port = port * 10 + (*p++ - '0');
    if (p == ds || (*p >= '0' && *p <= '9') || port < 1 || port > 65535) {
        cg_seterr(err, errlen, "remote URL %s: port must be 1..65535", url);
        return CG_E_VALUE;
    }
    out->port = (int)port;
    if (*p == '/') {
        if (out->cluster) {
            cg_seterr(err, errlen,
                      "remote URL %s: a Redis Cluster has only database 0; drop the /db", url);
            return CG_E_VALUE;
        }
        p++;
        long db = 0;
        ds = p;
        while (*p >= '0' && *p <= '9' && p - ds < 7)
            db = db * 10 + (*p++ - '0');
        if (p == ds || (*p >= '0' && *p <= '9') || db > 999999) {
            cg_seterr(err, errlen, "remote URL %s: database must be a number 0..999999", url);
            return CG_E_VALUE;
        }
        out->db = (int)db;
    }
    if (*p) {
        cg_seterr(err, errlen,
                  "remote URL %s: unexpected characters \"%s\" (expected "
                  "redis://host:port[/db] or redis+cluster://host:port)",
                  url, p);
        return CG_E_VALUE;
    }
    return CG_OK;
}

cg_status cg_remote_load_password(const char *path, char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!path) {
        const char *v = getenv(CG_REMOTE_PASSWORD_ENV);
        if (!v || !*v) return CG_OK;
        if (strlen(v) > CG_REMOTE_PASSWORD_MAX) {
            cg_seterr(err, errlen, "%s is longer than %d bytes", CG_REMOTE_PASSWORD_ENV,
                      CG_REMOTE_PASSWORD_MAX);
            return CG_E_VALUE;
        }
        *out = cg_strdup(v);
        return CG_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        cg_seterr(err, errlen, "password file %s: %s", path, strerror(errno));
        return CG_E_IO;
    }
    char *buf = cg_malloc(CG_REMOTE_PASSWORD_MAX + 3);
    size_t n = fread(buf, 1, CG_REMOTE_PASSWORD_MAX + 2, f);
    int rerr = ferror(f);
    fclose(f);
    cg_status st = CG_OK;
    if (rerr) {
        cg_seterr(err, errlen, "password file %s: read error", path);
        st = CG_E_IO;
        goto out;
    }
    if (n && buf[n - 1] == '\n') n--;
    if (n && buf[n - 1] == '\r') n--;
    buf[n] = 0;
    if (n > CG_REMOTE_PASSWORD_MAX) {
        cg_seterr(err, errlen, "password file %s: longer than %d bytes", path,
                  CG_REMOTE_PASSWORD_MAX);
        st = CG_E_VALUE;
    } else if (n == 0) {
        cg_seterr(err, errlen, "password file %s is empty", path);
        st = CG_E_VALUE;
    } else if (memchr(buf, 0, n) || memchr(buf, '\n', n)) {
        cg_seterr(err, errlen, "password file %s: the password must be one line without NUL", path);
        st = CG_E_VALUE;
    }
out:
    if (st == CG_OK)
        *out = buf;
    else
        free(buf);
    return st;
}

void cg_remote_free_password(char *password)
{
    if (!password) return;
    memset(password, 0, strlen(password));
    free(password);
}

static void qitem_free(qitem **pit)
{
    free(*pit);
    *pit = NULL;
}

static cg_status write_items(cg_remote *r, qitem *const *items, size_t k);

static void *writer_main(void *arg)
{
    cg_remote *r = arg;
    pthread_mutex_lock(&r->qmu);
    for (;;) {
        while (cg_list_empty(&r->queue) && !r->q_stop)
            pthread_cond_wait(&r->qcv, &r->qmu);
        if (r->q_stop) break;
        qitem *batch[WRITER_BATCH_ITEMS];
        size_t k = 0, bytes = 0;
        while (!cg_list_empty(&r->queue) && k < WRITER_BATCH_ITEMS) {
            qitem *it = CG_LIST_ENTRY(r->queue.head, qitem, link);
            if (k > 0 && bytes + it->bytes > WRITER_BATCH_BYTES) break;
            cg_list_remove(&r->queue, &it->link);
            bytes += it->bytes;
            batch[k++] = it;
        }
        uint64_t last = batch[k - 1]->seq;
        r->q_writing = k;
        pthread_mutex_unlock(&r->qmu);

        cg_status st = write_items(r, batch, k);
        if (st != CG_OK) ST_ADD(r, queue_failed, k);
        for (size_t i = 0; i < k; i++) {
            if (r->p.on_written)
                r->p.on_written(r->p.on_written_ud, batch[i]->n,
                                (const char *const *)batch[i]->keys, batch[i]->tag, st);
            qitem_free(&batch[i]);
        }

        pthread_mutex_lock(&r->qmu);
        r->q_items -= k;
        r->q_bytes -= bytes;
        r->q_writing = 0;
        r->q_done = last;
        pthread_cond_broadcast(&r->qdone);
    }
    pthread_mutex_unlock(&r->qmu);
    return NULL;
}

static cg_status set_ops(cg_remote *r, op *ops, size_t n, uint64_t t0)
{
    cg_status st = exec_ops(r, OP_SET, ops, n, deadline_after(r, t0));
    if (st == CG_OK) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++)
            bytes += ops[i].vlen;
        ST_ADD(r, sets, n);
        ST_ADD(r, bytes_written, bytes);
    }
    ops_free_replies(ops, n);
    count_error(r, st);
    return st;
}

static cg_status write_items(cg_remote *r, qitem *const *items, size_t k)
{
    size_t n = 0;
    for (size_t i = 0; i < k; i++)
        n += items[i]->n;
    op *ops = cg_calloc(n, sizeof *ops);
    size_t j = 0;
    for (size_t i = 0; i < k; i++)
        for (size_t h = 0; h < items[i]->n; h++, j++) {
            ops[j].key = items[i]->keys[h];
            ops[j].klen = strlen(ops[j].key);
            ops[j].val = items[i]->vals[h];
            ops[j].vlen = items[i]->lens[h];
        }
    cg_status st = set_ops(r, ops, n, cg_now_ns());
    free(ops);
    return st;
}

cg_status cg_remote_open(cg_remote_params params, cg_remote **out, char *err, size_t errlen)
{
    *out = NULL;
    cg_remote_url url;
    cg_status st = cg_remote_parse_url(params.url, &url, err, errlen);
    if (st != CG_OK) return st;
    if (params.timeout_ms < 1 || params.timeout_ms > 600000) {
        cg_seterr(err, errlen, "remote timeout_ms must be 1..600000 (got %d)", params.timeout_ms);
        return CG_E_VALUE;
    }
    if (params.backoff_min_ms < 1 || params.backoff_max_ms < params.backoff_min_ms ||
        params.backoff_max_ms > 3600000) {
        cg_seterr(err, errlen, "remote backoff must satisfy 1 <= min <= max <= 3600000 ms");
        return CG_E_VALUE;
    }
    if (params.conns_per_node < 1 || params.conns_per_node > 64 || params.max_redirects < 0 ||
        params.max_redirects > 16 || params.queue_max_items < 1 || params.queue_max_bytes < 1 ||
        params.value_max_bytes < 1 || params.drain_ms < 0 || params.drain_ms > 600000) {
        cg_seterr(err, errlen,
                  "remote parameters out of range (conns_per_node 1..64, max_redirects 0..16, "
                  "queue bounds and value_max_bytes >= 1, drain_ms 0..600000)");
        return CG_E_VALUE;
    }
    if (params.password &&
        (!*params.password || strlen(params.password) > CG_REMOTE_PASSWORD_MAX)) {
        cg_seterr(err, errlen, "remote password must be 1..%d bytes", CG_REMOTE_PASSWORD_MAX);
        return CG_E_VALUE;
    }
    cg_remote *r = cg_calloc(1, sizeof *r);
    r->p = params;
    r->p.url = NULL;
    r->p.password = NULL;
    r->url = url;
    r->password = params.password ? cg_strdup(params.password) : NULL;
    pthread_mutex_init(&r->nodes_mu, NULL);
    pthread_rwlock_init(&r->map_lock, NULL);
    pthread_mutex_init(&r->refresh_mu, NULL);
    cg_cond_init_monotonic(&r->refresh_cv);
    pthread_mutex_init(&r->qmu, NULL);
    pthread_cond_init(&r->qcv, NULL);
    cg_cond_init_monotonic(&r->qdone);
    pthread_mutex_init(&r->err_mu, NULL);
    pthread_mutex_init(&r->cache_mu, NULL);
    for (size_t i = 0; i < CG_REMOTE_SLOTS; i++)
        r->slots[i] = url.cluster ? -1 : 0;
    r->map_loaded = !url.cluster;
    r->nodes[0] = node_new(url.host, url.port, params.conns_per_node, params.backoff_min_ms);
    r->n_nodes = 1;
    if (pthread_create(&r->writer, NULL, writer_main, r) != 0) {
        cg_seterr(err, errlen, "remote: cannot start the writer thread");
        cg_remote_close(&r);
        return CG_E_INTERNAL;
    }
    r->writer_started = 1;

    st = cg_remote_ping(r);
    if (st == CG_E_AUTH || st == CG_E_VALUE || st == CG_E_BAD_GATEWAY) {
        pthread_mutex_lock(&r->err_mu);
        if (r->last_err[0])
            cg_seterr(err, errlen, "%s", r->last_err);
        else
            cg_seterr(err, errlen,
                      "remote %s:%d: %s (not a Redis server, or a reply of the wrong "
                      "type or size)",
                      url.host, url.port, cg_status_name(st));
        pthread_mutex_unlock(&r->err_mu);
        cg_remote_close(&r);
        return st;
    }
    if (st != CG_OK)
        cg_log(CG_LOG_WARN, "remote: %s:%d not reachable at start (%s); will retry", url.host,
               url.port, cg_status_name(st));
    *out = r;
    return CG_OK;
}

void cg_remote_close(cg_remote **pr)
{
    cg_remote *r = *pr;
    if (!r) return;
    if (r->writer_started) {
        if (cg_remote_flush(r, r->p.drain_ms) != CG_OK)
            cg_log(CG_LOG_WARN, "remote: write-behind queue not drained at close");
        cg_thread_stop(r->writer, &r->qmu, &r->qcv, &r->q_stop);
    }
    for (cg_link *l; (l = cg_list_pop_front(&r->queue));) {
        qitem *it = CG_LIST_ENTRY(l, qitem, link);
        ST_ADD(r, queue_failed, 1);
        qitem_free(&it);
    }
    for (int i = 0; i < r->n_nodes; i++)
        node_free(&r->nodes[i]);
    for (size_t i = 0; i < r->cache_n; i++)
        free(r->cache[i].p);
    pthread_mutex_destroy(&r->cache_mu);
    pthread_mutex_destroy(&r->err_mu);
    pthread_cond_destroy(&r->qdone);
    pthread_cond_destroy(&r->qcv);
    pthread_mutex_destroy(&r->qmu);
    pthread_cond_destroy(&r->refresh_cv);
    pthread_mutex_destroy(&r->refresh_mu);
    pthread_rwlock_destroy(&r->map_lock);
    pthread_mutex_destroy(&r->nodes_mu);
    cg_remote_free_password(r->password);
    free(r);
    *pr = NULL;
}

static cg_status check_batch(size_t n, const char *const *keys)
{
    if (n == 0 || n > BATCH_MAX || !keys) return CG_E_VALUE;
    for (size_t i = 0; i < n; i++)
        if (!keys[i] || !*keys[i]) return CG_E_VALUE;
    return CG_OK;
}

/* One op per key of a batch that check_batch accepted, keys borrowed; the caller frees. */
static op *key_ops(size_t n, const char *const *keys)
{
    op *ops = cg_calloc(n, sizeof *ops);
    for (size_t i = 0; i < n; i++) {
        ops[i].key = keys[i];
        ops[i].klen = strlen(keys[i]);
    }
    return ops;
}

cg_status cg_remote_get(cg_remote *r, size_t n, const char *const *keys, cg_remote_value *out,
                        uint64_t *elapsed_ns)
{
    uint64_t t0 = cg_now_ns();
    cg_status st = check_batch(n, keys);
    op *ops = NULL;
    for (size_t i = 0; out && i < n && i <= BATCH_MAX; i++)
        out[i] = (cg_remote_value){0};
    if (st != CG_OK || !out) {
        st = CG_E_VALUE;
        goto out;
    }
    ops = key_ops(n, keys);
    st = exec_ops(r, OP_GET, ops, n, deadline_after(r, t0));
    if (st == CG_OK) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++) {
            /* The reply's string is malloc'd by hiredis's reader: hand it over as is. */
            out[i].data = ops[i].rep->str;
            out[i].len = ops[i].rep->len;
            out[i].cap_ = ops[i].rep->elements;
            ops[i].rep->str = NULL;
            ops[i].rep->elements = 0;
            ops[i].rep->len = 0;
            bytes += out[i].len;
        }
        ST_ADD(r, hits, 1);
        ST_ADD(r, bytes_read, bytes);
    } else if (st == CG_E_NOT_FOUND) {
        ST_ADD(r, misses, 1);
    }
    ops_free_replies(ops, n);
out:
    free(ops);
    ST_ADD(r, gets, 1);
    count_error(r, st);
    if (elapsed_ns) *elapsed_ns = cg_now_ns() - t0;
    return st;
}

void cg_remote_values_free(cg_remote *r, cg_remote_value *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        if (v[i].cap_ && r)
            buf_put(r, v[i].data, v[i].cap_);
        else
            free(v[i].data);
        v[i] = (cg_remote_value){0};
    }
}

cg_status cg_remote_set(cg_remote *r, size_t n, const char *const *keys, const void *const *vals,
                        const size_t *lens)
{
    uint64_t t0 = cg_now_ns();
    cg_status st = check_batch(n, keys);
    if (st != CG_OK || !vals || !lens) {
        count_error(r, CG_E_VALUE);
        return CG_E_VALUE;
    }
    op *ops = key_ops(n, keys);
    for (size_t i = 0; i < n; i++) {
        ops[i].val = vals[i] ? vals[i] : "";
        ops[i].vlen = vals[i] ? lens[i] : 0;
    }
    st = set_ops(r, ops, n, t0);
    free(ops);
    return st;
}

cg_status cg_remote_del(cg_remote *r, size_t n, const char *const *keys, size_t *n_deleted)
{
    uint64_t t0 = cg_now_ns();
    if (n_deleted) *n_deleted = 0;
    cg_status st = check_batch(n, keys);
    if (st != CG_OK) {
        count_error(r, st);
        return st;
    }
    op *ops = key_ops(n, keys);
    st = exec_ops(r, OP_DEL, ops, n, deadline_after(r, t0));
    if (st == CG_OK) {
        size_t d = 0;
        for (size_t i = 0; i < n; i++)
            d += (size_t)ops[i].rep->integer;
        ST_ADD(r, dels, d);
        if (n_deleted) *n_deleted = d;
    }
    ops_free_replies(ops, n);
    free(ops);
    count_error(r, st);
    return st;
}

cg_status cg_remote_commands(cg_remote *r, size_t n, const cg_remote_cmd *cmds, int timeout_ms,
                             struct redisReply **out)
{
    uint64_t t0 = cg_now_ns();
    for (size_t i = 0; out && i < n; i++)
        out[i] = NULL;
    for (size_t i = 0; i < n; i++) {
        const cg_remote_cmd *c = &cmds[i];
        if (c->argc < 1 || !c->argv || !c->lens || c->key_arg < 0 || c->key_arg >= c->argc ||
            !c->lens[c->key_arg]) {
            count_error(r, CG_E_VALUE);
            return CG_E_VALUE;
        }
    }
    if (!n) return CG_OK;
    op *ops = cg_calloc(n, sizeof *ops);
    for (size_t i = 0; i < n; i++) {
        const cg_remote_cmd *c = &cmds[i];
        ops[i] = (op){.key = c->argv[c->key_arg],
                      .klen = c->lens[c->key_arg],
                      .argc = c->argc,
                      .argv = c->argv,
                      .argvlen = c->lens};
    }
    uint64_t deadline =
        timeout_ms > 0 ? t0 + (uint64_t)timeout_ms * 1000000ull : deadline_after(r, t0);
    cg_status st = exec_ops(r, OP_CMD, ops, n, deadline);
    for (size_t i = 0; st == CG_OK && out && i < n; i++) {
        out[i] = ops[i].rep;
        ops[i].rep = NULL;
    }
    ops_free_replies(ops, n);
    free(ops);
    count_error(r, st);
    return st;
}

cg_status cg_remote_command(cg_remote *r, int argc, const char *const *argv, const size_t *lens,
                            int key_arg, int timeout_ms, struct redisReply **out)
{
    cg_remote_cmd c = {.argc = argc, .argv = argv, .lens = lens, .key_arg = key_arg};
    return cg_remote_commands(r, 1, &c, timeout_ms, out);
}

void cg_remote_reply_free(struct redisReply **rep)
{
    if (*rep) freeReplyObject(*rep);
    *rep = NULL;
}

cg_status cg_remote_ping(cg_remote *r)
{
    uint64_t t0 = cg_now_ns(), deadline = deadline_after(r, t0);
    cg_status st = CG_OK;
    int targets[CG_REMOTE_MAX_NODES];
    size_t nt = 0;
    if (r->url.cluster) {
        if (!map_is_loaded(r) || __atomic_load_n(&r->map_stale, __ATOMIC_RELAXED))
            st = map_refresh(r, deadline, 0);
        if (!map_is_loaded(r)) {
            if (st == CG_OK) st = CG_E_UNAVAILABLE;
            count_error(r, st);
            return st;
        }
        char seen[CG_REMOTE_MAX_NODES] = {0};
        pthread_rwlock_rdlock(&r->map_lock);
        for (size_t s = 0; s < CG_REMOTE_SLOTS; s++) {
            int ni = r->slots[s];
            if (ni >= 0 && !seen[ni]) {
                seen[ni] = 1;
                targets[nt++] = ni;
            }
        }
        pthread_rwlock_unlock(&r->map_lock);
        st = CG_OK;
    } else {
        targets[nt++] = 0;
    }
    if (nt == 0) {
        count_error(r, CG_E_UNAVAILABLE);
        return CG_E_UNAVAILABLE;
    }
    op *ops = cg_calloc(nt, sizeof *ops);
    for (size_t i = 0; i < nt; i++) {
        ops[i].key = "";
        ops[i].node = targets[i];
        ops[i].pinned = 1;
    }
    st = exec_ops(r, OP_PING, ops, nt, deadline);
    ops_free_replies(ops, nt);
    free(ops);
    count_error(r, st);
    return st;
}

cg_status cg_remote_put_async(cg_remote *r, size_t n, const char *const *keys,
                              const void *const *vals, const size_t *lens)
{
    return cg_remote_put_async_tag(r, n, keys, vals, lens, 0);
}

cg_status cg_remote_put_async_tag(cg_remote *r, size_t n, const char *const *keys,
                                  const void *const *vals, const size_t *lens, uint64_t tag)
{
    if (check_batch(n, keys) != CG_OK || !vals || !lens) {
        ST_ADD(r, queue_drops, 1);
        return CG_E_VALUE;
    }
    size_t bytes = 0, klen_sum = 0;
    for (size_t i = 0; i < n; i++) {
        klen_sum += strlen(keys[i]) + 1;
        bytes += lens[i];
    }
    bytes += klen_sum;
    if (bytes > r->p.queue_max_bytes) {
        ST_ADD(r, queue_drops, 1);
        return CG_E_VALUE;
    }
    pthread_mutex_lock(&r->qmu);
    if (r->q_stop || r->q_items + 1 > r->p.queue_max_items ||
        r->q_bytes + bytes > r->p.queue_max_bytes) {
        pthread_mutex_unlock(&r->qmu);
        ST_ADD(r, queue_drops, 1);
        return CG_E_FULL;
    }
    r->q_items++;
    r->q_bytes += bytes;
    pthread_mutex_unlock(&r->qmu);

    /* The copy is made outside the lock: the slot is reserved, the queue bound holds. */
    size_t arrays = n * (2 * sizeof(char *) + sizeof(size_t));
    size_t head = (sizeof(qitem) + 15) & ~(size_t)15;
    char *blk = cg_malloc(head + arrays + klen_sum + (bytes - klen_sum) + n);
    qitem *it = (qitem *)blk;
    memset(it, 0, sizeof *it);
    it->n = n;
    it->tag = tag;
    it->bytes = bytes;
    it->keys = (char **)(blk + head);
    it->vals = it->keys + n;
    it->lens = (size_t *)(it->vals + n);
    char *p = (char *)(it->lens + n);
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]) + 1;
        memcpy(p, keys[i], kl);
        it->keys[i] = p;
        p += kl;
    }
    for (size_t i = 0; i < n; i++) {
        if (lens[i]) memcpy(p, vals[i], lens[i]);
        it->vals[i] = p;
        it->lens[i] = lens[i];
        p += lens[i];
    }

    pthread_mutex_lock(&r->qmu);
    it->seq = ++r->q_seq;
    cg_list_push_back(&r->queue, &it->link);
    pthread_cond_signal(&r->qcv);
    pthread_mutex_unlock(&r->qmu);
    ST_ADD(r, queue_puts, 1);
    return CG_OK;
}

cg_status cg_remote_flush(cg_remote *r, int timeout_ms)
{
    uint64_t deadline = cg_now_ns() + (uint64_t)CG_MAX(timeout_ms, 0) * 1000000ull;
    cg_status st = CG_OK;
    pthread_mutex_lock(&r->qmu);
    uint64_t target = r->q_seq;
    while (r->q_done < target && !r->q_stop) {
        if (cond_wait_until(&r->qdone, &r->qmu, deadline) == ETIMEDOUT) {
            st = r->q_done < target ? CG_E_TIMEOUT : CG_OK;
            break;
        }
    }
    pthread_mutex_unlock(&r->qmu);
    return st;
}

void cg_remote_stats_get(cg_remote *r, cg_remote_stats *out)
{
#define CP(f) out->f = ST_GET(r, f)
    CP(gets);
    CP(hits);
    CP(misses);
    CP(bytes_read);
    CP(sets);
    CP(bytes_written);
    CP(dels);
    CP(errors);
    CP(errors_unavailable);
    CP(errors_timeout);
    CP(errors_protocol);
    CP(errors_other);
    CP(fast_fails);
    CP(queue_puts);
    CP(queue_drops);
    CP(queue_failed);
    CP(redirects_moved);
    CP(redirects_ask);
    CP(connects);
    CP(reconnects);
    CP(connect_failures);
    CP(map_refreshes);
#undef CP
    pthread_mutex_lock(&r->qmu);
    out->queue_depth = r->q_items;
    out->queue_bytes = r->q_bytes;
    out->queue_writing = r->q_writing;
    pthread_mutex_unlock(&r->qmu);
    out->nodes = (uint64_t)nodes_count(r);
}
