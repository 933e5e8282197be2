/* Assembly engine of the reference worker: lifetime, the live-assembly and tier tables, and
 * the export of per-head KV (DESIGN §7, §8). Building an assembly is in assemble.c, decoding
 * in complete.c. */
#include "worker/serve/engine_state.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

cg_engine_params cg_engine_default_params(void)
{
    return (cg_engine_params){
        .pool_bytes = (size_t)256 << 20,
        .block_tokens = 16,
        .assembly_ttl_ms = 60000,
        .max_assemblies = 64,
        .reserve_tokens = 512,
        .spare_kv_bytes = (size_t)1 << 30,
        .disk_write_behind = 64,
        .disk_write_behind_bytes = (size_t)64 << 20,
        .sched = cg_sched_default_params(),
        .now_ms = cg_now_ms,
    };
}

cg_status cg_engine_open(const cg_model *model, cg_engine_params params, cg_engine **out)
{
    *out = NULL;
    cg_engine *e = cg_calloc(1, sizeof *e);
    e->m = model;
    e->p = params;
    e->p.disk_dir = NULL; /* borrowed for open only */
    if (!e->p.max_assemblies) e->p.max_assemblies = 1;
    pthread_mutex_init(&e->smu, NULL);
    cg_tiers_params tp = {.pool_bytes = params.pool_bytes,
                          .block_tokens = params.block_tokens,
                          .disk_bytes = params.disk_bytes,
                          .disk_dir = params.disk_dir,
                          .disk_sync = params.disk_sync,
                          .disk_wb_items = params.disk_write_behind,
                          .disk_wb_bytes = params.disk_write_behind_bytes,
                          .remote = params.remote,
                          .events = params.events};
    cg_status st = cg_tiers_open(model, &tp, &e->tiers);
    if (st == CG_OK) st = cg_sched_open(model, params.sched, &e->sched);
    if (st != CG_OK) {
        cg_engine_close(&e);
        return st;
    }
    e->live = cg_live_new(model, cg_tiers_pool(e->tiers), e->p.max_assemblies, e->p.assembly_ttl_ms,
                          e->p.spare_kv_bytes);
    *out = e;
    return CG_OK;
}

void cg_engine_close(cg_engine **ep)
{
    cg_engine *e = *ep;
    if (!e) return;
    cg_sched_close(&e->sched);
    cg_live_free(&e->live); /* gives its pool references back first */
    cg_tiers_close(&e->tiers);
    pthread_mutex_destroy(&e->smu);
    cg_free(ep);
}

const cg_model *cg_engine_model(const cg_engine *e)
{
    return e->m;
}
cg_pool *cg_engine_pool(cg_engine *e)
{
    return cg_tiers_pool(e->tiers);
}
cg_disk *cg_engine_disk(cg_engine *e)
{
    return cg_tiers_disk(e->tiers);
}
cg_engine_params cg_engine_get_params(const cg_engine *e)
{
    return e->p;
}

void cg_engine_count(cg_engine *e, const cg_engine_stats *add)
{
    pthread_mutex_lock(&e->smu);
    cg_engine_stats *s = &e->stats;
    s->chunk_hits += add->chunk_hits;
    s->chunk_misses += add->chunk_misses;
    s->disk_hits += add->disk_hits;
    s->remote_hits += add->remote_hits;
    s->tokens_reused += add->tokens_reused;
    s->tokens_computed += add->tokens_computed;
    s->prefill_tokens += add->prefill_tokens;
    s->decode_tokens += add->decode_tokens;
    s->evictions += add->evictions;
    s->recomputed_tokens += add->recomputed_tokens;
    s->rank_tokens += add->rank_tokens;
    pthread_mutex_unlock(&e->smu);
}

cg_engine_stats cg_engine_get_stats(cg_engine *e)
{
    pthread_mutex_lock(&e->smu);
    cg_engine_stats s = e->stats;
    pthread_mutex_unlock(&e->smu);
    cg_tiers_stats ts = cg_tiers_get_stats(e->tiers);
    cg_live_stats ls = cg_live_get_stats(e->live);
    s.spills = ts.spills;
    s.spill_failures = ts.spill_failures;
    s.restores = ts.restores;
    s.restore_failures = ts.restore_failures;
    s.assemblies_created = ls.created;
    s.assemblies_expired = ls.expired;
    s.assemblies_adopted = ls.adopted;
    s.kv_spare_bytes = ls.spare_bytes;
    return s;
}

cg_tiers_stats cg_engine_tier_stats(cg_engine *e)
{
    return cg_tiers_get_stats(e->tiers);
}

cg_status cg_engine_wait_writes(cg_engine *e, int timeout_ms)
{
    return cg_tiers_wait_writes(e->tiers, timeout_ms);
}

/* ---- live assemblies ---- */

size_t cg_engine_reap(cg_engine *e, uint64_t now)
{
    return cg_live_reap(e->live, now);
}

size_t cg_engine_live_assemblies(cg_engine *e, uint64_t now)
{
    return cg_live_count(e->live, now);
}

cg_status cg_engine_release(cg_engine *e, const char *assembly_id, uint64_t now)
{
    cg_assembly *a = cg_live_take(e->live, assembly_id, now);
    if (!a) return CG_E_NOT_FOUND;
    cg_live_discard(e->live, &a, now);
    return CG_OK;
}

static void nothing(const cg_assembly *a, void *ud)
{
    (void)a;
    (void)ud;
}

int cg_engine_has_assembly(cg_engine *e, const char *assembly_id, uint64_t now)
{
    return cg_live_with(e->live, assembly_id, now, nothing, NULL) == CG_OK;
}

typedef struct logits_out {
    const cg_model_config *cfg;
    float *out;
    uint32_t *n_tokens, *cached_tokens;
} logits_out;

static void copy_logits(const cg_assembly *a, void *ud)
{
    logits_out *o = ud;
    memcpy(o->out, a->logits, (size_t)o->cfg->vocab_size * sizeof(float));
    *o->n_tokens = a->n_tokens;
    *o->cached_tokens = a->cached_tokens;
}

cg_status cg_engine_assembly_logits(cg_engine *e, const char *assembly_id, uint64_t now, float *out,
                                    uint32_t *n_tokens, uint32_t *cached_tokens)
{
    logits_out o = {cg_model_cfg(e->m), out, n_tokens, cached_tokens};
    return cg_live_with(e->live, assembly_id, now, copy_logits, &o);
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
    cg_assembly *a = cg_calloc(1, sizeof *a);
    a->kv = kv;
    a->n_tokens = n_tokens;
    a->cached_tokens = cached_tokens;
    a->logits = cg_malloc((size_t)cfg->vocab_size * sizeof(float));
    memcpy(a->logits, logits, (size_t)cfg->vocab_size * sizeof(float));
    /* decoded at once by the completion that pulled it, like a completion's own */
    return cg_live_add(e->live, &a, now, CG_LIVE_ADOPTED | CG_LIVE_UNCAPPED, id_out);
}

/* ---- export, delete, flush ---- */

cg_status cg_engine_chunk_kv(cg_engine *e, const cg_key *key, int h0, int h1, void **out,
                             size_t *len, uint32_t *tokens)
{
    size_t evictions = 0;
    cg_status st =
        cg_tiers_export(e->tiers, key, h0, h1, cg_now_ms(), out, len, tokens, &evictions);
    cg_engine_stats add = {.evictions = evictions};
    cg_engine_count(e, &add);
    return st;
}

typedef struct kv_out {
    const cg_model_config *cfg;
    int h0, h1;
    void **out;
    size_t *len;
    uint32_t *tokens;
} kv_out;

/* Copies an assembly's prompt KV for heads [h0, h1]: per head, per layer, K then V. */
static void copy_kv(const cg_assembly *a, void *ud)
{
    kv_out *o = ud;
    size_t plane = (size_t)a->n_tokens * (size_t)o->cfg->head_dim;
    float *buf = cg_malloc(
        (size_t)(o->h1 - o->h0 + 1) * (size_t)o->cfg->n_layers * 2 * plane * sizeof(float) + 1);
    float *w = buf;
    for (int h = o->h0; h <= o->h1; h++)
        for (int l = 0; l < o->cfg->n_layers; l++) {
            memcpy(w, cg_kv_k(a->kv, l, h), plane * sizeof(float));
            w += plane;
            memcpy(w, cg_kv_v(a->kv, l, h), plane * sizeof(float));
            w += plane;
        }
    *o->out = buf;
    *o->len = (size_t)(w - buf) * sizeof(float);
    *o->tokens = a->n_tokens;
}

cg_status cg_engine_assembly_kv(cg_engine *e, const char *assembly_id, int h0, int h1, uint64_t now,
                                void **out, size_t *len, uint32_t *tokens)
{
    const cg_model_config *cfg = cg_model_cfg(e->m);
    *out = NULL;
    *len = 0;
    *tokens = 0;
    if (h0 < 0 || h1 < h0 || h1 >= cfg->n_kv_heads) return CG_E_VALUE;
    /* Copied under the table lock, so the assembly cannot be consumed or released meanwhile. */
    kv_out o = {cfg, h0, h1, out, len, tokens};
    return cg_live_with(e->live, assembly_id, now, copy_kv, &o);
}

cg_status cg_engine_chunk_delete(cg_engine *e, const cg_key *key)
{
    return cg_tiers_delete(e->tiers, key);
}

size_t cg_engine_flush(cg_engine *e, uint64_t now)
{
    return cg_tiers_flush(e->tiers, now);
}
