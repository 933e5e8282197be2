/* The worker's live assemblies (worker/serve/live.h). */
#include "worker/serve/live.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/base.h"
#include "base/map.h"

/* Freed assembly KV buffers kept for the next assembly, at most this many and at most
 * cg_live_new's spare_bytes of capacity in all: a fresh buffer costs a page fault per 4 KiB on
 * first write, a noticeable part of a warm TTFT. */
#define SPARE_KV 2
/* New buffers get a capacity in whole steps of this many slots, so that a spare fits the next
 * request of about the same size (a RAG request a few tokens longer than the last one) rather
 * than a second buffer being made and kept. The slots past a request's own are never written,
 * so their pages cost nothing resident. */
#define KV_CAP_STEP 1024

struct cg_live {
    const cg_model *m;
    cg_pool *pool;
    size_t max;
    uint64_t ttl_ms;
    pthread_mutex_t mu;  /* guards everything below; never held while computing */
    cg_map live;         /* cg_assembly by node, keyed by id */
    cg_live_stats stats; /* but spare_bytes, summed from spare[] when asked */
    cg_kv *spare[SPARE_KV];
    size_t spare_budget;
};

cg_live *cg_live_new(const cg_model *m, cg_pool *pool, size_t max, uint64_t ttl_ms,
                     size_t spare_bytes)
{
    cg_live *l = cg_calloc(1, sizeof *l);
    l->m = m;
    l->pool = pool;
    l->max = max ? max : 1;
    l->ttl_ms = ttl_ms;
    l->spare_budget = spare_bytes;
    CG_MAP_INIT(&l->live, cg_assembly, node, id);
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

void cg_live_free(cg_live **lp)
{
    cg_live *l = *lp;
    if (!l) return;
    cg_map_iter it = cg_map_iter_start(&l->live);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        cg_assembly *a = CG_MAP_ENTRY(n, cg_assembly, node);
        cg_map_remove(&l->live, n);
        cg_live_discard(l, &a, 0);
    }
    cg_map_free(&l->live);
    for (int i = 0; i < SPARE_KV; i++)
        cg_kv_free(&l->spare[i]);
    pthread_mutex_destroy(&l->mu);
    cg_free(lp);
}

static uint32_t cap_of(const cg_kv *kv)
{
    return kv ? cg_kv_cap(kv) : 0;
}

/* A KV of at least cap slots: a spare one when one fits without wasting more than half of
 * it, else a new one. Stale rows are harmless: every slot is written before it is read. */
static cg_kv *kv_get(cg_live *l, uint32_t cap)
{
    cg_kv *kv = NULL;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < SPARE_KV && !kv; i++) {
        uint32_t c = cap_of(l->spare[i]);
        if (c >= cap && c / 2 <= cap) {
            kv = l->spare[i];
            l->spare[i] = NULL;
        }
    }
    pthread_mutex_unlock(&l->mu);
    if (kv) return kv;
    const uint64_t stepped = ((uint64_t)cap + KV_CAP_STEP - 1) / KV_CAP_STEP * KV_CAP_STEP;
    return cg_kv_new(l->m, (uint32_t)CG_MIN(stepped, (uint64_t)UINT32_MAX));
}

/* Keeps the largest of the spares and kv that fit SPARE_KV slots and the byte budget, largest
 * first; frees the rest (outside the lock: unmapping a large buffer takes a while). */
static void kv_put(cg_live *l, cg_kv **kvp)
{
    cg_kv *kv = *kvp;
    *kvp = NULL;
    if (!kv) return;
    cg_kv *cand[SPARE_KV + 1], *drop[SPARE_KV + 1];
    size_t n_drop = 0;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < SPARE_KV; i++) {
        cand[i] = l->spare[i];
        l->spare[i] = NULL;
    }
    cand[SPARE_KV] = kv;
    for (int i = 1; i <= SPARE_KV; i++) /* by capacity, largest first (NULL last) */
        for (int j = i; j > 0 && cap_of(cand[j]) > cap_of(cand[j - 1]); j--) {
            cg_kv *t = cand[j];
            cand[j] = cand[j - 1];
            cand[j - 1] = t;
        }
    size_t bytes = 0;
    int kept = 0;
    for (int i = 0; i <= SPARE_KV && cand[i]; i++) {
        const size_t b = cg_kv_bytes(cand[i]);
        if (kept < SPARE_KV && b <= l->spare_budget - bytes) {
            l->spare[kept++] = cand[i];
            bytes += b;
        } else {
            drop[n_drop++] = cand[i];
        }
    }
    pthread_mutex_unlock(&l->mu);
    for (size_t i = 0; i < n_drop; i++)
        cg_kv_free(&drop[i]);
}

cg_assembly *cg_live_prepare(cg_live *l, uint32_t n_tokens, uint32_t cap, size_t max_chunks)
{
    cg_kv *kv = kv_get(l, cap ? cap : 1);
    if (!kv) return NULL;
    cg_assembly *a = cg_calloc(1, sizeof *a);
    a->kv = kv;
    a->n_tokens = n_tokens;
    a->logits = cg_malloc((size_t)cg_model_cfg(l->m)->vocab_size * sizeof(float));
    a->chunks = cg_calloc(max_chunks ? max_chunks : 1, sizeof *a->chunks);
    return a;
}

void cg_live_discard(cg_live *l, cg_assembly **ap, uint64_t now)
{
    cg_assembly *a = *ap;
    if (!a) return;
    for (size_t i = 0; i < a->n_chunks; i++)
        cg_pool_release(l->pool, &a->chunks[i], now);
    free(a->chunks);
    kv_put(l, &a->kv);
    free(a->tokens);
    free(a->logits);
    cg_free(ap);
}

static void random_id(char out[33])
{
    uint8_t b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        /* No entropy source: ids only need to be unique and unguessable enough for a
         * loopback worker; mix the clock and a counter. */
        static uint64_t ctr;
        uint64_t s = cg_now_ns() ^ (__atomic_add_fetch(&ctr, 1, __ATOMIC_RELAXED) << 32);
        for (int i = 0; i < 16; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (uint8_t)(s >> 56);
        }
    }
    cg_hex_encode(b, sizeof b, out);
}

cg_status cg_live_add(cg_live *l, cg_assembly **ap, uint64_t now, int flags, char id_out[33])
{
    cg_assembly *a = *ap;
    *ap = NULL;
    if (id_out) id_out[0] = '\0';
    cg_live_reap(l, now);
    a->expires = now + l->ttl_ms;
    random_id(a->id);
    cg_status st = CG_E_UNAVAILABLE;
    pthread_mutex_lock(&l->mu);
    if ((flags & CG_LIVE_UNCAPPED) || cg_map_count(&l->live) < l->max) {
        cg_map_add(&l->live, &a->node);
        if (flags & CG_LIVE_ADOPTED)
            l->stats.adopted++;
        else
            l->stats.created++;
        if (id_out) memcpy(id_out, a->id, 33);
        a = NULL;
        st = CG_OK;
    }
    pthread_mutex_unlock(&l->mu);
    cg_live_discard(l, &a, now);
    return st;
}

/* The live assembly id, or NULL. Lock held. Ids are 32 characters and the map compares all 33
 * bytes of id[], so a string of any other length is not looked up. */
static cg_assembly *find_locked(cg_live *l, const char *id)
{
    if (strnlen(id, 33) != 32) return NULL;
    cg_map_node *n = cg_map_find(&l->live, id);
    return n ? CG_MAP_ENTRY(n, cg_assembly, node) : NULL;
}

cg_assembly *cg_live_take(cg_live *l, const char *id, uint64_t now)
{
    cg_live_reap(l, now);
    pthread_mutex_lock(&l->mu);
    cg_assembly *a = find_locked(l, id);
    if (a) cg_map_remove(&l->live, &a->node);
    pthread_mutex_unlock(&l->mu);
    return a;
}

cg_status cg_live_with(cg_live *l, const char *id, uint64_t now,
                       void (*fn)(const cg_assembly *a, void *ud), void *ud)
{
    cg_live_reap(l, now);
    cg_status st = CG_E_NOT_FOUND;
    pthread_mutex_lock(&l->mu);
    const cg_assembly *a = find_locked(l, id);
    if (a) {
        fn(a, ud);
        st = CG_OK;
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

size_t cg_live_reap(cg_live *l, uint64_t now)
{
    cg_map dead; /* moved out under the lock, discarded after it: discarding takes it */
    CG_MAP_INIT(&dead, cg_assembly, node, id);
    pthread_mutex_lock(&l->mu);
    cg_map_iter it = cg_map_iter_start(&l->live);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        if (CG_MAP_ENTRY(n, cg_assembly, node)->expires > now) continue;
        cg_map_remove(&l->live, n);
        cg_map_add(&dead, n);
    }
    size_t n_dead = cg_map_count(&dead);
    l->stats.expired += n_dead;
    pthread_mutex_unlock(&l->mu);
    it = cg_map_iter_start(&dead);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        cg_assembly *a = CG_MAP_ENTRY(n, cg_assembly, node);
        cg_map_remove(&dead, n);
        cg_log(CG_LOG_INFO, "assembly %s expired unconsumed", a->id);
        cg_live_discard(l, &a, now);
    }
    cg_map_free(&dead);
    return n_dead;
}

size_t cg_live_count(cg_live *l, uint64_t now)
{
    cg_live_reap(l, now);
    pthread_mutex_lock(&l->mu);
    size_t n = cg_map_count(&l->live);
    pthread_mutex_unlock(&l->mu);
    return n;
}

int cg_live_full(cg_live *l, uint64_t now)
{
    return cg_live_count(l, now) >= l->max;
}

void cg_live_grow(cg_live *l, cg_assembly *a, uint32_t used, uint32_t cap)
{
    cg_kv *kv = kv_get(l, cap);
    cg_kv_copy_slots(kv, a->kv, used);
    kv_put(l, &a->kv);
    a->kv = kv;
}

cg_live_stats cg_live_get_stats(cg_live *l)
{
    pthread_mutex_lock(&l->mu);
    cg_live_stats s = l->stats;
    for (int i = 0; i < SPARE_KV; i++)
        s.spare_bytes += l->spare[i] ? cg_kv_bytes(l->spare[i]) : 0;
    pthread_mutex_unlock(&l->mu);
    return s;
}
