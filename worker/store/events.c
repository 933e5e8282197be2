/* The worker's chunk event publisher: a bounded queue and one thread that appends each event
 * to the Redis Stream (worker/store/events.h). */
#include "worker/store/events.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/remote.h"

/* Pause before an event Redis did not take is sent again. */
#define RETRY_MS 100
/* Events sent in one pipelined round trip at most. */
#define PUBLISH_BATCH 64
/* XADD key MAXLEN ~ N *, then the event's field/value pairs. */
#define XADD_HEAD 6

typedef struct item {
    cg_chunkevent_op op;
    cg_key key;
    cg_tier tier;
    uint32_t tokens;
    uint64_t seq, ts_ms;
    int resync;
} item;

/* One event's XADD as sent: the event and the text its arguments point into. */
typedef struct xadd {
    cg_chunkevent ev;
    cg_chunkevent_wire w;
    const char *argv[XADD_HEAD + 2 * CG_CHUNKEVENT_MAX_FIELDS];
    size_t lens[XADD_HEAD + 2 * CG_CHUNKEVENT_MAX_FIELDS];
} xadd;

struct cg_events {
    cg_events_params p;
    cg_remote *r;
    char *stream;
    size_t stream_len;
    char maxlen[24];
    char epoch[CG_CHUNKEVENT_NAME_MAX + 1];
    char worker[CG_CHUNKEVENT_NAME_MAX + 1];
    pthread_mutex_t load_mu; /* held around a load call: cg_events_unload waits for it */
    cg_events_load_fn load;  /* load_mu */
    void *load_ud;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* events or stop for the publisher */
    item *q;           /* ring of p.queue_max */
    size_t head, n;
    uint64_t seq;  /* mu: last sequence number given */
    uint64_t sent; /* mu: events Redis took (in seq order) */
    int lost;      /* mu: an event was dropped since the last one queued */
    int stop;
    pthread_t thread;
    int started;
    item batch[PUBLISH_BATCH]; /* the publisher's copy of the events it sends */
    xadd xadds[PUBLISH_BATCH]; /* publisher thread only */
    cg_remote_cmd cmds[PUBLISH_BATCH];

    uint64_t n_queued, n_published, n_dropped, n_failed; /* atomics */
};

cg_events_params cg_events_default_params(void)
{
    return (cg_events_params){
        .stream = CG_EVENTS_DEFAULT_STREAM, .maxlen = 100000, .queue_max = 4096, .timeout_ms = 500};
}

cg_status cg_events_open(cg_events_params p, cg_events **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!p.url || !p.epoch || !p.epoch[0] || strlen(p.epoch) > CG_CHUNKEVENT_NAME_MAX ||
        !p.queue_max || !p.maxlen) {
        snprintf(err, errlen, "events: a URL, an epoch, a queue and a stream length are needed");
        return CG_E_VALUE;
    }
    if (!p.stream || !p.stream[0]) p.stream = CG_EVENTS_DEFAULT_STREAM;
    cg_remote_params rp = cg_remote_default_params();
    rp.url = p.url;
    rp.password = p.password;
    rp.timeout_ms = p.timeout_ms > 0 ? p.timeout_ms : 500;
    rp.conns_per_node = 1; /* one publisher */
    rp.queue_max_items = 1;
    rp.backoff_max_ms = 1000; /* an outage's events wait in the queue: reconnect soon */
    cg_remote *r = NULL;
    cg_status st = cg_remote_open(rp, &r, err, errlen);
    if (st != CG_OK) return st;
    cg_events *e = cg_calloc(1, sizeof *e);
    e->p = p;
    e->r = r;
    e->stream = cg_strdup(p.stream);
    e->stream_len = strlen(p.stream);
    e->p.stream = e->stream;
    e->p.url = e->p.password = e->p.epoch = NULL; /* borrowed for open only */
    snprintf(e->maxlen, sizeof e->maxlen, "%zu", p.maxlen);
    snprintf(e->epoch, sizeof e->epoch, "%s", p.epoch);
    e->q = cg_calloc(p.queue_max, sizeof *e->q);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->load_mu, NULL);
    cg_cond_init_monotonic(&e->cv);
    *out = e;
    return CG_OK;
}

/* One XADD stream MAXLEN ~ N * field value ... per event of e->batch[0..n), pipelined: CG_OK
 * when Redis took them all. */
static cg_status publish(cg_events *e, size_t n)
{
    uint32_t running = 0, queued = 0;
    pthread_mutex_lock(&e->load_mu);
    if (e->load) e->load(e->load_ud, &running, &queued);
    pthread_mutex_unlock(&e->load_mu);
    for (size_t i = 0; i < n; i++) {
        const item *it = &e->batch[i];
        xadd *x = &e->xadds[i];
        x->ev = (cg_chunkevent){.seq = it->seq,
                                .op = it->op,
                                .tier = it->tier,
                                .tokens = it->tokens,
                                .running = running,
                                .queued = queued,
                                .ts_ms = it->ts_ms,
                                .resync = it->resync};
        memcpy(x->ev.worker, e->worker, sizeof x->ev.worker);
        memcpy(x->ev.epoch, e->epoch, sizeof x->ev.epoch);
        cg_key_hex(&it->key, x->ev.key);
        cg_chunkevent_encode(&x->ev, &x->w);
        const char *head[XADD_HEAD] = {"XADD", e->stream, "MAXLEN", "~", e->maxlen, "*"};
        const size_t head_lens[XADD_HEAD] = {4, e->stream_len, 6, 1, strlen(e->maxlen), 1};
        memcpy(x->argv, head, sizeof head);
        memcpy(x->lens, head_lens, sizeof head_lens);
        memcpy(x->argv + XADD_HEAD, x->w.argv, (size_t)x->w.argc * sizeof *x->argv);
        memcpy(x->lens + XADD_HEAD, x->w.lens, (size_t)x->w.argc * sizeof *x->lens);
        e->cmds[i] = (cg_remote_cmd){
            .argc = XADD_HEAD + x->w.argc, .argv = x->argv, .lens = x->lens, .key_arg = 1};
    }
    return cg_remote_commands(e->r, n, e->cmds, 0, NULL);
}

static void *publisher_main(void *arg)
{
    cg_events *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->n && !e->stop)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) break;
        /* The events stay queued until Redis takes them: nothing is lost to an outage shorter
         * than the queue. A batch that failed half-way is sent again whole: a gateway sees the
         * repeated sequence numbers as a gap and resyncs this worker. */
        size_t k = CG_MIN(e->n, (size_t)PUBLISH_BATCH);
        for (size_t i = 0; i < k; i++)
            e->batch[i] = e->q[(e->head + i) % e->p.queue_max];
        pthread_mutex_unlock(&e->mu);
        cg_status st = publish(e, k);
        pthread_mutex_lock(&e->mu);
        if (st == CG_OK) {
            e->head = (e->head + k) % e->p.queue_max;
            e->n -= k;
            e->sent += k;
            __atomic_add_fetch(&e->n_published, k, __ATOMIC_RELAXED);
            continue;
        }
        __atomic_add_fetch(&e->n_failed, 1, __ATOMIC_RELAXED);
        struct timespec until = cg_deadline_after_ms(RETRY_MS);
        if (!e->stop) pthread_cond_timedwait(&e->cv, &e->mu, &until);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

cg_status cg_events_start(cg_events *e, const char *worker, cg_events_load_fn load, void *ud)
{
    if (!worker || !worker[0] || strlen(worker) > CG_CHUNKEVENT_NAME_MAX || e->started)
        return CG_E_VALUE;
    snprintf(e->worker, sizeof e->worker, "%s", worker);
    e->load = load;
    e->load_ud = ud;
    if (pthread_create(&e->thread, NULL, publisher_main, e) != 0) return CG_E_INTERNAL;
    e->started = 1;
    return CG_OK;
}

void cg_events_unload(cg_events *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->load_mu);
    e->load = NULL;
    e->load_ud = NULL;
    pthread_mutex_unlock(&e->load_mu);
}

void cg_events_emit(cg_events *e, cg_chunkevent_op op, const cg_key *key, cg_tier tier,
                    uint32_t tokens)
{
    if (!e) return;
    uint64_t ts = cg_wall_ms();
    pthread_mutex_lock(&e->mu);
    if (e->n == e->p.queue_max || e->stop) {
        e->lost = 1;
        pthread_mutex_unlock(&e->mu);
        __atomic_add_fetch(&e->n_dropped, 1, __ATOMIC_RELAXED);
        return;
    }
    item *it = &e->q[(e->head + e->n) % e->p.queue_max];
    *it = (item){.op = op,
                 .key = *key,
                 .tier = tier,
                 .tokens = tokens,
                 .seq = ++e->seq,
                 .ts_ms = ts,
                 .resync = e->lost};
    e->lost = 0;
    e->n++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    __atomic_add_fetch(&e->n_queued, 1, __ATOMIC_RELAXED);
}

cg_status cg_events_flush(cg_events *e, int timeout_ms)
{
    if (!e) return CG_OK;
    uint64_t end = cg_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    cg_status st = CG_OK;
    pthread_mutex_lock(&e->mu);
    uint64_t want = e->seq;
    while (e->started && e->sent < want) { /* events are published in seq order */
        uint64_t now = cg_now_ms();
        if (now >= end) {
            st = CG_E_TIMEOUT;
            break;
        }
        pthread_mutex_unlock(&e->mu);
        nanosleep(&(struct timespec){0, (long)CG_MIN(5, end - now) * 1000000L}, NULL);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

void cg_events_close(cg_events **ep)
{
    cg_events *e = *ep;
    if (!e) return;
    *ep = NULL;
    if (e->started) {
        if (cg_events_flush(e, 1000) != CG_OK)
            cg_log(CG_LOG_WARN, "events: the stream did not take the last events in time");
        /* what is left after the flush is given up */
        cg_thread_stop(e->thread, &e->mu, &e->cv, &e->stop);
    }
    cg_remote_close(&e->r);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->load_mu);
    pthread_mutex_destroy(&e->mu);
    free(e->q);
    free(e->stream);
    free(e);
}

cg_events_stats cg_events_get_stats(cg_events *e)
{
    cg_events_stats s = {0};
    if (!e) return s;
    s.queued = __atomic_load_n(&e->n_queued, __ATOMIC_RELAXED);
    s.published = __atomic_load_n(&e->n_published, __ATOMIC_RELAXED);
    s.dropped = __atomic_load_n(&e->n_dropped, __ATOMIC_RELAXED);
    s.failed = __atomic_load_n(&e->n_failed, __ATOMIC_RELAXED);
    pthread_mutex_lock(&e->mu);
    s.depth = e->n;
    s.seq = e->seq;
    pthread_mutex_unlock(&e->mu);
    return s;
}
