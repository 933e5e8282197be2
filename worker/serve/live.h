/* The worker's live assemblies: a request's KV from assemble until it is consumed by a
 * completion, released, or expires (DESIGN §7). Each holds one pool reference per chunk it
 * took from (or stored into) the pool, so those chunks are never evicted while it lives.
 * Thread-safe. Also keeps a few freed KV buffers for the next assembly. */
#ifndef CG_LIVE_H
#define CG_LIVE_H

#include <stddef.h>
#include <stdint.h>

#include "base/map.h"
#include "base/status.h"
#include "kv/pool.h"
#include "worker/model/model.h"
#include "cache/key.h"

typedef struct cg_assembly {
    char id[33];       /* 32 lowercase hex characters: 128 random bits */
    cg_kv *kv;         /* owned */
    uint32_t n_tokens; /* prompt tokens in kv slots [0, n_tokens) */
    uint32_t cached_tokens;
    int32_t *tokens;        /* owned: the prompt tokens (n_tokens); NULL when adopted */
    float *logits;          /* owned: vocab_size logits of the last prompt token */
    cg_pool_chunk **chunks; /* owned references */
    size_t n_chunks;
    /* How cg_engine_assemble built it (0 for plain prompts and adopted KV): what a quality
     * probe compares against a plain causal forward, and the probe's labels. */
    int assembled;
    cg_mode mode;
    float recompute_ratio;
    cg_select recompute_select;
    uint32_t recompute_prefix, recomputed;
    uint64_t expires;
    cg_map_node node; /* the table's, keyed by id, while it is live */
} cg_assembly;

typedef struct cg_live cg_live;

/* A table of at most max assemblies of model m (borrowed), whose chunk references belong to
 * pool (borrowed); each lives ttl_ms after it is added. Freed KV buffers of at most
 * spare_bytes of capacity in all are kept for the next assemblies (0: none). Caller frees
 * with cg_live_free. */
cg_live *cg_live_new(const cg_model *m, cg_pool *pool, size_t max, uint64_t ttl_ms,
                     size_t spare_bytes);
/* Releases every live assembly (now = 0) and the table. NULL-safe; sets *l to NULL. */
void cg_live_free(cg_live **l);

/* A new assembly (not in the table yet) for n_tokens prompt tokens with KV room for cap slots
 * (>= 1), logits allocated, chunk room for max_chunks references. NULL when the KV cannot be
 * sized. The caller adds it (cg_live_add) or frees it (cg_live_discard). */
cg_assembly *cg_live_prepare(cg_live *l, uint32_t n_tokens, uint32_t cap, size_t max_chunks);
/* Gives back everything a (not live) assembly holds: pool references, KV (kept as a spare),
 * logits. NULL-safe; sets *a to NULL. now: monotonic ms (pool LRU). */
void cg_live_discard(cg_live *l, cg_assembly **a, uint64_t now);
/* cg_live_add's flags. */
#define CG_LIVE_ADOPTED 1  /* its KV was pulled from another worker (counted apart) */
#define CG_LIVE_UNCAPPED 2 /* decoded at once by its maker: live beyond the limit */
/* Makes *a live with a fresh id and its ttl from now; takes it over (sets *a NULL), also on
 * CG_E_UNAVAILABLE (too many live, unless CG_LIVE_UNCAPPED: it is discarded). id_out
 * (optional) receives the id. */
cg_status cg_live_add(cg_live *l, cg_assembly **a, uint64_t now, int flags, char id_out[33]) CG_WUR;
/* Unlinks the live assembly id: the caller owns it (and later discards it). NULL when unknown,
 * expired or consumed. */
cg_assembly *cg_live_take(cg_live *l, const char *id, uint64_t now);
/* Runs fn(a, ud) on the live assembly id under the table lock (it cannot be consumed or
 * released meanwhile). fn must be quick and must not call back into the table.
 * CG_E_NOT_FOUND when unknown. */
cg_status cg_live_with(cg_live *l, const char *id, uint64_t now,
                       void (*fn)(const cg_assembly *a, void *ud), void *ud) CG_WUR;

/* Releases assemblies whose ttl has passed; returns how many. */
size_t cg_live_reap(cg_live *l, uint64_t now);
/* Live assemblies after reaping at now. */
size_t cg_live_count(cg_live *l, uint64_t now);
/* 1 when the table is full (after reaping at now). */
int cg_live_full(cg_live *l, uint64_t now);

/* Moves a's KV into a buffer of at least cap slots, keeping slots [0, used). */
void cg_live_grow(cg_live *l, cg_assembly *a, uint32_t used, uint32_t cap);

typedef struct cg_live_stats {
    uint64_t created, expired, adopted;
    size_t spare_bytes; /* capacity of the freed KV buffers kept as spares, now */
} cg_live_stats;
cg_live_stats cg_live_get_stats(cg_live *l);

#endif
