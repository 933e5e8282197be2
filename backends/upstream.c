/* The upstream client: one curl multi thread drives every upstream transfer, to workers and
 * inference backends alike.
 * Why this holds 1,000 streams is explained in backends/upstream.h. */
#include "backends/upstream.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <curl/curl.h>

#define EASY_SPARE 256
#include "base/base.h"
#include "base/list.h"

struct cg_upstream_xfer {
    cg_upstream *c;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    cg_upstream_handlers h;
    void *arg;
    char errbuf[CURL_ERROR_SIZE];

    /* Guarded by c->mu: references and requests from other threads. */
    unsigned refs;
    int done; /* on_done has been (or is being) called: requests are no-ops */
    int want_resume;
    int want_cancel;
    cg_status abort_st; /* CG_OK: none */
    char abort_detail[160];
    int queued; /* in c->attn */
    cg_upstream_xfer *next_attn;
    cg_link pending_link; /* c->pending */

    /* Multi thread only. */
    int paused;
    int head_done;
    int cb_abort;     /* a callback returned CG_UPSTREAM_ABORT */
    uint64_t idle_ns; /* longest silence allowed */
    uint64_t last_ns; /* last byte from the backend (or start, or resume) */
    cg_link link;     /* c->active */
};

struct cg_upstream {
    char *base;
    char *auth;        /* "Authorization: Bearer <api_key>", or NULL */
    char *worker_auth; /* the same with worker_api_key */
    cg_upstream_params p;
    CURLM *multi;
    int epfd;          /* the multi thread's epoll set: upstream sockets + wake_fd */
    int wake_fd;       /* eventfd: new transfers or requests for the multi thread */
    uint64_t timer_ns; /* curl's next timeout (monotonic ns); 0 = none */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a transfer ended (for drain) */
    cg_list pending;        /* submitted, not yet added to multi */
    cg_upstream_xfer *attn; /* resume/cancel/abort requests */
    size_t in_flight;
    int stopping;
    int joined;     /* cg_upstream_shutdown has run (or is running) */
    cg_list active; /* multi thread only */
    /* Easy handles of finished transfers, reset and kept for the next ones: a new handle is
     * a few KiB to allocate and clear, and then to free, on every request. Under mu. */
    CURL *spare[EASY_SPARE];
    size_t n_spare;
    /* The multi thread sleeps in epoll_wait: only then does a submitter write wake_fd (a
     * busy loop looks at the queue anyway). */
    int sleeping;
    /* What each upstream socket is registered for in epfd (multi thread only), so a reused
     * keep-alive connection costs no epoll_ctl: 0 = not registered, else the epoll events |
     * REG_IDLE once curl no longer watches it (left registered for reading until it reports
     * an event: a closed connection then leaves for good). */
    uint32_t *reg;
    size_t n_reg;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

/* A handle out of the spares, or a new one; NULL when curl cannot make one. */
static CURL *easy_get(cg_upstream *c)
{
    CURL *e = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->n_spare) e = c->spare[--c->n_spare];
    pthread_mutex_unlock(&c->mu);
    return e ? e : curl_easy_init();
}

/* Keeps a handle no longer in the multi for the next transfer (reset), or frees it. */
static void easy_put(cg_upstream *c, CURL *e)
{
    if (!e) return;
    curl_easy_reset(e);
    pthread_mutex_lock(&c->mu);
    int kept = c->n_spare < EASY_SPARE && !c->stopping;
    if (kept) c->spare[c->n_spare++] = e;
    pthread_mutex_unlock(&c->mu);
    if (!kept) curl_easy_cleanup(e);
}
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

cg_upstream_params cg_upstream_default_params(void)
{
    cg_upstream_params p;
    memset(&p, 0, sizeof p);
    p.connect_timeout_ms = 3000;
    p.idle_timeout_ms = 300000;
    p.max_idle_conns = 1024;
    p.dns_cache_s = 2;
    return p;
}

const char *cg_upstream_base_url(const cg_upstream *c)
{
    return c->base;
}

/* "http://h:1/v1/" -> "http://h:1": paths are given from "/v1/" on. */
char *cg_upstream_base_normalise(const char *url)
{
    char *b = cg_strdup(url);
    size_t n = strlen(b);
    while (n && b[n - 1] == '/')
        b[--n] = '\0';
    if (n >= 3 && !strcmp(b + n - 3, "/v1")) b[n -= 3] = '\0';
    while (n && b[n - 1] == '/')
        b[--n] = '\0';
    return b;
}

/* Wakes the multi thread (any thread; async-signal-safe write). */
static void wake(cg_upstream *c)
{
    if (!__atomic_load_n(&c->sleeping, __ATOMIC_SEQ_CST)) return; /* it looks before it sleeps */
    uint64_t one = 1;
    ssize_t n = write(c->wake_fd, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, a wakeup is pending anyway */
}

/* ---------------------------------------------------------------- references */

static void xfer_free(cg_upstream_xfer *x)
{
    easy_put(x->c, x->easy);
    curl_slist_free_all(x->headers);
    free(x->body);
    free(x);
}

void cg_upstream_xfer_release(cg_upstream_xfer **xp)
{
    cg_upstream_xfer *x = *xp;
    if (!x) return;
    *xp = NULL;
    cg_upstream *c = x->c;
    pthread_mutex_lock(&c->mu);
    unsigned left = --x->refs;
    pthread_mutex_unlock(&c->mu);
    if (!left) xfer_free(x);
}

/* Queues a request for the multi thread. */
static void request(cg_upstream_xfer *x, int resume, int cancel, cg_status st, const char *detail)
{
    cg_upstream *c = x->c;
    pthread_mutex_lock(&c->mu);
    if (x->done) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    x->want_resume |= resume;
    x->want_cancel |= cancel;
    if (st != CG_OK && x->abort_st == CG_OK) {
        x->abort_st = st;
        snprintf(x->abort_detail, sizeof x->abort_detail, "%s", detail ? detail : "aborted");
    }
    if (!x->queued) {
        x->queued = 1;
        x->next_attn = c->attn;
        c->attn = x;
    }
    pthread_mutex_unlock(&c->mu);
    wake(c);
}

void cg_upstream_xfer_resume(cg_upstream_xfer *x)
{
    request(x, 1, 0, CG_OK, NULL);
}
void cg_upstream_xfer_cancel(cg_upstream_xfer *x)
{
    request(x, 0, 1, CG_OK, NULL);
}
void cg_upstream_xfer_abort(cg_upstream_xfer *x, cg_status st, const char *detail)
{
    request(x, 0, 0, st == CG_OK ? CG_E_BAD_GATEWAY : st, detail);
}

/* ---------------------------------------------------------------- curl callbacks */

/* Reports the head once: status and content type are known when the first body byte (or the
 * end) arrives. Returns 0, or -1 when the consumer aborts. */
static int deliver_head(cg_upstream_xfer *x)
{
    if (x->head_done) return 0;
    x->head_done = 1;
    long status = 0;
    char *ct = NULL;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(x->easy, CURLINFO_CONTENT_TYPE, &ct);
    if (x->h.on_head && x->h.on_head(x->arg, status, ct) == CG_UPSTREAM_ABORT) {
        x->cb_abort = 1;
        return -1;
    }
    return 0;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud)
{
    cg_upstream_xfer *x = ud;
    size_t n = size * nmemb;
    x->last_ns = cg_now_ns();
    if (deliver_head(x) != 0) return 0; /* != n: curl ends the transfer (CURLE_WRITE_ERROR) */
    int r = x->h.on_body ? x->h.on_body(x->arg, data, n) : CG_UPSTREAM_CONTINUE;
    if (r == CG_UPSTREAM_PAUSE) {
        x->paused = 1;
        return CURL_WRITEFUNC_PAUSE;
    }
    if (r == CG_UPSTREAM_ABORT) {
        x->cb_abort = 1;
        return 0;
    }
    return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    cg_upstream_xfer *x = ud;
    x->last_ns = cg_now_ns();
    return size * nmemb;
}

/* ---------------------------------------------------------------- multi thread */

/* Ends x: removes it from curl and the lists, calls on_done, drops the client's reference. */
static void finish(cg_upstream *c, cg_upstream_xfer *x, cg_status st, const char *detail)
{
    long status = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(c->multi, x->easy);
    cg_list_remove(&c->active, &x->link);
    pthread_mutex_lock(&c->mu);
    x->done = 1;
    if (x->queued) { /* drop a request that will never be served */
        for (cg_upstream_xfer **pp = &c->attn; *pp; pp = &(*pp)->next_attn)
            if (*pp == x) {
                *pp = x->next_attn;
                break;
            }
        x->queued = 0;
    }
    pthread_mutex_unlock(&c->mu);
    x->h.on_done(x->arg, st, status, detail);
    pthread_mutex_lock(&c->mu);
    c->in_flight--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    cg_upstream_xfer_release(&x);
}

static void complete_transfer(cg_upstream *c, cg_upstream_xfer *x, CURLcode rc)
{
    char detail[CURL_ERROR_SIZE + 64];
    cg_status st;
    if (rc == CURLE_OK) {
        deliver_head(x); /* an empty body still has a head */
        st = CG_OK;
        snprintf(detail, sizeof detail, "ok");
    } else if (x->cb_abort) {
        st = CG_E_BAD_GATEWAY;
        snprintf(detail, sizeof detail, "aborted by the consumer");
    } else {
        switch (rc) {
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
            st = CG_E_UNAVAILABLE;
            break;
        case CURLE_OPERATION_TIMEDOUT:
            st = CG_E_TIMEOUT;
            break;
        default:
            st = CG_E_BAD_GATEWAY;
            break;
        }
        snprintf(detail, sizeof detail, "%s", x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    }
    finish(c, x, st, detail);
}

/* Serves resume/cancel/abort requests taken from c->attn. */
static void serve_requests(cg_upstream *c, cg_upstream_xfer *list)
{
    while (list) {
        cg_upstream_xfer *x = list;
        list = x->next_attn;
        pthread_mutex_lock(&c->mu);
        int resume = x->want_resume, cancel = x->want_cancel;
        cg_status ast = x->abort_st;
        char detail[sizeof x->abort_detail];
        memcpy(detail, x->abort_detail, sizeof detail);
        x->want_resume = x->want_cancel = 0;
        x->queued = 0;
        pthread_mutex_unlock(&c->mu);
        if (cancel) {
            finish(c, x, CG_E_UNAVAILABLE, "cancelled");
        } else if (ast != CG_OK) {
            finish(c, x, ast, detail);
        } else if (resume && x->paused) {
            x->paused = 0;
            x->last_ns = cg_now_ns();
            curl_easy_pause(x->easy, CURLPAUSE_CONT); /* may deliver the held bytes now */
        }
    }
}

/* Idle timeouts, and transfers whose consumer no longer wants them (handlers.gone). */
static void check_idle(cg_upstream *c, uint64_t now)
{
    for (cg_link *k = c->active.head, *next; k; k = next) {
        next = k->next;
        cg_upstream_xfer *x = CG_LIST_ENTRY(k, cg_upstream_xfer, link);
        if (x->h.gone && x->h.gone(x->arg)) {
            finish(c, x, CG_E_UNAVAILABLE, "cancelled");
            continue;
        }
        if (x->paused || now - x->last_ns <= x->idle_ns) continue;
        char detail[96];
        snprintf(detail, sizeof detail, "upstream sent nothing for %llu ms",
                 (unsigned long long)(x->idle_ns / 1000000ull));
        finish(c, x, CG_E_TIMEOUT, detail);
    }
}

/* curl tells which sockets to watch for what; they go into the thread's epoll set, so one
 * wakeup costs O(sockets ready), never O(transfers). */
#define REG_IDLE (1u << 31)

/* Registers fd for events (0 = nothing) in epfd, with as few epoll_ctl calls as possible. */
static void reg_set(cg_upstream *c, int fd, uint32_t events)
{
    if (fd < 0) return;
    if ((size_t)fd >= c->n_reg) {
        size_t n = CG_MAX((size_t)fd + 1, c->n_reg * 2);
        c->reg = cg_realloc(c->reg, n * sizeof *c->reg);
        memset(c->reg + c->n_reg, 0, (n - c->n_reg) * sizeof *c->reg);
        c->n_reg = n;
    }
    uint32_t was = c->reg[fd];
    struct epoll_event ev = {.events = events, .data.fd = fd};
    if (!events) {
        if (was) epoll_ctl(c->epfd, EPOLL_CTL_DEL, fd, NULL); /* may be gone with the fd */
        c->reg[fd] = 0;
        return;
    }
    if ((was & ~REG_IDLE) != events || !was) {
        /* an fd closed since (and maybe reused) is no longer in epfd: MOD fails, then ADD */
        if (!was || epoll_ctl(c->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)
            if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
                epoll_ctl(c->epfd, EPOLL_CTL_MOD, fd, &ev);
    }
    c->reg[fd] = events;
}

/* A new upstream socket (multi thread): whatever the table says of its number is about a
 * socket closed since, which left epfd with its close. */
static int on_sockopt(void *clientp, curl_socket_t fd, curlsocktype purpose)
{
    cg_upstream *c = clientp;
    if (fd >= 0 && (size_t)fd < c->n_reg) c->reg[fd] = 0;
    return CURL_SOCKOPT_OK;
}

static int on_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp)
{
    cg_upstream *c = userp;
    if (what == CURL_POLL_REMOVE) {
        /* A connection going back to curl's cache stays registered for reading, so using it
         * again costs nothing; one that was watched for writing is set to reading. */
        if (fd >= 0 && (size_t)fd < c->n_reg && c->reg[fd]) {
            if (c->reg[fd] & EPOLLOUT) reg_set(c, fd, EPOLLIN);
            c->reg[fd] |= REG_IDLE;
        }
        return 0;
    }
    uint32_t events = 0;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= EPOLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= EPOLLOUT;
    reg_set(c, fd, events);
    return 0;
}

/* curl's single timer: -1 deletes it, 0 means "call me at once". */
static int on_timer(CURLM *m, long timeout_ms, void *userp)
{
    cg_upstream *c = userp;
    c->timer_ns = timeout_ms < 0 ? 0 : cg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    if (timeout_ms == 0) c->timer_ns = 1; /* in the past: due now */
    return 0;
}

static void read_done(cg_upstream *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        cg_upstream_xfer *x = NULL;
        CURLcode rc = m->data.result;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        complete_transfer(c, x, rc);
    }
}

static void *multi_main(void *arg)
{
    cg_upstream *c = arg;
    uint64_t last_idle_check = cg_now_ns();
    struct epoll_event evs[256];
    for (;;) {
        /* 1. New transfers and requests from other threads. */
        pthread_mutex_lock(&c->mu);
        cg_list pend = c->pending;
        cg_upstream_xfer *attn = c->attn;
        c->pending = (cg_list){0};
        c->attn = NULL;
        int stopping = c->stopping;
        pthread_mutex_unlock(&c->mu);
        uint64_t now = cg_now_ns();
        for (cg_link *k; (k = cg_list_pop_front(&pend));) {
            cg_upstream_xfer *x = CG_LIST_ENTRY(k, cg_upstream_xfer, pending_link);
            x->last_ns = now;
            cg_list_push_back(&c->active, &x->link);
            curl_multi_add_handle(c->multi, x->easy); /* sets a 0 ms timer: starts below */
        }
        serve_requests(c, attn);
        if (stopping) {
            while (!cg_list_empty(&c->active))
                finish(c, CG_LIST_ENTRY(c->active.head, cg_upstream_xfer, link), CG_E_UNAVAILABLE,
                       "gateway is stopping");
            break;
        }

        /* 2. curl's timer, then finished transfers. */
        int running;
        now = cg_now_ns();
        if (c->timer_ns && now >= c->timer_ns) {
            c->timer_ns = 0;
            curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        }
        read_done(c);
        now = cg_now_ns();
        if (now - last_idle_check >= 100000000ull) { /* idle timeouts: 100 ms resolution */
            check_idle(c, now);
            last_idle_check = now;
        }

        /* 3. Wait for sockets, the timer or a wakeup. */
        long wait_ms = cg_list_empty(&c->active) ? 1000 : 100;
        if (c->timer_ns) {
            now = cg_now_ns();
            long t = c->timer_ns <= now ? 0 : (long)((c->timer_ns - now + 999999) / 1000000);
            if (t < wait_ms) wait_ms = t;
        }
        /* Sleeping from now on, unless something was queued meanwhile (wake's counterpart:
         * the queue is looked at under mu after the flag is set). */
        __atomic_store_n(&c->sleeping, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&c->mu);
        if (!cg_list_empty(&c->pending) || c->attn || c->stopping) wait_ms = 0;
        pthread_mutex_unlock(&c->mu);
        int n = epoll_wait(c->epfd, evs, (int)CG_ARRAY_LEN(evs), (int)wait_ms);
        __atomic_store_n(&c->sleeping, 0, __ATOMIC_SEQ_CST);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == c->wake_fd) {
                uint64_t v;
                ssize_t r = read(c->wake_fd, &v, sizeof v);
                (void)r;
                continue;
            }
            if (fd >= 0 && (size_t)fd < c->n_reg && (c->reg[fd] & REG_IDLE)) {
                /* an idle cached connection has something to say: the server closed it, or
                 * sent what it should not have; curl will find out when it reuses it */
                reg_set(c, fd, 0);
                continue;
            }
            int flags = 0;
            if (evs[i].events & EPOLLIN) flags |= CURL_CSELECT_IN;
            if (evs[i].events & EPOLLOUT) flags |= CURL_CSELECT_OUT;
            if (evs[i].events & (EPOLLERR | EPOLLHUP)) flags |= CURL_CSELECT_ERR | CURL_CSELECT_IN;
            curl_multi_socket_action(c->multi, fd, flags, &running);
        }
        read_done(c);
    }
    return NULL;
}

/* "Authorization: Bearer KEY", or NULL when key is unset or empty. */
static char *bearer_header(const char *key)
{
    if (!key || !*key) return NULL;
    size_t n = strlen(key) + 32;
    char *h = cg_malloc(n);
    snprintf(h, n, "Authorization: Bearer %s", key);
    return h;
}

/* Frees a client whose thread never ran or has been joined; also a half-started one (a
 * descriptor that failed to open is -1, and no handle has been lent yet). */
static void client_free(cg_upstream *c)
{
    for (size_t i = 0; i < c->n_spare; i++)
        curl_easy_cleanup(c->spare[i]);
    curl_multi_cleanup(c->multi);
    free(c->reg);
    if (c->epfd >= 0) close(c->epfd);
    if (c->wake_fd >= 0) close(c->wake_fd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->auth);
    free(c->worker_auth);
    free(c->base);
    free(c);
}

/* ---------------------------------------------------------------- public */

cg_status cg_upstream_open(const cg_upstream_params *p, cg_upstream **out)
{
    *out = NULL;
    if (p->base_url && strncmp(p->base_url, "http://", 7) && strncmp(p->base_url, "https://", 8)) {
        cg_log(CG_LOG_ERROR, "backend URL must start with http:// or https://");
        return CG_E_VALUE;
    }
    pthread_once(&curl_once, curl_init_once);
    cg_upstream *c = cg_calloc(1, sizeof *c);
    c->p = *p;
    c->base = p->base_url ? cg_upstream_base_normalise(p->base_url) : NULL;
    c->p.base_url = c->base;
    c->p.api_key = NULL;
    c->p.worker_api_key = NULL;
    c->auth = bearer_header(p->api_key);
    c->worker_auth = bearer_header(p->worker_api_key);
    if (c->p.connect_timeout_ms <= 0) c->p.connect_timeout_ms = 3000;
    if (c->p.idle_timeout_ms <= 0) c->p.idle_timeout_ms = 300000;
    if (c->p.dns_cache_s < 0) c->p.dns_cache_s = 2;
    pthread_mutex_init(&c->mu, NULL);
    cg_cond_init_monotonic(&c->cv);
    c->multi = curl_multi_init();
    curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS,
                      c->p.max_idle_conns > 0 ? c->p.max_idle_conns : 1024L);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {0};
    ev.events = EPOLLIN;
    ev.data.fd = c->wake_fd;
    if (c->epfd < 0 || c->wake_fd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->wake_fd, &ev) != 0 ||
        pthread_create(&c->thread, NULL, multi_main, c) != 0) {
        cg_log(CG_LOG_ERROR, "cannot start the backend client: %s", strerror(errno));
        client_free(c);
        return CG_E_INTERNAL;
    }
    *out = c;
    return CG_OK;
}

size_t cg_upstream_in_flight(cg_upstream *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->in_flight;
    pthread_mutex_unlock(&c->mu);
    return n;
}

size_t cg_upstream_drain(cg_upstream *c, uint64_t timeout_ms)
{
    struct timespec ts = cg_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&c->mu);
    while (c->in_flight && pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0) {
    }
    size_t n = c->in_flight;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void cg_upstream_shutdown(cg_upstream *c)
{
    pthread_mutex_lock(&c->mu);
    int joined = c->joined;
    c->stopping = 1;
    c->joined = 1;
    pthread_mutex_unlock(&c->mu);
    if (joined) return;
    wake(c);
    pthread_join(c->thread, NULL);
}

void cg_upstream_close(cg_upstream **cp)
{
    cg_upstream *c = *cp;
    if (!c) return;
    *cp = NULL;
    cg_upstream_shutdown(c);
    client_free(c);
}

static struct curl_slist *base_headers(cg_upstream *c, const char *request_id, int json_body,
                                       int to_worker)
{
    struct curl_slist *h = NULL;
    if (json_body) h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: application/json, text/event-stream");
    h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip for large bodies */
    const char *auth = to_worker ? c->worker_auth : c->auth;
    if (auth) h = curl_slist_append(h, auth);
    if (request_id && *request_id) {
        char rid[128];
        snprintf(rid, sizeof rid, "X-Request-Id: %s", request_id);
        h = curl_slist_append(h, rid);
    }
    return h;
}

static void set_common(cg_upstream *c, CURL *e, const char *base, const char *path, char *url,
                       size_t url_len)
{
    snprintf(url, url_len, "%s%s", base, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, c->p.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    /* Per handle, and reset with it: names in the multi's shared cache older than this are
     * looked up again, so a name that moved is followed within a health interval. */
    curl_easy_setopt(e, CURLOPT_DNS_CACHE_TIMEOUT, c->p.dns_cache_s);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
}

cg_status cg_upstream_submit(cg_upstream *c, const char *method, const char *path, char *body,
                             size_t body_len, const char *request_id, const cg_upstream_handlers *h,
                             void *arg, cg_upstream_xfer **ref)
{
    cg_upstream_req r = {.method = method,
                         .path = path,
                         .body = body,
                         .body_len = body_len,
                         .request_id = request_id};
    return cg_upstream_submit_req(c, &r, h, arg, ref);
}

cg_status cg_upstream_submit_req(cg_upstream *c, const cg_upstream_req *r,
                                 const cg_upstream_handlers *h, void *arg, cg_upstream_xfer **ref)
{
    if (ref) *ref = NULL;
    const char *method = r->method;
    char *body = r->body;
    size_t body_len = r->body_len;
    char *base = r->base ? cg_upstream_base_normalise(r->base) : NULL;
    if (!base && !c->base) {
        free(body);
        return CG_E_VALUE;
    }
    cg_upstream_xfer *x = cg_calloc(1, sizeof *x);
    x->c = c;
    x->h = *h;
    x->arg = arg;
    x->body = body;
    x->refs = ref ? 2 : 1;
    x->idle_ns =
        (uint64_t)(r->idle_timeout_ms > 0 ? r->idle_timeout_ms : c->p.idle_timeout_ms) * 1000000ull;
    x->easy = easy_get(c);
    if (!x->easy) {
        free(base);
        xfer_free(x);
        return CG_E_INTERNAL;
    }
    char url[2048];
    set_common(c, x->easy, base ? base : c->base, r->path, url, sizeof url);
    free(base);
    x->headers = base_headers(c, r->request_id, body != NULL, r->to_worker);
    curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(x->easy, CURLOPT_SOCKOPTFUNCTION, on_sockopt);
    curl_easy_setopt(x->easy, CURLOPT_SOCKOPTDATA, c);
    curl_easy_setopt(x->easy, CURLOPT_PRIVATE, (char *)x);
    curl_easy_setopt(x->easy, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(x->easy, CURLOPT_HEADERDATA, x);
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(x->easy, CURLOPT_POST, 1L);
        curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(x->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
    } else if (!strcmp(method, "GET")) {
        curl_easy_setopt(x->easy, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(x->easy, CURLOPT_CUSTOMREQUEST, method);
    }
    /* Published before the multi thread can see x: its callbacks may use *ref at once. */
    if (ref) *ref = x;
    pthread_mutex_lock(&c->mu);
    if (c->stopping) {
        pthread_mutex_unlock(&c->mu);
        if (ref) *ref = NULL;
        xfer_free(x);
        return CG_E_UNAVAILABLE;
    }
    c->in_flight++;
    cg_list_push_back(&c->pending, &x->pending_link);
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return CG_OK;
}

static size_t keep_probe_body(char *data, size_t size, size_t nmemb, void *ud)
{
    cg_buf *b = ud;
    if (b && cg_buf_append(b, data, size * nmemb) != CG_OK) return 0; /* over its bound */
    return size * nmemb;
}

cg_status cg_upstream_probe(cg_upstream *c, const char *path, long timeout_ms, cg_buf *body,
                            long *http_status, char *err, size_t errlen)
{
    *http_status = 0;
    CURL *e = curl_easy_init();
    if (!e) {
        snprintf(err, errlen, "curl_easy_init failed");
        return CG_E_INTERNAL;
    }
    char url[2048], ebuf[CURL_ERROR_SIZE] = "";
    if (!c->base) {
        snprintf(err, errlen, "no backend URL");
        curl_easy_cleanup(e);
        return CG_E_UNAVAILABLE;
    }
    set_common(c, e, c->base, path, url, sizeof url);
    struct curl_slist *h = base_headers(c, NULL, 0, 0);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, CG_MIN(timeout_ms, c->p.connect_timeout_ms));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, keep_probe_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, ebuf);
    CURLcode rc = curl_easy_perform(e);
    cg_status st = CG_OK;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, http_status); /* 0 without a head */
    if (rc == CURLE_OK) {
        if (*http_status >= 500) {
            snprintf(err, errlen, "backend answered HTTP %ld", *http_status);
            st = CG_E_UNAVAILABLE;
        } else {
            snprintf(err, errlen, "ok");
        }
    } else {
        st = rc == CURLE_OPERATION_TIMEDOUT                                    ? CG_E_TIMEOUT
             : rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ? CG_E_UNAVAILABLE
                                                                               : CG_E_BAD_GATEWAY;
        snprintf(err, errlen, "%s", ebuf[0] ? ebuf : curl_easy_strerror(rc));
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return st;
}
