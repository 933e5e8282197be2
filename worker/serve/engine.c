/* Assembly engine of the reference worker: per-segment tokenization and keys, pool lookups
 * (then the disk tier), misses computed at virtual positions and stored, hits remapped by
 * R(p - v) into the request's KV, EPIC prefix recompute, question prefill, decoding, and the
 * spill of evicted chunks to disk. DESIGN §5-§8. */
#include "worker/serve/engine.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kv/attn.h"
#include "base/base.h"
#include "kv/remap.h"

/* A request's KV, built by assemble and consumed by complete. It holds one pool reference
 * per chunk it took from (or stored into) the pool. */
#define SPARE_KV 2

typedef struct assembly {
    char id[33];
    cg_kv *kv;
    uint32_t n_tokens; /* prompt tokens in kv slots [0, n_tokens) */
    uint32_t cached_tokens;
    float *logits; /* vocab_size logits of the last prompt token */
    cg_pool_chunk **chunks;
    size_t n_chunks;
    uint64_t expires;
    struct assembly *next;
} assembly;

struct cg_engine {
    const cg_model *m;
    cg_engine_params p;
    cg_pool *pool;
    cg_disk *disk; /* NULL without a disk tier */
    size_t block_bytes;
    cg_rope rope;
    /* Counted inside the pool's eviction callback (pool lock held): atomics, not amu. */
    uint64_t n_spills, n_spill_failures, n_restores, n_restore_failures;
    /* Model compute: one forward already uses both cores, so forwards run one at a time. */
    pthread_mutex_t mu;
    /* The live assemblies and the stats; never held while computing. */
    pthread_mutex_t amu;
    assembly *live;
    size_t n_live;
    cg_engine_stats stats;
    /* Freed assembly KV buffers kept for the next assembly: a fresh buffer costs a page fault
     * per 4 KiB on first write, a noticeable part of a warm TTFT (under amu). */
    cg_kv *spare[SPARE_KV];
};

cg_engine_params cg_engine_default_params(void)
{
    return (cg_engine_params){
        .pool_bytes = (size_t)256 << 20,
        .block_tokens = 16,
        .assembly_ttl_ms = 60000,
        .max_assemblies = 64,
        .reserve_tokens = 512,
        .disk_bytes = 0,
        .disk_dir = NULL,
        .disk_sync = 0,
    };
}

/* Disk records dropped (LRU) by the spills this thread makes while an assemble collects them
 * for its reply. Spills run in the pool's eviction callback, which cg_pool_insert calls on
 * the inserting thread, so a thread-local pointer reaches exactly this request's list. */
static _Thread_local cg_pool_evictions *tl_dropped;

/* The pool's eviction callback: the chunk goes to disk instead of being dropped.
 *
 * It runs with the pool lock held, so the write is synchronous under that lock (lock order:
 * pool, then disk; the disk never calls the pool). Chosen over a copy and a background
 * writer because it keeps every chunk in exactly one visible place at every moment the pool
 * lock is free: in RAM, or committed on disk, or gone. A queue of pending spills would need
 * its own lookup, delete and shutdown rules. The cost is bounded and measured
 * (.helpers/bench-tierwire.md): a page-cache pwritev plus one SQLite commit per evicted
 * chunk, paid by the assemble that needs the room (assembles run one at a time anyway); other
 * pool users (release, export, inventory) wait that long at most. */
static void spill(void *ud, const cg_key *key, const cg_pool_chunk *c)
{
    cg_engine *e = ud;
    cg_disk_pool_src src = {e->pool, c};
    cg_status st = cg_disk_put(e->disk, key, cg_pool_chunk_tokens(c), cg_disk_pool_block, &src,
                               cg_wall_ms(), tl_dropped);
    __atomic_add_fetch(st == CG_OK ? &e->n_spills : &e->n_spill_failures, 1, __ATOMIC_RELAXED);
    if (st != CG_OK) {
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(key, hex);
        cg_log(CG_LOG_INFO, "chunk %s evicted from RAM and not spilled (%s): dropped", hex,
               cg_status_name(st));
    }
}

static void engine_destroy(cg_engine *e)
{
    cg_pool_close(&e->pool);
    cg_disk_close(&e->disk);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->amu);
    free(e);
}

cg_status cg_engine_open(const cg_model *model, cg_engine_params params, cg_engine **out)
{
    *out = NULL;
    const cg_model_config *c = cg_model_cfg(model);
    cg_engine *e = cg_calloc(1, sizeof *e);
    e->m = model;
    e->p = params;
    e->p.disk_dir = NULL; /* borrowed for create only */
    if (!e->p.max_assemblies) e->p.max_assemblies = 1;
    e->rope = cg_model_rope(model);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->amu, NULL);
    cg_pool_params pp = cg_pool_default_params();
    pp.capacity_bytes = params.pool_bytes;
    pp.block_tokens = params.block_tokens;
    pp.n_layers = c->n_layers;
    pp.n_kv_heads = c->n_kv_heads;
    pp.head_dim = c->head_dim;
    e->block_bytes = cg_pool_block_bytes(&pp);
    cg_status st = CG_OK;
    if (params.disk_bytes > 0) {
        cg_disk_params dp = cg_disk_default_params();
        dp.dir = params.disk_dir;
        dp.capacity_bytes = params.disk_bytes;
        dp.block_bytes = e->block_bytes;
        dp.block_tokens = params.block_tokens;
        dp.n_layers = c->n_layers;
        dp.n_kv_heads = c->n_kv_heads;
        dp.head_dim = c->head_dim;
        dp.model_id = c->model_id;
        dp.sync = params.disk_sync;
        if (!params.disk_dir || !params.disk_dir[0]) {
            st = CG_E_VALUE;
            goto out;
        }
        if ((st = cg_disk_open(dp, &e->disk)) != CG_OK) goto out;
        pp.on_evict = spill;
        pp.on_evict_ud = e;
    }
    st = cg_pool_open(pp, &e->pool);
out:
    if (st != CG_OK) {
        engine_destroy(e);
        return st;
    }
    *out = e;
    return CG_OK;
}

/* A KV of at least cap slots: a spare one when one fits without wasting more than half of
 * it, else a new one. Stale rows are harmless: every slot is written before it is read. */
static cg_kv *kv_get(cg_engine *e, uint32_t cap)
{
    cg_kv *kv = NULL;
    pthread_mutex_lock(&e->amu);
    for (int i = 0; i < SPARE_KV && !kv; i++) {
        uint32_t c = e->spare[i] ? cg_kv_cap(e->spare[i]) : 0;
        if (c >= cap && c / 2 <= cap) {
            kv = e->spare[i];
            e->spare[i] = NULL;
        }
    }
    pthread_mutex_unlock(&e->amu);
    return kv ? kv : cg_kv_new(e->m, cap);
}

/* Keeps kv as a spare (replacing the smallest) or frees it. */
static void kv_put(cg_engine *e, cg_kv **kvp)
{
    cg_kv *kv = *kvp;
    *kvp = NULL;
    if (!kv) return;
    pthread_mutex_lock(&e->amu);
    int slot = 0;
    for (int i = 0; i < SPARE_KV; i++) {
        if (!e->spare[i]) {
            slot = i;
            break;
        }
        if (cg_kv_cap(e->spare[i]) < cg_kv_cap(e->spare[slot])) slot = i;
    }
    cg_kv *old = e->spare[slot];
    if (old && cg_kv_cap(old) >= cg_kv_cap(kv)) {
        old = kv; /* keep the bigger one */
    } else {
        e->spare[slot] = kv;
    }
    pthread_mutex_unlock(&e->amu);
    cg_kv_free(&old);
}

static void assembly_free(cg_engine *e, assembly **ap, uint64_t now)
{
    assembly *a = *ap;
    if (!a) return;
    for (size_t i = 0; i < a->n_chunks; i++)
        cg_pool_release(e->pool, &a->chunks[i], now);
    free(a->chunks);
    kv_put(e, &a->kv);
    free(a->logits);
    free(a);
    *ap = NULL;
}

void cg_engine_close(cg_engine **ep)
{
    cg_engine *e = *ep;
    if (!e) return;
    *ep = NULL;
    while (e->live) {
        assembly *a = e->live;
        e->live = a->next;
        assembly_free(e, &a, 0);
    }
    for (int i = 0; i < SPARE_KV; i++)
        cg_kv_free(&e->spare[i]);
    engine_destroy(e);
}

const cg_model *cg_engine_model(const cg_engine *e)
{
    return e->m;
}
cg_pool *cg_engine_pool(cg_engine *e)
{
    return e->pool;
}
cg_disk *cg_engine_disk(cg_engine *e)
{
    return e->disk;
}
cg_engine_params cg_engine_get_params(const cg_engine *e)
{
    return e->p;
}

cg_engine_stats cg_engine_get_stats(cg_engine *e)
{
    pthread_mutex_lock(&e->amu);
    cg_engine_stats s = e->stats;
    pthread_mutex_unlock(&e->amu);
    s.spills = __atomic_load_n(&e->n_spills, __ATOMIC_RELAXED);
    s.spill_failures = __atomic_load_n(&e->n_spill_failures, __ATOMIC_RELAXED);
    s.restores = __atomic_load_n(&e->n_restores, __ATOMIC_RELAXED);
    s.restore_failures = __atomic_load_n(&e->n_restore_failures, __ATOMIC_RELAXED);
    return s;
}

/* ---- live assemblies ---- */

size_t cg_engine_reap(cg_engine *e, uint64_t now)
{
    assembly *dead = NULL;
    size_t n = 0;
    pthread_mutex_lock(&e->amu);
    for (assembly **pp = &e->live; *pp;) {
        assembly *a = *pp;
        if (a->expires <= now) {
            *pp = a->next;
            a->next = dead;
            dead = a;
            e->n_live--;
            n++;
        } else {
            pp = &a->next;
        }
    }
    e->stats.assemblies_expired += n;
    pthread_mutex_unlock(&e->amu);
    while (dead) {
        assembly *a = dead;
        dead = a->next;
        cg_log(CG_LOG_INFO, "assembly %s expired unconsumed", a->id);
        assembly_free(e, &a, now);
    }
    return n;
}

size_t cg_engine_live_assemblies(cg_engine *e, uint64_t now)
{
    cg_engine_reap(e, now);
    pthread_mutex_lock(&e->amu);
    size_t n = e->n_live;
    pthread_mutex_unlock(&e->amu);
    return n;
}

/* Unlinks a live assembly by id; the caller then owns it. */
static assembly *take(cg_engine *e, const char *id)
{
    assembly *a = NULL;
    pthread_mutex_lock(&e->amu);
    for (assembly **pp = &e->live; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, id) == 0) {
            a = *pp;
            *pp = a->next;
            a->next = NULL;
            e->n_live--;
            break;
        }
    }
    pthread_mutex_unlock(&e->amu);
    return a;
}

cg_status cg_engine_release(cg_engine *e, const char *assembly_id, uint64_t now)
{
    cg_engine_reap(e, now);
    assembly *a = take(e, assembly_id);
    if (!a) return CG_E_NOT_FOUND;
    assembly_free(e, &a, now);
    return CG_OK;
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

/* ---- KV placement: the one path by which a chunk's rows enter an assembly ---- */

/* Writes n rows of one plane: K is rotated by delta (R(a+b) = R(a)R(b)), V is copied. */
static void put_rows(const cg_rope *r, const float *src, float *dst, size_t n, int64_t delta,
                     int is_k)
{
    if (!is_k || delta == 0)
        memcpy(dst, src, n * (size_t)r->head_dim * sizeof(float));
    else
        cg_remap_rope(r, src, dst, n, delta);
}

/* A cached chunk's KV as found by lookup: a referenced pool chunk, or (when RAM had no room
 * for a chunk read from disk) its blocks in a private buffer, in the pool's block layout. */
typedef struct cached_kv {
    cg_pool_chunk *c;
    float *buf; /* owned; n_blocks * block_bytes */
    uint32_t n_tokens, n_blocks;
    const char *tier; /* "ram" or "disk" */
} cached_kv;

static void cached_drop(cg_engine *e, cached_kv *s, uint64_t now)
{
    cg_pool_release(e->pool, &s->c, now);
    cg_free(&s->buf);
}

/* Rows [*n_rows][head_dim] of one layer/head/K-or-V in block b of a cached chunk. */
static const float *cached_rows(const cg_engine *e, const cached_kv *s, uint32_t b, int l, int h,
                                int which, uint32_t *n_rows)
{
    if (s->c) return cg_pool_chunk_rows(e->pool, s->c, b, l, h, which, n_rows);
    /* The block layout of kv/pool.h: [head][layer][K,V][block_tokens][head_dim]. */
    const cg_model_config *cfg = cg_model_cfg(e->m);
    const size_t bt = e->p.block_tokens, slab = bt * (size_t)cfg->head_dim;
    *n_rows = b + 1 < s->n_blocks ? (uint32_t)bt : s->n_tokens - b * (uint32_t)bt;
    size_t i = ((size_t)h * (size_t)cfg->n_layers + (size_t)l) * 2 + (size_t)which;
    return s->buf + (size_t)b * (e->block_bytes / sizeof(float)) + i * slab;
}

/* Places a cached chunk at assembly slot p, reading its blocks in place. */
static void place_cached(cg_engine *e, cg_kv *dst, uint32_t p, const cached_kv *s, int64_t delta)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    const size_t hd = (size_t)cfg->head_dim;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++)
            for (int which = 0; which < 2; which++) {
                float *out = (which ? cg_kv_v(dst, l, h) : cg_kv_k(dst, l, h)) + (size_t)p * hd;
                for (uint32_t b = 0; b < s->n_blocks; b++) {
                    uint32_t nr = 0;
                    const float *rows = cached_rows(e, s, b, l, h, which, &nr);
                    put_rows(&e->rope, rows, out, nr, delta, !which);
                    out += (size_t)nr * hd;
                }
            }
}

static void place_from_pool(cg_engine *e, cg_kv *dst, uint32_t p, cg_pool_chunk *c, int64_t delta)
{
    cached_kv s = {
        .c = c, .n_tokens = cg_pool_chunk_tokens(c), .n_blocks = cg_pool_chunk_blocks(c)};
    place_cached(e, dst, p, &s, delta);
}

typedef struct pool_dst {
    cg_pool *pool;
    cg_pool_chunk *c;
} pool_dst;

static void *pool_block(void *ud, uint32_t i)
{
    pool_dst *d = ud;
    return cg_pool_chunk_block(d->pool, d->c, i);
}

/* Reads a chunk back from the disk tier: into a new pool chunk (published, referenced) when
 * RAM has room, else into a private buffer. A record that fails its checksum or its read is
 * dropped by the disk tier and is a miss here: corrupt KV is never used. */
static cg_status restore(cg_engine *e, const cg_key *key, uint32_t want, uint64_t now,
                         cg_pool_evictions *ev, cached_kv *out)
{
    cg_disk_chunk_info di;
    if (cg_disk_peek(e->disk, key, &di) != CG_OK) return CG_E_NOT_FOUND;
    if (want && di.tokens != want) {
        /* Keys carry no role: a system text equal to a chunk text has the same strict key
         * but one more token (BOS). Never mix the two. */
        cg_log(CG_LOG_WARN, "disk chunk has %u tokens, the segment %u; computing it", di.tokens,
               want);
        return CG_E_CONFLICT;
    }
    /* Making room in RAM may spill chunks, and their room on disk is made by dropping the
     * least recently used records: this one must not be among the first. */
    if (cg_disk_touch(e->disk, key, cg_wall_ms()) != CG_OK) return CG_E_NOT_FOUND;
    cg_pool_chunk *c = NULL;
    cg_status st = cg_pool_insert(e->pool, key, di.tokens, now, &c, ev);
    out->n_tokens = di.tokens;
    out->n_blocks = (uint32_t)((di.tokens + e->p.block_tokens - 1) / e->p.block_tokens);
    out->tier = "disk";
    if (st == CG_OK) {
        pool_dst d = {e->pool, c};
        st = cg_disk_get(e->disk, key, di.tokens, pool_block, &d, cg_wall_ms());
        if (st == CG_OK) {
            cg_pool_publish(e->pool, c, now);
            out->c = c;
        } else {
            cg_pool_release(e->pool, &c, now); /* unpublished: dropped with its bytes */
        }
    } else {
        /* RAM is full of referenced chunks, or another thread is filling this key. */
        size_t len = (size_t)out->n_blocks * e->block_bytes;
        out->buf = cg_malloc(len);
        st = cg_disk_get_buf(e->disk, key, di.tokens, out->buf, len, cg_wall_ms());
        if (st != CG_OK) cg_free(&out->buf);
    }
    if (st == CG_OK) {
        __atomic_add_fetch(&e->n_restores, 1, __ATOMIC_RELAXED);
        return CG_OK;
    }
    if (st == CG_E_IO) __atomic_add_fetch(&e->n_restore_failures, 1, __ATOMIC_RELAXED);
    memset(out, 0, sizeof *out);
    return CG_E_NOT_FOUND; /* gone meanwhile, or failed verification: a miss */
}

/* Finds a cached chunk: the RAM pool, then the disk tier. want: the token count the segment
 * needs (0 = any). CG_OK fills *out (release with cached_drop, or keep out->c); otherwise a
 * miss (CG_E_CONFLICT: a chunk of another length holds the key). */
static cg_status lookup(cg_engine *e, const cg_key *key, uint32_t want, uint64_t now,
                        cg_pool_evictions *ev, cached_kv *out)
{
    memset(out, 0, sizeof *out);
    cg_pool_chunk *c = NULL;
    if (cg_pool_get(e->pool, key, now, &c) == CG_OK) {
        if (want && cg_pool_chunk_tokens(c) != want) {
            cg_log(CG_LOG_WARN, "pool chunk has %u tokens, the segment %u; computing it unstored",
                   cg_pool_chunk_tokens(c), want);
            cg_pool_release(e->pool, &c, now);
            return CG_E_CONFLICT;
        }
        out->c = c;
        out->n_tokens = cg_pool_chunk_tokens(c);
        out->n_blocks = cg_pool_chunk_blocks(c);
        out->tier = "ram";
        return CG_OK;
    }
    if (!e->disk) return CG_E_NOT_FOUND;
    return restore(e, key, want, now, ev, out);
}

/* Places n rows computed in a scratch KV at slots [v, v+n) (a miss the pool could not
 * store) at assembly slot p. */
static void place_from_kv(cg_engine *e, cg_kv *dst, uint32_t p, cg_kv *src, uint32_t v, uint32_t n,
                          int64_t delta)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    const size_t hd = (size_t)cfg->head_dim;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++) {
            put_rows(&e->rope, cg_kv_k(src, l, h) + (size_t)v * hd,
                     cg_kv_k(dst, l, h) + (size_t)p * hd, n, delta, 1);
            put_rows(&e->rope, cg_kv_v(src, l, h) + (size_t)v * hd,
                     cg_kv_v(dst, l, h) + (size_t)p * hd, n, delta, 0);
        }
}

/* Copies slots [0, n) of every plane (the system segment into a scratch KV, or a KV that
 * grows). */
static void copy_slots(const cg_model *m, cg_kv *dst, cg_kv *src, uint32_t n)
{
    const cg_model_config *cfg = cg_model_cfg(m);
    const size_t bytes = (size_t)n * (size_t)cfg->head_dim * sizeof(float);
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++) {
            memcpy(cg_kv_k(dst, l, h), cg_kv_k(src, l, h), bytes);
            memcpy(cg_kv_v(dst, l, h), cg_kv_v(src, l, h), bytes);
        }
}

/* Stores rows [v, v+n) of src as a new published chunk; returns it referenced. CG_E_FULL or
 * CG_E_CONFLICT: nothing stored (the caller uses its rows unstored). */
static cg_status store(cg_engine *e, const cg_key *key, cg_kv *src, uint32_t v, uint32_t n,
                       uint64_t now, cg_pool_evictions *ev, cg_pool_chunk **out)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    const size_t hd = (size_t)cfg->head_dim;
    cg_pool_chunk *c = NULL;
    *out = NULL;
    cg_status st = cg_pool_insert(e->pool, key, n, now, &c, ev);
    if (st != CG_OK) return st;
    /* The rows past n in the last block are never read, but the disk tier writes and
     * checksums whole blocks: zero them so no stale bytes of an evicted chunk (or never
     * initialised memory) reach the disk. One block per stored chunk. */
    uint32_t nb = cg_pool_chunk_blocks(c);
    cg_pool_params pp = cg_pool_get_params(e->pool);
    if (nb) memset(cg_pool_chunk_block(e->pool, c, nb - 1), 0, cg_pool_block_bytes(&pp));
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++) {
            cg_pool_chunk_write(e->pool, c, l, h, 0, cg_kv_k(src, l, h) + (size_t)v * hd);
            cg_pool_chunk_write(e->pool, c, l, h, 1, cg_kv_v(src, l, h) + (size_t)v * hd);
        }
    cg_pool_publish(e->pool, c, now);
    *out = c;
    return CG_OK;
}

/* ---- assemble ---- */

void cg_assembly_info_free(cg_assembly_info *a)
{
    if (!a) return;
    cg_free(&a->segs);
    cg_free(&a->evicted);
    cg_free(&a->spilled);
    a->n_segs = a->n_evicted = a->n_spilled = 0;
}

static cg_status check_segments(const cg_assemble_req *req, char *err, size_t errlen)
{
    if (!req->segs || req->n_segs == 0) {
        cg_seterr(err, errlen, "segments must hold at least one segment");
        return CG_E_VALUE;
    }
    for (size_t i = 0; i < req->n_segs; i++) {
        const cg_engine_seg *s = &req->segs[i];
        if (s->role != CG_ROLE_SYSTEM && s->role != CG_ROLE_CHUNK && s->role != CG_ROLE_QUESTION) {
            cg_seterr(err, errlen, "segments[%zu].role is not system, chunk or question", i);
            return CG_E_VALUE;
        }
        if (s->role == CG_ROLE_SYSTEM && i != 0) {
            cg_seterr(err, errlen, "segments[%zu]: a system segment may only come first", i);
            return CG_E_VALUE;
        }
        if (s->role == CG_ROLE_QUESTION && i != req->n_segs - 1) {
            cg_seterr(err, errlen, "segments[%zu]: a question segment may only come last", i);
            return CG_E_VALUE;
        }
        if (!s->text || s->len == 0) {
            cg_seterr(err, errlen, "segments[%zu].text is empty", i);
            return CG_E_VALUE;
        }
    }
    if (req->mode != CG_MODE_STRICT && req->mode != CG_MODE_SYS) {
        cg_seterr(err, errlen, "mode must be strict or sys");
        return CG_E_VALUE;
    }
    return CG_OK;
}

/* Working state of one assemble call. */
typedef struct job {
    int32_t **toks;
    uint32_t *lens, *offs;
    cg_role *roles;
    cg_key *keys;
    cg_attn_span *spans;
    uint8_t *hit, *stored;
    const char **tier;
    int32_t *all; /* the concatenated tokens (reference paths) */
    cg_kv *scratch;
    cg_pool_evictions ev;      /* RAM evictions */
    cg_pool_evictions dropped; /* disk records dropped by spills */
} job;

static void job_free(job *j, size_t n)
{
    for (size_t i = 0; j->toks && i < n; i++)
        free(j->toks[i]);
    free(j->toks);
    free(j->lens);
    free(j->offs);
    free(j->roles);
    free(j->keys);
    free(j->spans);
    free(j->hit);
    free(j->stored);
    free(j->tier);
    free(j->all);
    cg_kv_free(&j->scratch);
    cg_pool_evictions_free(&j->ev);
    cg_pool_evictions_free(&j->dropped);
}

static int key_in(const cg_key *v, size_t n, const cg_key *k)
{
    for (size_t i = 0; i < n; i++)
        if (cg_key_equal(&v[i], k)) return 1;
    return 0;
}

/* Sorts the keys that left RAM (or the disk) during a request into what the gateway must
 * learn, now that the pool lock is free: still in RAM (restored again meanwhile, or only its
 * disk copy went): nothing; on disk: spilled; neither: evicted. */
static void classify_departures(cg_engine *e, const job *j, cg_assembly_info *out)
{
    size_t n = j->ev.n + j->dropped.n;
    if (!n) return;
    out->evicted = cg_malloc(n * sizeof *out->evicted);
    out->spilled = cg_malloc(n * sizeof *out->spilled);
    for (size_t i = 0; i < n; i++) {
        const cg_key *k = i < j->ev.n ? &j->ev.keys[i] : &j->dropped.keys[i - j->ev.n];
        if (key_in(out->evicted, out->n_evicted, k) || key_in(out->spilled, out->n_spilled, k))
            continue;
        cg_pool_chunk_info pi;
        if (cg_pool_peek(e->pool, k, &pi) == CG_OK) continue;
        if (e->disk && cg_disk_contains(e->disk, k))
            out->spilled[out->n_spilled++] = *k;
        else
            out->evicted[out->n_evicted++] = *k;
    }
}

/* Runs one forward and counts its tokens. */
static cg_status fwd(cg_engine *e, cg_kv *kv, const int32_t *t, uint32_t n, uint32_t slot,
                     cg_attn_span span, float *logits, uint32_t *computed)
{
    *computed += n;
    return cg_model_forward(e->m, kv, t, n, slot, slot, &span, 1, logits);
}

cg_status cg_engine_assemble(cg_engine *e, const cg_assemble_req *req, uint64_t now,
                             cg_assembly_info *out, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    const size_t n = req->n_segs;
    const int cached = req->path == CG_PATH_CACHED;
    job j = {0};
    assembly *a = NULL;
    int locked = 0;
    uint32_t total = 0, computed = 0, hits = 0, misses = 0, reused = 0, disk_hits = 0;
    cg_status st;
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';

    if ((st = check_segments(req, err, errlen)) != CG_OK) return st;
    cg_engine_reap(e, now);

    /* Each segment is tokenized on its own, so the same text always gives the same tokens
     * and a key over text identifies its KV (DESIGN §4). */
    j.toks = cg_calloc(n, sizeof *j.toks);
    j.lens = cg_calloc(n, sizeof *j.lens);
    j.offs = cg_calloc(n, sizeof *j.offs);
    j.roles = cg_calloc(n, sizeof *j.roles);
    j.keys = cg_calloc(n, sizeof *j.keys);
    j.hit = cg_calloc(n, 1);
    j.stored = cg_calloc(n, 1);
    j.tier = cg_calloc(n, sizeof *j.tier);
    uint32_t max_chunk = 0;
    for (size_t i = 0; i < n; i++) {
        const cg_engine_seg *s = &req->segs[i];
        if (s->len > (size_t)cfg->max_pos) {
            cg_seterr(err, errlen, "segments[%zu] has %zu bytes; the model holds %d positions", i,
                   s->len, cfg->max_pos);
            st = CG_E_CONTEXT;
            goto out;
        }
        j.toks[i] = cg_malloc((s->len + 1) * sizeof(int32_t));
        j.lens[i] =
            (uint32_t)cg_tok_encode(e->m, s->text, s->len, s->role == CG_ROLE_SYSTEM, j.toks[i]);
        j.roles[i] = s->role;
        j.offs[i] = total;
        if ((uint64_t)total + j.lens[i] > (uint64_t)cfg->max_pos) {
            cg_seterr(err, errlen, "the prompt needs more than the model's %d positions",
                   cfg->max_pos);
            st = CG_E_CONTEXT;
            goto out;
        }
        total += j.lens[i];
        if (s->role == CG_ROLE_CHUNK) max_chunk = CG_MAX(max_chunk, j.lens[i]);
    }
    const int has_sys = j.roles[0] == CG_ROLE_SYSTEM;
    const uint32_t s_len = has_sys ? j.lens[0] : 0;
    cg_key_seg *ks = cg_malloc(n * sizeof *ks);
    for (size_t i = 0; i < n; i++)
        ks[i] = (cg_key_seg){req->segs[i].role, req->segs[i].text, req->segs[i].len};
    cg_key_scope scope = {cfg->model_id, strlen(cfg->model_id), req->mode, req->salt,
                          req->salt_len};
    cg_key_request(&scope, ks, n, 1, j.keys);
    free(ks);
    for (size_t i = 0; i < n; i++) {
        const cg_engine_seg *s = &req->segs[i];
        /* A client-supplied key must name exactly this text, or it could plant KV under
         * another chunk's key. */
        if (s->key && !cg_key_equal(s->key, &j.keys[i])) {
            char want[CG_KEY_HEX_LEN + 1];
            cg_key_hex(&j.keys[i], want);
            cg_seterr(err, errlen, "segments[%zu].key does not match its text (expected %s)", i, want);
            st = CG_E_KEY_MISMATCH;
            goto out;
        }
    }

    pthread_mutex_lock(&e->mu);
    locked = 1;
    tl_dropped = &j.dropped;
    pthread_mutex_lock(&e->amu);
    size_t live = e->n_live;
    pthread_mutex_unlock(&e->amu);
    if (live >= e->p.max_assemblies) {
        cg_seterr(err, errlen, "%zu assemblies are live (the limit); consume or release some", live);
        st = CG_E_UNAVAILABLE;
        goto out;
    }

    a = cg_calloc(1, sizeof *a);
    a->n_tokens = total;
    a->logits = cg_malloc((size_t)cfg->vocab_size * sizeof(float));
    a->chunks = cg_calloc(n, sizeof *a->chunks);
    int64_t reserve = req->reserve_tokens < 0 ? (int64_t)e->p.reserve_tokens : req->reserve_tokens;
    uint64_t cap = CG_MIN((uint64_t)total + (uint64_t)reserve, (uint64_t)cfg->max_pos);
    a->kv = kv_get(e, (uint32_t)CG_MAX(cap, 1));
    if (!a->kv) {
        st = CG_E_INTERNAL;
        goto out;
    }

    if (req->path == CG_PATH_REFERENCE || req->path == CG_PATH_CAUSAL) {
        /* One forward over the whole prompt at true positions: the ground truth the cached
         * path is compared with. */
        j.all = cg_malloc((size_t)total * sizeof(int32_t));
        for (size_t i = 0; i < n; i++)
            memcpy(j.all + j.offs[i], j.toks[i], j.lens[i] * sizeof(int32_t));
        j.spans = cg_calloc(n, sizeof *j.spans);
        size_t ns = 1;
        if (req->path == CG_PATH_REFERENCE)
            ns = cg_attn_plan(j.roles, j.lens, n, req->mode, j.spans);
        else
            j.spans[0] = (cg_attn_span){0, total, 0, 0};
        computed = total;
        st = cg_model_forward(e->m, a->kv, j.all, total, 0, 0, j.spans, ns, a->logits);
        if (st != CG_OK) goto out;
        goto done;
    }

    int have_logits = 0;
    const size_t last = n - 1;
    for (size_t i = 0; i < n; i++) {
        const uint32_t p = j.offs[i], len = j.lens[i];
        float *lg = i == last ? a->logits : NULL;
        if (j.roles[i] == CG_ROLE_QUESTION) continue; /* after the recompute below */
        cg_pool_chunk *c = NULL;
        cached_kv hit;
        /* Keys carry no role: a system text equal to a chunk text has the same strict key
         * but one more token (BOS); lookup refuses a chunk of another length. */
        if (cached && lookup(e, &j.keys[i], len, now, &j.ev, &hit) == CG_OK) {
            /* Hit: the system segment sits at its virtual position already (delta 0); a
             * chunk was computed at v = 0 (strict) or v = s (sys). */
            int64_t v = j.roles[i] == CG_ROLE_SYSTEM ? 0 : req->mode == CG_MODE_SYS ? s_len : 0;
            place_cached(e, a->kv, p, &hit, (int64_t)p - v);
            if (hit.c) {
                a->chunks[a->n_chunks++] = hit.c;
                hit.c = NULL;
            }
            cached_drop(e, &hit, now);
            j.hit[i] = 1;
            j.tier[i] = hit.tier;
            hits++;
            disk_hits += hit.tier[0] == 'd';
            reused += len;
            continue;
        }
        if (cached) misses++;
        if (j.roles[i] == CG_ROLE_SYSTEM) {
            /* The system segment is plain causal at slot 0 = its virtual position. */
            st = fwd(e, a->kv, j.toks[i], len, 0, (cg_attn_span){0, len, 0, 0}, lg, &computed);
            if (st != CG_OK) goto out;
            have_logits |= lg != NULL;
            if (cached && store(e, &j.keys[i], a->kv, 0, len, now, &j.ev, &c) == CG_OK) {
                a->chunks[a->n_chunks++] = c;
                j.stored[i] = 1;
            }
        } else {
            /* A chunk miss is computed where it will be stored: alone at v = 0 (strict), or
             * right after the system segment at v = s (sys), in a scratch KV. */
            const uint32_t v = req->mode == CG_MODE_SYS ? s_len : 0;
            if (!j.scratch) {
                j.scratch = cg_kv_new(e->m, v + max_chunk);
                if (v) copy_slots(e->m, j.scratch, a->kv, v);
            }
            st =
                fwd(e, j.scratch, j.toks[i], len, v, (cg_attn_span){v, len, v, v}, NULL, &computed);
            if (st != CG_OK) goto out;
            if (cached && store(e, &j.keys[i], j.scratch, v, len, now, &j.ev, &c) == CG_OK) {
                a->chunks[a->n_chunks++] = c;
                place_from_pool(e, a->kv, p, c, (int64_t)p - v);
                j.stored[i] = 1;
            } else {
                place_from_kv(e, a->kv, p, j.scratch, v, len, (int64_t)p - v);
            }
        }
    }

    /* EPIC LegoLink: the first k tokens of each chunk get full causal context, in prompt
     * order; the pool keeps the isolated version. */
    uint32_t k = req->recompute_prefix_tokens;
    int last_recomputed = 0;
    for (size_t i = 0; k && i < n; i++) {
        if (j.roles[i] != CG_ROLE_CHUNK) continue;
        uint32_t kk = CG_MIN(k, j.lens[i]);
        float *lg = i == last && kk == j.lens[i] ? a->logits : NULL;
        st = fwd(e, a->kv, j.toks[i], kk, j.offs[i], (cg_attn_span){j.offs[i], kk, 0, 0}, lg,
                 &computed);
        if (st != CG_OK) goto out;
        if (lg) have_logits = last_recomputed = 1;
    }
    if (j.roles[last] == CG_ROLE_QUESTION) {
        st = fwd(e, a->kv, j.toks[last], j.lens[last], j.offs[last],
                 (cg_attn_span){j.offs[last], j.lens[last], 0, 0}, a->logits, &computed);
        if (st != CG_OK) goto out;
        have_logits = 1;
    }
    if (!have_logits) {
        /* The prompt ends in a segment taken from the pool: run its last token again, under
         * the span it had, to get the logits (its K/V come out the same). */
        uint32_t slot = total - 1;
        cg_attn_span sp = {slot, 1, 0, 0};
        if (j.roles[last] == CG_ROLE_CHUNK && !last_recomputed) {
            sp.own_start = j.offs[last];
            sp.prefix = req->mode == CG_MODE_SYS ? s_len : 0;
        }
        st = fwd(e, a->kv, j.toks[last] + j.lens[last] - 1, 1, slot, sp, a->logits, &computed);
        if (st != CG_OK) goto out;
    }

done:
    a->cached_tokens = reused;
    a->expires = now + e->p.assembly_ttl_ms;
    random_id(a->id);

    out->segs = cg_calloc(n, sizeof *out->segs);
    out->n_segs = n;
    for (size_t i = 0; i < n; i++) {
        cg_engine_seg_result *r = &out->segs[i];
        r->key = j.keys[i];
        r->role = j.roles[i];
        r->offset = j.offs[i];
        r->n_tokens = j.lens[i];
        r->hit = j.hit[i];
        r->stored = j.stored[i];
        r->tier = r->hit ? j.tier[i] : "miss";
    }
    out->n_tokens = total;
    out->cached_tokens = reused;
    out->computed_tokens = computed;
    out->ttl_ms = e->p.assembly_ttl_ms;
    memcpy(out->id, a->id, sizeof out->id);
    tl_dropped = NULL;
    classify_departures(e, &j, out);
    if (req->logits_out)
        memcpy(req->logits_out, a->logits, (size_t)cfg->vocab_size * sizeof(float));

    pthread_mutex_lock(&e->amu);
    a->next = e->live;
    e->live = a;
    e->n_live++;
    e->stats.assemblies_created++;
    e->stats.chunk_hits += hits;
    e->stats.disk_hits += disk_hits;
    e->stats.chunk_misses += misses;
    e->stats.tokens_reused += reused;
    e->stats.tokens_computed += total - reused;
    e->stats.prefill_tokens += computed;
    e->stats.evictions += j.ev.n;
    pthread_mutex_unlock(&e->amu);
    a = NULL;
    st = CG_OK;
out:
    tl_dropped = NULL;
    if (locked) pthread_mutex_unlock(&e->mu);
    if (st != CG_OK && j.ev.n) {
        /* Evictions happened even though the request failed: keep the count exact. */
        pthread_mutex_lock(&e->amu);
        e->stats.evictions += j.ev.n;
        pthread_mutex_unlock(&e->amu);
    }
    assembly_free(e, &a, now);
    job_free(&j, n);
    if (st != CG_OK) cg_assembly_info_free(out);
    return st;
}

/* ---- decode ---- */

void cg_complete_result_free(cg_complete_result *r)
{
    if (!r) return;
    cg_free(&r->text);
    cg_free(&r->tokens);
    r->text_len = r->n_tokens = 0;
}

/* Moves an assembly's KV into a bigger buffer so decoding can go on past its reserve. */
static void grow_kv(cg_engine *e, assembly *a, uint32_t used)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    uint64_t cap =
        CG_MIN(CG_MAX((uint64_t)cg_kv_cap(a->kv) * 2, (uint64_t)used + e->p.reserve_tokens),
               (uint64_t)cfg->max_pos);
    cg_kv *kv = kv_get(e, (uint32_t)cap);
    copy_slots(e->m, kv, a->kv, used);
    kv_put(e, &a->kv);
    a->kv = kv;
}

/* The KV of a plain prompt: BOS + bytes, one causal forward, no cache. */
static cg_status plain_prompt(cg_engine *e, const char *text, size_t len, assembly **out, char *err,
                              size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    *out = NULL;
    if (len + 1 > (size_t)cfg->max_pos) {
        cg_seterr(err, errlen, "the prompt needs %zu positions; the model holds %d", len + 1,
               cfg->max_pos);
        return CG_E_CONTEXT;
    }
    int32_t *t = cg_malloc((len + 1) * sizeof *t);
    uint32_t n = (uint32_t)cg_tok_encode(e->m, text, len, 1, t);
    assembly *a = cg_calloc(1, sizeof *a);
    a->n_tokens = n;
    a->logits = cg_malloc((size_t)cfg->vocab_size * sizeof(float));
    a->kv = kv_get(e, (uint32_t)CG_MIN((uint64_t)n + e->p.reserve_tokens, (uint64_t)cfg->max_pos));
    uint32_t computed = 0;
    pthread_mutex_lock(&e->mu);
    cg_status st = fwd(e, a->kv, t, n, 0, (cg_attn_span){0, n, 0, 0}, a->logits, &computed);
    pthread_mutex_unlock(&e->mu);
    free(t);
    if (st != CG_OK) {
        assembly_free(e, &a, 0);
        return st;
    }
    pthread_mutex_lock(&e->amu);
    e->stats.tokens_computed += n;
    e->stats.prefill_tokens += computed;
    pthread_mutex_unlock(&e->amu);
    *out = a;
    return CG_OK;
}

cg_status cg_engine_complete(cg_engine *e, const cg_complete_req *req, uint64_t now,
                             cg_complete_result *out, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    assembly *a = NULL;
    float *logits = NULL;
    size_t cap_tok = 0;
    cg_status st = CG_OK;
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';
    cg_engine_reap(e, now);

    if (req->assembly_id) {
        a = take(e, req->assembly_id); /* consumed: DELETE and the reaper no longer see it */
        if (!a) {
            cg_seterr(err, errlen, "assembly '%.64s' is unknown, expired or already consumed",
                   req->assembly_id);
            return CG_E_NOT_FOUND;
        }
    } else {
        st = plain_prompt(e, req->prompt ? req->prompt : "", req->prompt ? req->prompt_len : 0, &a,
                          err, errlen);
        if (st != CG_OK) return st;
    }

    cg_sampler smp = {req->temperature, req->top_p, req->seed};
    logits = cg_malloc((size_t)cfg->vocab_size * sizeof(float));
    memcpy(logits, a->logits, (size_t)cfg->vocab_size * sizeof(float));
    uint32_t pos = a->n_tokens;
    out->finish_reason = "length";
    out->text = cg_malloc(1);
    out->text[0] = '\0';
    for (uint32_t i = 0; i < req->max_tokens; i++) {
        if (req->on_logits) req->on_logits(req->ud, logits, cfg->vocab_size);
        int32_t tok = cg_sample(&smp, logits, cfg->vocab_size);
        if (tok == cfg->eos_id) {
            out->finish_reason = "stop";
            break;
        }
        if (out->n_tokens == cap_tok) {
            cap_tok = cap_tok ? cap_tok * 2 : 64;
            out->tokens = cg_realloc(out->tokens, cap_tok * sizeof *out->tokens);
            out->text = cg_realloc(out->text, cap_tok * 4 + 1);
        }
        out->tokens[out->n_tokens++] = tok;
        char bytes[4];
        size_t nb = cg_tok_decode(e->m, tok, bytes);
        memcpy(out->text + out->text_len, bytes, nb);
        out->text_len += nb;
        out->text[out->text_len] = '\0';
        if (req->on_token && req->on_token(req->ud, tok, bytes, nb) != 0) {
            out->cancelled = 1;
            out->finish_reason = "stop";
            break;
        }
        if (i + 1 == req->max_tokens) break;
        if (pos >= (uint32_t)cfg->max_pos) break; /* no position left: "length" */
        if (pos >= cg_kv_cap(a->kv)) grow_kv(e, a, pos);
        uint32_t computed = 0;
        pthread_mutex_lock(&e->mu);
        st = fwd(e, a->kv, &tok, 1, pos, (cg_attn_span){pos, 1, 0, 0}, logits, &computed);
        pthread_mutex_unlock(&e->mu);
        if (st != CG_OK) {
            cg_seterr(err, errlen, "decode step at position %u failed", pos);
            goto out;
        }
        pos++;
    }
    out->prompt_tokens = a->n_tokens;
    out->completion_tokens = (uint32_t)out->n_tokens;
    out->cached_tokens = a->cached_tokens;
    pthread_mutex_lock(&e->amu);
    e->stats.decode_tokens += out->n_tokens;
    pthread_mutex_unlock(&e->amu);
out:
    free(logits);
    assembly_free(e, &a, now);
    if (st != CG_OK) cg_complete_result_free(out);
    return st;
}

/* ---- export, delete ---- */

static cg_status check_heads(const cg_engine *e, int h0, int h1)
{
    return h0 < 0 || h1 < h0 || h1 >= cg_model_cfg(e->m)->n_kv_heads ? CG_E_VALUE : CG_OK;
}

cg_status cg_engine_chunk_kv(cg_engine *e, const cg_key *key, int h0, int h1, void **out,
                             size_t *len, uint32_t *tokens)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    *out = NULL;
    *len = 0;
    *tokens = 0;
    if (check_heads(e, h0, h1) != CG_OK) return CG_E_VALUE;
    /* A reference (or the private copy of a chunk read from disk) keeps the blocks alive
     * while they are copied out. */
    cached_kv c;
    cg_pool_evictions ev = {0};
    cg_status st = lookup(e, key, 0, cg_now_ms(), &ev, &c);
    if (ev.n) { /* reading a chunk back from disk made room in RAM */
        pthread_mutex_lock(&e->amu);
        e->stats.evictions += ev.n;
        pthread_mutex_unlock(&e->amu);
    }
    cg_pool_evictions_free(&ev);
    if (st != CG_OK) return CG_E_NOT_FOUND;
    uint32_t nt = c.n_tokens;
    const size_t hd = (size_t)cfg->head_dim, plane = (size_t)nt * hd;
    float *buf =
        cg_malloc((size_t)(h1 - h0 + 1) * (size_t)cfg->n_layers * 2 * plane * sizeof(float) + 1);
    float *w = buf;
    for (int h = h0; h <= h1; h++)
        for (int l = 0; l < cfg->n_layers; l++)
            for (int which = 0; which < 2; which++)
                for (uint32_t b = 0; b < c.n_blocks; b++) {
                    uint32_t nr = 0;
                    const float *rows = cached_rows(e, &c, b, l, h, which, &nr);
                    memcpy(w, rows, (size_t)nr * hd * sizeof(float));
                    w += (size_t)nr * hd;
                }
    cached_drop(e, &c, cg_now_ms());
    *out = buf;
    *len = (size_t)(w - buf) * sizeof(float);
    *tokens = nt;
    return CG_OK;
}

cg_status cg_engine_assembly_kv(cg_engine *e, const char *assembly_id, int h0, int h1, uint64_t now,
                                void **out, size_t *len, uint32_t *tokens)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    *out = NULL;
    *len = 0;
    *tokens = 0;
    if (check_heads(e, h0, h1) != CG_OK) return CG_E_VALUE;
    cg_engine_reap(e, now);
    cg_status st = CG_E_NOT_FOUND;
    /* Copied under the table lock, so the assembly cannot be consumed or released meanwhile. */
    pthread_mutex_lock(&e->amu);
    for (assembly *a = e->live; a; a = a->next) {
        if (strcmp(a->id, assembly_id) != 0) continue;
        size_t plane = (size_t)a->n_tokens * (size_t)cfg->head_dim;
        float *buf = cg_malloc(
            (size_t)(h1 - h0 + 1) * (size_t)cfg->n_layers * 2 * plane * sizeof(float) + 1);
        float *w = buf;
        for (int h = h0; h <= h1; h++)
            for (int l = 0; l < cfg->n_layers; l++) {
                memcpy(w, cg_kv_k(a->kv, l, h), plane * sizeof(float));
                w += plane;
                memcpy(w, cg_kv_v(a->kv, l, h), plane * sizeof(float));
                w += plane;
            }
        *out = buf;
        *len = (size_t)(w - buf) * sizeof(float);
        *tokens = a->n_tokens;
        st = CG_OK;
        break;
    }
    pthread_mutex_unlock(&e->amu);
    return st;
}

cg_status cg_engine_chunk_delete(cg_engine *e, const cg_key *key)
{
    cg_pool_chunk_info info;
    /* Only live assemblies (and a moment's export) hold references: deleting a chunk an
     * assembly still uses is refused rather than deferred, so the caller learns of it. */
    if (cg_pool_peek(e->pool, key, &info) == CG_OK && info.refs > 0) return CG_E_CONFLICT;
    /* RAM first, then disk: an eviction between the two spills the chunk to disk, where the
     * second step finds it. A chunk being read back (filling) leaves the pool index too: its
     * reader uses its blocks once and frees them. */
    int deferred = 0, found = 0;
    found |= cg_pool_remove(e->pool, key, &deferred) == CG_OK;
    if (e->disk) {
        cg_status st = cg_disk_remove(e->disk, key);
        if (st == CG_E_IO) return st;
        found |= st == CG_OK;
    }
    return found ? CG_OK : CG_E_NOT_FOUND;
}

typedef struct flush_item {
    cg_key key;
    uint64_t last_used;
} flush_item;

typedef struct flush_list {
    flush_item *v;
    size_t n, cap;
} flush_list;

static void flush_add(void *ud, const cg_pool_chunk_info *info)
{
    flush_list *l = ud;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = cg_realloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = (flush_item){info->key, info->last_used};
}

static int cmp_last_used(const void *x, const void *y)
{
    uint64_t a = ((const flush_item *)x)->last_used, b = ((const flush_item *)y)->last_used;
    return a < b ? -1 : a > b;
}

size_t cg_engine_flush(cg_engine *e, uint64_t now)
{
    if (!e->disk) return 0;
    flush_list l = {0};
    cg_pool_foreach(e->pool, flush_add, &l);
    if (l.n) qsort(l.v, l.n, sizeof *l.v, cmp_last_used);
    /* The disk orders its records by the wall-clock time of their last use: translate the
     * pool's monotonic times so the LRU order survives the restart. */
    const uint64_t wall = cg_wall_ms(), mono = cg_now_ms();
    size_t done = 0;
    for (size_t i = 0; i < l.n; i++) {
        cg_pool_chunk *c = NULL;
        if (cg_pool_get(e->pool, &l.v[i].key, now, &c) != CG_OK) continue; /* gone meanwhile */
        uint64_t age = mono > l.v[i].last_used ? mono - l.v[i].last_used : 0;
        cg_disk_pool_src src = {e->pool, c};
        cg_status st = cg_disk_put(e->disk, &l.v[i].key, cg_pool_chunk_tokens(c),
                                   cg_disk_pool_block, &src, wall > age ? wall - age : wall, NULL);
        done += st == CG_OK;
        cg_pool_release(e->pool, &c, now);
    }
    free(l.v);
    return done;
}

/* ---- assemblies made or read elsewhere (backend role) ---- */

int cg_engine_has_assembly(cg_engine *e, const char *assembly_id, uint64_t now)
{
    cg_engine_reap(e, now);
    int yes = 0;
    pthread_mutex_lock(&e->amu);
    for (assembly *a = e->live; a && !yes; a = a->next)
        yes = strcmp(a->id, assembly_id) == 0;
    pthread_mutex_unlock(&e->amu);
    return yes;
}

cg_status cg_engine_assembly_logits(cg_engine *e, const char *assembly_id, uint64_t now, float *out,
                                    uint32_t *n_tokens, uint32_t *cached_tokens)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    cg_engine_reap(e, now);
    cg_status st = CG_E_NOT_FOUND;
    pthread_mutex_lock(&e->amu);
    for (assembly *a = e->live; a; a = a->next) {
        if (strcmp(a->id, assembly_id) != 0) continue;
        memcpy(out, a->logits, (size_t)cfg->vocab_size * sizeof(float));
        *n_tokens = a->n_tokens;
        *cached_tokens = a->cached_tokens;
        st = CG_OK;
        break;
    }
    pthread_mutex_unlock(&e->amu);
    return st;
}

cg_status cg_engine_adopt(cg_engine *e, cg_kv **kvp, uint32_t n_tokens, uint32_t cached_tokens,
                          const float *logits, uint64_t now, char id_out[33])
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    cg_kv *kv = *kvp;
    *kvp = NULL;
    id_out[0] = '\0';
    if (!kv || n_tokens == 0 || n_tokens > cg_kv_cap(kv) || n_tokens > (uint32_t)cfg->max_pos ||
        cached_tokens > n_tokens) {
        cg_kv_free(&kv);
        return CG_E_VALUE;
    }
    cg_engine_reap(e, now);
    assembly *a = cg_calloc(1, sizeof *a);
    a->kv = kv;
    a->n_tokens = n_tokens;
    a->cached_tokens = cached_tokens;
    a->logits = cg_malloc((size_t)cfg->vocab_size * sizeof(float));
    memcpy(a->logits, logits, (size_t)cfg->vocab_size * sizeof(float));
    a->expires = now + e->p.assembly_ttl_ms;
    random_id(a->id);
    cg_status st = CG_E_UNAVAILABLE;
    pthread_mutex_lock(&e->amu);
    if (e->n_live < e->p.max_assemblies) {
        a->next = e->live;
        e->live = a;
        e->n_live++;
        e->stats.assemblies_adopted++;
        memcpy(id_out, a->id, 33);
        a = NULL;
        st = CG_OK;
    }
    pthread_mutex_unlock(&e->amu);
    assembly_free(e, &a, now);
    return st;
}
