/* Disk tier: a file of fixed-size slots written with pwritev/preadv, an SQLite inventory that
 * names only fully written slots, XXH3-128 checksums checked on every read, LRU drop. */
#include "worker/store/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "base/base.h"
#include "base/list.h"
#include "base/map.h"
#include "sql/db.h"
#include "sql/kvstore.h"

/* Most slots moved by one preadv/pwritev: consecutive slots are one contiguous file range. */
#define IOV_BATCH 64
/* LRU touches (restores, repeated puts) are persisted this many per transaction: a commit
 * per restore would cost more than reading a small chunk. Only the LRU order after a crash
 * depends on them. */
#define TOUCH_BATCH 256

enum { REC_WRITING, REC_READY };

typedef struct rec {
    cg_key key;
    uint32_t n_tokens, n_slots;
    uint32_t *slots; /* slot indexes in block order */
    uint8_t sum[CG_KVSTORE_SUM_BYTES];
    uint64_t last_used;
    uint8_t state;          /* REC_WRITING until its row is committed */
    uint8_t detached;       /* out of the index: freed by the last reader or by its writer */
    uint32_t readers;       /* cg_disk_get calls reading its slots outside the lock */
    cg_map_node index_node; /* d->index: every record not detached, by key */
    cg_link lru_link;       /* d->lru: exactly the indexed READY records, head = oldest */
    cg_link all_link;       /* d->all: every record holding slots, for cg_disk_check */
} rec;

struct cg_disk {
    cg_disk_params params;
    char *dir, *model, *blocks_path, *db_path;
    int fd;
    cg_kvstore *kv;
    size_t slot_bytes;
    uint32_t slots_total, slots_free, cursor;
    uint64_t *used; /* one bit per slot; bits past slots_total in the last word stay set */
    size_t n_words;
    cg_map index; /* rec by index_node, keyed by key */
    cg_list lru;  /* rec by lru_link */
    cg_list all;  /* rec by all_link */
    size_t n_ready, ready_slots;
    uint64_t spills, restores, drops, removes, checksum_failures, io_errors, full;
    uint64_t bytes_written, bytes_read, open_dropped;
    cg_key touch_keys[TOUCH_BATCH]; /* last_used updates not yet in the inventory */
    uint64_t touch_times[TOUCH_BATCH];
    size_t n_touch;
    pthread_mutex_t mu;
};

cg_disk_params cg_disk_default_params(void)
{
    return (cg_disk_params){
        .capacity_bytes = (size_t)1 << 30,
        .block_tokens = 16,
    };
}

static uint32_t blocks_for(const cg_disk *d, uint32_t n_tokens)
{
    return (uint32_t)(((uint64_t)n_tokens + d->params.block_tokens - 1) / d->params.block_tokens);
}

size_t cg_disk_chunk_bytes(const cg_disk *d, uint32_t n_tokens)
{
    return (size_t)blocks_for(d, n_tokens) * d->slot_bytes;
}

cg_disk_params cg_disk_get_params(const cg_disk *d)
{
    return d->params;
}

/* ---- Slot bitmap --------------------------------------------------------------------------- */

static int slot_used(const cg_disk *d, uint32_t s)
{
    return (int)(d->used[s / 64] >> (s % 64) & 1);
}

/* Takes n free slots (the caller checked slots_free >= n), next-fit from the cursor so that
 * records written one after another land in consecutive slots: one write, one read each. */
static void slots_take(cg_disk *d, uint32_t n, uint32_t *out)
{
    uint32_t i = d->cursor, got = 0;
    while (got < n) {
        if (i >= d->slots_total) i = 0;
        size_t w = i / 64;
        uint64_t avail = ~d->used[w] & (~0ull << (i % 64));
        if (!avail) {
            i = (uint32_t)((w + 1) * 64);
            continue;
        }
        uint32_t s = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(avail));
        d->used[w] |= 1ull << (s % 64);
        out[got++] = s;
        i = s + 1;
    }
    d->cursor = i >= d->slots_total ? 0 : i;
    d->slots_free -= n;
}

static void slots_give(cg_disk *d, const uint32_t *slots, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        d->used[slots[i] / 64] &= ~(1ull << (slots[i] % 64));
    d->slots_free += n;
}

/* ---- Index, LRU, record lifetime ------------------------------------------------------------ */

static rec *index_find(const cg_disk *d, const cg_key *k)
{
    cg_map_node *n = cg_map_find(&d->index, k);
    return n ? CG_MAP_ENTRY(n, rec, index_node) : NULL;
}

static rec *rec_new(cg_disk *d, const cg_key *key, uint32_t n_tokens, uint32_t n_slots)
{
    rec *r = cg_calloc(1, sizeof *r);
    r->key = *key;
    r->n_tokens = n_tokens;
    r->n_slots = n_slots;
    r->slots = cg_malloc((size_t)n_slots * sizeof *r->slots);
    cg_list_push_back(&d->all, &r->all_link);
    return r;
}

/* Gives the record's slots back and frees it. It must be out of the index and the LRU. */
static void rec_free(cg_disk *d, rec *r)
{
    slots_give(d, r->slots, r->n_slots);
    cg_list_remove(&d->all, &r->all_link);
    free(r->slots);
    free(r);
}

/* Takes a READY record out of the index and the LRU (its row is already deleted); its slots
 * are freed now, or by its last reader. */
static void rec_detach(cg_disk *d, rec *r)
{
    cg_map_remove(&d->index, &r->index_node);
    cg_list_remove(&d->lru, &r->lru_link);
    r->detached = 1;
    d->n_ready--;
    d->ready_slots -= r->n_slots;
    if (r->readers == 0) rec_free(d, r);
}

/* Writes the pending last_used updates in one transaction. Lock held. */
static void touch_flush(cg_disk *d)
{
    if (d->n_touch == 0) return;
    if (cg_kvstore_touch(d->kv, d->touch_keys, d->touch_times, d->n_touch) != CG_OK)
        d->io_errors++; /* only the LRU order after a restart suffers */
    d->n_touch = 0;
}

/* Makes r the most recently used record; its row learns it in a later batch. Lock held. */
static void touch(cg_disk *d, rec *r, uint64_t now)
{
    r->last_used = now;
    cg_list_remove(&d->lru, &r->lru_link);
    cg_list_push_back(&d->lru, &r->lru_link);
    d->touch_keys[d->n_touch] = r->key;
    d->touch_times[d->n_touch++] = now;
    if (d->n_touch == TOUCH_BATCH) touch_flush(d);
}

/* ---- Data I/O (outside the lock) ----------------------------------------------------------- */

/* Reads or writes iov[0..n) at off, looping over short transfers (iov is consumed). A read
 * that meets the end of the file fails with EIO. Returns 0 or -1 with errno set. */
static int full_io(int fd, struct iovec *iov, int n, off_t off, int wr)
{
    while (n > 0) {
        ssize_t k = wr ? pwritev(fd, iov, n, off) : preadv(fd, iov, n, off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) {
            errno = EIO;
            return -1;
        }
        off += k;
        while (n > 0 && (size_t)k >= iov->iov_len) {
            k -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
    return 0;
}

/* Moves a record's blocks between memory and its slots, runs of consecutive slots in one
 * call, and hashes the bytes in block order: before writing, after reading. Returns 0 or -1
 * (errno set). */
static int transfer(cg_disk *d, const uint32_t *slots, uint32_t n, int wr, cg_disk_src_fn src,
                    cg_disk_dst_fn dst, void *ud, XXH3_state_t *h)
{
    struct iovec iov[IOV_BATCH];
    void *ptr[IOV_BATCH];
    uint32_t i = 0;
    while (i < n) {
        int cnt = 0;
        uint32_t j = i;
        while (j < n && cnt < IOV_BATCH && (j == i || slots[j] == slots[j - 1] + 1)) {
            ptr[cnt] = wr ? (void *)src(ud, j) : dst(ud, j);
            iov[cnt].iov_base = ptr[cnt];
            iov[cnt].iov_len = d->slot_bytes;
            if (wr) (void)XXH3_128bits_update(h, ptr[cnt], d->slot_bytes);
            cnt++;
            j++;
        }
        if (full_io(d->fd, iov, cnt, (off_t)slots[i] * (off_t)d->slot_bytes, wr) != 0) return -1;
        if (!wr)
            for (int k = 0; k < cnt; k++)
                (void)XXH3_128bits_update(h, ptr[k], d->slot_bytes);
        i = j;
    }
    return 0;
}

/* The record checksum: XXH3-128 over the slot bytes (hashed by transfer), then the key, then
 * n_tokens as u32 LE, so a row that names the wrong key or length cannot verify either. */
static void sum_finish(XXH3_state_t *h, const cg_key *key, uint32_t n_tokens,
                       uint8_t out[CG_KVSTORE_SUM_BYTES])
{
    uint8_t nt[4] = {(uint8_t)n_tokens, (uint8_t)(n_tokens >> 8), (uint8_t)(n_tokens >> 16),
                     (uint8_t)(n_tokens >> 24)};
    (void)XXH3_128bits_update(h, key->b, sizeof key->b);
    (void)XXH3_128bits_update(h, nt, sizeof nt);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h));
    memcpy(out, c.digest, CG_KVSTORE_SUM_BYTES);
}

/* ---- Put ------------------------------------------------------------------------------------ */

/* Drops least recently used records not being read until need slots are free, deleting
 * their rows (one transaction) before freeing their slots. Lock held. */
static cg_status make_room(cg_disk *d, uint32_t need, cg_pool_evictions *dropped)
{
    uint64_t have = d->slots_free;
    size_t n = 0;
    for (cg_link *l = d->lru.head; l && have < need; l = l->next) {
        rec *r = CG_LIST_ENTRY(l, rec, lru_link);
        if (r->readers) continue;
        have += r->n_slots;
        n++;
    }
    if (have < need) return CG_E_FULL;
    if (n == 0) return CG_OK;
    cg_key *keys = cg_malloc(n * sizeof *keys);
    size_t k = 0;
    for (cg_link *l = d->lru.head; k < n; l = l->next) {
        rec *r = CG_LIST_ENTRY(l, rec, lru_link);
        if (!r->readers) keys[k++] = r->key;
    }
    cg_status st = cg_kvstore_delete(d->kv, keys, n);
    if (st != CG_OK) {
        d->io_errors++;
        goto out;
    }
    for (k = 0; k < n; k++) {
        rec *v = index_find(d, &keys[k]);
        rec_detach(d, v);
        d->drops++;
        cg_pool_evictions_add(dropped, &keys[k]);
    }
out:
    free(keys);
    return st;
}

cg_status cg_disk_put(cg_disk *d, const cg_key *key, uint32_t n_tokens, cg_disk_src_fn src,
                      void *src_ud, uint64_t now, cg_pool_evictions *dropped)
{
    if (n_tokens == 0) return CG_E_VALUE;
    uint32_t n = blocks_for(d, n_tokens);
    XXH3_state_t *h = NULL;
    cg_status st = CG_OK;
    rec *r;

    pthread_mutex_lock(&d->mu);
    r = index_find(d, key);
    if (r) {
        if (r->state == REC_WRITING || r->n_tokens != n_tokens) {
            st = CG_E_CONFLICT;
        } else {
            /* Same key, same bytes: the record on disk already is this chunk. */
            touch(d, r, now);
        }
        pthread_mutex_unlock(&d->mu);
        return st;
    }
    if (n > d->slots_total) {
        d->full++;
        pthread_mutex_unlock(&d->mu);
        return CG_E_FULL;
    }
    st = make_room(d, n, dropped);
    if (st != CG_OK) {
        if (st == CG_E_FULL) d->full++;
        pthread_mutex_unlock(&d->mu);
        return st;
    }
    r = rec_new(d, key, n_tokens, n);
    r->state = REC_WRITING;
    r->last_used = now;
    slots_take(d, n, r->slots);
    /* A second put of the key conflicts; gets do not see it yet. */
    cg_map_add(&d->index, &r->index_node);
    pthread_mutex_unlock(&d->mu);

    /* The slots are ours alone: no row names them, no other record holds them. */
    h = XXH3_createState();
    if (!h) abort();
    (void)XXH3_128bits_reset(h);
    int io_failed = transfer(d, r->slots, n, 1, src, NULL, src_ud, h) != 0;
    if (!io_failed && d->params.sync && fdatasync(d->fd) != 0) io_failed = 1;
    if (io_failed)
        cg_log(CG_LOG_ERROR, "disk: writing %s: %s", d->blocks_path, strerror(errno));
    else
        sum_finish(h, key, n_tokens, r->sum);
    XXH3_freeState(h);

    pthread_mutex_lock(&d->mu);
    if (r->detached) { /* removed while being written: nothing to commit */
        rec_free(d, r);
        st = CG_OK;
    } else {
        if (io_failed) {
            st = CG_E_IO;
        } else {
            /* The commit point: from here on the row names slots whose bytes are written. */
            cg_kvstore_row row = {.key = *key,
                                  .n_tokens = n_tokens,
                                  .slots = r->slots,
                                  .n_slots = n,
                                  .last_used = now,
                                  .model = d->model};
            memcpy(row.checksum, r->sum, sizeof row.checksum);
            st = cg_kvstore_put(d->kv, &row);
        }
        if (st == CG_OK) {
            r->state = REC_READY;
            cg_list_push_back(&d->lru, &r->lru_link);
            d->n_ready++;
            d->ready_slots += n;
            d->spills++;
            d->bytes_written += (uint64_t)n * d->slot_bytes;
        } else {
            d->io_errors++;
            cg_map_remove(&d->index, &r->index_node);
            rec_free(d, r);
            if (st != CG_E_IO) st = CG_E_IO;
        }
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* ---- Get ------------------------------------------------------------------------------------ */

cg_status cg_disk_get(cg_disk *d, const cg_key *key, uint32_t n_tokens, cg_disk_dst_fn dst,
                      void *dst_ud, uint64_t now)
{
    cg_status st = CG_OK;
    pthread_mutex_lock(&d->mu);
    rec *r = index_find(d, key);
    if (!r || r->state != REC_READY)
        st = CG_E_NOT_FOUND;
    else if (r->n_tokens != n_tokens)
        st = CG_E_CONFLICT;
    else
        r->readers++; /* its slots stay allocated to it until we are done */
    pthread_mutex_unlock(&d->mu);
    if (st != CG_OK) return st;

    uint8_t sum[CG_KVSTORE_SUM_BYTES];
    XXH3_state_t *h = XXH3_createState();
    if (!h) abort();
    (void)XXH3_128bits_reset(h);
    int io_failed = transfer(d, r->slots, r->n_slots, 0, NULL, dst, dst_ud, h) != 0;
    if (io_failed)
        cg_log(CG_LOG_ERROR, "disk: reading %s: %s", d->blocks_path, strerror(errno));
    else
        sum_finish(h, key, n_tokens, sum);
    XXH3_freeState(h);
    int bad = io_failed || memcmp(sum, r->sum, sizeof sum) != 0;

    pthread_mutex_lock(&d->mu);
    r->readers--;
    if (!bad) {
        d->restores++;
        d->bytes_read += (uint64_t)r->n_slots * d->slot_bytes;
        if (!r->detached) touch(d, r, now);
    } else {
        st = CG_E_IO;
        if (io_failed)
            d->io_errors++;
        else
            d->checksum_failures++;
        if (!io_failed) {
            char hex[CG_KEY_HEX_LEN + 1];
            cg_key_hex(key, hex);
            cg_log(CG_LOG_WARN, "disk: checksum mismatch on chunk %s: dropped, treated as a miss",
                   hex);
        }
        if (!r->detached) {
            /* Row first: if it cannot be deleted the record stays, and fails again. */
            if (cg_kvstore_delete(d->kv, key, 1) == CG_OK) {
                rec_detach(d, r); /* frees it unless others are still reading it */
                r = NULL;
            } else {
                d->io_errors++;
            }
        }
    }
    if (r && r->detached && r->readers == 0) rec_free(d, r);
    pthread_mutex_unlock(&d->mu);
    return st;
}

typedef struct buf_dst {
    uint8_t *base;
    size_t block_bytes;
} buf_dst;

static void *buf_block(void *ud, uint32_t i)
{
    buf_dst *b = ud;
    return b->base + (size_t)i * b->block_bytes;
}

cg_status cg_disk_get_buf(cg_disk *d, const cg_key *key, uint32_t n_tokens, void *buf, size_t len,
                          uint64_t now)
{
    if (n_tokens == 0 || len < cg_disk_chunk_bytes(d, n_tokens)) return CG_E_VALUE;
    buf_dst b = {buf, d->slot_bytes};
    return cg_disk_get(d, key, n_tokens, buf_block, &b, now);
}

const void *cg_disk_pool_block(void *ud, uint32_t block_idx)
{
    const cg_disk_pool_src *s = ud;
    uint32_t rows;
    /* The pool's block layout is [head][layer][K,V][block_tokens][head_dim]: the slab of
     * head 0, layer 0, K starts the block, and the whole block is contiguous. */
    return cg_pool_chunk_rows(s->pool, s->chunk, block_idx, 0, 0, 0, &rows);
}

/* ---- Inventory ------------------------------------------------------------------------------ */

static cg_disk_chunk_info info_of(const cg_disk *d, const rec *r)
{
    return (cg_disk_chunk_info){.key = r->key,
                                .tokens = r->n_tokens,
                                .bytes = (size_t)r->n_slots * d->slot_bytes,
                                .last_used = r->last_used};
}

int cg_disk_contains(cg_disk *d, const cg_key *key)
{
    pthread_mutex_lock(&d->mu);
    rec *r = index_find(d, key);
    int yes = r && r->state == REC_READY;
    pthread_mutex_unlock(&d->mu);
    return yes;
}

cg_status cg_disk_peek(cg_disk *d, const cg_key *key, cg_disk_chunk_info *out)
{
    cg_status st = CG_E_NOT_FOUND;
    pthread_mutex_lock(&d->mu);
    rec *r = index_find(d, key);
    if (r && r->state == REC_READY) {
        *out = info_of(d, r);
        st = CG_OK;
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

cg_status cg_disk_touch(cg_disk *d, const cg_key *key, uint64_t now)
{
    cg_status st = CG_E_NOT_FOUND;
    pthread_mutex_lock(&d->mu);
    rec *r = index_find(d, key);
    if (r && r->state == REC_READY) {
        touch(d, r, now);
        st = CG_OK;
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

cg_status cg_disk_remove(cg_disk *d, const cg_key *key)
{
    cg_status st = CG_OK;
    pthread_mutex_lock(&d->mu);
    rec *r = index_find(d, key);
    if (!r) {
        st = CG_E_NOT_FOUND;
    } else if (r->state == REC_WRITING) {
        /* Its writer sees detached and frees it without committing. */
        cg_map_remove(&d->index, &r->index_node);
        r->detached = 1;
        d->removes++;
    } else if ((st = cg_kvstore_delete(d->kv, key, 1)) == CG_OK) {
        rec_detach(d, r);
        d->removes++;
    } else {
        d->io_errors++;
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

void cg_disk_foreach(cg_disk *d, void (*fn)(void *ud, const cg_disk_chunk_info *info), void *ud)
{
    pthread_mutex_lock(&d->mu);
    for (cg_link *l = d->lru.head; l; l = l->next) {
        cg_disk_chunk_info info = info_of(d, CG_LIST_ENTRY(l, rec, lru_link));
        fn(ud, &info);
    }
    pthread_mutex_unlock(&d->mu);
}

cg_disk_stats cg_disk_get_stats(cg_disk *d)
{
    pthread_mutex_lock(&d->mu);
    cg_disk_stats s = {
        .capacity_bytes = (size_t)d->slots_total * d->slot_bytes,
        .block_bytes = d->slot_bytes,
        .slots_total = d->slots_total,
        .slots_free = d->slots_free,
        .used_bytes = (size_t)(d->slots_total - d->slots_free) * d->slot_bytes,
        .chunks = d->n_ready,
        .chunk_bytes = d->ready_slots * d->slot_bytes,
        .spills = d->spills,
        .restores = d->restores,
        .drops = d->drops,
        .removes = d->removes,
        .checksum_failures = d->checksum_failures,
        .io_errors = d->io_errors,
        .full = d->full,
        .bytes_written = d->bytes_written,
        .bytes_read = d->bytes_read,
        .open_dropped = d->open_dropped,
    };
    pthread_mutex_unlock(&d->mu);
    return s;
}

/* ---- Check ---------------------------------------------------------------------------------- */

typedef struct check_ctx {
    cg_disk *d;
    size_t rows, bad;
} check_ctx;

static int check_row(void *ud, const cg_kvstore_row *row)
{
    check_ctx *c = ud;
    c->rows++;
    rec *r = index_find(c->d, &row->key);
    if (!r || r->state != REC_READY || r->n_tokens != row->n_tokens || r->n_slots != row->n_slots ||
        !row->slots || memcmp(r->slots, row->slots, (size_t)r->n_slots * sizeof *r->slots) != 0 ||
        memcmp(r->sum, row->checksum, sizeof r->sum) != 0)
        c->bad++;
    return 0;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            cg_log(CG_LOG_ERROR, "disk check: " __VA_ARGS__);                                      \
            st = CG_E_INTERNAL;                                                                    \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

cg_status cg_disk_check(cg_disk *d)
{
    cg_status st = CG_OK;
    uint64_t *own = cg_calloc(d->n_words, sizeof *own);
    pthread_mutex_lock(&d->mu);
    /* Every record's slots are in range, owned by it alone, and marked used; nothing else is. */
    size_t held = 0;
    for (cg_link *l = d->all.head; l; l = l->next) {
        rec *r = CG_LIST_ENTRY(l, rec, all_link);
        CHECK(r->n_slots == blocks_for(d, r->n_tokens), "record slot count");
        for (uint32_t i = 0; i < r->n_slots; i++) {
            uint32_t s = r->slots[i];
            CHECK(s < d->slots_total, "slot %u out of range", s);
            CHECK(!(own[s / 64] >> (s % 64) & 1), "slot %u held twice", s);
            CHECK(slot_used(d, s), "slot %u held but marked free", s);
            own[s / 64] |= 1ull << (s % 64);
        }
        held += r->n_slots;
        CHECK(r->detached ? r->readers > 0 || r->state == REC_WRITING : 1,
              "detached record without readers or writer");
    }
    CHECK(held == (size_t)(d->slots_total - d->slots_free), "held %zu slots, used %zu", held,
          (size_t)(d->slots_total - d->slots_free));
    size_t used = 0;
    for (size_t w = 0; w < d->n_words; w++)
        used += (size_t)__builtin_popcountll(d->used[w]);
    size_t pad = d->n_words * 64 - d->slots_total;
    CHECK(used == held + pad, "bitmap has %zu used bits, expected %zu", used, held + pad);
    /* LRU = the indexed READY records. */
    size_t n_lru = 0, lru_slots = 0;
    for (cg_link *l = d->lru.head, *prev = NULL; l; prev = l, l = l->next) {
        rec *r = CG_LIST_ENTRY(l, rec, lru_link);
        CHECK(l->prev == prev, "lru back link");
        CHECK(r->state == REC_READY && !r->detached, "lru record not ready");
        CHECK(index_find(d, &r->key) == r, "lru record not indexed");
        n_lru++;
        lru_slots += r->n_slots;
    }
    CHECK(n_lru == d->n_ready && lru_slots == d->ready_slots, "ready counts");
    size_t n_idx = 0;
    cg_map_iter it = cg_map_iter_start(&d->index);
    for (cg_map_node *n; (n = cg_map_iter_next(&it));) {
        rec *r = CG_MAP_ENTRY(n, rec, index_node);
        CHECK(!r->detached && index_find(d, &r->key) == r, "index entry");
        n_idx++;
    }
    CHECK(n_idx == cg_map_count(&d->index), "index count");
    /* The inventory names exactly the READY records, with their slots and checksums. */
    check_ctx c = {.d = d};
    CHECK(cg_kvstore_load(d->kv, check_row, &c) == CG_OK, "inventory load");
    CHECK(c.bad == 0 && c.rows == d->n_ready, "inventory: %zu rows, %zu mismatched, %zu ready",
          c.rows, c.bad, d->n_ready);
    CHECK(cg_kvstore_check(d->kv) == CG_OK, "inventory integrity");
out:
    pthread_mutex_unlock(&d->mu);
    free(own);
    return st;
}

/* ---- Open / close --------------------------------------------------------------------------- */

typedef struct loaded {
    cg_key key;
    uint32_t n_tokens, n_slots;
    uint32_t *slots;
    uint8_t sum[CG_KVSTORE_SUM_BYTES];
    uint64_t last_used;
    int bad;
} loaded;

typedef struct load_ctx {
    cg_disk *d;
    loaded *v;
    size_t n, cap;
} load_ctx;

static int load_row(void *ud, const cg_kvstore_row *row)
{
    load_ctx *c = ud;
    cg_disk *d = c->d;
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 64;
        c->v = cg_realloc(c->v, c->cap * sizeof *c->v);
    }
    loaded *l = &c->v[c->n++];
    memset(l, 0, sizeof *l);
    l->key = row->key;
    l->n_tokens = row->n_tokens;
    l->last_used = row->last_used;
    memcpy(l->sum, row->checksum, sizeof l->sum);
    l->bad = row->n_slots == 0 || row->n_tokens == 0 ||
             row->n_slots != blocks_for(d, row->n_tokens) || !row->model ||
             strcmp(row->model, d->model) != 0;
    if (!l->bad) {
        l->n_slots = row->n_slots;
        l->slots = cg_malloc((size_t)row->n_slots * sizeof *l->slots);
        memcpy(l->slots, row->slots, (size_t)row->n_slots * sizeof *l->slots);
        for (uint32_t i = 0; i < row->n_slots; i++)
            if (row->slots[i] >= d->slots_total) l->bad = 1;
    }
    return 0;
}

/* Loads the inventory: rows that are invalid, out of range or that share a slot with any
 * other row are deleted (a shared slot can hold at most one of them, and neither can be
 * trusted to be the one); the rest become READY records, least recently used first. */
static cg_status load_inventory(cg_disk *d)
{
    load_ctx c = {.d = d};
    cg_status st = cg_kvstore_load(d->kv, load_row, &c);
    uint64_t *dup = cg_calloc(d->n_words, sizeof *dup);
    cg_key *drop = NULL;
    size_t n_drop = 0;
    if (st != CG_OK) goto out;
    for (size_t i = 0; i < c.n; i++) {
        loaded *l = &c.v[i];
        for (uint32_t k = 0; !l->bad && k < l->n_slots; k++) {
            uint32_t s = l->slots[k];
            if (slot_used(d, s)) dup[s / 64] |= 1ull << (s % 64);
            d->used[s / 64] |= 1ull << (s % 64);
        }
    }
    drop = cg_malloc((c.n ? c.n : 1) * sizeof *drop);
    for (size_t i = 0; i < c.n; i++) {
        loaded *l = &c.v[i];
        for (uint32_t k = 0; !l->bad && k < l->n_slots; k++)
            if (dup[l->slots[k] / 64] >> (l->slots[k] % 64) & 1) l->bad = 1;
        if (l->bad) drop[n_drop++] = l->key;
    }
    /* Rebuild the bitmap from the survivors only. */
    memset(d->used, 0, d->n_words * sizeof *d->used);
    if (d->slots_total % 64) d->used[d->n_words - 1] = ~0ull << (d->slots_total % 64);
    d->slots_free = d->slots_total;
    if (n_drop) {
        st = cg_kvstore_delete(d->kv, drop, n_drop);
        if (st != CG_OK) goto out;
        cg_log(CG_LOG_WARN,
               "disk: %s: dropped %zu inventory rows (slots out of range, overlapping or "
               "invalid)",
               d->db_path, n_drop);
    }
    d->open_dropped = n_drop;
    for (size_t i = 0; i < c.n; i++) {
        loaded *l = &c.v[i];
        if (l->bad) continue;
        rec *r = rec_new(d, &l->key, l->n_tokens, l->n_slots);
        memcpy(r->slots, l->slots, (size_t)l->n_slots * sizeof *r->slots);
        for (uint32_t k = 0; k < l->n_slots; k++)
            d->used[l->slots[k] / 64] |= 1ull << (l->slots[k] % 64);
        d->slots_free -= l->n_slots;
        memcpy(r->sum, l->sum, sizeof r->sum);
        r->last_used = l->last_used;
        r->state = REC_READY;
        cg_map_add(&d->index, &r->index_node);
        cg_list_push_back(&d->lru, &r->lru_link);
        d->n_ready++;
        d->ready_slots += l->n_slots;
    }
out:
    for (size_t i = 0; i < c.n; i++)
        free(c.v[i].slots);
    free(c.v);
    free(dup);
    free(drop);
    return st;
}

static void disk_destroy(cg_disk *d)
{
    if (d->kv) touch_flush(d);
    for (cg_link *l; (l = cg_list_pop_front(&d->all));) {
        rec *r = CG_LIST_ENTRY(l, rec, all_link);
        free(r->slots);
        free(r);
    }
    cg_kvstore_close(&d->kv);
    if (d->fd >= 0) close(d->fd); /* also releases the flock */
    cg_map_free(&d->index);
    cg_free(&d->used);
    cg_free(&d->dir);
    cg_free(&d->model);
    cg_free(&d->blocks_path);
    cg_free(&d->db_path);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = cg_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static cg_status check_geometry(cg_disk *d)
{
    const cg_disk_params *p = &d->params;
    cg_kvstore_geometry want = {.layout = CG_DISK_LAYOUT,
                                .block_bytes = d->slot_bytes,
                                .block_tokens = p->block_tokens,
                                .n_layers = (uint32_t)p->n_layers,
                                .n_kv_heads = (uint32_t)p->n_kv_heads,
                                .head_dim = (uint32_t)p->head_dim};
    snprintf(want.model, sizeof want.model, "%s", d->model);
    cg_kvstore_geometry have;
    int found = 0;
    cg_status st = cg_kvstore_geometry_get(d->kv, &have, &found);
    if (st != CG_OK) return st;
    if (!found) return cg_kvstore_geometry_set(d->kv, &want, cg_wall_ms());
    if (strcmp(have.model, want.model) != 0 || have.layout != want.layout ||
        have.block_bytes != want.block_bytes || have.block_tokens != want.block_tokens ||
        have.n_layers != want.n_layers || have.n_kv_heads != want.n_kv_heads ||
        have.head_dim != want.head_dim) {
        cg_log(CG_LOG_ERROR,
               "disk: data dir %s was written for model '%s' (layout %u, %u layers, %u kv "
               "heads, head_dim %u, %u tokens/block, %llu bytes/block) but this worker has "
               "model '%s' (layout %u, %u layers, %u kv heads, head_dim %u, %u tokens/block, "
               "%llu bytes/block); use another --data-dir or delete %s and %s",
               d->dir, have.model, have.layout, have.n_layers, have.n_kv_heads, have.head_dim,
               have.block_tokens, (unsigned long long)have.block_bytes, want.model, want.layout,
               want.n_layers, want.n_kv_heads, want.head_dim, want.block_tokens,
               (unsigned long long)want.block_bytes, d->db_path, d->blocks_path);
        return CG_E_UNSUPPORTED;
    }
    return CG_OK;
}

/* Opens d's inventory, checks its geometry and loads its rows; d->kv stays open on failure
 * (disk_destroy closes it), and no record is loaded unless all are. */
static cg_status open_inventory(cg_disk *d)
{
    cg_status st = cg_kvstore_open(d->db_path, d->params.sync, &d->kv);
    if (st == CG_OK) st = check_geometry(d);
    if (st == CG_OK) st = load_inventory(d);
    return st;
}

/* Renames the damaged inventory kv.db (and its -wal and -shm, which SQLite would otherwise apply
 * to a new file of the same name) to kv.db.damaged-<unix ms>. CG_E_IO when a rename fails. */
static cg_status set_aside(cg_disk *d)
{
    static const char *const tails[] = {"", "-wal", "-shm"};
    unsigned long long ms = (unsigned long long)cg_wall_ms();
    for (size_t i = 0; i < CG_ARRAY_LEN(tails); i++) {
        char from[PATH_MAX], to[PATH_MAX];
        snprintf(from, sizeof from, "%s%s", d->db_path, tails[i]);
        snprintf(to, sizeof to, "%s.damaged-%llu%s", d->db_path, ms, tails[i]);
        if (rename(from, to) != 0 && errno != ENOENT) {
            cg_log(CG_LOG_ERROR, "disk: %s is damaged and cannot be set aside as %s: %s",
                   d->db_path, to, strerror(errno));
            return CG_E_IO;
        }
        if (!i)
            cg_log(CG_LOG_WARN,
                   "disk: %s is damaged (not a database, or SQLite's quick_check failed); kept as "
                   "%s, and the disk tier starts empty",
                   d->db_path, to);
    }
    return CG_OK;
}

cg_status cg_disk_open(cg_disk_params p, cg_disk **out)
{
    cg_disk *d = NULL;
    cg_status st = CG_E_VALUE;
    *out = NULL;
    if (!p.dir || !*p.dir || !p.model_id || !*p.model_id ||
        strlen(p.model_id) > CG_KVSTORE_MODEL_MAX || p.n_layers <= 0 || p.n_kv_heads <= 0 ||
        p.head_dim <= 0 || p.block_tokens == 0) {
        cg_log(CG_LOG_ERROR, "disk: invalid parameters (dir, model id or geometry)");
        return CG_E_VALUE;
    }
    cg_pool_params pp = cg_pool_default_params();
    pp.block_tokens = p.block_tokens;
    pp.n_layers = p.n_layers;
    pp.n_kv_heads = p.n_kv_heads;
    pp.head_dim = p.head_dim;
    size_t bb = cg_pool_block_bytes(&pp);
    if (bb == 0 || p.block_bytes != bb) {
        cg_log(CG_LOG_ERROR, "disk: block_bytes %zu does not match the geometry (%zu)",
               p.block_bytes, bb);
        return CG_E_VALUE;
    }
    if (p.capacity_bytes / bb == 0 || p.capacity_bytes / bb > UINT32_MAX - 64) {
        cg_log(CG_LOG_ERROR, "disk: capacity %zu bytes holds no block of %zu bytes (or too many)",
               p.capacity_bytes, bb);
        return CG_E_VALUE;
    }

    d = cg_calloc(1, sizeof *d);
    d->fd = -1;
    pthread_mutex_init(&d->mu, NULL);
    d->dir = cg_strdup(p.dir);
    d->model = cg_strdup(p.model_id);
    d->blocks_path = path_join(p.dir, "kv.blocks");
    d->db_path = path_join(p.dir, "kv.db");
    d->slot_bytes = bb;
    d->slots_total = (uint32_t)(p.capacity_bytes / bb);
    p.capacity_bytes = (size_t)d->slots_total * bb;
    p.dir = d->dir;
    p.model_id = d->model;
    d->params = p;
    d->n_words = ((size_t)d->slots_total + 63) / 64;
    d->used = cg_calloc(d->n_words, sizeof *d->used);
    if (d->slots_total % 64) d->used[d->n_words - 1] = ~0ull << (d->slots_total % 64);
    d->slots_free = d->slots_total;
    CG_MAP_INIT(&d->index, rec, index_node, key);

    st = CG_E_IO;
    if (mkdir(d->dir, 0755) != 0 && errno != EEXIST) {
        cg_log(CG_LOG_ERROR, "disk: cannot create %s: %s", d->dir, strerror(errno));
        goto out;
    }
    d->fd = open(d->blocks_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (d->fd < 0) {
        cg_log(CG_LOG_ERROR, "disk: cannot open %s: %s", d->blocks_path, strerror(errno));
        goto out;
    }
    /* Two processes on one directory would hand out the same slots. */
    if (flock(d->fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        cg_log(CG_LOG_ERROR, "disk: %s is in use by another process (%s)", d->blocks_path,
               strerror(e));
        st = e == EWOULDBLOCK ? CG_E_CONFLICT : CG_E_IO;
        goto out;
    }
    st = open_inventory(d);
    /* The inventory indexes a cache: a damaged one is kept aside for a look, never deleted,
     * and the tier starts empty rather than keep the worker from serving. */
    if (st == CG_E_IO && cg_db_file_damaged(d->db_path)) {
        cg_kvstore_close(&d->kv);
        st = set_aside(d);
        if (st == CG_OK) st = open_inventory(d);
    }
    if (st != CG_OK) goto out;
    /* Only now, with out-of-range rows deleted, may the file shrink. A short file (truncated
     * by someone) grows with zeros, which the checksums of the records there reject. */
    st = CG_E_IO;
    struct stat sb;
    off_t want = (off_t)d->slots_total * (off_t)bb;
    /* The file is sparse: without the space reserved now, a full filesystem would show only
     * when a spill writes, after make_room had already dropped records for it. A capacity the
     * filesystem cannot hold is refused before anything is reserved (a reservation that fails
     * half-way would keep what it took); the reservation itself is best effort. */
    struct statvfs fs;
    const off_t held = fstat(d->fd, &sb) == 0 ? (off_t)sb.st_blocks * 512 : 0;
    if (fstatvfs(d->fd, &fs) == 0 && want > held &&
        (unsigned long long)(want - held) > (unsigned long long)fs.f_bavail * fs.f_frsize) {
        cg_log(CG_LOG_ERROR,
               "disk: %s: --disk-mb needs %lld more bytes than the file holds, and the filesystem "
               "has %llu free; lower --disk-mb or free space",
               d->blocks_path, (long long)(want - held),
               (unsigned long long)fs.f_bavail * fs.f_frsize);
        st = CG_E_UNAVAILABLE;
        goto out;
    }
    if (fstat(d->fd, &sb) != 0 || (sb.st_size != want && ftruncate(d->fd, want) != 0)) {
        cg_log(CG_LOG_ERROR, "disk: cannot size %s: %s", d->blocks_path, strerror(errno));
        goto out;
    }
    if (fallocate(d->fd, 0, 0, want) != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
        cg_log(CG_LOG_WARN, "disk: %s: space not reserved: %s", d->blocks_path, strerror(errno));
    cg_log(CG_LOG_INFO, "disk: %s: %zu chunks in %u of %u slots of %zu bytes", d->dir, d->n_ready,
           d->slots_total - d->slots_free, d->slots_total, bb);
    st = CG_OK;
    *out = d;
    d = NULL;
out:
    if (d) disk_destroy(d);
    return st;
}

void cg_disk_close(cg_disk **pd)
{
    if (!pd || !*pd) return;
    disk_destroy(*pd);
    *pd = NULL;
}
