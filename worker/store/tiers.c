/* The worker's chunk KV tiers: RAM pool, disk tier (with its write-behind), remote tier, and
 * the one path by which a chunk's rows enter a request's KV (worker/store/tiers.h). */
#include "worker/store/tiers.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/base.h"
#include "kv/kvwire.h"
#include "kv/remap.h"
#include "worker/store/diskwb.h"

const double cg_tiers_remote_read_bounds[CG_TIERS_REMOTE_BOUNDS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

struct cg_tiers {
    const cg_model *m;
    cg_tiers_params p;
    cg_pool *pool;
    cg_disk *disk;     /* NULL without a disk tier */
    cg_diskwb *wb;     /* NULL without a disk write-behind */
    cg_remote *remote; /* borrowed; NULL without a remote tier */
    size_t block_bytes;
    cg_rope rope;
    /* Counted inside the pool's eviction callback (pool lock held) and by request threads:
     * atomics. */
    uint64_t n_spills, n_spill_failures, n_restores, n_restore_failures;
    uint64_t n_rhits, n_rmisses, n_rinvalid, n_rerrors, n_rskipped, n_rbytes, n_rputs, n_rdrops;
    uint64_t rlat[CG_TIERS_REMOTE_BOUNDS + 1], rlat_ns;
};

static void count(uint64_t *c, uint64_t v)
{
    __atomic_add_fetch(c, v, __ATOMIC_RELAXED);
}

static uint64_t load(const uint64_t *c)
{
    return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* Disk records dropped (LRU) by the spills this thread makes while an assemble collects them
 * for its reply. Spills run in the pool's eviction callback, which cg_pool_insert calls on
 * the inserting thread, so a thread-local pointer reaches exactly this request's list. */
static _Thread_local cg_pool_evictions *tl_dropped;

void cg_tiers_collect(cg_tiers *t, cg_pool_evictions *dropped)
{
    (void)t;
    tl_dropped = dropped;
}

/* The pool's eviction callback: the chunk goes to disk instead of being dropped.
 *
 * It runs with the pool lock held, so the write is synchronous under that lock (lock order:
 * pool, then disk; the disk never calls the pool). Chosen over a copy and a background
 * writer because it keeps every chunk in exactly one visible place at every moment the pool
 * lock is free: in RAM, or committed on disk, or gone. A queue of pending spills would need
 * its own lookup, delete and shutdown rules. The cost is bounded and measured (bench/README.md,
 * "Disk tier"): a page-cache pwritev plus one SQLite commit per evicted chunk, paid by the
 * request that needs the room; other pool users (release, export, inventory) wait that long
 * at most. */
static void spill(void *ud, const cg_key *key, const cg_pool_chunk *c)
{
    cg_tiers *t = ud;
    cg_disk_pool_src src = {t->pool, c};
    uint32_t nt = cg_pool_chunk_tokens(c);
    cg_pool_evictions dropped = {0};
    cg_status st = cg_disk_put(t->disk, key, nt, cg_disk_pool_block, &src, cg_wall_ms(),
                               t->p.events || tl_dropped ? &dropped : NULL);
    /* Records the disk dropped to make room left the disk tier; the gateway keeps a RAM
     * placement that names the same chunk (only a disk placement is removed). */
    for (size_t i = 0; i < dropped.n; i++) {
        cg_events_emit(t->p.events, CG_CHUNKEVENT_EVICTED, &dropped.keys[i], CG_TIER_DISK, 0);
        cg_pool_evictions_add(tl_dropped, &dropped.keys[i]);
    }
    cg_pool_evictions_free(&dropped);
    __atomic_add_fetch(st == CG_OK ? &t->n_spills : &t->n_spill_failures, 1, __ATOMIC_RELAXED);
    cg_events_emit(t->p.events, st == CG_OK ? CG_CHUNKEVENT_SPILLED : CG_CHUNKEVENT_EVICTED, key,
                   st == CG_OK ? CG_TIER_DISK : CG_TIER_RAM, nt);
    if (st != CG_OK) {
        char hex[CG_KEY_HEX_LEN + 1];
        cg_key_hex(key, hex);
        cg_log(CG_LOG_INFO, "chunk %s evicted from RAM and not spilled (%s): dropped", hex,
               cg_status_name(st));
    }
}

/* The disk write-behind's hook (events on): records it dropped left the disk tier, and a chunk
 * it wrote that is not in RAM (RAM refused it) is now held by the disk tier only. A chunk also
 * in RAM keeps its RAM placement: nothing to announce. */
static void wb_written(void *ud, const cg_key *key, uint32_t n_tokens, int ok,
                       const cg_pool_evictions *dropped)
{
    cg_tiers *t = ud;
    for (size_t i = 0; i < dropped->n; i++)
        cg_events_emit(t->p.events, CG_CHUNKEVENT_EVICTED, &dropped->keys[i], CG_TIER_DISK, 0);
    cg_pool_chunk_info pi;
    if (ok && cg_pool_peek(t->pool, key, &pi) != CG_OK)
        cg_events_emit(t->p.events, CG_CHUNKEVENT_STORED, key, CG_TIER_DISK, n_tokens);
}

/* The pool's eviction callback without a disk tier: the chunk is gone from the worker. */
static void evicted(void *ud, const cg_key *key, const cg_pool_chunk *c)
{
    cg_tiers *t = ud;
    cg_events_emit(t->p.events, CG_CHUNKEVENT_EVICTED, key, CG_TIER_RAM, cg_pool_chunk_tokens(c));
}

/* What else the data dir holds: the tiers of other models or weights (kv-* directories), and
 * the files of the layout before the KV model named the directory (kv.blocks and kv.db in
 * the data dir itself). Kept, as the user's, and said once: --disk-mb bounds this tier only. */
static void other_tiers(const char *base, const char *mine)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/kv.blocks", base);
    if (stat(path, &sb) == 0)
        cg_log(CG_LOG_INFO,
               "disk: %s and kv.db beside it hold KV of an earlier layout (%lld bytes "
               "allocated), which this worker does not read; delete them to reclaim the space",
               path, (long long)sb.st_blocks * 512);
    DIR *d = opendir(base);
    if (!d) return;
    const char *me = strrchr(mine, '/') ? strrchr(mine, '/') + 1 : mine;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "kv-", 3) && strcmp(e->d_name, me))
            cg_log(CG_LOG_INFO,
                   "disk: %s/%s is the tier of another model or weights, kept for when it "
                   "is served again; delete it when it no longer is",
                   base, e->d_name);
    closedir(d);
}

int cg_tiers_disk_dir(const cg_model_config *c, const char *base, char *out, size_t cap)
{
    char name[sizeof c->kv_model];
    size_t n = 0;
    for (const char *s = c->kv_model; *s && n + 1 < sizeof name; s++)
        name[n++] = (isalnum((unsigned char)*s) || *s == '.' || *s == '-' || *s == '_') ? *s : '_';
    name[n] = '\0';
    /* the id's own hash keeps two ids that read alike here ("org/m", "org_m") apart */
    int k = snprintf(out, cap, "%s/kv-%s-%08x", base, name,
                     (unsigned)(XXH3_64bits(c->model_id, strlen(c->model_id)) & 0xffffffffu));
    return k < 0 || (size_t)k >= cap ? -1 : 0;
}

cg_status cg_tiers_open(const cg_model *m, const cg_tiers_params *p, cg_tiers **out)
{
    *out = NULL;
    const cg_model_config *c = cg_model_cfg(m);
    cg_tiers *t = cg_calloc(1, sizeof *t);
    t->m = m;
    t->p = *p;
    t->p.disk_dir = NULL; /* borrowed for open only */
    t->rope = cg_model_rope(m);
    cg_pool_params pp = cg_pool_default_params();
    pp.capacity_bytes = p->pool_bytes;
    pp.block_tokens = p->block_tokens;
    pp.n_layers = c->n_layers;
    pp.n_kv_heads = c->n_kv_heads;
    pp.head_dim = c->head_dim;
    t->block_bytes = cg_pool_block_bytes(&pp);
    cg_status st = CG_OK;
    if (p->disk_bytes > 0) {
        cg_disk_params dp = cg_disk_default_params();
        char dir[4096];
        if (!p->disk_dir || !p->disk_dir[0] ||
            cg_tiers_disk_dir(c, p->disk_dir, dir, sizeof dir) != 0) {
            st = CG_E_VALUE;
            goto out;
        }
        dp.dir = dir;
        dp.capacity_bytes = p->disk_bytes;
        dp.block_bytes = t->block_bytes;
        dp.block_tokens = p->block_tokens;
        dp.n_layers = c->n_layers;
        dp.n_kv_heads = c->n_kv_heads;
        dp.head_dim = c->head_dim;
        dp.model_id = c->kv_model;
        dp.sync = p->disk_sync;
        if (mkdir(p->disk_dir, 0755) != 0 && errno != EEXIST) {
            cg_log(CG_LOG_ERROR, "disk: cannot create %s: %s", p->disk_dir, strerror(errno));
            st = CG_E_IO;
            goto out;
        }
        if ((st = cg_disk_open(dp, &t->disk)) != CG_OK) goto out;
        other_tiers(p->disk_dir, dir);
        pp.on_evict = spill;
        pp.on_evict_ud = t;
        if (p->disk_wb_items > 0) {
            cg_diskwb_params wp = cg_diskwb_default_params();
            wp.max_items = p->disk_wb_items;
            wp.max_bytes = p->disk_wb_bytes ? p->disk_wb_bytes : wp.max_bytes;
            if (p->events) {
                wp.on_written = wb_written;
                wp.on_written_ud = t;
            }
            if ((st = cg_diskwb_open(t->disk, wp, &t->wb)) != CG_OK) goto out;
        }
    }
    t->remote = p->remote;
    if (!pp.on_evict && p->events) {
        pp.on_evict = evicted;
        pp.on_evict_ud = t;
    }
    st = cg_pool_open(pp, &t->pool);
out:
    if (st != CG_OK) {
        cg_tiers_close(&t);
        return st;
    }
    *out = t;
    return CG_OK;
}

void cg_tiers_close(cg_tiers **tp)
{
    cg_tiers *t = *tp;
    if (!t) return;
    cg_diskwb_close(&t->wb); /* writes what is queued, while the disk is open */
    cg_pool_close(&t->pool);
    cg_disk_close(&t->disk);
    cg_free(tp);
}

cg_pool *cg_tiers_pool(cg_tiers *t)
{
    return t->pool;
}

cg_disk *cg_tiers_disk(cg_tiers *t)
{
    return t->disk;
}

cg_tiers_stats cg_tiers_get_stats(cg_tiers *t)
{
    cg_tiers_stats s = {
        .restores = load(&t->n_restores),
        .restore_failures = load(&t->n_restore_failures),
        .spills = load(&t->n_spills),
        .spill_failures = load(&t->n_spill_failures),
        .remote_hits = load(&t->n_rhits),
        .remote_misses = load(&t->n_rmisses),
        .remote_invalid = load(&t->n_rinvalid),
        .remote_errors = load(&t->n_rerrors),
        .remote_skipped = load(&t->n_rskipped),
        .remote_bytes_read = load(&t->n_rbytes),
        .remote_puts = load(&t->n_rputs),
        .remote_put_drops = load(&t->n_rdrops),
        .remote_read_seconds = (double)load(&t->rlat_ns) / 1e9,
    };
    for (int i = 0; i <= CG_TIERS_REMOTE_BOUNDS; i++)
        s.remote_read_buckets[i] = load(&t->rlat[i]);
    if (t->wb) s.wb = cg_diskwb_get_stats(t->wb, cg_now_ms());
    return s;
}

/* ---- placement: the one path by which a chunk's rows enter an assembly ---- */

/* Writes n rows of one plane: K is rotated by delta (R(a+b) = R(a)R(b)), V is copied. */
static void put_rows(const cg_rope *r, const float *src, float *dst, size_t n, int64_t delta,
                     int is_k)
{
    if (!is_k || delta == 0)
        memcpy(dst, src, n * (size_t)r->head_dim * sizeof(float));
    else
        cg_remap_rope(r, src, dst, n, delta);
}

void cg_tiers_drop(cg_tiers *t, cg_cached *s, uint64_t now)
{
    cg_pool_release(t->pool, &s->c, now);
    cg_free(&s->buf);
}

/* Rows [*n_rows][head_dim] of one layer/head/K-or-V in block b of a cached chunk. */
static const float *cached_rows(const cg_tiers *t, const cg_cached *s, uint32_t b, int l, int h,
                                int which, uint32_t *n_rows)
{
    if (s->c) return cg_pool_chunk_rows(t->pool, s->c, b, l, h, which, n_rows);
    /* The block layout of kv/pool.h: [head][layer][K,V][block_tokens][head_dim]. */
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t bt = t->p.block_tokens, slab = bt * (size_t)cfg->head_dim;
    *n_rows = b + 1 < s->n_blocks ? (uint32_t)bt : s->n_tokens - b * (uint32_t)bt;
    size_t i = ((size_t)h * (size_t)cfg->n_layers + (size_t)l) * 2 + (size_t)which;
    return s->buf + (size_t)b * (t->block_bytes / sizeof(float)) + i * slab;
}

void cg_tiers_place(cg_tiers *t, cg_kv *dst, uint32_t p, const cg_cached *s, int64_t delta)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t hd = (size_t)cfg->head_dim;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++)
            for (int which = 0; which < 2; which++) {
                float *out = (which ? cg_kv_v(dst, l, h) : cg_kv_k(dst, l, h)) + (size_t)p * hd;
                for (uint32_t b = 0; b < s->n_blocks; b++) {
                    uint32_t nr = 0;
                    const float *rows = cached_rows(t, s, b, l, h, which, &nr);
                    put_rows(&t->rope, rows, out, nr, delta, !which);
                    out += (size_t)nr * hd;
                }
            }
}

void cg_tiers_place_chunk(cg_tiers *t, cg_kv *dst, uint32_t p, cg_pool_chunk *c, int64_t delta)
{
    cg_cached s = {
        .c = c, .n_tokens = cg_pool_chunk_tokens(c), .n_blocks = cg_pool_chunk_blocks(c)};
    cg_tiers_place(t, dst, p, &s, delta);
}

void cg_tiers_place_rows(cg_tiers *t, cg_kv *dst, uint32_t p, cg_kv *src, uint32_t v, uint32_t n,
                         int64_t delta)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t hd = (size_t)cfg->head_dim;
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++) {
            put_rows(&t->rope, cg_kv_k(src, l, h) + (size_t)v * hd,
                     cg_kv_k(dst, l, h) + (size_t)p * hd, n, delta, 1);
            put_rows(&t->rope, cg_kv_v(src, l, h) + (size_t)v * hd,
                     cg_kv_v(dst, l, h) + (size_t)p * hd, n, delta, 0);
        }
}

/* ---- lookup and store ---- */

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
static cg_status restore(cg_tiers *t, const cg_key *key, uint32_t want, uint64_t now,
                         cg_pool_evictions *ev, cg_cached *out)
{
    cg_disk_chunk_info di;
    if (cg_disk_peek(t->disk, key, &di) != CG_OK) return CG_E_NOT_FOUND;
    if (want && di.tokens != want) {
        /* Keys carry no role: a system text equal to a chunk text has the same strict key
         * but one more token (BOS). Never mix the two. */
        cg_log(CG_LOG_WARN, "disk chunk has %u tokens, the segment %u; computing it", di.tokens,
               want);
        return CG_E_CONFLICT;
    }
    /* Making room in RAM may spill chunks, and their room on disk is made by dropping the
     * least recently used records: this one must not be among the first. */
    if (cg_disk_touch(t->disk, key, cg_wall_ms()) != CG_OK) return CG_E_NOT_FOUND;
    cg_pool_chunk *c = NULL;
    cg_status st = cg_pool_insert(t->pool, key, di.tokens, now, &c, ev);
    out->n_tokens = di.tokens;
    out->n_blocks = (uint32_t)((di.tokens + t->p.block_tokens - 1) / t->p.block_tokens);
    out->tier = CG_TIER_DISK;
    if (st == CG_OK) {
        pool_dst d = {t->pool, c};
        st = cg_disk_get(t->disk, key, di.tokens, pool_block, &d, cg_wall_ms());
        if (st == CG_OK) {
            cg_pool_publish(t->pool, c, now);
            out->c = c;
            cg_events_emit(t->p.events, CG_CHUNKEVENT_PROMOTED, key, CG_TIER_RAM, di.tokens);
        } else {
            cg_pool_release(t->pool, &c, now); /* unpublished: dropped with its bytes */
        }
    } else {
        /* RAM is full of referenced chunks, or another thread is filling this key. */
        size_t len = (size_t)out->n_blocks * t->block_bytes;
        out->buf = cg_malloc(len);
        st = cg_disk_get_buf(t->disk, key, di.tokens, out->buf, len, cg_wall_ms());
        if (st != CG_OK) cg_free(&out->buf);
    }
    if (st == CG_OK) {
        __atomic_add_fetch(&t->n_restores, 1, __ATOMIC_RELAXED);
        return CG_OK;
    }
    if (st == CG_E_IO) __atomic_add_fetch(&t->n_restore_failures, 1, __ATOMIC_RELAXED);
    memset(out, 0, sizeof *out);
    return CG_E_NOT_FOUND; /* gone meanwhile, or failed verification: a miss */
}

/* ---- the remote tier ---- */

/* The per-head key strings of a chunk: names[h] (CG_REMOTE_KEY_MAX bytes each) and keys[h]
 * pointing at them. Returns 0, or -1 when the model id cannot form a key. */
static int head_names(const cg_tiers *t, const cg_key *key, char *names, const char **keys)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(key, hex);
    for (int h = 0; h < cfg->n_kv_heads; h++) {
        char *name = names + (size_t)h * CG_REMOTE_KEY_MAX;
        if (cg_kvwire_head_key(cfg->kv_model, (uint32_t)h, hex, name, CG_REMOTE_KEY_MAX) != CG_OK)
            return -1;
        keys[h] = name;
    }
    return 0;
}

/* The header every value of this worker's chunks carries, for head 0 and n_tokens. */
static cg_kvwire_header wire_header(const cg_tiers *t, uint32_t n_tokens)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    cg_kvwire_header h;
    memset(&h, 0, sizeof h);
    snprintf(h.model, sizeof h.model, "%s", cfg->kv_model);
    h.n_layers = (uint32_t)cfg->n_layers;
    h.head_dim = (uint32_t)cfg->head_dim;
    h.dtype = CG_KVWIRE_DTYPE_F32;
    h.n_tokens = n_tokens;
    h.head_start = 0;
    h.n_heads = 1;
    h.total_kv_heads = (uint32_t)cfg->n_kv_heads;
    return h;
}

/* Queues a stored chunk for the remote tier: one sealed CGKV value per KV head. */
static void remote_put(cg_tiers *t, const cg_key *key, cg_pool_chunk *c)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t H = (size_t)cfg->n_kv_heads, nt = cg_pool_chunk_tokens(c);
    const size_t plane = nt * (size_t)cfg->head_dim;
    cg_kvwire_header h = wire_header(t, (uint32_t)nt);
    size_t hb = cg_kvwire_header_size(&h), pl = 0;
    char *names = cg_malloc(H * CG_REMOTE_KEY_MAX);
    const char **keys = cg_malloc(H * sizeof *keys);
    const void **vals = cg_malloc(H * sizeof *vals);
    size_t *lens = cg_malloc(H * sizeof *lens);
    uint8_t *buf = NULL;
    if (!hb || cg_kvwire_payload_bytes(&h, &pl) != CG_OK || head_names(t, key, names, keys) != 0)
        goto out;
    const size_t vlen = hb + pl + CG_KVWIRE_SEAL_BYTES;
    buf = cg_malloc(H * vlen);
    for (size_t i = 0; i < H; i++) {
        uint8_t *v = buf + i * vlen;
        size_t n = 0;
        h.head_start = (uint32_t)i;
        if (cg_kvwire_header_encode(&h, v, hb, &n) != CG_OK) goto out;
        float *rows = (float *)(void *)(v + hb); /* hb is a multiple of 8 */
        for (int l = 0; l < cfg->n_layers; l++)
            for (int kv = 0; kv < 2; kv++, rows += plane)
                cg_pool_chunk_read(t->pool, c, l, (int)i, kv, rows);
        cg_kvwire_seal(v, hb + pl, keys[i], v + hb + pl);
        vals[i] = v;
        lens[i] = vlen;
    }
    /* CG_E_FULL: the queue is full (counted by the client as a drop); never waits. */
    if (cg_remote_put_async_tag(t->remote, H, keys, vals, lens, nt) == CG_OK)
        count(&t->n_rputs, 1);
    else
        count(&t->n_rdrops, 1);
out:
    free(buf);
    free(lens);
    free(vals);
    free(keys);
    free(names);
}

void cg_tiers_remote_written(void *events, size_t n, const char *const *keys, uint64_t tokens,
                             cg_status st)
{
    /* keys[0] is "{model}@head:0@{hex}": the chunk key is what follows the last '@' */
    const char *at = n ? strrchr(keys[0], '@') : NULL;
    cg_key key;
    if (!at || cg_key_parse(at + 1, &key) != 0) return;
    cg_events_emit(events, st == CG_OK ? CG_CHUNKEVENT_STORED : CG_CHUNKEVENT_FAILED, &key,
                   CG_TIER_REMOTE, (uint32_t)tokens);
}

/* 1 when a decoded value is head h of a chunk of this worker's model and geometry. */
static int value_ours(const cg_tiers *t, const cg_kvwire_header *got, uint32_t h)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    cg_kvwire_header want = wire_header(t, got->n_tokens);
    return !strcmp(got->model, want.model) && got->n_layers == want.n_layers &&
           got->head_dim == want.head_dim && got->dtype == want.dtype && got->head_start == h &&
           got->n_heads == 1 && got->total_kv_heads == want.total_kv_heads &&
           got->n_tokens <= (uint32_t)cfg->max_pos;
}

/* Rows [n_tokens][head_dim] of one layer/head/kv into a private buffer in the pool's block
 * layout (what cached_rows reads). */
static void scatter_rows(const cg_tiers *t, float *buf, uint32_t n_tokens, int l, int h, int kv,
                         const float *rows)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t bt = t->p.block_tokens, hd = (size_t)cfg->head_dim, slab = bt * hd;
    const size_t i = ((size_t)h * (size_t)cfg->n_layers + (size_t)l) * 2 + (size_t)kv;
    for (size_t b = 0; b * bt < n_tokens; b++) {
        size_t nr = CG_MIN(bt, n_tokens - b * bt);
        memcpy(buf + b * (t->block_bytes / sizeof(float)) + i * slab, rows + b * slab,
               nr * hd * sizeof(float));
    }
}

static void observe_read(cg_tiers *t, uint64_t ns)
{
    int b = 0;
    double s = (double)ns / 1e9;
    while (b < CG_TIERS_REMOTE_BOUNDS && s > cg_tiers_remote_read_bounds[b])
        b++;
    count(&t->rlat[b], 1);
    count(&t->rlat_ns, ns);
}

/* Reads a chunk from the remote tier: every head's value, each verified, into a new pool
 * chunk (published, referenced) when RAM has room, else into a private buffer. */
static cg_status restore_remote(cg_tiers *t, const cg_key *key, uint32_t want, uint64_t now,
                                cg_pool_evictions *ev, cg_tiers_req *rq, cg_cached *out)
{
    if (rq && rq->remote_failed) {
        count(&t->n_rskipped, 1);
        return CG_E_NOT_FOUND;
    }
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t H = (size_t)cfg->n_kv_heads;
    char *names = cg_malloc(H * CG_REMOTE_KEY_MAX);
    const char **keys = cg_malloc(H * sizeof *keys);
    cg_remote_value *vals = cg_calloc(H, sizeof *vals);
    const float **pl = cg_calloc(H, sizeof *pl);
    cg_status st = CG_E_NOT_FOUND;
    uint32_t nt = 0;
    size_t bytes = 0;
    char hex[CG_KEY_HEX_LEN + 1];
    cg_key_hex(key, hex);
    if (head_names(t, key, names, keys) != 0) goto out;
    uint64_t ns = 0;
    cg_status gst = cg_remote_get(t->remote, H, keys, vals, &ns);
    observe_read(t, ns);
    if (gst == CG_E_NOT_FOUND) {
        count(&t->n_rmisses, 1);
        goto out;
    }
    if (gst != CG_OK) {
        count(&t->n_rerrors, 1);
        if (rq) rq->remote_failed = 1;
        cg_log(CG_LOG_DEBUG, "remote read of chunk %s failed (%s): computing it", hex,
               cg_status_name(gst));
        goto out;
    }
    for (size_t h = 0; h < H; h++) {
        cg_kvwire_header got;
        cg_status vst = cg_kvwire_unseal(vals[h].data, vals[h].len, keys[h], &got, &pl[h]);
        if (vst != CG_OK || !value_ours(t, &got, (uint32_t)h) || (h && got.n_tokens != nt)) {
            count(&t->n_rinvalid, 1);
            cg_log(CG_LOG_WARN,
                   "remote value %s (%zu bytes) is %s: not used, the chunk is computed", keys[h],
                   vals[h].len,
                   vst != CG_OK ? "corrupt or truncated (seal or format)"
                                : "of another model, geometry or head");
            goto out;
        }
        nt = got.n_tokens;
        bytes += vals[h].len;
    }
    if (want && nt != want) {
        /* Keys carry no role: see restore(). */
        cg_log(CG_LOG_WARN, "remote chunk has %u tokens, the segment %u; computing it", nt, want);
        st = CG_E_CONFLICT;
        goto out;
    }
    const size_t plane = (size_t)nt * (size_t)cfg->head_dim;
    cg_pool_chunk *c = NULL;
    out->n_tokens = nt;
    out->n_blocks = (uint32_t)((nt + t->p.block_tokens - 1) / t->p.block_tokens);
    out->tier = CG_TIER_REMOTE;
    if (cg_pool_insert(t->pool, key, nt, now, &c, ev) == CG_OK) {
        /* whole blocks reach the disk on a spill: no stale bytes past the last row */
        memset(cg_pool_chunk_block(t->pool, c, out->n_blocks - 1), 0, t->block_bytes);
        for (size_t h = 0; h < H; h++)
            for (int l = 0; l < cfg->n_layers; l++)
                for (int kv = 0; kv < 2; kv++)
                    cg_pool_chunk_write(t->pool, c, l, (int)h, kv,
                                        pl[h] + ((size_t)l * 2 + (size_t)kv) * plane);
        cg_pool_publish(t->pool, c, now);
        out->c = c;
        cg_events_emit(t->p.events, CG_CHUNKEVENT_PROMOTED, key, CG_TIER_RAM, nt);
    } else {
        /* RAM is full of referenced chunks, or another thread is filling this key. */
        out->buf = cg_calloc(out->n_blocks, t->block_bytes);
        for (size_t h = 0; h < H; h++)
            for (int l = 0; l < cfg->n_layers; l++)
                for (int kv = 0; kv < 2; kv++)
                    scatter_rows(t, out->buf, nt, l, (int)h, kv,
                                 pl[h] + ((size_t)l * 2 + (size_t)kv) * plane);
    }
    count(&t->n_rhits, 1);
    count(&t->n_rbytes, bytes);
    st = CG_OK;
out:
    cg_remote_values_free(t->remote, vals, H);
    free(pl);
    free(vals);
    free(keys);
    free(names);
    if (st != CG_OK) memset(out, 0, sizeof *out);
    return st;
}

cg_status cg_tiers_lookup(cg_tiers *t, const cg_key *key, uint32_t want, uint64_t now,
                          cg_pool_evictions *ev, cg_tiers_req *rq, cg_cached *out)
{
    memset(out, 0, sizeof *out);
    cg_pool_chunk *c = NULL;
    if (cg_pool_get(t->pool, key, now, &c) == CG_OK) {
        if (want && cg_pool_chunk_tokens(c) != want) {
            cg_log(CG_LOG_WARN, "pool chunk has %u tokens, the segment %u; computing it unstored",
                   cg_pool_chunk_tokens(c), want);
            cg_pool_release(t->pool, &c, now);
            return CG_E_CONFLICT;
        }
        out->c = c;
        out->n_tokens = cg_pool_chunk_tokens(c);
        out->n_blocks = cg_pool_chunk_blocks(c);
        out->tier = CG_TIER_RAM;
        return CG_OK;
    }
    if (t->disk) {
        cg_status st = restore(t, key, want, now, ev, out);
        if (st != CG_E_NOT_FOUND) return st; /* a hit, or a chunk of another length */
    }
    if (!t->remote) return CG_E_NOT_FOUND;
    return restore_remote(t, key, want, now, ev, rq, out);
}

/* cg_disk_src_fn over rows [v, v+n) of a request's KV: block i is gathered into one scratch
 * block in the pool's layout (what the disk tier writes), its rows past n zeroed. */
typedef struct rows_src {
    const cg_tiers *t;
    cg_kv *kv;
    uint32_t v, n;
    float *blk; /* one block */
} rows_src;

static const void *rows_block(void *ud, uint32_t b)
{
    rows_src *r = ud;
    const cg_model_config *cfg = cg_model_cfg(r->t->m);
    const size_t bt = r->t->p.block_tokens, hd = (size_t)cfg->head_dim, slab = bt * hd;
    const size_t first = (size_t)b * bt, nr = CG_MIN(bt, (size_t)r->n - first);
    memset(r->blk, 0, r->t->block_bytes);
    for (int h = 0; h < cfg->n_kv_heads; h++)
        for (int l = 0; l < cfg->n_layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                const size_t i = ((size_t)h * (size_t)cfg->n_layers + (size_t)l) * 2 + (size_t)kv;
                const float *rows = kv ? cg_kv_v(r->kv, l, h) : cg_kv_k(r->kv, l, h);
                memcpy(r->blk + i * slab, rows + ((size_t)r->v + first) * hd,
                       nr * hd * sizeof(float));
            }
    return r->blk;
}

cg_status cg_tiers_store(cg_tiers *t, const cg_key *key, cg_kv *src, uint32_t v, uint32_t n,
                         uint64_t now, cg_pool_evictions *ev, cg_pool_chunk **out)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    const size_t hd = (size_t)cfg->head_dim;
    cg_pool_chunk *c = NULL;
    *out = NULL;
    cg_status st = cg_pool_insert(t->pool, key, n, now, &c, ev);
    if (st == CG_E_FULL && t->wb && n > 0) {
        /* RAM cannot keep it (too large, or full of referenced chunks), but the disk tier may
         * have room: queue it from the request's rows, so a computed chunk is never lost only
         * because RAM was busy. */
        rows_src rs = {t, src, v, n, cg_malloc(t->block_bytes)};
        cg_status wst = cg_diskwb_put(t->wb, key, n, rows_block, &rs, cg_now_ms());
        (void)wst; /* CG_E_FULL: counted in the write-behind's drops */
        free(rs.blk);
    }
    if (st != CG_OK) return st;
    /* The rows past n in the last block are never read, but the disk tier writes and
     * checksums whole blocks: zero them so no stale bytes of an evicted chunk (or never
     * initialised memory) reach the disk. One block per stored chunk. */
    uint32_t nb = cg_pool_chunk_blocks(c);
    if (nb) memset(cg_pool_chunk_block(t->pool, c, nb - 1), 0, t->block_bytes);
    for (int l = 0; l < cfg->n_layers; l++)
        for (int h = 0; h < cfg->n_kv_heads; h++) {
            cg_pool_chunk_write(t->pool, c, l, h, 0, cg_kv_k(src, l, h) + (size_t)v * hd);
            cg_pool_chunk_write(t->pool, c, l, h, 1, cg_kv_v(src, l, h) + (size_t)v * hd);
        }
    cg_pool_publish(t->pool, c, now);
    *out = c;
    cg_events_emit(t->p.events, CG_CHUNKEVENT_STORED, key, CG_TIER_RAM, n);
    if (t->remote) remote_put(t, key, c);
    if (t->wb) {
        cg_disk_pool_src blocks = {t->pool, c};
        cg_status wst = cg_diskwb_put(t->wb, key, n, cg_disk_pool_block, &blocks, cg_now_ms());
        (void)wst; /* CG_E_FULL: counted; the chunk reaches the disk when it is evicted */
    }
    return CG_OK;
}

/* ---- what left, export, delete, flush ---- */

void cg_tiers_take_dropped(cg_tiers *t, cg_pool_evictions *out)
{
    if (t->wb) cg_diskwb_take_dropped(t->wb, out);
}

static int key_in(const cg_key *v, size_t n, const cg_key *k)
{
    for (size_t i = 0; i < n; i++)
        if (cg_key_equal(&v[i], k)) return 1;
    return 0;
}

void cg_tiers_classify(cg_tiers *t, const cg_key *keys, size_t n, cg_key *evicted,
                       size_t *n_evicted, cg_key *spilled, size_t *n_spilled)
{
    *n_evicted = *n_spilled = 0;
    for (size_t i = 0; i < n; i++) {
        const cg_key *k = &keys[i];
        if (key_in(evicted, *n_evicted, k) || key_in(spilled, *n_spilled, k)) continue;
        cg_pool_chunk_info pi;
        if (cg_pool_peek(t->pool, k, &pi) == CG_OK) continue;
        if (t->disk && cg_disk_contains(t->disk, k))
            spilled[(*n_spilled)++] = *k;
        else
            evicted[(*n_evicted)++] = *k;
    }
}

cg_status cg_tiers_export(cg_tiers *t, const cg_key *key, int h0, int h1, uint64_t now, void **out,
                          size_t *len, uint32_t *tokens, size_t *evictions)
{
    const cg_model_config *cfg = cg_model_cfg(t->m);
    *out = NULL;
    *len = 0;
    *tokens = 0;
    *evictions = 0;
    if (h0 < 0 || h1 < h0 || h1 >= cfg->n_kv_heads) return CG_E_VALUE;
    /* A reference (or the private copy of a chunk read from disk) keeps the blocks alive
     * while they are copied out. */
    cg_cached c;
    cg_pool_evictions ev = {0};
    cg_status st = cg_tiers_lookup(t, key, 0, now, &ev, NULL, &c);
    *evictions = ev.n; /* reading a chunk back from disk made room in RAM */
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
                    const float *rows = cached_rows(t, &c, b, l, h, which, &nr);
                    memcpy(w, rows, (size_t)nr * hd * sizeof(float));
                    w += (size_t)nr * hd;
                }
    cg_tiers_drop(t, &c, now);
    *out = buf;
    *len = (size_t)(w - buf) * sizeof(float);
    *tokens = nt;
    return CG_OK;
}

/* Deletes a chunk's values from the remote tier, after the writes queued before (which may
 * hold this chunk). Returns 1 when Redis held some of them. */
static int remote_delete(cg_tiers *t, const cg_key *key)
{
    const size_t H = (size_t)cg_model_cfg(t->m)->n_kv_heads;
    char *names = cg_malloc(H * CG_REMOTE_KEY_MAX);
    const char **keys = cg_malloc(H * sizeof *keys);
    size_t n = 0;
    if (head_names(t, key, names, keys) == 0) {
        cg_status st = cg_remote_flush(t->remote, 2000);
        if (st == CG_OK) st = cg_remote_del(t->remote, H, keys, &n);
        if (st != CG_OK) {
            char hex[CG_KEY_HEX_LEN + 1];
            cg_key_hex(key, hex);
            cg_log(CG_LOG_WARN, "chunk %s: could not delete it from the remote tier (%s)", hex,
                   cg_status_name(st));
        }
    }
    free(keys);
    free(names);
    return n > 0;
}

cg_status cg_tiers_delete(cg_tiers *t, const cg_key *key)
{
    cg_pool_chunk_info info;
    /* Only live assemblies (and a moment's export) hold references: deleting a chunk an
     * assembly still uses is refused rather than deferred, so the caller learns of it. */
    if (cg_pool_peek(t->pool, key, &info) == CG_OK && info.refs > 0) return CG_E_CONFLICT;
    /* RAM first, then disk: an eviction between the two spills the chunk to disk, where the
     * second step finds it. A chunk being read back (filling) leaves the pool index too: its
     * reader uses its blocks once and frees them. */
    int deferred = 0, found = 0;
    found |= cg_pool_remove(t->pool, key, &deferred) == CG_OK;
    if (t->wb) cg_diskwb_cancel(t->wb, key); /* the writer must not put it back */
    if (t->disk) {
        cg_status st = cg_disk_remove(t->disk, key);
        if (st == CG_E_IO) return st;
        found |= st == CG_OK;
    }
    if (t->remote) found |= remote_delete(t, key);
    if (found) cg_events_emit(t->p.events, CG_CHUNKEVENT_DELETED, key, CG_TIER_RAM, 0);
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

size_t cg_tiers_flush(cg_tiers *t, uint64_t now)
{
    if (!t->disk) return 0;
    flush_list l = {0};
    cg_pool_foreach(t->pool, flush_add, &l);
    if (l.n) qsort(l.v, l.n, sizeof *l.v, cmp_last_used);
    /* The disk orders its records by the wall-clock time of their last use: translate the
     * pool's monotonic times so the LRU order survives the restart. */
    const uint64_t wall = cg_wall_ms(), mono = cg_now_ms();
    size_t done = 0;
    for (size_t i = 0; i < l.n; i++) {
        cg_pool_chunk *c = NULL;
        if (cg_pool_get(t->pool, &l.v[i].key, now, &c) != CG_OK) continue; /* gone meanwhile */
        uint64_t age = mono > l.v[i].last_used ? mono - l.v[i].last_used : 0;
        cg_disk_pool_src src = {t->pool, c};
        cg_status st = cg_disk_put(t->disk, &l.v[i].key, cg_pool_chunk_tokens(c),
                                   cg_disk_pool_block, &src, wall > age ? wall - age : wall, NULL);
        done += st == CG_OK;
        cg_pool_release(t->pool, &c, now);
    }
    free(l.v);
    return done;
}

cg_status cg_tiers_wait_writes(cg_tiers *t, int timeout_ms)
{
    uint64_t end = cg_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    if (t->wb && cg_diskwb_flush(t->wb, timeout_ms) != CG_OK) return CG_E_TIMEOUT;
    uint64_t now = cg_now_ms();
    int left = now < end ? (int)(end - now) : 0;
    if (t->remote && cg_remote_flush(t->remote, left) != CG_OK) return CG_E_TIMEOUT;
    return CG_OK;
}
