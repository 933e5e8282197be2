/* The gateway's chunk event reader: XREAD loop, gap detection per worker, and the events
 * applied to the index (server/eventsync.h). */
#include "server/eventsync.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/chunkevent.h"
#include "base/remote.h"

/* Worker names whose event sequence is followed at once; past that the least recent gives its
 * place (source_get). */
#define MAX_SOURCES 1024
#define EVENTS_REPLY_MAX ((size_t)4 << 20)
/* Longest stream entry id ("<ms>-<seq>"). */
#define ID_MAX 48
/* Event lag histogram bounds (seconds). */
static const double lag_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1,   0.25,   0.5,   1,    2.5,   10};

/* What the reader knows of one worker's event sequence. */
typedef struct source {
    char name[CG_CHUNKEVENT_NAME_MAX + 1];
    char epoch[CG_CHUNKEVENT_NAME_MAX + 1];
    uint64_t seq;
    int64_t worker_id; /* index id of the worker that reported this epoch, or -1 */
    uint64_t used;     /* the reader's event count at its last event */
} source;

enum { GAP_SEQUENCE, GAP_EPOCH, GAP_RESYNC, GAP_TRIMMED, GAP_KINDS };
static const char *const gap_labels[GAP_KINDS] = {"kind=\"sequence\"", "kind=\"epoch\"",
                                                  "kind=\"resync\"", "kind=\"trimmed\""};

struct cg_eventsync {
    cg_eventsync_params p;
    cg_remote *r;
    char *stream;
    char pos[ID_MAX]; /* last entry applied; "" = not known yet (Redis was down at open) */
    int check_trim;   /* the next read first checks that the stream still holds pos */
    source *src;
    size_t n_src;
    uint64_t events_seen; /* events read, for the sources' recency */
    int recycled;         /* a source has given its place: a name may come back unfollowed */
    pthread_t thread;
    int started, stop; /* stop: atomic */
    cg_metric *m_applied, *m_skipped, *m_errors, *m_resyncs, *m_lag, *m_lag_last;
    cg_metric *m_gaps[GAP_KINDS];
};

cg_eventsync_params cg_eventsync_default_params(void)
{
    return (cg_eventsync_params){.stream = "chunkgate:events", .block_ms = 500, .count = 512};
}

/* Parses "<ms>-<seq>"; 0 on success. */
static int parse_id(const char *s, uint64_t *ms, uint64_t *seq)
{
    char *end = NULL;
    *ms = strtoull(s, &end, 10);
    if (end == s || *end != '-') return -1;
    const char *t = end + 1;
    *seq = strtoull(t, &end, 10);
    return end == t || *end ? -1 : 0;
}

/* 1 when stream id a is before b. */
static int id_before(const char *a, const char *b)
{
    uint64_t am, as, bm, bs;
    if (parse_id(a, &am, &as) != 0 || parse_id(b, &bm, &bs) != 0) return 0;
    return am < bm || (am == bm && as < bs);
}

/* Runs one command; a failure is counted. */
static cg_status command(cg_eventsync *s, int argc, const char *const *argv, int timeout_ms,
                         redisReply **rep)
{
    size_t lens[16];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    cg_status st = cg_remote_command(s->r, argc, argv, lens, 1, timeout_ms, rep);
    if (st != CG_OK) cg_metric_add(s->m_errors, 1);
    return st;
}

/* The id of the first (dir "+": last) entry of the stream into out; "" when it is empty. */
static cg_status edge_id(cg_eventsync *s, int last, char *out)
{
    const char *argv[] = {
        last ? "XREVRANGE" : "XRANGE", s->stream, last ? "+" : "-", last ? "-" : "+", "COUNT", "1"};
    redisReply *rep = NULL;
    cg_status st = command(s, 6, argv, 0, &rep);
    if (st != CG_OK) return st;
    out[0] = 0;
    if (rep->type != REDIS_REPLY_ARRAY) {
        st = CG_E_BAD_GATEWAY;
    } else if (rep->elements > 0) {
        redisReply *e = rep->element[0];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 1 ||
            e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= ID_MAX)
            st = CG_E_BAD_GATEWAY;
        else
            memcpy(out, e->element[0]->str, e->element[0]->len + 1);
    }
    cg_remote_reply_free(&rep);
    return st;
}

/* A gap: resyncs the worker with index id worker_id, every worker (all), or nothing when the
 * worker is not registered here (its events change nothing in this index). */
static void gap(cg_eventsync *s, int kind, int64_t worker_id, int all, const char *why,
                const char *name)
{
    cg_metric_add(s->m_gaps[kind], 1);
    if (!all && worker_id < 0) return;
    cg_metric_add(s->m_resyncs, 1);
    cg_log(CG_LOG_INFO, "chunk events: %s %s; resyncing %s", why, name,
           all ? "every worker" : "its inventory");
    (void)cg_workers_resync(s->p.workers, all ? -1 : worker_id);
}

/* Decides where to read from when the position is unknown or may have been trimmed. Returns
 * CG_OK when reads may go on. */
static cg_status locate(cg_eventsync *s)
{
    char first[ID_MAX];
    if (!s->pos[0]) {
        /* A new gateway (or one that could not reach Redis at open): the workers'
         * inventories give what happened before, the stream's tail what comes next. */
        char last[ID_MAX];
        cg_status st = edge_id(s, 1, last);
        if (st != CG_OK) return st;
        snprintf(s->pos, sizeof s->pos, "%s", last[0] ? last : "0-0");
        if (s->check_trim)
            gap(s, GAP_TRIMMED, -1, 1, "Redis was unreachable at start for", "all workers");
        s->check_trim = 0;
        return CG_OK;
    }
    if (!s->check_trim) return CG_OK;
    cg_status st = edge_id(s, 0, first);
    if (st != CG_OK) return st;
    s->check_trim = 0;
    /* Entries after pos were trimmed (or the stream is gone, e.g. Redis restarted without
     * persistence): what they said is lost, the inventories have it. */
    if ((first[0] && id_before(s->pos, first) && strcmp(s->pos, "0-0")) ||
        (!first[0] && strcmp(s->pos, "0-0")))
        gap(s, GAP_TRIMMED, -1, 1, "the stream no longer holds the position for", "all workers");
    return CG_OK;
}

/* The source called name. A new one takes a free slot, or the slot of the source heard from
 * least recently (workers come and go under new names: a pod's host name changes on every
 * restart); that one then starts again as a worker seen for the first time. */
static source *source_get(cg_eventsync *s, const char *name)
{
    s->events_seen++;
    source *x = NULL;
    for (size_t i = 0; i < s->n_src; i++)
        if (!strcmp(s->src[i].name, name)) {
            s->src[i].used = s->events_seen;
            return &s->src[i];
        }
    if (s->n_src < MAX_SOURCES) {
        x = &s->src[s->n_src++];
    } else {
        x = &s->src[0];
        for (size_t i = 1; i < s->n_src; i++)
            if (s->src[i].used < x->used) x = &s->src[i];
        s->recycled = 1;
    }
    memset(x, 0, sizeof *x);
    x->used = s->events_seen;
    snprintf(x->name, sizeof x->name, "%s", name);
    x->worker_id = -1;
    return x;
}

/* The placement change of one event. */
static void apply(cg_eventsync *s, const cg_chunkevent *ev, const cg_key *key, int64_t wid,
                  int64_t tier_row)
{
    cg_index *ix = s->p.index;
    int64_t now = (int64_t)cg_wall_ms();
    const cg_tier tier = ev->tier;
    switch (ev->op) {
    case CG_CHUNKEVENT_STORED:
    case CG_CHUNKEVENT_SPILLED:
    case CG_CHUNKEVENT_PROMOTED:
        if (tier == CG_TIER_REMOTE) {
            if (tier_row >= 0)
                cg_index_event_placement_set(ix, key, tier_row, CG_TIER_REMOTE, ev->tokens, now);
        } else {
            cg_index_event_placement_set(ix, key, wid, tier, ev->tokens, now);
        }
        break;
    case CG_CHUNKEVENT_EVICTED:
        if (tier == CG_TIER_DISK) {
            /* A disk record dropped while the chunk is still in RAM changes nothing the
             * index holds: only a disk placement goes. */
            cg_index_entry e;
            if (cg_index_lookup(ix, key, 1, &e) != CG_OK) break;
            for (int i = 0; i < e.n_placements; i++)
                if (e.placements[i].worker_id == wid && e.placements[i].tier == CG_TIER_DISK)
                    cg_index_event_placement_del(ix, key, wid);
        } else if (tier == CG_TIER_REMOTE) {
            if (tier_row >= 0) cg_index_event_placement_del(ix, key, tier_row);
        } else {
            cg_index_event_placement_del(ix, key, wid);
        }
        break;
    case CG_CHUNKEVENT_FAILED:
        if (tier == CG_TIER_REMOTE && tier_row >= 0)
            cg_index_event_placement_del(ix, key, tier_row);
        break;
    case CG_CHUNKEVENT_DELETED:
        cg_index_event_placement_del(ix, key, wid);
        if (tier_row >= 0) cg_index_event_placement_del(ix, key, tier_row);
        break;
    case CG_CHUNKEVENT_N_OPS:
        break;
    }
}

/* One stream entry: gap checks, then its change. */
static void entry(cg_eventsync *s, const redisReply *fields)
{
    const char *f[2 * CG_CHUNKEVENT_MAX_FIELDS + 8];
    size_t l[2 * CG_CHUNKEVENT_MAX_FIELDS + 8], n = 0;
    for (size_t i = 0; i < fields->elements && n < CG_ARRAY_LEN(f); i++) {
        const redisReply *x = fields->element[i];
        if (x->type != REDIS_REPLY_STRING) return;
        f[n] = x->str;
        l[n++] = x->len;
    }
    cg_chunkevent ev;
    cg_key key;
    if (cg_chunkevent_decode(n, f, l, &ev) != CG_OK || cg_key_parse(ev.key, &key) != 0) {
        cg_metric_add(s->m_skipped, 1);
        return;
    }
    int64_t wid = -1, tier_row = -1;
    int known = cg_workers_find_instance(s->p.workers, ev.epoch, &wid, &tier_row);
    source *src = source_get(s, ev.worker);
    if (!src->epoch[0] && s->recycled) {
        /* first event of this name since its place was given (or since the start): what
         * it said meanwhile went unchecked, so its inventory is read again */
        gap(s, GAP_SEQUENCE, known ? wid : -1, 0, "events not followed from", ev.worker);
    } else if (!src->epoch[0]) {
        /* first event of this worker since the start: its inventory covers the past */
    } else if (strcmp(src->epoch, ev.epoch)) {
        /* restarted: the registry learns the new instance at the sync */
        gap(s, GAP_EPOCH, src->worker_id, 0, "a new epoch of", ev.worker);
    } else if (ev.seq != src->seq + 1) {
        gap(s, GAP_SEQUENCE, known ? wid : src->worker_id, 0, "events lost from", ev.worker);
    } else if (ev.resync) {
        gap(s, GAP_RESYNC, known ? wid : src->worker_id, 0, "a resync asked by", ev.worker);
    }
    snprintf(src->epoch, sizeof src->epoch, "%s", ev.epoch);
    src->seq = ev.seq;
    if (known) src->worker_id = wid;
    if (!known) {
        /* not registered here, or its new instance is not synced yet (the sync covers it) */
        cg_metric_add(s->m_skipped, 1);
        return;
    }
    apply(s, &ev, &key, wid, tier_row);
    cg_metric_add(s->m_applied, 1);
    uint64_t now = cg_wall_ms();
    double lag = now > ev.ts_ms ? (double)(now - ev.ts_ms) / 1e3 : 0;
    cg_metric_observe(s->m_lag, lag);
    cg_metric_set(s->m_lag_last, lag);
}

/* Reads and applies one batch. */
static cg_status read_once(cg_eventsync *s)
{
    char count[16], block[16];
    snprintf(count, sizeof count, "%d", s->p.count);
    snprintf(block, sizeof block, "%d", s->p.block_ms);
    const char *argv[] = {"XREAD", "COUNT", count, "BLOCK", block, "STREAMS", s->stream, s->pos};
    size_t lens[8];
    for (int i = 0; i < 8; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = NULL;
    cg_status st = cg_remote_command(s->r, 8, argv, lens, 6, s->p.block_ms + 2000, &rep);
    if (st != CG_OK) {
        cg_metric_add(s->m_errors, 1);
        return st;
    }
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
        rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2 &&
        rep->element[0]->element[1]->type == REDIS_REPLY_ARRAY) {
        const redisReply *list = rep->element[0]->element[1];
        for (size_t i = 0; i < list->elements; i++) {
            const redisReply *e = list->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
                e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= ID_MAX)
                continue;
            if (e->element[1]->type == REDIS_REPLY_ARRAY) entry(s, e->element[1]);
            memcpy(s->pos, e->element[0]->str, e->element[0]->len + 1);
        }
        if (list->elements) cg_index_stream_pos_set(s->p.index, s->stream, s->pos);
    } else if (rep->type != REDIS_REPLY_NIL) {
        st = CG_E_BAD_GATEWAY;
        cg_metric_add(s->m_errors, 1);
    }
    cg_remote_reply_free(&rep);
    return st;
}

/* After this many replies in a row that could not be read at one position (an entry too large
 * or malformed for the parser, not Redis being away), the reader leaves the entries there for
 * the stream's tail and resyncs every worker, rather than ask for them forever. */
#define BAD_REPLIES_SKIP 5

/* Leaves the entries after the position for the stream's tail (CG_OK), and resyncs every
 * worker. */
static cg_status skip_to_tail(cg_eventsync *s)
{
    char last[ID_MAX];
    cg_status st = edge_id(s, 1, last);
    if (st != CG_OK) return st;
    if (!last[0]) return CG_E_NOT_FOUND;
    cg_log(CG_LOG_WARN, "chunk events: the entries of %s after %s cannot be read; going on from %s",
           s->stream, s->pos, last);
    snprintf(s->pos, sizeof s->pos, "%s", last);
    cg_index_stream_pos_set(s->p.index, s->stream, s->pos);
    gap(s, GAP_TRIMMED, -1, 1, "unreadable entries skipped for", "all workers");
    return CG_OK;
}

static void *reader_main(void *arg)
{
    cg_eventsync *s = arg;
    int failing = 0, bad = 0;
    char bad_pos[ID_MAX] = "";
    while (!__atomic_load_n(&s->stop, __ATOMIC_RELAXED)) {
        /* after the wait: a refused reply also puts the node in a short backoff */
        if (bad >= BAD_REPLIES_SKIP && skip_to_tail(s) == CG_OK) bad = 0;
        cg_status st = locate(s);
        if (st == CG_OK) st = read_once(s);
        if (st == CG_OK) {
            if (failing) cg_log(CG_LOG_INFO, "chunk events: reading %s again", s->stream);
            failing = bad = 0;
            continue;
        }
        if (st == CG_E_BAD_GATEWAY && s->pos[0]) {
            bad = strcmp(bad_pos, s->pos) ? 1 : bad + 1;
            snprintf(bad_pos, sizeof bad_pos, "%s", s->pos);
        }
        if (!failing)
            cg_log(CG_LOG_WARN, "chunk events: reading %s failed (%s); retrying", s->stream,
                   cg_status_name(st));
        failing = 1;
        s->check_trim = 1; /* Redis may have lost or trimmed entries meanwhile */
        nanosleep(&(struct timespec){0, 200 * 1000000L}, NULL);
    }
    return NULL;
}

cg_status cg_eventsync_open(const cg_eventsync_params *p, cg_eventsync **out, char *err,
                            size_t errlen)
{
    *out = NULL;
    cg_remote_params rp = cg_remote_default_params();
    rp.url = p->url;
    rp.password = p->password;
    rp.timeout_ms = 1000;
    rp.conns_per_node = 2;
    rp.queue_max_items = 1;
    rp.backoff_max_ms = 1000; /* catch up soon after an outage */
    /* a batch of events is a few hundred KiB: a reply far larger is not one (and its many
     * elements would be built in memory before it could be refused) */
    rp.value_max_bytes = EVENTS_REPLY_MAX;
    cg_remote *r = NULL;
    cg_status st = cg_remote_open(rp, &r, err, errlen);
    if (st != CG_OK) return st;
    cg_eventsync *s = cg_calloc(1, sizeof *s);
    s->p = *p;
    s->p.url = s->p.password = NULL; /* borrowed for open only */
    if (s->p.block_ms <= 0) s->p.block_ms = 500;
    if (s->p.count <= 0) s->p.count = 512;
    s->r = r;
    s->stream = cg_strdup(p->stream && p->stream[0] ? p->stream : "chunkgate:events");
    s->p.stream = s->stream;
    s->src = cg_calloc(MAX_SOURCES, sizeof *s->src);
    cg_metrics *m = p->metrics;
    s->m_applied = cg_metrics_counter(m, "chunkgate_events_applied_total",
                                      "Chunk events applied to the index", NULL);
    s->m_skipped = cg_metrics_counter(
        m, "chunkgate_events_skipped_total",
        "Chunk events not applied: malformed, or of a worker not registered (yet)", NULL);
    s->m_errors = cg_metrics_counter(m, "chunkgate_events_errors_total",
                                     "Failed reads of the chunk event stream", NULL);
    s->m_resyncs = cg_metrics_counter(m, "chunkgate_events_resyncs_total",
                                      "Inventory resyncs asked for by chunk event gaps", NULL);
    for (int k = 0; k < GAP_KINDS; k++)
        s->m_gaps[k] = cg_metrics_counter(m, "chunkgate_events_gaps_total",
                                          "Gaps in the chunk events by kind", gap_labels[k]);
    s->m_lag =
        cg_metrics_histogram(m, "chunkgate_events_lag_seconds",
                             "From a worker's change of a chunk's place to the index learning it",
                             NULL, lag_bounds, CG_ARRAY_LEN(lag_bounds));
    s->m_lag_last = cg_metrics_gauge(m, "chunkgate_events_last_lag_seconds",
                                     "Lag of the last chunk event applied", NULL);

    st = cg_index_stream_pos_get(p->index, s->stream, s->pos, sizeof s->pos);
    if (st == CG_OK) {
        cg_log(CG_LOG_INFO, "chunk events: resuming %s after %s", s->stream, s->pos);
        s->check_trim = 1;
    } else {
        s->pos[0] = 0;
        /* The tail now, before the workers' inventories are read. */
        if (locate(s) != CG_OK) s->check_trim = 1; /* unknown: resync all once it is known */
        cg_log(CG_LOG_INFO, "chunk events: reading %s from %s", s->stream,
               s->pos[0] ? s->pos : "its tail once Redis answers");
    }
    *out = s;
    return CG_OK;
}

cg_status cg_eventsync_start(cg_eventsync *s)
{
    if (pthread_create(&s->thread, NULL, reader_main, s) != 0) return CG_E_INTERNAL;
    s->started = 1;
    return CG_OK;
}

void cg_eventsync_close(cg_eventsync **sp)
{
    cg_eventsync *s = *sp;
    if (!s) return;
    *sp = NULL;
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
    if (s->started) pthread_join(s->thread, NULL);
    cg_remote_close(&s->r);
    free(s->src);
    free(s->stream);
    free(s);
}
