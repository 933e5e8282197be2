/* Write-behind to the disk tier: a FIFO of copied chunks and one writer thread
 * (worker/store/diskwb.h). */
#include "worker/store/diskwb.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

typedef struct item {
    cg_key key;
    uint32_t n_tokens, n_blocks;
    uint8_t *data; /* n_blocks * block_bytes, the pool's block layout */
    size_t bytes;
    uint64_t enq_ms;
    struct item *next;
} item;

struct cg_diskwb {
    cg_diskwb_params p;
    cg_disk *disk;
    size_t block_bytes;
    uint32_t block_tokens;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv; /* done_cv: CLOCK_MONOTONIC */
    /* Guarded by mu. */
    item *head, *tail;
    item *busy; /* the item being written, out of the list */
    size_t n_items, n_bytes;
    uint64_t enq_seq, done_seq; /* writes queued / attempted or cancelled */
    int stop;
    cg_pool_evictions dropped;
    uint64_t puts, drops, written, failed, cancelled;
};

cg_diskwb_params cg_diskwb_default_params(void)
{
    return (cg_diskwb_params){
        .max_items = 64,
        .max_bytes = (size_t)64 << 20,
        .max_dropped = 4096,
    };
}

static void item_free(item *it)
{
    if (!it) return;
    free(it->data);
    free(it);
}

static const void *item_block(void *ud, uint32_t i)
{
    const item *it = ud;
    return it->data + (size_t)i * (it->bytes / it->n_blocks);
}

/* Keeps the keys the disk dropped for the next cg_diskwb_take_dropped; the caller holds mu. */
static void keep_dropped_locked(cg_diskwb *w, const cg_pool_evictions *ev)
{
    for (size_t i = 0; i < ev->n; i++) {
        cg_pool_evictions *d = &w->dropped;
        if (d->n == w->p.max_dropped) { /* forget the oldest */
            memmove(d->keys, d->keys + 1, (d->n - 1) * sizeof *d->keys);
            d->n--;
        }
        if (d->n == d->cap) {
            d->cap = d->cap ? d->cap * 2 : 64;
            d->keys = cg_realloc(d->keys, d->cap * sizeof *d->keys);
        }
        d->keys[d->n++] = ev->keys[i];
    }
}

static void *writer_main(void *arg)
{
    cg_diskwb *w = arg;
    cg_log_set_request_id("disk-write-behind");
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop)
            pthread_cond_wait(&w->work_cv, &w->mu);
        if (!w->head) break; /* stopping and drained */
        item *it = w->head;
        w->head = it->next;
        if (!w->head) w->tail = NULL;
        w->busy = it;
        pthread_mutex_unlock(&w->mu);

        cg_pool_evictions ev = {0};
        cg_status st =
            cg_disk_put(w->disk, &it->key, it->n_tokens, item_block, it, cg_wall_ms(), &ev);
        /* CG_E_CONFLICT: a spill of the same chunk is writing it right now, which is as good. */
        int ok = st == CG_OK || st == CG_E_CONFLICT;
        if (!ok) {
            char hex[CG_KEY_HEX_LEN + 1];
            cg_key_hex(&it->key, hex);
            cg_log(CG_LOG_WARN, "disk write-behind of chunk %s failed (%s); it stays in RAM", hex,
                   cg_status_name(st));
        }

        if (w->p.on_written) w->p.on_written(w->p.on_written_ud, &it->key, it->n_tokens, ok, &ev);
        pthread_mutex_lock(&w->mu);
        keep_dropped_locked(w, &ev);
        cg_pool_evictions_free(&ev);
        if (ok)
            w->written++;
        else
            w->failed++;
        w->busy = NULL;
        w->n_items--;
        w->n_bytes -= it->bytes;
        w->done_seq++;
        pthread_cond_broadcast(&w->done_cv);
        pthread_mutex_unlock(&w->mu);
        item_free(it);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

cg_status cg_diskwb_open(cg_disk *d, cg_diskwb_params p, cg_diskwb **out)
{
    *out = NULL;
    if (!d || p.max_items == 0 || p.max_bytes == 0) return CG_E_VALUE;
    cg_diskwb *w = cg_calloc(1, sizeof *w);
    w->p = p;
    w->disk = d;
    cg_disk_params dp = cg_disk_get_params(d);
    w->block_bytes = dp.block_bytes;
    w->block_tokens = dp.block_tokens;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work_cv, NULL);
    cg_cond_init_monotonic(&w->done_cv);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        pthread_cond_destroy(&w->done_cv);
        pthread_cond_destroy(&w->work_cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return CG_E_INTERNAL;
    }
    *out = w;
    return CG_OK;
}

void cg_diskwb_close(cg_diskwb **wp)
{
    cg_diskwb *w = *wp;
    if (!w) return;
    *wp = NULL;
    cg_thread_stop(w->thread, &w->mu, &w->work_cv, &w->stop); /* it writes what is queued first */
    cg_pool_evictions_free(&w->dropped);
    pthread_cond_destroy(&w->done_cv);
    pthread_cond_destroy(&w->work_cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

cg_status cg_diskwb_put(cg_diskwb *w, const cg_key *key, uint32_t n_tokens, cg_disk_src_fn src,
                        void *src_ud, uint64_t now)
{
    if (n_tokens == 0) return CG_E_VALUE;
    uint32_t nb = (n_tokens + w->block_tokens - 1) / w->block_tokens;
    size_t bytes = (size_t)nb * w->block_bytes;
    pthread_mutex_lock(&w->mu);
    /* Room is reserved before the copy, so the copy runs outside the lock. */
    int room = w->n_items < w->p.max_items &&
               bytes <= w->p.max_bytes - CG_MIN(w->n_bytes, w->p.max_bytes) && !w->stop;
    if (!room) {
        w->drops++;
        pthread_mutex_unlock(&w->mu);
        return CG_E_FULL;
    }
    w->n_items++;
    w->n_bytes += bytes;
    pthread_mutex_unlock(&w->mu);

    item *it = cg_calloc(1, sizeof *it);
    it->key = *key;
    it->n_tokens = n_tokens;
    it->n_blocks = nb;
    it->bytes = bytes;
    it->enq_ms = now;
    it->data = cg_malloc(bytes);
    for (uint32_t i = 0; i < nb; i++)
        memcpy(it->data + (size_t)i * w->block_bytes, src(src_ud, i), w->block_bytes);

    pthread_mutex_lock(&w->mu);
    if (w->tail)
        w->tail->next = it;
    else
        w->head = it;
    w->tail = it;
    w->puts++;
    w->enq_seq++;
    pthread_cond_signal(&w->work_cv);
    pthread_mutex_unlock(&w->mu);
    return CG_OK;
}

size_t cg_diskwb_cancel(cg_diskwb *w, const cg_key *key)
{
    size_t n = 0;
    item *gone = NULL;
    pthread_mutex_lock(&w->mu);
    for (item **pp = &w->head; *pp;) {
        item *it = *pp;
        if (!cg_key_equal(&it->key, key)) {
            pp = &it->next;
            continue;
        }
        *pp = it->next;
        if (w->tail == it) {
            w->tail = NULL;
            for (item *x = w->head; x; x = x->next)
                w->tail = x;
        }
        w->n_items--;
        w->n_bytes -= it->bytes;
        w->done_seq++;
        w->cancelled++;
        it->next = gone;
        gone = it;
        n++;
    }
    if (n) pthread_cond_broadcast(&w->done_cv);
    while (w->busy && cg_key_equal(&w->busy->key, key))
        pthread_cond_wait(&w->done_cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    while (gone) {
        item *next = gone->next;
        item_free(gone);
        gone = next;
    }
    return n;
}

cg_status cg_diskwb_flush(cg_diskwb *w, int timeout_ms)
{
    struct timespec ts = cg_deadline_after_ms((uint64_t)(timeout_ms > 0 ? timeout_ms : 0));
    cg_status st = CG_OK;
    pthread_mutex_lock(&w->mu);
    uint64_t want = w->enq_seq;
    while (w->done_seq < want) {
        if (pthread_cond_timedwait(&w->done_cv, &w->mu, &ts) == ETIMEDOUT && w->done_seq < want) {
            st = CG_E_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

void cg_diskwb_take_dropped(cg_diskwb *w, cg_pool_evictions *out)
{
    pthread_mutex_lock(&w->mu);
    cg_pool_evictions *d = &w->dropped;
    for (size_t i = 0; i < d->n; i++) {
        if (out->n == out->cap) {
            out->cap = out->cap ? out->cap * 2 : 16;
            out->keys = cg_realloc(out->keys, out->cap * sizeof *out->keys);
        }
        out->keys[out->n++] = d->keys[i];
    }
    d->n = 0;
    pthread_mutex_unlock(&w->mu);
}

cg_diskwb_stats cg_diskwb_get_stats(cg_diskwb *w, uint64_t now)
{
    pthread_mutex_lock(&w->mu);
    const item *oldest = w->busy ? w->busy : w->head;
    cg_diskwb_stats s = {
        .puts = w->puts,
        .drops = w->drops,
        .written = w->written,
        .failed = w->failed,
        .cancelled = w->cancelled,
        .depth = w->n_items,
        .bytes = w->n_bytes,
        .oldest_age_ms = oldest && now > oldest->enq_ms ? now - oldest->enq_ms : 0,
    };
    pthread_mutex_unlock(&w->mu);
    return s;
}
